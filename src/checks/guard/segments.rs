//! The guardrails a service reads (a webhook, a moderation model, a cloud's guardrail) on a
//! streamed answer: what the local stage ([`super::stream::OutputGuard`]) lets go is held in
//! segments — until an event that ends a sentence (`.`, `!`, `?`, a new line) comes past
//! [`SENTENCE`] bytes of text, [`SEGMENT`] bytes at most, or the stream ends — and each segment is asked about once before it is sent, one text per
//! channel (a choice, a content block). A block drops the segment and ends the stream with the
//! protocol's error event; a mask puts each channel's replacement in its first event (and the
//! same change in a responses stream's closing events, which repeat the text); a monitor notes.
//! What a segment waits for is its own round trip: never the whole answer.

use super::events::{completes, data_of, event_end, rewrite, spot, Dialect};
use super::{screen, Applied, Call, Noted, Screening};
use crate::observe::metrics::Metrics;
use serde_json::Value;

/// The most text held for one check.
pub const SEGMENT: usize = 512;
/// A segment is checked where a sentence ends once it holds this much text.
pub const SENTENCE: usize = 96;

/// The text of one held event.
struct Piece {
    /// Its index among the held events.
    event: usize,
    channel: u32,
    pointer: String,
}

pub(super) struct Segments {
    /// The output guardrails a service reads.
    applied: Applied,
    held: Vec<Vec<u8>>,
    pieces: Vec<Piece>,
    /// Each channel's text held, in the order channels came.
    texts: Vec<(u32, String)>,
    /// (what a mask changed, what it became), for the closing events that repeat the text.
    masked: Vec<(String, String)>,
    pub noted: Vec<Noted>,
    /// A realtime session's `response.done` held when its answer was blocked: it still ends
    /// the turn, its texts emptied.
    pub ended: Vec<u8>,
}

impl Segments {
    /// None when no guardrail of `applied` that reads output is read by a service.
    pub fn new(applied: &Applied) -> Option<Segments> {
        let remote: Vec<_> = applied.0.iter().filter(|g| g.phase.output() && !g.local()).cloned().collect();
        (!remote.is_empty()).then(|| Segments {
            applied: Applied(remote),
            held: Vec::new(),
            pieces: Vec::new(),
            texts: Vec::new(),
            masked: Vec::new(),
            noted: Vec::new(),
            ended: Vec::new(),
        })
    }

    fn held_text(&self) -> usize {
        self.texts.iter().map(|(_, t)| t.len()).sum()
    }

    /// Whole events (`out`; at the `end`, the last may be cut) as the local stage let them go:
    /// what may be sent now, or why the answer is refused (what was held is then dropped).
    pub async fn pass(
        &mut self,
        dialect: Dialect,
        out: Vec<u8>,
        end: bool,
        call: &Call<'_>,
        metrics: &Metrics,
    ) -> Result<Vec<u8>, super::Refusal> {
        let mut sent = Vec::new();
        let mut rest: &[u8] = &out;
        while !rest.is_empty() {
            let at = event_end(rest).unwrap_or(rest.len());
            let (raw, after) = rest.split_at(at);
            rest = after;
            let mut data = data_of(raw).and_then(|d| serde_json::from_slice::<Value>(d).ok());
            let mut sentence = false;
            match data.as_ref().and_then(|v| spot(dialect, v)) {
                Some(s) => {
                    sentence = s.text.contains(['.', '!', '?', '\n']);
                    self.pieces.push(Piece { event: self.held.len(), channel: s.channel, pointer: s.pointer });
                    match self.texts.iter_mut().find(|(c, _)| *c == s.channel) {
                        Some((_, text)) => text.push_str(&s.text),
                        None => self.texts.push((s.channel, s.text)),
                    }
                    self.held.push(raw.to_vec());
                }
                None => {
                    let raw = match data.as_mut().filter(|v| !self.masked.is_empty() && completes(v)) {
                        Some(v) => self.remask(raw, v),
                        None => raw.to_vec(),
                    };
                    match self.held.is_empty() {
                        true => sent.extend(raw),
                        false => self.held.push(raw),
                    }
                }
            }
            let text = self.held_text();
            if text >= SEGMENT || (text >= SENTENCE && sentence) {
                self.check(call, metrics).await?;
                sent.append(&mut self.flush());
            }
        }
        if end {
            if self.held_text() > 0 {
                self.check(call, metrics).await?;
            }
            sent.append(&mut self.flush());
        }
        Ok(sent)
    }

    /// Ask about the held texts; a mask's replacements put in the held events.
    async fn check(&mut self, call: &Call<'_>, metrics: &Metrics) -> Result<(), super::Refusal> {
        let originals: Vec<String> = self.texts.iter().map(|(_, t)| t.clone()).collect();
        let mut screening = Screening::default();
        let mut refs: Vec<&mut String> = self.texts.iter_mut().map(|(_, t)| t).collect();
        let screened = screen(&self.applied, true, call, &mut refs, &mut screening, metrics).await;
        // Merged into the answer's notes by the output guard.
        self.noted.extend(screening.noted);
        match screened {
            Err(refusal) => {
                for raw in &self.held {
                    let done = data_of(raw).and_then(|d| serde_json::from_slice::<Value>(d).ok()).filter(|v| v["type"] == "response.done");
                    if let Some(mut v) = done {
                        let items = v.pointer_mut("/response/output").and_then(Value::as_array_mut).into_iter().flatten();
                        for part in items.filter_map(|i| i.get_mut("content").and_then(Value::as_array_mut)).flatten() {
                            for field in ["text", "transcript"] {
                                if let Some(t) = part.get_mut(field).filter(|t| t.is_string()) {
                                    *t = Value::String(String::new());
                                }
                            }
                        }
                        self.ended = rewrite(raw, &v);
                    }
                }
                self.held.clear();
                self.pieces.clear();
                self.texts.clear();
                Err(refusal)
            }
            Ok(false) => Ok(()),
            Ok(true) => {
                for (i, (channel, text)) in self.texts.iter().enumerate() {
                    if *text == originals[i] {
                        continue;
                    }
                    self.masked.push((originals[i].clone(), text.clone()));
                    let mut first = true;
                    for piece in self.pieces.iter().filter(|p| p.channel == *channel) {
                        let raw = &self.held[piece.event];
                        let Some(mut v) = data_of(raw).and_then(|d| serde_json::from_slice::<Value>(d).ok()) else { continue };
                        if let Some(slot) = v.pointer_mut(&piece.pointer) {
                            *slot = Value::String(if first { text.clone() } else { String::new() });
                        }
                        first = false;
                        self.held[piece.event] = rewrite(raw, &v);
                    }
                }
                // Closing events held behind the text repeat it: changed the same way.
                for i in 0..self.held.len() {
                    if self.pieces.iter().any(|p| p.event == i) {
                        continue;
                    }
                    let raw = &self.held[i];
                    if let Some(mut v) = data_of(raw).and_then(|d| serde_json::from_slice::<Value>(d).ok()).filter(completes) {
                        self.held[i] = self.remask(raw, &mut v);
                    }
                }
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> Vec<u8> {
        self.pieces.clear();
        self.texts.clear();
        self.held.drain(..).flatten().collect()
    }

    /// A closing event that repeats the text: what the masks changed, changed in it too.
    fn remask(&self, raw: &[u8], v: &mut Value) -> Vec<u8> {
        let mut changed = false;
        for text in super::texts_of(v) {
            for (from, to) in &self.masked {
                if !from.is_empty() && text.contains(from.as_str()) {
                    *text = text.replace(from.as_str(), to);
                    changed = true;
                }
            }
        }
        match changed {
            true => rewrite(raw, v),
            false => raw.to_vec(),
        }
    }
}
