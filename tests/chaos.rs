//! The chaos suite: the at-least-once promise under faults.
//!
//! One durable redis-server (AOF, fsync always), three sidecars with distinct
//! consumer names and several clients each, all on one stream and group. While
//! entries with unique keys (field `k` = their index) are appended, a fault
//! injector SIGKILLs sidecars and restarts them (same ports, same consumer
//! name), makes clients drop their calls in the middle of a handler, and
//! restarts redis-server gracefully (SHUTDOWN, SIGTERM; the AOF reloads).
//! Handlers fail 5% of their calls at random and drop a few calls on their own.
//! One key in [`POISON_EVERY`] is a poison entry: its handler always fails, and
//! from its second delivery on asks for the dead-letter stream (`Fail` with
//! `dead_letter`), so the dead-letter path runs under the same faults.
//! Nobody helps the system recover: clients reconnect on any error, sidecars
//! reconnect to Redis by themselves.
//!
//! At the end every appended entry must have been acknowledged or
//! dead-lettered: the PEL is empty, the group has read past the last appended
//! id, every key was acked by a handler or sits in the dead-letter stream, and
//! nothing was acknowledged that no handler acked. The report line gives the
//! entries, the faults by kind, lost (must be 0), duplicates (handler calls
//! beyond one per key), dead letters and the elapsed time.
//!
//! Sizes and knobs, from the environment:
//! - `ECHOMQ_CHAOS_ENTRIES` (default 3,000): entries appended;
//! - `ECHOMQ_CHAOS_APPEND_SECS` (default `max(12, entries / 1,500)`): how long the
//!   appends are spread over; faults are injected during that window;
//! - `ECHOMQ_CHAOS_CLIENTS` (default 3): clients (Consume calls) per sidecar;
//! - `ECHOMQ_CHAOS_REDIS_RESTARTS` (default 2): graceful Redis restarts;
//! - `ECHOMQ_CHAOS_TIMEOUT_SECS` (default append window + 90): the wait for everything to settle;
//! - `ECHOMQ_CHAOS_SEED`: the seed of every random choice (printed; timing still varies).
//!
//! The full run: `ECHOMQ_CHAOS_ENTRIES=100000 cargo test --release --test chaos -- --nocapture`.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::chaos::*;
use support::*;

const SIDECARS: usize = 3;

/// Faults injected, by kind.
#[derive(Debug, Default, Clone)]
struct Faults {
    sidecar_kills: u64,
    redis_shutdowns: u64,
    redis_sigterms: u64,
    drop_requests: u64,
    longest_sidecar_down: Duration,
    longest_redis_down: Duration,
}

// ---------------------------------------------------------------------------
// The fault injector
// ---------------------------------------------------------------------------

/// Injects faults during the append window, at most `fault_budget` of each
/// kind, one at a time, each followed by a full recovery (a killed sidecar is
/// started again, a stopped Redis too). Returns the processes and the counts.
async fn injector(
    mut redis: RedisServer,
    mut sidecars: Vec<Sidecar>,
    ledger: Arc<Ledger>,
    settings: Settings,
) -> (RedisServer, Vec<Sidecar>, Faults) {
    let mut rng = fastrand::Rng::with_seed(settings.seed ^ 0xfa17);
    let mut faults = Faults::default();
    let budget = settings.fault_budget() as u64;
    let window = settings.append_window;
    let started = Instant::now();
    // Redis restarts at evenly spread points of the window, alternating SHUTDOWN and SIGTERM.
    let mut redis_due: Vec<Duration> = (1..=settings.redis_restarts)
        .map(|i| window.mul_f64(i as f64 / (settings.redis_restarts + 1) as f64))
        .collect();
    redis_due.reverse();
    let clients = ledger.drop_requests.len();
    loop {
        tokio::time::sleep(Duration::from_millis(rng.u64(300..1000))).await;
        if ledger.stop.load(Relaxed) || started.elapsed() >= window {
            break;
        }
        if redis_due.last().is_some_and(|due| started.elapsed() >= *due) {
            redis_due.pop();
            let how = if (faults.redis_shutdowns + faults.redis_sigterms) % 2 == 0 {
                RedisStop::ShutdownCommand
            } else {
                RedisStop::Sigterm
            };
            let down = Instant::now();
            eprintln!("chaos: restarting redis-server ({how:?}) at {:.1}s", started.elapsed().as_secs_f64());
            redis.restart_gracefully(how).await;
            faults.longest_redis_down = faults.longest_redis_down.max(down.elapsed());
            match how {
                RedisStop::ShutdownCommand => faults.redis_shutdowns += 1,
                RedisStop::Sigterm => faults.redis_sigterms += 1,
            }
            continue;
        }
        let kill = rng.bool();
        if kill && faults.sidecar_kills < budget {
            // Usually one sidecar, sometimes two at once; down for up to 2.5 s, so
            // sometimes past the peers' reclaim min-idle (1.5 s), sometimes not.
            let first = rng.usize(..sidecars.len());
            let mut victims = vec![first];
            if rng.u32(..100) < 20 {
                victims.push((first + 1 + rng.usize(..sidecars.len() - 1)) % sidecars.len());
            }
            let down_for = Duration::from_millis(rng.u64(100..2500));
            let down = Instant::now();
            for &v in &victims {
                sidecars[v].kill9();
                faults.sidecar_kills += 1;
            }
            eprintln!(
                "chaos: SIGKILL sidecar(s) {victims:?} at {:.1}s, down for {down_for:?}",
                started.elapsed().as_secs_f64()
            );
            tokio::time::sleep(down_for).await;
            for &v in &victims {
                sidecars[v].restart().await;
            }
            faults.longest_sidecar_down = faults.longest_sidecar_down.max(down.elapsed());
        } else if faults.drop_requests < budget {
            let how_many = rng.usize(1..=3.min(clients));
            for _ in 0..how_many {
                ledger.drop_requests[rng.usize(..clients)].store(true, Relaxed);
                faults.drop_requests += 1;
            }
        }
    }
    (redis, sidecars, faults)
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_nothing_is_lost() {
    let settings = Settings::from_env("ECHOMQ_CHAOS", 3_000, 12.0);
    println!(
        "chaos: {} entries over {:?}, {} sidecars x {} clients, {} Redis restarts, timeout {:?}, seed {} (ECHOMQ_CHAOS_SEED={} repeats the choices)",
        settings.entries,
        settings.append_window,
        SIDECARS,
        settings.clients_per_sidecar,
        settings.redis_restarts,
        settings.timeout,
        settings.seed,
        settings.seed
    );
    let redis = RedisServer::start_with(RedisOptions::append_only()).await;
    let redis_url = redis.url();
    let mut sidecars = Vec::new();
    for name in ["chaos-a", "chaos-b", "chaos-c"] {
        let options =
            SidecarOptions::named(name).reclaim(1500, 300).backoff(50).arg("--retry-backoff-max-ms").arg("500");
        sidecars.push(Sidecar::start(&redis, options).await);
    }
    let endpoints: Vec<String> = sidecars.iter().map(Sidecar::endpoint).collect();
    let Run { ledger, started, clients: client_tasks, appending } = start_run(&endpoints, &settings);
    let clients = client_tasks.len();
    let mut injecting = Some(tokio::spawn(injector(redis, sidecars, ledger.clone(), settings.clone())));

    let (processes, settled_at) = settle(&ledger, &redis_url, &settings, started, &appending, &mut injecting).await;
    ledger.stop.store(true, Relaxed);
    for task in client_tasks {
        task.await.expect("a client task failed");
    }
    let (_redis, sidecars, faults) = match processes {
        Some(p) => p,
        None => injecting.take().unwrap().await.expect("the fault injector failed"),
    };

    let verdict = verdict(&ledger, &redis_url, &sidecars).await;
    println!(
        "chaos: {}; longest sidecar downtime {:?}, longest Redis downtime {:?}",
        verdict.calls(&ledger),
        faults.longest_sidecar_down,
        faults.longest_redis_down,
    );
    println!(
        "chaos report: entries={} sidecars={SIDECARS} clients={clients} | faults: sidecar SIGKILL={} redis restarts={} \
         (SHUTDOWN {}, SIGTERM {}) calls dropped mid-handler={} (injector {}, handler {}) handler Fails={} | {}",
        settings.entries,
        faults.sidecar_kills,
        faults.redis_shutdowns + faults.redis_sigterms,
        faults.redis_shutdowns,
        faults.redis_sigterms,
        ledger.drops_by_injector.load(Relaxed) + ledger.drops_by_handler.load(Relaxed),
        ledger.drops_by_injector.load(Relaxed),
        ledger.drops_by_handler.load(Relaxed),
        ledger.fails_sent.load(Relaxed),
        verdict.outcome(&ledger, settled_at, started, settings.seed),
    );
    verdict.assert_passed(settled_at, settings.timeout);
}
