//! Claude Code's gateway protocol (version 1) on the public listener, with `identity.oidc` as
//! the provider (`crate::signin` keeps its state):
//!
//! * `GET /.well-known/oauth-authorization-server`: the endpoints (RFC 8414);
//! * `POST /oauth/device_authorization`: a device code and a user code (RFC 8628), at most
//!   [`crate::signin::DEVICES_PER_MINUTE`] per address (`slow_down` past that);
//! * `GET /device`: the approval page, the code pre-filled, never submitted by itself;
//!   `POST /device`: the code checked (the form only from this site: `Sec-Fetch-Site`, else
//!   `Origin`), then the person goes through the provider's sign-in with PKCE, bound to this
//!   browser by a cookie; `GET /oauth/callback`: back from the provider, the person approved —
//!   or refused, with a page that says why, when they are in no team here or their key is
//!   disabled;
//! * `POST /oauth/token`: the device grant (`authorization_pending`, `slow_down`,
//!   `access_denied`, `expired_token`; an approved code is exchanged once) and the refresh
//!   grant (`invalid_grant` once the person's key is disabled or they are in no team);
//! * `GET /managed/settings` and the telemetry relay (`POST /v1/logs|metrics|traces`), for the
//!   person's token;
//! * a refusal of a call made with tollgate's token in the protocol's terms ([`refusal`]).

use super::{Gateway, RequestCtx};
use crate::protocol::response::LocalResponse;
use crate::protocol::{header_str, ApiError, ErrorKind};
use crate::route::SigninOp;
use crate::signin::{Poll, Signin, Someone};
use pingora_proxy::Session;
use serde_json::json;
use sha2::{Digest, Sha256};

/// The cookie that binds a sign-in to the browser that began it.
const BROWSER_COOKIE: &str = "tg_device";
/// How long the browser has for the provider's sign-in (seconds).
const BEGUN_SECS: u64 = 600;
const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// An OAuth error (`{"error": …}`), never cached.
fn oauth_error(status: u16, error: &str) -> LocalResponse {
    no_store(LocalResponse::json(status, &json!({"error": error})))
}

fn no_store(mut r: LocalResponse) -> LocalResponse {
    r.headers.push(("cache-control", "no-store".into()));
    r.headers.push(("pragma", "no-cache".into()));
    r
}

/// The base URL clients reach this gateway at: the configured one, else the request's host.
fn base_url(signin: &Signin, session: &Session) -> String {
    if let Some(url) = &signin.cfg.load().public_url {
        return url.clone();
    }
    let req = session.req_header();
    let host = header_str(req, "host").or_else(|| req.uri.authority().map(|a| a.as_str())).unwrap_or("localhost");
    let host: String = host.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '-' | '[' | ']')).take(255).collect();
    let scheme = if crate::base::text::loopback_url(&format!("http://{host}")) { "http" } else { "https" };
    format!("{scheme}://{host}")
}

/// A page of the sign-in (no script, no frame, nothing from elsewhere).
fn page(status: u16, title: &str, body: &str) -> LocalResponse {
    let esc = crate::base::text::esc_html;
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>{}</title><style>body{{font:16px system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem}}\
         input{{font:1.4rem monospace;letter-spacing:.1em;padding:.3rem;width:12rem}}button{{font-size:1rem;padding:.4rem 1rem}}\
         .alert{{color:#a00}}</style></head><body><h1>{}</h1>{body}</body></html>",
        esc(title),
        esc(title)
    );
    let mut r = LocalResponse { status, body: bytes::Bytes::from(html), content_type: "text/html; charset=utf-8", headers: Vec::new() };
    r.headers.push((
        "content-security-policy",
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self' https: http:; frame-ancestors 'none'".into(),
    ));
    r.headers.push(("x-frame-options", "DENY".into()));
    r.headers.push(("referrer-policy", "no-referrer".into()));
    no_store(r)
}

/// The approval page: the code (pre-filled when the link carried it) and a button.
fn device_page(code: &str, alert: Option<&str>) -> LocalResponse {
    let esc = crate::base::text::esc_html;
    let alert = alert.map(|a| format!("<p class=\"alert\" role=\"alert\">{}</p>", esc(a))).unwrap_or_default();
    page(
        if alert.is_empty() { 200 } else { 400 },
        "Sign in to Claude Code",
        &format!(
            "{alert}<p>Check that this code is the one your terminal shows, then continue to sign in.</p>\
             <form method=\"post\" action=\"/device\"><p><input name=\"user_code\" value=\"{}\" autocomplete=\"off\" \
             spellcheck=\"false\" aria-label=\"Code\"></p><p><button type=\"submit\">Continue</button></p></form>",
            esc(code)
        ),
    )
}

/// A field of a query string or form.
fn field(text: &str, name: &str) -> String {
    text.split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| crate::base::text::decode_component(v))
        .unwrap_or_default()
}

fn cookie<'a>(session: &'a Session, name: &str) -> Option<&'a str> {
    session.req_header().headers.get_all("cookie").iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|c| {
        let (k, v) = c.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    log::error!("sign-in: {e}");
    ApiError::new(ErrorKind::Internal, "Internal error during sign-in.")
}

/// What a sign-in under way carries through the provider (sealed into `state`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Begun {
    /// The user code.
    u: String,
    nonce: String,
    verifier: String,
    /// SHA-256 (hex) of the browser's cookie.
    browser: String,
    at: u64,
}

/// A request of the protocol answered without a key.
pub(super) async fn keyless(gw: &Gateway, session: &mut Session, op: SigninOp) -> Result<LocalResponse, ApiError> {
    let (Some(signin), Some(_)) = (gw.signin.as_ref(), gw.identity.as_ref()) else {
        return Err(super::unknown_endpoint(session.req_header()));
    };
    let base = base_url(signin, session);
    let now = crate::base::clock::now_unix();
    match op {
        SigninOp::Metadata => Ok(LocalResponse::json(
            200,
            &json!({
                "issuer": base,
                "device_authorization_endpoint": format!("{base}/oauth/device_authorization"),
                "token_endpoint": format!("{base}/oauth/token"),
                "grant_types_supported": [DEVICE_GRANT, "refresh_token"],
                "response_types_supported": [],
                "token_endpoint_auth_methods_supported": ["none"],
                "scopes_supported": ["openid", "profile", "email"],
                "gateway_protocol_version": 1,
            }),
        )),
        SigninOp::DeviceAuthorization => {
            let _ = crate::edge::body::read(session, &gw.body).await?;
            let address = super::admit::client_of(session, &gw.routing.load()).ok();
            if !signin.may_begin(address, now) {
                gw.metrics.counter("tollgate_signin_total", &[("step", "device_authorization"), ("outcome", "slow_down")]).add(1);
                return Ok(oauth_error(429, "slow_down"));
            }
            let grant = signin.authorize(now).await.map_err(internal)?;
            gw.metrics.counter("tollgate_signin_total", &[("step", "device_authorization"), ("outcome", "ok")]).add(1);
            let complete = format!("{base}/device?user_code={}", crate::base::text::encode_component(&grant.user_code));
            Ok(no_store(LocalResponse::json(
                200,
                &json!({
                    "device_code": grant.device_code,
                    "user_code": grant.user_code,
                    "verification_uri": format!("{base}/device"),
                    "verification_uri_complete": complete,
                    "expires_in": crate::signin::DEVICE_SECS,
                    "interval": crate::signin::INTERVAL_SECS,
                }),
            )))
        }
        SigninOp::DevicePage => {
            let query = session.req_header().uri.query().unwrap_or("");
            let code = crate::signin::normalize_user_code(&field(query, "user_code")).unwrap_or_default();
            Ok(device_page(&code, None))
        }
        SigninOp::DeviceSubmit => submit(gw, signin, session, &base, now).await,
        SigninOp::Callback => callback(gw, signin, session, &base, now).await,
        SigninOp::Token => token(gw, signin, session, now).await,
        SigninOp::ManagedSettings | SigninOp::Telemetry(_) => Err(super::unknown_endpoint(session.req_header())),
    }
}

/// `POST /device`: the code checked; the browser sent to the provider.
async fn submit(gw: &Gateway, signin: &Signin, session: &mut Session, base: &str, now: u64) -> Result<LocalResponse, ApiError> {
    let req = session.req_header();
    // A form of this site only (a page elsewhere cannot approve a code for its own device).
    let same_site = match header_str(req, "sec-fetch-site") {
        Some(site) => site == "same-origin" || site == "none",
        None => header_str(req, "origin").is_some_and(|o| o == base),
    };
    if !same_site {
        gw.metrics.counter("tollgate_signin_total", &[("step", "device"), ("outcome", "cross_site")]).add(1);
        return Ok(device_page("", Some("This request came from another site and was blocked. Open the link your terminal showed.")));
    }
    let address = super::admit::client_of(session, &gw.routing.load()).ok();
    let body = crate::edge::body::read(session, &gw.body).await?.bytes;
    let typed = field(&String::from_utf8_lossy(&body[..body.len().min(4096)]), "user_code");
    let code = crate::signin::normalize_user_code(&typed);
    let waiting = match &code {
        Some(c) if signin.may_begin(address, now) => signin.waiting(c, now).await.map_err(internal)?,
        _ => false,
    };
    let Some(code) = code.filter(|_| waiting) else {
        gw.metrics.counter("tollgate_signin_total", &[("step", "device"), ("outcome", "unknown_code")]).add(1);
        return Ok(device_page("", Some("That code was not recognized: it may have expired. Check your terminal and try again.")));
    };
    let Some(identity) = gw.identity.as_ref() else { return Err(super::unknown_endpoint(session.req_header())) };
    let Some(provider) = identity.provider_now().await else {
        return Ok(page(
            503,
            "Sign-in unavailable",
            "<p class=\"alert\">The identity provider cannot be reached now; try again shortly.</p>",
        ));
    };
    let keys = signin.keys().await.map_err(internal)?;
    let browser = crate::base::secrets::random_base62(32);
    let verifier = crate::base::secrets::random_base62(64);
    let nonce = crate::base::secrets::random_base62(32);
    let begun = Begun {
        u: code,
        nonce: nonce.clone(),
        verifier: verifier.clone(),
        browser: crate::access::auth::hex(&Sha256::digest(browser.as_bytes())),
        at: now,
    };
    let state = keys.seal_bytes(&serde_json::to_vec(&begun).unwrap_or_default());
    let location = identity.authorization_url(&provider, &format!("{base}/oauth/callback"), &state, &nonce, &verifier);
    let secure = if base.starts_with("https://") { "; Secure" } else { "" };
    let mut r = page(303, "Signing in", "<p>On to your identity provider…</p>");
    r.headers.push(("location", location));
    r.headers.push(("set-cookie", format!("{BROWSER_COOKIE}={browser}; Path=/; HttpOnly; SameSite=Lax; Max-Age={BEGUN_SECS}{secure}")));
    Ok(r)
}

/// `GET /oauth/callback`: the person the provider signed in approves the code, or is refused.
async fn callback(gw: &Gateway, signin: &Signin, session: &mut Session, base: &str, now: u64) -> Result<LocalResponse, ApiError> {
    let failed = |status: u16, message: &str| {
        let mut r =
            page(status, "Sign-in failed", &format!("<p class=\"alert\" role=\"alert\">{}</p>", crate::base::text::esc_html(message)));
        r.headers.push(("set-cookie", format!("{BROWSER_COOKIE}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0")));
        r
    };
    let query = session.req_header().uri.query().unwrap_or("").to_string();
    if !field(&query, "error").is_empty() {
        return Ok(failed(
            401,
            &format!("The identity provider did not sign you in ({}).", crate::base::text::clip(&field(&query, "error"), 100)),
        ));
    }
    let keys = signin.keys().await.map_err(internal)?;
    let begun = keys
        .open_bytes(&field(&query, "state"))
        .and_then(|b| serde_json::from_slice::<Begun>(&b).ok())
        .filter(|b| now.saturating_sub(b.at) < BEGUN_SECS);
    let Some(begun) = begun else { return Ok(failed(400, "This sign-in link has expired. Start again from your terminal.")) };
    let browser = cookie(session, BROWSER_COOKIE).map(|c| crate::access::auth::hex(&Sha256::digest(c.as_bytes())));
    if !browser.is_some_and(|b| crate::base::secrets::token_matches(&b, &begun.browser)) {
        gw.metrics.counter("tollgate_signin_total", &[("step", "callback"), ("outcome", "other_browser")]).add(1);
        return Ok(failed(400, "This sign-in was started in another browser. Open the link on the device that showed the code."));
    }
    let Some(identity) = gw.identity.as_ref() else { return Err(super::unknown_endpoint(session.req_header())) };
    let claims =
        match identity.exchange_code(&field(&query, "code"), &format!("{base}/oauth/callback"), &begun.verifier, &begun.nonce).await {
            Ok(c) => c,
            Err(e) => {
                log::warn!("sign-in: {e}");
                let _ = signin.deny(&begun.u).await;
                return Ok(failed(401, "The identity provider's answer could not be confirmed. Start again from your terminal."));
            }
        };
    let Some(mut person) = identity.person(&claims) else { return Ok(failed(401, "The identity provider's answer names nobody.")) };
    // What operators gave them here, besides the provider's claims.
    for a in gw.keys.all_accounts().await.map_err(internal)? {
        if let Some(role) = a.role_of(&person.subject, person.email.as_deref()).map(str::to_string) {
            person.assign(&a.name, &role);
        }
    }
    let refused = match super::person::key_for(gw, identity, &person).await {
        Ok(_) => None,
        Err(e) if e.kind == ErrorKind::Forbidden => {
            Some("You are in no team of this gateway, so it cannot sign you in. Ask your team admin to add you.")
        }
        Err(e) if e.kind == ErrorKind::Unauthorized || e.kind == ErrorKind::KeyExpired => {
            Some("Your access to this gateway is disabled. Ask your team admin.")
        }
        Err(e) => return Err(e),
    };
    if let Some(why) = refused {
        let _ = signin.deny(&begun.u).await;
        gw.metrics.counter("tollgate_signin_total", &[("step", "callback"), ("outcome", "refused")]).add(1);
        log::info!("sign-in: {} was refused a device sign-in: {why}", person.label());
        return Ok(failed(403, why));
    }
    if !signin.approve(&begun.u, &Someone::of(&person), now).await.map_err(internal)? {
        return Ok(failed(400, "This code has already been used or has expired. Start again from your terminal."));
    }
    gw.metrics.counter("tollgate_signin_total", &[("step", "callback"), ("outcome", "approved")]).add(1);
    log::info!("sign-in: {} approved a device", person.label());
    let mut r = page(200, "Signed in", "<p>You are signed in. Return to your terminal; this window can be closed.</p>");
    r.headers.push(("set-cookie", format!("{BROWSER_COOKIE}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0")));
    Ok(r)
}

/// Whether `someone` may still call (their key enabled, a team here): the person as they are now.
async fn still_allowed(gw: &Gateway, someone: &Someone) -> Result<Option<Someone>, ApiError> {
    let Some(identity) = gw.identity.as_ref() else { return Ok(None) };
    let mut person = someone.person();
    for a in gw.keys.all_accounts().await.map_err(internal)? {
        if let Some(role) = a.role_of(&person.subject, person.email.as_deref()).map(str::to_string) {
            person.assign(&a.name, &role);
        }
    }
    match super::person::key_for(gw, identity, &person).await {
        Ok(_) => Ok(Some(Someone::of(&person))),
        Err(e) if matches!(e.kind, ErrorKind::Forbidden | ErrorKind::Unauthorized | ErrorKind::KeyExpired) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `POST /oauth/token`.
async fn token(gw: &Gateway, signin: &Signin, session: &mut Session, now: u64) -> Result<LocalResponse, ApiError> {
    let body = crate::edge::body::read(session, &gw.body).await?.bytes;
    let form = String::from_utf8_lossy(&body[..body.len().min(8192)]).into_owned();
    let tokens = |someone: Someone, refresh: Option<String>| async move {
        let (access, ttl) = signin.access_token(&someone, now).await.map_err(internal)?;
        let refresh = match refresh {
            Some(r) => r,
            None => signin.refresh_token(&someone, now).await.map_err(internal)?,
        };
        Ok::<_, ApiError>(no_store(LocalResponse::json(
            200,
            &json!({"access_token": access, "token_type": "Bearer", "expires_in": ttl, "refresh_token": refresh}),
        )))
    };
    let count = |grant: &'static str, outcome: &'static str| {
        gw.metrics.counter("tollgate_signin_total", &[("step", grant), ("outcome", outcome)]).add(1)
    };
    match field(&form, "grant_type").as_str() {
        DEVICE_GRANT => {
            let code = field(&form, "device_code");
            if code.is_empty() || code.len() > 1024 {
                return Ok(oauth_error(400, "invalid_request"));
            }
            match signin.poll(&code, now).await.map_err(internal)? {
                Poll::Pending => Ok(oauth_error(400, "authorization_pending")),
                Poll::SlowDown => Ok(oauth_error(400, "slow_down")),
                Poll::Denied => {
                    count("device_token", "denied");
                    Ok(oauth_error(400, "access_denied"))
                }
                Poll::Expired => Ok(oauth_error(400, "expired_token")),
                Poll::Approved(someone) => match still_allowed(gw, &someone).await? {
                    Some(now_someone) => {
                        count("device_token", "issued");
                        tokens(now_someone, None).await
                    }
                    None => Ok(oauth_error(400, "access_denied")),
                },
            }
        }
        "refresh_token" => {
            let refresh = field(&form, "refresh_token");
            let Some(someone) = signin.redeem_refresh(&refresh, now).await.map_err(internal)? else {
                count("refresh", "invalid_grant");
                return Ok(oauth_error(401, "invalid_grant"));
            };
            match still_allowed(gw, &someone).await? {
                Some(now_someone) => {
                    count("refresh", "issued");
                    tokens(now_someone, Some(refresh)).await
                }
                None => {
                    count("refresh", "invalid_grant");
                    log::info!("sign-in: a refresh for {} was refused (disabled, or in no team)", someone.display);
                    Ok(oauth_error(401, "invalid_grant"))
                }
            }
        }
        "" => Ok(oauth_error(400, "invalid_request")),
        _ => Ok(oauth_error(400, "unsupported_grant_type")),
    }
}

/// `GET /managed/settings` for the calling person (their team's and role's settings).
pub(super) fn managed_settings(
    gw: &Gateway,
    session: &Session,
    ctx: &RequestCtx,
    caller: &super::admit::Caller,
) -> Result<LocalResponse, ApiError> {
    let Some(signin) = gw.signin.as_ref() else { return Err(super::unknown_endpoint(session.req_header())) };
    let key = &caller.key;
    let role = match ctx.signed_in.as_deref() {
        Some(c) if c.roles.iter().any(|r| r == "operator") => "operator",
        Some(c) if key.policy.account.as_ref().is_some_and(|a| c.admin_of.contains(a)) => "team_admin",
        _ => "member",
    };
    let models: Vec<String> = caller
        .routing
        .catalog
        .models_for(&key.group, Some(crate::config::Protocol::Anthropic))
        .into_iter()
        .filter(|m| key.policy.allows_model(&m.id))
        .map(|m| m.id)
        .collect();
    let cfg = signin.cfg.load();
    let team = key.policy.account.as_deref();
    let account = team.and_then(|t| gw.keys.account(t));
    let stored = account.as_ref().and_then(|a| a.claude_code.as_ref());
    let Some(settings) = crate::signin::settings::for_person(&cfg.settings, team, stored, role, &models) else {
        return Err(ApiError::new(ErrorKind::NotFound, "No managed settings apply to you."));
    };
    let checksum = crate::signin::settings::checksum(&settings);
    let etag = format!("\"{checksum}\"");
    if header_str(session.req_header(), "if-none-match") == Some(etag.as_str()) {
        let mut r = LocalResponse { status: 304, body: bytes::Bytes::new(), content_type: "application/json", headers: Vec::new() };
        r.headers.push(("etag", etag));
        return Ok(r);
    }
    let uuid = crate::signin::settings::uuid(&checksum);
    let mut r = LocalResponse::json(200, &json!({"uuid": uuid, "checksum": checksum, "settings": settings}));
    r.headers.push(("etag", etag));
    r.headers.push(("cache-control", "no-cache".into()));
    Ok(r)
}

/// `POST /v1/logs|metrics|traces`: the export relayed with the person added; 200 whatever
/// becomes of it (the client's exporter would only log an error on each flush).
pub(super) async fn telemetry(
    gw: &Gateway,
    session: &mut Session,
    ctx: &RequestCtx,
    caller: &super::admit::Caller,
    signal: &str,
) -> Result<LocalResponse, ApiError> {
    let Some(signin) = gw.signin.as_ref() else { return Err(super::unknown_endpoint(session.req_header())) };
    let content_type = header_str(session.req_header(), "content-type").unwrap_or("application/x-protobuf").to_string();
    let encoding = header_str(session.req_header(), "content-encoding").map(str::to_string);
    let body = crate::edge::body::read(session, &gw.body).await?.bytes;
    if body.len() > signin.relay.max_bytes {
        return Err(ApiError::new(ErrorKind::PayloadTooLarge, "The export is larger than this gateway relays."));
    }
    let key = &caller.key;
    let person = ctx.signed_in.as_deref();
    let mut attrs = vec![("enduser.id", person.map_or_else(|| key.id.clone(), |c| c.sub.clone()))];
    if let Some(email) = person.and_then(|c| c.email.clone()) {
        attrs.push(("user.email", email));
    }
    if let Some(team) = &key.policy.account {
        attrs.push(("tollgate.team", team.clone()));
    }
    attrs.push(("tollgate.key_id", key.id.clone()));
    let outcome = match signin.relay.relay(signal, body, &content_type, encoding.as_deref(), &attrs) {
        crate::signin::relay::Relayed::Sent => "sent",
        crate::signin::relay::Relayed::Discarded => "discarded",
        crate::signin::relay::Relayed::Dropped => "dropped",
        crate::signin::relay::Relayed::Unreadable => "unreadable",
    };
    gw.metrics.counter("tollgate_telemetry_relayed_total", &[("outcome", outcome)]).add(1);
    Ok(LocalResponse::json(200, &json!({})))
}

/// A refusal of a call made with tollgate's own token, in the protocol's terms: a model the
/// person's rules exclude is `400 invalid_request_error`; a spent window or balance is `429
/// billing_error` that the client must not retry (`x-should-retry: false`).
pub(super) fn refusal(err: &ApiError) -> LocalResponse {
    let (status, etype, no_retry) = match err.kind {
        ErrorKind::ModelNotAllowed => (400, "invalid_request_error", false),
        ErrorKind::BudgetExceeded | ErrorKind::InsufficientBalance | ErrorKind::RequestCostCap => (429, "billing_error", true),
        _ => return LocalResponse::error(err, crate::config::Protocol::Anthropic),
    };
    let mut error = json!({"type": etype, "message": err.message});
    if let Some(code) = err.kind.code() {
        error["code"] = code.into();
    }
    let mut r = LocalResponse::json(status, &json!({"type": "error", "error": error}));
    if no_retry {
        r.headers.push(("x-should-retry", "false".into()));
    }
    if let Some(secs) = err.retry_after {
        r.headers.push(("retry-after", secs.to_string()));
    }
    r
}
