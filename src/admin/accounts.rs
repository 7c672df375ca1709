//! Shared accounts (teams) in the admin API: create, change, show; and a holder's plan set
//! (a key's or an account's).

use super::api::{checked_reason, double_option, internal, to_nanos, AdminApi};
use crate::admin::refusal::{bad, policy_error};
use crate::base::clock::now_unix;
use crate::base::money::usd;
use crate::policy::budget::Owner;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use pingora_proxy::Session;
use serde::Deserialize;
use serde_json::{json, Value};

/// `POST /admin/accounts`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateAccount {
    name: String,
    /// USD.
    #[serde(default)]
    balance: f64,
    #[serde(default)]
    budgets: Option<crate::policy::budget::BudgetsInput>,
    #[serde(default)]
    guardrails: Option<Vec<String>>,
    /// What all its keys together may ask per minute and have in flight.
    #[serde(default)]
    rpm: Option<u32>,
    #[serde(default)]
    tpm: Option<u64>,
    #[serde(default)]
    max_concurrent: Option<u32>,
    /// What its keys are charged of the price table (1.25: a quarter more).
    #[serde(default)]
    price_multiplier: Option<crate::base::money::Multiplier>,
}

/// The most a team's Claude Code settings may hold (their JSON).
const MAX_CLAUDE_CODE_BYTES: usize = 64 << 10;

/// `PATCH /admin/accounts/{name}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PatchAccount {
    /// Its guardrails (`null` clears them).
    #[serde(default, deserialize_with = "double_option")]
    guardrails: Option<Option<Vec<String>>>,
    #[serde(default)]
    balance_delta: Option<f64>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default, deserialize_with = "double_option")]
    budgets: Option<Option<crate::policy::budget::BudgetsInput>>,
    /// The most the team's admins may allow their members' keys (`null`: no limit).
    #[serde(default, deserialize_with = "double_option")]
    member_limit: Option<Option<crate::admin::teams::CeilingInput>>,
    /// People put in the team (email or subject → role; `null` takes one out).
    #[serde(default)]
    people: Option<std::collections::BTreeMap<String, Option<String>>>,
    /// Its rate limits (`null` clears one).
    #[serde(default, deserialize_with = "double_option")]
    rpm: Option<Option<u32>>,
    #[serde(default, deserialize_with = "double_option")]
    tpm: Option<Option<u64>>,
    #[serde(default, deserialize_with = "double_option")]
    max_concurrent: Option<Option<u32>>,
    /// What its keys are charged of the price table (`null`: their group's).
    #[serde(default, deserialize_with = "double_option")]
    price_multiplier: Option<Option<crate::base::money::Multiplier>>,
    /// The plan it subscribes to (`null`: none).
    #[serde(default, deserialize_with = "double_option")]
    plan: Option<Option<String>>,
    /// Claude Code's managed settings of the team (`null`: none here; the file's still apply).
    #[serde(default, deserialize_with = "double_option")]
    claude_code: Option<Option<serde_json::Map<String, Value>>>,
}

impl AdminApi {
    /// `/admin/accounts` and `/admin/accounts/{name}`: list, create, show, change.
    pub(super) async fn account_request(&self, session: &mut Session, method: &str, path: &str) -> Result<LocalResponse, ApiError> {
        match (method, path) {
            ("GET", "/admin/accounts") => {
                let mut data = Vec::new();
                for account in self.keys.all_accounts().await.map_err(internal)? {
                    data.push(self.account_view(&account).await?);
                }
                Ok(LocalResponse::json(200, &json!({"object": "list", "data": data})))
            }
            ("POST", "/admin/accounts") => {
                let body: CreateAccount = Self::read_json(session).await?;
                Ok(LocalResponse::json(201, &self.create_account(body).await?))
            }
            ("GET", p) if p.starts_with("/admin/accounts/") && p.ends_with("/statement") => {
                let name = p.trim_start_matches("/admin/accounts/").trim_end_matches("/statement");
                self.account(name)?;
                let query = session.req_header().uri.query().unwrap_or_default().to_string();
                self.statement(name, &query).await
            }
            ("GET", p) if p.starts_with("/admin/accounts/") => {
                let account = self.account(p.trim_start_matches("/admin/accounts/"))?;
                Ok(LocalResponse::json(200, &self.account_view(&account).await?))
            }
            ("PATCH", p) if p.starts_with("/admin/accounts/") => {
                let name = p.trim_start_matches("/admin/accounts/");
                // An unknown account is a 404 whatever the body says.
                self.account(name)?;
                let patch: PatchAccount = Self::read_json(session).await?;
                Ok(LocalResponse::json(200, &self.patch_account(name, patch).await?))
            }
            _ => Err(ApiError::new(ErrorKind::NotFound, format!("Unknown admin endpoint: {method} {path}"))),
        }
    }

    /// `GET /admin/accounts/{name}/statement?month=YYYY-MM[&format=json]`: its statement, CSV
    /// by default (the console's download is the same).
    pub(crate) async fn statement(&self, name: &str, query: &str) -> Result<LocalResponse, ApiError> {
        let param = |k: &str| query.split('&').find_map(|p| p.strip_prefix(k)?.strip_prefix('=')).map(crate::base::text::decode_component);
        let month = param("month").ok_or_else(|| bad("month: YYYY-MM").with_param("month"))?;
        let calendar = self.routing.load().calendar.clone();
        let s = self.selling.statements.of(name, &month, &calendar).await.map_err(|e| match e {
            crate::selling::statement::StatementError::Month(m) => bad(m).with_param("month"),
            crate::selling::statement::StatementError::Store(e) => internal(e),
        })?;
        if param("format").as_deref() == Some("json") {
            let entries: Vec<Value> = s.entries.iter().map(crate::records::audit::AuditEntry::to_json).collect();
            let charges: Vec<Value> = s
                .charges
                .iter()
                .map(|((day, model), t)| json!({"day": day, "model": model, "requests": t.requests, "cost_nanos": t.cost_nanos}))
                .collect();
            return Ok(LocalResponse::json(
                200,
                &json!({"object": "statement", "account": s.account, "month": s.month, "opening_nanos": s.opening,
                        "entries": entries, "charges": charges, "closing_nanos": s.closing}),
            ));
        }
        let mut r = LocalResponse { status: 200, body: s.csv().into(), content_type: "text/csv; charset=utf-8", headers: Vec::new() };
        r.headers.push(("content-disposition", format!("attachment; filename=\"statement-{name}-{}.csv\"", s.month)));
        Ok(r)
    }

    /// An account as the admin API shows it.
    pub(super) async fn account_view(&self, account: &crate::records::key::AccountRecord) -> std::result::Result<Value, ApiError> {
        let balance = self.ledger.balance(&crate::policy::budget::account_purse(&account.name)).await.map_err(internal)?;
        let keys: Vec<Value> = self
            .keys
            .all_keys()
            .await
            .map_err(internal)?
            .iter()
            .filter(|k| k.policy.account.as_deref() == Some(account.name.as_str()))
            .map(|k| json!({"id": k.id, "name": k.name}))
            .collect();
        Ok(json!({
            "object": "account", "name": account.name, "balance": usd(balance),
            "budgets": self.windows(Owner::Account(&account.name), &account.budgets).await?,
            "created_at": account.created_at, "origin": account.origin, "keys": keys,
            "member_limit": account.member_limit.as_ref().map(crate::admin::teams::ceiling_view),
            "member_policy": account.member_policy.as_ref().map(crate::admin::teams::ceiling_view),
            "claude_code": account.claude_code,
            "people": account.people, "guardrails": account.guardrails,
            "rpm": account.rates.rpm, "tpm": account.rates.tpm, "max_concurrent": account.rates.max_concurrent,
            "price_multiplier": account.price_multiplier,
            "plan": account.plan.as_ref().map(|p| p.name.as_str()),
            "plan_standing": match &account.plan {
                Some(r) => self.plans.standing(&crate::policy::budget::account_purse(&account.name), r, now_unix()).await.map_err(internal)?,
                None => None,
            },
        }))
    }

    /// `POST /admin/accounts`: a new shared account with its opening balance.
    pub(super) async fn create_account(&self, body: CreateAccount) -> std::result::Result<Value, ApiError> {
        crate::policy::budget::valid_account_name(&body.name).map_err(|e| bad(format!("name: {e}")).with_param("name"))?;
        let balance = to_nanos("balance", body.balance)?;
        if balance < 0 {
            return Err(bad("balance: must not be negative").with_param("balance"));
        }
        let budgets = body.budgets.as_ref().map(crate::policy::budget::Budgets::parse).transpose().map_err(policy_error)?;
        let rates = crate::policy::limits::RateLimits { rpm: body.rpm, tpm: body.tpm, max_concurrent: body.max_concurrent };
        rates.validate().map_err(policy_error)?;
        if self.keys.all_accounts().await.map_err(internal)?.iter().any(|a| a.name == body.name) {
            return Err(ApiError::new(ErrorKind::Conflict, format!("An account named '{}' exists.", body.name)));
        }
        let account = crate::records::key::AccountRecord {
            name: body.name,
            budgets: budgets.unwrap_or_default(),
            created_at: now_unix(),
            origin: crate::records::key::KeyOrigin::Admin,
            seed_digest: None,
            member_limit: None,
            member_policy: None,
            people: Default::default(),
            guardrails: self.known_guardrails(body.guardrails.unwrap_or_default())?,
            rates,
            price_multiplier: body.price_multiplier,
            plan: None,
            claude_code: None,
            cache: None,
        };
        self.ledger.open_account(&crate::policy::budget::account_purse(&account.name), balance).await.map_err(internal)?;
        self.keys.put_account(&account).await.map_err(internal)?;
        self.account_view(&account).await
    }

    /// `PATCH /admin/accounts/{name}`: its budgets, and a balance move with its reason.
    pub(super) async fn patch_account(&self, name: &str, patch: PatchAccount) -> std::result::Result<Value, ApiError> {
        let mut account = (*self.account(name)?).clone();
        if let Some(guardrails) = patch.guardrails {
            account.guardrails = self.known_guardrails(guardrails.unwrap_or_default())?;
        }
        if let Some(budgets) = patch.budgets {
            account.budgets =
                budgets.as_ref().map(crate::policy::budget::Budgets::parse).transpose().map_err(policy_error)?.unwrap_or_default();
        }
        if let Some(rpm) = patch.rpm {
            account.rates.rpm = rpm;
        }
        if let Some(tpm) = patch.tpm {
            account.rates.tpm = tpm;
        }
        if let Some(max) = patch.max_concurrent {
            account.rates.max_concurrent = max;
        }
        account.rates.validate().map_err(policy_error)?;
        let repriced = patch.price_multiplier.filter(|m| *m != account.price_multiplier);
        if let Some(m) = repriced {
            account.price_multiplier = m;
        }
        if let Some(settings) = patch.claude_code {
            if settings.as_ref().is_some_and(|s| serde_json::to_vec(s).map_or(usize::MAX, |v| v.len()) > MAX_CLAUDE_CODE_BYTES) {
                return Err(ApiError::new(ErrorKind::BadRequest, "claude_code: at most 64 KiB of settings").with_param("claude_code"));
            }
            account.claude_code = settings;
        }
        if let Some(limit) = patch.member_limit {
            account.member_limit = limit.map(crate::admin::teams::CeilingInput::parse).transpose()?;
        }
        let people_changed = match patch.people {
            Some(people) => {
                let what: Vec<String> = people.iter().map(|(who, role)| format!("{who}: {}", role.as_deref().unwrap_or("out"))).collect();
                crate::admin::teams::set_people(&mut account, people)?;
                Some(what.join(", "))
            }
            None => None,
        };
        let delta = patch.balance_delta.map(|d| to_nanos("balance_delta", d)).transpose()?;
        let reason = checked_reason(patch.reason, delta)?;
        let replanned = match patch.plan {
            Some(plan) => {
                let purse = crate::policy::budget::account_purse(&account.name);
                self.set_plan(&purse, &format!("account {}", account.name), &mut account.plan, plan).await?
            }
            None => false,
        };
        self.keys.put_account(&account).await.map_err(internal)?;
        if replanned {
            self.plans.tick(now_unix()).await.map_err(internal)?;
        }
        if let Some(delta) = delta {
            let id = crate::policy::budget::account_purse(&account.name);
            self.ledger.top_up_because(&id, delta, reason.as_deref()).await.map_err(internal)?;
        }
        if let Some(m) = repriced {
            let id = crate::policy::budget::account_purse(&account.name);
            let to = m.map_or_else(|| "its group's".to_string(), |m| m.as_f64().to_string());
            let why = format!("price multiplier of account {} set to {to} through the admin API", account.name);
            self.ledger.top_up_because(&id, 0, Some(&why)).await.map_err(internal)?;
        }
        if let Some(what) = people_changed {
            let id = crate::policy::budget::account_purse(&account.name);
            let why = format!("people of team {} set through the admin API ({what})", account.name);
            self.ledger.top_up_because(&id, 0, Some(&why)).await.map_err(internal)?;
        }
        self.account_view(&account).await
    }

    /// A holder's plan set to `to` (None: no plan): a name the file has, or 400. Leaving a plan
    /// closes its current period at once (its unused credit expires, nothing rolls over into
    /// another plan); the new plan's first period starts now (a calendar plan: the current
    /// day, week or month, its credit granted whole). Audited. True when it changed.
    pub(super) async fn set_plan(
        &self,
        purse: &str,
        who: &str,
        current: &mut Option<crate::policy::plan::PlanRef>,
        to: Option<String>,
    ) -> std::result::Result<bool, ApiError> {
        if let Some(name) = to.as_deref().filter(|n| self.keys.plans().get(n).is_none()) {
            return Err(bad(format!("plan: no plan named '{name}'")).with_param("plan"));
        }
        self.plans.switch(purse, who, current, to, "the admin API").await.map_err(internal)
    }
}
