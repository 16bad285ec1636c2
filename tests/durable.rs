//! Durable and idempotent appends against real redis-servers: `dedup_key`
//! (Append, AppendBatch, sharded streams, the window), `--wait-replicas`
//! with a live, a stopped and a missing replica, `--wait-aof` by server, and
//! the dead-letter replay through the durable writer.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::time::{Duration, Instant};

use echomq::proto::{
    AppendBatchRequest, AppendRequest, AppendResponse, BatchEntry, ReadRequest, ReplayDeadLettersRequest,
};
use redis::aio::MultiplexedConnection;
use support::*;
use tonic::{Code, Status};

fn keyed(stream: &str, dedup_key: &str, value: &str) -> AppendRequest {
    AppendRequest {
        stream: stream.to_owned(),
        fields: fields(&[("v", value.as_bytes())]),
        dedup_key: dedup_key.to_owned(),
        ..Default::default()
    }
}

fn entry(dedup_key: &str, value: &str) -> BatchEntry {
    BatchEntry { fields: fields(&[("v", value.as_bytes())]), dedup_key: dedup_key.to_owned(), ..Default::default() }
}

async fn append(sidecar: &Sidecar, request: AppendRequest) -> Result<AppendResponse, Status> {
    sidecar.stream_client().await.append(request).await.map(tonic::Response::into_inner)
}

async fn pttl(con: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(con).await.expect("PTTL")
}

/// `redis-server` with a replica (`--replicaof`) whose link is up.
async fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start_with(RedisOptions {
        args: vec!["--repl-diskless-sync-delay".into(), "0".into()],
        ..RedisOptions::default()
    })
    .await;
    let replica = RedisServer::start_with(RedisOptions {
        args: vec!["--replicaof".into(), "127.0.0.1".into(), primary.port().to_string()],
        ..RedisOptions::default()
    })
    .await;
    let mut con = replica.conn().await;
    let up = eventually(Duration::from_secs(20), || {
        let mut con = con.clone();
        async move {
            let info: String = redis::cmd("INFO").arg("replication").query_async(&mut con).await.unwrap_or_default();
            info.contains("master_link_status:up")
        }
    })
    .await;
    assert!(up, "the replica's link did not come up; its log:\n{}", replica.log());
    let _: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    wait_replicas_acknowledge(&mut primary.conn().await, "ready", 1).await;
    (primary, replica)
}

fn waiting(replicas: u32, timeout_ms: u64) -> SidecarOptions {
    SidecarOptions::default()
        .arg("--wait-replicas")
        .arg(&replicas.to_string())
        .arg("--wait-timeout-ms")
        .arg(&timeout_ms.to_string())
}

/// A second append with the same dedup key writes nothing and answers the
/// first one's ids, marked duplicate; the record lives in the stream's
/// namespace for the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_dedup_key_answers_the_first_ids_and_writes_nothing() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;

    let first = append(&sidecar, keyed("orders", "order-7", "first")).await.unwrap();
    let again = append(&sidecar, keyed("orders", "order-7", "second")).await.unwrap();
    let other = append(&sidecar, keyed("orders", "order-8", "third")).await.unwrap();
    let unkeyed = append(&sidecar, keyed("orders", "", "fourth")).await.unwrap();
    let elsewhere = append(&sidecar, keyed("payments", "order-7", "fifth")).await.unwrap();

    assert!(!first.duplicate && !other.duplicate && !unkeyed.duplicate && !elsewhere.duplicate);
    assert!(again.duplicate, "{again:?}");
    assert_eq!((&again.id, &again.stream_id, &again.stream), (&first.id, &first.stream_id, &first.stream));
    assert_eq!(xlen(&mut con, "orders").await, 3, "the duplicate wrote nothing");
    assert_eq!(xlen(&mut con, "payments").await, 1, "a dedup key is per stream");
    let entries = xrange(&mut con, "orders").await;
    assert_eq!(entries[0].field("v"), Some(&b"first"[..]), "the first append's payload stays");
    let ttl = pttl(&mut con, "orders:dedup:order-7").await;
    assert!(ttl > 100_000 && ttl <= 120_000, "the record lives for the 2-minute default window: {ttl} ms");
    let record: String = redis::cmd("GET").arg("orders:dedup:order-7").query_async(&mut con).await.unwrap();
    assert_eq!(record, format!("{} {}", first.stream_id, first.id));
}

/// After `--dedup-window-ms` the key is forgotten: the same key writes again.
/// Within it, a record whose entry was trimmed still answers duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedup_key_is_remembered_for_the_window_even_after_a_trim() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--dedup-window-ms").arg("1500")).await;
    let mut con = redis.conn().await;

    let first = append(&sidecar, keyed("w", "k", "1")).await.unwrap();
    let _: i64 = redis::cmd("XTRIM").arg("w").arg("MAXLEN").arg(0).query_async(&mut con).await.unwrap();
    let trimmed = append(&sidecar, keyed("w", "k", "2")).await.unwrap();
    assert!(trimmed.duplicate && trimmed.id == first.id, "the record outlives its entry: {trimmed:?}");
    assert_eq!(xlen(&mut con, "w").await, 0);

    tokio::time::sleep(Duration::from_millis(1700)).await;
    let later = append(&sidecar, keyed("w", "k", "3")).await.unwrap();
    assert!(!later.duplicate, "past the window the key is new: {later:?}");
    assert_ne!(later.id, first.id);
    assert_eq!(xlen(&mut con, "w").await, 1);
}

/// A batch may mix keyed and unkeyed entries and repeat a key: a repeat is a
/// duplicate of the first entry with it, an entry whose key is recorded is a
/// duplicate of the earlier append; only the others are written, with
/// consecutive ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_writes_each_dedup_key_once() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;

    let first =
        sidecar.append_batch("b", vec![entry("a", "1"), entry("", "2"), entry("a", "3"), entry("b", "4")]).await;
    let duplicate: Vec<bool> = first.iter().map(|w| w.duplicate).collect();
    assert_eq!(duplicate, [false, false, true, false]);
    assert_eq!(first[2].id, first[0].id, "the repeat answers the first entry's id");
    assert_eq!(first[2].stream_id, first[0].stream_id);
    assert_eq!(xlen(&mut con, "b").await, 3);

    let second = sidecar.append_batch("b", vec![entry("b", "5"), entry("c", "6")]).await;
    assert!(second[0].duplicate && second[0].id == first[3].id, "{second:?}");
    assert!(!second[1].duplicate);
    assert_eq!(xlen(&mut con, "b").await, 4);
    let values: Vec<Vec<u8>> =
        xrange(&mut con, "b").await.iter().map(|e| e.field("v").unwrap_or_default().to_vec()).collect();
    assert_eq!(values, [b"1", b"2", b"4", b"6"]);

    let all_duplicates = sidecar.append_batch("b", vec![entry("a", "7"), entry("c", "8")]).await;
    assert!(all_duplicates.iter().all(|w| w.duplicate));
    assert_eq!(xlen(&mut con, "b").await, 4, "a batch of duplicates writes nothing");
}

/// On a sharded stream a retry must find the record whichever shard the
/// first append took: with no partition key, the dedup key picks the shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_sharded_stream_the_dedup_key_picks_the_shard_so_retries_find_it() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--sharded-streams").arg("orders=4")).await;
    let mut con = redis.conn().await;

    let mut firsts = Vec::new();
    for n in 0..8 {
        firsts.push(append(&sidecar, keyed("orders", &format!("key-{n}"), "first")).await.unwrap());
    }
    // Round-robin appends in between would move an unkeyed retry to another shard.
    for _ in 0..3 {
        append(&sidecar, keyed("orders", "", "filler")).await.unwrap();
    }
    for (n, first) in firsts.iter().enumerate() {
        let retry = append(&sidecar, keyed("orders", &format!("key-{n}"), "retry")).await.unwrap();
        assert!(retry.duplicate, "key-{n}: {retry:?}");
        assert_eq!((&retry.id, &retry.stream), (&first.id, &first.stream));
    }
    let shards: Vec<&String> =
        firsts.iter().map(|w| &w.stream).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    assert!(shards.len() > 1, "eight keys spread over more than one shard: {shards:?}");
    let mut total = 0;
    for k in 0..4 {
        total += xlen(&mut con, &format!("orders:{{orders:{k}}}")).await;
    }
    assert_eq!(total, 8 + 3, "no retry was written");
    let given = AppendRequest { partition_key: "customer-1".into(), ..keyed("orders", "with-partition", "x") };
    let first = append(&sidecar, given.clone()).await.unwrap();
    let retry = append(&sidecar, given).await.unwrap();
    assert!(retry.duplicate && retry.stream == first.stream);
}

/// A dedup key over `--max-name-bytes` is INVALID_ARGUMENT and writes
/// nothing; an empty one is no dedup key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedup_key_over_the_name_limit_is_refused_and_writes_nothing() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--max-name-bytes").arg("16")).await;
    let long = "k".repeat(17);
    let cases = vec![
        Refusal::new("Append with a 17-byte dedup key", Rpc::Append(keyed("s", &long, "v")), Code::InvalidArgument)
            .naming("dedup_key")
            .naming("--max-name-bytes")
            .leaving(Leaves::NoKeys),
        Refusal::new(
            "AppendBatch with one entry's dedup key too long",
            Rpc::AppendBatch(AppendBatchRequest {
                stream: "s".into(),
                entries: vec![entry("fine", "1"), entry(&long, "2")],
                ..Default::default()
            }),
            Code::InvalidArgument,
        )
        .naming("entries.dedup_key")
        .naming("entry 1 of the batch")
        .leaving(Leaves::NoKeys),
    ];
    assert_refusals(&redis, &sidecar, cases).await;
    let fits = append(&sidecar, keyed("s", &"k".repeat(16), "v")).await.unwrap();
    assert!(!fits.duplicate);
}

/// With `--wait-replicas 1` and a live replica an append is answered once
/// the replica has it; concurrent appends share their WAITs (group commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_live_replica_appends_are_confirmed_and_share_their_waits() {
    let (primary, replica) = primary_with_replica().await;
    let sidecar = Sidecar::start(&primary, waiting(1, 2000)).await;
    let mut on_replica = replica.conn().await;

    let one = append(&sidecar, keyed("d", "", "1")).await.unwrap();
    // No sleep: WAIT answered only once the replica had it.
    let seen: Vec<String> = xrange(&mut on_replica, "d").await.into_iter().map(|e| e.stream_id).collect();
    assert_eq!(seen, std::slice::from_ref(&one.stream_id), "the replica has the entry when Append answers");

    let mut con = primary.conn().await;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut con).await.unwrap();
    // Clients first, so the 200 calls start together.
    let mut clients = Vec::new();
    for _ in 0..200 {
        clients.push(sidecar.stream_client().await);
    }
    let mut calls = tokio::task::JoinSet::new();
    for (n, mut client) in clients.into_iter().enumerate() {
        calls.spawn(async move { client.append(keyed("d", &format!("k{n}"), "x")).await });
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap().expect("confirmed");
    }
    assert_eq!(xlen(&mut on_replica, "d").await, 201);
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut con).await.unwrap();
    let waits: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls=")?.split(',').next()?.parse().ok())
        .expect("WAIT was called");
    assert!(waits < 200, "200 concurrent appends need fewer than 200 WAITs (group commit), got {waits}");
}

/// With `--wait-replicas 1` and a live replica, an AckEmit is confirmed as
/// an append is: `Emitted` comes once the replica has the emits and the
/// source's acknowledgement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_live_replica_an_ack_emit_is_answered_once_the_replica_has_it() {
    let (primary, replica) = primary_with_replica().await;
    let sidecar = Sidecar::start(&primary, waiting(1, 2000)).await;
    let mut on_replica = replica.conn().await;
    append(&sidecar, keyed("src", "", "1")).await.unwrap();
    let mut call = Consumer::start(&sidecar, "src", "g", echomq::proto::GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;
    let mut con = primary.conn().await;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut con).await.unwrap();

    call.ack_emit(&delivery.id, &[("sink", &[("v", b"1")])]).await;
    let emitted = call.next_emitted(EVENT_TIMEOUT).await;

    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut con).await.unwrap();
    assert!(stats.contains("cmdstat_wait:calls="), "the step was confirmed with WAIT: {stats}");

    // No sleep: Emitted was sent only once the replica had the step.
    let seen: Vec<String> = xrange(&mut on_replica, "sink").await.into_iter().map(|e| e.stream_id).collect();
    assert_eq!(seen, vec![emitted.entries[0].stream_id.clone()], "the replica has the emit when Emitted comes");
    assert_eq!(pending_count(&mut on_replica, "src", "g").await, 0, "and the source's XACK with it");
}

/// A replica that stops acknowledging: the append is answered UNAVAILABLE
/// within about the wait timeout, naming its ids and what fell short; the
/// shared connection is not held up meanwhile; and once the replica is back,
/// a retry with the same dedup key answers the same ids, confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_append_is_unavailable_naming_its_ids_and_a_keyed_retry_is_safe() {
    let (primary, replica) = primary_with_replica().await;
    let sidecar = Sidecar::start(&primary, waiting(1, 1000)).await;
    append(&sidecar, keyed("u", "", "warm")).await.unwrap();
    let mut con = primary.conn().await;

    replica.pause(true);
    let started = Instant::now();
    let mut client = sidecar.stream_client().await;
    let pending = tokio::spawn(async move { client.append(keyed("u", "order-1", "v")).await });
    // Meanwhile the shared connection serves a Read at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let read_started = Instant::now();
    let read = ReadRequest { stream: "u".into(), ..Default::default() };
    sidecar.stream_client().await.read(read).await.expect("a Read while an append waits");
    assert!(read_started.elapsed() < Duration::from_millis(500), "Read waited {:?}", read_started.elapsed());
    let err = pending.await.unwrap().expect_err("the replica is stopped");
    let took = started.elapsed();
    replica.pause(false);

    assert_code(&err, Code::Unavailable);
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(3000), "answered after {took:?}");
    let message = err.message();
    for text in [
        "written to the primary but not confirmed",
        "only 0 of 1 replicas",
        "1000 ms",
        "connected replica",
        "same dedup_key is safe",
    ] {
        assert!(message.contains(text), "{text:?} missing from: {message}");
    }
    assert_eq!(xlen(&mut con, "u").await, 2, "the entry is on the primary");
    let written = xrange(&mut con, "u").await.pop().unwrap();
    assert!(message.contains(&written.stream_id), "names the stream id {}: {message}", written.stream_id);
    let branded = branded_from_stream_id(&written.stream_id);
    assert!(message.contains(&branded), "names the branded id {branded}: {message}");

    let retry = append(&sidecar, keyed("u", "order-1", "v")).await.expect("confirmed once the replica is back");
    assert!(retry.duplicate && retry.stream_id == written.stream_id, "{retry:?}");
    assert_eq!(xlen(&mut con, "u").await, 2, "the retry wrote nothing");

    replica.pause(true);
    let err = append(&sidecar, keyed("u", "", "unkeyed")).await.expect_err("stopped again");
    replica.pause(false);
    assert!(err.message().contains("may write it a second time"), "{}", err.message());
}

/// `--wait-replicas` above the replicas that exist: the sidecar starts (they
/// may come), warns, and every append times out saying how many are connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_above_those_connected_warns_and_every_append_says_so() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, waiting(1, 300)).await;
    assert!(sidecar.log().contains("above the replicas connected"), "{}", sidecar.log());

    let err = append(&sidecar, keyed("x", "", "v")).await.expect_err("no replica can confirm");
    assert_code(&err, Code::Unavailable);
    assert!(
        err.message()
            .contains("only 0 of 1 replicas confirmed it within 300 ms (WAIT); the primary has 0 connected replicas"),
        "{}",
        err.message()
    );
    let request = AppendBatchRequest {
        stream: "x".into(),
        entries: vec![entry("a", "1"), entry("b", "2")],
        ..Default::default()
    };
    let err = sidecar.stream_client().await.append_batch(request).await.expect_err("no replica");
    assert!(err.message().contains("2 entries of stream `x`"), "{}", err.message());
}

/// After SCRIPT FLUSH (a restarted or failed-over server) the scripts are
/// loaded again, on the shared connection and in the durable writer's
/// pipeline alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_load_their_script_again_after_script_flush() {
    let (primary, _replica) = primary_with_replica().await;
    let durable = Sidecar::start(&primary, waiting(1, 2000)).await;
    let plain = Sidecar::start(&primary, SidecarOptions::default()).await;
    let mut con = primary.conn().await;
    for n in 0..3 {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut con).await.unwrap();
        append(&durable, keyed("f", &format!("d{n}"), "v")).await.expect("the writer loads append.lua");
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut con).await.unwrap();
        append(&plain, keyed("f", &format!("p{n}"), "v")).await.expect("the shared connection loads append.lua");
    }
    assert_eq!(xlen(&mut con, "f").await, 6);
}

/// ReplayDeadLetters goes through the durable writer: confirmed with a live
/// replica, UNAVAILABLE saying what moved when the replica is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_waits_for_the_replicas_too() {
    let (primary, replica) = primary_with_replica().await;
    let sidecar = Sidecar::start(&primary, waiting(1, 500)).await;
    let mut con = primary.conn().await;
    create_group(&mut con, "src", "g", "0").await;
    for n in 0..4 {
        let source = n.to_string();
        xadd_raw(&mut con, "src:dlq", &[(b"v", source.as_bytes()), (b"echomq.source_stream", b"src")]).await;
    }
    let replay = |count| ReplayDeadLettersRequest { stream: "src".into(), count, ..Default::default() };

    let done = sidecar.admin_client().await.replay_dead_letters(replay(2)).await.expect("confirmed").into_inner();
    assert_eq!(done.replayed.len(), 2);
    replica.pause(true);
    let err = sidecar.admin_client().await.replay_dead_letters(replay(2)).await.expect_err("the replica is stopped");
    replica.pause(false);
    assert_code(&err, Code::Unavailable);
    assert!(err.message().contains("dead letters replayed to stream `src`"), "{}", err.message());
    assert!(err.message().contains("not confirmed"), "{}", err.message());
    assert_eq!(xlen(&mut con, "src").await, 4, "moved on the primary");
    assert_eq!(xlen(&mut con, "src:dlq").await, 0);
}

/// `--wait-aof` needs WAITAOF (Redis 7.2+, Valkey) and appendonly: refused at
/// start (exit 2, naming the version) where the server lacks it; confirmed
/// appends where it has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_aof_is_refused_at_start_where_the_server_cannot_do_it() {
    let redis = RedisServer::start_with(RedisOptions::append_only()).await;
    let info = redis.info().await;
    let mut args = local_args(&redis.url());
    args.push("--wait-aof".into());
    if info.is_valkey() || info.redis >= (7, 2, 0) {
        let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--wait-aof")).await;
        let written = append(&sidecar, keyed("aof", "k", "v")).await.expect("fsynced on the primary");
        assert!(!written.duplicate);
        let without_aof = RedisServer::start().await;
        let mut args = local_args(&without_aof.url());
        args.push("--wait-aof".into());
        let out = run_to_exit(&args, Duration::from_secs(30));
        assert_eq!(out.status.code(), Some(2), "appendonly no: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("appendonly"));
    } else {
        let out = run_to_exit(&args, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        let reason = stderr.lines().find(|l| l.starts_with("echomq-sidecar: ")).unwrap_or_default();
        assert!(reason.contains("--wait-aof needs WAITAOF"), "one line gives the reason: {stderr}");
        assert!(reason.contains(&format!("Redis {}", info.describe())), "names the version: {stderr}");
    }
}

/// Scheduled entries through the durable writer: a scheduled append is
/// answered once the replica has its schedule, and its move into the stream
/// is waited for the same way (a move the replica does not confirm is logged,
/// the entry moved once); a scheduled append the replica does not confirm is
/// UNAVAILABLE naming its branded id, and a keyed retry is safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_appends_and_their_moves_wait_for_the_replicas() {
    let (primary, replica) = primary_with_replica().await;
    let sidecar = Sidecar::start(&primary, waiting(1, 1000).arg("--schedule-poll-ms").arg("20")).await;
    let mut on_replica = replica.conn().await;
    let mut con = primary.conn().await;
    let scheduled = |key: &str, delay_ms: i64| AppendRequest {
        delay: Some(prost_types::Duration { seconds: delay_ms / 1000, nanos: (delay_ms % 1000) as i32 * 1_000_000 }),
        ..keyed("s", key, "later")
    };

    let first = append(&sidecar, scheduled("", 600)).await.unwrap();
    assert!(first.scheduled, "{first:?}");
    let on_the_replica: u64 = redis::cmd("ZCARD").arg("s:scheduled").query_async(&mut on_replica).await.unwrap();
    assert_eq!(on_the_replica, 1, "the replica has the schedule once the append is answered");
    let moved = eventually(Duration::from_secs(5), || {
        let mut on_replica = on_replica.clone();
        async move { xlen(&mut on_replica, "s").await == 1 }
    })
    .await;
    assert!(moved, "the move reached the replica");
    assert_eq!(xrange(&mut on_replica, "s").await[0].field("id"), Some(first.id.as_bytes()));

    // A move the replica does not confirm: logged, the entry in the stream once.
    let second = append(&sidecar, scheduled("", 200)).await.unwrap();
    replica.pause(true);
    let logged =
        eventually(Duration::from_secs(5), || async { sidecar.log().contains("not confirmed by replicas") }).await;
    // An append meanwhile is not confirmed either, and says which scheduled entry it wrote.
    let err = append(&sidecar, scheduled("order-1", 60_000)).await.expect_err("the replica is stopped");
    replica.pause(false);
    assert!(logged, "{}", sidecar.log());
    assert_code(&err, Code::Unavailable);
    let ids: Vec<Vec<u8>> = xrange(&mut con, "s").await.iter().map(|e| e.field("id").unwrap().to_vec()).collect();
    assert_eq!(ids, [first.id.as_bytes().to_vec(), second.id.as_bytes().to_vec()], "each once");
    let message = err.message();
    assert!(message.contains("scheduled entry") && message.contains("same dedup_key is safe"), "{message}");
    let retried = append(&sidecar, scheduled("order-1", 60_000)).await.unwrap();
    assert!(retried.duplicate && retried.scheduled, "{retried:?}");
    assert!(message.contains(&retried.id), "names the branded id {}: {message}", retried.id);
    let left: u64 = redis::cmd("ZCARD").arg("s:scheduled").query_async(&mut con).await.unwrap();
    assert_eq!(left, 1, "scheduled once");
}
