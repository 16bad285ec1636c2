//! The AckEmit step: consume → produce exactly once. `ack_emit.lua` checks
//! that the source entry is still pending for this sidecar's consumer (the
//! fence), appends the emits (minting branded ids as Append does, with the
//! prelude's `next_stream_id`), then XACKs the entry and drops its retry state,
//! all in one script on the source's slot. An entry leaves the PEL once, and
//! its emits are written by the same step or not at all: so they are written
//! exactly once, whatever redeliveries, reclaims and duplicate handler runs
//! happened.
//!
//! With `--wait-replicas`/`--wait-aof` the step goes through the durable
//! writer ([`crate::durable`]) and is confirmed like an append; each worker
//! turn's AckEmits run concurrently, so one `WAIT` round confirms them all.

use opentelemetry::trace::SpanContext;
use redis::{RedisResult, Value};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{
    orders::{Emission, EmitOrder},
    GroupKeys,
};
use crate::{
    durable::{run, DurableWriter, ScriptCall, ScriptName},
    redis::{parse_stream_id, tagged, unknown_tag},
    telemetry::{self, TRACE_FIELD},
};

/// Runs `order` (`ack_emit.lua`: XPENDING, XRANGE for the trace context,
/// XADD per emit, XACK, HDEL, and the ZREM of its keyed member), through `durable` when writes wait for
/// replicas. `delivery`: the delivery's span context (traces exported), the
/// parent of this step's span, whose context the emits then carry; else
/// they carry the source entry's own `traceparent` field, if any.
///
/// Errors: Redis' (WRONGTYPE, naming the key, when an emit stream or the
/// retry hash holds another type: refused before any write; NOGROUP when
/// the group is gone; a lost connection: the outcome is then unknown), or a
/// reply not shaped as the script's.
pub(crate) async fn ack_emit(
    keys: &GroupKeys,
    durable: Option<&DurableWriter>,
    order: &EmitOrder,
    delivery: Option<SpanContext>,
) -> RedisResult<Emission> {
    let span = step_span(keys, order, delivery);
    let traceparent = telemetry::traceparent_of(&span).unwrap_or_default();
    let mut script_keys = vec![keys.stream.clone(), keys.retries.clone(), keys.keyed.clone()];
    let mut key_of = Vec::with_capacity(order.emits.len());
    for emit in &order.emits {
        let at = match script_keys[3..].iter().position(|key| *key == emit.stream) {
            Some(at) => at + 4,
            None => {
                script_keys.push(emit.stream.clone());
                script_keys.len()
            }
        };
        key_of.push(at);
    }
    let mut call = ScriptCall::new(&keys.redis, ScriptName::AckEmit, &script_keys);
    call.arg(&keys.group)
        .arg(&keys.consumer)
        .arg(&keys.id_field)
        .arg(order.stream_id.to_string())
        .arg(TRACE_FIELD)
        .arg(&traceparent)
        .arg(order.member.as_deref().unwrap_or_default())
        .arg(order.emits.len());
    for (emit, key) in order.emits.iter().zip(key_of) {
        call.arg(key).arg(emit.shard).arg(emit.shards).arg(emit.fields.len());
        for (name, value) in &emit.fields {
            call.arg(name.as_str()).arg(value.as_slice());
        }
    }
    let mut conn = keys.redis.conn.clone();
    let (reply, shortfall) = run(&keys.redis, &mut conn, durable, call).instrument(span).await?;
    let mut emission = parse(&reply)?;
    if let Emission::Emitted { unconfirmed, .. } = &mut emission {
        *unconfirmed = shortfall.map(|short| short.to_string());
    }
    Ok(emission)
}

/// The span of one AckEmit (while traces are exported): kind PRODUCER,
/// operation `send`, the child of the delivery's span; the emits carry its
/// context, so their consumers continue the source entry's trace.
fn step_span(keys: &GroupKeys, order: &EmitOrder, delivery: Option<SpanContext>) -> tracing::Span {
    if !telemetry::exporting() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "echomq.ack_emit",
        otel.kind = "producer",
        messaging.system = telemetry::MESSAGING_SYSTEM,
        messaging.operation.type = "send",
        messaging.operation.name = "ack_emit",
        messaging.destination.name = keys.stream.as_str(),
        messaging.consumer.group.name = keys.group.as_str(),
        messaging.message.id = order.text.as_str(),
        messaging.batch.message_count = order.emits.len() as i64,
    );
    if let Some(delivery) = delivery {
        use opentelemetry::trace::TraceContextExt;
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(delivery));
    }
    span
}

fn parse(reply: &Value) -> RedisResult<Emission> {
    let (_, tag, rest) = tagged(reply)?;
    match tag.as_str() {
        "not_pending" => Ok(Emission::NotPending),
        "not_ours" => Ok(Emission::NotOurs),
        "emitted" => {
            let ids = rest.iter().map(parse_stream_id).collect::<RedisResult<Vec<_>>>()?;
            Ok(Emission::Emitted { ids, unconfirmed: None })
        }
        other => Err(unknown_tag("ack_emit.lua", other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::StreamId;

    #[test]
    fn the_script_replies_exactly_the_tags_known_here() {
        let known = ["not_pending", "not_ours", "emitted"];
        let lua = include_str!("ack_emit.lua");
        super::super::script_replies::assert_replies_agree("ack_emit.lua", lua, &known, parse);
    }

    #[test]
    fn every_reply_of_the_script_parses_into_its_outcome() {
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let emitted = Value::Array(vec![bulk("1-0"), bulk("emitted"), bulk("9-1"), bulk("9-2")]);
        assert_eq!(
            parse(&emitted).unwrap(),
            Emission::Emitted { ids: vec![StreamId { ms: 9, seq: 1 }, StreamId { ms: 9, seq: 2 }], unconfirmed: None }
        );
        let none = Value::Array(vec![bulk("1-0"), bulk("emitted")]);
        assert_eq!(parse(&none).unwrap(), Emission::Emitted { ids: vec![], unconfirmed: None });
        assert_eq!(parse(&Value::Array(vec![bulk("1-0"), bulk("not_pending")])).unwrap(), Emission::NotPending);
        let peer = Value::Array(vec![bulk("1-0"), bulk("not_ours"), bulk("peer")]);
        assert_eq!(parse(&peer).unwrap(), Emission::NotOurs);
        assert!(parse(&Value::Array(vec![bulk("1-0"), bulk("emitted"), bulk("x")])).is_err());
        assert!(parse(&Value::Array(vec![bulk("1-0"), bulk("moved")])).is_err());
    }
}
