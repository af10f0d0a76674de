//! Connections are bounded in time and in number: idle, half-sent and slowloris connections are
//! closed after `server.header.timeout`; at `server.max.connections` the longest-idle one makes
//! room for a newcomer, a newcomer finding every connection busy gets 503 and is closed, and the
//! limit is lowered to fit the open-files limit, so that `/healthz` keeps answering.

use crate::common;
use crate::eventually_value;
use crate::serve_support;

use std::time::{Duration, Instant};

use crate::queue::queued;
use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use serve_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn addr(s: &Service) -> String {
    s.started["listening"].as_str().unwrap().to_string()
}

/// Resolves when the server closed `tcp` (end of stream or reset); what it sent before, if any.
async fn closed_by_server(mut tcp: TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// With the default timeout (10 s): a connection that never sends anything, one that stops in
/// the middle of its headers, one that sends a header byte every 200 ms, and a keep-alive one
/// idle after its answer are all closed by the server, well before a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_half_sent_and_slow_connections_are_closed_after_the_header_timeout() {
    let env = Env::new(&shared_zk().connect_string(), "conn-timeout");
    let s = env.start("conn-timeout");
    let a = addr(&s);
    let started = Instant::now();

    let silent = TcpStream::connect(&a).await.unwrap();
    let mut half = TcpStream::connect(&a).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut kept = TcpStream::connect(&a).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let slow = tokio::spawn({
        let a = a.clone();
        async move {
            let mut tcp = TcpStream::connect(&a).await.unwrap();
            tcp.write_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
                .await
                .unwrap();
            // A slowloris sender: one byte at a time until the server hangs up.
            loop {
                if tcp.write_all(b"a").await.is_err() {
                    return;
                }
                let mut probe = [0u8; 1];
                match tokio::time::timeout(Duration::from_millis(200), tcp.read(&mut probe)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return,
                    _ => {}
                }
            }
        }
    });

    let limit = Duration::from_secs(40);
    let all = async {
        let (silent, half, kept, slow) = tokio::join!(
            closed_by_server(silent),
            closed_by_server(half),
            closed_by_server(kept),
            slow
        );
        slow.unwrap();
        assert!(silent.is_empty() && half.is_empty());
        let kept = String::from_utf8_lossy(&kept).to_string();
        assert!(kept.starts_with("HTTP/1.1 200"), "{kept}");
    };
    tokio::time::timeout(limit, all)
        .await
        .expect("the server left a silent, half-sent, slow or idle connection open");
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "closed before the header timeout: {:?}",
        started.elapsed()
    );
    let c = client();
    assert!(scraped(&c, &s, "zkguard_http_connections_timed_out_total").await >= 4.0);
}

/// At the limit, idle connections make room and `/healthz` answers; when every connection is
/// handling a request (writes waiting for a held lock), a newcomer gets 503
/// `too_many_connections` and is closed; the busy ones are served to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_limit_idle_connections_make_room_and_busy_ones_are_kept() {
    const MAX: usize = 6;
    let env = Env::new(&shared_zk().connect_string(), "conn-limit")
        .with("ZKGUARD_SERVER_MAX_CONNECTIONS", &MAX.to_string())
        .with("ZKGUARD_SERVER_HEADER_TIMEOUT", "60000");
    let s = env.start("conn-limit");
    let a = addr(&s);

    let mut idle = Vec::new();
    for _ in 0..4 * MAX {
        idle.push(TcpStream::connect(&a).await.unwrap());
    }
    // A new client still gets through, every time.
    for _ in 0..3 {
        let c = client();
        let (status, v) = call(&c, Method::GET, &s.url("/healthz"), None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    // The oldest idle connections were closed to make room.
    let first = idle.remove(0);
    tokio::time::timeout(Duration::from_secs(10), closed_by_server(first))
        .await
        .expect("the oldest idle connection was closed");
    let c = client();
    assert!(scraped(&c, &s, "zkguard_http_connections_evicted_total").await >= (3 * MAX) as f64);
    assert!(scraped(&c, &s, "zkguard_http_connections").await <= MAX as f64);
    drop(idle);

    // Every connection busy: MAX writes wait for a lock the test holds.
    let index = format!("conns-{}", uuid_tag());
    let (_holder, guard) = hold_lock(&env, &format!("{index}:1")).await;
    let mut waiting = Vec::new();
    for _ in 0..MAX {
        let url = s.url(&format!("/v1/indices/{index}/docs/1?timeout=20s"));
        waiting.push(tokio::spawn(async move {
            let c = client();
            call(&c, Method::PUT, &url, Some(json!({"n": 1}).to_string())).await
        }));
    }
    // Probe only once every write is waiting for the lock: a connection whose request has not
    // been read yet is idle, and may rightly make room for the probe.
    let lock_node = format!("{}/{index}:1", env.root);
    eventually(
        Duration::from_secs(20),
        "every write waits in the lock's queue",
        // The test's own holder has a node too.
        || async { queued(&env.zk, &lock_node, "A-").await == MAX + 1 },
    )
    .await;
    let refused = eventually_value(Duration::from_secs(20), || {
        let a = a.clone();
        async move {
            let mut tcp = TcpStream::connect(&a).await.ok()?;
            tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .ok()?;
            let got = tokio::time::timeout(Duration::from_secs(5), closed_by_server(tcp))
                .await
                .ok()?;
            let text = String::from_utf8_lossy(&got).to_string();
            text.starts_with("HTTP/1.1 503").then_some(text)
        }
    })
    .await;
    assert!(refused.contains("too_many_connections"), "{refused}");
    assert!(
        refused.to_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    assert!(s
        .log()
        .contains("connection limit (server.max.connections) reached"));
    guard.unlock().await.unwrap();
    for w in waiting {
        let (status, v) = w.await.unwrap();
        assert_eq!(status, StatusCode::OK, "a busy connection was cut: {v}");
    }
    assert!(scraped(&c, &s, "zkguard_http_connections_refused_total").await >= 1.0);
}

/// Under an open-files limit of 128, far below the default of 1,024 connections, the service
/// keeps fewer connections, says so at start, and still answers with 300 connections open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_fits_the_open_files_limit() {
    let env = Env::new(&shared_zk().connect_string(), "conn-nofile").open_files(128);
    let s = env.start("conn-nofile");
    let a = addr(&s);
    assert!(
        s.log().contains("does not fit the open-files limit"),
        "{}",
        s.log()
    );
    let mut open = Vec::new();
    for _ in 0..300 {
        open.push(TcpStream::connect(&a).await.unwrap());
    }
    let c = client();
    let (status, v) = call(&c, Method::GET, &s.url("/healthz"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(scraped(&c, &s, "zkguard_http_connections").await <= 64.0);
}

/// With the gate on, the two addresses' connections fit the open-files limit together (a gate
/// connection counting twice, for its connection to the cluster): flooded with connections on
/// both, the service never runs out of descriptors and both answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gate_on_both_addresses_fit_the_open_files_limit_together() {
    let env = Env::new(&shared_zk().connect_string(), "conn-nofile-gate")
        .with("ZKGUARD_SERVER_GATEWAY_LISTEN", "127.0.0.1:0")
        .open_files(160);
    let s = env.start("conn-nofile-gate");
    let (a, g) = (addr(&s), s.started["gateway"].as_str().unwrap().to_string());
    assert!(
        s.log()
            .contains("on each address, the gate's counting twice"),
        "{}",
        s.log()
    );
    let mut open = Vec::new();
    for _ in 0..150 {
        open.push(TcpStream::connect(&a).await.unwrap());
        open.push(TcpStream::connect(&g).await.unwrap());
    }
    let c = client();
    let (status, v) = call(&c, Method::GET, &s.url("/healthz"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = call(&c, Method::GET, &format!("http://{g}/"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(
        !s.log().contains("cannot accept a connection"),
        "the service ran out of descriptors: {}",
        s.log()
    );
}
