//! The moderation model of a `moderation` guardrail (`checks::guard::Moderator`): asked at
//! `/v1/moderations` of the gateway's own `openai` provider that serves it, with that
//! provider's key, never the client's. Its answer's `results` — one per text — say what the
//! model flagged and every category's score.

use super::catalog::Catalog;
use crate::checks::guard::{Moderated, Moderator};
use crate::config::{Protocol, ProviderKind};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The moderation guardrails' models, this catalog's providers': a client is made only when
/// the configuration has a moderation guardrail.
pub fn for_config(config: &crate::config::Config, catalog: &Arc<Catalog>) -> Result<Option<Arc<dyn Moderator>>, String> {
    let moderates = config.guardrails.iter().any(|g| matches!(g.kind, crate::config::guardrails::GuardKind::Moderation { .. }));
    if !moderates {
        return Ok(None);
    }
    let moderator = ProviderModerator::new(catalog.clone()).map_err(|e| e.to_string())?;
    Ok(Some(Arc::new(moderator)))
}

/// The most of an answer read.
const MAX_ANSWER_BYTES: usize = 4 << 20;

pub struct ProviderModerator {
    catalog: Arc<Catalog>,
    http: reqwest::Client,
}

impl ProviderModerator {
    pub fn new(catalog: Arc<Catalog>) -> Result<ProviderModerator, crate::base::outbound::ClientError> {
        let http = crate::base::outbound::Outbound { connect: Some(Duration::from_secs(5)), follow_redirects: false, ..Default::default() }
            .client()?;
        Ok(ProviderModerator { catalog, http })
    }
}

#[async_trait::async_trait]
impl Moderator for ProviderModerator {
    async fn moderate(&self, model: &str, texts: &[&str], timeout: Duration) -> Result<Vec<Moderated>, String> {
        let provider = self
            .catalog
            .candidates(Protocol::Openai, model)
            .into_iter()
            .flatten()
            .map(|&i| &self.catalog.upstreams[i].config)
            .find(|c| c.kind == ProviderKind::Openai)
            .ok_or_else(|| format!("no openai provider serves {model}"))?;
        let base = &provider.base_url;
        let url = format!("{}://{}:{}{}/v1/moderations", if base.tls { "https" } else { "http" }, base.host, base.port, base.prefix);
        let key = provider.api_keys.first().ok_or_else(|| format!("provider {} has no key", provider.name))?;
        let body = json!({"model": provider.upstream_model(model), "input": texts});
        let call = async {
            let answer = self.http.post(&url).bearer_auth(key).json(&body).send().await.map_err(|e| match e.is_timeout() {
                true => "no answer in time".to_string(),
                false => format!("provider {} unreachable", provider.name),
            })?;
            let status = answer.status().as_u16();
            if !(200..300).contains(&status) {
                return Err(format!("provider {} answered {status}", provider.name));
            }
            let bytes = answer.bytes().await.map_err(|_| format!("provider {}'s answer was cut", provider.name))?;
            if bytes.len() > MAX_ANSWER_BYTES {
                return Err(format!("provider {}'s answer is too large", provider.name));
            }
            let v: Value = serde_json::from_slice(&bytes).map_err(|_| format!("provider {}'s answer is not JSON", provider.name))?;
            results(&v, texts.len()).ok_or_else(|| format!("provider {}'s answer has no result per text", provider.name))
        };
        tokio::time::timeout(timeout, call).await.map_err(|_| "no answer in time".to_string())?
    }
}

/// A moderation answer's results, when it has one per text.
fn results(v: &Value, texts: usize) -> Option<Vec<Moderated>> {
    let list = v.get("results")?.as_array()?;
    if list.len() != texts {
        return None;
    }
    let bounded = |c: &String| c.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/')).take(64).collect::<String>();
    Some(
        list.iter()
            .map(|r| Moderated {
                flagged: r.get("flagged").and_then(Value::as_bool).unwrap_or(false),
                categories: r
                    .get("categories")
                    .and_then(Value::as_object)
                    .map(|m| m.iter().filter(|(_, on)| on.as_bool() == Some(true)).map(|(c, _)| bounded(c)).collect())
                    .unwrap_or_default(),
                scores: r
                    .get("category_scores")
                    .and_then(Value::as_object)
                    .map(|m| m.iter().filter_map(|(c, s)| Some((bounded(c), s.as_f64()?))).collect())
                    .unwrap_or_default(),
            })
            .collect(),
    )
}
