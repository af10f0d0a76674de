//! The bodies of the gate's requests: each must arrive within `server.body.timeout` of its
//! request's headers, whether the gate reads it (guarded writes, `_bulk`, `_reindex`) or streams
//! it to the cluster (everything passed through), as on the service's main listener. A body that
//! is late, or whose framing is broken (a bad chunk), is told apart from one that is too long,
//! and each gets its own answer. The bodies the gate reads whole share one bound of bytes in
//! flight (`server.gateway.body.max.inflight.bytes`, [`BodyBudget`]): a body beyond it is
//! refused before it is read.

use std::future::Future;
use std::io::Read;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures::{Stream, StreamExt};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::reply::{Dress, GateError};

/// The largest request body the gate reads (Elasticsearch's default `http.max_content_length`).
pub const MAX_BODY: usize = 100 << 20;

/// What went wrong with a request's body, if anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyFault {
    /// It did not arrive within `server.body.timeout`.
    Late(Duration),
    /// It could not be read: broken framing, or the connection failed.
    Broken(String),
}

impl BodyFault {
    /// The gate's answer: 408 for a late body, 400 for a broken one.
    pub fn error(&self) -> GateError {
        match self {
            BodyFault::Late(limit) => GateError::new(
                StatusCode::REQUEST_TIMEOUT,
                "zkguard_body_timeout_exception",
                format!("zkguard: the request body did not arrive within server.body.timeout ({}ms); nothing was done: send the whole body at once and retry", limit.as_millis()),
            ),
            BodyFault::Broken(why) => GateError::refused(format!(
                "zkguard: the request body could not be read ({why}); nothing was done: check its framing (Transfer-Encoding: chunked or Content-Length) and send it again"
            )),
        }
    }
}

/// Where the watched body of one request reports its fault, and what it holds of the
/// [`BodyBudget`] (given back when the request is done and the watch dropped).
#[derive(Debug, Default)]
pub struct BodyWatch {
    fault: Mutex<Option<BodyFault>>,
    held: Mutex<Option<OwnedSemaphorePermit>>,
}

impl BodyWatch {
    /// The body's fault, once it had one.
    pub fn fault(&self) -> Option<BodyFault> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn report(&self, fault: BodyFault) {
        self.fault
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(fault);
    }

    /// Keeps `bytes` of the budget until the request is done.
    fn hold(&self, bytes: OwnedSemaphorePermit) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        match held.as_mut() {
            Some(h) => h.merge(bytes),
            None => *held = Some(bytes),
        }
    }
}

/// The bytes of request bodies the gate holds at once (`server.gateway.body.max.inflight.bytes`),
/// as Elasticsearch's in-flight requests circuit breaker bounds them: a body announced
/// (`Content-Length`) beyond what is free is refused before it is read; a chunked body, and a
/// gzip body's inflated bytes, take their bytes as they come.
#[derive(Debug)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    limit: usize,
}

impl BodyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        let limit = limit.min(Semaphore::MAX_PERMITS);
        Self {
            bytes: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// Takes `n` more bytes for the request of `watch` (whose body then holds `total`).
    ///
    /// # Errors
    /// 413 when `total` could never fit; 429 `circuit_breaking_exception` with `Retry-After`
    /// when the bytes are not free now.
    fn take(&self, n: usize, total: usize, watch: &BodyWatch) -> Result<(), GateError> {
        if total > self.limit {
            return Err(too_long(format!(
                "the request body ({total} bytes or more) is larger than server.gateway.body.max.inflight.bytes ({} bytes), the most the gate holds at once; nothing was done: send smaller requests",
                self.limit
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let permit = u32::try_from(n)
            .ok()
            .and_then(|n| self.bytes.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| self.full(total))?;
        watch.hold(permit);
        Ok(())
    }

    /// The 429 of a body of `wanted` bytes that does not fit now, in the shape of
    /// Elasticsearch's in-flight requests circuit breaker.
    fn full(&self, wanted: usize) -> GateError {
        let used = self.limit - self.bytes.available_permits().min(self.limit);
        let mut e = GateError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "circuit_breaking_exception",
            format!(
                "zkguard: [in_flight_requests] the gate holds {used} bytes of request bodies, and this one's {wanted} would pass server.gateway.body.max.inflight.bytes ({} bytes); nothing was done: send the request again shortly",
                self.limit
            ),
        )
        .retry_after(1);
        e.extra =
            json!({"bytes_wanted": wanted, "bytes_limit": self.limit, "durability": "TRANSIENT"});
        e
    }
}

/// 413 `content_too_long_exception`, as Elasticsearch answers a body over its size limit.
fn too_long(reason: String) -> GateError {
    GateError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "content_too_long_exception",
        reason,
    )
}

/// The body of a request, failing once `limit` has passed before its end.
struct Watched {
    inner: axum::body::BodyDataStream,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
    watch: Arc<BodyWatch>,
    ended: bool,
}

impl Stream for Watched {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => Poll::Ready(Some(Ok(chunk))),
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                self.ended = true;
                let why = zkguard::es::error_chain(&e);
                self.watch.report(BodyFault::Broken(why.clone()));
                Poll::Ready(Some(Err(std::io::Error::other(why))))
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.ended = true;
                    let limit = self.limit;
                    self.watch.report(BodyFault::Late(limit));
                    Poll::Ready(Some(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the body did not arrive within server.body.timeout",
                    ))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

/// `request` with its body bounded by `limit` from now, and where its fault will be reported.
/// A request without a body is left as it is.
pub fn watch(request: Request, limit: Duration) -> (Request, Arc<BodyWatch>) {
    let watch = Arc::new(BodyWatch::default());
    if request.body().is_end_stream() {
        return (request, watch);
    }
    let (parts, body) = request.into_parts();
    let watched = Watched {
        inner: body.into_data_stream(),
        deadline: Box::pin(tokio::time::sleep(limit)),
        limit,
        watch: watch.clone(),
        ended: false,
    };
    (
        Request::from_parts(parts, Body::from_stream(watched)),
        watch,
    )
}

/// The `Content-Length` a request announces, if any.
fn announced(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Reads a watched body whole (at most [`MAX_BODY`]), as it came, within `budget`: an announced
/// length takes its bytes before anything is read, a chunked body as its chunks come.
///
/// # Errors
/// 408 for a late body, 400 for a broken one, 413 over the limit (or over the whole budget),
/// 429 when the budget has no room for it now.
pub async fn read_raw(
    headers: &HeaderMap,
    body: Body,
    watch: &BodyWatch,
    budget: &BodyBudget,
) -> Result<Bytes, GateError> {
    let over = |n: usize| {
        too_long(format!(
            "the request body ({n} bytes or more) could not be read whole; bodies up to {MAX_BODY} bytes are accepted: send smaller requests"
        ))
    };
    let length = announced(headers);
    let mut taken = 0;
    if let Some(n) = length {
        if n > MAX_BODY {
            return Err(over(n));
        }
        budget.take(n, n, watch)?;
        taken = n;
    }
    let mut stream = body.into_data_stream();
    let mut whole = Vec::with_capacity(length.unwrap_or(0));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            watch
                .fault()
                .unwrap_or_else(|| BodyFault::Broken(zkguard::es::error_chain(&e)))
                .error()
        })?;
        let size = whole.len() + chunk.len();
        if size > MAX_BODY {
            return Err(over(size));
        }
        if size > taken {
            budget.take(size - taken, size, watch)?;
            taken = size;
        }
        whole.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(whole))
}

/// `raw` inflated when `headers` mark it `Content-Encoding: gzip`, its inflated bytes taken
/// from `budget` as they come (a small gzip body can inflate to [`MAX_BODY`]).
///
/// # Errors
/// 400 when it cannot be inflated; 413 when it inflates beyond [`MAX_BODY`]; those of
/// [`BodyBudget`].
pub fn inflate(
    headers: &HeaderMap,
    raw: Bytes,
    watch: &BodyWatch,
    budget: &BodyBudget,
) -> Result<Bytes, GateError> {
    let gzip = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    if !gzip {
        return Ok(raw);
    }
    let mut decoder = flate2::read::MultiGzDecoder::new(&raw[..]);
    let mut out = Vec::new();
    let mut block = vec![0u8; 64 << 10];
    loop {
        let n = decoder.read(&mut block).map_err(|e| {
            GateError::refused(format!(
                "the body is marked Content-Encoding: gzip but cannot be inflated: {e}"
            ))
        })?;
        if n == 0 {
            return Ok(Bytes::from(out));
        }
        let size = out.len() + n;
        if size > MAX_BODY {
            return Err(too_long(format!(
                "the inflated body is over {MAX_BODY} bytes; send smaller requests"
            )));
        }
        budget.take(n, raw.len() + size, watch)?;
        out.extend_from_slice(&block[..n]);
    }
}

/// Reads a watched body whole within `budget`, inflating a gzip body ([`inflate`]).
///
/// # Errors
/// Those of [`read_raw`] and [`inflate`].
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    watch: &BodyWatch,
    budget: &BodyBudget,
) -> Result<Bytes, GateError> {
    let raw = read_raw(headers, body, watch, budget).await?;
    inflate(headers, raw, watch, budget)
}

/// The answer to a request whose body could not be used: `e`, and the connection closed when
/// the body was late, broken, too long or refused for want of room (what is left of it is not
/// read), as the main listener does.
pub fn body_error(dress: &Dress, e: &GateError, watch: &BodyWatch) -> Response {
    let mut response = dress.error(e);
    let fault = watch.fault();
    if let Some(BodyFault::Late(limit)) = &fault {
        tracing::warn!(
            timeout_ms = limit.as_millis() as u64,
            "a request body did not arrive in time at the gate; closing the connection"
        );
    }
    if fault.is_some()
        || e.status == StatusCode::PAYLOAD_TOO_LARGE
        || e.status == StatusCode::TOO_MANY_REQUESTS
    {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_beyond_what_is_free_and_gets_it_back_with_the_request() {
        let budget = BodyBudget::new(100);
        let first = BodyWatch::default();
        budget.take(60, 60, &first).unwrap();
        budget.take(20, 80, &first).unwrap();
        let second = BodyWatch::default();
        let e = budget.take(30, 30, &second).unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.extra["bytes_limit"], 100);
        let e = budget.take(101, 101, &second).unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        drop(first);
        budget.take(100, 100, &second).unwrap();
    }
}
