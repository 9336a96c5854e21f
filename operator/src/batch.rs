//! The adaptive planner's batching window (pure).
//!
//! Pods rarely come alone: a Deployment scaled up or a job's workers arrive within a few
//! seconds of each other. Planning for the first of them and then again for each later
//! one would move GPUs one at a time, each move blind to the demand right behind it. So
//! new unmet claims open a window; the planner acts once no new one has come for the
//! window's length, or [`MAX_FACTOR`] windows after it opened, whichever is first. Claims
//! already planned for never hold the planner back. A window of zero plans at once.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

/// A window closes at the latest this many window lengths after it opened.
pub const MAX_FACTOR: u32 = 4;

/// Whether the planner may act.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Plan now.
    Plan,
    /// A window is open: look again after this long.
    Wait(Duration),
}

/// The window and the claims it has seen.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    window: Duration,
    /// Claims the planner has planned for (or has been free to) while they wait.
    seen: BTreeSet<String>,
    /// Claims of the open window.
    gathering: BTreeSet<String>,
    /// When the open window opened, and when its last new claim came.
    open: Option<(Instant, Instant)>,
}

impl Batch {
    /// A batch with a window of `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            ..Self::default()
        }
    }

    /// Whether to plan at `now`, with `unmet` the claims waiting now.
    pub fn gate<'a>(&mut self, unmet: impl IntoIterator<Item = &'a String>, now: Instant) -> Gate {
        let unmet: BTreeSet<&String> = unmet.into_iter().collect();
        self.seen.retain(|c| unmet.contains(c));
        self.gathering.retain(|c| unmet.contains(c));
        let mut came = false;
        for c in unmet {
            if !self.seen.contains(c) && self.gathering.insert(c.clone()) {
                came = true;
            }
        }
        if self.gathering.is_empty() {
            self.open = None;
            return Gate::Plan;
        }
        let (opened, last) = match self.open {
            Some((opened, last)) if came => (opened, now.max(last)),
            Some(open) => open,
            None => (now, now),
        };
        self.open = Some((opened, last));
        let quiet = self
            .window
            .saturating_sub(now.saturating_duration_since(last));
        let cap = (self.window * MAX_FACTOR).saturating_sub(now.saturating_duration_since(opened));
        let left = quiet.min(cap);
        if left.is_zero() {
            self.seen.append(&mut self.gathering);
            self.open = None;
            Gate::Plan
        } else {
            Gate::Wait(left)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(names: &[&str]) -> Vec<String> {
        names.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_zero_window_plans_at_once() {
        let mut b = Batch::new(Duration::ZERO);
        assert_eq!(b.gate(&claims(&["a"]), Instant::now()), Gate::Plan);
    }

    #[test]
    fn nothing_waiting_plans_at_once() {
        let mut b = Batch::new(Duration::from_secs(5));
        assert_eq!(b.gate(&claims(&[]), Instant::now()), Gate::Plan);
    }

    #[test]
    fn the_window_closes_once_no_new_claim_came_for_its_length() {
        let w = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut b = Batch::new(w);
        assert_eq!(b.gate(&claims(&["a"]), t0), Gate::Wait(w));
        let t2 = t0 + Duration::from_secs(2);
        assert_eq!(
            b.gate(&claims(&["a", "b"]), t2),
            Gate::Wait(w),
            "b restarts the quiet time"
        );
        let t4 = t0 + Duration::from_secs(4);
        assert_eq!(
            b.gate(&claims(&["a", "b"]), t4),
            Gate::Wait(Duration::from_secs(3))
        );
        assert_eq!(b.gate(&claims(&["a", "b"]), t2 + w), Gate::Plan);
        // Planned-for claims never hold the planner back again.
        assert_eq!(b.gate(&claims(&["a", "b"]), t2 + w + w), Gate::Plan);
    }

    #[test]
    fn a_steady_stream_of_claims_is_planned_for_after_the_longest_wait() {
        let w = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut b = Batch::new(w);
        let mut names = Vec::new();
        let mut planned_at = None;
        for s in 0..30u64 {
            names.push(format!("c{s}"));
            let now = t0 + Duration::from_secs(s);
            if b.gate(&names, now) == Gate::Plan {
                planned_at = Some(s);
                break;
            }
        }
        assert_eq!(planned_at, Some(u64::from(MAX_FACTOR) * 5));
    }

    #[test]
    fn a_claim_that_went_and_came_back_is_new_again() {
        let w = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut b = Batch::new(w);
        b.gate(&claims(&["a"]), t0);
        assert_eq!(b.gate(&claims(&["a"]), t0 + w), Gate::Plan);
        b.gate(&claims(&[]), t0 + w);
        assert_eq!(b.gate(&claims(&["a"]), t0 + w + w), Gate::Wait(w));
    }
}
