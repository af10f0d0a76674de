//! The `zkguard` command line: run a command under a lock, inspect queues, benchmark, demo,
//! dead letters and transactions.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// The allocator of the binary: under `zkguard serve`'s bulk load, glibc's malloc and free took
/// a third of the service's CPU (many short-lived buffers freed on other threads); mimalloc's
/// thread-local free lists take a fraction of that. The library leaves the choice to its users.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cli;
mod exit;
mod lock_rows;
mod server;
#[cfg(feature = "workload")]
mod workload;

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
    /// Show each partition of a fleet's Kafka journal: owner, offsets, lag, oldest unapplied.
    Journal(server::journal_cmd::JournalArgs),
    /// Measure lock latency and throughput.
    #[cfg(feature = "workload")]
    Bench(cli::bench::BenchArgs),
    /// Run the demo: foreground and background writers on shared articles, with a report.
    #[cfg(feature = "workload")]
    Demo(cli::demo::DemoArgs),
    /// Inspect and replay parked (dead-letter) operations.
    Dlq(cli::dlq::DlqArgs),
    /// Multi-document transactions (two-phase commit).
    Txn(cli::txn::TxnArgs),
    /// Run the lock service: guarded writes over HTTP, a durable background queue, metrics.
    Serve(server::ServeArgs),
    /// Check the configuration, or show the effective settings and where each comes from.
    Config(cli::config::ConfigArgs),
    /// Print the HTTP API's OpenAPI 3.1 document (what `zkguard serve` serves at /openapi.json).
    Openapi,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(cli::meta::CompletionsArgs),
    /// Print the man page zkguard(1) in roff.
    #[command(hide = true)]
    Man,
    /// Print a reference under docs/reference/ in Markdown, generated from its definitions.
    #[command(hide = true)]
    Reference(cli::reference::ReferenceArgs),
}

impl Command {
    /// Whether the command was given `--json`: its errors are then printed as JSON too.
    pub fn wants_json(&self) -> bool {
        use cli::config::ConfigCommand;
        use cli::dlq::DlqCommand;
        use cli::txn::TxnCommand;
        match self {
            Self::Exec(a) => a.json,
            Self::Locks(a) => a.json,
            Self::Journal(a) => a.json,
            #[cfg(feature = "workload")]
            Self::Bench(a) => a.json,
            #[cfg(feature = "workload")]
            Self::Demo(a) => a.json,
            Self::Dlq(a) => match &a.command {
                DlqCommand::List { json } => *json,
                DlqCommand::Replay(r) => r.json,
                DlqCommand::Discard(d) => d.json,
            },
            Self::Txn(a) => match &a.command {
                TxnCommand::Init(x) => x.json,
                TxnCommand::Transfer(x) => x.json,
                TxnCommand::Apply(x) => x.json,
                TxnCommand::Show(x) => x.json,
                TxnCommand::Rollback(x) => x.json,
                TxnCommand::Recover(x) => x.json,
                TxnCommand::Audit(x) => x.json,
            },
            Self::Config(a) => match &a.command {
                ConfigCommand::Check(x) => x.json,
                ConfigCommand::Show(x) => x.json,
            },
            Self::Serve(_)
            | Self::Openapi
            | Self::Completions(_)
            | Self::Man
            | Self::Reference(_) => false,
        }
    }
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
            if code == 0 || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                // Help asked for, or a command group given without its command: the help itself.
                let _ = e.print();
            } else {
                let invalid = match e.get(clap::error::ContextKind::InvalidSubcommand) {
                    Some(clap::error::ContextValue::String(word)) => Some(word.as_str()),
                    _ => None,
                };
                let message = cli::CliError::usage(cli::usage::one_line(&e.to_string(), invalid));
                if std::env::args_os().any(|a| a == "--json") {
                    cli::print_error_json(&message);
                } else {
                    eprintln!("zkguard: {}", message.message);
                }
            }
            return ExitCode::from(code);
        }
    };
    let json = cli.command.wants_json();
    // The demo expects faults (parked operations, a fenced writer): keep its screen to the report.
    #[cfg(feature = "workload")]
    let quiet = matches!(cli.command, Command::Demo(_));
    #[cfg(not(feature = "workload"))]
    let quiet = false;
    match &cli.command {
        Command::Serve(args) => server::init_tracing(cli.verbose, args.log_format),
        _ => cli::init_tracing(cli.verbose, quiet, json),
    }
    install_panic_hook();
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
    let result = runtime.block_on(async {
        test_hooks();
        // A panic anywhere (a spawned task included) stops the command: a lock path that
        // panicked can no longer be trusted to hold, watch or release its lock.
        // A panic of the command's own task is caught here (reported by the hook) rather than
        // unwinding out of `main`, which would exit 101.
        let run = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(run(cli)));
        let outcome = tokio::select! {
            result = run => result.ok(),
            _ = PANIC_REPORTED.notified() => None,
        };
        // Let the ZooKeeper sessions close in order (their nodes go at once, their watches end
        // with the session) before the runtime drops whatever still runs.
        zkguard::zk::wait_for_sessions_to_end(SESSION_END_LIMIT).await;
        outcome
    });
    drop(runtime);
    if PANICKED.load(Ordering::SeqCst) {
        return ExitCode::from(cli::EX_SOFTWARE);
    }
    match result {
        Some(Ok(code)) => ExitCode::from(code),
        Some(Err(e)) => {
            if json {
                cli::print_error_json(&e);
            } else {
                eprintln!("zkguard: {}", e.message);
            }
            ExitCode::from(e.code)
        }
        None => ExitCode::from(cli::EX_SOFTWARE),
    }
}

/// How long the process waits at its end for its ZooKeeper sessions to close.
const SESSION_END_LIMIT: Duration = Duration::from_secs(2);

/// Set by the panic hook: the process then exits with `EX_SOFTWARE` whatever else happened.
static PANICKED: AtomicBool = AtomicBool::new(false);
/// Wakes the main task when a panic was reported.
static PANIC_REPORTED: LazyLock<tokio::sync::Notify> = LazyLock::new(tokio::sync::Notify::new);

/// Reports a panic in one `zkguard:` line (plus a backtrace when `RUST_BACKTRACE` asks for one)
/// and makes the process exit 70, also when the panic happened in a spawned task, which the
/// runtime would otherwise swallow.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let first = !PANICKED.swap(true, Ordering::SeqCst);
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        let place = info
            .location()
            .map_or_else(String::new, |l| format!(" at {}:{}", l.file(), l.line()));
        let thread = std::thread::current();
        let backtrace = std::backtrace::Backtrace::capture();
        let captured = backtrace.status() == std::backtrace::BacktraceStatus::Captured;
        eprintln!(
            "zkguard: internal error: panic in thread `{}`{place}: {}; {}",
            thread.name().unwrap_or("unnamed"),
            payload.replace('\n', " "),
            match (first, captured) {
                (false, _) => "(a further panic)",
                (true, true) => "zkguard stops (exit 70); backtrace below",
                (true, false) =>
                    "zkguard stops (exit 70); rerun with RUST_BACKTRACE=1 to see where it came from",
            }
        );
        if captured {
            eprintln!("{backtrace}");
        }
        PANIC_REPORTED.notify_one();
    }));
}

/// Fault injection for zkguard's own tests, honoured by debug builds only (release builds
/// ignore it): `ZKGUARD_TEST_HOOK_PANIC_IN_TASK=1` makes a spawned task panic at start,
/// `ZKGUARD_TEST_HOOK_PANIC_IN_MAIN=1` the command's own task once it has started.
fn test_hooks() {
    if cfg!(debug_assertions) && std::env::var_os("ZKGUARD_TEST_HOOK_PANIC_IN_TASK").is_some() {
        tokio::spawn(async { panic!("test hook ZKGUARD_TEST_HOOK_PANIC_IN_TASK") });
    }
}

/// The command, with the main-task test hook of [`test_hooks`].
async fn run(cli: Cli) -> Result<u8, cli::CliError> {
    if cfg!(debug_assertions) && std::env::var_os("ZKGUARD_TEST_HOOK_PANIC_IN_MAIN").is_some() {
        tokio::task::yield_now().await;
        panic!("test hook ZKGUARD_TEST_HOOK_PANIC_IN_MAIN");
    }
    dispatch(cli).await
}

/// Runs a parsed command line; `Ok(status)` is the process exit status.
async fn dispatch(cli: Cli) -> Result<u8, cli::CliError> {
    // These read no configuration, or check it themselves.
    match &cli.command {
        Command::Config(args) => return cli::config::run(cli.config.as_deref(), args),
        Command::Completions(args) => {
            return cli::meta::completions(<Cli as clap::CommandFactory>::command(), args)
        }
        Command::Man => return cli::man::man(<Cli as clap::CommandFactory>::command()),
        Command::Reference(args) => {
            return cli::reference::run(
                args,
                <Cli as clap::CommandFactory>::command(),
                &server::openapi_document(),
            )
        }
        Command::Openapi => {
            print!("{}", server::openapi_document());
            return Ok(0);
        }
        _ => {}
    }
    let settings = settings(&cli)?;
    match cli.command {
        Command::Exec(args) => cli::exec::run(settings, args).await,
        Command::Locks(args) => cli::locks::run(settings, args).await,
        Command::Journal(args) => server::journal_cmd::run(settings, args).await,
        #[cfg(feature = "workload")]
        Command::Bench(args) => cli::bench::run(settings, args).await,
        #[cfg(feature = "workload")]
        Command::Demo(args) => cli::demo::run(settings, args).await,
        Command::Dlq(args) => cli::dlq::run(settings, args).await,
        Command::Txn(args) => cli::txn::run(settings, args).await,
        Command::Serve(args) => server::run(settings, args).await,
        Command::Config(_)
        | Command::Openapi
        | Command::Completions(_)
        | Command::Man
        | Command::Reference(_) => Ok(0),
    }
}

/// Loads the configuration named by `--config`; prints its warnings on stderr.
fn settings(cli: &Cli) -> Result<zkguard::config::Settings, cli::CliError> {
    let settings = zkguard::config::Settings::load(cli.config.as_deref())?;
    let json = cli.command.wants_json();
    for w in &settings.warnings {
        if json {
            eprintln!("{}", serde_json::json!({"warning": "config", "message": w}));
        } else {
            eprintln!("zkguard: warning: {w}");
        }
    }
    Ok(settings)
}
