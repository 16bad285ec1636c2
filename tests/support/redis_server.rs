//! The one `redis-server` launcher of the tests and the benches: a child
//! process on a free loopback port, no persistence unless asked, its working
//! directory a temp dir, killed on drop; plain, password, TLS-only and cluster
//! nodes; SIGKILL and restart, graceful stops.
//!
//! A plain file that needs only [`super::process`], std, tokio and redis: the
//! benches take both in with `#[path]` (`benches/common/mod.rs`).

use std::fs::{self, OpenOptions};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::process::{
    free_port, kill_child, print_logs_requested, read_log, tail, tcp_accepts, wait_child, TempDir, START_TIMEOUT,
};

/// The highest data port whose cluster bus port (port + 10000) still fits in 16
/// bits; redis-server refuses to start above it, and free ports often are.
const MAX_NODE_PORT: u16 = 55535;
/// How many ports a start tries before it gives up (a port taken meanwhile).
const START_ATTEMPTS: usize = 5;

/// A `redis-server` child process on a free loopback port, no persistence,
/// its working directory in a temp dir. Killed on drop.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    log: PathBuf,
    options: RedisOptions,
    // Dropped last (fields drop in order): the process is gone before its dir.
    dir: TempDir,
}

/// How to start a [`RedisServer`] beyond the defaults.
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// Further redis-server arguments (`--requirepass`, `--tls-cert-file`, …), passed last.
    pub args: Vec<String>,
    /// Serve TLS only: the port is `--tls-port` and the plain port is off
    /// (`--port 0`); give the `--tls-*` files in `args`. Readiness is then
    /// checked by a TCP connect instead of PING.
    pub tls: bool,
    /// A cluster node (`--cluster-enabled yes`, its `nodes.conf` in its dir, a
    /// replica's sync without the default 5 s delay), on a port whose cluster
    /// bus port (port + 10000) exists and is free too. Joining the nodes is the
    /// caller's (`redis-cli --cluster create`).
    pub cluster: bool,
}

impl RedisOptions {
    /// Persistence on: `--appendonly yes --appendfsync always`, so every write
    /// is in the append-only file before Redis answers it and a graceful
    /// restart ([`RedisServer::restart_gracefully`]) reloads all of it.
    pub fn append_only() -> RedisOptions {
        let args = ["--appendonly", "yes", "--appendfsync", "always"];
        RedisOptions { args: args.iter().map(|a| (*a).to_owned()).collect(), ..RedisOptions::default() }
    }

    /// A cluster node (see [`RedisOptions::cluster`]) with `args` added.
    pub fn cluster_node(args: &[&str]) -> RedisOptions {
        RedisOptions { args: args.iter().map(|a| (*a).to_owned()).collect(), cluster: true, ..RedisOptions::default() }
    }

    /// A port for the server: any free one, or for a cluster node one whose
    /// bus port is free too.
    fn pick_port(&self) -> u16 {
        loop {
            let port = free_port();
            if !self.cluster || (port <= MAX_NODE_PORT && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok()) {
                return port;
            }
        }
    }
}

/// A server's versions from `INFO server`: `redis_version` (the Redis command
/// set it speaks; Valkey says 7.2.4) and, on Valkey, `valkey_version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    pub redis: (u32, u32, u32),
    pub valkey: Option<(u32, u32, u32)>,
}

impl ServerInfo {
    fn parse(info: &str) -> ServerInfo {
        let field = |name: &str| {
            let value = info.lines().find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))?;
            let mut parts = value.split('.').map(|p| p.chars().take_while(char::is_ascii_digit).collect::<String>());
            let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            Some((next(), next(), next()))
        };
        ServerInfo {
            redis: field("redis_version").expect("INFO server has redis_version"),
            valkey: field("valkey_version"),
        }
    }

    /// Redis (not Valkey) at `major.minor` or newer.
    pub fn is_redis_at_least(&self, major: u32, minor: u32) -> bool {
        self.valkey.is_none() && (self.redis.0, self.redis.1) >= (major, minor)
    }

    pub fn is_valkey(&self) -> bool {
        self.valkey.is_some()
    }

    /// `7.0.15`, or `valkey 9.1.2`: for messages.
    pub fn describe(&self) -> String {
        match self.valkey {
            Some((a, b, c)) => format!("valkey {a}.{b}.{c}"),
            None => format!("{}.{}.{}", self.redis.0, self.redis.1, self.redis.2),
        }
    }
}

/// How [`RedisServer::stop_gracefully`] asks Redis to stop. Either way Redis
/// flushes and fsyncs its append-only file before it exits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisStop {
    /// The `SHUTDOWN` command, sent over a connection of its own.
    ShutdownCommand,
    /// SIGTERM, through `kill -TERM <pid>`.
    Sigterm,
}

impl RedisServer {
    /// Starts redis-server and waits until it answers PING.
    pub async fn start() -> RedisServer {
        RedisServer::start_with(RedisOptions::default()).await
    }

    /// Starts redis-server with `options` and waits until it answers (PING
    /// answered `+PONG` or `-NOAUTH`; with TLS, a TCP connect). Panics with
    /// the server's log when it does not start.
    pub async fn start_with(options: RedisOptions) -> RedisServer {
        RedisServer::try_start_with(options).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`RedisServer::start_with`], with `Err` (saying why, with the
    /// server's log) instead of a panic: for the benches, which report errors.
    pub async fn try_start_with(options: RedisOptions) -> Result<RedisServer, String> {
        let what = if options.cluster { "a redis cluster node" } else { "redis-server" };
        let mut dir = TempDir::new(if options.cluster { "redis-node" } else { "redis" });
        let log = dir.path().join("redis.log");
        for _ in 0..START_ATTEMPTS {
            let port = options.pick_port();
            let mut server = RedisServer { port, child: None, log: log.clone(), options: options.clone(), dir };
            if server.spawn().await? {
                return Ok(server);
            }
            // A cluster node's bus-port clash comes after it wrote its identity: start afresh.
            if server.options.cluster {
                let _ = fs::remove_file(server.dir.path().join("nodes.conf"));
            }
            // Move the dir out before the failed server is dropped.
            dir = std::mem::replace(&mut server.dir, TempDir::new("redis-spare"));
        }
        Err(format!("{what} did not start; its log:\n{}", read_log(&log)))
    }

    /// Spawns on `self.port`: `Ok(true)` once PING answers, `Ok(false)` if the
    /// process exited, `Err` if it runs but does not answer in time.
    async fn spawn(&mut self) -> Result<bool, String> {
        let out = OpenOptions::new().create(true).append(true).open(&self.log).expect("redis log");
        let err = out.try_clone().expect("redis log");
        let ports = if self.options.tls {
            vec!["--port".to_owned(), "0".to_owned(), "--tls-port".to_owned(), self.port.to_string()]
        } else {
            vec!["--port".to_owned(), self.port.to_string()]
        };
        let cluster: &[&str] = if self.options.cluster {
            // A replica's full sync starts at once rather than after the default 5 s
            // wait for more replicas (the first sync, and a restarted node's).
            &["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--repl-diskless-sync-delay", "0"]
        } else {
            &[]
        };
        let child = Command::new("redis-server")
            .args(&ports)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(cluster)
            .args(&self.options.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| {
                format!("spawn redis-server ({e}); is it installed? (Debian: apt-get install redis-server)")
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return Ok(false);
                }
            }
            if self.ping().await {
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("redis-server on port {} did not answer PING within {START_TIMEOUT:?}", self.port))
    }

    async fn ping(&self) -> bool {
        if self.options.tls {
            return tcp_accepts(self.port).await;
        }
        let probe = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.ok()?;
            s.write_all(b"PING\r\n").await.ok()?;
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).await.ok()?;
            // `-NOAUTH`: up, and asking for the password it was started with.
            Some(buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"))
        };
        matches!(tokio::time::timeout(Duration::from_secs(1), probe).await, Ok(Some(true)))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis://[user]:password@127.0.0.1:<port>`, for a server started with
    /// `--requirepass` or ACL users.
    pub fn url_with_auth(&self, user: Option<&str>, password: &str) -> String {
        format!("redis://{}:{password}@127.0.0.1:{}", user.unwrap_or(""), self.port)
    }

    /// A fresh multiplexed connection authenticated as `user` (the default user when `None`).
    pub async fn conn_with_auth(&self, user: Option<&str>, password: &str) -> MultiplexedConnection {
        let client = redis::Client::open(self.url_with_auth(user, password)).expect("redis url");
        client.get_multiplexed_async_connection().await.expect("connect to redis with a password")
    }

    /// A fresh multiplexed connection for inspecting and seeding data.
    pub async fn conn(&self) -> MultiplexedConnection {
        let client = redis::Client::open(self.url()).expect("redis url");
        client.get_multiplexed_async_connection().await.expect("connect to redis")
    }

    /// What this server says it is (`INFO server`), so a test can expect what
    /// that server does where servers differ (see `docs/src/servers.md`).
    pub async fn info(&self) -> ServerInfo {
        let mut conn = self.conn().await;
        let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await.expect("INFO server");
        ServerInfo::parse(&info)
    }

    /// The server's log (its stdout and stderr) so far.
    pub fn log(&self) -> String {
        read_log(&self.log)
    }

    /// The redis-server process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGSTOP (`paused`) or SIGCONT: a stopped Redis keeps its sockets open
    /// but answers nothing, as a stalled host would; a stopped replica
    /// acknowledges no replication offset, so its primary's `WAIT` times out.
    /// A stopped server is still killed on drop (SIGKILL works on it).
    pub fn pause(&self, paused: bool) {
        let pid = self.pid().expect("a running redis-server to pause or continue");
        let signal = if paused { "-STOP" } else { "-CONT" };
        let status = Command::new("kill").arg(signal).arg(pid.to_string()).status().expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// SIGKILL: Redis disappears at once (and, without persistence, its data with it).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
    }

    /// Starts a killed server again on the same port and dir (empty unless
    /// it persists, a cluster node with its `nodes.conf`).
    pub async fn restart(&mut self) {
        self.kill9();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.spawn().await {
                Ok(true) => return,
                // The port may linger for a moment after the kill; try again.
                Ok(false) => {
                    assert!(Instant::now() < deadline, "redis-server did not restart on port {}", self.port);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Stops Redis gracefully and waits (up to [`START_TIMEOUT`]) for the
    /// process to exit. Panics if it does not.
    pub async fn stop_gracefully(&mut self, how: RedisStop) {
        let Some(pid) = self.pid() else { return };
        match how {
            RedisStop::ShutdownCommand => {
                // Redis closes the connection without a reply when it stops;
                // `-ERR Errors trying to SHUTDOWN` comes back when it refuses.
                let send = async {
                    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.ok()?;
                    s.write_all(b"SHUTDOWN\r\n").await.ok()?;
                    let mut buf = [0u8; 256];
                    let n = s.read(&mut buf).await.ok()?;
                    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
                };
                if let Ok(Some(reply)) = tokio::time::timeout(Duration::from_secs(10), send).await {
                    assert!(!reply.starts_with('-'), "redis-server :{} refused SHUTDOWN: {reply}", self.port);
                }
            }
            RedisStop::Sigterm => {
                let status = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().expect("run kill");
                assert!(status.success(), "kill -TERM {pid} (redis-server) failed: {status}");
            }
        }
        let child = self.child.as_mut().expect("checked above");
        if wait_child(child, START_TIMEOUT).await.is_none() {
            panic!("redis-server :{} did not exit within {START_TIMEOUT:?} after {how:?}", self.port);
        }
        self.child = None;
    }

    /// [`RedisServer::stop_gracefully`], then starts Redis again on the same
    /// port and directory and waits until it answers PING (which it does only
    /// once the append-only file is loaded).
    pub async fn restart_gracefully(&mut self, how: RedisStop) {
        self.stop_gracefully(how).await;
        self.restart().await;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill9();
        if print_logs_requested() {
            eprintln!("----- redis-server :{} log (tail) -----\n{}", self.port, tail(&read_log(&self.log), 30));
        }
    }
}
