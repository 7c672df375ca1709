//! `POST /v1/redeem {"code"}` (a stage-2 answer): a redemption code credited to the calling
//! key's account, or the key itself when it has none (`selling::codes`). Open to a key below
//! zero — paying is how it gets out — and throttled against guessing per key and address.

use super::super::admit::Caller;
use super::super::{Gateway, Outcome, RequestCtx};
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use pingora_proxy::Session;
use serde_json::json;

/// A code redeemed: counted and in a slot, not refused below zero.
pub(in crate::edge::gateway) struct Redeem;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    code: String,
}

#[async_trait::async_trait]
impl super::Answered for Redeem {
    fn platform(&self) -> Option<crate::config::Platform> {
        None
    }

    fn entry(&self) -> crate::charge::Entry {
        crate::charge::Entry::READ
    }

    async fn run(&self, gw: &Gateway, session: &mut Session, _ctx: &mut RequestCtx, caller: &Caller) -> Result<Outcome, ApiError> {
        let body = crate::edge::body::read(session, &gw.body).await?.bytes;
        let Body { code } = serde_json::from_slice(&body)
            .map_err(|_| ApiError::new(ErrorKind::BadRequest, "The body must be {\"code\": \"tgc_…\"}.").with_param("code"))?;
        let from = super::super::admit::client_of(session, &caller.routing).ok();
        let codes = &gw.selling.codes;
        let done = codes.redeem(codes.holder_of(&caller.key)?, &format!("key {}", caller.key.id), &code, from).await?;
        let body = json!({
            "object": "redemption",
            "credited": done.holder.strip_prefix("acct:").map_or_else(|| json!({"key": caller.key.name}), |a| json!({"account": a})),
            "amount": crate::base::money::usd(done.amount),
            "plan": done.plan,
            "balance": crate::base::money::usd(done.balance_after),
        });
        Ok(Outcome::Respond(LocalResponse::json(200, &body)))
    }
}
