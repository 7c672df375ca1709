//! What a realtime turn costs: text, audio and cached input and text and audio output, each at
//! its own price (`input`, `audio_input`, `cached_input`, `output`, `audio_output`), and the
//! hold one turn is taken against before it starts.

use super::prices::{saturate, times, PriceBook};
use crate::base::usage::Usage;
use crate::protocol::realtime::TurnUsage;

/// The cost of a turn's reported usage, in nano-USD. Zero for an unpriced model (never served:
/// configuration refuses it).
pub fn turn_cost(book: &PriceBook, model: &str, u: &TurnUsage) -> i64 {
    let (tokens, media) = (book.price(model).unwrap_or_default(), book.media(model).cloned().unwrap_or_default());
    saturate(
        times(u.text_in, tokens.input)
            .saturating_add(times(u.audio_in, media.audio_input))
            .saturating_add(times(u.cached_in, tokens.cached_input))
            .saturating_add(times(u.text_out, tokens.output))
            .saturating_add(times(u.audio_out, media.audio_output)),
    )
}

/// The most a turn of `input` and `output` tokens can cost: each at the dearest price of its
/// side. None for an unpriced model.
pub fn turn_hold(book: &PriceBook, model: &str, input: u64, output: u64) -> Option<i64> {
    let (tokens, media) = (book.price(model)?, book.media(model)?);
    let dearest_in = tokens.dearest_input().max(media.audio_input);
    let dearest_out = tokens.output.max(media.audio_output);
    Some(saturate(times(input, dearest_in).saturating_add(times(output, dearest_out))))
}

/// A turn's usage as a usage record counts it (input without cache reads, cache reads, output).
pub fn record_usage(u: &TurnUsage) -> Usage {
    Usage { input: u.text_in.saturating_add(u.audio_in), cached: u.cached_in, cache_write: 0, output: u.output() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Price;
    use std::collections::BTreeMap;

    #[test]
    fn each_kind_of_token_has_its_own_price() {
        let mut p = BTreeMap::new();
        p.insert(
            "rt".to_string(),
            Price {
                input: 4.0,
                output: 16.0,
                cached_input: Some(0.4),
                audio_input: Some(32.0),
                audio_output: Some(64.0),
                ..Price::default()
            },
        );
        let book = PriceBook::new(&p);
        let u = TurnUsage { text_in: 1000, audio_in: 2000, cached_in: 500, text_out: 100, audio_out: 300 };
        assert_eq!(turn_cost(&book, "rt", &u), 4_000_000 + 64_000_000 + 200_000 + 1_600_000 + 19_200_000);
        assert_eq!(turn_hold(&book, "rt", 1000, 1000), Some(32_000_000 + 64_000_000));
        assert_eq!(record_usage(&u), Usage { input: 3000, cached: 500, cache_write: 0, output: 400 });
        assert_eq!(turn_hold(&book, "unpriced", 1, 1), None);
    }
}
