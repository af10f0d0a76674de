#!/usr/bin/env python3
"""Starts a ZooKeeper (as scripts/measure-queue-memory.py does), runs the measurement twice (the
first warms the server's JVM) and stops it. Usage, from the checkout:
    cargo build --release --manifest-path scripts/notification-cost/Cargo.toml
    python3 scripts/notification-cost/run.py
"""
import importlib.util
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "mq", os.path.join(HERE, "..", "measure-queue-memory.py"))
mq = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mq)
BINARY = os.path.join(HERE, "target", "release", "notification-cost")
try:
    zk = mq.start_zookeeper()
    pid = [p for n, p in mq.started if n == "zookeeper"][0].pid
    for run in ("warm-up", "measured"):
        print(f"-- {run}", flush=True)
        subprocess.run([BINARY, f"127.0.0.1:{zk}", str(pid), "3000"], check=True)
finally:
    for _, p in mq.started:
        try:
            p.kill()
        except Exception:
            pass
