//! Local ZooKeeper and `osmem-server` processes on free loopback ports, for the demo, benchmarks
//! and tests (under construction).
