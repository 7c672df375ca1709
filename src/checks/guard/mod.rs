//! Guardrails: what a call sends and what comes back, read for personal data, secrets and the
//! operator's own patterns (built in: [`recognise`]), or by the operator's service
//! ([`webhook`]), and blocked, masked or only noted. Configured in `guardrails:` and attached by
//! name to groups, accounts and keys; a key has the union ([`Guardrails::applying`]).
//!
//! Every kind of call offers its texts here ([`screen`]): a model call its body (before
//! anything is held or sent), a realtime session each client item, an MCP tool call its
//! arguments, a batch each line at submission, a video task its prompt. Output is read by
//! [`stream::OutputGuard`]: a whole answer before it is sent, a stream as it flows over a
//! bounded look-behind window.
//!
//! What is seen is never what was found: the notes ([`Noted`]), the log, the metrics
//! (`tollgate_guardrail_actions_total{guardrail,phase,action}`, `tollgate_guardrail_seconds`)
//! carry the guardrail, its action and the categories only.

mod events;
pub mod recognise;
mod segments;
pub mod stream;
pub mod webhook;

pub use crate::config::guardrails::{Action, OnError, Phase};

use crate::observe::metrics::Metrics;
use crate::policy::KeyPolicy;
use crate::protocol::{ApiError, ErrorKind};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

enum Detector {
    Patterns(Box<recognise::Matcher>),
    Webhook(webhook::Webhook),
    Moderation { model: String, thresholds: BTreeMap<String, f64>, moderator: Option<Arc<dyn Moderator>>, timeout: Duration },
    Cloud { asked: CloudGuardrail, service: Option<Arc<dyn CloudGuard>>, timeout: Duration },
}

/// The services the guardrails that are not read here ask, given by the floor above
/// (`upstream`: the gateway's own providers serve them).
#[derive(Clone, Default)]
pub struct Services {
    pub moderator: Option<Arc<dyn Moderator>>,
    pub cloud: Option<Arc<dyn CloudGuard>>,
}

/// A cloud's guardrail: AWS Bedrock's, asked through the `bedrock` provider `provider`.
#[derive(Debug, Clone)]
pub struct CloudGuardrail {
    pub provider: String,
    pub id: String,
    pub version: String,
}

/// What a cloud's guardrail made of the texts it was given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Vended {
    /// It blocks them.
    pub blocked: bool,
    /// It changed them (masked what it found), without blocking: the texts as they are to be
    /// sent, one per text (None: it did not say, and they cannot be sent masked).
    pub masked: Option<Option<Vec<String>>>,
    /// What it found: its policies' types and names, bounded.
    pub categories: Vec<String>,
}

/// A cloud's guardrail service (`upstream::cloud_guard`: Bedrock's `ApplyGuardrail`, signed by
/// the provider's own seam).
#[async_trait::async_trait]
pub trait CloudGuard: Send + Sync {
    /// What `guardrail` makes of `texts` (what a call sends, or, `output`, what comes back); an
    /// error says why there is no verdict (never a text).
    async fn apply(&self, guardrail: &CloudGuardrail, output: bool, texts: &[&str], timeout: Duration) -> Result<Vended, String>;
}

/// What a moderation model said of one text.
#[derive(Debug, Clone, Default)]
pub struct Moderated {
    pub flagged: bool,
    /// The categories it flagged.
    pub categories: Vec<String>,
    /// Every category's score.
    pub scores: BTreeMap<String, f64>,
}

/// A moderation model served by one of the gateway's providers (`upstream::moderation`): the
/// floor above gives it to the guardrails.
#[async_trait::async_trait]
pub trait Moderator: Send + Sync {
    /// One result per text, in order; an error says why there are none (never a text).
    async fn moderate(&self, model: &str, texts: &[&str], timeout: Duration) -> Result<Vec<Moderated>, String>;
}

impl Detector {
    /// The categories a moderation model's results come to: with thresholds, those whose
    /// score reaches theirs; without, those it flagged.
    fn moderated(thresholds: &BTreeMap<String, f64>, results: &[Moderated]) -> Vec<String> {
        let mut found: Vec<String> = Vec::new();
        for r in results {
            let hits: Vec<&String> = match thresholds.is_empty() {
                true => r.categories.iter().filter(|_| r.flagged).collect(),
                false => thresholds.iter().filter(|(c, t)| r.scores.get(*c).is_some_and(|s| s >= *t)).map(|(c, _)| c).collect(),
            };
            for c in hits {
                if !found.contains(c) {
                    found.push(c.clone());
                }
            }
        }
        found
    }
}

/// One guardrail, built.
pub struct Guardrail {
    pub name: String,
    /// `pii`, `secrets`, `regex`, `webhook`, `moderation`, `bedrock`.
    pub kind: String,
    pub phase: Phase,
    pub action: Action,
    pub on_error: OnError,
    pub restore: bool,
    /// Billed to the key for each call it checked (nano-USD).
    pub price_nanos: i64,
    detector: Detector,
}

impl Guardrail {
    /// Whether it reads text locally (a stream's output is read only by these).
    pub fn local(&self) -> bool {
        matches!(self.detector, Detector::Patterns(_))
    }
}

/// A guardrail could not be built.
#[derive(Debug)]
pub struct GuardError(pub String);

impl std::fmt::Display for GuardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The guardrails of a configuration, and what is attached to each group (an account's are
/// on its record, seeded from the file or set through the admin API).
#[derive(Default)]
pub struct Guardrails {
    by_name: HashMap<String, Arc<Guardrail>>,
    groups: HashMap<String, Vec<Arc<Guardrail>>>,
}

impl Guardrails {
    /// Build `config`'s guardrails (their patterns compiled, a client for the webhooks;
    /// `services` serve the moderation models and the clouds' guardrails).
    pub fn new(config: &crate::config::Config, services: &Services) -> Result<Guardrails, GuardError> {
        use crate::config::guardrails::GuardKind;
        let mut by_name = HashMap::new();
        let mut http = None;
        for g in &config.guardrails {
            let detector = match &g.kind {
                GuardKind::Patterns { builtin, patterns } => Detector::Patterns(Box::new(
                    recognise::Matcher::new(builtin, patterns).map_err(|e| GuardError(format!("guardrail {}: {}", g.name, e.0)))?,
                )),
                GuardKind::Webhook { url, secret } => {
                    let client = match &http {
                        Some(client) => client,
                        None => http.insert(
                            crate::base::outbound::Outbound {
                                connect: Some(Duration::from_secs(5)),
                                follow_redirects: false,
                                ..Default::default()
                            }
                            .client()
                            .map_err(|e| GuardError(format!("guardrail {}: {e}", g.name)))?,
                        ),
                    };
                    Detector::Webhook(webhook::Webhook::new(
                        url.clone(),
                        secret.clone(),
                        client.clone(),
                        Duration::from_millis(g.timeout_ms),
                    ))
                }
                GuardKind::Moderation { model, thresholds } => Detector::Moderation {
                    model: model.clone(),
                    thresholds: thresholds.clone(),
                    moderator: services.moderator.clone(),
                    timeout: Duration::from_millis(g.timeout_ms),
                },
                GuardKind::Bedrock { provider, id, version } => Detector::Cloud {
                    asked: CloudGuardrail { provider: provider.clone(), id: id.clone(), version: version.clone() },
                    service: services.cloud.clone(),
                    timeout: Duration::from_millis(g.timeout_ms),
                },
            };
            let built = Guardrail {
                name: g.name.clone(),
                kind: g.kind_name.clone(),
                phase: g.phase,
                action: g.action,
                on_error: g.on_error,
                restore: g.restore,
                price_nanos: g.price_per_check_nanos,
                detector,
            };
            by_name.insert(g.name.clone(), Arc::new(built));
        }
        let resolve = |names: &[String]| names.iter().filter_map(|n| by_name.get(n).cloned()).collect::<Vec<_>>();
        let groups = config.groups.iter().map(|(name, g)| (name.clone(), resolve(&g.guardrails))).collect();
        Ok(Guardrails { by_name, groups })
    }

    /// The guardrails a key of `group` with `policy` goes through: its group's, its account's
    /// (`account`: the names on the account's record), its own, each once, in that order. A
    /// name no guardrail has (set through the admin API before a reload removed it) is skipped
    /// and logged.
    pub fn applying(&self, group: &str, policy: &KeyPolicy, account: &[String]) -> Applied {
        if self.by_name.is_empty() {
            return Applied::default();
        }
        let mut list: Vec<Arc<Guardrail>> = Vec::new();
        let mut add = |g: &Arc<Guardrail>| {
            if !list.iter().any(|h| Arc::ptr_eq(h, g)) {
                list.push(g.clone());
            }
        };
        self.groups.get(group).into_iter().flatten().for_each(&mut add);
        for name in account.iter().chain(policy.guardrails.iter().flatten()) {
            match self.by_name.get(name) {
                Some(g) => add(g),
                None => log::warn!(
                    "a key names guardrail '{}', which the configuration does not declare; skipped",
                    crate::base::text::clip(name, 64)
                ),
            }
        }
        Applied(list)
    }

    /// Whether `name` is declared.
    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }
}

/// The guardrails one call goes through.
#[derive(Clone, Default)]
pub struct Applied(Vec<Arc<Guardrail>>);

impl Applied {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Whether any reads what the call sends.
    pub fn input(&self) -> bool {
        self.0.iter().any(|g| g.phase.input())
    }
    /// Whether any reads what comes back (or restores what was masked).
    pub fn output(&self) -> bool {
        self.0.iter().any(|g| g.phase.output() || g.restore)
    }
    /// What the guardrails that read only what comes back cost (`price_per_check`), nano-USD:
    /// held and billed with the call whose answer they read (those that read what it sends
    /// too are billed once, when they read it).
    pub fn output_price(&self) -> i64 {
        self.0.iter().filter(|g| g.phase == Phase::Output).fold(0, |sum, g| sum.saturating_add(g.price_nanos))
    }
    /// The guardrails reading `phase`.
    fn reading(&self, output: bool) -> impl Iterator<Item = &Arc<Guardrail>> {
        self.0.iter().filter(move |g| if output { g.phase.output() } else { g.phase.input() })
    }
}

/// What a guardrail's service is told of the call.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    pub protocol: &'a str,
    pub route: &'a str,
    pub model: Option<&'a str>,
    pub key_id: &'a str,
    pub tags: &'a BTreeMap<String, String>,
}

/// What one guardrail did to a call: for the logs, the request log, the trace and the
/// metrics. Never the text it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Noted {
    pub guardrail: String,
    pub phase: &'static str,
    /// `block`, `mask`, `monitor`, or `error` (its service failed; `open` or `closed` in
    /// `categories`).
    pub action: &'static str,
    pub categories: Vec<String>,
}

impl Noted {
    /// `name:phase:action[:category+category]`, as the access log and the request log give it.
    pub fn summary(list: &[Noted]) -> Option<String> {
        if list.is_empty() {
            return None;
        }
        let parts: Vec<String> = list
            .iter()
            .map(|n| match n.categories.is_empty() {
                true => format!("{}:{}:{}", n.guardrail, n.phase, n.action),
                false => format!("{}:{}:{}:{}", n.guardrail, n.phase, n.action, n.categories.join("+")),
            })
            .collect();
        Some(parts.join(","))
    }
}

/// The most placeholders one call (a realtime session) restores (and four times as many
/// remembered, so the same value keeps its placeholder; past that each gets a new one).
const MAX_RESTORED: usize = 1024;

/// Placeholders given to what was masked in one call, for restoring them in its answer.
#[derive(Default)]
pub struct Masks {
    /// (category, original) → placeholder.
    given: HashMap<(String, String), String>,
    counts: HashMap<String, u32>,
    /// Placeholder → original, for the guardrails that restore.
    pub restore: Vec<(String, String)>,
}

impl Masks {
    /// `text` with each of `found` replaced by its placeholder (kept to restore with `restore`).
    fn mask(&mut self, text: &str, found: &[recognise::Found], restore: bool) -> String {
        let mut masked = String::with_capacity(text.len());
        let mut at = 0;
        for f in found {
            masked.push_str(&text[at..f.start]);
            masked.push_str(&self.placeholder(&f.category, &text[f.start..f.end], restore));
            at = f.end;
        }
        masked.push_str(&text[at..]);
        masked
    }

    /// The placeholder of `original` (the same one each time in a call).
    fn placeholder(&mut self, category: &str, original: &str, restore: bool) -> String {
        let key = (category.to_string(), original.to_string());
        if let Some(p) = self.given.get(&key) {
            return p.clone();
        }
        let n = self.counts.entry(category.to_string()).or_insert(0);
        *n += 1;
        let placeholder = format!("[{}_{}]", category.to_ascii_uppercase(), n);
        // A long session's: the first MAX_RESTORED are put back, the rest stay masked.
        if restore && self.restore.len() < MAX_RESTORED {
            self.restore.push((placeholder.clone(), original.to_string()));
        }
        if self.given.len() < MAX_RESTORED * 4 {
            self.given.insert(key, placeholder.clone());
        }
        placeholder
    }
}

/// What the guardrails made of a call so far.
#[derive(Default)]
pub struct Screening {
    pub noted: Vec<Noted>,
    pub masks: Masks,
    /// What the guardrails that checked it cost (`price_per_check`), nano-USD.
    pub price_nanos: i64,
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Blocked { guardrail: String, output: bool },
    Unavailable { guardrail: String },
}

impl Refusal {
    /// The client's error: 400 `content_policy_violation` naming the guardrail (never what it
    /// found), or 503 when a guardrail that fails closed could not check.
    pub fn error(&self) -> ApiError {
        match self {
            Refusal::Blocked { guardrail, output: false } => {
                ApiError::new(ErrorKind::ContentPolicy, format!("The request was blocked by the gateway's guardrail '{guardrail}'."))
            }
            Refusal::Blocked { guardrail, output: true } => {
                ApiError::new(ErrorKind::ContentPolicy, format!("The answer was blocked by the gateway's guardrail '{guardrail}'."))
            }
            Refusal::Unavailable { guardrail } => ApiError::new(
                ErrorKind::GuardrailUnavailable,
                format!("The gateway's guardrail '{guardrail}' could not check this request; try again later."),
            ),
        }
    }
}

/// Keys whose string values are not text a person wrote: names of things, ids, enums, data.
const NOT_TEXT: [&str; 25] = [
    "audio",
    "model",
    "role",
    "type",
    "id",
    "tool_call_id",
    "call_id",
    "tool_use_id",
    "previous_response_id",
    "file_id",
    "mime_type",
    "media_type",
    "mimeType",
    "data",
    "url",
    "image_url",
    "detail",
    "format",
    "voice",
    "response_format",
    "service_tier",
    "signature",
    "encrypted_content",
    "object",
    "finish_reason",
];

/// The text strings of a JSON value, to read and change in place.
pub fn texts_of(value: &mut Value) -> Vec<&mut String> {
    fn walk<'v>(v: &'v mut Value, out: &mut Vec<&'v mut String>) {
        match v {
            Value::String(s) => out.push(s),
            Value::Array(items) => items.iter_mut().for_each(|v| walk(v, out)),
            Value::Object(map) => {
                for (k, v) in map.iter_mut() {
                    if !NOT_TEXT.contains(&k.as_str()) {
                        walk(v, out);
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut out);
    out
}

fn counts(metrics: &Metrics, g: &Guardrail, phase: &'static str, action: &str, took: Duration) {
    metrics.guardrail(&g.name, phase, action, took);
}

/// Read `texts` (what a call sends: `output` false; or a whole answer: true) with every
/// guardrail of `applied` that reads that phase, in order: a block refuses, a mask changes the
/// texts in place, a monitor notes. Returns whether a text changed.
pub async fn screen(
    applied: &Applied,
    output: bool,
    call: &Call<'_>,
    texts: &mut [&mut String],
    screening: &mut Screening,
    metrics: &Metrics,
) -> Result<bool, Refusal> {
    let mut changed = false;
    for g in applied.reading(output) {
        screening.price_nanos = screening.price_nanos.saturating_add(g.price_nanos);
        let reading = Reading { g, output, phase: if output { "output" } else { "input" }, started: Instant::now(), metrics };
        changed |= match &g.detector {
            Detector::Patterns(matcher) => reading.patterns(matcher, texts, screening)?,
            Detector::Moderation { model, thresholds, moderator, timeout } => {
                let asked: Vec<&str> = texts.iter().map(|t| t.as_str()).collect();
                let answer = match moderator {
                    Some(m) => m.moderate(model, &asked, *timeout).await,
                    None => Err("no provider serves moderation here".to_string()),
                };
                match answer {
                    Ok(results) => reading.found(Detector::moderated(thresholds, &results), g.action, screening)?,
                    Err(why) => reading.failed(&format!("(moderation, {model}) failed: {why}"), screening)?,
                }
                false
            }
            Detector::Cloud { asked, service, timeout } => {
                let given: Vec<&str> = texts.iter().map(|t| t.as_str()).collect();
                let answer = match service {
                    Some(s) => s.apply(asked, output, &given, *timeout).await,
                    None => Err("no provider serves it here".to_string()),
                };
                match answer {
                    Ok(vended) => reading.vended(vended, texts, screening)?,
                    Err(why) => {
                        reading.failed(&format!("({} {}) failed: {why}", g.kind, asked.id), screening)?;
                        false
                    }
                }
            }
            Detector::Webhook(hook) => {
                let asked = webhook::Asked {
                    phase: reading.phase,
                    protocol: call.protocol,
                    route: call.route,
                    model: call.model,
                    key_id: call.key_id,
                    tags: call.tags,
                    texts: texts.iter().map(|t| t.as_str()).collect(),
                };
                match hook.ask(&asked).await {
                    Ok(answer) => reading.answered(answer, texts, screening)?,
                    Err(failed) => {
                        reading.failed(&format!("(webhook) {failed}"), screening)?;
                        false
                    }
                }
            }
        };
    }
    Ok(changed)
}

/// One guardrail reading one call's texts.
struct Reading<'a> {
    g: &'a Guardrail,
    output: bool,
    phase: &'static str,
    started: Instant,
    metrics: &'a Metrics,
}

impl Reading<'_> {
    fn blocked(&self) -> Refusal {
        Refusal::Blocked { guardrail: self.g.name.clone(), output: self.output }
    }

    /// The built-in recognisers and the operator's patterns: each text read, masked in place
    /// for `mask`; whether one changed.
    fn patterns(&self, matcher: &recognise::Matcher, texts: &mut [&mut String], screening: &mut Screening) -> Result<bool, Refusal> {
        let (g, mut changed) = (self.g, false);
        let mut categories: Vec<String> = Vec::new();
        for text in texts.iter_mut() {
            let found = matcher.find(text);
            if found.is_empty() {
                continue;
            }
            for f in &found {
                if !categories.contains(&f.category) {
                    categories.push(f.category.clone());
                }
            }
            if g.action == Action::Mask {
                **text = screening.masks.mask(text, &found, g.restore && !self.output);
                changed = true;
            }
            if g.action == Action::Block {
                break;
            }
        }
        self.found(categories, g.action, screening)?;
        Ok(changed)
    }

    /// What it found (nothing: allowed), as `action` treats it: noted, counted, refused for a
    /// block.
    fn found(&self, categories: Vec<String>, action: Action, screening: &mut Screening) -> Result<(), Refusal> {
        let took = self.started.elapsed();
        if categories.is_empty() {
            if !matches!(self.g.detector, Detector::Patterns(_)) {
                counts(self.metrics, self.g, self.phase, "allow", took);
            }
            return Ok(());
        }
        counts(self.metrics, self.g, self.phase, action.label(), took);
        screening.noted.push(Noted { guardrail: self.g.name.clone(), phase: self.phase, action: action.label(), categories });
        match action {
            Action::Block => Err(self.blocked()),
            Action::Mask | Action::Monitor => Ok(()),
        }
    }

    /// Its service failed: logged, counted, noted; the call goes on (`open`) or is refused.
    fn failed(&self, why: &str, screening: &mut Screening) -> Result<(), Refusal> {
        let g = self.g;
        let how = match g.on_error {
            OnError::Open => "open",
            OnError::Closed => "closed",
        };
        log::warn!("guardrail {} {why}: the call goes on failing {how}", g.name);
        counts(self.metrics, g, self.phase, "error", self.started.elapsed());
        screening.noted.push(Noted { guardrail: g.name.clone(), phase: self.phase, action: "error", categories: vec![how.to_string()] });
        match g.on_error {
            OnError::Open => Ok(()),
            OnError::Closed => Err(Refusal::Unavailable { guardrail: g.name.clone() }),
        }
    }

    /// A webhook's answer: allowed, or what it says done as the guardrail's action allows;
    /// its reason, if it gives one, is the category noted. Whether a text changed.
    fn answered(&self, answer: webhook::Answer, texts: &mut [&mut String], screening: &mut Screening) -> Result<bool, Refusal> {
        let reason: Vec<String> = answer.reason.iter().map(|r| bounded_reason(r)).collect();
        let said = match answer.action {
            webhook::Verdict::Allow => None,
            webhook::Verdict::Block => Some(Action::Block),
            webhook::Verdict::Mask => Some(Action::Mask),
        };
        self.verdict(said, reason, answer.replacements, texts, screening)
    }

    /// A cloud guardrail's verdict, as a webhook's.
    fn vended(&self, vended: Vended, texts: &mut [&mut String], screening: &mut Screening) -> Result<bool, Refusal> {
        let (said, replacements) = match (vended.blocked, vended.masked) {
            (true, _) => (Some(Action::Block), None),
            (false, Some(with)) => (Some(Action::Mask), with),
            (false, None) => (None, None),
        };
        self.verdict(said, vended.categories, replacements, texts, screening)
    }

    /// What a service said (None: allow) done as the guardrail's action allows (a `monitor`
    /// guardrail only notes it); a mask without one replacement per text blocks. Whether a
    /// text changed.
    fn verdict(
        &self,
        said: Option<Action>,
        categories: Vec<String>,
        replacements: Option<Vec<String>>,
        texts: &mut [&mut String],
        screening: &mut Screening,
    ) -> Result<bool, Refusal> {
        let Some(said) = said else {
            counts(self.metrics, self.g, self.phase, "allow", self.started.elapsed());
            return Ok(false);
        };
        let verdict = if self.g.action == Action::Monitor { Action::Monitor } else { said };
        if verdict == Action::Mask && replacements.as_ref().is_none_or(|r| r.len() != texts.len()) {
            log::warn!("guardrail {} ({}) masked without one replacement per text; the call is blocked", self.g.name, self.g.kind);
            return Err(self.blocked());
        }
        counts(self.metrics, self.g, self.phase, verdict.label(), self.started.elapsed());
        screening.noted.push(Noted { guardrail: self.g.name.clone(), phase: self.phase, action: verdict.label(), categories });
        if verdict == Action::Block {
            return Err(self.blocked());
        }
        let mut changed = false;
        if let (Action::Mask, Some(with)) = (verdict, replacements) {
            for (text, new) in texts.iter_mut().zip(with) {
                if **text != new {
                    **text = new;
                    changed = true;
                }
            }
        }
        Ok(changed)
    }
}

/// A webhook's reason, as a category: at most 64 characters, letters, digits, `_`, `-`, `.`.
pub fn bounded_reason(reason: &str) -> String {
    reason.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')).take(64).collect()
}

/// Screen a JSON body's texts (input): the body again, rewritten, when a mask changed it.
///
/// When every guardrail reading it is local, the body's texts are first read where they lie
/// (`protocol::scan::texts`: no tree built, a text without escapes not copied); only a body
/// in which one finds something is parsed into a tree, screened and written again.
pub async fn screen_body(
    applied: &Applied,
    call: &Call<'_>,
    body: &[u8],
    screening: &mut Screening,
    metrics: &Metrics,
) -> Result<Option<Vec<u8>>, Refusal> {
    let matchers: Option<Vec<&recognise::Matcher>> = applied
        .reading(false)
        .map(|g| match &g.detector {
            Detector::Patterns(m) => Some(m.as_ref()),
            Detector::Webhook(_) | Detector::Moderation { .. } | Detector::Cloud { .. } => None,
        })
        .collect();
    if let Some(matchers) = matchers {
        let clean = crate::protocol::scan::texts(body, &NOT_TEXT, &mut |text| matchers.iter().any(|m| m.any(text)));
        if clean == Ok(false) {
            for g in applied.reading(false) {
                screening.price_nanos = screening.price_nanos.saturating_add(g.price_nanos);
            }
            return Ok(None);
        }
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        // Not JSON: read as one text (the draft refuses it after).
        let mut text = String::from_utf8_lossy(body).into_owned();
        let changed = screen(applied, false, call, &mut [&mut text], screening, metrics).await?;
        return Ok(changed.then(|| text.into_bytes()));
    };
    // A service is told the model the body names when the path does not name it.
    let named = value.get("model").and_then(Value::as_str).map(str::to_string);
    let call = Call { model: call.model.or(named.as_deref()), ..*call };
    let changed = screen(applied, false, &call, &mut texts_of(&mut value), screening, metrics).await?;
    Ok(match changed {
        true => serde_json::to_vec(&value).ok(),
        false => None,
    })
}

#[cfg(test)]
mod tests;
