//! `read STREAM`: entries by stream id or by instant (StreamService.Read,
//! XRANGE), oldest first. No group is involved: nothing is consumed.

use echomq::proto::ReadRequest;

use crate::connect::Context;
use crate::exit::Failure;
use crate::ids::{parse_bound, parse_entry, EntryId};
use crate::render::{print_entry, warn_oversized};
use crate::time::{parse_instant, timestamp_of_ms};

/// Entries asked of the sidecar per call; `--count` bounds what prints.
const PAGE: u32 = 1_000;
/// Default `--count`.
const DEFAULT_COUNT: u64 = 100;
/// The request fields a range's flags fill, for errors.
const RANGE_FLAGS: [(&str, &str); 4] =
    [("start_id", "--from"), ("start_time", "--since"), ("end_id", "--to"), ("end_time", "--until")];

/// `read`'s flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "Bounds are inclusive. An instant is an RFC 3339 instant (`2026-12-02T08:30:00Z`), \
    unix milliseconds (`1796200000000`), or a duration before now (`90s`, `15m`, `2h`, `1d`); an instant \
    bound becomes the first (or last) stream id of its millisecond.\n\nOne entry per line: \
    `<stream id>  <branded id>  name=\"value\" …`; with --json one JSON object per entry (NDJSON): \
    `stream`, `stream_id`, `id`, `minted_at_ms`, `fields` (UTF-8 values), `fields_base64` (the others).")]
pub(crate) struct Args {
    /// The stream key (for a sharded stream, one shard's key: `<stream>:{<stream>:<k>}`).
    stream: String,
    /// Exactly the entry with this stream id (`<ms>-<seq>`) or branded id (28 hex characters, as
    /// every tool prints it: the entry first appended to this stream at that stream id); exit code 4
    /// when there is none. `0-0` names no entry: exit code 2.
    #[arg(long, value_parser = parse_entry, conflicts_with_all = ["from", "since", "to", "until", "count", "all"])]
    id: Option<EntryId>,
    /// The first stream id to print (`<ms>-<seq>` or `<ms>`), or a branded id (its minted stream
    /// id). Default: the oldest entry.
    #[arg(long, value_parser = parse_bound, conflicts_with = "since")]
    from: Option<EntryId>,
    /// Entries appended at or after this instant.
    #[arg(long, value_parser = parse_instant)]
    since: Option<u64>,
    /// The last stream id to print, or a branded id (its minted stream id). Default: the newest entry.
    #[arg(long, value_parser = parse_bound, conflicts_with = "until")]
    to: Option<EntryId>,
    /// Entries appended at or before this instant.
    #[arg(long, value_parser = parse_instant)]
    until: Option<u64>,
    /// The most entries to print.
    #[arg(long, default_value_t = DEFAULT_COUNT, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Print every entry in the range (pages through it).
    #[arg(long, conflicts_with = "count")]
    all: bool,
}

/// Runs `read`.
pub(crate) async fn run(args: Args, ctx: &Context) -> Result<(), Failure> {
    let doing = format!("read {}", args.stream);
    if let Some(id) = args.id {
        let stream_id = id.stream_id().to_string();
        let request = ReadRequest {
            stream: args.stream.clone(),
            start_id: stream_id.clone(),
            end_id: stream_id.clone(),
            count: 1,
            ..Default::default()
        };
        let page = ctx
            .stream()
            .read(ctx.request(request))
            .await
            .map_err(|s| Failure::status_of_flags(&doing, s, &[("start_id", "--id"), ("end_id", "--id")]))?
            .into_inner();
        warn_oversized(&args.stream, &page.oversized_ids);
        return match (page.entries.first(), id) {
            // A branded id names the entry minted at its stream id; another entry there (a copy,
            // which keeps an older branded id) is not the one asked for.
            (Some(entry), EntryId::Branded(branded)) if entry.id != branded.to_string() => {
                Err(Failure::NotFound(format!(
                    "{}: no entry with branded id {branded}: the entry at its stream id {stream_id} has branded id \
                     {} (a replayed or copied entry keeps its branded id but gets a new stream id)",
                    args.stream, entry.id
                )))
            }
            (Some(entry), _) => print_entry(ctx.json, &args.stream, entry),
            (None, _) if !page.oversized_ids.is_empty() => Ok(()),
            (None, EntryId::Stream(_)) => {
                Err(Failure::NotFound(format!("{}: no entry with stream id {stream_id}", args.stream)))
            }
            (None, EntryId::Branded(branded)) => Err(Failure::NotFound(format!(
                "{}: no entry with branded id {branded} (stream id {stream_id}) in this stream",
                args.stream
            ))),
        };
    }
    let mut left = if args.all { u64::MAX } else { args.count };
    let mut request = ReadRequest {
        stream: args.stream.clone(),
        start_id: args.from.map(|id| id.stream_id().to_string()).unwrap_or_default(),
        start_time: args.since.map(timestamp_of_ms),
        end_id: args.to.map(|id| id.stream_id().to_string()).unwrap_or_default(),
        end_time: args.until.map(timestamp_of_ms),
        count: 0,
    };
    while left > 0 {
        request.count = left.min(u64::from(PAGE)) as u32;
        let page = ctx
            .stream()
            .read(ctx.request(request.clone()))
            .await
            .map_err(|s| Failure::status_of_flags(&doing, s, &RANGE_FLAGS))?
            .into_inner();
        warn_oversized(&args.stream, &page.oversized_ids);
        for entry in &page.entries {
            print_entry(ctx.json, &args.stream, entry)?;
        }
        left = left.saturating_sub(page.entries.len() as u64);
        if page.next_start_id.is_empty() {
            break;
        }
        if left == 0 {
            // Stopped by --count with more in range: say how to go on (on stderr, so output stays clean).
            eprintln!(
                "echomqctl: more entries of {} may follow; read on with --from {} or ask for --all",
                args.stream, page.next_start_id
            );
            break;
        }
        request.start_id = page.next_start_id;
        request.start_time = None;
    }
    Ok(())
}
