//! Network faults: between the sidecar and Redis, and between a client and
//! the sidecar, through a real TCP fault proxy (Shopify's toxiproxy, started
//! by the tests: `support::toxiproxy`), and a Redis that stalls (SIGSTOP).
//!
//! The first tests check the bound the operations page documents ("When Redis
//! goes silent"): a black-holed or stalled Redis turns readiness NOT_SERVING
//! within one readiness interval (1 s) plus `--redis-timeout-ms`, a blocked
//! group reader gives up within `--read-block-ms` plus `--redis-timeout-ms`,
//! and once Redis answers again the sidecar is ready and delivers by itself.
//!
//! Needs `toxiproxy-server` on PATH (scripts/install-deps builds it into
//! `.tmp/bin`; scripts/test puts that on PATH) or `ECHOMQ_TOXIPROXY`: without
//! it these tests fail, saying so.

// Tests fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use echomq::proto::GroupStart;
use support::*;

/// The sidecar's `--redis-timeout-ms` in these tests.
const REDIS_TIMEOUT_MS: u64 = 1_000;
/// The sidecar's `--read-block-ms` in these tests.
const READ_BLOCK_MS: u64 = 1_000;
/// The readiness interval (`READINESS_PING` in `src/app.rs`).
const READINESS_INTERVAL_MS: u64 = 1_000;
/// What the tests allow beyond a documented bound: a loaded 2-core machine
/// schedules late, and `/readyz` is polled every 50 ms.
const SLACK: Duration = Duration::from_millis(1_500);

/// How the group's reader waits in the silent-Redis tests.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Readers {
    /// Blocked in `XREADGROUP` (`--shared-readers off`): it must give up on the silent Redis in time.
    Blocking,
    /// Woken by the wake connection (`--shared-readers on`): renewed when Redis answers again.
    Shared,
}

/// A sidecar that reaches Redis at `redis_url` with the tests' short
/// timeouts, its readers waiting as `readers` says.
async fn sidecar_with(redis: &RedisServer, redis_url: String, readers: Readers) -> Sidecar {
    let mut options = SidecarOptions::named(&unique("net"))
        .arg("--redis-timeout-ms")
        .arg(&REDIS_TIMEOUT_MS.to_string())
        .arg("--read-block-ms")
        .arg(&READ_BLOCK_MS.to_string());
    options = options.arg("--shared-readers").arg(if readers == Readers::Blocking { "off" } else { "on" });
    options.redis_url = Some(redis_url);
    Sidecar::start(redis, options).await
}

/// How long `/readyz` took to become `status`; panics past `within`.
async fn readyz_becomes(sidecar: &Sidecar, status: u16, within: Duration, what: &str) -> Duration {
    let started = Instant::now();
    let reached = eventually(within, || async { sidecar.readyz().await == Some(status) }).await;
    let took = started.elapsed();
    assert!(reached, "{what}: /readyz was not {status} within {within:?}\n----- sidecar log -----\n{}", sidecar.log());
    took
}

/// The reader connections closed after a failed read, on `/metrics`.
async fn reader_read_errors(sidecar: &Sidecar) -> f64 {
    let metrics = http_get(sidecar.admin_port(), "/metrics").await.expect("GET /metrics").body;
    metrics
        .lines()
        .filter(|line| line.starts_with("echomq_reader_connections_closed_total{") && line.contains("read_error"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The shared part of the silent-Redis tests: a subscribed call holds the
/// group's reader, which waits as `readers` says; `silence` makes Redis go
/// silent, `speak` ends it. Checks that readiness (and a blocked reader)
/// notice within the documented bounds, that the sidecar is ready again after
/// `speak` by itself (a shared reader's wake connection renewed), and that an
/// entry appended during the silence is delivered, acked, and leaves no PEL.
async fn silent_redis_is_noticed_and_outlived<S, SF, P, PF>(
    redis: &RedisServer,
    sidecar: &Sidecar,
    readers: Readers,
    silence: S,
    speak: P,
) where
    S: FnOnce() -> SF,
    SF: std::future::Future<Output = ()>,
    P: FnOnce() -> PF,
    PF: std::future::Future<Output = ()>,
{
    let (stream, group) = (unique("silent"), unique("g"));
    let mut direct = redis.conn().await;
    let mut consumer = Consumer::subscribe(sidecar, subscribe_msg(&stream, &group, GroupStart::Beginning)).await;
    xadd_raw(&mut direct, &stream, &[(b"k", b"before")]).await;
    let first = consumer.next_delivery(EVENT_TIMEOUT).await;
    consumer.ack_one(&first.id).await;
    assert_eq!(wait_pending(&mut direct, &stream, &group, 0, EVENT_TIMEOUT).await, 0, "the first entry was not acked");
    let read_errors_before = reader_read_errors(sidecar).await;

    silence().await;
    let silenced = Instant::now();
    let readiness_bound = Duration::from_millis(READINESS_INTERVAL_MS + REDIS_TIMEOUT_MS) + SLACK;
    let noticed = readyz_becomes(sidecar, 503, readiness_bound, "Redis went silent").await;
    println!("not ready {noticed:?} after Redis went silent (bound {readiness_bound:?} with slack)");
    // Appended meanwhile on a connection of the test's own (a stall queues it
    // in the socket, and Redis runs it when it wakes).
    let appending = {
        let (url, stream) = (redis.url(), stream.clone());
        tokio::spawn(async move {
            // A stalled Redis accepts the connection but answers its handshake only once it wakes.
            let mut direct = support::chaos::redis_conn(&url).await;
            xadd_raw(&mut direct, &stream, &[(b"k", b"during")]).await
        })
    };
    if readers == Readers::Blocking {
        let reader_bound = Duration::from_millis(READ_BLOCK_MS + REDIS_TIMEOUT_MS) + SLACK;
        let reader_gave_up = eventually(reader_bound.saturating_sub(silenced.elapsed()), || async {
            reader_read_errors(sidecar).await > read_errors_before
        })
        .await;
        assert!(
            reader_gave_up,
            "the group's blocked reader did not give up on the silent Redis within {reader_bound:?} \
             (echomq_reader_connections_closed_total{{reason=\"read_error\"}} unchanged)\n----- sidecar log -----\n{}",
            sidecar.log()
        );
        println!(
            "the blocked reader gave up {:?} after Redis went silent (bound {reader_bound:?})",
            silenced.elapsed()
        );
    }
    assert!(
        sidecar.log().contains("the shared connection is replaced"),
        "no shared connection was retired after its response timeout\n----- sidecar log -----\n{}",
        sidecar.log()
    );

    speak().await;
    let recovered = readyz_becomes(sidecar, 200, Duration::from_secs(15), "Redis answers again").await;
    println!("ready {recovered:?} after Redis answered again");
    if readers == Readers::Shared {
        assert!(
            // Lost with the outage (the black hole closed it), or renewed once Redis answered again (a stall).
            eventually(EVENT_TIMEOUT, || async { sidecar.log().contains("the wake connection is gone") }).await,
            "the wake connection outlived the outage\n----- sidecar log -----\n{}",
            sidecar.log()
        );
    }
    let during = appending.await.expect("append during the silence");
    let second = consumer.next_delivery(Duration::from_secs(15)).await;
    assert_eq!(second.stream_id, during, "the entry appended during the silence");
    consumer.ack_one(&second.id).await;
    assert_eq!(wait_pending(&mut direct, &stream, &group, 0, EVENT_TIMEOUT).await, 0, "the second entry was not acked");
    assert!(!sidecar.log().contains("panicked"), "the sidecar panicked\n{}", sidecar.log());
}

async fn black_holed_redis(readers: Readers) {
    let redis = RedisServer::start().await;
    let toxiproxy = Toxiproxy::start().await;
    let proxy = toxiproxy.proxy("redis", redis.port()).await;
    let sidecar = sidecar_with(&redis, proxy.redis_url(), readers).await;
    silent_redis_is_noticed_and_outlived(
        &redis,
        &sidecar,
        readers,
        || proxy.add_both("black-hole", Toxic::BlackHole),
        || proxy.remove_both("black-hole"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_redis_is_noticed_within_the_bound_and_outlived() {
    black_holed_redis(Readers::Blocking).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_redis_is_outlived_by_shared_readers() {
    black_holed_redis(Readers::Shared).await;
}

/// SIGSTOP or SIGCONT to a process.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed: {status}");
}

async fn stalled_redis(readers: Readers) {
    let redis = RedisServer::start().await;
    let pid = redis.pid().expect("redis-server runs");
    let sidecar = sidecar_with(&redis, redis.url(), readers).await;
    // If the test fails while Redis is stopped, its fixture's SIGKILL still ends it.
    silent_redis_is_noticed_and_outlived(
        &redis,
        &sidecar,
        readers,
        || async move { signal(pid, "STOP") },
        || async move { signal(pid, "CONT") },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_redis_is_noticed_within_the_bound_and_outlived() {
    stalled_redis(Readers::Blocking).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_redis_is_outlived_by_shared_readers() {
    stalled_redis(Readers::Shared).await;
}

// ---------------------------------------------------------------------------
// The ledger under network faults
// ---------------------------------------------------------------------------

/// Sidecars in the network chaos run, each with a proxy to Redis and one
/// in front of its gRPC port.
const NET_SIDECARS: usize = 2;

/// The network faults, in the order the injector cycles through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum NetFault {
    /// 40 ms ± 20 each way between a sidecar and Redis.
    RedisLatency,
    /// A sidecar's Redis connections reset (RST) at their next data.
    RedisReset,
    /// A sidecar's Redis connections black-holed: longer than the readiness bound.
    RedisBlackHole,
    /// redis-server stopped (SIGSTOP), then continued: every sidecar meets it.
    RedisStall,
    /// A sidecar's Redis connections throttled to 16 KB/s.
    RedisBandwidth,
    /// 40 ms ± 20 each way between clients and a sidecar.
    ClientLatency,
    /// Clients' connections to a sidecar reset at their next data.
    ClientReset,
    /// Clients' connections to a sidecar black-holed.
    ClientBlackHole,
}

const NET_FAULTS: [NetFault; 8] = [
    NetFault::RedisLatency,
    NetFault::ClientReset,
    NetFault::RedisBlackHole,
    NetFault::ClientLatency,
    NetFault::RedisStall,
    NetFault::RedisReset,
    NetFault::ClientBlackHole,
    NetFault::RedisBandwidth,
];

/// What the network injector did.
#[derive(Debug, Default)]
struct NetFaults {
    by_kind: std::collections::BTreeMap<String, u64>,
    /// For each Redis black hole: how long the black-holed sidecar took to turn not ready.
    not_ready_after: Vec<Duration>,
    /// Black holes after which the sidecar never turned not ready while held.
    unnoticed_black_holes: u64,
}

/// Cycles through [`NET_FAULTS`] during the append window, one at a time,
/// each on a random sidecar's proxy, held for a while and then removed, with
/// a calm moment between. A Redis black hole is held past the readiness bound,
/// and the black-holed sidecar's `/readyz` (reached directly, not through a
/// proxy) is watched for the moment it turns 503.
async fn net_injector(
    redis_proxies: Vec<Proxy>,
    grpc_proxies: Vec<Proxy>,
    admin_ports: Vec<u16>,
    redis_pid: u32,
    settings: support::chaos::Settings,
) -> NetFaults {
    let mut rng = fastrand::Rng::with_seed(settings.seed ^ 0x0e7);
    let mut faults = NetFaults::default();
    let started = Instant::now();
    for (i, kind) in NET_FAULTS.iter().cycle().enumerate() {
        tokio::time::sleep(Duration::from_millis(rng.u64(200..600))).await;
        if started.elapsed() >= settings.append_window {
            break;
        }
        let s = rng.usize(..NET_SIDECARS);
        let (redis_proxy, grpc_proxy) = (&redis_proxies[s], &grpc_proxies[s]);
        let name = format!("fault-{i}");
        eprintln!("chaos-net: {kind:?} on sidecar {s} at {:.1}s", started.elapsed().as_secs_f64());
        match kind {
            NetFault::RedisLatency | NetFault::ClientLatency => {
                let proxy = if *kind == NetFault::RedisLatency { redis_proxy } else { grpc_proxy };
                proxy.add_both(&name, Toxic::Latency { ms: 40, jitter_ms: 20 }).await;
                tokio::time::sleep(Duration::from_millis(rng.u64(1000..2000))).await;
                proxy.remove_both(&name).await;
            }
            NetFault::RedisReset | NetFault::ClientReset => {
                let proxy = if *kind == NetFault::RedisReset { redis_proxy } else { grpc_proxy };
                proxy.add(&name, Direction::Upstream, Toxic::ResetPeer { after_ms: 0 }).await;
                tokio::time::sleep(Duration::from_millis(rng.u64(200..600))).await;
                proxy.remove(&name).await;
            }
            NetFault::RedisBlackHole => {
                redis_proxy.add_both(&name, Toxic::BlackHole).await;
                let held = Instant::now();
                let hold = Duration::from_millis(READINESS_INTERVAL_MS + REDIS_TIMEOUT_MS) + SLACK;
                let noticed = eventually(hold, || async { http_status(admin_ports[s], "/readyz").await == Some(503) });
                if noticed.await {
                    faults.not_ready_after.push(held.elapsed());
                } else {
                    faults.unnoticed_black_holes += 1;
                }
                redis_proxy.remove_both(&name).await;
            }
            NetFault::ClientBlackHole => {
                grpc_proxy.add_both(&name, Toxic::BlackHole).await;
                tokio::time::sleep(Duration::from_millis(rng.u64(2000..3000))).await;
                grpc_proxy.remove_both(&name).await;
            }
            NetFault::RedisStall => {
                signal(redis_pid, "STOP");
                tokio::time::sleep(Duration::from_millis(rng.u64(1000..2000))).await;
                signal(redis_pid, "CONT");
            }
            NetFault::RedisBandwidth => {
                redis_proxy.add_both(&name, Toxic::Bandwidth { kb_per_s: 16 }).await;
                tokio::time::sleep(Duration::from_millis(rng.u64(1000..2000))).await;
                redis_proxy.remove_both(&name).await;
            }
        }
        *faults.by_kind.entry(format!("{kind:?}")).or_default() += 1;
    }
    faults
}

/// The at-least-once ledger (`support::chaos`) while the network between the
/// sidecars and Redis and between the clients and the sidecars misbehaves:
/// latency, resets, black holes, a stalled Redis, a throttled link. Nothing is
/// lost, the PEL ends empty, duplicates are counted; every Redis black hole
/// turns its sidecar not ready within the documented bound.
///
/// Sizes, from the environment as the chaos suite's but prefixed
/// `ECHOMQ_CHAOS_NET_`: `ENTRIES` (default 1,500), `APPEND_SECS` (default
/// `max(18, entries / 1,500)`), `CLIENTS` (per sidecar, default 3),
/// `TIMEOUT_SECS`, `SEED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_net_nothing_is_lost() {
    use std::sync::atomic::Ordering::Relaxed;
    use support::chaos::{settle, start_run, verdict, Run, Settings};

    let settings = Settings::from_env("ECHOMQ_CHAOS_NET", 1_500, 18.0);
    println!(
        "chaos-net: {} entries over {:?}, {NET_SIDECARS} sidecars x {} clients, timeout {:?}, seed {} \
         (ECHOMQ_CHAOS_NET_SEED={} repeats the choices)",
        settings.entries,
        settings.append_window,
        settings.clients_per_sidecar,
        settings.timeout,
        settings.seed,
        settings.seed
    );
    let redis = RedisServer::start().await;
    let redis_url = redis.url();
    let toxiproxy = Toxiproxy::start().await;
    let mut sidecars = Vec::new();
    let mut redis_proxies = Vec::new();
    let mut grpc_proxies = Vec::new();
    for name in ["net-a", "net-b"] {
        let redis_proxy = toxiproxy.proxy(&format!("redis-{name}"), redis.port()).await;
        let mut options = SidecarOptions::named(name)
            .reclaim(1500, 300)
            .backoff(50)
            .arg("--retry-backoff-max-ms")
            .arg("500")
            .arg("--redis-timeout-ms")
            .arg(&REDIS_TIMEOUT_MS.to_string())
            .arg("--read-block-ms")
            .arg(&READ_BLOCK_MS.to_string());
        options.redis_url = Some(redis_proxy.redis_url());
        let sidecar = Sidecar::start(&redis, options).await;
        grpc_proxies.push(toxiproxy.proxy(&format!("grpc-{name}"), sidecar.grpc_port()).await);
        redis_proxies.push(redis_proxy);
        sidecars.push(sidecar);
    }
    let endpoints: Vec<String> = grpc_proxies.iter().map(Proxy::endpoint).collect();
    let Run { ledger, started, clients: client_tasks, appending } = start_run(&endpoints, &settings);
    let (n, clients) = (settings.entries, client_tasks.len());
    let admin_ports = sidecars.iter().map(Sidecar::admin_port).collect();
    let redis_pid = redis.pid().expect("redis-server runs");
    let mut injecting =
        Some(tokio::spawn(net_injector(redis_proxies, grpc_proxies, admin_ports, redis_pid, settings.clone())));
    let (faults, settled_at) = settle(&ledger, &redis_url, &settings, started, &appending, &mut injecting).await;
    ledger.stop.store(true, Relaxed);
    for task in client_tasks {
        task.await.expect("a client task failed");
    }
    let faults = match faults {
        Some(faults) => faults,
        None => injecting.take().unwrap().await.expect("the fault injector failed"),
    };

    let mut verdict = verdict(&ledger, &redis_url, &sidecars).await;
    if faults.unnoticed_black_holes > 0 {
        verdict.problems.push(format!(
            "{} Redis black holes did not turn their sidecar not ready within {:?}",
            faults.unnoticed_black_holes,
            Duration::from_millis(READINESS_INTERVAL_MS + REDIS_TIMEOUT_MS) + SLACK
        ));
    }
    let missing: Vec<NetFault> =
        NET_FAULTS.iter().copied().filter(|kind| !faults.by_kind.contains_key(&format!("{kind:?}"))).collect();
    if !missing.is_empty() {
        verdict.problems.push(format!("the window was too short for every fault kind: {missing:?} never ran"));
    }
    println!(
        "chaos-net: {}; not ready after each Redis black hole {:?}",
        verdict.calls(&ledger),
        faults.not_ready_after
    );
    println!(
        "chaos-net report: entries={n} sidecars={NET_SIDECARS} clients={clients} | faults: {:?} | handler Fails={} \
         calls dropped by handlers={} | {}",
        faults.by_kind,
        ledger.fails_sent.load(Relaxed),
        ledger.drops_by_handler.load(Relaxed),
        verdict.outcome(&ledger, settled_at, started, settings.seed),
    );
    verdict.assert_passed(settled_at, settings.timeout);
}
