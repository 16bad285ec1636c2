//! What the consume and cluster benches share: `main`'s argument and
//! environment handling, the printing helpers, the gRPC calls they make alike
//! (AppendBatch, a Consume call acking each delivery), and the processes they
//! start (the sidecar here; `redis-server` with the tests' launcher,
//! `tests/support/redis_server.rs`, taken in below with the process helpers it
//! stands on, so tests and benches start Redis one way).
//!
//! A subdirectory's `mod.rs` is not a bench target of its own: each bench takes
//! it in with `mod common;`.

// The tests' files, as they are: a bench uses only part of them.
#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/support/process.rs"]
pub(crate) mod process;
#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/support/redis_server.rs"]
pub(crate) mod redis_server;

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use echomq::proto::{
    consume_request::Kind, consume_response::Kind as Event, consumer_service_client::ConsumerServiceClient,
    stream_service_client::StreamServiceClient, Ack, AppendBatchRequest, BatchEntry, ConsumeRequest, ConsumeResponse,
    GroupStart, Subscribe,
};
use redis::{aio::MultiplexedConnection, AsyncConnectionConfig, Value};
use tokio::{io::AsyncReadExt, io::AsyncWriteExt, sync::mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{transport::Channel, Streaming};

use process::{free_port, START_TIMEOUT};

/// Entries per (logical) stream unless `ECHOMQ_BENCH_ENTRIES` says otherwise.
const DEFAULT_ENTRIES: usize = 50_000;
/// Entries per (logical) stream in the smoke run under `cargo test`.
const SMOKE_ENTRIES: usize = 2_000;
/// Entries per AppendBatch call.
pub(crate) const APPEND_BATCH: usize = 1_000;
/// The Consume call's `max_in_flight` (on a sharded stream the sidecar splits
/// it over the shards), and the consume bench's direct consumer's COUNT.
pub(crate) const WINDOW: usize = 256;
/// Bytes of the `body` field of every entry.
pub(crate) const BODY_BYTES: usize = 100;
/// No phase may take longer than this.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// A bench's `main`: `cargo bench` passes `--bench`, which makes the full run;
/// without it (`cargo test`) it is the smoke run. The entry count comes from
/// `ECHOMQ_BENCH_ENTRIES`, else [`DEFAULT_ENTRIES`] (full) or
/// [`SMOKE_ENTRIES`] (smoke). Then `run(full, entries)` on a multi-thread
/// runtime; exit 2 on a bad `ECHOMQ_BENCH_ENTRIES`, 1 when the run fails.
pub(crate) fn main<F>(bench: &str, run: impl FnOnce(bool, usize) -> F) -> ExitCode
where
    F: Future<Output = Result<(), Error>>,
{
    let full = std::env::args().any(|arg| arg == "--bench");
    let entries = match std::env::var("ECHOMQ_BENCH_ENTRIES") {
        Ok(text) => match text.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("{bench} bench: ECHOMQ_BENCH_ENTRIES must be a positive integer, got `{text}`");
                return ExitCode::from(2);
            }
        },
        Err(_) if full => DEFAULT_ENTRIES,
        Err(_) => SMOKE_ENTRIES,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{bench} bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(full, entries)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{bench} bench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------

/// The first line of the report; the smoke run says its figures mean nothing.
pub(crate) fn print_title(bench: &str, full: bool) {
    println!(
        "EchoMQ {bench} benchmark{}",
        if full {
            String::new()
        } else {
            format!(
                " (smoke run under `cargo test`: small counts, debug build; the figures mean nothing, run `cargo bench --bench {bench}`)"
            )
        }
    );
}

/// The CPUs this process may run on (0 when unknown).
pub(crate) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(0, usize::from)
}

/// The 1-minute load average (`?` when unknown). Other work on the machine
/// skews every figure: the report says how busy it was.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// The server's `redis_version` (`INFO server`; `?` when it does not say).
pub(crate) async fn redis_version(redis: &mut MultiplexedConnection) -> Result<String, Error> {
    let info: String = redis::cmd("INFO").arg("server").query_async(redis).await?;
    Ok(info.lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("?").trim().to_owned())
}

/// Rounds of alternated contenders: `ECHOMQ_BENCH_ROUNDS` (a positive
/// integer, else the default), by default 3 for a full run and 1 for the smoke run.
#[allow(dead_code)] // the consume bench's
pub(crate) fn rounds(full: bool) -> usize {
    let default = if full { 3 } else { 1 };
    std::env::var("ECHOMQ_BENCH_ROUNDS").ok().and_then(|t| t.parse().ok()).filter(|&n| n > 0).unwrap_or(default)
}

/// Runs one phase under [`PHASE_TIMEOUT`].
pub(crate) async fn phase<T>(name: &str, work: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
    tokio::time::timeout(PHASE_TIMEOUT, work).await.map_err(|_| format!("{name}: not done within {PHASE_TIMEOUT:?}"))?
}

/// Entries per second.
pub(crate) fn rate(entries: usize, took: Duration) -> f64 {
    entries as f64 / took.as_secs_f64()
}

/// The median of `values` (the upper one of an even count; 0 when empty).
#[allow(dead_code)] // the append and scheduled benches'
pub(crate) fn median_f64(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// `12345.6` as `12,346`.
pub(crate) fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ---------------------------------------------------------------------------
// gRPC and Redis calls
// ---------------------------------------------------------------------------

/// Appends `entries` entries to `stream`, `batch` per AppendBatch call: fields
/// `n` (the entry's number) and a [`BODY_BYTES`]-byte `body`. The time from
/// the first call until the last returns.
#[allow(dead_code)] // all but the keys bench's, which appends keyed entries
pub(crate) async fn append(
    streams: &mut StreamServiceClient<Channel>,
    stream: &str,
    entries: usize,
    batch: usize,
) -> Result<Duration, Error> {
    append_due(streams, stream, entries, batch, None).await
}

/// As [`append`], each entry scheduled for `deliver_at` when given
/// (`BatchEntry.deliver_at`).
pub(crate) async fn append_due(
    streams: &mut StreamServiceClient<Channel>,
    stream: &str,
    entries: usize,
    batch: usize,
    deliver_at: Option<prost_types::Timestamp>,
) -> Result<Duration, Error> {
    let body = vec![b'x'; BODY_BYTES];
    let started = Instant::now();
    for first in (0..entries).step_by(batch) {
        let entries = (first..(first + batch).min(entries))
            .map(|n| BatchEntry {
                fields: HashMap::from([
                    ("n".to_owned(), n.to_string().into_bytes()),
                    ("body".to_owned(), body.clone()),
                ]),
                deliver_at,
                ..Default::default()
            })
            .collect();
        streams.append_batch(AppendBatchRequest { stream: stream.to_owned(), entries, ..Default::default() }).await?;
    }
    Ok(started.elapsed())
}

pub(crate) fn subscribe(
    stream: &str,
    group: &str,
    start: GroupStart,
    max_in_flight: usize,
    max_batch: u32,
) -> ConsumeRequest {
    ConsumeRequest {
        kind: Some(Kind::Subscribe(Subscribe {
            stream: stream.to_owned(),
            group: group.to_owned(),
            group_start: start as i32,
            max_in_flight: max_in_flight as u32,
            max_batch,
            ..Subscribe::default()
        })),
    }
}

/// An `Ack` message with these ids.
pub(crate) fn ack_ids(ids: Vec<String>) -> ConsumeRequest {
    ConsumeRequest { kind: Some(Kind::Ack(Ack { ids })) }
}

/// An open Consume call.
pub(crate) struct ConsumeCall {
    /// The client the call runs on, kept as long as the call.
    _client: ConsumerServiceClient<Channel>,
    /// The client's side: verdicts (the subscribe is already sent).
    pub(crate) verdicts: mpsc::Sender<ConsumeRequest>,
    /// The sidecar's side: Subscribed, deliveries, verdict errors.
    pub(crate) inbound: Streaming<ConsumeResponse>,
    /// When the call was made, the subscribe queued: throughput is timed from here.
    pub(crate) started: Instant,
    /// gRPC message bytes [`ConsumeCall::ack_each`] received and sent, each
    /// message's protobuf encoding plus gRPC's 5-byte length prefix (not
    /// HTTP/2's frame headers).
    pub(crate) message_bytes: u64,
}

impl ConsumeCall {
    /// Opens a Consume call subscribed to `stream` as `group`, `max_in_flight`
    /// [`WINDOW`].
    #[allow(dead_code)] // the cluster bench's
    pub(crate) async fn open(
        endpoint: &str,
        stream: &str,
        group: &str,
        start: GroupStart,
    ) -> Result<ConsumeCall, Error> {
        ConsumeCall::open_batched(endpoint, stream, group, start, 0).await
    }

    /// [`ConsumeCall::open`] asking for frames of up to `max_batch` deliveries.
    pub(crate) async fn open_batched(
        endpoint: &str,
        stream: &str,
        group: &str,
        start: GroupStart,
        max_batch: u32,
    ) -> Result<ConsumeCall, Error> {
        ConsumeCall::open_window(endpoint, stream, group, start, WINDOW, max_batch).await
    }

    /// [`ConsumeCall::open_batched`] with a `max_in_flight` of its own (entries).
    pub(crate) async fn open_window(
        endpoint: &str,
        stream: &str,
        group: &str,
        start: GroupStart,
        max_in_flight: usize,
        max_batch: u32,
    ) -> Result<ConsumeCall, Error> {
        ConsumeCall::open_with(endpoint, subscribe(stream, group, start, max_in_flight, max_batch)).await
    }

    /// Opens a Consume call whose first message is `subscribe` (a
    /// `ConsumeRequest` holding a `Subscribe`), for settings the other
    /// constructors do not take (the keys bench's `key_field`).
    pub(crate) async fn open_with(endpoint: &str, subscribe: ConsumeRequest) -> Result<ConsumeCall, Error> {
        let max_in_flight = match &subscribe.kind {
            Some(Kind::Subscribe(s)) => s.max_in_flight as usize,
            _ => WINDOW,
        };
        let mut client = ConsumerServiceClient::connect(endpoint.to_owned()).await?;
        let (verdicts, outbound) = mpsc::channel(4 * max_in_flight.max(WINDOW));
        verdicts.send(subscribe).await?;
        let started = Instant::now();
        let inbound = client.consume(ReceiverStream::new(outbound)).await?.into_inner();
        Ok(ConsumeCall { _client: client, verdicts, inbound, started, message_bytes: 0 })
    }

    /// Receives until `entries` distinct entries were delivered, acking each as
    /// it arrives (one `Ack` message, one id); `from` is told the stream key of
    /// each (on a sharded stream, the shard's). Fails on a delivery without the
    /// field `n`, one delivered twice, a verdict error, or the end of the call.
    /// The ids seen: the caller drops them once its timing is done, so freeing
    /// them is not timed.
    pub(crate) async fn ack_each(
        &mut self,
        entries: usize,
        mut from: impl FnMut(String),
    ) -> Result<HashSet<String>, Error> {
        let mut seen = HashSet::with_capacity(entries);
        while seen.len() < entries {
            let message = self.inbound.message().await?.ok_or("the sidecar ended the call early")?;
            self.message_bytes += GRPC_PREFIX + prost::Message::encoded_len(&message) as u64;
            let deliveries = match message.kind {
                Some(Event::Delivery(delivery)) => vec![delivery],
                Some(Event::Batch(batch)) => batch.deliveries,
                Some(Event::VerdictError(e)) => return Err(format!("verdict error: {e:?}").into()),
                Some(Event::Emitted(e)) => {
                    return Err(format!("an Emitted answer, though no AckEmit was sent: {e:?}").into())
                }
                Some(Event::Subscribed(_)) | None => continue,
            };
            let mut ids = Vec::with_capacity(deliveries.len());
            for delivery in deliveries {
                if !delivery.payload.contains_key("n") {
                    return Err(format!("delivery {} has no field `n`", delivery.id).into());
                }
                if !seen.insert(delivery.id.clone()) {
                    return Err(format!("entry {} was delivered twice", delivery.id).into());
                }
                from(delivery.stream);
                ids.push(delivery.id);
            }
            // One Ack message per frame: one id for a single delivery, all of a batch's.
            let ack = ack_ids(ids);
            self.message_bytes += GRPC_PREFIX + prost::Message::encoded_len(&ack) as u64;
            self.verdicts.send(ack).await?;
        }
        Ok(seen)
    }
}

/// gRPC's length prefix of each message (bytes): a compressed flag and a
/// 4-byte length.
const GRPC_PREFIX: u64 = 5;

/// A direct consumer's XREADGROUP BLOCK (ms), as the sidecar's default.
pub(crate) const DIRECT_BLOCK_MS: u64 = 2_000;

/// `XGROUP CREATE <stream> <group> <start> MKSTREAM`.
#[allow(dead_code)] // the consume and peers benches'
pub(crate) async fn create_group(
    conn: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
    start: &str,
) -> Result<(), Error> {
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg(start)
        .arg("MKSTREAM")
        .query_async::<()>(conn)
        .await?;
    Ok(())
}

/// One `XREADGROUP GROUP <group> <consumer> COUNT <count> BLOCK` [`DIRECT_BLOCK_MS`]
/// `STREAMS <stream> >`, as a direct consumer reads: the entries (none when
/// the BLOCK time passed).
#[allow(dead_code)] // the consume and peers benches'
pub(crate) async fn read_group(
    conn: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
    consumer: &str,
    count: usize,
) -> Result<Vec<echomq::redis::RawEntry>, Error> {
    let reply: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(DIRECT_BLOCK_MS)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(conn)
        .await?;
    Ok(echomq::redis::parse_read_reply(reply)?)
}

/// One `XACK` of every id of `read` (nothing for none); an error unless
/// Redis acknowledged them all.
#[allow(dead_code)] // the consume and peers benches'
pub(crate) async fn ack_all(
    conn: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
    read: &[echomq::redis::RawEntry],
) -> Result<(), Error> {
    if read.is_empty() {
        return Ok(());
    }
    let mut xack = redis::cmd("XACK");
    xack.arg(stream).arg(group);
    for entry in read {
        xack.arg(entry.id.to_string());
    }
    let acked: usize = xack.query_async(conn).await?;
    if acked != read.len() {
        return Err(format!("XACK acknowledged {acked} of {} entries", read.len()).into());
    }
    Ok(())
}

/// Redis' CPU time so far, user and system (`INFO cpu`).
#[allow(dead_code)] // the consume and scale benches'
pub(crate) async fn redis_cpu(redis: &mut MultiplexedConnection) -> Result<Duration, Error> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(redis).await?;
    let seconds = |key: &str| info.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse::<f64>().ok());
    Ok(Duration::from_secs_f64(seconds("used_cpu_user:").unwrap_or(0.0) + seconds("used_cpu_sys:").unwrap_or(0.0)))
}

/// The group's pending count (`XPENDING <stream> <group>`, summary form).
pub(crate) async fn pending(redis: &mut MultiplexedConnection, stream: &str, group: &str) -> Result<i64, Error> {
    let reply: Value = redis::cmd("XPENDING").arg(stream).arg(group).query_async(redis).await?;
    match reply {
        Value::Array(parts) => match parts.first() {
            Some(Value::Int(n)) => Ok(*n),
            other => Err(format!("unexpected XPENDING reply: {other:?}").into()),
        },
        other => Err(format!("unexpected XPENDING reply: {other:?}").into()),
    }
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// The sidecar binary: `ECHOMQ_SIDECAR_BIN` if set (to measure another build,
/// before and after a change), else the one cargo built for the bench
/// (`cargo bench`: release profile; `cargo test`: debug).
pub(crate) fn sidecar_bin() -> PathBuf {
    std::env::var_os("ECHOMQ_SIDECAR_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_echomq-sidecar")), PathBuf::from)
}

/// A new directory `<prefix>-<pid>` under cargo's target tmpdir for the run's
/// sidecar log; the bench removes it when the run succeeds. (Redis keeps its
/// own in a temp dir removed with it: `ECHOMQ_TEST_LOGS=1` prints its log tail.)
pub(crate) fn work_dir(prefix: &str) -> Result<PathBuf, Error> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A child process, SIGKILLed and reaped on drop.
pub(crate) struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A new connection to the `redis-server` on a loopback port, with no response
/// timeout (the consumers block). It does not follow MOVED: on a cluster node,
/// each key is asked of the primary serving it.
pub(crate) async fn connection(port: u16) -> Result<MultiplexedConnection, Error> {
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    Ok(client.get_multiplexed_async_connection_with_config(&config).await?)
}

/// The sidecar binary on free loopback ports, logging to `sidecar.log`.
pub(crate) struct Sidecar {
    pub(crate) grpc_port: u16,
    process: Process,
}

impl Sidecar {
    /// CPU time the process has used so far, all threads, user and system
    /// (`/proc/<pid>/stat`, in clock ticks of 10 ms); zero where unknown.
    #[allow(dead_code)] // the consume bench's
    pub(crate) fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.process.0.id())).unwrap_or_default();
        // Fields after the command name (which may hold spaces): state is 3rd, utime 14th, stime 15th.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let ticks: u64 = after.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<u64>().ok()).sum();
        Duration::from_millis(ticks * 10)
    }

    /// The process's resident set size now and its peak so far
    /// (`VmRSS`, `VmHWM` of `/proc/<pid>/status`), in bytes; zero where unknown.
    #[allow(dead_code)] // the consume bench's
    pub(crate) fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.0.id())).unwrap_or_default();
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        };
        (kib("VmRSS:").unwrap_or(0) * 1024, kib("VmHWM:").unwrap_or(0) * 1024)
    }

    /// Starts `bin` against `redis_url` (comma-separated seeds for a cluster)
    /// with `args` added (consumer name `bench` unless they give one), without the caller's `ECHOMQ_*` environment; returned
    /// once `/readyz` says 200.
    pub(crate) async fn start(bin: &Path, redis_url: &str, args: &[&str], dir: &Path) -> Result<Sidecar, Error> {
        let (grpc_port, admin_port) = (free_port(), free_port());
        let log = std::fs::File::create(dir.join("sidecar.log"))?;
        let mut command = Command::new(bin);
        for (key, _) in std::env::vars() {
            if key.starts_with("ECHOMQ_") {
                command.env_remove(key);
            }
        }
        let child = command
            .arg("--redis-url")
            .arg(redis_url)
            .arg("--listen")
            .arg(format!("127.0.0.1:{grpc_port}"))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{admin_port}"))
            .args(if args.contains(&"--consumer-name") { &[][..] } else { &["--consumer-name", "bench"][..] })
            .args(args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let sidecar = Sidecar { grpc_port, process: Process(child) };
        let deadline = Instant::now() + START_TIMEOUT;
        while http_status(admin_port, "/readyz").await != Some(200) {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("sidecar.log")).unwrap_or_default();
                return Err(format!("the sidecar did not become ready; its log:\n{log}").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(sidecar)
    }
}

/// The status code of `GET <path>` on a loopback port (plain HTTP/1.0).
async fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await.ok()?;
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut reply)).await.ok()?.ok()?;
    String::from_utf8_lossy(&reply).split_whitespace().nth(1)?.parse().ok()
}
