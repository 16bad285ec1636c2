//! The group readers' connections come from a bounded pool
//! (`--reader-connections`): one per (stream, group) with calls, taken at the
//! first call's subscribe and given back when the last call leaves; more
//! groups than connections is a RESOURCE_EXHAUSTED refusal, never a hang; a
//! dead connection is replaced; a reader cut off mid-read never hands its
//! connection on; the pool shows on `/metrics`. Against a real redis-server
//! and the real sidecar binary. These are the blocking readers'
//! (`--shared-readers off`, the default, and what a cluster gets); shared readers,
//! opt-in, are `tests/shared_readers.rs`'.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use echomq::proto::GroupStart;
use redis::aio::MultiplexedConnection;
use support::*;
use tonic::Code;

/// The name the sidecar gives its reader connections (`CLIENT SETNAME`).
const READER_NAME: &str = "echomq-reader";

/// Blocking readers with a pool of `connections`.
fn pool_of(connections: u32) -> SidecarOptions {
    SidecarOptions::default()
        .arg("--shared-readers")
        .arg("off")
        .arg("--reader-connections")
        .arg(&connections.to_string())
}

/// The sidecar's reader connections in `CLIENT LIST`: (id, flags) of each.
async fn readers(con: &mut MultiplexedConnection) -> Vec<(String, String)> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(con).await.expect("CLIENT LIST");
    list.lines()
        .filter_map(|line| {
            let field =
                |key: &str| line.split(' ').find_map(|kv| kv.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')));
            (field("name")? == READER_NAME)
                .then(|| (field("id").unwrap().to_owned(), field("flags").unwrap().to_owned()))
        })
        .collect()
}

/// Waits until exactly one reader connection exists and is blocked in its
/// read (`flags` has `b`); its client id.
async fn blocked_reader(con: &mut MultiplexedConnection) -> String {
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let now = readers(con).await;
        if let [(id, flags)] = now.as_slice() {
            if flags.contains('b') {
                return id.clone();
            }
        }
        assert!(Instant::now() < deadline, "no single blocked reader connection; CLIENT LIST readers: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn kill_client(con: &mut MultiplexedConnection, id: &str) {
    let killed: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id).query_async(con).await.expect("CLIENT KILL");
    assert_eq!(killed, 1, "client {id} was killed");
}

/// `echomq_reader_connections_closed_total{reason="<reason>"}`; 0 before its first.
async fn closed(sidecar: &Sidecar, reason: &str) -> f64 {
    sample(sidecar, &format!("echomq_reader_connections_closed_total{{reason=\"{reason}\"}}")).await
}

/// One sample's value on `/metrics` by its full name and labels; 0 when absent.
async fn sample(sidecar: &Sidecar, series: &str) -> f64 {
    let metrics = http_get(sidecar.admin_port(), "/metrics").await.expect("GET /metrics").body;
    metrics.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

/// Subscribes, retrying while the sidecar answers RESOURCE_EXHAUSTED (a
/// connection given back a moment ago), for at most `timeout`.
async fn subscribe_when_free(sidecar: &Sidecar, stream: &str, group: &str, timeout: Duration) -> Consumer {
    let deadline = Instant::now() + timeout;
    loop {
        match Consumer::try_subscribe(sidecar, subscribe_msg(stream, group, GroupStart::New)).await {
            Ok(consumer) => return consumer,
            Err(status) if status.code() == Code::ResourceExhausted && Instant::now() < deadline => {}
            Err(status) => panic!("subscribe {stream}/{group}: {status:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_groups_than_reader_connections_is_refused_resource_exhausted_naming_the_setting() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, pool_of(1)).await;
    let mut first = Consumer::start(&sidecar, "s1", "g1", GroupStart::New, 0).await;
    // Calls of one group share its reader: a second call is no second group.
    let mut same_group = Consumer::start(&sidecar, "s1", "g1", GroupStart::New, 0).await;

    let asked = Instant::now();
    let refused = Consumer::try_subscribe(&sidecar, subscribe_msg("s2", "g2", GroupStart::New))
        .await
        .err()
        .expect("a second group's subscribe is refused while the only reader connection is taken");
    let answered_in = asked.elapsed();

    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    for setting in ["--reader-connections", "ECHOMQ_READER_CONNECTIONS"] {
        assert!(refused.message().contains(setting), "the refusal names {setting}: {}", refused.message());
    }
    assert!(answered_in < Duration::from_secs(5), "answered in {answered_in:?}, not left hanging");
    assert_eq!(sidecar.counter("echomq_reader_connection_refusals_total").await, 1.0);
    assert!(sidecar.log().contains("every reader connection is in use"), "the refusal is logged");
    // The group that has the connection reads on (for either of its calls).
    sidecar.append("s1", &[("k", b"v1")]).await;
    let delivery = tokio::select! {
        delivery = first.next_delivery(EVENT_TIMEOUT) => delivery,
        delivery = same_group.next_delivery(EVENT_TIMEOUT) => delivery,
    };
    assert_eq!(delivery.payload["k"], &b"v1"[..]);

    // Once the first group's calls have ended, its connection serves the second group.
    drop(first);
    drop(same_group);
    let mut second = subscribe_when_free(&sidecar, "s2", "g2", EVENT_TIMEOUT).await;
    sidecar.append("s2", &[("k", b"v2")]).await;
    assert_eq!(second.next_delivery(EVENT_TIMEOUT).await.payload["k"], &b"v2"[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_connection_killed_under_its_read_is_replaced_in_place_and_reading_resumes() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, pool_of(1)).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let killed = blocked_reader(&mut con).await;

    kill_client(&mut con, &killed).await;

    let replacement = blocked_reader(&mut con).await;
    assert_ne!(replacement, killed, "a new connection reads");
    sidecar.append("s", &[("k", b"after")]).await;
    assert_eq!(consumer.next_delivery(EVENT_TIMEOUT).await.payload["k"], &b"after"[..]);
    assert_eq!(closed(&sidecar, "read_error").await, 1.0);
    // Replaced in place: the group kept its place in the pool.
    let other = Consumer::try_subscribe(&sidecar, subscribe_msg("s2", "g2", GroupStart::New)).await;
    assert_eq!(other.err().map(|s| s.code()), Some(Code::ResourceExhausted), "the one connection is still the group's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_reader_connection_that_died_fails_its_health_check_and_is_replaced() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, pool_of(1)).await;
    let mut con = redis.conn().await;
    // With max_in_flight 1 and its one entry held, no read is in flight: the
    // call's end hands the connection back to the pool, idle.
    let mut first = Consumer::start(&sidecar, "s1", "g1", GroupStart::New, 1).await;
    sidecar.append("s1", &[("k", b"v")]).await;
    first.next_delivery(EVENT_TIMEOUT).await;
    drop(first);
    sidecar.wait_counter("echomq_reader_connections_in_use", 0.0).await;
    assert_eq!(sidecar.counter("echomq_reader_connections").await, 1.0, "kept open in the pool");
    assert_eq!(closed(&sidecar, "stopped_mid_read").await, 0.0);
    let idle = readers(&mut con).await;
    assert_eq!(idle.len(), 1, "one idle reader connection: {idle:?}");

    kill_client(&mut con, &idle[0].0).await;
    let mut second = Consumer::start(&sidecar, "s2", "g2", GroupStart::New, 0).await;

    sidecar.append("s2", &[("k", b"w")]).await;
    assert_eq!(second.next_delivery(EVENT_TIMEOUT).await.payload["k"], &b"w"[..]);
    assert_eq!(closed(&sidecar, "health_check").await, 1.0, "the PING before reuse found it dead");
    assert_eq!(
        sample(&sidecar, r#"echomq_redis_errors_total{stream="s2",sharded_stream="s2",group="g2",operation="read"}"#)
            .await,
        0.0,
        "no read ever ran on the dead connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_cut_off_mid_read_closes_its_connection_instead_of_handing_it_on() {
    let redis = RedisServer::start().await;
    // A read blocks for 30 s: a connection handed on with it in flight would
    // hold the next group's read up that long.
    let sidecar = Sidecar::start(&redis, pool_of(1).arg("--read-block-ms").arg("30000")).await;
    let mut con = redis.conn().await;
    let first = Consumer::start(&sidecar, "s1", "g1", GroupStart::New, 0).await;
    blocked_reader(&mut con).await;

    drop(first);
    let gone = eventually(EVENT_TIMEOUT, || {
        let mut con = con.clone();
        async move { readers(&mut con).await.is_empty() }
    })
    .await;
    assert!(gone, "the cut-off reader's connection is closed: {:?}", readers(&mut con).await);
    assert_eq!(closed(&sidecar, "stopped_mid_read").await, 1.0);
    // Nothing reads for g1 now, so an entry appended to s1 stays unread.
    sidecar.append("s1", &[("k", b"unread")]).await;

    let started = Instant::now();
    let mut second = subscribe_when_free(&sidecar, "s2", "g2", EVENT_TIMEOUT).await;
    sidecar.append("s2", &[("k", b"v")]).await;
    assert_eq!(second.next_delivery(EVENT_TIMEOUT).await.payload["k"], &b"v"[..]);
    let took = started.elapsed();

    assert!(took < Duration::from_secs(4), "the second group's read waited {took:?} behind the old one");
    assert_eq!(pending_count(&mut con, "s1", "g1").await, 0, "no read took s1's entry for a group with no calls");
    assert_eq!(readers(&mut con).await.len(), 1, "one reader connection, the second group's");
    assert_eq!(closed(&sidecar, "health_check").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reader_pool_shows_its_size_use_and_waits_on_metrics() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, pool_of(3)).await;
    assert_eq!(sidecar.counter("echomq_reader_connections_max").await, 3.0);
    assert_eq!(sidecar.counter("echomq_reader_connections").await, 0.0, "nothing connects before a subscribe");

    let a = Consumer::start(&sidecar, "s1", "g1", GroupStart::New, 0).await;
    let _b = Consumer::start(&sidecar, "s2", "g2", GroupStart::New, 0).await;
    assert_eq!(sidecar.counter("echomq_reader_connections_in_use").await, 2.0);
    assert_eq!(sidecar.counter("echomq_reader_connections").await, 2.0);
    assert_eq!(sidecar.counter("echomq_reader_connection_waiters").await, 0.0);
    assert_eq!(sidecar.counter("echomq_reader_connection_wait_seconds_count").await, 2.0, "one wait per group");

    drop(a);
    sidecar.wait_counter("echomq_reader_connections_in_use", 1.0).await;
    assert_eq!(sidecar.counter("echomq_reader_connection_refusals_total").await, 0.0);
}

#[tokio::test]
async fn a_sharded_stream_with_more_shards_than_reader_connections_is_refused_at_once() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, pool_of(2).arg("--sharded-streams").arg("shs=4")).await;
    let asked = Instant::now();
    let refused = Consumer::try_subscribe(&sidecar, subscribe_msg("shs", "g", GroupStart::New))
        .await
        .err()
        .expect("4 shards cannot be read with 2 connections");
    assert_code(&refused, Code::ResourceExhausted);
    assert!(refused.message().contains("needs 4 reader connections"), "{}", refused.message());
    assert!(refused.message().contains("--reader-connections"), "{}", refused.message());
    assert!(asked.elapsed() < Duration::from_millis(900), "refused without waiting for a connection to come free");
}

/// A reader that reconnects to a Redis which now wants a password the
/// sidecar was not given logs Redis' NOAUTH, not the puzzling error of the
/// read that would follow an unanswered naming (an unauthenticated XREADGROUP
/// is cut off as a "Protocol error").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_refused_for_want_of_a_password_says_noauth() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, pool_of(1)).await;
    let mut con = redis.conn().await;
    let _consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let reader = blocked_reader(&mut con).await;
    let _: () = redis::cmd("CONFIG").arg(&["SET", "requirepass", "now-wanted"]).query_async(&mut con).await.unwrap();

    kill_client(&mut con, &reader).await;

    let deadline = Instant::now() + EVENT_TIMEOUT;
    let says_noauth = |log: &str| log.lines().any(|l| l.contains("reading new entries failed") && l.contains("NOAUTH"));
    while !says_noauth(&sidecar.log()) {
        assert!(Instant::now() < deadline, "no NOAUTH read failure logged:\n{}", sidecar.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
