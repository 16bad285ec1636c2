//! Acknowledging in batches: the acks and retry states queued by one batch of
//! commands reach Redis as one `settle.lua` run (one request for Redis to
//! parse and dispatch, not a pipeline of many), the acks as multi-id XACKs of
//! up to [`ACK_CHUNK`] ids.

use opentelemetry::{trace::SpanContext, KeyValue};
use redis::RedisResult;
use tracing::{warn, Instrument};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{
    retry::RetryWrite,
    verdicts,
    worker::{Step, Worker},
    GroupKeys, SessionId,
};
use crate::{id::StreamId, telemetry};

/// The most ids in one XACK (and one HDEL, and pairs in one HSET) of
/// `settle.lua`: Lua's `unpack` spreads them on its C stack, which holds
/// about 8,000.
pub(crate) const ACK_CHUNK: usize = 1024;

/// A queued XACK.
#[derive(Debug)]
pub(crate) struct PendingAck {
    /// The call whose Ack it is, answered if XACK finds nothing pending.
    pub(crate) session: SessionId,
    /// The id as the client sent it.
    pub(crate) text: String,
    pub(crate) stream_id: StreamId,
    /// The entry was delivered before, so the group's retry hash may hold it.
    pub(crate) redelivered: bool,
    /// The delivery's span, which the settle span links to (only while
    /// traces are exported).
    pub(crate) delivery: Option<SpanContext>,
}

/// Records `writes` in the retry hash, then XACKs `acks` (`XACK <stream>
/// <group> <id> …`, [`ACK_CHUNK`] ids per command) and drops the retry state
/// of the re-delivered ones, all in one `settle.lua` run. Returns, per chunk
/// of `acks` in order (`acks.chunks(ACK_CHUNK)`), how many of its ids Redis
/// still had pending: XACK counts, it does not say which.
///
/// Errors: Redis' (a timeout leaves the outcome unknown).
pub(crate) async fn settle(keys: &GroupKeys, acks: &[PendingAck], writes: &[RetryWrite]) -> RedisResult<Vec<usize>> {
    let mut script = keys.redis.scripts.settle.prepare_invoke();
    script.key(&keys.stream).key(&keys.retries).arg(&keys.group).arg(ACK_CHUNK).arg(acks.len());
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
    let mut conn = keys.redis.conn.clone();
    script.invoke_async(&mut conn).instrument(settle_span(keys, acks, writes)).await
}

/// The span of one settle run (while traces are exported): kind CLIENT and
/// operation `settle`, as the messaging conventions have it, with a link to
/// each acknowledged delivery's span (each link naming its
/// `messaging.message.id`): a batch settles deliveries of many traces, so it
/// is the child of none of them. At most `OTEL_SPAN_LINK_COUNT_LIMIT` links
/// (128 by default) are kept; the span's dropped-links count says how many
/// more there were. Fails are on their delivery spans (`echomq.verdict`):
/// a run with no ack (retry states only) has no settle span.
fn settle_span(keys: &GroupKeys, acks: &[PendingAck], writes: &[RetryWrite]) -> tracing::Span {
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
    for ack in acks {
        if let Some(delivery) = &ack.delivery {
            span.add_link_with_attributes(
                delivery.clone(),
                vec![KeyValue::new("messaging.message.id", ack.text.clone())],
            );
        }
    }
    span
}

impl Worker {
    pub(super) async fn settle(&mut self, acks: Vec<PendingAck>, writes: Vec<RetryWrite>) {
        match settle(&self.keys, &acks, &writes).await {
            Ok(pending) => {
                self.redis_ok();
                for (chunk, pending) in acks.chunks(ACK_CHUNK).zip(pending) {
                    self.acked(chunk, pending);
                }
            }
            Err(e) => {
                // The acks are reported as not known to be applied; their
                // entries wait, and come back only if still pending (the
                // re-delivery checks), so an applied ack is not undone. The
                // retry delays stay local.
                self.redis_failed(Step::Settle, &e);
                let message = if e.is_timeout() {
                    format!("XACK's outcome is unknown: Redis did not answer in time ({e}); if it was applied the entry is done, else it stays pending and will be delivered again")
                } else {
                    format!("XACK failed ({e}); the entry stays pending and will be delivered again")
                };
                let retry_at = self.paused_until;
                for ack in acks {
                    self.ledger.answer(ack.session, verdicts::unavailable(&ack.text, message.clone()));
                    self.ledger.wait(ack.stream_id, retry_at);
                }
            }
        }
    }

    /// Counts and answers one XACK of `chunk`, `pending` of whose ids Redis
    /// still had pending. All or none is exact: the ones not pending are
    /// answered NOT_PENDING. In between (another client acknowledged some of
    /// them: an operator, or a peer past a lost lease) XACK cannot say which,
    /// so none is answered: the shortfall is counted and logged. Every id of
    /// the chunk is settled for the group either way.
    fn acked(&mut self, chunk: &[PendingAck], pending: usize) {
        let pending = pending.min(chunk.len());
        self.metrics.acks.inc_by(pending as u64);
        self.metrics.acks_not_pending.inc_by((chunk.len() - pending) as u64);
        if pending == 0 {
            for ack in chunk {
                self.ledger.answer(ack.session, verdicts::not_pending_in_group(&ack.text));
            }
        } else if pending < chunk.len() {
            warn!(
                stream = %self.keys.stream,
                group = %self.keys.group,
                acked = chunk.len(),
                not_pending = chunk.len() - pending,
                first = %chunk[0].stream_id,
                last = %chunk[chunk.len() - 1].stream_id,
                "some acknowledged entries were no longer pending for the group (another client acknowledged them); XACK does not say which, so none is answered NOT_PENDING"
            );
        }
    }
}
