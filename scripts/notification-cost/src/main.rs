// What watch notifications cost ZooKeeper (see README.md beside this file).
// Server CPU of notifications: W sessions keep a persistent recursive watch on /m while one
// session churns children the way a hand-off does (mark + delete of a queue node, create of a
// new one, delete + create of privateLock).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use zookeeper_client as zk;

fn cpu(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = s.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (addr, pid, cycles): (&str, u32, u32) =
        (&args[1], args[2].parse().unwrap(), args[3].parse().unwrap());
    let c = zk::Client::connect(addr).await.unwrap();
    let _ = c
        .create(
            "/m",
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await;
    for watchers in [0usize, 4, 8, 0, 4, 8] {
        let events = Arc::new(AtomicU64::new(0));
        let mut sessions = Vec::new();
        for _ in 0..watchers {
            let s = zk::Client::connect(addr).await.unwrap();
            let mut w = s
                .watch("/m", zk::AddWatchMode::PersistentRecursive)
                .await
                .unwrap();
            let e = events.clone();
            tokio::spawn(async move {
                loop {
                    let ev = w.changed().await;
                    if ev.event_type == zk::EventType::Session {
                        break;
                    }
                    e.fetch_add(1, Ordering::Relaxed);
                }
            });
            sessions.push(s);
        }
        let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let plain = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        let (_, seq) = c.create("/m/A-", b"x", &eph).await.unwrap();
        let mut node = format!("/m/A-{seq}");
        let before = cpu(pid);
        let t = std::time::Instant::now();
        for _ in 0..cycles {
            // holder's release with re-queue: mark, delete, create new queue node
            let mut m = c.new_multi_writer();
            m.add_set_data(&node, b"", None).unwrap();
            m.add_delete(&node, None).unwrap();
            m.add_create("/m/A-", b"x", &eph).unwrap();
            let r = m.commit().await.unwrap();
            node = match &r[2] {
                zk::MultiWriteResult::Create { path, .. } => path.clone(),
                other => panic!("{other:?}"),
            };
            // successor's privateLock create, and its later delete
            c.create("/m/privateLock", b"", &plain).await.unwrap();
            c.delete("/m/privateLock", None).await.unwrap();
        }
        let dt = t.elapsed().as_secs_f64();
        let server = cpu(pid) - before;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        println!("watchers {watchers}: {:.0} cycles/s, server CPU {:.3} ms/cycle, events seen {} ({:.1}/cycle)", cycles as f64 / dt, server * 1000.0 / cycles as f64, events.load(Ordering::Relaxed), events.load(Ordering::Relaxed) as f64 / cycles as f64);
        drop(sessions);
    }
}
