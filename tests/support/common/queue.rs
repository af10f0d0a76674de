//! The queue of a lock in ZooKeeper, as the tests inspect it.

use crate::common::children;

/// How many children of `path` start with `prefix` (e.g. `A-` for foreground queue nodes).
pub async fn queued(servers: &str, path: &str, prefix: &str) -> usize {
    children(servers, path)
        .await
        .iter()
        .filter(|k| k.starts_with(prefix))
        .count()
}
