.PHONY: demo test bench deps check

# The main job: installs ZooKeeper and osmem-server if missing, starts them on free loopback
# ports, runs the demo and stops them.
demo: deps
	cargo run --release --features testkit --bin zkguard -- demo

# The whole test suite against real servers started by the test harness, compiled once with every
# feature (the Docker-backed test skips at run time when no Docker daemon answers; the second line
# reuses the same build and shows why it skipped).
test: deps
	cargo test --features docker
	cargo test --features docker --test docker_guarded -- --nocapture

# Benchmarks zkguard against Apache Curator and kazoo on one local ZooKeeper.
bench: deps
	scripts/bench.sh

# Installs ZooKeeper, the benchmark peers and osmem-server (Debian/Ubuntu), only what is missing.
deps:
	scripts/install-deps.sh

# Formatting, lints, and no import cycle between the files of src/.
check:
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	python3 scripts/import-cycles.py
