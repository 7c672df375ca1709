//! The rules that turn a request and what its response showed into money: the hold estimate
//! before forwarding, and the usage billed afterwards (reported, or estimated on abnormal ends)
//! — here; prices, holds, settlement and usage records in [`ledger`]; the usage scanner that
//! reads what an answer reported, as it streams, in [`meter`].

pub mod batch;
pub mod ledger;
pub mod media;
pub mod meter;
pub mod prices;
pub mod realtime;
pub mod retention;

use crate::base::usage::Usage;
use crate::billing::meter::{tokens_from_bytes, ScanResult};

/// Input tokens assumed for the hold: one per three bytes of request body (an upper bound for
/// ordinary text; the real count replaces it at settlement).
pub fn hold_input_tokens(body_len: usize) -> u64 {
    (body_len as u64).div_ceil(3)
}

/// What a request's input may cost in tokens, held before it is sent and billed when the
/// upstream reports no usage (fail closed): the body at one token per three bytes, each
/// referenced image and file at its allowance, and the conversation a `previous_response_id`
/// continues (its recorded input and output), which the upstream counts again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputEstimate {
    pub body_tokens: u64,
    pub media_tokens: u64,
    pub referenced_tokens: u64,
}

impl InputEstimate {
    pub fn tokens(&self) -> u64 {
        self.body_tokens.saturating_add(self.media_tokens).saturating_add(self.referenced_tokens)
    }
}

/// The usage to bill, and whether it is estimated.
///
/// Reported usage wins. Billing fails closed: a successful (2xx) answer without a usage report
/// is billed for every byte received from the upstream (about four bytes a token, at least one
/// token: text, reasoning, tool-call arguments and JSON framing alike) plus the input estimate
/// the hold was made from (`input_estimate`, tokens: see [`InputEstimate`]).
/// A failed answer is billed only for the content it carried; one that produced nothing
/// (upstream error, no answer) is billed nothing. An answer of `vectors` (embeddings) generates
/// no tokens: a successful one without a report is billed its input estimate and no output.
pub fn billed_usage(scan: Option<ScanResult>, status: u16, input_estimate: u64, vectors: bool) -> (Usage, bool) {
    let Some(scan) = scan else { return (Usage::default(), false) };
    let input = scan.input.unwrap_or(input_estimate);
    let reported = |output| Usage { input, cached: scan.cached.unwrap_or(0), cache_write: scan.cache_write.unwrap_or(0), output };
    let output = scan.output.or_else(|| (vectors && (200..300).contains(&status)).then_some(0));
    if let Some(output) = output {
        return (reported(output), scan.input.is_none());
    }
    if (200..300).contains(&status) {
        let received = scan.body_bytes.max(scan.text_bytes);
        return (reported(tokens_from_bytes(received).max(1)), true);
    }
    if scan.text_bytes > 0 {
        return (reported(tokens_from_bytes(scan.text_bytes)), true);
    }
    (Usage::default(), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(input: Option<u64>, output: Option<u64>, text_bytes: u64, body_bytes: u64) -> Option<ScanResult> {
        Some(ScanResult { input, cached: None, cache_write: None, output, text_bytes, body_bytes, media: Default::default() })
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage { input, output, ..Usage::default() }
    }

    #[test]
    fn reported_usage_is_billed_as_reported() {
        assert_eq!(billed_usage(scan(Some(10), Some(3), 12, 500), 200, 100, false), (usage(10, 3), false));
        let with_cache = Some(ScanResult {
            input: Some(10),
            cached: Some(4),
            cache_write: Some(6),
            output: Some(3),
            text_bytes: 0,
            body_bytes: 9,
            media: Default::default(),
        });
        assert_eq!(billed_usage(with_cache, 200, 100, false), (Usage { input: 10, cached: 4, cache_write: 6, output: 3 }, false));
    }

    #[test]
    fn a_successful_answer_without_usage_is_billed_for_every_byte_received() {
        // A stream cut before its usage: 9 bytes of text inside 180 bytes of events.
        assert_eq!(billed_usage(scan(None, None, 9, 180), 200, 100, false), (usage(100, 45), true));
        // Messages: input known from message_start, output from what was received.
        assert_eq!(billed_usage(scan(Some(20), None, 1, 40), 200, 100, false), (usage(20, 10), true));
        // Tool calls, JSON, anything the text count does not read: still every byte.
        assert_eq!(billed_usage(scan(None, None, 0, 4000), 200, 100, false), (usage(100, 1000), true));
        // Never zero: a 2xx that delivered nothing still bills input and one output token.
        assert_eq!(billed_usage(scan(None, None, 0, 0), 200, 100, false), (usage(100, 1), true));
    }

    #[test]
    fn failed_answers_bill_only_what_they_carried() {
        assert_eq!(billed_usage(None, 502, 100, false), (Usage::default(), false));
        assert_eq!(billed_usage(scan(None, None, 0, 120), 429, 100, false), (Usage::default(), false));
        assert_eq!(billed_usage(scan(None, None, 8, 120), 500, 100, false), (usage(100, 2), true));
    }

    #[test]
    fn an_unreported_embeddings_answer_bills_its_input_and_no_output() {
        // Vectors are not generated tokens: 2xx without a report → input estimate, output 0.
        assert_eq!(billed_usage(scan(None, None, 0, 4000), 200, 100, true), (usage(100, 0), true));
        assert_eq!(billed_usage(scan(Some(6), Some(0), 0, 4000), 200, 100, true), (usage(6, 0), false));
        // A failed one is billed as any other.
        assert_eq!(billed_usage(scan(None, None, 0, 120), 429, 100, true), (Usage::default(), false));
    }

    #[test]
    fn the_input_estimate_adds_what_is_not_in_the_body() {
        assert_eq!(hold_input_tokens(1000), 334);
        assert_eq!(hold_input_tokens(0), 0);
        let e = InputEstimate {
            body_tokens: 334,
            media_tokens: 2 * crate::config::billing::DEFAULT_IMAGE_INPUT_TOKENS,
            referenced_tokens: 200_000,
        };
        assert_eq!(e.tokens(), 204_334);
        // Unreported input is billed at the estimate, references included.
        assert_eq!(billed_usage(scan(None, None, 0, 40), 200, e.tokens(), false).0.input, 204_334);
    }
}
