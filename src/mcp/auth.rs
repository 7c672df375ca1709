//! What tollgate sends an MCP server to be let in: configured headers, or a bearer token of the
//! OAuth 2.0 client-credentials grant, fetched when needed and kept until shortly before it
//! expires (or the server refuses it). Never a client's key.

use super::error::McpError;
use std::time::{Duration, Instant};

/// A token is fetched again this long before its `expires_in` ends.
const EARLY: Duration = Duration::from_secs(30);

/// A server's credentials.
pub struct Credentials {
    kind: Kind,
}

enum Kind {
    Fixed(Vec<(String, String)>),
    ClientCredentials {
        token_url: String,
        client_id: String,
        client_secret: String,
        scope: Option<String>,
        http: reqwest::Client,
        /// The token and when it is to be fetched again.
        token: tokio::sync::Mutex<Option<(String, Instant)>>,
    },
}

impl Credentials {
    /// Headers sent as they are.
    pub fn fixed(headers: Vec<(String, String)>) -> Credentials {
        Credentials { kind: Kind::Fixed(headers) }
    }

    /// The credentials `auth` configures; `http` fetches tokens.
    pub fn of(auth: &crate::config::McpAuth, http: reqwest::Client) -> Credentials {
        use crate::config::McpAuth;
        match auth {
            McpAuth::None => Credentials::fixed(Vec::new()),
            McpAuth::Headers(h) => Credentials::fixed(h.clone()),
            McpAuth::ClientCredentials { token_url, client_id, client_secret, scope } => Credentials {
                kind: Kind::ClientCredentials {
                    token_url: token_url.clone(),
                    client_id: client_id.clone(),
                    client_secret: client_secret.clone(),
                    scope: scope.clone(),
                    http,
                    token: tokio::sync::Mutex::new(None),
                },
            },
        }
    }

    /// Whether a refusal (401) may be cured by fetching a new token.
    pub fn renewable(&self) -> bool {
        matches!(self.kind, Kind::ClientCredentials { .. })
    }

    /// The server refused the token: the next request fetches another.
    pub async fn refused(&self) {
        if let Kind::ClientCredentials { token, .. } = &self.kind {
            *token.lock().await = None;
        }
    }

    /// The headers to send now.
    pub async fn headers(&self) -> Result<Vec<(String, String)>, McpError> {
        let (token_url, client_id, client_secret, scope, http, token) = match &self.kind {
            Kind::Fixed(h) => return Ok(h.clone()),
            Kind::ClientCredentials { token_url, client_id, client_secret, scope, http, token } => {
                (token_url, client_id, client_secret, scope, http, token)
            }
        };
        let mut held = token.lock().await;
        if let Some((t, _)) = held.as_ref().filter(|(_, until)| Instant::now() < *until) {
            return Ok(vec![("authorization".into(), format!("Bearer {t}"))]);
        }
        let mut form = vec![("grant_type", "client_credentials")];
        if let Some(s) = scope {
            form.push(("scope", s));
        }
        let resp = http
            .post(token_url)
            .basic_auth(client_id, Some(client_secret))
            .form(&form)
            .send()
            .await
            .map_err(|e| McpError::Unreachable(format!("token endpoint: {}", e.without_url())))?;
        let status = resp.status().as_u16();
        let body: serde_json::Value = resp.json().await.map_err(|e| McpError::Malformed(format!("token endpoint: {}", e.without_url())))?;
        let Some(access) = body.get("access_token").and_then(serde_json::Value::as_str).filter(|_| status == 200) else {
            let why = body.get("error").and_then(serde_json::Value::as_str).unwrap_or("no access_token");
            return Err(McpError::Malformed(format!("token endpoint answered {status}: {why}")));
        };
        let lasts = Duration::from_secs(body.get("expires_in").and_then(serde_json::Value::as_u64).unwrap_or(300));
        *held = Some((access.to_string(), Instant::now() + lasts.saturating_sub(EARLY)));
        Ok(vec![("authorization".into(), format!("Bearer {access}"))])
    }
}
