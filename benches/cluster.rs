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

mod common;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    process::{Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use common::process::START_TIMEOUT;
use common::redis_server::{RedisOptions, RedisServer};
use common::{
    append, connection, pending, phase, rate, thousands, ConsumeCall, Error, Sidecar, APPEND_BATCH, BODY_BYTES, WINDOW,
};
use echomq::proto::{consume_response::Kind as Event, stream_service_client::StreamServiceClient, GroupStart};
use redis::{aio::MultiplexedConnection, Value};

/// The logical streams and their shard counts (`--sharded-streams`).
const STREAMS: [(&str, u32); 3] = [("s1", 1), ("s2", 2), ("s4", 4)];
/// Cluster primaries (no replicas).
const PRIMARIES: usize = 3;
/// The smoke run's entries per AppendBatch call (the full run's is
/// [`APPEND_BATCH`]), so every shard gets batches.
const SMOKE_APPEND_BATCH: usize = 250;
/// How long the acks of the last deliveries may take to reach Redis.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    common::main("cluster", |full, entries| {
        let batch = if full { APPEND_BATCH } else { SMOKE_APPEND_BATCH };
        run(full, entries, batch)
    })
}

async fn run(full: bool, entries: usize, batch: usize) -> Result<(), Error> {
    let sidecar_bin = common::sidecar_bin();
    let dir = common::work_dir("echomq-bench-cluster")?;
    let cluster = RedisCluster::start(PRIMARIES).await?;
    let mut conns = BTreeMap::new();
    for &port in &cluster.ports {
        conns.insert(port, connection(port).await?);
    }
    let first = cluster.ports[0];
    let mut seed = conns[&first].clone();
    let version = common::redis_version(&mut seed).await?;
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
    let (cpus, load) = (common::cpus(), common::load_average());

    common::print_title("cluster", full);
    println!(
        "  machine  {cpus} CPUs, load average {load} at start; Redis {version} Cluster, {PRIMARIES} primaries, no replicas, loopback, no persistence"
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
    let mut call = ConsumeCall::open(endpoint, stream, group, GroupStart::Beginning).await?;
    let mut per_shard: HashMap<String, usize> = HashMap::new();
    // Kept to the end, so that freeing the ids is not timed.
    let _seen = call.ack_each(entries, |shard| *per_shard.entry(shard).or_default() += 1).await?;
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
    let took = call.started.elapsed();
    drop(call.verdicts);
    while let Some(message) = call.inbound.message().await? {
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

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

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

/// A throwaway Redis Cluster: `primaries` cluster-mode `redis-server`s on
/// loopback (no persistence, no replicas, Redis' default node timeout), killed
/// on drop.
struct RedisCluster {
    ports: Vec<u16>,
    _nodes: Vec<RedisServer>,
}

impl RedisCluster {
    async fn start(primaries: usize) -> Result<RedisCluster, Error> {
        let (mut ports, mut nodes) = (Vec::new(), Vec::new());
        for _ in 0..primaries {
            let node = RedisServer::try_start_with(RedisOptions::cluster_node(&[])).await?;
            ports.push(node.port());
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
