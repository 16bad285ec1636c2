//! The rules written on both sides, Rust and Lua (`src/redis/lua/prelude.lua`),
//! agree: the prelude's functions are run in a real Redis and compared with
//! the Rust functions they mirror.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use echomq::{
    id::{BrandedId, StreamId},
    keys::is_recorded_count,
    redis::LUA_PRELUDE,
};
use redis::aio::MultiplexedConnection;
use support::*;

/// Runs `expression` (Lua, with `ARGV[1]` as its argument) after the prelude.
async fn lua(conn: &mut MultiplexedConnection, expression: &str, arg: &str) -> redis::Value {
    let script = format!("{LUA_PRELUDE}\nreturn {expression}");
    redis::cmd("EVAL").arg(script).arg(0).arg(arg).query_async(conn).await.unwrap()
}

fn text(value: redis::Value) -> String {
    match value {
        redis::Value::BulkString(bytes) => String::from_utf8(bytes).unwrap(),
        other => panic!("not a string: {other:?}"),
    }
}

fn truth(value: redis::Value) -> bool {
    match value {
        redis::Value::Int(1) => true,
        redis::Value::Nil => false,
        other => panic!("not a boolean: {other:?}"),
    }
}

#[tokio::test]
async fn lua_derives_the_branded_id_of_a_stream_id_as_rust_does() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let ids = [
        StreamId { ms: 0, seq: 0 },
        StreamId { ms: 1, seq: 1 },
        StreamId { ms: 1_718_000_000_000, seq: 3 },
        StreamId { ms: (1 << 48) - 1, seq: u64::MAX },
        StreamId { ms: 5, seq: (1 << 53) + 1 },
        StreamId { ms: 123_456_789, seq: 18_446_744_073_709_551_000 },
    ];
    for id in ids {
        let rust = BrandedId::from_stream_id(id).unwrap().to_string();
        let derived = text(lua(&mut conn, "branded_of_stream_id(ARGV[1])", &id.to_string()).await);
        assert_eq!(derived, rust, "stream id {id}");
        if id.seq < 1 << 53 {
            let minted = text(
                lua(
                    &mut conn,
                    "branded_text(tonumber(ARGV[1]:match('^(%d+)')), tonumber(ARGV[1]:match('(%d+)$')))",
                    &id.to_string(),
                )
                .await,
            );
            assert_eq!(minted, rust, "minted {id}");
        }
    }
}

#[tokio::test]
async fn lua_and_rust_agree_on_what_a_branded_id_text_is() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let cases = [
        "0000000000010000000000000000",
        "01a226cb299d0000000000000000",
        "ffffffffffffffffffffffffffff",
        "01A226CB299D0000000000000000",
        "0000000000010000000000000000a",
        "000000000001000000000000000",
        "0000000000010000000000000g00",
        "",
        "order-42",
    ];
    for case in cases {
        let lua_says = truth(lua(&mut conn, "is_branded_text(ARGV[1]) and 1 or nil", case).await);
        assert_eq!(lua_says, case.parse::<BrandedId>().is_ok(), "`{case}`");
    }
}

#[tokio::test]
async fn lua_and_rust_agree_on_what_a_recorded_shard_count_is() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let cases = ["1", "2", "16", "999", "1024", "1025", "0", "01", "-1", "+4", "4 ", "1e3", "", "abc", "10000"];
    for case in cases {
        let lua_says = truth(lua(&mut conn, "is_recorded_count(ARGV[1]) and 1 or nil", case).await);
        assert_eq!(lua_says, is_recorded_count(case), "`{case}`");
    }
}

#[tokio::test]
async fn lua_and_rust_agree_on_the_last_millisecond_a_branded_id_holds() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let lua_max = lua(&mut conn, "string.format('%d', MAX_BRANDED_MS)", "").await;
    assert_eq!(text(lua_max), echomq::id::MAX_BRANDED_MS.to_string());
}

/// `next_stream_id`, shared by Append and AckEmit: Redis time on a new stream;
/// after a last id that is not older, the same millisecond and the next
/// sequence number of the shard's stride (k modulo n).
#[tokio::test]
async fn next_stream_id_follows_the_last_id_in_the_shards_stride() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let mint = |stream: &str, shard: u32, shards: u32| {
        format!(
            "(function() local ms, seq = next_stream_id('{stream}', {shard}, {shards}); return ms .. '-' .. seq end)()"
        )
    };
    let fresh = text(lua(&mut conn, &mint("fresh", 0, 1), "").await);
    let (ms, seq) = fresh.split_once('-').unwrap();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    assert!(ms.parse::<u64>().unwrap().abs_diff(now_ms) < 5_000, "Redis time: {fresh}");
    assert_eq!(seq, "0");
    let future = now_ms + 3_600_000;
    xadd_raw_at(&mut conn, "ahead", &format!("{future}-5"), &[(b"k", b"v")]).await;
    assert_eq!(text(lua(&mut conn, &mint("ahead", 0, 1), "").await), format!("{future}-6"));
    assert_eq!(text(lua(&mut conn, &mint("ahead", 1, 4), "").await), format!("{future}-9"), "6..9: 9 is 1 mod 4");
    assert_eq!(text(lua(&mut conn, &mint("ahead", 2, 4), "").await), format!("{future}-6"));
}
