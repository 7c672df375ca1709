//! Token counts: what one call used, and the bound on what a request may be allowed to produce.

/// The largest output allowance (tokens, all choices together) a request may ask for when its
/// model has no `max_output_tokens`: no model produces this much in one answer.
pub const MAX_OUTPUT_ALLOWANCE: u64 = 1 << 24;

/// Token counts of one call. `input` excludes `cached` (cache reads) and `cache_write`
/// (cache writes); each is priced apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub cached: u64,
    pub cache_write: u64,
    pub output: u64,
}

impl Usage {
    /// All input: plain, cache reads and cache writes.
    pub fn input_total(&self) -> u64 {
        self.input.saturating_add(self.cached).saturating_add(self.cache_write)
    }
}
