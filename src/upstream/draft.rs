//! A model call resolved before anything is sent: its model and the providers that serve it,
//! the body to send (stream usage asked for, the output maximum set), and the most it may cost
//! — its input estimate and its output allowance, lowered when a key cannot afford the
//! default. Pure: the gateway's draft and price stages act on it.

use super::catalog::{order_providers, Catalog};
use super::{media, output, Routing};
use crate::checks::{Checks, Kind, Stop, Subject, Text};
use crate::config::Protocol;
use crate::protocol::{body_fields, ApiError, BodyFields, ErrorKind};
use crate::route::Route;

/// The output tokens a request may produce, all choices together: the per-choice maximum it
/// names in its route's own field (refused above the model's `max_output_tokens`, or above
/// [`crate::base::usage::MAX_OUTPUT_ALLOWANCE`]), else the default allowance (see
/// [`output::default_allowance`]); times `n` / `candidateCount`. Returns the per-choice figure
/// and whether the request named it. `asked` is what it names (`output::asked`, read once for
/// the checks, whose `output_limit` applied the key's cap before).
fn output_allowance(
    route: &Route,
    fields: &BodyFields<'_>,
    routing: &Routing,
    model: &str,
    (policy, asked): (&crate::policy::KeyPolicy, Option<u64>),
) -> Result<(u64, bool), ApiError> {
    let price = routing.prices.price(model);
    let model_limit = price.and_then(|p| p.max_output_tokens);
    Ok(match asked {
        Some(asked) => {
            let limit = model_limit.unwrap_or(crate::base::usage::MAX_OUTPUT_ALLOWANCE);
            if asked > limit {
                return Err(ApiError::new(
                    ErrorKind::BadRequest,
                    format!("The maximum output of {asked} tokens is more than the model '{model}' can produce ({limit})."),
                )
                .with_param(output::named_field(route, fields)));
            }
            (asked, true)
        }
        None => (
            output::default_allowance(
                price.and_then(|p| p.default_output_tokens),
                model_limit,
                policy.default_output_tokens,
                policy.max_output_tokens,
                routing.default_output_tokens,
            ),
            false,
        ),
    })
}

/// What a relayed request will do, decided from the routing snapshot, its route, its key's
/// group and its body alone: no I/O, no balance, no limit (those are the caller's).
#[derive(Debug)]
pub struct Draft {
    pub model: String,
    /// Indexes into the catalog's upstreams, in the order to try them.
    pub candidates: Vec<usize>,
    /// The most the request can cost, in nano-USD: held before anything is sent.
    pub hold_nanos: i64,
    /// Of it, what is charged whatever the answer (its guardrails' `price_per_check`).
    pub fixed_nanos: i64,
    /// The input it may be billed (see [`crate::billing::InputEstimate`]).
    pub input: crate::billing::InputEstimate,
    /// The output tokens held, all choices together.
    pub output_allowance: u64,
    /// The request named its output maximum itself: it is not lowered to what the key can
    /// afford (see [`Draft::lower_output`]).
    output_named: bool,
    /// How many answers the request asks for (`n`, `candidateCount`).
    pub choices: u64,
    /// The field that names the request's output maximum (the one it used, else the one to set).
    pub output_field: &'static str,
    /// The body to send (the client's, with usage asked for, with the output maximum).
    pub body: bytes::Bytes,
    /// The client's body: what the body to send is made from (again, by [`Draft::lower_output`]).
    base_body: bytes::Bytes,
    /// The client's body's part of the rewrite (stream usage asked for), joined with the output
    /// maximum into one edit: the body is copied once at most.
    usage_edit: crate::protocol::BodyEdit,
    pub client_body_len: usize,
    /// tollgate asked for stream usage; the usage chunk is not the client's to see.
    pub withhold_usage: bool,
    /// The stored response this turn continues (responses API): the caller must own it, and
    /// its provider serves the turn.
    pub previous_response_id: Option<String>,
    /// The model is served over another protocol than the client's: `body` is the provider's.
    pub translation: Option<crate::translate::Translation>,
    /// The client asked for a streamed answer.
    pub stream: bool,
    /// A media call (images, speech, transcription): billed in its own units.
    pub media: Option<crate::billing::media::MediaCall>,
    /// The models it may go on to, each drafted as the call would be for it (see `fallback`);
    /// `hold_nanos` is the dearest of them and this one.
    pub fallbacks: Vec<Draft>,
    /// On which classes of failure it goes on to them.
    pub fallback_on: crate::config::fallbacks::Classes,
    /// A fallback's own route, when its model is in the path (generate content).
    pub route: Option<Route>,
    /// The body names a `models` list (chat completions, responses): the gateway takes it out
    /// and drafts the call again (`fallback::listed`).
    pub models_listed: bool,
    /// What it holds by itself (the fallbacks' holds aside).
    own_hold: i64,
}

/// Plan a request on a stored response (read, cancel, delete, list its input items): it goes
/// to the provider that stored it, unbilled. None when that provider is no longer configured.
pub fn stored_draft(routing: &Routing, owner: &crate::records::usage::ResponseOwner, client_body: bytes::Bytes) -> Option<Draft> {
    let index = routing.catalog.upstreams.iter().position(|u| u.config.name == owner.provider)?;
    Some(Draft {
        model: owner.model.clone(),
        candidates: vec![index],
        hold_nanos: 0,
        fixed_nanos: 0,
        input: crate::billing::InputEstimate::default(),
        output_allowance: 0,
        output_named: true,
        choices: 1,
        output_field: "max_tokens",
        client_body_len: client_body.len(),
        base_body: client_body.clone(),
        usage_edit: crate::protocol::BodyEdit::default(),
        body: client_body,
        withhold_usage: false,
        previous_response_id: None,
        translation: None,
        stream: false,
        media: None,
        fallbacks: Vec::new(),
        fallback_on: Default::default(),
        route: None,
        models_listed: false,
        own_hold: 0,
    })
}

/// Plan a relayed request: the model (from the body, or the path for generate-content), the
/// providers serving it to this group, the hold (input at one token per three bytes plus the
/// output allowance of every choice), and the body to send. A streamed chat completion reports
/// usage only when asked: whatever the client sent in `stream_options`, ask, and withhold the
/// usage chunk from a client that did not (one splice; the body is parsed once).
pub fn draft(
    routing: &Routing,
    route: &Route,
    protocol: Protocol,
    group: &str,
    policy: &crate::policy::KeyPolicy,
    checks: (&Checks, &[crate::policy::plan::PlanModels]),
    client_body: bytes::Bytes,
) -> Result<Draft, Stop> {
    draft_of(routing, route, protocol, group, policy, checks, client_body, None, false)
}

/// Plan a relayed upload (a `multipart/form-data` media call): as [`draft`], its fields read
/// from the form; the body is the form, written for each provider as it is sent.
pub fn draft_form(
    routing: &Routing,
    route: &Route,
    group: &str,
    policy: &crate::policy::KeyPolicy,
    checks: (&Checks, &[crate::policy::plan::PlanModels]),
    form: &crate::protocol::multipart::Form,
) -> Result<Draft, Stop> {
    draft_of(routing, route, Protocol::Openai, group, policy, checks, bytes::Bytes::new(), Some(form), false)
}

// The entries' arguments and the checks: more than clippy's default. `fallback`: drafted as
// another model a call may go on to (see `fallback`): the load of its first provider is counted
// only if it is sent, and it is reached through another protocol whatever the group's `translate`.
#[allow(clippy::too_many_arguments)]
pub(super) fn draft_of(
    routing: &Routing,
    route: &Route,
    protocol: Protocol,
    group: &str,
    policy: &crate::policy::KeyPolicy,
    (checks, plans): (&Checks, &[crate::policy::plan::PlanModels]),
    client_body: bytes::Bytes,
    form: Option<&crate::protocol::multipart::Form>,
    fallback: bool,
) -> Result<Draft, Stop> {
    let catalog = &routing.catalog;
    let (fields, media) = match route {
        Route::GenerateContent { .. } | Route::GeminiCountTokens { .. } | Route::GeminiEmbed { .. } if client_body.is_empty() => {
            (BodyFields::default(), None)
        }
        _ if route.media() => {
            let (fields, call) = media::fields(route, &client_body, form)?;
            (fields, Some(call))
        }
        _ => (body_fields(&client_body)?, None),
    };
    let model = model_of(route, &fields)?;
    let models_listed = fields.models.is_some();
    let client = crate::translate::client_dialect(route);
    let (mut candidates, translated) = providers_for(catalog, route, protocol, (group, fallback), client.is_some(), &model)?;
    // The checks of a model call: the key's model rules before its output limits (the
    // documented order), then those that read the request's text. A maximum that cannot be
    // read is refused after them.
    let asked = (!route.embeds() && route.billed()).then(|| output::asked(route, &fields));
    let named = asked.as_ref().and_then(|a| a.as_ref().ok()).map(|a| (*a, output::named_field(route, &fields)));
    let text = (form.is_none() && !client_body.is_empty()).then_some(Text::Json(&client_body));
    checks.run(&Subject { output: named, text, ..Subject::new(Kind::ModelCall, policy).model(&model).plans(plans) })?;
    let asked = match asked {
        Some(Err(e)) => return Err(e.into()),
        Some(Ok(asked)) => asked,
        None => None,
    };
    // The output held per choice: the request's own maximum (within the key's and the model's
    // limits), else the default allowance, which the upstream is then told.
    let choices = if route.embeds() || !route.billed() { 1 } else { protocol.choices(&fields)? };
    let (per_choice, output_named) =
        if route.embeds() || !route.billed() { (0, true) } else { output_allowance(route, &fields, routing, &model, (policy, asked))? };
    // A media call is never told an output maximum: its answer is images or audio.
    let output_named = output_named || media.is_some();
    let output_allowance = per_choice.saturating_mul(choices);
    let output_field = output::named_field(route, &fields);
    let input = match &media {
        Some(call) => crate::billing::InputEstimate {
            body_tokens: call.input_tokens(media::text_bytes(&client_body, form), routing.media_allowance.image_tokens),
            ..Default::default()
        },
        None => crate::billing::InputEstimate {
            body_tokens: crate::billing::hold_input_tokens(client_body.len()),
            media_tokens: if route.billed() { routing.media_allowance.tokens(fields.media) } else { 0 },
            referenced_tokens: 0,
        },
    };
    let hold_nanos = match &media {
        Some(call) => call.hold(&routing.prices, &model, input.tokens(), output_allowance)?,
        None if !route.billed() => 0,
        None => hold_cost(routing, &model, input, output_allowance)?,
    };
    if candidates.len() > 1 {
        // Embeddings are not conversations: they only spread by weight.
        let conversation = if route.embeds() { None } else { crate::protocol::conversation::conversation_key(&fields) };
        order_providers(catalog, &mut candidates, conversation);
    }
    // The provider chosen is that provider's load from now on (counted at once, so requests
    // deciding at the same moment see each other); a request sent elsewhere after all (its
    // provider rests or fails) is counted where it goes (the gateway's attempt loop).
    if let Some(&first) = candidates.first().filter(|_| !fallback) {
        catalog.upstreams[first].health.load.add();
    }
    let previous_response_id = match route {
        Route::Responses | Route::ResponsesCompact | Route::ResponsesInputTokens => fields.previous_response_id.clone(),
        _ => None,
    };
    let stream = match route {
        Route::GenerateContent { stream, .. } => *stream,
        _ if crate::translate::counts(route) => false,
        _ => fields.stream == Some(true),
    };
    let (usage_edit, withhold_usage, translation) = match (translated, client) {
        (Some(upstream), Some(client)) => {
            let translation = crate::translate::Translation {
                client,
                upstream,
                model: model.clone(),
                stream,
                client_wants_usage: crate::protocol::openai::client_wants_usage(&fields),
                gemini_sse: false,
                input_estimate: input.tokens(),
                count: crate::translate::counts(route),
                max_event_bytes: routing.max_event_bytes,
            };
            drop(fields);
            (crate::protocol::BodyEdit::default(), false, Some(translation))
        }
        _ => {
            let withhold =
                *route == Route::ChatCompletions && fields.stream == Some(true) && !crate::protocol::openai::client_wants_usage(&fields);
            let edit = if withhold { crate::protocol::openai::include_usage(&client_body, &fields)? } else { Default::default() };
            (edit, withhold, None)
        }
    };
    let mut draft = Draft {
        model,
        candidates,
        hold_nanos,
        fixed_nanos: 0,
        input,
        output_allowance,
        output_named,
        choices,
        output_field,
        body: bytes::Bytes::new(),
        client_body_len: client_body.len(),
        base_body: client_body,
        usage_edit,
        withhold_usage,
        previous_response_id,
        translation,
        stream,
        media,
        fallbacks: Vec::new(),
        fallback_on: Default::default(),
        route: None,
        models_listed: models_listed && matches!(route, Route::ChatCompletions | Route::Responses),
        own_hold: hold_nanos,
    };
    draft.body = draft.upstream_body(route, per_choice)?;
    Ok(draft)
}

/// The first model of a `models` list (the call's model when its body names none).
fn first_listed(raw: &[u8]) -> Option<String> {
    let list: Vec<serde_json::Value> = serde_json::from_slice(raw).ok()?;
    list.first().and_then(serde_json::Value::as_str).filter(|m| !m.is_empty()).map(str::to_string)
}

/// The model a request names (in its path for generate content, else in its body), checked;
/// a background response is refused (its usage is only known after the request ends).
fn model_of(route: &Route, fields: &BodyFields<'_>) -> Result<String, ApiError> {
    let model = match route {
        Route::GenerateContent { model, .. } | Route::GeminiCountTokens { model } | Route::GeminiEmbed { model, .. } => model.clone(),
        _ => fields
            .model
            .clone()
            .filter(|m| !m.is_empty())
            // OpenRouter's shape: without `model`, the first of `models` (see `fallback`).
            .or_else(|| fields.models.and_then(|raw| first_listed(raw.bytes())))
            .ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The 'model' field is required.").with_param("model"))?,
    };
    crate::protocol::check_model_name(&model)?;
    if fields.background == Some(true) {
        return Err(ApiError::new(
            ErrorKind::BadRequest,
            "Background responses are not available through this gateway: their usage is only known after the request ends. Send the request without 'background', streamed if it runs long.",
        )
        .with_param("background"));
    }
    Ok(model)
}

/// The providers that may serve `model` for a request over `protocol`, and the protocol they
/// are reached in when it is not the client's: a responses-API request goes to the providers
/// of its model that serve that API, else (`responses: false`) to their chat completions; a
/// model not served over the client's protocol is reached through another by a translating
/// group.
fn providers_for(
    catalog: &Catalog,
    route: &Route,
    protocol: Protocol,
    (group, fallback): (&str, bool),
    translatable: bool,
    model: &str,
) -> Result<(Vec<usize>, Option<Protocol>), ApiError> {
    let allowed = catalog.candidates(protocol, model).filter(|_| catalog.group_allows(group, protocol));
    // A responses-API request goes to the providers of its model that serve that API; when none
    // does (`responses: false`), it is translated to their chat completions.
    let (native, chat_only) = match allowed {
        Some(all) if *route == Route::Responses => {
            let serving: Vec<usize> = all.iter().copied().filter(|&i| catalog.upstreams[i].config.responses).collect();
            if serving.is_empty() {
                (None, Some((Protocol::Openai, all)))
            } else {
                (Some(serving), None)
            }
        }
        other => (other.map(<[usize]>::to_vec), None),
    };
    // Not served over the client's protocol: a translating group reaches it through another.
    let translated = match (&native, translatable) {
        (None, true) if chat_only.is_some() => chat_only,
        (None, true) if (fallback || catalog.group_translates(group)) && catalog.group_allows(group, protocol) => {
            catalog.served_elsewhere(protocol, model)
        }
        _ => None,
    };
    let candidates = native.or(translated.map(|(_, c)| c.to_vec())).ok_or_else(|| {
        ApiError::new(
            ErrorKind::ModelNotFound,
            format!("The model '{model}' does not exist or is not available to this key. See the model list."),
        )
        .with_param("model")
    })?;
    // A kind of upstream that does not offer this endpoint (token counting on Bedrock) is left out.
    let (wire, is_translated) = (translated.map_or(protocol, |(upstream, _)| upstream), translated.is_some());
    let offered = |i: &usize| catalog.upstreams[*i].seam.serves(route, wire, is_translated);
    if !candidates.iter().any(offered) {
        let kinds: Vec<&str> = candidates.iter().map(|&i| catalog.upstreams[i].config.kind.as_str()).collect();
        return Err(ApiError::new(
            ErrorKind::BadRequest,
            format!("The model '{model}' is served here by providers ({}) that do not offer this endpoint.", kinds.join(", ")),
        )
        .with_param("model"));
    }
    let candidates = if candidates.iter().all(offered) { candidates } else { candidates.into_iter().filter(offered).collect() };
    Ok((candidates, translated.map(|(upstream, _)| upstream)))
}

/// The hold for `input` and `output` tokens of `model`; a model without a price is refused.
fn hold_cost(routing: &Routing, model: &str, input: crate::billing::InputEstimate, output: u64) -> Result<i64, ApiError> {
    routing.prices.hold_cost(model, input.tokens(), output).ok_or_else(|| {
        log::error!("model {model} is served without a price; refused");
        ApiError::new(ErrorKind::Internal, format!("The model '{model}' is not priced on this gateway and cannot be served."))
    })
}

impl Draft {
    /// The body the upstream gets for `per_choice` output tokens: a translated request is
    /// encoded with it; a native one carries it in its route's own field unless the client
    /// named its maximum there itself, with stream usage asked for in the same copy.
    fn upstream_body(&self, route: &Route, per_choice: u64) -> Result<bytes::Bytes, ApiError> {
        if let Some(t) = &self.translation {
            return crate::translate::request(t, &self.base_body, per_choice);
        }
        let mut edit = self.usage_edit.clone();
        if !self.output_named {
            match output::maximum_member(route, per_choice) {
                Some(member) => edit.first.insert(0, member),
                // Generate-content's maximum sits inside `generationConfig` (and its requests
                // carry no usage edit): written by re-encoding the body.
                None => return output::with_maximum(route, &self.base_body, per_choice),
            }
        }
        if edit.is_empty() {
            Ok(self.base_body.clone())
        } else {
            edit.apply(&self.base_body)
        }
    }

    /// Hold and ask for at most `per_choice` output tokens: the one rule for every limit a
    /// request that named no maximum is fitted to (a balance, a spend window, `max_request_cost`,
    /// `tpm`). Lowered only when that is less than its allowance and not below
    /// `billing.min_output_tokens`; a request that named its own maximum is never changed.
    /// Whether it was lowered.
    pub fn lower_output(&mut self, routing: &Routing, route: &Route, per_choice: u64) -> Result<bool, ApiError> {
        let choices = self.choices.max(1);
        if self.output_named || per_choice < routing.min_output_tokens || per_choice >= self.output_allowance / choices {
            return Ok(false);
        }
        self.output_allowance = per_choice.saturating_mul(choices);
        self.own_hold = hold_cost(routing, &self.model, self.input, self.output_allowance)?.saturating_add(self.fixed_nanos);
        self.body = self.upstream_body(self.route.as_ref().unwrap_or(route), per_choice)?;
        for fallback in &mut self.fallbacks {
            fallback.lower_output(routing, route, per_choice)?;
        }
        self.held();
        Ok(true)
    }

    /// The hold: the dearest of its own and its fallbacks'.
    pub(super) fn held(&mut self) {
        self.hold_nanos = self.fallbacks.iter().map(|f| f.hold_nanos).fold(self.own_hold, i64::max);
    }

    /// How many output tokens `available` nano-USD covers beside this request's input (all
    /// choices together), for a refusal's message; with fallbacks, what it covers of the dearest.
    pub fn output_covered(&self, routing: &Routing, available: i64) -> u64 {
        let available = available.saturating_sub(self.fixed_nanos);
        let own = routing.prices.output_within(&self.model, self.input.tokens(), available).unwrap_or(0) / self.choices.max(1);
        self.fallbacks.iter().map(|f| f.output_covered(routing, available.saturating_add(f.fixed_nanos))).fold(own, u64::min)
    }

    /// The most output tokens it may be held for, its fallbacks' included (all choices together).
    pub fn most_output(&self) -> u64 {
        self.fallbacks.iter().map(|f| f.output_allowance).fold(self.output_allowance, u64::max)
    }

    /// Charge `nanos` with the call whatever its answer (held with it).
    pub fn add_fixed(&mut self, nanos: i64) {
        if nanos == 0 {
            return;
        }
        self.fixed_nanos = self.fixed_nanos.saturating_add(nanos);
        self.own_hold = self.own_hold.saturating_add(nanos);
        for fallback in &mut self.fallbacks {
            fallback.add_fixed(nanos);
        }
        self.held();
    }

    /// The turn continues a stored conversation of `context_tokens` (its recorded input and
    /// output): the upstream counts them again as input, so they are held (and estimated) too.
    pub fn continues(&mut self, routing: &Routing, route: &Route, context_tokens: u64) -> Result<(), ApiError> {
        if !route.billed() || self.media.is_some() {
            return Ok(());
        }
        self.input.referenced_tokens = context_tokens;
        // The conversation is stored with one provider: it serves the turn, no other model.
        self.fallbacks.clear();
        self.own_hold = hold_cost(routing, &self.model, self.input, self.output_allowance)?.saturating_add(self.fixed_nanos);
        self.held();
        Ok(())
    }
}
