//! The fault-injection history test of the ZooKeeper priority lock: the history it records
//! ([`history`]), the checker over it ([`checker`], shown able to fail in `checker_tests`), the
//! contenders ([`workers`] in this process, [`children`] as `zkguard exec` processes), the
//! faults ([`faults`]) and the run that ties them together ([`run`]); and the bank through
//! `zkguard serve` ([`bank`] its history and checker, shown able to fail in `bank_tests`;
//! [`bank_run`] the depositors, the faults and the final state).

pub mod bank;
pub mod bank_run;
#[cfg(test)]
mod bank_tests;
pub mod checker;
#[cfg(test)]
mod checker_tests;
pub mod children;
pub mod faults;
pub mod history;
#[cfg(test)]
mod race;
pub mod run;
pub mod workers;

/// Nanoseconds of `CLOCK_MONOTONIC`: the clock of every timestamp of the history. The writer
/// that `zkguard exec` runs reads the same clock (Python's `time.monotonic_ns()`), so the
/// events of the child processes and of this process are on one time line.
pub fn now() -> u64 {
    let mut ts = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Milliseconds as nanoseconds of the history's clock.
pub const fn ms(n: u64) -> u64 {
    n * 1_000_000
}
