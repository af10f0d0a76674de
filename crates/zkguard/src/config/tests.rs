use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use super::*;

fn write(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".properties")
        .tempfile()
        .unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

#[test]
fn defaults_match_the_issue() {
    let s = Settings::default();
    assert_eq!(s.zookeeper.servers, "localhost:2181");
    assert_eq!(s.zookeeper.session_timeout, Duration::from_millis(5000));
    assert_eq!(s.zookeeper.connection_retry, 5);
    assert_eq!(s.zookeeper.connection_delay, Duration::from_millis(1000));
    assert_eq!(s.zookeeper.foreground_prefix, "A");
    assert_eq!(s.zookeeper.background_prefix, "B");
    assert_eq!(s.zookeeper.foreground_timeout, Duration::from_millis(2000));
    assert_eq!(s.zookeeper.background_timeout, Duration::from_millis(2000));
    assert_eq!(s.retry.retry_count, 3);
    assert_eq!(s.zookeeper.lock_root, "/zkguard/locks");
    assert_eq!(s.zookeeper.background_max_wait, None);
}

#[test]
fn properties_syntax_and_env_override() {
    let f = write(
        "# comment\n! also a comment\nzookeeper.servers = h1:1,\\\n    h2:2\nzookeeper.session.timeout: 3000\nzookeeper.foreground.lock.prefix \\u0041\nunrelated.key=1\n",
    );
    let s = Settings::load_with_env(Some(f.path()), |v| {
        (v == "ZKGUARD_ZOOKEEPER_CONNECTION_RETRY").then(|| "7".to_string())
    })
    .unwrap();
    assert_eq!(s.zookeeper.servers, "h1:1,h2:2");
    assert_eq!(s.zookeeper.session_timeout, Duration::from_millis(3000));
    assert_eq!(s.zookeeper.foreground_prefix, "A");
    assert_eq!(s.zookeeper.connection_retry, 7);
}

#[test]
fn bad_value_names_key_value_and_file() {
    let f = write("zookeeper.session.timeout=abc\n");
    let err = Settings::load_with_env(Some(f.path()), |_| None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("zookeeper.session.timeout"), "{err}");
    assert!(err.contains("abc"), "{err}");
    assert!(err.contains(&f.path().display().to_string()), "{err}");
}

#[test]
fn env_error_names_variable() {
    let err = Settings::load_with_env(None, |v| {
        (v == "ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT").then(|| "-5".to_string())
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT"),
        "{err}"
    );
}

#[test]
fn typo_gets_a_hint() {
    let f = write("zookeeper.sesion.timeout=3000\n");
    let err = Settings::load_with_env(Some(f.path()), |_| None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("did you mean `zookeeper.session.timeout`"),
        "{err}"
    );
}

#[test]
fn equal_prefixes_are_rejected() {
    let f = write("zookeeper.background.lock.prefix=A\n");
    let err = Settings::load_with_env(Some(f.path()), |_| None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("different from zookeeper.foreground.lock.prefix"),
        "{err}"
    );
}

/// Queue order is the byte order of the two prefixes: a foreground prefix that does not sort
/// first would make background contenders the first class.
#[test]
fn a_foreground_prefix_must_sort_before_the_background_one() {
    let prefixes = |fg: &str, bg: &str| {
        write(&format!(
            "zookeeper.foreground.lock.prefix={fg}\nzookeeper.background.lock.prefix={bg}\n"
        ))
    };
    for (fg, bg) in [
        ("fg", "bg"),
        ("foreground", "background"),
        ("a", "B"),
        ("B", "A"),
    ] {
        let f = prefixes(fg, bg);
        let err = Settings::load_with_env(Some(f.path()), |_| None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("zookeeper.foreground.lock.prefix={fg}")),
            "{err}"
        );
        assert!(
            err.contains(&format!("zookeeper.background.lock.prefix={bg}")),
            "{err}"
        );
        assert!(err.contains("sorts before"), "{err}");
    }
    // One prefix beginning with the other is fine: queue nodes are `<prefix>-<sequence>` and
    // prefixes have no dash, so `A-...` and `AA-...` parse apart (see `zk::names`).
    for (fg, bg) in [("A", "B"), ("A", "AA"), ("F", "b"), ("fg1", "fg2")] {
        let s = Settings::load_with_env(Some(prefixes(fg, bg).path()), |_| None).unwrap();
        assert_eq!(
            (
                s.zookeeper.foreground_prefix.as_str(),
                s.zookeeper.background_prefix.as_str()
            ),
            (fg, bg)
        );
    }
}

fn load_env(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    Settings::load_with_vars(
        None,
        vars.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    )
}

#[test]
fn durations_are_capped_at_seven_days() {
    let f = write("zookeeper.foreground.task.timeout=99999999999d\n");
    let err = Settings::load_with_env(Some(f.path()), |_| None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("zookeeper.foreground.task.timeout"), "{err}");
    assert!(err.contains("at most 7d"), "{err}");
    let err = load_env(&[("ZKGUARD_TXN_RECOVERY_AFTER", "18446744073709551615")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("at most 7d"), "{err}");
    let s = load_env(&[("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "7d")]).unwrap();
    assert_eq!(s.zookeeper.foreground_timeout, MAX_DURATION);
    assert!(
        parse_bounded_duration("0").unwrap().is_zero(),
        "0 stays valid"
    );
    let e = parse_bounded_duration("99999999999d").unwrap_err();
    assert!(e.contains("maximum of 7d"), "{e}");
    let e = parse_bounded_duration("soon").unwrap_err();
    assert!(e.contains("not a duration"), "{e}");
}

#[test]
fn zookeeper_servers_are_checked_at_load() {
    for (bad, needle) in [
        ("host:notaport", "`notaport`"),
        ("host:99999", "`99999`"),
        ("host:0", "`0`"),
        (":2181", "empty host"),
        ("h1:2181,", "empty entry"),
        ("h1:2181,,h2:2181", "empty entry"),
        ("h1:2181/app/", "ends with `/`"),
        ("h1:2181/app//x", "empty segment"),
        ("h1:2181/app/../x", "`..`"),
        ("h1/app,h2:2181", "after the last host"),
        ("http://h1:2181", "scheme"),
        ("[::1:2181", "without closing"),
    ] {
        let err = load_env(&[("ZKGUARD_ZOOKEEPER_SERVERS", bad)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("zookeeper.servers"), "{bad}: {err}");
        assert!(err.contains(needle), "{bad}: {err}");
    }
    for (good, stored) in [
        ("localhost:2181", "localhost:2181"),
        ("h1:1, h2:2", "h1:1,h2:2"),
        ("h1", "h1"),
        (
            "[::1]:2181,tcp://h2:2182/app/x",
            "[::1]:2181,tcp://h2:2182/app/x",
        ),
        ("h1:2181/", "h1:2181/"),
    ] {
        let s = load_env(&[("ZKGUARD_ZOOKEEPER_SERVERS", good)]).unwrap();
        assert_eq!(s.zookeeper.servers, stored);
    }
    assert_eq!(
        split_zk_chroot("h1:1,tcp://h2:2/app"),
        ("h1:1,tcp://h2:2", Some("/app"))
    );
    assert_eq!(split_zk_chroot("tcp://h2:2"), ("tcp://h2:2", None));
}

#[test]
fn zookeeper_digest_auth_inline_or_from_a_file_never_shown() {
    assert_eq!(load_env(&[]).unwrap().zookeeper.auth, None);
    let s = load_env(&[
        ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest"),
        ("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:pa55:word"),
    ])
    .unwrap();
    let auth = s.zookeeper.auth.clone().unwrap();
    assert_eq!(auth.scheme, "digest");
    assert_eq!(auth.credentials, "alice:pa55:word");
    let debug = format!("{s:?}");
    assert!(debug.contains("alice"), "{debug}");
    assert!(!debug.contains("pa55"), "{debug}");

    let file = write("bob:fr0m-file\n");
    let path = file.path().to_str().unwrap();
    let s = load_env(&[
        ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest"),
        ("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS_FILE", path),
    ])
    .unwrap();
    assert_eq!(s.zookeeper.auth.unwrap().credentials, "bob:fr0m-file");

    for (vars, expect) in [
        (
            vec![
                ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest"),
                ("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "no-colon-s3cret"),
            ],
            "user:password",
        ),
        (
            vec![("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:s3cret")],
            "zookeeper.auth.scheme is none",
        ),
        (
            vec![
                ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest"),
                ("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:s3cret"),
                ("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS_FILE", path),
            ],
            "give the credentials once",
        ),
        (
            vec![("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest")],
            "user:password",
        ),
        (
            vec![
                ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest"),
                (
                    "ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS_FILE",
                    "/nonexistent/s3cret",
                ),
            ],
            "a readable file",
        ),
    ] {
        let err = load_env(&vars).unwrap_err().to_string();
        assert!(err.contains(expect), "{err}");
        assert!(!err.contains("no-colon-s3cret"), "{err}");
        assert!(!err.contains("alice:s3cret"), "{err}");
        assert!(!err.contains("fr0m-file"), "{err}");
    }
}

#[test]
fn zookeeper_sasl_digest_md5_inline_or_from_a_file_never_shown() {
    let s = load_env(&[
        ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "sasl"),
        ("ZKGUARD_ZOOKEEPER_SASL_USERNAME", "alice"),
        ("ZKGUARD_ZOOKEEPER_SASL_PASSWORD", "pa55:word"),
    ])
    .unwrap();
    let auth = s.zookeeper.auth.clone().unwrap();
    assert!(auth.is_sasl());
    assert_eq!((auth.user(), auth.password()), ("alice", "pa55:word"));
    assert_eq!(s.zookeeper.acl, ZkAcl::Creator);
    assert!(!format!("{:?}", s.zookeeper).contains("pa55"));
    for (vars, expected) in [
        (
            vec![("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "sasl")],
            "the SASL user name",
        ),
        (
            vec![
                ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "sasl"),
                ("ZKGUARD_ZOOKEEPER_SASL_USERNAME", "alice"),
            ],
            "the SASL password",
        ),
        (
            vec![
                ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest"),
                ("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "a:b"),
                ("ZKGUARD_ZOOKEEPER_SASL_PASSWORD", "s3cret"),
            ],
            "set zookeeper.auth.scheme=sasl",
        ),
        (
            vec![
                ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "sasl"),
                ("ZKGUARD_ZOOKEEPER_SASL_MECHANISM", "PLAIN"),
            ],
            "DIGEST-MD5",
        ),
    ] {
        let e = load_env(&vars).unwrap_err().to_string();
        assert!(e.contains(expected), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }
}

#[test]
fn tls_files_are_checked_at_load() {
    let not_pem = write("not a certificate\n");
    let path = not_pem.path().to_str().unwrap();
    for (vars, key) in [
        (
            vec![("ZKGUARD_ZOOKEEPER_TLS_ENABLED", "true")],
            "zookeeper.tls.ca",
        ),
        (
            vec![
                ("ZKGUARD_ZOOKEEPER_TLS_ENABLED", "true"),
                ("ZKGUARD_ZOOKEEPER_TLS_CA", path),
            ],
            "zookeeper.tls.ca",
        ),
        (vec![("ZKGUARD_ZOOKEEPER_TLS_CA", path)], "zookeeper.tls.ca"),
        (
            vec![("ZKGUARD_ELASTICSEARCH_TLS_CA", path)],
            "elasticsearch.tls.ca",
        ),
        (
            vec![("ZKGUARD_ELASTICSEARCH_TLS_CERT", path)],
            "elasticsearch.tls.key",
        ),
    ] {
        let e = load_env(&vars).unwrap_err();
        assert!(e.to_string().contains(key), "{e}");
    }
    let s = load_env(&[("ZKGUARD_ELASTICSEARCH_TLS_VERIFY", "false")]).unwrap();
    assert!(!s.elasticsearch.tls.verify);
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("elasticsearch.tls.verify=false")),
        "{:?}",
        s.warnings
    );
    assert!(load_env(&[]).unwrap().warnings.is_empty());
}

#[test]
fn zookeeper_acl_defaults_to_creator_when_authenticated() {
    assert_eq!(load_env(&[]).unwrap().zookeeper.acl, ZkAcl::Open);
    let digest = [
        ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest"),
        ("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:pw"),
    ];
    assert_eq!(load_env(&digest).unwrap().zookeeper.acl, ZkAcl::Creator);
    let mut open = digest.to_vec();
    open.push(("ZKGUARD_ZOOKEEPER_ACL", "open"));
    assert_eq!(load_env(&open).unwrap().zookeeper.acl, ZkAcl::Open);
    let s = load_env(&[(
        "ZKGUARD_ZOOKEEPER_ACL",
        "digest:ops:aGFzaA==:adrwc, world:anyone:r",
    )])
    .unwrap();
    let ZkAcl::Explicit(entries) = &s.zookeeper.acl else {
        panic!("{:?}", s.zookeeper.acl)
    };
    let shown: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
    assert_eq!(shown, ["digest:ops:aGFzaA==:cdrwa", "world:anyone:r"]);
    for (value, expect) in [
        ("creator", "creator needs an authenticated session"),
        ("world:anyone:rx", "permissions are letters"),
        ("world:r", "is not scheme:id:perms"),
        ("auth::cdrwa", "use zookeeper.acl=creator"),
    ] {
        let err = load_env(&[("ZKGUARD_ZOOKEEPER_ACL", value)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("zookeeper.acl") && err.contains(expect),
            "{err}"
        );
    }
}

#[test]
fn elasticsearch_api_key_and_password_file_never_shown() {
    let pw = write("pw-fr0m-file\n");
    let pw_path = pw.path().to_str().unwrap();
    let s = load_env(&[
        ("ZKGUARD_ELASTICSEARCH_USERNAME", "elastic"),
        ("ZKGUARD_ELASTICSEARCH_PASSWORD_FILE", pw_path),
    ])
    .unwrap();
    assert_eq!(s.elasticsearch.password.as_deref(), Some("pw-fr0m-file"));
    let s = load_env(&[("ZKGUARD_ELASTICSEARCH_API_KEY", "a2V5LWlkOmtleS1zM2NyZXQ=")]).unwrap();
    assert_eq!(
        s.elasticsearch.api_key.as_deref(),
        Some("a2V5LWlkOmtleS1zM2NyZXQ=")
    );
    let debug = format!("{s:?}");
    assert!(!debug.contains("a2V5LWlkOmtleS1zM2NyZXQ="), "{debug}");
    let key = write("key-id:key-s3cret\n");
    let s = load_env(&[(
        "ZKGUARD_ELASTICSEARCH_API_KEY_FILE",
        key.path().to_str().unwrap(),
    )])
    .unwrap();
    assert_eq!(
        s.elasticsearch.api_key.as_deref(),
        Some("key-id:key-s3cret")
    );

    for (vars, expect) in [
        (
            vec![
                ("ZKGUARD_ELASTICSEARCH_API_KEY", "key-id:key-s3cret"),
                ("ZKGUARD_ELASTICSEARCH_USERNAME", "elastic"),
                ("ZKGUARD_ELASTICSEARCH_PASSWORD", "pw-s3cret"),
            ],
            "use one of the two",
        ),
        (
            vec![
                ("ZKGUARD_ELASTICSEARCH_PASSWORD", "pw-s3cret"),
                ("ZKGUARD_ELASTICSEARCH_PASSWORD_FILE", pw_path),
            ],
            "give the secret once",
        ),
        (
            vec![("ZKGUARD_ELASTICSEARCH_API_KEY", "not base64 key-s3cret")],
            "encoded",
        ),
    ] {
        let err = load_env(&vars).unwrap_err().to_string();
        assert!(err.contains(expect), "{err}");
        assert!(
            !err.contains("s3cret") && !err.contains("fr0m-file"),
            "{err}"
        );
    }
}

#[test]
fn a_world_readable_file_holding_a_secret_draws_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let f = write("zookeeper.auth.scheme=digest\nzookeeper.auth.credentials=alice:s3cret\n");
    let load = |mode: u32| {
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        Settings::load_with_vars(Some(f.path()), Vec::new())
            .unwrap()
            .warnings
    };
    let warnings = load(0o644);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("holds secrets (zookeeper.auth.credentials)")
            && warnings[0].contains("chmod 600"),
        "{warnings:?}"
    );
    assert!(!warnings[0].contains("s3cret"), "{warnings:?}");
    assert_eq!(load(0o600), Vec::<String>::new());
    let plain = write("zookeeper.servers=zk1:2181\n");
    std::fs::set_permissions(plain.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let s = Settings::load_with_vars(Some(plain.path()), Vec::new()).unwrap();
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}

#[test]
fn loss_grace_must_be_within_the_safe_bound() {
    // Below the session timeout, as was required before, but above the bound: 3/4 x 4000
    // - 800 (the client's longest silence) - 200 (margin) = 2000.
    let err = load_env(&[
        ("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "4000"),
        ("ZKGUARD_ZOOKEEPER_LOCK_LOSS_GRACE", "2001"),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("zookeeper.lock.loss.grace"), "{err}");
    assert!(
        err.contains("at most 2000ms for zookeeper.session.timeout=4000ms ("),
        "{err}"
    );
    assert!(err.contains("3/4 x 4000ms - 800ms"), "{err}");
    assert!(err.contains("docs/zookeeper-lock.md"), "{err}");
    let err = load_env(&[
        ("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "4000"),
        ("ZKGUARD_ZOOKEEPER_LOCK_LOSS_GRACE", "4s"),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("at most 2000ms"), "{err}");
    let s = load_env(&[
        ("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "4000"),
        ("ZKGUARD_ZOOKEEPER_LOCK_LOSS_GRACE", "2000"),
    ])
    .unwrap();
    assert_eq!(s.zookeeper.loss_grace, Some(Duration::from_millis(2000)));
}

#[test]
fn unknown_zkguard_variables_warn_and_own_ones_do_not() {
    let s = load_env(&[
        ("ZKGUARD_ZOOKEEPER_SESION_TIMEOUT", "3000"),
        ("ZKGUARD_CONFIG", "x"),
        ("ZKGUARD_FENCING_TOKEN", "7"),
        ("ZKGUARD_MONITOR", "m"),
        ("ZKGUARD_LOCK_TYPE", "foreground"),
        ("ZKGUARD_LOCK_BACKEND", "zookeeper"),
        ("ZKGUARD_EXEC_LOCK_BACKEND", "zookeeper"),
        ("ZKGUARD_EXEC_ELASTICSEARCH_URL", "http://localhost:9200"),
        ("ZKGUARD_OSMEM_BIN", "/x"),
        ("ZKGUARD_KEEP_SERVER_DIRS", "1"),
        ("ZKGUARD_TEST_HOOK", "1"),
        ("OTHER_ZKGUARD_THING", "1"),
    ])
    .unwrap();
    assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
    assert!(
        s.warnings[0].contains("ZKGUARD_ZOOKEEPER_SESION_TIMEOUT")
            && s.warnings[0].contains("did you mean ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT"),
        "{:?}",
        s.warnings
    );
    assert_eq!(s.zookeeper.session_timeout, Duration::from_millis(5000));
}

#[test]
fn a_non_utf8_value_of_a_key_variable_is_refused() {
    use std::os::unix::ffi::OsStringExt;
    let err = Settings::load_with_vars(
        None,
        [(
            OsString::from("ZKGUARD_ZOOKEEPER_SERVERS"),
            OsString::from_vec(b"h1:\xff2181".to_vec()),
        )],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("ZKGUARD_ZOOKEEPER_SERVERS"), "{err}");
    assert!(err.contains("UTF-8"), "{err}");
}

#[test]
fn url_credentials_become_basic_auth_and_are_never_shown() {
    let err = load_env(&[(
        "ZKGUARD_ELASTICSEARCH_URL",
        "http://elastic:PASSWORD@127.0.0.1:notaport",
    )])
    .unwrap_err();
    assert!(!err.to_string().contains("PASSWORD"), "{err}");
    assert!(!format!("{err:?}").contains("PASSWORD"), "{err:?}");
    assert!(
        err.to_string().contains("http://127.0.0.1:notaport"),
        "{err}"
    );

    let s = load_env(&[(
        "ZKGUARD_ELASTICSEARCH_URL",
        "http://elastic:p%40ss@es1:9200,http://elastic:p%40ss@es2:9200",
    )])
    .unwrap();
    assert_eq!(s.elasticsearch.username.as_deref(), Some("elastic"));
    assert_eq!(s.elasticsearch.password.as_deref(), Some("p@ss"));
    assert_eq!(
        display_urls(&s.elasticsearch.urls),
        "http://es1:9200,http://es2:9200"
    );
    assert!(s.elasticsearch.urls.iter().all(|u| u.username().is_empty()));
    let debug = format!("{s:?}");
    assert!(
        !debug.contains("p@ss") && !debug.contains("p%40ss"),
        "{debug}"
    );

    for vars in [
        vec![
            (
                "ZKGUARD_ELASTICSEARCH_URL",
                "http://elastic:secret@es1:9200",
            ),
            ("ZKGUARD_ELASTICSEARCH_USERNAME", "other"),
        ],
        vec![(
            "ZKGUARD_ELASTICSEARCH_URL",
            "http://a:secret@es1:9200,http://b:secret@es2:9200",
        )],
    ] {
        let err = load_env(&vars).unwrap_err().to_string();
        assert!(err.contains("elasticsearch.url"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }
    let s = load_env(&[
        ("ZKGUARD_ELASTICSEARCH_USERNAME", "u"),
        ("ZKGUARD_ELASTICSEARCH_PASSWORD", "secret"),
    ])
    .unwrap();
    assert!(!format!("{s:?}").contains("secret"));
    assert_eq!(
        redact_urls("https://u:p@h:1/x?y=@z,http://h2"),
        "https://h:1/x?y=@z,http://h2"
    );
}

#[test]
fn config_path_errors_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let err = Settings::load_with_env(Some(dir.path()), |_| None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is a directory"), "{err}");
    let err = Settings::load_with_env(Some(&dir.path().join("missing.properties")), |_| None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no such file"), "{err}");
}

#[test]
fn shipped_properties_file_lists_every_key_with_its_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conf/zkguard.properties");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut found = HashMap::new();
    java_properties::PropertiesIter::new_with_encoding(text.as_bytes(), encoding_rs::UTF_8)
        .read_into(|k, v| {
            found.insert(k, v);
        })
        .unwrap();
    for (k, default, _) in KEYS {
        assert_eq!(
            found.get(*k).map(String::as_str),
            Some(*default),
            "conf/zkguard.properties: {k}"
        );
    }
    assert_eq!(
        found.len(),
        KEYS.len(),
        "conf/zkguard.properties has keys zkguard does not know"
    );
    Settings::load_with_env(Some(&path), |_| None).unwrap();
}

/// A properties file setting every key of [`KEYS`], each to `value(key, default)`.
fn every_key(value: impl Fn(&str, &str) -> String) -> String {
    KEYS.iter()
        .map(|(k, d, _)| format!("{k}={}\n", value(k, d)))
        .collect()
}

/// The verdict of loading `f`: `accepted` or the error's message.
fn verdict(f: &tempfile::NamedTempFile) -> String {
    match Settings::load_with_env(Some(f.path()), |_| None) {
        Ok(_) => "accepted".into(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_key_is_read_as_written_beside_the_keys_it_prefixes() {
    // `server.lock.ttl` and `server.lock.ttl.max`, `elasticsearch.password` and
    // `elasticsearch.password.file`, ...: the properties file is a flat list of keys.
    assert!(
        KEYS.iter()
            .any(|(a, _, _)| KEYS.iter().any(|(b, _, _)| b.starts_with(&format!("{a}.")))),
        "no key is the prefix of another: this test checks nothing"
    );
    let f = write(&every_key(|k, _| format!("written {k}")));
    let origin = f.path().display().to_string();
    for round in 0..50 {
        let raw = sources::raw_values(Some(f.path()), |_| None).unwrap();
        for (k, _, _) in KEYS {
            assert_eq!(
                raw[*k],
                (format!("written {k}"), origin.clone()),
                "round {round}: {k}"
            );
        }
    }
}

#[test]
fn the_last_of_repeated_keys_wins_in_file_order() {
    let f = write("server.lock.ttl=1s\nserver.lock.ttl.max=9m\nserver.lock.ttl=45000\n");
    for _ in 0..20 {
        let s = Settings::load_with_env(Some(f.path()), |_| None).unwrap();
        assert_eq!(s.server.lock_ttl, Duration::from_millis(45000));
        assert_eq!(s.server.lock_ttl_max, Duration::from_secs(540));
    }
}

#[test]
fn a_wrong_value_of_any_key_among_all_gets_the_same_verdict_every_time() {
    for (key, _, _) in KEYS {
        let f = write(&every_key(|k, d| {
            if k == *key {
                "banana".into()
            } else {
                d.into()
            }
        }));
        let verdicts: std::collections::BTreeSet<String> = (0..10).map(|_| verdict(&f)).collect();
        assert_eq!(verdicts.len(), 1, "{key}=banana: {verdicts:?}");
    }
    for key in ["server.lock.ttl", "server.lock.ttl.max", "server.queue.max"] {
        let f = write(&every_key(|k, d| {
            if k == key {
                "banana".into()
            } else {
                d.into()
            }
        }));
        for _ in 0..10 {
            let v = verdict(&f);
            assert!(v.contains(&format!("`banana` for `{key}`")), "{key}: {v}");
        }
    }
}

#[test]
fn an_unknown_key_beside_all_known_ones_is_always_refused() {
    for (key, _, _) in KEYS {
        let unknown = format!("{key}.extra");
        let f = write(&format!("{}{unknown}=1\n", every_key(|_, d| d.into())));
        for _ in 0..10 {
            let v = verdict(&f);
            assert!(v.contains(&format!("unknown key `{unknown}`")), "{v}");
        }
    }
}
