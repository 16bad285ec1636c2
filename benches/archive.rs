//! Archive benchmark: how fast a trim folds a stream into the archive, what
//! Redis memory that gives back, and a Read across the archive boundary
//! against a Read of the same range from the live stream, in one run.
//!
//! ```text
//! cargo bench --bench archive
//! ECHOMQ_BENCH_ENTRIES=200000 ECHOMQ_BENCH_ROUNDS=5 cargo bench --bench archive
//! ```
//!
//! It starts its own `redis-server` (free loopback port, no persistence) and
//! the sidecar cargo built (release under `cargo bench`) with `--archive-url`
//! on a local directory in the target dir. Each round appends N entries
//! (default 50,000; fields `n` and a 100-byte `body`) to two fresh streams,
//! folds one with a `Trim` that keeps 1 entry (timed: entries/s, and MB/s of
//! Parquet written; the `used_memory` Redis gave back), then reads both whole
//! ranges with `Read` (1,000 per page), the two in alternating order from
//! round to round: the folded one from the archive (then its one live entry),
//! the other from the stream. It prints the median of each and their ratio,
//! with the machine's load.
//!
//! Under `cargo test` (no `--bench` argument) it is a quick smoke run with
//! small counts against the debug build, and says so.

// The consume helpers of `common` are the other benchmarks'.
#[allow(dead_code)]
mod common;

use std::{
    path::Path,
    process::ExitCode,
    time::{Duration, Instant},
};

use common::redis_server::{RedisOptions, RedisServer};
use common::{append, connection, rate, thousands, Error, Sidecar, APPEND_BATCH, BODY_BYTES};
use echomq::proto::{stream_service_client::StreamServiceClient, ReadRequest, TrimRequest};
use redis::aio::MultiplexedConnection;
use tonic::transport::Channel;

/// Entries per Read page.
const PAGE: u32 = 1_000;

fn main() -> ExitCode {
    common::main("archive", run)
}

async fn run(full: bool, entries: usize) -> Result<(), Error> {
    let sidecar_bin = common::sidecar_bin();
    let dir = common::work_dir("echomq-bench-archive")?;
    let archive_dir = dir.join("archive");
    std::fs::create_dir_all(&archive_dir)?;
    let url = format!("file://{}", archive_dir.display());
    let redis_server = RedisServer::try_start_with(RedisOptions::default()).await?;
    let sidecar = Sidecar::start(&sidecar_bin, &redis_server.url(), &["--archive-url", &url], &dir).await?;
    let mut streams = StreamServiceClient::connect(format!("http://127.0.0.1:{}", sidecar.grpc_port)).await?;
    let mut redis = connection(redis_server.port()).await?;
    let version = common::redis_version(&mut redis).await?;

    common::print_title("archive", full);
    println!(
        "  machine  {} CPUs, load average {} at start; Redis {version} and the sidecar on loopback, no persistence",
        common::cpus(),
        common::load_average()
    );
    println!("  sidecar  {}", sidecar_bin.display());
    println!("  archive  {url} (Parquet, zstd)");
    println!("  entries  {entries} per stream, fields `n` and a {BODY_BYTES}-byte `body`; Read pages of {PAGE}");
    println!();

    let rounds = common::rounds(full);
    let (mut fold, mut fold_mb, mut freed_mb, mut read_archive, mut read_live) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (folded, live) = (format!("folded-{round}"), format!("live-{round}"));
        append(&mut streams, &folded, entries, APPEND_BATCH).await?;
        append(&mut streams, &live, entries, APPEND_BATCH).await?;

        let memory = used_memory(&mut redis).await?;
        let started = Instant::now();
        let trim = TrimRequest { stream: folded.clone(), max_len: 1, ..Default::default() };
        let trimmed = streams.trim(trim).await?.into_inner();
        let took = started.elapsed();
        if trimmed.archived as usize != entries - 1 {
            return Err(format!("the trim archived {} entries, not {}", trimmed.archived, entries - 1).into());
        }
        let freed = memory.saturating_sub(used_memory(&mut redis).await?);
        let bytes = dir_bytes(&archive_dir.join(&folded))?;
        fold.push(rate(entries - 1, took));
        fold_mb.push(bytes as f64 / 1e6 / took.as_secs_f64());
        freed_mb.push(freed as f64 / 1e6);

        let order = if round % 2 == 0 { [&folded, &live] } else { [&live, &folded] };
        for stream in order {
            let took = read_whole(&mut streams, stream, entries).await?;
            if stream == &folded { &mut read_archive } else { &mut read_live }.push(rate(entries, took));
        }
        println!(
            "round {}   fold {} entries/s ({:.1} MB/s of Parquet, {:.1} MB of Redis memory back)   read: archive {} entries/s, live {} entries/s",
            round + 1,
            thousands(*fold.last().unwrap_or(&0.0)),
            fold_mb.last().unwrap_or(&0.0),
            freed_mb.last().unwrap_or(&0.0),
            thousands(*read_archive.last().unwrap_or(&0.0)),
            thousands(*read_live.last().unwrap_or(&0.0)),
        );
    }
    println!();
    let (archive, live) = (median(read_archive), median(read_live));
    println!(
        "median      fold {} entries/s, {:.1} MB/s of Parquet, {:.1} MB of Redis memory given back per {entries} entries",
        thousands(median(fold)),
        median(fold_mb),
        median(freed_mb)
    );
    println!(
        "            Read across the boundary {} entries/s against the live stream's {} entries/s: {:.2}×",
        thousands(archive),
        thousands(live),
        archive / live
    );
    println!("  load average {} at the end", common::load_average());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Reads `stream` whole with Read, `PAGE` at a time; checks it got `entries`.
async fn read_whole(
    streams: &mut StreamServiceClient<Channel>,
    stream: &str,
    entries: usize,
) -> Result<Duration, Error> {
    let started = Instant::now();
    let (mut read, mut start) = (0, String::new());
    loop {
        let request = ReadRequest { stream: stream.to_owned(), start_id: start, count: PAGE, ..Default::default() };
        let page = streams.read(request).await?.into_inner();
        read += page.entries.len();
        if page.next_start_id.is_empty() {
            break;
        }
        start = page.next_start_id;
    }
    if read != entries {
        return Err(format!("read {read} entries of {stream}, not {entries}").into());
    }
    Ok(started.elapsed())
}

/// Redis' `used_memory` (bytes).
async fn used_memory(redis: &mut MultiplexedConnection) -> Result<u64, Error> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(redis).await?;
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".into())
}

/// The bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> Result<u64, Error> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        total += if entry.file_type()?.is_dir() { dir_bytes(&entry.path())? } else { entry.metadata()?.len() };
    }
    Ok(total)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
