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

/// What one parse may hold in memory when nothing tighter is known: the input, the tree and its
/// strings together (the largest real tokenizer.json, ~33 MB, needs ~3x its size).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// The least a budget-derived limit allows, so small budgets still open real configs and
/// tokenizer files; also the limit for JSON read while a model is already held (templates,
/// tokenizer_config.json, state sections), which must not add more than this to the budget.
pub const SMALL_MAX_BYTES: u64 = 32 << 20;

/// The memory one parse may take. The input's bytes count, and every node, array slot and
/// string byte of the tree as allocated (with the allocator's per-block header), so the limit
/// bounds the parse's peak heap: at most `max_bytes / size_of::<Json>()` values and
/// `max_bytes` string bytes, whatever the text. See docs/RELIABILITY.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Arrays and objects may nest at most this deep.
    pub max_depth: usize,
    /// Input bytes plus tree bytes.
    pub max_bytes: u64,
    /// Where the limit comes from, for the error message.
    pub source: &'static str,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_depth: DEFAULT_MAX_DEPTH, max_bytes: DEFAULT_MAX_BYTES, source: "the default parse limit" }
    }
}

impl Limits {
    /// The limit for files read while opening a model under `budget` bytes, before anything large is
    /// held: the budget itself (never under [`SMALL_MAX_BYTES`]), or the default without one.
    pub fn for_budget(budget: Option<u64>) -> Limits {
        match budget {
            Some(b) => Limits { max_bytes: b.max(SMALL_MAX_BYTES), source: "the parse limit under --budget (the budget, at least 32 MiB)", ..Limits::default() },
            None => Limits::default(),
        }
    }

    /// The limit for JSON read while a model is held (it adds to the budget).
    pub fn small() -> Limits {
        Limits { max_bytes: SMALL_MAX_BYTES, source: "the 32 MiB parse limit for files read beside a loaded model", ..Limits::default() }
    }

    /// An error when an input of `len` bytes could not even be held under this limit.
    pub fn check_input(&self, len: u64) -> Result<(), JsonError> {
        if len > self.max_bytes {
            return Err(JsonError { offset: 0, message: format!(
                "{len} bytes of input exceed {} ({} bytes)", self.source, self.max_bytes) });
        }
        Ok(())
    }
}

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

/// Parses a complete JSON text under the default [`Limits`].
pub fn parse(input: &[u8]) -> Result<Json, JsonError> {
    parse_limited(input, &Limits::default())
}

/// Parses a complete JSON text; arrays and objects may nest at most `max_depth` deep.
pub fn parse_with_depth(input: &[u8], max_depth: usize) -> Result<Json, JsonError> {
    parse_limited(input, &Limits { max_depth, ..Limits::default() })
}

/// Parses a complete JSON text whose tree, with the input, must fit `limits`.
pub fn parse_limited(input: &[u8], limits: &Limits) -> Result<Json, JsonError> {
    let mut p = Parser::start(input, limits)?;
    let v = p.value(0)?;
    p.finish()?;
    Ok(v)
}

/// Parses a JSON text that must be an object, handing each member to `member` as soon as it
/// is parsed instead of building the whole tree: only one member's tree is held at a time.
/// `member` answers with the bytes it keeps from the member (charged against `limits` until
/// the end) or an error message, reported at the member's offset.
pub fn for_each_member(
    input: &[u8],
    limits: &Limits,
    mut member: impl FnMut(String, Json) -> Result<u64, String>,
) -> Result<(), JsonError> {
    let mut p = Parser::start(input, limits)?;
    if p.peek() != Some(b'{') {
        return Err(p.err("the text is not a JSON object"));
    }
    p.i += 1;
    p.skip_ws();
    if p.peek() == Some(b'}') {
        p.i += 1;
        return p.finish();
    }
    loop {
        p.skip_ws();
        let at = p.i;
        let before = p.used;
        let (key, v) = p.member(1)?;
        let kept = member(key, v).map_err(|message| JsonError { offset: at, message })?;
        p.used = before;
        p.charge(kept)?;
        p.skip_ws();
        match p.peek() {
            Some(b',') => p.i += 1,
            Some(b'}') => {
                p.i += 1;
                return p.finish();
            }
            None => return Err(p.err("unexpected end of input in object")),
            _ => return Err(p.err("expected ',' or '}' in object")),
        }
    }
}

/// The allocator's bookkeeping per heap block, charged with each allocation.
const BLOCK_OVERHEAD: u64 = 16;

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    max_depth: usize,
    /// Bytes held so far: the input, then each allocation of the tree.
    used: u64,
    limits: Limits,
    values: u64,
    string_bytes: u64,
}

impl<'a> Parser<'a> {
    fn start(input: &'a [u8], limits: &Limits) -> Result<Parser<'a>, JsonError> {
        // RFC 8259 §8.1: a JSON text must not begin with a byte order mark (Python's json.loads
        // refuses one too); name it, rather than report its first byte as a stray character.
        if input.starts_with(b"\xEF\xBB\xBF") {
            return Err(JsonError { offset: 0, message: "the text begins with a UTF-8 byte order mark (EF BB BF), which JSON does not allow".into() });
        }
        limits.check_input(input.len() as u64)?;
        let mut p = Parser { s: input, i: 0, max_depth: limits.max_depth, used: input.len() as u64, limits: *limits, values: 0, string_bytes: 0 };
        p.skip_ws();
        Ok(p)
    }

    fn finish(&mut self) -> Result<(), JsonError> {
        self.skip_ws();
        if self.i != self.s.len() {
            return Err(self.err("unexpected data after the JSON value"));
        }
        Ok(())
    }

    /// Counts `bytes` more against the limit, failing with the counts so far when it is passed.
    fn charge(&mut self, bytes: u64) -> Result<(), JsonError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limits.max_bytes {
            return Err(self.err(format!(
                "holding this document takes more than {} ({} bytes): {} input bytes, {} values and {} string bytes parsed so far",
                self.limits.source, self.limits.max_bytes, self.s.len(), self.values, self.string_bytes)));
        }
        Ok(())
    }

    /// Pushes onto `v`, growing it by doubling with each new block charged before it is taken.
    fn push<T>(&mut self, v: &mut Vec<T>, x: T) -> Result<(), JsonError> {
        if v.len() == v.capacity() {
            let add = v.capacity().max(4);
            self.charge((add * std::mem::size_of::<T>()) as u64 + BLOCK_OVERHEAD)?;
            v.reserve_exact(add);
        }
        v.push(x);
        Ok(())
    }

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
        self.values += 1;
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
            let v = self.value(depth)?;
            self.push(&mut items, v)?;
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
            let m = self.member(depth)?;
            self.push(&mut members, m)?;
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

    /// One `"key": value` of an object at `depth`.
    fn member(&mut self, depth: usize) -> Result<(String, Json), JsonError> {
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
        Ok((key, v))
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
        // The decoded string is never longer than its text (every escape shrinks or keeps its
        // length), so one block of the text's length holds it: charged before it is taken.
        let mut end = self.i;
        while let Some(&c) = self.s.get(end) {
            match c {
                b'"' => break,
                b'\\' => end += 2,
                _ => end += 1,
            }
        }
        let raw = end.min(self.s.len()) - self.i;
        if raw > 0 {
            self.charge(raw as u64 + BLOCK_OVERHEAD)?;
            self.string_bytes += raw as u64;
        }
        let mut out: Vec<u8> = Vec::with_capacity(raw);
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
    fn the_tree_is_held_within_the_limit_whatever_the_text() {
        let limits = Limits { max_bytes: 1 << 20, ..Limits::default() };
        // One-byte values: a tree ~12x its text; refused once it would pass the limit.
        let ones = format!("[{}1]", "1,".repeat(200_000));
        let e = parse_limited(ones.as_bytes(), &limits).unwrap_err();
        assert!(e.message.contains("the default parse limit (1048576 bytes)") && e.message.contains("values"), "{e}");
        // A long string is charged before it is allocated.
        let long = format!("\"{}\"", "x".repeat(2 << 20));
        let e = parse_limited(long.as_bytes(), &Limits { max_bytes: 3 << 20, ..limits }).unwrap_err();
        assert!(e.message.contains("string bytes"), "{e}");
        // Input alone over the limit is refused at byte 0.
        assert_eq!(parse_limited(long.as_bytes(), &limits).unwrap_err().offset, 0);
        // What fits parses to the same tree as without limits.
        let small = br#"{"a": [1, 2, {"b": "c\u00e9"}], "d": null}"#;
        assert_eq!(parse_limited(small, &Limits { max_bytes: 4096, ..limits }).must(), parse(small).must());
    }

    #[test]
    fn members_are_handed_over_one_at_a_time() {
        let text = br#"{"a": {"x": [1, 2]}, "b": 3}"#;
        let mut seen = Vec::new();
        for_each_member(text, &Limits::default(), |k, v| {
            seen.push((k, v));
            Ok(0)
        }).must();
        assert_eq!(Json::Object(seen), parse(text).must());
        let e = for_each_member(text, &Limits::default(), |k, _| if k == "b" { Err("no b".into()) } else { Ok(0) }).unwrap_err();
        assert_eq!((e.offset, e.message.as_str()), (21, "no b"));
        assert!(for_each_member(b"[]", &Limits::default(), |_, _| Ok(0)).unwrap_err().message.contains("not a JSON object"));
        // Each member's tree is released: many members each under the limit pass, whereas
        // the bytes kept accumulate.
        let many = format!("{{{}\"z\": 0}}", (0..20_000).map(|i| format!("\"k{i}\": [1, 2, 3, 4],")).collect::<String>());
        let limits = Limits { max_bytes: many.len() as u64 + 4096, ..Limits::default() };
        assert!(for_each_member(many.as_bytes(), &limits, |_, _| Ok(0)).is_ok());
        assert!(parse_limited(many.as_bytes(), &limits).is_err());
        assert!(for_each_member(many.as_bytes(), &limits, |_, _| Ok(100)).unwrap_err().message.contains("parse limit"));
    }

    #[test]
    fn writer_round_trips() {
        let v = parse(br#"{"k":[1,-1,0.5,"a\"\\\u0001",{"n":null}],"e":1e-7}"#).must();
        assert_eq!(parse(v.to_string_compact().as_bytes()).must(), v);
        assert_eq!(parse(v.to_string_pretty().as_bytes()).must(), v);
    }
}
