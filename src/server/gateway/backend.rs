//! The cluster behind the gate: pass-through requests (streamed both ways, the caller's own
//! headers and credentials) and the gate's own requests (the configured credentials).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use axum::response::Response;
use futures::TryStreamExt;
use zkguard::config::EsSettings;
use zkguard::es::EsStore;

/// Headers that belong to one connection, not to the request or answer they travel with.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The header Elasticsearch sends on every answer and the official clients check.
pub const PRODUCT: &str = "x-elastic-product";

/// An answer of the cluster to one of the gate's own requests, read whole.
#[derive(Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Body.
    pub body: axum::body::Bytes,
}

impl Answer {
    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// The cluster, as the gate reaches it.
#[derive(Debug)]
pub struct Cluster {
    /// Pass-through: TLS as configured, no credentials of the service's, bodies untouched.
    plain: reqwest::Client,
    /// Base URLs without credentials, without a trailing `/`.
    bases: Vec<String>,
    next: AtomicUsize,
    /// The service's client: its credentials, for the writes the gate makes itself.
    own: EsStore,
    timeout: Duration,
}

impl Cluster {
    /// The pass-through client beside the service's own `store`.
    ///
    /// # Errors
    /// A message naming the TLS setting that cannot be used.
    pub fn new(settings: &EsSettings, own: EsStore) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder()
            .no_gzip()
            .connect_timeout(settings.request_timeout)
            .pool_idle_timeout(Duration::from_secs(60));
        let tls = &settings.tls;
        if !tls.verify {
            builder = builder.danger_accept_invalid_certs(true);
        } else if let Some(ca) = &tls.ca {
            let pem = std::fs::read(ca)
                .map_err(|e| format!("elasticsearch.tls.ca: cannot read {}: {e}", ca.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("elasticsearch.tls.ca: {}: {e}", ca.display()))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some((cert, key)) = &tls.client_cert {
            let mut pem = std::fs::read(cert).map_err(|e| {
                format!(
                    "elasticsearch.tls.cert: cannot read {}: {e}",
                    cert.display()
                )
            })?;
            pem.push(b'\n');
            pem.extend(std::fs::read(key).map_err(|e| {
                format!("elasticsearch.tls.key: cannot read {}: {e}", key.display())
            })?);
            builder = builder.identity(
                reqwest::Identity::from_pem(&pem)
                    .map_err(|e| format!("elasticsearch.tls.cert/key: {e}"))?,
            );
        }
        let plain = builder
            .build()
            .map_err(|e| format!("cannot build the gate's HTTP client: {e}"))?;
        let bases = settings
            .urls
            .iter()
            .map(|u| zkguard::config::display_urls(std::slice::from_ref(u)))
            .collect();
        Ok(Self {
            plain,
            bases,
            next: AtomicUsize::new(0),
            own,
            timeout: settings.request_timeout,
        })
    }

    fn base(&self) -> &str {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.bases.len();
        &self.bases[i]
    }

    /// Passes a request through as it is (method, path, query, headers but the connection's,
    /// body streamed) and streams the answer back as it is.
    pub async fn pass(&self, request: Request<Body>) -> Result<Response, String> {
        let (parts, body) = request.into_parts();
        let target = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let body = reqwest::Body::wrap_stream(body.into_data_stream());
        self.send(parts.method, &target, &parts.headers, body).await
    }

    /// Passes a request whose body the gate has read through.
    pub async fn pass_buffered(
        &self,
        method: Method,
        target: &str,
        headers: &HeaderMap,
        body: axum::body::Bytes,
    ) -> Result<Response, String> {
        self.send(method, target, headers, reqwest::Body::from(body))
            .await
    }

    async fn send(
        &self,
        method: Method,
        target: &str,
        headers: &HeaderMap,
        body: reqwest::Body,
    ) -> Result<Response, String> {
        let url = format!("{}{target}", self.base());
        let mut out = reqwest::header::HeaderMap::with_capacity(headers.len());
        for (name, value) in headers {
            if !is_hop_by_hop(name) && name != header::HOST {
                out.append(name.clone(), value.clone());
            }
        }
        let answer = self
            .plain
            .request(method, &url)
            .headers(out)
            .body(body)
            .send()
            .await
            .map_err(|e| zkguard::es::error_chain(&e))?;
        let mut response = Response::builder().status(answer.status());
        if let Some(h) = response.headers_mut() {
            for (name, value) in answer.headers() {
                if !is_hop_by_hop(name) {
                    h.append(name.clone(), value.clone());
                }
            }
        }
        let stream = answer.bytes_stream().map_err(std::io::Error::other);
        response
            .body(Body::from_stream(stream))
            .map_err(|e| e.to_string())
    }

    /// One of the gate's own requests, with the service's credentials; the answer read whole.
    pub async fn own(
        &self,
        method: Method,
        target: &str,
        content_type: &'static str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, String> {
        use elasticsearch::http::Method as EsMethod;
        let method = match method {
            Method::GET => EsMethod::Get,
            Method::PUT => EsMethod::Put,
            Method::DELETE => EsMethod::Delete,
            Method::HEAD => EsMethod::Head,
            _ => EsMethod::Post,
        };
        let mut headers = elasticsearch::http::headers::HeaderMap::new();
        headers.insert(
            elasticsearch::http::headers::CONTENT_TYPE,
            elasticsearch::http::headers::HeaderValue::from_static(content_type),
        );
        let answer = self
            .own
            .client()
            .transport()
            .send::<Vec<u8>, ()>(method, target, headers, None, body, Some(self.timeout))
            .await
            .map_err(|e| format!("cannot reach Elasticsearch at {}: {e}", self.own.urls()))?;
        let status =
            StatusCode::from_u16(answer.status_code().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        let body = answer.bytes().await.map_err(|e| {
            format!(
                "the answer of Elasticsearch at {} broke off: {e}",
                self.own.urls()
            )
        })?;
        Ok(Answer { status, body })
    }

    /// The cluster's product header (`X-Elastic-Product`), as `GET /` answers it; `None` when
    /// it sends none (OpenSearch).
    pub async fn product(&self) -> Result<Option<HeaderValue>, String> {
        use elasticsearch::http::Method as EsMethod;
        let answer = self
            .own
            .client()
            .transport()
            .send::<Vec<u8>, ()>(
                EsMethod::Get,
                "/",
                Default::default(),
                None,
                None,
                Some(self.timeout),
            )
            .await
            .map_err(|e| format!("cannot reach Elasticsearch at {}: {e}", self.own.urls()))?;
        Ok(answer
            .headers()
            .get(PRODUCT)
            .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()))
    }
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}
