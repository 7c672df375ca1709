//! Refusals without a known key (no key, a wrong one), kept from crowding out the request log
//! and the access log. An outsider can send them as fast as the network allows (7,000–9,700 a
//! second were measured), and each used to be one request-log entry: the log keeps the newest
//! `console.request_log_max` entries, so a two-minute flood pushed every real one out.
//!
//! Now key-less refusals are aggregated per client address and minute: the first of a minute
//! is logged (request log and access log), the rest are counted, and the count is written to
//! the access log with the address's next logged refusal. Over all addresses, at most
//! [`per_minute`] key-less entries are written a minute — a tenth of the log's slots over its
//! retention — so they can never take the slots of known keys' entries. Every one is counted in
//! `tollgate_keyless_refusals_total{outcome}`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

/// Addresses remembered at once; past it, a new address's refusals are not logged (counted).
const MAX_ADDRESSES: usize = 16_384;

/// Key-less entries written a minute over all addresses: a tenth of `max` entries spread over
/// `days` of retention (at least one).
pub fn per_minute(max: usize, days: u64) -> u32 {
    let minutes = days.saturating_mul(24 * 60).max(1);
    u32::try_from((max as u64 / 10) / minutes).unwrap_or(u32::MAX).max(1)
}

/// What to do with one key-less refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `earlier` refusals from its address were not logged in its last minute.
    Log { earlier: u64 },
    /// Count it only.
    Suppress,
}

struct Seen {
    minute: u64,
    /// Refusals of `minute` not logged.
    suppressed: u64,
}

struct State {
    minute: u64,
    /// Key-less entries written in `minute`.
    written: u32,
    by_address: HashMap<IpAddr, Seen>,
}

pub struct KeylessRefusals {
    per_minute: u32,
    state: Mutex<State>,
}

impl KeylessRefusals {
    pub fn new(per_minute: u32) -> Self {
        KeylessRefusals { per_minute, state: Mutex::new(State { minute: 0, written: 0, by_address: HashMap::new() }) }
    }

    /// The verdict on a key-less refusal from `ip` (None: no address known) at `now_ms`.
    pub fn check(&self, ip: Option<IpAddr>, now_ms: u64) -> Verdict {
        let minute = now_ms / 60_000;
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.minute != minute {
            s.minute = minute;
            s.written = 0;
            // The last minute's counts are kept until reported (or the minute after).
            s.by_address.retain(|_, seen| seen.minute + 1 >= minute);
        }
        let Some(ip) = ip else {
            return if s.written < self.per_minute {
                s.written += 1;
                Verdict::Log { earlier: 0 }
            } else {
                Verdict::Suppress
            };
        };
        let full = s.by_address.len() >= MAX_ADDRESSES;
        let under_cap = s.written < self.per_minute;
        match s.by_address.get_mut(&ip) {
            Some(seen) if seen.minute == minute => {
                seen.suppressed += 1;
                Verdict::Suppress
            }
            Some(seen) => {
                let earlier = std::mem::take(&mut seen.suppressed);
                seen.minute = minute;
                if under_cap {
                    s.written += 1;
                    Verdict::Log { earlier }
                } else {
                    seen.suppressed = earlier + 1;
                    Verdict::Suppress
                }
            }
            None if full => Verdict::Suppress,
            None => {
                let logged = under_cap;
                s.by_address.insert(ip, Seen { minute, suppressed: u64::from(!logged) });
                if logged {
                    s.written += 1;
                    Verdict::Log { earlier: 0 }
                } else {
                    Verdict::Suppress
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> Option<IpAddr> {
        Some(IpAddr::from([198, 51, 100, n]))
    }

    #[test]
    fn one_entry_per_address_and_minute_with_the_rest_counted() {
        let k = KeylessRefusals::new(100);
        let t = 60_000 * 1000;
        assert_eq!(k.check(ip(1), t), Verdict::Log { earlier: 0 });
        for i in 1..9700 {
            assert_eq!(k.check(ip(1), t + i % 59_000), Verdict::Suppress);
        }
        assert_eq!(k.check(ip(2), t + 5), Verdict::Log { earlier: 0 }, "another address is its own");
        // The next minute: logged again, with the count of the one before.
        assert_eq!(k.check(ip(1), t + 60_000), Verdict::Log { earlier: 9699 });
        assert_eq!(k.check(ip(1), t + 60_001), Verdict::Suppress);
    }

    #[test]
    fn many_addresses_write_at_most_the_cap_a_minute() {
        let k = KeylessRefusals::new(3);
        let t = 60_000 * 7;
        let logged = (0..200).filter(|n| matches!(k.check(ip(*n as u8), t), Verdict::Log { .. })).count();
        assert_eq!(logged, 3);
        let later = (0..200).filter(|n| matches!(k.check(ip(*n as u8), t + 60_000), Verdict::Log { .. })).count();
        assert_eq!(later, 3, "a new minute, a new allowance");
    }

    #[test]
    fn the_cap_leaves_nine_tenths_of_the_log_to_known_keys() {
        // 1,000,000 entries over 7 days: 9 key-less entries a minute at most (90,720 in 7 days).
        assert_eq!(per_minute(1_000_000, 7), 9);
        assert!(u64::from(per_minute(1_000_000, 7)) * 7 * 24 * 60 <= 100_000);
        assert_eq!(per_minute(1000, 3650), 1, "never zero");
    }
}
