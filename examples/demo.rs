//! A demo producer and consumer that shows the sidecar's main job, one line per
//! event, and doubles as a smoke test: it exits non-zero when anything did not
//! happen as expected.
//!
//! ```text
//! cargo run --example demo -- --endpoint http://127.0.0.1:50051 --redis-url redis://127.0.0.1:6379 --stream demo
//! ```
//!
//! What it does, in order:
//! 1. appends 5 entries with `StreamService.Append` (each gets a branded id);
//! 2. writes one entry as a "foreign producer" would, with a plain `XADD *`
//!    through the redis crate (no branded-id field: its id is derived from its
//!    stream id);
//! 3. subscribes with `GROUP_START_BEGINNING` (group `demo-group`), acks every
//!    delivery except one, which it fails once with `retry_after` 500 ms and
//!    acks when it comes back with `attempts` 2;
//! 4. acks an id it never received and expects a per-verdict error
//!    (`VERDICT_ERROR_CODE_UNKNOWN_ID`) while the call goes on;
//! 5. waits until `XPENDING` of the group says 0, closes the call, and prints a
//!    summary.
//!
//! Entries the stream already held from an earlier run (when the group is new)
//! are acked and reported as such; they do not make the demo fail.

use std::{
    collections::{BTreeSet, HashMap},
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::Parser;
use echomq::proto::{
    consume_request::Kind, consume_response::Kind as Event, consumer_service_client::ConsumerServiceClient,
    stream_service_client::StreamServiceClient, Ack, AppendRequest, ConsumeRequest, Delivery, Fail, FailKind,
    GroupStart, Subscribe, VerdictErrorCode,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// The demo's settings.
#[derive(Debug, Parser)]
#[command(about = "EchoMQ demo: append, consume, fail once, redeliver, ack; exits non-zero on any surprise.")]
struct Args {
    /// The sidecar's gRPC endpoint.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    endpoint: String,
    /// The Redis the sidecar uses (for the foreign XADD and the XPENDING check).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// The stream key.
    #[arg(long, default_value = "demo")]
    stream: String,
    /// The consumer group.
    #[arg(long, default_value = "demo-group")]
    group: String,
    /// Give up (and exit 1) after this many seconds.
    #[arg(long, default_value_t = 15)]
    timeout_secs: u64,
}

/// What the demo appends: (order, item).
const ORDERS: [(&str, &str); 5] =
    [("1", "coffee beans"), ("2", "oat milk"), ("3", "croissant"), ("4", "espresso cups"), ("5", "descaler")];
/// The order whose first delivery the demo fails.
const FAILED_ORDER: &str = "3";
/// How long the failed entry waits before it is delivered again.
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// A well-formed branded id that this call was never given.
const UNKNOWN_ID: &str = "0000000000010000000000000000";

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let started = Instant::now();
    let deadline = Duration::from_secs(args.timeout_secs);
    match tokio::time::timeout(deadline, run(&args, started)).await {
        Ok(Ok(())) => {
            println!("{} demo OK", stamp(started));
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            println!("{} demo FAILED: {e}", stamp(started));
            ExitCode::FAILURE
        }
        Err(_) => {
            println!(
                "{} demo FAILED: not done within {deadline:?}: the sidecar at {} or Redis at {} stopped answering",
                stamp(started),
                address(&args.endpoint),
                args.redis_url
            );
            ExitCode::FAILURE
        }
    }
}

/// Seconds since the demo started, for each line.
fn stamp(started: Instant) -> String {
    format!("[{:>6.3}s]", started.elapsed().as_secs_f64())
}

/// The endpoint as people write an address: `127.0.0.1:50051`, no scheme.
fn address(endpoint: &str) -> &str {
    endpoint.split_once("://").map_or(endpoint, |(_, rest)| rest).trim_end_matches('/')
}

/// What went wrong at the bottom of an error's chain, in words: an I/O error
/// by its kind (`connection refused`), else the innermost message. A tonic
/// transport error says only `transport error` at the top.
fn cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut innermost = error;
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                std::io::ErrorKind::TimedOut => "timed out".to_owned(),
                _ => io.to_string(),
            };
        }
        innermost = e;
        current = e.source();
    }
    innermost.to_string()
}

/// A Redis error in words: `connection refused` for a refused connection.
fn redis_cause(error: &redis::RedisError) -> String {
    if error.is_connection_refusal() {
        "connection refused".to_owned()
    } else {
        cause(error)
    }
}

/// A gRPC call's failure, with the sidecar's address and what was asked.
fn call_failed(what: &str, endpoint: &str, status: &tonic::Status) -> Error {
    let cause = match std::error::Error::source(status) {
        Some(source) if status.code() == tonic::Code::Unavailable => cause(source),
        _ => status.message().to_owned(),
    };
    format!("{what} at the sidecar {} failed: {:?}: {cause}", address(endpoint), status.code()).into()
}

/// A payload map as `name="value" …`, names sorted, values as lossy UTF-8.
fn show(payload: &HashMap<String, impl AsRef<[u8]>>) -> String {
    let mut fields: Vec<_> = payload.iter().map(|(k, v)| (k, v.as_ref())).collect();
    fields.sort();
    fields.iter().map(|(k, v)| format!("{k}={:?}", String::from_utf8_lossy(v))).collect::<Vec<_>>().join(" ")
}

/// The branded id of an entry without a branded-id field: its stream id as
/// 6 bytes of milliseconds and 8 of sequence, in hex.
fn branded_from_stream_id(stream_id: &str) -> Result<String, Error> {
    let (ms, seq) = stream_id.split_once('-').ok_or("XADD returned an id without `-`")?;
    Ok(format!("{:012x}{:016x}", ms.parse::<u64>()?, seq.parse::<u64>()?))
}

/// The group's pending count (`XPENDING <stream> <group>`, summary form).
async fn pending(redis: &mut redis::aio::MultiplexedConnection, stream: &str, group: &str) -> Result<i64, Error> {
    let reply: redis::Value = redis::cmd("XPENDING").arg(stream).arg(group).query_async(redis).await?;
    match reply {
        redis::Value::Array(parts) => match parts.first() {
            Some(redis::Value::Int(n)) => Ok(*n),
            other => Err(format!("unexpected XPENDING reply: {other:?}").into()),
        },
        other => Err(format!("unexpected XPENDING reply: {other:?}").into()),
    }
}

/// What Redis holds for the demo, for a failure message: the stream's length
/// and the group's pending count.
async fn redis_state(
    redis: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    group: &str,
) -> Result<String, Error> {
    let length: i64 = redis::cmd("XLEN").arg(stream).query_async(redis).await?;
    let pending = match pending(redis, stream, group).await {
        Ok(n) => n.to_string(),
        Err(e) => format!("unknown: {e}"),
    };
    Ok(format!("XLEN {stream} = {length}, XPENDING {stream} {group} = {pending}"))
}

fn request(kind: Kind) -> ConsumeRequest {
    ConsumeRequest { kind: Some(kind) }
}

async fn run(args: &Args, started: Instant) -> Result<(), Error> {
    let t = || stamp(started);
    println!(
        "{} EchoMQ demo: sidecar {}, redis {}, stream `{}`, group `{}`",
        t(),
        args.endpoint,
        args.redis_url,
        args.stream,
        args.group
    );

    // 1. The producer: five entries through the sidecar.
    let mut streams = StreamServiceClient::connect(args.endpoint.clone())
        .await
        .map_err(|e| format!("cannot reach the sidecar at {}: {}", address(&args.endpoint), cause(&e)))?;
    // branded id → order number, for the entries of this run.
    let mut expected: HashMap<String, String> = HashMap::new();
    for (order, item) in ORDERS {
        let fields = HashMap::from([
            ("order".to_owned(), order.as_bytes().to_vec()),
            ("item".to_owned(), item.as_bytes().to_vec()),
        ]);
        let written = streams
            .append(AppendRequest { stream: args.stream.clone(), fields: fields.clone(), ..Default::default() })
            .await
            .map_err(|status| call_failed(&format!("Append to `{}`", args.stream), &args.endpoint, &status))?
            .into_inner();
        println!("{} append     id={} stream_id={}  {}", t(), written.id, written.stream_id, show(&fields));
        if branded_from_stream_id(&written.stream_id)? != written.id {
            return Err(format!(
                "Append returned id {} that does not match stream id {}",
                written.id, written.stream_id
            )
            .into());
        }
        expected.insert(written.id, order.to_owned());
    }

    // 2. A foreign producer: plain XADD, no branded-id field.
    let redis_failed = |e: redis::RedisError| format!("Redis at {}: {}", args.redis_url, redis_cause(&e));
    let mut redis = redis::Client::open(args.redis_url.as_str())
        .map_err(redis_failed)?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("cannot reach Redis at {}: {}", args.redis_url, redis_cause(&e)))?;
    let foreign_stream_id: String = redis::cmd("XADD")
        .arg(&args.stream)
        .arg("*")
        .arg("order")
        .arg("6")
        .arg("item")
        .arg("written by a foreign producer")
        .query_async(&mut redis)
        .await
        .map_err(redis_failed)?;
    let foreign_id = branded_from_stream_id(&foreign_stream_id)?;
    println!(
        "{} xadd       stream_id={foreign_stream_id}  (a foreign producer: plain `XADD {} * order 6 item …` through the redis crate; its branded id is derived from the stream id: {foreign_id})",
        t(),
        args.stream
    );
    expected.insert(foreign_id.clone(), "6".to_owned());

    // 3. The consumer: one Consume call. The subscribe is queued before the
    //    call starts: the sidecar answers only once it has the subscribe.
    let mut consumers = ConsumerServiceClient::connect(args.endpoint.clone())
        .await
        .map_err(|e| format!("cannot reach the sidecar at {}: {}", address(&args.endpoint), cause(&e)))?;
    let (verdicts, outbound) = mpsc::channel::<ConsumeRequest>(64);
    verdicts
        .send(request(Kind::Subscribe(Subscribe {
            stream: args.stream.clone(),
            group: args.group.clone(),
            group_start: GroupStart::Beginning as i32,
            max_in_flight: 16,
            ..Subscribe::default()
        })))
        .await?;
    let consume = format!("Consume of `{}` as group `{}`", args.stream, args.group);
    let mut inbound = consumers
        .consume(ReceiverStream::new(outbound))
        .await
        .map_err(|status| call_failed(&consume, &args.endpoint, &status))?
        .into_inner();

    let mut tally = Tally::default();
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    // Give up a little before the outer timeout, saying what is missing.
    let give_up = tokio::time::sleep(Duration::from_secs(args.timeout_secs).saturating_sub(Duration::from_millis(500)));
    tokio::pin!(give_up);

    let pending_now = loop {
        let done_consuming = tally.acked.len() == expected.len() && tally.verdict_errors == 1;
        tokio::select! {
            message = inbound.message() => {
                let message = message.map_err(|status| call_failed(&consume, &args.endpoint, &status))?;
                let Some(message) = message else {
                    return Err(format!(
                        "the sidecar at {} ended the {consume} call before the demo was done",
                        address(&args.endpoint)
                    )
                    .into());
                };
                match message.kind {
                    Some(Event::Subscribed(s)) => {
                        println!(
                            "{} subscribed stream={} group={} consumer={} max_in_flight={} (GROUP_START_BEGINNING)",
                            t(), s.stream, s.group, s.consumer, s.max_in_flight
                        );
                        // 4. A verdict for an id this call does not hold.
                        println!("{} ack        id={UNKNOWN_ID}  (an id this call was never given)", t());
                        verdicts.send(request(Kind::Ack(Ack { ids: vec![UNKNOWN_ID.to_owned()] }))).await?;
                    }
                    Some(Event::Delivery(d)) => {
                        tally.on_delivery(&d, &expected, &foreign_id, t())?;
                        let kind = if tally.failed.as_deref() == Some(d.id.as_str()) && d.attempts == 1 {
                            println!("{} fail       id={}  retry_after={RETRY_AFTER:?} reason=\"demo: simulated handler error\"", t(), d.id);
                            Kind::Fail(Fail {
                                id: d.id.clone(),
                                reason: "demo: simulated handler error".to_owned(),
                                retry_after: Some(prost_types::Duration { seconds: 0, nanos: RETRY_AFTER.as_nanos() as i32 }),
                                dead_letter: false,
                                // The entry's own failure: the next delivery counts as attempt 2.
                                kind: FailKind::Message as i32,
                            })
                        } else {
                            println!("{} ack        id={}", t(), d.id);
                            if expected.contains_key(&d.id) && !tally.acked.insert(d.id.clone()) {
                                return Err(format!("entry {} was delivered again after it was acked", d.id).into());
                            }
                            Kind::Ack(Ack { ids: vec![d.id.clone()] })
                        };
                        verdicts.send(request(kind)).await?;
                    }
                    Some(Event::Batch(_)) => {
                        return Err("the sidecar sent a DeliveryBatch, though the demo's subscribe did not ask for batches".into());
                    }
                    Some(Event::VerdictError(e)) => {
                        let code = VerdictErrorCode::try_from(e.code).map_or_else(|_| e.code.to_string(), |c| c.as_str_name().to_owned());
                        println!("{} verdict error id={} code={code}: {}", t(), e.id, e.message);
                        if e.id != UNKNOWN_ID || e.code != VerdictErrorCode::UnknownId as i32 {
                            return Err(format!("unexpected verdict error for {}: {code}", e.id).into());
                        }
                        tally.verdict_errors += 1;
                    }
                    Some(Event::Emitted(e)) => {
                        return Err(format!("an Emitted answer for {}, though the demo sends no AckEmit", e.id).into());
                    }
                    None => return Err("a server message with no kind".into()),
                }
            }
            _ = &mut give_up => {
                let seen = format!(
                    "{} of {} acked, {} failed, {} redelivered, {} of 1 verdict errors",
                    tally.acked.len(),
                    expected.len(),
                    u32::from(tally.failed.is_some()),
                    tally.redelivered,
                    tally.verdict_errors
                );
                return Err(match redis_state(&mut redis, &args.stream, &args.group).await {
                    Ok(state) => format!(
                        "Redis at {} answered ({state}) but the entries did not arrive through the sidecar at {}: {seen}",
                        args.redis_url,
                        address(&args.endpoint)
                    ),
                    Err(e) => format!("Redis at {} does not answer ({e}); the entries did not arrive: {seen}", args.redis_url),
                }
                .into());
            }
            _ = poll.tick(), if done_consuming => {
                // 5. Acks are applied by the sidecar (XACK, batched): wait until Redis agrees.
                let count = pending(&mut redis, &args.stream, &args.group).await.map_err(|e| format!("Redis at {}: {e}", args.redis_url))?;
                if count == 0 {
                    println!("{} xpending   {} {} -> 0 pending: every entry is acknowledged in Redis", t(), args.stream, args.group);
                    break count;
                }
            }
        }
    };

    // Close our side of the call: the sidecar ends it with OK.
    drop(verdicts);
    while let Some(message) =
        inbound.message().await.map_err(|status| call_failed(&consume, &args.endpoint, &status))?
    {
        if let Some(Event::Delivery(d)) = message.kind {
            return Err(format!("unexpected delivery {} after every entry was acked", d.id).into());
        }
    }
    println!("{} closed     the call ended with OK", t());

    let Tally { delivered, earlier, acked, failed, redelivered, verdict_errors } = tally;
    let failures = u32::from(failed.is_some());
    println!(
        "{} summary    delivered {delivered} (6 entries + {redelivered} redelivery), acked {}, failed {failures}, redelivered {redelivered}, verdict errors {verdict_errors} (expected), XPENDING {pending_now}{}",
        t(),
        acked.len(),
        match earlier {
            0 => String::new(),
            1 => "; plus 1 entry from an earlier run, acked".to_owned(),
            n => format!("; plus {n} entries from an earlier run, acked"),
        }
    );
    let as_expected = delivered == 7 && acked.len() == 6 && failures == 1 && redelivered == 1 && pending_now == 0;
    if !as_expected {
        return Err("the counts are not the expected 7 delivered, 6 acked, 1 failed, 1 redelivered, 0 pending".into());
    }
    Ok(())
}

/// What the consumer saw.
#[derive(Default)]
struct Tally {
    /// Deliveries of this run's entries, redeliveries included.
    delivered: u32,
    /// Deliveries of entries from before this run.
    earlier: u32,
    /// This run's entries acked.
    acked: BTreeSet<String>,
    /// The entry failed once.
    failed: Option<String>,
    /// Deliveries of the failed entry after the Fail.
    redelivered: u32,
    /// Verdict errors received.
    verdict_errors: u32,
}

impl Tally {
    /// Prints one delivery and checks it against what was appended; picks the
    /// entry to fail on its first delivery.
    fn on_delivery(
        &mut self,
        d: &Delivery,
        expected: &HashMap<String, String>,
        foreign_id: &str,
        t: String,
    ) -> Result<(), Error> {
        let Some(order) = expected.get(&d.id) else {
            self.earlier += 1;
            println!(
                "{t} deliver    id={} stream_id={} attempts={}  {}  (from before this run)",
                d.id,
                d.stream_id,
                d.attempts,
                show(&d.payload)
            );
            return Ok(());
        };
        self.delivered += 1;
        let again = self.failed.as_deref() == Some(d.id.as_str());
        let note = match (again, d.id == foreign_id) {
            (true, _) => "  <- redelivered after the Fail",
            (false, true) => "  <- the foreign entry: id derived from its stream id",
            _ => "",
        };
        println!(
            "{t} deliver    id={} stream_id={} attempts={}  {}{note}",
            d.id,
            d.stream_id,
            d.attempts,
            show(&d.payload)
        );
        if d.payload.get("order").map(|v| &v[..]) != Some(order.as_bytes()) {
            return Err(format!("delivery {} carries {}, expected order {order}", d.id, show(&d.payload)).into());
        }
        if again {
            if d.attempts != 2 {
                return Err(format!("the failed entry came back with attempts {}, expected 2", d.attempts).into());
            }
            self.redelivered += 1;
        } else if d.attempts != 1 {
            return Err(format!("entry {} came with attempts {}, expected 1", d.id, d.attempts).into());
        } else if order == FAILED_ORDER {
            self.failed = Some(d.id.clone());
        }
        Ok(())
    }
}
