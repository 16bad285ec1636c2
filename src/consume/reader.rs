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

use std::{sync::Arc, time::Duration};

use redis::{Cmd, RedisError, RedisResult};
use tokio::{
    sync::{mpsc, Notify},
    task::JoinHandle,
};

use super::Shared;
use crate::redis::{
    readers::ReaderConnection,
    wake::{Ticket, WakeHub},
    RawEntry,
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
    Shared(Arc<WakeHub>),
}

/// The reader task and its channels. Dropping it (or [`Reader::stop`]) cuts
/// off a blocked read; a connection cut off mid-read is closed, one between
/// reads goes back to the pool.
pub(crate) struct Reader {
    requests: mpsc::Sender<usize>,
    results: mpsc::Receiver<RedisResult<Vec<RawEntry>>>,
    /// Ends a shared reader's wait: read now.
    kick: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Reader {
    /// Starts the reader of `group` on `stream`, waiting as `mode` says
    /// (`no_ack`: reads with NOACK, at-most-once).
    pub(crate) fn spawn(shared: Arc<Shared>, mode: Mode, stream: String, group: String, no_ack: bool) -> Reader {
        let (requests, requests_rx) = mpsc::channel(1);
        let (results_tx, results) = mpsc::channel(1);
        let kick = Arc::new(Notify::new());
        let task = match mode {
            Mode::Blocking(conn) => {
                tokio::spawn(read_loop(shared, *conn, stream, group, no_ack, requests_rx, results_tx))
            }
            Mode::Shared(hub) => {
                let target = Target { stream, group, no_ack };
                tokio::spawn(shared_loop(shared, hub, target, requests_rx, results_tx, kick.clone()))
            }
        };
        Reader { requests, results, kick, task }
    }

    /// Asks for up to `count` new entries; false when a read is still under way.
    pub(crate) fn request(&self, count: usize) -> bool {
        self.requests.try_send(count).is_ok()
    }

    /// A shared reader waiting for a wake-up reads now (the next one, if it
    /// is reading): the worker re-created the group, whose entries no
    /// change of the stream announces. Nothing for a blocking reader.
    pub(crate) fn kick(&self) {
        self.kick.notify_one();
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
pub(crate) async fn next_read(reader: &mut Option<Reader>) -> RedisResult<Vec<RawEntry>> {
    if let Some(reader) = reader {
        if let Some(result) = reader.results.recv().await {
            return result;
        }
    }
    std::future::pending().await
}

async fn read_loop(
    shared: Arc<Shared>,
    mut conn: ReaderConnection,
    stream: String,
    group: String,
    no_ack: bool,
    mut requests: mpsc::Receiver<usize>,
    results: mpsc::Sender<RedisResult<Vec<RawEntry>>>,
) {
    while let Some(count) = requests.recv().await {
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
        .await;
        if results.send(result).await.is_err() {
            return;
        }
    }
}

/// What a shared reader reads.
struct Target {
    stream: String,
    group: String,
    no_ack: bool,
}

impl Target {
    /// `XREADGROUP GROUP <group> <consumer> COUNT <count> [NOACK] STREAMS <stream> >`, no BLOCK.
    fn read(&self, consumer: &str, count: usize) -> Cmd {
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(&self.group)
            .arg(consumer)
            .arg("COUNT")
            .arg(count)
            .arg(self.no_ack.then_some("NOACK"))
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">");
        read
    }
}

/// The shared reader (see the module doc): reports entries and errors, never
/// an empty read.
async fn shared_loop(
    shared: Arc<Shared>,
    hub: Arc<WakeHub>,
    target: Target,
    mut requests: mpsc::Receiver<usize>,
    results: mpsc::Sender<RedisResult<Vec<RawEntry>>>,
    kick: Arc<Notify>,
) {
    // Taken before a read that left the group at the stream's end.
    let mut at_end: Option<Ticket> = None;
    while let Some(count) = requests.recv().await {
        let read = target.read(&shared.consumer, count);
        if let Some(ticket) = at_end.take() {
            wait(&ticket, &kick, SAFETY_REREAD).await;
        }
        let result = loop {
            // Armed before the read: an XADD after it is sure to wake us.
            let ticket = hub.arm(&target.stream).await;
            let result = match shared.readers.acquire_for_read().await {
                Ok(mut conn) => conn.read(&read).await,
                Err(e) => Err(e),
            };
            match (result, ticket) {
                (Ok(entries), Ok(ticket)) if entries.is_empty() => wait(&ticket, &kick, SAFETY_REREAD).await,
                // No wake connection: poll.
                (Ok(entries), Err(_)) if entries.is_empty() => {
                    let _ = tokio::time::timeout(shared.read_block, kick.notified()).await;
                }
                (Ok(entries), ticket) => {
                    if entries.len() < count {
                        at_end = ticket.ok();
                    }
                    break Ok(entries);
                }
                (Err(e), _) => break Err(e),
            }
        };
        if results.send(result).await.is_err() {
            return;
        }
    }
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
