//! Pre-tokenizers: the published split patterns, hand-coded as scanners instead of a regex
//! engine.
//!
//! Each pattern is an alternation that a backtracking engine (Python `regex`, Rust
//! `fancy-regex`, Oniguruma) tries left to right at every position, taking the first
//! alternative that matches; `find_iter` then resumes after the match. A scanner here answers
//! the same question — "where does the match that starts at byte `i` end?" — by reading the
//! character classes directly. The comments give each pattern as published and explain where
//! backtracking decides the end (greedy runs that give characters back for a lookahead or a
//! required class).
//!
//! Patterns (the names used in the code):
//! - `Gpt2`: GPT-2, r50k, p50k, Whisper and the Hugging Face `ByteLevel` regex:
//!   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//!   (tiktoken's possessive spelling `\s++$|\s+(?!\S)|\s` is equivalent).
//! - `Cl100k`: cl100k's `'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|
//!   ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s`; with `hf_space` the Llama 3 /
//!   Qwen2 tail `\s*[\r\n]+|\s+(?!\S)|\s+` instead, and `digits` 1 for Qwen2's `\p{N}`.
//! - `O200k`: o200k's letter-case pattern; `kimi` adds the leading `[\p{Han}]+`, removes Han
//!   from the letter classes and `/` from the punctuation tail.
//! - `DeepSeek`: the third `Split` of DeepSeek-V3's sequence.
//! - `Numbers`: `\p{N}{1,3}`; `CjkKana`: `[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+`.

use super::unicode::{CharClasses, Class};

/// A split pattern this crate knows how to scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitPattern {
    Gpt2,
    Cl100k { digits: usize, hf_space: bool },
    O200k { kimi: bool },
    DeepSeek,
    Numbers { max: usize },
    CjkKana,
}

/// GPT-2's pre-tokenizer pattern.
pub const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
pub const R50K_PATTERN: &str = r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s";
/// cl100k_base's pattern (GPT-3.5/4).
pub const CL100K_PATTERN: &str =
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";
/// Llama 3's pattern.
pub const LLAMA3_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pattern.
pub const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k_base's pattern (GPT-4o).
pub const O200K_PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// Kimi's pattern.
pub const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// DeepSeek V3's pattern.
pub const DEEPSEEK_PATTERN: &str = concat!(
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^"##,
    "\r\n",
    r"\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[",
    "\r\n",
    r"]*|\s*[",
    "\r\n",
    r"]+|\s+(?!\S)|\s+"
);
pub const NUMBERS_PATTERN: &str = r"\p{N}{1,3}";
pub const CJK_KANA_PATTERN: &str = "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+";

impl SplitPattern {
    /// Recognises a published pattern by its exact text (as a tiktoken `pat_str` or a
    /// `tokenizer.json` `Split` regex).
    pub fn from_regex(pattern: &str) -> Option<SplitPattern> {
        Some(match pattern {
            GPT2_PATTERN | R50K_PATTERN => SplitPattern::Gpt2,
            CL100K_PATTERN => SplitPattern::Cl100k { digits: 3, hf_space: false },
            LLAMA3_PATTERN => SplitPattern::Cl100k { digits: 3, hf_space: true },
            QWEN2_PATTERN => SplitPattern::Cl100k { digits: 1, hf_space: true },
            O200K_PATTERN => SplitPattern::O200k { kimi: false },
            KIMI_PATTERN => SplitPattern::O200k { kimi: true },
            DEEPSEEK_PATTERN => SplitPattern::DeepSeek,
            NUMBERS_PATTERN => SplitPattern::Numbers { max: 3 },
            CJK_KANA_PATTERN => SplitPattern::CjkKana,
            _ => return None,
        })
    }

    /// Calls `piece(start, end)` for every match, left to right, as `find_iter` does; text
    /// that no alternative matches is skipped (the patterns used with tiktoken match
    /// everything).
    pub fn for_each_match(&self, s: &str, cc: &CharClasses, mut piece: impl FnMut(usize, usize)) {
        let sc = Scanner { b: s.as_bytes(), cc };
        let mut i = 0;
        while i < sc.b.len() {
            match self.match_at(&sc, i) {
                Some(end) if end > i => {
                    piece(i, end);
                    i = end;
                }
                _ => i += utf8_len(sc.b[i]),
            }
        }
    }

    /// Hugging Face `Split` with behavior `Isolated`: every match is a piece, and so is each
    /// stretch of text between matches.
    pub fn split_isolated(&self, s: &str, cc: &CharClasses, out: &mut Vec<(usize, usize)>) {
        let mut last = 0;
        self.for_each_match(s, cc, |a, b| {
            if a > last {
                out.push((last, a));
            }
            out.push((a, b));
            last = b;
        });
        if last < s.len() {
            out.push((last, s.len()));
        }
    }

    fn match_at(&self, sc: &Scanner, i: usize) -> Option<usize> {
        match *self {
            SplitPattern::Gpt2 => Some(gpt2(sc, i)),
            SplitPattern::Cl100k { digits, hf_space } => Some(cl100k(sc, i, digits, hf_space)),
            SplitPattern::O200k { kimi } => Some(o200k(sc, i, kimi)),
            SplitPattern::DeepSeek => deepseek(sc, i),
            SplitPattern::Numbers { max } => {
                let (_, k, _) = sc.at(i)?;
                k.number().then(|| sc.run_max(i, max, |_, k| k.number()))
            }
            SplitPattern::CjkKana => {
                let cjk = |c: u32| (0x4E00..=0x9FA5).contains(&c) || (0x3040..=0x30FF).contains(&c);
                let (c, _, _) = sc.at(i)?;
                cjk(c).then(|| sc.run(i, |c, _| cjk(c)))
            }
        }
    }
}

/// Length of the UTF-8 sequence that starts with `b0`.
#[inline]
fn utf8_len(b0: u8) -> usize {
    match b0 {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

/// Reads characters and their classes out of valid UTF-8.
struct Scanner<'a> {
    b: &'a [u8],
    cc: &'a CharClasses,
}

impl Scanner<'_> {
    /// The character at byte `i` (a character boundary), its class and its length; `None` at
    /// the end.
    #[inline]
    fn at(&self, i: usize) -> Option<(u32, Class, usize)> {
        let b0 = *self.b.get(i)?;
        let (c, n) = if b0 < 0x80 {
            (b0 as u32, 1)
        } else {
            let n = utf8_len(b0);
            let mut c = (b0 as u32) & (0x7f >> n);
            for k in 1..n {
                c = (c << 6) | (*self.b.get(i + k)? as u32 & 0x3f);
            }
            (c, n)
        };
        let ch = char::from_u32(c)?;
        Some((c, self.cc.of(ch), n))
    }

    /// End of the run of characters from `i` that satisfy `f`.
    #[inline]
    fn run(&self, mut i: usize, f: impl Fn(u32, Class) -> bool) -> usize {
        while let Some((c, k, n)) = self.at(i) {
            if !f(c, k) {
                break;
            }
            i += n;
        }
        i
    }

    /// Like [`Scanner::run`], at most `max` characters.
    fn run_max(&self, mut i: usize, max: usize, f: impl Fn(u32, Class) -> bool) -> usize {
        for _ in 0..max {
            match self.at(i) {
                Some((c, k, n)) if f(c, k) => i += n,
                _ => break,
            }
        }
        i
    }

    /// True when the character at `i` exists and satisfies `f`.
    #[inline]
    fn is(&self, i: usize, f: impl Fn(u32, Class) -> bool) -> bool {
        self.at(i).is_some_and(|(c, k, _)| f(c, k))
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` at `i`; `fold` makes it case-insensitive (Unicode simple case
    /// folding: the only non-ASCII character that folds onto one of these letters is U+017F
    /// LATIN SMALL LETTER LONG S, onto `s`).
    fn contraction(&self, i: usize, fold: bool) -> Option<usize> {
        if self.b.get(i) != Some(&b'\'') {
            return None;
        }
        let letter = |k: usize| self.b.get(k).map(|&c| if fold { c.to_ascii_lowercase() } else { c });
        if fold && self.b.get(i + 1) == Some(&0xc5) && self.b.get(i + 2) == Some(&0xbf) {
            return Some(i + 3);
        }
        match letter(i + 1)? {
            b's' | b't' | b'm' | b'd' => Some(i + 2),
            b'r' | b'v' if letter(i + 2) == Some(b'e') => Some(i + 3),
            b'l' if letter(i + 2) == Some(b'l') => Some(i + 3),
            _ => None,
        }
    }

    /// The whitespace alternatives at a whitespace character `i`.
    fn space(&self, i: usize, rule: SpaceRule) -> usize {
        let (mut j, mut last, mut count, mut newline) = (i, i, 0usize, None);
        while let Some((c, k, n)) = self.at(j) {
            if !k.space() {
                break;
            }
            if c == 0x0a || c == 0x0d {
                newline = Some(j);
            }
            last = j;
            j += n;
            count += 1;
        }
        let at_end = j == self.b.len();
        // `\s+(?!\S)` gives back the last whitespace character when a non-space follows.
        let lookahead = if at_end { j } else if count >= 2 { last } else { j };
        match rule {
            // `\s+(?!\S)|\s+`
            SpaceRule::Gpt2 => lookahead,
            // `\s++$|\s*[\r\n]|\s+(?!\S)|\s`: the greedy `\s*` backs off to the last newline.
            SpaceRule::Tiktoken => match newline {
                _ if at_end => j,
                Some(r) => r + 1,
                None => lookahead,
            },
            // `\s*[\r\n]+|\s+(?!\S)|\s+`
            SpaceRule::Hf => match newline {
                Some(r) => r + 1,
                None => lookahead,
            },
        }
    }
}

#[derive(Clone, Copy)]
enum SpaceRule {
    Gpt2,
    Tiktoken,
    Hf,
}

const CR: u32 = 0x0d;
const LF: u32 = 0x0a;
const SPACE: u32 = 0x20;

/// `[^\s\p{L}\p{N}]`
#[inline]
fn other(k: Class) -> bool {
    !k.space() && !k.letter() && !k.number()
}

/// `[^\r\n\p{L}\p{N}]`
#[inline]
fn prefix(c: u32, k: Class) -> bool {
    c != CR && c != LF && !k.letter() && !k.number()
}

fn gpt2(sc: &Scanner, i: usize) -> usize {
    let Some((c, k, n)) = sc.at(i) else { return i };
    if let Some(e) = sc.contraction(i, false) {
        return e;
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the space joins what follows it.
    let (start, k) = match sc.at(i + n) {
        Some((_, k2, _)) if c == SPACE && !k2.space() => (i + n, k2),
        _ => (i, k),
    };
    if k.letter() {
        return sc.run(start, |_, k| k.letter());
    }
    if k.number() {
        return sc.run(start, |_, k| k.number());
    }
    if other(k) {
        return sc.run(start, |_, k| other(k));
    }
    sc.space(i, SpaceRule::Gpt2)
}

fn cl100k(sc: &Scanner, i: usize, digits: usize, hf_space: bool) -> usize {
    let Some((c, k, n)) = sc.at(i) else { return i };
    if let Some(e) = sc.contraction(i, true) {
        return e;
    }
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if k.letter() {
        return sc.run(i, |_, k| k.letter());
    }
    if prefix(c, k) && sc.is(i + n, |_, k| k.letter()) {
        return sc.run(i + n, |_, k| k.letter());
    }
    // `\p{N}{1,3}`
    if k.number() {
        return sc.run_max(i, digits, |_, k| k.number());
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let start = if c == SPACE && sc.is(i + n, |_, k| other(k)) { i + n } else { i };
    if start > i || other(k) {
        let e = sc.run(start, |_, k| other(k));
        return sc.run(e, |c, _| c == CR || c == LF);
    }
    sc.space(i, if hf_space { SpaceRule::Hf } else { SpaceRule::Tiktoken })
}

fn o200k(sc: &Scanner, i: usize, kimi: bool) -> usize {
    let Some((c, k, n)) = sc.at(i) else { return i };
    // `[\p{Han}]+` (Kimi only)
    if kimi && k.han() {
        return sc.run(i, |_, k| k.han());
    }
    if let Some(e) = o200k_word(sc, i, c, k, n, kimi) {
        return e;
    }
    // `\p{N}{1,3}`
    if k.number() {
        return sc.run_max(i, 3, |_, k| k.number());
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n/]*` (Kimi: `[\r\n]*`)
    let start = if c == SPACE && sc.is(i + n, |_, k| other(k)) { i + n } else { i };
    if start > i || other(k) {
        let e = sc.run(start, |_, k| other(k));
        return sc.run(e, |c, _| c == CR || c == LF || (!kimi && c == '/' as u32));
    }
    sc.space(i, SpaceRule::Hf)
}

/// o200k's two word alternatives, with their optional contraction suffix:
/// `P?U*W+C?` then `P?U+W*C?`, where P = `[^\r\n\p{L}\p{N}]`, U = `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`,
/// W = `[\p{Ll}\p{Lm}\p{Lo}\p{M}]` (Kimi: U and W without Han), C = the contractions.
/// The optional P is first tried taken, then not taken (a mark is both P and U).
fn o200k_word(sc: &Scanner, i: usize, c: u32, k: Class, n: usize, kimi: bool) -> Option<usize> {
    let upper = move |_: u32, k: Class| k.upperish() && !(kimi && k.han());
    let lower = move |_: u32, k: Class| k.lowerish() && !(kimi && k.han());
    let starts: &[usize] = if prefix(c, k) { &[i + n, i] } else { &[i] };
    // U*W+: the greedy U* gives characters back until W+ can start. W+ then runs over the
    // maximal W stretch when it starts after the U run; when it starts inside the run, at the
    // last W character of the run, it stops at the next character (not W by choice of that
    // position).
    for &s in starts {
        let (mut j, mut last_w) = (s, None);
        while let Some((c2, k2, n2)) = sc.at(j) {
            if !upper(c2, k2) {
                break;
            }
            if lower(c2, k2) {
                last_w = Some(j + n2);
            }
            j += n2;
        }
        let end = if sc.is(j, lower) { Some(sc.run(j, lower)) } else { last_w };
        if let Some(e) = end {
            return Some(sc.contraction(e, true).unwrap_or(e));
        }
    }
    // U+W*
    for &s in starts {
        let j = sc.run(s, upper);
        if j > s {
            let e = sc.run(j, lower);
            return Some(sc.contraction(e, true).unwrap_or(e));
        }
    }
    None
}

/// DeepSeek-V3's third split:
/// `[!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|
/// \s*[\r\n]+|\s+(?!\S)|\s+`. Characters that none of these match (digits, controls, format
/// characters, unassigned code points) are left for the gaps.
fn deepseek(sc: &Scanner, i: usize) -> Option<usize> {
    let (c, k, n) = sc.at(i)?;
    let ascii_letter = |c: u32, _: Class| (c as u8).is_ascii_alphabetic() && c < 0x80;
    if c < 0x80 && (c as u8).is_ascii_punctuation() && sc.is(i + n, ascii_letter) {
        return Some(sc.run(i + n, ascii_letter));
    }
    let letter_mark = |_: u32, k: Class| k.letter() || k.mark();
    if letter_mark(c, k) {
        return Some(sc.run(i, letter_mark));
    }
    let lead = c != CR && c != LF && !k.letter() && !k.punct() && !k.symbol();
    if lead && sc.is(i + n, letter_mark) {
        return Some(sc.run(i + n, letter_mark));
    }
    let punct_symbol = |_: u32, k: Class| k.punct() || k.symbol();
    let start = if c == SPACE && sc.is(i + n, punct_symbol) { i + n } else { i };
    if start > i || punct_symbol(c, k) {
        let e = sc.run(start, punct_symbol);
        return Some(sc.run(e, |c, _| c == CR || c == LF));
    }
    k.space().then(|| sc.space(i, SpaceRule::Hf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(p: SplitPattern, s: &str) -> Vec<String> {
        let cc = CharClasses::new();
        let mut out = Vec::new();
        p.for_each_match(s, &cc, |a, b| out.push(s[a..b].to_string()));
        out
    }

    #[test]
    fn gpt2_splits() {
        assert_eq!(pieces(SplitPattern::Gpt2, "Hello world's  end \n"), ["Hello", " world", "'s", " ", " end", " \n"]);
        assert_eq!(pieces(SplitPattern::Gpt2, "a   b"), ["a", "  ", " b"]);
    }

    #[test]
    fn cl100k_splits() {
        let p = SplitPattern::Cl100k { digits: 3, hf_space: false };
        assert_eq!(pieces(p, "I'M 12345 x\n\n  y  "), ["I", "'M", " ", "123", "45", " x", "\n\n", " ", " y", "  "]);
    }

    #[test]
    fn o200k_splits() {
        let p = SplitPattern::O200k { kimi: false };
        assert_eq!(pieces(p, "camelCase XMLHttp don't"), ["camel", "Case", " XMLHttp", " don't"]);
        let k = SplitPattern::O200k { kimi: true };
        assert_eq!(pieces(k, "Hello世界abc"), ["Hello", "世界", "abc"]);
    }

    #[test]
    fn recognises_published_patterns() {
        assert_eq!(SplitPattern::from_regex(O200K_PATTERN), Some(SplitPattern::O200k { kimi: false }));
        assert_eq!(SplitPattern::from_regex(r"\w+"), None);
    }
}
