//! Money: every balance, price and cost is a whole number of nano-USD (`i64`); dollars appear
//! only in the configuration file, answers and log lines.

pub const NANOS_PER_USD: i64 = 1_000_000_000;

/// nano-USD as dollars, for answers and log lines.
pub fn usd(nanos: i64) -> f64 {
    nanos as f64 / NANOS_PER_USD as f64
}

/// USD → nano-USD, rounded.
pub fn usd_to_nanos(usd: f64) -> i64 {
    (usd * 1e9).round() as i64
}

/// A price multiplier (`price_multiplier`: 1.25 for resale, 0.8 for a partner), kept exact in
/// millionths. Applied once, where a call's record is made and where its hold is taken: what a
/// call is charged is its cost at the price table (its list cost) times this, rounded half away
/// from zero to the nano-dollar, so a refund of a charge gives back exactly what was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Multiplier(u32);

impl Default for Multiplier {
    fn default() -> Self {
        Multiplier::ONE
    }
}

impl Multiplier {
    /// The price table as written.
    pub const ONE: Multiplier = Multiplier(1_000_000);
    /// The largest multiplier a file or the admin API may set.
    pub const MAX: f64 = 1000.0;

    /// `m` as written (a positive number up to [`Multiplier::MAX`], to six decimals); None
    /// otherwise.
    pub fn new(m: f64) -> Option<Multiplier> {
        (m.is_finite() && m > 0.0 && m <= Self::MAX).then(|| Multiplier((m * 1e6).round() as u32)).filter(|m| m.0 > 0)
    }

    /// As written.
    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / 1e6
    }

    pub fn is_one(self) -> bool {
        self == Multiplier::ONE
    }

    /// What a list cost of `nanos` is charged (negative for a refund: the same magnitude).
    pub fn apply(self, nanos: i64) -> i64 {
        if self.is_one() {
            return nanos;
        }
        let v = i128::from(nanos.unsigned_abs()) * i128::from(self.0);
        let charged = (v + 500_000) / 1_000_000;
        let charged = i64::try_from(charged).unwrap_or(i64::MAX);
        if nanos < 0 {
            -charged
        } else {
            charged
        }
    }

    /// The most list cost that `charged` nano-USD pays for (what a refusal's available money
    /// covers at the price table): the largest `l` with `apply(l) <= charged`.
    pub fn list_within(self, charged: i64) -> i64 {
        if self.is_one() || charged <= 0 {
            return charged;
        }
        // apply(l) ≤ c ⇔ l·m + 500_000 < (c + 1)·10⁶ ⇔ l ≤ ((c + 1)·10⁶ − 500_001) / m.
        let l = ((i128::from(charged) + 1) * 1_000_000 - 500_001) / i128::from(self.0);
        i64::try_from(l.max(0)).unwrap_or(i64::MAX)
    }
}

impl serde::Serialize for Multiplier {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.as_f64())
    }
}

impl<'de> serde::Deserialize<'de> for Multiplier {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = f64::deserialize(d)?;
        Multiplier::new(m)
            .ok_or_else(|| serde::de::Error::custom(format!("price_multiplier: a number above 0 and at most {}, not {m}", Multiplier::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multiplier_charges_exactly_and_refunds_what_it_charged() {
        let m = Multiplier::new(1.25).unwrap();
        assert_eq!(m.apply(40_000_000), 50_000_000);
        assert_eq!(m.apply(-40_000_000), -50_000_000);
        // Half a nano-dollar rounds away from zero, the same both ways.
        assert_eq!((m.apply(2), m.apply(-2)), (3, -3));
        let partner = Multiplier::new(0.8).unwrap();
        assert_eq!(partner.apply(1_000_000_007), 800_000_006);
        assert_eq!(Multiplier::ONE.apply(123), 123);
        for c in [0, 1, 2, 3, 999, 1_000_000_001] {
            for m in [m, partner, Multiplier::new(3.333_333).unwrap()] {
                let l = m.list_within(c);
                assert!(m.apply(l) <= c && m.apply(l + 1) > c, "{c} {m:?}");
            }
        }
        assert_eq!(Multiplier::new(0.0), None);
        assert_eq!(Multiplier::new(1001.0), None);
        assert_eq!(Multiplier::new(f64::NAN), None);
        assert_eq!(serde_json::to_string(&m).unwrap(), "1.25");
        assert!(serde_json::from_str::<Multiplier>("-1").is_err());
    }

    #[test]
    fn dollars_round_trip_through_nanos() {
        assert_eq!(usd_to_nanos(0.000_000_001), 1);
        assert_eq!(usd_to_nanos(1.5), 1_500_000_000);
        assert_eq!(usd(usd_to_nanos(12.345_678_9)), 12.345_678_9);
    }
}
