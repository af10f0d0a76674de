//! The bodies of the gate's requests: each must arrive within `server.body.timeout` of its
//! request's headers, whether the gate reads it (guarded writes, `_bulk`, `_reindex`) or streams
//! it to the cluster (everything passed through), as on the service's main listener. A body that
//! is late, or whose framing is broken (a bad chunk), is told apart from one that is too long,
//! and each gets its own answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures::Stream;

use super::gate::{inflate, MAX_BODY};
use super::reply::{Dress, GateError};

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

/// Where the watched body of one request reports its fault.
#[derive(Debug, Default)]
pub struct BodyWatch(Mutex<Option<BodyFault>>);

impl BodyWatch {
    /// The body's fault, once it had one.
    pub fn fault(&self) -> Option<BodyFault> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn report(&self, fault: BodyFault) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(fault);
    }
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

/// Reads a watched body whole (at most [`MAX_BODY`]), as it came.
///
/// # Errors
/// 408 for a late body, 400 for a broken one, 413 over the limit.
pub async fn read_raw(body: Body, watch: &BodyWatch) -> Result<Bytes, GateError> {
    axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| match watch.fault() {
        Some(fault) => fault.error(),
        None => GateError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "content_too_long_exception",
            format!("the request body could not be read whole ({e}); bodies up to {MAX_BODY} bytes are accepted: send smaller requests"),
        ),
    })
}

/// Reads a watched body whole, inflating a gzip body ([`inflate`]).
///
/// # Errors
/// Those of [`read_raw`] and [`inflate`].
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    watch: &BodyWatch,
) -> Result<Bytes, GateError> {
    inflate(headers, read_raw(body, watch).await?)
}

/// The answer to a request whose body could not be used: `e`, and the connection closed when
/// the body was late, broken or too long (what is left of it is not read), as the main
/// listener does.
pub fn body_error(dress: &Dress, e: &GateError, watch: &BodyWatch) -> Response {
    let mut response = dress.error(e);
    let fault = watch.fault();
    if let Some(BodyFault::Late(limit)) = &fault {
        tracing::warn!(
            timeout_ms = limit.as_millis() as u64,
            "a request body did not arrive in time at the gate; closing the connection"
        );
    }
    if fault.is_some() || e.status == StatusCode::PAYLOAD_TOO_LARGE {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}
