//! Redis probes: what a test reads from (or seeds into) Redis directly, beside
//! the sidecar, to check what it did: stream entries, pending entries, groups,
//! lengths, keys; and the reply decoding they share (with [`super::cluster`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::process::{eventually, EVENT_TIMEOUT};

/// A string-like reply's bytes; panics on anything else.
fn as_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        Value::SimpleString(s) => s.clone().into_bytes(),
        Value::Int(i) => i.to_string().into_bytes(),
        Value::Okay => b"OK".to_vec(),
        other => panic!("expected a string, got {other:?}"),
    }
}

/// A string-like reply as UTF-8 text.
fn as_string(v: &Value) -> String {
    String::from_utf8(as_bytes(v)).expect("utf-8")
}

/// An integer reply, or a string one holding an integer.
pub(super) fn as_int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => as_string(other).parse().unwrap_or_else(|_| panic!("expected an integer, got {other:?}")),
    }
}

/// An array (or set) reply's elements.
pub(super) fn as_array(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        other => panic!("expected an array, got {other:?}"),
    }
}

/// One stream entry as Redis stores it.
#[derive(Debug, Clone)]
pub struct RawEntry {
    pub stream_id: String,
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl RawEntry {
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields.iter().find(|(k, _)| k == name.as_bytes()).map(|(_, v)| v.as_slice())
    }
}

fn parse_entries(v: &Value) -> Vec<RawEntry> {
    as_array(v)
        .iter()
        .map(|e| {
            let parts = as_array(e);
            let flat = match &parts[1] {
                Value::Nil => Vec::new(),
                other => as_array(other).to_vec(),
            };
            RawEntry {
                stream_id: as_string(&parts[0]),
                fields: flat.chunks(2).map(|kv| (as_bytes(&kv[0]), as_bytes(&kv[1]))).collect(),
            }
        })
        .collect()
}

/// `XRANGE stream - +`.
pub async fn xrange(con: &mut MultiplexedConnection, stream: &str) -> Vec<RawEntry> {
    let v: Value = redis::cmd("XRANGE").arg(stream).arg("-").arg("+").query_async(con).await.expect("XRANGE");
    parse_entries(&v)
}

/// Waits until no client of this Redis is blocked (in XREADGROUP … BLOCK):
/// a sidecar's reader stops when its last call leaves or on SIGTERM, but
/// Redis learns of the dropped connection a moment later, and until then an
/// entry appended (or a stream deleted) still reaches the blocked read.
pub async fn wait_no_blocked_readers(con: &mut MultiplexedConnection) {
    let stopped = eventually(EVENT_TIMEOUT, || {
        let mut con = con.clone();
        async move {
            let info: String = redis::cmd("INFO").arg("clients").query_async(&mut con).await.expect("INFO clients");
            info.lines().any(|line| line.trim() == "blocked_clients:0")
        }
    })
    .await;
    assert!(stopped, "a client is still blocked in Redis after {EVENT_TIMEOUT:?}");
}

/// Waits (up to 30 s) until `replicas` replicas of the primary behind `con`
/// acknowledge a write (`SET key`, `WAIT replicas 200`, `DEL key`). A replica
/// whose link is up may not take the replication stream yet: after a diskless
/// full sync its primary feeds it only once the replica's first `REPLCONF
/// ACK` arrives, up to a second later (the primary logs "Waiting for REPLCONF
/// ACK from replica to enable streaming"), so a test's first `WAIT` could
/// time out on a healthy deployment of a loaded machine.
pub async fn wait_replicas_acknowledge(con: &mut MultiplexedConnection, key: &str, replicas: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match replicas_acknowledge(con, key, replicas).await {
            Ok(()) => return,
            outcome => assert!(
                Instant::now() < deadline,
                "{replicas} replicas did not acknowledge a write within 30 s ({outcome:?})"
            ),
        }
    }
}

/// One try of [`wait_replicas_acknowledge`]: `Err` with what `WAIT` said
/// (the replicas that acknowledged) or the error.
pub async fn replicas_acknowledge(con: &mut MultiplexedConnection, key: &str, replicas: i64) -> Result<(), String> {
    let mut probe = redis::pipe();
    probe.cmd("SET").arg(key).arg(1).ignore().cmd("WAIT").arg(replicas).arg(200).cmd("DEL").arg(key).ignore();
    match probe.query_async::<(i64,)>(con).await {
        Ok((acknowledged,)) if acknowledged >= replicas => Ok(()),
        Ok((acknowledged,)) => Err(format!("{acknowledged} acknowledged")),
        Err(e) => Err(e.to_string()),
    }
}

pub async fn xlen(con: &mut MultiplexedConnection, stream: &str) -> i64 {
    redis::cmd("XLEN").arg(stream).query_async(con).await.expect("XLEN")
}

pub async fn exists(con: &mut MultiplexedConnection, key: &str) -> bool {
    let n: i64 = redis::cmd("EXISTS").arg(key).query_async(con).await.expect("EXISTS");
    n == 1
}

/// `XADD stream * f v ...` with raw byte fields (a foreign producer); the stream id.
pub async fn xadd_raw(con: &mut MultiplexedConnection, stream: &str, fields: &[(&[u8], &[u8])]) -> String {
    xadd_raw_at(con, stream, "*", fields).await
}

/// `XADD stream <id> f v ...`; the stream id.
pub async fn xadd_raw_at(con: &mut MultiplexedConnection, stream: &str, id: &str, fields: &[(&[u8], &[u8])]) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg(id);
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    cmd.query_async(con).await.expect("XADD")
}

/// The pending count of a group (`XPENDING stream group` summary); errors (NOGROUP) as `Err`.
/// A new entry of `stream` (`k` = `value`), pending for a consumer
/// `dead-peer` of `group`: what a dead peer leaves behind. Appended and read
/// in one MULTI, so no sidecar's reader takes it first; with `idle`, its idle
/// time is then set to that (`XCLAIM … IDLE … JUSTID`). Returns its id.
pub async fn dead_peers_entry(
    con: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
    value: &[u8],
    idle: Option<Duration>,
) -> String {
    let (id, _): (String, Value) = redis::pipe()
        .atomic()
        .cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("k")
        .arg(value)
        .cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg("dead-peer")
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(con)
        .await
        .expect("XADD and XREADGROUP in one MULTI");
    if let Some(idle) = idle {
        let _: Value = redis::cmd("XCLAIM")
            .arg(stream)
            .arg(group)
            .arg("dead-peer")
            .arg(0)
            .arg(&id)
            .arg("IDLE")
            .arg(idle.as_millis() as u64)
            .arg("JUSTID")
            .query_async(con)
            .await
            .expect("XCLAIM IDLE");
    }
    id
}

pub async fn try_pending_count(con: &mut MultiplexedConnection, stream: &str, group: &str) -> redis::RedisResult<i64> {
    let v: Value = redis::cmd("XPENDING").arg(stream).arg(group).query_async(con).await?;
    Ok(as_int(&as_array(&v)[0]))
}

pub async fn pending_count(con: &mut MultiplexedConnection, stream: &str, group: &str) -> i64 {
    try_pending_count(con, stream, group).await.expect("XPENDING")
}

/// One row of `XPENDING stream group - + N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingEntry {
    pub stream_id: String,
    pub consumer: String,
    pub idle_ms: i64,
    pub deliveries: i64,
}

/// `XPENDING stream group - + 10000`: the group's PEL, up to 10,000 entries.
fn pending_detail(stream: &str, group: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("XPENDING");
    cmd.arg(stream).arg(group).arg("-").arg("+").arg(10_000);
    cmd
}

fn parse_pending(v: &Value) -> Vec<PendingEntry> {
    as_array(v)
        .iter()
        .map(|row| {
            let row = as_array(row);
            PendingEntry {
                stream_id: as_string(&row[0]),
                consumer: as_string(&row[1]),
                idle_ms: as_int(&row[2]),
                deliveries: as_int(&row[3]),
            }
        })
        .collect()
}

pub async fn pending_entries(con: &mut MultiplexedConnection, stream: &str, group: &str) -> Vec<PendingEntry> {
    let v: Value = pending_detail(stream, group).query_async(con).await.expect("XPENDING detail");
    parse_pending(&v)
}

/// The group's PEL and its `last-delivered-id`, read in one MULTI/EXEC, so
/// both describe the same instant. Read one after the other, a consumer's
/// XREADGROUP can run in between: then the id has moved past entries that
/// the PEL read before it does not list yet, and they look read but not
/// pending, i.e. acknowledged.
pub async fn pel_and_last_delivered(
    con: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
) -> (Vec<PendingEntry>, String) {
    let (pending, groups): (Value, Value) = redis::pipe()
        .atomic()
        .add_command(pending_detail(stream, group))
        .cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(con)
        .await
        .expect("MULTI XPENDING, XINFO GROUPS EXEC");
    let all = parse_groups(&groups);
    let last =
        as_string(&all.get(group).unwrap_or_else(|| panic!("no group {group} on {stream}"))["last-delivered-id"]);
    (parse_pending(&pending), last)
}

/// `XINFO GROUPS stream` as one name → (field → value) map per group.
pub async fn groups(con: &mut MultiplexedConnection, stream: &str) -> BTreeMap<String, BTreeMap<String, Value>> {
    let v: Value = redis::cmd("XINFO").arg("GROUPS").arg(stream).query_async(con).await.expect("XINFO GROUPS");
    parse_groups(&v)
}

fn parse_groups(v: &Value) -> BTreeMap<String, BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    for group in as_array(v) {
        let fields: BTreeMap<String, Value> = match group {
            Value::Map(kv) => kv.iter().map(|(k, v)| (as_string(k), v.clone())).collect(),
            other => as_array(other).chunks(2).map(|kv| (as_string(&kv[0]), kv[1].clone())).collect(),
        };
        let name = as_string(&fields["name"]);
        out.insert(name, fields);
    }
    out
}

/// The `last-delivered-id` of a group.
pub async fn last_delivered_id(con: &mut MultiplexedConnection, stream: &str, group: &str) -> String {
    let all = groups(con, stream).await;
    as_string(&all.get(group).unwrap_or_else(|| panic!("no group {group} on {stream}"))["last-delivered-id"])
}

/// `XGROUP CREATE stream group start MKSTREAM`.
pub async fn create_group(con: &mut MultiplexedConnection, stream: &str, group: &str, start: &str) {
    let _: Value = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg(start)
        .arg("MKSTREAM")
        .query_async(con)
        .await
        .expect("XGROUP CREATE");
}

/// Waits until the group has `expected` entries pending; the last count seen.
pub async fn wait_pending(
    con: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
    expected: i64,
    timeout: Duration,
) -> i64 {
    let deadline = Instant::now() + timeout;
    loop {
        let n = try_pending_count(con, stream, group).await.unwrap_or(-1);
        if n == expected || Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads `count` new entries for `group` by hand (XREADGROUP … COUNT) and acks them.
pub async fn read_and_ack(con: &mut MultiplexedConnection, stream: &str, group: &str, count: usize) {
    let reply: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg("reader")
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(con)
        .await
        .expect("XREADGROUP");
    let ids: Vec<String> =
        echomq::redis::parse_read_reply(reply).expect("an XREADGROUP reply").iter().map(|e| e.id.to_string()).collect();
    assert_eq!(ids.len(), count, "read {count}");
    let _: i64 = redis::cmd("XACK").arg(stream).arg(group).arg(&ids).query_async(con).await.expect("XACK");
}

/// One command as Redis' `MONITOR` showed it.
#[derive(Clone, Debug)]
pub struct Monitored {
    /// Run by a script (`MONITOR` says `lua` where a client's address would
    /// be): part of its script's round trip, not one of its own.
    pub in_script: bool,
    /// The command and its arguments, as text (`MONITOR`'s escapes undone,
    /// bytes that are not UTF-8 replaced).
    pub args: Vec<String>,
}

impl Monitored {
    /// Whether its command is `name` (any case).
    pub fn is(&self, name: &str) -> bool {
        self.args.first().is_some_and(|c| c.eq_ignore_ascii_case(name))
    }

    /// Whether any of its arguments after the command is `arg`.
    pub fn names(&self, arg: &str) -> bool {
        self.args.iter().skip(1).any(|a| a == arg)
    }
}

/// Whether `command` is a round trip reading the state of a group of
/// `stream` or of its schedule (`<stream>:scheduled`), as DescribeGroup and
/// the polled gauges read them: one of the commands that state is made of
/// sent on its own, or a script naming the schedule (while nothing is
/// scheduled or due, no other script does).
pub fn reads_group_state(command: &Monitored, stream: &str) -> bool {
    let schedule = format!("{stream}:scheduled");
    let alone = ["XINFO", "XPENDING", "XLEN", "ZCARD", "ZRANGE"].iter().any(|name| command.is(name))
        && (command.names(stream) || command.names(&schedule));
    let script = (command.is("EVALSHA") || command.is("EVAL")) && command.names(&schedule);
    !command.in_script && (alone || script)
}

/// Redis' `MONITOR` feed on a connection of its own: what Redis ran, the
/// commands scripts ran included (tagged), in order. What a test counts
/// round trips with: Redis' side of them, whoever sent them.
pub struct Monitor {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::TcpStream>>,
}

impl Monitor {
    /// Starts monitoring `redis`; returns once Redis confirmed (`+OK`), so
    /// every command after this call is seen.
    pub async fn start(redis: &super::RedisServer) -> Monitor {
        use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
        let mut socket =
            tokio::net::TcpStream::connect(("127.0.0.1", redis.port())).await.expect("connect for MONITOR");
        socket.write_all(b"MONITOR\r\n").await.expect("send MONITOR");
        let mut lines = tokio::io::BufReader::new(socket).lines();
        let ok = tokio::time::timeout(EVENT_TIMEOUT, lines.next_line()).await;
        assert!(matches!(&ok, Ok(Ok(Some(line))) if line == "+OK"), "MONITOR's answer: {ok:?}");
        Monitor { lines }
    }

    /// The commands Redis runs during the next `window`.
    pub async fn commands_for(mut self, window: Duration) -> Vec<Monitored> {
        let deadline = tokio::time::Instant::now() + window;
        let mut seen = Vec::new();
        while let Ok(line) = tokio::time::timeout_at(deadline, self.lines.next_line()).await {
            let line = line.expect("MONITOR's feed").expect("MONITOR's connection stays open");
            seen.extend(parse_monitored(&line));
        }
        seen
    }
}

/// One `MONITOR` line, `+<unix s.µs> [<db> <client address>|lua] "<command>" "<arg>" …`
/// (each quoted as Redis' `sdscatrepr` quotes it); `None` for other lines.
fn parse_monitored(line: &str) -> Option<Monitored> {
    let rest = line.strip_prefix('+')?;
    let (source, quoted) = rest.split_once("] ")?;
    let in_script = source.ends_with(" lua");
    let mut args = Vec::new();
    let mut bytes = quoted.bytes().peekable();
    while let Some(b) = bytes.next() {
        if b != b'"' {
            continue;
        }
        let mut arg = Vec::new();
        while let Some(b) = bytes.next() {
            match b {
                b'"' => break,
                b'\\' => match bytes.next()? {
                    b'n' => arg.push(b'\n'),
                    b'r' => arg.push(b'\r'),
                    b't' => arg.push(b'\t'),
                    b'a' => arg.push(7),
                    b'b' => arg.push(8),
                    b'x' => {
                        let hex = [bytes.next()?, bytes.next()?];
                        arg.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
                    }
                    other => arg.push(other),
                },
                other => arg.push(other),
            }
        }
        args.push(String::from_utf8_lossy(&arg).into_owned());
    }
    (!args.is_empty()).then_some(Monitored { in_script, args })
}

/// How many times Redis ran `command` (`INFO commandstats`; a subcommand as
/// `xinfo|consumers`), calls from scripts included.
pub async fn command_calls(con: &mut MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(con).await.unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines().find_map(|line| line.strip_prefix(&prefix)?.split(',').next()?.parse().ok()).unwrap_or(0)
}
