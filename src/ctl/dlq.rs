//! `dlq list` and `dlq replay`: a stream's dead letters
//! (AdminService.ListDeadLetters, ReplayDeadLetters).

use echomq::proto::{DeadLetter, ListDeadLettersRequest, ReplayDeadLettersRequest, ReplayDeadLettersResponse};
use serde_json::{json, Map, Value};

use crate::connect::Context;
use crate::exit::Failure;
use crate::render::{emit, emit_json_document, fields_json, fields_text, instant_text, table};
use crate::time::timestamp_ms;

/// Dead letters asked of the sidecar per call.
const PAGE: u32 = 1_000;

/// `dlq list`'s flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "With --json: one document, `{\"dead_letters\": [...], \"next_start_id\": ..., \
    \"oversized_ids\": [...]}`; each dead letter has `dead_letter_id` (its id in the dead-letter stream), \
    `id` (the branded id), `source_stream`, `source_id`, `group`, `attempts`, `reason`, \
    `dead_lettered_at_ms` (unix ms), `fields` and `fields_base64`. `next_start_id` is null at the end; \
    pass it as --from for the next page.")]
pub(crate) struct ListArgs {
    /// The source stream.
    stream: String,
    /// The dead-letter stream. Default: the stream's, `<stream>:dlq` (for a sharded stream, name a
    /// shard's: each shard has its own).
    #[arg(long)]
    dead_letter_stream: Option<String>,
    /// The first dead-letter stream id to list (inclusive). Default: the oldest.
    #[arg(long)]
    from: Option<String>,
    /// The most dead letters to list.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// List every dead letter (pages through them).
    #[arg(long, conflicts_with = "count")]
    all: bool,
}

/// `dlq replay`'s flags.
#[derive(Debug, clap::Args)]
#[command(
    group(clap::ArgGroup::new("which").required(true).args(["ids", "count"])),
    after_help = "Each dead letter is appended to the source stream (a new stream id, the same branded \
    id, the original payload) and deleted from the dead-letter stream, atomically. Every group of the \
    stream reads it again. Exit code 4 when an id asked for is not in the dead-letter stream (the others \
    are replayed). With --json: one document, `{\"replayed\": [{\"dead_letter_id\", \"stream_id\", \"id\"}], \
    \"not_found_ids\": [...], \"other_source_ids\": [...]}`."
)]
pub(crate) struct ReplayArgs {
    /// The source stream the dead letters go back to.
    stream: String,
    /// Dead-letter stream ids to replay (as `dlq list` prints them).
    ids: Vec<String>,
    /// Instead of ids: replay the oldest this many.
    #[arg(long, conflicts_with = "ids", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    count: Option<u32>,
    /// The dead-letter stream. Default: the stream's, `<stream>:dlq`.
    #[arg(long)]
    dead_letter_stream: Option<String>,
}

/// Runs `dlq list`.
pub(crate) async fn list(args: ListArgs, ctx: &Context) -> Result<(), Failure> {
    let doing = format!("list the dead letters of {}", args.stream);
    let mut request = ListDeadLettersRequest {
        stream: args.stream.clone(),
        dead_letter_stream: args.dead_letter_stream.clone().unwrap_or_default(),
        start_id: args.from.clone().unwrap_or_default(),
        count: 0,
    };
    let mut left = if args.all { u64::MAX } else { args.count };
    let (mut letters, mut oversized, mut next) = (Vec::new(), Vec::new(), String::new());
    while left > 0 {
        request.count = left.min(u64::from(PAGE)) as u32;
        let page = ctx
            .admin()
            .list_dead_letters(ctx.request(request.clone()))
            .await
            .map_err(|s| Failure::status_of_flags(&doing, s, &[("start_id", "--from")]))?
            .into_inner();
        left = left.saturating_sub(page.dead_letters.len() as u64);
        letters.extend(page.dead_letters);
        oversized.extend(page.oversized_ids);
        next = page.next_start_id;
        if next.is_empty() {
            break;
        }
        request.start_id = next.clone();
    }
    if ctx.json {
        let letters: Vec<Value> = letters.iter().map(letter_json).collect();
        let next = (!next.is_empty()).then_some(next);
        return emit_json_document(
            &json!({"dead_letters": letters, "next_start_id": next, "oversized_ids": oversized}),
        );
    }
    if letters.is_empty() {
        emit("no dead letters")?;
    } else {
        let rows: Vec<Vec<String>> = letters
            .iter()
            .map(|d| {
                let entry = d.entry.clone().unwrap_or_default();
                vec![
                    entry.stream_id,
                    entry.id,
                    d.source_id.clone(),
                    d.group.clone(),
                    d.attempts.to_string(),
                    instant_text(d.dead_lettered_at.as_ref()),
                    format!("{:?}", d.reason),
                    fields_text(&entry.payload, &entry.raw_fields),
                ]
            })
            .collect();
        emit(&table(
            &["DEAD-LETTER ID", "ID", "SOURCE ID", "GROUP", "ATTEMPTS", "DEAD-LETTERED", "REASON", "FIELDS"],
            &rows,
        ))?;
    }
    for id in &oversized {
        eprintln!("echomqctl: dead letter {id} is too large for one gRPC message: left out (replaying it works)");
    }
    if !next.is_empty() {
        eprintln!("echomqctl: more dead letters follow: --from {next}");
    }
    Ok(())
}

fn letter_json(d: &DeadLetter) -> Value {
    let entry = d.entry.clone().unwrap_or_default();
    let mut object = Map::new();
    object.insert("dead_letter_id".into(), json!(entry.stream_id));
    object.insert("id".into(), json!(entry.id));
    object.insert("source_stream".into(), json!(d.source_stream));
    object.insert("source_id".into(), json!(d.source_id));
    object.insert("group".into(), json!(d.group));
    object.insert("attempts".into(), json!(d.attempts));
    object.insert("reason".into(), json!(d.reason));
    object.insert("dead_lettered_at_ms".into(), json!(d.dead_lettered_at.as_ref().map(timestamp_ms)));
    fields_json(&entry.payload, &entry.raw_fields, &mut object);
    Value::Object(object)
}

/// Runs `dlq replay`.
pub(crate) async fn replay(args: ReplayArgs, ctx: &Context) -> Result<(), Failure> {
    let request = ReplayDeadLettersRequest {
        stream: args.stream.clone(),
        dead_letter_stream: args.dead_letter_stream.clone().unwrap_or_default(),
        ids: args.ids.clone(),
        count: args.count.unwrap_or(0),
    };
    let done = ctx
        .admin()
        .replay_dead_letters(ctx.request(request))
        .await
        .map_err(|s| Failure::status(format!("replay the dead letters of {}", args.stream), s))?
        .into_inner();
    if ctx.json {
        emit_json_document(&replay_json(&done))?;
    } else {
        emit(&replay_text(&done))?;
    }
    match done.not_found_ids.len() {
        0 => Ok(()),
        n => Err(Failure::NotFound(format!("{n} of the ids asked for are not in the dead-letter stream"))),
    }
}

fn replay_json(done: &ReplayDeadLettersResponse) -> Value {
    let replayed: Vec<Value> = done
        .replayed
        .iter()
        .map(|r| json!({"dead_letter_id": r.dead_letter_id, "stream_id": r.stream_id, "id": r.id}))
        .collect();
    json!({"replayed": replayed, "not_found_ids": done.not_found_ids, "other_source_ids": done.other_source_ids})
}

fn replay_text(done: &ReplayDeadLettersResponse) -> String {
    let mut text = if done.replayed.is_empty() {
        "nothing replayed".to_owned()
    } else {
        let rows: Vec<Vec<String>> =
            done.replayed.iter().map(|r| vec![r.dead_letter_id.clone(), r.stream_id.clone(), r.id.clone()]).collect();
        table(&["DEAD-LETTER ID", "NEW STREAM ID", "ID"], &rows)
    };
    if !done.not_found_ids.is_empty() {
        text.push_str(&format!("\nnot in the dead-letter stream: {}", done.not_found_ids.join(" ")));
    }
    if !done.other_source_ids.is_empty() {
        text.push_str(&format!("\nleft in place, from another source stream: {}", done.other_source_ids.join(" ")));
    }
    text
}
