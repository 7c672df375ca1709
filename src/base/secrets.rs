//! Random tokens and their comparison, on the bottom floor (imports nothing of tollgate's):
//! base-62 strings for ids, secrets, cookies and one-time links, a comparison of a presented
//! token with the expected one that takes the same time wherever they differ, and HMAC-SHA256.

use rand::Rng;
use sha2::{Digest, Sha256};

/// The characters of a base-62 string.
pub const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// `n` random base-62 characters.
pub fn random_base62(n: usize) -> String {
    let mut rng = rand::thread_rng();
    (0..n).map(|_| BASE62[rng.gen_range(0..BASE62.len())] as char).collect()
}

/// HMAC-SHA256 of `data` under `key` (any length).
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    use hmac::Mac;
    // HMAC takes keys of any length: new_from_slice cannot fail.
    let mut mac = match hmac::Hmac::<Sha256>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// A Standard Webhooks secret as written: `whsec_` and base64 (the key is the decoded bytes);
/// any other string of at least 16 characters is the key's bytes as written.
pub fn webhook_secret(secret: &str) -> Result<Vec<u8>, &'static str> {
    use base64::Engine;
    match secret.strip_prefix("whsec_") {
        Some(b64) => base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| "a whsec_ secret is whsec_ and base64"),
        None if secret.len() >= 16 => Ok(secret.as_bytes().to_vec()),
        None => Err("at least 16 characters (or whsec_ and base64)"),
    }
}

/// The `webhook-signature` of `body` sent as message `id` at `timestamp` (seconds), as
/// Standard Webhooks sign: `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`.
pub fn webhook_signature(secret: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    use base64::Engine;
    let signed = format!("{id}.{timestamp}.");
    let mut message = Vec::with_capacity(signed.len() + body.len());
    message.extend_from_slice(signed.as_bytes());
    message.extend_from_slice(body);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(hmac_sha256(secret, &message)))
}

/// Constant-time comparison of the presented token with the expected one (of their digests,
/// so neither length nor the first differing byte shows in the time taken).
pub fn token_matches(presented: &str, expected: &str) -> bool {
    let a = Sha256::digest(presented.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_base62_and_compared_whole() {
        let (a, b) = (random_base62(43), random_base62(43));
        assert!(a.len() == 43 && a != b && a.bytes().all(|c| BASE62.contains(&c)));
        assert!(token_matches(&a, &a));
        assert!(!token_matches(&a, &b) && !token_matches("", &a) && !token_matches(&a[..42], &a));
    }

    #[test]
    fn the_signature_is_standard_webhooks_v1() {
        // The Standard Webhooks specification's own example: secret, id, timestamp, payload
        // and the signature it gives.
        let secret = webhook_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            webhook_signature(&secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert!(webhook_secret("short").is_err() && webhook_secret("whsec_!!").is_err());
    }
}
