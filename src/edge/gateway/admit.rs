//! Stage 1, admit: which endpoint the request is for, and who is calling (a gateway key, or
//! an access token of the identity provider: see `person.rs`). Answers what needs
//! no key (the reachability probe, the key page's HTML, an unknown path) and refuses a key in
//! the query string, an unknown or refused key, and an address the key's policy does not
//! list.

use super::{client_version, shape_of, unknown_endpoint, Exit, Gateway, Outcome, RequestCtx, Step};
use crate::access::auth;
use crate::checks::{Kind, Subject};
use crate::policy::forwarded::{client_address, ClientAddr, Malformed};
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::route::{self, Route};
use crate::upstream::Routing;
use pingora_proxy::Session;
use std::sync::Arc;

/// A request whose caller is known and allowed here.
pub(super) struct Caller {
    pub route: Route,
    pub key: Arc<KeyRecord>,
    /// The client's `anthropic-version` / `compat-version`.
    pub version: Option<String>,
    /// The routing snapshot the whole request is decided on.
    pub routing: Arc<Routing>,
    /// The model rules of the plans the key is under (none: nothing allocated).
    pub plans: Vec<crate::policy::plan::PlanModels>,
    /// Its account, plans and tag limits, looked up once for every stage.
    pub under: crate::charge::Under,
}

/// The caller, or None for a request that carries no key by design (Stripe's webhook, which
/// its signature authenticates: `payments.rs`).
pub(super) async fn admit(gw: &Gateway, session: &Session, ctx: &mut RequestCtx) -> Step<Option<Caller>> {
    let req = session.req_header();
    let route = route::classify(req.method.as_str(), req.uri.path());
    ctx.shape = Some(shape_of(&route, req));
    ctx.route = route.label();

    if let Some(param) = auth::query_carries_key(req.uri.query()) {
        return Err(ApiError::new(
            ErrorKind::BadRequest,
            format!("API keys are not accepted in query parameters ('{param}'). Send the key in a header."),
        )
        .with_param(&param)
        .into());
    }
    if let Route::NotFound { .. } = route {
        return Err(unknown_endpoint(req).into());
    }
    if route == Route::Root {
        // A reachability probe (agent CLIs send one to their base URL): no key needed,
        // nothing about the configuration shown.
        let ok = LocalResponse::json(200, &serde_json::json!({"object": "tollgate", "status": "ok"}));
        return Err(Exit::Answer(Outcome::Respond(ok)));
    }
    if route == Route::StripeWebhook {
        return Ok(None);
    }
    if let Route::Signin(op) = route {
        if gw.signin.is_none() || gw.identity.is_none() {
            return Err(unknown_endpoint(req).into());
        }
        if op.keyless() {
            return Ok(None);
        }
    }
    if let Route::KeyPage { file } = route {
        if !gw.routing.load().key_page {
            return Err(unknown_endpoint(req).into());
        }
        return Err(Exit::Answer(Outcome::Respond(super::key_page::page(file))));
    }
    // A messages call in Bedrock's or Vertex's format goes on as a messages call.
    let route = match route {
        Route::Ingress { ingress, model } => {
            use crate::protocol::cloud_ingress::Ingress;
            // The model as clients call it here (a path may name a provider's own id for it).
            let model = model.map(|m| gw.routing.load().catalog.client_name(&m).unwrap_or(m));
            ctx.ingress = Some((ingress, model.clone()));
            match ingress {
                Ingress::VertexCountTokens => Route::CountTokens,
                Ingress::VertexGemini { stream } => Route::GenerateContent { model: model.unwrap_or_default(), stream },
                _ => Route::Messages,
            }
        }
        other => other,
    };
    ctx.key_checked = true;
    let presented = auth::extract_key(&req.headers);
    let key = match (&gw.identity, presented) {
        // An access token of the identity provider: the person's own key.
        (Some(identity), Some(token)) if crate::identity::looks_like_jwt(token) => {
            let token = token.to_string();
            // tollgate's own token (Claude Code's gateway sign-in), else the provider's.
            match own_token(gw, &token).await? {
                Some(claims) => {
                    let person = crate::signin::Someone::of_claims(&claims).person();
                    let key = super::person::key_for(gw, identity, &person).await?;
                    ctx.signed_in = Some(claims);
                    key
                }
                None => super::person::key_of(gw, identity, &token).await?,
            }
        }
        _ => gw.keys.authenticate(presented)?,
    };
    ctx.key = Some(key.clone());
    let routing = gw.routing.load_full();
    // The checks of every request of a key (its `ip_allow`): the address is resolved only
    // when one asks.
    {
        let address = || client_of(session, &routing);
        gw.checks.run(&Subject { address: Some(&address), ..Subject::new(Kind::Request, &key.policy) })?;
    }
    let under = gw.charge.under(&key);
    let plans = gw.charge.plan_models_under(&key, &under);
    Ok(Some(Caller { route, key, version: client_version(req), routing, plans, under }))
}

/// The client's address: the peer's, or the one trusted proxies forwarded (refused when it
/// cannot be known, for a key that lists addresses).
pub(super) fn client_of(session: &Session, routing: &Routing) -> std::result::Result<std::net::IpAddr, ApiError> {
    let not_listed = || ApiError::new(ErrorKind::IpNotAllowed, "This API key may only be used from listed addresses.");
    let peer = session.client_addr().and_then(|a| a.as_inet()).map(|a| a.ip()).ok_or_else(not_listed)?;
    match client_address(peer, &session.req_header().headers, &routing.trusted_proxies) {
        Ok(ClientAddr::Known(client)) => Ok(client),
        Ok(ClientAddr::Unknown) => Err(not_listed()),
        Err(Malformed(why)) => Err(ApiError::new(ErrorKind::BadRequest, format!("The forwarding headers cannot be read: {why}."))),
    }
}

/// The claims of `token` when it is tollgate's own (None: not ours; refused: ours but invalid
/// or expired — the client signs in or refreshes again).
async fn own_token(gw: &Gateway, token: &str) -> Result<Option<Arc<crate::signin::token::Claims>>, ApiError> {
    let Some(signin) = gw.signin.as_ref() else { return Ok(None) };
    match signin.verify(token, crate::base::clock::now_unix()).await {
        Ok(claims) => Ok(Some(claims)),
        Err(crate::signin::SigninError::Key(crate::signin::token::TokenError::NotOurs)) => Ok(None),
        Err(crate::signin::SigninError::Key(crate::signin::token::TokenError::Invalid(why))) => {
            log::info!("sign-in: a token was refused: {why}");
            gw.metrics.counter("tollgate_identity_refused_total", &[]).add(1);
            Err(ApiError::new(ErrorKind::Unauthorized, "The access token was not accepted: it is invalid or expired. Sign in again."))
        }
        Err(e) => {
            log::warn!("{e}");
            Err(crate::store::fleet::unavailable("the sign-in key"))
        }
    }
}
