//! The gate: the service's state, the cluster, what it guards, how a guarded write is locked,
//! and the helpers its handlers share.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use zkguard::config::GatewaySettings;
use zkguard::{LockError, LockType};

use super::backend::Cluster;
use super::body::BodyBudget;
use super::own::OwnNames;
use super::reply::GateError;
use crate::server::access::Tokens;
use crate::server::state::AppState;

/// How long a name found to be a concrete index (not an alias) is remembered.
const CONCRETE_FOR: Duration = Duration::from_secs(60);

/// Header naming the lock's monitor object instead of `{index}:{id}`.
pub const MONITOR_HEADER: &str = "x-zkguard-monitor";
/// Header choosing the lock type (`foreground` or `background`).
pub const TYPE_HEADER: &str = "x-zkguard-lock-type";
/// Header giving the lock wait (`500ms`, `5s`, or milliseconds).
pub const TIMEOUT_HEADER: &str = "x-zkguard-timeout";
/// Header carrying a bearer token of `server.auth.tokens.file` on guarded writes.
pub const TOKEN_HEADER: &str = "x-zkguard-token";
/// Header of every guarded write's answer: the fencing token it was written with.
pub const TOKEN_ANSWER: &str = "x-zkguard-fencing-token";

/// The gate: the service's state, the cluster, and what it guards.
#[derive(Debug)]
pub struct Gateway {
    /// The service's state (locks, metrics, limits).
    pub state: Arc<AppState>,
    /// The cluster behind the gate.
    pub cluster: Cluster,
    /// The cluster's product header, read from the cluster the first time it answers
    /// ([`Gateway::product`]).
    product: std::sync::OnceLock<Option<HeaderValue>>,
    /// `server.gateway.*`.
    pub settings: GatewaySettings,
    tokens: Arc<Tokens>,
    /// Names known to be concrete indices, and since when.
    concrete: Mutex<HashMap<String, Instant>>,
    /// The aliases of zkguard's own indices.
    own: OwnNames,
    /// Places of the `_bulk` requests handled at once (`server.gateway.bulk.max.concurrent`).
    bulks: Arc<Semaphore>,
    /// The bytes of request bodies held at once (`server.gateway.body.max.inflight.bytes`).
    pub bodies: BodyBudget,
}

/// How a guarded write is locked.
#[derive(Debug, Clone)]
pub struct LockPlan {
    /// Lock type.
    pub lock_type: LockType,
    /// Lock wait.
    pub wait: Duration,
    /// The monitor named by the caller's header, if any.
    pub monitor: Option<String>,
}

impl Gateway {
    /// The gate over `state`. It does not reach the cluster: the product header is read when
    /// the cluster first answers ([`Gateway::product`]).
    ///
    /// # Errors
    /// A message naming what cannot be used (TLS files): a configuration error.
    pub fn new(
        state: Arc<AppState>,
        tokens: Arc<Tokens>,
        es: &zkguard::config::EsSettings,
    ) -> Result<Self, String> {
        let cluster = Cluster::new(es, (*state.store).clone())?;
        Ok(Self {
            bulks: Arc::new(Semaphore::new(state.settings.gateway.bulk_max_concurrent)),
            bodies: BodyBudget::new(state.settings.gateway.body_max_inflight_bytes),
            settings: state.settings.gateway.clone(),
            state,
            cluster,
            product: std::sync::OnceLock::new(),
            tokens,
            concrete: Mutex::new(HashMap::new()),
            own: OwnNames::default(),
        })
    }

    /// The cluster's product header (`X-Elastic-Product`, none from OpenSearch), which the
    /// gate's own answers carry: read from the cluster once, when it first answers.
    ///
    /// # Errors
    /// 503 naming the cluster and why it cannot be reached (until it answers).
    pub async fn product(&self) -> Result<Option<HeaderValue>, GateError> {
        if let Some(known) = self.product.get() {
            return Ok(known.clone());
        }
        let read = self.cluster.product().await.map_err(unavailable)?;
        Ok(self.product.get_or_init(|| read).clone())
    }

    /// Whether writes to `index` are guarded: it matches `server.gateway.indices` and is not a
    /// system index (a leading `.`, which patterns do not match, as in Elasticsearch).
    pub fn guards(&self, index: &str) -> bool {
        !index.starts_with('.') && self.settings.indices.matches(index)
    }

    /// The refusal of a write to `target` when it is, or reaches, one of zkguard's own indices
    /// (transactions, dead letters, lease locks) that `server.index.allow` does not name: by its
    /// name, through an alias pointing to it, or through a pattern or list (`zkguard-*`, `a,b`,
    /// `_all`) that covers it. The aliases are those read last ([`Gateway::know_own`]).
    pub fn own_index(&self, target: &str) -> Option<GateError> {
        let settings = &self.state.settings;
        for name in target.split(',').map(str::trim) {
            if name.starts_with('.') || name.starts_with('-') || name.contains('*') {
                continue;
            }
            if let Some(why) = settings.protected_index(name) {
                return Some(own_refusal(name, &format!("it {why}")));
            }
        }
        let (part, own) = self.own.reached(&settings.own_indices, target)?;
        Some(own_refusal(
            &part,
            &format!("it reaches [{own}], one of zkguard's own indices (transactions, dead letters, lease locks)"),
        ))
    }

    /// Reads the aliases of zkguard's own indices unless they were read less than a second ago
    /// (or an alias change passed through the gate since).
    ///
    /// # Errors
    /// 503 when the cluster cannot tell them: the write is not let through unchecked.
    pub async fn know_own(&self) -> Result<(), GateError> {
        let own = &self.state.settings.own_indices;
        if own.is_empty() || self.own.fresh() {
            return Ok(());
        }
        let _reading = self.own.reading.lock().await;
        if self.own.fresh() {
            return Ok(());
        }
        let generation = self.own.generation();
        let names: Vec<String> = own.iter().map(|o| encode(o)).collect();
        let path = format!(
            "/{}/_alias?ignore_unavailable=true&allow_no_indices=true",
            names.join(",")
        );
        let answer = self
            .cluster
            .own(Method::GET, &path, "application/json", None)
            .await
            .map_err(unavailable)?;
        if !answer.status.is_success() && answer.status != StatusCode::NOT_FOUND {
            return Err(unavailable(format!(
                "the aliases of zkguard's own indices could not be read (HTTP {}: {}); nothing was written",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            )));
        }
        self.own.store(generation, &answer.json());
        Ok(())
    }

    /// Forgets the aliases of zkguard's own indices: a request that may change aliases passed
    /// through.
    pub fn aliases_changed(&self) {
        self.own.invalidate();
    }

    /// The concrete index a write to `target` lands in: the target itself, or the write index
    /// of the alias it names.
    ///
    /// # Errors
    /// An alias over several indices without a write index; the cluster unreachable.
    pub async fn concrete(&self, target: &str) -> Result<String, GateError> {
        {
            let known = self.concrete.lock().unwrap_or_else(|p| p.into_inner());
            if known
                .get(target)
                .is_some_and(|since| since.elapsed() < CONCRETE_FOR)
            {
                return Ok(target.to_string());
            }
        }
        let path = format!("/_alias/{}", encode(target));
        let answer = self
            .cluster
            .own(Method::GET, &path, "application/json", None)
            .await
            .map_err(unavailable)?;
        if answer.status == StatusCode::NOT_FOUND || !answer.status.is_success() {
            // Not an alias: a data stream writes to its newest backing index.
            let stream = self
                .cluster
                .own(
                    Method::GET,
                    &format!("/_data_stream/{}", encode(target)),
                    "application/json",
                    None,
                )
                .await
                .map_err(unavailable)?;
            if stream.status.is_success() {
                let body = stream.json();
                if let Some(newest) = body["data_streams"][0]["indices"]
                    .as_array()
                    .and_then(|i| i.last())
                    .and_then(|i| i["index_name"].as_str())
                {
                    return Ok(newest.to_string());
                }
            }
            self.concrete
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(target.to_string(), Instant::now());
            return Ok(target.to_string());
        }
        let body = answer.json();
        let Some(indices) = body.as_object().filter(|o| !o.is_empty()) else {
            return Ok(target.to_string());
        };
        if indices.contains_key(target) {
            // Not an alias: `_alias/{index}` answers the index's own aliases on some servers.
            return Ok(target.to_string());
        }
        let settings = &self.state.settings;
        if let Some(own) = indices
            .keys()
            .find(|i| !i.starts_with('.') && settings.protected_index(i).is_some())
        {
            return Err(own_refusal(
                target,
                &format!("it points to [{own}], one of zkguard's own indices (transactions, dead letters, lease locks)"),
            ));
        }
        let write_index = indices
            .iter()
            .find(|(_, v)| v["aliases"][target]["is_write_index"].as_bool() == Some(true));
        match (write_index, indices.len()) {
            (Some((name, _)), _) => Ok(name.clone()),
            (None, 1) => Ok(indices.keys().next().cloned().unwrap_or_default()),
            _ => Err(GateError::refused(format!(
                "the alias [{target}] points to {} indices and none is its write index; write to one index, or make one the alias's write index (is_write_index)",
                indices.len()
            ))),
        }
    }

    /// The lock of a guarded write on `concrete`, from the request's headers.
    ///
    /// # Errors
    /// A header that cannot be used.
    pub fn lock_plan(&self, headers: &HeaderMap, concrete: &str) -> Result<LockPlan, GateError> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let lock_type = match text(TYPE_HEADER) {
            Some(t) => t
                .trim()
                .parse::<LockType>()
                .map_err(|e| GateError::refused(format!("header X-Zkguard-Lock-Type: {e}")))?,
            None if self.settings.background.matches(concrete) => LockType::Background,
            None => LockType::Foreground,
        };
        let asked =
            match text(TIMEOUT_HEADER) {
                Some(t) => Some(zkguard::config::parse_bounded_duration(t.trim()).map_err(
                    |e| GateError::refused(format!("header X-Zkguard-Timeout `{t}`: {e}")),
                )?),
                None => None,
            };
        let wait = match (asked, lock_type) {
            (Some(t), _) => self.state.lock_wait(Some(t)),
            (None, LockType::Foreground) => self.state.lock_wait(None),
            (None, LockType::Background) => self.state.lock_wait(Some(self.state.bg_timeout)),
        };
        let monitor = match text(MONITOR_HEADER) {
            Some(m) => {
                let m = m.trim().to_string();
                zkguard::lock::validate_monitor(&m)
                    .map_err(|e| GateError::refused(format!("header X-Zkguard-Monitor: {e}")))?;
                Some(m)
            }
            None => None,
        };
        Ok(LockPlan {
            lock_type,
            wait,
            monitor,
        })
    }
}

/// The error of a lock not acquired: 429 when it stayed taken (what clients retry), 503 when
/// the lock backend failed (429 in a `_bulk` item: nothing was written, see
/// [`GateError::item_status`]), 400 for a bad monitor name.
pub fn lock_error(e: &LockError) -> GateError {
    match e {
        LockError::Timeout { .. } => GateError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "es_rejected_execution_exception",
            format!("zkguard: {e}; nothing was written, send the request again"),
        )
        .retry_after(1)
        .unwritten(),
        LockError::InvalidMonitor { .. } | LockError::InfoTooLong { .. } => {
            GateError::refused(format!("zkguard: {e}"))
        }
        _ => GateError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "zkguard_lock_unavailable_exception",
            format!("zkguard: {e}; nothing was written, send the request again"),
        )
        .retry_after(1)
        .unwritten(),
    }
}

/// The metrics outcome and the answer of a lock of `lock_type` not acquired ([`lock_error`]);
/// a timeout is counted as one.
pub fn lock_failed(
    metrics: &crate::server::metrics::Metrics,
    lock_type: LockType,
    e: &LockError,
) -> (&'static str, GateError) {
    if matches!(e, LockError::Timeout { .. }) {
        metrics.lock_timed_out(lock_type);
        ("lock_timeout", lock_error(e))
    } else {
        ("failed", lock_error(e))
    }
}

/// 503 for a write not sent because `guard` reports its lock lost (or released): nothing was
/// written, and a retry is safe (429 in a `_bulk` item, see [`GateError::item_status`]).
pub fn lock_lost(guard: &dyn zkguard::Guard) -> GateError {
    let reason = guard.why_not_held();
    GateError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "zkguard_lock_lost_exception",
        format!(
            "zkguard: the lock on `{}` was lost before the write was sent ({reason}); nothing was written, send it again",
            guard.monitor()
        ),
    )
    .retry_after(1)
    .unwritten()
}

/// 503 for a write the cluster took although `guard` reports its lock lost (or released) by
/// the time the answer came: the lock's next holder may have read the document before the
/// write landed and replaced it from that read, so the write is not acknowledged, as the
/// library's guarded writes answer it (`GuardedError::LostDuringWrite`). Not
/// [`GateError::unwritten`]: it may have been applied, so a `_bulk` item answers 503, which no
/// bulk helper sends again blindly; sending it again converges (an index, update or delete),
/// a create may then answer 409.
pub fn lost_during_write(guard: &dyn zkguard::Guard) -> GateError {
    let reason = guard.why_not_held();
    tracing::warn!(
        monitor = guard.monitor(),
        token = guard.fencing_token(),
        %reason,
        "the gate's lock was lost while its write was on its way: the write is not acknowledged, the next holder may have replaced it"
    );
    GateError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "zkguard_lock_lost_exception",
        format!(
            "zkguard: the lock on `{}` was lost while the write was on its way to the cluster ({reason}); the cluster took it, but the lock's next holder may have read the document before it landed and replaced it: the write is not acknowledged and may have been applied or replaced; send it again (an index, update or delete converges; a create may then answer 409)",
            guard.monitor()
        ),
    )
    .retry_after(1)
}

/// 403 for a write to `name`, which `why` (zkguard's own index, or what reaches one).
fn own_refusal(name: &str, why: &str) -> GateError {
    GateError::new(
        StatusCode::FORBIDDEN,
        "security_exception",
        format!("zkguard: writes to [{name}] are refused: {why}; write it through zkguard's own commands, or name it in server.index.allow"),
    )
}

/// 503 for a cluster the gate could not reach itself.
pub fn unavailable(reason: String) -> GateError {
    GateError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "zkguard_cluster_unavailable_exception",
        format!("zkguard: {reason}"),
    )
    .retry_after(1)
}

/// Percent-encodes one path segment.
pub fn encode(segment: &str) -> String {
    url::form_urlencoded::byte_serialize(segment.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

impl Gateway {
    /// Whether any of the comma-separated targets may be guarded: a guarded name, or a pattern
    /// or `_all` while anything is guarded.
    pub fn guards_any(&self, targets: &str) -> bool {
        targets.split(',').map(str::trim).any(|t| {
            if t.contains('*') || t == "_all" {
                !self.settings.indices.is_empty()
            } else {
                self.guards(t.trim_start_matches('-'))
            }
        })
    }

    /// The refusal of a guarded write without an accepted token, when tokens are required.
    pub fn not_admitted(&self, headers: &HeaderMap) -> Option<GateError> {
        let token = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok());
        (!self.tokens.admits_token(token)).then(|| {
            GateError::new(
                StatusCode::UNAUTHORIZED,
                "security_exception",
                "zkguard: guarded writes need a token of server.auth.tokens.file in the header X-Zkguard-Token (set it as a default header of the client)",
            )
        })
    }

    /// The places a `_bulk` holds while it is handled: one of `server.gateway.bulk.max.concurrent`,
    /// waited for as long as the request's lock wait (`X-Zkguard-Timeout`, else the foreground
    /// lock's), then one of `server.max.concurrent`.
    ///
    /// # Errors
    /// 429 `es_rejected_execution_exception` with `Retry-After` when either stays taken (what
    /// the clients and their bulk helpers retry): nothing was locked or written.
    pub async fn bulk_places(
        &self,
        headers: &HeaderMap,
    ) -> Result<[OwnedSemaphorePermit; 2], GateError> {
        let busy = |limit: usize, key: &str, what: &str| {
            GateError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "es_rejected_execution_exception",
                format!("zkguard: {limit} {what} are being handled ({key}); nothing was locked or written, send the request again shortly"),
            )
            .retry_after(1)
        };
        let asked = headers
            .get(TIMEOUT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|t| zkguard::config::parse_bounded_duration(t.trim()).ok());
        let wait = self.state.lock_wait(asked);
        let bulk = tokio::time::timeout(wait, self.bulks.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| {
                GateError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "es_rejected_execution_exception",
                    format!(
                        "zkguard: {} _bulk requests were being handled (server.gateway.bulk.max.concurrent) for all of this one's wait ({}ms); nothing was locked or written, send the request again shortly",
                        self.settings.bulk_max_concurrent,
                        wait.as_millis()
                    ),
                )
                .retry_after(1)
            })?;
        let request = self
            .state
            .permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                busy(
                    self.state.settings.max_concurrent,
                    "server.max.concurrent",
                    "requests",
                )
            })?;
        Ok([request, bulk])
    }

    /// Whether the service is shutting down.
    pub fn draining(&self) -> bool {
        self.state.draining.load(Ordering::Acquire)
    }
}
