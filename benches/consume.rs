//! Consume benchmark: the sidecar against a direct Redis consumer, on the same
//! machine and the same Redis, in one run.
//!
//! ```text
//! cargo bench --bench consume                        # or scripts/bench
//! ECHOMQ_BENCH_ENTRIES=200000 ECHOMQ_BENCH_ROUNDS=5 cargo bench --bench consume
//! ```
//!
//! It starts its own `redis-server` (free loopback port, no persistence) and the
//! sidecar binary cargo built for it (`cargo bench` builds it with the release
//! profile), then:
//!
//! 1. appends N entries (default 50,000; `ECHOMQ_BENCH_ENTRIES`) to each of four
//!    streams with `AppendBatch` (1,000 per call);
//! 2. throughput, over 3 rounds (`ECHOMQ_BENCH_ROUNDS`) in which the contenders
//!    take turns in a rotating order, each round with groups of its own on the
//!    same streams; it prints the median of each, the ratios of the medians,
//!    and the CPU time per entry that the sidecar (`/proc/<pid>/stat`) and Redis
//!    (`INFO cpu`) used meanwhile: (a) consumes stream A through the sidecar with one Consume
//!    call (`max_in_flight` 256), the client sending one `Ack` message with one
//!    id per delivery as it arrives; (a2) consumes stream C the same way with
//!    batched frames (`max_batch` 64, a quarter of the window, so that a frame
//!    is acked while the next is read), one `Ack` message with every id of a
//!    frame; (a3) consumes stream D as (a2) does, but fails one entry in ten
//!    once with `Fail.kind` TRANSIENT (`retry_after` 0) and acks it when it
//!    comes back, and fails the run if any delivery says `attempts` other
//!    than 1 (the ratio (a3)/(a2) is what transient failures cost);
//!    (b) consumes stream B with the redis crate
//!    directly: `XREADGROUP … COUNT 256 BLOCK 2000` then one `XACK` with all the
//!    ids of the read. Each time runs from the group's creation until Redis has
//!    every entry acknowledged (for the sidecar, until `XPENDING` says 0);
//! 3. memory: the sidecar's resident set idle at start, and its peak so far
//!    right after a phase of one call with `max_in_flight` 10,000;
//! 4. latency: a producer appends with a plain `XADD` at a fixed rate (1,000
//!    entries/s for 5 s), writing the send time (unix µs) into the entry, while
//!    (a) the sidecar's consumer, (a2) the same with batched frames and then
//!    (b) the direct one runs; latency is the receive time minus the send
//!    time, so it includes the XADD itself, and the sidecar's added latency is
//!    its percentile minus the direct one's.
//!
//! Against the commit before: with `ECHOMQ_BENCH_BASELINE_BIN` set to another
//! build of the sidecar (`git worktree add --detach ../base REV`, then
//! `cargo build --release --bin echomq-sidecar` there), a second sidecar runs
//! that binary on the same Redis, and its (a) and (a2) take turns with the
//! others in every round, on the same streams through groups of their own;
//! it prints the ratios of this build to the baseline, the baseline's idle
//! RSS and its (a) latency.
//!
//! Under `cargo test` (`--bench consume` or `--all-targets`: no `--bench` argument) it runs as a quick
//! smoke test with small counts against the debug build, and says so.

mod common;

use std::{
    collections::HashSet,
    process::ExitCode,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use common::redis_server::{RedisOptions, RedisServer};
use common::{
    ack_all, ack_ids, append, connection, create_group, pending, phase, rate, read_group, redis_cpu, thousands,
    ConsumeCall, Error, Sidecar, APPEND_BATCH, BODY_BYTES, WINDOW,
};
use echomq::proto::{
    consume_request::Kind, consume_response::Kind as Event, stream_service_client::StreamServiceClient, ConsumeRequest,
    Fail, FailKind, GroupStart,
};
use redis::aio::MultiplexedConnection;
use tokio::time::MissedTickBehavior;

/// The latency phase's producer rate (entries per second).
const LATENCY_RATE: u64 = 1_000;
/// How long the latency phase's producer runs, full run and smoke run.
const LATENCY_TIME: Duration = Duration::from_secs(5);
const SMOKE_LATENCY_TIME: Duration = Duration::from_millis(500);

fn main() -> ExitCode {
    common::main("consume", |full, entries| {
        let latency_time = if full { LATENCY_TIME } else { SMOKE_LATENCY_TIME };
        run(full, entries, latency_time)
    })
}

async fn run(full: bool, entries: usize, latency_time: Duration) -> Result<(), Error> {
    let sidecar_bin = common::sidecar_bin();
    let dir = common::work_dir("echomq-bench")?;
    let redis_server = RedisServer::try_start_with(RedisOptions::default()).await?;
    let sidecar = Sidecar::start(&sidecar_bin, &redis_server.url(), &[], &dir).await?;
    let endpoint = format!("http://127.0.0.1:{}", sidecar.grpc_port);
    let baseline_bin = std::env::var_os("ECHOMQ_BENCH_BASELINE_BIN").map(std::path::PathBuf::from);
    let baseline = match &baseline_bin {
        Some(bin) => {
            let dir = dir.join("baseline");
            std::fs::create_dir_all(&dir)?;
            Some(Sidecar::start(bin, &redis_server.url(), &[], &dir).await?)
        }
        None => None,
    };
    let baseline_endpoint = baseline.as_ref().map(|b| format!("http://127.0.0.1:{}", b.grpc_port));
    let contenders = contenders(baseline.is_some());
    let mut redis = connection(redis_server.port()).await?;
    let version = common::redis_version(&mut redis).await?;
    let (cpus, load) = (common::cpus(), common::load_average());
    let (idle_rss, _) = sidecar.memory();
    let baseline_idle_rss = baseline.as_ref().map(|b| b.memory().0);

    common::print_title("consume", full);
    println!(
        "  machine  {cpus} CPUs, load average {load} at start; Redis {version} and the sidecar on loopback, no persistence"
    );
    println!("  sidecar  {}", sidecar_bin.display());
    if let Some(bin) = &baseline_bin {
        println!("  baseline {}", bin.display());
    }
    println!(
        "  entries  {entries} per stream, fields `n` and a {BODY_BYTES}-byte `body` (plus the branded id the sidecar adds)"
    );
    println!();

    // 1. Two streams of N entries each, through AppendBatch.
    let mut streams = StreamServiceClient::connect(endpoint.clone()).await?;
    redis::cmd("CONFIG").arg("RESETSTAT").query_async::<()>(&mut redis).await?;
    let (sidecar_before, redis_before) = (sidecar.cpu_time(), redis_cpu(&mut redis).await?);
    let started = Instant::now();
    for stream in ["bench-a", "bench-b", "bench-c", "bench-d"] {
        append(&mut streams, stream, entries, APPEND_BATCH).await?;
    }
    let took = started.elapsed();
    let per_appended = |d: Duration| d.as_secs_f64() * 1e6 / (4 * entries) as f64;
    println!(
        "setup       AppendBatch ({APPEND_BATCH} per call) through the sidecar: {} entries in {:.3} s = {} entries/s; sidecar CPU {:.2} µs/entry, Redis CPU {:.2} µs/entry, Redis wire {:.0} B/entry",
        4 * entries,
        took.as_secs_f64(),
        thousands(rate(4 * entries, took)),
        per_appended(sidecar.cpu_time() - sidecar_before),
        per_appended(redis_cpu(&mut redis).await? - redis_before),
        redis_wire_bytes(&mut redis).await? as f64 / (4 * entries) as f64
    );
    println!();

    // 2. Throughput, contenders alternated over the rounds.
    let rounds = common::rounds(full);
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); contenders.len()];
    let mut commands = vec![String::new(); contenders.len()];
    for round in 0..rounds {
        for k in 0..contenders.len() {
            let which = (round + k) % contenders.len();
            let contender = contenders[which];
            let (through, endpoint) = match (contender.baseline, &baseline, &baseline_endpoint) {
                (true, Some(baseline), Some(endpoint)) => (baseline, endpoint),
                _ => (&sidecar, &endpoint),
            };
            redis::cmd("CONFIG").arg("RESETSTAT").query_async::<()>(&mut redis).await?;
            let (cpu_before, redis_before) = (through.cpu_time(), redis_cpu(&mut redis).await?);
            let group = if contender.baseline { format!("bench-{round}-baseline") } else { format!("bench-{round}") };
            let (took, message_bytes) = phase(contender.label, async {
                match contender.max_batch {
                    None => Ok((direct_throughput(&redis_server, contender.stream, &group, entries).await?, None)),
                    Some(max_batch) if contender.transient => {
                        transient_throughput(endpoint, &mut redis, contender.stream, &group, entries, max_batch).await
                    }
                    Some(max_batch) => {
                        sidecar_throughput(endpoint, &mut redis, contender.stream, &group, entries, WINDOW, max_batch)
                            .await
                    }
                }
            })
            .await?;
            let redis_cpu_used = redis_cpu(&mut redis).await? - redis_before;
            let sidecar_cpu_used = contender.max_batch.map(|_| through.cpu_time() - cpu_before);
            let redis_bytes = redis_wire_bytes(&mut redis).await?;
            samples[which].push(Sample {
                took,
                sidecar_cpu: sidecar_cpu_used,
                redis_cpu: redis_cpu_used,
                redis_bytes,
                message_bytes,
            });
            if round == 0 {
                commands[which] = command_calls(&mut redis).await?;
            }
        }
    }
    println!(
        "throughput  {entries} entries each, from group creation until Redis has every entry acknowledged; rounds: {rounds}, contenders alternated, medians"
    );
    let per_entry = |d: Duration| d.as_secs_f64() * 1e6 / entries as f64;
    let mut rates = Vec::new();
    for (contender, samples) in contenders.iter().zip(&samples) {
        let rate = median(samples.iter().map(|s| common::rate(entries, s.took)).collect());
        let redis_us = median(samples.iter().map(|s| per_entry(s.redis_cpu)).collect());
        let sidecar_us = samples.iter().filter_map(|s| s.sidecar_cpu).map(per_entry).collect::<Vec<_>>();
        let bytes = |b: u64| b as f64 / entries as f64;
        let redis_bytes = median(samples.iter().map(|s| bytes(s.redis_bytes)).collect());
        let message_bytes = samples.iter().filter_map(|s| s.message_bytes).map(bytes).collect::<Vec<_>>();
        let cpu = if sidecar_us.is_empty() {
            format!("Redis CPU {redis_us:.2} µs/entry; Redis wire {redis_bytes:.0} B/entry")
        } else {
            let grpc = if message_bytes.is_empty() {
                String::new()
            } else {
                format!(", gRPC messages {:.0} B/entry", median(message_bytes))
            };
            format!(
                "sidecar CPU {:.2} µs/entry, Redis CPU {redis_us:.2} µs/entry; Redis wire {redis_bytes:.0} B/entry{grpc}",
                median(sidecar_us)
            )
        };
        let each = samples.iter().map(|s| thousands(common::rate(entries, s.took))).collect::<Vec<_>>().join(" / ");
        println!("  {} {}:  {:>9} entries/s  ({each}; {cpu})", contender.label, contender.about, thousands(rate));
        rates.push(rate);
    }
    let direct = rates[contenders.len() - 1];
    println!("  ratio sidecar/direct: {:.2}", rates[0] / direct);
    println!("  ratio batched/direct: {:.2}", rates[1] / direct);
    println!(
        "  ratio transient/batched: {:.2} (one entry in {TRANSIENT_EVERY} failed once as TRANSIENT, every delivery with attempts 1)",
        rates[contenders.len() - 2] / rates[1]
    );
    if baseline.is_some() {
        println!("  ratio baseline sidecar/direct: {:.2}", rates[2] / direct);
        println!("  ratio baseline batched/direct: {:.2}", rates[3] / direct);
        println!("  ratio this build/baseline: sidecar {:.2}, batched {:.2}", rates[0] / rates[2], rates[1] / rates[3]);
    }
    println!("  Redis commands in the first round, calls (time in Redis) from INFO commandstats; the sidecar's include the bench's XPENDING polls:");
    for (contender, calls) in contenders.iter().zip(&commands) {
        println!("    {} {calls}", contender.label);
    }
    println!();

    // Memory: idle at start (above), then a call with the largest window the sidecar allows by default.
    let (took, _) =
        phase("wide window", sidecar_throughput(&endpoint, &mut redis, "bench-c", "wide", entries, WIDE_WINDOW, 256))
            .await?;
    let (_, peak_rss) = sidecar.memory();
    println!(
        "memory      sidecar RSS idle {:.1} MB at start; peak {:.1} MB so far, right after one call with max_in_flight {WIDE_WINDOW} and max_batch 256 ({} entries/s)",
        idle_rss as f64 / 1e6,
        peak_rss as f64 / 1e6,
        thousands(common::rate(entries, took))
    );
    if let Some(idle) = baseline_idle_rss {
        println!("            baseline RSS idle {:.1} MB at start", idle as f64 / 1e6);
    }
    println!();

    // 3. Latency.
    let samples = (LATENCY_RATE as f64 * latency_time.as_secs_f64()) as usize;
    let single = phase("sidecar latency", sidecar_latency(&endpoint, &redis_server, "lat-a", samples, 0)).await?;
    let batched = phase("batched latency", sidecar_latency(&endpoint, &redis_server, "lat-c", samples, 64)).await?;
    let mut measured = vec![("(a) sidecar ", single), ("(a2) batched", batched)];
    if let Some(endpoint) = &baseline_endpoint {
        let lat = phase("baseline latency", sidecar_latency(endpoint, &redis_server, "lat-base", samples, 0)).await?;
        measured.push(("(a') baseline", lat));
    }
    let mut direct = phase("direct latency", direct_latency(&redis_server, "lat-b", samples)).await?;
    direct.sort_unstable();
    println!(
        "latency     producer: plain XADD at {LATENCY_RATE} entries/s for {:.1} s with the send time in the entry; latency = receive time - send time",
        latency_time.as_secs_f64()
    );
    let ms = |us: u64| us as f64 / 1000.0;
    let (direct_p50, direct_p99) = (percentile(&direct, 50), percentile(&direct, 99));
    for (label, mut lat) in measured {
        lat.sort_unstable();
        let (p50, p99) = (percentile(&lat, 50), percentile(&lat, 99));
        println!(
            "  {label}  p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms   ({} samples); added over direct: p50 {:+.3} ms, p99 {:+.3} ms",
            ms(p50),
            ms(p99),
            ms(lat.last().copied().unwrap_or(0)),
            lat.len(),
            ms(p50) - ms(direct_p50),
            ms(p99) - ms(direct_p99),
        );
    }
    println!(
        "  (b) direct    p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms   ({} samples)",
        ms(direct_p50),
        ms(direct_p99),
        ms(direct.last().copied().unwrap_or(0)),
        direct.len()
    );

    drop(sidecar);
    drop(baseline);
    drop(redis_server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// One contender's run: wall time, and the CPU time the sidecar (none for the
/// direct consumer) and Redis used meanwhile.
#[derive(Clone, Copy)]
struct Sample {
    took: Duration,
    sidecar_cpu: Option<Duration>,
    redis_cpu: Duration,
    /// Bytes Redis read and wrote on its connections (`INFO stats`,
    /// `total_net_input_bytes` + `total_net_output_bytes`), the bench's own
    /// polls included.
    redis_bytes: u64,
    /// The Consume call's gRPC message bytes, both ways (none for the direct consumer).
    message_bytes: Option<u64>,
}

/// A throughput contender: its stream, and how it consumes (`max_batch` for a
/// Consume call; `None`: the direct consumer).
#[derive(Clone, Copy)]
struct Contender {
    label: &'static str,
    about: &'static str,
    stream: &'static str,
    max_batch: Option<u32>,
    /// Through the baseline sidecar (`ECHOMQ_BENCH_BASELINE_BIN`).
    baseline: bool,
    /// Fails every [`TRANSIENT_EVERY`]th entry once as TRANSIENT.
    transient: bool,
}

/// The (a3) contender fails one entry in this many once, as TRANSIENT.
const TRANSIENT_EVERY: usize = 10;

/// This build's (a) and (a2), the baseline's when there is one, (a3), and
/// the direct consumer last: the ratios divide by it.
fn contenders(with_baseline: bool) -> Vec<Contender> {
    let single = Contender {
        label: "(a) sidecar ",
        about: "one Consume call, max_in_flight 256, one Ack message (one id) per delivery",
        stream: "bench-a",
        max_batch: Some(0),
        baseline: false,
        transient: false,
    };
    let batched = Contender {
        label: "(a2) batched",
        about: "one Consume call, max_in_flight 256, max_batch 64, one Ack message per frame",
        stream: "bench-c",
        max_batch: Some((WINDOW / 4) as u32),
        baseline: false,
        transient: false,
    };
    let direct = Contender {
        label: "(b) direct  ",
        about: "redis crate, XREADGROUP COUNT 256 BLOCK 2000, one XACK of all ids per read",
        stream: "bench-b",
        max_batch: None,
        baseline: false,
        transient: false,
    };
    let transient = Contender {
        label: "(a3) transient",
        about:
            "(a2) failing one entry in ten once as FAIL_KIND_TRANSIENT (retry_after 0), acking it when it comes back",
        stream: "bench-d",
        transient: true,
        ..batched
    };
    let mut all = vec![single, batched];
    if with_baseline {
        all.push(Contender {
            label: "(a') baseline",
            about: "(a) through the baseline sidecar",
            baseline: true,
            ..single
        });
        all.push(Contender {
            label: "(a2') baseline",
            about: "(a2) through the baseline sidecar",
            baseline: true,
            ..batched
        });
    }
    all.push(transient);
    all.push(direct);
    all
}

/// The memory phase's `max_in_flight`: the sidecar's default limit.
const WIDE_WINDOW: usize = 10_000;

/// The median (the mean of the middle two for an even count); 0 for none.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Bytes Redis read and wrote on its connections since the last `CONFIG
/// RESETSTAT` (`INFO stats`: `total_net_input_bytes` + `total_net_output_bytes`).
async fn redis_wire_bytes(redis: &mut MultiplexedConnection) -> Result<u64, Error> {
    let info: String = redis::cmd("INFO").arg("stats").query_async(redis).await?;
    let bytes = |key: &str| info.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse::<u64>().ok());
    Ok(bytes("total_net_input_bytes:").unwrap_or(0) + bytes("total_net_output_bytes:").unwrap_or(0))
}

/// The `p`th percentile of sorted samples (nearest rank).
fn percentile(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// What Redis ran since the last `CONFIG RESETSTAT`: calls per command and
/// the milliseconds Redis spent in them, most called first.
async fn command_calls(redis: &mut MultiplexedConnection) -> Result<String, Error> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(redis).await?;
    let mut calls: Vec<(String, u64, f64)> = info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| stats.split(',').find_map(|kv| kv.strip_prefix(key));
            Some((name.to_uppercase(), field("calls=")?.parse().ok()?, field("usec=")?.parse::<f64>().ok()? / 1000.0))
        })
        .filter(|(name, _, _)| !name.starts_with("CONFIG") && !name.starts_with("INFO"))
        .collect();
    calls.sort_by_key(|(_, n, _)| std::cmp::Reverse(*n));
    Ok(calls.iter().map(|(name, n, ms)| format!("{name} {n} ({ms:.0} ms)")).collect::<Vec<_>>().join(", "))
}

/// (a) throughput: one Consume call acking each frame as it arrives (one id
/// per Ack with `max_batch` 0; every id of a frame with batches).
async fn sidecar_throughput(
    endpoint: &str,
    redis: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
    entries: usize,
    max_in_flight: usize,
    max_batch: u32,
) -> Result<(Duration, Option<u64>), Error> {
    let mut call =
        ConsumeCall::open_window(endpoint, stream, group, GroupStart::Beginning, max_in_flight, max_batch).await?;
    // Kept to the end, so that freeing the ids is not timed.
    let _seen = call.ack_each(entries, |_| {}).await?;
    // Acks are applied by the sidecar in batches: done when Redis agrees.
    while pending(redis, stream, group).await? > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = call.started.elapsed();
    let message_bytes = call.message_bytes;
    drop(call.verdicts);
    while call.inbound.message().await?.is_some() {}
    Ok((took, Some(message_bytes)))
}

/// (a3) throughput: as (a2), but the first delivery of every
/// [`TRANSIENT_EVERY`]th entry (by its field `n`) is answered with a Fail of
/// kind TRANSIENT and `retry_after` 0, and acked when it comes back. Fails
/// on a delivery with `attempts` other than 1 (a transient failure must not
/// count), a verdict error, or an entry delivered after its ack.
async fn transient_throughput(
    endpoint: &str,
    redis: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
    entries: usize,
    max_batch: u32,
) -> Result<(Duration, Option<u64>), Error> {
    let mut call = ConsumeCall::open_window(endpoint, stream, group, GroupStart::Beginning, WINDOW, max_batch).await?;
    let (mut acked, mut failed) = (HashSet::with_capacity(entries), HashSet::new());
    while acked.len() < entries {
        let message = call.inbound.message().await?.ok_or("the sidecar ended the call early")?;
        let deliveries = match message.kind {
            Some(Event::Delivery(delivery)) => vec![delivery],
            Some(Event::Batch(batch)) => batch.deliveries,
            Some(Event::VerdictError(e)) => return Err(format!("verdict error: {e:?}").into()),
            _ => continue,
        };
        let mut ids = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            if delivery.attempts != 1 {
                return Err(format!("entry {} came with attempts {}", delivery.id, delivery.attempts).into());
            }
            let n: usize = delivery
                .payload
                .get("n")
                .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
                .ok_or_else(|| format!("delivery {} has no numeric field `n`", delivery.id))?;
            if n.is_multiple_of(TRANSIENT_EVERY) && failed.insert(delivery.id.clone()) {
                let fail = Fail {
                    id: delivery.id,
                    kind: FailKind::Transient as i32,
                    retry_after: Some(prost_types::Duration::default()),
                    reason: "transient".to_owned(),
                    ..Fail::default()
                };
                call.verdicts.send(ConsumeRequest { kind: Some(Kind::Fail(fail)) }).await?;
            } else if acked.insert(delivery.id.clone()) {
                ids.push(delivery.id);
            } else {
                return Err(format!("entry {} was delivered after its ack", delivery.id).into());
            }
        }
        if !ids.is_empty() {
            call.verdicts.send(ack_ids(ids)).await?;
        }
    }
    while pending(redis, stream, group).await? > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = call.started.elapsed();
    drop(call.verdicts);
    while call.inbound.message().await?.is_some() {}
    Ok((took, None))
}

/// (b) throughput: XREADGROUP COUNT 256 BLOCK, then one XACK per read.
async fn direct_throughput(
    redis_server: &RedisServer,
    stream: &str,
    group: &str,
    entries: usize,
) -> Result<Duration, Error> {
    let mut conn = connection(redis_server.port()).await?;
    let started = Instant::now();
    create_group(&mut conn, stream, group, "0").await?;
    let mut got = 0;
    while got < entries {
        let read = read_group(&mut conn, stream, group, "direct", WINDOW).await?;
        for entry in &read {
            if entry.fields.as_ref().is_none_or(|fields| !fields.iter().any(|(name, _)| &name[..] == b"n")) {
                return Err(format!("entry {} has no field `n`", entry.id).into());
            }
        }
        got += read.len();
        ack_all(&mut conn, stream, group, &read).await?;
    }
    Ok(started.elapsed())
}

/// The latency phase's producer: `samples` plain XADDs at [`LATENCY_RATE`],
/// each with its send time (unix µs) in the field `t`.
fn spawn_producer(
    mut conn: MultiplexedConnection,
    stream: String,
    samples: usize,
) -> tokio::task::JoinHandle<Result<(), redis::RedisError>> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / LATENCY_RATE));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let body = vec![b'x'; BODY_BYTES];
        for _ in 0..samples {
            tick.tick().await;
            redis::cmd("XADD")
                .arg(&stream)
                .arg("*")
                .arg("t")
                .arg(now_us())
                .arg("body")
                .arg(&body)
                .query_async::<()>(&mut conn)
                .await?;
        }
        Ok(())
    })
}

fn latency_of(sent: Option<&[u8]>, received: u64) -> Result<u64, Error> {
    let sent: u64 = std::str::from_utf8(sent.ok_or("an entry without its send time")?)?.parse()?;
    Ok(received.saturating_sub(sent))
}

/// (a) and (a2) latency: the sidecar's consumer while the producer runs,
/// frames of up to `max_batch` deliveries.
async fn sidecar_latency(
    endpoint: &str,
    redis_server: &RedisServer,
    stream: &str,
    samples: usize,
    max_batch: u32,
) -> Result<Vec<u64>, Error> {
    let mut call = ConsumeCall::open_batched(endpoint, stream, "latency", GroupStart::New, max_batch).await?;
    // The group exists once the call is subscribed: start producing then.
    match call.inbound.message().await?.and_then(|m| m.kind) {
        Some(Event::Subscribed(_)) => {}
        other => return Err(format!("expected Subscribed, got {other:?}").into()),
    }
    let producer = spawn_producer(connection(redis_server.port()).await?, stream.to_owned(), samples);
    let mut latencies = Vec::with_capacity(samples);
    while latencies.len() < samples {
        let message = call.inbound.message().await?.ok_or("the sidecar ended the call early")?;
        let received = now_us();
        let deliveries = match message.kind {
            Some(Event::Delivery(delivery)) => vec![delivery],
            Some(Event::Batch(batch)) => batch.deliveries,
            Some(Event::VerdictError(e)) => return Err(format!("verdict error: {e:?}").into()),
            Some(Event::Emitted(e)) => {
                return Err(format!("an Emitted answer, though no AckEmit was sent: {e:?}").into())
            }
            Some(Event::Subscribed(_)) | None => continue,
        };
        let mut ids = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            latencies.push(latency_of(delivery.payload.get("t").map(|v| &v[..]), received)?);
            ids.push(delivery.id);
        }
        call.verdicts.send(ack_ids(ids)).await?;
    }
    producer.await??;
    drop(call.verdicts);
    while call.inbound.message().await?.is_some() {}
    Ok(latencies)
}

/// (b) latency: the direct consumer while the producer runs.
async fn direct_latency(redis_server: &RedisServer, stream: &str, samples: usize) -> Result<Vec<u64>, Error> {
    let group = "latency";
    let mut conn = connection(redis_server.port()).await?;
    create_group(&mut conn, stream, group, "$").await?;
    let producer = spawn_producer(connection(redis_server.port()).await?, stream.to_owned(), samples);
    let mut latencies = Vec::with_capacity(samples);
    while latencies.len() < samples {
        let read = read_group(&mut conn, stream, group, "direct", WINDOW).await?;
        let received = now_us();
        for entry in &read {
            let sent =
                entry.fields.as_ref().and_then(|f| f.iter().find(|(name, _)| &name[..] == b"t").map(|(_, v)| &v[..]));
            latencies.push(latency_of(sent, received)?);
        }
        ack_all(&mut conn, stream, group, &read).await?;
    }
    producer.await??;
    Ok(latencies)
}
