//! The status page of `zkguard serve` (`GET /ui`): in a real browser (headless Chromium driven
//! by Selenium, `tests/support/ui/status_page.py`) it shows a held lock's holder and its queue
//! in lock order, follows the lock as it passes on, replays a dead letter (refused without the
//! bearer token, done with it) and clears a stray mutex; and with 10,000 busy monitors it
//! answers the asked page, filtered, with the right counts.

use crate::common;
use crate::serve_support;

use std::process::Stdio;
use std::time::Duration;

use crate::queue::queued;
use common::*;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use zkguard::{LockRequest, LockService, LockType, ZkLockService};
use zookeeper_client::CreateMode;

const TOKEN: &str = "status-page-token-5c1e0a77";

fn authorized() -> Client {
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
    );
    Client::builder().default_headers(headers).build().unwrap()
}

/// A service that needs a bearer token, parks a background write after one attempt, and waits
/// at most 300 ms for a background lock.
fn start(tag: &str) -> (Env, Service) {
    start_with(tag, &[])
}

/// As [`start`], with more settings (`extra`, as environment variables).
fn start_with(tag: &str, extra: &[(&str, &str)]) -> (Env, Service) {
    let mut env = Env::new(&shared_zk().connect_string(), tag);
    for (key, value) in extra {
        env = env.with(key, value);
    }
    let tokens = env.dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    let env = env
        .with("ZKGUARD_SERVER_AUTH_TOKENS_FILE", tokens.to_str().unwrap())
        .with("ZKGUARD_ELASTIC_REQUEST_RETRY_COUNT", "1")
        .with("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT", "300");
    let s = env.start(tag);
    (env, s)
}

/// A raw ZooKeeper client, with `path` and its parents created.
async fn zk_with(env: &Env, path: &str) -> zookeeper_client::Client {
    let zk = zookeeper_client::Client::connect(&env.zk).await.unwrap();
    let persistent = CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let mut at = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at = format!("{at}/{part}");
        match zk.create(&at, b"", &persistent).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => panic!("create {at}: {e}"),
        }
    }
    zk
}

/// A lock service of the test's own (another writer's session).
async fn lock_service(env: &Env) -> ZkLockService {
    let mut settings = zk_settings(&env.zk, "waiter");
    settings.lock_root = env.root.clone();
    ZkLockService::new(session(&settings).await)
}

/// Waits for the lock of `monitor` and holds it until `release` is sent (or dropped).
fn hold_when_acquired(
    service: &ZkLockService,
    monitor: &str,
    lock_type: LockType,
    info: &str,
) -> tokio::sync::oneshot::Sender<()> {
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let request = LockRequest::new(monitor, info)
        .with_type(lock_type)
        .with_timeout(Duration::from_secs(60));
    let service = service.clone();
    tokio::spawn(async move {
        let guard = service
            .acquire(request)
            .await
            .expect("the waiter gets the lock");
        let _ = released.await;
        guard.unlock().await.unwrap();
    });
    release
}

/// Waits until the queue of `monitor` holds `n` nodes of class `prefix` (`A-` or `B-`).
async fn queue_has(env: &Env, monitor: &str, prefix: &str, n: usize) {
    let path = format!("{}/{monitor}", env.root);
    eventually(Duration::from_secs(10), "the waiter queued", || async {
        queued(&env.zk, &path, prefix).await == n
    })
    .await;
}

/// A dead letter: a background write whose lock stays taken (one attempt, 300 ms) is parked.
async fn park(env: &Env, s: &Service, index: &str) -> String {
    let c = authorized();
    let (holder, guard) = hold_lock(env, &format!("{index}:letter")).await;
    let (status, v) = call(
        &c,
        Method::PUT,
        &s.url(&format!("/v1/indices/{index}/docs/letter?type=background")),
        Some(json!({"title": "parked, then replayed from the status page"}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["operation_id"].as_str().unwrap().to_string();
    let done = wait_finished(&c, s, std::slice::from_ref(&id)).await;
    assert_eq!(done[&id]["status"], "parked", "{:?}", done[&id]);
    guard.unlock().await.unwrap();
    drop(holder);
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_follows_the_lock_and_replays_a_dead_letter_in_a_browser() {
    let (env, s) = start("ui");
    let tag = uuid_tag();
    let index = format!("ui-{tag}");
    let letter = park(&env, &s, &index).await;

    // A monitor whose name is markup: the page must show it as text.
    let monitor = format!("<b>orders&\"{tag}");
    let (holder, guard) = hold_lock(&env, &monitor).await;
    let waiters = lock_service(&env).await;
    // The background waiter queues first; the foreground one still goes before it.
    let release_bg = hold_when_acquired(&waiters, &monitor, LockType::Background, "bg waiter");
    queue_has(&env, &monitor, "B-", 1).await;
    let release_fg = hold_when_acquired(&waiters, &monitor, LockType::Foreground, "fg waiter");
    queue_has(&env, &monitor, "A-", 2).await;

    // A stray mutex: a persistent privateLock nobody holds.
    let stray = format!("stray-{tag}");
    let _zk = zk_with(&env, &format!("{}/{stray}/privateLock", env.root)).await;

    // The page is read without a token; the API is not.
    let anonymous = client();
    let page = anonymous.get(s.url("/ui")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let policy = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("script-src 'self'"), "{policy}");
    let (status, _) = call(&anonymous, Method::GET, &s.url("/v1/locks"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let scenario = json!({
        "monitor": monitor,
        "deadletter": letter,
        "stray": stray,
        "token": TOKEN,
    });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/ui/status_page.py"
    );
    let mut browser = tokio::process::Command::new("python3")
        .arg(script)
        .arg(&s.base)
        .arg(scenario.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 with selenium (scripts/install-deps.sh)");
    let mut steps = BufReader::new(browser.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let mut release_fg = Some(release_fg);
    let mut guard = Some(guard);
    let drive = async {
        while let Some(line) = steps.next_line().await.unwrap() {
            let step = line.strip_prefix("step ").unwrap_or(&line).to_string();
            match step.as_str() {
                // The browser showed the holder and the queue: the lock passes on.
                "shown" => {
                    if let Some(guard) = guard.take() {
                        guard.unlock().await.unwrap();
                    }
                }
                // The foreground waiter holds it now: let it go, and the background one after.
                "passed" => drop(release_fg.take()),
                _ => {}
            }
            seen.push(step);
        }
        browser.wait_with_output().await.unwrap()
    };
    let out = tokio::time::timeout(Duration::from_secs(90), drive)
        .await
        .expect("the browser scenario ends within 90 s");
    assert!(
        out.status.success(),
        "the browser scenario failed after steps {seen:?}:\n{}\nservice log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    assert_eq!(seen, ["shown", "passed", "refused", "replayed", "cleared"]);
    drop(release_bg);
    drop(holder);

    // The replayed write is in its document; the dead letters are empty; the stray is gone.
    let c = authorized();
    let doc = es_doc(&c, &index, "letter").await;
    assert_eq!(
        doc["_source"]["title"], "parked, then replayed from the status page",
        "{doc}"
    );
    let (_, letters) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(letters, json!([]));
    assert_eq!(op_status(&c, &s, &letter).await["status"], "applied");
    let path = format!("{}/{stray}", env.root);
    assert!(children(&env.zk, &path).await.is_empty());
}

/// The text of the element with `id` in `html` (the status page marks its counts with ids).
fn by_id(html: &str, id: &str) -> Option<String> {
    let start = html.find(&format!(r#"id="{id}">"#))? + id.len() + 6;
    let end = html[start..].find('<')?;
    Some(html[start..start + end].to_string())
}

fn shown_monitors(html: &str) -> Vec<String> {
    html.split(r#"<article class="monitor"#)
        .skip(1)
        .filter_map(|a| {
            let start = a.find(r#"data-monitor=""#)? + 14;
            let end = a[start..].find('"')?;
            Some(a[start..start + end].to_string())
        })
        .collect()
}

/// 10,000 monitors with a holder or a waiter (queue nodes made directly in ZooKeeper, in bulk),
/// and idle ones: the page counts the busy ones, shows the asked page of them in name order,
/// filters by name, and reads only what it shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_monitors_are_paged_filtered_and_counted() {
    let (env, s) = start("ui-bulk");
    let zk = zk_with(&env, &env.root).await;
    let persistent = CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let ephemeral = CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    let holder = json!({
        "owner": "bulk:1:holder", "info": "bulk holder", "attempt": "bulk-attempt", "host": "bulk",
        "pid": 1, "type": "foreground", "created_ms": 0,
    });
    // Even monitors are held (a queue node and the mutex of one live session), odd ones have a
    // background waiter only; 20 more are idle (no child).
    const N: usize = 10_000;
    for batch in (0..N).collect::<Vec<_>>().chunks(500) {
        let mut multi = zk.new_multi_writer();
        for &i in batch {
            let m = format!("{}/bulk-{i:05}", env.root);
            multi.add_create(&m, b"", &persistent).unwrap();
            if i % 2 == 0 {
                let data = holder.to_string();
                multi
                    .add_create(&format!("{m}/A-0000000000"), data.as_bytes(), &ephemeral)
                    .unwrap();
                multi
                    .add_create(&format!("{m}/privateLock"), data.as_bytes(), &ephemeral)
                    .unwrap();
            } else {
                multi
                    .add_create(&format!("{m}/B-0000000000"), b"", &ephemeral)
                    .unwrap();
            }
        }
        multi.commit().await.unwrap();
    }
    for i in 0..20 {
        zk.create(&format!("{}/bulk-idle-{i:02}", env.root), b"", &persistent)
            .await
            .unwrap();
    }

    let c = client();
    let get = |query: &'static str| {
        let c = c.clone();
        let url = s.url(&format!("/ui/status?{query}"));
        async move {
            let resp = c.get(url).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            resp.text().await.unwrap()
        }
    };

    // Page 7 of 100 (100 a page): monitors 600 to 699, in name order.
    let asked = std::time::Instant::now();
    let html = get("filter=bulk-&per_page=100&page=7").await;
    eprintln!("a page of 10,000 busy monitors: {:?}", asked.elapsed());
    assert_eq!(by_id(&html, "total").as_deref(), Some("10000"), "{html}");
    assert_eq!(by_id(&html, "page").as_deref(), Some("7"));
    assert_eq!(by_id(&html, "pages").as_deref(), Some("100"));
    assert_eq!(by_id(&html, "first").as_deref(), Some("601"));
    assert_eq!(by_id(&html, "last").as_deref(), Some("700"));
    let expected: Vec<String> = (600..700).map(|i| format!("bulk-{i:05}")).collect();
    assert_eq!(shown_monitors(&html), expected);
    assert!(
        html.contains("5000 with a mutex, 10000 queue nodes"),
        "{html}"
    );
    // The held ones show their holder and token, the others their waiter.
    assert_eq!(html.matches("bulk:1:holder").count(), 50);
    assert_eq!(html.matches(r#"class="waiter background""#).count(), 50);
    assert_eq!(html.matches(r#"class="token">token "#).count(), 50);
    assert!(html.contains(r#"href="ui?filter=bulk-&amp;per_page=100&amp;page=8""#));

    // The default page size is 50; a filter narrows the count.
    let html = get("").await;
    assert_eq!(by_id(&html, "total").as_deref(), Some("10000"));
    assert_eq!(shown_monitors(&html).len(), 50);
    assert_eq!(shown_monitors(&html)[0], "bulk-00000");
    let html = get("filter=bulk-0042").await;
    assert_eq!(by_id(&html, "total").as_deref(), Some("10"));
    let expected: Vec<String> = (420..430).map(|i| format!("bulk-{i:05}")).collect();
    assert_eq!(shown_monitors(&html), expected);
    let html = get("filter=idle").await;
    assert_eq!(by_id(&html, "total").as_deref(), Some("0"));

    // Beyond the last page: nothing shown, the count still right.
    let html = get("per_page=500&page=21").await;
    assert_eq!(by_id(&html, "total").as_deref(), Some("10000"));
    assert!(shown_monitors(&html).is_empty());
    assert!(html.contains(r#"id="no-monitors""#));
    assert_eq!(by_id(&html, "pages").as_deref(), Some("20"));

    // The whole page (the script's first load) answers the same, without a token.
    let page = c
        .get(s.url("/ui?filter=bulk-0042"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(shown_monitors(&page).len(), 10);
    assert!(page.contains(r#"<script src="ui/ui.js"></script>"#));

    // Bad paging is refused with what to send.
    let (status, v) = call(&c, Method::GET, &s.url("/ui?per_page=0"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["message"].as_str().unwrap().contains("per_page"), "{v}");

    // Clearing a stray needs the token; a live holder's mutex is never touched.
    let url = s.url("/v1/locks/bulk-00000/clear-stray");
    let (status, _) = call(&c, Method::POST, &url, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, v) = call(&authorized(), Method::POST, &url, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"], "live_holder", "{v}");
    let (status, v): (StatusCode, Value) = call(
        &authorized(),
        Method::POST,
        &s.url("/v1/locks/bulk-idle-00/clear-stray"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["outcome"], "no_mutex", "{v}");

    // Turned off, there is no page.
    let off = env
        .clone()
        .with("ZKGUARD_SERVER_UI_ENABLED", "false")
        .start("ui-off");
    for path in ["/ui", "/ui/status", "/ui/ui.js"] {
        let (status, v) = call(&c, Method::GET, &off.url(path), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {v}");
    }
}

/// With the Elasticsearch lease lock, the page shows the held leases: an explicit lock's holder,
/// lock type and token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_elasticsearch_leases() {
    let env = Env::new(&shared_zk().connect_string(), "ui-es")
        .with("ZKGUARD_LOCK_BACKEND", "elasticsearch")
        .with(
            "ZKGUARD_ELASTICSEARCH_LOCK_INDEX",
            &format!("ui-locks-{}", uuid_tag()),
        );
    let s = env.start("ui-es");
    let c = client();
    let monitor = format!("lease-{}", uuid_tag());
    let (status, lock) = call(
        &c,
        Method::POST,
        &s.url(&format!(
            "/v1/locks/{monitor}?type=background&info=nightly%20reindex"
        )),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    let html = c
        .get(s.url(&format!("/ui/status?filter={monitor}")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("Elasticsearch lease lock"), "{html}");
    assert_eq!(by_id(&html, "total").as_deref(), Some("1"), "{html}");
    assert_eq!(shown_monitors(&html), [monitor]);
    assert!(html.contains("nightly reindex"), "{html}");
    assert!(html.contains(r#"class="kind">background<"#), "{html}");
    assert!(html.contains(&format!("token {}", lock["token"])), "{html}");
    // The lease's end, and the explicit lock's id.
    assert!(
        html.contains("lease until <span class=\"expires\">"),
        "{html}"
    );
    let lock_id = lock["lock_id"].as_str().unwrap();
    assert!(
        html.contains(&format!(r#"<code class="lock-id">{lock_id}</code>"#)),
        "{html}"
    );
    // The acquisition is among the recent events.
    assert!(html.contains(r#"<tr class="event acquired">"#), "{html}");
}

/// Runs the browser script in `mode` against `s` with `scenario` (the token added) and returns
/// the steps it printed; fails the test, with the script's errors and the service's log, when
/// the script fails.
async fn browse(s: &Service, mut scenario: Value) -> Vec<String> {
    scenario["token"] = json!(TOKEN);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/ui/status_page.py"
    );
    let run = tokio::process::Command::new("python3")
        .arg(script)
        .arg(&s.base)
        .arg(scenario.to_string())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the browser scenario ends within 120 s")
        .expect("python3 with selenium (scripts/install-deps.sh)");
    let steps: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("step ").map(str::to_string))
        .collect();
    assert!(
        out.status.success(),
        "the browser scenario {scenario} failed after steps {steps:?}:\n{}\nservice log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    steps
}

/// A ZooKeeper session of 30 s for a service whose explicit lock must outlast the test's
/// steps: with the tests' default of 2 s (and a loss grace of 1 s, which follows from it), a
/// ZooKeeper that stalls for a second on a busy machine (another test of this binary writes
/// 10,000 monitors to it) loses the lock; 5 s stalls were seen with a 10 s session.
const PATIENT: &[(&str, &str)] = &[("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "30000")];

/// Takes the explicit lock of document `index`/`id` for 4 minutes; answers its `lock_id` and
/// `token`.
async fn take_doc_lock(s: &Service, index: &str, id: &str) -> (String, u64) {
    let (status, lock) = call(
        &authorized(),
        Method::POST,
        &s.url(&format!(
            "/v1/locks?index={index}&id={id}&ttl=4m&info=nightly%20reindex"
        )),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    (
        lock["lock_id"].as_str().unwrap().to_string(),
        lock["token"].as_u64().unwrap(),
    )
}

/// The operator's actions on the status page, in a browser: the page says which instance it is
/// and shows an explicit lock's `lock_id`, lease and expiry; *Discard* and *Replay all* act on
/// the dead letters and *Force release* releases the lock, each only once confirmed (a
/// dismissed confirmation does nothing); the holder's next write under the lock is refused and
/// the log names who released it, when and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_discard_replay_all_and_force_release_from_the_page_in_a_browser() {
    let (env, s) = start_with("ui-ops", PATIENT);
    let tag = uuid_tag();
    let discarded = park(&env, &s, &format!("ui-ops-a-{tag}")).await;
    let replayed = [
        park(&env, &s, &format!("ui-ops-b-{tag}")).await,
        park(&env, &s, &format!("ui-ops-c-{tag}")).await,
    ];
    let index = format!("ui-ops-lock-{tag}");
    let (lock_id, _) = take_doc_lock(&s, &index, "7").await;
    let listen = s.base.trim_start_matches("http://").to_string();

    let steps = browse(
        &s,
        json!({
            "mode": "actions",
            "listen": listen,
            "lock_id": lock_id,
            "lock_monitor": format!("{index}:7"),
            "discard": discarded,
            "replay": replayed,
            "reason": "stuck nightly job",
        }),
    )
    .await;
    assert_eq!(
        steps,
        ["shown", "kept", "discarded", "replayed-all", "forced"]
    );

    // The discarded one is rejected, the others applied; no dead letter is left.
    let c = authorized();
    assert_eq!(op_status(&c, &s, &discarded).await["status"], "rejected");
    for id in &replayed {
        assert_eq!(op_status(&c, &s, id).await["status"], "applied");
    }
    let (_, letters) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(letters, json!([]));

    // The holder's next write under the lock is refused, naming the force release.
    let (status, v) = call(
        &c,
        Method::PUT,
        &s.url(&format!("/v1/indices/{index}/docs/7?lock_id={lock_id}")),
        Some(json!({"title": "late"}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains("force-released") && message.contains("stuck nightly job"),
        "{v}"
    );
    let log = s.log();
    let line = log
        .lines()
        .find(|l| l.contains("force-released") && l.contains(&lock_id))
        .unwrap_or_else(|| panic!("no force release of {lock_id} in the log:\n{log}"));
    for part in ["stuck nightly job", "127.0.0.1", "token 1"] {
        assert!(line.contains(part), "{part} missing from {line}");
    }
}

/// Force release over HTTP: the token is needed, the lock must be named exactly, and once
/// released the holder's keep-alive, write and release are refused naming the force release,
/// while the next holder gets a greater token, so that the old holder's own write to
/// Elasticsearch with its old token is fenced out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_lock_fences_its_holder() {
    let (_env, s) = start_with("ui-force", PATIENT);
    let index = format!("ui-force-{}", uuid_tag());
    let monitor = format!("{index}:1");
    let c = authorized();
    let (lock_id, token) = take_doc_lock(&s, &index, "1").await;
    let under = |id: &str| s.url(&format!("/v1/indices/{index}/docs/1?lock_id={id}"));
    let (status, v) = call(
        &c,
        Method::PUT,
        &under(&lock_id),
        Some(json!({"n": 1}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    let force = |m: &str, id: &str| {
        s.url(&format!(
            "/v1/locks/{}/{id}/force-release?reason=holder%20hung",
            encoded(m)
        ))
    };
    let (status, _) = call(&client(), Method::POST, &force(&monitor, &lock_id), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, v) = call(&c, Method::POST, &force("other", &lock_id), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"], "unknown_lock", "{v}");
    let (status, v) = call(&c, Method::POST, &force(&monitor, &lock_id), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"lock_id": lock_id, "monitor": monitor, "token": token, "released": true,
               "forced": true, "reason": "holder hung"})
    );

    // The holder learns why, on every call with the lock.
    let keepalive = s.url(&format!(
        "/v1/locks/{}/{lock_id}/keepalive",
        encoded(&monitor)
    ));
    let release = s.url(&format!("/v1/locks/{}/{lock_id}", encoded(&monitor)));
    for (method, url, body) in [
        (
            Method::PUT,
            under(&lock_id),
            Some(json!({"n": 2}).to_string()),
        ),
        (Method::POST, keepalive, None),
        (Method::DELETE, release, None),
        (Method::POST, force(&monitor, &lock_id), None),
    ] {
        let (status, v) = call(&c, method.clone(), &url, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {url}: {v}");
        assert_eq!(v["error"], "unknown_lock", "{v}");
        let message = v["message"].as_str().unwrap();
        assert!(
            message.contains("force-released") && message.contains("holder hung"),
            "{v}"
        );
    }
    assert_eq!(es_doc(&c, &index, "1").await["_source"]["n"], 1);

    // The next holder's token is greater: its write fences the old holder's own writes.
    let (next_id, next_token) = take_doc_lock(&s, &index, "1").await;
    assert!(next_token > token, "{next_token} after {token}");
    let (status, v) = call(
        &c,
        Method::PUT,
        &under(&next_id),
        Some(json!({"n": 3}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let direct = format!(
        "{}/{index}/_doc/1?version={token}&version_type=external_gte",
        shared_es().url()
    );
    let (status, v) = call(&c, Method::PUT, &direct, Some(json!({"n": 4}).to_string())).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(es_doc(&c, &index, "1").await["_source"]["n"], 3);

    // The loss is among the lock events, with its reason.
    let html = client()
        .get(s.url("/ui/status"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("force-released: holder hung"), "{html}");
}

/// `/docs` and `/openapi.json` open without a token (they hold no data), with a content
/// policy that allows the service's own origin only; everything the page loads comes from the
/// binary (no CDN logo); in a browser the page renders with no policy violation and shows the
/// NDJSON request example of `POST /v1/bulk` as lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_docs_open_offline_without_a_token_in_a_browser() {
    let (_env, s) = start("ui-docs");
    let c = client();
    for path in [
        "/docs",
        "/docs/redoc.standalone.js",
        "/docs/redoc-logo.svg",
        "/openapi.json",
    ] {
        let resp = c.get(s.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let policy = resp
            .headers()
            .get("content-security-policy")
            .unwrap_or_else(|| panic!("{path} has no content policy"))
            .to_str()
            .unwrap()
            .to_string();
        assert!(policy.contains("default-src 'none'"), "{path}: {policy}");
        assert!(
            !policy.contains("http") && !policy.contains('*'),
            "{path}: {policy}"
        );
        let body = resp.text().await.unwrap();
        assert!(!body.contains("cdn.redoc.ly"), "{path} names a CDN");
    }
    let (status, doc) = call(&c, Method::GET, &s.url("/openapi.json"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["paths"]["/v1/locks/{monitor}/{lock_id}/force-release"].is_object());
    // The API still needs the token.
    let (status, _) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let steps = browse(&s, json!({"mode": "docs"})).await;
    assert_eq!(steps, ["rendered", "ndjson"]);
}
