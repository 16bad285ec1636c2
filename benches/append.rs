//! Append benchmark: what durable (`--wait-replicas`) and idempotent
//! (`dedup_key`) appends cost against a plain Append, on the same machine,
//! the same Redis and its replica, in one run.
//!
//! ```text
//! cargo bench --bench append                          # or scripts/bench
//! ECHOMQ_BENCH_ENTRIES=100000 ECHOMQ_BENCH_ROUNDS=5 cargo bench --bench append
//! ```
//!
//! It starts a `redis-server` and a replica of it (`--replicaof`, both on
//! loopback, no persistence), and two sidecars on the primary: one with the
//! defaults (`--wait-replicas 0`) and one with `--wait-replicas 1`. The
//! contenders, alternated over the rounds (`ECHOMQ_BENCH_ROUNDS`, 3) in a
//! rotating order:
//!
//! - plain Append (`--wait-replicas 0`, no dedup key);
//! - Append with a `dedup_key` (a new one per append: the script's GET and SET);
//! - Append with `--wait-replicas 1` (the durable writer, one WAIT per round);
//! - Append with `--wait-replicas 1` and a `dedup_key`.
//!
//! Each does two things: throughput, N/2 appends (N: `ECHOMQ_BENCH_ENTRIES`,
//! 50,000) by [`CONCURRENCY`] callers at once, each one unary Append at a
//! time, over one HTTP/2 connection; and latency, [`LATENCY_CALLS`] appends
//! one after another, each timed from the call to its answer. It prints the
//! medians over the rounds, the ratio of each to plain Append, the load
//! average before and after, and how many appends shared a WAIT.
//!
//! Under `cargo test` it is a smoke run with small counts on the debug build.

// The consume benches' helpers: this one appends one entry per call and uses only part of them.
#[allow(dead_code)]
mod common;

use std::{
    process::ExitCode,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use common::redis_server::{RedisOptions, RedisServer};
use common::{connection, median_f64, phase, rate, thousands, Error, Sidecar, BODY_BYTES};
use echomq::proto::{stream_service_client::StreamServiceClient, AppendRequest};
use redis::aio::MultiplexedConnection;
use tonic::transport::Channel;

/// Callers appending at once in the throughput phase.
const CONCURRENCY: usize = 64;
/// Appends one after another in the latency phase (full run; the smoke run does 50).
const LATENCY_CALLS: usize = 2_000;

/// One way to append.
#[derive(Clone, Copy)]
struct Contender {
    label: &'static str,
    /// Through the `--wait-replicas 1` sidecar.
    durable: bool,
    /// A new `dedup_key` per append.
    dedup: bool,
}

/// Plain Append first: the ratios divide by it.
const CONTENDERS: [Contender; 4] = [
    Contender { label: "plain Append (--wait-replicas 0)", durable: false, dedup: false },
    Contender { label: "Append with dedup_key", durable: false, dedup: true },
    Contender { label: "Append, --wait-replicas 1", durable: true, dedup: false },
    Contender { label: "Append, --wait-replicas 1, dedup_key", durable: true, dedup: true },
];

fn main() -> ExitCode {
    common::main("append", run)
}

async fn run(full: bool, entries: usize) -> Result<(), Error> {
    let sidecar_bin = common::sidecar_bin();
    let dir = common::work_dir("echomq-bench-append")?;
    let primary = RedisServer::try_start_with(RedisOptions {
        args: vec!["--repl-diskless-sync-delay".into(), "0".into()],
        ..RedisOptions::default()
    })
    .await?;
    let replica = RedisServer::try_start_with(RedisOptions {
        args: vec!["--replicaof".into(), "127.0.0.1".into(), primary.port().to_string()],
        ..RedisOptions::default()
    })
    .await?;
    let mut redis = connection(primary.port()).await?;
    wait_for_replica(&mut redis).await?;
    std::fs::create_dir_all(dir.join("plain"))?;
    std::fs::create_dir_all(dir.join("durable"))?;
    let plain = Sidecar::start(&sidecar_bin, &primary.url(), &[], &dir.join("plain")).await?;
    let durable = Sidecar::start(&sidecar_bin, &primary.url(), &["--wait-replicas", "1"], &dir.join("durable")).await?;
    let version = common::redis_version(&mut redis).await?;
    let load_before = common::load_average();
    let throughput_calls = (entries / 2).max(100);
    let latency_calls = if full { LATENCY_CALLS } else { 50 };

    common::print_title("append", full);
    println!(
        "  machine  {} CPUs, load average {load_before} at start; Redis {version} and one replica ({}), both on \
         loopback, no persistence",
        common::cpus(),
        replica.url()
    );
    println!("  sidecar  {}", sidecar_bin.display());
    println!(
        "  entries  one {BODY_BYTES}-byte field per Append; throughput: {throughput_calls} appends by {CONCURRENCY} \
         callers at once; latency: {latency_calls} appends one at a time"
    );
    println!();

    let channels = [channel(plain.grpc_port).await?, channel(durable.grpc_port).await?];
    let rounds = common::rounds(full);
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); CONTENDERS.len()];
    let mut p50s: Vec<Vec<Duration>> = vec![Vec::new(); CONTENDERS.len()];
    let mut p99s: Vec<Vec<Duration>> = vec![Vec::new(); CONTENDERS.len()];
    let mut per_wait: Vec<Vec<f64>> = vec![Vec::new(); CONTENDERS.len()];
    for round in 0..rounds {
        for k in 0..CONTENDERS.len() {
            let which = (round + k) % CONTENDERS.len();
            let contender = CONTENDERS[which];
            let channel = channels[usize::from(contender.durable)].clone();
            let stream = format!("bench-append-{which}");
            let keys = format!("r{round}");
            redis::cmd("CONFIG").arg("RESETSTAT").query_async::<()>(&mut redis).await?;
            let took =
                phase(contender.label, throughput(&channel, &stream, contender, &keys, throughput_calls)).await?;
            let waits = wait_calls(&mut redis).await?;
            if waits > 0 {
                per_wait[which].push(throughput_calls as f64 / waits as f64);
            }
            rates[which].push(rate(throughput_calls, took));
            let mut latencies =
                phase(contender.label, latency(&channel, &stream, contender, &keys, latency_calls)).await?;
            latencies.sort_unstable();
            p50s[which].push(percentile(&latencies, 50.0));
            p99s[which].push(percentile(&latencies, 99.0));
        }
    }

    println!("rounds: {rounds}, contenders alternated; medians over the rounds");
    println!(
        "  {:<38} {:>12} {:>8} {:>10} {:>10} {:>8}",
        "contender", "appends/s", "ratio", "p50 ms", "p99 ms", "per WAIT"
    );
    let plain_rate = median_f64(&rates[0]);
    for (k, contender) in CONTENDERS.iter().enumerate() {
        let r = median_f64(&rates[k]);
        let shared = if per_wait[k].is_empty() { "-".to_owned() } else { format!("{:.1}", median_f64(&per_wait[k])) };
        println!(
            "  {:<38} {:>12} {:>7.2}x {:>10.3} {:>10.3} {:>8}",
            contender.label,
            thousands(r),
            r / plain_rate,
            median_duration(&p50s[k]).as_secs_f64() * 1e3,
            median_duration(&p99s[k]).as_secs_f64() * 1e3,
            shared
        );
    }
    println!("  load average {load_before} at start, {} at the end", common::load_average());
    println!("  (ratio: appends/s against plain Append; per WAIT: appends confirmed per WAIT in the throughput phase)");
    drop(replica);
    Ok(())
}

async fn channel(port: u16) -> Result<Channel, Error> {
    Ok(tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?.connect().await?)
}

/// Waits (up to 30 s) until the primary counts one connected replica in sync.
async fn wait_for_replica(redis: &mut MultiplexedConnection) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query_async(redis).await?;
        if info.lines().any(|l| l.starts_with("slave0:") && l.contains("state=online")) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the replica did not come online: {info}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `WAIT` calls since the last `CONFIG RESETSTAT` (`INFO commandstats`).
async fn wait_calls(redis: &mut MultiplexedConnection) -> Result<u64, Error> {
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(redis).await?;
    Ok(stats.lines().find_map(|l| l.strip_prefix("cmdstat_wait:calls=")?.split(',').next()?.parse().ok()).unwrap_or(0))
}

fn request(stream: &str, contender: Contender, keys: &str, n: usize, body: &[u8]) -> AppendRequest {
    AppendRequest {
        stream: stream.to_owned(),
        fields: [("body".to_owned(), body.to_vec())].into(),
        dedup_key: if contender.dedup { format!("{keys}-{n}") } else { String::new() },
        ..Default::default()
    }
}

/// `calls` appends by [`CONCURRENCY`] callers at once: the time until the last is answered.
async fn throughput(
    channel: &Channel,
    stream: &str,
    contender: Contender,
    keys: &str,
    calls: usize,
) -> Result<Duration, Error> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (mut client, next) = (StreamServiceClient::new(channel.clone()), next.clone());
        let (stream, keys) = (stream.to_owned(), format!("{keys}-t"));
        callers.spawn(async move {
            let body = vec![b'x'; BODY_BYTES];
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= calls {
                    return Ok::<(), Error>(());
                }
                let written = client.append(request(&stream, contender, &keys, n, &body)).await?.into_inner();
                if written.duplicate {
                    return Err(format!("append {n} was a duplicate: every key is new").into());
                }
            }
        });
    }
    while let Some(done) = callers.join_next().await {
        done??;
    }
    Ok(started.elapsed())
}

/// `calls` appends one after another: each one's time from call to answer.
async fn latency(
    channel: &Channel,
    stream: &str,
    contender: Contender,
    keys: &str,
    calls: usize,
) -> Result<Vec<Duration>, Error> {
    let mut client = StreamServiceClient::new(channel.clone());
    let body = vec![b'x'; BODY_BYTES];
    let keys = format!("{keys}-l");
    let mut took = Vec::with_capacity(calls);
    for n in 0..calls {
        let started = Instant::now();
        client.append(request(stream, contender, &keys, n, &body)).await?;
        took.push(started.elapsed());
    }
    Ok(took)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn median_duration(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}
