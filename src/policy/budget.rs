//! Spend windows: caps on what a key or a shared account may spend per calendar day, week
//! (from Monday) and month, in `billing.timezone`, or over a rolling duration (`5h`, `24h`,
//! `7d`: the trailing window, see [`Rolling`]).
//!
//! A window's spend is kept as its own balance in the money store, named by its owner, its
//! kind and the unix time it starts ([`window_purse`]): it starts at 0 and each booking debits
//! it, so a new window needs no reset job (its name is new) and survives restarts (it is
//! stored like any balance). A request is held against each window like against a balance,
//! with the cap as the window's credit (`cap − spent − held ≥ hold`): parallel requests can
//! never take a window past its cap, and a cap changed mid-window applies at once to what the
//! window already spent.

use serde::{Deserialize, Serialize};

/// A calendar window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Window {
    Day,
    Week,
    Month,
}

impl Window {
    pub const ALL: [Window; 3] = [Window::Day, Window::Week, Window::Month];

    pub fn as_str(self) -> &'static str {
        match self {
            Window::Day => "day",
            Window::Week => "week",
            Window::Month => "month",
        }
    }
}

/// Caps per window, nano-USD (as stored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub week: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub month: Option<i64>,
    /// Rolling windows, shortest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolling: Vec<Rolling>,
}

/// The shortest and longest rolling window.
const ROLLING_MIN_SECS: u64 = 60;
const ROLLING_MAX_SECS: u64 = 366 * 86_400;
/// A rolling window is summed over at most this many buckets, and one more.
const ROLLING_BUCKETS: u64 = 48;
/// The bucket sizes a rolling window may have (seconds; past a day, whole days).
const BUCKET_SIZES: [u64; 12] = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400];

/// A cap on the spend of the trailing `secs` seconds.
///
/// Its spend is kept in buckets of [`Rolling::bucket`] seconds, each a balance of the money
/// store like a calendar window's (`win:<owner>:r<secs>:<until>`, `until` the time its spend
/// stops counting). A call is held in the current bucket, with the cap less what the window's
/// earlier buckets spent and hold as its credit, checked under the store's lock (on a fleet, in
/// the database's lease transaction), so parallel calls cannot overrun it. A spend counts from
/// its hold until between `secs` and `secs + bucket` later — never less: the window never
/// admits more than its cap over any `secs`, and frees what it holds at most one bucket late.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rolling {
    pub secs: u64,
    /// nano-USD.
    pub cap: i64,
}

impl Rolling {
    /// Its bucket: the smallest of [`BUCKET_SIZES`] (past them, whole days) that splits it
    /// into at most [`ROLLING_BUCKETS`].
    pub fn bucket(self) -> u64 {
        let least = self.secs.div_ceil(ROLLING_BUCKETS);
        BUCKET_SIZES.iter().copied().find(|&b| b >= least).unwrap_or_else(|| least.div_ceil(86_400) * 86_400)
    }

    /// How many buckets before the current one still count.
    pub fn earlier(self) -> u64 {
        self.secs.div_ceil(self.bucket())
    }

    /// Its name as written: `90m`, `5h`, `48h`, `7d` (days past two).
    pub fn label(self) -> String {
        match self.secs {
            s if s % 86_400 == 0 && s > 2 * 86_400 => format!("{}d", s / 86_400),
            s if s % 3_600 == 0 => format!("{}h", s / 3_600),
            s => format!("{}m", s / 60),
        }
    }

    /// A duration as written (`m`, `h`, `d`; 1 minute to 366 days), in seconds.
    pub fn parse_label(label: &str) -> Option<u64> {
        let unit = match label.as_bytes().last()? {
            b'm' => 60,
            b'h' => 3_600,
            b'd' => 86_400,
            _ => return None,
        };
        let digits = &label[..label.len() - 1];
        if digits.is_empty() || digits.len() > 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let secs = digits.parse::<u64>().ok()?.checked_mul(unit)?;
        (ROLLING_MIN_SECS..=ROLLING_MAX_SECS).contains(&secs).then_some(secs)
    }

    /// The buckets that count at `now`: each one's start and the time its spend stops
    /// counting, the current one first.
    pub fn buckets(self, now: u64) -> impl Iterator<Item = (u64, u64)> {
        let bucket = self.bucket();
        let current = now - now % bucket;
        let span = (self.earlier() + 1) * bucket;
        (0..=self.earlier()).filter_map(move |k| current.checked_sub(k * bucket)).map(move |start| (start, start + span))
    }
}

/// Caps per window in USD, as the configuration file and the admin API give them; a window
/// other than these three is refused by name (`budgets: 'year' is not a window …`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BudgetsInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub week: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub month: Option<f64>,
    /// Rolling windows by their name (`5h`, `24h`, `7d`).
    #[serde(flatten)]
    pub rolling: std::collections::BTreeMap<String, f64>,
}

impl<'de> Deserialize<'de> for BudgetsInput {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<BudgetsInput, D::Error> {
        let caps = std::collections::BTreeMap::<String, f64>::deserialize(d)?;
        let mut input = BudgetsInput::default();
        for (name, usd) in caps {
            let slot = match name.as_str() {
                "day" => &mut input.day,
                "week" => &mut input.week,
                "month" => &mut input.month,
                _ if Rolling::parse_label(&name).is_some() => {
                    input.rolling.insert(name, usd);
                    continue;
                }
                _ => {
                    return Err(serde::de::Error::custom(format!(
                        "budgets: '{name}' is not a window (day, week, month, or a duration: 30m, 5h, 7d — 1 minute to 366 days)"
                    )))
                }
            };
            *slot = Some(usd);
        }
        Ok(input)
    }
}

impl Budgets {
    pub fn is_empty(&self) -> bool {
        self.day.is_none() && self.week.is_none() && self.month.is_none() && self.rolling.is_empty()
    }

    /// The cap of `window`, if one is set.
    pub fn cap(&self, window: Window) -> Option<i64> {
        match window {
            Window::Day => self.day,
            Window::Week => self.week,
            Window::Month => self.month,
        }
    }

    /// The windows that have a cap, with it.
    pub fn caps(&self) -> impl Iterator<Item = (Window, i64)> + '_ {
        Window::ALL.into_iter().filter_map(|w| self.cap(w).map(|c| (w, c)))
    }

    /// Validate caps given in USD: each a positive number, at most 1,000,000. Errors name
    /// the field (`budgets.day`).
    pub fn parse(input: &BudgetsInput) -> Result<Budgets, super::PolicyError> {
        let nanos = |window: Window, usd: Option<f64>| match usd {
            Some(usd) if !(usd.is_finite() && usd > 0.0 && usd <= 1e6) => {
                Err(super::PolicyError::new(format!("budgets.{}", window.as_str()), "a positive number of USD, at most 1000000"))
            }
            Some(usd) => Ok(Some(crate::base::money::usd_to_nanos(usd))),
            None => Ok(None),
        };
        let mut rolling = Vec::with_capacity(input.rolling.len());
        for (label, &usd) in &input.rolling {
            let secs = Rolling::parse_label(label)
                .ok_or_else(|| super::PolicyError::new(format!("budgets.{label}"), "a duration: 30m, 5h, 7d (1 minute to 366 days)"))?;
            if !(usd.is_finite() && usd > 0.0 && usd <= 1e6) {
                return Err(super::PolicyError::new(format!("budgets.{label}"), "a positive number of USD, at most 1000000"));
            }
            if rolling.iter().any(|r: &Rolling| r.secs == secs) {
                return Err(super::PolicyError::new(format!("budgets.{label}"), "the same duration is written twice"));
            }
            rolling.push(Rolling { secs, cap: crate::base::money::usd_to_nanos(usd) });
        }
        if rolling.len() > 8 {
            return Err(super::PolicyError::new("budgets", "at most 8 rolling windows"));
        }
        rolling.sort_by_key(|r| r.secs);
        Ok(Budgets {
            day: nanos(Window::Day, input.day)?,
            week: nanos(Window::Week, input.week)?,
            month: nanos(Window::Month, input.month)?,
            rolling,
        })
    }

    pub fn input(&self) -> BudgetsInput {
        let usd = |n: Option<i64>| n.map(crate::base::money::usd);
        BudgetsInput {
            day: usd(self.day),
            week: usd(self.week),
            month: usd(self.month),
            rolling: self.rolling.iter().map(|r| (r.label(), crate::base::money::usd(r.cap))).collect(),
        }
    }
}

/// Rolling windows' lists of earlier buckets, by their current bucket's purse id.
type BucketLists = std::collections::HashMap<String, std::sync::Arc<[String]>, ahash::RandomState>;

/// Calendar windows in the billing time zone (`billing.timezone`, an IANA name; the time zone
/// database is compiled into the binary).
#[derive(Debug, Clone)]
pub struct Calendar {
    tz: jiff::tz::TimeZone,
    name: String,
    /// The current window of each kind, packed in one word each (see [`pack`]): a request
    /// inside it needs no time-zone arithmetic.
    current: std::sync::Arc<[std::sync::atomic::AtomicU64; 3]>,
    /// Rolling windows' earlier buckets by the current bucket's purse id: one list for every
    /// call until the bucket turns.
    earlier: std::sync::Arc<std::sync::Mutex<BucketLists>>,
}

/// A window as one word: its start (unix seconds, 40 bits) and its length (seconds, 24 bits:
/// a month is at most 31 days and an hour). 0: none.
fn pack(start: u64, end: u64) -> u64 {
    let len = end.saturating_sub(start);
    if start >= 1 << 40 || len == 0 || len >= 1 << 24 {
        return 0;
    }
    start | (len << 40)
}

fn unpack(word: u64) -> (u64, u64) {
    let start = word & ((1 << 40) - 1);
    (start, start + (word >> 40))
}

impl Default for Calendar {
    fn default() -> Self {
        Calendar::with(jiff::tz::TimeZone::UTC, "UTC")
    }
}

impl Calendar {
    fn with(tz: jiff::tz::TimeZone, name: &str) -> Calendar {
        Calendar { tz, name: name.to_string(), current: Default::default(), earlier: Default::default() }
    }

    pub fn new(name: &str) -> Result<Calendar, String> {
        let tz = jiff::tz::TimeZone::get(name).map_err(|_| format!("'{name}' is not an IANA time zone name (UTC, Europe/Berlin, …)"))?;
        Ok(Calendar::with(tz, name))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tz(&self) -> &jiff::tz::TimeZone {
        &self.tz
    }

    /// The earlier buckets of the rolling window whose current bucket is `current` (a purse
    /// id), made by `make` the first time; lists of buckets that no longer count are dropped
    /// as new ones are made.
    pub fn earlier_buckets(&self, current: &str, now: u64, make: impl FnOnce() -> Vec<String>) -> std::sync::Arc<[String]> {
        let mut lists = self.earlier.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(list) = lists.get(current) {
            return list.clone();
        }
        // A list is kept while its bucket is the current one.
        lists.retain(|id, _| rolling_current_until(id).is_some_and(|end| end > now));
        let list: std::sync::Arc<[String]> = make().into();
        lists.insert(current.to_string(), list.clone());
        list
    }

    /// The first instant (unix seconds) of a `YYYY-MM-DD` date in this time zone.
    pub fn day_start(&self, date: &str) -> Option<u64> {
        let date: jiff::civil::Date = date.parse().ok()?;
        let start = date.to_zoned(self.tz.clone()).ok()?.start_of_day().ok()?;
        u64::try_from(start.timestamp().as_second()).ok()
    }

    /// The date (`YYYY-MM-DD`) `days` after `date`.
    pub fn add_days(date: &str, days: i64) -> Option<String> {
        let date: jiff::civil::Date = date.parse().ok()?;
        Some(date.checked_add(jiff::Span::new().days(days)).ok()?.to_string())
    }

    /// The window of kind `window` that contains `now` (unix seconds): its start and end (the
    /// next window's start), unix seconds. Days start at local midnight (or the first instant
    /// of the day where a clock change skips midnight), weeks on Monday, months on the 1st.
    pub fn window(&self, window: Window, now: u64) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let slot = &self.current[window as usize];
        let word = slot.load(Relaxed);
        if word != 0 {
            let (start, end) = unpack(word);
            if start <= now && now < end {
                return (start, end);
            }
        }
        let (start, end) = self.compute(window, now);
        slot.store(pack(start, end), Relaxed);
        (start, end)
    }

    fn compute(&self, window: Window, now: u64) -> (u64, u64) {
        let bounds = || -> Result<(u64, u64), jiff::Error> {
            let ts = jiff::Timestamp::from_second(i64::try_from(now).unwrap_or(i64::MAX))?;
            let date = ts.to_zoned(self.tz.clone()).date();
            let (start, next) = match window {
                Window::Day => (date, date.tomorrow()?),
                Window::Week => {
                    let monday = date.checked_sub(jiff::Span::new().days(i64::from(date.weekday().to_monday_zero_offset())))?;
                    (monday, monday.checked_add(jiff::Span::new().days(7))?)
                }
                Window::Month => {
                    let first = date.first_of_month();
                    (first, first.checked_add(jiff::Span::new().months(1))?)
                }
            };
            let at = |d: jiff::civil::Date| -> Result<u64, jiff::Error> {
                Ok(u64::try_from(d.to_zoned(self.tz.clone())?.start_of_day()?.timestamp().as_second()).unwrap_or(0))
            };
            Ok((at(start)?, at(next)?))
        };
        // Only for times beyond what the calendar can name (year 9999): one window for all.
        bounds().unwrap_or((0, u64::MAX))
    }
}

/// Who a window belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner<'a> {
    Key(&'a str),
    Account(&'a str),
    /// A person (the identity provider's subject): the windows their team admin sets bound all
    /// of their keys together.
    Person(&'a str),
    /// A tag value (`name=value`) of `tag_limits`.
    Tag(&'a str),
    /// The plan of a holder (a key id, or `acct:<name>`): its windows are the holder's under
    /// the plan.
    Plan(&'a str),
}

/// The money-store name of an account's balance.
pub fn account_purse(name: &str) -> String {
    let mut id = String::with_capacity(5 + name.len());
    id.push_str("acct:");
    id.push_str(name);
    id
}

/// The money-store name of a window's spend: `win:<owner>:<window>:<start>` (built in one
/// allocation: every request of a key with budgets names its windows).
pub fn window_purse(owner: &Owner<'_>, window: Window, start: u64) -> String {
    let (prefix, name) = match owner {
        Owner::Key(id) => ("win:", *id),
        Owner::Account(name) => ("win:acct:", *name),
        Owner::Person(subject) => ("win:person:", *subject),
        Owner::Tag(tag) => ("win:tag:", *tag),
        Owner::Plan(holder) => ("win:plan:", *holder),
    };
    let mut digits = itoa::Buffer::new();
    let start = digits.format(start);
    let kind = window.as_str();
    let mut id = String::with_capacity(prefix.len() + name.len() + kind.len() + start.len() + 2);
    id.push_str(prefix);
    id.push_str(name);
    id.push(':');
    id.push_str(kind);
    id.push(':');
    id.push_str(start);
    id
}

/// The money-store name of a rolling window's bucket: `win:<owner>:r<secs>:<until>`, `until`
/// the time its spend stops counting (so it is forgotten as a calendar window is, by its last
/// number).
pub fn rolling_purse(owner: &Owner<'_>, secs: u64, until: u64) -> String {
    let (prefix, name) = match owner {
        Owner::Key(id) => ("win:", *id),
        Owner::Account(name) => ("win:acct:", *name),
        Owner::Person(subject) => ("win:person:", *subject),
        Owner::Tag(tag) => ("win:tag:", *tag),
        Owner::Plan(holder) => ("win:plan:", *holder),
    };
    let mut id = String::with_capacity(prefix.len() + name.len() + 24);
    id.push_str(prefix);
    id.push_str(name);
    id.push_str(":r");
    id.push_str(itoa::Buffer::new().format(secs));
    id.push(':');
    id.push_str(itoa::Buffer::new().format(until));
    id
}

/// A rolling window bucket's purse id read: its window's length and when its spend stops
/// counting (`win:<owner>:r<secs>:<until>`), by bytes from the end (every booking asks it of
/// every purse it touches).
fn rolling_parts(id: &str) -> Option<(u64, u64)> {
    let b = id.strip_prefix("win:")?.as_bytes();
    let number = |digits: &[u8]| -> Option<u64> {
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
    };
    let last = b.iter().rposition(|&c| c == b':')?;
    let before = b[..last].iter().rposition(|&c| c == b':')?;
    // Any other window's id is told apart before a number is read.
    let secs = b[before + 1..last].strip_prefix(b"r")?;
    Some((number(secs)?, number(&b[last + 1..])?))
}

/// When a rolling window bucket's spend stops counting, if `id` names one.
pub fn rolling_until(id: &str) -> Option<u64> {
    rolling_parts(id).map(|(_, until)| until)
}

/// When the bucket a rolling window's purse id names stops being the current one.
pub fn rolling_current_until(id: &str) -> Option<u64> {
    let (secs, until) = rolling_parts(id)?;
    let rolling = Rolling { secs, cap: 0 };
    until.checked_sub(rolling.earlier() * rolling.bucket())
}

/// The last number of a window's purse id: a calendar window's start, a rolling window
/// bucket's end of counting; None for any other purse.
pub fn window_start(id: &str) -> Option<u64> {
    id.strip_prefix("win:")?.rsplit(':').next()?.parse().ok()
}

/// A window that started this long before the retention cut has ended before it (a month is
/// at most 31 days, and a day of a clock change 25 hours): its balance is forgotten with the
/// records of its time.
pub const WINDOW_KEPT_SECS: u64 = 32 * 86_400;

/// An account name: 1 to 64 letters, digits, `.`, `_` or `-`.
pub fn valid_account_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err(format!("'{name}': an account name is 1 to 64 letters, digits, '.', '_' or '-'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> u64 {
        crate::policy::rfc3339_unix(text).expect("time")
    }

    #[test]
    fn windows_follow_the_calendar_of_the_time_zone() {
        let utc = Calendar::default();
        let now = at("2026-11-25T15:30:00Z"); // a Wednesday
        assert_eq!(utc.window(Window::Day, now), (at("2026-11-25T00:00:00Z"), at("2026-11-26T00:00:00Z")));
        assert_eq!(utc.window(Window::Week, now), (at("2026-11-23T00:00:00Z"), at("2026-11-30T00:00:00Z")));
        assert_eq!(utc.window(Window::Month, now), (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z")));
        // The end of one window is the start of the next.
        let (_, end) = utc.window(Window::Day, now);
        assert_eq!(utc.window(Window::Day, end).0, end);
        assert_eq!(utc.window(Window::Day, end - 1).1, end);
        // New York: a day starts at 05:00 UTC in winter; 01:00 UTC on the 25th is still the 24th.
        let ny = Calendar::new("America/New_York").expect("zone");
        assert_eq!(ny.window(Window::Day, at("2026-11-25T01:00:00Z")), (at("2026-11-24T05:00:00Z"), at("2026-11-25T05:00:00Z")));
        // The day the clocks go back (1 November 2026) has 25 hours; the month starts at 04:00 UTC (EDT).
        let (start, end) = ny.window(Window::Day, at("2026-11-01T12:00:00Z"));
        assert_eq!(end - start, 25 * 3600);
        assert_eq!(ny.window(Window::Month, at("2026-11-10T00:00:00Z")).0, at("2026-11-01T04:00:00Z"));
        // The cached window answers as the computation does, on either side of its edges.
        for t in [start - 1, start, end - 1, end, start + 3600] {
            assert_eq!(ny.window(Window::Day, t), ny.compute(Window::Day, t), "{t}");
        }
        assert_eq!(unpack(pack(start, end)), (start, end));
        // A Sunday belongs to the week that began the Monday before.
        assert_eq!(utc.window(Window::Week, at("2026-11-29T23:59:59Z")).0, at("2026-11-23T00:00:00Z"));
        assert!(Calendar::new("Mars/Olympus").is_err());
    }

    #[test]
    fn rolling_windows_are_named_by_duration_and_kept_in_buckets() {
        for (label, secs, bucket, earlier) in [
            ("1m", 60, 60, 1),
            ("90m", 5_400, 120, 45),
            ("5h", 18_000, 600, 30),
            ("24h", 86_400, 1_800, 48),
            ("7d", 604_800, 21_600, 28),
            ("366d", 366 * 86_400, 8 * 86_400, 46),
        ] {
            assert_eq!(Rolling::parse_label(label), Some(secs), "{label}");
            let r = Rolling { secs, cap: 1 };
            assert_eq!((r.bucket(), r.earlier()), (bucket, earlier), "{label}");
            assert_eq!(r.label(), label);
            // The current bucket and the earlier ones, each counting (earlier + 1) buckets.
            let now = 1_800_000_123;
            let all: Vec<(u64, u64)> = r.buckets(now).collect();
            assert_eq!(all.len() as u64, earlier + 1);
            assert!(all[0].0 <= now && now < all[0].0 + bucket);
            assert!(all.iter().all(|(start, until)| until - start == (earlier + 1) * bucket && until - start >= secs));
        }
        for bad in ["0m", "367d", "5", "h", "5w", "-5h", "1.5h", "59s"] {
            assert_eq!(Rolling::parse_label(bad), None, "{bad}");
        }
        let input: BudgetsInput = serde_json::from_str(r#"{"5h": 2, "24h": 10, "day": 3}"#).expect("input");
        let b = Budgets::parse(&input).expect("valid");
        assert_eq!(b.rolling, vec![Rolling { secs: 18_000, cap: 2_000_000_000 }, Rolling { secs: 86_400, cap: 10_000_000_000 }]);
        assert_eq!(Budgets::parse(&b.input()), Ok(b.clone()));
        assert_eq!(serde_json::to_value(b.input()).expect("json"), serde_json::json!({"day": 3.0, "5h": 2.0, "24h": 10.0}));
        let id = rolling_purse(&Owner::Account("team"), 18_000, 1_800_018_600);
        assert_eq!(id, "win:acct:team:r18000:1800018600");
        assert_eq!((rolling_until(&id), window_start(&id)), (Some(1_800_018_600), Some(1_800_018_600)));
        assert_eq!(rolling_until(&window_purse(&Owner::Key("k"), Window::Day, 5)), None);
        // 5h in buckets of 10 minutes: the bucket stops being the current one 30 buckets early.
        assert_eq!(rolling_current_until(&id), Some(1_800_018_600 - 30 * 600));
        for not_rolling in ["win:plan:k:credit:5", "win:k:r:5", "win:k:rx1:5", "win:r5", "k:r5:6", "win:k:r5:"] {
            assert_eq!(rolling_until(not_rolling), None, "{not_rolling}");
        }
        // The earlier buckets' list is made once per current bucket, and dropped once it turns.
        let calendar = Calendar::default();
        let r = Rolling { secs: 18_000, cap: 1 };
        let (now, made) = (1_800_000_000, std::cell::Cell::new(0));
        let list_at = |t: u64| {
            let mut all = r.buckets(t).map(|(_, until)| rolling_purse(&Owner::Key("k"), r.secs, until));
            let current = all.next().expect("current");
            calendar.earlier_buckets(&current, t, || {
                made.set(made.get() + 1);
                all.collect()
            })
        };
        let first = list_at(now);
        assert!(std::sync::Arc::ptr_eq(&first, &list_at(now + 1)));
        assert_eq!((first.len(), made.get()), (30, 1));
        let _next = list_at(now + 600);
        assert_eq!(made.get(), 2);
        assert_eq!(calendar.earlier.lock().expect("lock").len(), 1, "the turned bucket's list is dropped");
        let e = Budgets::parse(&BudgetsInput { rolling: [("5h".to_string(), -1.0)].into(), ..Default::default() }).unwrap_err();
        assert!(e.to_string().starts_with("budgets.5h"), "{e}");
    }

    #[test]
    fn caps_are_validated_by_window() {
        let b = Budgets::parse(&BudgetsInput { day: Some(1.5), week: None, month: Some(20.0), ..Default::default() }).expect("valid");
        assert_eq!(b.caps().collect::<Vec<_>>(), vec![(Window::Day, 1_500_000_000), (Window::Month, 20_000_000_000)]);
        assert_eq!(Budgets::parse(&b.input()), Ok(b));
        for (bad, field) in [
            (BudgetsInput { day: Some(-1.0), ..Default::default() }, "budgets.day"),
            (BudgetsInput { week: Some(0.0), ..Default::default() }, "budgets.week"),
            (BudgetsInput { month: Some(f64::NAN), ..Default::default() }, "budgets.month"),
        ] {
            assert!(Budgets::parse(&bad).unwrap_err().to_string().starts_with(field), "{bad:?}");
        }
        let unknown: Result<BudgetsInput, _> = serde_json::from_str(r#"{"day": 1, "year": 5}"#);
        assert!(unknown.unwrap_err().to_string().starts_with("budgets: 'year' is not a window"), "an unknown window is refused by name");
        assert_eq!(window_start(&window_purse(&Owner::Account("a.b"), Window::Week, 1_795_392_000)), Some(1_795_392_000));
        assert_eq!(window_start("key_0123"), None);
        assert!(valid_account_name("team-a.prod_1").is_ok());
        for bad in ["", "a b", "a:b", &"x".repeat(65)] {
            assert!(valid_account_name(bad).is_err(), "{bad}");
        }
    }
}
