//! A media call's request as it is priced and routed: its model and the fields its price
//! depends on (how many images, of what quality and size; a speech's characters; an upload's
//! size), from a JSON body or from a form's fields, and the input its hold estimates.

use crate::billing::media::MediaCall;
use crate::protocol::media::MediaFields;
use crate::protocol::multipart::Form;
use crate::protocol::{ApiError, BodyFields, ErrorKind};
use crate::route::Route;

/// The body fields the draft reads (model, stream, `n`) and the media call, from a JSON body or
/// a form (`form`, whose `body` is then empty).
pub fn fields(route: &Route, body: &[u8], form: Option<&Form>) -> Result<(BodyFields<'static>, MediaCall), ApiError> {
    let media = match form {
        Some(form) => {
            let mut fields = MediaFields::default();
            for (name, value) in &form.fields {
                fields.set_form_field(name, value)?;
            }
            fields
        }
        None if matches!(route, Route::Transcription { .. }) => {
            return Err(ApiError::new(ErrorKind::BadRequest, "This endpoint takes a multipart/form-data upload with a 'file' part."));
        }
        None => MediaFields::from_json(body)?,
    };
    let call = match route {
        Route::Images { .. } => {
            let files = form.map_or(0, |f| f.files.len() as u64);
            if route.multipart() && form.is_some() && files == 0 {
                return Err(ApiError::new(ErrorKind::BadRequest, "An image file is required ('image').").with_param("image"));
            }
            MediaCall::Images { n: media.images()?, quality: media.quality.clone(), size: media.size.clone(), files }
        }
        Route::Speech => MediaCall::Speech { characters: media.speech_characters()? },
        _ => {
            let file = form.and_then(|f| f.files.iter().find(|p| p.name == "file"));
            let file = file.ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The 'file' part is required.").with_param("file"))?;
            MediaCall::Transcription { upload_bytes: file.len, played_ms: file.played_ms }
        }
    };
    let fields = BodyFields { model: media.model, stream: media.stream, n: media.n, ..BodyFields::default() };
    Ok((fields, call))
}

/// The bytes of text a media request carries (its prompt, its speech input), which its input
/// estimate counts.
pub fn text_bytes(body: &[u8], form: Option<&Form>) -> usize {
    form.map_or(body.len(), Form::text_bytes)
}
