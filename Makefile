.PHONY: bench deps

# Benchmarks zkguard against Apache Curator and kazoo on one local ZooKeeper.
bench:
	scripts/bench.sh

# Installs ZooKeeper, the benchmark peers and osmem-server (Debian/Ubuntu).
deps:
	scripts/install-deps.sh
