//! Which server is the primary, and moving every connection when it changes.
//!
//! Production Redis changes primary: Sentinel promotes a replica, a managed
//! service swaps roles behind one DNS name. A connection left open to a
//! primary that became a replica answers every write `READONLY` for good, so
//! the sidecar must notice and move, and must never retry against a replica.
//!
//! [`Primary`] holds where the primary is now (a redis-rs [`Client`]) and a
//! generation, bumped at each switch. Every connection to a single server is
//! made from it and remembers the generation it was made at: the shared
//! connection ([`super::SharedConnection`]), the group readers
//! ([`super::readers`]) and every dedicated connection ([`super::Redis::dedicated`]).
//! A connection older than the current generation is replaced before its
//! next command; a reader blocked on it is cut off.
//!
//! A switch starts when any connection sees a reply that only a node that is
//! no longer the primary gives ([`Fault::NotPrimary`]: `READONLY`,
//! `UNBLOCKED … master -> replica`, `LOADING`, `MASTERDOWN`), when readiness'
//! `ROLE` says `slave`, or, with Sentinel, when the Sentinels name another
//! primary (asked every [`SENTINEL_POLL`]). While it lasts, commands fail at
//! once with UNAVAILABLE saying the primary is changing (nothing is sent to a
//! replica), readiness is NOT_SERVING, and one task looks for the primary
//! ([`Locator::locate`]): the address again (re-resolved; `ROLE` must say
//! `master` and `PING` must answer), or the primary the Sentinels name,
//! confirmed the same way. Found, it bumps the generation and the switch is
//! over: every connection moves on its next command, and the consume workers
//! recover their own pending entries ([`Primary::watch`]).

use std::{
    fmt,
    sync::{Arc, Weak},
    time::Duration,
};

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};
use redis::{
    aio::MultiplexedConnection, AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, ErrorKind,
    IntoConnectionInfo, RedisError, RedisResult, Value,
};
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use super::{
    credentials::PasswordFile,
    fault::{fault, Fault},
    reply::RawEntry,
};

/// How often the Sentinels are asked which node is the primary, besides
/// every error that says the node reached is not.
pub const SENTINEL_POLL: Duration = Duration::from_secs(1);
/// How long the other Sentinels may take to answer once one has named a
/// primary: their answer may be of a newer failover; one that is stalled
/// is skipped after this, not after the whole timeout.
pub const SENTINEL_GRACE: Duration = Duration::from_millis(250);
/// The first pause between two looks for the primary during a switch; it
/// doubles up to [`LOCATE_BACKOFF_MAX`].
const LOCATE_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest pause between two looks for the primary.
const LOCATE_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// The Sentinel port when a Sentinel URL names a host without one.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// Where the primary is now: a connection made from [`PrimaryState::client`]
/// reaches it, unless a switch is under way.
#[derive(Clone)]
pub struct PrimaryState {
    /// Bumped each time a switch ends: a connection made at an older one is
    /// replaced before its next command.
    pub generation: u64,
    /// Makes connections to the primary (credentials, database, TLS).
    pub client: Client,
    /// Why a switch is under way (`None`: none is): commands fail at once.
    pub switching: Option<String>,
}

/// The primary of a single-server deployment, followed through failovers
/// (see the module doc). Shared by every connection; cheap to read.
pub struct Primary {
    locator: Locator,
    /// `--redis-password-file`, read again when Redis refuses the password
    /// in use ([`Primary::credentials_refused`]); `None` without the flag.
    password_file: Option<PasswordFile>,
    state: watch::Sender<PrimaryState>,
    /// Wakes the task that looks for the primary when a switch starts.
    wake: Arc<Notify>,
    /// The switches counted, one under way shown.
    metrics: PrimaryMetrics,
}

/// The primary's series (`echomq_redis_primary_*`). Cheap to clone.
#[derive(Clone)]
pub struct PrimaryMetrics {
    /// `echomq_redis_primary_switches_total`: switches that ended with a primary found.
    switches: Counter,
    /// `echomq_redis_primary_switching`: 1 while a switch is under way.
    switching: Gauge,
}

impl PrimaryMetrics {
    /// Creates the series and registers them in `registry` (the `echomq_` one).
    pub fn register(registry: &mut Registry) -> PrimaryMetrics {
        let metrics = PrimaryMetrics { switches: Counter::default(), switching: Gauge::default() };
        registry.register(
            "redis_primary_switches",
            "Switches of the Redis primary the sidecar followed (a failover, a primary demoted behind its address); \
             each ended with every connection moved to the new primary",
            metrics.switches.clone(),
        );
        registry.register(
            "redis_primary_switching",
            "1 while the sidecar looks for the Redis primary (commands are refused, not ready), else 0",
            metrics.switching.clone(),
        );
        metrics
    }
}

impl Primary {
    /// Finds the primary (`locator`, every step within `timeout`) and starts
    /// the task that follows it. Connects nothing that stays open. Counts
    /// the switches in `metrics` and shows one under way there.
    ///
    /// Errors: as [`Locator::locate`]; with Sentinel, an error of kind
    /// `InvalidClientConfig` when no Sentinel answers or none knows the
    /// master name (a setting to fix: the sidecar exits 2, naming them).
    /// `password_file` is read again when Redis refuses the password.
    pub async fn start(
        locator: Locator,
        password_file: Option<PasswordFile>,
        timeout: Duration,
        metrics: PrimaryMetrics,
    ) -> RedisResult<Arc<Primary>> {
        let client = locator.locate(timeout).await.map_err(|failure| failure.at_start())?;
        let wake = Arc::new(Notify::new());
        let primary = Arc::new(Primary {
            locator,
            password_file,
            state: watch::Sender::new(PrimaryState { generation: 0, client, switching: None }),
            wake: wake.clone(),
            metrics,
        });
        tokio::spawn(follow(Arc::downgrade(&primary), wake, timeout));
        if let Locator::Sentinel(sentinels) = &primary.locator {
            for sentinel in &sentinels.sentinels {
                let master = sentinels.master.clone();
                tokio::spawn(listen(Arc::downgrade(&primary), sentinel.clone(), master, timeout));
            }
        }
        Ok(primary)
    }

    /// The primary now.
    pub fn state(&self) -> PrimaryState {
        self.state.borrow().clone()
    }

    /// The current generation, without cloning the client: what every command
    /// checks its connection against.
    pub fn generation(&self) -> u64 {
        self.state.borrow().generation
    }

    /// The current generation, and a client to reach the primary, for a new
    /// connection. Errors: [`primary_changing`] while a switch is under way.
    pub fn connectable(&self) -> RedisResult<(u64, Client)> {
        let state = self.state.borrow();
        match &state.switching {
            Some(why) => Err(primary_changing(why)),
            None => Ok((state.generation, state.client.clone())),
        }
    }

    /// As [`Primary::connectable`], with a client that speaks `protocol`
    /// (`HELLO 3` for RESP3, as the wake connection needs for its
    /// invalidation pushes), TLS as the primary's own.
    pub fn connectable_as(&self, protocol: redis::ProtocolVersion) -> RedisResult<(u64, Client)> {
        let (generation, client) = self.connectable()?;
        let info = client.get_connection_info().clone();
        let settings = info.redis_settings().clone().set_protocol(protocol);
        Ok((generation, client_for(info.set_redis_settings(settings), self.locator.ca_pem())?))
    }

    /// Redis refused the credentials of a connection (see
    /// [`super::credentials`]): reads `--redis-password-file` again and,
    /// when it holds a new password, makes every connection from now on with
    /// it. Not a switch: the node is the same, so the generation stays, no
    /// watcher is woken, and connections that Redis still accepts are kept.
    pub fn credentials_refused(&self) {
        let Some(password) = self.password_file.as_ref().and_then(PasswordFile::reread) else { return };
        self.state.send_if_modified(|state| {
            match self.locator.client_with(state.client.get_connection_info().clone(), &password) {
                Ok(client) => state.client = client,
                // Only a configuration the first connection already passed can fail here.
                Err(e) => warn!("no client could be made with the new password: {e}"),
            }
            false
        });
    }

    /// `client` with the password in use (a located primary's, which the
    /// locator made with the password of the start).
    fn with_password_in_use(&self, client: Client) -> Client {
        let Some(file) = &self.password_file else { return client };
        self.locator.client_with(client.get_connection_info().clone(), &file.password()).unwrap_or(client)
    }

    /// Follows the primary's state: changes at each switch's start and end.
    pub fn watch(&self) -> watch::Receiver<PrimaryState> {
        self.state.subscribe()
    }

    /// Starts a switch, because a connection made at `generation` found its
    /// node is not the primary (`why`). Nothing when that generation is
    /// already past or a switch is already under way.
    pub fn retire(&self, generation: u64, why: &str) {
        let started = self.state.send_if_modified(|state| {
            if state.generation != generation || state.switching.is_some() {
                return false;
            }
            state.switching = Some(why.to_owned());
            true
        });
        if started {
            self.metrics.switching.set(1);
            warn!(
                "the Redis primary is changing ({why}): commands are refused until a primary that accepts writes is \
                 found; not ready meanwhile"
            );
            self.wake.notify_one();
        }
    }

    /// What a connection made at `generation` got: a reply that says its node
    /// is not the primary starts a switch and becomes [`primary_changing`]'s
    /// error (so callers see UNAVAILABLE, saying why). So does any reply that
    /// arrives after a switch started or ended: it came from a node that is
    /// no longer known to be the primary (a stopped primary that woke up
    /// after its replica was promoted), so what it did may be lost with it,
    /// and a write it confirmed must not be confirmed to the client. Anything
    /// else is as it came.
    ///
    /// A server's error reply reaches here as an `Ok` holding
    /// [`Value::ServerError`] (redis-rs turns it into an `Err` later, in
    /// `query_async`), so the replies are looked into: each of a pipeline's.
    pub fn observe<R: Replies>(&self, generation: u64, result: RedisResult<R>) -> RedisResult<R> {
        let not_primary = match &result {
            Err(e) => (fault(e) == Fault::NotPrimary).then(|| first_line(e)),
            Ok(replies) => replies.not_primary(),
        };
        if let Some(reply) = not_primary {
            let why = format!("{} answered `{reply}`", self.locator.node_name(&self.state()));
            self.retire(generation, &why);
            return Err(primary_changing(&why));
        }
        match result {
            Ok(_) if self.is_past(generation) => Err(primary_changing(
                "the reply came from the old primary after the switch began; what the command did there may be lost",
            )),
            other => other,
        }
    }

    /// Resolves once a connection made at `generation` reaches a node that is
    /// no longer known to be the primary (a switch began or ended since): a
    /// command in flight on it is then given up at once, not after its
    /// response timeout. A stopped primary would answer it, if ever, only
    /// after its replica was promoted, and [`Primary::observe`] would refuse
    /// that answer anyway.
    pub async fn switched_from(&self, generation: u64) {
        let mut states = self.state.subscribe();
        let _ = states.wait_for(|state| state.generation != generation || state.switching.is_some()).await;
    }

    /// Runs `command` on a connection made at `generation`, given up with
    /// [`primary_changing`]'s error if a switch begins meanwhile, and its
    /// outcome observed ([`Primary::observe`]).
    pub async fn run<R: Replies>(
        &self,
        generation: u64,
        command: impl std::future::Future<Output = RedisResult<R>>,
    ) -> RedisResult<R> {
        tokio::select! {
            result = command => self.observe(generation, result),
            () = self.switched_from(generation) => Err(primary_changing(
                "a switch began while the command was in flight; its outcome is unknown",
            )),
        }
    }

    /// Whether a switch is under way.
    pub fn is_switching(&self) -> bool {
        self.state.borrow().switching.is_some()
    }

    /// Whether a connection made at `generation` reaches a node that is no
    /// longer known to be the primary: a switch began or ended since.
    fn is_past(&self, generation: u64) -> bool {
        let state = self.state.borrow();
        state.generation != generation || state.switching.is_some()
    }

    /// Why readiness is NOT_SERVING, `None` when the primary serves: a switch
    /// is under way; or `ROLE` on `conn` says the node is not the primary, or
    /// `PING` answers `LOADING` (`ROLE` answers while a restarted primary
    /// loads its data set; nothing else does), either of which starts a
    /// switch. An ACL user that may not run `ROLE` is taken at `PING`'s word.
    /// A check whose answer came after a switch began or ended (from the old
    /// primary) says nothing about the new one: it counts as ready, and the
    /// next check asks the new one.
    pub async fn unready<C: redis::aio::ConnectionLike + Send>(&self, conn: &mut C) -> Option<String> {
        let state = self.state();
        if let Some(why) = &state.switching {
            return Some(format!("the Redis primary is changing ({why})"));
        }
        let node = self.locator.node_name(&state);
        let checked = async {
            match redis::cmd("ROLE").query_async::<Value>(conn).await {
                Ok(reply) => match role(&reply).as_deref() {
                    Some("master") => {}
                    other => {
                        let why = format!("{node} says it is a {} (ROLE)", other.unwrap_or("node of unknown role"));
                        self.retire(state.generation, &why);
                        return Err(format!("the Redis primary is changing ({why})"));
                    }
                },
                Err(e) if fault(&e) == Fault::NoPermission => {}
                Err(e) => return Err(format!("Redis does not answer ROLE ({e})")),
            }
            match redis::cmd("PING").query_async::<Value>(conn).await {
                Ok(_) => Ok(()),
                Err(e) => Err(format!("Redis does not answer PING ({e})")),
            }
        };
        match checked.await {
            Ok(()) => None,
            Err(_) if self.is_past(state.generation) && !self.is_switching() => None,
            Err(why) => Some(why),
        }
    }
}

/// Replies [`Primary::observe`] looks into: one command's, or a pipeline's.
pub trait Replies {
    /// The first line of the first error reply that says the node is not the
    /// primary ([`Fault::NotPrimary`]), if any.
    fn not_primary(&self) -> Option<String>;
}

impl Replies for Value {
    fn not_primary(&self) -> Option<String> {
        let Value::ServerError(_) = self else { return None };
        let error = self.clone().extract_error().err()?;
        (fault(&error) == Fault::NotPrimary).then(|| first_line(&error))
    }
}

impl Replies for Vec<Value> {
    fn not_primary(&self) -> Option<String> {
        self.iter().find_map(Value::not_primary)
    }
}

impl Replies for Vec<RawEntry> {
    /// Entries parsed from a reply carry no error replies.
    fn not_primary(&self) -> Option<String> {
        None
    }
}

/// The error of a command refused, or cut off, because the primary is
/// changing: an I/O error, so it is transient ([`Fault::Unreachable`]) and
/// a caller gets UNAVAILABLE with this text.
pub fn primary_changing(why: &str) -> RedisError {
    std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        format!(
            "the Redis primary is changing ({why}); nothing was sent to a replica: retry once a primary accepts writes"
        ),
    )
    .into()
}

/// The task that ends switches: waits for one to start (or, with Sentinel,
/// asks them every [`SENTINEL_POLL`] whether the primary moved), then looks
/// for the primary with a backoff until it is found. Ends with its [`Primary`]
/// (it holds it only while it works, never while it waits).
async fn follow(primary: Weak<Primary>, wake: Arc<Notify>, timeout: Duration) {
    let mut backoff = LOCATE_BACKOFF_MIN;
    let mut logged = String::new();
    loop {
        let Some(this) = primary.upgrade() else { return };
        let state = this.state();
        if state.switching.is_none() {
            backoff = LOCATE_BACKOFF_MIN;
            logged.clear();
            let poll = matches!(this.locator, Locator::Sentinel(_));
            drop(this);
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(SENTINEL_POLL), if poll => {
                    let Some(this) = primary.upgrade() else { return };
                    this.ask_sentinels(&state, timeout).await;
                }
            }
            continue;
        }
        match this.locator.locate(timeout).await {
            Ok(client) => {
                let client = this.with_password_in_use(client);
                let node = this.locator.node_name(&PrimaryState { client: client.clone(), ..state });
                this.state.send_modify(|state| {
                    state.generation += 1;
                    state.client = client;
                    state.switching = None;
                });
                this.metrics.switches.inc();
                this.metrics.switching.set(0);
                info!(primary = %node, "found the Redis primary: every connection moves to it; ready");
            }
            Err(failure) => {
                let text = failure.to_string();
                if text != logged {
                    warn!("still looking for the Redis primary, retrying every {LOCATE_BACKOFF_MAX:?} at most: {text}");
                    logged = text;
                }
                drop(this);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(LOCATE_BACKOFF_MAX);
            }
        }
    }
}

/// Listens on one Sentinel for its `+switch-master` announcements (pub/sub),
/// so a failover is followed within milliseconds of a Sentinel learning of
/// it, not at the next [`SENTINEL_POLL`]: every write a woken-up old primary
/// takes meanwhile would be lost with it. Reconnects after a pause when the
/// Sentinel goes away; ends with its [`Primary`].
async fn listen(primary: Weak<Primary>, sentinel: ConnectionInfo, master: String, timeout: Duration) {
    use futures_util::StreamExt;
    while primary.strong_count() > 0 {
        let subscribed = async {
            let client = Client::open(sentinel.clone())?;
            let mut pubsub = tokio::time::timeout(timeout, client.get_async_pubsub()).await.map_err(|_| {
                RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"))
            })??;
            pubsub.subscribe("+switch-master").await?;
            Ok::<_, RedisError>(pubsub)
        }
        .await;
        if let Ok(pubsub) = subscribed {
            let mut announcements = pubsub.into_on_message();
            while let Some(announcement) = announcements.next().await {
                // `<master> <old ip> <old port> <new ip> <new port>`
                let Ok(payload) = announcement.get_payload::<String>() else { continue };
                let parts: Vec<&str> = payload.split(' ').collect();
                let [name, _, _, host, port] = parts[..] else { continue };
                if name != master {
                    continue;
                }
                let Some(this) = primary.upgrade() else { return };
                let state = this.state();
                let announced = (host.to_owned(), port.parse::<u16>().unwrap_or_default());
                if address_of(state.client.get_connection_info()).as_ref() != Some(&announced) {
                    let why = format!("a Sentinel announced the failover of `{master}` to {host}:{port}");
                    this.retire(state.generation, &why);
                }
            }
        }
        tokio::time::sleep(SENTINEL_POLL).await;
    }
}

impl Primary {
    /// With Sentinel: starts a switch when the Sentinels name another
    /// primary than the one `state` reaches. A Sentinel that does not answer
    /// is skipped; none answering changes nothing (the data node's own
    /// errors still start a switch).
    async fn ask_sentinels(&self, state: &PrimaryState, timeout: Duration) {
        let Locator::Sentinel(sentinels) = &self.locator else { return };
        let Some(named) = Named::primary(&sentinels.ask(timeout).await) else { return };
        if address_of(state.client.get_connection_info()).as_ref() != Some(&named.address) {
            let (host, port) = &named.address;
            let why = format!(
                "the Sentinels name {host}:{port} as the primary of `{}` (epoch {})",
                sentinels.master, named.epoch
            );
            self.retire(state.generation, &why);
        }
    }
}

/// How the primary is found.
pub enum Locator {
    /// One address: a single server, or a managed service's endpoint whose
    /// DNS name or virtual IP moves to the new primary. Re-resolved at each
    /// connect; the node there must say it is the primary.
    Address {
        /// The URL's connection settings.
        info: ConnectionInfo,
        /// `--redis-ca-file` for `rediss://`.
        ca_pem: Option<Vec<u8>>,
    },
    /// The Sentinels of `redis+sentinel://` (see [`SentinelUrl`]).
    Sentinel(Sentinels),
}

impl Locator {
    /// A client for the primary: connected within `timeout`, `ROLE` says
    /// `master` (or may not be asked: NOPERM) and `PING` answers (not
    /// `LOADING`). With Sentinel, the first Sentinel in order that names a
    /// primary that passes; a Sentinel that does not answer is skipped.
    ///
    /// Errors: [`LocateError`], saying what each place tried said.
    pub async fn locate(&self, timeout: Duration) -> Result<Client, LocateError> {
        match self {
            Locator::Address { info, ca_pem } => {
                let client = client_for(info.clone(), ca_pem.as_deref()).map_err(LocateError::Config)?;
                confirm_primary(&client, timeout).await.map_err(LocateError::Node)?;
                Ok(client)
            }
            Locator::Sentinel(sentinels) => sentinels.locate(timeout).await,
        }
    }

    /// A client for `info` with `password`, TLS as this locator's.
    fn client_with(&self, info: ConnectionInfo, password: &str) -> RedisResult<Client> {
        client_for(super::credentials::with_password(info, Some(password)), self.ca_pem())
    }

    /// The only trusted root for `rediss://` (`--redis-ca-file`); `None`: the system's.
    fn ca_pem(&self) -> Option<&[u8]> {
        match self {
            Locator::Address { ca_pem, .. } => ca_pem.as_deref(),
            Locator::Sentinel(sentinels) => sentinels.ca_pem.as_deref(),
        }
    }

    /// `host:port` of the node `state` reaches, for logs.
    fn node_name(&self, state: &PrimaryState) -> String {
        address_of(state.client.get_connection_info())
            .map_or_else(|| "the Redis server".to_owned(), |(host, port)| format!("{host}:{port}"))
    }
}

/// Why the primary could not be found.
#[derive(Debug)]
pub enum LocateError {
    /// The settings cannot make a client (a bad URL, a bad CA).
    Config(RedisError),
    /// The node reached is not a primary that accepts commands, or cannot be reached.
    Node(RedisError),
    /// No Sentinel named a primary that passed; what each said.
    Sentinels {
        /// The master name asked for.
        master: String,
        /// Each Sentinel (`host:port`) and what came of asking it.
        answers: Vec<(String, SentinelAnswer)>,
    },
}

/// What came of asking one Sentinel.
#[derive(Debug)]
pub enum SentinelAnswer {
    /// It could not be reached or failed the command.
    Down(RedisError),
    /// It does not know the master name (nil).
    Unknown,
    /// It named this primary, which did not pass.
    NotPrimary(String, RedisError),
    /// It named this node, of an older epoch than another Sentinel's answer.
    Stale(String),
    /// It named this node, which it sees down or is failing over.
    SeenDown(String),
}

impl LocateError {
    /// The error at start: a setting to fix (every Sentinel down, or none
    /// knows the name) is `InvalidClientConfig`, so the sidecar exits 2;
    /// a primary that is not ready yet stays transient and is retried.
    fn at_start(self) -> RedisError {
        let text = self.to_string();
        match self {
            LocateError::Config(e) => e,
            LocateError::Node(e) => e,
            LocateError::Sentinels { answers, .. }
                if answers
                    .iter()
                    .all(|(_, answer)| matches!(answer, SentinelAnswer::Down(_) | SentinelAnswer::Unknown)) =>
            {
                RedisError::from((ErrorKind::InvalidClientConfig, "no usable Redis Sentinel", text))
            }
            LocateError::Sentinels { .. } => {
                RedisError::from(std::io::Error::new(std::io::ErrorKind::NotConnected, text))
            }
        }
    }
}

impl fmt::Display for LocateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocateError::Config(e) => write!(f, "{e}"),
            LocateError::Node(e) => write!(f, "{e}"),
            LocateError::Sentinels { master, answers } => {
                let said: Vec<String> = answers
                    .iter()
                    .map(|(sentinel, answer)| match answer {
                        SentinelAnswer::Down(e) => format!("{sentinel} did not answer ({e})"),
                        SentinelAnswer::Unknown => format!("{sentinel} does not know master `{master}`"),
                        SentinelAnswer::NotPrimary(node, e) => {
                            format!("{sentinel} named {node}, which is not a usable primary ({e})")
                        }
                        SentinelAnswer::Stale(node) => {
                            format!("{sentinel} still names {node} (an older failover epoch)")
                        }
                        SentinelAnswer::SeenDown(node) => {
                            format!("{sentinel} names {node} but sees it down or is failing it over")
                        }
                    })
                    .collect();
                write!(f, "no Sentinel named a usable primary for master `{master}`: {}", said.join("; "))
            }
        }
    }
}

/// Connects with `client` within `timeout` and checks that the node is the
/// primary and serves: `ROLE` says `master` (NOPERM: not asked) and `PING`
/// answers. Errors: the connection's or the command's; a node of another
/// role is a `READONLY`-coded error, as a write to it would get.
async fn confirm_primary(client: &Client, timeout: Duration) -> RedisResult<()> {
    let mut conn = connect(client, timeout).await?;
    let within = |what: &'static str| {
        move |_| RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no answer to {what}")))
    };
    let role_reply = tokio::time::timeout(timeout, redis::cmd("ROLE").query_async::<Value>(&mut conn))
        .await
        .map_err(within("ROLE"))?;
    match role_reply {
        Ok(reply) => match role(&reply).as_deref() {
            Some("master") => {}
            other => {
                return Err(RedisError::from((
                    ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                    "READONLY: not the primary",
                    format!("ROLE says {}", other.unwrap_or("nothing readable")),
                )))
            }
        },
        Err(e) if fault(&e) == Fault::NoPermission => {}
        Err(e) => return Err(e),
    }
    tokio::time::timeout(timeout, redis::cmd("PING").query_async::<Value>(&mut conn))
        .await
        .map_err(within("PING"))?
        .map(drop)
}

/// A short-lived connection for a check, within `timeout`.
async fn connect(client: &Client, timeout: Duration) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(Some(timeout));
    client.get_multiplexed_async_connection_with_config(&config).await
}

/// The role `ROLE` replied (`master`, `slave`, `sentinel`).
fn role(reply: &Value) -> Option<String> {
    let first = super::reply::array(reply).first()?;
    super::reply::bytes(first).ok().and_then(|role| String::from_utf8(role).ok())
}

/// A client for `info`, TLS with `ca_pem` as the only root when given.
pub fn client_for(info: ConnectionInfo, ca_pem: Option<&[u8]>) -> RedisResult<Client> {
    match ca_pem {
        Some(ca) => {
            Client::build_with_tls(info, redis::TlsCertificates { client_tls: None, root_cert: Some(ca.to_vec()) })
        }
        None => Client::open(info),
    }
}

/// The host and port `info` connects to (`None` for a unix socket).
fn address_of(info: &ConnectionInfo) -> Option<(String, u16)> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
        _ => None,
    }
}

/// The first line of an error, for a log line or a status message.
fn first_line(error: &RedisError) -> String {
    let text = error.to_string();
    text.lines().next().unwrap_or_default().to_owned()
}

/// `url` with the password of its userinfo (every URL of a comma-separated
/// list) replaced by `***`, for logs and error messages.
pub fn redacted_url(url: &str) -> String {
    url.split(',')
        .map(|part| {
            let Some((scheme, rest)) = part.split_once("://") else { return part.to_owned() };
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rsplit_once('@') {
                Some((userinfo, hosts)) => {
                    let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
                    let hidden = if userinfo.contains(':') { format!("{user}:***") } else { "***".to_owned() };
                    format!("{scheme}://{hidden}@{hosts}{}", &rest[authority_end..])
                }
                None => part.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A parsed `redis+sentinel://` or `rediss+sentinel://` URL:
/// `redis+sentinel://[user:password@]host[:port][,host[:port]…]/MASTER[/DB]`.
/// The userinfo is for the data nodes; the Sentinels' own credentials come
/// from `--sentinel-username` / `--sentinel-password`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelUrl {
    /// `rediss+sentinel://`: TLS to the data nodes (not to the Sentinels).
    pub tls: bool,
    /// The data nodes' ACL user and password, percent-decoded.
    pub username: Option<String>,
    /// The data nodes' password.
    pub password: Option<String>,
    /// The Sentinels, in the order given (asked in that order).
    pub sentinels: Vec<(String, u16)>,
    /// The master name the Sentinels monitor.
    pub master: String,
    /// The database index on the data nodes (0 when not given).
    pub db: i64,
}

impl SentinelUrl {
    /// Whether `text` is a Sentinel URL (by its scheme).
    pub fn is_sentinel(text: &str) -> bool {
        text.starts_with("redis+sentinel://") || text.starts_with("rediss+sentinel://")
    }

    /// Parses `text`. Errors: a message naming what is wrong (no host, a bad
    /// port, no master name, a bad database index).
    pub fn parse(text: &str) -> Result<SentinelUrl, String> {
        let (tls, rest) = if let Some(rest) = text.strip_prefix("rediss+sentinel://") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("redis+sentinel://") {
            (false, rest)
        } else {
            return Err("expected redis+sentinel:// or rediss+sentinel://".to_owned());
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let decode = |part: &str| percent_encoding::percent_decode_str(part).decode_utf8_lossy().into_owned();
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => match userinfo.split_once(':') {
                Some((user, password)) => (Some(decode(user)).filter(|u| !u.is_empty()), Some(decode(password))),
                None => (Some(decode(userinfo)).filter(|u| !u.is_empty()), None),
            },
        };
        if hosts.trim().is_empty() {
            return Err("names no Sentinel: give host:port[,host:port…] before the master name".to_owned());
        }
        let mut sentinels = Vec::new();
        for host in hosts.split(',').map(str::trim) {
            if host.is_empty() {
                return Err(format!("has an empty Sentinel in `{hosts}`: drop the extra comma"));
            }
            sentinels.push(parse_host_port(host)?);
        }
        let mut segments = path.split('/');
        let master = decode(segments.next().unwrap_or_default());
        if master.is_empty() {
            return Err(
                "names no master: end it with /MASTER (the name the Sentinels monitor), e.g. /mymaster".to_owned()
            );
        }
        let db = match segments.next().filter(|db| !db.is_empty()) {
            None => 0,
            Some(db) => db.parse::<i64>().ok().filter(|db| *db >= 0).ok_or_else(|| {
                format!("`{db}` after the master name is not a database index (a number, e.g. /{master}/0)")
            })?,
        };
        if let Some(extra) = segments.find(|segment| !segment.is_empty()) {
            return Err(format!("has `/{extra}` after the database index; expected /MASTER[/DB]"));
        }
        Ok(SentinelUrl { tls, username, password, sentinels, master, db })
    }
}

/// `host[:port]` or `[v6]:port`; the port defaults to [`DEFAULT_SENTINEL_PORT`].
fn parse_host_port(text: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(|| format!("`{text}`: an IPv6 address lacks its `]`"))?;
        (host, after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(format!("`{text}` names no host"));
    }
    let port = match port {
        None => DEFAULT_SENTINEL_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port > 0)
            .ok_or_else(|| format!("`{port}` in `{text}` is not a port (1-65535)"))?,
    };
    Ok((host.to_owned(), port))
}

/// The Sentinels of a deployment and how to reach its data nodes.
pub struct Sentinels {
    /// Each Sentinel's connection settings (its own credentials).
    sentinels: Vec<ConnectionInfo>,
    /// The master name.
    master: String,
    /// The data nodes' settings; the address is replaced by the primary's.
    node: ConnectionInfo,
    /// `--redis-ca-file`, for `rediss+sentinel://`.
    ca_pem: Option<Vec<u8>>,
}

impl Sentinels {
    /// The Sentinels of `url`, reached with `username`/`password` (the
    /// Sentinels' own, `--sentinel-username` / `--sentinel-password`), the data
    /// nodes with the URL's credentials (`password`, when given, overrides
    /// the URL's, as `--redis-password-file` does) and `tcp` settings.
    pub fn new(
        url: &SentinelUrl,
        sentinel_username: Option<&str>,
        sentinel_password: Option<&str>,
        password: Option<&str>,
        ca_pem: Option<&[u8]>,
        tcp: redis::io::tcp::TcpSettings,
    ) -> RedisResult<Sentinels> {
        let sentinels = url
            .sentinels
            .iter()
            .map(|(host, port)| {
                let mut settings = redis::RedisConnectionInfo::default();
                if let Some(user) = sentinel_username {
                    settings = settings.set_username(user);
                }
                if let Some(password) = sentinel_password {
                    settings = settings.set_password(password);
                }
                Ok(ConnectionAddr::Tcp(host.clone(), *port)
                    .into_connection_info()?
                    .set_redis_settings(settings)
                    .set_tcp_settings(tcp.clone()))
            })
            .collect::<RedisResult<Vec<_>>>()?;
        let mut settings = redis::RedisConnectionInfo::default().set_db(url.db);
        if let Some(user) = &url.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = password.or(url.password.as_deref()) {
            settings = settings.set_password(password);
        }
        let addr = node_addr(url.tls, String::new(), 0);
        let node = addr.into_connection_info()?.set_redis_settings(settings).set_tcp_settings(tcp);
        Ok(Sentinels { sentinels, master: url.master.clone(), node, ca_pem: ca_pem.map(<[u8]>::to_vec) })
    }

    /// Asks every Sentinel at once which node is the master's primary
    /// (`SENTINEL MASTER <name>`), each within `timeout`, and what each said.
    /// Sentinels that have not yet learnt of a failover name the old primary
    /// (which may still say it is one, if it was only stopped), so the answer
    /// to trust is the one of the highest `config-epoch`: the latest failover
    /// the Sentinels agreed on ([`Named::primary`]).
    async fn ask(&self, timeout: Duration) -> Vec<(String, Result<Option<Named>, RedisError>)> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let mut asks: FuturesUnordered<_> = self
            .sentinels
            .iter()
            .enumerate()
            .map(|(order, sentinel)| async move { (order, self.ask_one(sentinel, timeout).await) })
            .collect();
        let mut said: Vec<Option<Result<Option<Named>, RedisError>>> = self.sentinels.iter().map(|_| None).collect();
        // Once one Sentinel has named a primary, the others have SENTINEL_GRACE
        // more to answer: a stalled Sentinel must not hold up a failover for
        // the whole timeout.
        let mut deadline = None;
        loop {
            let next = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, asks.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
                None => asks.next().await,
            };
            let Some((order, answer)) = next else { break };
            if deadline.is_none() && matches!(answer, Ok(Some(_))) {
                deadline = Some(tokio::time::Instant::now() + SENTINEL_GRACE);
            }
            said[order] = Some(answer);
        }
        self.sentinels
            .iter()
            .zip(said)
            .map(|(sentinel, answer)| {
                let name = address_of(sentinel)
                    .map_or_else(|| "a Sentinel".to_owned(), |(host, port)| format!("{host}:{port}"));
                let answer = answer.unwrap_or_else(|| {
                    Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {SENTINEL_GRACE:?} of another Sentinel's"),
                    )))
                });
                (name, answer)
            })
            .collect()
    }

    async fn ask_one(&self, sentinel: &ConnectionInfo, timeout: Duration) -> RedisResult<Option<Named>> {
        let client = Client::open(sentinel.clone())?;
        let mut conn = connect(&client, timeout).await?;
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("MASTER").arg(&self.master);
        let reply = tokio::time::timeout(timeout, cmd.query_async::<Value>(&mut conn))
            .await
            .map_err(|_| RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time")))?;
        match reply {
            Ok(reply) => Ok(Named::parse(&reply)),
            // "ERR No such master with that name".
            Err(e) if e.to_string().contains("No such master") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// With Sentinel: the primary the Sentinels name (see [`Sentinels::ask`]),
    /// confirmed with [`confirm_primary`]. Errors: [`LocateError::Sentinels`],
    /// saying what each Sentinel said.
    async fn locate(&self, timeout: Duration) -> Result<Client, LocateError> {
        let said = self.ask(timeout).await;
        let named = Named::primary(&said);
        let mut answers = Vec::new();
        for (sentinel, answer) in said {
            let answer = match answer {
                Err(e) => SentinelAnswer::Down(e),
                Ok(None) => SentinelAnswer::Unknown,
                Ok(Some(found)) => match &named {
                    Some(chosen) if found.address == chosen.address => continue,
                    _ if found.down => SentinelAnswer::SeenDown(format!("{}:{}", found.address.0, found.address.1)),
                    _ => SentinelAnswer::Stale(format!("{}:{}", found.address.0, found.address.1)),
                },
            };
            answers.push((sentinel, answer));
        }
        let Some(named) = named else {
            return Err(LocateError::Sentinels { master: self.master.clone(), answers });
        };
        let (host, port) = named.address;
        let tls = matches!(self.node.addr(), ConnectionAddr::TcpTls { .. });
        let info = self.node.clone().set_addr(node_addr(tls, host.clone(), port));
        let client = client_for(info, self.ca_pem.as_deref()).map_err(LocateError::Config)?;
        match confirm_primary(&client, timeout).await {
            Ok(()) => Ok(client),
            Err(e) => {
                answers
                    .push((format!("epoch {}", named.epoch), SentinelAnswer::NotPrimary(format!("{host}:{port}"), e)));
                Err(LocateError::Sentinels { master: self.master.clone(), answers })
            }
        }
    }
}

/// The primary one Sentinel names, and the configuration epoch it knows it at.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Named {
    address: (String, u16),
    epoch: u64,
    /// The Sentinel sees it down (`s_down`, `o_down`) or is failing it over
    /// (`failover_in_progress`): its answer is the primary being replaced.
    down: bool,
}

impl Named {
    /// Reads `SENTINEL MASTER`'s field/value list (a map under RESP3).
    fn parse(reply: &Value) -> Option<Named> {
        let mut fields = std::collections::HashMap::new();
        let mut put = |name: &Value, value: &Value| {
            if let (Ok(name), Ok(value)) = (super::reply::bytes(name), super::reply::bytes(value)) {
                fields
                    .insert(String::from_utf8_lossy(&name).into_owned(), String::from_utf8_lossy(&value).into_owned());
            }
        };
        match reply {
            Value::Array(items) => items.chunks(2).for_each(|pair| {
                if let [name, value] = pair {
                    put(name, value)
                }
            }),
            Value::Map(pairs) => pairs.iter().for_each(|(name, value)| put(name, value)),
            _ => return None,
        }
        let host = fields.get("ip")?.clone();
        let port = fields.get("port")?.parse().ok()?;
        let epoch = fields.get("config-epoch").and_then(|epoch| epoch.parse().ok()).unwrap_or(0);
        let flags = fields.get("flags").map_or("", String::as_str);
        let down = flags.split(',').any(|flag| matches!(flag, "s_down" | "o_down" | "failover_in_progress"));
        Some(Named { address: (host, port), epoch, down })
    }

    /// The primary of the highest epoch among what the Sentinels said (the
    /// first in order among equals), leaving out a primary its Sentinel sees
    /// down or is failing over; `None` when none named one that is up.
    fn primary(said: &[(String, Result<Option<Named>, RedisError>)]) -> Option<Named> {
        let mut best: Option<&Named> = None;
        let answers = said.iter().filter_map(|(_, answer)| answer.as_ref().ok()?.as_ref());
        for named in answers.filter(|named| !named.down) {
            if best.is_none_or(|best| named.epoch > best.epoch) {
                best = Some(named);
            }
        }
        best.cloned()
    }
}

/// A data node's address, TLS or not.
fn node_addr(tls: bool, host: String, port: u16) -> ConnectionAddr {
    if tls {
        ConnectionAddr::TcpTls { host, port, insecure: false, tls_params: None }
    } else {
        ConnectionAddr::Tcp(host, port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_url_gives_its_parts() {
        let url = SentinelUrl::parse("redis+sentinel://app:p%40ss@10.0.0.1:26379,s2,[::1]:26380/mymaster/3").unwrap();
        assert_eq!(
            url,
            SentinelUrl {
                tls: false,
                username: Some("app".to_owned()),
                password: Some("p@ss".to_owned()),
                sentinels: vec![("10.0.0.1".to_owned(), 26379), ("s2".to_owned(), 26379), ("::1".to_owned(), 26380)],
                master: "mymaster".to_owned(),
                db: 3,
            }
        );
        let url = SentinelUrl::parse("rediss+sentinel://:secret@h:1/m").unwrap();
        assert!(url.tls);
        assert_eq!((url.username, url.password, url.db), (None, Some("secret".to_owned()), 0));
    }

    #[test]
    fn a_bad_sentinel_url_says_what_is_wrong() {
        let cases = [
            ("redis+sentinel://h:26379", "names no master"),
            ("redis+sentinel://h:26379/", "names no master"),
            ("redis+sentinel:///mymaster", "names no Sentinel"),
            ("redis+sentinel://h:0/m", "is not a port"),
            ("redis+sentinel://h:99999/m", "is not a port"),
            ("redis+sentinel://h:x/m", "is not a port"),
            ("redis+sentinel://:1/m", "names no host"),
            ("redis+sentinel://h/m/x", "not a database index"),
            ("redis+sentinel://h/m/1/2", "after the database index"),
            ("redis+sentinel://[::1/m", "lacks its `]`"),
            ("redis+sentinel://a:1,,b:2/m", "an empty Sentinel"),
            ("redis+sentinel://a:1,/m", "an empty Sentinel"),
        ];
        for (url, expected) in cases {
            let error = SentinelUrl::parse(url).expect_err(url);
            assert!(error.contains(expected), "{url}: {error}");
        }
    }

    #[test]
    fn a_redacted_url_hides_every_password() {
        assert_eq!(redacted_url("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redacted_url("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(redacted_url("redis://secret@h:1"), "redis://***@h:1");
        assert_eq!(redacted_url("redis://h:1,rediss://a:b@g:2"), "redis://h:1,rediss://a:***@g:2");
        assert_eq!(redacted_url("redis+sentinel://u:p@s1,s2/m"), "redis+sentinel://u:***@s1,s2/m");
    }

    #[test]
    fn the_sentinel_answer_of_the_highest_epoch_wins() {
        let master = |port: &str, epoch: &str, flags: &str| {
            let fields =
                [("name", "m"), ("ip", "127.0.0.1"), ("port", port), ("flags", flags), ("config-epoch", epoch)];
            Value::Array(
                fields
                    .iter()
                    .flat_map(|(k, v)| {
                        [Value::BulkString(k.as_bytes().to_vec()), Value::BulkString(v.as_bytes().to_vec())]
                    })
                    .collect(),
            )
        };
        let stale = Named::parse(&master("6379", "0", "master")).unwrap();
        assert_eq!(stale, Named { address: ("127.0.0.1".to_owned(), 6379), epoch: 0, down: false });
        let fresh = Named::parse(&master("6380", "1", "master")).unwrap();
        let failing_over = Named::parse(&master("6379", "1", "master,o_down,failover_in_progress")).unwrap();
        assert!(failing_over.down);
        let down = RedisError::from(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"));
        let said = vec![
            ("s0".to_owned(), Ok(Some(failing_over))),
            ("s1".to_owned(), Ok(Some(stale.clone()))),
            ("s2".to_owned(), Err(down)),
            ("s3".to_owned(), Ok(Some(fresh.clone()))),
            ("s4".to_owned(), Ok(None)),
        ];
        assert_eq!(Named::primary(&said), Some(fresh));
        assert_eq!(Named::primary(&said[..3]), Some(stale));
        assert_eq!(Named::primary(&said[..1]), None);
        assert_eq!(Named::primary(&said[2..3]), None);
    }

    #[test]
    fn an_error_reply_inside_an_ok_is_looked_into() {
        let reply = |text: &[u8]| redis::parse_redis_value(text).unwrap();
        assert!(reply(b"-LOADING Redis is loading the dataset in memory\r\n").not_primary().is_some());
        assert!(reply(b"-READONLY You can't write against a read only replica.\r\n").not_primary().is_some());
        assert!(reply(b"-ERR syntax error\r\n").not_primary().is_none());
        assert!(reply(b"+OK\r\n").not_primary().is_none());
        let pipeline = vec![reply(b"+OK\r\n"), reply(b"-MASTERDOWN Link with MASTER is down\r\n")];
        assert!(pipeline.not_primary().is_some());
    }

    #[test]
    fn role_reads_the_first_element() {
        let reply = Value::Array(vec![Value::BulkString(b"slave".to_vec()), Value::Int(1)]);
        assert_eq!(role(&reply).as_deref(), Some("slave"));
        assert_eq!(role(&Value::Nil), None);
    }
}
