//! The real `echomq-sidecar` binary as a fixture: started on free loopback
//! ports against a [`RedisServer`], waited for until ready, its gRPC channels
//! and clients, SIGKILL, SIGTERM and restart, its log; and the binary run to
//! its end for settings that must make it exit at once.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use echomq::proto::consumer_service_client::ConsumerServiceClient;
use echomq::proto::stream_service_client::StreamServiceClient;
use echomq::proto::{AppendBatchRequest, AppendRequest, AppendResponse, BatchEntry};
use tonic::transport::Channel;

use super::http::{http_get, http_status};
use super::process::{
    free_port, kill_child, print_logs_requested, read_log, tail, tcp_accepts, unique, wait_child, TempDir,
    START_TIMEOUT,
};
use super::redis_server::RedisServer;

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
        // The sidecar's log filter (tracing syntax); ECHOMQ_TEST_LOG overrides the tests' default,
        // and a test's own ECHOMQ_LOG (set next) overrides both.
        let filter = std::env::var("ECHOMQ_TEST_LOG").unwrap_or_else(|_| "info,echomq=debug".to_owned());
        cmd.env("ECHOMQ_LOG", filter);
        // ECHOMQ_TEST_SHARED_READERS (auto, on, off) runs a suite's sidecars with those readers;
        // a test's own --shared-readers flag wins.
        if let Ok(mode) = std::env::var("ECHOMQ_TEST_SHARED_READERS") {
            cmd.env("ECHOMQ_SHARED_READERS", mode);
        }
        cmd.envs(self.options.env.iter().map(|(k, v)| (k, v)));
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

    /// The log from byte `offset` on, and the offset of its end: a test that
    /// checks the log after every step reads each line once.
    pub fn log_from(&self, offset: u64) -> (String, u64) {
        let mut bytes = Vec::new();
        if let Ok(mut f) = File::open(&self.log) {
            if f.seek(SeekFrom::Start(offset)).is_ok() {
                let _ = f.read_to_end(&mut bytes);
            }
        }
        let end = offset + bytes.len() as u64;
        (String::from_utf8_lossy(&bytes).into_owned(), end)
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

    /// Waits up to `EVENT_TIMEOUT` for [`Sidecar::counter`]`(name)` to be
    /// `expected`; panics with the last value otherwise.
    pub async fn wait_counter(&self, name: &str, expected: f64) {
        let deadline = Instant::now() + super::process::EVENT_TIMEOUT;
        loop {
            let last = self.counter(name).await;
            if last == expected {
                return;
            }
            assert!(Instant::now() < deadline, "{name} stayed {last}, want {expected}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
        self.signal("TERM");
    }

    /// `kill -<signal> <pid>` (`STOP` pauses it: its sockets stay open and it
    /// answers nothing; `CONT` resumes it).
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().unwrap_or_else(|| panic!("kill -{signal}: the sidecar is not running"));
        let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed: {status}");
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

    /// Appends `n` entries to `stream` one Append at a time, with a field
    /// `n` of 0, 1, …, and returns their answers in order.
    pub async fn append_numbered(&self, stream: &str, n: usize) -> Vec<AppendResponse> {
        let mut appended = Vec::with_capacity(n);
        for i in 0..n {
            appended.push(self.append(stream, &[("n", i.to_string().as_bytes())]).await);
        }
        appended
    }

    /// Appends `entries` to `stream` in one AppendBatch call (all or none)
    /// and returns what it wrote, in order.
    pub async fn append_batch(&self, stream: &str, entries: Vec<BatchEntry>) -> Vec<AppendResponse> {
        let request = AppendBatchRequest { stream: stream.to_owned(), entries, ..Default::default() };
        self.stream_client().await.append_batch(request).await.expect("append batch").into_inner().entries
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

/// The services reflection (v1) lists.
pub async fn list_services(sidecar: &Sidecar) -> Vec<String> {
    list_services_on(sidecar.channel().await).await
}

/// The services reflection (v1) lists on `channel`.
pub async fn list_services_on(channel: Channel) -> Vec<String> {
    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
        server_reflection_response::MessageResponse, ServerReflectionRequest,
    };
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers =
        client.server_reflection_info(tokio_stream::iter([request])).await.expect("reflection").into_inner();
    match answers.message().await.expect("a reflection answer").and_then(|a| a.message_response) {
        Some(MessageResponse::ListServicesResponse(list)) => list.service.into_iter().map(|s| s.name).collect(),
        other => panic!("reflection answered {other:?}"),
    }
}
