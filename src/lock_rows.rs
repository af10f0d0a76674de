//! The Elasticsearch lease lock's documents as rows of JSON: what `zkguard locks --json` prints,
//! and what `zkguard serve` answers on its lock routes and shows on its status page.

/// The lease documents of the Elasticsearch lock, as `zkguard locks --json` prints them: every
/// monitor, or only `monitor`.
///
/// # Errors
/// Elasticsearch errors reading the lock index.
pub async fn es_rows(
    service: &zkguard::eslock::EsLockService,
    monitor: Option<&str>,
) -> Result<Vec<serde_json::Value>, zkguard::LockError> {
    let statuses = match monitor {
        Some(m) => service.status(m).await?.into_iter().collect(),
        None => service.list().await?,
    };
    let mut rows = Vec::new();
    for s in &statuses {
        rows.push(es_row(service, s).await?);
    }
    Ok(rows)
}

/// One lease document of the Elasticsearch lock, as `zkguard locks --json` prints it, with its
/// foreground waiters counted.
///
/// # Errors
/// Elasticsearch errors reading the waiters.
pub async fn es_row(
    service: &zkguard::eslock::EsLockService,
    status: &zkguard::eslock::EsLockStatus,
) -> Result<serde_json::Value, zkguard::LockError> {
    let r = &status.record;
    let waiters = service.foreground_waiters(&r.monitor).await?.len();
    Ok(serde_json::json!({
        "monitor": r.monitor,
        "state": format!("{:?}", r.state).to_lowercase(),
        "owner": r.owner,
        "info": r.info,
        "lock_type": r.lock_type,
        "token": r.token,
        "acquired_ms": r.acquired,
        "expires_ms": r.expires,
        "takeable": status.takeable,
        "foreground_waiters": waiters,
    }))
}
