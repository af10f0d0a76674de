//! The model check of the lock's protocol: clients running zkguard's own sans-IO core
//! (`zkguard::zk::protocol`, the code the lock runs in production) against a model of
//! ZooKeeper's client-visible semantics (`lock_model_support::zk`), explored by `stateright`.
//!
//! The explorer interleaves every request, answer and watch event of foreground and background
//! clients, and injects faults: a connection lost with some of the requests in flight applied
//! and their answers lost (the session then reads from a server that lags behind them until a
//! `sync` or a write), a session expiry, an acquisition cancelled mid-request (its
//! clean-up then runs on the session's reaper), time passing to a deadline or to a starving
//! background waiter's promotion (the core decides both from the time it is given, and says
//! when it needs to be woken, `Acquisition::poll_timeout`), the container reaper deleting an
//! emptied monitor. Releases run beside the same client's next acquisition, on the same session,
//! as `LockGuard::release` does; the core decides whether a release rides in the next
//! acquisition's first multi, and what each session learned (its ACL's refusals, a monitor's
//! contention, which skips the fast path) carries over to its next acquisitions.
//!
//! Properties: at most one holder with a live session at any state; fencing tokens (the
//! zxids of the takes) strictly increase in holding order; a background contender's take does
//! not become a hold while a foreground node queued before the take is still there, nor any
//! take while a waiter whose node sorts before the taker's is still there; a live
//! holder whose mutex nobody deleted owns the mutex it
//! took and its queue node (so inspection never calls it stray); no waiter sleeps past its
//! deadline or its promotion; nothing is left under the
//! monitor once every client finished; every client finishes (no waiter stuck while nobody
//! holds the lock).
//!
//! Small configurations are explored exhaustively, larger ones by random walks; the broken
//! variants of the core (`Flaw`) must each produce a counterexample.
//!
//! `ZKGUARD_MODEL_REPORT=1` prints the numbers of states explored.

mod lock_model_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use lock_model_support::txn::{Kind, Op, TxnModel};
use lock_model_support::{LockModel, Move, World};
use stateright::{Checker, Chooser, HasDiscoveries, Model, UniformChooser};
use zkguard::txn::multi::decide::{Rules, TxnFlaw};
use zkguard::zk::protocol::Flaw;

fn report<M: Model>(name: &str, checker: &impl Checker<M>) {
    if std::env::var_os("ZKGUARD_MODEL_REPORT").is_some() {
        let properties: Vec<&str> = checker
            .model()
            .properties()
            .iter()
            .map(|p| p.name)
            .collect();
        eprintln!(
            "{name}: {} states ({} unique), max depth {}; properties: {}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth(),
            properties.join("; ")
        );
    }
}

/// A configuration: `clients` (foreground, has a deadline, locks in a row) and `faults`, with
/// promotion, the ACL fallback, carried releases, an operator and flaws off.
fn model(clients: Vec<(bool, bool, u8)>, faults: u8) -> LockModel {
    LockModel {
        clients,
        faults,
        promotion: false,
        acl_fallback: false,
        carry: false,
        handover: false,
        operator: false,
        sync_catches_up: true,
        flaw: None,
        prefix: Vec::new(),
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Explores every interleaving of `model` and asserts every property.
fn exhaustive(name: &str, model: LockModel) {
    let checker = model.checker().threads(threads()).spawn_bfs().join();
    report(name, &checker);
    checker.assert_properties();
}

/// Explores every interleaving of `model` depth first and asserts every property: the
/// explorer keeps the states' fingerprints and the path it is on, not a queue of whole states
/// (a breadth-first search of the large scopes holds millions of them, gigabytes).
fn exhaustive_dfs<M>(name: &str, model: M)
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let started = std::time::Instant::now();
    let checker = model.checker().threads(threads()).spawn_dfs();
    let mut said = started;
    while !checker.is_done() {
        std::thread::sleep(Duration::from_millis(200));
        if std::env::var_os("ZKGUARD_MODEL_REPORT").is_some() && said.elapsed().as_secs() >= 30 {
            said = std::time::Instant::now();
            eprintln!(
                "{name}: {} unique states so far ({} s)",
                checker.unique_state_count(),
                started.elapsed().as_secs()
            );
        }
    }
    let checker = checker.join();
    report(
        &format!("{name} ({} s)", started.elapsed().as_secs()),
        &checker,
    );
    checker.assert_properties();
}

#[test]
fn two_clients_two_cycles_with_a_fault_hold_every_property() {
    exhaustive(
        "2 clients x 2 cycles, 1 fault",
        model(vec![(true, false, 2), (false, false, 2)], 1),
    );
}

#[test]
fn three_clients_one_cycle_with_a_fault_hold_every_property() {
    exhaustive(
        "3 clients x 1 cycle, 1 fault",
        model(
            vec![(true, false, 1), (false, false, 1), (true, false, 1)],
            1,
        ),
    );
}

#[test]
fn deadlines_and_promotion_hold_every_property() {
    exhaustive(
        "2 clients x 1 cycle, deadlines, promotion, 1 fault",
        LockModel {
            promotion: true,
            ..model(vec![(true, true, 1), (false, true, 1)], 1)
        },
    );
}

#[test]
fn sessions_that_may_not_write_monitor_nodes_hold_every_property() {
    exhaustive(
        "2 clients x 2 cycles, ACL fallback, 1 fault",
        LockModel {
            acl_fallback: true,
            ..model(vec![(true, false, 2), (false, false, 2)], 1)
        },
    );
}

#[test]
fn going_from_lock_to_lock_with_the_release_carried_holds_every_property() {
    exhaustive(
        "2 clients x 2 cycles, release_and_acquire, 1 fault",
        LockModel {
            carry: true,
            ..model(vec![(true, false, 2), (false, false, 2)], 1)
        },
    );
}

/// Foreground clients going from lock to lock with `release_and_acquire`: a new queue node
/// created in the release's multi watches the node two sequence numbers before it, without
/// listing the queue, where that node was created before the released lock's take; beside
/// them a background client, and a fault.
#[test]
fn the_node_ahead_found_without_a_listing_holds_every_property() {
    exhaustive(
        "2 foreground clients x 2 cycles, release_and_acquire, 1 fault",
        LockModel {
            carry: true,
            ..model(vec![(true, false, 2), (true, false, 2)], 1)
        },
    );
    exhaustive(
        "3 clients x 2+1+1 cycles, release_and_acquire",
        LockModel {
            carry: true,
            ..model(
                vec![(true, false, 2), (true, false, 1), (false, false, 1)],
                0,
            )
        },
    );
}

/// The node two sequence numbers before a new queue node trusted as the node ahead without
/// its creation-order check: another foreground contender's node, created between the two
/// after the released lock's take, is overtaken.
#[test]
fn a_node_ahead_guessed_without_its_creation_order_is_caught() {
    counterexample(
        LockModel {
            carry: true,
            flaw: Some(Flaw::GuessUnordered),
            ..model(
                vec![(true, false, 2), (true, false, 1), (true, false, 1)],
                0,
            )
        },
        &["no waiter is overtaken by a contender queued behind it"],
    );
}

/// A core that asks to be woken only at its deadline: a starving background waiter sleeps past
/// its promotion (its driver's sleep follows `Acquisition::poll_timeout`).
#[test]
fn a_wake_up_that_ignores_the_promotion_is_caught() {
    counterexample(
        LockModel {
            promotion: true,
            flaw: Some(Flaw::WakeOnlyAtDeadline),
            ..model(vec![(true, false, 1), (false, true, 1)], 0)
        },
        &["no waiter sleeps past a moment it must act on"],
    );
}

/// An operator deletes `privateLock` under a holder that does not see it: the next in line
/// takes the lock (the old holder's writes are fenced), and the old holder's release, checked
/// against the monitor's data version, leaves the new holder's mutex alone.
#[test]
fn a_mutex_deleted_by_an_operator_never_spreads_to_the_next_holder() {
    exhaustive(
        "2 clients x 2 cycles, operator deletes the mutex",
        LockModel {
            carry: true,
            operator: true,
            ..model(vec![(true, false, 2), (false, false, 1)], 1)
        },
    );
}

/// A background holder's release loses its connection before anything was applied; its careful
/// deletes read the mutex as still its own; an operator deletes the mutex and the foreground
/// contender first in line takes it (a new mutex, of the same data version 0); the careful
/// delete, conditional on that version alone, would remove the new holder's mutex (issue 53's
/// counterexample, found by the large scope). The careful delete of the mutex checks the
/// monitor's data version read with it, which every take moves, in the same multi.
#[test]
fn a_careful_release_after_a_lost_connection_leaves_the_next_holders_mutex() {
    exhaustive(
        "2 clients x 1 cycle, operator deletes the mutex, 2 faults",
        LockModel {
            operator: true,
            ..model(vec![(false, false, 1), (true, false, 1)], 2)
        },
    );
}

/// The way into issue 53's last counterexample (found by the large scope with the operator, 29
/// moves; this one, 26 moves, by two clients with 2+1 locks): a background client takes a quiet
/// lock with the fast path and releases it; the monitor, emptied, is reaped, and the client's
/// next fast path creates it again (`Start(0)` .. `Apply(0)`, `Apply(0)` after `ReapMonitor`);
/// a foreground client queues in the new monitor, sends its take of the mutex and is cancelled
/// with the take in flight (`Cancel(1)`): its reaper will delete its queue node and search the
/// monitor for the mutex that take made.
const INTO_A_RECREATED_MONITOR: [Move; 15] = [
    Move::Start(0),
    Move::Apply(0),
    Move::Apply(0),
    Move::Apply(0),
    Move::Release(0),
    Move::Start(0),
    Move::Start(1),
    Move::Apply(1),
    Move::Apply(0),
    Move::ReapMonitor,
    Move::Apply(0),
    Move::Apply(0),
    Move::Apply(1),
    Move::Apply(1),
    Move::Cancel(1),
];

/// From [`INTO_A_RECREATED_MONITOR`], every interleaving with one fault left (the operator).
/// Issue 53's counterexample: the reaper's search reads the monitor's data version (1) and the
/// mutex, its own; the operator deletes that mutex; the emptied monitor is reaped (or deleted by
/// the next fast path) and the background client creates it again and takes its mutex, the
/// monitor's version starting over at 1; the reaper's delete, checked against the monitor's
/// version alone, removed the background holder's mutex (14 moves from the fixed path). Every creation of a monitor moves the lock root's data version,
/// which the careful delete reads first and checks as well (`Removal::with_lock_root`).
#[test]
fn a_careful_delete_after_the_monitor_was_created_again_leaves_the_next_holders_mutex() {
    exhaustive(
        "2 clients x 2+1 cycles from a fixed path into a recreated monitor, operator, 1 fault",
        LockModel {
            operator: true,
            prefix: INTO_A_RECREATED_MONITOR.to_vec(),
            ..model(vec![(false, false, 2), (true, false, 1)], 2)
        },
    );
}

/// A client's next acquisition queues while it holds (a waiter of the holder's own session),
/// and the release hands it the lock in one multi where it waits at a hand-over point; beside
/// it, a client of another session and class, and a fault (lost answers included).
#[test]
fn handing_the_lock_over_within_a_session_holds_every_property() {
    exhaustive(
        "1 client x 3 cycles, hand-over within a session, operator deletes the mutex, 1 fault",
        LockModel {
            handover: true,
            operator: true,
            ..model(vec![(true, false, 3)], 1)
        },
    );
    exhaustive(
        "2 clients x 2+1 cycles, hand-over within a session, 1 fault",
        LockModel {
            handover: true,
            ..model(vec![(true, false, 2), (false, false, 1)], 1)
        },
    );
}

/// A background waiter handed its session's lock without verifying the order: a foreground
/// contender of another session that queued after the waiter's listing is overtaken.
#[test]
fn a_hand_over_to_a_background_waiter_is_caught() {
    counterexample(
        LockModel {
            handover: true,
            flaw: Some(Flaw::HandOverToAnyClass),
            ..model(vec![(false, false, 2), (true, false, 1)], 0)
        },
        &["foreground is not overtaken by background"],
    );
}

/// The larger scope of `make torture`: three clients (two foreground, one background) with two
/// faults among lost answers, connection losses, session expiries and cancellations.
#[test]
#[ignore = "minutes: make torture runs it"]
fn large_scope_three_clients_two_faults_hold_every_property() {
    exhaustive_dfs(
        "3 clients x 1 cycle, 2 faults",
        model(
            vec![(true, false, 1), (false, false, 1), (true, false, 1)],
            2,
        ),
    );
}

/// The larger scope of `make torture` with an operator deleting the mutex as one of the two
/// faults. It found three counterexamples of "a live holder is never stray", each fixed and
/// checked in `make test`: a background holder's release, its connection lost before anything
/// was applied, the operator deleting its mutex, a foreground contender taking the lock, and
/// the release's careful delete, resumed, removing the new holder's mutex (17 moves; the careful
/// delete checks the monitor's data version since:
/// `a_careful_release_after_a_lost_connection_leaves_the_next_holders_mutex`); a take found
/// again after a lost answer that read the monitor's version after its mutex, taking a later
/// take's version for its own (25 moves; read before the mutex since); and the monitor emptied
/// by the operator, deleted and created again by the next contender's fast path (or reaped and
/// created again) between a careful read and its delete, the new monitor's data version starting
/// over so that the check passed on the next holder's take (29 moves; the careful delete checks
/// the lock root's version, which every creation of a monitor moves, since:
/// `a_careful_delete_after_the_monitor_was_created_again_leaves_the_next_holders_mutex`).
#[test]
#[ignore = "minutes: make torture runs it"]
fn large_scope_three_clients_two_faults_with_the_operator_hold_every_property() {
    exhaustive_dfs(
        "3 clients x 1 cycle, operator deletes the mutex, 2 faults",
        LockModel {
            operator: true,
            ..model(
                vec![(true, false, 1), (false, false, 1), (true, false, 1)],
                2,
            )
        },
    );
}

/// Three clients taking two locks each with two faults, searched depth first for as long as
/// the random walks run (`ZKGUARD_MODEL_WALK_SECS`): beyond 40 million states, it does not end
/// in 20 minutes on two cores, so it reports how many states it explored.
#[test]
#[ignore = "minutes: make torture runs it"]
fn large_scope_three_clients_two_cycles_two_faults_searched_for_a_while() {
    let name = "3 clients x 2 cycles, 2 faults (bounded by time)";
    let started = std::time::Instant::now();
    let checker = model(
        vec![(true, false, 2), (false, false, 2), (true, false, 2)],
        2,
    )
    .checker()
    .threads(threads())
    .timeout(walk_time())
    .spawn_dfs()
    .join();
    report(
        &format!("{name} ({} s)", started.elapsed().as_secs()),
        &checker,
    );
    checker.assert_properties();
}

/// How long the random walks run: `ZKGUARD_MODEL_WALK_SECS` (`make torture` sets it), else 10 s.
fn walk_time() -> Duration {
    let secs = std::env::var("ZKGUARD_MODEL_WALK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    Duration::from_secs(secs)
}

/// The configuration of the random walks: every feature on, 4 clients x 2 cycles, 3 faults.
fn walk_model() -> LockModel {
    LockModel {
        promotion: true,
        handover: true,
        carry: true,
        ..model(
            vec![
                (true, true, 2),
                (false, false, 2),
                (true, false, 2),
                (false, true, 2),
            ],
            3,
        )
    }
}

/// The seed of the random walks: `ZKGUARD_MODEL_WALK_SEED`, else 7.
fn walk_seed() -> u64 {
    std::env::var("ZKGUARD_MODEL_WALK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7)
}

/// The random walks that once found a counterexample, each replayed by its seed (a walk is a
/// function of its seed: see [`SeedNoting`]).
///
/// - `4131006310800100945` (70 moves): a background waiter past its deadline gives up, its
///   node's delete in backoff after a lost connection, when its session expires: the model
///   left the acquisition waiting forever instead of ending its backoff (production's pause
///   ends, and the next request fails with the session).
/// - `6764751749694679655` (51 moves; issue 48, item 5): a foreground acquisition past its
///   deadline gives up, its node's delete in doubt, and is cancelled (as production drops it at
///   the deadline's overrun) while its connection is lost. Without `Acquisition::leftovers`
///   counting the removal under way, the reaper was handed nothing: the node (`A-0000000002`,
///   attempt `c0.0`) stayed on the live session after it reconnected and finished its cycles,
///   the next waiter watched it forever and the one behind that waiter waited on it.
#[test]
fn random_walks_that_once_failed_hold_every_property() {
    for seed in [4131006310800100945, 6764751749694679655] {
        let checker = one_walk(walk_model(), seed);
        report(&format!("random walk {seed}"), &checker);
        checker.assert_properties();
    }
}

/// Stateright's uniform chooser, noting the seed of the walk each thread is on.
///
/// A walk is a function of its seed: thread `t` of a simulation seeded `s` starts with seed
/// `s + t`, and draws each next walk's seed from a generator seeded with its first. The walks
/// stop at the first failure, so the failing walk's seed is the last one its thread noted.
#[derive(Clone, Default)]
struct SeedNoting(Arc<Mutex<HashMap<ThreadId, u64>>>);

impl Chooser<LockModel> for SeedNoting {
    type State = <UniformChooser as Chooser<LockModel>>::State;

    fn new_state(&self, seed: u64) -> Self::State {
        let mut seeds = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seeds.insert(std::thread::current().id(), seed);
        <UniformChooser as Chooser<LockModel>>::new_state(&UniformChooser, seed)
    }

    fn choose_initial_state(&self, state: &mut Self::State, initial: &[World]) -> usize {
        <UniformChooser as Chooser<LockModel>>::choose_initial_state(
            &UniformChooser,
            state,
            initial,
        )
    }

    fn choose_action(&self, state: &mut Self::State, current: &World, actions: &[Move]) -> usize {
        <UniformChooser as Chooser<LockModel>>::choose_action(
            &UniformChooser,
            state,
            current,
            actions,
        )
    }
}

/// The one random walk of `model` that `seed` picks.
fn one_walk(model: LockModel, seed: u64) -> impl Checker<LockModel> {
    model
        .checker()
        .threads(1)
        .target_state_count(1)
        .spawn_simulation(seed, UniformChooser)
        .join()
}

#[test]
fn random_walks_on_larger_configurations_hold_every_property() {
    let seeds = SeedNoting::default();
    let checker = walk_model()
        .checker()
        .threads(threads())
        .timeout(walk_time())
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_simulation(walk_seed(), seeds.clone())
        .join();
    report("4 clients x 2 cycles, 3 faults (random walks)", &checker);
    if !checker.discoveries().is_empty() {
        // Name the walk that failed, for a regression check of its own.
        let last: Vec<u64> = seeds.0.lock().unwrap().values().copied().collect();
        let failing: Vec<u64> = last
            .into_iter()
            .filter(|&seed| !one_walk(walk_model(), seed).discoveries().is_empty())
            .collect();
        eprintln!("the random walk that failed has seed {failing:?} (see one_walk)");
    }
    checker.assert_properties();
}

/// Explores `model` until a safety property fails, and returns the moves that break it, which
/// must be one of `properties`.
fn counterexample(model: LockModel, properties: &[&'static str]) -> String {
    let flaw = format!("{:?}", model.flaw);
    first_counterexample(model, &flaw, properties)
}

/// Explores `model` (broken by `flaw`, named in the report and the failure) breadth first
/// until a safety property fails, and returns the moves that break it, which must be one of
/// `properties`: the lock's and the transactions' broken variants alike.
fn first_counterexample<M>(model: M, flaw: &str, properties: &[&'static str]) -> String
where
    M: Model + Send + Sync + 'static,
    M::State: std::hash::Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyFailures)
        .timeout(Duration::from_secs(60))
        .spawn_bfs()
        .join();
    report(flaw, &checker);
    let path = properties
        .iter()
        .find_map(|property| checker.discovery(property))
        .unwrap_or_else(|| {
            panic!(
                "no counterexample of {properties:?} with {flaw}; found: {:?}",
                checker.discoveries().keys().collect::<Vec<_>>()
            )
        });
    format!("{:?}", path.into_actions())
}

#[test]
fn ownership_without_the_attempt_id_is_caught() {
    let actions = counterexample(
        LockModel {
            flaw: Some(Flaw::OwnershipWithoutAttempt),
            ..model(vec![(true, false, 2), (true, false, 1)], 1)
        },
        &["a live holder is never stray"],
    );
    assert!(actions.contains("Lose"), "{actions}");
}

#[test]
fn a_mutex_found_existing_taken_as_ours_is_caught() {
    counterexample(
        LockModel {
            // A background holder; a foreground waiter first in line, waiting for the mutex; a
            // second one behind it, which takes the mutex (first class, no read) when the first
            // gives up, and finds it held.
            flaw: Some(Flaw::MutexExistsIgnored),
            ..model(
                vec![(false, false, 1), (true, true, 1), (true, false, 1)],
                0,
            )
        },
        // The false holder's token is not a take's: it comes out of order, or as a second
        // holder.
        &["at most one holder", "tokens increase in holding order"],
    );
}

#[test]
fn a_release_without_the_version_check_is_caught() {
    counterexample(
        LockModel {
            // A background holder and a foreground contender first in line, waiting for the
            // mutex: it takes the lock as soon as the operator deleted the mutex.
            operator: true,
            flaw: Some(Flaw::ReleaseUnchecked),
            ..model(vec![(false, false, 1), (true, false, 1)], 1)
        },
        &["a live holder is never stray"],
    );
}

/// The search for what a create whose answer was lost made reads behind a `sync`: the server
/// the session reconnected to may not have applied the create yet. Without the sync's effect,
/// the search misses the node and the contender queues a second one.
#[test]
fn a_search_on_a_lagging_server_without_a_sync_is_caught() {
    counterexample(
        LockModel {
            sync_catches_up: false,
            ..model(vec![(true, false, 1), (false, false, 1)], 1)
        },
        &[
            "nothing is left once every client finished",
            "every client finishes",
            "a live holder is never stray",
            "at most one holder",
        ],
    );
}

#[test]
fn the_mark_trusted_by_a_background_successor_is_caught() {
    counterexample(
        LockModel {
            // A foreground holder that queued (so its release marks its node), a background
            // waiter behind it, and a foreground contender arriving meanwhile (the first
            // client's second lock).
            flaw: Some(Flaw::MarkTrustedByAnyClass),
            ..model(
                vec![(true, false, 2), (false, false, 1), (true, false, 1)],
                0,
            )
        },
        &["foreground is not overtaken by background"],
    );
}

/// A starving background waiter re-queued as foreground, whose old node's delete loses its
/// connection, cancelled while that delete waits to be tried again: the reaper must get the old
/// node (of the old attempt id) and search for the new one. It got only the new node, and the
/// old one stayed on the live session (issue 48, item 5's kind; found by this check).
#[test]
fn a_promoted_waiter_cancelled_while_its_old_node_goes_holds_every_property() {
    exhaustive(
        "2 clients x 1 cycle, promotion, 2 faults",
        LockModel {
            promotion: true,
            ..model(vec![(true, false, 1), (false, false, 1)], 2)
        },
    );
}

// Document transactions (`lock_model_support::txn`): coordinators, recovery and single writers
// deciding with `zkguard::txn::multi::decide`, the rules the engine runs.

/// A transaction model with the product's rules.
fn txn_model(txns: Vec<[Option<Op>; 2]>, writers: Vec<(usize, Kind)>, crashes: u8) -> TxnModel {
    TxnModel {
        txns,
        writers,
        crashes,
        stalls: 0,
        rules: Rules::PRODUCT,
    }
}

/// Explores every interleaving of a transaction model and asserts every property.
fn txn_exhaustive(name: &str, model: TxnModel) {
    let checker = model.checker().threads(threads()).spawn_bfs().join();
    report(name, &checker);
    checker.assert_properties();
}

/// One transaction updating one document and deleting another, a crash at any step of it (or of
/// a writer, or of recovery), recovery, and beside it a gate `_update` of the first document, a
/// guarded whole-document write of the second, and a client that writes the first back as it
/// read it, its `zkguard` object (a committed transaction's mark) included.
#[test]
fn document_transactions_with_a_crash_hold_every_property() {
    txn_exhaustive(
        "transaction x 2 documents, 3 writers, 1 crash",
        txn_model(
            vec![[Some(Op::Update), Some(Op::Delete)]],
            vec![(0, Kind::Update), (1, Kind::Index), (0, Kind::Copy)],
            1,
        ),
    );
}

/// Two transactions sharing a document (each decides the other's mark it finds), gate
/// `_update`s of both documents, a crash.
#[test]
fn overlapping_transactions_with_a_crash_hold_every_property() {
    txn_exhaustive(
        "2 transactions sharing a document, 2 writers, 1 crash",
        txn_model(
            vec![
                [Some(Op::Update), Some(Op::Update)],
                [Some(Op::Update), None],
            ],
            vec![(0, Kind::Update), (1, Kind::Update)],
            1,
        ),
    );
}

/// The larger scope of `make torture`: two transactions sharing a document (each decides the
/// other's mark it finds), gate `_update`s of both documents, two crashes. (Two transactions
/// over both documents with a crash and a stalled coordinator found a counterexample of "no
/// acknowledged write is lost or reverted" after 15 million states: fixed, and checked in
/// `make test` by `a_late_write_seen_by_a_second_read_is_decided_too`.)
#[test]
#[ignore = "minutes: make torture runs it"]
fn large_scope_document_transactions_hold_every_property() {
    exhaustive_dfs(
        "2 transactions sharing a document, 2 writers, 2 crashes",
        txn_model(
            vec![
                [Some(Op::Update), Some(Op::Update)],
                [Some(Op::Update), None],
            ],
            vec![(0, Kind::Update), (1, Kind::Update)],
            2,
        ),
    );
}

/// Explores a transaction model with `flaw` until a safety property fails; the property must
/// be one of `properties`.
fn txn_counterexample(model: TxnModel, flaw: TxnFlaw, properties: &[&'static str]) -> String {
    let model = TxnModel {
        rules: Rules { flaw: Some(flaw) },
        ..model
    };
    first_counterexample(model, &format!("{flaw:?}"), properties)
}

/// Recovery that takes any marked document for the transaction's write (before the stamp's
/// token was compared with `_version`): a client's acknowledged write of a committed
/// transaction's document, its `zkguard` object copied, is overwritten with the after-image.
#[test]
fn recovery_trusting_any_marked_document_is_caught() {
    let actions = txn_counterexample(
        txn_model(
            vec![[Some(Op::Update), Some(Op::Update)]],
            vec![(0, Kind::Copy)],
            1,
        ),
        TxnFlaw::TrustAnyMark,
        &["no acknowledged write is lost or reverted"],
    );
    assert!(actions.contains("Crash(Coord(0))"), "{actions}");
}

/// A gate `_update` that builds on an undecided transaction's marked write: the transaction is
/// rolled back, and the update carries its write on.
#[test]
fn a_writer_building_on_an_undecided_transaction_is_caught() {
    txn_counterexample(
        txn_model(
            vec![[Some(Op::Update), Some(Op::Update)]],
            vec![(0, Kind::Update)],
            1,
        ),
        TxnFlaw::BuildOnUndecided,
        &[
            "no acknowledged write is lost or reverted",
            "a settled transaction is all or nothing",
        ],
    );
}

/// Recovery that undoes a committed transaction whose marks were partly cleared: the
/// acknowledged commit is reverted on one document and stays on the other.
#[test]
fn recovery_undoing_a_committed_transaction_is_caught() {
    txn_counterexample(
        txn_model(vec![[Some(Op::Update), Some(Op::Update)]], vec![], 1),
        TxnFlaw::UndoCommitted,
        &[
            "no acknowledged write is lost or reverted",
            "a settled transaction is all or nothing",
        ],
    );
}

/// A coordinator paused past its session after writing its marks: recovery (or a writer that
/// finds a mark) undoes the transaction under fresh locks while the coordinator, resuming, tries
/// to commit, clear or undo with its old tokens; beside it a gate `_update` and a guarded write.
#[test]
fn a_stalled_coordinator_holds_every_property() {
    txn_exhaustive(
        "transaction x 2 documents, 2 writers, 1 stall, 1 crash",
        TxnModel {
            stalls: 1,
            ..txn_model(
                vec![[Some(Op::Update), Some(Op::Delete)]],
                vec![(0, Kind::Update), (1, Kind::Index)],
                1,
            )
        },
    );
}

/// Two transactions over both documents and a coordinator stalled past its session right after
/// its lock check, its apply `_bulk` on its way: the other coordinator reads both documents, finds
/// the first marked and undoes it, and reads again, when the second marked write has landed
/// meanwhile. It decides the marks found by every read until one shows none: before, it took
/// that second read's marked tombstone as its before-image and built its update on a rolled-back
/// delete (issue 53's counterexample of "no acknowledged write is lost or reverted", found by a
/// larger scope).
#[test]
fn a_late_write_seen_by_a_second_read_is_decided_too() {
    txn_exhaustive(
        "2 transactions x 2 documents, 1 stall",
        TxnModel {
            stalls: 1,
            ..txn_model(
                vec![
                    [Some(Op::Update), Some(Op::Delete)],
                    [Some(Op::Update), Some(Op::Update)],
                ],
                vec![],
                0,
            )
        },
    );
}

/// Recovery that undoes a pending transaction without moving its log to `rolling-back` first:
/// the stalled coordinator's commit lands between recovery's reads and its last write, and the
/// acknowledged commit is undone.
#[test]
fn recovery_undoing_without_moving_the_log_is_caught() {
    txn_counterexample(
        TxnModel {
            stalls: 1,
            ..txn_model(vec![[Some(Op::Update), Some(Op::Update)]], vec![], 0)
        },
        TxnFlaw::UndoWithoutMovingTheLog,
        &[
            "no acknowledged write is lost or reverted",
            "a settled transaction is all or nothing",
        ],
    );
}

/// A gate `_update` that leaves a final transaction's own write as it read it: it read the
/// document marked by a transaction whose coordinator, stalled past its session after its marked
/// write, had its next write refused and undid its own transaction meanwhile; the update merged
/// into the reverted write (found by the model check; `a_stalled_coordinator_holds_every_property`
/// failed so before `Rules::on_mark` settled such a write again).
#[test]
fn a_writer_building_on_a_final_transactions_write_is_caught() {
    let actions = txn_counterexample(
        TxnModel {
            stalls: 1,
            ..txn_model(
                vec![[Some(Op::Update), Some(Op::Update)]],
                vec![(0, Kind::Update), (1, Kind::Index)],
                0,
            )
        },
        TxnFlaw::FinalMarkLeft,
        &[
            "no acknowledged write is lost or reverted",
            "a settled transaction is all or nothing",
        ],
    );
    assert!(actions.contains("Stall(0)"), "{actions}");
}
