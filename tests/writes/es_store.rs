//! `EsStore` against a real `osmem-server` (an in-memory OpenSearch-compatible server), plus a tiny
//! canned-answer HTTP responder for the statuses osmem never produces (429, 5xx, timeouts).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use zkguard::config::Settings;
use zkguard::es::{BulkAction, DocStore, EsError, EsStore, Refresh, WriteCondition};

use zkguard::testkit::OsmemServer as Osmem;

fn start_osmem() -> Osmem {
    Osmem::start().expect("start osmem-server (run scripts/install-deps.sh)")
}

fn store(server: &Osmem) -> EsStore {
    EsStore::from_url(server.url()).unwrap()
}

fn conflict(r: Result<impl std::fmt::Debug, EsError>) -> String {
    match r {
        Err(EsError::Conflict { reason, .. }) => reason,
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn create_twice_is_a_conflict() {
    let server = start_osmem();
    let es = store(&server);
    let meta = es
        .index(
            "articles",
            "a1",
            &json!({"title": "one"}),
            WriteCondition::Create,
            Refresh::No,
        )
        .await
        .unwrap();
    assert_eq!(meta.version, 1);
    assert!(meta.seq_no >= 0 && meta.primary_term >= 1, "{meta:?}");
    let err = es
        .index(
            "articles",
            "a1",
            &json!({"title": "two"}),
            WriteCondition::Create,
            Refresh::No,
        )
        .await
        .unwrap_err();
    match &err {
        EsError::Conflict { index, id, reason } => {
            assert_eq!((index.as_str(), id.as_str()), ("articles", "a1"));
            assert!(
                reason.contains("version_conflict_engine_exception"),
                "{reason}"
            );
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(!err.is_transient());
    let doc = es.get("articles", "a1").await.unwrap().unwrap();
    assert_eq!(doc.source, json!({"title": "one"}));
    assert_eq!(doc.meta, meta);
}

#[tokio::test]
async fn if_match_with_a_stale_seq_no_is_a_conflict() {
    let server = start_osmem();
    let es = store(&server);
    let first = es
        .index(
            "articles",
            "a",
            &json!({"n": 1}),
            WriteCondition::Always,
            Refresh::No,
        )
        .await
        .unwrap();
    let read = es.get("articles", "a").await.unwrap().unwrap();
    assert_eq!(read.meta, first);
    let cond = WriteCondition::IfMatch {
        seq_no: read.meta.seq_no,
        primary_term: read.meta.primary_term,
    };
    let second = es
        .index("articles", "a", &json!({"n": 2}), cond, Refresh::No)
        .await
        .unwrap();
    assert!(second.seq_no > first.seq_no);
    assert_eq!(second.version, 2);
    // A writer that still holds the first read loses.
    conflict(
        es.index("articles", "a", &json!({"n": 3}), cond, Refresh::No)
            .await,
    );
    assert_eq!(
        es.get("articles", "a").await.unwrap().unwrap().source,
        json!({"n": 2})
    );
}

#[tokio::test]
async fn external_gte_fences_lower_versions_only() {
    let server = start_osmem();
    let es = store(&server);
    let w = |v: u64, n: i64| {
        let es = es.clone();
        async move {
            es.index(
                "articles",
                "f",
                &json!({"n": n}),
                WriteCondition::ExternalGte(v),
                Refresh::No,
            )
            .await
        }
    };
    assert_eq!(w(5, 1).await.unwrap().version, 5);
    let reason = conflict(w(4, 2).await);
    assert!(reason.contains("version conflict"), "{reason}");
    assert_eq!(
        w(5, 3).await.unwrap().version,
        5,
        "an equal token (the same holder) may write again"
    );
    assert_eq!(w(6, 4).await.unwrap().version, 6);
    assert_eq!(
        es.get("articles", "f").await.unwrap().unwrap().source,
        json!({"n": 4})
    );
    // `external` (strictly greater) rejects an equal version.
    conflict(
        es.index(
            "articles",
            "f",
            &json!({"n": 5}),
            WriteCondition::External(6),
            Refresh::No,
        )
        .await,
    );
    let meta = es
        .index(
            "articles",
            "f",
            &json!({"n": 6}),
            WriteCondition::External(7),
            Refresh::No,
        )
        .await
        .unwrap();
    assert_eq!(meta.version, 7);
}

#[tokio::test]
async fn delete_with_conditions() {
    let server = start_osmem();
    let es = store(&server);
    es.index(
        "articles",
        "d",
        &json!({"n": 1}),
        WriteCondition::ExternalGte(10),
        Refresh::No,
    )
    .await
    .unwrap();
    // A stale fencing token cannot delete.
    conflict(
        es.delete("articles", "d", WriteCondition::ExternalGte(9), Refresh::No)
            .await,
    );
    let doc = es.get("articles", "d").await.unwrap().expect("still there");
    // Nor can a stale seq_no.
    let stale = WriteCondition::IfMatch {
        seq_no: doc.meta.seq_no + 1,
        primary_term: doc.meta.primary_term,
    };
    conflict(es.delete("articles", "d", stale, Refresh::No).await);
    let current = WriteCondition::IfMatch {
        seq_no: doc.meta.seq_no,
        primary_term: doc.meta.primary_term,
    };
    let deleted = es
        .delete("articles", "d", current, Refresh::No)
        .await
        .unwrap()
        .expect("it existed");
    assert!(deleted.seq_no > doc.meta.seq_no);
    assert_eq!(es.get("articles", "d").await.unwrap(), None);
    assert_eq!(
        es.delete("articles", "d", WriteCondition::Always, Refresh::No)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        es.delete("no-such-index", "d", WriteCondition::Always, Refresh::No)
            .await
            .unwrap(),
        None
    );
    match es
        .delete("articles", "d", WriteCondition::Create, Refresh::No)
        .await
    {
        Err(EsError::BadRequest { reason, .. }) => assert!(reason.contains("Create"), "{reason}"),
        other => panic!("expected BadRequest, got {other:?}"),
    }
    // A fenced delete with a newer token succeeds.
    es.index(
        "articles",
        "e",
        &json!({"n": 1}),
        WriteCondition::ExternalGte(3),
        Refresh::No,
    )
    .await
    .unwrap();
    assert!(es
        .delete("articles", "e", WriteCondition::ExternalGte(4), Refresh::No)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn get_of_a_missing_doc_or_index_is_none() {
    let server = start_osmem();
    let es = store(&server);
    assert_eq!(es.get("no-such-index", "x").await.unwrap(), None);
    es.index(
        "articles",
        "present",
        &json!({}),
        WriteCondition::Always,
        Refresh::No,
    )
    .await
    .unwrap();
    assert_eq!(es.get("articles", "absent").await.unwrap(), None);
    assert!(es.get("articles", "present").await.unwrap().is_some());
}

/// `_mget` answers each document in the order asked, realtime (no refresh), with the same
/// metadata a GET gives; a missing document or index is `None`, as for a GET.
#[tokio::test]
async fn mget_answers_each_document_in_order_like_get() {
    let server = start_osmem();
    let es = store(&server);
    let written = es
        .index(
            "articles",
            "a",
            &json!({"title": "A"}),
            WriteCondition::Always,
            Refresh::No,
        )
        .await
        .unwrap();
    es.index(
        "articles",
        "b",
        &json!({"title": "B"}),
        WriteCondition::Always,
        Refresh::No,
    )
    .await
    .unwrap();
    let asked: Vec<(String, String)> = [
        ("articles", "b"),
        ("no-such-index", "x"),
        ("articles", "absent"),
        ("articles", "a"),
    ]
    .iter()
    .map(|(i, d)| (i.to_string(), d.to_string()))
    .collect();
    let docs: Vec<Option<zkguard::es::Doc>> = es
        .mget(&asked)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.unwrap())
        .collect();
    assert_eq!(docs.len(), 4);
    assert_eq!(docs[0].as_ref().unwrap().source, json!({"title": "B"}));
    assert_eq!(docs[1], None);
    assert_eq!(docs[2], None);
    let a = docs[3].as_ref().unwrap();
    assert_eq!(a.source, json!({"title": "A"}));
    assert_eq!(a.meta, written, "the same metadata as the write answered");
    assert_eq!(Some(a.clone()), es.get("articles", "a").await.unwrap());
    assert!(es.mget(&[]).await.unwrap().is_empty());
}

#[tokio::test]
async fn ensure_index_applies_mappings_and_is_idempotent() {
    let server = start_osmem();
    let es = store(&server);
    let mappings = json!({"properties": {"n": {"type": "long"}, "tag": {"type": "keyword"}}});
    es.ensure_index("typed", &mappings).await.unwrap();
    es.ensure_index("typed", &mappings).await.unwrap();
    // The mapping is in force: a string in a long field is rejected.
    match es
        .index(
            "typed",
            "x",
            &json!({"n": "not a number"}),
            WriteCondition::Always,
            Refresh::No,
        )
        .await
    {
        Err(EsError::BadRequest {
            status: 400,
            reason,
        }) => assert!(reason.contains("mapper_parsing"), "{reason}"),
        other => panic!("expected BadRequest, got {other:?}"),
    }
    // A whole create-index body is accepted too.
    es.ensure_index("typed2", &json!({"mappings": mappings}))
        .await
        .unwrap();
    assert!(matches!(
        es.index(
            "typed2",
            "x",
            &json!({"n": "nan"}),
            WriteCondition::Always,
            Refresh::No
        )
        .await,
        Err(EsError::BadRequest { .. })
    ));
    // An invalid index name is a bad request, not "already exists".
    assert!(matches!(
        es.ensure_index("Upper_Case", &mappings).await,
        Err(EsError::BadRequest { .. })
    ));
}

#[tokio::test]
async fn search_returns_sorted_hits_with_concurrency_metadata() {
    let server = start_osmem();
    let es = store(&server);
    es.ensure_index(
        "tasks",
        &json!({"properties": {"n": {"type": "long"}, "tag": {"type": "keyword"}, "at": {"type": "date"}}}),
    )
    .await
    .unwrap();
    let now = chrono_like_now_millis();
    let old = now - 10 * 60 * 1000;
    let docs = [
        ("t1", json!({"n": 1, "tag": "red", "at": now})),
        ("t2", json!({"n": 2, "tag": "blue", "at": now})),
        ("t3", json!({"n": 3, "tag": "green", "at": now})),
        ("t4", json!({"n": 4, "tag": "red", "at": old})),
        ("t5", json!({"n": 5, "tag": "red", "at": now})),
    ];
    for (id, doc) in &docs {
        es.index("tasks", id, doc, WriteCondition::Always, Refresh::No)
            .await
            .unwrap();
    }
    // t5 gets a second version so `_version` is visibly carried.
    es.index(
        "tasks",
        "t5",
        &json!({"n": 5, "tag": "red", "at": now}),
        WriteCondition::ExternalGte(9),
        Refresh::No,
    )
    .await
    .unwrap();
    es.refresh("tasks").await.unwrap();
    let body = json!({
        "query": {"bool": {"filter": [
            {"terms": {"tag": ["red", "blue"]}},
            {"range": {"at": {"gte": "now-2m"}}}
        ]}},
        "sort": [{"n": "desc"}],
        "size": 10
    });
    let hits = es.search("tasks", &body).await.unwrap();
    let ids: Vec<&str> = hits.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["t5", "t2", "t1"]);
    for hit in &hits {
        let got = es.get("tasks", &hit.id).await.unwrap().unwrap();
        assert_eq!(
            hit.meta, got.meta,
            "search metadata of {} equals the GET's",
            hit.id
        );
        assert_eq!(hit.source, got.source);
    }
    assert_eq!(hits[0].meta.version, 9);
    // The metadata is usable for a conditional write.
    let h = &hits[1];
    let cond = WriteCondition::IfMatch {
        seq_no: h.meta.seq_no,
        primary_term: h.meta.primary_term,
    };
    es.index(
        "tasks",
        &h.id,
        &json!({"n": 20, "tag": "blue", "at": now}),
        cond,
        Refresh::Now,
    )
    .await
    .unwrap();
    conflict(
        es.index("tasks", &h.id, &json!({}), cond, Refresh::No)
            .await,
    );
    // A missing index gives no hits; a malformed query is a bad request.
    assert!(es.search("no-such-index", &body).await.unwrap().is_empty());
    assert!(matches!(
        es.search("tasks", &json!({"query": {"no_such_query": {}}}))
            .await,
        Err(EsError::BadRequest { status: 400, .. })
    ));
}

fn chrono_like_now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test]
async fn bulk_reports_each_item_in_order() {
    let server = start_osmem();
    let es = store(&server);
    es.ensure_index("b", &json!({"properties": {"n": {"type": "long"}}}))
        .await
        .unwrap();
    es.index(
        "b",
        "exists",
        &json!({"n": 0}),
        WriteCondition::ExternalGte(5),
        Refresh::No,
    )
    .await
    .unwrap();
    let idx = |id: &str, n: Value, condition| BulkAction::Index {
        index: "b".into(),
        id: id.into(),
        source: json!({"n": n}),
        condition,
    };
    let del = |index: &str, id: &str, condition| BulkAction::Delete {
        index: index.into(),
        id: id.into(),
        condition,
    };
    let actions = vec![
        idx("new", json!(1), WriteCondition::Create),    // 0 ok
        idx("exists", json!(2), WriteCondition::Create), // 1 conflict
        idx("exists", json!(3), WriteCondition::ExternalGte(4)), // 2 conflict (stale token)
        idx("exists", json!(4), WriteCondition::ExternalGte(6)), // 3 ok
        idx("bad", json!("text"), WriteCondition::Always), // 4 mapping error
        del("b", "missing", WriteCondition::Always),     // 5 ok: absent as asked
        del("b", "new", WriteCondition::Create),         // 6 rejected before sending
        del("no-such-index", "x", WriteCondition::Always), // 7 not found
        idx(
            "new",
            json!(5),
            WriteCondition::IfMatch {
                seq_no: 999,
                primary_term: 1,
            },
        ), // 8 conflict
    ];
    let results = es.bulk(&actions, Refresh::Now).await.unwrap();
    assert_eq!(results.len(), actions.len());
    assert_eq!(results[0].as_ref().unwrap().version, 1);
    assert!(
        matches!(&results[1], Err(EsError::Conflict { id, .. }) if id == "exists"),
        "{:?}",
        results[1]
    );
    assert!(
        matches!(&results[2], Err(EsError::Conflict { .. })),
        "{:?}",
        results[2]
    );
    assert_eq!(results[3].as_ref().unwrap().version, 6);
    assert!(
        matches!(&results[4], Err(EsError::BadRequest { status: 400, .. })),
        "{:?}",
        results[4]
    );
    assert!(results[5].is_ok(), "{:?}", results[5]);
    assert!(
        matches!(&results[6], Err(EsError::BadRequest { .. })),
        "{:?}",
        results[6]
    );
    assert!(
        matches!(&results[7], Err(EsError::NotFound { .. })),
        "{:?}",
        results[7]
    );
    assert!(
        matches!(&results[8], Err(EsError::Conflict { .. })),
        "{:?}",
        results[8]
    );
    // The applied items are really there, the rejected ones not.
    assert_eq!(
        es.get("b", "exists").await.unwrap().unwrap().source,
        json!({"n": 4})
    );
    assert_eq!(
        es.get("b", "new").await.unwrap().unwrap().source,
        json!({"n": 1})
    );
    assert_eq!(es.get("b", "bad").await.unwrap(), None);
    assert_eq!(
        es.search("b", &json!({"query": {"match_all": {}}}))
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(es.bulk(&[], Refresh::No).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_stopped_server_is_a_transport_error() {
    let server = start_osmem();
    let es = store(&server);
    es.index("a", "1", &json!({}), WriteCondition::Always, Refresh::No)
        .await
        .unwrap();
    server.kill();
    let err = es.get("a", "1").await.unwrap_err();
    match &err {
        EsError::Transport { url, .. } => assert_eq!(url, server.url()),
        other => panic!("expected a transport error, got {other:?}"),
    }
    assert!(err.is_transient());
    assert!(err.to_string().contains("check elasticsearch.url"), "{err}");
    assert!(matches!(
        es.bulk(
            &[BulkAction::Delete {
                index: "a".into(),
                id: "1".into(),
                condition: WriteCondition::Always
            }],
            Refresh::No
        )
        .await,
        Err(EsError::Transport { .. })
    ));
}

#[tokio::test]
async fn several_urls_fail_over_a_refused_connection() {
    let server = start_osmem();
    let dead = closed_port_url();
    let es = EsStore::from_url(&format!("{dead}, {}", server.url())).unwrap();
    // Round-robin hits the dead node every other request; each is retried on the live one.
    for i in 0..6 {
        let id = i.to_string();
        es.index(
            "m",
            &id,
            &json!({"i": i}),
            WriteCondition::Create,
            Refresh::No,
        )
        .await
        .unwrap();
        assert_eq!(
            es.get("m", &id).await.unwrap().unwrap().source,
            json!({"i": i})
        );
    }
    // With only dead nodes, the error names all of them.
    let es = EsStore::from_url(&format!("{dead},{}", closed_port_url())).unwrap();
    match es.get("m", "0").await {
        Err(EsError::Transport { url, .. }) => assert_eq!(url.split(',').count(), 2, "{url}"),
        other => panic!("expected a transport error, got {other:?}"),
    }
}

fn closed_port_url() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

/// A one-thread HTTP server answering every request with `status` and `body`. Records each
/// request's head.
struct Canned {
    url: String,
    heads: Arc<Mutex<Vec<String>>>,
}

fn canned(status: u16, body: &'static str) -> Canned {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut request_body = vec![0; length];
            let _ = reader.read_exact(&mut request_body);
            seen.lock().unwrap().push(head);
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Canned { url, heads }
}

const ES_ERROR: &str =
    r#"{"error":{"type":"es_rejected_execution_exception","reason":"queue full"},"status":0}"#;

#[tokio::test]
async fn statuses_osmem_never_sends_are_classified() {
    let doc = json!({"n": 1});
    let one = [BulkAction::Index {
        index: "i".into(),
        id: "1".into(),
        source: json!({}),
        condition: WriteCondition::Always,
    }];
    for (status, check) in [
        (
            429u16,
            (|e: &EsError| matches!(e, EsError::TooManyRequests { reason } if reason.contains("queue full")))
                as fn(&EsError) -> bool,
        ),
        (500, |e| matches!(e, EsError::Server { status: 500, .. })),
        (503, |e| matches!(e, EsError::Server { status: 503, .. })),
        (403, |e| {
            matches!(e, EsError::BadRequest { status: 403, .. })
        }),
        (413, |e| {
            matches!(e, EsError::BadRequest { status: 413, .. })
        }),
    ] {
        let server = canned(status, ES_ERROR);
        let es = EsStore::from_url(&server.url).unwrap();
        let errors = [
            es.get("i", "1").await.unwrap_err(),
            es.index("i", "1", &doc, WriteCondition::Always, Refresh::No)
                .await
                .unwrap_err(),
            es.delete("i", "1", WriteCondition::Always, Refresh::No)
                .await
                .unwrap_err(),
            es.search("i", &json!({})).await.unwrap_err(),
            es.bulk(&one, Refresh::No).await.unwrap_err(),
            es.ensure_index("i", &json!({})).await.unwrap_err(),
            es.refresh("i").await.unwrap_err(),
        ];
        for e in &errors {
            assert!(check(e), "status {status}: {e:?}");
            assert_eq!(e.is_transient(), status == 429 || status >= 500, "{e:?}");
        }
    }
    // A 404 on a write or a refresh is NotFound; a 409 from a proxy-like text body still classifies.
    let es = EsStore::from_url(&canned(404, ES_ERROR).url).unwrap();
    assert!(matches!(
        es.index("i", "1", &doc, WriteCondition::Always, Refresh::No)
            .await,
        Err(EsError::NotFound { .. })
    ));
    assert!(matches!(
        es.refresh("i").await,
        Err(EsError::NotFound { .. })
    ));
    let es = EsStore::from_url(&canned(502, "<html>Bad Gateway</html>").url).unwrap();
    match es.get("i", "1").await {
        Err(EsError::Server {
            status: 502,
            reason,
        }) => assert!(reason.contains("Bad Gateway"), "{reason}"),
        other => panic!("expected a server error, got {other:?}"),
    }
    // A success that is not JSON is a protocol error.
    let es = EsStore::from_url(&canned(200, "hello").url).unwrap();
    assert!(matches!(es.get("i", "1").await, Err(EsError::Protocol(_))));
    // Bulk answers must match the actions one to one.
    let es = EsStore::from_url(&canned(200, r#"{"errors":false,"items":[]}"#).url).unwrap();
    assert!(matches!(
        es.bulk(&one, Refresh::No).await,
        Err(EsError::Protocol(_))
    ));
}

#[tokio::test]
async fn a_frozen_server_times_out_as_a_transport_error() {
    let server = start_osmem();
    let es = store(&server);
    let doc = json!({"n": 1});
    es.index("i", "1", &doc, WriteCondition::Always, Refresh::No)
        .await
        .unwrap();
    let mut settings = Settings::default().elasticsearch;
    settings.urls = vec![server.url().parse().unwrap()];
    settings.request_timeout = Duration::from_millis(300);
    let impatient = EsStore::new(&settings).unwrap();
    server.pause();
    let result = impatient.get("i", "1").await;
    server.resume();
    match result {
        Err(EsError::Transport { reason, .. }) => {
            assert!(reason.contains("no answer within 300ms"), "{reason}")
        }
        other => panic!("expected a transport error, got {other:?}"),
    }
    // The store works again once the server answers.
    let got = es.get("i", "1").await.unwrap().unwrap();
    assert_eq!(got.source, doc);
}

#[tokio::test]
async fn basic_auth_is_sent_when_configured() {
    let server = canned(404, r#"{"found":false}"#);
    let mut settings = Settings::default().elasticsearch;
    settings.urls = vec![server.url.parse().unwrap()];
    settings.username = Some("elastic".into());
    settings.password = Some("secret".into());
    let es = EsStore::new(&settings).unwrap();
    assert_eq!(es.get("i", "1").await.unwrap(), None);
    // Credentials in the URL are used when no user name is configured, and never shown.
    let url = server.url.replace("http://", "http://user:p%40ss@");
    let es = EsStore::from_url(&url).unwrap();
    assert!(!es.urls().contains("p%40ss"), "{}", es.urls());
    assert_eq!(es.get("i", "1").await.unwrap(), None);
    // And none at all otherwise.
    let es = EsStore::from_url(&server.url).unwrap();
    assert_eq!(es.get("i", "1").await.unwrap(), None);
    let heads = server.heads.lock().unwrap().clone();
    let auth = |h: &str| {
        h.lines()
            .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
            .map(|l| l.split_once(':').unwrap().1.trim().to_string())
    };
    assert_eq!(
        auth(&heads[0]).as_deref(),
        Some("Basic ZWxhc3RpYzpzZWNyZXQ="),
        "elastic:secret"
    );
    assert_eq!(
        auth(&heads[1]).as_deref(),
        Some("Basic dXNlcjpwQHNz"),
        "user:p@ss"
    );
    assert_eq!(auth(&heads[2]), None);
}

/// Every index zkguard creates for itself (the lease lock's, the dead letters', the
/// multi-document transactions' accounts and log, the document transactions' log) leaves a
/// one-node cluster green: each is created with `auto_expand_replicas: 0-1`, not the default
/// one replica that a single node cannot allocate.
#[tokio::test]
async fn zkguard_own_indices_keep_a_one_node_cluster_green() {
    use zkguard::eslock::EsLockService;
    use zkguard::txn::multi::Transactions;
    use zkguard::txn::Coordinator;
    use zkguard::write::deadletter::{DeadLetter, DeadLetterSink, EsSink};
    use zkguard::write::guarded::GuardedError;
    use zkguard::write::ops::Operation;
    use zkguard::{LockError, LockRequest, LockService, LockType};

    let server = start_osmem();
    let es: Arc<dyn DocStore> = Arc::new(store(&server));
    let settings = Settings::default();
    let locks = Arc::new(EsLockService::from_settings(&settings, es.clone()).unwrap());
    let guard = locks.acquire(LockRequest::new("m", "green")).await.unwrap();
    guard.unlock().await.unwrap();
    let op = Operation::index("m", "articles", "1", json!({"n": 1}));
    let err = GuardedError::Lock(LockError::Timeout {
        monitor: "m".into(),
        lock_type: LockType::Foreground,
        waited: Duration::from_millis(1),
        blocked_by: None,
    });
    let now = std::time::SystemTime::now();
    EsSink::new(es.clone(), settings.retry.index.clone())
        .park(&DeadLetter::new(&op, 1, &err, now, now))
        .await
        .unwrap();
    Coordinator::new(es.clone(), settings.txn.clone())
        .ensure_indices()
        .await
        .unwrap();
    Transactions::new(locks, es.clone(), settings.txn.clone())
        .ensure_index()
        .await
        .unwrap();

    let http = reqwest::Client::new();
    let get = |path: String| {
        let http = http.clone();
        let url = format!("{}/{path}", server.url());
        async move {
            let body = http.get(&url).send().await.unwrap().bytes().await.unwrap();
            serde_json::from_slice::<Value>(&body).unwrap()
        }
    };
    let health = get("_cluster/health?wait_for_status=green&timeout=5s".into()).await;
    assert_eq!(health["status"], "green", "{health}");
    assert_eq!(health["timed_out"], false, "{health}");
    for index in [
        &settings.es_lock.index,
        &settings.retry.index,
        &settings.txn.accounts_index,
        &settings.txn.transactions_index,
        &settings.txn.log_index,
    ] {
        let found = get(format!("{index}/_settings")).await;
        assert_eq!(
            found[index.as_str()]["settings"]["index"]["auto_expand_replicas"],
            "0-1",
            "{index}: {found}"
        );
    }
}
