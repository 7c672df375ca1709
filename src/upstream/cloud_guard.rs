//! A `bedrock` guardrail (`checks::guard::CloudGuard`): AWS Bedrock's `ApplyGuardrail`
//! (`POST /guardrail/{id}/version/{version}/apply`) asked at the endpoint of the `bedrock`
//! provider it names, signed by that provider's own seam (SigV4 with its region and
//! credentials, dated by its corrected clock). Each text is one content block of `source`
//! `INPUT` or `OUTPUT`. The answer's `action` is `NONE` or `GUARDRAIL_INTERVENED`; an
//! assessment whose policy acted `BLOCKED` blocks; one that only `ANONYMIZED` masks, the
//! answer's `outputs` (one per content block) being the texts to send. What it found — its
//! policies' types and names, never the matched text — is noted.

use super::catalog::Catalog;
use super::path::Destination;
use super::seam::Call;
use crate::checks::guard::{bounded_reason, CloudGuard, CloudGuardrail, Services, Vended};
use crate::config::Protocol;
use crate::route::Route;
use pingora_http::{RequestHeader, ResponseHeader};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The services the configuration's guardrails ask: a moderation model, a cloud's guardrail
/// (a client made only when a guardrail of that kind is configured).
pub fn services(config: &crate::config::Config, catalog: &Arc<Catalog>) -> Result<Services, String> {
    let moderator = super::moderation::for_config(config, catalog)?;
    let clouds = config.guardrails.iter().any(|g| matches!(g.kind, crate::config::guardrails::GuardKind::Bedrock { .. }));
    let cloud: Option<Arc<dyn CloudGuard>> = match clouds {
        true => Some(Arc::new(BedrockGuard::new(catalog.clone()).map_err(|e| e.to_string())?)),
        false => None,
    };
    Ok(Services { moderator, cloud })
}

/// The most of an answer read.
const MAX_ANSWER_BYTES: usize = 4 << 20;

pub struct BedrockGuard {
    catalog: Arc<Catalog>,
    http: reqwest::Client,
}

impl BedrockGuard {
    pub fn new(catalog: Arc<Catalog>) -> Result<BedrockGuard, crate::base::outbound::ClientError> {
        let http = crate::base::outbound::Outbound { connect: Some(Duration::from_secs(5)), follow_redirects: false, ..Default::default() }
            .client()?;
        Ok(BedrockGuard { catalog, http })
    }

    /// One signed request; its status and body. A 403 answered with a `Date` that corrected
    /// the provider's clock is asked again, once, as a model call is.
    async fn ask(&self, guardrail: &CloudGuardrail, body: Vec<u8>) -> Result<(u16, bytes::Bytes), String> {
        let upstream = self
            .catalog
            .upstreams
            .iter()
            .find(|u| u.config.name == guardrail.provider)
            .ok_or_else(|| format!("no provider is named {}", guardrail.provider))?;
        let base = &upstream.config.base_url;
        let path = format!(
            "{}/guardrail/{}/version/{}/apply",
            base.prefix,
            crate::base::text::encode_component(&guardrail.id),
            crate::base::text::encode_component(&guardrail.version)
        );
        let url = format!("{}://{}{path}", if base.tls { "https" } else { "http" }, base.host_header());
        let route = Route::Messages;
        for attempt in 0..2 {
            let mut req = RequestHeader::build("POST", path.as_bytes(), None).map_err(|e| e.to_string())?;
            req.insert_header(http::header::HOST, upstream.host_value.clone()).map_err(|e| e.to_string())?;
            req.insert_header(http::header::CONTENT_TYPE, "application/json").map_err(|e| e.to_string())?;
            let client = RequestHeader::build("POST", path.as_bytes(), None).map_err(|e| e.to_string())?;
            let call = Call {
                client: &client,
                to: Destination::Relayed(&route),
                model: &guardrail.id,
                client_model: &guardrail.id,
                wire: Protocol::Anthropic,
                stream: false,
                client_version: None,
            };
            upstream.seam.authenticate(&mut req, 0, None, &call, &body).map_err(|e| e.to_string())?;
            let mut sent = self.http.post(&url).body(body.clone());
            for (name, value) in req.headers.iter().filter(|(name, _)| *name != http::header::HOST) {
                sent = sent.header(name, value);
            }
            let answer = sent.send().await.map_err(|e| match e.is_timeout() {
                true => "no answer in time".to_string(),
                false => format!("provider {} unreachable", guardrail.provider),
            })?;
            let status = answer.status().as_u16();
            let mut seen = ResponseHeader::build(status, None).map_err(|e| e.to_string())?;
            if let Some(date) = answer.headers().get(http::header::DATE) {
                seen.insert_header(http::header::DATE, date.clone()).map_err(|e| e.to_string())?;
            }
            if upstream.seam.clock_corrected(&seen) && status == 403 && attempt == 0 {
                continue;
            }
            if answer.content_length().is_some_and(|n| n > MAX_ANSWER_BYTES as u64) {
                return Err(format!("provider {}'s answer is too large", guardrail.provider));
            }
            let bytes = answer.bytes().await.map_err(|_| format!("provider {}'s answer was cut", guardrail.provider))?;
            if bytes.len() > MAX_ANSWER_BYTES {
                return Err(format!("provider {}'s answer is too large", guardrail.provider));
            }
            return Ok((status, bytes));
        }
        Err(format!("provider {} refused the signature", guardrail.provider))
    }
}

#[async_trait::async_trait]
impl CloudGuard for BedrockGuard {
    async fn apply(&self, guardrail: &CloudGuardrail, output: bool, texts: &[&str], timeout: Duration) -> Result<Vended, String> {
        let content: Vec<Value> = texts.iter().map(|t| json!({"text": {"text": t}})).collect();
        let body = json!({"source": if output { "OUTPUT" } else { "INPUT" }, "content": content});
        let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
        let (status, bytes) =
            tokio::time::timeout(timeout, self.ask(guardrail, body)).await.map_err(|_| "no answer in time".to_string())??;
        if !(200..300).contains(&status) {
            // Bedrock's error names its exception (`{"message": …}`), never a text of the call.
            return Err(format!("provider {} answered {status}", guardrail.provider));
        }
        let v: Value = serde_json::from_slice(&bytes).map_err(|_| format!("provider {}'s answer is not JSON", guardrail.provider))?;
        verdict(&v, texts.len()).ok_or_else(|| format!("provider {}'s answer has no action", guardrail.provider))
    }
}

/// An `ApplyGuardrail` answer for `texts` texts: None when it has no `action`.
fn verdict(v: &Value, texts: usize) -> Option<Vended> {
    match v.get("action")?.as_str()? {
        "NONE" => return Some(Vended::default()),
        "GUARDRAIL_INTERVENED" => {}
        _ => return None,
    }
    // (category, what the policy did) of every assessment.
    let mut acted: Vec<(String, String)> = Vec::new();
    let lists: [(&str, &str, &str); 7] = [
        ("topicPolicy", "topics", "name"),
        ("contentPolicy", "filters", "type"),
        ("wordPolicy", "customWords", ""),
        ("wordPolicy", "managedWordLists", "type"),
        ("sensitiveInformationPolicy", "piiEntities", "type"),
        ("sensitiveInformationPolicy", "regexes", "name"),
        ("contextualGroundingPolicy", "filters", "type"),
    ];
    for assessment in v.get("assessments").and_then(Value::as_array).into_iter().flatten() {
        for (policy, list, named) in lists {
            for item in assessment.get(policy).and_then(|p| p.get(list)).and_then(Value::as_array).into_iter().flatten() {
                let Some(action) = item.get("action").and_then(Value::as_str) else { continue };
                let category = match named {
                    "" => "custom_word".to_string(),
                    field => bounded_reason(item.get(field).and_then(Value::as_str).unwrap_or(list)),
                };
                acted.push((category, action.to_string()));
            }
        }
    }
    let mut categories: Vec<String> = Vec::new();
    for (c, action) in &acted {
        if action != "NONE" && !categories.contains(c) {
            categories.push(c.clone());
        }
    }
    // Intervened without saying it only anonymized: blocked.
    let anonymized_only = acted.iter().any(|(_, a)| a == "ANONYMIZED") && acted.iter().all(|(_, a)| a == "ANONYMIZED" || a == "NONE");
    if !anonymized_only {
        return Some(Vended { blocked: true, masked: None, categories });
    }
    let outputs: Option<Vec<String>> = v
        .get("outputs")
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(|o| o.get("text").and_then(Value::as_str).map(str::to_string)).collect());
    Some(Vended { blocked: false, masked: Some(outputs.filter(|o| o.len() == texts)), categories })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_blocks_masks_or_allows_as_its_policies_acted() {
        assert_eq!(verdict(&json!({"action": "NONE", "outputs": [], "assessments": [{}]}), 1), Some(Vended::default()));
        let blocked = json!({"action": "GUARDRAIL_INTERVENED", "outputs": [{"text": "Sorry."}], "assessments": [
            {"contentPolicy": {"filters": [{"type": "VIOLENCE", "confidence": "HIGH", "action": "BLOCKED"}]},
             "sensitiveInformationPolicy": {"piiEntities": [{"match": "a@b.co", "type": "EMAIL", "action": "ANONYMIZED"}]}}]});
        let v = verdict(&blocked, 1).expect("verdict");
        assert!(v.blocked);
        assert_eq!(v.categories, ["VIOLENCE", "EMAIL"]);
        let masked = json!({"action": "GUARDRAIL_INTERVENED", "outputs": [{"text": "mail {EMAIL}"}, {"text": "hi"}], "assessments": [
            {"sensitiveInformationPolicy": {"piiEntities": [{"match": "a@b.co", "type": "EMAIL", "action": "ANONYMIZED"}],
             "regexes": [{"name": "ticket", "match": "T-1", "regex": "T-\\d", "action": "NONE"}]}}]});
        let v = verdict(&masked, 2).expect("verdict");
        assert_eq!(
            v,
            Vended { blocked: false, masked: Some(Some(vec!["mail {EMAIL}".into(), "hi".into()])), categories: vec!["EMAIL".into()] }
        );
        // One output for two texts: cannot be sent masked (the guardrail then blocks).
        assert_eq!(verdict(&masked, 3).expect("verdict").masked, Some(None));
        // Intervened, saying nothing of why: blocked.
        assert!(verdict(&json!({"action": "GUARDRAIL_INTERVENED"}), 1).expect("verdict").blocked);
        assert_eq!(verdict(&json!({"message": "no"}), 1), None);
    }
}
