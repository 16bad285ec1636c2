//! `dlq list` and `dlq replay`: a stream's dead letters
//! (AdminService.ListDeadLetters, ReplayDeadLetters).

use echomq::id::StreamId;
use echomq::proto::{DeadLetter, ListDeadLettersRequest, ReplayDeadLettersRequest, ReplayDeadLettersResponse};
use serde_json::{json, Map, Value};

use crate::connect::Context;
use crate::exit::Failure;
use crate::ids::{parse_bound, parse_entry, EntryId};
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
    /// The first dead-letter stream id to list (inclusive; the DEAD-LETTER ID column, or
    /// `next_start_id`). Default: the oldest.
    #[arg(long, value_parser = parse_dead_letter_id)]
    from: Option<StreamId>,
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
    are replayed). A branded id is looked up among the dead letters first (`dlq list`, every page); \
    one that no dead letter carries counts as not found. With --json: one document, `{\"replayed\": [{\"dead_letter_id\", \"stream_id\", \"id\"}], \
    \"not_found_ids\": [...], \"other_source_ids\": [...]}`."
)]
pub(crate) struct ReplayArgs {
    /// The source stream the dead letters go back to.
    stream: String,
    /// The dead letters to replay: dead-letter stream ids (the DEAD-LETTER ID column) or branded ids
    /// (the ID column, 28 hex characters: every dead letter carrying it).
    #[arg(value_parser = parse_entry)]
    ids: Vec<EntryId>,
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
        start_id: args.from.map(|id| id.to_string()).unwrap_or_default(),
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

/// A `dlq list --from` value: a position in the dead-letter stream, so a
/// stream id. A branded id is refused with where to find the right id: a dead
/// letter's branded id is its source entry's, not its place in this stream.
fn parse_dead_letter_id(text: &str) -> Result<StreamId, String> {
    match parse_bound(text)? {
        EntryId::Stream(id) => Ok(id),
        EntryId::Branded(_) => Err(format!(
            "`{text}` is a branded id, and --from takes a dead-letter stream id: the DEAD-LETTER ID column \
             of `dlq list` (`dead_letter_id`, or `next_start_id`, with --json)"
        )),
    }
}

/// Runs `dlq replay`.
pub(crate) async fn replay(args: ReplayArgs, ctx: &Context) -> Result<(), Failure> {
    let doing = format!("replay the dead letters of {}", args.stream);
    let (mut ids, mut not_found) = (Vec::new(), Vec::new());
    let branded: Vec<String> = args
        .ids
        .iter()
        .filter_map(|id| match id {
            EntryId::Stream(id) => {
                ids.push(id.to_string());
                None
            }
            EntryId::Branded(id) => Some(id.to_string()),
        })
        .collect();
    if !branded.is_empty() {
        let (found, missing) = dead_letters_carrying(&branded, &args, ctx).await?;
        ids.extend(found);
        not_found.extend(missing);
    }
    // Empty `ids` asks the sidecar for the oldest `count`: only send a request
    // that still names ids when ids were given.
    let mut done = if args.ids.is_empty() || !ids.is_empty() {
        let request = ReplayDeadLettersRequest {
            stream: args.stream.clone(),
            dead_letter_stream: args.dead_letter_stream.clone().unwrap_or_default(),
            ids,
            count: args.count.unwrap_or(0),
        };
        ctx.admin()
            .replay_dead_letters(ctx.request(request))
            .await
            .map_err(|s| Failure::status(&doing, s))?
            .into_inner()
    } else {
        ReplayDeadLettersResponse::default()
    };
    done.not_found_ids.extend(not_found);
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

/// The dead-letter stream ids of the dead letters carrying these branded ids
/// (ListDeadLetters, every page), and the branded ids none carries. The sidecar
/// takes dead-letter stream ids only, and a dead letter's branded id is its
/// source entry's, so it has to be looked up.
async fn dead_letters_carrying(
    branded: &[String],
    args: &ReplayArgs,
    ctx: &Context,
) -> Result<(Vec<String>, Vec<String>), Failure> {
    let mut request = ListDeadLettersRequest {
        stream: args.stream.clone(),
        dead_letter_stream: args.dead_letter_stream.clone().unwrap_or_default(),
        start_id: String::new(),
        count: PAGE,
    };
    let mut found = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    loop {
        let page = ctx
            .admin()
            .list_dead_letters(ctx.request(request.clone()))
            .await
            .map_err(|s| Failure::status(format!("look up the dead letters of {}", args.stream), s))?
            .into_inner();
        for letter in &page.dead_letters {
            let entry = letter.entry.as_ref();
            if let Some(entry) = entry.filter(|e| branded.contains(&e.id)) {
                found.push(entry.stream_id.clone());
                seen.insert(entry.id.clone());
            }
        }
        if page.next_start_id.is_empty() {
            break;
        }
        request.start_id = page.next_start_id;
    }
    let missing = branded.iter().filter(|id| !seen.contains(*id)).cloned().collect();
    Ok((found, missing))
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
