//! The Python example client (`examples/serve_client.py`) against the service.

use super::*;

/// Runs `python3 examples/serve_client.py` with `args`; returns its status and stdout lines
/// parsed as JSON, and its stderr.
async fn python_client(args: Vec<String>) -> (Option<i32>, Vec<Value>, String) {
    tokio::task::spawn_blocking(move || {
        let o = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/serve_client.py"
            ))
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run python3");
        let lines = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
            .collect();
        (
            o.status.code(),
            lines,
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_example_saves_in_the_foreground_and_submits_a_bulk_job() {
    let base = Env::new(&shared_zk().connect_string(), "python");
    let tokens = base.dir.path().join("tokens");
    std::fs::write(&tokens, "python-client-token\n").unwrap();
    let env = base.with("ZKGUARD_SERVER_AUTH_TOKENS_FILE", tokens.to_str().unwrap());
    let s = env.start("a");
    let c = client();
    let index = format!("python-{}", uuid_tag());
    let args = |token: &str| -> Vec<String> {
        [
            "--url",
            &s.base,
            "--token",
            token,
            "--index",
            &index,
            "--article",
            "7",
            "--jobs",
            "4",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };

    let (code, lines, err) = python_client(args("python-client-token")).await;
    assert_eq!(code, Some(0), "{lines:?}\n{err}");
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(summary["saved"], "written", "{summary}");
    let ops = summary["operations"].as_object().unwrap();
    assert_eq!(ops.len(), 4, "{summary}");
    assert!(ops.values().all(|s| s == "applied"), "{summary}");
    let article = es_doc(&c, &index, "7").await;
    assert_eq!(article["_source"]["title"], "Hello");
    assert_eq!(article["_version"], summary["token"], "{article}");
    for n in 0..4 {
        let related = es_doc(&c, &index, &format!("7-related-{n}")).await;
        assert_eq!(related["_source"]["source"], "7", "{related}");
    }

    // A refused request: exit 2 with the service's message.
    let (code, _, err) = python_client(args("wrong-token")).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("401") && err.contains("not accepted"), "{err}");
}
