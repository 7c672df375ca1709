//! `/console/people` (operators): who is in which team and with which role, besides what the
//! identity provider's claims say — a person by email or by the provider's subject, a role
//! (`member`, `team_admin`, `operator`) in an account; set and removed here, audited.

use super::html::{self, esc};
use super::page::*;
use super::Request;
use crate::admin::api::AdminApi;
use crate::protocol::{ApiError, ErrorKind};
use std::collections::BTreeMap;

const ROLES: [&str; 3] = ["member", "team_admin", "operator"];

pub(super) async fn people(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let accounts = api.keys.all_accounts().await.map_err(internal)?;
    let mut rows = Vec::new();
    for a in &accounts {
        for (who, role) in &a.people {
            rows.push(vec![esc(&a.name), esc(who), esc(role)]);
        }
    }
    // Who has signed in: each person with keys of their own (made at their first sign-in or
    // call), by the provider's subject — as the keys name them, with the teams they draw on.
    let mut signed: BTreeMap<String, (String, std::collections::BTreeSet<String>, usize)> = BTreeMap::new();
    for k in api.keys.all_keys().await.map_err(internal)?.iter().filter(|k| k.revoked_at.is_none()) {
        let Some(subject) = &k.owner else { continue };
        let entry = signed
            .entry(subject.clone())
            .or_insert_with(|| (k.policy.tags.get("person").unwrap_or(subject).clone(), Default::default(), 0));
        entry.1.extend(k.policy.account.clone());
        entry.2 += 1;
    }
    let signed_rows: Vec<Vec<String>> = signed
        .values()
        .map(|(person, teams, keys)| {
            let teams = if teams.is_empty() { "—".to_string() } else { teams.iter().map(|t| esc(t)).collect::<Vec<_>>().join(", ") };
            vec![esc(person), teams, keys.to_string()]
        })
        .collect();
    let options: String = accounts.iter().map(|a| format!("<option>{}</option>", esc(&a.name))).collect();
    let roles: String = ROLES.iter().map(|r| format!("<option>{r}</option>")).collect();
    let body = format!(
        "<p>People get their teams and roles from the identity provider's claims; an operator can add them here too (by email, or the provider's subject).</p>{}\
<h2>Set</h2><form method=\"post\" action=\"/console/people\" class=\"card grid\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
<label>Team<select name=\"account\">{options}</select></label><label>Person<input name=\"person\" required maxlength=\"255\" placeholder=\"ada@example.com\"></label>\
<label>Role<select name=\"role\">{roles}<option value=\"\">(take out)</option></select></label><p><button type=\"submit\">Save</button></p></form>",
        html::table("people", &["Team", "Person", "Role"], &rows, None),
        esc(&req.csrf),
    );
    let body = format!(
        "{body}<h2>Who has signed in</h2><p><small>People with keys of their own, by the provider's subject; their roles come from the provider's claims at each sign-in, and from the teams above.</small></p>{}",
        html::table("signed-in", &["Person", "Teams", "Keys"], &signed_rows, None)
    );
    Ok(clock.page("People", "/console/people", &req.csrf, &body))
}

pub(super) async fn set_person(api: &AdminApi, req: &Request) -> Page {
    let f = &req.form;
    let name = f.get("account");
    let mut account = api
        .keys
        .account(name)
        .map(|a| (*a).clone())
        .ok_or_else(|| ApiError::new(ErrorKind::BadRequest, format!("account: no account named '{name}'")).with_param("account"))?;
    let role = match f.get("role") {
        "" => None,
        r => Some(r.to_string()),
    };
    let typed = f.get("person").trim();
    let who = if typed.contains('@') { typed.to_ascii_lowercase() } else { typed.to_string() };
    crate::admin::teams::set_people(&mut account, BTreeMap::from([(who.clone(), role.clone())]))?;
    api.keys.put_account(&account).await.map_err(internal)?;
    let what = match &role {
        Some(r) => format!("{who} set as {r} of team {name} by an operator"),
        None => format!("{who} taken out of team {name} by an operator"),
    };
    api.ledger.top_up_because(&crate::policy::budget::account_purse(name), 0, Some(&what)).await.map_err(internal)?;
    log::info!("console: {what}");
    Ok(super::redirect("/console/people"))
}
