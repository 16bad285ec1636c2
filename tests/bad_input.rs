//! Bad input: a seeded property test that drives the Consume call (and Append)
//! with random message sequences against one real sidecar.
//!
//! Each sequence is one of:
//! - a bad opening: a verdict, an extension, a drain or an empty message before
//!   the subscribe, or a subscribe with a bad field (empty or 10 KB names, no
//!   `group_start`, a malformed start id, negative durations, a key of another
//!   Redis type, an oversized message), checked against the status the proto
//!   documents; a few edge cases that must be accepted (a unicode stream name,
//!   a name of exactly the limit) are mixed in;
//! - a subscribed call that sends random verdicts (Ack, Fail, Release) and
//!   extensions (ids held, unknown, already settled, held by another call, malformed: unicode, 10 KB,
//!   uppercase, 27 and 29 characters; 1 MB reasons; negative, zero and huge
//!   durations, `i64::MIN` and `i64::MAX` seconds among them (a huge or
//!   non-normalised one may be taken or refused with INVALID_ARGUMENT, never
//!   choked on); AckEmits with good emits, none, or a bad one among good
//!   ones (the reserved field, empty and 10 KB stream names, too many
//!   fields: refused, the delivery still held); bursts of hundreds of
//!   verdicts), then ends in one of several
//!   ways (half-close, drop, a second subscribe, a message without a kind, an
//!   oversized message);
//! - a bad Append or AppendBatch (names, the reserved field, other key types,
//!   too many fields or entries, oversized).
//!
//! Every client message is followed by a fence (an Ack of a well-formed id no
//! call holds, answered UNKNOWN_ID through the group worker), so each verdict
//! error is attributed to the step that caused it: every step must get exactly
//! the per-verdict errors it deserves, and a call must end with exactly the
//! status it deserves. After every sequence the sidecar must be alive (`/livez`
//! 200, no "panicked" in its log), and a ledger of the entries the test
//! legitimately acked or dead-lettered must account for the group's state: such
//! entries left the PEL, every other entry the group has read is still pending
//! (nothing was acknowledged that should not be), and the dead-letter stream
//! holds exactly the entries the test dead-lettered. The PEL and the group's
//! read position are read in one MULTI, as the sidecar may still be reading
//! for the pool; two tests at the end check that check itself.
//!
//! `ECHOMQ_FUZZ_SEED` reproduces a run's message sequences (the seed is printed;
//! timing still varies), `ECHOMQ_FUZZ_SEQUENCES` sets their number (default 400).
//!
//! This file is the test and its sequences; the rest lives in `bad_input/`:
//! - `generator.rs`: the random messages and what each deserves;
//! - `oracle.rs`: the comparison of what the sidecar answered with that;
//! - `ledger.rs`: the test's account of each pool stream, checked against Redis;
//! - `call.rs`: one Consume call with a fence after every step.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

#[path = "bad_input/call.rs"]
mod call;
#[path = "bad_input/generator.rs"]
mod generator;
#[path = "bad_input/ledger.rs"]
mod ledger;
#[path = "bad_input/oracle.rs"]
mod oracle;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use echomq::proto::consume_request::Kind;
use echomq::proto::consumer_service_client::ConsumerServiceClient;
use echomq::proto::stream_service_client::StreamServiceClient;
use echomq::proto::{
    Ack, AppendBatchRequest, BatchEntry, ConsumeRequest, Drain, Extend, Fail, Subscribe, VerdictErrorCode,
};
use redis::aio::MultiplexedConnection;
use support::*;
use tonic::transport::Channel;
use tonic::{Code, Status};

use call::Call;
use generator::{
    append_case, dur, opening, pool_subscribe, sub, unknown_id, verdict, AppendCall, AppendCase, APPEND_TARGET,
};
use ledger::{apply, Effect, Pool};
use oracle::{describe_error, judge_end, judge_opening, judge_refused_append, panics, reconcile, Expect};

/// The consumer group of every pool stream.
const GROUP: &str = "g";
/// Pool streams with ordinary subscriptions; one more, the last, takes the huge durations.
const POOL: usize = 4;
/// A verdict error echoes at most this many characters of a malformed id.
const ECHO_CHARS: usize = 64;
/// The sidecar's default `max_in_flight`: the cap of the adaptive window of a subscription that sends 0.
const DEFAULT_MAX_IN_FLIGHT: u32 = 1024;
/// Kept of a Fail reason (bytes).
const MAX_REASON_BYTES: usize = 4096;
/// Over the sidecar's default `--max-message-bytes` (4 MiB).
const OVERSIZED: usize = 5 * 1024 * 1024;
/// The wait for anything the sidecar must answer.
const ANSWER: Duration = Duration::from_secs(10);

use VerdictErrorCode::UnknownId as UNKNOWN;

struct World {
    consumer: ConsumerServiceClient<Channel>,
    streams: StreamServiceClient<Channel>,
    con: MultiplexedConnection,
    pools: Vec<Pool>,
    fences: u64,
    /// Counters for the summary.
    stats: BTreeMap<&'static str, u64>,
}

impl World {
    fn fence(&mut self) -> String {
        self.fences += 1;
        format!("ffffffffffff{:016x}", self.fences)
    }

    fn stat(&mut self, what: &'static str, n: u64) {
        *self.stats.entry(what).or_default() += n;
    }

    /// Appends `n` entries to pool `p` through AppendBatch and records them.
    async fn supply(&mut self, p: usize, n: usize, rng: &mut fastrand::Rng) -> Result<(), String> {
        let entries = (0..n)
            .map(|i| {
                let mut fields: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                fields.insert("n".to_owned(), i.to_string().into_bytes());
                if rng.bool() {
                    fields.insert("ünï-¢ødé 🚀".to_owned(), (0..rng.usize(..64)).map(|_| rng.u8(..)).collect());
                }
                BatchEntry { fields: fields.into_iter().collect(), ..Default::default() }
            })
            .collect();
        let request = AppendBatchRequest { stream: self.pools[p].name.clone(), entries, ..Default::default() };
        let response = self.streams.append_batch(request).await.map_err(|s| format!("AppendBatch: {s:?}"))?;
        for e in response.into_inner().entries {
            self.pools[p].appended.insert(e.stream_id, e.id);
        }
        Ok(())
    }

    /// The group's state must agree with the ledger of pool `p`.
    async fn check_pool(&mut self, p: usize) -> Vec<String> {
        self.pools[p].check(&mut self.con).await
    }
}

/// What one sequence did and found.
pub(crate) struct Seq {
    index: usize,
    trace: Vec<String>,
    problems: Vec<String>,
    /// The pool whose ledger must be checked afterwards.
    touched: Option<usize>,
}

impl Seq {
    fn log(&mut self, line: String) {
        self.trace.push(line);
    }

    pub(crate) fn problem(&mut self, what: String) {
        self.problems.push(what);
    }
}

// ---------------------------------------------------------------------------
// Sequences: a bad opening
// ---------------------------------------------------------------------------

async fn bad_opening(world: &mut World, seq: &mut Seq, rng: &mut fastrand::Rng) {
    let (what, message, expected) = opening(rng);
    seq.log(format!("open a call with {what}; expect {expected:?}"));
    world.stat("openings", 1);
    let status = match Call::open(&world.consumer, message).await {
        Err(status) => Some(status),
        Ok(mut call) => match call.confirm().await {
            Ok(_) => {
                call.close_send();
                match call.wait_end().await {
                    Ok((None, errors)) if errors.is_empty() => None,
                    other => {
                        seq.problem(format!("{what}: accepted, but after a half-close the call ended with {other:?}"));
                        return;
                    }
                }
            }
            Err(_) => match &call.ended {
                Some(Some(status)) => Some(status.clone()),
                other => {
                    seq.problem(format!("{what}: expected {expected:?}, the call ended with {other:?}"));
                    return;
                }
            },
        },
    };
    if let Some(problem) = judge_opening(&what, expected, status) {
        seq.problem(problem);
    }
}

// ---------------------------------------------------------------------------
// Sequences: a subscribed call
// ---------------------------------------------------------------------------

/// Opens and confirms a call on a pool stream. A subscribe with huge durations
/// may be refused with INVALID_ARGUMENT: it is then made again without them.
/// Returns the call and the subscribe that was accepted.
async fn open_pool_call(
    world: &mut World,
    seq: &mut Seq,
    mut subscribe: Subscribe,
) -> Result<(Call, Subscribe), String> {
    loop {
        seq.log(format!("subscribe to {} with {subscribe:?}", subscribe.stream));
        world.stat("subscribed calls", 1);
        let refusal = match Call::open(&world.consumer, req(Kind::Subscribe(subscribe.clone()))).await {
            Err(status) => status,
            Ok(mut call) => match call.confirm().await {
                Ok(s) => {
                    let want =
                        if subscribe.max_in_flight == 0 { DEFAULT_MAX_IN_FLIGHT } else { subscribe.max_in_flight };
                    if s.stream != subscribe.stream
                        || s.group != GROUP
                        || s.consumer != "fuzz"
                        || s.max_in_flight != want
                    {
                        seq.problem(format!("Subscribed {s:?} does not match the subscribe (max_in_flight {want})"));
                    }
                    return Ok((call, subscribe));
                }
                Err(e) => match call.ended.clone().flatten() {
                    Some(status) => status,
                    None => return Err(format!("a valid subscribe: {e}")),
                },
            },
        };
        let huge = subscribe.ack_deadline.is_some()
            || subscribe.retry_backoff_initial.is_some()
            || subscribe.retry_backoff_max.is_some();
        if !huge || refusal.code() != Code::InvalidArgument {
            return Err(format!("a valid subscribe was refused: {refusal:?}"));
        }
        world.stat("huge durations refused", 1);
        subscribe.ack_deadline = None;
        subscribe.retry_backoff_initial = None;
        subscribe.retry_backoff_max = None;
    }
}

/// Runs one step (messages + fence) and checks its verdict errors.
#[allow(clippy::too_many_arguments)]
async fn step(
    world: &mut World,
    seq: &mut Seq,
    call: &mut Call,
    p: usize,
    what: String,
    messages: Vec<ConsumeRequest>,
    expects: Vec<Expect>,
    effects: Vec<Effect>,
) -> bool {
    let fence = world.fence();
    let started = Instant::now();
    seq.log(what.clone());
    world.stat("verdict messages", messages.len() as u64);
    world.stat("verdict errors expected", expects.len() as u64);
    let result = call.exchange(messages, &fence).await;
    let pool = &mut world.pools[p];
    let going_on = match result {
        Ok(errors) => {
            let (problems, met) = reconcile(&expects, &errors);
            for problem in problems {
                seq.problem(format!("{what}: {problem}"));
            }
            apply(effects, &met, call, pool, seq);
            true
        }
        Err((errors, why)) => {
            seq.problem(format!(
                "{what}: {why} (errors before: {:?})",
                errors.iter().map(describe_error).collect::<Vec<_>>()
            ));
            // The verdicts before the break may have been applied, or not.
            for effect in effects {
                let id = match effect {
                    Effect::Released(id) => {
                        call.held.remove(&id);
                        continue;
                    }
                    Effect::Acked(id)
                    | Effect::Failed(id)
                    | Effect::DeadLettered(id)
                    | Effect::MaybeSettled { id, .. } => id,
                };
                if let Some(stream_id) = call.held.remove(&id) {
                    pool.uncertain.insert(stream_id);
                }
            }
            false
        }
    };
    pool.absorb(call, seq);
    world.stat("ms in verdict steps", started.elapsed().as_millis() as u64);
    going_on
}

async fn subscribed_call(world: &mut World, seq: &mut Seq, rng: &mut fastrand::Rng) {
    let p = if rng.u32(..6) == 0 { POOL } else { rng.usize(..POOL) };
    seq.touched = Some(p);
    if world.pools[p].available() < 12 || p == POOL {
        if let Err(e) = world.supply(p, 16, rng).await {
            seq.problem(e);
            return;
        }
    }
    let subscribe = pool_subscribe(&world.pools[p].name, p == POOL, rng);
    let (mut call, subscribe) = match open_pool_call(world, seq, subscribe).await {
        Ok(opened) => opened,
        Err(e) => return seq.problem(e),
    };
    world.pools[p].subscribed = true;
    let deadline = subscribe.ack_deadline.is_some_and(|d| d.seconds > 0 || d.nanos > 0);
    let credit = if subscribe.max_in_flight == 0 { DEFAULT_MAX_IN_FLIGHT } else { subscribe.max_in_flight } as usize;

    let steps = rng.usize(2..12);
    for _ in 0..steps {
        // Wait for a delivery when the call holds nothing, or sometimes when it has room for more.
        let room = !call.drained && call.held.len() < credit;
        if room && (call.held.is_empty() || rng.u32(..4) == 0) {
            seq.log("wait for a delivery".to_owned());
            let waiting = Instant::now();
            let waited = call.wait_delivery(Duration::from_millis(300)).await;
            world.stat("ms waiting for deliveries", waiting.elapsed().as_millis() as u64);
            if let Err(e) = waited {
                seq.problem(format!("waiting for a delivery: {e}"));
                return;
            }
            world.pools[p].absorb(&mut call, seq);
        }
        let mut avail: Vec<String> = call.held.keys().cloned().collect();
        let mut gone: Vec<String> = world.pools[p].settled_ids();
        let mut expects = Vec::new();
        let mut effects = Vec::new();
        let ok = match rng.u32(..100) {
            0..=69 => {
                let (what, message) = verdict(rng, deadline, &mut avail, &mut gone, &mut expects, &mut effects);
                step(world, seq, &mut call, p, what, vec![message], expects, effects).await
            }
            70..=84 => {
                let n = [20, 50, 100, 300][rng.usize(..4)];
                let messages: Vec<ConsumeRequest> = (0..n)
                    .map(|_| verdict(rng, deadline, &mut avail, &mut gone, &mut expects, &mut effects).1)
                    .collect();
                let what = format!("a burst of {n} verdicts ({} errors expected)", expects.len());
                step(world, seq, &mut call, p, what, messages, expects, effects).await
            }
            85..=91 => cross_call(world, seq, &mut call, p, rng).await,
            92..=95 => {
                // The group's policy is set by its first call; another call on this
                // sidecar asking for a different one is refused, and this call goes on.
                // Plain durations: their validation comes before the group's policy check.
                let mut other = sub(&world.pools[p].name, GROUP);
                other.max_deliveries = 7;
                seq.log("a second call asks for another max_deliveries while this one is live".to_owned());
                let status = match Call::open(&world.consumer, req(Kind::Subscribe(other))).await {
                    Err(status) => Some(status),
                    Ok(mut c) => {
                        let confirmed = c.confirm().await;
                        world.pools[p].absorb(&mut c, seq);
                        if confirmed.is_ok() {
                            seq.problem("a conflicting group policy was accepted".to_owned());
                        }
                        c.ended.clone().flatten()
                    }
                };
                if status.as_ref().map(Status::code) != Some(Code::FailedPrecondition) {
                    seq.problem(format!("a conflicting group policy: expected FailedPrecondition, got {status:?}"));
                }
                true
            }
            _ => {
                // Entries keep arriving while the call is open.
                seq.log("append 3 entries".to_owned());
                if let Err(e) = world.supply(p, 3, rng).await {
                    seq.problem(e);
                }
                true
            }
        };
        if !ok {
            return;
        }
    }
    end_call(world, seq, call, p, rng).await;
}

/// Another call on the same group: neither call can settle or extend the
/// other's deliveries.
async fn cross_call(world: &mut World, seq: &mut Seq, call: &mut Call, p: usize, rng: &mut fastrand::Rng) -> bool {
    // This call stops taking entries, so the new ones go to the other call.
    if !step(
        world,
        seq,
        call,
        p,
        "Drain (before a second call)".to_owned(),
        vec![req(Kind::Drain(Drain {}))],
        vec![],
        vec![],
    )
    .await
    {
        return false;
    }
    let mut s = pool_subscribe(&world.pools[p].name, p == POOL, rng);
    s.max_in_flight = 2;
    seq.log("open a second call on the same group".to_owned());
    let mut other = match open_pool_call(world, seq, s).await {
        Ok((c, _)) => c,
        Err(e) => {
            seq.problem(format!("the second call: {e}"));
            return false;
        }
    };
    if let Err(e) = world.supply(p, 3, rng).await {
        seq.problem(e);
    }
    let got = other.wait_delivery(ANSWER).await;
    world.pools[p].absorb(&mut other, seq);
    match got {
        Ok(true) => {}
        Ok(false) => seq
            .problem("the second call got no delivery within 2 s (3 fresh entries, the first call drained)".to_owned()),
        Err(e) => {
            seq.problem(format!("the second call: {e}"));
            return false;
        }
    }
    let theirs: Vec<String> = other.held.keys().cloned().collect();
    let mine: Vec<String> = call.held.keys().cloned().collect();
    if !theirs.is_empty() {
        let mut expects: Vec<Expect> = theirs.iter().map(|id| Expect::new(id, UNKNOWN)).collect();
        let mut messages = vec![req(Kind::Ack(Ack { ids: theirs.clone() }))];
        messages.push(req(Kind::Fail(Fail { id: theirs[0].clone(), dead_letter: rng.bool(), ..Default::default() })));
        expects.push(Expect::new(&theirs[0], UNKNOWN));
        messages.push(req(Kind::Extend(Extend { ids: theirs.clone(), by: Some(dur(1, 0)) })));
        expects.extend(theirs.iter().map(|id| Expect::new(id, UNKNOWN)));
        let what = format!("the first call acks, fails and extends the second call's {theirs:?}");
        if !step(world, seq, call, p, what, messages, expects, vec![]).await {
            return false;
        }
    }
    if !mine.is_empty() {
        let expects = mine.iter().map(|id| Expect::new(id, UNKNOWN)).collect();
        let what = format!("the second call acks the first call's {mine:?}");
        if !step(world, seq, &mut other, p, what, vec![req(Kind::Ack(Ack { ids: mine }))], expects, vec![]).await {
            return false;
        }
    }
    if !theirs.is_empty() && rng.bool() {
        let effects = theirs.iter().map(|id| Effect::Acked(id.clone())).collect();
        let what = format!("the second call acks its own {theirs:?}");
        if !step(world, seq, &mut other, p, what, vec![req(Kind::Ack(Ack { ids: theirs }))], vec![], effects).await {
            return false;
        }
    }
    seq.log("the second call closes".to_owned());
    other.close_send();
    match other.wait_end().await {
        Ok((None, errors)) if errors.is_empty() => {}
        other_end => seq.problem(format!("the second call's half-close: {other_end:?}")),
    }
    world.pools[p].absorb(&mut other, seq);
    true
}

/// Ends the call one of several ways and checks how it ends.
async fn end_call(world: &mut World, seq: &mut Seq, mut call: Call, p: usize, rng: &mut fastrand::Rng) {
    let (what, message, expected): (&str, Option<ConsumeRequest>, Option<Code>) = match rng.u32(..100) {
        0..=29 => ("half-close", None, None),
        30..=49 => {
            seq.log("drop the call".to_owned());
            world.stat("dropped calls", 1);
            drop(call);
            return;
        }
        50..=64 => {
            let mut s = sub(&world.pools[p].name, GROUP);
            if rng.bool() {
                s.stream = String::new();
            }
            ("a second subscribe", Some(req(Kind::Subscribe(s))), Some(Code::InvalidArgument))
        }
        65..=79 => ("a message without a kind", Some(ConsumeRequest { kind: None }), Some(Code::InvalidArgument)),
        80..=84 => {
            let id = call.held.keys().next().cloned().unwrap_or_else(|| unknown_id(rng));
            let fail = Fail { id, reason: "x".repeat(OVERSIZED), ..Default::default() };
            ("an oversized Fail (5 MB reason)", Some(req(Kind::Fail(fail))), Some(Code::ResourceExhausted))
        }
        _ => {
            // Acks, then a half-close at once, no fence: an OK end means they are applied.
            let ids: Vec<String> = call.held.keys().cloned().collect();
            seq.log(format!("ack {ids:?} and half-close at once"));
            call.send_now(req(Kind::Ack(Ack { ids: ids.clone() })));
            call.close_send();
            match call.wait_end().await {
                Ok((status, errors)) => {
                    let (problems, _) = reconcile(&[], &errors);
                    for problem in problems {
                        seq.problem(format!("ack then half-close: {problem}"));
                    }
                    if status.is_some() {
                        seq.problem(format!("ack then half-close: the call ended with {status:?}"));
                    }
                    for id in ids {
                        if let Some(stream_id) = call.held.remove(&id) {
                            let pool = &mut world.pools[p];
                            if status.is_some() || errors.iter().any(|e| e.id == id) {
                                pool.uncertain.insert(stream_id);
                            } else {
                                pool.acked.insert(stream_id);
                            }
                        }
                    }
                }
                Err(e) => seq.problem(format!("ack then half-close: {e}")),
            }
            world.pools[p].absorb(&mut call, seq);
            return;
        }
    };
    seq.log(format!("end with {what}; expect {expected:?}"));
    match message {
        Some(message) => call.send_now(message),
        None => call.close_send(),
    }
    world.stat("call ends checked", 1);
    match call.wait_end().await {
        Ok((status, errors)) => {
            for problem in judge_end(what, expected, status, &errors) {
                seq.problem(problem);
            }
        }
        Err(e) => seq.problem(format!("{what}: {e}")),
    }
    world.pools[p].absorb(&mut call, seq);
}

// ---------------------------------------------------------------------------
// Sequences: Append
// ---------------------------------------------------------------------------

async fn bad_append(world: &mut World, seq: &mut Seq, rng: &mut fastrand::Rng) {
    let target = APPEND_TARGET;
    let before = xlen(&mut world.con, target).await;
    let (what, call, code) = match append_case(rng) {
        AppendCase::Refused { what, call, code } => (what, call, code),
        AppendCase::Accepted { stream, fields: f } => {
            seq.log(format!("Append to {stream:?} with unicode names and binary values"));
            world.stat("appends", 1);
            let request =
                echomq::proto::AppendRequest { stream: stream.to_owned(), fields: f.clone(), ..Default::default() };
            match world.streams.append(request).await {
                Ok(response) => {
                    let r = response.into_inner();
                    if !is_branded(&r.id) || r.id != branded_from_stream_id(&r.stream_id) {
                        seq.problem(format!("Append answered {r:?}"));
                    }
                    let stored = xrange(&mut world.con, stream).await;
                    match stored.iter().find(|e| e.stream_id == r.stream_id) {
                        Some(entry) => {
                            for (k, v) in &f {
                                if entry.field(k) != Some(v.as_slice()) {
                                    seq.problem(format!("field {k:?} was stored as {:?}", entry.field(k)));
                                }
                            }
                            if entry.field("id") != Some(r.id.as_bytes()) {
                                seq.problem(format!("the reserved field is {:?}, not {}", entry.field("id"), r.id));
                            }
                        }
                        None => seq.problem(format!("the appended entry {} is not in {stream:?}", r.stream_id)),
                    }
                }
                Err(status) => seq.problem(format!("a valid Append was refused: {status:?}")),
            }
            return;
        }
    };
    let result = match call {
        AppendCall::One(request) => world.streams.append(request).await.map(drop),
        AppendCall::Batch(request) => world.streams.append_batch(request).await.map(drop),
    };
    seq.log(format!("{what}; expect {:?}", Some(code)));
    world.stat("appends", 1);
    if let Some(problem) = judge_refused_append(what, code, result) {
        seq.problem(problem);
    }
    let after = xlen(&mut world.con, target).await;
    if after != before {
        seq.problem(format!("{what}: {target} went from {before} to {after} entries; a refused append writes nothing"));
    }
    let schedule = format!("{target}:scheduled");
    let scheduled: u64 = redis::cmd("ZCARD").arg(&schedule).query_async(&mut world.con).await.unwrap();
    if scheduled != 0 {
        seq.problem(format!("{what}: {schedule} holds {scheduled} entries; a refused append schedules nothing"));
    }
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_and_append_survive_bad_input() {
    let seed: u64 = match std::env::var("ECHOMQ_FUZZ_SEED") {
        Ok(text) => text.trim().parse().expect("ECHOMQ_FUZZ_SEED is a u64"),
        Err(_) => fastrand::u64(..),
    };
    let sequences: usize =
        std::env::var("ECHOMQ_FUZZ_SEQUENCES").map_or(400, |t| t.trim().parse().expect("ECHOMQ_FUZZ_SEQUENCES"));
    println!("bad_input: seed {seed} (ECHOMQ_FUZZ_SEED={seed} repeats these sequences), {sequences} sequences");
    let started = Instant::now();

    let redis = RedisServer::start().await;
    // Short retry delays: failed and returned entries come back within a sequence.
    let options = SidecarOptions::named("fuzz").backoff(20).arg("--retry-backoff-max-ms").arg("200");
    let sidecar = Sidecar::start(&redis, options).await;
    let channel = sidecar.channel().await;
    let mut con = redis.conn().await;
    let _: () = redis::cmd("SET").arg("fz-string").arg("x").query_async(&mut con).await.unwrap();
    let _: i64 = redis::cmd("HSET").arg("fz-hash").arg("f").arg("v").query_async(&mut con).await.unwrap();
    let _: i64 = redis::cmd("RPUSH").arg("fz-list").arg("a").query_async(&mut con).await.unwrap();
    let mut world = World {
        // Verdict errors echo 10 KB ids; nothing the sidecar sends comes near 16 MB.
        consumer: ConsumerServiceClient::new(channel.clone()).max_decoding_message_size(16 << 20),
        streams: StreamServiceClient::new(channel),
        con,
        pools: (0..=POOL).map(|i| Pool { name: format!("fz-{i}"), ..Pool::default() }).collect(),
        fences: 0,
        stats: BTreeMap::new(),
    };

    let mut rng = fastrand::Rng::with_seed(seed);
    let mut log_offset = 0;
    let mut all_panics = Vec::new();
    let mut failures: Vec<(usize, Vec<String>, Vec<String>)> = Vec::new();
    for index in 0..sequences {
        let mut seq = Seq { index, trace: Vec::new(), problems: Vec::new(), touched: None };
        let mut seq_rng = fastrand::Rng::with_seed(rng.u64(..));
        let sequence_started = Instant::now();
        let kind = match seq_rng.u32(..100) {
            0..=29 => {
                bad_opening(&mut world, &mut seq, &mut seq_rng).await;
                "ms in openings"
            }
            30..=84 => {
                subscribed_call(&mut world, &mut seq, &mut seq_rng).await;
                "ms in subscribed calls"
            }
            _ => {
                bad_append(&mut world, &mut seq, &mut seq_rng).await;
                "ms in appends"
            }
        };
        world.stat(kind, sequence_started.elapsed().as_millis() as u64);
        let checks_started = Instant::now();
        // Alive, and not by luck: no task of it panicked.
        let alive = sidecar.livez().await == Some(200);
        if !alive {
            seq.problem("the sidecar is not alive (/livez did not answer 200)".to_owned());
        }
        let (fresh_log, end) = sidecar.log_from(log_offset);
        log_offset = end;
        let new_panics = panics(&fresh_log);
        all_panics.extend(new_panics.iter().cloned());
        for panic in &new_panics {
            seq.problem(format!("the sidecar panicked: {panic}"));
        }
        if let Some(p) = seq.touched {
            let problems = world.check_pool(p).await;
            if problems.iter().any(|p| p.contains("is not pending, but")) {
                let pool = &world.pools[p].name;
                let log = sidecar.log();
                let lines: Vec<&str> = log.lines().filter(|l| l.contains(&format!("stream={pool} "))).collect();
                eprintln!("bad_input: sidecar log lines of {pool}:\n{}", lines.join("\n"));
            }
            seq.problems.extend(problems);
            if !new_panics.is_empty() {
                // A panicked task may have left this group's worker or a call
                // half-dead: later sequences get a fresh stream.
                world.pools[p] = Pool { name: format!("fz-{p}-after-panic-{index}"), ..Pool::default() };
            }
        }
        world.stat("ms in checks", checks_started.elapsed().as_millis() as u64);
        if !seq.problems.is_empty() {
            eprintln!(
                "bad_input: sequence {index} found problems:\n  trace: {:#?}\n  problems: {:#?}",
                seq.trace, seq.problems
            );
            failures.push((seq.index, seq.trace, seq.problems));
        }
        if !alive {
            break;
        }
    }
    println!(
        "bad_input: {} sequences in {:.1}s, {} with problems; {:?}",
        sequences,
        started.elapsed().as_secs_f64(),
        failures.len(),
        world.stats
    );
    let mut distinct_panics: BTreeMap<String, usize> = BTreeMap::new();
    for panic in all_panics {
        *distinct_panics.entry(panic).or_default() += 1;
    }
    for (panic, n) in &distinct_panics {
        eprintln!("bad_input: the sidecar panicked {n}x: {panic}");
    }
    // One line per distinct problem (ids and numbers vary between sequences).
    let mut distinct: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (index, _, problems) in &failures {
        for problem in problems {
            let key: String = problem.chars().take(90).collect();
            distinct.entry(key).or_insert((*index, 0)).1 += 1;
        }
    }
    let summary: Vec<String> =
        distinct.iter().map(|(p, (first, n))| format!("{n}x (first in sequence {first}): {p}")).collect();
    assert!(
        failures.is_empty(),
        "bad input found {} failing sequences (seed {seed}):\n{}",
        failures.len(),
        summary.join("\n")
    );
}

// ---------------------------------------------------------------------------
// The ledger check itself
// ---------------------------------------------------------------------------

/// A pool of `n` entries appended to `name` behind the sidecar (a group `g`
/// created from the start), as the ledger records Append's answers.
async fn bare_pool(con: &mut MultiplexedConnection, name: &str, n: usize) -> (Pool, Vec<String>) {
    create_group(con, name, GROUP, "0").await;
    let mut pool = Pool { name: name.to_owned(), subscribed: true, ..Pool::default() };
    let mut ids = Vec::new();
    for i in 0..n {
        let sid = xadd_raw(con, name, &[(b"n", i.to_string().as_bytes())]).await;
        pool.appended.insert(sid.clone(), branded_from_stream_id(&sid));
        ids.push(sid);
    }
    (pool, ids)
}

/// Reads up to `count` new entries for the group as consumer `fuzz` (into the PEL, acked by nobody).
async fn read_new(con: &mut MultiplexedConnection, stream: &str, count: usize) -> redis::Value {
    redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("fuzz")
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(con)
        .await
        .expect("XREADGROUP")
}

/// The check catches a lost entry: one the group read and that left the PEL
/// without an Ack from the test (here XACKed behind its back, as a sidecar
/// bug would) is reported, and nothing else is.
#[tokio::test]
async fn the_ledger_check_reports_an_entry_that_left_the_pel_without_the_tests_ack() {
    let redis = RedisServer::start().await;
    let mut con = redis.conn().await;
    let (mut pool, ids) = bare_pool(&mut con, "fz-lost", 4).await;
    read_new(&mut con, "fz-lost", 3).await;
    assert_eq!(pool.check(&mut con).await, Vec::<String>::new(), "read and pending, or not read: accounted for");

    let _: i64 = redis::cmd("XACK").arg("fz-lost").arg(GROUP).arg(&ids[1]).query_async(&mut con).await.unwrap();
    let problems = pool.check(&mut con).await;
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0].contains(&format!("entry {} was read by the group and is not pending", ids[1])),
        "{problems:#?}"
    );

    pool.acked.insert(ids[1].clone());
    assert_eq!(pool.check(&mut con).await, Vec::<String>::new(), "acked by the test: accounted for");
}

/// The check reads the PEL and the group's read position as of one instant.
/// A call of an earlier step can still be attached and read more while the
/// check runs (a dropped call until the sidecar sees it go); read apart, a
/// read between the two made its entries look read and not pending, a loss
/// that was none. Here a reader reads one entry at a time, and acks none,
/// all through the checks: none may report a thing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_check_is_not_fooled_by_a_read_while_it_runs() {
    const ENTRIES: usize = 3000;
    const CHECKS: usize = 40;
    let redis = RedisServer::start().await;
    let mut con = redis.conn().await;
    let (pool, _) = bare_pool(&mut con, "fz-busy", ENTRIES).await;
    let mut reader_con = redis.conn().await;
    let reader = tokio::spawn(async move {
        let mut reads = 0;
        while !matches!(read_new(&mut reader_con, "fz-busy", 1).await, redis::Value::Nil) {
            reads += 1;
        }
        reads
    });
    // Checks while the reader reads (it may run out of entries first on a fast machine).
    let mut checks = 0;
    while checks < CHECKS && !reader.is_finished() {
        let problems = pool.check(&mut con).await;
        assert_eq!(problems, Vec::<String>::new(), "check {checks}, while a reader reads");
        checks += 1;
    }
    assert_eq!(reader.await.unwrap(), ENTRIES);
    assert!(checks >= 10, "only {checks} checks ran while the reader read");
    assert_eq!(pool.check(&mut con).await, Vec::<String>::new());
}

// ---------------------------------------------------------------------------
// Messages that cannot be decoded: a string field that is not UTF-8
// ---------------------------------------------------------------------------

/// Sends request messages as raw bytes, encoded by hand, so a test can put what
/// no generated client would into a field (bytes that are not UTF-8 into a
/// `string`); decodes the replies as `R`.
struct RawCodec<R>(std::marker::PhantomData<R>);

impl<R> Default for RawCodec<R> {
    fn default() -> Self {
        RawCodec(std::marker::PhantomData)
    }
}

struct RawEncoder;
struct ReplyDecoder<R>(std::marker::PhantomData<R>);

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl<R: prost::Message + Default> tonic::codec::Decoder for ReplyDecoder<R> {
    type Item = R;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<R>, tonic::Status> {
        R::decode(src).map(Some).map_err(|e| tonic::Status::data_loss(format!("the test cannot decode a reply: {e}")))
    }
}

impl<R: prost::Message + Default + Send + 'static> tonic::codec::Codec for RawCodec<R> {
    type Encode = Vec<u8>;
    type Decode = R;
    type Encoder = RawEncoder;
    type Decoder = ReplyDecoder<R>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> ReplyDecoder<R> {
        ReplyDecoder(std::marker::PhantomData)
    }
}

/// Field 1 of a message, length-delimited (wire type 2), holding `value`:
/// tag `0x0a`, the length, the bytes. Field 1 is a `string` in the messages
/// used here (`AppendRequest.stream`, `Subscribe.stream`, `Ack.ids`).
fn field_1(value: &[u8]) -> Vec<u8> {
    length_delimited(1, value)
}

fn length_delimited(field: u8, value: &[u8]) -> Vec<u8> {
    assert!(field < 16 && value.len() < 128, "one-byte tag and length");
    let mut out = vec![(field << 3) | 2, value.len() as u8];
    out.extend_from_slice(value);
    out
}

/// Bytes that are not UTF-8 (a lone continuation byte, then 0xff).
const NOT_UTF8: &[u8] = &[0x80, 0xff];

#[track_caller]
fn assert_refused_as_not_utf8(status: &tonic::Status, field: &str) {
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains(field) && status.message().contains("not UTF-8"),
        "the message names the field and what is wrong with it: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_field_that_is_not_utf8_is_invalid_argument_in_a_unary_call() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut grpc = tonic::client::Grpc::new(sidecar.channel().await);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/echomq.v1.StreamService/Append");
    let status = grpc
        .unary::<_, echomq::proto::AppendResponse, _>(tonic::Request::new(field_1(NOT_UTF8)), path, RawCodec::default())
        .await
        .unwrap_err();
    assert_refused_as_not_utf8(&status, "AppendRequest.stream");
    assert!(!sidecar.log().contains("panicked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_field_that_is_not_utf8_is_invalid_argument_in_a_consume_call() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let path = || tonic::codegen::http::uri::PathAndQuery::from_static("/echomq.v1.ConsumerService/Consume");

    // In the subscribe: the call is refused.
    let mut grpc = tonic::client::Grpc::new(sidecar.channel().await);
    grpc.ready().await.unwrap();
    let bad_subscribe = length_delimited(1, &field_1(NOT_UTF8));
    let status = grpc
        .streaming::<_, _, echomq::proto::ConsumeResponse, _>(
            tonic::Request::new(tokio_stream::iter(vec![bad_subscribe])),
            path(),
            RawCodec::default(),
        )
        .await
        .unwrap_err();
    assert_refused_as_not_utf8(&status, "Subscribe.stream");

    // In a later message (an Ack's id): the call ends with it.
    let subscribe =
        prost::Message::encode_to_vec(&req(Kind::Subscribe(subscribe_msg("s", "g", echomq::proto::GroupStart::New))));
    let bad_ack = length_delimited(2, &field_1(NOT_UTF8));
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    tx.send(subscribe).await.unwrap();
    let mut grpc = tonic::client::Grpc::new(sidecar.channel().await);
    grpc.ready().await.unwrap();
    let mut replies = grpc
        .streaming::<_, _, echomq::proto::ConsumeResponse, _>(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            path(),
            RawCodec::default(),
        )
        .await
        .expect("the subscribe is taken")
        .into_inner();
    let first = tokio::time::timeout(EVENT_TIMEOUT, replies.message()).await.unwrap().unwrap();
    assert!(first.is_some(), "subscribed");
    tx.send(bad_ack).await.unwrap();
    let end = loop {
        match tokio::time::timeout(EVENT_TIMEOUT, replies.message()).await.expect("the call ends") {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the call ended OK"),
            Err(status) => break status,
        }
    };
    assert_refused_as_not_utf8(&end, "Ack.ids");
    assert!(!sidecar.log().contains("panicked"));
}
