//! One validating pass over a request body's JSON that hands back the span of each top-level
//! member's value, and counts the media parts of the content fields on the way.
//!
//! serde_json skips a string at about 2.5 instructions a byte, and an agent's request is
//! hundreds of KiB of strings: this scanner finds a string's end 32 bytes at a time (SSE2, part
//! of every x86-64 CPU; a table elsewhere) while keeping JSON's rules — no control character in
//! a string, only JSON's escapes, UTF-8 text, at most [`MAX_DEPTH`] levels, nothing after the
//! value. Keys that hold escapes are decoded by serde_json, so a member's name is read as
//! serde would read it; typed member values are parsed by serde_json from their span.

/// Deepest nesting accepted, the top-level object included (serde_json's limit when it builds
/// values; its skip of an ignored member had none, but this scan recurses, so it needs one).
pub const MAX_DEPTH: usize = 128;

/// Where and why a body is not JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanError {
    pub at: usize,
    pub what: &'static str,
}

impl ScanError {
    /// "… at line L column C" of `text`, as serde_json words its errors.
    pub fn describe(&self, text: &[u8]) -> String {
        let before = &text[..self.at.min(text.len())];
        let line = 1 + memchr::memchr_iter(b'\n', before).count();
        let column = 1 + before.len() - memchr::memrchr(b'\n', before).map_or(0, |n| n + 1);
        format!("{} at line {line} column {column}", self.what)
    }
}

/// A string's contents (between its quotes) and whether they hold escapes.
#[derive(Debug, Clone, Copy)]
pub struct Str<'a> {
    pub raw: &'a [u8],
    pub quoted: &'a [u8],
    pub escaped: bool,
    /// No byte of `raw` is above 0x7F (the scan saw every byte).
    pub ascii: bool,
}

impl Str<'_> {
    /// The text as serde_json reads it (escapes decoded). None when a `\u` escape is a lone
    /// surrogate, which serde_json refuses in a key.
    pub fn decoded(&self) -> Option<std::borrow::Cow<'_, str>> {
        if !self.escaped && self.ascii {
            return Some(std::borrow::Cow::Borrowed(ascii_str(self.raw)));
        }
        if !self.escaped {
            return std::str::from_utf8(self.raw).ok().map(std::borrow::Cow::Borrowed);
        }
        serde_json::from_slice::<String>(self.quoted).ok().map(std::borrow::Cow::Owned)
    }

    /// Whether the text, escapes decoded, is one of `names`.
    fn is_one_of(&self, names: &[&str]) -> bool {
        if !self.escaped {
            return names.iter().any(|n| n.as_bytes() == self.raw);
        }
        self.decoded().is_some_and(|t| names.contains(&t.as_ref()))
    }
}

/// Bytes the scan saw to be ASCII, as text without checking them again (a guardrail reads
/// every text of a body: checking each again was half an instruction a byte).
#[allow(unsafe_code)] // see the SAFETY note
fn ascii_str(raw: &[u8]) -> &str {
    debug_assert!(raw.is_ascii());
    // SAFETY: only called for a string whose every byte `Scanner::string` saw and found at or
    // below 0x7F (`Str::ascii`): ASCII is valid UTF-8.
    unsafe { std::str::from_utf8_unchecked(raw) }
}

use super::MediaCount;

const IMAGE_TYPES: [&str; 3] = ["image_url", "input_image", "image"];
const FILE_TYPES: [&str; 3] = ["file", "input_file", "document"];
/// A member whose value is a file reference (counted, not walked).
const FILE_MEMBERS: [&str; 2] = ["fileData", "file_data"];
/// A member whose value is inline data (in the body already: neither counted nor walked).
const INLINE_MEMBERS: [&str; 2] = ["inlineData", "inline_data"];

/// What a member's name means to the media count.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Type,
    File,
    Inline,
    Other,
}

impl KeyKind {
    fn of(key: &Str<'_>) -> KeyKind {
        // An escaped key is decoded once; one that cannot be decoded is no name.
        let decoded = if key.escaped { key.decoded() } else { None };
        let name = match &decoded {
            Some(text) => text.as_bytes(),
            None if key.escaped => return KeyKind::Other,
            None => key.raw,
        };
        let is = |names: &[&str]| names.iter().any(|n| n.as_bytes() == name);
        if is(&["type"]) {
            KeyKind::Type
        } else if is(&FILE_MEMBERS) {
            KeyKind::File
        } else if is(&INLINE_MEMBERS) {
            KeyKind::Inline
        } else {
            KeyKind::Other
        }
    }
}

pub struct Scanner<'a> {
    b: &'a [u8],
    pub at: usize,
}

impl<'a> Scanner<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Scanner { b, at: 0 }
    }

    fn fail(&self, what: &'static str) -> ScanError {
        ScanError { at: self.at, what }
    }

    pub fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.at) {
            self.at += 1;
        }
    }

    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    /// Take `c` if it is next.
    pub fn eat(&mut self, c: u8) -> bool {
        let here = self.peek() == Some(c);
        self.at += usize::from(here);
        here
    }

    pub fn expect(&mut self, c: u8, what: &'static str) -> Result<(), ScanError> {
        if self.eat(c) {
            Ok(())
        } else if self.at >= self.b.len() {
            Err(self.fail("EOF while parsing a value"))
        } else {
            Err(self.fail(what))
        }
    }

    /// Whether only whitespace is left.
    pub fn at_end(&mut self) -> bool {
        self.ws();
        self.at == self.b.len()
    }

    /// The string that starts here (at its opening quote).
    pub fn string(&mut self) -> Result<Str<'a>, ScanError> {
        let open = self.at;
        if self.peek() != Some(b'"') {
            return Err(self.fail("expected a string"));
        }
        let start = open + 1;
        let (mut i, mut escaped, mut high) = (start, false, false);
        loop {
            let (j, h) = next_special(self.b, i);
            high |= h;
            match self.b.get(j) {
                None => {
                    self.at = self.b.len();
                    return Err(self.fail("EOF while parsing a string"));
                }
                Some(b'"') => {
                    let raw = &self.b[start..j];
                    if high && std::str::from_utf8(raw).is_err() {
                        self.at = start;
                        return Err(self.fail("invalid unicode code point"));
                    }
                    self.at = j + 1;
                    return Ok(Str { raw, quoted: &self.b[open..j + 1], escaped, ascii: !high });
                }
                Some(b'\\') => {
                    escaped = true;
                    self.at = j + 1;
                    i = match self.b.get(j + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => j + 2,
                        Some(b'u') => match self.b.get(j + 2..j + 6) {
                            Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => j + 6,
                            Some(_) => return Err(self.fail("invalid escape")),
                            None => {
                                self.at = self.b.len();
                                return Err(self.fail("EOF while parsing a string"));
                            }
                        },
                        Some(_) => return Err(self.fail("invalid escape")),
                        None => return Err(self.fail("EOF while parsing a string")),
                    };
                }
                Some(_) => {
                    self.at = j;
                    return Err(self.fail("control character (\\u0000-\\u001F) found while parsing a string"));
                }
            }
        }
    }

    /// Skip the value that starts here, checking it; `depth` is the nesting around it.
    pub fn value(&mut self, depth: usize) -> Result<(), ScanError> {
        self.walk(depth, None)
    }

    /// Skip the value that starts here, counting the media parts it names into `media`.
    pub fn content(&mut self, depth: usize, media: &mut MediaCount) -> Result<(), ScanError> {
        self.walk(depth, Some(media))
    }

    fn walk(&mut self, depth: usize, mut media: Option<&mut MediaCount>) -> Result<(), ScanError> {
        match self.peek() {
            Some(b'"') => self.string().map(drop),
            Some(b'{') => self.object(depth, |s, _, key, depth| {
                // A key serde could not decode (a lone surrogate) matches no name.
                let Some(m) = media.as_deref_mut() else { return s.value(depth) };
                match KeyKind::of(&key) {
                    KeyKind::Type if s.peek() == Some(b'"') => {
                        let name = s.string()?;
                        if name.is_one_of(&IMAGE_TYPES) {
                            m.images += 1;
                        } else if name.is_one_of(&FILE_TYPES) {
                            m.files += 1;
                        }
                        Ok(())
                    }
                    KeyKind::File => {
                        m.files += 1;
                        s.value(depth)
                    }
                    KeyKind::Type | KeyKind::Inline => s.value(depth),
                    KeyKind::Other => s.content(depth, m),
                }
            }),
            Some(b'[') => {
                let depth = self.open(depth)?;
                if self.eat(b']') {
                    return Ok(());
                }
                loop {
                    self.walk(depth, media.as_deref_mut())?;
                    self.ws();
                    if self.eat(b',') {
                        self.ws();
                        continue;
                    }
                    return self.expect(b']', "expected `,` or `]`");
                }
            }
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.fail("expected value")),
            None => Err(self.fail("EOF while parsing a value")),
        }
    }

    /// The object that starts here (`depth` is the nesting around it): `each` is called at
    /// every member's value with the position of its key, the key, and the depth inside the
    /// object, and must consume the value.
    pub fn object<E: From<ScanError>>(
        &mut self,
        depth: usize,
        mut each: impl FnMut(&mut Self, usize, Str<'a>, usize) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.peek() != Some(b'{') {
            return Err(self.fail("expected `{`").into());
        }
        let depth = self.open(depth)?;
        if self.eat(b'}') {
            return Ok(());
        }
        loop {
            let key_at = self.at;
            let key = self.string()?;
            self.ws();
            self.expect(b':', "expected `:`")?;
            self.ws();
            each(self, key_at, key, depth)?;
            self.ws();
            if self.eat(b',') {
                self.ws();
                continue;
            }
            return Ok(self.expect(b'}', "expected `,` or `}`")?);
        }
    }

    /// Past an opening bracket and the whitespace after it: the depth inside.
    fn open(&mut self, depth: usize) -> Result<usize, ScanError> {
        if depth >= MAX_DEPTH {
            return Err(self.fail("recursion limit exceeded"));
        }
        self.at += 1;
        self.ws();
        Ok(depth + 1)
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), ScanError> {
        match self.b.get(self.at..self.at + word.len()) {
            Some(w) if w == word => {
                self.at += word.len();
                Ok(())
            }
            Some(_) => Err(self.fail("expected value")),
            None => Err(self.fail("EOF while parsing a value")),
        }
    }

    /// JSON's number: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Result<(), ScanError> {
        self.eat(b'-');
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.fail("invalid number")),
        }
        if self.eat(b'.') {
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.fail("invalid number"));
            }
            self.digits();
        }
        if self.eat(b'e') || self.eat(b'E') {
            let _ = self.eat(b'+') || self.eat(b'-');
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.fail("invalid number"));
            }
            self.digits();
        }
        Ok(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }
}

/// Call `f` with each text string of the JSON value `body` (escapes decoded; a string under a
/// member named in `skip` is not text, nor any inside it) until it returns true: whether one
/// did. One pass, no tree built: a string without escapes is read where it lies.
pub fn texts(body: &[u8], skip: &[&str], f: &mut dyn FnMut(&str) -> bool) -> Result<bool, ScanError> {
    fn walk(s: &mut Scanner<'_>, depth: usize, skip: &[&str], f: &mut dyn FnMut(&str) -> bool) -> Result<bool, ScanError> {
        match s.peek() {
            Some(b'"') => {
                let text = s.string()?;
                Ok(text.decoded().is_some_and(|t| f(&t)))
            }
            Some(b'{') => {
                let mut found = false;
                s.object(depth, |s, _, key, depth| {
                    if found || key.is_one_of(skip) {
                        return s.value(depth);
                    }
                    found = walk(s, depth, skip, f)?;
                    Ok::<(), ScanError>(())
                })?;
                Ok(found)
            }
            Some(b'[') => {
                let depth = s.open(depth)?;
                let mut found = false;
                if s.eat(b']') {
                    return Ok(false);
                }
                loop {
                    if found {
                        s.value(depth)?;
                    } else {
                        found = walk(s, depth, skip, f)?;
                    }
                    s.ws();
                    if s.eat(b',') {
                        s.ws();
                        continue;
                    }
                    s.expect(b']', "expected `,` or `]`")?;
                    return Ok(found);
                }
            }
            _ => s.value(depth).map(|()| false),
        }
    }
    let mut s = Scanner::new(body);
    s.ws();
    let found = walk(&mut s, 0, skip, f)?;
    if !s.at_end() {
        return Err(s.fail("trailing characters"));
    }
    Ok(found)
}

/// The first position from `i` holding `"`, `\` or a control character (`b.len()` when none),
/// and whether a byte above 0x7F came before it (the string then needs its UTF-8 checked).
pub fn next_special(b: &[u8], i: usize) -> (usize, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        sse2::next_special(b, i)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        next_special_scalar(b, i)
    }
}

/// [`next_special`] a byte at a time: the tail of the vector search, and other CPUs.
pub fn next_special_scalar(b: &[u8], i: usize) -> (usize, bool) {
    let mut high = false;
    for (k, &c) in b.iter().enumerate().skip(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return (k, high);
        }
        high |= c >= 0x80;
    }
    (b.len(), high)
}

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8, _mm_setzero_si128,
    };

    /// 64 bytes a round while no mark is near (one test for four 16-byte loads), then 16 at a
    /// time to place the first mark: `"`, `\` or a byte up to 0x1F. The high bits (non-ASCII)
    /// of the bytes before it are gathered on the way.
    #[allow(unsafe_code)] // SSE2 intrinsics: see the SAFETY note below
    pub fn next_special(b: &[u8], mut i: usize) -> (usize, bool) {
        // SAFETY: SSE2 is in every x86-64 CPU. Every load reads 16 bytes at `i + 16 * n`, and
        // each loop runs only while those bytes lie inside `b`.
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let backslash = _mm_set1_epi8(b'\\' as i8);
            let control = _mm_set1_epi8(0x1F);
            // x ≤ 0x1F (unsigned) exactly when max(x, 0x1F) == 0x1F.
            let marks = |x: __m128i| {
                let ctl = _mm_cmpeq_epi8(_mm_max_epu8(x, control), control);
                _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)), ctl)
            };
            let mut highs = _mm_setzero_si128();
            while i + 64 <= b.len() {
                let p = b.as_ptr().add(i).cast::<__m128i>();
                let (x0, x1, x2, x3) =
                    (_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)), _mm_loadu_si128(p.add(2)), _mm_loadu_si128(p.add(3)));
                let any = _mm_or_si128(_mm_or_si128(marks(x0), marks(x1)), _mm_or_si128(marks(x2), marks(x3)));
                if _mm_movemask_epi8(any) != 0 {
                    break;
                }
                highs = _mm_or_si128(highs, _mm_or_si128(_mm_or_si128(x0, x1), _mm_or_si128(x2, x3)));
                i += 64;
            }
            let mut high = _mm_movemask_epi8(highs) != 0;
            while i + 16 <= b.len() {
                let x = _mm_loadu_si128(b.as_ptr().add(i).cast::<__m128i>());
                let found = _mm_movemask_epi8(marks(x)) as u32;
                let h = _mm_movemask_epi8(x) as u32;
                if found != 0 {
                    let k = found.trailing_zeros();
                    return (i + k as usize, high || h & ((1u32 << k) - 1) != 0);
                }
                high |= h != 0;
                i += 16;
            }
            let (j, h) = super::next_special_scalar(b, i);
            (j, h || high)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn skip(text: &[u8]) -> Result<(), ScanError> {
        let mut s = Scanner::new(text);
        s.ws();
        s.value(0)?;
        if s.at_end() {
            Ok(())
        } else {
            Err(s.fail("trailing characters"))
        }
    }

    fn media(text: &str) -> MediaCount {
        let mut m = MediaCount::default();
        let mut s = Scanner::new(text.as_bytes());
        s.content(0, &mut m).expect("json");
        m
    }

    #[test]
    fn the_vector_search_agrees_with_the_byte_search() {
        let mut text = vec![b'a'; 100];
        for at in 0..100 {
            for special in [b'"', b'\\', 0x00, 0x1F, b'\n'] {
                text[at] = special;
                for from in [0, 1, at.saturating_sub(1), at] {
                    assert_eq!(next_special(&text, from), next_special_scalar(&text, from), "{special:#x} at {at} from {from}");
                }
                text[at] = b'a';
            }
            text[at] = 0xC3;
            assert_eq!(next_special(&text, 0), (100, true));
            assert_eq!(next_special(&text, at + 1), (100, false), "the high byte is behind");
            text[at] = b'a';
        }
        assert_eq!(next_special(b"", 0), (0, false));
        // Bytes 0x20 and 0x7F are text; 0x80..0xFF are not controls (the comparison is unsigned).
        let edges: Vec<u8> = (0x20..=0xFF).chain([0x20; 40]).filter(|&c| c != b'"' && c != b'\\').collect();
        assert_eq!(next_special(&edges, 0), (edges.len(), true));
    }

    #[test]
    fn strings_keep_json_rules() {
        assert!(skip(br#""plain""#).is_ok());
        assert!(skip(br#""esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDE00""#).is_ok());
        assert!(skip("\"caf\u{e9} \u{1F600}\"".as_bytes()).is_ok());
        for bad in
            [&b"\"raw\ttab\""[..], b"\"raw\nline\"", b"\"\\x\"", b"\"\\u12G4\"", b"\"\\u12\"", b"\"open", b"\"\xff\xfe\"", b"\"\xc3\""]
        {
            assert!(skip(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        // A long string crosses the vector rounds: a control character deep inside is found.
        let mut long = format!("\"{}\"", "x".repeat(1000)).into_bytes();
        assert!(skip(&long).is_ok());
        long[700] = 0x01;
        assert_eq!(skip(&long), Err(ScanError { at: 700, what: "control character (\\u0000-\\u001F) found while parsing a string" }));
    }

    #[test]
    fn values_keep_json_rules() {
        for good in ["0", "-0", "12.5e-3", "1E+2", "true", "null", "[]", "{}", "[1, [2, {\"a\": [false]}]]", " {\"a\" : 1 } "] {
            assert!(skip(good.as_bytes()).is_ok(), "{good}");
        }
        for bad in
            ["01", "1.", ".5", "-", "1e", "+1", "tru", "nul", "[1,]", "[1 2]", "{\"a\" 1}", "{\"a\":1,}", "{1:2}", "[", "{", "1 2", "'a'"]
        {
            assert!(skip(bad.as_bytes()).is_err(), "{bad}");
        }
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(skip(deep(MAX_DEPTH).as_bytes()).is_ok());
        assert_eq!(skip(deep(MAX_DEPTH + 1).as_bytes()).map_err(|e| e.what), Err("recursion limit exceeded"));
        // Far deeper: refused, not a stack overflow.
        assert!(skip(deep(1_000_000).as_bytes()).is_err());
    }

    #[test]
    fn errors_name_line_and_column() {
        let text = b"{\n  \"a\": tru\n}";
        let e = skip(text).expect_err("not json");
        assert_eq!(e.describe(text), "expected value at line 2 column 8");
    }

    #[test]
    fn media_parts_are_counted_in_any_protocol() {
        let chat = r#"[{"role":"user","content":[{"type":"text","text":"an image and a file"},{"type":"image_url","image_url":{"url":"https://x/1.png"}},{"type":"file","file":{"file_id":"f1"}}]}]"#;
        assert_eq!(media(chat), MediaCount { images: 1, files: 1 });
        let responses = r#"[{"role":"user","content":[{"type":"input_image","image_url":"u"},{"type":"input_file","file_id":"f"},{"type":"input_image","file_id":"g"}]}]"#;
        assert_eq!(media(responses), MediaCount { images: 2, files: 1 });
        let messages = r#"[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}},{"type":"document","source":{"type":"file","file_id":"d"}}]}]"#;
        assert_eq!(media(messages), MediaCount { images: 1, files: 2 }, "a document's file source is a file part too, as before");
        let gemini = r#"[{"parts":[{"fileData":{"fileUri":"gs://a","mimeType":"image/png"}},{"file_data":{"file_uri":"b"}},{"inlineData":{"mimeType":"image/png","data":"AAAA","type":"image"}}]}]"#;
        assert_eq!(media(gemini), MediaCount { images: 0, files: 2 }, "inline data is in the body: not counted, not walked");
        assert_eq!(media(r#"[{"type":{"type":"image"}}]"#), MediaCount::default(), "a type that is not a string is not walked");
        assert_eq!(
            media(r#"[{"typ\u0065":"imag\u0065_url"}]"#),
            MediaCount { images: 1, files: 0 },
            "escapes are read as serde reads them"
        );
        assert_eq!(media(r#""image_url""#), MediaCount::default());
        assert_eq!(media(r#"[{"content":"type: image, file, document"}]"#), MediaCount::default(), "words in text are not parts");
    }

    /// A JSON text with strings that stress the scan: escapes, quotes, non-ASCII, long runs.
    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let text = prop_oneof![any::<String>(), "[a\"\\\\\u{e9}\u{1F600}\n\t ]{0,80}", "x{30,70}"];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            text.prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z\"\\\\]{0,6}", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Every text serde_json writes is accepted, pretty or not.
        #[test]
        fn what_serde_writes_is_json(v in arb_json(), pretty in any::<bool>()) {
            let text = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.expect("json");
            prop_assert!(skip(&text).is_ok(), "{}", String::from_utf8_lossy(&text));
        }

        /// Cut, or with one byte changed, a text is accepted exactly when serde_json accepts it.
        #[test]
        fn accepted_exactly_when_serde_accepts(v in arb_json(), cut in any::<prop::sample::Index>(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let text = serde_json::to_vec(&v).expect("json");
            let cut_text = &text[..cut.index(text.len() + 1)];
            let mut changed = text.clone();
            if !changed.is_empty() {
                let i = at.index(changed.len());
                changed[i] = byte;
            }
            for t in [cut_text, &changed[..]] {
                let serde_ok = serde_json::from_slice::<serde::de::IgnoredAny>(t).is_ok() && std::str::from_utf8(t).is_ok();
                prop_assert_eq!(skip(t).is_ok(), serde_ok, "{}", String::from_utf8_lossy(t));
            }
        }

        /// Arbitrary bytes: an answer, never a panic.
        #[test]
        fn any_bytes_are_answered(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = skip(&bytes);
        }
    }
}
