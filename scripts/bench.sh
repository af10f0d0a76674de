#!/usr/bin/env bash
# Benchmarks zkguard's ZooKeeper lock against Apache Curator's InterProcessMutex and kazoo's Lock,
# all three against ONE local ZooKeeper started here (tickTime 2000, forceSync on, as in a default
# production setup), with the same counts, and zkguard's Elasticsearch lease lock against a local
# osmem-server (its own column: the peers are ZooKeeper-only). Prints one table and writes the
# combined JSON to target/bench/results.json.
#
# Usage: scripts/bench.sh [--iterations N] [--contenders N] [--monitors N] [--rounds N] [--no-build]
#        (or ITERATIONS=, CONTENDERS=, MONITORS=, ROUNDS= in the environment; 3 rounds by default,
#        interleaved, the table shows medians)
# Needs: cargo, java + javac, the Debian packages of scripts/install-deps.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ITERATIONS="${ITERATIONS:-1000}"
CONTENDERS="${CONTENDERS:-4}"
MONITORS="${MONITORS:-8}"
ROUNDS="${ROUNDS:-3}"
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --iterations) ITERATIONS="$2"; shift 2 ;;
        --contenders) CONTENDERS="$2"; shift 2 ;;
        --monitors) MONITORS="$2"; shift 2 ;;
        --rounds) ROUNDS="$2"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done
for n in "$ITERATIONS" "$CONTENDERS" "$MONITORS" "$ROUNDS"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: counts must be positive integers, got '$n'" >&2; exit 64; }
done

OUT="$ROOT/target/bench"
mkdir -p "$OUT"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/zkguard-bench-XXXXXX")"
ZK_PID=""
cleanup() {
    if [ -n "$ZK_PID" ] && kill -0 "$ZK_PID" 2>/dev/null; then
        kill "$ZK_PID" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$ZK_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$ZK_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need() { command -v "$1" >/dev/null 2>&1 || { echo "bench.sh: $1 not found; run scripts/install-deps.sh" >&2; exit 69; }; }
need java
need javac
[ -f /usr/share/java/zookeeper.jar ] || { echo "bench.sh: ZooKeeper jars missing; run scripts/install-deps.sh" >&2; exit 69; }
PY=/usr/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)"

# --- zkguard build (before the server starts, so the build does not disturb it) ----------------
ZKGUARD="$ROOT/target/release/zkguard"
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
PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
mkdir -p "$WORK/data"
cat >"$WORK/zoo.cfg" <<EOF
tickTime=2000
dataDir=$WORK/data
clientPort=$PORT
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
EOF
java -Xmx512m -Xms32m -XX:+UseSerialGC -XX:-UsePerfData -Djava.net.preferIPv4Stack=true \
    -Dzookeeper.extendedTypesEnabled=true -Dzookeeper.admin.enableServer=false \
    -Dzookeeper.jmx.log4j.disable=true \
    -cp "$J/zookeeper.jar:$J/slf4j-simple.jar:$J/*" \
    org.apache.zookeeper.server.ZooKeeperServerMain "$WORK/zoo.cfg" >"$WORK/zookeeper.log" 2>&1 </dev/null &
ZK_PID=$!

four_letter() {
    "$PY" - "$PORT" "$1" <<'EOF'
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
ready=0
for _ in $(seq 1 300); do
    kill -0 "$ZK_PID" 2>/dev/null || break
    if four_letter srvr | grep -q '^Mode: standalone' && four_letter conf | grep -q "^dataDir=$WORK/data"; then
        ready=1
        break
    fi
    sleep 0.1
done
if [ "$ready" != 1 ]; then
    echo "bench.sh: ZooKeeper did not start on 127.0.0.1:$PORT; last log lines:" >&2
    tail -n 30 "$WORK/zookeeper.log" >&2
    exit 69
fi
ZK="127.0.0.1:$PORT"
echo "ZooKeeper ready at $ZK (tickTime 2000, forceSync on); $ITERATIONS iterations, $CONTENDERS contenders, $MONITORS monitors" >&2

COUNTS=(--iterations "$ITERATIONS" --contenders "$CONTENDERS" --monitors "$MONITORS")
# Runs one bench; keeps the last JSON-object line of its output in $OUT/<name>-<round>.json
# (empty on failure) and its stderr in $OUT/<name>-<round>.log.
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

# Warm the server's JIT and disk first, so the first measured bench is not penalised.
HAVE_KAZOO=0
"$PY" -c 'import kazoo' 2>/dev/null && HAVE_KAZOO=1
if [ "$HAVE_KAZOO" = 1 ]; then
    echo "warming up the server ..." >&2
    timeout 120 "$PY" "$ROOT/bench/kazoo/kazoo_bench.py" --zk "$ZK" --iterations 300 \
        --contenders "$CONTENDERS" --monitors "$MONITORS" >/dev/null 2>&1 || true
fi
[ -x "$ZKGUARD" ] || echo "  zkguard: $ZKGUARD not built; n/a" >&2
[ "$HAVE_KAZOO" = 1 ] || echo "  kazoo: python3-kazoo missing (run scripts/install-deps.sh); n/a" >&2

# zkguard's own configuration must not redirect the run (lock.backend, a config file).
ZKGUARD_ENV=(env -u ZKGUARD_CONFIG -u ZKGUARD_LOCK_BACKEND -u RUST_LOG)
run_one() {
    local name="$1" round="$2"
    case "$name" in
        zkguard)
            [ -x "$ZKGUARD" ] || { : >"$OUT/$name-$round.json"; return; }
            run_peer "$name" "$round" "${ZKGUARD_ENV[@]}" "$ZKGUARD" bench --backend zookeeper --json \
                --zk "$ZK" "${COUNTS[@]}" ;;
        curator)
            [ "$CURATOR_OK" = 1 ] || { : >"$OUT/$name-$round.json"; return; }
            run_peer "$name" "$round" java -XX:+UseSerialGC -cp "$CURATOR_BUILD:$CURATOR_CP" CuratorBench \
                --json --zk "$ZK" "${COUNTS[@]}" ;;
        kazoo)
            [ "$HAVE_KAZOO" = 1 ] || { : >"$OUT/$name-$round.json"; return; }
            run_peer "$name" "$round" "$PY" "$ROOT/bench/kazoo/kazoo_bench.py" --json --zk "$ZK" "${COUNTS[@]}" ;;
        zkguard-es)
            # The Elasticsearch lease lock, against an osmem-server that zkguard starts and stops.
            [ -x "$ZKGUARD" ] || { : >"$OUT/$name-$round.json"; return; }
            run_peer "$name" "$round" "${ZKGUARD_ENV[@]}" "$ZKGUARD" bench --backend elasticsearch --local \
                --json "${COUNTS[@]}" ;;
    esac
}
# Rounds interleave the peers, each round in a rotated order, so that neither a slow start nor
# a burst of load on the machine favours one of them; the table shows each figure's median.
rm -f "$OUT"/{zkguard,curator,kazoo,zkguard-es}{,-[0-9]*}.{json,out,log}
ORDER=(zkguard curator kazoo)
for round in $(seq 1 "$ROUNDS"); do
    for i in 0 1 2; do
        run_one "${ORDER[$(((i + round - 1) % 3))]}" "$round"
    done
    run_one zkguard-es "$round"
done

# --- table and combined JSON -----------------------------------------------------------------
"$PY" - "$OUT" "$ZK" "$ITERATIONS" "$CONTENDERS" "$MONITORS" "$ROUNDS" <<'EOF'
import json, os, statistics, sys

out, zk = sys.argv[1], sys.argv[2]
iterations, contenders, monitors, rounds = map(int, sys.argv[3:7])
FIGURES = [
    ("uncontended.p50_ms", "uncontended p50 (ms, lower is better)"),
    ("uncontended.p99_ms", "uncontended p99 (ms, lower is better)"),
    ("uncontended.requests_per_cycle", "requests per cycle (lower is better)"),
    ("contended.handoffs_per_sec", "contended hand-offs/s (higher is better)"),
    ("contended.owner_changes_per_sec", "  of which to another session/s"),
    ("contended.requests_per_handoff", "  requests per hand-off (lower is better)"),
    ("throughput.ops_per_sec", "throughput ops/s (higher is better)"),
]
PEERS = [("zkguard", "zkguard"), ("curator", "Curator"), ("kazoo", "kazoo")]
# zkguard's Elasticsearch lease lock: its own column, no ratios (the peers are ZooKeeper-only).
EXTRA = [("zkguard-es", "zkguard ES")]


def load(name, round_):
    try:
        with open(os.path.join(out, "%s-%d.json" % (name, round_))) as f:
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


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


results = {name: [load(name, r) for r in range(1, rounds + 1)] for name, _ in PEERS + EXTRA}
rows = []
table = {}
for key, label in FIGURES:
    vals = {name: median(figure(res, key) for res in results[name]) for name, _ in PEERS + EXTRA}
    r_cur = ratio(vals["zkguard"], vals["curator"])
    r_kaz = ratio(vals["zkguard"], vals["kazoo"])
    table[key] = {**vals, "zkguard/curator": r_cur, "zkguard/kazoo": r_kaz}
    rows.append(
        [label]
        + [fmt(vals[n], 4) for n, _ in PEERS]
        + [fmt(r_cur), fmt(r_kaz)]
        + [fmt(vals[n], 4) for n, _ in EXTRA]
    )

header = ["figure"] + [title for _, title in PEERS] + ["zkguard/Curator", "zkguard/kazoo"]
header += [title for _, title in EXTRA]
widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
print(line(header))
print(line(["-" * w for w in widths]))
for r in rows:
    print(line(r))
print(
    f"\nmedians of {rounds} interleaved rounds; ZooKeeper {zk} (tickTime 2000, forceSync on); "
    f"zkguard ES: osmem-server started by zkguard; {iterations} iterations, {contenders} contenders, "
    f"{monitors} monitors"
)

combined = {
    "zookeeper": {"connect": zk, "tick_time_ms": 2000, "force_sync": True},
    "iterations": iterations,
    "contenders": contenders,
    "monitors": monitors,
    "rounds": rounds,
    "results": results,
    "table": table,
}
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(combined, f, indent=2)
print(f"\nwritten {os.path.join(out, 'results.json')}")
EOF
