//! `server.gateway.*`: the Elasticsearch-compatible write gate of `zkguard serve`.

use std::net::SocketAddr;

use super::IndexPatterns;

/// Where the gate listens and which indices it guards (`server.gateway.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GatewaySettings {
    /// `server.gateway.listen`; `None`: no gate.
    pub listen: Option<SocketAddr>,
    /// `server.gateway.indices`: indices whose document writes are locked and fenced.
    pub indices: IndexPatterns,
    /// `server.gateway.background.indices`: guarded indices written under the background lock
    /// unless a request asks otherwise.
    pub background: IndexPatterns,
    /// `server.gateway.bulk.max.items`: items one `_bulk` may carry.
    pub bulk_max_items: usize,
    /// `server.gateway.bulk.max.locks`: locks one guarded `_bulk` asks for or holds at once.
    pub bulk_max_locks: usize,
    /// `server.gateway.bulk.max.concurrent`: `_bulk` requests the gate handles at once.
    pub bulk_max_concurrent: usize,
    /// `server.gateway.body.max.inflight.bytes`: bytes of request bodies the gate holds at
    /// once (received, or inflated from gzip), the bodies it reads whole.
    pub body_max_inflight_bytes: usize,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            listen: None,
            indices: IndexPatterns::parse("*").expect("`*` is a pattern"),
            background: IndexPatterns::default(),
            bulk_max_items: 25_000,
            bulk_max_locks: 1024,
            bulk_max_concurrent: 4,
            body_max_inflight_bytes: 256 << 20,
        }
    }
}

/// The three keys from their values (the bulk limits at their defaults); an error names the
/// key and what it expects.
pub(super) fn parse(
    listen: &str,
    indices: &str,
    background: &str,
) -> Result<GatewaySettings, (&'static str, String)> {
    let listen = match listen.trim() {
        "" => None,
        v => Some(v.parse().map_err(|_| {
            (
                "server.gateway.listen",
                "an IP address and port, e.g. 127.0.0.1:9201 (port 0 picks a free one), or empty for no gate".to_string(),
            )
        })?),
    };
    let indices = IndexPatterns::parse(indices).map_err(|e| ("server.gateway.indices", e))?;
    let background =
        IndexPatterns::parse(background).map_err(|e| ("server.gateway.background.indices", e))?;
    Ok(GatewaySettings {
        listen,
        indices,
        background,
        ..GatewaySettings::default()
    })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn the_gate_is_off_by_default_and_guards_every_index_when_on() {
        let off = parse("", "*", "").unwrap();
        assert_eq!(off.listen, None);
        let on = parse("127.0.0.1:0", "*", "kpi-*").unwrap();
        assert_eq!(on.listen.unwrap().port(), 0);
        assert!(on.indices.matches("articles"));
        assert!(on.background.matches("kpi-2026") && !on.background.matches("articles"));
        let some = parse("127.0.0.1:9201", "articles,logs-*", "").unwrap();
        assert!(some.indices.matches("logs-1") && !some.indices.matches("other"));
    }

    #[test]
    fn a_bad_value_names_its_key() {
        assert_eq!(
            parse("localhost", "*", "").unwrap_err().0,
            "server.gateway.listen"
        );
        assert_eq!(
            parse("", "a*b", "").unwrap_err().0,
            "server.gateway.indices"
        );
        assert_eq!(
            parse("", "*", "Upper").unwrap_err().0,
            "server.gateway.background.indices"
        );
    }
}
