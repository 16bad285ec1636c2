//! The blocking reader: `XREADGROUP … BLOCK … STREAMS <stream> >` on a
//! connection of its own (never the shared one, whose response timeout would
//! cut a blocked read short while Redis hands it entries), one request at a
//! time, for as many entries as the worker has credit for. The connection is
//! the group's from the reader pool ([`crate::redis::readers`]), taken when
//! the group's first call subscribes, given back when the reader stops.
//!
//! A group with per-key limits reads otherwise (see [`super::keyed`]): with
//! `keyed_read.lua` on the shared connection, which takes new entries
//! (`XREADGROUP` without `BLOCK`: a script cannot block) and registers and
//! gates each keyed one in the same step, so two sidecars reading at once
//! register in stream order. When it reads nothing it answers the stream's
//! last entry id, and the reader waits on its own connection with `XREAD
//! BLOCK … COUNT 1 STREAMS <stream> <that id>`, which returns as soon as
//! anything newer exists (an entry a peer took meanwhile makes a spurious
//! wake: the script then reads nothing), and runs the script once more.

use std::sync::Arc;

use redis::{RedisError, RedisResult, Value};
use tokio::{sync::mpsc, task::JoinHandle};

use super::{keyed::Gate, orders::KeyLimit, Shared};
use crate::{
    id::StreamId,
    redis::{array, bytes, int, parse_entries, parse_stream_id, readers::ReaderConnection, RawEntry},
};

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

/// The reader task and its channels. Dropping it (or [`Reader::stop`]) cuts
/// off a blocked read; a connection cut off mid-read is closed, one between
/// reads goes back to the pool.
pub(crate) struct Reader {
    requests: mpsc::Sender<usize>,
    results: mpsc::Receiver<RedisResult<Read>>,
    task: JoinHandle<()>,
}

impl Reader {
    /// Starts the reader of `group` on `stream` on `conn` (`no_ack`: reads
    /// with NOACK, at-most-once; `keyed`: the group has per-key limits, and
    /// reads with `keyed_read.lua`).
    pub(crate) fn spawn(
        shared: Arc<Shared>,
        conn: ReaderConnection,
        stream: String,
        group: String,
        no_ack: bool,
        keyed: Option<KeyedRead>,
    ) -> Reader {
        let (requests, requests_rx) = mpsc::channel(1);
        let (results_tx, results) = mpsc::channel(1);
        let task = tokio::spawn(read_loop(shared, conn, stream, group, no_ack, keyed, requests_rx, results_tx));
        Reader { requests, results, task }
    }

    /// Asks for up to `count` new entries; false when a read is still under way.
    pub(crate) fn request(&self, count: usize) -> bool {
        self.requests.try_send(count).is_ok()
    }

    /// Cuts off the read under way (its connection is closed), so no entry
    /// appended meanwhile is taken with no call to hand it to.
    pub(crate) fn stop(self) {
        drop(self);
    }
}

impl Drop for Reader {
    /// Also when the worker itself is dropped (aborted on shutdown): a reader
    /// task outliving its worker would hold its connection for nothing.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The next entries of the reader (or its error); never resolves while there
/// is no reader or no reply.
pub(crate) async fn next_read(reader: &mut Option<Reader>) -> RedisResult<Read> {
    if let Some(reader) = reader {
        if let Some(result) = reader.results.recv().await {
            return result;
        }
    }
    std::future::pending().await
}

#[allow(clippy::too_many_arguments)]
async fn read_loop(
    shared: Arc<Shared>,
    mut conn: ReaderConnection,
    stream: String,
    group: String,
    no_ack: bool,
    keyed: Option<KeyedRead>,
    mut requests: mpsc::Receiver<usize>,
    results: mpsc::Sender<RedisResult<Read>>,
) {
    while let Some(count) = requests.recv().await {
        if let Some(keyed) = &keyed {
            let result = keyed_read(&shared, &mut conn, &stream, &group, keyed, count).await;
            if results.send(result).await.is_err() {
                return;
            }
            continue;
        }
        let result = async {
            let mut read = redis::cmd("XREADGROUP");
            read.arg("GROUP")
                .arg(&group)
                .arg(&shared.consumer)
                .arg("COUNT")
                .arg(count)
                .arg("BLOCK")
                .arg(shared.read_block.as_millis() as u64)
                .arg(no_ack.then_some("NOACK"))
                .arg("STREAMS")
                .arg(&stream)
                .arg(">");
            // A connection error leaves `conn` to reconnect before the next read.
            conn.read(&read).await
        }
        .await
        .map(|entries| Read { entries, gates: Vec::new() });
        if results.send(result).await.is_err() {
            return;
        }
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
