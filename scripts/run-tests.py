#!/usr/bin/env python3
"""The whole test suite, compiled once and run two test processes at a time (`make test`).

`cargo test` runs its test binaries one after another, and most of them spend their time
waiting for the servers they start (ZooKeeper, osmem-server, tansu, chromium), so a 2-core
machine sat half idle. This script builds every test binary of the workspace's crates once
(`cargo test --workspace --no-run`: the integration tests in tests/, the model check in
crates/zkguard/tests/, every crate's unit tests), runs each in its package's directory, as cargo
does, ZKGUARD_TEST_JOBS at a time (default 2; 1 runs them one after another), the longest
first, then the doc tests, and prints each run's output in one piece when it ends. Every run
goes to the end whatever the others do; the script fails if any did, and says which.

A test binary of a group (tests/<group>/main.rs) runs as one process per test file of the
group (`lock/zk_lock`: the tests of tests/lock/zk_lock/, by their exact names), so that the
long files run side by side as they did when each file was its own binary; the other binaries
run whole. Arguments after `--` go to every run (for example `-- --nocapture`); with a test
name filter among them, every binary runs whole.
"""

import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run first: the longest runs (seconds on a 2-core machine), so that the rest fill in around
# them instead of one of them running alone at the end.
LONGEST = [
    "history",
    "lock_model",
    "fleet",
    "cli/bench_cli",
    "cli/demo",
    "lock/zk_lock",
    "service/openapi",
    "writes/dlq_kafka",
    "gate/clients",
    "gate/gateway",
    "service/serve",
]

# The binaries of the groups under tests/, run as one process per test file (module).
GROUPS = {"lock", "writes", "service", "gate", "cli"}


def build():
    """Compiles every test binary; returns (name, path, package directory) for each."""
    cmd = ["cargo", "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"run-tests: `{' '.join(cmd)}` failed (exit {proc.returncode}); see above")
    binaries = []
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        kind = target["kind"][0]
        name = target["name"] if kind == "test" else f"{target['name']} ({kind})"
        binaries.append((name, msg["executable"], os.path.dirname(msg["manifest_path"])))

    return binaries


def runs(binaries, extra):
    """(name, command) of every run, the longest first: a group's binary once per module."""
    whole = any(not arg.startswith("-") for arg in extra)
    work = []
    for name, path, cwd in binaries:
        if whole or name not in GROUPS:
            work.append((name, [path, *extra], cwd))
            continue
        listed = subprocess.run(
            [path, "--list", "--format", "terse"], cwd=cwd, stdout=subprocess.PIPE, text=True
        )
        if listed.returncode != 0:
            sys.exit(f"run-tests: `{path} --list` failed (exit {listed.returncode})")
        modules = {}
        for line in listed.stdout.splitlines():
            if line.endswith(": test"):
                test = line[: -len(": test")]
                modules.setdefault(test.split("::")[0], []).append(test)
        for module, tests in sorted(modules.items()):
            work.append((f"{name}/{module}", [path, "--exact", *tests, *extra], cwd))

    def rank(item):
        name = item[0]
        return (LONGEST.index(name) if name in LONGEST else len(LONGEST), name)

    return sorted(work, key=rank)


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1 :] if "--" in args else []
    jobs = int(os.environ.get("ZKGUARD_TEST_JOBS", "2"))
    if jobs < 1:
        sys.exit("run-tests: ZKGUARD_TEST_JOBS must be at least 1")
    started = time.monotonic()
    binaries = build()
    work = runs(binaries, extra)
    work.append(("doc tests", ["cargo", "test", "--workspace", "--doc", "--", *extra], ROOT))
    print(
        f"run-tests: {len(binaries)} test binaries in {len(work)} runs, {jobs} at a time",
        flush=True,
    )
    lock = threading.Lock()
    failed = []
    queue = list(work)

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                name, cmd, cwd = queue.pop(0)
            began = time.monotonic()
            proc = subprocess.run(
                cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            took = time.monotonic() - began
            verdict = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            with lock:
                print(f"\n===== {name}: {verdict} in {took:.1f} s\n{proc.stdout}", flush=True)
                if proc.returncode != 0:
                    failed.append(name)

    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    if failed:
        print(f"\nrun-tests: {len(failed)} of {len(work)} failed in {took:.0f} s: {', '.join(failed)}")
        sys.exit(1)
    print(f"\nrun-tests: all {len(work)} passed in {took:.0f} s")


if __name__ == "__main__":
    main()
