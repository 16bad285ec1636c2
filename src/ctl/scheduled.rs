//! `scheduled list STREAM` and `scheduled cancel STREAM ID`: scheduled entries
//! waiting to enter their stream (StreamService.ListScheduled, CancelScheduled).

use echomq::proto::{CancelScheduledRequest, ListScheduledRequest, ScheduledEntry};
use serde_json::{json, Map, Value};

use crate::connect::Context;
use crate::exit::Failure;
use crate::render::{emit, emit_json_document, fields_json, fields_text, instant_text, table};
use crate::time::timestamp_ms;

/// Entries asked of the sidecar per call.
const PAGE: u32 = 1_000;

/// `scheduled list`'s flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "Entries by due time, then branded id. With --json: one document, \
    `{\"total\": N, \"scheduled\": [...], \"next_page_token\": ...}`; each entry has `id` (the branded id \
    it will carry), `deliver_at_ms` (unix ms), `fields` and `fields_base64`. `next_page_token` is null at \
    the end; pass it as --page-token for the next page.")]
pub(crate) struct ListArgs {
    /// The stream key (for a sharded stream, one shard's key: the STREAM column of `append`).
    stream: String,
    /// The most entries to list.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Continue where a previous listing stopped (its `next_page_token`).
    #[arg(long)]
    page_token: Option<String>,
    /// List every scheduled entry (pages through them).
    #[arg(long, conflicts_with = "count")]
    all: bool,
}

/// `scheduled cancel`'s flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "Exit code 4 when the entry is not scheduled on that stream key: it entered the \
    stream already, was cancelled, or was scheduled on another key (a sharded stream's shard: the STREAM \
    column of `append`). With --json: one document, `{\"stream\": S, \"id\": ID, \"deliver_at_ms\": N}`.")]
pub(crate) struct CancelArgs {
    /// The stream key it was scheduled on.
    stream: String,
    /// Its branded id (the ID column of `append`).
    id: String,
}

/// Runs `scheduled list`.
pub(crate) async fn list(args: ListArgs, ctx: &Context) -> Result<(), Failure> {
    let doing = format!("list the scheduled entries of {}", args.stream);
    let mut request = ListScheduledRequest {
        stream: args.stream.clone(),
        page_token: args.page_token.clone().unwrap_or_default(),
        count: 0,
    };
    let mut left = if args.all { u64::MAX } else { args.count };
    let (mut entries, mut next, mut total) = (Vec::new(), String::new(), 0);
    while left > 0 {
        request.count = left.min(u64::from(PAGE)) as u32;
        let page = ctx
            .stream()
            .list_scheduled(ctx.request(request.clone()))
            .await
            .map_err(|s| Failure::status_of_flags(&doing, s, &[("page_token", "--page-token")]))?
            .into_inner();
        left = left.saturating_sub(page.entries.len() as u64);
        total = page.total;
        entries.extend(page.entries);
        next = page.next_page_token;
        if next.is_empty() {
            break;
        }
        request.page_token = next.clone();
    }
    if ctx.json {
        let entries: Vec<Value> = entries.iter().map(entry_json).collect();
        let next = (!next.is_empty()).then_some(next);
        return emit_json_document(&json!({"total": total, "scheduled": entries, "next_page_token": next}));
    }
    if entries.is_empty() {
        emit("no scheduled entries")?;
    } else {
        let rows: Vec<Vec<String>> = entries
            .iter()
            .map(|e| vec![e.id.clone(), instant_text(e.deliver_at.as_ref()), fields_text(&e.fields, &[])])
            .collect();
        emit(&table(&["ID", "DUE", "FIELDS"], &rows))?;
    }
    if !next.is_empty() {
        eprintln!("echomqctl: {total} scheduled in all; more follow: --page-token {next}");
    }
    Ok(())
}

fn entry_json(e: &ScheduledEntry) -> Value {
    let mut object = Map::new();
    object.insert("id".into(), json!(e.id));
    object.insert("deliver_at_ms".into(), json!(e.deliver_at.as_ref().map(timestamp_ms)));
    fields_json(&e.fields, &[], &mut object);
    Value::Object(object)
}

/// Runs `scheduled cancel`.
pub(crate) async fn cancel(args: CancelArgs, ctx: &Context) -> Result<(), Failure> {
    let request = CancelScheduledRequest { stream: args.stream.clone(), id: args.id.clone() };
    let done = ctx
        .stream()
        .cancel_scheduled(ctx.request(request))
        .await
        .map_err(|s| Failure::status(format!("cancel scheduled entry {} of {}", args.id, args.stream), s))?
        .into_inner();
    if ctx.json {
        let due = done.deliver_at.as_ref().map(timestamp_ms);
        return emit_json_document(&json!({"stream": args.stream, "id": args.id, "deliver_at_ms": due}));
    }
    emit(&format!(
        "cancelled scheduled entry {} of {} (it was due {})",
        args.id,
        args.stream,
        instant_text(done.deliver_at.as_ref())
    ))
}
