//! The status page, `GET /ui`: which instance it is, the lock backend's state, the monitors
//! that have a holder or waiters (paged, filtered by name), the explicit locks this instance
//! holds (lease, expiry, `lock_id`), the journal, the dead letters and the recent events,
//! rendered on the server from the templates in `assets/ui/` (compiled into the binary,
//! HTML-escaped by the template engine). A small script (`assets/ui/ui.js`) refreshes the live
//! part (`GET /ui/status`) every second and runs the page's actions through the `/v1` API,
//! with the bearer token typed into the page in the `Authorization` header: replay a dead
//! letter, replay them all, discard one, clear a stray mutex, force-release an explicit lock
//! (all but replaying one and clearing a stray after a confirmation).
//!
//! The page reads without a token; the actions are `/v1` routes, so they need one when
//! `server.auth.tokens.file` is set. No cookie is used, so no other site can act for the
//! operator.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use minijinja::value::{Serde, Value};
use minijinja::{context, Environment, UndefinedBehavior};
use serde::Serialize;

use super::access::Tokens;
use super::errors::ApiError;
use super::state::{AppState, Backend};

/// Monitors on a page unless `per_page` says otherwise.
pub const PER_PAGE: usize = 50;
/// The most monitors on one page.
pub const MAX_PER_PAGE: usize = 500;
/// The longest monitor-name filter, in bytes.
const MAX_FILTER: usize = 200;
/// Dead letters shown (the oldest); the total is shown as well.
const DEAD_LETTERS_SHOWN: usize = 100;

const PAGE: &str = include_str!("../../assets/ui/page.html");
const STATUS: &str = include_str!("../../assets/ui/status.html");
const SCRIPT: &str = include_str!("../../assets/ui/ui.js");
const STYLE: &str = include_str!("../../assets/ui/ui.css");

/// Scripts, styles and requests from the service only; no frame, no inline script.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

fn templates() -> &'static Environment<'static> {
    static TEMPLATES: LazyLock<Environment<'static>> = LazyLock::new(|| {
        let mut env = Environment::new();
        // A name the view does not define is an error, not an empty string (the unit tests
        // render both templates).
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // `.html`: every value is HTML-escaped unless marked safe.
        for (name, source) in [("page.html", PAGE), ("status.html", STATUS)] {
            if let Err(e) = env.add_template(name, source) {
                tracing::error!(template = name, error = %e, "a status page template does not parse");
            }
        }
        env
    });
    &TEMPLATES
}

/// What the page was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Query {
    /// From 1.
    page: usize,
    per_page: usize,
    filter: String,
}

impl Query {
    fn parse(raw: Option<&str>) -> Result<Self, ApiError> {
        let mut q = Query {
            page: 1,
            per_page: PER_PAGE,
            filter: String::new(),
        };
        let raw = raw.unwrap_or_default();
        super::params::refuse_repeated(raw)?;
        let number = |key: &str, value: &str, max: usize| {
            value
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| {
                    ApiError::bad(
                        "bad_parameter",
                        format!("{key} `{value}`: give a whole number from 1 to {max}"),
                    )
                })
        };
        for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
            match key.as_ref() {
                "page" => q.page = number("page", &value, usize::MAX / MAX_PER_PAGE)?,
                "per_page" => q.per_page = number("per_page", &value, MAX_PER_PAGE)?,
                "filter" => {
                    if value.len() > MAX_FILTER {
                        return Err(ApiError::bad(
                            "bad_parameter",
                            format!("filter is longer than {MAX_FILTER} bytes; give part of a monitor name"),
                        ));
                    }
                    q.filter = value.trim().to_string();
                }
                other => {
                    return Err(ApiError::bad(
                        "bad_parameter",
                        format!("unknown query parameter `{other}`; the known ones are page, per_page, filter"),
                    ))
                }
            }
        }
        Ok(q)
    }

    /// The page's address (relative to the service's root) for page `page`.
    fn href(&self, page: usize) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        if !self.filter.is_empty() {
            query.append_pair("filter", &self.filter);
        }
        if self.per_page != PER_PAGE {
            query.append_pair("per_page", &self.per_page.to_string());
        }
        query.append_pair("page", &page.to_string());
        format!("ui?{}", query.finish())
    }
}

/// An age as people read it: `3.2 s`, `45 s`, `12 min 5 s`, `3 h 20 min`.
fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..10 => format!("{:.1} s", d.as_secs_f64()),
        10..120 => format!("{s} s"),
        120..7200 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

fn age_ms(ms: u64) -> String {
    age(Duration::from_millis(ms))
}

fn since_epoch_ms(at: u64) -> String {
    age_ms(super::hub::now_ms().saturating_sub(at))
}

#[derive(Debug, Serialize)]
struct HolderRow {
    owner: String,
    info: Option<String>,
    lock_type: String,
    age: String,
    node: Option<String>,
    /// The end of the holder's lease (the Elasticsearch lease lock, or an explicit lock of this
    /// instance), in UTC.
    expires: Option<String>,
    /// The explicit lock's id, when this instance holds the lock for a caller.
    lock_id: Option<String>,
}

#[derive(Debug, Serialize)]
struct WaiterRow {
    node: String,
    /// `foreground`, `background`, or the node's prefix for another class.
    class: String,
    label: String,
    owner: String,
    info: Option<String>,
    age: String,
}

#[derive(Debug, Serialize)]
struct MonitorRow {
    monitor: String,
    token: Option<u64>,
    holder: Option<HolderRow>,
    /// The queue without the holder, in lock order: foreground (`A-`) before background.
    waiters: Vec<WaiterRow>,
    /// Waiters counted but not listed (the Elasticsearch lease lock's foreground waiters).
    waiting: usize,
    stray: bool,
    stray_owner: String,
}

fn class_of(prefix: &str) -> (String, String) {
    match prefix {
        "A" => ("foreground".into(), "foreground (A-)".into()),
        "B" => ("background".into(), "background (B-)".into()),
        other => (other.to_string(), format!("class {other}-")),
    }
}

fn zk_row(m: zkguard::zk::MonitorState) -> MonitorRow {
    let unknown = || "owner unknown".to_string();
    let holder = m.holder.as_ref().map(|h| HolderRow {
        owner: h.owner.clone().unwrap_or_else(unknown),
        info: h.info.clone(),
        lock_type: h.lock_type.clone().unwrap_or_else(|| class_of(&h.class).0),
        age: age_ms(h.age_ms),
        node: Some(h.node.clone()),
        expires: None,
        lock_id: None,
    });
    let waiters = m
        .queue
        .into_iter()
        .filter(|c| !c.holder)
        .map(|c| {
            let (class, label) = class_of(&c.class);
            WaiterRow {
                node: c.node,
                class,
                label,
                owner: c.owner.unwrap_or_else(unknown),
                info: c.info,
                age: age_ms(c.age_ms),
            }
        })
        .collect();
    MonitorRow {
        monitor: m.monitor,
        token: m.token,
        holder,
        waiters,
        waiting: 0,
        stray: m.stray,
        stray_owner: match m.stray_session.as_deref() {
            None | Some("0x0") => "persistent, not a zkguard holder's".to_string(),
            Some(sid) => format!("ephemeral of session {sid}, which holds no queue node"),
        },
    }
}

fn es_row(row: &serde_json::Value) -> MonitorRow {
    let text = |k: &str| row[k].as_str().map(str::to_string);
    let held = row["state"] == "held" && row["takeable"] != true;
    MonitorRow {
        monitor: text("monitor").unwrap_or_default(),
        token: row["token"].as_u64().filter(|_| held),
        holder: held.then(|| HolderRow {
            owner: text("owner").unwrap_or_else(|| "owner unknown".into()),
            info: text("info"),
            lock_type: text("lock_type").unwrap_or_default(),
            age: since_epoch_ms(row["acquired_ms"].as_u64().unwrap_or(0)),
            node: None,
            expires: row["expires_ms"].as_u64().map(utc),
            lock_id: None,
        }),
        waiters: Vec::new(),
        waiting: row["foreground_waiters"].as_u64().unwrap_or(0) as usize,
        stray: false,
        stray_owner: String::new(),
    }
}

/// One page of monitors: the rows, how many match in all, and (ZooKeeper) how many have a
/// mutex and how many queue nodes they hold.
struct Listed {
    rows: Vec<MonitorRow>,
    total: usize,
    held: Option<usize>,
    queued: usize,
}

#[tracing::instrument(name = "ui_monitors", skip(state))]
async fn monitors(state: &AppState, q: &Query) -> Result<Listed, zkguard::LockError> {
    let offset = (q.page - 1) * q.per_page;
    match &state.backend {
        Backend::ZooKeeper(session) => {
            let page = zkguard::zk::list_locks_page(session, &q.filter, offset, q.per_page).await?;
            Ok(Listed {
                rows: page.monitors.into_iter().map(zk_row).collect(),
                total: page.total,
                held: Some(page.held),
                queued: page.queued,
            })
        }
        Backend::Elasticsearch(service) => {
            let mut held: Vec<_> = service
                .list()
                .await?
                .into_iter()
                .filter(|s| {
                    s.record.monitor.contains(q.filter.as_str())
                        && s.record.state == zkguard::eslock::LockState::Held
                        && !s.takeable
                })
                .collect();
            held.sort_by(|a, b| a.record.monitor.cmp(&b.record.monitor));
            let mut rows = Vec::new();
            for s in held.iter().skip(offset).take(q.per_page) {
                rows.push(es_row(&crate::lock_rows::es_row(service, s).await?));
            }
            Ok(Listed {
                rows,
                total: held.len(),
                held: None,
                queued: 0,
            })
        }
    }
}

#[derive(Debug, Serialize)]
struct LetterRow {
    id: String,
    /// The caller's idempotency key, shown beside the id.
    key: Option<String>,
    summary: String,
    monitor: String,
    reason: String,
    error_kind: String,
    last_error: String,
    attempts: u32,
    age: String,
}

/// An explicit lock this instance holds for a caller.
#[derive(Debug, Serialize)]
struct ExplicitRow {
    lock_id: String,
    monitor: String,
    token: u64,
    lock_type: String,
    info: String,
    /// The lease each keep-alive renews.
    lease: String,
    /// The lease's end, in UTC.
    expires: String,
    /// How long until then.
    expires_in: String,
}

fn explicit_rows(state: &AppState) -> Vec<ExplicitRow> {
    let now = super::hub::now_ms();
    state
        .explicit
        .list()
        .into_iter()
        .map(|l| ExplicitRow {
            expires: utc(l.expires),
            expires_in: age_ms(l.expires.saturating_sub(now)),
            lease: age_ms(l.ttl_ms),
            lock_id: l.lock_id,
            monitor: l.monitor,
            token: l.token,
            lock_type: l.lock_type.as_str().to_string(),
            info: l.info,
        })
        .collect()
}

/// Names, on the holders that are explicit locks of this instance (same monitor and token),
/// their `lock_id` and the end of their lease.
fn mark_explicit(state: &AppState, rows: &mut [MonitorRow]) {
    let held = state.explicit.list();
    if held.is_empty() {
        return;
    }
    for row in rows {
        let Some(holder) = row.holder.as_mut() else {
            continue;
        };
        if let Some(l) = held
            .iter()
            .find(|l| l.monitor == row.monitor && Some(l.token) == row.token)
        {
            holder.lock_id = Some(l.lock_id.clone());
            holder.expires = Some(utc(l.expires));
        }
    }
}

/// Milliseconds since the Unix epoch as `2026-11-28 12:00:00 UTC`.
fn utc(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64).map_or_else(String::new, |t| {
        t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
    })
}

/// Which instance serves the page: its host, address, owner id (written into the lock nodes
/// or lease documents it creates), process and version.
fn instance(state: &AppState) -> Value {
    let host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    let id = match &state.backend {
        Backend::ZooKeeper(s) => s.owner_id().to_string(),
        Backend::Elasticsearch(s) => s.owner_prefix().to_string(),
    };
    context! {
        host,
        listen => state.ui.listening().unwrap_or("not bound yet"),
        id,
        pid => std::process::id(),
        version => env!("CARGO_PKG_VERSION"),
    }
}

/// One row of the journal partitions table (the Kafka journal only).
#[derive(Debug, Serialize)]
struct PartitionRow {
    partition: i32,
    owner: Option<String>,
    here: bool,
    committed: i64,
    end: i64,
    lag: i64,
    oldest: Option<String>,
}

fn partition_rows(views: Vec<super::journal::kafka::PartitionStatus>) -> Vec<PartitionRow> {
    views
        .into_iter()
        .map(|p| PartitionRow {
            partition: p.partition,
            owner: p.owner,
            here: p.owned_here,
            committed: p.committed_offset,
            end: p.end_offset,
            lag: p.lag,
            oldest: p.oldest_unapplied_age.map(age),
        })
        .collect()
}

#[derive(Debug, Serialize)]
struct EventRow {
    #[serde(flatten)]
    event: super::hub::Recent,
    ago: String,
}

/// The live part of the page, rendered.
async fn status_html(state: &AppState, q: &Query) -> Result<String, ApiError> {
    let (kind, connected) = match &state.backend {
        Backend::ZooKeeper(s) => ("ZooKeeper", s.is_connected()),
        Backend::Elasticsearch(_) => ("Elasticsearch lease lock", state.lock_problem().is_none()),
    };
    let (mut listed, listing_error) = match monitors(state, q).await {
        Ok(listed) => (listed, None),
        Err(e) => {
            tracing::debug!(error = %e, "the status page cannot list the locks");
            let empty = Listed {
                rows: Vec::new(),
                total: 0,
                held: None,
                queued: 0,
            };
            (
                empty,
                Some("The locks cannot be read now (the lock backend does not answer); the page retries every second."),
            )
        }
    };
    mark_explicit(state, &mut listed.rows);
    let pages = listed.total.div_ceil(q.per_page).max(1);
    let first = (q.page - 1) * q.per_page + 1;
    let letters = state.ui.deadletters(state.executor.sink().as_ref()).await;
    let (deadletters, deadletters_total, deadletters_error) = match &*letters {
        Ok(all) => (
            all.iter()
                .take(DEAD_LETTERS_SHOWN)
                .map(|d| LetterRow {
                    id: d.id.to_string(),
                    key: d.operation.key.clone(),
                    summary: d.operation.summary(),
                    monitor: d.monitor.clone(),
                    reason: d.reason.to_string(),
                    error_kind: d.error_kind.clone(),
                    last_error: d.last_error.clone(),
                    attempts: d.attempts,
                    age: age(d.parked_at.elapsed().unwrap_or_default()),
                })
                .collect(),
            all.len(),
            None,
        ),
        Err(e) => {
            tracing::debug!(error = %e, "the status page cannot list the dead letters");
            (
                Vec::new(),
                0,
                Some("The dead letters cannot be read now (the dead-letter sink does not answer)."),
            )
        }
    };
    let events: Vec<EventRow> = state
        .events
        .recent()
        .into_iter()
        .map(|event| EventRow {
            ago: since_epoch_ms(event.at),
            event,
        })
        .collect();
    let journal = &state.journal;
    let view = context! {
        instance => instance(state),
        backend => context! { kind, connected },
        es_ok => state.es_problem().is_none(),
        journal => context! {
            depth => journal.depth(),
            oldest => journal.oldest_queued().map(age),
            bytes => bytes(journal.queued_bytes()),
            problem => journal.problem().is_some(),
        },
        explicit => state.explicit.len(),
        explicit_locks => Serde(explicit_rows(state)),
        partitions => Serde(partition_rows(state.partition_views())),
        generated => chrono::Utc::now().format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        filter => &q.filter,
        total => listed.total,
        held => listed.held,
        queued => listed.queued,
        page => q.page,
        pages,
        first,
        last => (first + listed.rows.len()).saturating_sub(1),
        prev_href => (q.page > 1).then(|| q.href((q.page - 1).min(pages))),
        next_href => (q.page < pages).then(|| q.href(q.page + 1)),
        monitors => Serde(&listed.rows),
        listing_error,
        deadletters => Serde(&deadletters),
        deadletters_total,
        deadletters_error,
        events => Serde(&events),
    };
    render("status.html", view)
}

fn bytes(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

fn render(name: &str, view: Value) -> Result<String, ApiError> {
    templates()
        .get_template(name)
        .and_then(|t| t.render(view))
        .map_err(|e| {
            tracing::error!(template = name, error = %e, "cannot render the status page");
            ApiError::internal(format!("cannot render the status page: {e}"))
        })
}

/// An HTML answer that no one caches, with the page's content policy.
fn html(body: String) -> Response {
    with_headers(body, "text/html; charset=utf-8", "no-store")
}

fn with_headers(
    body: impl IntoResponse,
    content_type: &'static str,
    cache: &'static str,
) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// `GET /ui[?page=N&per_page=N&filter=TEXT]`: the status page.
pub async fn page(
    State(state): State<Arc<AppState>>,
    axum::Extension(tokens): axum::Extension<Arc<Tokens>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(query.as_deref())?;
    let status = status_html(&state, &q).await?;
    let view = context! {
        filter => &q.filter,
        per_page => q.per_page,
        max_per_page => MAX_PER_PAGE,
        auth => tokens.enabled(),
        status => Value::from_safe_string(status),
    };
    Ok(html(render("page.html", view)?))
}

/// `GET /ui/status[?page=N&per_page=N&filter=TEXT]`: the live part of the page, which the
/// page's script fetches every second.
pub async fn status(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(query.as_deref())?;
    Ok(html(status_html(&state, &q).await?))
}

/// `GET /ui/ui.js`: the page's script.
pub async fn script() -> Response {
    with_headers(SCRIPT, "text/javascript; charset=utf-8", "no-cache")
}

/// `GET /ui/ui.css`: the page's style.
pub async fn style() -> Response {
    with_headers(STYLE, "text/css; charset=utf-8", "no-cache")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_checked_and_links_keep_the_filter() {
        let q = Query::parse(Some("filter=a%26b%20c&per_page=20&page=3")).unwrap();
        assert_eq!(
            q,
            Query {
                page: 3,
                per_page: 20,
                filter: "a&b c".into()
            }
        );
        assert_eq!(q.href(4), "ui?filter=a%26b+c&per_page=20&page=4");
        assert_eq!(Query::parse(None).unwrap().per_page, PER_PAGE);
        for bad in [
            "page=0",
            "per_page=501",
            "page=x",
            "sort=name",
            "page=1&page=2",
        ] {
            assert!(Query::parse(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(age(Duration::from_millis(3250)), "3.2 s");
        assert_eq!(age(Duration::from_secs(45)), "45 s");
        assert_eq!(age(Duration::from_secs(725)), "12 min 5 s");
        assert_eq!(age(Duration::from_secs(12_000)), "3 h 20 min");
    }

    /// Both templates render with every value they use, and what users wrote (monitor names,
    /// owners, infos, reasons) comes out escaped.
    #[test]
    fn the_templates_render_and_escape_user_input() {
        let evil = "<script>alert('x')</script>\"&";
        let row = MonitorRow {
            monitor: evil.into(),
            token: Some(7),
            holder: Some(HolderRow {
                owner: evil.into(),
                info: Some(evil.into()),
                lock_type: "foreground".into(),
                age: "1.0 s".into(),
                node: Some("A-0000000001".into()),
                expires: Some("2026-11-28 12:00:00 UTC".into()),
                lock_id: Some("5b1c".into()),
            }),
            waiters: vec![WaiterRow {
                node: "B-0000000002".into(),
                class: "background".into(),
                label: "background (B-)".into(),
                owner: evil.into(),
                info: None,
                age: "0.5 s".into(),
            }],
            waiting: 0,
            stray: true,
            stray_owner: "persistent".into(),
        };
        let letter = LetterRow {
            id: "0b0e".into(),
            key: Some("order-42-save-3".into()),
            summary: evil.into(),
            monitor: evil.into(),
            reason: evil.into(),
            error_kind: "fenced".into(),
            last_error: evil.into(),
            attempts: 3,
            age: "2 s".into(),
        };
        let view = context! {
            backend => context! { kind => "ZooKeeper", connected => true },
            es_ok => false,
            journal => context! { depth => 2, oldest => Some("3.0 s"), bytes => "1 B", problem => false },
            explicit => 1,
            partitions => Serde(partition_rows(vec![super::super::journal::kafka::PartitionStatus {
                partition: 3,
                owner: Some(evil.into()),
                owned_here: true,
                lag: 2,
                oldest_unapplied_age: Some(Duration::from_secs(4)),
                ..Default::default()
            }])),
            explicit_locks => Serde(vec![ExplicitRow {
                lock_id: "5b1c".into(),
                monitor: evil.into(),
                token: 9,
                lock_type: "foreground".into(),
                info: evil.into(),
                lease: "30 s".into(),
                expires: "2026-11-28 12:00:00 UTC".into(),
                expires_in: "29 s".into(),
            }]),
            instance => context! { host => evil, listen => "127.0.0.1:7717", id => evil, pid => 1, version => "0" },
            generated => "now",
            filter => evil,
            total => 1, held => Some(1), queued => 2, page => 1, pages => 1, first => 1, last => 1,
            prev_href => None::<String>, next_href => Some("ui?page=2"),
            monitors => Serde(vec![row]),
            listing_error => None::<String>,
            deadletters => Serde(vec![letter]),
            deadletters_total => 1,
            deadletters_error => None::<String>,
            events => Serde(vec![EventRow {
                event: super::super::hub::Recent {
                    at: 0,
                    kind: "parked",
                    monitor: evil.into(),
                    lock_type: zkguard::LockType::Background,
                    token: None,
                    document: Some(evil.into()),
                    reason: Some(evil.into()),
                },
                ago: "1 s".into(),
            }]),
        };
        let status = render("status.html", view).unwrap();
        assert!(!status.contains("<script>"), "{status}");
        assert!(status.contains("&lt;script&gt;"), "{status}");
        assert!(
            status.contains(r#"data-action="replay" data-id="0b0e""#),
            "{status}"
        );
        assert!(
            status.contains("key <code>order-42-save-3</code>"),
            "the caller's key beside the id: {status}"
        );
        assert!(status.contains(r#"data-action="clear-stray""#), "{status}");
        assert!(
            status.contains(r#"<tr class="partition here" data-partition="3">"#)
                && status.contains("(this instance)")
                && status.contains("4.0 s"),
            "the journal partitions table: {status}"
        );
        for action in [
            r#"data-action="discard" data-id="0b0e""#,
            r#"data-action="replay-all""#,
            r#"data-action="force-release""#,
            r#"data-lock-id="5b1c""#,
        ] {
            assert!(status.contains(action), "{action}: {status}");
        }
        let page = render(
            "page.html",
            context! {
                filter => evil, per_page => 50, max_per_page => 500, auth => true,
                status => Value::from_safe_string(status),
            },
        )
        .unwrap();
        assert_eq!(page.matches("<script").count(), 1, "{page}");
        assert!(page.contains(r#"id="token""#), "{page}");
    }
}
