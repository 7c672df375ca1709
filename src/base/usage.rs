//! What one call used and said of itself (token counts, the answering model and why it
//! stopped), as the per-protocol readers find it, and the bound on what a request may be
//! allowed to produce.

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

/// What a traced answer said of itself: the model that answered and why it stopped (read by
/// the usage scanner, only for a sampled request).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub model: Option<String>,
    pub finish_reasons: Vec<String>,
}

impl Answer {
    pub fn model(&mut self, model: Option<&str>) {
        if let (None, Some(m)) = (&self.model, model.filter(|m| !m.is_empty())) {
            self.model = Some(m.to_string());
        }
    }

    pub fn finish_reason(&mut self, reason: Option<&str>) {
        if let Some(r) = reason.filter(|r| !r.is_empty()) {
            if !self.finish_reasons.iter().any(|have| have == r) {
                self.finish_reasons.push(r.to_string());
            }
        }
    }
}
