//! The OpenID Connect provider of `identity.oidc`: its discovery document and signing keys,
//! fetched at start and kept fresh in the background (and again, at most every 30 s, when a
//! token names a key not seen yet), and the verification of the tokens it issues — a client's
//! access token presented instead of a gateway key, a person's ID token at console sign-in.
//!
//! A token is accepted only when it is a JWS signed with an asymmetric algorithm (RSA, RSA-PSS,
//! ECDSA, EdDSA — never `none`, never HMAC, whose key would be the client secret), by a key of
//! the provider's JWKS (by `kid`; the key's own `alg`, when it names one, must be the
//! token's), issued by the configured issuer exactly, for the audience asked, not expired and
//! not used before its time (both with `clock_skew_secs`). The provider's documents are never
//! fetched on a request's path but for an unknown key, and a provider that is down never stops
//! gateway keys or the admin token.

pub mod person;

use crate::config::OidcConfig;
use arc_swap::ArcSwapOption;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use person::{Person, Role};

/// The signing algorithms a token may use.
const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// The fewest seconds between two fetches for an unknown key.
const REFETCH_SECS: u64 = 30;

/// What the provider's discovery document says, and its signing keys.
pub struct Provider {
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub end_session_endpoint: Option<String>,
    keys: Vec<SigningKey>,
}

struct SigningKey {
    kid: Option<String>,
    alg: Option<Algorithm>,
    key: DecodingKey,
}

/// Why the provider's documents could not be read (the sign-in page and the log say it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderError {
    /// The HTTP client could not be built.
    Client(String),
    /// A document could not be fetched, or was not JSON: its URL and why.
    Fetch { url: String, why: String },
    /// A document does not say what it must.
    Document(String),
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProviderError::Client(why) => write!(f, "identity client: {why}"),
            ProviderError::Fetch { url, why } => write!(f, "{url}: {why}"),
            ProviderError::Document(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ProviderError {}

/// Why an authorization code gave no person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExchangeError {
    /// The token endpoint could not be reached (or the provider not read yet).
    Unreachable(String),
    /// It answered without an ID token.
    Refused(String),
    /// The ID token does not hold.
    Token(VerifyError),
}

impl std::fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExchangeError::Unreachable(why) => write!(f, "the token endpoint could not be reached: {why}"),
            ExchangeError::Refused(why) => write!(f, "the code exchange was refused: {why}"),
            ExchangeError::Token(e) => write!(f, "the ID token was refused: {e}"),
        }
    }
}

/// Why a token was not accepted (the client is told only that it was not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyError {
    /// Not a JWS this gateway takes (shape, algorithm).
    Malformed(String),
    /// Signed by a key the provider's JWKS does not hold (or it has not been fetched).
    UnknownKey,
    /// Signature, issuer, audience, time or nonce wrong.
    Invalid(String),
}

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VerifyError::Malformed(why) => write!(f, "not a token this gateway takes: {why}"),
            VerifyError::UnknownKey => write!(f, "signed by a key the identity provider does not list"),
            VerifyError::Invalid(why) => write!(f, "{why}"),
        }
    }
}

/// Whether a bearer credential is shaped like a JWT (three base64url parts, a JSON header):
/// gateway keys never are.
pub fn looks_like_jwt(token: &str) -> bool {
    token.starts_with("eyJ") && token.bytes().filter(|b| *b == b'.').count() == 2
}

pub struct Identity {
    pub cfg: OidcConfig,
    http: reqwest::Client,
    provider: ArcSwapOption<Provider>,
    /// One fetch at a time; when the last one began.
    fetching: tokio::sync::Mutex<Option<Instant>>,
    /// Why the last fetch failed (for the sign-in page and `/readyz`-style reports).
    last_error: Mutex<Option<String>>,
}

impl Identity {
    pub fn new(cfg: OidcConfig) -> Result<Identity, ProviderError> {
        let http = crate::base::outbound::Outbound {
            connect: Some(Duration::from_secs(5)),
            total: Some(Duration::from_secs(10)),
            follow_redirects: false,
            ..Default::default()
        }
        .client()
        .map_err(|e| ProviderError::Client(e.to_string()))?;
        Ok(Identity { cfg, http, provider: ArcSwapOption::empty(), fetching: tokio::sync::Mutex::new(None), last_error: Mutex::new(None) })
    }

    /// The provider as last fetched (None until a fetch succeeded).
    pub fn provider(&self) -> Option<Arc<Provider>> {
        self.provider.load_full()
    }

    /// Why the provider could not be reached last time, if it could not.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    async fn get_json(&self, url: &str) -> Result<Value, ProviderError> {
        let failed = |why: String| ProviderError::Fetch { url: url.to_string(), why };
        let resp = self.http.get(url).send().await.map_err(|e| failed(e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(failed(format!("answered {status}")));
        }
        resp.json().await.map_err(|e| failed(format!("not JSON ({e})")))
    }

    /// Fetch the discovery document and the JWKS (`force`: even if fetched within the last
    /// 30 s). Keeps the previous keys when the provider cannot be reached.
    pub async fn refresh(&self, force: bool) -> Result<(), ProviderError> {
        let mut last = self.fetching.lock().await;
        if !force && last.is_some_and(|at| at.elapsed() < Duration::from_secs(REFETCH_SECS)) {
            return Ok(());
        }
        *last = Some(Instant::now());
        let result = self.fetch().await;
        let mut error = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(provider) => {
                log::info!("identity: {} keys of {} loaded", provider.keys.len(), self.cfg.issuer);
                self.provider.store(Some(Arc::new(provider)));
                *error = None;
                Ok(())
            }
            Err(e) => {
                log::warn!("identity: the provider {} could not be read: {e}", self.cfg.issuer);
                *error = Some(e.to_string());
                Err(e)
            }
        }
    }

    async fn fetch(&self) -> Result<Provider, ProviderError> {
        let doc = self.get_json(&format!("{}/.well-known/openid-configuration", self.cfg.issuer)).await?;
        let field = |name: &str| doc.get(name).and_then(Value::as_str).map(str::to_string);
        // The document must be the issuer's own (OpenID Connect Discovery §4.3).
        if field("issuer").as_deref().map(|i| i.trim_end_matches('/')) != Some(self.cfg.issuer.as_str()) {
            return Err(ProviderError::Document(format!(
                "its discovery document names the issuer {:?}, not {}",
                field("issuer"),
                self.cfg.issuer
            )));
        }
        let missing = |name: &str| ProviderError::Document(format!("its discovery document has no {name}"));
        let jwks_uri = field("jwks_uri").ok_or_else(|| missing("jwks_uri"))?;
        let jwks = self.get_json(&jwks_uri).await?;
        let mut keys = Vec::new();
        for raw in jwks.get("keys").and_then(Value::as_array).into_iter().flatten() {
            if raw.get("use").and_then(Value::as_str).is_some_and(|u| u != "sig") {
                continue;
            }
            let Ok(jwk) = serde_json::from_value::<jsonwebtoken::jwk::Jwk>(raw.clone()) else { continue };
            if matches!(jwk.algorithm, jsonwebtoken::jwk::AlgorithmParameters::OctetKey(_)) {
                continue;
            }
            let alg = match jwk.common.key_algorithm.map(|a| a.to_string().parse::<Algorithm>()) {
                Some(Ok(a)) if ALGORITHMS.contains(&a) => Some(a),
                Some(_) => continue,
                None => None,
            };
            if let Ok(key) = DecodingKey::from_jwk(&jwk) {
                keys.push(SigningKey { kid: jwk.common.key_id.clone(), alg, key });
            }
        }
        if keys.is_empty() {
            return Err(ProviderError::Document(format!("{jwks_uri} holds no signing key this gateway can use")));
        }
        Ok(Provider {
            authorization_endpoint: field("authorization_endpoint").ok_or_else(|| missing("authorization_endpoint"))?,
            token_endpoint: field("token_endpoint").ok_or_else(|| missing("token_endpoint"))?,
            end_session_endpoint: field("end_session_endpoint"),
            keys,
        })
    }

    /// Verify `token` for `audience` (and, for an ID token, its `nonce`) against the keys held
    /// now; its claims.
    pub fn verify(&self, token: &str, audience: &str, nonce: Option<&str>) -> Result<Value, VerifyError> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| VerifyError::Malformed(e.to_string()))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(VerifyError::Malformed(format!("{:?} is not an algorithm this gateway takes", header.alg)));
        }
        let provider = self.provider().ok_or(VerifyError::UnknownKey)?;
        let candidates: Vec<&SigningKey> = match &header.kid {
            Some(kid) => provider.keys.iter().filter(|k| k.kid.as_deref() == Some(kid.as_str())).collect(),
            None => provider.keys.iter().collect(),
        };
        if candidates.is_empty() {
            return Err(VerifyError::UnknownKey);
        }
        let mut validation = Validation::new(header.alg);
        validation.algorithms = vec![header.alg];
        validation.set_issuer(&[&self.cfg.issuer, &format!("{}/", self.cfg.issuer)]);
        validation.set_audience(&[audience]);
        validation.leeway = self.cfg.clock_skew_secs;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let mut last = VerifyError::UnknownKey;
        for key in candidates {
            if key.alg.is_some_and(|a| a != header.alg) {
                last = VerifyError::Invalid("the token's algorithm is not its key's".into());
                continue;
            }
            match jsonwebtoken::decode::<Value>(token, &key.key, &validation) {
                Ok(data) => {
                    if let Some(expected) = nonce {
                        if data.claims.get("nonce").and_then(Value::as_str) != Some(expected) {
                            return Err(VerifyError::Invalid("the sign-in's nonce does not match".into()));
                        }
                    }
                    return Ok(data.claims);
                }
                Err(e) => last = VerifyError::Invalid(e.to_string()),
            }
        }
        Err(last)
    }

    /// [`Identity::verify`], fetching the provider's keys again first when the token names a
    /// key not held (at most every 30 s).
    pub async fn verify_fetching(&self, token: &str, audience: &str, nonce: Option<&str>) -> Result<Value, VerifyError> {
        match self.verify(token, audience, nonce) {
            Err(VerifyError::UnknownKey) => {
                if let Err(e) = self.refresh(false).await {
                    log::debug!("identity: {e}");
                }
                self.verify(token, audience, nonce)
            }
            other => other,
        }
    }

    /// The end of an authorization-code sign-in (with PKCE): `code` exchanged at the token
    /// endpoint (with the client secret when one is configured), the ID token verified for
    /// this client and `nonce`; its claims.
    pub async fn exchange_code(&self, code: &str, redirect_uri: &str, verifier: &str, nonce: &str) -> Result<Value, ExchangeError> {
        let provider = self.provider().ok_or(ExchangeError::Unreachable("no discovery document yet".into()))?;
        let cfg = &self.cfg;
        let mut form =
            vec![("grant_type", "authorization_code"), ("code", code), ("redirect_uri", redirect_uri), ("code_verifier", verifier)];
        let mut req = self.http.post(&provider.token_endpoint);
        match &cfg.client_secret {
            Some(secret) => {
                req = req.basic_auth(crate::base::text::encode_component(&cfg.client_id), Some(crate::base::text::encode_component(secret)))
            }
            None => form.push(("client_id", cfg.client_id.as_str())),
        }
        let answer = req.form(&form).send().await.map_err(|e| ExchangeError::Unreachable(e.to_string()))?;
        let status = answer.status();
        let body: Value = answer.json().await.unwrap_or_default();
        let Some(id_token) = body.get("id_token").and_then(Value::as_str).filter(|_| status.is_success()) else {
            return Err(ExchangeError::Refused(format!("{status}: {}", body.get("error").unwrap_or(&Value::Null))));
        };
        self.verify_fetching(id_token, &cfg.client_id, Some(nonce)).await.map_err(ExchangeError::Token)
    }

    /// The provider as last fetched, or — when none was yet — as one fetch now finds it.
    pub async fn provider_now(&self) -> Option<Arc<Provider>> {
        if let Some(p) = self.provider() {
            return Some(p);
        }
        let _ = self.refresh(false).await;
        self.provider()
    }

    /// Where a browser begins a sign-in of this client at `provider`: the authorization-code
    /// request with PKCE (S256) for `redirect_uri`, with `state` and `nonce`.
    pub fn authorization_url(&self, provider: &Provider, redirect_uri: &str, state: &str, nonce: &str, verifier: &str) -> String {
        use base64::Engine;
        let challenge =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(<sha2::Sha256 as sha2::Digest>::digest(verifier.as_bytes()));
        let enc = crate::base::text::encode_component;
        let sep = if provider.authorization_endpoint.contains('?') { '&' } else { '?' };
        format!(
            "{}{sep}response_type=code&client_id={}&redirect_uri={}&scope={}&state={}&nonce={}&code_challenge={challenge}&code_challenge_method=S256",
            provider.authorization_endpoint,
            enc(&self.cfg.client_id),
            enc(redirect_uri),
            enc(&self.cfg.scopes.join(" ")),
            enc(state),
            enc(nonce),
        )
    }

    /// The person `claims` name.
    pub fn person(&self, claims: &Value) -> Option<Person> {
        person::person(claims, &self.cfg.claim_roles, &self.cfg.claim_teams)
    }

    /// What a person's key is found by: a string no client can present as a key (it holds NUL
    /// bytes, which no header value may), unique per issuer and subject.
    pub fn person_secret(&self, subject: &str) -> String {
        format!("\0idp\0{}\0{subject}", self.cfg.issuer)
    }
}

/// Keeps the provider's documents fresh: at start, then every 10 minutes (every 30 s while it
/// cannot be reached).
pub struct KeyRefresh {
    pub identity: Arc<Identity>,
}

#[async_trait::async_trait]
impl pingora_core::services::background::BackgroundService for KeyRefresh {
    async fn start(&self, mut shutdown: pingora_core::server::ShutdownWatch) {
        loop {
            let every = match self.identity.refresh(true).await {
                Ok(()) => Duration::from_secs(600),
                Err(_) => Duration::from_secs(REFETCH_SECS),
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    /// An identity whose provider holds one ES256 key `k1`; its private key for signing.
    fn identity() -> (Identity, EncodingKey) {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cfg = OidcConfig {
            issuer: "https://idp.example.com".into(),
            client_id: "tollgate".into(),
            client_secret: None,
            client_secret_env: None,
            scopes: vec!["openid".into()],
            claim_roles: "roles".into(),
            claim_teams: "teams".into(),
            audience: "https://api.example.com".into(),
            group: "default".into(),
            allowance_nanos: 0,
            clock_skew_secs: 0,
        };
        let id = Identity::new(cfg).unwrap();
        let key = DecodingKey::from_ec_pem(pair.public_key_pem().as_bytes()).unwrap();
        id.provider.store(Some(Arc::new(Provider {
            authorization_endpoint: "https://idp.example.com/auth".into(),
            token_endpoint: "https://idp.example.com/token".into(),
            end_session_endpoint: None,
            keys: vec![SigningKey { kid: Some("k1".into()), alg: Some(Algorithm::ES256), key }],
        })));
        (id, EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap())
    }

    fn token(key: &EncodingKey, kid: &str, claims: serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.into());
        encode(&header, &claims, key).unwrap()
    }

    #[test]
    fn only_the_providers_own_unexpired_tokens_for_this_audience_and_sign_in_are_taken() {
        let (id, key) = identity();
        let now = crate::base::clock::now_unix();
        let good = json!({"iss": "https://idp.example.com", "aud": "https://api.example.com", "sub": "u1", "exp": now + 60, "nonce": "n1"});
        let claims = id.verify(&token(&key, "k1", good.clone()), "https://api.example.com", Some("n1")).unwrap();
        assert_eq!(claims["sub"], "u1");
        let invalid =
            |claims: serde_json::Value, nonce: Option<&str>| id.verify(&token(&key, "k1", claims), "https://api.example.com", nonce);
        let mut other_aud = good.clone();
        other_aud["aud"] = json!("https://else.example.com");
        let mut other_iss = good.clone();
        other_iss["iss"] = json!("https://evil.example.com");
        let mut expired = good.clone();
        expired["exp"] = json!(now - 10);
        let mut early = good.clone();
        early["nbf"] = json!(now + 3600);
        let mut nobody = good.clone();
        nobody.as_object_mut().unwrap().remove("sub");
        for (what, claims, nonce) in [
            ("another nonce", good.clone(), Some("n2")),
            ("another audience", other_aud, None),
            ("another issuer", other_iss, None),
            ("expired", expired, None),
            ("not yet valid", early, None),
            ("no subject", nobody, None),
        ] {
            assert!(matches!(invalid(claims, nonce), Err(VerifyError::Invalid(_))), "{what}");
        }
        // A key the provider does not list; a token with no signature; one signed with HMAC.
        assert_eq!(id.verify(&token(&key, "k2", good.clone()), "https://api.example.com", None), Err(VerifyError::UnknownKey));
        let (_, body) = token(&key, "k1", good.clone()).split_once('.').map(|(h, r)| (h.to_string(), r.to_string())).unwrap();
        let payload = body.split('.').next().unwrap();
        let unsigned = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}.");
        assert!(matches!(id.verify(&unsigned, "https://api.example.com", None), Err(VerifyError::Malformed(_))));
        let hmac = encode(&Header::new(Algorithm::HS256), &good, &EncodingKey::from_secret(b"client secret")).unwrap();
        assert!(matches!(id.verify(&hmac, "https://api.example.com", None), Err(VerifyError::Malformed(_))));
        // Tampered: the payload of another token under this one's signature.
        let mut more = good.clone();
        more["sub"] = json!("admin");
        let (h, _, sig) = {
            let t = token(&key, "k1", good);
            let parts: Vec<String> = t.split('.').map(str::to_string).collect();
            (parts[0].clone(), parts[1].clone(), parts[2].clone())
        };
        let forged_payload = token(&key, "k1", more).split('.').nth(1).unwrap().to_string();
        assert!(matches!(id.verify(&format!("{h}.{forged_payload}.{sig}"), "https://api.example.com", None), Err(VerifyError::Invalid(_))));
    }

    #[test]
    fn only_jwt_shaped_bearers_are_tried_as_tokens() {
        assert!(looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"));
        assert!(!looks_like_jwt("sk-tg-abc"));
        assert!(!looks_like_jwt("eyJ.only-one-dot"));
    }
}
