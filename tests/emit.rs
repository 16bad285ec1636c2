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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// One sidecar on a fresh Redis with `options`, one entry in `src` (field
/// `n`), and a call on `src`/`g` that holds its delivery.
struct Held {
    // Kept for their lifetime: dropping them stops the processes.
    _redis: RedisServer,
    sidecar: Sidecar,
    con: redis::aio::MultiplexedConnection,
    call: Consumer,
    delivery: echomq::proto::Delivery,
}

async fn held(options: SidecarOptions) -> Held {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, options).await;
    let con = redis.conn().await;
    sidecar.append("src", &[("n", b"1")]).await;
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;
    Held { _redis: redis, sidecar, con, call, delivery }
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
    let Held { _redis, sidecar: _sidecar, mut con, mut call, delivery } = held(SidecarOptions::default()).await;

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
    let Held { _redis, sidecar: _sidecar, mut con, mut call, delivery } = held(slow_leases()).await;
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg("src")
        .arg("g")
        .arg("peer")
        .arg(0)
        .arg(&delivery.stream_id)
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
    let Held { _redis, sidecar: _sidecar, mut con, mut call, delivery } = held(slow_leases()).await;
    let _: i64 = redis::cmd("XACK").arg("src").arg("g").arg(&delivery.stream_id).query_async(&mut con).await.unwrap();

    call.ack_emit(&delivery.id, &[("sink", &[("v", b"x")])]).await;

    let error = call.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(code(&error), VerdictErrorCode::NotPending, "{error:?}");
    assert!(!exists(&mut con, "sink").await);
}

/// A handler that runs twice for one delivery sends two AckEmits: one is
/// applied, the other writes nothing: whether both runs answer while the
/// call holds the delivery, or the first run passed its ack deadline and the
/// entry came back for the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_handler_run_emits_once() {
    let Held { _redis, sidecar, mut con, mut call, delivery } = held(SidecarOptions::default().backoff(50)).await;

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
    let options = slow_leases().arg("--max-message-bytes").arg("4096").arg("--max-fields-per-entry").arg("3");
    let Held { _redis, sidecar: _sidecar, mut con, mut call, delivery } = held(options).await;
    let long_name = "s".repeat(2000);
    let big = vec![b'x'; 3900];
    // Each: the bad emit's stream, its fields, and what its answer must say.
    type Bad<'a> = (&'a str, Vec<(&'a str, &'a [u8])>, &'a str);
    let bad: Vec<Bad> = vec![
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
    assert!(error.message.contains("WRONGTYPE") && error.message.contains("`taken`"), "{}", error.message);
    assert!(!exists(&mut con, "sink").await, "the good emit before it was not written either");
    let back = call.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(back.id, delivery.id, "still pending: delivered again");
    call.ack_emit(&back.id, &[("sink", &[("v", b"1")])]).await;
    call.next_emitted(EVENT_TIMEOUT).await;
    assert_eq!(xlen(&mut con, "sink").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_outside_the_allow_list_is_permission_denied_and_writes_nothing() {
    let allowed = slow_leases().arg("--allow-streams").arg("src,sink:*");
    let Held { _redis, sidecar, mut con, mut call, delivery } = held(allowed).await;

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

/// On a Redis Cluster one script writes the source and every emit stream,
/// so they must share a slot: an emit elsewhere is INVALID_ARGUMENT naming
/// the rule, nothing is written, and one on the slot (a shared hash tag) works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_emits_must_share_the_source_streams_slot() {
    use support::cluster::{key_slot, RedisCluster};
    let cluster = RedisCluster::start(3, 0).await;
    let sidecar = Sidecar::start_with_url(&cluster.seed_url(), slow_leases()).await;
    let mut con = cluster.conn().await;
    let (source, beside, elsewhere) = ("{orders}:in", "{orders}:out", "payments");
    assert_eq!(key_slot(source), key_slot(beside));
    assert_ne!(key_slot(source), key_slot(elsewhere));
    sidecar.append(source, &[("n", b"1")]).await;
    let mut call = Consumer::start(&sidecar, source, "g", GroupStart::Beginning, 4).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;

    call.ack_emit(&delivery.id, &[(beside, &[("v", b"1")]), (elsewhere, &[("v", b"2")])]).await;

    let error = call.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(code(&error), VerdictErrorCode::InvalidArgument, "{error:?}");
    assert!(error.message.contains("slot") && error.message.contains("hash tag"), "{}", error.message);
    let written: i64 = redis::cmd("EXISTS").arg(beside).query_async(&mut con).await.unwrap();
    assert_eq!(written, 0, "nothing written, not even the emit on the slot");

    call.ack_emit(&delivery.id, &[(beside, &[("v", b"1")])]).await;
    let emitted = call.next_emitted(EVENT_TIMEOUT).await;
    assert_eq!(emitted.entries[0].stream, beside);
    let len: i64 = redis::cmd("XLEN").arg(beside).query_async(&mut con).await.unwrap();
    assert_eq!(len, 1);
    let pending: redis::Value = redis::cmd("XPENDING").arg(source).arg("g").query_async(&mut con).await.unwrap();
    let redis::Value::Array(summary) = pending else { panic!("XPENDING: {pending:?}") };
    assert_eq!(summary.first(), Some(&redis::Value::Int(0)), "the source entry is acknowledged");
}

/// A call on a sharded stream AckEmits each delivery on the shard it came
/// from; an emit names one stream key: a shard key is minted in its shard's
/// stride, the name of a sharded stream is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_call_ack_emits_per_shard_and_emits_name_one_shard_key() {
    let redis = RedisServer::start().await;
    let sharded = SidecarOptions::default().arg("--sharded-streams").arg("src=2,out=2");
    let sidecar = Sidecar::start(&redis, sharded).await;
    let mut con = redis.conn().await;
    for n in 0..4 {
        sidecar.append("src", &[("n", n.to_string().as_bytes())]).await;
    }
    let mut call = Consumer::start(&sidecar, "src", "g", GroupStart::Beginning, 8).await;
    let deliveries = call.deliveries(4, EVENT_TIMEOUT).await;
    let shards: BTreeSet<&str> = deliveries.iter().map(|d| d.stream.as_str()).collect();
    assert_eq!(shards.len(), 2, "both shards delivered: {shards:?}");

    call.ack_emit(&deliveries[0].id, &[("out", &[("v", b"1")])]).await;
    let error = call.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!(code(&error), VerdictErrorCode::InvalidArgument, "{error:?}");
    assert!(error.message.contains("sharded stream") && error.message.contains("out:{out:0}"), "{}", error.message);

    for delivery in &deliveries {
        call.ack_emit(&delivery.id, &[("out:{out:1}", &[("source", delivery.id.as_bytes())])]).await;
        let emitted = call.next_emitted(EVENT_TIMEOUT).await;
        let seq: u64 = emitted.entries[0].stream_id.split_once('-').unwrap().1.parse().unwrap();
        assert_eq!(seq % 2, 1, "minted in shard 1's stride: {}", emitted.entries[0].stream_id);
    }
    assert_eq!(xlen(&mut con, "out:{out:1}").await, 4);
    for shard in ["src:{src:0}", "src:{src:1}"] {
        assert_eq!(pending_count(&mut con, shard, "g").await, 0, "{shard} is acknowledged");
    }
}

// ---------------------------------------------------------------------------
// The pipeline proof under faults
// ---------------------------------------------------------------------------

/// What the pipeline's handlers saw, for the report line.
#[derive(Default)]
struct Seen {
    deliveries: AtomicU64,
    ack_emits: AtomicU64,
    emitted: AtomicU64,
    refusals: Mutex<BTreeMap<String, u64>>,
}

/// One handler: subscribes to `src` on the sidecar at `endpoint` and, for
/// each delivery, emits one entry to `sink` carrying the source's branded
/// id; at random it fails the delivery, drops its call, runs twice (two
/// AckEmits), or is slow. Reconnects on any end until `stop`.
async fn handler(endpoint: String, seed: u64, seen: Arc<Seen>, stop: Arc<AtomicBool>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    while !stop.load(Relaxed) {
        let Ok(channel) = support::chaos::endpoint_to(&endpoint).connect().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let client = echomq::proto::consumer_service_client::ConsumerServiceClient::new(channel);
        let mut sub = subscribe_msg("src", "g", GroupStart::Beginning);
        sub.max_in_flight = 8;
        let Ok(mut call) = Consumer::try_subscribe_on(client, None, sub).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        while !stop.load(Relaxed) {
            let delivery = match call.next_event(Duration::from_millis(300)).await {
                Event::Delivery(d) => d,
                Event::Emitted(emitted) => {
                    seen.emitted.fetch_add(emitted.entries.len() as u64, Relaxed);
                    continue;
                }
                Event::VerdictError(e) => {
                    let name = format!("{:?}", code(&e));
                    *seen.refusals.lock().unwrap().entry(name).or_default() += 1;
                    continue;
                }
                Event::Timeout | Event::Subscribed(_) | Event::Batch(_) | Event::Empty => continue,
                Event::Ended(_) => break,
            };
            seen.deliveries.fetch_add(1, Relaxed);
            let emit = [("sink", &[("source", delivery.id.as_bytes()), ("n", b"1")][..])];
            match rng.u32(..100) {
                // A failing handler.
                0..=5 => call.fail(&delivery.id, Some(Duration::from_millis(50))).await,
                // A dropped call, in the middle of the handler.
                6..=8 => break,
                // A duplicate run: the handler ran twice and answers twice.
                9..=16 => {
                    call.ack_emit(&delivery.id, &emit).await;
                    call.ack_emit(&delivery.id, &emit).await;
                    seen.ack_emits.fetch_add(2, Relaxed);
                }
                // A slow handler.
                17..=20 => {
                    tokio::time::sleep(Duration::from_millis(rng.u64(100..400))).await;
                    call.ack_emit(&delivery.id, &emit).await;
                    seen.ack_emits.fetch_add(1, Relaxed);
                }
                _ => {
                    tokio::time::sleep(Duration::from_millis(rng.u64(0..10))).await;
                    call.ack_emit(&delivery.id, &emit).await;
                    seen.ack_emits.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

/// The proof: source → handler that emits one entry per source
/// entry → sink, over two sidecars, while sidecars are killed (-9) and
/// restarted, paused past the reclaim min-idle (SIGSTOP, so the peer
/// reclaims what they hold and their late AckEmits meet the fence), Redis
/// restarts once (gracefully, its AOF fsynced always),
/// handlers fail, drop their calls, run twice and run slowly. At the end the
/// sink holds exactly one emit per source entry (by the source's branded id
/// each carries), none missing, none twice, and the source PEL is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pipeline_under_faults_emits_exactly_once_per_source_entry() {
    const ENTRIES: usize = 600;
    let seed: u64 =
        std::env::var("ECHOMQ_EMIT_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| fastrand::u64(..));
    eprintln!("emit chaos: seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut redis = RedisServer::start_with(RedisOptions::append_only()).await;
    let options = |name: &str| SidecarOptions::named(name).reclaim(1000, 250).backoff(50);
    let mut sidecars =
        vec![Sidecar::start(&redis, options("emit-a")).await, Sidecar::start(&redis, options("emit-b")).await];
    let mut con = redis.conn().await;
    create_group(&mut con, "src", "g", "0").await;

    let (seen, stop) = (Arc::new(Seen::default()), Arc::new(AtomicBool::new(false)));
    let mut handlers = Vec::new();
    for sidecar in &sidecars {
        for _ in 0..2 {
            handlers.push(tokio::spawn(handler(sidecar.endpoint(), rng.u64(..), seen.clone(), stop.clone())));
        }
    }
    // The source, appended over a few seconds so the faults meet it all along;
    // paused while Redis restarts (an XADD whose reply is lost there could
    // not be told from one never written), on a new connection after it.
    let (redis_paused, redis_restarts) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let appender = {
        let (url, paused, restarts) = (redis.url(), redis_paused.clone(), redis_restarts.clone());
        tokio::spawn(async move {
            let mut expected = BTreeSet::new();
            let (mut con, mut seen_restarts) = (support::chaos::redis_conn(&url).await, 0);
            for n in 0..ENTRIES {
                while paused.load(Relaxed) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if restarts.load(Relaxed) != seen_restarts {
                    seen_restarts = restarts.load(Relaxed);
                    con = support::chaos::redis_conn(&url).await;
                }
                let id = xadd_raw(&mut con, "src", &[(b"n", n.to_string().as_bytes())]).await;
                let (ms, seq) = id.split_once('-').unwrap();
                expected.insert(format!("{:012x}{:016x}", ms.parse::<u64>().unwrap(), seq.parse::<u64>().unwrap()));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            expected
        })
    };

    let (mut kills, mut pauses) = (0, 0);
    let window = Instant::now();
    let mut redis_restart_due = Some(Duration::from_millis(rng.u64(2000..6000)));
    while window.elapsed() < Duration::from_secs(8) || redis_restart_due.is_some() {
        tokio::time::sleep(Duration::from_millis(rng.u64(300..800))).await;
        if redis_restart_due.is_some_and(|due| window.elapsed() >= due) {
            // Graceful (SHUTDOWN; the AOF, fsync always, reloads): an AckEmit
            // cut off there is applied or not, and its answer lost either way.
            redis_restart_due = None;
            redis_paused.store(true, Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            redis.restart_gracefully(RedisStop::ShutdownCommand).await;
            redis_restarts.fetch_add(1, Relaxed);
            redis_paused.store(false, Relaxed);
            continue;
        }
        let victim = rng.usize(..sidecars.len());
        // The first fault a kill, the second a pause, then either.
        if kills == 0 || (pauses > 0 && rng.bool()) {
            sidecars[victim].kill9();
            kills += 1;
            // Sometimes past the peer's reclaim min-idle (1 s), sometimes not.
            tokio::time::sleep(Duration::from_millis(rng.u64(100..1800))).await;
            sidecars[victim].restart().await;
        } else {
            sidecars[victim].signal("STOP");
            pauses += 1;
            tokio::time::sleep(Duration::from_millis(rng.u64(1200..1800))).await;
            sidecars[victim].signal("CONT");
        }
    }
    let expected = appender.await.unwrap();
    let mut con = redis.conn().await;

    let settled = eventually(Duration::from_secs(60), || {
        let mut con = con.clone();
        async move {
            let (pel, last) = pel_and_last_delivered(&mut con, "src", "g").await;
            let newest = xrange(&mut con, "src").await.last().map(|e| e.stream_id.clone());
            pel.is_empty() && Some(last) == newest
        }
    })
    .await;
    stop.store(true, Relaxed);
    for handler in handlers {
        let _ = handler.await;
    }
    let sink = xrange(&mut con, "sink").await;
    let mut sources: BTreeMap<String, usize> = BTreeMap::new();
    for entry in &sink {
        let source = String::from_utf8(entry.field("source").expect("every emit carries its source").to_vec()).unwrap();
        *sources.entry(source).or_default() += 1;
    }
    let twice: Vec<_> = sources.iter().filter(|(_, n)| **n > 1).collect();
    let missing: Vec<_> = expected.iter().filter(|id| !sources.contains_key(*id)).collect();
    let refusals = seen.refusals.lock().unwrap().clone();
    eprintln!(
        "emit chaos: {ENTRIES} source entries, {} deliveries, {} AckEmits, {} emitted, sink {}, kills {kills}, pauses {pauses}, redis restarts {}, refusals {refusals:?}, missing {}, twice {}",
        seen.deliveries.load(Relaxed),
        seen.ack_emits.load(Relaxed),
        seen.emitted.load(Relaxed),
        sink.len(),
        redis_restarts.load(Relaxed),
        missing.len(),
        twice.len()
    );
    assert!(
        settled,
        "the source did not settle within 60 s: PEL {:?}",
        pending_entries(&mut con, "src", "g").await.len()
    );
    assert!(twice.is_empty(), "source entries emitted more than once: {twice:?}");
    assert!(missing.is_empty(), "source entries never emitted: {missing:?}");
    assert_eq!(sink.len(), ENTRIES, "exactly one emit per source entry");
    assert_eq!(sources.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert_eq!(pending_count(&mut con, "src", "g").await, 0, "the source PEL ends empty");
    assert!(kills >= 1 && pauses >= 1 && redis_restarts.load(Relaxed) == 1, "every kind of fault ran");
    assert!(refusals.get("UnknownId").copied().unwrap_or(0) > 0, "duplicate runs met the fence");
}
