//! What a write must be confirmed by before its caller is answered, and how
//! a confirmation fell short: plain values, shared by the durable writer
//! ([`crate::durable`]) that waits and the error ([`crate::error::Error`])
//! that reports the shortfall, below both so neither imports the other.

use std::{fmt, time::Duration};

use redis::Cmd;

/// What a write must be confirmed by before its caller is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Durability {
    /// Replicas that must acknowledge the write (`WAIT replicas …`); 0: none.
    pub replicas: u32,
    /// Also fsynced to the primary's append-only file and to `replicas`
    /// replicas' (`WAITAOF 1 replicas …`, Redis 7.2 on and Valkey) instead of
    /// `WAIT`.
    pub aof: bool,
    /// How long a write may wait for them (`--wait-timeout-ms`).
    pub timeout: Duration,
}

impl Durability {
    /// Whether writes wait at all: some replicas, or the AOF.
    pub fn is_on(&self) -> bool {
        self.replicas > 0 || self.aof
    }

    /// `WAIT replicas ms`, or `WAITAOF 1 replicas ms`.
    pub(crate) fn command(&self) -> Cmd {
        let ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX).max(1);
        if self.aof {
            let mut cmd = redis::cmd("WAITAOF");
            cmd.arg(1).arg(self.replicas).arg(ms);
            cmd
        } else {
            let mut cmd = redis::cmd("WAIT");
            cmd.arg(self.replicas).arg(ms);
            cmd
        }
    }
}

/// How a `WAIT` (`WAITAOF`) fell short of [`Durability`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    /// What was asked.
    pub durability: Durability,
    /// Replicas that confirmed (`WAIT`'s reply, `WAITAOF`'s second number).
    pub confirmed: i64,
    /// With `--wait-aof`: whether the primary's own AOF fsync was confirmed.
    pub local_aof: Option<bool>,
    /// Replicas connected to the primary then (`INFO replication`,
    /// `connected_slaves`), when it would say.
    pub connected: Option<u64>,
    /// The error `WAIT` (`WAITAOF`) itself answered, if it did.
    pub error: Option<String>,
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Durability { replicas, aof, timeout } = self.durability;
        let ms = timeout.as_millis();
        if let Some(error) = &self.error {
            let command = if aof { "WAITAOF" } else { "WAIT" };
            return write!(f, "{command} failed: {error}");
        }
        if aof {
            if self.local_aof == Some(false) {
                write!(f, "the primary did not fsync it to its append-only file within {ms} ms (WAITAOF)")?;
            } else {
                write!(
                    f,
                    "only {} of {replicas} replicas fsynced it to their append-only files within {ms} ms (WAITAOF)",
                    self.confirmed
                )?;
            }
        } else {
            write!(f, "only {} of {replicas} replicas confirmed it within {ms} ms (WAIT)", self.confirmed)?;
        }
        if let Some(connected) = self.connected {
            let s = if connected == 1 { "" } else { "s" };
            write!(f, "; the primary has {connected} connected replica{s}")?;
        }
        Ok(())
    }
}
