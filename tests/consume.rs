//! ConsumerService.Consume: subscribing, deliveries, verdicts, flow control and
//! sharing, against a real redis-server and the real sidecar binary.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use echomq::proto::consume_request::Kind;
use echomq::proto::{
    Ack, AppendBatchRequest, BatchEntry, Drain, Fail, FailKind, GroupStart, RawField, Release, VerdictErrorCode,
};
use support::*;
use tonic::Code;

const SHORT: Duration = Duration::from_millis(1500);

async fn append_n(sidecar: &Sidecar, stream: &str, n: usize) -> Vec<String> {
    let entries = (0..n)
        .map(|i| BatchEntry {
            fields: [("n".to_owned(), i.to_string().into_bytes())].into_iter().collect(),
            ..Default::default()
        })
        .collect();
    let resp = sidecar
        .stream_client()
        .await
        .append_batch(AppendBatchRequest { stream: stream.to_owned(), entries, ..Default::default() })
        .await
        .expect("append batch")
        .into_inner();
    resp.entries.into_iter().map(|e| e.id).collect()
}

// ---------------------------------------------------------------------------
// Subscribing
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_without_group_start_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;

    let err = Consumer::try_subscribe(&sidecar, subscribe_msg("s", "g", GroupStart::Unspecified))
        .await
        .err()
        .expect("GROUP_START_UNSPECIFIED must be refused");

    assert_code(&err, Code::InvalidArgument);
    assert!(err.message().contains("required: GROUP_START_NEW"), "{err:?}");

    // A number no GroupStart has is named as such, not taken for a missing one.
    let unknown = echomq::proto::Subscribe { group_start: 99, ..subscribe_msg("s", "g", GroupStart::New) };
    let err = Consumer::try_subscribe(&sidecar, unknown).await.err().expect("group_start 99 must be refused");
    assert_code(&err, Code::InvalidArgument);
    assert!(err.message().contains("99 is not a GroupStart"), "{err:?}");

    let mut con = redis.conn().await;
    assert!(!exists(&mut con, "s").await, "a refused subscribe must not create the stream or group");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_subscribe_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;

    consumer.send(req(Kind::Subscribe(subscribe_msg("s", "g", GroupStart::New)))).await;

    match consumer.next_event(EVENT_TIMEOUT).await {
        Event::Ended(Some(status)) => assert_code(&status, Code::InvalidArgument),
        other => panic!("a second Subscribe must end the call with INVALID_ARGUMENT, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_before_subscribe_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let ack = req(Kind::Ack(Ack { ids: vec!["0000000000010000000000000000".into()] }));

    let status = match Consumer::open(&sidecar, ack).await {
        Err(status) => status,
        Ok(mut call) => match call.next_event(EVENT_TIMEOUT).await {
            Event::Ended(Some(status)) => status,
            other => panic!("an Ack as first message must end the call, got {other:?}"),
        },
    };

    assert_code(&status, Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_creates_group_with_mkstream() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("pod-7")).await;
    let mut con = redis.conn().await;
    assert!(!exists(&mut con, "fresh").await);

    let consumer = Consumer::start(&sidecar, "fresh", "workers", GroupStart::New, 0).await;

    let subscribed = consumer.subscribed.clone().unwrap();
    assert_eq!(subscribed.stream, "fresh");
    assert_eq!(subscribed.group, "workers");
    assert_eq!(subscribed.consumer, "pod-7", "Subscribed names the sidecar's --consumer-name");
    assert_eq!(subscribed.max_in_flight, 1024, "the adaptive window's cap is reported");
    let groups = groups(&mut con, "fresh").await;
    assert!(groups.contains_key("workers"), "XINFO GROUPS must show the group: {groups:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_reuses_existing_group_and_keeps_its_position() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let old = sidecar.append("s", &[("k", b"old")]).await;
    create_group(&mut con, "s", "g", "$").await; // positioned after `old`
    let new = sidecar.append("s", &[("k", b"new")]).await;

    // BEGINNING only applies to a group that does not exist yet.
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;

    let d = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(d.id, new.id, "the existing group's position must be kept (old entry was {})", old.id);
    consumer.assert_quiet(SHORT, "the entry before the group's position is not delivered").await;
    assert_eq!(groups(&mut con, "s").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_start_new_skips_earlier_entries() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    sidecar.append("s", &[("k", b"before")]).await;

    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let after = sidecar.append("s", &[("k", b"after")]).await;

    let d = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(d.id, after.id);
    assert_eq!(d.payload.get("k").map(|v| &v[..]), Some(&b"after"[..]));
    consumer.assert_quiet(SHORT, "nothing else").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_start_beginning_delivers_earlier_entries() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let a = sidecar.append("s", &[("k", b"a")]).await;
    let b = sidecar.append("s", &[("k", b"b")]).await;

    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;

    let got = consumer.deliveries(2, EVENT_TIMEOUT).await;
    assert_eq!(ids(&got), vec![a.id, b.id], "oldest first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_start_id_starts_after_the_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let a = sidecar.append("s", &[("k", b"a")]).await;
    let b = sidecar.append("s", &[("k", b"b")]).await;
    let c = sidecar.append("s", &[("k", b"c")]).await;

    let mut sub = subscribe_msg("s", "g", GroupStart::Id);
    sub.start_id = a.stream_id.clone();
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;

    let got = consumer.deliveries(2, EVENT_TIMEOUT).await;
    assert_eq!(ids(&got), vec![b.id, c.id], "entries after {} (exclusive)", a.stream_id);
    consumer.assert_quiet(SHORT, "nothing else").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_start_id_that_is_not_a_stream_id_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;

    let mut sub = subscribe_msg("s", "g", GroupStart::Id);
    sub.start_id = "yesterday".into();
    let err = Consumer::try_subscribe(&sidecar, sub).await.err().expect("a bad start_id must be refused");

    assert_code(&err, Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_start_instant_starts_at_the_instant() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    for id in ["1000-0", "1999-7", "2000-0", "2000-1", "3000-0"] {
        xadd_raw_at(&mut con, "s", id, &[(b"at", id.as_bytes())]).await;
    }

    let mut sub = subscribe_msg("s", "g", GroupStart::Instant);
    sub.start_time = Some(timestamp_of_ms(2000));
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;

    let got = consumer.deliveries(3, EVENT_TIMEOUT).await;
    let stream_ids: Vec<&str> = got.iter().map(|d| d.stream_id.as_str()).collect();
    assert_eq!(stream_ids, vec!["2000-0", "2000-1", "3000-0"], "entries at or after 2000 ms only");
    consumer.assert_quiet(SHORT, "nothing before the instant").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_to_wrongtype_key_is_failed_precondition() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let _: () = redis::cmd("SET").arg("plain").arg("string").query_async(&mut con).await.unwrap();

    let err = Consumer::try_subscribe(&sidecar, subscribe_msg("plain", "g", GroupStart::New))
        .await
        .err()
        .expect("subscribing to a string key must fail");

    assert_code(&err, Code::FailedPrecondition);
}

/// A dead-letter stream or retry hash of another type would fail every
/// dead-lettering and retry of the group later: refused at subscribe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_keys_of_another_type_are_failed_precondition_at_subscribe() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let _: () = redis::cmd("SET").arg("strkey").arg("v").query_async(&mut con).await.unwrap();
    let _: String =
        redis::cmd("XADD").arg("col:retries:g").arg("*").arg("a").arg("b").query_async(&mut con).await.unwrap();

    let mut sub = subscribe_msg("wt", "g", GroupStart::New);
    sub.dead_letter_stream = "strkey".into();
    let dead_letters = Consumer::try_subscribe(&sidecar, sub).await.err().expect("a string as dead-letter stream");
    let retries = Consumer::try_subscribe(&sidecar, subscribe_msg("col", "g", GroupStart::New))
        .await
        .err()
        .expect("a stream as retry hash");

    assert_code(&dead_letters, Code::FailedPrecondition);
    assert!(dead_letters.message().contains("strkey"), "{dead_letters:?}");
    assert_code(&retries, Code::FailedPrecondition);
    assert!(retries.message().contains("col:retries:g"), "{retries:?}");
}

/// Dead letters appended to their own stream would come back for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_stream_equal_to_the_stream_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut sub = subscribe_msg("self", "g", GroupStart::New);
    sub.dead_letter_stream = "self".into();

    let err = Consumer::try_subscribe(&sidecar, sub).await.err().expect("dead letters into their own stream");

    assert_code(&err, Code::InvalidArgument);
    assert!(err.message().contains("dead_letter_stream"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_above_limit_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--max-in-flight-limit").arg("100")).await;

    let mut sub = subscribe_msg("s", "g", GroupStart::New);
    sub.max_in_flight = 101;
    let err = Consumer::try_subscribe(&sidecar, sub).await.err().expect("max_in_flight over the limit must be refused");

    assert_code(&err, Code::InvalidArgument);
}

/// Takes the deliveries that arrive until none has for `quiet`: what the
/// call's credit let the sidecar send.
async fn take_until_quiet(consumer: &mut Consumer, quiet: Duration) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        match consumer.next_event(quiet).await {
            Event::Delivery(delivery) => ids.push(delivery.id),
            Event::Timeout => return ids,
            other => panic!("expected deliveries, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_max_in_flight_the_window_doubles_while_the_client_keeps_up() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    sidecar.append_numbered("s", 3000).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;

    // Each turn takes all the credit allows, then acks it all at once, fast.
    let mut turns = Vec::new();
    for _ in 0..5 {
        let ids = take_until_quiet(&mut consumer, Duration::from_millis(100)).await;
        turns.push(ids.len());
        consumer.ack(&ids.iter().map(String::as_str).collect::<Vec<_>>()).await;
    }
    assert_eq!(turns, [64, 128, 256, 512, 1024], "the window starts at 64 and doubles up to its cap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_max_in_flight_a_client_that_falls_behind_gets_a_smaller_window() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    sidecar.append_numbered("s", 400).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;

    // A slow handler: one ack every 10 ms, while the window keeps 64 waiting.
    let mut in_hand: std::collections::VecDeque<String> =
        take_until_quiet(&mut consumer, Duration::from_millis(100)).await.into();
    assert_eq!(in_hand.len(), 64);
    let mut most_after_the_first_window = 0;
    for acked in 1..=140 {
        let id = in_hand.pop_front().expect("the window never runs dry here");
        consumer.ack_one(&id).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        in_hand.extend(take_until_quiet(&mut consumer, Duration::from_millis(2)).await);
        // The window shrinks at the 64th verdict; the call holds less once 16 more settled.
        if acked > 64 + 16 {
            most_after_the_first_window = most_after_the_first_window.max(in_hand.len());
        }
    }
    assert!(
        (1..=48).contains(&most_after_the_first_window),
        "verdicts came back slowly: at most 48 held, got {most_after_the_first_window}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_max_in_flight_a_client_that_collects_a_batch_before_settling_is_not_stalled() {
    // A client that settles nothing until it holds 100, while a producer
    // appends 500 a second for 14 s: past the window's start of 64, and past
    // its first probe (after 10 s), where the window drops to 8.
    const BATCH: usize = 100;
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;
    let mut producer = redis.conn().await;
    let appended = 7000;
    let producing = tokio::spawn(async move {
        for tick in 0..appended / 50 {
            let mut batch = redis::pipe();
            for i in 0..50 {
                batch.cmd("XADD").arg("s").arg("*").arg("n").arg(tick * 50 + i).ignore();
            }
            let _: () = batch.query_async(&mut producer).await.expect("XADD");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });

    let (mut acked, mut waits) = (0, Vec::new());
    while acked < appended {
        let (started, mut batch) = (Instant::now(), Vec::new());
        while batch.len() < BATCH.min(appended - acked) {
            match consumer.next_event(Duration::from_secs(10)).await {
                Event::Delivery(delivery) => batch.push(delivery.id),
                other => panic!("a collecting client got stuck holding {} (acked {acked}): {other:?}", batch.len()),
            }
        }
        waits.push(started.elapsed());
        consumer.ack(&batch.iter().map(String::as_str).collect::<Vec<_>>()).await;
        acked += batch.len();
    }
    producing.await.unwrap();
    assert!(sidecar.counter("echomq_window_stalls_total").await >= 1.0, "the stalls are counted");
    let stalls = waits.iter().filter(|wait| **wait > Duration::from_millis(900)).count();
    let longest = waits.iter().max().copied().unwrap_or_default();
    println!("{} batches; {stalls} waited over 0.9 s; the longest {longest:?}", waits.len());
    assert!(longest < Duration::from_millis(2500), "a stall opens the window at once, not step by step: {waits:?}");
    assert!(
        stalls <= 2,
        "the window opens once at the start and once at the probe; {stalls} batches waited over 0.9 s: {waits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_max_in_flight_a_client_waiting_for_more_than_the_cap_is_warned_about_once() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--default-max-in-flight").arg("16")).await;
    sidecar.append_numbered("s", 40).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;
    // It waits for 20 before settling any; the cap is 16.
    let held = take_until_quiet(&mut consumer, Duration::from_millis(3500)).await;
    assert_eq!(held.len(), 16, "a window never grows past its cap");
    let warned = || sidecar.log().matches("holds all the entries its window's cap allows").count();
    assert_eq!(warned(), 1, "one WARN names the call that waits at its cap:\n{}", sidecar.log());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(warned(), 1, "and only one");
}

// ---------------------------------------------------------------------------
// Deliveries
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_carries_id_stream_id_payload_attempts_and_minted_at() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut consumer = Consumer::start(&sidecar, "orders", "billing", GroupStart::New, 0).await;

    let appended = sidecar.append("orders", &[("k", b"v"), ("bin", &[0u8, 159, 146, 150])]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    assert_eq!(d.id, appended.id);
    assert_eq!(d.stream_id, appended.stream_id);
    assert_eq!(d.stream, "orders");
    assert_eq!(d.group, "billing");
    let expected: HashMap<String, bytes::Bytes> =
        [("k".to_owned(), "v".into()), ("bin".to_owned(), vec![0u8, 159, 146, 150].into())].into_iter().collect();
    assert_eq!(d.payload, expected, "payload is the fields without the reserved `id`");
    assert!(d.raw_fields.is_empty());
    assert_eq!(d.attempts, 1);
    assert_eq!(d.minted_at, Some(timestamp_of_ms(branded_ms(&appended.id))), "minted_at is the id's milliseconds");
    assert_eq!(d.traceparent, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_entry_is_delivered_with_derived_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let mut con = redis.conn().await;

    let stream_id = xadd_raw(&mut con, "s", &[(b"k", b"v")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    assert_eq!(d.stream_id, stream_id);
    assert_eq!(
        d.id,
        branded_from_stream_id(&stream_id),
        "the branded id of a plain XADD entry is derived from its stream id"
    );
    assert_eq!(d.payload, [("k".to_owned(), bytes::Bytes::from_static(b"v"))].into_iter().collect::<HashMap<_, _>>());
    assert_eq!(d.attempts, 1);
    assert_eq!(d.minted_at, Some(timestamp_of_ms(parse_stream_id(&stream_id).0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_field_that_is_not_a_branded_id_is_payload() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let mut con = redis.conn().await;

    let stream_id = xadd_raw(&mut con, "s", &[(b"id", b"order-17"), (b"k", b"v")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    assert_eq!(d.id, branded_from_stream_id(&stream_id));
    assert_eq!(
        d.payload.get("id").map(|v| &v[..]),
        Some(&b"order-17"[..]),
        "DESIGN: an invalid `id` value is ordinary payload"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_field_name_arrives_in_raw_fields() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let mut con = redis.conn().await;
    let bad_name: &[u8] = &[0xff, 0xfe, b'x', 0x80];
    let value: &[u8] = &[0, 1, 2, 0xff];

    xadd_raw(&mut con, "s", &[(b"ok", b"fine"), (bad_name, value), (&[0xc3, 0x28], b"v2")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    assert_eq!(
        d.payload,
        [("ok".to_owned(), bytes::Bytes::from_static(b"fine"))].into_iter().collect::<HashMap<_, _>>()
    );
    assert_eq!(
        d.raw_fields,
        vec![
            RawField { name: bad_name.to_vec(), value: value.to_vec() },
            RawField { name: vec![0xc3, 0x28], value: b"v2".to_vec() },
        ],
        "non-UTF-8 field names arrive byte for byte, in stream order"
    );
}

// ---------------------------------------------------------------------------
// Verdicts
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_removes_entry_from_pel_and_it_is_not_delivered_again() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(100)).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let e = sidecar.append("s", &[("k", b"v")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(pending_count(&mut con, "s", "g").await, 1);

    consumer.ack(&[&d.id]).await;

    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0, "XACK must reach Redis");
    consumer.assert_quiet(SHORT, "an acked entry produces no verdict error and no redelivery").await;
    drop(consumer);
    // A new call starts by re-delivering the consumer's own pending entries: there are none.
    let mut again = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    again.assert_quiet(SHORT, &format!("{} was acked", e.id)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_of_several_ids_in_one_message() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    append_n(&sidecar, "s", 3).await;
    let got = consumer.deliveries(3, EVENT_TIMEOUT).await;

    let all = ids(&got);
    consumer.ack(&all.iter().map(String::as_str).collect::<Vec<_>>()).await;

    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    consumer.assert_quiet(SHORT, "no verdict errors").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_redelivers_with_attempts_2_after_retry_after() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let e = sidecar.append("s", &[("k", b"v")]).await;
    let first = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(first.attempts, 1);

    let failed_at = Instant::now();
    consumer.fail(&first.id, Some(Duration::from_millis(2000))).await;

    consumer.assert_quiet(Duration::from_millis(1400), "not redelivered before retry_after").await;
    assert_eq!(pending_count(&mut con, "s", "g").await, 1, "a failed entry stays pending");
    let again = consumer.next_delivery(EVENT_TIMEOUT).await;
    let waited = failed_at.elapsed();
    assert_eq!(again.id, e.id);
    assert_eq!(again.attempts, 2, "attempts is the PEL delivery count");
    let pending = pending_entries(&mut con, "s", "g").await;
    assert_eq!(pending[0].deliveries, i64::from(again.attempts), "attempts == XPENDING's delivery count: {pending:?}");
    assert!(waited >= Duration::from_millis(1800), "redelivered after {waited:?}, retry_after was 2 s");
    assert_eq!(again.payload, first.payload);

    consumer.ack(&[&again.id]).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

/// On an idle stream the blocking read holds the call's credit for up to its
/// BLOCK time; a due retry must not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_an_idle_stream_comes_back_on_time_not_after_the_blocking_read() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--read-block-ms").arg("10000")).await;
    // One slot: once the entry is failed, the new blocking read takes all of it.
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 1).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let first = consumer.next_delivery(EVENT_TIMEOUT).await;

    let failed_at = Instant::now();
    consumer.fail(&first.id, Some(Duration::from_millis(500))).await;
    let again = consumer.next_delivery(Duration::from_secs(20)).await;
    let waited = failed_at.elapsed();

    assert_eq!((again.id.as_str(), again.attempts), (first.id.as_str(), 2));
    assert!(waited >= Duration::from_millis(450), "not before retry_after: {waited:?}");
    assert!(waited < Duration::from_millis(8000), "retry_after 500 ms, BLOCK 10 s: came back after {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_without_retry_after_uses_subscription_backoff() {
    let redis = RedisServer::start().await;
    // A sidecar default of 10 s, so a quick redelivery proves the subscription's own backoff applies.
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(10_000)).await;
    let mut sub = subscribe_msg("s", "g", GroupStart::New);
    sub.retry_backoff_initial = Some(duration_ms(200));
    sub.retry_backoff_max = Some(duration_ms(400));
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    let failed_at = Instant::now();
    consumer.fail(&d.id, None).await;

    let again = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(again.id, d.id);
    assert_eq!(again.attempts, 2);
    let waited = failed_at.elapsed();
    // The sidecar's 10 s would wait at least 5 s (half of it, plus jitter).
    assert!(waited < Duration::from_millis(4500), "backoff capped at 400 ms, redelivered after {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_with_dead_letter_moves_entry_to_dlq() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let e = sidecar.append("s", &[("k", b"v")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    consumer.dead_letter(&d.id, "poison").await;

    assert!(
        eventually(EVENT_TIMEOUT, || {
            let mut c = con.clone();
            async move { xlen(&mut c, "s:dlq").await == 1 }
        })
        .await,
        "the entry must be appended to s:dlq"
    );
    let dlq = xrange(&mut con, "s:dlq").await;
    assert_eq!(dlq[0].field("id"), Some(e.id.as_bytes()), "the dead letter carries the branded id: {:?}", dlq[0]);
    assert_eq!(dlq[0].field("k"), Some(&b"v"[..]), "and the payload: {:?}", dlq[0]);
    assert_ne!(dlq[0].stream_id, e.stream_id);
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0, "acknowledged on the source");
    consumer.assert_quiet(SHORT, "a dead-lettered entry is not redelivered").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_for_another_calls_id_is_unknown_id_and_not_applied() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut holder = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let e = sidecar.append("s", &[("k", b"v")]).await;
    let held = holder.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(held.id, e.id);
    let mut thief = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;

    thief.ack(&[&e.id]).await;
    let err = thief.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(err.id, e.id);
    assert_eq!(err.code, VerdictErrorCode::UnknownId as i32, "{err:?}");
    thief.fail(&e.id, Some(Duration::from_millis(1))).await;
    let err = thief.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(err.code, VerdictErrorCode::UnknownId as i32, "a Fail for a foreign id is refused too: {err:?}");

    tokio::time::sleep(Duration::from_millis(500)).await;
    let pending = pending_entries(&mut con, "s", "g").await;
    assert_eq!(pending.len(), 1, "one call can never ack another call's entries");
    assert_eq!(pending[0].stream_id, e.stream_id);
    assert_eq!(pending[0].deliveries, 1, "the foreign Fail did not release it either");
    thief.assert_quiet(SHORT, "the entry stays with its holder").await;

    holder.ack(&[&held.id]).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    holder.assert_quiet(Duration::from_millis(500), "the holder's ack succeeds").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_for_never_delivered_id_is_unknown_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let id = "000000000001000000000000002a";

    consumer.ack(&[id]).await;

    let err = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(err.id, id);
    assert_eq!(err.code, VerdictErrorCode::UnknownId as i32, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_id_is_invalid_argument_and_call_survives() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let d = {
        sidecar.append("s", &[("k", b"v")]).await;
        consumer.next_delivery(EVENT_TIMEOUT).await
    };

    consumer.ack(&["not-an-id"]).await;
    let err = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(err.id, "not-an-id");
    assert_eq!(err.code, VerdictErrorCode::InvalidArgument as i32, "{err:?}");
    // Upper-case hex is not the canonical text form either.
    let upper = d.id.to_uppercase();
    consumer.ack(&[&upper]).await;
    let err = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(err.code, VerdictErrorCode::InvalidArgument as i32, "{err:?}");
    assert_eq!(pending_count(&mut con, "s", "g").await, 1, "nothing was applied");

    // The call goes on: it still acks and still receives.
    consumer.ack(&[&d.id]).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    let next = sidecar.append("s", &[("k", b"next")]).await;
    assert_eq!(consumer.next_delivery(EVENT_TIMEOUT).await.id, next.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_with_negative_retry_after_is_invalid_argument_and_keeps_delivery_held() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    consumer
        .send(req(Kind::Fail(Fail {
            id: d.id.clone(),
            reason: String::new(),
            retry_after: Some(prost_types::Duration { seconds: -1, nanos: 0 }),
            dead_letter: false,
            ..Default::default()
        })))
        .await;

    let err = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(err.code, VerdictErrorCode::InvalidArgument as i32, "{err:?}");
    consumer.ack(&[&d.id]).await; // still held: the ack applies
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    consumer.assert_quiet(Duration::from_millis(500), "the ack got no verdict error").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_returns_held_entries_for_redelivery() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(100)).await;
    let mut con = redis.conn().await;
    let mut first = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let appended = append_n(&sidecar, "s", 2).await;
    let held = first.deliveries(2, EVENT_TIMEOUT).await;
    assert_eq!(ids(&held), appended);

    drop(first);

    let mut second = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let again = second.deliveries(2, EVENT_TIMEOUT).await;
    let got: BTreeSet<String> = ids(&again).into_iter().collect();
    assert_eq!(got, appended.iter().cloned().collect::<BTreeSet<_>>(), "the dropped call's entries come back");
    assert!(again.iter().all(|d| d.attempts == 2), "second hand-over: {again:?}");
    second.ack(&ids(&again).iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

// ---------------------------------------------------------------------------
// Flow control
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_limits_deliveries_and_reads() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let appended = append_n(&sidecar, "s", 100).await;

    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 5).await;
    assert_eq!(consumer.subscribed.as_ref().unwrap().max_in_flight, 5);
    let first5 = consumer.deliveries(5, EVENT_TIMEOUT).await;
    assert_eq!(ids(&first5), appended[..5].to_vec());
    consumer.assert_quiet(SHORT, "no 6th delivery while 5 are held").await;
    let pending = pending_entries(&mut con, "s", "g").await;
    assert!(pending.len() <= 5, "the sidecar read ahead of the call's capacity: {} pending", pending.len());

    consumer.ack(&[&first5[0].id]).await;
    let sixth = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(sixth.id, appended[5]);
    consumer.assert_quiet(SHORT, "one ack frees exactly one slot").await;
    let pending = pending_count(&mut con, "s", "g").await;
    assert!(pending <= 5, "{pending} pending with max_in_flight 5");

    // Draining the rest keeps the bound and delivers everything once.
    let mut held: Vec<String> = ids(&first5[1..]);
    held.push(sixth.id);
    let mut seen: Vec<String> = ids(&first5);
    seen.push(appended[5].clone());
    while seen.len() < 100 {
        let id = held.remove(0);
        consumer.ack(&[&id]).await;
        let d = consumer.next_delivery(EVENT_TIMEOUT).await;
        assert_eq!(d.attempts, 1);
        seen.push(d.id.clone());
        held.push(d.id);
    }
    assert_eq!(seen, appended);
    assert!(pending_count(&mut con, "s", "g").await <= 5);
}

// ---------------------------------------------------------------------------
// Sharing
// ---------------------------------------------------------------------------

/// (call label, branded id, attempts) of every delivery.
type Seen = Arc<Mutex<Vec<(&'static str, String, u32)>>>;

/// Receives and acks until `done`; records every delivery in `seen`.
fn spawn_acker(
    mut consumer: Consumer,
    label: &'static str,
    seen: Seen,
    done: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Result<(), String>> {
    tokio::spawn(async move {
        while !done.load(Ordering::SeqCst) {
            match consumer.next_event(Duration::from_millis(200)).await {
                Event::Delivery(d) => {
                    consumer.ack(&[&d.id]).await;
                    seen.lock().unwrap().push((label, d.id, d.attempts));
                }
                Event::Timeout => {}
                other => return Err(format!("{label}: unexpected {other:?}")),
            }
        }
        Ok(())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_and_sidecars_share_entries_each_delivered_once() {
    let redis = RedisServer::start().await;
    let left = Sidecar::start(&redis, SidecarOptions::named("left")).await;
    let right = Sidecar::start(&redis, SidecarOptions::named("right")).await;
    let mut con = redis.conn().await;
    let a = Consumer::start(&left, "s", "g", GroupStart::New, 10).await;
    let b = Consumer::start(&left, "s", "g", GroupStart::New, 10).await;
    let c = Consumer::start(&right, "s", "g", GroupStart::New, 10).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let tasks = vec![
        spawn_acker(a, "left-a", seen.clone(), done.clone()),
        spawn_acker(b, "left-b", seen.clone(), done.clone()),
        spawn_acker(c, "right-c", seen.clone(), done.clone()),
    ];

    let mut appended = append_n(&left, "s", 100).await;
    appended.extend(append_n(&right, "s", 100).await);

    let all_seen = eventually(Duration::from_secs(30), || {
        let seen = seen.clone();
        async move { seen.lock().unwrap().len() >= 200 }
    })
    .await;
    // Give a duplicate time to show up before stopping.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    done.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap().unwrap();
    }

    let seen = seen.lock().unwrap().clone();
    let mut per_call: HashMap<&str, usize> = HashMap::new();
    for (label, _, _) in &seen {
        *per_call.entry(label).or_default() += 1;
    }
    eprintln!("deliveries per call: {per_call:?}");
    assert!(all_seen, "only {} of 200 entries delivered: {per_call:?}", seen.len());
    let unique: BTreeSet<&String> = seen.iter().map(|(_, id, _)| id).collect();
    assert_eq!(seen.len(), 200, "each entry is delivered once overall when all are acked: {per_call:?}");
    assert_eq!(unique, appended.iter().collect::<BTreeSet<_>>(), "the union is every appended entry");
    assert!(seen.iter().all(|(_, _, attempts)| *attempts == 1));
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

// ---------------------------------------------------------------------------
// Ack deadlines, extensions, policy fields
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_deadline_passed_redelivers_and_late_ack_is_unknown_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(100)).await;
    let mut sub = subscribe_msg("s", "g", GroupStart::New);
    sub.ack_deadline = Some(duration_ms(1000));
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let first = consumer.next_delivery(EVENT_TIMEOUT).await;

    // No verdict: after the 1 s deadline (+ 100 ms backoff) it comes back.
    let again = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(again.id, first.id);
    assert_eq!(again.attempts, 2, "a passed deadline is a failed attempt");
    consumer.ack(&[&again.id]).await;
    let mut con = redis.conn().await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    consumer.assert_quiet(Duration::from_millis(500), "the ack of the re-delivery applies").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_after_deadline_is_unknown_id() {
    let redis = RedisServer::start().await;
    // A long backoff keeps the expired entry away, so the late ack meets nothing held.
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(30_000)).await;
    let mut sub = subscribe_msg("s", "g", GroupStart::New);
    sub.ack_deadline = Some(duration_ms(500));
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;
    // Well past the deadline, which the worker checks every 100 ms.
    tokio::time::sleep(Duration::from_millis(3000)).await;

    consumer.ack(&[&d.id]).await;

    let err = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(err.code, VerdictErrorCode::UnknownId as i32, "{err:?}");
    let mut con = redis.conn().await;
    assert_eq!(pending_count(&mut con, "s", "g").await, 1, "the late ack is not applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_pushes_the_ack_deadline_back() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(100)).await;
    let mut con = redis.conn().await;
    let mut sub = subscribe_msg("s", "g", GroupStart::New);
    sub.ack_deadline = Some(duration_ms(2000));
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    consumer
        .send(req(Kind::Extend(echomq::proto::Extend {
            ids: vec![d.id.clone()],
            by: Some(duration_ms(10_000)),
            ..Default::default()
        })))
        .await;

    consumer.assert_quiet(Duration::from_millis(3500), "extended: no expiry, no re-delivery").await;
    consumer.ack(&[&d.id]).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    consumer.assert_quiet(Duration::from_millis(500), "the ack within the extension applies").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_of_unknown_id_is_unknown_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let id = "000000000001000000000000002a";

    consumer
        .send(req(Kind::Extend(echomq::proto::Extend {
            ids: vec![id.into()],
            by: Some(duration_ms(1000)),
            ..Default::default()
        })))
        .await;

    let err = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!((err.id.as_str(), err.code), (id, VerdictErrorCode::UnknownId as i32), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_goes_to_the_subscriptions_dead_letter_stream() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut sub = subscribe_msg("s", "g", GroupStart::New);
    sub.dead_letter_stream = "graveyard".into();
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;
    let e = sidecar.append("s", &[("k", b"v")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    consumer.dead_letter(&d.id, "poison").await;

    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    let dead = xrange(&mut con, "graveyard").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].field("id"), Some(e.id.as_bytes()));
    assert!(!exists(&mut con, "s:dlq").await, "not the default dead-letter stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_with_empty_group_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;

    let err = Consumer::try_subscribe(&sidecar, subscribe_msg("s", "", GroupStart::New)).await.err().expect("refused");

    assert_code(&err, Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_start_instant_without_start_time_or_far_ahead_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;

    let err =
        Consumer::try_subscribe(&sidecar, subscribe_msg("s", "g", GroupStart::Instant)).await.err().expect("refused");

    assert_code(&err, Code::InvalidArgument);

    // Milliseconds given as seconds: a group starting in the far future would skip everything until then.
    let mut sub = subscribe_msg("s", "g", GroupStart::Instant);
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    sub.start_time = Some(prost_types::Timestamp { seconds: now_ms, nanos: 0 });
    let err = Consumer::try_subscribe(&sidecar, sub).await.err().expect("a start_time far in the future");
    assert_code(&err, Code::InvalidArgument);
    assert!(err.message().contains("in the future"), "{}", err.message());
    let mut con = redis.conn().await;
    let exists: i64 = redis::cmd("EXISTS").arg("s").query_async(&mut con).await.unwrap();
    assert_eq!(exists, 0, "no group (nor stream) was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_id_field_carries_the_branded_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--id-field").arg("_eid")).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;

    // With another reserved name, `id` is an ordinary field.
    let e = sidecar.append("s", &[("id", b"order-1")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    assert_eq!(xrange(&mut con, "s").await[0].field("_eid"), Some(e.id.as_bytes()));
    assert_eq!(d.id, e.id);
    assert_eq!(
        d.payload,
        [("id".to_owned(), bytes::Bytes::from_static(b"order-1"))].into_iter().collect::<HashMap<_, _>>()
    );
}

// ---------------------------------------------------------------------------
// Poison entries and at-most-once
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_entry_moves_to_dead_letter_stream_after_max_deliveries() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut sub = subscribe_msg("s", "g", GroupStart::New);
    sub.max_deliveries = 2;
    sub.retry_backoff_initial = Some(duration_ms(100));
    sub.retry_backoff_max = Some(duration_ms(200));
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;
    let e = sidecar.append("s", &[("k", b"v")]).await;

    let first = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(first.attempts, 1);
    consumer.fail(&first.id, None).await;
    let second = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!((second.id.as_str(), second.attempts), (e.id.as_str(), 2));
    consumer.fail(&second.id, None).await;

    consumer.assert_quiet(Duration::from_millis(2000), "a third delivery would exceed max_deliveries 2").await;
    assert!(one_dead_letter(&con).await, "the poison entry is dead-lettered");
    let dlq = xrange(&mut con, "s:dlq").await;
    assert_eq!(dlq[0].field("id"), Some(e.id.as_bytes()));
    assert_eq!(dlq[0].field("k"), Some(&b"v"[..]));
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0, "and acknowledged on the source");
    // New entries keep flowing.
    let next = sidecar.append("s", &[("k", b"next")]).await;
    assert_eq!(consumer.next_delivery(EVENT_TIMEOUT).await.id, next.id);
}

/// Whether `s:dlq` comes to hold exactly one dead letter within EVENT_TIMEOUT.
async fn one_dead_letter(con: &redis::aio::MultiplexedConnection) -> bool {
    eventually(EVENT_TIMEOUT, || {
        let mut con = con.clone();
        async move { xlen(&mut con, "s:dlq").await == 1 }
    })
    .await
}

/// A Fail of `kind` (the wire value), retried after 50 ms.
async fn fail_of_kind(consumer: &Consumer, id: &str, kind: FailKind, dead_letter: bool) {
    consumer
        .send(req(Kind::Fail(Fail {
            id: id.to_owned(),
            reason: format!("{kind:?}"),
            retry_after: Some(duration_ms(50)),
            dead_letter,
            kind: kind as i32,
        })))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_fail_costs_no_attempt_so_it_never_dead_letters_and_a_message_fail_does() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let con = redis.conn().await;
    let mut sub = subscribe_msg("s", "g", GroupStart::New);
    sub.max_deliveries = 3;
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;
    let e = sidecar.append("s", &[("k", b"v")]).await;

    // Five transient fails with max_deliveries 3: never dead-lettered, attempts stay 1.
    let mut attempts = Vec::new();
    let counted = [FailKind::Message, FailKind::Unspecified, FailKind::Message];
    for kind in [FailKind::Transient; 5].into_iter().chain(counted) {
        let d = consumer.next_delivery(EVENT_TIMEOUT).await;
        assert_eq!(d.id, e.id);
        attempts.push(d.attempts);
        fail_of_kind(&consumer, &d.id, kind, false).await;
    }
    assert_eq!(attempts, [1, 1, 1, 1, 1, 1, 2, 3], "transient fails keep the count; message fails add one");
    consumer.assert_quiet(Duration::from_millis(500), "the third counted failure reached max_deliveries 3").await;
    assert_eq!(sidecar.counter("echomq_transient_fails_total").await, 5.0);
    assert_eq!(sidecar.counter("echomq_fails_total").await, 8.0);
    assert!(one_dead_letter(&con).await, "dead-lettered after three counted attempts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_fail_dead_letters_now_and_a_contradictory_or_unknown_kind_is_refused() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let e = sidecar.append("s", &[("k", b"v")]).await;
    let d = consumer.next_delivery(EVENT_TIMEOUT).await;

    fail_of_kind(&consumer, &d.id, FailKind::Transient, true).await;
    let refused = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(refused.code, VerdictErrorCode::InvalidArgument as i32);
    assert!(refused.message.contains("FAIL_KIND_TRANSIENT with dead_letter"), "{}", refused.message);
    consumer.send(req(Kind::Fail(Fail { id: d.id.clone(), kind: 9, ..Default::default() }))).await;
    let unknown = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(unknown.code, VerdictErrorCode::InvalidArgument as i32);
    assert!(unknown.message.contains("9 is not a FailKind"), "{}", unknown.message);

    fail_of_kind(&consumer, &d.id, FailKind::Poison, false).await;
    assert!(one_dead_letter(&con).await, "POISON dead-letters at once, the refused verdicts having left it held");
    assert_eq!(xrange(&mut con, "s:dlq").await[0].field("id"), Some(e.id.as_bytes()));
    assert_eq!(sidecar.counter("echomq_poison_fails_total").await, 1.0, "the kind shows in the metrics");
    assert_eq!(sidecar.counter("echomq_fails_total").await, 1.0, "a poison fail is a fail");
}

/// An entry acked after a transient failure (its attempts still 1) leaves no
/// retry state behind: the claim that re-delivered it removed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_acked_after_a_transient_fail_leaves_no_retry_state() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    sidecar.append_numbered("s", 20).await;
    for d in consumer.deliveries(20, EVENT_TIMEOUT).await {
        fail_of_kind(&consumer, &d.id, FailKind::Transient, false).await;
    }
    for d in consumer.deliveries(20, EVENT_TIMEOUT).await {
        assert_eq!(d.attempts, 1);
        consumer.ack_one(&d.id).await;
    }
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    let retries: u64 = redis::cmd("HLEN").arg("s:retries:g").query_async(&mut con).await.unwrap();
    assert_eq!(retries, 0, "a database outage must not grow the retry hash for good");
}

/// A Release of the ids in `ids`.
async fn release(consumer: &Consumer, ids: &[&str]) {
    consumer.send(req(Kind::Release(Release { ids: ids.iter().map(|id| (*id).to_owned()).collect() }))).await;
}

/// A released delivery goes at once to the group's other call on this
/// sidecar, with the attempts it had: the release costs no attempt, and no
/// wait for `--reclaim-min-idle-ms` (30 s here, so no reclaim beat helps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_delivery_goes_to_the_groups_other_call_at_once_with_the_attempts_it_had() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().reclaim(30_000, 100)).await;
    let mut con = redis.conn().await;
    let mut first = Consumer::start(&sidecar, "s", "g", GroupStart::New, 1).await;
    let e = sidecar.append("s", &[("k", b"v")]).await;
    let d = first.next_delivery(EVENT_TIMEOUT).await;
    first.fail(&d.id, Some(Duration::ZERO)).await;
    let d = first.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!((d.id.as_str(), d.attempts), (e.id.as_str(), 2));

    let mut second = Consumer::start(&sidecar, "s", "g", GroupStart::New, 1).await;
    // Drained first, as the clients do on stop: else the released entry may
    // go back to `first`, which has room again.
    first.send(req(Kind::Drain(Drain {}))).await;
    let released_at = Instant::now();
    release(&first, &[&d.id]).await;
    let taken = second.next_delivery(Duration::from_secs(5)).await;
    assert!(released_at.elapsed() < Duration::from_secs(2), "at once: {:?}", released_at.elapsed());
    assert_eq!((taken.id.as_str(), taken.attempts), (e.id.as_str(), 2), "the attempts it had");
    let pending = pending_entries(&mut con, "s", "g").await;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].deliveries, 2, "Redis counts what the delivery says: {pending:?}");
    assert_eq!(sidecar.counter("echomq_releases_total").await, 1.0);

    first.ack_one(&d.id).await;
    let late = first.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(late.code, VerdictErrorCode::UnknownId as i32, "released: no longer this call's: {late:?}");
    second.ack_one(&taken.id).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

/// Bad input: a Release of an id the call does not hold (never delivered,
/// released already, acked), or one that is no id, is a VerdictError and
/// applies nothing; the ids the call held beside it are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_an_id_the_call_does_not_hold_is_refused_and_applies_nothing() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 2).await;
    let a = sidecar.append("s", &[("k", b"a")]).await;
    let b = sidecar.append("s", &[("k", b"b")]).await;
    let got = consumer.deliveries(2, EVENT_TIMEOUT).await;
    assert_eq!(ids(&got), [a.id.clone(), b.id.clone()]);
    consumer.ack_one(&a.id).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 1, EVENT_TIMEOUT).await, 1);
    // Drained, so nothing released comes back to this call while it is tested.
    consumer.send(req(Kind::Drain(Drain {}))).await;

    let never = "0".repeat(28);
    release(&consumer, &[&never, &a.id, "not-an-id", &b.id]).await;
    let mut refused = Vec::new();
    for _ in 0..3 {
        let error = consumer.next_verdict_error(EVENT_TIMEOUT).await;
        refused.push((error.id, VerdictErrorCode::try_from(error.code).unwrap()));
    }
    refused.sort();
    let mut expected = vec![
        (never.clone(), VerdictErrorCode::UnknownId),
        (a.id.clone(), VerdictErrorCode::UnknownId),
        ("not-an-id".to_owned(), VerdictErrorCode::InvalidArgument),
    ];
    expected.sort();
    assert_eq!(refused, expected);
    release(&consumer, &[&b.id]).await;
    let twice = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!((twice.id.as_str(), twice.code), (b.id.as_str(), VerdictErrorCode::UnknownId as i32), "released once");
    consumer.assert_quiet(Duration::from_millis(300), "nothing else answered").await;

    // b went back with its delivery count restored (0: never delivered for
    // good), looking idle for long; a stays acknowledged.
    let pending = pending_entries(&mut con, "s", "g").await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].deliveries, 0, "{pending:?}");
    assert!(pending[0].idle_ms > 300 * 24 * 3600 * 1000, "{pending:?}");
    assert_eq!(sidecar.counter("echomq_releases_total").await, 1.0);

    // The next call gets it as a first delivery.
    let mut next = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let again = next.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!((again.id.as_str(), again.attempts), (b.id.as_str(), 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ack_entries_are_never_pending_and_fail_is_refused() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut sub = subscribe_msg("s", "g", GroupStart::New);
    sub.no_ack = true;
    sub.max_in_flight = 1;
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;
    let a = sidecar.append("s", &[("k", b"a")]).await;
    let b = sidecar.append("s", &[("k", b"b")]).await;

    let d = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(d.id, a.id);
    assert_eq!(pending_count(&mut con, "s", "g").await, 0, "NOACK reads leave nothing pending");
    consumer.fail(&d.id, None).await;
    let err = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(err.code, VerdictErrorCode::InvalidArgument as i32, "{err:?}");
    consumer.send(req(Kind::Release(Release { ids: vec![d.id.clone()] }))).await;
    let err = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(err.code, VerdictErrorCode::InvalidArgument as i32, "{err:?}");
    assert!(err.message.contains("at-most-once"), "{}", err.message);
    consumer
        .assert_quiet(Duration::from_millis(500), "max_in_flight 1 still applies: the refused release left it held")
        .await;
    consumer.ack(&[&d.id]).await;
    assert_eq!(consumer.next_delivery(EVENT_TIMEOUT).await.id, b.id, "an ack frees the slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_too_large_to_deliver_is_dead_lettered_and_the_call_survives() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--max-message-bytes").arg("65536")).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::subscribe(&sidecar, subscribe_msg("s", "g", GroupStart::New)).await;
    // A foreign producer writes what no client could receive through the sidecar.
    let big = vec![b'x'; 100_000];
    let big_id = xadd_raw(&mut con, "s", &[(b"blob", &big)]).await;
    let small = sidecar.append("s", &[("k", b"small")]).await;

    let delivered = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(delivered.id, small.id, "the next entry still arrives on the same call");
    consumer.ack(&[&delivered.id]).await;
    // The small entry is handed over before the dead-letter script has run
    // (as the worker carries out a read's deliveries first): wait for it.
    assert!(one_dead_letter(&con).await, "the oversized entry is dead-lettered");
    let dlq = xrange(&mut con, "s:dlq").await;
    assert_eq!(dlq.len(), 1, "the oversized entry is dead-lettered once");
    assert_eq!(dlq[0].field("echomq.source_id"), Some(big_id.as_bytes()));
    assert!(String::from_utf8_lossy(dlq[0].field("echomq.reason").unwrap_or_default()).contains("--max-message-bytes"));
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

/// Two shards holding entries with the same branded id (written around Append,
/// so their ids were not minted apart): one call never holds both at once, so
/// a verdict by branded id is never ambiguous; the second comes once the
/// first is settled, and each ack lands on its own shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branded_id_on_two_shards_is_handed_to_a_call_one_at_a_time() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--sharded-streams").arg("dup=2")).await;
    let mut con = redis.conn().await;
    let (a, b) = ("dup:{dup:0}", "dup:{dup:1}");
    xadd_raw_at(&mut con, a, "5-0", &[(b"from", b"a")]).await;
    xadd_raw_at(&mut con, b, "5-0", &[(b"from", b"b")]).await;

    let mut consumer = Consumer::start(&sidecar, "dup", "g", GroupStart::Beginning, 8).await;
    let first = consumer.next_delivery(EVENT_TIMEOUT).await;
    consumer.assert_quiet(Duration::from_millis(500), "the namesake waits while the first is held").await;
    consumer.ack_one(&first.id).await;
    let second = consumer.next_delivery(EVENT_TIMEOUT).await;
    consumer.ack_one(&second.id).await;

    assert_eq!(first.id, second.id, "one branded id");
    assert_ne!(first.stream, second.stream, "from the two shards");
    assert_eq!(wait_pending(&mut con, a, "g", 0, EVENT_TIMEOUT).await, 0);
    assert_eq!(wait_pending(&mut con, b, "g", 0, EVENT_TIMEOUT).await, 0);
}

/// The same collision when the first delivery's ack deadline passes without a
/// verdict: the call no longer holds it, so its namesake from the other shard
/// is handed over at once instead of waiting behind it for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namesake_is_handed_over_when_the_first_delivery_passes_its_ack_deadline() {
    let redis = RedisServer::start().await;
    // A long backoff keeps the expired entry away while the namesake is checked.
    let sidecar =
        Sidecar::start(&redis, SidecarOptions::default().backoff(30_000).arg("--sharded-streams").arg("dup=2")).await;
    let mut con = redis.conn().await;
    let (a, b) = ("dup:{dup:0}", "dup:{dup:1}");
    xadd_raw_at(&mut con, a, "5-0", &[(b"from", b"a")]).await;

    let mut sub = subscribe_msg("dup", "g", GroupStart::Beginning);
    sub.ack_deadline = Some(duration_ms(1500));
    sub.max_in_flight = 8;
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;
    let first = consumer.next_delivery(EVENT_TIMEOUT).await;
    // Later, so the namesake's own deadline (which runs while it is parked)
    // still has time left when the first's passes.
    tokio::time::sleep(Duration::from_millis(900)).await;
    xadd_raw_at(&mut con, b, "5-0", &[(b"from", b"b")]).await;
    let second = consumer.next_delivery(Duration::from_secs(5)).await;
    assert_eq!(first.id, second.id, "one branded id");
    assert_ne!(first.stream, second.stream, "the namesake from the other shard, after the first's deadline");
    consumer.ack_one(&second.id).await;
    assert_eq!(wait_pending(&mut con, &second.stream, "g", 0, EVENT_TIMEOUT).await, 0);
    assert_eq!(
        wait_pending(&mut con, &first.stream, "g", 1, EVENT_TIMEOUT).await,
        1,
        "the first waits out its backoff"
    );
}

/// An ack Redis did not answer in time may or may not have been applied: the
/// verdict error says the outcome is unknown; an applied ack is not undone,
/// and an unapplied one's entry comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_redis_does_not_answer_in_time_is_reported_as_unknown_and_not_undone() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--redis-timeout-ms").arg("300")).await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let delivery = consumer.next_delivery(EVENT_TIMEOUT).await;

    let mut con = redis.conn().await;
    // Once OK comes back, Redis holds every client's commands for 3 s: longer
    // than the ack can wait when another step (a heartbeat, a gauge poll)
    // meets the pause first and retires the shared connection, and the ack's
    // settle has to connect anew (three attempts of 300 ms, ~1.5 s). With
    // 1.2 s that settle could connect after the pause and succeed.
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(3000).arg("ALL").query_async(&mut con).await.unwrap();
    let resumes = Instant::now() + Duration::from_millis(3000);
    consumer.ack_one(&delivery.id).await;
    let error = consumer.next_verdict_error(EVENT_TIMEOUT).await;
    tokio::time::sleep_until(resumes.into()).await;

    assert_eq!(error.code, VerdictErrorCode::Unavailable as i32);
    assert!(error.message.contains("outcome is unknown"), "{error:?}");
    // Either way nothing is lost and nothing is acked twice: an applied ack
    // stays applied, an unapplied one leaves the entry to come back.
    if pending_count(&mut con, "s", "g").await == 1 {
        let again = consumer.next_delivery(Duration::from_secs(15)).await;
        assert_eq!(again.id, delivery.id, "the unapplied ack's entry comes back");
        consumer.ack_one(&again.id).await;
    } else {
        consumer.assert_quiet(Duration::from_secs(2), "an applied ack is not undone").await;
    }
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

/// Dead-lettering an entry that was deleted from the stream while held has
/// nothing to move: the call is told, the PEL forgets it, nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettering_an_entry_deleted_while_held_is_answered_not_pending() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let appended = sidecar.append("s", &[("k", b"v")]).await;
    let delivery = consumer.next_delivery(EVENT_TIMEOUT).await;
    let _: i64 = redis::cmd("XDEL").arg("s").arg(&appended.stream_id).query_async(&mut con).await.unwrap();

    consumer.dead_letter(&delivery.id, "poison").await;
    let error = consumer.next_verdict_error(EVENT_TIMEOUT).await;

    assert_eq!(error.code, VerdictErrorCode::NotPending as i32);
    assert!(error.message.contains("deleted"), "{error:?}");
    assert!(!exists(&mut con, "s:dlq").await, "nothing was dead-lettered");
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

/// The reclaim beat (XAUTOCLAIM) and the lease refresh (XCLAIM JUSTID) each
/// drop a deleted entry from the PEL while a call still holds it: the call's
/// later Ack and Fail are answered NOT_PENDING saying why (not LEASE_LOST),
/// and nothing is acknowledged, retried or dead-lettered. On Redis 6.2 only
/// the lease refresh does: 6.2's XAUTOCLAIM leaves deleted entries it does not
/// claim in the PEL and claims them as if they were there. On a single
/// server the reclaim beat's XAUTOCLAIM runs only when the batched probe finds
/// an entry idle past min-idle: a dead peer's, deleted with the others here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_on_an_entry_a_beat_found_deleted_say_so() {
    // Each beat alone: the other's period is far longer than the test.
    let reclaim_beat = [("--reclaim-interval-ms", "50"), ("--reclaim-min-idle-ms", "600000")];
    let lease_refresh = [("--reclaim-interval-ms", "600000"), ("--reclaim-min-idle-ms", "300")];
    let server = RedisServer::start().await.info().await;
    let xautoclaim_drops_deleted = server.is_valkey() || server.redis >= (7, 0, 0);
    let beats = [("reclaim beat", reclaim_beat), ("lease refresh", lease_refresh)];
    for (beat, args) in beats.into_iter().filter(|(beat, _)| xautoclaim_drops_deleted || *beat != "reclaim beat") {
        let redis = RedisServer::start().await;
        let options = args.iter().fold(SidecarOptions::default(), |o, (flag, value)| o.arg(flag).arg(value));
        let sidecar = Sidecar::start(&redis, options).await;
        let mut con = redis.conn().await;
        let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
        let first = sidecar.append("s", &[("k", b"1")]).await;
        let second = sidecar.append("s", &[("k", b"2")]).await;
        let held = consumer.deliveries(2, EVENT_TIMEOUT).await;
        let mut ids = vec![first.stream_id.clone(), second.stream_id.clone()];
        if beat == "reclaim beat" {
            ids.push(dead_peers_entry(&mut con, "s", "g", b"dead", Some(Duration::from_secs(700))).await);
        }
        // One XDEL, so that one pass of the beat finds them all.
        let _: i64 = redis::cmd("XDEL").arg("s").arg(&ids).query_async(&mut con).await.unwrap();
        assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0, "the {beat} drops deleted entries");
        // Past further beats: one that took a deleted entry for a lost lease
        // would tell the call LEASE_LOST here.
        tokio::time::sleep(Duration::from_millis(400)).await;

        consumer.ack_one(&held[0].id).await;
        consumer.fail(&held[1].id, None).await;
        for _ in 0..2 {
            let error = consumer.next_verdict_error(EVENT_TIMEOUT).await;
            assert_eq!(error.code, VerdictErrorCode::NotPending as i32, "{beat}: {error:?}");
            assert!(error.message.contains("deleted from the stream"), "{beat}: {error:?}");
        }
        assert!(!exists(&mut con, "s:retries:g").await, "{beat}: nothing was scheduled for retry");
        assert_eq!(sidecar.counter("echomq_leases_lost_total").await, 0.0, "{beat}: no lease counted as lost");
        // The held entries, and the dead peer's.
        let trimmed = ids.len();
        assert_eq!(
            sidecar.counter("echomq_trimmed_while_pending_total").await,
            trimmed as f64,
            "{beat}: counted as trimmed"
        );
        let logged: Vec<String> = sidecar
            .log()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("deleted from the stream"))
            .map(str::to_owned)
            .collect();
        let line = format!("entries={trimmed}");
        assert!(logged.len() == 1 && logged[0].contains(&line), "{beat}: one line for the pass: {logged:?}");
        consumer.assert_quiet(Duration::from_millis(300), "a deleted entry is never handed out again").await;
    }
}

/// A sharded stream's call shares its credit out over the shards: a backlog
/// in one shard cannot take the slots of another, whose entry is handed out
/// while the backlog's deliveries are still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_shard_cannot_take_the_credit_of_another() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--sharded-streams").arg("fair=2")).await;
    let mut con = redis.conn().await;
    let (busy, quiet) = ("fair:{fair:0}", "fair:{fair:1}");
    for i in 0..20 {
        sidecar.append(busy, &[("n", i.to_string().as_bytes())]).await;
    }
    let mut consumer = Consumer::start(&sidecar, "fair", "g", GroupStart::Beginning, 4).await;
    let first = consumer.deliveries(2, EVENT_TIMEOUT).await;
    assert!(first.iter().all(|d| d.stream == busy));
    consumer.assert_quiet(Duration::from_millis(500), "the busy shard holds its whole share").await;

    // Nothing is acked: only the quiet shard's own share can take its entry.
    let late = sidecar.append(quiet, &[("n", b"late")]).await;
    let delivered = consumer.next_delivery(EVENT_TIMEOUT).await;

    assert_eq!((delivered.id.as_str(), delivered.stream.as_str()), (late.id.as_str(), quiet));
    assert_eq!(pending_count(&mut con, busy, "g").await, 2, "the busy shard never held more than its share");
}

/// On a sharded stream a Release, like an Ack, goes to the shard that
/// delivered each id: both shards' entries go back, each to its own shard's
/// group, and the group's other call gets them at once, at no attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_a_sharded_stream_gives_each_entry_back_to_its_shard() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--sharded-streams").arg("rel=2")).await;
    let mut con = redis.conn().await;
    let shards = ["rel:{rel:0}", "rel:{rel:1}"];
    let mut first = Consumer::start(&sidecar, "rel", "g", GroupStart::New, 2).await;
    let mut appended = Vec::new();
    for shard in shards {
        appended.push(sidecar.append(shard, &[("k", shard.as_bytes())]).await.id);
    }
    let got = first.deliveries(2, EVENT_TIMEOUT).await;
    assert_eq!(got.iter().map(|d| d.stream.as_str()).collect::<BTreeSet<_>>(), shards.into_iter().collect());

    let mut second = Consumer::start(&sidecar, "rel", "g", GroupStart::New, 2).await;
    first.send(req(Kind::Drain(Drain {}))).await;
    release(&first, &appended.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let taken = second.deliveries(2, EVENT_TIMEOUT).await;
    let mut ids = ids(&taken);
    ids.sort();
    appended.sort();
    assert_eq!(ids, appended);
    assert!(taken.iter().all(|d| d.attempts == 1), "at no attempt: {taken:?}");
    first.assert_quiet(Duration::from_millis(300), "no verdict error: each id went to its shard").await;
    for shard in shards {
        let pending = pending_entries(&mut con, shard, "g").await;
        assert_eq!(pending.iter().map(|p| p.deliveries).collect::<Vec<_>>(), [1], "{shard}: {pending:?}");
    }
}

/// The sidecar's resident memory, in bytes (`VmRSS` in /proc).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let kib = status.lines().find_map(|line| line.strip_prefix("VmRSS:")).expect("VmRSS");
    kib.trim().trim_end_matches("kB").trim().parse::<u64>().expect("a number of kB") * 1024
}

/// A client that sends Acks of unknown ids without reading the answers is held
/// back (the relay stops reading it once answers pile up), so the sidecar's
/// memory does not grow with what it sends; once it reads, every answer is
/// there, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_without_reading_is_held_back() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let pid = sidecar.pid().expect("running");
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let ids: Vec<String> = (1..=1000u64).map(|n| format!("{n:028x}")).collect();
    let before = resident_bytes(pid);

    // 300,000 unknown ids, each answered UNKNOWN_ID; before the relay held the
    // client back, they queued inside the sidecar at some 400 bytes each.
    let mut sent = 0;
    for _ in 0..300 {
        let ack = req(Kind::Ack(Ack { ids: ids.clone() }));
        match tokio::time::timeout(Duration::from_secs(2), consumer.send(ack)).await {
            Ok(()) => sent += 1,
            Err(_) => break,
        }
    }
    let grown = resident_bytes(pid).saturating_sub(before);

    assert!(sent < 300, "the sidecar kept reading a client that does not read: {sent} Acks of 1,000 ids taken");
    assert!(grown < 40 << 20, "the sidecar grew by {} MiB after taking {sent} Acks of 1,000 ids", grown >> 20);
    for n in 0..2000 {
        let error = consumer.next_verdict_error(EVENT_TIMEOUT).await;
        assert_eq!((error.code, error.id.as_str()), (VerdictErrorCode::UnknownId as i32, ids[n % 1000].as_str()));
    }
}

/// One Ack naming 100,000 unknown ids (on a sidecar whose
/// `--max-in-flight-limit` lets a call hold that many), from a client that
/// does not read the answers: the sidecar hands the ids to the worker in
/// pieces, each once the answers before it are read, so it grows by the
/// message, not by 100,000 answers. Once the client reads, every answer is
/// there, in order, and its next Ack is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_ack_of_many_unknown_ids_is_answered_as_the_client_reads() {
    let redis = RedisServer::start().await;
    let options = SidecarOptions::default().arg("--max-in-flight-limit").arg("100000");
    let sidecar = Sidecar::start(&redis, options).await;
    let pid = sidecar.pid().expect("running");
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let held = consumer.next_delivery(EVENT_TIMEOUT).await;
    let ids: Vec<String> = (1..=100_000u64).map(|n| format!("{n:028x}")).collect();
    let before = resident_bytes(pid);

    consumer.send(req(Kind::Ack(Ack { ids: ids.clone() }))).await;
    consumer.ack_one(&held.id).await;
    // Time for the whole message's answers to be made, were they all made at once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = resident_bytes(pid).saturating_sub(before);

    // 13 MiB here (the message, parsed); 58 MiB when the whole message went at once.
    assert!(grown < 30 << 20, "the sidecar grew by {} MiB holding answers nobody read", grown >> 20);
    assert_eq!(pending_count(&mut con, "s", "g").await, 1, "the Ack behind the large one waits its turn");
    for (n, id) in ids.iter().enumerate() {
        let error = consumer.next_verdict_error(EVENT_TIMEOUT).await;
        assert_eq!((error.code, error.id.as_str()), (VerdictErrorCode::UnknownId as i32, id.as_str()), "answer {n}");
    }
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0, "the next Ack is applied");
}

/// An Ack naming more ids than any call may hold (`--max-in-flight-limit`)
/// ends the call with INVALID_ARGUMENT saying so, rather than sit decoded in
/// the sidecar; what the call held stays pending and comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_of_more_ids_than_a_call_may_hold_ends_the_call() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--max-in-flight-limit").arg("100")).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let held = consumer.next_delivery(EVENT_TIMEOUT).await;
    let mut ids: Vec<String> = (1..=100u64).map(|n| format!("{n:028x}")).collect();
    ids.push(held.id.clone());

    consumer.send(req(Kind::Ack(Ack { ids }))).await;

    match consumer.next_event(EVENT_TIMEOUT).await {
        Event::Ended(Some(status)) => {
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert!(status.message().contains("101 ids in one message, where at most 100"), "{status:?}");
            assert!(status.message().contains("--max-in-flight-limit"), "{status:?}");
        }
        other => panic!("expected the call to end INVALID_ARGUMENT, got {other:?}"),
    }
    assert_eq!(pending_count(&mut con, "s", "g").await, 1, "nothing of the refused Ack was applied");
    let mut next = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let again = next.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!((again.id.as_str(), again.attempts), (held.id.as_str(), 2));
}

/// A client that sends its last verdicts and closes its side at once still
/// hears how they went before the call ends OK: the answers of the final
/// flush are sent, not dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_errors_reach_a_client_that_closed_its_side() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let held = sidecar.append("s", &[("k", b"v")]).await;
    consumer.next_delivery(EVENT_TIMEOUT).await;
    // Acknowledged elsewhere, so this call's Ack reaches Redis and is answered NOT_PENDING.
    let _: i64 = redis::cmd("XACK").arg("s").arg("g").arg(&held.stream_id).query_async(&mut con).await.unwrap();
    let unknown = format!("{:028x}", 7);

    consumer.ack(&[&held.id, &unknown]).await;
    consumer.close_send();

    let mut answered = BTreeSet::new();
    for _ in 0..2 {
        let error = consumer.next_verdict_error(EVENT_TIMEOUT).await;
        answered.insert((error.id, error.code));
    }
    let expected =
        [(held.id.clone(), VerdictErrorCode::NotPending as i32), (unknown, VerdictErrorCode::UnknownId as i32)];
    assert_eq!(answered, BTreeSet::from(expected), "{}", sidecar.log());
    assert!(matches!(consumer.next_event(EVENT_TIMEOUT).await, Event::Ended(None)), "then the call ends OK");
}

/// An entry whose ack deadline passed has its retry delay in Redis at once
/// (binding peers, outliving a restart), and once it comes back and is
/// acknowledged, the retry hash keeps nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_deliverys_retry_state_is_in_redis_until_it_is_acked() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut sub = subscribe_msg("s", "g", GroupStart::New);
    sub.ack_deadline = Some(duration_ms(300));
    sub.retry_backoff_initial = Some(duration_ms(3000));
    sub.retry_backoff_max = Some(duration_ms(3000));
    let mut consumer = Consumer::subscribe(&sidecar, sub).await;
    let entry = sidecar.append("s", &[("k", b"v")]).await;
    consumer.next_delivery(EVENT_TIMEOUT).await;

    let retries = con.clone();
    let stored = || {
        let mut con = retries.clone();
        let id = entry.stream_id.clone();
        async move { redis::cmd("HEXISTS").arg("s:retries:g").arg(id).query_async::<bool>(&mut con).await.unwrap() }
    };
    // Written when the deadline passes, not with the call's next verdict
    // (none comes before the re-delivery's ack, which removes it).
    assert!(eventually(EVENT_TIMEOUT, stored).await, "the delay is written when the deadline passes");
    let again = consumer.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!((again.id.as_str(), again.attempts), (entry.id.as_str(), 2));
    consumer.ack_one(&again.id).await;

    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    assert!(eventually(EVENT_TIMEOUT, || async { !stored().await }).await, "the acked entry's retry state is gone");
}
