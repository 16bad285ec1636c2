//! Wake-ups for shared readers: one connection per sidecar that Redis tells
//! when a stream changed, instead of one connection per group blocked in
//! `XREADGROUP … BLOCK`.
//!
//! The [`WakeHub`] holds one RESP3 connection to the primary of a single
//! server, named `echomq-wake` (`CLIENT SETNAME`), with server-assisted
//! client tracking on (`CLIENT TRACKING ON`, the default mode: no `BCAST`).
//! Redis then remembers each key this connection reads with a read-only
//! command and, when the key is next modified (`XADD`, `DEL`, `XTRIM`, a
//! flush…), sends one `invalidate` push for it and forgets it; an
//! `invalidate` with no key (null) is a flush and means every key.
//!
//! A group reader ([`crate::consume`]) does, per read:
//! 1. `ticket = hub.arm(stream)`: the ticket takes the key's generation
//!    (a counter kept here); if the key is not armed (no read of it is
//!    tracked since its last invalidation), the hub runs `XLEN <stream>` on
//!    the tracking connection and awaits the reply, so Redis now tracks the
//!    key for this connection;
//! 2. one non-blocking `XREADGROUP … STREAMS <stream> >` on a pooled
//!    connection ([`super::readers`]);
//! 3. when it found nothing: `ticket.wait()`, which resolves once the key's
//!    generation moved past the ticket's.
//!
//! An `invalidate` for a key disarms it, bumps its generation and wakes its
//! waiters. The connection's loss (redis-rs' `Disconnection` push, an error
//! or timeout of the `XLEN`, its push channel closing) or a switch of primary
//! disarms every key and bumps every generation: every waiter wakes and reads
//! again, and the next arm connects anew (with a backoff: while it cannot,
//! [`WakeHub::arm`] fails and the reader polls every `--read-block-ms`
//! instead, slower but losing nothing).
//!
//! # Why no wake is lost
//!
//! The reader arms *before* each read. Take an `XADD` that executes after the
//! read did (one that executed before it, the read returned). At the arm,
//! either
//! - the hub ran `XLEN` and awaited its reply: the key was tracked for this
//!   connection before the read executed, so before the `XADD`; or
//! - the key was armed: its tracking was registered earlier and no
//!   invalidation of it had been *processed* when the ticket took the
//!   generation. Either no invalidation was sent since (the registration is
//!   still live, so the `XADD` sends one), or one was sent and not yet
//!   processed: its processing bumps the generation past the ticket's, so the
//!   wait returns at once. A spurious wake, never a lost one.
//!
//! So the `XADD` (or something before it) sends an `invalidate` after the
//! ticket was taken, which bumps the generation, and the wait returns. A key
//! is marked armed only when its generation did not move between sending the
//! `XLEN` and its reply: an invalidation processed meanwhile (a push may be
//! handled before or after the reply it follows) may have consumed that very
//! registration, so the next arm registers again. The connection's loss bumps
//! everything, so a registration on a dead connection is never counted on.
//!
//! What tracking does not see: a change that does not modify the key (an
//! operator's `XGROUP SETID`, `XGROUP DESTROY`). The reader re-reads anyway
//! every [`crate::consume`] safety period, and the worker wakes its reader
//! itself after it re-created a lost group. Per-node wake connections for a
//! Redis Cluster are future work: there the readers block as before.
//!
//! Memory: one small entry (about 100 bytes) per key with a ticket out or
//! armed; an entry without tickets goes at its key's next invalidation or
//! the connection's loss, so there are at most as many as streams read.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, Weak,
    },
    time::{Duration, Instant},
};

use redis::{aio::MultiplexedConnection, AsyncConnectionConfig, PushInfo, PushKind, RedisError, RedisResult, Value};
use tokio::sync::{mpsc, Notify};
use tracing::{debug, info, warn};

use super::{fault::refuses_credentials, primary::Primary};

/// The name the wake connection gives itself (`CLIENT SETNAME`).
pub const WAKE_CLIENT_NAME: &str = "echomq-wake";

/// The first pause before connecting again after a failed connect.
const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest pause between two connects.
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The wake hub of a sidecar on a single server (see the module doc). Cheap
/// to share (`Arc`).
pub struct WakeHub {
    /// Itself, for the tasks it starts (which must not keep it alive).
    me: Weak<WakeHub>,
    primary: Arc<Primary>,
    /// Bounds connecting and each `XLEN`.
    timeout: Duration,
    state: Mutex<State>,
    /// Held while connecting, so concurrent arms make one connection.
    connecting: tokio::sync::Mutex<Backoff>,
    /// An `XLEN` was refused NOPERM (warned once).
    refused: AtomicBool,
}

/// What the hub knows, under one lock.
#[derive(Default)]
struct State {
    /// Keys with a ticket out, and armed keys (so the next read of a key
    /// armed earlier needs no `XLEN`); an armed key without tickets goes at
    /// its invalidation, or with the link.
    keys: HashMap<String, Key>,
    /// The tracking connection, while it is up.
    link: Option<Link>,
    /// Numbers the links, so a late push or error of an old one is ignored.
    links_made: u64,
}

/// One key's wake state.
struct Key {
    /// Bumped by each invalidation of the key, and by the connection's loss.
    generation: u64,
    /// Redis tracks the key for the current link and no invalidation of it
    /// was processed since.
    armed: bool,
    /// Tickets out for it; the entry goes with the last unless armed.
    tickets: usize,
    notify: Arc<Notify>,
}

#[derive(Clone)]
struct Link {
    id: u64,
    conn: MultiplexedConnection,
    /// The primary's generation it was made at.
    generation: u64,
}

/// When the next connect may be tried.
#[derive(Default)]
struct Backoff {
    retry_at: Option<Instant>,
    pause: Duration,
    /// The last failure, returned to arms until `retry_at`.
    last: Option<String>,
}

impl WakeHub {
    /// Connects the tracking connection to `primary`'s node (within
    /// `timeout`, which also bounds each `XLEN`) and starts following the
    /// primary: a switch drops the connection and wakes every waiter.
    ///
    /// Errors: connecting failed, or the server refused `HELLO 3` (RESP3:
    /// Redis before 6, some proxies) or `CLIENT TRACKING ON` (an ACL without
    /// `client|tracking`): [`refuses_tracking`] tells those apart.
    pub async fn start(primary: Arc<Primary>, timeout: Duration) -> RedisResult<Arc<WakeHub>> {
        let hub = WakeHub::unconnected(primary, timeout);
        hub.link().await?;
        Ok(hub)
    }

    /// As [`WakeHub::start`], connecting on the first [`WakeHub::arm`] instead.
    pub fn unconnected(primary: Arc<Primary>, timeout: Duration) -> Arc<WakeHub> {
        let hub = Arc::new_cyclic(|me| WakeHub {
            me: me.clone(),
            primary,
            timeout,
            state: Mutex::default(),
            connecting: tokio::sync::Mutex::default(),
            refused: AtomicBool::new(false),
        });
        tokio::spawn(follow_primary(Arc::downgrade(&hub), hub.primary.watch()));
        hub
    }

    /// A ticket for `stream`'s next change (see the module doc): runs
    /// `XLEN <stream>` on the tracking connection first unless the key is
    /// armed. A waiter must arm before the read whose emptiness it waits on.
    ///
    /// Errors: the tracking connection is down and cannot be made now (or
    /// within the reconnect backoff: the last failure again), or the `XLEN`
    /// failed or timed out (a connection error drops the connection and
    /// wakes every waiter). The caller then polls instead.
    pub async fn arm(self: &Arc<Self>, stream: &str) -> RedisResult<Ticket> {
        let (ticket, armed) = {
            let mut state = self.state.lock().expect("wake state lock");
            let key = state.keys.entry(stream.to_owned()).or_insert_with(|| Key {
                generation: 0,
                armed: false,
                tickets: 0,
                notify: Arc::default(),
            });
            key.tickets += 1;
            let ticket = Ticket {
                hub: self.clone(),
                key: stream.to_owned(),
                generation: key.generation,
                notify: key.notify.clone(),
            };
            (ticket, key.armed && state.link.is_some())
        };
        if armed {
            return Ok(ticket);
        }
        let mut link = self.link().await?;
        let mut xlen = redis::cmd("XLEN");
        xlen.arg(stream);
        let reply = tokio::time::timeout(self.timeout, xlen.query_async::<Value>(&mut link.conn)).await;
        match reply {
            Ok(Ok(_)) => {
                let mut state = self.state.lock().expect("wake state lock");
                let current = state.link.as_ref().is_some_and(|now| now.id == link.id);
                if let Some(key) = state.keys.get_mut(stream) {
                    // Moved meanwhile: that invalidation may have used up this registration.
                    if current && key.generation == ticket.generation {
                        key.armed = true;
                    }
                }
                Ok(ticket)
            }
            // WRONGTYPE and the like: the connection is fine, the key is not armed.
            Ok(Err(e)) if !is_connection_error(&e) => {
                if super::fault(&e) == super::Fault::NoPermission && !self.refused.swap(true, Ordering::Relaxed) {
                    warn!(stream, "the wake connection may not run XLEN ({e}): readers of such streams poll every --read-block-ms instead of waiting for a wake-up; grant +xlen, or set --shared-readers off");
                }
                Err(e)
            }
            Ok(Err(e)) => {
                self.lost(link.id, &format!("XLEN failed: {e}"));
                Err(e)
            }
            Err(_) => {
                self.lost(link.id, "XLEN timed out");
                Err(super::resp::timed_out())
            }
        }
    }

    /// The tracking connection, made now if there is none (or it reaches a
    /// primary that was replaced), unless the last connect failed within
    /// the backoff.
    async fn link(&self) -> RedisResult<Link> {
        if let Some(link) = self.current_link() {
            return Ok(link);
        }
        let mut backoff = self.connecting.lock().await;
        if let Some(link) = self.current_link() {
            return Ok(link);
        }
        if let (Some(at), Some(last)) = (backoff.retry_at, &backoff.last) {
            if Instant::now() < at {
                return Err(RedisError::from((redis::ErrorKind::Io, "the wake connection is down", last.clone())));
            }
        }
        // Boxed: connecting is rare, and inline its state would be room
        // kept in every shared read waiting for a wake-up (through `arm`).
        match Box::pin(self.connect()).await {
            Ok(link) => {
                *backoff = Backoff::default();
                Ok(link)
            }
            Err(e) => {
                backoff.pause = (backoff.pause * 2).clamp(RECONNECT_BACKOFF_MIN, RECONNECT_BACKOFF_MAX);
                backoff.retry_at = Some(Instant::now() + backoff.pause);
                backoff.last = Some(e.to_string());
                debug!("the wake connection could not be made ({e}); readers poll until it is");
                Err(e)
            }
        }
    }

    /// The link, if it is up and reaches the current primary; one that
    /// reaches an old primary is dropped (waking everyone).
    fn current_link(&self) -> Option<Link> {
        let generation = self.primary.generation();
        let stale = {
            let state = self.state.lock().expect("wake state lock");
            match &state.link {
                Some(link) if link.generation == generation => return Some(link.clone()),
                Some(link) => link.id,
                None => return None,
            }
        };
        self.lost(stale, "the primary switched");
        None
    }

    /// Makes the tracking connection: RESP3 with a push channel, named,
    /// tracking on; starts the task that handles its pushes.
    async fn connect(&self) -> RedisResult<Link> {
        let (generation, client) = self.primary.connectable_as(redis::ProtocolVersion::RESP3)?;
        let (pushes, pushed) = mpsc::unbounded_channel();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_push_sender(pushes);
        let mut conn = client.get_multiplexed_async_connection_with_config(&config).await.inspect_err(|e| {
            if refuses_credentials(e) {
                self.primary.credentials_refused();
            }
        })?;
        let mut naming = redis::cmd("CLIENT");
        naming.arg("SETNAME").arg(WAKE_CLIENT_NAME);
        match tokio::time::timeout(self.timeout, naming.query_async::<Value>(&mut conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if !is_connection_error(&e) => {
                debug!("the wake connection could not name itself ({e}); it tracks all the same")
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(super::resp::timed_out()),
        }
        let mut tracking = redis::cmd("CLIENT");
        tracking.arg("TRACKING").arg("ON");
        tokio::time::timeout(self.timeout, tracking.query_async::<Value>(&mut conn))
            .await
            .map_err(|_| super::resp::timed_out())??;
        let link = {
            let mut state = self.state.lock().expect("wake state lock");
            state.links_made += 1;
            let link = Link { id: state.links_made, conn, generation };
            state.link = Some(link.clone());
            link
        };
        tokio::spawn(handle_pushes(self.me.clone(), link.id, pushed));
        debug!(link = link.id, "the wake connection is up, tracking the streams read");
        Ok(link)
    }

    /// Redis said `keys` changed (`None`: a flush, every key).
    fn invalidated(&self, keys: Option<Vec<Vec<u8>>>) {
        let mut state = self.state.lock().expect("wake state lock");
        match keys {
            None => wake_all(&mut state),
            Some(keys) => {
                for key in keys {
                    let Ok(key) = String::from_utf8(key) else { continue };
                    if let Some(entry) = state.keys.get_mut(&key) {
                        wake(entry);
                        if entry.tickets == 0 {
                            state.keys.remove(&key);
                        }
                    }
                }
            }
        }
    }

    /// The link `id` is gone (`why`): forget it, disarm and wake everything.
    /// Nothing when a newer link replaced it already.
    fn lost(&self, id: u64, why: &str) {
        let mut state = self.state.lock().expect("wake state lock");
        if state.link.as_ref().is_none_or(|link| link.id != id) {
            return;
        }
        state.link = None;
        wake_all(&mut state);
        info!("the wake connection is gone ({why}); every reader reads again, and it reconnects on the next read");
    }

    /// Drops the tracking connection, if up, as if it were lost (`why` is
    /// logged): every waiter reads again, and the next arm connects anew.
    /// For after Redis went silent: TCP keeps a push sent into a stall or a
    /// black hole, but a connection that silently died meanwhile (a
    /// half-open one) would never deliver another, and the readers of armed
    /// keys would wait for the safety re-read.
    pub fn renew(&self, why: &str) {
        let current = self.state.lock().expect("wake state lock").link.as_ref().map(|link| link.id);
        if let Some(id) = current {
            self.lost(id, why);
        }
    }

    /// Gives a ticket's hold on its key back.
    fn release(&self, key: &str) {
        let mut state = self.state.lock().expect("wake state lock");
        if let Some(entry) = state.keys.get_mut(key) {
            entry.tickets -= 1;
            if entry.tickets == 0 && !entry.armed {
                state.keys.remove(key);
            }
        }
    }
}

/// A claim on a key's next change, from [`WakeHub::arm`]. Holding it keeps
/// the key's wake state; dropping it gives that back.
pub struct Ticket {
    hub: Arc<WakeHub>,
    key: String,
    generation: u64,
    notify: Arc<Notify>,
}

impl Ticket {
    /// Whether the key changed (or the connection was lost) since the ticket
    /// was taken: a wait would return at once.
    pub fn fired(&self) -> bool {
        let state = self.hub.state.lock().expect("wake state lock");
        state.keys.get(&self.key).is_none_or(|key| key.generation != self.generation)
    }

    /// Resolves once the key's generation moved past the ticket's: an
    /// `invalidate` for it, a flush, the connection's loss or a switch of
    /// primary. Cancel-safe.
    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check: a bump between the two still wakes it.
            notified.as_mut().enable();
            if self.fired() {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.hub.release(&self.key);
    }
}

/// Bumps a key's generation, disarms it and wakes its waiters.
fn wake(key: &mut Key) {
    key.generation += 1;
    key.armed = false;
    key.notify.notify_waiters();
}

/// Wakes every key (a flush, the link's loss); armed keys without tickets go.
fn wake_all(state: &mut State) {
    state.keys.retain(|_, key| {
        wake(key);
        key.tickets > 0
    });
}

/// Handles link `id`'s pushes: invalidations wake their keys; a
/// disconnection, or the channel's end, loses the link.
async fn handle_pushes(hub: Weak<WakeHub>, id: u64, mut pushed: mpsc::UnboundedReceiver<PushInfo>) {
    while let Some(push) = pushed.recv().await {
        let Some(hub) = hub.upgrade() else { return };
        match push.kind {
            PushKind::Invalidate => hub.invalidated(invalidated_keys(&push.data)),
            PushKind::Disconnection => return hub.lost(id, "Redis closed it"),
            _ => {}
        }
    }
    if let Some(hub) = hub.upgrade() {
        hub.lost(id, "its connection ended");
    }
}

/// The keys of an `invalidate` push's data (`[[key, …]]`); `None` for a
/// flush (`[null]`).
fn invalidated_keys(data: &[Value]) -> Option<Vec<Vec<u8>>> {
    match data.first() {
        Some(Value::Array(keys)) | Some(Value::Set(keys)) => {
            Some(keys.iter().filter_map(|key| super::reply::bytes(key).ok()).collect())
        }
        _ => None,
    }
}

/// Drops the link at each change of the primary (a switch starting or
/// ending), waking every waiter; ends with the hub.
async fn follow_primary(hub: Weak<WakeHub>, mut states: tokio::sync::watch::Receiver<super::primary::PrimaryState>) {
    while states.changed().await.is_ok() {
        let Some(hub) = hub.upgrade() else { return };
        let id = hub.state.lock().expect("wake state lock").link.as_ref().map(|link| link.id);
        if let Some(id) = id {
            hub.lost(id, "the primary is switching");
        }
    }
}

/// Whether `error` says the connection itself failed (as opposed to Redis
/// refusing one command).
fn is_connection_error(error: &RedisError) -> bool {
    error.is_io_error() || error.is_timeout() || error.is_connection_dropped() || error.is_connection_refusal()
}

/// Whether `error` (from [`WakeHub::start`]) is the server refusing what
/// shared readers need, for good: `HELLO 3` or `CLIENT TRACKING` unknown or
/// not permitted. Anything else (Redis unreachable now, a timeout) may pass.
pub fn refuses_tracking(error: &RedisError) -> bool {
    !is_connection_error(error) && !refuses_credentials(error) && error.code().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalidate_push_names_its_keys_or_a_flush() {
        let keys = Value::Array(vec![Value::BulkString(b"orders".to_vec()), Value::BulkString(b"s:2".to_vec())]);
        assert_eq!(invalidated_keys(&[keys]), Some(vec![b"orders".to_vec(), b"s:2".to_vec()]));
        assert_eq!(invalidated_keys(&[Value::Nil]), None, "null: a flush, every key");
        assert_eq!(invalidated_keys(&[]), None);
    }

    #[test]
    fn only_a_refusal_by_the_server_turns_shared_readers_off() {
        let reply = |text: &[u8]| redis::parse_redis_value(text).and_then(Value::extract_error).unwrap_err();
        let noperm = reply(b"-NOPERM this user has no permissions to run the 'client|tracking' command\r\n");
        assert!(refuses_tracking(&noperm), "{noperm}");
        let unknown = reply(b"-ERR unknown command 'HELLO', with args beginning with: '3'\r\n");
        assert!(refuses_tracking(&unknown), "{unknown}");
        let unreachable: RedisError = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused").into();
        assert!(!refuses_tracking(&unreachable), "Redis unreachable a moment: keep shared readers");
        assert!(!refuses_tracking(&super::super::resp::timed_out()));
    }
}
