//! AWS Bedrock: Anthropic's models through `InvokeModel` (`POST /model/{id}/invoke`) and
//! `InvokeModelWithResponseStream` (`…/invoke-with-response-stream`), the messages body
//! without `model` and `stream` and with `anthropic_version: bedrock-2023-05-31`. A messages
//! client is relayed almost as is; other protocols' clients are translated to messages first.
//! Every other model (its id names no `anthropic.` model) through `Converse` / `ConverseStream`
//! (`…/converse`, `…/converse-stream`), converted at the wire (see [`super::converse`]).
//!
//! Every request is signed with SigV4 (service `bedrock`, the body's hash, `x-amz-date`, the
//! session token of temporary credentials) by the AWS SDK's own signer. The clock the signature
//! is dated by follows the service's: each answer's `Date` header corrects a local clock that is
//! off (as the AWS SDKs do), so a skewed host keeps working.
//!
//! A streamed answer comes as event-stream frames (see [`super::eventstream`]), decoded to the
//! messages protocol's SSE before it is metered or relayed. Bedrock's error answers
//! (`{"message": …}`, the exception in `x-amzn-ErrorType`) carry the status the gateway maps
//! into the client's shape (429 throttled, 400 validation, 403 access denied).

use super::eventstream::EventStreamToSse;
use super::sigv4::{Request, Signer};
use super::{edit_members, set, Call, Decode, Seam, SeamError};
use crate::config::Protocol;
use crate::route::Route;
use bytes::Bytes;
use pingora_http::{RequestHeader, ResponseHeader};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

/// The `anthropic_version` Bedrock's Anthropic models take, in the body (as JSON text).
const VERSION_JSON: &str = "\"bedrock-2023-05-31\"";

/// The content type of a streamed answer.
const EVENT_STREAM: &str = "application/vnd.amazon.eventstream";

/// A clock further off than this from the service's is corrected (SigV4 allows 5 minutes).
const SKEW_TOLERATED_MS: i64 = 60_000;

pub struct Bedrock {
    signer: Signer,
    /// Milliseconds to add to the local clock to get the service's (0 until a `Date` header
    /// says otherwise).
    skew_ms: AtomicI64,
}

impl Bedrock {
    pub fn new(config: &crate::config::cloud::Bedrock) -> Bedrock {
        let c = &config.credentials;
        let signer = Signer::new(&c.access_key_id, &c.secret_access_key, c.session_token.as_deref(), &config.region, "bedrock");
        Bedrock { signer, skew_ms: AtomicI64::new(0) }
    }

    /// The time a signature is dated by: the local clock, corrected by the service's.
    fn now(&self) -> SystemTime {
        let skew = self.skew_ms.load(Ordering::Relaxed);
        let by = Duration::from_millis(skew.unsigned_abs());
        if skew >= 0 {
            SystemTime::now() + by
        } else {
            SystemTime::now() - by
        }
    }

    /// Note the service's clock from an answer's `Date` header; true when that changed the
    /// correction.
    fn observe_clock(&self, header: &ResponseHeader) -> bool {
        let Some(date) = header.headers.get(http::header::DATE).and_then(|v| v.to_str().ok()) else { return false };
        let Ok(theirs) = httpdate::parse_http_date(date) else { return false };
        let ours = SystemTime::now();
        let skew_ms = match theirs.duration_since(ours) {
            Ok(ahead) => i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX),
            Err(behind) => -i64::try_from(behind.duration().as_millis()).unwrap_or(i64::MAX),
        };
        // A Date header has whole seconds: small differences are its rounding, not skew.
        let corrected = if skew_ms.abs() > SKEW_TOLERATED_MS { skew_ms } else { 0 };
        let before = self.skew_ms.swap(corrected, Ordering::Relaxed);
        // Within the tolerance of the correction in force: no change.
        let changed = (before - corrected).abs() > SKEW_TOLERATED_MS;
        if changed && corrected != 0 {
            log::warn!(
                "bedrock: this host's clock is {} s off the service's; signatures are dated by the service's clock",
                corrected / 1000
            );
        }
        changed
    }
}

impl Seam for Bedrock {
    fn serves(&self, route: &Route, wire: Protocol, translated: bool) -> bool {
        wire == Protocol::Anthropic && (matches!(route, Route::Messages) || (translated && !crate::translate::counts(route)))
    }

    fn target(&self, call: &Call<'_>, prefix: &str) -> String {
        let action = match (converses(call.model), call.stream) {
            (true, true) => "converse-stream",
            (true, false) => "converse",
            (false, true) => "invoke-with-response-stream",
            (false, false) => "invoke",
        };
        format!("{prefix}/model/{}/{action}", crate::base::text::encode_component(call.model))
    }

    fn body(&self, call: &Call<'_>, body: &Bytes) -> Result<Bytes, SeamError> {
        if converses(call.model) {
            return super::converse::request(body);
        }
        edit_members(body, &[("anthropic_version", VERSION_JSON)], &["model", "stream"], true)
    }

    fn authenticate(
        &self,
        req: &mut RequestHeader,
        _key: usize,
        _token: Option<&http::HeaderValue>,
        _call: &Call<'_>,
        body: &[u8],
    ) -> Result<(), SeamError> {
        let signing_error = |e: &dyn std::fmt::Display| SeamError::Credentials(format!("SigV4 signing failed ({e})"));
        let header = |name: http::HeaderName| req.headers.get(name).and_then(|v| v.to_str().ok());
        // Signed: the host and the content type (the other relayed headers are left unsigned,
        // as the SDKs leave theirs).
        let request = Request {
            method: req.method.as_str(),
            host: header(http::header::HOST).unwrap_or_default(),
            path_and_query: req.uri.path_and_query().map_or("/", |p| p.as_str()),
            content_type: header(http::header::CONTENT_TYPE),
            body,
        };
        let signed = self.signer.sign(&request, self.now()).map_err(|e| signing_error(&e))?;
        set(req, "x-amz-date", signed.amz_date)?;
        let mut authorization = http::HeaderValue::try_from(signed.authorization).map_err(|e| signing_error(&e))?;
        authorization.set_sensitive(true);
        set(req, "authorization", authorization)?;
        if let Some(token) = signed.security_token {
            let mut token = http::HeaderValue::try_from(token).map_err(|e| signing_error(&e))?;
            token.set_sensitive(true);
            set(req, "x-amz-security-token", token)?;
        }
        Ok(())
    }

    fn clock_corrected(&self, header: &ResponseHeader) -> bool {
        self.observe_clock(header)
    }

    fn decoder(&self, model: &str, header: &ResponseHeader) -> Option<Box<dyn Decode>> {
        self.observe_clock(header);
        if header.status.as_u16() >= 300 {
            // Bedrock's error answers are JSON (`{"message": …}`) whatever the action.
            return None;
        }
        let framed = header.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(EVENT_STREAM.as_bytes()));
        match (converses(model), framed) {
            (false, true) => Some(Box::new(EventStreamToSse::default())),
            (false, false) => None,
            (true, true) => Some(Box::new(super::converse::StreamToMessages::new(model))),
            (true, false) => Some(Box::new(super::converse::WholeToMessages::new(model))),
        }
    }
}

/// Whether a Bedrock model goes through Converse: every model but Anthropic's (whose ids, and
/// their inference profiles', name `anthropic.`).
fn converses(model: &str) -> bool {
    !model.contains("anthropic.")
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, header};
    use super::*;

    const SONNET: &str = "anthropic.claude-sonnet-4-6-v1:0";

    #[test]
    fn other_models_go_through_converse() {
        let seam = bedrock(None);
        let client = RequestHeader::build("POST", b"/v1/messages", None).unwrap();
        let route = Route::Messages;
        let mut c = call(&client, &route, "us.meta.llama4-maverick-17b-instruct-v1:0", "llama", Protocol::Anthropic);
        assert_eq!(seam.target(&c, ""), "/model/us.meta.llama4-maverick-17b-instruct-v1%3A0/converse");
        c.stream = true;
        assert!(seam.target(&c, "").ends_with("/converse-stream"));
        let body =
            seam.body(&c, &Bytes::from_static(br#"{"model":"llama","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["inferenceConfig"]["maxTokens"], 9);
        assert_eq!(v["messages"][0]["content"][0]["text"], "hi");
        let profile = call(&client, &route, "us.anthropic.claude-sonnet-4-6-v1:0", "s", Protocol::Anthropic);
        assert!(seam.target(&profile, "").ends_with("/invoke"), "an Anthropic inference profile is invoked");
    }

    fn bedrock(token: Option<&str>) -> Bedrock {
        Bedrock::new(&crate::config::cloud::Bedrock {
            region: "us-east-1".into(),
            credentials: crate::config::cloud::AwsCredentials {
                access_key_id: "AKIDEXAMPLE".into(),
                secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
                session_token: token.map(str::to_string),
            },
        })
    }

    #[test]
    fn the_model_goes_in_the_path_and_the_body_takes_bedrocks_version_without_model_or_stream() {
        let seam = bedrock(None);
        let client = RequestHeader::build("POST", b"/v1/messages?beta=true", None).unwrap();
        let route = Route::Messages;
        let mut c = call(&client, &route, "anthropic.claude-sonnet-4-6-v1:0", "beta-sonnet", Protocol::Anthropic);
        assert_eq!(seam.target(&c, ""), "/model/anthropic.claude-sonnet-4-6-v1%3A0/invoke");
        c.stream = true;
        assert_eq!(seam.target(&c, "/vpc"), "/vpc/model/anthropic.claude-sonnet-4-6-v1%3A0/invoke-with-response-stream");
        let body = seam.body(&c, &Bytes::from_static(br#"{"model":"beta-sonnet","stream":true,"max_tokens":9,"messages":[]}"#)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, serde_json::json!({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 9, "messages": []}));
        assert!(!seam.serves(&Route::CountTokens, Protocol::Anthropic, false));
        assert!(seam.serves(&Route::ChatCompletions, Protocol::Anthropic, true), "translated to messages");
    }

    #[test]
    fn a_request_is_signed_for_bedrock_in_its_region_with_the_session_token() {
        let seam = bedrock(Some("session-token-1"));
        let client = RequestHeader::build("POST", b"/v1/messages", None).unwrap();
        let route = Route::Messages;
        let c = call(&client, &route, "m", "m", Protocol::Anthropic);
        let mut req = RequestHeader::build("POST", b"/model/m/invoke", None).unwrap();
        req.insert_header("host", "bedrock-runtime.us-east-1.amazonaws.com").unwrap();
        req.insert_header("content-type", "application/json").unwrap();
        seam.authenticate(&mut req, 0, None, &c, b"{}").unwrap();
        let auth = header(&req, "authorization").unwrap();
        assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"), "{auth}");
        assert!(auth.contains("/us-east-1/bedrock/aws4_request"), "{auth}");
        assert!(auth.contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token"), "{auth}");
        assert!(req.headers.get("authorization").unwrap().is_sensitive());
        assert_eq!(header(&req, "x-amz-security-token"), Some("session-token-1"));
        assert!(header(&req, "x-amz-date").is_some_and(|d| d.len() == 16 && d.ends_with('Z')));
    }

    #[test]
    fn a_service_clock_far_off_dates_the_next_signatures_by_it() {
        let seam = bedrock(None);
        let mut answer = ResponseHeader::build(403, None).unwrap();
        let ahead = SystemTime::now() + Duration::from_secs(3600);
        answer.insert_header("date", httpdate::fmt_http_date(ahead)).unwrap();
        assert!(seam.decoder(SONNET, &answer).is_none(), "an error answer is not decoded");
        let skew = seam.now().duration_since(SystemTime::now()).unwrap_or_default();
        assert!(skew > Duration::from_secs(3590) && skew < Duration::from_secs(3610), "{skew:?}");
        let mut close = ResponseHeader::build(200, None).unwrap();
        close.insert_header("date", httpdate::fmt_http_date(SystemTime::now())).unwrap();
        assert!(seam.decoder(SONNET, &close).is_none(), "a JSON answer of InvokeModel is not decoded");
        assert!(seam.decoder("meta.llama3-70b-instruct-v1:0", &close).is_some(), "one of Converse is");
        assert!(seam.now().duration_since(SystemTime::now()).unwrap_or_default() < Duration::from_secs(5), "back in step");
        let mut stream = ResponseHeader::build(200, None).unwrap();
        stream.insert_header("content-type", EVENT_STREAM).unwrap();
        stream.insert_header("content-length", "10").unwrap();
        seam.decoder(SONNET, &stream).unwrap().header(&mut stream);
        assert_eq!(stream.headers.get("content-type").unwrap(), "text/event-stream");
        assert!(stream.headers.get("content-length").is_none());
    }
}
