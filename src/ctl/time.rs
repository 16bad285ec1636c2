//! Instants and durations, without a date library: RFC 3339 in and out (UTC
//! out), unix milliseconds, "that long ago", and human durations for tables.

use echomq::config::parse_duration;
use std::time::{SystemTime, UNIX_EPOCH};

/// What an instant flag accepts, for `--help`.
pub(crate) const INSTANT_FORMS: &str =
    "an RFC 3339 instant (`2026-12-02T08:30:00Z`, `2026-12-02T09:30:00.250+01:00`), unix milliseconds \
     (`1796200000000`), or a duration before now (`90s`, `15m`, `2h`, `1d`)";

/// Unix milliseconds now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Parses an instant (see [`INSTANT_FORMS`]) into unix milliseconds.
pub(crate) fn parse_instant(text: &str) -> Result<u64, String> {
    parse_instant_at(text, now_ms())
}

/// Parses a future instant for a schedule (`append --at`): RFC 3339 or unix
/// milliseconds, not a duration, which [`parse_instant`] reads as "that long
/// ago" and would append at once: `--in` takes a duration.
pub(crate) fn parse_schedule_instant(text: &str) -> Result<u64, String> {
    if parse_duration(text.trim()).is_some() {
        return Err(format!(
            "`{text}` is a duration: --at takes an instant (RFC 3339, e.g. `2026-12-07T09:00:00+01:00`, or unix \
             milliseconds); to schedule this long from now, use --in {}",
            text.trim()
        ));
    }
    parse_instant(text)
}

fn parse_instant_at(text: &str, now: u64) -> Result<u64, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map_err(|_| format!("`{text}`: too many milliseconds"));
    }
    if let Some(ago) = parse_duration(text) {
        return Ok(now.saturating_sub(ago.as_millis() as u64));
    }
    parse_rfc3339(text).ok_or_else(|| format!("`{text}` is not an instant: expected {INSTANT_FORMS}"))
}

/// `YYYY-MM-DDTHH:MM:SS[.fff…](Z|±HH:MM)`; a space or `t` may stand for `T`.
fn parse_rfc3339(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.find(|c: char| !c.is_ascii_digit()).unwrap_or(fraction.len());
        if digits == 0 {
            return None;
        }
        let first3: String = fraction[..digits].chars().chain("000".chars()).take(3).collect();
        millis = first3.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(&rest[..1], "+" | "-") && &rest[3..4] == ":" => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            let (h, m): (i64, i64) = (rest[1..3].parse().ok()?, rest[4..6].parse().ok()?);
            sign * (h * 60 + m)
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    u64::try_from(seconds * 1_000 + millis).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a count of days since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Unix milliseconds as RFC 3339 in UTC, to the millisecond: `2026-12-02T08:30:00.250Z`.
pub(crate) fn format_instant(ms: u64) -> String {
    let ms = ms as i64;
    let (days, in_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    let (h, m, s, milli) = (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1_000 % 60, in_day % 1_000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// A duration for people: `0ms`, `450ms`, `3.2s`, `4m 5s`, `2h 3m`, `3d 4h`.
pub(crate) fn format_duration(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{}.{}s", ms / 1_000, ms % 1_000 / 100),
        60_000..=3_599_999 => format!("{}m {}s", ms / 60_000, ms / 1_000 % 60),
        3_600_000..=86_399_999 => format!("{}h {}m", ms / 3_600_000, ms / 60_000 % 60),
        _ => format!("{}d {}h", ms / 86_400_000, ms / 3_600_000 % 24),
    }
}

/// A protobuf duration in milliseconds (negative ones as 0).
pub(crate) fn duration_ms(d: &prost_types::Duration) -> u64 {
    (d.seconds.max(0) as u64).saturating_mul(1_000).saturating_add((d.nanos.max(0) / 1_000_000) as u64)
}

/// A protobuf timestamp in unix milliseconds (before the epoch as 0).
pub(crate) fn timestamp_ms(t: &prost_types::Timestamp) -> u64 {
    (t.seconds.max(0) as u64).saturating_mul(1_000).saturating_add((t.nanos.max(0) / 1_000_000) as u64)
}

/// Unix milliseconds as a protobuf timestamp.
pub(crate) fn timestamp_of_ms(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: (ms / 1_000) as i64, nanos: ((ms % 1_000) * 1_000_000) as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_through_unix_milliseconds() {
        let ms = parse_instant_at("2026-12-02T08:30:00.250Z", 0).unwrap();
        assert_eq!(ms, 1_796_200_200_250);
        assert_eq!(format_instant(ms), "2026-12-02T08:30:00.250Z");
        assert_eq!(parse_instant_at("2026-12-02T09:30:00.25+01:00", 0).unwrap(), ms);
        assert_eq!(parse_instant_at("1970-01-01T00:00:00Z", 0).unwrap(), 0);
        assert_eq!(format_instant(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn milliseconds_and_durations_ago_are_instants() {
        assert_eq!(parse_instant_at("1796200200250", 0).unwrap(), 1_796_200_200_250);
        assert_eq!(parse_instant_at("15m", 1_000_000).unwrap(), 100_000);
        assert_eq!(parse_instant_at("1d", 10).unwrap(), 0, "before the epoch is the epoch");
        for bad in ["", "yesterday", "2026-13-01T00:00:00Z", "2026-12-02T08:30:00", "5x", "2026-12-02T08:30:00.Z"] {
            assert!(parse_instant_at(bad, 0).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_schedule_instant_is_no_duration() {
        let refused = parse_schedule_instant("10m").unwrap_err();
        assert!(refused.contains("--in 10m"), "{refused}");
        assert_eq!(parse_schedule_instant("1796200200250").unwrap(), 1_796_200_200_250);
        assert_eq!(parse_schedule_instant("2026-12-02T08:30:00.250Z").unwrap(), 1_796_200_200_250);
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(format_duration(0), "0ms");
        assert_eq!(format_duration(3_250), "3.2s");
        assert_eq!(format_duration(245_000), "4m 5s");
        assert_eq!(format_duration(7_380_000), "2h 3m");
        assert_eq!(format_duration(273_600_000), "3d 4h");
    }
}
