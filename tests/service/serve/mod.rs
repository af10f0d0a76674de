//! `zkguard serve` through HTTP, against real ZooKeeper and osmem-server processes: guarded
//! writes from concurrent clients, the journal across SIGKILL, a ZooKeeper outage, bad input,
//! load limits, metrics, SIGTERM draining and two instances sharing one ZooKeeper.

use crate::common;
use crate::serve_support;

// The tests by topic; the helpers several of them use stay here.
mod access;
mod dlq_txn;
mod explicit_locks;
mod lifecycle;
mod limits;
mod python_example;
mod writers;

use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};

use std::time::Duration;

use crate::queue::queued;
use common::*;
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;
use zkguard::testkit::OsmemServer;
use zkguard::LockType;

fn assert_error(status: StatusCode, v: &Value, want: StatusCode, kind: &str, needle: &str) {
    assert_eq!(status, want, "{v}");
    assert_eq!(v["error"], kind, "{v}");
    let message = v["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{needle:?} not in {v}");
}

fn metric(samples: &HashMap<String, f64>, series: &str) -> f64 {
    samples.get(series).copied().unwrap_or(0.0)
}

/// Drops the fields that change from one read to the next (`age_ms`, and `expires_ms` of a
/// lease that is renewed).
fn without_ages(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("age_ms");
                m.remove("expires_ms");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

/// `zkguard locks --json` (plus `extra` arguments) against the service's ZooKeeper and lock root.
fn cli_locks(env: &Env, extra: &[&str]) -> Value {
    let out = crate::cli::zkguard()
        .args(["locks", "--json"])
        .args(extra)
        .env_remove("ZKGUARD_CONFIG")
        .env("ZKGUARD_ZOOKEEPER_SERVERS", &env.zk)
        .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &env.root)
        .env("ZKGUARD_ELASTICSEARCH_URL", &env.es)
        .envs(env.extra.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}
