//! `GET /v1/events`: the service's lock events as server-sent events (`text/event-stream`), for
//! dashboards: `acquired`, `released` and `lost` of explicit locks, `applied`, `rejected` and
//! `parked` of writes, filtered by monitor and type.
//!
//! A stream takes one of `server.events.max` places, not one of `server.max.concurrent` or
//! `server.wait.max`, and is not cut by `server.request.timeout`. It sends a `: keep-alive`
//! comment every 15 s of silence, tells a client that reads too slowly how many events it missed
//! (`lagged`), resumes after `Last-Event-ID` from the events the hub still keeps, and ends when
//! the service starts shutting down.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};
use zkguard::lock::validate_monitor;

use super::conns::Streaming;
use super::errors::ApiError;
use super::hub::{now_ms, Event, Hub, Kind, Refused, Slot};
use super::state::AppState;

/// Silence after which a stream sends a `: keep-alive` comment, so that proxies keep it open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The parameters `GET /v1/events` takes.
const TAKES: &str = "monitor (repeatable), prefix (repeatable), types";

/// Which events a stream wants.
#[derive(Debug, Default)]
struct Filter {
    /// Exact monitor names (none: every monitor, unless `prefixes`).
    monitors: Vec<String>,
    /// Monitor name prefixes.
    prefixes: Vec<String>,
    /// Event types (none: every type).
    types: Option<Vec<Kind>>,
}

impl Filter {
    fn parse(raw: Option<&str>) -> Result<Self, ApiError> {
        let mut f = Filter::default();
        let raw = raw.unwrap_or_default();
        for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
            match key.as_ref() {
                "monitor" => {
                    validate_monitor(&value).map_err(|e| {
                        ApiError::bad(
                            "bad_monitor",
                            format!("monitor filter: {e}; give an exact monitor name (the monitor of a document's writes is `{{index}}:{{id}}`), or prefix= for a family"),
                        )
                    })?;
                    f.monitors.push(value.into_owned());
                }
                "prefix" => {
                    if value.is_empty() {
                        return Err(ApiError::bad(
                            "bad_parameter",
                            "prefix is empty; give the start of the monitor names to follow (prefix=articles:), or leave it out to follow every monitor",
                        ));
                    }
                    f.prefixes.push(value.into_owned());
                }
                "types" => {
                    if f.types.is_some() {
                        return Err(ApiError::bad(
                            "bad_parameter",
                            "query parameter `types` is given twice; give it once, the types comma-separated",
                        ));
                    }
                    let kinds = value
                        .split(',')
                        .map(|t| {
                            Kind::parse(t.trim()).ok_or_else(|| {
                                let known: Vec<&str> =
                                    Kind::ALL.iter().map(|k| k.as_str()).collect();
                                ApiError::bad(
                                    "bad_parameter",
                                    format!(
                                        "types: unknown event type `{t}`; the types are {}",
                                        known.join(", ")
                                    ),
                                )
                            })
                        })
                        .collect::<Result<Vec<Kind>, ApiError>>()?;
                    f.types = Some(kinds);
                }
                other => {
                    return Err(ApiError::bad(
                        "bad_parameter",
                        format!(
                            "unknown query parameter `{other}` of GET /v1/events; it takes {TAKES}"
                        ),
                    ))
                }
            }
        }
        Ok(f)
    }

    fn matches(&self, e: &Event) -> bool {
        let monitor = (self.monitors.is_empty() && self.prefixes.is_empty())
            || self.monitors.contains(&e.monitor)
            || self
                .prefixes
                .iter()
                .any(|p| e.monitor.starts_with(p.as_str()));
        monitor && self.types.as_ref().is_none_or(|t| t.contains(&e.kind))
    }
}

/// The `Last-Event-ID` a reconnecting client sends: the `id` of the last event it got.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default().trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        ApiError::bad(
            "bad_parameter",
            format!("Last-Event-ID `{text}` is not an event id of this service (a number); send the id of the last event received, or leave the header out to start with the events to come"),
        )
    })
}

/// The event that tells a stream it missed events (`None`: how many is not known).
fn lagged(missed: Option<u64>) -> SseEvent {
    let data = match missed {
        Some(n) => json!({"type": "lagged", "at": now_ms(), "missed": n}),
        None => json!({
            "type": "lagged",
            "at": now_ms(),
            "missed": null,
            "reason": "Last-Event-ID is not an event of this run of the service (it restarted, or the id is another instance's): the events since then are unknown",
        }),
    };
    SseEvent::default().event("lagged").data(data.to_string())
}

fn frame(e: &Event) -> SseEvent {
    SseEvent::default()
        .id(e.seq.to_string())
        .event(e.kind.as_str())
        .data(&e.json)
}

/// One stream's state.
struct Feed {
    rx: broadcast::Receiver<Arc<Event>>,
    /// Frames to send before the live events (the resume's).
    pending: VecDeque<SseEvent>,
    filter: Filter,
    closing: watch::Receiver<bool>,
    /// The number of the last event seen (sent or filtered out).
    last: u64,
    hub: Arc<Hub>,
    _slot: Slot,
}

async fn closed(closing: &mut watch::Receiver<bool>) {
    let _ = closing.wait_for(|c| *c).await;
}

fn feed(feed: Feed) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    futures::stream::unfold(feed, |mut f| async move {
        loop {
            if let Some(frame) = f.pending.pop_front() {
                return Some((Ok(frame), f));
            }
            let received = tokio::select! {
                biased;
                _ = closed(&mut f.closing) => return None,
                r = f.rx.recv() => r,
            };
            match received {
                Ok(e) if e.seq > f.last => {
                    f.last = e.seq;
                    if f.filter.matches(&e) {
                        return Some((Ok(frame(&e)), f));
                    }
                }
                Ok(_) => {}
                Err(RecvError::Lagged(n)) => {
                    tracing::debug!(missed = n, "an event stream's client reads too slowly; it is told how many events it missed");
                    f.hub.missed(n);
                    return Some((Ok(lagged(Some(n))), f));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    })
}

#[utoipa::path(
    get,
    path = "/v1/events",
    summary = "The lock events, as a server-sent-events stream",
    description = "For dashboards: `acquired`, `released` and `lost` of explicit locks; `applied`, `rejected` and `parked` of writes (each with `monitor`, `lock_type`, and `token`, `operation_id`, `lock_id`, `index`, `id`, `reason`, `held_ms` where known); `lagged` when a reader fell behind. Each event is `id: <seq>`, `event: <type>`, `data: <JSON>`; a `: keep-alive` comment after 15 s of silence. The stream lasts until the client leaves or the service shuts down. At most server.events.max streams.",
    params(super::openapi::EventsQuery, super::openapi::ResumeHeader),
    tag = "locks",
    responses(
        (status = 200, description = "The stream.", body = String, content_type = "text/event-stream", example = "id: 7\nevent: released\ndata: {\"seq\":7,\"type\":\"released\",\"at\":1795000000000,\"monitor\":\"articles:42\",\"lock_type\":\"foreground\",\"token\":4503599627370517,\"lock_id\":\"0b5c1a9e-7d2f-4e61-9c3a-8f4d2e6b1a70\",\"held_ms\":12}\n\n"),
        (status = 503, description = "`too_many_streams` (server.events.max), `shutting_down`.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `GET /v1/events[?monitor=M&prefix=P&types=T,U]`: the lock events as server-sent events.
///
/// # Errors
/// 400 `bad_parameter` / `bad_monitor` for a filter or `Last-Event-ID` it cannot read, 503
/// `too_many_streams` at `server.events.max`, 503 `shutting_down` while shutting down.
pub async fn stream(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let filter = Filter::parse(query.as_deref())?;
    let after = last_event_id(&headers)?;
    let slot = state.events.open().map_err(|refused| match refused {
        Refused::Full(max) => ApiError::unavailable(
            "too_many_streams",
            format!("{max} event streams are open already (server.events.max); retry after the Retry-After delay, or close a stream that nobody reads"),
        )
        .retry_after(5),
        Refused::Closing => ApiError::unavailable(
            "shutting_down",
            "the service is shutting down; connect to another instance or retry after it restarts",
        ),
    })?;
    let sub = state.events.subscribe(after);
    tracing::info!(monitors = ?filter.monitors, prefixes = ?filter.prefixes, types = ?filter.types, after, "event stream opened");
    let mut pending = VecDeque::new();
    // A first comment, so that the client sees the stream open at once.
    pending.push_back(SseEvent::default().comment("zkguard events"));
    if sub.missed != Some(0) {
        pending.push_back(lagged(sub.missed));
    }
    // The backlog ends with event `sub.last`; the receiver starts after it.
    for e in sub.backlog.iter().filter(|e| filter.matches(e)) {
        pending.push_back(frame(e));
    }
    let body = feed(Feed {
        rx: sub.rx,
        pending,
        filter,
        closing: state.events.closing(),
        last: sub.last,
        hub: state.events.clone(),
        _slot: slot,
    });
    let mut response = Sse::new(body)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response();
    response.extensions_mut().insert(Streaming);
    // Proxies that buffer answers (nginx) pass this one on as it comes.
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use zkguard::LockType;

    use super::super::hub::{Happened, RING};
    use super::super::metrics::Metrics;
    use super::*;

    fn hub() -> Arc<Hub> {
        Arc::new(Hub::new(1, Arc::new(Metrics::new())))
    }

    fn feed_of(hub: &Arc<Hub>, filter: Filter) -> Feed {
        let slot = hub.open().unwrap();
        let sub = hub.subscribe(None);
        Feed {
            rx: sub.rx,
            pending: VecDeque::new(),
            filter,
            closing: hub.closing(),
            last: sub.last,
            hub: hub.clone(),
            _slot: slot,
        }
    }

    /// The stream's first `n` frames, as sent.
    async fn frames(feed: Feed, n: usize) -> String {
        let body = Sse::new(super::feed(feed).take(n))
            .into_response()
            .into_body();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_slow_stream_is_told_how_many_events_it_missed_and_goes_on() {
        let hub = hub();
        let feed = feed_of(&hub, Filter::default());
        for _ in 0..RING + 5 {
            hub.publish(Happened::lock(Kind::Acquired, "m", LockType::Foreground));
        }
        let text = frames(feed, 2).await;
        let (lagged, next) = text.split_once("\n\n").unwrap();
        assert!(lagged.starts_with("event: lagged\ndata: {"), "{text}");
        assert!(lagged.contains(r#""missed":5"#), "{text}");
        assert!(
            next.starts_with("id: 6\nevent: acquired\ndata: {"),
            "{text}"
        );
        assert!(hub_metrics(&hub).contains("zkguard_events_missed_total 5"));
    }

    fn hub_metrics(hub: &Hub) -> String {
        hub.metrics().encode(&[])
    }

    #[tokio::test]
    async fn filters_pick_monitors_prefixes_and_types() {
        let hub = hub();
        let filter = Filter::parse(Some(
            "monitor=a:1&monitor=b,c&prefix=logs:&types=released,lost",
        ))
        .unwrap();
        let feed = feed_of(&hub, filter);
        for (kind, monitor) in [
            (Kind::Released, "a:10"),
            (Kind::Acquired, "a:1"),
            (Kind::Released, "a:1"),
            (Kind::Lost, "b,c"),
            (Kind::Released, "logs:7"),
            (Kind::Released, "b"),
        ] {
            hub.publish(Happened::lock(kind, monitor, LockType::Background));
        }
        let text = frames(feed, 3).await;
        let ids: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("id: "))
            .collect();
        assert_eq!(ids, ["3", "4", "5"], "{text}");
    }

    #[test]
    fn unknown_parameters_and_types_are_refused_naming_what_is_taken() {
        let e = Filter::parse(Some("monitor=a&wait=1s")).unwrap_err();
        assert!(
            e.message.contains("unknown query parameter `wait`"),
            "{}",
            e.message
        );
        assert!(e.message.contains(TAKES), "{}", e.message);
        let e = Filter::parse(Some("types=applied&types=lost")).unwrap_err();
        assert!(e.message.contains("twice"), "{}", e.message);
    }
}
