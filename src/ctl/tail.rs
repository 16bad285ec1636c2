//! `tail STREAM`: follow a stream and print its entries as they come.
//!
//! By default it peeks: repeated StreamService.Read calls (XRANGE) from just
//! after the last entry printed, every `--interval-ms` while nothing is new.
//! No group is involved, so it takes nothing from any group: no entry becomes
//! pending, no group's lag or last-delivered id moves.
//!
//! `--group G --ack` consumes for real instead: one ConsumerService.Consume
//! call in group G (as the sidecar's consumer), each entry acknowledged once
//! it is printed. Those entries are gone from the group: its other consumers
//! (your service) will not get them.
//!
//! Ctrl-C (SIGINT) or SIGTERM ends either cleanly, with exit code 0: a
//! `--group` call first tells the sidecar it drains, closes its side and waits
//! until the sidecar has applied every ack sent (what arrived but was not
//! printed stays pending and is delivered again after the retry backoff).

use std::time::Duration;

use echomq::id::StreamId;
use echomq::proto::{
    consume_request, consume_response, Ack, ConsumeRequest, ConsumeResponse, Delivery, Drain, Entry, GroupStart,
    ReadRequest, Subscribe,
};
use serde_json::{json, Value};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;

use crate::connect::Context;
use crate::exit::Failure;
use crate::ids::{parse_bound, EntryId};
use crate::render::{emit, emit_json_line, entry_json, entry_line, print_entry, warn_oversized};
use crate::time::{now_ms, parse_instant, timestamp_of_ms};

/// Default `--interval-ms`: how long a peeking tail waits when nothing is new.
pub(crate) const DEFAULT_INTERVAL_MS: u64 = 500;
/// Entries asked of the sidecar per Read.
const PAGE: u32 = 100;
/// Deliveries a `--group` call holds un-acknowledged at once.
const MAX_IN_FLIGHT: u32 = 16;
/// How long a `--group` tail waits, when it ends, for the sidecar to apply its acks.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a new group starts (`--group-start`).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Start {
    /// Entries appended after the group is created.
    New,
    /// Every entry the stream holds.
    Beginning,
}

/// `tail`'s flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "Peeking (the default) never takes an entry from a group: it reads (XRANGE) from \
    just after the last entry printed, polling every --interval-ms while nothing is new. Without --from, \
    --since or --from-start it starts at this machine's clock's now (entries are stamped by Redis' clock). \
    A sharded stream is tailed one shard key at a time.\n\n--group G --ack CONSUMES FOR REAL: entries are \
    delivered through group G as the sidecar's consumer and acknowledged once printed, so the group's \
    other consumers do not get them.\n\nCtrl-C ends it with exit code 0. Output as for `read`; with \
    --group, JSON objects also carry `group` and `attempts`.")]
pub(crate) struct Args {
    /// The stream key (for a sharded stream, one shard's key; with --group, its name).
    stream: String,
    /// Start at this stream id, inclusive (`<ms>-<seq>` or `<ms>`), or at a branded id's minted
    /// stream id.
    #[arg(long, value_parser = parse_bound, conflicts_with_all = ["since", "from_start", "group"])]
    from: Option<EntryId>,
    /// Start with entries appended at or after this instant (as for `read --since`).
    #[arg(long, value_parser = parse_instant, conflicts_with_all = ["from_start", "group"])]
    since: Option<u64>,
    /// Start with the oldest entry of the stream.
    #[arg(long, conflicts_with = "group")]
    from_start: bool,
    /// How long to wait between reads while nothing is new (milliseconds).
    #[arg(long, default_value_t = DEFAULT_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(10..))]
    interval_ms: u64,
    /// Stop after printing this many entries.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Consume through this consumer group instead of peeking; needs --ack.
    #[arg(long, requires = "ack")]
    group: Option<String>,
    /// Acknowledge each entry once printed: it is consumed for real. Needs --group.
    #[arg(long, requires = "group")]
    ack: bool,
    /// With --group: where the group starts if it does not exist yet.
    #[arg(long, value_enum, default_value_t = Start::New, requires = "group")]
    group_start: Start,
}

/// SIGINT or SIGTERM, whichever comes first.
struct Interrupt {
    int: Signal,
    term: Signal,
}

impl Interrupt {
    fn new() -> Result<Interrupt, Failure> {
        let listen = |kind| signal(kind).map_err(|e| Failure::Other(format!("cannot listen for signals: {e}")));
        Ok(Interrupt { int: listen(SignalKind::interrupt())?, term: listen(SignalKind::terminate())? })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// Runs `tail`.
pub(crate) async fn run(args: Args, ctx: &Context) -> Result<(), Failure> {
    let mut interrupt = Interrupt::new()?;
    match &args.group {
        Some(group) => consume(&args, group, ctx, &mut interrupt).await,
        None => peek(&args, ctx, &mut interrupt).await,
    }
}

/// The id just after `id`, for an exclusive start with Read's inclusive bound.
fn successor(id: StreamId) -> StreamId {
    match id.seq.checked_add(1) {
        Some(seq) => StreamId { ms: id.ms, seq },
        None => StreamId { ms: id.ms.saturating_add(1), seq: 0 },
    }
}

/// Follows with Read calls: never through a group.
async fn peek(args: &Args, ctx: &Context, interrupt: &mut Interrupt) -> Result<(), Failure> {
    let doing = format!("tail {}", args.stream);
    let mut request = ReadRequest { stream: args.stream.clone(), count: PAGE, ..Default::default() };
    match (&args.from, args.since, args.from_start) {
        (Some(id), _, _) => request.start_id = id.stream_id().to_string(),
        (None, Some(ms), _) => request.start_time = Some(timestamp_of_ms(ms)),
        (None, None, true) => {}
        (None, None, false) => request.start_time = Some(timestamp_of_ms(now_ms())),
    }
    let mut client = ctx.stream();
    let mut printed = 0u64;
    loop {
        let page = tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            page = client.read(ctx.request(request.clone())) => page.map_err(|s| Failure::status_of_flags(&doing, s, &[("start_id", "--from")]))?.into_inner(),
        };
        warn_oversized(&args.stream, &page.oversized_ids);
        let mut last: Option<StreamId> = None;
        for entry in &page.entries {
            print_entry(ctx.json, &args.stream, entry)?;
            printed += 1;
            if args.count.is_some_and(|count| printed >= count) {
                return Ok(());
            }
            last = last.max(entry.stream_id.parse().ok());
        }
        last = last.max(page.oversized_ids.iter().filter_map(|id| id.parse().ok()).max());
        if let Some(last) = last {
            request.start_id = successor(last).to_string();
            request.start_time = None;
        }
        if !page.next_start_id.is_empty() {
            continue; // more is there already
        }
        tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(args.interval_ms)) => {}
        }
    }
}

/// A deadline that never comes, for a `select!` branch that is switched off.
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)
}

fn message(kind: consume_request::Kind) -> ConsumeRequest {
    ConsumeRequest { kind: Some(kind) }
}

/// A delivery as the entry it carries, for printing.
fn as_entry(delivery: &Delivery) -> Entry {
    Entry {
        id: delivery.id.clone(),
        stream_id: delivery.stream_id.clone(),
        payload: delivery.payload.iter().map(|(name, value)| (name.clone(), value.to_vec())).collect(),
        minted_at: delivery.minted_at,
        raw_fields: delivery.raw_fields.clone(),
        traceparent: delivery.traceparent.clone(),
        archived: false,
    }
}

/// Consumes through a group: prints, then acknowledges.
async fn consume(args: &Args, group: &str, ctx: &Context, interrupt: &mut Interrupt) -> Result<(), Failure> {
    let doing = format!("tail {} --group {group}", args.stream);
    let (tx, rx) = mpsc::channel(64);
    let subscribe = Subscribe {
        stream: args.stream.clone(),
        group: group.to_owned(),
        group_start: match args.group_start {
            Start::New => GroupStart::New,
            Start::Beginning => GroupStart::Beginning,
        } as i32,
        max_in_flight: MAX_IN_FLIGHT,
        ..Default::default()
    };
    let closed = || Failure::Other(format!("{doing}: the call's sending side closed"));
    tx.send(message(consume_request::Kind::Subscribe(subscribe))).await.map_err(|_| closed())?;
    let mut client = ctx.consumer();
    let mut responses = tokio::select! {
        _ = interrupt.recv() => return Ok(()),
        call = tokio::time::timeout(ctx.timeout, client.consume(tokio_stream::wrappers::ReceiverStream::new(rx))) => {
            let call = call.map_err(|_| {
                Failure::Unreachable(format!("{doing}: no answer within --timeout-ms {}", ctx.timeout.as_millis()))
            })?;
            call.map_err(|s| Failure::status(&doing, s))?.into_inner()
        }
    };
    let mut printed = 0u64;
    let mut write_failed: Option<Failure> = None;
    // Until the sidecar confirms the subscription, --timeout-ms bounds the wait.
    let mut subscribe_deadline = Some(tokio::time::Instant::now() + ctx.timeout);
    let ended = loop {
        let next = tokio::select! {
            _ = interrupt.recv() => break None,
            _ = tokio::time::sleep_until(subscribe_deadline.unwrap_or_else(far_future)), if subscribe_deadline.is_some() => {
                return Err(Failure::Unreachable(format!("{doing}: no confirmation of the subscription within --timeout-ms {}", ctx.timeout.as_millis())));
            }
            next = responses.message() => next,
        };
        let deliveries = match next.map_err(|s| Failure::status(&doing, s))? {
            None => break Some(Failure::Unreachable(format!("{doing}: the sidecar ended the call"))),
            Some(response) => match response.kind {
                Some(consume_response::Kind::Subscribed(s)) => {
                    subscribe_deadline = None;
                    eprintln!(
                        "echomqctl: consuming {} in group {} as consumer {}: entries printed are acknowledged",
                        s.stream, s.group, s.consumer
                    );
                    continue;
                }
                Some(consume_response::Kind::Delivery(d)) => vec![d],
                Some(consume_response::Kind::Batch(b)) => b.deliveries,
                Some(consume_response::Kind::VerdictError(e)) => {
                    eprintln!("echomqctl: the ack of {} was not applied: {}", e.id, e.message);
                    continue;
                }
                // Answers an AckEmit, which tail never sends.
                Some(consume_response::Kind::Emitted(_)) | None => continue,
            },
        };
        let mut done = false;
        for delivery in deliveries {
            if done {
                break; // not printed, so not acknowledged: it is delivered again later
            }
            let entry = as_entry(&delivery);
            let written = if ctx.json {
                let mut object = entry_json(&delivery.stream, &entry);
                object.insert("group".into(), json!(delivery.group));
                object.insert("attempts".into(), json!(delivery.attempts));
                emit_json_line(&Value::Object(object))
            } else {
                emit(&format!("{}  attempts={}", entry_line(&entry), delivery.attempts))
            };
            // Not written (a closed pipe above all): not acknowledged, and the
            // acks already sent are still settled below before the command ends.
            if let Err(failure) = written {
                write_failed = Some(failure);
                break;
            }
            tx.send(message(consume_request::Kind::Ack(Ack { ids: vec![delivery.id] }))).await.map_err(|_| closed())?;
            printed += 1;
            done = args.count.is_some_and(|count| printed >= count);
        }
        if let Some(failure) = write_failed.take() {
            break Some(failure);
        }
        if done {
            break None;
        }
    };
    // Settle: no more deliveries, close our side, and wait for the call to end:
    // the sidecar ends it only once the acks sent have reached Redis.
    let _ = tx.send(message(consume_request::Kind::Drain(Drain {}))).await;
    drop(tx);
    let settled = tokio::time::timeout(SETTLE_TIMEOUT, async {
        loop {
            match responses.message().await {
                Ok(Some(ConsumeResponse { kind: Some(consume_response::Kind::VerdictError(e)) })) => {
                    eprintln!("echomqctl: the ack of {} was not applied: {}", e.id, e.message);
                }
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(()),
                Err(status) => return Err(status),
            }
        }
    })
    .await;
    if let Some(failure) = ended {
        return Err(failure);
    }
    match settled {
        Ok(Ok(())) => Ok(()),
        Ok(Err(status)) => Err(Failure::status(format!("{doing}: settling the acks"), status)),
        Err(_) => Err(Failure::Unreachable(format!(
            "{doing}: the sidecar did not confirm the acks within {SETTLE_TIMEOUT:?}; unconfirmed ones are delivered again"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_read_starts_just_after_the_last_entry() {
        assert_eq!(successor(StreamId { ms: 5, seq: 1 }), StreamId { ms: 5, seq: 2 });
        assert_eq!(successor(StreamId { ms: 5, seq: u64::MAX }), StreamId { ms: 6, seq: 0 });
    }
}
