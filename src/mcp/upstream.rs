//! One MCP server, as the gateway calls it.

use super::auth::Credentials;
pub use super::error::McpError;
use crate::protocol::mcp::{response_to, Events, HANDSHAKE_VERSIONS};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The largest unfinished SSE event, or JSON answer, taken from a server.
const MAX_MESSAGE: usize = 16 << 20;
/// How long the rest of an SSE answer is read after its response (see `read_answer`).
const DRAIN: Duration = Duration::from_millis(200);

/// A server and the session it gave this gateway.
pub struct Server {
    url: Arc<str>,
    /// The URL as logs show it (no userinfo, no query values).
    shown: Arc<str>,
    /// Its own credentials, sent with every request.
    credentials: Arc<Credentials>,
    http: reqwest::Client,
    session: tokio::sync::Mutex<Option<(String, String)>>,
    /// What the server said it can do, at its last handshake.
    capabilities: std::sync::Mutex<Value>,
    /// What tollgate's session says the client can do (what the client behind it declared).
    declared: Value,
    next_id: AtomicU64,
}

/// An HTTP client for MCP servers: `timeout` from read to read (a tool may stream progress
/// for long), no redirects followed.
pub fn client(timeout: Duration) -> Result<reqwest::Client, crate::base::outbound::ClientError> {
    crate::base::outbound::Outbound {
        connect: Some(Duration::from_secs(5)),
        read: Some(timeout),
        follow_redirects: false,
        ..Default::default()
    }
    .client()
}

impl Server {
    pub fn new(url: &str, headers: Vec<(String, String)>, timeout: Duration) -> Result<Server, crate::base::outbound::ClientError> {
        Ok(Server::with(url.into(), client(timeout)?, Arc::new(Credentials::fixed(headers))))
    }

    /// A server reached with `http` (shared by every session with it) and `credentials`; no
    /// session yet (made at the first request).
    pub fn with(url: Arc<str>, http: reqwest::Client, credentials: Arc<Credentials>) -> Server {
        Server {
            shown: crate::base::text::redact_url(&url).into(),
            url,
            credentials,
            http,
            session: tokio::sync::Mutex::new(None),
            capabilities: std::sync::Mutex::new(Value::Null),
            declared: json!({}),
            next_id: AtomicU64::new(1),
        }
    }

    /// The same, its session declaring `capabilities` as the client's (sampling, elicitation,
    /// roots: what the server may ask of the client through tollgate).
    pub fn declaring(mut self, capabilities: Value) -> Server {
        self.declared = capabilities;
        self
    }

    /// Send the client's answer to a request of the server's (its id the server's own).
    pub async fn respond(&self, message: &Value) -> Result<(), McpError> {
        let session = self.session().await?;
        let resp = self.post(message, Some(&session)).await.map_err(|(e, _)| e)?;
        match resp.status().as_u16() {
            200..=299 => Ok(()),
            s => Err(McpError::Status(s)),
        }
    }

    /// The session made now if there is none: what the server said it can do.
    pub async fn connect(&self) -> Result<Value, McpError> {
        self.session().await?;
        Ok(self.capabilities.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
    }

    /// The session the server gave, if there is one now (for spans).
    pub fn session_id(&self) -> Option<String> {
        self.session.try_lock().ok().and_then(|s| s.as_ref().map(|(id, _)| id.clone())).filter(|id| !id.is_empty())
    }

    /// Send one message (with the session, when there is one); the HTTP answer. A token the
    /// server refuses (401) is fetched again once.
    async fn post(&self, message: &Value, session: Option<&(String, String)>) -> Result<reqwest::Response, (McpError, bool)> {
        let mut renewed = false;
        loop {
            let mut req = self
                .http
                .post(&*self.url)
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, "application/json, text/event-stream")
                .body(message.to_string());
            for (name, value) in self.credentials.headers().await.map_err(|e| (e, true))? {
                req = req.header(name, value);
            }
            if let Some((id, version)) = session {
                if !id.is_empty() {
                    req = req.header("mcp-session-id", id);
                }
                req = req.header("mcp-protocol-version", version);
            }
            let resp = req.send().await.map_err(|e| {
                let connect = e.is_connect();
                (McpError::unreachable(e), connect)
            })?;
            if resp.status().as_u16() == 401 && self.credentials.renewable() && !renewed {
                self.credentials.refused().await;
                renewed = true;
                continue;
            }
            return Ok(resp);
        }
    }

    /// The session (made now when there is none): its id and revision.
    async fn session(&self) -> Result<(String, String), McpError> {
        let mut held = self.session.lock().await;
        if let Some(s) = held.as_ref() {
            return Ok(s.clone());
        }
        let id = json!(0);
        let init = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": HANDSHAKE_VERSIONS[HANDSHAKE_VERSIONS.len() - 1],
            "capabilities": self.declared,
            "clientInfo": {"name": "tollgate", "version": crate::VERSION},
        }});
        let resp = self.post(&init, None).await.map_err(|(e, _)| e)?;
        let sid = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        let answer = self.read_answer(resp, &id, &mut |_| {}).await?;
        let version = answer.pointer("/protocolVersion").and_then(Value::as_str).unwrap_or(HANDSHAKE_VERSIONS[3]).to_string();
        *self.capabilities.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            answer.get("capabilities").cloned().unwrap_or_else(|| json!({}));
        let session = (sid.unwrap_or_default(), version);
        let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let ack = self.post(&done, Some(&session)).await.map_err(|(e, _)| e)?;
        if !ack.status().is_success() {
            return Err(McpError::Status(ack.status().as_u16()));
        }
        *held = Some(session.clone());
        Ok(session)
    }

    /// The result of request `id` in `resp`, handing each notification before it to `notify`.
    async fn read_answer(&self, resp: reqwest::Response, id: &Value, notify: &mut (dyn FnMut(&Value) + Send)) -> Result<Value, McpError> {
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(McpError::Status(status));
        }
        let sse = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let found = if sse {
            let mut events = Events::default();
            let mut body = resp.bytes_stream();
            let mut found = None;
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(McpError::unreachable)?;
                for message in events.push(&chunk, MAX_MESSAGE).map_err(|e| McpError::Malformed(e.into()))? {
                    if message.get("id") == Some(id) && (message.get("result").is_some() || message.get("error").is_some()) {
                        found = Some(message);
                    } else if message.get("method").is_some() {
                        notify(&message);
                    }
                }
                if found.is_some() {
                    break;
                }
            }
            // The server closes the stream after the response (as the transport asks): its end
            // is read, briefly and after the answer went on, so the connection goes back to the
            // pool instead of being dropped (a new connection for every call costs more than the
            // call: benches/mcp/latency.py).
            if found.is_some() {
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(DRAIN, async { while let Some(Ok(_)) = body.next().await {} }).await;
                });
            }
            found
        } else {
            let bytes = resp.bytes().await.map_err(McpError::unreachable)?;
            if bytes.len() > MAX_MESSAGE {
                return Err(McpError::Malformed("too large".into()));
            }
            let messages = crate::protocol::mcp::messages("application/json", &bytes);
            response_to(&messages, id).cloned()
        };
        let message = found.ok_or_else(|| McpError::Malformed("no response to the request".into()))?;
        super::error::result_of(&message)
    }

    /// Request `method` with `params`; its result. Notifications the server sends on the way
    /// (progress) go to `notify` as they come. A session the server forgot (404) is made again
    /// and the request sent once more.
    /// A request that fails before the server answered is sent again once when that cannot do a
    /// thing twice: every method but `tools/call`, which is sent again only when it never left
    /// (the connection could not be made).
    pub async fn request(&self, method: &str, params: Value, notify: &mut (dyn FnMut(&Value) + Send)) -> Result<Value, McpError> {
        // At most once each: sent again after a broken connection, a new session after a 404.
        let (mut resent, mut renewed) = (false, false);
        loop {
            let session = match self.session().await {
                Ok(s) => s,
                Err(McpError::Unreachable(e)) if !resent => {
                    log::info!("MCP server {}: {e}; trying again", self.shown);
                    resent = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let id = json!(self.next_id.fetch_add(1, Ordering::Relaxed));
            let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
            let resp = match self.post(&message, Some(&session)).await {
                Ok(r) => r,
                Err((e, connect)) if !resent && (connect || method != "tools/call") => {
                    log::info!("MCP server {}: {e}; sending it again", self.shown);
                    resent = true;
                    continue;
                }
                Err((e, _)) => return Err(e),
            };
            if resp.status().as_u16() == 404 && !renewed {
                log::info!("MCP server {}: the session was forgotten; making a new one", self.shown);
                *self.session.lock().await = None;
                renewed = true;
                continue;
            }
            return self.read_answer(resp, &id, notify).await;
        }
    }

    /// The server's own stream (a GET with the session): each message it sends outside an
    /// answer — change notices, updates of subscribed resources, requests — to `sent`, until the
    /// stream ends, the server has none (405), or `sent` is closed. Made again (after a pause)
    /// when it ends while `sent` is open.
    pub async fn listen(&self, sent: tokio::sync::mpsc::Sender<Value>) {
        let mut pause = Duration::from_millis(250);
        while !sent.is_closed() {
            match self.listen_once(&sent).await {
                Ok(()) => pause = Duration::from_millis(250),
                Err(McpError::Status(405)) => return,
                Err(e) => {
                    log::debug!("MCP server {}: its stream: {e}", self.shown);
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = sent.closed() => return,
            }
        }
    }

    async fn listen_once(&self, sent: &tokio::sync::mpsc::Sender<Value>) -> Result<(), McpError> {
        let (id, version) = self.session().await?;
        let mut req = self.http.get(&*self.url).header(http::header::ACCEPT, "text/event-stream").header("mcp-protocol-version", version);
        if !id.is_empty() {
            req = req.header("mcp-session-id", id);
        }
        for (name, value) in self.credentials.headers().await? {
            req = req.header(name, value);
        }
        let resp = req.send().await.map_err(McpError::unreachable)?;
        if !resp.status().is_success() {
            return Err(McpError::Status(resp.status().as_u16()));
        }
        let mut events = Events::default();
        let mut body = resp.bytes_stream();
        loop {
            let chunk = tokio::select! {
                chunk = body.next() => chunk,
                () = sent.closed() => return Ok(()),
            };
            let Some(chunk) = chunk else { return Ok(()) };
            let chunk = chunk.map_err(McpError::unreachable)?;
            for message in events.push(&chunk, MAX_MESSAGE).map_err(|e| McpError::Malformed(e.into()))? {
                if sent.send(message).await.is_err() {
                    return Ok(());
                }
            }
        }
    }

    /// Every tool the server lists (all pages).
    pub async fn tools(&self) -> Result<Vec<Value>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..100 {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let page = self.request("tools/list", params, &mut |_| {}).await?;
            tools.extend(page.get("tools").and_then(Value::as_array).cloned().unwrap_or_default());
            cursor = page.get("nextCursor").and_then(Value::as_str).map(str::to_string);
            if cursor.is_none() {
                break;
            }
        }
        Ok(tools)
    }

    /// End the session, if there is one (the server may refuse; nothing depends on it).
    pub async fn close(&self) {
        let session = self.session.lock().await.take();
        if let Some((id, version)) = session {
            if id.is_empty() {
                return;
            }
            let mut req = self.http.delete(&*self.url).header("mcp-session-id", id).header("mcp-protocol-version", version);
            for (name, value) in self.credentials.headers().await.unwrap_or_default() {
                req = req.header(name, value);
            }
            let _ = req.send().await;
        }
    }
}
