//! ConsumeRequest.ack_emit: a delivery's XACK and its emits in one script,
//! only while the call's sidecar still holds the entry, against a real
//! redis-server and the real sidecar binary: the emitted ids, the branded ids
//! and trace context in the sink, the fence (a peer's reclaim, another
//! client's ack, a duplicate run), bad input, the allow-list, durable
//! confirmation, and the pipeline proof under faults.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use echomq::proto::{GroupStart, VerdictErrorCode};
use support::*;

const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn code(error: &echomq::proto::VerdictError) -> VerdictErrorCode {
    VerdictErrorCode::try_from(error.code).expect("a known code")
}

/// A sidecar whose leases are not refreshed within a test (min idle 60 s),
/// so the script, not the lease refresh, meets a peer's reclaim.
fn slow_leases() -> SidecarOptions {
    SidecarOptions::default().reclaim(60_000, 60_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_emit_appends_branded_entries_with_the_trace_context_and_acknowledges_the_source() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let source = sidecar.append("src", &[("n", b"1"), ("traceparent", TRACE.as_bytes())]).await;
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(delivery.traceparent, TRACE);

    let own_trace = "00-11111111111111111111111111111111-2222222222222222-01";
    call.ack_emit(
        &delivery.id,
        &[
            ("sink", &[("source", delivery.id.as_bytes()), ("v", b"a")]),
            ("sink", &[("v", b"b")]),
            ("audit", &[("traceparent", own_trace.as_bytes())]),
        ],
    )
    .await;
    let emitted = call.next_emitted(EVENT_TIMEOUT).await;

    assert_eq!(emitted.id, source.id);
    let streams: Vec<&str> = emitted.entries.iter().map(|e| e.stream.as_str()).collect();
    assert_eq!(streams, ["sink", "sink", "audit"], "one answer per emit, in order");
    let sink = xrange(&mut con, "sink").await;
    assert_eq!(sink.len(), 2);
    for (entry, answer) in sink.iter().zip(&emitted.entries) {
        assert_eq!(entry.stream_id, answer.stream_id);
        assert_eq!(answer.id.len(), 28);
        assert_eq!(entry.field("id"), Some(answer.id.as_bytes()), "the branded id is minted into the entry");
        assert_eq!(entry.field("traceparent"), Some(TRACE.as_bytes()), "the source's trace context travels on");
    }
    assert!(emitted.entries[0].id < emitted.entries[1].id, "minted in order");
    assert_eq!(sink[0].field("source"), Some(delivery.id.as_bytes()));
    assert_eq!(sink[1].field("v"), Some(&b"b"[..]));
    let audit = xrange(&mut con, "audit").await;
    assert_eq!(audit[0].field("traceparent"), Some(own_trace.as_bytes()), "an emit's own trace context wins");
    assert_eq!(pending_count(&mut con, "src", "g").await, 0, "the source entry is acknowledged");
    assert!(eventually(EVENT_TIMEOUT, || async { sidecar.counter("echomq_emits_total").await == 3.0 }).await);

    // The emitted entries are ordinary entries: a group downstream gets them with their branded ids.
    let mut downstream = Consumer::start(&sidecar, "sink", "g", GroupStart::Beginning, 4).await;
    let got = downstream.deliveries(2, EVENT_TIMEOUT).await;
    assert_eq!(ids(&got), vec![emitted.entries[0].id.clone(), emitted.entries[1].id.clone()]);
    assert_eq!(got[0].traceparent, TRACE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_emit_without_emits_is_an_ack_through_the_fence() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    sidecar.append("src", &[("n", b"1")]).await;
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;

    call.ack_emit(&delivery.id, &[]).await;

    let emitted = call.next_emitted(EVENT_TIMEOUT).await;
    assert!(emitted.entries.is_empty());
    assert_eq!(pending_count(&mut con, "src", "g").await, 0);
}

/// A peer reclaimed the entry (it is pending for another consumer) before
/// this sidecar's lease refresh noticed: the script finds it so, answers
/// LEASE_LOST and writes nothing; the peer's entry stays the peer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_emit_after_a_peers_reclaim_is_lease_lost_and_writes_nothing() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, slow_leases()).await;
    let mut con = redis.conn().await;
    let source = sidecar.append("src", &[("n", b"1")]).await;
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg("src")
        .arg("g")
        .arg("peer")
        .arg(0)
        .arg(&source.stream_id)
        .query_async(&mut con)
        .await
        .unwrap();

    call.ack_emit(&delivery.id, &[("sink", &[("v", b"x")])]).await;

    let error = call.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(code(&error), VerdictErrorCode::LeaseLost, "{error:?}");
    assert!(!exists(&mut con, "sink").await, "a call that lost its lease writes nothing");
    let pel = pending_entries(&mut con, "src", "g").await;
    assert_eq!(pel.len(), 1);
    assert_eq!(pel[0].consumer, "peer", "the peer's entry is not acknowledged from under it");
}

/// Another client acknowledged the entry (or an earlier AckEmit did, on a
/// duplicate handler run elsewhere): NOT_PENDING, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_emit_of_an_entry_acknowledged_elsewhere_is_not_pending_and_writes_nothing() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, slow_leases()).await;
    let mut con = redis.conn().await;
    let source = sidecar.append("src", &[("n", b"1")]).await;
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;
    let _: i64 = redis::cmd("XACK").arg("src").arg("g").arg(&source.stream_id).query_async(&mut con).await.unwrap();

    call.ack_emit(&delivery.id, &[("sink", &[("v", b"x")])]).await;

    let error = call.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(code(&error), VerdictErrorCode::NotPending, "{error:?}");
    assert!(!exists(&mut con, "sink").await);
}

/// A handler that runs twice for one delivery sends two AckEmits: one is
/// applied, the other writes nothing, whether the second comes on the same
/// call or on another call after the entry came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_handler_run_emits_once() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(50)).await;
    let mut con = redis.conn().await;
    sidecar.append("src", &[("n", b"1")]).await;
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;

    call.ack_emit(&delivery.id, &[("sink", &[("source", delivery.id.as_bytes())])]).await;
    call.ack_emit(&delivery.id, &[("sink", &[("source", delivery.id.as_bytes())])]).await;

    // The second is answered from the ledger at once, the first once its script ran.
    assert_one_emitted_one_unknown(&mut call).await;
    assert_eq!(xlen(&mut con, "sink").await, 1);

    // A slow run passes its ack deadline: the entry comes back and runs
    // again; both runs answer with an AckEmit, and only one is applied.
    let mut sub = subscribe_msg("src2", "g", GroupStart::Beginning);
    sub.ack_deadline = Some(duration_ms(300));
    sub.max_in_flight = 4;
    let mut slow = Consumer::subscribe(&sidecar, sub).await;
    sidecar.append("src2", &[("n", b"1")]).await;
    let first_run = slow.next_delivery(EVENT_TIMEOUT).await;
    let second_run = slow.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!((second_run.id.as_str(), second_run.attempts), (first_run.id.as_str(), 2));
    slow.ack_emit(&first_run.id, &[("sink2", &[("source", first_run.id.as_bytes())])]).await;
    slow.ack_emit(&second_run.id, &[("sink2", &[("source", second_run.id.as_bytes())])]).await;
    assert_one_emitted_one_unknown(&mut slow).await;
    assert_eq!(xlen(&mut con, "sink2").await, 1, "one emit per source entry");
    assert_eq!(pending_count(&mut con, "src2", "g").await, 0);
}

/// The next two answers are one Emitted and one UNKNOWN_ID, in either order.
async fn assert_one_emitted_one_unknown(call: &mut Consumer) {
    let (mut emitted, mut unknown) = (0, 0);
    for _ in 0..2 {
        match call.next_event(EVENT_TIMEOUT).await {
            Event::Emitted(_) => emitted += 1,
            Event::VerdictError(e) if code(&e) == VerdictErrorCode::UnknownId => unknown += 1,
            other => panic!("expected Emitted or UNKNOWN_ID, got {other:?}"),
        }
    }
    assert_eq!((emitted, unknown), (1, 1));
}

/// Every bad emit is answered with a verdict error naming it; nothing is
/// written and the delivery stays held: a good AckEmit of it then applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_emits_are_refused_write_nothing_and_leave_the_delivery_held() {
    let redis = RedisServer::start().await;
    let options = slow_leases().arg("--max-message-bytes").arg("4096").arg("--max-fields-per-entry").arg("3");
    let sidecar = Sidecar::start(&redis, options).await;
    let mut con = redis.conn().await;
    sidecar.append("src", &[("n", b"1")]).await;
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;
    let long_name = "s".repeat(2000);
    let big = vec![b'x'; 3900];
    let bad: Vec<(&str, Vec<(&str, &[u8])>, &str)> = vec![
        ("sink", vec![("id", b"mine")], "reserved field"),
        ("", vec![("v", b"1")], "emits[1]: stream: required"),
        (&long_name, vec![("v", b"1")], "longer than this sidecar's limit"),
        ("sink", vec![("v", &big)], "--max-message-bytes"),
        ("sink", vec![("a", b""), ("b", b""), ("c", b""), ("d", b"")], "4 fields is more than"),
    ];
    for (stream, fields, says) in &bad {
        // A good emit first: the bad one after it must keep it from being written too.
        call.ack_emit(&delivery.id, &[("sink", &[("v", b"good")]), (stream, fields)]).await;
        let error = call.next_verdict_error(EVENT_TIMEOUT).await;
        assert_eq!(code(&error), VerdictErrorCode::InvalidArgument, "{error:?}");
        assert_eq!(error.id, delivery.id);
        assert!(error.message.contains(says), "`{}` should say {says}", error.message);
        assert!(error.message.contains("nothing was written"), "{}", error.message);
    }
    assert!(!exists(&mut con, "sink").await, "no bad AckEmit wrote anything");
    assert_eq!(pending_count(&mut con, "src", "g").await, 1);

    call.ack_emit(&delivery.id, &[("sink", &[("v", b"good")])]).await;
    call.next_emitted(EVENT_TIMEOUT).await;
    assert_eq!(xlen(&mut con, "sink").await, 1, "still held: the good AckEmit applied");
}

/// An emit stream that holds another Redis type fails inside the script
/// before anything is written: INVALID_ARGUMENT, the source stays pending
/// and comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_to_a_key_of_another_type_writes_nothing_and_the_entry_comes_back() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(50)).await;
    let mut con = redis.conn().await;
    let _: () = redis::cmd("SET").arg("taken").arg("a string").query_async(&mut con).await.unwrap();
    sidecar.append("src", &[("n", b"1")]).await;
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;

    call.ack_emit(&delivery.id, &[("sink", &[("v", b"1")]), ("taken", &[("v", b"2")])]).await;

    let error = call.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(code(&error), VerdictErrorCode::InvalidArgument, "{error:?}");
    assert!(error.message.contains("WRONGTYPE"), "{}", error.message);
    assert!(!exists(&mut con, "sink").await, "the good emit before it was not written either");
    let back = call.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(back.id, delivery.id, "still pending: delivered again");
    call.ack_emit(&back.id, &[("sink", &[("v", b"1")])]).await;
    call.next_emitted(EVENT_TIMEOUT).await;
    assert_eq!(xlen(&mut con, "sink").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_outside_the_allow_list_is_permission_denied_and_writes_nothing() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, slow_leases().arg("--allow-streams").arg("src,sink:*")).await;
    let mut con = redis.conn().await;
    sidecar.append("src", &[("n", b"1")]).await;
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;

    call.ack_emit(&delivery.id, &[("sink:a", &[("v", b"1")]), ("secret", &[("v", b"2")])]).await;

    let error = call.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(code(&error), VerdictErrorCode::PermissionDenied, "{error:?}");
    assert!(error.message.contains("secret"), "{}", error.message);
    assert!(!exists(&mut con, "sink:a").await && !exists(&mut con, "secret").await);
    assert_eq!(pending_count(&mut con, "src", "g").await, 1, "the source entry is still held");
    call.ack_emit(&delivery.id, &[("sink:a", &[("v", b"1")])]).await;
    call.next_emitted(EVENT_TIMEOUT).await;
    assert!(eventually(EVENT_TIMEOUT, || async { sidecar.counter("echomq_verdict_errors_total").await >= 1.0 }).await);
}

/// With `--wait-replicas 1` and no replica, the step is applied on the
/// primary but not confirmed: UNAVAILABLE, naming the ids written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_an_unconfirmed_ack_emit_is_unavailable_naming_what_was_written() {
    let redis = RedisServer::start().await;
    let options = SidecarOptions::default().arg("--wait-replicas").arg("1").arg("--wait-timeout-ms").arg("200");
    let sidecar = Sidecar::start(&redis, options).await;
    let mut con = redis.conn().await;
    // Appended around the sidecar: its own Append would wait too.
    xadd_raw(&mut con, "src", &[(b"n", b"1")]).await;
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;

    call.ack_emit(&delivery.id, &[("sink", &[("v", b"1")])]).await;

    let error = call.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(code(&error), VerdictErrorCode::Unavailable, "{error:?}");
    let sink = xrange(&mut con, "sink").await;
    assert_eq!(sink.len(), 1, "written to the primary");
    let branded = String::from_utf8(sink[0].field("id").unwrap().to_vec()).unwrap();
    assert!(error.message.contains(&branded) && error.message.contains(&sink[0].stream_id), "{}", error.message);
    assert!(error.message.contains("not confirmed") && error.message.contains("WAIT"), "{}", error.message);
    assert_eq!(pending_count(&mut con, "src", "g").await, 0, "and acknowledged with it");
}
