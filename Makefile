.PHONY: openapi reference demo test test-busy test-docker torture torture-fleet bench bench-service bench-gateway bench-txn bench-scale bench-memory deps check

# The main job: installs ZooKeeper and osmem-server if missing, starts them on free loopback
# ports, runs the demo and stops them. Built in the dev profile the tests use (dependencies
# optimized, zkguard's own crates not): a fresh clone compiles about half of what a release
# build does, and a `make test` after it reuses the build (docs/testing.md has the figures).
demo: deps
	cargo run --bin zkguard -- demo

# The whole test suite against real servers started by the test harness, compiled once and run
# two test binaries at a time (scripts/run-tests.py; ZKGUARD_TEST_JOBS=1 runs them one after
# another, as `cargo test` does). The Docker-backed test is `make test-docker`: its dependencies
# (Testcontainers, bollard, tonic) cost a sixth of a clean build's compile time, for a test that
# needs a Docker daemon.
test: deps
	python3 scripts/run-tests.py

# The whole suite on a busy machine: `make test` with two CPU-burning workers (stress-ng --cpu 2)
# beside it for its whole run, as on a host where other work takes both cores. A test that fails
# here and not under `make test` asserted what timing allowed rather than what the protocol must
# do. The workers stop with the suite, whatever its verdict.
test-busy: deps
	scripts/test-busy.sh

# Guarded writes against real Elasticsearch 8 and ZooKeeper 3.9 images, with a Docker daemon
# (without one, every test says why it skipped and passes).
test-docker: deps
	cargo test --features docker --test writes docker_guarded -- --nocapture

# The fault-injection history test (tests/history/main.rs) for as long as asked: DURATION
# seconds of workload (default 600), split in three: the lock against a standalone ZooKeeper and
# against a 3-member ensemble, and the bank through `zkguard serve`'s gate and /v1 with the
# service SIGKILLed and ZooKeeper killed and paused; each prints the checker's verdict and the
# counts of operations and faults. Then the model check's random walks (crates/zkguard/tests/lock_model.rs)
# for DURATION seconds more; then the model check's large scopes one after the other (the lock:
# 3 clients with 2 faults, exhaustively, and 3 clients x 2 locks with 2 faults searched for
# DURATION seconds; document transactions: 2 transactions sharing a document, 2 writers, 2
# crashes, exhaustively), each printing its number of unique states and the properties it
# checked. `make test` runs the history tests for about 30-45 seconds each, the walks for 10
# seconds, and the model check's small scopes. Last, the fleet test for DURATION seconds of
# workload, as `make torture-fleet` runs it.
DURATION ?= 600
# The broker of the long fleet runs: `memory` (fast; kills, pauses and disk loss, no broker
# restart) or `durable` (tansu on S3 storage, restarted in every round of faults, as `make test`
# runs it; it slows down as a run stores more batches).
FLEET_BROKER ?= memory
torture: deps
	ZKGUARD_TORTURE_SECS=$(DURATION) cargo test --release --test history -- --nocapture
	ZKGUARD_MODEL_WALK_SECS=$(DURATION) ZKGUARD_MODEL_REPORT=1 cargo test --release --workspace --test lock_model random_walks -- --nocapture
	ZKGUARD_MODEL_WALK_SECS=$(DURATION) ZKGUARD_MODEL_REPORT=1 cargo test --release --workspace --test lock_model large_scope -- --ignored --nocapture --test-threads 1
	ZKGUARD_FLEET_BROKER=$(FLEET_BROKER) ZKGUARD_FLEET_SECS=$(DURATION) cargo test --release --test fleet -- --include-ignored --nocapture

# The fleet test (tests/fleet/main.rs: three `zkguard serve` on the Kafka journal, instances
# SIGKILLed with their state deleted and SIGSTOPped past their session, the broker restarted
# with FLEET_BROKER=durable) for DURATION seconds of workload, the faults in rotation, printing
# its counts and takeover times. `make test` runs it too, on the durable broker, with one round
# of faults (one kill, one pause, one broker restart: about a minute in all).
torture-fleet: deps
	ZKGUARD_FLEET_BROKER=$(FLEET_BROKER) ZKGUARD_FLEET_SECS=$(DURATION) cargo test --release --test fleet -- --include-ignored --nocapture

# Benchmarks zkguard against Apache Curator and kazoo on one local ZooKeeper.
bench: deps
	scripts/bench.sh

# Writes through `zkguard serve` over HTTP beside the in-process library and `zkguard exec`, on a
# local ZooKeeper and osmem-server: foreground save p50/p99 and background operations per second.
bench-service: deps
	cargo run --release --bin zkguard -- bench --service --local --contenders 8 --monitors 64 --iterations 2000

# The Elasticsearch-compatible gate beside the cluster itself, on a local ZooKeeper and
# osmem-server: foreground index p50/p99 and bulk documents per second, straight and through it.
bench-gateway: deps
	cargo run --release --bin zkguard -- bench --gateway --local --contenders 8 --monitors 64 --iterations 2000

# What a document transaction of N documents (1, 2, 5, 10, 20) costs beside the same writes as
# guarded writes one by one and as one plain _bulk, on a local ZooKeeper and osmem-server, from one
# client: p50/p99 and Elasticsearch and ZooKeeper requests per operation (about 2 minutes).
bench-txn: deps
	cargo run --release --bin zkguard -- bench --txn --local --iterations 300

# How costs grow as the work grows 10x and 100x: a library bulk job over 1,000, 10,000 and 100,000
# new monitors, zkguard serve written to by 10, 100 and 1,000 concurrent HTTP clients, and 1 and 3
# zkguard serve processes sharing 100 clients (docs/performance.md, "How costs grow"; about 1 minute
# besides the build).
bench-scale: deps
	cargo run --release --bin zkguard -- bench --scale --local

# Memory of `zkguard serve` per queued background operation and at a restart that replays the
# journal (20,000 and 100,000 operations of 200 B and 1 KB documents; about 4 minutes).
bench-memory: deps
	cargo build --release --bin zkguard
	python3 scripts/measure-queue-memory.py --binaries target/release/zkguard

# Installs ZooKeeper, the benchmark peers, osmem-server, tansu, the client generators of the
# service's OpenAPI document and promtool (Debian/Ubuntu; pip and npm ci), only what is missing.
deps:
	scripts/install-deps.sh

# Rewrites docs/openapi.json, the OpenAPI document of `zkguard serve`, from the handlers
# (tests/service/openapi.rs fails while the committed one differs from what the service serves).
openapi:
	cargo run --quiet --bin zkguard -- openapi > docs/openapi.json

# Rewrites the references under docs/reference/ from the code: every command and option (the
# command-line definition), configuration key (the settings' definitions), exit status and HTTP
# route (the OpenAPI document). tests/cli/reference.rs fails while a committed one differs, and when
# the README or the docs name a command, option or key that does not exist.
reference:
	for r in cli config exit-status http; do \
		cargo run --quiet --bin zkguard -- reference $$r > docs/reference/$$r.md.new && \
		mv docs/reference/$$r.md.new docs/reference/$$r.md || exit 1; \
	done

# Formatting, lints, docs without broken links, no import cycle between the files of the
# workspace's crates, and every crate and module where docs/architecture.md puts it.
check:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --lib --features zkguard/testkit
	python3 scripts/import-cycles.py
	python3 scripts/function-length.py
