//! Card top-ups through Stripe Checkout (`payments.stripe`): a Checkout Session made through
//! Stripe's API for an account and an amount, and the webhook (`POST
//! /payments/stripe/webhook`) that credits the account once the payment is made — verified by
//! its `Stripe-Signature` (HMAC-SHA256 over `t.body`, five minutes' tolerance) and made once per
//! Checkout Session whatever the redeliveries, nodes or restarts (a mark written with the
//! credit, `Ledger::top_up_once`). A refund takes the credit back as Stripe reports it (the
//! charge's cumulative `amount_refunded`, each step taken once: a chain of marks), a dispute
//! takes it back when opened and gives it back when won. Every move is audited with Stripe's
//! ids; the balance may go below zero, which refuses the account's calls until it is paid.
//!
//! What each payment was for (the account, what it paid and credited) is kept as a row of the
//! job store (kind [`KIND`]) by its PaymentIntent, so a refund or a dispute — which name only
//! the charge and its PaymentIntent — finds it on any node.

use crate::billing::ledger::Ledger;
use crate::config::payments::StripeConfig;
use crate::store::{JobRow, JobStore, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// The job store's kind of a payment's row.
pub const KIND: &str = "payment";
/// How far a signature's time may be from ours.
pub const TOLERANCE_SECS: u64 = 300;
/// The longest webhook body read.
pub const MAX_EVENT_BYTES: usize = 512 * 1024;

/// What a payment was for, kept by its PaymentIntent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Payment {
    pub account: String,
    pub session: String,
    pub payment_intent: String,
    /// Paid, in the currency's minor units.
    pub minor: u64,
    pub currency: String,
    /// Credited, nano-USD.
    pub credit: i64,
}

#[derive(Debug)]
pub enum PayError {
    /// The amount asked is not offered.
    Amount(String),
    /// No signature, a wrong one, or one too old: 400.
    Signature(&'static str),
    /// The event cannot be read: 400.
    Event(String),
    /// Stripe's API refused or could not be reached.
    Api(String),
    /// An event about a payment of ours not known here yet (its completion not seen): Stripe
    /// is asked to deliver it again later.
    NotYet(String),
    Store(StoreError),
}

impl From<StoreError> for PayError {
    fn from(e: StoreError) -> Self {
        PayError::Store(e)
    }
}

impl std::fmt::Display for PayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PayError::Amount(m) | PayError::Event(m) | PayError::Api(m) | PayError::NotYet(m) => f.write_str(m),
            PayError::Signature(m) => f.write_str(m),
            PayError::Store(e) => write!(f, "store: {e}"),
        }
    }
}

impl From<PayError> for crate::protocol::ApiError {
    fn from(e: PayError) -> Self {
        use crate::protocol::{ApiError, ErrorKind};
        match e {
            PayError::Amount(m) => ApiError::new(ErrorKind::BadRequest, m).with_param("amount"),
            PayError::Signature(m) => ApiError::new(ErrorKind::BadRequest, m),
            PayError::Event(m) => ApiError::new(ErrorKind::BadRequest, m),
            PayError::Api(m) => {
                log::warn!("stripe: {m}");
                ApiError::new(ErrorKind::BadGateway, "The payment provider could not be reached; try again.")
            }
            PayError::NotYet(m) => {
                log::info!("stripe: {m}; asking for a later delivery");
                ApiError::new(ErrorKind::Conflict, "The payment this event is about is not known yet; deliver it again later.")
            }
            PayError::Store(StoreError::Shared(m)) => {
                log::warn!("stripe: {m}");
                crate::store::fleet::unavailable("the payment")
            }
            PayError::Store(inner) => {
                log::error!("stripe: {inner}");
                ApiError::new(ErrorKind::Internal, "Internal error while recording the payment.")
            }
        }
    }
}

/// Check a `Stripe-Signature` header (`t=<unix>,v1=<hex>[,v1=…]`) of `body` against `secret`
/// at `now`: one `v1` must be the HMAC-SHA256 of `"{t}.{body}"`, and `t` within
/// [`TOLERANCE_SECS`] of `now`.
pub fn verify(secret: &str, header: Option<&str>, body: &[u8], now: u64) -> Result<(), PayError> {
    let header = header.ok_or(PayError::Signature("No Stripe-Signature header."))?;
    let mut t = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = v.parse::<u64>().ok(),
            Some(("v1", v)) => signatures.push(v),
            _ => {}
        }
    }
    let t = t.ok_or(PayError::Signature("The Stripe-Signature header has no timestamp."))?;
    if t.abs_diff(now) > TOLERANCE_SECS {
        return Err(PayError::Signature("The Stripe-Signature timestamp is outside the tolerance."));
    }
    let mut signed = Vec::with_capacity(body.len() + 12);
    signed.extend_from_slice(t.to_string().as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(body);
    let expected = crate::access::auth::hex(&crate::base::secrets::hmac_sha256(secret.as_bytes(), &signed));
    if signatures.iter().any(|s| crate::base::secrets::token_matches(s, &expected)) {
        Ok(())
    } else {
        Err(PayError::Signature("No Stripe-Signature signature matches."))
    }
}

/// What a webhook delivery did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// An account credited (or debited: a refund, a dispute) by this many nano-USD.
    Moved { account: String, delta: i64 },
    /// Done before (a redelivery, another node), or nothing to move.
    Already,
    /// An event tollgate does not act on.
    Ignored,
}

pub struct Stripe {
    pub cfg: StripeConfig,
    http: reqwest::Client,
    ledger: Arc<Ledger>,
    jobs: Arc<dyn JobStore>,
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

impl Stripe {
    pub fn new(cfg: StripeConfig, ledger: Arc<Ledger>, jobs: Arc<dyn JobStore>) -> Stripe {
        let http = crate::base::outbound::Outbound {
            connect: Some(Duration::from_secs(10)),
            total: Some(Duration::from_secs(30)),
            follow_redirects: false,
            ..Default::default()
        }
        .client()
        .unwrap_or_default();
        Stripe { cfg, http, ledger, jobs }
    }

    /// `amount` (the currency's whole units, as a form gives it) in minor units, if it may be
    /// paid: one of the offered amounts, or a custom one within the bounds.
    pub fn minor_of(&self, amount: &str) -> Result<u64, PayError> {
        let per = f64::from(self.cfg.minor_per_unit);
        let units: f64 = amount.trim().parse().map_err(|_| PayError::Amount("The amount must be a number.".into()))?;
        let minor = (units * per).round();
        if !(units.is_finite() && (minor - units * per).abs() < 1e-6) {
            return Err(PayError::Amount("The amount has more decimals than the currency.".into()));
        }
        let minor = minor as u64;
        if !(self.cfg.min..=self.cfg.max).contains(&minor) {
            return Err(PayError::Amount(format!(
                "The amount must be between {} and {}.",
                self.cfg.show(self.cfg.min),
                self.cfg.show(self.cfg.max)
            )));
        }
        Ok(minor)
    }

    /// A Checkout Session for `account` paying `minor`, made by `who` (a person's label);
    /// `idempotency` is the form's own (a double submission makes one session). The URL to
    /// send the customer to.
    pub async fn checkout(&self, account: &str, minor: u64, who: &str, idempotency: &str, console_url: &str) -> Result<String, PayError> {
        let credit = self.cfg.credit_nanos(minor);
        let minor_text = minor.to_string();
        let credit_text = credit.to_string();
        let name = format!("Model API credit ({})", crate::base::money::usd(credit));
        let success = format!("{console_url}/console/me?topup=done");
        let cancel = format!("{console_url}/console/me?topup=cancelled");
        let who = crate::base::text::clip(who, 200);
        let form: Vec<(&str, &str)> = vec![
            ("mode", "payment"),
            ("client_reference_id", account),
            ("line_items[0][quantity]", "1"),
            ("line_items[0][price_data][currency]", &self.cfg.currency),
            ("line_items[0][price_data][unit_amount]", &minor_text),
            ("line_items[0][price_data][product_data][name]", &name),
            ("metadata[tollgate_account]", account),
            ("metadata[tollgate_minor]", &minor_text),
            ("metadata[tollgate_credit_nanos]", &credit_text),
            ("metadata[tollgate_by]", &who),
            ("payment_intent_data[metadata][tollgate_account]", account),
            ("success_url", &success),
            ("cancel_url", &cancel),
        ];
        let resp = self
            .http
            .post(format!("{}/v1/checkout/sessions", self.cfg.base_url))
            .bearer_auth(&self.cfg.secret_key)
            .header("Idempotency-Key", format!("tollgate-topup-{idempotency}"))
            .form(&form)
            .send()
            .await
            .map_err(|e| PayError::Api(format!("creating a Checkout Session: {}", e.without_url())))?;
        let status = resp.status();
        let body: Value = resp.json().await.map_err(|e| PayError::Api(format!("a Checkout Session's answer: {}", e.without_url())))?;
        if !status.is_success() {
            let why = str_at(&body, &["error", "message"]).unwrap_or("no message");
            return Err(PayError::Api(format!("Stripe refused a Checkout Session ({status}): {}", crate::base::text::clip(why, 200))));
        }
        let url = body.get("url").and_then(Value::as_str).filter(|u| u.starts_with("https://") || u.starts_with("http://"));
        let url = url.ok_or_else(|| PayError::Api("a Checkout Session without a url".into()))?;
        log::info!("stripe: Checkout Session {} for account {account}: {}", str_at(&body, &["id"]).unwrap_or("?"), self.cfg.show(minor));
        Ok(url.to_string())
    }

    /// A webhook delivery: verified, then acted on once.
    pub async fn webhook(&self, signature: Option<&str>, body: &[u8], now: u64) -> Result<Handled, PayError> {
        verify(&self.cfg.webhook_secret, signature, body, now)?;
        let event: Value = serde_json::from_slice(body).map_err(|e| PayError::Event(format!("The event is not JSON: {e}")))?;
        let id = str_at(&event, &["id"]).ok_or_else(|| PayError::Event("The event has no id.".into()))?;
        let id = crate::base::text::clip(id, 100).into_owned();
        let kind = str_at(&event, &["type"]).unwrap_or_default();
        let object =
            event.get("data").and_then(|d| d.get("object")).ok_or_else(|| PayError::Event("The event has no data.object.".into()))?;
        match kind {
            "checkout.session.completed" if str_at(object, &["payment_status"]) == Some("paid") => self.paid(&id, object).await,
            "checkout.session.async_payment_succeeded" => self.paid(&id, object).await,
            "charge.refunded" => self.refunded(&id, object).await,
            "charge.dispute.created" => self.disputed(&id, object, false).await,
            "charge.dispute.closed" if str_at(object, &["status"]) == Some("won") => self.disputed(&id, object, true).await,
            _ => Ok(Handled::Ignored),
        }
    }

    /// A Checkout Session paid: its account credited once.
    async fn paid(&self, event: &str, session: &Value) -> Result<Handled, PayError> {
        let field = |k: &str| str_at(session, &["metadata", k]);
        // A session tollgate did not make (another integration on the same Stripe account).
        let Some(account) = field("tollgate_account") else { return Ok(Handled::Ignored) };
        let session_id = str_at(session, &["id"]).ok_or_else(|| PayError::Event("The session has no id.".into()))?;
        let minor: u64 = field("tollgate_minor")
            .and_then(|m| m.parse().ok())
            .ok_or_else(|| PayError::Event("The session's metadata has no amount.".into()))?;
        let credit: i64 = field("tollgate_credit_nanos")
            .and_then(|m| m.parse().ok())
            .ok_or_else(|| PayError::Event("The session's metadata has no credit.".into()))?;
        // What was paid is what was asked: the session's total, in its currency.
        let total = session.get("amount_total").and_then(Value::as_u64);
        let currency = str_at(session, &["currency"]).unwrap_or_default();
        if total != Some(minor) || !currency.eq_ignore_ascii_case(&self.cfg.currency) {
            log::error!(
                "stripe: session {session_id} paid {total:?} {currency}, not the {minor} {} asked: not credited",
                self.cfg.currency
            );
            return Ok(Handled::Ignored);
        }
        crate::policy::budget::valid_account_name(account).map_err(|e| PayError::Event(format!("The session's account: {e}")))?;
        let pi = str_at(session, &["payment_intent"]).unwrap_or_default().to_string();
        if !pi.is_empty() {
            let payment = Payment {
                account: account.into(),
                session: session_id.into(),
                payment_intent: pi.clone(),
                minor,
                currency: self.cfg.currency.clone(),
                credit,
            };
            self.keep(&payment).await?;
        }
        let reason = format!(
            "card top-up of {} through Stripe (checkout session {session_id}, payment {}, event {event})",
            self.cfg.show(minor),
            if pi.is_empty() { "—" } else { &pi }
        );
        let purse = crate::policy::budget::account_purse(account);
        let mark = format!("stripe:session:{session_id}");
        match self.ledger.top_up_once(&purse, credit, &reason, &[(&mark, credit)]).await? {
            Some(_) => {
                log::info!("stripe: account {account} credited {} (session {session_id}, event {event})", self.cfg.show(minor));
                Ok(Handled::Moved { account: account.into(), delta: credit })
            }
            None => Ok(Handled::Already),
        }
    }

    /// The payment's row, written once (a redelivery finds it written).
    async fn keep(&self, payment: &Payment) -> Result<(), PayError> {
        let id = format!("pay_{}", payment.payment_intent);
        if self.jobs.get(&id).await?.is_some() {
            return Ok(());
        }
        let record = serde_json::to_string(payment).map_err(|e| PayError::Event(e.to_string()))?;
        let row = JobRow {
            kind: KIND,
            id: id.clone(),
            owner: payment.account.clone(),
            created_at: crate::base::clock::now_unix(),
            open: false,
            record,
        };
        match self.jobs.put(&row).await {
            Ok(()) => Ok(()),
            // Another node wrote it meanwhile.
            Err(StoreError::Shared(_)) if self.jobs.get(&id).await?.is_some() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The payment a charge (or a dispute) was made by: None when it is not one of tollgate's.
    async fn payment_of(&self, object: &Value) -> Result<Option<Payment>, PayError> {
        let pi = str_at(object, &["payment_intent"]).unwrap_or_default();
        if let Some(row) = self.jobs.get(&format!("pay_{pi}")).await?.filter(|_| !pi.is_empty()) {
            return Ok(Some(serde_json::from_str(&row).map_err(|e| StoreError::Corrupt(format!("payment {pi}: {e}")))?));
        }
        // Ours (its metadata says so) but its completion not seen yet: later.
        if str_at(object, &["metadata", "tollgate_account"]).is_some() {
            return Err(PayError::NotYet(format!("an event about payment {pi}, whose completion was not seen")));
        }
        Ok(None)
    }

    /// A charge refunded (in full or in part, perhaps again): what its cumulative refund
    /// credited, taken back — each step once, in whatever order the events come. The steps
    /// are a chain of marks (`stripe:refund:<charge>:<from>` holding the cumulative amount it
    /// reached), so two nodes taking a step from the same point write one of them.
    async fn refunded(&self, event: &str, charge: &Value) -> Result<Handled, PayError> {
        let Some(payment) = self.payment_of(charge).await? else { return Ok(Handled::Ignored) };
        let charge_id = str_at(charge, &["id"]).ok_or_else(|| PayError::Event("The charge has no id.".into()))?;
        let refunded = charge.get("amount_refunded").and_then(Value::as_u64).unwrap_or(0).min(payment.minor);
        let purse = crate::policy::budget::account_purse(&payment.account);
        loop {
            // Where the chain ends: what was taken back so far.
            let mut taken = 0u64;
            while let Some(next) = self.ledger.mark(&format!("stripe:refund:{charge_id}:{taken}")).await? {
                taken = u64::try_from(next).unwrap_or(u64::MAX).max(taken + 1);
            }
            if refunded <= taken {
                return Ok(Handled::Already);
            }
            let delta = self.share(&payment, taken) - self.share(&payment, refunded);
            let reason = format!(
                "card refund of {} through Stripe (charge {charge_id}, payment {}, event {event})",
                self.cfg.show(refunded - taken),
                payment.payment_intent
            );
            let mark = format!("stripe:refund:{charge_id}:{taken}");
            let value = i64::try_from(refunded).unwrap_or(i64::MAX);
            if self.ledger.top_up_once(&purse, delta, &reason, &[(&mark, value)]).await?.is_some() {
                log::info!(
                    "stripe: account {} debited a refund of {} (charge {charge_id})",
                    payment.account,
                    self.cfg.show(refunded - taken)
                );
                return Ok(Handled::Moved { account: payment.account, delta });
            }
            // Another delivery took this step meanwhile: read the chain again.
        }
    }

    /// The part of a payment's credit that `minor` of it paid for (all of it for all of it).
    fn share(&self, payment: &Payment, minor: u64) -> i64 {
        if minor >= payment.minor {
            return payment.credit;
        }
        let n = i128::from(payment.credit) * i128::from(minor) / i128::from(payment.minor.max(1));
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    /// A dispute opened (its amount's credit taken back) or won (given back), each once.
    async fn disputed(&self, event: &str, dispute: &Value, won: bool) -> Result<Handled, PayError> {
        let Some(payment) = self.payment_of(dispute).await? else { return Ok(Handled::Ignored) };
        let id = str_at(dispute, &["id"]).ok_or_else(|| PayError::Event("The dispute has no id.".into()))?;
        let minor = dispute.get("amount").and_then(Value::as_u64).unwrap_or(payment.minor).min(payment.minor);
        let amount = self.share(&payment, minor);
        let (delta, what, mark) =
            if won { (amount, "won", format!("stripe:dispute-won:{id}")) } else { (-amount, "opened", format!("stripe:dispute:{id}")) };
        if won && self.ledger.mark(&format!("stripe:dispute:{id}")).await?.is_none() {
            // Nothing was taken back for it here.
            return Ok(Handled::Already);
        }
        let reason = format!(
            "card dispute {what} for {} through Stripe (dispute {id}, payment {}, event {event})",
            self.cfg.show(minor),
            payment.payment_intent
        );
        let purse = crate::policy::budget::account_purse(&payment.account);
        match self.ledger.top_up_once(&purse, delta, &reason, &[(&mark, delta)]).await? {
            Some(_) => Ok(Handled::Moved { account: payment.account, delta }),
            None => Ok(Handled::Already),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(secret: &str, t: u64, body: &str) -> String {
        let mut data = format!("{t}.").into_bytes();
        data.extend_from_slice(body.as_bytes());
        format!("t={t},v1={}", crate::access::auth::hex(&crate::base::secrets::hmac_sha256(secret.as_bytes(), &data)))
    }

    #[test]
    fn a_signature_is_checked_over_time_and_body() {
        let (secret, body, t) = ("whsec_test", r#"{"id":"evt_1"}"#, 1_800_000_000);
        let header = signed(secret, t, body);
        assert!(verify(secret, Some(&header), body.as_bytes(), t + 10).is_ok());
        // Several v1 (a secret being rolled): any one matching is enough.
        let two = format!("t={t},v1=00ff,{}", header.split_once(',').map(|(_, v)| v).unwrap_or_default());
        assert!(verify(secret, Some(&two), body.as_bytes(), t).is_ok());
        assert!(verify(secret, Some(&header), b"{\"id\":\"evt_2\"}", t).is_err(), "another body");
        assert!(verify("whsec_other", Some(&header), body.as_bytes(), t).is_err(), "another secret");
        assert!(verify(secret, Some(&header), body.as_bytes(), t + TOLERANCE_SECS + 1).is_err(), "too old");
        assert!(verify(secret, Some(&header), body.as_bytes(), t - TOLERANCE_SECS - 1).is_err(), "from the future");
        assert!(verify(secret, None, body.as_bytes(), t).is_err());
        assert!(verify(secret, Some("v1=abc"), body.as_bytes(), t).is_err(), "no timestamp");
    }
}
