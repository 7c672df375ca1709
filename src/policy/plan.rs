//! Plans (`plans:`): what a key or an account subscribes to — a credit granted at the start of
//! each period (what is unused expires, or rolls over up to a cap), and limits of its own
//! (spend windows, `rpm`, `tpm`, model rules, a price multiplier) that apply beside the
//! holder's.
//!
//! The rules of a period are here: when it starts and ends, and what of an unused credit rolls
//! over. Granting and closing periods is the charge floor's (`charge::plans`); the money moves
//! through the ledger like any top-up, once per period whatever the nodes or restarts.

use super::budget::{Budgets, BudgetsInput, Calendar, Window};
use super::limits::RateLimits;
use super::{ModelRules, PolicyError};
use crate::base::money::{usd_to_nanos, Multiplier};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The longest period a plan may have (a period's spend is kept as long as a month's window).
const MAX_PERIOD_SECS: u64 = 31 * 86_400;
/// The shortest.
const MIN_PERIOD_SECS: u64 = 3_600;
/// At most this many plans.
const MAX_PLANS: usize = 256;

/// How long a plan's period lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// A calendar day, week (from Monday) or month in `billing.timezone`.
    Calendar(Window),
    /// A fixed length (`"30d"`, `"12h"`): periods follow one another from when the plan was
    /// assigned.
    Every(u64),
}

impl Period {
    fn parse(text: &str) -> Option<Period> {
        match text {
            "day" => Some(Period::Calendar(Window::Day)),
            "week" => Some(Period::Calendar(Window::Week)),
            "month" => Some(Period::Calendar(Window::Month)),
            _ => super::budget::Rolling::parse_label(text)
                .filter(|s| (MIN_PERIOD_SECS..=MAX_PERIOD_SECS).contains(s) && s % 3_600 == 0)
                .map(Period::Every),
        }
    }

    /// As written.
    pub fn label(self) -> String {
        match self {
            Period::Calendar(w) => w.as_str().to_string(),
            Period::Every(s) if s % 86_400 == 0 => format!("{}d", s / 86_400),
            Period::Every(s) => format!("{}h", s / 3_600),
        }
    }

    /// The period (start, end) that holds `now`, for a holder that took the plan at `since`.
    pub fn at(self, since: u64, now: u64, calendar: &Calendar) -> (u64, u64) {
        match self {
            Period::Calendar(w) => calendar.window(w, now),
            Period::Every(len) => {
                let k = now.saturating_sub(since) / len;
                let start = since + k * len;
                (start, start + len)
            }
        }
    }
}

/// What of a period's unused credit is carried into the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rollover {
    None,
    All,
    /// At most this much (nano-USD).
    UpTo(i64),
}

impl Rollover {
    /// What of `unused` is kept.
    pub fn keep(self, unused: i64) -> i64 {
        let unused = unused.max(0);
        match self {
            Rollover::None => 0,
            Rollover::All => unused,
            Rollover::UpTo(cap) => unused.min(cap),
        }
    }
}

/// One plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub name: String,
    /// Granted at the start of each period (nano-USD).
    pub credit: i64,
    pub period: Period,
    pub rollover: Rollover,
    /// Spend windows of each holder of the plan, beside the holder's own.
    pub budgets: Budgets,
    /// Requests and tokens per minute of each holder, beside the holder's own.
    pub rates: RateLimits,
    /// The models its holders may call, beside their own rules.
    pub models: Option<ModelRules>,
    pub price_multiplier: Option<Multiplier>,
}

/// The model rules of a plan a call is under, and whose plan it is (for the refusal).
#[derive(Debug, Clone, PartialEq)]
pub struct PlanModels {
    pub whose: String,
    pub rules: ModelRules,
}

impl PlanModels {
    /// 403 `model_not_allowed` naming the plan when its rules exclude `model`.
    pub fn check(&self, model: &str) -> Result<(), crate::protocol::ApiError> {
        match self.rules.allows(model) {
            true => Ok(()),
            false => Err(crate::protocol::ApiError::new(
                crate::protocol::ErrorKind::ModelNotAllowed,
                format!("The model '{model}' is not in {}.", self.whose),
            )
            .with_param("model")),
        }
    }
}

/// A plan as it is assigned to a key or an account: its name and when it was assigned (the
/// first period of a plan of fixed length starts then).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRef {
    pub name: String,
    pub since: u64,
}

/// `plans[]` as the file gives one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanInput {
    pub name: String,
    #[serde(default)]
    pub credit: f64,
    pub period: String,
    #[serde(default)]
    pub rollover: Option<RolloverInput>,
    #[serde(default)]
    pub budgets: Option<BudgetsInput>,
    #[serde(default)]
    pub models: Option<ModelRules>,
    #[serde(default)]
    pub rpm: Option<u32>,
    #[serde(default)]
    pub tpm: Option<u64>,
    #[serde(default)]
    pub price_multiplier: Option<f64>,
}

/// `rollover: false | true | <USD cap>`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RolloverInput {
    Flag(bool),
    Cap(f64),
}

/// Every plan, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plans(BTreeMap<String, Arc<Plan>>);

impl Plans {
    /// `plans:`; errors name the entry (`plans[1].period`).
    pub fn parse(input: &[PlanInput]) -> Result<Plans, PolicyError> {
        if input.len() > MAX_PLANS {
            return Err(PolicyError::new("", format!("at most {MAX_PLANS} plans")));
        }
        let mut out = BTreeMap::new();
        for (i, p) in input.iter().enumerate() {
            let at = |field: &str| format!("[{i}].{field}");
            super::budget::valid_account_name(&p.name).map_err(|e| PolicyError::new(at("name"), e))?;
            if out.contains_key(&p.name) {
                return Err(PolicyError::new(at("name"), format!("the plan '{}' is listed twice", p.name)));
            }
            if !(p.credit.is_finite() && p.credit >= 0.0 && p.credit <= 1e9) {
                return Err(PolicyError::new(at("credit"), "a non-negative amount in USD"));
            }
            let period = Period::parse(&p.period).ok_or_else(|| {
                PolicyError::new(at("period"), "day, week, month, or a length in whole hours or days from 1h to 31d (\"30d\")")
            })?;
            let rollover = match p.rollover {
                None | Some(RolloverInput::Flag(false)) => Rollover::None,
                Some(RolloverInput::Flag(true)) => Rollover::All,
                Some(RolloverInput::Cap(usd)) if usd.is_finite() && (0.0..=1e9).contains(&usd) => Rollover::UpTo(usd_to_nanos(usd)),
                Some(RolloverInput::Cap(_)) => return Err(PolicyError::new(at("rollover"), "false, true or a non-negative cap in USD")),
            };
            let budgets =
                p.budgets.as_ref().map(Budgets::parse).transpose().map_err(|e| PolicyError::new(at(&e.field), e.why))?.unwrap_or_default();
            if let Some(models) = &p.models {
                models.validate().map_err(|e| PolicyError::new(at(&e.field), e.why))?;
            }
            let rates = RateLimits { rpm: p.rpm, tpm: p.tpm, max_concurrent: None };
            rates.validate().map_err(|e| PolicyError::new(at(&e.field), e.why))?;
            let price_multiplier = p
                .price_multiplier
                .map(|m| Multiplier::new(m).ok_or_else(|| PolicyError::new(at("price_multiplier"), "a number above 0 and at most 1000")))
                .transpose()?;
            let plan = Plan {
                name: p.name.clone(),
                credit: usd_to_nanos(p.credit),
                period,
                rollover,
                budgets,
                rates,
                models: p.models.clone(),
                price_multiplier,
            };
            out.insert(p.name.clone(), Arc::new(plan));
        }
        Ok(Plans(out))
    }

    /// Every plan, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Arc<Plan>)> {
        self.0.iter()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Plan>> {
        self.0.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

/// The money-store name of what a holder (a key id, or `acct:<name>`) spent in a plan's period
/// starting at `start`: a window's balance (`win:plan:<holder>:credit:<start>`), forgotten
/// with the windows of its time.
pub fn credit_purse(holder: &str, start: u64) -> String {
    // Made per call: without the formatting machinery.
    let mut id = String::with_capacity(37 + holder.len());
    id.push_str("win:plan:");
    id.push_str(holder);
    id.push_str(":credit:");
    id.push_str(itoa::Buffer::new().format(start));
    id
}

/// The marks that make a period's grant and its close happen once: `plan-grant:<holder>:<plan>:<start>`
/// and `plan-close:…`.
pub fn grant_mark(holder: &str, plan: &str, start: u64) -> String {
    format!("plan-grant:{holder}:{plan}:{start}")
}

pub fn close_mark(holder: &str, plan: &str, start: u64) -> String {
    format!("plan-close:{holder}:{plan}:{start}")
}

/// What closing a period moves: what of the credit available in it (`available`: its grant
/// and what rolled into it) was not spent (`spent`), what of that rolls over, and what expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closing {
    pub unused: i64,
    pub kept: i64,
    pub expired: i64,
}

impl Plan {
    pub fn close(&self, available: i64, spent: i64) -> Closing {
        let unused = available.saturating_sub(spent.max(0)).max(0);
        let kept = self.rollover.keep(unused);
        Closing { unused, kept, expired: unused - kept }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plans(json: &str) -> Result<Plans, PolicyError> {
        Plans::parse(&serde_json::from_str::<Vec<PlanInput>>(json).expect("json"))
    }

    #[test]
    fn plans_are_parsed_and_refused_by_field() {
        let p = plans(
            r#"[{"name":"pro","credit":20,"period":"month","rollover":5,"budgets":{"5h":2},"rpm":60,"price_multiplier":0.9},
                          {"name":"trial","credit":1,"period":"30d","rollover":true}]"#,
        )
        .expect("valid");
        let pro = p.get("pro").expect("pro");
        assert_eq!(
            (pro.credit, pro.rollover, pro.period),
            (20_000_000_000, Rollover::UpTo(5_000_000_000), Period::Calendar(Window::Month))
        );
        assert_eq!(p.get("trial").map(|t| (t.period, t.rollover)), Some((Period::Every(30 * 86_400), Rollover::All)));
        for (bad, field) in [
            (r#"[{"name":"a","period":"year"}]"#, "[0].period"),
            (r#"[{"name":"a","period":"90m"}]"#, "[0].period"),
            (r#"[{"name":"a","period":"40d"}]"#, "[0].period"),
            (r#"[{"name":"a","period":"day","credit":-1}]"#, "[0].credit"),
            (r#"[{"name":"a","period":"day","rollover":-2}]"#, "[0].rollover"),
            (r#"[{"name":"a","period":"day"},{"name":"a","period":"day"}]"#, "[1].name"),
            (r#"[{"name":"a","period":"day","rpm":0}]"#, "[0].rpm"),
            (r#"[{"name":"a","period":"day","price_multiplier":0}]"#, "[0].price_multiplier"),
        ] {
            assert_eq!(plans(bad).expect_err(bad).field, field, "{bad}");
        }
    }

    #[test]
    fn a_period_of_fixed_length_follows_from_when_the_plan_was_assigned() {
        let calendar = Calendar::new("UTC").expect("utc");
        let every = Period::Every(30 * 86_400);
        let since = 1_000_000;
        assert_eq!(every.at(since, since, &calendar), (since, since + 30 * 86_400));
        assert_eq!(every.at(since, since + 31 * 86_400, &calendar), (since + 30 * 86_400, since + 60 * 86_400));
        let day = Period::Calendar(Window::Day);
        assert_eq!(day.at(since, 86_400 * 3 + 5, &calendar), (86_400 * 3, 86_400 * 4));
    }

    #[test]
    fn what_is_unused_rolls_over_up_to_the_cap_and_the_rest_expires() {
        let plan = |rollover| Plan {
            name: "p".into(),
            credit: 100,
            period: Period::Calendar(Window::Day),
            rollover,
            budgets: Budgets::default(),
            rates: RateLimits::default(),
            models: None,
            price_multiplier: None,
        };
        assert_eq!(plan(Rollover::None).close(100, 30), Closing { unused: 70, kept: 0, expired: 70 });
        assert_eq!(plan(Rollover::UpTo(50)).close(120, 30), Closing { unused: 90, kept: 50, expired: 40 });
        assert_eq!(plan(Rollover::All).close(120, 30), Closing { unused: 90, kept: 90, expired: 0 });
        // Overspent: nothing unused, nothing expires (the rest came out of the balance).
        assert_eq!(plan(Rollover::All).close(100, 130), Closing { unused: 0, kept: 0, expired: 0 });
    }
}
