//! A stored answer replayed to a client: the same bytes it would have received, with the
//! answer's own id made new where the protocol wants ids unique (chat completions' `chatcmpl-…`,
//! messages' `msg_…`, responses' `resp_…`, generate-content's `responseId`) — every occurrence
//! of the stored id, in every event, replaced by one fresh id of the same prefix. Pure.

use super::entry::Body;

/// The members that carry an answer's own id, in the order they are looked for.
const ID_MEMBERS: [&[u8]; 2] = [b"\"id\":\"", b"\"responseId\":\""];

/// The answer's own id: the first id member's value in its first bytes.
fn stored_id(first: &[u8]) -> Option<&[u8]> {
    ID_MEMBERS.iter().find_map(|member| {
        let start = memchr::memmem::find(first, member)? + member.len();
        let len = memchr::memchr(b'"', &first[start..])?;
        Some(&first[start..start + len]).filter(|id| !id.is_empty() && !id.contains(&b'\\'))
    })
}

/// Where the part of `old` made new starts: after its prefix (up to its last `-` or `_`).
fn tail_start(old: &[u8]) -> usize {
    old.iter().rposition(|b| *b == b'-' || *b == b'_').map_or(0, |i| i + 1)
}

/// `body` with its own id made new: the id's prefix kept and the rest replaced by `fresh(n)`,
/// `n` characters (random letters and digits) — the same length, so a stream's event ends do
/// not move and the bytes are changed in place.
pub fn refresh_id(body: &mut Body, fresh: impl FnOnce(usize) -> String) {
    // The first id member of the bytes is the first event's that carries one.
    let Some(old) = stored_id(body.bytes()).map(<[u8]>::to_vec) else { return };
    let cut = tail_start(&old);
    let tail = fresh(old.len() - cut);
    if tail.len() != old.len() - cut {
        return;
    }
    let new = [&old[..cut], tail.as_bytes()].concat();
    let bytes = match body {
        Body::Whole(b) | Body::Events { bytes: b, .. } => b,
    };
    let at: Vec<usize> = memchr::memmem::find_iter(bytes, &old).collect();
    for i in at {
        bytes[i..i + new.len()].copy_from_slice(&new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_own_id_is_made_new_everywhere_in_place_and_nothing_else_changes() {
        let mut stream = Body::events_of([
            &b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01AbC\",\"model\":\"m\"}}\n\n"[..],
            b"data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"msg_01AbC is my id\"}}\n\n",
        ]);
        let ends = match &stream {
            Body::Events { ends, .. } => ends.clone(),
            Body::Whole(_) => unreachable!(),
        };
        refresh_id(&mut stream, |n| "Z".repeat(n));
        let events = stream.events();
        assert!(String::from_utf8_lossy(events[0]).contains("\"id\":\"msg_ZZZZZ\""), "{:?}", String::from_utf8_lossy(events[0]));
        assert_eq!(events[1], b"data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"msg_ZZZZZ is my id\"}}\n\n");
        assert!(matches!(&stream, Body::Events { ends: e, .. } if *e == ends), "the events end where they did");
        let mut chat = Body::Whole(br#"{"id":"chatcmpl-9xYz","object":"chat.completion","choices":[]}"#.to_vec());
        refresh_id(&mut chat, |n| "A".repeat(n));
        assert_eq!(chat, Body::Whole(br#"{"id":"chatcmpl-AAAA","object":"chat.completion","choices":[]}"#.to_vec()));
        let mut gemini = Body::Whole(br#"{"candidates":[],"responseId":"r1x"}"#.to_vec());
        refresh_id(&mut gemini, |n| "B".repeat(n));
        assert_eq!(gemini, Body::Whole(br#"{"candidates":[],"responseId":"BBB"}"#.to_vec()));
        let none = Body::Whole(br#"{"object":"list"}"#.to_vec());
        let mut same = none.clone();
        refresh_id(&mut same, |n| "C".repeat(n));
        assert_eq!(same, none);
    }
}
