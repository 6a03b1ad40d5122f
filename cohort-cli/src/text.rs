//! Printing untrusted text: every string that came from a run (task, label, model, error,
//! stderr tail, paths, directory names) is written by an agent, a model or a tool, and may carry
//! terminal control sequences planted by prompt injection. A terminal obeys them: an OSC can
//! retitle the window or (on some terminals) write the clipboard, a CSI can clear the screen or
//! move the cursor over earlier lines, a newline in a label splits a table row in two.
//!
//! [`escape`] is the one function that makes such text inert, in two strengths:
//!
//! - [`Keep::Nothing`], for one-line fields of human-readable output (the table, the single-run
//!   view, `--check`, `--doctor`, reap reports, error messages): every C0 control (U+0000–U+001F),
//!   DEL (U+007F) and C1 control (U+0080–U+009F, which some terminals obey like `ESC [`) is shown
//!   as a visible escape (`\n`, `\t`, `\r`, `\x1b`, `\x7f`, `\u{9b}`), and so are the Unicode
//!   bidirectional overrides (U+202A–U+202E, U+2066–U+2069) that reorder what a line appears to
//!   say. Bytes that are not UTF-8 are shown as `\xNN`.
//! - [`Keep::LineBreaks`], for the model's own text printed on purpose to a terminal
//!   (`cohort-status --output`, `--follow`): the same, except that newlines and tabs pass, so the
//!   text keeps its shape.
//!
//! `--json` never goes through here: JSON escaping already makes every control character inert,
//! and scripts must get the bytes as stored. Output to a pipe (`--output | …`) is not escaped
//! either: it is data.

use std::borrow::Cow;

/// Which harmless layout characters [`escape`] lets through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Nothing: the result is one line (for fields of tables, views, reports, messages).
    Nothing,
    /// Newlines (`\n`) and tabs (`\t`) pass unchanged (for multi-line text shown on a terminal).
    LineBreaks,
}

/// Whether `c` must be shown escaped (pure): C0 and C1 controls, DEL, bidi overrides, except
/// the layout characters `keep` allows.
fn is_unsafe(c: char, keep: Keep) -> bool {
    match c {
        '\n' | '\t' => keep == Keep::Nothing,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => true,
        _ => false,
    }
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
        c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
    }
}

/// `bytes` as text that cannot drive a terminal (pure): UTF-8 sequences pass except the
/// controls named in the module docs, which are shown as visible escapes; bytes that are not
/// UTF-8 become `\xNN`. Borrows when nothing needs escaping.
pub fn escape(bytes: &[u8], keep: Keep) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return escape_str(s, keep);
    }
    let mut out = String::with_capacity(bytes.len() + 16);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&escape_str(chunk.valid(), keep));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    Cow::Owned(out)
}

/// [`escape`] of a string.
pub fn escape_str(s: &str, keep: Keep) -> Cow<'_, str> {
    if !s.chars().any(|c| is_unsafe(c, keep)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if is_unsafe(c, keep) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One untrusted value for a human-readable line: [`escape_str`] with [`Keep::Nothing`].
pub fn untrusted(s: &str) -> Cow<'_, str> {
    escape_str(s, Keep::Nothing)
}

/// A path from a record or a directory listing, for a human-readable line: its bytes through
/// [`escape`] with [`Keep::Nothing`] (a file name may hold any byte but `/` and NUL).
pub fn untrusted_path(p: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    escape(p.as_os_str().as_bytes(), Keep::Nothing).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_line(b: &[u8]) -> String {
        escape(b, Keep::Nothing).into_owned()
    }

    fn no_raw_controls(s: &str) {
        assert!(
            !s.chars().any(|c| is_unsafe(c, Keep::Nothing)),
            "raw control left in {s:?}"
        );
    }

    #[test]
    fn osc_and_csi_become_visible() {
        let got = one_line(b"\x1b]0;PWNED\x07\x1b[2Jtask");
        assert_eq!(got, "\\x1b]0;PWNED\\x07\\x1b[2Jtask");
        no_raw_controls(&got);
    }

    #[test]
    fn bel_lone_esc_del_and_nul() {
        assert_eq!(one_line(b"a\x07b"), "a\\x07b");
        assert_eq!(one_line(b"end\x1b"), "end\\x1b");
        assert_eq!(one_line(b"\x7f\x00"), "\\x7f\\x00");
    }

    #[test]
    fn newline_tab_and_carriage_return() {
        assert_eq!(one_line(b"a\nb\tc\rd"), "a\\nb\\tc\\rd");
        assert_eq!(
            escape(b"a\nb\tc\rd\x1b[1m", Keep::LineBreaks),
            "a\nb\tc\\rd\\x1b[1m"
        );
    }

    #[test]
    fn c1_controls_in_utf8_are_escaped() {
        // U+009B is CSI in one character; U+0085 is NEL (a line break to some terminals).
        let got = one_line("x\u{9b}2Jy\u{85}z".as_bytes());
        assert_eq!(got, "x\\u{9b}2Jy\\u{85}z");
        no_raw_controls(&got);
        // Just outside the C1 block: printable Latin-1 stays.
        assert_eq!(one_line("é\u{a0}".as_bytes()), "é\u{a0}");
    }

    #[test]
    fn bidi_overrides_are_escaped() {
        assert_eq!(
            one_line("a\u{202e}b\u{2066}".as_bytes()),
            "a\\u{202e}b\\u{2066}"
        );
    }

    #[test]
    fn invalid_utf8_is_shown_as_bytes() {
        // A lone C1 byte (0x9b) is not UTF-8: shown as a byte, never passed raw.
        assert_eq!(one_line(b"a\x9b[2Jb\xff"), "a\\x9b[2Jb\\xff");
        // A truncated sequence, and valid text with controls after it.
        assert_eq!(one_line(b"\xe2\x82 \x1b"), "\\xe2\\x82 \\x1b");
        assert_eq!(escape(b"\xc3\n", Keep::LineBreaks), "\\xc3\n");
    }

    #[test]
    fn clean_text_is_borrowed() {
        assert!(matches!(
            escape("plain – text ✓".as_bytes(), Keep::Nothing),
            Cow::Borrowed(_)
        ));
        assert!(matches!(untrusted("ok"), Cow::Borrowed("ok")));
    }

    #[test]
    fn paths_are_escaped_bytewise() {
        use std::os::unix::ffi::OsStrExt;
        let p = std::path::Path::new(std::ffi::OsStr::from_bytes(b"/tmp/\x1b[31mred\xff"));
        assert_eq!(untrusted_path(p), "/tmp/\\x1b[31mred\\xff");
    }
}
