//! Two proxies on the `quixotic-plecostomus` Pingora fork, for the load harness
//! (`TOLLGATE_BENCH_CANDIDATES`):
//!
//! * `fork-candidate bare LISTEN UPSTREAM`: a passthrough, the fork's counterpart of the
//!   harness's `pingora-bare` (same threads, same allocator), so the two Pingora lines can be
//!   told apart from the relay mechanism.
//! * `fork-candidate relay LISTEN UPSTREAM`: the one-pass relay the fork allows. `request_filter`
//!   reads the whole body (as tollgate must, to route by its `model` field), takes `model` out of
//!   it with a borrowed parse, and `request_body_filter` emits the kept body on the terminal call
//!   the fork adds. No auth, billing or metrics: this is the mechanism's cost alone.

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::Server;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType, Result};
use pingora_proxy::{ProxyHttp, Session};
use std::net::SocketAddr;

/// Bodies larger than this are refused (the harness sends 256 KiB at most).
const MAX_BODY: usize = 32 << 20;

struct Bare(SocketAddr);

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();
    fn new_ctx(&self) {}
    async fn upstream_peer(&self, _s: &mut Session, _c: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.0, false, String::new())))
    }
}

struct Relay(SocketAddr);

#[derive(Default)]
struct RelayCtx {
    body: Option<Bytes>,
    model: Option<String>,
}

#[derive(serde::Deserialize)]
struct ModelField<'a> {
    #[serde(borrow)]
    model: Option<&'a str>,
}

#[async_trait]
impl ProxyHttp for Relay {
    type CTX = RelayCtx;
    fn new_ctx(&self) -> RelayCtx {
        RelayCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RelayCtx) -> Result<bool> {
        let mut buf = BytesMut::new();
        while let Some(chunk) = session.read_request_body().await? {
            if buf.len() + chunk.len() > MAX_BODY {
                return Error::e_explain(ErrorType::HTTPStatus(413), "request body too large");
            }
            buf.extend_from_slice(&chunk);
        }
        if !buf.is_empty() {
            let fields: ModelField = serde_json::from_slice(&buf).map_err(|e| Error::explain(ErrorType::HTTPStatus(400), e.to_string()))?;
            ctx.model = fields.model.map(str::to_string);
            ctx.body = Some(buf.freeze());
        }
        Ok(false)
    }

    async fn upstream_peer(&self, _s: &mut Session, ctx: &mut RelayCtx) -> Result<Box<HttpPeer>> {
        // One upstream here; the model is what a router would choose by.
        let _by = ctx.model.as_deref();
        Ok(Box::new(HttpPeer::new(self.0, false, String::new())))
    }

    async fn request_body_filter(&self, _s: &mut Session, body: &mut Option<Bytes>, _end: bool, ctx: &mut RelayCtx) -> Result<()> {
        if let Some(kept) = ctx.body.take() {
            *body = Some(kept);
        }
        Ok(())
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, listen, upstream) = match args.as_slice() {
        [_, mode, listen, upstream] => (mode.as_str(), listen.as_str(), upstream.as_str()),
        _ => {
            eprintln!("usage: fork-candidate bare|relay LISTEN UPSTREAM");
            std::process::exit(2);
        }
    };
    let Ok(addr) = upstream.parse::<SocketAddr>() else {
        eprintln!("upstream must be an address such as 127.0.0.1:9100");
        std::process::exit(2);
    };
    let conf = ServerConf { threads: 2, ..ServerConf::default() };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    match mode {
        "bare" => {
            let mut svc = pingora_proxy::http_proxy_service_with_name(&server.configuration, Bare(addr), "fork-bare");
            svc.add_tcp(listen);
            server.add_service(svc);
        }
        "relay" => {
            let mut svc = pingora_proxy::http_proxy_service_with_name(&server.configuration, Relay(addr), "fork-relay");
            svc.add_tcp(listen);
            server.add_service(svc);
        }
        _ => {
            eprintln!("mode must be bare or relay");
            std::process::exit(2);
        }
    }
    server.run_forever();
}
