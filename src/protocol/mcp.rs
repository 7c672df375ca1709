//! The Model Context Protocol's wire, as a gateway in front of several MCP servers needs it
//! (issue 52): which protocol revision to answer, the prefixed tool names that keep servers'
//! tools apart (`server__tool`), and the messages an answer carries — a JSON body, or an SSE
//! stream of `message` events (progress notifications, then the response). Pure: no I/O.

use serde_json::Value;

/// The handshake revisions (`initialize`, `Mcp-Session-Id`), oldest first.
pub const HANDSHAKE_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The stateless revision: no handshake, no session; each request carries its envelope in
/// `_meta` (the revision, the client's name and capabilities), after a `server/discover` probe.
pub const MODERN_VERSION: &str = "2026-07-28";

/// Where a request of the stateless revision names its revision, in `params._meta`.
const VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";

/// The revision a request's envelope names (stateless revisions only).
pub fn envelope_version(params: &Value) -> Option<&str> {
    params.get("_meta")?.get(VERSION_META)?.as_str()
}

/// `params` without the envelope (the protocol's own `_meta` keys, `io.modelcontextprotocol/…`):
/// what a server spoken to in a handshake revision is sent. A progress token stays.
pub fn without_envelope(params: &Value) -> Value {
    let mut p = params.clone();
    if let Some(meta) = p.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
        if meta.is_empty() {
            if let Some(o) = p.as_object_mut() {
                o.remove("_meta");
            }
        }
    }
    p
}

/// A result as the stateless revision shapes it: `resultType`, and for what a client may cache
/// (listings, reads, discovery) a private scope that is stale at once.
pub fn modern_result(method: &str, result: &mut Value) {
    let Some(o) = result.as_object_mut() else { return };
    o.entry("resultType").or_insert_with(|| Value::String("complete".into()));
    let cacheable = matches!(
        method,
        "server/discover" | "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" | "resources/read"
    );
    if cacheable {
        o.entry("cacheScope").or_insert_with(|| Value::String("private".into()));
        o.entry("ttlMs").or_insert_with(|| Value::from(0));
    }
}

/// What separates a server's name from its tool's in a prefixed name.
pub const SEPARATOR: &str = "__";

/// The longest tool name MCP allows (its specification: 1 to 128 characters).
pub const MAX_TOOL_NAME: usize = 128;

/// The revision to answer an `initialize` asking for `asked`: the same when it is one this side
/// speaks, else the newest (the client then decides whether it can go on).
pub fn negotiate(asked: &str) -> &'static str {
    HANDSHAKE_VERSIONS.iter().find(|v| **v == asked).copied().unwrap_or(HANDSHAKE_VERSIONS[HANDSHAKE_VERSIONS.len() - 1])
}

/// `server__tool`. Server names hold no `__` (the configuration refuses it), so the split
/// below is the only one.
pub fn prefixed(server: &str, tool: &str) -> String {
    format!("{server}{SEPARATOR}{tool}")
}

/// The server and the tool of a prefixed name; None for a name without a server.
pub fn split(name: &str) -> Option<(&str, &str)> {
    let (server, tool) = name.split_once(SEPARATOR)?;
    (!server.is_empty() && !tool.is_empty()).then_some((server, tool))
}

/// A server name the prefix scheme can carry: letters, digits and single `-`/`_`, 1 to 32.
pub fn valid_server_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !name.contains(SEPARATOR)
        && !name.ends_with('_')
}

/// One SSE event: its name (`message` when it names none) and its data (multi-line data joined
/// with newlines, as SSE defines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// The event of one block of SSE lines (without its blank line); None for a block of comments.
fn parse_event(block: &str) -> Option<SseEvent> {
    let mut event = String::new();
    let mut data: Option<String> = None;
    for line in block.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)) {
        let (field, value) = line.split_once(':').map_or((line, ""), |(f, v)| (f, v.strip_prefix(' ').unwrap_or(v)));
        match field {
            "event" => event = value.to_string(),
            "data" => match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_string()),
            },
            _ => {}
        }
    }
    let data = data?;
    Some(SseEvent { event: if event.is_empty() { "message".into() } else { event }, data })
}

/// The JSON-RPC messages of an answer: its body as JSON (one message, or a batch), or the
/// `data` of each SSE event. Messages that are not JSON are left out.
pub fn messages(content_type: &str, body: &[u8]) -> Vec<Value> {
    if content_type.trim_start().to_ascii_lowercase().starts_with("text/event-stream") {
        let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
        return text.split("\n\n").filter_map(parse_event).filter_map(|e| serde_json::from_str::<Value>(&e.data).ok()).collect();
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(items)) => items,
        Ok(v) => vec![v],
        Err(_) => Vec::new(),
    }
}

/// SSE events as their bytes arrive: `push` a chunk, get the JSON-RPC messages of the events it
/// completed (`push_events`: the events themselves, for a stream whose events are not all
/// JSON). An event may span chunks; `\r\n` and `\n` both end lines. At most `max` bytes of one
/// unfinished event are kept; past that the stream is refused (`Err`).
#[derive(Debug, Default)]
pub struct Events {
    pending: Vec<u8>,
}

impl Events {
    pub fn push(&mut self, chunk: &[u8], max: usize) -> Result<Vec<Value>, &'static str> {
        Ok(self.push_events(chunk, max)?.into_iter().filter_map(|e| serde_json::from_str::<Value>(&e.data).ok()).collect())
    }

    pub fn push_events(&mut self, chunk: &[u8], max: usize) -> Result<Vec<SseEvent>, &'static str> {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some((at, len)) = find_event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..at + len).collect();
            out.extend(parse_event(&String::from_utf8_lossy(&event[..at])));
        }
        if self.pending.len() > max {
            return Err("an event of the MCP server's stream is larger than the gateway takes");
        }
        Ok(out)
    }
}

/// Where the first event of `buf` ends: the offset of its blank line and that separator's length.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        match (buf[i], buf[i + 1]) {
            (b'\n', b'\n') => return Some((i, 2)),
            (b'\n', b'\r') if buf.get(i + 2) == Some(&b'\n') => return Some((i, 3)),
            _ => i += 1,
        }
    }
    None
}

/// The response to request `id` among `messages` (a result or an error).
pub fn response_to<'a>(messages: &'a [Value], id: &Value) -> Option<&'a Value> {
    messages.iter().find(|m| m.get("id") == Some(id) && (m.get("result").is_some() || m.get("error").is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_prefixed_and_split_at_the_one_separator() {
        assert_eq!(prefixed("docs", "search"), "docs__search");
        assert_eq!(split("docs__search"), Some(("docs", "search")));
        assert_eq!(split("docs__deep__tool"), Some(("docs", "deep__tool")), "a tool's own __ stays the tool's");
        assert_eq!(split("search"), None);
        assert_eq!(split("__x"), None);
        assert!(valid_server_name("docs-2") && valid_server_name("a_b"));
        assert!(!valid_server_name("a__b") && !valid_server_name("a_") && !valid_server_name("") && !valid_server_name("a/b"));
    }

    #[test]
    fn the_revision_is_the_clients_when_known_else_the_newest() {
        assert_eq!(negotiate("2025-06-18"), "2025-06-18");
        assert_eq!(negotiate("2099-01-01"), "2025-11-25");
    }

    #[test]
    fn messages_come_from_json_bodies_and_sse_events() {
        let sse = b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\r\n\r\n: ping\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":7,\"result\":{}}\n\n";
        let got = messages("text/event-stream; charset=utf-8", sse);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0]["method"], "notifications/progress");
        assert_eq!(response_to(&got, &json!(7)), Some(&json!({"jsonrpc": "2.0", "id": 7, "result": {}})));
        assert_eq!(response_to(&got, &json!(8)), None);
        assert_eq!(messages("application/json", br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).len(), 1);
        assert_eq!(messages("application/json", b"[1,2]").len(), 2);
        assert!(messages("application/json", b"nope").is_empty());
    }

    #[test]
    fn events_are_read_as_their_bytes_arrive() {
        let mut e = Events::default();
        assert!(e.push(b"event: message\r\ndata: {\"id\":1,", 1 << 20).unwrap().is_empty());
        let got = e.push(b"\"result\":{}}\r\n\r\nevent: message\ndata: {\"method\":\"x\"}\n\ndata: {", 1 << 20).unwrap();
        assert_eq!(got, vec![json!({"id": 1, "result": {}}), json!({"method": "x"})]);
        assert!(e.push(&[b'a'; 64], 32).is_err(), "an unfinished event past the bound");
        // The older transport's first event is not JSON: its name and data.
        let mut e = Events::default();
        let got = e.push_events(b": hello\n\nevent: endpoint\r\ndata: /messages/?session_id=ab\r\n\r\n", 1 << 20).unwrap();
        assert_eq!(got, vec![SseEvent { event: "endpoint".into(), data: "/messages/?session_id=ab".into() }]);
    }

    #[test]
    fn the_stateless_envelope_is_read_taken_off_and_its_results_shaped() {
        let params = json!({"name": "docs__search", "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientInfo": {}, "progressToken": 7}});
        assert_eq!(envelope_version(&params), Some(MODERN_VERSION));
        assert_eq!(without_envelope(&params), json!({"name": "docs__search", "_meta": {"progressToken": 7}}));
        assert_eq!(without_envelope(&json!({"_meta": {"io.modelcontextprotocol/x": 1}})), json!({}));
        assert_eq!(envelope_version(&json!({})), None);
        let mut listed = json!({"tools": []});
        modern_result("tools/list", &mut listed);
        assert_eq!(listed, json!({"tools": [], "resultType": "complete", "cacheScope": "private", "ttlMs": 0}));
        let mut called = json!({"content": []});
        modern_result("tools/call", &mut called);
        assert_eq!(called, json!({"content": [], "resultType": "complete"}));
    }
}
