//! What a failed request means, and how long to wait before the next one.
//!
//! One back-off state serves the whole uploader: the failures that matter (the network is
//! down, the store throttles, the credentials are refused) hit every file alike, so after
//! a failure no new upload starts until the delay has passed, and the first success
//! resets it. The delay is capped exponential with full jitter (a uniform draw in
//! `[delay / 2, delay]`, so that a fleet of agents restarting together spreads out).

use std::time::Duration;

use crate::s3::store::ErrorClass;

/// The delays of each class.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub retry_base: Duration,
    pub throttled_base: Duration,
    /// No delay is longer, so an outage of minutes only delays uploads by this much.
    pub cap: Duration,
    /// The delay between two probes while the last error was fatal.
    pub fatal: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            retry_base: Duration::from_millis(250),
            throttled_base: Duration::from_secs(1),
            cap: Duration::from_secs(10),
            fatal: Duration::from_secs(30),
        }
    }
}

/// Consecutive failures and the jitter's random state.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: Policy,
    failures: u32,
    rng: u64,
}

impl Backoff {
    /// `seed` makes the jitter repeatable in tests; any value works (0 is replaced).
    pub fn new(policy: Policy, seed: u64) -> Backoff {
        Backoff { policy, failures: 0, rng: seed | 1 }
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    pub fn success(&mut self) {
        self.failures = 0;
    }

    /// Records a failure and returns how long to wait before the next request.
    pub fn failure(&mut self, class: ErrorClass) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let base = match class {
            ErrorClass::Retry => self.policy.retry_base,
            ErrorClass::Throttled => self.policy.throttled_base,
            ErrorClass::Fatal => return self.policy.fatal,
        };
        let exp = self.failures.saturating_sub(1).min(20);
        let full = base.saturating_mul(1 << exp).min(self.policy.cap);
        // xorshift64: no dependency for a few random bits a second.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let frac = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        full.mul_f64(0.5 + 0.5 * frac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter_in_the_upper_half() {
        let policy = Policy::default();
        let mut b = Backoff::new(policy, 42);
        let mut previous_full = Duration::ZERO;
        for k in 0..12u32 {
            let d = b.failure(ErrorClass::Retry);
            let full = policy.retry_base.saturating_mul(1 << k).min(policy.cap);
            assert!(d >= full / 2 && d <= full, "failure {k}: {d:?} not in [{:?}, {full:?}]", full / 2);
            assert!(full >= previous_full);
            previous_full = full;
        }
        assert_eq!(previous_full, policy.cap);
        assert_eq!(b.failures(), 12);
        b.success();
        assert!(b.failure(ErrorClass::Retry) <= policy.retry_base);
    }

    #[test]
    fn throttling_starts_higher_and_fatal_waits_the_probe_interval() {
        let policy = Policy::default();
        let mut b = Backoff::new(policy, 7);
        assert!(b.failure(ErrorClass::Throttled) >= policy.throttled_base / 2);
        assert_eq!(b.failure(ErrorClass::Fatal), policy.fatal);
    }

    #[test]
    fn jitter_spreads_agents_that_fail_together() {
        let delays: std::collections::BTreeSet<Duration> = (1..50u64)
            .map(|seed| Backoff::new(Policy::default(), seed * 7919).failure(ErrorClass::Retry))
            .collect();
        assert!(delays.len() > 40, "only {} distinct delays", delays.len());
    }
}
