//! An OpenID Connect provider under `/oidc`, for the offline demo and the manual: its discovery
//! document, its signing key (`conf/demo/oidc-jwks.json`: the demo's throwaway key), an
//! authorization page listing three demo people (a `login_hint` naming one skips the page), and
//! the authorization-code grant with PKCE (S256), issuing an ID token (with the request's
//! `nonce`) and an access token (for the request's `resource`, else the client) that carry the
//! person's `email` (verified), `name`, `roles` and `teams`. The issuer is
//! `http://{the Host the request named}/oidc`.
//!
//! | login | roles | teams |
//! |---|---|---|
//! | `ana` (ana@example.com) | operator | — |
//! | `bo` (bo@example.com) | team_admin | research |
//! | `cy` (cy@example.com) | member | research |

use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the provider lives on the mock.
pub(crate) const PREFIX: &str = "/oidc";
const KID: &str = "tollgate-demo-1";
const JWKS: &str = include_str!("../../../conf/demo/oidc-jwks.json");
/// The demo's throwaway key pair (the Vertex demo account's): its private half signs.
const ACCOUNT: &str = include_str!("../../../conf/demo/vertex-sa.json");
/// How long a code may wait to be exchanged.
const CODE_LIFETIME: Duration = Duration::from_secs(300);

struct Person {
    login: &'static str,
    name: &'static str,
    roles: &'static [&'static str],
    teams: &'static [&'static str],
}

const PEOPLE: [Person; 3] = [
    Person { login: "ana", name: "Ana Operator", roles: &["operator"], teams: &[] },
    Person { login: "bo", name: "Bo Lead", roles: &["team_admin"], teams: &["research"] },
    Person { login: "cy", name: "Cy Member", roles: &["member"], teams: &["research"] },
];

/// A code given out and not yet exchanged.
struct Grant {
    person: usize,
    client_id: String,
    redirect_uri: String,
    challenge: Option<String>,
    nonce: Option<String>,
    resource: Option<String>,
    issued: Instant,
}

/// An answer: status, content type, body, headers.
pub(crate) type Answer = (u16, &'static str, String, Vec<(&'static str, String)>);

pub(crate) struct Oidc {
    key: Option<jsonwebtoken::EncodingKey>,
    codes: Mutex<HashMap<String, Grant>>,
    issued: Mutex<u64>,
}

pub(crate) fn handles(path: &str) -> bool {
    path == PREFIX || path.starts_with("/oidc/")
}

fn pairs(text: &str) -> HashMap<String, String> {
    crate::wire::url_pairs(text).into_iter().collect()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn error(status: u16, code: &str, why: &str) -> Answer {
    (status, "application/json", json!({"error": code, "error_description": why}).to_string(), vec![])
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

impl Oidc {
    pub(crate) fn new() -> Oidc {
        let pem = serde_json::from_str::<Value>(ACCOUNT).ok().and_then(|a| a["private_key"].as_str().map(str::to_string));
        let key = pem.and_then(|p| jsonwebtoken::EncodingKey::from_rsa_pem(p.as_bytes()).ok());
        Oidc { key, codes: Mutex::new(HashMap::new()), issued: Mutex::new(0) }
    }

    /// Answer a request under `/oidc` (`host`: the Host it named).
    pub(crate) fn answer(&self, host: &str, method: &str, path: &str, query: &str, body: &[u8]) -> Answer {
        let issuer = format!("http://{host}{PREFIX}");
        match (method, path.strip_prefix(PREFIX).unwrap_or_default()) {
            ("GET", "/.well-known/openid-configuration") => {
                let doc = json!({
                    "issuer": issuer,
                    "authorization_endpoint": format!("{issuer}/authorize"),
                    "token_endpoint": format!("{issuer}/token"),
                    "jwks_uri": format!("{issuer}/jwks"),
                    "end_session_endpoint": format!("{issuer}/logout"),
                    "response_types_supported": ["code"],
                    "subject_types_supported": ["public"],
                    "id_token_signing_alg_values_supported": ["RS256"],
                    "code_challenge_methods_supported": ["S256"],
                    "scopes_supported": ["openid", "email", "profile"],
                    "grant_types_supported": ["authorization_code"],
                });
                (200, "application/json", doc.to_string(), vec![])
            }
            ("GET", "/jwks") => (200, "application/json", JWKS.to_string(), vec![]),
            ("GET", "/authorize") => self.authorize(query),
            ("POST", "/token") => self.token(&issuer, &pairs(&String::from_utf8_lossy(body))),
            ("GET", "/logout") => match pairs(query).get("post_logout_redirect_uri") {
                Some(back) => (302, "text/plain", String::new(), vec![("location", back.clone())]),
                None => (200, "text/html", "<p>Signed out of the demo provider.</p>".into(), vec![]),
            },
            _ => error(404, "not_found", "the demo provider has no such endpoint"),
        }
    }

    /// The authorization page, or — with a `login_hint` naming a demo person — their code.
    fn authorize(&self, query: &str) -> Answer {
        let q = pairs(query);
        let (Some(client_id), Some(redirect_uri)) = (q.get("client_id"), q.get("redirect_uri")) else {
            return error(400, "invalid_request", "client_id and redirect_uri are required");
        };
        if q.get("response_type").map(String::as_str) != Some("code") {
            return error(400, "unsupported_response_type", "only response_type=code");
        }
        if q.contains_key("code_challenge") && q.get("code_challenge_method").map(String::as_str) != Some("S256") {
            return error(400, "invalid_request", "code_challenge_method must be S256");
        }
        let hint = q.get("login_hint").map(|h| h.split('@').next().unwrap_or_default().to_string());
        let Some(person) = hint.and_then(|h| PEOPLE.iter().position(|p| p.login == h)) else {
            let links: String = PEOPLE
                .iter()
                .map(|p| {
                    format!(
                        "<li><a href=\"{PREFIX}/authorize?{}&amp;login_hint={}\">{} ({}@example.com): {}{}</a></li>",
                        escape(query),
                        p.login,
                        escape(p.name),
                        p.login,
                        p.roles.join(", "),
                        if p.teams.is_empty() { String::new() } else { format!(" of {}", p.teams.join(", ")) }
                    )
                })
                .collect();
            let page = format!("<!doctype html><title>Demo sign-in</title><h1>Sign in to the demo provider as</h1><ul>{links}</ul>");
            return (200, "text/html; charset=utf-8", page, vec![]);
        };
        let code = {
            let mut n = self.issued.lock().unwrap();
            *n += 1;
            format!("demo-code-{}-{}", *n, SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0))
        };
        let grant = Grant {
            person,
            client_id: client_id.clone(),
            redirect_uri: redirect_uri.clone(),
            challenge: q.get("code_challenge").cloned(),
            nonce: q.get("nonce").cloned(),
            resource: q.get("resource").cloned(),
            issued: Instant::now(),
        };
        self.codes.lock().unwrap().insert(code.clone(), grant);
        let mut back = format!("{redirect_uri}{}code={code}", if redirect_uri.contains('?') { '&' } else { '?' });
        if let Some(state) = q.get("state") {
            back.push_str(&format!("&state={}", state.replace('&', "%26").replace('#', "%23")));
        }
        (302, "text/plain", String::new(), vec![("location", back)])
    }

    /// The authorization-code grant: the code once, its redirect URI and client, its PKCE verifier.
    fn token(&self, issuer: &str, form: &HashMap<String, String>) -> Answer {
        use sha2::Digest;
        if form.get("grant_type").map(String::as_str) != Some("authorization_code") {
            return error(400, "unsupported_grant_type", "only authorization_code");
        }
        let Some(grant) = form.get("code").and_then(|c| self.codes.lock().unwrap().remove(c)) else {
            return error(400, "invalid_grant", "unknown or used code");
        };
        if grant.issued.elapsed() > CODE_LIFETIME || form.get("redirect_uri") != Some(&grant.redirect_uri) {
            return error(400, "invalid_grant", "the code expired or the redirect_uri differs");
        }
        if form.get("client_id").is_some_and(|c| *c != grant.client_id) {
            return error(400, "invalid_client", "the code was given to another client");
        }
        if let Some(challenge) = &grant.challenge {
            let verifier = form.get("code_verifier").map(String::as_str).unwrap_or_default();
            let digest = sha2::Sha256::digest(verifier.as_bytes());
            use base64::Engine;
            if base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest) != *challenge {
                return error(400, "invalid_grant", "the code_verifier does not match the code_challenge");
            }
        }
        let Some(key) = &self.key else { return error(500, "server_error", "the demo key cannot sign") };
        let p = &PEOPLE[grant.person];
        let now = now();
        let person = json!({
            "iss": issuer, "sub": format!("demo-{}", p.login), "iat": now, "exp": now + 3600,
            "email": format!("{}@example.com", p.login), "email_verified": true, "name": p.name,
            "roles": p.roles, "teams": p.teams,
        });
        let with = |extra: Value| {
            let mut claims = person.clone();
            if let (Some(c), Some(e)) = (claims.as_object_mut(), extra.as_object()) {
                c.extend(e.clone());
            }
            let header = jsonwebtoken::Header { kid: Some(KID.into()), ..jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256) };
            jsonwebtoken::encode(&header, &claims, key).unwrap_or_default()
        };
        let id_token = with(json!({"aud": grant.client_id, "nonce": grant.nonce}));
        let access_token = with(json!({"aud": grant.resource.clone().unwrap_or(grant.client_id.clone()), "scope": "openid email profile"}));
        let answer = json!({"access_token": access_token, "id_token": id_token, "token_type": "Bearer", "expires_in": 3600});
        (200, "application/json", answer.to_string(), vec![("cache-control", "no-store".to_string())])
    }
}
