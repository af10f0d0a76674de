//! The fleet fault test's pieces: the servers and instances (`cluster`), the clients
//! (`clients`), the partitions as the instances report them (`observe`), the run and its
//! faults (`run`), the fleet's files under deploy/ (`deploy`) and the checker (`checker`, with its own tests in `checker_tests`).

pub mod checker;
#[cfg(test)]
mod checker_tests;
pub mod clients;
pub mod cluster;
pub mod deploy;
pub mod observe;
pub mod run;
