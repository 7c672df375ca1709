//! A person's teams' money on `/console/me`: each team account's balance, a card top-up
//! (`payments.stripe`: the offered amounts or one within bounds, paid on Stripe's page and
//! credited by its webhook) and a redemption code, redeemed into the team's account. Anyone
//! of a team may pay into it; nobody takes money out here.

use super::html::esc;
use super::page::{bad, done_notice, internal, Page};
use super::Request;
use crate::admin::api::AdminApi;
use crate::identity::Person;
use crate::protocol::{ApiError, ErrorKind};

/// The section: a card per team with its balance and forms (and, for a team they run, its
/// statements).
pub(super) async fn section(api: &AdminApi, req: &Request, person: &Person, teams: &[String]) -> Result<String, ApiError> {
    let mut out = done_notice(&req.query);
    match super::Form::parse(&req.query).get("topup") {
        "done" => {
            out.push_str("<p class=\"notice\" role=\"status\">Payment received: the credit appears once the card provider confirms it.</p>")
        }
        "cancelled" => out.push_str("<p class=\"notice\" role=\"status\">Payment cancelled: nothing was charged.</p>"),
        _ => {}
    }
    if teams.is_empty() {
        return Ok(out);
    }
    out.push_str("<h2>Balance</h2>");
    let csrf = esc(&req.csrf);
    for team in teams {
        let balance = api.ledger.balance(&crate::policy::budget::account_purse(team)).await.map_err(internal)?;
        let t = esc(team);
        out.push_str(&format!(
            "<section class=\"card\" data-team=\"{t}\"><h3>Team {t}</h3><p>Balance: <strong class=\"team-balance\">{}</strong></p>",
            super::html::nanos(balance)
        ));
        if person.admin_of.iter().any(|a| a == team) {
            let clock = super::page::Clock::now(api);
            let this = clock.today[..7].to_string();
            let last = crate::policy::budget::Calendar::add_days(&format!("{this}-01"), -1).map(|d| d[..7].to_string()).unwrap_or_default();
            let link = |m: &str| {
                format!("<a class=\"statement\" href=\"/console/me/statement?team={}&amp;month={m}\">{m}</a>", super::html::enc(team))
            };
            out.push_str(&format!("<p>Statements (CSV): {} {}</p>", link(&this), link(&last)));
        }
        if let Some(stripe) = api.selling.stripe.as_ref() {
            let cfg = &stripe.cfg;
            let per = f64::from(cfg.minor_per_unit);
            let buttons: String = cfg
                .amounts
                .iter()
                .map(|m| format!("<button type=\"submit\" name=\"amount\" value=\"{}\">{}</button> ", *m as f64 / per, esc(&cfg.show(*m))))
                .collect();
            out.push_str(&format!(
                "<form method=\"post\" action=\"/console/me/topup\" class=\"topup\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
<input type=\"hidden\" name=\"team\" value=\"{t}\"><input type=\"hidden\" name=\"nonce\" value=\"{nonce}\">\
<p>Top up by card: {buttons}</p></form>\
<form method=\"post\" action=\"/console/me/topup\" class=\"topup-custom\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
<input type=\"hidden\" name=\"team\" value=\"{t}\"><input type=\"hidden\" name=\"nonce\" value=\"{nonce}\">\
<label>Another amount ({min} to {max})<input name=\"amount\" inputmode=\"decimal\" required></label> <button type=\"submit\">Pay</button></form>",
                nonce = crate::base::secrets::random_base62(24),
                min = esc(&cfg.show(cfg.min)),
                max = esc(&cfg.show(cfg.max)),
            ));
        }
        out.push_str(&format!(
            "<form method=\"post\" action=\"/console/me/redeem\" class=\"redeem\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
<input type=\"hidden\" name=\"team\" value=\"{t}\"><label>Redemption code<input name=\"code\" required maxlength=\"64\" autocomplete=\"off\"></label> \
<button type=\"submit\">Redeem</button></form></section>"
        ));
    }
    Ok(out)
}

/// Let `page`'s forms lead to Stripe's Checkout page: a form's redirect to another origin is
/// checked against the page's `form-action` (Chrome enforces it), which is `'self'` elsewhere.
pub(super) fn allow_checkout(api: &AdminApi, page: &mut crate::protocol::response::LocalResponse) {
    let Some(stripe) = api.selling.stripe.as_ref() else { return };
    let mut origins = String::from(" https://checkout.stripe.com");
    // A Stripe-compatible API elsewhere (a test's fake) sends its customers to its own pages.
    if let Ok(uri) = stripe.cfg.base_url.parse::<http::Uri>() {
        if let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) {
            if authority.host() != "api.stripe.com" {
                origins.push_str(&format!(" {scheme}://{authority}"));
            }
        }
    }
    for (name, value) in &mut page.headers {
        if *name == "content-security-policy" {
            *value = value.replace("form-action 'self'", &format!("form-action 'self'{origins}"));
        }
    }
}

/// The team named in a post, if it is one of the person's.
fn team_of<'a>(req: &'a Request, teams: &[String]) -> Result<&'a str, ApiError> {
    let team = req.form.get("team");
    if !teams.iter().any(|t| t == team) {
        return Err(ApiError::new(ErrorKind::Forbidden, "You can pay only into a team of yours.").with_param("team"));
    }
    Ok(team)
}

/// `POST /console/me/topup`: a Checkout Session, and the person sent to pay on it.
pub(super) async fn topup(api: &AdminApi, req: &Request, person: &Person, teams: &[String]) -> Page {
    let stripe = api.selling.stripe.as_ref().ok_or_else(|| ApiError::new(ErrorKind::NotFound, "Card top-ups are not offered here."))?;
    let team = team_of(req, teams)?;
    let nonce = req.form.get("nonce");
    if !(16..=64).contains(&nonce.len()) || !nonce.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(bad("nonce", "The form is stale: reload the page."));
    }
    let minor = stripe.minor_of(req.form.get("amount"))?;
    let url = stripe.checkout(team, minor, &person.label(), nonce, &api.console_url).await?;
    Ok(super::redirect(&url))
}

/// `GET /console/me/statement?team=&month=`: a team's statement, for those who run it.
pub(super) async fn statement(api: &AdminApi, req: &Request, person: &Person) -> Page {
    let form = super::Form::parse(&req.query);
    let team = form.get("team");
    if !person.admin_of.iter().any(|t| t == team) || api.keys.account(team).is_none() {
        return Err(ApiError::new(ErrorKind::NotFound, "There is no such page or key here."));
    }
    api.statement(team, &format!("month={}", super::html::enc(form.get("month")))).await
}

/// `POST /console/me/redeem`: a code into the team's account.
pub(super) async fn redeem(api: &AdminApi, req: &Request, person: &Person, teams: &[String]) -> Page {
    let team = team_of(req, teams)?;
    let account = api.keys.account(team).ok_or_else(|| ApiError::new(ErrorKind::NotFound, "There is no such team here."))?;
    let codes = &api.selling.codes;
    let by = format!("person {}", person.label());
    let done = codes.redeem(crate::selling::codes::Holder::Account(account), &by, req.form.get("code"), None).await?;
    let what = match &done.plan {
        Some(p) => format!("Code redeemed: team {team} is on the plan {p} now."),
        None => format!("Code redeemed: {} credited to team {team}.", super::html::nanos(done.amount)),
    };
    Ok(super::redirect(&format!("/console/me?done={}", super::html::enc(&what))))
}
