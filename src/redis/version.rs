//! Which server the sidecar talks to, and whether it is new enough.
//!
//! Read once at start from `INFO server`: `redis_version`, and on Valkey also
//! `valkey_version` (Valkey reports `redis_version:7.2.4` for compatibility,
//! so its own version is the one to name). The floor is Redis 6.2, the first
//! with `XAUTOCLAIM`, `XGROUP CREATECONSUMER` and exclusive ranges (`(id`) in
//! `XPENDING`/`XRANGE`, which recovery, reclaim and the group door rely on.
//! Every Valkey release (7.2 on) speaks the 7.2 command set, so it is above
//! the floor; it is still compared by its `redis_version`.

use std::fmt;

use redis::Value;

/// The oldest Redis the sidecar works with.
pub const FLOOR: Version = Version { major: 6, minor: 2, patch: 0 };

/// A `major.minor.patch` server version; ordered numerically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// The major version.
    pub major: u32,
    /// The minor version.
    pub minor: u32,
    /// The patch level.
    pub patch: u32,
}

impl Version {
    /// Parses `6.2.5` (a missing part is 0; a suffix after a digit run, such
    /// as `-rc1`, is ignored). `None` when the first part is not a number.
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split('.').map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        let major = parts.next()??;
        let minor = parts.next().flatten().unwrap_or(0);
        let patch = parts.next().flatten().unwrap_or(0);
        Some(Version { major, minor, patch })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What `INFO server` says the server is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Server {
    /// `redis_version`: the Redis command set the server speaks; what the floor is checked against.
    pub redis: Version,
    /// `valkey_version`, on Valkey only: its own release.
    pub valkey: Option<Version>,
}

impl Server {
    /// Reads the versions from the text of `INFO server`. `None` when it has no
    /// parsable `redis_version`.
    pub fn from_info(info: &str) -> Option<Server> {
        let field = |name: &str| {
            info.lines().find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':')).and_then(Version::parse)
        };
        Some(Server { redis: field("redis_version")?, valkey: field("valkey_version") })
    }

    /// Whether the server speaks every command the sidecar uses.
    pub fn meets_floor(&self) -> bool {
        self.redis >= FLOOR
    }

    /// Whether XCLAIM and XAUTOCLAIM drop an entry deleted from the stream
    /// from the PEL and leave it out of their reply (Redis 7.0 on, and every
    /// Valkey). Redis 6.2 claims it as if it were there (JUSTID returns its
    /// id), so only a look at the stream tells it was deleted.
    pub fn claims_drop_deleted(&self) -> bool {
        self.redis >= Version { major: 7, minor: 0, patch: 0 }
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.valkey {
            Some(valkey) => write!(f, "Valkey {valkey} (redis_version {})", self.redis),
            None => write!(f, "Redis {}", self.redis),
        }
    }
}

/// The servers an `INFO server` reply describes: one text from a single
/// server; from a cluster connection, one per primary (a map of node to
/// text). Replies that do not parse are left out.
pub fn servers_in(reply: &Value) -> Vec<Server> {
    match reply {
        Value::BulkString(bytes) => Server::from_info(&String::from_utf8_lossy(bytes)).into_iter().collect(),
        Value::SimpleString(text) => Server::from_info(text).into_iter().collect(),
        Value::VerbatimString { text, .. } => Server::from_info(text).into_iter().collect(),
        Value::Map(pairs) => pairs.iter().flat_map(|(_, value)| servers_in(value)).collect(),
        Value::Array(values) => values.iter().flat_map(servers_in).collect(),
        _ => Vec::new(),
    }
}

/// Why the sidecar will not run on this server.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    /// The server is older than [`FLOOR`].
    #[error(
        "the Redis server is {found}, older than the Redis {FLOOR} this sidecar needs (XAUTOCLAIM, XGROUP \
         CREATECONSUMER, exclusive ranges): upgrade the server to Redis {FLOOR} or newer, or Valkey"
    )]
    TooOld {
        /// What the server said it is.
        found: Server,
    },
    /// `INFO server` has no `redis_version` the sidecar can read.
    #[error("the Redis server's INFO server reply has no readable redis_version; cannot tell whether it is {FLOOR} or newer")]
    Unknown,
    /// Redis refused `INFO server` (an ACL without `+info`, say).
    #[error("asking the Redis server its version (INFO server) failed: {0}")]
    Redis(redis::RedisError),
}

#[cfg(test)]
mod tests {
    use super::*;

    const REDIS_7_0: &str = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\n";
    const VALKEY_9_1: &str = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";

    #[test]
    fn versions_parse_and_order_numerically() {
        assert_eq!(Version::parse("6.2.5"), Some(Version { major: 6, minor: 2, patch: 5 }));
        assert_eq!(Version::parse("7.2"), Some(Version { major: 7, minor: 2, patch: 0 }));
        assert_eq!(Version::parse("8.0.0-rc1"), Some(Version { major: 8, minor: 0, patch: 0 }));
        assert_eq!(Version::parse("x.1"), None);
        assert!(Version::parse("6.10.0") > Version::parse("6.2.9"));
        assert!(Version::parse("10.0.0") > Version::parse("9.9.9"));
    }

    #[test]
    fn info_server_gives_the_redis_and_the_valkey_version() {
        let redis = Server::from_info(REDIS_7_0).unwrap();
        assert_eq!((redis.redis.to_string(), redis.valkey), ("7.0.15".to_owned(), None));
        assert_eq!(redis.to_string(), "Redis 7.0.15");
        let valkey = Server::from_info(VALKEY_9_1).unwrap();
        assert_eq!(valkey.valkey, Version::parse("9.1.2"));
        assert_eq!(valkey.to_string(), "Valkey 9.1.2 (redis_version 7.2.4)");
        assert_eq!(Server::from_info("# Server\r\nredis_mode:standalone\r\n"), None);
    }

    #[test]
    fn the_floor_is_redis_6_2() {
        let at = |v: &str| Server { redis: Version::parse(v).unwrap(), valkey: None }.meets_floor();
        assert!(!at("5.0.6"));
        assert!(!at("6.0.16"));
        assert!(at("6.2.0"));
        assert!(at("6.2.5"));
        assert!(at("7.0.15"));
        assert!(at("8.2.3"));
    }

    #[test]
    fn claims_drop_deleted_entries_from_redis_7_0_and_on_valkey() {
        let server = |info: &str| Server::from_info(info).unwrap().claims_drop_deleted();
        assert!(!server("redis_version:6.2.5\r\n"));
        assert!(server(REDIS_7_0));
        assert!(server(VALKEY_9_1));
    }

    #[test]
    fn too_old_names_the_version_found_and_the_one_needed() {
        let found = Server::from_info("redis_version:5.0.6\r\n").unwrap();
        let message = VersionError::TooOld { found }.to_string();
        assert!(message.contains("Redis 5.0.6") && message.contains("Redis 6.2.0"), "{message}");
    }

    #[test]
    fn a_cluster_reply_gives_one_server_per_node() {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply =
            Value::Map(vec![(text("127.0.0.1:7000"), text(REDIS_7_0)), (text("127.0.0.1:7001"), text(VALKEY_9_1))]);
        assert_eq!(servers_in(&reply).len(), 2);
        assert_eq!(servers_in(&text(REDIS_7_0)).len(), 1);
    }
}
