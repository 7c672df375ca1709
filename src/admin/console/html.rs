//! HTML of the console: escaping, the page frame, tables, amounts and times, the spend chart.
//! Everything is rendered here on the server; the one script (`console.js`) only adds the copy
//! button and the `/me` page's fetches.

use std::fmt::Write;

pub use crate::base::text::esc_html as esc;

/// A query-string component.
pub fn enc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// USD with cents, and the further digits (to a millionth) an amount of tokens needs.
pub fn money(usd: f64) -> String {
    let text = format!("{usd:.6}");
    let (whole, frac) = text.split_once('.').unwrap_or((&text, ""));
    let frac = frac.trim_end_matches('0');
    let frac = if frac.len() < 2 { format!("{frac:0<2}") } else { frac.to_string() };
    let sign = if whole.starts_with('-') { "-" } else { "" };
    format!("{sign}${}.{frac}", whole.trim_start_matches('-'))
}

/// nano-USD as [`money`].
pub fn nanos(n: i64) -> String {
    money(crate::base::money::usd(n))
}

/// The decimals that show every amount of a table (nano-USD) as [`money`] would, 2 to 6: one
/// precision for the whole table.
pub fn money_digits(amounts: impl IntoIterator<Item = i64>) -> usize {
    amounts
        .into_iter()
        .map(|n| {
            let text = format!("{:.6}", crate::base::money::usd(n));
            text.split_once('.').map_or(0, |(_, frac)| frac.trim_end_matches('0').len())
        })
        .fold(2, usize::max)
}

/// nano-USD with `digits` decimals (see [`money_digits`]).
pub fn nanos_at(n: i64, digits: usize) -> String {
    let usd = crate::base::money::usd(n);
    let sign = if usd < 0.0 { "-" } else { "" };
    format!("{sign}${:.*}", digits, usd.abs())
}

/// A count with thousands separators.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The pages of the navigation bar: (path, title).
const NAV: [(&str, &str); 12] = [
    ("/console", "Overview"),
    ("/console/keys", "Keys"),
    ("/console/accounts", "Accounts"),
    ("/console/groups", "Plans"),
    ("/console/usage", "Usage"),
    ("/console/requests", "Requests"),
    ("/console/providers", "Providers"),
    ("/console/video", "Video tasks"),
    ("/console/batches", "Batches"),
    ("/console/files", "Files"),
    ("/console/mcp", "MCP"),
    ("/console/people", "People"),
];

/// A whole signed-in page: navigation (with `current` marked), the time zone, sign-out.
pub fn page(title: &str, current: &str, csrf: &str, timezone: &str, body: &str) -> String {
    frame(&NAV, title, current, csrf, timezone, body)
}

/// A signed-in page with the navigation `pages` (a person's console has fewer pages).
pub fn frame(pages: &[(&str, &str)], title: &str, current: &str, csrf: &str, timezone: &str, body: &str) -> String {
    let mut nav = String::new();
    for (path, name) in pages.iter().copied() {
        let mark = if path == current { " aria-current=\"page\"" } else { "" };
        let _ = write!(nav, "<a href=\"{path}\"{mark}>{name}</a>");
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
<title>{title} · tollgate</title><link rel=\"stylesheet\" href=\"/console/assets/console.css\"></head><body>\
<header><strong class=\"brand\">tollgate</strong><nav>{nav}</nav><span class=\"tz\">Times in {tz}</span>\
<form method=\"post\" action=\"/console/logout\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
<button type=\"submit\">Sign out</button></form></header><main><h1>{title}</h1>{body}</main>\
<script src=\"/console/assets/console.js\"></script></body></html>",
        title = esc(title),
        tz = esc(timezone),
        csrf = esc(csrf),
    )
}

/// A page outside the signed-in frame (sign-in, refusals).
pub fn bare(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
<title>{title} · tollgate</title><link rel=\"stylesheet\" href=\"/console/assets/console.css\"></head><body class=\"bare\">\
<main><h1>{title}</h1>{body}</main><script src=\"/console/assets/console.js\"></script></body></html>",
        title = esc(title)
    )
}

/// A table: header cells, then rows of cells that are already HTML.
pub fn table(id: &str, head: &[&str], rows: &[Vec<String>], foot: Option<Vec<String>>) -> String {
    let mut out = format!("<table id=\"{id}\"><thead><tr>");
    for h in head {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(out, "<tr class=\"empty\"><td colspan=\"{}\">Nothing here.</td></tr>", head.len());
    }
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody>");
    if let Some(foot) = foot {
        out.push_str("<tfoot><tr>");
        for cell in foot {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr></tfoot>");
    }
    out.push_str("</table>");
    out
}

/// A form field with its label and, when `error` is about it, the message under it.
pub fn field(name: &str, label: &str, value: &str, error: Option<(&str, &str)>, hint: &str) -> String {
    field_of(name, label, value, error.as_slice(), hint)
}

/// A labelled input with the message of each error about it (a form's errors all at once, each
/// under its own field).
pub fn field_of(name: &str, label: &str, value: &str, errors: &[(&str, &str)], hint: &str) -> String {
    let message: String = errors
        .iter()
        .filter(|(param, _)| *param == name)
        .map(|(_, message)| format!("<span class=\"error\" id=\"{name}-error\">{}</span>", esc(message)))
        .collect();
    let invalid = if message.is_empty() { "" } else { " aria-invalid=\"true\"" };
    let hint = if hint.is_empty() { String::new() } else { format!("<small>{}</small>", esc(hint)) };
    format!(
        "<label>{label}<input name=\"{name}\" value=\"{value}\"{invalid}>{hint}{message}</label>",
        label = esc(label),
        value = esc(value)
    )
}

/// A post form with the session's form token.
pub fn form(action: &str, csrf: &str, class: &str, inner: &str) -> String {
    format!(
        "<form method=\"post\" action=\"{action}\" class=\"{class}\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">{inner}</form>",
        action = esc(action),
        csrf = esc(csrf)
    )
}

/// Spend per day as bars, in SVG (no script): one bar per day, its amount in a tooltip.
pub fn spend_chart(days: &[(String, i64)]) -> String {
    let (w, h, pad) = (720.0, 160.0, 24.0);
    let top = days.iter().map(|d| d.1.max(0)).max().unwrap_or(0).max(1) as f64;
    let slot = (w - pad) / days.len().max(1) as f64;
    let mut out = format!(
        "<svg class=\"chart\" role=\"img\" aria-label=\"Spend per day\" viewBox=\"0 0 {w} {}\" width=\"{w}\" height=\"{}\">",
        h + 20.0,
        h + 20.0
    );
    let _ = write!(out, "<text x=\"0\" y=\"12\" font-size=\"11\" fill=\"#555\">{}</text>", esc(&nanos(top as i64)));
    for (i, (day, spend)) in days.iter().enumerate() {
        let bar = (*spend).max(0) as f64 / top * (h - pad);
        let x = pad + i as f64 * slot;
        let _ = write!(
            out,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bar:.1}\" fill=\"#3b6ea5\"><title>{}: {}</title></rect>",
            h - bar,
            (slot - 2.0).max(1.0),
            esc(day),
            esc(&nanos(*spend))
        );
        if i == 0 || i + 1 == days.len() {
            let anchor = if i == 0 { "start" } else { "end" };
            let _ = write!(
                out,
                "<text x=\"{:.1}\" y=\"{}\" font-size=\"11\" fill=\"#555\" text-anchor=\"{anchor}\">{}</text>",
                if i == 0 { x } else { x + slot },
                h + 16.0,
                esc(day)
            );
        }
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_shows_its_amounts_at_one_precision() {
        let amounts = [1_500_000_000, 125_000, -20_000_000];
        let digits = money_digits(amounts);
        assert_eq!(digits, 6);
        assert_eq!(amounts.map(|n| nanos_at(n, digits)), ["$1.500000", "$0.000125", "-$0.020000"]);
        assert_eq!(money_digits([1_500_000_000, 10_000_000]), 2);
    }

    #[test]
    fn text_is_escaped_and_amounts_read_well() {
        assert_eq!(esc("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
        assert_eq!(enc("tag:team a/é"), "tag%3Ateam%20a%2F%C3%A9");
        assert_eq!(money(12.5), "$12.50");
        assert_eq!(money(0.000123), "$0.000123");
        assert_eq!(money(0.0), "$0.00");
        assert_eq!(money(9.99997), "$9.99997");
        assert_eq!(money(-1.5), "-$1.50");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(count(12), "12");
        assert_eq!(crate::base::clock::time_in(0, &jiff::tz::TimeZone::UTC), "1970-01-01 00:00:00");
    }

    #[test]
    fn a_field_shows_only_its_own_error() {
        let shown = field("rpm", "Requests per minute", "x", Some(("rpm", "rpm: a whole number")), "");
        assert!(shown.contains("rpm: a whole number") && shown.contains("aria-invalid"));
        let other = field("tpm", "Tokens per minute", "", Some(("rpm", "rpm: a whole number")), "");
        assert!(!other.contains("error"));
    }
}
