//! Per-key rate limits: requests per minute (`rpm`) and tokens per minute (`tpm`), counted
//! with `pingora-limits` over one-minute windows.

use crate::protocol::{ApiError, ErrorKind};
use crate::store::KeyRecord;
use pingora_limits::rate::Rate;
use std::time::Duration;

const WINDOW: Duration = Duration::from_secs(60);

pub struct Limits {
    requests: Rate,
    tokens: Rate,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { requests: Rate::new(WINDOW), tokens: Rate::new(WINDOW) }
    }
}

/// Whole seconds left in the current window (at least 1).
fn seconds_left(rate: &Rate, key: &str) -> u64 {
    let fraction = rate.rate_with(&key, |c| c.current_interval_fraction);
    ((1.0 - fraction.clamp(0.0, 1.0)) * WINDOW.as_secs_f64()).ceil().max(1.0) as u64
}

impl Limits {
    /// Count this request; refuse it when the key is over its `rpm` or `tpm`.
    pub fn admit(&self, key: &KeyRecord) -> Result<(), ApiError> {
        if let Some(tpm) = key.tpm {
            let used = self.tokens.observe(&key.id.as_str(), 0);
            if used >= 0 && used as u64 >= tpm {
                let mut e = ApiError::new(
                    ErrorKind::RateLimited,
                    format!("Rate limit reached: {tpm} tokens per minute for this key. Retry later."),
                );
                e.retry_after = Some(seconds_left(&self.tokens, &key.id));
                return Err(e);
            }
        }
        if let Some(rpm) = key.rpm {
            let count = self.requests.observe(&key.id.as_str(), 1);
            if count > i64::from(rpm) as isize {
                let mut e = ApiError::new(
                    ErrorKind::RateLimited,
                    format!("Rate limit reached: {rpm} requests per minute for this key. Retry later."),
                );
                e.retry_after = Some(seconds_left(&self.requests, &key.id));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Count the tokens a finished request used.
    pub fn spend_tokens(&self, key_id: &str, tokens: u64) {
        self.tokens.observe(&key_id, isize::try_from(tokens).unwrap_or(isize::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(rpm: Option<u32>, tpm: Option<u64>) -> KeyRecord {
        KeyRecord {
            id: "key_limits".into(),
            name: "n".into(),
            group: "default".into(),
            key_hash: String::new(),
            rpm,
            tpm,
            enabled: true,
            created_at: 0,
        }
    }

    #[test]
    fn rpm_refuses_the_request_over_the_limit() {
        let limits = Limits::default();
        let k = key(Some(3), None);
        for _ in 0..3 {
            assert!(limits.admit(&k).is_ok());
        }
        let e = limits.admit(&k).unwrap_err();
        assert_eq!(e.status(), 429);
        assert!(e.retry_after.is_some_and(|s| (1..=60).contains(&s)));
        assert!(limits.admit(&key(None, None)).is_ok(), "no limit configured");
    }

    #[test]
    fn tpm_refuses_once_the_window_is_spent() {
        let limits = Limits::default();
        let k = key(None, Some(100));
        assert!(limits.admit(&k).is_ok());
        limits.spend_tokens(&k.id, 60);
        assert!(limits.admit(&k).is_ok());
        limits.spend_tokens(&k.id, 40);
        assert_eq!(limits.admit(&k).unwrap_err().status(), 429);
    }
}
