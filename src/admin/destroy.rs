//! DestroyGroup: validate → `destroy_group.lua` on each stream key (a
//! sharded stream's shards are all checked first, then destroyed) → what was
//! removed.
//!
//! The group's own keys ([`crate::keys::Keyspace::group_keys`]) go in the
//! same script as the group, so no key of it outlives it; the dead-letter
//! stream stays (see the proto).

use redis::Value;

use super::Admin;
use crate::{
    error::Error,
    proto::{DestroyGroupRequest, DestroyGroupResponse},
    redis::{array, bytes, int, unknown_tag, Redis},
    security::Caller,
};

/// What `destroy_group.lua` replied, for one stream key.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// No such group (or no stream); these many leftover keys were removed.
    Missing { removed: u64 },
    /// It has these many pending entries and `force` was not set: nothing changed.
    Pending { pending: u64 },
    /// Checked only: it can be destroyed, with these many pending entries.
    Checked,
    /// Destroyed, with these many pending entries, and these many keys of its own.
    Destroyed { pending: u64, removed: u64 },
}

/// How the script runs.
#[derive(Clone, Copy)]
enum Mode {
    /// Change nothing: say what destroying would find.
    Check,
    /// Destroy the group and its keys.
    Destroy,
}

/// DestroyGroup.
pub(super) async fn destroy_group(
    admin: &Admin,
    caller: Option<&Caller>,
    request: &DestroyGroupRequest,
) -> Result<DestroyGroupResponse, Error> {
    let stream = admin.guard.stream(caller, "stream", &request.stream)?;
    admin.guard.name("group", &request.group)?;
    let group = request.group.as_str();
    let keys = match admin.redis.keys.shards(stream) {
        Some(shards) => shards,
        None => {
            // Sharded by other sidecars only: the logical name is no key here.
            admin.redis.refuse_sharded("stream", stream).await?;
            vec![stream.to_owned()]
        }
    };
    let not_found = || Error::NotFound { what: format!("group `{group}` of stream `{stream}`") };
    if keys.len() > 1 {
        // Every shard first, so a refusal leaves all of them as they were.
        let mut found = false;
        for key in &keys {
            match run(&admin.redis, key, group, request.force, Mode::Check).await? {
                Reply::Pending { pending } => return Err(has_pending(key, group, pending)),
                Reply::Missing { .. } => {}
                _ => found = true,
            }
        }
        if !found {
            return Err(not_found());
        }
    }
    let mut response =
        DestroyGroupResponse { stream: stream.to_owned(), group: group.to_owned(), ..Default::default() };
    let mut found = false;
    for key in &keys {
        match run(&admin.redis, key, group, request.force, Mode::Destroy).await? {
            Reply::Pending { pending } => return Err(has_pending(key, group, pending)),
            Reply::Missing { removed } => response.keys_removed += removed,
            Reply::Destroyed { pending, removed } => {
                found = true;
                response.pending_dropped += pending;
                response.keys_removed += removed;
            }
            Reply::Checked => {
                let wrong = unknown_tag("destroy_group.lua (destroying, not checking)", "checked");
                return Err(Error::from_redis(wrong, "destroying the group", key));
            }
        }
    }
    if !found {
        return Err(not_found());
    }
    tracing::info!(
        %stream,
        group,
        pending_dropped = response.pending_dropped,
        keys_removed = response.keys_removed,
        "destroyed the group and its keys (DestroyGroup)"
    );
    Ok(response)
}

/// FAILED_PRECONDITION: the group has `pending` entries on `key`, and the
/// request did not say `force`.
fn has_pending(key: &str, group: &str, pending: u64) -> Error {
    Error::Conflict {
        reason: format!(
            "group `{group}` of stream `{key}` has {pending} pending entries, which would be lost to it: settle them \
             first, or set `force` to destroy it anyway"
        ),
    }
}

/// Runs `destroy_group.lua` on the stream key `key`.
async fn run(redis: &Redis, key: &str, group: &str, force: bool, mode: Mode) -> Result<Reply, Error> {
    let mut script = redis.scripts.destroy_group.prepare_invoke();
    script.key(key);
    for own in redis.keys.group_keys(key, group) {
        script.key(own);
    }
    let check = matches!(mode, Mode::Check);
    script.arg(group).arg(if force { "1" } else { "0" }).arg(if check { "1" } else { "0" });
    let mut conn = redis.conn.clone();
    let reply: Value = script
        .invoke_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, "destroying the group (destroy_group.lua)", key))?;
    parse(&reply).map_err(|e| Error::from_redis(e, "reading destroy_group.lua's reply", key))
}

/// The script's reply, typed.
fn parse(reply: &Value) -> redis::RedisResult<Reply> {
    let parts = array(reply);
    let tag = parts.first().map(bytes).transpose()?.unwrap_or_default();
    let count = |at: usize| parts.get(at).map_or(Ok(0), int).map(|n| n.max(0) as u64);
    Ok(match tag.as_slice() {
        b"missing" => Reply::Missing { removed: count(1)? },
        b"pending" => Reply::Pending { pending: count(1)? },
        b"checked" => Reply::Checked,
        b"destroyed" => Reply::Destroyed { pending: count(1)?, removed: count(2)? },
        other => return Err(unknown_tag("destroy_group.lua", &String::from_utf8_lossy(other))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(tag: &str, counts: &[i64]) -> Value {
        let mut items = vec![Value::BulkString(tag.as_bytes().to_vec())];
        items.extend(counts.iter().map(|&n| Value::Int(n)));
        Value::Array(items)
    }

    #[test]
    fn every_reply_of_the_script_is_known_and_no_other() {
        assert_eq!(parse(&reply("missing", &[2])).unwrap(), Reply::Missing { removed: 2 });
        assert_eq!(parse(&reply("pending", &[3])).unwrap(), Reply::Pending { pending: 3 });
        assert_eq!(parse(&reply("checked", &[0])).unwrap(), Reply::Checked);
        assert_eq!(parse(&reply("destroyed", &[1, 2])).unwrap(), Reply::Destroyed { pending: 1, removed: 2 });
        assert!(parse(&reply("gone", &[])).is_err());
        let script = include_str!("../redis/lua/destroy_group.lua");
        let replied: Vec<&str> = script.match_indices("return { '").map(|(at, _)| &script[at + 10..]).collect();
        for rest in replied {
            let tag = &rest[..rest.find('\'').unwrap()];
            assert!(parse(&reply(tag, &[0, 0])).is_ok(), "the script replies `{tag}`, which the wrapper must know");
        }
    }
}
