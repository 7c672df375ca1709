//! Method + path → [`Route`]. Pure: no I/O, no configuration.
//!
//! Root aliases (`/chat/completions`, …) map to the same routes as their `/v1` forms, and
//! `/v1/models/{m}:generateContent` (the google-genai SDK's default) maps like `/v1beta/…`.

use crate::config::Protocol;

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    ChatCompletions,
    Responses,
    Embeddings,
    Messages,
    GenerateContent {
        model: String,
        stream: bool,
    },
    /// `GET /v1/models`: chat-completions shape, or messages shape with a version header.
    Models,
    /// `GET /v1beta/models`
    GeminiModels,
    /// `GET /v1beta/models/{model}`
    GeminiModel {
        model: String,
    },
    Usage,
    /// `POST /v1/redeem`: a redemption code credited to the key's account.
    Redeem,
    /// `POST /payments/stripe/webhook`: Stripe's events (signed, no key).
    StripeWebhook,
    /// Claude Code's gateway sign-in (`identity.claude_code`).
    Signin(SigninOp),
    /// A messages call in Bedrock's or Vertex AI's format (`protocol::cloud_ingress`), the model
    /// in the path (`None`: Vertex's count-tokens, whose body names it).
    Ingress {
        ingress: crate::protocol::cloud_ingress::Ingress,
        model: Option<String>,
    },
    /// `GET /me`, the key holder's page (`file` ""), and its `app.js` and `app.css`: answered
    /// without a key.
    KeyPage {
        file: &'static str,
    },
    /// `GET /me/data`: the calling key's balance, windows, usage and last requests.
    KeyPageData,
    /// `POST /v1beta/models/{model}:embedContent` / `:batchEmbedContents` (also under `/v1/models/`).
    GeminiEmbed {
        model: String,
        batch: bool,
    },
    /// `POST /v1/messages/count_tokens`: relayed, rate-limited, not billed.
    CountTokens,
    /// `POST /v1beta/models/{model}:countTokens` (also under `/v1/models/`): relayed, not billed.
    GeminiCountTokens {
        model: String,
    },
    /// `GET /` and `HEAD /`: a reachability probe of the base URL (answered without a key).
    Root,
    /// A stored response (`/v1/responses/{id}`…): relayed to the provider that created it, for
    /// the key that created it only. Not billed.
    StoredResponse {
        id: String,
        op: ResponseOp,
    },
    /// `POST /v1/responses/input_tokens`: relayed, not billed.
    ResponsesInputTokens,
    /// `POST /v1/responses/compact`: relayed, billed from its usage.
    ResponsesCompact,
    /// `POST /v1/videos`; legacy: `/v1/video/generations`, `/v1/videos/generations`.
    VideoCreate {
        legacy: bool,
    },
    /// `GET /v1/videos/{id}`; legacy: `/v1/video/generations/{id}`.
    VideoGet {
        id: String,
        legacy: bool,
    },
    /// `GET /v1/videos/{id}/content`
    VideoContent {
        id: String,
    },
    /// `GET /v1/videos`: the key's own tasks, newest first, paged (`after`, `limit`).
    VideoList,
    /// `DELETE /v1/videos/{id}`: a finished task of the key's forgotten.
    VideoDelete {
        id: String,
    },
    /// `POST /v1/images/generations` (JSON), `/v1/images/edits`, `/v1/images/variations`
    /// (multipart).
    Images {
        op: ImageOp,
    },
    /// `POST /v1/audio/speech`: JSON in, audio out.
    Speech,
    /// `POST /v1/audio/transcriptions` and `/v1/audio/translations` (multipart upload).
    Transcription {
        translate: bool,
    },
    /// `POST /v1/moderations`
    Moderations,
    /// `GET /v1/realtime?model=…` with a WebSocket upgrade: a realtime session.
    Realtime,
    /// `/v1/files…`: the key's files.
    Files {
        op: FileOp,
    },
    /// `/v1/batches…`: the key's batch jobs.
    Batches {
        op: BatchOp,
    },
    /// `/mcp` (POST, DELETE; GET refused): the MCP servers of `mcp:` as one.
    Mcp,
    /// Nothing matched; the protocol says which error shape fits the path.
    NotFound {
        shape: Protocol,
    },
}

/// The endpoints of Claude Code's gateway protocol (version 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigninOp {
    /// `GET /.well-known/oauth-authorization-server`
    Metadata,
    /// `POST /oauth/device_authorization`
    DeviceAuthorization,
    /// `GET /device`: the approval page.
    DevicePage,
    /// `POST /device`: the code submitted; on to the identity provider.
    DeviceSubmit,
    /// `GET /oauth/callback`: back from the identity provider.
    Callback,
    /// `POST /oauth/token`: the device grant and the refresh grant.
    Token,
    /// `GET /managed/settings` (bearer).
    ManagedSettings,
    /// `POST /v1/logs`, `/v1/metrics`, `/v1/traces` (bearer): OTLP/HTTP exports.
    Telemetry(&'static str),
}

impl SigninOp {
    /// Whether it is answered without a key (the OAuth endpoints and the page).
    pub fn keyless(self) -> bool {
        !matches!(self, SigninOp::ManagedSettings | SigninOp::Telemetry(_))
    }
}

/// The gateway protocol's endpoint at `method` `path`, if it is one.
fn signin_op(method: &str, path: &str) -> Option<SigninOp> {
    Some(match (method, path) {
        ("GET", "/.well-known/oauth-authorization-server") => SigninOp::Metadata,
        ("POST", "/oauth/device_authorization") => SigninOp::DeviceAuthorization,
        ("GET", "/device") => SigninOp::DevicePage,
        ("POST", "/device") => SigninOp::DeviceSubmit,
        ("GET", "/oauth/callback") => SigninOp::Callback,
        ("POST", "/oauth/token") => SigninOp::Token,
        ("GET", "/managed/settings") => SigninOp::ManagedSettings,
        ("POST", "/v1/logs") => SigninOp::Telemetry("logs"),
        ("POST", "/v1/metrics") => SigninOp::Telemetry("metrics"),
        ("POST", "/v1/traces") => SigninOp::Telemetry("traces"),
        _ => return None,
    })
}

/// A Bedrock- or Vertex-format path: `POST /model/{id}/invoke[-with-response-stream]`,
/// `POST /v1/projects/{p}/locations/{l}/publishers/anthropic/models/{m}:rawPredict|:streamRawPredict`
/// (and Gemini's `…/publishers/google/models/{m}:generateContent|:streamGenerateContent`).
fn cloud_ingress(method: &str, path: &str) -> Option<Route> {
    use crate::protocol::cloud_ingress::Ingress;
    if let Some(rest) = path.strip_prefix("/model/") {
        let (id, op) = rest.rsplit_once('/')?;
        let ingress = match op {
            "invoke" => Ingress::BedrockInvoke { stream: false },
            "invoke-with-response-stream" => Ingress::BedrockInvoke { stream: true },
            "converse" => Ingress::BedrockConverse { stream: false },
            "converse-stream" => Ingress::BedrockConverse { stream: true },
            _ => return None,
        };
        let model = crate::base::text::decode_component(id);
        if method != "POST" || model.is_empty() || model.contains('/') {
            return Some(Route::NotFound { shape: Protocol::Anthropic });
        }
        return Some(Route::Ingress { ingress, model: Some(model) });
    }
    let rest = path.strip_prefix("/v1/projects/")?;
    let parts: Vec<&str> = rest.splitn(6, '/').collect();
    let [_project, "locations", _location, "publishers", publisher, tail] = parts.as_slice() else { return None };
    let (model, verb) = tail.strip_prefix("models/")?.split_once(':')?;
    let model = crate::base::text::decode_component(model);
    if method != "POST" || model.is_empty() || model.contains('/') {
        return Some(Route::NotFound { shape: Protocol::Anthropic });
    }
    Some(match (*publisher, verb) {
        ("anthropic", "rawPredict") if model == "count-tokens" => Route::Ingress { ingress: Ingress::VertexCountTokens, model: None },
        ("anthropic", "rawPredict") => Route::Ingress { ingress: Ingress::VertexRaw { stream: false }, model: Some(model) },
        ("anthropic", "streamRawPredict") => Route::Ingress { ingress: Ingress::VertexRaw { stream: true }, model: Some(model) },
        ("google", "generateContent") => Route::Ingress { ingress: Ingress::VertexGemini { stream: false }, model: Some(model) },
        ("google", "streamGenerateContent") => Route::Ingress { ingress: Ingress::VertexGemini { stream: true }, model: Some(model) },
        _ => Route::NotFound { shape: Protocol::Anthropic },
    })
}

/// What is done with a key's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOp {
    /// `POST /v1/files` (multipart).
    Upload,
    /// `GET /v1/files`
    List,
    /// `GET /v1/files/{id}`
    Get(String),
    /// `GET /v1/files/{id}/content`
    Content(String),
    /// `DELETE /v1/files/{id}`
    Delete(String),
}

/// What is done with a key's batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    /// `POST /v1/batches`
    Create,
    /// `GET /v1/batches`
    List,
    /// `GET /v1/batches/{id}`
    Get(String),
    /// `POST /v1/batches/{id}/cancel`
    Cancel(String),
}

/// What an images request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageOp {
    Generate,
    Edit,
    Variation,
}

/// What is done with a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseOp {
    /// `GET /v1/responses/{id}`
    Get,
    /// `DELETE /v1/responses/{id}`
    Delete,
    /// `POST /v1/responses/{id}/cancel`
    Cancel,
    /// `GET /v1/responses/{id}/input_items`
    InputItems,
}

impl Route {
    /// The protocol a relayed route speaks upstream (None for locally answered routes).
    pub fn relay_protocol(&self) -> Option<Protocol> {
        match self {
            Route::ChatCompletions
            | Route::Responses
            | Route::Embeddings
            | Route::StoredResponse { .. }
            | Route::ResponsesInputTokens
            | Route::ResponsesCompact
            | Route::Images { .. }
            | Route::Speech
            | Route::Transcription { .. }
            | Route::Moderations => Some(Protocol::Openai),
            Route::Messages | Route::CountTokens => Some(Protocol::Anthropic),
            Route::GenerateContent { .. } | Route::GeminiCountTokens { .. } | Route::GeminiEmbed { .. } => Some(Protocol::Gemini),
            _ => None,
        }
    }

    /// An embeddings route (and moderations, billed alike): its answer is vectors or scores,
    /// not generated tokens (output is 0 when the service reports no usage), and it is no
    /// conversation to keep on one provider.
    pub fn embeds(&self) -> bool {
        matches!(self, Route::Embeddings | Route::GeminiEmbed { .. } | Route::Moderations)
    }

    /// A route billed by what it makes (images, audio, seconds, characters) rather than by an
    /// output limit the upstream is told: see `billing::media`.
    pub fn media(&self) -> bool {
        matches!(self, Route::Images { .. } | Route::Speech | Route::Transcription { .. })
    }

    /// A route whose body is `multipart/form-data` (when the client sends it so).
    pub fn multipart(&self) -> bool {
        matches!(self, Route::Images { op: ImageOp::Edit | ImageOp::Variation } | Route::Transcription { .. })
    }

    /// Whether a relayed route is billed (token counting and reading stored responses are not).
    pub fn billed(&self) -> bool {
        !matches!(self, Route::CountTokens | Route::GeminiCountTokens { .. } | Route::ResponsesInputTokens | Route::StoredResponse { .. })
    }

    /// How the response of a relayed route reports usage.
    pub fn usage_shape(&self) -> Option<crate::billing::meter::Shape> {
        use crate::billing::meter::Shape;
        match self {
            Route::ChatCompletions => Some(Shape::Chat),
            Route::Responses | Route::ResponsesCompact => Some(Shape::Responses),
            Route::Embeddings | Route::Moderations => Some(Shape::Embeddings),
            Route::Images { .. } => Some(Shape::Images),
            Route::Speech => Some(Shape::Speech),
            Route::Transcription { .. } => Some(Shape::Transcription),
            Route::Messages => Some(Shape::Messages),
            Route::GenerateContent { .. } | Route::GeminiEmbed { .. } => Some(Shape::Gemini),
            _ => None,
        }
    }

    /// Stable label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Route::ChatCompletions => "chat_completions",
            Route::Responses => "responses",
            Route::Embeddings => "embeddings",
            Route::Messages => "messages",
            Route::GenerateContent { stream: false, .. } => "generate_content",
            Route::GenerateContent { stream: true, .. } => "stream_generate_content",
            Route::Models => "models",
            Route::GeminiModels => "gemini_models",
            Route::GeminiModel { .. } => "gemini_model",
            Route::Usage => "usage",
            Route::Redeem => "redeem",
            Route::StripeWebhook => "stripe_webhook",
            Route::Ingress { ingress, .. } => ingress.label(),
            Route::Signin(op) => match op {
                SigninOp::Metadata => "signin_metadata",
                SigninOp::DeviceAuthorization => "signin_device_authorization",
                SigninOp::DevicePage | SigninOp::DeviceSubmit => "signin_device",
                SigninOp::Callback => "signin_callback",
                SigninOp::Token => "signin_token",
                SigninOp::ManagedSettings => "managed_settings",
                SigninOp::Telemetry(_) => "telemetry",
            },
            Route::KeyPage { .. } => "key_page",
            Route::KeyPageData => "key_page_data",
            Route::CountTokens => "count_tokens",
            Route::GeminiCountTokens { .. } => "gemini_count_tokens",
            Route::GeminiEmbed { batch: false, .. } => "embed_content",
            Route::GeminiEmbed { batch: true, .. } => "batch_embed_contents",
            Route::Root => "root",
            Route::StoredResponse { op: ResponseOp::Get, .. } => "response_get",
            Route::StoredResponse { op: ResponseOp::Delete, .. } => "response_delete",
            Route::StoredResponse { op: ResponseOp::Cancel, .. } => "response_cancel",
            Route::StoredResponse { op: ResponseOp::InputItems, .. } => "response_input_items",
            Route::ResponsesInputTokens => "responses_input_tokens",
            Route::ResponsesCompact => "responses_compact",
            Route::VideoCreate { .. } => "video_create",
            Route::VideoGet { .. } => "video_get",
            Route::VideoContent { .. } => "video_content",
            Route::VideoList => "video_list",
            Route::VideoDelete { .. } => "video_delete",
            Route::Images { op: ImageOp::Generate } => "image_generation",
            Route::Images { op: ImageOp::Edit } => "image_edit",
            Route::Images { op: ImageOp::Variation } => "image_variation",
            Route::Speech => "speech",
            Route::Transcription { translate: false } => "transcription",
            Route::Transcription { translate: true } => "translation",
            Route::Moderations => "moderations",
            Route::Realtime => "realtime",
            Route::Files { op: FileOp::Upload } => "file_upload",
            Route::Files { op: FileOp::List } => "file_list",
            Route::Files { op: FileOp::Get(_) } => "file_get",
            Route::Files { op: FileOp::Content(_) } => "file_content",
            Route::Files { op: FileOp::Delete(_) } => "file_delete",
            Route::Batches { op: BatchOp::Create } => "batch_create",
            Route::Batches { op: BatchOp::List } => "batch_list",
            Route::Batches { op: BatchOp::Get(_) } => "batch_get",
            Route::Batches { op: BatchOp::Cancel(_) } => "batch_cancel",
            Route::Mcp => "mcp",
            Route::NotFound { .. } => "not_found",
        }
    }
}

/// The error shape for a path nobody serves.
fn shape_for(path: &str) -> Protocol {
    if path.starts_with("/v1beta/") || path.contains(":generateContent") || path.contains(":streamGenerateContent") {
        Protocol::Gemini
    } else if path.starts_with("/v1/messages") || path.starts_with("/messages") {
        Protocol::Anthropic
    } else {
        Protocol::Openai
    }
}

/// Classify a request. `path` excludes the query string.
pub fn classify(method: &str, path: &str) -> Route {
    let not_found = || Route::NotFound { shape: shape_for(path) };
    let trimmed = if path.len() > 1 { path.trim_end_matches('/') } else { path };
    // Root aliases are the /v1 paths without the prefix.
    let v1 = trimmed.strip_prefix("/v1").filter(|rest| rest.starts_with('/'));
    let rest = v1.unwrap_or(trimmed);

    if let Some(op) = signin_op(method, trimmed) {
        return Route::Signin(op);
    }
    if let Some(route) = cloud_ingress(method, trimmed) {
        return route;
    }
    if trimmed == "/payments/stripe/webhook" {
        return if method == "POST" { Route::StripeWebhook } else { not_found() };
    }
    if let Some(after) = trimmed.strip_prefix("/v1beta/models") {
        return gemini_models(method, after).unwrap_or_else(not_found);
    }
    if let Some(after) = rest.strip_prefix("/models/") {
        // `/v1/models/{m}:generateContent` — the google-genai default API version.
        if let Some(route) = generate_content(method, after) {
            return route;
        }
        return not_found();
    }
    if let Some(route) = video(method, rest) {
        return route;
    }
    if let Some(route) = files(method, rest) {
        return route;
    }
    if let Some(route) = batches(method, rest) {
        return route;
    }
    if let Some(tail) = rest.strip_prefix("/responses/") {
        return responses(method, tail).unwrap_or_else(not_found);
    }
    match (method, rest) {
        ("POST", "/chat/completions") => Route::ChatCompletions,
        ("POST", "/responses") => Route::Responses,
        ("POST", "/embeddings") => Route::Embeddings,
        ("POST", "/images/generations") => Route::Images { op: ImageOp::Generate },
        ("POST", "/images/edits") => Route::Images { op: ImageOp::Edit },
        ("POST", "/images/variations") => Route::Images { op: ImageOp::Variation },
        ("POST", "/audio/speech") => Route::Speech,
        ("POST", "/audio/transcriptions") => Route::Transcription { translate: false },
        ("POST", "/audio/translations") => Route::Transcription { translate: true },
        ("POST", "/moderations") => Route::Moderations,
        ("GET", "/realtime") => Route::Realtime,
        ("POST", "/messages") => Route::Messages,
        ("POST", "/messages/count_tokens") => Route::CountTokens,
        ("GET", "/models") => Route::Models,
        ("GET", "/usage") => Route::Usage,
        ("POST", "/redeem") => Route::Redeem,
        ("GET" | "HEAD", "/") if v1.is_none() => Route::Root,
        ("GET", "/me") if v1.is_none() => Route::KeyPage { file: "" },
        ("GET", "/me/app.js") if v1.is_none() => Route::KeyPage { file: "app.js" },
        ("GET", "/me/app.css") if v1.is_none() => Route::KeyPage { file: "app.css" },
        ("GET", "/me/data") if v1.is_none() => Route::KeyPageData,
        (_, "/mcp") if v1.is_none() => Route::Mcp,
        _ => not_found(),
    }
}

/// Video task paths (`rest` is the path without `/v1`).
fn video(method: &str, rest: &str) -> Option<Route> {
    let id_ok = |id: &str| !id.is_empty() && !id.contains('/') && id != "generations";
    match method {
        "POST" => match rest {
            "/videos" => Some(Route::VideoCreate { legacy: false }),
            "/video/generations" | "/videos/generations" => Some(Route::VideoCreate { legacy: true }),
            _ => None,
        },
        "GET" if rest == "/videos" => Some(Route::VideoList),
        "DELETE" => rest.strip_prefix("/videos/").filter(|id| id_ok(id)).map(|id| Route::VideoDelete { id: id.to_string() }),
        "GET" => {
            if let Some(id) = rest.strip_prefix("/video/generations/") {
                return id_ok(id).then(|| Route::VideoGet { id: id.to_string(), legacy: true });
            }
            let tail = rest.strip_prefix("/videos/")?;
            if let Some(id) = tail.strip_suffix("/content") {
                return id_ok(id).then(|| Route::VideoContent { id: id.to_string() });
            }
            id_ok(tail).then(|| Route::VideoGet { id: tail.to_string(), legacy: false })
        }
        _ => None,
    }
}

/// `/files` and below (`rest` is the path without `/v1`).
fn files(method: &str, rest: &str) -> Option<Route> {
    let op = match (method, rest) {
        ("POST", "/files") => FileOp::Upload,
        ("GET", "/files") => FileOp::List,
        _ => {
            let tail = rest.strip_prefix("/files/")?;
            let ok = |id: &str| !id.is_empty() && !id.contains('/');
            match (method, tail.strip_suffix("/content")) {
                ("GET", Some(id)) if ok(id) => FileOp::Content(id.to_string()),
                ("GET", None) if ok(tail) => FileOp::Get(tail.to_string()),
                ("DELETE", None) if ok(tail) => FileOp::Delete(tail.to_string()),
                _ => return None,
            }
        }
    };
    Some(Route::Files { op })
}

/// `/batches` and below (`rest` is the path without `/v1`).
fn batches(method: &str, rest: &str) -> Option<Route> {
    let ok = |id: &str| !id.is_empty() && !id.contains('/');
    let op = match (method, rest) {
        ("POST", "/batches") => BatchOp::Create,
        ("GET", "/batches") => BatchOp::List,
        _ => {
            let tail = rest.strip_prefix("/batches/")?;
            match (method, tail.strip_suffix("/cancel")) {
                ("POST", Some(id)) if ok(id) => BatchOp::Cancel(id.to_string()),
                ("GET", None) if ok(tail) => BatchOp::Get(tail.to_string()),
                _ => return None,
            }
        }
    };
    Some(Route::Batches { op })
}

/// The Responses API's paths below `/responses/` (`tail` is what follows it).
fn responses(method: &str, tail: &str) -> Option<Route> {
    let stored = |id: &str, op| (!id.is_empty() && !id.contains('/')).then(|| Route::StoredResponse { id: id.to_string(), op });
    match (method, tail) {
        ("POST", "input_tokens") => Some(Route::ResponsesInputTokens),
        ("POST", "compact") => Some(Route::ResponsesCompact),
        ("POST", _) => stored(tail.strip_suffix("/cancel")?, ResponseOp::Cancel),
        ("GET", _) => match tail.strip_suffix("/input_items") {
            Some(id) => stored(id, ResponseOp::InputItems),
            None => stored(tail, ResponseOp::Get),
        },
        ("DELETE", _) => stored(tail, ResponseOp::Delete),
        _ => None,
    }
}

/// `after` is what follows `/v1beta/models`.
fn gemini_models(method: &str, after: &str) -> Option<Route> {
    if after.is_empty() {
        return (method == "GET").then_some(Route::GeminiModels);
    }
    let name = after.strip_prefix('/')?;
    if let Some(route) = generate_content(method, name) {
        return Some(route);
    }
    if method == "GET" && !name.is_empty() && !name.contains('/') && !name.contains(':') {
        return Some(Route::GeminiModel { model: name.to_string() });
    }
    None
}

/// `name` is `{model}:{action}` (read by the generate-content protocol module).
fn generate_content(method: &str, name: &str) -> Option<Route> {
    if method != "POST" {
        return None;
    }
    let plain = |m: &&str| !m.is_empty() && !m.contains('/') && !m.contains(':');
    if let Some(model) = name.strip_suffix(":countTokens").filter(plain) {
        return Some(Route::GeminiCountTokens { model: model.to_string() });
    }
    if let Some(model) = name.strip_suffix(":embedContent").filter(plain) {
        return Some(Route::GeminiEmbed { model: model.to_string(), batch: false });
    }
    if let Some(model) = name.strip_suffix(":batchEmbedContents").filter(plain) {
        return Some(Route::GeminiEmbed { model: model.to_string(), batch: true });
    }
    let (model, stream) = crate::protocol::gemini::model_and_action(name)?;
    Some(Route::GenerateContent { model: model.to_string(), stream })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_and_root_aliases() {
        for (p, r) in [
            ("/v1/chat/completions", Route::ChatCompletions),
            ("/chat/completions", Route::ChatCompletions),
            ("/v1/responses", Route::Responses),
            ("/responses", Route::Responses),
            ("/v1/embeddings", Route::Embeddings),
            ("/embeddings", Route::Embeddings),
            ("/v1/messages", Route::Messages),
            ("/messages", Route::Messages),
        ] {
            assert_eq!(classify("POST", p), r, "{p}");
        }
        assert_eq!(classify("GET", "/v1/models"), Route::Models);
        assert_eq!(classify("GET", "/models"), Route::Models);
        assert_eq!(classify("GET", "/v1/usage"), Route::Usage);
        assert_eq!(classify("GET", "/usage"), Route::Usage);
        assert_eq!(classify("POST", "/v1/redeem"), Route::Redeem);
        assert_eq!(classify("POST", "/payments/stripe/webhook"), Route::StripeWebhook);
        assert_eq!(classify("GET", "/.well-known/oauth-authorization-server"), Route::Signin(SigninOp::Metadata));
        assert_eq!(classify("POST", "/oauth/token"), Route::Signin(SigninOp::Token));
        assert_eq!(classify("POST", "/device"), Route::Signin(SigninOp::DeviceSubmit));
        assert_eq!(classify("POST", "/v1/logs"), Route::Signin(SigninOp::Telemetry("logs")));
        use crate::protocol::cloud_ingress::Ingress;
        assert_eq!(
            classify("POST", "/model/us.anthropic.claude-x-v1%3A0/invoke-with-response-stream"),
            Route::Ingress { ingress: Ingress::BedrockInvoke { stream: true }, model: Some("us.anthropic.claude-x-v1:0".into()) }
        );
        assert_eq!(
            classify("POST", "/model/m/invoke"),
            Route::Ingress { ingress: Ingress::BedrockInvoke { stream: false }, model: Some("m".into()) }
        );
        assert_eq!(classify("GET", "/model/m/invoke"), Route::NotFound { shape: Protocol::Anthropic });
        assert_eq!(
            classify("POST", "/model/m/converse-stream"),
            Route::Ingress { ingress: Ingress::BedrockConverse { stream: true }, model: Some("m".into()) }
        );
        let vertex = "/v1/projects/p1/locations/us-east5/publishers";
        assert_eq!(
            classify("POST", &format!("{vertex}/anthropic/models/claude-x@2025:streamRawPredict")),
            Route::Ingress { ingress: Ingress::VertexRaw { stream: true }, model: Some("claude-x@2025".into()) }
        );
        assert_eq!(
            classify("POST", &format!("{vertex}/anthropic/models/count-tokens:rawPredict")),
            Route::Ingress { ingress: Ingress::VertexCountTokens, model: None }
        );
        assert_eq!(
            classify("POST", &format!("{vertex}/google/models/g:streamGenerateContent")),
            Route::Ingress { ingress: Ingress::VertexGemini { stream: true }, model: Some("g".into()) }
        );
        assert_eq!(classify("POST", &format!("{vertex}/meta/models/g:rawPredict")), Route::NotFound { shape: Protocol::Anthropic });
        assert!(!SigninOp::ManagedSettings.keyless() && SigninOp::Token.keyless());
        assert_eq!(classify("GET", "/payments/stripe/webhook"), Route::NotFound { shape: Protocol::Openai });
        assert_eq!(classify("GET", "/v1/redeem"), Route::NotFound { shape: Protocol::Openai });
        assert_eq!(classify("GET", "/me"), Route::KeyPage { file: "" });
        assert_eq!(classify("GET", "/me/app.js"), Route::KeyPage { file: "app.js" });
        assert_eq!(classify("GET", "/me/data"), Route::KeyPageData);
        assert!(matches!(classify("GET", "/v1/me"), Route::NotFound { .. }));
        assert!(matches!(classify("POST", "/me/data"), Route::NotFound { .. }));
        assert_eq!(classify("GET", "/v1/models/"), Route::Models);
    }

    #[test]
    fn generate_content_paths() {
        let g = |m: &str, s| Route::GenerateContent { model: m.into(), stream: s };
        assert_eq!(classify("POST", "/v1beta/models/gamma-3.5-flash:generateContent"), g("gamma-3.5-flash", false));
        assert_eq!(classify("POST", "/v1beta/models/gamma-3.5-flash:streamGenerateContent"), g("gamma-3.5-flash", true));
        assert_eq!(classify("POST", "/v1/models/gamma-3.5-flash:generateContent"), g("gamma-3.5-flash", false));
        assert_eq!(classify("POST", "/v1/models/gamma-3.5-flash:streamGenerateContent"), g("gamma-3.5-flash", true));
        let count = |m: &str| Route::GeminiCountTokens { model: m.into() };
        assert_eq!(classify("POST", "/v1beta/models/gamma:countTokens"), count("gamma"));
        assert_eq!(classify("POST", "/v1/models/gamma:countTokens"), count("gamma"));
        assert_eq!(classify("POST", "/v1/messages/count_tokens"), Route::CountTokens);
        assert_eq!(classify("POST", "/messages/count_tokens"), Route::CountTokens);
        assert!(!Route::CountTokens.billed() && !count("g").billed() && Route::Messages.billed());
        assert_eq!(classify("POST", "/v1beta/models/gamma:embedContent"), Route::GeminiEmbed { model: "gamma".into(), batch: false });
        assert_eq!(classify("POST", "/v1/models/gamma:batchEmbedContents"), Route::GeminiEmbed { model: "gamma".into(), batch: true });
        assert!(Route::GeminiEmbed { model: "g".into(), batch: true }.embeds() && Route::Embeddings.embeds() && !Route::Messages.embeds());
        assert_eq!(classify("GET", "/v1beta/models/gamma:generateContent"), Route::NotFound { shape: Protocol::Gemini });
    }

    #[test]
    fn gemini_model_list_and_single() {
        assert_eq!(classify("GET", "/v1beta/models"), Route::GeminiModels);
        assert_eq!(classify("GET", "/v1beta/models/gamma-3.5-flash"), Route::GeminiModel { model: "gamma-3.5-flash".into() });
        assert_eq!(classify("POST", "/v1beta/models"), Route::NotFound { shape: Protocol::Gemini });
    }

    #[test]
    fn unknown_paths_pick_a_fitting_shape() {
        assert_eq!(classify("GET", "/v1/nothing"), Route::NotFound { shape: Protocol::Openai });
        assert_eq!(classify("GET", "/v1/chat/completions"), Route::NotFound { shape: Protocol::Openai });
        assert_eq!(classify("GET", "/v1/messages/batches"), Route::NotFound { shape: Protocol::Anthropic });
        assert_eq!(classify("GET", "/v1beta/files"), Route::NotFound { shape: Protocol::Gemini });
        assert_eq!(classify("POST", "/v1x/chat/completions"), Route::NotFound { shape: Protocol::Openai });
        assert_eq!(classify("POST", "/"), Route::NotFound { shape: Protocol::Openai });
    }

    #[test]
    fn video_paths() {
        assert_eq!(classify("POST", "/v1/videos"), Route::VideoCreate { legacy: false });
        assert_eq!(classify("POST", "/v1/video/generations"), Route::VideoCreate { legacy: true });
        assert_eq!(classify("POST", "/v1/videos/generations"), Route::VideoCreate { legacy: true });
        assert_eq!(classify("GET", "/v1/videos/task_abc"), Route::VideoGet { id: "task_abc".into(), legacy: false });
        assert_eq!(classify("GET", "/v1/video/generations/task_abc"), Route::VideoGet { id: "task_abc".into(), legacy: true });
        assert_eq!(classify("GET", "/v1/videos/task_abc/content"), Route::VideoContent { id: "task_abc".into() });
        assert_eq!(classify("GET", "/v1/videos/a/b"), Route::NotFound { shape: Protocol::Openai });
        assert_eq!(classify("DELETE", "/v1/videos/task_abc"), Route::VideoDelete { id: "task_abc".into() });
        assert_eq!(classify("DELETE", "/v1/videos/a/b"), Route::NotFound { shape: Protocol::Openai });
        assert_eq!(classify("GET", "/v1/videos"), Route::VideoList);
        assert_eq!(classify("GET", "/videos"), Route::VideoList);
    }

    #[test]
    fn the_root_is_a_probe_for_get_and_head_only() {
        assert_eq!(classify("GET", "/"), Route::Root);
        assert_eq!(classify("HEAD", "/"), Route::Root);
        assert!(matches!(classify("POST", "/"), Route::NotFound { .. }));
        assert!(matches!(classify("GET", "/v1/"), Route::NotFound { .. }));
    }

    #[test]
    fn responses_paths() {
        let stored = |id: &str, op| Route::StoredResponse { id: id.into(), op };
        assert_eq!(classify("GET", "/v1/responses/resp_1"), stored("resp_1", ResponseOp::Get));
        assert_eq!(classify("DELETE", "/v1/responses/resp_1"), stored("resp_1", ResponseOp::Delete));
        assert_eq!(classify("POST", "/v1/responses/resp_1/cancel"), stored("resp_1", ResponseOp::Cancel));
        assert_eq!(classify("GET", "/v1/responses/resp_1/input_items"), stored("resp_1", ResponseOp::InputItems));
        assert_eq!(classify("GET", "/responses/resp_1"), stored("resp_1", ResponseOp::Get));
        assert_eq!(classify("POST", "/v1/responses/input_tokens"), Route::ResponsesInputTokens);
        assert_eq!(classify("POST", "/v1/responses/compact"), Route::ResponsesCompact);
        for (m, p) in
            [("POST", "/v1/responses/resp_1"), ("GET", "/v1/responses/a/b"), ("PUT", "/v1/responses/r"), ("POST", "/v1/responses//cancel")]
        {
            assert_eq!(classify(m, p), Route::NotFound { shape: Protocol::Openai }, "{m} {p}");
        }
        assert!(!stored("r", ResponseOp::Get).billed() && !Route::ResponsesInputTokens.billed() && Route::ResponsesCompact.billed());
        assert_eq!(Route::ResponsesCompact.usage_shape(), Some(crate::billing::meter::Shape::Responses));
        assert_eq!(stored("r", ResponseOp::Cancel).relay_protocol(), Some(Protocol::Openai));
    }

    #[test]
    fn media_paths() {
        for (p, r) in [
            ("/v1/images/generations", Route::Images { op: ImageOp::Generate }),
            ("/v1/images/edits", Route::Images { op: ImageOp::Edit }),
            ("/images/variations", Route::Images { op: ImageOp::Variation }),
            ("/v1/audio/speech", Route::Speech),
            ("/v1/audio/transcriptions", Route::Transcription { translate: false }),
            ("/audio/translations", Route::Transcription { translate: true }),
            ("/v1/moderations", Route::Moderations),
        ] {
            assert_eq!(classify("POST", p), r, "{p}");
            assert_eq!(r.relay_protocol(), Some(Protocol::Openai), "{p}");
            assert!(r.billed(), "{p}");
            assert!(!matches!(classify("GET", p), Route::Images { .. } | Route::Speech | Route::Transcription { .. } | Route::Moderations));
        }
        assert!(Route::Moderations.embeds() && !Route::Moderations.media() && Route::Speech.media());
        assert!(Route::Transcription { translate: true }.multipart() && !Route::Images { op: ImageOp::Generate }.multipart());
        assert_eq!(classify("POST", "/v1/files"), Route::Files { op: FileOp::Upload });
        assert_eq!(classify("GET", "/v1/files"), Route::Files { op: FileOp::List });
        assert_eq!(classify("GET", "/v1/files/file-1"), Route::Files { op: FileOp::Get("file-1".into()) });
        assert_eq!(classify("GET", "/v1/files/file-1/content"), Route::Files { op: FileOp::Content("file-1".into()) });
        assert_eq!(classify("DELETE", "/v1/files/file-1"), Route::Files { op: FileOp::Delete("file-1".into()) });
        assert_eq!(classify("POST", "/v1/batches"), Route::Batches { op: BatchOp::Create });
        assert_eq!(classify("GET", "/batches"), Route::Batches { op: BatchOp::List });
        assert_eq!(classify("GET", "/v1/batches/batch_1"), Route::Batches { op: BatchOp::Get("batch_1".into()) });
        assert_eq!(classify("POST", "/v1/batches/batch_1/cancel"), Route::Batches { op: BatchOp::Cancel("batch_1".into()) });
        assert!(matches!(classify("DELETE", "/v1/batches/batch_1"), Route::NotFound { .. }));
        assert!(matches!(classify("GET", "/v1/batches/a/b"), Route::NotFound { .. }));
        assert!(matches!(classify("GET", "/v1/files/a/b"), Route::NotFound { .. }));
        assert!(matches!(classify("PUT", "/v1/files"), Route::NotFound { .. }));
    }

    #[test]
    fn relay_protocols() {
        assert_eq!(Route::Embeddings.relay_protocol(), Some(Protocol::Openai));
        assert_eq!(Route::Messages.relay_protocol(), Some(Protocol::Anthropic));
        assert_eq!(Route::Models.relay_protocol(), None);
    }
}
