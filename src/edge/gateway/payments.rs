//! The payment provider's endpoint on the public listener: `POST /payments/stripe/webhook`,
//! answered without a key — its `Stripe-Signature` is checked by `selling::stripe` before
//! anything in the body is believed. 404 where `payments.stripe` is not configured.

use super::Gateway;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use pingora_proxy::Session;

pub(super) async fn stripe_webhook(gw: &Gateway, session: &mut Session) -> Result<LocalResponse, ApiError> {
    let Some(stripe) = gw.selling.stripe.as_ref() else {
        return Err(super::unknown_endpoint(session.req_header()));
    };
    let signature = session.req_header().headers.get("stripe-signature").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = crate::edge::body::read(session, &gw.body).await?.bytes;
    if body.len() > crate::selling::stripe::MAX_EVENT_BYTES {
        return Err(ApiError::new(ErrorKind::PayloadTooLarge, "The event is too large."));
    }
    let handled = stripe.webhook(signature.as_deref(), &body, crate::base::clock::now_unix()).await.map_err(|e| {
        if let crate::selling::stripe::PayError::Signature(why) = &e {
            gw.metrics.counter("tollgate_payment_events_total", &[("outcome", "bad_signature")]).add(1);
            log::warn!("stripe webhook refused: {why}");
        }
        ApiError::from(e)
    })?;
    let outcome = match handled {
        crate::selling::stripe::Handled::Moved { .. } => "moved",
        crate::selling::stripe::Handled::Already => "already",
        crate::selling::stripe::Handled::Ignored => "ignored",
    };
    gw.metrics.counter("tollgate_payment_events_total", &[("outcome", outcome)]).add(1);
    Ok(LocalResponse::json(200, &serde_json::json!({"received": true, "outcome": outcome})))
}
