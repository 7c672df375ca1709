//! The admin listener (loopback only): key management with the admin token, `/metrics`,
//! `/healthz`. Changes take effect on the next request: the key index is reloaded in memory.

use super::guard::{host_allowed, new_secret, origin_allowed};
use crate::access::auth::{hash_key, hex, KeyIndex};
use crate::base::clock::now_unix;
use crate::base::money::usd;
use crate::billing::ledger::Ledger;
use crate::observe::metrics::Metrics;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::store::sled::SledDb;
use crate::store::Store;
use pingora_error::Result;
use pingora_proxy::Session;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

const MAX_ADMIN_BODY: usize = 64 * 1024;
pub(crate) use crate::base::secrets::token_matches;

#[derive(Clone)]
pub struct AdminApi {
    /// Plans' periods: a holder leaving a plan closes its period (`plans:`).
    pub plans: Arc<crate::charge::plans::PlanClock>,
    /// Alerts (`notifications:`): their outbox, read by the console and `GET /admin/alerts`.
    pub notifier: Option<Arc<crate::notify::Notifier>>,
    /// Redemption codes and card top-ups (`POST /admin/codes`, the console's `/console/me`).
    pub selling: Arc<crate::selling::Selling>,
    pub token: String,
    /// `Host` names accepted besides localhost and loopback literals (`admin.hosts`).
    pub hosts: Vec<String>,
    /// This node's sled database (in a fleet: its journal).
    pub local: SledDb,
    /// Where keys, money and tasks are kept.
    pub store: Arc<dyn Store>,
    pub keys: Arc<KeyIndex>,
    pub ledger: Arc<Ledger>,
    /// For the groups that exist now (they change on reload).
    pub routing: Arc<arc_swap::ArcSwap<crate::upstream::Routing>>,
    pub metrics: Arc<Metrics>,
    /// Provider health, for its state gauges.
    pub health: Arc<crate::upstream::health::HealthBook>,
    pub video: Option<Arc<crate::video::VideoService>>,
    /// The MCP servers behind `/mcp` (the console's MCP page); None when there are none.
    pub mcp: Option<Arc<crate::mcp::hub::Hub>>,
    /// Keys' files and batches (the console's read-only pages).
    pub files: Option<Arc<crate::files::FileService>>,
    pub batches: Option<Arc<crate::batch::BatchService>>,
    /// `console.request_log_days` and `console.request_log_max`, as the console says them.
    pub request_log_days: u64,
    pub request_log_max: usize,
    /// `/metrics` (see `scrape`).
    pub scrape: Arc<crate::admin::scrape::Scrape>,
    /// The identity provider people sign in to the console with (`identity.oidc`).
    pub identity: Option<Arc<crate::identity::Identity>>,
    /// The console's origin, under which the provider sends people back after sign-in
    /// (`console.public_url`, else the admin listener's).
    pub console_url: String,
}

crate::with_key_policy! { input
    /// `POST /admin/keys`.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(crate) struct CreateKey {
        name: String,
        /// `default` when left out (and such a group exists).
        #[serde(default)]
        group: Option<String>,
        #[serde(default)]
        balance: f64,
        #[serde(default)]
        rpm: Option<u32>,
        #[serde(default)]
        tpm: Option<u64>,
        #[serde(default)]
        max_concurrent: Option<u32>,
        #[serde(default)]
        ttl_secs: Option<u64>,
        /// The plan it subscribes to.
        #[serde(default)]
        plan: Option<String>,
    }
}

/// `Some(None)` clears a limit; absent leaves it.
pub(super) fn double_option<'de, T: Deserialize<'de>, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

crate::with_key_policy! { patch
    /// `PATCH /admin/keys/{id}`: a field absent is left, `null` clears it.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(crate) struct PatchKey {
        #[serde(default)]
        enabled: Option<bool>,
        #[serde(default)]
        balance_delta: Option<f64>,
        /// Why the balance moves (the audit trail keeps it).
        #[serde(default)]
        reason: Option<String>,
        #[serde(default, deserialize_with = "double_option")]
        rpm: Option<Option<u32>>,
        #[serde(default, deserialize_with = "double_option")]
        tpm: Option<Option<u64>>,
        #[serde(default, deserialize_with = "double_option")]
        max_concurrent: Option<Option<u32>>,
        #[serde(default)]
        group: Option<String>,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        ttl_secs: Option<u64>,
        /// The plan it subscribes to (`null`: none).
        #[serde(default, deserialize_with = "double_option")]
        plan: Option<Option<String>>,
    }
}

/// `GET /admin/requests`' query: `key` (a key id), `model`, `route` (its label), `status` (`2xx`, `4xx`, `5xx`),
/// `guardrail` (an action a guardrail took: `block`, `mask`, `monitor`, `error`),
/// `start` and `end` (unix seconds), `limit` (1 to 500, 50 by default), `cursor` (a page's
/// `next`).
fn request_filter(query: Option<&str>) -> std::result::Result<crate::records::log::Filter, ApiError> {
    let (start_ms, end_ms) = crate::billing::ledger::usage_window(query)?;
    let mut f = crate::records::log::Filter { start_ms, end_ms, limit: 50, ..Default::default() };
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = crate::base::text::decode_component(value);
        match name {
            "key" => f.key_id = Some(value),
            "model" => f.model = Some(value),
            "route" => f.route = Some(value),
            "guardrail" => match value.as_str() {
                "block" | "mask" | "monitor" | "error" => f.guardrail_action = Some(value),
                _ => return Err(bad("guardrail: block, mask, monitor or error").with_param("guardrail")),
            },
            "status" => {
                let class = value.strip_suffix("xx").unwrap_or(&value);
                f.status_class = Some(match class {
                    "2" | "3" | "4" | "5" => class.parse().unwrap_or(0),
                    _ => return Err(bad("status: 2xx, 3xx, 4xx or 5xx").with_param("status")),
                });
            }
            "limit" => {
                f.limit = value.parse().ok().filter(|n| (1..=500).contains(n)).ok_or_else(|| bad("limit: 1 to 500").with_param("limit"))?;
            }
            "cursor" => {
                f.before = Some(
                    crate::records::log::Cursor::parse(&value)
                        .ok_or_else(|| bad("cursor: the `next` of a previous page").with_param("cursor"))?,
                );
            }
            _ => {}
        }
    }
    Ok(f)
}

/// Longest `reason` of a balance move.
const MAX_REASON: usize = 500;

/// A balance move's reason: only with a `balance_delta`, at most [`MAX_REASON`] bytes.
pub(super) fn checked_reason(reason: Option<String>, delta: Option<i64>) -> std::result::Result<Option<String>, ApiError> {
    match (&reason, delta) {
        (Some(_), None) => Err(bad("reason: goes with a balance_delta").with_param("reason")),
        (Some(r), _) if r.len() > MAX_REASON => Err(bad(format!("reason: at most {MAX_REASON} bytes")).with_param("reason")),
        _ => Ok(reason),
    }
}

/// The expiry a request sets: `expires_at` (RFC 3339) or `ttl_secs` from now, not both.
fn expiry_text(expires_at: Option<String>, ttl_secs: Option<u64>) -> std::result::Result<Option<String>, ApiError> {
    match (expires_at, ttl_secs) {
        (Some(_), Some(_)) => Err(bad("give expires_at or ttl_secs, not both").with_param("ttl_secs")),
        (None, Some(0)) => Err(bad("ttl_secs: at least 1").with_param("ttl_secs")),
        (None, Some(ttl)) => Ok(Some(crate::protocol::rfc3339(now_unix().saturating_add(ttl)))),
        (at, None) => Ok(at),
    }
}

pub(crate) use crate::admin::refusal::{bad, policy_error};
use crate::policy::budget::Owner;

/// `POST /admin/keys/{id}/rotate`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RotateKey {
    /// How long the previous secret stays accepted (0: not at all).
    #[serde(default)]
    grace_secs: u64,
}

/// Longest grace period of a rotation: 30 days.
const MAX_GRACE_SECS: u64 = 30 * 86_400;

/// A JSON body as `T`; an error names the field it is about (`param`, and the message): a
/// type error by its path (`budgets.day`), a field's own validation by what it says.
pub(crate) fn parse_json<T: for<'de> Deserialize<'de>>(body: &[u8]) -> std::result::Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = parsed.map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                // The message without serde's position (it is within the member's value).
                let text = inner.to_string();
                let message = text.rsplit_once(" at line ").map_or(text.as_str(), |(m, _)| m).to_string();
                // A field's own validation says `field: …`; a type error is named by its path.
                let own = message
                    .split_once(": ")
                    .map(|(f, _)| f)
                    .filter(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
                    .map(str::to_string);
                let field = own.clone().or_else(|| (path != ".").then(|| path.clone()));
                match (field, own) {
                    (Some(field), Some(_)) => bad(format!("Invalid field: {message}")).with_param(&field),
                    (Some(field), None) => bad(format!("Invalid field '{field}': {message}")).with_param(&field),
                    (None, _) => bad(format!("Invalid field: {message}")),
                }
            }
            _ => bad(format!("Invalid JSON: {inner}")),
        }
    })?;
    de.end().map_err(|e| bad(format!("Invalid JSON: {e}")))?;
    Ok(value)
}

/// A store failure as the admin API answers it: the shared database out of reach is 503
/// `store_unavailable` with `Retry-After` (the write can be sent again); anything else is 500.
pub(super) fn internal<E: std::fmt::Display + 'static>(e: E) -> ApiError {
    if let Some(crate::store::StoreError::Shared(why)) = (&e as &dyn std::any::Any).downcast_ref::<crate::store::StoreError>() {
        log::warn!("admin: {why}");
        return crate::store::fleet::unavailable("its data");
    }
    log::error!("admin: {e}");
    ApiError::new(ErrorKind::Internal, "Internal error.")
}

/// The request's query string.
fn req_query(session: &Session) -> Option<String> {
    session.req_header().uri.query().map(str::to_string)
}

pub(super) fn to_nanos(field: &str, usd: f64) -> std::result::Result<i64, ApiError> {
    if !usd.is_finite() || usd.abs() > 1e9 {
        return Err(bad(format!("{field}: must be a finite amount of USD")));
    }
    Ok(crate::base::money::usd_to_nanos(usd))
}

impl AdminApi {
    /// Ready: the database answers and every upstream host resolves.
    fn readiness(&self) -> LocalResponse {
        let local = self.local.db().tree("keys").map(|_| ()).map_err(|e| e.to_string());
        let shared = self.store.readiness();
        let database = match local.and(shared) {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error: {e}"),
        };
        let routing = self.routing.load();
        let mut upstreams = serde_json::Map::new();
        let mut all_resolved = true;
        for u in &routing.catalog.upstreams {
            let resolved = u.is_resolved();
            all_resolved &= resolved;
            upstreams.insert(u.config.name.clone(), json!(if resolved { "resolved" } else { "unresolved" }));
        }
        let ready = database == "ok" && all_resolved;
        LocalResponse::json(
            if ready { 200 } else { 503 },
            &json!({"status": if ready { "ready" } else { "not ready" }, "database": database, "upstreams": upstreams}),
        )
    }

    pub(crate) async fn view(&self, rec: &KeyRecord) -> std::result::Result<Value, ApiError> {
        let balance = self.ledger.balance(&rec.id).await.map_err(internal)?;
        let (multiplier, from) = self.keys.price_multiplier(rec);
        Ok(json!({
            "price_multiplier": multiplier, "price_multiplier_from": from,
            "plan": rec.plan.as_ref().map(|p| p.name.as_str()),
            "plan_standing": match &rec.plan {
                Some(r) => self.plans.standing(&rec.id, r, now_unix()).await.map_err(internal)?,
                None => None,
            },
            "id": rec.id, "name": rec.name, "group": rec.group, "balance": usd(balance),
            "rpm": rec.rpm, "tpm": rec.tpm, "max_concurrent": rec.max_concurrent,
            "enabled": rec.enabled, "created_at": rec.created_at, "origin": rec.origin,
            "revoked_at": rec.revoked_at,
            "expires_at": rec.policy.expires_at.map(crate::protocol::rfc3339),
            "models": rec.policy.models, "ip_allow": rec.policy.ip_allow,
            "max_request_cost": rec.policy.max_request_cost_nanos.map(usd),
            "max_output_tokens": rec.policy.max_output_tokens, "default_output_tokens": rec.policy.default_output_tokens,
            "budgets": self.windows(crate::records::purse::window_owner(rec), &rec.policy.budgets).await?,
            "account": rec.policy.account, "tags": rec.policy.tags,
            "tools": rec.policy.tools, "tool_rpm": rec.policy.tool_rpm, "guardrails": rec.policy.guardrails,
            "previous_key_valid_until": rec.rotated.as_ref().map(|r| r.until).filter(|until| *until > now_unix()),
        }))
    }

    /// Each spend window with a cap (see `ledger::window_report`).
    pub(super) async fn windows(&self, owner: Owner<'_>, budgets: &crate::policy::budget::Budgets) -> std::result::Result<Value, ApiError> {
        let calendar = self.routing.load().calendar.clone();
        crate::billing::ledger::window_report(&self.ledger, owner, budgets, &calendar).await.map_err(internal)
    }

    /// Guardrails a key or a team names: each declared by the configuration, at most
    /// [`crate::policy::MAX_GUARDRAILS`].
    pub(super) fn known_guardrails(&self, names: Vec<String>) -> std::result::Result<Vec<String>, ApiError> {
        let routing = self.routing.load();
        if names.len() > crate::policy::MAX_GUARDRAILS {
            return Err(bad(format!("guardrails: at most {} names", crate::policy::MAX_GUARDRAILS)).with_param("guardrails"));
        }
        if let Some((i, name)) = names.iter().enumerate().find(|(_, n)| !routing.guardrails.has(n)) {
            let name = crate::base::text::clip(name, 64);
            return Err(bad(format!("guardrails[{i}]: no guardrail named '{name}' in the configuration")).with_param("guardrails"));
        }
        Ok(names)
    }

    /// A key may only name an account and guardrails that exist.
    fn check_account(&self, policy: &crate::policy::KeyPolicy) -> std::result::Result<(), ApiError> {
        self.known_guardrails(policy.guardrails.clone().unwrap_or_default())?;
        match &policy.account {
            Some(name) if self.keys.account(name).is_none() => {
                Err(bad(format!("account: no account named '{name}'")).with_param("account"))
            }
            _ => Ok(()),
        }
    }

    /// The account named `name`, or the 404.
    pub(super) fn account(&self, name: &str) -> std::result::Result<std::sync::Arc<crate::records::key::AccountRecord>, ApiError> {
        self.keys.account(name).ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("No account named '{name}'.")))
    }

    /// The key with this id, or the 404.
    pub(crate) async fn key(&self, id: &str) -> std::result::Result<KeyRecord, ApiError> {
        self.keys
            .all_keys()
            .await
            .map_err(internal)?
            .into_iter()
            .find(|r| r.id == id)
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("No key with id '{id}'.")))
    }

    /// `POST /admin/keys` (and the console's form): the new key's view with its secret
    /// (`key`), shown this once.
    pub(crate) async fn create_key(&self, mut body: CreateKey) -> std::result::Result<Value, ApiError> {
        if body.name.trim().is_empty() {
            return Err(bad("name: must not be empty"));
        }
        let group = match body.group.take() {
            Some(group) => group,
            None if self.routing.load().catalog.has_group("default") => "default".to_string(),
            None => return Err(bad("group: required (there is no group named 'default')").with_param("group")),
        };
        if !self.routing.load().catalog.has_group(&group) {
            return Err(bad(format!("group: no group named '{group}'")).with_param("group"));
        }
        let balance = to_nanos("balance", body.balance)?;
        if balance < 0 {
            return Err(bad("balance: must not be negative"));
        }
        let mut input = body.policy_input();
        input.expires_at = expiry_text(input.expires_at, body.ttl_secs)?;
        let policy = crate::policy::KeyPolicy::parse(input, now_unix()).map_err(policy_error)?;
        self.check_account(&policy)?;
        if let Some(name) = body.plan.as_deref().filter(|n| self.keys.plans().get(n).is_none()) {
            return Err(bad(format!("plan: no plan named '{name}'")).with_param("plan"));
        }
        let secret = new_secret();
        let hash = hex(&hash_key(&secret));
        let rec = KeyRecord {
            rpm: body.rpm,
            tpm: body.tpm,
            max_concurrent: body.max_concurrent,
            policy,
            plan: body.plan.clone().map(|name| crate::policy::plan::PlanRef { name, since: now_unix() }),
            ..KeyRecord::new(format!("key_{}", &hash[..16]), body.name, group, hash, crate::records::key::KeyOrigin::Admin)
        };
        if body.max_concurrent == Some(0) {
            return Err(bad("max_concurrent: at least 1"));
        }
        self.ledger.open_account(&rec.id, balance).await.map_err(internal)?;
        self.keys.put_key(&rec).await.map_err(internal)?;
        if rec.plan.is_some() {
            // Its first period's credit, now.
            self.plans.tick(now_unix()).await.map_err(internal)?;
        }
        let mut v = self.view(&rec).await?;
        v["key"] = json!(secret);
        Ok(v)
    }

    /// `PATCH /admin/keys/{id}` (and the console's forms): the key's new view.
    /// Revoke a key for good (its records stay); the key's view.
    pub(crate) async fn revoke_key(&self, id: &str) -> std::result::Result<Value, ApiError> {
        let mut rec = self.key(id).await?;
        if rec.revoked_at.is_none() {
            rec.revoked_at = Some(now_unix());
            rec.enabled = false;
            self.keys.put_key(&rec).await.map_err(internal)?;
            log::info!("admin: key '{}' ({}) revoked", rec.name, rec.id);
        }
        self.view(&rec).await
    }

    /// A new secret for a key; the previous one is accepted `grace_secs` more. The key's view
    /// with the new secret (`key`), shown this once.
    pub(crate) async fn rotate_key(&self, id: &str, grace_secs: u64) -> std::result::Result<Value, ApiError> {
        if grace_secs > MAX_GRACE_SECS {
            return Err(bad(format!("grace_secs: 0 to {MAX_GRACE_SECS} (30 days)")).with_param("grace_secs"));
        }
        let mut rec = self.key(id).await?;
        if rec.revoked_at.is_some() {
            return Err(ApiError::new(ErrorKind::Conflict, format!("Key '{id}' was revoked; create a new key.")));
        }
        if rec.origin == crate::records::key::KeyOrigin::Identity {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("Key '{id}' is a person's, used with the identity provider's tokens: it has no secret to rotate (disable it to shut the person out)."),
            ));
        }
        if rec.origin == crate::records::key::KeyOrigin::Config {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("Key '{id}' comes from the configuration file: change its secret there (and reload)."),
            ));
        }
        let secret = new_secret();
        let previous = std::mem::replace(&mut rec.key_hash, hex(&hash_key(&secret)));
        rec.rotated = (grace_secs > 0).then(|| crate::records::key::Rotation { previous_hash: previous, until: now_unix() + grace_secs });
        self.keys.put_key(&rec).await.map_err(internal)?;
        log::info!("admin: key '{}' ({}) rotated; the previous secret is accepted for {grace_secs} s", rec.name, rec.id);
        let mut v = self.view(&rec).await?;
        v["key"] = json!(secret);
        Ok(v)
    }

    pub(crate) async fn patch_key(&self, id: &str, mut patch: PatchKey) -> std::result::Result<Value, ApiError> {
        let patch_sets_expiry = patch.expires_at.is_some() || patch.ttl_secs.is_some();
        let mut rec = self.key(id).await?;
        if let Some(group) = patch.group.take() {
            if !self.routing.load().catalog.has_group(&group) {
                return Err(bad(format!("group: no group named '{group}'")).with_param("group"));
            }
            rec.group = group;
        }
        if let Some(name) = patch.name.take() {
            if name.trim().is_empty() {
                return Err(bad("name: must not be empty"));
            }
            rec.name = name;
        }
        if let Some(enabled) = patch.enabled {
            if enabled && rec.revoked_at.is_some() {
                return Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!("Key '{id}' was revoked; revoked keys stay revoked. Create a new key."),
                ));
            }
            rec.enabled = enabled;
        }
        if let Some(rpm) = patch.rpm {
            rec.rpm = rpm;
        }
        if let Some(tpm) = patch.tpm {
            rec.tpm = tpm;
        }
        if let Some(max) = patch.max_concurrent {
            if max == Some(0) {
                return Err(bad("max_concurrent: at least 1"));
            }
            rec.max_concurrent = max;
        }
        // Policy fields: `null` clears one, absent leaves it; the result is validated whole.
        let current = &rec.policy;
        let mut input = current.input();
        match (patch.expires_at.take(), patch.ttl_secs) {
            (None, None) => {}
            (Some(at), ttl) => input.expires_at = expiry_text(at, ttl)?,
            (None, ttl) => input.expires_at = expiry_text(None, ttl)?,
        }
        patch.patch_policy(&mut input);
        // An expiry already stored is kept even if it passed (the key is then simply expired).
        let now = match (current.expires_at, patch_sets_expiry) {
            (Some(at), false) => now_unix().min(at.saturating_sub(1)),
            _ => now_unix(),
        };
        rec.policy = crate::policy::KeyPolicy::parse(input, now).map_err(policy_error)?;
        self.check_account(&rec.policy)?;
        let delta = patch.balance_delta.map(|d| to_nanos("balance_delta", d)).transpose()?;
        let reason = checked_reason(patch.reason, delta)?;
        let replanned = match patch.plan {
            Some(plan) => self.set_plan(&rec.id.clone(), &format!("key {}", rec.id), &mut rec.plan, plan).await?,
            None => false,
        };
        if let Some(delta) = delta {
            self.ledger.top_up_because(&rec.id, delta, reason.as_deref()).await.map_err(internal)?;
        }
        self.keys.put_key(&rec).await.map_err(internal)?;
        if replanned {
            self.plans.tick(now_unix()).await.map_err(internal)?;
        }
        self.view(&rec).await
    }

    /// A request body, at most [`MAX_ADMIN_BODY`] bytes.
    pub(crate) async fn read_body(session: &mut Session) -> std::result::Result<Vec<u8>, ApiError> {
        let mut body = Vec::new();
        while let Some(chunk) = session.read_request_body().await.map_err(|_| bad("The request body could not be read."))? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_ADMIN_BODY {
                return Err(ApiError::new(ErrorKind::PayloadTooLarge, "The request body is too large."));
            }
        }
        Ok(body)
    }

    pub(super) async fn read_json<T: for<'de> Deserialize<'de>>(session: &mut Session) -> std::result::Result<T, ApiError> {
        let body = Self::read_body(session).await?;
        if body.iter().all(u8::is_ascii_whitespace) {
            return parse_json(b"{}");
        }
        parse_json(&body)
    }

    /// Refuses a request that names another host or comes from another web page (DNS
    /// rebinding, cross-site forms): the API and the console alike.
    pub(crate) fn refuse_foreign(&self, req: &pingora_http::RequestHeader) -> std::result::Result<(), ApiError> {
        let host = req.headers.get(http::header::HOST).and_then(|v| v.to_str().ok()).or_else(|| req.uri.authority().map(|a| a.as_str()));
        if !host_allowed(host, &self.hosts) {
            self.metrics.counter("tollgate_admin_refused_total", &[("reason", "host")]).add(1);
            return Err(ApiError::new(
                ErrorKind::Forbidden,
                "The admin API answers only requests to localhost or a loopback address (or a name in admin.hosts).",
            ));
        }
        let origin = req.headers.get(http::header::ORIGIN).map(|v| v.to_str().unwrap_or("invalid"));
        if !origin_allowed(origin, host) {
            self.metrics.counter("tollgate_admin_refused_total", &[("reason", "origin")]).add(1);
            return Err(ApiError::new(ErrorKind::Forbidden, "The admin API does not answer requests made by other web pages."));
        }
        Ok(())
    }

    /// The alerts decided about `owner` (a key id or `acct:<name>`), newest first: what each
    /// said, and whether it was delivered.
    pub(crate) async fn alerts(&self, owner: &str, limit: usize) -> std::result::Result<Vec<Value>, ApiError> {
        let Some(n) = &self.notifier else { return Ok(Vec::new()) };
        let found = n.outbox().of(owner, limit).await.map_err(internal)?;
        Ok(found
            .into_iter()
            .map(|d| {
                let payload: Value = serde_json::from_str(&d.payload).unwrap_or(Value::Null);
                json!({"id": d.id, "type": d.kind, "notification": d.notification, "status": d.status, "attempts": d.attempts,
                       "created_at": crate::protocol::rfc3339(d.created_at), "last_error": d.last_error, "data": payload["data"]})
            })
            .collect())
    }

    /// `GET /admin/audit`: a page of the audit trail, newest first.
    async fn audit_page(&self, query: Option<&str>) -> std::result::Result<Value, ApiError> {
        // `?limit=` (1 to 1000, 100 by default) and `?cursor=` (a page's `next`).
        let query = query.unwrap_or_default();
        let param = |name: &str| query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='));
        let limit = match param("limit") {
            None => 100,
            Some(v) => {
                v.parse::<usize>().ok().filter(|n| (1..=1000).contains(n)).ok_or_else(|| bad("limit: 1 to 1000").with_param("limit"))?
            }
        };
        let before = match param("cursor") {
            None => None,
            Some(v) => Some(
                crate::records::log::Cursor::parse(&crate::base::text::decode_component(v))
                    .ok_or_else(|| bad("cursor: the `next` of a previous page").with_param("cursor"))?,
            ),
        };
        // One more than the page says whether there is a next one.
        let mut entries = self.ledger.audit(limit + 1, before).await.map_err(internal)?;
        let more = entries.len() > limit;
        entries.truncate(limit);
        let next = more.then(|| entries.last().map(|e| e.cursor().to_string())).flatten();
        let data: Vec<Value> = entries.iter().map(crate::records::audit::AuditEntry::to_json).collect();
        Ok(json!({"object": "list", "data": data, "next": next}))
    }

    /// One request to the admin API (the listener answers `/console` with the console's pages
    /// before this).
    pub(crate) async fn handle(&self, session: &mut Session) -> std::result::Result<LocalResponse, ApiError> {
        self.refuse_foreign(session.req_header())?;
        let req = session.req_header();
        let method = req.method.as_str().to_string();
        let path = req.uri.path().to_string();
        if method == "GET" && path == "/healthz" {
            return Ok(LocalResponse::json(200, &json!({"status": "ok"})));
        }
        if method == "GET" && path == "/readyz" {
            return Ok(self.readiness());
        }
        let presented =
            req.headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or_default();
        if !token_matches(presented, &self.token) {
            return Err(ApiError::new(ErrorKind::Unauthorized, "Missing or wrong admin token."));
        }
        match (method.as_str(), path.as_str()) {
            ("GET", "/metrics") => self.scrape.response().await,
            ("GET", "/admin/keys") => {
                let mut data = Vec::new();
                for rec in self.keys.all_keys().await.map_err(internal)? {
                    data.push(self.view(&rec).await?);
                }
                Ok(LocalResponse::json(200, &json!({"object": "list", "data": data})))
            }
            ("POST", "/admin/keys") => {
                let body: CreateKey = Self::read_json(session).await?;
                Ok(LocalResponse::json(201, &self.create_key(body).await?))
            }
            (m, p) if p == "/admin/accounts" || p.starts_with("/admin/accounts/") => self.account_request(session, m, p).await,
            (m, p) if p == "/admin/codes" || p.starts_with("/admin/codes/") => self.codes_request(session, m, p).await,
            (m, p) if p == "/admin/prices" || p.starts_with("/admin/prices/") => self.prices_request(m, p).await,
            (m, "/admin/cache") => self.cache_request(m, req_query(session).as_deref()).await,
            ("GET", "/admin/requests") => {
                let filter = request_filter(req_query(session).as_deref())?;
                let (entries, next) = self.store.requests().query(&filter).await.map_err(internal)?;
                let data: Vec<Value> = entries.iter().map(crate::records::log::LogEntry::to_json).collect();
                Ok(LocalResponse::json(200, &json!({"object": "list", "data": data, "next": next.map(|c| c.to_string())})))
            }
            ("GET", p) if p.starts_with("/admin/requests/") => {
                let id = p.trim_start_matches("/admin/requests/");
                let filter = crate::records::log::Filter { id: Some(id.to_string()), end_ms: u64::MAX, limit: 1, ..Default::default() };
                let (entries, _) = self.store.requests().query(&filter).await.map_err(internal)?;
                match entries.first() {
                    Some(e) => Ok(LocalResponse::json(200, &e.to_json())),
                    None => Err(ApiError::new(ErrorKind::NotFound, format!("No request with id '{id}' in the log."))),
                }
            }
            ("GET", "/admin/audit") => Ok(LocalResponse::json(200, &self.audit_page(req_query(session).as_deref()).await?)),
            ("GET", "/admin/usage") => self.usage_by(req_query(session).as_deref()).await,
            ("GET", "/admin/alerts") => {
                // `?owner=<key id>` or `?owner=acct:<name>`: what was decided about it, newest first.
                let query = req_query(session).unwrap_or_default();
                let owner = query.split('&').find_map(|p| p.strip_prefix("owner=")).map(crate::base::text::decode_component);
                let owner = owner
                    .filter(|o| !o.is_empty() && o.len() <= 200)
                    .ok_or_else(|| bad("owner: a key id or acct:<name>").with_param("owner"))?;
                let data = self.alerts(&owner, 100).await?;
                Ok(LocalResponse::json(200, &json!({"object": "list", "data": data})))
            }
            ("GET", p) if p.starts_with("/admin/keys/") && p.ends_with("/usage") => {
                let id = p.trim_start_matches("/admin/keys/").trim_end_matches("/usage").to_string();
                let rec = self.key(&id).await?;
                let query = req_query(session);
                let (start, end) = crate::billing::ledger::usage_window(query.as_deref())?;
                let by = crate::billing::ledger::usage_grouping(query.as_deref())?;
                let calendar = self.routing.load().calendar.clone();
                let mut report = self.ledger.key_usage(&rec, start, end, &by, &calendar).await.map_err(internal)?;
                if let Some(r) = &rec.plan {
                    report["plan"] = json!(self.plans.standing(&rec.id, r, now_unix()).await.map_err(internal)?);
                }
                Ok(LocalResponse::json(200, &report))
            }
            ("GET", p) if p.starts_with("/admin/keys/") => {
                let rec = self.key(p.trim_start_matches("/admin/keys/")).await?;
                Ok(LocalResponse::json(200, &self.view(&rec).await?))
            }
            ("DELETE", p) if p.starts_with("/admin/keys/") => {
                Ok(LocalResponse::json(200, &self.revoke_key(p.trim_start_matches("/admin/keys/")).await?))
            }
            ("POST", p) if p.starts_with("/admin/keys/") && p.ends_with("/rotate") => {
                let id = p.trim_start_matches("/admin/keys/").trim_end_matches("/rotate").to_string();
                let body: RotateKey = Self::read_json(session).await?;
                Ok(LocalResponse::json(200, &self.rotate_key(&id, body.grace_secs).await?))
            }
            ("PATCH", p) if p.starts_with("/admin/keys/") => {
                let id = p.trim_start_matches("/admin/keys/").to_string();
                let patch: PatchKey = Self::read_json(session).await?;
                Ok(LocalResponse::json(200, &self.patch_key(&id, patch).await?))
            }
            _ => Err(ApiError::new(ErrorKind::NotFound, format!("Unknown admin endpoint: {method} {path}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicyInput;

    #[test]
    fn only_loopback_hosts_and_the_listeners_own_origin_are_answered() {
        let none: &[String] = &[];
        for ok in ["localhost", "LOCALHOST:8081", "127.0.0.1", "127.0.0.1:8081", "127.9.0.1:1", "[::1]", "[::1]:8081"] {
            assert!(host_allowed(Some(ok), none), "{ok}");
        }
        for bad in
            ["rebind.evil.example", "rebind.evil.example:8081", "10.0.0.1:8081", "[::2]:1", "localhost:x", "", "[::1", "localhost.evil"]
        {
            assert!(!host_allowed(Some(bad), none), "{bad}");
        }
        assert!(!host_allowed(None, none));
        assert!(host_allowed(Some("admin.internal:8081"), &["admin.internal".to_string()]));
        assert!(origin_allowed(None, Some("127.0.0.1:8081")));
        assert!(origin_allowed(Some("http://127.0.0.1:8081"), Some("127.0.0.1:8081")));
        assert!(!origin_allowed(Some("http://rebind.evil.example"), Some("127.0.0.1:8081")));
        assert!(!origin_allowed(Some("null"), Some("127.0.0.1:8081")));
    }

    #[test]
    fn a_type_error_names_its_field() {
        let e = parse_json::<CreateKey>(br#"{"name": "k", "balance": "lots"}"#).err().expect("refused");
        assert_eq!(e.param.as_deref(), Some("balance"), "{}", e.message);
        assert!(
            e.message.starts_with("Invalid field 'balance': invalid type: string \"lots\"") && !e.message.contains("line 1"),
            "{}",
            e.message
        );
        let e = parse_json::<CreateKey>(br#"{"name": "k", "budgets": {"day": "x"}}"#).err().expect("refused");
        assert_eq!(e.param.as_deref(), Some("budgets.day"), "{}", e.message);
        let e = parse_json::<CreateKey>(br#"{"name": "k"} trailing"#).err().expect("refused");
        assert!(e.message.starts_with("Invalid JSON"), "{}", e.message);
        assert!(parse_json::<CreateKey>(br#"{"name": "k"}"#).is_ok());
    }

    #[test]
    fn token_comparison_and_secrets() {
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abd", "abc"));
        assert!(!token_matches("", "abc"));
        let s = new_secret();
        assert!(s.starts_with("sk-tg-") && s.len() == 46);
        assert_ne!(s, new_secret());
    }

    /// The key-policy fields are declared once (`with_key_policy!`): the create body takes each
    /// into the policy input, and a patch clears one with `null` and leaves what it does not name.
    #[test]
    fn the_policy_fields_of_a_create_and_a_patch_are_the_policy_inputs() {
        let every = br#"{"name": "k", "expires_at": "2030-01-01T00:00:00Z", "models": {"allow": ["a*"]}, "ip_allow": ["10.0.0.0/8"],
            "max_request_cost": 2.5, "max_output_tokens": 100, "default_output_tokens": 50, "budgets": {"day": 1.0},
            "account": "acme", "tags": {"team": "x"}, "tools": {"deny": ["t"]}, "tool_rpm": 7}"#;
        let input = parse_json::<CreateKey>(every).expect("parsed").policy_input();
        assert_eq!(input.expires_at.as_deref(), Some("2030-01-01T00:00:00Z"));
        assert_eq!((input.max_request_cost, input.max_output_tokens, input.default_output_tokens), (Some(2.5), Some(100), Some(50)));
        assert_eq!((input.account.as_deref(), input.tool_rpm), (Some("acme"), Some(7)));
        assert!(
            input.models.is_some() && input.ip_allow.is_some() && input.budgets.is_some() && input.tags.is_some() && input.tools.is_some()
        );
        let mut patch = parse_json::<PatchKey>(br#"{"tool_rpm": null, "max_output_tokens": 9}"#).expect("parsed");
        let mut patched = input.clone();
        patch.patch_policy(&mut patched);
        assert_eq!((patched.tool_rpm, patched.max_output_tokens), (None, Some(9)));
        assert_eq!(PolicyInput { tool_rpm: input.tool_rpm, max_output_tokens: input.max_output_tokens, ..patched }, input);
        assert!(parse_json::<PatchKey>(br#"{"tool_rmp": 1}"#).is_err(), "an unknown field is still refused");
    }
}
