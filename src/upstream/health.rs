//! Provider health: cooldowns, half-open probes and key pools.
//!
//! A provider rests (cools down) after a 429 (for its `Retry-After`, else `cooldown_secs`) or
//! after `failures_before_cooldown` failures in a row (connect failures, timeouts before the
//! response header, 5xx answers). When the rest ends, one request probes it (half-open); its success brings the
//! provider back, its failure sends it to rest again. Meanwhile requests skip it, unless every
//! provider of the model rests: then the one whose rest ends first is tried anyway.
//!
//! With a pool of upstream keys, requests take the keys in turn, and a 429 rests the key that
//! got it, not the provider; a provider whose keys all rest is resting.
//!
//! State lives in a [`HealthBook`] by provider name, outside the routing snapshot, so a reload
//! keeps it for the providers that remain (and for their keys while the pool keeps its size).
//! The breaker logic takes the time as an argument and is unit-tested without clocks.

use crate::observe::metrics::{Counter, Metrics};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Longest rest a `Retry-After` can ask for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Healthy,
    /// Resting until the instant.
    Cooling(Instant),
    /// The rest is over: one request may probe (`probing` while it is out).
    HalfOpen {
        probing: bool,
    },
}

impl State {
    /// The gauge value of a state (0 healthy, 1 cooling, 2 half-open).
    pub fn gauge(self) -> u8 {
        match self {
            State::Healthy => 0,
            State::Cooling(_) => 1,
            State::HalfOpen { .. } => 2,
        }
    }
}

/// How a breaker lets a request through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// The half-open probe: its verdict decides the breaker's state.
    Probe,
    /// Resting (or probed by another request); free again at the instant.
    No(Instant),
}

/// One circuit breaker (a provider's, or a pool key's).
#[derive(Debug, Clone, Copy)]
pub struct Breaker {
    state: State,
    failures: u32,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker { state: State::Healthy, failures: 0 }
    }
}

impl Breaker {
    pub fn state(&self, now: Instant) -> State {
        match self.state {
            State::Cooling(until) if until <= now => State::HalfOpen { probing: false },
            s => s,
        }
    }

    /// Whether a request may use it now (taking the probe when half-open). `force` lets a
    /// request through whatever the state (every provider rests; this one ends first).
    pub fn admit(&mut self, now: Instant, force: bool) -> Admit {
        self.state = self.state(now);
        match self.state {
            State::Healthy => Admit::Yes,
            State::HalfOpen { probing: false } => {
                self.state = State::HalfOpen { probing: true };
                Admit::Probe
            }
            _ if force => Admit::Yes,
            State::Cooling(until) => Admit::No(until),
            State::HalfOpen { probing: true } => Admit::No(now),
        }
    }

    /// The probe ended without a verdict (the request was abandoned): another may probe.
    pub fn unprobe(&mut self) {
        if self.state == (State::HalfOpen { probing: true }) {
            self.state = State::HalfOpen { probing: false };
        }
    }

    /// It answered: healthy again.
    pub fn success(&mut self) {
        *self = Breaker::default();
    }

    /// It failed; returns true when this starts a rest (after `threshold` failures in a row,
    /// or at once when it was being probed).
    pub fn failure(&mut self, now: Instant, threshold: u32, rest: Duration) -> bool {
        self.failures = self.failures.saturating_add(1);
        let probed = matches!(self.state(now), State::HalfOpen { .. });
        if probed || self.failures >= threshold {
            self.state = State::Cooling(now + rest);
            self.failures = 0;
            return true;
        }
        false
    }

    /// It answered 429: rest for `retry_after` (capped), else `rest`. Returns true (a rest began).
    pub fn throttled(&mut self, now: Instant, retry_after: Option<Duration>, rest: Duration) -> bool {
        let rest = retry_after.map_or(rest, |r| r.min(MAX_RETRY_AFTER));
        self.state = State::Cooling(now + rest);
        self.failures = 0;
        true
    }
}

/// What an upstream attempt came to, for the breakers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A response that is not a failure of the provider (2xx, and 4xx other than 429).
    Answered,
    /// 429, with its `Retry-After` if any.
    Throttled(Option<Duration>),
    /// No connection, a timeout before the response header, or a 5xx answer.
    Failed,
}

/// The health of one provider and the keys of its pool, with its metric handles.
pub struct ProviderHealth {
    pub name: String,
    breaker: Mutex<Breaker>,
    keys: Vec<Mutex<Breaker>>,
    next_key: AtomicUsize,
    threshold: u32,
    rest: Duration,
    pub retries: Arc<Counter>,
    pub cooldowns: Arc<Counter>,
    /// Requests sent to the provider lately (the load conversation affinity is bounded by).
    pub load: crate::upstream::affinity::RecentLoad,
    /// Requests whose conversation preferred this provider but went on to the next because it
    /// was over its bound (`tollgate_affinity_overflow_total`).
    pub overflows: Arc<Counter>,
    key_cooldowns: Vec<Arc<Counter>>,
    statuses: RwLock<Vec<(u16, Arc<Counter>)>>,
    metrics: Arc<Metrics>,
}

fn lock(m: &Mutex<Breaker>) -> std::sync::MutexGuard<'_, Breaker> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Permission to send one request to a provider with one of its keys. Dropped without a
/// verdict (the request was abandoned), it gives back a half-open probe.
pub struct Admission {
    health: Arc<ProviderHealth>,
    pub key: usize,
    probe: bool,
    key_probe: bool,
    settled: bool,
}

impl Admission {
    /// Record what the attempt came to.
    pub fn report(self, verdict: Verdict) {
        self.report_at(verdict, Instant::now());
    }

    /// [`Admission::report`] at a given time.
    pub fn report_at(mut self, verdict: Verdict, now: Instant) {
        self.settled = true;
        self.health.report(self.key, verdict, now);
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if !self.settled {
            if self.probe {
                lock(&self.health.breaker).unprobe();
            }
            if self.key_probe {
                if let Some(k) = self.health.keys.get(self.key) {
                    lock(k).unprobe();
                }
            }
        }
    }
}

impl ProviderHealth {
    /// Let a request through now, with the next key of the pool that is not resting; None
    /// while the provider (or every key) rests. With `force`, through whatever the state.
    pub fn admit(self: &Arc<Self>, now: Instant, force: bool) -> Option<Admission> {
        let provider = lock(&self.breaker).admit(now, force);
        if let Admit::No(_) = provider {
            return None;
        }
        let n = self.keys.len().max(1);
        let start = self.next_key.fetch_add(1, Ordering::Relaxed);
        let mut chosen = None;
        for i in 0..n {
            let k = (start + i) % n;
            match lock(&self.keys[k]).admit(now, false) {
                Admit::Yes => chosen = Some((k, false)),
                Admit::Probe => chosen = Some((k, true)),
                Admit::No(_) => continue,
            }
            break;
        }
        if chosen.is_none() && force {
            // Every key rests: the one free first.
            let k = (0..n).min_by_key(|&k| self.key_free_at(k, now)).unwrap_or(0);
            chosen = Some((k, false));
        }
        match chosen {
            Some((key, key_probe)) => {
                Some(Admission { health: self.clone(), key, probe: provider == Admit::Probe, key_probe, settled: false })
            }
            None => {
                if provider == Admit::Probe {
                    lock(&self.breaker).unprobe();
                }
                None
            }
        }
    }

    fn key_free_at(&self, k: usize, now: Instant) -> Instant {
        match lock(&self.keys[k]).state(now) {
            State::Cooling(until) => until,
            _ => now,
        }
    }

    /// When this provider can take a request again (now, when it can already).
    pub fn free_at(&self, now: Instant) -> Instant {
        let provider = match lock(&self.breaker).state(now) {
            State::Cooling(until) => until,
            _ => now,
        };
        let keys = (0..self.keys.len()).map(|k| self.key_free_at(k, now)).min().unwrap_or(now);
        provider.max(keys)
    }

    /// The provider's state for the gauge: cooling while it or every key rests.
    pub fn state(&self, now: Instant) -> State {
        let state = lock(&self.breaker).state(now);
        if state == State::Healthy && !self.keys.is_empty() && self.free_at(now) > now {
            return State::Cooling(self.free_at(now));
        }
        state
    }

    fn report(&self, key: usize, verdict: Verdict, now: Instant) {
        let pool = self.keys.len() > 1;
        match verdict {
            Verdict::Answered => {
                lock(&self.breaker).success();
                if let Some(k) = self.keys.get(key) {
                    lock(k).success();
                }
            }
            // A pool rests the key; a single key is the provider.
            Verdict::Throttled(retry_after) if pool => {
                if let Some(k) = self.keys.get(key) {
                    lock(k).throttled(now, retry_after, self.rest);
                    if let Some(c) = self.key_cooldowns.get(key) {
                        c.add(1);
                    }
                    log::warn!("provider {}: key #{key} answered 429; it rests", self.name);
                }
                lock(&self.breaker).success();
            }
            Verdict::Throttled(retry_after) => {
                lock(&self.breaker).throttled(now, retry_after, self.rest);
                self.cooldowns.add(1);
                log::warn!("provider {} answered 429; it rests for {:?}", self.name, retry_after.unwrap_or(self.rest).min(MAX_RETRY_AFTER));
            }
            Verdict::Failed => {
                if let Some(k) = self.keys.get(key) {
                    lock(k).unprobe();
                }
                if lock(&self.breaker).failure(now, self.threshold, self.rest) {
                    self.cooldowns.add(1);
                    log::warn!(
                        "provider {} failed {} time(s) in a row (or its probe failed); it rests for {:?}",
                        self.name,
                        self.threshold,
                        self.rest
                    );
                }
            }
        }
    }

    /// Count an upstream response status.
    pub fn status(&self, status: u16) {
        let find = |v: &Vec<(u16, Arc<Counter>)>| v.iter().find(|(s, _)| *s == status).map(|e| e.1.clone());
        // The read guard ends with this statement (a write lock follows on a first sight).
        let known = find(&self.statuses.read().unwrap_or_else(|p| p.into_inner()));
        let counter = match known {
            Some(c) => c,
            None => {
                let mut all = self.statuses.write().unwrap_or_else(|p| p.into_inner());
                match find(&all) {
                    Some(c) => c,
                    None => {
                        let c = self
                            .metrics
                            .counter("tollgate_upstream_responses_total", &[("provider", &self.name), ("status", &status.to_string())]);
                        all.push((status, c.clone()));
                        c
                    }
                }
            }
        };
        counter.add(1);
    }
}

/// Every provider's health, by name; kept across reloads.
pub struct HealthBook {
    providers: Mutex<HashMap<String, Arc<ProviderHealth>>>,
    metrics: Arc<Metrics>,
}

impl HealthBook {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        HealthBook { providers: Mutex::new(HashMap::new()), metrics }
    }

    /// The health of `provider` (kept from before a reload while its pool keeps its size).
    pub fn provider(&self, provider: &crate::config::ProviderConfig) -> Arc<ProviderHealth> {
        let mut all = self.providers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(h) = all.get(&provider.name) {
            if h.keys.len() == provider.credentials() && h.threshold == provider.failures_before_cooldown && h.rest == provider.cooldown {
                return h.clone();
            }
        }
        let name = provider.name.as_str();
        let m = &self.metrics;
        let health = Arc::new(ProviderHealth {
            name: name.to_string(),
            breaker: Mutex::new(all.get(name).map(|h| *lock(&h.breaker)).unwrap_or_default()),
            keys: (0..provider.credentials()).map(|_| Mutex::new(Breaker::default())).collect(),
            next_key: AtomicUsize::new(0),
            threshold: provider.failures_before_cooldown,
            rest: provider.cooldown,
            retries: m.counter("tollgate_provider_retries_total", &[("provider", name)]),
            cooldowns: m.counter("tollgate_provider_cooldowns_total", &[("provider", name)]),
            load: crate::upstream::affinity::RecentLoad::default(),
            overflows: m.counter("tollgate_affinity_overflow_total", &[("provider", name)]),
            key_cooldowns: (0..provider.credentials())
                .map(|k| m.counter("tollgate_provider_key_cooldowns_total", &[("provider", name), ("key", &k.to_string())]))
                .collect(),
            statuses: RwLock::new(Vec::new()),
            metrics: m.clone(),
        });
        all.insert(name.to_string(), health.clone());
        health
    }

    /// Forget providers no longer configured.
    pub fn retain(&self, names: &[&str]) {
        self.providers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|n, _| names.contains(&n.as_str()));
    }

    /// Every provider's state and its pool's key states, by name.
    pub fn states(&self) -> Vec<(String, State, Vec<State>)> {
        let now = Instant::now();
        let all = self.providers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out: Vec<(String, State, Vec<State>)> =
            all.iter().map(|(n, h)| (n.clone(), h.state(now), h.keys.iter().map(|k| lock(k).state(now)).collect())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The state gauges (`tollgate_provider_state`, `tollgate_provider_key_state`: 0 healthy,
    /// 1 cooling, 2 half-open), in Prometheus text.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let states = self.states();
        let mut out = String::from("# TYPE tollgate_provider_state gauge\n");
        for (n, state, _) in &states {
            let _ = writeln!(out, "tollgate_provider_state{{provider=\"{n}\"}} {}", state.gauge());
        }
        let _ = writeln!(out, "# TYPE tollgate_provider_key_state gauge");
        for (n, _, keys) in &states {
            for (k, key) in keys.iter().enumerate() {
                let _ = writeln!(out, "tollgate_provider_key_state{{provider=\"{n}\",key=\"{k}\"}} {}", key.gauge());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REST: Duration = Duration::from_secs(30);

    #[test]
    fn failures_in_a_row_start_a_rest_and_a_probe_ends_it() {
        let t0 = Instant::now();
        let mut b = Breaker::default();
        assert!(!b.failure(t0, 3, REST));
        b.success();
        assert!(!b.failure(t0, 3, REST) && !b.failure(t0, 3, REST), "a success in between resets the count");
        assert!(b.failure(t0, 3, REST), "the third in a row");
        assert_eq!(b.admit(t0 + Duration::from_secs(29), false), Admit::No(t0 + REST));
        assert_eq!(b.admit(t0 + Duration::from_secs(29), true), Admit::Yes, "forced when every provider rests");
        let later = t0 + REST;
        assert_eq!(b.admit(later, false), Admit::Probe, "one probe once the rest is over");
        assert_eq!(b.admit(later, false), Admit::No(later), "only one");
        b.unprobe();
        assert_eq!(b.admit(later, false), Admit::Probe, "an abandoned probe is given back");
        assert!(b.failure(later, 3, REST), "a failed probe rests again at once");
        assert_eq!(b.state(later), State::Cooling(later + REST));
        assert_eq!(b.admit(later + REST, false), Admit::Probe);
        b.success();
        assert_eq!((b.state(later + REST), b.admit(later + REST, false)), (State::Healthy, Admit::Yes));
    }

    #[test]
    fn a_429_rests_for_its_retry_after() {
        let t0 = Instant::now();
        let mut b = Breaker::default();
        b.throttled(t0, Some(Duration::from_secs(2)), REST);
        assert_eq!(b.state(t0), State::Cooling(t0 + Duration::from_secs(2)));
        b.throttled(t0, None, REST);
        assert_eq!(b.state(t0), State::Cooling(t0 + REST));
        b.throttled(t0, Some(Duration::from_secs(1 << 30)), REST);
        assert_eq!(b.state(t0), State::Cooling(t0 + MAX_RETRY_AFTER), "capped");
    }

    fn provider(keys: usize) -> crate::config::ProviderConfig {
        let mut c = crate::config::Config::parse(
            "listen: 127.0.0.1:1\nproviders:\n  - { name: p, protocol: openai, base_url: \"http://127.0.0.1:1\", api_key: k, models: [m] }\nprices:\n  m: { input: 1, output: 1 }\n",
            &|_| None,
        )
        .expect("config");
        let mut p = c.providers.remove(0);
        p.api_keys = (0..keys).map(|k| format!("k{k}")).collect();
        p
    }

    #[test]
    fn pool_keys_rotate_and_a_throttled_key_rests_alone() {
        let book = HealthBook::new(Arc::new(Metrics::default()));
        let h = book.provider(&provider(3));
        let now = Instant::now();
        let keys: Vec<usize> = (0..6).map(|_| h.admit(now, false).expect("admitted").key).collect();
        assert_eq!(keys, [0, 1, 2, 0, 1, 2], "in turn");
        let a = h.admit(now, false).expect("admitted");
        assert_eq!(a.key, 0);
        a.report_at(Verdict::Throttled(Some(Duration::from_secs(60))), now);
        assert_eq!(h.state(now), State::Healthy, "the provider stays in");
        let keys: Vec<usize> = (0..4).map(|_| h.admit(now, false).expect("admitted").key).collect();
        assert!(!keys.contains(&0), "the resting key is skipped: {keys:?}");
        for k in [1u64, 2] {
            let mut a = h.admit(now, false).expect("admitted");
            while a.key as u64 != k {
                a = h.admit(now, false).expect("admitted");
            }
            a.report_at(Verdict::Throttled(None), now + Duration::from_secs(k));
        }
        assert!(h.admit(now, false).is_none(), "every key rests: so does the provider");
        assert!(matches!(h.state(now), State::Cooling(_)));
        // Key 0 rests 60 s, key 1 until 31 s, key 2 until 32 s.
        assert_eq!(h.admit(now, true).expect("forced").key, 1, "the key free first");
        assert_eq!(h.free_at(now), now + Duration::from_secs(31));
        // Kept across a reload with the same pool; a new pool starts fresh.
        assert!(Arc::ptr_eq(&h, &book.provider(&provider(3))));
        assert!(!Arc::ptr_eq(&h, &book.provider(&provider(2))));
    }

    #[test]
    fn a_single_key_429_rests_the_provider_and_an_abandoned_probe_is_given_back() {
        let book = HealthBook::new(Arc::new(Metrics::default()));
        let h = book.provider(&provider(1));
        let now = Instant::now();
        h.admit(now, false).expect("admitted").report_at(Verdict::Throttled(Some(Duration::from_millis(10))), now);
        assert!(h.admit(now, false).is_none());
        let later = now + Duration::from_millis(10);
        let probe = h.admit(later, false).expect("the probe");
        assert!(h.admit(later, false).is_none(), "one probe at a time");
        drop(probe);
        let probe = h.admit(later, false).expect("given back");
        probe.report_at(Verdict::Answered, later);
        assert_eq!(h.state(later), State::Healthy);
        assert!(book.render().contains("tollgate_provider_state{provider=\"p\"} 0"));
    }
}
