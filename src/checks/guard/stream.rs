//! Output guardrails on an answer as it streams: each event's text delta read with what came
//! before it on its channel (a choice, a content block) over a bounded look-behind window, so a
//! match split across chunks is still found, and an event held only until [`WINDOW`] bytes of
//! text follow it on its channel (or the stream ends) — never the whole answer.
//!
//! A match of a `block` guardrail ends the stream with the client protocol's own error event;
//! a `mask` rewrites the held events' deltas (the placeholder in the first, the rest of the
//! match taken out of the others); a `monitor` notes it. A guardrail that restores puts back
//! what it masked in the request where the model echoes a placeholder.

use super::events::{completes, data_of, event_end, rewrite, spot, Spot};
pub use super::events::{error_event, Dialect};
use super::{Applied, Guardrail, Masks, Noted};
use crate::observe::metrics::Metrics;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// The look-behind: text held on a channel until this many bytes follow it, and kept after it
/// is sent to be read with what comes next. A match longer than this may be cut in two.
pub const WINDOW: usize = 512;

/// How far back into what was sent a match under way is looked for (a match that began
/// further back was sent in part already).
const LIVE_LOOK_BACK: usize = 64;

struct Held {
    raw: Vec<u8>,
    spot: Option<Spot>,
    /// The parsed data, when it is rewritten.
    data: Option<Value>,
}

/// Text sent on a channel, its last [`WINDOW`] bytes.
struct Channel {
    id: u32,
    tail: String,
}

/// What feeding a chunk gave: the bytes to send now, and whether a guardrail blocked the
/// answer (then `out` ends with the error event and nothing more is to be sent).
pub struct Fed {
    pub out: Vec<u8>,
    pub blocked: Option<String>,
}

/// The output guardrails of one answer.
pub struct OutputGuard {
    /// Every guardrail of the call (a whole answer is read by those of the output phase,
    /// webhooks too).
    applied: Applied,
    /// Those read as a stream flows: built in and the operator's patterns.
    guards: Vec<Arc<Guardrail>>,
    restore: Vec<(String, String)>,
    dialect: Option<Dialect>,
    model: String,
    buf: Vec<u8>,
    held: VecDeque<Held>,
    channels: Vec<Channel>,
    pub noted: Vec<Noted>,
    /// The placeholders of what the answer's masks took out.
    masks: Masks,
    /// Each guardrail's walk cache (for where a match may be under way).
    caches: Vec<Option<regex_automata::hybrid::dfa::Cache>>,
    blocked: bool,
    /// The guardrails a service reads, on a stream: segment by segment.
    segments: Option<super::segments::Segments>,
}

enum Scanned {
    Done,
    Again,
    Blocked(String),
}

impl OutputGuard {
    /// The output guardrails of `applied` and what `masks` restores; None when there is
    /// nothing to do. `dialect`: the event stream the client reads, when it streams.
    pub fn new(applied: &Applied, masks: &Masks, dialect: Option<Dialect>, model: &str) -> Option<OutputGuard> {
        let guards: Vec<Arc<Guardrail>> = applied.0.iter().filter(|g| g.phase.output() && g.local()).cloned().collect();
        if !applied.0.iter().any(|g| g.phase.output()) && masks.restore.is_empty() {
            return None;
        }
        let caches = guards
            .iter()
            .map(|g| match &g.detector {
                super::Detector::Patterns(m) => Some(m.cache()),
                _ => None,
            })
            .collect();
        Some(OutputGuard {
            applied: applied.clone(),
            guards,
            restore: masks.restore.clone(),
            dialect,
            model: model.to_string(),
            buf: Vec::new(),
            held: VecDeque::new(),
            channels: Vec::new(),
            noted: Vec::new(),
            masks: Masks::default(),
            caches,
            blocked: false,
            segments: dialect.and_then(|_| super::segments::Segments::new(applied)),
        })
    }

    /// A chunk of a streamed answer (empty with the `end`): through the local guardrails, then
    /// the segments a service reads. What to send now, and whether the answer was refused (then
    /// the output ends with the protocol's error event and nothing more is to be sent).
    pub async fn relay(&mut self, chunk: &[u8], end: bool, call: &super::Call<'_>, metrics: &Metrics) -> Fed {
        let fed = match chunk.is_empty() {
            true => Fed { out: Vec::new(), blocked: None },
            false => self.feed(chunk, metrics),
        };
        if fed.blocked.is_some() || self.blocked {
            return fed;
        }
        let mut out = fed.out;
        if end {
            out.extend(self.finish());
        }
        let (Some(segments), Some(dialect)) = (self.segments.as_mut(), self.dialect) else { return Fed { out, blocked: None } };
        let passed = segments.pass(dialect, out, end, call, metrics).await;
        for n in std::mem::take(&mut segments.noted) {
            match self.noted.iter_mut().find(|m| m.guardrail == n.guardrail && m.action == n.action) {
                Some(m) => n.categories.into_iter().for_each(|c| {
                    if !m.categories.contains(&c) {
                        m.categories.push(c);
                    }
                }),
                None => self.noted.push(n),
            }
        }
        match passed {
            Ok(out) => Fed { out, blocked: None },
            Err(refusal) => {
                self.blocked = true;
                let name = match &refusal {
                    super::Refusal::Blocked { guardrail, .. } | super::Refusal::Unavailable { guardrail } => guardrail.clone(),
                };
                let mut out = error_event(dialect, &refusal.error(), &self.model);
                out.append(&mut segments.ended);
                Fed { out, blocked: Some(name) }
            }
        }
    }

    /// What to restore from now on: `masks`' placeholders of the guardrails that restore (a
    /// realtime session's, which grow as its client events are masked).
    pub fn restore_from(&mut self, masks: &Masks) {
        self.restore.clone_from(&masks.restore);
    }

    /// Whether it reads a stream (an SSE answer in a known dialect) event by event.
    pub fn streams(&self) -> bool {
        self.dialect.is_some()
    }

    /// A chunk of the answer's bytes as the client would get them.
    pub fn feed(&mut self, chunk: &[u8], metrics: &Metrics) -> Fed {
        let mut out = Vec::new();
        if self.blocked {
            return Fed { out, blocked: None };
        }
        self.buf.extend_from_slice(chunk);
        while let Some(end) = event_end(&self.buf) {
            let raw: Vec<u8> = self.buf.drain(..end).collect();
            if let Some(blocked) = self.event(raw, metrics) {
                self.blocked = true;
                out.extend(self.error_event(&blocked));
                return Fed { out, blocked: Some(blocked) };
            }
            self.release(false, &mut out);
        }
        Fed { out, blocked: None }
    }

    /// The data of each event in `out` (what [`feed`](Self::feed) and [`finish`](Self::finish)
    /// give): a realtime session sends each as a frame of its own.
    pub fn events(out: &[u8]) -> impl Iterator<Item = &[u8]> {
        out.split(|b| *b == b'\n').filter_map(|line| line.strip_prefix(b"data: ").or_else(|| line.strip_prefix(b"data:")))
    }

    /// The stream ended: everything held, and what was left of a last event.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.blocked {
            return out;
        }
        self.release(true, &mut out);
        out.append(&mut self.buf);
        out
    }

    fn event(&mut self, raw: Vec<u8>, metrics: &Metrics) -> Option<String> {
        let dialect = self.dialect?;
        let mut data = data_of(&raw).and_then(|d| serde_json::from_slice::<Value>(d).ok());
        let spot = data.as_ref().and_then(|v| spot(dialect, v));
        match (spot, &mut data) {
            (Some(spot), _) => {
                let channel = spot.channel;
                self.held.push_back(Held { raw, spot: Some(spot), data });
                self.scan(channel, metrics)
            }
            (None, Some(v)) if matches!(dialect, Dialect::Responses | Dialect::Realtime) && completes(v) => {
                // A responses stream (and a realtime session) repeats the whole text when a part,
                // an item or the response is done: masked and restored as a whole answer is.
                // A realtime session goes on after a blocked answer: its closing events pass on
                // with what a block found masked (the deltas' read blocked it).
                let (changed, blocked) = self.whole(v, metrics, dialect != Dialect::Realtime);
                if let Some(blocked) = blocked {
                    return Some(blocked);
                }
                let raw = match changed {
                    true => rewrite(&raw, v),
                    false => raw,
                };
                self.held.push_back(Held { raw, spot: None, data: None });
                None
            }
            _ => {
                self.held.push_back(Held { raw, spot: None, data: None });
                None
            }
        }
    }

    /// Read a channel's held text with its tail; act on what is found there (again after a
    /// mask, which moved the spans; a few times at most, should a pattern match a placeholder).
    fn scan(&mut self, channel: u32, metrics: &Metrics) -> Option<String> {
        for _ in 0..4 {
            match self.scan_once(channel, metrics) {
                Scanned::Again => continue,
                Scanned::Blocked(name) => return Some(name),
                Scanned::Done => return None,
            }
        }
        None
    }

    fn scan_once(&mut self, channel: u32, metrics: &Metrics) -> Scanned {
        let tail = self.channels.iter().find(|c| c.id == channel).map(|c| c.tail.clone()).unwrap_or_default();
        let mut hay = tail.clone();
        let mut bounds: Vec<(usize, usize, usize)> = Vec::new();
        for (i, h) in self.held.iter().enumerate() {
            if let Some(s) = h.spot.as_ref().filter(|s| s.channel == channel) {
                bounds.push((i, hay.len(), hay.len() + s.text.len()));
                hay.push_str(&s.text);
            }
        }
        let guards = self.guards.clone();
        for g in &guards {
            let started = Instant::now();
            let super::Detector::Patterns(matcher) = &g.detector else { continue };
            let found: Vec<_> = matcher.find(&hay).into_iter().filter(|f| f.end > tail.len()).collect();
            if found.is_empty() {
                continue;
            }
            let categories = categories(&found);
            let fresh = self.note(g, categories);
            if fresh {
                metrics.guardrail(&g.name, "output", g.action.label(), started.elapsed());
            }
            match g.action {
                super::Action::Block => return Scanned::Blocked(g.name.clone()),
                super::Action::Monitor => {}
                super::Action::Mask => {
                    for f in found.iter().rev() {
                        let placeholder = self.masks.placeholder(&f.category, &hay[f.start..f.end], false);
                        self.replace(&bounds, f.start.max(tail.len()), f.end, &placeholder);
                    }
                    return Scanned::Again;
                }
            }
        }
        if !self.restore.is_empty() {
            self.gather_placeholders(&tail, &hay, &bounds);
        }
        self.mark_safe(&tail, &hay, &bounds);
        Scanned::Done
    }

    /// Mark the held events whose text lies wholly before the earliest place where a match of
    /// a guardrail (or a placeholder to restore) may be under way: they may go now. A match
    /// that began more than a few bytes back in what was sent is not waited for.
    fn mark_safe(&mut self, tail: &str, hay: &str, bounds: &[(usize, usize, usize)]) {
        let mut from = tail.len().saturating_sub(LIVE_LOOK_BACK);
        while !hay.is_char_boundary(from) {
            from -= 1;
        }
        let mut live = hay.len();
        for (g, cache) in self.guards.iter().zip(self.caches.iter_mut()) {
            if let (super::Detector::Patterns(matcher), Some(cache)) = (&g.detector, cache.as_mut()) {
                live = live.min(matcher.live_from(cache, hay, from));
            }
        }
        // A placeholder to restore whose start came but not yet its end.
        if let Some(at) = hay.rfind('[') {
            if self.restore.iter().any(|(p, _)| p.len() > hay.len() - at && p.starts_with(&hay[at..])) {
                live = live.min(at);
            }
        }
        for &(i, _, to) in bounds {
            if let Some(spot) = self.held[i].spot.as_mut() {
                spot.safe = to <= live;
            }
        }
    }

    /// Replace hay[start..end) (within the held text) by `with`: in the first held event it
    /// touches; taken out of the others.
    fn replace(&mut self, bounds: &[(usize, usize, usize)], start: usize, end: usize, with: &str) {
        let mut first = true;
        for &(i, from, to) in bounds {
            if to <= start || from >= end {
                continue;
            }
            let Some(spot) = self.held[i].spot.as_mut() else { continue };
            let (a, b) = (start.max(from) - from, end.min(to) - from);
            let (Some(_), Some(_)) = (spot.text.get(..a), spot.text.get(b..)) else { continue };
            let replacement = if first { with } else { "" };
            spot.text.replace_range(a..b, replacement);
            spot.changed = true;
            first = false;
        }
    }

    /// A placeholder split over two held events is moved whole into the first, so it is
    /// restored where it is sent.
    fn gather_placeholders(&mut self, tail: &str, hay: &str, bounds: &[(usize, usize, usize)]) {
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for (placeholder, _) in &self.restore {
            let mut from = tail.len().saturating_sub(placeholder.len());
            while let Some(at) = hay.get(from..).and_then(|h| h.find(placeholder.as_str())) {
                let start = from + at;
                spans.push((start, start + placeholder.len()));
                from = start + placeholder.len();
            }
        }
        spans.sort_unstable();
        for (start, end) in spans.into_iter().rev() {
            let split = bounds.iter().any(|&(_, from, to)| start >= from && start < to && end > to);
            if split && start >= tail.len() {
                let whole = hay[start..end].to_string();
                self.replace(bounds, start, end, &whole);
            }
        }
    }

    /// Send the held events that may go: each with [`WINDOW`] bytes after it on its channel
    /// (all of them at the end).
    fn release(&mut self, all: bool, out: &mut Vec<u8>) {
        while let Some(front) = self.held.front() {
            if !all {
                if let Some(spot) = front.spot.as_ref().filter(|s| !s.safe) {
                    let after: usize = self
                        .held
                        .iter()
                        .skip(1)
                        .filter_map(|h| h.spot.as_ref())
                        .filter(|s| s.channel == spot.channel)
                        .map(|s| s.text.len())
                        .sum();
                    if after < WINDOW {
                        return;
                    }
                }
            }
            let Some(held) = self.held.pop_front() else { return };
            self.send(held, out);
        }
    }

    fn send(&mut self, held: Held, out: &mut Vec<u8>) {
        let Some(mut spot) = held.spot else {
            out.extend_from_slice(&held.raw);
            return;
        };
        // The tail keeps the text as the model wrote it, placeholders not restored.
        let channel = match self.channels.iter().position(|c| c.id == spot.channel) {
            Some(i) => i,
            None => {
                self.channels.push(Channel { id: spot.channel, tail: String::new() });
                self.channels.len() - 1
            }
        };
        let tail = &mut self.channels[channel].tail;
        tail.push_str(&spot.text);
        if tail.len() > WINDOW {
            let mut cut = tail.len() - WINDOW;
            while !tail.is_char_boundary(cut) {
                cut += 1;
            }
            tail.drain(..cut);
        }
        for (placeholder, original) in &self.restore {
            if spot.text.contains(placeholder.as_str()) {
                spot.text = spot.text.replace(placeholder.as_str(), original);
                spot.changed = true;
            }
        }
        if !spot.changed {
            out.extend_from_slice(&held.raw);
            return;
        }
        let Some(mut data) = held.data else {
            out.extend_from_slice(&held.raw);
            return;
        };
        if let Some(slot) = data.pointer_mut(&spot.pointer) {
            *slot = Value::String(spot.text);
        }
        out.extend(rewrite(&held.raw, &data));
    }

    /// Note what a guardrail found (once per guardrail and category in an answer); whether it
    /// is new.
    fn note(&mut self, g: &Guardrail, categories: Vec<String>) -> bool {
        if let Some(n) = self.noted.iter_mut().find(|n| n.guardrail == g.name) {
            let before = n.categories.len();
            for c in categories {
                if !n.categories.contains(&c) {
                    n.categories.push(c);
                }
            }
            return n.categories.len() > before;
        }
        self.noted.push(Noted { guardrail: g.name.clone(), phase: "output", action: g.action.label(), categories });
        true
    }

    /// A whole answer (its JSON): read by every output guardrail (webhooks too, as
    /// [`super::screen`] reads a request), then what the request's masks took out restored.
    /// Whether a text changed; the refusal when one blocks it.
    pub async fn answer(&mut self, call: &super::Call<'_>, value: &mut Value, metrics: &Metrics) -> Result<bool, super::Refusal> {
        let mut screening = super::Screening { masks: std::mem::take(&mut self.masks), ..Default::default() };
        let mut texts = super::texts_of(value);
        let screened = super::screen(&self.applied, true, call, &mut texts, &mut screening, metrics).await;
        self.noted.append(&mut screening.noted);
        self.masks = screening.masks;
        let mut changed = screened?;
        for text in texts.iter_mut() {
            for (placeholder, original) in &self.restore {
                if text.contains(placeholder.as_str()) {
                    **text = text.replace(placeholder.as_str(), original);
                    changed = true;
                }
            }
        }
        Ok(changed)
    }

    /// Mask and restore the texts of a responses stream's closing event
    /// with the guardrails read as a stream flows; whether a text changed, and the guardrail
    /// that blocks it (`blocking` false: what a block finds is masked instead).
    fn whole(&mut self, value: &mut Value, metrics: &Metrics, blocking: bool) -> (bool, Option<String>) {
        let mut changed = false;
        let guards = self.guards.clone();
        let mut texts = super::texts_of(value);
        for g in &guards {
            let started = Instant::now();
            let super::Detector::Patterns(matcher) = &g.detector else { continue };
            let mut all = Vec::new();
            for text in texts.iter_mut() {
                let found = matcher.find(text);
                if found.is_empty() {
                    continue;
                }
                all.extend(found.iter().map(|f| f.category.clone()));
                if g.action == super::Action::Mask || (g.action == super::Action::Block && !blocking) {
                    **text = self.masks.mask(text, &found, false);
                    changed = true;
                }
            }
            if all.is_empty() {
                continue;
            }
            all.sort();
            all.dedup();
            if self.note(g, all) {
                metrics.guardrail(&g.name, "output", g.action.label(), started.elapsed());
            }
            if g.action == super::Action::Block && blocking {
                return (changed, Some(g.name.clone()));
            }
        }
        for text in texts.iter_mut() {
            for (placeholder, original) in &self.restore {
                if text.contains(placeholder.as_str()) {
                    **text = text.replace(placeholder.as_str(), original);
                    changed = true;
                }
            }
        }
        (changed, None)
    }

    /// The client protocol's own error event for an answer a guardrail blocked.
    fn error_event(&self, guardrail: &str) -> Vec<u8> {
        let err = super::Refusal::Blocked { guardrail: guardrail.to_string(), output: true }.error();
        error_event(self.dialect.unwrap_or(Dialect::Chat), &err, &self.model)
    }
}

fn categories(found: &[super::recognise::Found]) -> Vec<String> {
    let mut list: Vec<String> = found.iter().map(|f| f.category.clone()).collect();
    list.sort();
    list.dedup();
    list
}
