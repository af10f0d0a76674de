//! The decisions of document transactions, without I/O: whether a marked document is a
//! transaction's own write, what a writer that finds a mark under its lock does, what recovery
//! does given the log state it read under fresh locks, and what it writes to each document.
//!
//! The engine ([`super::Transactions`]: the coordinator, recovery and the writers that settle
//! marks) calls these functions with [`Rules::PRODUCT`]; the model check
//! (`crates/zkguard/tests/lock_model.rs`, `lock_model_support::txn`) explores the same functions against a
//! model of Elasticsearch documents, with broken variants ([`TxnFlaw`]) that must each produce a
//! counterexample. A change here is a change of both.

use super::MultiState;

/// A broken variant of the decisions, for the model check only: each must be caught.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnFlaw {
    /// Any document carrying a transaction's mark is taken for the transaction's own write,
    /// whatever its version (the behaviour before recovery compared the stamp's token with the
    /// document's `_version`): a later writer's copy of the mark is finished or undone over.
    TrustAnyMark,
    /// A writer that finds the mark of an undecided transaction builds on the marked write
    /// instead of undoing it first.
    BuildOnUndecided,
    /// Recovery undoes a committed transaction that is not finished yet, as it undoes an
    /// undecided one.
    UndoCommitted,
    /// Recovery undoes a pending transaction without moving its log to `rolling-back` first:
    /// nothing stops a stalled coordinator's commit in between.
    UndoWithoutMovingTheLog,
    /// A writer leaves a final transaction's own write as it read it (the behaviour before the
    /// model check found a gate `_update` building on a write that a stalled coordinator's own
    /// undo had just reverted).
    FinalMarkLeft,
}

/// The decision rules: [`Rules::PRODUCT`] in production; a [`TxnFlaw`] in the model's mutants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Rules {
    /// The broken variant, if any.
    #[doc(hidden)]
    pub flaw: Option<TxnFlaw>,
}

/// What a writer holding a document's lock does with the mark of transaction `t` it found on
/// the document (the coordinator of `t` is gone: a live one holds the lock until its marks are
/// cleared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnMark {
    /// Nothing: no such transaction, or a mark that is not its own write. The writer writes
    /// without the mark.
    Leave,
    /// `t` is committed (or finished): write its after-image of this document, unmarked, with the writer's
    /// token (delete it when the operation deletes).
    Finish,
    /// `t` is undecided: move its log `pending → rolling-back` (a conditional write; the loser
    /// of a race reads the log again and decides anew), then [`OnMark::Restore`].
    MoveThenRestore,
    /// `t` is rolling back (or rolled back): write the document's logged before-image with the writer's token
    /// (delete it when it was absent).
    Restore,
}

/// What recovery does with a transaction whose log state it read under fresh locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Recovery {
    /// It is final: nothing.
    Nothing,
    /// It is committed: finish every document still carrying its own mark, then `finished`.
    Finish,
    /// It is undecided: move the log to `rolling-back` first when `move_log` (it says
    /// `pending`), undo every document, then `rolled-back`.
    RollBack {
        /// Whether the log must go `pending → rolling-back` before any document is touched.
        move_log: bool,
    },
}

/// How a transaction is being settled on its documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Settle {
    /// Committed: the marked writes become their unmarked after-images.
    Finish,
    /// Undone: the marked writes get their before-images back; with `fence_all` (recovery) every
    /// other participant that exists is rewritten as it is with the recovery's token.
    RollBack {
        /// Whether unmarked participants are rewritten (fencing a stalled coordinator).
        fence_all: bool,
    },
}

/// What settling a transaction writes to one of its documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DocStep {
    /// Nothing.
    Leave,
    /// The after-image, unmarked (a delete's tombstone is deleted).
    After,
    /// The logged before-image (deleted when the document was absent before).
    Before,
    /// The document as it is, with the settler's token, without this transaction's mark.
    Fence,
}

impl Rules {
    /// The rules zkguard runs.
    pub const PRODUCT: Rules = Rules { flaw: None };

    fn has(self, flaw: TxnFlaw) -> bool {
        self.flaw == Some(flaw)
    }

    /// Whether a document that carries a transaction's mark is that transaction's own write:
    /// every transaction step (the coordinator's marked write, a fencing rewrite by another
    /// transaction's recovery) writes its stamp's token (`stamp_token`) as the document's
    /// external `version`. A later writer that copied the `zkguard` object along with the
    /// document carries its own version instead. A document read without its version (`-1`)
    /// counts as the transaction's.
    pub fn own_write(self, stamp_token: Option<u64>, version: i64) -> bool {
        version < 0
            || self.has(TxnFlaw::TrustAnyMark)
            || stamp_token.is_some_and(|t| i64::try_from(t).is_ok_and(|t| t == version))
    }

    /// What a writer that found a mark does, given the state of the marking transaction's log
    /// (`None`: no such log) and whether the document is its own write ([`Rules::own_write`]).
    pub fn on_mark(self, state: Option<MultiState>, own_write: bool) -> OnMark {
        let Some(state) = state else {
            return OnMark::Leave;
        };
        if !own_write {
            return OnMark::Leave;
        }
        // A final transaction's own write still on the document was read before a settler
        // without the lock landed its write (a stalled coordinator undoing or clearing its own
        // transaction with its old tokens): it is settled again as the log says, which writes
        // what that settler wrote, and the writer reads the document again. Left alone, the
        // writer would build on the write as it read it.
        match state {
            MultiState::Finished | MultiState::RolledBack if self.has(TxnFlaw::FinalMarkLeft) => {
                OnMark::Leave
            }
            MultiState::Committed | MultiState::Finished => OnMark::Finish,
            MultiState::RollingBack | MultiState::RolledBack => OnMark::Restore,
            MultiState::Pending if self.has(TxnFlaw::BuildOnUndecided) => OnMark::Leave,
            MultiState::Pending => OnMark::MoveThenRestore,
        }
    }

    /// What recovery does with a transaction whose log says `state` (read under its locks).
    pub fn recovery(self, state: MultiState) -> Recovery {
        match state {
            MultiState::Finished | MultiState::RolledBack => Recovery::Nothing,
            MultiState::Committed if !self.has(TxnFlaw::UndoCommitted) => Recovery::Finish,
            MultiState::Committed => Recovery::RollBack { move_log: false },
            MultiState::Pending => Recovery::RollBack {
                move_log: !self.has(TxnFlaw::UndoWithoutMovingTheLog),
            },
            MultiState::RollingBack => Recovery::RollBack { move_log: false },
        }
    }

    /// What settling a transaction (`how`) writes to one of its documents, given whether the
    /// document carries its mark as its own write (`marked_own`) and whether it exists.
    pub fn settle_doc(self, how: Settle, marked_own: bool, exists: bool) -> DocStep {
        match how {
            Settle::Finish if marked_own => DocStep::After,
            Settle::Finish => DocStep::Leave,
            Settle::RollBack { .. } if marked_own => DocStep::Before,
            Settle::RollBack { fence_all: true } if exists => DocStep::Fence,
            Settle::RollBack { .. } => DocStep::Leave,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copied_mark_is_not_the_transactions_write() {
        let rules = Rules::PRODUCT;
        assert!(rules.own_write(Some(7), 7));
        assert!(!rules.own_write(Some(7), 9));
        assert!(rules.own_write(Some(7), -1));
        assert_eq!(
            rules.on_mark(Some(MultiState::Committed), false),
            OnMark::Leave
        );
        assert_eq!(
            rules.on_mark(Some(MultiState::Committed), true),
            OnMark::Finish
        );
        assert_eq!(
            rules.on_mark(Some(MultiState::Pending), true),
            OnMark::MoveThenRestore
        );
        assert_eq!(rules.on_mark(None, true), OnMark::Leave);
        // A final transaction's own write read before a late settler's write landed.
        assert_eq!(
            rules.on_mark(Some(MultiState::RolledBack), true),
            OnMark::Restore
        );
        assert_eq!(
            rules.on_mark(Some(MultiState::Finished), true),
            OnMark::Finish
        );
        assert_eq!(
            rules.on_mark(Some(MultiState::RolledBack), false),
            OnMark::Leave
        );
    }

    #[test]
    fn recovery_finishes_committed_and_undoes_the_rest() {
        let rules = Rules::PRODUCT;
        assert_eq!(rules.recovery(MultiState::Committed), Recovery::Finish);
        assert_eq!(
            rules.recovery(MultiState::Pending),
            Recovery::RollBack { move_log: true }
        );
        assert_eq!(
            rules.settle_doc(Settle::RollBack { fence_all: true }, false, true),
            DocStep::Fence
        );
        assert_eq!(
            rules.settle_doc(Settle::RollBack { fence_all: false }, false, true),
            DocStep::Leave
        );
        assert_eq!(
            rules.settle_doc(Settle::Finish, false, true),
            DocStep::Leave
        );
    }
}
