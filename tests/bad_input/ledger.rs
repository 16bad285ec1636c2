//! The ledger: the test's own account of each pool stream (what it appended,
//! what was delivered to it, what it acknowledged or dead-lettered, what it
//! cannot know), kept up to date from the deliveries and the effects of the
//! verdicts, and checked against the group's state in Redis.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use super::call::Call;
use super::support::{is_branded, parse_stream_id, pel_and_last_delivered, xrange};
use super::{Seq, ANSWER, GROUP, MAX_REASON_BYTES};

/// One pool stream's ledger.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    /// The pool's stream.
    pub(crate) name: String,
    /// Subscribed at least once: the group exists.
    pub(crate) subscribed: bool,
    /// Appended entries: stream id → branded id.
    pub(crate) appended: BTreeMap<String, String>,
    /// Stream ids the test acknowledged with a valid Ack of an id its call held.
    pub(crate) acked: BTreeSet<String>,
    /// Stream ids the test dead-lettered with a valid Fail.
    pub(crate) dead: BTreeSet<String>,
    /// Stream ids delivered to the test at least once.
    pub(crate) delivered: BTreeSet<String>,
    /// Stream ids whose fate the test cannot know: settled by a step that
    /// broke before its fence (acked or not, dead-lettered or not).
    pub(crate) uncertain: BTreeSet<String>,
}

impl Pool {
    /// Branded ids that no call can hold again (acked or dead-lettered).
    pub(crate) fn settled_ids(&self) -> Vec<String> {
        self.acked.iter().chain(&self.dead).filter_map(|s| self.appended.get(s).cloned()).collect()
    }

    /// How many appended entries are not settled yet.
    pub(crate) fn available(&self) -> usize {
        self.appended.len().saturating_sub(self.acked.len() + self.dead.len())
    }

    /// What is wrong with the group's state (on `con`), by this ledger: what
    /// the test settled has left the PEL, everything else the group read is
    /// still pending, and the dead-letter stream holds exactly what the test
    /// dead-lettered (each once, its reason cut to size).
    pub(crate) async fn check(&self, con: &mut MultiplexedConnection) -> Vec<String> {
        let pool = self;
        if !pool.subscribed {
            return Vec::new();
        }
        let mut problems = Vec::new();
        let settled: BTreeSet<&String> = pool.acked.iter().chain(&pool.dead).collect();
        let uncertain = &pool.uncertain;
        // The PEL and how far the group has read, both as of one instant
        // (one MULTI): the sidecar may still read for this pool while the
        // check runs (a dropped call stays attached until the sidecar sees it
        // go, and a read it asked for still reaches Redis). Read one after the
        // other, such a read in between made the entries it took look read and
        // not pending, a loss that was none.
        // What the test settled leaves the PEL (the XACK may still be on its way).
        let deadline = Instant::now() + ANSWER;
        let (pel, last) = loop {
            let (pending, last) = pel_and_last_delivered(con, &pool.name, GROUP).await;
            let pel: BTreeSet<String> = pending.into_iter().map(|p| p.stream_id).collect();
            let lingering: Vec<&String> =
                settled.iter().copied().filter(|s| pel.contains(*s) && !uncertain.contains(*s)).collect();
            if lingering.is_empty() {
                break (pel, last);
            }
            if Instant::now() >= deadline {
                problems.push(format!("{}: acked or dead-lettered entries still pending: {lingering:?}", pool.name));
                break (pel, last);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Everything else the group has read is still pending: nobody acknowledged it.
        let last = parse_stream_id(&last);
        let unaccounted: Vec<&String> = pool
            .appended
            .keys()
            .filter(|sid| parse_stream_id(sid) <= last && !settled.contains(sid) && !pel.contains(*sid))
            .filter(|sid| !uncertain.contains(*sid))
            .collect();
        if !unaccounted.is_empty() {
            // Forensics: is it still in the stream, in the retry hash?
            let in_stream: BTreeSet<String> = xrange(con, &pool.name).await.into_iter().map(|e| e.stream_id).collect();
            let retries: BTreeMap<String, String> = redis::cmd("HGETALL")
                .arg(format!("{}:retries:{GROUP}", pool.name))
                .query_async(con)
                .await
                .unwrap_or_default();
            for sid in unaccounted {
                problems.push(format!(
                    "{}: entry {sid} was read by the group and is not pending, but the test never acked nor dead-lettered it \
                     (delivered to the test: {}; still in the stream: {}; retry state: {:?})",
                    pool.name,
                    pool.delivered.contains(sid),
                    in_stream.contains(sid),
                    retries.get(sid)
                ));
            }
        }
        for sid in &pel {
            if !pool.appended.contains_key(sid) {
                problems.push(format!("{}: pending entry {sid} was never appended", pool.name));
            }
        }
        // The dead-letter stream holds exactly what the test dead-lettered.
        let dead_letters = xrange(con, &format!("{}:dlq", pool.name)).await;
        let mut in_dlq = BTreeSet::new();
        for entry in &dead_letters {
            let branded = entry.field("id").map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
            if !in_dlq.insert(branded.clone()) {
                problems.push(format!("{}: {branded} dead-lettered twice", pool.name));
            }
            if let Some(reason) = entry.field("echomq.reason") {
                if reason.len() > MAX_REASON_BYTES || std::str::from_utf8(reason).is_err() {
                    problems.push(format!(
                        "{}: dead letter {} keeps a reason of {} bytes (at most {MAX_REASON_BYTES}, valid UTF-8)",
                        pool.name,
                        entry.stream_id,
                        reason.len()
                    ));
                }
            }
        }
        let expected: BTreeSet<String> = pool.dead.iter().filter_map(|s| pool.appended.get(s).cloned()).collect();
        let maybe: BTreeSet<String> = uncertain.iter().filter_map(|s| pool.appended.get(s).cloned()).collect();
        let in_dlq: BTreeSet<String> =
            in_dlq.into_iter().filter(|b| expected.contains(b) || !maybe.contains(b)).collect();
        if in_dlq != expected {
            problems.push(format!(
                "{}: the dead-letter stream holds {:?}, the test dead-lettered {:?}",
                pool.name,
                in_dlq.difference(&expected).collect::<Vec<_>>(),
                expected.difference(&in_dlq).collect::<Vec<_>>()
            ));
        }
        problems
    }

    /// Takes a call's fresh deliveries into the pool's ledger, checking each.
    pub(crate) fn absorb(&mut self, call: &mut Call, seq: &mut Seq) {
        let pool = self;
        for odd in call.oddities.drain(..) {
            seq.problem(odd);
        }
        for d in call.fresh.drain(..) {
            let mut wrong = Vec::new();
            if call.held.insert(d.id.clone(), d.stream_id.clone()).is_some() {
                wrong.push("delivered to the call that already held it");
            }
            if d.stream != pool.name || d.group != GROUP {
                wrong.push("stream/group");
            }
            if !is_branded(&d.id) || pool.appended.get(&d.stream_id) != Some(&d.id) {
                wrong.push("id (not the one Append returned)");
            }
            if d.attempts == 0 {
                wrong.push("attempts 0");
            }
            if d.payload.contains_key("id") {
                wrong.push("the reserved field in the payload");
            }
            if (pool.acked.contains(&d.stream_id) || pool.dead.contains(&d.stream_id))
                && !pool.uncertain.contains(&d.stream_id)
            {
                wrong.push("delivered again after the test acked or dead-lettered it");
            }
            if !wrong.is_empty() {
                seq.problem(format!(
                    "bad delivery ({}): {} {} attempts {}",
                    wrong.join(", "),
                    d.id,
                    d.stream_id,
                    d.attempts
                ));
            }
            pool.delivered.insert(d.stream_id.clone());
        }
    }
}

/// What a verdict did to the model, once its errors are known.
#[derive(Debug)]
pub(crate) enum Effect {
    Acked(String),
    Failed(String),
    DeadLettered(String),
    /// Extended on a subscription with an ack deadline: the new deadline may
    /// pass at any moment (it is counted from now), so the model lets it go.
    Released(String),
    /// A Fail with an odd delay: settled (retried or dead-lettered) unless
    /// refused (expectation `expect` met).
    MaybeSettled {
        id: String,
        expect: usize,
        dead_letter: bool,
    },
}

/// Applies a step's effects to the call and the pool, given which expectations were met.
pub(crate) fn apply(effects: Vec<Effect>, met: &[bool], call: &mut Call, pool: &mut Pool, seq: &mut Seq) {
    for effect in effects {
        let (id, settled_as) = match effect {
            Effect::Acked(id) => (id, Some(true)),
            Effect::DeadLettered(id) => (id, Some(false)),
            Effect::Failed(id) => (id, None),
            Effect::Released(id) => {
                call.held.remove(&id);
                continue;
            }
            Effect::MaybeSettled { id, expect, dead_letter } => {
                if met[expect] {
                    continue; // refused: still held
                }
                (id, dead_letter.then_some(false))
            }
        };
        match call.held.remove(&id) {
            Some(stream_id) => match settled_as {
                Some(true) => {
                    pool.acked.insert(stream_id);
                }
                Some(false) => {
                    pool.dead.insert(stream_id);
                }
                None => {}
            },
            None => seq.problem(format!("model error: {id} settled but not held")),
        }
    }
}
