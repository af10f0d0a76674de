//! [`DocStore`](super::DocStore) over the official `elasticsearch` crate.
//!
//! Every call is a plain document API call; the HTTP status of each answer is mapped onto
//! [`EsError`] in one place ([`error_for_status`]), so all operations classify failures the same
//! way: 409 is a [`EsError::Conflict`], 404 a [`EsError::NotFound`], 429
//! [`EsError::TooManyRequests`], 5xx [`EsError::Server`], any other 4xx [`EsError::BadRequest`], and
//! a request that got no answer (connection refused, timeout) [`EsError::Transport`].

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use elasticsearch::auth::Credentials;
use elasticsearch::http::request::JsonBody;
use elasticsearch::http::response::Response;
use elasticsearch::http::transport::{
    MultiNodeConnectionPool, SingleNodeConnectionPool, TransportBuilder,
};
use elasticsearch::indices::{
    IndicesCreate, IndicesCreateParts, IndicesPutMapping, IndicesPutMappingParts, IndicesRefresh,
    IndicesRefreshParts,
};
use elasticsearch::params::OpType;
use elasticsearch::{
    BulkParts, DeleteParts, Elasticsearch, GetParts, IndexParts, MgetParts, SearchParts,
};
use serde_json::{json, Map, Value};
use url::Url;

use super::answer::{answer_items, doc_of, error_for_status, error_type, truncate, write_meta};
use super::params::{create_on_delete, es_refresh, Cond};
use super::{BulkAction, Doc, DocMeta, DocStore, EsError, Refresh, WriteCondition};
use crate::config::EsSettings;

/// The Elasticsearch-backed document store.
///
/// Cheap to clone: clones share one HTTP connection pool.
///
/// With several URLs (`elasticsearch.url=http://es1:9200,http://es2:9200`) requests go round-robin
/// over the nodes, and a request whose connection is refused is retried on the next node (it was
/// never sent, so the retry cannot apply a write twice). Other failures are returned as they are.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), zkguard::es::EsError> {
/// use zkguard::es::{DocStore, EsStore, Refresh, WriteCondition};
///
/// let store = EsStore::from_url("http://localhost:9200")?;
/// let doc = serde_json::json!({"title": "Hello"});
/// // A fenced write: rejected with EsError::Conflict if a newer token already wrote the document.
/// store.index("articles", "42", &doc, WriteCondition::ExternalGte(7), Refresh::No).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EsStore {
    client: Elasticsearch,
    /// The configured URLs, comma-separated, for error messages.
    urls: String,
    /// How many nodes the pool holds: the number of attempts on a refused connection.
    nodes: usize,
    timeout: Duration,
}

impl fmt::Debug for EsStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EsStore")
            .field("urls", &self.urls)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl EsStore {
    /// Connects to the cluster named by `elasticsearch.url` (one or several comma-separated URLs),
    /// with basic authentication when `elasticsearch.username` is set or the URLs embed credentials
    /// as `http://user:pass@host:9200` (not both: the configuration is refused then), or with
    /// the API key `elasticsearch.api.key` (`Authorization: ApiKey ...`),
    /// and `elasticsearch.request.timeout` as the per-request timeout. URLs are never shown with
    /// their credentials.
    ///
    /// No request is sent: an unreachable cluster shows up as [`EsError::Transport`] on the first
    /// call.
    ///
    /// # Errors
    /// [`EsError::Transport`] when no URL is configured or the HTTP client cannot be built (for
    /// example, the TLS backend cannot be initialised); [`EsError::BadRequest`] (status 0) when
    /// credentials are given both in the URLs and by the settings, or differ between URLs, or an
    /// API key is given with basic authentication.
    pub fn new(settings: &EsSettings) -> Result<Self, EsError> {
        if settings.urls.is_empty() {
            return Err(EsError::Transport {
                url: String::new(),
                reason: "no URL configured; set elasticsearch.url to e.g. http://localhost:9200"
                    .into(),
            });
        }
        let mut urls = settings.urls.clone();
        let credentials = crate::config::split_url_credentials(
            &mut urls,
            settings.username.as_deref(),
            settings.password.as_deref(),
        )
        .map_err(|reason| EsError::BadRequest {
            status: 0,
            reason: format!("elasticsearch.url: {reason}"),
        })?;
        let shown = crate::config::display_urls(&urls);
        let builder = if urls.len() == 1 {
            TransportBuilder::new(SingleNodeConnectionPool::new(urls[0].clone()))
        } else {
            TransportBuilder::new(MultiNodeConnectionPool::round_robin(urls.clone(), None))
        };
        let credentials = match (credentials, &settings.api_key) {
            (Some(_), Some(_)) => {
                return Err(EsError::BadRequest {
                    status: 0,
                    reason: "elasticsearch.api.key: basic authentication is configured too; use one of the two".into(),
                })
            }
            (Some((user, password)), None) => Some(Credentials::Basic(user, password)),
            (None, Some(key)) => Some(match key.split_once(':') {
                Some((id, secret)) => Credentials::ApiKey(id.to_string(), secret.to_string()),
                None => Credentials::EncodedApiKey(key.clone()),
            }),
            (None, None) => None,
        };
        let builder = with_tls(builder, &settings.tls, credentials)?;
        let transport = builder
            .timeout(settings.request_timeout)
            .enable_meta_header(false)
            .build()
            .map_err(|e| EsError::Transport {
                url: shown.clone(),
                reason: format!("cannot build the HTTP client: {e}"),
            })?;
        Ok(Self {
            client: Elasticsearch::new(transport),
            urls: shown,
            nodes: urls.len(),
            timeout: settings.request_timeout,
        })
    }

    /// Connects to one or several comma-separated URLs with the default request timeout and no
    /// authentication (handy in tests and tools).
    ///
    /// # Errors
    /// [`EsError::BadRequest`] when a URL cannot be parsed; otherwise as [`EsStore::new`].
    pub fn from_url(urls: &str) -> Result<Self, EsError> {
        let mut settings = crate::config::Settings::default().elasticsearch;
        settings.urls = urls
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                Url::parse(s).map_err(|e| EsError::BadRequest {
                    status: 0,
                    reason: format!(
                        "invalid Elasticsearch URL `{}`: {e}; use e.g. http://localhost:9200",
                        crate::config::redact_urls(s)
                    ),
                })
            })
            .collect::<Result<_, _>>()?;
        Self::new(&settings)
    }

    /// The configured URLs, comma-separated (without credentials).
    pub fn urls(&self) -> &str {
        &self.urls
    }

    /// The underlying `elasticsearch` client, for calls the [`DocStore`] trait does not cover.
    pub fn client(&self) -> &Elasticsearch {
        &self.client
    }

    /// Sends a request built by `make`; when the connection is refused and the pool has more nodes,
    /// builds and sends it again (the round-robin pool picks the next node). A request that never
    /// left because the pooled connection it was given had just been closed by the server (an
    /// idle keep-alive connection) is sent again, up to [`UNSENT_RESENDS`] times (each try may
    /// draw another pooled connection the server closed meanwhile): nothing of it reached the
    /// server, so this holds for writes too.
    async fn send<F, Fut>(&self, what: &str, make: F) -> Result<Response, EsError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Response, elasticsearch::Error>>,
    {
        let mut attempt = 1;
        let mut resent_unsent = 0;
        loop {
            match make().await {
                Ok(r) => return Ok(r),
                Err(e) if attempt < self.nodes && is_connect_error(&e) => {
                    tracing::debug!(error = %error_chain(&e), attempt, "{what}: connection refused, trying the next node");
                    attempt += 1;
                }
                Err(e) if resent_unsent < UNSENT_RESENDS && is_unsent_error(&e) => {
                    tracing::debug!(error = %error_chain(&e), "{what}: the pooled connection was closed before the request went out; sending it again");
                    resent_unsent += 1;
                }
                Err(e) => return Err(self.transport_error(what, &e)),
            }
        }
    }

    fn transport_error(&self, what: &str, e: &elasticsearch::Error) -> EsError {
        let reason = if e.is_timeout() {
            format!(
                "{what}: no answer within {}ms (elasticsearch.request.timeout)",
                self.timeout.as_millis()
            )
        } else {
            format!("{what}: {}", error_chain(e))
        };
        EsError::Transport {
            url: self.urls.clone(),
            reason,
        }
    }
}

/// Applies `elasticsearch.tls.*` and the credentials. The client certificate takes the
/// transport's credentials slot, so basic authentication and API keys then travel as an
/// `Authorization` header of every request (marked sensitive: never logged).
fn with_tls(
    builder: TransportBuilder,
    tls: &crate::config::EsTls,
    credentials: Option<Credentials>,
) -> Result<TransportBuilder, EsError> {
    use base64::Engine as _;
    use elasticsearch::auth::ClientCertificate;
    use elasticsearch::cert::{Certificate, CertificateValidation};
    let unreadable =
        |key: &str, path: &std::path::Path, e: &dyn fmt::Display| EsError::BadRequest {
            status: 0,
            reason: format!("{key}: cannot use {}: {e}; give a PEM file", path.display()),
        };
    let mut builder = if !tls.verify {
        builder.cert_validation(CertificateValidation::None)
    } else if let Some(ca) = &tls.ca {
        let pem = std::fs::read(ca).map_err(|e| unreadable("elasticsearch.tls.ca", ca, &e))?;
        let certs =
            Certificate::from_pem(&pem).map_err(|e| unreadable("elasticsearch.tls.ca", ca, &e))?;
        builder.cert_validation(CertificateValidation::Full(certs))
    } else {
        builder
    };
    let Some((cert, key)) = &tls.client_cert else {
        return Ok(match credentials {
            Some(c) => builder.auth(c),
            None => builder,
        });
    };
    let mut pem =
        std::fs::read(cert).map_err(|e| unreadable("elasticsearch.tls.cert", cert, &e))?;
    pem.push(b'\n');
    pem.extend(std::fs::read(key).map_err(|e| unreadable("elasticsearch.tls.key", key, &e))?);
    builder = builder.auth(Credentials::Certificate(ClientCertificate::Pem(pem)));
    let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
    let header = match credentials {
        Some(Credentials::Basic(user, password)) => {
            Some(format!("Basic {}", b64(format!("{user}:{password}"))))
        }
        Some(Credentials::ApiKey(id, secret)) => {
            Some(format!("ApiKey {}", b64(format!("{id}:{secret}"))))
        }
        Some(Credentials::EncodedApiKey(encoded)) => Some(format!("ApiKey {encoded}")),
        _ => None,
    };
    if let Some(header) = header {
        let mut value = elasticsearch::http::headers::HeaderValue::from_str(&header).map_err(|_| {
            EsError::BadRequest {
                status: 0,
                reason: "the Elasticsearch credentials hold characters that cannot be sent in a header (the value is not shown)".into(),
            }
        })?;
        value.set_sensitive(true);
        builder = builder.header(elasticsearch::http::headers::AUTHORIZATION, value);
    }
    Ok(builder)
}

/// How many times a request that never left (its pooled connection closed under it) is sent
/// again: each try may draw another idle connection that the server (or a proxy before it)
/// closed at the same moment, as a busy machine shows when a front closes several at once.
const UNSENT_RESENDS: u32 = 4;

/// Whether the request never left: the HTTP client gave it a pooled connection that turned out
/// to be closed before anything was written (hyper's "connection was not ready").
fn is_unsent_error(e: &elasticsearch::Error) -> bool {
    error_chain(e).contains("connection was not ready")
}

/// Whether the request failed before anything was sent (connection refused or reset while
/// connecting), so that sending it to another node cannot apply it twice.
fn is_connect_error(e: &elasticsearch::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<reqwest::Error>() {
            if r.is_connect() {
                return true;
            }
        }
        source = s.source();
    }
    false
}

/// An error with all its causes, `outer: inner: innermost` (a cause whose text the chain
/// already holds is not repeated): what an HTTP client's error says only in its sources
/// (connection refused, reset, closed) shows.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// Reads an answer: its status and its JSON body (`Null` when the body is empty).
async fn read(response: Response, store: &EsStore, what: &str) -> Result<(u16, Value), EsError> {
    let status = response.status_code().as_u16();
    let text = response
        .text()
        .await
        .map_err(|e| store.transport_error(what, &e))?;
    if text.trim().is_empty() {
        return Ok((status, Value::Null));
    }
    match serde_json::from_str(&text) {
        Ok(v) => Ok((status, v)),
        // An error answer that is not JSON (a proxy's HTML page, a plain-text message) is still
        // classified by its status.
        Err(_) if status >= 400 => Ok((status, Value::String(truncate(&text, 300)))),
        Err(e) => Err(EsError::Protocol(format!(
            "{what}: the answer (status {status}) is not JSON ({e}): {}",
            truncate(&text, 200)
        ))),
    }
}

/// Whether `id` cannot be a URL path segment: `.` and `..` are removed by URL normalisation
/// (percent-encoded too), so a document route would reach another path (`/{index}/_doc/..` is
/// the index itself). Such documents are read with `_mget` and written with `_bulk`, which
/// carry the id in their bodies.
fn is_dot(id: &str) -> bool {
    id == "." || id == ".."
}

impl EsStore {
    /// [`DocStore::delete`] of a document whose id is `.` or `..` ([`is_dot`]), as a one-item
    /// `_bulk`: `None` when the document (or its index) does not exist, as a DELETE answers.
    async fn delete_dot(
        &self,
        index: &str,
        id: &str,
        cond: &Cond,
        refresh: Refresh,
    ) -> Result<Option<DocMeta>, EsError> {
        let what = format!("delete {index}/{id} (a one-item _bulk)");
        let mut meta = Map::new();
        meta.insert("_index".into(), json!(index));
        meta.insert("_id".into(), json!(id));
        cond.bulk_fields(&mut meta);
        let line = JsonBody::new(json!({ "delete": meta }));
        let response = self
            .send(&what, || {
                let mut req = self.client.bulk(BulkParts::None).body(vec![&line]);
                if let Some(r) = es_refresh(refresh) {
                    req = req.refresh(r);
                }
                req.send()
            })
            .await?;
        let (status, answer) = read(response, self, &what).await?;
        let items = answer_items(status, &answer, "items", 1, &what)?;
        let item = &items[0]["delete"];
        let item_status = item.get("status").and_then(Value::as_u64).unwrap_or(0) as u16;
        let error = item
            .get("error")
            .and_then(|e| e.get("type"))
            .and_then(Value::as_str);
        match (item_status, error) {
            (404, None | Some("index_not_found_exception")) => Ok(None),
            (200..=299, None) => write_meta(item, &what).map(Some),
            _ => Err(error_for_status(item_status, item, index, id)),
        }
    }
}

#[async_trait]
impl DocStore for EsStore {
    async fn get(&self, index: &str, id: &str) -> Result<Option<Doc>, EsError> {
        if is_dot(id) {
            let mut read = self.mget(&[(index.to_string(), id.to_string())]).await?;
            return read.pop().unwrap_or(Ok(None));
        }
        let what = format!("GET {index}/{id}");
        let response = self
            .send(&what, || {
                self.client
                    .get(GetParts::IndexId(index, id))
                    .realtime(true)
                    .send()
            })
            .await?;
        let (status, body) = read(response, self, &what).await?;
        match status {
            200..=299 if body.get("found").and_then(Value::as_bool) == Some(false) => Ok(None),
            200..=299 => doc_of(&body, &what).map(Some),
            // Both a missing document and a missing index.
            404 => Ok(None),
            _ => Err(error_for_status(status, &body, index, id)),
        }
    }

    async fn mget(
        &self,
        docs: &[(String, String)],
    ) -> Result<Vec<Result<Option<Doc>, EsError>>, EsError> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        let what = format!("mget of {} documents", docs.len());
        let body = json!({
            "docs": docs
                .iter()
                .map(|(index, id)| json!({"_index": index, "_id": id}))
                .collect::<Vec<_>>(),
        });
        let response = self
            .send(&what, || {
                self.client
                    .mget(MgetParts::None)
                    .realtime(true)
                    .body(body.clone())
                    .send()
            })
            .await?;
        let (status, answer) = read(response, self, &what).await?;
        let items = answer_items(status, &answer, "docs", docs.len(), &what)?;
        Ok(items
            .iter()
            .zip(docs)
            .map(|(item, (index, id))| match item.get("error") {
                // A missing index, as a GET's 404.
                Some(e)
                    if e.get("type").and_then(Value::as_str)
                        == Some("index_not_found_exception") =>
                {
                    Ok(None)
                }
                Some(e) => Err(error_for_status(
                    e.get("status").and_then(Value::as_u64).unwrap_or(500) as u16,
                    &json!({ "error": e }),
                    index,
                    id,
                )),
                None if item.get("found").and_then(Value::as_bool) == Some(true) => {
                    doc_of(item, &format!("GET {index}/{id} in {what}")).map(Some)
                }
                None => Ok(None),
            })
            .collect())
    }

    async fn index(
        &self,
        index: &str,
        id: &str,
        source: &Value,
        condition: WriteCondition,
        refresh: Refresh,
    ) -> Result<DocMeta, EsError> {
        if is_dot(id) {
            let action = BulkAction::Index {
                index: index.to_string(),
                id: id.to_string(),
                source: source.clone(),
                condition,
            };
            let mut written = self.bulk(&[action], refresh).await?;
            return written.pop().unwrap_or_else(|| {
                Err(EsError::Protocol(format!(
                    "index {index}/{id}: the one-item _bulk answered no item"
                )))
            });
        }
        let what = format!("index {index}/{id}");
        let cond = Cond::of(condition)?;
        let response = self
            .send(&what, || {
                let mut req = self
                    .client
                    .index(IndexParts::IndexId(index, id))
                    .body(source);
                if cond.op_create {
                    req = req.op_type(OpType::Create);
                }
                if let Some((s, p)) = cond.if_seq_no {
                    req = req.if_seq_no(s).if_primary_term(p);
                }
                if let Some((v, t)) = cond.version {
                    req = req.version(v).version_type(t);
                }
                if let Some(r) = es_refresh(refresh) {
                    req = req.refresh(r);
                }
                req.send()
            })
            .await?;
        let (status, body) = read(response, self, &what).await?;
        match status {
            200..=299 => write_meta(&body, &what),
            _ => Err(error_for_status(status, &body, index, id)),
        }
    }

    async fn delete(
        &self,
        index: &str,
        id: &str,
        condition: WriteCondition,
        refresh: Refresh,
    ) -> Result<Option<DocMeta>, EsError> {
        let what = format!("delete {index}/{id}");
        let cond = Cond::of(condition)?;
        if cond.op_create {
            return Err(create_on_delete());
        }
        if is_dot(id) {
            return self.delete_dot(index, id, &cond, refresh).await;
        }
        let response = self
            .send(&what, || {
                let mut req = self.client.delete(DeleteParts::IndexId(index, id));
                if let Some((s, p)) = cond.if_seq_no {
                    req = req.if_seq_no(s).if_primary_term(p);
                }
                if let Some((v, t)) = cond.version {
                    req = req.version(v).version_type(t);
                }
                if let Some(r) = es_refresh(refresh) {
                    req = req.refresh(r);
                }
                req.send()
            })
            .await?;
        let (status, body) = read(response, self, &what).await?;
        match status {
            200..=299 => write_meta(&body, &what).map(Some),
            // The document (`result: not_found`) or its whole index does not exist.
            404 => Ok(None),
            _ => Err(error_for_status(status, &body, index, id)),
        }
    }

    async fn search(&self, index: &str, body: &Value) -> Result<Vec<Doc>, EsError> {
        let what = format!("search {index}");
        let mut request = body.clone();
        if let Value::Object(o) = &mut request {
            o.entry("seq_no_primary_term").or_insert(Value::Bool(true));
            o.entry("version").or_insert(Value::Bool(true));
        }
        let indices = [index];
        let response = self
            .send(&what, || {
                self.client
                    .search(SearchParts::Index(&indices))
                    .seq_no_primary_term(true)
                    .body(&request)
                    .send()
            })
            .await?;
        let (status, answer) = read(response, self, &what).await?;
        match status {
            200..=299 => {
                let hits = answer
                    .pointer("/hits/hits")
                    .and_then(Value::as_array)
                    .ok_or_else(|| {
                        EsError::Protocol(format!("{what}: the answer has no hits.hits array"))
                    })?;
                hits.iter().map(|h| doc_of(h, &what)).collect()
            }
            404 if error_type(&answer) == Some("index_not_found_exception") => Ok(Vec::new()),
            _ => Err(error_for_status(status, &answer, index, "")),
        }
    }

    async fn bulk(
        &self,
        actions: &[BulkAction],
        refresh: Refresh,
    ) -> Result<Vec<Result<DocMeta, EsError>>, EsError> {
        // Actions that cannot be expressed get their error here and are not sent; the others keep
        // their positions through `sent`.
        let mut results: Vec<Option<Result<DocMeta, EsError>>> = Vec::with_capacity(actions.len());
        let mut sent: Vec<usize> = Vec::with_capacity(actions.len());
        let mut lines: Vec<JsonBody<Value>> = Vec::with_capacity(actions.len() * 2);
        for (i, action) in actions.iter().enumerate() {
            let (op, index, id, condition, source) = match action {
                BulkAction::Index {
                    index,
                    id,
                    source,
                    condition,
                } => ("index", index, id, *condition, Some(source)),
                BulkAction::Delete {
                    index,
                    id,
                    condition,
                } => ("delete", index, id, *condition, None),
            };
            let cond = match Cond::of(condition) {
                Ok(c) if c.op_create && op == "delete" => Err(create_on_delete()),
                other => other,
            };
            let cond = match cond {
                Ok(c) => c,
                Err(e) => {
                    results.push(Some(Err(e)));
                    continue;
                }
            };
            let mut meta = Map::new();
            meta.insert("_index".into(), json!(index));
            meta.insert("_id".into(), json!(id));
            cond.bulk_fields(&mut meta);
            let op = if cond.op_create { "create" } else { op };
            lines.push(JsonBody::new(json!({ op: meta })));
            if let Some(source) = source {
                lines.push(JsonBody::new(source.clone()));
            }
            results.push(None);
            sent.push(i);
        }
        if !sent.is_empty() {
            let what = format!("bulk of {} actions", sent.len());
            let response = self
                .send(&what, || {
                    let body: Vec<&JsonBody<Value>> = lines.iter().collect();
                    let mut req = self.client.bulk(BulkParts::None).body(body);
                    if let Some(r) = es_refresh(refresh) {
                        req = req.refresh(r);
                    }
                    req.send()
                })
                .await?;
            let (status, answer) = read(response, self, &what).await?;
            let items = answer_items(status, &answer, "items", sent.len(), &what)?;
            for (item, &i) in items.iter().zip(&sent) {
                let (index, id) = match &actions[i] {
                    BulkAction::Index { index, id, .. } | BulkAction::Delete { index, id, .. } => {
                        (index, id)
                    }
                };
                // Each item is `{"<op>": {...}}`.
                let inner = item
                    .as_object()
                    .and_then(|o| o.values().next())
                    .unwrap_or(&Value::Null);
                let item_status = inner.get("status").and_then(Value::as_u64).unwrap_or(0) as u16;
                let result =
                    if inner.get("error").is_some() || item_status >= 400 && item_status != 404 {
                        Err(error_for_status(item_status, inner, index, id))
                    } else {
                        // Success, including the delete of a missing document (`result: not_found`, no
                        // `error`), which leaves the document absent as asked.
                        write_meta(inner, &format!("{what}, item {i}"))
                    };
                results[i] = Some(result);
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every action has a result"))
            .collect())
    }

    async fn ensure_index(&self, index: &str, mappings: &Value) -> Result<(), EsError> {
        let what = format!("create index {index}");
        // `mappings` is the mappings object; a whole create-index body (with `mappings`,
        // `settings` or `aliases` at the top) is sent as it is.
        let is_full_body = mappings.as_object().is_some_and(|o| {
            !o.is_empty()
                && o.keys()
                    .all(|k| matches!(k.as_str(), "mappings" | "settings" | "aliases"))
        });
        let body = if is_full_body {
            mappings.clone()
        } else {
            json!({ "mappings": mappings })
        };
        let response = self
            .send(&what, || {
                IndicesCreate::<()>::new(self.client.transport(), IndicesCreateParts::Index(index))
                    .body(&body)
                    .send()
            })
            .await?;
        let (status, answer) = read(response, self, &what).await?;
        match status {
            200..=299 => Ok(()),
            400 if error_type(&answer).is_some_and(|t| t.contains("already_exists")) => Ok(()),
            _ => Err(error_for_status(status, &answer, index, "")),
        }
    }

    async fn put_mapping(&self, index: &str, properties: &Value) -> Result<bool, EsError> {
        let what = format!("put the mapping of {index}");
        let indices = [index];
        let body = json!({ "properties": properties });
        let response = self
            .send(&what, || {
                IndicesPutMapping::<()>::new(
                    self.client.transport(),
                    IndicesPutMappingParts::Index(&indices),
                )
                .body(&body)
                .send()
            })
            .await?;
        let (status, answer) = read(response, self, &what).await?;
        match status {
            200..=299 => Ok(true),
            404 if error_type(&answer) == Some("index_not_found_exception") => Ok(false),
            _ => Err(error_for_status(status, &answer, index, "")),
        }
    }

    async fn refresh(&self, index: &str) -> Result<(), EsError> {
        let what = format!("refresh {index}");
        let indices = [index];
        let response = self
            .send(&what, || {
                IndicesRefresh::<()>::new(
                    self.client.transport(),
                    IndicesRefreshParts::Index(&indices),
                )
                .send()
            })
            .await?;
        let (status, answer) = read(response, self, &what).await?;
        match status {
            200..=299 => Ok(()),
            _ => Err(error_for_status(status, &answer, index, "")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_credentials_are_decoded_and_never_shown() {
        let mut settings = crate::config::Settings::default().elasticsearch;
        settings.urls = vec!["http://elastic:p%40ss+word@127.0.0.1:9200".parse().unwrap()];
        let store = EsStore::new(&settings).unwrap();
        assert_eq!(store.urls(), "http://127.0.0.1:9200");
        assert!(!format!("{store:?}").contains("p%40ss"));
        let mut urls = settings.urls.clone();
        assert_eq!(
            crate::config::split_url_credentials(&mut urls, None, None).unwrap(),
            Some(("elastic".to_string(), "p@ss+word".to_string()))
        );
        // Both in the URL and by the keys: refused, consistently with the configuration.
        settings.username = Some("other".into());
        let e = EsStore::new(&settings).unwrap_err().to_string();
        assert!(e.contains("both in the URL"), "{e}");
        assert!(!e.contains("p%40ss"), "{e}");
        let e = EsStore::from_url("http://elastic:secret@127.0.0.1:notaport")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret"), "{e}");
    }
}
