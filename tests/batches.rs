//! Batched delivery frames (`Subscribe.max_batch`): how deliveries are framed,
//! and that each delivery of a batch is settled on its own, against a real
//! redis-server and the real sidecar binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::time::Duration;

use echomq::proto::{ConsumeResponse, DeliveryBatch, GroupStart, Subscribe};
use prost::Message;
use support::*;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(10);

fn batched(stream: &str, group: &str, max_batch: u32) -> Subscribe {
    Subscribe { max_batch, max_in_flight: 1000, ..subscribe_msg(stream, group, GroupStart::Beginning) }
}

/// Appends `n` entries with a body of `size` bytes; their branded ids in order.
async fn append_n(sidecar: &Sidecar, stream: &str, n: usize, size: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let body = vec![b'a' + (i % 26) as u8; size];
        ids.push(sidecar.append(stream, &[("body", &body)]).await.id);
    }
    ids
}

#[tokio::test]
async fn frames_hold_at_most_max_batch_deliveries_and_lose_none() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("batch-a")).await;
    let appended = append_n(&sidecar, "orders", 10, 10).await;
    let mut consumer = Consumer::subscribe(&sidecar, batched("orders", "g", 4)).await;

    let frames = consumer.batches(10, WAIT).await;
    assert!(frames.iter().all(|f| (1..=4).contains(&f.len())), "{:?}", frames.iter().map(Vec::len).collect::<Vec<_>>());
    assert!(frames.iter().any(|f| f.len() > 1), "entries read together go out together");
    let mut got: Vec<String> = frames.iter().flatten().map(|d| d.id.clone()).collect();
    assert_eq!(got, appended, "in stream order, each once");
    got.dedup();
    assert_eq!(got.len(), 10);
}

#[tokio::test]
async fn a_batch_frame_never_exceeds_the_message_size_limit() {
    let redis = RedisServer::start().await;
    let limit = 8 * 1024;
    let sidecar =
        Sidecar::start(&redis, SidecarOptions::named("batch-b").arg("--max-message-bytes").arg(&limit.to_string()))
            .await;
    append_n(&sidecar, "big", 12, 2000).await;
    let mut consumer = Consumer::subscribe(&sidecar, batched("big", "g", 100)).await;

    let frames = consumer.batches(12, WAIT).await;
    for frame in &frames {
        let encoded = ConsumeResponse {
            kind: Some(echomq::proto::consume_response::Kind::Batch(DeliveryBatch::from(frame.clone()))),
        }
        .encoded_len();
        assert!(encoded <= limit, "a frame of {} deliveries is {encoded} bytes, over {limit}", frame.len());
    }
    assert!(frames.len() >= 3, "12 entries of 2 kB cannot fit fewer than 3 frames of 8 kB");
    assert!(frames.iter().any(|f| f.len() > 1), "the limit still lets several entries share a frame");
}

#[tokio::test]
async fn one_ack_settles_ids_from_two_batches() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("batch-c")).await;
    let mut con = redis.conn().await;
    append_n(&sidecar, "s", 3, 10).await;
    let mut consumer = Consumer::subscribe(&sidecar, batched("s", "g", 64)).await;
    let first = consumer.batches(3, WAIT).await;
    append_n(&sidecar, "s", 2, 10).await;
    let second = consumer.batches(2, WAIT).await;

    let all: Vec<String> = first.iter().chain(&second).flatten().map(|d| d.id.clone()).collect();
    assert_eq!(all.len(), 5);
    consumer.ack(&all.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, WAIT).await, 0, "every id of both batches acknowledged");
    consumer.assert_quiet(Duration::from_millis(300), "no verdict error for any of them").await;
}

#[tokio::test]
async fn a_fail_inside_a_batch_brings_back_only_that_entry() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("batch-d").backoff(50)).await;
    let mut con = redis.conn().await;
    let appended = append_n(&sidecar, "s", 4, 10).await;
    let mut consumer = Consumer::subscribe(&sidecar, batched("s", "g", 64)).await;
    let got: Vec<String> = consumer.batches(4, WAIT).await.into_iter().flatten().map(|d| d.id).collect();
    assert_eq!(got, appended);

    consumer.fail(&appended[2], Some(Duration::from_millis(100))).await;
    let others: Vec<&str> = appended.iter().enumerate().filter(|(i, _)| *i != 2).map(|(_, id)| id.as_str()).collect();
    consumer.ack(&others).await;

    let again = consumer.next_batch(WAIT).await;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id.as_str(), again[0].attempts), (appended[2].as_str(), 2));
    consumer.ack(&[&appended[2]]).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, WAIT).await, 0);
}

#[tokio::test]
async fn a_disconnect_with_a_partly_acked_batch_redelivers_exactly_the_unacked() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("batch-e").backoff(50)).await;
    let mut con = redis.conn().await;
    let appended = append_n(&sidecar, "s", 5, 10).await;
    let mut consumer = Consumer::subscribe(&sidecar, batched("s", "g", 64)).await;
    consumer.batches(5, WAIT).await;
    consumer.ack(&[&appended[0], &appended[3]]).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 3, WAIT).await, 3, "the two acks applied before the disconnect");
    drop(consumer);

    let mut next = Consumer::subscribe(&sidecar, batched("s", "g", 64)).await;
    let back: Vec<_> = next.batches(3, WAIT).await.into_iter().flatten().collect();
    let mut ids: Vec<&str> = back.iter().map(|d| d.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![appended[1].as_str(), appended[2].as_str(), appended[4].as_str()]);
    assert!(back.iter().all(|d| d.attempts == 2), "{:?}", back.iter().map(|d| d.attempts).collect::<Vec<_>>());
    next.assert_quiet(Duration::from_millis(300), "nothing else comes back").await;
}

#[tokio::test]
async fn max_batch_0_or_1_gets_one_delivery_per_frame() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("batch-f")).await;
    append_n(&sidecar, "s", 3, 10).await;
    for (group, max_batch) in [("g0", 0), ("g1", 1)] {
        let mut consumer = Consumer::subscribe(&sidecar, batched("s", group, max_batch)).await;
        let singles = consumer.deliveries(3, WAIT).await;
        assert_eq!(singles.len(), 3, "max_batch {max_batch}");
    }
}

#[tokio::test]
async fn max_batch_above_the_limit_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("batch-g")).await;
    let refused = Consumer::try_subscribe(&sidecar, batched("s", "g", 4097)).await.err().expect("refused");
    assert_code(&refused, Code::InvalidArgument);
    assert!(refused.message().contains("max_batch"), "{}", refused.message());
}

#[tokio::test]
async fn a_drain_cuts_off_the_read_so_no_entry_is_taken_for_nobody() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("batch-h")).await;
    let mut con = redis.conn().await;
    for no_ack in [false, true] {
        let group = if no_ack { "at-most-once" } else { "at-least-once" };
        let subscribe = Subscribe { no_ack, ..subscribe_msg("du", group, GroupStart::New) };
        let mut consumer = Consumer::subscribe(&sidecar, subscribe).await;
        consumer.send(req(echomq::proto::consume_request::Kind::Drain(Default::default()))).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let appended = xadd_raw(&mut con, "du", &[(b"n", b"after the drain")]).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let last_read = last_delivered_id(&mut con, "du", group).await;
        assert_ne!(last_read, appended, "{group}: the group read an entry no call would take");
        consumer.assert_quiet(Duration::from_millis(100), "drained: nothing is handed out").await;
        drop(consumer);
        let _: i64 = redis::cmd("XTRIM").arg("du").arg("MAXLEN").arg(0).query_async(&mut con).await.unwrap();
    }
}

#[tokio::test]
async fn a_call_with_one_free_slot_still_gets_a_new_entry_promptly() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("batch-i")).await;
    let subscribe = Subscribe { max_in_flight: 8, max_batch: 8, ..subscribe_msg("s", "g", GroupStart::Beginning) };
    append_n(&sidecar, "s", 7, 10).await;
    let mut consumer = Consumer::subscribe(&sidecar, subscribe).await;
    consumer.batches(7, WAIT).await;
    // 7 of 8 held, never acked: below a quarter of the credit is free.
    let last = append_n(&sidecar, "s", 1, 10).await;
    let started = std::time::Instant::now();
    let frame = consumer.next_batch(Duration::from_secs(1)).await;
    assert_eq!(frame.iter().map(|d| d.id.clone()).collect::<Vec<_>>(), last);
    assert!(started.elapsed() < Duration::from_millis(500), "took {:?}", started.elapsed());
}
