//! The one way the tests run the `zkguard` binary.

use std::process::{Command, Stdio};

/// The `zkguard` binary built for these tests, as a command that inherits none of the test's
/// `ZKGUARD_*` variables nor `RUST_LOG`, and reads no standard input (not a terminal, whoever
/// runs the tests). Each test adds its own arguments, variables and standard input.
pub fn zkguard() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zkguard"));
    for (name, _) in std::env::vars_os() {
        if name.as_encoded_bytes().starts_with(b"ZKGUARD_") {
            c.env_remove(name);
        }
    }
    c.env_remove("RUST_LOG").stdin(Stdio::null());
    c
}
