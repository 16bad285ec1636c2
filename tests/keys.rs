//! Per-key limits (`Subscribe.key_field`, `max_in_flight_per_key`) against a
//! real redis-server and real sidecar processes: one key's entries never
//! run at once and run in stream order, across sidecars and under kill -9;
//! a failed entry is retried before its key's later ones; a dead-lettered
//! one frees its key; entries without the field and other keys are never
//! held back; bad subscribes are refused naming the field; DescribeGroup
//! shows the busy keys.
//!
//! The handlers here record every run (key, per-key sequence number,
//! start, end, verdict), and the checks are made on those records.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use echomq::proto::consume_request::Kind;
use echomq::proto::{
    Ack, BatchEntry, Delivery, DescribeGroupRequest, DescribeGroupResponse, Fail, GroupStart, Subscribe,
};
use support::*;
use tonic::Code;

/// The payload field that holds an entry's key in these tests.
const KEY_FIELD: &str = "acct";

/// A subscribe from the beginning of `stream` with per-key limit `per_key`
/// on [`KEY_FIELD`], and `max_in_flight` slots.
fn keyed(stream: &str, group: &str, per_key: u32, max_in_flight: u32) -> Subscribe {
    Subscribe {
        key_field: KEY_FIELD.to_owned(),
        max_in_flight_per_key: per_key,
        max_in_flight,
        ..subscribe_msg(stream, group, GroupStart::Beginning)
    }
}

/// An entry of key `key` with its per-key sequence number `seq`.
fn entry(key: &str, seq: u64) -> BatchEntry {
    BatchEntry {
        fields: [(KEY_FIELD.to_owned(), key.as_bytes().to_vec()), ("seq".to_owned(), seq.to_string().into_bytes())]
            .into(),
        ..Default::default()
    }
}

/// Appends `per_key` entries of each of `keys` keys (`k0`, `k1`, …),
/// interleaved: every key's #0, then every key's #1, and so on.
async fn append_keyed(sidecar: &Sidecar, stream: &str, keys: usize, per_key: u64) {
    let all: Vec<BatchEntry> =
        (0..per_key).flat_map(|seq| (0..keys).map(move |k| entry(&format!("k{k}"), seq))).collect();
    for chunk in all.chunks(500) {
        sidecar.append_batch(stream, chunk.to_vec()).await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Ack,
    /// A Fail of kind MESSAGE with this `retry_after`.
    Fail(Duration),
    DeadLetter,
}

/// One run of a handler.
#[derive(Clone, Debug)]
struct Run {
    /// `None` for an entry without the key field.
    key: Option<String>,
    seq: u64,
    attempts: u32,
    start: Instant,
    end: Instant,
    /// The verdict the handler sent after `end` (it may not have reached a
    /// sidecar that died).
    verdict: Verdict,
}

type Runs = Arc<Mutex<Vec<Run>>>;
/// How long a handler works on a delivery, and what it answers.
type Decide = Arc<dyn Fn(&Delivery) -> (Duration, Verdict) + Send + Sync>;

fn text_field(delivery: &Delivery, name: &str) -> Option<String> {
    delivery.payload.get(name).map(|value| String::from_utf8_lossy(value).into_owned())
}

/// Runs a handler on `call`: each delivery in a task of its own (so up to
/// the call's `max_in_flight` run at once), recorded in `runs` before its
/// verdict is sent. Ends with the call.
fn handle(mut call: Consumer, runs: Runs, decide: Decide) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let sender = call.sender();
        loop {
            match call.next_event(Duration::from_secs(1)).await {
                Event::Delivery(delivery) => {
                    let (sender, runs, decide) = (sender.clone(), runs.clone(), decide.clone());
                    tokio::spawn(async move {
                        let start = Instant::now();
                        let (work, verdict) = decide(&delivery);
                        tokio::time::sleep(work).await;
                        let end = Instant::now();
                        runs.lock().unwrap().push(Run {
                            key: text_field(&delivery, KEY_FIELD),
                            seq: text_field(&delivery, "seq").and_then(|s| s.parse().ok()).unwrap_or(0),
                            attempts: delivery.attempts,
                            start,
                            end,
                            verdict,
                        });
                        let id = delivery.id.clone();
                        let kind = match verdict {
                            Verdict::Ack => Kind::Ack(Ack { ids: vec![id] }),
                            Verdict::Fail(after) => Kind::Fail(Fail {
                                id,
                                reason: "test failure".into(),
                                retry_after: Some(duration_ms(after.as_millis() as u64)),
                                ..Default::default()
                            }),
                            Verdict::DeadLetter => Kind::Fail(Fail {
                                id,
                                reason: "test dead letter".into(),
                                dead_letter: true,
                                ..Default::default()
                            }),
                        };
                        let _ = sender.send(req(kind)).await;
                    });
                }
                Event::Ended(_) => return,
                _ => {}
            }
        }
    })
}

/// A handler that works 1 to `max_ms` ms (random) and acks.
fn quick(max_ms: u64) -> Decide {
    Arc::new(move |_| (Duration::from_millis(fastrand::u64(1..=max_ms)), Verdict::Ack))
}

fn snapshot(runs: &Runs) -> Vec<Run> {
    runs.lock().unwrap().clone()
}

/// The (key, seq) of every run that acked.
fn acked(runs: &Runs) -> BTreeSet<(String, u64)> {
    runs.lock()
        .unwrap()
        .iter()
        .filter(|r| r.verdict == Verdict::Ack)
        .filter_map(|r| Some((r.key.clone()?, r.seq)))
        .collect()
}

/// Every (key, seq) of `keys` keys × `per_key` entries.
fn every(keys: usize, per_key: u64) -> BTreeSet<(String, u64)> {
    (0..keys).flat_map(|k| (0..per_key).map(move |seq| (format!("k{k}"), seq))).collect()
}

/// The runs of each key, in start order.
fn by_key(runs: &[Run]) -> BTreeMap<String, Vec<Run>> {
    let mut keys: BTreeMap<String, Vec<Run>> = BTreeMap::new();
    for run in runs {
        if let Some(key) = &run.key {
            keys.entry(key.clone()).or_default().push(run.clone());
        }
    }
    for runs in keys.values_mut() {
        runs.sort_by_key(|r| r.start);
    }
    keys
}

/// Per key (limit 1): no two runs overlap, the first run is seq 0, and in
/// start order the seq never goes back and moves on by one, only after a
/// run of the previous seq that acked or dead-lettered it (a run after a
/// Fail, or after an ack a dying sidecar never applied, is the same seq
/// again).
fn assert_one_at_a_time_in_order(runs: &[Run]) {
    for (key, runs) in by_key(runs) {
        assert_eq!(runs[0].seq, 0, "{key}: the first run is the key's first entry: {runs:#?}");
        for pair in runs.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert!(a.end <= b.start, "{key}: seq {} and seq {} ran at once:\n{a:?}\n{b:?}", a.seq, b.seq);
            let moved_on = b.seq == a.seq + 1 && matches!(a.verdict, Verdict::Ack | Verdict::DeadLetter);
            assert!(
                b.seq == a.seq || moved_on,
                "{key}: seq {} ({:?}) was followed by seq {}: out of stream order",
                a.seq,
                a.verdict,
                b.seq
            );
        }
    }
}

/// Whether runs of different keys overlapped in time somewhere.
fn keys_overlapped(runs: &[Run]) -> bool {
    runs.iter().any(|a| runs.iter().any(|b| a.key != b.key && a.start < b.end && b.start < a.end))
}

async fn zcard(con: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query_async(con).await.unwrap()
}

/// Waits until every one of `wanted` was acked by a handler and the group's
/// PEL is empty; panics naming what is missing after `timeout`.
async fn wait_all_acked(
    con: &mut redis::aio::MultiplexedConnection,
    runs: &Runs,
    wanted: &BTreeSet<(String, u64)>,
    timeout: Duration,
    logs: &[&Sidecar],
) {
    let done = eventually(timeout, || {
        let mut con = con.clone();
        async move { acked(runs).is_superset(wanted) && pending_count(&mut con, "s", "g").await == 0 }
    })
    .await;
    if !done {
        let missing: Vec<_> = wanted.difference(&acked(runs)).take(20).cloned().collect();
        let logs: Vec<String> = logs.iter().map(|s| tail(&s.log(), 60)).collect();
        panic!(
            "not every entry was handled to an ack within {timeout:?}; missing (first 20) {missing:?}; pending {}\n{}",
            pending_count(con, "s", "g").await,
            logs.join("\n-----\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_entries_run_one_at_a_time_in_stream_order_while_other_keys_run_alongside() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    append_keyed(&sidecar, "s", 3, 20).await;
    let runs: Runs = Arc::default();
    let call = Consumer::subscribe(&sidecar, keyed("s", "g", 1, 16)).await;
    let handler = handle(call, runs.clone(), quick(20));

    wait_all_acked(&mut con, &runs, &every(3, 20), Duration::from_secs(60), &[&sidecar]).await;

    let runs = snapshot(&runs);
    assert_one_at_a_time_in_order(&runs);
    assert_eq!(runs.len(), 60, "each entry ran once");
    assert!(keys_overlapped(&runs), "different keys ran at once");
    assert_eq!(zcard(&mut con, "s:keys:g").await, 0, "acked entries leave the keyed entries with their XACK");
    handler.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_entry_is_retried_before_its_keys_later_entries_and_other_keys_keep_flowing() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    append_keyed(&sidecar, "s", 3, 10).await;
    let runs: Runs = Arc::default();
    // k0's first entry fails twice, then acks; everything else acks at once.
    let decide: Decide = Arc::new(|d| {
        let first_of_k0 =
            text_field(d, KEY_FIELD).as_deref() == Some("k0") && text_field(d, "seq").as_deref() == Some("0");
        if first_of_k0 && d.attempts <= 2 {
            (Duration::from_millis(5), Verdict::Fail(Duration::from_millis(300)))
        } else {
            (Duration::from_millis(5), Verdict::Ack)
        }
    });
    let call = Consumer::subscribe(&sidecar, keyed("s", "g", 1, 16)).await;
    let handler = handle(call, runs.clone(), decide);

    wait_all_acked(&mut con, &runs, &every(3, 10), Duration::from_secs(60), &[&sidecar]).await;

    let runs = snapshot(&runs);
    assert_one_at_a_time_in_order(&runs);
    let k0 = &by_key(&runs)["k0"];
    let attempts: Vec<(u64, u32, Verdict)> = k0.iter().take(3).map(|r| (r.seq, r.attempts, r.verdict)).collect();
    let fail = Verdict::Fail(Duration::from_millis(300));
    assert_eq!(attempts, [(0, 1, fail), (0, 2, fail), (0, 3, Verdict::Ack)], "k0's head ran three times first");
    let acked_head = &k0[2];
    assert!(k0[3..].iter().all(|r| r.start >= acked_head.end), "k0's later entries ran only after its head acked");
    let others_meanwhile = runs
        .iter()
        .filter(|r| r.key.as_deref() != Some("k0") && r.start > k0[0].start && r.start < acked_head.start)
        .count();
    assert!(others_meanwhile >= 10, "other keys kept flowing while k0 waited ({others_meanwhile} runs)");
    assert_eq!(zcard(&mut con, "s:keys:g").await, 0);
    handler.abort();
}

/// A Fail with `dead_letter`, and `max_deliveries` reached (the poison path,
/// where the dead-letter script rebuilds the member from the entry's
/// fields), each free the key: its next entries run, and nothing of the
/// dead letters stays in the keyed entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_entry_frees_its_key() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    append_keyed(&sidecar, "s", 2, 5).await;
    sidecar.append_batch("s", vec![entry("solo", 0)]).await;
    let runs: Runs = Arc::default();
    // k0's head always fails (max_deliveries 2 dead-letters it); k1's head
    // and the only entry of `solo` are dead-lettered by the handler.
    let decide: Decide = Arc::new(|d| {
        let (key, seq) = (text_field(d, KEY_FIELD).unwrap_or_default(), text_field(d, "seq").unwrap_or_default());
        match (key.as_str(), seq.as_str()) {
            ("k0", "0") => (Duration::from_millis(2), Verdict::Fail(Duration::from_millis(50))),
            ("k1", "0") | ("solo", _) => (Duration::from_millis(2), Verdict::DeadLetter),
            _ => (Duration::from_millis(2), Verdict::Ack),
        }
    });
    let call = Consumer::subscribe(&sidecar, Subscribe { max_deliveries: 2, ..keyed("s", "g", 1, 16) }).await;
    let handler = handle(call, runs.clone(), decide);

    let later: BTreeSet<(String, u64)> = every(2, 5).into_iter().filter(|(_, seq)| *seq > 0).collect();
    wait_all_acked(&mut con, &runs, &later, Duration::from_secs(60), &[&sidecar]).await;

    let runs = snapshot(&runs);
    let keys = by_key(&runs);
    let k0_heads: Vec<u32> = keys["k0"].iter().filter(|r| r.seq == 0).map(|r| r.attempts).collect();
    assert_eq!(k0_heads, [1, 2], "k0's head ran max_deliveries times, then was dead-lettered");
    for key in ["k0", "k1"] {
        let head_end = keys[key].iter().filter(|r| r.seq == 0).map(|r| r.end).max().unwrap();
        assert!(
            keys[key].iter().filter(|r| r.seq > 0).all(|r| r.start >= head_end),
            "{key}: later entries after the head"
        );
    }
    assert_eq!(xlen(&mut con, "s:dlq").await, 3, "k0's, k1's and solo's heads are dead letters");
    assert_eq!(zcard(&mut con, "s:keys:g").await, 0, "dead-lettering removed their members");
    handler.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_without_the_key_field_are_not_limited() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    sidecar.append_batch("s", vec![entry("a", 0), entry("a", 1), entry("a", 2)]).await;
    sidecar.append_numbered("s", 20).await;
    let mut call = Consumer::subscribe(&sidecar, keyed("s", "g", 1, 64)).await;

    let held = call.deliveries(21, EVENT_TIMEOUT).await;
    call.assert_quiet(Duration::from_millis(500), "key a's later entries wait").await;

    let unkeyed = held.iter().filter(|d| text_field(d, KEY_FIELD).is_none()).count();
    assert_eq!(unkeyed, 20, "every entry without the field is held at once");
    assert_eq!(zcard(&mut con, "s:keys:g").await, 3, "only keyed entries are registered");
    assert!(eventually(EVENT_TIMEOUT, || async { sidecar.counter("echomq_key_waiting_entries").await == 2.0 }).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_keys_never_wait_behind_a_busy_key() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let entries: Vec<BatchEntry> =
        (0..3).map(|seq| entry("busy", seq)).chain((0..20).map(|seq| entry("free", seq))).collect();
    sidecar.append_batch("s", entries).await;
    let runs: Runs = Arc::default();
    let decide: Decide = Arc::new(|d| {
        let busy_head =
            text_field(d, KEY_FIELD).as_deref() == Some("busy") && text_field(d, "seq").as_deref() == Some("0");
        (Duration::from_millis(if busy_head { 2_000 } else { 5 }), Verdict::Ack)
    });
    let call = Consumer::subscribe(&sidecar, keyed("s", "g", 1, 16)).await;
    let handler = handle(call, runs.clone(), decide);

    let wanted: BTreeSet<(String, u64)> =
        (0..3).map(|seq| ("busy".to_owned(), seq)).chain((0..20).map(|seq| ("free".to_owned(), seq))).collect();
    wait_all_acked(&mut con, &runs, &wanted, Duration::from_secs(30), &[&sidecar]).await;

    let runs = snapshot(&runs);
    assert_one_at_a_time_in_order(&runs);
    let keys = by_key(&runs);
    let busy_head = &keys["busy"][0];
    assert!(
        keys["free"].iter().all(|r| r.end < busy_head.end),
        "all 20 entries of the other key ran while the busy key's head was held"
    );
    handler.abort();
}

/// Two or three sidecars, 50 keys, 1,500 entries, handlers of 1 to 8 ms,
/// one sidecar killed (-9) mid-run and started again, its entries reclaimed
/// by its peers after the short min-idle.
///
/// Why the runs can be checked for overlap at all: a run cut by kill -9 goes
/// on in this process (its handler outlives its sidecar) for at most 8 ms,
/// while a peer takes the dead sidecar's entries only after they sat idle
/// for `--reclaim-min-idle-ms` (1.5 s, of which at most a third had passed
/// since the last lease refresh). So a reclaimer's run starts long after
/// the cut run ended, and any overlap is the feature's fault.
async fn fault_proof(sidecar_count: usize) {
    let redis = RedisServer::start().await;
    let mut sidecars = Vec::new();
    for n in 0..sidecar_count {
        let options = SidecarOptions::named(&format!("keys-{n}")).reclaim(1_500, 250);
        sidecars.push(Sidecar::start(&redis, options).await);
    }
    let mut con = redis.conn().await;
    let (keys, per_key) = (50, 30);
    append_keyed(&sidecars[0], "s", keys, per_key).await;
    let runs: Runs = Arc::default();
    let mut handlers = Vec::new();
    for sidecar in &sidecars {
        let call = Consumer::subscribe(sidecar, keyed("s", "g", 1, 32)).await;
        handlers.push(handle(call, runs.clone(), quick(8)));
    }

    let a_third = (keys as u64 * per_key / 3) as usize;
    assert!(eventually(Duration::from_secs(60), || async { acked(&runs).len() >= a_third }).await);
    let victim = sidecar_count - 1;
    sidecars[victim].kill9();
    // Its peers reclaim what it held and what waited there for its key.
    tokio::time::sleep(Duration::from_secs(3)).await;
    sidecars[victim].restart().await;
    let call = Consumer::subscribe(&sidecars[victim], keyed("s", "g", 1, 32)).await;
    handlers.push(handle(call, runs.clone(), quick(8)));

    let logs: Vec<&Sidecar> = sidecars.iter().collect();
    wait_all_acked(&mut con, &runs, &every(keys, per_key), Duration::from_secs(120), &logs).await;

    let runs = snapshot(&runs);
    assert_one_at_a_time_in_order(&runs);
    assert!(keys_overlapped(&runs));
    assert_eq!(pending_count(&mut con, "s", "g").await, 0);
    assert_eq!(zcard(&mut con, "s:keys:g").await, 0, "the keyed entries end empty");
    let reclaimed: f64 = {
        let mut sum = 0.0;
        for sidecar in &sidecars[..victim] {
            sum += sidecar.counter("echomq_reclaimed_total").await;
        }
        sum
    };
    assert!(reclaimed > 0.0, "the peers reclaimed the dead sidecar's entries");
    for handler in handlers {
        handler.abort();
    }
}

/// A sidecar paused (SIGSTOP) past the reclaim idle time while it holds a
/// key's head and the key's later entries wait there: a peer reclaims all
/// of them and runs them in order. Resumed, the paused sidecar must hand
/// none of them out (its gate run is fenced to its own PEL), nor mark the
/// key busy again for entries nobody holds. The user trial saw it deliver
/// all four acknowledged entries at once to its call, and the key stay busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sidecar_never_runs_what_a_peer_ran_meanwhile() {
    let redis = RedisServer::start().await;
    let paused = Sidecar::start(&redis, SidecarOptions::named("keys-paused").reclaim(1_000, 200)).await;
    let peer = Sidecar::start(&redis, SidecarOptions::named("keys-peer").reclaim(1_000, 200)).await;
    let mut con = redis.conn().await;
    let all: Vec<BatchEntry> = (0..5).map(|seq| entry("x", seq)).collect();
    paused.append_batch("s", all).await;
    let mut held = Consumer::subscribe(&paused, keyed("s", "g", 1, 8)).await;
    let head = held.next_delivery(Duration::from_secs(5)).await;
    assert_eq!(text_field(&head, "seq").as_deref(), Some("0"));
    held.assert_quiet(Duration::from_millis(300), "the key's later entries wait for its head").await;

    paused.signal("STOP");
    let runs: Runs = Arc::default();
    let handler = handle(Consumer::subscribe(&peer, keyed("s", "g", 1, 8)).await, runs.clone(), quick(5));
    let wanted: BTreeSet<(String, u64)> = (0..5).map(|seq| ("x".to_owned(), seq)).collect();
    wait_all_acked(&mut con, &runs, &wanted, Duration::from_secs(30), &[&peer]).await;
    assert_one_at_a_time_in_order(&snapshot(&runs));
    paused.signal("CONT");

    let resumed = Instant::now();
    while resumed.elapsed() < Duration::from_secs(2) {
        match held.next_event(Duration::from_millis(200)).await {
            Event::Delivery(d) => {
                panic!("the resumed sidecar handed out seq {:?}, which its peer ran", text_field(&d, "seq"))
            }
            Event::Batch(batch) => panic!("the resumed sidecar handed out {} entries its peer ran", batch.len()),
            _ => {}
        }
    }
    assert_eq!(pending_count(&mut con, "s", "g").await, 0);
    assert_eq!(zcard(&mut con, "s:keys:g").await, 0, "no key is left busy for an entry nobody holds");
    handler.abort();
}

/// Entries that only waited for their key were never handed to a handler:
/// a call that leaves and a new one (a client's reconnect, a rolling
/// restart) must cost them no attempt. The trial saw them gain one per
/// reconnect and be dead-lettered by `max_deliveries` unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_that_only_waited_for_their_key_cost_no_attempt_when_calls_reconnect() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(50)).await;
    let mut con = redis.conn().await;
    let all: Vec<BatchEntry> = (0..5).map(|seq| entry("x", seq)).collect();
    sidecar.append_batch("s", all).await;
    let subscribe = Subscribe { max_deliveries: 4, ..keyed("s", "g", 1, 8) };
    for round in 1..=3u32 {
        let mut call = Consumer::subscribe(&sidecar, subscribe.clone()).await;
        let head = call.next_delivery(Duration::from_secs(10)).await;
        assert_eq!((text_field(&head, "seq").as_deref(), head.attempts), (Some("0"), round), "round {round}");
        call.assert_quiet(Duration::from_millis(200), "the key's later entries wait").await;
        drop(call); // leaves holding the head: that one counts, as a Fail
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let runs: Runs = Arc::default();
    let handler = handle(Consumer::subscribe(&sidecar, subscribe).await, runs.clone(), quick(2));
    let wanted: BTreeSet<(String, u64)> = (0..5).map(|seq| ("x".to_owned(), seq)).collect();
    wait_all_acked(&mut con, &runs, &wanted, Duration::from_secs(30), &[&sidecar]).await;
    let runs = snapshot(&runs);
    assert_one_at_a_time_in_order(&runs);
    let later: Vec<(u64, u32)> = runs.iter().filter(|r| r.seq > 0).map(|r| (r.seq, r.attempts)).collect();
    assert_eq!(later, [(1, 1), (2, 1), (3, 1), (4, 1)], "waiting cost no attempt");
    assert_eq!(xlen(&mut con, "s:dlq").await, 0, "nothing was dead-lettered unseen");
    handler.abort();
}

/// Entries acknowledged behind the sidecars' back (another client's XACK)
/// leave members no sidecar script removed; with no later entry of their
/// key, only the hygiene beat's sample finds them. The trial saw such keys
/// listed as busy by Describe for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_acknowledged_behind_the_sidecars_back_are_swept_by_the_hygiene_beat() {
    let redis = RedisServer::start().await;
    let options = SidecarOptions::default().arg("--consumer-idle-limit-ms").arg("1000");
    let sidecar = Sidecar::start(&redis, options).await;
    let mut con = redis.conn().await;
    let all: Vec<BatchEntry> = (0..3).flat_map(|seq| [entry("x", seq), entry("y", seq)]).collect();
    let appended = sidecar.append_batch("s", all).await;
    let mut call = Consumer::subscribe(&sidecar, keyed("s", "g", 1, 8)).await;
    call.deliveries(2, Duration::from_secs(5)).await;
    assert_eq!(zcard(&mut con, "s:keys:g").await, 6);
    let mut xack = redis::cmd("XACK");
    xack.arg("s").arg("g");
    for response in &appended {
        xack.arg(&response.stream_id);
    }
    let _: i64 = xack.query_async(&mut con).await.unwrap();
    let swept = eventually(Duration::from_secs(10), || {
        let mut con = con.clone();
        async move { zcard(&mut con, "s:keys:g").await == 0 }
    })
    .await;
    assert!(swept, "stale members left: {}", zcard(&mut con, "s:keys:g").await);
    assert!(describe(&sidecar).await.busy_keys.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_keep_each_keys_order_through_a_kill_and_reclaims() {
    fault_proof(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sidecars_keep_each_keys_order_through_a_kill_and_reclaims() {
    fault_proof(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_per_key_settings_are_invalid_argument_naming_the_field_and_create_nothing() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--sharded-streams").arg("sh=2")).await;
    let mut con = redis.conn().await;
    let base = || keyed("s", "g", 1, 8);
    let cases: Vec<(&str, Subscribe, &str)> = vec![
        (
            "a key field without a limit",
            Subscribe { max_in_flight_per_key: 0, ..base() },
            "subscribe.max_in_flight_per_key",
        ),
        ("a limit without a key field", Subscribe { key_field: String::new(), ..base() }, "subscribe.key_field"),
        (
            "a key field over --max-name-bytes",
            Subscribe { key_field: "k".repeat(1_025), ..base() },
            "subscribe.key_field",
        ),
        ("the reserved branded-id field", Subscribe { key_field: "id".into(), ..base() }, "subscribe.key_field"),
        ("no_ack", Subscribe { no_ack: true, ..base() }, "subscribe.key_field"),
        ("a sharded stream", Subscribe { stream: "sh".into(), ..base() }, "subscribe.key_field"),
        (
            "a limit over --max-in-flight-limit",
            Subscribe { max_in_flight_per_key: 10_001, ..base() },
            "subscribe.max_in_flight_per_key",
        ),
    ];
    for (case, subscribe, field) in cases {
        let stream = subscribe.stream.clone();
        let status = match Consumer::try_subscribe(&sidecar, subscribe).await {
            Err(status) => status,
            Ok(_) => panic!("{case}: subscribed"),
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{case}: {status:?}");
        assert!(status.message().contains(field), "{case}: the message names {field}: {}", status.message());
        assert!(!exists(&mut con, &stream).await, "{case}: no group (nor stream) was created");
        assert!(!exists(&mut con, &format!("{stream}:keys:g")).await, "{case}: no keyed entries");
    }

    // The key field and its limit are group settings, as max_deliveries is.
    let _first = Consumer::subscribe(&sidecar, base()).await;
    let other = Consumer::try_subscribe(&sidecar, Subscribe { max_in_flight_per_key: 2, ..base() }).await;
    let status = other.err().expect("a second call with another limit is refused");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("max_in_flight_per_key 1"), "{}", status.message());
    let unkeyed = Consumer::try_subscribe(&sidecar, subscribe_msg("s", "g", GroupStart::Beginning)).await;
    assert_eq!(unkeyed.err().expect("refused").code(), Code::FailedPrecondition, "nor without a key field");
}

async fn describe(sidecar: &Sidecar) -> DescribeGroupResponse {
    let request = DescribeGroupRequest { stream: "s".into(), group: "g".into() };
    sidecar.admin_client().await.describe_group(request).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_shows_the_busy_keys_while_entries_wait_and_none_after() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("pod-a")).await;
    let mut con = redis.conn().await;
    let appended = sidecar
        .append_batch(
            "s",
            vec![entry("A", 0), entry("B", 0), entry("A", 1), entry("A", 2), entry("B", 1), entry("A", 3)],
        )
        .await;
    let mut call = Consumer::subscribe(&sidecar, keyed("s", "g", 1, 8)).await;
    let heads = call.deliveries(2, EVENT_TIMEOUT).await;
    call.assert_quiet(Duration::from_millis(300), "both keys are at their limit").await;

    let state = describe(&sidecar).await;
    assert_eq!(state.keyed_entries, 6);
    let busy: Vec<(&[u8], u64, &str, &str)> = state
        .busy_keys
        .iter()
        .map(|k| (k.key.as_slice(), k.entries, k.head_id.as_str(), k.head_consumer.as_str()))
        .collect();
    assert_eq!(
        busy,
        [
            (&b"A"[..], 4, appended[0].stream_id.as_str(), "pod-a"),
            (&b"B"[..], 2, appended[1].stream_id.as_str(), "pod-a")
        ],
        "busiest first, each with its head and who holds it"
    );
    assert_eq!(sidecar.counter("echomq_key_waiting_entries").await, 4.0);
    // The member as the scripts write it: `<len>:<key>:<ms, 20 digits>-<seq, 20 digits>`.
    let (ms, seq) = appended[0].stream_id.split_once('-').unwrap();
    let first: Vec<Vec<u8>> = redis::cmd("ZRANGE").arg("s:keys:g").arg(0).arg(0).query_async(&mut con).await.unwrap();
    assert_eq!(first[0], format!("1:A:{ms:0>20}-{seq:0>20}").into_bytes());

    call.ack(&heads.iter().map(|d| d.id.as_str()).collect::<Vec<_>>()).await;
    let mut handled = 2;
    while handled < 6 {
        let delivery = call.next_delivery(EVENT_TIMEOUT).await;
        call.ack_one(&delivery.id).await;
        handled += 1;
    }
    let settled = eventually(EVENT_TIMEOUT, || async { describe(&sidecar).await.keyed_entries == 0 }).await;
    assert!(settled, "no keyed entry is left once everything is acked");
    assert!(describe(&sidecar).await.busy_keys.is_empty());
    assert_eq!(sidecar.counter("echomq_key_waiting_entries").await, 0.0);
}

/// NOGROUP from inside `keyed_read.lua` reaches the worker's recovery: the
/// group is re-created (from `0`, so the first entry comes back first, in
/// its key's order) and the key's next entry follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroyed_group_is_recreated_under_a_keyed_subscription() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(100)).await;
    let mut con = redis.conn().await;
    let first = sidecar.append_batch("s", vec![entry("A", 0)]).await;
    let mut call = Consumer::subscribe(&sidecar, keyed("s", "g", 1, 8)).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(delivery.id, first[0].id);
    call.ack_one(&delivery.id).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);

    let _: i64 = redis::cmd("XGROUP").arg("DESTROY").arg("s").arg("g").query_async(&mut con).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = sidecar.append_batch("s", vec![entry("A", 1)]).await;

    let mut seen = Vec::new();
    while !seen.contains(&after[0].id) {
        let delivery = call.next_delivery(Duration::from_secs(20)).await;
        call.ack_one(&delivery.id).await;
        seen.push(delivery.id);
    }
    assert_eq!(seen, [first[0].id.clone(), after[0].id.clone()], "the re-created group reads from 0, in key order");
    assert!(groups(&mut con, "s").await.contains_key("g"), "the sidecar re-created the group");
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    assert!(eventually(EVENT_TIMEOUT, || async { zcard(&mut con.clone(), "s:keys:g").await == 0 }).await);
}
