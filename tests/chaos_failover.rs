//! The chaos suite through failovers: the at-least-once promise while Redis
//! Sentinel changes the primary under the sidecars.
//!
//! A primary, two replicas and three Sentinels; two sidecars on the
//! `redis+sentinel://` URL with `--wait-replicas 2` (every replica: after
//! failovers in a row, Sentinel may promote a replica that was not the one
//! to acknowledge a `WAIT 1`, as Redis' `WAIT` documentation warns), several clients each,
//! one stream and group. While entries with unique keys are appended (the
//! chaos suite's appender: a batch whose outcome is unknown is looked up on
//! the primary of the moment before it is sent again), the injector fails
//! the primary over again and again, alternating a `kill -9` of the primary
//! (restarted afterwards as a replica of the new one) and a planned
//! failover (writes paused, `SENTINEL FAILOVER`, the old primary demoted:
//! see `SentinelDeployment::planned_failover`), each once every replica is
//! in sync, and makes clients drop their calls mid-handler.
//!
//! At the end, read from the primary of the moment, every appended entry
//! must be there once, under the branded id its append was confirmed with,
//! and acknowledged or dead-lettered, and the PEL empty: an append confirmed
//! by every replica outlives the failover of the primary that took it.
//!
//! Sizes from the environment, as the chaos suite's, prefixed
//! `ECHOMQ_CHAOS_FAILOVER_` (`ENTRIES`, default 1,500; `APPEND_SECS`, default 15;
//! `CLIENTS`; `TIMEOUT_SECS`; `SEED`); `ECHOMQ_CHAOS_FAILOVER_COUNT` (default 3)
//! failovers.

// Tests fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::chaos::*;
use support::sentinel::SentinelDeployment;
use support::*;

const SIDECARS: usize = 2;

/// Fails the primary over `count` times, spread over the append window,
/// alternating kill -9 (then a restart of the killed node) and a planned
/// failover; drops calls in between. Returns the deployment, the
/// sidecars and the failovers done.
async fn injector(
    mut deployment: SentinelDeployment,
    sidecars: Vec<Sidecar>,
    ledger: Arc<Ledger>,
    settings: Settings,
    count: usize,
) -> (SentinelDeployment, Vec<Sidecar>, usize) {
    let mut rng = fastrand::Rng::with_seed(settings.seed ^ 0xfa11);
    let started = Instant::now();
    let clients = ledger.drop_requests.len();
    let mut done = 0;
    for i in 0..count {
        let due = settings.append_window.mul_f64((i + 1) as f64 / (count + 1) as f64);
        while started.elapsed() < due {
            tokio::time::sleep(Duration::from_millis(rng.u64(200..600))).await;
            if ledger.stop.load(Relaxed) {
                return (deployment, sidecars, done);
            }
            ledger.drop_requests[rng.usize(..clients)].store(true, Relaxed);
        }
        // As a planned failover would: no replica is promoted mid-sync (which
        // loses what the primary had, confirmed or not, and lets a retried
        // append find no dedup record: one append under two branded ids).
        let old = deployment.until_replicas_synced().await;
        let at = started.elapsed().as_secs_f64();
        if i % 2 == 0 {
            eprintln!("chaos failover: kill -9 of the primary :{old} at {at:.1}s");
            deployment.node_mut(old).kill9();
            let new = deployment.until_failed_over(old, Duration::from_secs(30)).await;
            eprintln!("chaos failover: :{new} promoted after {:.1}s", started.elapsed().as_secs_f64() - at);
            // Back empty, as a replica of the new primary, as an operator
            // brings a node back. Left to Sentinel, it would stay an empty
            // primary for 8 s (four publish periods), and a planned failover
            // meanwhile may "promote" it: all would be lost.
            deployment.node_mut(old).restart().await;
            deployment.replicate(old, new).await;
        } else {
            eprintln!("chaos failover: planned failover (SENTINEL FAILOVER) away from :{old} at {at:.1}s");
            let new = deployment.planned_failover(old).await;
            eprintln!("chaos failover: :{new} promoted after {:.1}s", started.elapsed().as_secs_f64() - at);
        }
        done += 1;
    }
    (deployment, sidecars, done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_failovers_lose_no_confirmed_append() {
    let settings = Settings::from_env("ECHOMQ_CHAOS_FAILOVER", 1_500, 15.0);
    let count = env_or("ECHOMQ_CHAOS_FAILOVER_COUNT", 3usize);
    println!(
        "chaos failover: {} entries over {:?}, {SIDECARS} sidecars x {} clients, {count} failovers, seed {}",
        settings.entries, settings.append_window, settings.clients_per_sidecar, settings.seed
    );
    let deployment = SentinelDeployment::start(2).await;
    let url = deployment.url();
    let mut sidecars = Vec::new();
    for name in ["failover-a", "failover-b"] {
        let options = SidecarOptions::named(name)
            .reclaim(1500, 300)
            .backoff(50)
            .arg("--retry-backoff-max-ms")
            .arg("500")
            .arg("--wait-replicas")
            .arg("2")
            .arg("--wait-timeout-ms")
            .arg("1000");
        sidecars.push(Sidecar::start_with_url(&url, options).await);
    }
    let endpoints: Vec<String> = sidecars.iter().map(Sidecar::endpoint).collect();
    let Run { ledger, started, clients: client_tasks, appending } = start_run(&endpoints, &settings);
    let clients = client_tasks.len();
    let mut injecting = Some(tokio::spawn(injector(deployment, sidecars, ledger.clone(), settings.clone(), count)));

    let (processes, settled_at) = settle(&ledger, &url, &settings, started, &appending, &mut injecting).await;
    ledger.stop.store(true, Relaxed);
    for task in client_tasks {
        task.await.expect("a client task failed");
    }
    let (_deployment, sidecars, failovers) = match processes {
        Some(p) => p,
        None => injecting.take().unwrap().await.expect("the fault injector failed"),
    };
    assert_eq!(failovers, count, "not every failover happened within the append window");
    for sidecar in &sidecars {
        assert!(
            sidecar.counter("echomq_redis_primary_switches_total").await >= 1.0,
            "a sidecar never switched primary"
        );
    }

    let verdict = verdict(&ledger, &url, &sidecars).await;
    println!(
        "chaos failover report: entries={} sidecars={SIDECARS} clients={clients} failovers={failovers} calls dropped={} \
         | {}",
        settings.entries,
        ledger.drops_by_injector.load(Relaxed) + ledger.drops_by_handler.load(Relaxed),
        verdict.outcome(&ledger, settled_at, started, settings.seed),
    );
    verdict.assert_passed(settled_at, settings.timeout);
}
