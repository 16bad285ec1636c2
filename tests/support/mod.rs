//! Fixtures for the integration tests: a real `redis-server` and the real
//! `echomq-sidecar` binary, each on free loopback ports, plus a small client for
//! the Consume call and a few Redis inspection helpers.
//!
//! Every fixture owns its processes and temp directories and releases them in
//! `Drop` (SIGKILL + wait, then remove the directory), so a failing test never
//! leaves a process behind. When a test panics, the sidecar's log (and the
//! tail of Redis' log) is printed, so the failure comes with the server's side
//! of the story. Set `ECHOMQ_TEST_LOGS=1` to print the logs of passing tests too.
//!
//! Each file in `tests/` is its own crate and uses only part of this module.
#![allow(dead_code, unreachable_pub, clippy::needless_update)]

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use echomq::proto::consume_request::Kind;
use echomq::proto::consume_response::Kind as ResponseKind;
use echomq::proto::consumer_service_client::ConsumerServiceClient;
use echomq::proto::stream_service_client::StreamServiceClient;
use echomq::proto::{
    Ack, AppendRequest, AppendResponse, ConsumeRequest, ConsumeResponse, Delivery, Fail, GroupStart, Subscribe,
    Subscribed, VerdictError,
};
use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

pub mod cluster;

/// How long a fixture waits for a process to come up. Generous: CI is slow.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The default wait for an event the test expects to arrive.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name unique within this test binary, for streams, groups and consumers.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Ports handed out by [`free_port`] in this process, so two fixtures never get
/// the same one even when the kernel offers it twice.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port that was free a moment ago: bind port 0, note the port, release it.
pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind 127.0.0.1:0").port();
        let mut guard = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if guard.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let path = std::env::temp_dir().join(format!("echomq-test-{}-{nanos}", unique(prefix)));
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn print_logs_requested() -> bool {
    std::thread::panicking() || std::env::var_os("ECHOMQ_TEST_LOGS").is_some()
}

fn read_log(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let mut bytes = Vec::new();
        let _ = f.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    text
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Sends SIGKILL to a child and reaps it.
fn kill_child(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = child.kill();
    child.wait().ok()
}

/// Polls `try_wait` until the child exits or `timeout` passes.
async fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Retries `check` every 50 ms until it returns true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The status code of `GET <path>` on a loopback port, with a plain HTTP/1.0
/// request over TCP. `None` when nothing answers (refused, reset, timeout).
pub async fn http_status(port: u16, path: &str) -> Option<u16> {
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 512];
        while !buf.windows(2).any(|w| w == b"\r\n") {
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&buf).into_owned();
        text.split_whitespace().nth(1)?.parse::<u16>().ok()
    };
    tokio::time::timeout(Duration::from_secs(5), probe).await.ok().flatten()
}

/// An HTTP response read to its end: status, header block and body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    /// The header lines, as sent (without the status line).
    pub headers: String,
    pub body: String,
}

impl HttpResponse {
    /// The value of header `name` (case-insensitive), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// `GET <path>` on a loopback port with a plain HTTP/1.0 request over TCP, read
/// until the server closes the connection. `None` when nothing answers.
pub async fn http_get(port: u16, path: &str) -> Option<HttpResponse> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let (status_line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
        let status = status_line.split_whitespace().nth(1)?.parse::<u16>().ok()?;
        Some(HttpResponse { status, headers: headers.replace("\r\n", "\n"), body: body.to_owned() })
    };
    tokio::time::timeout(Duration::from_secs(5), fetch).await.ok().flatten()
}

/// `message` as a request carrying `authorization: Bearer <token>` when `token` is set.
pub fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("a token that fits in a header");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

async fn tcp_accepts(port: u16) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(("127.0.0.1", port))).await,
        Ok(Ok(_))
    )
}

// ---------------------------------------------------------------------------
// Branded ids
// ---------------------------------------------------------------------------

/// Splits a stream id `<ms>-<seq>` into its parts.
pub fn parse_stream_id(stream_id: &str) -> (u64, u64) {
    let (ms, seq) = stream_id.split_once('-').unwrap_or_else(|| panic!("not a stream id: {stream_id:?}"));
    (ms.parse().expect("stream id ms"), seq.parse().expect("stream id seq"))
}

/// The branded id (28 lowercase hex) that corresponds to a stream id.
pub fn branded_from_stream_id(stream_id: &str) -> String {
    let (ms, seq) = parse_stream_id(stream_id);
    format!("{ms:012x}{seq:016x}")
}

/// Whether `id` has the branded text form: exactly 28 lowercase hex characters.
pub fn is_branded(id: &str) -> bool {
    id.len() == 28 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The milliseconds part of a branded id.
pub fn branded_ms(id: &str) -> u64 {
    u64::from_str_radix(&id[..12], 16).expect("branded id ms")
}

/// The protobuf timestamp of a unix-milliseconds instant.
pub fn timestamp_of_ms(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

/// An entry's fields from (name, value) pairs, as Append takes them.
pub fn fields(pairs: &[(&str, &[u8])]) -> std::collections::HashMap<String, Vec<u8>> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), v.to_vec())).collect()
}

pub fn duration_ms(ms: u64) -> prost_types::Duration {
    prost_types::Duration { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

// ---------------------------------------------------------------------------
// redis-server
// ---------------------------------------------------------------------------

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
}

impl RedisServer {
    /// Starts redis-server and waits until it answers PING.
    pub async fn start() -> RedisServer {
        RedisServer::start_with(RedisOptions::default()).await
    }

    /// Starts redis-server with `options` and waits until it answers (PING
    /// answered `+PONG` or `-NOAUTH`; with TLS, a TCP connect).
    pub async fn start_with(options: RedisOptions) -> RedisServer {
        let mut dir = TempDir::new("redis");
        let log = dir.path().join("redis.log");
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut server = RedisServer { port, child: None, log: log.clone(), options: options.clone(), dir };
            if server.spawn().await {
                return server;
            }
            last_log = read_log(&server.log);
            // Move the dir out before the failed server is dropped.
            dir = std::mem::replace(&mut server.dir, TempDir::new("redis-spare"));
        }
        panic!("redis-server did not start; its log:\n{last_log}");
    }

    /// Spawns on `self.port`; true once PING answers, false if the process exited.
    async fn spawn(&mut self) -> bool {
        let out = OpenOptions::new().create(true).append(true).open(&self.log).expect("redis log");
        let err = out.try_clone().expect("redis log");
        let ports = if self.options.tls {
            vec!["--port".to_owned(), "0".to_owned(), "--tls-port".to_owned(), self.port.to_string()]
        } else {
            vec!["--port".to_owned(), self.port.to_string()]
        };
        let child = Command::new("redis-server")
            .args(&ports)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.options.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn redis-server (is /usr/bin/redis-server installed?)");
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return false;
                }
            }
            if self.ping().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("redis-server on port {} did not answer PING within {START_TIMEOUT:?}", self.port);
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

    /// SIGKILL: Redis disappears at once (and, without persistence, its data with it).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
    }

    /// Starts a killed server again on the same port (empty: nothing is persisted).
    pub async fn restart(&mut self) {
        self.kill9();
        let deadline = Instant::now() + START_TIMEOUT;
        while !self.spawn().await {
            // The port may linger for a moment after the kill; try again.
            assert!(Instant::now() < deadline, "redis-server did not restart on port {}", self.port);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
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

// ---------------------------------------------------------------------------
// The sidecar
// ---------------------------------------------------------------------------

/// How to start a sidecar. Unset values are not passed (the sidecar's default applies).
#[derive(Clone, Debug, Default)]
pub struct SidecarOptions {
    /// `--consumer-name`; a unique name when unset.
    pub consumer_name: Option<String>,
    /// `--reclaim-min-idle-ms`.
    pub reclaim_min_idle_ms: Option<u64>,
    /// `--reclaim-interval-ms`.
    pub reclaim_interval_ms: Option<u64>,
    /// `--retry-backoff-initial-ms`.
    pub retry_backoff_initial_ms: Option<u64>,
    /// `--shutdown-grace-ms`.
    pub shutdown_grace_ms: Option<u64>,
    /// Any further arguments, passed last.
    pub extra_args: Vec<String>,
    /// Environment variables for the process (ECHOMQ_* of the test process are removed).
    pub env: Vec<(String, String)>,
    /// Do not pass `--consumer-name` (to test its default).
    pub omit_consumer_name: bool,
    /// Listen on a unix socket in the sidecar's temp dir instead of a TCP port.
    pub unix_socket: bool,
    /// `--redis-url` instead of the [`RedisServer`]'s plain URL (a password, a
    /// user, `rediss://`).
    pub redis_url: Option<String>,
}

impl SidecarOptions {
    pub fn named(name: &str) -> SidecarOptions {
        SidecarOptions { consumer_name: Some(name.to_owned()), ..SidecarOptions::default() }
    }

    pub fn reclaim(mut self, min_idle_ms: u64, interval_ms: u64) -> SidecarOptions {
        self.reclaim_min_idle_ms = Some(min_idle_ms);
        self.reclaim_interval_ms = Some(interval_ms);
        self
    }

    pub fn backoff(mut self, initial_ms: u64) -> SidecarOptions {
        self.retry_backoff_initial_ms = Some(initial_ms);
        self
    }

    pub fn grace(mut self, grace_ms: u64) -> SidecarOptions {
        self.shutdown_grace_ms = Some(grace_ms);
        self
    }

    pub fn arg(mut self, arg: &str) -> SidecarOptions {
        self.extra_args.push(arg.to_owned());
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> SidecarOptions {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }
}

/// The path of the sidecar binary cargo built for these tests.
pub fn sidecar_bin() -> &'static str {
    env!("CARGO_BIN_EXE_echomq-sidecar")
}

/// A `Command` for the sidecar binary with the test process' ECHOMQ_* and
/// POD_NAME variables removed, so only what a test passes counts.
pub fn sidecar_command() -> Command {
    let mut cmd = Command::new(sidecar_bin());
    for (key, _) in std::env::vars_os() {
        if let Some(key) = key.to_str() {
            if key.starts_with("ECHOMQ_") || key == "POD_NAME" {
                cmd.env_remove(key);
            }
        }
    }
    cmd
}

/// The arguments of a sidecar on `redis_url` with its gRPC and admin ports on
/// free loopback ports, to extend and pass to [`run_to_exit`].
pub fn local_args(redis_url: &str) -> Vec<String> {
    vec![
        "--redis-url".to_owned(),
        redis_url.to_owned(),
        "--listen".to_owned(),
        format!("127.0.0.1:{}", free_port()),
        "--admin-listen".to_owned(),
        format!("127.0.0.1:{}", free_port()),
    ]
}

/// The sidecar binary run to its end with `args`, killed (and the test
/// failed) if it still runs after `timeout`: for settings that must make it
/// exit at once.
pub fn run_to_exit<S: AsRef<std::ffi::OsStr>>(args: &[S], timeout: Duration) -> std::process::Output {
    let mut child = sidecar_command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sidecar");
    let deadline = Instant::now() + timeout;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            let shown: Vec<String> = args.iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect();
            panic!(
                "`echomq-sidecar {}` still ran after {timeout:?} (it must exit at once); stderr:\n{}",
                shown.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("wait")
}

/// A channel over the sidecar's unix socket at `path`, with TLS when `tls`
/// is set (`:authority` is `localhost`, as the sidecar's HTTP/2 server wants).
pub async fn unix_channel(
    path: PathBuf,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<Channel, tonic::transport::Error> {
    let endpoint = match tls {
        Some(tls) => tonic::transport::Endpoint::from_static("https://localhost").tls_config(tls)?,
        None => tonic::transport::Endpoint::from_static("http://localhost"),
    };
    endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}

/// A running `echomq-sidecar` process connected to a [`RedisServer`].
pub struct Sidecar {
    child: Option<Child>,
    grpc_port: u16,
    admin_port: u16,
    redis_url: String,
    consumer_name: String,
    options: SidecarOptions,
    log: PathBuf,
    dir: TempDir,
}

impl Sidecar {
    /// Starts the sidecar on free ports and waits until `/readyz` is 200 and the
    /// gRPC port accepts connections.
    pub async fn start(redis: &RedisServer, options: SidecarOptions) -> Sidecar {
        Sidecar::start_with_url(&redis.url(), options).await
    }

    /// As [`Sidecar::start`], with `--redis-url <redis_url>` (a cluster's seed
    /// list, say) instead of a [`RedisServer`]'s URL; `options.redis_url` still wins.
    pub async fn start_with_url(redis_url: &str, options: SidecarOptions) -> Sidecar {
        let mut sidecar = Sidecar::new(redis_url, options);
        for attempt in 0..3 {
            match sidecar.spawn_and_wait().await {
                Ok(()) => return sidecar,
                Err(reason) => {
                    let log = read_log(&sidecar.log);
                    let port_clash = log.contains("in use") || log.contains("AddrInUse");
                    if attempt < 2 && port_clash {
                        sidecar.grpc_port = free_port();
                        sidecar.admin_port = free_port();
                        continue;
                    }
                    panic!("sidecar did not start: {reason}\n----- sidecar log -----\n{log}");
                }
            }
        }
        unreachable!()
    }

    fn new(redis_url: &str, options: SidecarOptions) -> Sidecar {
        let dir = TempDir::new("sidecar");
        let log = dir.path().join("sidecar.log");
        let consumer_name = options.consumer_name.clone().unwrap_or_else(|| unique("consumer"));
        Sidecar {
            child: None,
            grpc_port: free_port(),
            admin_port: free_port(),
            redis_url: options.redis_url.clone().unwrap_or_else(|| redis_url.to_owned()),
            consumer_name,
            options,
            log,
            dir,
        }
    }

    /// Starts the sidecar on free ports without waiting for readiness: returns
    /// once `/livez` answers 200 or the process has exited (see
    /// [`Sidecar::exit_status`]), for tests of a sidecar that must not become
    /// ready. Panics if neither happens within [`START_TIMEOUT`].
    pub async fn launch(redis: &RedisServer, options: SidecarOptions) -> Sidecar {
        let mut sidecar = Sidecar::new(&redis.url(), options);
        sidecar.spawn_process().unwrap_or_else(|e| panic!("{e}"));
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if sidecar.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_some()) {
                return sidecar;
            }
            if http_status(sidecar.admin_port, "/livez").await == Some(200) {
                return sidecar;
            }
            assert!(
                Instant::now() < deadline,
                "the sidecar neither served /livez nor exited within {START_TIMEOUT:?}\n----- sidecar log -----\n{}",
                sidecar.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The exit status, if the process has exited (without waiting).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--redis-url".to_owned(),
            self.redis_url.clone(),
            "--listen".to_owned(),
            match self.unix_path() {
                Some(path) => format!("unix:{}", path.display()),
                None => format!("127.0.0.1:{}", self.grpc_port),
            },
            "--admin-listen".to_owned(),
            format!("127.0.0.1:{}", self.admin_port),
        ];
        let o = &self.options;
        if !o.omit_consumer_name {
            args.push("--consumer-name".to_owned());
            args.push(self.consumer_name.clone());
        }
        for (flag, value) in [
            ("--reclaim-min-idle-ms", o.reclaim_min_idle_ms),
            ("--reclaim-interval-ms", o.reclaim_interval_ms),
            ("--retry-backoff-initial-ms", o.retry_backoff_initial_ms),
            ("--shutdown-grace-ms", o.shutdown_grace_ms),
        ] {
            if let Some(value) = value {
                args.push(flag.to_owned());
                args.push(value.to_string());
            }
        }
        args.extend(o.extra_args.iter().cloned());
        args
    }

    async fn spawn_and_wait(&mut self) -> Result<(), String> {
        self.spawn_process()?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("the process exited during start-up with {status}"));
            }
            let grpc_up = match self.unix_path() {
                Some(path) => tokio::net::UnixStream::connect(path).await.is_ok(),
                None => tcp_accepts(self.grpc_port).await,
            };
            if grpc_up && http_status(self.admin_port, "/readyz").await == Some(200) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                if let Some(mut child) = self.child.take() {
                    kill_child(&mut child);
                }
                return Err(format!("/readyz was not 200 within {START_TIMEOUT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Spawns the process (its output appended to the log), without waiting.
    fn spawn_process(&mut self) -> Result<(), String> {
        let mut out = OpenOptions::new().create(true).append(true).open(&self.log).expect("sidecar log");
        let args = self.args();
        let _ = writeln!(out, "===== test fixture: starting {} {}", sidecar_bin(), args.join(" "));
        let err = out.try_clone().expect("sidecar log");
        let mut cmd = sidecar_command();
        cmd.args(&args).stdin(Stdio::null()).stdout(Stdio::from(out)).stderr(Stdio::from(err));
        cmd.env("NO_COLOR", "1");
        cmd.envs(self.options.env.iter().map(|(k, v)| (k, v)));
        // The sidecar's log filter (tracing syntax); ECHOMQ_TEST_LOG overrides the tests' default.
        let filter = std::env::var("ECHOMQ_TEST_LOG").unwrap_or_else(|_| "info,echomq=debug".to_owned());
        cmd.env("ECHOMQ_LOG", filter);
        self.child = Some(cmd.spawn().map_err(|e| format!("spawn {}: {e}", sidecar_bin()))?);
        Ok(())
    }

    /// `http://127.0.0.1:<grpc port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The unix socket the sidecar listens on, with `unix_socket` set.
    pub fn unix_path(&self) -> Option<PathBuf> {
        self.options.unix_socket.then(|| self.dir.path().join("grpc.sock"))
    }

    pub fn grpc_port(&self) -> u16 {
        self.grpc_port
    }

    pub fn admin_port(&self) -> u16 {
        self.admin_port
    }

    pub fn consumer_name(&self) -> &str {
        &self.consumer_name
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log(&self) -> String {
        read_log(&self.log)
    }

    /// A counter's value on `/metrics`, summed over its series (labels); 0
    /// when it has none yet (a series appears with its first value).
    pub async fn counter(&self, name: &str) -> f64 {
        let metrics = http_get(self.admin_port(), "/metrics").await.expect("GET /metrics").body;
        metrics
            .lines()
            .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// A new HTTP/2 channel to the gRPC port.
    pub async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(self.endpoint())
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.endpoint()))
    }

    /// A new plaintext HTTP/2 channel to the gRPC port; `Err` instead of a panic
    /// (for a TLS-only sidecar, where it must fail).
    pub async fn try_channel(&self) -> Result<Channel, tonic::transport::Error> {
        tonic::transport::Endpoint::from_shared(self.endpoint())
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
    }

    /// `https://127.0.0.1:<grpc port>`.
    pub fn https_endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.grpc_port)
    }

    /// A new TLS channel to the gRPC port with `tls` (see [`TestPki::client_tls`]).
    /// `Err` when the handshake fails (with TLS 1.3 a refused client
    /// certificate may only show on the first call).
    pub async fn try_tls_channel(
        &self,
        tls: tonic::transport::ClientTlsConfig,
    ) -> Result<Channel, tonic::transport::Error> {
        tonic::transport::Endpoint::from_shared(self.https_endpoint())
            .expect("endpoint")
            .tls_config(tls)?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
    }

    pub async fn consumer_client(&self) -> ConsumerServiceClient<Channel> {
        ConsumerServiceClient::new(self.channel().await)
    }

    pub async fn stream_client(&self) -> StreamServiceClient<Channel> {
        StreamServiceClient::new(self.channel().await)
    }

    pub async fn admin_client(&self) -> echomq::proto::admin_service_client::AdminServiceClient<Channel> {
        echomq::proto::admin_service_client::AdminServiceClient::new(self.channel().await)
    }

    pub async fn health_client(&self) -> tonic_health::pb::health_client::HealthClient<Channel> {
        tonic_health::pb::health_client::HealthClient::new(self.channel().await)
    }

    pub async fn readyz(&self) -> Option<u16> {
        http_status(self.admin_port, "/readyz").await
    }

    pub async fn livez(&self) -> Option<u16> {
        http_status(self.admin_port, "/livez").await
    }

    /// SIGKILL: the sidecar vanishes without settling anything.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
    }

    /// SIGTERM, through `kill -TERM <pid>`: starts the graceful shutdown.
    pub fn sigterm(&self) {
        let pid = self.pid().expect("sigterm: the sidecar is not running");
        let status = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().expect("run kill");
        assert!(status.success(), "kill -TERM {pid} failed: {status}");
    }

    /// Waits for the process to exit; `None` if it is still running after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let status = wait_child(child, timeout).await;
        if status.is_some() {
            self.child = None;
        }
        status
    }

    /// Starts the sidecar again with the same ports, consumer name and options
    /// (SIGKILLs it first if it still runs).
    pub async fn restart(&mut self) {
        self.kill9();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.spawn_and_wait().await {
                Ok(()) => return,
                Err(reason) if Instant::now() < deadline && read_log(&self.log).contains("in use") => {
                    eprintln!("restart: {reason}; retrying");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(reason) => panic!("sidecar did not restart: {reason}\n----- sidecar log -----\n{}", self.log()),
            }
        }
    }

    /// Appends one entry through the sidecar's Append call.
    pub async fn append(&self, stream: &str, fields: &[(&str, &[u8])]) -> AppendResponse {
        let request = AppendRequest {
            stream: stream.to_owned(),
            fields: fields.iter().map(|(k, v)| ((*k).to_owned(), v.to_vec())).collect(),
            ..Default::default()
        };
        self.stream_client()
            .await
            .append(request)
            .await
            .unwrap_or_else(|s| panic!("append to {stream}: {s:?}"))
            .into_inner()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.kill9();
        if print_logs_requested() {
            eprintln!(
                "----- sidecar {} (grpc :{}, admin :{}) log -----\n{}",
                self.consumer_name,
                self.grpc_port,
                self.admin_port,
                tail(&read_log(&self.log), 400)
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The Consume call
// ---------------------------------------------------------------------------

/// A Subscribe for `stream`/`group` starting at `start`, everything else default.
pub fn subscribe_msg(stream: &str, group: &str, start: GroupStart) -> Subscribe {
    Subscribe { stream: stream.to_owned(), group: group.to_owned(), group_start: start as i32, ..Subscribe::default() }
}

pub fn req(kind: Kind) -> ConsumeRequest {
    ConsumeRequest { kind: Some(kind) }
}

/// What a Consume call produced next.
#[derive(Debug)]
pub enum Event {
    Subscribed(Subscribed),
    Delivery(Delivery),
    VerdictError(VerdictError),
    /// A ConsumeResponse with no kind set.
    Empty,
    /// The call ended: `None` for a clean end (OK), the status otherwise.
    Ended(Option<Status>),
    /// Nothing arrived in time.
    Timeout,
}

/// One Consume call: requests go through a bounded channel, responses are read
/// from tonic's stream. Dropping it cancels the call (a client disconnect).
pub struct Consumer {
    tx: Option<mpsc::Sender<ConsumeRequest>>,
    rx: Streaming<ConsumeResponse>,
    ended: bool,
    /// The server's confirmation, once received.
    pub subscribed: Option<Subscribed>,
}

impl Consumer {
    /// Opens a Consume call whose first message is `first`, without waiting for
    /// any answer. `Err` when the server refuses the call before its first message.
    pub async fn open(sidecar: &Sidecar, first: ConsumeRequest) -> Result<Consumer, Status> {
        Consumer::open_on(sidecar.consumer_client().await, None, first).await
    }

    /// As [`Consumer::open`], on a client of the caller's making (TLS, say),
    /// with `authorization: Bearer <token>` when `token` is set.
    pub async fn open_on(
        mut client: ConsumerServiceClient<Channel>,
        token: Option<&str>,
        first: ConsumeRequest,
    ) -> Result<Consumer, Status> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(first).await.expect("queue the first message");
        let response = client.consume(with_token(ReceiverStream::new(rx), token)).await?;
        Ok(Consumer { tx: Some(tx), rx: response.into_inner(), ended: false, subscribed: None })
    }

    /// As [`Consumer::try_subscribe`], on a client of the caller's making.
    pub async fn try_subscribe_on(
        client: ConsumerServiceClient<Channel>,
        token: Option<&str>,
        subscribe: Subscribe,
    ) -> Result<Consumer, Status> {
        let consumer = Consumer::open_on(client, token, req(Kind::Subscribe(subscribe))).await?;
        consumer.confirm().await
    }

    /// Opens a call, subscribes and waits for `Subscribed`. `Err` carries the
    /// status the call ended with instead.
    pub async fn try_subscribe(sidecar: &Sidecar, subscribe: Subscribe) -> Result<Consumer, Status> {
        let consumer = Consumer::open(sidecar, req(Kind::Subscribe(subscribe))).await?;
        consumer.confirm().await
    }

    /// Waits for `Subscribed`; `Err` carries the status the call ended with instead.
    async fn confirm(self) -> Result<Consumer, Status> {
        let mut consumer = self;
        match consumer.next_event(Duration::from_secs(20)).await {
            Event::Subscribed(s) => {
                consumer.subscribed = Some(s);
                Ok(consumer)
            }
            Event::Ended(Some(status)) => Err(status),
            other => panic!("expected Subscribed, got {other:?}"),
        }
    }

    /// As [`Consumer::try_subscribe`], panicking when the subscription fails.
    pub async fn subscribe(sidecar: &Sidecar, subscribe: Subscribe) -> Consumer {
        let desc = format!("{}/{}", subscribe.stream, subscribe.group);
        Consumer::try_subscribe(sidecar, subscribe).await.unwrap_or_else(|s| panic!("subscribe {desc}: {s:?}"))
    }

    /// Subscribes with `max_in_flight` (0 = the sidecar's default).
    pub async fn start(
        sidecar: &Sidecar,
        stream: &str,
        group: &str,
        start: GroupStart,
        max_in_flight: u32,
    ) -> Consumer {
        let mut sub = subscribe_msg(stream, group, start);
        sub.max_in_flight = max_in_flight;
        Consumer::subscribe(sidecar, sub).await
    }

    /// Queues one client message.
    pub async fn send(&self, request: ConsumeRequest) {
        let tx = self.tx.as_ref().expect("the request side is closed");
        // A send error means the call is gone; the next read reports how it ended.
        let _ = tx.send(request).await;
    }

    pub async fn ack(&self, ids: &[&str]) {
        self.send(req(Kind::Ack(Ack { ids: ids.iter().map(|s| (*s).to_owned()).collect() }))).await;
    }

    pub async fn ack_one(&self, id: &str) {
        self.ack(&[id]).await;
    }

    /// Fail{id, retry_after} (no dead letter).
    pub async fn fail(&self, id: &str, retry_after: Option<Duration>) {
        self.send(req(Kind::Fail(Fail {
            id: id.to_owned(),
            reason: "test failure".to_owned(),
            retry_after: retry_after.map(|d| duration_ms(d.as_millis() as u64)),
            dead_letter: false,
            ..Default::default()
        })))
        .await;
    }

    /// Fail{id, reason, dead_letter: true}.
    pub async fn dead_letter(&self, id: &str, reason: &str) {
        self.send(req(Kind::Fail(Fail {
            id: id.to_owned(),
            reason: reason.to_owned(),
            retry_after: None,
            dead_letter: true,
            ..Default::default()
        })))
        .await;
    }

    /// Half-closes the call: no more client messages.
    pub fn close_send(&mut self) {
        self.tx = None;
    }

    /// The next thing the server sent, or `Timeout`.
    pub async fn next_event(&mut self, timeout: Duration) -> Event {
        if self.ended {
            return Event::Ended(None);
        }
        match tokio::time::timeout(timeout, self.rx.message()).await {
            Err(_) => Event::Timeout,
            Ok(Ok(Some(response))) => match response.kind {
                Some(ResponseKind::Subscribed(s)) => Event::Subscribed(s),
                Some(ResponseKind::Delivery(d)) => Event::Delivery(d),
                Some(ResponseKind::VerdictError(e)) => Event::VerdictError(e),
                None => Event::Empty,
            },
            Ok(Ok(None)) => {
                self.ended = true;
                Event::Ended(None)
            }
            Ok(Err(status)) => {
                self.ended = true;
                Event::Ended(Some(status))
            }
        }
    }

    /// The next delivery; panics on anything else (a verdict error, the end of the call, a timeout).
    pub async fn next_delivery(&mut self, timeout: Duration) -> Delivery {
        match self.next_event(timeout).await {
            Event::Delivery(d) => d,
            other => panic!("expected a delivery within {timeout:?}, got {other:?}"),
        }
    }

    /// `n` deliveries, each within `timeout` of the previous one.
    pub async fn deliveries(&mut self, n: usize, timeout: Duration) -> Vec<Delivery> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            match self.next_event(timeout).await {
                Event::Delivery(d) => out.push(d),
                other => panic!("expected delivery {} of {n}, got {other:?} (after {:?})", i + 1, ids(&out)),
            }
        }
        out
    }

    /// The next verdict error; panics on anything else.
    pub async fn next_verdict_error(&mut self, timeout: Duration) -> VerdictError {
        match self.next_event(timeout).await {
            Event::VerdictError(e) => e,
            other => panic!("expected a VerdictError within {timeout:?}, got {other:?}"),
        }
    }

    /// Asserts that the server sends nothing for `quiet`.
    pub async fn assert_quiet(&mut self, quiet: Duration, why: &str) {
        match self.next_event(quiet).await {
            Event::Timeout => {}
            other => panic!("expected nothing for {quiet:?} ({why}), got {other:?}"),
        }
    }

    /// Waits for the end of the call, skipping deliveries; the final status (None = OK).
    pub async fn wait_end(&mut self, timeout: Duration) -> Option<Status> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_event(left).await {
                Event::Ended(status) => return status,
                Event::Timeout => panic!("the call did not end within {timeout:?}"),
                _ => {}
            }
        }
    }
}

/// The branded ids of deliveries, in order.
pub fn ids(deliveries: &[Delivery]) -> Vec<String> {
    deliveries.iter().map(|d| d.id.clone()).collect()
}

/// Asserts a status code, printing the whole status otherwise.
#[track_caller]
pub fn assert_code(status: &Status, code: Code) {
    assert_eq!(status.code(), code, "unexpected status: {status:?}");
}

// ---------------------------------------------------------------------------
// Redis inspection
// ---------------------------------------------------------------------------

fn as_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        Value::SimpleString(s) => s.clone().into_bytes(),
        Value::Int(i) => i.to_string().into_bytes(),
        Value::Okay => b"OK".to_vec(),
        other => panic!("expected a string, got {other:?}"),
    }
}

fn as_string(v: &Value) -> String {
    String::from_utf8(as_bytes(v)).expect("utf-8")
}

fn as_int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => as_string(other).parse().unwrap_or_else(|_| panic!("expected an integer, got {other:?}")),
    }
}

fn as_array(v: &Value) -> &[Value] {
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

pub async fn pending_entries(con: &mut MultiplexedConnection, stream: &str, group: &str) -> Vec<PendingEntry> {
    let v: Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .arg("-")
        .arg("+")
        .arg(10_000)
        .query_async(con)
        .await
        .expect("XPENDING detail");
    as_array(&v)
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

/// `XINFO GROUPS stream` as one name → (field → value) map per group.
pub async fn groups(con: &mut MultiplexedConnection, stream: &str) -> BTreeMap<String, BTreeMap<String, Value>> {
    let v: Value = redis::cmd("XINFO").arg("GROUPS").arg(stream).query_async(con).await.expect("XINFO GROUPS");
    let mut out = BTreeMap::new();
    for group in as_array(&v) {
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

// ---------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------

/// A certificate and its private key, PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    /// A tonic identity (for a client certificate).
    pub fn identity(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(
            fs::read(&self.cert).expect("read certificate"),
            fs::read(&self.key).expect("read key"),
        )
    }
}

static SERIAL: AtomicU64 = AtomicU64::new(1);

/// A throw-away certificate authority made with the `openssl` CLI in a temp dir:
/// EC P-256 keys, X.509 v3, valid for two days. Issues server and client
/// certificates with the SANs a test asks for.
pub struct TestPki {
    name: String,
    ca: CertFiles,
    dir: TempDir,
}

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl (is it installed?)");
    assert!(
        out.status.success(),
        "openssl {} failed: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestPki {
    /// A new CA named `name` (its subject CN).
    pub fn new(name: &str) -> TestPki {
        let dir = TempDir::new("pki");
        let (cert, key) = (dir.path().join(format!("{name}-ca.pem")), dir.path().join(format!("{name}-ca.key")));
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                key.to_str().expect("utf-8 path"),
                "-out",
                cert.to_str().expect("utf-8 path"),
                "-days",
                "2",
                "-subj",
                &format!("/CN={name} test CA"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-addext",
                "subjectKeyIdentifier=hash",
            ],
            dir.path(),
        );
        TestPki { name: name.to_owned(), ca: CertFiles { cert, key }, dir }
    }

    /// The CA certificate (PEM file).
    pub fn ca_cert(&self) -> &Path {
        &self.ca.cert
    }

    /// The CA certificate's PEM text.
    pub fn ca_pem(&self) -> Vec<u8> {
        fs::read(&self.ca.cert).expect("read CA certificate")
    }

    /// A directory for the test's other files, removed with the PKI.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Issues a certificate named `file` (files `<file>.pem`, `<file>.key`) with
    /// subject CN `cn`, the given SANs in openssl syntax (`DNS:localhost`,
    /// `IP:127.0.0.1`, `URI:spiffe://echomq/billing`) and the extended key usage
    /// `eku` (`serverAuth`, `clientAuth`).
    pub fn issue(&self, file: &str, cn: &str, sans: &[&str], eku: &str) -> CertFiles {
        let dir = self.dir.path();
        let (cert, key, csr, ext) = (
            dir.join(format!("{file}.pem")),
            dir.join(format!("{file}.key")),
            dir.join(format!("{file}.csr")),
            dir.join(format!("{file}.ext")),
        );
        let path = |p: &PathBuf| p.to_str().expect("utf-8 path").to_owned();
        openssl(
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &path(&key),
                "-out",
                &path(&csr),
                "-subj",
                &format!("/CN={cn}"),
            ],
            dir,
        );
        let mut extensions = vec![
            "basicConstraints=critical,CA:FALSE".to_owned(),
            "keyUsage=critical,digitalSignature".to_owned(),
            format!("extendedKeyUsage={eku}"),
            "subjectKeyIdentifier=hash".to_owned(),
            "authorityKeyIdentifier=keyid".to_owned(),
        ];
        if !sans.is_empty() {
            extensions.push(format!("subjectAltName={}", sans.join(",")));
        }
        fs::write(&ext, extensions.join("\n") + "\n").expect("write extensions file");
        let serial = format!("{}{:06}", std::process::id(), SERIAL.fetch_add(1, Ordering::Relaxed));
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                &path(&csr),
                "-CA",
                &path(&self.ca.cert),
                "-CAkey",
                &path(&self.ca.key),
                "-set_serial",
                &serial,
                "-days",
                "2",
                "-out",
                &path(&cert),
                "-extfile",
                &path(&ext),
            ],
            dir,
        );
        CertFiles { cert, key }
    }

    /// A server certificate for `localhost` and `127.0.0.1`.
    pub fn server_cert(&self) -> CertFiles {
        self.issue(&format!("{}-server", self.name), "localhost", &["DNS:localhost", "IP:127.0.0.1"], "serverAuth")
    }

    /// A client certificate with the given SANs.
    pub fn client_cert(&self, file: &str, sans: &[&str]) -> CertFiles {
        self.issue(file, file, sans, "clientAuth")
    }

    /// A client TLS config trusting this CA for the server name `localhost`,
    /// presenting `identity` when given.
    pub fn client_tls(&self, identity: Option<&CertFiles>) -> tonic::transport::ClientTlsConfig {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(self.ca_pem()))
            .domain_name("localhost");
        match identity {
            Some(files) => tls.identity(files.identity()),
            None => tls,
        }
    }
}

// ---------------------------------------------------------------------------
// Durable Redis and graceful Redis restarts (the chaos suite)
// ---------------------------------------------------------------------------

impl RedisOptions {
    /// Persistence on: `--appendonly yes --appendfsync always`, so every write
    /// is in the append-only file before Redis answers it and a graceful
    /// restart ([`RedisServer::restart_gracefully`]) reloads all of it.
    pub fn append_only() -> RedisOptions {
        let args = ["--appendonly", "yes", "--appendfsync", "always"];
        RedisOptions { args: args.iter().map(|a| (*a).to_owned()).collect(), ..RedisOptions::default() }
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
    /// The redis-server process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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

impl Sidecar {
    /// The log from byte `offset` on, and the offset of its end: a test that
    /// checks the log after every step reads each line once.
    pub fn log_from(&self, offset: u64) -> (String, u64) {
        use std::io::{Seek as _, SeekFrom};
        let mut bytes = Vec::new();
        if let Ok(mut f) = File::open(&self.log) {
            if f.seek(SeekFrom::Start(offset)).is_ok() {
                let _ = f.read_to_end(&mut bytes);
            }
        }
        let end = offset + bytes.len() as u64;
        (String::from_utf8_lossy(&bytes).into_owned(), end)
    }
}
