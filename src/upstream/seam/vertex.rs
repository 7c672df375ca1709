//! Google Vertex AI: Gemini models in the generate-content protocol and Anthropic's models in
//! the messages protocol, under one project and location, signed in with a service account.
//!
//! * Gemini: `/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:`
//!   `generateContent`, `streamGenerateContent?alt=sse`, `countTokens` — the request as a
//!   generate-content client sends it.
//! * Anthropic (`claude-…`): `…/publishers/anthropic/models/{model}:rawPredict` or
//!   `:streamRawPredict`, the messages body without `model` and with
//!   `anthropic_version: vertex-2023-10-16`; the answer is the messages protocol's.
//!
//! The token: an RS256-signed JWT assertion (the service account's key, its `private_key_id` as
//! `kid`) exchanged at the key file's `token_uri` (see [`super::token`]).

use super::token::{Grant, TokenRequest, TokenSource};
use super::{edit_members, set, Call, Seam, SeamError};
use crate::config::cloud::{ServiceAccount, VERTEX_SCOPE};
use crate::config::Protocol;
use crate::route::Route;
use crate::upstream::path::Destination;
use bytes::Bytes;
use pingora_http::RequestHeader;

/// The `anthropic_version` Vertex's Anthropic models take, in the body (as JSON text).
const VERSION_JSON: &str = "\"vertex-2023-10-16\"";

/// How long an assertion asks its token to live (Google's most).
const ASSERTION_SECS: u64 = 3600;

pub struct Vertex {
    /// `/v1/projects/{project}/locations/{location}/publishers`.
    publishers: String,
    tokens: TokenSource,
}

impl Vertex {
    pub fn new(config: &crate::config::cloud::Vertex, provider: &str) -> Vertex {
        Vertex {
            publishers: format!("/v1/projects/{}/locations/{}/publishers", config.project, config.location),
            tokens: TokenSource::new(provider, Box::new(JwtBearer::new(&config.account))),
        }
    }
}

impl Seam for Vertex {
    fn serves(&self, route: &Route, wire: Protocol, translated: bool) -> bool {
        match wire {
            // Token counting for Anthropic's models is not offered through rawPredict.
            Protocol::Anthropic => matches!(route, Route::Messages) || (translated && !crate::translate::counts(route)),
            Protocol::Gemini => translated || matches!(route, Route::GenerateContent { .. } | Route::GeminiCountTokens { .. }),
            Protocol::Openai => false,
        }
    }

    fn target(&self, call: &Call<'_>, prefix: &str) -> String {
        let base = format!("{prefix}{}", self.publishers);
        if call.wire == Protocol::Anthropic {
            let method = if call.stream { "streamRawPredict" } else { "rawPredict" };
            return format!("{base}/anthropic/models/{}:{method}", call.model);
        }
        let method = match call.to {
            Destination::Translated(t) if t.count => "countTokens",
            Destination::Translated(t) if t.stream => "streamGenerateContent?alt=sse",
            Destination::Translated(_) => "generateContent",
            Destination::Relayed(Route::GeminiCountTokens { .. }) => "countTokens",
            Destination::Relayed(route) => {
                let alt = crate::upstream::path::upstream_query(call.client.uri.query(), route);
                return match (call.stream, alt) {
                    (true, Some(q)) => format!("{base}/google/models/{}:streamGenerateContent?{q}", call.model),
                    (true, None) => format!("{base}/google/models/{}:streamGenerateContent", call.model),
                    (false, _) => format!("{base}/google/models/{}:generateContent", call.model),
                };
            }
        };
        format!("{base}/google/models/{}:{method}", call.model)
    }

    fn body(&self, call: &Call<'_>, body: &Bytes) -> Result<Bytes, SeamError> {
        if call.wire != Protocol::Anthropic {
            return Ok(body.clone());
        }
        edit_members(body, &[("anthropic_version", VERSION_JSON)], &["model"], true)
    }

    fn tokens(&self) -> Option<&TokenSource> {
        Some(&self.tokens)
    }

    fn authenticate(
        &self,
        req: &mut RequestHeader,
        _key: usize,
        token: Option<&http::HeaderValue>,
        _call: &Call<'_>,
        _body: &[u8],
    ) -> Result<(), SeamError> {
        let token = token.ok_or_else(|| SeamError::Credentials("no Vertex AI token".into()))?;
        set(req, "authorization", token.clone())
    }
}

/// The JWT-bearer grant of a service account: an assertion signed with its key.
struct JwtBearer {
    email: String,
    kid: Option<String>,
    token_uri: String,
    /// None: the key did not parse (the configuration checks it first).
    key: Option<jsonwebtoken::EncodingKey>,
}

impl JwtBearer {
    fn new(account: &ServiceAccount) -> JwtBearer {
        JwtBearer {
            email: account.client_email.clone(),
            kid: account.private_key_id.clone(),
            token_uri: account.token_uri.clone(),
            key: jsonwebtoken::EncodingKey::from_rsa_pem(account.private_key.as_bytes()).ok(),
        }
    }

    /// The signed assertion, issued at `now` (Unix seconds).
    fn assertion(&self, now: u64) -> Result<String, SeamError> {
        #[derive(serde::Serialize)]
        struct Claims<'a> {
            iss: &'a str,
            scope: &'a str,
            aud: &'a str,
            iat: u64,
            exp: u64,
        }
        let key = self.key.as_ref().ok_or_else(|| SeamError::Credentials("the service account's private key does not parse".into()))?;
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = self.kid.clone();
        let claims = Claims { iss: &self.email, scope: VERTEX_SCOPE, aud: &self.token_uri, iat: now, exp: now + ASSERTION_SECS };
        jsonwebtoken::encode(&header, &claims, key).map_err(|e| SeamError::Credentials(format!("signing the assertion failed ({e})")))
    }
}

impl Grant for JwtBearer {
    fn request(&self) -> Result<TokenRequest, SeamError> {
        let now = crate::base::clock::now_ms() / 1000;
        let form = vec![("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer".to_string()), ("assertion", self.assertion(now)?)];
        Ok((self.token_uri.clone(), form))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::call;
    use super::*;

    fn account() -> ServiceAccount {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/demo/vertex-sa.json");
        crate::config::cloud::service_account(&path).unwrap()
    }

    fn vertex() -> Vertex {
        let config = crate::config::cloud::Vertex { project: "proj-1".into(), location: "us-east5".into(), account: account() };
        Vertex::new(&config, "vx")
    }

    #[test]
    fn gemini_models_go_to_the_google_publisher_and_claude_to_raw_predict_without_a_model() {
        let seam = vertex();
        let client = RequestHeader::build("POST", b"/v1beta/models/g:streamGenerateContent?alt=sse&key=leak", None).unwrap();
        let route = Route::GenerateContent { model: "g".into(), stream: true };
        let mut c = call(&client, &route, "gemini-2.5-pro", "g", Protocol::Gemini);
        c.stream = true;
        assert_eq!(
            seam.target(&c, ""),
            "/v1/projects/proj-1/locations/us-east5/publishers/google/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
        );
        let messages_client = RequestHeader::build("POST", b"/v1/messages", None).unwrap();
        let messages = Route::Messages;
        let mut c = call(&messages_client, &messages, "claude-sonnet-4-6@20260101", "beta-sonnet", Protocol::Anthropic);
        assert_eq!(
            seam.target(&c, "/p"),
            "/p/v1/projects/proj-1/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-6@20260101:rawPredict"
        );
        c.stream = true;
        assert!(seam.target(&c, "").ends_with(":streamRawPredict"));
        let body = seam.body(&c, &Bytes::from_static(br#"{"model":"beta-sonnet","max_tokens":5,"stream":true,"messages":[]}"#)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v.get("model"), None);
        assert_eq!(v["anthropic_version"], "vertex-2023-10-16");
        assert_eq!(v["max_tokens"], 5);
        assert!(!seam.serves(&Route::CountTokens, Protocol::Anthropic, false), "no token counting for Claude on Vertex");
        assert!(seam.serves(&Route::GeminiCountTokens { model: "g".into() }, Protocol::Gemini, false));
    }

    #[test]
    fn the_assertion_is_an_rs256_jwt_for_the_token_uri_verifiable_with_the_accounts_public_key() {
        let grant = JwtBearer::new(&account());
        let jwt = grant.assertion(1_800_000_000).unwrap();
        let public = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/demo/vertex-sa.pub.pem")).unwrap();
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        validation.validate_exp = false;
        validation.set_audience(&["http://127.0.0.1:9100/token"]);
        let decoded =
            jsonwebtoken::decode::<serde_json::Value>(&jwt, &jsonwebtoken::DecodingKey::from_rsa_pem(&public).unwrap(), &validation)
                .unwrap();
        assert_eq!(decoded.header.kid.as_deref(), Some("0123456789abcdef0123456789abcdef01234567"));
        assert_eq!(decoded.claims["iss"], "tollgate-test@tollgate-test.iam.gserviceaccount.com");
        assert_eq!(decoded.claims["scope"], VERTEX_SCOPE);
        assert_eq!(decoded.claims["exp"].as_u64(), Some(1_800_000_000 + 3600));
        let (url, form) = grant.request().unwrap();
        assert_eq!(url, "http://127.0.0.1:9100/token");
        assert_eq!(form[0], ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer".to_string()));
    }
}
