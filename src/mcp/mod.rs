//! The gateway's side of MCP servers (issue 52): the servers of `mcp:` behind one endpoint,
//! `/mcp`, for every key.
//!
//! * [`upstream`]: a client of one server over Streamable HTTP in the handshake revisions —
//!   `initialize`, the session the server gives (`Mcp-Session-Id`, made again when the server
//!   forgets it: a 404), requests and their answers as JSON or as an SSE stream whose progress
//!   notifications are handed over as they arrive.
//! * [`legacy`]: the same over the 2024-11-05 transport (a GET stream naming where messages
//!   are posted, carrying every answer).
//! * [`auth`]: the server's own credentials (headers, or an OAuth client-credentials token),
//!   never a client's.
//! * [`hub`]: the clients' sessions with tollgate, each with its own session at every server,
//!   and the union of what the servers offer (tools and prompts named `server__name`).

pub mod auth;
pub mod error;
pub mod hub;
pub mod legacy;
pub mod upstream;
