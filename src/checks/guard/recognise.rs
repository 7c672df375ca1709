//! The recognisers: built-in shapes of personal data and secrets, and the operator's own
//! patterns, compiled into one [`Matcher`] per guardrail. Most texts hold none, so what a text
//! costs is the first read — whether it holds anything: the secrets' patterns as one union
//! found by their literal prefixes, an email from its `@`, the digit shapes (card, phone, SSN,
//! address, IBAN) only in a text with four digits or more, the operator's patterns as one
//! union. Only a text that holds something is read by the set of them (which patterns), and
//! only those run again for their places; a candidate a checksum rules out (a card number
//! failing Luhn, an IBAN failing mod 97) is no finding. Measured in instructions per 4 KiB
//! prompt (benches/relay/instructions.sh; docs/performance.md).

use regex::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};

/// A found span of a text (byte offsets) and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub start: usize,
    pub end: usize,
    /// The category, as placeholders and logs name it (`email`, `aws_key`, an operator's
    /// pattern's name).
    pub category: String,
}

#[derive(Clone, Copy)]
enum Validate {
    None,
    Luhn,
    Iban,
    Ssn,
}

/// A built-in recogniser: its name, its pattern and the checksum a candidate must pass.
fn builtin(name: &str) -> Option<(&'static str, Validate)> {
    Some(match name {
        "email" => (r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}", Validate::None),
        "phone" => (
            r"(?:\+[1-9][0-9]{0,2}[ .-]?)?\(?(?-u:\b)[0-9]{3}\)?[ .-][0-9]{3}[ .-][0-9]{4}(?-u:\b)|\+[1-9][0-9]{7,14}(?-u:\b)",
            Validate::None,
        ),
        "card" => (r"(?-u:\b)[0-9](?:[ -]?[0-9]){12,18}(?-u:\b)", Validate::Luhn),
        "iban" => (r"(?-u:\b)[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?(?-u:\b)", Validate::Iban),
        "ssn" => (r"(?-u:\b)[0-9]{3}-[0-9]{2}-[0-9]{4}(?-u:\b)", Validate::Ssn),
        "ip" => (
            r"(?-u:\b)(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?-u:\b)|(?-u:\b)(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}(?-u:\b)",
            Validate::None,
        ),
        "aws_key" => (r"(?-u:\b)(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}(?-u:\b)", Validate::None),
        "google_api_key" => (r"(?-u:\b)AIza[0-9A-Za-z_-]{35}(?-u:\b)", Validate::None),
        "azure_key" => (r"(?:AccountKey|SharedAccessKey|AccessKey)=[A-Za-z0-9+/]{40,}={0,2}", Validate::None),
        "private_key" => (r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----(?:(?s:.)*?-----END (?:[A-Z]+ )*PRIVATE KEY-----)?", Validate::None),
        "jwt" => (r"(?-u:\b)eyJ[A-Za-z0-9_-]{6,}\.eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}", Validate::None),
        "bearer" => (r"(?-u:\b)(?:Bearer|bearer|BEARER)[ \t]+[A-Za-z0-9._~+/-]{20,}=*", Validate::None),
        "provider_key" => (
            r"(?-u:\b)(?:sk-(?:proj-|ant-(?:api|admin)[0-9][0-9]-|svcacct-)?[A-Za-z0-9_-]{20,}|sk_live_[A-Za-z0-9]{20,}|rk_live_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}|ghp_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{22,}|glpat-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,})",
            Validate::None,
        ),
        _ => return None,
    })
}

/// Which of a guardrail's patterns are read together, and when.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Every pattern begins with a literal (the secrets' prefixes): one union, found by its
    /// literals' prefilter.
    Literal,
    /// An email has its `@`: alone, found from it.
    Email,
    /// Card, phone, SSN, address, IBAN: digits in their shapes, read only in a text with at
    /// least [`MIN_DIGITS`] digits.
    Digits,
    /// The operator's patterns: one union.
    Operator,
}

/// No digit-shaped recogniser matches fewer digits (an IPv4 address has four).
const MIN_DIGITS: usize = 4;

fn gate_of(name: &str, builtin: bool) -> Gate {
    match name {
        _ if !builtin => Gate::Operator,
        "email" => Gate::Email,
        "phone" | "card" | "iban" | "ssn" | "ip" => Gate::Digits,
        _ => Gate::Literal,
    }
}

/// The patterns of one guardrail, compiled.
pub struct Matcher {
    /// Every pattern, anchored where a walk starts: where a match may be under way.
    live: regex_automata::hybrid::dfa::DFA,
    /// The patterns as a few unions, each read where its gate lets it: whether a text has
    /// anything at all.
    any: Vec<(Gate, Regex)>,
    set: RegexSet,
    each: Vec<(Regex, String, Validate)>,
}

/// A pattern that does not compile (the configuration checked the operator's; a built-in
/// always does).
#[derive(Debug)]
pub struct BadPattern(pub String);

impl Matcher {
    /// The built-in recognisers named and the operator's patterns (name, regex).
    pub fn new(builtin_names: &[String], patterns: &[(String, String)]) -> Result<Matcher, BadPattern> {
        let mut sources: Vec<(String, String, Validate)> = Vec::new();
        let mut gates = Vec::new();
        for name in builtin_names {
            let (pattern, validate) = builtin(name).ok_or_else(|| BadPattern(format!("no recogniser named {name}")))?;
            sources.push((name.clone(), pattern.to_string(), validate));
            gates.push(gate_of(name, true));
        }
        for (name, pattern) in patterns {
            sources.push((name.clone(), pattern.clone(), Validate::None));
            gates.push(Gate::Operator);
        }
        let set = RegexSetBuilder::new(sources.iter().map(|s| s.1.as_str()))
            .size_limit(8 << 20)
            .build()
            .map_err(|e| BadPattern(e.to_string()))?;
        let mut any = Vec::new();
        for gate in [Gate::Literal, Gate::Email, Gate::Digits, Gate::Operator] {
            let union: Vec<String> = sources.iter().zip(&gates).filter(|(_, g)| **g == gate).map(|(s, _)| format!("(?:{})", s.1)).collect();
            if !union.is_empty() {
                any.push((gate, RegexBuilder::new(&union.join("|")).size_limit(8 << 20).build().map_err(|e| BadPattern(e.to_string()))?));
            }
        }
        let live = regex_automata::hybrid::dfa::DFA::new_many(&sources.iter().map(|s| s.1.as_str()).collect::<Vec<_>>())
            .map_err(|e| BadPattern(e.to_string()))?;
        let each = sources
            .into_iter()
            .map(|(name, pattern, validate)| {
                RegexBuilder::new(&pattern).size_limit(1 << 20).build().map(|r| (r, name, validate)).map_err(|e| BadPattern(e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Matcher { live, any, set, each })
    }

    /// Whether `text` holds anything this guardrail looks for (the first read, see the module).
    pub fn any(&self, text: &str) -> bool {
        self.any.iter().any(|(gate, union)| (*gate != Gate::Digits || digits(text.as_bytes(), MIN_DIGITS)) && union.is_match(text))
    }

    /// A cache for [`live_from`](Self::live_from) (one per reader).
    pub fn cache(&self) -> regex_automata::hybrid::dfa::Cache {
        self.live.create_cache()
    }

    /// The earliest position of `hay` at or after `from` where a match of one of the patterns
    /// may have begun and not ended: the text from there could still become one as more comes
    /// (`hay.len()` when there is none). A walk that cannot be made is taken as under way.
    pub fn live_from(&self, cache: &mut regex_automata::hybrid::dfa::Cache, hay: &str, from: usize) -> usize {
        use regex_automata::{Anchored, Input};
        let bytes = hay.as_bytes();
        for start in (from..hay.len()).filter(|i| hay.is_char_boundary(*i)) {
            let input = Input::new(bytes).range(start..).anchored(Anchored::Yes);
            let Ok(mut state) = self.live.start_state_forward(cache, &input) else { return start };
            let mut dead = state.is_dead();
            for &b in &bytes[start..] {
                if dead {
                    break;
                }
                match self.live.next_state(cache, state, b) {
                    Ok(next) if next.is_quit() => return start,
                    Ok(next) => {
                        state = next;
                        dead = state.is_dead();
                    }
                    Err(_) => return start,
                }
            }
            if !dead {
                return start;
            }
        }
        hay.len()
    }

    /// Every finding in `text`, in order, none overlapping (the first, then the longest wins).
    pub fn find(&self, text: &str) -> Vec<Found> {
        if !self.any(text) {
            return Vec::new();
        }
        let hits = self.set.matches(text);
        if !hits.matched_any() {
            return Vec::new();
        }
        let mut found: Vec<Found> = Vec::new();
        for i in hits.iter() {
            let (regex, name, validate) = &self.each[i];
            for m in regex.find_iter(text) {
                if valid(*validate, m.as_str()) {
                    found.push(Found { start: m.start(), end: m.end(), category: name.clone() });
                }
            }
        }
        found.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
        let mut kept: Vec<Found> = Vec::with_capacity(found.len());
        for f in found {
            if kept.last().is_none_or(|k| f.start >= k.end) {
                kept.push(f);
            }
        }
        kept
    }
}

/// Whether `b` holds at least `n` ASCII digits: counted 64 bytes at a time (a loop the
/// compiler turns into vector compares), stopping once there are enough.
fn digits(b: &[u8], n: usize) -> bool {
    let mut count = 0;
    for block in b.chunks(64) {
        count += usize::from(block.iter().fold(0u8, |sum, c| sum + u8::from(c.wrapping_sub(b'0') < 10)));
        if count >= n {
            return true;
        }
    }
    false
}

fn valid(validate: Validate, text: &str) -> bool {
    match validate {
        Validate::None => true,
        Validate::Luhn => luhn(text),
        Validate::Iban => iban(text),
        Validate::Ssn => {
            let area = &text[..3];
            area != "000" && area != "666" && !area.starts_with('9') && &text[4..6] != "00" && &text[7..] != "0000"
        }
    }
}

/// A payment card number: 13 to 19 digits passing the Luhn checksum.
fn luhn(text: &str) -> bool {
    let digits: Vec<u32> = text.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| match i % 2 {
            1 if d * 2 > 9 => d * 2 - 9,
            1 => d * 2,
            _ => d,
        })
        .sum();
    sum.is_multiple_of(10)
}

/// An IBAN: its check digits make it 1 modulo 97 (ISO 13616).
fn iban(text: &str) -> bool {
    let compact: Vec<u8> = text.bytes().filter(|b| *b != b' ').collect();
    if compact.len() < 15 || compact.len() > 34 {
        return false;
    }
    let rearranged = compact[4..].iter().chain(&compact[..4]);
    let mut rest: u32 = 0;
    for &b in rearranged {
        let value = match b {
            b'0'..=b'9' => u32::from(b - b'0'),
            b'A'..=b'Z' => u32::from(b - b'A') + 10,
            _ => return false,
        };
        rest = if value >= 10 { (rest * 100 + value) % 97 } else { (rest * 10 + value) % 97 };
    }
    rest == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Matcher {
        let names: Vec<String> =
            crate::config::guardrails::PII.iter().chain(&crate::config::guardrails::SECRETS).map(|s| s.to_string()).collect();
        Matcher::new(&names, &[("ticket".into(), "TKT-[0-9]{6}".into())]).expect("compiles")
    }

    fn categories(text: &str) -> Vec<String> {
        all().find(text).into_iter().map(|f| f.category).collect()
    }

    #[test]
    fn each_recogniser_finds_its_shape_and_passes_look_alikes() {
        for (text, category) in [
            ("write to ana.lopez+billing@example.co.uk today", "email"),
            ("call +1 415-555-0134 now", "phone"),
            ("card 4111 1111 1111 1111 exp", "card"),
            ("IBAN GB82 WEST 1234 5698 7654 32 please", "iban"),
            ("ssn 123-45-6789", "ssn"),
            ("from 203.0.113.77 and", "ip"),
            ("key AKIAIOSFODNN7EXAMPLE here", "aws_key"),
            ("g AIzaSyA1234567890abcdefghijklmnopqrstuv done", "google_api_key"),
            ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "private_key"),
            ("t eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcdefghijk", "jwt"),
            ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123", "bearer"),
            ("OPENAI sk-proj-abcdefghijklmnopqrstuvwxyz123456", "provider_key"),
            ("ticket TKT-123456 opened", "ticket"),
        ] {
            assert_eq!(categories(text), [category], "{text}");
        }
        // Look-alikes: a number failing Luhn, an IBAN failing mod 97, an impossible SSN,
        // a version string, plain prose.
        for text in ["4111 1111 1111 1112", "GB82 WEST 1234 5698 7654 33", "000-12-3456", "version 1.2.3", "nothing here at all"] {
            assert!(categories(text).is_empty(), "{text}: {:?}", categories(text));
        }
    }

    #[test]
    fn findings_are_ordered_and_never_overlap() {
        let found = all().find("a@b.io then AKIAIOSFODNN7EXAMPLE and a@b.io");
        let spans: Vec<(usize, usize, &str)> = found.iter().map(|f| (f.start, f.end, f.category.as_str())).collect();
        assert_eq!(spans, [(0, 6, "email"), (12, 32, "aws_key"), (37, 43, "email")]);
    }
}
