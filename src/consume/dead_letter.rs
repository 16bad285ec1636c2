//! The dead-letter step: one path for every entry that leaves the group
//! unprocessed — a Fail with `dead_letter`, a poison entry (its deliveries
//! reached `max_deliveries`), an entry too large for a frame.
//!
//! `dead_letter.lua` appends the entry to the dead-letter stream (default
//! `<stream>:dlq`), then acknowledges it on the source, in one script: a crash
//! can duplicate a dead letter, never lose the entry. The dead letter carries
//! the branded id in the reserved field, the metadata fields below, then the
//! original payload.
//!
//! It does not wait for replicas (`--wait-replicas`), on purpose: no client
//! waits for a confirmation of it, and the copy and the XACK are one script,
//! so they replicate together or not at all. A failover that loses the
//! script loses both: the entry is pending on the source again and is
//! dead-lettered again, nothing lost. A `WAIT` here would only hold the
//! group worker (and every ack behind it) up to `--wait-timeout-ms`.

use redis::{RedisResult, Value};

use super::{
    orders::{DeadLetterOrder, DeadLettered},
    GroupKeys,
};
use crate::{
    id::StreamId,
    redis::{array, int, parse_stream_id, tagged, unknown_tag},
};

/// Dead-letters `orders` into `dead_letter_stream` (`dead_letter.lua`:
/// XPENDING … consumer, XRANGE, XADD, XACK, HDEL, and with the group's
/// `key_field` the ZREM of a keyed entry's member), one reply per order.
///
/// Errors: Redis' (WRONGTYPE when the dead-letter stream is not a stream,
/// NOGROUP when the group is gone), or a reply not shaped as the script's.
pub(crate) async fn dead_letter(
    keys: &GroupKeys,
    dead_letter_stream: &str,
    key_field: Option<&str>,
    orders: &[DeadLetterOrder],
) -> RedisResult<Vec<(StreamId, DeadLettered)>> {
    let mut script = keys.redis.scripts.dead_letter.prepare_invoke();
    script
        .key(&keys.stream)
        .key(dead_letter_stream)
        .key(&keys.retries)
        .key(&keys.keyed)
        .arg(&keys.group)
        .arg(&keys.consumer)
        .arg(&keys.id_field)
        .arg(key_field.unwrap_or_default());
    for order in orders {
        script.arg(order.stream_id.to_string()).arg(&order.reason);
    }
    let mut conn = keys.redis.conn.clone();
    let reply: Value = script.invoke_async(&mut conn).await?;
    array(&reply).iter().map(parse).collect()
}

fn parse(item: &Value) -> RedisResult<(StreamId, DeadLettered)> {
    let (id, tag, rest) = tagged(item)?;
    let outcome = match tag.as_str() {
        "not_ours" => DeadLettered::NotOurs,
        "deleted" => DeadLettered::Deleted,
        "dead_lettered" => DeadLettered::Moved {
            dead_id: parse_stream_id(rest.first().unwrap_or(&Value::Nil))?,
            deliveries: int(rest.get(1).unwrap_or(&Value::Nil))?.max(0) as u64,
        },
        other => return Err(unknown_tag("dead_letter.lua", other)),
    };
    Ok((id, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::dead_letter_fields as fields;

    #[test]
    fn the_script_writes_the_metadata_fields_read_back_here() {
        let lua = include_str!("dead_letter.lua");
        for name in [
            fields::SOURCE_STREAM,
            fields::SOURCE_ID,
            fields::GROUP,
            fields::ATTEMPTS,
            fields::REASON,
            fields::DEAD_LETTERED_AT_MS,
        ] {
            assert!(name.starts_with(fields::PREFIX));
            assert!(lua.contains(&format!("'{name}'")), "dead_letter.lua does not write {name}");
        }
    }

    #[test]
    fn the_script_replies_exactly_the_tags_known_here() {
        let known = ["not_ours", "deleted", "dead_lettered"];
        let lua = include_str!("dead_letter.lua");
        super::super::script_replies::assert_replies_agree("dead_letter.lua", lua, &known, parse);
    }

    #[test]
    fn every_reply_of_the_script_parses_into_its_outcome() {
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let moved = Value::Array(vec![bulk("1-0"), bulk("dead_lettered"), bulk("9-1"), Value::Int(3)]);
        assert_eq!(
            parse(&moved).unwrap().1,
            DeadLettered::Moved { dead_id: StreamId { ms: 9, seq: 1 }, deliveries: 3 }
        );
        assert_eq!(parse(&Value::Array(vec![bulk("1-0"), bulk("not_ours")])).unwrap().1, DeadLettered::NotOurs);
        assert_eq!(parse(&Value::Array(vec![bulk("1-0"), bulk("deleted")])).unwrap().1, DeadLettered::Deleted);
        assert!(parse(&Value::Array(vec![bulk("1-0"), bulk("-3")])).is_err());
    }
}
