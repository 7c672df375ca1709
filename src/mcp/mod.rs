//! The gateway's side of MCP servers (issue 52; not yet behind an endpoint): a client of one
//! server over Streamable HTTP in the handshake revisions — `initialize`, the session the
//! server gives (`Mcp-Session-Id`, made again when the server forgets it: a 404), requests and
//! their answers as JSON or as an SSE stream whose progress notifications are handed over as
//! they arrive. The credentials are the server's own (configured headers), never a client's.

pub mod upstream;
