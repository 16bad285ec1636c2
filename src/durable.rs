//! Durable writes: a script that creates entries, confirmed by `WAIT`
//! (`--wait-replicas`) or `WAITAOF` (`--wait-aof`) before its caller is
//! answered; and [`eval`], the one way scripts that create entries are run.
//!
//! Why a writer of its own. `WAIT N T` answers once N replicas have every
//! write *this connection* made so far, or after T ms with fewer: so the
//! script and its `WAIT` must go on one connection, in that order. On the
//! shared multiplexed connection a `WAIT` would also hold up every other
//! command (acks, reads, plain appends) for up to T ms whenever a replica
//! lags, because Redis answers one client's commands in order. The
//! [`DurableWriter`] owns a connection of its own and does group commit:
//! callers queue their script call on a bounded channel; one task takes
//! everything queued, pipelines `[script, script, …, WAIT N T]` in one round
//! trip (one `WAIT` covers every script before it), and answers each caller.
//! While a round is in flight, new calls queue for the next, so under load a
//! round carries many appends and the `WAIT` costs a round trip per round,
//! not per append.
//!
//! On a cluster, `WAIT` must reach the primary that ran the scripts (a keyless
//! `WAIT` would go to any node): a round is split by the slot of each call's
//! first key, and each slot's pipeline is routed to that slot's primary
//! (`route_pipeline` with [`SlotAddr::Master`]); the slots' pipelines run
//! concurrently.
//!
//! Its connection comes from [`Redis::dedicated`], and only from there, so it
//! follows whatever that follows (a failover, a demoted primary). A round
//! that fails to reach Redis, times out, or meets `READONLY` drops the
//! connection; the next round makes a new one. Its response timeout is
//! `--redis-timeout-ms` plus `--wait-timeout-ms`: a round may legitimately
//! block for the whole wait.
//!
//! Scripts are sent by `EVALSHA`; a `NOSCRIPT` (a restarted or failed-over
//! server, a new connection to a node that never saw the script) loads the
//! script (`SCRIPT LOAD`) and sends the calls that met it once more, in a
//! round of their own. A `NOSCRIPT` call ran nothing, so that is safe.

use std::{collections::HashMap, sync::Arc, time::Duration};

use redis::{
    aio::ConnectionLike,
    cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr},
    Cmd, RedisError, RedisResult, Script, Value,
};
use tokio::sync::{mpsc, oneshot};

pub use crate::durability::{Durability, Shortfall};
use crate::redis::{fault, Connection, Fault, Redis};

/// Most script calls waiting for the writer (calls): past it, callers wait
/// for room (back-pressure, never an unbounded queue).
pub const QUEUE_CALLS: usize = 4_096;
/// Most script calls in one round (calls): one pipeline, one `WAIT`.
pub const ROUND_CALLS: usize = 512;

/// How the services write entries: shared by Append, AppendBatch,
/// ReplayDeadLetters and the Consume call's AckEmit.
#[derive(Clone)]
pub struct Writes {
    /// The durable writer, with `--wait-replicas` above 0 or `--wait-aof`;
    /// `None`: scripts run on the shared connection, as fast as ever.
    pub durable: Option<DurableWriter>,
    /// How long a dedup record lives (`--dedup-window-ms`).
    pub dedup_window: Duration,
}

impl Writes {
    /// Checks that the server can do what `durability` asks and starts the
    /// durable writer when it asks anything. `--wait-aof` needs `WAITAOF`
    /// (Redis 7.2 on, Valkey) and `appendonly yes`: tried once (`WAITAOF 1 0
    /// 1`, which waits for nothing yet). Fewer connected replicas than
    /// `--wait-replicas` is only warned of: replicas may join later, and until
    /// they do every write is answered UNAVAILABLE, saying so.
    ///
    /// Errors: the one-line reason the server cannot do it (the sidecar then
    /// exits 2), naming the server's version.
    pub async fn start(
        redis: &Redis,
        durability: Durability,
        dedup_window: Duration,
        redis_timeout: Duration,
    ) -> Result<Writes, String> {
        if durability.aof {
            let at_least_7_2 = crate::redis::version::Version { major: 7, minor: 2, patch: 0 };
            if let Some(server) = redis.server.filter(|server| server.redis < at_least_7_2) {
                return Err(format!(
                    "--wait-aof needs WAITAOF, which Redis 7.2 and newer and Valkey have; the server is {server}: \
                     upgrade it, or drop --wait-aof (--wait-replicas still waits for replicas)"
                ));
            }
            let mut conn = redis.conn.clone();
            let tried: RedisResult<Value> = redis::cmd("WAITAOF").arg(1).arg(0).arg(1).query_async(&mut conn).await;
            if let Err(e) = tried {
                let version = redis.server.map_or_else(|| "of unknown version".to_owned(), |s| s.to_string());
                return Err(format!(
                    "--wait-aof: the server ({version}) refused WAITAOF ({e}); it needs Redis 7.2 or newer, or \
                     Valkey, with appendonly yes"
                ));
            }
        }
        if durability.replicas > 0 {
            match DurableWriter::connected_replicas(redis, redis_timeout).await {
                Ok(connected) if connected < u64::from(durability.replicas) => tracing::warn!(
                    wait_replicas = durability.replicas,
                    connected,
                    "--wait-replicas is above the replicas connected to the primary: until more connect, every \
                     append is answered UNAVAILABLE (written to the primary, not confirmed)"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!("cannot count the primary's replicas (INFO replication): {e}"),
            }
        }
        let durable = durability.is_on().then(|| DurableWriter::start(redis.clone(), durability, redis_timeout));
        if durable.is_some() {
            tracing::info!(
                wait_replicas = durability.replicas,
                wait_aof = durability.aof,
                wait_timeout_ms = durability.timeout.as_millis() as u64,
                "appends are confirmed by replicas before they are answered"
            );
        }
        Ok(Writes { durable, dedup_window })
    }
}

/// The scripts that create entries, which the writer may have to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScriptName {
    /// `append.lua` (Append, AppendBatch).
    Append,
    /// `replay.lua` (ReplayDeadLetters).
    Replay,
    /// `consume/ack_emit.lua` (a Consume call's AckEmit).
    AckEmit,
    /// `move.lua` (scheduled entries entering their stream).
    Move,
}

impl ScriptName {
    fn script(self, redis: &Redis) -> &Script {
        match self {
            ScriptName::Append => &redis.scripts.append,
            ScriptName::Replay => &redis.scripts.replay,
            ScriptName::AckEmit => &redis.scripts.ack_emit,
            ScriptName::Move => &redis.scripts.move_scheduled,
        }
    }
}

/// One script run: `EVALSHA sha numkeys keys… args…`, built once and sent
/// as it is, on the shared connection or through the writer.
pub struct ScriptCall {
    name: ScriptName,
    cmd: Cmd,
    /// The slot of its first key: where a cluster runs it, and its `WAIT`.
    slot: Slot,
}

impl ScriptCall {
    /// A call of script `name` with `keys`; add its arguments with [`ScriptCall::arg`].
    pub fn new<K: AsRef<[u8]>>(redis: &Redis, name: ScriptName, keys: &[K]) -> ScriptCall {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(name.script(redis).get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(key.as_ref());
        }
        let slot = Slot::for_key(keys.first().map_or(&b""[..], AsRef::as_ref));
        ScriptCall { name, cmd, slot }
    }

    /// Adds `ARGV[i]`.
    pub fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut ScriptCall {
        self.cmd.arg(arg);
        self
    }
}

/// Runs `call` on `conn` (the shared connection, for writes that do not
/// wait): `EVALSHA`, and after a `NOSCRIPT` the script is loaded and the
/// call sent once more.
///
/// Errors: what Redis answered, or failing to reach it.
pub async fn eval<C: ConnectionLike>(redis: &Redis, conn: &mut C, call: &ScriptCall) -> RedisResult<Value> {
    match call.cmd.query_async::<Value>(conn).await {
        Err(e) if is_noscript(&e) => {
            call.name.script(redis).load_async(conn).await?;
            call.cmd.query_async(conn).await
        }
        other => other,
    }
}

/// Runs `call` as every script that creates entries runs: through `durable`
/// when writes wait for replicas (the reply, and how the wait fell short if
/// it did), else with [`eval`] on `conn`.
///
/// Errors: as [`eval`] and [`DurableWriter::write`].
pub async fn run<C: ConnectionLike>(
    redis: &Redis,
    conn: &mut C,
    durable: Option<&DurableWriter>,
    call: ScriptCall,
) -> RedisResult<(Value, Option<Shortfall>)> {
    match durable {
        Some(writer) => writer.write(call).await.map(|written| (written.reply, written.shortfall)),
        None => eval(redis, conn, &call).await.map(|reply| (reply, None)),
    }
}

fn is_noscript(error: &RedisError) -> bool {
    error.code() == Some("NOSCRIPT")
}

/// A script run through the writer: its reply, and whether the wait fell short.
#[derive(Debug)]
pub struct Written {
    /// The script's reply.
    pub reply: Value,
    /// `None` when the replicas (the fsyncs) confirmed it in time; otherwise
    /// what they did: the write is on the primary, not confirmed.
    pub shortfall: Option<Shortfall>,
}

/// One call waiting for the writer.
struct Job {
    call: ScriptCall,
    answer: oneshot::Sender<RedisResult<Written>>,
}

/// Runs script calls on a connection of its own and confirms them with
/// `WAIT`/`WAITAOF` (see the module doc). Cheap to share: an `Arc`'s worth.
#[derive(Clone)]
pub struct DurableWriter {
    jobs: mpsc::Sender<Job>,
    durability: Durability,
}

impl DurableWriter {
    /// Starts the writer's task for `redis` with `durability`; its connection
    /// is made with [`Redis::dedicated`] (`connect_timeout` to connect,
    /// `redis_timeout` + the wait timeout per round) on the first call, and
    /// again after a round that lost it. The task ends once every
    /// `DurableWriter` clone is dropped and the queue is empty.
    pub fn start(redis: Redis, durability: Durability, redis_timeout: Duration) -> DurableWriter {
        let (jobs, queue) = mpsc::channel(QUEUE_CALLS);
        let task = Task {
            redis: Arc::new(redis),
            durability,
            connect_timeout: redis_timeout,
            response_timeout: redis_timeout + durability.timeout,
        };
        tokio::spawn(task.run(queue));
        DurableWriter { jobs, durability }
    }

    /// What writes are confirmed by.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Runs `call` in the next round and answers once its `WAIT` did.
    ///
    /// Errors: what Redis answered the script (as [`eval`]), or failing to
    /// reach Redis (the round's connection error; the script may or may not
    /// have run). A wait that fell short is not an error here: see
    /// [`Written::shortfall`].
    pub async fn write(&self, call: ScriptCall) -> RedisResult<Written> {
        let stopped = || RedisError::from((redis::ErrorKind::Io, "the durable writer has stopped"));
        let (answer, answered) = oneshot::channel();
        self.jobs.send(Job { call, answer }).await.map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }

    /// The primary's replicas now (`INFO replication`, `connected_slaves`),
    /// through a short-lived connection of its own: for the start-up warning
    /// when fewer than `--wait-replicas` are connected. On a cluster, the
    /// fewest any primary has.
    ///
    /// Errors: connecting or `INFO` failed, or the reply has no count.
    pub async fn connected_replicas(redis: &Redis, timeout: Duration) -> RedisResult<u64> {
        let mut conn = redis.dedicated(timeout, Some(timeout)).await?;
        let info: Value = redis::cmd("INFO").arg("replication").query_async(&mut conn).await?;
        fewest_connected(&info)
            .ok_or_else(|| RedisError::from((redis::ErrorKind::Parse, "INFO replication has no connected_slaves")))
    }
}

/// The writer's task: owns the connection.
struct Task {
    redis: Arc<Redis>,
    durability: Durability,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Task {
    async fn run(self, mut queue: mpsc::Receiver<Job>) {
        let this = Arc::new(self);
        let mut conn: Option<Connection> = None;
        while let Some(first) = queue.recv().await {
            // A connection made before the primary switched reaches the old one.
            if matches!(&conn, Some(Connection::Dedicated(c)) if c.is_stale()) {
                conn = None;
            }
            let mut round = vec![first];
            while round.len() < ROUND_CALLS {
                match queue.try_recv() {
                    Ok(job) => round.push(job),
                    Err(_) => break,
                }
            }
            let live = match &conn {
                Some(live) => live.clone(),
                None => match this.redis.dedicated(this.connect_timeout, Some(this.response_timeout)).await {
                    Ok(new) => {
                        conn = Some(new.clone());
                        new
                    }
                    Err(e) => {
                        tracing::warn!("the durable writer cannot connect to Redis: {e}");
                        for job in round {
                            let _ = job.answer.send(Err(e.clone()));
                        }
                        continue;
                    }
                },
            };
            let mut by_slot: HashMap<Slot, Vec<Job>> = HashMap::new();
            let cluster = matches!(live, Connection::Cluster(_));
            for job in round {
                let slot = if cluster { job.call.slot } else { Slot::for_key(b"") };
                by_slot.entry(slot).or_default().push(job);
            }
            let lost = if by_slot.len() == 1 {
                let (slot, jobs) = by_slot.into_iter().next().expect("one slot");
                this.round(live, cluster.then_some(slot), jobs).await
            } else {
                let mut rounds = tokio::task::JoinSet::new();
                for (slot, jobs) in by_slot {
                    let this = this.clone();
                    let live = live.clone();
                    rounds.spawn(async move { this.round(live, Some(slot), jobs).await });
                }
                let mut lost = false;
                while let Some(done) = rounds.join_next().await {
                    lost |= done.unwrap_or(true);
                }
                lost
            };
            if lost {
                conn = None;
            }
        }
    }

    /// One slot's round: the scripts and the `WAIT`, answered. True when the
    /// connection should be dropped (it failed, timed out, or reached a
    /// replica).
    async fn round(&self, mut conn: Connection, slot: Option<Slot>, jobs: Vec<Job>) -> bool {
        let mut jobs = jobs;
        let mut loaded = false;
        loop {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for job in &jobs {
                pipe.add_command(job.call.cmd.clone());
            }
            pipe.add_command(self.durability.command());
            let mut replies = match send(&mut conn, pipe, slot).await {
                Ok(replies) if replies.len() == jobs.len() + 1 => replies,
                Ok(replies) => {
                    let e = RedisError::from((
                        redis::ErrorKind::Parse,
                        "unexpected reply from Redis",
                        format!("{} replies to a pipeline of {}", replies.len(), jobs.len() + 1),
                    ));
                    answer_all(jobs, &e);
                    return true;
                }
                Err(e) => {
                    let lost = retires(&e);
                    answer_all(jobs, &e);
                    return lost;
                }
            };
            let waited = replies.pop().unwrap_or(Value::Nil);
            let mut shortfall = self.shortfall(waited);
            if let Some(short) = shortfall.as_mut() {
                short.connected = connected_replicas(&mut conn, slot).await;
            }
            let mut again = Vec::new();
            let mut lost = false;
            for (job, reply) in jobs.into_iter().zip(replies) {
                match reply.extract_error() {
                    Err(e) if is_noscript(&e) && !loaded => again.push(job),
                    Err(e) => {
                        lost |= retires(&e);
                        let _ = job.answer.send(Err(e));
                    }
                    Ok(reply) => {
                        let _ = job.answer.send(Ok(Written { reply, shortfall: shortfall.clone() }));
                    }
                }
            }
            if again.is_empty() || lost {
                let e = RedisError::from((redis::ErrorKind::Io, "the durable writer's connection was dropped"));
                answer_all(again, &e);
                return lost;
            }
            // Load each script that was missing (on a cluster, SCRIPT LOAD
            // goes to every primary), then send those calls again.
            let mut names: Vec<ScriptName> = again.iter().map(|job| job.call.name).collect();
            names.sort_unstable_by_key(|name| *name as u8);
            names.dedup();
            for name in names {
                if let Err(e) = name.script(&self.redis).load_async(&mut conn).await {
                    let lost = retires(&e);
                    answer_all(again, &e);
                    return lost;
                }
            }
            loaded = true;
            jobs = again;
        }
    }

    /// What a `WAIT`/`WAITAOF` reply says against [`Durability`]: `None` when enough.
    fn shortfall(&self, waited: Value) -> Option<Shortfall> {
        let wanted = i64::from(self.durability.replicas);
        let mut short =
            Shortfall { durability: self.durability, confirmed: 0, local_aof: None, connected: None, error: None };
        match (self.durability.aof, waited) {
            (false, Value::Int(confirmed)) if confirmed >= wanted => None,
            (false, Value::Int(confirmed)) => Some(Shortfall { confirmed, ..short }),
            (true, Value::Array(counts)) => match counts.as_slice() {
                [Value::Int(local), Value::Int(confirmed)] if *local >= 1 && *confirmed >= wanted => None,
                [Value::Int(local), Value::Int(confirmed)] => {
                    Some(Shortfall { confirmed: *confirmed, local_aof: Some(*local >= 1), ..short })
                }
                _ => {
                    short.error = Some(format!("unexpected reply {counts:?}"));
                    Some(short)
                }
            },
            (_, Value::ServerError(e)) => {
                short.error = Some(RedisError::from(e).to_string());
                Some(short)
            }
            (_, other) => {
                short.error = Some(format!("unexpected reply {other:?}"));
                Some(short)
            }
        }
    }
}

/// Sends `pipe` on `conn`: on a cluster to `slot`'s primary.
async fn send(conn: &mut Connection, pipe: redis::Pipeline, slot: Option<Slot>) -> RedisResult<Vec<Value>> {
    match (conn, slot) {
        (Connection::Cluster(cluster), Some(slot)) => {
            let count = pipe.len();
            let route = SingleNodeRoutingInfo::SpecificNode(Route::with_slot(slot, SlotAddr::Master));
            cluster.route_pipeline(pipe, 0, count, route).await
        }
        (conn, _) => pipe.query_async(conn).await,
    }
}

/// Sends `cmd` on `conn`: on a cluster to `slot`'s primary.
async fn query(conn: &mut Connection, cmd: Cmd, slot: Option<Slot>) -> RedisResult<Value> {
    match (conn, slot) {
        (Connection::Cluster(cluster), Some(slot)) => {
            let route = SingleNodeRoutingInfo::SpecificNode(Route::with_slot(slot, SlotAddr::Master));
            cluster.route_command(cmd, RoutingInfo::SingleNode(route)).await
        }
        (conn, _) => cmd.query_async(conn).await,
    }
}

/// `connected_slaves` of the primary `conn` (on a cluster, `slot`'s) reaches;
/// `None` when it would not say.
async fn connected_replicas(conn: &mut Connection, slot: Option<Slot>) -> Option<u64> {
    let info = query(conn, redis::cmd("INFO").arg("replication").to_owned(), slot).await.ok()?;
    fewest_connected(&info)
}

/// The fewest `connected_slaves` in an `INFO replication` reply (one text, or
/// a cluster's map of node to text).
fn fewest_connected(info: &Value) -> Option<u64> {
    let text = |bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .lines()
            .find_map(|line| line.trim().strip_prefix("connected_slaves:")?.parse::<u64>().ok())
    };
    match info {
        Value::BulkString(bytes) => text(bytes),
        Value::SimpleString(s) => text(s.as_bytes()),
        Value::VerbatimString { text: s, .. } => text(s.as_bytes()),
        Value::Map(pairs) => pairs.iter().filter_map(|(_, value)| fewest_connected(value)).min(),
        Value::Array(values) => values.iter().filter_map(fewest_connected).min(),
        _ => None,
    }
}

/// Whether `error` means the connection is no good any more: Redis could not
/// be reached or did not answer, or it is a replica now (`READONLY`).
fn retires(error: &RedisError) -> bool {
    matches!(fault(error), Fault::Timeout | Fault::Unreachable | Fault::NotPrimary)
}

fn answer_all(jobs: Vec<Job>, error: &RedisError) {
    for job in jobs {
        let _ = job.answer.send(Err(error.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn durability(replicas: u32, aof: bool) -> Durability {
        Durability { replicas, aof, timeout: Duration::from_millis(1000) }
    }

    #[test]
    fn a_shortfall_says_how_many_confirmed_and_are_connected() {
        let short = Shortfall {
            durability: durability(1, false),
            confirmed: 0,
            local_aof: None,
            connected: Some(0),
            error: None,
        };
        assert_eq!(
            short.to_string(),
            "only 0 of 1 replicas confirmed it within 1000 ms (WAIT); the primary has 0 connected replicas"
        );
        let aof = Shortfall { durability: durability(0, true), local_aof: Some(false), connected: None, ..short };
        assert_eq!(aof.to_string(), "the primary did not fsync it to its append-only file within 1000 ms (WAITAOF)");
    }

    #[test]
    fn connected_replicas_are_read_from_info_and_a_cluster_gives_the_fewest() {
        let one = Value::BulkString(b"# Replication\r\nrole:master\r\nconnected_slaves:2\r\n".to_vec());
        assert_eq!(fewest_connected(&one), Some(2));
        let none = Value::BulkString(b"role:master\r\nconnected_slaves:0\r\n".to_vec());
        let cluster = Value::Map(vec![(Value::SimpleString("a".into()), one), (Value::SimpleString("b".into()), none)]);
        assert_eq!(fewest_connected(&cluster), Some(0));
        assert_eq!(fewest_connected(&Value::Nil), None);
    }

    #[test]
    fn the_wait_command_follows_the_durability() {
        let wait = durability(2, false).command();
        assert_eq!(wait.args_iter().count(), 3);
        let waitaof = durability(1, true).command();
        assert_eq!(waitaof.args_iter().count(), 4);
        assert!(!durability(0, false).is_on());
        assert!(durability(0, true).is_on());
    }
}
