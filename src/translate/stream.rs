//! A translated stream, event by event: the provider's SSE bytes are read into internal
//! [`Event`]s as they arrive and written at once in the client's protocol. Nothing waits for
//! the end but what the client's protocol itself puts there (the messages protocol's final
//! usage, the chat-completions usage chunk, generate-content's finishing chunk).

use super::sse::{SseEvent, SseReader};
use super::{chat, gemini, messages, responses, Dialect, Event, Translation};
use crate::config::Protocol;

enum Decoder {
    Chat(chat::Decoder),
    Messages(messages::Decoder),
    Gemini(gemini::Decoder),
}

enum Encoder {
    Chat(chat::Encoder),
    Messages(messages::Encoder),
    Gemini(gemini::Encoder),
    Responses(responses::Encoder),
}

impl Encoder {
    /// One internal event in the client's protocol.
    fn event(&mut self, e: Event, out: &mut Vec<u8>) {
        match self {
            Encoder::Chat(enc) => enc.event(e, out),
            Encoder::Messages(enc) => enc.event(e, out),
            Encoder::Gemini(enc) => enc.event(e, out),
            Encoder::Responses(enc) => enc.event(e, out),
        }
    }
}

pub struct StreamTranslator {
    reader: SseReader,
    decoder: Decoder,
    encoder: Encoder,
    events: Vec<SseEvent>,
    decoded: Vec<Event>,
}

/// The provider's stream broke the protocol (a line longer than any event).
#[derive(Debug)]
pub struct Broken;

impl StreamTranslator {
    pub fn new(t: &Translation) -> StreamTranslator {
        StreamTranslator {
            reader: SseReader::with_limit(t.max_event_bytes),
            decoder: match t.upstream {
                Protocol::Openai => Decoder::Chat(chat::Decoder::default()),
                Protocol::Anthropic => Decoder::Messages(messages::Decoder::default()),
                Protocol::Gemini => Decoder::Gemini(gemini::Decoder::default()),
            },
            encoder: match t.client {
                Dialect::Chat => Encoder::Chat(chat::Encoder::new(t)),
                Dialect::Messages => Encoder::Messages(messages::Encoder::new(t)),
                Dialect::Gemini => Encoder::Gemini(gemini::Encoder::new(t)),
                Dialect::Responses => Encoder::Responses(responses::Encoder::new(t)),
            },
            events: Vec::new(),
            decoded: Vec::new(),
        }
    }

    /// What the client gets before the provider's first event.
    pub fn start(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        match &mut self.encoder {
            Encoder::Chat(e) => e.start(&mut out),
            Encoder::Messages(e) => e.start(&mut out),
            Encoder::Responses(e) => e.start(&mut out),
            Encoder::Gemini(_) => {}
        }
        out
    }

    /// One chunk of the provider's stream → the client's bytes for it (often none).
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<u8>, Broken> {
        self.reader.feed(chunk, &mut self.events).map_err(|_| Broken)?;
        Ok(self.drain())
    }

    /// The provider's stream broke (an event over `limits.max_event_bytes`): the client's last
    /// bytes, ending its stream with its protocol's error event.
    pub fn fail(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encoder.event(Event::Error { status: 502, message: String::new() }, &mut out);
        out
    }

    /// The provider's stream ended: the client's last bytes.
    pub fn finish(&mut self) -> Vec<u8> {
        self.reader.finish(&mut self.events);
        let mut out = self.drain();
        match &mut self.encoder {
            Encoder::Chat(e) => e.finish(&mut out),
            Encoder::Messages(e) => e.finish(&mut out),
            Encoder::Gemini(e) => e.finish(&mut out),
            Encoder::Responses(e) => e.finish(&mut out),
        }
        out
    }

    fn drain(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        for ev in self.events.drain(..) {
            match &mut self.decoder {
                Decoder::Chat(d) => d.event(&ev.data, &mut self.decoded),
                Decoder::Messages(d) => d.event(&ev.data, &mut self.decoded),
                Decoder::Gemini(d) => d.event(&ev.data, &mut self.decoded),
            }
            for e in self.decoded.drain(..) {
                self.encoder.event(e, &mut out);
            }
        }
        out
    }
}
