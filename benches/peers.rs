//! Peers benchmark, the Rust half of `scripts/bench-peers` (beside the Go
//! program and the Python script of `benches/peers/`): the Rust contenders,
//! each consuming one stream through its own group from the group's creation
//! until Redis has every entry acknowledged.
//!
//! ```text
//! peers rust-direct -redis HOST:PORT -stream S -group G -n N
//! peers echomq-rs   -redis HOST:PORT -sidecar HOST:PORT -stream S -group G -n N
//! ```
//!
//! - `rust-direct`: the redis crate, `XREADGROUP … COUNT 256 BLOCK 2000`, then
//!   one `XACK` with every id of the read (the consume bench's direct consumer,
//!   go-redis' loop in `benches/peers/main.go`);
//! - `echomq-rs`: this crate's tonic client (`ConsumerServiceClient`) through
//!   the sidecar, one Consume call with `max_in_flight` 1024 and `max_batch`
//!   256, one `Ack` message with every id of a frame as it arrives (the consume
//!   bench's batched contender, `common::ConsumeCall`). It drives the raw
//!   stubs, with no client library and so no client defaults to take: its
//!   settings are explicit, where `echomq-py` and `echomq-go` run with their
//!   clients' defaults (the sidecar's adaptive window, up to the same 1024).
//!
//! A contender prints one line, `RESULT <name> <seconds> <client cpu s>
//! <sidecar cpu s> <redis cpu s>`: the timed window, this process's CPU time in
//! it, and the CPU time the sidecar and Redis spent in it, all from
//! `/proc/PID/stat` (this process's own, `$PEERS_SIDECAR_PID`'s,
//! `$PEERS_REDIS_PID`'s). Flags take one dash or two, as Go's.
//!
//! The script builds it with `cargo bench --no-run --bench peers` (the bench
//! profile: release settings) and runs the executable itself. Run by `cargo
//! bench` or `cargo test` (no contender named), it says so and does nothing.

// Only `ConsumeCall` and `pending` of `common` are used here.
#[allow(dead_code)]
mod common;

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use common::{ack_all, create_group, pending, read_group, ConsumeCall, Error, DIRECT_BLOCK_MS};
use echomq::proto::GroupStart;
use redis::{aio::MultiplexedConnection, AsyncConnectionConfig};

/// The direct consumer's XREADGROUP COUNT, as go-redis' in the Go program.
const COUNT: usize = 256;
/// The Consume call's `max_in_flight`, fixed: the cap the Go and Python
/// clients' default (adaptive) window grows to, and what their `-1024`
/// contenders set.
const MAX_IN_FLIGHT: usize = 1024;
/// The Consume call's `max_batch`: deliveries per frame at most.
const MAX_BATCH: u32 = 256;
/// How long the window waits for XPENDING to say 0 once every entry was handled.
const PENDING_TIMEOUT: Duration = Duration::from_secs(30);

/// The command line: `<contender> -flag value …`.
struct Args {
    contender: String,
    redis: String,
    sidecar: String,
    stream: String,
    group: String,
    entries: usize,
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`, `cargo test` nothing: no contender.
    if argv.first().is_none_or(|first| first.starts_with('-')) {
        println!("peers bench: the Rust contenders of scripts/bench-peers (rust-direct, echomq-rs); run that script");
        return ExitCode::SUCCESS;
    }
    let args = match parse(argv) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("peers: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("peers: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(common::phase(&args.contender, run(&args))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peers: {}: {e}", args.contender);
            ExitCode::FAILURE
        }
    }
}

fn parse(argv: Vec<String>) -> Result<Args, Error> {
    let mut argv = argv.into_iter();
    let contender = argv.next().unwrap_or_default();
    if !matches!(contender.as_str(), "rust-direct" | "echomq-rs") {
        return Err(format!("unknown contender `{contender}`: rust-direct or echomq-rs").into());
    }
    let mut args = Args {
        contender,
        redis: String::new(),
        sidecar: String::new(),
        stream: String::new(),
        group: String::new(),
        entries: 100_000,
    };
    while let Some(flag) = argv.next() {
        let flag = flag.trim_start_matches('-').to_owned();
        let (name, value) = match flag.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => (flag.clone(), argv.next().ok_or(format!("-{flag} needs a value"))?),
        };
        match name.as_str() {
            "redis" => args.redis = value,
            "sidecar" => args.sidecar = value,
            "stream" => args.stream = value,
            "group" => args.group = value,
            "n" => args.entries = value.parse().map_err(|_| format!("-n: not a count: `{value}`"))?,
            _ => return Err(format!("unknown flag -{name}").into()),
        }
    }
    for (name, value) in [("redis", &args.redis), ("stream", &args.stream), ("group", &args.group)] {
        if value.is_empty() {
            return Err(format!("-{name} is required").into());
        }
    }
    if args.contender == "echomq-rs" && args.sidecar.is_empty() {
        return Err("echomq-rs: -sidecar is required".into());
    }
    Ok(args)
}

/// One contender's timed window, and its RESULT line.
async fn run(args: &Args) -> Result<(), Error> {
    let client = redis::Client::open(format!("redis://{}", args.redis))?;
    // No response timeout: the direct consumer blocks.
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let mut redis = client.get_multiplexed_async_connection_with_config(&config).await?;
    redis::cmd("PING").query_async::<()>(&mut redis).await?;

    let window = Window::open();
    let call = match args.contender.as_str() {
        "rust-direct" => {
            rust_direct(&mut redis, &args.stream, &args.group, args.entries).await?;
            None
        }
        _ => Some(echomq_rs(&args.sidecar, &args.stream, &args.group, args.entries).await?),
    };
    wait_none_pending(&mut redis, &args.stream, &args.group).await?;
    window.report(&args.contender);

    // Ending the call (and freeing the ids it saw) is not timed.
    if let Some(mut call) = call {
        drop(call.verdicts);
        while call.inbound.message().await?.is_some() {}
    }
    Ok(())
}

/// `rust-direct`: XREADGROUP COUNT 256 BLOCK 2000, then one XACK with every id of the read.
async fn rust_direct(
    redis: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
    entries: usize,
) -> Result<(), Error> {
    create_group(redis, stream, group, "0").await?;
    let mut seen = 0;
    while seen < entries {
        let read = read_group(redis, stream, group, "c1", COUNT).await?;
        if read.is_empty() {
            return Err(
                format!("XREADGROUP: nothing within {DIRECT_BLOCK_MS} ms, {seen} of {entries} entries read").into()
            );
        }
        // The handler: nothing to do.
        ack_all(redis, stream, group, &read).await?;
        seen += read.len();
    }
    Ok(())
}

/// `echomq-rs`: one Consume call, one `Ack` message with every id of each frame.
/// The call, open: the caller ends it after the window.
async fn echomq_rs(sidecar: &str, stream: &str, group: &str, entries: usize) -> Result<ConsumeCall, Error> {
    let endpoint = format!("http://{sidecar}");
    let mut call =
        ConsumeCall::open_window(&endpoint, stream, group, GroupStart::Beginning, MAX_IN_FLIGHT, MAX_BATCH).await?;
    call.ack_each(entries, |_| {}).await?;
    Ok(call)
}

/// Polls XPENDING until the group has nothing pending (acks reach Redis a
/// little after they are sent: the sidecar applies them in batches).
async fn wait_none_pending(redis: &mut MultiplexedConnection, stream: &str, group: &str) -> Result<(), Error> {
    let deadline = Instant::now() + PENDING_TIMEOUT;
    loop {
        let left = pending(redis, stream, group).await?;
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{stream}/{group}: {left} entries still pending").into());
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// The timed window: wall time, and the CPU time of this process, the sidecar
/// and Redis.
struct Window {
    sidecar: String,
    redis: String,
    cpu: [f64; 3],
    started: Instant,
}

impl Window {
    fn open() -> Window {
        let sidecar = std::env::var("PEERS_SIDECAR_PID").unwrap_or_default();
        let redis = std::env::var("PEERS_REDIS_PID").unwrap_or_default();
        let cpu = [proc_cpu("self"), proc_cpu(&sidecar), proc_cpu(&redis)];
        Window { sidecar, redis, cpu, started: Instant::now() }
    }

    fn report(&self, name: &str) {
        let took = self.started.elapsed();
        let cpu = [proc_cpu("self"), proc_cpu(&self.sidecar), proc_cpu(&self.redis)];
        let [client, sidecar, redis] = [0, 1, 2].map(|i| cpu[i] - self.cpu[i]);
        println!("RESULT {name} {:.6} {client:.3} {sidecar:.3} {redis:.3}", took.as_secs_f64());
    }
}

/// A process's user+system CPU seconds, all threads, from `/proc/PID/stat`
/// (utime and stime, in clock ticks of `$PEERS_CLK_TCK`, default 100); 0 where
/// unknown.
fn proc_cpu(pid: &str) -> f64 {
    if pid.is_empty() {
        return 0.0;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name is in parentheses and may hold spaces: fields after it.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: f64 = after.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<f64>().ok()).sum();
    let tck = std::env::var("PEERS_CLK_TCK").ok().and_then(|v| v.parse::<f64>().ok()).filter(|&v| v > 0.0);
    ticks / tck.unwrap_or(100.0)
}
