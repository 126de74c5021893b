//! Python `str` algorithms on provenance strings: whitespace as Python defines it, strip,
//! split, splitlines, case mappings, and code-point indexing (Python indexes characters,
//! Rust strings bytes).

use super::pstr::{map_runs, PBuilder, PStr};

/// Python's `str.isspace` for one character (`\s` of Python's `re`): Unicode White_Space plus
/// the four information separators U+001C..U+001F.
pub fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Line boundaries of `str.splitlines`.
pub fn line_break(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{b}' | '\u{c}' | '\u{1c}' | '\u{1d}' | '\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// `s.strip(chars)` / `lstrip` / `rstrip`: `chars` `None` strips Python whitespace.
pub fn strip(s: &PStr, chars: Option<&str>, left: bool, right: bool) -> PStr {
    let t = s.as_str();
    let strip_c = |c: char| match chars {
        Some(set) => set.contains(c),
        None => py_space(c),
    };
    let start = if left { t.len() - t.trim_start_matches(strip_c).len() } else { 0 };
    let end = if right { t.trim_end_matches(strip_c).len() } else { t.len() };
    if start >= end {
        return s.slice(0, 0);
    }
    s.slice(start, end)
}

/// `s.split(sep, maxsplit)` (`maxsplit` < 0: no limit). Without `sep`, runs of whitespace
/// separate and empty pieces are dropped.
pub fn split(s: &PStr, sep: Option<&str>, maxsplit: i64) -> Vec<PStr> {
    let t = s.as_str();
    let mut out = Vec::new();
    let limit = if maxsplit < 0 { usize::MAX } else { maxsplit as usize };
    match sep {
        Some(sep) => {
            let mut start = 0;
            for (i, _) in t.match_indices(sep) {
                if out.len() == limit {
                    break;
                }
                if i < start {
                    continue;
                }
                out.push(s.slice(start, i));
                start = i + sep.len();
            }
            out.push(s.slice(start, t.len()));
        }
        None => {
            let mut i = 0;
            let b = t.len();
            loop {
                i += t[i..].len() - t[i..].trim_start_matches(py_space).len();
                if i >= b {
                    break;
                }
                if out.len() == limit {
                    out.push(s.slice(i, b));
                    break;
                }
                let word_end = t[i..].find(py_space).map_or(b, |k| i + k);
                out.push(s.slice(i, word_end));
                i = word_end;
            }
        }
    }
    out
}

/// `s.rsplit(sep, maxsplit)`.
pub fn rsplit(s: &PStr, sep: Option<&str>, maxsplit: i64) -> Vec<PStr> {
    if maxsplit < 0 {
        return split(s, sep, maxsplit);
    }
    let t = s.as_str();
    let limit = maxsplit as usize;
    let mut out = Vec::new();
    match sep {
        Some(sep) => {
            let mut end = t.len();
            for (i, _) in t.rmatch_indices(sep) {
                if out.len() == limit {
                    break;
                }
                if i + sep.len() > end {
                    continue;
                }
                out.push(s.slice(i + sep.len(), end));
                end = i;
            }
            out.push(s.slice(0, end));
        }
        None => {
            let mut end = t.len();
            loop {
                end = t[..end].trim_end_matches(py_space).len();
                if end == 0 {
                    break;
                }
                if out.len() == limit {
                    out.push(s.slice(0, end));
                    break;
                }
                let word_start = t[..end].rfind(py_space).map_or(0, |k| k + t[k..].chars().next().map_or(1, char::len_utf8));
                out.push(s.slice(word_start, end));
                end = word_start;
            }
        }
    }
    out.reverse();
    out
}

/// `s.splitlines(keepends)`.
pub fn splitlines(s: &PStr, keepends: bool) -> Vec<PStr> {
    let t = s.as_str();
    let mut out = Vec::new();
    let mut start = 0;
    let mut it = t.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        if !line_break(c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        if c == '\r' && it.peek().map(|&(_, n)| n) == Some('\n') {
            it.next();
            end += 1;
        }
        out.push(s.slice(start, if keepends { end } else { i }));
        start = end;
    }
    if start < t.len() {
        out.push(s.slice(start, t.len()));
    }
    out
}

/// Python's titlecase of one character (Rust has no titlecase mapping: the upper case, except
/// for the four digraphs whose titlecase differs).
fn title_char(c: char, out: &mut String) {
    match c {
        'Ǆ' | 'ǅ' | 'ǆ' => out.push('ǅ'),
        'Ǉ' | 'ǈ' | 'ǉ' => out.push('ǈ'),
        'Ǌ' | 'ǋ' | 'ǌ' => out.push('ǋ'),
        'Ǳ' | 'ǲ' | 'ǳ' => out.push('ǲ'),
        c => out.extend(c.to_uppercase()),
    }
}

/// Cased in Python's sense (has an upper, lower or title case form of its own).
fn cased(c: char) -> bool {
    c.is_lowercase() || c.is_uppercase() || matches!(c, 'ǅ' | 'ǈ' | 'ǋ' | 'ǲ')
}

/// `str.title()`: a cased character after an uncased one is titlecased, others lowered.
pub fn title(s: &PStr) -> PStr {
    let mut prev_cased = false;
    map_runs(s, |t| {
        let mut out = String::with_capacity(t.len());
        for c in t.chars() {
            if prev_cased {
                out.extend(c.to_lowercase());
            } else {
                title_char(c, &mut out);
            }
            prev_cased = cased(c);
        }
        out
    })
}

/// `str.capitalize()`: the first character titlecased, the rest lowered.
pub fn capitalize(s: &PStr) -> PStr {
    let mut first = true;
    map_runs(s, |t| {
        let mut out = String::with_capacity(t.len());
        for c in t.chars() {
            if first {
                title_char(c, &mut out);
                first = false;
            } else {
                out.extend(c.to_lowercase());
            }
        }
        out
    })
}

pub fn upper(s: &PStr) -> PStr {
    map_runs(s, str::to_uppercase)
}

pub fn lower(s: &PStr) -> PStr {
    map_runs(s, str::to_lowercase)
}

/// Number of characters (Python's `len`).
pub fn char_len(t: &str) -> usize {
    if t.is_ascii() { t.len() } else { t.chars().count() }
}

/// Byte offset of character `n` (the length for `n` past the end).
pub fn byte_at(t: &str, n: usize) -> usize {
    if t.is_ascii() {
        return n.min(t.len());
    }
    t.char_indices().nth(n).map_or(t.len(), |(i, _)| i)
}

/// Character index of byte offset `b` (a character boundary).
pub fn char_at(t: &str, b: usize) -> usize {
    if t.is_ascii() { b } else { char_len(&t[..b]) }
}

/// Python `s.replace(old, new, count)`; the inserted text keeps `new`'s origins. An empty
/// `old` inserts `new` around every character, as Python does.
pub fn replace(s: &PStr, old: &str, new: &PStr, count: i64) -> PStr {
    let t = s.as_str();
    let limit = if count < 0 { usize::MAX } else { count as usize };
    let mut out = PBuilder::new();
    let mut done = 0;
    if old.is_empty() {
        let mut last = 0;
        for (i, _) in t.char_indices().chain(std::iter::once((t.len(), ' '))) {
            out.push_slice(s, last, i);
            last = i;
            if done < limit {
                out.push_pstr(new);
                done += 1;
            }
        }
        return out.finish();
    }
    let mut last = 0;
    for (i, _) in t.match_indices(old) {
        if done == limit {
            break;
        }
        out.push_slice(s, last, i);
        out.push_pstr(new);
        last = i + old.len();
        done += 1;
    }
    out.push_slice(s, last, t.len());
    out.finish()
}

/// Pads `s` to `width` characters with `fill` on the left (`right_align`), right, or both
/// (`center`, as Python: the extra space goes right when the padding is odd... unless the
/// width is odd, see `str.center`).
pub fn pad(s: &PStr, width: usize, fill: char, how: Pad) -> PStr {
    let len = char_len(s.as_str());
    if width <= len {
        return s.clone();
    }
    let total = width - len;
    let (left, right) = match how {
        Pad::Left => (total, 0),
        Pad::Right => (0, total),
        // CPython: left = marg/2 + (marg & width & 1).
        Pad::Center => {
            let left = total / 2 + (total & width & 1);
            (left, total - left)
        }
    };
    let o = s.origin();
    let mut out = PBuilder::new();
    out.push(&fill.to_string().repeat(left), o);
    out.push_pstr(s);
    out.push(&fill.to_string().repeat(right), o);
    out.finish()
}

#[derive(Clone, Copy)]
pub enum Pad {
    Left,
    Right,
    Center,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(v: Vec<PStr>) -> Vec<String> {
        v.iter().map(|p| p.as_str().to_string()).collect()
    }

    #[test]
    fn split_as_python() {
        let s = PStr::markup("  a b\t\u{1c}c  ");
        assert_eq!(texts(split(&s, None, -1)), ["a", "b", "c"]);
        assert_eq!(texts(split(&s, None, 1)), ["a", "b\t\u{1c}c  "]);
        assert_eq!(texts(split(&s, None, 0)), ["a b\t\u{1c}c  "]);
        assert_eq!(texts(rsplit(&s, None, 1)), ["  a b", "c"]);
        assert_eq!(texts(split(&PStr::markup("a,,b,"), Some(","), -1)), ["a", "", "b", ""]);
        assert_eq!(texts(split(&PStr::markup("aaa"), Some("aa"), -1)), ["", "a"]);
        assert_eq!(texts(rsplit(&PStr::markup("aaa"), Some("aa"), 1)), ["a", ""]);
        assert_eq!(texts(split(&PStr::markup("a,b,c"), Some(","), 1)), ["a", "b,c"]);
        assert_eq!(texts(rsplit(&PStr::markup("a,b,c"), Some(","), 1)), ["a,b", "c"]);
        assert_eq!(texts(splitlines(&PStr::markup("a\r\nb\rc\n\nd"), false)), ["a", "b", "c", "", "d"]);
        assert!(split(&PStr::markup("   "), None, -1).is_empty());
    }

    #[test]
    fn case_and_padding() {
        assert_eq!(title(&PStr::markup("hello wORLD ǆx 3rd")).as_str(), "Hello World ǅx 3Rd");
        assert_eq!(capitalize(&PStr::markup("hELLO")).as_str(), "Hello");
        assert_eq!(pad(&PStr::markup("ab"), 5, '*', Pad::Center).as_str(), "**ab*");
        assert_eq!(pad(&PStr::markup("abc"), 6, '*', Pad::Center).as_str(), "*abc**");
        assert_eq!(replace(&PStr::markup("ab"), "", &PStr::markup("-"), -1).as_str(), "-a-b-");
        assert_eq!(strip(&PStr::markup("\u{1f} x \u{a0}"), None, true, true).as_str(), "x");
        assert_eq!(strip(&PStr::markup("xxaxx"), Some("x"), false, true).as_str(), "xxa");
    }
}
