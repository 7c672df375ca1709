//! Per-key rate limits: requests per minute (`rpm`) and tokens per minute (`tpm`), counted
//! with `pingora-limits` over one-minute windows, and requests in flight (`max_concurrent`).

use crate::protocol::{ApiError, ErrorKind};
use crate::store::KeyRecord;
use pingora_limits::rate::Rate;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WINDOW: Duration = Duration::from_secs(60);

pub struct Limits {
    requests: Rate,
    /// Counts requests one at a time: `Rate::observe` bumps each row of its estimator apart, so
    /// two requests counted at once can both read a total one short and both pass the limit.
    requests_turn: Mutex<()>,
    tokens: Rate,
    /// Requests in flight by key id (keys with a `max_concurrent` only).
    in_flight: Mutex<HashMap<String, u32>>,
    /// In a fleet the limits hold for the sum of all nodes (`store::postgres::rates`).
    fleet: Option<Arc<crate::store::fleet::Fleet>>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            requests: Rate::new(WINDOW),
            requests_turn: Mutex::new(()),
            tokens: Rate::new(WINDOW),
            in_flight: Mutex::new(HashMap::new()),
            fleet: None,
        }
    }
}

fn rate_limited(message: String, retry_after: u64) -> ApiError {
    let mut e = ApiError::new(ErrorKind::RateLimited, message);
    e.retry_after = Some(retry_after);
    e
}

/// One request of a key counted in flight; released on drop.
pub struct Slot {
    limits: Arc<Limits>,
    key_id: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(fleet) = &self.limits.fleet {
            fleet.slots.exit(&self.key_id);
            return;
        }
        let mut map = self.limits.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.key_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key_id);
            }
        }
    }
}

/// Whole seconds left in the current window (at least 1).
fn seconds_left(rate: &Rate, key: &str) -> u64 {
    let fraction = rate.rate_with(&key, |c| c.current_interval_fraction);
    ((1.0 - fraction.clamp(0.0, 1.0)) * WINDOW.as_secs_f64()).ceil().max(1.0) as u64
}

impl Limits {
    /// Limits for a node of `fleet`.
    pub fn for_fleet(fleet: Arc<crate::store::fleet::Fleet>) -> Self {
        Limits { fleet: Some(fleet), ..Limits::default() }
    }

    /// Count this request; refuse it when the key is over its `rpm` or `tpm` (429 with
    /// `Retry-After`; in a fleet, 503 when the database is needed and out of reach).
    ///
    /// A fleet's calls are boxed here and in `enter` and `spend_tokens`: their futures (a
    /// database round trip) take kilobytes, which every request's future would otherwise carry
    /// and copy on one node too.
    pub async fn admit(&self, key: &KeyRecord) -> Result<(), ApiError> {
        let Some(fleet) = &self.fleet else { return self.admit_here(key) };
        use crate::store::postgres::rates::Admission;
        if let Some(tpm) = key.tpm {
            if let Admission::Refused { retry_after_secs } = Box::pin(fleet.rates.admit_tokens(&key.id, tpm)).await {
                return Err(rate_limited(
                    format!("Rate limit reached: {tpm} tokens per minute for this key. Retry later."),
                    retry_after_secs,
                ));
            }
        }
        if let Some(rpm) = key.rpm {
            match Box::pin(fleet.rates.admit_request(&key.id, rpm)).await {
                Ok(Admission::Admitted) => {}
                Ok(Admission::Refused { retry_after_secs }) => {
                    return Err(rate_limited(
                        format!("Rate limit reached: {rpm} requests per minute for this key. Retry later."),
                        retry_after_secs,
                    ))
                }
                Err(e) => {
                    log::warn!("rate limits: {e}");
                    return Err(crate::store::fleet::unavailable("the key's rate limit"));
                }
            }
        }
        Ok(())
    }

    fn admit_here(&self, key: &KeyRecord) -> Result<(), ApiError> {
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
            let count = {
                let _turn = self.requests_turn.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                self.requests.observe(&key.id.as_str(), 1)
            };
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

    /// Count a request in flight for a key with `max_concurrent`; 429 when it has that many.
    /// None for a key without the cap.
    pub async fn enter(self: &Arc<Self>, key: &KeyRecord) -> Result<Option<Slot>, ApiError> {
        let Some(max) = key.max_concurrent else { return Ok(None) };
        let busy = || rate_limited(format!("Too many requests in flight: this key may have {max} at once. Retry when one finishes."), 1);
        if let Some(fleet) = &self.fleet {
            return match Box::pin(fleet.slots.enter(&key.id, max)).await {
                Ok(true) => Ok(Some(Slot { limits: self.clone(), key_id: key.id.clone() })),
                Ok(false) => Err(busy()),
                Err(e) => {
                    log::warn!("rate limits: {e}");
                    Err(crate::store::fleet::unavailable("the key's requests in flight"))
                }
            };
        }
        let mut map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(key.id.clone()).or_insert(0);
        if *n >= max {
            return Err(busy());
        }
        *n += 1;
        Ok(Some(Slot { limits: self.clone(), key_id: key.id.clone() }))
    }

    /// Count the tokens a finished request of `key` used (only a key with a `tpm` counts them).
    pub async fn spend_tokens(&self, key: &KeyRecord, tokens: u64) {
        if key.tpm.is_none() {
            return;
        }
        if let Some(fleet) = &self.fleet {
            return Box::pin(fleet.rates.spend_tokens(&key.id, tokens)).await;
        }
        self.tokens.observe(&key.id.as_str(), isize::try_from(tokens).unwrap_or(isize::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_counted_at_once_never_pass_the_limit_together() {
        // Many threads asking at the same moment, again and again: at most `rpm` pass each time.
        for round in 0..1000 {
            let limits = Arc::new(Limits::default());
            let barrier = Arc::new(std::sync::Barrier::new(8));
            let passed: usize = (0..8)
                .map(|_| {
                    let (limits, barrier) = (limits.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        usize::from(limits.admit_here(&key(Some(2), None)).is_ok())
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap_or(0))
                .sum();
            assert!(passed <= 2, "round {round}: {passed} passed a limit of 2");
        }
    }

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
            max_concurrent: Some(2),
            origin: crate::store::KeyOrigin::Admin,
            seed_digest: None,
            revoked_at: None,
            rotated: None,
            policy: Default::default(),
        }
    }

    #[tokio::test]
    async fn max_concurrent_counts_requests_in_flight() {
        let limits = Arc::new(Limits::default());
        let k = key(None, None);
        let a = limits.enter(&k).await.expect("first").expect("slot");
        let _b = limits.enter(&k).await.expect("second").expect("slot");
        let e = limits.enter(&k).await.err().expect("a third is refused");
        assert_eq!(e.status(), 429);
        drop(a);
        assert!(limits.enter(&k).await.expect("one finished").is_some());
        let free = KeyRecord { max_concurrent: None, ..k };
        assert!(limits.enter(&free).await.expect("no cap").is_none());
    }

    #[tokio::test]
    async fn rpm_refuses_the_request_over_the_limit() {
        let limits = Limits::default();
        let k = key(Some(3), None);
        for _ in 0..3 {
            assert!(limits.admit(&k).await.is_ok());
        }
        let e = limits.admit(&k).await.unwrap_err();
        assert_eq!(e.status(), 429);
        assert!(e.retry_after.is_some_and(|s| (1..=60).contains(&s)));
        assert!(limits.admit(&key(None, None)).await.is_ok(), "no limit configured");
    }

    #[tokio::test]
    async fn tpm_refuses_once_the_window_is_spent() {
        let limits = Limits::default();
        let k = key(None, Some(100));
        assert!(limits.admit(&k).await.is_ok());
        limits.spend_tokens(&k, 60).await;
        assert!(limits.admit(&k).await.is_ok());
        limits.spend_tokens(&k, 40).await;
        assert_eq!(limits.admit(&k).await.unwrap_err().status(), 429);
    }
}
