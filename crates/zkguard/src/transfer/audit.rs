//! The audit: balances, transactions per state, pending ids and their consistency.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::json;

use super::coordinator::Coordinator;
use super::{TxnError, TxnState};
use crate::es::EsError;

/// The most documents one audit reads per index and per state (Elasticsearch's default
/// `index.max_result_window`). Larger indices are reported as truncated.
pub const AUDIT_LIMIT: usize = 10_000;

/// The state of the accounts and of the transaction log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Audit {
    /// Number of accounts.
    pub accounts: usize,
    /// Sum of all balances: unchanged by transfers, whatever state they are in.
    pub total_balance: i64,
    /// Transactions per state (every state listed, zeros included).
    pub transactions: BTreeMap<TxnState, usize>,
    /// Accounts with pending transaction ids, and those ids.
    pub pending: BTreeMap<String, Vec<String>>,
    /// Accounts with a negative balance.
    pub negative: BTreeMap<String, i64>,
    /// Inconsistencies: a pending id whose transaction is missing or in a state that cannot
    /// have pending ids (`created`, `finished`, `rolled-back`), or a total that does not fit.
    pub anomalies: Vec<String>,
    /// Whether an index held more than [`AUDIT_LIMIT`] documents of a kind (counts are then
    /// lower bounds and the total covers the first ones only).
    pub truncated: bool,
}

impl Audit {
    /// Transactions in `created`, `pending`, `committed` or `terminating`.
    pub fn in_flight(&self) -> usize {
        TxnState::IN_FLIGHT
            .iter()
            .map(|s| self.transactions.get(s).copied().unwrap_or(0))
            .sum()
    }

    /// Nothing in flight, no pending id anywhere, no anomaly.
    pub fn is_settled(&self) -> bool {
        self.in_flight() == 0 && self.pending.is_empty() && self.anomalies.is_empty()
    }
}

impl Coordinator {
    /// Audits the accounts and the transaction log (after a refresh of both indices).
    ///
    /// Meant for a quiet system: while transfers run, the reads are not one snapshot, so the
    /// total may include a transfer applied to one account and not yet to the other. A pending id
    /// that looks wrong is re-checked on its account before it is reported.
    ///
    /// # Errors
    /// [`TxnError::Store`], [`TxnError::Corrupt`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: read only.
    pub async fn audit(&self) -> Result<Audit, TxnError> {
        self.ensure_indices().await?;
        let accounts_index = &self.settings.accounts_index;
        let txn_index = &self.settings.transactions_index;
        let store_err = |context: &str, e: EsError| TxnError::Store {
            context: context.into(),
            source: e,
        };
        for index in [accounts_index, txn_index] {
            self.retrying(|| self.store.refresh(index))
                .await
                .map_err(|e| store_err("refreshing for the audit", e))?;
        }
        let mut audit = Audit::default();

        let body = json!({ "size": AUDIT_LIMIT, "query": { "match_all": {} } });
        let docs = self
            .retrying(|| self.store.search(accounts_index, &body))
            .await
            .map_err(|e| store_err("reading the accounts", e))?;
        audit.truncated |= docs.len() >= AUDIT_LIMIT;
        audit.accounts = docs.len();
        let mut overflow = false;
        for doc in docs {
            let id = doc.id.clone();
            let Some(account) = self.account_from_doc(doc)? else {
                continue;
            };
            audit.total_balance = audit
                .total_balance
                .checked_add(account.balance)
                .unwrap_or_else(|| {
                    overflow = true;
                    i64::MAX
                });
            if account.balance < 0 {
                audit.negative.insert(id.clone(), account.balance);
            }
            if !account.pending_transactions.is_empty() {
                audit.pending.insert(id, account.pending_transactions);
            }
        }
        if overflow {
            audit
                .anomalies
                .push("the sum of the balances overflows a 64-bit integer".into());
        }

        for state in TxnState::ALL {
            let body = json!({
                "size": AUDIT_LIMIT,
                "_source": ["transaction_state"],
                "query": { "bool": { "filter": [ { "term": { "transaction_state": state.as_str() } } ] } }
            });
            let hits = self
                .retrying(|| self.store.search(txn_index, &body))
                .await
                .map_err(|e| store_err("counting transactions", e))?;
            audit.truncated |= hits.len() >= AUDIT_LIMIT;
            audit.transactions.insert(state, hits.len());
        }

        let ids: BTreeSet<&String> = audit.pending.values().flatten().collect();
        let mut anomalies = Vec::new();
        for id in ids {
            let state = self.read_txn(id).await?.map(|t| t.state);
            if matches!(
                state,
                Some(TxnState::Pending | TxnState::Committed | TxnState::Terminating)
            ) {
                continue;
            }
            for (account, pending) in &audit.pending {
                if !pending.contains(id) {
                    continue;
                }
                // Re-read: a live worker may have settled it since the search.
                let still = self
                    .account(account)
                    .await?
                    .is_some_and(|a| a.pending_transactions.contains(id));
                if still {
                    anomalies.push(match state {
                        None => format!("account `{account}` has pending id `{id}` but there is no such transaction"),
                        Some(s) => format!("account `{account}` has pending id `{id}` of a {s} transaction"),
                    });
                }
            }
        }
        audit.anomalies.extend(anomalies);
        Ok(audit)
    }
}
