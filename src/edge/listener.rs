//! A client connection before Pingora parses its request: how many connections are open
//! (overall and per client address), how long and how large a request header may be, and how
//! long an idle keep-alive connection stays.
//!
//! Pingora calls no hook before a request header is complete, so these bounds live at the
//! listener: [`Guarded`] is the `ServerApp` of the public (and admin) listeners, wrapped around
//! Pingora's HTTP proxy. For each accepted connection it takes a slot (past the caps the
//! connection is closed at once and counted) and wraps the stream in [`HeaderGuard`], which
//! holds back the bytes of each HTTP/1 request header until its blank line arrives:
//!
//! * the whole header must arrive within `limits.header_timeout_secs` of its first byte (a
//!   trickle does not extend it) → `408`, connection closed;
//! * it may be at most `limits.max_header_bytes` → `431`, connection closed;
//! * before a request's first byte, a connection may idle `limits.keepalive_timeout_secs` →
//!   closed quietly.
//!
//! Pingora never sees a partial header, so a refused one costs it nothing and logs nothing
//! there; a held header costs at most `max_header_bytes` here. The gateway re-arms the guard
//! when a request ends ([`request_done`]), so every request on a keep-alive connection gets
//! the same bounds. HTTP/2 connections (TLS with ALPN h2) pass through: their header size is
//! bounded by the HTTP/2 settings and their idle time by Pingora's h2 idle timeout, both set
//! from the same limits in `server`.

use crate::config::ConnLimits;
use async_trait::async_trait;
use pingora_core::apps::ServerApp;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID, UniqueIDType, ALPN,
};
use pingora_core::server::ShutdownWatch;
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Open connections, overall and by client address.
#[derive(Default)]
struct Counts {
    total: AtomicUsize,
    by_ip: Mutex<HashMap<IpAddr, usize>>,
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Total,
    PerIp,
}

/// One open connection; gives its place back when dropped.
struct Slot {
    counts: Arc<Counts>,
    ip: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counts.total.fetch_sub(1, Ordering::Relaxed);
        if let Some(ip) = self.ip {
            let mut by_ip = self.counts.by_ip.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = by_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    by_ip.remove(&ip);
                }
            }
        }
    }
}

/// An IPv4 client seen through an IPv6 socket (`::ffff:a.b.c.d`) counts as that IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

impl Counts {
    fn admit(self: &Arc<Self>, ip: Option<IpAddr>, limits: &ConnLimits) -> Result<Slot, Refusal> {
        let total = self.total.fetch_add(1, Ordering::Relaxed) + 1;
        // From here on the slot gives the place back on every path.
        let mut slot = Slot { counts: self.clone(), ip: None };
        if limits.max_connections > 0 && total > limits.max_connections {
            return Err(Refusal::Total);
        }
        if let Some(ip) = ip.map(canonical) {
            let mut by_ip = self.by_ip.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = by_ip.entry(ip).or_insert(0);
            if limits.max_connections_per_ip > 0 && *n >= limits.max_connections_per_ip {
                return Err(Refusal::PerIp);
            }
            *n += 1;
            slot.ip = Some(ip);
        }
        Ok(slot)
    }
}

/// The listeners' application: Pingora's HTTP proxy `A`, behind the connection caps and the
/// header guard.
pub struct Guarded<A> {
    app: Arc<A>,
    /// Whether open connections show in `tollgate_client_connections` (the public listeners).
    public: bool,
    limits: Arc<ConnLimits>,
    counts: Arc<Counts>,
    metrics: Arc<crate::observe::metrics::Metrics>,
}

impl<A> Guarded<A> {
    /// `public`: the client listeners (their connections are counted in `/metrics`).
    pub fn new(app: A, limits: ConnLimits, metrics: Arc<crate::observe::metrics::Metrics>, public: bool) -> Self {
        Guarded { app: Arc::new(app), public, limits: Arc::new(limits), counts: Arc::default(), metrics }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Guarded<A> {
    async fn process_new(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        let ip = stream.get_socket_digest().and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        let _slot = match self.counts.admit(ip, &self.limits) {
            Ok(slot) => slot,
            Err(why) => {
                let reason = match why {
                    Refusal::Total => "max_connections",
                    Refusal::PerIp => "max_connections_per_ip",
                };
                self.metrics.counter("tollgate_connections_refused_total", &[("reason", reason)]).add(1);
                log::debug!("connection from {ip:?} refused: {reason}");
                return None;
            }
        };
        let _open = self.public.then(|| crate::observe::metrics::Live::new(&self.metrics, crate::observe::metrics::Gauge::Connections));
        let h2 = matches!(stream.selected_alpn_proto(), Some(ALPN::H2));
        let guarded: Stream = Box::new(HeaderGuard::new(stream, self.limits.clone(), self.metrics.clone(), h2));
        // Pingora's HTTP/1 loop serves every request of the connection in this call.
        self.app.process_new(guarded, shutdown).await
    }

    async fn cleanup(&self) {
        self.app.cleanup().await;
    }
}

/// A listening service for `inner` (the gateway or the admin API) behind the connection caps
/// and the header guard, with the same header size and idle bounds for HTTP/2 clients.
/// `public`: its connections are counted in `tollgate_client_connections`.
pub fn service<SV>(
    conf: &Arc<pingora_core::server::configuration::ServerConf>,
    inner: SV,
    name: &str,
    limits: &ConnLimits,
    metrics: &Arc<crate::observe::metrics::Metrics>,
    public: bool,
) -> pingora_core::services::listening::Service<Guarded<pingora_proxy::HttpProxy<SV>>>
where
    SV: pingora_proxy::ProxyHttp + Send + Sync + 'static,
    SV::CTX: Send + Sync,
{
    let mut proxy = pingora_proxy::http_proxy(conf, inner);
    let mut h2 = pingora_core::protocols::http::v2::server::default_h2_options();
    h2.max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    proxy.h2_options = Some(h2);
    let mut options = pingora_core::apps::HttpServerOptions::default();
    options.h2_idle_timeout = Some(limits.keepalive_timeout);
    proxy.server_options = Some(options);
    pingora_core::services::listening::Service::new(name.to_string(), Guarded::new(proxy, limits.clone(), metrics.clone(), public))
}

/// A request on this connection ended: the next one gets a fresh header deadline and size,
/// and the idle bound until its first byte. Called from the `logging` hooks.
pub fn request_done(session: &pingora_core::protocols::http::ServerSession) {
    if let Some(guard) = session.stream().and_then(|s| s.as_any().downcast_ref::<HeaderGuard>()) {
        guard.next_request.store(true, Ordering::Relaxed);
    }
}

/// Where a connection's reads are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before the first byte of a request header.
    Idle,
    /// Inside a header: bytes are held back until its blank line.
    Header,
    /// The held header is handed to Pingora, then reads pass through.
    Handing,
    /// Past the header (body, or an HTTP/2 connection): reads pass through.
    Passing,
    /// Writing a refusal (408, 431); then the connection ends.
    Refusing,
    /// Every read is the end of the stream.
    Closed,
}

/// Finds the blank line that ends a header: CRLF CRLF, or bare LFs (which the parser also
/// accepts). Blank lines before the request line do not count.
#[derive(Debug, Default, Clone, Copy)]
struct HeaderEnd {
    /// 0: inside a line; 1: just after a line end; 2: after a line end and a CR.
    state: u8,
    content: bool,
}

impl HeaderEnd {
    /// The offset just past the blank line in `bytes`, if it is there. Inside a line only its
    /// end matters, so the bytes up to the next LF are skipped with `memchr` (a header is read
    /// through here on every request); the bytes after a line end go through [`HeaderEnd::step`].
    fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < bytes.len() {
            if self.state == 0 {
                let line = &bytes[i..];
                let lf = memchr::memchr(b'\n', line);
                // A CR inside a line is not content; anything else is.
                if !self.content && line[..lf.unwrap_or(line.len())].iter().any(|&b| b != b'\r') {
                    self.content = true;
                }
                i += lf?;
            }
            if self.step(bytes[i]) {
                return Some(i + 1);
            }
            i += 1;
        }
        None
    }

    /// One byte: the state after it; true when it ends the header.
    fn step(&mut self, b: u8) -> bool {
        self.state = match (self.state, b) {
            (1 | 2, b'\n') if self.content => return true,
            (_, b'\n') => 1,
            (1, b'\r') => 2,
            (0, b'\r') => 0,
            _ => {
                self.content = true;
                0
            }
        };
        false
    }
}

fn refusal(status: &str, code: &str, message: &str) -> Vec<u8> {
    let body = serde_json::json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}}).to_string();
    format!("HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        .into_bytes()
}

/// Bytes held in pages of [`PAGE`] bytes: growing never copies or leaves freed buffers behind,
/// so a held header costs its size rounded up to a page, however it trickles in.
#[derive(Default)]
struct Held {
    pages: Vec<Vec<u8>>,
    len: usize,
}

const PAGE: usize = 4096;

impl Held {
    fn push(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len();
        while !bytes.is_empty() {
            if self.pages.last().is_none_or(|p| p.len() == PAGE) {
                self.pages.push(Vec::with_capacity(PAGE));
            }
            if let Some(page) = self.pages.last_mut() {
                let n = (PAGE - page.len()).min(bytes.len());
                page.extend_from_slice(&bytes[..n]);
                bytes = &bytes[n..];
            }
        }
    }

    /// Copies the bytes from `offset` on into `buf`, as many as fit; returns how many.
    fn copy_out(&self, offset: usize, buf: &mut ReadBuf<'_>) -> usize {
        let mut at = offset;
        while at < self.len && buf.remaining() > 0 {
            let (page, within) = (at / PAGE, at % PAGE);
            let Some(bytes) = self.pages.get(page).map(|p| &p[within..]) else { break };
            let n = bytes.len().min(buf.remaining());
            buf.put_slice(&bytes[..n]);
            at += n;
        }
        at - offset
    }

    /// Empty, keeping one page for the next header (a usual one fits in it).
    fn clear(&mut self) {
        self.pages.truncate(1);
        if let Some(page) = self.pages.first_mut() {
            page.clear();
        }
        self.len = 0;
    }
}

/// A client stream whose request headers are held back until complete (see the module doc).
pub struct HeaderGuard {
    inner: Stream,
    limits: Arc<ConnLimits>,
    metrics: Arc<crate::observe::metrics::Metrics>,
    phase: Phase,
    /// The header read so far (Header), or what is left to hand over (Handing).
    held: Held,
    handed: usize,
    end: HeaderEnd,
    /// The idle bound (Idle) or the header deadline (Header); allocated once, reset per request.
    timer: Pin<Box<tokio::time::Sleep>>,
    /// The refusal being written, and how much of it is written.
    refusal: Vec<u8>,
    written: usize,
    /// Set when a request ended: the next read starts a new header.
    next_request: AtomicBool,
}

impl std::fmt::Debug for HeaderGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeaderGuard").field("inner", &self.inner).field("phase", &self.phase).finish()
    }
}

impl HeaderGuard {
    fn new(inner: Stream, limits: Arc<ConnLimits>, metrics: Arc<crate::observe::metrics::Metrics>, passing: bool) -> Self {
        let mut guard = HeaderGuard {
            inner,
            limits,
            metrics,
            phase: Phase::Passing,
            held: Held::default(),
            handed: 0,
            end: HeaderEnd::default(),
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            refusal: Vec::new(),
            written: 0,
            next_request: AtomicBool::new(false),
        };
        if !passing {
            guard.await_request();
        }
        guard
    }

    fn await_request(&mut self) {
        self.phase = Phase::Idle;
        self.held.clear();
        self.handed = 0;
        self.end = HeaderEnd::default();
        self.timer.as_mut().reset(tokio::time::Instant::now() + self.limits.keepalive_timeout);
    }

    fn refuse(&mut self, status: &str, code: &'static str, message: &str) {
        self.metrics.counter("tollgate_request_headers_refused_total", &[("reason", code)]).add(1);
        log::debug!("request header refused: {code}");
        self.phase = Phase::Refusing;
        self.refusal = refusal(status, code, message);
        self.written = 0;
        self.held = Held::default();
    }

    /// The timer ran out before a header was complete: an idle connection closes, a started
    /// header is answered 408.
    fn expire(&mut self) {
        if self.phase == Phase::Idle {
            self.phase = Phase::Closed;
        } else {
            self.refuse(
                "408 Request Timeout",
                "request_header_timeout",
                &format!("The request header did not arrive within {} seconds.", self.limits.header_timeout.as_secs()),
            );
        }
    }

    /// Takes in freshly read header bytes: complete (hand it over), too large (refuse), or not yet.
    fn take_header_bytes(&mut self, bytes: &[u8]) {
        if self.phase == Phase::Idle {
            self.phase = Phase::Header;
            self.timer.as_mut().reset(tokio::time::Instant::now() + self.limits.header_timeout);
        }
        let found = self.end.feed(bytes);
        self.held.push(bytes);
        match found {
            // Bytes after the blank line (a body) are handed over with it.
            Some(_) => self.phase = Phase::Handing,
            None if self.held.len > self.limits.max_header_bytes => self.refuse(
                "431 Request Header Fields Too Large",
                "request_header_too_large",
                &format!("The request header is larger than {} bytes.", self.limits.max_header_bytes),
            ),
            None => {}
        }
    }
}

impl AsyncRead for HeaderGuard {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.next_request.swap(false, Ordering::Relaxed) && this.phase == Phase::Passing {
            this.await_request();
        }
        loop {
            match this.phase {
                Phase::Passing => return Pin::new(&mut this.inner).poll_read(cx, buf),
                Phase::Closed => return Poll::Ready(Ok(())),
                Phase::Handing => {
                    this.handed += this.held.copy_out(this.handed, buf);
                    if this.handed == this.held.len {
                        this.held.clear();
                        this.handed = 0;
                        this.phase = Phase::Passing;
                    }
                    return Poll::Ready(Ok(()));
                }
                Phase::Refusing => {
                    while this.written < this.refusal.len() {
                        match Pin::new(&mut this.inner).poll_write(cx, &this.refusal[this.written..]) {
                            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => break,
                            Poll::Ready(Ok(n)) => this.written += n,
                            Poll::Pending => return Poll::Pending,
                        }
                    }
                    if Pin::new(&mut this.inner).poll_flush(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // Pingora read nothing of this header: the end of the stream closes the
                    // connection without another answer or an error in its log.
                    this.phase = Phase::Closed;
                }
                Phase::Idle | Phase::Header if this.held.len == 0 && buf.remaining() > 0 => {
                    // Nothing held yet: read into the caller's buffer. A header complete in
                    // this read (the usual request comes in one segment) is handed over where
                    // it is; a partial one is moved out to be held, as below.
                    let room = (this.limits.max_header_bytes + 1).min(buf.remaining());
                    let start = buf.filled().len();
                    let mut read = buf.take(room);
                    match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                        Poll::Ready(Ok(())) => {
                            let n = read.filled().len();
                            if n == 0 {
                                this.phase = Phase::Closed;
                                continue;
                            }
                            // SAFETY: the first `n` bytes of the unfilled part were just
                            // written by the read above (`take` lends exactly that region).
                            #[allow(unsafe_code)]
                            unsafe {
                                buf.assume_init(n)
                            };
                            buf.advance(n);
                            let mut probe = this.end;
                            if probe.feed(&buf.filled()[start..]).is_some() {
                                this.phase = Phase::Passing;
                                return Poll::Ready(Ok(()));
                            }
                            this.take_header_bytes(&buf.filled()[start..]);
                            buf.set_filled(start);
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => {
                            if this.timer.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            this.expire();
                        }
                    }
                }
                Phase::Idle | Phase::Header => {
                    let mut chunk = [0u8; 4096];
                    let room = (this.limits.max_header_bytes + 1).saturating_sub(this.held.len).clamp(1, chunk.len());
                    let mut read = ReadBuf::new(&mut chunk[..room]);
                    match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                        Poll::Ready(Ok(())) if read.filled().is_empty() => {
                            // The client closed: whatever was held is not a request.
                            this.phase = Phase::Closed;
                        }
                        Poll::Ready(Ok(())) => {
                            let n = read.filled().len();
                            this.take_header_bytes(&chunk[..n]);
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => {
                            if this.timer.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            this.expire();
                        }
                    }
                }
            }
        }
    }
}

impl AsyncWrite for HeaderGuard {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for HeaderGuard {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for HeaderGuard {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for HeaderGuard {
    fn get_ssl(&self) -> Option<&pingora_core::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora_core::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for HeaderGuard {
    fn get_timing_digest(&self) -> Vec<Option<pingora_core::protocols::TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for HeaderGuard {
    fn get_proxy_digest(&self) -> Option<Arc<pingora_core::protocols::raw_connect::ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for HeaderGuard {
    fn get_socket_digest(&self) -> Option<Arc<pingora_core::protocols::SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for HeaderGuard {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        if self.phase == Phase::Passing {
            self.inner.try_peek(buf).await
        } else {
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_ends_at_its_first_blank_line_in_any_chunking() {
        let head = b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\nbody";
        for cut in 0..head.len() {
            let mut end = HeaderEnd::default();
            let found = end.feed(&head[..cut]).or_else(|| end.feed(&head[cut..]).map(|at| at + cut));
            assert_eq!(found, Some(head.len() - 4), "cut at {cut}");
        }
        let mut end = HeaderEnd::default();
        assert_eq!(end.feed(b"GET / HTTP/1.1\nHost: a\n\n"), Some(24));
        let mut end = HeaderEnd::default();
        assert_eq!(end.feed(b"\r\n\r\n\n"), None, "blank lines before the request line are not its end");
    }

    proptest::proptest! {
        /// `feed` skips to each line end; it finds the same end as the byte-by-byte state
        /// machine (`step` alone) on any bytes in any chunking.
        #[test]
        fn skipping_to_line_ends_finds_what_reading_every_byte_finds(
            bytes in proptest::collection::vec(proptest::sample::select(vec![b'a', b'\r', b'\n', b' ']), 0..40),
            cuts in proptest::collection::vec(0usize..40, 0..4),
        ) {
            let mut by_byte = HeaderEnd::default();
            let expected = bytes.iter().position(|&b| by_byte.step(b)).map(|i| i + 1);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut end = HeaderEnd::default();
            let (mut from, mut found) = (0, None);
            for to in cuts.into_iter().chain(std::iter::once(bytes.len())) {
                if found.is_none() {
                    found = end.feed(&bytes[from..to]).map(|at| at + from);
                }
                from = to;
            }
            proptest::prop_assert_eq!(found, expected);
        }
    }

    #[test]
    fn held_bytes_come_out_as_they_went_in_whatever_the_pieces() {
        let data: Vec<u8> = (0..3 * PAGE + 17).map(|i| (i % 251) as u8).collect();
        let mut held = Held::default();
        for piece in data.chunks(1000).chain(std::iter::once(&[][..])) {
            held.push(piece);
        }
        assert_eq!(held.len, data.len());
        assert_eq!(held.pages.iter().map(Vec::capacity).max(), Some(PAGE), "pages never grow");
        let mut out = Vec::new();
        let mut at = 0;
        while at < held.len {
            let mut space = [0u8; 777];
            let mut buf = ReadBuf::new(&mut space);
            at += held.copy_out(at, &mut buf);
            out.extend_from_slice(buf.filled());
        }
        assert_eq!(out, data);
        held.clear();
        assert_eq!((held.len, held.pages.len()), (0, 1));
    }

    #[test]
    fn connections_are_capped_overall_and_per_address_and_places_come_back() {
        let counts = Arc::new(Counts::default());
        let limits = ConnLimits { max_connections: 3, max_connections_per_ip: 2, ..ConnLimits::default() };
        let a: IpAddr = "10.0.0.1".parse().unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let b: IpAddr = "10.0.0.2".parse().unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let first = counts.admit(Some(a), &limits).ok();
        let second = counts.admit(Some(mapped), &limits).ok();
        assert!(first.is_some() && second.is_some());
        assert_eq!(counts.admit(Some(a), &limits).err(), Some(Refusal::PerIp), "the mapped address is the same client");
        let third = counts.admit(Some(b), &limits).ok();
        assert!(third.is_some());
        assert_eq!(counts.admit(Some(b), &limits).err(), Some(Refusal::Total));
        drop(first);
        assert!(counts.admit(Some(a), &limits).is_ok(), "a closed connection gives its place back");
        drop((second, third));
        assert_eq!(counts.total.load(Ordering::Relaxed), 0);
        assert!(counts.by_ip.lock().map(|m| m.is_empty()).unwrap_or(false));
    }
}
