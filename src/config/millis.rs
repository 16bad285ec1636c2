//! Durations given in milliseconds (`--*-ms` flags): parsed here, once, into
//! [`Duration`]s, so no reader of the configuration converts units again.
//! The number is read by clap's own integer parser, so a refused value says
//! what it did when the fields were plain `u64`s.

use std::{
    ops::{Bound, RangeBounds},
    time::Duration,
};

use clap::builder::{RangedU64ValueParser, TypedValueParser};

/// The longest any `--*-ms` setting may be: a year (ms). Past what any of
/// them means, and huge values started a sidecar whose every read failed
/// (`BLOCK 18446744073709551615`: Redis' "timeout is not an integer or out
/// of range") instead of being refused at start.
pub(super) const MOST_MS: u64 = 365 * 24 * 3_600 * 1_000;

/// Milliseconds within `range` (and at most [`MOST_MS`]), as a [`Duration`].
pub(super) fn within(range: impl RangeBounds<u64>) -> impl TypedValueParser<Value = Duration> {
    let start = match range.start_bound() {
        Bound::Included(&ms) => ms,
        Bound::Excluded(&ms) => ms.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&ms) => ms.min(MOST_MS),
        Bound::Excluded(&ms) => ms.saturating_sub(1).min(MOST_MS),
        Bound::Unbounded => MOST_MS,
    };
    RangedU64ValueParser::<u64>::new().range(start..=end).map(Duration::from_millis)
}

/// Milliseconds that are 0 (off, [`Duration::ZERO`]) or at least `MIN`:
/// below it, a heartbeat cannot keep up with the idle limit (live sidecars
/// would remove each other), or polling would keep Redis busy for no reader.
pub(super) fn off_or_at_least<const MIN: u64>(text: &str) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(ms) if ms > MOST_MS => Err(format!("{ms} ms is more than a year ({MOST_MS} ms), the longest setting taken")),
        Ok(ms) if ms == 0 || ms >= MIN => Ok(Duration::from_millis(ms)),
        Ok(ms) => Err(format!("{ms} ms is too short: give 0 (off) or at least {MIN} ms")),
        Err(_) => Err(format!("`{text}` is not a number of milliseconds")),
    }
}

/// `Some(duration)`, or `None` for a setting that 0 turns off.
pub(super) fn unless_off(duration: Duration) -> Option<Duration> {
    (!duration.is_zero()).then_some(duration)
}
