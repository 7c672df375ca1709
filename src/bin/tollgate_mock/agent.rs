//! Agent turns: a request asking (`[[read:PATH]]`) with a file-reading or shell tool on offer
//! is answered with a call of that tool; one asking `[[call:NAME]]` with a tool of that name on
//! offer (an MCP tool, say) with a call of it, its arguments made from its schema (strings
//! `tolls`, numbers 3); a tool result coming back is answered with its text.

use crate::wire::*;
use serde_json::{json, Value};

/// The marker an agent test puts in its prompt: `[[read:PATH]]` asks the mock to answer with a
/// call of a file-reading (or shell) tool the request offers, reading PATH.
pub(crate) const READ_MARKER: &str = "[[read:";

/// `[[call:NAME]]` asks for a call of the offered tool NAME.
pub(crate) const CALL_MARKER: &str = "[[call:";

/// Arguments for a tool of `schema`: each property a string `tolls`, a number 3, a flag true.
fn made_args(schema: &Value) -> Value {
    let mut args = serde_json::Map::new();
    for (name, prop) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
        let value = match prop.get("type").and_then(Value::as_str).unwrap_or("string") {
            "integer" | "number" => json!(3),
            "boolean" => json!(true),
            _ => json!("tolls"),
        };
        args.insert(name.clone(), value);
    }
    Value::Object(args)
}

/// Tools the mock knows how to call to read a file, in order of preference: Claude Code's,
/// Gemini CLI's, Codex's (several versions) and the generic shell tools.
pub(crate) const READ_TOOLS: [&str; 7] = ["Read", "read_file", "shell_command", "exec_command", "shell", "run_shell_command", "Bash"];

/// The tools a request offers, as (name, JSON schema of the arguments).
pub(crate) fn offered_tools(kind: Kind, v: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for tool in v.get("tools").and_then(Value::as_array).into_iter().flatten() {
        match kind {
            Kind::Messages => {
                if let Some(name) = tool.get("name").and_then(Value::as_str) {
                    out.push((name.to_string(), tool.get("input_schema").cloned().unwrap_or(Value::Null)));
                }
            }
            Kind::Generate { .. } => {
                for d in tool.get("functionDeclarations").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(name) = d.get("name").and_then(Value::as_str) {
                        let schema = d.get("parametersJsonSchema").or_else(|| d.get("parameters")).cloned().unwrap_or(Value::Null);
                        out.push((name.to_string(), schema));
                    }
                }
            }
            Kind::Chat => {
                if let Some(f) = tool.get("function") {
                    if let Some(name) = f.get("name").and_then(Value::as_str) {
                        out.push((name.to_string(), f.get("parameters").cloned().unwrap_or(Value::Null)));
                    }
                }
            }
            Kind::Responses | Kind::Embeddings => {
                if tool.get("type").and_then(Value::as_str) == Some("function") {
                    if let Some(name) = tool.get("name").and_then(Value::as_str) {
                        out.push((name.to_string(), tool.get("parameters").cloned().unwrap_or(Value::Null)));
                    }
                }
            }
        }
    }
    out
}

/// Arguments that make tool `name` (with `schema`) read `path`: a property naming a path gets
/// the path; a command gets `cat PATH` (as a string or an argv array, as the schema says).
pub(crate) fn read_args(schema: &Value, path: &str) -> Value {
    let mut args = serde_json::Map::new();
    let props = schema.get("properties").and_then(Value::as_object);
    for (name, prop) in props.into_iter().flatten() {
        let kind = prop.get("type").and_then(Value::as_str).unwrap_or("string").to_ascii_lowercase();
        if name.contains("path") {
            args.insert(name.clone(), json!(path));
        } else if name == "command" || name == "cmd" {
            let command = if kind == "array" { json!(["cat", path]) } else { json!(format!("cat {path}")) };
            args.insert(name.clone(), command);
        }
    }
    Value::Object(args)
}

/// The text of the last tool result a request carries back, if any.
pub(crate) fn tool_result(kind: Kind, v: &Value) -> Option<String> {
    let text_of = |c: &Value| -> String {
        match c {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join(""),
            other => other.to_string(),
        }
    };
    let mut found = None;
    match kind {
        Kind::Messages => {
            for m in v.get("messages").and_then(Value::as_array).into_iter().flatten() {
                for block in m.get("content").and_then(Value::as_array).into_iter().flatten() {
                    if block.get("type").and_then(Value::as_str) == Some("tool_result") {
                        found = Some(block.get("content").map(text_of).unwrap_or_default());
                    }
                }
            }
        }
        Kind::Responses | Kind::Embeddings => {
            for item in v.get("input").and_then(Value::as_array).into_iter().flatten() {
                let t = item.get("type").and_then(Value::as_str).unwrap_or_default();
                if t == "function_call_output" || t == "custom_tool_call_output" {
                    found = Some(item.get("output").map(text_of).unwrap_or_default());
                }
            }
        }
        Kind::Chat => {
            for m in v.get("messages").and_then(Value::as_array).into_iter().flatten() {
                if m.get("role").and_then(Value::as_str) == Some("tool") {
                    found = Some(m.get("content").map(text_of).unwrap_or_default());
                }
            }
        }
        Kind::Generate { .. } => {
            for c in v.get("contents").and_then(Value::as_array).into_iter().flatten() {
                for part in c.get("parts").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(r) = part.pointer("/functionResponse/response") {
                        found = Some(r.to_string());
                    }
                }
            }
        }
    }
    found
}

/// An agent's turn: a request carrying a tool result is answered with that result's text
/// (`The tool answered: …`); one whose prompt holds `[[read:PATH]]` and that offers a known
/// tool is answered with a call of that tool reading PATH.
pub(crate) fn agent_turn(kind: Kind, v: &Value, body: &[u8]) -> (Option<ToolCall>, Option<String>) {
    if let Some(result) = tool_result(kind, v) {
        let result: String = result.chars().take(4000).collect();
        return (None, Some(format!("The tool answered: {}", result.trim())));
    }
    let text = String::from_utf8_lossy(body);
    if let Some(at) = text.find(CALL_MARKER) {
        let rest = &text[at + CALL_MARKER.len()..];
        let wanted = rest.find("]]").map(|end| &rest[..end]).unwrap_or_default();
        let tools = offered_tools(kind, v);
        return match tools.iter().find(|(name, _)| name == wanted) {
            Some((name, schema)) => (Some(ToolCall { name: name.clone(), args: made_args(schema).to_string() }), None),
            None => (None, Some(format!("No tool named {wanted} was offered."))),
        };
    }
    let Some(at) = text.find(READ_MARKER) else { return (None, echo(v)) };
    let rest = &text[at + READ_MARKER.len()..];
    let Some(end) = rest.find("]]") else { return (None, None) };
    let path = &rest[..end];
    let tools = offered_tools(kind, v);
    let chosen = READ_TOOLS.iter().find_map(|want| tools.iter().find(|(name, _)| name == want));
    match chosen {
        Some((name, schema)) => (Some(ToolCall { name: name.clone(), args: read_args(schema, path).to_string() }), None),
        None => (None, None),
    }
}

/// `[[echo]]` in a request's text: the mock answers with the rest of that text as it received
/// it (what a guardrail let through, masked or not), streamed in pieces of 6 characters
/// (`[[echo:N]]`: of N), so a match can be split across events.
pub(crate) const ECHO_MARKER: &str = "[[echo";

/// The text after `[[echo]]` (or `[[echo:N]]`) in any string of the request.
pub(crate) fn echo(v: &Value) -> Option<String> {
    let text = find_string(v, &|s| s.contains(ECHO_MARKER))?;
    let at = text.find(ECHO_MARKER)?;
    let rest = &text[at + ECHO_MARKER.len()..];
    let end = rest.find("]]")?;
    Some(rest[end + 2..].trim_start().to_string())
}

/// The piece length `[[echo:N]]` asks for (6 by default).
pub(crate) fn echo_pieces(v: &Value) -> Option<usize> {
    let text = find_string(v, &|s| s.contains(ECHO_MARKER))?;
    let rest = &text[text.find(ECHO_MARKER)? + ECHO_MARKER.len()..];
    let asked = rest.strip_prefix(':').and_then(|r| r[..r.find("]]")?].parse().ok());
    Some(asked.unwrap_or(6))
}

fn find_string<'v>(v: &'v Value, pred: &dyn Fn(&str) -> bool) -> Option<&'v str> {
    match v {
        Value::String(s) if pred(s) => Some(s),
        Value::Array(items) => items.iter().rev().find_map(|i| find_string(i, pred)),
        Value::Object(map) => map.values().find_map(|i| find_string(i, pred)),
        _ => None,
    }
}
