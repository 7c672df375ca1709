//! The console's pages. Each reads what it shows from the same store as the admin API; the
//! key forms go through `AdminApi::create_key` and `AdminApi::patch_key`.

use super::html::{self, count, enc, esc, money, nanos};
use super::reveal::Reveals;
use super::{html as reply, redirect, Form, Request};
use crate::admin::api::AdminApi;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::log::{Filter, LogEntry};
use crate::records::usage::{Grouping, Totals};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

type Page = Result<LocalResponse, ApiError>;

const DAY_MS: u64 = 86_400_000;
/// Most request-log entries a page reads to count failures and latencies.
const MAX_LOG_SCAN: usize = 1_000_000;
/// Longest date range of the usage page.
const MAX_RANGE_DAYS: i64 = 3660;

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, message).with_param(param)
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    log::error!("console: {e}");
    ApiError::new(ErrorKind::Internal, "Internal error while reading the store.")
}

pub(super) async fn route(api: &AdminApi, reveals: &Reveals, req: &Request) -> LocalResponse {
    let path = req.path.trim_end_matches('/');
    let path = if path.is_empty() { "/console" } else { path };
    let result = match (req.method.as_str(), path) {
        ("GET", "/console") => overview(api, req).await,
        ("GET", "/console/keys") => keys(api, req, None).await,
        ("POST", "/console/keys") => create_key(api, reveals, req).await,
        ("GET", p) if p.starts_with("/console/keys/created/") => key_created(api, reveals, req, &p["/console/keys/created/".len()..]),
        ("GET", "/console/usage") => usage(api, req, false).await,
        ("GET", "/console/usage.csv") => usage(api, req, true).await,
        ("GET", "/console/requests") => requests(api, req).await,
        ("GET", "/console/providers") => providers(api, req).await,
        ("GET", "/console/video") => video(api, req).await,
        ("GET", p) if p.starts_with("/console/requests/") => request_detail(api, req, &p["/console/requests/".len()..]).await,
        ("GET", p) if p.starts_with("/console/keys/") => key_detail(api, req, &p["/console/keys/".len()..], None).await,
        ("POST", p) if p.starts_with("/console/keys/") => key_action(api, reveals, req, &p["/console/keys/".len()..]).await,
        _ => Err(ApiError::new(ErrorKind::NotFound, format!("No console page at {} {}.", req.method, req.path))),
    };
    match result {
        Ok(r) => r,
        Err(e) => {
            let tz = api.routing.load().calendar.name().to_string();
            let body = format!("<p class=\"alert\" role=\"alert\">{}</p><p><a href=\"/console\">Overview</a></p>", esc(&e.message));
            reply(e.status(), html::page(if e.status() == 404 { "Not found" } else { "Error" }, "", &req.csrf, &tz, &body))
        }
    }
}

/// The billing calendar and today's date in it.
struct Clock {
    calendar: crate::policy::budget::Calendar,
    today: String,
}

impl Clock {
    fn now(api: &AdminApi) -> Clock {
        let calendar = api.routing.load().calendar.clone();
        let today = crate::base::clock::date_in(crate::base::clock::now_unix(), calendar.tz());
        Clock { calendar, today }
    }

    fn tz(&self) -> &jiff::tz::TimeZone {
        self.calendar.tz()
    }

    /// `[start, end)` in unix ms of the dates `from..=to`.
    fn range_ms(&self, from: &str, to: &str) -> Option<(u64, u64)> {
        let start = self.calendar.day_start(from)?;
        let end = self.calendar.day_start(&crate::policy::budget::Calendar::add_days(to, 1)?)?;
        Some((start * 1000, end * 1000))
    }

    fn days_before(&self, n: i64) -> String {
        crate::policy::budget::Calendar::add_days(&self.today, -n).unwrap_or_else(|| self.today.clone())
    }

    fn page(&self, title: &str, current: &str, csrf: &str, body: &str) -> LocalResponse {
        reply(200, html::page(title, current, csrf, self.calendar.name(), body))
    }
}

/// What usage rows are grouped by.
#[derive(Clone, PartialEq)]
enum Group {
    Key,
    Model,
    Provider,
    Day,
    Tag(String),
}

impl Group {
    fn parse(text: &str, tag: &str) -> Result<Group, ApiError> {
        Ok(match text {
            "" | "key" => Group::Key,
            "model" => Group::Model,
            "provider" => Group::Provider,
            "day" => Group::Day,
            "tag" if !tag.is_empty() => Group::Tag(tag.to_string()),
            "tag" => return Err(bad("tag", "tag: name the tag to group by")),
            other => return Err(bad("group", format!("group: key, model, provider, day or tag, not '{other}'"))),
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Group::Key => "key",
            Group::Model => "model",
            Group::Provider => "provider",
            Group::Day => "day",
            Group::Tag(_) => "tag",
        }
    }

    fn grouping(&self, tz: &jiff::tz::TimeZone) -> Grouping {
        match self {
            Group::Key | Group::Model => Grouping::Model,
            Group::Provider => Grouping::Provider,
            Group::Day => Grouping::Day(tz.clone()),
            Group::Tag(name) => Grouping::Tag(name.clone()),
        }
    }

    /// The row a request-log entry counts in (None: this grouping cannot place it).
    fn of_entry(&self, e: &LogEntry, tz: &jiff::tz::TimeZone) -> Option<String> {
        match self {
            Group::Key => e.key_id.clone(),
            Group::Model => Some(e.model.clone().unwrap_or_default()),
            Group::Provider => Some(e.provider.clone().unwrap_or_default()),
            Group::Day => Some(crate::base::clock::date_in(e.time_ms / 1000, tz)),
            Group::Tag(_) => None,
        }
    }
}

/// One row of the usage table.
#[derive(Default, Clone)]
struct Row {
    totals: Totals,
    /// Requests that failed or were refused and cost nothing.
    failed: u64,
}

impl Row {
    /// What was charged before credits: the usage table's "Billed" column (its "Refunded" column
    /// beside it).
    fn billed(&self) -> i64 {
        self.totals.cost_nanos.saturating_sub(self.totals.refunded_nanos)
    }

    /// Spend, the one definition every page, chart and CSV uses, as `/v1/usage` and
    /// `/admin/usage` (`cost`) do: charges net of refunds and credits.
    fn spend(&self) -> i64 {
        self.totals.cost_nanos
    }
}

/// Usage of `keys` (every key when None) in `[start_ms, end_ms)`, grouped, from the records.
/// Rows by their label (a key id for `Group::Key`).
async fn usage_rows(
    api: &AdminApi,
    keys: Option<&[crate::records::key::KeyRecord]>,
    group: &Group,
    (start_ms, end_ms): (u64, u64),
    tz: &jiff::tz::TimeZone,
) -> Result<BTreeMap<String, Row>, ApiError> {
    api.ledger.commit_now().await.map_err(internal)?;
    let all;
    let keys = match keys {
        Some(keys) => keys,
        None => {
            all = api.keys.all_keys().await.map_err(internal)?;
            &all[..]
        }
    };
    let by = group.grouping(tz);
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    for key in keys {
        let (total, by_label) = api.ledger.usage_grouped(&key.id, start_ms, end_ms, &by).await.map_err(internal)?;
        if *group == Group::Key {
            if total.requests > 0 || total.cost_nanos != 0 || total.refunds > 0 {
                rows.entry(key.id.clone()).or_default().totals.merge(&total);
            }
            continue;
        }
        for (label, t) in by_label {
            rows.entry(label).or_default().totals.merge(&t);
        }
    }
    Ok(rows)
}

/// Count into `rows` the requests of `keys` that failed or were refused and cost nothing (from
/// the request log; a tag grouping cannot place them).
async fn add_failures(
    api: &AdminApi,
    rows: &mut BTreeMap<String, Row>,
    keys: &[crate::records::key::KeyRecord],
    group: &Group,
    (start_ms, end_ms): (u64, u64),
    tz: &jiff::tz::TimeZone,
) -> Result<(), ApiError> {
    if matches!(group, Group::Tag(_)) {
        return Ok(());
    }
    // One key's page reads only that key's entries.
    let key_id = match keys {
        [one] => Some(one.id.clone()),
        _ => None,
    };
    // Requests refused before a key was known are no key's usage.
    let ids: std::collections::HashSet<&str> = keys.iter().map(|k| k.id.as_str()).collect();
    for_log(api, Filter { key_id, start_ms, end_ms, ..Default::default() }, |e| {
        if e.status >= 400 && e.cost_nanos == 0 && e.key_id.as_deref().is_some_and(|k| ids.contains(k)) {
            if let Some(label) = group.of_entry(e, tz) {
                rows.entry(label).or_default().failed += 1;
            }
        }
    })
    .await
}

/// Every request-log entry the filter matches (newest first), up to [`MAX_LOG_SCAN`].
async fn for_log(api: &AdminApi, mut filter: Filter, mut each: impl FnMut(&LogEntry)) -> Result<(), ApiError> {
    filter.limit = 5000;
    let mut seen = 0;
    loop {
        let (entries, next) = api.store.requests().query(&filter).await.map_err(internal)?;
        seen += entries.len();
        entries.iter().for_each(&mut each);
        match next {
            Some(cursor) if seen < MAX_LOG_SCAN => filter.before = Some(cursor),
            _ => return Ok(()),
        }
    }
}

fn key_names(keys: &[crate::records::key::KeyRecord]) -> BTreeMap<String, String> {
    keys.iter().map(|k| (k.id.clone(), k.name.clone())).collect()
}

fn key_link(id: &str, names: &BTreeMap<String, String>) -> String {
    let name = names.get(id).map_or(id, String::as_str);
    format!("<a href=\"/console/keys/{}\">{}</a> <span class=\"mono\">{}</span>", enc(id), esc(name), esc(id))
}

/// The 95th percentile of `values` (0 when empty).
fn p95(values: &mut [u64]) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    values[((values.len() - 1) as f64 * 0.95).round() as usize]
}

async fn overview(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let first = clock.days_before(29);
    let (start, end) = clock.range_ms(&first, &clock.today).ok_or_else(|| internal("calendar"))?;
    let day_rows = usage_rows(api, None, &Group::Day, (start, end), clock.tz()).await?;
    let periods = [("Today", clock.today.clone()), ("7 days", clock.days_before(6)), ("30 days", first.clone())];
    // Error rate and latency from the request log (kept `console.request_log_days`).
    let mut latencies: [Vec<u64>; 3] = Default::default();
    let mut logged = [(0u64, 0u64); 3];
    for_log(api, Filter { start_ms: start, end_ms: end, ..Default::default() }, |e| {
        let day = crate::base::clock::date_in(e.time_ms / 1000, clock.tz());
        for (i, (_, from)) in periods.iter().enumerate() {
            if day >= *from {
                logged[i].0 += 1;
                logged[i].1 += u64::from(e.status >= 400);
                latencies[i].push(e.latency_ms);
            }
        }
    })
    .await?;
    let mut tiles = String::from("<div class=\"tiles\">");
    for (i, (name, from)) in periods.iter().enumerate() {
        let mut t = Row::default();
        for (_, row) in day_rows.range(from.clone()..) {
            t.totals.merge(&row.totals);
        }
        let (n, errors) = logged[i];
        // The rate says the counts it is computed over (the request log's, refusals included).
        let rate = if n == 0 {
            "—".to_string()
        } else {
            format!("{:.1}% <small>({} of {} logged)</small>", errors as f64 * 100.0 / n as f64, count(errors), count(n))
        };
        let p95 = if n == 0 { "—".to_string() } else { format!("{} ms", count(p95(&mut latencies[i]))) };
        let _ = write!(
            tiles,
            "<section class=\"tile\" id=\"period-{i}\"><h2>{name} <small>since {from}</small></h2><dl>\
<dt>Spend</dt><dd class=\"spend\">{}</dd><dt>Billed requests</dt><dd>{}</dd><dt>Tokens</dt><dd>{}</dd>\
<dt>Error rate</dt><dd>{rate}</dd><dt>p95 latency</dt><dd>{p95}</dd></dl></section>",
            nanos(t.spend()),
            count(t.totals.requests),
            count(t.totals.input_tokens.saturating_add(t.totals.output_tokens)),
        );
    }
    tiles.push_str("</div>");
    let mut days = Vec::with_capacity(30);
    for i in (0..30).rev() {
        let day = clock.days_before(i);
        let spend = day_rows.get(&day).map_or(0, Row::spend);
        days.push((day, spend));
    }
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let names = key_names(&keys);
    let top_keys = usage_rows(api, None, &Group::Key, (start, end), clock.tz()).await?;
    let top_models = usage_rows(api, None, &Group::Model, (start, end), clock.tz()).await?;
    let top = |rows: &BTreeMap<String, Row>, label: &dyn Fn(&str) -> String| {
        let mut sorted: Vec<(&String, &Row)> = rows.iter().filter(|(_, r)| r.totals.requests > 0 || r.spend() != 0).collect();
        sorted.sort_by_key(|(_, r)| std::cmp::Reverse(r.spend()));
        sorted.iter().take(10).map(|(l, r)| vec![label(l), nanos(r.spend()), count(r.totals.requests)]).collect::<Vec<_>>()
    };
    let key_rows = top(&top_keys, &|id| key_link(id, &names));
    let model_rows = top(&top_models, &|m| esc(m));
    let body = format!(
        "{tiles}<h2>Spend per day, last 30 days</h2>{}<div class=\"cols\"><div><h2>Top keys (30 days)</h2>{}</div><div><h2>Top models (30 days)</h2>{}</div></div>\
<h2>Providers</h2>{}",
        html::spend_chart(&days),
        html::table("top-keys", &["Key", "Spend", "Requests"], &key_rows, None),
        html::table("top-models", &["Model", "Spend", "Requests"], &model_rows, None),
        health_strip(api),
    );
    Ok(clock.page("Overview", "/console", &req.csrf, &body))
}

fn state_name(state: crate::upstream::health::State) -> &'static str {
    match state {
        crate::upstream::health::State::Healthy => "healthy",
        crate::upstream::health::State::Cooling(_) => "cooling",
        crate::upstream::health::State::HalfOpen { .. } => "half-open",
    }
}

fn health_strip(api: &AdminApi) -> String {
    let mut out = String::from("<div class=\"strip\" id=\"health\">");
    for (name, state, _) in api.health.states() {
        let s = state_name(state);
        let _ = write!(out, "<a href=\"/console/providers\" class=\"state {s}\">{}: {s}</a>", esc(&name));
    }
    out.push_str("</div>");
    out
}

/// A key's state, as the keys filter names it.
fn key_state(view: &Value) -> &'static str {
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

const STATES: [&str; 7] = ["all", "active", "disabled", "expired", "revoked", "out of balance", "over a window"];

/// The keys page; `created` shows a new key's secret (once), `error` a refused create form.
async fn keys(api: &AdminApi, req: &Request, error: Option<(&[ApiError], &Form)>) -> Page {
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

const CREATE_FIELDS: [&str; 6] = ["name", "group", "balance", "rpm", "expires_at", "account"];

/// A form's number (empty: absent).
fn number(form: &Form, name: &str, whole: bool) -> Result<Option<Value>, ApiError> {
    let text = form.get(name);
    if text.is_empty() {
        return Ok(None);
    }
    if whole {
        return text.parse::<u64>().map(|n| Some(json!(n))).map_err(|_| bad(name, format!("{name}: a whole number, not '{text}'")));
    }
    match text.trim_start_matches('$').parse::<f64>() {
        Ok(n) if n.is_finite() => Ok(Some(json!(n))),
        _ => Err(bad(name, format!("{name}: an amount in USD, not '{text}'"))),
    }
}

async fn create_key(api: &AdminApi, reveals: &Reveals, req: &Request) -> Page {
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
            // Post/redirect/get: the answer to the POST is a redirect to a page that shows the
            // secret once; reloading that page creates nothing and shows no secret.
            Ok(reveal_redirect(reveals, req, &view))
        }
        Err(e) if e.status() == 400 || e.status() == 409 => keys(api, req, Some((std::slice::from_ref(&e), f))).await,
        Err(e) => Err(e),
    }
}

/// A form's errors as (field, message) pairs, and the form they came from.
fn field_errors<'a>(error: Option<(&'a [ApiError], &'a Form)>) -> (Vec<(&'a str, &'a str)>, Option<&'a Form>) {
    match error {
        Some((errors, f)) => (errors.iter().map(|e| (e.param.as_deref().unwrap_or("form"), e.message.as_str())).collect(), Some(f)),
        None => (Vec::new(), None),
    }
}

/// The alerts for errors that name no field of the form (shown above it, outside its grid).
fn general_alerts(errors: &[(&str, &str)], fields: &[&str]) -> String {
    errors
        .iter()
        .filter(|(param, _)| !fields.contains(param))
        .map(|(_, message)| format!("<p class=\"alert\" role=\"alert\">{}</p>", esc(message)))
        .collect()
}

/// The redirect to the one-time page of a key's new secret (`view` with its `key`).
fn reveal_redirect(reveals: &Reveals, req: &Request, view: &Value) -> LocalResponse {
    let text = |field: &str| view[field].as_str().unwrap_or_default().to_string();
    let token = reveals.keep(&text("id"), &text("name"), &text("key"), &req.csrf, crate::base::clock::now_unix());
    redirect(&format!("/console/keys/created/{token}"))
}

/// The one page that shows a new key's secret (see `reveal`).
fn key_created(api: &AdminApi, reveals: &Reveals, req: &Request, token: &str) -> Page {
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

async fn key_detail(api: &AdminApi, req: &Request, id: &str, error: Option<(&[ApiError], &Form)>) -> Page {
    let clock = Clock::now(api);
    let key = api.key(id).await?;
    let view = api.view(&key).await?;
    let state = key_state(&view);
    let first = clock.days_before(29);
    let (start, end) = clock.range_ms(&first, &clock.today).ok_or_else(|| internal("calendar"))?;
    api.ledger.commit_now().await.map_err(internal)?;
    let (_, per_day) = api.ledger.usage_grouped(&key.id, start, end, &Grouping::Day(clock.tz().clone())).await.map_err(internal)?;
    let (total, per_model) = api.ledger.usage_grouped(&key.id, start, end, &Grouping::Model).await.map_err(internal)?;
    let mut windows = Vec::new();
    if let Some(w) = view["budgets"].as_object() {
        for (name, v) in w {
            windows.push(vec![
                esc(name),
                money(v["cap"].as_f64().unwrap_or(0.0)),
                money(v["spent"].as_f64().unwrap_or(0.0)),
                money(v["held"].as_f64().unwrap_or(0.0)),
                esc(v["end"].as_str().unwrap_or_default()),
            ]);
        }
    }
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
    let done = match Form::parse(&req.query).get("done") {
        "" => String::new(),
        d => format!("<p class=\"notice\" role=\"status\">{}</p>", esc(d)),
    };
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
    // A new secret (shown once, the old one accepted a while), or the end of the key.
    let manage = if view["revoked_at"].is_null() {
        let value = |name: &str| form.map_or("", |f| f.get(name)).to_string();
        let rotate = html::form(
            &action("rotate"),
            &req.csrf,
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
            &req.csrf,
            "card grid",
            &format!(
                "{}<p><button type=\"submit\" class=\"danger\">Revoke</button></p>",
                html::field_of("confirm", "Type revoke to confirm", &value("confirm"), err, "a revoked key never works again"),
            ),
        );
        format!("<h2>Secret</h2><div class=\"cols\"><div>{rotate}</div><div>{revoke}</div></div>")
    } else {
        String::new()
    };
    let body = format!(
        "{done}{general}<section class=\"card\"><div class=\"line\"><strong>{}</strong> <span class=\"mono\">{}</span> · group {} · <span class=\"state {}\">{state}</span> {toggle}</div>\
<p>Balance <strong id=\"balance\">{}</strong> · 30 days: {} requests, {}</p></section>\
<h2>Spend windows</h2>{}<h2>Top up</h2>{top_up}<h2>Limits and policy</h2>{edit}{manage}\
<div class=\"cols\"><div><h2>Spend per day (30 days)</h2>{}</div><div><h2>Per model (30 days)</h2>{}</div></div>\
<h2>Last requests</h2>{}<p><a href=\"/console/requests?key={}\">All of this key's requests</a> · <a href=\"/console/usage?group=day&amp;key={}\">Usage</a></p>",
        esc(&key.name),
        esc(&key.id),
        esc(&key.group),
        state.replace(' ', "-"),
        money(view["balance"].as_f64().unwrap_or(0.0)),
        count(total.requests),
        nanos(total.cost_nanos),
        html::table("windows", &["Window", "Cap", "Spent", "Held", "Ends"], &windows, None),
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

/// The edit form: (field, label, hint).
const EDIT_FORM: [(&str, &str, &str); 17] = [
    ("name", "Name", ""),
    ("group", "Group", "which platforms it may call"),
    ("account", "Account", "a shared account's name; empty: none"),
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
    ("tags", "Tags", "name=value, comma-separated"),
];

const EDIT_FIELDS: [&str; 21] = [
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
    "budgets",
    "tags",
    "account",
];

/// The edit form's values for a key's view.
fn edit_values(view: &Value) -> BTreeMap<&'static str, String> {
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
    ] {
        out.insert(name, text(&view[name]));
    }
    out.insert("models_allow", list(&view["models"]["allow"]));
    out.insert("models_deny", list(&view["models"]["deny"]));
    out.insert("ip_allow", list(&view["ip_allow"]));
    for (field, window) in [("budget_day", "day"), ("budget_week", "week"), ("budget_month", "month")] {
        out.insert(field, text(&view["budgets"][window]["cap"]));
    }
    let tags = view["tags"]
        .as_object()
        .map_or(String::new(), |t| t.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(", "));
    out.insert("tags", tags);
    out
}

/// The edit form as a `PATCH /admin/keys` body: an empty field clears its setting. Every field
/// the form can check itself is checked, and all of its problems are returned at once.
fn edit_patch(f: &Form) -> Result<Value, Vec<ApiError>> {
    let mut problems = Vec::new();
    let mut body = serde_json::Map::new();
    for (field, what) in [("name", "name: must not be empty"), ("group", "group: must not be empty")] {
        if f.get(field).trim().is_empty() {
            problems.push(bad(field, what));
        }
        body.insert(field.into(), json!(f.get(field)));
    }
    let account = f.get("account");
    body.insert("account".into(), if account.is_empty() { Value::Null } else { json!(account) });
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
    if problems.is_empty() {
        Ok(Value::Object(body))
    } else {
        Err(problems)
    }
}

/// The field of the edit form a policy error is about (`models.allow` → `models_allow`).
fn form_param(e: &mut ApiError) {
    let Some(param) = e.param.as_deref() else { return };
    let mapped = match param {
        "models" if e.message.contains("deny") => "models_deny",
        "models" => "models_allow",
        "budgets" if e.message.contains("week") => "budget_week",
        "budgets" if e.message.contains("month") => "budget_month",
        "budgets" => "budget_day",
        "balance_delta" => "amount",
        _ => return,
    };
    e.param = Some(mapped.to_string());
}

async fn key_action(api: &AdminApi, reveals: &Reveals, req: &Request, rest: &str) -> Page {
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
                Ok(view) => Ok(reveal_redirect(reveals, req, &view)),
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
            let reason = f.get("reason");
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
    match result {
        Ok(_) => Ok(redirect(&format!("/console/keys/{}?done={}", enc(id), enc(done)))),
        Err(mut e) if e.status() == 400 || e.status() == 409 => {
            form_param(&mut e);
            key_detail(api, req, id, Some((std::slice::from_ref(&e), f))).await
        }
        Err(e) => Err(e),
    }
}

/// The usage page (or its CSV: exactly the rows of the table).
async fn usage(api: &AdminApi, req: &Request, csv: bool) -> Page {
    let clock = Clock::now(api);
    let q = Form::parse(&req.query);
    let from = if q.get("from").is_empty() { clock.days_before(29) } else { q.get("from").to_string() };
    let to = if q.get("to").is_empty() { clock.today.clone() } else { q.get("to").to_string() };
    let checked = (|| -> Result<(Group, u64, u64), ApiError> {
        let group = Group::parse(q.get("group"), q.get("tag"))?;
        clock.calendar.day_start(&from).ok_or_else(|| bad("from", format!("from: a date YYYY-MM-DD, not '{from}'")))?;
        clock.calendar.day_start(&to).ok_or_else(|| bad("to", format!("to: a date YYYY-MM-DD, not '{to}'")))?;
        let (start_ms, end_ms) = clock.range_ms(&from, &to).ok_or_else(|| bad("to", "to: a date YYYY-MM-DD"))?;
        if end_ms <= start_ms {
            return Err(bad("to", "to: on or after from"));
        }
        if (end_ms - start_ms) / DAY_MS > MAX_RANGE_DAYS as u64 {
            return Err(bad("to", format!("to: at most {MAX_RANGE_DAYS} days after from")));
        }
        Ok((group, start_ms, end_ms))
    })();
    let (group, start_ms, end_ms) = match checked {
        Ok(c) => c,
        Err(e) if !csv => {
            let form = usage_form(&from, &to, q.get("group"), q.get("tag"), q.get("key"), Some(&e));
            let mut page = clock.page("Usage", "/console/usage", &req.csrf, &form);
            page.status = 400;
            return Ok(page);
        }
        Err(e) => return Err(e),
    };
    let only_key = q.get("key");
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let names = key_names(&keys);
    let only = if only_key.is_empty() { None } else { Some(vec![api.key(only_key).await?]) };
    let mut rows = usage_rows(api, only.as_deref(), &group, (start_ms, end_ms), clock.tz()).await?;
    add_failures(api, &mut rows, only.as_deref().unwrap_or(&keys), &group, (start_ms, end_ms), clock.tz()).await?;
    let mut total = Row::default();
    for r in rows.values() {
        total.totals.merge(&r.totals);
        total.failed += r.failed;
    }
    let label_text = |label: &str| -> String {
        match group {
            Group::Key => names.get(label).map_or(label.to_string(), |n| format!("{n} ({label})")),
            _ if label.is_empty() => "(none)".to_string(),
            _ => label.to_string(),
        }
    };
    let head = [group_title(&group), "Requests", "Input tokens", "Output tokens", "Billed", "Refunds", "Refunded", "Failed, not billed"];
    if csv {
        let mut out = String::new();
        out.push_str(&head.iter().map(|h| csv_cell(h)).collect::<Vec<_>>().join(","));
        out.push('\n');
        for (label, r) in &rows {
            let cells = [
                label_text(label),
                r.totals.requests.to_string(),
                r.totals.input_tokens.to_string(),
                r.totals.output_tokens.to_string(),
                format!("{:.9}", crate::base::money::usd(r.billed())),
                r.totals.refunds.to_string(),
                format!("{:.9}", crate::base::money::usd(r.totals.refunded_nanos)),
                r.failed.to_string(),
            ];
            out.push_str(&cells.iter().map(|c| csv_cell(c)).collect::<Vec<_>>().join(","));
            out.push('\n');
        }
        let mut resp = LocalResponse { status: 200, body: out.into(), content_type: "text/csv; charset=utf-8", headers: Vec::new() };
        resp.headers.push(("content-disposition", format!("attachment; filename=\"usage-{}-{from}-{to}.csv\"", group.name())));
        resp.headers.push(("cache-control", "no-store".into()));
        return Ok(resp);
    }
    let cells = |label: String, r: &Row| {
        vec![
            label,
            count(r.totals.requests),
            count(r.totals.input_tokens),
            count(r.totals.output_tokens),
            nanos(r.billed()),
            count(r.totals.refunds),
            nanos(r.totals.refunded_nanos),
            count(r.failed),
        ]
    };
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, r)| {
            let shown = match group {
                Group::Key => key_link(label, &names),
                _ => esc(&label_text(label)),
            };
            cells(shown, r)
        })
        .collect();
    let foot = cells("Total".to_string(), &total);
    let csv_link = format!("/console/usage.csv?{}", req.query.replace('"', ""));
    let note = if matches!(group, Group::Tag(_)) {
        "<p><small>Failed requests carry no tags: with a tag grouping they are not counted.</small></p>"
    } else {
        ""
    };
    let body = format!(
        "{}<p><small>{} to {} inclusive, days in {}. Billed: what requests cost; refunds are credits given back (failed video tasks); \
failed, not billed: requests answered with an error that cost nothing (from the request log, kept {} days).</small></p>{note}\
{}<p><a href=\"{}\" id=\"csv\">Download CSV</a> (exactly these rows)</p>",
        usage_form(&from, &to, q.get("group"), q.get("tag"), only_key, None),
        esc(&from),
        esc(&to),
        esc(clock.calendar.name()),
        api.request_log_days,
        html::table("usage", &head, &table_rows, Some(foot)),
        esc(&csv_link),
    );
    Ok(clock.page("Usage", "/console/usage", &req.csrf, &body))
}

fn group_title(group: &Group) -> &'static str {
    match group {
        Group::Key => "Key",
        Group::Model => "Model",
        Group::Provider => "Provider",
        Group::Day => "Day",
        Group::Tag(_) => "Tag value",
    }
}

/// A CSV cell (quoted when it must be; a cell a spreadsheet could read as a formula — one that
/// begins with `=`, `+`, `-`, `@`, a tab or a carriage return, OWASP's list — gets a leading `'`,
/// except a plain number such as a refund's negative cost).
fn csv_cell(text: &str) -> String {
    let number = text.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')) && text.parse::<f64>().is_ok();
    let text = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) && !number { format!("'{text}") } else { text.to_string() };
    if text.contains([',', '"', '\n', '\r', '\t']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

fn usage_form(from: &str, to: &str, group: &str, tag: &str, key: &str, error: Option<&ApiError>) -> String {
    let err = error.map(|e| (e.param.as_deref().unwrap_or("form"), e.message.as_str()));
    let mut options = String::new();
    for g in ["key", "model", "provider", "day", "tag"] {
        let sel = if g == group || (group.is_empty() && g == "key") { " selected" } else { "" };
        let _ = write!(options, "<option value=\"{g}\"{sel}>{g}</option>");
    }
    let group_error = match err {
        Some(("group", m)) => format!("<span class=\"error\">{}</span>", esc(m)),
        _ => String::new(),
    };
    let key_field = if key.is_empty() { String::new() } else { format!("<input type=\"hidden\" name=\"key\" value=\"{}\">", esc(key)) };
    format!(
        "<form method=\"get\" action=\"/console/usage\" class=\"filters\">{key_field}<label>Group by<select name=\"group\">{options}</select>{group_error}</label>{}{}{}\
<button type=\"submit\" class=\"secondary\">Show</button></form>",
        html::field("tag", "Tag name (group by tag)", tag, err, ""),
        html::field("from", "From", from, err, "YYYY-MM-DD"),
        html::field("to", "To (inclusive)", to, err, "YYYY-MM-DD"),
    )
}

const REQUEST_HEAD: [&str; 10] = ["Time", "Key", "Model", "Route", "Provider", "Status", "Tokens in/out", "Cost", "Latency", "Id"];

fn request_row(e: &LogEntry, names: &BTreeMap<String, String>, tz: &jiff::tz::TimeZone) -> Vec<String> {
    let status = match &e.refusal {
        Some(r) => format!("{} <small>{}</small>", e.status, esc(r)),
        None => e.status.to_string(),
    };
    vec![
        crate::base::clock::time_in(e.time_ms, tz),
        e.key_id.as_deref().map_or("—".to_string(), |k| key_link(k, names)),
        esc(e.model.as_deref().unwrap_or("—")),
        esc(&e.route),
        esc(e.provider.as_deref().unwrap_or("—")),
        status,
        format!("{} / {}", count(e.input_tokens), count(e.output_tokens)),
        format!("{}{}", nanos(e.cost_nanos), if e.estimated { " <small>est.</small>" } else { "" }),
        format!("{} ms", count(e.latency_ms)),
        format!("<a href=\"/console/requests/{}\" class=\"mono\">{}</a>", enc(&e.id), esc(&e.id)),
    ]
}

async fn requests(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let q = Form::parse(&req.query);
    let mut filter = Filter { end_ms: u64::MAX, limit: 50, ..Default::default() };
    let checked = (|| -> Result<(), ApiError> {
        if !q.get("key").is_empty() {
            filter.key_id = Some(q.get("key").to_string());
        }
        if !q.get("model").is_empty() {
            filter.model = Some(q.get("model").to_string());
        }
        match q.get("status") {
            "" => {}
            s @ ("2xx" | "3xx" | "4xx" | "5xx") => filter.status_class = s[..1].parse().ok(),
            other => return Err(bad("status", format!("status: 2xx, 3xx, 4xx or 5xx, not '{other}'"))),
        }
        if !q.get("from").is_empty() {
            filter.start_ms =
                clock.calendar.day_start(q.get("from")).ok_or_else(|| bad("from", "from: a date YYYY-MM-DD"))?.saturating_mul(1000);
        }
        if !q.get("to").is_empty() {
            filter.end_ms = clock.range_ms(q.get("to"), q.get("to")).ok_or_else(|| bad("to", "to: a date YYYY-MM-DD"))?.1;
        }
        if !q.get("cursor").is_empty() {
            filter.before =
                Some(crate::records::log::Cursor::parse(q.get("cursor")).ok_or_else(|| bad("cursor", "cursor: a page's next"))?);
        }
        Ok(())
    })();
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let names = key_names(&keys);
    let mut key_options = String::from("<option value=\"\">any</option>");
    for k in &keys {
        let sel = if q.get("key") == k.id { " selected" } else { "" };
        let _ = write!(key_options, "<option value=\"{}\"{sel}>{}</option>", esc(&k.id), esc(&k.name));
    }
    let mut status_options = String::from("<option value=\"\">any</option>");
    for s in ["2xx", "3xx", "4xx", "5xx"] {
        let sel = if q.get("status") == s { " selected" } else { "" };
        let _ = write!(status_options, "<option value=\"{s}\"{sel}>{s}</option>");
    }
    let err = checked.as_ref().err().map(|e| (e.param.as_deref().unwrap_or("form"), e.message.as_str()));
    let status_error = match err {
        Some(("status", m)) => format!("<span class=\"error\">{}</span>", esc(m)),
        _ => String::new(),
    };
    let filters = format!(
        "<form method=\"get\" action=\"/console/requests\" class=\"filters\"><label>Key<select name=\"key\">{key_options}</select></label>{}\
<label>Status<select name=\"status\">{status_options}</select>{status_error}</label>{}{}<button type=\"submit\" class=\"secondary\">Filter</button></form>",
        html::field("model", "Model", q.get("model"), err, ""),
        html::field("from", "From", q.get("from"), err, "YYYY-MM-DD"),
        html::field("to", "To (inclusive)", q.get("to"), err, "YYYY-MM-DD"),
    );
    if checked.is_err() {
        let mut page = clock.page("Requests", "/console/requests", &req.csrf, &filters);
        page.status = 400;
        return Ok(page);
    }
    let (entries, next) = api.store.requests().query(&filter).await.map_err(internal)?;
    let rows: Vec<Vec<String>> = entries.iter().map(|e| request_row(e, &names, clock.tz())).collect();
    let pager = match next {
        Some(cursor) => {
            let mut params: Vec<String> = ["key", "model", "status", "from", "to"]
                .iter()
                .filter(|n| !q.get(n).is_empty())
                .map(|n| format!("{n}={}", enc(q.get(n))))
                .collect();
            params.push(format!("cursor={}", enc(&cursor.to_string())));
            format!("<p class=\"pager\"><a href=\"/console/requests?{}\" id=\"older\">Older requests</a></p>", esc(&params.join("&")))
        }
        None => String::new(),
    };
    let body = format!(
        "{filters}<p><small>Kept {} days (at most {} entries); never a prompt or an answer.</small></p>{}{pager}",
        api.request_log_days,
        count(api.request_log_max as u64),
        html::table("requests", &REQUEST_HEAD, &rows, None)
    );
    Ok(clock.page("Requests", "/console/requests", &req.csrf, &body))
}

async fn request_detail(api: &AdminApi, req: &Request, id: &str) -> Page {
    let clock = Clock::now(api);
    let filter = Filter { id: Some(id.to_string()), end_ms: u64::MAX, limit: 1, ..Default::default() };
    let (entries, _) = api.store.requests().query(&filter).await.map_err(internal)?;
    let Some(e) = entries.first() else {
        return Err(ApiError::new(ErrorKind::NotFound, format!("No request with id '{id}' in the log.")));
    };
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let names = key_names(&keys);
    let opt = |v: &Option<String>| v.as_deref().map_or("—".to_string(), esc);
    let outcome = match (&e.refusal, e.status) {
        (Some(r), _) => format!(
            "Refused or failed by tollgate: <strong>{}</strong>{}",
            esc(r),
            e.param.as_deref().map_or(String::new(), |p| format!(" (about <code>{}</code>)", esc(p)))
        ),
        (None, s) if s >= 400 => format!("The upstream answered <strong>{s}</strong>"),
        (None, s) => format!("Answered {s}"),
    };
    let rows = vec![
        vec!["Id".to_string(), format!("<span class=\"mono\">{}</span>", esc(&e.id))],
        vec!["Time".to_string(), crate::base::clock::time_in(e.time_ms, clock.tz())],
        vec!["Outcome".to_string(), outcome],
        vec!["Key".to_string(), e.key_id.as_deref().map_or("—".to_string(), |k| key_link(k, &names))],
        vec!["Model".to_string(), opt(&e.model)],
        vec!["Route".to_string(), esc(&e.route)],
        vec!["Client protocol".to_string(), esc(&e.protocol)],
        vec!["Upstream protocol".to_string(), opt(&e.upstream_protocol)],
        vec!["Provider".to_string(), opt(&e.provider)],
        vec!["Attempts".to_string(), e.attempts.to_string()],
        vec!["Tokens".to_string(), format!("{} in, {} out", count(e.input_tokens), count(e.output_tokens))],
        vec!["Cost".to_string(), format!("{}{}", nanos(e.cost_nanos), if e.estimated { " (estimated)" } else { "" })],
        vec!["Latency".to_string(), format!("{} ms", count(e.latency_ms))],
        vec!["First byte".to_string(), e.first_byte_ms.map_or("—".to_string(), |ms| format!("{} ms", count(ms)))],
        vec!["Upstream request id".to_string(), opt(&e.upstream_request_id)],
    ];
    let body = format!("{}<p><a href=\"/console/requests\">All requests</a></p>", html::table("request", &["Field", "Value"], &rows, None));
    Ok(clock.page(&format!("Request {}", e.id), "/console/requests", &req.csrf, &body))
}

async fn providers(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let now_ms = crate::base::clock::now_ms();
    let since = now_ms.saturating_sub(15 * 60 * 1000);
    #[derive(Default)]
    struct Recent {
        n: u64,
        ok: u64,
        latency: Vec<u64>,
        first_byte: Vec<u64>,
    }
    let mut recent: BTreeMap<String, Recent> = BTreeMap::new();
    for_log(api, Filter { start_ms: since, end_ms: u64::MAX, ..Default::default() }, |e| {
        if let Some(p) = &e.provider {
            let r = recent.entry(p.clone()).or_default();
            r.n += 1;
            r.ok += u64::from((200..400).contains(&e.status));
            r.latency.push(e.latency_ms);
            r.first_byte.extend(e.first_byte_ms);
        }
    })
    .await?;
    let states: BTreeMap<String, (crate::upstream::health::State, Vec<crate::upstream::health::State>)> =
        api.health.states().into_iter().map(|(n, s, k)| (n, (s, k))).collect();
    let routing = api.routing.load();
    let mut rows = Vec::new();
    for u in &routing.catalog.upstreams {
        let c = &u.config;
        let (state, pool) = states.get(&c.name).cloned().unwrap_or((crate::upstream::health::State::Healthy, Vec::new()));
        let s = state_name(state);
        let pool = if pool.is_empty() {
            "—".to_string()
        } else {
            pool.iter()
                .enumerate()
                .map(|(i, k)| format!("#{i} <span class=\"state {0}\">{0}</span>", state_name(*k)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let r = recent.remove(&c.name).unwrap_or_default();
        let median = |v: &mut Vec<u64>| -> String {
            if v.is_empty() {
                return "—".to_string();
            }
            v.sort_unstable();
            format!("{} ms", count(v[v.len() / 2]))
        };
        let (mut latency, mut first_byte) = (r.latency, r.first_byte);
        rows.push(vec![
            esc(&c.name),
            esc(&format!("{:?}", c.protocol).to_lowercase()),
            format!("<span class=\"state {s}\">{s}</span>"),
            if r.n == 0 { "—".to_string() } else { format!("{:.1}% of {}", r.ok as f64 * 100.0 / r.n as f64, count(r.n)) },
            median(&mut latency),
            median(&mut first_byte),
            esc(&c.models.join(", ")),
            pool,
        ]);
    }
    let body = format!(
        "<p><small>Success rate, latency and time to first byte: medians of the last 15 minutes' requests (request log).</small></p>{}",
        html::table(
            "providers",
            &["Provider", "Protocol", "State", "Success", "Latency p50", "First byte p50", "Models", "Key pool"],
            &rows,
            None
        )
    );
    Ok(clock.page("Providers", "/console/providers", &req.csrf, &body))
}

/// Tasks the video page lists (the most recently updated).
const VIDEO_TASKS: usize = 500;

async fn video(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let Some(video) = &api.video else {
        let body = "<p>No video service is configured (<code>video:</code>).</p>";
        return Ok(clock.page("Video tasks", "/console/video", &req.csrf, body));
    };
    let q = Form::parse(&req.query);
    let wanted = q.get("status");
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let names = key_names(&keys);
    let tasks = video.recent_tasks(VIDEO_TASKS).await.map_err(internal)?;
    let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
    let mut rows = Vec::new();
    let when = |secs: u64| if secs == 0 { "—".to_string() } else { crate::base::clock::time_in(secs * 1000, clock.tz()) };
    for t in &tasks {
        let status = t.status.public();
        *by_status.entry(status).or_default() += 1;
        if !wanted.is_empty() && wanted != status {
            continue;
        }
        let took = t.completed_at.map_or("—".to_string(), |done| format!("{} s", count(done.saturating_sub(t.created_at))));
        let outcome = match (&t.error, t.refunded) {
            (Some(e), true) => format!("{} <small>refunded</small>", esc(&e.code)),
            (Some(e), false) => esc(&e.code),
            (None, _) => String::new(),
        };
        rows.push(vec![
            format!("<span class=\"mono\">{}</span>", esc(&t.id)),
            key_link(&t.owner, &names),
            esc(&t.api_model),
            format!("<span class=\"state {status}\">{status}</span> {}% {outcome}", t.progress),
            esc(t.job_id.as_deref().unwrap_or("—")),
            when(t.created_at),
            when(t.last_polled_at),
            took,
            nanos(t.cost_nanos),
        ]);
    }
    let (completed, failed) = video.finished_counts();
    let mut links = String::from("<p><a href=\"/console/video\">all</a>");
    for (s, n) in &by_status {
        let _ = write!(links, " · <a href=\"/console/video?status={s}\">{s} ({n})</a>");
    }
    links.push_str("</p>");
    let body = format!(
        "{links}<p><small>The {VIDEO_TASKS} most recently updated tasks. Finished since this process started: {completed} completed, {failed} failed.</small></p>{}",
        html::table("video", &["Task", "Key", "Model", "Status", "Upstream job", "Created", "Last polled", "Took", "Price"], &rows, None)
    );
    Ok(clock.page("Video tasks", "/console/video", &req.csrf, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
