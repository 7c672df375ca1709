//! The OpenAI API's media endpoints on the wire: the request fields that decide what an images,
//! speech or transcription call may cost, and the readers of what their answers report —
//! `usage` in its image-token and audio shapes (`{type: tokens}` or `{type: duration,
//! seconds}`), a verbose transcription's `duration`, the images delivered, and their streamed
//! events (`image_generation.completed`, `speech.audio.done`, `transcript.text.done`). Pure.

use super::{u, ApiError, ErrorKind, Reading};
use serde::Deserialize;
use serde_json::Value;

/// What a media answer reported beyond its token totals.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct MediaSeen {
    /// Image tokens among the input and output tokens reported (images).
    pub image_input: Option<u64>,
    pub image_output: Option<u64>,
    /// Audio tokens among the input tokens reported (transcriptions).
    pub audio_input: Option<u64>,
    /// Images delivered (a `b64_json` or `url` entry, or a streamed `*.completed` event).
    pub images: u64,
    /// Seconds of audio the answer reports (`usage` of type `duration`, or `duration`).
    pub seconds: Option<f64>,
}

/// The request fields of an images or speech call that its price depends on, read from a JSON
/// body (small: bounded by `max_body_bytes`) or from a multipart body's fields.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
pub struct MediaFields {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub n: Option<u64>,
    #[serde(default)]
    pub quality: Option<String>,
    #[serde(default)]
    pub size: Option<String>,
    /// Speech: the text to speak.
    #[serde(default)]
    pub input: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
}

/// The most images one request may ask for (the API's own bound).
pub const MAX_IMAGES: u64 = 10;

/// The longest text one speech request may carry (the API's own bound, in characters).
pub const MAX_SPEECH_CHARACTERS: usize = 4096;

impl MediaFields {
    /// Read from a JSON body; a body that is not a JSON object of these fields' types is a 400.
    pub fn from_json(body: &[u8]) -> Result<MediaFields, ApiError> {
        #[derive(Deserialize)]
        struct Typed {
            #[serde(flatten)]
            fields: MediaFields,
            #[serde(flatten)]
            _rest: serde::de::IgnoredAny,
        }
        serde_json::from_slice::<Typed>(body)
            .map(|t| t.fields)
            .map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("The request body is not valid: {e}.")))
    }

    /// Set a field from a multipart form field (unknown names are the upstream's).
    pub fn set_form_field(&mut self, name: &str, value: &str) -> Result<(), ApiError> {
        let number = |what: &str| {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| ApiError::new(ErrorKind::BadRequest, format!("'{what}' must be a whole number.")).with_param(what))
        };
        match name {
            "model" => self.model = Some(value.to_string()),
            "n" => self.n = Some(number("n")?),
            "quality" => self.quality = Some(value.to_string()),
            "size" => self.size = Some(value.to_string()),
            "stream" => self.stream = Some(value.trim().eq_ignore_ascii_case("true")),
            _ => {}
        }
        Ok(())
    }

    /// How many images are asked for: 1 to [`MAX_IMAGES`].
    pub fn images(&self) -> Result<u64, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n @ 1..=MAX_IMAGES) => Ok(n),
            Some(_) => Err(ApiError::new(ErrorKind::BadRequest, format!("'n' must be 1 to {MAX_IMAGES}.")).with_param("n")),
        }
    }

    /// The characters of a speech request's text (required, at most [`MAX_SPEECH_CHARACTERS`]).
    pub fn speech_characters(&self) -> Result<u64, ApiError> {
        let input = self
            .input
            .as_deref()
            .ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The 'input' field is required.").with_param("input"))?;
        let n = input.chars().count();
        if n > MAX_SPEECH_CHARACTERS {
            return Err(ApiError::new(
                ErrorKind::BadRequest,
                format!("'input' is {n} characters; at most {MAX_SPEECH_CHARACTERS} are accepted."),
            )
            .with_param("input"));
        }
        Ok(n as u64)
    }
}

/// Read one images event or answer: a streamed `*.completed` event is one image, with its usage
/// added; an answer's (or its wrapped) `usage` is taken as it is.
pub fn read_images_event(v: &Value, r: &mut Reading) {
    let streamed = v.get("type").and_then(Value::as_str);
    if let Some(kind) = streamed {
        if kind.ends_with(".completed") {
            r.media.images += 1;
        } else if kind.ends_with(".partial_image") {
            return;
        }
    }
    let Some(usage) = v.get("usage").filter(|u| u.is_object()) else { return };
    let input = u(usage, "/input_tokens").unwrap_or(0);
    let output = u(usage, "/output_tokens").unwrap_or(0);
    let image_input = u(usage, "/input_tokens_details/image_tokens").unwrap_or(0).min(input);
    // Without a breakdown, an images answer's output is all image.
    let image_output = u(usage, "/output_tokens_details/image_tokens").unwrap_or(output).min(output);
    let add = |have: Option<u64>, more: u64| Some(if streamed.is_some() { have.unwrap_or(0).saturating_add(more) } else { more });
    r.seen.input = add(r.seen.input, input);
    r.seen.output = add(r.seen.output, output);
    r.seen.cached = Some(0);
    r.media.image_input = add(r.media.image_input, image_input);
    r.media.image_output = add(r.media.image_output, image_output);
}

/// Read one speech event (`stream_format: sse`): `speech.audio.done` carries the usage.
pub fn read_speech_event(v: &Value, r: &mut Reading) {
    if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
        r.seen.input = Some(u(usage, "/input_tokens").unwrap_or(0));
        r.seen.output = Some(u(usage, "/output_tokens").unwrap_or(0));
        r.seen.cached = Some(0);
    }
}

/// Read one transcription event or answer: `usage` of type `tokens` (audio tokens split out) or
/// `duration`, a verbose answer's `duration`, and streamed text deltas for an estimate.
pub fn read_transcription_event(v: &Value, r: &mut Reading) {
    r.text(v.get("delta"));
    if let Some(seconds) = v.get("duration").and_then(Value::as_f64).filter(|s| s.is_finite() && *s >= 0.0) {
        r.media.seconds = Some(seconds);
    }
    let Some(usage) = v.get("usage").filter(|u| u.is_object()) else { return };
    match usage.get("type").and_then(Value::as_str) {
        Some("duration") => {
            if let Some(seconds) = usage.get("seconds").and_then(Value::as_f64).filter(|s| s.is_finite() && *s >= 0.0) {
                r.media.seconds = Some(seconds);
            }
        }
        _ => {
            let input = u(usage, "/input_tokens").unwrap_or(0);
            r.seen.input = Some(input);
            r.seen.output = Some(u(usage, "/output_tokens").unwrap_or(0));
            r.seen.cached = Some(0);
            r.media.audio_input = Some(u(usage, "/input_token_details/audio_tokens").unwrap_or(input).min(input));
        }
    }
}

/// Counts the images in a whole images answer as it passes, chunk by chunk: each `"b64_json":`
/// or `"url":` member is one (a member name cannot occur inside a string: its quotes would be
/// escaped there). A name cut between two chunks is found in the few bytes kept.
#[derive(Debug, Default)]
pub struct ImageCounter {
    carry: Vec<u8>,
    pub images: u64,
}

const IMAGE_MEMBERS: [&[u8]; 2] = [b"\"b64_json\":", b"\"url\":"];

impl ImageCounter {
    pub fn feed(&mut self, chunk: &[u8]) {
        const KEEP: usize = 10;
        let carried = self.carry.len();
        let mut joined;
        let text: &[u8] = if carried == 0 {
            chunk
        } else {
            joined = std::mem::take(&mut self.carry);
            joined.extend_from_slice(chunk);
            &joined
        };
        // A name that ends in the kept bytes was counted with the chunk before.
        for name in IMAGE_MEMBERS {
            self.images += memchr::memmem::find_iter(text, name).filter(|at| at + name.len() > carried).count() as u64;
        }
        // The last bytes may start a name the next chunk ends.
        let keep = text.len().min(KEEP);
        self.carry = text[text.len() - keep..].to_vec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn images_usage_splits_image_tokens_and_counts_streamed_images() {
        let mut r = Reading::default();
        let body =
            json!({"usage": {"input_tokens": 50, "input_tokens_details": {"image_tokens": 40, "text_tokens": 10}, "output_tokens": 4160}});
        read_images_event(&body, &mut r);
        assert_eq!((r.seen.input, r.seen.output, r.media.image_input, r.media.image_output), (Some(50), Some(4160), Some(40), Some(4160)));
        let mut s = Reading::default();
        read_images_event(&json!({"type": "image_generation.partial_image", "b64_json": "AAAA"}), &mut s);
        for _ in 0..2 {
            read_images_event(&json!({"type": "image_generation.completed", "usage": {"input_tokens": 5, "output_tokens": 100}}), &mut s);
        }
        assert_eq!((s.media.images, s.seen.input, s.seen.output, s.media.image_input), (2, Some(10), Some(200), Some(0)));
    }

    #[test]
    fn transcription_usage_in_tokens_or_seconds() {
        let mut r = Reading::default();
        read_transcription_event(
            &json!({"text": "hi", "usage": {"type": "tokens", "input_tokens": 14, "input_token_details": {"audio_tokens": 12}, "output_tokens": 45}}),
            &mut r,
        );
        assert_eq!((r.seen.input, r.seen.output, r.media.audio_input, r.media.seconds), (Some(14), Some(45), Some(12), None));
        let mut d = Reading::default();
        read_transcription_event(&json!({"text": "hi", "usage": {"type": "duration", "seconds": 9}}), &mut d);
        assert_eq!((d.seen.output, d.media.seconds), (None, Some(9.0)));
        let mut v = Reading::default();
        read_transcription_event(&json!({"text": "hi", "duration": 8.5}), &mut v);
        assert_eq!(v.media.seconds, Some(8.5));
    }

    #[test]
    fn images_are_counted_across_chunk_cuts() {
        let body = br#"{"data":[{"b64_json":"QUJD"},{"url":"https://x/y.png","revised_prompt":"say \"url\": no"}],"usage":{}}"#;
        for cut in 0..body.len() {
            let mut c = ImageCounter::default();
            c.feed(&body[..cut]);
            c.feed(&body[cut..]);
            assert_eq!(c.images, 2, "cut at {cut}");
        }
    }

    #[test]
    fn request_fields_are_bounded() {
        let f = MediaFields::from_json(br#"{"model":"m","n":3,"size":"1024x1024","extra":{"a":1}}"#).unwrap();
        assert_eq!((f.images().unwrap(), f.size.as_deref()), (3, Some("1024x1024")));
        assert_eq!(MediaFields { n: Some(11), ..Default::default() }.images().unwrap_err().param.as_deref(), Some("n"));
        assert!(MediaFields::from_json(b"[1]").is_err());
        let long = MediaFields { input: Some("é".repeat(4097)), ..Default::default() };
        assert_eq!(long.speech_characters().unwrap_err().param.as_deref(), Some("input"));
        assert_eq!(MediaFields { input: Some("héllo".into()), ..Default::default() }.speech_characters().unwrap(), 5);
        let mut form = MediaFields::default();
        assert!(form.set_form_field("n", "x").is_err());
        form.set_form_field("n", "2").unwrap();
        assert_eq!(form.n, Some(2));
    }
}
