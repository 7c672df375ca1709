//! `multipart/form-data` as the media endpoints take it: a form read from a client (its text
//! fields kept, its files spooled by the edge) and written again for an upstream, with a
//! boundary of tollgate's own and the model under the upstream's name. Encoding is pure; the
//! spooled files are read as the body is sent.

use bytes::Bytes;
use std::sync::Arc;

/// A form as a client sent it: text fields in order, then files (their bytes on disk).
#[derive(Debug, Default)]
pub struct Form {
    pub fields: Vec<(String, String)>,
    pub files: Vec<FilePart>,
}

/// An uploaded file: its part's name, file name and type, and where its bytes wait.
#[derive(Debug, Clone)]
pub struct FilePart {
    pub name: String,
    pub filename: Option<String>,
    pub content_type: Option<String>,
    pub len: u64,
    /// An unnamed temporary file (gone once closed), read at offsets: every attempt reads it
    /// from the start.
    pub spool: Arc<std::fs::File>,
    /// How long it plays, in milliseconds, when it is audio whose container says so (read for
    /// transcriptions: `protocol::audio`).
    pub played_ms: Option<u64>,
}

/// One piece of an encoded form: bytes, or a file's bytes read when sent.
#[derive(Debug, Clone)]
pub enum Segment {
    Bytes(Bytes),
    File { spool: Arc<std::fs::File>, len: u64 },
}

impl Segment {
    /// The bytes it adds to the body.
    pub fn size(&self) -> u64 {
        match self {
            Segment::Bytes(b) => b.len() as u64,
            Segment::File { len, .. } => *len,
        }
    }
}

/// The form's field of `name` (the first, when repeated).
impl Form {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The bytes of its text fields, all together.
    pub fn text_bytes(&self) -> usize {
        self.fields.iter().map(|(n, v)| n.len() + v.len()).sum()
    }

    /// The form written for an upstream: `model` (when `model` is given) under that name, the
    /// other fields as sent, then the files; the boundary is tollgate's own. Returns the
    /// content type to send and the body's segments.
    pub fn encode(&self, model: Option<&str>) -> (String, Vec<Segment>) {
        let boundary = format!("tollgate-{:032x}", rand::random::<u128>());
        let mut segments = Vec::with_capacity(2 + 2 * self.files.len());
        let mut head = String::new();
        for (name, value) in &self.fields {
            let value = if name == "model" { model.unwrap_or(value) } else { value };
            head.push_str(&format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"\r\n\r\n{value}\r\n", quoted(name)));
        }
        for file in &self.files {
            head.push_str(&format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"", quoted(&file.name)));
            if let Some(filename) = &file.filename {
                head.push_str(&format!("; filename=\"{}\"", quoted(filename)));
            }
            let content_type = file.content_type.as_deref().filter(|t| !t.contains(['\r', '\n'])).unwrap_or("application/octet-stream");
            head.push_str(&format!("\r\nContent-Type: {content_type}\r\n\r\n"));
            segments.push(Segment::Bytes(Bytes::from(std::mem::take(&mut head))));
            segments.push(Segment::File { spool: file.spool.clone(), len: file.len });
            head.push_str("\r\n");
        }
        head.push_str(&format!("--{boundary}--\r\n"));
        segments.push(Segment::Bytes(Bytes::from(head)));
        (format!("multipart/form-data; boundary={boundary}"), segments)
    }
}

/// A name inside a quoted header parameter: quotes and line breaks percent-encoded, as
/// browsers write them.
fn quoted(name: &str) -> String {
    name.replace('"', "%22").replace('\r', "%0D").replace('\n', "%0A")
}

/// The boundary of a `multipart/form-data` content type, None for any other type.
pub fn boundary(content_type: &str) -> Option<String> {
    let mime: mime::Mime = content_type.parse().ok()?;
    (mime.type_() == mime::MULTIPART && mime.subtype() == mime::FORM_DATA).then(|| mime.get_param(mime::BOUNDARY).map(|b| b.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_form_is_written_again_with_its_model_renamed_and_its_files_read_from_disk() {
        let mut spool = tempfile::tempfile().unwrap();
        spool.write_all(b"RIFFDATA").unwrap();
        let form = Form {
            fields: vec![("model".into(), "alias".into()), ("prompt".into(), "a \"cat\"".into())],
            files: vec![FilePart {
                played_ms: None,
                name: "image[]".into(),
                filename: Some("c\"at.png".into()),
                content_type: Some("image/png".into()),
                len: 8,
                spool: Arc::new(spool),
            }],
        };
        assert_eq!((form.field("prompt"), form.text_bytes()), (Some("a \"cat\""), 5 + 5 + 6 + 7));
        let (content_type, segments) = form.encode(Some("real-model"));
        let b = boundary(&content_type).unwrap();
        assert!(b.starts_with("tollgate-"));
        let mut text = String::new();
        for s in &segments {
            match s {
                Segment::Bytes(bytes) => text.push_str(std::str::from_utf8(bytes).unwrap()),
                Segment::File { len, .. } => text.push_str(&format!("<{len} bytes>")),
            }
        }
        assert_eq!(
            text,
            format!(
                "--{b}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nreal-model\r\n--{b}\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na \"cat\"\r\n--{b}\r\nContent-Disposition: form-data; name=\"image[]\"; filename=\"c%22at.png\"\r\nContent-Type: image/png\r\n\r\n<8 bytes>\r\n--{b}--\r\n"
            )
        );
        assert_eq!(segments.iter().map(Segment::size).sum::<u64>() as usize, text.len() - "<8 bytes>".len() + 8);
        assert_eq!(boundary("multipart/form-data; boundary=\"a b\""), Some("a b".into()));
        assert_eq!(boundary("application/json"), None);
        assert_eq!(boundary("multipart/form-data"), None);
    }
}
