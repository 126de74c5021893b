//! A JSON reader (RFC 8259) and a small writer, for config files, safetensors headers,
//! tokenizer files and manifests.
//!
//! The reader accepts exactly the RFC grammar: no comments, no trailing commas, no leading
//! zeros, no bare control characters in strings, escapes including UTF-16 surrogate pairs
//! (a lone surrogate is an error, since the result must be a Rust `String`). Nesting is
//! bounded by a depth limit so a hostile file cannot overflow the stack. Every error carries
//! the byte offset where the input stopped making sense.
//!
//! Numbers keep their exact value when they are integers that fit in 64 bits (safetensors
//! offsets exceed 2^53); all others are parsed to the nearest `f64`.

use std::fmt::Write as _;

/// Default nesting limit: far above any real config or header, far below the stack's limit.
pub const DEFAULT_MAX_DEPTH: usize = 128;

/// A parsed JSON value. Objects keep their keys in file order (duplicates are kept; callers
/// that need unique keys check them, as the safetensors header reader does). [`Json::get`]
/// answers with the *last* of repeated keys, as Python's `json` module does: a config.json
/// means what transformers reads from it.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, kept as written where it is an integer (see [`Number`]).
    Number(Number),
    /// A string, unescaped.
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// An object, its members in file order (duplicate keys are refused by the parser).
    Object(Vec<(String, Json)>),
}

/// A JSON number: exact when it is an integer in the `i64`/`u64` range, else an `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    /// A non-negative integer without fraction or exponent.
    U64(u64),
    /// A negative integer without fraction or exponent.
    I64(i64),
    /// Anything else, rounded to the nearest double.
    F64(f64),
}

impl Number {
    /// The value as an `f64` (integers beyond 2^53 round).
    pub fn as_f64(self) -> f64 {
        match self {
            Number::U64(v) => v as f64,
            Number::I64(v) => v as f64,
            Number::F64(v) => v,
        }
    }
}

/// A parse failure: what was wrong and the byte offset where it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonError {
    /// Byte offset into the input.
    pub offset: usize,
    /// What was expected or found.
    pub message: String,
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid JSON at byte {}: {}", self.offset, self.message)
    }
}

/// Parses a complete JSON text with the default depth limit.
pub fn parse(input: &[u8]) -> Result<Json, JsonError> {
    parse_with_depth(input, DEFAULT_MAX_DEPTH)
}

/// Parses a complete JSON text; arrays and objects may nest at most `max_depth` deep.
pub fn parse_with_depth(input: &[u8], max_depth: usize) -> Result<Json, JsonError> {
    // RFC 8259 §8.1: a JSON text must not begin with a byte order mark (Python's json.loads
    // refuses one too); name it, rather than report its first byte as a stray character.
    if input.starts_with(b"\xEF\xBB\xBF") {
        return Err(JsonError { offset: 0, message: "the text begins with a UTF-8 byte order mark (EF BB BF), which JSON does not allow".into() });
    }
    let mut p = Parser { s: input, i: 0, max_depth };
    p.skip_ws();
    let v = p.value(0)?;
    p.skip_ws();
    if p.i != p.s.len() {
        return Err(p.err("unexpected data after the JSON value"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    max_depth: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, message: impl Into<String>) -> JsonError {
        JsonError { offset: self.i, message: message.into() }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn expect_word(&mut self, word: &[u8], v: Json) -> Result<Json, JsonError> {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.err("invalid literal"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, JsonError> {
        match self.peek() {
            None => Err(self.err("unexpected end of input")),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(b't') => self.expect_word(b"true", Json::Bool(true)),
            Some(b'f') => self.expect_word(b"false", Json::Bool(false)),
            Some(b'n') => self.expect_word(b"null", Json::Null),
            Some(b'-' | b'0'..=b'9') => Ok(Json::Number(self.number()?)),
            Some(c) => Err(self.err(format!("unexpected character {:?}", c as char))),
        }
    }

    fn check_depth(&self, depth: usize) -> Result<(), JsonError> {
        if depth > self.max_depth {
            return Err(self.err(format!("nesting deeper than {} levels", self.max_depth)));
        }
        Ok(())
    }

    fn array(&mut self, depth: usize) -> Result<Json, JsonError> {
        self.check_depth(depth)?;
        self.i += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(Json::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(Json::Array(items));
                }
                None => return Err(self.err("unexpected end of input in array")),
                _ => return Err(self.err("expected ',' or ']' in array")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, JsonError> {
        self.check_depth(depth)?;
        self.i += 1; // '{'
        let mut members = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.err("expected a string key in object"));
            }
            let key = self.string()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.err("expected ':' after object key"));
            }
            self.i += 1;
            self.skip_ws();
            let v = self.value(depth)?;
            members.push((key, v));
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(Json::Object(members));
                }
                None => return Err(self.err("unexpected end of input in object")),
                _ => return Err(self.err("expected ',' or '}' in object")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let Some(h) = self.s.get(self.i..self.i + 4) else {
            return Err(self.err("truncated \\u escape"));
        };
        let mut v = 0u32;
        for &c in h {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return Err(self.err("invalid hex digit in \\u escape")),
            };
            v = v * 16 + d as u32;
        }
        self.i += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.i += 1; // opening quote
        let mut out: Vec<u8> = Vec::new();
        loop {
            // Copy the run of plain bytes in one go.
            let start = self.i;
            while let Some(c) = self.peek() {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.i += 1;
            }
            out.extend_from_slice(&self.s[start..self.i]);
            match self.peek() {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    break;
                }
                Some(b'\\') => {
                    self.i += 1;
                    let Some(e) = self.peek() else {
                        return Err(self.err("unterminated escape"));
                    };
                    self.i += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => {
                            self.i -= 1;
                            return Err(self.err(format!("invalid escape \\{}", e as char)));
                        }
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                Some(_) => return Err(self.err("control character in string")),
            }
        }
        String::from_utf8(out).map_err(|e| JsonError {
            offset: self.i, // the string's end; the exact byte is inside it
            message: format!("invalid UTF-8 in string: {e}"),
        })
    }

    /// The character of a `\uXXXX` escape whose `\u` has been consumed, joining surrogate pairs.
    fn unicode_escape(&mut self) -> Result<char, JsonError> {
        let at = self.i - 2;
        let hi = self.hex4()?;
        let code = if (0xD800..0xDC00).contains(&hi) {
            if self.s.get(self.i..self.i + 2) != Some(b"\\u") {
                return Err(JsonError { offset: at, message: "lone high surrogate".into() });
            }
            self.i += 2;
            let lo = self.hex4()?;
            if !(0xDC00..0xE000).contains(&lo) {
                return Err(JsonError { offset: at, message: "invalid low surrogate".into() });
            }
            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
        } else if (0xDC00..0xE000).contains(&hi) {
            return Err(JsonError { offset: at, message: "lone low surrogate".into() });
        } else {
            hi
        };
        char::from_u32(code).ok_or(JsonError { offset: at, message: "invalid code point".into() })
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<Number, JsonError> {
        let start = self.i;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.i += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.err("leading zero in number"));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("expected a digit")),
        }
        let mut integral = true;
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(self.err("expected a digit after '.'"));
            }
            integral = false;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("expected a digit in exponent"));
            }
            integral = false;
        }
        // The grammar above only admits ASCII, so this cannot fail; map rather than unwrap.
        let text = std::str::from_utf8(&self.s[start..self.i])
            .map_err(|_| JsonError { offset: start, message: "invalid number".into() })?;
        if integral {
            if negative {
                if let Ok(v) = text.parse::<i64>() {
                    return Ok(Number::I64(v));
                }
            } else if let Ok(v) = text.parse::<u64>() {
                return Ok(Number::U64(v));
            }
        }
        text.parse::<f64>()
            .map(Number::F64)
            .map_err(|_| JsonError { offset: start, message: "invalid number".into() })
    }
}

impl Json {
    /// The member `key` of an object (the last, if repeated: Python's `json`, and so
    /// transformers, keeps the last); `None` for other values.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(m) => m.iter().rfind(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The number as `f64`, if this is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Number(n) => Some(n.as_f64()),
            _ => None,
        }
    }

    /// The number as `u64`, if it is a non-negative integer (`3.0` counts: some writers emit it).
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Number(Number::U64(v)) => Some(*v),
            Json::Number(Number::F64(f)) if *f >= 0.0 && f.fract() == 0.0 && *f < 9.007e15 => {
                Some(*f as u64)
            }
            _ => None,
        }
    }

    /// The number as `i64`, if it is an integer in range.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Number(Number::I64(v)) => Some(*v),
            Json::Number(Number::U64(v)) => i64::try_from(*v).ok(),
            Json::Number(Number::F64(f)) if f.fract() == 0.0 && f.abs() < 9.007e15 => {
                Some(*f as i64)
            }
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The members in file order, if this is an object.
    pub fn as_object(&self) -> Option<&[(String, Json)]> {
        match self {
            Json::Object(m) => Some(m),
            _ => None,
        }
    }

    /// True for `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }

    /// Serializes compactly (no spaces), keys in stored order. Non-finite floats become `null`.
    pub fn to_string_compact(&self) -> String {
        let mut out = String::new();
        self.write_to(&mut out, None, 0);
        out
    }

    /// Serializes with two-space indentation, keys in stored order.
    pub fn to_string_pretty(&self) -> String {
        let mut out = String::new();
        self.write_to(&mut out, Some(2), 0);
        out
    }

    fn write_to(&self, out: &mut String, indent: Option<usize>, level: usize) {
        let newline = |out: &mut String, level: usize| {
            if let Some(n) = indent {
                out.push('\n');
                out.extend(std::iter::repeat_n(' ', n * level));
            }
        };
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(Number::U64(v)) => {
                let _ = write!(out, "{v}");
            }
            Json::Number(Number::I64(v)) => {
                let _ = write!(out, "{v}");
            }
            Json::Number(Number::F64(v)) => write_f64(out, *v),
            Json::String(s) => write_string(out, s),
            Json::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    newline(out, level + 1);
                    v.write_to(out, indent, level + 1);
                }
                if !a.is_empty() {
                    newline(out, level);
                }
                out.push(']');
            }
            Json::Object(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    newline(out, level + 1);
                    write_string(out, k);
                    out.push(':');
                    if indent.is_some() {
                        out.push(' ');
                    }
                    v.write_to(out, indent, level + 1);
                }
                if !m.is_empty() {
                    newline(out, level);
                }
                out.push('}');
            }
        }
    }
}

/// Writes a double so that it parses back to the same value (Rust's shortest round-trip form).
pub fn write_f64(out: &mut String, v: f64) {
    if !v.is_finite() {
        out.push_str("null");
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{v:.1}");
    } else {
        let _ = write!(out, "{v}");
    }
}

/// Writes `s` as a JSON string literal with the escapes RFC 8259 requires.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Convenience constructors for building documents to write.
impl Json {
    /// An object from `(key, value)` pairs.
    pub fn object<K: Into<String>>(members: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Object(members.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
    /// A string value.
    pub fn str(s: impl Into<String>) -> Json {
        Json::String(s.into())
    }
    /// An exact unsigned integer value.
    pub fn uint(v: u64) -> Json {
        Json::Number(Number::U64(v))
    }
    /// A floating-point value.
    pub fn float(v: f64) -> Json {
        Json::Number(Number::F64(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    #[test]
    fn parses_the_rfc_examples() {
        let v = parse(br#"{"a": [1, -2, 3.5e2, true, false, null], "b": "x\u00e9\ud83d\ude00\n"}"#)
            .must();
        assert_eq!(v.get("a").must().as_array().must().len(), 6);
        assert_eq!(v.get("a").must().as_array().must()[2].as_f64(), Some(350.0));
        assert_eq!(v.get("b").must().as_str(), Some("xé😀\n"));
        assert_eq!(parse(b"18446744073709551615").must().as_u64(), Some(u64::MAX));
        assert_eq!(parse(b"-9223372036854775808").must().as_i64(), Some(i64::MIN));
        assert_eq!(parse(b" 1e400 ").must().as_f64(), Some(f64::INFINITY));
    }

    #[test]
    fn rejects_what_the_grammar_rejects_with_an_offset() {
        for (text, offset) in [
            (&b"[1,]"[..], 3),
            (b"{\"a\":1,}", 7),
            (b"01", 1),
            (b"[1 2]", 3),
            (b"\"\\x\"", 2),
            (b"\"a\nb\"", 2),
            (b"\"\\ud800\"", 1),
            (b"\"\\udc00\"", 1),
            (b"nul", 0),
            (b"1.", 2),
            (b"-", 1),
            (b"{} x", 3),
            (b"", 0),
            (b"\"abc", 4),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.offset, offset, "{:?}: {e}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn bounds_nesting_depth() {
        let deep = "[".repeat(200) + &"]".repeat(200);
        let e = parse(deep.as_bytes()).unwrap_err();
        assert!(e.message.contains("nesting"), "{e}");
        assert_eq!(e.offset, DEFAULT_MAX_DEPTH);
        let ok = "[".repeat(100) + &"]".repeat(100);
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn repeated_keys_answer_with_the_last_as_python_does() {
        let v = parse(br#"{"a": 1, "b": 2, "a": 3}"#).must();
        assert_eq!(v.get("a").must().as_u64(), Some(3));
        assert_eq!(v.get("b").must().as_u64(), Some(2));
        assert_eq!(v.as_object().must().len(), 3, "every member is kept for callers that refuse repeats");
    }

    #[test]
    fn a_byte_order_mark_is_named() {
        let e = parse(b"\xEF\xBB\xBF{}").unwrap_err();
        assert_eq!(e.offset, 0);
        assert!(e.message.contains("UTF-8 byte order mark"), "{e}");
        assert!(parse(b" \xEF\xBB\xBF{}").unwrap_err().message.contains("unexpected character"));
    }

    #[test]
    fn invalid_utf8_in_a_string_is_an_error() {
        assert!(parse(b"\"\xff\"").unwrap_err().message.contains("UTF-8"));
    }

    #[test]
    fn writer_round_trips() {
        let v = parse(br#"{"k":[1,-1,0.5,"a\"\\\u0001",{"n":null}],"e":1e-7}"#).must();
        assert_eq!(parse(v.to_string_compact().as_bytes()).must(), v);
        assert_eq!(parse(v.to_string_pretty().as_bytes()).must(), v);
    }
}
