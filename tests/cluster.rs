//! Redis Cluster: the local cluster fixture itself (`support::cluster`), then
//! the sidecar on a real local cluster: plain streams unchanged, sharded
//! streams, and consumption through a failover and a killed primary with the
//! chaos suite's nothing-lost ledger.

// Tests fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use echomq::proto::{
    consume_request::Kind, AppendBatchRequest, AppendRequest, BatchEntry, DescribeGroupRequest, DestroyGroupRequest,
    Drain, GroupStart, ListDeadLettersRequest, ReadRequest, TrimRequest,
};
use redis::cluster_async::ClusterConnection;
use support::cluster::{key_slot, RedisCluster, Role};
use support::{assert_code, req, subscribe_msg, unique, Consumer, Event, Sidecar, SidecarOptions, TempDir};
use tonic::Code;

async fn xadd(con: &mut ClusterConnection, key: &str, n: usize) {
    for i in 0..n {
        let _: String = redis::cmd("XADD").arg(key).arg("*").arg("n").arg(i).query_async(con).await.expect("XADD");
    }
}

async fn xlen(con: &mut ClusterConnection, key: &str) -> i64 {
    redis::cmd("XLEN").arg(key).query_async(con).await.unwrap_or_else(|e| panic!("XLEN {key}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_fixture_serves_keys_on_every_primary_and_fails_over() {
    let t0 = Instant::now();
    let mut cluster = RedisCluster::start(3, 1).await;
    eprintln!("cluster of 3x1 up in {:?}: {}", t0.elapsed(), cluster.seed_urls());
    let topology = cluster.topology().await;
    assert_eq!(topology.primaries().len(), 3, "{topology:?}");
    assert_eq!(topology.roles.len(), 6, "{topology:?}");

    // A key on every primary, written and read back through one cluster connection.
    let keys = cluster.key_per_primary("orders").await;
    let mut owners = Vec::new();
    for key in &keys {
        owners.push(cluster.primary_of(key).await);
    }
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners.len(), 3, "the keys {keys:?} must land on 3 different primaries");
    let mut con = cluster.conn().await;
    for key in &keys {
        xadd(&mut con, key, 3).await;
    }
    for key in &keys {
        assert_eq!(xlen(&mut con, key).await, 3, "{key}");
        let entries: redis::Value =
            redis::cmd("XRANGE").arg(key).arg("-").arg("+").query_async(&mut con).await.unwrap();
        assert!(matches!(&entries, redis::Value::Array(a) if a.len() == 3), "XRANGE {key}: {entries:?}");
    }

    // Graceful failover: the old primary becomes the new one's replica; the same
    // connection follows MOVED to the new primary, for reads and writes.
    let old = cluster.primary_of(&keys[0]).await;
    let t = Instant::now();
    let new = cluster.failover(&keys[0]).await;
    eprintln!("failover :{old} -> :{new} took {:?}", t.elapsed());
    assert_ne!(new, old);
    assert_eq!(cluster.primary_of(&keys[0]).await, new);
    assert_eq!(cluster.replicas_of(new).await, vec![old]);
    assert_eq!(cluster.topology().await.roles[&old], Role::Replica { of: new, link_up: true });
    let t = Instant::now();
    assert_eq!(xlen(&mut con, &keys[0]).await, 3, "{} after the failover", keys[0]);
    xadd(&mut con, &keys[0], 1).await;
    assert_eq!(xlen(&mut con, &keys[0]).await, 4);
    eprintln!("reads and a write after the failover took {:?}", t.elapsed());

    // A primary killed: its replica is promoted and the data is still there.
    let t = Instant::now();
    let killed = cluster.kill_primary(&keys[1]).await;
    eprintln!("kill of :{killed} healed in {:?}", t.elapsed());
    let promoted = cluster.primary_of(&keys[1]).await;
    assert_ne!(promoted, killed);
    assert!(!cluster.live_ports().contains(&killed));
    let t = Instant::now();
    assert_eq!(xlen(&mut con, &keys[1]).await, 3, "{} after its primary was killed (old connection)", keys[1]);
    eprintln!("the old connection read after the kill in {:?}", t.elapsed());
    let mut fresh = cluster.conn().await;
    for (key, len) in keys.iter().zip([4, 3, 3]) {
        assert_eq!(xlen(&mut fresh, key).await, len, "{key} through a new connection");
    }

    // The killed node comes back as a replica of the promoted one (its nodes.conf).
    let t = Instant::now();
    cluster.restart(killed).await;
    eprintln!("restart of :{killed} rejoined in {:?}", t.elapsed());
    assert_eq!(cluster.topology().await.roles[&killed], Role::Replica { of: promoted, link_up: true });
    assert_eq!(xlen(&mut con, &keys[1]).await, 3);
    eprintln!("whole test: {:?}", t0.elapsed());
}

fn fields(pairs: &[(&str, &str)]) -> HashMap<String, Vec<u8>> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec())).collect()
}

async fn pending(con: &mut ClusterConnection, stream: &str, group: &str) -> i64 {
    let summary: redis::Value = redis::cmd("XPENDING").arg(stream).arg(group).query_async(con).await.unwrap();
    match summary {
        redis::Value::Array(parts) => match parts.first() {
            Some(redis::Value::Int(n)) => *n,
            other => panic!("XPENDING {stream}: {other:?}"),
        },
        other => panic!("XPENDING {stream}: {other:?}"),
    }
}

/// The sidecar, given one node's URL, finds the cluster by itself and serves a
/// plain stream as on a single server: append, consume, ack, a dead letter in
/// `{<stream>}:dlq` (the stream's slot), describe, read and trim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_stream_works_unchanged_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0).await;
    let sidecar = Sidecar::start_with_url(&cluster.seed_url(), SidecarOptions::default()).await;
    assert!(sidecar.log().contains("connected to a Redis Cluster"), "{}", sidecar.log());
    let stream = unique("orders");
    let mut streams = sidecar.stream_client().await;
    let mut appended = Vec::new();
    for i in 0..6 {
        let request =
            AppendRequest { stream: stream.clone(), fields: fields(&[("n", &i.to_string())]), ..Default::default() };
        let written = streams.append(request).await.unwrap().into_inner();
        assert_eq!(written.stream, stream);
        appended.push(written.id);
    }

    let mut consumer = Consumer::start(&sidecar, &stream, "g", GroupStart::Beginning, 16).await;
    let deliveries = consumer.deliveries(6, Duration::from_secs(10)).await;
    assert_eq!(support::ids(&deliveries), appended, "in stream order");
    for d in &deliveries[..5] {
        consumer.ack_one(&d.id).await;
    }
    consumer.dead_letter(&deliveries[5].id, "poison").await;

    let con = cluster.conn().await;
    let dlq = format!("{{{stream}}}:dlq");
    assert_eq!(key_slot(&dlq), key_slot(&stream));
    assert!(
        support::eventually(Duration::from_secs(10), || {
            let mut con = con.clone();
            let (stream, dlq) = (stream.clone(), dlq.clone());
            async move {
                let dead: i64 = redis::cmd("XLEN").arg(&dlq).query_async(&mut con).await.unwrap_or(0);
                dead == 1 && pending(&mut con, &stream, "g").await == 0
            }
        })
        .await,
        "the dead letter must land in {dlq} and nothing stay pending"
    );
    let listed = sidecar
        .admin_client()
        .await
        .list_dead_letters(ListDeadLettersRequest { stream: stream.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.dead_letters.len(), 1);
    assert_eq!(listed.dead_letters[0].entry.as_ref().unwrap().id, appended[5], "the branded id is kept");

    let described = sidecar
        .admin_client()
        .await
        .describe_group(DescribeGroupRequest { stream: stream.clone(), group: "g".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((described.pending, described.stream_length), (0, 6));
    assert!(described.shards.is_empty(), "a plain stream has no shards");

    let read = streams.read(ReadRequest { stream: stream.clone(), ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(read.entries.len(), 6);
    let trimmed = streams
        .trim(TrimRequest { stream: stream.clone(), max_len: 2, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(trimmed.trimmed, 4, "everything is acknowledged, so a safe trim may remove it");

    // A dead-letter stream on another slot is refused up front, not left to CROSSSLOT.
    let mut sub = subscribe_msg(&stream, "other", GroupStart::New);
    sub.dead_letter_stream = format!("{stream}-dead");
    assert_ne!(key_slot(&sub.dead_letter_stream), key_slot(&stream));
    let refused = Consumer::try_subscribe(&sidecar, sub).await.err().expect("a cross-slot dead-letter stream");
    assert_code(&refused, Code::InvalidArgument);
    assert!(refused.message().contains("slot"), "{}", refused.message());

    // A name no group could consume on a cluster is refused at Append: nothing is written.
    let odd = format!("{stream}{{}}x");
    let request = AppendRequest { stream: odd.clone(), fields: fields(&[("n", "1")]), ..Default::default() };
    let refused = streams.append(request).await.expect_err("a name with braces but no usable hash tag");
    assert_code(&refused, Code::InvalidArgument);
    assert!(refused.message().contains("hash tag"), "{}", refused.message());
    let exists: i64 = redis::cmd("EXISTS").arg(&odd).query_async(&mut con.clone()).await.unwrap();
    assert_eq!(exists, 0, "a refused append writes nothing");
}

/// Per-key limits on a cluster: the keyed entries live in
/// `{<stream>}:keys:<group>`, the stream's slot, so the read and gate
/// scripts run; a key's entries come one at a time, in order, and the set
/// ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_limits_keep_their_state_in_the_streams_slot_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0).await;
    let sidecar = Sidecar::start_with_url(&cluster.seed_url(), SidecarOptions::default()).await;
    let stream = unique("orders");
    let entries: Vec<BatchEntry> = (0..3)
        .flat_map(|n| {
            ["a", "b"]
                .map(|key| BatchEntry { fields: fields(&[("acct", key), ("n", &n.to_string())]), ..Default::default() })
        })
        .collect();
    let request = AppendBatchRequest { stream: stream.clone(), entries, ..Default::default() };
    sidecar.stream_client().await.append_batch(request).await.unwrap();
    let sub = echomq::proto::Subscribe {
        key_field: "acct".into(),
        max_in_flight_per_key: 1,
        max_in_flight: 16,
        ..subscribe_msg(&stream, "g", GroupStart::Beginning)
    };
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;

    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for _ in 0..3 {
        // Both keys' next entry, and no more: each key is at its limit.
        let pair = consumer.deliveries(2, Duration::from_secs(10)).await;
        consumer.assert_quiet(Duration::from_millis(300), "each key holds one entry").await;
        for d in &pair {
            let key = String::from_utf8(d.payload["acct"].to_vec()).unwrap();
            seen.entry(key).or_default().push(String::from_utf8(d.payload["n"].to_vec()).unwrap());
            consumer.ack_one(&d.id).await;
        }
    }
    assert_eq!(seen["a"], ["0", "1", "2"]);
    assert_eq!(seen["b"], ["0", "1", "2"]);
    let zset = format!("{{{stream}}}:keys:g");
    assert_eq!(key_slot(&zset), key_slot(&stream));
    let con = cluster.conn().await;
    let emptied = support::eventually(Duration::from_secs(10), || {
        let (mut con, zset) = (con.clone(), zset.clone());
        async move { redis::cmd("ZCARD").arg(&zset).query_async::<i64>(&mut con).await.unwrap() == 0 }
    })
    .await;
    assert!(emptied, "the acks removed every keyed entry from {zset}");
}

/// A sharded stream: one partition key always lands on one shard, shards are
/// spread over the cluster, branded ids stay unique across shards, and one call
/// on the logical name consumes every shard, each key's entries in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_stream_spreads_by_partition_key_and_one_call_consumes_every_shard() {
    let cluster = RedisCluster::start(3, 0).await;
    let stream = unique("sharded");
    let options = SidecarOptions::default().arg("--sharded-streams").arg(&format!("{stream}=4"));
    let sidecar = Sidecar::start_with_url(&cluster.seed_urls(), options).await;
    let mut streams = sidecar.stream_client().await;

    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut shard_of_key: BTreeMap<String, String> = BTreeMap::new();
    for round in 0..5 {
        for key in 0..8 {
            let partition_key = format!("customer-{key}");
            let request = AppendRequest {
                stream: stream.clone(),
                fields: fields(&[("round", &round.to_string())]),
                partition_key: partition_key.clone(),
                ..Default::default()
            };
            let written = streams.append(request).await.unwrap().into_inner();
            let shard = shard_of_key.entry(partition_key.clone()).or_insert_with(|| written.stream.clone());
            assert_eq!(*shard, written.stream, "one partition key, one shard");
            by_key.entry(partition_key).or_default().push(written.id);
        }
    }
    // A batch without a partition key goes to one shard, round-robin.
    let batch = AppendBatchRequest {
        stream: stream.clone(),
        entries: (0..3)
            .map(|i| BatchEntry { fields: fields(&[("batch", &i.to_string())]), ..Default::default() })
            .collect(),
        ..Default::default()
    };
    let batch = streams.append_batch(batch).await.unwrap().into_inner().entries;
    assert!(batch.iter().all(|e| e.stream == batch[0].stream));

    let shards: HashSet<&String> = shard_of_key.values().collect();
    assert!(shards.len() >= 2, "8 keys over 4 shards use more than one: {shard_of_key:?}");
    for shard in &shards {
        assert!(shard.starts_with(&format!("{stream}:{{{stream}:")), "{shard}");
    }
    let mut all: Vec<String> = by_key.values().flatten().cloned().chain(batch.iter().map(|e| e.id.clone())).collect();
    let count = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), count, "branded ids are unique across shards");

    // max_in_flight 2 on 4 shards is raised to one per shard.
    let mut consumer = Consumer::start(&sidecar, &stream, "g", GroupStart::Beginning, 2).await;
    assert_eq!(consumer.subscribed.as_ref().unwrap().max_in_flight, 4);
    let mut seen: Vec<(String, String)> = Vec::new();
    while seen.len() < count {
        match consumer.next_event(Duration::from_secs(10)).await {
            Event::Delivery(d) => {
                assert!(shards.contains(&d.stream) || d.stream == batch[0].stream, "{}", d.stream);
                consumer.ack_one(&d.id).await;
                seen.push((d.stream, d.id));
            }
            other => panic!("after {} deliveries: {other:?}", seen.len()),
        }
    }
    let ids: Vec<&String> = seen.iter().map(|(_, id)| id).collect();
    for (key, appended) in &by_key {
        let delivered: Vec<&String> = ids.iter().copied().filter(|id| appended.contains(id)).collect();
        assert_eq!(delivered, appended.iter().collect::<Vec<_>>(), "{key}: its entries in append order");
    }
    consumer.assert_quiet(Duration::from_millis(500), "everything was delivered once").await;

    let mut admin = sidecar.admin_client().await;
    let describe = || DescribeGroupRequest { stream: stream.clone(), group: "g".into() };
    assert!(
        support::eventually(Duration::from_secs(10), || {
            let mut admin = admin.clone();
            let request = describe();
            async move { admin.describe_group(request).await.map(|r| r.into_inner().pending == 0).unwrap_or(false) }
        })
        .await
    );
    let described = admin.describe_group(describe()).await.unwrap().into_inner();
    assert_eq!(described.shards.len(), 4);
    assert_eq!(described.stream_length, count as u64);
    assert_eq!(described.shards.iter().map(|s| s.stream_length).sum::<u64>(), count as u64);
    assert!(described.consumers.iter().any(|c| c.name == sidecar.consumer_name()));

    // Calls that work on one key name a shard; the logical name is refused clearly.
    let refused = streams.read(ReadRequest { stream: stream.clone(), ..Default::default() }).await.unwrap_err();
    assert_code(&refused, Code::InvalidArgument);
    assert!(refused.message().contains("sharded"), "{}", refused.message());
    let shard = shards.iter().next().unwrap();
    let read = streams.read(ReadRequest { stream: (*shard).clone(), ..Default::default() }).await.unwrap();
    assert!(!read.into_inner().entries.is_empty());
}

/// Consumption through a graceful failover and a killed primary: every entry
/// appended (and replicated) is acknowledged in the end, nothing stays pending,
/// duplicates are counted. The ledger of the chaos suite, on a cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_and_a_killed_primary_during_consumption_lose_nothing() {
    const ENTRIES: usize = 3_000;
    let mut cluster = RedisCluster::start(3, 1).await;
    let stream = unique("ledger");
    let options =
        SidecarOptions::default().arg("--sharded-streams").arg(&format!("{stream}=3")).reclaim(2_000, 500).backoff(100);
    let sidecar = Sidecar::start_with_url(&cluster.seed_urls(), options).await;
    let mut streams = sidecar.stream_client().await;
    let mut appended = HashSet::new();
    let mut shard_keys = HashSet::new();
    for chunk in 0..ENTRIES / 100 {
        let batch = AppendBatchRequest {
            stream: stream.clone(),
            entries: (0..100)
                .map(|i| BatchEntry { fields: fields(&[("n", &(chunk * 100 + i).to_string())]), ..Default::default() })
                .collect(),
            partition_key: format!("key-{chunk}"),
            ..Default::default()
        };
        for written in streams.append_batch(batch).await.unwrap().into_inner().entries {
            shard_keys.insert(written.stream);
            appended.insert(written.id);
        }
    }
    assert_eq!(appended.len(), ENTRIES);
    // Replicated before the faults: Redis replicates asynchronously, and an
    // append a primary acknowledged just before it died may be lost with it.
    let mut con = cluster.conn().await;
    let _: redis::Value = redis::cmd("WAIT").arg(1).arg(5_000).query_async(&mut con).await.unwrap();

    let shard_keys: Vec<String> = shard_keys.into_iter().collect();
    let mut consumer = Consumer::start(&sidecar, &stream, "g", GroupStart::Beginning, 32).await;
    let mut delivered: HashMap<String, usize> = HashMap::new();
    let mut faults = Vec::new();
    let started = Instant::now();
    while delivered.len() < ENTRIES {
        assert!(started.elapsed() < Duration::from_secs(90), "only {} of {ENTRIES} delivered", delivered.len());
        if delivered.len() >= ENTRIES / 3 && faults.is_empty() {
            let new = cluster.failover(&shard_keys[0]).await;
            faults.push(format!("CLUSTER FAILOVER of {}'s primary to :{new}", shard_keys[0]));
        }
        if delivered.len() >= 2 * ENTRIES / 3 && faults.len() == 1 {
            let killed = cluster.kill_primary(&shard_keys[shard_keys.len() - 1]).await;
            faults.push(format!("SIGKILL of :{killed}, the primary of {}", shard_keys[shard_keys.len() - 1]));
        }
        match consumer.next_event(Duration::from_secs(15)).await {
            Event::Delivery(d) => {
                assert!(appended.contains(&d.id), "delivered an id never appended: {}", d.id);
                *delivered.entry(d.id.clone()).or_default() += 1;
                consumer.ack_one(&d.id).await;
            }
            // An ack that did not reach Redis (UNAVAILABLE) or lost its lease: the entry comes back.
            Event::VerdictError(_) => {}
            other => panic!("the call must survive the faults; after {} deliveries: {other:?}", delivered.len()),
        }
    }
    assert_eq!(faults.len(), 2, "both faults were injected: {faults:?}");
    let ready = support::eventually(Duration::from_secs(20), || async { sidecar.readyz().await == Some(200) }).await;
    assert!(ready, "the sidecar is ready again once the cluster has healed\n{}", sidecar.log());

    // Everything acknowledged in the end: nothing pending on any shard.
    let drained = support::eventually(Duration::from_secs(30), || {
        let mut con = con.clone();
        let keys = shard_keys.clone();
        async move {
            let mut total = 0;
            for key in &keys {
                total += pending(&mut con, key, "g").await;
            }
            total == 0
        }
    });
    let mut drained = drained.await;
    // Entries whose acks were lost come back; keep acking while waiting.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !drained && Instant::now() < deadline {
        if let Event::Delivery(d) = consumer.next_event(Duration::from_millis(500)).await {
            *delivered.entry(d.id.clone()).or_default() += 1;
            consumer.ack_one(&d.id).await;
        }
        let mut total = 0;
        for key in &shard_keys {
            total += pending(&mut con, key, "g").await;
        }
        drained = total == 0;
    }
    let lost: Vec<&String> = appended.iter().filter(|id| !delivered.contains_key(*id)).collect();
    let duplicates: usize = delivered.values().map(|n| n - 1).sum();
    eprintln!(
        "cluster ledger: entries {ENTRIES}, shards {}, faults {faults:?}, lost {}, duplicates {duplicates}",
        shard_keys.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "lost {} entries, e.g. {:?}", lost.len(), lost.iter().take(5).collect::<Vec<_>>());
    assert!(drained, "entries stayed pending after the faults\n{}", sidecar.log());
    consumer.send(req(Kind::Drain(Drain {}))).await;
}

/// The sidecar given a single node's URL keeps consuming after that very node
/// dies: a reader started afterwards (here: for a new call, the old call's
/// reader having stopped with it) connects through the cluster's other nodes,
/// learned from CLUSTER SLOTS, not only through the seed it was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_reconnects_after_its_seed_node_dies() {
    let mut cluster = RedisCluster::start(3, 1).await;
    let keys = cluster.key_per_primary("seeded").await;
    let stream = keys[0].clone();
    let seed = cluster.primary_of(&stream).await;
    let options = SidecarOptions::default().backoff(100);
    let sidecar = Sidecar::start_with_url(&format!("redis://127.0.0.1:{seed}"), options).await;
    let mut consumer = Consumer::start(&sidecar, &stream, "g", GroupStart::New, 8).await;
    let first = sidecar.append(&stream, &[("n", b"1")]).await;
    let delivered = consumer.next_delivery(Duration::from_secs(10)).await;
    assert_eq!(delivered.id, first.id);
    consumer.ack_one(&delivered.id).await;
    // The ack applied and replicated before the kill, so the new call has
    // nothing of its own to recover first.
    let mut con = cluster.conn().await;
    let acked = support::eventually(Duration::from_secs(10), || {
        let (mut con, stream) = (con.clone(), stream.clone());
        async move { pending(&mut con, &stream, "g").await == 0 }
    })
    .await;
    assert!(acked);
    let _: redis::Value = redis::cmd("WAIT").arg(1).arg(5_000).query_async(&mut con).await.unwrap();

    drop(consumer);
    let killed = cluster.kill_primary(&stream).await;
    assert_eq!(killed, seed);
    let appended = support::eventually(Duration::from_secs(20), || async {
        let request = AppendRequest { stream: stream.clone(), fields: fields(&[("n", "2")]), ..Default::default() };
        sidecar.stream_client().await.append(request).await.is_ok()
    })
    .await;
    assert!(appended, "appends work again once a replica is promoted");
    let mut consumer = Consumer::start(&sidecar, &stream, "g", GroupStart::New, 8).await;
    match consumer.next_event(Duration::from_secs(30)).await {
        Event::Delivery(d) => assert_eq!(d.payload.get("n").map(|v| &v[..]), Some(&b"2"[..])),
        other => panic!("the reader must reconnect without its seed node: {other:?}\n{}", sidecar.log()),
    }
}

/// A cluster with slots no node serves answers PING but refuses commands on
/// those slots: the sidecar is not ready then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_is_not_ready_while_the_cluster_is_down() {
    let cluster = RedisCluster::start(3, 0).await;
    let sidecar = Sidecar::start_with_url(&cluster.seed_urls(), SidecarOptions::default()).await;
    let keys = cluster.key_per_primary("down").await;
    let victim = cluster.primary_of(&keys[2]).await;

    // A primary without a replica stops: its slots are served by no one.
    let client = redis::Client::open(format!("redis://127.0.0.1:{victim}")).unwrap();
    let mut node = client.get_multiplexed_async_connection().await.unwrap();
    let _ = redis::cmd("SHUTDOWN").arg("NOSAVE").query_async::<redis::Value>(&mut node).await;

    let not_ready =
        support::eventually(Duration::from_secs(20), || async { sidecar.readyz().await == Some(503) }).await;
    assert!(not_ready, "cluster_state:fail must make /readyz 503\n{}", sidecar.log());
    // The log names the cause (after "does not answer PING" if the dead node's
    // connection was asked first).
    let named = support::eventually(Duration::from_secs(20), || async { sidecar.log().contains("cluster_state:fail") });
    assert!(named.await, "the log names the cause\n{}", sidecar.log());

    // Told to serve what it still can, the cluster answers for the dead node's
    // slots with a MOVED to it that cannot be followed: UNAVAILABLE, not INTERNAL.
    for port in cluster.live_ports().into_iter().filter(|&port| port != victim) {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let mut node = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query_async(&mut node)
            .await
            .unwrap();
    }
    let request = AppendRequest { stream: keys[2].clone(), fields: fields(&[("n", "1")]), ..Default::default() };
    let refused = sidecar.stream_client().await.append(request).await.expect_err("its node is down");
    assert_code(&refused, Code::Unavailable);
}

/// A failover wakes a reader blocked on the old primary with UNBLOCKED
/// ("instance state changed"), which on Redis 7.0 also means "stream
/// deleted": here the group is fine, so nothing is re-created, and the reader
/// carries on against the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_a_blocked_reader_is_not_a_lost_group() {
    let cluster = RedisCluster::start(3, 1).await;
    let sidecar = Sidecar::start_with_url(&cluster.seed_urls(), SidecarOptions::default().backoff(100)).await;
    let stream = unique("blocked");
    let mut consumer = Consumer::start(&sidecar, &stream, "g", GroupStart::New, 4).await;
    // Let the reader block on the idle stream.
    tokio::time::sleep(Duration::from_millis(300)).await;

    cluster.failover(&stream).await;
    let appended = support::eventually(Duration::from_secs(10), || async {
        let request = AppendRequest { stream: stream.clone(), fields: fields(&[("n", "1")]), ..Default::default() };
        sidecar.stream_client().await.append(request).await.is_ok()
    })
    .await;
    assert!(appended);
    let delivered = consumer.next_delivery(Duration::from_secs(15)).await;
    consumer.ack_one(&delivered.id).await;

    let metrics = support::http_get(sidecar.admin_port(), "/metrics").await.expect("/metrics").body;
    let recreated: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("echomq_group_recreations_total") && !l.trim_end().ends_with(" 0"))
        .collect();
    assert!(recreated.is_empty(), "no group was lost: {recreated:?}\n{}", sidecar.log());
}

/// The archive on a cluster: each shard key of a sharded stream is folded
/// and trimmed on its own slot (its fold lease shares the key's hash tag),
/// and Read spans each shard's archive and stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_stream_is_archived_per_shard_key_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0).await;
    let stream = unique("archived");
    let dir = TempDir::new("archive");
    let options = SidecarOptions::default()
        .arg("--sharded-streams")
        .arg(&format!("{stream}=3"))
        .arg("--archive-url")
        .arg(&format!("file://{}", dir.path().display()));
    let sidecar = Sidecar::start_with_url(&cluster.seed_urls(), options).await;
    let mut streams = sidecar.stream_client().await;
    let mut written: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for k in 0..30 {
        let request =
            AppendRequest { stream: stream.clone(), fields: fields(&[("k", &k.to_string())]), ..Default::default() };
        let response = streams.append(request).await.unwrap().into_inner();
        written.entry(response.stream).or_default().push(response.stream_id);
    }
    assert_eq!(written.len(), 3, "round-robin over the shards: {written:?}");
    let mut con = cluster.conn().await;
    for (shard, ids) in &written {
        let trimmed = streams
            .trim(TrimRequest { stream: shard.clone(), max_len: 2, ..Default::default() })
            .await
            .unwrap_or_else(|s| panic!("trim {shard}: {s:?}"))
            .into_inner();
        assert_eq!((trimmed.trimmed, trimmed.archived), (8, 8), "{shard}");
        assert_eq!(xlen(&mut con, shard).await, 2);
        let read = streams
            .read(ReadRequest { stream: shard.clone(), count: 100, ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        let back: Vec<String> = read.entries.iter().map(|e| e.stream_id.clone()).collect();
        assert_eq!(&back, ids, "{shard}: archived then live, in order");
        assert_eq!(read.entries.iter().filter(|e| e.archived).count(), 8);
    }
}

/// `--wait-replicas` and `dedup_key` on a cluster: each stream's WAIT goes
/// to the primary that owns its slot (a stopped replica fails only the
/// streams of its primary; a WAIT sent elsewhere would confirm them), the
/// writes of one round span slots, and dedup records live in the stream's
/// slot, on plain and sharded streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_and_idempotent_appends_wait_on_the_slot_owner() {
    let cluster = RedisCluster::start(3, 1).await;
    let sharded = unique("dsharded");
    let options = SidecarOptions::default()
        .arg("--wait-replicas")
        .arg("1")
        .arg("--wait-timeout-ms")
        .arg("500")
        .arg("--sharded-streams")
        .arg(&format!("{sharded}=4"));
    let sidecar = Sidecar::start_with_url(&cluster.seed_urls(), options).await;
    let keys = cluster.key_per_primary("durable").await;
    let keyed = |stream: &str, dedup_key: &str| AppendRequest {
        stream: stream.to_owned(),
        fields: fields(&[("k", "v")]),
        dedup_key: dedup_key.to_owned(),
        ..Default::default()
    };

    // Concurrent appends to streams on every primary: confirmed, in rounds that span slots.
    let mut calls = tokio::task::JoinSet::new();
    for key in &keys {
        for n in 0..20 {
            let mut client = sidecar.stream_client().await;
            let request = keyed(key, &format!("d{n}"));
            calls.spawn(async move { client.append(request).await });
        }
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap().expect("confirmed by the slot owner's replica");
    }
    let mut con = cluster.conn().await;
    let mut streams = sidecar.stream_client().await;
    for key in &keys {
        assert_eq!(xlen(&mut con, key).await, 20, "{key}");
        let first = streams.append(keyed(key, "once")).await.unwrap().into_inner();
        let again = streams.append(keyed(key, "once")).await.unwrap().into_inner();
        assert!(again.duplicate && again.id == first.id, "{again:?}");
        assert_eq!(xlen(&mut con, key).await, 21, "{key}: the duplicate wrote nothing");
        let record = format!("{{{key}}}:dedup:once");
        assert_eq!(key_slot(&record), key_slot(key), "the record shares the stream's slot");
        let exists: i64 = redis::cmd("EXISTS").arg(&record).query_async(&mut con).await.unwrap();
        assert_eq!(exists, 1, "{record}");
    }

    // Stop the replica of the first stream's primary: its appends are not
    // confirmed, the other primaries' are.
    let stopped = cluster.primary_of(&keys[0]).await;
    let replicas = cluster.replicas_of(stopped).await;
    assert_eq!(replicas.len(), 1, "{replicas:?}");
    cluster.pause(replicas[0], true);
    let lost = streams.append(keyed(&keys[0], "while-stopped")).await;
    let others = [
        streams.append(keyed(&keys[1], "while-stopped")).await,
        streams.append(keyed(&keys[2], "while-stopped")).await,
    ];
    cluster.pause(replicas[0], false);
    let err = lost.expect_err("the slot owner's replica is stopped");
    assert_code(&err, Code::Unavailable);
    assert!(err.message().contains("only 0 of 1 replicas"), "{}", err.message());
    for other in others {
        other.expect("another primary's replica runs");
    }
    let retry =
        streams.append(keyed(&keys[0], "while-stopped")).await.expect("confirmed once the replica runs").into_inner();
    assert!(retry.duplicate, "{retry:?}");

    // A sharded stream: the dedup key picks the shard, its record is in that shard's slot.
    let first = streams.append(keyed(&sharded, "order-1")).await.unwrap().into_inner();
    let retry = streams.append(keyed(&sharded, "order-1")).await.unwrap().into_inner();
    assert!(retry.duplicate && retry.stream == first.stream && retry.id == first.id, "{retry:?}");
}

/// DestroyGroup on a cluster: a group's own keys (heartbeat and retry hash)
/// share its stream key's slot, so one script removes them with the group; on
/// a sharded stream, on every shard. The other group's keys stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_group_removes_its_keys_on_a_cluster_and_on_every_shard() {
    let cluster = RedisCluster::start(3, 0).await;
    let (plain, sharded) = (unique("orders"), unique("sh"));
    let options = SidecarOptions::default().arg("--sharded-streams").arg(&format!("{sharded}=2"));
    let sidecar = Sidecar::start_with_url(&cluster.seed_url(), options).await;
    let mut con = cluster.conn().await;
    let shard_keys = [format!("{sharded}:{{{sharded}:0}}"), format!("{sharded}:{{{sharded}:1}}")];
    let own_keys = |group: &str| {
        let mut keys = vec![format!("{{{plain}}}:heartbeats:{group}"), format!("{{{plain}}}:retries:{group}")];
        for shard in &shard_keys {
            keys.extend([format!("{shard}:heartbeats:{group}"), format!("{shard}:retries:{group}")]);
        }
        keys
    };
    for stream in [&plain, &sharded] {
        // Round-robin: one entry in each shard of the sharded stream.
        sidecar.append_numbered(stream, 2).await;
        for group in ["g1", "g2"] {
            let mut call = Consumer::start(&sidecar, stream, group, GroupStart::Beginning, 16).await;
            for delivery in call.deliveries(2, Duration::from_secs(10)).await {
                call.fail(&delivery.id, Some(Duration::from_secs(60))).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let count = |keys: Vec<String>| {
        let mut con = con.clone();
        async move {
            let mut found = 0;
            for key in keys {
                let exists: i64 = redis::cmd("EXISTS").arg(&key).query_async(&mut con).await.unwrap();
                found += exists;
            }
            found
        }
    };
    let every = own_keys("g1").len() as i64;
    let written = support::eventually(Duration::from_secs(10), || async {
        count(own_keys("g1")).await == every && count(own_keys("g2")).await == every
    })
    .await;
    assert!(written, "every group's keys exist on every stream key:\n{}", sidecar.log());
    // The calls ended: let their readers stop, so no read finds the group gone.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut admin = sidecar.admin_client().await;
    let mut removed = Vec::new();
    for stream in [&plain, &sharded] {
        let request = DestroyGroupRequest { stream: stream.clone(), group: "g1".into(), force: true };
        let answer = admin.destroy_group(request).await.unwrap().into_inner();
        removed.push((answer.pending_dropped, answer.keys_removed));
    }

    assert_eq!(removed, [(2, 2), (2, 4)], "pending entries dropped and keys removed, per call");
    assert_eq!(count(own_keys("g1")).await, 0, "no key of the destroyed group is left");
    assert_eq!(count(own_keys("g2")).await, every, "the other group's keys stay");
    for key in [&plain, &shard_keys[0], &shard_keys[1]] {
        let groups: Vec<Vec<redis::Value>> =
            redis::cmd("XINFO").arg("GROUPS").arg(key).query_async(&mut con).await.unwrap();
        assert_eq!(groups.len(), 1, "only g2 is left on {key}");
    }
}

/// The values of the reserved `id` field of a stream key, in stream order.
async fn branded_ids(con: &mut ClusterConnection, key: &str) -> Vec<String> {
    let entries: Vec<(String, Vec<Vec<u8>>)> =
        redis::cmd("XRANGE").arg(key).arg("-").arg("+").query_async(con).await.unwrap();
    entries
        .iter()
        .map(|(_, fields)| {
            let id = fields.chunks(2).find(|pair| pair[0] == b"id").expect("the branded id field");
            String::from_utf8(id[1].clone()).unwrap()
        })
        .collect()
}

/// Scheduled entries on a cluster: the schedule lives in the stream's slot
/// (each shard's own, for a sharded stream), the index of due streams in a
/// slot of its own; a second sidecar that never touches the streams moves
/// them, each entry once, with the branded id Append answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_entries_move_once_on_a_cluster_plain_and_sharded() {
    let cluster = RedisCluster::start(3, 0).await;
    let plain = unique("later");
    let sharded = unique("sharded-later");
    let options = |poll: &str| {
        SidecarOptions::default()
            .arg("--sharded-streams")
            .arg(&format!("{sharded}=3"))
            .arg("--schedule-poll-ms")
            .arg(poll)
    };
    // This sidecar appends but never moves (its poll is a minute away) …
    let appender = Sidecar::start_with_url(&cluster.seed_url(), options("60000")).await;
    let mut streams = appender.stream_client().await;
    let mut minted: HashMap<String, Vec<String>> = HashMap::new();
    for stream in [&plain, &sharded] {
        for i in 0..30 {
            let request = AppendRequest {
                stream: stream.clone(),
                fields: fields(&[("n", &i.to_string())]),
                delay: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
                ..Default::default()
            };
            let written = streams.append(request).await.unwrap().into_inner();
            assert!(written.scheduled, "{written:?}");
            minted.entry(written.stream).or_default().push(written.id);
        }
    }
    assert_eq!(minted.len(), 4, "the plain stream and the 3 shards: {:?}", minted.keys());
    let mut con = cluster.conn().await;
    for key in minted.keys() {
        let schedule = if key.contains('{') { format!("{key}:scheduled") } else { format!("{{{key}}}:scheduled") };
        assert_eq!(key_slot(&schedule), key_slot(key), "{schedule} is in {key}'s slot");
        let count: u64 = redis::cmd("ZCARD").arg(&schedule).query_async(&mut con).await.unwrap();
        assert_eq!(count as usize, minted[key].len(), "{schedule}");
        assert_eq!(xlen(&mut con, key).await, 0, "{key}: invisible before its time");
    }
    // … this one moves them, though nobody asks it anything about these streams.
    let _mover = Sidecar::start_with_url(&cluster.seed_url(), options("20")).await;
    let started = Instant::now();
    for (key, ids) in &minted {
        while (xlen(&mut con, key).await as usize) < ids.len() {
            assert!(started.elapsed() < Duration::from_secs(15), "{key} was not moved");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (key, ids) in &minted {
        let moved = branded_ids(&mut con, key).await;
        assert_eq!(moved.len(), ids.len(), "{key}: no entry twice");
        assert_eq!(moved.iter().collect::<HashSet<_>>(), ids.iter().collect::<HashSet<_>>(), "{key}: each once");
    }
    let indexed: u64 = redis::cmd("ZCARD").arg("echomq:scheduled-index").query_async(&mut con).await.unwrap();
    assert_eq!(indexed, 0, "the index is empty once every schedule is");
}
