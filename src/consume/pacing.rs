//! When a group's worker may use Redis again after a failed command.
//!
//! One pause for the whole group: a Redis that just failed one step is not
//! asked again at once by another. Its length is the failed step's own
//! backoff, which doubles with each failure of that step (up to
//! [`BACKOFF_MAX`]) and starts over only when that same step succeeds: a
//! read that keeps failing backs off to five seconds even while recovery
//! pages, which ask less of Redis, still go through (with one shared
//! backoff, each good page reset it and the failing read was logged ~7 times
//! a second). Pure: the worker passes the clock in.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tokio::time::Instant;

/// The shortest time between two lines of one [`LogLimit`], sidecar-wide.
pub(super) const LOG_LINE_EVERY: Duration = Duration::from_secs(1);

/// Keeps the log readable through a Redis outage: each group's worker fails
/// each of its steps there (200 groups wrote 1,400 WARN lines over an 8 s
/// restart, burying the one that said Redis was down), and a Redis that
/// restarted empty has every group re-created at once. One line a second
/// per limit, sidecar-wide, is logged at its level, saying how many were
/// held back since the last line; the rest go to DEBUG. The metrics
/// (`echomq_redis_errors_total`, `echomq_group_recreations_total`) count
/// every one.
pub(crate) struct LogLimit {
    start: Instant,
    /// When the next line may be written, in ms since `start`.
    next_line_ms: AtomicU64,
    /// Lines logged at DEBUG since the last one let through.
    held_back: AtomicU64,
    /// The level of the lines let through.
    pub(super) level: LineLevel,
    /// What the lines are about, counted ("failed steps of group workers").
    what: &'static str,
    /// The metric that counts every one ("echomq_redis_errors_total counts each").
    counted_by: &'static str,
}

/// The level of the lines a [`LogLimit`] lets through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LineLevel {
    Warn,
    Info,
}

/// Logs `$line` (a `&str`) with tracing fields `$field…` through the
/// [`LogLimit`] `$limit`: at its level when it lets the line through, with
/// how many it held back since the last one; else at DEBUG.
macro_rules! log_limited {
    ($limit:expr, $line:expr; $($field:tt)*) => {{
        use $crate::consume::pacing::LineLevel;
        let limit: &$crate::consume::pacing::LogLimit = &$limit;
        let line: &str = $line;
        match (limit.line_now(tokio::time::Instant::now()), limit.level) {
            (Some(0), LineLevel::Warn) => tracing::warn!($($field)*, "{line}"),
            (Some(0), LineLevel::Info) => tracing::info!($($field)*, "{line}"),
            (Some(held_back), LineLevel::Warn) => {
                tracing::warn!($($field)*, held_back, "{line} (and {})", limit.held_back_note(held_back))
            }
            (Some(held_back), LineLevel::Info) => {
                tracing::info!($($field)*, held_back, "{line} (and {})", limit.held_back_note(held_back))
            }
            (None, _) => tracing::debug!($($field)*, "{line}"),
        }
    }};
}
pub(super) use log_limited;

impl LogLimit {
    /// A limit whose first line may be written at once (`now` is the start
    /// its clock counts from, in ms), for lines at `level` about `what`
    /// (plural), each of which the metric named in `counted_by` counts.
    pub(crate) fn new(now: Instant, level: LineLevel, what: &'static str, counted_by: &'static str) -> LogLimit {
        LogLimit { start: now, next_line_ms: AtomicU64::new(0), held_back: AtomicU64::new(0), level, what, counted_by }
    }

    /// "7 more failed steps … since the last such line, logged at DEBUG; … counts each":
    /// said after a line let through, and on its own once a burst is over.
    pub(super) fn held_back_note(&self, held_back: u64) -> String {
        let LogLimit { what, counted_by, .. } = self;
        format!("{held_back} more {what} since the last such line, logged at DEBUG; {counted_by}")
    }

    /// Logs, at the limit's level, the count of a burst's lines held back,
    /// once the burst is over (see [`LogLimit::overdue`]).
    pub(super) fn log_overdue(&self, now: Instant) {
        let Some(held_back) = self.overdue(now) else { return };
        let line = self.held_back_note(held_back);
        match self.level {
            LineLevel::Warn => tracing::warn!(held_back, "{line}"),
            LineLevel::Info => tracing::info!(held_back, "{line}"),
        }
    }

    /// Whether a line at `now` is let through: `Some(held back since the
    /// last one)`, or `None` (log it at DEBUG).
    pub(super) fn line_now(&self, now: Instant) -> Option<u64> {
        let at = now.saturating_duration_since(self.start).as_millis() as u64;
        let next = self.next_line_ms.load(Ordering::Relaxed);
        let every = LOG_LINE_EVERY.as_millis() as u64;
        if at >= next
            && self.next_line_ms.compare_exchange(next, at + every, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Lines held back that no line let through has counted yet, once one
    /// would be let through at `now`: `Some(count)`, for a line of their
    /// own (the clock moves on as for any line), else `None`. Without it a
    /// burst's count would wait for the next burst's first line.
    pub(super) fn overdue(&self, now: Instant) -> Option<u64> {
        if self.held_back.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let at = now.saturating_duration_since(self.start).as_millis() as u64;
        let next = self.next_line_ms.load(Ordering::Relaxed);
        let every = LOG_LINE_EVERY.as_millis() as u64;
        if at >= next
            && self.next_line_ms.compare_exchange(next, at + every, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            return Some(self.held_back.swap(0, Ordering::Relaxed)).filter(|&held_back| held_back > 0);
        }
        None
    }
}

/// The first pause after a step fails.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest pause, reached after six failures of one step in a row.
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// A Redis step of the worker, for logs, its own backoff, and the `operation`
/// label of `echomq_redis_errors_total{stream,group,operation}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    Read,
    Recover,
    Redeliver,
    Reclaim,
    RefreshLeases,
    Settle,
    DeadLetter,
    Release,
    RecreateGroup,
    Hygiene,
    AckEmit,
    KeyGate,
}

impl Step {
    /// Every step, so each one's error series exists from the start.
    pub(super) const ALL: [Step; 12] = [
        Step::Read,
        Step::Recover,
        Step::Redeliver,
        Step::Reclaim,
        Step::RefreshLeases,
        Step::Settle,
        Step::DeadLetter,
        Step::Release,
        Step::RecreateGroup,
        Step::Hygiene,
        Step::AckEmit,
        Step::KeyGate,
    ];

    /// The metric label: a short snake_case word.
    pub(super) fn label(self) -> &'static str {
        match self {
            Step::Read => "read",
            Step::Recover => "recover",
            Step::Redeliver => "redeliver",
            Step::Reclaim => "reclaim",
            Step::RefreshLeases => "refresh_leases",
            Step::Settle => "settle",
            Step::DeadLetter => "dead_letter",
            Step::Release => "release",
            Step::RecreateGroup => "recreate_group",
            Step::Hygiene => "hygiene",
            Step::AckEmit => "ack_emit",
            Step::KeyGate => "key_gate",
        }
    }

    /// What the log says failed.
    pub(super) fn doing(self) -> &'static str {
        match self {
            Step::Read => "reading new entries",
            Step::Recover => "recovering own pending entries",
            Step::Redeliver => "re-delivering pending entries",
            Step::Reclaim => "reclaiming idle entries",
            Step::RefreshLeases => "refreshing leases",
            Step::Settle => "acknowledging",
            Step::DeadLetter => "dead-lettering",
            Step::Release => "releasing entries to the group",
            Step::RecreateGroup => "re-creating the group",
            Step::Hygiene => "recording the heartbeat and removing dead consumers",
            Step::AckEmit => "acknowledging and emitting (AckEmit)",
            Step::KeyGate => "checking waiting entries' keys (the per-key gate)",
        }
    }
}

/// The group's pause and each step's next backoff.
#[derive(Debug)]
pub(super) struct Pacing {
    paused_until: Instant,
    /// Indexed by `Step as usize`: the pause after that step's next failure.
    backoffs: [Duration; Step::ALL.len()],
}

impl Pacing {
    /// Not paused; every step's backoff at [`BACKOFF_MIN`].
    pub(super) fn new(now: Instant) -> Pacing {
        Pacing { paused_until: now, backoffs: [BACKOFF_MIN; Step::ALL.len()] }
    }

    /// Whether Redis is to be left alone at `now`.
    pub(super) fn paused(&self, now: Instant) -> bool {
        now < self.paused_until
    }

    /// The end of the pause (in the past when there is none).
    pub(super) fn paused_until(&self) -> Instant {
        self.paused_until
    }

    /// `step` failed at `now`: the group pauses for the step's backoff (never
    /// shortening a longer pause already under way), which doubles for the
    /// step's next failure. Returns the pause this failure asked for.
    pub(super) fn failed(&mut self, step: Step, now: Instant) -> Duration {
        let backoff = &mut self.backoffs[step as usize];
        let pause = *backoff;
        *backoff = (pause * 2).min(BACKOFF_MAX);
        self.paused_until = self.paused_until.max(now + pause);
        pause
    }

    /// `step` succeeded: its own backoff starts over; other steps' do not.
    pub(super) fn succeeded(&mut self, step: Step) {
        self.backoffs[step as usize] = BACKOFF_MIN;
    }

    /// A new start (the primary switched): the pause ends at `now` and every
    /// backoff starts over, since what failed was the old primary.
    pub(super) fn restart(&mut self, now: Instant) {
        *self = Pacing::new(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failure_a_second_is_warned_and_says_how_many_were_held_back() {
        let start = Instant::now();
        let log = LogLimit::new(start, LineLevel::Warn, "failures", "a metric counts each");
        assert_eq!(log.line_now(start), Some(0), "the first failure is warned");
        for n in 1..=199 {
            assert_eq!(log.line_now(start + Duration::from_millis(n)), None, "failure {n} within the second");
        }
        assert_eq!(log.line_now(start + LOG_LINE_EVERY), Some(199), "the next second's first, with the count");
        assert_eq!(log.line_now(start + LOG_LINE_EVERY + Duration::from_millis(1)), None);
        assert_eq!(log.line_now(start + 5 * LOG_LINE_EVERY), Some(1), "after a quiet spell, at once");

        let log = LogLimit::new(start, LineLevel::Warn, "failures", "a metric counts each");
        assert_eq!(log.overdue(start), None, "nothing held back");
        assert_eq!(log.line_now(start), Some(0));
        assert_eq!(log.line_now(start + Duration::from_millis(10)), None);
        assert_eq!(log.line_now(start + Duration::from_millis(20)), None);
        assert_eq!(log.overdue(start + Duration::from_millis(500)), None, "within the second");
        assert_eq!(log.overdue(start + LOG_LINE_EVERY), Some(2), "the burst's count, once the second is over");
        assert_eq!(log.overdue(start + 3 * LOG_LINE_EVERY), None, "counted once");
        assert_eq!(log.line_now(start + 3 * LOG_LINE_EVERY), Some(0), "the next line starts afresh");
    }

    #[test]
    fn a_failing_step_backs_off_doubling_up_to_the_maximum() {
        let now = Instant::now();
        let mut pacing = Pacing::new(now);
        assert!(!pacing.paused(now));
        let pauses: Vec<u64> = (0..8).map(|_| pacing.failed(Step::Read, now).as_millis() as u64).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert!(pacing.paused(now + Duration::from_millis(4999)));
        assert!(!pacing.paused(now + BACKOFF_MAX));
    }

    #[test]
    fn another_step_succeeding_leaves_a_failing_steps_backoff_alone() {
        let now = Instant::now();
        let mut pacing = Pacing::new(now);
        for _ in 0..3 {
            pacing.failed(Step::Read, now);
            pacing.succeeded(Step::Recover);
        }
        assert_eq!(pacing.failed(Step::Read, now), Duration::from_millis(800));
        assert_eq!(pacing.failed(Step::Recover, now), BACKOFF_MIN, "each step has its own backoff");
    }

    #[test]
    fn a_step_succeeding_starts_its_own_backoff_over() {
        let now = Instant::now();
        let mut pacing = Pacing::new(now);
        pacing.failed(Step::Settle, now);
        pacing.failed(Step::Settle, now);
        pacing.succeeded(Step::Settle);
        assert_eq!(pacing.failed(Step::Settle, now), BACKOFF_MIN);
    }

    #[test]
    fn a_short_failure_does_not_cut_a_longer_pause() {
        let now = Instant::now();
        let mut pacing = Pacing::new(now);
        for _ in 0..4 {
            pacing.failed(Step::Read, now);
        }
        let long = pacing.paused_until();
        pacing.failed(Step::Hygiene, now);
        assert_eq!(pacing.paused_until(), long);
    }

    #[test]
    fn a_restart_ends_the_pause_and_every_backoff() {
        let now = Instant::now();
        let mut pacing = Pacing::new(now);
        for _ in 0..4 {
            pacing.failed(Step::Read, now);
        }
        pacing.restart(now);
        assert!(!pacing.paused(now));
        assert_eq!(pacing.failed(Step::Read, now), BACKOFF_MIN);
    }

    #[test]
    fn every_step_has_its_own_slot() {
        for (index, step) in Step::ALL.into_iter().enumerate() {
            assert_eq!(step as usize, index, "{step:?} is out of order in Step::ALL");
        }
    }
}
