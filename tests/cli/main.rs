//! The `zkguard` command line: configuration, `exec`, the demo and the tutorial, benchmarks,
//! generated references, packaging and deployment files, and the source tree's own checks. One
//! test binary: see docs/testing.md.

#[path = "../support/cli.rs"]
mod cli;
#[path = "../support/common/mod.rs"]
mod common;
#[path = "../support/local_demo.rs"]
mod local_demo;
#[path = "../support/common/process.rs"]
mod process;
#[path = "../support/tutorial/mod.rs"]
mod tutorial_support;

// The tests, one module per concern.
mod bench_cli;
mod cli_config;
mod cli_exec;
mod cli_locks_es;
mod cli_meta;
mod demo;
mod deploy_kubernetes;
mod docker_files;
mod import_cycles;
mod manifest;
mod reference;
mod secrets;
mod state_dir;
