//! The chaos suites' shared machinery (`tests/chaos.rs`, `tests/chaos_net.rs`):
//! the ledger every party records into, the appender, the clients and their
//! handlers, the wait for everything to settle, and the verdict on the end
//! state. Each suite brings its own faults (an injector) and its report line.
//!
//! Entries carry unique keys (field `k` = their index). Handlers fail
//! [`FAIL_PERCENT`] of their calls and drop a few calls on their own; one key
//! in [`POISON_EVERY`] is a poison entry whose handler always fails and asks
//! for the dead-letter stream from its second delivery on. Clients reconnect
//! on any error. At the end every key must be acked or dead-lettered, the PEL
//! empty; duplicates are counted, never a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use echomq::proto::consume_request::Kind;
use echomq::proto::consume_response::Kind as ResponseKind;
use echomq::proto::consumer_service_client::ConsumerServiceClient;
use echomq::proto::stream_service_client::StreamServiceClient;
use echomq::proto::{
    Ack, AppendBatchRequest, BatchEntry, ConsumeRequest, Fail, GroupStart, Subscribe, VerdictErrorCode,
};
use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::consume::req;
use super::redis_probe::{last_delivered_id, pending_count, pending_entries, try_pending_count};
use super::sidecar::Sidecar;
use super::wire::{duration_ms, is_branded, parse_stream_id};

pub const STREAM: &str = "chaos";
pub const GROUP: &str = "chaos-group";
pub const DEAD_LETTERS: &str = "chaos:dlq";
/// Deliveries each call may hold.
pub const MAX_IN_FLIGHT: u32 = 16;
/// High enough that dead-lettering is rare (a key must fail ~50 times), low enough that it can happen.
pub const MAX_DELIVERIES: u32 = 50;
/// Handler calls that answer Fail, in percent.
pub const FAIL_PERCENT: u32 = 5;
/// One key in this many is a poison entry, never acked: it must end in the dead-letter stream.
pub const POISON_EVERY: usize = 250;

pub fn is_poison(k: usize) -> bool {
    k % POISON_EVERY == POISON_EVERY - 1
}
/// Handler calls after which the client drops its call on its own, per 10,000.
pub const HANDLER_DROP_PER_10K: u32 = 20;
/// Entries per AppendBatch.
pub const APPEND_BATCH: usize = 100;

pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| panic!("{name}={text:?} is not a valid value")),
        Err(_) => default,
    }
}

/// The run's size and knobs (see the module doc).
#[derive(Debug, Clone)]
pub struct Settings {
    pub entries: usize,
    pub append_window: Duration,
    pub clients_per_sidecar: usize,
    pub redis_restarts: usize,
    pub timeout: Duration,
    pub seed: u64,
}

impl Settings {
    /// The settings from `<prefix>_ENTRIES`, `<prefix>_APPEND_SECS` (default
    /// `max(min_window_secs, entries / 1,500)`), `<prefix>_CLIENTS` (default 3),
    /// `<prefix>_REDIS_RESTARTS` (default 2), `<prefix>_TIMEOUT_SECS` (default
    /// the window + 90) and `<prefix>_SEED`; `entries` and `min_window_secs`
    /// are the suite's CI size.
    pub fn from_env(prefix: &str, entries: usize, min_window_secs: f64) -> Settings {
        let var = |name: &str| format!("{prefix}_{name}");
        let entries: usize = env_or(&var("ENTRIES"), entries);
        assert!(entries > 0, "{} must be above 0", var("ENTRIES"));
        let append_secs: f64 = env_or(&var("APPEND_SECS"), (entries as f64 / 1_500.0).max(min_window_secs));
        let append_window = Duration::from_secs_f64(append_secs);
        let timeout_secs: f64 = env_or(&var("TIMEOUT_SECS"), append_secs + 90.0);
        let default_seed = fastrand::u64(..);
        Settings {
            entries,
            append_window,
            clients_per_sidecar: env_or(&var("CLIENTS"), 3),
            redis_restarts: env_or(&var("REDIS_RESTARTS"), 2),
            timeout: Duration::from_secs_f64(timeout_secs),
            seed: env_or(&var("SEED"), default_seed),
        }
    }

    /// Each fault kind's budget: about one every 1.5 seconds of the window.
    pub fn fault_budget(&self) -> usize {
        ((self.append_window.as_secs_f64() / 1.5).ceil() as usize).max(4)
    }
}

/// What everyone records. Keys are the entries' indexes (field `k`).
pub struct Ledger {
    pub n: usize,
    /// k → (branded id, stream id), filled by the appender.
    pub appended: Mutex<Vec<Option<(String, String)>>>,
    pub appended_count: AtomicUsize,
    pub appends_done: AtomicBool,
    /// Handler calls per key.
    pub handled: Vec<AtomicU32>,
    /// An Ack was sent for the key (by a handler, on the call that held it).
    pub acked: Vec<AtomicBool>,
    pub acked_keys: AtomicUsize,
    /// The branded id the key was first delivered with; later deliveries must agree.
    pub delivered_id: Vec<OnceLock<String>>,
    pub anomalies: Mutex<Vec<String>>,
    pub handler_calls: AtomicU64,
    pub fails_sent: AtomicU64,
    pub acks_sent: AtomicU64,
    /// Deliveries of a key whose Ack had already been sent.
    pub delivered_after_ack: AtomicU64,
    pub drops_by_handler: AtomicU64,
    pub drops_by_injector: AtomicU64,
    pub max_attempts: AtomicU32,
    pub calls_opened: AtomicU64,
    pub call_ends: Mutex<BTreeMap<String, u64>>,
    pub verdict_errors: Mutex<BTreeMap<String, u64>>,
    pub deliveries_by_sidecar: Vec<AtomicU64>,
    /// Set by the injector: the client drops its call at its next handler call.
    pub drop_requests: Vec<AtomicBool>,
    pub stop: AtomicBool,
}

impl Ledger {
    /// A ledger for keys `0..n`, `clients` clients and `sidecars` sidecars.
    pub fn new(n: usize, clients: usize, sidecars: usize) -> Ledger {
        Ledger {
            n,
            appended: Mutex::new(vec![None; n]),
            appended_count: AtomicUsize::new(0),
            appends_done: AtomicBool::new(false),
            handled: (0..n).map(|_| AtomicU32::new(0)).collect(),
            acked: (0..n).map(|_| AtomicBool::new(false)).collect(),
            acked_keys: AtomicUsize::new(0),
            delivered_id: (0..n).map(|_| OnceLock::new()).collect(),
            anomalies: Mutex::new(Vec::new()),
            handler_calls: AtomicU64::new(0),
            fails_sent: AtomicU64::new(0),
            acks_sent: AtomicU64::new(0),
            delivered_after_ack: AtomicU64::new(0),
            drops_by_handler: AtomicU64::new(0),
            drops_by_injector: AtomicU64::new(0),
            max_attempts: AtomicU32::new(0),
            calls_opened: AtomicU64::new(0),
            call_ends: Mutex::new(BTreeMap::new()),
            verdict_errors: Mutex::new(BTreeMap::new()),
            deliveries_by_sidecar: (0..sidecars).map(|_| AtomicU64::new(0)).collect(),
            drop_requests: (0..clients).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
        }
    }

    pub fn anomaly(&self, what: String) {
        eprintln!("chaos anomaly: {what}");
        self.anomalies.lock().unwrap().push(what);
    }

    pub fn count(map: &Mutex<BTreeMap<String, u64>>, key: String) {
        *map.lock().unwrap().entry(key).or_default() += 1;
    }
}

// ---------------------------------------------------------------------------
// Redis reads that tolerate a Redis restart (they answer None meanwhile)
// ---------------------------------------------------------------------------

/// A connection to the Redis at `url`; for a `redis+sentinel://` URL, to the
/// primary the Sentinels name now (see [`super::sentinel::primary_url`]).
/// `None` while it cannot be had.
pub async fn try_conn(url: &str) -> Option<MultiplexedConnection> {
    let url =
        if url.starts_with("redis+sentinel://") { super::sentinel::primary_url(url).await? } else { url.to_owned() };
    let client = redis::Client::open(url).ok()?;
    tokio::time::timeout(Duration::from_secs(2), client.get_multiplexed_async_connection()).await.ok()?.ok()
}

pub fn bytes_of(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

/// One page of `XRANGE`/`XREVRANGE` as (stream id, field → value).
pub fn parse_page(v: &Value) -> Vec<(String, BTreeMap<String, Vec<u8>>)> {
    let Value::Array(items) = v else { return Vec::new() };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(parts) = item else { return None };
            let id = String::from_utf8(bytes_of(parts.first()?)?).ok()?;
            let fields = match parts.get(1) {
                Some(Value::Array(flat)) => flat
                    .chunks(2)
                    .filter_map(|kv| {
                        Some((String::from_utf8_lossy(&bytes_of(&kv[0])?).into_owned(), bytes_of(kv.get(1)?)?))
                    })
                    .collect(),
                _ => BTreeMap::new(),
            };
            Some((id, fields))
        })
        .collect()
}

pub fn key_of(fields: &BTreeMap<String, Vec<u8>>) -> Option<usize> {
    std::str::from_utf8(fields.get("k")?).ok()?.parse().ok()
}

/// Every entry of `stream`, oldest first, read in pages.
pub async fn read_all(con: &mut MultiplexedConnection, stream: &str) -> Vec<(String, BTreeMap<String, Vec<u8>>)> {
    let mut out = Vec::new();
    let mut start = "-".to_owned();
    loop {
        let v: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(5_000)
            .query_async(con)
            .await
            .unwrap_or_else(|e| panic!("XRANGE {stream}: {e}"));
        let page = parse_page(&v);
        let Some((last, _)) = page.last() else { break };
        start = format!("({last}");
        let full = page.len() == 5_000;
        out.extend(page);
        if !full {
            break;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The appender
// ---------------------------------------------------------------------------

/// Appends keys 0..n in batches through random sidecars, spread over the append
/// window. Each entry carries a dedup key (`chaos:<key>`), so a batch whose
/// outcome is unknown (its sidecar died, Redis restarted or failed over, an
/// append was not confirmed) is simply sent again: an entry that did land is
/// answered as a duplicate with the ids it got, and is not written twice
/// (the verdict checks that every key is in the stream once, under the
/// branded id recorded here).
pub async fn appender(ledger: Arc<Ledger>, endpoints: Vec<String>, settings: Settings) {
    let mut rng = fastrand::Rng::with_seed(settings.seed ^ 0xa99e);
    let n = ledger.n;
    let batches = n.div_ceil(APPEND_BATCH);
    let pace = settings.append_window.div_f64(batches as f64);
    let started = Instant::now();
    for b in 0..batches {
        let (lo, hi) = (b * APPEND_BATCH, ((b + 1) * APPEND_BATCH).min(n));
        let mut tries = 0;
        let written: Vec<(String, String)> = loop {
            tries += 1;
            assert!(tries < 500, "appending keys {lo}..{hi}: no success after {tries} tries");
            let endpoint = &endpoints[rng.usize(..endpoints.len())];
            let entries = (lo..hi)
                .map(|k| BatchEntry {
                    fields: [("k".to_owned(), k.to_string().into_bytes())].into_iter().collect(),
                    dedup_key: format!("chaos:{k}"),
                    ..Default::default()
                })
                .collect();
            let request = AppendBatchRequest { stream: STREAM.to_owned(), entries, ..Default::default() };
            let sent = async {
                let channel = endpoint_to(endpoint).connect().await.map_err(|e| format!("connect: {e}"))?;
                StreamServiceClient::new(channel)
                    .append_batch(request)
                    .await
                    .map(|r| r.into_inner())
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
            };
            if let Ok(Ok(response)) = tokio::time::timeout(Duration::from_secs(15), sent).await {
                assert_eq!(response.entries.len(), hi - lo, "AppendBatch answered a short batch");
                break response.entries.into_iter().map(|e| (e.id, e.stream_id)).collect();
            }
            // Unknown outcome: send it again, under the same dedup keys.
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        {
            let mut appended = ledger.appended.lock().unwrap();
            for (k, ids) in (lo..hi).zip(written) {
                appended[k] = Some(ids);
            }
        }
        ledger.appended_count.store(hi, Relaxed);
        let due = started + pace.mul_f64((b + 1) as f64);
        tokio::time::sleep_until(due.into()).await;
    }
    ledger.appends_done.store(true, Relaxed);
}

// ---------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------

/// A channel's settings for a sidecar at `endpoint`: connect within 1 s, and
/// HTTP/2 keepalive pings every second, so a connection whose packets vanish
/// (a black hole between client and sidecar) fails within about 3 s instead
/// of leaving the call waiting for ever.
pub fn endpoint_to(endpoint: &str) -> Endpoint {
    Endpoint::from_shared(endpoint.to_owned())
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(2))
        .keep_alive_while_idle(true)
}

/// Odd-numbered clients take batched frames, so the faults meet both framings.
pub fn subscribe(client: usize) -> Subscribe {
    Subscribe {
        max_batch: if client % 2 == 1 { 16 } else { 0 },
        stream: STREAM.to_owned(),
        group: GROUP.to_owned(),
        group_start: GroupStart::Beginning as i32,
        max_in_flight: MAX_IN_FLIGHT,
        max_deliveries: MAX_DELIVERIES,
        ..Default::default()
    }
}

/// One client: opens a Consume call on its sidecar and handles deliveries
/// until the call ends, then reconnects after a short backoff, until told to stop.
pub async fn client(ledger: Arc<Ledger>, client: usize, sidecar: usize, endpoint: String, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    while !ledger.stop.load(Relaxed) {
        let ended = one_call(&ledger, client, sidecar, &endpoint, &mut rng).await;
        Ledger::count(&ledger.call_ends, ended);
        tokio::time::sleep(Duration::from_millis(rng.u64(50..250))).await;
    }
}

/// One Consume call; how it ended.
pub async fn one_call(
    ledger: &Ledger,
    client: usize,
    sidecar: usize,
    endpoint: &str,
    rng: &mut fastrand::Rng,
) -> String {
    let channel: Channel = match endpoint_to(endpoint).connect().await {
        Ok(channel) => channel,
        Err(_) => return "connect failed".to_owned(),
    };
    let (tx, rx) = mpsc::channel::<ConsumeRequest>(4 * MAX_IN_FLIGHT as usize);
    tx.send(req(Kind::Subscribe(subscribe(client)))).await.expect("queue subscribe");
    let opened = tokio::time::timeout(
        Duration::from_secs(20),
        ConsumerServiceClient::new(channel).consume(ReceiverStream::new(rx)),
    )
    .await;
    let mut inbound = match opened {
        Err(_) => return "subscribe timed out".to_owned(),
        Ok(Err(status)) => return format!("subscribe refused: {:?}", status.code()),
        Ok(Ok(response)) => response.into_inner(),
    };
    ledger.calls_opened.fetch_add(1, Relaxed);
    // Deliveries of a batch frame not handled yet.
    let mut batch = std::collections::VecDeque::new();
    loop {
        if ledger.stop.load(Relaxed) {
            return "stopped by the test".to_owned();
        }
        if let Some(delivery) = batch.pop_front() {
            if let Some(ended) = handle(ledger, client, sidecar, rng, &tx, delivery).await {
                return ended;
            }
            continue;
        }
        let message = match tokio::time::timeout(Duration::from_millis(500), inbound.message()).await {
            Err(_) => continue,
            Ok(Ok(Some(message))) => message,
            Ok(Ok(None)) => return "ended OK".to_owned(),
            Ok(Err(status)) => return format!("ended {:?}", status.code()),
        };
        let delivery = match message.kind {
            Some(ResponseKind::Delivery(d)) => d,
            Some(ResponseKind::Batch(b)) => {
                if b.deliveries.is_empty() {
                    ledger.anomaly("an empty DeliveryBatch".to_owned());
                }
                batch.extend(b.deliveries);
                continue;
            }
            Some(ResponseKind::Subscribed(_)) => continue,
            Some(ResponseKind::VerdictError(e)) => {
                let code = VerdictErrorCode::try_from(e.code)
                    .map_or_else(|_| format!("code {}", e.code), |c| format!("{c:?}"));
                Ledger::count(&ledger.verdict_errors, code);
                continue;
            }
            Some(ResponseKind::Emitted(_)) => {
                ledger.anomaly("an Emitted answer, though the chaos clients send no AckEmit".to_owned());
                continue;
            }
            None => {
                ledger.anomaly("a ConsumeResponse without a kind".to_owned());
                continue;
            }
        };
        if let Some(ended) = handle(ledger, client, sidecar, rng, &tx, delivery).await {
            return ended;
        }
    }
}

/// The handler, for one delivery (alone or out of a batch): checks it against
/// the ledger, may sleep or drop the call, then sends its verdict. `Some`
/// says how the call ended.
pub async fn handle(
    ledger: &Ledger,
    client: usize,
    sidecar: usize,
    rng: &mut fastrand::Rng,
    tx: &mpsc::Sender<ConsumeRequest>,
    delivery: echomq::proto::Delivery,
) -> Option<String> {
    ledger.handler_calls.fetch_add(1, Relaxed);
    ledger.deliveries_by_sidecar[sidecar].fetch_add(1, Relaxed);
    ledger.max_attempts.fetch_max(delivery.attempts, Relaxed);
    let Some(k) = delivery.payload.get("k").and_then(|v| std::str::from_utf8(v).ok()?.parse::<usize>().ok()) else {
        ledger.anomaly(format!("a delivery without a valid key: {delivery:?}"));
        return None;
    };
    if k >= ledger.n || delivery.stream != STREAM || delivery.group != GROUP || !is_branded(&delivery.id) {
        ledger.anomaly(format!("a delivery that was never appended: {delivery:?}"));
        return None;
    }
    let first_id = ledger.delivered_id[k].get_or_init(|| delivery.id.clone());
    if *first_id != delivery.id {
        ledger.anomaly(format!("key {k} delivered as {} and as {}", first_id, delivery.id));
    }
    ledger.handled[k].fetch_add(1, Relaxed);
    if ledger.acked[k].load(Relaxed) {
        ledger.delivered_after_ack.fetch_add(1, Relaxed);
    }
    if rng.u32(..100) < 2 {
        // A slow handler.
        tokio::time::sleep(Duration::from_millis(rng.u64(5..40))).await;
    }
    // Mid-handler: the injector (or the handler itself) drops the call while it holds this delivery.
    if ledger.drop_requests[client].swap(false, Relaxed) {
        ledger.drops_by_injector.fetch_add(1, Relaxed);
        return Some("dropped mid-handler (injector)".to_owned());
    }
    if rng.u32(..10_000) < HANDLER_DROP_PER_10K {
        ledger.drops_by_handler.fetch_add(1, Relaxed);
        return Some("dropped mid-handler (handler)".to_owned());
    }
    let verdict = if is_poison(k) {
        ledger.fails_sent.fetch_add(1, Relaxed);
        Kind::Fail(Fail {
            id: delivery.id.clone(),
            reason: "chaos: a poison entry".to_owned(),
            retry_after: Some(duration_ms(10)),
            dead_letter: delivery.attempts >= 2,
            ..Default::default()
        })
    } else if rng.u32(..100) < FAIL_PERCENT {
        ledger.fails_sent.fetch_add(1, Relaxed);
        let retry_after = rng.bool().then(|| duration_ms(rng.u64(10..200)));
        Kind::Fail(Fail {
            id: delivery.id.clone(),
            reason: "chaos: the handler failed".to_owned(),
            retry_after,
            ..Default::default()
        })
    } else {
        Kind::Ack(Ack { ids: vec![delivery.id.clone()] })
    };
    let is_ack = matches!(verdict, Kind::Ack(_));
    if tx.send(req(verdict)).await.is_err() {
        return Some("request side closed".to_owned());
    }
    if is_ack {
        ledger.acks_sent.fetch_add(1, Relaxed);
        if !ledger.acked[k].swap(true, Relaxed) {
            ledger.acked_keys.fetch_add(1, Relaxed);
        }
    }
    None
}

pub async fn redis_conn(url: &str) -> MultiplexedConnection {
    for _ in 0..100 {
        if let Some(con) = try_conn(url).await {
            return con;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot connect to {url}");
}

/// A run under way: its ledger, its clients and its appender.
pub struct Run {
    pub ledger: Arc<Ledger>,
    pub started: Instant,
    pub clients: Vec<tokio::task::JoinHandle<()>>,
    pub appending: tokio::task::JoinHandle<()>,
}

/// Starts a run: `settings.clients_per_sidecar` clients on each of
/// `endpoints` (a sidecar's gRPC address, or a proxy in front of it), and the
/// appender, which sends through random ones of them (see [`appender`]).
pub fn start_run(endpoints: &[String], settings: &Settings) -> Run {
    let sidecars = endpoints.len();
    let clients = sidecars * settings.clients_per_sidecar;
    let ledger = Arc::new(Ledger::new(settings.entries, clients, sidecars));
    let started = Instant::now();
    let clients = (0..clients)
        .map(|c| {
            let sidecar = c % sidecars;
            let seed = settings.seed.wrapping_add(c as u64 + 1);
            tokio::spawn(client(ledger.clone(), c, sidecar, endpoints[sidecar].clone(), seed))
        })
        .collect();
    let appending = tokio::spawn(appender(ledger.clone(), endpoints.to_vec(), settings.clone()));
    Run { ledger, started, clients, appending }
}

/// Waits until every key is acked or dead-lettered and Redis agrees (the
/// PEL empty), or `settings.timeout` passes since `started`, printing progress
/// every 5 s. Takes the injector's result once it has finished (it must have,
/// before the run can settle). Returns that result (if the injector finished)
/// and when the run settled (`None`: it timed out).
pub async fn settle<T>(
    ledger: &Ledger,
    redis_url: &str,
    settings: &Settings,
    started: Instant,
    appending: &tokio::task::JoinHandle<()>,
    injecting: &mut Option<tokio::task::JoinHandle<T>>,
) -> (Option<T>, Option<Duration>) {
    let n = ledger.n;
    let redis_url = redis_url.to_owned();
    let mut processes: Option<T> = None;
    let mut last_progress = Instant::now();
    let mut settled_at = None;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if appending.is_finished() && !ledger.appends_done.load(Relaxed) {
            panic!("the appender failed before it appended every key (its panic is above)");
        }
        if injecting.as_ref().is_some_and(|t| t.is_finished()) {
            processes = Some(injecting.take().unwrap().await.expect("the fault injector failed"));
        }
        let acked = ledger.acked_keys.load(Relaxed);
        if last_progress.elapsed() >= Duration::from_secs(5) {
            last_progress = Instant::now();
            let pending = match try_conn(&redis_url).await {
                Some(mut con) => try_pending_count(&mut con, STREAM, GROUP).await.map_or(-1, |p| p),
                None => -1,
            };
            println!(
                "chaos: {:>5.1}s appended {}/{n}, keys acked {acked}, pending {pending}, handler calls {}, calls opened {}",
                started.elapsed().as_secs_f64(),
                ledger.appended_count.load(Relaxed),
                ledger.handler_calls.load(Relaxed),
                ledger.calls_opened.load(Relaxed),
            );
        }
        let quiet = processes.is_some() && ledger.appends_done.load(Relaxed);
        if quiet {
            // Redis is stable now: read the dead letters and the group.
            let mut con = redis_conn(&redis_url).await;
            let dead_keys: BTreeSet<usize> =
                read_all(&mut con, DEAD_LETTERS).await.iter().filter_map(|(_, f)| key_of(f)).collect();
            let all_settled = (0..n).all(|k| ledger.acked[k].load(Relaxed) || dead_keys.contains(&k));
            if all_settled && pending_count(&mut con, STREAM, GROUP).await == 0 {
                settled_at = Some(started.elapsed());
                break;
            }
        }
        if started.elapsed() >= settings.timeout {
            break;
        }
    }
    (processes, settled_at)
}

/// What the end state says: the problems found (an empty list is a pass) and
/// the counts the report line gives.
#[derive(Debug)]
pub struct Verdict {
    /// Each broken promise, in words; empty when the run passed.
    pub problems: Vec<String>,
    /// Keys neither acked nor dead-lettered.
    pub lost: usize,
    /// Handler calls beyond one per key.
    pub duplicates: u64,
    pub handler_calls: u64,
    pub keys_handled: u64,
    /// Entries in the dead-letter stream, and keys in it more than once.
    pub dead_lettered: usize,
    pub dead_twice: usize,
    /// Entries still pending in the group.
    pub pending: usize,
    pub verdict_errors: BTreeMap<String, u64>,
}

/// Reads the end state from Redis (directly, at `redis_url`) and checks it
/// against the ledger and the sidecars' logs: every key appended exactly
/// once, acked or dead-lettered (poison keys dead-lettered, never acked), the
/// PEL empty, the group past the last appended id, every delivery under the
/// branded id it was appended with, no verdict error that names a delivery
/// its call did not hold, no panic, nothing "deleted while pending".
pub async fn verdict(ledger: &Ledger, redis_url: &str, sidecars: &[Sidecar]) -> Verdict {
    let n = ledger.n;
    let mut con = redis_conn(redis_url).await;
    let pending = pending_entries(&mut con, STREAM, GROUP).await;
    let stream = read_all(&mut con, STREAM).await;
    let dead = read_all(&mut con, DEAD_LETTERS).await;
    let dead_keys: BTreeSet<usize> = dead.iter().filter_map(|(_, f)| key_of(f)).collect();
    let appended = ledger.appended.lock().unwrap().clone();
    let last_appended = appended.last().cloned().flatten().expect("the last key was appended").1;
    let last_delivered = last_delivered_id(&mut con, STREAM, GROUP).await;

    let mut problems = Vec::new();
    if stream.len() != n {
        problems.push(format!("the stream holds {} entries, {n} were appended", stream.len()));
    }
    let mut keys_in_stream = vec![0u32; n];
    for (sid, fields) in &stream {
        match key_of(fields) {
            Some(k) if k < n => keys_in_stream[k] += 1,
            _ => problems.push(format!("stream entry {sid} has no valid key: {fields:?}")),
        }
    }
    let misappended: Vec<usize> = (0..n).filter(|&k| keys_in_stream[k] != 1).collect();
    if !misappended.is_empty() {
        problems.push(format!("keys not appended exactly once: {:?}", &misappended[..misappended.len().min(20)]));
    }
    if !pending.is_empty() {
        problems.push(format!("{} entries still pending, e.g. {:?}", pending.len(), &pending[..pending.len().min(10)]));
    }
    if parse_stream_id(&last_delivered) < parse_stream_id(&last_appended) {
        problems.push(format!(
            "the group's last-delivered id {last_delivered} is before the last appended {last_appended}"
        ));
    }
    let lost: Vec<usize> = (0..n).filter(|&k| !ledger.acked[k].load(Relaxed) && !dead_keys.contains(&k)).collect();
    if !lost.is_empty() {
        let sample: Vec<String> = lost
            .iter()
            .take(20)
            .map(|&k| format!("k={k} {:?} handled {}x", appended[k], ledger.handled[k].load(Relaxed)))
            .collect();
        problems.push(format!("{} keys neither acked nor dead-lettered: {sample:?}", lost.len()));
    }
    let poison_alive: Vec<usize> = (0..n).filter(|&k| is_poison(k) && !dead_keys.contains(&k)).collect();
    if !poison_alive.is_empty() {
        problems.push(format!("poison keys not in the dead-letter stream: {poison_alive:?}"));
    }
    let acked_poison: Vec<usize> = (0..n).filter(|&k| is_poison(k) && ledger.acked[k].load(Relaxed)).collect();
    if !acked_poison.is_empty() {
        problems.push(format!("poison keys acked, though no handler acks them: {acked_poison:?}"));
    }
    for (k, slot) in appended.iter().enumerate() {
        if let (Some((branded, _)), Some(seen)) = (slot, ledger.delivered_id[k].get()) {
            if branded != seen {
                problems.push(format!("key {k} was appended as {branded} but delivered as {seen}"));
            }
        }
    }
    let mut dead_twice = 0;
    let mut seen_dead = BTreeSet::new();
    for (sid, fields) in &dead {
        match key_of(fields) {
            Some(k) if k < n => {
                if !seen_dead.insert(k) {
                    dead_twice += 1;
                }
            }
            _ => problems.push(format!("dead letter {sid} has no valid key: {fields:?}")),
        }
    }
    problems.extend(ledger.anomalies.lock().unwrap().iter().cloned());
    let verdict_errors = ledger.verdict_errors.lock().unwrap().clone();
    for unexpected in ["UnknownId", "InvalidArgument"] {
        if let Some(count) = verdict_errors.get(unexpected) {
            problems.push(format!("{count} verdict errors {unexpected}: every verdict named a delivery its call held"));
        }
    }
    for (i, sidecar) in sidecars.iter().enumerate() {
        let log = sidecar.log();
        if log.contains("panicked") {
            problems.push(format!("sidecar {i} ({}) panicked; see its log", sidecar.consumer_name()));
        }
        let trimmed = log.matches("deleted from the stream while pending").count();
        if trimmed > 0 {
            problems.push(format!(
                "sidecar {i} saw {trimmed} entries 'deleted while pending'; nothing is ever trimmed here"
            ));
        }
    }

    let handler_calls = ledger.handler_calls.load(Relaxed);
    let keys_handled = (0..n).filter(|&k| ledger.handled[k].load(Relaxed) > 0).count() as u64;
    let duplicates = handler_calls - keys_handled;

    Verdict {
        problems,
        lost: lost.len(),
        duplicates,
        handler_calls,
        keys_handled,
        dead_lettered: dead.len(),
        dead_twice,
        pending: pending.len(),
        verdict_errors,
    }
}

impl Verdict {
    /// The report line's common tail: `lost=… | duplicates=… (…) |
    /// dead-lettered=… | pending=… | elapsed=…s | seed=…`.
    pub fn outcome(&self, ledger: &Ledger, settled_at: Option<Duration>, started: Instant, seed: u64) -> String {
        let elapsed = settled_at.unwrap_or_else(|| started.elapsed());
        format!(
            "lost={} | duplicates={} (handler calls {} for {} keys; {} after an ack was sent) | dead-lettered={} | \
             pending={} | elapsed={:.1}s{} | seed={seed}",
            self.lost,
            self.duplicates,
            self.handler_calls,
            self.keys_handled,
            ledger.delivered_after_ack.load(Relaxed),
            self.dead_lettered,
            self.pending,
            elapsed.as_secs_f64(),
            if settled_at.is_some() { "" } else { " (TIMED OUT)" },
        )
    }

    /// How the calls went: `calls ended by kind {…}; verdict errors {…};
    /// deliveries by sidecar […]; highest attempts N`.
    pub fn calls(&self, ledger: &Ledger) -> String {
        format!(
            "calls ended by kind {:?}; verdict errors {:?}; deliveries by sidecar {:?}; highest attempts {}",
            ledger.call_ends.lock().unwrap(),
            self.verdict_errors,
            ledger.deliveries_by_sidecar.iter().map(|d| d.load(Relaxed)).collect::<Vec<_>>(),
            ledger.max_attempts.load(Relaxed),
        )
    }

    /// Panics with every problem found, or if the run did not settle.
    pub fn assert_passed(&self, settled_at: Option<Duration>, timeout: Duration) {
        if self.dead_twice > 0 {
            println!("chaos: {} keys were dead-lettered more than once (a duplicate, not a loss)", self.dead_twice);
        }
        assert!(self.problems.is_empty(), "the chaos run found problems:\n- {}", self.problems.join("\n- "));
        assert!(settled_at.is_some(), "not everything settled within {timeout:?}");
    }
}
