//! The operator console: pages served by the admin listener under `/console` (loopback, like
//! the rest of the admin API), rendered here as HTML with their assets compiled in. Every
//! action is a plain form post, so the console works without script.
//!
//! Sign-in takes the admin token and answers a session cookie (`HttpOnly`, `SameSite=Strict`,
//! `Path=/console`); the session lives in this process's memory (a restart signs everyone
//! out). Every post carries the session's form token and is refused with 403, changing
//! nothing, without it or when a browser says it came from another site.
//!
//! The pages read the same store as the admin API and change keys through the same functions
//! (`AdminApi::create_key`, `AdminApi::patch_key`), so a rule lives in one place.

mod accounts;
pub(crate) mod html;
mod keys;
mod page;
mod pages;
mod people;
mod providers;
mod requests;
mod reveal;
mod roster;
mod signin;
mod usage;
mod wallet;

use crate::admin::api::AdminApi;
use crate::protocol::response::LocalResponse;
use pingora_proxy::Session;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;

const COOKIE: &str = "tg_console";
/// A session ends this long after its last use.
const SESSION_IDLE_SECS: u64 = 12 * 3600;
/// Most sessions kept at once (past it, the oldest of a person goes first; an operator's last).
const MAX_SESSIONS: usize = 256;
/// Most sessions one person (by the provider's subject) keeps: their own oldest goes first.
const MAX_SESSIONS_PER_PERSON: usize = 8;

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// What the admin listener answers: the console's pages under `/console`, the admin API
/// everywhere else. Both refuse a foreign `Host` or `Origin` first (`AdminApi::refuse_foreign`).
pub struct AdminListener {
    pub api: AdminApi,
    /// Shared by the admin listener and the console's own (a sign-in begun on one may end on
    /// the other).
    sessions: std::sync::Arc<Sessions>,
    /// The console's own listener (`console.listen`): its public origin, whether it is TLS;
    /// None on the admin listener.
    public: Option<Public>,
}

/// The console's own listener: only the console answers there, to requests for its public
/// URL's host and from its origin.
struct Public {
    /// `host[:port]` of `console.public_url`, lowercased.
    host: String,
    origin: String,
    tls: bool,
}

impl AdminListener {
    pub fn new(api: AdminApi) -> AdminListener {
        AdminListener { api, sessions: std::sync::Arc::default(), public: None }
    }

    /// The console's own listener for `public_url` (its sessions shared with `admin`'s).
    pub fn console(admin: &AdminListener, public_url: &str, tls: bool) -> AdminListener {
        let host = public_url.split_once("://").map_or(public_url, |(_, rest)| rest).trim_end_matches('/').to_ascii_lowercase();
        AdminListener {
            api: admin.api.clone(),
            sessions: admin.sessions.clone(),
            public: Some(Public { host, origin: public_url.trim_end_matches('/').to_ascii_lowercase(), tls }),
        }
    }

    /// A request to the console's own listener: for its public host, from its own origin.
    fn refuse_foreign_public(&self, public: &Public, req: &pingora_http::RequestHeader) -> Result<(), crate::protocol::ApiError> {
        let forbidden = |reason: &'static str, message: &str| {
            self.api.metrics.counter("tollgate_admin_refused_total", &[("reason", reason)]).add(1);
            crate::protocol::ApiError::new(crate::protocol::ErrorKind::Forbidden, message)
        };
        let host = req.headers.get(http::header::HOST).and_then(|v| v.to_str().ok()).or_else(|| req.uri.authority().map(|a| a.as_str()));
        if !host.is_some_and(|h| h.eq_ignore_ascii_case(&public.host)) {
            return Err(forbidden("console_host", "The console answers only requests for its public address (console.public_url)."));
        }
        if let Some(origin) = req.headers.get(http::header::ORIGIN) {
            if !origin.to_str().is_ok_and(|o| o.eq_ignore_ascii_case(&public.origin)) {
                return Err(forbidden("console_origin", "The console does not answer requests made by other web pages."));
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl crate::edge::local::Answer for AdminListener {
    async fn answer(&self, session: &mut Session) -> Result<LocalResponse, crate::protocol::ApiError> {
        let path = session.req_header().uri.path();
        let console = path == "/console" || path.starts_with("/console/");
        match &self.public {
            // The console's own listener: the console only, never the admin API.
            Some(public) if console => {
                self.refuse_foreign_public(public, session.req_header())?;
                Ok(handle(&self.api, &self.sessions, session, if public.tls { "; Secure" } else { "" }).await)
            }
            Some(_) => Err(crate::protocol::ApiError::new(crate::protocol::ErrorKind::NotFound, "Only the console answers here.")),
            None if console => {
                // The console signs in with the token or the provider, and keeps sessions of its own.
                self.api.refuse_foreign(session.req_header())?;
                Ok(handle(&self.api, &self.sessions, session, "").await)
            }
            None => self.api.handle(session).await,
        }
    }
}

/// The signed-in browsers, by the SHA-256 of their cookie (the cookie itself is not kept).
#[derive(Default)]
struct Sessions {
    map: Mutex<HashMap<[u8; 32], Signed>>,
    /// Wrong admin tokens by client address (see `base::throttle`).
    sign_in: crate::base::throttle::Throttle<std::net::IpAddr>,
    /// New keys' secrets waiting for their one-time page (see `reveal`).
    reveals: reveal::Reveals,
    /// Sign-ins with the identity provider under way (see `signin`).
    pending: signin::Pending,
}

/// Who a console session is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Who {
    /// Signed in with the admin token: everything.
    Operator,
    /// Signed in with the identity provider: what their role allows.
    Person(crate::identity::Person),
}

impl Who {
    /// Everything is open to them.
    pub(crate) fn operates(&self) -> bool {
        match self {
            Who::Operator => true,
            Who::Person(p) => p.role() == crate::identity::Role::Operator,
        }
    }
}

#[derive(Clone)]
struct Signed {
    /// The token every form of this session carries.
    csrf: String,
    last_used: u64,
    who: Who,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Signed>> {
        self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new session of `who`: its cookie value.
    fn open(&self, now: u64, who: Who) -> String {
        let cookie = crate::base::secrets::random_base62(43);
        let mut map = self.lock();
        map.retain(|_, s| now.saturating_sub(s.last_used) < SESSION_IDLE_SECS);
        let subject = |w: &Who| match w {
            Who::Person(p) => Some(p.subject.clone()),
            Who::Operator => None,
        };
        // One person signing in again and again pushes out only their own sessions.
        if let Some(me) = subject(&who) {
            let mine: Vec<([u8; 32], u64)> =
                map.iter().filter(|(_, s)| subject(&s.who).as_deref() == Some(me.as_str())).map(|(k, s)| (*k, s.last_used)).collect();
            if mine.len() >= MAX_SESSIONS_PER_PERSON {
                if let Some((oldest, _)) = mine.iter().min_by_key(|(_, used)| *used) {
                    map.remove(oldest);
                }
            }
        }
        if map.len() >= MAX_SESSIONS {
            // People's sessions go before the admin token's.
            let oldest = map.iter().min_by_key(|(_, s)| (s.who == Who::Operator, s.last_used)).map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                map.remove(&oldest);
            }
        }
        map.insert(digest(&cookie), Signed { csrf: crate::base::secrets::random_base62(32), last_used: now, who });
        cookie
    }

    fn find(&self, cookie: &str, now: u64) -> Option<Signed> {
        let mut map = self.lock();
        let id = digest(cookie);
        let s = map.get_mut(&id)?;
        if now.saturating_sub(s.last_used) >= SESSION_IDLE_SECS {
            map.remove(&id);
            return None;
        }
        s.last_used = now;
        Some(s.clone())
    }

    fn close(&self, cookie: &str) {
        self.lock().remove(&digest(cookie));
    }
}

fn digest(cookie: &str) -> [u8; 32] {
    Sha256::digest(cookie.as_bytes()).into()
}

/// Constant-time equality of two tokens.
fn same(a: &str, b: &str) -> bool {
    same_digest(&digest(a), &digest(b))
}

/// Constant-time equality of two digests.
fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What a page handler needs of the request.
pub(crate) struct Request {
    pub method: String,
    pub path: String,
    pub query: String,
    pub form: Form,
    pub csrf: String,
    /// A person signed in as an operator by their role: who (the audit trail names them).
    pub by: Option<String>,
}

/// Decoded `application/x-www-form-urlencoded` pairs (or a query string).
#[derive(Default)]
pub(crate) struct Form(Vec<(String, String)>);

impl Form {
    pub fn parse(text: &str) -> Form {
        Form(
            text.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (crate::base::text::decode_component(k), crate::base::text::decode_component(v))
                })
                .collect(),
        )
    }

    /// The value of `name`, trimmed ("" when absent).
    pub fn get(&self, name: &str) -> &str {
        self.0.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.trim())
    }
}

/// An HTML answer with the console's headers: no caching, no framing, scripts and styles only
/// from the console itself.
pub(crate) fn html(status: u16, body: String) -> LocalResponse {
    let mut r = LocalResponse { status, body: body.into(), content_type: "text/html; charset=utf-8", headers: Vec::new() };
    r.headers.push(("cache-control", "no-store".into()));
    r.headers.push(("x-frame-options", "DENY".into()));
    r.headers.push(("referrer-policy", "same-origin".into()));
    r.headers.push(("x-content-type-options", "nosniff".into()));
    r.headers.push((
        "content-security-policy",
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
            .into(),
    ));
    r
}

/// `303 See Other` to `to` (after a post, so a reload does not post again).
pub(crate) fn redirect(to: &str) -> LocalResponse {
    let mut r = html(303, String::new());
    r.headers.push(("location", to.to_string()));
    r
}

/// Where to go after signing in: a console path only (never another site).
fn next_path(next: &str) -> &str {
    let ok = (next == "/console" || next.starts_with("/console/") || next.starts_with("/console?"))
        && !next.contains("//")
        && !next.contains('\\');
    if ok {
        next
    } else {
        "/console"
    }
}

fn cookie_of(session: &Session) -> Option<String> {
    named_cookie(session, COOKIE)
}

fn named_cookie(session: &Session, wanted: &str) -> Option<String> {
    session.req_header().headers.get_all(http::header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|header| {
        header.split(';').find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == wanted).then(|| value.to_string())
        })
    })
}

fn set_cookie(value: &str, max_age: Option<u64>, secure: &str) -> String {
    let age = max_age.map_or("; Max-Age=0".to_string(), |s| format!("; Max-Age={s}"));
    format!("{COOKIE}={value}; Path=/console; HttpOnly; SameSite=Strict{age}{secure}")
}

fn login_page(status: u16, next: &str, error: Option<&str>, provider: bool) -> LocalResponse {
    let error = error.map_or(String::new(), |e| format!("<p class=\"alert\" role=\"alert\">{}</p>", html::esc(e)));
    let error = if provider {
        format!("{error}<p class=\"card\"><a class=\"button\" id=\"oidc-sign-in\" href=\"/console/oidc/start?next={}\">Sign in with your company account</a></p><p><small>Or, for the operator, the admin token:</small></p>", html::enc(next))
    } else {
        error
    };
    html(
        status,
        html::bare(
            "Sign in",
            &format!(
                "{error}<form method=\"post\" action=\"/console/login\" class=\"card\">\
<input type=\"hidden\" name=\"next\" value=\"{}\">\
<label>Admin token<input type=\"password\" name=\"token\" autocomplete=\"current-password\" autofocus required></label>\
<p><button type=\"submit\">Sign in</button></p></form>\
<p><small>The token is the one the configuration names (<code>admin.token</code>, or the variable of <code>admin.token_env</code>); with neither set, the one in <code>data_dir/admin-token</code>.</small></p>",
                html::esc(next)
            ),
        ),
    )
}

fn refused(message: &str) -> LocalResponse {
    html(
        403,
        html::bare(
            "Refused",
            &format!("<p class=\"alert\" role=\"alert\">{}</p><p><a href=\"/console\">Back to the console</a></p>", html::esc(message)),
        ),
    )
}

/// The address the request came from.
fn peer_of(session: &Session) -> Option<std::net::IpAddr> {
    session.client_addr().and_then(|a| a.as_inet()).map(|a| crate::policy::normalize(a.ip()))
}

/// Every request under `/console` (`Host` and `Origin` are already checked).
async fn handle(api: &AdminApi, sessions: &Sessions, session: &mut Session, secure: &str) -> LocalResponse {
    let req = session.req_header();
    let method = req.method.as_str().to_string();
    let path = req.uri.path().to_string();
    let query = req.uri.query().unwrap_or_default().to_string();
    // A browser says where a request comes from; a post from another site changes nothing.
    let cross_site = req.headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()).is_some_and(|v| v == "cross-site");
    let now = crate::base::clock::now_unix();
    match (method.as_str(), path.as_str()) {
        ("GET", "/console/assets/console.css") => return asset(CSS, "text/css; charset=utf-8"),
        ("GET", "/console/assets/console.js") => return asset(JS, "text/javascript; charset=utf-8"),
        ("GET", "/console/login") => {
            let form = Form::parse(&query);
            return login_page(200, next_path(form.get("next")), None, api.identity.is_some());
        }
        ("GET", "/console/oidc/start") => {
            let form = Form::parse(&query);
            return sessions.pending.start(api, next_path(form.get("next")), secure).await;
        }
        ("GET", "/console/callback") => {
            let browser = named_cookie(session, signin::BROWSER_COOKIE);
            return match sessions.pending.callback(api, &Form::parse(&query), browser.as_deref(), peer_of(session)).await {
                Ok((who, next)) => {
                    let people_start = if who.operates() || next != "/console" { next } else { "/console/me".to_string() };
                    let cookie = sessions.open(now, who);
                    // A page of this site moves on: the Strict cookie set here would not be sent
                    // on a redirect that the provider's site began.
                    let mut r = html(
                        200,
                        html::bare(
                            "Signed in",
                            &format!(
                                "<meta http-equiv=\"refresh\" content=\"0;url={0}\"><p><a id=\"continue\" href=\"{0}\">Continue to the console</a></p>",
                                html::esc(&people_start)
                            ),
                        ),
                    );
                    r.headers.push(("set-cookie", set_cookie(&cookie, Some(SESSION_IDLE_SECS), secure)));
                    r.headers.push((
                        "set-cookie",
                        format!("{}=; Path=/console; HttpOnly; SameSite=Lax; Max-Age=0{secure}", signin::BROWSER_COOKIE),
                    ));
                    r
                }
                Err(page) => page,
            };
        }
        _ => {}
    }
    let form = if method == "POST" {
        if cross_site {
            return refused("This form was sent from another site; nothing was changed.");
        }
        match AdminApi::read_body(session).await {
            Ok(body) => Form::parse(&String::from_utf8_lossy(&body)),
            Err(e) => return html(e.status(), html::bare("Bad request", &format!("<p class=\"alert\">{}</p>", html::esc(&e.message)))),
        }
    } else {
        Form::default()
    };
    if (method.as_str(), path.as_str()) == ("POST", "/console/login") {
        let next = next_path(form.get("next")).to_string();
        let peer = peer_of(session);
        let at = std::time::Instant::now();
        if let Some(ip) = peer {
            if let Err(wait) = sessions.sign_in.admit(&ip, at) {
                api.metrics.counter("tollgate_admin_refused_total", &[("reason", "console_sign_in_throttled")]).add(1);
                let mut r = login_page(
                    429,
                    &next,
                    Some(&format!("Too many wrong tokens from this address. Try again in {wait} s.")),
                    api.identity.is_some(),
                );
                r.headers.push(("retry-after", wait.to_string()));
                return r;
            }
        }
        if !crate::base::secrets::token_matches(form.get("token"), &api.token) {
            api.metrics.counter("tollgate_admin_refused_total", &[("reason", "console_sign_in")]).add(1);
            if let Some(ip) = peer {
                sessions.sign_in.failed(&ip, at);
            }
            return login_page(401, &next, Some("Wrong admin token."), api.identity.is_some());
        }
        if let Some(ip) = peer {
            sessions.sign_in.succeeded(&ip);
        }
        let cookie = sessions.open(now, Who::Operator);
        let mut r = redirect(&next);
        r.headers.push(("set-cookie", set_cookie(&cookie, Some(SESSION_IDLE_SECS), secure)));
        return r;
    }
    let cookie = cookie_of(session);
    let Some(signed) = cookie.as_deref().and_then(|c| sessions.find(c, now)) else {
        if method == "GET" {
            let here = if query.is_empty() { path.clone() } else { format!("{path}?{query}") };
            return redirect(&format!("/console/login?next={}", html::enc(&here)));
        }
        return refused("You are not signed in (or your session ended); nothing was changed.");
    };
    if method == "POST" && !same(form.get("csrf"), &signed.csrf) {
        api.metrics.counter("tollgate_admin_refused_total", &[("reason", "console_form_token")]).add(1);
        return refused("This form is missing its token or came from another page; nothing was changed.");
    }
    if (method.as_str(), path.as_str()) == ("POST", "/console/logout") {
        if let Some(c) = cookie.as_deref() {
            sessions.close(c);
        }
        let mut r = redirect("/console/login");
        r.headers.push(("set-cookie", set_cookie("", None, secure)));
        return r;
    }
    let by = match &signed.who {
        Who::Person(p) => Some(p.label()),
        Who::Operator => None,
    };
    let request = Request { method, path, query, form, csrf: signed.csrf, by };
    match &signed.who {
        who if who.operates() => pages::route(api, &sessions.reveals, &request).await,
        Who::Person(person) => people::route(api, &sessions.reveals, &request, person).await,
        Who::Operator => pages::route(api, &sessions.reveals, &request).await,
    }
}

fn asset(text: &'static str, content_type: &'static str) -> LocalResponse {
    let mut r = LocalResponse { status: 200, body: bytes::Bytes::from_static(text.as_bytes()), content_type, headers: Vec::new() };
    r.headers.push(("cache-control", "no-cache".into()));
    r.headers.push(("x-content-type-options", "nosniff".into()));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_found_by_cookie_and_end_when_idle_or_closed() {
        let s = Sessions::default();
        let cookie = s.open(1000, Who::Operator);
        let signed = s.find(&cookie, 1000 + 60).expect("open");
        assert_eq!(signed.csrf.len(), 32);
        assert!(s.find("another", 1060).is_none());
        assert!(s.find(&cookie, 1060 + SESSION_IDLE_SECS).is_none(), "idle too long");
        let cookie = s.open(5000, Who::Operator);
        s.close(&cookie);
        assert!(s.find(&cookie, 5001).is_none());
    }

    #[test]
    fn a_person_signing_in_again_and_again_pushes_out_only_their_own_sessions() {
        let s = Sessions::default();
        let operator = s.open(1000, Who::Operator);
        let person =
            |sub: &str| Who::Person(crate::identity::person::person(&serde_json::json!({"sub": sub}), "roles", "teams").expect("a person"));
        let other = s.open(1001, person("other"));
        let mut mine = Vec::new();
        for i in 0..600 {
            mine.push(s.open(1002 + i, person("busy")));
        }
        let now = 1700;
        assert!(s.find(&operator, now).is_some(), "the operator stays signed in");
        assert!(s.find(&other, now).is_some(), "another person stays signed in");
        assert!(s.find(&mine[0], now).is_none(), "the busy person's oldest went");
        assert!(s.find(&mine[599], now).is_some());
        assert_eq!(mine.iter().filter(|c| s.find(c, now).is_some()).count(), MAX_SESSIONS_PER_PERSON);
        // Past the cap of everyone's together, people go before the admin token's sessions.
        for i in 0..MAX_SESSIONS as u64 {
            s.open(2000 + i, person(&format!("p{i}")));
        }
        assert!(s.find(&operator, 3000).is_some());
    }

    #[test]
    fn sign_in_only_returns_to_console_pages() {
        assert_eq!(next_path("/console/keys/key_1"), "/console/keys/key_1");
        assert_eq!(next_path("/console?x=1"), "/console?x=1");
        for bad in ["https://evil.example/", "//evil.example", "/console//evil", "/admin/keys", "/console\\..", ""] {
            assert_eq!(next_path(bad), "/console", "{bad}");
        }
    }

    #[test]
    fn forms_decode_and_trim() {
        let f = Form::parse("name=team+a&reason=top%20up%21&empty=&csrf=x");
        assert_eq!(f.get("name"), "team a");
        assert_eq!(f.get("reason"), "top up!");
        assert_eq!(f.get("empty"), "");
        assert_eq!(f.get("missing"), "");
    }
}
