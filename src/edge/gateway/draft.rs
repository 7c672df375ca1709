//! Stage 3, draft: a model call of a known key, counted against its `rpm` (every call is,
//! the ones refused below included), for an endpoint its group may call; its body read
//! (size, time, the buffered-body budget) and resolved to a model, the providers that serve
//! it and what it may cost (`upstream::draft`, which runs the checks of a model call: model
//! rules, output limits, those that read its text). A stored response is read, and a conversation
//! continued, only by the key that created it, with the provider that stores it.

use super::admit::Caller;
use super::{Gateway, RequestCtx, Step};
use crate::charge::Bucket;
use crate::checks::{Kind, Subject};
use crate::config::Protocol;
use crate::protocol::{ApiError, ErrorKind};
use crate::route::Route;
use crate::upstream::{self, Draft};
use pingora_proxy::Session;

/// What the draft stage hands on: the request as it will be sent, and the body's share of
/// the buffered-body budget (given back once the body is sent).
pub(super) struct Drafted {
    pub protocol: Protocol,
    pub draft: Draft,
    /// The body's share of the buffered-body budget, or an upload's of the spool budget.
    pub body_reservation: Option<crate::edge::body::Reservation>,
    pub upload: Option<std::sync::Arc<crate::protocol::multipart::Form>>,
    /// The group's rewrite rules that applied (their header edits are made as it is sent).
    pub group_rules: Option<upstream::rewrite::Matched>,
}

pub(super) async fn draft(gw: &Gateway, session: &mut Session, ctx: &mut RequestCtx, caller: &Caller, protocol: Protocol) -> Step<Drafted> {
    let Caller { route, key, routing, under, .. } = caller;
    gw.charge.count_under(key, under, Bucket::Requests).await?;
    if !routing.catalog.group_allows(&key.group, protocol) {
        return Err(ApiError::new(ErrorKind::NotFound, format!("This endpoint is not available to keys of group '{}'.", key.group)).into());
    }
    if let Some(boundary) = upload_boundary(session, route) {
        let (mut form, spooled) = crate::edge::upload::read_form(session, &gw.uploads, &boundary, &key.id).await?;
        if matches!(route, Route::Transcription { .. }) {
            // How long the audio plays, from its container: what it is held and billed for.
            if let Some(file) = form.files.iter_mut().find(|f| f.name == "file") {
                let (spool, len, name) = (file.spool.clone(), file.len, file.filename.clone());
                file.played_ms = tokio::task::spawn_blocking(move || crate::protocol::audio::seconds(spool, len, name.as_deref()))
                    .await
                    .ok()
                    .flatten()
                    .map(|s| (s * 1000.0).ceil() as u64);
            }
        }
        let draft =
            upstream::draft_form(routing, route, &key.group, &key.policy, (&gw.checks, &caller.plans), &form).inspect_err(|_| {
                ctx.model_asked = form.field("model").filter(|m| crate::protocol::check_model_name(m).is_ok()).map(str::to_string);
            })?;
        return Ok(Drafted {
            protocol,
            draft,
            body_reservation: Some(spooled),
            upload: Some(std::sync::Arc::new(form)),
            group_rules: None,
        });
    }
    let mut client_body = crate::edge::body::read(session, &gw.body).await?;
    if let Some((ingress, model)) = &ctx.ingress {
        client_body.bytes = super::ingress::messages_body(session, routing, *ingress, model.as_deref(), &client_body.bytes)?;
    }
    let mut applied = None;
    let draft = match route {
        Route::StoredResponse { id, .. } => {
            let owner = gw.owners.owned_by(id, &key.id).await.map_err(crate::access::owners::unavailable)?;
            let draft = owner
                .and_then(|owner| upstream::stored_draft(routing, &owner, client_body.bytes))
                .ok_or_else(|| crate::access::owners::not_found(id))?;
            // A stored response is read under the model rules of the model that made it.
            gw.checks
                .run(&Subject::new(Kind::ModelCall, &key.policy).model(&draft.model).plans(&caller.plans))
                .inspect_err(|_| ctx.model_asked = Some(draft.model.clone()))?;
            draft
        }
        _ => {
            // The fallbacks the client names in its header (a body's `models`: below).
            let named = crate::protocol::header_str(session.req_header(), &upstream::fallback::HEADER);
            let mut asked = upstream::fallback::asked(route, named)?;
            let client_bytes = std::mem::take(&mut client_body.bytes);
            // The guardrails read what the call sends before anything is held or sent.
            let came = client_bytes.clone();
            let body = super::guarded::input(gw, ctx, caller, protocol, client_bytes).await.inspect_err(|_| {
                // Refused: the access log names the model the body asked for.
                ctx.model_asked = model_named(route, Some(&came));
            })?;
            // The group's rewrite rules, before anything is held (none: the body as it is).
            let (body, group_rules) = match routing.catalog.group_rewrite(&key.group) {
                Some(rules) => {
                    let model = model_named(route, Some(&body)).unwrap_or_default();
                    let facts = upstream::rewrite::Facts { model: &model, route: route.label(), headers: &session.req_header().headers };
                    upstream::rewrite::before_hold(rules, &facts, body)?
                }
                None => (body, None),
            };
            let checks = (&*gw.checks, &caller.plans[..]);
            let named_model = |ctx: &mut RequestCtx| {
                // Refused: the access log names the model asked for, if the body or the
                // path (generate-content) names one.
                ctx.model_asked = model_named(route, Some(&came));
            };
            let mut draft = upstream::draft(routing, route, protocol, &key.group, &key.policy, checks, body.clone())
                .inspect_err(|_| named_model(ctx))?;
            let body = match draft.models_listed {
                // A body's `models` list is not sent on: the call is drafted again without it.
                true => {
                    let (without, list) = upstream::fallback::listed(&body)?;
                    asked = Some(list);
                    draft = upstream::draft(routing, route, protocol, &key.group, &key.policy, checks, without.clone())
                        .inspect_err(|_| named_model(ctx))?;
                    without
                }
                false => body,
            };
            upstream::fallback::attach(&mut draft, routing, (route, protocol), &key.group, &key.policy, checks, asked, &body)
                .inspect_err(|_| named_model(ctx))?;
            // Each fallback's body is held too, against the same budget.
            let more: usize = draft.fallbacks.iter().map(|f| f.body.len()).sum();
            if more > 0 && !client_body.reservation.grow(more) {
                return Err(crate::edge::body::busy().into());
            }
            applied = group_rules;
            if let Some(previous) = &draft.previous_response_id {
                let owner = gw.owners.owned_by(previous, &key.id).await.map_err(crate::access::owners::unavailable)?;
                let owner = owner.ok_or_else(|| crate::access::owners::previous_not_found(previous))?;
                // The conversation is stored with that provider: it serves the turn.
                upstream::prefer_provider(&routing.catalog, &mut draft.candidates, &owner.provider);
                // And it is counted again as this turn's input.
                draft.continues(routing, route, owner.context_tokens)?;
            }
            draft
        }
    };
    Ok(Drafted { protocol, draft, body_reservation: Some(client_body.reservation), upload: None, group_rules: applied })
}

/// The model a refused call named, for the access log: in the path (generate-content), or in
/// the body when it is given.
fn model_named(route: &Route, body: Option<&[u8]>) -> Option<String> {
    match route {
        Route::GenerateContent { model, .. } | Route::GeminiCountTokens { model } | Route::GeminiEmbed { model, .. } => {
            crate::protocol::check_model_name(model).ok().map(|()| model.clone())
        }
        _ => body.and_then(|b| crate::protocol::body_fields(b).ok()).and_then(|f| f.model),
    }
}

/// The boundary of an upload to a route that takes one (`multipart/form-data`).
fn upload_boundary(session: &Session, route: &Route) -> Option<String> {
    if !route.multipart() {
        return None;
    }
    crate::protocol::header_str(session.req_header(), http::header::CONTENT_TYPE).and_then(crate::protocol::multipart::boundary)
}
