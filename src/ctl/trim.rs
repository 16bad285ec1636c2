//! `trim STREAM`: remove the oldest entries (StreamService.Trim). Safe by
//! default: never past an entry that a group still has pending or not read.

use echomq::proto::TrimRequest;
use serde_json::json;

use crate::connect::Context;
use crate::exit::Failure;
use crate::ids::{parse_bound, EntryId};
use crate::render::{emit, emit_json_document};
use crate::time::{parse_instant, timestamp_of_ms};

/// `trim`'s flags.
#[derive(Debug, clap::Args)]
#[command(
    group(clap::ArgGroup::new("bound").required(true).args(["max_len", "min_id", "before"])),
    after_help = "Exactly one bound. The safe mode (the default) raises the bound to the oldest entry \
    that any group still has pending or has not yet been delivered, atomically. With --json: one \
    document, `{\"trimmed\": N, \"applied_min_id\": ID|null, \"held_back_by_groups\": BOOL, \
    \"archived\": N}` (`archived`: entries this trim folded into the sidecar's --archive-url first; 0 \
    without an archive)."
)]
pub(crate) struct Args {
    /// The stream key (for a sharded stream, one shard's key).
    stream: String,
    /// Keep the newest this many entries.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_len: Option<u64>,
    /// Remove the entries with a stream id below this one (`<ms>-<seq>` or `<ms>`), or below a
    /// branded id's minted stream id.
    #[arg(long, value_parser = parse_bound)]
    min_id: Option<EntryId>,
    /// Remove the entries appended before this instant (as for `read --since`).
    #[arg(long, value_parser = parse_instant)]
    before: Option<u64>,
    /// Let Redis trim whole radix-tree nodes only: cheaper, may keep a few more entries.
    #[arg(long)]
    approximate: bool,
    /// Trim as asked even past entries that groups have pending or not yet read (they are lost
    /// to those groups).
    #[arg(long)]
    ignore_groups: bool,
}

/// Runs `trim`.
pub(crate) async fn run(args: Args, ctx: &Context) -> Result<(), Failure> {
    let request = TrimRequest {
        stream: args.stream.clone(),
        max_len: args.max_len.unwrap_or(0),
        min_id: args.min_id.map(|id| id.stream_id().to_string()).unwrap_or_default(),
        before: args.before.map(timestamp_of_ms),
        approximate: args.approximate,
        ignore_groups: args.ignore_groups,
    };
    let done = ctx
        .stream()
        .trim(ctx.request(request))
        .await
        .map_err(|s| {
            let flags = [("max_len", "--max-len"), ("min_id", "--min-id"), ("before", "--before")];
            Failure::status_of_flags(format!("trim {}", args.stream), s, &flags)
        })?
        .into_inner();
    if ctx.json {
        let applied = (!done.applied_min_id.is_empty()).then_some(&done.applied_min_id);
        return emit_json_document(&json!({
            "trimmed": done.trimmed,
            "applied_min_id": applied,
            "held_back_by_groups": done.held_back_by_groups,
            "archived": done.archived,
        }));
    }
    let mut text = format!("trimmed {} entries from {}", done.trimmed, args.stream);
    if !done.applied_min_id.is_empty() {
        text.push_str(&format!(": those below {}", done.applied_min_id));
    }
    if done.archived > 0 {
        text.push_str(&format!("\narchived {} entries first", done.archived));
    }
    if done.held_back_by_groups {
        text.push_str("\nheld back: a group still has entries pending or unread beyond that bound");
    }
    emit(&text)
}
