//! What the mock reads from a request and shares between its parts: the call it was asked
//! for, a tool call it answers with, and the small readers of headers.

use bytes::Bytes;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;
use serde_json::Value;
use std::time::Duration;

pub(crate) const WORDS: [&str; 8] = ["Hello", " from", " the", " mock", " upstream", ",", " friend", "."];

#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Kind {
    Chat,
    Responses,
    Embeddings,
    Messages,
    Generate { stream: bool },
}

pub(crate) struct Call {
    pub(crate) kind: Kind,
    pub(crate) model: String,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) input_tokens: u64,
    pub(crate) deltas: usize,
    pub(crate) interval: Duration,
    pub(crate) hold: Option<String>,
    /// Events sent before holding (default 1).
    pub(crate) hold_after: usize,
    /// Close the connection after this many events, without finishing the response.
    pub(crate) cut_after: Option<usize>,
    pub(crate) embed_inputs: usize,
    pub(crate) embed_base64: bool,
    pub(crate) gemini_sse: bool,
    /// Reported output tokens (default: one per delta).
    pub(crate) output_tokens: Option<u64>,
    pub(crate) no_usage: bool,
    /// Answer with this tool call instead of text.
    pub(crate) tool: Option<ToolCall>,
    /// Answer with this text instead of the mock's words (an agent turn that got its tool result).
    pub(crate) reply: Option<String>,
    /// Stream the reply in pieces of this many characters rather than word by word (`[[echo]]`).
    pub(crate) pieces: Option<usize>,
    /// Responses: the id of the response being created.
    pub(crate) response_id: String,
    /// Prompt-cache (write, read) tokens to report.
    pub(crate) cache: Option<(u64, u64)>,
    /// A Bedrock call: streamed in event-stream frames, ended by an exception frame after
    /// this many events when set.
    pub(crate) bedrock: Option<Option<usize>>,
    /// A Bedrock call through Converse: answered in Converse's shapes.
    pub(crate) converse: bool,
}

pub(crate) fn pair(req: &RequestHeader, name: &str) -> Option<(u64, u64)> {
    let (a, b) = header(req, name)?.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// The tool call a `x-mock-tool-calls` answer makes, and its arguments in stream pieces.
pub(crate) const TOOL_ARGS: [&str; 4] = ["{\"city\":", " \"Paris\",", " \"unit\":", " \"celsius\"}"];

/// A tool call the mock answers with.
#[derive(Clone, Debug)]
pub(crate) struct ToolCall {
    pub(crate) name: String,
    /// The arguments as JSON text.
    pub(crate) args: String,
}

impl ToolCall {
    /// The arguments in about four stream pieces (cut at character boundaries).
    pub(crate) fn pieces(&self) -> Vec<String> {
        let chars: Vec<char> = self.args.chars().collect();
        let size = chars.len().div_ceil(4).max(1);
        chars.chunks(size).map(|c| c.iter().collect()).collect()
    }

    pub(crate) fn args_value(&self) -> Value {
        serde_json::from_str(&self.args).unwrap_or(Value::Null)
    }
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub(crate) fn header<'a>(req: &'a RequestHeader, name: &str) -> Option<&'a str> {
    req.headers.get(name).and_then(|v| v.to_str().ok())
}

pub(crate) fn num(req: &RequestHeader, name: &str) -> Option<u64> {
    header(req, name).and_then(|v| v.trim().parse().ok())
}

pub(crate) fn text_of(deltas: usize) -> Vec<&'static str> {
    (0..deltas).map(|i| WORDS[i % WORDS.len()]).collect()
}

/// Headers the real services send on every answer that belong to the operator's account (its
/// organisation, project, account-wide rate limits, cookies) or to the service's insides, next
/// to the ones SDKs read (request ids, processing time, `x-should-retry`).
pub(crate) const SERVICE_HEADERS: [(&str, &str); 11] = [
    ("x-request-id", "req_mock_0001"),
    ("request-id", "req_mock_0001"),
    ("openai-processing-ms", "12"),
    ("x-should-retry", "false"),
    ("openai-organization", "org-mock-operator"),
    ("openai-project", "proj_mock_operator"),
    ("x-ratelimit-remaining-requests", "4999"),
    ("anthropic-ratelimit-tokens-remaining", "399000"),
    ("anthropic-organization-id", "mock-operator-org"),
    ("set-cookie", "__cf_bm=mock-operator-cookie; path=/; HttpOnly"),
    ("x-envoy-upstream-service-time", "11"),
];

pub(crate) fn service_headers(h: &mut ResponseHeader) -> Result<()> {
    for (k, v) in SERVICE_HEADERS {
        h.append_header(k, v)?;
    }
    Ok(())
}

pub(crate) async fn send(session: &mut Session, status: u16, ctype: &str, body: Bytes, extra: &[(&str, &str)]) -> Result<()> {
    let mut h = ResponseHeader::build(status, Some(4 + SERVICE_HEADERS.len()))?;
    h.insert_header("content-type", ctype)?;
    h.insert_header("content-length", body.len().to_string())?;
    service_headers(&mut h)?;
    for (k, v) in extra {
        h.insert_header(k.to_string(), *v)?;
    }
    session.write_response_header(Box::new(h), false).await?;
    session.write_response_body(Some(body), true).await
}

/// The fields of a query string or an `application/x-www-form-urlencoded` body, decoded.
pub(crate) fn url_pairs(text: &str) -> Vec<(String, String)> {
    let decode = tollgate::base::text::decode_component;
    text.split('&').filter_map(|pair| pair.split_once('=').map(|(k, v)| (decode(k), decode(v)))).collect()
}
