//! One MCP server over the 2024-11-05 transport (`transport: sse`): a GET stream whose first
//! event (`endpoint`) names where messages are posted, and which carries every answer and
//! notification after. One stream is one session: it is opened (and the handshake made over
//! it) at the first request, and opened again when it ended (the server restarted); requests
//! that were waiting on a stream that ended fail as unreachable.

use super::auth::Credentials;
use super::error::McpError;
use crate::protocol::mcp::Events;
use futures_util::StreamExt;
use hashbrown::HashMap;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// The largest unfinished event taken from a server.
const MAX_MESSAGE: usize = 16 << 20;
/// How long the server has to name its endpoint.
const ENDPOINT_WAIT: Duration = Duration::from_secs(10);

/// A request waiting for its answer, and where its notifications go.
struct Waiting {
    answer: oneshot::Sender<Value>,
    notify: mpsc::UnboundedSender<Value>,
}

/// An open stream: where to post, who waits for what.
struct Stream {
    endpoint: String,
    waiting: Arc<Mutex<HashMap<String, Waiting>>>,
    /// Progress tokens of requests waiting (a notification names its request by its token).
    tokens: Arc<Mutex<HashMap<String, String>>>,
    alive: Arc<AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A server and the stream this gateway holds open to it.
pub struct SseServer {
    url: Arc<str>,
    credentials: Arc<Credentials>,
    http: reqwest::Client,
    /// How long a request waits for its answer, from one message of the stream to the next.
    timeout: Duration,
    stream: tokio::sync::Mutex<Option<Arc<Stream>>>,
    /// What the server said it can do, at its last handshake.
    capabilities: Mutex<Value>,
    /// What tollgate's session says the client can do (see `Server::declaring`).
    declared: Value,
    next_id: AtomicU64,
}

impl SseServer {
    pub fn with(url: Arc<str>, http: reqwest::Client, credentials: Arc<Credentials>, timeout: Duration) -> SseServer {
        SseServer {
            url,
            credentials,
            http,
            timeout,
            stream: tokio::sync::Mutex::new(None),
            capabilities: Mutex::new(Value::Null),
            declared: json!({}),
            next_id: AtomicU64::new(1),
        }
    }

    /// The same, its session declaring `capabilities` as the client's.
    pub fn declaring(mut self, capabilities: Value) -> SseServer {
        self.declared = capabilities;
        self
    }

    /// Send the client's answer to a request of the server's, on the stream's endpoint.
    pub async fn respond(&self, message: &Value) -> Result<(), McpError> {
        let stream = self.stream().await?;
        self.post(&stream, message).await
    }

    /// The stream, opened (with the handshake) when there is none or it ended.
    async fn stream(&self) -> Result<Arc<Stream>, McpError> {
        let mut held = self.stream.lock().await;
        if let Some(s) = held.as_ref().filter(|s| s.alive.load(Ordering::Relaxed)) {
            return Ok(s.clone());
        }
        *held = None;
        let stream = Arc::new(self.open().await?);
        let init = json!({
            "protocolVersion": crate::protocol::mcp::HANDSHAKE_VERSIONS[0],
            "capabilities": self.declared,
            "clientInfo": {"name": "tollgate", "version": crate::VERSION},
        });
        let answer = self.exchange(&stream, "initialize", init, &mut |_| {}).await?;
        *lock(&self.capabilities) = answer.get("capabilities").cloned().unwrap_or_else(|| json!({}));
        self.post(&stream, &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await?;
        *held = Some(stream.clone());
        Ok(stream)
    }

    /// GET the stream and read up to its `endpoint` event; the rest is read by a task of its own.
    async fn open(&self) -> Result<Stream, McpError> {
        let mut req = self.http.get(&*self.url).header(http::header::ACCEPT, "text/event-stream");
        for (name, value) in self.credentials.headers().await? {
            req = req.header(name, value);
        }
        let resp = req.send().await.map_err(McpError::unreachable)?;
        if resp.status().as_u16() == 401 && self.credentials.renewable() {
            self.credentials.refused().await;
        }
        if !resp.status().is_success() {
            return Err(McpError::Status(resp.status().as_u16()));
        }
        let base = resp.url().clone();
        let mut body = resp.bytes_stream();
        let mut events = Events::default();
        let endpoint = tokio::time::timeout(ENDPOINT_WAIT, async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(McpError::unreachable)?;
                for e in events.push_events(&chunk, MAX_MESSAGE).map_err(|e| McpError::Malformed(e.into()))? {
                    if e.event == "endpoint" {
                        return base.join(e.data.trim()).map(String::from).map_err(|e| McpError::Malformed(format!("endpoint: {e}")));
                    }
                }
            }
            Err(McpError::Malformed("the stream ended before naming its endpoint".into()))
        })
        .await
        .map_err(|_| McpError::Malformed("no endpoint named in time".into()))??;
        // The endpoint must be the server's own: credentials go nowhere else.
        let named = reqwest::Url::parse(&endpoint).map_err(|e| McpError::Malformed(e.to_string()))?;
        if named.origin() != base.origin() {
            return Err(McpError::Malformed(format!("the endpoint {endpoint} is not on the server's origin")));
        }
        let waiting: Arc<Mutex<HashMap<String, Waiting>>> = Arc::default();
        let tokens: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let (w, t, a, url) = (waiting.clone(), tokens.clone(), alive.clone(), crate::base::text::redact_url(&self.url));
        let reader = tokio::spawn(async move {
            loop {
                match body.next().await {
                    Some(Ok(chunk)) => match events.push(&chunk, MAX_MESSAGE) {
                        Ok(messages) => messages.into_iter().for_each(|m| deliver(&w, &t, m)),
                        Err(e) => {
                            log::warn!("MCP server {url}: {e}");
                            break;
                        }
                    },
                    Some(Err(e)) => {
                        log::info!("MCP server {url}: its stream broke: {e}");
                        break;
                    }
                    None => break,
                }
            }
            a.store(false, Ordering::Relaxed);
            // Whoever waits is told now (their senders dropped).
            lock(&w).clear();
        });
        Ok(Stream { endpoint, waiting, tokens, alive, reader })
    }

    /// POST one message to the stream's endpoint.
    async fn post(&self, stream: &Stream, message: &Value) -> Result<(), McpError> {
        let mut req = self.http.post(&stream.endpoint).header(http::header::CONTENT_TYPE, "application/json").body(message.to_string());
        for (name, value) in self.credentials.headers().await? {
            req = req.header(name, value);
        }
        let resp = req.send().await.map_err(McpError::unreachable)?;
        match resp.status().as_u16() {
            200..=299 => Ok(()),
            s => Err(McpError::Status(s)),
        }
    }

    /// Send request `method` on `stream` and wait for its answer on the stream, handing each
    /// notification of it (progress) to `notify` as it comes.
    async fn exchange(
        &self,
        stream: &Stream,
        method: &str,
        params: Value,
        notify: &mut (dyn FnMut(&Value) + Send),
    ) -> Result<Value, McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let key = id.to_string();
        let (answer_tx, mut answer) = oneshot::channel();
        let (notify_tx, mut notes) = mpsc::unbounded_channel();
        lock(&stream.waiting).insert(key.clone(), Waiting { answer: answer_tx, notify: notify_tx });
        let token = params.pointer("/_meta/progressToken").map(Value::to_string);
        if let Some(t) = &token {
            lock(&stream.tokens).insert(t.clone(), key.clone());
        }
        let forget = || {
            lock(&stream.waiting).remove(&key);
            if let Some(t) = &token {
                lock(&stream.tokens).remove(t);
            }
        };
        if let Err(e) = self.post(stream, &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await {
            forget();
            return Err(e);
        }
        let message = loop {
            tokio::select! {
                got = &mut answer => {
                    // Notifications the stream carried before the answer go first.
                    while let Ok(n) = notes.try_recv() {
                        notify(&n);
                    }
                    break got.map_err(|_| McpError::Unreachable("the server's stream ended".into()));
                }
                Some(n) = notes.recv() => notify(&n),
                () = tokio::time::sleep(self.timeout) => break Err(McpError::Unreachable(format!("no answer in {}s", self.timeout.as_secs()))),
            }
        };
        forget();
        let message = message?;
        super::error::result_of(&message)
    }

    /// Request `method` with `params`; its result (see [`super::upstream::Server::request`]).
    /// A stream that ended is opened again once; a `tools/call` is sent again only when it was
    /// never posted.
    pub async fn request(&self, method: &str, params: Value, notify: &mut (dyn FnMut(&Value) + Send)) -> Result<Value, McpError> {
        let stream = match self.stream().await {
            Ok(s) => s,
            Err(McpError::Unreachable(_)) => self.stream().await?,
            Err(e) => return Err(e),
        };
        let result = self.exchange(&stream, method, params.clone(), notify).await;
        let ended = !stream.alive.load(Ordering::Relaxed);
        match result {
            // The server did not take the message (it forgot the stream's session: a restart):
            // sent on a new stream.
            Err(McpError::Status(404 | 410)) => {
                stream.alive.store(false, Ordering::Relaxed);
                let again = self.stream().await?;
                self.exchange(&again, method, params, notify).await
            }
            // The stream ended while the answer was awaited: sent again only when that cannot
            // run a tool twice.
            Err(McpError::Unreachable(_)) if ended && method != "tools/call" => {
                let again = self.stream().await?;
                self.exchange(&again, method, params, notify).await
            }
            other => other,
        }
    }

    /// The stream opened now if there is none: what the server said it can do.
    pub async fn connect(&self) -> Result<Value, McpError> {
        self.stream().await?;
        Ok(lock(&self.capabilities).clone())
    }

    /// The session the server gave: the stream's endpoint names it.
    pub fn session_id(&self) -> Option<String> {
        let held = self.stream.try_lock().ok()?;
        let endpoint = reqwest::Url::parse(&held.as_ref()?.endpoint).ok()?;
        endpoint.query_pairs().find(|(k, _)| k.contains("session")).map(|(_, v)| v.into_owned())
    }

    /// Close the stream (the session ends with it).
    pub async fn close(&self) {
        self.stream.lock().await.take();
    }
}

/// Hand a message of the stream to whoever waits for it: a response to its request, a
/// notification naming a progress token to that token's request.
fn deliver(waiting: &Mutex<HashMap<String, Waiting>>, tokens: &Mutex<HashMap<String, String>>, message: Value) {
    if message.get("result").is_some() || message.get("error").is_some() {
        let Some(id) = message.get("id").map(|v| v.as_u64().map_or_else(|| v.to_string(), |n| n.to_string())) else { return };
        if let Some(w) = lock(waiting).remove(&id) {
            let _ = w.answer.send(message);
        }
        return;
    }
    let Some(token) = message.pointer("/params/progressToken").map(Value::to_string) else { return };
    let Some(id) = lock(tokens).get(&token).cloned() else { return };
    if let Some(w) = lock(waiting).get(&id) {
        let _ = w.notify.send(message);
    }
}
