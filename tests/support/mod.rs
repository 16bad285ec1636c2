//! Fixtures for the integration tests: a real `redis-server` and the real
//! `echomq-sidecar` binary, each on free loopback ports, plus a small client for
//! the Consume call and a few Redis inspection helpers.
//!
//! Every fixture owns its processes and temp directories and releases them in
//! `Drop` (SIGKILL + wait, then remove the directory), so a failing test never
//! leaves a process behind. When a test panics, the sidecar's log (and the
//! tail of Redis' log) is printed, so the failure comes with the server's side
//! of the story. Set `ECHOMQ_TEST_LOGS=1` to print the logs of passing tests too,
//! and `ECHOMQ_TEST_SHARED_READERS=off` (or `on`) to run a suite's sidecars
//! with blocking (or shared) readers.
//!
//! One file per job; everything is re-exported here, so a test says
//! `use support::*;` and need not know which file holds what:
//!
//! | file | job |
//! | --- | --- |
//! | `process.rs` | free ports, unique names, temp dirs, child processes, logs, the fixtures' waits |
//! | `redis_server.rs` | the `redis-server` launcher (also the benches'): plain, password, TLS, cluster node; kill, restart, graceful stop |
//! | `sidecar.rs` | the sidecar process: options, start, readiness, channels and clients, signals, restart, its log |
//! | `chaos.rs` | the chaos suites' ledger, appender, clients, settle wait and verdict (used as `support::chaos`) |
//! | `sentinel.rs` | a primary, replicas and three Sentinels monitoring it ([`sentinel::SentinelDeployment`], used as `support::sentinel`) |
//! | `cluster.rs` | a local Redis Cluster of [`RedisServer`] nodes, failover and kills (used as `support::cluster`) |
//! | `redis_probe.rs` | Redis probes: entries, pending entries, groups, lengths, keys, seeding |
//! | `consume.rs` | the Consume call's test client ([`Consumer`]) and subscribe helpers |
//! | `wire.rs` | branded and stream ids, timestamps, durations, fields, the bearer token, status codes |
//! | `refusal.rs` | table-driven checks that a call is refused with the right status and leaves Redis alone |
//! | `pki.rs` | a throw-away CA ([`TestPki`]) and its certificates |
//! | `http.rs` | plain HTTP/1.0 probes of the admin port, and requests to toxiproxy's API |
//! | `toxiproxy.rs` | Shopify's toxiproxy ([`Toxiproxy`]): TCP proxies between the processes, and their faults |
//!
//! Each file in `tests/` is its own crate and uses only part of this module.
#![allow(dead_code, unreachable_pub, clippy::needless_update)]

pub mod archive_tools;
pub mod chaos;
pub mod cluster;
mod consume;
mod http;
mod pki;
mod process;
mod redis_probe;
mod redis_server;
mod refusal;
pub mod sentinel;
mod sidecar;
mod toxiproxy;
mod wire;

// Each test crate uses part of these: an unused one is no mistake there.
#[allow(unused_imports)]
pub use self::{
    consume::*, http::*, pki::*, process::*, redis_probe::*, redis_server::*, refusal::*, sidecar::*, toxiproxy::*,
    wire::*,
};
