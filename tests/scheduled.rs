//! Scheduled entries (Append's `deliver_at`/`delay`, CancelScheduled,
//! ListScheduled, the mover) against a real redis-server: invisible before
//! their time, in the stream once after it with the branded id Append
//! answered, across a kill -9 mid-move and two racing sidecars.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::{
    collections::HashSet,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use echomq::proto::{
    AppendBatchRequest, AppendRequest, AppendResponse, BatchEntry, CancelScheduledRequest, GroupStart,
    ListScheduledRequest,
};
use redis::aio::MultiplexedConnection;
use support::*;
use tonic::Code;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn at(ms: u64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 })
}

fn after(ms: u64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 })
}

/// A sidecar whose mover polls every 20 ms.
fn polling() -> SidecarOptions {
    SidecarOptions::default().arg("--schedule-poll-ms").arg("20")
}

async fn schedule(sidecar: &Sidecar, stream: &str, value: &str, delay_ms: u64) -> AppendResponse {
    sidecar
        .stream_client()
        .await
        .append(AppendRequest {
            stream: stream.into(),
            fields: fields(&[("v", value.as_bytes())]),
            delay: after(delay_ms),
            ..Default::default()
        })
        .await
        .expect("scheduled append")
        .into_inner()
}

/// The values of the reserved `id` field in the stream, in stream order (XRANGE, paged).
async fn branded_ids(conn: &mut MultiplexedConnection, stream: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut start = "-".to_owned();
    loop {
        let page: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(1_000)
            .query_async(conn)
            .await
            .unwrap();
        let Some((last, _)) = page.last() else { return ids };
        start = format!("({last}");
        for (_, fields) in &page {
            let id = fields.chunks(2).find(|pair| pair[0] == b"id").expect("every entry carries its branded id");
            ids.push(String::from_utf8(id[1].clone()).unwrap());
        }
    }
}

async fn zcard(conn: &mut MultiplexedConnection, key: &str) -> u64 {
    redis::cmd("ZCARD").arg(key).query_async(conn).await.unwrap()
}

async fn xlen(conn: &mut MultiplexedConnection, key: &str) -> u64 {
    redis::cmd("XLEN").arg(key).query_async(conn).await.unwrap()
}

/// Waits until `stream` holds `n` entries; the time it took.
async fn wait_len(conn: &mut MultiplexedConnection, stream: &str, n: u64, timeout: Duration) -> Duration {
    let started = Instant::now();
    while xlen(conn, stream).await < n {
        assert!(started.elapsed() < timeout, "{stream} did not reach {n} entries in {timeout:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_entry_is_invisible_before_its_time_and_consumed_once_after() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling()).await;
    let mut conn = redis.conn().await;
    let mut consumer = Consumer::subscribe(&sidecar, subscribe_msg("orders", "g", GroupStart::Beginning)).await;

    let before = now_ms();
    let scheduled = schedule(&sidecar, "orders", "later", 1_500).await;
    assert!(scheduled.scheduled, "{scheduled:?}");
    assert!(scheduled.stream_id.is_empty(), "no stream id before the move: {scheduled:?}");
    assert!(is_branded(&scheduled.id), "{scheduled:?}");
    assert_eq!(scheduled.stream, "orders");
    // The branded id is reserved: a plain append made now gets a larger one.
    let plain = sidecar.append("orders", &[("v", b"now")]).await;
    assert!(!plain.scheduled);
    assert!(plain.id > scheduled.id, "a later append mints after the reserved id: {plain:?} {scheduled:?}");
    let first = consumer.next_delivery(Duration::from_secs(5)).await;
    assert_eq!(first.id, plain.id);
    consumer.ack_one(&first.id).await;
    // Quiet until just before its time, however long the above took.
    let until_due = (before + 1_500).saturating_sub(now_ms() + 100);
    consumer.assert_quiet(Duration::from_millis(until_due), "the scheduled entry is not due yet").await;
    assert_eq!(branded_ids(&mut conn, "orders").await, vec![plain.id.clone()], "invisible to XRANGE before its time");

    let delivered = consumer.next_delivery(Duration::from_secs(5)).await;
    let entered = now_ms();
    assert_eq!(delivered.id, scheduled.id, "delivered with the branded id Append answered");
    assert_eq!(delivered.payload.get("v").map(|v| &v[..]), Some(&b"later"[..]));
    assert!(entered >= before + 1_500, "not before its time: {} ms", entered - before);
    assert!(entered <= before + 1_500 + 1_000, "within a second of its time: {} ms", entered - before);
    consumer.ack_one(&delivered.id).await;
    consumer.assert_quiet(Duration::from_millis(500), "moved once").await;
    assert_eq!(branded_ids(&mut conn, "orders").await, [plain.id.clone(), scheduled.id.clone()]);
    assert_eq!(zcard(&mut conn, "orders:scheduled").await, 0, "the schedule is empty");
    assert_eq!(zcard(&mut conn, "echomq:scheduled-index").await, 0, "the index is empty");
    let exists: u64 = redis::cmd("EXISTS").arg("orders:scheduled:entries").query_async(&mut conn).await.unwrap();
    assert_eq!(exists, 0, "no key is left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_stream_is_created_empty_and_its_id_reserved() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--schedule-poll-ms").arg("60000")).await;
    let mut conn = redis.conn().await;

    let scheduled = schedule(&sidecar, "fresh", "x", 60_000).await;
    assert!(scheduled.scheduled);
    assert_eq!(xlen(&mut conn, "fresh").await, 0, "the stream exists, empty");
    let groups: Vec<redis::Value> =
        redis::cmd("XINFO").arg("GROUPS").arg("fresh").query_async(&mut conn).await.unwrap();
    assert!(groups.is_empty(), "the group that created it is gone: {groups:?}");
    let info: std::collections::HashMap<String, redis::Value> =
        redis::cmd("XINFO").arg("STREAM").arg("fresh").query_async(&mut conn).await.unwrap();
    let last = match &info["last-generated-id"] {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(branded_from_stream_id(&last), scheduled.id, "the last generated id is the reserved one");
    if let Some(redis::Value::BulkString(deleted)) = info.get("max-deleted-entry-id") {
        assert_eq!(deleted, b"0-0", "no tombstone (Redis 7 would miscount group lag)");
    }
    // A plain XADD * by another producer cannot take it either.
    let other: String =
        redis::cmd("XADD").arg("fresh").arg("*").arg("k").arg("v").query_async(&mut conn).await.unwrap();
    assert!(branded_from_stream_id(&other) > scheduled.id, "{other}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_that_never_touches_the_stream_moves_it() {
    let redis = RedisServer::start().await;
    let mut mover_less = Sidecar::start(&redis, SidecarOptions::default().arg("--schedule-poll-ms").arg("60000")).await;
    let scheduled = schedule(&mover_less, "quiet", "x", 300).await;
    mover_less.kill9();
    let mut conn = redis.conn().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(xlen(&mut conn, "quiet").await, 0, "nobody has moved it yet");

    // Another sidecar, which is asked nothing about the stream.
    let _other = Sidecar::start(&redis, polling()).await;
    wait_len(&mut conn, "quiet", 1, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(branded_ids(&mut conn, "quiet").await, [scheduled.id]);
}

/// An idle mover sleeps up to `--schedule-idle-poll-ms`, a minute here, but
/// an entry its own sidecar schedules wakes it at the due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_mover_wakes_for_an_entry_its_sidecar_scheduled() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling().arg("--schedule-idle-poll-ms").arg("60000")).await;
    let mut conn = redis.conn().await;
    // Let the mover's first poll find the index empty and go to sleep for its minute.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let scheduled = schedule(&sidecar, "woken", "x", 300).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(xlen(&mut conn, "woken").await, 0, "not before its time");
    wait_len(&mut conn, "woken", 1, Duration::from_secs(5)).await;
    assert_eq!(branded_ids(&mut conn, "woken").await, [scheduled.id]);
}

/// A schedule key of another type is named in the error, not only the
/// stream (which may not even exist), for a scheduled append and a listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_key_of_another_type_is_named() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling()).await;
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("SET").arg("x2:scheduled").arg("oops").query_async(&mut conn).await.unwrap();
    let request = AppendRequest {
        stream: "x2".into(),
        fields: fields(&[("a", b"1")]),
        delay: after(2_000),
        ..Default::default()
    };
    let status = sidecar.stream_client().await.append(request).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("`x2:scheduled` (a sorted set)"), "{}", status.message());
    let listing = ListScheduledRequest { stream: "x2".into(), ..Default::default() };
    let status = sidecar.stream_client().await.list_scheduled(listing).await.unwrap_err();
    assert!(status.message().contains("`x2:scheduled`"), "{}", status.message());
}

/// 20,000 entries due at once; the mover is killed -9 part-way through; another
/// sidecar finishes: each branded id is in the stream exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_during_the_move_leaves_each_entry_moved_exactly_once() {
    let redis = RedisServer::start().await;
    let mut first = Sidecar::start(&redis, SidecarOptions::default().arg("--schedule-poll-ms").arg("10")).await;
    let mut conn = redis.conn().await;
    // Far enough ahead that both batches are scheduled before it, even on a busy machine.
    let due = now_ms() + 6_000;
    let mut minted = Vec::new();
    for chunk in 0..2 {
        let entries = (0..10_000)
            .map(|i| BatchEntry {
                fields: fields(&[("n", (chunk * 10_000 + i).to_string().as_bytes())]),
                deliver_at: at(due),
                ..Default::default()
            })
            .collect();
        let written = first.append_batch("many", entries).await;
        assert!(written.iter().all(|e| e.scheduled));
        minted.extend(written.into_iter().map(|e| e.id));
    }
    assert_eq!(minted.iter().collect::<HashSet<_>>().len(), 20_000, "every branded id is distinct");
    assert!(now_ms() < due, "scheduling took past the due time: the machine is too busy for this test");
    assert_eq!(xlen(&mut conn, "many").await, 0);

    // Kill the mover as soon as the first entries are in.
    wait_len(&mut conn, "many", 1, Duration::from_secs(10)).await;
    first.kill9();
    let in_stream = xlen(&mut conn, "many").await;
    let left = zcard(&mut conn, "many:scheduled").await;
    assert!(in_stream < 20_000, "killed part-way through the move: {in_stream} in the stream");
    assert_eq!(in_stream + left, 20_000, "each entry moved or still scheduled, never both, never neither");

    // The next sidecar waits out the dead one's move lease, then finishes.
    let _second = Sidecar::start(&redis, SidecarOptions::default().arg("--schedule-poll-ms").arg("10")).await;
    wait_len(&mut conn, "many", 20_000, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids = branded_ids(&mut conn, "many").await;
    assert_eq!(ids.len(), 20_000, "no entry twice");
    assert_eq!(ids.iter().collect::<HashSet<_>>(), minted.iter().collect::<HashSet<_>>(), "each exactly once");
    assert_eq!(zcard(&mut conn, "many:scheduled").await, 0);
    assert_eq!(zcard(&mut conn, "echomq:scheduled-index").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_racing_move_each_entry_once() {
    let redis = RedisServer::start().await;
    let a = Sidecar::start(&redis, SidecarOptions::default().arg("--schedule-poll-ms").arg("10")).await;
    let b = Sidecar::start(&redis, SidecarOptions::default().arg("--schedule-poll-ms").arg("10")).await;
    let mut conn = redis.conn().await;
    let streams = ["race-0", "race-1", "race-2", "race-3"];
    let mut minted: Vec<(String, String)> = Vec::new();
    // Both sidecars schedule, at staggered times, onto the same streams.
    for round in 0..20u64 {
        for (i, stream) in streams.iter().enumerate() {
            let sidecar = if (round as usize + i).is_multiple_of(2) { &a } else { &b };
            let entries = (0..50)
                .map(|n| BatchEntry {
                    fields: fields(&[("n", n.to_string().as_bytes())]),
                    delay: after(200 + 25 * round),
                    ..Default::default()
                })
                .collect();
            let written = sidecar.append_batch(stream, entries).await;
            minted.extend(written.into_iter().map(|e| (stream.to_string(), e.id)));
        }
    }
    for stream in streams {
        wait_len(&mut conn, stream, 1_000, Duration::from_secs(15)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for stream in streams {
        let ids = branded_ids(&mut conn, stream).await;
        let expected: HashSet<&String> = minted.iter().filter(|(s, _)| s == stream).map(|(_, id)| id).collect();
        assert_eq!(ids.len(), 1_000, "{stream}: no entry twice");
        assert_eq!(ids.iter().collect::<HashSet<_>>(), expected, "{stream}: each exactly once");
    }
    assert_eq!(zcard(&mut conn, "echomq:scheduled-index").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_the_move_removes_it_and_after_is_not_found() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling()).await;
    let mut client = sidecar.stream_client().await;
    let mut conn = redis.conn().await;
    let cancelled = schedule(&sidecar, "c", "cancelled", 800).await;
    let kept = schedule(&sidecar, "c", "kept", 800).await;

    let response = client
        .cancel_scheduled(CancelScheduledRequest { stream: "c".into(), id: cancelled.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert!(response.deliver_at.is_some());
    let listed = client
        .list_scheduled(ListScheduledRequest { stream: "c".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), [kept.id.as_str()]);
    assert_eq!(listed.total, 1);

    wait_len(&mut conn, "c", 1, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(branded_ids(&mut conn, "c").await, vec![kept.id.clone()], "the cancelled entry never enters");
    for id in [&kept.id, &cancelled.id] {
        let status = client
            .cancel_scheduled(CancelScheduledRequest { stream: "c".into(), id: id.clone() })
            .await
            .expect_err("moved or cancelled");
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert!(status.message().contains(id.as_str()), "{status:?}");
    }
    assert_eq!(branded_ids(&mut conn, "c").await, vec![kept.id.clone()], "cancel after the move removes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_by_due_time_then_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling()).await;
    let mut client = sidecar.stream_client().await;
    let base = now_ms() + 600_000;
    // Three entries per due time, appended in reverse due order.
    let entries = (0..25u64)
        .map(|n| BatchEntry {
            fields: fields(&[("n", n.to_string().as_bytes())]),
            deliver_at: at(base + (24 - n) / 3 * 1_000),
            ..Default::default()
        })
        .collect();
    let minted = sidecar.append_batch("l", entries).await;
    let mut expected: Vec<(u64, String)> =
        minted.iter().enumerate().map(|(n, e)| (base + (24 - n as u64) / 3 * 1_000, e.id.clone())).collect();
    expected.sort();
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_scheduled(ListScheduledRequest { stream: "l".into(), page_token: token.clone(), count: 10 })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.total, 25);
        assert!(page.entries.len() <= 10);
        for entry in &page.entries {
            let due = entry.deliver_at.unwrap();
            seen.push((due.seconds as u64 * 1000 + due.nanos as u64 / 1_000_000, entry.id.clone()));
            assert!(entry.fields.contains_key("n"), "{entry:?}");
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, expected, "every entry once, by due time then branded id");
    let bad = client
        .list_scheduled(ListScheduledRequest { stream: "l".into(), page_token: "nonsense".into(), count: 0 })
        .await
        .expect_err("a malformed token");
    assert_eq!(bad.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_mixes_plain_and_scheduled_entries_with_consecutive_ids() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling()).await;
    let mut conn = redis.conn().await;
    let entries = (0..6u64)
        .map(|n| BatchEntry {
            fields: fields(&[("n", n.to_string().as_bytes())]),
            delay: if n % 2 == 1 { after(500) } else { None },
            ..Default::default()
        })
        .collect();
    let written = sidecar.append_batch("mixed", entries).await;
    for (n, entry) in written.iter().enumerate() {
        assert_eq!(entry.scheduled, n % 2 == 1, "{entry:?}");
        assert_eq!(entry.stream_id.is_empty(), entry.scheduled, "{entry:?}");
    }
    for pair in written.windows(2) {
        assert!(pair[0].id < pair[1].id, "ids in request order: {pair:?}");
    }
    let plain: Vec<String> = written.iter().filter(|e| !e.scheduled).map(|e| e.id.clone()).collect();
    assert_eq!(branded_ids(&mut conn, "mixed").await, plain, "the plain ones are in at once");
    wait_len(&mut conn, "mixed", 6, Duration::from_secs(5)).await;
    let all = branded_ids(&mut conn, "mixed").await;
    assert_eq!(all.iter().collect::<HashSet<_>>(), written.iter().map(|e| &e.id).collect::<HashSet<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedup_key_makes_a_scheduled_append_idempotent() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling()).await;
    let mut conn = redis.conn().await;
    let request = AppendRequest {
        stream: "d".into(),
        fields: fields(&[("v", b"once")]),
        delay: after(400),
        dedup_key: "order-7".into(),
        ..Default::default()
    };
    let first = sidecar.stream_client().await.append(request.clone()).await.unwrap().into_inner();
    let again = sidecar.stream_client().await.append(request.clone()).await.unwrap().into_inner();
    assert!(first.scheduled && !first.duplicate, "{first:?}");
    assert!(again.scheduled && again.duplicate, "{again:?}");
    assert_eq!(again.id, first.id);
    assert!(again.stream_id.is_empty());
    wait_len(&mut conn, "d", 1, Duration::from_secs(5)).await;
    let after_move = sidecar.stream_client().await.append(request).await.unwrap().into_inner();
    assert!(after_move.duplicate && after_move.id == first.id, "{after_move:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(branded_ids(&mut conn, "d").await, [first.id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedules_are_refused_and_the_past_is_appended_at_once() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling()).await;
    let mut client = sidecar.stream_client().await;
    let mut conn = redis.conn().await;

    // In the past: appended at once, as a plain append.
    let past = client
        .append(AppendRequest {
            stream: "b".into(),
            fields: fields(&[("v", b"past")]),
            deliver_at: at(now_ms() - 60_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!past.scheduled, "{past:?}");
    assert_eq!(past.id, branded_from_stream_id(&past.stream_id));
    assert_eq!(branded_ids(&mut conn, "b").await, vec![past.id.clone()]);

    let year = 365 * 86_400_000u64;
    let refused = [
        (
            "beyond the horizon",
            AppendRequest { deliver_at: at(now_ms() + year + 86_400_000), ..Default::default() },
            "365 days",
        ),
        (
            "delay beyond the horizon",
            AppendRequest { delay: after(year + 86_400_000), ..Default::default() },
            "365 days",
        ),
        (
            "both",
            AppendRequest { deliver_at: at(now_ms() + 1_000), delay: after(1_000), ..Default::default() },
            "not both",
        ),
        (
            "a negative delay",
            AppendRequest { delay: Some(prost_types::Duration { seconds: -1, nanos: 0 }), ..Default::default() },
            "negative",
        ),
        (
            "a delay of mixed signs",
            AppendRequest { delay: Some(prost_types::Duration { seconds: 5, nanos: -1 }), ..Default::default() },
            "different signs",
        ),
        (
            "the last instant a Timestamp holds",
            AppendRequest {
                deliver_at: Some(prost_types::Timestamp { seconds: i64::MAX, nanos: 0 }),
                ..Default::default()
            },
            "9223372036854775807 s after the unix epoch",
        ),
        ("with max_len", AppendRequest { delay: after(1_000), max_len: 10, ..Default::default() }, "max_len"),
    ];
    for (what, request, says) in refused {
        let request = AppendRequest { stream: "b".into(), fields: fields(&[("v", b"x")]), ..request };
        let status = client.append(request).await.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(status.message().contains(says), "{what}: {status:?}");
    }
    // A batch with one bad entry writes none.
    let entries = vec![
        BatchEntry { fields: fields(&[("v", b"ok")]), delay: after(1_000), ..Default::default() },
        BatchEntry {
            fields: fields(&[("v", b"bad")]),
            delay: after(1_000),
            deliver_at: at(now_ms()),
            ..Default::default()
        },
    ];
    let status = client
        .append_batch(AppendBatchRequest { stream: "b".into(), entries, ..Default::default() })
        .await
        .expect_err("one bad entry");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("entries.deliver_at"), "{status:?}");
    assert!(status.message().contains("entry 1 of the batch"), "names the bad entry: {status:?}");
    assert_eq!(zcard(&mut conn, "b:scheduled").await, 0, "nothing scheduled");
    assert_eq!(branded_ids(&mut conn, "b").await, [past.id], "nothing appended");
    let status = client
        .cancel_scheduled(CancelScheduledRequest { stream: "b".into(), id: "not-an-id".into() })
        .await
        .expect_err("a malformed id");
    assert_eq!(status.code(), Code::InvalidArgument);
}

async fn describe(sidecar: &Sidecar) -> echomq::proto::DescribeGroupResponse {
    let request = echomq::proto::DescribeGroupRequest { stream: "m".into(), group: "g".into() };
    sidecar.admin_client().await.describe_group(request).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_and_metrics_show_the_scheduled_count_and_the_earliest_due_time() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling().arg("--metrics-poll-interval-ms").arg("100")).await;
    let _call = Consumer::subscribe(&sidecar, subscribe_msg("m", "g", GroupStart::Beginning)).await;
    let due = now_ms() + 2_000;
    let mut client = sidecar.stream_client().await;
    for offset in [0, 500, 1_000] {
        client
            .append(AppendRequest {
                stream: "m".into(),
                fields: fields(&[("v", b"x")]),
                deliver_at: at(due + offset),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let described = describe(&sidecar).await;
    assert_eq!(described.scheduled, 3, "{described:?}");
    assert_eq!(described.oldest_scheduled_due, at(due), "{described:?}");
    let started = Instant::now();
    loop {
        let count = sidecar.counter("echomq_scheduled").await;
        let oldest = sidecar.counter("echomq_scheduled_oldest_due_timestamp_seconds").await;
        if count == 3.0 && (oldest - due as f64 / 1000.0).abs() < 0.001 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "gauges: {count} scheduled, oldest due {oldest}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Once all are in, both come back to zero.
    let mut conn = redis.conn().await;
    wait_len(&mut conn, "m", 3, Duration::from_secs(10)).await;
    let started = Instant::now();
    while sidecar.counter("echomq_scheduled").await != 0.0
        || sidecar.counter("echomq_scheduled_oldest_due_timestamp_seconds").await != 0.0
    {
        assert!(started.elapsed() < Duration::from_secs(5), "the gauges did not come back to zero");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let described = describe(&sidecar).await;
    assert_eq!((described.scheduled, described.oldest_scheduled_due), (0, None));
}

/// A scheduled entry's fields are stored and moved byte for byte: binary
/// values, colons and digits (the stored encoding's own characters), empty
/// values, unicode names; the trace context Append stores comes along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_entry_keeps_its_fields_byte_for_byte() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling()).await;
    let mut conn = redis.conn().await;
    let awkward: Vec<(&str, Vec<u8>)> = vec![
        ("bin", vec![0, 255, b':', 10, 0]),
        ("12:", b"3:abc".to_vec()),
        ("empty", Vec::new()),
        ("ünï 🚀", "välue".as_bytes().to_vec()),
        ("big", vec![b'x'; 100_000]),
    ];
    let pairs: Vec<(&str, &[u8])> = awkward.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    let mut request = tonic::Request::new(AppendRequest {
        stream: "bytes".into(),
        fields: fields(&pairs),
        delay: after(300),
        ..Default::default()
    });
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    request.metadata_mut().insert("traceparent", traceparent.parse().unwrap());
    let scheduled = sidecar.stream_client().await.append(request).await.unwrap().into_inner();
    let listed = sidecar
        .stream_client()
        .await
        .list_scheduled(ListScheduledRequest { stream: "bytes".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    for (name, value) in &awkward {
        assert_eq!(listed.entries[0].fields.get(*name), Some(value), "listed {name:?}");
    }
    wait_len(&mut conn, "bytes", 1, Duration::from_secs(5)).await;
    let entry = xrange(&mut conn, "bytes").await.pop().unwrap();
    for (name, value) in &awkward {
        assert_eq!(entry.field(name), Some(value.as_slice()), "moved {name:?}");
    }
    assert_eq!(entry.field("id"), Some(scheduled.id.as_bytes()));
    assert_eq!(entry.field("traceparent"), Some(traceparent.as_bytes()), "the trace context comes along");
    assert_eq!(entry.fields.len(), awkward.len() + 2, "the fields, the branded id and the trace context: {entry:?}");
}

/// A sharded stream: each scheduled entry waits in its shard's schedule and
/// enters that shard with a stream id of the shard's stride (sequence ≡ k
/// modulo the shard count), as a plain append's; the sharded stream's name is
/// refused by ListScheduled and CancelScheduled, which take a shard's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_streams_entries_wait_and_enter_in_their_shard_with_its_stride() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, polling().arg("--sharded-streams").arg("sh=2")).await;
    let mut conn = redis.conn().await;
    let mut client = sidecar.stream_client().await;
    let mut written = Vec::new();
    for n in 0..10 {
        let request = AppendRequest {
            stream: "sh".into(),
            fields: fields(&[("n", n.to_string().as_bytes())]),
            delay: after(400),
            ..Default::default()
        };
        written.push(client.append(request).await.unwrap().into_inner());
    }
    for call in ["list", "cancel"] {
        let status = match call {
            "list" => client
                .list_scheduled(ListScheduledRequest { stream: "sh".into(), ..Default::default() })
                .await
                .map(drop),
            _ => client
                .cancel_scheduled(CancelScheduledRequest { stream: "sh".into(), id: written[0].id.clone() })
                .await
                .map(drop),
        }
        .expect_err("the sharded stream's name");
        assert_eq!(status.code(), Code::InvalidArgument, "{call}: {status:?}");
        assert!(status.message().contains("sh:{sh:0}"), "{call} names a shard key: {status:?}");
    }
    for k in 0..2u64 {
        let shard = format!("sh:{{sh:{k}}}");
        let mine: Vec<&AppendResponse> = written.iter().filter(|w| w.stream == shard).collect();
        assert_eq!(mine.len(), 5, "{shard}: taken in turn");
        wait_len(&mut conn, &shard, 5, Duration::from_secs(5)).await;
        let entries = xrange(&mut conn, &shard).await;
        for entry in &entries {
            let seq: u64 = entry.stream_id.split('-').nth(1).unwrap().parse().unwrap();
            assert_eq!(seq % 2, k, "{shard}: stream id {} keeps the shard's stride", entry.stream_id);
        }
        let ids: HashSet<&[u8]> = entries.iter().map(|e| e.field("id").unwrap()).collect();
        assert_eq!(ids, mine.iter().map(|w| w.id.as_bytes()).collect::<HashSet<_>>(), "{shard}");
    }
}
