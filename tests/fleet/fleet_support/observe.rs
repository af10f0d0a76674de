//! The partitions as each instance reports them: its `/metrics` scraped every 200 ms
//! (`zkguard_journal_partition_owned`, `zkguard_journal_partition_committed_offset`).

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use reqwest::Client;

use super::checker::Seen;

/// The per-partition samples of one scrape: (partition, owned here, committed offset).
pub fn partitions(metrics: &str) -> Vec<(u32, bool, i64)> {
    let mut owned = std::collections::BTreeMap::new();
    let mut committed = std::collections::BTreeMap::new();
    for line in metrics.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some(partition) = label(series, "partition").and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(f64::NAN);
        if series.starts_with("zkguard_journal_partition_owned{") {
            owned.insert(partition, value == 1.0);
        } else if series.starts_with("zkguard_journal_partition_committed_offset{") {
            committed.insert(partition, value as i64);
        }
    }
    owned
        .into_iter()
        .map(|(p, o)| (p, o, committed.get(&p).copied().unwrap_or(-1)))
        .collect()
}

/// The value of label `name` in `series` (`name{a="x",b="y"}`).
fn label<'a>(series: &'a str, name: &str) -> Option<&'a str> {
    let inner = series.split_once('{')?.1.strip_suffix('}')?;
    inner.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| v.trim_matches('"'))
    })
}

/// Scrapes every instance's `/metrics` every 200 ms until `stop`, recording what each said.
pub async fn watch(
    bases: Arc<RwLock<Vec<String>>>,
    start: Instant,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let http = Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let urls: Vec<String> = bases.read().unwrap().clone();
        let scrapes = urls.iter().enumerate().map(|(i, base)| {
            let http = http.clone();
            let url = format!("{base}/metrics");
            async move {
                let text = http.get(url).send().await.ok()?.text().await.ok()?;
                Some((i, text))
            }
        });
        for (instance, text) in futures::future::join_all(scrapes)
            .await
            .into_iter()
            .flatten()
        {
            let at = start.elapsed();
            let mut seen = seen.lock().unwrap();
            for (partition, owned_here, committed) in partitions(&text) {
                seen.push(Seen {
                    at,
                    instance,
                    partition,
                    owned_here,
                    committed,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
