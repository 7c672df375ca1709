//! The classes of upstream failure a fallback may be taken on (issue 69): an upstream's error
//! answer — its status, its body in any protocol's shape, and Bedrock's `x-amzn-ErrorType` —
//! read once into one class, whatever the protocol or the kind of upstream. Pure.
//!
//! | class | read from |
//! |---|---|
//! | `context_length` | OpenAI / Azure code `context_length_exceeded` or "maximum context length"; Anthropic "prompt is too long"; Gemini "exceeds the maximum number of tokens" / "input token count"; Bedrock `ValidationException` "too long" / "max tokens" / "context window" |
//! | `content_policy` | OpenAI / Azure code `content_policy_violation` or `content_filter`; Anthropic "content filtering policy"; Gemini `SAFETY` / "blocked"; Bedrock "content filters" / "guardrail" |
//! | `rate_limited` | 429; Bedrock `ThrottlingException`, `ServiceQuotaExceededException` |
//! | `unavailable` | 500, 502, 503, 529; Bedrock `ServiceUnavailableException`, `ModelNotReadyException`, `InternalServerException`; a connection that failed |
//! | `timeout` | 408, 504; Bedrock `ModelTimeoutException`; no answer in time |
//!
//! Anything else (a malformed request, a wrong model, the upstream refusing tollgate's own
//! credential) is no reason to try another model: None.

use serde_json::Value;

/// Why a call may go on to the next model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    ContextLength,
    ContentPolicy,
    RateLimited,
    Unavailable,
    Timeout,
}

impl FailureClass {
    pub const ALL: [FailureClass; 5] = [
        FailureClass::ContextLength,
        FailureClass::ContentPolicy,
        FailureClass::RateLimited,
        FailureClass::Unavailable,
        FailureClass::Timeout,
    ];

    /// Its name as the configuration and the logs write it.
    pub fn name(self) -> &'static str {
        match self {
            FailureClass::ContextLength => "context_length",
            FailureClass::ContentPolicy => "content_policy",
            FailureClass::RateLimited => "rate_limited",
            FailureClass::Unavailable => "unavailable",
            FailureClass::Timeout => "timeout",
        }
    }

    pub fn parse(name: &str) -> Option<FailureClass> {
        FailureClass::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// The error object of a body in any protocol's shape (generate-content streams answer an
/// array of one).
fn error_of(v: &Value) -> &Value {
    match v {
        Value::Array(items) => items.first().and_then(|first| first.get("error")).unwrap_or(v),
        _ => v.get("error").unwrap_or(v),
    }
}

/// The class of an upstream's error answer, if it is one a fallback may be taken on.
pub fn classify(status: u16, body: &[u8], aws_error_type: Option<&str>) -> Option<FailureClass> {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let error = error_of(&value);
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_ascii_lowercase();
    let code = text(error.get("code")).to_string() + &text(error.get("type"));
    let message = {
        let m = text(error.get("message").or_else(|| value.get("message")).or_else(|| value.get("Message")));
        if m.is_empty() {
            String::from_utf8_lossy(&body[..body.len().min(2048)]).to_ascii_lowercase()
        } else {
            m
        }
    };
    let aws = aws_error_type.map(|t| t.split(':').next().unwrap_or(t).trim().to_string()).unwrap_or_default();
    match aws.as_str() {
        "ThrottlingException" | "ServiceQuotaExceededException" => return Some(FailureClass::RateLimited),
        "ServiceUnavailableException" | "ModelNotReadyException" | "InternalServerException" => return Some(FailureClass::Unavailable),
        "ModelTimeoutException" => return Some(FailureClass::Timeout),
        _ => {}
    }
    let says = |words: &[&str]| words.iter().any(|w| message.contains(w));
    if (400..500).contains(&status) && status != 429 {
        if code.contains("context_length_exceeded")
            || says(&[
                "maximum context length",
                "prompt is too long",
                "exceeds the maximum number of tokens",
                "input token count",
                "context window",
            ])
            || (aws == "ValidationException" && says(&["too long", "max tokens", "too many tokens"]))
        {
            return Some(FailureClass::ContextLength);
        }
        if code.contains("content_policy_violation")
            || code.contains("content_filter")
            || says(&[
                "content filtering policy",
                "content management policy",
                "blocked due to safety",
                "safety settings",
                "content filters",
                "guardrail",
            ])
            || error.get("status").and_then(Value::as_str) == Some("SAFETY")
        {
            return Some(FailureClass::ContentPolicy);
        }
    }
    match status {
        429 => Some(FailureClass::RateLimited),
        500 | 502 | 503 | 529 => Some(FailureClass::Unavailable),
        408 | 504 => Some(FailureClass::Timeout),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureClass::*;

    #[test]
    fn each_protocols_errors_fall_in_their_class() {
        let rows: [(u16, &str, Option<&str>, Option<FailureClass>); 20] = [
            // OpenAI and Azure OpenAI.
            (
                400,
                r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
                None,
                Some(ContextLength),
            ),
            (
                400,
                r#"{"error":{"message":"Your request was rejected as a result of our safety system.","code":"content_policy_violation"}}"#,
                None,
                Some(ContentPolicy),
            ),
            (
                400,
                r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","code":"content_filter","status":400}}"#,
                None,
                Some(ContentPolicy),
            ),
            (429, r#"{"error":{"message":"Rate limit reached","code":"rate_limit_exceeded"}}"#, None, Some(RateLimited)),
            (400, r#"{"error":{"message":"Invalid value for 'temperature'","code":"invalid_value"}}"#, None, None),
            // Anthropic.
            (
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
                None,
                Some(ContextLength),
            ),
            (
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"Output blocked by content filtering policy"}}"#,
                None,
                Some(ContentPolicy),
            ),
            (529, r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#, None, Some(Unavailable)),
            (404, r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-x"}}"#, None, None),
            // Gemini.
            (
                400,
                r#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
                None,
                Some(ContextLength),
            ),
            (
                400,
                r#"[{"error":{"code":400,"message":"The request was blocked due to safety reasons.","status":"INVALID_ARGUMENT"}}]"#,
                None,
                Some(ContentPolicy),
            ),
            (503, r#"{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}"#, None, Some(Unavailable)),
            // Bedrock (its error type header).
            (400, r#"{"message":"Input is too long for requested model."}"#, Some("ValidationException"), Some(ContextLength)),
            (400, r#"{"message":"The request was blocked by content filters."}"#, Some("ValidationException"), Some(ContentPolicy)),
            (
                429,
                r#"{"message":"Too many requests, please wait before trying again."}"#,
                Some("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
                Some(RateLimited),
            ),
            (424, r#"{"message":"Model has not been ready"}"#, Some("ModelNotReadyException"), Some(Unavailable)),
            (408, r#"{"message":"Model timed out"}"#, Some("ModelTimeoutException"), Some(Timeout)),
            (400, r#"{"message":"Malformed input request"}"#, Some("ValidationException"), None),
            // Bare statuses, bodies of nothing readable.
            (504, "<html>gateway timeout</html>", None, Some(Timeout)),
            (401, r#"{"error":{"message":"invalid x-api-key"}}"#, None, None),
        ];
        for (status, body, aws, want) in rows {
            assert_eq!(classify(status, body.as_bytes(), aws), want, "{status} {body} {aws:?}");
        }
        for c in FailureClass::ALL {
            assert_eq!(FailureClass::parse(c.name()), Some(c));
        }
        assert_eq!(FailureClass::parse("moderation"), None);
    }
}
