//! Account documents: parsing and writing them with the fields zkguard does not own kept as
//! they are, and the account operations of the coordinator (create, reset, read).

use serde_json::{json, Map, Value};

use super::coordinator::{if_match, store_err};
use super::{validate_id, Account, Coordinator, TxnError};
use crate::es::{Doc, DocMeta, EsError, Refresh, WriteCondition};

/// An account document with the fields zkguard does not own kept as they are.
pub(super) struct AccountDoc {
    pub(super) id: String,
    source: Map<String, Value>,
    pub(super) balance: i64,
    pub(super) pending: Vec<String>,
    meta: DocMeta,
}

impl AccountDoc {
    fn parse(index: &str, doc: Doc) -> Result<Self, TxnError> {
        let corrupt = |reason: &str| TxnError::Corrupt {
            index: index.into(),
            id: doc.id.clone(),
            reason: reason.into(),
        };
        let Value::Object(source) = doc.source.clone() else {
            return Err(corrupt("the source is not a JSON object"));
        };
        let balance = source
            .get("balance")
            .and_then(Value::as_i64)
            .ok_or_else(|| corrupt("field `balance` is missing or not an integer"))?;
        let pending = match source.get("pending_transactions") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| corrupt("`pending_transactions` holds something other than ids"))?,
            Some(_) => return Err(corrupt("`pending_transactions` is not a list of ids")),
        };
        Ok(Self {
            id: doc.id,
            source,
            balance,
            pending,
            meta: doc.meta,
        })
    }

    fn to_source(&self) -> Value {
        let mut m = self.source.clone();
        m.insert("balance".into(), Value::from(self.balance));
        m.insert(
            "pending_transactions".into(),
            Value::from(self.pending.clone()),
        );
        Value::Object(m)
    }

    pub(super) fn account(&self) -> Account {
        Account {
            id: self.id.clone(),
            balance: self.balance,
            pending_transactions: self.pending.clone(),
        }
    }
}

impl Coordinator {
    /// Parses an account from a search hit.
    pub(super) fn account_from_doc(&self, doc: Doc) -> Result<Option<Account>, TxnError> {
        Ok(Some(
            AccountDoc::parse(&self.settings.accounts_index, doc)?.account(),
        ))
    }

    pub(super) async fn read_account(&self, id: &str) -> Result<Option<AccountDoc>, TxnError> {
        if validate_id("account", id).is_err() {
            return Ok(None);
        }
        let index = &self.settings.accounts_index;
        let doc = self
            .retrying(|| self.store.get(index, id))
            .await
            .map_err(|e| store_err(format!("reading account `{id}`"), e))?;
        doc.map(|d| AccountDoc::parse(index, d)).transpose()
    }

    /// Writes an account conditionally on the version it was read at.
    pub(super) async fn write_account(&self, acct: &AccountDoc) -> Result<DocMeta, EsError> {
        let index = &self.settings.accounts_index;
        let source = acct.to_source();
        self.retrying(|| {
            self.store
                .index(index, &acct.id, &source, if_match(acct.meta), Refresh::No)
        })
        .await
    }

    /// Creates an account with an initial balance. Never overwrites: if the account exists with
    /// the same balance and nothing pending it returns `Ok(false)`, otherwise
    /// [`TxnError::AccountExists`].
    ///
    /// # Errors
    /// [`TxnError::InvalidId`], [`TxnError::AccountExists`], [`TxnError::Store`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: a repeated call is recognised.
    pub async fn create_account(&self, id: &str, balance: i64) -> Result<bool, TxnError> {
        validate_id("account", id)?;
        self.ensure_indices().await?;
        let index = &self.settings.accounts_index;
        let source = json!({ "balance": balance, "pending_transactions": [] });
        match self
            .retrying(|| {
                self.store
                    .index(index, id, &source, WriteCondition::Create, Refresh::No)
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(EsError::Conflict { .. }) => {
                let existing = self.read_account(id).await?;
                match existing {
                    Some(a) if a.balance == balance && a.pending.is_empty() => Ok(false),
                    Some(a) => Err(TxnError::AccountExists {
                        id: id.into(),
                        balance: a.balance,
                        pending: a.pending.len(),
                    }),
                    None => Err(TxnError::AccountExists {
                        id: id.into(),
                        balance: 0,
                        pending: 0,
                    }),
                }
            }
            Err(e) => Err(store_err(format!("creating account `{id}`"), e)),
        }
    }

    /// Overwrites an account with `balance` and no pending transactions, whatever it held.
    /// Meant for demos and tests: doing it while transactions touch the account breaks the
    /// conservation of units.
    ///
    /// # Errors
    /// [`TxnError::InvalidId`], [`TxnError::Store`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: the write is idempotent.
    pub async fn reset_account(&self, id: &str, balance: i64) -> Result<(), TxnError> {
        validate_id("account", id)?;
        self.ensure_indices().await?;
        let index = &self.settings.accounts_index;
        let source = json!({ "balance": balance, "pending_transactions": [] });
        self.retrying(|| {
            self.store
                .index(index, id, &source, WriteCondition::Always, Refresh::No)
        })
        .await
        .map(|_| ())
        .map_err(|e| store_err(format!("resetting account `{id}`"), e))
    }

    /// Reads an account (realtime).
    ///
    /// # Errors
    /// [`TxnError::Store`], [`TxnError::Corrupt`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: read only.
    pub async fn account(&self, id: &str) -> Result<Option<Account>, TxnError> {
        Ok(self.read_account(id).await?.map(|a| a.account()))
    }
}
