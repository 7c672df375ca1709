//! Prices: what a token of each kind costs each model, and what the media endpoints' own units
//! cost (per image, per character, per second), in nano-USD, with the rounding every cost uses.

use crate::base::usage::Usage;
use crate::config::Price;
use std::collections::{BTreeMap, HashMap};

/// nano-USD per one million tokens, and the model's output limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TokenPrice {
    pub input: i64,
    pub cached_input: i64,
    pub cache_write_input: i64,
    pub output: i64,
    pub max_output_tokens: Option<u64>,
    /// Output tokens held and asked for when a request names no maximum.
    pub default_output_tokens: Option<u64>,
    /// The most input tokens one call may have.
    pub context_window: Option<u64>,
    /// What an answer from the response cache costs.
    pub hit: HitPrice,
}

/// What an answer from the response cache costs (`cache_hit`, `cache_hit_ratio`): nothing by
/// default.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum HitPrice {
    #[default]
    Free,
    /// nano-USD per one million tokens of the original usage.
    PerMillion(i64),
    /// Parts per million of the original cost.
    Ratio(i64),
}

impl TokenPrice {
    /// The highest price an input token can have (plain, cache read or cache write): what the
    /// hold charges for the input it estimates.
    pub fn dearest_input(&self) -> i64 {
        self.input.max(self.cached_input).max(self.cache_write_input)
    }
}

/// Token prices by model.
#[derive(Debug, Default)]
pub struct PriceBook {
    tokens: HashMap<String, TokenPrice, ahash::RandomState>,
    /// The media endpoints' prices (see `billing::media`).
    media: HashMap<String, MediaPrice, ahash::RandomState>,
}

pub(crate) fn per_million(usd: f64) -> i64 {
    crate::base::money::usd_to_nanos(usd)
}

pub(crate) fn times(tokens: u64, nanos_per_million: i64) -> i128 {
    let v = i128::from(tokens).saturating_mul(i128::from(nanos_per_million));
    // Round half up to the nano-dollar.
    v.saturating_add(500_000) / 1_000_000
}

/// A sum of terms in nano-USD, saturated to the `i64` range.
pub(crate) fn saturate(v: i128) -> i64 {
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

impl PriceBook {
    pub fn new(prices: &BTreeMap<String, Price>) -> Self {
        let tokens = prices
            .iter()
            .map(|(model, p)| {
                let input = per_million(p.input);
                let cached_input = p.cached_input.map_or(input, per_million);
                let cache_write_input = p.cache_write_input.map_or(input, per_million);
                let price = TokenPrice {
                    input,
                    cached_input,
                    cache_write_input,
                    output: per_million(p.output),
                    max_output_tokens: p.max_output_tokens,
                    default_output_tokens: p.default_output_tokens,
                    context_window: p.context_window,
                    hit: match (p.cache_hit, p.cache_hit_ratio) {
                        (Some(usd), _) => HitPrice::PerMillion(per_million(usd)),
                        (None, Some(r)) => HitPrice::Ratio((r * 1e6).round() as i64),
                        (None, None) => HitPrice::Free,
                    },
                };
                (model.clone(), price)
            })
            .collect();
        let media = prices.iter().map(|(model, p)| (model.clone(), MediaPrice::new(p))).collect();
        PriceBook { tokens, media }
    }

    /// The model's prices in the media endpoints' units.
    pub fn media(&self, model: &str) -> Option<&MediaPrice> {
        self.media.get(model)
    }

    /// The model's prices. Configuration validation makes every served model priced; a model
    /// missing here is refused by [`PriceBook::hold_cost`].
    pub fn price(&self, model: &str) -> Option<TokenPrice> {
        self.tokens.get(model).copied()
    }

    /// Cost of `usage` on `model` in nano-USD (saturating). Zero for an unpriced model.
    pub fn cost(&self, model: &str, usage: Usage) -> i64 {
        let p = self.price(model).unwrap_or_default();
        saturate(
            times(usage.input, p.input)
                .saturating_add(times(usage.cached, p.cached_input))
                .saturating_add(times(usage.cache_write, p.cache_write_input))
                .saturating_add(times(usage.output, p.output)),
        )
    }

    /// What an answer of `model` with the original `usage` costs from the response cache, and
    /// what the original cost (both nano-USD at the price table).
    pub fn hit_cost(&self, model: &str, usage: Usage) -> (i64, i64) {
        let list = self.cost(model, usage);
        let hit = match self.price(model).map(|p| p.hit).unwrap_or_default() {
            HitPrice::Free => 0,
            HitPrice::PerMillion(p) => saturate(times(usage.input_total().saturating_add(usage.output), p)),
            HitPrice::Ratio(ppm) => saturate((i128::from(list) * i128::from(ppm) + 500_000) / 1_000_000),
        };
        (hit, list)
    }

    /// The most a request can cost: `input_tokens` at the dearest input price plus
    /// `output_tokens` (all choices together) at the output price. None for an unpriced model.
    pub fn hold_cost(&self, model: &str, input_tokens: u64, output_tokens: u64) -> Option<i64> {
        let p = self.price(model)?;
        Some(saturate(times(input_tokens, p.dearest_input()).saturating_add(times(output_tokens, p.output))))
    }

    /// The most output tokens (all choices together) that `budget` nano-USD covers beside
    /// `input_tokens` held at the dearest input price: the largest `n` with
    /// `hold_cost(model, input_tokens, n) <= budget`. None for an unpriced model or free output
    /// (the output does not change the hold).
    pub fn output_within(&self, model: &str, input_tokens: u64, budget: i64) -> Option<u64> {
        let p = self.price(model)?;
        if p.output <= 0 {
            return None;
        }
        let left = i128::from(budget) - times(input_tokens, p.dearest_input());
        if left < 0 {
            return Some(0);
        }
        // `times` rounds half up: n tokens cost at most `left` while n·price + 500_000 < (left + 1)·10⁶.
        let n = ((left + 1) * 1_000_000 - 500_000 - 1) / i128::from(p.output);
        Some(u64::try_from(n.max(0)).unwrap_or(u64::MAX).min(crate::base::usage::MAX_OUTPUT_ALLOWANCE))
    }
}

/// A model's prices in the media endpoints' units, in nano-USD.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MediaPrice {
    /// Per 1M tokens.
    pub image_input: i64,
    pub image_output: i64,
    pub audio_input: i64,
    pub audio_output: i64,
    /// Batch work, per 1M tokens.
    pub batch_input: i64,
    pub batch_output: i64,
    /// Per image: quality, size (`"*"` for any), price.
    pub per_image: Vec<(String, String, i64)>,
    /// Per 1M characters of speech input.
    pub characters: Option<i64>,
    /// Per second of transcribed audio.
    pub per_second: Option<i64>,
}

impl MediaPrice {
    pub fn new(p: &Price) -> MediaPrice {
        let nanos = crate::base::money::usd_to_nanos;
        let per_image = p
            .per_image
            .iter()
            .flatten()
            .flat_map(|(quality, sizes)| sizes.iter().map(move |(size, usd)| (quality.clone(), size.clone(), nanos(*usd))))
            .collect();
        MediaPrice {
            image_input: nanos(p.image_input.unwrap_or(p.input)),
            image_output: nanos(p.image_output.unwrap_or(p.output)),
            audio_input: nanos(p.audio_input.unwrap_or(p.input)),
            audio_output: nanos(p.audio_output.unwrap_or(p.output)),
            batch_input: nanos(p.batch_input.unwrap_or(p.input / 2.0)),
            batch_output: nanos(p.batch_output.unwrap_or(p.output / 2.0)),
            per_image,
            characters: p.characters.map(nanos),
            per_second: p.per_second.map(nanos),
        }
    }

    /// The price of an image of `quality` and `size`, and whether it is exact. Where the request
    /// names a side (a quality, a size; `auto` names none), an entry for that very value beats
    /// `"*"`; where it leaves a side open, every entry of that side can apply and the dearest is
    /// taken — exact only when every entry that can apply costs the same. None: no entry matches.
    pub fn image_price(&self, quality: Option<&str>, size: Option<&str>) -> Option<(i64, bool)> {
        let (quality, size) = (quality.filter(|w| *w != "auto"), size.filter(|w| *w != "auto"));
        let fits = |want: Option<&str>, have: &str| have == "*" || want.is_none_or(|w| w == have);
        let matching: Vec<&(String, String, i64)> = self.per_image.iter().filter(|(q, s, _)| fits(quality, q) && fits(size, s)).collect();
        // One side of `other` is at least as specific as `mine`'s: the same, or the very value
        // asked where `mine` has "*".
        let at_least = |want: Option<&str>, mine: &str, other: &str| mine == other || (want.is_some() && mine == "*" && other != "*");
        let shadowed = |(q, s, _): &(String, String, i64)| {
            matching.iter().any(|(q2, s2, _)| (q2 != q || s2 != s) && at_least(quality, q, q2) && at_least(size, s, s2))
        };
        let mut prices = matching.iter().filter(|e| !shadowed(e)).map(|(_, _, p)| *p);
        let first = prices.next()?;
        let (mut dearest, mut single) = (first, true);
        for p in prices {
            single &= p == first;
            dearest = dearest.max(p);
        }
        Some((dearest, single))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_costs_its_price_per_token_of_the_original_a_fraction_of_it_or_nothing() {
        let price = |hit: Option<f64>, ratio: Option<f64>| Price {
            input: 2.0,
            output: 8.0,
            cache_hit: hit,
            cache_hit_ratio: ratio,
            ..Price::default()
        };
        let p: BTreeMap<String, Price> = [("free", price(None, None)), ("per", price(Some(0.25), None)), ("tenth", price(None, Some(0.1)))]
            .map(|(m, p)| (m.to_string(), p))
            .into();
        let book = PriceBook::new(&p);
        let usage = Usage { input: 1000, cached: 200, cache_write: 0, output: 300 };
        let list = 1000 * 2000 + 200 * 2000 + 300 * 8000;
        assert_eq!(book.hit_cost("free", usage), (0, list));
        assert_eq!(book.hit_cost("per", usage), (1500 * 250, list), "1,500 tokens at $0.25 per 1M");
        assert_eq!(book.hit_cost("tenth", usage), (list / 10, list));
        assert_eq!(book.hit_cost("unpriced", usage), (0, 0));
    }
}
