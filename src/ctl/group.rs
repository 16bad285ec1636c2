//! `group destroy STREAM GROUP`: remove a consumer group and the keys the
//! sidecars keep for it alone (AdminService.DestroyGroup). Refused while the
//! group has pending entries, unless `--force`.

use echomq::proto::DestroyGroupRequest;
use serde_json::json;

use crate::connect::Context;
use crate::exit::Failure;
use crate::render::{emit, emit_json_document};

/// `group destroy`'s flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "The stream, its other groups and the dead-letter stream stay. End the group's \
    Consume calls first: a sidecar with a call open on the group re-creates it at its next read, from \
    the start of the stream. With --json: one document, `{\"stream\": S, \"group\": G, \
    \"pending_dropped\": N, \"keys_removed\": N}`.")]
pub(crate) struct DestroyArgs {
    /// The stream key, or the name of a sharded stream (the group goes on every shard).
    stream: String,
    /// The consumer group.
    group: String,
    /// Destroy it even though it has pending entries (they are dropped with it; the entries
    /// stay in the stream).
    #[arg(long)]
    force: bool,
}

/// Runs `group destroy`.
pub(crate) async fn destroy(args: DestroyArgs, ctx: &Context) -> Result<(), Failure> {
    let request = DestroyGroupRequest { stream: args.stream.clone(), group: args.group.clone(), force: args.force };
    let done = ctx
        .admin()
        .destroy_group(ctx.request(request))
        .await
        .map_err(|s| Failure::status(format!("group destroy {} {}", args.stream, args.group), s))?
        .into_inner();
    if ctx.json {
        return emit_json_document(&json!({
            "stream": done.stream,
            "group": done.group,
            "pending_dropped": done.pending_dropped,
            "keys_removed": done.keys_removed,
        }));
    }
    let mut text = format!("destroyed group {} of {}", done.group, done.stream);
    if done.pending_dropped > 0 {
        text.push_str(&format!(", dropping {} pending entries", done.pending_dropped));
    }
    text.push_str(&format!("; removed {} of its keys", done.keys_removed));
    emit(&text)
}
