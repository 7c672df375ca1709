//! The one way tollgate builds a client for its own outbound HTTP calls (the identity provider,
//! token endpoints, batch and video APIs, result downloads, MCP servers, the trace collector):
//! each caller names its timeouts, whether redirects are followed and the CAs it trusts beside
//! the platform's roots; what every client shares — rustls with the native roots, reqwest's pool —
//! is decided here. Relayed model calls go through Pingora's connector, not this.

use std::time::Duration;

/// How a client calls out.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// The longest a connection may take to open (None: only `total` bounds it).
    pub connect: Option<Duration>,
    /// The longest a whole call may take (None: no bound).
    pub total: Option<Duration>,
    /// The longest between two reads of an answer (None: no bound).
    pub read: Option<Duration>,
    /// Whether redirects are followed (reqwest's bound of 10); false for a call whose answer must
    /// come from the host it was sent to (a provider's metadata, an MCP server).
    pub follow_redirects: bool,
    /// CAs trusted beside the platform's roots.
    pub roots: Vec<reqwest::Certificate>,
    /// HTTP/2 without ALPN (a plain-text gRPC collector).
    pub h2_prior_knowledge: bool,
    /// Idle connections kept per host (None: reqwest's default).
    pub idle_per_host: Option<usize>,
}

impl Default for Outbound {
    fn default() -> Self {
        Outbound {
            connect: None,
            total: None,
            read: None,
            follow_redirects: true,
            roots: Vec::new(),
            h2_prior_knowledge: false,
            idle_per_host: None,
        }
    }
}

/// A client could not be built (its TLS set-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientError(pub String);

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Outbound {
    /// The client.
    pub fn client(self) -> Result<reqwest::Client, ClientError> {
        let mut b = reqwest::Client::builder();
        if let Some(t) = self.connect {
            b = b.connect_timeout(t);
        }
        if let Some(t) = self.total {
            b = b.timeout(t);
        }
        if let Some(t) = self.read {
            b = b.read_timeout(t);
        }
        if !self.follow_redirects {
            b = b.redirect(reqwest::redirect::Policy::none());
        }
        for cert in self.roots {
            b = b.add_root_certificate(cert);
        }
        if self.h2_prior_knowledge {
            b = b.http2_prior_knowledge();
        }
        if let Some(n) = self.idle_per_host {
            b = b.pool_max_idle_per_host(n);
        }
        b.build().map_err(|e| ClientError(e.to_string()))
    }
}
