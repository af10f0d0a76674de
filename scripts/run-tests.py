#!/usr/bin/env python3
"""The whole test suite, compiled once and run two test binaries at a time (`make test`).

`cargo test` runs its test binaries one after another, and most of them spend their time
waiting for the servers they start (ZooKeeper, osmem-server, tansu, chromium), so a 2-core
machine sat half idle. This script builds every test binary of the workspace's crates once
(`cargo test --workspace --no-run`: the integration tests in tests/, the model check in
crates/zkguard/tests/, every crate's unit tests), runs each in its package's directory, as cargo
does,
runs them ZKGUARD_TEST_JOBS at a time (default 2; 1 runs them one after another), the longest
first, then the doc tests, and prints each binary's output in one piece when it ends. Every
binary runs to the end whatever the others do; the script fails if any did, and says which.

Arguments after `--` go to every test binary (for example `-- --nocapture`).
"""

import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run first: the longest binaries (seconds on a 2-core machine), so that the rest fill in
# around them instead of one of them running alone at the end.
LONGEST = [
    "lock_history",
    "lock_model",
    "bench_cli",
    "demo",
    "zk_lock",
    "openapi",
    "dlq_kafka",
    "clients",
    "gateway",
    "serve",
]


def build():
    """Compiles every test binary; returns (name, path, package directory) for each, in the
    order to run."""
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

    def rank(item):
        name = item[0]
        return (LONGEST.index(name) if name in LONGEST else len(LONGEST), name)

    return sorted(binaries, key=rank)


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1 :] if "--" in args else []
    jobs = int(os.environ.get("ZKGUARD_TEST_JOBS", "2"))
    if jobs < 1:
        sys.exit("run-tests: ZKGUARD_TEST_JOBS must be at least 1")
    started = time.monotonic()
    work = [(name, [path, *extra], cwd) for name, path, cwd in build()]
    work.append(("doc tests", ["cargo", "test", "--workspace", "--doc", "--", *extra], ROOT))
    print(f"run-tests: {len(work)} test binaries, {jobs} at a time", flush=True)
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
