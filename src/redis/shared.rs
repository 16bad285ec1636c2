//! The shared connection to a single server, and what happens when Redis
//! stops answering on it.
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

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tracing::warn;

/// The shared connection to a single server: a [`ConnectionManager`],
/// replaced by a new one after a command's response timeout (see the module
/// doc). Cheap to clone: every clone shares the current connection.
#[derive(Clone)]
pub struct SharedConnection {
    /// The connection in use and its generation (bumped at each replacement,
    /// so a timeout replaces only the connection it happened on).
    current: Arc<Mutex<(u64, ConnectionManager)>>,
    /// What a replacement is made from (shared: the connection is cloned per command).
    recipe: Arc<(Client, ConnectionManagerConfig)>,
    /// The response timeout, for the log line.
    timeout: Duration,
    db: i64,
}

impl SharedConnection {
    /// Connects to `client`'s server with `config` (whose response timeout,
    /// `timeout`, is what retires a silent connection).
    ///
    /// Errors: as [`ConnectionManager::new_with_config`] (Redis unreachable,
    /// refused credentials).
    pub async fn connect(client: Client, config: ConnectionManagerConfig, timeout: Duration) -> RedisResult<Self> {
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        let db = manager.get_db();
        let recipe = Arc::new((client, config));
        Ok(SharedConnection { current: Arc::new(Mutex::new((0, manager))), recipe, timeout, db })
    }

    /// The connection in use and its generation.
    fn current(&self) -> (u64, ConnectionManager) {
        let guard = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        (guard.0, guard.1.clone())
    }

    /// After `result` came from generation `generation`: retires that
    /// connection if `result` is a response timeout and it is still in use.
    fn after<T>(&self, generation: u64, result: &RedisResult<T>) {
        let Err(error) = result else { return };
        if !error.is_timeout() {
            return;
        }
        let mut guard = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.0 != generation {
            return;
        }
        let (client, config) = &*self.recipe;
        match ConnectionManager::new_lazy_with_config(client.clone(), config.clone()) {
            Ok(fresh) => {
                *guard = (generation + 1, fresh);
                warn!(
                    timeout_ms = self.timeout.as_millis() as u64,
                    "Redis did not answer a command in time: the shared connection is replaced by a new one"
                );
            }
            // Only a configuration the first connection already passed can fail here.
            Err(e) => warn!("Redis did not answer a command in time, and no new connection could be made: {e}"),
        }
    }
}

impl ConnectionLike for SharedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.current();
            let result = conn.req_packed_command(cmd).await;
            self.after(generation, &result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.current();
            let result = conn.req_packed_commands(pipeline, offset, count).await;
            self.after(generation, &result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}
