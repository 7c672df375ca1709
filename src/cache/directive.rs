//! What a client asks of the cache on one call, in `x-tollgate-cache`: `ttl=<secs>` (keep this
//! answer that long; at most the operator's bound), `no-store` (neither read nor keep), or
//! `refresh` (do not read, keep the new answer); directives may be joined with commas. Pure.

/// The most seconds a client may ask an answer to be kept (30 days).
pub const MAX_TTL_SECS: u64 = 30 * 24 * 3600;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Directive {
    pub ttl_secs: Option<u64>,
    pub no_store: bool,
    pub refresh: bool,
}

impl Directive {
    /// The header's directives; an unknown one or a bad `ttl` is the client's error, named.
    pub fn parse(header: &str) -> Result<Directive, String> {
        let mut d = Directive::default();
        for part in header.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some(("ttl", secs)) => {
                    let secs: u64 = secs.trim().parse().map_err(|_| format!("x-tollgate-cache: ttl={secs} is not a number of seconds"))?;
                    if secs == 0 || secs > MAX_TTL_SECS {
                        return Err(format!("x-tollgate-cache: ttl is 1 to {MAX_TTL_SECS} seconds"));
                    }
                    d.ttl_secs = Some(secs);
                }
                None if part == "no-store" => d.no_store = true,
                None if part == "refresh" => d.refresh = true,
                _ => {
                    let shown: String = part.chars().take(32).collect();
                    return Err(format!("x-tollgate-cache: '{shown}' is not one of ttl=<secs>, no-store, refresh"));
                }
            }
        }
        if d.no_store && (d.refresh || d.ttl_secs.is_some()) {
            return Err("x-tollgate-cache: no-store goes alone".into());
        }
        Ok(d)
    }

    /// The answer may be read from the cache.
    pub fn reads(&self) -> bool {
        !self.no_store && !self.refresh
    }

    /// The answer may be kept.
    pub fn keeps(&self) -> bool {
        !self.no_store
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_directives_are_read_and_a_bad_one_named_bounded() {
        assert_eq!(Directive::parse("ttl=60").expect("ok"), Directive { ttl_secs: Some(60), ..Default::default() });
        let r = Directive::parse(" refresh , ttl=5 ").expect("ok");
        assert!(!r.reads() && r.keeps() && r.ttl_secs == Some(5));
        let n = Directive::parse("no-store").expect("ok");
        assert!(!n.reads() && !n.keeps());
        assert!(Directive::parse("").expect("ok").reads());
        for (bad, says) in [
            ("ttl=0", "1 to"),
            ("ttl=x", "not a number"),
            ("ttl=99999999999", "1 to"),
            ("no-store, refresh", "alone"),
            ("forever", "'forever' is not one of"),
        ] {
            let e = Directive::parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        // A long unknown directive is cut in the message.
        let e = Directive::parse(&"y".repeat(1000)).expect_err("long");
        assert!(e.len() < 120, "{e}");
    }
}
