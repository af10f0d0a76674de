//! zkguard's own indices (transactions, dead letters, lease locks) behind other names: the
//! aliases that point to them, and the patterns and lists (`zkguard-*`, `a,b`, `_all`) that
//! reach them. The gate refuses writes through any of these as it refuses the names themselves.
//!
//! The aliases are read with one request (`GET /{own indices}/_alias`) and kept for
//! [`OWN_ALIASES_FOR`]: a write through the gate costs at most one more request to the cluster
//! a second. An alias change passed through the gate drops them at once, so only an alias made
//! on the cluster directly can go unseen, for at most that long, and only by a write passed
//! through with the caller's own credentials: a guarded write also checks the index its alias
//! resolves to, on every request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the aliases of zkguard's own indices are trusted once read.
pub const OWN_ALIASES_FOR: Duration = Duration::from_secs(1);

/// The aliases of zkguard's own indices, as last read.
#[derive(Debug, Default)]
pub struct OwnNames {
    known: Mutex<Known>,
    /// One reader at a time; the others wait for its answer.
    pub reading: tokio::sync::Mutex<()>,
    /// Moves on every alias change passed through: a read begun before it is stale.
    generation: AtomicU64,
}

#[derive(Debug, Default)]
struct Known {
    /// Alias → the own indices it points to.
    aliases: BTreeMap<String, Vec<String>>,
    /// When they were read, and in which generation.
    read: Option<(Instant, u64)>,
}

impl OwnNames {
    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The generation a read starts in (give it back to [`OwnNames::store`]).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the aliases were read less than [`OWN_ALIASES_FOR`] ago, since the last change.
    pub fn fresh(&self) -> bool {
        let generation = self.generation();
        self.known()
            .read
            .is_some_and(|(at, g)| g == generation && at.elapsed() < OWN_ALIASES_FOR)
    }

    /// Forgets the aliases: the next write reads them again.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Keeps the aliases of an answer of `GET /{own indices}/_alias` (`{index: {aliases: {..}}}`)
    /// read in `generation`.
    pub fn store(&self, generation: u64, answer: &serde_json::Value) {
        let mut aliases: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (index, v) in answer.as_object().into_iter().flatten() {
            for alias in v["aliases"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(a, _)| a)
            {
                aliases
                    .entry(alias.clone())
                    .or_default()
                    .push(index.clone());
            }
        }
        *self.known() = Known {
            aliases,
            read: Some((Instant::now(), generation)),
        };
    }

    /// The part of `target` that reaches one of `own` (through an alias or a pattern), and the
    /// own index it reaches.
    pub fn reached(&self, own: &[String], target: &str) -> Option<(String, String)> {
        reaches(own, &self.known().aliases, target)
    }
}

/// The part of the index expression `target` (comma-separated names, aliases and `*` patterns,
/// `-` exclusions, `_all`) that reaches one of `own`, and the own index it reaches, given the
/// `aliases` of the own indices.
pub fn reaches(
    own: &[String],
    aliases: &BTreeMap<String, Vec<String>>,
    target: &str,
) -> Option<(String, String)> {
    // Every name that leads to an own index, and where to.
    let names = own
        .iter()
        .map(|o| (o.as_str(), std::slice::from_ref(o)))
        .chain(aliases.iter().map(|(a, to)| (a.as_str(), to.as_slice())));
    let mut reached: Vec<(String, String)> = Vec::new();
    for (n, part) in target.split(',').map(str::trim).enumerate() {
        let (exclude, pattern) = match part.strip_prefix('-') {
            Some(p) if n > 0 => (true, p),
            _ => (false, part),
        };
        for (_, to) in names.clone().filter(|(name, _)| matches(pattern, name)) {
            if exclude {
                reached.retain(|(_, o)| !to.contains(o));
            } else {
                reached.extend(to.iter().map(|o| (part.to_string(), o.clone())));
            }
        }
    }
    reached.into_iter().next()
}

/// Whether `name` matches `pattern` (`*` any run of characters; `_all` everything).
fn matches(pattern: &str, name: &str) -> bool {
    if pattern == "_all" {
        return true;
    }
    let mut pieces = pattern.split('*');
    let first = pieces.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> Vec<String> {
        vec!["zkguard-txn-log".into(), "zkguard-dead-letters".into()]
    }

    fn aliases() -> BTreeMap<String, Vec<String>> {
        BTreeMap::from([("log".to_string(), vec!["zkguard-txn-log".to_string()])])
    }

    fn reached(target: &str) -> Option<String> {
        reaches(&own(), &aliases(), target).map(|(_, o)| o)
    }

    #[test]
    fn patterns_match_as_elasticsearch_expands_them() {
        assert!(matches("zkguard-*", "zkguard-txn-log"));
        assert!(matches("*-log", "zkguard-txn-log"));
        assert!(matches("z*txn*g", "zkguard-txn-log"));
        assert!(matches("*", "x") && matches("_all", "x"));
        assert!(!matches("zkguard-*-x", "zkguard-txn-log"));
        assert!(!matches("log", "logs") && matches("log", "log"));
        assert!(!matches("a*a", "a"));
    }

    #[test]
    fn aliases_patterns_and_lists_reach_the_own_indices() {
        assert_eq!(reached("log").as_deref(), Some("zkguard-txn-log"));
        assert_eq!(
            reaches(&own(), &aliases(), "articles, lo*").map(|(p, _)| p),
            Some("lo*".to_string())
        );
        assert_eq!(
            reached("zkguard-d*").as_deref(),
            Some("zkguard-dead-letters")
        );
        assert!(reached("_all").is_some() && reached("*").is_some());
        assert_eq!(reached("articles"), None);
        assert_eq!(reached("logs-*"), None);
        // Exclusions take back what the parts before them reached.
        assert_eq!(reached("zkguard-*,-zkguard-*"), None);
        assert_eq!(reached("articles,log,-log"), None);
        assert_eq!(reached("-log"), None, "a leading `-` is part of a name");
    }

    #[test]
    fn the_aliases_are_read_from_the_clusters_answer_and_kept_briefly() {
        let names = OwnNames::default();
        assert!(!names.fresh());
        let g = names.generation();
        names.store(
            g,
            &serde_json::json!({"zkguard-txn-log": {"aliases": {"log": {}, "txn": {"is_write_index": true}}}}),
        );
        assert!(names.fresh());
        assert_eq!(
            names.reached(&own(), "txn"),
            Some(("txn".to_string(), "zkguard-txn-log".to_string()))
        );
        names.invalidate();
        assert!(!names.fresh(), "an alias change makes them stale");
    }
}
