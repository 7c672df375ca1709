//! An account's monthly statement: its opening balance, each credit and debit of the audit
//! trail in the month (top-ups by card, codes, refunds and disputes, sign-up and plan credits,
//! an operator's adjustments), its charges by day and model (the usage records charged to the
//! account), and its closing balance — in nano-USD throughout, so the lines add up to the
//! closing balance exactly, and the closing balance of the current month is the ledger's.
//!
//! The opening balance is the balance now less everything booked since the month began (audit
//! entries and records); a month older than the records kept (`billing.usage_retention_days`)
//! cannot be stated and is refused.

use crate::access::auth::KeyIndex;
use crate::billing::ledger::Ledger;
use crate::policy::budget::Calendar;
use crate::records::audit::AuditEntry;
use crate::records::usage::{Grouping, Totals};
use crate::store::StoreError;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Audit entries read per page.
const PAGE: usize = 1000;

/// What a credit or debit of the audit trail was.
pub fn kind_of(reason: &str) -> &'static str {
    if reason.starts_with("card top-up") {
        "top_up"
    } else if reason.starts_with("code of batch") {
        "code"
    } else if reason.starts_with("card refund") || reason.starts_with("card dispute") {
        "refund"
    } else if reason.starts_with("sign-up credit") {
        "signup_credit"
    } else if reason.starts_with("plan ") {
        "plan"
    } else {
        "adjustment"
    }
}

/// One month of one account.
#[derive(Debug, Clone, Default)]
pub struct Statement {
    pub account: String,
    pub month: String,
    /// Unix ms of the month's first instant and of the next month's, in the billing timezone.
    pub start_ms: u64,
    pub end_ms: u64,
    pub opening: i64,
    /// The month's audit entries of the account, oldest first.
    pub entries: Vec<AuditEntry>,
    /// Charges (and usage refunds) by `(day, model)`.
    pub charges: BTreeMap<(String, String), Totals>,
    pub closing: i64,
}

#[derive(Debug)]
pub enum StatementError {
    /// A month that is not `YYYY-MM`, in the future, or older than the records kept.
    Month(String),
    Store(StoreError),
}

impl From<StoreError> for StatementError {
    fn from(e: StoreError) -> Self {
        StatementError::Store(e)
    }
}

/// `YYYY-MM`'s first day and the next month's, as dates.
pub fn month_bounds(month: &str) -> Option<(String, String)> {
    let (y, m) = month.split_once('-')?;
    let (y, m): (u32, u32) = (y.parse().ok()?, m.parse().ok()?);
    if month.len() != 7 || !(2000..=9999).contains(&y) || !(1..=12).contains(&m) {
        return None;
    }
    let next = if m == 12 { format!("{}-01-01", y + 1) } else { format!("{y}-{:02}-01", m + 1) };
    Some((format!("{y}-{m:02}-01"), next))
}

/// nano-USD as USD with all nine decimals ("-1.250000000").
pub fn usd9(nanos: i64) -> String {
    let sign = if nanos < 0 { "-" } else { "" };
    let abs = nanos.unsigned_abs();
    format!("{sign}{}.{:09}", abs / 1_000_000_000, abs % 1_000_000_000)
}

/// A CSV field, quoted when it needs to be; a formula's first character neutralised (a
/// reason may quote what a client sent).
fn field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@']) && s.parse::<f64>().is_err() { format!("'{s}") } else { s.to_string() };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

pub struct Statements {
    ledger: Arc<Ledger>,
    keys: Arc<KeyIndex>,
    /// Days of records kept (`billing.usage_retention_days`).
    kept_days: u64,
}

impl Statements {
    pub fn new(ledger: Arc<Ledger>, keys: Arc<KeyIndex>, kept_days: u64) -> Statements {
        Statements { ledger, keys, kept_days }
    }

    /// The statement of `account` for `month` (`YYYY-MM` in `calendar`'s timezone).
    pub async fn of(&self, account: &str, month: &str, calendar: &Calendar) -> Result<Statement, StatementError> {
        let bad = || StatementError::Month(format!("month: YYYY-MM, not '{}'", crate::base::text::clip(month, 20)));
        let (first, next) = month_bounds(month).ok_or_else(bad)?;
        let start = calendar.day_start(&first).ok_or_else(bad)?.saturating_mul(1000);
        let end = calendar.day_start(&next).ok_or_else(bad)?.saturating_mul(1000);
        let now = crate::base::clock::now_ms();
        if start > now {
            return Err(StatementError::Month(format!("month: {month} has not begun")));
        }
        if start < now.saturating_sub(self.kept_days.saturating_mul(86_400_000)) {
            return Err(StatementError::Month(format!(
                "month: {month} begins before the oldest records kept ({} days: billing.usage_retention_days)",
                self.kept_days
            )));
        }
        let purse = crate::policy::budget::account_purse(account);
        self.ledger.commit_now().await?;
        // Everything since the month began: the audit trail's entries of the account, newest
        // first, and the records charged to it.
        let mut since = Vec::new();
        let mut before = None;
        'pages: loop {
            let page = self.ledger.audit(PAGE, before).await?;
            let Some(last) = page.last() else { break };
            before = Some(last.cursor());
            for e in &page {
                if e.time_ms < start {
                    break 'pages;
                }
                if e.kind == "account" && e.id == account {
                    since.push(e.clone());
                }
            }
            if page.len() < PAGE {
                break;
            }
        }
        since.reverse();
        let by = Grouping::Charged(purse.clone(), calendar.tz().clone());
        let mut charges: BTreeMap<(String, String), Totals> = BTreeMap::new();
        let mut charged_since = 0i64;
        for key in self.keys.all_keys().await? {
            let (_, rows) = self.ledger.usage_grouped(&key.id, start, u64::MAX, &by).await?;
            for (label, t) in rows.into_iter().filter(|(l, _)| !l.is_empty()) {
                charged_since = charged_since.saturating_add(t.cost_nanos);
                let Some((day, model)) = label.split_once('\t') else { continue };
                // Only the month's days are its lines; later ones count toward the opening.
                if calendar.day_start(day).is_some_and(|d| d.saturating_mul(1000) < end) {
                    charges.entry((day.to_string(), model.to_string())).or_default().merge(&t);
                }
            }
        }
        let balance = self.ledger.balance(&purse).await?;
        let credited_since: i64 = since.iter().map(|e| e.delta).sum();
        let opening = balance.saturating_sub(credited_since).saturating_add(charged_since);
        let entries: Vec<AuditEntry> = since.into_iter().filter(|e| e.time_ms < end).collect();
        let credited: i64 = entries.iter().map(|e| e.delta).sum();
        let charged: i64 = charges.values().map(|t| t.cost_nanos).sum();
        let closing = opening.saturating_add(credited).saturating_sub(charged);
        Ok(Statement {
            account: account.to_string(),
            month: month.to_string(),
            start_ms: start,
            end_ms: end,
            opening,
            entries,
            charges,
            closing,
        })
    }
}

impl Statement {
    /// The statement as CSV: `kind,time,item,detail,requests,amount_usd,amount_nanos`, credits
    /// positive and charges negative, then a total per kind and the closing balance.
    pub fn csv(&self) -> String {
        let mut out = String::from("kind,time,item,detail,requests,amount_usd,amount_nanos\n");
        let mut line = |kind: &str, time: &str, item: &str, detail: &str, requests: String, nanos: i64| {
            out.push_str(&format!("{kind},{},{},{},{requests},{},{nanos}\n", field(time), field(item), field(detail), usd9(nanos)));
        };
        line("opening", &crate::protocol::rfc3339(self.start_ms / 1000), &self.account, "opening balance", String::new(), self.opening);
        let mut totals: BTreeMap<&str, i64> = BTreeMap::new();
        for e in &self.entries {
            let reason = e.reason.as_deref().unwrap_or_default();
            let kind = kind_of(reason);
            *totals.entry(kind).or_default() += e.delta;
            line(kind, &crate::protocol::rfc3339(e.time_ms / 1000), "", reason, String::new(), e.delta);
        }
        for ((day, model), t) in &self.charges {
            *totals.entry("charge").or_default() -= t.cost_nanos;
            let tokens = format!("{} input, {} output tokens", t.input_tokens, t.output_tokens);
            line("charge", day, model, &tokens, t.requests.to_string(), -t.cost_nanos);
        }
        for (kind, total) in &totals {
            line(&format!("total_{kind}"), "", "", "", String::new(), *total);
        }
        line("closing", &crate::protocol::rfc3339(self.end_ms / 1000), &self.account, "closing balance", String::new(), self.closing);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_amounts_and_fields_are_written_exactly() {
        assert_eq!(month_bounds("2026-11"), Some(("2026-11-01".into(), "2026-12-01".into())));
        assert_eq!(month_bounds("2026-12"), Some(("2026-12-01".into(), "2027-01-01".into())));
        for bad in ["2026-13", "2026-1", "26-11", "2026-11-01", "x"] {
            assert_eq!(month_bounds(bad), None, "{bad}");
        }
        assert_eq!((usd9(-1_250_000_000), usd9(7), usd9(0)), ("-1.250000000".into(), "0.000000007".into(), "0.000000000".into()));
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("=HYPERLINK(1)"), "'=HYPERLINK(1)");
        assert_eq!(field("-5"), "-5");
        assert_eq!(kind_of("card top-up of 20.00 USD"), "top_up");
        assert_eq!(kind_of("code of batch x redeemed"), "code");
        assert_eq!(kind_of("card dispute opened"), "refund");
        assert_eq!(kind_of("by ops"), "adjustment");
    }

    #[test]
    fn the_lines_add_up_to_the_closing_balance() {
        let entry = |delta: i64, reason: &str| AuditEntry {
            delta,
            reason: Some(reason.into()),
            kind: "account".into(),
            id: "a".into(),
            ..AuditEntry::new("acct:a", delta, 0, Some(reason))
        };
        let mut charges = BTreeMap::new();
        charges.insert(("2026-11-02".to_string(), "m".to_string()), Totals { requests: 3, cost_nanos: 1_000_000_001, ..Totals::default() });
        let s = Statement {
            account: "a".into(),
            month: "2026-11".into(),
            opening: 5,
            entries: vec![entry(20_000_000_000, "card top-up of 20.00 USD"), entry(-3, "card refund of 0.00 USD")],
            charges,
            closing: 5 + 20_000_000_000 - 3 - 1_000_000_001,
            ..Statement::default()
        };
        let csv = s.csv();
        let sum: i64 = csv
            .lines()
            .skip(1)
            .filter(|l| !l.starts_with("total_") && !l.starts_with("closing"))
            .map(|l| l.rsplit(',').next().unwrap_or("0").parse::<i64>().unwrap_or(0))
            .sum();
        assert_eq!(sum, s.closing, "{csv}");
        assert!(
            csv.contains("total_top_up,,,,,20.000000000,20000000000") && csv.contains("total_charge,,,,,-1.000000001,-1000000001"),
            "{csv}"
        );
    }
}
