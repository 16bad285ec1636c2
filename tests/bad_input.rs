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
//! - a subscribed call that sends random verdicts and extensions (ids held,
//!   unknown, already settled, held by another call, malformed: unicode, 10 KB,
//!   uppercase, 27 and 29 characters; 1 MB reasons; negative, zero and huge
//!   durations, `i64::MIN` and `i64::MAX` seconds among them (a huge or
//!   non-normalised one may be taken or refused with INVALID_ARGUMENT, never
//!   choked on); bursts of hundreds of verdicts), then ends in one of several
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
//! holds exactly the entries the test dead-lettered.
//!
//! `ECHOMQ_FUZZ_SEED` reproduces a run's message sequences (the seed is printed;
//! timing still varies), `ECHOMQ_FUZZ_SEQUENCES` sets their number (default 400).

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use echomq::proto::consume_request::Kind;
use echomq::proto::consume_response::Kind as ResponseKind;
use echomq::proto::consumer_service_client::ConsumerServiceClient;
use echomq::proto::stream_service_client::StreamServiceClient;
use echomq::proto::{
    Ack, AppendBatchRequest, AppendRequest, BatchEntry, ConsumeRequest, ConsumeResponse, Delivery, Drain, Extend, Fail,
    GroupStart, Subscribe, VerdictError, VerdictErrorCode,
};
use redis::aio::MultiplexedConnection;
use support::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// The consumer group of every pool stream.
const GROUP: &str = "g";
/// Pool streams with ordinary subscriptions; one more, the last, takes the huge durations.
const POOL: usize = 4;
/// A verdict error echoes at most this many characters of a malformed id.
const ECHO_CHARS: usize = 64;
/// The sidecar's default `max_in_flight`.
const DEFAULT_MAX_IN_FLIGHT: u32 = 64;
/// Kept of a Fail reason (bytes).
const MAX_REASON_BYTES: usize = 4096;
/// Over the sidecar's default `--max-message-bytes` (4 MiB).
const OVERSIZED: usize = 5 * 1024 * 1024;
/// The wait for anything the sidecar must answer.
const ANSWER: Duration = Duration::from_secs(10);

use VerdictErrorCode::{InvalidArgument as INVALID, UnknownId as UNKNOWN};

// ---------------------------------------------------------------------------
// Random material
// ---------------------------------------------------------------------------

fn hex(rng: &mut fastrand::Rng, len: usize) -> String {
    (0..len).map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)])).collect()
}

/// A well-formed branded id no entry has: its milliseconds are ~8,900 years away.
fn unknown_id(rng: &mut fastrand::Rng) -> String {
    if rng.u32(..8) == 0 {
        return "0".repeat(28);
    }
    format!("{:012x}{:016x}", 0xfff0_0000_0000u64 + rng.u64(..0xffff_ffff), rng.u64(..))
}

/// A text that is not a branded id, often derived from `base` (a real one).
fn malformed_id(rng: &mut fastrand::Rng, base: Option<&str>) -> String {
    let b = base.map_or_else(|| hex(rng, 28), str::to_owned);
    match rng.u32(..16) {
        0 => {
            let upper = b.to_uppercase();
            if upper == b {
                format!("{}A", &b[..27])
            } else {
                upper
            }
        }
        1 => b[..27].to_owned(),
        2 => format!("{b}0"),
        3 => format!("{}é", &b[..26]), // 28 bytes, not hex
        4 => "０".repeat(28),          // fullwidth digits
        5 => format!("🚀{}", &b[1..]),
        6 => "a".repeat(10 * 1024),
        7 => b.repeat(10 * 1024 / 28 + 1),
        8 => String::new(),
        9 => format!(" {b}"),
        10 => format!("{b}\n"),
        11 => format!("0x{}", &b[2..]),
        12 => "1718000000000-3".to_owned(),
        13 => format!("{}g", &b[..27]),
        14 => format!("{}\u{0}", &b[..27]),
        _ => format!("\u{202e}{}", &b[..25]), // a right-to-left override
    }
}

fn reason(rng: &mut fastrand::Rng) -> String {
    match rng.u32(..20) {
        _ if rng.u32(..60) == 0 => "x".repeat(1024 * 1024),
        // 1.2 MB of two-byte characters: the cut must land on a boundary.
        _ if rng.u32(..60) == 0 => "é".repeat(600 * 1024),
        0 => "🚀".repeat(2000),
        1 => String::new(),
        2 => "line\nbreak\ttab \u{0} nul".to_owned(),
        _ => format!("fuzz reason {}", rng.u32(..1000)),
    }
}

fn dur(seconds: i64, nanos: i32) -> prost_types::Duration {
    prost_types::Duration { seconds, nanos }
}

fn negative_duration(rng: &mut fastrand::Rng) -> prost_types::Duration {
    let choices = [
        dur(-1, 0),
        dur(0, -1),
        dur(-5, -500_000_000),
        dur(-1, 999_999_999), // normalises to -1 ns
        dur(0, -1_500_000_000),
        dur(i64::MIN, 0),
        dur(i64::MIN, -999_999_999),
    ];
    choices[rng.usize(..choices.len())]
}

/// Not negative, but absurd: from 31 years to the largest Duration there is,
/// or positive with nanos out of range or of the other sign (a protobuf
/// Duration must not have those). The sidecar may take them or refuse them
/// (INVALID_ARGUMENT); it must not choke on them.
fn odd_duration(rng: &mut fastrand::Rng) -> prost_types::Duration {
    let choices = [
        dur(1_000_000_000, 0),
        dur(10_000_000_000_000, 0),
        dur(i64::MAX / 2, 0),
        dur(i64::MAX, 999_999_999),
        dur(i64::MAX, i32::MAX),
        dur(0, 1_500_000_000),
        dur(2, -1_900_000_000),
    ];
    choices[rng.usize(..choices.len())]
}

/// Huge but well-formed: from 31 years to the largest Duration there is.
fn huge_duration(rng: &mut fastrand::Rng) -> prost_types::Duration {
    let choices = [dur(1_000_000_000, 0), dur(10_000_000_000_000, 0), dur(i64::MAX / 2, 0), dur(i64::MAX, 999_999_999)];
    choices[rng.usize(..choices.len())]
}

/// A positive duration a client would plausibly send.
fn small_duration(rng: &mut fastrand::Rng) -> prost_types::Duration {
    let choices = [dur(0, 10_000_000), dur(0, 50_000_000), dur(1, 0), dur(0, 999_999_999)];
    choices[rng.usize(..choices.len())]
}

fn pick<'a, T>(rng: &mut fastrand::Rng, items: &'a [T]) -> Option<&'a T> {
    (!items.is_empty()).then(|| &items[rng.usize(..items.len())])
}

// ---------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------

/// A verdict error a step deserves.
#[derive(Debug, Clone)]
struct Expect {
    /// The id as sent; the error may echo its first 64 characters only.
    text: String,
    codes: Vec<VerdictErrorCode>,
    /// May or may not come (a huge delay the sidecar may refuse).
    optional: bool,
}

impl Expect {
    fn new(text: &str, code: VerdictErrorCode) -> Expect {
        Expect { text: text.to_owned(), codes: vec![code], optional: false }
    }

    fn matches(&self, error: &VerdictError) -> bool {
        let echoed = error.id == self.text
            || (self.text.chars().count() > ECHO_CHARS
                && error.id == self.text.chars().take(ECHO_CHARS).collect::<String>());
        echoed && self.codes.iter().any(|c| *c as i32 == error.code)
    }
}

fn short(text: &str) -> String {
    if text.chars().count() > 40 {
        format!("{:?}…({} bytes)", text.chars().take(40).collect::<String>(), text.len())
    } else {
        format!("{text:?}")
    }
}

fn describe_error(e: &VerdictError) -> String {
    let code = VerdictErrorCode::try_from(e.code).map_or_else(|_| e.code.to_string(), |c| format!("{c:?}"));
    format!("{code} for {} ({})", short(&e.id), e.message)
}

/// Matches the errors a step got against those it deserves. Returns the
/// problems, and which expectations were met (for optional ones).
fn reconcile(expects: &[Expect], errors: &[VerdictError]) -> (Vec<String>, Vec<bool>) {
    let mut met = vec![false; expects.len()];
    let mut problems = Vec::new();
    for error in errors {
        match (0..expects.len()).find(|&i| !met[i] && expects[i].matches(error)) {
            Some(i) => met[i] = true,
            None => problems.push(format!("unexpected verdict error: {}", describe_error(error))),
        }
    }
    for (i, e) in expects.iter().enumerate() {
        if !met[i] && !e.optional {
            problems.push(format!("missing verdict error {:?} for {}", e.codes, short(&e.text)));
        }
    }
    (problems, met)
}

// ---------------------------------------------------------------------------
// One Consume call, with a fence
// ---------------------------------------------------------------------------

fn req(kind: Kind) -> ConsumeRequest {
    ConsumeRequest { kind: Some(kind) }
}

enum Next {
    Response(Box<ConsumeResponse>),
    Ended(Option<Status>),
    Timeout,
}

struct Call {
    tx: Option<mpsc::Sender<ConsumeRequest>>,
    rx: Streaming<ConsumeResponse>,
    ended: Option<Option<Status>>,
    /// What this call holds, by the test's account: branded id → stream id.
    held: BTreeMap<String, String>,
    /// Deliveries received and not yet taken by the sequence.
    fresh: Vec<Delivery>,
    /// Problems seen on the wire (a second Subscribed, an empty message).
    oddities: Vec<String>,
    /// A Drain was sent: no new deliveries (those on the wire still come).
    drained: bool,
}

impl Call {
    /// Opens the call with `first`; `Err` when the server refuses it at once.
    async fn open(client: &ConsumerServiceClient<Channel>, first: ConsumeRequest) -> Result<Call, Status> {
        // Roomy: a burst is queued whole while the test reads answers.
        let (tx, rx) = mpsc::channel(4096);
        tx.send(first).await.expect("queue the first message");
        let response = client.clone().consume(ReceiverStream::new(rx)).await?;
        Ok(Call {
            tx: Some(tx),
            rx: response.into_inner(),
            ended: None,
            held: BTreeMap::new(),
            fresh: Vec::new(),
            oddities: Vec::new(),
            drained: false,
        })
    }

    async fn next(&mut self, timeout: Duration) -> Next {
        if let Some(status) = &self.ended {
            return Next::Ended(status.clone());
        }
        match tokio::time::timeout(timeout, self.rx.message()).await {
            Err(_) => Next::Timeout,
            Ok(Ok(Some(response))) => Next::Response(Box::new(response)),
            Ok(Ok(None)) => {
                self.ended = Some(None);
                Next::Ended(None)
            }
            Ok(Err(status)) => {
                self.ended = Some(Some(status.clone()));
                Next::Ended(Some(status))
            }
        }
    }

    /// The first answer after a subscribe: Subscribed, or how the call ended.
    async fn confirm(&mut self) -> Result<echomq::proto::Subscribed, String> {
        match self.next(ANSWER).await {
            Next::Response(response) => match response.kind {
                Some(ResponseKind::Subscribed(s)) => Ok(s),
                other => Err(format!("expected Subscribed first, got {other:?}")),
            },
            Next::Ended(status) => Err(format!("ended with {status:?}")),
            Next::Timeout => Err(format!("no answer to the subscribe within {ANSWER:?}")),
        }
    }

    fn take(&mut self, response: ConsumeResponse) -> Option<VerdictError> {
        match response.kind {
            // Taken into `held` by `Seq::absorb`, after the step's verdicts are
            // applied: a Fail with no delay can come back before the fence.
            Some(ResponseKind::Delivery(d)) => {
                self.fresh.push(d);
                None
            }
            Some(ResponseKind::VerdictError(e)) => Some(e),
            Some(ResponseKind::Subscribed(s)) => {
                self.oddities.push(format!("a second Subscribed: {s:?}"));
                None
            }
            None => {
                self.oddities.push("a ConsumeResponse without a kind".to_owned());
                None
            }
        }
    }

    fn send_now(&self, message: ConsumeRequest) {
        if let Some(tx) = &self.tx {
            // The channel is roomy; a full or closed one means the call is gone.
            let _ = tx.try_send(message);
        }
    }

    /// Sends `messages`, then a fence, and collects the verdict errors that come
    /// before the fence's. `Err` with the call's end status when it ends instead.
    async fn exchange(
        &mut self,
        messages: Vec<ConsumeRequest>,
        fence: &str,
    ) -> Result<Vec<VerdictError>, (Vec<VerdictError>, String)> {
        for message in messages {
            self.drained |= matches!(message.kind, Some(Kind::Drain(_)));
            self.send_now(message);
        }
        self.send_now(req(Kind::Ack(Ack { ids: vec![fence.to_owned()] })));
        let mut errors = Vec::new();
        loop {
            match self.next(ANSWER).await {
                Next::Response(response) => {
                    if let Some(error) = self.take(*response) {
                        if error.id == fence {
                            if error.code != UNKNOWN as i32 {
                                errors.push(error);
                            }
                            return Ok(errors);
                        }
                        errors.push(error);
                    }
                }
                Next::Ended(status) => return Err((errors, format!("the call ended with {status:?}"))),
                Next::Timeout => return Err((errors, format!("the fence was not answered within {ANSWER:?}"))),
            }
        }
    }

    /// Waits for a delivery (up to `timeout`); true if one came.
    async fn wait_delivery(&mut self, timeout: Duration) -> Result<bool, String> {
        let deadline = Instant::now() + timeout;
        let before = self.fresh.len();
        while self.fresh.len() == before {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            match self.next(left).await {
                Next::Response(response) => {
                    if let Some(error) = self.take(*response) {
                        return Err(format!("an unprompted verdict error: {}", describe_error(&error)));
                    }
                }
                Next::Ended(status) => return Err(format!("the call ended with {status:?}")),
                Next::Timeout => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Waits for the end of the call; its status (None = OK) and the verdict
    /// errors that came first.
    async fn wait_end(&mut self) -> Result<(Option<Status>, Vec<VerdictError>), String> {
        let mut errors = Vec::new();
        loop {
            match self.next(ANSWER).await {
                Next::Response(response) => errors.extend(self.take(*response)),
                Next::Ended(status) => return Ok((status, errors)),
                Next::Timeout => return Err(format!("the call did not end within {ANSWER:?}")),
            }
        }
    }

    fn close_send(&mut self) {
        self.tx = None;
    }
}

// ---------------------------------------------------------------------------
// The world: the sidecar, the pool streams and their ledgers
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Pool {
    name: String,
    /// Subscribed at least once: the group exists.
    subscribed: bool,
    /// Appended entries: stream id → branded id.
    appended: BTreeMap<String, String>,
    /// Stream ids the test acknowledged with a valid Ack of an id its call held.
    acked: BTreeSet<String>,
    /// Stream ids the test dead-lettered with a valid Fail.
    dead: BTreeSet<String>,
    delivered: BTreeSet<String>,
    /// Stream ids whose fate the test cannot know: settled by a step that
    /// broke before its fence (acked or not, dead-lettered or not).
    uncertain: BTreeSet<String>,
}

impl Pool {
    /// Branded ids that no call can hold again (acked or dead-lettered).
    fn settled_ids(&self) -> Vec<String> {
        self.acked.iter().chain(&self.dead).filter_map(|s| self.appended.get(s).cloned()).collect()
    }

    fn available(&self) -> usize {
        self.appended.len().saturating_sub(self.acked.len() + self.dead.len())
    }
}

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
        let pool = &self.pools[p];
        if !pool.subscribed {
            return Vec::new();
        }
        let mut problems = Vec::new();
        let settled: BTreeSet<&String> = pool.acked.iter().chain(&pool.dead).collect();
        let uncertain = &pool.uncertain;
        // What the test settled leaves the PEL (the XACK may still be on its way).
        let deadline = Instant::now() + ANSWER;
        let pel: BTreeSet<String> = loop {
            let pel: BTreeSet<String> =
                pending_entries(&mut self.con, &pool.name, GROUP).await.into_iter().map(|p| p.stream_id).collect();
            let lingering: Vec<&String> =
                settled.iter().copied().filter(|s| pel.contains(*s) && !uncertain.contains(*s)).collect();
            if lingering.is_empty() {
                break pel;
            }
            if Instant::now() >= deadline {
                problems.push(format!("{}: acked or dead-lettered entries still pending: {lingering:?}", pool.name));
                break pel;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Everything else the group has read is still pending: nobody acknowledged it.
        let last = parse_stream_id(&last_delivered_id(&mut self.con, &pool.name, GROUP).await);
        let unaccounted: Vec<&String> = pool
            .appended
            .keys()
            .filter(|sid| parse_stream_id(sid) <= last && !settled.contains(sid) && !pel.contains(*sid))
            .filter(|sid| !uncertain.contains(*sid))
            .collect();
        if !unaccounted.is_empty() {
            // Forensics: is it still in the stream, in the retry hash?
            let in_stream: BTreeSet<String> =
                xrange(&mut self.con, &pool.name).await.into_iter().map(|e| e.stream_id).collect();
            let retries: BTreeMap<String, String> = redis::cmd("HGETALL")
                .arg(format!("{}:retries:{GROUP}", pool.name))
                .query_async(&mut self.con)
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
        let dead_letters = xrange(&mut self.con, &format!("{}:dlq", pool.name)).await;
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
}

/// What one sequence did and found.
struct Seq {
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

    fn problem(&mut self, what: String) {
        self.problems.push(what);
    }

    /// Takes a call's fresh deliveries into the pool's ledger, checking each.
    fn absorb(&mut self, call: &mut Call, pool: &mut Pool) {
        for odd in call.oddities.drain(..) {
            self.problems.push(odd);
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
                self.problems.push(format!(
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

// ---------------------------------------------------------------------------
// Sequences: a bad opening
// ---------------------------------------------------------------------------

fn sub(stream: &str, group: &str) -> Subscribe {
    Subscribe {
        stream: stream.to_owned(),
        group: group.to_owned(),
        group_start: GroupStart::Beginning as i32,
        ..Subscribe::default()
    }
}

/// The first message of a call, and the status it deserves (`None`: accepted).
/// (With huge durations either acceptance or INVALID_ARGUMENT is right: see
/// [`odd_duration`]; those cases are marked by [`EITHER`] in their description.)
fn opening(rng: &mut fastrand::Rng) -> (String, ConsumeRequest, Option<Code>) {
    let stream = unique("fz-open");
    let ten_kb = "s".repeat(10 * 1024);
    let mut s = sub(&stream, "g-open");
    let invalid = Some(Code::InvalidArgument);
    let (what, message, code): (&str, ConsumeRequest, Option<Code>) = match rng.u32(..34) {
        0 => ("an Ack before the subscribe", req(Kind::Ack(Ack { ids: vec![unknown_id(rng)] })), invalid),
        1 => (
            "a Fail before the subscribe",
            req(Kind::Fail(Fail { id: unknown_id(rng), ..Default::default() })),
            invalid,
        ),
        2 => (
            "an Extend before the subscribe",
            req(Kind::Extend(Extend { ids: vec![hex(rng, 28)], by: Some(dur(1, 0)) })),
            invalid,
        ),
        3 => ("a Drain before the subscribe", req(Kind::Drain(Drain {})), invalid),
        4 => ("a message without a kind", ConsumeRequest { kind: None }, invalid),
        5 => ("an empty Ack before the subscribe", req(Kind::Ack(Ack { ids: vec![] })), invalid),
        6 => {
            s.stream = String::new();
            ("an empty stream", req(Kind::Subscribe(s)), invalid)
        }
        7 => {
            s.stream = ten_kb;
            ("a 10 KB stream name", req(Kind::Subscribe(s)), invalid)
        }
        8 => {
            s.stream = "é".repeat(513); // 1026 bytes in 513 characters
            ("a 1026-byte stream name", req(Kind::Subscribe(s)), invalid)
        }
        9 => {
            s.group = String::new();
            ("an empty group", req(Kind::Subscribe(s)), invalid)
        }
        10 => {
            s.group = ten_kb;
            ("a 10 KB group name", req(Kind::Subscribe(s)), invalid)
        }
        11 => {
            s.group_start = GroupStart::Unspecified as i32;
            ("no group_start", req(Kind::Subscribe(s)), invalid)
        }
        12 => {
            s.group_start = [99, -1, 5, i32::MAX][rng.usize(..4)];
            ("an unknown group_start value", req(Kind::Subscribe(s)), invalid)
        }
        13 => {
            s.group_start = GroupStart::Id as i32;
            let bad = [
                "",
                "abc",
                "1-2-3",
                "-1",
                "1-",
                "-",
                "18446744073709551616-0",
                "1-18446744073709551616",
                "١٢٣-٤",
                "0x10-1",
                " 1-1",
            ];
            s.start_id = (*pick(rng, &bad).unwrap()).to_owned();
            ("GROUP_START_ID with a malformed start_id", req(Kind::Subscribe(s)), invalid)
        }
        14 => {
            s.group_start = GroupStart::Instant as i32;
            ("GROUP_START_INSTANT without start_time", req(Kind::Subscribe(s)), invalid)
        }
        15 => {
            s.group_start = GroupStart::Instant as i32;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
            let seconds = [-1 - rng.i64(0..1_000_000), now + 3_600 + rng.i64(0..i64::MAX / 2)][rng.usize(..2)];
            s.start_time = Some(prost_types::Timestamp { seconds, nanos: 0 });
            ("GROUP_START_INSTANT before the epoch or an hour ahead", req(Kind::Subscribe(s)), invalid)
        }
        16 => {
            s.max_in_flight = [10_001, u32::MAX][rng.usize(..2)];
            ("max_in_flight over the limit", req(Kind::Subscribe(s)), invalid)
        }
        17 => {
            s.ack_deadline = Some(negative_duration(rng));
            ("a negative ack_deadline", req(Kind::Subscribe(s)), invalid)
        }
        18 => {
            s.retry_backoff_initial = Some(negative_duration(rng));
            ("a negative retry_backoff_initial", req(Kind::Subscribe(s)), invalid)
        }
        19 => {
            s.retry_backoff_max = Some(negative_duration(rng));
            ("a negative retry_backoff_max", req(Kind::Subscribe(s)), invalid)
        }
        20 => {
            s.retry_backoff_initial = Some(dur(10, 0));
            s.retry_backoff_max = Some(dur(1, 0));
            ("retry_backoff_initial above retry_backoff_max", req(Kind::Subscribe(s)), invalid)
        }
        21 => {
            s.dead_letter_stream = ten_kb;
            ("a 10 KB dead_letter_stream", req(Kind::Subscribe(s)), invalid)
        }
        22..=24 => {
            s.stream = ["fz-string", "fz-hash", "fz-list"][rng.usize(..3)].to_owned();
            ("a key of another type", req(Kind::Subscribe(s)), Some(Code::FailedPrecondition))
        }
        25 => {
            s.group = "g".repeat(1025);
            (
                "a 1025-byte group name (the limit is --max-name-bytes, 1024 by default)",
                req(Kind::Subscribe(s)),
                invalid,
            )
        }
        26 => {
            s.dead_letter_stream = "x".repeat(OVERSIZED);
            ("an oversized first message", req(Kind::Subscribe(s)), Some(Code::ResourceExhausted))
        }
        // Edges that must be accepted.
        27 => {
            s.stream = format!("fz-ünïcødé-🚀-{}", rng.u32(..));
            ("a unicode stream name", req(Kind::Subscribe(s)), None)
        }
        28 => {
            s.stream = format!("{}{}", stream, "n".repeat(1024 - stream.len()));
            ("a stream name of exactly 1024 bytes", req(Kind::Subscribe(s)), None)
        }
        29 => {
            s.group_start = GroupStart::Id as i32;
            s.start_id = ["0", "0-0", "1-1", "18446744073709551615-18446744073709551615"][rng.usize(..4)].to_owned();
            ("GROUP_START_ID with a valid start_id", req(Kind::Subscribe(s)), None)
        }
        30 => {
            s.group_start = GroupStart::Instant as i32;
            s.start_time = Some(prost_types::Timestamp { seconds: 0, nanos: 0 });
            ("GROUP_START_INSTANT at the epoch", req(Kind::Subscribe(s)), None)
        }
        31 => {
            s.max_in_flight = 10_000;
            ("max_in_flight at the limit", req(Kind::Subscribe(s)), None)
        }
        32 => {
            s.ack_deadline = Some(huge_duration(rng));
            s.retry_backoff_max = Some(huge_duration(rng));
            ("huge ack_deadline and retry_backoff_max (EITHER)", req(Kind::Subscribe(s)), None)
        }
        _ => {
            s.ack_deadline = Some(dur(0, 0));
            ("a zero ack_deadline (no deadline)", req(Kind::Subscribe(s)), None)
        }
    };
    (what.to_owned(), message, code)
}

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
    match (expected, status) {
        (None, None) => {}
        (Some(code), Some(status)) if status.code() == code => {}
        (None, Some(status)) if what.contains(EITHER) && status.code() == Code::InvalidArgument => {}
        (expected, got) => seq.problem(format!(
            "{what}: expected {}, got {}",
            expected.map_or("acceptance".to_owned(), |c| format!("{c:?}")),
            got.map_or("acceptance".to_owned(), |s| format!("{:?}: {}", s.code(), short(s.message())))
        )),
    }
}

// ---------------------------------------------------------------------------
// Sequences: a subscribed call
// ---------------------------------------------------------------------------

/// Marks an opening that may be accepted or refused with INVALID_ARGUMENT.
const EITHER: &str = "(EITHER)";

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

/// What a verdict did to the model, once its errors are known.
#[derive(Debug)]
enum Effect {
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

/// An id of some class, with what an Ack of it deserves (`None`: applied) and
/// whether it was held. A held id moves from `avail` to `gone`.
fn any_id(
    rng: &mut fastrand::Rng,
    avail: &mut Vec<String>,
    gone: &mut Vec<String>,
) -> (String, Option<VerdictErrorCode>, bool) {
    match rng.u32(..10) {
        0..=3 if !avail.is_empty() => {
            let id = avail.swap_remove(rng.usize(..avail.len()));
            gone.push(id.clone());
            (id, None, true)
        }
        4 | 5 => {
            let base = pick(rng, avail).or_else(|| pick(rng, gone)).cloned();
            (malformed_id(rng, base.as_deref()), Some(INVALID), false)
        }
        6 | 7 if !gone.is_empty() => (pick(rng, gone).unwrap().clone(), Some(UNKNOWN), false),
        _ => (unknown_id(rng), Some(UNKNOWN), false),
    }
}

/// Builds one random verdict or extension against `avail` (ids the call holds
/// and this step has not settled yet) and `gone` (ids that are not held: settled
/// earlier or never delivered). Appends what it deserves to `expects`.
fn verdict(
    rng: &mut fastrand::Rng,
    deadline: bool,
    avail: &mut Vec<String>,
    gone: &mut Vec<String>,
    expects: &mut Vec<Expect>,
    effects: &mut Vec<Effect>,
) -> (String, ConsumeRequest) {
    match rng.u32(..100) {
        0..=39 => {
            let n = [0, 1, 1, 1, 2, 3, 5][rng.usize(..7)];
            let mut ids = Vec::new();
            for _ in 0..n {
                let (id, code, held) = any_id(rng, avail, gone);
                match code {
                    Some(code) => expects.push(Expect::new(&id, code)),
                    None if held => effects.push(Effect::Acked(id.clone())),
                    None => {}
                }
                ids.push(id);
            }
            let text = format!("Ack [{}]", ids.iter().map(|i| short(i)).collect::<Vec<_>>().join(", "));
            (text, req(Kind::Ack(Ack { ids })))
        }
        40..=79 => {
            let (id, code, held) = any_id(rng, avail, gone);
            let (retry, retry_text) = match rng.u32(..10) {
                0..=3 => (None, "none"),
                4 | 5 => (Some(small_duration(rng)), "small"),
                6 => (Some(dur(0, 0)), "zero"),
                7 | 8 => (Some(negative_duration(rng)), "negative"),
                _ => (Some(odd_duration(rng)), "odd"),
            };
            let dead_letter = rng.u32(..5) == 0;
            let reason = reason(rng);
            let text = format!(
                "Fail {} retry_after {retry_text} {:?} dead_letter {dead_letter} reason {} bytes",
                short(&id),
                retry,
                reason.len()
            );
            let message =
                req(Kind::Fail(Fail { id: id.clone(), reason, retry_after: retry, dead_letter, ..Default::default() }));
            match (code, retry_text) {
                (Some(INVALID), _) => expects.push(Expect::new(&id, INVALID)),
                // The delay is checked before the id is looked up: either answer is right.
                (Some(code), "negative" | "odd") => {
                    expects.push(Expect { text: id.clone(), codes: vec![code, INVALID], optional: false })
                }
                (Some(code), _) => expects.push(Expect::new(&id, code)),
                (None, "negative") if held => {
                    // Refused, so still held.
                    expects.push(Expect::new(&id, INVALID));
                    gone.retain(|g| *g != id);
                    avail.push(id);
                }
                (None, "odd") if held => {
                    // Not reused in this step: it may be retried (and come back), or
                    // dead-lettered, or refused (and still held).
                    gone.retain(|g| *g != id);
                    expects.push(Expect { text: id.clone(), codes: vec![INVALID], optional: true });
                    effects.push(Effect::MaybeSettled { id, expect: expects.len() - 1, dead_letter });
                }
                (None, _) if held && dead_letter => effects.push(Effect::DeadLettered(id)),
                (None, _) if held => {
                    // Not reused in this step: after its backoff it may be delivered again, to this call.
                    gone.retain(|g| *g != id);
                    effects.push(Effect::Failed(id));
                }
                (None, _) => {}
            }
            (text, message)
        }
        80..=96 => {
            let n = [0, 1, 1, 2, 4][rng.usize(..5)];
            // by_ok: Some(true) valid, Some(false) invalid, None either.
            let (by, by_ok, by_text) = match rng.u32(..8) {
                0 => (None, Some(false), "missing"),
                1 => (Some(dur(0, 0)), Some(false), "zero"),
                2 | 3 => (Some(negative_duration(rng)), Some(false), "negative"),
                4 => (Some(odd_duration(rng)), None, "odd"),
                _ => (Some(small_duration(rng)), Some(true), "small"),
            };
            let mut ids = Vec::new();
            for _ in 0..n {
                // An extension settles nothing: a held id stays available, unless
                // the call has an ack deadline, which is now `by` from now.
                let (id, code, held) = any_id(rng, avail, gone);
                if held {
                    gone.retain(|g| *g != id);
                    if by_ok != Some(false) && deadline {
                        effects.push(Effect::Released(id.clone()));
                    } else {
                        avail.push(id.clone());
                    }
                }
                match (by_ok, code) {
                    (Some(false), _) | (_, Some(INVALID)) => expects.push(Expect::new(&id, INVALID)),
                    (Some(true), Some(code)) => expects.push(Expect::new(&id, code)),
                    (Some(true), None) => {}
                    (None, Some(code)) => {
                        expects.push(Expect { text: id.clone(), codes: vec![code, INVALID], optional: false })
                    }
                    (None, None) => expects.push(Expect { text: id.clone(), codes: vec![INVALID], optional: true }),
                }
                ids.push(id);
            }
            let shown = ids.iter().map(|i| short(i)).collect::<Vec<_>>().join(", ");
            let text = format!("Extend by {by_text} {by:?} [{shown}]");
            (text, req(Kind::Extend(Extend { ids, by })))
        }
        _ => ("Drain".to_owned(), req(Kind::Drain(Drain {}))),
    }
}

/// Applies a step's effects to the call and the pool, given which expectations were met.
fn apply(effects: Vec<Effect>, met: &[bool], call: &mut Call, pool: &mut Pool, seq: &mut Seq) {
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
    seq.absorb(call, pool);
    world.stat("ms in verdict steps", started.elapsed().as_millis() as u64);
    going_on
}

/// A subscribe for pool `p`: the group policy is fixed per pool (every call on a
/// group must agree); flow control and, on the last pool, huge durations vary.
fn pool_subscribe(world: &World, p: usize, rng: &mut fastrand::Rng) -> Subscribe {
    let mut s = sub(&world.pools[p].name, GROUP);
    s.max_in_flight = [0, 1, 2, 3, 5, 8][rng.usize(..6)];
    if p == POOL {
        if rng.bool() {
            s.ack_deadline = Some(huge_duration(rng));
        }
        if rng.bool() {
            s.retry_backoff_max = Some(huge_duration(rng));
            if rng.bool() {
                s.retry_backoff_initial = s.retry_backoff_max;
            }
        }
    }
    s
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
    let subscribe = pool_subscribe(world, p, rng);
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
            seq.absorb(&mut call, &mut world.pools[p]);
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
                        seq.absorb(&mut c, &mut world.pools[p]);
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
    let mut s = pool_subscribe(world, p, rng);
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
    seq.absorb(&mut other, &mut world.pools[p]);
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
    seq.absorb(&mut other, &mut world.pools[p]);
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
            seq.absorb(&mut call, &mut world.pools[p]);
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
            if !errors.is_empty() {
                seq.problem(format!(
                    "{what}: unexpected verdict errors {:?}",
                    errors.iter().map(describe_error).collect::<Vec<_>>()
                ));
            }
            let got = status.as_ref().map(Status::code);
            if got != expected {
                seq.problem(format!(
                    "{what}: expected the call to end with {}, it ended with {}",
                    expected.map_or("OK".to_owned(), |c| format!("{c:?}")),
                    status.map_or("OK".to_owned(), |s| format!("{:?}: {}", s.code(), short(s.message())))
                ));
            }
        }
        Err(e) => seq.problem(format!("{what}: {e}")),
    }
    seq.absorb(&mut call, &mut world.pools[p]);
}

// ---------------------------------------------------------------------------
// Sequences: Append
// ---------------------------------------------------------------------------

async fn bad_append(world: &mut World, seq: &mut Seq, rng: &mut fastrand::Rng) {
    let target = "fz-append";
    let before = xlen(&mut world.con, target).await;
    let one = |stream: &str, f: std::collections::HashMap<String, Vec<u8>>| AppendRequest {
        stream: stream.to_owned(),
        fields: f,
        ..Default::default()
    };
    let batch = |entries: Vec<std::collections::HashMap<String, Vec<u8>>>| AppendBatchRequest {
        stream: target.to_owned(),
        entries: entries.into_iter().map(|f| BatchEntry { fields: f, ..Default::default() }).collect(),
        ..Default::default()
    };
    let ok_fields = fields(&[("a", b"1")]);
    let invalid = Code::InvalidArgument;
    let (what, result, expected): (&str, Result<(), Status>, Option<Code>) = match rng.u32(..13) {
        0 => {
            ("Append to an empty stream name", world.streams.append(one("", ok_fields)).await.map(drop), Some(invalid))
        }
        1 => (
            "Append to a 10 KB stream name",
            world.streams.append(one(&"s".repeat(10 * 1024), ok_fields)).await.map(drop),
            Some(invalid),
        ),
        2 => (
            "Append with the reserved field",
            world.streams.append(one(target, fields(&[("id", b"x"), ("a", b"1")]))).await.map(drop),
            Some(invalid),
        ),
        3 => {
            let key = ["fz-string", "fz-hash", "fz-list"][rng.usize(..3)];
            (
                "Append to a key of another type",
                world.streams.append(one(key, ok_fields)).await.map(drop),
                Some(Code::FailedPrecondition),
            )
        }
        4 => {
            let many = (0..1001).map(|i| (format!("f{i}"), b"v".to_vec())).collect();
            ("Append with 1001 fields", world.streams.append(one(target, many)).await.map(drop), Some(invalid))
        }
        5 => (
            "Append of 5 MB",
            world.streams.append(one(target, fields(&[("big", &vec![b'x'; OVERSIZED])]))).await.map(drop),
            Some(Code::ResourceExhausted),
        ),
        6 => ("AppendBatch of nothing", world.streams.append_batch(batch(vec![])).await.map(drop), Some(invalid)),
        7 => (
            "AppendBatch of 10,001 entries",
            world.streams.append_batch(batch(vec![fields(&[("a", b"1")]); 10_001])).await.map(drop),
            Some(invalid),
        ),
        8 => {
            let mut entries = vec![fields(&[("a", b"1")]); 5];
            entries.insert(rng.usize(..=5), fields(&[("id", b"0190000000000000000000000001")]));
            (
                "AppendBatch with the reserved field in one entry",
                world.streams.append_batch(batch(entries)).await.map(drop),
                Some(invalid),
            )
        }
        9 => {
            let key = ["fz-string", "fz-hash", "fz-list"][rng.usize(..3)];
            let request = AppendBatchRequest {
                stream: key.to_owned(),
                entries: vec![BatchEntry { fields: fields(&[("a", b"1")]), ..Default::default() }],
                ..Default::default()
            };
            (
                "AppendBatch to a key of another type",
                world.streams.append_batch(request).await.map(drop),
                Some(Code::FailedPrecondition),
            )
        }
        _ => {
            // Accepted: odd but valid names and values, checked byte for byte.
            let stream = ["fz-append-ünï-🚀", target, "fz-append-\u{202e}rtl"][rng.usize(..3)];
            let value: Vec<u8> = (0..rng.usize(..256)).map(|_| rng.u8(..)).collect();
            let f = fields(&[("ünï 🚀", &value), ("empty", b""), ("a", b"1")]);
            seq.log(format!("Append to {stream:?} with unicode names and binary values"));
            world.stat("appends", 1);
            match world.streams.append(one(stream, f.clone())).await {
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
    seq.log(format!("{what}; expect {expected:?}"));
    world.stat("appends", 1);
    match (expected, result) {
        (Some(code), Err(status)) if status.code() == code => {}
        (expected, got) => seq.problem(format!(
            "{what}: expected {expected:?}, got {:?}",
            got.map_err(|s| (s.code(), short(s.message())))
        )),
    }
    let after = xlen(&mut world.con, target).await;
    if after != before {
        seq.problem(format!("{what}: {target} went from {before} to {after} entries; a refused append writes nothing"));
    }
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

/// The panics in a sidecar log, in order: where, what, and the first frames
/// of the sidecar's own code in the backtrace.
fn panics(log: &str) -> Vec<String> {
    let lines: Vec<&str> = log.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some(at) = line.find("panicked at ") {
            let message = lines.get(i + 1).copied().unwrap_or_default();
            let ours: Vec<&str> = lines[i..lines.len().min(i + 80)]
                .iter()
                .filter(|l| l.contains("./src/"))
                .take(3)
                .map(|l| l.trim())
                .collect();
            out.push(format!("{} {message} (via {})", &line[at..], ours.join(" <- ")));
        }
    }
    out
}

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
