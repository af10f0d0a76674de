//! The local server harness (`zkguard::testkit`) against the real programs: a standalone
//! ZooKeeper, a 3-member ensemble and `osmem-server`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use zkguard::testkit::{four_letter_word, OsmemServer, ServerError, ZkEnsemble, ZkServer};
use zookeeper_client as zk;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

async fn connect(connect_string: &str) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(connect_string)
        .await
        .unwrap_or_else(|e| panic!("connect to {connect_string}: {e}"))
}

#[test]
fn standalone_serves_counts_requests_and_survives_restart() {
    let server = ZkServer::builder()
        .tick_time(500)
        .start()
        .expect("ZooKeeper starts");
    assert!(server.is_running());
    assert_eq!(
        server.connect_string(),
        format!("127.0.0.1:{}", server.port())
    );
    assert_eq!(server.four_letter("ruok").expect("ruok"), "imok");
    let conf = server.four_letter("conf").expect("conf");
    assert!(conf.contains("tickTime=500"), "{conf}");
    assert!(conf.contains("minSessionTimeout=1000"), "{conf}");

    let rt = runtime();
    // Each reading is itself one packet (the `mntr` request): with no client connected, two
    // readings in a row differ by one. The benchmarks take it off what they count.
    let first = server.packets_received().expect("mntr");
    let before = server.packets_received().expect("mntr");
    assert_eq!(
        before,
        first + 1,
        "zk_packets_received of two readings in a row"
    );
    rt.block_on(async {
        let client = connect(&server.connect_string()).await;
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        client
            .create("/kept", b"v1", &options)
            .await
            .expect("create");
        let (data, _) = client.get_data("/kept").await.expect("get");
        assert_eq!(data, b"v1");
    });
    let after = server.packets_received().expect("mntr");
    // At least the create and the read; the connect handshake and pings may add more.
    assert!(
        after >= before + 2,
        "zk_packets_received went from {before} to {after}"
    );
    assert!(server.mntr().expect("mntr").contains_key("zk_znode_count"));

    // Paused: still a live process, but silent.
    server.pause();
    assert!(server.is_running());
    assert!(four_letter_word(
        ("127.0.0.1", server.port()),
        "ruok",
        Duration::from_millis(300)
    )
    .is_err());
    server.resume();
    assert_eq!(
        server.four_letter("ruok").expect("ruok after resume"),
        "imok"
    );

    // A crash and a restart on the same port keep the data.
    server.kill();
    assert!(!server.is_running());
    assert!(server.four_letter("ruok").is_err());
    server.start_again().expect("restart");
    assert!(server.is_running());
    rt.block_on(async {
        let client = connect(&server.connect_string()).await;
        let (data, _) = client
            .get_data("/kept")
            .await
            .expect("the node survives the restart");
        assert_eq!(data, b"v1");
    });

    server.stop();
    assert!(!server.is_running());
}

#[test]
fn parallel_starts_get_distinct_ports() {
    let servers: Vec<ZkServer> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| ZkServer::start().expect("ZooKeeper starts")))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    assert_ne!(servers[0].port(), servers[1].port());
    for s in &servers {
        assert_eq!(s.four_letter("ruok").expect("ruok"), "imok");
    }
    // Each answers as itself: distinct data directories.
    let dirs: Vec<String> = servers
        .iter()
        .map(|s| {
            s.four_letter("conf")
                .expect("conf")
                .lines()
                .find(|l| l.starts_with("dataDir="))
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_ne!(dirs[0], dirs[1]);
}

#[test]
fn ensemble_elects_a_new_leader_after_the_leader_dies() {
    let ensemble = ZkEnsemble::start(3).expect("the ensemble forms a quorum");
    assert_eq!(ensemble.size(), 3);
    assert_eq!(ensemble.connect_string().split(',').count(), 3);
    let leader = ensemble.leader().expect("a leader after start");
    let follower = (leader + 1) % 3;

    let rt = runtime();
    rt.block_on(async {
        let client = connect(&ensemble.member_connect_string(follower)).await;
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        client
            .create("/replicated", b"x", &options)
            .await
            .expect("create through a follower");
    });

    ensemble.kill(leader).expect("kill the leader");
    assert!(!ensemble.is_running(leader));
    ensemble
        .wait_ready()
        .expect("the two survivors elect a leader");
    let new_leader = ensemble.leader().expect("a new leader");
    assert_ne!(new_leader, leader);

    rt.block_on(async {
        let client = connect(&ensemble.member_connect_string(new_leader)).await;
        let (data, _) = client
            .get_data("/replicated")
            .await
            .expect("the write survived the leader");
        assert_eq!(data, b"x");
    });

    ensemble
        .start_again(leader)
        .expect("the old leader rejoins");
    let modes: Vec<String> = (0..3)
        .map(|i| {
            let srvr = ensemble.four_letter(i, "srvr").expect("srvr");
            srvr.lines()
                .find_map(|l| l.strip_prefix("Mode: "))
                .unwrap_or("none")
                .to_owned()
        })
        .collect();
    assert_eq!(
        modes.iter().filter(|m| *m == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|m| *m == "follower").count(),
        2,
        "{modes:?}"
    );
    assert!(matches!(
        ensemble.kill(7),
        Err(ServerError::InvalidArgument(_))
    ));
}

/// One HTTP/1.1 request; returns the status code and the body.
fn http(url: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let authority = url.strip_prefix("http://").expect("an http url");
    let mut stream = TcpStream::connect(authority).expect("connect to osmem");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let body = body.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the response");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn osmem_indexes_and_restarts_empty_on_the_same_url() {
    let es = OsmemServer::start().expect("osmem-server starts");
    assert!(es.is_running());
    assert_eq!(es.url(), format!("http://127.0.0.1:{}", es.port()));

    let (status, body) = http(
        es.url(),
        "PUT",
        "/articles/_doc/42?refresh=true",
        Some(r#"{"title":"hello"}"#),
    );
    assert_eq!(status, 201, "{body}");
    let (status, body) = http(es.url(), "GET", "/articles/_doc/42", None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""title":"hello""#), "{body}");

    let url = es.url().to_owned();
    es.stop();
    assert!(!es.is_running());
    assert!(TcpStream::connect(url.strip_prefix("http://").unwrap()).is_err());
    es.start_again().expect("restart");
    assert!(es.is_running());
    assert_eq!(es.url(), url);
    // Same address, but the documents were in memory.
    assert_eq!(http(&url, "GET", "/", None).0, 200);
    let (status, _) = http(&url, "GET", "/articles/_doc/42", None);
    assert_eq!(status, 404);
}

#[test]
fn four_letter_word_rejects_other_commands() {
    let err = four_letter_word("127.0.0.1:1", "status", Duration::from_millis(100)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("four-letter word"), "{err}");
}

#[test]
fn handles_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<ZkServer>();
    shareable::<ZkEnsemble>();
    shareable::<OsmemServer>();
}
