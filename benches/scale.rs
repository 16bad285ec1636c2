//! Scale benchmark: what a subscription costs a sidecar and Redis when there
//! are many of them, and what delivery latency they get at a trickle.
//!
//! ```text
//! cargo bench --bench scale
//! ECHOMQ_SCALE_STAGES=1,10,100 ECHOMQ_SCALE_FLEET=20 cargo bench --bench scale
//! ECHOMQ_SCALE_SIDECAR_ARGS="--shared-readers off" cargo bench --bench scale    # every reader blocks
//! ```
//!
//! It starts its own `redis-server` (free loopback port, no persistence) and,
//! per stage, a fresh sidecar (the binary cargo built for it, or
//! `ECHOMQ_SIDECAR_BIN`), then:
//!
//! 1. opens N Consume calls (N = 1, 10, 100, 1,000; `ECHOMQ_SCALE_STAGES`),
//!    each subscribed to a stream and group of its own, with the clients'
//!    defaults (`max_in_flight` 0: the adaptive window; `max_batch` 256), on
//!    the sidecar's default settings, and counts the subscriptions refused.
//!    When some are, it restarts the sidecar with `--reader-connections N+16`
//!    and opens them again, so the costs below are those of N subscriptions;
//! 2. counts the sidecar's Redis connections (`CLIENT LIST` less the bench's
//!    own, which are named `echomq-bench`);
//! 3. idle, nothing appended: the CPU time Redis (`INFO cpu`) and the sidecar
//!    (`/proc/<pid>/stat`) spend per second over 20 s (2 s in the smoke run);
//!    then, over as long, the commands the sidecar sends, from Redis'
//!    `MONITOR` (round trips: the commands a script runs inside Redis, which
//!    `MONITOR` tags `lua`, are counted apart and printed beside them), per
//!    subscription per second; the sidecar's resident set;
//! 4. latency: a producer appends to every stream once a second, spread evenly
//!    (N entries/s in all; a plain `XADD` writing the send time, unix µs), for
//!    20 s (2 s), while each call acks what it gets; latency is the receive time
//!    minus the send time (it includes the XADD). p50, p99, max; and the CPU
//!    time Redis and the sidecar spent per entry meanwhile, upkeep included
//!    (what an entry costs at a trickle, where each read finds one entry).
//!
//! Then a fleet: 50 sidecars (`ECHOMQ_SCALE_FLEET`; 3 in the smoke run), each
//! with one call on the same stream and group (consumer names of their own),
//! measured the same way per sidecar, with 50 entries/s appended.
//!
//! Each figure is printed beside its target (issue 27): no subscription
//! refused by default; at most 4 Redis connections per sidecar; at most 0.3
//! idle commands/s per subscription (what each adds on one sidecar, beside
//! the sidecar's own upkeep, printed too); at most 48 MB resident at 1,000
//! subscriptions; latency p99 at most 5 ms at 1 entry/s per stream across
//! 1,000 streams. The machine's load average is printed at start and end.
//!
//! Under `cargo test --bench scale` (no `--bench` argument) it runs as a smoke
//! test with two small stages and short windows, and says so.

// The consume helpers of `common` are the other benchmarks'.
#[allow(dead_code)]
mod common;

use std::{
    collections::HashSet,
    path::Path,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use common::redis_server::{RedisOptions, RedisServer};
use common::{connection, Error, Sidecar};
use echomq::proto::{
    consume_request::Kind, consume_response::Kind as Event, consumer_service_client::ConsumerServiceClient, Ack,
    ConsumeRequest, GroupStart, Subscribe,
};
use redis::aio::MultiplexedConnection;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    sync::mpsc,
    task::JoinSet,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{transport::Channel, Code};

/// Subscriptions per stage, full run and smoke run.
const STAGES: [usize; 4] = [1, 10, 100, 1_000];
const SMOKE_STAGES: [usize; 2] = [1, 10];
/// Sidecars of the fleet, full run and smoke run.
const FLEET: usize = 50;
const SMOKE_FLEET: usize = 3;
/// How long the idle count and the latency phase each last.
const WINDOW: Duration = Duration::from_secs(20);
const SMOKE_WINDOW: Duration = Duration::from_secs(2);
/// Calls per gRPC connection: the server takes 200 concurrent streams per
/// HTTP/2 connection.
const CALLS_PER_CHANNEL: usize = 100;
/// The name the bench's own Redis connections carry, so they are not counted.
const BENCH_CLIENT: &str = "echomq-bench";

/// Targets, from issue 27.
const TARGET_CONNECTIONS: f64 = 4.0;
const TARGET_IDLE_COMMANDS: f64 = 0.3;
const TARGET_RSS_AT_1000: f64 = 48.0;
const TARGET_P99_MS: f64 = 5.0;

fn main() -> std::process::ExitCode {
    common::main("scale", |full, _entries| run(full))
}

/// One stage's figures.
struct Costs {
    label: String,
    subscriptions: usize,
    sidecars: usize,
    refused_by_default: usize,
    /// The sidecars' Redis connections, all of them.
    connections: usize,
    /// Round trips per second, all sidecars together, with nothing to deliver.
    idle_commands: f64,
    /// Commands run inside scripts per second, beside `idle_commands`.
    idle_script_commands: f64,
    /// CPU time per second of Redis and of the sidecars together, with
    /// nothing to deliver (ms/s).
    idle_cpu: Cpu,
    /// CPU time of Redis and of the sidecars per entry in the latency phase,
    /// upkeep included (µs/entry).
    trickle_cpu: Cpu,
    /// Resident set, bytes, mean over the sidecars.
    rss: u64,
    latency: Latency,
    /// When some appended entries were not delivered in time: what the
    /// groups say of them (pending, lag), summed over the streams.
    undelivered: Option<(i64, i64)>,
}

async fn run(full: bool) -> Result<(), Error> {
    let bin = common::sidecar_bin();
    let dir = common::work_dir("echomq-bench-scale")?;
    let redis_server = RedisServer::try_start_with(RedisOptions::default()).await?;
    let mut redis = bench_connection(redis_server.port()).await?;
    let version = common::redis_version(&mut redis).await?;
    let window = if full { WINDOW } else { SMOKE_WINDOW };
    let stages = match std::env::var("ECHOMQ_SCALE_STAGES") {
        Ok(text) => text.split(',').map(|n| n.trim().parse::<usize>()).collect::<Result<Vec<_>, _>>()?,
        Err(_) if full => STAGES.to_vec(),
        Err(_) => SMOKE_STAGES.to_vec(),
    };
    let fleet = match std::env::var("ECHOMQ_SCALE_FLEET") {
        Ok(text) => text.trim().parse::<usize>()?,
        Err(_) if full => FLEET,
        Err(_) => SMOKE_FLEET,
    };

    common::print_title("scale", full);
    println!(
        "  machine  {} CPUs, load average {} at start; Redis {version} and the sidecars on loopback, no persistence",
        common::cpus(),
        common::load_average()
    );
    println!("  sidecar  {}", bin.display());
    println!(
        "  windows  idle {:.0} s, latency {:.0} s (1 entry/s per stream, spread evenly)",
        window.as_secs_f64(),
        window.as_secs_f64()
    );
    println!();

    let mut all = Vec::new();
    for n in stages {
        let costs = stage(&bin, &redis_server, &mut redis, &dir, n, window).await?;
        print_costs(&costs);
        all.push(costs);
    }
    if fleet > 0 {
        let costs = fleet_stage(&bin, &redis_server, &mut redis, &dir, fleet, window).await?;
        print_costs(&costs);
        all.push(costs);
    }
    println!();
    print_model_check(&all);
    println!();
    print_targets(&all);
    println!();
    println!("  load average {} at end", common::load_average());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// N subscriptions on one sidecar, one stream and group each.
async fn stage(
    bin: &Path,
    redis_server: &RedisServer,
    redis: &mut MultiplexedConnection,
    dir: &Path,
    n: usize,
    window: Duration,
) -> Result<Costs, Error> {
    let streams: Vec<String> = (0..n).map(|i| format!("scale-{n}-{i}")).collect();
    let stage_dir = dir.join(format!("stage-{n}"));
    std::fs::create_dir_all(&stage_dir)?;
    let extra = extra_args();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let sidecar = Sidecar::start(bin, &redis_server.url(), &extra, &stage_dir).await?;
    let (calls, refused) = open_calls(sidecar.grpc_port, &streams, "scale").await?;
    let (sidecar, calls) = if refused == 0 {
        (sidecar, calls)
    } else {
        drop(calls);
        drop(sidecar);
        let raised = (n + 16).to_string();
        let raised_args: Vec<&str> = extra.iter().copied().chain(["--reader-connections", &raised]).collect();
        let sidecar = Sidecar::start(bin, &redis_server.url(), &raised_args, &stage_dir).await?;
        let (calls, still) = open_calls(sidecar.grpc_port, &streams, "scale").await?;
        if still > 0 {
            return Err(format!("{still} of {n} subscriptions refused even with --reader-connections {raised}").into());
        }
        (sidecar, calls)
    };
    // Let start-up work (group creation, the first reclaim beats) pass.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let connections = sidecar_connections(redis).await?;
    let before = cpu_now(redis, &[&sidecar]).await?;
    tokio::time::sleep(window).await;
    let idle_cpu = cpu_since(redis, &[&sidecar], before, window.as_secs_f64() / 1e3).await?;
    let (idle_commands, idle_script_commands) = monitor_round_trips(redis_server.port(), window).await?;
    let rss = sidecar.memory().0;
    let before = cpu_now(redis, &[&sidecar]).await?;
    let latency = measure_latency(redis, calls, &streams, streams.len() as f64, window).await?;
    let trickle_cpu = cpu_since(redis, &[&sidecar], before, latency.appended as f64 / 1e6).await?;
    let undelivered = groups_backlog(redis, &streams, "scale", &latency).await?;
    Ok(Costs {
        label: format!("{n} subscription{}", if n == 1 { "" } else { "s" }),
        subscriptions: n,
        sidecars: 1,
        refused_by_default: refused,
        connections,
        idle_commands,
        idle_script_commands,
        idle_cpu,
        trickle_cpu,
        rss,
        latency,
        undelivered,
    })
}

/// `ECHOMQ_SCALE_SIDECAR_ARGS`, split on spaces: flags every sidecar of
/// every stage gets (e.g. `--shared-readers off`, to measure blocking readers).
fn extra_args() -> Vec<String> {
    std::env::var("ECHOMQ_SCALE_SIDECAR_ARGS").unwrap_or_default().split_whitespace().map(str::to_owned).collect()
}

/// `fleet` sidecars, each with one call on the same stream and group.
async fn fleet_stage(
    bin: &Path,
    redis_server: &RedisServer,
    redis: &mut MultiplexedConnection,
    dir: &Path,
    fleet: usize,
    window: Duration,
) -> Result<Costs, Error> {
    let stream = format!("scale-fleet-{fleet}");
    let mut sidecars = Vec::with_capacity(fleet);
    let mut calls = Vec::with_capacity(fleet);
    let mut refused = 0;
    for k in 0..fleet {
        let sidecar_dir = dir.join(format!("fleet-{k}"));
        std::fs::create_dir_all(&sidecar_dir)?;
        let consumer = format!("fleet-{k}");
        let extra = extra_args();
        let args: Vec<&str> =
            ["--consumer-name", &consumer].into_iter().chain(extra.iter().map(String::as_str)).collect();
        let sidecar = Sidecar::start(bin, &redis_server.url(), &args, &sidecar_dir).await?;
        let (mut opened, r) = open_calls(sidecar.grpc_port, std::slice::from_ref(&stream), "fleet").await?;
        refused += r;
        calls.append(&mut opened);
        sidecars.push(sidecar);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let connections = sidecar_connections(redis).await?;
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    let before = cpu_now(redis, &all).await?;
    tokio::time::sleep(window).await;
    let idle_cpu = cpu_since(redis, &all, before, window.as_secs_f64() / 1e3).await?;
    let (idle_commands, idle_script_commands) = monitor_round_trips(redis_server.port(), window).await?;
    let rss = sidecars.iter().map(|s| s.memory().0).sum::<u64>() / fleet as u64;
    let before = cpu_now(redis, &all).await?;
    let latency = measure_latency(redis, calls, std::slice::from_ref(&stream), fleet as f64, window).await?;
    let trickle_cpu = cpu_since(redis, &all, before, latency.appended as f64 / 1e6).await?;
    let undelivered = groups_backlog(redis, std::slice::from_ref(&stream), "fleet", &latency).await?;
    Ok(Costs {
        label: format!("{fleet} sidecars × 1 group"),
        subscriptions: fleet,
        sidecars: fleet,
        refused_by_default: refused,
        connections,
        idle_commands,
        idle_script_commands,
        idle_cpu,
        trickle_cpu,
        rss,
        latency,
        undelivered,
    })
}

/// An open call: what it sends, and the task that acks what it receives.
struct Call {
    verdicts: mpsc::Sender<ConsumeRequest>,
    inbound: tonic::Streaming<echomq::proto::ConsumeResponse>,
}

/// Opens one call per stream (group `group`, new entries only, the clients'
/// defaults), [`CALLS_PER_CHANNEL`] to a connection. The calls that
/// subscribed, and how many were refused RESOURCE_EXHAUSTED.
async fn open_calls(port: u16, streams: &[String], group: &str) -> Result<(Vec<Call>, usize), Error> {
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut channels = Vec::new();
    for _ in 0..streams.len().div_ceil(CALLS_PER_CHANNEL) {
        channels.push(Channel::from_shared(endpoint.clone())?.connect().await?);
    }
    let mut opening = JoinSet::new();
    for (i, stream) in streams.iter().enumerate() {
        let channel = channels[i / CALLS_PER_CHANNEL].clone();
        let (stream, group) = (stream.clone(), group.to_owned());
        opening.spawn(async move { open_call(channel, stream, group).await });
    }
    let (mut calls, mut refused) = (Vec::new(), 0);
    while let Some(opened) = opening.join_next().await {
        match opened? {
            Ok(call) => calls.push(call),
            Err(status) if status.code() == Code::ResourceExhausted => refused += 1,
            Err(status) => return Err(format!("a subscribe failed: {status}").into()),
        }
    }
    Ok((calls, refused))
}

async fn open_call(channel: Channel, stream: String, group: String) -> Result<Call, tonic::Status> {
    let mut client = ConsumerServiceClient::new(channel);
    let (verdicts, outbound) = mpsc::channel(64);
    let subscribe =
        Subscribe { stream, group, group_start: GroupStart::New as i32, max_batch: 256, ..Subscribe::default() };
    verdicts
        .send(ConsumeRequest { kind: Some(Kind::Subscribe(subscribe)) })
        .await
        .map_err(|_| tonic::Status::internal("the outbound queue closed"))?;
    let mut inbound = client.consume(ReceiverStream::new(outbound)).await?.into_inner();
    match inbound.message().await? {
        Some(response) if matches!(response.kind, Some(Event::Subscribed(_))) => Ok(Call { verdicts, inbound }),
        other => Err(tonic::Status::internal(format!("expected Subscribed, got {other:?}"))),
    }
}

/// A connection of the bench's own, named [`BENCH_CLIENT`].
async fn bench_connection(port: u16) -> Result<MultiplexedConnection, Error> {
    let mut conn = connection(port).await?;
    redis::cmd("CLIENT").arg("SETNAME").arg(BENCH_CLIENT).query_async::<()>(&mut conn).await?;
    Ok(conn)
}

/// Redis' connections less the bench's own (named [`BENCH_CLIENT`]).
async fn sidecar_connections(redis: &mut MultiplexedConnection) -> Result<usize, Error> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(redis).await?;
    Ok(list.lines().filter(|line| !line.contains(&format!(" name={BENCH_CLIENT} "))).count())
}

/// Round trips per second Redis got from clients other than the bench over
/// `window`, from `MONITOR` (whose lines for commands run inside a script
/// say `lua` where the client's address would be).
async fn monitor_round_trips(port: u16, window: Duration) -> Result<(f64, f64), Error> {
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    socket.write_all(format!("CLIENT SETNAME {BENCH_CLIENT}\r\nMONITOR\r\n").as_bytes()).await?;
    let mut lines = BufReader::new(socket).lines();
    let deadline = tokio::time::Instant::now() + window;
    let (mut commands, mut in_scripts) = (0usize, 0usize);
    loop {
        match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Err(_) => break,
            Ok(line) => {
                let Some(line) = line? else { return Err("MONITOR's connection closed".into()) };
                // `+<unix s.µs> [<db> <addr>|lua] "<command>" …`; the replies to SETNAME and MONITOR are `+OK`.
                if line.starts_with('+') && line.contains(" lua]") {
                    in_scripts += 1;
                } else if line.starts_with('+') && line.contains(" [") {
                    commands += 1;
                }
            }
        }
    }
    let seconds = window.as_secs_f64();
    Ok((commands as f64 / seconds, in_scripts as f64 / seconds))
}

/// CPU time of Redis and of the sidecars, in the unit its use says.
#[derive(Clone, Copy, Default)]
struct Cpu {
    redis: f64,
    sidecars: f64,
}

/// Redis' and the sidecars' CPU time so far.
async fn cpu_now(redis: &mut MultiplexedConnection, sidecars: &[&Sidecar]) -> Result<(Duration, Duration), Error> {
    Ok((common::redis_cpu(redis).await?, sidecars.iter().map(|s| s.cpu_time()).sum()))
}

/// CPU used since `before`, each divided by `per`.
async fn cpu_since(
    redis: &mut MultiplexedConnection,
    sidecars: &[&Sidecar],
    before: (Duration, Duration),
    per: f64,
) -> Result<Cpu, Error> {
    let now = cpu_now(redis, sidecars).await?;
    Ok(Cpu {
        redis: (now.0.saturating_sub(before.0)).as_secs_f64() / per,
        sidecars: (now.1.saturating_sub(before.1)).as_secs_f64() / per,
    })
}

/// Latency percentiles, milliseconds, and how many deliveries they cover.
#[derive(Default)]
struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
    delivered: usize,
    appended: usize,
}

/// Appends `rate` entries/s in all, round-robin over `streams`, for
/// `window`, with the calls acking; then waits up to 2 s for the last ones.
async fn measure_latency(
    redis: &mut MultiplexedConnection,
    calls: Vec<Call>,
    streams: &[String],
    rate: f64,
    window: Duration,
) -> Result<Latency, Error> {
    // Every delivery's stream and id (ids of plain XADDs repeat across
    // streams) and its latency (ms), from every call's acking task.
    let (received, mut samples_in) = mpsc::unbounded_channel::<((String, String), f64)>();
    let mut acking = JoinSet::new();
    for mut call in calls {
        let received = received.clone();
        acking.spawn(async move {
            while let Ok(Some(response)) = call.inbound.message().await {
                let deliveries = match response.kind {
                    Some(Event::Delivery(delivery)) => vec![delivery],
                    Some(Event::Batch(batch)) => batch.deliveries,
                    _ => continue,
                };
                let now = unix_micros();
                let mut ids = Vec::with_capacity(deliveries.len());
                for delivery in deliveries {
                    let sent = delivery
                        .payload
                        .get("sent_us")
                        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
                        .unwrap_or(now);
                    let key = (delivery.stream.clone(), delivery.id.clone());
                    let _ = received.send((key, now.saturating_sub(sent) as f64 / 1000.0));
                    ids.push(delivery.id);
                }
                let ack = ConsumeRequest { kind: Some(Kind::Ack(Ack { ids })) };
                if call.verdicts.send(ack).await.is_err() {
                    break;
                }
            }
        });
    }
    drop(received);
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut appended = 0usize;
    while started.elapsed() < window {
        ticks.tick().await;
        let stream = &streams[appended % streams.len()];
        redis::cmd("XADD").arg(stream).arg("*").arg("sent_us").arg(unix_micros()).query_async::<()>(redis).await?;
        appended += 1;
    }
    let (mut seen, mut samples) = (HashSet::new(), Vec::new());
    let drain_deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while seen.len() < appended {
        match tokio::time::timeout_at(drain_deadline, samples_in.recv()).await {
            Ok(Some((id, ms))) => {
                seen.insert(id);
                samples.push(ms);
            }
            Ok(None) | Err(_) => break,
        }
    }
    acking.abort_all();
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples.get(((samples.len() as f64 * q) as usize).min(samples.len().saturating_sub(1)));
    let delivered = seen.len();
    Ok(Latency {
        p50: at(0.50).copied().unwrap_or(f64::NAN),
        p99: at(0.99).copied().unwrap_or(f64::NAN),
        max: samples.last().copied().unwrap_or(f64::NAN),
        delivered,
        appended,
    })
}

/// When `latency` missed deliveries: the groups' pending entries and lag
/// summed over `streams` (`XINFO GROUPS`; lag is Redis 7's, 0 where the
/// server does not say).
async fn groups_backlog(
    redis: &mut MultiplexedConnection,
    streams: &[String],
    group: &str,
    latency: &Latency,
) -> Result<Option<(i64, i64)>, Error> {
    if latency.delivered >= latency.appended {
        return Ok(None);
    }
    let (mut pending, mut lag) = (0, 0);
    for stream in streams {
        let groups: Vec<std::collections::HashMap<String, redis::Value>> =
            redis::cmd("XINFO").arg("GROUPS").arg(stream).query_async(redis).await?;
        for info in groups.iter().filter(|g| g.get("name") == Some(&redis::Value::BulkString(group.into()))) {
            let int = |key: &str| match info.get(key) {
                Some(redis::Value::Int(n)) => *n,
                _ => 0,
            };
            pending += int("pending");
            lag += int("lag");
        }
    }
    Ok(Some((pending, lag)))
}

fn unix_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

fn print_costs(costs: &Costs) {
    let per_sidecar = costs.connections as f64 / costs.sidecars as f64;
    println!(
        "{:<26} refused by default {:>4} | Redis connections {:>5} ({:.1} per sidecar) | idle {:>8.1} commands/s ({:.2} per subscription; {:.2} more run inside scripts) | RSS {:>6.1} MB{} | latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} of {} delivered)",
        costs.label,
        costs.refused_by_default,
        costs.connections,
        per_sidecar,
        costs.idle_commands,
        costs.idle_commands / costs.subscriptions as f64,
        costs.idle_script_commands / costs.subscriptions as f64,
        costs.rss as f64 / 1e6,
        if costs.sidecars > 1 { " per sidecar" } else { "" },
        costs.latency.p50,
        costs.latency.p99,
        costs.latency.max,
        costs.latency.delivered,
        costs.latency.appended,
    );
    println!(
        "{:<26} CPU idle: Redis {:.2} ms/s, sidecar{} {:.2} ms/s | CPU per entry at the trickle, upkeep included: Redis {:.1} µs, sidecar{} {:.1} µs",
        "",
        costs.idle_cpu.redis,
        if costs.sidecars > 1 { "s" } else { "" },
        costs.idle_cpu.sidecars,
        costs.trickle_cpu.redis,
        if costs.sidecars > 1 { "s" } else { "" },
        costs.trickle_cpu.sidecars,
    );
    if let Some((pending, lag)) = costs.undelivered {
        println!(
            "{:<26} not delivered within 2 s of the window's end: {}; the groups have {pending} pending and a lag of {lag}",
            "",
            costs.latency.appended - costs.latency.delivered
        );
    }
}

/// The capacity model (docs/src/capacity.md) predicts a fleet from one
/// sidecar with one subscription: each sidecar costs what that one did.
/// Prints the prediction beside the fleet's measured figures.
fn print_model_check(all: &[Costs]) {
    let (Some(one), Some(fleet)) =
        (all.iter().find(|c| c.sidecars == 1 && c.subscriptions == 1), all.iter().find(|c| c.sidecars > 1))
    else {
        return;
    };
    let k = fleet.sidecars as f64;
    let off = |measured: f64, predicted: f64| {
        if predicted > 0.0 {
            format!("{:+.0}%", (measured / predicted - 1.0) * 100.0)
        } else {
            "-".to_owned()
        }
    };
    println!(
        "capacity model check: {} sidecars predicted from the 1-subscription stage, against the fleet measured",
        fleet.sidecars
    );
    let connections = one.connections as f64 * k;
    println!(
        "  Redis connections  predicted {connections:.0}, measured {} ({})",
        fleet.connections,
        off(fleet.connections as f64, connections)
    );
    let idle = one.idle_commands * k;
    println!(
        "  idle commands/s    predicted {idle:.1}, measured {:.1} ({})",
        fleet.idle_commands,
        off(fleet.idle_commands, idle)
    );
    let redis_idle = one.idle_cpu.redis * k;
    println!(
        "  Redis idle CPU     predicted {redis_idle:.1} ms/s, measured {:.1} ms/s ({}; Redis' own timers are in the one-sidecar figure once, not per sidecar)",
        fleet.idle_cpu.redis,
        off(fleet.idle_cpu.redis, redis_idle)
    );
    println!(
        "  RSS per sidecar    predicted {:.1} MB, measured {:.1} MB ({})",
        one.rss as f64 / 1e6,
        fleet.rss as f64 / 1e6,
        off(fleet.rss as f64, one.rss as f64)
    );
}

fn print_targets(all: &[Costs]) {
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!("targets (issue 27):");
    let refused: usize = all.iter().map(|c| c.refused_by_default).sum();
    println!("  no subscription refused by default: {refused} refused — {}", verdict(refused == 0));
    let worst = all.iter().map(|c| c.connections as f64 / c.sidecars as f64).fold(0.0, f64::max);
    println!(
        "  ≤ {TARGET_CONNECTIONS} Redis connections per sidecar: at most {worst:.1} — {}",
        verdict(worst <= TARGET_CONNECTIONS)
    );
    // What each subscription adds on one sidecar (the slope from the smallest
    // stage to the largest): a sidecar's own upkeep (the readiness check, the
    // scheduled entries' mover) is paid once, whatever it serves.
    let one_sidecar: Vec<&Costs> = all.iter().filter(|c| c.sidecars == 1).collect();
    let smallest = one_sidecar.iter().min_by_key(|c| c.subscriptions);
    let largest = one_sidecar.iter().max_by_key(|c| c.subscriptions);
    if let (Some(small), Some(large)) = (smallest, largest) {
        if large.subscriptions > small.subscriptions {
            let added =
                (large.idle_commands - small.idle_commands) / (large.subscriptions - small.subscriptions) as f64;
            let floor = small.idle_commands - added * small.subscriptions as f64;
            let inside = (large.idle_script_commands - small.idle_script_commands)
                / (large.subscriptions - small.subscriptions) as f64;
            println!(
                "  ≤ {TARGET_IDLE_COMMANDS} idle commands/s per subscription: {added:.2} each from {} to {} subscriptions on one sidecar, \
                 beside {floor:.1}/s per sidecar whatever it serves — {} (round trips; the scripts among them run {inside:.2} more each inside Redis)",
                small.subscriptions,
                large.subscriptions,
                verdict(added <= TARGET_IDLE_COMMANDS)
            );
        }
    }
    if let Some(thousand) = all.iter().find(|c| c.sidecars == 1 && c.subscriptions == 1_000) {
        let mb = thousand.rss as f64 / 1e6;
        println!(
            "  ≤ {TARGET_RSS_AT_1000} MB RSS at 1,000 subscriptions: {mb:.1} MB — {}",
            verdict(mb <= TARGET_RSS_AT_1000)
        );
        println!(
            "  ≤ {TARGET_P99_MS} ms p99 at 1 entry/s across 1,000 streams: {:.2} ms — {}",
            thousand.latency.p99,
            verdict(thousand.latency.p99 <= TARGET_P99_MS)
        );
    }
}
