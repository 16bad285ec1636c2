//! The ledger's rules, without Redis, a runtime or a metrics registry.

use std::collections::{HashMap, HashSet};

use super::*;
use crate::proto::VerdictErrorCode;

const MS: Duration = Duration::from_millis(1);

fn policy(max_in_flight: u32) -> Policy {
    Policy {
        max_in_flight,
        adaptive: false,
        ack_deadline: None,
        backoff: Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(10) },
        sharded: false,
    }
}

fn settings() -> GroupPolicy {
    GroupPolicy { max_deliveries: 5, dead_letter_stream: "s:dlq".to_owned(), keys: None }
}

/// A ledger driven as its worker drives it: the effects for each call are
/// kept in the call's outbox, a delivery to a call that hung up is given
/// back. Its invariant ([`Ledger::check`]) is checked before every use, so
/// after every step of a test, and once more at its end.
struct Checked {
    ledger: Ledger<()>,
    outbox: HashMap<SessionId, Vec<Effect<()>>>,
    hung_up: HashSet<SessionId>,
}

impl std::ops::Deref for Checked {
    type Target = Ledger<()>;
    fn deref(&self) -> &Ledger<()> {
        self.ledger.check();
        &self.ledger
    }
}

impl std::ops::DerefMut for Checked {
    fn deref_mut(&mut self) -> &mut Ledger<()> {
        self.ledger.check();
        &mut self.ledger
    }
}

impl Drop for Checked {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.ledger.check();
        }
    }
}

impl Checked {
    fn new(ledger: Ledger<()>) -> Checked {
        Checked { ledger, outbox: HashMap::new(), hung_up: HashSet::new() }
    }

    /// Carries out the queued effects, as the worker does.
    fn act(&mut self) {
        let mut effects = Vec::new();
        loop {
            self.ledger.take_effects(&mut effects);
            if effects.is_empty() {
                break;
            }
            for effect in effects.drain(..) {
                match effect {
                    Effect::Deliver { session, out, .. } if self.hung_up.contains(&session) => {
                        self.ledger.undelivered(session, out, Instant::now())
                    }
                    Effect::Deliver { session, .. }
                    | Effect::Answer { session, .. }
                    | Effect::Left { session, .. }
                    | Effect::Emitted { session, .. } => self.outbox.entry(session).or_default().push(effect),
                    Effect::Ended { .. } => {}
                }
            }
        }
        self.ledger.check();
    }

    /// Call `session`'s receiver is gone.
    fn hang_up(&mut self, session: SessionId) {
        self.hung_up.insert(session);
    }

    /// What call `session` was told since last asked.
    fn told(&mut self, session: SessionId) -> Vec<Effect<()>> {
        self.act();
        self.outbox.remove(&session).unwrap_or_default()
    }

    /// The deliveries call `session` got since last asked (entry numbers).
    fn deliveries(&mut self, session: SessionId) -> Vec<u64> {
        let told = self.told(session).into_iter();
        told.filter_map(|effect| match effect {
            Effect::Deliver { out, .. } => Some(out.branded.minted_as().ms),
            _ => None,
        })
        .collect()
    }

    /// The answers call `session` got since last asked, as the frames' codes.
    fn answers(&mut self, session: SessionId) -> Vec<(String, VerdictErrorCode)> {
        let told = self.told(session).into_iter();
        told.filter_map(|effect| match effect {
            Effect::Answer { text, refusal, .. } => {
                let error = refusal.error(&text);
                Some((error.id, VerdictErrorCode::try_from(error.code).expect("a known code")))
            }
            _ => None,
        })
        .collect()
    }

    /// The deliveries call `session` was told it no longer holds.
    fn left(&mut self, session: SessionId) -> Vec<BrandedId> {
        let told = self.told(session).into_iter();
        told.filter_map(|effect| match effect {
            Effect::Left { id, .. } => Some(id),
            _ => None,
        })
        .collect()
    }
}

fn ledger() -> Checked {
    Checked::new(Ledger::new("s", "g", false, false, false))
}

fn call(ledger: &mut Checked, session: SessionId, policy: Policy) {
    ledger.attach(session, 0, policy, settings()).expect("attach");
}

/// Entry `n`: stream id `n-0`, its branded id derived from it.
fn entry(n: u64, attempts: u32) -> Outgoing<()> {
    Outgoing { stream_id: sid(n), branded: branded(n), attempts, member: None, body: () }
}

fn sid(n: u64) -> StreamId {
    StreamId { ms: n, seq: 0 }
}

fn branded(n: u64) -> BrandedId {
    BrandedId::from_stream_id(sid(n)).expect("fits")
}

/// Offers entries `ns`, first deliveries all.
fn hand_out(ledger: &mut Checked, ns: std::ops::RangeInclusive<u64>, now: Instant) {
    for n in ns {
        ledger.offer(entry(n, 1), now);
    }
}

/// A Fail of entry `n`, sent as its branded id.
fn fail_of(n: u64, retry_after: Result<Option<Duration>, String>, dead_letter: bool) -> FailVerdict {
    let kind = Ok(if dead_letter { FailKind::Poison } else { FailKind::Message });
    FailVerdict { text: branded(n).to_string(), id: branded(n), retry_after, kind, reason: "boom".to_owned() }
}

#[test]
fn a_call_never_holds_more_than_its_credit() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(2));
    assert_eq!(ledger.free(), 2);
    for n in 1..=3 {
        ledger.offer(entry(n, 1), now);
    }
    assert_eq!(ledger.deliveries(1), vec![1, 2]);
    assert_eq!((ledger.held(), ledger.free(), ledger.free_for_due()), (2, 0, 0), "the third waits as ready");

    ledger.ack(1, branded(1).to_string(), branded(1), now);
    assert_eq!(ledger.free(), 0, "the freed slot is spoken for by the ready entry");
    ledger.hand_out_ready(now);
    assert_eq!(ledger.deliveries(1), vec![3]);
    assert_eq!(ledger.held(), 2);
}

#[test]
fn a_read_under_way_holds_its_credit() {
    let mut ledger = ledger();
    call(&mut ledger, 1, policy(10));
    ledger.reading(8);
    assert_eq!((ledger.free(), ledger.free_for_due()), (2, 10), "due retries are not held back by the read");
    ledger.read_done();
    assert_eq!(ledger.free(), 10);
}

#[test]
fn hand_out_goes_to_the_call_with_the_most_free_credit() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(1));
    call(&mut ledger, 2, policy(3));
    for n in 1..=4 {
        ledger.offer(entry(n, 1), now);
    }
    let (to_small, to_large) = (ledger.deliveries(1), ledger.deliveries(2));
    assert_eq!(to_small.len(), 1, "{to_small:?} {to_large:?}");
    assert_eq!(to_large.len(), 3);
    assert_eq!(ledger.held(), 4);
}

#[test]
fn a_call_never_holds_two_deliveries_with_one_branded_id() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    let first = entry(7, 1);
    let mut copy = entry(8, 1);
    copy.branded = first.branded;
    ledger.offer(first, now);
    ledger.offer(copy, now);
    assert_eq!(ledger.deliveries(1), vec![7], "the copy waits until the first is settled");
    ledger.ack(1, branded(7).to_string(), branded(7), now);
    ledger.hand_out_ready(now);
    assert_eq!(ledger.deliveries(1), vec![7], "the copy, under the same branded id");
}

#[test]
fn a_verdict_for_an_id_not_held_is_answered_unknown_and_changes_nothing() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    ledger.offer(entry(1, 1), now);
    ledger.ack(1, "x".to_owned(), branded(2), now);
    ledger.fail(1, FailVerdict { text: "y".to_owned(), ..fail_of(3, Ok(None), false) }, now);
    ledger.extend(1, vec![("z".to_owned(), branded(4))], Duration::from_secs(1), now);
    let expected = ["x", "y", "z"].map(|id| (id.to_owned(), VerdictErrorCode::UnknownId));
    assert_eq!(ledger.answers(1), expected);
    assert_eq!(ledger.held(), 1);
    assert!(ledger.take_orders().acks.is_empty());
}

#[test]
fn one_call_cannot_settle_another_calls_delivery() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(1));
    call(&mut ledger, 2, policy(0));
    ledger.offer(entry(1, 1), now);
    assert_eq!(ledger.deliveries(1), vec![1]);
    ledger.ack(2, branded(1).to_string(), branded(1), now);
    assert_eq!(ledger.answers(2), vec![(branded(1).to_string(), VerdictErrorCode::UnknownId)]);
    assert_eq!(ledger.held(), 1);
}

#[test]
fn an_ack_queues_one_xack_and_a_retry_state_drop_for_a_redelivery() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    ledger.offer(entry(1, 1), now);
    ledger.offer(entry(2, 3), now);
    ledger.ack(1, branded(1).to_string(), branded(1), now);
    ledger.ack(1, branded(2).to_string(), branded(2), now);
    let acks = ledger.take_orders().acks;
    let got: Vec<(StreamId, bool)> = acks.iter().map(|a| (a.stream_id, a.redelivered)).collect();
    assert_eq!(got, vec![(sid(1), false), (sid(2), true)]);
    assert!(!ledger.tracks(sid(1)) && !ledger.tracks(sid(2)));
}

fn emit(stream: &str) -> NewEmit {
    NewEmit { stream: stream.to_owned(), shard: 0, shards: 1, fields: vec![("k".to_owned(), b"v".to_vec())] }
}

#[test]
fn an_ack_emit_of_a_held_delivery_queues_its_step_and_frees_the_slot() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(1));
    ledger.offer(entry(1, 2), now);
    assert_eq!(ledger.deliveries(1), vec![1]);
    ledger.ack_emit(1, branded(1).to_string(), branded(1), vec![emit("out"), emit("out2")], now);
    let orders = ledger.take_orders();
    assert!(orders.acks.is_empty(), "no plain XACK: the script acknowledges");
    assert_eq!(orders.emits.len(), 1);
    assert_eq!(orders.emits[0].stream_id, sid(1));
    assert_eq!(orders.emits[0].emits, vec![emit("out"), emit("out2")]);
    assert!(!ledger.tracks(sid(1)));
    assert_eq!(ledger.free(), 1);
    let order = orders.emits.into_iter().next().unwrap();
    let ids = vec![StreamId { ms: 9, seq: 0 }, StreamId { ms: 9, seq: 1 }];
    ledger.emitted(order, Emission::Emitted { ids: ids.clone(), unconfirmed: None });
    let told = ledger.told(1);
    let [Effect::Emitted { text, emitted, .. }] = told.as_slice() else { panic!("one Emitted, got {told:?}") };
    assert_eq!(text, &branded(1).to_string());
    assert_eq!(emitted, &vec![("out".to_owned(), ids[0]), ("out2".to_owned(), ids[1])]);
    assert_eq!(ledger.tally().emits, 2);
    assert_eq!(ledger.tally().acks, 1);
}

#[test]
fn an_ack_emit_of_an_id_not_held_is_answered_as_an_ack_and_queues_nothing() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(2));
    call(&mut ledger, 2, policy(0));
    ledger.offer(entry(1, 1), now);
    ledger.ack_emit(1, "x".to_owned(), branded(2), vec![emit("out")], now);
    ledger.ack_emit(2, branded(1).to_string(), branded(1), vec![emit("out")], now);
    assert_eq!(ledger.answers(1), vec![("x".to_owned(), VerdictErrorCode::UnknownId)]);
    assert_eq!(ledger.answers(2), vec![(branded(1).to_string(), VerdictErrorCode::UnknownId)]);
    assert!(ledger.take_orders().emits.is_empty());
    assert_eq!(ledger.held(), 1);
    assert!(ledger.lease_lost(sid(1)));
    ledger.ack_emit(1, branded(1).to_string(), branded(1), vec![emit("out")], now);
    let answers = ledger.answers(1);
    assert_eq!(answers.last(), Some(&(branded(1).to_string(), VerdictErrorCode::NotPending)));
    assert!(ledger.take_orders().emits.is_empty(), "a delivery lost to a peer writes nothing");
}

#[test]
fn an_ack_emit_the_script_did_not_apply_is_answered_lease_lost_or_not_pending() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(2));
    ledger.offer(entry(1, 1), now);
    ledger.offer(entry(2, 1), now);
    ledger.ack_emit(1, branded(1).to_string(), branded(1), vec![emit("out")], now);
    ledger.ack_emit(1, branded(2).to_string(), branded(2), vec![emit("out")], now);
    let mut orders = ledger.take_orders().emits.into_iter();
    ledger.emitted(orders.next().unwrap(), Emission::NotOurs);
    ledger.emitted(orders.next().unwrap(), Emission::NotPending);
    let expected = vec![
        (branded(1).to_string(), VerdictErrorCode::LeaseLost),
        (branded(2).to_string(), VerdictErrorCode::NotPending),
    ];
    assert_eq!(ledger.answers(1), expected);
    assert_eq!(ledger.tally().emits, 0);
}

#[test]
fn an_unconfirmed_ack_emit_is_answered_unavailable_naming_what_was_written() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(1));
    ledger.offer(entry(1, 1), now);
    assert_eq!(ledger.deliveries(1), vec![1]);
    ledger.ack_emit(1, branded(1).to_string(), branded(1), vec![emit("out")], now);
    let order = ledger.take_orders().emits.pop().unwrap();
    let ids = vec![StreamId { ms: 9, seq: 4 }];
    ledger.emitted(order, Emission::Emitted { ids, unconfirmed: Some("only 0 of 1 replicas".to_owned()) });
    let told = ledger.told(1);
    let [Effect::Answer { refusal: Refusal::Unavailable(message), .. }] = told.as_slice() else {
        panic!("one UNAVAILABLE, got {told:?}")
    };
    let written =
        format!("{} (stream id 9-4) in `out`", BrandedId::from_stream_id(StreamId { ms: 9, seq: 4 }).unwrap());
    assert!(message.contains(&written) && message.contains("only 0 of 1 replicas"), "{message}");
}

#[test]
fn an_ack_emit_redis_refused_is_answered_invalid_and_retried_as_a_fail() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(1));
    ledger.offer(entry(1, 3), now);
    assert_eq!(ledger.deliveries(1), vec![1]);
    ledger.ack_emit(1, branded(1).to_string(), branded(1), vec![emit("out")], now);
    let order = ledger.take_orders().emits.pop().unwrap();
    ledger.emit_refused(order, "an emit stream is not a stream (WRONGTYPE)".to_owned(), now);
    assert_eq!(ledger.answers(1), vec![(branded(1).to_string(), VerdictErrorCode::InvalidArgument)]);
    let writes = ledger.take_orders().retry_writes;
    assert_eq!(writes.len(), 1, "recorded for peers, as a Fail's retry is");
    assert!(writes[0].counts && writes[0].reason.contains("WRONGTYPE"), "{writes:?}");
    let due = ledger.next_due().expect("it waits to come back");
    let backoff = Duration::from_millis(100) * 4;
    assert!(due >= now + backoff / 2 && due <= now + backoff, "the call's backoff after its third delivery");
    assert_eq!(ledger.tally().fails, 1);
}

#[test]
fn an_ack_emit_on_an_at_most_once_call_is_invalid_and_keeps_the_delivery() {
    let mut at_most_once = Checked::new(Ledger::new("s", "g", true, false, false));
    let now = Instant::now();
    call(&mut at_most_once, 1, policy(1));
    at_most_once.offer(entry(1, 1), now);
    at_most_once.ack_emit(1, branded(1).to_string(), branded(1), vec![emit("out")], now);
    assert_eq!(at_most_once.answers(1), vec![(branded(1).to_string(), VerdictErrorCode::InvalidArgument)]);
    assert_eq!(at_most_once.held(), 1);
    assert!(at_most_once.take_orders().emits.is_empty());
}

#[test]
fn retry_delays_double_per_attempt_within_their_cap_and_jitter_into_the_upper_half() {
    let policy = policy(1);
    for (attempts, full) in [(1, 100), (2, 200), (3, 400), (8, 10_000), (40, 10_000)] {
        for _ in 0..50 {
            let delay = policy.backoff.delay(attempts);
            let full = Duration::from_millis(full);
            assert!(delay >= full / 2 && delay <= full, "attempts {attempts}: {delay:?} outside {full:?}/2..={full:?}");
        }
    }
}

#[test]
fn a_fail_waits_for_its_delay_and_records_it_for_peers() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    ledger.offer(entry(1, 1), now);
    ledger.set_wall_clock(now, 1_000_000);
    ledger.fail(1, fail_of(1, Ok(Some(Duration::from_secs(2))), false), now + MS);
    assert_eq!(ledger.next_due(), Some(now + MS + Duration::from_secs(2)));
    assert!(ledger.take_due(now + Duration::from_millis(1999), 10).is_empty(), "not before its delay");
    let orders = ledger.take_orders();
    assert_eq!(orders.retry_writes.len(), 1);
    assert_eq!(orders.retry_writes[0].reason, "boom");
    assert_eq!(orders.retry_writes[0].due_unix_ms, 1_002_001, "due on the wall clock as on the ledger's");
    assert!(orders.acks.is_empty());
    assert_eq!(ledger.take_due(now + MS + Duration::from_secs(2), 10), vec![sid(1)]);
    assert!(!ledger.tracks(sid(1)), "taken out until claimed or put back");
}

#[test]
fn a_fail_with_dead_letter_is_queued_for_the_dead_letter_step() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    ledger.offer(entry(1, 2), now);
    ledger.fail(1, fail_of(1, Ok(None), true), now);
    let orders = ledger.take_orders();
    assert_eq!(orders.dead_letters.len(), 1);
    assert_eq!(orders.dead_letters[0].stream_id, sid(1));
    assert_eq!(orders.dead_letters[0].verdict, Some((1, branded(1).to_string())));
    assert!(orders.retry_writes.is_empty() && ledger.next_due().is_none());
}

#[test]
fn a_bad_retry_after_or_an_at_most_once_fail_leaves_the_delivery_held() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    ledger.offer(entry(1, 1), now);
    let text = branded(1).to_string();
    ledger.fail(1, fail_of(1, Err("fail.retry_after: must not be negative".to_owned()), false), now);
    assert_eq!(ledger.answers(1), vec![(text.clone(), VerdictErrorCode::InvalidArgument)]);
    assert_eq!(ledger.held(), 1);

    let mut at_most_once = Checked::new(Ledger::new("s", "g", true, false, false));
    call(&mut at_most_once, 1, policy(4));
    at_most_once.offer(entry(1, 1), now);
    at_most_once.fail(1, fail_of(1, Ok(None), false), now);
    assert_eq!(at_most_once.answers(1)[0].1, VerdictErrorCode::InvalidArgument);
    assert_eq!(at_most_once.held(), 1);
    at_most_once.ack(1, branded(1).to_string(), branded(1), now);
    assert!(at_most_once.take_orders().acks.is_empty(), "nothing pending, nothing to XACK");
}

#[test]
fn a_passed_ack_deadline_frees_the_slot_and_schedules_a_retry() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, Policy { ack_deadline: Some(Duration::from_secs(1)), ..policy(2) });
    ledger.offer(entry(1, 1), now);
    ledger.offer(entry(2, 1), now);
    ledger.extend(1, vec![(branded(2).to_string(), branded(2))], Duration::from_secs(5), now);
    assert!(ledger.has_deadlines());
    assert_eq!(ledger.expire(now + Duration::from_millis(999)), 0);
    assert_eq!(ledger.expire(now + Duration::from_secs(1)), 1, "the extended one stays");
    assert_eq!(ledger.left(1), vec![branded(1)]);
    assert_eq!((ledger.held(), ledger.free()), (1, 1), "the expired entry frees its slot and waits");
    assert_eq!(ledger.reclaim_room(), 0, "the waiting entry speaks for that slot");
    assert_eq!(ledger.take_orders().retry_writes.len(), 1);
    ledger.ack(1, branded(1).to_string(), branded(1), now);
    assert_eq!(ledger.answers(1), vec![(branded(1).to_string(), VerdictErrorCode::UnknownId)]);
}

#[test]
fn a_forgotten_delivery_leaves_its_call_and_its_verdicts_say_why_until_delivered_again() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(2));
    ledger.offer(entry(1, 1), now);
    ledger.offer(entry(2, 1), now);
    assert!(ledger.lease_lost(sid(1)));
    assert_eq!(ledger.forget(sid(2), Gone::Deleted), Some((1, branded(2))));
    assert_eq!((ledger.held(), ledger.free()), (0, 2));
    assert_eq!(ledger.answers(1), vec![(branded(1).to_string(), VerdictErrorCode::LeaseLost)]);

    for _ in 0..2 {
        ledger.ack(1, branded(1).to_string(), branded(1), now);
    }
    ledger.extend(1, vec![(branded(2).to_string(), branded(2))], Duration::from_secs(1), now);
    let codes: Vec<VerdictErrorCode> = ledger.answers(1).into_iter().map(|(_, code)| code).collect();
    assert_eq!(codes, vec![VerdictErrorCode::NotPending; 3]);

    ledger.offer(entry(1, 2), now);
    ledger.ack(1, branded(1).to_string(), branded(1), now);
    assert!(ledger.answers(1).is_empty(), "the new delivery supersedes the lost one");
    assert_eq!(ledger.take_orders().acks.len(), 1);
}

#[test]
fn forget_drops_ready_and_waiting_entries_without_telling_a_call() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(1));
    ledger.offer(entry(1, 1), now);
    ledger.offer(entry(2, 1), now);
    ledger.wait(sid(3), now);
    assert_eq!(ledger.forget(sid(2), Gone::Deleted), None);
    assert_eq!(ledger.forget(sid(3), Gone::Deleted), None);
    assert_eq!(ledger.forget(sid(4), Gone::Deleted), None, "unknown to the worker");
    assert!(ledger.next_due().is_none());
    assert_eq!(ledger.leased(), vec![sid(1)]);
    let _ = ledger.deliveries(1);
    ledger.ack(1, branded(1).to_string(), branded(1), now);
    ledger.hand_out_ready(now);
    assert!(ledger.deliveries(1).is_empty(), "the forgotten ready entry is not handed out");
}

#[test]
fn a_detached_call_returns_what_it_held_to_wait_for_its_backoff() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(1));
    call(&mut ledger, 2, policy(1));
    ledger.offer(entry(1, 1), now);
    ledger.offer(entry(2, 1), now);
    ledger.offer(entry(3, 1), now);
    let detached = ledger.detach(1, now);
    assert_eq!(detached, Detached { returned: 1, last: false });
    assert_eq!(ledger.take_orders().retry_writes.len(), 1, "the backoff binds peers and restarts too");
    let due = ledger.next_due().expect("waiting");
    assert!(due >= now + Duration::from_millis(50) && due <= now + Duration::from_millis(100), "{:?}", due - now);

    assert_eq!(ledger.detach(2, now), Detached { returned: 1, last: true });
    assert_eq!(ledger.leased(), Vec::<StreamId>::new(), "the ready entry is released to wait in the PEL");
    assert_eq!(ledger.take_due(now + Duration::from_secs(1), 10), Vec::<StreamId>::new(), "no credit, no claim");
}

#[test]
fn due_entries_are_taken_within_credit_in_due_order() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(2));
    ledger.wait(sid(3), now + 3 * MS);
    ledger.wait(sid(1), now + MS);
    ledger.wait(sid(2), now + 2 * MS);
    ledger.wait(sid(9), now + Duration::from_secs(9));
    assert_eq!(ledger.reclaim_room(), 0, "waiting entries speak for the credit");
    assert_eq!(ledger.take_due(now + 5 * MS, 10), vec![sid(1), sid(2)]);
    assert_eq!(ledger.next_due(), Some(now + 3 * MS));
}

#[test]
fn a_drained_or_closed_call_takes_nothing_more() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    ledger.drain_call(1);
    assert_eq!(ledger.free(), 0);
    ledger.offer(entry(1, 1), now);
    assert_eq!(ledger.held(), 0);

    call(&mut ledger, 2, policy(4));
    ledger.hang_up(2);
    ledger.offer(entry(2, 1), now);
    ledger.act();
    assert_eq!((ledger.held(), ledger.free()), (0, 0), "a call whose receiver is gone is closed on first send");
    let mut ready = ledger.leased();
    ready.sort();
    assert_eq!(ready, vec![sid(1), sid(2)], "both entries are kept ready for another call");
}

#[test]
fn while_draining_entries_read_are_kept_not_handed_out() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    ledger.set_draining(true);
    ledger.offer(entry(1, 1), now);
    assert!(ledger.deliveries(1).is_empty());
    assert_eq!(ledger.leased(), vec![sid(1)]);
}

#[test]
fn a_re_read_of_a_held_entry_is_not_handed_out_twice() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(1));
    call(&mut ledger, 2, policy(1));
    ledger.offer(entry(1, 1), now);
    ledger.offer(entry(1, 1), now);
    assert_eq!(ledger.deliveries(1).len() + ledger.deliveries(2).len(), 1);
}

#[test]
fn a_second_call_with_other_group_settings_is_refused() {
    let mut ledger = ledger();
    call(&mut ledger, 1, policy(1));
    let other = GroupPolicy { max_deliveries: 9, ..settings() };
    let refused = ledger.attach(2, 0, policy(1), other.clone());
    assert!(matches!(refused, Err(Error::Conflict { .. })));
    ledger.detach(1, Instant::now());
    assert!(ledger.attach(3, 0, policy(1), other).is_ok(), "alone, it sets them");
}

#[test]
fn the_shard_share_splits_credit_evenly_with_the_remainder_first() {
    let shares: Vec<u32> = (0..4).map(|shard| shard_share(10, 4, shard)).collect();
    assert_eq!(shares, vec![3, 3, 2, 2]);
    assert_eq!((0..3).map(|shard| shard_share(3, 3, shard)).sum::<u32>(), 3);
    assert_eq!(shard_share(64, 1, 0), 64);
}

#[test]
fn a_read_waits_for_a_quarter_of_the_credit_while_deliveries_are_out() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(100));
    assert_eq!(ledger.worth_reading(512), 1, "nothing out: read at once");
    for n in 1..=100 {
        ledger.offer(entry(n, 1), now);
    }
    assert_eq!(ledger.worth_reading(512), 25);
    for n in 1..=24 {
        ledger.ack(1, branded(n).to_string(), branded(n), now);
    }
    assert!(ledger.free() < ledger.worth_reading(512), "24 free slots are not yet worth a read");
    ledger.ack(1, branded(25).to_string(), branded(25), now);
    assert!(ledger.free() >= ledger.worth_reading(512));
    assert_eq!(ledger.worth_reading(8), 8, "never more than one read's worth");
}

#[test]
fn with_nothing_out_a_read_asks_for_all_free_credit_at_once() {
    let (mut ledger, now) = (ledger(), Instant::now());
    assert_eq!(ledger.read_now(now, 512), None, "no call, no credit, no read");
    call(&mut ledger, 1, policy(100));
    assert_eq!(ledger.read_now(now, 512), Some(100));
    assert_eq!(ledger.read_now(now, 8), Some(8), "never more than one read's worth");
    ledger.reading(8);
    assert_eq!(ledger.read_now(now, 512), None, "one read at a time");
    assert_eq!(ledger.read_due(), None);
}

#[test]
fn with_deliveries_out_a_read_waits_for_a_quarter_of_the_credit() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(100));
    hand_out(&mut ledger, 1..=100, now);
    assert_eq!(ledger.read_now(now, 512), None, "no free slot");
    assert_eq!(ledger.read_due(), None, "nothing lingers without a free slot");
    for n in 1..=25 {
        ledger.ack(1, branded(n).to_string(), branded(n), now);
    }
    assert_eq!(ledger.read_now(now, 512), Some(25), "a quarter free: read at once");
    assert_eq!(ledger.read_due(), None);
}

#[test]
fn a_read_short_of_a_quarter_lingers_two_milliseconds_from_the_first_free_slot() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(100));
    hand_out(&mut ledger, 1..=100, now);
    ledger.ack(1, branded(1).to_string(), branded(1), now);
    assert_eq!(ledger.read_now(now, 512), None, "one free slot is not worth a read yet");
    assert_eq!(ledger.read_due(), Some(now + READ_LINGER));
    ledger.ack(1, branded(2).to_string(), branded(2), now + MS);
    assert_eq!(ledger.read_now(now + MS, 512), None, "the linger runs from the first free slot");
    assert_eq!(ledger.read_due(), Some(now + READ_LINGER));
    assert_eq!(ledger.read_now(now + READ_LINGER, 512), Some(2), "lingered long enough: read what is free");
    assert_eq!(ledger.read_due(), None, "the next linger starts afresh");

    ledger.reading(2);
    ledger.read_done();
    for n in 3..=4 {
        ledger.ack(1, branded(n).to_string(), branded(n), now + READ_LINGER);
    }
    assert_eq!(ledger.read_now(now + READ_LINGER, 512), None);
    assert_eq!(ledger.read_due(), Some(now + 2 * READ_LINGER));
}

#[test]
fn a_slot_taken_again_ends_the_linger() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(8));
    hand_out(&mut ledger, 1..=8, now);
    ledger.ack(1, branded(1).to_string(), branded(1), now);
    assert_eq!(ledger.read_now(now, 512), None);
    ledger.offer(entry(9, 1), now);
    assert_eq!(ledger.read_now(now, 512), None, "no free slot left");
    assert_eq!(ledger.read_due(), None, "nothing to linger for");
}

/// Entries 1..=n held by call 1 and acked, their XACKs queued.
fn acks_of(ledger: &mut Checked, n: u64, now: Instant) -> Vec<PendingAck> {
    call(ledger, 1, policy(n as u32));
    hand_out(ledger, 1..=n, now);
    for k in 1..=n {
        ledger.ack(1, branded(k).to_string(), branded(k), now);
    }
    ledger.take_orders().acks
}

#[test]
fn an_xack_that_finds_none_pending_answers_each_and_one_that_finds_some_answers_none() {
    let (mut ledger, now) = (ledger(), Instant::now());
    let acks = acks_of(&mut ledger, 3, now);
    let _ = ledger.deliveries(1);
    assert_eq!(ledger.acked(acks, &[0]), None, "each not pending is answered: no shortfall to log");
    let codes: Vec<VerdictErrorCode> = ledger.answers(1).into_iter().map(|(_, code)| code).collect();
    assert_eq!(codes, vec![VerdictErrorCode::NotPending; 3]);
    assert_eq!((ledger.tally().acks, ledger.tally().acks_not_pending), (0, 3));

    let (mut ledger, now) = (self::ledger(), Instant::now());
    let acks = acks_of(&mut ledger, 3, now);
    let shortfall = ledger.acked(acks, &[2]).expect("a shortfall");
    assert_eq!((shortfall.acked, shortfall.not_pending), (3, 1));
    assert!(shortfall.first < shortfall.last, "in stream order: {shortfall:?}");
    assert!(ledger.answers(1).is_empty(), "XACK does not say which one was not pending");
    assert_eq!((ledger.tally().acks, ledger.tally().acks_not_pending), (2, 1));
}

#[test]
fn a_write_that_failed_answers_its_verdicts_unavailable_and_its_entries_wait() {
    let (mut ledger, now) = (ledger(), Instant::now());
    let acks = acks_of(&mut ledger, 2, now);
    let retry_at = now + Duration::from_secs(1);
    let entries = acks.into_iter().map(|ack| (ack.stream_id, Some((ack.session, ack.text))));
    ledger.not_written(entries, "XACK failed", retry_at);
    let codes: Vec<VerdictErrorCode> = ledger.answers(1).into_iter().map(|(_, code)| code).collect();
    assert_eq!(codes, vec![VerdictErrorCode::Unavailable; 2]);
    assert_eq!(ledger.next_due(), Some(retry_at));
    assert_eq!(ledger.take_due(retry_at, 10), vec![sid(1), sid(2)]);
}

#[test]
fn a_dead_letter_that_did_not_move_tells_its_fail_why() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(3));
    hand_out(&mut ledger, 1..=3, now);
    for n in 1..=3 {
        ledger.fail(1, fail_of(n, Ok(None), true), now);
    }
    let orders = ledger.take_orders().dead_letters;
    let moved = DeadLettered::Moved { dead_id: sid(9), deliveries: 1 };
    let outcomes = vec![(sid(1), moved), (sid(2), DeadLettered::Deleted), (sid(3), DeadLettered::NotOurs)];
    ledger.dead_lettered(orders, outcomes, "s:dlq");
    let answers = ledger.answers(1);
    let expected = [(2, VerdictErrorCode::NotPending), (3, VerdictErrorCode::NotPending)];
    assert_eq!(answers, expected.map(|(n, code)| (branded(n).to_string(), code)));
    assert_eq!((ledger.tally().dead_letters, ledger.tally().trimmed), (1, 1));
}

#[test]
fn a_refresh_that_finds_a_lease_taken_tells_the_call_and_drops_a_deleted_entry() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    hand_out(&mut ledger, 1..=4, now);
    let _ = ledger.deliveries(1);
    let unrefreshed =
        vec![(sid(1), Unrefreshed::ToPeer), (sid(2), Unrefreshed::Deleted), (sid(3), Unrefreshed::Unowned)];
    ledger.refreshed(4, unrefreshed);
    assert_eq!(ledger.answers(1), vec![(branded(1).to_string(), VerdictErrorCode::LeaseLost)]);
    assert_eq!(ledger.held(), 2, "the unowned one stays held: its verdict decides");
    let tally = ledger.tally();
    assert_eq!((tally.lease_refreshes, tally.leases_lost, tally.trimmed), (1, 1, 1));
}

#[test]
fn entries_found_pending_wait_unless_already_tracked() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    hand_out(&mut ledger, 1..=1, now);
    ledger.wait(sid(2), now + Duration::from_secs(5));
    assert_eq!(ledger.found_pending(&[sid(1), sid(2), sid(3)], now), 1, "only entry 3 is new");
    assert_eq!(ledger.reclaimed(&[sid(3), sid(4)], &[sid(2)], now), 1, "4 taken, 2 deleted");
    assert_eq!(ledger.take_due(now, 10), vec![sid(3), sid(4)]);
    assert_eq!(ledger.tally().reclaimed, 1);
}

#[test]
fn an_early_redelivery_waits_for_its_recorded_due_time_and_a_poison_one_is_dead_lettered() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    let early = Redelivery::NotDue { due_unix_ms: 10_500 };
    assert!(ledger.redelivered(sid(1), early, now, 10_000).is_none());
    assert_eq!(ledger.next_due(), Some(now + Duration::from_millis(500)));
    let poison = Redelivery::Poison { deliveries: 5, reason: String::new() };
    let order = ledger.redelivered(sid(2), poison, now, 10_000).expect("a dead-letter order");
    assert_eq!((order.stream_id, order.reason.as_str(), order.verdict), (sid(2), "max deliveries reached", None));
    assert!(ledger.redelivered(sid(3), Redelivery::Deleted, now, 10_000).is_none());
    assert_eq!(ledger.tally().trimmed, 1);
}

#[test]
fn a_sharded_call_is_told_when_a_verdict_settles_a_delivery_and_a_plain_one_is_not() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, Policy { sharded: true, ..policy(2) });
    hand_out(&mut ledger, 1..=2, now);
    ledger.ack(1, branded(1).to_string(), branded(1), now);
    ledger.fail(1, fail_of(2, Err("bad".to_owned()), false), now);
    assert_eq!(ledger.left(1), vec![branded(1)], "a refused Fail settles nothing, so nothing left");
    ledger.fail(1, fail_of(2, Ok(None), false), now);
    assert_eq!(ledger.left(1), vec![branded(2)]);

    call(&mut ledger, 2, policy(1));
    hand_out(&mut ledger, 3..=3, now);
    ledger.ack(2, branded(3).to_string(), branded(3), now);
    assert!(ledger.left(2).is_empty(), "a plain call routes nothing");
}

#[test]
fn the_pump_redelivers_due_entries_then_walks_the_own_pel_then_reads() {
    let (mut ledger, now) = (ledger(), Instant::now());
    assert_eq!(ledger.next_work(now, 512), None, "no call, no credit: nothing to do");
    call(&mut ledger, 1, policy(10));
    ledger.wait(sid(7), now + MS);
    assert_eq!(
        ledger.next_work(now, 512),
        Some(Work::RecoverPage { after: None, count: 10 }),
        "a new worker walks its PEL first"
    );
    assert_eq!(ledger.next_work(now + MS, 512), Some(Work::Redeliver(vec![sid(7)])), "due entries before all else");
    assert_eq!(ledger.next_work(now + MS, 4), Some(Work::RecoverPage { after: None, count: 4 }));

    assert_eq!(ledger.recovered_page(&[sid(1), sid(2), sid(3), sid(4)], 4, now), None, "a full page: the walk goes on");
    assert_eq!(ledger.next_work(now, 4), Some(Work::Redeliver(vec![sid(1), sid(2), sid(3), sid(4)])));
    for n in 1..=4 {
        ledger.offer(entry(n, 2), now);
    }
    assert_eq!(
        ledger.next_work(now, 512),
        Some(Work::RecoverPage { after: Some(sid(4)), count: 6 }),
        "from where it was"
    );
    assert_eq!(ledger.recovered_page(&[sid(5)], 6, now), Some(5), "a short page ends the walk, counting all it found");
    assert_eq!(ledger.next_work(now, 512), Some(Work::Redeliver(vec![sid(5)])));
    ledger.offer(entry(5, 2), now);
    assert_eq!(ledger.next_work(now, 512), Some(Work::Read(5)), "walked: new entries are read");
}

#[test]
fn a_walk_of_the_own_pel_starts_again_once_at_a_time_and_never_at_most_once() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(10));
    assert!(!ledger.recover_own_pending(), "a new worker walks already");
    assert_eq!(ledger.recovered_page(&[], 10, now), Some(0));
    assert_eq!(ledger.next_work(now, 512), Some(Work::Read(10)));
    ledger.reading(10);
    ledger.read_done();
    assert!(ledger.recover_own_pending(), "a lost read's reply: walk again");
    assert_eq!(ledger.next_work(now, 512), Some(Work::RecoverPage { after: None, count: 10 }));

    let mut at_most_once = Checked::new(Ledger::new("s", "g", true, false, false));
    call(&mut at_most_once, 1, policy(10));
    assert!(!at_most_once.recover_own_pending(), "nothing is pending at most once");
    assert_eq!(at_most_once.next_work(now, 512), Some(Work::Read(10)));
}

#[test]
fn a_call_without_max_in_flight_gets_a_window_that_grows_while_it_keeps_up() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, Policy { adaptive: true, ..policy(1000) });
    assert_eq!(ledger.free(), 64, "an adaptive window starts at 64");
    hand_out(&mut ledger, 1..=64, now);
    assert_eq!(ledger.free(), 0);
    for n in 1..=64 {
        ledger.ack(1, branded(n).to_string(), branded(n), now + MS);
    }
    assert_eq!(ledger.free(), 128, "a window's worth acked fast with the credit used up: doubled");
    hand_out(&mut ledger, 65..=100, now + MS);
    for n in 65..=100 {
        ledger.ack(1, branded(n).to_string(), branded(n), now + 2 * MS);
    }
    assert_eq!(ledger.free(), 128, "credit left over: the window was not the limit, it holds");
}

#[test]
fn a_call_without_max_in_flight_that_falls_behind_gets_a_smaller_window() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, Policy { adaptive: true, ..policy(1000) });
    hand_out(&mut ledger, 1..=64, now);
    ledger.ack(1, branded(1).to_string(), branded(1), now + MS);
    for n in 2..=64 {
        ledger.ack(1, branded(n).to_string(), branded(n), now + Duration::from_secs(1));
    }
    assert_eq!(ledger.free(), 48, "verdicts came back far slower than the fastest: a quarter less");
    hand_out(&mut ledger, 65..=112, now);
    assert_eq!(ledger.free(), 0);
}

#[test]
fn a_call_without_max_in_flight_that_settles_nothing_out_of_credit_gets_more_after_the_stall_time() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, Policy { adaptive: true, ..policy(128) });
    hand_out(&mut ledger, 1..=64, now);
    assert_eq!(ledger.stall_due(), Some(now + STALL));
    ledger.hand_out_ready(now + STALL - MS);
    assert_eq!(ledger.free(), 0, "not yet stalled");
    ledger.hand_out_ready(now + STALL);
    assert_eq!((ledger.free(), ledger.tally().window_stalls), (64, 1), "it waits for more: the window doubled");
    hand_out(&mut ledger, 65..=128, now + STALL);
    // Twice the patience: the last stall had no verdict since.
    let due = now + STALL * 3;
    assert!(ledger.stall_due().is_some_and(|at| at <= due), "looked at by then");
    ledger.hand_out_ready(due - MS);
    assert!(ledger.tally().capped_calls.is_empty(), "not yet stalled");
    ledger.hand_out_ready(due);
    assert_eq!(ledger.tally().capped_calls, [(1, 128)], "a call stalled at its cap is told once");
    assert_eq!(ledger.stall_due(), None, "and never looked at again");
    ledger.ack(1, branded(1).to_string(), branded(1), due + MS);
    hand_out(&mut ledger, 129..=129, due + MS);
    ledger.hand_out_ready(due + STALL * 100);
    assert_eq!(ledger.tally().capped_calls.len(), 1, "not even when it settles and runs out again");
}

#[test]
fn a_transient_fail_waits_for_its_delay_and_records_that_it_does_not_count() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    hand_out(&mut ledger, 1..=2, now);
    ledger.fail(1, FailVerdict { kind: Ok(FailKind::Transient), ..fail_of(1, Ok(Some(MS)), false) }, now);
    ledger.fail(1, fail_of(2, Ok(Some(MS)), false), now);
    let writes = ledger.take_orders().retry_writes;
    assert_eq!(writes.iter().map(|w| (w.stream_id, w.counts)).collect::<Vec<_>>(), [(sid(1), false), (sid(2), true)]);
    assert_eq!((ledger.tally().fails, ledger.tally().transient_fails), (2, 1));
    assert_eq!(ledger.take_due(now + MS, 10), [sid(1), sid(2)], "both wait for their delay");
}

#[test]
fn an_invalid_fail_kind_is_answered_and_leaves_the_delivery_held() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    hand_out(&mut ledger, 1..=1, now);
    ledger.fail(1, FailVerdict { kind: Err("fail.kind: bad".to_owned()), ..fail_of(1, Ok(None), false) }, now);
    assert_eq!(ledger.held(), 1);
    assert!(!ledger.has_orders());
    assert_eq!(ledger.answers(1), [(branded(1).to_string(), VerdictErrorCode::InvalidArgument)]);
}

/// A Release of entries `ns`, sent as their branded ids.
fn release_of(ns: &[u64]) -> Vec<(String, BrandedId)> {
    ns.iter().map(|&n| (branded(n).to_string(), branded(n))).collect()
}

#[test]
fn a_release_frees_the_slot_at_once_and_queues_the_entry_for_release_lua() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(2));
    hand_out(&mut ledger, 1..=2, now);
    assert_eq!(ledger.deliveries(1), vec![1, 2]);
    assert_eq!(ledger.free_for_due(), 0);
    ledger.release(1, release_of(&[2]), now + MS);
    assert_eq!(ledger.held(), 1, "the released delivery left the call");
    assert_eq!(ledger.free_for_due(), 1, "its slot is free at once");
    assert!(!ledger.tracks(sid(2)), "untracked until release.lua says what it did");
    assert!(ledger.take_due(now + Duration::from_secs(3600), 10).is_empty(), "not claimed before it is given back");
    let orders = ledger.take_orders();
    assert_eq!(orders.releases.len(), 1);
    assert_eq!((orders.releases[0].stream_id, orders.releases[0].answer.as_ref().map(|(s, _)| *s)), (sid(2), Some(1)));
    assert!(orders.retry_writes.is_empty() && orders.acks.is_empty(), "a release writes no retry state, acks nothing");
    assert_eq!(ledger.tally().fails, 0, "a release is no Fail");
    assert!(ledger.tally().handler_seconds.is_empty(), "no handler ran it: no handler time");
    ledger.ack(1, branded(2).to_string(), branded(2), now + MS);
    assert_eq!(ledger.answers(1), vec![(branded(2).to_string(), VerdictErrorCode::UnknownId)], "no longer held");
    assert!(ledger.take_orders().acks.is_empty());
}

#[test]
fn a_released_entry_waits_due_now_for_the_groups_other_calls() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(1));
    hand_out(&mut ledger, 1..=1, now);
    assert_eq!(ledger.deliveries(1), vec![1]);
    call(&mut ledger, 2, policy(1));
    ledger.drain_call(1);
    ledger.release(1, release_of(&[1]), now);
    let orders = ledger.take_orders().releases;
    ledger.released(orders, vec![(sid(1), Released::GivenBack { deliveries: 0 })], now);
    assert_eq!(ledger.tally().releases, 1);
    assert_eq!(ledger.next_due(), Some(now), "due at once");
    assert_eq!(ledger.take_due(now, 10), vec![sid(1)], "for call 2, which has room");
    assert!(ledger.answers(1).is_empty());
    ledger.offer(entry(1, 1), now);
    assert_eq!(ledger.deliveries(2), vec![1]);
}

#[test]
fn a_release_not_applied_says_why_per_id_and_leaves_the_rest() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    hand_out(&mut ledger, 1..=4, now);
    ledger.deliveries(1);
    ledger.lease_lost(sid(4));
    ledger.answers(1);
    // 5 was never delivered, 4 was lost to a peer: answered, nothing queued.
    ledger.release(1, release_of(&[1, 2, 3, 4, 5]), now);
    let expected = [(4, VerdictErrorCode::NotPending), (5, VerdictErrorCode::UnknownId)];
    assert_eq!(ledger.answers(1), expected.map(|(n, code)| (branded(n).to_string(), code)));
    let orders = ledger.take_orders().releases;
    assert_eq!(orders.iter().map(|o| o.stream_id).collect::<Vec<_>>(), vec![sid(1), sid(2), sid(3)]);
    let outcomes =
        vec![(sid(1), Released::GivenBack { deliveries: 0 }), (sid(2), Released::NotOurs), (sid(3), Released::Deleted)];
    ledger.released(orders, outcomes, now);
    let expected = [(2, VerdictErrorCode::NotPending), (3, VerdictErrorCode::NotPending)];
    assert_eq!(ledger.answers(1), expected.map(|(n, code)| (branded(n).to_string(), code)));
    assert!(ledger.tracks(sid(1)) && !ledger.tracks(sid(2)) && !ledger.tracks(sid(3)), "only 1 waits here");
    assert_eq!((ledger.tally().releases, ledger.tally().trimmed), (1, 1));
    // Released twice: the second is not held any more.
    ledger.release(1, release_of(&[1]), now);
    assert_eq!(ledger.answers(1), vec![(branded(1).to_string(), VerdictErrorCode::UnknownId)]);
}

#[test]
fn an_at_most_once_release_is_invalid_and_leaves_the_delivery_held() {
    let now = Instant::now();
    let mut at_most_once = Checked::new(Ledger::new("s", "g", true, false, false));
    call(&mut at_most_once, 1, policy(4));
    at_most_once.offer(entry(1, 1), now);
    at_most_once.release(1, release_of(&[1]), now);
    assert_eq!(at_most_once.answers(1), vec![(branded(1).to_string(), VerdictErrorCode::InvalidArgument)]);
    assert_eq!(at_most_once.held(), 1);
    assert!(at_most_once.take_orders().releases.is_empty());
}

#[test]
fn a_release_that_failed_answers_unavailable_and_its_entry_waits() {
    let (mut ledger, now) = (ledger(), Instant::now());
    call(&mut ledger, 1, policy(4));
    hand_out(&mut ledger, 1..=1, now);
    ledger.release(1, release_of(&[1]), now);
    let orders = ledger.take_orders().releases;
    let entries = orders.into_iter().map(|o| (o.stream_id, o.answer));
    ledger.not_written(entries, "releasing failed", now + Duration::from_secs(1));
    assert_eq!(ledger.answers(1), vec![(branded(1).to_string(), VerdictErrorCode::Unavailable)]);
    assert_eq!(ledger.next_due(), Some(now + Duration::from_secs(1)));
}

/// A group with per-key limit 1 on field `acct`, and entry `n` of key `key`.
fn keyed_settings() -> GroupPolicy {
    GroupPolicy { keys: Some(KeyLimit { field: "acct".to_owned(), per_key: 1 }), ..settings() }
}

fn keyed_entry(n: u64, key: &[u8]) -> Outgoing<()> {
    Outgoing { member: Some(keyed::member(key, sid(n))), ..entry(n, 1) }
}

#[test]
fn entries_waiting_for_their_key_take_no_credit_stay_leased_and_go_out_when_the_gate_says() {
    let (mut ledger, now) = (ledger(), Instant::now());
    ledger.attach(1, 0, policy(2), keyed_settings()).expect("attach");
    ledger.offer(keyed_entry(1, b"a"), now);
    ledger.key_wait(keyed_entry(2, b"a"), now);
    ledger.key_wait(keyed_entry(3, b"a"), now);
    assert_eq!(ledger.deliveries(1), vec![1]);
    assert_eq!((ledger.key_waiting(), ledger.free()), (2, 1), "waiting entries use no slot");
    let mut leased = ledger.leased();
    leased.sort();
    assert_eq!(leased, [sid(1), sid(2), sid(3)], "the lease refresh keeps waiting entries too");
    assert!(ledger.tracks(sid(2)), "a reclaim or the own-PEL walk does not take them again");

    // Nothing freed yet: the first poll asks for the key's head only.
    let poll = now + DEFAULT_KEY_WAIT_POLL;
    assert_eq!(ledger.next_work(poll, 100), Some(Work::KeyGate(vec![(sid(2), keyed::member(b"a", sid(2)))])));
    let next = ledger.next_work(poll, 100);
    assert!(!matches!(next, Some(Work::KeyGate(_))), "no second gate run before the next poll: {next:?}");

    // Acking entry 1 (whose XACK removes its member) frees the key at once.
    ledger.ack(1, branded(1).to_string(), branded(1), now);
    let orders = ledger.take_orders();
    assert_eq!(orders.acks[0].member, Some(keyed::member(b"a", sid(1))), "the ack carries the member to remove");
    let _ = ledger.acked(orders.acks, &[1]);
    let Some(Work::KeyGate(candidates)) = ledger.next_work(now, 100) else {
        panic!("the freed key is checked at once")
    };
    assert_eq!(candidates.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [sid(2)]);
    ledger.key_gated(candidates, &[keyed::Checked::Admitted], now);
    assert_eq!(ledger.deliveries(1), vec![2]);
    assert_eq!(ledger.key_waiting(), 1);
}

#[test]
fn waiting_entries_stop_the_reads_at_their_bound_and_wait_in_the_pel_when_the_last_call_leaves() {
    let (mut ledger, now) = (ledger(), Instant::now());
    ledger.attach(1, 0, policy(1), keyed_settings()).expect("attach");
    let bound = ledger.key_waiting_bound();
    assert_eq!(bound, 64, "four times the credit, at least 64");
    for n in 1..=bound as u64 {
        ledger.key_wait(keyed_entry(n, b"hot"), now);
    }
    assert_eq!((ledger.free(), ledger.free_for_due()), (0, 1), "no new reads; retries still come");
    ledger.key_wait(keyed_entry(1000, b"other"), now);
    assert_eq!(ledger.key_waiting(), bound + 1, "a claimed entry past the bound still waits (it may be a head)");

    ledger.detach(1, now);
    assert_eq!(ledger.key_waiting(), 0);
    assert!(ledger.leased().is_empty(), "no call: they wait in the PEL, for a peer's reclaim");
    assert!(ledger.tracks(sid(1)));
    // No handler saw them: each goes back with its count restored, so a
    // reconnect costs no attempt (the trial saw entries that only waited
    // dead-lettered after two reconnects).
    let releases = ledger.take_orders().releases;
    assert_eq!(releases.len(), bound + 1);
    assert!(releases.iter().all(|order| order.answer.is_none()), "nobody asked: nobody is answered");
}

#[test]
fn ready_entries_go_back_uncounted_when_the_last_call_leaves() {
    let (mut ledger, now) = (ledger(), Instant::now());
    ledger.attach(1, 0, policy(1), settings()).expect("attach");
    ledger.offer(entry(1, 1), now);
    ledger.offer(entry(2, 1), now);
    assert_eq!(ledger.deliveries(1), vec![1], "entry 2 is ready, never handed out");
    ledger.detach(1, now);
    let releases = ledger.take_orders().releases;
    assert_eq!(
        releases.iter().map(|order| order.stream_id).collect::<Vec<_>>(),
        [sid(2)],
        "the held one counts, as a Fail"
    );
}

#[test]
fn a_waiting_entry_a_peer_took_is_forgotten_never_handed_out() {
    let (mut ledger, now) = (ledger(), Instant::now());
    ledger.attach(1, 0, policy(2), keyed_settings()).expect("attach");
    ledger.key_wait(keyed_entry(2, b"a"), now);
    let candidates = vec![(sid(2), keyed::member(b"a", sid(2)))];
    ledger.key_gated(candidates, &[keyed::Checked::Gone], now);
    assert!(ledger.deliveries(1).is_empty(), "a paused sidecar must not run what a peer ran");
    assert!(!ledger.tracks(sid(2)) && ledger.key_waiting() == 0 && ledger.leased().is_empty());
}

#[test]
fn a_second_call_with_another_key_limit_is_refused() {
    let mut ledger = ledger();
    ledger.attach(1, 0, policy(2), keyed_settings()).expect("attach");
    let other = GroupPolicy { keys: Some(KeyLimit { field: "acct".to_owned(), per_key: 2 }), ..settings() };
    let refused = ledger.attach(2, 0, policy(2), other).expect_err("another limit");
    assert!(refused.to_string().contains("key_field `acct` and max_in_flight_per_key 1"), "{refused}");
    assert!(ledger.attach(3, 0, policy(2), settings()).is_err(), "nor without a key field");
}
