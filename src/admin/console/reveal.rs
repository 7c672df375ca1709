//! A new key's secret, shown once on a page reached by a one-time link (post/redirect/get):
//! creating a key answers a redirect to `/console/keys/created/<token>`, and that page takes
//! the secret out of here as it shows it. Reloading it shows no secret and creates nothing; a
//! link is good for its own session only, and for [`REVEAL_SECS`].

use std::collections::HashMap;
use std::sync::Mutex;

/// How long a reveal link waits to be opened.
pub const REVEAL_SECS: u64 = 600;
/// Reveals waiting at once (the oldest go first).
const MAX_REVEALS: usize = 64;

/// A secret waiting for its page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reveal {
    pub key_id: String,
    pub name: String,
    pub secret: String,
    /// The session it belongs to (its CSRF token: per session, never in a URL).
    session: String,
    at: u64,
}

#[derive(Default)]
pub struct Reveals {
    waiting: Mutex<HashMap<String, Reveal>>,
}

impl Reveals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Reveal>> {
        self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keep `secret` for the session with CSRF token `session`; the link's token.
    pub fn keep(&self, key_id: &str, name: &str, secret: &str, session: &str, now: u64) -> String {
        let token = crate::base::secrets::random_base62(22);
        let mut waiting = self.lock();
        waiting.retain(|_, r| now.saturating_sub(r.at) < REVEAL_SECS);
        if waiting.len() >= MAX_REVEALS {
            if let Some(oldest) = waiting.iter().min_by_key(|(_, r)| r.at).map(|(k, _)| k.clone()) {
                waiting.remove(&oldest);
            }
        }
        let reveal = Reveal {
            key_id: key_id.to_string(),
            name: name.to_string(),
            secret: secret.to_string(),
            session: session.to_string(),
            at: now,
        };
        waiting.insert(token.clone(), reveal);
        token
    }

    /// The secret behind `token`, once, for its own session; None after that.
    pub fn take(&self, token: &str, session: &str, now: u64) -> Option<Reveal> {
        let mut waiting = self.lock();
        let fresh = waiting.get(token).is_some_and(|r| r.session == session && now.saturating_sub(r.at) < REVEAL_SECS);
        if !fresh {
            return None;
        }
        waiting.remove(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_taken_once_by_its_own_session_while_fresh() {
        let r = Reveals::default();
        let t = r.keep("key_1", "ci", "sk-tg-secret", "csrf-a", 100);
        assert!(r.take(&t, "csrf-b", 101).is_none(), "another session");
        assert_eq!(r.take(&t, "csrf-a", 101).map(|x| x.secret), Some("sk-tg-secret".to_string()));
        assert!(r.take(&t, "csrf-a", 102).is_none(), "a reload shows nothing");
        let late = r.keep("key_2", "ci", "s", "csrf-a", 100);
        assert!(r.take(&late, "csrf-a", 100 + REVEAL_SECS).is_none(), "expired");
    }
}
