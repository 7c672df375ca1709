//! Sign-in with the identity provider (`identity.oidc`): the authorization-code flow with PKCE.
//!
//! `GET /console/oidc/start` makes a state, a nonce and a PKCE verifier and keeps them nowhere
//! but in the browser that began the sign-in: a short-lived cookie (ten minutes, `HttpOnly`)
//! that holds them, sealed with this process's key (HMAC-SHA256) — so no number of anonymous
//! starts fills anything here or shuts anyone out — and sends the browser to the provider.
//! `GET /console/callback` takes the code back only with that browser's sealed cookie and the
//! state it holds (the cookie is cleared then), exchanges it at the token endpoint (with the client
//! secret when one is configured, and the verifier), verifies the ID token (signature,
//! issuer, audience — the client id —, expiry, nonce) and opens a console session for the
//! person it names, with their roles and teams. A provider that cannot be reached gives a page
//! that says so and offers the admin token: the break-glass sign-in never depends on it.

use super::{html, Who};
use crate::admin::api::AdminApi;
use crate::protocol::response::LocalResponse;
use base64::Engine;

/// The cookie that holds a sign-in, in the browser that began it.
pub(super) const BROWSER_COOKIE: &str = "tg_signin";
const PENDING_SECS: u64 = 600;
/// The longest page a sign-in returns to (`next`); a longer one returns to the console's home.
const MAX_NEXT: usize = 512;

/// A sign-in under way, as its cookie holds it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Begun {
    state: String,
    nonce: String,
    verifier: String,
    next: String,
    at: u64,
}

/// Seals and opens sign-in cookies with this process's key (a new one at each start: a sign-in
/// begun before a restart is begun again).
pub(super) struct Pending {
    key: [u8; 32],
}

impl Default for Pending {
    fn default() -> Self {
        Pending { key: rand::random() }
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Where the provider sends the browser back.
pub(super) fn redirect_uri(api: &AdminApi) -> String {
    format!("{}/console/callback", api.console_url)
}

/// A page for a sign-in that could not be done, with the way back to the admin token.
fn failed(status: u16, message: &str) -> LocalResponse {
    super::html(
        status,
        html::bare(
            "Sign-in failed",
            &format!(
                "<p class=\"alert\" role=\"alert\">{}</p><p><a href=\"/console/login\">Back to sign-in</a> (the admin token always works)</p>",
                html::esc(message)
            ),
        ),
    )
}

impl Pending {
    /// `begun` as a cookie value: its JSON, base64url, and its seal (HMAC-SHA256, base64url).
    fn seal(&self, begun: &Begun) -> String {
        let payload = b64(&serde_json::to_vec(begun).unwrap_or_default());
        let tag = b64(&crate::base::secrets::hmac_sha256(&self.key, payload.as_bytes()));
        format!("{payload}.{tag}")
    }

    /// The sign-in a cookie holds, when this process sealed it and it is still young.
    fn open(&self, cookie: &str, now: u64) -> Option<Begun> {
        let (payload, tag) = cookie.split_once('.')?;
        let expected = b64(&crate::base::secrets::hmac_sha256(&self.key, payload.as_bytes()));
        if !crate::base::secrets::token_matches(tag, &expected) {
            return None;
        }
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?;
        let begun: Begun = serde_json::from_slice(&json).ok()?;
        (now.saturating_sub(begun.at) < PENDING_SECS).then_some(begun)
    }

    /// Begin a sign-in: the redirect to the provider.
    pub(super) async fn start(&self, api: &AdminApi, next: &str, secure: &str) -> LocalResponse {
        let Some(identity) = &api.identity else { return failed(404, "No identity provider is configured.") };
        let Some(provider) = identity.provider_now().await else {
            let why = identity.last_error().unwrap_or_else(|| "no answer yet".into());
            log::warn!("console: sign-in with the identity provider is unavailable: {why}");
            return failed(503, "The identity provider cannot be reached now; try again shortly, or sign in with the admin token.");
        };
        let now = crate::base::clock::now_unix();
        let state = crate::base::secrets::random_base62(32);
        let nonce = crate::base::secrets::random_base62(32);
        let verifier = crate::base::secrets::random_base62(64);
        let next = if next.len() <= MAX_NEXT { next } else { "/console" };
        let location = identity.authorization_url(&provider, &redirect_uri(api), &state, &nonce, &verifier);
        let sealed = self.seal(&Begun { state, nonce, verifier, next: next.to_string(), at: now });
        let mut r = super::redirect(&location);
        // Lax: the provider's redirect back is a cross-site top-level navigation.
        r.headers.push((
            "set-cookie",
            format!("{BROWSER_COOKIE}={sealed}; Path=/console; HttpOnly; SameSite=Lax; Max-Age={PENDING_SECS}{secure}"),
        ));
        r
    }

    /// The provider sent the browser back: the person's session, or why not.
    pub(super) async fn callback(
        &self,
        api: &AdminApi,
        query: &super::Form,
        browser: Option<&str>,
        peer: Option<std::net::IpAddr>,
    ) -> Result<(Who, String), LocalResponse> {
        let Some(identity) = &api.identity else { return Err(failed(404, "No identity provider is configured.")) };
        if !query.get("error").is_empty() {
            let said = format!("{} {}", query.get("error"), query.get("error_description"));
            log::info!("console: the identity provider refused a sign-in: {said}");
            return Err(failed(401, &format!("The identity provider did not sign you in ({}).", said.trim())));
        }
        let now = crate::base::clock::now_unix();
        let begun = match browser.and_then(|c| self.open(c, now)) {
            Some(b) => b,
            None => return Err(failed(400, "This sign-in is unknown, took too long, or was begun in another browser; start again here.")),
        };
        if !crate::base::secrets::token_matches(query.get("state"), &begun.state) {
            api.metrics.counter("tollgate_admin_refused_total", &[("reason", "console_sign_in_browser")]).add(1);
            return Err(failed(400, "This sign-in was begun in another browser; start again here."));
        }
        let claims = match identity.exchange_code(query.get("code"), &redirect_uri(api), &begun.verifier, &begun.nonce).await {
            Ok(claims) => claims,
            Err(crate::identity::ExchangeError::Unreachable(why)) => {
                log::warn!("console: the identity provider's token endpoint failed: {why}");
                return Err(failed(
                    503,
                    "The identity provider cannot be reached now; try again shortly, or sign in with the admin token.",
                ));
            }
            Err(crate::identity::ExchangeError::Refused(why)) => {
                log::warn!("console: the identity provider answered the code exchange with {why}");
                return Err(failed(401, "The identity provider did not confirm the sign-in; start again."));
            }
            Err(crate::identity::ExchangeError::Token(e)) => {
                log::warn!("console: an ID token was refused: {e}");
                api.metrics.counter("tollgate_admin_refused_total", &[("reason", "console_id_token")]).add(1);
                return Err(failed(401, "The identity provider's answer could not be verified; start again."));
            }
        };
        let mut person = identity.person(&claims).ok_or_else(|| failed(401, "The identity provider's answer names nobody."))?;
        // What operators gave them here, besides the provider's claims.
        match api.keys.all_accounts().await {
            Ok(accounts) => {
                for a in &accounts {
                    if let Some(role) = a.role_of(&person.subject, person.email.as_deref()) {
                        person.assign(&a.name, role);
                    }
                }
            }
            Err(e) => log::warn!("console: the teams operators set could not be read at sign-in: {e}"),
        }
        // No team here and sign-up open: an account of their own.
        if let Some(cfg) = api.routing.load().signup.clone() {
            match api.selling.signup.enroll(&cfg, &mut person, peer).await {
                Ok(crate::selling::signup::Enrolled::Made(account)) => {
                    api.metrics.counter("tollgate_signups_total", &[("outcome", "made")]).add(1);
                    log::info!("console: {} signed up: account {account}", person.label());
                }
                Ok(crate::selling::signup::Enrolled::Member) => {}
                Ok(other) => {
                    let outcome = match other {
                        crate::selling::signup::Enrolled::Closed => "closed",
                        crate::selling::signup::Enrolled::Domain => "domain",
                        _ => "throttled",
                    };
                    api.metrics.counter("tollgate_signups_total", &[("outcome", outcome)]).add(1);
                    log::info!("console: {} has no team and was not signed up ({outcome})", person.label());
                }
                Err(e) => log::warn!("console: sign-up of {} failed: {e}", person.label()),
            }
        }
        log::info!("console: {} signed in ({}, teams {:?})", person.label(), person.role().name(), person.teams);
        Ok((Who::Person(person), begun.next))
    }
}
