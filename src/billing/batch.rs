//! What batch work costs: each line at the batch prices (`batch_input`, `batch_output`; half of
//! `input` and `output` when not given), settled from the line's own usage; and the worst case a
//! whole input file can cost, charged when the batch is accepted (every line's input at one
//! token per three bytes and what it references — images, files, a stored conversation — as
//! the same body sent alone is held, its named output maximum or the model's allowance).

use super::prices::{saturate, times, PriceBook};
use crate::base::usage::Usage;
use crate::protocol::batch::BatchLine;

/// A line's cost from its usage, at `model`'s batch prices (cache reads at the batch input price).
pub fn line_cost(book: &PriceBook, model: &str, usage: &Usage) -> i64 {
    let Some(media) = book.media(model) else { return 0 };
    saturate(times(usage.input_total(), media.batch_input).saturating_add(times(usage.output, media.batch_output)))
}

/// The most an input file's lines can cost together; `allowance` gives a model's output
/// allowance for a line that names no maximum. None when a line's model has no price.
pub fn worst_case(book: &PriceBook, lines: &[BatchLine], allowance: impl Fn(&str) -> u64) -> Option<i64> {
    let mut total: i128 = 0;
    for line in lines {
        let media = book.media(&line.model)?;
        let input = super::hold_input_tokens(line.body_bytes).saturating_add(line.extra_input);
        let output = if line.url == "/v1/embeddings" { 0 } else { line.max_output.unwrap_or_else(|| allowance(&line.model)) };
        total = total.saturating_add(times(input, media.batch_input)).saturating_add(times(output, media.batch_output));
    }
    Some(saturate(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Price;
    use std::collections::BTreeMap;

    fn book() -> PriceBook {
        let mut p = BTreeMap::new();
        p.insert("m".to_string(), Price { input: 2.0, output: 8.0, ..Price::default() });
        p.insert("own".to_string(), Price { input: 2.0, output: 8.0, batch_input: Some(0.5), batch_output: Some(3.0), ..Price::default() });
        PriceBook::new(&p)
    }

    fn line(model: &str, url: &'static str, body_bytes: usize, max_output: Option<u64>) -> BatchLine {
        BatchLine { custom_id: "x".into(), url, model: model.into(), body_bytes, max_output, extra_input: 0 }
    }

    #[test]
    fn batch_work_costs_half_unless_priced_and_the_worst_case_covers_every_line() {
        let b = book();
        let u = Usage { input: 1000, cached: 0, cache_write: 0, output: 100 };
        // Half of $2 and $8 per 1M tokens.
        assert_eq!(line_cost(&b, "m", &u), 1_000_000 + 400_000);
        assert_eq!(line_cost(&b, "own", &u), 500_000 + 300_000);
        let lines = [
            line("m", "/v1/chat/completions", 3000, Some(500)),
            line("m", "/v1/chat/completions", 30, None),
            line("m", "/v1/embeddings", 300, None),
        ];
        // 1000 + 10 + 100 input tokens at $1, 500 + 4096 output at $4 (per 1M).
        assert_eq!(worst_case(&b, &lines, |_| 4096), Some(1_110_000 + 18_384_000));
        assert_eq!(worst_case(&b, &[line("unpriced", "/v1/embeddings", 3, None)], |_| 1), None);
        // Ten images referenced at 2,000 tokens each: held as the same body alone would be.
        let mut images = line("m", "/v1/chat/completions", 30, Some(0));
        images.extra_input = 20_000;
        assert_eq!(worst_case(&b, &[images], |_| 0), Some(times(10 + 20_000, 1_000_000_000) as i64));
    }
}
