//! The retry policy: when a failed or returned delivery comes back, and how
//! that delay binds peers and outlives a restart.
//!
//! - The delay after `n` deliveries is `initial × 2^(n-1)`, capped at `max`,
//!   jittered into its upper half ([`Backoff::delay`](super::orders::Backoff::delay)); a Fail's
//!   `retry_after` overrides it.
//! - Here, the entry waits in the worker's ledger until then. In Redis, its
//!   due time and last failure reason go into the group's retry hash
//!   (`<stream>:retries:<group>`, field: stream id, value: `"<due unix ms>
//!   <reason>"`, written by `settle.lua`), so a peer that reclaims it or this
//!   sidecar after a restart waits just as long.
//! - [`redeliver`] (`redeliver.lua`) claims due entries, only those still
//!   pending for this consumer, and refuses early ones (`NotDue`) and
//!   entries that reached `max_deliveries` (`Poison`: the dead-letter step
//!   takes them).

use redis::{RedisResult, Value};

use super::{orders::Redelivery, GroupKeys};
use crate::{
    id::StreamId,
    redis::{array, bytes, int, parse_entry, tagged, unknown_tag},
};

/// Claims the due entries `ids` for re-delivery (`redeliver.lua`: XPENDING …
/// consumer, HGET of the retry hash, XRANGE, XCLAIM, XACK of deleted ones),
/// one reply per id in order.
///
/// Errors: Redis' (NOGROUP when the group is gone), or a reply not shaped as
/// the script's (a Parse error).
pub(crate) async fn redeliver(
    keys: &GroupKeys,
    max_deliveries: u32,
    ids: &[StreamId],
) -> RedisResult<Vec<(StreamId, Redelivery)>> {
    let mut script = keys.redis.scripts.redeliver.prepare_invoke();
    script.key(&keys.stream).key(&keys.retries).arg(&keys.group).arg(&keys.consumer).arg(max_deliveries);
    for id in ids {
        script.arg(id.to_string());
    }
    let mut conn = keys.redis.conn.clone();
    let reply: Value = script.invoke_async(&mut conn).await?;
    array(&reply).iter().map(parse_redelivery).collect()
}

fn parse_redelivery(item: &Value) -> RedisResult<(StreamId, Redelivery)> {
    let (id, tag, rest) = tagged(item)?;
    let nth = |n: usize| rest.get(n).unwrap_or(&Value::Nil);
    let outcome = match tag.as_str() {
        "not_ours" => Redelivery::NotOurs,
        "deleted" => Redelivery::Deleted,
        "not_due" => Redelivery::NotDue { due_unix_ms: int(nth(0))?.max(0) as u64 },
        "poison" => Redelivery::Poison {
            deliveries: int(nth(0))?.max(0) as u64,
            reason: String::from_utf8_lossy(&bytes(nth(1))?).into_owned(),
        },
        "claimed" => {
            let entry =
                parse_entry(Value::Array(vec![Value::BulkString(id.to_string().into_bytes()), nth(1).clone()]))?;
            Redelivery::Claimed { deliveries: u32::try_from(int(nth(0))?).unwrap_or(u32::MAX), entry }
        }
        other => return Err(unknown_tag("redeliver.lua", other)),
    };
    Ok((id, outcome))
}

#[cfg(test)]
mod tests {
    use super::super::script_replies::bulk;
    use super::*;

    #[test]
    fn every_reply_of_the_script_parses_into_its_outcome() {
        let items = [
            Value::Array(vec![bulk("1-0"), bulk("not_ours")]),
            Value::Array(vec![bulk("2-0"), bulk("deleted")]),
            Value::Array(vec![bulk("3-0"), bulk("not_due"), Value::Int(99)]),
            Value::Array(vec![bulk("4-0"), bulk("poison"), Value::Int(5), bulk("boom")]),
            Value::Array(vec![bulk("5-0"), bulk("claimed"), Value::Int(2), Value::Array(vec![bulk("k"), bulk("v")])]),
        ];
        let parsed: Vec<_> = items.iter().map(|item| parse_redelivery(item).unwrap()).collect();
        assert!(matches!(parsed[0].1, Redelivery::NotOurs));
        assert!(matches!(parsed[1].1, Redelivery::Deleted));
        assert!(matches!(parsed[2].1, Redelivery::NotDue { due_unix_ms: 99 }));
        assert!(matches!(&parsed[3].1, Redelivery::Poison { deliveries: 5, reason } if reason == "boom"));
        match &parsed[4] {
            (id, Redelivery::Claimed { deliveries: 2, entry }) => {
                assert_eq!(*id, StreamId { ms: 5, seq: 0 });
                assert_eq!(
                    entry.fields,
                    Some(vec![(bytes::Bytes::from_static(b"k"), bytes::Bytes::from_static(b"v"))])
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(parse_redelivery(&Value::Array(vec![bulk("1-0"), bulk("what")])).is_err());
    }

    #[test]
    fn the_script_replies_exactly_the_tags_known_here() {
        let known = ["not_ours", "deleted", "not_due", "poison", "claimed"];
        let lua = include_str!("redeliver.lua");
        super::super::script_replies::assert_replies_agree("redeliver.lua", lua, &known, parse_redelivery);
    }

    #[test]
    fn the_retry_state_is_shaped_as_the_script_parses_it() {
        use super::super::orders::RetryWrite;
        let stream_id = StreamId { ms: 1, seq: 2 };
        let write = RetryWrite { stream_id, due_unix_ms: 1234, reason: "a b".to_owned(), counts: true };
        assert_eq!(write.state(), "1234 a b");
        let transient = RetryWrite { counts: false, ..write };
        assert_eq!(transient.state(), "1234t a b");
        assert!(include_str!("redeliver.lua").contains(r"'^(%d+)(t?) ?(.*)$'"));
    }
}
