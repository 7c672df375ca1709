//! OAuth2 bearer tokens for the clouds that sign in for them (Vertex with a service account's
//! signed assertion, Azure with Entra ID client credentials): fetched from the token endpoint,
//! cached, refreshed in the background before they expire, one fetch in flight per provider.
//!
//! A request waits only when no valid token exists (the first request, or after a long
//! failure); a fetch that fails fails closed — the request is refused 503, naming no secret —
//! and for [`FAILURE_PAUSE`] the next requests fail at once rather than each calling a
//! failing endpoint. Each provider has its own source: one provider's endpoint never holds up
//! another's requests.

use super::{sensitive, SeamError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One token request: the endpoint, and the form fields (name, value) to post to it.
pub type TokenRequest = (String, Vec<(&'static str, String)>);

/// How a token request is made.
pub trait Grant: Send + Sync {
    fn request(&self) -> Result<TokenRequest, SeamError>;
}

/// A token is refreshed in the background from this long before it expires.
const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// After a failed fetch, requests that find no valid token fail at once for this long.
pub const FAILURE_PAUSE: Duration = Duration::from_secs(5);

/// The longest a token request may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// A cached bearer token.
struct Token {
    /// `Bearer …`, marked sensitive.
    value: http::HeaderValue,
    /// From here on the next request starts a background refresh.
    refresh_at: Instant,
    /// From here on it is not used.
    expires_at: Instant,
}

struct Inner {
    provider: String,
    grant: Box<dyn Grant>,
    client: reqwest::Client,
    current: Mutex<Option<Arc<Token>>>,
    /// Held by the one fetch in flight.
    fetching: tokio::sync::Mutex<()>,
    /// A background refresh was started and has not ended.
    refreshing: std::sync::atomic::AtomicBool,
    /// When the last fetch failed, and why.
    failed: Mutex<Option<(Instant, String)>>,
}

/// The bearer tokens of one provider.
#[derive(Clone)]
pub struct TokenSource {
    inner: Arc<Inner>,
}

impl TokenSource {
    pub fn new(provider: &str, grant: Box<dyn Grant>) -> TokenSource {
        let client = crate::base::outbound::Outbound { total: Some(FETCH_TIMEOUT), ..Default::default() }.client().unwrap_or_default();
        TokenSource {
            inner: Arc::new(Inner {
                provider: provider.to_string(),
                grant,
                client,
                current: Mutex::new(None),
                fetching: tokio::sync::Mutex::new(()),
                refreshing: std::sync::atomic::AtomicBool::new(false),
                failed: Mutex::new(None),
            }),
        }
    }

    /// The cached token, when it is valid (a refresh started in the background when it is close
    /// to expiring): what nearly every request gets, without waiting.
    pub fn fresh(&self) -> Option<http::HeaderValue> {
        let now = Instant::now();
        let token = self.inner.cached()?;
        if now < token.refresh_at {
            return Some(token.value.clone());
        }
        if now < token.expires_at {
            self.refresh_in_background();
            return Some(token.value.clone());
        }
        None
    }

    /// The `Authorization` value to send now: the cached token ([`TokenSource::fresh`]), else
    /// one fetched now.
    pub async fn bearer(&self) -> Result<http::HeaderValue, SeamError> {
        if let Some(value) = self.fresh() {
            return Ok(value);
        }
        let _turn = self.inner.fetching.lock().await;
        // Another request may have fetched one while this one waited.
        if let Some(token) = self.inner.cached().filter(|t| Instant::now() < t.expires_at) {
            return Ok(token.value.clone());
        }
        if let Some(why) = self.inner.recent_failure() {
            return Err(SeamError::Credentials(why));
        }
        self.inner.fetch().await.map(|t| t.value.clone())
    }

    fn refresh_in_background(&self) {
        use std::sync::atomic::Ordering;
        // After a failed fetch, the endpoint is left alone for the pause here too.
        if self.inner.recent_failure().is_some() || self.inner.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            {
                let _turn = inner.fetching.lock().await;
                let fresh = inner.cached().is_some_and(|t| Instant::now() < t.refresh_at);
                if !fresh {
                    if let Err(e) = inner.fetch().await {
                        log::warn!(
                            "provider {}: refreshing its token failed, the current one is used until it expires: {e}",
                            inner.provider
                        );
                    }
                }
            }
            inner.refreshing.store(false, Ordering::Release);
        });
    }
}

impl Inner {
    fn cached(&self) -> Option<Arc<Token>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn recent_failure(&self) -> Option<String> {
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.as_ref().filter(|(at, _)| at.elapsed() < FAILURE_PAUSE).map(|(_, why)| why.clone())
    }

    /// One token request; the token cached, or the failure noted and logged.
    async fn fetch(&self) -> Result<Arc<Token>, SeamError> {
        let started = Instant::now();
        match self.request().await {
            Ok((value, lifetime)) => {
                let token = Arc::new(Token {
                    value,
                    refresh_at: started + lifetime.saturating_sub(REFRESH_MARGIN.min(lifetime / 2)),
                    expires_at: started + lifetime.saturating_sub(Duration::from_secs(30).min(lifetime / 10)),
                });
                *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(token.clone());
                *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = None;
                log::info!("provider {}: signed in (token valid for {} s)", self.provider, lifetime.as_secs());
                Ok(token)
            }
            Err(why) => {
                log::error!("provider {}: could not sign in: {why}", self.provider);
                *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), why.clone()));
                Err(SeamError::Credentials(why))
            }
        }
    }

    async fn request(&self) -> Result<(http::HeaderValue, Duration), String> {
        let (url, form) = self.grant.request().map_err(|e| e.to_string())?;
        let answer =
            self.client.post(&url).form(&form).send().await.map_err(|e| format!("token endpoint unreachable ({})", e.without_url()))?;
        let status = answer.status();
        let body = answer.bytes().await.map_err(|e| format!("token endpoint answer cut ({})", e.without_url()))?;
        read_token(status.as_u16(), &body)
    }
}

/// A token endpoint's answer: the bearer value and how long it lives.
fn read_token(status: u16, body: &[u8]) -> Result<(http::HeaderValue, Duration), String> {
    let value: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    if !(200..300).contains(&status) {
        let error = value
            .get("error")
            .and_then(|e| e.as_str().map(str::to_string).or_else(|| e.get("message").and_then(|m| m.as_str()).map(str::to_string)));
        let detail = value.get("error_description").and_then(serde_json::Value::as_str);
        let said = [error.as_deref(), detail].into_iter().flatten().collect::<Vec<_>>().join(": ");
        return Err(format!("token endpoint answered {status} {}", crate::protocol::upstream_error::scrub(&said)));
    }
    let token = value
        .get("access_token")
        .and_then(serde_json::Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or("token endpoint answered without access_token")?;
    // `expires_in`: a number, or (Entra v1) a string of one; an hour when absent.
    let lifetime = match value.get("expires_in") {
        Some(serde_json::Value::Number(n)) => n.as_u64(),
        Some(serde_json::Value::String(s)) => s.parse().ok(),
        _ => Some(3600),
    }
    .ok_or("token endpoint answered an unreadable expires_in")?;
    if lifetime == 0 {
        return Err("token endpoint answered a token that has already expired".into());
    }
    let value = sensitive(&format!("Bearer {token}"));
    if value.is_empty() {
        return Err("token endpoint answered a token that is no header value".into());
    }
    Ok((value, Duration::from_secs(lifetime.min(86_400))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_answer_is_read_with_its_lifetime_and_an_error_names_no_secret() {
        let (value, life) = read_token(200, br#"{"access_token":"ya29.abc","expires_in":3599,"token_type":"Bearer"}"#).unwrap();
        assert_eq!(value, "Bearer ya29.abc");
        assert!(value.is_sensitive());
        assert_eq!(life, Duration::from_secs(3599));
        let (_, life) = read_token(200, br#"{"access_token":"t","expires_in":"3600"}"#).unwrap();
        assert_eq!(life, Duration::from_secs(3600), "Entra v1 writes it as a string");
        assert!(read_token(200, br#"{"expires_in":3600}"#).unwrap_err().contains("without access_token"));
        assert!(read_token(200, br#"{"access_token":"t","expires_in":0}"#).is_err());
        let refused =
            read_token(400, br#"{"error":"invalid_grant","error_description":"Invalid JWT Signature for sk-abcdefghijklmnopqrstu1234"}"#)
                .unwrap_err();
        assert!(refused.contains("400 invalid_grant: Invalid JWT Signature"), "{refused}");
        assert!(!refused.contains("sk-abcdefghij"), "{refused}");
    }
}
