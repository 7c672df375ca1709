//! Create-task validation and capability routing (the video API's request fields, its model and
//! capability matrix, capability routing and limits). Pure: a JSON body in, an upstream
//! [`Submission`] or a 400 naming the field and the rule out.

use crate::protocol::{ApiError, ErrorKind};
pub use crate::records::task::Capability;
use crate::records::task::Task;
use serde_json::{Map, Value};

/// Every API model the service knows (the video API's model and capability matrix), in the
/// spec's order (defined with the configuration, which validates `video.models` and
/// `video.prices` against it).
pub use crate::config::VIDEO_MODELS as MODELS;
pub const MAX_PROMPT_CHARS: usize = 2000;
pub const MAX_PAYLOAD_CHARS: usize = 1_048_576;
pub const ASPECT_RATIOS: [&str; 5] = ["16:9", "9:16", "4:3", "3:4", "1:1"];
pub const DEFAULT_DURATION: u32 = 5;

/// What is sent upstream for a valid request.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    pub capability: Capability,
    pub api_model: String,
    pub upstream_model: String,
    pub duration: u32,
    pub off_peak: bool,
    /// The upstream request body (PascalCase). Inline images appear as their placeholders.
    pub payload: Map<String, Value>,
    /// Base64 images to upload; each placeholder in the payload is replaced by its URL.
    pub uploads: Vec<InlineImage>,
}

impl Submission {
    /// The task this submission starts: stored before it is sent upstream.
    pub fn task(&self, id: String, owner: String, now: u64, cost_nanos: i64) -> Task {
        Task {
            api_model: self.api_model.clone(),
            upstream_model: self.upstream_model.clone(),
            duration: self.duration,
            off_peak: self.off_peak,
            ..Task::new(id, owner, self.capability, now, cost_nanos)
        }
    }
}

/// A decoded base64 input image.
#[derive(Debug, Clone, PartialEq)]
pub struct InlineImage {
    pub field: String,
    pub placeholder: String,
    pub bytes: Vec<u8>,
    pub content_type: &'static str,
    pub extension: &'static str,
}

/// Largest input image (the video API's input asset limits).
pub const MAX_IMAGE_BYTES: usize = 50 * 1024 * 1024;

/// Decode a data URI or raw base64 image and check it is png, jpeg or webp by its magic bytes.
pub fn decode_image(field: &str, v: &str) -> Result<(Vec<u8>, &'static str, &'static str), ApiError> {
    use base64::Engine;
    let data = match v.strip_prefix("data:") {
        Some(rest) => rest
            .split_once(";base64,")
            .map(|(_, d)| d)
            .ok_or_else(|| bad(field, "a data URI must be base64 (data:image/png;base64,...)"))?,
        None => v,
    };
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    if compact.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
        return Err(bad(field, "images may be at most 50 MB"));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(compact.as_bytes()))
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(compact.as_bytes()))
        .map_err(|_| bad(field, "is neither a public http(s) URL nor valid base64"))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(bad(field, "images may be at most 50 MB"));
    }
    let kind = if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        ("image/png", "png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        ("image/jpeg", "jpg")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        ("image/webp", "webp")
    } else {
        return Err(bad(field, "the base64 data is not a png, jpeg or webp image"));
    };
    Ok((bytes, kind.0, kind.1))
}

/// An input image as the payload carries it: a URL as is, or (with storage) a placeholder for
/// an upload.
fn image_input(field: &str, v: &str, allow_base64: bool, uploads: &mut Vec<InlineImage>) -> Result<String, ApiError> {
    let looks_like_url = {
        let lower = v.get(..8).unwrap_or(v).to_ascii_lowercase();
        lower.starts_with("https://") || lower.starts_with("http://")
    };
    if looks_like_url || !allow_base64 {
        check_media_url(field, v)?;
        return Ok(v.to_string());
    }
    let (bytes, content_type, extension) = decode_image(field, v)?;
    let placeholder = format!("tollgate-upload:{}", uploads.len());
    uploads.push(InlineImage { field: field.to_string(), placeholder: placeholder.clone(), bytes, content_type, extension });
    Ok(placeholder)
}

fn bad(field: &str, rule: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, format!("{field}: {}", rule.into())).with_param(field)
}

/// How the video API's model and capability matrix treats a model for a capability.
#[derive(Debug, PartialEq)]
enum Support {
    /// Supported, not recommended, or needs upstream support: forwarded as is.
    Forward,
    /// Submitted as `genq2` (reference-to-video with a genq2-series image model).
    AsGenq2,
    NotSupported(&'static str),
}

fn support(model: &str, cap: Capability) -> Support {
    use Capability::*;
    match (cap, model) {
        (TextToVideo, "genq2-pro" | "genq2-turbo" | "genq2-pro-fast") => {
            Support::NotSupported("supports only image-to-video; use genq2, genq3-pro or genq3-turbo for text-to-video")
        }
        (ImageToVideo, "genq2") => {
            Support::NotSupported("is a text and reference model; use genq3-pro, genq3-turbo, genq2-pro or genq2-turbo for image-to-video")
        }
        (ReferenceToVideo, "genq2-pro" | "genq2-turbo" | "genq2-pro-fast") => Support::AsGenq2,
        _ => Support::Forward,
    }
}

/// Allowed duration range (the video API's limits) for the model actually submitted.
fn duration_range(cap: Capability, upstream_model: &str, start_end: bool) -> (u32, u32) {
    if upstream_model.starts_with("genq3") {
        return (1, 16);
    }
    match cap {
        Capability::ImageToVideo if start_end => (1, 8),
        _ => (1, 10),
    }
}

/// `duration` as an integer or a numeric string.
fn parse_duration(v: Option<&Value>) -> Result<Option<u32>, ApiError> {
    let rule = "must be a whole number of seconds (integer or numeric string)";
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_u64().and_then(|d| u32::try_from(d).ok()).map(Some).ok_or_else(|| bad("duration", rule)),
        Some(Value::String(s)) => s.trim().parse::<u32>().map(Some).map_err(|_| bad("duration", rule)),
        Some(_) => Err(bad("duration", rule)),
    }
}

/// An input image must be a public URL; base64 needs object storage (not configured).
fn check_media_url(field: &str, v: &str) -> Result<(), ApiError> {
    let lower = v.get(..8).unwrap_or(v).to_ascii_lowercase();
    if (lower.starts_with("https://") || lower.starts_with("http://")) && !v.contains(char::is_whitespace) {
        return Ok(());
    }
    if v.starts_with("data:") || (v.len() > 64 && !v.contains("://")) {
        return Err(bad(field, "base64 images need object storage, which is not configured; send a public https URL"));
    }
    Err(bad(field, "must be a public http(s) URL"))
}

fn string_field<'a>(body: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad(field, "must be a string")),
    }
}

fn string_list(field: &str, v: &Value) -> Result<Vec<String>, ApiError> {
    let items = v.as_array().ok_or_else(|| bad(field, "must be an array of strings"))?;
    items.iter().map(|i| i.as_str().map(str::to_string).ok_or_else(|| bad(field, "must be an array of strings"))).collect()
}

/// `aspect_ratio` / `aspectRatio` / `AspectRatio` → `AspectRatio`.
pub fn pascal_case(key: &str) -> String {
    key.split('_')
        .filter(|p| !p.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_uppercase().chain(chars).collect::<String>(),
                None => String::new(),
            }
        })
        .collect()
}

/// The fields of a create-task body that validation reads, borrowed from the body: anything
/// else is skipped without being stored.
#[derive(Debug, Default, serde::Deserialize)]
struct BodyParts<'a> {
    #[serde(default, borrow)]
    model: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    prompt: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    duration: Option<&'a serde_json::value::RawValue>,
    /// The OpenAI SDK's name for `duration`.
    #[serde(default, borrow)]
    seconds: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    image: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    images: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    input_reference: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    metadata: Option<&'a serde_json::value::RawValue>,
}

/// Parse a create-task body: only the fields validation reads become `Value`s, each refused
/// past [`crate::protocol::MAX_PARSED_VALUES`] values, so memory stays proportional to the
/// body's bytes (a body of a million tiny values is refused, not expanded).
pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(bad("body", "must be a JSON object"));
    }
    let parts: BodyParts<'_> = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("The request body is not valid JSON: {e}")))?;
    let mut out = Map::new();
    if parts.duration.is_some() && parts.seconds.is_some() {
        return Err(bad("seconds", "give either duration or seconds, not both"));
    }
    let fields = [
        ("model", parts.model),
        ("prompt", parts.prompt),
        ("duration", parts.duration.or(parts.seconds)),
        ("image", parts.image),
        ("images", parts.images),
        ("input_reference", parts.input_reference),
        ("metadata", parts.metadata),
    ];
    for (name, raw) in fields {
        if let Some(raw) = raw {
            out.insert(name.to_string(), crate::protocol::parse_bounded(raw.get(), name)?);
        }
    }
    Ok(Value::Object(out))
}

/// A create-task form (`multipart/form-data`, as the OpenAI SDK's `videos.create` sends it) as
/// the JSON body it stands for: its text fields as strings (`metadata` as the JSON it holds),
/// and an uploaded `input_reference` (or `image`) as a base64 data URI, which object storage
/// then turns into a URL (the video API's input limits; refused with a clear error without
/// storage). Reads the files from their spool: call it off the async threads.
pub fn form_body(form: &crate::protocol::multipart::Form) -> Result<Vec<u8>, ApiError> {
    use base64::Engine;
    let mut out = Map::new();
    for (name, value) in &form.fields {
        let v = match name.as_str() {
            "metadata" => serde_json::from_str(value).map_err(|_| bad("metadata", "must be a JSON object"))?,
            _ => Value::String(value.clone()),
        };
        out.insert(name.clone(), v);
    }
    for file in &form.files {
        if !matches!(file.name.as_str(), "input_reference" | "image") {
            return Err(bad(&file.name, "is not a file field of this endpoint (input_reference takes an image)"));
        }
        if file.len > MAX_IMAGE_BYTES as u64 {
            return Err(bad(&file.name, "images may be at most 50 MB"));
        }
        let mut bytes = vec![0; file.len as usize];
        std::os::unix::fs::FileExt::read_exact_at(&*file.spool, &mut bytes, 0)
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("The upload could not be read back: {e}.")))?;
        let content_type = file.content_type.as_deref().unwrap_or("application/octet-stream");
        let uri = format!("data:{content_type};base64,{}", base64::engine::general_purpose::STANDARD.encode(&bytes));
        out.insert(file.name.clone(), Value::String(uri));
    }
    serde_json::to_vec(&Value::Object(out)).map_err(|e| ApiError::new(ErrorKind::Internal, format!("form: {e}")))
}

/// Validate a create-task body against the enabled models. `allow_base64`: object storage is
/// configured, so base64 images are decoded for upload instead of refused.
pub fn validate(body: &Value, enabled: &[String], allow_base64: bool) -> Result<Submission, ApiError> {
    let body = body.as_object().ok_or_else(|| bad("body", "must be a JSON object"))?;

    let model = string_field(body, "model")?.ok_or_else(|| bad("model", "is required"))?;
    if model.len() > crate::protocol::MAX_MODEL_BYTES {
        return Err(bad("model", format!("is longer than {} bytes", crate::protocol::MAX_MODEL_BYTES)));
    }
    if !MODELS.contains(&model) || !enabled.iter().any(|m| m == model) {
        return Err(bad("model", format!("unsupported model '{model}'; check the spelling and the model configuration")));
    }

    let (mut meta, force_reference) = metadata(body)?;
    check_metadata_types(&meta)?;

    // Capability routing (the video API's capability routing).
    let image = string_field(body, "image")?;
    let input_reference = string_field(body, "input_reference")?;
    let images = match body.get("images") {
        None | Some(Value::Null) => None,
        Some(v) => Some(string_list("images", v)?),
    };
    if image.is_some() && images.is_some() {
        return Err(bad("image", "give either image or images, not both"));
    }
    if let Some(list) = &images {
        if list.is_empty() || list.len() > 7 {
            return Err(bad("images", "must hold 1 to 7 items"));
        }
    }
    let n_images = images.as_ref().map_or(0, Vec::len);
    let capability = if input_reference.is_some() || n_images >= 3 || force_reference {
        Capability::ReferenceToVideo
    } else if image.is_some() || n_images > 0 {
        Capability::ImageToVideo
    } else {
        Capability::TextToVideo
    };
    if capability == Capability::ReferenceToVideo && image.is_some() {
        return Err(bad("image", "is for image-to-video; reference-to-video takes images or input_reference"));
    }

    // Input assets.
    let mut uploads = Vec::new();
    let mut inputs: Vec<String> = Vec::new();
    if let Some(i) = image {
        inputs.push(image_input("image", i, allow_base64, &mut uploads)?);
    }
    for (i, url) in images.iter().flatten().enumerate() {
        inputs.push(image_input(&format!("images[{i}]"), url, allow_base64, &mut uploads)?);
    }
    if let Some(r) = input_reference {
        inputs.push(image_input("input_reference", r, allow_base64, &mut uploads)?);
    }
    if inputs.len() > 7 {
        return Err(bad("images", "reference-to-video takes at most 7 reference images in all"));
    }

    // Reference-only metadata.
    let has_subjects = meta.contains_key("Subjects");
    if capability != Capability::ReferenceToVideo {
        for key in ["Subjects", "Videos"] {
            if meta.contains_key(key) {
                return Err(bad(&format!("metadata.{key}"), "applies to reference-to-video only"));
            }
        }
    }
    let subject_videos = check_subjects(&mut meta, allow_base64, &mut uploads)?;
    let has_videos = meta.get("Videos").is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())) || subject_videos;
    if has_videos && model != "genq2-pro" {
        return Err(bad("metadata.Videos", "reference videos are supported only by model genq2-pro"));
    }
    if capability == Capability::ReferenceToVideo && inputs.is_empty() && !has_subjects && !has_videos {
        return Err(bad("images", "reference-to-video needs reference images, metadata.Subjects or metadata.Videos"));
    }
    if let Some(ar) = meta.get("AspectRatio") {
        if capability == Capability::ImageToVideo {
            return Err(bad("metadata.AspectRatio", "applies to text-to-video and reference-to-video only"));
        }
        if !ar.as_str().is_some_and(|a| ASPECT_RATIOS.contains(&a)) {
            return Err(bad("metadata.AspectRatio", format!("must be one of {}", ASPECT_RATIOS.join(", "))));
        }
    }

    // Capability matrix (the video API's model and capability matrix).
    let upstream_model = match support(model, capability) {
        Support::Forward => model.to_string(),
        Support::AsGenq2 if model == "genq2-pro" && has_videos => model.to_string(),
        Support::AsGenq2 => "genq2".to_string(),
        Support::NotSupported(why) => {
            return Err(bad("model", format!("{} is not supported by {model}: {model} {why}", capability.label())));
        }
    };

    let prompt = prompt_of(body, capability)?;

    // Duration (the video API's limits).
    let start_end = capability == Capability::ImageToVideo && inputs.len() == 2;
    let duration = parse_duration(body.get("duration"))?.unwrap_or(DEFAULT_DURATION);
    let (lo, hi) = duration_range(capability, &upstream_model, start_end);
    if duration < lo || duration > hi {
        let what = if start_end { "start/end-frame image-to-video".to_string() } else { capability.label().to_string() };
        return Err(bad("duration", format!("{what} with {upstream_model} takes {lo} to {hi} seconds (got {duration})")));
    }

    let off_peak = meta.get("OffPeak").and_then(Value::as_bool).unwrap_or(false);
    let mut payload = meta;
    payload.insert("Model".into(), Value::String(upstream_model.clone()));
    if let Some(p) = prompt {
        payload.insert("Prompt".into(), Value::String(p.to_string()));
    }
    if !inputs.is_empty() {
        payload.insert("Images".into(), Value::Array(inputs.into_iter().map(Value::String).collect()));
    }
    payload.insert("Duration".into(), Value::from(duration));
    Ok(Submission { capability, api_model: model.to_string(), upstream_model, duration, off_peak, payload, uploads })
}

/// `metadata`: its names in PascalCase, routing-only and filtered fields taken out; and
/// whether it asked for reference-to-video (`action: referenceGenerate`).
fn metadata(body: &Map<String, Value>) -> Result<(Map<String, Value>, bool), ApiError> {
    let mut meta = Map::new();
    let mut force_reference = false;
    match body.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (key, value) in m {
                let name = pascal_case(key);
                let field = format!("metadata.{key}");
                // Reserved names match whatever their case: `RESOLUTION` is `Resolution`.
                match name.to_ascii_lowercase().as_str() {
                    "model" | "prompt" | "images" | "duration" => {
                        return Err(bad(
                            &field,
                            format!("must not be set in metadata; use the top-level {} field", name.to_ascii_lowercase()),
                        ));
                    }
                    "action" => {
                        let action = value.as_str().ok_or_else(|| bad(&field, "must be a string"))?;
                        force_reference |= action == "referenceGenerate";
                        continue;
                    }
                    "resolution" | "movementamplitude" => continue,
                    _ => {}
                }
                if meta.keys().any(|k| k.eq_ignore_ascii_case(&name)) || meta.insert(name.clone(), value.clone()).is_some() {
                    return Err(bad(&field, format!("metadata.{name} is given twice")));
                }
            }
        }
        Some(_) => return Err(bad("metadata", "must be an object")),
    }
    Ok((meta, force_reference))
}

/// `prompt`: required but for image-to-video, at most [`MAX_PROMPT_CHARS`] characters.
fn prompt_of(body: &Map<String, Value>, capability: Capability) -> Result<Option<&str>, ApiError> {
    let prompt = string_field(body, "prompt")?.filter(|p| !p.trim().is_empty());
    if prompt.is_none() && capability != Capability::ImageToVideo {
        return Err(bad("prompt", format!("is required for {}", capability.label())));
    }
    if let Some(p) = prompt {
        let chars = p.chars().count();
        if chars > MAX_PROMPT_CHARS {
            return Err(bad("prompt", format!("at most {MAX_PROMPT_CHARS} characters (got {chars})")));
        }
    }

    Ok(prompt)
}

/// Type rules of the metadata table (the video API's metadata and logo tables).
fn check_metadata_types(meta: &Map<String, Value>) -> Result<(), ApiError> {
    for (key, value) in meta {
        let field = format!("metadata.{key}");
        match key.as_str() {
            "Bgm" | "Audio" | "IsRec" | "OffPeak" if !value.is_boolean() => return Err(bad(&field, "must be true or false")),
            "AudioType" | "VoiceId" | "MetaData" | "CallbackUrl" if !value.is_string() => return Err(bad(&field, "must be a string")),
            "CallbackUrl" => check_media_url(&field, value.as_str().unwrap_or_default())?,
            "Payload" => {
                let s = value.as_str().ok_or_else(|| bad(&field, "must be a string"))?;
                if s.chars().count() > MAX_PAYLOAD_CHARS {
                    return Err(bad(&field, format!("at most {MAX_PAYLOAD_CHARS} characters")));
                }
            }
            "Style" if !matches!(value.as_str(), Some("general" | "anime")) => return Err(bad(&field, "must be general or anime")),
            "LogoAdd" if !(value.is_i64() || value.is_u64()) => return Err(bad(&field, "must be an integer (1 adds, 0 does not)")),
            "LogoParam" => check_logo(value)?,
            "Videos" => {
                let videos = string_list(&field, value)?;
                for (i, v) in videos.iter().enumerate() {
                    check_media_url(&format!("{field}[{i}]"), v)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_logo(value: &Value) -> Result<(), ApiError> {
    let logo = value.as_object().ok_or_else(|| bad("metadata.LogoParam", "must be an object"))?;
    for key in ["LogoUrl", "LogoImage"] {
        if logo.get(key).is_some_and(|v| !v.is_string()) {
            return Err(bad(&format!("metadata.LogoParam.{key}"), "must be a string"));
        }
    }
    if let Some(rect) = logo.get("LogoRect") {
        let rect = rect.as_object().ok_or_else(|| bad("metadata.LogoParam.LogoRect", "must be an object"))?;
        for key in ["X", "Y", "Width", "Height"] {
            if rect.get(key).is_some_and(|v| !v.is_i64()) {
                return Err(bad(&format!("metadata.LogoParam.LogoRect.{key}"), "must be an integer"));
            }
        }
    }
    Ok(())
}

/// The video API's subject rules and input limits: 1–7 subjects, Id and Images required, 1–3 images each, at most 7 in total.
/// Returns whether any subject carries videos.
fn check_subjects(meta: &mut Map<String, Value>, allow_base64: bool, uploads: &mut Vec<InlineImage>) -> Result<bool, ApiError> {
    let Some(subjects) = meta.get_mut("Subjects") else { return Ok(false) };
    let list = subjects.as_array_mut().ok_or_else(|| bad("metadata.Subjects", "must be an array of subject objects"))?;
    if list.is_empty() || list.len() > 7 {
        return Err(bad("metadata.Subjects", "must hold 1 to 7 subjects"));
    }
    let mut total = 0;
    let mut videos = false;
    for (i, s) in list.iter_mut().enumerate() {
        let at = format!("metadata.Subjects[{i}]");
        let s = s.as_object_mut().ok_or_else(|| bad(&at, "must be an object"))?;
        if s.get("Id").and_then(Value::as_str).is_none_or(|id| id.trim().is_empty()) {
            return Err(bad(&format!("{at}.Id"), "is required (the prompt refers to it as @<Id>)"));
        }
        let images = string_list(&format!("{at}.Images"), s.get("Images").unwrap_or(&Value::Null))
            .map_err(|_| bad(&format!("{at}.Images"), "is required: an array of 1 to 3 image URLs"))?;
        if images.is_empty() || images.len() > 3 {
            return Err(bad(&format!("{at}.Images"), "must hold 1 to 3 images"));
        }
        let mut stored = Vec::with_capacity(images.len());
        for (j, url) in images.iter().enumerate() {
            stored.push(Value::String(image_input(&format!("{at}.Images[{j}]"), url, allow_base64, uploads)?));
        }
        total += images.len();
        s.insert("Images".into(), Value::Array(stored));
        for key in ["Name", "VoiceId"] {
            if s.get(key).is_some_and(|v| !v.is_string()) {
                return Err(bad(&format!("{at}.{key}"), "must be a string"));
            }
        }
        if let Some(v) = s.get("Videos") {
            let list = string_list(&format!("{at}.Videos"), v)?;
            videos |= !list.is_empty();
        }
    }
    if total > 7 {
        return Err(bad("metadata.Subjects", format!("at most 7 subject images in total (got {total})")));
    }
    Ok(videos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any object, with any values under the fields validation reads: validated or refused
        /// with a 400, never a panic.
        #[test]
        fn any_body_is_validated_or_refused_with_400(
            others in crate::protocol::tests::arb_json(),
            model in proptest::sample::select(vec!["genq3-pro", "genq2", "genq2-pro", "nope"]),
            fields in proptest::collection::btree_map(
                proptest::sample::select(vec!["prompt", "duration", "image", "images", "input_reference", "metadata"]),
                crate::protocol::tests::arb_json(), 0..6),
        ) {
            let mut body = match others { Value::Object(m) => m, _ => Map::new() };
            body.insert("model".into(), Value::String(model.into()));
            for (k, v) in fields {
                body.insert(k.into(), v);
            }
            let bytes = serde_json::to_vec(&Value::Object(body)).expect("json");
            let enabled: Vec<String> = MODELS.iter().map(|m| m.to_string()).collect();
            match parse_body(&bytes).and_then(|v| validate(&v, &enabled, true)) {
                Ok(sub) => proptest::prop_assert!(sub.duration > 0),
                Err(e) => proptest::prop_assert_eq!(e.status(), 400),
            }
        }
    }

    #[test]
    fn a_body_is_parsed_into_the_fields_validation_reads_and_nothing_else() {
        let body = br#"{"model":"genq3-pro","prompt":"a cat","unknown":[0,0,0],"metadata":{"OffPeak":true},"duration":5}"#;
        let v = parse_body(body).expect("parsed");
        assert_eq!(v, json!({"model": "genq3-pro", "prompt": "a cat", "metadata": {"OffPeak": true}, "duration": 5}));
        // An unknown field of any size is skipped, not stored.
        let big_unknown = format!(r#"{{"model":"genq3-pro","x":[{}0]}}"#, "0,".repeat(200_000));
        assert_eq!(parse_body(big_unknown.as_bytes()).expect("parsed"), json!({"model": "genq3-pro"}));
        // A read field with a million values is refused.
        let bomb = format!(r#"{{"model":"genq3-pro","metadata":{{"x":[{}0]}}}}"#, "0,".repeat(1_000_000));
        let e = parse_body(bomb.as_bytes()).expect_err("refused");
        assert_eq!((e.status(), e.param.as_deref()), (400, Some("metadata")));
        let e = parse_body(b"[1]").expect_err("not an object");
        assert_eq!(e.param.as_deref(), Some("body"));
        assert_eq!(parse_body(b"{").expect_err("invalid").status(), 400);
    }

    fn all() -> Vec<String> {
        MODELS.iter().map(|m| m.to_string()).collect()
    }

    fn ok(body: Value) -> Submission {
        validate(&body, &all(), false).unwrap_or_else(|e| panic!("{body}: {}", e.message))
    }

    /// The 400 message for `body`; asserts it names `field`.
    fn rejects(body: Value, field: &str) -> String {
        let e = validate(&body, &all(), false).expect_err(&body.to_string());
        assert_eq!(e.status(), 400);
        assert!(e.message.starts_with(field), "expected field {field}: {}", e.message);
        e.message
    }

    const IMG: &str = "https://example.com/a.png";

    #[test]
    fn capability_routing_by_shape() {
        let t = ok(json!({"model": "genq3-pro", "prompt": "cat"}));
        assert_eq!(t.capability, Capability::TextToVideo);
        let i = ok(json!({"model": "genq3-pro", "image": IMG}));
        assert_eq!(i.capability, Capability::ImageToVideo);
        assert_eq!(i.payload["Images"], json!([IMG]));
        let i2 = ok(json!({"model": "genq3-pro", "images": [IMG]}));
        assert_eq!(i2.capability, Capability::ImageToVideo);
        let se = ok(json!({"model": "genq3-pro", "images": [IMG, IMG]}));
        assert_eq!(se.capability, Capability::ImageToVideo);
        let r = ok(json!({"model": "genq2", "prompt": "p", "images": [IMG, IMG, IMG]}));
        assert_eq!(r.capability, Capability::ReferenceToVideo);
        let r = ok(json!({"model": "genq2", "prompt": "p", "input_reference": IMG}));
        assert_eq!(r.capability, Capability::ReferenceToVideo);
        for key in ["Action", "action"] {
            let r = ok(json!({"model": "genq2", "prompt": "p", "images": [IMG], "metadata": {key: "referenceGenerate"}}));
            assert_eq!(r.capability, Capability::ReferenceToVideo);
            assert!(!r.payload.contains_key("Action") && !r.payload.contains_key("action"), "routing only");
        }
    }

    #[test]
    fn capability_matrix() {
        // Text-to-video: q2 image models rejected, genq3-pro-fast forwarded.
        for m in ["genq2-pro", "genq2-turbo", "genq2-pro-fast"] {
            let msg = rejects(json!({"model": m, "prompt": "p"}), "model");
            assert!(msg.contains("text-to-video") && msg.contains("genq2, genq3-pro or genq3-turbo"), "{msg}");
        }
        for m in ["genq3-pro", "genq3-turbo", "genq3-pro-fast", "genq2"] {
            assert_eq!(ok(json!({"model": m, "prompt": "p"})).upstream_model, m);
        }
        // Image-to-video: genq2 rejected, the rest forwarded.
        let msg = rejects(json!({"model": "genq2", "image": IMG}), "model");
        assert!(msg.contains("image-to-video"), "{msg}");
        for m in ["genq3-pro", "genq3-turbo", "genq3-pro-fast", "genq2-pro", "genq2-turbo", "genq2-pro-fast"] {
            assert_eq!(ok(json!({"model": m, "image": IMG})).upstream_model, m);
        }
        // Reference-to-video: q2 image models submitted as genq2, q3 forwarded.
        let refs = json!([IMG, IMG, IMG]);
        for m in ["genq2-pro", "genq2-turbo", "genq2-pro-fast"] {
            let s = ok(json!({"model": m, "prompt": "p", "images": refs}));
            assert_eq!(s.upstream_model, "genq2");
            assert_eq!(s.api_model, m);
            assert_eq!(s.payload["Model"], "genq2");
        }
        for m in ["genq3-pro", "genq3-turbo", "genq3-pro-fast", "genq2"] {
            assert_eq!(ok(json!({"model": m, "prompt": "p", "images": refs})).upstream_model, m);
        }
        // genq2-pro keeps its name when reference videos are present.
        let s = ok(
            json!({"model": "genq2-pro", "prompt": "p", "metadata": {"Action": "referenceGenerate", "Videos": ["https://e.com/v.mp4"]}}),
        );
        assert_eq!(s.upstream_model, "genq2-pro");
        assert_eq!(s.payload["Videos"], json!(["https://e.com/v.mp4"]));
    }

    #[test]
    fn unknown_or_disabled_models() {
        let msg = rejects(json!({"model": "genq9", "prompt": "p"}), "model");
        assert!(msg.contains("unsupported model 'genq9'"), "{msg}");
        let e = validate(&json!({"model": "genq2", "prompt": "p"}), &["genq3-pro".to_string()], false).unwrap_err();
        assert!(e.message.contains("unsupported model 'genq2'"));
        rejects(json!({"prompt": "p"}), "model");
        rejects(json!({"model": 5, "prompt": "p"}), "model");
    }

    #[test]
    fn durations_by_capability_and_model() {
        assert_eq!(ok(json!({"model": "genq3-pro", "prompt": "p"})).duration, 5);
        assert_eq!(ok(json!({"model": "genq3-pro", "prompt": "p", "duration": "16"})).duration, 16);
        assert_eq!(ok(json!({"model": "genq3-pro", "prompt": "p", "duration": 1})).payload["Duration"], 1);
        rejects(json!({"model": "genq3-pro", "prompt": "p", "duration": 17}), "duration");
        rejects(json!({"model": "genq3-pro", "prompt": "p", "duration": 0}), "duration");
        rejects(json!({"model": "genq3-pro", "prompt": "p", "duration": 5.5}), "duration");
        rejects(json!({"model": "genq3-pro", "prompt": "p", "duration": "five"}), "duration");
        rejects(json!({"model": "genq3-pro", "prompt": "p", "duration": -1}), "duration");
        assert_eq!(ok(json!({"model": "genq2", "prompt": "p", "duration": 10})).duration, 10);
        rejects(json!({"model": "genq2", "prompt": "p", "duration": 11}), "duration");
        assert_eq!(ok(json!({"model": "genq3-turbo", "image": IMG, "duration": 16})).duration, 16);
        assert_eq!(ok(json!({"model": "genq2-pro", "image": IMG, "duration": 10})).duration, 10);
        rejects(json!({"model": "genq2-turbo", "image": IMG, "duration": 11}), "duration");
        assert_eq!(ok(json!({"model": "genq3-pro", "images": [IMG, IMG], "duration": 16})).duration, 16);
        assert_eq!(ok(json!({"model": "genq2-pro", "images": [IMG, IMG], "duration": 8})).duration, 8);
        let msg = rejects(json!({"model": "genq2-pro", "images": [IMG, IMG], "duration": 9}), "duration");
        assert!(msg.contains("start/end-frame"), "{msg}");
        assert_eq!(ok(json!({"model": "genq2", "prompt": "p", "images": [IMG, IMG, IMG], "duration": 10})).duration, 10);
        rejects(json!({"model": "genq2-pro", "prompt": "p", "images": [IMG, IMG, IMG], "duration": 11}), "duration");
    }

    #[test]
    fn prompt_rules() {
        rejects(json!({"model": "genq3-pro"}), "prompt");
        rejects(json!({"model": "genq2", "images": [IMG, IMG, IMG]}), "prompt");
        assert!(!ok(json!({"model": "genq3-pro", "image": IMG})).payload.contains_key("Prompt"));
        let long = "字".repeat(2000);
        assert_eq!(ok(json!({"model": "genq3-pro", "prompt": long})).payload["Prompt"].as_str().map(|s| s.chars().count()), Some(2000));
        let msg = rejects(json!({"model": "genq3-pro", "prompt": "字".repeat(2001)}), "prompt");
        assert!(msg.contains("2000"), "{msg}");
        rejects(json!({"model": "genq3-pro", "prompt": 7}), "prompt");
    }

    #[test]
    fn image_counts_and_urls() {
        rejects(json!({"model": "genq3-pro", "images": []}), "images");
        rejects(json!({"model": "genq2", "prompt": "p", "images": [IMG, IMG, IMG, IMG, IMG, IMG, IMG, IMG]}), "images");
        assert_eq!(
            ok(json!({"model": "genq2", "prompt": "p", "images": [IMG, IMG, IMG, IMG, IMG, IMG, IMG]})).payload["Images"]
                .as_array()
                .map(Vec::len),
            Some(7)
        );
        rejects(json!({"model": "genq3-pro", "image": IMG, "images": [IMG]}), "image");
        rejects(json!({"model": "genq2", "prompt": "p", "image": IMG, "input_reference": IMG}), "image");
        rejects(json!({"model": "genq2", "prompt": "p", "images": [IMG, IMG, IMG, IMG, IMG, IMG, IMG], "input_reference": IMG}), "images");
        rejects(json!({"model": "genq3-pro", "images": [1]}), "images");
        let msg = rejects(json!({"model": "genq3-pro", "image": "data:image/png;base64,iVBORw0KGgo="}), "image");
        assert!(msg.contains("public https URL"), "{msg}");
        let raw_b64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";
        let msg = rejects(json!({"model": "genq3-pro", "images": [raw_b64]}), "images[0]");
        assert!(msg.contains("object storage"), "{msg}");
        rejects(json!({"model": "genq3-pro", "image": "ftp://x/y.png"}), "image");
        rejects(json!({"model": "genq2", "prompt": "p", "metadata": {"Action": "referenceGenerate"}}), "images");
    }

    #[test]
    fn subjects_rules() {
        let subj = |id: &str, n: usize| json!({"Id": id, "Images": vec![IMG; n]});
        let body =
            |subjects: Value| json!({"model": "genq2", "prompt": "@a", "metadata": {"Action": "referenceGenerate", "Subjects": subjects}});
        assert_eq!(ok(body(json!([subj("a", 3)]))).payload["Subjects"][0]["Id"], "a");
        rejects(body(json!([])), "metadata.Subjects");
        rejects(body(json!((0..8).map(|i| subj(&i.to_string(), 1)).collect::<Vec<_>>())), "metadata.Subjects");
        rejects(body(json!([subj("a", 3), subj("b", 3), subj("c", 2)])), "metadata.Subjects");
        rejects(body(json!([subj("a", 4)])), "metadata.Subjects[0].Images");
        rejects(body(json!([subj("a", 0)])), "metadata.Subjects[0].Images");
        rejects(body(json!([{"Images": [IMG]}])), "metadata.Subjects[0].Id");
        rejects(body(json!([{"Id": "a"}])), "metadata.Subjects[0].Images");
        rejects(body(json!([{"Id": "a", "Images": [IMG], "Name": 3}])), "metadata.Subjects[0].Name");
        let msg = rejects(body(json!([{"Id": "a", "Images": [IMG], "Videos": ["https://e.com/v.mp4"]}])), "metadata.Videos");
        assert!(msg.contains("genq2-pro"), "{msg}");
        rejects(json!({"model": "genq3-pro", "prompt": "p", "metadata": {"Subjects": [subj("a", 1)]}}), "metadata.Subjects");
        rejects(
            json!({"model": "genq2", "prompt": "p", "images": [IMG, IMG, IMG], "metadata": {"Videos": ["https://e.com/v.mp4"]}}),
            "metadata.Videos",
        );
    }

    #[test]
    fn metadata_rules() {
        let with = |meta: Value| json!({"model": "genq3-pro", "prompt": "p", "metadata": meta});
        for key in ["Model", "Prompt", "Images", "Duration", "duration"] {
            let msg = rejects(with(json!({key: "x"})), &format!("metadata.{key}"));
            assert!(msg.contains("top-level"), "{msg}");
        }
        let s = ok(with(json!({"Resolution": "1080p", "resolution": "720p", "MovementAmplitude": "large", "Bgm": true})));
        assert!(!s.payload.contains_key("Resolution") && !s.payload.contains_key("MovementAmplitude"));
        // Whatever their case: none reaches the upstream.
        let upper = ok(with(json!({"RESOLUTION": "1080p", "movementAMPLITUDE": "large", "resolutioN": "4k"})));
        assert!(
            upper.payload.keys().all(|k| !k.eq_ignore_ascii_case("resolution") && !k.eq_ignore_ascii_case("movementamplitude")),
            "{:?}",
            upper.payload
        );
        for key in ["MODEL", "PROMPT", "dUrAtIoN"] {
            rejects(with(json!({key: "x"})), &format!("metadata.{key}"));
        }
        rejects(with(json!({"BGM": true, "Bgm": false})), "metadata.Bgm");
        assert_eq!(s.payload["Bgm"], true);
        for ar in ASPECT_RATIOS {
            assert_eq!(ok(with(json!({"AspectRatio": ar}))).payload["AspectRatio"], ar);
        }
        rejects(with(json!({"AspectRatio": "21:9"})), "metadata.AspectRatio");
        rejects(json!({"model": "genq3-pro", "image": IMG, "metadata": {"AspectRatio": "16:9"}}), "metadata.AspectRatio");
        assert_eq!(ok(with(json!({"aspect_ratio": "1:1"}))).payload["AspectRatio"], "1:1");
        rejects(with(json!({"AspectRatio": "1:1", "aspect_ratio": "1:1"})), "metadata.");
        assert_eq!(
            ok(with(json!({"Payload": "x".repeat(MAX_PAYLOAD_CHARS)}))).payload["Payload"].as_str().map(str::len),
            Some(MAX_PAYLOAD_CHARS)
        );
        rejects(with(json!({"Payload": "x".repeat(MAX_PAYLOAD_CHARS + 1)})), "metadata.Payload");
        rejects(with(json!({"Bgm": "yes"})), "metadata.Bgm");
        rejects(with(json!({"OffPeak": 1})), "metadata.OffPeak");
        rejects(with(json!({"LogoAdd": "1"})), "metadata.LogoAdd");
        rejects(with(json!({"Style": "noir"})), "metadata.Style");
        rejects(with(json!({"LogoParam": {"LogoRect": {"X": "left"}}})), "metadata.LogoParam.LogoRect.X");
        rejects(with(json!({"CallbackUrl": "not a url"})), "metadata.CallbackUrl");
        rejects(json!({"model": "genq3-pro", "prompt": "p", "metadata": []}), "metadata");
        let s = ok(with(
            json!({"OffPeak": true, "LogoAdd": 0, "LogoParam": {"LogoUrl": IMG, "LogoRect": {"X": -10, "Y": 10, "Width": 50, "Height": 20}}, "CustomThing": 1}),
        ));
        assert!(s.off_peak);
        assert_eq!(s.payload["CustomThing"], 1, "other metadata passes through");
        assert_eq!(s.payload["LogoParam"]["LogoRect"]["X"], -10);
    }

    const PNG_1PX: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

    #[test]
    fn base64_images_with_storage_become_uploads() {
        let body = json!({"model": "genq2", "prompt": "@a", "images": [format!("data:image/png;base64,{PNG_1PX}"), IMG, PNG_1PX],
                          "metadata": {"Subjects": [{"Id": "a", "Images": [PNG_1PX]}]}});
        let s = validate(&body, &all(), true).expect("valid");
        assert_eq!(s.uploads.len(), 3);
        assert_eq!(s.payload["Images"], json!(["tollgate-upload:0", IMG, "tollgate-upload:1"]));
        assert_eq!(s.payload["Subjects"][0]["Images"], json!(["tollgate-upload:2"]));
        assert_eq!(s.uploads[2].field, "metadata.Subjects[0].Images[0]");
        assert_eq!((s.uploads[0].content_type, s.uploads[0].extension), ("image/png", "png"));
        assert!(s.uploads[0].bytes.starts_with(b"\x89PNG"));
        // Without storage the same body is refused.
        assert!(validate(&body, &all(), false).is_err());
    }

    #[test]
    fn bad_base64_or_non_images_name_the_field() {
        use base64::Engine;
        let e = validate(&json!({"model": "genq3-pro", "image": "!!!not base64!!!"}), &all(), true).unwrap_err();
        assert!(e.message.starts_with("image:") && e.message.contains("base64"), "{}", e.message);
        let gif = base64::engine::general_purpose::STANDARD.encode(b"GIF89a\x01\x00\x01\x00");
        let e = validate(&json!({"model": "genq3-pro", "images": [gif]}), &all(), true).unwrap_err();
        assert!(e.message.starts_with("images[0]:") && e.message.contains("png, jpeg or webp"), "{}", e.message);
        let jpeg = base64::engine::general_purpose::STANDARD.encode([0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10]);
        assert_eq!(decode_image("image", &jpeg).expect("jpeg").1, "image/jpeg");
        let webp = base64::engine::general_purpose::STANDARD.encode(b"RIFF\x00\x00\x00\x00WEBPVP8 ");
        assert_eq!(decode_image("image", &webp).expect("webp").2, "webp");
        assert!(decode_image("image", "data:image/png,abc").is_err());
    }

    #[test]
    fn pascal_case_names() {
        assert_eq!(pascal_case("aspect_ratio"), "AspectRatio");
        assert_eq!(pascal_case("offPeak"), "OffPeak");
        assert_eq!(pascal_case("Bgm"), "Bgm");
        assert_eq!(pascal_case("resolution"), "Resolution");
    }
}
