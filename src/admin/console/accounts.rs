//! The operator's pages for shared accounts (teams), groups and plans: what each is charged of
//! the price table, the plan it is under and where that stands, an account's spend windows
//! (spent, held, cap, when a rolling window frees) and limits. An account's plan, multiplier
//! and limits are changed through `AdminApi::patch_account`, as the admin API changes them.

use super::html::{self, count, enc, esc, money};
use super::keys::{general_alerts, plan_line, window_rows};
use super::page::*;
use super::{redirect, Form, Request};
use crate::admin::api::AdminApi;
use crate::protocol::{ApiError, ErrorKind};
use serde_json::{json, Map, Value};
use std::fmt::Write;

/// The account form's fields: (name, label, hint).
const FIELDS: [(&str, &str, &str); 5] = [
    ("plan", "Plan", "a plan's name; empty: none (leaving one expires its unused credit)"),
    ("price_multiplier", "Price multiplier", "what its keys are charged of the price table; empty: their group's"),
    ("rpm", "rpm", "requests a minute of all its keys together; empty: no limit"),
    ("tpm", "tpm", "tokens a minute of all its keys together"),
    ("max_concurrent", "Concurrent", "calls in flight at once of all its keys"),
];

/// What an account, a plan or a group charges of the price table (`—` at the table's).
fn times(m: Option<f64>) -> String {
    m.filter(|m| *m != 1.0).map_or_else(|| "—".to_string(), |m| format!("{m}×"))
}

fn limits(v: &Value) -> String {
    let parts: Vec<String> = [("rpm", "rpm"), ("tpm", "tpm"), ("max_concurrent", "in flight")]
        .iter()
        .filter_map(|(field, label)| v[*field].as_u64().map(|n| format!("{} {label}", count(n))))
        .collect();
    if parts.is_empty() {
        "—".into()
    } else {
        parts.join(", ")
    }
}

/// `GET /console/accounts`.
pub(super) async fn accounts(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    api.ledger.commit_now().await.map_err(internal)?;
    let mut rows = Vec::new();
    for account in api.keys.all_accounts().await.map_err(internal)? {
        let view = api.account_view(&account).await?;
        let plan = view["plan"].as_str().map_or_else(|| "—".to_string(), esc);
        rows.push(vec![
            format!("<a href=\"/console/accounts/{}\">{}</a>", enc(&account.name), esc(&account.name)),
            money(view["balance"].as_f64().unwrap_or(0.0)),
            plan,
            times(view["price_multiplier"].as_f64()),
            limits(&view),
            count(view["keys"].as_array().map_or(0, |k| k.len() as u64)),
        ]);
    }
    let body = format!(
        "<p>Accounts hold money their keys share; a team is an account. Their spend windows and limits count every call of \
every key under them.</p>{}",
        html::table("accounts", &["Account", "Balance", "Plan", "Price multiplier", "Limits", "Keys"], &rows, None)
    );
    Ok(clock.page("Accounts", "/console/accounts", &req.csrf, &body))
}

/// The account named in a page's path; a name no account could have is not echoed back.
fn known(api: &AdminApi, name: &str) -> Result<std::sync::Arc<crate::records::key::AccountRecord>, ApiError> {
    match crate::policy::budget::valid_account_name(name) {
        Ok(()) => api.account(name),
        Err(_) => Err(ApiError::new(ErrorKind::NotFound, "No such account.")),
    }
}

/// `GET /console/accounts/{name}`; `error` is a refused form shown under its fields.
pub(super) async fn account(api: &AdminApi, req: &Request, name: &str, error: Option<(&ApiError, &Form)>) -> Page {
    let clock = Clock::now(api);
    let record = known(api, name)?;
    api.ledger.commit_now().await.map_err(internal)?;
    let view = api.account_view(&record).await?;
    let done = done_notice(&req.query);
    let errors: Vec<(&str, &str)> = error.map(|(e, _)| (e.param.as_deref().unwrap_or(""), e.message.as_str())).into_iter().collect();
    let general = general_alerts(&errors, &FIELDS.map(|f| f.0));
    let charged = match (view["price_multiplier"].as_f64(), record.plan.as_ref().and_then(|r| api.keys.plans().get(&r.name).cloned())) {
        (_, Some(plan)) if plan.price_multiplier.is_some() => {
            format!("its plan's <strong>{}</strong>", times(plan.price_multiplier.map(|m| m.as_f64())))
        }
        (Some(m), _) => format!("<strong>{}</strong>", times(Some(m))),
        (None, _) => "its keys' groups' multipliers".to_string(),
    };
    let key_rows: Vec<Vec<String>> = view["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| {
            let (id, name) = (k["id"].as_str().unwrap_or_default(), k["name"].as_str().unwrap_or_default());
            vec![format!("<a href=\"/console/keys/{}\">{}</a> <span class=\"mono\">{}</span>", enc(id), esc(name), esc(id))]
        })
        .collect();
    let value = |field: &str| -> String {
        if let Some((_, f)) = error {
            return f.get(field).to_string();
        }
        match &view[field] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => String::new(),
        }
    };
    let mut fields = String::new();
    for (field, label, hint) in FIELDS {
        fields.push_str(&html::field_of(field, label, &value(field), &errors, hint));
    }
    fields.push_str(&html::field_of(
        "amount",
        "Add to balance (USD)",
        error.map_or("", |(_, f)| f.get("amount")),
        &errors,
        "negative takes back",
    ));
    fields.push_str(&html::field_of("reason", "Reason", error.map_or("", |(_, f)| f.get("reason")), &errors, "kept in the audit trail"));
    let form = html::form(
        &format!("/console/accounts/{}", enc(name)),
        &req.csrf,
        "card grid",
        &format!("{fields}<p><button type=\"submit\">Save</button></p>"),
    );
    let settings =
        claude_code_form(req, name, &record, error.filter(|(_, f)| f.get("form") == "claude_code").map(|(_, f)| f.get("claude_code")));
    let body = format!(
        "{done}{general}<section class=\"card\"><p>Balance <strong id=\"balance\">{}</strong> · charged {charged} of the price table · \
limits: <span id=\"limits\">{}</span></p>{}</section><h2>Spend windows</h2>{}<h2>Plan, multiplier and limits</h2>{form}\
<h2>Claude Code managed settings</h2>{settings}<h2>Keys</h2>{}",
        money(view["balance"].as_f64().unwrap_or(0.0)),
        limits(&view),
        plan_line(&view["plan_standing"]),
        html::table("windows", &["Window", "Cap", "Spent", "Held", "Ends (rolling: frees)"], &window_rows(&view), None),
        html::table("account-keys", &["Key"], &key_rows, None),
    );
    let mut page = clock.page(&format!("Account {name}"), "/console/accounts", &req.csrf, &body);
    if error.is_some() {
        page.status = 400;
    }
    Ok(page)
}

/// The team's Claude Code settings as a form: the stored JSON (or what was refused), editable.
fn claude_code_form(req: &Request, name: &str, record: &crate::records::key::AccountRecord, refused: Option<&str>) -> String {
    let stored = record.claude_code.as_ref().map(|m| serde_json::to_string_pretty(m).unwrap_or_default()).unwrap_or_default();
    let text = refused.map_or(stored, str::to_string);
    html::form(
        &format!("/console/accounts/{}", enc(name)),
        &req.csrf,
        "card",
        &format!(
            "<p>What the team's people signed in with Claude Code get from <code>/managed/settings</code>: the file's \
<code>default</code> and team settings, then these (a JSON object, as <code>managed-settings.json</code> holds it; empty: none), \
then their role's.</p><input type=\"hidden\" name=\"form\" value=\"claude_code\"><label for=\"claude_code\">Settings</label>\
<textarea id=\"claude_code\" name=\"claude_code\" rows=\"8\" class=\"mono\" spellcheck=\"false\">{}</textarea>\
<p><button type=\"submit\" id=\"save-claude-code\">Save settings</button></p>",
            esc(&text)
        ),
    )
}

/// The settings form as an admin API patch (`claude_code`: an object, or null when empty).
fn claude_code_patch(f: &Form) -> Result<Value, ApiError> {
    let text = f.get("claude_code").trim();
    if text.is_empty() {
        return Ok(json!({"claude_code": null}));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(json!({"claude_code": m})),
        Ok(_) => Err(bad("claude_code", "claude_code: a JSON object of settings (as managed-settings.json holds them)".to_string())),
        Err(e) => Err(bad("claude_code", format!("claude_code: not JSON ({e})"))),
    }
}

/// The account form as an admin API patch: every field set as the form says (empty clears).
fn patch_of(f: &Form, by: Option<&str>) -> Result<Value, ApiError> {
    let mut patch = Map::new();
    let plan = f.get("plan");
    patch.insert("plan".into(), if plan.is_empty() { Value::Null } else { json!(plan) });
    let multiplier = number(f, "price_multiplier", false)?;
    if let Some(m) = multiplier.as_ref().and_then(Value::as_f64) {
        if crate::base::money::Multiplier::new(m).is_none() {
            return Err(bad("price_multiplier", format!("price_multiplier: a number above 0 and at most 1000, not {m}")));
        }
    }
    patch.insert("price_multiplier".into(), multiplier.unwrap_or(Value::Null));
    for field in ["rpm", "tpm", "max_concurrent"] {
        patch.insert(field.into(), number(f, field, true)?.unwrap_or(Value::Null));
    }
    if let Some(amount) = number(f, "amount", false)? {
        patch.insert("balance_delta".into(), amount);
        let reason = operator_reason(by, f.get("reason"));
        if !reason.is_empty() {
            patch.insert("reason".into(), json!(reason));
        }
    }
    Ok(Value::Object(patch))
}

/// `POST /console/accounts/{name}`.
pub(super) async fn account_action(api: &AdminApi, req: &Request, name: &str) -> Page {
    known(api, name)?;
    let f = &req.form;
    let patch = if f.get("form") == "claude_code" { claude_code_patch(f) } else { patch_of(f, req.by.as_deref()) };
    let result = match patch {
        Ok(patch) => match serde_json::from_value(patch) {
            Ok(patch) => api.patch_account(name, patch).await,
            Err(e) => Err(ApiError::new(ErrorKind::BadRequest, format!("{e}"))),
        },
        Err(e) => Err(e),
    };
    match result {
        Ok(_) => {
            if let Some(by) = &req.by {
                let purse = crate::policy::budget::account_purse(name);
                api.ledger.top_up_because(&purse, 0, Some(&format!("account {name} edited by {by} (operator)"))).await.map_err(internal)?;
            }
            Ok(redirect(&format!("/console/accounts/{}?done={}", enc(name), enc("Saved."))))
        }
        Err(e) if e.status() == 400 || e.status() == 409 => account(api, req, name, Some((&e, f))).await,
        Err(e) => Err(e),
    }
}

/// `GET /console/groups`: every group with what it charges of the price table, and every plan
/// with who is under it.
pub(super) async fn groups(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let accounts = api.keys.all_accounts().await.map_err(internal)?;
    let routing = api.routing.load();
    let group_rows: Vec<Vec<String>> = routing
        .catalog
        .groups()
        .iter()
        .map(|(name, g)| {
            let platforms: Vec<String> = g.platforms.iter().map(|p| format!("{p:?}").to_lowercase()).collect();
            vec![
                esc(name),
                times(Some(g.price_multiplier.as_f64())),
                esc(&platforms.join(", ")),
                esc(&if g.guardrails.is_empty() { "—".to_string() } else { g.guardrails.join(", ") }),
                count(keys.iter().filter(|k| &k.group == name).count() as u64),
            ]
        })
        .collect();
    let plans = api.keys.plans();
    let mut plan_rows = Vec::new();
    for (name, plan) in plans.iter() {
        let mut holders: Vec<String> = accounts
            .iter()
            .filter(|a| a.plan.as_ref().is_some_and(|p| &p.name == name))
            .map(|a| format!("<a href=\"/console/accounts/{}\">{}</a>", enc(&a.name), esc(&a.name)))
            .collect();
        let keyed = keys.iter().filter(|k| k.revoked_at.is_none() && k.plan.as_ref().is_some_and(|p| &p.name == name)).count();
        if keyed > 0 {
            holders.push(format!("{} key{}", count(keyed as u64), if keyed == 1 { "" } else { "s" }));
        }
        let rollover = match plan.rollover {
            crate::policy::plan::Rollover::None => "no".to_string(),
            crate::policy::plan::Rollover::All => "all".to_string(),
            crate::policy::plan::Rollover::UpTo(cap) => format!("up to {}", html::nanos(cap)),
        };
        let mut windows = String::new();
        for (label, cap) in serde_json::to_value(plan.budgets.input()).unwrap_or_default().as_object().into_iter().flatten() {
            let _ = write!(windows, "{}{} {}", if windows.is_empty() { "" } else { ", " }, esc(label), money(cap.as_f64().unwrap_or(0.0)));
        }
        let rates = json!({"rpm": plan.rates.rpm, "tpm": plan.rates.tpm});
        plan_rows.push(vec![
            esc(name),
            html::nanos(plan.credit),
            esc(&plan.period.label()),
            rollover,
            times(plan.price_multiplier.map(|m| m.as_f64())),
            if windows.is_empty() { "—".into() } else { windows },
            limits(&rates),
            if holders.is_empty() { "—".into() } else { holders.join(", ") },
        ]);
    }
    let body = format!(
        "<p>A key is charged its plan's multiplier, else its account's, else its group's (— is the price table as written). \
Groups and plans are set in the configuration file.</p><h2>Groups</h2>{}<h2>Plans</h2>{}",
        html::table("groups", &["Group", "Price multiplier", "Platforms", "Guardrails", "Keys"], &group_rows, None),
        html::table(
            "plans",
            &["Plan", "Credit", "Period", "Rollover", "Price multiplier", "Spend windows", "Limits", "Under it"],
            &plan_rows,
            None
        ),
    );
    Ok(clock.page("Groups and plans", "/console/groups", &req.csrf, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_form_becomes_a_patch_that_clears_empty_fields_and_names_the_operator() {
        let f = Form::parse("plan=starter&price_multiplier=0.8&rpm=&tpm=900&max_concurrent=&amount=5&reason=renewal");
        let patch = patch_of(&f, Some("ops@example.com")).unwrap();
        assert_eq!(patch["plan"], json!("starter"));
        assert_eq!(patch["price_multiplier"], json!(0.8));
        assert_eq!((&patch["rpm"], &patch["tpm"], &patch["max_concurrent"]), (&Value::Null, &json!(900), &Value::Null));
        assert_eq!(patch["balance_delta"], json!(5.0));
        assert_eq!(patch["reason"], json!("renewal (by ops@example.com, operator)"));
        let cleared = patch_of(&Form::parse("plan=&price_multiplier="), None).unwrap();
        assert_eq!((&cleared["plan"], &cleared["price_multiplier"]), (&Value::Null, &Value::Null));
        assert!(cleared.get("balance_delta").is_none());
        let refused = patch_of(&Form::parse("rpm=lots"), None).unwrap_err();
        assert_eq!(refused.param.as_deref(), Some("rpm"));
        let refused = patch_of(&Form::parse("price_multiplier=0"), None).unwrap_err();
        assert_eq!(refused.param.as_deref(), Some("price_multiplier"));
    }

    #[test]
    fn a_multiplier_of_one_reads_as_the_price_table() {
        assert_eq!(times(Some(1.0)), "—");
        assert_eq!(times(None), "—");
        assert_eq!(times(Some(1.25)), "1.25×");
        assert_eq!(limits(&json!({"rpm": 600, "tpm": null, "max_concurrent": 4})), "600 rpm, 4 in flight");
    }
}
