//! What goes wrong calling an MCP server (the room's floor: every other file of `mcp` names it).

/// Why a call to a server failed.
#[derive(Debug, Clone, PartialEq)]
pub enum McpError {
    /// Not reached, or the connection broke.
    Unreachable(String),
    /// It answered with an HTTP status that is not an answer.
    Status(u16),
    /// It answered with a JSON-RPC error.
    Rpc { code: i64, message: String },
    /// Its answer was not one (no response to the request, not JSON, too large).
    Malformed(String),
}

impl std::fmt::Display for McpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpError::Unreachable(e) => write!(f, "the MCP server could not be reached: {e}"),
            McpError::Status(s) => write!(f, "the MCP server answered HTTP {s}"),
            McpError::Rpc { code, message } => write!(f, "the MCP server answered error {code}: {message}"),
            McpError::Malformed(e) => write!(f, "the MCP server's answer was not one: {e}"),
        }
    }
}

/// A JSON-RPC response's result, or its error as [`McpError::Rpc`] (the message cut at 500
/// characters: a server's text goes into logs and answers).
pub fn result_of(message: &serde_json::Value) -> Result<serde_json::Value, McpError> {
    use serde_json::Value;
    if let Some(error) = message.get("error") {
        return Err(McpError::Rpc {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error.get("message").and_then(Value::as_str).unwrap_or_default().chars().take(500).collect(),
        });
    }
    Ok(message.get("result").cloned().unwrap_or(Value::Null))
}
