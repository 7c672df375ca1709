//! A batch's input file (the OpenAI Batch API's JSONL): one request per line, each checked
//! before a batch is accepted — a JSON object with a `custom_id` unique in the file, `method`
//! `POST`, a `url` tollgate relays in batches, and a `body` naming its `model` — so that a bad
//! line is refused naming its number and field, never found out after hours upstream. Pure.

use super::{ApiError, ErrorKind};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The endpoints a batch line may call.
pub const BATCH_URLS: [&str; 3] = ["/v1/chat/completions", "/v1/embeddings", "/v1/responses"];

/// The most lines a batch may have (the API's own bound).
pub const MAX_LINES: usize = 50_000;

/// The longest `custom_id`.
pub const MAX_CUSTOM_ID: usize = 512;

/// One checked line: what its price and routing depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLine {
    pub custom_id: String,
    pub url: &'static str,
    pub model: String,
    /// The line's body, in bytes (its input estimate).
    pub body_bytes: usize,
    /// The output maximum the body names, if it names one (`max_tokens`,
    /// `max_completion_tokens`, `max_output_tokens`).
    pub max_output: Option<u64>,
    /// Input tokens held for what the body references beyond its own bytes — images and files
    /// (`billing.image_input_tokens`, `billing.file_input_tokens`), the stored conversation a
    /// `previous_response_id` continues: held as the same body sent alone would be.
    pub extra_input: u64,
}

impl BatchLine {
    /// A line of `tokens` input and no output: what continuing a stored conversation adds.
    pub fn context(model: &str, tokens: u64) -> BatchLine {
        BatchLine {
            custom_id: String::new(),
            url: "/v1/responses",
            model: model.to_string(),
            body_bytes: 0,
            max_output: Some(0),
            extra_input: tokens,
        }
    }
}

#[derive(Deserialize)]
struct RawLine<'a> {
    #[serde(borrow)]
    custom_id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a RawValue>,
    #[serde(borrow)]
    url: Option<&'a RawValue>,
    #[serde(borrow)]
    body: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Body {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
}

fn bad(line: usize, field: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, format!("Line {line} of the input file: {why}.")).with_param(&format!("line {line}: {field}"))
}

fn string(raw: Option<&RawValue>) -> Option<String> {
    raw.and_then(|r| serde_json::from_str::<String>(r.get()).ok())
}

/// The lines of an input file checked one at a time, as they are read (the file is never held
/// whole): the `custom_id`s seen so far and how many requests there were.
#[derive(Default)]
pub struct Lines {
    seen: std::collections::HashSet<String>,
    count: usize,
}

impl Lines {
    /// Check line `n` (its bytes without the newline); None for a blank line.
    pub fn check(&mut self, n: usize, raw: &[u8]) -> Result<Option<BatchLine>, ApiError> {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        if self.count == MAX_LINES {
            return Err(bad(n, "", format!("a batch has at most {MAX_LINES} requests")));
        }
        let line: RawLine<'_> = serde_json::from_slice(raw).map_err(|e| bad(n, "", format!("not a JSON object ({e})")))?;
        let custom_id = string(line.custom_id)
            .filter(|c| !c.is_empty())
            .ok_or_else(|| bad(n, "custom_id", "'custom_id' must be a non-empty string"))?;
        if custom_id.len() > MAX_CUSTOM_ID {
            return Err(bad(n, "custom_id", format!("'custom_id' is longer than {MAX_CUSTOM_ID} bytes")));
        }
        if !self.seen.insert(custom_id.clone()) {
            return Err(bad(n, "custom_id", format!("'custom_id' {custom_id:?} is used by an earlier line")));
        }
        if string(line.method).as_deref() != Some("POST") {
            return Err(bad(n, "method", "'method' must be \"POST\""));
        }
        let url = string(line.url).unwrap_or_default();
        let url = BATCH_URLS
            .into_iter()
            .find(|u| *u == url)
            .ok_or_else(|| bad(n, "url", format!("'url' must be one of {}", BATCH_URLS.join(", "))))?;
        let body = line.body.ok_or_else(|| bad(n, "body", "'body' is required"))?;
        let fields: Body = serde_json::from_str(body.get()).map_err(|e| bad(n, "body", format!("'body' is not a request object ({e})")))?;
        let model = fields.model.filter(|m| !m.is_empty()).ok_or_else(|| bad(n, "body.model", "'body.model' is required"))?;
        super::check_model_name(&model).map_err(|e| bad(n, "body.model", e.message))?;
        let max_output = [fields.max_tokens, fields.max_completion_tokens, fields.max_output_tokens].into_iter().flatten().max();
        self.count += 1;
        Ok(Some(BatchLine { custom_id, url, model, body_bytes: body.get().len(), max_output, extra_input: 0 }))
    }

    /// After the last line: a file without a request is refused.
    pub fn finish(&self) -> Result<(), ApiError> {
        if self.count == 0 {
            return Err(ApiError::new(ErrorKind::BadRequest, "The input file has no requests.").with_param("input_file_id"));
        }
        Ok(())
    }

    /// The requests seen so far.
    pub fn count(&self) -> usize {
        self.count
    }
}

/// The `body` of line `n` (checked by [`Lines::check`]) with its model under `model` and, when
/// given, its output maximum set in `field` (a line that named none gets the one it is held
/// for, so the upstream never generates past the batch's hold); the line written again.
pub fn rewrite_line(raw: &[u8], n: usize, model: &str, maximum: Option<(&str, u64)>) -> Result<Vec<u8>, ApiError> {
    let mut line: serde_json::Value = serde_json::from_slice(raw).map_err(|e| bad(n, "", format!("not a JSON object ({e})")))?;
    let body = line.get_mut("body").and_then(serde_json::Value::as_object_mut).ok_or_else(|| bad(n, "body", "'body' is required"))?;
    body.insert("model".into(), serde_json::Value::String(model.to_string()));
    if let Some((field, tokens)) = maximum {
        body.insert(field.into(), serde_json::Value::from(tokens));
    }
    serde_json::to_vec(&line).map_err(|e| bad(n, "", e))
}

/// What one line of a batch's output file reports: its `custom_id`, the answer's HTTP status
/// and, for an answer with `usage`, its tokens (chat completions and embeddings:
/// `prompt_tokens`, `prompt_tokens_details.cached_tokens`, `completion_tokens`; responses:
/// `input_tokens`, `input_tokens_details.cached_tokens`, `output_tokens`). None for a line
/// that is not such an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputLine {
    pub custom_id: String,
    pub status: u16,
    pub usage: Option<crate::base::usage::Usage>,
}

pub fn output_line(raw: &[u8]) -> Option<OutputLine> {
    #[derive(Deserialize)]
    struct Details {
        cached_tokens: Option<u64>,
    }
    #[derive(Deserialize)]
    struct Tokens {
        prompt_tokens: Option<u64>,
        completion_tokens: Option<u64>,
        prompt_tokens_details: Option<Details>,
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
        input_tokens_details: Option<Details>,
    }
    #[derive(Deserialize)]
    struct Answer {
        usage: Option<Tokens>,
    }
    #[derive(Deserialize)]
    struct Response {
        status_code: u16,
        body: Option<Answer>,
    }
    #[derive(Deserialize)]
    struct Line {
        custom_id: String,
        response: Option<Response>,
    }
    let line: Line = serde_json::from_slice(raw).ok()?;
    let response = line.response?;
    let usage = response.body.and_then(|b| b.usage).map(|t| {
        let input = t.prompt_tokens.or(t.input_tokens).unwrap_or(0);
        let cached = t.prompt_tokens_details.or(t.input_tokens_details).and_then(|d| d.cached_tokens).unwrap_or(0).min(input);
        crate::base::usage::Usage {
            input: input - cached,
            cached,
            cache_write: 0,
            output: t.completion_tokens.or(t.output_tokens).unwrap_or(0),
        }
    });
    Some(OutputLine { custom_id: line.custom_id, status: response.status_code, usage })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Check every line of `input` (blank lines are skipped); the lines, or the first refusal.
    fn check_lines(input: &[u8]) -> Result<Vec<BatchLine>, ApiError> {
        let mut lines = Lines::default();
        let mut out = Vec::new();
        for (i, raw) in input.split(|b| *b == b'\n').enumerate() {
            out.extend(lines.check(i + 1, raw)?);
        }
        lines.finish()?;
        Ok(out)
    }

    fn line(id: &str, url: &str, body: &str) -> String {
        format!(r#"{{"custom_id":"{id}","method":"POST","url":"{url}","body":{body}}}"#)
    }

    #[test]
    fn good_lines_are_read_for_their_model_size_and_maximum() {
        let input = [
            line("a", "/v1/chat/completions", r#"{"model":"alpha-5.5","messages":[],"max_tokens":100}"#),
            String::new(),
            line("b", "/v1/embeddings", r#"{"model":"alpha-embed-3","input":"hi"}"#),
        ]
        .join("\r\n");
        let lines = check_lines(input.as_bytes()).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            (lines[0].custom_id.as_str(), lines[0].url, lines[0].model.as_str(), lines[0].max_output),
            ("a", "/v1/chat/completions", "alpha-5.5", Some(100))
        );
        assert_eq!((lines[1].url, lines[1].max_output), ("/v1/embeddings", None));
        assert_eq!(lines[1].body_bytes, r#"{"model":"alpha-embed-3","input":"hi"}"#.len());
    }

    #[test]
    fn a_bad_line_is_refused_naming_its_number_and_field() {
        let ok = line("a", "/v1/chat/completions", r#"{"model":"m"}"#);
        for (bad_line, field) in [
            ("not json".to_string(), "line 2: "),
            (line("a", "/v1/chat/completions", r#"{"model":"m"}"#), "line 2: custom_id"),
            (line("", "/v1/chat/completions", r#"{"model":"m"}"#), "line 2: custom_id"),
            (line("b", "/v1/images/generations", r#"{"model":"m"}"#), "line 2: url"),
            (line("b", "/v1/chat/completions", r#"{"messages":[]}"#), "line 2: body.model"),
            (line("b", "/v1/chat/completions", r#"[1]"#), "line 2: body"),
            (r#"{"custom_id":"b","method":"GET","url":"/v1/embeddings","body":{"model":"m"}}"#.to_string(), "line 2: method"),
        ] {
            let e = check_lines(format!("{ok}\n{bad_line}\n").as_bytes()).unwrap_err();
            assert_eq!((e.status(), e.param.as_deref()), (400, Some(field)), "{bad_line}: {}", e.message);
            assert!(e.message.starts_with("Line 2 of the input file"), "{}", e.message);
        }
        assert_eq!(check_lines(b"\n \n").unwrap_err().param.as_deref(), Some("input_file_id"));
    }
    #[test]
    fn a_line_is_written_again_with_the_upstream_model_and_its_maximum() {
        let raw = line("a", "/v1/chat/completions", r#"{"model":"alpha","messages":[]}"#);
        let out: serde_json::Value =
            serde_json::from_slice(&rewrite_line(raw.as_bytes(), 1, "up-alpha", Some(("max_completion_tokens", 64))).unwrap()).unwrap();
        assert_eq!(out["body"]["model"], "up-alpha");
        assert_eq!(out["body"]["max_completion_tokens"], 64);
        assert_eq!(out["custom_id"], "a");
    }

    #[test]
    fn output_lines_give_their_usage_in_either_shape() {
        let chat = r#"{"id":"r1","custom_id":"a","response":{"status_code":200,"body":{"usage":{"prompt_tokens":30,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":10}}}},"error":null}"#;
        let u = output_line(chat.as_bytes()).unwrap();
        assert_eq!((u.custom_id.as_str(), u.status), ("a", 200));
        assert_eq!(u.usage, Some(crate::base::usage::Usage { input: 20, cached: 10, cache_write: 0, output: 7 }));
        let responses = r#"{"custom_id":"b","response":{"status_code":200,"body":{"usage":{"input_tokens":5,"output_tokens":9}}}}"#;
        assert_eq!(output_line(responses.as_bytes()).unwrap().usage.map(|u| (u.input, u.output)), Some((5, 9)));
        let failed = r#"{"custom_id":"c","response":{"status_code":400,"body":{"error":{"message":"no"}}}}"#;
        assert_eq!(output_line(failed.as_bytes()).map(|l| (l.status, l.usage)), Some((400, None)));
        assert_eq!(output_line(b"garbage"), None);
    }
}
