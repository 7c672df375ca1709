//! Guessing throttled per who guesses (a client address, a key): after [`FREE_FAILURES`] wrong
//! secrets in a row, each further attempt waits an exponentially growing pause (1 s, 2 s, 4 s,
//! … at most [`MAX_PAUSE_SECS`]) before it is even checked; a right one clears the count. Used
//! by the console's sign-in (per address) and code redemption (per key and per address). At
//! ~15,000 guesses a second before, a 43-character random token was already out of reach; a
//! short configured one no longer is.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Wrong tokens from one address before pauses begin.
pub const FREE_FAILURES: u32 = 3;
/// The longest pause between attempts.
pub const MAX_PAUSE_SECS: u64 = 300;
/// Guessers remembered at once (the stalest go first).
const MAX_ADDRESSES: usize = 4096;

struct Failures {
    count: u32,
    /// No attempt is checked before this.
    until: Instant,
}

pub struct Throttle<K> {
    by_guesser: Mutex<HashMap<K, Failures>>,
    /// Wrong secrets before pauses begin.
    free: u32,
}

impl<K> Default for Throttle<K> {
    fn default() -> Self {
        Self::with_free(FREE_FAILURES)
    }
}

impl<K> Throttle<K> {
    /// Pauses that begin after `free` wrong secrets in a row.
    pub fn with_free(free: u32) -> Self {
        Throttle { by_guesser: Mutex::new(HashMap::new()), free }
    }
}

impl<K: Hash + Eq + Clone> Throttle<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Failures>> {
        self.by_guesser.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether an attempt of `ip` may be checked now; Err: seconds to wait.
    pub fn admit(&self, ip: &K, now: Instant) -> Result<(), u64> {
        match self.lock().get(ip) {
            Some(f) if f.until > now => Err(f.until.duration_since(now).as_secs().max(1)),
            _ => Ok(()),
        }
    }

    /// A wrong secret of `ip`.
    pub fn failed(&self, ip: &K, now: Instant) {
        let mut map = self.lock();
        if map.len() >= MAX_ADDRESSES && !map.contains_key(ip) {
            if let Some(stalest) = map.iter().min_by_key(|(_, f)| f.until).map(|(k, _)| k.clone()) {
                map.remove(&stalest);
            }
        }
        let f = map.entry(ip.clone()).or_insert(Failures { count: 0, until: now });
        f.count = f.count.saturating_add(1);
        if f.count > self.free {
            let pause = 1u64 << (f.count - self.free - 1).min(16);
            f.until = now + Duration::from_secs(pause.min(MAX_PAUSE_SECS));
        }
    }

    /// A right secret of `ip`.
    pub fn succeeded(&self, ip: &K) {
        self.lock().remove(ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_after_the_free_failures_and_a_success_clears_them() {
        let t = Throttle::default();
        let (ip, other): (std::net::IpAddr, std::net::IpAddr) = ("192.0.2.1".parse().expect("ip"), "192.0.2.2".parse().expect("ip"));
        let now = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert!(t.admit(&ip, now).is_ok());
            t.failed(&ip, now);
        }
        assert!(t.admit(&ip, now).is_ok(), "the free failures cost nothing");
        let mut waits = Vec::new();
        let mut at = now;
        for _ in 0..4 {
            t.failed(&ip, at);
            let wait = t.admit(&ip, at).expect_err("paused");
            waits.push(wait);
            at += Duration::from_secs(wait);
            assert!(t.admit(&ip, at).is_ok(), "after the pause, one more attempt");
        }
        assert_eq!(waits, [1, 2, 4, 8]);
        assert!(t.admit(&other, now).is_ok(), "another address is not paused");
        for _ in 0..40 {
            t.failed(&ip, at);
        }
        assert_eq!(t.admit(&ip, at), Err(MAX_PAUSE_SECS));
        t.succeeded(&ip);
        assert!(t.admit(&ip, at).is_ok());
    }
}
