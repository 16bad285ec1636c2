//! Shared readers (`--shared-readers auto`, the default; shared on a single
//! server while few sidecars serve a group): many groups on one sidecar cost
//! a few Redis connections (the shared one, the `echomq-wake` connection that
//! tracks the streams read, two reader connections), none is refused, an idle
//! group sends no reads, and entries are delivered through the wake
//! connection's loss, group and stream deletions and reclaims; a group that
//! many sidecars serve blocks instead, and shares again when few are left.
//! Against a real redis-server and the real sidecar binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use echomq::proto::GroupStart;
use redis::aio::MultiplexedConnection;
use support::*;

const WAKE_NAME: &str = "echomq-wake";
const READER_NAME: &str = "echomq-reader";
/// The name of the test's own connections, so they are not counted.
const TEST_NAME: &str = "echomq-test";

/// A sidecar with shared readers where the server allows them (`auto`, the
/// default, named so that `ECHOMQ_TEST_SHARED_READERS` does not change it).
fn shared() -> SidecarOptions {
    SidecarOptions::default().arg("--shared-readers").arg("auto")
}

/// A connection of the test's own, named [`TEST_NAME`].
async fn test_conn(redis: &RedisServer) -> MultiplexedConnection {
    let mut con = redis.conn().await;
    let _: () = redis::cmd("CLIENT").arg("SETNAME").arg(TEST_NAME).query_async(&mut con).await.unwrap();
    con
}

/// Every client in `CLIENT LIST` but the test's own: (id, name) of each.
async fn sidecar_clients(con: &mut MultiplexedConnection) -> Vec<(String, String)> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(con).await.expect("CLIENT LIST");
    list.lines()
        .filter_map(|line| {
            let field =
                |key: &str| line.split(' ').find_map(|kv| kv.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')));
            let name = field("name").unwrap_or_default();
            (name != TEST_NAME).then(|| (field("id").unwrap().to_owned(), name.to_owned()))
        })
        .collect()
}

/// The wake connection's client id, waiting for it to be there.
async fn wake_client(con: &mut MultiplexedConnection) -> String {
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let clients = sidecar_clients(con).await;
        if let Some((id, _)) = clients.iter().find(|(_, name)| name == WAKE_NAME) {
            return id.clone();
        }
        assert!(Instant::now() < deadline, "no {WAKE_NAME} connection: {clients:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens one call per stream, group `g`, new entries only.
async fn subscribe_all(sidecar: &Sidecar, streams: &[String]) -> Vec<Consumer> {
    let mut consumers = Vec::with_capacity(streams.len());
    for stream in streams {
        consumers.push(Consumer::start(sidecar, stream, "g", GroupStart::New, 0).await);
    }
    consumers
}

/// Appends one entry (`k` = `value`) to each of `which` with a plain XADD.
async fn xadd_each(con: &mut MultiplexedConnection, streams: &[String], which: &[usize], value: &str) {
    for &i in which {
        xadd_raw(con, &streams[i], &[(b"k", value.as_bytes())]).await;
    }
}

/// Waits until each of `which` got a delivery whose `k` is `value`, all
/// within `within`; returns the slowest wait.
async fn expect_each(consumers: &mut [Consumer], which: &[usize], value: &str, within: Duration) -> Duration {
    let started = Instant::now();
    for &i in which {
        let deadline = started + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "call {i} got no `{value}` within {within:?}");
            // An ack of an entry whose group was destroyed meanwhile is answered NOT_PENDING: skip it.
            let Event::Delivery(delivery) = consumers[i].next_event(left).await else { continue };
            consumers[i].ack_one(&delivery.id).await;
            if delivery.payload.get("k").map(|v| &v[..]) == Some(value.as_bytes()) {
                break;
            }
        }
    }
    started.elapsed()
}

/// An ACL user `name` (password `pw`) that may do anything but `denied`
/// (an ACL rule: `-xlen`); the URL that logs in as it.
async fn acl_user(redis: &RedisServer, con: &mut MultiplexedConnection, name: &str, denied: &str) -> String {
    let rules = ["SETUSER", name, "on", ">pw", "~*", "&*", "+@all", denied];
    let _: () = redis::cmd("ACL").arg(&rules).query_async(con).await.unwrap();
    redis.url_with_auth(Some(name), "pw")
}

fn streams(prefix: &str, n: usize) -> Vec<String> {
    let prefix = unique(prefix);
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// 200 groups on one sidecar at its defaults: all subscribe, the sidecar
/// holds at most 4 Redis connections, entries on any stream arrive at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_groups_subscribe_on_four_connections_and_get_their_entries() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared()).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("many", 200);

    let mut consumers = subscribe_all(&sidecar, &streams).await;

    assert_eq!(sidecar.counter("echomq_reader_connection_refusals_total").await, 0.0);
    let which: Vec<usize> = (0..200).step_by(7).chain([199]).collect();
    xadd_each(&mut con, &streams, &which, "one").await;
    let took = expect_each(&mut consumers, &which, "one", EVENT_TIMEOUT).await;
    assert!(took < Duration::from_secs(3), "{} entries on as many streams took {took:?}", which.len());
    let clients = sidecar_clients(&mut con).await;
    assert!(clients.len() <= 4, "the sidecar holds {} Redis connections: {clients:?}", clients.len());
    assert_eq!(clients.iter().filter(|(_, name)| name == WAKE_NAME).count(), 1, "{clients:?}");
    assert!(clients.iter().filter(|(_, name)| name == READER_NAME).count() <= 2, "{clients:?}");
    drop(consumers);
}

/// Groups that find entries waiting when they subscribe keep sharing: the
/// first reads, done within milliseconds of the workers' start, are no read
/// rate. (Measured from the first beat, one read found 3 ms in was "333
/// reads a second" and the group blocked for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_waiting_at_subscribe_do_not_make_a_group_busy() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared()).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("waiting", 30);
    let all: Vec<usize> = (0..streams.len()).collect();
    for n in 0..3 {
        xadd_each(&mut con, &streams, &all, &format!("early-{n}")).await;
    }

    let mut consumers = Vec::with_capacity(streams.len());
    for stream in &streams {
        consumers.push(Consumer::start(&sidecar, stream, "g", GroupStart::Beginning, 0).await);
    }
    expect_each(&mut consumers, &all, "early-2", EVENT_TIMEOUT).await;
    // Past the read rate's span and the first beats.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    assert_eq!(sidecar.counter("echomq_reader_blocking").await, 0.0, "no group blocks");
    let clients = sidecar_clients(&mut con).await;
    assert!(clients.len() <= 4, "the sidecar holds {} Redis connections: {clients:?}", clients.len());
    drop(consumers);
}

/// Idle groups send no reads: no XREADGROUP and no XLEN over three
/// `--read-block-ms` periods (blocking readers would time out and read again
/// three times each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_groups_send_no_reads() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared().arg("--read-block-ms").arg("500")).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("idle", 50);
    let mut consumers = subscribe_all(&sidecar, &streams).await;
    // Each reader read once and waits.
    xadd_each(&mut con, &streams, &[0], "warm").await;
    expect_each(&mut consumers, &[0], "warm", EVENT_TIMEOUT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (reads, xlens) = (command_calls(&mut con, "xreadgroup").await, command_calls(&mut con, "xlen").await);
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let (read_after, xlen_after) = (command_calls(&mut con, "xreadgroup").await, command_calls(&mut con, "xlen").await);

    assert_eq!(read_after - reads, 0, "XREADGROUPs while 50 groups were idle");
    assert_eq!(xlen_after - xlens, 0, "XLENs while 50 groups were idle");
    // And they still wake.
    xadd_each(&mut con, &streams, &[7, 49], "later").await;
    expect_each(&mut consumers, &[7, 49], "later", Duration::from_secs(2)).await;
}

/// `auto` blocks for a busy group: a group on one sidecar whose reads find
/// entries more than 10 times a second gets a blocking reader, while a group
/// at a trickle beside it keeps sharing; once quiet (judged over a hygiene
/// beat, 250 ms here), the busy one shares again. Every entry comes once
/// across both switches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_group_blocks_and_shares_again_when_quiet() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared().arg("--consumer-idle-limit-ms").arg("1000")).await;
    let mut con = test_conn(&redis).await;
    let (busy, quiet) = (unique("busy"), unique("quiet"));
    let mut consumers = [
        Consumer::start(&sidecar, &busy, "g", GroupStart::New, 0).await,
        Consumer::start(&sidecar, &quiet, "g", GroupStart::New, 0).await,
    ];
    let appending = {
        let (url, busy, quiet) = (redis.url(), busy.clone(), quiet.clone());
        tokio::spawn(async move {
            let mut con = support::chaos::redis_conn(&url).await;
            for i in 0..400 {
                xadd_raw(&mut con, &busy, &[(b"k", format!("a-{i}").as_bytes())]).await;
                if i % 100 == 0 {
                    xadd_raw(&mut con, &quiet, &[(b"k", b"trickle")]).await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while seen.len() < 400 {
        assert!(Instant::now() < deadline, "{} of 400 busy entries came within {EVENT_TIMEOUT:?}", seen.len());
        for consumer in consumers.iter_mut() {
            if let Event::Delivery(delivery) = consumer.next_event(Duration::from_millis(5)).await {
                consumer.ack_one(&delivery.id).await;
                let value = String::from_utf8_lossy(&delivery.payload["k"]).into_owned();
                if value.starts_with("a-") {
                    *seen.entry(value).or_default() += 1;
                }
            }
        }
    }
    appending.await.unwrap();
    let twice: Vec<_> = seen.iter().filter(|(_, times)| **times > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let switched = |now: &str, stream: &str| {
        sidecar.log().lines().any(|line| line.contains(now) && line.contains(&format!("stream={stream}")))
    };
    assert!(switched("blocks on a connection of its own now", &busy), "the busy group blocked\n{}", sidecar.log());
    assert!(!switched("blocks on a connection of its own now", &quiet), "the quiet group kept sharing");
    sidecar.wait_counter("echomq_reader_blocking", 0.0).await;
    assert!(switched("shares again", &busy), "the busy group shares again once quiet");
    deliver_once(&mut con, &mut consumers[..1], &busy, "b", 50).await;
}

/// The reclaim beat is one probe for all of a sidecar's groups
/// (`reclaim_probe.lua`): 30 idle groups over about ten beats send no
/// `XAUTOCLAIM` (each group's own beat would send 300), while the probe
/// looks at every group each beat; an entry left idle by a dead consumer is
/// still reclaimed (see also `a_dead_peers_entries_are_reclaimed_among_many_groups`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_groups_share_one_reclaim_probe_per_beat() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared().reclaim(300, 100)).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("probe", 30);
    let mut consumers = subscribe_all(&sidecar, &streams).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (claims, probes) = (command_calls(&mut con, "xautoclaim").await, command_calls(&mut con, "xpending").await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(command_calls(&mut con, "xautoclaim").await - claims, 0, "idle groups sent XAUTOCLAIM");
    let probed = command_calls(&mut con, "xpending").await - probes;
    assert!(probed >= 30, "the probe looked at every group at least once: {probed} XPENDING");

    // A consumer that died holding an entry (appended and read in one
    // MULTI, so the sidecar's reader cannot take it first): the probe finds
    // it, and its group reclaims it.
    dead_peers_entry(&mut con, &streams[7], "g", b"orphan", None).await;
    expect_each(&mut consumers, &[7], "orphan", EVENT_TIMEOUT).await;
    assert!(command_calls(&mut con, "xautoclaim").await > claims, "reclaimed with XAUTOCLAIM");
}

/// The wake connection killed: every reader reads again, a new one is made,
/// and entries appended after the kill are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_wake_connection_loses_no_entry() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared()).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("wake", 20);
    let mut consumers = subscribe_all(&sidecar, &streams).await;
    let all: Vec<usize> = (0..streams.len()).collect();
    xadd_each(&mut con, &streams, &all, "before").await;
    expect_each(&mut consumers, &all, "before", EVENT_TIMEOUT).await;

    for round in 0..3 {
        let killed = wake_client(&mut con).await;
        let n: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(&killed).query_async(&mut con).await.unwrap();
        assert_eq!(n, 1);
        let value = format!("after-{round}");
        xadd_each(&mut con, &streams, &all, &value).await;
        expect_each(&mut consumers, &all, &value, Duration::from_secs(5)).await;
        assert_ne!(wake_client(&mut con).await, killed, "a new wake connection tracks the streams");
    }
    // Appended right after a kill, with no read under way: still delivered.
    let killed = wake_client(&mut con).await;
    let _: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(&killed).query_async(&mut con).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    xadd_each(&mut con, &streams, &[3, 11], "settled").await;
    expect_each(&mut consumers, &[3, 11], "settled", Duration::from_secs(5)).await;
    assert!(sidecar.log().contains("the wake connection is gone"), "the loss is logged");
}

/// Groups destroyed and streams deleted among many: NOGROUP, the group
/// re-created from 0, what the stream holds delivered again; the others
/// read on. A destroyed group with no new entry is re-created by the next
/// reclaim beat (tracking does not see XGROUP DESTROY) and read from 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroyed_groups_and_deleted_streams_among_many_recover() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared().reclaim(30_000, 500)).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("gone", 40);
    let mut consumers = subscribe_all(&sidecar, &streams).await;
    let all: Vec<usize> = (0..streams.len()).collect();
    xadd_each(&mut con, &streams, &all, "first").await;
    expect_each(&mut consumers, &all, "first", EVENT_TIMEOUT).await;

    let destroyed: Vec<usize> = (0..10).collect();
    let deleted: Vec<usize> = (10..20).collect();
    let quiet_destroyed: Vec<usize> = (20..25).collect();
    for &i in destroyed.iter().chain(&quiet_destroyed) {
        let _: i64 = redis::cmd("XGROUP").arg("DESTROY").arg(&streams[i]).arg("g").query_async(&mut con).await.unwrap();
    }
    for &i in &deleted {
        let _: i64 = redis::cmd("DEL").arg(&streams[i]).query_async(&mut con).await.unwrap();
    }
    let touched: Vec<usize> = (0..20).chain(25..40).collect();
    xadd_each(&mut con, &streams, &touched, "second").await;

    // Every touched stream delivers "second" (a destroyed group's stream
    // delivers "first" again before it: re-created from 0).
    expect_each(&mut consumers, &touched, "second", EVENT_TIMEOUT).await;
    // The quiet ones: "first" again, from 0, with no new entry to wake them.
    expect_each(&mut consumers, &quiet_destroyed, "first", Duration::from_secs(5)).await;
    assert!(sidecar.counter("echomq_group_recreations_total").await >= 25.0);
}

/// A dead peer's entries are reclaimed by the reclaim beat among many idle
/// groups, and delivered as second attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_peers_entries_are_reclaimed_among_many_groups() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared().reclaim(500, 200)).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("reclaim", 30);
    for stream in &streams {
        create_group(&mut con, stream, "g", "$").await;
    }
    // A peer read three entries of stream 5 and died holding them.
    for n in 0..3 {
        xadd_raw(&mut con, &streams[5], &[(b"k", format!("dead-{n}").as_bytes())]).await;
    }
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg(&["GROUP", "g", "dead-peer", "COUNT", "10", "STREAMS", &streams[5], ">"])
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(pending_count(&mut con, &streams[5], "g").await, 3);

    let mut consumers = subscribe_all(&sidecar, &streams).await;

    let mut got = HashMap::new();
    while got.len() < 3 {
        let delivery = consumers[5].next_delivery(EVENT_TIMEOUT).await;
        consumers[5].ack_one(&delivery.id).await;
        got.insert(delivery.payload["k"].clone(), delivery.attempts);
    }
    assert!(got.values().all(|&attempts| attempts == 2), "reclaimed entries count the peer's delivery: {got:?}");
    assert!(
        eventually(EVENT_TIMEOUT, || {
            let mut con = con.clone();
            let stream = streams[5].clone();
            async move { pending_count(&mut con, &stream, "g").await == 0 }
        })
        .await
    );
    // The other groups read on.
    xadd_each(&mut con, &streams, &[0, 29], "new").await;
    expect_each(&mut consumers, &[0, 29], "new", Duration::from_secs(3)).await;
}

/// More groups than `--shared-reader-connections` (and than
/// `--reader-connections`): none is refused (reads take turns), and each gets
/// its entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_groups_than_reader_connections_are_all_served() {
    let redis = RedisServer::start().await;
    let options = shared().arg("--shared-reader-connections").arg("1").arg("--reader-connections").arg("2");
    let sidecar = Sidecar::start(&redis, options).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("turns", 30);
    let mut consumers = subscribe_all(&sidecar, &streams).await;
    let all: Vec<usize> = (0..streams.len()).collect();
    for round in 0..3 {
        let value = format!("r{round}");
        xadd_each(&mut con, &streams, &all, &value).await;
        expect_each(&mut consumers, &all, &value, EVENT_TIMEOUT).await;
    }
    let clients = sidecar_clients(&mut con).await;
    assert_eq!(clients.iter().filter(|(_, name)| name == READER_NAME).count(), 1, "{clients:?}");
    assert_eq!(sidecar.counter("echomq_reader_connections_max").await, 3.0, "both pools' bounds");
    assert_eq!(sidecar.counter("echomq_reader_connection_refusals_total").await, 0.0);
}

/// Reader connections blocked in a command now (`flags` has `b`).
async fn blocked_readers(con: &mut MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(con).await.expect("CLIENT LIST");
    list.lines()
        .filter(|line| line.contains(&format!(" name={READER_NAME} ")))
        .filter(|line| line.split(' ').any(|kv| kv.strip_prefix("flags=").is_some_and(|flags| flags.contains('b'))))
        .count()
}

/// Appends `n` entries (`k` = `<tag>-<i>`) to `stream` and takes them from
/// `consumers`, acking each: each must come exactly once. Other entries
/// (left pending by a killed sidecar, reclaimed) are acked and not counted.
async fn deliver_once(con: &mut MultiplexedConnection, consumers: &mut [Consumer], stream: &str, tag: &str, n: usize) {
    for i in 0..n {
        xadd_raw(con, stream, &[(b"k", format!("{tag}-{i}").as_bytes())]).await;
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while seen.len() < n {
        assert!(Instant::now() < deadline, "{} of {n} `{tag}` entries came within {EVENT_TIMEOUT:?}", seen.len());
        for consumer in consumers.iter_mut() {
            if let Event::Delivery(delivery) = consumer.next_event(Duration::from_millis(20)).await {
                consumer.ack_one(&delivery.id).await;
                let value = String::from_utf8_lossy(&delivery.payload["k"]).into_owned();
                if value.starts_with(&format!("{tag}-")) {
                    *seen.entry(value).or_default() += 1;
                }
            }
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, times)| **times > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
}

/// `auto` chooses per group: five sidecars serving one group each block in
/// XREADGROUP (a shared reader would be woken by every entry on each of
/// them); when three are killed, the two left share again. Every entry comes
/// once before and after each switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_many_sidecars_serve_blocks_and_shares_again_when_few_are_left() {
    let redis = RedisServer::start().await;
    let mut con = test_conn(&redis).await;
    // Beats every 250 ms, so the count of sidecars follows within a second.
    let options = || shared().arg("--consumer-idle-limit-ms").arg("1000");
    let mut sidecars = Vec::new();
    let mut consumers = Vec::new();
    for _ in 0..5 {
        let sidecar = Sidecar::start(&redis, options()).await;
        consumers.push(Consumer::start(&sidecar, "busy", "g", GroupStart::New, 0).await);
        sidecars.push(sidecar);
    }
    for sidecar in &sidecars {
        sidecar.wait_counter("echomq_group_sidecars", 5.0).await;
        sidecar.wait_counter("echomq_reader_blocking", 1.0).await;
    }
    let blocked = blocked_readers(&mut con).await;
    assert!(blocked >= 4, "each sidecar's reader blocks in XREADGROUP (one may be between reads): {blocked}");
    deliver_once(&mut con, &mut consumers, "busy", "a", 200).await;

    consumers.truncate(2);
    for sidecar in sidecars.iter_mut().skip(2) {
        sidecar.kill9();
    }
    for sidecar in &sidecars[..2] {
        sidecar.wait_counter("echomq_group_sidecars", 2.0).await;
        sidecar.wait_counter("echomq_reader_blocking", 0.0).await;
    }
    assert_eq!(blocked_readers(&mut con).await, 0, "the two left share: none blocks");
    deliver_once(&mut con, &mut consumers, "busy", "b", 200).await;
    assert!(sidecars[0].log().contains("shares again"), "the switch is logged");
}

/// A server whose ACL refuses CLIENT TRACKING: `auto` warns once, naming the
/// flag, and reads with blocking readers; `on` refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_client_tracking_auto_falls_back_to_blocking_readers_and_on_refuses_to_start() {
    let redis = RedisServer::start().await;
    let mut con = test_conn(&redis).await;
    let url = acl_user(&redis, &mut con, "notrack", "-client|tracking").await;

    let sidecar = Sidecar::start_with_url(&url, shared()).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    xadd_raw(&mut con, "s", &[(b"k", b"v")]).await;
    assert_eq!(consumer.next_delivery(EVENT_TIMEOUT).await.payload["k"], &b"v"[..]);
    let log = sidecar.log();
    let warning = log.lines().find(|line| line.contains("instead of sharing")).expect("a warning says why");
    assert!(warning.contains("--shared-readers") && warning.contains("client|tracking"), "{warning}");
    let clients = sidecar_clients(&mut con).await;
    assert!(!clients.iter().any(|(_, name)| name == WAKE_NAME), "{clients:?}");
    assert_eq!(clients.iter().filter(|(_, name)| name == READER_NAME).count(), 1, "one blocking reader: {clients:?}");

    let mut args = local_args(&url);
    args.extend(["--shared-readers".to_owned(), "on".to_owned()]);
    let out = run_to_exit(&args, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--shared-readers on"), "{stderr}");
}

/// `--shared-readers off` keeps one blocking reader per group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_readers_off_keeps_a_blocking_reader_per_group() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--shared-readers").arg("off")).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("off", 3);
    let mut consumers = subscribe_all(&sidecar, &streams).await;
    xadd_each(&mut con, &streams, &[0, 1, 2], "v").await;
    expect_each(&mut consumers, &[0, 1, 2], "v", EVENT_TIMEOUT).await;
    let clients = sidecar_clients(&mut con).await;
    assert_eq!(clients.iter().filter(|(_, name)| name == READER_NAME).count(), 3, "{clients:?}");
    assert!(!clients.iter().any(|(_, name)| name == WAKE_NAME), "{clients:?}");
}

/// Groups with per-key limits read with `keyed_read.lua` and, with shared
/// readers, wait on the wake connection instead of an `XREAD BLOCK` each: no
/// script runs and no reader connection is held while they are idle, and an
/// entry wakes its group at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_groups_wait_on_the_wake_connection() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared().arg("--read-block-ms").arg("500")).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("keyed", 20);
    let mut consumers = Vec::new();
    for stream in &streams {
        let subscribe = echomq::proto::Subscribe {
            key_field: "acct".to_owned(),
            max_in_flight_per_key: 1,
            ..subscribe_msg(stream, "g", GroupStart::New)
        };
        consumers.push(Consumer::subscribe(&sidecar, subscribe).await);
    }
    fn keyed(value: &str) -> [(&[u8], &[u8]); 2] {
        [(b"acct", b"a1"), (b"k", value.as_bytes())]
    }
    xadd_raw(&mut con, &streams[0], &keyed("warm")).await;
    expect_each(&mut consumers, &[0], "warm", EVENT_TIMEOUT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let scripts = command_calls(&mut con, "evalsha").await + command_calls(&mut con, "eval").await;
    let (xreads, xreadgroups) = (command_calls(&mut con, "xread").await, command_calls(&mut con, "xreadgroup").await);
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    // The heartbeat is a script too, every 10 s per group: at most one round
    // of those (a keyed read every --read-block-ms would be 60).
    let scripts_after = command_calls(&mut con, "evalsha").await + command_calls(&mut con, "eval").await;
    assert!(scripts_after - scripts <= streams.len() as u64, "{} scripts while idle", scripts_after - scripts);
    assert_eq!(command_calls(&mut con, "xread").await - xreads, 0, "no XREAD BLOCK waits");
    assert_eq!(command_calls(&mut con, "xreadgroup").await - xreadgroups, 0, "no reads while idle");
    let clients = sidecar_clients(&mut con).await;
    assert!(clients.len() <= 4, "{clients:?}");

    let started = Instant::now();
    for i in [3, 19] {
        xadd_raw(&mut con, &streams[i], &keyed("later")).await;
    }
    expect_each(&mut consumers, &[3, 19], "later", Duration::from_secs(2)).await;
    assert!(started.elapsed() < Duration::from_millis(400), "woken in {:?}", started.elapsed());
}

/// The primary fails over (Sentinel): the wake connection follows it to the
/// promoted replica, and entries appended there wake their groups at once,
/// not at the read-block poll the readers fall back to without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wake_connection_follows_a_failover() {
    let mut deployment = support::sentinel::SentinelDeployment::start(1).await;
    let sidecar = Sidecar::start_with_url(
        &deployment.url(),
        SidecarOptions::default().arg("--shared-readers").arg("on").arg("--read-block-ms").arg("10000"),
    )
    .await;
    let streams = streams("failover", 10);
    let mut consumers = subscribe_all(&sidecar, &streams).await;
    let old = deployment.primary_port().await.expect("a primary");
    let mut con = test_conn(deployment.node(old)).await;
    wake_client(&mut con).await;

    deployment.node_mut(old).kill9();
    let new = deployment.until_failed_over(old, Duration::from_secs(30)).await;
    let mut con = test_conn(deployment.node(new)).await;
    assert!(eventually(Duration::from_secs(15), || async { sidecar.readyz().await == Some(200) }).await);
    wake_client(&mut con).await;
    // Each group reads once on the new primary and then waits on its wake-up.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let all: Vec<usize> = (0..streams.len()).collect();
    let started = Instant::now();
    xadd_each(&mut con, &streams, &all, "after").await;
    expect_each(&mut consumers, &all, "after", EVENT_TIMEOUT).await;
    assert!(started.elapsed() < Duration::from_secs(3), "woken in {:?}, not by a poll", started.elapsed());
}

/// An ACL that refuses XLEN to the sidecar: the wake connection cannot arm,
/// so the readers poll every `--read-block-ms` instead, which is said once,
/// and entries are still delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_xlen_readers_poll_and_say_so_once() {
    let redis = RedisServer::start().await;
    let mut con = test_conn(&redis).await;
    let url = acl_user(&redis, &mut con, "noxlen", "-xlen").await;
    let options = shared().arg("--read-block-ms").arg("300");
    let sidecar = Sidecar::start_with_url(&url, options).await;
    let streams = streams("noxlen", 3);
    let mut consumers = subscribe_all(&sidecar, &streams).await;
    for round in 0..2 {
        let value = format!("v{round}");
        xadd_each(&mut con, &streams, &[0, 1, 2], &value).await;
        expect_each(&mut consumers, &[0, 1, 2], &value, Duration::from_secs(3)).await;
    }
    let log = sidecar.log();
    assert_eq!(log.lines().filter(|line| line.contains("may not run XLEN")).count(), 1, "{log}");
}

/// `HGETALL` of a group's heartbeats (`<stream>:heartbeats:<group>`): each sidecar's last beat.
async fn heartbeats(con: &mut MultiplexedConnection, stream: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL").arg(format!("{stream}:heartbeats:g")).query_async(con).await.unwrap()
}

/// Groups whose calls all left retire after two hygiene beats (250 ms each
/// here): their series leave `/metrics` (no gauge frozen at its last value),
/// their heartbeats stop, and an entry a call held unanswered when it left
/// comes back to the next call, with its attempts counted, from a new worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_whose_calls_left_retire_and_come_back_when_called() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared().arg("--consumer-idle-limit-ms").arg("1000")).await;
    let mut con = test_conn(&redis).await;
    let streams = streams("retire", 20);
    let mut consumers = subscribe_all(&sidecar, &streams).await;
    let all: Vec<usize> = (0..streams.len()).collect();
    xadd_each(&mut con, &streams, &all, "first").await;
    expect_each(&mut consumers, &all, "first", EVENT_TIMEOUT).await;
    // Call 3 takes an entry and leaves without a verdict.
    xadd_each(&mut con, &streams, &[3], "held").await;
    let held = consumers[3].next_delivery(EVENT_TIMEOUT).await;
    assert_eq!((&held.payload["k"][..], held.attempts), (b"held".as_slice(), 1));
    let series = |stream: &str| format!("echomq_consume_calls{{stream=\"{stream}\"");
    let metrics = http_get(sidecar.admin_port(), "/metrics").await.expect("GET /metrics").body;
    assert!(metrics.contains(&series(&streams[3])), "a served group has its series");
    let beating = heartbeats(&mut con, &streams[3]).await;
    assert_eq!(beating.len(), 1, "this sidecar beats for the group: {beating:?}");

    drop(consumers);
    let retired = eventually(Duration::from_secs(10), || {
        let port = sidecar.admin_port();
        let streams = streams.clone();
        async move {
            let metrics = http_get(port, "/metrics").await.expect("GET /metrics").body;
            // Every series of the stream: the group's, and its stream's appends and trimmed-unread at zero.
            streams.iter().all(|stream| !metrics.contains(&format!("stream=\"{stream}\"")))
        }
    })
    .await;
    assert!(retired, "every series of the groups left /metrics once their workers retired");
    let last = heartbeats(&mut con, &streams[3]).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(heartbeats(&mut con, &streams[3]).await, last, "no heartbeat from a retired worker (4 beats' time)");
    assert_eq!(pending_count(&mut con, &streams[3], "g").await, 1, "the unanswered entry is still pending");

    // A new call is served by a new worker: the held entry first, then new ones.
    let mut again = Consumer::start(&sidecar, &streams[3], "g", GroupStart::New, 0).await;
    let back = again.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!((back.id.as_str(), back.attempts), (held.id.as_str(), 2), "the held entry comes back, attempts counted");
    again.ack_one(&back.id).await;
    xadd_each(&mut con, &streams, &[3], "after").await;
    expect_each(std::slice::from_mut(&mut again), &[0], "after", EVENT_TIMEOUT).await;
    let metrics = http_get(sidecar.admin_port(), "/metrics").await.expect("GET /metrics").body;
    assert!(metrics.contains(&series(&streams[3])), "the group's series are back with its worker");
    assert!(!metrics.contains(&series(&streams[4])), "a group still without calls stays retired");
}

/// The sum of every series of the metric family `name` in a /metrics text.
fn summed(metrics: &str, name: &str) -> f64 {
    let series = format!("{name}{{");
    metrics.lines().filter(|l| l.starts_with(&series)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// A Redis outage under 50 groups: every group's steps fail, but the log
/// gets about one WARN line a second for all of them (saying how many more
/// failed), not one per group and step; `echomq_redis_errors_total` counts
/// each. The groups are served again after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_under_many_groups_is_logged_a_line_a_second() {
    let mut redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, shared()).await;
    let streams = streams("outage", 50);
    let mut consumers = subscribe_all(&sidecar, &streams).await;
    let all: Vec<usize> = (0..streams.len()).collect();
    {
        let mut con = test_conn(&redis).await;
        xadd_each(&mut con, &streams, &all, "before").await;
    }
    expect_each(&mut consumers, &all, "before", EVENT_TIMEOUT).await;

    redis.kill9();
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis.restart().await;
    let outage = down.elapsed();
    let mut con = test_conn(&redis).await;
    xadd_each(&mut con, &streams, &all, "after").await;
    expect_each(&mut consumers, &all, "after", Duration::from_secs(30)).await;

    let log = sidecar.log();
    let warned = log.lines().filter(|l| l.contains("WARN") && l.contains("failed, retrying in")).count();
    let metrics = http_get(sidecar.admin_port(), "/metrics").await.expect("GET /metrics").body;
    let counted = summed(&metrics, "echomq_redis_errors_total");
    assert!(counted >= 50.0, "each group's failed steps are counted: {counted}");
    let most = outage.as_secs() as usize + 3;
    assert!(
        warned <= most,
        "{warned} WARN lines of failed steps over a {outage:?} outage, want at most {most}:\n{log}"
    );
    assert!(log.contains("since the last such line, logged at DEBUG"), "{log}");

    // Redis came back empty: every group was re-created, a line a second.
    let recreated = summed(&metrics, "echomq_group_recreations_total");
    assert!(recreated >= 50.0, "each re-created group is counted: {recreated}");
    let told = log.lines().filter(|l| l.contains("INFO") && l.contains("group re-created from the start")).count();
    assert!(told <= most, "{told} INFO lines of re-created groups, want at most {most}:\n{log}");
    assert!(told >= 1, "a re-created group is told at INFO:\n{log}");
    // The burst's count comes once it is over, not with the next burst.
    let counted = || async { sidecar.log().contains("more groups re-created or found again since the last such line") };
    assert!(eventually(EVENT_TIMEOUT, counted).await, "the held-back re-creations are counted:\n{}", sidecar.log());
}
