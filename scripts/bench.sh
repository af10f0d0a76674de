#!/usr/bin/env bash
# Benchmarks zkguard's ZooKeeper lock against Apache Curator's InterProcessMutex and kazoo's Lock,
# all three against the same two local ZooKeeper servers started here (tickTime 2000): one with
# forceSync on and its data on disk, as in a default production setup, and one with forceSync=no
# and its data on tmpfs (/dev/shm), which shows the clients' own cost. Same counts for all, one
# benchmark at a time (so each counts only its own requests); zkguard's Elasticsearch lease lock
# runs against a local osmem-server (its own column: the peers are ZooKeeper-only). Prints one
# table per server (medians with the min-max spread), then the zkguard/Curator ratios beside the
# goals (hand-offs/s 2.0x with forceSync=no and 1.5x with forceSync on, throughput 1.5x and 1.2x;
# requests per hand-off at most Curator's), and zkguard's requests beside their goals (at most 3
# per hand-off between sessions, 1 per same-session hand-off), and writes the combined JSON to target/bench/results.json. Beside
# the wall-clock figures, each peer counts the server's requests (zk_packets_received) and
# measures its own CPU time and the server's (/proc/PID/stat of the ZooKeeper process) per cycle,
# per hand-off and per throughput cycle: figures that a busy machine does not move. zkguard's
# clients go from lock to lock with release_and_acquire (the next acquisition's first multi also
# releases the lock held); a second zkguard column ("zkguard sep.", --separate-release) releases
# each lock on its own first, as the peers do, and its ratio to Curator is printed beside each goal.
#
# Usage: scripts/bench.sh [--iterations N] [--contenders N] [--monitors N] [--rounds N]
#                        [--warmup-iterations N] [--no-build]
#        (or ITERATIONS=, CONTENDERS=, MONITORS=, ROUNDS=, WARMUP_ITERATIONS= in the environment;
#        5 rounds by default, interleaved, after an unmeasured warm-up of each server by zkguard
#        and Curator with 5000 iterations each; ZKGUARD_BIN=path runs that zkguard binary instead
#        of building one)
# Needs: cargo, java + javac, the Debian packages of scripts/install-deps.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ITERATIONS="${ITERATIONS:-1000}"
CONTENDERS="${CONTENDERS:-4}"
MONITORS="${MONITORS:-8}"
ROUNDS="${ROUNDS:-5}"
WARMUP_ITERATIONS="${WARMUP_ITERATIONS:-5000}"
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --iterations) ITERATIONS="$2"; shift 2 ;;
        --contenders) CONTENDERS="$2"; shift 2 ;;
        --monitors) MONITORS="$2"; shift 2 ;;
        --rounds) ROUNDS="$2"; shift 2 ;;
        --warmup-iterations) WARMUP_ITERATIONS="$2"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done
for n in "$ITERATIONS" "$CONTENDERS" "$MONITORS" "$ROUNDS" "$WARMUP_ITERATIONS"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: counts must be positive integers, got '$n'" >&2; exit 64; }
done

OUT="$ROOT/target/bench"
mkdir -p "$OUT"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/zkguard-bench-XXXXXX")"
# The forceSync=no server keeps its data on tmpfs when there is one.
SHM_ROOT=/dev/shm
{ [ -d "$SHM_ROOT" ] && [ -w "$SHM_ROOT" ]; } || SHM_ROOT="${TMPDIR:-/tmp}"
SHM="$(mktemp -d "$SHM_ROOT/zkguard-bench-XXXXXX")"
ZK_PIDS=()
cleanup() {
    for pid in "${ZK_PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need() { command -v "$1" >/dev/null 2>&1 || { echo "bench.sh: $1 not found; run scripts/install-deps.sh" >&2; exit 69; }; }
need java
need javac
[ -f /usr/share/java/zookeeper.jar ] || { echo "bench.sh: ZooKeeper jars missing; run scripts/install-deps.sh" >&2; exit 69; }
PY=/usr/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)"

# --- zkguard build (before the servers start, so the build does not disturb them) ------------
ZKGUARD="${ZKGUARD_BIN:-$ROOT/target/release/zkguard}"
[ -z "${ZKGUARD_BIN:-}" ] || BUILD=0
if [ "$BUILD" = 1 ]; then
    echo "building zkguard (cargo build --release --features testkit) ..." >&2
    if ! (cd "$ROOT" && cargo build --release --features testkit --quiet) >"$OUT/build.log" 2>&1; then
        echo "bench.sh: cargo build --release --features testkit failed (see $OUT/build.log); zkguard column is n/a" >&2
    fi
fi

# --- Curator build ---------------------------------------------------------------------------
J=/usr/share/java
CURATOR_CP="$J/curator-recipes.jar:$J/curator-framework.jar:$J/curator-client.jar:$J/zookeeper.jar"
CURATOR_CP="$CURATOR_CP:$J/zookeeper-jute.jar:$J/guava.jar:$J/slf4j-api.jar:$J/slf4j-nop.jar"
CURATOR_BUILD="$OUT/curator-classes"
mkdir -p "$CURATOR_BUILD"
CURATOR_OK=1
if [ ! -f "$J/curator-recipes.jar" ]; then
    echo "bench.sh: Curator jars missing (run scripts/install-deps.sh); Curator column is n/a" >&2
    CURATOR_OK=0
elif ! javac -nowarn -d "$CURATOR_BUILD" -cp "$CURATOR_CP" "$ROOT/bench/curator/CuratorBench.java" \
    >"$OUT/curator-build.log" 2>&1; then
    echo "bench.sh: compiling CuratorBench failed (see $OUT/curator-build.log)" >&2
    CURATOR_OK=0
fi

# --- ZooKeeper (the same command line as zkguard::testkit) -----------------------------------
# Two servers: "sync" (forceSync on, data under $WORK) and "nosync" (forceSync=no, data on tmpfs).
MODES=(sync nosync)
declare -A ZK_AT
declare -A ZK_PID
free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
four_letter() {
    "$PY" - "$1" "$2" <<'EOF'
import socket, sys
try:
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2) as s:
        s.sendall(sys.argv[2].encode()); s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            d = s.recv(65536)
            if not d: break
            out += d
    sys.stdout.write(out.decode())
except OSError:
    pass
EOF
}
# start_zk MODE DATA_DIR FORCE_SYNC(yes|no): starts a server and records its address in ZK_AT.
start_zk() {
    local mode="$1" data="$2" sync="$3" port pid
    port="$(free_port)"
    mkdir -p "$data"
    cat >"$WORK/zoo-$mode.cfg" <<EOF
tickTime=2000
dataDir=$data
clientPort=$port
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
forceSync=$sync
EOF
    java -Xmx512m -Xms32m -XX:+UseSerialGC -XX:-UsePerfData -Djava.net.preferIPv4Stack=true \
        -Dzookeeper.extendedTypesEnabled=true -Dzookeeper.admin.enableServer=false \
        -Dzookeeper.jmx.log4j.disable=true -Dzookeeper.forceSync="$sync" \
        -cp "$J/zookeeper.jar:$J/slf4j-simple.jar:$J/*" \
        org.apache.zookeeper.server.ZooKeeperServerMain "$WORK/zoo-$mode.cfg" \
        >"$WORK/zookeeper-$mode.log" 2>&1 </dev/null &
    pid=$!
    ZK_PIDS+=("$pid")
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || break
        if four_letter "$port" srvr | grep -q '^Mode: standalone' \
            && four_letter "$port" conf | grep -q "^dataDir=$data"; then
            ZK_AT[$mode]="127.0.0.1:$port"
            ZK_PID[$mode]="$pid"
            return 0
        fi
        sleep 0.1
    done
    echo "bench.sh: ZooKeeper (forceSync=$sync) did not start on 127.0.0.1:$port; last log lines:" >&2
    tail -n 30 "$WORK/zookeeper-$mode.log" >&2
    exit 69
}
start_zk sync "$WORK/data" yes
start_zk nosync "$SHM/data" no
echo "ZooKeeper ready at ${ZK_AT[sync]} (forceSync on, data on disk) and ${ZK_AT[nosync]} (forceSync=no, data in $SHM_ROOT), tickTime 2000; $ITERATIONS iterations, $CONTENDERS contenders, $MONITORS monitors, $ROUNDS rounds" >&2

COUNTS=(--iterations "$ITERATIONS" --contenders "$CONTENDERS" --monitors "$MONITORS")
# Runs one bench; keeps the last JSON-object line of its output in $OUT/<tag>-<round>.json
# (empty on failure) and its stderr in $OUT/<tag>-<round>.log.
run_peer() {
    local name="$1" round="$2"
    shift 2
    echo "round $round: running $name ..." >&2
    local start=$SECONDS
    local rc=0
    timeout 600 "$@" >"$OUT/$name-$round.out" 2>"$OUT/$name-$round.log" || rc=$?
    if [ "$rc" = 0 ]; then
        grep '^{' "$OUT/$name-$round.out" | tail -n 1 >"$OUT/$name-$round.json" || true
        echo "  $name: done in $((SECONDS - start)) s" >&2
    else
        : >"$OUT/$name-$round.json"
        echo "  $name: failed (exit $rc); see $OUT/$name-$round.log" >&2
        tail -n 5 "$OUT/$name-$round.log" | sed 's/^/    /' >&2
    fi
}

HAVE_KAZOO=0
"$PY" -c 'import kazoo' 2>/dev/null && HAVE_KAZOO=1
ZKGUARD_SERVER_PID=0
[ ! -x "$ZKGUARD" ] || ! "$ZKGUARD" bench --help 2>/dev/null | grep -q -- --server-pid || ZKGUARD_SERVER_PID=1
[ -x "$ZKGUARD" ] || echo "  zkguard: $ZKGUARD not built; n/a" >&2
ZKGUARD_SEPARATE=0
[ ! -x "$ZKGUARD" ] || ! "$ZKGUARD" bench --help 2>/dev/null | grep -q -- --separate-release || ZKGUARD_SEPARATE=1
[ "$HAVE_KAZOO" = 1 ] || echo "  kazoo: python3-kazoo missing (run scripts/install-deps.sh); n/a" >&2

# zkguard's own configuration must not redirect the run (lock.backend, a config file); its
# sessions get the peers' 30 s session timeout (fewer pings counted than with the default 5 s).
ZKGUARD_ENV=(env -u ZKGUARD_CONFIG -u ZKGUARD_LOCK_BACKEND -u RUST_LOG
    ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT=30000)
# run_one NAME MODE ROUND: results go to $OUT/NAME-MODE-ROUND.json (zkguard-es: NAME-ROUND.json,
# it does not use ZooKeeper).
run_one() {
    local name="$1" mode="$2" round="$3"
    local zk="" tag="$name-$mode" server=() zkguard_server=()
    # Each peer also measures the server's CPU time per cycle, hand-off and throughput cycle
    # (a zkguard binary older than --server-pid, given by ZKGUARD_BIN, does without).
    [ -z "$mode" ] || { zk="${ZK_AT[$mode]}"; server=(--server-pid "${ZK_PID[$mode]}"); }
    [ "$ZKGUARD_SERVER_PID" != 1 ] || zkguard_server=("${server[@]}")
    case "$name" in
        zkguard)
            [ -x "$ZKGUARD" ] || { : >"$OUT/$tag-$round.json"; return; }
            run_peer "$tag" "$round" "${ZKGUARD_ENV[@]}" "$ZKGUARD" bench --backend zookeeper --json \
                --zk "$zk" "${zkguard_server[@]}" "${COUNTS[@]}" ;;
        zkguard-sep)
            # The same, releasing each lock on its own as the peers do (a binary older than the
            # flag: n/a).
            { [ -x "$ZKGUARD" ] && [ "$ZKGUARD_SEPARATE" = 1 ]; } || { : >"$OUT/$tag-$round.json"; return; }
            run_peer "$tag" "$round" "${ZKGUARD_ENV[@]}" "$ZKGUARD" bench --backend zookeeper --json \
                --separate-release --zk "$zk" "${zkguard_server[@]}" "${COUNTS[@]}" ;;
        curator)
            [ "$CURATOR_OK" = 1 ] || { : >"$OUT/$tag-$round.json"; return; }
            run_peer "$tag" "$round" java -XX:+UseSerialGC -cp "$CURATOR_BUILD:$CURATOR_CP" CuratorBench \
                --json --zk "$zk" "${server[@]}" "${COUNTS[@]}" ;;
        kazoo)
            [ "$HAVE_KAZOO" = 1 ] || { : >"$OUT/$tag-$round.json"; return; }
            run_peer "$tag" "$round" "$PY" "$ROOT/bench/kazoo/kazoo_bench.py" --json --zk "$zk" \
                "${server[@]}" "${COUNTS[@]}" ;;
        zkguard-es)
            # The Elasticsearch lease lock, against an osmem-server that zkguard starts and stops.
            [ -x "$ZKGUARD" ] || { : >"$OUT/$name-$round.json"; return; }
            run_peer "$name" "$round" "${ZKGUARD_ENV[@]}" "$ZKGUARD" bench --backend elasticsearch --local \
                --json "${COUNTS[@]}" ;;
    esac
}
# Warm each server up first, unmeasured: a ZooKeeper that has just started spends several times
# the CPU per request until its JVM has compiled its hot code (about 20,000 lock cycles: server CPU
# per uncontended cycle fell from 1.7 ms to 0.5 ms over them here), which would slow whichever
# rounds came first. Every peer takes part, so the server warms up on each one's mix of requests.
echo "warming up the servers ($WARMUP_ITERATIONS iterations of each peer) ..." >&2
for mode in "${MODES[@]}"; do
    zk="${ZK_AT[$mode]}"
    warm=(--zk "$zk" --iterations "$WARMUP_ITERATIONS" --contenders "$CONTENDERS" --monitors "$MONITORS")
    [ ! -x "$ZKGUARD" ] || timeout 600 "${ZKGUARD_ENV[@]}" "$ZKGUARD" bench --backend zookeeper --json \
        "${warm[@]}" >/dev/null 2>&1 || true
    [ "$CURATOR_OK" != 1 ] || timeout 600 java -XX:+UseSerialGC -cp "$CURATOR_BUILD:$CURATOR_CP" \
        CuratorBench "${warm[@]}" >/dev/null 2>&1 || true
    [ "$HAVE_KAZOO" != 1 ] || timeout 600 "$PY" "$ROOT/bench/kazoo/kazoo_bench.py" --zk "$zk" \
        --iterations 300 --contenders "$CONTENDERS" --monitors "$MONITORS" >/dev/null 2>&1 || true
done

# Rounds interleave the peers and the two servers, each round in a rotated order, so that neither
# a slow start nor a burst of load on the machine favours one of them; the tables show each
# figure's median and its spread over the rounds.
rm -f "$OUT"/{zkguard,zkguard-sep,curator,kazoo}-{sync,nosync}-[0-9]*.{json,out,log} \
    "$OUT"/{zkguard,curator,kazoo,zkguard-es}{,-[0-9]*}.{json,out,log}
ORDER=(zkguard curator zkguard-sep kazoo)
for round in $(seq 1 "$ROUNDS"); do
    for m in 0 1; do
        mode="${MODES[$(((m + round - 1) % 2))]}"
        for i in 0 1 2 3; do
            run_one "${ORDER[$(((i + round - 1) % 4))]}" "$mode" "$round"
        done
    done
    run_one zkguard-es "" "$round"
done

# --- tables and combined JSON ----------------------------------------------------------------
"$PY" - "$OUT" "${ZK_AT[sync]}" "${ZK_AT[nosync]}" "$SHM_ROOT" "$ITERATIONS" "$CONTENDERS" \
    "$MONITORS" "$ROUNDS" <<'EOF'
import json, os, statistics, sys

out, zk_sync, zk_nosync, shm_root = sys.argv[1:5]
iterations, contenders, monitors, rounds = map(int, sys.argv[5:9])
FIGURES = [
    ("uncontended.p50_ms", "uncontended p50 (ms, lower is better)"),
    ("uncontended.p99_ms", "uncontended p99 (ms, lower is better)"),
    ("uncontended.requests_per_cycle", "requests per cycle (lower is better)"),
    ("uncontended.cpu_ms_per_cycle", "client CPU ms per cycle (lower is better)"),
    ("uncontended.server_cpu_ms_per_cycle", "server CPU ms per cycle (lower is better)"),
    ("contended.handoffs_per_sec", "contended hand-offs/s (higher is better)"),
    ("contended.owner_changes_per_sec", "  of which to another session/s"),
    ("contended.requests_per_handoff", "  requests per hand-off (lower is better)"),
    ("contended.cpu_ms_per_handoff", "  client CPU ms per hand-off (lower is better)"),
    ("contended.server_cpu_ms_per_handoff", "  server CPU ms per hand-off (lower is better)"),
    ("throughput.ops_per_sec", "throughput ops/s (higher is better)"),
    ("throughput.requests_per_op", "  requests per cycle (lower is better)"),
    ("throughput.cpu_ms_per_op", "  client CPU ms per cycle (lower is better)"),
    ("throughput.server_cpu_ms_per_op", "  server CPU ms per cycle (lower is better)"),
    ("same_session.handoffs_per_sec", "same-session hand-offs/s (zkguard only)"),
    ("same_session.requests_per_handoff", "  requests per same-session hand-off"),
    ("same_session.cpu_ms_per_handoff", "  client CPU ms per same-session hand-off"),
]
PEERS = [("zkguard", "zkguard"), ("curator", "Curator"), ("kazoo", "kazoo")]
# zkguard releasing each lock on its own before the next acquisition (--separate-release), as the
# peers do: beside the others, with its own ratio to Curator in the goals.
SEPARATE = [("zkguard-sep", "zkguard sep.")]
# zkguard's Elasticsearch lease lock: its own column, no ratios (the peers are ZooKeeper-only),
# in the first table only (it does not use ZooKeeper).
EXTRA = [("zkguard-es", "zkguard ES")]
MODES = [
    ("sync", zk_sync, True, "forceSync on, data on disk"),
    ("nosync", zk_nosync, False, "forceSync=no, data in %s" % shm_root),
]


def load(tag, round_):
    try:
        with open(os.path.join(out, "%s-%d.json" % (tag, round_))) as f:
            text = f.read().strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def figure(result, key):
    """Reads `a.b` nested ({"a": {"b": ..}}) or flat ({"a.b": ..})."""
    if result is None:
        return None
    if key in result:
        value = result[key]
    else:
        value = result
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def fmt(v, digits=3):
    if v is None:
        return "n/a"
    return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:.0f}"


def stats(values):
    """(median, min, max) of the values present, or three Nones."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def cell(s):
    median, lo, hi = s
    return "n/a" if median is None else f"{fmt(median, 4)} [{fmt(lo)}-{fmt(hi)}]"


combined_modes = {}
for index, (mode, zk, force_sync, title) in enumerate(MODES):
    results = {
        name: [load("%s-%s" % (name, mode), r) for r in range(1, rounds + 1)]
        for name, _ in PEERS + SEPARATE
    }
    extra = EXTRA if index == 0 else []
    for name, _ in extra:
        results[name] = [load(name, r) for r in range(1, rounds + 1)]
    rows = []
    table = {}
    for key, label in FIGURES:
        st = {name: stats(figure(res, key) for res in results[name]) for name in results}
        vals = {name: s[0] for name, s in st.items()}
        r_cur = ratio(vals["zkguard"], vals["curator"])
        r_kaz = ratio(vals["zkguard"], vals["kazoo"])
        table[key] = {
            **vals,
            "zkguard/curator": r_cur,
            "zkguard/kazoo": r_kaz,
            "spread": {name: [s[1], s[2]] for name, s in st.items()},
        }
        table[key]["zkguard-sep/curator"] = ratio(vals["zkguard-sep"], vals["curator"])
        rows.append(
            [label]
            + [cell(st[n]) for n, _ in PEERS]
            + [fmt(r_cur), fmt(r_kaz)]
            + [cell(st[n]) for n, _ in SEPARATE + extra]
        )
    header = ["figure"] + [t for _, t in PEERS] + ["zkguard/Curator", "zkguard/kazoo"]
    header += [t for _, t in SEPARATE + extra]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = lambda cells: "  ".join(
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
    )
    print(f"ZooKeeper {zk}: {title}, tickTime 2000")
    print(line(header))
    print(line(["-" * w for w in widths]))
    for r in rows:
        print(line(r))
    print()
    combined_modes[mode] = {
        "zookeeper": {"connect": zk, "tick_time_ms": 2000, "force_sync": force_sync},
        "results": results,
        "table": table,
    }
print(
    f"median [min-max] of {rounds} interleaved rounds; ratios of the medians; zkguard: each "
    f"client releases a lock in its next acquisition (release_and_acquire); zkguard sep.: on its "
    f"own, then acquires (--separate-release), as the peers; zkguard ES: osmem-server started by "
    f"zkguard; {iterations} iterations, {contenders} contenders, {monitors} monitors"
)

# The goals: zkguard/Curator of the medians, per server, beside the target; the spread of the
# ratio is the worst and best pairing of the rounds' extremes. Beside it, the paired ratios: in
# each round zkguard and Curator ran within a minute of each other against the same server, so a
# round's ratio cancels most of what the machine did between rounds; their median and range, and
# in how many rounds zkguard was ahead (for the request count: within 1% counts).
GOALS = [
    ("contended.handoffs_per_sec", "contended hand-offs/s", "min", {"nosync": 2.0, "sync": 1.5}),
    ("throughput.ops_per_sec", f"throughput over {monitors} monitors, ops/s", "min",
     {"nosync": 1.5, "sync": 1.2}),
    ("contended.requests_per_handoff", "requests per hand-off", "max", {"nosync": 1.0, "sync": 1.0}),
]
goals = {}
print()
print("goals, zkguard/Curator (ratio of the medians [lowest-highest over the rounds]; "
      "per round: median [min-max] of each round's ratio, rounds ahead):")
for mode, _, _, title in reversed(MODES):
    table = combined_modes[mode]["table"]
    for key, label, kind, targets in GOALS:
        row = table[key]
        r = row["zkguard/curator"]
        (zlo, zhi), (clo, chi) = row["spread"]["zkguard"], row["spread"]["curator"]
        lo, hi = ratio(zlo, chi), ratio(zhi, clo)
        target = targets[mode]
        # Request counts carry the sessions' pings and the first and last cycles of a run:
        # within 1% counts as equal.
        slack = 1.0 if kind == "min" else 1.01
        met = None if r is None else (r >= target if kind == "min" else r <= target * slack)
        verdict = {None: "n/a", True: "met", False: "NOT met"}[met]
        sign = ">=" if kind == "min" else "<="
        note = "" if kind == "min" else " (within 1%%; zkguard %s, Curator %s)" % (
            fmt(row["zkguard"]), fmt(row["curator"]))
        runs = combined_modes[mode]["results"]
        paired = [ratio(figure(z, key), figure(c, key))
                  for z, c in zip(runs["zkguard"], runs["curator"])]
        paired = [p for p in paired if p is not None]
        p_med, p_lo, p_hi = stats(paired)
        ahead = sum(1 for p in paired if (p > 1 if kind == "min" else p <= slack))
        per_round = (f"; per round {fmt(p_med)} [{fmt(p_lo)}-{fmt(p_hi)}], "
                     f"ahead in {ahead}/{len(paired)}") if paired else ""
        r_sep = row["zkguard-sep/curator"]
        separate = "" if r_sep is None else f"; separate release {fmt(r_sep)}"
        print(f"  {title:<32} {label:<40} {fmt(r)} [{fmt(lo)}-{fmt(hi)}]"
              f"  goal {sign} {target:g}: {verdict}{note}{per_round}{separate}")
        goals.setdefault(mode, {})[key] = {
            "ratio": r, "spread": [lo, hi], "goal": target, "kind": kind, "met": met,
            "per_round": paired, "rounds_ahead": ahead, "separate_release_ratio": r_sep,
        }

# Absolute goals on zkguard's own request counts (the median over the rounds, within 1%): a
# hand-off between sessions, and one between a holder and a waiter of its own session.
ABSOLUTE = [
    ("contended.requests_per_handoff", "requests per cross-session hand-off", 3.0),
    ("same_session.requests_per_handoff", "requests per same-session hand-off", 1.0),
]
print()
print("goals, zkguard's requests (median over the rounds [lowest-highest]):")
for mode, _, _, title in reversed(MODES):
    table = combined_modes[mode]["table"]
    for key, label, target in ABSOLUTE:
        row = table[key]
        value, (lo, hi) = row["zkguard"], row["spread"]["zkguard"]
        met = None if value is None else value <= target * 1.01
        verdict = {None: "n/a", True: "met", False: "NOT met"}[met]
        print(f"  {title:<32} {label:<40} {fmt(value)} [{fmt(lo)}-{fmt(hi)}]"
              f"  goal <= {target:g}: {verdict}")
        goals.setdefault(mode, {})["zkguard." + key] = {
            "value": value, "spread": [lo, hi], "goal": target, "kind": "max", "met": met,
        }

# The forceSync-on figures keep their place at the top level; forceSync=no sits beside them.
combined = {
    **{k: combined_modes["sync"][k] for k in ("zookeeper", "results", "table")},
    "iterations": iterations,
    "contenders": contenders,
    "monitors": monitors,
    "rounds": rounds,
    "force_sync_off": combined_modes["nosync"],
    "goals": {"force_sync_off": goals.get("nosync", {}), "force_sync_on": goals.get("sync", {})},
}
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(combined, f, indent=2)
print(f"\nwritten {os.path.join(out, 'results.json')}")
EOF
