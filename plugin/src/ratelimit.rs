//! A token bucket for the plugin's per-claim API writes (`ResourceClaim.status.devices`).
//!
//! Every node agent that writes to the API server limits its own rate: the kubelet with
//! `--kube-api-qps`, client-go clients with their default 5 QPS. A node preparing a burst of
//! claims would otherwise send one status write per claim as fast as the API server
//! answers, and on a machine it shares with the control plane those writes take the CPU
//! the kubelet's next prepare needs. The status is informational (nothing waits on it), so
//! it can trail a burst by a few seconds.
//!
//! Reservation style, as Go's `rate.Limiter.Wait`: a caller that finds the bucket empty
//! takes a token from the future and sleeps until it is due, so waiters are served in the
//! order they asked and none is starved.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// Limits how often something happens: at most `burst` at once, `per_second` on average.
#[derive(Debug)]
pub struct RateLimiter {
    per_second: f64,
    burst: f64,
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// Tokens available at `at`; negative when callers already hold future tokens.
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// `per_second` tokens per second, at most `burst` saved up. A rate that is not
    /// positive (or not finite) means no limit.
    pub fn new(per_second: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            per_second,
            burst,
            bucket: Mutex::new(Bucket {
                tokens: burst,
                at: Instant::now(),
            }),
        }
    }

    /// Whether this limiter limits anything.
    pub fn is_limited(&self) -> bool {
        self.per_second.is_finite() && self.per_second > 0.0
    }

    /// Takes a token; how long the caller must wait before using it (zero when one was
    /// available).
    pub fn reserve(&self, now: Instant) -> Duration {
        if !self.is_limited() {
            return Duration::ZERO;
        }
        // A poisoned lock only means another thread panicked between two float updates;
        // the bucket is still a valid bucket.
        let mut b = self
            .bucket
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.per_second).min(self.burst);
        b.at = b.at.max(now);
        b.tokens -= 1.0;
        if b.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.tokens / self.per_second)
        }
    }

    /// Waits until a token is available and takes it.
    pub async fn acquire(&self) {
        let wait = self.reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_at_once_and_the_rest_is_spaced_at_the_rate() {
        let limiter = RateLimiter::new(10.0, 3);
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..6).map(|_| limiter.reserve(t0)).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        let ms: Vec<u128> = waits[3..].iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![100, 200, 300]);
    }

    #[test]
    fn tokens_come_back_with_time_up_to_the_burst() {
        let limiter = RateLimiter::new(10.0, 2);
        let t0 = Instant::now();
        assert!(limiter.reserve(t0).is_zero());
        assert!(limiter.reserve(t0).is_zero());
        assert!(!limiter.reserve(t0).is_zero());
        // The third call borrowed the token due at t0 + 100 ms; by t0 + 10 s the bucket is
        // full again, but never fuller than the burst.
        let later = t0 + Duration::from_secs(10);
        assert!(limiter.reserve(later).is_zero());
        assert!(limiter.reserve(later).is_zero());
        assert_eq!(limiter.reserve(later).as_millis(), 100);
    }

    #[test]
    fn a_rate_of_zero_means_no_limit() {
        let limiter = RateLimiter::new(0.0, 1);
        assert!(!limiter.is_limited());
        let t0 = Instant::now();
        assert!((0..1000).all(|_| limiter.reserve(t0).is_zero()));
    }
}
