#!/usr/bin/python3
"""Benchmark peer for `zkguard bench`: kazoo's `Lock` recipe, measured the same way.

Usage: /usr/bin/python3 kazoo_bench.py --zk HOST:PORT[,...] [--iterations N] [--contenders N]
                                       [--monitors N] [--warmup N] [--server-pid PID] [--json]

Prints one JSON object:
  {"backend": "kazoo", "iterations": N, "contenders": C, "monitors": M,
   "uncontended": {"p50_ms": .., "p99_ms": .., "requests_per_cycle": .., "cpu_ms_per_cycle": ..,
                   "server_cpu_ms_per_cycle": ..},
   "contended": {"handoffs_per_sec": .., "requests_per_handoff": .., "cpu_ms_per_handoff": ..,
                 "server_cpu_ms_per_handoff": ..},
   "throughput": {"ops_per_sec": .., "requests_per_op": .., "cpu_ms_per_op": ..,
                  "server_cpu_ms_per_op": ..}}
(the server_cpu figures are null without --server-pid)

- uncontended: one client acquires and releases one reused lock path, N cycles after a warm-up;
  latency of a whole cycle (acquire + release). requests_per_cycle is the growth of the server's
  zk_packets_received (four-letter word `mntr`) during those N cycles, divided by N.
  cpu_ms_per_cycle (and cpu_ms_per_handoff below) is the user + system CPU time of this
  process (resource.getrusage(RUSAGE_SELF)) over those cycles, divided by N.
- contended: C clients (one session each, one thread each) acquire and release ONE lock path
  until N hand-offs happened in total; hand-offs per second. requests_per_handoff is the growth
  of zk_packets_received during those N hand-offs (all clients' requests), divided by N.
- throughput: C clients over M lock paths (each operation picks a path at random) until N
  acquire/release operations happened in total; operations per second, with its requests and
  this process's CPU time per operation counted as above.
- server_cpu_ms_*: with --server-pid, the user + system CPU time of that process (the ZooKeeper
  server; /proc/PID/stat, Linux) over the same cycles, divided by their number.
"""

import argparse
import json
import logging
import math
import os
import random
import resource
import socket
import sys
import threading
import time

from kazoo.client import KazooClient

SESSION_TIMEOUT_S = 30.0
LOCK_TIMEOUT_S = 60.0


def client(zk):
    c = KazooClient(hosts=zk, timeout=SESSION_TIMEOUT_S)
    c.start(timeout=15)
    return c


def cycle(lock):
    if not lock.acquire(timeout=LOCK_TIMEOUT_S):
        raise RuntimeError("lock not acquired within %s s" % LOCK_TIMEOUT_S)
    lock.release()


def cpu_seconds():
    """User + system CPU time of this process (all threads), from getrusage(RUSAGE_SELF)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def server_cpu_seconds(pid):
    """User + system CPU time of process `pid` (the ZooKeeper server) from /proc/PID/stat, or
    None without a pid or when it cannot be read."""
    if pid is None:
        return None
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def per_cycle_ms(before, after, cycles):
    if before is None or after is None:
        return None
    return round((after - before) * 1e3 / cycles, 4)


def percentile(sorted_values, q):
    rank = int(math.ceil(q * len(sorted_values)))
    return sorted_values[max(0, min(len(sorted_values) - 1, rank - 1))]


def packets_received(connect):
    """zk_packets_received of the first server of the connect string (four-letter word mntr)."""
    first = connect.split(",")[0].split("/")[0]
    host, _, port = first.rpartition(":")
    with socket.create_connection((host or first, int(port or 2181)), timeout=3) as s:
        s.sendall(b"mntr")
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    for line in b"".join(chunks).decode().splitlines():
        key, _, value = line.partition("\t")
        if key.strip() == "zk_packets_received":
            return int(value.strip())
    raise RuntimeError("mntr of %s has no zk_packets_received" % first)


def run(clients, paths, prefix, total):
    """Every client runs in its own thread, acquiring and releasing one of `paths` lock paths
    (picked at random per operation when there are several) until `total` operations have
    completed in all. Returns operations per second."""
    remaining = [total]
    guard = threading.Lock()
    failures = []
    barrier = threading.Barrier(len(clients) + 1)

    def take():
        with guard:
            if remaining[0] <= 0:
                return False
            remaining[0] -= 1
            return True

    def worker(c):
        if paths == 1:
            locks = [c.Lock(prefix)]
        else:
            locks = [c.Lock("%s/m%d" % (prefix, p)) for p in range(paths)]
        try:
            barrier.wait()
            while take():
                cycle(locks[0] if paths == 1 else random.choice(locks))
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)
            with guard:
                remaining[0] = 0

    threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if failures:
        raise RuntimeError("a contender failed: %r" % failures[0])
    return total / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zk", required=True)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--contenders", type=int, default=4)
    parser.add_argument("--monitors", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=-1)
    parser.add_argument("--server-pid", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="accepted; the output is always JSON")
    args = parser.parse_args()
    if min(args.iterations, args.contenders, args.monitors) < 1:
        parser.error("counts must be at least 1")
    warmup = args.warmup if args.warmup >= 0 else max(50, args.iterations // 5)
    logging.basicConfig(level=logging.ERROR)
    base = "/zkguard-bench/kazoo-%d" % int(time.time() * 1000)

    solo = client(args.zk)
    try:
        lock = solo.Lock(base + "/uncontended")
        for _ in range(warmup):
            cycle(lock)
        nanos = []
        before = packets_received(args.zk)
        cpu_before = cpu_seconds()
        server_before = server_cpu_seconds(args.server_pid)
        for _ in range(args.iterations):
            t0 = time.perf_counter_ns()
            cycle(lock)
            nanos.append(time.perf_counter_ns() - t0)
        cpu_cycle = (cpu_seconds() - cpu_before) * 1e3 / args.iterations
        server_cycle = per_cycle_ms(
            server_before, server_cpu_seconds(args.server_pid), args.iterations)
        after = packets_received(args.zk)
    finally:
        solo.stop()
        solo.close()
    nanos.sort()

    clients = []
    try:
        for _ in range(args.contenders):
            clients.append(client(args.zk))
        short = min(warmup, 20 * args.contenders)
        run(clients, 1, base + "/contended", short)
        handoff_before = packets_received(args.zk)
        cpu_before = cpu_seconds()
        server_before = server_cpu_seconds(args.server_pid)
        handoffs = run(clients, 1, base + "/contended", args.iterations)
        cpu_handoff = (cpu_seconds() - cpu_before) * 1e3 / args.iterations
        server_handoff = per_cycle_ms(
            server_before, server_cpu_seconds(args.server_pid), args.iterations)
        handoff_requests = packets_received(args.zk) - handoff_before
        run(clients, args.monitors, base + "/throughput", short)
        ops_before = packets_received(args.zk)
        cpu_before = cpu_seconds()
        server_before = server_cpu_seconds(args.server_pid)
        ops = run(clients, args.monitors, base + "/throughput", args.iterations)
        cpu_op = (cpu_seconds() - cpu_before) * 1e3 / args.iterations
        server_op = per_cycle_ms(server_before, server_cpu_seconds(args.server_pid), args.iterations)
        op_requests = packets_received(args.zk) - ops_before
    finally:
        for c in clients:
            c.stop()
            c.close()

    result = {
        "backend": "kazoo",
        "iterations": args.iterations,
        "contenders": args.contenders,
        "monitors": args.monitors,
        "uncontended": {
            "p50_ms": round(percentile(nanos, 0.50) / 1e6, 4),
            "p99_ms": round(percentile(nanos, 0.99) / 1e6, 4),
            "requests_per_cycle": round((after - before) / args.iterations, 2),
            "cpu_ms_per_cycle": round(cpu_cycle, 4),
            "server_cpu_ms_per_cycle": server_cycle,
        },
        "contended": {
            "handoffs_per_sec": round(handoffs, 1),
            "requests_per_handoff": round(handoff_requests / args.iterations, 2),
            "cpu_ms_per_handoff": round(cpu_handoff, 4),
            "server_cpu_ms_per_handoff": server_handoff,
        },
        "throughput": {
            "ops_per_sec": round(ops, 1),
            "requests_per_op": round(op_requests / args.iterations, 2),
            "cpu_ms_per_op": round(cpu_op, 4),
            "server_cpu_ms_per_op": server_op,
        },
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
