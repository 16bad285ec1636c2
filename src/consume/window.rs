//! The credit of a call that set no `max_in_flight`: a window that grows
//! while the client keeps up and shrinks when it falls behind, between
//! [`WINDOW_MIN`] and the call's cap (`--default-max-in-flight`).
//!
//! The signal is the time from a delivery to its verdict, which the ledger
//! sees anyway. It is judged against the base: the fastest verdict seen when
//! nothing queued in the client. While the window is what limits the call
//! (its credit ran out), and a window's worth of verdicts came back little
//! slower than the base (at most twice it plus [`QUEUE_SLACK`]), the client
//! has room: the window doubles. When they come back much slower (over four
//! times it plus four slacks), deliveries wait in the client's queue rather
//! than in Redis, where another consumer could take them: it shrinks by a
//! quarter. In between it holds. This is TCP Vegas' rule (queueing shows as
//! delay before loss), as Netflix' concurrency-limits applies it to servers.
//!
//! The base can only be measured without a queue: the fastest verdict of a
//! full window includes the wait behind the entries before it. So every
//! [`REBASE`] the window probes, as BBR's ProbeRTT does: it drops to
//! [`WINDOW_MIN`] until a probe's worth of deliveries made after the drop
//! came back, takes their fastest as the new base, and returns to the size
//! it had. A handler that became slower for good is then judged by its new
//! speed, and one that fell behind cannot pass its queue off as its speed.
//!
//! A call that sets `max_in_flight` gets exactly that, fixed.

use std::time::Duration;

use tokio::time::Instant;

/// Where an adaptive window starts (entries): the old fixed default.
pub(crate) const WINDOW_START: u32 = 64;
/// The smallest adaptive window (entries), and the size of a probe.
pub(crate) const WINDOW_MIN: u32 = 8;
/// Delay above the base that still counts as keeping up: at 200,000
/// entries/s, 5 ms is a thousand entries in the pipes, the window a fast
/// client needs to be limited by nothing but itself.
pub(crate) const QUEUE_SLACK: Duration = Duration::from_millis(5);
/// How long a base stands before the window probes for it again.
pub(crate) const REBASE: Duration = Duration::from_secs(10);

/// A call's window (entries it may hold un-settled).
#[derive(Debug)]
pub(crate) struct Window {
    size: u32,
    /// The largest it may grow to (`max_in_flight`); a fixed window is at its cap.
    cap: u32,
    adaptive: bool,
    /// The fastest delivery-to-verdict time with no queue, and when it was taken.
    base: Option<(Duration, Instant)>,
    /// A probe under way: since when, and the size to return to.
    probe: Option<(Instant, u32)>,
    epoch: Epoch,
}

/// The verdicts since the window last changed, held or probed.
#[derive(Debug, Default)]
struct Epoch {
    verdicts: u32,
    total: Duration,
    fastest: Option<Duration>,
    /// The call's credit ran out: the window was what limited it.
    limited: bool,
}

impl Window {
    /// A window of `max_in_flight` entries that never changes.
    pub(crate) fn fixed(max_in_flight: u32) -> Window {
        Window {
            size: max_in_flight,
            cap: max_in_flight,
            adaptive: false,
            base: None,
            probe: None,
            epoch: Epoch::default(),
        }
    }

    /// A window that adapts between [`WINDOW_MIN`] and `cap` (entries),
    /// starting at [`WINDOW_START`] (both capped by `cap`).
    pub(crate) fn adaptive(cap: u32) -> Window {
        Window { size: WINDOW_START.min(cap), adaptive: true, ..Window::fixed(cap) }
    }

    /// The entries the call may hold now.
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// The call holds as many entries as the window allows.
    pub(crate) fn ran_out(&mut self) {
        self.epoch.limited = true;
    }

    /// A verdict came back at `now` on a delivery made at `delivered_at`.
    /// Once a window's worth came back, the window grows, shrinks or holds;
    /// once its base is [`REBASE`] old, it probes.
    pub(crate) fn verdict(&mut self, delivered_at: Instant, now: Instant) {
        if !self.adaptive {
            return;
        }
        if let Some((since, _)) = self.probe {
            // Only deliveries made after the drop met no queue of the old size.
            if delivered_at < since {
                return;
            }
        }
        let latency = now.saturating_duration_since(delivered_at);
        let epoch = &mut self.epoch;
        epoch.verdicts += 1;
        epoch.total += latency;
        epoch.fastest = Some(epoch.fastest.map_or(latency, |fastest| fastest.min(latency)));
        if epoch.verdicts < self.size {
            return;
        }
        let epoch = std::mem::take(&mut self.epoch);
        let fastest = epoch.fastest.unwrap_or_default();
        if let Some((_, restore)) = self.probe.take() {
            self.base = Some((fastest, now));
            self.size = restore;
            return;
        }
        // The first window met an empty client: its fastest had no queue.
        let base = match self.base {
            Some((base, since)) => {
                self.base = Some((base.min(fastest), since));
                base.min(fastest)
            }
            None => {
                self.base = Some((fastest, now));
                fastest
            }
        };
        let mean = epoch.total / epoch.verdicts;
        if mean <= base * 2 + QUEUE_SLACK {
            if epoch.limited {
                self.size = self.size.saturating_mul(2).min(self.cap);
            }
        } else if mean > base * 4 + QUEUE_SLACK * 4 {
            self.size = (self.size - self.size / 4).max(WINDOW_MIN.min(self.cap));
        }
        if self.base.is_some_and(|(_, since)| now >= since + REBASE) {
            self.probe = Some((now, self.size));
            self.size = WINDOW_MIN.min(self.cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// One window's worth of verdicts, each `latency` after its delivery,
    /// at `now`, the window used up (`limited`) or not.
    fn turn(window: &mut Window, latency: Duration, limited: bool, now: Instant) {
        if limited {
            window.ran_out();
        }
        for _ in 0..window.size() {
            window.verdict(now - latency, now);
        }
    }

    #[test]
    fn a_fixed_window_never_changes() {
        let (mut window, now) = (Window::fixed(100), Instant::now());
        for latency in [MS / 10, 500 * MS, MS / 10] {
            turn(&mut window, latency, true, now + Duration::from_secs(60));
        }
        assert_eq!(window.size(), 100);
    }

    #[test]
    fn a_client_that_keeps_up_doubles_its_window_up_to_the_cap() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        let mut sizes = vec![window.size()];
        for _ in 0..6 {
            turn(&mut window, MS / 2, true, now);
            sizes.push(window.size());
        }
        assert_eq!(sizes, [64, 128, 256, 512, 1000, 1000, 1000]);
    }

    #[test]
    fn a_window_that_does_not_limit_the_call_does_not_grow() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        turn(&mut window, MS / 2, false, now);
        assert_eq!(window.size(), 64, "the client never used all its credit: more would not help");
    }

    #[test]
    fn a_client_falling_behind_shrinks_its_window_by_a_quarter_down_to_the_minimum() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        turn(&mut window, 10 * MS, true, now);
        assert_eq!(window.size(), 128, "the first turn sets the base");
        let mut sizes = Vec::new();
        for _ in 0..12 {
            turn(&mut window, 200 * MS, true, now);
            sizes.push(window.size());
        }
        assert_eq!(sizes, [96, 72, 54, 41, 31, 24, 18, 14, 11, 9, 8, 8]);
    }

    #[test]
    fn delay_past_the_slack_stops_growth_and_up_to_four_times_holds() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        turn(&mut window, MS, false, now);
        turn(&mut window, MS * 2 + QUEUE_SLACK + MS, true, now);
        assert_eq!(window.size(), 64, "past twice the base and the slack: no growth");
        turn(&mut window, MS * 4 + QUEUE_SLACK * 4, true, now);
        assert_eq!(window.size(), 64, "up to four times: no shrinking either");
    }

    #[test]
    fn a_standing_queue_is_never_taken_for_the_base() {
        // A serial client, 20 ms an entry, always behind: each verdict waits
        // for the window's other entries, so no verdict of a full window is
        // fast. Only a probe's can be, and it holds the window down.
        let handler = 20 * MS;
        let (mut window, mut at) = (Window::adaptive(1000), Instant::now());
        let mut sizes = Vec::new();
        for _ in 0..300 {
            let size = window.size();
            at += handler * size;
            turn(&mut window, handler * size, true, at);
            sizes.push(window.size());
        }
        assert!(at > Instant::now() + 6 * REBASE, "several probes ran");
        let late = sizes[100..].iter().max().copied().unwrap_or_default();
        assert!(late <= 4 * WINDOW_MIN, "taking its queue for its speed, it would grow to the cap: {sizes:?}");
    }

    #[test]
    fn a_probe_drops_to_the_minimum_counts_only_deliveries_after_it_and_returns() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        for _ in 0..4 {
            turn(&mut window, MS / 2, true, now);
        }
        assert_eq!(window.size(), 1000);
        let later = now + REBASE;
        turn(&mut window, MS / 2, true, later);
        assert_eq!(window.size(), WINDOW_MIN, "the base is old: probe");
        for _ in 0..20 {
            window.verdict(later - MS, later + MS);
        }
        assert_eq!(window.size(), WINDOW_MIN, "deliveries from before the probe do not end it");
        for _ in 0..8 {
            window.verdict(later + MS, later + 2 * MS);
        }
        assert_eq!(window.size(), 1000, "the probe's worth came back: the size it had");
    }

    #[test]
    fn a_handler_slower_for_good_is_judged_by_its_new_speed_after_a_probe() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        turn(&mut window, MS, false, now);
        turn(&mut window, 100 * MS, true, now);
        assert_eq!(window.size(), 48, "much slower than the base: shrink");
        let later = now + REBASE;
        turn(&mut window, 100 * MS, true, later);
        assert_eq!(window.size(), WINDOW_MIN, "probing");
        turn(&mut window, 100 * MS, true, later + 200 * MS);
        assert_eq!(window.size(), 36, "the probe's base is the new speed; the size it had returns");
        turn(&mut window, 100 * MS, true, later + 400 * MS);
        assert_eq!(window.size(), 72, "keeping up with the new speed: it grows again");
    }

    #[test]
    fn a_cap_below_the_start_and_the_minimum_is_the_window() {
        let now = Instant::now();
        let mut small = Window::adaptive(4);
        assert_eq!(small.size(), 4);
        turn(&mut small, MS, false, now);
        turn(&mut small, 500 * MS, true, now);
        assert_eq!(small.size(), 4);
    }
}
