//! The blocking reader: `XREADGROUP … BLOCK … STREAMS <stream> >` on a
//! connection of its own (never the shared one, whose response timeout would
//! cut a blocked read short while Redis hands it entries), one request at a
//! time, for as many entries as the worker has credit for. The connection is
//! the group's from the reader pool ([`crate::redis::readers`]), taken when
//! the group's first call subscribes, given back when the reader stops.

use std::sync::Arc;

use redis::{RedisError, RedisResult};
use tokio::{sync::mpsc, task::JoinHandle};

use super::Shared;
use crate::redis::{readers::ReaderConnection, RawEntry};

/// The reader task and its channels. Dropping it (or [`Reader::stop`]) cuts
/// off a blocked read; a connection cut off mid-read is closed, one between
/// reads goes back to the pool.
pub(crate) struct Reader {
    requests: mpsc::Sender<usize>,
    results: mpsc::Receiver<RedisResult<Vec<RawEntry>>>,
    task: JoinHandle<()>,
}

impl Reader {
    /// Starts the reader of `group` on `stream` on `conn` (`no_ack`: reads
    /// with NOACK, at-most-once).
    pub(crate) fn spawn(
        shared: Arc<Shared>,
        conn: ReaderConnection,
        stream: String,
        group: String,
        no_ack: bool,
    ) -> Reader {
        let (requests, requests_rx) = mpsc::channel(1);
        let (results_tx, results) = mpsc::channel(1);
        let task = tokio::spawn(read_loop(shared, conn, stream, group, no_ack, requests_rx, results_tx));
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

/// The group is gone (see [`crate::redis::Fault::NoGroup`]): re-create it.
pub(crate) fn is_group_lost(error: &RedisError) -> bool {
    crate::redis::fault(error) == crate::redis::Fault::NoGroup
}
