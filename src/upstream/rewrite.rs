//! Rewrite rules (`config::rewrite`) applied: a group's to the request as its client wrote it,
//! before the hold ([`before_hold`]); a provider's to what that provider is sent, after
//! translation and before signing ([`for_provider`], from `upstream_request`). Each rule's
//! `when` is read against the model the client named, the route and the client's headers; its
//! body edits run in the rule's order (`set`, then `default`, then `remove`) on the JSON body,
//! written again once; its header edits on the request sent. Pure.

use crate::config::rewrite::{JsonPath, RewriteRule, Step};
use crate::protocol::{ApiError, ErrorKind};
use bytes::Bytes;
use pingora_http::RequestHeader;
use serde_json::Value;

/// What a rule's `when` is read against.
#[derive(Clone, Copy)]
pub struct Facts<'a> {
    /// The model as the client named it (the gateway's name).
    pub model: &'a str,
    /// The route's label.
    pub route: &'static str,
    pub headers: &'a http::HeaderMap,
}

/// Whether `rule` applies to a request of `facts`.
pub fn applies(rule: &RewriteRule, facts: &Facts<'_>) -> bool {
    let w = &rule.when;
    w.model.as_deref().is_none_or(|m| match m.strip_suffix('*') {
        Some(prefix) => facts.model.starts_with(prefix),
        None => m == facts.model,
    }) && w.route.as_deref().is_none_or(|r| r == facts.route)
        && w.header.iter().all(|(name, want)| facts.headers.get(name).is_some_and(|v| want == "*" || v.to_str().is_ok_and(|v| v == want)))
}

/// What one rule did to a body, for `--explain-rewrite`.
pub fn edit_value(rule: &RewriteRule, body: &mut Value) -> Vec<String> {
    let mut did = Vec::new();
    for (path, value) in &rule.set {
        did.push(match place(body, path, value.clone(), true) {
            true => format!("set {} = {value}", path.text),
            false => format!("set {}: not applied (its parent is not an object or array)", path.text),
        });
    }
    for (path, value) in &rule.default {
        did.push(match place(body, path, value.clone(), false) {
            true => format!("default {} = {value}", path.text),
            false => format!("default {}: already set (left)", path.text),
        });
    }
    for path in &rule.remove {
        did.push(match take(body, path) {
            true => format!("removed {}", path.text),
            false => format!("remove {}: not there", path.text),
        });
    }
    did
}

/// Put `value` at `path` (members created on the way); `overwrite` false: only where nothing is.
fn place(body: &mut Value, path: &JsonPath, value: Value, overwrite: bool) -> bool {
    let Some((last, parents)) = path.steps.split_last() else { return false };
    let mut at = body;
    for step in parents {
        at = match (step, at) {
            (Step::Key(k), Value::Object(map)) => map.entry(k.clone()).or_insert_with(|| Value::Object(Default::default())),
            (Step::Index(i), Value::Array(items)) => match items.get_mut(*i) {
                Some(item) => item,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, at) {
        (Step::Key(k), Value::Object(map)) if overwrite || !map.contains_key(k) => {
            map.insert(k.clone(), value);
            true
        }
        (Step::Index(i), Value::Array(items)) if *i < items.len() && overwrite => {
            items[*i] = value;
            true
        }
        _ => false,
    }
}

/// Remove what is at `path`; whether there was something.
fn take(body: &mut Value, path: &JsonPath) -> bool {
    let Some((last, parents)) = path.steps.split_last() else { return false };
    let mut at = body;
    for step in parents {
        at = match (step, at) {
            (Step::Key(k), Value::Object(map)) => match map.get_mut(k) {
                Some(v) => v,
                None => return false,
            },
            (Step::Index(i), Value::Array(items)) => match items.get_mut(*i) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, at) {
        (Step::Key(k), Value::Object(map)) => map.remove(k).is_some(),
        (Step::Index(i), Value::Array(items)) if *i < items.len() => {
            items.remove(*i);
            true
        }
        _ => false,
    }
}

/// `body` edited by the rules that edit it (None: none does, or the body is empty — sent as it is).
fn edit_body<'r>(rules: impl Iterator<Item = &'r RewriteRule> + Clone, body: &[u8]) -> Result<Option<Bytes>, String> {
    if body.is_empty() || !rules.clone().any(RewriteRule::edits_body) {
        return Ok(None);
    }
    let mut value: Value = serde_json::from_slice(body).map_err(|e| format!("the body is not JSON ({e})"))?;
    for rule in rules {
        edit_value(rule, &mut value);
    }
    serde_json::to_vec(&value).map(|v| Some(Bytes::from(v))).map_err(|e| e.to_string())
}

/// Apply the header edits of `rules` to a request being sent.
pub fn edit_headers<'r>(rules: impl Iterator<Item = &'r RewriteRule>, req: &mut RequestHeader) -> pingora_error::Result<()> {
    for rule in rules {
        for name in &rule.remove_header {
            req.remove_header(name);
        }
        for (name, value) in &rule.set_header {
            req.insert_header(name.clone(), value.clone())?;
        }
    }
    Ok(())
}

/// A provider's rules that apply to a request of `facts`, in order.
#[inline]
pub fn for_provider<'r>(rules: &'r [RewriteRule], facts: &Facts<'_>) -> Vec<&'r RewriteRule> {
    if rules.is_empty() {
        return Vec::new();
    }
    rules.iter().filter(|r| applies(r, facts)).collect()
}

/// The model a provider is sent for `model`: the last matching rule's `rename_model`, else its
/// own name for it (`models: [{name, upstream}]`).
pub fn provider_model<'a>(config: &'a crate::config::ProviderConfig, matched: &[&'a RewriteRule], model: &'a str) -> &'a str {
    matched.iter().rev().find_map(|r| r.rename_model.as_deref()).unwrap_or_else(|| config.upstream_model(model))
}

/// The body a provider is sent, edited by its matching rules.
pub fn provider_body(matched: &[&RewriteRule], body: Bytes) -> pingora_error::Result<Bytes> {
    match edit_body(matched.iter().copied(), &body) {
        Ok(Some(edited)) => Ok(edited),
        Ok(None) => Ok(body),
        Err(e) => Err(pingora_error::Error::explain(pingora_error::ErrorType::InternalError, format!("rewrite: {e}"))),
    }
}

/// A group's rules that applied to a call: the group's list (shared, not copied) and which of
/// them, a bit each (a list has at most `config::rewrite::MAX_RULES`, 32).
#[derive(Debug, Clone)]
pub struct Matched {
    rules: std::sync::Arc<[RewriteRule]>,
    which: u32,
}

impl Matched {
    pub fn iter(&self) -> impl Iterator<Item = &RewriteRule> + Clone {
        self.rules.iter().enumerate().filter(|(i, _)| self.which & (1 << i) != 0).map(|(_, r)| r)
    }
}

/// A group's rules applied to its client's request before anything is held: the rules that
/// apply (their header edits are made when the request is sent) and the body they leave (the
/// same bytes when none edits it; `rename_model` names another model in the body).
pub fn before_hold(rules: &std::sync::Arc<[RewriteRule]>, facts: &Facts<'_>, body: Bytes) -> Result<(Bytes, Option<Matched>), ApiError> {
    let which = rules.iter().take(32).enumerate().filter(|(_, r)| applies(r, facts)).fold(0u32, |w, (i, _)| w | (1 << i));
    if which == 0 {
        return Ok((body, None));
    }
    let matched = Matched { rules: rules.clone(), which };
    let renamed = matched.iter().filter_map(|r| r.rename_model.as_deref()).last();
    let mut body = match edit_body(matched.iter(), &body) {
        Ok(Some(edited)) => edited,
        Ok(None) => body,
        Err(e) => return Err(ApiError::new(ErrorKind::BadRequest, format!("The request body could not be read: {e}"))),
    };
    if let Some(model) = renamed.filter(|_| !body.is_empty()) {
        body = super::seam::edit_object(&body, |map| {
            if map.contains_key("model") {
                map.insert("model".into(), Value::String(model.to_string()));
            }
        })
        .map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("The request body could not be read: {e}")))?;
    }
    Ok((body, Some(matched)))
}

/// The ids of rules, comma-separated (the access log, the trace).
pub fn ids<'r>(rules: impl Iterator<Item = &'r RewriteRule>) -> String {
    rules.map(|r| r.id.as_str()).collect::<Vec<_>>().join(",")
}

/// `tollgate -t --explain-rewrite <provider>`: the provider's rules, each read against a sample
/// request of its protocol for its first model (a messages one carries `anthropic-beta`), and
/// what each does to it; then the model, the headers and the body the provider would be sent
/// (before its kind's own fields and its signature).
pub fn explain(config: &crate::config::Config, provider: &str) -> Result<String, String> {
    let p = config.providers.iter().find(|p| p.name == provider).ok_or_else(|| {
        let names: Vec<&str> = config.providers.iter().map(|p| p.name.as_str()).collect();
        format!("no provider '{provider}' (the file names {})", names.join(", "))
    })?;
    let model = p.models.first().map(String::as_str).unwrap_or("model");
    let wire = p.wire(model);
    let (route, mut body, sample_headers): (&'static str, Value, &[(&str, &str)]) = match wire {
        crate::config::Protocol::Openai => (
            "chat_completions",
            serde_json::json!({"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 256}),
            &[("user-agent", "OpenAI/Python 1.99.0"), ("x-stainless-lang", "python")],
        ),
        crate::config::Protocol::Anthropic => (
            "messages",
            serde_json::json!({"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": "Hello"}], "anthropic_beta": ["context-1m-2025-08-07"]}),
            &[
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", "context-1m-2025-08-07,interleaved-thinking-2025-05-14"),
                ("user-agent", "claude-cli/2.1.197 (external, cli)"),
            ],
        ),
        crate::config::Protocol::Gemini => (
            "generate_content",
            serde_json::json!({"contents": [{"role": "user", "parts": [{"text": "Hello"}]}]}),
            &[("user-agent", "google-genai-sdk/1.30.0")],
        ),
    };
    let mut client = RequestHeader::build("POST", b"/", None).map_err(|e| e.to_string())?;
    for (name, value) in sample_headers {
        client.insert_header(*name, *value).map_err(|e| e.to_string())?;
    }
    let facts = Facts { model, route, headers: &client.headers };
    let mut out = format!(
        "provider {}: {} rewrite rule(s), read against a sample {route} request for {model}\nsample headers: {}\nsample body: {body}\n",
        p.name,
        p.rewrite.len(),
        sample_headers.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join("; ")
    );
    let mut matched = Vec::new();
    for rule in p.rewrite.iter() {
        if !applies(rule, &facts) {
            out.push_str(&format!("rule {}: does not apply to this sample ({})\n", rule.id, when_text(rule)));
            continue;
        }
        out.push_str(&format!("rule {}: applies ({})\n", rule.id, when_text(rule)));
        for name in &rule.remove_header {
            let had = client.headers.contains_key(name);
            out.push_str(&format!("  removed header {name}{}\n", if had { "" } else { " (not in the sample)" }));
        }
        for (name, value) in &rule.set_header {
            out.push_str(&format!("  set header {name}: {}\n", value.to_str().unwrap_or("(binary)")));
        }
        for did in edit_value(rule, &mut body) {
            out.push_str(&format!("  {did}\n"));
        }
        if let Some(m) = &rule.rename_model {
            out.push_str(&format!("  model sent as {m}\n"));
        }
        matched.push(rule);
    }
    edit_headers(matched.iter().copied(), &mut client).map_err(|e| e.to_string())?;
    let sent_model = provider_model(p, &matched, model);
    if let Some(named) = body.get_mut("model") {
        *named = Value::String(sent_model.to_string());
    }
    let sent: Vec<String> = client.headers.iter().map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("(binary)"))).collect();
    out.push_str(&format!("model sent: {sent_model}\n"));
    out.push_str(&format!("headers sent (of the sample's, before the gateway's own): {}\n", sent.join("; ")));
    out.push_str(&format!("body sent: {body}\n"));
    Ok(out)
}

fn when_text(rule: &RewriteRule) -> String {
    let w = &rule.when;
    let mut parts = Vec::new();
    if let Some(m) = &w.model {
        parts.push(format!("model {m}"));
    }
    if let Some(r) = &w.route {
        parts.push(format!("route {r}"));
    }
    for (name, value) in &w.header {
        parts.push(format!("header {name}: {value}"));
    }
    if parts.is_empty() {
        "always".to_string()
    } else {
        format!("when {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(set: &[(&str, Value)], default: &[(&str, Value)], remove: &[&str]) -> RewriteRule {
        let path = |p: &str| JsonPath::parse(p).expect("path");
        RewriteRule {
            id: "r".into(),
            when: Default::default(),
            set_header: Vec::new(),
            remove_header: Vec::new(),
            set: set.iter().map(|(p, v)| (path(p), v.clone())).collect(),
            remove: remove.iter().map(|p| path(p)).collect(),
            default: default.iter().map(|(p, v)| (path(p), v.clone())).collect(),
            rename_model: None,
        }
    }

    #[test]
    fn paths_are_set_defaulted_and_removed_through_objects_and_arrays() {
        let mut body = serde_json::json!({"a": {"b": 1}, "list": [{"x": 1}, {"x": 2}], "s": "text", "keep": true});
        let r = rule(
            &[("a.c.d", serde_json::json!(5)), ("list.1.x", serde_json::json!(9)), ("s.inner", serde_json::json!(0))],
            &[("a.b", serde_json::json!(7)), ("z", serde_json::json!("new"))],
            &["list.0", "missing.path", "keep"],
        );
        let did = edit_value(&r, &mut body);
        assert_eq!(body, serde_json::json!({"a": {"b": 1, "c": {"d": 5}}, "list": [{"x": 9}], "s": "text", "z": "new"}));
        assert!(did.iter().any(|d| d.contains("s.inner: not applied")), "{did:?}");
        assert!(did.iter().any(|d| d == "default a.b: already set (left)"), "{did:?}");
        assert!(did.iter().any(|d| d == "remove missing.path: not there"), "{did:?}");
        // Not a path: empty steps, or an index first.
        assert!(JsonPath::parse("a..b").is_none() && JsonPath::parse("0.a").is_none() && JsonPath::parse("").is_none());
    }

    #[test]
    fn a_rule_applies_when_every_condition_holds() {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-team", http::HeaderValue::from_static("blue"));
        let facts = Facts { model: "alpha-5.5", route: "chat_completions", headers: &headers };
        let mut r = rule(&[("a", Value::Null)], &[], &[]);
        assert!(applies(&r, &facts), "no condition: always");
        r.when.model = Some("alpha-*".into());
        r.when.route = Some("chat_completions".into());
        r.when.header = vec![(http::HeaderName::from_static("x-team"), "blue".into())];
        assert!(applies(&r, &facts));
        r.when.header = vec![(http::HeaderName::from_static("x-team"), "red".into())];
        assert!(!applies(&r, &facts));
        r.when.header = vec![(http::HeaderName::from_static("x-team"), "*".into())];
        assert!(applies(&r, &facts));
        r.when.route = Some("messages".into());
        assert!(!applies(&r, &facts));
        r.when.route = None;
        r.when.model = Some("alpha-5.4".into());
        assert!(!applies(&r, &facts));
    }
}
