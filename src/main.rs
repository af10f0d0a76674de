//! The `zkguard` command line: run a command under a lock, inspect queues, benchmark, demo,
//! dead letters and transactions.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;
mod server;

/// ZooKeeper priority locks that fence Elasticsearch writes.
#[derive(Debug, Parser)]
#[command(name = "zkguard", version, about, propagate_version = true)]
pub struct Cli {
    /// Properties file (default: none, built-in defaults plus ZKGUARD_* environment overrides).
    #[arg(long, global = true, env = "ZKGUARD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// More logging (repeat for more); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Acquire the lock of a monitor object, run CMD, release.
    Exec(cli::exec::ExecArgs),
    /// Show the holder and the queue of each monitor object.
    Locks(cli::locks::LocksArgs),
    /// Measure lock latency and throughput.
    Bench(cli::bench::BenchArgs),
    /// Run the demo: foreground and background writers on shared articles, with a report.
    Demo(cli::demo::DemoArgs),
    /// Inspect and replay parked (dead-letter) operations.
    Dlq(cli::dlq::DlqArgs),
    /// Multi-document transactions (two-phase commit).
    Txn(cli::txn::TxnArgs),
    /// Run the lock service: guarded writes over HTTP, a durable background queue, metrics.
    Serve(server::ServeArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            let code = match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => 0,
                _ => cli::EX_USAGE,
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // The demo expects faults (parked operations, a fenced writer): keep its screen to the report.
    let quiet = matches!(cli.command, Command::Demo(_));
    match &cli.command {
        Command::Serve(args) => server::init_tracing(cli.verbose, args.log_format),
        _ => cli::init_tracing(cli.verbose, quiet),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("zkguard: cannot start the async runtime: {e}");
            return ExitCode::from(cli::EX_SOFTWARE);
        }
    };
    let result = runtime.block_on(cli::run(cli));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("zkguard: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}
