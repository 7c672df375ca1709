//! The console of a person signed in with the identity provider (not an operator): what their
//! role allows, checked here on every request — a key, a team or a page that is not theirs is
//! the same 404 as none.
//!
//! * Everyone (`member`): `/console/me` — who they are, their teams' balances with a card
//!   top-up and a redemption code for each (`wallet`), their own keys (the one their first
//!   call with a token made, and those they made here), each key's balance and spend; make a
//!   key (on their team's account, with `identity.oidc.allowance` of its own; its secret shown
//!   once), rotate and revoke their own keys; their spend over 30 days.
//! * `team_admin`: `/console/team` — for each of their teams: the account's balance, every
//!   key that draws on it with its owner, balance and spend; set a key's own allowance (never
//!   above what the team's account holds), disable and enable a key. Every balance move is in
//!   the audit trail with the person's name.
//!
//! Operators (by role or the admin token) have the whole console instead (`pages`).

use super::html::{self, enc, esc, nanos};
use super::page::*;
use super::reveal::Reveals;
use super::{html as reply, Request};
use crate::admin::api::AdminApi;
use crate::identity::{Person, Role};
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::records::usage::Grouping;
use serde_json::json;
use std::fmt::Write;

/// Put what a person did to a key in the audit trail, with their name (no balance moves).
async fn audit(api: &AdminApi, key_id: &str, what: &str, person: &Person) -> Result<(), ApiError> {
    api.ledger
        .top_up_because(key_id, 0, Some(&format!("{what} by {} ({})", person.label(), person.role().name())))
        .await
        .map_err(internal)?;
    Ok(())
}

/// The most keys one person may hold (their first-call key and the ones they make).
pub(crate) const MAX_KEYS_PER_PERSON: usize = 10;

fn not_found() -> ApiError {
    ApiError::new(ErrorKind::NotFound, "There is no such page or key here.")
}

/// The pages in a person's navigation.
fn nav(person: &Person) -> Vec<(&'static str, &'static str)> {
    let mut pages = vec![("/console/me", "My keys")];
    if person.role() >= Role::TeamAdmin {
        pages.push(("/console/team", "My team"));
    }
    pages
}

fn frame(api: &AdminApi, person: &Person, req: &Request, title: &str, current: &str, body: &str) -> LocalResponse {
    let tz = api.routing.load().calendar.name().to_string();
    reply(200, html::frame(&nav(person), title, current, &req.csrf, &tz, body))
}

pub(super) async fn route(api: &AdminApi, reveals: &Reveals, req: &Request, person: &Person) -> LocalResponse {
    let path = req.path.trim_end_matches('/');
    let result = match (req.method.as_str(), path) {
        ("GET", "" | "/console" | "/console/me") => me(api, req, person).await,
        ("POST", "/console/me/keys") => create(api, reveals, req, person).await,
        ("POST", "/console/me/topup") => super::wallet::topup(api, req, person, &teams(api, person)).await,
        ("POST", "/console/me/redeem") => super::wallet::redeem(api, req, person, &teams(api, person)).await,
        ("GET", "/console/me/statement") => super::wallet::statement(api, req, person).await,
        ("GET", p) if p.starts_with("/console/me/keys/created/") => {
            created(api, reveals, req, person, &p["/console/me/keys/created/".len()..])
        }
        ("POST", p) if p.starts_with("/console/me/keys/") => own_action(api, req, person, &p["/console/me/keys/".len()..]).await,
        ("GET", "/console/team") if person.role() >= Role::TeamAdmin => team(api, req, person).await,
        ("POST", p) if p.starts_with("/console/team/keys/") && person.role() >= Role::TeamAdmin => {
            team_action(api, req, person, &p["/console/team/keys/".len()..]).await
        }
        ("POST", p) if p.starts_with("/console/team-policy/") && person.role() >= Role::TeamAdmin => {
            set_policy(api, req, person, &p["/console/team-policy/".len()..]).await
        }
        _ => Err(not_found()),
    };
    match result {
        Ok(r) => r,
        Err(e) => {
            let body = format!("<p class=\"alert\" role=\"alert\">{}</p><p><a href=\"/console/me\">My keys</a></p>", esc(&e.message));
            let mut r = frame(api, person, req, if e.status() == 404 { "Not found" } else { "Refused" }, "", &body);
            r.status = e.status();
            r
        }
    }
}

/// The teams a person belongs to that are accounts here.
fn teams(api: &AdminApi, person: &Person) -> Vec<String> {
    person.teams.iter().filter(|t| api.keys.account(t).is_some()).cloned().collect()
}

async fn spend(api: &AdminApi, key: &KeyRecord) -> Result<i64, ApiError> {
    let clock = Clock::now(api);
    let (start, end) = clock.range_ms(&clock.days_before(29), &clock.today).ok_or_else(|| internal("calendar"))?;
    let (total, _) = api.ledger.usage_grouped(&key.id, start, end, &Grouping::Model).await.map_err(internal)?;
    Ok(total.cost_nanos)
}

fn state(key: &KeyRecord) -> &'static str {
    if key.revoked_at.is_some() {
        "revoked"
    } else if !key.enabled {
        "disabled"
    } else {
        "active"
    }
}

fn form(action: &str, csrf: &str, inner: &str) -> String {
    format!(
        "<form method=\"post\" action=\"{action}\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">{inner}</form>",
        esc(csrf)
    )
}

/// The keys `person` owns, revoked ones included.
async fn keys_of(api: &AdminApi, person: &Person) -> Result<Vec<KeyRecord>, ApiError> {
    Ok(api.keys.all_keys().await.map_err(internal)?.into_iter().filter(|k| k.owner.as_deref() == Some(person.subject.as_str())).collect())
}

async fn me(api: &AdminApi, req: &Request, person: &Person) -> Page {
    api.ledger.commit_now().await.map_err(internal)?;
    let mine = keys_of(api, person).await?;
    let mut rows = Vec::new();
    let mut total = 0;
    for k in &mine {
        let balance = api.ledger.balance(&k.id).await.map_err(internal)?;
        let spent = spend(api, k).await?;
        total += spent;
        let mut actions = String::new();
        if k.revoked_at.is_none() && k.origin != crate::records::key::KeyOrigin::Identity {
            actions.push_str(&form(
                &format!("/console/me/keys/{}/rotate", enc(&k.id)),
                &req.csrf,
                "<button type=\"submit\">Rotate</button>",
            ));
        }
        if k.revoked_at.is_none() {
            actions.push_str(&form(
                &format!("/console/me/keys/{}/revoke", enc(&k.id)),
                &req.csrf,
                "<button type=\"submit\" class=\"danger\">Revoke</button>",
            ));
        }
        rows.push(vec![
            esc(&k.name),
            format!("<code>{}</code>", esc(&k.id)),
            esc(k.policy.account.as_deref().unwrap_or("—")),
            nanos(balance),
            nanos(spent),
            state(k).to_string(),
            actions,
        ]);
    }
    let teams = teams(api, person);
    let who = format!(
        "<p id=\"who\">Signed in as <strong>{}</strong> ({}){}.</p>",
        esc(&person.display),
        person.role().name(),
        if teams.is_empty() {
            " — no team of this gateway yet: ask your team admin".to_string()
        } else {
            format!(", team {}", esc(&teams.join(", ")))
        }
    );
    let create = if teams.is_empty() {
        String::new()
    } else {
        let options: String = teams.iter().map(|t| format!("<option>{}</option>", esc(t))).collect();
        format!(
            "<h2>New key</h2><form method=\"post\" action=\"/console/me/keys\" class=\"card grid\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
<label>Name<input name=\"name\" required maxlength=\"64\"></label><label>Team<select name=\"team\">{options}</select></label>\
<p><button type=\"submit\">Create key</button></p></form>",
            esc(&req.csrf)
        )
    };
    let ids: Vec<String> = mine.iter().map(|k| k.id.clone()).collect();
    let alerts = alerts_table(api, "my-alerts", "Alerts about my keys", &ids).await?;
    let wallet = super::wallet::section(api, req, person, &teams).await?;
    let body = format!(
        "{who}{wallet}{}<p>Spent over 30 days: <strong id=\"spent\">{}</strong></p>{alerts}{create}",
        html::table("my-keys", &["Name", "Id", "Team", "Balance", "30 days", "State", ""], &rows, None),
        nanos(total)
    );
    let mut page = frame(api, person, req, "My keys", "/console/me", &body);
    super::wallet::allow_checkout(api, &mut page);
    Ok(page)
}

/// The alerts decided about `owners` (key ids, `acct:<name>`), newest first, as a table under
/// `title` (nothing when there are none).
async fn alerts_table(api: &AdminApi, id: &str, title: &str, owners: &[String]) -> Result<String, ApiError> {
    let mut found = Vec::new();
    for owner in owners {
        found.extend(api.alerts(owner, 20).await?);
    }
    if found.is_empty() {
        return Ok(String::new());
    }
    found.sort_by(|a, b| b["created_at"].as_str().cmp(&a["created_at"].as_str()));
    let about = |d: &serde_json::Value| -> String {
        let d = &d["data"];
        let what = d["window"].as_str().or(d["plan"].as_str()).unwrap_or_default();
        let whose = d["whose"]["key_name"].as_str().or(d["whose"]["account"].as_str()).unwrap_or_default();
        match d["threshold"].as_f64() {
            Some(t) => format!("{whose} {what} at {:.0} %", t * 100.0),
            None => format!("{whose} {what}"),
        }
    };
    let rows: Vec<Vec<String>> = found
        .iter()
        .take(50)
        .map(|a| {
            vec![
                esc(a["created_at"].as_str().unwrap_or_default()),
                esc(a["type"].as_str().unwrap_or_default()),
                esc(about(a).trim()),
                format!("{} ({} attempt(s))", esc(a["status"].as_str().unwrap_or_default()), a["attempts"]),
            ]
        })
        .collect();
    Ok(format!("<h3>{title}</h3>{}", html::table(id, &["Time", "Alert", "About", "Sent"], &rows, None)))
}

/// One of the person's own keys (revoked included), or the 404 of none.
async fn own(api: &AdminApi, person: &Person, id: &str) -> Result<KeyRecord, ApiError> {
    match api.key(id).await {
        Ok(k) if k.owner.as_deref() == Some(person.subject.as_str()) => Ok(k),
        _ => Err(not_found()),
    }
}

async fn create(api: &AdminApi, reveals: &Reveals, req: &Request, person: &Person) -> Page {
    let team = req.form.get("team");
    if !teams(api, person).iter().any(|t| t == team) {
        return Err(ApiError::new(ErrorKind::Forbidden, "You can make keys only on a team of yours.").with_param("team"));
    }
    let identity = api.identity.as_ref().ok_or_else(not_found)?;
    // A person holds a bounded number of keys (revoked ones aside): each key is a way to spend
    // the team's money.
    let held = keys_of(api, person).await?.iter().filter(|k| k.revoked_at.is_none()).count();
    if held >= MAX_KEYS_PER_PERSON {
        return Err(ApiError::new(ErrorKind::Forbidden, format!("You hold {held} keys, the most a person may; revoke one first.")));
    }
    // A signed-up customer's keys are in the sign-up's group.
    let signed_up = api.keys.account(team).is_some_and(|a| a.origin == crate::records::key::KeyOrigin::Signup);
    let signup = api.routing.load().signup.clone();
    let group = match (signed_up, signup.as_deref()) {
        (true, Some(s)) => s.group.clone(),
        _ => identity.cfg.group.clone(),
    };
    let body = json!({
        "name": req.form.get("name"),
        "group": group,
        "balance": identity.cfg.allowance_nanos as f64 / 1e9,
        "account": team,
        "tags": {"person": person.label(), "team": team},
    });
    let view = api.create_key(crate::admin::api::parse_json(body.to_string().as_bytes())?).await?;
    let id = view["id"].as_str().unwrap_or_default().to_string();
    let mut rec = api.key(&id).await?;
    rec.owner = Some(person.subject.clone());
    rec.allowance_cap = identity.cfg.allowance_nanos > 0;
    // What the team's admins allow its members' keys, at most.
    if let Some(ceiling) = api.keys.account(team).and_then(|a| a.member_policy.clone()) {
        ceiling.apply(&mut rec);
    }
    api.keys.put_key(&rec).await.map_err(internal)?;
    log::info!("console: {} made key {} ({}) on team {team}", person.label(), rec.name, rec.id);
    audit(api, &id, &format!("key '{}' made on team {team}", rec.name), person).await?;
    let token = reveals.keep(&id, &rec.name, view["key"].as_str().unwrap_or_default(), &req.csrf, crate::base::clock::now_unix());
    Ok(super::redirect(&format!("/console/me/keys/created/{token}")))
}

fn created(api: &AdminApi, reveals: &Reveals, req: &Request, person: &Person, token: &str) -> Page {
    let Some(reveal) = reveals.take(token, &req.csrf, crate::base::clock::now_unix()) else {
        let body = "<p class=\"alert\" role=\"alert\">This link was used already (or expired): a key's secret is shown only once.</p><p><a href=\"/console/me\">My keys</a></p>";
        return Ok(frame(api, person, req, "Secret already shown", "/console/me", body));
    };
    let body = format!(
        "<p class=\"notice\" role=\"status\">Key <strong>{}</strong> created. Copy its secret now: it is shown only this once.</p>\
<div class=\"secret\"><input id=\"secret\" readonly value=\"{}\" aria-label=\"Secret\"><button type=\"button\" data-copy=\"secret\">Copy</button></div>\
<p><a href=\"/console/me\">My keys</a></p>",
        esc(&reveal.name),
        esc(&reveal.secret),
    );
    let mut page = frame(api, person, req, "Key created", "/console/me", &body);
    page.headers.push(("cache-control", "no-store".to_string()));
    Ok(page)
}

async fn own_action(api: &AdminApi, req: &Request, person: &Person, rest: &str) -> Page {
    let (id, action) = rest.rsplit_once('/').ok_or_else(not_found)?;
    let key = own(api, person, id).await?;
    match action {
        "revoke" => {
            api.revoke_key(&key.id).await?;
            log::info!("console: {} revoked their key {}", person.label(), key.id);
            audit(api, &key.id, "key revoked", person).await?;
            Ok(super::redirect("/console/me"))
        }
        "rotate" => {
            let view = api.rotate_key(&key.id, 0).await?;
            log::info!("console: {} rotated their key {}", person.label(), key.id);
            audit(api, &key.id, "key rotated", person).await?;
            let body = format!(
                "<p class=\"notice\" role=\"status\">Key <strong>{}</strong> has a new secret; the old one no longer works. Copy it now: it is shown only this once.</p>\
<div class=\"secret\"><input id=\"secret\" readonly value=\"{}\" aria-label=\"Secret\"><button type=\"button\" data-copy=\"secret\">Copy</button></div><p><a href=\"/console/me\">My keys</a></p>",
                esc(&key.name),
                esc(view["key"].as_str().unwrap_or_default())
            );
            let mut page = frame(api, person, req, "Key rotated", "/console/me", &body);
            page.headers.push(("cache-control", "no-store".to_string()));
            Ok(page)
        }
        _ => Err(not_found()),
    }
}

/// The teams a team admin runs (those that are accounts here).
fn runs(api: &AdminApi, person: &Person) -> Vec<String> {
    person.admin_of.iter().filter(|t| api.keys.account(t).is_some()).cloned().collect()
}

async fn team(api: &AdminApi, req: &Request, person: &Person) -> Page {
    api.ledger.commit_now().await.map_err(internal)?;
    let all = api.keys.all_keys().await.map_err(internal)?;
    let mut body = String::new();
    for team in runs(api, person) {
        let account = api.ledger.balance(&crate::policy::budget::account_purse(&team)).await.map_err(internal)?;
        let mut rows = Vec::new();
        for k in all.iter().filter(|k| k.policy.account.as_deref() == Some(team.as_str())) {
            let balance = api.ledger.balance(&k.id).await.map_err(internal)?;
            let toggle = if k.enabled { "disable" } else { "enable" };
            let actions = if k.revoked_at.is_some() {
                String::new()
            } else {
                format!(
                    "{}{}",
                    form(
                        &format!("/console/team/keys/{}/allowance", enc(&k.id)),
                        &req.csrf,
                        &format!("<input name=\"allowance\" size=\"8\" aria-label=\"Allowance (USD)\" value=\"{:.2}\"><input name=\"reason\" size=\"12\" aria-label=\"Reason\" placeholder=\"reason\"><button type=\"submit\">Set allowance</button>", balance as f64 / 1e9)
                    ),
                    form(&format!("/console/team/keys/{}/{toggle}", enc(&k.id)), &req.csrf, &format!("<button type=\"submit\">{}</button>", if k.enabled { "Disable" } else { "Enable" }))
                )
            };
            let spent = spend(api, k).await?;
            rows.push((vec![esc(&k.name), format!("<code>{}</code>", esc(&k.id))], [balance, spent], vec![state(k).to_string(), actions]));
        }
        // One precision for every amount of the table.
        let digits = html::money_digits(rows.iter().flat_map(|(_, amounts, _)| *amounts));
        let rows: Vec<Vec<String>> = rows
            .into_iter()
            .map(|(mut row, amounts, rest)| {
                row.extend(amounts.map(|n| html::nanos_at(n, digits)));
                row.extend(rest);
                row
            })
            .collect();
        let log = team_log(api, all.iter().filter(|k| k.policy.account.as_deref() == Some(team.as_str()))).await?;
        let mut owners = vec![crate::policy::budget::account_purse(&team)];
        owners.extend(all.iter().filter(|k| k.policy.account.as_deref() == Some(team.as_str())).map(|k| k.id.clone()));
        let alerts = alerts_table(api, &format!("team-alerts-{}", esc(&team)), "Alerts", &owners).await?;
        let record = api.keys.account(&team);
        // The team's own spend windows (what every member's call counts against) and its plan.
        let (windows, plan) = match &record {
            Some(r) => {
                let view = api.account_view(r).await?;
                (super::keys::window_rows(&view), super::keys::plan_line(&view["plan_standing"]))
            }
            None => (Vec::new(), String::new()),
        };
        let windows = if windows.is_empty() {
            String::new()
        } else {
            format!(
                "<h3>The team's spend windows</h3>{}",
                html::table(
                    &format!("team-windows-{}", esc(&team)),
                    &["Window", "Cap", "Spent", "Held", "Ends (rolling: frees)"],
                    &windows,
                    None
                )
            )
        };
        let now = record.as_ref().and_then(|a| a.member_policy.clone()).unwrap_or_default();
        let usd = |v: Option<i64>| v.map_or(String::new(), |n| format!("{:.2}", n as f64 / 1e9));
        let num = |v: Option<u64>| v.map_or(String::new(), |n| n.to_string());
        // The operators' form style: a card of labelled inputs in a grid.
        let policy = html::form(
            &format!("/console/team-policy/{}", enc(&team)),
            &req.csrf,
            "card grid",
            &format!(
                "<p class=\"full\"><strong>Members' keys may at most</strong></p>\
<label>Models<input name=\"models\" value=\"{}\" placeholder=\"any\"></label><label>rpm<input name=\"rpm\" size=\"6\" value=\"{}\"></label>\
<label>tpm<input name=\"tpm\" size=\"8\" value=\"{}\"></label><label>USD a day<input name=\"day\" size=\"6\" value=\"{}\"></label>\
<label>a week<input name=\"week\" size=\"6\" value=\"{}\"></label><label>a month<input name=\"month\" size=\"6\" value=\"{}\"></label>\
<label>Days a key lives<input name=\"max_days\" size=\"4\" value=\"{}\"></label><p><button type=\"submit\">Save</button></p>",
                esc(&now.models.clone().unwrap_or_default().join(", ")),
                num(now.rpm.map(u64::from)),
                num(now.tpm),
                usd(now.budgets.day),
                usd(now.budgets.week),
                usd(now.budgets.month),
                num(now.max_days.map(u64::from)),
            ),
        );
        let _ = write!(
            body,
            "<section class=\"team\" data-team=\"{0}\"><h2>Team {0}</h2><p>The team's account holds <strong class=\"account-balance\">{1}</strong>.</p>{plan}{windows}{2}{3}{alerts}<h3>Last requests</h3>{4}</section>",
            esc(&team),
            nanos(account),
            html::table(&format!("team-{}", esc(&team)), &["Key", "Id", "Allowance left", "30 days", "State", ""], &rows, None),
            policy,
            html::table(&format!("team-log-{}", esc(&team)), &["Time", "Key", "Model", "Endpoint", "Status", "ms"], &log, None),
        );
    }
    if body.is_empty() {
        body = "<p>None of your teams is an account of this gateway.</p>".into();
    }
    Ok(frame(api, person, req, "My team", "/console/team", &body))
}

async fn team_action(api: &AdminApi, req: &Request, person: &Person, rest: &str) -> Page {
    let (id, action) = rest.rsplit_once('/').ok_or_else(not_found)?;
    let key = api.key(id).await.map_err(|_| not_found())?;
    let team = key.policy.account.clone().filter(|t| runs(api, person).contains(t)).ok_or_else(not_found)?;
    match action {
        "enable" | "disable" => {
            let patch = json!({"enabled": action == "enable"});
            api.patch_key(&key.id, crate::admin::api::parse_json(patch.to_string().as_bytes())?).await?;
            log::info!("console: {} ({}) {action}d key {} of team {team}", person.label(), person.role().name(), key.id);
            audit(api, &key.id, &format!("key {action}d (team {team})"), person).await?;
        }
        "allowance" => {
            let wanted: f64 = req.form.get("allowance").parse().ok().filter(|v: &f64| v.is_finite() && *v >= 0.0).ok_or_else(|| {
                ApiError::new(ErrorKind::BadRequest, "The allowance is an amount in USD, 0 or more.").with_param("allowance")
            })?;
            let wanted = crate::base::money::usd_to_nanos(wanted);
            let account = api.ledger.balance(&crate::policy::budget::account_purse(&team)).await.map_err(internal)?;
            if wanted > account {
                return Err(ApiError::new(
                    ErrorKind::Forbidden,
                    format!("The team's account holds {}; a key's allowance cannot be more.", nanos(account)),
                )
                .with_param("allowance"));
            }
            let now = api.ledger.balance(&key.id).await.map_err(internal)?;
            let reason = match req.form.get("reason") {
                "" => format!("allowance set by {} (team admin of {team})", person.label()),
                r => format!("allowance set by {} (team admin of {team}): {r}", person.label()),
            };
            api.ledger.top_up_because(&key.id, wanted - now, Some(&reason)).await.map_err(internal)?;
            // From now on the key is bounded by it (a member's key without one draws on the
            // team's account alone).
            if !key.allowance_cap {
                let mut capped = key.clone();
                capped.allowance_cap = true;
                api.keys.put_key(&capped).await.map_err(internal)?;
            }
            log::info!("console: {} set the allowance of key {} to {wanted} nano-USD", person.label(), key.id);
        }
        _ => return Err(not_found()),
    }
    Ok(super::redirect("/console/team"))
}

/// A team admin sets what their members' keys may do at most: within the operator's limit for
/// the team (`member_limit`) and the team's own spend windows; applied to every member's key of
/// the team now, and to each one made later.
async fn set_policy(api: &AdminApi, req: &Request, person: &Person, team: &str) -> Page {
    let team = crate::base::text::decode_component(team);
    if !runs(api, person).contains(&team) {
        return Err(not_found());
    }
    let mut account = (*api.keys.account(&team).ok_or_else(not_found)?).clone();
    let f = &req.form;
    let number = |name: &str| -> Result<Option<f64>, ApiError> {
        match f.get(name) {
            "" => Ok(None),
            v => v.parse::<f64>().ok().filter(|n| n.is_finite() && *n > 0.0).map(Some).ok_or_else(|| {
                ApiError::new(ErrorKind::BadRequest, format!("{name}: a number above 0, or empty for no bound")).with_param(name)
            }),
        }
    };
    let models: Vec<String> = f.get("models").split(',').map(str::trim).filter(|m| !m.is_empty()).map(str::to_string).collect();
    let input = crate::admin::teams::CeilingInput {
        models: (!models.is_empty()).then_some(models),
        rpm: number("rpm")?.map(|v| v as u32),
        tpm: number("tpm")?.map(|v| v as u64),
        budgets: Some(crate::policy::budget::BudgetsInput {
            day: number("day")?,
            week: number("week")?,
            month: number("month")?,
            ..Default::default()
        }),
        max_days: number("max_days")?.map(|v| v as u32),
    };
    let ceiling = input.parse()?;
    let refused = |why: String| {
        ApiError::new(ErrorKind::Forbidden, format!("Beyond what the team may allow: {why}."))
            .with_param(why.split(':').next().unwrap_or("form"))
    };
    if let Some(limit) = &account.member_limit {
        ceiling.within(limit).map_err(refused)?;
    }
    // Never above the team's own spend windows (a member's key without a window of its own is
    // bounded by the team's anyway).
    for (name, mine, team_cap) in [
        ("day", ceiling.budgets.day, account.budgets.day),
        ("week", ceiling.budgets.week, account.budgets.week),
        ("month", ceiling.budgets.month, account.budgets.month),
    ] {
        if let (Some(m), Some(t)) = (mine, team_cap) {
            if m > t {
                return Err(refused(format!("{name}: the team's own {name} is {:.2} USD", t as f64 / 1e9)));
            }
        }
    }
    account.member_policy = Some(ceiling.clone());
    api.keys.put_account(&account).await.map_err(internal)?;
    for mut key in api.keys.all_keys().await.map_err(internal)? {
        if key.owner.is_some() && key.policy.account.as_deref() == Some(team.as_str()) && key.revoked_at.is_none() {
            ceiling.apply(&mut key);
            api.keys.put_key(&key).await.map_err(internal)?;
        }
    }
    let purse = crate::policy::budget::account_purse(&team);
    api.ledger
        .top_up_because(
            &purse,
            0,
            Some(&format!("members' key policy of team {team} set by {} ({})", person.label(), person.role().name())),
        )
        .await
        .map_err(internal)?;
    log::info!("console: {} set the members' key policy of team {team}", person.label());
    Ok(super::redirect("/console/team"))
}

/// The last requests of a team's keys (the request log, 7 days, newest first, at most 30).
async fn team_log<'a>(api: &AdminApi, keys: impl Iterator<Item = &'a KeyRecord>) -> Result<Vec<Vec<String>>, ApiError> {
    let now = crate::base::clock::now_ms();
    let tz = api.routing.load().calendar.tz().clone();
    let mut entries = Vec::new();
    for key in keys {
        let filter = crate::records::log::Filter {
            key_id: Some(key.id.clone()),
            start_ms: now.saturating_sub(7 * 86_400_000),
            end_ms: now + 1,
            limit: 30,
            ..Default::default()
        };
        let (page, _) = api.store.requests().query(&filter).await.map_err(internal)?;
        entries.extend(page);
    }
    entries.sort_by_key(|e| std::cmp::Reverse(e.time_ms));
    entries.truncate(30);
    Ok(entries
        .iter()
        .map(|e| {
            vec![
                esc(&crate::base::clock::time_in(e.time_ms, &tz)),
                esc(e.key_name.as_deref().unwrap_or("—")),
                esc(e.model.as_deref().unwrap_or("—")),
                esc(&e.route),
                e.status.to_string(),
                e.latency_ms.to_string(),
            ]
        })
        .collect())
}
