//! The keys' pages: the list, the create form, one key (its usage, windows, requests and edit
//! form) and its actions (enable, disable, rotate, revoke, top up).

use super::html::{self, count, enc, esc, money, nanos};
use super::page::*;
use super::requests::*;
use super::reveal::Reveals;
use super::{redirect, Form, Request};
use crate::admin::api::AdminApi;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::log::Filter;
use crate::records::usage::Grouping;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

/// A key's state, as the keys filter names it.
pub(super) fn key_state(view: &Value) -> &'static str {
    let now = crate::base::clock::now_unix();
    if !view["revoked_at"].is_null() {
        return "revoked";
    }
    if view["enabled"] == json!(false) {
        return "disabled";
    }
    if let Some(at) = view["expires_at"].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok()) {
        if at.as_second() <= i64::try_from(now).unwrap_or(i64::MAX) {
            return "expired";
        }
    }
    if view["balance"].as_f64().is_some_and(|b| b <= 0.0) {
        return "out of balance";
    }
    if let Some(windows) = view["budgets"].as_object() {
        if windows.values().any(|w| w["spent"].as_f64().unwrap_or(0.0) >= w["cap"].as_f64().unwrap_or(f64::MAX)) {
            return "over a window";
        }
    }
    "active"
}

/// The keys page; `created` shows a new key's secret (once), `error` a refused create form.
pub(super) async fn keys(api: &AdminApi, req: &Request, error: Option<(&[ApiError], &Form)>) -> Page {
    let clock = Clock::now(api);
    let query = Form::parse(&req.query);
    let search = query.get("q").to_lowercase();
    let wanted = match query.get("state") {
        "" => "all",
        s => STATES.iter().copied().find(|x| *x == s).ok_or_else(|| bad("state", format!("state: one of {}", STATES.join(", "))))?,
    };
    let mut rows = Vec::new();
    for key in api.keys.all_keys().await.map_err(internal)? {
        if !search.is_empty() && !key.name.to_lowercase().contains(&search) && !key.id.to_lowercase().contains(&search) {
            continue;
        }
        let view = api.view(&key).await?;
        let state = key_state(&view);
        if wanted != "all" && wanted != state {
            continue;
        }
        rows.push(vec![
            format!("<a href=\"/console/keys/{}\">{}</a>", enc(&key.id), esc(&key.name)),
            format!("<span class=\"mono\">{}</span>", esc(&key.id)),
            esc(&key.group),
            format!("<span class=\"state {}\">{state}</span>", state.replace(' ', "-")),
            money(view["balance"].as_f64().unwrap_or(0.0)),
            crate::base::clock::time_in(key.created_at * 1000, clock.tz()),
        ]);
    }
    let mut options = String::new();
    for s in STATES {
        let sel = if s == wanted { " selected" } else { "" };
        let _ = write!(options, "<option value=\"{s}\"{sel}>{s}</option>");
    }
    let filters = format!(
        "<form method=\"get\" action=\"/console/keys\" class=\"filters\"><label>Search<input name=\"q\" value=\"{}\" placeholder=\"name or id\"></label>\
<label>State<select name=\"state\">{options}</select></label><button type=\"submit\" class=\"secondary\">Filter</button></form>",
        esc(query.get("q"))
    );
    let (errs, form) = field_errors(error);
    let err = errs.as_slice();
    let value = |name: &str| form.map_or("", |f| f.get(name));
    let general = general_alerts(err, &CREATE_FIELDS);
    let group_default = if value("group").is_empty() && form.is_none() { "default" } else { value("group") };
    let create = html::form(
        "/console/keys",
        &req.csrf,
        "card grid",
        &format!(
            "{}{}{}{}{}{}<p><button type=\"submit\">Create key</button></p>",
            html::field_of("name", "Name", value("name"), err, ""),
            html::field_of("group", "Group", group_default, err, ""),
            html::field_of("balance", "Balance (USD)", value("balance"), err, ""),
            html::field_of("rpm", "Requests per minute", value("rpm"), err, "empty: no limit"),
            html::field_of("expires_at", "Expires at", value("expires_at"), err, "RFC 3339, empty: never"),
            html::field_of("account", "Account", value("account"), err, "optional"),
        ),
    );
    // A refusal that names no field stands above the form, not as one of its grid's cells.
    let body = format!(
        "{filters}{}<h2>Create a key</h2>{general}{create}",
        html::table("keys", &["Name", "Id", "Group", "State", "Balance", "Created"], &rows, None)
    );
    let mut page = clock.page("Keys", "/console/keys", &req.csrf, &body);
    if error.is_some() {
        page.status = 400;
    }
    Ok(page)
}

pub(super) async fn create_key(api: &AdminApi, reveals: &Reveals, req: &Request) -> Page {
    let f = &req.form;
    // Every field the form can check itself, all at once.
    let mut problems = Vec::new();
    let mut body = serde_json::Map::new();
    if f.get("name").trim().is_empty() {
        problems.push(bad("name", "name: must not be empty"));
    }
    body.insert("name".into(), json!(f.get("name")));
    for (name, value) in [("group", f.get("group")), ("expires_at", f.get("expires_at")), ("account", f.get("account"))] {
        if !value.is_empty() {
            body.insert(name.into(), json!(value));
        }
    }
    if !f.get("expires_at").is_empty() && crate::policy::rfc3339_unix(f.get("expires_at")).is_none() {
        problems.push(bad("expires_at", format!("expires_at: '{}' is not an RFC 3339 time (2026-12-31T23:59:59Z)", f.get("expires_at"))));
    }
    for (name, integer) in [("balance", false), ("rpm", true)] {
        match number(f, name, integer) {
            Ok(Some(v)) => {
                body.insert(name.into(), v);
            }
            Ok(None) => {}
            Err(e) => problems.push(e),
        }
    }
    if !problems.is_empty() {
        return keys(api, req, Some((&problems, f))).await;
    }
    let created = match crate::admin::api::parse_json(Value::Object(body).to_string().as_bytes()) {
        Ok(create) => api.create_key(create).await,
        Err(e) => Err(e),
    };
    match created {
        Ok(view) => {
            if let (Some(by), Some(id)) = (&req.by, view["id"].as_str()) {
                api.ledger.top_up_because(id, 0, Some(&format!("key made by {by} (operator)"))).await.map_err(internal)?;
            }
            // Post/redirect/get: the answer to the POST is a redirect to a page that shows the
            // secret once; reloading that page creates nothing and shows no secret.
            Ok(reveal_redirect(reveals, req, &view))
        }
        Err(e) if e.status() == 400 || e.status() == 409 => keys(api, req, Some((std::slice::from_ref(&e), f))).await,
        Err(e) => Err(e),
    }
}

/// A form's errors as (field, message) pairs, and the form they came from.
pub(super) fn field_errors<'a>(error: Option<(&'a [ApiError], &'a Form)>) -> (Vec<(&'a str, &'a str)>, Option<&'a Form>) {
    match error {
        Some((errors, f)) => {
            (errors.iter().map(|e| (form_field(e.param.as_deref().unwrap_or("form"), &e.message), e.message.as_str())).collect(), Some(f))
        }
        None => (Vec::new(), None),
    }
}

/// The form's field an API refusal is about: the policy's fields by the path its message
/// starts with (`budgets.day: …` is the daily cap's input, `models.deny: …` the denied models').
fn form_field<'a>(param: &'a str, message: &str) -> &'a str {
    let path = message.split(':').next().unwrap_or_default();
    match param {
        "budgets" => match path {
            "budgets.week" => "budget_week",
            "budgets.month" => "budget_month",
            "budgets.day" => "budget_day",
            _ => "budget_rolling",
        },
        "models" if path == "models.deny" => "models_deny",
        "models" => "models_allow",
        other => other,
    }
}

/// The alerts for errors that name no field of the form (shown above it, outside its grid).
pub(super) fn general_alerts(errors: &[(&str, &str)], fields: &[&str]) -> String {
    errors
        .iter()
        .filter(|(param, _)| !fields.contains(param))
        .map(|(_, message)| format!("<p class=\"alert\" role=\"alert\">{}</p>", esc(message)))
        .collect()
}

/// The redirect to the one-time page of a key's new secret (`view` with its `key`).
pub(super) fn reveal_redirect(reveals: &Reveals, req: &Request, view: &Value) -> LocalResponse {
    let text = |field: &str| view[field].as_str().unwrap_or_default().to_string();
    let token = reveals.keep(&text("id"), &text("name"), &text("key"), &req.csrf, crate::base::clock::now_unix());
    redirect(&format!("/console/keys/created/{token}"))
}

/// The one page that shows a new key's secret (see `reveal`).
pub(super) fn key_created(api: &AdminApi, reveals: &Reveals, req: &Request, token: &str) -> Page {
    let clock = Clock::now(api);
    let Some(reveal) = reveals.take(token, &req.csrf, crate::base::clock::now_unix()) else {
        let body = "<p class=\"alert\" role=\"alert\">This link was used already (or is another session's, or expired): a key's secret is shown only once. Nothing was created now.</p>\
<p><a href=\"/console/keys\">All keys</a></p>";
        return Ok(clock.page("Secret already shown", "/console/keys", &req.csrf, body));
    };
    let body = format!(
        "<p class=\"notice\" role=\"status\">Key <strong>{}</strong> created. Copy its secret now: it is shown only this once.</p>\
<div class=\"secret\"><input id=\"secret\" readonly value=\"{}\" aria-label=\"Secret\"><button type=\"button\" data-copy=\"secret\">Copy</button></div>\
<p><a href=\"/console/keys/{}\">Go to the key</a> · <a href=\"/console/keys\">All keys</a></p>",
        esc(&reveal.name),
        esc(&reveal.secret),
        enc(&reveal.key_id),
    );
    let mut page = clock.page("Key created", "/console/keys", &req.csrf, &body);
    // Never kept by a browser or a proxy.
    page.headers.push(("cache-control", "no-store".to_string()));
    Ok(page)
}

/// What a key is charged of the price table, and whose multiplier that is (nothing at 1), and
/// where its plan stands.
fn multiplier_line(view: &Value) -> String {
    let mut out = match (view["price_multiplier"].as_f64(), view["price_multiplier_from"].as_str()) {
        (Some(m), Some(from @ ("account" | "group" | "plan"))) => {
            format!("<p id=\"price-multiplier\">Charged <strong>{m}×</strong> the price table (its {from}'s multiplier)</p>")
        }
        _ => String::new(),
    };
    out.push_str(&plan_line(&view["plan_standing"]));
    out
}

/// Where a holder's plan stands (its `plan_standing`), as a line; nothing without a plan.
pub(super) fn plan_line(p: &Value) -> String {
    let mut out = String::new();
    if let Some(name) = p["name"].as_str() {
        let _ = write!(
            out,
            "<p id=\"plan\">Plan <strong>{}</strong>: {} left of {} this period ({} carried over), renews {}</p>",
            esc(name),
            money(p["left"].as_f64().unwrap_or(0.0)),
            money(p["credit"].as_f64().unwrap_or(0.0)),
            money(p["carried_over"].as_f64().unwrap_or(0.0)),
            esc(p["renews_at"].as_str().unwrap_or_default()),
        );
    }
    out
}

pub(super) async fn key_detail(api: &AdminApi, req: &Request, id: &str, error: Option<(&[ApiError], &Form)>) -> Page {
    let clock = Clock::now(api);
    let key = api.key(id).await?;
    let view = api.view(&key).await?;
    let state = key_state(&view);
    let first = clock.days_before(29);
    let (start, end) = clock.range_ms(&first, &clock.today).ok_or_else(|| internal("calendar"))?;
    api.ledger.commit_now().await.map_err(internal)?;
    let (_, per_day) = api.ledger.usage_grouped(&key.id, start, end, &Grouping::Day(clock.tz().clone())).await.map_err(internal)?;
    let (total, per_model) = api.ledger.usage_grouped(&key.id, start, end, &Grouping::Model).await.map_err(internal)?;
    let windows = window_rows(&view);
    let day_rows: Vec<Vec<String>> = per_day.iter().rev().map(|(d, t)| vec![esc(d), count(t.requests), nanos(t.cost_nanos)]).collect();
    let model_rows: Vec<Vec<String>> = per_model
        .iter()
        .map(|(m, t)| vec![esc(m), count(t.requests), count(t.input_tokens), count(t.output_tokens), nanos(t.cost_nanos)])
        .collect();
    let (recent, _) = api
        .store
        .requests()
        .query(&Filter { key_id: Some(key.id.clone()), end_ms: u64::MAX, limit: 20, ..Default::default() })
        .await
        .map_err(internal)?;
    let names = key_names(std::slice::from_ref(&key));
    let recent_rows: Vec<Vec<String>> = recent.iter().map(|e| request_row(e, &names, clock.tz())).collect();
    let (errs, form) = field_errors(error);
    let err = errs.as_slice();
    let general = general_alerts(err, &[&EDIT_FIELDS[..], &["amount", "reason"]].concat());
    let done = done_notice(&req.query);
    let action = |what: &str| format!("/console/keys/{}/{what}", enc(&key.id));
    let toggle = if view["revoked_at"].is_null() {
        let (what, label, class) = if key.enabled { ("disable", "Disable", "danger") } else { ("enable", "Enable", "") };
        html::form(&action(what), &req.csrf, "inline", &format!("<button type=\"submit\" class=\"{class}\">{label}</button>"))
    } else {
        "<span class=\"state revoked\">revoked</span>".to_string()
    };
    let top_up = html::form(
        &action("topup"),
        &req.csrf,
        "card grid",
        &format!(
            "{}{}<p><button type=\"submit\">Top up</button></p>",
            html::field_of("amount", "Amount (USD, negative to take back)", form.map_or("", |f| f.get("amount")), err, ""),
            html::field_of("reason", "Reason", form.map_or("", |f| f.get("reason")), err, "kept in the audit trail"),
        ),
    );
    let current = edit_values(&view);
    let edit_value = |name: &str| -> String {
        match form {
            Some(f) => f.get(name).to_string(),
            None => current.get(name).cloned().unwrap_or_default(),
        }
    };
    let mut edit_fields = String::new();
    for (name, label, hint) in EDIT_FORM {
        edit_fields.push_str(&html::field_of(name, label, &edit_value(name), err, hint));
    }
    let edit = html::form(&action("edit"), &req.csrf, "card grid", &format!("{edit_fields}<p><button type=\"submit\">Save</button></p>"));
    let manage = if view["revoked_at"].is_null() { secret_forms(&action, &req.csrf, form, err) } else { String::new() };
    let body = format!(
        "{done}{general}<section class=\"card\"><div class=\"line\"><strong>{}</strong> <span class=\"mono\">{}</span> · group {} · <span class=\"state {}\">{state}</span> {toggle}</div>\
{}<p>Balance <strong id=\"balance\">{}</strong> · 30 days: {} requests, {}</p></section>\
<h2>Spend windows</h2>{}<h2>Top up</h2>{top_up}<h2>Limits and policy</h2>{edit}{manage}\
<div class=\"cols\"><div><h2>Spend per day (30 days)</h2>{}</div><div><h2>Per model (30 days)</h2>{}</div></div>\
<h2>Last requests</h2>{}<p><a href=\"/console/requests?key={}\">All of this key's requests</a> · <a href=\"/console/usage?group=day&amp;key={}\">Usage</a></p>",
        esc(&key.name),
        esc(&key.id),
        esc(&key.group),
        state.replace(' ', "-"),
        multiplier_line(&view),
        money(view["balance"].as_f64().unwrap_or(0.0)),
        count(total.requests),
        nanos(total.cost_nanos),
        html::table("windows", &["Window", "Cap", "Spent", "Held", "Ends (rolling: frees)"], &windows, None),
        html::table("key-days", &["Day", "Requests", "Spend"], &day_rows, None),
        html::table("key-models", &["Model", "Requests", "Input", "Output", "Spend"], &model_rows, None),
        html::table("key-requests", &REQUEST_HEAD, &recent_rows, None),
        enc(&key.id),
        enc(&key.id),
    );
    let mut page = clock.page(&format!("Key {}", key.name), "/console/keys", &req.csrf, &body);
    if error.is_some() {
        page.status = 400;
    }
    Ok(page)
}

/// A key's spend windows as table rows: cap, spent, held, end.
pub(super) fn window_rows(view: &Value) -> Vec<Vec<String>> {
    let Some(w) = view["budgets"].as_object() else { return Vec::new() };
    w.iter()
        .map(|(name, v)| {
            vec![
                esc(name),
                money(v["cap"].as_f64().unwrap_or(0.0)),
                money(v["spent"].as_f64().unwrap_or(0.0)),
                money(v["held"].as_f64().unwrap_or(0.0)),
                // A rolling window has no end: when its oldest spend next ages out.
                esc(v["end"].as_str().or_else(|| v["next_frees_at"].as_str()).unwrap_or_default()),
            ]
        })
        .collect()
}

/// A live key's secret forms: rotate (a new secret shown once, the old one accepted a
/// while) and revoke (the end of the key).
fn secret_forms(action: &dyn Fn(&str) -> String, csrf: &str, form: Option<&Form>, err: &[(&str, &str)]) -> String {
    let value = |name: &str| form.map_or("", |f| f.get(name)).to_string();
    let rotate = html::form(
        &action("rotate"),
        csrf,
        "card grid",
        &format!(
            "{}<p><button type=\"submit\">Rotate the secret</button></p>",
            html::field_of(
                "grace_hours",
                "Old secret still accepted for (hours)",
                &value("grace_hours"),
                err,
                "0: not at all; at most 720"
            ),
        ),
    );
    let revoke = html::form(
        &action("revoke"),
        csrf,
        "card grid",
        &format!(
            "{}<p><button type=\"submit\" class=\"danger\">Revoke</button></p>",
            html::field_of("confirm", "Type revoke to confirm", &value("confirm"), err, "a revoked key never works again"),
        ),
    );
    format!("<h2>Secret</h2><div class=\"cols\"><div>{rotate}</div><div>{revoke}</div></div>")
}

/// The edit form's values for a key's view.
pub(super) fn edit_values(view: &Value) -> BTreeMap<&'static str, String> {
    let text = |v: &Value| match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let list = |v: &Value| v.as_array().map_or(String::new(), |a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", "));
    let mut out = BTreeMap::new();
    for name in [
        "name",
        "group",
        "account",
        "rpm",
        "tpm",
        "max_concurrent",
        "expires_at",
        "max_request_cost",
        "max_output_tokens",
        "default_output_tokens",
        "plan",
    ] {
        out.insert(name, text(&view[name]));
    }
    out.insert("models_allow", list(&view["models"]["allow"]));
    out.insert("models_deny", list(&view["models"]["deny"]));
    out.insert("ip_allow", list(&view["ip_allow"]));
    out.insert("guardrails", list(&view["guardrails"]));
    for (field, window) in [("budget_day", "day"), ("budget_week", "week"), ("budget_month", "month")] {
        out.insert(field, text(&view["budgets"][window]["cap"]));
    }
    let rolling = view["budgets"].as_object().map_or(String::new(), |w| {
        w.iter().filter(|(_, v)| v["rolling"] == true).map(|(name, v)| format!("{name}={}", text(&v["cap"]))).collect::<Vec<_>>().join(", ")
    });
    out.insert("budget_rolling", rolling);
    let tags = view["tags"]
        .as_object()
        .map_or(String::new(), |t| t.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(", "));
    out.insert("tags", tags);
    out
}

/// The edit form as a `PATCH /admin/keys` body: an empty field clears its setting. Every field
/// the form can check itself is checked, and all of its problems are returned at once.
pub(super) fn edit_patch(f: &Form) -> Result<Value, Vec<ApiError>> {
    let mut problems = Vec::new();
    let mut body = serde_json::Map::new();
    for (field, what) in [("name", "name: must not be empty"), ("group", "group: must not be empty")] {
        if f.get(field).trim().is_empty() {
            problems.push(bad(field, what));
        }
        body.insert(field.into(), json!(f.get(field)));
    }
    for field in ["account", "plan"] {
        let value = f.get(field).trim();
        body.insert(field.into(), if value.is_empty() { Value::Null } else { json!(value) });
    }
    let mut numeric = |field: &str, integer: bool| match number(f, field, integer) {
        Ok(v) => v.unwrap_or(Value::Null),
        Err(e) => {
            problems.push(e);
            Value::Null
        }
    };
    for field in ["rpm", "tpm", "max_concurrent", "max_output_tokens", "default_output_tokens"] {
        body.insert(field.into(), numeric(field, true));
    }
    body.insert("max_request_cost".into(), numeric("max_request_cost", false));
    let mut budgets = serde_json::Map::new();
    for (field, window) in [("budget_day", "day"), ("budget_week", "week"), ("budget_month", "month")] {
        let cap = numeric(field, false);
        if !cap.is_null() {
            budgets.insert(window.into(), cap);
        }
    }
    // Rolling windows, `5h=2, 7d=25`: kept when the form is saved.
    for pair in f.get("budget_rolling").split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match pair.split_once('=').map(|(w, usd)| (w.trim(), usd.trim().parse::<f64>())) {
            Some((window, Ok(usd))) if crate::policy::budget::Rolling::parse_label(window).is_some() => {
                budgets.insert(window.into(), json!(usd));
            }
            _ => problems.push(bad("budget_rolling", format!("budget_rolling: '{pair}' is not a duration and a cap (5h=2, 7d=25)"))),
        }
    }
    let expires = f.get("expires_at");
    if !expires.is_empty() && crate::policy::rfc3339_unix(expires).is_none() {
        problems.push(bad("expires_at", format!("expires_at: '{expires}' is not an RFC 3339 time (2026-12-31T23:59:59Z)")));
    }
    body.insert("expires_at".into(), if expires.is_empty() { Value::Null } else { json!(expires) });
    let list = |text: &str| text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect::<Vec<_>>();
    let (allow, deny) = (list(f.get("models_allow")), list(f.get("models_deny")));
    let models = match (allow.is_empty(), deny.is_empty()) {
        (true, true) => Value::Null,
        (true, false) => json!({"deny": deny}),
        (false, _) => json!({"allow": allow, "deny": deny}),
    };
    body.insert("models".into(), models);
    let ips = list(f.get("ip_allow"));
    for (i, ip) in ips.iter().enumerate() {
        if let Err(e) = crate::policy::Cidr::parse(ip) {
            problems.push(bad("ip_allow", format!("ip_allow[{i}]: {e}")));
        }
    }
    body.insert("ip_allow".into(), if ips.is_empty() { Value::Null } else { json!(ips) });
    body.insert("budgets".into(), if budgets.is_empty() { Value::Null } else { Value::Object(budgets) });
    let mut tags = serde_json::Map::new();
    for pair in list(f.get("tags")) {
        match pair.split_once('=') {
            Some((k, v)) => {
                tags.insert(k.trim().to_string(), json!(v.trim()));
            }
            None => problems.push(bad("tags", format!("tags: name=value, not '{pair}'"))),
        }
    }
    body.insert("tags".into(), if tags.is_empty() { Value::Null } else { Value::Object(tags) });
    let guardrails = list(f.get("guardrails"));
    body.insert("guardrails".into(), if guardrails.is_empty() { Value::Null } else { json!(guardrails) });
    if problems.is_empty() {
        Ok(Value::Object(body))
    } else {
        Err(problems)
    }
}

pub(super) async fn key_action(api: &AdminApi, reveals: &Reveals, req: &Request, rest: &str) -> Page {
    let Some((id, what)) = rest.rsplit_once('/') else {
        return Err(ApiError::new(ErrorKind::NotFound, "No such key action."));
    };
    let f = &req.form;
    // Rotate and revoke are their own admin operations.
    match what {
        "rotate" => {
            let grace_hours = match number(f, "grace_hours", false) {
                Ok(v) => v.and_then(|v| v.as_f64()).unwrap_or(0.0),
                Err(e) => return key_detail(api, req, id, Some((std::slice::from_ref(&e), f))).await,
            };
            let grace = if grace_hours.is_finite() && grace_hours >= 0.0 { (grace_hours * 3600.0).round() as u64 } else { u64::MAX };
            return match api.rotate_key(id, grace).await {
                Ok(view) => {
                    if let Some(by) = &req.by {
                        api.ledger.top_up_because(id, 0, Some(&format!("key rotated by {by} (operator)"))).await.map_err(internal)?;
                    }
                    Ok(reveal_redirect(reveals, req, &view))
                }
                Err(mut e) if e.status() == 400 || e.status() == 409 => {
                    if e.param.as_deref() == Some("grace_secs") {
                        e.param = Some("grace_hours".into());
                    }
                    key_detail(api, req, id, Some((std::slice::from_ref(&e), f))).await
                }
                Err(e) => Err(e),
            };
        }
        "revoke" => {
            if f.get("confirm") != "revoke" {
                let e = bad("confirm", "Type revoke to confirm: a revoked key never works again.");
                return key_detail(api, req, id, Some((std::slice::from_ref(&e), f))).await;
            }
            api.revoke_key(id).await?;
            if let Some(by) = &req.by {
                api.ledger.top_up_because(id, 0, Some(&format!("key revoked by {by} (operator)"))).await.map_err(internal)?;
            }
            return Ok(redirect(&format!(
                "/console/keys/{}?done={}",
                enc(id),
                enc("Key revoked: it never works again; its records stay.")
            )));
        }
        _ => {}
    }
    let (patch, done) = match what {
        "enable" => (Ok(json!({"enabled": true})), "Key enabled."),
        "disable" => (Ok(json!({"enabled": false})), "Key disabled: its requests are refused from now on."),
        "topup" => {
            let amount = match number(f, "amount", false) {
                Ok(Some(a)) => Ok(a),
                Ok(None) => Err(vec![bad("amount", "amount: required")]),
                Err(e) => Err(vec![e]),
            };
            // A person signed in as an operator is named in the audit trail.
            let reason = operator_reason(req.by.as_deref(), f.get("reason"));
            (
                amount.map(|a| if reason.is_empty() { json!({"balance_delta": a}) } else { json!({"balance_delta": a, "reason": reason}) }),
                "Balance moved.",
            )
        }
        "edit" => {
            let mut patch = edit_patch(f);
            if let Ok(Value::Object(body)) = &mut patch {
                // An expiry the form left as it was is not set again: a key that already
                // expired can still have its other fields edited.
                let current = api.view(&api.key(id).await?).await?;
                if body.get("expires_at") == Some(&current["expires_at"]) {
                    body.remove("expires_at");
                }
            }
            (patch, "Saved.")
        }
        _ => return Err(ApiError::new(ErrorKind::NotFound, format!("No key action '{what}'."))),
    };
    let body = match patch {
        Ok(body) => body,
        // Every field the form could check itself, each under its input.
        Err(problems) => return key_detail(api, req, id, Some((&problems, f))).await,
    };
    let result = match crate::admin::api::parse_json(body.to_string().as_bytes()) {
        Ok(patch) => api.patch_key(id, patch).await,
        Err(e) => Err(e),
    };
    if let (Ok(_), Some(by), false) = (&result, &req.by, what == "topup") {
        api.ledger.top_up_because(id, 0, Some(&format!("key {what} by {by} (operator)"))).await.map_err(internal)?;
    }
    match result {
        Ok(_) => Ok(redirect(&format!("/console/keys/{}?done={}", enc(id), enc(done)))),
        Err(mut e) if e.status() == 400 || e.status() == 409 => {
            form_param(&mut e);
            key_detail(api, req, id, Some((std::slice::from_ref(&e), f))).await
        }
        Err(e) => Err(e),
    }
}

pub(super) const STATES: [&str; 7] = ["all", "active", "disabled", "expired", "revoked", "out of balance", "over a window"];

pub(super) const CREATE_FIELDS: [&str; 6] = ["name", "group", "balance", "rpm", "expires_at", "account"];

/// The edit form: (field, label, hint).
pub(super) const EDIT_FORM: [(&str, &str, &str); 20] = [
    ("name", "Name", ""),
    ("group", "Group", "which platforms it may call"),
    ("account", "Account", "a shared account's name; empty: none"),
    ("plan", "Plan", "a plan's name; empty: none (leaving one expires its unused credit)"),
    ("rpm", "Requests per minute", "empty: no limit"),
    ("tpm", "Tokens per minute", "empty: no limit"),
    ("max_concurrent", "Requests at once", "empty: no limit"),
    ("expires_at", "Expires at", "RFC 3339, empty: never"),
    ("models_allow", "Models allowed", "comma-separated, trailing * globs; empty: all"),
    ("models_deny", "Models denied", "comma-separated"),
    ("ip_allow", "Client addresses", "CIDRs, comma-separated; empty: any"),
    ("max_request_cost", "Max cost per request (USD)", ""),
    ("max_output_tokens", "Max output tokens", ""),
    ("default_output_tokens", "Default output tokens", ""),
    ("budget_day", "Daily cap (USD)", ""),
    ("budget_week", "Weekly cap (USD)", ""),
    ("budget_month", "Monthly cap (USD)", ""),
    ("budget_rolling", "Rolling caps (USD)", "duration=USD, comma-separated: 5h=2, 7d=25"),
    ("tags", "Tags", "name=value, comma-separated"),
    ("guardrails", "Guardrails", "names, comma-separated; with its group's and account's"),
];

pub(super) const EDIT_FIELDS: [&str; 24] = [
    "plan",
    "name",
    "group",
    "grace_hours",
    "confirm",
    "rpm",
    "tpm",
    "max_concurrent",
    "expires_at",
    "models_allow",
    "models_deny",
    "models",
    "ip_allow",
    "max_request_cost",
    "max_output_tokens",
    "default_output_tokens",
    "budget_day",
    "budget_week",
    "budget_month",
    "budget_rolling",
    "budgets",
    "tags",
    "account",
    "guardrails",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::console::usage::csv_cell;

    /// A refused cap or model rule is shown under its own input, not lost.
    #[test]
    fn a_refused_policy_field_is_shown_under_its_own_input() {
        let refused = |param: &str, message: &str| ApiError::new(crate::protocol::ErrorKind::BadRequest, message).with_param(param);
        let errors = [
            refused("budgets", "budgets.week: a positive number of USD, at most 1000000"),
            refused("models", "models.deny: '*x' — a name, or a prefix ending in one '*'"),
            refused("group", "group: no group named 'nope'"),
        ];
        let form = Form::default();
        let (fields, _) = field_errors(Some((&errors, &form)));
        let names: Vec<&str> = fields.iter().map(|(f, _)| *f).collect();
        assert_eq!(names, ["budget_week", "models_deny", "group"]);
        assert!(html::field_of("budget_week", "Weekly cap (USD)", "-5", &fields, "").contains("budget_week-error"));
    }

    #[test]
    fn csv_cells_are_quoted_and_formulas_defused() {
        assert_eq!(csv_cell("plain"), "plain");
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
        assert_eq!(csv_cell("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_cell("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(csv_cell("-0.5"), "-0.5");
        assert_eq!(csv_cell("\tcmd"), "\"'\tcmd\"");
        assert_eq!(csv_cell("\r=1+1"), "\"'\r=1+1\"");
        assert_eq!(csv_cell("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(csv_cell("-inf"), "'-inf", "not a plain number");
        assert_eq!(csv_cell("+1+cmd|' /C calc'!A0"), "'+1+cmd|' /C calc'!A0");
    }

    #[test]
    fn the_edit_form_becomes_a_patch_that_clears_empty_fields() {
        let f = Form::parse(
            "name=a&group=chat&account=&rpm=&tpm=900&models_allow=alpha-*,+beta&models_deny=&ip_allow=10.0.0.0/8&budget_week=5&tags=team%3Dx,+env%3Dprod",
        );
        let patch = edit_patch(&f).expect("patch");
        assert_eq!((patch["group"].as_str(), &patch["account"]), (Some("chat"), &Value::Null), "group and account are edited too");
        assert_eq!(patch["rpm"], Value::Null);
        assert_eq!(patch["tpm"], json!(900));
        assert_eq!(patch["models"], json!({"allow": ["alpha-*", "beta"], "deny": []}));
        assert_eq!(patch["ip_allow"], json!(["10.0.0.0/8"]));
        assert_eq!(patch["budgets"], json!({"week": 5.0}));
        assert_eq!(patch["tags"], json!({"team": "x", "env": "prod"}));
        assert_eq!(patch["expires_at"], Value::Null);
        let e = edit_patch(&Form::parse("name=a&group=g&rpm=many")).expect_err("not a number");
        assert_eq!(e[0].param.as_deref(), Some("rpm"));
        let e = edit_patch(&Form::parse("name=a&group=g&tags=oops")).expect_err("not a pair");
        assert_eq!(e[0].param.as_deref(), Some("tags"));
        // Four wrong fields: four problems, each naming its field (issue 46, point 2).
        let e = edit_patch(&Form::parse("name=&group=g&rpm=many&budget_day=lots&ip_allow=10.0.0.0/99&expires_at=soon")).expect_err("bad");
        let fields: Vec<&str> = e.iter().filter_map(|p| p.param.as_deref()).collect();
        assert_eq!(fields, ["name", "rpm", "budget_day", "expires_at", "ip_allow"]);
    }

    #[test]
    fn a_keys_rolling_windows_are_shown_in_the_form_and_kept_when_it_is_saved() {
        let view = json!({"budgets": {
            "day": {"cap": 3.0, "spent": 0.0, "held": 0.0, "end": "2026-11-29T00:00:00Z"},
            "5h": {"cap": 2.0, "spent": 0.5, "held": 0.0, "rolling": true, "next_frees_at": "2026-11-28T15:10:00Z"},
            "7d": {"cap": 25.0, "spent": 0.5, "held": 0.0, "rolling": true, "next_frees_at": null}}});
        let values = edit_values(&view);
        assert_eq!(values["budget_rolling"], "5h=2.0, 7d=25.0");
        assert_eq!(values["budget_day"], "3.0");
        let rows = window_rows(&view);
        assert!(rows.iter().any(|r| r[0] == "5h" && r[4] == "2026-11-28T15:10:00Z"), "{rows:?}");
        let patch = edit_patch(&Form::parse("name=a&group=g&budget_day=3&budget_rolling=5h%3D2,+7d%3D25")).expect("patch");
        assert_eq!(patch["budgets"], json!({"day": 3.0, "5h": 2.0, "7d": 25.0}));
        let e = edit_patch(&Form::parse("name=a&group=g&budget_rolling=5w%3D2")).expect_err("not a duration");
        assert_eq!(e[0].param.as_deref(), Some("budget_rolling"));
    }
}
