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

/// A fresh id for `old`: its prefix (up to its last `-` or `_`) and `fresh`.
fn fresh_id(old: &[u8], fresh: &str) -> Vec<u8> {
    let cut = old.iter().rposition(|b| *b == b'-' || *b == b'_').map_or(0, |i| i + 1);
    [&old[..cut], fresh.as_bytes()].concat()
}

/// `body` with its own id replaced by a new one made of `fresh` (random letters and digits).
pub fn with_fresh_id(body: &Body, fresh: &str) -> Body {
    let first = match body {
        Body::Whole(b) => b.as_slice(),
        Body::Events(events) => events.iter().find(|e| stored_id(e).is_some()).map_or(&[][..], Vec::as_slice),
    };
    let Some(old) = stored_id(first) else { return body.clone() };
    let (old, new) = (old.to_vec(), fresh_id(old, fresh));
    let swap = |bytes: &[u8]| crate::base::text::replace_all(bytes, &old, &new).unwrap_or_else(|| bytes.to_vec());
    match body {
        Body::Whole(b) => Body::Whole(swap(b)),
        Body::Events(events) => Body::Events(events.iter().map(|e| swap(e)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_own_id_is_made_new_everywhere_and_nothing_else_changes() {
        let stream = Body::Events(vec![
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01AbC\",\"model\":\"m\"}}\n\n".to_vec(),
            b"data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"msg_01AbC is my id\"}}\n\n".to_vec(),
        ]);
        let Body::Events(fresh) = with_fresh_id(&stream, "Zz9") else { panic!("events") };
        assert!(
            fresh[0].windows(10).any(|w| w == b"\"msg_Zz9\",") && !fresh[0].windows(9).any(|w| w == b"msg_01AbC"),
            "{:?}",
            String::from_utf8_lossy(&fresh[0])
        );
        assert_eq!(fresh[1], b"data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"msg_Zz9 is my id\"}}\n\n".to_vec());
        let chat = Body::Whole(br#"{"id":"chatcmpl-9xYz","object":"chat.completion","choices":[]}"#.to_vec());
        assert_eq!(with_fresh_id(&chat, "AAA"), Body::Whole(br#"{"id":"chatcmpl-AAA","object":"chat.completion","choices":[]}"#.to_vec()));
        let gemini = Body::Whole(br#"{"candidates":[],"responseId":"r1x"}"#.to_vec());
        assert_eq!(with_fresh_id(&gemini, "B"), Body::Whole(br#"{"candidates":[],"responseId":"B"}"#.to_vec()));
        let none = Body::Whole(br#"{"object":"list"}"#.to_vec());
        assert_eq!(with_fresh_id(&none, "C"), none);
    }
}
