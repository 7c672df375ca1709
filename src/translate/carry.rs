//! What an upstream needs back byte-exact on the next turn, carried through a client protocol
//! that has no place for it: inside the id of the tool call the client sees.
//!
//! * An Anthropic upstream that thought before calling a tool refuses the next turn unless
//!   those thinking blocks come back with their `signature`s (and redacted blocks with their data).
//! * A generate-content upstream attaches a `thoughtSignature` to a function call and expects it
//!   back on that call.
//!
//! The client's id is `<upstream id>__tgc__<base64url(JSON)>`; a client sends it back unchanged
//! (in the assistant turn's tool call and in the tool result), and [`restore`] puts the upstream
//! id and what it carried back in place before the request is encoded. Characters used are
//! those of base64url and `_`, accepted as an id by every client protocol.

use super::{Part, Request, Role};
use base64::Engine;
use serde::{Deserialize, Serialize};

const MARK: &str = "__tgc__";

/// What one tool call carries.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Carried {
    /// Signed thinking blocks before the call: (text, signature).
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "k")]
    pub thinking: Vec<(String, String)>,
    /// Redacted thinking blocks' data.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "r")]
    pub redacted: Vec<String>,
    /// A generate-content `thoughtSignature`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "g")]
    pub signature: Option<String>,
}

impl Carried {
    pub fn is_empty(&self) -> bool {
        self.thinking.is_empty() && self.redacted.is_empty() && self.signature.is_none()
    }

    /// The id the client sees for the call `id` with its own `signature`: it carries the
    /// thinking collected since the last call, which starts over.
    pub fn call_id(&mut self, id: &str, signature: Option<String>) -> String {
        let mut carried = std::mem::take(self);
        carried.signature = signature;
        wrap(id, &carried)
    }
}

/// The id a client sees for upstream id `id` carrying `carried`.
pub fn wrap(id: &str, carried: &Carried) -> String {
    if carried.is_empty() {
        return id.to_string();
    }
    let json = serde_json::to_vec(carried).unwrap_or_default();
    format!("{id}{MARK}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json))
}

/// The upstream id and what a client's id carries (nothing for an id tollgate did not wrap, or
/// one whose payload does not read).
pub fn unwrap(id: &str) -> (String, Carried) {
    let Some((upstream, payload)) = id.split_once(MARK) else {
        return (id.to_string(), Carried::default());
    };
    let carried = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|json| serde_json::from_slice::<Carried>(&json).ok());
    match carried {
        Some(c) => (upstream.to_string(), c),
        None => (id.to_string(), Carried::default()),
    }
}

/// Put carried ids and signatures back: every tool call and tool result gets its upstream id; a
/// call's `thoughtSignature` returns to it; an assistant turn whose calls carried thinking gets
/// those blocks back at its start, unless the client sent signed ones itself.
pub fn restore(req: &mut Request) {
    for m in &mut req.messages {
        let mut thinking: Vec<Part> = Vec::new();
        for part in &mut m.parts {
            match part {
                Part::ToolCall(call) => {
                    let (id, carried) = unwrap(&call.id);
                    call.id = id;
                    if carried.signature.is_some() {
                        call.signature = carried.signature;
                    }
                    for (text, signature) in carried.thinking {
                        thinking.push(Part::Thinking { text, signature: Some(signature) });
                    }
                    thinking.extend(carried.redacted.into_iter().map(Part::RedactedThinking));
                }
                Part::ToolResult { id, .. } => *id = unwrap(id).0,
                _ => {}
            }
        }
        let signed = |p: &Part| matches!(p, Part::Thinking { signature: Some(_), .. } | Part::RedactedThinking(_));
        if m.role == Role::Assistant && !thinking.is_empty() && !m.parts.iter().any(signed) {
            // An Anthropic upstream wants them first in the turn.
            m.parts.splice(0..0, thinking);
        }
    }
}

/// The ids a client sees for the tool calls among `parts` (in order): the signed thinking before
/// the first call rides on it, each call's own `thoughtSignature` on that call.
pub fn client_call_ids(parts: &[Part]) -> Vec<String> {
    let mut pending = Carried::default();
    let mut ids = Vec::new();
    for part in parts {
        match part {
            Part::Thinking { text, signature: Some(sig) } => pending.thinking.push((text.clone(), sig.clone())),
            Part::RedactedThinking(data) => pending.redacted.push(data.clone()),
            Part::ToolCall(call) => ids.push(pending.call_id(&call.id, call.signature.clone())),
            _ => {}
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::{Message, ToolCall};

    #[test]
    fn an_id_carries_signatures_and_gives_them_back_byte_exact() {
        let carried = Carried {
            thinking: vec![("Let me think…\n".into(), "EqQBCkYIARgCIkB+/==".into())],
            redacted: vec!["opaque+/=".into()],
            signature: Some("CiQB0e2Kb+/x==".into()),
        };
        let id = wrap("toolu_01AbC", &carried);
        assert!(id.starts_with("toolu_01AbC__tgc__"));
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'), "{id}");
        assert_eq!(unwrap(&id), ("toolu_01AbC".to_string(), carried));
        assert_eq!(unwrap("call_plain"), ("call_plain".to_string(), Carried::default()));
        assert_eq!(wrap("call_plain", &Carried::default()), "call_plain");
        // A payload that does not read leaves the id alone.
        assert_eq!(unwrap("x__tgc__!!!").0, "x__tgc__!!!");
    }

    #[test]
    fn restore_puts_thinking_back_first_in_the_turn_and_unwraps_results() {
        let carried = Carried { thinking: vec![("t".into(), "sig".into())], ..Default::default() };
        let id = wrap("toolu_1", &carried);
        let mut req = Request {
            messages: vec![
                Message {
                    role: Role::Assistant,
                    parts: vec![
                        Part::Text("calling".into()),
                        Part::ToolCall(ToolCall { id: id.clone(), name: "f".into(), arguments: "{}".into(), signature: None }),
                    ],
                },
                Message { role: Role::User, parts: vec![Part::ToolResult { id, content: vec![], is_error: false }] },
            ],
            ..Default::default()
        };
        restore(&mut req);
        assert_eq!(req.messages[0].parts[0], Part::Thinking { text: "t".into(), signature: Some("sig".into()) });
        assert!(matches!(&req.messages[0].parts[2], Part::ToolCall(c) if c.id == "toolu_1"));
        assert!(matches!(&req.messages[1].parts[0], Part::ToolResult { id, .. } if id == "toolu_1"));
    }
}
