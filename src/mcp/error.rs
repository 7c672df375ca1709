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

impl McpError {
    /// A request that failed on its way: reqwest's words without the URL (it may carry the
    /// server's credentials in its userinfo or query).
    pub fn unreachable(e: reqwest::Error) -> McpError {
        let e = e.without_url();
        let mut text = e.to_string();
        // What lies under it (refused, reset, timed out), bounded.
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&crate::base::text::redact_url(&cause.to_string()));
            source = cause.source();
        }
        McpError::Unreachable(text.chars().take(500).collect())
    }

    /// What a client is told of a failure that is not the server's own JSON-RPC error: the
    /// kind of failure only — never the server's address, nor an upstream's or a library's
    /// words (those go to the log).
    pub fn for_client(&self) -> String {
        match self {
            McpError::Unreachable(_) => "the MCP server could not be reached or did not answer in time".to_string(),
            McpError::Status(s) => format!("the MCP server answered HTTP {s}"),
            McpError::Rpc { code, message } => format!("the MCP server answered error {code}: {message}"),
            McpError::Malformed(_) => "the MCP server's answer was not a JSON-RPC answer".to_string(),
        }
    }
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
