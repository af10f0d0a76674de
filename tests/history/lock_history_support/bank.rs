//! The bank history through `zkguard serve`: what the depositors were told ([`Write`],
//! [`BankHistory`]) and the checker over the final documents ([`check_bank`]).
//!
//! An account is one document `{"balance": N, "credits": {KEY: AMOUNT, ...}, "rmw": {KEY:
//! AMOUNT, ...}}`. Every write adds one key that no other write uses, so each acknowledged
//! write can be looked for in the final state by its key:
//!
//! - a deposit (a gate `_update`, a plain `_bulk` item, a `/v1` merge patch, a `/v1` background
//!   update) adds `credits.KEY = AMOUNT` to one account;
//! - a transfer (an atomic `_bulk`, `POST /v1/transactions`) adds `credits.KEY = -AMOUNT` to one
//!   account and `credits.KEY = +AMOUNT` to another, all or nothing;
//! - a read-modify-write `PUT` with `if_seq_no`/`if_primary_term` adds AMOUNT to `balance` and
//!   records `rmw.KEY = AMOUNT`: a write lost, doubled or built on a stale read shows as a
//!   `balance` that is not the initial balance plus the recorded amounts.
//!
//! Every write also sets the register `last` to its key: the final `last` of an account must be
//! the write acknowledged with the highest token on it (by token order, the last acknowledged
//! one), or one whose answer was lost (which may have come after it).
//!
//! A write replaces no other write's key (a `PUT` sends back every key it read, and its
//! condition refuses it if the document changed since), so "every acknowledged write present
//! unless overwritten by a later acknowledged write" is here: every acknowledged key present.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::Value;

/// The balance every account starts with.
pub const INITIAL: i64 = 1000;

/// How a write was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Via {
    /// `POST /{index}/_update/{id}` through the gate, a partial document.
    GateUpdate,
    /// An `update` item of a plain `_bulk` through the gate.
    GateBulk,
    /// `GET` then `PUT /{index}/_doc/{id}?if_seq_no=..&if_primary_term=..` through the gate.
    GateRmw,
    /// A transfer as a `_bulk` with `X-Zkguard-Atomic: true`.
    AtomicBulk,
    /// `PATCH /v1/indices/{index}/docs/{id}` (foreground).
    V1Patch,
    /// A transfer as `POST /v1/transactions`.
    V1Txn,
    /// An `update` line of `POST /v1/bulk` (background: 202, then applied or parked).
    V1Background,
}

impl Via {
    pub const ALL: [Via; 7] = [
        Via::GateUpdate,
        Via::GateBulk,
        Via::GateRmw,
        Via::AtomicBulk,
        Via::V1Patch,
        Via::V1Txn,
        Via::V1Background,
    ];

    /// Whether the write is a document transaction (its outcome can be read back by its id).
    pub fn is_txn(self) -> bool {
        matches!(self, Via::AtomicBulk | Via::V1Txn)
    }
}

/// What the client was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A 2xx (for a background operation: 202, accepted).
    Acked,
    /// An answer saying nothing was written (4xx, a rolled-back transaction, a connection
    /// refused before the request was sent).
    Failed,
    /// No answer, or one that does not say (5xx, a timeout, a connection lost mid-request).
    Unknown,
}

/// One write and what its client was told.
#[derive(Clone, Debug)]
pub struct Write {
    pub via: Via,
    pub key: String,
    /// The accounts it changes, with the amount each gets.
    pub parts: Vec<(String, i64)>,
    /// The fencing token each part was acknowledged with (its `_version`), where the answer
    /// told it; a background operation's comes from its outcome
    /// ([`BankHistory::background_tokens`]).
    pub tokens: Vec<Option<u64>>,
    pub outcome: Outcome,
    /// What the client was told, for the report (status and error type).
    pub answer: String,
}

impl Write {
    /// The field of the account its key goes in.
    fn field(&self) -> &'static str {
        if self.via == Via::GateRmw {
            "rmw"
        } else {
            "credits"
        }
    }
}

/// Everything the run recorded, and what the service said afterwards about the operations
/// that are decided after their answer.
#[derive(Default, Debug)]
pub struct BankHistory {
    pub writes: Vec<Write>,
    /// Final status of every background operation (by key): `applied`, `parked`, `rejected`,
    /// `queued` (still, after the wait) or `unknown` (404).
    pub background: HashMap<String, String>,
    /// The token of every background operation applied.
    pub background_tokens: HashMap<String, u64>,
    /// Decision of every transaction (by id) as `GET /v1/transactions/{id}` tells it:
    /// `committed`, `rolled-back`, `undecided` or `unknown` (404).
    pub decisions: HashMap<String, String>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, usize>,
}

/// The checker's verdict and the counts of the run.
#[derive(Default, Debug)]
pub struct BankReport {
    pub violations: Vec<String>,
    /// (acked, failed, unknown) per kind of write.
    pub counts: BTreeMap<Via, (usize, usize, usize)>,
    /// Unknown outcomes found applied, found not applied.
    pub unknown_applied: usize,
    pub unknown_absent: usize,
    pub background_applied: usize,
    pub background_parked: usize,
    pub total: i64,
    /// How many writes not done or unknown got each answer (status and error type).
    pub answers: BTreeMap<String, usize>,
}

impl fmt::Display for BankReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (via, (a, x, u)) in &self.counts {
            writeln!(f, "  {via:?}: {a} acknowledged, {x} failed, {u} unknown")?;
        }
        writeln!(
            f,
            "  unknown outcomes: {} applied, {} not applied; background: {} applied, {} parked; \
             total of the accounts {}",
            self.unknown_applied,
            self.unknown_absent,
            self.background_applied,
            self.background_parked,
            self.total
        )?;
        writeln!(f, "  answers of the writes not done or unknown:")?;
        for (answer, n) in &self.answers {
            writeln!(f, "    {n:6}  {answer}")?;
        }
        write!(f, "  violations: {}", self.violations.len())
    }
}

/// What the final state must show of one write: `Some(true)` applied, `Some(false)` not
/// applied, `None` either.
fn expected(w: &Write, h: &BankHistory, v: &mut Vec<String>) -> Option<bool> {
    if w.via == Via::V1Background {
        let status = h.background.get(&w.key).map(String::as_str);
        return match (w.outcome, status) {
            (Outcome::Failed, _) => Some(false),
            (_, Some("applied")) => Some(true),
            (_, Some("parked" | "rejected")) => Some(false),
            (Outcome::Unknown, Some("unknown") | None) => Some(false),
            (_, s) => {
                v.push(format!(
                    "background operation {} ({}) ends {s:?}: neither applied nor parked",
                    w.key, w.answer
                ));
                None
            }
        };
    }
    let decision = w
        .via
        .is_txn()
        .then(|| h.decisions.get(&w.key).map(String::as_str))
        .flatten();
    match (w.outcome, decision) {
        (Outcome::Acked, Some("rolled-back")) => {
            v.push(format!(
                "transaction {} was acknowledged ({}) but is logged rolled-back",
                w.key, w.answer
            ));
            Some(true)
        }
        (Outcome::Acked, _) => Some(true),
        (Outcome::Failed, Some("committed")) => {
            v.push(format!(
                "transaction {} was answered failed ({}) but is logged committed",
                w.key, w.answer
            ));
            Some(false)
        }
        (Outcome::Failed, _) => Some(false),
        (Outcome::Unknown, Some("committed")) => Some(true),
        (Outcome::Unknown, Some("rolled-back")) => Some(false),
        (Outcome::Unknown, Some("undecided")) => {
            v.push(format!(
                "transaction {} is still undecided after the run",
                w.key
            ));
            None
        }
        (Outcome::Unknown, _) => None,
    }
}

/// The amount stored under `key` in `field` of `account`, if any.
fn stored(finals: &HashMap<String, Value>, account: &str, field: &str, key: &str) -> Option<i64> {
    finals.get(account)?[field].get(key)?.as_i64()
}

/// Checks the final documents (`account -> _source`) against the history.
pub fn check_bank(h: &BankHistory, finals: &HashMap<String, Value>) -> BankReport {
    let mut r = BankReport::default();
    let mut v = Vec::new();
    let mut known: HashMap<(&str, &str, &str), i64> = HashMap::new();
    for w in &h.writes {
        let c = r.counts.entry(w.via).or_default();
        match w.outcome {
            Outcome::Acked => c.0 += 1,
            Outcome::Failed => c.1 += 1,
            Outcome::Unknown => c.2 += 1,
        }
        if w.outcome != Outcome::Acked {
            let answer: String = w.answer.chars().take(70).collect();
            *r.answers.entry(answer).or_default() += 1;
        }
        let field = w.field();
        let mut present = Vec::new();
        for (account, amount) in &w.parts {
            known.insert((account, field, &w.key), *amount);
            let got = stored(finals, account, field, &w.key);
            if got.is_some_and(|g| g != *amount) {
                v.push(format!(
                    "{:?} {} on {account}: stored {got:?}, written {amount}",
                    w.via, w.key
                ));
            }
            present.push(got.is_some());
        }
        let applied = present[0];
        if present.iter().any(|p| *p != applied) {
            v.push(format!(
                "{:?} {} ({}) is half applied: {:?} on {:?}",
                w.via, w.key, w.answer, present, w.parts
            ));
        }
        match expected(w, h, &mut v) {
            Some(true) if !applied => v.push(format!(
                "{:?} {} on {:?} was acknowledged ({}) and is lost",
                w.via, w.key, w.parts, w.answer
            )),
            Some(false) if applied => v.push(format!(
                "{:?} {} on {:?} was not applied ({}) but is in the final state",
                w.via, w.key, w.parts, w.answer
            )),
            _ => {}
        }
        if w.outcome == Outcome::Unknown {
            if applied {
                r.unknown_applied += 1;
            } else {
                r.unknown_absent += 1;
            }
        }
        if w.via == Via::V1Background {
            match h.background.get(&w.key).map(String::as_str) {
                Some("applied") => r.background_applied += 1,
                Some("parked") => r.background_parked += 1,
                _ => {}
            }
        }
    }
    check_accounts(finals, &known, &mut r, &mut v);
    for account in finals.keys() {
        check_last(h, finals, account, &mut v);
    }
    let expected_total = finals.len() as i64 * INITIAL + applied_deposits(h, finals);
    if r.total != expected_total {
        v.push(format!(
            "the accounts hold {} in total, the initial balances plus the deposits found \
             applied make {expected_total}: transfers did not conserve the total",
            r.total
        ));
    }
    r.violations = v;
    r
}

/// Per account: no transaction mark left, no key no write made, and `balance` the initial
/// balance plus the read-modify-writes it records; the total conserved by transfers.
fn check_accounts(
    finals: &HashMap<String, Value>,
    known: &HashMap<(&str, &str, &str), i64>,
    r: &mut BankReport,
    v: &mut Vec<String>,
) {
    let mut accounts: Vec<_> = finals.iter().collect();
    accounts.sort_by(|a, b| a.0.cmp(b.0));
    for (account, doc) in accounts {
        if let Some(txn) = doc["zkguard"].get("txn") {
            v.push(format!(
                "{account} still carries the mark of transaction {txn}"
            ));
        }
        if doc["zkguard"]["deleted"] == true {
            v.push(format!("{account} is a transaction's tombstone: {doc}"));
        }
        let sum = |field: &str, v: &mut Vec<String>| -> i64 {
            let map = doc[field].as_object().cloned().unwrap_or_default();
            let mut total = 0;
            for (key, amount) in map {
                let amount = amount.as_i64().unwrap_or(0);
                if !known.contains_key(&(account.as_str(), field, key.as_str())) {
                    v.push(format!(
                        "{account}: {field}.{key} = {amount} was written by no one"
                    ));
                }
                total += amount;
            }
            total
        };
        let rmw = sum("rmw", v);
        let credits = sum("credits", v);
        let balance = doc["balance"].as_i64().unwrap_or(i64::MIN);
        if balance != INITIAL + rmw {
            v.push(format!(
                "{account}: balance {balance}, but the initial {INITIAL} plus the \
                 read-modify-writes it records make {}",
                INITIAL + rmw
            ));
        }
        r.total += balance + credits;
    }
}

/// The sum of the single-account deposits found applied: with transfers conserving the total,
/// the accounts must hold the initial balances plus exactly this.
fn applied_deposits(h: &BankHistory, finals: &HashMap<String, Value>) -> i64 {
    h.writes
        .iter()
        .filter(|w| w.parts.len() == 1)
        .filter_map(|w| stored(finals, &w.parts[0].0, w.field(), &w.key))
        .sum()
}

/// The register `last` of `account` holds the key of the write acknowledged with the highest
/// token there (one of them, when several share it: operations applied under one background
/// acquisition), or of a write not answered as failed whose token is unknown.
fn check_last(
    h: &BankHistory,
    finals: &HashMap<String, Value>,
    account: &str,
    v: &mut Vec<String>,
) {
    let mut newest: Option<(u64, Vec<&str>)> = None;
    let mut open: Vec<&str> = Vec::new();
    for w in &h.writes {
        let Some(i) = w.parts.iter().position(|(a, _)| a == account) else {
            continue;
        };
        let token = if w.via == Via::V1Background {
            match h.background.get(&w.key).map(String::as_str) {
                Some("applied") => h.background_tokens.get(&w.key).copied(),
                _ => continue,
            }
        } else {
            match w.outcome {
                Outcome::Failed => continue,
                Outcome::Unknown => None,
                Outcome::Acked => w.tokens.get(i).copied().flatten(),
            }
        };
        match (token, &mut newest) {
            (None, _) => open.push(&w.key),
            (Some(t), Some((n, keys))) if t == *n => keys.push(&w.key),
            (Some(t), Some((n, _))) if t < *n => {}
            (Some(t), _) => newest = Some((t, vec![&w.key])),
        }
    }
    let last = finals[account]["last"].as_str();
    let fine = match (&newest, last) {
        (None, None) => true,
        (_, Some(l)) => open.contains(&l) || newest.as_ref().is_some_and(|(_, k)| k.contains(&l)),
        (Some(_), None) => false,
    };
    if !fine {
        v.push(format!(
            "{account}: the last write is {last:?}, but the newest acknowledged write by token \
             order is {newest:?}: a newer write was overwritten by an older one"
        ));
    }
}
