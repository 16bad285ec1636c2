//! Retention policies (`--retention`): every `--retention-interval-ms`, each
//! policy's stream keys (a sharded stream's shards one by one) are trimmed to
//! what the policy keeps, in the safe mode (never past an entry a group still
//! needs) and, with an archive, folded first: the same path as a Trim call.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

use crate::{
    config::{Keep, Retention},
    entry::now_unix_ms,
    error::Error,
    id::StreamId,
    redis::{
        trim::{Bound, Trim},
        Redis,
    },
    stream::{
        fold::{Asked, Folding},
        trim::trim_stream,
    },
};

/// Applies `policies` every `interval` until `stopping` turns true. A failed
/// round is logged (with the archive's, also counted and described) and the
/// next round tries again; another sidecar folding the same stream at the
/// moment is not a failure.
pub async fn run(
    redis: Redis,
    folding: Option<Arc<Folding>>,
    policies: Vec<Retention>,
    interval: Duration,
    mut stopping: watch::Receiver<bool>,
) {
    if policies.is_empty() {
        return;
    }
    for policy in &policies {
        tracing::info!(stream = %policy.stream, keep = ?policy.keep, interval_ms = interval.as_millis() as u64, archived = folding.is_some(), "retention policy");
    }
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopping.wait_for(|stop| *stop) => return,
        }
        for policy in &policies {
            let keys = redis.keys.shards(&policy.stream).unwrap_or_else(|| vec![policy.stream.clone()]);
            for key in keys {
                let trim = Trim { bound: bound(policy.keep, now_unix_ms()), approximate: false, safe: true };
                match trim_stream(&redis, folding.as_deref(), &key, &trim, Asked::ByRetention).await {
                    Ok((trimmed, archived)) if trimmed.trimmed > 0 || archived > 0 => {
                        tracing::info!(stream = %key, trimmed = trimmed.trimmed, archived, "retention applied");
                    }
                    // A failed fold was logged, counted and described where it failed.
                    Ok(_) | Err(Error::Aborted { .. }) => {}
                    Err(error) if folding.as_deref().is_some_and(|f| f.last_error(&key).is_some()) => {
                        tracing::debug!(stream = %key, %error, "retention could not be applied; retrying next round")
                    }
                    Err(error) => {
                        tracing::warn!(stream = %key, %error, "retention could not be applied; retrying next round")
                    }
                }
            }
        }
    }
}

/// The trim bound of `keep` at `now_ms` (unix ms).
fn bound(keep: Keep, now_ms: u64) -> Bound {
    match keep {
        Keep::Newest(n) => Bound::KeepNewest(n),
        Keep::Within(age) => Bound::Below(StreamId {
            ms: now_ms.saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
            seq: 0,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_age_keeps_what_was_appended_since_that_instant() {
        assert_eq!(bound(Keep::Within(Duration::from_secs(2)), 10_000), Bound::Below(StreamId { ms: 8_000, seq: 0 }));
        assert_eq!(bound(Keep::Within(Duration::from_secs(20)), 10_000), Bound::Below(StreamId::ZERO));
        assert_eq!(bound(Keep::Newest(5), 10_000), Bound::KeepNewest(5));
    }
}
