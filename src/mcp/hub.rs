//! The MCP servers of `mcp:` as one: a client's session with tollgate (`Mcp-Session-Id`, owned
//! by the key that opened it) holds a session of its own at each server, made when first
//! needed and made again when the server forgets it (a restart); listings are the union of
//! the servers that answer — one that is down is left out with a warning, never emptying the
//! others —; a tool or prompt is named `server__name` and goes to its server — or, for a
//! server with `prefix: false`, keeps its own name. A name is resolved by its prefix first: a
//! `<prefixed server>__…` name is that server's, and an unprefixed server's own tool of that
//! form is left out (the configuration refuses the collisions it can see); any other name is
//! an unprefixed server's (the first whose own rules show it).

use super::auth::Credentials;
use super::error::McpError;
use super::legacy::SseServer;
use super::upstream::Server;
use crate::config::{McpConfig, McpServerConfig, McpTransport};
use crate::protocol::mcp::{prefixed, split};
use hashbrown::HashMap;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A session unused this long is forgotten (the client then gets 404 and starts another).
const IDLE: Duration = Duration::from_secs(3600);
/// The most sessions kept; past it the least recently used is forgotten.
const MAX_SESSIONS: usize = 10_000;

/// Sessions one key may hold: past it, that key's oldest is forgotten (never another key's).
pub const MAX_SESSIONS_PER_KEY: usize = 64;

/// Tools remembered per server as listed (for their metric labels).
const MAX_LISTED_TOOLS: usize = 1_000;

/// The longest `server__` prefix a prefixed tool name carries.
const MAX_SERVER_PREFIX: usize = 66;
/// How long a listing waits for a server before leaving it out.
const LIST_WAIT: Duration = Duration::from_secs(10);

/// One configured server, as every session reaches it.
pub struct Upstream {
    pub config: McpServerConfig,
    /// The tools it listed (bounded): only these name a metric series of their own.
    listed: Mutex<std::collections::HashSet<String>>,
    url: Arc<str>,
    http: reqwest::Client,
    credentials: Arc<Credentials>,
    /// For spans: the server's host and port.
    pub host: String,
    pub port: u16,
}

impl Upstream {
    /// A new session's link to the server (it connects at its first request), declaring
    /// `declared` as what the client can do.
    fn link(&self, declared: &Value) -> Link {
        match self.config.transport {
            McpTransport::StreamableHttp => {
                Link::Streamable(Server::with(self.url.clone(), self.http.clone(), self.credentials.clone()).declaring(declared.clone()))
            }
            McpTransport::Sse => Link::Sse(
                SseServer::with(
                    self.url.clone(),
                    self.http.clone(),
                    self.credentials.clone(),
                    Duration::from_secs(self.config.timeout_secs),
                )
                .declaring(declared.clone()),
            ),
        }
    }

    /// Whether the server's own rules show its tool `tool`.
    pub fn shows(&self, tool: &str) -> bool {
        self.config.tools.as_ref().is_none_or(|r| r.allows(tool))
    }

    /// The name a client sees for the server's `own` name.
    pub fn visible(&self, own: &str) -> String {
        match self.config.prefix {
            true => prefixed(&self.config.name, own),
            false => own.to_string(),
        }
    }
}

/// A session's link to one server, over its transport.
pub enum Link {
    Streamable(Server),
    Sse(SseServer),
}

impl Link {
    /// Request `method`; its result, the server's notifications on the way going to `notify`.
    pub async fn request(&self, method: &str, params: Value, notify: &mut (dyn FnMut(&Value) + Send)) -> Result<Value, McpError> {
        match self {
            Link::Streamable(s) => s.request(method, params, notify).await,
            Link::Sse(s) => s.request(method, params, notify).await,
        }
    }

    /// Its session made now if there is none: what the server said it can do.
    async fn connect(&self) -> Result<Value, McpError> {
        match self {
            Link::Streamable(s) => s.connect().await,
            Link::Sse(s) => s.connect().await,
        }
    }

    /// The server's own stream, each message to `sent` (servers on the 2024-11-05 transport
    /// send theirs on the session's one stream, which answers only requests: none here).
    pub async fn listen(&self, sent: tokio::sync::mpsc::Sender<Value>) {
        if let Link::Streamable(s) = self {
            s.listen(sent).await;
        }
    }

    /// Send the client's answer to a request of the server's.
    pub async fn respond(&self, message: &Value) -> Result<(), McpError> {
        match self {
            Link::Streamable(s) => s.respond(message).await,
            Link::Sse(s) => s.respond(message).await,
        }
    }

    /// The session the server gave, when it gave one (for spans).
    pub fn session_id(&self) -> Option<String> {
        match self {
            Link::Streamable(s) => s.session_id(),
            Link::Sse(s) => s.session_id(),
        }
    }

    async fn close(&self) {
        match self {
            Link::Streamable(s) => s.close().await,
            Link::Sse(s) => s.close().await,
        }
    }
}

/// A client's session with tollgate.
pub struct Session {
    pub id: String,
    pub key_id: String,
    /// The revision agreed at `initialize`.
    pub version: &'static str,
    /// Its session at each server (by the index in `mcp.servers`).
    servers: Vec<Link>,
    /// Which server listed each resource URI (for `resources/read`).
    resources: Mutex<HashMap<String, usize>>,
    /// What the client declared it can do that a server may ask of it (sampling, elicitation,
    /// roots): what its sessions at the servers declare.
    declared: Value,
    /// Requests of the servers passed to the client, by the id the client was given: the
    /// server's index and its own id (the servers' ids may collide; the client's answer goes
    /// back to the one that asked).
    asked: Mutex<HashMap<String, (usize, Value)>>,
    /// The client's own stream is open (one at a time).
    streaming: std::sync::atomic::AtomicBool,
    /// Tollgate listens on the servers' own streams (see [`Session::listen`]).
    listening: std::sync::atomic::AtomicBool,
    /// Where what the servers send on their own streams goes.
    route: Mutex<Route>,
    next_call: AtomicU64,
    /// The session ended (closed, forgotten): its listeners stop.
    ended: tokio::sync::watch::Sender<bool>,
    last_used_ms: AtomicU64,
}

/// Messages of the servers' own streams: at most this many held for a client without a stream
/// of its own (or reading slowly); past it the oldest go.
const MAX_HELD: usize = 16;

#[derive(Default)]
struct Route {
    /// Tool calls in flight, each its stream's channel (requests go to the newest).
    calls: Vec<(u64, tokio::sync::mpsc::UnboundedSender<(usize, Value)>)>,
    /// The client's own stream, while open.
    stream: Option<tokio::sync::mpsc::Sender<(usize, Value)>>,
    held: std::collections::VecDeque<(usize, Value)>,
}

/// A tool call in flight (see [`Session::calling`]).
pub struct Calling {
    session: Arc<Session>,
    n: u64,
}

impl Drop for Calling {
    fn drop(&mut self) {
        lock(&self.session.route).calls.retain(|(n, _)| *n != self.n);
    }
}

/// A client's own stream: the servers' messages outside answers as they come.
pub struct StreamOpen {
    pub rx: tokio::sync::mpsc::Receiver<(usize, Value)>,
    session: Arc<Session>,
}

impl Drop for StreamOpen {
    fn drop(&mut self) {
        lock(&self.session.route).stream = None;
        self.session.streaming.store(false, Ordering::Release);
    }
}

/// The most requests of servers a session holds unanswered; past it the oldest are let go
/// (their servers get no answer and time out on their own).
const MAX_ASKED: usize = 64;

/// What a server may ask of a client, by its request's method: the capability the client
/// must have declared.
pub fn asks_for(method: &str) -> Option<&'static str> {
    match method {
        "sampling/createMessage" => Some("sampling"),
        "elicitation/create" => Some("elicitation"),
        "roots/list" => Some("roots"),
        _ => None,
    }
}

impl Session {
    /// Its session at server `i`.
    pub fn server(&self, i: usize) -> &Link {
        &self.servers[i]
    }

    /// Listen on every server's own stream (once per session, until it ends): what a server
    /// sends there goes where the client can get it ([`Session::deliver`]). Started when the
    /// client opens its own stream, or at `initialize` for a client that may be asked
    /// (sampling, elicitation, roots) — servers that ask outside the call's stream ask there.
    pub fn listen(self: &Arc<Self>) {
        if self.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        for i in 0..self.servers.len() {
            let s = self.clone();
            tokio::spawn(async move {
                let (tx, mut rx) = tokio::sync::mpsc::channel::<Value>(1);
                let mut ended = s.ended.subscribe();
                let listen = s.servers[i].listen(tx);
                tokio::pin!(listen);
                loop {
                    tokio::select! {
                        () = &mut listen => return,
                        _ = ended.wait_for(|over| *over) => return,
                        m = rx.recv() => match m {
                            Some(m) => s.deliver(i, m),
                            None => return,
                        },
                    }
                }
            });
        }
    }

    /// What server `i` sent on its own stream, where the client gets it: a request to the
    /// stream of a tool call in flight (the client is waiting on it), else to the client's own
    /// stream; else held (the newest few) until the client opens one.
    fn deliver(&self, i: usize, message: Value) {
        let mut route = lock(&self.route);
        let request = message.get("id").is_some() && message.get("method").is_some();
        if request {
            if let Some((_, call)) = route.calls.last() {
                if call.send((i, message.clone())).is_ok() {
                    return;
                }
            }
        }
        if let Some(stream) = &route.stream {
            match stream.try_send((i, message)) {
                Ok(()) => return,
                Err(tokio::sync::mpsc::error::TrySendError::Full(m) | tokio::sync::mpsc::error::TrySendError::Closed(m)) => {
                    route.held.push_back(m);
                }
            }
        } else {
            route.held.push_back((i, message));
        }
        while route.held.len() > MAX_HELD {
            route.held.pop_front();
        }
    }

    /// A tool call in flight: requests of the servers' own streams come to `to` while the
    /// returned guard lives.
    pub fn calling(self: &Arc<Self>, to: tokio::sync::mpsc::UnboundedSender<(usize, Value)>) -> Calling {
        let n = self.next_call.fetch_add(1, Ordering::Relaxed);
        lock(&self.route).calls.push((n, to));
        Calling { session: self.clone(), n }
    }

    /// The client's own stream opened: the servers' messages outside answers, each with its
    /// server's index (what was held first), until the receiver is dropped. None while
    /// another is open.
    pub fn open_stream(self: &Arc<Self>) -> Option<StreamOpen> {
        if self.streaming.swap(true, Ordering::AcqRel) {
            return None;
        }
        // Few messages are held for a client that reads slowly: past them the oldest go.
        let (tx, rx) = tokio::sync::mpsc::channel::<(usize, Value)>(MAX_HELD);
        {
            let mut route = lock(&self.route);
            while let Some(m) = route.held.pop_front() {
                let _ = tx.try_send(m);
            }
            route.stream = Some(tx);
        }
        self.listen();
        Some(StreamOpen { rx, session: self.clone() })
    }

    /// Returns once the session has ended (closed, forgotten).
    pub async fn over(&self) {
        let mut ended = self.ended.subscribe();
        let _ = ended.wait_for(|over| *over).await;
    }

    /// Whether the client declared `capability`.
    pub fn declares(&self, capability: &str) -> bool {
        self.declared.get(capability).is_some()
    }

    /// The id a request of server `i` (its own id `theirs`) is passed to the client under.
    pub fn ask(&self, i: usize, theirs: &Value) -> String {
        let id = format!("tollgate-{i}-{}", crate::base::secrets::random_base62(16));
        let mut asked = lock(&self.asked);
        if asked.len() >= MAX_ASKED {
            asked.clear();
        }
        asked.insert(id.clone(), (i, theirs.clone()));
        id
    }

    /// The server that asked the request the client answers under `id`, and its own id.
    pub fn answered(&self, id: &Value) -> Option<(usize, Value)> {
        lock(&self.asked).remove(id.as_str()?)
    }
}

/// The capabilities a client declared that servers may use (sampling, elicitation, roots).
pub fn declared_by_client(capabilities: Option<&Value>) -> Value {
    let mut out = serde_json::Map::new();
    for name in ["sampling", "elicitation", "roots"] {
        if let Some(v) = capabilities.and_then(|c| c.get(name)) {
            out.insert(name.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// The servers and the sessions of their clients.
pub struct Hub {
    pub upstreams: Vec<Upstream>,
    /// `mcp.allowed_origins`: see [`Hub::origin_allowed`].
    allowed_origins: Vec<String>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Each key's session for the stateless revision's requests (which carry none).
    stateless: Mutex<HashMap<String, Arc<Session>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a client asked for that is not there (a JSON-RPC error to answer with).
#[derive(Debug, PartialEq)]
pub struct Unknown(pub String);

impl Hub {
    /// None when `mcp:` names no server.
    pub fn new(config: &McpConfig) -> Result<Option<Hub>, String> {
        if config.servers.is_empty() {
            return Ok(None);
        }
        let mut upstreams = Vec::with_capacity(config.servers.len());
        for s in &config.servers {
            let http = super::upstream::client(Duration::from_secs(s.timeout_secs))
                .map_err(|e| format!("mcp.servers {}: MCP client: {e}", s.name))?;
            let uri: http::Uri = s.url.parse().map_err(|e| format!("mcp.servers {}: {e}", s.name))?;
            let tls = uri.scheme_str() == Some("https");
            upstreams.push(Upstream {
                listed: Mutex::new(std::collections::HashSet::new()),
                url: s.url.as_str().into(),
                credentials: Arc::new(Credentials::of(&s.auth, http.clone())),
                http,
                host: uri.host().unwrap_or_default().to_string(),
                port: uri.port_u16().unwrap_or(if tls { 443 } else { 80 }),
                config: s.clone(),
            });
        }
        Ok(Some(Hub {
            upstreams,
            allowed_origins: config.allowed_origins.clone(),
            sessions: Mutex::new(HashMap::new()),
            stateless: Mutex::new(HashMap::new()),
        }))
    }

    /// Whether a request with this `Origin` header may be served (the transport's defence
    /// against DNS rebinding): none (not a browser), or one of `mcp.allowed_origins` (compared
    /// without case).
    pub fn origin_allowed(&self, origin: Option<&[u8]>) -> bool {
        origin.is_none_or(|o| self.allowed_origins.iter().any(|a| a.as_bytes().eq_ignore_ascii_case(o)))
    }

    /// A session's state, its links to every server declaring `declared`.
    fn session_of(&self, id: String, key_id: &str, version: &'static str, declared: Value, used_ms: u64) -> Session {
        Session {
            id,
            key_id: key_id.to_string(),
            version,
            servers: self.upstreams.iter().map(|u| u.link(&declared)).collect(),
            resources: Mutex::new(HashMap::new()),
            declared,
            asked: Mutex::new(HashMap::new()),
            streaming: std::sync::atomic::AtomicBool::new(false),
            listening: std::sync::atomic::AtomicBool::new(false),
            route: Mutex::new(Route::default()),
            next_call: AtomicU64::new(0),
            ended: tokio::sync::watch::Sender::new(false),
            last_used_ms: AtomicU64::new(used_ms),
        }
    }

    /// A new session of `key_id` at revision `version`, its client having declared `declared`
    /// (see [`declared_by_client`]). The oldest sessions are forgotten past
    /// [`MAX_SESSIONS`], idle ones after [`IDLE`]; their servers are told in the background.
    pub fn open(&self, key_id: &str, version: &'static str, declared: Value) -> Arc<Session> {
        let id = crate::base::secrets::random_base62(32);
        let session = Arc::new(self.session_of(id.clone(), key_id, version, declared, crate::base::clock::now_ms()));
        let gone = {
            let mut sessions = lock(&self.sessions);
            let now = crate::base::clock::now_ms();
            let idle = IDLE.as_millis() as u64;
            let mut gone: Vec<Arc<Session>> = Vec::new();
            sessions.retain(|_, s| {
                let keep = now.saturating_sub(s.last_used_ms.load(Ordering::Relaxed)) < idle;
                if !keep {
                    gone.push(s.clone());
                }
                keep
            });
            // A key past its share forgets its own oldest session first.
            let mine: Vec<(&String, u64)> =
                sessions.iter().filter(|(_, s)| s.key_id == key_id).map(|(k, s)| (k, s.last_used_ms.load(Ordering::Relaxed))).collect();
            if mine.len() >= MAX_SESSIONS_PER_KEY {
                if let Some(oldest) = mine.iter().min_by_key(|(_, used)| *used).map(|(k, _)| (*k).clone()) {
                    gone.extend(sessions.remove(&oldest));
                }
            }
            if sessions.len() >= MAX_SESSIONS {
                if let Some(oldest) = sessions.iter().min_by_key(|(_, s)| s.last_used_ms.load(Ordering::Relaxed)).map(|(k, _)| k.clone()) {
                    gone.extend(sessions.remove(&oldest));
                }
            }
            sessions.insert(id, session.clone());
            gone
        };
        if !gone.is_empty() {
            tokio::spawn(async move {
                for s in gone {
                    close_all(&s).await;
                }
            });
        }
        session
    }

    /// The session the stateless revision's requests of `key_id` share (their sessions at the
    /// servers), made at the first; marked used.
    pub fn stateless(&self, key_id: &str, version: &'static str) -> Arc<Session> {
        let mut map = lock(&self.stateless);
        let s = map.entry_ref(key_id).or_insert_with(|| Arc::new(self.session_of(String::new(), key_id, version, json!({}), 0))).clone();
        s.last_used_ms.store(crate::base::clock::now_ms(), Ordering::Relaxed);
        s
    }

    /// The session `id` of `key_id` (another key's session is not found), marked used.
    pub fn session(&self, id: &str, key_id: &str) -> Option<Arc<Session>> {
        let s = lock(&self.sessions).get(id).filter(|s| s.key_id == key_id).cloned()?;
        s.last_used_ms.store(crate::base::clock::now_ms(), Ordering::Relaxed);
        Some(s)
    }

    /// End the session `id` of `key_id` and its sessions at the servers; whether there was one.
    pub async fn close(&self, id: &str, key_id: &str) -> bool {
        let removed = {
            let mut sessions = lock(&self.sessions);
            match sessions.get(id) {
                Some(s) if s.key_id == key_id => sessions.remove(id),
                _ => None,
            }
        };
        match removed {
            Some(s) => {
                close_all(&s).await;
                true
            }
            None => false,
        }
    }

    /// What the servers can do together, for a client's `initialize` (its sessions at every
    /// server made now, at once): tools, prompts, resources and logging where any server that
    /// answered has them — without change notifications or subscriptions, which tollgate does
    /// not relay. When none answered, all four (their listings are then empty, not refused).
    pub async fn capabilities(&self, session: &Session) -> Value {
        let asks = session.servers.iter().map(|l| tokio::time::timeout(LIST_WAIT, l.connect()));
        let answered: Vec<Value> = futures_util::future::join_all(asks)
            .await
            .into_iter()
            .zip(&self.upstreams)
            .filter_map(|(r, u)| match r {
                Ok(Ok(caps)) => Some(caps),
                Ok(Err(e)) => {
                    log::warn!("MCP server '{}': initialize: {e}", u.config.name);
                    None
                }
                Err(_) => {
                    log::warn!("MCP server '{}': initialize: no answer in {}s", u.config.name, LIST_WAIT.as_secs());
                    None
                }
            })
            .collect();
        // Change notices and subscriptions come on the client's own stream (GET /mcp) when a
        // server offers them.
        let any = |pointer: &str| answered.iter().any(|c| c.pointer(pointer).and_then(Value::as_bool) == Some(true));
        let offered = [
            ("tools", json!({"listChanged": any("/tools/listChanged")})),
            ("prompts", json!({"listChanged": any("/prompts/listChanged")})),
            ("resources", json!({"listChanged": any("/resources/listChanged"), "subscribe": any("/resources/subscribe")})),
            ("logging", json!({})),
            ("completions", json!({})),
        ];
        let has = |name: &str| answered.is_empty() || answered.iter().any(|c| c.get(name).is_some());
        Value::Object(offered.into_iter().filter(|(name, _)| has(name)).map(|(name, v)| (name.to_string(), v)).collect())
    }

    /// `logging/setLevel` passed to every server of the session that logs (said so at its
    /// `initialize`), at once; the servers that could not take it (named in the error).
    pub async fn set_level(&self, session: &Session, params: &Value) -> Result<(), String> {
        let asks = session.servers.iter().enumerate().map(|(i, link)| async move {
            let logs = link.connect().await.is_ok_and(|caps| caps.get("logging").is_some());
            match logs {
                true => link.request("logging/setLevel", params.clone(), &mut |_| {}).await.err().map(|e| (i, e)),
                false => None,
            }
        });
        let failed: Vec<String> = futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .map(|(i, e)| {
                log::warn!("MCP server '{}': logging/setLevel: {e}", self.upstreams[i].config.name);
                self.upstreams[i].config.name.clone()
            })
            .collect();
        match failed.is_empty() {
            true => Ok(()),
            false => Err(failed.join(", ")),
        }
    }

    /// `completion/complete`: sent to the server whose prompt (`ref/prompt`, by the name the
    /// client sees, under the key's rules) or resource (`ref/resource`: the server that listed
    /// its URI, else the first the key has whole) it completes, the prompt's name made the
    /// server's own. `Err(None)`: nothing of the key's has that name.
    pub async fn complete(
        &self,
        session: &Session,
        params: &Value,
        allows: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Value, (Option<usize>, McpError)> {
        let missing = |m: String| (None, McpError::Rpc { code: -32602, message: m });
        let reference = params.get("ref").unwrap_or(&Value::Null);
        let (i, params) = match reference.get("type").and_then(Value::as_str) {
            Some("ref/prompt") => {
                let name = reference.get("name").and_then(Value::as_str).unwrap_or_default();
                let (i, own) = self.prompt(name, allows).map_err(|u| missing(u.0))?;
                let mut p = params.clone();
                p["ref"]["name"] = Value::String(own.to_string());
                (i, p)
            }
            Some("ref/resource") => {
                let uri = reference.get("uri").and_then(Value::as_str).unwrap_or_default();
                let known = lock(&session.resources).get(uri).copied();
                let whole = |i: &usize| self.whole_server(*i, allows);
                let i = match known {
                    Some(i) => Some(i).filter(whole),
                    None => (0..self.upstreams.len()).find(whole),
                };
                (i.ok_or_else(|| missing(format!("Unknown resource: {}", crate::base::text::clip(uri, 256))))?, params.clone())
            }
            _ => return Err(missing("ref: a ref/prompt or a ref/resource".into())),
        };
        session.servers[i].request("completion/complete", params, &mut |_| {}).await.map_err(|e| (Some(i), e))
    }

    /// `method`'s result from every server at once (a listing, all pages), each server's items
    /// of `field`; a server that fails is left out with a warning.
    async fn ask_each(&self, session: &Session, method: &str, field: &str) -> Vec<(usize, Vec<Value>)> {
        let asks = self.upstreams.iter().enumerate().map(|(i, u)| async move {
            let mut items = Vec::new();
            let mut cursor: Option<String> = None;
            for _ in 0..100 {
                let params = cursor.as_ref().map_or_else(|| json!({}), |c| json!({"cursor": c}));
                let page = match tokio::time::timeout(LIST_WAIT, session.servers[i].request(method, params, &mut |_| {})).await {
                    Ok(Ok(page)) => page,
                    Ok(Err(McpError::Rpc { code: -32601, .. })) => return (i, items),
                    Ok(Err(e)) => {
                        log::warn!("MCP server '{}': {method}: {e}; left out of the listing", u.config.name);
                        return (i, Vec::new());
                    }
                    Err(_) => {
                        log::warn!(
                            "MCP server '{}': {method}: no answer in {}s; left out of the listing",
                            u.config.name,
                            LIST_WAIT.as_secs()
                        );
                        return (i, Vec::new());
                    }
                };
                items.extend(page.get(field).and_then(Value::as_array).cloned().unwrap_or_default());
                cursor = page.get("nextCursor").and_then(Value::as_str).map(str::to_string);
                if cursor.is_none() {
                    break;
                }
            }
            (i, items)
        });
        futures_util::future::join_all(asks).await
    }

    /// The tools the key may see (`allows` over prefixed names), each server's own rules
    /// applied first, named `server__tool`.
    pub async fn tools(&self, session: &Session, allows: &(dyn Fn(&str) -> bool + Sync)) -> Vec<Value> {
        let mut out = Vec::new();
        for (i, tools) in self.ask_each(session, "tools/list", "tools").await {
            let u = &self.upstreams[i];
            let shown: Vec<Value> =
                tools.into_iter().filter(|t| t.get("name").and_then(Value::as_str).is_some_and(|n| u.shows(n))).collect();
            {
                let mut listed = lock(&u.listed);
                for name in shown.iter().filter_map(|t| t.get("name").and_then(Value::as_str)) {
                    if listed.len() < MAX_LISTED_TOOLS && name.len() <= crate::protocol::mcp::MAX_TOOL_NAME {
                        listed.insert(name.to_string());
                    }
                }
            }
            out.extend(self.named(i, &shown, allows));
        }
        out
    }

    /// A server's tools or prompts under the names the client sees, those the key may see
    /// (`allows`, over those names); an unprefixed server's name that a prefixed server's
    /// prefix claims is left out.
    fn named(&self, i: usize, items: &[Value], allows: &(dyn Fn(&str) -> bool + Sync)) -> Vec<Value> {
        let u = &self.upstreams[i];
        items
            .iter()
            .filter_map(|t| {
                let own = t.get("name")?.as_str()?;
                if !u.config.prefix && self.claimed(own) {
                    return None;
                }
                let name = u.visible(own);
                allows(&name).then(|| {
                    let mut t = t.clone();
                    t["name"] = Value::String(name);
                    t
                })
            })
            .collect()
    }

    /// What `initialize` tells the client of the names it will see.
    pub fn instructions(&self) -> &'static str {
        match self.upstreams.iter().any(|u| u.config.prefix) {
            true => "Tools of several MCP servers, each named server__tool.",
            false => "Tools of MCP servers, under their own names.",
        }
    }

    /// `name` is a prefixed server's: its prefix names one.
    fn claimed(&self, name: &str) -> bool {
        split(name).is_some_and(|(server, _)| self.upstreams.iter().any(|u| u.config.prefix && u.config.name == server))
    }

    /// The server (its index) of a name the client sees, and the server's own name for it:
    /// by its prefix, else the first unprefixed server whose own rules show it (a `tool`), or
    /// the first unprefixed server (a prompt: servers' rules name tools only).
    fn owner<'a>(&self, name: &'a str, tool: bool) -> Option<(usize, &'a str)> {
        if let Some((server, own)) = split(name) {
            if let Some(i) = self.upstreams.iter().position(|u| u.config.prefix && u.config.name == server) {
                return Some((i, own));
            }
        }
        self.upstreams.iter().position(|u| !u.config.prefix && (!tool || u.shows(name))).map(|i| (i, name))
    }

    /// `params` with the name the client sees (member `field`) made server `i`'s own.
    pub fn own_params(&self, i: usize, params: &Value, field: &str) -> Value {
        match self.upstreams.get(i).is_some_and(|u| u.config.prefix) {
            true => unprefixed(params, field),
            false => params.clone(),
        }
    }

    /// The label of `tool` of server `i` in metrics: its own name when the server listed it,
    /// else `other` (a client names any tool it likes; a series each would be unbounded).
    pub fn tool_label<'a>(&self, i: usize, tool: &'a str) -> &'a str {
        if self.upstreams.get(i).is_some_and(|u| lock(&u.listed).contains(tool)) {
            tool
        } else {
            "other"
        }
    }

    /// The server (its index) and the tool of a prefixed tool name the key may call (`allows`).
    /// A name longer than MCP's bound is no tool (and is not quoted back).
    pub fn tool<'a>(&self, name: &'a str, allows: &dyn Fn(&str) -> bool) -> Result<(usize, &'a str), Unknown> {
        if name.len() > crate::protocol::mcp::MAX_TOOL_NAME.saturating_add(MAX_SERVER_PREFIX) {
            return Err(Unknown(format!("Unknown tool: tool names are at most {} characters.", crate::protocol::mcp::MAX_TOOL_NAME)));
        }
        let unknown = || Unknown(format!("Unknown tool: '{name}' is not a tool of this gateway for this key."));
        let (i, tool) = self.owner(name, true).ok_or_else(unknown)?;
        if !self.upstreams[i].shows(tool) || !allows(name) {
            return Err(unknown());
        }
        Ok((i, tool))
    }

    /// Every server's prompts the key may see (`allows`, by prefixed name, as tools), named
    /// `server__prompt`.
    pub async fn prompts(&self, session: &Session, allows: &(dyn Fn(&str) -> bool + Sync)) -> Vec<Value> {
        let mut out = Vec::new();
        for (i, prompts) in self.ask_each(session, "prompts/list", "prompts").await {
            out.extend(self.named(i, &prompts, allows));
        }
        out
    }

    /// The server (its index) and the prompt of a prefixed prompt name the key may get.
    pub fn prompt<'a>(&self, name: &'a str, allows: &dyn Fn(&str) -> bool) -> Result<(usize, &'a str), Unknown> {
        let unknown = || Unknown(format!("Unknown prompt: '{name}'."));
        let (i, prompt) = self.owner(name, false).ok_or_else(unknown)?;
        if !allows(name) {
            return Err(unknown());
        }
        Ok((i, prompt))
    }

    /// Whether the key's rules (`allows`, over the names the client sees) give it server `i`
    /// whole — every name `server__…`, or for an unprefixed server every name at all —: only
    /// then are its resources the key's.
    pub fn whole_server(&self, i: usize, allows: &dyn Fn(&str) -> bool) -> bool {
        allows(&self.upstreams[i].visible(""))
    }

    /// The resources (or resource templates: `field` `resourceTemplates`) of every server the
    /// key has whole (see `whole_server`), as they name them; each resource's server is
    /// remembered for `resources/read`.
    pub async fn resources(&self, session: &Session, method: &str, field: &str, allows: &(dyn Fn(&str) -> bool + Sync)) -> Vec<Value> {
        let mut out = Vec::new();
        for (i, items) in self.ask_each(session, method, field).await {
            if !self.whole_server(i, allows) {
                continue;
            }
            let mut owners = lock(&session.resources);
            for r in &items {
                if let Some(uri) = r.get("uri").and_then(Value::as_str) {
                    owners.insert(uri.to_string(), i);
                }
            }
            drop(owners);
            out.extend(items);
        }
        out
    }

    /// `resources/read`, `resources/subscribe` or `resources/unsubscribe` of `uri` (`method`):
    /// to the server that listed it, else to each server the key has whole in turn until one
    /// has it.
    pub async fn resource(
        &self,
        session: &Session,
        method: &str,
        params: Value,
        allows: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Value, McpError> {
        let uri = params.get("uri").and_then(Value::as_str).unwrap_or_default().to_string();
        let known = lock(&session.resources).get(&uri).copied();
        let order: Vec<usize> = match known {
            Some(i) => vec![i],
            None => (0..self.upstreams.len()).collect(),
        };
        let order: Vec<usize> = order.into_iter().filter(|i| self.whole_server(*i, allows)).collect();
        let mut last = McpError::Rpc { code: -32002, message: format!("Resource not found: {uri}") };
        for i in order {
            match session.servers[i].request(method, params.clone(), &mut |_| {}).await {
                Ok(v) => return Ok(v),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// Tell every server a session is over.
async fn close_all(s: &Session) {
    s.ended.send_replace(true);
    futures_util::future::join_all(s.servers.iter().map(Link::close)).await;
}

/// A prefixed name with its server's name taken off (`server__x` → `x`), for the request to
/// the server; the name itself when it has none.
fn unprefixed(params: &Value, field: &str) -> Value {
    let mut p = params.clone();
    if let Some(name) = p.get(field).and_then(Value::as_str).and_then(|n| split(n).map(|(_, rest)| rest.to_string())) {
        p[field] = Value::String(name);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(yaml: &str) -> Hub {
        let config = crate::config::Config::parse(&format!("listen: 127.0.0.1:1\nmcp: {{ servers: {yaml} }}"), &|_| None).expect("config");
        Hub::new(&config.mcp).expect("hub").expect("servers")
    }

    #[test]
    fn names_resolve_by_a_prefixed_servers_prefix_first_then_to_an_unprefixed_server() {
        let h = hub("[{ name: docs, url: 'http://127.0.0.1:9/mcp' }, { name: solo, url: 'http://127.0.0.1:9/mcp', prefix: false, tools: { allow: [search, a__b] } }]");
        let all = |_: &str| true;
        // The unprefixed server keeps its names; one a prefixed server's prefix claims (a
        // prompt's: the servers' rules name tools only) is left out.
        let prompts = vec![json!({"name": "search"}), json!({"name": "docs__x"}), json!({"name": "a__b"})];
        assert_eq!(h.named(1, &prompts, &all), vec![json!({"name": "search"}), json!({"name": "a__b"})]);
        assert_eq!(h.named(0, &prompts[..1], &all), vec![json!({"name": "docs__search"})]);
        assert_eq!(h.tool("docs__search", &all), Ok((0, "search")));
        assert_eq!(h.tool("search", &all), Ok((1, "search")));
        assert_eq!(h.tool("a__b", &all), Ok((1, "a__b")), "a prefix no prefixed server has is the tool's own");
        assert!(h.tool("other", &all).is_err(), "outside the unprefixed server's own rules");
        assert_eq!(h.prompt("greet", &all), Ok((1, "greet")));
        assert_eq!(h.prompt("docs__greet", &all), Ok((0, "greet")));
        // The key's rules read the names the client sees.
        assert!(h.tool("search", &|n: &str| n != "search").is_err());
        // Sent to the server under its own name: a prefixed one's taken off, an unprefixed one's kept whole.
        assert_eq!(h.own_params(1, &json!({"name": "a__b"}), "name"), json!({"name": "a__b"}));
        assert_eq!(h.own_params(0, &json!({"name": "docs__x"}), "name"), json!({"name": "x"}));
        // An unprefixed server is the key's whole only when every name is.
        assert!(h.whole_server(1, &|_: &str| true) && !h.whole_server(1, &|n: &str| n.starts_with("docs__")));
    }
}
