//! Helpers of the gate's tests: a service with the gate on, the front that plays a real
//! Elasticsearch before osmem-server (`front.py`), and the Python clients' scenario
//! (`clients.py`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::serve_support::{Env, Service};

/// A zkguard token is at least 2^52.
pub const MIN_TOKEN: u64 = 1 << 52;

/// The gate's base URL of a service started with it.
pub fn gate(s: &Service) -> String {
    format!(
        "http://{}",
        s.started["gateway"]
            .as_str()
            .expect("the start line names the gate's address")
    )
}

/// An environment whose service runs the gate on a free port, in front of `es`.
pub fn gate_env(zk: &str, tag: &str, es: &str) -> Env {
    let mut env = Env::new(zk, tag).with("ZKGUARD_SERVER_GATEWAY_LISTEN", "127.0.0.1:0");
    env.es = es.to_string();
    env
}

/// `front.py` before a backend: adds `X-Elastic-Product: Elasticsearch` to every answer, as a
/// real Elasticsearch sends it, and can hold fenced writes on the way (`hold`, `release`).
pub struct Front {
    child: Child,
    pub url: String,
}

impl Front {
    pub fn start(backend: &str) -> Self {
        Self::start_with(backend, &[])
    }

    /// With more arguments (`--plain-media-types`).
    pub fn start_with(backend: &str, args: &[&str]) -> Self {
        let mut child = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/support/gateway/front.py"
            ))
            .args(["--backend", backend])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run python3 front.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|_| panic!("front.py did not start: {line:?}"));
        Front {
            child,
            url: v["url"].as_str().unwrap().to_string(),
        }
    }

    async fn control(&self, what: &str) -> Value {
        let r = Client::new()
            .request(Method::POST, format!("{}/_front/{what}", self.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    /// From now on, writes carrying `version_type` wait at the front until [`Front::release`].
    pub async fn hold(&self) {
        self.control("hold").await;
    }

    /// Lets the held writes through, and the next ones.
    pub async fn release(&self) {
        self.control("release").await;
    }

    /// How many writes wait at the front.
    pub async fn held(&self) -> u64 {
        self.control("held").await["held"].as_u64().unwrap()
    }

    /// From now on, `_mget` requests and realtime GETs of a document (a guarded write's reads
    /// under its lock) wait at the front until [`Front::release_reads`].
    pub async fn hold_reads(&self) {
        self.control("hold-reads").await;
    }

    /// Lets the held reads through, and the next ones.
    pub async fn release_reads(&self) {
        self.control("release-reads").await;
    }

    /// How many reads wait at the front.
    pub async fn held_reads(&self) -> u64 {
        self.control("held-reads").await["held"].as_u64().unwrap()
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `clients.py` with the named client against `url`; returns its summary line.
pub async fn python_clients(client: &str, url: &str, index: &str) -> Value {
    python_script("tests/support/gateway/clients.py", client, url, index).await
}

/// Runs the Python script `script` (a path from the crate's root) with `client --url URL
/// --index INDEX`; asserts it succeeded and returns its last line, parsed as JSON.
pub async fn python_script(script: &str, client: &str, url: &str, index: &str) -> Value {
    let args = vec![
        format!("{}/{script}", env!("CARGO_MANIFEST_DIR")),
        client.to_string(),
        "--url".into(),
        url.to_string(),
        "--index".into(),
        index.to_string(),
    ];
    tokio::task::spawn_blocking(move || {
        let o = Command::new("python3")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run python3");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{} {} failed ({:?}):\n{out}\n{}",
            args[0],
            args[1],
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        let last = out.lines().last().unwrap_or_default().to_string();
        serde_json::from_str(&last).unwrap_or_else(|_| panic!("not JSON: {last}"))
    })
    .await
    .unwrap()
}

/// Sends a request with a JSON (or NDJSON) body and extra headers; returns status, headers and
/// body as JSON.
pub async fn send(
    c: &Client,
    method: Method,
    url: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut r = c.request(method, url);
    if let Some(b) = body {
        let ct = if url.contains("_bulk") {
            "application/x-ndjson"
        } else {
            "application/json"
        };
        r = r.header("content-type", ct).body(b.to_string());
    }
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await.unwrap();
    let status = r.status();
    let h = r.headers().clone();
    let text = r.text().await.unwrap();
    (
        status,
        h,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// The token a guarded write of the gate was made with.
pub fn token_of(h: &reqwest::header::HeaderMap) -> u64 {
    h.get("x-zkguard-fencing-token")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a guarded write names its token")
}

/// Everything the server sends on `tcp` until it closes it (end of stream or reset).
pub async fn until_closed(mut tcp: TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&got).to_string(),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// One request sent as written (the path is not normalised, unlike an HTTP client's URL
/// handling): status and JSON body of the answer.
pub async fn raw(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let body = body.unwrap_or("");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let text = until_closed(tcp).await;
    let (head, rest) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head[9..12].parse().unwrap();
    let payload = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = rest;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        out
    } else {
        rest.to_string()
    };
    (
        status,
        serde_json::from_str(&payload).unwrap_or(Value::Null),
    )
}
