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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_round_trip_through_nanos() {
        assert_eq!(usd_to_nanos(0.000_000_001), 1);
        assert_eq!(usd_to_nanos(1.5), 1_500_000_000);
        assert_eq!(usd(usd_to_nanos(12.345_678_9)), 12.345_678_9);
    }
}
