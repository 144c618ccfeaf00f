//! Text Moat shows that it does not control: untrusted names, messages and
//! errors made safe for one line of a terminal or a log, and the position of
//! a byte offset in a file. The bottom layer: it imports nothing of Moat's.

/// Characters that take no space on a terminal.
pub(crate) fn is_zero_width(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}' | '\u{00AD}')
}

/// Characters that change the direction text is shown in.
pub(crate) fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Whether `c` must not reach a terminal as it is: a control character
/// (newlines and tabs included), or an invisible or direction-changing one.
pub fn is_unsafe_on_terminal(c: char) -> bool {
    c.is_control() || is_zero_width(c) || is_bidi_control(c)
}

/// `text` made safe for one line of a terminal: every control character
/// (newlines and tabs included, so no line can be forged) and every
/// invisible or direction-changing character replaced by a visible escape
/// such as `\u{1b}` or `\u{a}`.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if is_unsafe_on_terminal(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// An error and its sources on one line, joined with `: `, leaving out a
/// source whose text is already there (errors here name their source in
/// their own message as well as through `source()`).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let shown = cause.to_string();
        if !text.contains(&shown) {
            text.push_str(": ");
            text.push_str(&shown);
        }
        source = cause.source();
    }
    text
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_column_counts_characters_from_one() {
        assert_eq!(
            line_column(
                "ab
cé d", 7
            ),
            (2, 4)
        );
        assert_eq!(line_column("x", 99), (1, 2));
    }
}
