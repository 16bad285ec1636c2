//! Per-key limits benchmark: what `Subscribe.key_field` with
//! `max_in_flight_per_key` 1 costs, against the same subscription without a
//! key field, on one sidecar.
//!
//! ```text
//! cargo bench --bench keys
//! ECHOMQ_BENCH_ENTRIES=50000 ECHOMQ_BENCH_ROUNDS=5 cargo bench --bench keys
//! ```
//!
//! It starts its own `redis-server` (free loopback port, no persistence) and
//! the sidecar binary cargo built for it, appends N entries (default 20,000;
//! `ECHOMQ_BENCH_ENTRIES`) of a 100-byte `body` and a number `n` to each of
//! three streams, then times, over 3 rounds (`ECHOMQ_BENCH_ROUNDS`) in which
//! the contenders take turns in a rotating order, each round through groups
//! of its own:
//!
//! - (1) one key: every entry's `k` is the same, `max_in_flight_per_key` 1:
//!   the entries run one at a time, each after the previous one's ack
//!   reached Redis;
//! - (50) fifty keys: `k` is `n mod 50`, `max_in_flight_per_key` 1;
//! - (none) no key field.
//!
//! Each is one Consume call with `max_in_flight` 256 that acks every
//! delivery as it arrives (one `Ack`, one id), timed from the subscribe
//! until Redis has every entry acknowledged (`XPENDING` says 0). It prints
//! the median rate of each, every round's, the ratios to (none), and the
//! machine's load before and after.
//!
//! Under `cargo test` it runs as a quick smoke test with small counts
//! against the debug build, and says so.

mod common;

use std::{collections::HashMap, process::ExitCode, time::Duration};

use common::redis_server::{RedisOptions, RedisServer};
use common::{
    connection, pending, phase, rate, thousands, ConsumeCall, Error, Sidecar, APPEND_BATCH, BODY_BYTES, WINDOW,
};
use echomq::proto::{
    consume_request::Kind, stream_service_client::StreamServiceClient, AppendBatchRequest, BatchEntry, GroupStart,
};
use redis::aio::MultiplexedConnection;
use tonic::transport::Channel;

/// Entries per stream of a full run unless `ECHOMQ_BENCH_ENTRIES` says otherwise.
const FULL_ENTRIES: usize = 20_000;
/// The key field of the keyed contenders.
const KEY_FIELD: &str = "k";

/// A contender: its stream, and the number of distinct keys in it (`None`:
/// no key field, and subscribed without one).
struct Contender {
    label: &'static str,
    stream: &'static str,
    keys: Option<usize>,
}

const CONTENDERS: [Contender; 3] = [
    Contender { label: "(1)    one key     ", stream: "keys-one", keys: Some(1) },
    Contender { label: "(50)   fifty keys  ", stream: "keys-fifty", keys: Some(50) },
    Contender { label: "(none) no key field", stream: "keys-none", keys: None },
];

fn main() -> ExitCode {
    common::main("keys", |full, entries| {
        let entries = if full && std::env::var_os("ECHOMQ_BENCH_ENTRIES").is_none() { FULL_ENTRIES } else { entries };
        run(full, entries)
    })
}

async fn run(full: bool, entries: usize) -> Result<(), Error> {
    let sidecar_bin = common::sidecar_bin();
    let dir = common::work_dir("echomq-bench-keys")?;
    let redis_server = RedisServer::try_start_with(RedisOptions::default()).await?;
    let sidecar = Sidecar::start(&sidecar_bin, &redis_server.url(), &[], &dir).await?;
    let endpoint = format!("http://127.0.0.1:{}", sidecar.grpc_port);
    let mut redis = connection(redis_server.port()).await?;
    let version = common::redis_version(&mut redis).await?;
    let (cpus, load) = (common::cpus(), common::load_average());

    common::print_title("keys", full);
    println!(
        "  machine  {cpus} CPUs, load average {load} at start; Redis {version} and the sidecar on loopback, no persistence"
    );
    println!("  sidecar  {}", sidecar_bin.display());
    println!(
        "  entries  {entries} per stream, fields `n`, a {BODY_BYTES}-byte `body` and, in the keyed streams, the key `{KEY_FIELD}`"
    );
    println!();

    let mut streams = StreamServiceClient::connect(endpoint.clone()).await?;
    for contender in &CONTENDERS {
        append_keyed(&mut streams, contender.stream, entries, contender.keys).await?;
    }

    let rounds = common::rounds(full);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); CONTENDERS.len()];
    for round in 0..rounds {
        for k in 0..CONTENDERS.len() {
            let which = (round + k) % CONTENDERS.len();
            let contender = &CONTENDERS[which];
            let group = format!("bench-{round}");
            let took = phase(contender.label, throughput(&endpoint, &mut redis, contender, &group, entries)).await?;
            samples[which].push(rate(entries, took));
        }
    }
    println!(
        "throughput  {entries} entries each; one Consume call, max_in_flight {WINDOW}, one Ack (one id) per delivery as it arrives; \
         from the subscribe until Redis has every entry acknowledged; max_in_flight_per_key 1; rounds: {rounds}, contenders alternated, medians"
    );
    let mut medians = Vec::new();
    for (contender, rates) in CONTENDERS.iter().zip(&samples) {
        let median = common::median_f64(rates);
        let each = rates.iter().map(|r| thousands(*r)).collect::<Vec<_>>().join(" / ");
        println!("  {}  {:>9} entries/s  ({each})", contender.label, thousands(median));
        medians.push(median);
    }
    let none = medians[2];
    println!(
        "  ratio one key/no key field: {:.3}; fifty keys/no key field: {:.3}",
        medians[0] / none,
        medians[1] / none
    );
    println!("  load average {} at the end", common::load_average());

    drop(sidecar);
    drop(redis_server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Appends `entries` entries to `stream` ([`APPEND_BATCH`] per call): `n`,
/// a [`BODY_BYTES`]-byte `body`, and with `keys` the key `n mod keys`.
async fn append_keyed(
    streams: &mut StreamServiceClient<Channel>,
    stream: &str,
    entries: usize,
    keys: Option<usize>,
) -> Result<(), Error> {
    let body = vec![b'x'; BODY_BYTES];
    for first in (0..entries).step_by(APPEND_BATCH) {
        let batch = (first..(first + APPEND_BATCH).min(entries))
            .map(|n| {
                let mut fields =
                    HashMap::from([("n".to_owned(), n.to_string().into_bytes()), ("body".to_owned(), body.clone())]);
                if let Some(keys) = keys {
                    fields.insert(KEY_FIELD.to_owned(), format!("key-{}", n % keys).into_bytes());
                }
                BatchEntry { fields, ..Default::default() }
            })
            .collect();
        let request = AppendBatchRequest { stream: stream.to_owned(), entries: batch, ..Default::default() };
        streams.append_batch(request).await?;
    }
    Ok(())
}

/// One contender's run: its call acks every delivery at once; done when
/// Redis has every entry acknowledged.
async fn throughput(
    endpoint: &str,
    redis: &mut MultiplexedConnection,
    contender: &Contender,
    group: &str,
    entries: usize,
) -> Result<Duration, Error> {
    let mut subscribe = common::subscribe(contender.stream, group, GroupStart::Beginning, WINDOW, 0);
    if let (Some(_), Some(Kind::Subscribe(s))) = (contender.keys, subscribe.kind.as_mut()) {
        s.key_field = KEY_FIELD.to_owned();
        s.max_in_flight_per_key = 1;
    }
    let mut call = ConsumeCall::open_with(endpoint, subscribe).await?;
    let _seen = call.ack_each(entries, |_| {}).await?;
    while pending(redis, contender.stream, group).await? > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = call.started.elapsed();
    drop(call.verdicts);
    while call.inbound.message().await?.is_some() {}
    Ok(took)
}
