//! Acknowledging in batches: the acks and retry states queued by one batch of
//! commands reach Redis as one `settle.lua` run (one request for Redis to
//! parse and dispatch, not a pipeline of many), the acks as multi-id XACKs of
//! up to [`ACK_CHUNK`](super::orders::ACK_CHUNK) ids; acks with nothing else
//! to settle skip the script and go as those XACKs alone.

use opentelemetry::{trace::SpanContext, KeyValue};
use redis::RedisResult;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{
    orders::{PendingAck, RetryWrite, ACK_CHUNK},
    GroupKeys,
};
use crate::telemetry;

/// Records `writes` in the retry hash, then XACKs `acks` (`XACK <stream>
/// <group> <id> …`, [`ACK_CHUNK`] ids per command), drops the retry state
/// of the re-delivered ones and the keyed members of those with a key
/// (`ZREM`, per-key limits), all in one `settle.lua` run; a batch of acks
/// alone, of first deliveries without a key, is plain XACKs instead (one
/// command, or a pipeline of one per chunk; see [`xack`]). Returns, per chunk
/// of `acks` in order (`acks.chunks(ACK_CHUNK)`), how many of its ids Redis
/// still had pending: XACK counts, it does not say which.
///
/// `links`: the spans of the acknowledged deliveries, each with its id as the
/// client sent it, for the settle span (empty unless traces are exported).
///
/// Errors: Redis' (a timeout leaves the outcome unknown).
pub(crate) async fn settle(
    keys: &GroupKeys,
    acks: &[PendingAck],
    writes: &[RetryWrite],
    links: Vec<(SpanContext, String)>,
) -> RedisResult<Vec<usize>> {
    let span = settle_span(keys, acks, writes, links);
    let mut conn = keys.redis.conn.clone();
    if writes.is_empty() && !acks.is_empty() && acks.iter().all(|ack| !ack.redelivered && ack.member.is_none()) {
        if acks.len() <= ACK_CHUNK {
            // One command, not a pipeline of one: its metrics and span say XACK.
            let pending: usize = xack(keys, acks).query_async(&mut conn).instrument(span).await?;
            return Ok(vec![pending]);
        }
        let mut pipe = redis::pipe();
        for chunk in acks.chunks(ACK_CHUNK) {
            pipe.add_command(xack(keys, chunk));
        }
        return pipe.query_async(&mut conn).instrument(span).await;
    }
    let mut script = keys.redis.scripts.settle.prepare_invoke();
    script.key(&keys.stream).key(&keys.retries).key(&keys.keyed).arg(&keys.group).arg(ACK_CHUNK).arg(acks.len());
    for ack in acks {
        script.arg(ack.stream_id.to_string());
    }
    script.arg(acks.iter().filter(|a| a.redelivered).count());
    for ack in acks.iter().filter(|a| a.redelivered) {
        script.arg(ack.stream_id.to_string());
    }
    script.arg(writes.len());
    for write in writes {
        script.arg(write.stream_id.to_string()).arg(write.state());
    }
    script.arg(acks.iter().filter(|a| a.member.is_some()).count());
    for member in acks.iter().filter_map(|a| a.member.as_deref()) {
        script.arg(member);
    }
    script.invoke_async(&mut conn).instrument(span).await
}

/// `XACK <stream> <group> <id> …` of `acks` (at most [`ACK_CHUNK`]), for a
/// batch with nothing else to settle (no retry state to write or drop, no
/// keyed member). Most batches at full rate are these, and Redis runs a
/// plain XACK for about half of what the script costs it (its EVALSHA added
/// ~20 µs per run on 7.0.15); the reply is the same count.
fn xack(keys: &GroupKeys, acks: &[PendingAck]) -> redis::Cmd {
    let mut xack = redis::cmd("XACK");
    xack.arg(&keys.stream).arg(&keys.group);
    for ack in acks {
        xack.arg(ack.stream_id);
    }
    xack
}

/// The span of one settle run (while traces are exported): kind CLIENT and
/// operation `settle`, as the messaging conventions have it, with a link to
/// each acknowledged delivery's span (each link naming its
/// `messaging.message.id`): a batch settles deliveries of many traces, so it
/// is the child of none of them. At most `OTEL_SPAN_LINK_COUNT_LIMIT` links
/// (128 by default) are kept; the span's dropped-links count says how many
/// more there were. Fails are on their delivery spans (`echomq.verdict`):
/// a run with no ack (retry states only) has no settle span.
fn settle_span(
    keys: &GroupKeys,
    acks: &[PendingAck],
    writes: &[RetryWrite],
    links: Vec<(SpanContext, String)>,
) -> tracing::Span {
    if !telemetry::exporting() || acks.is_empty() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "echomq.settle",
        otel.kind = "client",
        messaging.system = telemetry::MESSAGING_SYSTEM,
        messaging.operation.type = "settle",
        messaging.operation.name = "ack",
        messaging.destination.name = keys.stream.as_str(),
        messaging.consumer.group.name = keys.group.as_str(),
        messaging.batch.message_count = (acks.len() > 1).then_some(acks.len() as i64),
        messaging.message.id = (acks.len() == 1).then(|| acks[0].text.as_str()),
        echomq.retry_writes = writes.len() as i64,
    );
    for (delivery, id) in links {
        span.add_link_with_attributes(delivery, vec![KeyValue::new("messaging.message.id", id)]);
    }
    span
}
