//! The demo workload behind `zkguard demo`: foreground "Save Content" writers and background
//! "Bulk Propagation" jobs on overlapping articles, with a report and a reconciliation.
//!
//! [`run()`] seeds a set of articles, then runs at the same time
//!
//! - foreground writers, each saving random articles one after the other (one attempt per save,
//!   through [`BackgroundExecutor::run_foreground`]: a person is waiting, so no retries);
//! - background jobs, each propagating a change to a random set of articles through the
//!   [`BackgroundExecutor`] (retries with backoff, then the dead-letter sink);
//! - a *slow editor* who holds one article's lock longer than the background retry budget, so
//!   the background operations on it are retried and finally parked as dead letters;
//! - a *stalled writer* (ZooKeeper backend only) who takes an article's lock, stalls before its
//!   write is sent while its ZooKeeper session expires and another writer saves the article, and
//!   then sends its write: Elasticsearch rejects it through the fencing token.
//!
//! Every save adds 1 to the article's `saves` field and every propagation adds 1 to its
//! `propagations` field, by guarded read-modify-write. Afterwards the parked operations of the
//! run are replayed (unless [`DemoPlan::replay`] is off) and [`reconcile`] checks every operation
//! against Elasticsearch: an applied operation must be recorded in its document, a rejected,
//! parked or lost one must not, a parked one must be in the dead-letter sink, and each article's
//! counters must equal the number of its applied operations. Any difference is a mismatch.
//!
//! Every count of the report comes from one place: the operations' records, after the
//! reconciliation has settled the uncertain ones (a failure whose write may have been applied
//! anyway) by reading their documents. Once the workload has started, [`run()`] always returns a
//! report: when Elasticsearch or the dead-letter sink cannot be read at the end, the report says
//! what was not checked ([`Reconciliation::unchecked`]) instead of failing.
//!
//! Lock wait and hold times are measured by wrapping the lock service ([`ObservedLocks`]), which
//! also counts *overtakes*: a foreground contender that got a lock while a background contender
//! that had asked for it earlier was still waiting.
//!
//! The parts: [`plan`](DemoPlan) (what a run is given), `run` and `stalled` (the actors),
//! `observe` (lock timings), `reconcile` and `report` (what the run found).
//!
//! [`BackgroundExecutor`]: zkguard::write::background::BackgroundExecutor
//! [`BackgroundExecutor::run_foreground`]:
//!     zkguard::write::background::BackgroundExecutor::run_foreground

mod observe;
mod plan;
mod reconcile;
mod report;
mod run;
mod stalled;

pub use plan::{DemoEnv, DemoError, DemoPlan, DemoProgress};
pub use run::run;
// The rest of the demo's surface: the report's types, the reconciliation and the articles'
// mappings, which the demo's tests (`tests/cli/demo.rs`) use; `zkguard demo` itself prints the
// report.
pub use {
    observe::ObservedLocks,
    reconcile::reconcile,
    report::{ClassReport, DemoReport, OpRecord, OpStatus, Percentiles, Reconciliation},
    run::article_mappings,
};
