//! A ScaledObject trigger's metadata (`ScaledObjectRef.scalerMetadata`): what
//! to measure and the target per replica. Pure: names are checked against the
//! allow-list and the limits by the caller, which knows who asks.

use std::collections::HashMap;

use crate::error::Error;

/// The target per replica when the trigger's metadata gives none (entries).
pub const DEFAULT_BACKLOG_PER_REPLICA: u64 = 1;

/// One trigger's subject: a group of a stream, and how much backlog one
/// replica of the scaled Deployment should take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Trigger {
    /// The stream key, or the name of a sharded stream this sidecar shards.
    pub(crate) stream: String,
    /// The consumer group.
    pub(crate) group: String,
    /// Backlog entries per replica (at least 1): the HPA's target average value.
    pub(crate) backlog_per_replica: u64,
}

impl Trigger {
    /// Reads `stream`, `group` and `backlogPerReplica`; other keys (KEDA
    /// passes the whole trigger, `scalerAddress` too) are ignored.
    ///
    /// Errors: [`Error::InvalidArgument`] naming the key, for a missing
    /// `stream` or `group`, or a `backlogPerReplica` that is not a whole
    /// number of at least 1.
    pub(crate) fn parse(metadata: &HashMap<String, String>) -> Result<Trigger, Error> {
        let required = |key: &'static str, field: &'static str, what: &str| match metadata.get(key) {
            Some(value) if !value.is_empty() => Ok(value.clone()),
            _ => Err(Error::invalid(field, format!("required: set `{key}` in the trigger's metadata to {what}"))),
        };
        let stream = required("stream", "scalerMetadata.stream", "the stream whose group's backlog scales the target")?;
        let group = required("group", "scalerMetadata.group", "the consumer group the scaled Deployment consumes in")?;
        let backlog_per_replica = match metadata.get("backlogPerReplica").map(String::as_str) {
            None => DEFAULT_BACKLOG_PER_REPLICA,
            Some(text) => backlog_per_replica(text)?,
        };
        Ok(Trigger { stream, group, backlog_per_replica })
    }

    /// The metric's name: `echomq-<stream>-<group>`, lowercase, every
    /// character other than `a-z`, `0-9` and `-` as `-` (KEDA prefixes it
    /// with the trigger's index, and the HPA wants a plain name).
    pub(crate) fn metric_name(&self) -> String {
        format!("echomq-{}-{}", self.stream, self.group)
            .chars()
            .map(|c| match c.to_ascii_lowercase() {
                c @ ('a'..='z' | '0'..='9' | '-') => c,
                _ => '-',
            })
            .collect()
    }
}

/// `backlogPerReplica`'s value: digits only (no sign, no blanks), from 1 to
/// `i64::MAX`, the largest target KEDA's `targetSize` (an int64) holds, so the
/// spec's `targetSize` and `targetSizeFloat` always agree.
fn backlog_per_replica(text: &str) -> Result<u64, Error> {
    let field = "scalerMetadata.backlogPerReplica";
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::invalid(
            field,
            format!("`{text}` is not a whole number: give the backlog entries one replica should take, e.g. `100`"),
        ));
    }
    match text.parse::<i64>() {
        Ok(0) => Err(Error::invalid(field, "must be at least 1: the backlog entries one replica should take")),
        Ok(n) => Ok(n as u64),
        Err(_) => Err(Error::invalid(field, format!("`{text}` is too large: at most {}", i64::MAX))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Trigger, Error> {
        Trigger::parse(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    #[test]
    fn stream_group_and_target_are_read_and_other_keys_ignored() {
        let trigger =
            parse(&[("stream", "orders"), ("group", "billing"), ("backlogPerReplica", "50"), ("scalerAddress", "x:1")]);
        assert_eq!(
            trigger.unwrap(),
            Trigger { stream: "orders".into(), group: "billing".into(), backlog_per_replica: 50 }
        );
        let default = parse(&[("stream", "orders"), ("group", "billing")]).unwrap();
        assert_eq!(default.backlog_per_replica, DEFAULT_BACKLOG_PER_REPLICA);
    }

    #[test]
    fn bad_metadata_names_the_key_and_what_to_give() {
        let message = |pairs: &[(&str, &str)]| parse(pairs).unwrap_err().to_string();
        assert!(message(&[("group", "g")]).starts_with("scalerMetadata.stream: required"));
        assert!(message(&[("stream", "s"), ("group", "")]).starts_with("scalerMetadata.group: required"));
        let zero = message(&[("stream", "s"), ("group", "g"), ("backlogPerReplica", "0")]);
        assert!(zero.contains("backlogPerReplica: must be at least 1"), "{zero}");
        for bad in ["ten", "-3", "1.5", "", " 5", "+5"] {
            let text = message(&[("stream", "s"), ("group", "g"), ("backlogPerReplica", bad)]);
            assert!(text.contains(&format!("`{bad}` is not a whole number")), "{text}");
        }
        for huge in ["9223372036854775808", "99999999999999999999"] {
            let text = message(&[("stream", "s"), ("group", "g"), ("backlogPerReplica", huge)]);
            assert!(text.contains("is too large: at most 9223372036854775807"), "{text}");
        }
        let largest = parse(&[("stream", "s"), ("group", "g"), ("backlogPerReplica", "9223372036854775807")]);
        assert_eq!(largest.unwrap().backlog_per_replica, i64::MAX as u64);
    }

    #[test]
    fn metric_names_are_plain() {
        let trigger = Trigger { stream: "{Orders}:EU".into(), group: "billing_v2".into(), backlog_per_replica: 1 };
        assert_eq!(trigger.metric_name(), "echomq--orders--eu-billing-v2");
    }
}
