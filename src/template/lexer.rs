//! Template source → tokens, as jinja2's lexer makes them under the environment transformers
//! uses: `trim_blocks` and `lstrip_blocks` on, `keep_trailing_newline` off, default
//! delimiters, no line statements.
//!
//! The rules mirror jinja2's regular expressions: the earliest `{{`, `{%` or `{#` opens a tag;
//! a `-` after the opener strips all whitespace before it and a `-` before the closer all
//! whitespace after it; `+` turns off `lstrip_blocks` (opener) or `trim_blocks` (closer);
//! `lstrip_blocks` removes spaces and tabs between a line start and a block or comment tag;
//! `trim_blocks` removes the one newline after a block or comment tag; a closer inside
//! brackets is an operator. `{% raw %}` bodies are data. Whitespace means Python's `\s`.

use super::pystr::py_space;

/// A token. Operators are their text.
#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    Data(String),
    VarBegin,
    VarEnd,
    BlockBegin,
    BlockEnd,
    Name(String),
    Str(String),
    Int(i64),
    Float(f64),
    Op(&'static str),
    Eof,
}

#[derive(Clone, Debug)]
pub struct Token {
    pub tok: Tok,
    /// Byte offset in the normalized source.
    pub pos: usize,
}

/// A lexing failure at a byte offset.
#[derive(Debug)]
pub struct LexError {
    pub msg: String,
    pub pos: usize,
}

/// jinja2 reads the source with every `\r\n`, `\r` and `\n` made `\n`, and (with
/// `keep_trailing_newline` off) without one final newline.
pub fn normalize_source(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut it = src.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\r' {
            if it.peek() == Some(&'\n') {
                it.next();
            }
            out.push('\n');
        } else {
            out.push(c);
        }
    }
    if out.ends_with('\n') {
        out.pop();
    }
    out
}

/// Operators, longest first (jinja2's `operator_re`).
const OPERATORS: [&str; 26] = [
    "//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(", ")", "{", "}", ">", "<", "=", ".",
    ":", "|", ",", ";",
];

/// Tokenizes normalized source (see [`normalize_source`]); the last token is `Eof`.
pub fn tokenize(src: &str) -> Result<Vec<Token>, LexError> {
    let mut lx = Lexer { src, b: src.as_bytes(), pos: 0, out: Vec::new(), line_starting: true };
    lx.run()?;
    Ok(lx.out)
}

struct Lexer<'s> {
    src: &'s str,
    b: &'s [u8],
    pos: usize,
    out: Vec<Token>,
    /// The last thing matched ended with a newline (jinja2's `line_starting`, which lets
    /// `lstrip_blocks` strip at the start of the text that follows).
    line_starting: bool,
}

impl Lexer<'_> {
    fn push(&mut self, tok: Tok, pos: usize) {
        self.out.push(Token { tok, pos });
    }

    fn err<T>(&self, msg: impl Into<String>, pos: usize) -> Result<T, LexError> {
        Err(LexError { msg: msg.into(), pos })
    }

    fn skip_ws(&self, mut i: usize) -> usize {
        while let Some(c) = self.src[i..].chars().next().filter(|&c| py_space(c)) {
            i += c.len_utf8();
        }
        i
    }

    fn run(&mut self) -> Result<(), LexError> {
        while self.pos < self.b.len() {
            let Some(p) = self.find_tag(self.pos) else {
                let rest = self.src[self.pos..].to_string();
                self.push(Tok::Data(rest), self.pos);
                break;
            };
            let kind = self.b[p + 1];
            let sign = match self.b.get(p + 2) {
                Some(b'-') => b'-',
                Some(b'+') => b'+',
                _ => b' ',
            };
            let raw_end = if kind == b'%' { self.match_raw_begin(p) } else { None };
            let text = self.strip_text(&self.src[self.pos..p], sign, kind != b'{');
            if !text.is_empty() {
                let t = text.to_string();
                self.push(Tok::Data(t), self.pos);
            }
            if let Some(end) = raw_end {
                self.line_starting = self.b[end - 1] == b'\n';
                self.pos = end;
                self.lex_raw(p)?;
                continue;
            }
            self.pos = p + 2 + (sign != b' ') as usize;
            self.line_starting = false;
            match kind {
                b'#' => self.lex_comment(p)?,
                b'%' => {
                    self.push(Tok::BlockBegin, p);
                    self.lex_tag(false)?;
                }
                _ => {
                    self.push(Tok::VarBegin, p);
                    self.lex_tag(true)?;
                }
            }
        }
        let end = self.b.len();
        self.push(Tok::Eof, end);
        Ok(())
    }

    /// The next `{{`, `{%` or `{#` at or after `from`.
    fn find_tag(&self, from: usize) -> Option<usize> {
        let mut i = from;
        while let Some(k) = self.b[i..].iter().position(|&c| c == b'{') {
            let p = i + k;
            if matches!(self.b.get(p + 1), Some(b'{' | b'%' | b'#')) {
                return Some(p);
            }
            i = p + 1;
        }
        None
    }

    /// The data before a tag after whitespace control: `-` strips all trailing whitespace;
    /// otherwise, for block and comment tags, `lstrip_blocks` drops the spaces and tabs that
    /// follow the last newline (or the start of a line).
    fn strip_text<'a>(&self, text: &'a str, sign: u8, lstrip: bool) -> &'a str {
        if sign == b'-' {
            return text.trim_end_matches(py_space);
        }
        if sign == b'+' || !lstrip {
            return text;
        }
        let l_pos = text.rfind('\n').map_or(0, |i| i + 1);
        if (l_pos > 0 || self.line_starting) && text[l_pos..].bytes().all(|c| c == b' ' || c == b'\t') {
            &text[..l_pos]
        } else {
            text
        }
    }

    /// `{%[-+]? raw (-%}\s*|%})` at `p`: the end of the match.
    fn match_raw_begin(&self, p: usize) -> Option<usize> {
        let mut i = p + 2;
        if matches!(self.b.get(i), Some(b'-' | b'+')) {
            i += 1;
        }
        i = self.skip_ws(i);
        if !self.b[i..].starts_with(b"raw") {
            return None;
        }
        i = self.skip_ws(i + 3);
        if self.b[i..].starts_with(b"-%}") {
            Some(self.skip_ws(i + 3))
        } else if self.b[i..].starts_with(b"%}") {
            Some(i + 2)
        } else {
            None
        }
    }

    /// The body of `{% raw %}` up to the first `{% endraw %}`.
    fn lex_raw(&mut self, begin: usize) -> Result<(), LexError> {
        let mut i = self.pos;
        while let Some(q) = self.find_block_start(i) {
            if let Some((sign, end)) = self.match_endraw(q) {
                let text = self.strip_text(&self.src[self.pos..q], sign, true).to_string();
                if !text.is_empty() {
                    self.push(Tok::Data(text), self.pos);
                }
                self.line_starting = self.b[end - 1] == b'\n';
                self.pos = end;
                return Ok(());
            }
            i = q + 1;
        }
        self.err("Missing end of raw directive", begin)
    }

    fn find_block_start(&self, from: usize) -> Option<usize> {
        let k = self.src[from..].find("{%")?;
        Some(from + k)
    }

    /// `{%[-+]? endraw (+%}|-%}\s*|%}\n?)` at `q`: the opener's sign and the end of the match.
    fn match_endraw(&self, q: usize) -> Option<(u8, usize)> {
        let mut i = q + 2;
        let sign = match self.b.get(i) {
            Some(&s @ (b'-' | b'+')) => {
                i += 1;
                s
            }
            _ => b' ',
        };
        i = self.skip_ws(i);
        if !self.b[i..].starts_with(b"endraw") {
            return None;
        }
        i = self.skip_ws(i + 6);
        self.match_block_end(i).map(|end| (sign, end))
    }

    /// `+%}`, `-%}\s*` or `%}\n?` at `i`: the end of the match.
    fn match_block_end(&self, i: usize) -> Option<usize> {
        let rest = &self.b[i..];
        if rest.starts_with(b"+%}") {
            Some(i + 3)
        } else if rest.starts_with(b"-%}") {
            Some(self.skip_ws(i + 3))
        } else if rest.starts_with(b"%}") {
            Some(if self.b.get(i + 2) == Some(&b'\n') { i + 3 } else { i + 2 })
        } else {
            None
        }
    }

    /// A comment, from after its opener to the first `#}` (with its whitespace control).
    fn lex_comment(&mut self, begin: usize) -> Result<(), LexError> {
        let Some(k) = self.src[self.pos..].find("#}") else {
            return self.err("Missing end of comment tag", begin);
        };
        let k = self.pos + k;
        let before = if k > self.pos { self.b[k - 1] } else { 0 };
        let end = match before {
            b'-' => self.skip_ws(k + 2),
            b'+' => k + 2,
            _ if self.b.get(k + 2) == Some(&b'\n') => k + 3,
            _ => k + 2,
        };
        self.line_starting = self.b[end - 1] == b'\n';
        self.pos = end;
        Ok(())
    }

    /// The tokens of a `{{ ... }}` (`var`) or `{% ... %}` tag, through its closer.
    fn lex_tag(&mut self, var: bool) -> Result<(), LexError> {
        let mut balance: Vec<u8> = Vec::new();
        loop {
            if self.pos >= self.b.len() {
                return Ok(()); // the parser reports the unclosed tag
            }
            if balance.is_empty() {
                let end = if var { self.match_var_end(self.pos) } else { self.match_block_end(self.pos) };
                if let Some(end) = end {
                    self.push(if var { Tok::VarEnd } else { Tok::BlockEnd }, self.pos);
                    self.line_starting = self.b[end - 1] == b'\n';
                    self.pos = end;
                    return Ok(());
                }
            }
            let at = self.pos;
            let Some(c) = self.src[at..].chars().next() else { return Ok(()) };
            if py_space(c) {
                self.pos = self.skip_ws(at);
                continue;
            }
            if let Some((tok, len)) = self.number(at)? {
                self.push(tok, at);
                self.pos = at + len;
                continue;
            }
            if is_name_char(c) {
                let len = self.src[at..].find(|c: char| !is_name_char(c)).unwrap_or(self.src.len() - at);
                let name = self.src[at..at + len].to_string();
                self.push(Tok::Name(name), at);
                self.pos = at + len;
                continue;
            }
            if c == '\'' || c == '"' {
                if let Some(len) = self.string_len(at) {
                    let value = unescape(&self.src[at + 1..at + len - 1]).map_err(|msg| LexError { msg, pos: at })?;
                    self.push(Tok::Str(value), at);
                    self.pos = at + len;
                    continue;
                }
            }
            let Some(op) = OPERATORS.iter().find(|op| self.b[at..].starts_with(op.as_bytes())) else {
                return self.err(format!("unexpected char {} at {at}", super::value::py_str_repr(&c.to_string())), at);
            };
            match *op {
                "{" => balance.push(b'}'),
                "(" => balance.push(b')'),
                "[" => balance.push(b']'),
                "}" | ")" | "]" => match balance.pop() {
                    None => return self.err(format!("unexpected '{op}'"), at),
                    Some(want) if want != op.as_bytes()[0] => {
                        return self.err(format!("unexpected '{op}', expected '{}'", want as char), at);
                    }
                    Some(_) => {}
                },
                _ => {}
            }
            self.push(Tok::Op(op), at);
            self.pos = at + op.len();
        }
    }

    /// `-}}\s*` or `}}` at `i`.
    fn match_var_end(&self, i: usize) -> Option<usize> {
        let rest = &self.b[i..];
        if rest.starts_with(b"-}}") {
            Some(self.skip_ws(i + 3))
        } else if rest.starts_with(b"}}") {
            Some(i + 2)
        } else {
            None
        }
    }

    /// Length of a quoted string literal at `at` (quotes included), if it is closed.
    fn string_len(&self, at: usize) -> Option<usize> {
        let q = self.b[at];
        let mut i = at + 1;
        while i < self.b.len() {
            match self.b[i] {
                b'\\' => {
                    i += 1;
                    i += self.src[i..].chars().next().map_or(1, char::len_utf8);
                }
                c if c == q => return Some(i + 1 - at),
                _ => i += 1,
            }
        }
        None
    }

    /// A float or integer literal at `at` (jinja2's `float_re`, then `integer_re`).
    fn number(&self, at: usize) -> Result<Option<(Tok, usize)>, LexError> {
        let b = self.b;
        if !b[at].is_ascii_digit() {
            return Ok(None);
        }
        if at == 0 || b[at - 1] != b'.' {
            if let Some(len) = float_len(&b[at..]) {
                let text: String = self.src[at..at + len].chars().filter(|&c| c != '_').collect();
                return Ok(text.parse().ok().map(|f| (Tok::Float(f), len)));
            }
        }
        let Some((len, radix, skip)) = int_len(&b[at..]) else { return Ok(None) };
        let digits: String = self.src[at + skip..at + len].chars().filter(|&c| c != '_').collect();
        // Python integers are unbounded; ours are 64-bit, and a larger literal is an error
        // rather than a silent wrap.
        match i64::from_str_radix(&digits, radix) {
            Ok(i) => Ok(Some((Tok::Int(i), len))),
            Err(_) => self.err(format!("integer literal {} does not fit in 64 bits", &self.src[at..at + len]), at),
        }
    }
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || ('\u{300}'..='\u{36f}').contains(&c)
}

/// `(\d+_)*\d+`: digits with single underscores between them; the length.
fn digits_len(b: &[u8]) -> usize {
    let mut i = 0;
    loop {
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return start.saturating_sub(1); // back off a trailing `_`
        }
        if b.get(i) == Some(&b'_') && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            i += 1;
            continue;
        }
        return i;
    }
}

/// jinja2's `float_re`: digits, then a fraction and/or an exponent (at least one).
fn float_len(b: &[u8]) -> Option<usize> {
    let int = digits_len(b);
    let mut i = int;
    let mut frac = false;
    if b.get(i) == Some(&b'.') {
        let d = digits_len(&b[i + 1..]);
        if d > 0 {
            i += 1 + d;
            frac = true;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let d = digits_len(&b[j..]);
        if d > 0 {
            return Some(j + d);
        }
    }
    frac.then_some(i)
}

/// jinja2's `integer_re`: `0b`, `0o`, `0x` forms, decimals, zeros. (length, radix, prefix).
fn int_len(b: &[u8]) -> Option<(usize, u32, usize)> {
    let radix_digits = |radix: u32, b: &[u8]| -> usize {
        // (_?[digit])+
        let mut i = 0;
        loop {
            let j = if b.get(i) == Some(&b'_') { i + 1 } else { i };
            match b.get(j) {
                Some(&c) if (c as char).is_digit(radix) => i = j + 1,
                _ => return i,
            }
        }
    };
    if b[0] == b'0' {
        for (marks, radix) in [(b"bB", 2), (b"oO", 8), (b"xX", 16)] {
            if b.get(1).is_some_and(|c| marks.contains(c)) {
                let n = radix_digits(radix, &b[2..]);
                if n > 0 {
                    return Some((2 + n, radix, 2));
                }
            }
        }
        // 0(_?0)*
        let mut i = 1;
        loop {
            let j = if b.get(i) == Some(&b'_') { i + 1 } else { i };
            if b.get(j) == Some(&b'0') {
                i = j + 1;
            } else {
                return Some((i, 10, 0));
            }
        }
    }
    Some((1 + radix_digits(10, &b[1..]), 10, 0))
}

/// Python's `unicode-escape` decoding of a string literal's body (after jinja2's
/// `backslashreplace` of non-ASCII characters, which makes `\` + `é` the text `\xe9`).
fn unescape(s: &str) -> Result<String, String> {
    if !s.contains('\\') {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(e) = it.next() else { return Err("\\ at end of string".into()) };
        match e {
            '\n' => {}
            '\\' | '\'' | '"' => out.push(e),
            'a' => out.push('\u{7}'),
            'b' => out.push('\u{8}'),
            'f' => out.push('\u{c}'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            'v' => out.push('\u{b}'),
            '0'..='7' => {
                let mut v = e as u32 - '0' as u32;
                for _ in 0..2 {
                    match it.peek() {
                        Some(&d @ '0'..='7') => {
                            v = v * 8 + (d as u32 - '0' as u32);
                            it.next();
                        }
                        _ => break,
                    }
                }
                out.push(char::from_u32(v).ok_or("illegal Unicode character")?);
            }
            'x' | 'u' | 'U' => {
                let (n, what) = match e {
                    'x' => (2, "\\xXX"),
                    'u' => (4, "\\uXXXX"),
                    _ => (8, "\\UXXXXXXXX"),
                };
                let mut v = 0u32;
                for _ in 0..n {
                    match it.peek().and_then(|d| d.to_digit(16)) {
                        Some(d) => {
                            v = v * 16 + d;
                            it.next();
                        }
                        None => return Err(format!("truncated {what} escape")),
                    }
                }
                if (0xd800..0xe000).contains(&v) {
                    return Err(format!("surrogate escape \\u{v:04x}: a Rust string cannot hold it"));
                }
                out.push(char::from_u32(v).ok_or("illegal Unicode character")?);
            }
            'N' => return Err("\\N{...} escapes are not supported".into()),
            e if !e.is_ascii() => {
                out.push('\\');
                let v = e as u32;
                out.push_str(&if v <= 0xff { format!("x{v:02x}") } else if v <= 0xffff { format!("u{v:04x}") } else { format!("U{v:08x}") });
            }
            e => {
                out.push('\\');
                out.push(e);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    fn toks(src: &str) -> Vec<Tok> {
        tokenize(&normalize_source(src)).must().into_iter().map(|t| t.tok).collect()
    }

    fn data(src: &str) -> String {
        toks(src).into_iter().filter_map(|t| if let Tok::Data(d) = t { Some(d) } else { None }).collect()
    }

    #[test]
    fn whitespace_control() {
        assert_eq!(data("a  {{- x -}}  \n b"), "ab");
        assert_eq!(data("a\n  {% if x %}\nb\n  {% endif %}\nc\n"), "a\nb\nc");
        assert_eq!(data("a\n  {%+ if x +%}\nb"), "a\n  \nb");
        assert_eq!(data("  {# c #}\nx"), "x");
        assert_eq!(data("x {{ y }}  {% if %}"), "x   ");
        assert_eq!(data("x\r\ny\n"), "x\ny");
        assert_eq!(data("a {#- c -#} b"), "ab");
        assert_eq!(data("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
        assert_eq!(data("{% raw -%}  {{ x }}  {%- endraw %}\n"), "{{ x }}");
    }

    #[test]
    fn literals_and_operators() {
        assert_eq!(toks("{{ 1_000 + 2.5e1 // 0x1F }}")[1..6].to_vec(),
            [Tok::Int(1000), Tok::Op("+"), Tok::Float(25.0), Tok::Op("//"), Tok::Int(31)]);
        assert_eq!(toks("{{ x.1.2 }}")[1..6].to_vec(), [Tok::Name("x".into()), Tok::Op("."), Tok::Int(1), Tok::Op("."), Tok::Int(2)]);
        assert_eq!(toks(r#"{{ 'a\n\x41\u00e9\'\q' "b" }}"#)[1..3].to_vec(), [Tok::Str("a\nAé'\\q".into()), Tok::Str("b".into())]);
        assert_eq!(toks("{{ {'a': {}} }}").len(), 9);
        assert_eq!(toks("{{ 'a\nb' }}")[1], Tok::Str("a\nb".into()));
    }

    #[test]
    fn errors_carry_positions() {
        let e = tokenize("{{ a ) }}").unwrap_err();
        assert_eq!((e.msg.as_str(), e.pos), ("unexpected ')'", 5));
        assert!(tokenize("x {# y").unwrap_err().msg.contains("comment"));
        assert!(tokenize("{{ 'abc }}").unwrap_err().msg.contains("unexpected char"));
        assert!(tokenize("{% raw %} x").unwrap_err().msg.contains("raw"));
    }
}
