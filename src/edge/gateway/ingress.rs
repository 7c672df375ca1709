//! A messages call that came in Bedrock's or Vertex AI's format (`protocol::cloud_ingress`):
//! its body and path made the messages protocol's — the model its path names, mapped from a provider's
//! own id (`models: [{name, upstream}]`) to the name clients call it by, Bedrock's
//! `anthropic_beta` body field sent as the `anthropic-beta` header, a Converse request
//! translated — and a Bedrock answer reshaped (`edge::framing`). Everything after is a messages call's: the same checks,
//! holds, relay and bill.

use crate::protocol::cloud_ingress::{to_messages, Ingress};
use crate::protocol::response::LocalResponse;
use crate::protocol::ApiError;
use crate::upstream::Routing;
use bytes::Bytes;
use pingora_proxy::Session;

pub(super) fn messages_body(
    session: &mut Session,
    routing: &Routing,
    ingress: Ingress,
    model: Option<&str>,
    body: &[u8],
) -> Result<Bytes, ApiError> {
    // The model was mapped to the name clients call it by when the request was admitted.
    let model = model.map(str::to_string);
    if let Ingress::VertexGemini { stream } = ingress {
        // A generate-content call as it is, relayed by the generate-content path.
        let verb = if stream { "streamGenerateContent" } else { "generateContent" };
        let query = session.req_header().uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        let path = format!("/v1beta/models/{}:{verb}{query}", crate::base::text::encode_component(model.as_deref().unwrap_or_default()));
        match path.parse::<http::Uri>() {
            Ok(uri) => session.req_header_mut().set_uri(uri),
            Err(_) => return Err(ApiError::new(crate::protocol::ErrorKind::BadRequest, "The model in the path is not a model name.")),
        }
        return Ok(Bytes::copy_from_slice(body));
    }
    let (body, betas) = match ingress {
        Ingress::BedrockInvoke { stream } | Ingress::VertexRaw { stream } => to_messages(body, model.as_deref(), Some(stream))?,
        Ingress::VertexCountTokens => to_messages(body, None, None)?,
        Ingress::BedrockConverse { stream } => {
            (crate::protocol::converse::to_messages(body, model.as_deref().unwrap_or_default(), stream)?, Vec::new())
        }
        Ingress::VertexGemini { .. } => return Ok(Bytes::copy_from_slice(body)),
    };
    if !betas.is_empty() && crate::protocol::header_str(session.req_header(), "anthropic-beta").is_none() {
        if let Err(e) = session.req_header_mut().insert_header("anthropic-beta", betas.join(",")) {
            log::debug!("bedrock ingress: anthropic_beta not carried: {e}");
        }
    }
    // Relayed as the messages call it is (the upstream path is the client's, for a native relay).
    let path = if ingress == Ingress::VertexCountTokens { "/v1/messages/count_tokens" } else { "/v1/messages" };
    session.req_header_mut().set_uri(http::Uri::from_static(path));
    if let Some(reshape) = ingress.reshape() {
        crate::edge::framing::activate(session, reshape, routing.max_event_bytes);
    }
    Ok(body)
}

/// A refusal of a Bedrock-format call in Bedrock's error shape: `{"message"}` and the
/// `x-amzn-ErrorType` the AWS SDKs read the error's code from (the status is tollgate's).
pub(super) fn bedrock_refusal(err: &ApiError) -> LocalResponse {
    let status = err.status();
    let kind = match status {
        401 => "UnrecognizedClientException",
        402 | 403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        429 => "ThrottlingException",
        503 => "ServiceUnavailableException",
        s if s >= 500 => "InternalServerException",
        _ => "ValidationException",
    };
    let mut r = LocalResponse::json(status, &serde_json::json!({"message": err.message}));
    r.headers.push(("x-amzn-errortype", kind.to_string()));
    if let Some(secs) = err.retry_after {
        r.headers.push(("retry-after", secs.to_string()));
    }
    r
}
