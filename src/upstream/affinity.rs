//! Conversation affinity with bounded load: which provider of a tier a conversation goes to.
//!
//! **Affinity.** The turns of one conversation (keyed by its `prompt_cache_key` or its
//! beginning, `protocol::conversation_key`) go to the provider that wins the weighted
//! rendezvous hash of the conversation and the providers' names ([`rendezvous_score`]): each
//! provider wins conversations in proportion to its weight, and a conversation keeps its
//! provider as long as that provider serves.
//!
//! **Bounded load** (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam
//! 2016). Many requests with the same key — one popular fixed prompt — would all pin the same
//! provider, whatever the weights. So a provider takes a request only while its share of the
//! tier's recent traffic stays within `(1 + ε)` of its weighted share ([`within_bound`]);
//! otherwise the request goes to the next provider in its own rendezvous order that is within
//! its bound. ε is `routing.balance_factor` (default 0.25). A provider over its bound is
//! passed over only for as long as it is; its conversations come back to it once it is under.
//!
//! With weights `w` and ε, a key hot enough to fill the tier alone gets at most
//! `(1 + ε) × w / Σw` of the tier on its first provider: 0.9375 of a 3:1 tier's traffic at the
//! default ε when its first provider is the heavy one, 0.3125 (and the heavy one the rest,
//! 0.6875) when it is the light one.
//!
//! **The load measure** is each provider's recent requests ([`RecentLoad`]): a count that
//! halves every [`HALF_LIFE_MS`], kept in one atomic word (count and time packed), so reading
//! and adding to it takes no lock and allocates nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// How fast past requests stop counting as load: half of them after this long.
pub const HALF_LIFE_MS: u32 = 2_000;

/// Weighted rendezvous score of a provider for a conversation: `weight / -ln(u)` with `u` in
/// (0, 1) from a hash of both; the highest score wins, each provider with probability
/// proportional to its weight.
pub fn rendezvous_score(conversation: u64, name: &str, weight: u32) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (conversation, name).hash(&mut h);
    let u = ((h.finish() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    f64::from(weight) / -u.ln()
}

/// A provider with less recent load than this (about 2.8 requests a second sustained, with
/// [`HALF_LIFE_MS`] of 2 s) is never passed over: while a provider is quiet the shares are noise,
/// and a conversation is not moved off its provider for noise (one conversation alone on a
/// tier, an agent sending a turn a second, stays where it is). Above it, the bound decides: a
/// dozen busy conversations on three providers are not spread evenly by their hashes, and one
/// whose provider has more than 1 + ε times its share is sent to its next provider.
pub const QUIET: f64 = 8.0;

/// Whether a provider with recent load `load` and weight `weight` may take one more request
/// of a tier whose providers have `total_load` and `total_weight` together: while it is quiet
/// ([`QUIET`]), or while its load with this request stays within `(1 + ε)` of its weighted
/// share of the tier's load with this request.
pub fn within_bound(load: f64, weight: u32, total_load: f64, total_weight: u32, epsilon: f64) -> bool {
    if total_weight == 0 || load < QUIET {
        return true;
    }
    let share = f64::from(weight) / f64::from(total_weight);
    load + 1.0 <= (1.0 + epsilon) * share * (total_load + 1.0)
}

/// The position in a tier's providers, in a request's rendezvous order, of the first one
/// within its bound; `at(i)` gives the `(load, weight)` of the `i`-th of `len`. Some provider
/// always is (the bounds add up to more than the tier's load); 0 if there is none.
pub fn first_within_bound(len: usize, at: impl Fn(usize) -> (f64, u32), epsilon: f64) -> usize {
    let (mut total_load, mut total_weight) = (0.0, 0u32);
    for i in 0..len {
        let (load, weight) = at(i);
        total_load += load;
        total_weight = total_weight.saturating_add(weight);
    }
    (0..len)
        .find(|&i| {
            let (load, weight) = at(i);
            within_bound(load, weight, total_load, total_weight, epsilon)
        })
        .unwrap_or(0)
}

/// A provider's recent requests: a count decaying with [`HALF_LIFE_MS`], in one atomic word
/// (the count as `f32` bits above, the time of the last change in milliseconds since
/// `epoch` below).
#[derive(Debug)]
pub struct RecentLoad {
    word: AtomicU64,
    epoch: Instant,
}

impl Default for RecentLoad {
    fn default() -> Self {
        RecentLoad { word: AtomicU64::new(0), epoch: Instant::now() }
    }
}

fn pack(count: f32, at_ms: u32) -> u64 {
    (u64::from(count.to_bits()) << 32) | u64::from(at_ms)
}

fn unpack(word: u64) -> (f32, u32) {
    (f32::from_bits((word >> 32) as u32), word as u32)
}

/// `count` as it stands `elapsed_ms` later.
fn decayed(count: f32, elapsed_ms: u32) -> f32 {
    if elapsed_ms == 0 {
        return count;
    }
    count * (-(elapsed_ms as f32) / HALF_LIFE_MS as f32 * std::f32::consts::LN_2).exp()
}

impl RecentLoad {
    fn now_ms(&self) -> u32 {
        // Wraps after 49 days; elapsed times are taken with wrapping arithmetic.
        self.epoch.elapsed().as_millis() as u32
    }

    /// The load now.
    pub fn get(&self) -> f64 {
        self.get_at(self.now_ms())
    }

    /// Count one request now.
    pub fn add(&self) {
        self.add_at(self.now_ms())
    }

    fn get_at(&self, now_ms: u32) -> f64 {
        let (count, at) = unpack(self.word.load(Ordering::Relaxed));
        f64::from(decayed(count, now_ms.wrapping_sub(at)))
    }

    fn add_at(&self, now_ms: u32) {
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            let (count, at) = unpack(current);
            let next = pack(decayed(count, now_ms.wrapping_sub(at)) + 1.0, now_ms);
            match self.word.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Route `n` requests of one key over providers with `weights`, whose rendezvous order for
    /// the key is `order`; the share each provider gets.
    fn route_hot_key(weights: &[u32], order: &[usize], n: usize, epsilon: f64) -> Vec<f64> {
        let mut load = vec![0.0; weights.len()];
        for _ in 0..n {
            let view: Vec<(f64, u32)> = order.iter().map(|&i| (load[i], weights[i])).collect();
            load[order[first_within_bound(view.len(), |i| view[i], epsilon)]] += 1.0;
        }
        load.iter().map(|l| l / n as f64).collect()
    }

    #[test]
    fn a_hot_key_fills_its_provider_up_to_the_bound_then_spills_in_order() {
        // 3:1, the hot key prefers the heavy provider: it keeps (1 + ε) × 3/4.
        let shares = route_hot_key(&[3, 1], &[0, 1], 2_000, 0.25);
        assert!((shares[0] - 0.9375).abs() < 0.01, "{shares:?}");
        // It prefers the light one: the light one keeps (1 + ε) × 1/4, the heavy one the rest.
        let shares = route_hot_key(&[3, 1], &[1, 0], 2_000, 0.25);
        assert!((shares[1] - 0.3125).abs() < 0.01, "{shares:?}");
        // A smaller ε keeps the split nearer the weights either way.
        for order in [[0, 1], [1, 0]] {
            let heavy = route_hot_key(&[3, 1], &order, 2_000, 0.1)[0];
            assert!((0.65..=0.85).contains(&heavy), "ε 0.1, order {order:?}: {heavy}");
        }
        // Three providers: the overflow goes to the next in the key's order, not to any.
        let shares = route_hot_key(&[1, 1, 1], &[2, 0, 1], 3_000, 0.25);
        assert!((shares[2] - 1.25 / 3.0).abs() < 0.01, "first choice at its bound: {shares:?}");
        assert!((shares[0] - 1.25 / 3.0).abs() < 0.01, "second choice at its bound: {shares:?}");
        assert!((shares[1] - 0.5 / 3.0).abs() < 0.01, "the rest to the third: {shares:?}");
    }

    #[test]
    fn the_bound_never_refuses_an_idle_tier_and_someone_always_fits() {
        assert!(within_bound(0.0, 1, 0.0, 4, 0.25), "a provider's first request");
        assert!(within_bound(0.0, 3, 0.0, 4, 0.0));
        assert!(within_bound(QUIET - 0.5, 1, QUIET - 0.5, 4, 0.25), "a quiet tier: every request on one provider");
        assert!(!within_bound(QUIET, 1, QUIET, 4, 0.25), "no longer quiet");
        assert!(!within_bound(10.0, 1, 10.0, 2, 0.25), "all of the load on half of the weight");
        assert!(within_bound(5.0, 1, 10.0, 2, 0.25), "its share exactly");
        // Whatever the loads, some provider is within its bound.
        for loads in [[100.0, 0.0, 0.0], [33.0, 33.0, 34.0], [0.0, 0.0, 0.0], [5.5, 80.25, 1.0]] {
            let view: Vec<(f64, u32)> = loads.iter().zip([1, 2, 3]).map(|(&l, w)| (l, w)).collect();
            let total: f64 = loads.iter().sum();
            let at = first_within_bound(view.len(), |i| view[i], 0.0);
            assert!(within_bound(view[at].0, view[at].1, total, 6, 0.0), "{loads:?}");
        }
        assert_eq!(first_within_bound(0, |_| (0.0, 1), 0.25), 0);
    }

    #[test]
    fn a_provider_back_under_its_bound_takes_its_keys_again() {
        // The first choice is over its bound: passed over; once the others took enough, back.
        let over = [(300.0, 1), (100.0, 1)];
        assert_eq!(first_within_bound(2, |i| over[i], 0.25), 1);
        let under = [(300.0, 1), (300.0, 1)];
        assert_eq!(first_within_bound(2, |i| under[i], 0.25), 0);
    }

    #[test]
    fn recent_load_counts_and_halves_every_half_life() {
        let l = RecentLoad::default();
        for _ in 0..8 {
            l.add_at(1_000);
        }
        assert_eq!(l.get_at(1_000), 8.0);
        assert!((l.get_at(1_000 + HALF_LIFE_MS) - 4.0).abs() < 1e-3);
        l.add_at(1_000 + 2 * HALF_LIFE_MS);
        assert!((l.get_at(1_000 + 2 * HALF_LIFE_MS) - 3.0).abs() < 1e-3, "2 left of 8, and the new one");
        // The clock word wraps after 49 days: elapsed time is still right across the wrap.
        let w = RecentLoad::default();
        w.add_at(u32::MAX - 10);
        assert!((w.get_at(HALF_LIFE_MS - 11) - 0.5).abs() < 1e-3);
    }

    #[test]
    fn concurrent_adds_are_all_counted() {
        let l = std::sync::Arc::new(RecentLoad::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || (0..1_000).for_each(|_| l.add_at(5)))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().expect("thread"));
        assert_eq!(l.get_at(5), 4_000.0);
    }
}
