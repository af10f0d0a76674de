#!/usr/bin/env python3
"""Memory of `zkguard serve` per queued background operation, and of a restart that replays
the journal.  Standard library only.  Everything lives under $ZKGUARD_MEMORY_DIR
(default /tmp/zkguard-memory, WORK).  `make bench-memory` runs it on the release build.

What it does:
  1. starts ZooKeeper (Debian 3.8, standalone, free loopback port, own dataDir under WORK),
     osmem-server (-addr 127.0.0.1:0, exits when its stdin closes), and
     `zkguard exec --monitor held -- sh -c 'echo locked; exec sleep 3600'` so that the lock of
     monitor "held" is taken and every background operation on it stays queued;
  2. for each binary x document size x N:
       - fresh journal; start `zkguard serve --listen 127.0.0.1:0`, wait for its start line;
       - settle, read VmRSS/VmHWM/RssAnon of the serve pid (/proc/PID/status) = baseline;
       - POST /v1/bulk batches (BATCH lines each) of index ops on monitor "held" until N are
         accepted (each answered 202); wait until /metrics shows zkguard_journal_depth and
         zkguard_background_queue_depth == N; settle; read the same values again;
       - per-op = (RSS after - RSS before) / N; journal file size / N; metric
         zkguard_journal_queued_bytes / N;
       - kill -9 the service (lock still held), start it again on the same journal, time from
         spawn to its start line (replay happens before that line), wait until the queue metrics
         show N again, settle, read VmHWM (peak of the new process) and VmRSS;
       - stop the service, delete the journal.
  3. stops everything it started (by pid / own process group) and removes the large files.

Usage:  python3 scripts/measure-queue-memory.py [--binaries a,b] [--counts 20000,100000]
                                               [--sizes 200,1000] [--batch 1000] [--settle 3]
        (default binary: target/release/zkguard; the first one also holds the lock)
Results: a table on stdout, and JSON lines in WORK/results.jsonl.
"""

import argparse
import http.client
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

WORK = os.environ.get("ZKGUARD_MEMORY_DIR", "/tmp/zkguard-memory")
DEFAULT_BINARIES = ["target/release/zkguard"]
EXEC_BINARY = DEFAULT_BINARIES[0]

started = []  # (name, Popen) of every process started here, to stop at the end


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def four_letter(port, word):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(word.encode())
            out = b""
            while True:
                b = s.recv(4096)
                if not b:
                    break
                out += b
            return out.decode(errors="replace")
    except OSError:
        return ""


def start_zookeeper():
    port = free_port()
    d = os.path.join(WORK, "zk")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "data"))
    cfg = os.path.join(d, "zoo.cfg")
    with open(cfg, "w") as f:
        f.write(
            "tickTime=2000\n"
            f"dataDir={d}/data\n"
            f"clientPort={port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=*\n"
        )
    out = open(os.path.join(d, "zk.log"), "w")
    p = subprocess.Popen(
        ["java", "-Dzookeeper.extendedTypesEnabled=true",
         "-cp", "/usr/share/java/zookeeper.jar:/usr/share/java/*",
         "org.apache.zookeeper.server.ZooKeeperServerMain", cfg],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True)
    started.append(("zookeeper", p))
    deadline = time.time() + 60
    while time.time() < deadline:
        if four_letter(port, "ruok").strip() == "imok":
            log(f"zookeeper ready on 127.0.0.1:{port} (pid {p.pid})")
            return port
        if p.poll() is not None:
            raise SystemExit("zookeeper exited; see " + d + "/zk.log")
        time.sleep(0.3)
    raise SystemExit("zookeeper not ready in 60 s")


def start_osmem():
    binary = subprocess.check_output(
        [sys.executable, "-c", "import osmem_server; print(osmem_server.resolve_binary())"],
        text=True).strip()
    err = open(os.path.join(WORK, "osmem.log"), "w")
    p = subprocess.Popen([binary, "-addr", "127.0.0.1:0"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    started.append(("osmem", p))
    line = read_line(p.stdout, 30)
    url = json.loads(line)["url"]
    log(f"osmem ready at {url} (pid {p.pid})")
    threading.Thread(target=drain, args=(p.stdout, None), daemon=True).start()
    return url


def read_line(stream, timeout):
    """One line from a pipe, within timeout seconds (raw fd, no buffering surprises)."""
    fd = stream.fileno()
    buf = b""
    deadline = time.time() + timeout
    while b"\n" not in buf:
        left = deadline - time.time()
        if left <= 0:
            raise TimeoutError("no line in %.0f s (got %r)" % (timeout, buf))
        r, _, _ = select.select([fd], [], [], left)
        if r:
            chunk = os.read(fd, 1)  # byte by byte: leave the rest in the pipe
            if not chunk:
                raise EOFError("pipe closed (got %r)" % buf)
            buf += chunk
    return buf.decode()


def drain(stream, path):
    out = open(path, "ab") if path else None
    try:
        while True:
            b = os.read(stream.fileno(), 65536)
            if not b:
                break
            if out:
                out.write(b)
                out.flush()
    except OSError:
        pass


def status(pid):
    """VmRSS, VmHWM, RssAnon, VmSize of pid in KiB."""
    vals = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "VmSize", "Threads"):
                vals[k] = int(v.split()[0])
    return vals


def base_env(zk_port, es_url, journal):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZKGUARD_")}
    env.update({
        "ZKGUARD_ZOOKEEPER_SERVERS": f"127.0.0.1:{zk_port}",
        "ZKGUARD_ZOOKEEPER_LOCK_ROOT": "/mem",
        "ZKGUARD_ELASTICSEARCH_URL": es_url,
        "ZKGUARD_SERVER_JOURNAL_PATH": journal,
        "ZKGUARD_DEADLETTER_FILE_PATH": os.path.join(WORK, "dl.jsonl"),
        "ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT": "600000",
        "ZKGUARD_SERVER_QUEUE_MAX": "1000000",
        "ZKGUARD_SERVER_QUEUE_MAX_BYTES": "2147483648",
        "ZKGUARD_SERVER_JOURNAL_MAX_BYTES": "4294967296",
        "ZKGUARD_SERVER_MAX_BODY": "16777216",
    })
    return env


def start_exec(env):
    """Holds the (foreground) lock of monitor "held" until stopped."""
    err = open(os.path.join(WORK, "exec.log"), "w")
    p = subprocess.Popen(
        [EXEC_BINARY, "exec", "--monitor", "held", "--info", "memmeasure holds the lock", "--",
         "sh", "-c", "echo locked; exec sleep 3600"],
        env=env, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
        start_new_session=True)
    started.append(("exec", p))
    line = read_line(p.stdout, 60)
    assert line.strip() == "locked", line
    log(f"lock of monitor 'held' taken by zkguard exec (pid {p.pid})")
    return p


def start_serve(binary, env, tag):
    logpath = os.path.join(WORK, "logs", f"serve-{tag}.log")
    err = open(logpath, "wb")
    t0 = time.monotonic()
    p = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0"], env=env,
                         stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    started.append((f"serve {tag}", p))
    try:
        line = read_line(p.stdout, 1800)
    except (TimeoutError, EOFError) as e:
        raise SystemExit(f"serve did not start ({e}); see {logpath}")
    t1 = time.monotonic()
    info = json.loads(line)
    threading.Thread(target=drain, args=(p.stdout, logpath + ".stdout"), daemon=True).start()
    host, port = info["listening"].rsplit(":", 1)
    return p, (host, int(port)), t1 - t0, info


def stop(name, p, sig=signal.SIGTERM, wait=30):
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, sig)  # its own process group (start_new_session), i.e. it and its children
    except ProcessLookupError:
        return
    try:
        p.wait(wait)
    except subprocess.TimeoutExpired:
        log(f"{name} (pid {p.pid}) still running after {wait} s: SIGKILL")
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def metrics(addr):
    c = http.client.HTTPConnection(*addr, timeout=30)
    c.request("GET", "/metrics")
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    out = {}
    for line in body.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def pick(m, *names):
    for n in names:
        if n in m:
            return m[n]
    return None


def wait_queued(addr, n, timeout=300):
    """Waits until the journal holds n unfinished operations and the executor's queue gauge is
    steady (up to 256 of them are taken by the executor at once, each waiting for the lock, so
    zkguard_background_queue_depth settles at n - 256)."""
    deadline = time.time() + timeout
    m, last = {}, None
    while time.time() < deadline:
        m = metrics(addr)
        cur = (pick(m, "zkguard_journal_depth"), pick(m, "zkguard_background_queue_depth"))
        if cur[0] == n and cur == last:
            return m
        last = cur
        time.sleep(1.0)
    raise SystemExit(f"queue metrics did not settle at {n}: journal_depth={pick(m, 'zkguard_journal_depth')} "
                     f"queue_depth={pick(m, 'zkguard_background_queue_depth')}")


def metrics_text(addr, path):
    c = http.client.HTTPConnection(*addr, timeout=30)
    c.request("GET", "/metrics")
    with open(path, "wb") as f:
        f.write(c.getresponse().read())
    c.close()


def make_doc(i, size, rnd):
    """A document whose JSON is about `size` bytes."""
    doc = {"title": f"Document {i}", "n": i, "tags": ["mem", "held"], "body": ""}
    base = len(json.dumps(doc, separators=(",", ":")))
    letters = "abcdefghijklmnopqrstuvwxyz     "
    doc["body"] = "".join(rnd.choice(letters) for _ in range(max(0, size - base)))
    return doc


def bulk_bodies(n, size, batch, seed=1):
    rnd = random.Random(seed)
    # A pool of bodies so generating 100k random strings does not dominate the run.
    pool = [make_doc(0, size, rnd)["body"] for _ in range(256)]
    lines = []
    doc_bytes = 0
    for i in range(n):
        doc = {"title": f"Document {i}", "n": i, "tags": ["mem", "held"], "body": pool[i % 256]}
        d = json.dumps(doc, separators=(",", ":"))
        doc_bytes += len(d)
        lines.append('{"action":"index","index":"mem","id":"d%d","doc":%s,"monitor":"held"}' % (i, d))
        if len(lines) == batch:
            yield ("\n".join(lines) + "\n").encode(), doc_bytes
            lines, doc_bytes = [], 0
    if lines:
        yield ("\n".join(lines) + "\n").encode(), doc_bytes


def queue_ops(addr, n, size, batch):
    c = http.client.HTTPConnection(*addr, timeout=600)
    sent = doc_bytes = line_bytes = 0
    for body, db in bulk_bodies(n, size, batch):
        c.request("POST", "/v1/bulk", body=body, headers={"Content-Type": "application/x-ndjson"})
        r = c.getresponse()
        answer = r.read()
        if r.status != 202:
            raise SystemExit(f"bulk answered {r.status}: {answer[:500]!r}")
        k = json.loads(answer)["count"]
        sent += k
        doc_bytes += db
        line_bytes += len(body)
    c.close()
    return sent, doc_bytes, line_bytes


def es_count(es_url):
    host = es_url.split("//", 1)[1].rstrip("/")
    h, p = host.rsplit(":", 1)
    c = http.client.HTTPConnection(h, int(p), timeout=10)
    c.request("GET", "/mem/_count")
    r = c.getresponse()
    body = r.read()
    c.close()
    if r.status == 404:
        return 0
    try:
        return json.loads(body).get("count")
    except ValueError:
        return None


def one_run(binary, label, n, size, batch, settle, zk_port, es_url):
    journal = os.path.join(WORK, "j.jsonl")
    for f in (journal, journal + ".lock"):
        if os.path.exists(f):
            os.remove(f)
    env = base_env(zk_port, es_url, journal)
    tag = f"{label}-{size}B-{n}"
    p, addr, t_start, info = start_serve(binary, env, tag)
    time.sleep(settle)
    before = status(p.pid)
    m0 = metrics(addr)
    t0 = time.monotonic()
    sent, doc_bytes, line_bytes = queue_ops(addr, n, size, batch)
    t_queue = time.monotonic() - t0
    assert sent == n, (sent, n)
    m1 = wait_queued(addr, n)
    time.sleep(settle)
    m1 = wait_queued(addr, n)
    after = status(p.pid)
    metrics_text(addr, os.path.join(WORK, "logs", f"metrics-{tag}.txt"))
    jsize = os.path.getsize(journal)
    applied = es_count(es_url)

    # kill -9 with the lock still held, then start again on the same journal
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(0.5)
    p2, addr2, t_restart, info2 = start_serve(binary, env, tag + "-restart")
    at_line = status(p2.pid)
    t1 = time.monotonic()
    wait_queued(addr2, n)
    t_requeued = time.monotonic() - t1
    time.sleep(settle)
    m2 = wait_queued(addr2, n)
    re = status(p2.pid)
    metrics_text(addr2, os.path.join(WORK, "logs", f"metrics-{tag}-restart.txt"))
    jsize2 = os.path.getsize(journal)
    stop("serve", p2, signal.SIGTERM)
    for f in (journal, journal + ".lock"):
        if os.path.exists(f):
            os.remove(f)

    qb = pick(m1, "zkguard_journal_queued_bytes")
    qb2 = pick(m2, "zkguard_journal_queued_bytes")
    res = {
        "binary": binary, "build": label, "n": n, "doc_bytes_target": size,
        "doc_json_bytes_avg": round(doc_bytes / n, 1),
        "bulk_line_bytes_avg": round(line_bytes / n, 1),
        "batch": batch,
        "start_s": round(t_start, 3),
        "rss_before_kib": before["VmRSS"], "anon_before_kib": before["RssAnon"],
        "rss_after_kib": after["VmRSS"], "anon_after_kib": after["RssAnon"],
        "hwm_after_kib": after["VmHWM"],
        "queue_s": round(t_queue, 2),
        "delta_rss_per_op_b": round((after["VmRSS"] - before["VmRSS"]) * 1024 / n, 1),
        "delta_anon_per_op_b": round((after["RssAnon"] - before["RssAnon"]) * 1024 / n, 1),
        "journal_bytes": jsize, "journal_per_op_b": round(jsize / n, 1),
        "queued_bytes_metric": qb, "queued_bytes_per_op_b": round(qb / n, 1) if qb else None,
        "queue_depth_metric": pick(m1, "zkguard_background_queue_depth"),
        "journal_depth_metric": pick(m1, "zkguard_journal_depth"),
        "docs_in_es": applied,
        "restart_to_start_line_s": round(t_restart, 3),
        "restart_replayed": info2.get("replayed"),
        "restart_rss_at_line_kib": at_line["VmRSS"], "restart_hwm_at_line_kib": at_line["VmHWM"],
        "restart_requeue_after_line_s": round(t_requeued, 3),
        "restart_hwm_kib": re["VmHWM"], "restart_rss_kib": re["VmRSS"],
        "restart_anon_kib": re["RssAnon"],
        "restart_journal_bytes": jsize2,
        "restart_queued_bytes_metric": qb2,
    }
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binaries", default=",".join(DEFAULT_BINARIES))
    ap.add_argument("--counts", default="20000,100000")
    ap.add_argument("--sizes", default="200,1000")
    ap.add_argument("--batch", type=int, default=1000, help="bulk lines per request")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before each reading")
    args = ap.parse_args()
    global EXEC_BINARY
    binaries = [os.path.abspath(b) for b in args.binaries.split(",")]
    EXEC_BINARY = binaries[0]
    os.makedirs(os.path.join(WORK, "logs"), exist_ok=True)
    results_path = os.path.join(WORK, "results.jsonl")
    results = []
    try:
        zk_port = start_zookeeper()
        es_url = start_osmem()
        start_exec(base_env(zk_port, es_url, os.path.join(WORK, "unused.jsonl")))
        for binary in binaries:
            label = "release" if "/release/" in binary or "release" in os.path.basename(binary) else "debug"
            for size in [int(s) for s in args.sizes.split(",")]:
                for n in [int(c) for c in args.counts.split(",")]:
                    log(f"run: {label} size={size} n={n}")
                    r = one_run(binary, label, n, size, args.batch, args.settle, zk_port, es_url)
                    log(json.dumps(r))
                    with open(results_path, "a") as f:
                        f.write(json.dumps(r) + "\n")
                    results.append(r)
    finally:
        for name, p in reversed(started):
            if name == "osmem" and p.poll() is None:
                try:
                    p.stdin.close()  # osmem exits when its stdin closes
                    p.wait(10)
                except Exception:
                    pass
            stop(name, p)
        for f in ("j.jsonl", "j.jsonl.lock", "unused.jsonl", "unused.jsonl.lock", "dl.jsonl"):
            try:
                os.remove(os.path.join(WORK, f))
            except FileNotFoundError:
                pass
        for f in os.listdir(WORK):
            if f.startswith("j.jsonl"):  # compaction leftovers, damaged copies
                os.remove(os.path.join(WORK, f))
        shutil.rmtree(os.path.join(WORK, "zk"), ignore_errors=True)
    print_table(results)


def print_table(results):
    mib = lambda k: f"{k / 1024:.1f}"
    hdr = ("build", "doc B", "N", "RSS0 MiB", "RSS1 MiB", "HWM1 MiB", "dRSS/op B", "dAnon/op B",
           "journal/op B", "qbytes/op B", "restart s", "re HWM MiB", "re RSS MiB")
    rows = [hdr]
    for r in results:
        rows.append((r["build"], str(round(r["doc_json_bytes_avg"])), str(r["n"]),
                     mib(r["rss_before_kib"]), mib(r["rss_after_kib"]), mib(r["hwm_after_kib"]),
                     str(r["delta_rss_per_op_b"]), str(r["delta_anon_per_op_b"]),
                     str(r["journal_per_op_b"]), str(r["queued_bytes_per_op_b"]),
                     str(r["restart_to_start_line_s"]),
                     mib(r["restart_hwm_kib"]), mib(r["restart_rss_kib"])))
    w = [max(len(row[i]) for row in rows) for i in range(len(hdr))]
    for row in rows:
        print(" | ".join(c.rjust(w[i]) for i, c in enumerate(row)))


if __name__ == "__main__":
    main()
