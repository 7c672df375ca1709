//! Rate limits: requests per minute (`rpm`), tokens per minute (`tpm`) and requests in flight
//! (`max_concurrent`) of a key, and of what its calls count against with it — its account's and
//! its tag values' (`policy::limits`), each counted under its own id ([`Limited`]), the key's
//! first: the first that is reached answers.
//!
//! On one node `rpm` and `tpm` are leaky buckets (GCRA): each holds what the key used, draining
//! at the limit per minute, so the count is continuous in time and a minute boundary allows no
//! second burst. A request is admitted while `rpm` has room for one more; a relayed request of a
//! key with a `tpm` reserves the tokens it is held for (input estimate plus output allowance)
//! until it settles, and is admitted only while what was used plus every reservation in flight
//! stays within the limit — concurrent requests cannot pass it together. In a fleet the counts
//! are the database's (`store::postgres::rates`), tolerance stated in docs/security.md.

use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use hashbrown::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(60);

/// A leaky bucket: `level` units used, draining at `per_window` units per [`WINDOW`].
#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    fn new(now: Instant) -> Self {
        Bucket { level: 0.0, at: now }
    }

    /// The level now, after draining since the last look.
    fn drain(&mut self, per_window: f64, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level - elapsed * per_window / WINDOW.as_secs_f64()).max(0.0);
        self.at = now;
        self.level
    }

    /// Whole seconds until `room` more units fit under `per_window` (at least 1).
    fn wait_for(&self, room: f64, per_window: f64) -> u64 {
        let over = (self.level + room - per_window).max(0.0);
        (over / per_window * WINDOW.as_secs_f64()).ceil().max(1.0) as u64
    }
}

/// The token count of one key: used (draining) and reserved by requests in flight.
#[derive(Debug)]
struct TokenState {
    used: Bucket,
    in_flight: u64,
}

pub struct Limits {
    /// `rpm` buckets by key id.
    requests: Mutex<HashMap<String, Bucket>>,
    /// `tpm` counts by key id.
    tokens: Mutex<HashMap<String, TokenState>>,
    /// Requests in flight by key id (keys with a `max_concurrent` only).
    in_flight: Mutex<HashMap<String, u32>>,
    /// `tool_rpm` buckets (MCP tool calls) by key id.
    tool_calls: Mutex<HashMap<String, Bucket>>,
    /// In a fleet the limits hold for the sum of all nodes (`store::postgres::rates`).
    fleet: Option<Arc<crate::store::fleet::Fleet>>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            requests: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
            tool_calls: Mutex::new(HashMap::new()),
            fleet: None,
        }
    }
}

fn rate_limited(message: String, retry_after: u64) -> ApiError {
    let mut e = ApiError::new(ErrorKind::RateLimited, message);
    e.retry_after = Some(retry_after);
    e
}

fn tpm_reached(tpm: u64, whose: &str, retry_after: u64) -> ApiError {
    rate_limited(format!("Rate limit reached: {tpm} tokens per minute for {whose}. Retry later."), retry_after)
}

/// What a call counts against: its key, its account, a tag value it carries.
#[derive(Debug, Clone)]
pub struct Limited<'a> {
    /// Its counts' id: the key's id, `acct:<name>`, `tag:<name>=<value>`.
    pub id: std::borrow::Cow<'a, str>,
    pub rates: crate::policy::limits::RateLimits,
    /// How a refusal names it: `this key`, `the account 'research'`, `the tag team=search`.
    pub whose: std::borrow::Cow<'a, str>,
}

impl<'a> Limited<'a> {
    pub fn key(key: &'a KeyRecord) -> Limited<'a> {
        Limited {
            id: key.id.as_str().into(),
            rates: crate::policy::limits::RateLimits { rpm: key.rpm, tpm: key.tpm, max_concurrent: key.max_concurrent },
            whose: "this key".into(),
        }
    }
}

/// The value of `id` in `map`, made by `make` when there is none: the id is copied into the
/// map only then, not on every request of a key already counted.
fn entry_of<'a, V>(map: &'a mut HashMap<String, V>, id: &str, make: impl FnOnce() -> V) -> &'a mut V {
    map.entry_ref(id).or_insert_with(make)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One request counted in flight, under each id with a `max_concurrent`; released on drop.
pub struct Slot {
    limits: Arc<Limits>,
    ids: Vec<String>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        for id in &self.ids {
            if let Some(fleet) = &self.limits.fleet {
                fleet.slots.exit(id);
                continue;
            }
            let mut map = lock(&self.limits.in_flight);
            if let Some(n) = map.get_mut(id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(id);
                }
            }
        }
    }
}

/// Tokens a request in flight reserved under each `tpm` it counts against; given back on drop
/// (what it used is counted by [`Limits::spend_tokens`]).
pub struct TokenReservation {
    limits: Arc<Limits>,
    ids: Vec<String>,
    tokens: u64,
}

impl Drop for TokenReservation {
    fn drop(&mut self) {
        for id in &self.ids {
            if let Some(fleet) = &self.limits.fleet {
                fleet.rates.release_tokens(id, self.tokens);
                continue;
            }
            if let Some(state) = lock(&self.limits.tokens).get_mut(id) {
                state.in_flight = state.in_flight.saturating_sub(self.tokens);
            }
        }
    }
}

impl Limits {
    /// Limits for a node of `fleet`.
    pub fn for_fleet(fleet: Arc<crate::store::fleet::Fleet>) -> Self {
        Limits { fleet: Some(fleet), ..Limits::default() }
    }

    /// Count this request under each of `all`, in order; the first over its `rpm` or with its
    /// `tpm` spent refuses it (429 with `Retry-After`; in a fleet, 503 when the database is
    /// needed and out of reach).
    ///
    /// A fleet's calls are boxed here and in `enter` and `spend_tokens`: their futures (a
    /// database round trip) take kilobytes, which every request's future would otherwise carry
    /// and copy on one node too.
    pub async fn admit_all(&self, all: &[Limited<'_>]) -> Result<(), ApiError> {
        for one in all {
            match &self.fleet {
                None => self.admit_here(one, Instant::now())?,
                Some(fleet) => Box::pin(Self::admit_fleet(fleet, one)).await?,
            }
        }
        Ok(())
    }

    async fn admit_fleet(fleet: &crate::store::fleet::Fleet, one: &Limited<'_>) -> Result<(), ApiError> {
        use crate::store::postgres::rates::Admission;
        if let Some(tpm) = one.rates.tpm {
            if let Admission::Refused { retry_after_secs } = Box::pin(fleet.rates.admit_tokens(&one.id, tpm)).await {
                return Err(tpm_reached(tpm, &one.whose, retry_after_secs));
            }
        }
        if let Some(rpm) = one.rates.rpm {
            match Box::pin(fleet.rates.admit_request(&one.id, rpm)).await {
                Ok(Admission::Admitted) => {}
                Ok(Admission::Refused { retry_after_secs }) => {
                    return Err(rate_limited(
                        format!("Rate limit reached: {rpm} requests per minute for {}. Retry later.", one.whose),
                        retry_after_secs,
                    ))
                }
                Err(e) => {
                    log::warn!("rate limits: {e}");
                    return Err(crate::store::fleet::unavailable("the rate limit"));
                }
            }
        }
        Ok(())
    }

    /// Count one MCP tool call of `key` against its `tool_rpm` (429 with `Retry-After` past it;
    /// in a fleet the fleet's count, under the key's id with `#tools`).
    pub async fn admit_tool_call(&self, key: &KeyRecord) -> Result<(), ApiError> {
        let Some(rpm) = key.policy.tool_rpm else { return Ok(()) };
        let refused =
            |retry_after| rate_limited(format!("Rate limit reached: {rpm} tool calls per minute for this key. Retry later."), retry_after);
        if let Some(fleet) = &self.fleet {
            use crate::store::postgres::rates::Admission;
            return match Box::pin(fleet.rates.admit_request(&format!("{}#tools", key.id), rpm)).await {
                Ok(Admission::Admitted) => Ok(()),
                Ok(Admission::Refused { retry_after_secs }) => Err(refused(retry_after_secs)),
                Err(e) => {
                    log::warn!("rate limits: {e}");
                    Err(crate::store::fleet::unavailable("the key's tool rate limit"))
                }
            };
        }
        let rate = f64::from(rpm);
        let now = Instant::now();
        let mut map = lock(&self.tool_calls);
        let bucket = entry_of(&mut map, &key.id, || Bucket::new(now));
        if bucket.drain(rate, now) + 1.0 > rate + 1e-9 {
            return Err(refused(bucket.wait_for(1.0, rate)));
        }
        bucket.level += 1.0;
        Ok(())
    }

    fn admit_here(&self, one: &Limited<'_>, now: Instant) -> Result<(), ApiError> {
        if let Some(tpm) = one.rates.tpm {
            let mut map = lock(&self.tokens);
            if let Some(state) = map.get_mut(one.id.as_ref()) {
                let used = state.used.drain(tpm as f64, now);
                // No room for one more token (an epsilon for the drain's float steps).
                if used + state.in_flight as f64 + 1.0 > tpm as f64 + 1e-9 {
                    return Err(tpm_reached(tpm, &one.whose, state.used.wait_for(state.in_flight as f64 + 1.0, tpm as f64)));
                }
            }
        }
        if let Some(rpm) = one.rates.rpm {
            let rate = f64::from(rpm);
            let mut map = lock(&self.requests);
            let bucket = entry_of(&mut map, &one.id, || Bucket::new(now));
            // A small epsilon: a level drained to 2.9999999 by float steps has room for no more.
            if bucket.drain(rate, now) + 1.0 > rate + 1e-9 {
                return Err(rate_limited(
                    format!("Rate limit reached: {rpm} requests per minute for {}. Retry later.", one.whose),
                    bucket.wait_for(1.0, rate),
                ));
            }
            bucket.level += 1.0;
        }
        Ok(())
    }

    /// Reserve `tokens` under the `tpm` of each of `all`: refused (429) when what one used plus
    /// every reservation in flight would pass its limit (in a fleet: the fleet's spend as this
    /// node knows it, and this node's reservations); what the others reserved is given back.
    /// None when none has a `tpm`.
    pub fn reserve_tokens_all(self: &Arc<Self>, all: &[Limited<'_>], tokens: u64) -> Result<Option<TokenReservation>, ApiError> {
        let mut held = TokenReservation { limits: self.clone(), ids: Vec::new(), tokens };
        for one in all {
            let Some(tpm) = one.rates.tpm else { continue };
            if tokens > tpm {
                return Err(ApiError::new(
                    ErrorKind::RateLimited,
                    format!(
                        "This request may use up to {tokens} tokens (its input and output maximum), more than the limit of {tpm} tokens per minute of {}. Ask for fewer output tokens or send less input.",
                        one.whose
                    ),
                ));
            }
            if let Some(fleet) = &self.fleet {
                use crate::store::postgres::rates::Admission;
                match fleet.rates.reserve_tokens(&one.id, tpm, tokens) {
                    Admission::Admitted => held.ids.push(one.id.to_string()),
                    Admission::Refused { retry_after_secs } => return Err(tpm_reached(tpm, &one.whose, retry_after_secs)),
                }
                continue;
            }
            let now = Instant::now();
            let mut map = lock(&self.tokens);
            let state = entry_of(&mut map, &one.id, || TokenState { used: Bucket::new(now), in_flight: 0 });
            let used = state.used.drain(tpm as f64, now);
            if used + (state.in_flight + tokens) as f64 > tpm as f64 {
                return Err(tpm_reached(tpm, &one.whose, state.used.wait_for((state.in_flight + tokens) as f64, tpm as f64)));
            }
            state.in_flight += tokens;
            held.ids.push(one.id.to_string());
        }
        Ok((!held.ids.is_empty()).then_some(held))
    }

    /// Count a request in flight under each of `all` with a `max_concurrent`; 429 when one has
    /// that many (the others' counts given back). None when none has the cap.
    pub async fn enter_all(self: &Arc<Self>, all: &[Limited<'_>]) -> Result<Option<Slot>, ApiError> {
        let mut slot = Slot { limits: self.clone(), ids: Vec::new() };
        for one in all {
            let Some(max) = one.rates.max_concurrent else { continue };
            let busy =
                || rate_limited(format!("Too many requests in flight: {} may have {max} at once. Retry when one finishes.", one.whose), 1);
            if let Some(fleet) = &self.fleet {
                match Box::pin(fleet.slots.enter(&one.id, max)).await {
                    Ok(true) => slot.ids.push(one.id.to_string()),
                    Ok(false) => return Err(busy()),
                    Err(e) => {
                        log::warn!("rate limits: {e}");
                        return Err(crate::store::fleet::unavailable("the requests in flight"));
                    }
                }
                continue;
            }
            let mut map = lock(&self.in_flight);
            let n = entry_of(&mut map, &one.id, || 0);
            if *n >= max {
                return Err(busy());
            }
            *n += 1;
            slot.ids.push(one.id.to_string());
        }
        Ok((!slot.ids.is_empty()).then_some(slot))
    }

    /// Count the tokens a finished request used under each `tpm` of `all`.
    pub async fn spend_tokens_all(&self, all: &[Limited<'_>], tokens: u64) {
        for one in all {
            let Some(tpm) = one.rates.tpm else { continue };
            if let Some(fleet) = &self.fleet {
                Box::pin(fleet.rates.spend_tokens(&one.id, tokens)).await;
                continue;
            }
            let now = Instant::now();
            let mut map = lock(&self.tokens);
            let state = entry_of(&mut map, &one.id, || TokenState { used: Bucket::new(now), in_flight: 0 });
            state.used.drain(tpm as f64, now);
            state.used.level += tokens as f64;
        }
    }
}

/// One turn per key for reading its usage (`/v1/usage`, `/me/data`): a key's reads run one at a
/// time, and never wait for another key's.
#[derive(Default)]
pub struct UsageTurns {
    turns: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl UsageTurns {
    /// Wait for `key_id`'s turn; it ends when the permit drops.
    pub async fn take(&self, key_id: &str) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        let turn = {
            let mut turns = lock(&self.turns);
            // Keys nobody is reading for are forgotten (the map holds only keys with a read on).
            turns.retain(|_, t| Arc::strong_count(t) > 1 || t.available_permits() == 0);
            turns.entry(key_id.to_string()).or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(1))).clone()
        };
        turn.acquire_owned().await.map_err(|_| ApiError::new(ErrorKind::Internal, "The gateway is stopping."))
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
                        usize::from(limits.admit_here(&Limited::key(&key(Some(2), None)), Instant::now()).is_ok())
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
            rpm,
            tpm,
            created_at: 0,
            max_concurrent: Some(2),
            ..KeyRecord::new("key_limits", "n", "default", String::new(), crate::records::key::KeyOrigin::Admin)
        }
    }

    #[tokio::test]
    async fn a_shared_cap_that_refuses_gives_back_what_the_key_took() {
        let limits = Arc::new(Limits::default());
        let account = Limited {
            id: "acct:team".into(),
            rates: crate::policy::limits::RateLimits { max_concurrent: Some(1), ..Default::default() },
            whose: "the account 'team'".into(),
        };
        let (one, two) = (
            KeyRecord { max_concurrent: Some(1), ..key(None, None) },
            KeyRecord { id: "key_two".into(), max_concurrent: Some(1), ..key(None, None) },
        );
        let held = limits.enter_all(&[Limited::key(&one), account.clone()]).await.expect("first").expect("slot");
        let e = limits.enter_all(&[Limited::key(&two), account.clone()]).await.err().expect("the account is busy");
        assert!(e.message.contains("the account 'team' may have 1 at once"), "{}", e.message);
        // The second key's own slot was given back with the refusal.
        assert!(limits.enter_all(&[Limited::key(&two)]).await.expect("its own slot is free").is_some());
        drop(held);
        assert!(limits.enter_all(&[Limited::key(&two), account]).await.expect("the account is free again").is_some());
    }

    #[tokio::test]
    async fn max_concurrent_counts_requests_in_flight() {
        let limits = Arc::new(Limits::default());
        let k = key(None, None);
        let a = limits.enter_all(&[Limited::key(&k)]).await.expect("first").expect("slot");
        let _b = limits.enter_all(&[Limited::key(&k)]).await.expect("second").expect("slot");
        let e = limits.enter_all(&[Limited::key(&k)]).await.err().expect("a third is refused");
        assert_eq!(e.status(), 429);
        drop(a);
        assert!(limits.enter_all(&[Limited::key(&k)]).await.expect("one finished").is_some());
        let free = KeyRecord { max_concurrent: None, ..k };
        assert!(limits.enter_all(&[Limited::key(&free)]).await.expect("no cap").is_none());
    }

    #[tokio::test]
    async fn rpm_refuses_the_request_over_the_limit() {
        let limits = Limits::default();
        let k = key(Some(3), None);
        for _ in 0..3 {
            assert!(limits.admit_all(&[Limited::key(&k)]).await.is_ok());
        }
        let e = limits.admit_all(&[Limited::key(&k)]).await.unwrap_err();
        assert_eq!(e.status(), 429);
        assert!(e.retry_after.is_some_and(|s| (1..=60).contains(&s)));
        assert!(limits.admit_all(&[Limited::key(&key(None, None))]).await.is_ok(), "no limit configured");
    }

    #[tokio::test]
    async fn tpm_refuses_once_the_window_is_spent() {
        let limits = Limits::default();
        let k = key(None, Some(100));
        assert!(limits.admit_all(&[Limited::key(&k)]).await.is_ok());
        limits.spend_tokens_all(&[Limited::key(&k)], 60).await;
        assert!(limits.admit_all(&[Limited::key(&k)]).await.is_ok());
        limits.spend_tokens_all(&[Limited::key(&k)], 40).await;
        assert_eq!(limits.admit_all(&[Limited::key(&k)]).await.unwrap_err().status(), 429);
    }

    #[tokio::test]
    async fn rpm_is_continuous_across_a_minute_boundary() {
        // 40 requests over 2 s, wherever a calendar minute falls: at most 30 plus what drained.
        let limits = Limits::default();
        let k = key(Some(30), None);
        let start = Instant::now();
        let passed = (0..40).filter(|i| limits.admit_here(&Limited::key(&k), start + Duration::from_millis(50 * i)).is_ok()).count();
        // 30 at once, then one more each 2 s: the 40th request comes at 1.95 s.
        assert_eq!(passed, 30, "no second burst");
        // The bucket drains at the limit: one minute later a full limit again.
        let later = start + Duration::from_secs(62);
        assert_eq!((0..40).filter(|_| limits.admit_here(&Limited::key(&k), later).is_ok()).count(), 30);
        // Half a minute on: half the limit.
        let half = later + Duration::from_secs(30);
        assert_eq!((0..40).filter(|_| limits.admit_here(&Limited::key(&k), half).is_ok()).count(), 15);
    }

    #[tokio::test]
    async fn tpm_counts_what_is_in_flight_so_concurrent_requests_cannot_pass_it_together() {
        let limits = Arc::new(Limits::default());
        let k = key(None, Some(1000));
        // 20 requests at once, each held for 120 tokens: 8 fit in 1,000.
        let grants: Vec<_> = (0..20).filter_map(|_| limits.reserve_tokens_all(&[Limited::key(&k)], 120).ok()).collect();
        assert_eq!(grants.len(), 8);
        let e = limits.reserve_tokens_all(&[Limited::key(&k)], 120).err().expect("full");
        assert!(e.status() == 429 && e.retry_after.is_some());
        // They settle for what they used; the reservations go.
        for _ in &grants {
            limits.spend_tokens_all(&[Limited::key(&k)], 100).await;
        }
        drop(grants);
        assert!(limits.reserve_tokens_all(&[Limited::key(&k)], 150).is_ok(), "800 used, 200 room");
        assert!(limits.reserve_tokens_all(&[Limited::key(&k)], 250).is_err());
        // A request held for more than the whole limit can never pass: said so.
        let e = limits.reserve_tokens_all(&[Limited::key(&k)], 5000).err().expect("too large");
        assert!(e.message.contains("5000 tokens"), "{}", e.message);
        assert!(limits.reserve_tokens_all(&[Limited::key(&key(None, None))], 1 << 30).expect("no tpm").is_none());
    }

    #[tokio::test]
    async fn one_keys_usage_reads_never_wait_for_anothers() {
        let turns = UsageTurns::default();
        let a = turns.take("a").await.expect("a's turn");
        // Another key goes at once while a's read runs.
        let b = tokio::time::timeout(Duration::from_secs(5), turns.take("b")).await.expect("b does not wait for a");
        drop(b);
        // The same key waits for its own read.
        let waiting = turns.take("a");
        tokio::pin!(waiting);
        assert!(futures_poll_once(&mut waiting).await.is_none(), "a's second read waits for its first");
        drop(a);
        assert!(tokio::time::timeout(Duration::from_secs(5), waiting).await.is_ok());
    }

    /// Poll a future once: Some(output) when it is ready at once.
    async fn futures_poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut *f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
