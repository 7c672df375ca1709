//! What the media endpoints cost, in their own units: images (image tokens at their own
//! prices, or a price per image by quality and size), speech (per input character, or per
//! token) and transcriptions (per second of audio, or per token) — the hold before the call and
//! the bill after it. Reported usage wins; a price in the entry's own unit comes next; an answer
//! that shows neither is billed its hold (fail closed). A failed answer costs nothing.

use super::meter::ScanResult;
use super::prices::{saturate, times, PriceBook};
use crate::base::usage::Usage;
use crate::protocol::{ApiError, ErrorKind};

/// The least bytes a second of uploaded audio can take, for an upload whose container tells no
/// duration (its duration is read from it otherwise, see `protocol::audio`): 64 bytes a second
/// is under Opus's least rate (500 bit/s), the lowest of the codecs the audio endpoints take,
/// so no real file plays longer than its size allows at this rate.
pub const AUDIO_MIN_BYTES_PER_SECOND: u64 = 64;

/// The most audio tokens a second of audio is counted as: a transcription billed per token is
/// held for its seconds' bound times this.
pub const AUDIO_TOKENS_PER_SECOND: u64 = 25;

/// A media call, as its price depends on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaCall {
    /// `n` images of `quality` and `size` (as asked: `auto` or absent when not named), from
    /// `files` uploaded images (edits and variations).
    Images { n: u64, quality: Option<String>, size: Option<String>, files: u64 },
    /// Speech of `characters` input characters.
    Speech { characters: u64 },
    /// A transcription or translation of an upload of `upload_bytes`, which plays `played_ms`
    /// milliseconds when its container says so.
    Transcription { upload_bytes: u64, played_ms: Option<u64> },
}

fn no_price(model: &str) -> ApiError {
    log::error!("model {model} is served without a price; refused");
    ApiError::new(ErrorKind::Internal, format!("The model '{model}' is not priced on this gateway and cannot be served."))
}

impl MediaCall {
    /// The input tokens held (and billed when the answer reports none): the body's text at
    /// one token per three bytes and each uploaded image at `image_tokens`; a transcription's
    /// audio at its seconds' bound (see [`AUDIO_MIN_BYTES_PER_SECOND`]) times
    /// [`AUDIO_TOKENS_PER_SECOND`].
    pub fn input_tokens(&self, text_bytes: usize, image_tokens: u64) -> u64 {
        match self {
            MediaCall::Images { files, .. } => super::hold_input_tokens(text_bytes).saturating_add(files.saturating_mul(image_tokens)),
            MediaCall::Speech { .. } => super::hold_input_tokens(text_bytes),
            MediaCall::Transcription { upload_bytes, played_ms } => {
                seconds_bound(*upload_bytes, *played_ms).saturating_mul(AUDIO_TOKENS_PER_SECOND)
            }
        }
    }

    /// The most the call can cost, in nano-USD: `input` tokens at the dearest input price and
    /// `output` tokens (all images together) at the dearest output price, or, where the entry
    /// prices the call's own unit, that — whichever is more. An image quality and size the
    /// entry has no price for is refused (400).
    pub fn hold(&self, book: &PriceBook, model: &str, input: u64, output: u64) -> Result<i64, ApiError> {
        let (tokens, media) = (book.price(model).ok_or_else(|| no_price(model))?, book.media(model).ok_or_else(|| no_price(model))?);
        let dearest_input = tokens.dearest_input().max(media.image_input).max(media.audio_input);
        let by_tokens = times(input, dearest_input).saturating_add(times(output, tokens.output.max(media.image_output)));
        let by_unit = match self {
            MediaCall::Images { n, quality, size, .. } if !media.per_image.is_empty() => {
                let (price, _) = media.image_price(quality.as_deref(), size.as_deref()).ok_or_else(|| {
                    ApiError::new(
                        ErrorKind::BadRequest,
                        format!(
                            "The model '{model}' has no price on this gateway for images of quality '{}' and size '{}'.",
                            quality.as_deref().unwrap_or("auto"),
                            size.as_deref().unwrap_or("auto")
                        ),
                    )
                    .with_param("size")
                })?;
                i128::from(price).saturating_mul(i128::from(*n))
            }
            MediaCall::Speech { characters } => media.characters.map_or(0, |p| times(*characters, p)),
            MediaCall::Transcription { upload_bytes, played_ms } => {
                media.per_second.map_or(0, |p| i128::from(p).saturating_mul(i128::from(seconds_bound(*upload_bytes, *played_ms))))
            }
            MediaCall::Images { .. } => 0,
        };
        Ok(saturate(by_tokens.max(by_unit)))
    }

    /// What the call is billed once its answer ended: the usage recorded, its cost, and whether
    /// it is estimated. `hold` is what was held (billed when the answer shows nothing to bill by).
    pub fn bill(&self, book: &PriceBook, model: &str, scan: Option<ScanResult>, status: u16, hold: i64) -> (Usage, i64, bool) {
        let Some(scan) = scan.filter(|_| (200..300).contains(&status)) else { return (Usage::default(), 0, false) };
        let (tokens, media) = (book.price(model).unwrap_or_default(), book.media(model).cloned().unwrap_or_default());
        let seen = Usage { input: scan.input.unwrap_or(0), output: scan.output.unwrap_or(0), ..Usage::default() };
        let reported = scan.output.is_some();
        let by_tokens = |special_input: Option<u64>, special_price: i64, special_output: Option<u64>| {
            let special_input = special_input.unwrap_or(0).min(seen.input);
            let special_output = special_output.unwrap_or(0).min(seen.output);
            saturate(
                times(seen.input - special_input, tokens.input)
                    .saturating_add(times(special_input, special_price))
                    .saturating_add(times(seen.output - special_output, tokens.output))
                    .saturating_add(times(special_output, media.image_output)),
            )
        };
        let held = (seen, hold, true);
        match self {
            MediaCall::Images { .. } if reported => {
                (seen, by_tokens(scan.media.image_input, media.image_input, scan.media.image_output), false)
            }
            MediaCall::Images { n, quality, size, .. } => {
                let Some((price, single)) = media.image_price(quality.as_deref(), size.as_deref()) else { return held };
                let counted = scan.media.images > 0;
                let images = if counted { scan.media.images } else { *n };
                (seen, saturate(i128::from(price).saturating_mul(i128::from(images))), !(counted && single))
            }
            MediaCall::Speech { characters } => match media.characters {
                Some(p) => (seen, saturate(times(*characters, p)), false),
                None if reported => (seen, by_tokens(None, 0, None), false),
                None => held,
            },
            MediaCall::Transcription { .. } if reported => (seen, by_tokens(scan.media.audio_input, media.audio_input, None), false),
            // No usage in the answer (`text`, `srt`, `vtt`): the seconds it reports, else the
            // seconds its container says it plays.
            MediaCall::Transcription { played_ms, .. } => match (scan.media.seconds, *played_ms, media.per_second) {
                (Some(seconds), _, Some(p)) => (seen, saturate((seconds * p as f64).ceil() as i128), false),
                (None, Some(ms), Some(p)) => (seen, saturate((i128::from(ms) * i128::from(p) + 999) / 1000), false),
                _ => held,
            },
        }
    }
}

/// The most seconds an upload can play: what its container says (rounded up), else what its
/// `bytes` can hold at the least rate (see [`AUDIO_MIN_BYTES_PER_SECOND`]).
fn seconds_bound(bytes: u64, played_ms: Option<u64>) -> u64 {
    match played_ms {
        Some(ms) => ms.div_ceil(1000).max(1),
        None => bytes.div_ceil(AUDIO_MIN_BYTES_PER_SECOND).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Price;
    use crate::protocol::media::MediaSeen;
    use std::collections::BTreeMap;

    fn book() -> PriceBook {
        let mut p = BTreeMap::new();
        p.insert(
            "img".to_string(),
            Price { input: 5.0, output: 10.0, image_input: Some(10.0), image_output: Some(40.0), ..Price::default() },
        );
        let mut sizes = BTreeMap::new();
        sizes.insert("1024x1024".to_string(), 0.04);
        sizes.insert("1792x1024".to_string(), 0.08);
        let mut per_image = BTreeMap::new();
        per_image.insert("standard".to_string(), sizes);
        per_image.insert("hd".to_string(), BTreeMap::from([("*".to_string(), 0.12)]));
        p.insert("dalle".to_string(), Price { per_image: Some(per_image), ..Price::default() });
        p.insert("tts".to_string(), Price { characters: Some(15.0), ..Price::default() });
        p.insert("tts-tokens".to_string(), Price { input: 0.6, output: 12.0, ..Price::default() });
        p.insert("whisper".to_string(), Price { per_second: Some(0.0001), ..Price::default() });
        p.insert("transcribe".to_string(), Price { input: 2.5, output: 10.0, audio_input: Some(6.0), ..Price::default() });
        PriceBook::new(&p)
    }

    fn scan(input: Option<u64>, output: Option<u64>, media: MediaSeen) -> Option<ScanResult> {
        Some(ScanResult { input, cached: None, cache_write: None, output, text_bytes: 0, body_bytes: 100, media })
    }

    fn images(n: u64, quality: Option<&str>, size: Option<&str>) -> MediaCall {
        MediaCall::Images { n, quality: quality.map(str::to_string), size: size.map(str::to_string), files: 0 }
    }

    #[test]
    fn image_tokens_are_billed_at_their_own_prices() {
        let b = book();
        let seen = MediaSeen { image_input: Some(40), image_output: Some(4000), ..MediaSeen::default() };
        // 10 text in at $5, 40 image in at $10, 160 text out at $10, 4000 image out at $40 (per 1M).
        let (usage, cost, estimated) = images(1, None, None).bill(&b, "img", scan(Some(50), Some(4160), seen), 200, 9);
        assert_eq!((usage.input, usage.output, estimated), (50, 4160, false));
        assert_eq!(cost, 50_000 + 400_000 + 1_600_000 + 160_000_000);
        // A failed answer costs nothing.
        assert_eq!(images(1, None, None).bill(&b, "img", scan(Some(50), Some(4160), seen), 500, 9).1, 0);
    }

    #[test]
    fn an_entry_for_the_size_asked_beats_the_catch_all() {
        // The bundled alpha-dall-e-3 table: a size of its own beside "*".
        let mut p = BTreeMap::new();
        let per_image = BTreeMap::from([
            ("standard".to_string(), BTreeMap::from([("1024x1024".to_string(), 0.04), ("*".to_string(), 0.08)])),
            ("hd".to_string(), BTreeMap::from([("1024x1024".to_string(), 0.08), ("*".to_string(), 0.12)])),
        ]);
        p.insert("d3".to_string(), Price { per_image: Some(per_image), ..Price::default() });
        let b = PriceBook::new(&p);
        let one = MediaSeen { images: 1, ..MediaSeen::default() };
        let bill = |q: Option<&str>, s: Option<&str>| images(1, q, s).bill(&b, "d3", scan(None, None, one), 200, 0);
        assert_eq!(bill(Some("standard"), Some("1024x1024")), (Usage::default(), 40_000_000, false));
        assert_eq!(bill(Some("standard"), Some("1792x1024")), (Usage::default(), 80_000_000, false));
        assert_eq!(bill(Some("hd"), Some("1024x1024")), (Usage::default(), 80_000_000, false));
        // A side left open: the dearest it can be, estimated.
        assert_eq!(bill(None, Some("1024x1024")), (Usage::default(), 80_000_000, true));
        assert_eq!(bill(Some("standard"), Some("auto")), (Usage::default(), 80_000_000, true));
        assert_eq!(images(1, Some("standard"), Some("1024x1024")).hold(&b, "d3", 0, 0).unwrap(), 40_000_000);
    }

    #[test]
    fn images_without_usage_are_billed_per_image_by_quality_and_size() {
        let b = book();
        let two = MediaSeen { images: 2, ..MediaSeen::default() };
        assert_eq!(images(2, Some("standard"), Some("1792x1024")).bill(&b, "dalle", scan(None, None, two), 200, 0).1, 160_000_000);
        assert_eq!(
            images(2, Some("hd"), Some("1024x1024")).bill(&b, "dalle", scan(None, None, two), 200, 0),
            (Usage::default(), 240_000_000, false)
        );
        // Quality not named: the dearest matching price, marked estimated.
        assert_eq!(
            images(2, None, Some("1024x1024")).bill(&b, "dalle", scan(None, None, two), 200, 0),
            (Usage::default(), 240_000_000, true)
        );
        // The images could not be counted: the number asked for.
        assert_eq!(images(3, Some("hd"), None).bill(&b, "dalle", scan(None, None, MediaSeen::default()), 200, 0).1, 360_000_000);
        // Held for n images at the dearest price the request can cost.
        assert_eq!(images(3, None, None).hold(&b, "dalle", 10, 0).unwrap(), 360_000_000);
        assert_eq!(images(1, Some("standard"), Some("1024x1024")).hold(&b, "dalle", 0, 0).unwrap(), 40_000_000);
        let refused = images(1, Some("standard"), Some("256x256")).hold(&b, "dalle", 0, 0).unwrap_err();
        assert_eq!((refused.status(), refused.param.as_deref()), (400, Some("size")));
        // A token-priced model without usage: billed its hold.
        assert_eq!(images(1, None, None).bill(&b, "img", scan(None, None, two), 200, 777), (Usage::default(), 777, true));
        assert_eq!(images(2, None, None).hold(&b, "img", 100, 2 * 4096).unwrap(), 1_000_000 + 327_680_000);
    }

    #[test]
    fn speech_is_billed_per_character_or_per_token() {
        let b = book();
        let call = MediaCall::Speech { characters: 1000 };
        assert_eq!(call.hold(&b, "tts", 400, 0).unwrap(), 15_000_000);
        // Cut or whole, a spoken text is billed its characters.
        assert_eq!(call.bill(&b, "tts", scan(None, None, MediaSeen::default()), 200, 15_000_000), (Usage::default(), 15_000_000, false));
        let (usage, cost, estimated) = call.bill(&b, "tts-tokens", scan(Some(300), Some(2000), MediaSeen::default()), 200, 1);
        assert_eq!((usage.output, cost, estimated), (2000, 180_000 + 24_000_000, false));
        assert_eq!(call.bill(&b, "tts-tokens", scan(None, None, MediaSeen::default()), 200, 99).1, 99);
    }

    #[test]
    fn transcriptions_are_billed_per_second_or_per_token() {
        let b = book();
        let call = MediaCall::Transcription { upload_bytes: 20 << 20, played_ms: None };
        // 20 MiB whose container tells nothing, at no less than 64 bytes a second: 327,680 s at
        // $0.0001.
        assert_eq!(call.hold(&b, "whisper", 0, 0).unwrap(), 327_680 * 100_000);
        let secs = MediaSeen { seconds: Some(9.5), ..MediaSeen::default() };
        assert_eq!(call.bill(&b, "whisper", scan(None, None, secs), 200, 5).1, 950_000);
        assert_eq!(call.bill(&b, "whisper", scan(None, None, MediaSeen::default()), 200, 5), (Usage::default(), 5, true));
        let toks = MediaSeen { audio_input: Some(12), ..MediaSeen::default() };
        // 2 text tokens at $2.5, 12 audio at $6, 45 out at $10 (per 1M).
        assert_eq!(call.bill(&b, "transcribe", scan(Some(14), Some(45), toks), 200, 5).1, 5_000 + 72_000 + 450_000);
        assert_eq!(call.input_tokens(0, 0), 327_680 * AUDIO_TOKENS_PER_SECOND);
    }

    #[test]
    fn a_transcription_whose_container_tells_its_length_is_held_and_billed_for_it() {
        let b = book();
        // An hour of Opus at 377 bytes a second: the size alone would have held 1,358 s at the
        // old floor of 1,000 bytes a second; its container says 3,600.
        let call = MediaCall::Transcription { upload_bytes: 377 * 3600, played_ms: Some(3_600_000) };
        assert_eq!(call.hold(&b, "whisper", 0, 0).unwrap(), 3600 * 100_000);
        // A `text` answer reports nothing: billed the seconds it plays, not its hold.
        assert_eq!(call.bill(&b, "whisper", scan(None, None, MediaSeen::default()), 200, 1), (Usage::default(), 3600 * 100_000, false));
        let short = MediaCall::Transcription { upload_bytes: 12_042, played_ms: Some(20_100) };
        assert_eq!(short.bill(&b, "whisper", scan(None, None, MediaSeen::default()), 200, 1).1, 2_010_000);
        assert_eq!(short.input_tokens(0, 0), 21 * AUDIO_TOKENS_PER_SECOND);
    }
}
