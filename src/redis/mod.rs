//! Redis connections, the server-side scripts, and stream reply parsing.
//!
//! Two kinds of connection, to a single Redis server or to a Redis Cluster:
//! - one shared, multiplexed connection (it reconnects by itself; on a cluster
//!   it follows MOVED/ASK and topology changes) for every non-blocking command,
//!   with a response timeout (`--redis-timeout-ms`); on a single server, a
//!   command that gets no reply in time retires the connection ([`shared`]);
//! - the readers' connections, from a bounded pool, [`readers`]. With shared
//!   readers (a single server, `--shared-readers auto|on`), a few that each
//!   read takes for one `XREADGROUP` without `BLOCK`, plus one wake connection
//!   per sidecar ([`wake`]) that Redis tells when a stream read changed
//!   (`CLIENT TRACKING`). With blocking readers (`off`, a cluster), one
//!   dedicated connection per group reader for `XREADGROUP … BLOCK`, whose
//!   response timeout is the BLOCK time plus `--redis-timeout-ms`, so a
//!   blocking read never holds up other commands, is never cut short while
//!   Redis is handing entries to it, and still ends when Redis has gone
//!   silent; on a cluster it is a cluster connection of its own, routed to
//!   the node that owns the stream's slot.
//!
//! Every socket to Redis has TCP keepalive on ([`TCP_KEEPALIVE_IDLE`]), so an
//! idle connection to a peer that vanished (a host gone, a partition that
//! drops packets) fails within about 25 s instead of the kernel's two hours.
//!
//! What that bounds (`docs/src/operations.md`, "When Redis goes silent"):
//! a black-holed or stalled Redis turns readiness NOT_SERVING within one
//! readiness interval (1 s) plus `--redis-timeout-ms`; a blocked reader gives
//! up within `--read-block-ms` plus `--redis-timeout-ms` and reconnects.
//!
//! One file per job: [`connect`] (the handles and connections), [`timed`]
//! (every command's latency, and its series), [`scripts`] (the Lua scripts), [`reply`] (parsing replies), [`shards`] (sharded
//! streams' shard counts), [`trim`] (`trim.lua`'s wrapper); the connections'
//! own: [`primary`], [`credentials`] (the password file, read again), [`shared`],
//! [`readers`], [`resp`], [`wake`]; and what the services
//! share, below them: [`fault`](mod@fault) (a Redis error's kind, decided
//! once), [`group`] (a group's state), [`range`] (range paging), [`version`]
//! (the server's).

pub mod connect;
pub mod credentials;
pub mod fault;
pub mod group;
pub mod primary;
pub mod range;
pub mod readers;
pub mod reply;
pub mod resp;
pub mod scripts;
pub mod shards;
pub mod shared;
pub mod timed;
pub mod trim;
pub mod version;
pub mod wake;

use connect::tcp_keepalive;
pub use connect::{
    ConnectOptions, Connection, DedicatedConnection, Redis, RedisMetrics, TCP_KEEPALIVE_IDLE, TCP_KEEPALIVE_INTERVAL,
    TCP_KEEPALIVE_RETRIES,
};
pub use fault::{fault, Fault};
pub use reply::{
    array, bytes, int, parse_entries, parse_entry, parse_read_reply, parse_stream_id, parse_unread_trimmed, tagged,
    unknown_tag, RawEntry, UnreadTrimmed,
};
pub use scripts::{Scripts, LUA_PRELUDE};
pub use shards::ShardCountError;
pub use shared::SharedConnection;
pub use timed::TimedConnection;
