//! Durations given in milliseconds (`--*-ms` flags): parsed here, once, into
//! [`Duration`]s, so no reader of the configuration converts units again.
//! The number is read by clap's own integer parser, so a refused value says
//! what it did when the fields were plain `u64`s.

use std::{ops::RangeBounds, time::Duration};

use clap::builder::{RangedU64ValueParser, TypedValueParser};

/// Milliseconds within `range`, as a [`Duration`].
pub(super) fn within(range: impl RangeBounds<u64>) -> impl TypedValueParser<Value = Duration> {
    RangedU64ValueParser::<u64>::new().range(range).map(Duration::from_millis)
}

/// Milliseconds that are 0 (off, [`Duration::ZERO`]) or at least `MIN`:
/// below it, a heartbeat cannot keep up with the idle limit (live sidecars
/// would remove each other), or polling would keep Redis busy for no reader.
pub(super) fn off_or_at_least<const MIN: u64>(text: &str) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(ms) if ms == 0 || ms >= MIN => Ok(Duration::from_millis(ms)),
        Ok(ms) => Err(format!("{ms} ms is too short: give 0 (off) or at least {MIN} ms")),
        Err(_) => Err(format!("`{text}` is not a number of milliseconds")),
    }
}

/// `Some(duration)`, or `None` for a setting that 0 turns off.
pub(super) fn unless_off(duration: Duration) -> Option<Duration> {
    (!duration.is_zero()).then_some(duration)
}
