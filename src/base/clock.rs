//! The wall clock, as every record and check reads it.

/// Unix seconds now (0 for a clock set before 1970).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Unix milliseconds now (0 for a clock set before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The date (`YYYY-MM-DD`) of unix second `secs` in `tz`.
pub fn date_in(secs: u64, tz: &jiff::tz::TimeZone) -> String {
    match jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(i64::MAX)) {
        Ok(ts) => ts.to_zoned(tz.clone()).date().to_string(),
        Err(_) => "9999-12-31".to_string(),
    }
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS` in `tz`.
pub fn time_in(ms: u64, tz: &jiff::tz::TimeZone) -> String {
    match jiff::Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(i64::MAX)) {
        Ok(ts) => ts.to_zoned(tz.clone()).strftime("%Y-%m-%d %H:%M:%S").to_string(),
        Err(_) => "—".to_string(),
    }
}
