//! Cluster benchmark: the throughput of one logical stream over 1, 2 and 4
//! shards (`--sharded-streams`), on a local Redis Cluster, in one run.
//!
//! ```text
//! cargo bench --bench cluster                        # or scripts/bench
//! ECHOMQ_BENCH_ENTRIES=200000 cargo bench --bench cluster
//! ```
//!
//! It starts its own 3-primary Redis Cluster (`redis-server` in cluster mode on
//! free loopback ports, no replicas, no persistence, joined by `redis-cli
//! --cluster create`) and one sidecar built by cargo, started with the seed
//! list and `--sharded-streams s1=1,s2=2,s4=4`. Then, for each of s1, s2 and s4:
//!
//! 1. appends N entries (default 50,000; `ECHOMQ_BENCH_ENTRIES`) with
//!    `AppendBatch` (1,000 per call, no partition key: the sidecar takes the
//!    shards in turn, one shard per batch), timed until the last call returns;
//! 2. consumes the logical stream with one Consume call (`max_in_flight` 256,
//!    split evenly over the shards), the client sending one `Ack` message with
//!    one id per delivery as it arrives, timed from the subscribe until
//!    `XPENDING` says 0 on every shard.
//!
//! It prints which primary each shard key lives on, so a reader sees whether
//! the shards landed on distinct nodes.
//!
//! Under `cargo test` (`--bench cluster` or `--all-targets`: no `--bench` argument) it runs as a quick
//! smoke test with small counts against the debug build, and says so; it fails
//! when an entry is missing, delivered twice, or left pending.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use echomq::proto::{
    consume_request::Kind, consume_response::Kind as Event, consumer_service_client::ConsumerServiceClient,
    stream_service_client::StreamServiceClient, Ack, AppendBatchRequest, BatchEntry, ConsumeRequest, GroupStart,
    Subscribe,
};
use redis::{aio::MultiplexedConnection, AsyncConnectionConfig, Value};
use tokio::{io::AsyncReadExt, io::AsyncWriteExt, sync::mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// The logical streams and their shard counts (`--sharded-streams`).
const STREAMS: [(&str, u32); 3] = [("s1", 1), ("s2", 2), ("s4", 4)];
/// Cluster primaries (no replicas).
const PRIMARIES: usize = 3;
/// Entries per logical stream unless `ECHOMQ_BENCH_ENTRIES` says otherwise.
const DEFAULT_ENTRIES: usize = 50_000;
/// Entries per logical stream in the smoke run under `cargo test`.
const SMOKE_ENTRIES: usize = 2_000;
/// Entries per AppendBatch call; the smoke run's, so every shard gets batches.
const APPEND_BATCH: usize = 1_000;
const SMOKE_APPEND_BATCH: usize = 250;
/// The Consume call's `max_in_flight` (the sidecar splits it over the shards).
const WINDOW: usize = 256;
/// Bytes of the `body` field of every entry.
const BODY_BYTES: usize = 100;
/// No phase may take longer than this.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the acks of the last deliveries may take to reach Redis.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long processes (and the cluster) may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The highest node port whose cluster bus port (port + 10000) fits in 16 bits.
const MAX_NODE_PORT: u16 = 55535;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    let full = std::env::args().any(|arg| arg == "--bench");
    let entries = match std::env::var("ECHOMQ_BENCH_ENTRIES") {
        Ok(text) => match text.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("cluster bench: ECHOMQ_BENCH_ENTRIES must be a positive integer, got `{text}`");
                return ExitCode::from(2);
            }
        },
        Err(_) if full => DEFAULT_ENTRIES,
        Err(_) => SMOKE_ENTRIES,
    };
    let batch = if full { APPEND_BATCH } else { SMOKE_APPEND_BATCH };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cluster bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(full, entries, batch)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cluster bench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(full: bool, entries: usize, batch: usize) -> Result<(), Error> {
    let sidecar_bin = PathBuf::from(env!("CARGO_BIN_EXE_echomq-sidecar"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("echomq-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cluster = RedisCluster::start(&dir, PRIMARIES).await?;
    let mut conns = BTreeMap::new();
    for &port in &cluster.ports {
        conns.insert(port, connection(port).await?);
    }
    let first = cluster.ports[0];
    let mut seed = conns[&first].clone();
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut seed).await?;
    let version = info.lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("?").trim().to_owned();
    let slots = slot_map(&mut seed).await?;
    // Shards land on slots by hash: pick, per shard count, the first name whose
    // shards spread over as many primaries as they can, so the figures measure
    // spreading rather than the luck of a name.
    let mut streams_used = Vec::new();
    for (base, shards) in STREAMS {
        let wanted = (shards as usize).min(PRIMARIES);
        let mut chosen = None;
        for i in 0..1000 {
            let name = if i == 0 { base.to_owned() } else { format!("{base}-{i}") };
            let mut ports = HashSet::new();
            for k in 0..shards {
                let key = echomq::keys::shard_key(&name, k);
                let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(&key).query_async(&mut seed).await?;
                ports.insert(slots.iter().find(|(s, e, _)| *s <= slot && slot <= *e).map(|r| r.2));
            }
            if ports.len() == wanted {
                chosen = Some(name);
                break;
            }
        }
        streams_used.push((chosen.ok_or("no stream name spreads its shards")?, shards));
    }
    let sharded = streams_used.iter().map(|(name, n)| format!("{name}={n}")).collect::<Vec<_>>().join(",");
    let sidecar = Sidecar::start(&sidecar_bin, &cluster.seed_urls(), &["--sharded-streams", &sharded], &dir).await?;
    let endpoint = format!("http://127.0.0.1:{}", sidecar.grpc_port);
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let load =
        std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split_whitespace().next().map(str::to_owned));

    println!(
        "EchoMQ cluster benchmark{}",
        if full {
            ""
        } else {
            " (smoke run under `cargo test`: small counts, debug build; the figures mean nothing, run `cargo bench --bench cluster`)"
        }
    );
    println!(
        "  machine  {cpus} CPUs, load average {} at start; Redis {version} Cluster, {PRIMARIES} primaries, no replicas, loopback, no persistence",
        load.as_deref().unwrap_or("?")
    );
    let ranges: Vec<String> = slots.iter().map(|(start, end, port)| format!(":{port} slots {start}-{end}")).collect();
    println!("  cluster  {}", ranges.join(", "));
    println!("  sidecar  {} --sharded-streams {sharded}", sidecar_bin.display());
    println!("  entries  {entries} per logical stream, fields `n` and a {BODY_BYTES}-byte `body`");
    println!("  caveat   {cpus} CPUs shared by the sidecar, this client and {PRIMARIES} redis-server processes: the figures show overhead more than scaling");
    println!();

    // Where each shard key lives.
    let mut placement: Vec<Vec<(String, u16, u16)>> = Vec::new();
    println!("placement   shard key, hash slot, primary");
    for (name, shards) in &streams_used {
        let (name, shards) = (name.as_str(), *shards);
        let mut keys = Vec::new();
        for k in 0..shards {
            let key = echomq::keys::shard_key(name, k);
            let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(&key).query_async(&mut seed).await?;
            let port = slots.iter().find(|(s, e, _)| *s <= slot && slot <= *e).map(|r| r.2).ok_or("slot not served")?;
            keys.push((key, slot, port));
        }
        let distinct = keys.iter().map(|k| k.2).collect::<HashSet<_>>().len();
        let shown: Vec<String> = keys.iter().map(|(key, slot, port)| format!("{key} {slot} :{port}")).collect();
        println!(
            "  {name}  {}  ({distinct} distinct primar{})",
            shown.join(", "),
            if distinct == 1 { "y" } else { "ies" }
        );
        placement.push(keys);
    }
    println!();

    let mut results = Vec::new();
    let mut streams = StreamServiceClient::connect(endpoint.clone()).await?;
    for ((name, shards), keys) in streams_used.iter().zip(&placement) {
        let appended = phase("append", append(&mut streams, name, entries, batch)).await?;
        let mut shard_conns = Vec::new();
        for (key, _, port) in keys {
            shard_conns.push((key.clone(), conns[port].clone()));
        }
        let (consumed, per_shard) = phase("consume", consume(&endpoint, name, &mut shard_conns, entries)).await?;
        results.push((*shards, appended, consumed, per_shard));
    }

    let base_append = rate(entries, results[0].1);
    let base_consume = rate(entries, results[0].2);
    println!(
        "append      AppendBatch ({batch} per call, no partition key: shards in turn), until the last call returns"
    );
    for (shards, took, _, _) in &results {
        let r = rate(entries, *took);
        println!(
            "  shards {shards}: {:>9} entries/s ({:.2}×)   {entries} in {:.3} s",
            thousands(r),
            r / base_append,
            took.as_secs_f64()
        );
    }
    println!(
        "consume     one Consume call on the logical stream, max_in_flight {WINDOW} split over the shards, one Ack message (one id) per delivery; from subscribe until XPENDING is 0 on every shard"
    );
    for (shards, _, took, per_shard) in &results {
        let r = rate(entries, *took);
        let split: Vec<String> = per_shard.iter().map(|n| n.to_string()).collect();
        println!(
            "  shards {shards}: {:>9} entries/s ({:.2}×)   {entries} in {:.3} s, per shard {}",
            thousands(r),
            r / base_consume,
            took.as_secs_f64(),
            split.join(" + ")
        );
    }

    drop(sidecar);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Appends `entries` to the logical stream `name`, `batch` per AppendBatch call.
async fn append(
    streams: &mut StreamServiceClient<tonic::transport::Channel>,
    name: &str,
    entries: usize,
    batch: usize,
) -> Result<Duration, Error> {
    let body = vec![b'x'; BODY_BYTES];
    let started = Instant::now();
    for first in (0..entries).step_by(batch) {
        let entries = (first..(first + batch).min(entries))
            .map(|n| BatchEntry {
                fields: HashMap::from([
                    ("n".to_owned(), n.to_string().into_bytes()),
                    ("body".to_owned(), body.clone()),
                ]),
            })
            .collect();
        streams.append_batch(AppendBatchRequest { stream: name.to_owned(), entries, ..Default::default() }).await?;
    }
    Ok(started.elapsed())
}

/// One Consume call on the logical stream, acking each delivery as it arrives,
/// until every shard's XPENDING is 0. The time, and the deliveries per shard
/// (which must match each shard's XLEN).
async fn consume(
    endpoint: &str,
    stream: &str,
    shards: &mut [(String, MultiplexedConnection)],
    entries: usize,
) -> Result<(Duration, Vec<usize>), Error> {
    let group = "bench";
    let mut client = ConsumerServiceClient::connect(endpoint.to_owned()).await?;
    let (verdicts, outbound) = mpsc::channel(4 * WINDOW);
    verdicts.send(subscribe(stream, group)).await?;
    let started = Instant::now();
    let mut inbound = client.consume(ReceiverStream::new(outbound)).await?.into_inner();
    let mut seen = HashSet::with_capacity(entries);
    let mut per_shard: HashMap<String, usize> = HashMap::new();
    while seen.len() < entries {
        let message = inbound.message().await?.ok_or("the sidecar ended the call early")?;
        match message.kind {
            Some(Event::Delivery(delivery)) => {
                if !delivery.payload.contains_key("n") {
                    return Err(format!("delivery {} has no field `n`", delivery.id).into());
                }
                if !seen.insert(delivery.id.clone()) {
                    return Err(format!("entry {} was delivered twice", delivery.id).into());
                }
                *per_shard.entry(delivery.stream).or_default() += 1;
                verdicts.send(ack(delivery.id)).await?;
            }
            Some(Event::VerdictError(e)) => return Err(format!("verdict error: {e:?}").into()),
            Some(Event::Subscribed(_)) | None => {}
        }
    }
    // Acks are applied by the sidecar in batches: done when every shard agrees.
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    for (key, conn) in shards.iter_mut() {
        loop {
            let left = pending(conn, key, group).await?;
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                return Err(
                    format!("{key}: {left} entries still pending {SETTLE_TIMEOUT:?} after the last delivery").into()
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let took = started.elapsed();
    drop(verdicts);
    while let Some(message) = inbound.message().await? {
        if let Some(Event::Delivery(delivery)) = message.kind {
            return Err(format!("entry {} was delivered after all {entries} were", delivery.id).into());
        }
    }
    // Nothing left behind: every shard delivered all it holds, none pending.
    let mut counts = Vec::new();
    for (key, conn) in shards.iter_mut() {
        let len: usize = redis::cmd("XLEN").arg(&*key).query_async(conn).await?;
        let delivered = per_shard.remove(key.as_str()).unwrap_or(0);
        let left = pending(conn, key, group).await?;
        if len != delivered || left != 0 {
            return Err(format!("{key}: XLEN {len}, {delivered} delivered, {left} pending").into());
        }
        counts.push(delivered);
    }
    if !per_shard.is_empty() {
        return Err(format!("deliveries from unexpected streams: {per_shard:?}").into());
    }
    Ok((took, counts))
}

/// Runs one phase under [`PHASE_TIMEOUT`].
async fn phase<T>(name: &str, work: impl std::future::Future<Output = Result<T, Error>>) -> Result<T, Error> {
    tokio::time::timeout(PHASE_TIMEOUT, work).await.map_err(|_| format!("{name}: not done within {PHASE_TIMEOUT:?}"))?
}

fn rate(entries: usize, took: Duration) -> f64 {
    entries as f64 / took.as_secs_f64()
}

/// `12345.6` as `12,346`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn subscribe(stream: &str, group: &str) -> ConsumeRequest {
    ConsumeRequest {
        kind: Some(Kind::Subscribe(Subscribe {
            stream: stream.to_owned(),
            group: group.to_owned(),
            group_start: GroupStart::Beginning as i32,
            max_in_flight: WINDOW as u32,
            ..Subscribe::default()
        })),
    }
}

fn ack(id: String) -> ConsumeRequest {
    ConsumeRequest { kind: Some(Kind::Ack(Ack { ids: vec![id] })) }
}

/// The group's pending count (`XPENDING <stream> <group>`, summary form).
async fn pending(redis: &mut MultiplexedConnection, stream: &str, group: &str) -> Result<i64, Error> {
    let reply: Value = redis::cmd("XPENDING").arg(stream).arg(group).query_async(redis).await?;
    match reply {
        Value::Array(parts) => match parts.first() {
            Some(Value::Int(n)) => Ok(*n),
            other => Err(format!("unexpected XPENDING reply: {other:?}").into()),
        },
        other => Err(format!("unexpected XPENDING reply: {other:?}").into()),
    }
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// A loopback port that was free a moment ago.
fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A free port whose cluster bus port (port + 10000) exists and is free too.
fn node_port() -> Result<u16, Error> {
    loop {
        let port = free_port()?;
        if port <= MAX_NODE_PORT && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return Ok(port);
        }
    }
}

/// A connection to one node, no response timeout, not following MOVED (each
/// key is asked of the primary serving it).
async fn connection(port: u16) -> Result<MultiplexedConnection, Error> {
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    Ok(client.get_multiplexed_async_connection_with_config(&config).await?)
}

/// `CLUSTER SLOTS` as `(start, end, primary port)`, in slot order.
async fn slot_map(conn: &mut MultiplexedConnection) -> Result<Vec<(u16, u16, u16)>, Error> {
    let reply: Vec<Vec<Value>> = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
    let mut ranges = Vec::new();
    for range in reply {
        // [start, end, [ip, port, id, …] of the primary, replicas…]
        let (start, end, primary): (u16, u16, Vec<Value>) =
            redis::from_redis_value(Value::Array(range.into_iter().take(3).collect()))?;
        let port: u16 = redis::from_redis_value(primary.into_iter().nth(1).ok_or("CLUSTER SLOTS without a port")?)?;
        ranges.push((start, end, port));
    }
    ranges.sort_unstable();
    Ok(ranges)
}

/// A child process, SIGKILLed and reaped on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A throwaway Redis Cluster: `primaries` cluster-mode `redis-server`s on
/// loopback (no persistence, no replicas), killed on drop.
struct RedisCluster {
    ports: Vec<u16>,
    _nodes: Vec<Process>,
}

impl RedisCluster {
    async fn start(dir: &Path, primaries: usize) -> Result<RedisCluster, Error> {
        let (mut ports, mut nodes) = (Vec::new(), Vec::new());
        for i in 0..primaries {
            // A port taken between the check and the start: try another one.
            let mut attempt = 0;
            let (port, node) = loop {
                attempt += 1;
                let node_dir = dir.join(format!("node{i}-{attempt}"));
                std::fs::create_dir_all(&node_dir)?;
                match start_node(&node_dir).await {
                    Ok(started) => break started,
                    Err(e) if attempt >= 3 => return Err(e),
                    Err(_) => {}
                }
            };
            ports.push(port);
            nodes.push(node);
        }
        let cluster = RedisCluster { ports, _nodes: nodes };
        let mut args = vec!["--cluster".to_owned(), "create".to_owned()];
        args.extend(cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(str::to_owned));
        let create =
            tokio::task::spawn_blocking(move || Command::new("redis-cli").args(&args).stdin(Stdio::null()).output());
        let output = tokio::time::timeout(START_TIMEOUT, create)
            .await
            .map_err(|_| "redis-cli --cluster create ran too long")???;
        if !output.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
            .into());
        }
        // Ready once every node says cluster_state:ok and all map the slots alike.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match cluster.agreed().await {
                Ok(()) => return Ok(cluster),
                Err(e) if Instant::now() > deadline => return Err(format!("the cluster did not come up: {e}").into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn agreed(&self) -> Result<(), Error> {
        let mut first = None;
        for &port in &self.ports {
            let mut conn = connection(port).await?;
            let info: String = redis::cmd("CLUSTER").arg("INFO").query_async(&mut conn).await?;
            if !info.lines().any(|l| l.trim_end() == "cluster_state:ok") {
                return Err(format!(":{port} is not cluster_state:ok").into());
            }
            let slots = slot_map(&mut conn).await?;
            if slots.iter().map(|(s, e, _)| u32::from(*e) - u32::from(*s) + 1).sum::<u32>() != 16384 {
                return Err(format!(":{port} does not map every slot").into());
            }
            match &first {
                None => first = Some(slots),
                Some(agreed) if *agreed != slots => return Err(format!(":{port} maps the slots differently").into()),
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Every node's URL, comma-separated: the sidecar's `--redis-url`.
    fn seed_urls(&self) -> String {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }
}

/// One cluster-mode `redis-server` in `dir`, once it answers PING.
async fn start_node(dir: &Path) -> Result<(u16, Process), Error> {
    let port = node_port()?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
        .args(["--repl-diskless-sync-delay", "0"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start redis-server ({e}); install it (Debian: apt-get install redis-server)"))?;
    let mut node = Process(child);
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(mut conn) = connection(port).await {
            if redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok() {
                return Ok((port, node));
            }
        }
        if node.0.try_wait()?.is_some() || Instant::now() > deadline {
            return Err(format!("redis-server on port {port} did not answer PING").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The sidecar binary on free loopback ports, logging to `sidecar.log`.
struct Sidecar {
    grpc_port: u16,
    _process: Process,
}

impl Sidecar {
    async fn start(bin: &Path, redis_url: &str, args: &[&str], dir: &Path) -> Result<Sidecar, Error> {
        let (grpc_port, admin_port) = (free_port()?, free_port()?);
        let log = std::fs::File::create(dir.join("sidecar.log"))?;
        let mut command = Command::new(bin);
        for (key, _) in std::env::vars() {
            if key.starts_with("ECHOMQ_") {
                command.env_remove(key);
            }
        }
        let child = command
            .arg("--redis-url")
            .arg(redis_url)
            .arg("--listen")
            .arg(format!("127.0.0.1:{grpc_port}"))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{admin_port}"))
            .args(["--consumer-name", "bench"])
            .args(args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let sidecar = Sidecar { grpc_port, _process: Process(child) };
        let deadline = Instant::now() + START_TIMEOUT;
        while http_status(admin_port, "/readyz").await != Some(200) {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("sidecar.log")).unwrap_or_default();
                return Err(format!("the sidecar did not become ready; its log:\n{log}").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(sidecar)
    }
}

/// The status code of `GET <path>` on a loopback port (plain HTTP/1.0).
async fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await.ok()?;
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut reply)).await.ok()?.ok()?;
    String::from_utf8_lossy(&reply).split_whitespace().nth(1)?.parse().ok()
}
