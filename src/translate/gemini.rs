//! Generate-content, both sides: a client's request and the answer it reads, a provider's
//! request and the answer it sends (whole and streamed, over SSE or as one JSON array).
//!
//! The protocol has no tool-call ids: a call without one gets an id here, and a function
//! response is matched to the earliest unanswered call of its name.

use super::carry::{self, Carried};
use super::view::{Json, Object, NULL};
use super::{
    arguments_value, float, invalid, new_id, stops, uint, unsupported, Event, Field, Image, Message, Part, Reasoning, Request, Response,
    Role, Stop, Tool, ToolCall, ToolChoice, Translation, Usage,
};
use crate::config::Protocol;
use crate::protocol::ApiError;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// Request fields read by the decoder (both spellings the REST API accepts).
const MAPPED: [&str; 11] = [
    "model",
    "contents",
    "systemInstruction",
    "system_instruction",
    "tools",
    "toolConfig",
    "tool_config",
    "generationConfig",
    "generation_config",
    "safetySettings",
    "safety_settings",
];

/// Request fields that change nothing a provider of another protocol answers: dropped.
/// (`safetySettings` is read only to be dropped: other providers apply their own policies.)
pub const DROPPED: [&str; 3] = ["labels", "safetySettings", "safety_settings"];

/// Generation settings read by the decoder; any other is refused.
const GENERATION: [&str; 13] = [
    "maxOutputTokens",
    "temperature",
    "topP",
    "topK",
    "stopSequences",
    "candidateCount",
    "seed",
    "presencePenalty",
    "frequencyPenalty",
    "responseMimeType",
    "responseSchema",
    "responseJsonSchema",
    "thinkingConfig",
];

fn get<'a, 'b>(map: &'a Object<'b>, camel: &str, snake: &str) -> Option<&'a Json<'b>> {
    map.get(camel).or_else(|| map.get(snake)).filter(|v| !v.is_null())
}

/// A generate-content client's request in the internal form, refused where `to` cannot carry it.
pub fn decode_request(body: Object<'_>, to: Protocol) -> Result<Request, ApiError> {
    super::check_fields(&body, &MAPPED, &DROPPED, to)?;
    let mut req = Request::default();
    if let Some(sys) = get(&body, "systemInstruction", "system_instruction") {
        let text = match sys {
            Json::String(s) => s.to_string(),
            v => v.get("parts").and_then(super::text_of).unwrap_or_default(),
        };
        req.system.push(text);
    }
    let Some(Json::Array(contents)) = body.get("contents") else {
        return Err(invalid("contents", "a list of contents is required"));
    };
    // Calls not answered yet, by name: a function response takes the earliest.
    let mut unanswered: HashMap<String, Vec<String>> = HashMap::new();
    let mut made = 0usize;
    for (i, c) in contents.iter().enumerate() {
        let field = Field("contents", i);
        let role = match c.get("role").and_then(Json::as_str) {
            Some("model") => Role::Assistant,
            Some("user") | Some("function") | None => Role::User,
            Some(other) => return Err(invalid(field, &format!("unknown role '{other}'"))),
        };
        let mut parts = Vec::new();
        for p in c.get("parts").and_then(Json::as_array).into_iter().flatten() {
            if let Some(t) = p.get("text").and_then(Json::as_str) {
                if p.get("thought").and_then(Json::as_bool) == Some(true) {
                    parts.push(Part::Thinking { text: t.to_string(), signature: None });
                } else {
                    parts.push(Part::Text(t.to_string()));
                }
            } else if let Some(d) = p.get("inlineData").or_else(|| p.get("inline_data")) {
                let media_type = d.get("mimeType").or_else(|| d.get("mime_type")).and_then(Json::as_str).unwrap_or_default();
                if !media_type.starts_with("image/") {
                    return Err(unsupported(format!("{field}.parts"), to, &format!("inline '{media_type}' data has no counterpart")));
                }
                let data = d.get("data").and_then(Json::as_str).unwrap_or_default();
                parts.push(Part::Image(Image::Base64 { media_type: media_type.to_string(), data: data.to_string() }));
            } else if let Some(d) = p.get("fileData").or_else(|| p.get("file_data")) {
                let media_type = d.get("mimeType").or_else(|| d.get("mime_type")).and_then(Json::as_str).unwrap_or_default();
                if !media_type.starts_with("image/") {
                    return Err(unsupported(format!("{field}.parts"), to, &format!("'{media_type}' files have no counterpart")));
                }
                let uri = d.get("fileUri").or_else(|| d.get("file_uri")).and_then(Json::as_str).unwrap_or_default();
                parts.push(Part::Image(Image::Url(uri.to_string())));
            } else if let Some(call) = p.get("functionCall").or_else(|| p.get("function_call")) {
                let name = call.get("name").and_then(Json::as_str).unwrap_or_default().to_string();
                let id = call.get("id").and_then(Json::as_str).map_or_else(
                    || {
                        made += 1;
                        format!("call_tg{made}")
                    },
                    str::to_string,
                );
                unanswered.entry(name.clone()).or_default().push(id.clone());
                parts.push(Part::ToolCall(ToolCall {
                    id,
                    name,
                    arguments: call.get("args").map_or_else(|| "{}".to_string(), Json::to_json_text),
                    signature: p.get("thoughtSignature").or_else(|| p.get("thought_signature")).and_then(Json::as_str).map(str::to_string),
                }));
            } else if let Some(r) = p.get("functionResponse").or_else(|| p.get("function_response")) {
                let name = r.get("name").and_then(Json::as_str).unwrap_or_default();
                let waiting = unanswered.entry(name.to_string()).or_default();
                let id = match r.get("id").and_then(Json::as_str) {
                    Some(id) => {
                        waiting.retain(|w| w != id);
                        id.to_string()
                    }
                    None if !waiting.is_empty() => waiting.remove(0),
                    None => return Err(invalid(field, &format!("a function response for '{name}' answers no earlier call"))),
                };
                let response = r.get("response").unwrap_or(&NULL);
                let is_error = response.get("error").is_some() && response.get("output").is_none() && response.get("result").is_none();
                let text = match response.get("output").or_else(|| response.get("result")).or_else(|| response.get("error")) {
                    Some(Json::String(s)) => s.to_string(),
                    _ => response.to_json_text(),
                };
                parts.push(Part::ToolResult { id, content: vec![Part::Text(text)], is_error });
            } else if p.get("thoughtSignature").is_some() || p.as_object().is_some_and(Object::is_empty) {
                // A signature on its own part (kept on calls, where it matters); nothing to carry.
            } else {
                return Err(unsupported(format!("{field}.parts"), to, "only text, images and function calls can be carried"));
            }
        }
        req.messages.push(Message { role, parts });
    }
    req.messages = super::merge_roles(req.messages);
    req.tools = tools_of(&body, to)?;
    if let Some(cfg) =
        get(&body, "toolConfig", "tool_config").and_then(|c| c.get("functionCallingConfig").or_else(|| c.get("function_calling_config")))
    {
        let names: Vec<&str> = cfg
            .get("allowedFunctionNames")
            .or_else(|| cfg.get("allowed_function_names"))
            .and_then(Json::as_array)
            .map(|a| a.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default();
        req.tool_choice = match cfg.get("mode").and_then(Json::as_str).map(str::to_ascii_uppercase).as_deref() {
            Some("ANY") if names.len() == 1 => Some(ToolChoice::Named(names[0].to_string())),
            Some("ANY") if names.is_empty() => Some(ToolChoice::Required),
            Some("ANY") => return Err(unsupported("toolConfig.functionCallingConfig.allowedFunctionNames", to, "one name at most")),
            Some("NONE") => Some(ToolChoice::None),
            Some("AUTO") | Some("VALIDATED") | None => Some(ToolChoice::Auto),
            Some(_) => return Err(invalid("toolConfig.functionCallingConfig.mode", "must be AUTO, ANY, NONE or VALIDATED")),
        };
    }
    if let Some(Json::Object(g)) = get(&body, "generationConfig", "generation_config") {
        generation(g, &mut req, to)?;
    }
    Ok(req)
}

/// `tools`: function declarations only, their schema in JSON Schema.
fn tools_of(body: &Object<'_>, to: Protocol) -> Result<Vec<Tool>, ApiError> {
    let mut tools = Vec::new();
    for t in get(body, "tools", "tools").and_then(Json::as_array).into_iter().flatten() {
        let Some(decls) = t.get("functionDeclarations").or_else(|| t.get("function_declarations")).and_then(Json::as_array) else {
            return Err(unsupported("tools", to, "only function declarations can be carried"));
        };
        for d in decls {
            let schema = match (d.get("parametersJsonSchema").or_else(|| d.get("parameters_json_schema")), d.get("parameters")) {
                (Some(s), _) => s.to_value(),
                (None, Some(s)) => json_schema(&s.to_value()),
                (None, None) => json!({"type": "object", "properties": {}}),
            };
            tools.push(Tool {
                name: d.get("name").and_then(Json::as_str).ok_or_else(|| invalid("tools", "a function needs a name"))?.to_string(),
                description: d.get("description").and_then(Json::as_str).map(str::to_string),
                schema,
            });
        }
    }
    Ok(tools)
}

fn generation(raw: &Object<'_>, req: &mut Request, to: Protocol) -> Result<(), ApiError> {
    // The REST API takes both spellings; read them as camelCase.
    let g: Vec<(String, &Json<'_>)> = raw.iter().map(|(k, v)| (camel(k), v)).collect();
    for (name, v) in &g {
        if v.is_null() || GENERATION.contains(&name.as_str()) {
            continue;
        }
        if name == "responseModalities"
            && v.as_array().is_some_and(|m| m.iter().all(|x| x.as_str().is_some_and(|s| s.eq_ignore_ascii_case("text"))))
        {
            continue;
        }
        return Err(unsupported(format!("generationConfig.{name}"), to, "it has no counterpart there"));
    }
    let field = |name: &str| g.iter().rev().find(|(k, _)| k == name).map(|(_, v)| *v).filter(|v| !v.is_null());
    if let Some(v) = field("candidateCount") {
        if uint(v, "generationConfig.candidateCount")? > 1 {
            return Err(unsupported("generationConfig.candidateCount", to, "one candidate per request only"));
        }
    }
    if let Some(v) = field("maxOutputTokens") {
        req.max_output = Some(uint(v, "generationConfig.maxOutputTokens")?);
    }
    if let Some(v) = field("temperature") {
        req.temperature = Some(float(v, "generationConfig.temperature")?);
    }
    if let Some(v) = field("topP") {
        req.top_p = Some(float(v, "generationConfig.topP")?);
    }
    if let Some(v) = field("topK") {
        req.top_k = Some(v.as_f64().map(|k| k as u64).ok_or_else(|| invalid("generationConfig.topK", "must be a number"))?);
    }
    if let Some(v) = field("stopSequences") {
        req.stop = stops(v, "generationConfig.stopSequences")?;
    }
    if let Some(v) = field("seed") {
        if to == Protocol::Anthropic {
            return Err(unsupported("generationConfig.seed", to, "it has no seed"));
        }
        req.seed = Some(v.as_i64().ok_or_else(|| invalid("generationConfig.seed", "must be an integer"))?);
    }
    for (name, slot) in [("presencePenalty", &mut req.presence_penalty), ("frequencyPenalty", &mut req.frequency_penalty)] {
        if let Some(v) = field(name) {
            let value = float(v, name)?;
            if to == Protocol::Anthropic && value != 0.0 {
                return Err(unsupported(format!("generationConfig.{name}"), to, "it has no penalties"));
            }
            *slot = Some(value).filter(|v| *v != 0.0);
        }
    }
    let schema = field("responseJsonSchema").map(Json::to_value).or_else(|| field("responseSchema").map(|s| json_schema(&s.to_value())));
    match field("responseMimeType").and_then(Json::as_str) {
        Some("application/json") => req.json_output = Some(schema),
        Some("text/plain") | None if schema.is_none() => {}
        Some(other) => return Err(unsupported("generationConfig.responseMimeType", to, &format!("'{other}' has no counterpart"))),
        None => req.json_output = Some(schema),
    }
    if let Some(t) = field("thinkingConfig") {
        let budget = t.get("thinkingBudget").or_else(|| t.get("thinking_budget")).and_then(Json::as_i64);
        let level = t.get("thinkingLevel").or_else(|| t.get("thinking_level")).and_then(Json::as_str);
        req.reasoning = match (budget, level) {
            (Some(0), _) => Some(Reasoning::Off),
            (Some(b), _) if b > 0 => Some(Reasoning::Budget(b as u64)),
            (_, Some(level)) => Some(
                Reasoning::from_effort(&level.to_ascii_lowercase())
                    .ok_or_else(|| invalid("generationConfig.thinkingConfig.thinkingLevel", "unknown level"))?,
            ),
            // Dynamic (-1) or only `includeThoughts`: the provider's default.
            _ => None,
        };
    }
    Ok(())
}

fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// A generate-content schema (OpenAPI subset, upper-case types) as JSON Schema.
pub fn json_schema(s: &Value) -> Value {
    match s {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("type", Value::String(t)) => Value::String(t.to_ascii_lowercase()),
                        _ => json_schema(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(json_schema).collect()),
        other => other.clone(),
    }
}

/// Keywords of JSON Schema the generate-content schema subset takes; others are left out.
const SCHEMA_KEYS: [&str; 18] = [
    "type",
    "format",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "items",
    "anyOf",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "title",
    "propertyOrdering",
];

/// A JSON Schema narrowed to the generate-content subset: unsupported keywords dropped, a type
/// list with `null` made `nullable`, `const` an `enum` of one.
pub fn narrow_schema(s: &Value) -> Value {
    let Value::Object(map) = s else { return s.clone() };
    let mut out = Map::new();
    for (k, v) in map {
        match k.as_str() {
            "properties" => {
                let props = v.as_object().map(|p| p.iter().map(|(name, s)| (name.clone(), narrow_schema(s))).collect()).unwrap_or_default();
                out.insert(k.clone(), Value::Object(props));
            }
            "items" => {
                out.insert(k.clone(), narrow_schema(v));
            }
            "anyOf" | "oneOf" => {
                out.insert("anyOf".into(), Value::Array(v.as_array().into_iter().flatten().map(narrow_schema).collect()));
            }
            "type" => match v {
                Value::Array(types) => {
                    let kinds: Vec<&str> = types.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect();
                    if kinds.len() < types.len() {
                        out.insert("nullable".into(), json!(true));
                    }
                    if let Some(first) = kinds.first() {
                        out.insert("type".into(), json!(first));
                    }
                }
                other => {
                    out.insert(k.clone(), other.clone());
                }
            },
            "const" => {
                out.insert("enum".into(), json!([v]));
            }
            key if SCHEMA_KEYS.contains(&key) => {
                out.insert(k.clone(), v.clone());
            }
            _ => {}
        }
    }
    Value::Object(out)
}

fn image_part(i: &Image) -> Value {
    match i {
        Image::Base64 { media_type, data } => json!({"inlineData": {"mimeType": media_type, "data": data}}),
        Image::Url(url) => {
            let ext = url.rsplit('.').next().unwrap_or_default().to_ascii_lowercase();
            let mime = match ext.as_str() {
                "jpg" | "jpeg" => "image/jpeg",
                "gif" => "image/gif",
                "webp" => "image/webp",
                _ => "image/png",
            };
            json!({"fileData": {"mimeType": mime, "fileUri": url}})
        }
    }
}

/// The internal form as a generate-content provider's request (thoughts asked for when the
/// request reasons, so they reach the client).
pub fn encode_request(req: &Request) -> Result<Value, ApiError> {
    let to = Protocol::Gemini;
    if req.no_parallel_tools {
        return Err(unsupported("parallel_tool_calls", to, "it cannot limit a turn to one call"));
    }
    let mut names: HashMap<&str, &str> = HashMap::new();
    for m in &req.messages {
        for p in &m.parts {
            if let Part::ToolCall(c) = p {
                names.insert(c.id.as_str(), c.name.as_str());
            }
        }
    }
    let mut contents = Vec::new();
    for m in super::alternating_turns(&req.messages) {
        let mut parts = Vec::new();
        for p in &m.parts {
            match p {
                Part::Text(t) if !t.is_empty() => parts.push(json!({"text": t})),
                Part::Image(i) => parts.push(image_part(i)),
                Part::ToolCall(c) => {
                    let mut part = json!({"functionCall": {"name": c.name, "args": arguments_value(&c.arguments)}});
                    if let Some(sig) = &c.signature {
                        part["thoughtSignature"] = json!(sig);
                    }
                    parts.push(part);
                }
                Part::ToolResult { id, content, is_error } => {
                    let Some(name) = names.get(id.as_str()) else {
                        return Err(invalid("tool result", &format!("'{id}' answers no tool call of this conversation")));
                    };
                    let text = super::parts_text(content);
                    let response = if *is_error { json!({"error": text}) } else { json!({"output": text}) };
                    parts.push(json!({"functionResponse": {"name": name, "response": response}}));
                    parts.extend(content.iter().filter_map(|p| if let Part::Image(i) = p { Some(image_part(i)) } else { None }));
                }
                // Thoughts are not sent back (their signatures ride on the calls).
                _ => {}
            }
        }
        if parts.is_empty() {
            continue;
        }
        let role = if m.role == Role::Assistant { "model" } else { "user" };
        contents.push(json!({"role": role, "parts": parts}));
    }
    let mut out = json!({"contents": contents});
    if !req.system.is_empty() {
        out["systemInstruction"] = json!({"parts": [{"text": req.system.join("\n\n")}]});
    }
    if !req.tools.is_empty() {
        let decls: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut d = json!({"name": t.name, "parameters": narrow_schema(&t.schema)});
                if let Some(desc) = &t.description {
                    d["description"] = json!(desc);
                }
                d
            })
            .collect();
        out["tools"] = json!([{"functionDeclarations": decls}]);
    }
    if let Some(choice) = &req.tool_choice {
        out["toolConfig"] = json!({"functionCallingConfig": match choice {
            ToolChoice::Auto => json!({"mode": "AUTO"}),
            ToolChoice::None => json!({"mode": "NONE"}),
            ToolChoice::Required => json!({"mode": "ANY"}),
            ToolChoice::Named(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
        }});
    }
    let mut g = Map::new();
    if let Some(max) = req.max_output {
        g.insert("maxOutputTokens".into(), json!(max));
    }
    for (name, v) in [
        ("temperature", req.temperature),
        ("topP", req.top_p),
        ("presencePenalty", req.presence_penalty),
        ("frequencyPenalty", req.frequency_penalty),
    ] {
        if let Some(v) = v {
            g.insert(name.into(), json!(v));
        }
    }
    if let Some(k) = req.top_k {
        g.insert("topK".into(), json!(k));
    }
    if !req.stop.is_empty() {
        g.insert("stopSequences".into(), json!(req.stop));
    }
    if let Some(seed) = req.seed {
        g.insert("seed".into(), json!(seed));
    }
    if let Some(json_output) = &req.json_output {
        g.insert("responseMimeType".into(), json!("application/json"));
        if let Some(schema) = json_output {
            g.insert("responseSchema".into(), narrow_schema(schema));
        }
    }
    match req.reasoning {
        Some(Reasoning::Budget(b)) => {
            g.insert("thinkingConfig".into(), json!({"thinkingBudget": b, "includeThoughts": true}));
        }
        Some(Reasoning::Off) => {
            g.insert("thinkingConfig".into(), json!({"thinkingBudget": 0}));
        }
        None => {}
    }
    if !g.is_empty() {
        out["generationConfig"] = Value::Object(g);
    }
    Ok(out)
}

fn stop_of(reason: &str, called: bool) -> Option<Stop> {
    Some(match reason {
        "STOP" if called => Stop::ToolUse,
        "STOP" => Stop::EndTurn,
        "MAX_TOKENS" => Stop::MaxTokens,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => Stop::ContentFilter,
        "FINISH_REASON_UNSPECIFIED" => return None,
        _ => Stop::EndTurn,
    })
}

fn stop_name(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn | Stop::ToolUse | Stop::StopSequence => "STOP",
        Stop::MaxTokens => "MAX_TOKENS",
        Stop::ContentFilter => "SAFETY",
    }
}

/// Generate-content usage in the internal meaning (the prompt count includes cached tokens,
/// the candidates count excludes thoughts).
fn usage_of(u: &Value) -> Usage {
    let prompt = crate::protocol::u(u, "/promptTokenCount").unwrap_or(0);
    let cached = crate::protocol::u(u, "/cachedContentTokenCount").unwrap_or(0).min(prompt);
    let thoughts = crate::protocol::u(u, "/thoughtsTokenCount").unwrap_or(0);
    Usage {
        input: prompt - cached,
        cache_read: cached,
        cache_write: 0,
        output: crate::protocol::u(u, "/candidatesTokenCount").unwrap_or(0) + thoughts,
        reasoning: thoughts,
    }
}

fn usage_value(u: &Usage) -> Value {
    let candidates = u.output.saturating_sub(u.reasoning);
    let mut v = json!({
        "promptTokenCount": u.prompt_total(),
        "candidatesTokenCount": candidates,
        "totalTokenCount": u.prompt_total() + u.output,
    });
    if u.cache_read > 0 {
        v["cachedContentTokenCount"] = json!(u.cache_read);
    }
    if u.reasoning > 0 {
        v["thoughtsTokenCount"] = json!(u.reasoning);
    }
    v
}

/// The parts of one generate-content chunk or body.
fn parts_of(v: &Value) -> &[Value] {
    crate::protocol::at(v, "/candidates/0/content/parts").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// A generate-content provider's whole answer in the internal form.
pub fn decode_response(v: &Value) -> Option<Response> {
    if v.get("candidates").is_none() && v.get("promptFeedback").is_none() {
        return None;
    }
    let mut parts = Vec::new();
    for p in parts_of(v) {
        if let Some(t) = p.get("text").and_then(Value::as_str) {
            if p.get("thought") == Some(&Value::Bool(true)) {
                parts.push(Part::Thinking { text: t.to_string(), signature: None });
            } else {
                parts.push(Part::Text(t.to_string()));
            }
        } else if let Some(call) = p.get("functionCall") {
            parts.push(Part::ToolCall(ToolCall {
                id: call.get("id").and_then(Value::as_str).map_or_else(|| new_id("call_"), str::to_string),
                name: call.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                arguments: call.get("args").map_or_else(|| "{}".to_string(), Value::to_string),
                signature: p.get("thoughtSignature").and_then(Value::as_str).map(str::to_string),
            }));
        }
    }
    let called = parts.iter().any(|p| matches!(p, Part::ToolCall(_)));
    let blocked = crate::protocol::at(v, "/promptFeedback/blockReason").is_some();
    let stop = crate::protocol::at(v, "/candidates/0/finishReason").and_then(Value::as_str).and_then(|r| stop_of(r, called));
    Some(Response {
        id: v.get("responseId").and_then(Value::as_str).unwrap_or_default().to_string(),
        parts,
        stop: if blocked { Some(Stop::ContentFilter) } else { stop },
        usage: v.get("usageMetadata").filter(|u| u.is_object()).map(usage_of),
    })
}

fn call_part(id: &str, name: &str, arguments: &str) -> Value {
    json!({"functionCall": {"id": id, "name": name, "args": arguments_value(arguments)}})
}

/// The internal form as the whole answer a generate-content client reads.
pub fn encode_response(t: &Translation, r: &Response) -> Value {
    let ids = carry::client_call_ids(&r.parts);
    let mut calls = 0;
    let parts: Vec<Value> = r
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(s) => Some(json!({"text": s})),
            Part::Thinking { text, .. } => Some(json!({"text": text, "thought": true})),
            Part::ToolCall(c) => {
                let id = ids.get(calls).cloned().unwrap_or_else(|| c.id.clone());
                calls += 1;
                Some(call_part(&id, &c.name, &c.arguments))
            }
            _ => None,
        })
        .collect();
    let mut out = json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": stop_name(r.stop.unwrap_or(Stop::EndTurn)), "index": 0}],
        "modelVersion": t.model,
        "responseId": new_id(""),
    });
    if let Some(u) = &r.usage {
        out["usageMetadata"] = usage_value(u);
    }
    out
}

/// Reads a generate-content provider's stream (`alt=sse`).
#[derive(Debug, Default)]
pub struct Decoder {
    called: bool,
}

impl Decoder {
    pub fn event(&mut self, data: &str, out: &mut Vec<Event>) {
        let Ok(v) = serde_json::from_str::<Value>(data) else { return };
        if let Some(e) = v.get("error") {
            let status = e.get("code").and_then(Value::as_u64).and_then(|c| u16::try_from(c).ok()).unwrap_or(500);
            let message = e.get("message").and_then(Value::as_str).unwrap_or("The upstream service failed.").to_string();
            out.push(Event::Error { status, message });
            return;
        }
        if let Some(u) = v.get("usageMetadata").filter(|u| u.is_object()) {
            out.push(Event::Usage(usage_of(u)));
        }
        for p in parts_of(&v) {
            if let Some(t) = p.get("text").and_then(Value::as_str) {
                if t.is_empty() {
                    continue;
                }
                if p.get("thought") == Some(&Value::Bool(true)) {
                    out.push(Event::Thinking(t.to_string()));
                } else {
                    out.push(Event::Text(t.to_string()));
                }
            } else if let Some(call) = p.get("functionCall") {
                self.called = true;
                out.push(Event::ToolStart {
                    id: call.get("id").and_then(Value::as_str).map_or_else(|| new_id("call_"), str::to_string),
                    name: call.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                    signature: p.get("thoughtSignature").and_then(Value::as_str).map(str::to_string),
                });
                out.push(Event::ToolArgs(call.get("args").map_or_else(|| "{}".to_string(), Value::to_string)));
            }
        }
        let blocked = crate::protocol::at(&v, "/promptFeedback/blockReason").is_some();
        let stop = crate::protocol::at(&v, "/candidates/0/finishReason").and_then(Value::as_str).and_then(|r| stop_of(r, self.called));
        if let Some(stop) = if blocked { Some(Stop::ContentFilter) } else { stop } {
            out.push(Event::Stop(stop));
        }
    }
}

/// A call being streamed to a generate-content client (sent whole: the protocol has no pieces).
struct OpenCall {
    id: String,
    name: String,
    arguments: String,
}

/// Writes the stream a generate-content client reads: SSE, or one JSON array.
pub struct Encoder {
    id: String,
    model: String,
    sse: bool,
    chunks: usize,
    call: Option<OpenCall>,
    pending: Carried,
    stop: Option<Stop>,
    usage: Option<Usage>,
}

impl Encoder {
    pub fn new(t: &Translation) -> Encoder {
        Encoder {
            id: new_id(""),
            model: t.model.clone(),
            sse: t.gemini_sse,
            chunks: 0,
            call: None,
            pending: Carried::default(),
            stop: None,
            usage: None,
        }
    }

    fn chunk(&mut self, out: &mut Vec<u8>, parts: Vec<Value>, finish: Option<Stop>) {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        if let Some(stop) = finish {
            candidate["finishReason"] = json!(stop_name(stop));
        }
        let mut v = json!({"candidates": [candidate], "modelVersion": self.model, "responseId": self.id});
        if let Some(u) = &self.usage {
            v["usageMetadata"] = usage_value(u);
        }
        self.write(out, &v);
    }

    fn write(&mut self, out: &mut Vec<u8>, data: &Value) {
        if self.sse {
            out.extend_from_slice(b"data: ");
            super::sse::serialized_into(out, data);
            out.extend_from_slice(b"\r\n\r\n");
        } else {
            out.extend_from_slice(if self.chunks == 0 { b"[" } else { b",\r\n" });
            super::sse::serialized_into(out, data);
        }
        self.chunks += 1;
    }

    fn flush_call(&mut self, out: &mut Vec<u8>) {
        if let Some(call) = self.call.take() {
            self.chunk(out, vec![call_part(&call.id, &call.name, &call.arguments)], None);
        }
    }

    pub fn event(&mut self, e: Event, out: &mut Vec<u8>) {
        match e {
            Event::ToolArgs(a) => {
                if let Some(call) = &mut self.call {
                    call.arguments.push_str(&a);
                }
                return;
            }
            Event::Usage(u) => {
                self.usage = Some(u);
                return;
            }
            _ => {}
        }
        self.flush_call(out);
        match e {
            Event::Text(t) => self.chunk(out, vec![json!({"text": t})], None),
            Event::Thinking(t) => self.chunk(out, vec![json!({"text": t, "thought": true})], None),
            Event::SignedThinking { text, signature } => self.pending.thinking.push((text, signature)),
            Event::RedactedThinking(data) => self.pending.redacted.push(data),
            Event::ToolStart { id, name, signature } => {
                self.call = Some(OpenCall { id: self.pending.call_id(&id, signature), name, arguments: String::new() });
            }
            Event::Stop(stop) => self.stop = Some(stop),
            Event::Error { status, message } => {
                let err = crate::protocol::upstream_error::rewrite(status, Some(&message), None);
                self.write(out, &crate::protocol::gemini::error_body(&err));
            }
            Event::ToolArgs(_) | Event::Usage(_) => {}
        }
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.flush_call(out);
        let stop = self.stop.unwrap_or(Stop::EndTurn);
        self.chunk(out, vec![json!({"text": ""})], Some(stop));
        if !self.sse {
            out.push(b']');
        }
    }
}
