//! `providers[].rewrite` and `groups.<g>.rewrite`: ordered rules that fix a provider's (or a
//! group's clients') quirks in what is sent upstream — `when` a request matches (its model, its
//! route, its headers), headers set or removed, JSON paths of the body set, removed or given a
//! default, the model renamed. Checked here once; applied by `upstream::rewrite`.
//!
//! A provider's rules apply to what that provider is sent (after translation, before signing);
//! they may not touch what the call is held and metered by (the output maximum, `n`, `stream`,
//! `stream_options`, `model` — its name upstream is `rename_model`'s). A group's rules apply to
//! the request as its client wrote it, before the hold: they may set the output maximum or `n`,
//! and `rename_model` there changes the model the call is for (held and billed as it).

use super::{err, ConfigError};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    when: Option<RawWhen>,
    #[serde(default)]
    set_header: BTreeMap<String, String>,
    #[serde(default)]
    remove_header: Vec<String>,
    #[serde(default)]
    set: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    remove: Vec<String>,
    #[serde(default)]
    default: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    rename_model: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWhen {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    route: Option<String>,
    #[serde(default)]
    header: BTreeMap<String, String>,
}

/// One step of a JSON path: a member, or an array's element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// A path into a JSON body, written `a.b.0.c` (a number steps into an array).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPath {
    pub text: String,
    pub steps: Vec<Step>,
}

impl JsonPath {
    pub fn parse(text: &str) -> Option<JsonPath> {
        let steps: Vec<Step> = text
            .split('.')
            .map(|s| match s.parse::<usize>() {
                Ok(i) => Some(Step::Index(i)),
                Err(_) if !s.is_empty() => Some(Step::Key(s.to_string())),
                Err(_) => None,
            })
            .collect::<Option<_>>()?;
        matches!(steps.first(), Some(Step::Key(_))).then(|| JsonPath { text: text.to_string(), steps })
    }

    fn first(&self) -> &str {
        match self.steps.first() {
            Some(Step::Key(k)) => k,
            _ => "",
        }
    }
}

/// When a rule applies; every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct When {
    /// The model as the client named it: a name, or a prefix ending in `*`.
    pub model: Option<String>,
    /// The route (`chat_completions`, `messages`, …).
    pub route: Option<String>,
    /// Client headers and their values (`*`: present, any value).
    pub header: Vec<(http::HeaderName, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewriteRule {
    /// Named in the access log and the trace when it applied.
    pub id: String,
    pub when: When,
    pub set_header: Vec<(http::HeaderName, http::HeaderValue)>,
    pub remove_header: Vec<http::HeaderName>,
    pub set: Vec<(JsonPath, serde_json::Value)>,
    pub remove: Vec<JsonPath>,
    pub default: Vec<(JsonPath, serde_json::Value)>,
    pub rename_model: Option<String>,
}

impl RewriteRule {
    /// It changes the body.
    pub fn edits_body(&self) -> bool {
        !(self.set.is_empty() && self.remove.is_empty() && self.default.is_empty())
    }

    /// It changes the headers.
    pub fn edits_headers(&self) -> bool {
        !(self.set_header.is_empty() && self.remove_header.is_empty())
    }
}

/// Whose rules: a provider's (after translation, what the call is held by untouchable) or a
/// group's (before the hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Provider,
    Group,
}

/// The routes a rule may name.
pub const ROUTES: [&str; 12] = [
    "chat_completions",
    "responses",
    "messages",
    "generate_content",
    "stream_generate_content",
    "embeddings",
    "embed_content",
    "batch_embed_contents",
    "count_tokens",
    "gemini_count_tokens",
    "responses_input_tokens",
    "responses_compact",
];

/// Members tollgate meters a call by: no rule touches them.
const METERED: [&str; 2] = ["stream", "stream_options"];
/// Members a call is held by (the output maximum in each protocol, the number of answers):
/// only a group's rules (before the hold) set them.
const HELD: [&str; 6] = ["max_tokens", "max_completion_tokens", "max_output_tokens", "n", "generationConfig", "maxTokens"];

/// Headers no rule sets or removes: the framing, and the credentials the provider's seam writes.
const FRAMING: [&str; 5] = ["host", "content-length", "transfer-encoding", "connection", "expect"];

/// Most rules one provider or group may have.
pub const MAX_RULES: usize = 32;

/// `at.rewrite`: each rule checked (its id, by default `<at>#<index>`, unique within the list).
pub(super) fn rules(at: &str, raw: Vec<RawRule>, owner: Owner) -> Result<Vec<RewriteRule>, ConfigError> {
    if raw.len() > MAX_RULES {
        return err(format!("{at}.rewrite: at most {MAX_RULES} rules"));
    }
    let mut out: Vec<RewriteRule> = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let here = format!("{at}.rewrite[{i}]");
        let id = r.id.unwrap_or_else(|| format!("{}#{i}", at.rsplit('.').next().unwrap_or(at)));
        if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.#:".contains(c)) {
            return err(format!("{here}.id: 1 to 64 letters, digits or -_.#:"));
        }
        if out.iter().any(|o| o.id == id) {
            return err(format!("{here}.id: '{id}' is used twice"));
        }
        let when = when(&here, r.when)?;
        let header = |name: &str, what: &str| -> Result<http::HeaderName, ConfigError> {
            let lower = name.trim().to_ascii_lowercase();
            let parsed = http::HeaderName::from_bytes(lower.as_bytes())
                .map_err(|_| ConfigError(format!("{here}.{what}: '{name}' is not a header name")))?;
            if FRAMING.contains(&lower.as_str()) || crate::protocol::never_forwarded(&lower) {
                return err(format!("{here}.{what}: '{name}' is the gateway's to write (framing or a credential)"));
            }
            Ok(parsed)
        };
        let mut set_header = Vec::with_capacity(r.set_header.len());
        for (name, value) in &r.set_header {
            let value =
                http::HeaderValue::from_str(value).map_err(|_| ConfigError(format!("{here}.set_header.{name}: not a header value")))?;
            set_header.push((header(name, "set_header")?, value));
        }
        let remove_header = r.remove_header.iter().map(|n| header(n, "remove_header")).collect::<Result<Vec<_>, _>>()?;
        let path = |text: &str, what: &str| -> Result<JsonPath, ConfigError> {
            let p = JsonPath::parse(text).ok_or_else(|| {
                ConfigError(format!("{here}.{what}: '{text}' is not a path (members joined by '.', a number for an element)"))
            })?;
            if p.first() == "model" {
                return err(format!("{here}.{what}: '{text}': rename the model with rename_model"));
            }
            if METERED.contains(&p.first()) {
                return err(format!("{here}.{what}: '{text}': tollgate meters the call by it"));
            }
            let held = HELD.contains(&p.first())
                && (p.first() != "generationConfig"
                    || matches!(p.steps.get(1), Some(Step::Key(k)) if k == "maxOutputTokens" || k == "candidateCount"));
            if held && owner == Owner::Provider {
                return err(format!(
                    "{here}.{what}: '{text}': the call is held for it; set it in a group's rewrite, which runs before the hold"
                ));
            }
            Ok(p)
        };
        let set = r.set.iter().map(|(k, v)| Ok((path(k, "set")?, v.clone()))).collect::<Result<Vec<_>, ConfigError>>()?;
        let remove = r.remove.iter().map(|k| path(k, "remove")).collect::<Result<Vec<_>, _>>()?;
        let default = r.default.iter().map(|(k, v)| Ok((path(k, "default")?, v.clone()))).collect::<Result<Vec<_>, ConfigError>>()?;
        if let Some(m) = &r.rename_model {
            if m.is_empty() || m.len() > 256 || m.chars().any(char::is_control) {
                return err(format!("{here}.rename_model: a model name"));
            }
        }
        let rule = RewriteRule { id, when, set_header, remove_header, set, remove, default, rename_model: r.rename_model };
        if !rule.edits_body() && !rule.edits_headers() && rule.rename_model.is_none() {
            return err(format!("{here}: it changes nothing (set_header, remove_header, set, remove, default or rename_model)"));
        }
        out.push(rule);
    }
    Ok(out)
}

fn when(here: &str, raw: Option<RawWhen>) -> Result<When, ConfigError> {
    let Some(w) = raw else { return Ok(When::default()) };
    if let Some(m) = &w.model {
        if m.is_empty() || m.trim_end_matches('*').contains('*') {
            return err(format!("{here}.when.model: '{m}' — a name, or a prefix ending in one '*'"));
        }
    }
    if let Some(r) = &w.route {
        if !ROUTES.contains(&r.as_str()) {
            return err(format!("{here}.when.route: '{r}' is not one of {}", ROUTES.join(", ")));
        }
    }
    let mut header = Vec::with_capacity(w.header.len());
    for (name, value) in w.header {
        let parsed = http::HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
            .map_err(|_| ConfigError(format!("{here}.when.header: '{name}' is not a header name")))?;
        header.push((parsed, value));
    }
    Ok(When { model: w.model, route: w.route, header })
}
