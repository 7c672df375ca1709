//! tollgate's own access tokens for Claude Code's gateway sign-in: JWTs signed with an Ed25519
//! key this gateway keeps (in the store, the same for every node of a fleet), carrying who the
//! person is (`sub`, `email`, `name`), their teams (`groups`, which the client reads for its
//! telemetry) and `exp`. A token says who; whether they may still call is decided at each
//! request by their key (disabled: refused at once, not at expiry).

use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// The issuer and audience every token of this gateway names.
pub const ISSUER: &str = "tollgate";
pub const AUDIENCE: &str = "claude-code";
/// The prefix of this gateway's key ids (a token whose `kid` has it is never the provider's).
pub const KID_PREFIX: &str = "tg1-";

/// What an access token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub aud: String,
    /// The provider's subject.
    pub sub: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// What is shown for them.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Their teams here (account names).
    #[serde(default)]
    pub groups: Vec<String>,
    /// The teams they run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admin_of: Vec<String>,
    /// Operator (`operator`), else none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    pub iat: u64,
    pub exp: u64,
    /// Its own id (two tokens made in the same second still differ).
    #[serde(default)]
    pub jti: String,
}

/// Why a token was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// Not one of this gateway's (another `kid`, not a JWT).
    NotOurs,
    /// Ours, but its signature, audience or time does not hold.
    Invalid(String),
    /// The key could not be made or read.
    Key(String),
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenError::NotOurs => f.write_str("not a token of this gateway"),
            TokenError::Invalid(why) => write!(f, "invalid token: {why}"),
            TokenError::Key(why) => write!(f, "signing key: {why}"),
        }
    }
}

/// The signing key as stored: its id and its PKCS#8 document (base64).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredKey {
    pub kid: String,
    pub pkcs8: String,
}

impl StoredKey {
    /// A new Ed25519 key.
    pub fn generate() -> Result<StoredKey, TokenError> {
        let rng = ring::rand::SystemRandom::new();
        let doc = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).map_err(|e| TokenError::Key(e.to_string()))?;
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(doc.as_ref()).map_err(|e| TokenError::Key(e.to_string()))?;
        use ring::signature::KeyPair;
        let id = crate::access::auth::hex(&<sha2::Sha256 as sha2::Digest>::digest(pair.public_key().as_ref()));
        Ok(StoredKey { kid: format!("{KID_PREFIX}{}", &id[..16]), pkcs8: base64::engine::general_purpose::STANDARD.encode(doc.as_ref()) })
    }
}

/// The key in use: signs and verifies.
pub struct Keys {
    kid: String,
    encoding: EncodingKey,
    decoding: DecodingKey,
    /// A secret derived from the private key for what this gateway seals itself (device codes,
    /// sign-in states): the same on every node.
    pub seal: [u8; 32],
}

impl Keys {
    pub fn from_stored(stored: &StoredKey) -> Result<Keys, TokenError> {
        let doc = base64::engine::general_purpose::STANDARD.decode(&stored.pkcs8).map_err(|e| TokenError::Key(e.to_string()))?;
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(&doc).map_err(|e| TokenError::Key(e.to_string()))?;
        use ring::signature::KeyPair;
        let decoding = DecodingKey::from_ed_der(pair.public_key().as_ref());
        let seal = crate::base::secrets::hmac_sha256(&doc, b"tollgate sign-in seal");
        Ok(Keys { kid: stored.kid.clone(), encoding: EncodingKey::from_ed_der(&doc), decoding, seal })
    }

    /// A signed token of `claims`.
    pub fn sign(&self, claims: &Claims) -> Result<String, TokenError> {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).map_err(|e| TokenError::Key(e.to_string()))
    }

    /// The claims of `token` when it is one of this gateway's and holds at `now`.
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::NotOurs)?;
        if !header.kid.as_deref().is_some_and(|k| k.starts_with(KID_PREFIX)) {
            return Err(TokenError::NotOurs);
        }
        if header.alg != Algorithm::EdDSA || header.kid.as_deref() != Some(self.kid.as_str()) {
            return Err(TokenError::Invalid("not signed with this gateway's key".into()));
        }
        let mut v = Validation::new(Algorithm::EdDSA);
        v.set_issuer(&[ISSUER]);
        v.set_audience(&[AUDIENCE]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        // Expiry is checked here, against the caller's clock, without leeway.
        v.validate_exp = false;
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &v).map_err(|e| TokenError::Invalid(e.to_string()))?;
        if data.claims.exp <= now {
            return Err(TokenError::Invalid("expired".into()));
        }
        Ok(data.claims)
    }

    /// `payload` sealed: base64url of it and of its HMAC under [`Keys::seal`].
    pub fn seal_bytes(&self, payload: &[u8]) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let body = b64.encode(payload);
        let tag = b64.encode(crate::base::secrets::hmac_sha256(&self.seal, body.as_bytes()));
        format!("{body}.{tag}")
    }

    /// What [`Keys::seal_bytes`] sealed, when it is this gateway's seal.
    pub fn open_bytes(&self, sealed: &str) -> Option<Vec<u8>> {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let (body, tag) = sealed.split_once('.')?;
        let expected = b64.encode(crate::base::secrets::hmac_sha256(&self.seal, body.as_bytes()));
        if !crate::base::secrets::token_matches(tag, &expected) {
            return None;
        }
        b64.decode(body).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(exp: u64) -> Claims {
        Claims {
            iss: ISSUER.into(),
            aud: AUDIENCE.into(),
            sub: "ada".into(),
            email: Some("ada@example.com".into()),
            name: "Ada".into(),
            groups: vec!["research".into()],
            admin_of: vec![],
            roles: vec![],
            iat: 100,
            exp,
            jti: "j1".into(),
        }
    }

    #[test]
    fn a_token_signed_here_verifies_until_it_expires_and_nowhere_else() {
        let keys = Keys::from_stored(&StoredKey::generate().unwrap()).unwrap();
        let token = keys.sign(&claims(1_000)).unwrap();
        assert_eq!(keys.verify(&token, 999).unwrap(), claims(1_000));
        assert!(matches!(keys.verify(&token, 1_000), Err(TokenError::Invalid(_))));
        // Another gateway's key (another kid) and a tampered payload are refused.
        let other = Keys::from_stored(&StoredKey::generate().unwrap()).unwrap();
        assert!(matches!(other.verify(&token, 10), Err(TokenError::Invalid(_))));
        let mut parts: Vec<String> = token.split('.').map(String::from).collect();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut body: serde_json::Value = serde_json::from_slice(&b64.decode(&parts[1]).unwrap()).unwrap();
        body["sub"] = "eve".into();
        parts[1] = b64.encode(body.to_string());
        assert!(matches!(keys.verify(&parts.join("."), 10), Err(TokenError::Invalid(_))));
        // A provider's token (no tg1- kid) is not ours, whatever it says.
        assert_eq!(keys.verify("eyJhbGciOiJSUzI1NiIsImtpZCI6ImsxIn0.e30.x", 10), Err(TokenError::NotOurs));
        // The stored form gives the same key back.
        let stored = StoredKey::generate().unwrap();
        let (a, b) = (Keys::from_stored(&stored).unwrap(), Keys::from_stored(&stored).unwrap());
        assert_eq!(b.verify(&a.sign(&claims(50)).unwrap(), 10).unwrap().sub, "ada");
        assert_eq!(a.seal, b.seal);
        assert_eq!(b.open_bytes(&a.seal_bytes(b"hello")).as_deref(), Some(&b"hello"[..]));
        assert_eq!(other.open_bytes(&a.seal_bytes(b"hello")), None);
    }
}
