//! Scheduled-entry benchmark: what scheduling and moving entries cost against
//! a plain AppendBatch, on the same machine and Redis, in one run; and how
//! long after its due time an entry is in its stream.
//!
//! ```text
//! cargo bench --bench scheduled                          # or scripts/bench
//! ECHOMQ_BENCH_ENTRIES=100000 ECHOMQ_BENCH_ROUNDS=5 cargo bench --bench scheduled
//! ```
//!
//! It starts a `redis-server` (loopback, no persistence) and one sidecar with
//! the default `--schedule-poll-ms` (100). Over the rounds
//! (`ECHOMQ_BENCH_ROUNDS`, 3), alternating which goes first:
//!
//! - plain: N entries (`ECHOMQ_BENCH_ENTRIES`, 50,000) by AppendBatch of
//!   1,000, into a fresh stream: entries/s until the last batch is answered
//!   (they are in the stream then);
//! - scheduled: the same N entries, all due at one instant a few seconds
//!   ahead (`deliver_at`): entries/s until the last batch is answered (the
//!   scheduling), then, from the due instant, when the first entry is in the
//!   stream (XLEN polled every millisecond) and when all are: the move's
//!   rate from the first to the last, and from the due instant to the last.
//!
//! Then the delay bound: [`SINGLES`] entries appended one at a time, each with
//! a `delay` of 300 ms plus a few ms, spread out; each entry's time from due to
//! in the stream (XRANGE polled every millisecond), p50, p99 and max.
//!
//! Under `cargo test` it is a smoke run with small counts on the debug build.

#[allow(dead_code)]
mod common;

use std::{
    collections::HashMap,
    process::ExitCode,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use common::redis_server::{RedisOptions, RedisServer};
use common::{
    append, connection, median_f64 as median, phase, rate, thousands, Error, Sidecar, APPEND_BATCH, BODY_BYTES,
};
use echomq::proto::{stream_service_client::StreamServiceClient, AppendRequest};
use redis::aio::MultiplexedConnection;
use tonic::transport::Channel;

/// Single scheduled entries timed from due to in the stream (full run; the smoke run does 10).
const SINGLES: usize = 200;

fn main() -> ExitCode {
    common::main("scheduled", run)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

/// One round's scheduled figures.
struct Moved {
    /// Entries/s of the scheduled AppendBatch calls.
    scheduling: f64,
    /// From the due instant to the first entry in the stream.
    first: Duration,
    /// Entries/s from the first entry in the stream to the last.
    moving: f64,
    /// Entries/s from the due instant to the last entry in the stream.
    due_to_all: f64,
}

async fn run(full: bool, entries: usize) -> Result<(), Error> {
    let sidecar_bin = common::sidecar_bin();
    let dir = common::work_dir("echomq-bench-scheduled")?;
    let server = RedisServer::try_start_with(RedisOptions::default()).await?;
    let mut redis = connection(server.port()).await?;
    let sidecar = Sidecar::start(&sidecar_bin, &server.url(), &[], &dir).await?;
    let version = common::redis_version(&mut redis).await?;
    let load_before = common::load_average();
    let singles = if full { SINGLES } else { 10 };
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", sidecar.grpc_port))?.connect().await?;

    common::print_title("scheduled", full);
    println!(
        "  machine  {} CPUs, load average {load_before} at start; Redis {version} on loopback, no persistence",
        common::cpus()
    );
    println!("  sidecar  {} (--schedule-poll-ms 100, the default)", sidecar_bin.display());
    println!(
        "  entries  {entries} per contender and round, one {BODY_BYTES}-byte field each, by AppendBatch of \
         {APPEND_BATCH}; then {singles} single scheduled entries for the delay bound"
    );
    println!();

    let rounds = common::rounds(full);
    let mut plain_rates = Vec::new();
    let mut moved: Vec<Moved> = Vec::new();
    for round in 0..rounds {
        let plain_first = round % 2 == 0;
        for step in 0..2 {
            if (step == 0) == plain_first {
                let mut streams = StreamServiceClient::new(channel.clone());
                let took = phase("plain", append(&mut streams, &format!("bench-plain-{round}"), entries, APPEND_BATCH))
                    .await?;
                plain_rates.push(rate(entries, took));
            } else {
                let stream = format!("bench-scheduled-{round}");
                moved.push(phase("scheduled", scheduled(&channel, &mut redis, &stream, entries, full)).await?);
            }
        }
    }
    let delays = phase("delay bound", delay_bound(&channel, &mut redis, singles)).await?;

    let plain = median(&plain_rates);
    let scheduling = median(&moved.iter().map(|m| m.scheduling).collect::<Vec<_>>());
    let moving = median(&moved.iter().map(|m| m.moving).collect::<Vec<_>>());
    let due_to_all = median(&moved.iter().map(|m| m.due_to_all).collect::<Vec<_>>());
    let first = median(&moved.iter().map(|m| m.first.as_secs_f64() * 1e3).collect::<Vec<_>>());
    println!("rounds: {rounds}, plain and scheduled alternated; medians over the rounds");
    println!("  {:<52} {:>12} {:>8}", "contender", "entries/s", "ratio");
    println!("  {:<52} {:>12} {:>7.2}x", "plain AppendBatch (in the stream when answered)", thousands(plain), 1.0);
    println!(
        "  {:<52} {:>12} {:>7.2}x",
        "scheduled AppendBatch (the scheduling)",
        thousands(scheduling),
        scheduling / plain
    );
    println!(
        "  {:<52} {:>12} {:>7.2}x",
        "move, all due at once (first in to last in)",
        thousands(moving),
        moving / plain
    );
    println!(
        "  {:<52} {:>12} {:>7.2}x",
        "move, all due at once (due instant to last in)",
        thousands(due_to_all),
        due_to_all / plain
    );
    println!("  due instant to the first entry in the stream: {first:.1} ms (median)");
    println!(
        "  single entries, due to in the stream: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} entries)",
        percentile(&delays, 50.0),
        percentile(&delays, 99.0),
        percentile(&delays, 100.0),
        delays.len()
    );
    println!("  load average {load_before} at start, {} at the end", common::load_average());
    println!("  (ratio: entries/s against plain AppendBatch in the same run)");
    Ok(())
}

/// Schedules `entries` entries all due at one instant, then times their move.
async fn scheduled(
    channel: &Channel,
    redis: &mut MultiplexedConnection,
    stream: &str,
    entries: usize,
    full: bool,
) -> Result<Moved, Error> {
    let margin = if full { 6_000 } else { 3_000 };
    let due = now_ms() + margin;
    let mut streams = StreamServiceClient::new(channel.clone());
    let took = common::append_due(&mut streams, stream, entries, APPEND_BATCH, Some(timestamp(due))).await?;
    if now_ms() >= due {
        return Err(format!("scheduling {entries} entries took {took:?}, past their due instant: fewer entries").into());
    }
    let len = |redis: &mut MultiplexedConnection| {
        let mut redis = redis.clone();
        async move { redis::cmd("XLEN").arg(stream).query_async::<usize>(&mut redis).await }
    };
    if len(redis).await? != 0 {
        return Err("scheduled entries were in the stream before their time".into());
    }
    tokio::time::sleep(Duration::from_millis(due.saturating_sub(now_ms()).saturating_sub(5))).await;
    let mut first = None;
    loop {
        let n = len(redis).await?;
        let at = now_ms();
        if n > 0 && first.is_none() {
            first = Some(at);
        }
        if n >= entries {
            let first = first.unwrap_or(at);
            let moving = entries as f64 / (at.saturating_sub(first).max(1) as f64 / 1e3);
            let due_to_all = entries as f64 / (at.saturating_sub(due).max(1) as f64 / 1e3);
            let first = Duration::from_millis(first.saturating_sub(due));
            return Ok(Moved { scheduling: rate(entries, took), first, moving, due_to_all });
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// `singles` entries, each due 300 ms (plus a few) after its append, appended
/// 7 ms apart; each one's time from due to in the stream (ms).
async fn delay_bound(channel: &Channel, redis: &mut MultiplexedConnection, singles: usize) -> Result<Vec<f64>, Error> {
    let stream = "bench-delay";
    let mut streams = StreamServiceClient::new(channel.clone());
    let mut due: HashMap<String, u64> = HashMap::new();
    let mut arrived: HashMap<String, u64> = HashMap::new();
    let mut last = "-".to_owned();
    let mut next_append = Instant::now();
    while arrived.len() < singles {
        if due.len() < singles && Instant::now() >= next_append {
            let delay_ms = 300 + (due.len() as u64 * 13) % 100;
            let request = AppendRequest {
                stream: stream.to_owned(),
                fields: [("body".to_owned(), vec![b'x'; BODY_BYTES])].into(),
                delay: Some(prost_types::Duration { seconds: 0, nanos: (delay_ms * 1_000_000) as i32 }),
                ..Default::default()
            };
            let sent = now_ms();
            let written = streams.append(request).await?.into_inner();
            due.insert(written.id, sent + delay_ms);
            next_append += Duration::from_millis(7);
        }
        let page: Vec<(String, Vec<Vec<u8>>)> =
            redis::cmd("XRANGE").arg(stream).arg(&last).arg("+").query_async(redis).await?;
        let at = now_ms();
        for (id, fields) in page {
            if let Some(pair) = fields.chunks(2).find(|pair| pair[0] == b"id") {
                arrived.entry(String::from_utf8_lossy(&pair[1]).into_owned()).or_insert(at);
            }
            last = format!("({id}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut delays: Vec<f64> = arrived.iter().map(|(id, at)| at.saturating_sub(due[id]) as f64).collect();
    delays.sort_by(f64::total_cmp);
    Ok(delays)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}
