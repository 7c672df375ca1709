//! The clouds' side of the mock: AWS Bedrock, Google Vertex AI and Azure OpenAI, checking
//! what those services check.
//!
//! * Bedrock: `POST …/model/{id}/invoke` and `…/invoke-with-response-stream`. The SigV4
//!   signature is recomputed from the request (its signed headers, its body) with the mock's
//!   secret and compared; a date more than 5 minutes off the mock's clock is refused 403 as AWS
//!   refuses it (the answer's `Date` is the mock's clock). The
//!   body must carry `anthropic_version: bedrock-2023-05-31` and no `model` or `stream`. A
//!   stream is sent as event-stream frames (`chunk` events, `bytes` the base64 of each
//!   messages event, `amazon-bedrock-invocationMetrics` on `message_stop`);
//!   `x-mock-bedrock-exception: N` ends it after N events with a `modelStreamErrorException`.
//!   Errors are Bedrock's: `{"message": …}` with `x-amzn-ErrorType`.
//! * Vertex: `…/projects/{p}/locations/{l}/publishers/google/models/{m}:generateContent` (and
//!   `streamGenerateContent`, `countTokens`), `…/publishers/anthropic/models/{m}:rawPredict` (and
//!   `streamRawPredict`, whose body must carry `anthropic_version: vertex-2023-10-16` and no
//!   `model`), with a bearer token the mock's token endpoint issued. The token endpoint
//!   (`POST …/token`, JWT-bearer grant) verifies the assertion's RS256 signature with the
//!   service account's public key (`--google-public-key`), its issuer, audience, scope and
//!   expiry.
//! * Azure: `…/openai/deployments/{d}/chat/completions?api-version=…` (and `embeddings`),
//!   `…/openai/responses?api-version=…` and the v1 API (`…/openai/v1/…`), with `api-key` (one
//!   of `--key`) or a bearer token from the Entra token endpoint
//!   (`POST …/{tenant}/oauth2/v2.0/token`, client credentials, `--entra-client-secret`).
//!
//! * Bedrock Guardrails: `POST …/guardrail/{id}/version/{v}/apply` (`ApplyGuardrail`), SigV4
//!   checked as above; each content block holding `[[flag]]` is blocked by the content
//!   policy (`VIOLENCE`), an email address in one is anonymized (`{EMAIL}`, `outputs` one per
//!   block); guardrail id `missing` is not found (404).
//!
//! Tokens live `--token-lifetime-secs`; `POST /__mock/token_fail?n=N` makes the next N token
//! requests fail 500; `GET /__mock/tokens` lists the token requests seen.

use crate::wire::Kind;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine;
use pingora_http::RequestHeader;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// A request to one of the clouds' model endpoints.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CloudCall {
    Bedrock {
        model: String,
        stream: bool,
    },
    /// `Converse` / `ConverseStream`.
    Converse {
        model: String,
        stream: bool,
    },
    VertexGoogle {
        model: String,
        stream: bool,
        count: bool,
    },
    VertexAnthropic {
        model: String,
        stream: bool,
    },
    /// `deployment` None: the v1 API (the model in the body) or the responses API.
    Azure {
        deployment: Option<String>,
        kind: Kind,
    },
}

impl CloudCall {
    /// The protocol the request is in.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            CloudCall::Bedrock { .. } | CloudCall::Converse { .. } | CloudCall::VertexAnthropic { .. } => Kind::Messages,
            CloudCall::VertexGoogle { stream, .. } => Kind::Generate { stream: *stream },
            CloudCall::Azure { kind, .. } => *kind,
        }
    }

    /// The model the path names.
    pub(crate) fn model(&self) -> Option<String> {
        match self {
            CloudCall::Bedrock { model, .. }
            | CloudCall::Converse { model, .. }
            | CloudCall::VertexGoogle { model, .. }
            | CloudCall::VertexAnthropic { model, .. } => Some(model.clone()),
            CloudCall::Azure { deployment, .. } => deployment.clone(),
        }
    }

    /// Whether the path asks for a stream (None: the body says).
    pub(crate) fn stream(&self) -> Option<bool> {
        match self {
            CloudCall::Bedrock { stream, .. }
            | CloudCall::Converse { stream, .. }
            | CloudCall::VertexAnthropic { stream, .. }
            | CloudCall::VertexGoogle { stream, .. } => Some(*stream),
            CloudCall::Azure { .. } => None,
        }
    }

    /// Token counting (Vertex's `countTokens`).
    pub(crate) fn counts(&self) -> bool {
        matches!(self, CloudCall::VertexGoogle { count: true, .. })
    }
}

/// The cloud endpoint a path names, if any.
pub(crate) fn classify(path: &str, query: Option<&str>) -> Option<CloudCall> {
    if let Some((_, rest)) = path.split_once("/model/") {
        let (id, action) = rest.rsplit_once('/')?;
        let model = tollgate::base::text::decode_component(id);
        return match action {
            "invoke" => Some(CloudCall::Bedrock { model, stream: false }),
            "invoke-with-response-stream" => Some(CloudCall::Bedrock { model, stream: true }),
            "converse" => Some(CloudCall::Converse { model, stream: false }),
            "converse-stream" => Some(CloudCall::Converse { model, stream: true }),
            _ => None,
        };
    }
    if let Some((_, rest)) = path.split_once("/publishers/") {
        let (publisher, rest) = rest.split_once("/models/")?;
        let (model, method) = rest.split_once(':')?;
        let model = model.to_string();
        return match (publisher, method) {
            ("google", "generateContent") => Some(CloudCall::VertexGoogle { model, stream: false, count: false }),
            ("google", "streamGenerateContent") => Some(CloudCall::VertexGoogle { model, stream: true, count: false }),
            ("google", "countTokens") => Some(CloudCall::VertexGoogle { model, stream: false, count: true }),
            ("anthropic", "rawPredict") => Some(CloudCall::VertexAnthropic { model, stream: false }),
            ("anthropic", "streamRawPredict") => Some(CloudCall::VertexAnthropic { model, stream: true }),
            _ => None,
        };
    }
    let versioned = query.is_some_and(|q| q.split('&').any(|p| p.starts_with("api-version=") && p.len() > 12));
    if let Some((_, rest)) = path.split_once("/openai/deployments/") {
        let (deployment, op) = rest.split_once('/')?;
        let kind = match op {
            "chat/completions" => Kind::Chat,
            "embeddings" => Kind::Embeddings,
            _ => return None,
        };
        return versioned.then(|| CloudCall::Azure { deployment: Some(deployment.to_string()), kind });
    }
    if path.ends_with("/openai/responses") {
        return versioned.then_some(CloudCall::Azure { deployment: None, kind: Kind::Responses });
    }
    if let Some((_, rest)) = path.split_once("/openai/v1/") {
        let kind = match rest {
            "chat/completions" => Kind::Chat,
            "responses" => Kind::Responses,
            "embeddings" => Kind::Embeddings,
            _ => return None,
        };
        return Some(CloudCall::Azure { deployment: None, kind });
    }
    None
}

/// The clouds' credentials and the tokens the mock issued.
pub(crate) struct CloudMock {
    pub(crate) aws_access_key_id: String,
    pub(crate) aws_secret_access_key: String,
    /// PEM public key of the service account whose assertions are accepted.
    pub(crate) google_public_key: Option<Vec<u8>>,
    pub(crate) entra_client_secret: String,
    pub(crate) token_lifetime: u64,
    issued: Mutex<HashSet<String>>,
    token_requests: Mutex<Vec<Value>>,
    fail_tokens: Mutex<u32>,
    next: std::sync::atomic::AtomicU64,
}

/// A refusal: status, body, and the extra headers.
pub(crate) type Refusal = (u16, Value, Vec<(&'static str, String)>);

impl CloudMock {
    pub(crate) fn new(aws: (String, String), google_public_key: Option<Vec<u8>>, entra_client_secret: String, token_lifetime: u64) -> Self {
        CloudMock {
            aws_access_key_id: aws.0,
            aws_secret_access_key: aws.1,
            google_public_key,
            entra_client_secret,
            token_lifetime,
            issued: Mutex::new(HashSet::new()),
            token_requests: Mutex::new(Vec::new()),
            fail_tokens: Mutex::new(0),
            next: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// The mock's clock (AWS's).
    pub(crate) fn aws_now(&self) -> SystemTime {
        SystemTime::now()
    }

    pub(crate) fn token_requests(&self) -> Value {
        Value::Array(self.token_requests.lock().unwrap().clone())
    }

    pub(crate) fn fail_next_tokens(&self, n: u32) {
        *self.fail_tokens.lock().unwrap() = n;
    }

    /// A token endpoint's answer (status, body), when `path` is one.
    pub(crate) fn token_endpoint(&self, path: &str, body: &[u8]) -> Option<(u16, Value)> {
        let google = path.ends_with("/token") && !path.contains("/oauth2/");
        let entra = path.ends_with("/oauth2/v2.0/token");
        if !google && !entra {
            return None;
        }
        let form: Vec<(String, String)> = url_form(body);
        let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let verdict = if google { self.check_assertion(field("grant_type"), field("assertion"), path) } else { self.check_client(&form) };
        let mut note = json!({"path": path, "grant_type": field("grant_type"), "assertion": field("assertion"), "ok": verdict.is_ok()});
        if let Err(why) = &verdict {
            note["error"] = json!(why);
        }
        self.token_requests.lock().unwrap().push(note);
        {
            let mut fail = self.fail_tokens.lock().unwrap();
            if *fail > 0 {
                *fail -= 1;
                return Some((500, json!({"error": "internal_failure", "error_description": "mock token endpoint failing"})));
            }
        }
        if let Err(why) = verdict {
            return Some((400, json!({"error": "invalid_grant", "error_description": why})));
        }
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = if google { format!("ya29.mock-{n}") } else { format!("entra-mock-{n}") };
        self.issued.lock().unwrap().insert(token.clone());
        Some((200, json!({"access_token": token, "expires_in": self.token_lifetime, "token_type": "Bearer"})))
    }

    /// A Google JWT-bearer grant: the assertion's signature, issuer, audience, scope, expiry.
    fn check_assertion(&self, grant: Option<&str>, assertion: Option<&str>, path: &str) -> Result<(), String> {
        if grant != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
            return Err(format!("unsupported grant_type {grant:?}"));
        }
        let assertion = assertion.ok_or("no assertion")?;
        let key = self.google_public_key.as_ref().ok_or("the mock has no --google-public-key")?;
        let key = jsonwebtoken::DecodingKey::from_rsa_pem(key).map_err(|e| e.to_string())?;
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_aud = false;
        let claims = jsonwebtoken::decode::<Value>(assertion, &key, &validation).map_err(|e| format!("Invalid JWT: {e}"))?.claims;
        let aud = claims["aud"].as_str().unwrap_or_default();
        if !aud.ends_with(path) {
            return Err(format!("Invalid JWT: audience {aud} is not this token endpoint"));
        }
        if claims["scope"] != "https://www.googleapis.com/auth/cloud-platform" {
            return Err("Invalid JWT: scope".into());
        }
        let (iat, exp) = (claims["iat"].as_u64().unwrap_or(0), claims["exp"].as_u64().unwrap_or(0));
        if exp <= iat || exp - iat > 3600 {
            return Err("Invalid JWT: exp must be within an hour of iat".into());
        }
        Ok(())
    }

    /// An Entra client-credentials grant for Azure OpenAI's scope.
    fn check_client(&self, form: &[(String, String)]) -> Result<(), String> {
        let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        if field("grant_type") != Some("client_credentials") {
            return Err("AADSTS70003: unsupported grant_type".into());
        }
        if field("client_secret") != Some(self.entra_client_secret.as_str()) {
            return Err("AADSTS7000215: Invalid client secret provided.".into());
        }
        if field("scope") != Some("https://cognitiveservices.azure.com/.default") {
            return Err("AADSTS70011: invalid scope".into());
        }
        Ok(())
    }

    /// Whether a bearer token is one the mock issued.
    pub(crate) fn token_ok(&self, req: &RequestHeader) -> bool {
        let token = req.headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        token.is_some_and(|t| self.issued.lock().unwrap().contains(t))
    }

    /// Bedrock's checks of a request: its SigV4 signature (recomputed) and its date.
    pub(crate) fn check_sigv4(&self, req: &RequestHeader, body: &[u8]) -> Result<(), Refusal> {
        let refuse = |status: u16, kind: &str, message: String| {
            let date = httpdate::fmt_http_date(self.aws_now());
            (
                status,
                json!({"message": message}),
                vec![("x-amzn-errortype", format!("{kind}:http://internal.amazon.com/coral/com.amazon.coral.service/")), ("date", date)],
            )
        };
        let header = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
        let Some(auth) = header("authorization") else {
            return Err(refuse(403, "MissingAuthenticationTokenException", "Missing Authentication Token".into()));
        };
        let part = |name: &str| auth.split(", ").find_map(|p| p.split_once(name).map(|(_, v)| v.to_string())).unwrap_or_default();
        let credential = part("Credential=");
        let signed_headers = part("SignedHeaders=");
        let signature = part("Signature=");
        let mut scope = credential.split('/');
        let (key_id, _day, region, service) = (scope.next(), scope.next(), scope.next().unwrap_or_default(), scope.next());
        if key_id != Some(self.aws_access_key_id.as_str()) {
            return Err(refuse(403, "UnrecognizedClientException", "The security token included in the request is invalid.".into()));
        }
        if service != Some("bedrock") {
            return Err(refuse(
                403,
                "InvalidSignatureException",
                format!("Credential should be scoped to correct service: 'bedrock'. ({service:?})"),
            ));
        }
        let amz_date = header("x-amz-date").unwrap_or_default();
        let Ok(when) = jiff::civil::DateTime::strptime("%Y%m%dT%H%M%SZ", amz_date).and_then(|d| d.to_zoned(jiff::tz::TimeZone::UTC)) else {
            return Err(refuse(400, "ValidationException", "x-amz-date is missing or unreadable".into()));
        };
        let when = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(when.timestamp().as_second()).unwrap_or(0));
        let off = match self.aws_now().duration_since(when) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        if off > Duration::from_secs(300) {
            return Err(refuse(
                403,
                "InvalidSignatureException",
                format!("Signature expired: {amz_date} is now earlier or later than the service's time by more than 5 minutes."),
            ));
        }
        let names: Vec<&str> = signed_headers.split(';').collect();
        let values: Vec<(&str, &str)> = names.iter().map(|n| (*n, header(n).unwrap_or_default())).collect();
        let host = header("host").unwrap_or_default();
        let uri = format!("https://{host}{}", req.uri.path_and_query().map_or("/", |p| p.as_str()));
        let identity = aws_credential_types::Credentials::new(
            &self.aws_access_key_id,
            &self.aws_secret_access_key,
            header("x-amz-security-token").map(str::to_string),
            None,
            "mock",
        )
        .into();
        let unreadable = |e: &dyn std::fmt::Display| refuse(400, "ValidationException", format!("the request cannot be signed: {e}"));
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name("bedrock")
            .time(when)
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| unreadable(&e))?
            .into();
        let request =
            SignableRequest::new(req.method.as_str(), uri, values.into_iter(), SignableBody::Bytes(body)).map_err(|e| unreadable(&e))?;
        let expected = sign(request, &params).map(|out| out.signature().to_string()).unwrap_or_default();
        if expected != signature {
            return Err(refuse(
                403,
                "InvalidSignatureException",
                "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method.".into(),
            ));
        }
        Ok(())
    }
}

/// The guardrail (id) an `ApplyGuardrail` path names.
pub(crate) fn guardrail_path(path: &str) -> Option<String> {
    let (_, rest) = path.split_once("/guardrail/")?;
    let (id, rest) = rest.split_once("/version/")?;
    rest.ends_with("/apply").then(|| tollgate::base::text::decode_component(id))
}

/// `ApplyGuardrail`'s answer to `body` for guardrail `id`.
pub(crate) fn apply_guardrail(id: &str, body: &[u8]) -> Result<Value, Refusal> {
    let invalid = |status: u16, message: &str| {
        let (b, amzn) = bedrock_error(status, message);
        (status, b, vec![("x-amzn-errortype", amzn)])
    };
    if id == "missing" {
        return Err(invalid(404, "The guardrail identifier or version provided is invalid."));
    }
    let v: Value = serde_json::from_slice(body).map_err(|_| invalid(400, "the body is not JSON"))?;
    if !matches!(v.get("source").and_then(Value::as_str), Some("INPUT" | "OUTPUT")) {
        return Err(invalid(400, "source: must be INPUT or OUTPUT"));
    }
    let texts: Option<Vec<&str>> = v
        .get("content")
        .and_then(Value::as_array)
        .map(|c| c.iter().filter_map(|b| b.pointer("/text/text").and_then(Value::as_str)).collect());
    let Some(texts) = texts.filter(|t| !t.is_empty() && t.len() == v["content"].as_array().map_or(0, Vec::len)) else {
        return Err(invalid(400, "content: a list of text blocks"));
    };
    let mut filters = Vec::new();
    let mut pii = Vec::new();
    let mut outputs = Vec::new();
    for text in &texts {
        if text.contains("[[flag]]") {
            filters
                .push(json!({"type": "VIOLENCE", "confidence": "HIGH", "filterStrength": "HIGH", "action": "BLOCKED", "detected": true}));
        }
        let mut masked = Vec::new();
        for word in text.split(' ') {
            let email = word.split_once('@').is_some_and(|(user, domain)| !user.is_empty() && domain.contains('.'));
            if email {
                pii.push(json!({"match": word, "type": "EMAIL", "action": "ANONYMIZED", "detected": true}));
                masked.push("{EMAIL}");
            } else {
                masked.push(word);
            }
        }
        outputs.push(json!({"text": masked.join(" ")}));
    }
    let usage = json!({"topicPolicyUnits": 0, "contentPolicyUnits": texts.len(), "wordPolicyUnits": 0, "sensitiveInformationPolicyUnits": texts.len()});
    if filters.is_empty() && pii.is_empty() {
        return Ok(json!({"action": "NONE", "outputs": [], "assessments": [{}], "usage": usage}));
    }
    let assessment = json!({"contentPolicy": {"filters": filters}, "sensitiveInformationPolicy": {"piiEntities": pii, "regexes": []}});
    let outputs = if filters.is_empty() { outputs } else { vec![json!({"text": "Sorry, the model cannot answer this question."})] };
    Ok(
        json!({"action": "GUARDRAIL_INTERVENED", "actionReason": "Guardrail blocked.", "outputs": outputs, "assessments": [assessment], "usage": usage}),
    )
}

/// An `application/x-www-form-urlencoded` body's fields.
fn url_form(body: &[u8]) -> Vec<(String, String)> {
    crate::wire::url_pairs(&String::from_utf8_lossy(body))
}

/// The body checks of a cloud's messages endpoint: Bedrock and Vertex want their own
/// `anthropic_version` and no `model` (Bedrock: no `stream` either).
pub(crate) fn messages_body_refused(call: &CloudCall, body: &Value) -> Option<String> {
    let (version, stream_field) = match call {
        CloudCall::Bedrock { .. } => ("bedrock-2023-05-31", true),
        CloudCall::VertexAnthropic { .. } => ("vertex-2023-10-16", false),
        _ => return None,
    };
    if body.get("anthropic_version").and_then(Value::as_str) != Some(version) {
        return Some(format!("anthropic_version: must be {version}"));
    }
    if body.get("model").is_some() {
        return Some("model: Extra inputs are not permitted".into());
    }
    if stream_field && body.get("stream").is_some() {
        return Some("stream: Extra inputs are not permitted".into());
    }
    None
}

/// Bedrock's error body and type header for a mock status.
pub(crate) fn bedrock_error(status: u16, message: &str) -> (Value, String) {
    let kind = match status {
        429 => "ThrottlingException",
        400 => "ValidationException",
        403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        503 => "ServiceUnavailableException",
        _ => "InternalServerException",
    };
    (json!({"message": message}), format!("{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"))
}

/// Messages SSE events (`event: …\ndata: …\n\n`, several per string at times) as Bedrock's
/// event-stream frames; `message_stop` gains the invocation metrics.
pub(crate) fn event_stream_frames(events: &[String], input_tokens: u64, output_tokens: u64) -> Vec<Vec<u8>> {
    events
        .iter()
        .map(|text| {
            let mut out = Vec::new();
            for mut json in sse_data(text) {
                if json["type"] == "message_stop" {
                    json["amazon-bedrock-invocationMetrics"] = json!({"inputTokenCount": input_tokens, "outputTokenCount": output_tokens,
                        "invocationLatency": 100, "firstByteLatency": 20});
                }
                let payload = json!({"bytes": base64::engine::general_purpose::STANDARD.encode(json.to_string()), "p": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"});
                write_frame(&mut out, false, "chunk", &payload);
            }
            out
        })
        .collect()
}

/// An exception frame inside a stream.
pub(crate) fn exception_frame(kind: &str, message: &str) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, true, kind, &json!({"message": message}));
    out
}

/// One event-stream frame with a JSON payload: an event (its `:event-type` `kind`) or an
/// exception (its `:exception-type` `kind`).
fn write_frame(out: &mut Vec<u8>, exception: bool, kind: &str, payload: &Value) {
    let (message_type, type_header) = if exception { ("exception", ":exception-type") } else { ("event", ":event-type") };
    let m = Message::new(payload.to_string())
        .add_header(Header::new(type_header, HeaderValue::String(kind.to_string().into())))
        .add_header(Header::new(":content-type", HeaderValue::String("application/json".into())))
        .add_header(Header::new(":message-type", HeaderValue::String(message_type.into())));
    aws_smithy_eventstream::frame::write_message_to(&m, out).unwrap();
}

/// The `data:` JSON of each event in `text` (one or more SSE events).
fn sse_data(text: &str) -> impl Iterator<Item = Value> + '_ {
    text.split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|data| serde_json::from_str(data).unwrap_or(Value::Null))
}

/// The fields a Converse request may have, and the keys of a content block (exactly one each).
const CONVERSE_FIELDS: [&str; 9] = [
    "messages",
    "system",
    "inferenceConfig",
    "toolConfig",
    "additionalModelRequestFields",
    "guardrailConfig",
    "promptVariables",
    "requestMetadata",
    "performanceConfig",
];
const CONTENT_KEYS: [&str; 8] = ["text", "image", "document", "video", "toolUse", "toolResult", "reasoningContent", "cachePoint"];

/// One Converse content block as a messages block (None: a cache point), or why Bedrock would
/// refuse it.
fn converse_block(b: &Value, at: &str) -> Result<Option<Value>, String> {
    let obj = b.as_object().ok_or(format!("{at}: a content block must be an object"))?;
    if obj.len() != 1 || !CONTENT_KEYS.contains(&obj.keys().next().map(String::as_str).unwrap_or_default()) {
        return Err(format!("{at}: a content block has exactly one of {CONTENT_KEYS:?}"));
    }
    Ok(Some(if let Some(text) = b.get("text") {
        json!({"type": "text", "text": text.as_str().ok_or(format!("{at}.text must be a string"))?})
    } else if let Some(image) = b.get("image") {
        let format = image.get("format").and_then(Value::as_str).unwrap_or_default();
        if !["png", "jpeg", "gif", "webp"].contains(&format) {
            return Err(format!("{at}.image.format must be png, jpeg, gif or webp"));
        }
        let data = image.pointer("/source/bytes").and_then(Value::as_str).ok_or(format!("{at}.image.source.bytes is required"))?;
        base64::engine::general_purpose::STANDARD.decode(data).map_err(|_| format!("{at}.image.source.bytes is not base64"))?;
        json!({"type": "image", "source": {"type": "base64", "media_type": format!("image/{format}"), "data": data}})
    } else if let Some(t) = b.get("toolUse") {
        json!({"type": "tool_use", "id": t["toolUseId"], "name": t["name"], "input": t["input"]})
    } else if let Some(r) = b.get("toolResult") {
        let text: String = r["content"]
            .as_array()
            .map(|parts| parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect())
            .unwrap_or_default();
        json!({"type": "tool_result", "tool_use_id": r["toolUseId"], "content": text, "is_error": r["status"] == "error"})
    } else {
        return Ok(None);
    }))
}

/// The request a cloud call asks for as the mock reads it: Converse's checked (a refusal as
/// Bedrock's) and written as a messages request; any other as it is.
pub(crate) fn as_messages(cloud: Option<&CloudCall>, parsed: Value) -> Result<Value, Refusal> {
    match cloud {
        Some(CloudCall::Converse { .. }) => converse_to_messages(&parsed).map_err(|why| {
            let (b, amzn) = bedrock_error(400, &why);
            (400, b, vec![("x-amzn-errortype", amzn)])
        }),
        _ => Ok(parsed),
    }
}

/// Converse's validation of a request (as Bedrock answers it: 400 `ValidationException`), and
/// the request as a messages body (what the rest of the mock answers from).
pub(crate) fn converse_to_messages(v: &Value) -> Result<Value, String> {
    let map = v.as_object().ok_or("the body must be a JSON object")?;
    if let Some(bad) = map.keys().find(|k| !CONVERSE_FIELDS.contains(&k.as_str())) {
        return Err(format!("1 validation error detected: extraneous key [{bad}] is not permitted"));
    }
    let mut messages = Vec::new();
    for (i, m) in map.get("messages").and_then(Value::as_array).ok_or("messages is required")?.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .filter(|r| *r == "user" || *r == "assistant")
            .ok_or(format!("messages.{i}.role must be user or assistant"))?;
        let mut content = Vec::new();
        for (j, b) in m.get("content").and_then(Value::as_array).ok_or(format!("messages.{i}.content must be a list"))?.iter().enumerate() {
            content.extend(converse_block(b, &format!("messages.{i}.content.{j}"))?);
        }
        messages.push(json!({"role": role, "content": content}));
    }
    let mut out = json!({"messages": messages});
    if let Some(system) = map.get("system").and_then(Value::as_array) {
        let text: Vec<&str> = system.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect();
        out["system"] = json!(text.join("\n"));
    }
    if let Some(max) = map.get("inferenceConfig").and_then(|c| c.get("maxTokens")) {
        out["max_tokens"] = max.clone();
    }
    if let Some(tools) = map.get("toolConfig").and_then(|c| c.get("tools")).and_then(Value::as_array) {
        let tools: Vec<Value> = tools
            .iter()
            .filter_map(|t| t.get("toolSpec"))
            .map(|spec| json!({"name": spec["name"], "description": spec["description"], "input_schema": spec.pointer("/inputSchema/json").cloned().unwrap_or_default()}))
            .collect();
        out["tools"] = json!(tools);
    }
    Ok(out)
}

/// A messages answer as a `ConverseResponse`.
pub(crate) fn converse_whole(messages: &Value) -> Value {
    let content: Vec<Value> = messages["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .map(|b| match b["type"].as_str() {
                    Some("tool_use") => json!({"toolUse": {"toolUseId": b["id"], "name": b["name"], "input": b["input"]}}),
                    _ => json!({"text": b["text"]}),
                })
                .collect()
        })
        .unwrap_or_default();
    let input = messages.pointer("/usage/input_tokens").and_then(Value::as_u64).unwrap_or(0);
    let output = messages.pointer("/usage/output_tokens").and_then(Value::as_u64).unwrap_or(0);
    json!({"output": {"message": {"role": "assistant", "content": content}}, "stopReason": messages["stop_reason"],
        "usage": {"inputTokens": input, "outputTokens": output, "totalTokens": input + output}, "metrics": {"latencyMs": 42}})
}

/// One messages SSE event as a `ConverseStream` event (its type and payload), if it has one.
fn converse_event(v: &Value, input_tokens: u64, output_tokens: u64) -> Option<(&'static str, Value)> {
    let index = v["index"].clone();
    Some(match v["type"].as_str().unwrap_or_default() {
        "message_start" => ("messageStart", json!({"role": "assistant", "p": "abcd"})),
        "content_block_start" if v["content_block"]["type"] == "tool_use" => (
            "contentBlockStart",
            json!({"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": v["content_block"]["id"], "name": v["content_block"]["name"]}}}),
        ),
        "content_block_delta" if v["delta"]["type"] == "text_delta" => {
            ("contentBlockDelta", json!({"contentBlockIndex": index, "delta": {"text": v["delta"]["text"]}}))
        }
        "content_block_delta" if v["delta"]["type"] == "input_json_delta" => {
            ("contentBlockDelta", json!({"contentBlockIndex": index, "delta": {"toolUse": {"input": v["delta"]["partial_json"]}}}))
        }
        "content_block_stop" => ("contentBlockStop", json!({"contentBlockIndex": index})),
        "message_delta" => ("messageStop", json!({"stopReason": v["delta"]["stop_reason"]})),
        "message_stop" => (
            "metadata",
            json!({"usage": {"inputTokens": input_tokens, "outputTokens": output_tokens, "totalTokens": input_tokens + output_tokens},
                "metrics": {"latencyMs": 42}}),
        ),
        _ => return None,
    })
}

/// Messages SSE events as `ConverseStream`'s frames (text blocks open without a start event,
/// as Bedrock sends them; usage in the closing `metadata`).
pub(crate) fn converse_frames(events: &[String], input_tokens: u64, output_tokens: u64) -> Vec<Vec<u8>> {
    events
        .iter()
        .map(|text| {
            let mut out = Vec::new();
            for v in sse_data(text) {
                if let Some((kind, payload)) = converse_event(&v, input_tokens, output_tokens) {
                    write_frame(&mut out, false, kind, &payload);
                }
            }
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cloud_paths_are_told_apart() {
        assert_eq!(
            classify("/model/anthropic.claude-x-v1%3A0/invoke-with-response-stream", None),
            Some(CloudCall::Bedrock { model: "anthropic.claude-x-v1:0".into(), stream: true })
        );
        assert_eq!(
            classify("/v1/projects/p/locations/l/publishers/anthropic/models/claude-x@1:rawPredict", None),
            Some(CloudCall::VertexAnthropic { model: "claude-x@1".into(), stream: false })
        );
        assert_eq!(classify("/openai/deployments/d/chat/completions", None), None, "no api-version");
        assert_eq!(
            classify("/openai/deployments/d/chat/completions", Some("api-version=2024-10-21")),
            Some(CloudCall::Azure { deployment: Some("d".into()), kind: Kind::Chat })
        );
        assert_eq!(classify("/v1/chat/completions", None), None);
    }
}
