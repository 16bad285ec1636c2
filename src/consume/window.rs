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
//! Both rules need verdicts, and a client that collects a batch before it
//! settles any sends none while its window is smaller than its batch: it
//! would wait for ever. So a call out of credit that sends no verdict for
//! [`STALL`] (or four times its mean verdict time, if longer) is taken to
//! wait for more: the window doubles, or a probe ends. A client that had
//! settled before and settles again before its next stall would be due
//! waited for its batch: twice what it held becomes the window's floor,
//! under which it never shrinks or probes again. Any verdict restarts the
//! stall clock. Once a client has settled anything, a
//! stall grows the window only if it settled something since the last one,
//! so a handler stuck with what it holds gets one doubling, not the cap.
//! Before its first verdict nothing tells a slow or stuck handler from a
//! collecting client: its window doubles at each stall, up to the cap, but
//! each stall without a verdict since waits twice as long as the one before
//! (1, 2, 4, 8 s...): a handler 3 s an entry is handed 256 before its first
//! verdict, a client collecting 1,000 waits 15 s once.
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
/// How long a call out of credit may send no verdict before it is taken to
/// wait for more entries than its window (at least; four times its mean
/// verdict time when that is longer).
pub(crate) const STALL: Duration = Duration::from_secs(1);

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
    /// When the call last ran out of credit (its last slot taken) or, since,
    /// sent a verdict: the start of its silence while out of credit.
    silent_since: Option<Instant>,
    /// The mean delivery-to-verdict time of the last window judged.
    last_mean: Option<Duration>,
    /// The smallest the window may be: twice what a collecting client was
    /// seen to hold without settling any (0 until one stalls).
    floor: u32,
    /// Stalls since the last verdict (see [`Window::stalled`]).
    stalls_unanswered: u32,
    /// A floor a stall proposed, and by when a verdict must confirm it.
    floor_claim: Option<(u32, Instant)>,
    /// A stall at the cap was reported (once a call).
    cap_stall_reported: bool,
}

/// Where a stall found the window (see [`Window::stalled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stall {
    /// Below its cap: it grew, a probe ended, or it held (the client
    /// settled nothing since the last stall).
    BelowCap,
    /// At its cap: a client waiting for more than the cap waits for ever
    /// (reported once a call).
    AtCap,
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
            silent_since: None,
            last_mean: None,
            floor: 0,
            stalls_unanswered: 0,
            floor_claim: None,
            cap_stall_reported: false,
        }
    }

    /// A window that adapts between [`WINDOW_MIN`] and `cap` (entries),
    /// starting at [`WINDOW_START`] (both capped by `cap`).
    pub(crate) fn adaptive(cap: u32) -> Window {
        Window { size: WINDOW_START.min(cap), adaptive: true, ..Window::fixed(cap) }
    }

    /// Whether it adapts (the call set no `max_in_flight`): only then can it stall.
    pub(crate) fn is_adaptive(&self) -> bool {
        self.adaptive
    }

    /// The entries the call may hold now.
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// The call holds as many entries as the window allows, since `now`.
    pub(crate) fn ran_out(&mut self, now: Instant) {
        self.epoch.limited = true;
        self.silent_since = Some(now);
    }

    /// When a call that is out of credit (it holds the window) and sends no
    /// verdict counts as stalled: [`STALL`] or four times its mean verdict
    /// time, whichever is longer, after it ran out, twice that after each
    /// stall with no verdict since. `None` for a fixed window, and at the
    /// cap once its stall was reported. Never sooner than [`STALL`] after
    /// the call last ran out, stalled or sent a verdict, which is what lets
    /// the ledger keep a bound instead of asking every call every turn.
    pub(crate) fn stall_due(&self) -> Option<Instant> {
        let at_cap = self.size >= self.cap && self.probe.is_none();
        if !self.adaptive || (at_cap && self.cap_stall_reported) {
            return None;
        }
        self.silent_since.map(|at| at + self.patience())
    }

    /// How long a call out of credit may send no verdict (see [`Window::stall_due`]).
    fn patience(&self) -> Duration {
        let mean = match self.epoch.verdicts {
            0 => self.last_mean,
            verdicts => Some(self.epoch.total / verdicts),
        };
        mean.map_or(STALL, |mean| STALL.max(mean * 4)) * (1 << self.stalls_unanswered.min(8))
    }

    /// The call held `held` entries, its whole window, and sent no verdict
    /// until [`Window::stall_due`]: it waits for more. A probe ends (the
    /// size it had returns; its base stands another [`REBASE`]). Else the
    /// window doubles (up to the cap) if the client never settled anything
    /// yet or settled something since the last stall: a client stuck with
    /// what it holds gets no more after one doubling. Once verdicts were
    /// seen, twice `held` becomes the floor if the client settles something
    /// before its next stall would be due: it waited for more and settles
    /// once it has it (a handler stuck for longer proposes no floor).
    /// Twice, so the floor doubles rather than creeping up a stall at a time.
    pub(crate) fn stalled(&mut self, held: u32, now: Instant) -> Stall {
        let settled_before = self.epoch.verdicts > 0 || self.last_mean.is_some();
        let grow = !settled_before || self.stalls_unanswered == 0;
        let at_cap = self.size >= self.cap && self.probe.is_none();
        self.stalls_unanswered += 1;
        self.silent_since = Some(now);
        if at_cap {
            self.cap_stall_reported = true;
            return Stall::AtCap;
        }
        if settled_before && (grow || self.probe.is_some()) {
            self.floor_claim = Some((held.saturating_mul(2).min(self.cap), now + self.patience()));
        }
        if let Some((_, restore)) = self.probe.take() {
            self.epoch = Epoch::default();
            self.base = self.base.map(|(base, _)| (base, now));
            self.size = restore;
        } else if grow {
            self.size = self.size.saturating_mul(2).min(self.cap);
        }
        Stall::BelowCap
    }

    /// The least the window may shrink or probe to.
    fn least(&self) -> u32 {
        WINDOW_MIN.max(self.floor).min(self.cap)
    }

    /// A verdict came back at `now` on a delivery made at `delivered_at`.
    /// Once a window's worth came back, the window grows, shrinks or holds;
    /// once its base is [`REBASE`] old, it probes.
    pub(crate) fn verdict(&mut self, delivered_at: Instant, now: Instant) {
        if !self.adaptive {
            return;
        }
        self.stalls_unanswered = 0;
        // Progress: a call the window shrank under stays out of credit while
        // its verdicts come back, and is not silent.
        if self.silent_since.is_some() {
            self.silent_since = Some(now);
        }
        if let Some((claim, by)) = self.floor_claim.take() {
            if now <= by {
                self.floor = self.floor.max(claim);
                self.size = self.size.max(claim);
            }
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
        self.last_mean = Some(mean);
        if mean <= base * 2 + QUEUE_SLACK {
            if epoch.limited {
                self.size = self.size.saturating_mul(2).min(self.cap);
            }
        } else if mean > base * 4 + QUEUE_SLACK * 4 {
            self.size = (self.size - self.size / 4).max(self.least());
        }
        if self.base.is_some_and(|(_, since)| now >= since + REBASE) {
            self.probe = Some((now, self.size));
            self.size = self.least();
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
            window.ran_out(now);
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

    #[test]
    fn a_call_out_of_credit_that_settles_nothing_opens_its_window_after_the_stall_time() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        assert_eq!(Window::fixed(64).stall_due(), None, "a fixed window is what the client asked for");
        window.ran_out(now);
        assert_eq!(window.stall_due(), Some(now + STALL));
        window.stalled(64, now + STALL);
        assert_eq!(window.size(), 128, "a client collecting more than 64 gets them");
        assert_eq!(window.stall_due(), Some(now + 3 * STALL), "and twice the stall time to settle");
        turn(&mut window, MS / 2, true, now + 3 * STALL);
        for _ in 0..20 {
            turn(&mut window, 500 * MS, true, now + 3 * STALL);
        }
        assert_eq!(window.size(), WINDOW_MIN, "no verdict was seen before the stall: no floor, it shrinks as before");
    }

    #[test]
    fn a_probe_that_stalls_ends_and_what_the_client_held_becomes_the_floor() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        turn(&mut window, MS, true, now);
        assert_eq!(window.size(), 128);
        let later = now + REBASE;
        turn(&mut window, MS, true, later);
        assert_eq!(window.size(), WINDOW_MIN, "probing");
        // The client holds 40 and waits for 100 before it settles any.
        window.ran_out(later);
        let due = window.stall_due().expect("a probe out of credit can stall");
        assert_eq!(due, later + STALL);
        assert_eq!(window.stalled(40, due), Stall::BelowCap);
        assert_eq!(window.size(), 256, "the probe ended: the size it had returns");
        assert_eq!(window.least(), WINDOW_MIN, "a floor once the client settles");
        window.verdict(due, due + 10 * MS);
        assert_eq!(window.least(), 80, "it settled at once: twice what it held is the floor");
        for _ in 0..12 {
            turn(&mut window, 500 * MS, true, due);
        }
        assert_eq!(window.size(), 80, "it shrinks no further than the client was seen to need");
        turn(&mut window, 500 * MS, true, due + REBASE);
        assert_eq!(window.size(), 80, "and probes at its floor, which it can fill");
    }

    #[test]
    fn a_slow_handler_gets_four_times_its_mean_verdict_time_before_it_counts_as_stalled() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        turn(&mut window, 2000 * MS, true, now);
        let at = now + Duration::from_secs(100);
        window.ran_out(at);
        assert_eq!(window.stall_due(), Some(at + 8000 * MS), "a verdict every 2 s is no stall");
        window.verdict(at - 3000 * MS, at);
        assert_eq!(window.stall_due(), Some(at + 12_000 * MS), "the window being judged counts first");
    }

    #[test]
    fn a_client_that_settled_before_and_then_nothing_gets_one_doubling() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        turn(&mut window, MS, true, now);
        assert_eq!(window.size(), 128);
        // Its handler is stuck: it holds all 128 and settles nothing.
        let mut at = now + MS;
        window.ran_out(at);
        for _ in 0..5 {
            at = window.stall_due().expect("out of credit");
            window.stalled(window.size(), at);
        }
        assert_eq!(window.size(), 256, "one doubling, not the cap");
        window.verdict(at - MS, at);
        assert_eq!(window.least(), WINDOW_MIN, "it settled long after its stall: no floor from it");
        window.ran_out(at);
        window.stalled(256, window.stall_due().expect("out of credit"));
        assert_eq!(window.size(), 512, "a verdict since the last stall: it may grow again");
    }

    #[test]
    fn a_client_that_never_settled_grows_at_each_stall_up_to_the_cap() {
        let (mut window, now) = (Window::adaptive(300), Instant::now());
        window.ran_out(now);
        let (mut sizes, mut stalls) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let due = window.stall_due().expect("below its cap");
            window.stalled(window.size(), due);
            sizes.push(window.size());
            stalls.push(due - now);
        }
        assert_eq!(sizes, [128, 256, 300], "a batch of any size within the cap is reached");
        assert_eq!(stalls, [STALL, 3 * STALL, 7 * STALL], "each unanswered stall waits twice as long");
        assert_eq!(window.least(), WINDOW_MIN, "no verdict seen: no floor");
    }

    #[test]
    fn a_stall_at_the_cap_is_reported_once() {
        let (mut window, now) = (Window::adaptive(128), Instant::now());
        window.ran_out(now);
        let due = window.stall_due().expect("below its cap");
        assert_eq!(window.stalled(64, due), Stall::BelowCap);
        window.ran_out(due);
        let due = window.stall_due().expect("at its cap, not yet reported");
        assert_eq!(window.stalled(128, due), Stall::AtCap);
        assert_eq!(window.size(), 128);
        assert_eq!(window.stall_due(), None, "reported once");
    }

    #[test]
    fn a_call_whose_window_shrank_under_it_is_not_silent_while_verdicts_come() {
        let (mut window, now) = (Window::adaptive(1000), Instant::now());
        turn(&mut window, MS, true, now);
        assert_eq!(window.size(), 128);
        // It holds 128 and slows down: verdicts every 50 ms, 500 ms each.
        window.ran_out(now);
        let mut at = now;
        for _ in 0..128 {
            at += 50 * MS;
            window.verdict(at - 500 * MS, at);
        }
        assert!(window.size() < 128, "it shrank");
        assert_eq!(window.stall_due(), Some(at + 2000 * MS), "silent only from its last verdict, four times its mean");
    }
}
