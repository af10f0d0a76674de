//! `GET /v1/events`: the service's lock events as server-sent events, read by a real streaming
//! HTTP client against a real service (ZooKeeper, osmem-server): order and fields of the events,
//! filters, resume with `Last-Event-ID`, bounds (streams, connections), metrics and shutdown.

use crate::common;
use crate::serve_support;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;
use tokio::sync::mpsc;

/// One event as the client read it, and when.
#[derive(Debug, Clone)]
struct Frame {
    id: Option<u64>,
    event: String,
    data: Value,
    at: Instant,
}

/// A stream being read: its frames arrive on `rx`, which ends when the stream ends.
struct Stream {
    rx: mpsc::UnboundedReceiver<Frame>,
    reader: tokio::task::JoinHandle<()>,
}

impl Stream {
    /// The next event (waits at most 10 s).
    async fn next(&mut self) -> Frame {
        tokio::time::timeout(Duration::from_secs(10), self.rx.recv())
            .await
            .expect("an event within 10 s")
            .expect("the stream is still open")
    }

    /// The next events, `n` of them.
    async fn take(&mut self, n: usize) -> Vec<Frame> {
        let mut frames = Vec::new();
        for _ in 0..n {
            frames.push(self.next().await);
        }
        frames
    }

    /// Closes the stream (the client goes away).
    fn close(self) {
        self.reader.abort();
    }
}

/// Opens `GET /v1/events{query}` (with `Last-Event-ID` when `after`) and reads it in a task,
/// parsing each `id:`/`event:`/`data:` block; comments (keep-alives) are skipped.
async fn open(c: &Client, s: &Service, query: &str, after: Option<u64>) -> Stream {
    let mut request = c.get(s.url(&format!("/v1/events{query}")));
    if let Some(id) = after {
        request = request.header("last-event-id", id.to_string());
    }
    let response = request.send().await.expect("open the stream");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let (tx, rx) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut body = response.bytes_stream();
        let mut buf = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            buf.push_str(std::str::from_utf8(&chunk).unwrap());
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, None, None);
                for line in block.lines().filter(|l| !l.is_empty()) {
                    let field = |name: &str| {
                        line.strip_prefix(name)
                            .map(|v| v.strip_prefix(' ').unwrap_or(v).to_string())
                    };
                    if let Some(v) = field("id:") {
                        id = Some(v.parse().unwrap());
                    } else if let Some(v) = field("event:") {
                        event = Some(v);
                    } else if let Some(v) = field("data:") {
                        data = Some(serde_json::from_str(&v).unwrap());
                    } else {
                        assert!(line.starts_with(':'), "unexpected line {line:?}");
                    }
                }
                if let (Some(event), Some(data)) = (event, data) {
                    let frame = Frame {
                        id,
                        event,
                        data,
                        at: Instant::now(),
                    };
                    if tx.send(frame).is_err() {
                        return;
                    }
                }
            }
        }
    });
    Stream { rx, reader }
}

fn assert_event(f: &Frame, kind: &str, monitor: &str, lock_type: &str) {
    assert_eq!(f.event, kind, "{f:?}");
    assert_eq!(f.data["type"], kind, "{f:?}");
    assert_eq!(f.data["monitor"], monitor, "{f:?}");
    assert_eq!(f.data["lock_type"], lock_type, "{f:?}");
    assert_eq!(f.data["seq"].as_u64(), f.id, "{f:?}");
    let at = f.data["at"].as_u64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(at <= now && now - at < 60_000, "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_a_monitor_sees_its_locks_and_writes_in_order() {
    let env = Env::new(&shared_zk().connect_string(), "events")
        .with("ZKGUARD_SERVER_GATEWAY_LISTEN", "127.0.0.1:0");
    let s = env.start("events");
    let c = client();
    let index = format!("events-{}", uuid_tag());
    let monitor = format!("{index}:42");
    let other = format!("{index}:43");
    // The index exists before the streams open (the first write creates it, slowly).
    let (status, v) = put(&c, &s, &format!("/v1/indices/{index}/docs/1"), &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{v}");

    let mut one = open(&c, &s, &format!("?monitor={monitor}"), None).await;
    let mut family = open(
        &c,
        &s,
        &format!("?prefix={index}:&types=applied,parked"),
        None,
    )
    .await;

    // Another monitor's write: not on the first stream, on the family's.
    let (status, v) = put(&c, &s, &format!("/v1/indices/{index}/docs/43"), &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let f = family.next().await;
    assert_event(&f, "applied", &other, "foreground");
    assert_eq!(f.data["index"], json!(index));
    assert_eq!(f.data["id"], "43");
    assert_eq!(f.data["operation_id"], v["operation_id"]);
    assert_eq!(f.data["token"], v["token"]);

    // An explicit lock, a write under it, a write refused meanwhile, the release.
    let (status, lock) = call(
        &c,
        Method::POST,
        &s.url(&format!("/v1/locks?index={index}&id=42&ttl=30s")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    let lock_id = lock["lock_id"].as_str().unwrap().to_string();
    let doc = format!("/v1/indices/{index}/docs/42");
    let (status, under) = put(
        &c,
        &s,
        &format!("{doc}?lock_id={lock_id}"),
        &json!({"n": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{under}");
    let (status, v) = put(&c, &s, &format!("{doc}?timeout=0"), &json!({"n": 2})).await;
    assert_eq!(status, StatusCode::LOCKED, "{v}");
    let release = s.url(&format!("/v1/locks/{monitor}/{lock_id}"));
    let r = c.delete(&release).send().await.unwrap();
    let answered = Instant::now();
    assert_eq!(r.status(), StatusCode::OK);

    let events = one.take(4).await;
    assert_event(&events[0], "acquired", &monitor, "foreground");
    assert_eq!(events[0].data["lock_id"], json!(lock_id));
    assert_eq!(events[0].data["token"], lock["token"]);
    assert_event(&events[1], "applied", &monitor, "foreground");
    assert_eq!(events[1].data["token"], lock["token"]);
    assert_eq!(events[1].data["operation_id"], under["operation_id"]);
    assert_event(&events[2], "rejected", &monitor, "foreground");
    assert_eq!(events[2].data["reason"], "lock_timeout");
    assert!(events[2].data.get("token").is_none(), "{:?}", events[2]);
    assert_event(&events[3], "released", &monitor, "foreground");
    assert_eq!(events[3].data["lock_id"], json!(lock_id));
    assert_eq!(events[3].data["token"], lock["token"]);
    assert!(events[3].data["held_ms"].as_u64().is_some());
    let heard = events[3].at.saturating_duration_since(answered);
    assert!(
        heard < Duration::from_millis(100),
        "the release was heard {heard:?} after its answer"
    );

    // A foreground write, a background write applied, a background patch parked (no document).
    let (status, fg) = put(&c, &s, &doc, &json!({"n": 3})).await;
    assert_eq!(status, StatusCode::OK, "{fg}");
    // Named with a key of the caller's: the event names it by the key, as the answer does.
    let (status, bg) = put(
        &c,
        &s,
        &format!("{doc}?type=background&op_id=article-save-4"),
        &json!({"n": 4}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{bg}");
    assert_eq!(bg["operation_id"], "article-save-4", "{bg}");
    let f = one.next().await;
    assert_event(&f, "applied", &monitor, "foreground");
    assert_eq!(f.data["token"], fg["token"]);
    assert!(fg["token"].as_u64() > lock["token"].as_u64());
    let f = one.next().await;
    assert_event(&f, "applied", &monitor, "background");
    assert_eq!(f.data["operation_id"], bg["operation_id"]);
    assert!(f.data["token"].as_u64() > fg["token"].as_u64(), "{f:?}");
    let (status, parked) = call(
        &c,
        Method::PATCH,
        &s.url(&format!(
            "/v1/indices/{index}/docs/missing?type=background&monitor={monitor}"
        )),
        Some(json!({"n": 5}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{parked}");
    let f = one.next().await;
    assert_event(&f, "parked", &monitor, "background");
    assert_eq!(f.data["operation_id"], parked["operation_id"]);
    assert_eq!(f.data["id"], "missing");
    assert!(
        f.data["reason"].as_str().unwrap().contains("not retryable"),
        "{f:?}"
    );

    // A lease that lapses: the lock is lost.
    let (status, short) = call(
        &c,
        Method::POST,
        &s.url(&format!("/v1/locks/{monitor}?ttl=100ms")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{short}");
    let f = one.next().await;
    assert_event(&f, "acquired", &monitor, "foreground");
    let f = one.next().await;
    assert_event(&f, "lost", &monitor, "foreground");
    assert_eq!(f.data["reason"], "lapsed");
    assert_eq!(f.data["lock_id"], short["lock_id"]);
    let last = f.id.unwrap();

    // A write through the Elasticsearch-compatible gate.
    let gate = format!("http://{}", s.started["gateway"].as_str().unwrap());
    let r = c
        .put(format!("{gate}/{index}/_doc/44"))
        .header("content-type", "application/json")
        .body(json!({"n": 6}).to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);

    // The family's stream saw the applied and parked events of its monitors, nothing else.
    let seen = family.take(5).await;
    let kinds: Vec<&str> = seen.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(
        kinds,
        ["applied", "applied", "applied", "parked", "applied"]
    );
    assert!(seen[..4]
        .iter()
        .all(|f| f.data["monitor"] == json!(monitor)));
    assert_event(&seen[4], "applied", &format!("{index}:44"), "foreground");
    assert_eq!(seen[4].data["id"], "44");
    assert!(seen[4].data["token"].as_u64().is_some(), "{:?}", seen[4]);
    assert!(seen[4].data.get("operation_id").is_none(), "{:?}", seen[4]);

    // Numbers increase; a client that reconnects after the first lock event gets the rest again.
    let first = events[0].id.unwrap();
    assert!(events.windows(2).all(|w| w[0].id < w[1].id), "{events:?}");
    let mut resumed = open(&c, &s, &format!("?monitor={monitor}"), Some(first)).await;
    let again = resumed.take(8).await;
    let ids: Vec<u64> = again.iter().map(|f| f.id.unwrap()).collect();
    assert_eq!(ids[0], events[1].id.unwrap());
    assert_eq!(*ids.last().unwrap(), last);
    let kinds: Vec<&str> = again.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(
        kinds,
        ["applied", "rejected", "released", "applied", "applied", "parked", "acquired", "lost"]
    );

    let m = scrape(&c, &s).await;
    assert_eq!(m["zkguard_event_streams"], 3.0, "{m:?}");
    for (kind, n) in [
        ("acquired", 2.0),
        ("released", 1.0),
        ("lost", 1.0),
        ("applied", 6.0),
        ("rejected", 1.0),
        ("parked", 1.0),
    ] {
        assert_eq!(
            m[&format!("zkguard_events_total{{type=\"{kind}\"}}")],
            n,
            "{kind}: {m:?}"
        );
    }
    one.close();
    family.close();
    resumed.close();
    eventually(
        Duration::from_secs(10),
        "the streams are closed",
        || async { scraped(&c, &s, "zkguard_event_streams").await == 0.0 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_bounded_refuse_bad_parameters_outlive_the_request_timeout_and_end_on_sigterm()
{
    let env = Env::new(&shared_zk().connect_string(), "events-bounds")
        .with("ZKGUARD_SERVER_EVENTS_MAX", "1")
        .with("ZKGUARD_SERVER_MAX_CONCURRENT", "1")
        .with("ZKGUARD_SERVER_REQUEST_TIMEOUT", "1000")
        .with("ZKGUARD_SERVER_DRAIN_TIMEOUT", "20000")
        .with("ZKGUARD_SERVER_MAX_CONNECTIONS", "2");
    let mut s = env.start("bounds");
    let c = client();

    for (query, says) in [
        (
            "?monitor=a&since=3",
            "it takes monitor (repeatable), prefix (repeatable), types",
        ),
        (
            "?types=acquired,held",
            "the types are acquired, released, lost, applied, rejected, parked",
        ),
        ("?prefix=", "prefix is empty"),
        ("?monitor=a/b", "monitor filter"),
    ] {
        let (status, v) = call(&c, Method::GET, &s.url(&format!("/v1/events{query}")), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {v}");
        assert!(
            v["message"].as_str().unwrap().contains(says),
            "{query}: {v}"
        );
    }
    let r = c
        .get(s.url("/v1/events"))
        .header("last-event-id", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    let monitor = format!("bounds-{}", uuid_tag());
    let mut stream = open(&c, &s, &format!("?monitor={monitor}"), None).await;
    // One stream is the limit: another is refused, with Retry-After.
    let r = c.get(s.url("/v1/events")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "too_many_streams", "{v}");
    // The stream takes none of the server.max.concurrent requests, and outlives
    // server.request.timeout.
    let opened = Instant::now();
    let (status, v) = call(&c, Method::GET, &s.url("/v1/locks"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let m = scrape(&c, &s).await;
    assert_eq!(m["zkguard_event_streams"], 1.0, "{m:?}");
    assert_eq!(m["zkguard_event_streams_refused_total"], 1.0, "{m:?}");
    // At server.max.connections (2), newcomers make room by closing idle connections, never the
    // stream's: its connection stays busy while the stream lasts. (Each newcomer is a client of
    // its own, kept open: its connection stays idle in its pool.)
    let mut clients = Vec::new();
    for _ in 0..3 {
        let fresh = client();
        let (status, v) = call(&fresh, Method::GET, &s.url("/healthz"), None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        clients.push(fresh);
    }
    let c = client();
    assert!(scraped(&c, &s, "zkguard_http_connections_evicted_total").await >= 2.0);
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(opened.elapsed())).await;
    let c = client();
    let (status, lock) = call(
        &c,
        Method::POST,
        &s.url(&format!("/v1/locks/{monitor}?type=background")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    let f = stream.next().await;
    assert_event(&f, "acquired", &monitor, "background");

    // SIGTERM ends the stream at once (the lock is released at shutdown), and the service exits
    // without waiting for server.drain.timeout.
    let stopped = Instant::now();
    s.signal(nix::sys::signal::Signal::SIGTERM);
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while stream.rx.recv().await.is_some() {}
    })
    .await;
    assert!(end.is_ok(), "the stream did not end after SIGTERM");
    let code = s.child.wait().unwrap();
    assert_eq!(code.code(), Some(0), "{}", s.log());
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "the service took {:?} to stop",
        stopped.elapsed()
    );
}
