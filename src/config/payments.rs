//! `payments:`: how customers pay for credit — `stripe:` Checkout with its webhook.

use super::{err, ConfigError};
use serde::Deserialize;

/// Currencies Stripe counts in whole units (no minor unit).
const ZERO_DECIMAL: [&str; 16] =
    ["bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv", "xaf", "xof", "xpf"];
/// Currencies Stripe counts in thousandths.
const THREE_DECIMAL: [&str; 5] = ["bhd", "jod", "kwd", "omr", "tnd"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPayments {
    #[serde(default)]
    stripe: Option<RawStripe>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStripe {
    secret_key_env: String,
    webhook_secret_env: String,
    #[serde(default)]
    currency: Option<String>,
    /// The amounts offered (in `currency`'s whole units).
    amounts: Vec<f64>,
    min: f64,
    max: f64,
    /// Stripe's API (a local fake of it in tests).
    #[serde(default)]
    base_url: Option<String>,
    /// What one unit of `currency` credits, in USD (1 for USD; required for another currency).
    #[serde(default)]
    usd_per_unit: Option<f64>,
}

/// `payments.stripe`, checked.
#[derive(Clone, PartialEq)]
pub struct StripeConfig {
    pub secret_key: String,
    pub webhook_secret: String,
    /// Lower case ISO code.
    pub currency: String,
    /// Minor units per whole unit (100 for USD, 1 for JPY).
    pub minor_per_unit: u32,
    /// Offered amounts and the custom amount's bounds, in minor units.
    pub amounts: Vec<u64>,
    pub min: u64,
    pub max: u64,
    pub base_url: String,
    /// Nano-USD credited per minor unit paid, as a fraction (numerator over `minor_per_unit`).
    pub nanos_per_unit: i64,
}

impl std::fmt::Debug for StripeConfig {
    // The keys are never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripeConfig")
            .field("currency", &self.currency)
            .field("amounts", &self.amounts)
            .field("min", &self.min)
            .field("max", &self.max)
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl StripeConfig {
    /// What `minor` units paid credit, in nano-USD (rounded down).
    pub fn credit_nanos(&self, minor: u64) -> i64 {
        let n = i128::from(minor) * i128::from(self.nanos_per_unit) / i128::from(self.minor_per_unit.max(1));
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    /// `minor` units as the currency writes them ("20.00 USD").
    pub fn show(&self, minor: u64) -> String {
        let decimals = match self.minor_per_unit {
            1 => 0,
            1000 => 3,
            _ => 2,
        };
        format!("{:.*} {}", decimals, minor as f64 / f64::from(self.minor_per_unit), self.currency.to_uppercase())
    }
}

/// `payments:` as configured (None: nothing to pay with).
pub(super) fn stripe(raw: Option<RawPayments>, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<StripeConfig>, ConfigError> {
    let Some(s) = raw.and_then(|p| p.stripe) else { return Ok(None) };
    let at = "payments.stripe";
    let secret = |name: &str, field: &str| {
        env(name).filter(|v| !v.is_empty()).ok_or_else(|| ConfigError(format!("{at}.{field}: environment variable {name} is not set")))
    };
    let secret_key = secret(&s.secret_key_env, "secret_key_env")?;
    let webhook_secret = secret(&s.webhook_secret_env, "webhook_secret_env")?;
    let currency = s.currency.unwrap_or_else(|| "usd".into()).to_ascii_lowercase();
    if !(currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_lowercase())) {
        return err(format!("{at}.currency: a three-letter ISO code (usd, eur, …)"));
    }
    let minor_per_unit = if ZERO_DECIMAL.contains(&currency.as_str()) {
        1
    } else if THREE_DECIMAL.contains(&currency.as_str()) {
        1000
    } else {
        100
    };
    let usd_per_unit = match (s.usd_per_unit, currency.as_str()) {
        (Some(r), _) if r.is_finite() && r > 0.0 && r <= 1e6 => r,
        (Some(_), _) => return err(format!("{at}.usd_per_unit: a positive number")),
        (None, "usd") => 1.0,
        (None, c) => return err(format!("{at}.usd_per_unit: the ledger counts in USD; say what one {} credits", c.to_uppercase())),
    };
    let minor = |v: f64, field: &str| -> Result<u64, ConfigError> {
        let m = (v * f64::from(minor_per_unit)).round();
        if !(v.is_finite() && v > 0.0 && (m - v * f64::from(minor_per_unit)).abs() < 1e-6 && m <= 1e12) {
            return err(format!("{at}.{field}: a positive amount in {} with at most its minor unit", currency.to_uppercase()));
        }
        Ok(m as u64)
    };
    let (min, max) = (minor(s.min, "min")?, minor(s.max, "max")?);
    if min > max {
        return err(format!("{at}.min: at most max"));
    }
    if s.amounts.is_empty() || s.amounts.len() > 10 {
        return err(format!("{at}.amounts: 1 to 10 amounts"));
    }
    let mut amounts = Vec::new();
    for (i, a) in s.amounts.iter().enumerate() {
        let m = minor(*a, &format!("amounts[{i}]"))?;
        if !(min..=max).contains(&m) {
            return err(format!("{at}.amounts[{i}]: between min and max"));
        }
        amounts.push(m);
    }
    let base_url = s.base_url.unwrap_or_else(|| "https://api.stripe.com".into()).trim_end_matches('/').to_string();
    let uri: http::Uri = base_url.parse().map_err(|e| ConfigError(format!("{at}.base_url: not a URL ({e})")))?;
    if !matches!((uri.scheme_str(), uri.host()), (Some("http" | "https"), Some(_))) {
        return err(format!("{at}.base_url: an http:// or https:// URL"));
    }
    Ok(Some(StripeConfig {
        secret_key,
        webhook_secret,
        nanos_per_unit: (usd_per_unit * 1e9).round() as i64,
        currency,
        minor_per_unit,
        amounts,
        min,
        max,
        base_url,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Option<StripeConfig>, ConfigError> {
        let raw: RawPayments = serde_yaml::from_str(yaml).expect("yaml");
        stripe(Some(raw), &|n| (n == "SK" || n == "WH").then(|| format!("{n}-value")))
    }

    #[test]
    fn amounts_are_minor_units_and_credit_follows_the_rate() {
        let c = parse("stripe: { secret_key_env: SK, webhook_secret_env: WH, amounts: [5, 20.5], min: 1, max: 100 }")
            .expect("valid")
            .expect("stripe");
        assert_eq!((c.amounts.as_slice(), c.min, c.max, c.currency.as_str()), (&[500, 2050][..], 100, 10_000, "usd"));
        assert_eq!(c.credit_nanos(2050), 20_500_000_000);
        assert_eq!(c.show(2050), "20.50 USD");
        let jpy = parse("stripe: { secret_key_env: SK, webhook_secret_env: WH, currency: JPY, usd_per_unit: 0.0065, amounts: [1000], min: 500, max: 50000 }")
            .expect("valid")
            .expect("stripe");
        assert_eq!((jpy.amounts[0], jpy.credit_nanos(1000)), (1000, 6_500_000_000));
        for (bad, field) in [
            ("stripe: { secret_key_env: NO, webhook_secret_env: WH, amounts: [5], min: 1, max: 9 }", "secret_key_env"),
            ("stripe: { secret_key_env: SK, webhook_secret_env: WH, currency: eur, amounts: [5], min: 1, max: 9 }", "usd_per_unit"),
            ("stripe: { secret_key_env: SK, webhook_secret_env: WH, amounts: [50], min: 1, max: 9 }", "amounts[0]"),
            ("stripe: { secret_key_env: SK, webhook_secret_env: WH, amounts: [5.001], min: 1, max: 9 }", "amounts[0]"),
            ("stripe: { secret_key_env: SK, webhook_secret_env: WH, amounts: [5], min: 10, max: 9 }", "min"),
            ("stripe: { secret_key_env: SK, webhook_secret_env: WH, amounts: [5], min: 1, max: 9, base_url: 'ftp://x' }", "base_url"),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.0.starts_with(&format!("payments.stripe.{field}")), "{bad}: {}", e.0);
        }
    }
}
