//! The rules that turn a request and what its response showed into money: the hold estimate
//! before forwarding, and the usage billed afterwards (reported, or estimated on abnormal ends).

use crate::meter::{tokens_from_bytes, ScanResult, Usage};

/// Input tokens assumed for the hold: one per three bytes of request body (an upper bound for
/// ordinary text; the real count replaces it at settlement).
pub fn hold_input_tokens(body_len: usize) -> u64 {
    (body_len as u64).div_ceil(3)
}

/// Input tokens assumed when no usage was reported: one per four bytes.
pub fn fallback_input_tokens(body_len: usize) -> u64 {
    (body_len as u64).div_ceil(4)
}

/// The usage to bill, and whether it is estimated.
///
/// Reported usage wins. Without it, a response that produced output is billed for the text it
/// streamed (never zero tokens when any text passed) plus an input estimate; a response that
/// produced nothing (upstream error, no answer) is billed nothing.
pub fn billed_usage(scan: Option<ScanResult>, status: u16, request_len: usize) -> (Usage, bool) {
    let Some(scan) = scan else { return (Usage::default(), false) };
    if let Some(output) = scan.output {
        let usage = Usage {
            input: scan.input.unwrap_or_else(|| fallback_input_tokens(request_len)),
            cached: scan.cached.unwrap_or(0),
            output,
        };
        return (usage, scan.input.is_none());
    }
    let succeeded = (200..300).contains(&status);
    if scan.text_bytes > 0 || (succeeded && scan.input.is_some()) {
        let usage = Usage {
            input: scan.input.unwrap_or_else(|| fallback_input_tokens(request_len)),
            cached: scan.cached.unwrap_or(0),
            output: tokens_from_bytes(scan.text_bytes).max(u64::from(scan.text_bytes > 0)),
        };
        return (usage, true);
    }
    (Usage::default(), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(input: Option<u64>, output: Option<u64>, text_bytes: u64) -> Option<ScanResult> {
        Some(ScanResult { input, cached: None, output, text_bytes })
    }

    #[test]
    fn reported_usage_is_billed_as_reported() {
        assert_eq!(billed_usage(scan(Some(10), Some(3), 12), 200, 400), (Usage { input: 10, cached: 0, output: 3 }, false));
    }

    #[test]
    fn a_cut_stream_is_billed_for_its_text() {
        // No usage seen, 9 bytes of text streamed: 3 output tokens, input estimated from 400 bytes.
        assert_eq!(billed_usage(scan(None, None, 9), 200, 400), (Usage { input: 100, cached: 0, output: 3 }, true));
        // Messages: input known from message_start, output only from text.
        assert_eq!(billed_usage(scan(Some(20), None, 1), 200, 400), (Usage { input: 20, cached: 0, output: 1 }, true));
    }

    #[test]
    fn nothing_produced_is_free() {
        assert_eq!(billed_usage(None, 502, 400), (Usage::default(), false));
        assert_eq!(billed_usage(scan(None, None, 0), 429, 400), (Usage::default(), false));
        assert_eq!(billed_usage(scan(None, None, 0), 200, 400), (Usage::default(), false));
    }

    #[test]
    fn hold_is_larger_than_the_fallback() {
        assert!(hold_input_tokens(1000) > fallback_input_tokens(1000));
        assert_eq!(hold_input_tokens(0), 0);
    }
}
