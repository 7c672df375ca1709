//! An upstream's error answer as the client gets it, for every relay (native and translated,
//! whole answers and stream error events): never the upstream's bytes.
//!
//! * The upstream refusing tollgate's own credential (401, 403) is the operator's problem, not
//!   the client's: 502 `upstream_auth_failed` (the caller logs it at ERROR naming the provider).
//! * 429 is tollgate's 429 with `Retry-After` and no account details (the upstream's message
//!   names the organization and its account-wide limits).
//! * 5xx become 502 (503 when overloaded, 504 on a timeout) without upstream text.
//! * Any other 4xx is the client's own mistake: its status and the upstream's message are kept
//!   (the context-length message must reach the client), with key-like strings and account
//!   identifiers removed, and bounded in length.

use super::{ApiError, ErrorKind};
use serde_json::Value;

/// The longest upstream message passed on, in bytes.
const MAX_MESSAGE_BYTES: usize = 1024;

/// What the client is told for an upstream error of `status` whose message (and code, for
/// chat-completions shapes) the upstream gave.
pub fn rewrite(status: u16, message: Option<&str>, code: Option<&str>) -> ApiError {
    let upstream = |kind: ErrorKind, text: &str| ApiError::new(kind, text);
    match status {
        401 | 403 => upstream(
            ErrorKind::UpstreamAuthFailed,
            "The upstream service refused this gateway's credentials. This is not a problem with your API key; the gateway's log records it for the operator.",
        ),
        429 => upstream(ErrorKind::RateLimited, "The upstream service is rate limiting this gateway. Retry later."),
        503 | 529 => upstream(ErrorKind::Overloaded, "The upstream service is overloaded. Retry later."),
        504 => upstream(ErrorKind::GatewayTimeout, "The upstream service did not answer in time."),
        500..=599 => upstream(ErrorKind::BadGateway, "The upstream service failed to answer. Retry later."),
        400..=499 => {
            let text = message.map(scrub).filter(|m| !m.trim().is_empty()).unwrap_or_else(|| format!("The upstream service refused the request ({status})."));
            let mut e = ApiError::new(
                match status {
                    404 => ErrorKind::NotFound,
                    408 => ErrorKind::RequestTimeout,
                    413 => ErrorKind::PayloadTooLarge,
                    _ => ErrorKind::BadRequest,
                },
                text,
            );
            e.upstream_status = Some(status);
            e.upstream_code = code.filter(|c| is_plain_code(c)).map(str::to_string);
            e
        }
        _ => upstream(ErrorKind::BadGateway, "The upstream service sent an answer this gateway cannot read."),
    }
}

/// An error body of any protocol's shape (or none) read into the client's error.
pub fn from_body(status: u16, body: &[u8]) -> ApiError {
    let value: Option<Value> = serde_json::from_slice(body).ok();
    let error = value.as_ref().map(|v| match v {
        // Generate-content streams answer errors as an array of one.
        Value::Array(items) => items.first().and_then(|first| first.get("error")).unwrap_or(v),
        _ => v.get("error").unwrap_or(v),
    });
    let message = error.and_then(|e| e.get("message").or_else(|| e.get("detail"))).and_then(Value::as_str);
    let code = error.and_then(|e| e.get("code")).and_then(Value::as_str);
    rewrite(status, message, code)
}

/// An upstream code passed on: a short identifier (`context_length_exceeded`).
fn is_plain_code(code: &str) -> bool {
    !code.is_empty() && code.len() <= 64 && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// A word that may be a credential or an account identifier: a masked key (`sk-****abcd`), a
/// known key or account prefix, or a long run of letters and digits mixed.
fn secret_like(word: &str) -> bool {
    if word.len() < 6 {
        return false;
    }
    if word.contains('*') {
        return true;
    }
    let lower = word.to_ascii_lowercase();
    const PREFIXES: [&str; 11] = ["sk-", "sk_", "rk-", "pk-", "aiza", "org-", "org_", "proj_", "proj-", "acct_", "key-"];
    if PREFIXES.iter().any(|p| lower.starts_with(p)) {
        return true;
    }
    // An identifier: one long part of letters and digits mixed (a model name's parts are short).
    word.split(['-', '_'])
        .any(|part| part.len() >= 16 && part.bytes().any(|b| b.is_ascii_digit()) && part.bytes().any(|b| b.is_ascii_alphabetic()))
}

/// The message with every secret-like word replaced, at most [`MAX_MESSAGE_BYTES`].
pub fn scrub(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_MESSAGE_BYTES));
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if secret_like(word) {
            out.push_str("[redacted]");
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in message.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '*') {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(if c.is_control() { ' ' } else { c });
        }
        if out.len() + word.len() > MAX_MESSAGE_BYTES {
            break;
        }
    }
    flush(&mut word, &mut out);
    if out.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Protocol;

    /// The real services' answers, as reported (keys and organizations replaced by look-alikes).
    const OPENAI_401: &[u8] = br#"{"error":{"message":"Incorrect API key provided: sk-proj-********************************************abcd. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
    const OPENAI_429: &[u8] = br#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-Q3x9TgLh2bV8mK1nR7sY4wZp on tokens per min (TPM): Limit 30000, Used 29874, Requested 1200.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
    const OPENAI_400: &[u8] = br#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    const ANTHROPIC_400: &[u8] =
        br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210432 tokens > 200000 maximum"}}"#;
    const GEMINI_400: &[u8] = br#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key. AIzaSyD3xAmPlEkEy0123456789abcdefghij","status":"INVALID_ARGUMENT"}}"#;

    #[test]
    fn the_upstream_refusing_the_gateways_key_is_a_502_that_names_nothing() {
        let e = from_body(401, OPENAI_401);
        assert_eq!((e.status(), e.kind.code()), (502, Some("upstream_auth_failed")));
        assert!(!e.message.contains("abcd") && !e.message.contains("sk-"), "{}", e.message);
        for p in [Protocol::Openai, Protocol::Anthropic, Protocol::Gemini] {
            let body = String::from_utf8(e.body(p)).expect("utf8");
            assert!(body.contains("upstream_auth_failed") || body.contains("UPSTREAM_AUTH_FAILED"), "{p:?}: {body}");
        }
        assert_eq!(from_body(403, b"").status(), 502);
    }

    #[test]
    fn a_429_keeps_no_account_detail() {
        let e = from_body(429, OPENAI_429);
        assert_eq!(e.status(), 429);
        assert!(!e.message.contains("org-") && !e.message.contains("30000"), "{}", e.message);
    }

    #[test]
    fn server_errors_carry_no_upstream_text() {
        for (status, want) in [(500, 502), (502, 502), (503, 503), (529, 503), (504, 504)] {
            let e = from_body(status, br#"{"error":{"message":"internal host db-7.us-east.internal failed"}}"#);
            assert_eq!(e.status(), want, "{status}");
            assert!(!e.message.contains("db-7"), "{}", e.message);
        }
    }

    #[test]
    fn a_clients_mistake_keeps_its_status_and_message_without_secrets() {
        let e = from_body(400, OPENAI_400);
        assert_eq!(e.status(), 400);
        assert!(e.message.contains("maximum context length is 128000 tokens"), "{}", e.message);
        let chat: Value = serde_json::from_slice(&e.body(Protocol::Openai)).expect("json");
        assert_eq!(chat["error"]["code"], "context_length_exceeded");
        let e = from_body(400, ANTHROPIC_400);
        assert_eq!(e.message, "prompt is too long: 210432 tokens > 200000 maximum");
        let e = from_body(400, GEMINI_400);
        assert!(!e.message.contains("AIza"), "{}", e.message);
        assert!(e.message.starts_with("API key not valid"));
        // Generate-content's stream shape, and no JSON at all.
        let e = from_body(404, br#"[{"error":{"code":404,"message":"models/x is not found","status":"NOT_FOUND"}}]"#);
        assert_eq!((e.status(), e.message.as_str()), (404, "models/x is not found"));
        assert_eq!(from_body(422, b"<html>nope</html>").status(), 422);
        // Bounded.
        let long = format!(r#"{{"error":{{"message":"{}"}}}}"#, "word ".repeat(10_000));
        assert!(from_body(400, long.as_bytes()).message.len() <= MAX_MESSAGE_BYTES);
    }

    #[test]
    fn scrub_removes_key_like_words_only() {
        assert_eq!(scrub("key sk-ant-api03-abc is wrong"), "key [redacted] is wrong");
        assert_eq!(scrub("org org_2bV8mK1n and proj_abcdef here"), "org [redacted] and [redacted] here");
        assert_eq!(scrub("max_tokens: 100 > 50"), "max_tokens: 100 > 50");
        assert_eq!(scrub("gpt-4o-mini-2024-07-18 is fine"), "gpt-4o-mini-2024-07-18 is fine", "a model name stays");
        assert_eq!(scrub("id a1b2c3d4e5f6g7h8i9j0k1"), "id [redacted]");
    }

    #[test]
    fn every_refusal_code_appears_in_every_protocols_shape() {
        use crate::protocol::ErrorKind::*;
        for kind in [KeyExpired, IpNotAllowed, ModelNotAllowed, RequestCostCap, BudgetExceeded, InvalidModel, StoreUnavailable] {
            let e = ApiError::new(kind, "m");
            let code = kind.code().expect("a code");
            let chat: Value = serde_json::from_slice(&e.body(Protocol::Openai)).expect("json");
            assert_eq!(chat["error"]["code"], code);
            let messages: Value = serde_json::from_slice(&e.body(Protocol::Anthropic)).expect("json");
            assert_eq!(messages["error"]["code"], code, "beside type: {messages}");
            assert!(messages["error"]["type"].is_string());
            let gemini: Value = serde_json::from_slice(&e.body(Protocol::Gemini)).expect("json");
            assert_eq!(gemini["error"]["details"][0]["reason"], code.to_ascii_uppercase(), "{gemini}");
        }
    }
}
