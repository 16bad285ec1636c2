//! The shared connection to a single server, and what happens when Redis
//! stops answering on it or stops being the primary.
//!
//! redis-rs' [`ConnectionManager`] reconnects when the connection closes or
//! breaks, but not after a response timeout: a connection whose peer went
//! silent (a black-holed network, a stalled or frozen Redis) stays open, and
//! every command on it waits its whole timeout, for as long as the silence
//! lasts. Worse, a multiplexed connection matches replies to requests by
//! order: if requests vanished on the way (a proxy that dropped them), the
//! first reply after the silence would be matched to a request that gave up
//! long ago, and every later reply to the wrong request.
//!
//! So a command that gets no reply within the response timeout retires the
//! connection it used: the next command goes out on a fresh one (connected
//! lazily, with the manager's retries). One timeout, one replacement: the
//! callers that waited on the same silent connection meanwhile do not each
//! replace the new one. Commands already in flight on the retired connection
//! finish or time out there.
//!
//! Nor does it reconnect after Redis refused its credentials: an ACL user
//! deleted (which closes its connections) and re-created, or a password
//! set again, leaves the manager holding the failed reconnection's error for
//! good, since it reconnects only after I/O errors. So a command refused its
//! credentials (`WRONGPASS`, `NOAUTH`) also retires the connection: the next
//! command tries the configured credentials afresh, with the password file
//! read again ([`super::credentials`]).
//!
//! Nor does it notice that its server stopped being the primary: it would
//! keep sending writes that answer `READONLY`. That is [`Primary`]'s to
//! notice; here, a command made while the primary is changing fails at once,
//! a command in flight when a switch begins is given up at once (its outcome
//! unknown, as after a timeout), and the first command after a switch goes
//! out on a new connection to the new primary (see [`super::primary`]).

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex, PoisonError,
};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tracing::warn;

use super::{fault::refuses_credentials, primary::Primary};

/// The shared connection to a single server: a [`ConnectionManager`] to the
/// primary, replaced by a new one after a command's response timeout and
/// after a switch of primary (see the module doc). Cheap to clone: every
/// clone shares the current connection.
#[derive(Clone)]
pub struct SharedConnection {
    current: Arc<Mutex<Current>>,
    /// Where the primary is, and the switches.
    primary: Arc<Primary>,
    /// How each connection is made (shared: the connection is cloned per command).
    config: Arc<ConnectionManagerConfig>,
    /// The response timeout, for the log line.
    timeout: Duration,
    db: i64,
    /// Redis refused the credentials and it was logged: said once per
    /// refusal, not once per replacement, until a command succeeds.
    refusal_logged: Arc<AtomicBool>,
}

/// The connection in use.
struct Current {
    /// Bumped at each replacement, so a timeout replaces only the connection
    /// it happened on.
    replacement: u64,
    /// The primary's generation the connection was made at.
    generation: u64,
    manager: ConnectionManager,
    /// When a refusal of the credentials last replaced the connection: the
    /// next refusal replaces it only [`REFUSED_RETRY`] later, so a burst of
    /// commands is not a burst of connections and AUTHs.
    refused_at: Option<Instant>,
}

/// The least time between two new connections after Redis refused the
/// credentials (until it accepts them, commands fail at once meanwhile).
const REFUSED_RETRY: Duration = Duration::from_secs(1);

impl SharedConnection {
    /// Connects to `primary` with `config` (whose response timeout,
    /// `timeout`, is what retires a silent connection).
    ///
    /// Errors: as [`ConnectionManager::new_with_config`] (Redis unreachable,
    /// refused credentials); the primary is changing.
    pub async fn connect(
        primary: Arc<Primary>,
        config: ConnectionManagerConfig,
        timeout: Duration,
    ) -> RedisResult<Self> {
        let (generation, client) = primary.connectable()?;
        let manager = ConnectionManager::new_with_config(client, config.clone()).await?;
        let db = manager.get_db();
        let current = Arc::new(Mutex::new(Current { replacement: 0, generation, manager, refused_at: None }));
        let refusal_logged = Arc::new(AtomicBool::new(false));
        Ok(SharedConnection { current, primary, config: Arc::new(config), timeout, db, refusal_logged })
    }

    /// The connection to use now, its replacement number and generation; a
    /// new one (connected lazily) when the primary switched since the last.
    ///
    /// Errors: the primary is changing ([`super::primary::primary_changing`]).
    fn current(&self) -> RedisResult<(u64, u64, ConnectionManager)> {
        let mut guard = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.generation != self.primary.generation() || self.primary.is_switching() {
            // Errs while a switch is under way: nothing goes out to a node that may be a replica.
            let (generation, client) = self.primary.connectable()?;
            if guard.generation != generation {
                guard.manager = ConnectionManager::new_lazy_with_config(client, (*self.config).clone())?;
                guard.generation = generation;
                guard.replacement += 1;
            }
        }
        Ok((guard.replacement, guard.generation, guard.manager.clone()))
    }

    /// After `result` came from replacement `replacement`: retires that
    /// connection if `result` is a response timeout or refused credentials
    /// and it is still in use.
    fn after<T>(&self, replacement: u64, result: &RedisResult<T>) {
        let error = match result {
            Ok(_) => {
                if self.refusal_logged.load(Ordering::Relaxed) {
                    self.refusal_logged.store(false, Ordering::Relaxed);
                }
                return;
            }
            Err(error) => error,
        };
        let refused = refuses_credentials(error);
        if !(error.is_timeout() || refused) {
            return;
        }
        let mut guard = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.replacement != replacement {
            return;
        }
        if refused {
            let now = Instant::now();
            if guard.refused_at.is_some_and(|at| now < at + REFUSED_RETRY) {
                return;
            }
            guard.refused_at = Some(now);
            // A rotated password (see `super::credentials`) is read before the new connection.
            self.primary.credentials_refused();
        }
        let client = self.primary.state().client;
        match ConnectionManager::new_lazy_with_config(client, (*self.config).clone()) {
            Ok(fresh) => {
                guard.manager = fresh;
                guard.replacement += 1;
                if !refused {
                    warn!(
                        timeout_ms = self.timeout.as_millis() as u64,
                        "Redis did not answer a command in time: the shared connection is replaced by a new one"
                    );
                } else if !self.refusal_logged.swap(true, Ordering::Relaxed) {
                    warn!("Redis refused the sidecar's credentials ({error}); reconnecting with them until it accepts them again");
                }
            }
            // Only a configuration the first connection already passed can fail here.
            Err(e) => warn!("the shared connection could not be replaced after `{error}`: {e}"),
        }
    }
}

impl ConnectionLike for SharedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (replacement, generation, mut conn) = self.current()?;
            let this = &*self;
            let sent = async {
                let result = conn.req_packed_command(cmd).await;
                this.after(replacement, &result);
                result
            };
            this.primary.run(generation, sent).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (replacement, generation, mut conn) = self.current()?;
            let this = &*self;
            let sent = async {
                let result = conn.req_packed_commands(pipeline, offset, count).await;
                this.after(replacement, &result);
                result
            };
            this.primary.run(generation, sent).await
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}
