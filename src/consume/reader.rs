//! The group's reader of new entries (`XREADGROUP … STREAMS <stream> >`),
//! one request at a time, for as many entries as the worker has credit for,
//! in one of two ways (`--shared-readers`):
//!
//! - **Blocking**: `XREADGROUP … BLOCK --read-block-ms` on a connection of its
//!   own (never the shared one, whose response timeout would cut a blocked
//!   read short while Redis hands it entries), the group's from the reader
//!   pool ([`crate::redis::readers`]), taken when the group's first call
//!   subscribes, given back when the reader stops. An empty read (the BLOCK
//!   time passed) goes back to the worker, which asks again.
//! - **Shared**: per read, arm a wake ticket for the stream
//!   ([`crate::redis::wake`]), then one non-blocking `XREADGROUP` on a
//!   connection taken from the pool for that read alone. An empty read is not
//!   reported: the reader waits on the ticket (Redis said the stream changed,
//!   or the wake connection was lost), on a kick from the worker (it
//!   re-created the group), or [`SAFETY_REREAD`], and reads again. A read
//!   that returned fewer entries than asked left the group at the stream's
//!   end: its ticket is kept, and the next request waits on it before
//!   reading. While the wake connection is down, the reader polls every
//!   `--read-block-ms` instead.
//!
//! A group with per-key limits reads otherwise (see [`super::keyed`]): with
//! `keyed_read.lua` on the shared connection, which takes new entries
//! (`XREADGROUP` without `BLOCK`: a script cannot block) and registers and
//! gates each keyed one in the same step, so two sidecars reading at once
//! register in stream order. When it reads nothing it answers the stream's
//! last entry id. A blocking reader then waits on its own connection with
//! `XREAD BLOCK … COUNT 1 STREAMS <stream> <that id>`, which returns as soon
//! as anything newer exists (an entry a peer took meanwhile makes a spurious
//! wake: the script then reads nothing), and runs the script once more. A
//! shared reader arms its ticket before the script and waits on it as after
//! an empty `XREADGROUP`.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use redis::{Cmd, RedisError, RedisResult, Value};
use tokio::{sync::Notify, time::Instant};

use super::{keyed::Gate, orders::KeyLimit, Shared};
use crate::{
    config::SHARED_MOST_SIDECARS,
    id::StreamId,
    redis::{
        array, bytes, int, parse_entries, parse_stream_id,
        readers::{ReaderConnection, ReaderPool},
        wake::{Ticket, WakeHub},
        RawEntry,
    },
};

/// How long a shared reader waits for a wake-up before reading anyway. It
/// bounds what a wake lost to something tracking does not see costs (an
/// operator's `XGROUP SETID`, a server that dropped its tracking state
/// without closing the connection, a bug): at most this late, never lost.
/// One read per group per 30 s is 0.03 idle commands/s per subscription.
pub(crate) const SAFETY_REREAD: Duration = Duration::from_secs(30);

/// How a reader waits for new entries.
pub(crate) enum Mode {
    /// Blocked in `XREADGROUP … BLOCK` on the group's own connection.
    Blocking(Box<ReaderConnection>),
    /// Woken by the hub, reading on the shared pool.
    Shared(SharedReads),
}

/// The connections this sidecar's group readers use, as `--shared-readers`
/// set them up: with `off` (or on a cluster, or where the server refuses
/// tracking) only `blocking`; with `on` only `shared`; with `auto` both, and
/// each group chooses ([`wants_blocking`]).
pub(crate) struct ReaderPools {
    /// The blocking readers' connections (`--reader-connections`).
    pub(crate) blocking: Option<ReaderPool>,
    /// The wake hub and the shared readers' pool (`--shared-reader-connections`).
    pub(crate) shared: Option<SharedReads>,
}

impl ReaderPools {
    /// Both pools, when each group chooses its reader (`auto` where it can
    /// share); `None` when every reader waits one way.
    pub(crate) fn per_group(&self) -> Option<(&ReaderPool, &SharedReads)> {
        self.blocking.as_ref().zip(self.shared.as_ref())
    }
}

/// What a shared reader needs: the hub that says when its stream changed,
/// and the pool its reads take turns on. Cheap to clone.
#[derive(Clone)]
pub(crate) struct SharedReads {
    pub(crate) hub: Arc<WakeHub>,
    pub(crate) pool: ReaderPool,
}

/// With `--shared-readers auto`, a group stops sharing and blocks once more
/// than [`SHARED_MOST_SIDECARS`] sidecars read it, and shares again once at
/// most this many do: between the two it keeps what it has, so a fleet whose
/// size hovers at the bound does not switch its readers back and forth.
pub(crate) const SHARED_AGAIN_SIDECARS: usize = 2;
const _: () = assert!(SHARED_AGAIN_SIDECARS < SHARED_MOST_SIDECARS, "a band between the two bounds");

/// With `--shared-readers auto`, a group whose reads find entries more often
/// than this (reads per second) blocks: each wake of a shared reader costs two
/// round trips (`XLEN` to arm, then the read) where a blocked read costs none
/// until Redis answers it, so a busy group gets its entries sooner and for
/// less on a connection of its own, and a connection is cheap beside its
/// traffic. A quiet group (a trickle: one entry now and then) shares.
pub(crate) const BUSY_READS_PER_SECOND: f64 = 10.0;
/// A blocking group shares again once its reads find entries less often than
/// this (reads per second, over a hygiene beat).
pub(crate) const QUIET_READS_PER_SECOND: f64 = 2.0;
const _: () = assert!(QUIET_READS_PER_SECOND < BUSY_READS_PER_SECOND, "a band between the two bounds");

/// What a group's reader choice rests on, with `--shared-readers auto`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Demand {
    /// The sidecars serving the group (their fresh heartbeats, this one's
    /// included); 0 before the first beat.
    pub(crate) sidecars: usize,
    /// This sidecar's reads of the group that found entries, per second,
    /// lately; 0 before the first measure.
    pub(crate) reads_per_second: f64,
}

/// The shortest span a group's read rate is measured over
/// (`--shared-readers auto`): a shared reader that turns busy blocks within
/// about this long.
pub(crate) const READ_RATE_SPAN: Duration = Duration::from_secs(1);

/// How often a group's reads find entries: counted read by read, turned
/// into [`Demand::reads_per_second`] at each measure.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadRate {
    /// Reads that found entries since `since`.
    found: u32,
    since: Instant,
}

impl ReadRate {
    /// Counting from `now`.
    pub(crate) fn new(now: Instant) -> ReadRate {
        ReadRate { found: 0, since: now }
    }

    /// A read found entries.
    pub(crate) fn found(&mut self) {
        self.found += 1;
    }

    /// How long it has counted by `now`.
    fn counted(&self, now: Instant) -> Duration {
        now.duration_since(self.since)
    }

    /// Reads that found entries per second since the last measure, and
    /// counting anew from `now`; `None`, counting on, before
    /// [`READ_RATE_SPAN`] has passed: one read that found the entries already
    /// waiting 3 ms after a group's worker started is not 300 a second.
    pub(crate) fn measure(&mut self, now: Instant) -> Option<f64> {
        let counted = self.counted(now);
        if counted < READ_RATE_SPAN {
            return None;
        }
        let rate = f64::from(self.found) / counted.as_secs_f64();
        *self = ReadRate::new(now);
        Some(rate)
    }
}

/// Whether a group with `demand` should have a blocking reader, given
/// whether it has one now (`blocking`): many sidecars serve it
/// ([`SHARED_MOST_SIDECARS`]) or it is busy ([`BUSY_READS_PER_SECOND`]),
/// with a band below each bound where a blocking reader stays.
pub(crate) fn wants_blocking(demand: Demand, blocking: bool) -> bool {
    if blocking {
        demand.sidecars > SHARED_AGAIN_SIDECARS || demand.reads_per_second >= QUIET_READS_PER_SECOND
    } else {
        demand.sidecars > SHARED_MOST_SIDECARS || demand.reads_per_second > BUSY_READS_PER_SECOND
    }
}

/// What one read returned: the entries, and for a group with per-key
/// limits what the gate said of each (empty otherwise: none is limited).
#[derive(Debug, Default)]
pub(crate) struct Read {
    pub(crate) entries: Vec<RawEntry>,
    /// One per entry, in order, or none.
    pub(crate) gates: Vec<Gate>,
}

/// How a reader of a group with per-key limits reads.
#[derive(Clone, Debug)]
pub(crate) struct KeyedRead {
    /// `<stream>:keys:<group>`.
    pub(crate) zset: String,
    pub(crate) limit: KeyLimit,
}

/// A read that has not ended, polled by the worker's own loop
/// ([`next_read`]): its result, and what the next read starts from.
type ReadUnderWay = Pin<Box<dyn Future<Output = (RedisResult<Read>, Between)> + Send>>;

/// What a reader keeps between reads.
enum Between {
    /// The group's own connection.
    Blocking(Box<ReaderConnection>),
    /// The shared pool, and the ticket of a read that left the group at the
    /// stream's end: the next read waits on it before reading.
    Shared { reads: SharedReads, at_end: Option<Ticket> },
}

/// The group's reader: no task of its own (a task and the two channels to
/// it cost each group about 2 KB: heap profile, 1,000 idle groups), but a
/// read the worker polls in its loop, one at a time. Dropping it (or
/// [`Reader::stop`]) cuts off the read under way; a connection cut off
/// mid-read is closed, one between reads goes back to the pool.
pub(crate) struct Reader {
    shared: Arc<Shared>,
    target: Arc<Target>,
    /// `None` while a read is under way: the read holds it.
    between: Option<Between>,
    under_way: Option<ReadUnderWay>,
    /// How the worker ends a shared read's wait.
    wake: Arc<Wake>,
    /// Blocked on a connection of its own, not shared.
    blocking: bool,
}

impl Reader {
    /// The reader of `group` on `stream`, waiting as `mode` says (`no_ack`:
    /// reads with NOACK, at-most-once; `keyed`: the group has per-key limits,
    /// and reads with `keyed_read.lua`). It reads nothing until asked
    /// ([`Reader::request`]).
    pub(crate) fn new(
        shared: Arc<Shared>,
        mode: Mode,
        stream: String,
        group: String,
        no_ack: bool,
        keyed: Option<KeyedRead>,
    ) -> Reader {
        let blocking = matches!(mode, Mode::Blocking(_));
        let between = match mode {
            Mode::Blocking(conn) => Between::Blocking(conn),
            Mode::Shared(reads) => Between::Shared { reads, at_end: None },
        };
        Reader {
            shared,
            target: Arc::new(Target { stream, group, no_ack, keyed }),
            between: Some(between),
            under_way: None,
            wake: Arc::new(Wake { kick: Notify::new(), yield_empty: AtomicBool::new(false) }),
            blocking,
        }
    }

    /// Whether it blocks on a connection of its own (else it shares).
    pub(crate) fn is_blocking(&self) -> bool {
        self.blocking
    }

    /// Asks for up to `count` new entries: the read starts when the worker
    /// next waits ([`next_read`]). False when a read is still under way.
    pub(crate) fn request(&mut self, count: usize) -> bool {
        let Some(between) = self.between.take() else { return false };
        let (shared, target) = (self.shared.clone(), self.target.clone());
        self.under_way = Some(match between {
            Between::Blocking(conn) => Box::pin(blocking_read(shared, conn, target, count)),
            Between::Shared { reads, at_end } => {
                Box::pin(shared_read(shared, reads, at_end, target, self.wake.clone(), count))
            }
        });
        true
    }

    /// A shared reader waiting for a wake-up reads now (the next one, if it
    /// is reading): the worker re-created the group, whose entries no
    /// change of the stream announces. Nothing for a blocking reader.
    pub(crate) fn kick(&self) {
        self.wake.kick.notify_one();
    }

    /// A shared reader waiting for a wake-up stops waiting and reports an
    /// empty read (one reading reports what it read), so the worker gets a
    /// moment with no read under way, where it can replace the reader without
    /// cutting a read off. Nothing for a blocking reader: its read ends by
    /// itself within `--read-block-ms`.
    pub(crate) fn yield_now(&self) {
        if !self.blocking {
            self.wake.yield_empty.store(true, Ordering::Release);
            self.wake.kick.notify_one();
        }
    }

    /// Cuts off the read under way (its connection is closed), so no entry
    /// appended meanwhile is taken with no call to hand it to.
    pub(crate) fn stop(self) {
        drop(self);
    }
}

/// The end of the reader's read under way (its entries, or its error);
/// never resolves while there is no reader or no read. Cancel-safe: the read
/// is the reader's, and goes on at the next call.
pub(crate) async fn next_read(reader: &mut Option<Reader>) -> RedisResult<Read> {
    let Some(reader) = reader else { return std::future::pending().await };
    let Some(under_way) = reader.under_way.as_mut() else { return std::future::pending().await };
    let (result, between) = under_way.await;
    reader.under_way = None;
    reader.between = Some(between);
    result
}

/// One read of a blocking reader, on its own connection.
async fn blocking_read(
    shared: Arc<Shared>,
    mut conn: Box<ReaderConnection>,
    target: Arc<Target>,
    count: usize,
) -> (RedisResult<Read>, Between) {
    let result = match &target.keyed {
        Some(keyed) => keyed_read(&shared, &mut conn, &target.stream, &target.group, keyed, count).await,
        None => {
            let read = target.read(&shared.consumer, count, Some(shared.read_block));
            // A connection error leaves `conn` to reconnect before the next read.
            conn.read(&read).await.map(|entries| Read { entries, gates: Vec::new() })
        }
    };
    (result, Between::Blocking(conn))
}

/// What a reader reads.
struct Target {
    stream: String,
    group: String,
    no_ack: bool,
    keyed: Option<KeyedRead>,
}

impl Target {
    /// `XREADGROUP GROUP <group> <consumer> COUNT <count> [BLOCK <ms>] [NOACK] STREAMS <stream> >`.
    fn read(&self, consumer: &str, count: usize, block: Option<Duration>) -> Cmd {
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP").arg(&self.group).arg(consumer).arg("COUNT").arg(count);
        if let Some(block) = block {
            read.arg("BLOCK").arg(block.as_millis() as u64);
        }
        read.arg(self.no_ack.then_some("NOACK")).arg("STREAMS").arg(&self.stream).arg(">");
        read
    }

    /// One non-blocking read of a shared reader: `XREADGROUP` on a
    /// connection of `pool` taken for it, or `keyed_read.lua` on the shared one.
    async fn read_once(&self, shared: &Shared, pool: &ReaderPool, count: usize) -> RedisResult<Read> {
        if let Some(keyed) = &self.keyed {
            return match run_keyed_read(shared, &self.stream, &self.group, keyed, count).await? {
                KeyedReply::Entries(read) => Ok(read),
                KeyedReply::None { .. } => Ok(Read::default()),
            };
        }
        let mut conn = pool.acquire_for_read().await?;
        let entries = conn.read(&self.read(&shared.consumer, count, None)).await?;
        Ok(Read { entries, gates: Vec::new() })
    }
}

/// How the worker ends a shared reader's wait ([`Reader::kick`], [`Reader::yield_now`]).
struct Wake {
    kick: Notify,
    yield_empty: AtomicBool,
}

impl Wake {
    /// Whether the worker asked for an empty read back ([`Reader::yield_now`]).
    fn yielding(&self) -> bool {
        self.yield_empty.swap(false, Ordering::AcqRel)
    }
}

/// One read of a shared reader (see the module doc): ends with entries or an
/// error, and empty only when the worker asks ([`Reader::yield_now`]).
async fn shared_read(
    shared: Arc<Shared>,
    reads: SharedReads,
    at_end: Option<Ticket>,
    target: Arc<Target>,
    wake: Arc<Wake>,
    count: usize,
) -> (RedisResult<Read>, Between) {
    if let Some(ticket) = at_end {
        wait(&ticket, &wake.kick, SAFETY_REREAD).await;
    }
    let SharedReads { hub, pool } = &reads;
    let mut at_end = None;
    let result = loop {
        if wake.yielding() {
            break Ok(Read::default());
        }
        // Armed before the read: an XADD after it is sure to wake us.
        // Boxed, so that a reader waiting for a wake-up (most of an idle
        // group's life) does not keep the room of a read: inline, that made
        // each reader 9 KB (heap profile, 1,000 idle groups).
        let (read, ticket) = Box::pin(async {
            let ticket = hub.arm(&target.stream).await;
            (target.read_once(&shared, pool, count).await, ticket)
        })
        .await;
        match (read, ticket) {
            (Ok(read), Ok(ticket)) if read.entries.is_empty() => wait(&ticket, &wake.kick, SAFETY_REREAD).await,
            // No wake connection: poll.
            (Ok(read), Err(_)) if read.entries.is_empty() => {
                let _ = tokio::time::timeout(shared.read_block, wake.kick.notified()).await;
            }
            (Ok(read), ticket) => {
                if read.entries.len() < count {
                    at_end = ticket.ok();
                }
                break Ok(read);
            }
            (Err(e), _) => break Err(e),
        }
    };
    (result, Between::Shared { reads, at_end })
}

/// Waits until `ticket` fires, the worker kicks, or `longest` passed.
async fn wait(ticket: &Ticket, kick: &Notify, longest: Duration) {
    tokio::select! {
        () = ticket.wait() => {}
        () = kick.notified() => {}
        () = tokio::time::sleep(longest) => {}
    }
}

/// The group is gone (see [`crate::redis::Fault::NoGroup`]): re-create it.
pub(crate) fn is_group_lost(error: &RedisError) -> bool {
    crate::redis::fault(error) == crate::redis::Fault::NoGroup
}

/// One read of a group with per-key limits: `keyed_read.lua`; when it read
/// nothing, `XREAD BLOCK` on the reader's connection until an entry newer
/// than the stream's last one exists (or the BLOCK time passed), then the
/// script once more. A spurious wake (a peer took the new entry) returns
/// nothing, as a BLOCK that timed out does.
///
/// Errors: Redis' (NOGROUP from the script's XREADGROUP when the group is
/// gone), or a reply not shaped as the script's.
async fn keyed_read(
    shared: &Shared,
    conn: &mut ReaderConnection,
    stream: &str,
    group: &str,
    keyed: &KeyedRead,
    count: usize,
) -> RedisResult<Read> {
    let last = match run_keyed_read(shared, stream, group, keyed, count).await? {
        KeyedReply::Entries(read) => return Ok(read),
        KeyedReply::None { last } => last,
    };
    let mut wait = redis::cmd("XREAD");
    wait.arg("COUNT")
        .arg(1)
        .arg("BLOCK")
        .arg(shared.read_block.as_millis() as u64)
        .arg("STREAMS")
        .arg(stream)
        .arg(last.to_string());
    if conn.read(&wait).await?.is_empty() {
        return Ok(Read::default());
    }
    match run_keyed_read(shared, stream, group, keyed, count).await? {
        KeyedReply::Entries(read) => Ok(read),
        KeyedReply::None { .. } => Ok(Read::default()),
    }
}

/// What `keyed_read.lua` answered.
#[derive(Debug)]
enum KeyedReply {
    Entries(Read),
    /// Nothing new; the stream's last entry id (`0-0`: empty).
    None {
        last: StreamId,
    },
}

async fn run_keyed_read(
    shared: &Shared,
    stream: &str,
    group: &str,
    keyed: &KeyedRead,
    count: usize,
) -> RedisResult<KeyedReply> {
    let mut script = shared.redis.scripts.keyed_read.prepare_invoke();
    script
        .key(stream)
        .key(&keyed.zset)
        .arg(group)
        .arg(&shared.consumer)
        .arg(count)
        .arg(&keyed.limit.field)
        .arg(keyed.limit.per_key);
    let mut conn = shared.redis.conn.clone();
    let reply: Value = script.invoke_async(&mut conn).await?;
    parse_keyed_reply(reply)
}

fn parse_keyed_reply(reply: Value) -> RedisResult<KeyedReply> {
    let malformed =
        |what: String| redis::RedisError::from((redis::ErrorKind::Parse, "unexpected reply from Redis", what));
    let Value::Array(parts) = reply else { return Err(malformed("keyed_read.lua: not an array".into())) };
    let tag = parts.first().map(bytes).transpose()?.unwrap_or_default();
    match tag.as_slice() {
        b"none" => Ok(KeyedReply::None { last: parse_stream_id(parts.get(1).unwrap_or(&Value::Nil))? }),
        b"entries" => {
            let gates = array(parts.get(2).unwrap_or(&Value::Nil))
                .iter()
                .map(|flag| {
                    Gate::from_flag(int(flag)?).ok_or_else(|| malformed(format!("keyed_read.lua: flag {flag:?}")))
                })
                .collect::<RedisResult<Vec<Gate>>>()?;
            let mut parts = parts.into_iter();
            let entries = parse_entries(parts.nth(1).unwrap_or(Value::Nil))?;
            if gates.len() != entries.len() {
                return Err(malformed(format!("keyed_read.lua: {} flags for {} entries", gates.len(), entries.len())));
            }
            Ok(KeyedReply::Entries(Read { entries, gates }))
        }
        other => Err(malformed(format!("keyed_read.lua replied `{}`", String::from_utf8_lossy(other)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_group_blocks_past_the_bounds_and_shares_again_only_well_below_them() {
        let of = |sidecars, reads_per_second| Demand { sidecars, reads_per_second };
        assert!(!wants_blocking(Demand::default(), false), "before the first beat: shared");
        assert!(!wants_blocking(of(SHARED_MOST_SIDECARS, 0.0), false));
        assert!(wants_blocking(of(SHARED_MOST_SIDECARS + 1, 0.0), false));
        assert!(wants_blocking(of(SHARED_MOST_SIDECARS, 0.0), true), "between the bounds it keeps blocking");
        assert!(wants_blocking(of(SHARED_AGAIN_SIDECARS + 1, 0.0), true));
        assert!(!wants_blocking(of(SHARED_AGAIN_SIDECARS, 0.0), true));

        assert!(!wants_blocking(of(1, BUSY_READS_PER_SECOND), false), "a trickle shares");
        assert!(wants_blocking(of(1, BUSY_READS_PER_SECOND + 1.0), false), "a busy group blocks");
        assert!(wants_blocking(of(1, QUIET_READS_PER_SECOND), true), "between the bounds it keeps blocking");
        assert!(!wants_blocking(of(1, QUIET_READS_PER_SECOND - 0.5), true));
        assert!(wants_blocking(of(SHARED_MOST_SIDECARS + 1, 0.0), true), "quiet, but many sidecars");
    }

    #[test]
    fn a_read_rate_counts_reads_with_entries_per_second_and_starts_anew() {
        let start = Instant::now();
        let mut rate = ReadRate::new(start);
        assert_eq!(rate.measure(start), None, "no time passed");
        rate.found();
        assert_eq!(rate.measure(start + Duration::from_millis(3)), None, "one read in 3 ms is no rate");
        for _ in 0..29 {
            rate.found();
        }
        assert_eq!(rate.measure(start + Duration::from_secs(2)), Some(15.0), "the early read still counts");
        assert_eq!(rate.counted(start + Duration::from_secs(3)), Duration::from_secs(1), "counting from the measure");
        assert_eq!(rate.measure(start + Duration::from_secs(4)), Some(0.0));
    }

    #[test]
    fn every_reply_of_the_keyed_read_parses() {
        let none = Value::Array(vec![bulk("none"), bulk("5-1")]);
        assert!(matches!(parse_keyed_reply(none).unwrap(), KeyedReply::None { last: StreamId { ms: 5, seq: 1 } }));
        let entry = |id: &str| Value::Array(vec![bulk(id), Value::Array(vec![bulk("k"), bulk("a")])]);
        let read = Value::Array(vec![
            bulk("entries"),
            Value::Array(vec![entry("1-0"), entry("2-0"), entry("3-0")]),
            Value::Array(vec![Value::Int(0), Value::Int(1), Value::Int(2)]),
        ]);
        match parse_keyed_reply(read).unwrap() {
            KeyedReply::Entries(read) => {
                assert_eq!(read.entries.len(), 3);
                assert_eq!(read.gates, [Gate::Unkeyed, Gate::Admitted, Gate::Waits]);
            }
            other => panic!("{other:?}"),
        }
        let short = Value::Array(vec![bulk("entries"), Value::Array(vec![entry("1-0")]), Value::Array(vec![])]);
        assert!(parse_keyed_reply(short).is_err(), "a flag per entry");
        let bad_flag =
            Value::Array(vec![bulk("entries"), Value::Array(vec![entry("1-0")]), Value::Array(vec![Value::Int(7)])]);
        assert!(parse_keyed_reply(bad_flag).is_err());
        assert!(parse_keyed_reply(Value::Array(vec![bulk("what")])).is_err());
    }
}
