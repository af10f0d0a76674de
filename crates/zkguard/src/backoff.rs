//! Exponential backoff with jitter, as a value type.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with "equal jitter": attempt `n` waits between half and all of
/// `min(initial * 2^n, max)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff starting at `initial`, capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            attempt: 0,
        }
    }

    /// How many delays were handed out.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// The upper bound of the next delay, without jitter.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The next delay, with jitter; advances the attempt counter.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        let nanos = (ceiling - half).as_nanos().min(u64::MAX as u128) as u64;
        half + Duration::from_nanos(if nanos == 0 {
            0
        } else {
            rand::thread_rng().gen_range(0..=nanos)
        })
    }

    /// Starts over.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps_with_jitter() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let mut last_ceiling = Duration::ZERO;
        for _ in 0..10 {
            let c = b.ceiling();
            assert!(c >= last_ceiling && c <= Duration::from_millis(1000));
            let d = b.next_delay();
            assert!(d >= c / 2 && d <= c, "{d:?} outside [{:?}, {c:?}]", c / 2);
            last_ceiling = c;
        }
        assert_eq!(b.ceiling(), Duration::from_millis(1000));
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_millis(100));
    }
}
