//! The partitions as each instance reports them: its `/metrics` scraped every 200 ms
//! (`zkguard_journal_partition_owned`, `zkguard_journal_partition_committed_offset`,
//! `zkguard_journal_partition_token`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use reqwest::Client;

use super::checker::Seen;

/// One partition in one scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub partition: u32,
    /// The instance owns it.
    pub owned_here: bool,
    /// Its committed offset (-1 when the page did not say).
    pub committed: i64,
    /// Its owner's fencing token (`None` when the page did not say).
    pub token: Option<u64>,
}

/// The per-partition samples of one scrape.
pub fn partitions(metrics: &str) -> Vec<Sample> {
    let mut owned = BTreeMap::new();
    let mut committed = BTreeMap::new();
    let mut tokens = BTreeMap::new();
    for line in metrics.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some(partition) = label(series, "partition").and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let number: f64 = value.parse().unwrap_or(f64::NAN);
        if series.starts_with("zkguard_journal_partition_owned{") {
            owned.insert(partition, number == 1.0);
        } else if series.starts_with("zkguard_journal_partition_committed_offset{") {
            committed.insert(partition, number as i64);
        } else if series.starts_with("zkguard_journal_partition_token{") {
            // Written as an integer: read exactly, not through a float.
            if let Ok(token) = value.parse::<u64>() {
                tokens.insert(partition, token);
            }
        }
    }
    owned
        .into_iter()
        .map(|(p, o)| Sample {
            partition: p,
            owned_here: o,
            committed: committed.get(&p).copied().unwrap_or(-1),
            token: tokens.get(&p).copied(),
        })
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
            for p in partitions(&text) {
                seen.push(Seen {
                    at,
                    instance,
                    partition: p.partition,
                    owned_here: p.owned_here,
                    committed: p.committed,
                    token: p.token,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_gives_each_partitions_owner_offset_and_token() {
        let page = "# TYPE zkguard_journal_partition_owned gauge
zkguard_journal_partition_owned{partition=\"0\"} 1
zkguard_journal_partition_owned{partition=\"1\"} 0
zkguard_journal_partition_committed_offset{partition=\"0\"} 17
zkguard_journal_partition_committed_offset{partition=\"1\"} 4
zkguard_journal_partition_token{partition=\"0\"} 9007199254740993
";
        assert_eq!(
            partitions(page),
            vec![
                Sample {
                    partition: 0,
                    owned_here: true,
                    committed: 17,
                    token: Some(9_007_199_254_740_993),
                },
                Sample {
                    partition: 1,
                    owned_here: false,
                    committed: 4,
                    token: None,
                },
            ]
        );
    }
}
