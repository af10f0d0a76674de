//! Runs docs/tutorial.md as a reader would: every ```sh block in order, with bash, against
//! servers of the test's own. The conventions the page follows are stated in an HTML comment at
//! its top; this module is their only reader.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Marks a command left running: it ends its line.
const BACKGROUND: &str = "# runs until Ctrl-C";
/// A comment line starting so interrupts the commands left running.
const STOP: &str = "# Ctrl-C";
/// A comment line starting so states what the output so far holds.
const EXPECT: &str = "# -> ";
/// Stands for anything in an expected output.
const ANYTHING: char = '…';
/// A block right after this comment is not run.
const SKIP: &str = "<!-- not run by the test:";

/// The longest a block may take (its slowest command waits 10 s for an operation).
const BLOCK_LIMIT: Duration = Duration::from_secs(300);
/// The longest a command left running may take to print its first line, or to stop.
const BACKGROUND_LIMIT: Duration = Duration::from_secs(60);

/// One ```sh block of the page.
#[derive(Debug)]
pub struct Block {
    /// Its first line's number in the page (the fence's), for messages.
    pub line: usize,
    pub text: String,
    pub skip: bool,
}

/// The ```sh blocks of a markdown page, in order.
pub fn sh_blocks(page: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut previous = "";
    let mut lines = page.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if line.trim_end() != "```sh" {
            if !line.trim().is_empty() {
                previous = line;
            }
            continue;
        }
        let mut text = String::new();
        for (_, body) in lines.by_ref() {
            if body.trim_end() == "```" {
                break;
            }
            text.push_str(body);
            text.push('\n');
        }
        blocks.push(Block {
            line: n + 1,
            text,
            skip: previous.trim_start().starts_with(SKIP),
        });
        previous = "";
    }
    blocks
}

/// What the test puts in place of what the page says: servers' addresses and fixed ports.
pub struct Substitutions {
    /// `export NAME=VALUE` of these names gets this value instead.
    pub exports: Vec<(&'static str, String)>,
    /// Text replaced wherever it appears (`127.0.0.1:7717` by a free port).
    pub text: Vec<(&'static str, String)>,
}

impl Substitutions {
    fn apply(&self, block: &str) -> String {
        let mut out = String::new();
        for line in block.lines() {
            let mut line = line.to_string();
            for (from, to) in &self.text {
                line = line.replace(from, to);
            }
            for (name, value) in &self.exports {
                let prefix = format!("export {name}=");
                if let Some(rest) = line.strip_prefix(&prefix) {
                    let tail = rest.find(char::is_whitespace).map_or("", |i| &rest[i..]);
                    line = format!("{prefix}{value}{tail}");
                }
            }
            out.push_str(&line);
            out.push('\n');
        }
        out
    }
}

/// A reader's shell session: the variables exported so far and the commands left running.
pub struct Session {
    /// Directory the commands run in (the repository: they name `conf/zkguard.properties`).
    dir: PathBuf,
    /// Directory of the `zkguard` binary, first on PATH.
    bin_dir: PathBuf,
    /// HOME of the commands (their state directory is under it).
    home: PathBuf,
    substitutions: Substitutions,
    exports: String,
    running: Vec<Job>,
}

/// A block's bash (a command left running, or a block run to its end), with what it printed.
struct Job {
    line: usize,
    script: String,
    /// The bash's pid, also its process group's id.
    pid: Pid,
    /// Told the bash's exit status once it has ended.
    exited: mpsc::Receiver<ExitStatus>,
    stdout: Output,
    stderr: Output,
}

/// What a pipe of the child delivered so far, read on a thread of its own.
struct Output {
    text: Arc<Mutex<String>>,
    /// Told once the pipe is closed (every process holding it is gone).
    closed: mpsc::Receiver<()>,
}

impl Output {
    /// Reads `pipe` to its end; `first_line` is told when the first line is complete.
    fn read(mut pipe: impl Read + Send + 'static, first_line: Option<mpsc::Sender<()>>) -> Self {
        let text = Arc::new(Mutex::new(String::new()));
        let (closed_tx, closed) = mpsc::channel();
        let sink = text.clone();
        std::thread::spawn(move || {
            let mut first_line = first_line;
            let mut chunk = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                let mut text = sink.lock().unwrap();
                text.push_str(&String::from_utf8_lossy(&chunk[..n]));
                if text.contains('\n') {
                    if let Some(tx) = first_line.take() {
                        let _ = tx.send(());
                    }
                }
            }
            let _ = closed_tx.send(());
        });
        Output { text, closed }
    }

    fn text(&self) -> String {
        self.text.lock().unwrap().clone()
    }
}

impl Session {
    pub fn new(dir: &Path, bin_dir: &Path, home: &Path, substitutions: Substitutions) -> Self {
        Session {
            dir: dir.to_path_buf(),
            bin_dir: bin_dir.to_path_buf(),
            home: home.to_path_buf(),
            substitutions,
            exports: String::new(),
            running: Vec::new(),
        }
    }

    /// Runs one block as the page says: stops what it says to stop, then leaves its command
    /// running or runs it to the end and checks its status and output.
    pub fn run(&mut self, block: &Block) {
        let script = self.substitutions.apply(&block.text);
        if script.lines().any(|l| l.trim_start().starts_with(STOP)) {
            self.stop_all();
        }
        for line in script.lines() {
            if line.trim_start().starts_with("export ") {
                self.exports.push_str(line);
                self.exports.push('\n');
            }
        }
        if script.lines().any(|l| l.trim_end().ends_with(BACKGROUND)) {
            self.start(block.line, script);
        } else {
            self.run_to_end(block.line, &script);
        }
    }

    /// A bash running `script` after the exports so far, stopping at the first failure.
    fn bash(&self, script: &str) -> Command {
        let path = std::env::var("PATH").unwrap_or_default();
        let mut c = Command::new("bash");
        c.arg("-c")
            .arg(format!("set -e -o pipefail\n{}{script}", self.exports))
            .current_dir(&self.dir)
            .env("PATH", format!("{}:{path}", self.bin_dir.display()))
            .env("HOME", &self.home)
            .env("XDG_STATE_HOME", self.home.join(".local/state"))
            .env_remove("RUST_LOG")
            // The servers are on loopback: never through a proxy of the test's environment.
            .env("no_proxy", "127.0.0.1,localhost")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, as a terminal's job: Ctrl-C (SIGINT) goes to all of it.
            .process_group(0);
        // And Ctrl-C's default effect, as in a terminal: a suite started in the background by a
        // non-interactive shell (`make test &`, `nohup ... &`) ignores SIGINT, and an ignored
        // signal stays ignored across exec, down to a `curl -N` that would then never end.
        // SAFETY: between fork and exec, only `signal`, which is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                for sig in [Signal::SIGINT, Signal::SIGQUIT] {
                    nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl)
                        .map_err(std::io::Error::from)?;
                }
                Ok(())
            });
        }
        for (name, _) in std::env::vars() {
            if name.starts_with("ZKGUARD_") {
                c.env_remove(name);
            }
        }
        c
    }

    fn run_to_end(&self, line: usize, script: &str) {
        let job = Job::spawn(line, script, self.bash(script), None);
        let status = job.wait(BLOCK_LIMIT);
        assert!(
            status.success(),
            "the block at docs/tutorial.md:{line} failed ({status}):\n{}",
            job.describe()
        );
        job.check_expected();
    }

    fn start(&mut self, line: usize, script: String) {
        let commands = script
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .count();
        assert_eq!(
            commands, 1,
            "docs/tutorial.md:{line}: a command left running ({BACKGROUND}) must be alone in its block"
        );
        let (first_tx, first_rx) = mpsc::channel();
        let job = Job::spawn(line, &script, self.bash(&script), Some(first_tx));
        // Ready once it printed its first line (the service its address, a stream its header).
        if first_rx.recv_timeout(BACKGROUND_LIMIT).is_err() {
            job.interrupt();
            let status = job.wait(BACKGROUND_LIMIT);
            panic!(
                "the command left running at docs/tutorial.md:{line} printed nothing ({status}):\n{}",
                job.describe()
            );
        }
        self.running.push(job);
    }

    /// Ctrl-C for every command left running, the newest first: each must end as a command
    /// ends on Ctrl-C (exit 0, or killed by SIGINT: 130), having printed what the page says.
    pub fn stop_all(&mut self) {
        while let Some(job) = self.running.pop() {
            job.interrupt();
            let status = job.wait(BACKGROUND_LIMIT);
            use std::os::unix::process::ExitStatusExt;
            assert!(
                status.success()
                    || status.signal() == Some(Signal::SIGINT as i32)
                    || status.code() == Some(128 + Signal::SIGINT as i32),
                "the command left running at docs/tutorial.md:{} ended with {status} on Ctrl-C:\n{}",
                job.line,
                job.describe()
            );
            job.check_expected();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A failed assertion: nothing is left running.
        for job in &self.running {
            let _ = killpg(job.pid, Signal::SIGKILL);
            let _ = job.exited.recv_timeout(BACKGROUND_LIMIT);
        }
    }
}

impl Job {
    /// Starts `command`, reading its output; `first_line` is told when it printed a line.
    fn spawn(
        line: usize,
        script: &str,
        mut command: Command,
        first_line: Option<mpsc::Sender<()>>,
    ) -> Self {
        let mut child = command.spawn().expect("run bash");
        let stdout = Output::read(child.stdout.take().unwrap(), first_line);
        let stderr = Output::read(child.stderr.take().unwrap(), None);
        let pid = Pid::from_raw(child.id() as i32);
        let (exited_tx, exited) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = exited_tx.send(child.wait().expect("wait for bash"));
        });
        Job {
            line,
            script: script.to_string(),
            pid,
            exited,
            stdout,
            stderr,
        }
    }

    fn interrupt(&self) {
        let _ = killpg(self.pid, Signal::SIGINT);
    }

    /// Waits for the block's bash to end; kills its group past `limit`.
    fn wait(&self, limit: Duration) -> ExitStatus {
        match self.exited.recv_timeout(limit) {
            Ok(status) => {
                // The last output: once every process of the block has closed its pipes.
                for output in [&self.stdout, &self.stderr] {
                    let _ = output.closed.recv_timeout(BACKGROUND_LIMIT);
                }
                status
            }
            Err(_) => {
                let _ = killpg(self.pid, Signal::SIGKILL);
                let status = self.exited.recv().expect("wait for bash");
                panic!(
                    "the block at docs/tutorial.md:{} took longer than {limit:?} ({status}):\n{}",
                    self.line,
                    self.describe()
                );
            }
        }
    }

    /// Every `# -> ` line of the block, found in order in its output.
    fn check_expected(&self) {
        let output = self.stdout.text();
        let mut from = 0;
        for line in self.script.lines() {
            let Some(expected) = line.trim_start().strip_prefix(EXPECT) else {
                continue;
            };
            for piece in expected.trim_end().split(ANYTHING) {
                match output[from..].find(piece) {
                    Some(at) => from += at + piece.len(),
                    None => panic!(
                        "the block at docs/tutorial.md:{}: `{piece}` of `{expected}` is not in the output (after byte {from}):\n{}",
                        self.line,
                        self.describe()
                    ),
                }
            }
        }
    }

    fn describe(&self) -> String {
        format!(
            "--- script\n{}--- stdout\n{}\n--- stderr\n{}",
            self.script,
            self.stdout.text(),
            self.stderr.text()
        )
    }
}
