//! Python's text forms of values, byte for byte: `str()` (what `{{ x }}` prints), `repr()`
//! (inside lists and dicts, and `|string` of a container), `float.__repr__`, `json.dumps` (the
//! `tojson` filter) and printf-style `%` formatting.
//!
//! Everything writes into a [`PBuilder`]: the characters of strings keep their origin, and the
//! structure around them (brackets, quotes, separators, numbers) takes the origin of the
//! container or scalar it belongs to.

use super::pstr::{Origin, PBuilder, PStr};
use super::value::{number, Builtin, Dict, Num, Object, Value};

/// Containers nested deeper than this cannot be printed (the evaluator keeps values shallower;
/// this bounds a namespace that holds itself).
const MAX_PRINT_DEPTH: usize = 256;

/// Python `float.__repr__`: the shortest digits that round-trip, positional for exponents in
/// -4..16 (with `.0` when integral), else scientific with a two-digit exponent.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let decpt = exp + 1;
        let body = if decpt <= 0 {
            format!("0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if decpt as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(decpt as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..decpt as usize], &digits[decpt as usize..])
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

/// Python `str(v)` as a provenance string.
pub fn to_pstr(v: &Value) -> PStr {
    if let Value::Str(s) = v {
        return s.clone();
    }
    let mut b = PBuilder::new();
    write_str(v, &mut b);
    b.finish()
}

/// Python `str(v)`: what `{{ v }}` prints (an undefined value prints nothing).
pub fn write_str(v: &Value, out: &mut PBuilder) {
    match v {
        Value::Undefined(_) => {}
        Value::Str(s) => out.push_pstr(s),
        _ => write_repr(v, out, 0),
    }
}

/// Python `repr(v)`.
pub fn write_repr(v: &Value, out: &mut PBuilder, depth: usize) {
    repr_rec(v, out, depth, v.origin(), &mut Vec::new());
}

/// `repr` with the namespaces being printed (`active`): one that holds itself prints its
/// attributes as `{...}` the second time, as Python's recursion guard does.
/// `frame` is the origin of the enclosing container's structure (a string's quotes take it).
fn repr_rec(v: &Value, out: &mut PBuilder, depth: usize, frame: Origin, active: &mut Vec<usize>) {
    if depth > MAX_PRINT_DEPTH {
        out.push("...", Origin::Markup);
        return;
    }
    match v {
        Value::Undefined(_) => out.push("Undefined", Origin::Markup),
        Value::None(o) => out.push("None", *o),
        Value::Bool(b, o) => out.push(if *b { "True" } else { "False" }, *o),
        Value::Int(i, o) => out.push(&i.to_string(), *o),
        Value::Float(f, o) => out.push(&float_repr(*f), *o),
        Value::Str(s) => write_repr_pstr(s, frame, out),
        Value::List(l) => {
            let o = l.origin;
            out.push(if l.tuple { "(" } else { "[" }, o);
            for (i, item) in l.items.iter().enumerate() {
                if out.is_full() {
                    return;
                }
                if i > 0 {
                    out.push(", ", o);
                }
                repr_rec(item, out, depth + 1, o, active);
            }
            if l.tuple && l.items.len() == 1 {
                out.push(",", o);
            }
            out.push(if l.tuple { ")" } else { "]" }, o);
        }
        Value::Dict(d) => write_dict_repr(d, out, depth, active),
        Value::Namespace(ns) => {
            let id = std::rc::Rc::as_ptr(ns) as usize;
            if active.contains(&id) {
                out.push("<Namespace {...}>", Origin::Markup);
                return;
            }
            active.push(id);
            out.push("<Namespace {", Origin::Markup);
            for (i, (k, v)) in ns.attrs.borrow().iter().enumerate() {
                if i > 0 {
                    out.push(", ", Origin::Markup);
                }
                write_repr_pstr(&PStr::markup(k), Origin::Markup, out);
                out.push(": ", Origin::Markup);
                repr_rec(v, out, depth + 1, Origin::Markup, active);
            }
            out.push("}>", Origin::Markup);
            active.pop();
        }
        Value::Object(o) => out.push(&object_repr(o), Origin::Markup),
    }
}

fn write_dict_repr(d: &Dict, out: &mut PBuilder, depth: usize, active: &mut Vec<usize>) {
    let o = d.origin;
    out.push("{", o);
    for (i, (k, v)) in d.entries().iter().enumerate() {
        if out.is_full() {
            return;
        }
        if i > 0 {
            out.push(", ", o);
        }
        repr_rec(k, out, depth + 1, o, active);
        out.push(": ", o);
        repr_rec(v, out, depth + 1, o, active);
    }
    out.push("}", o);
}

/// Python's repr of objects that are not data (without the memory addresses Python shows).
fn object_repr(o: &Object) -> String {
    match o {
        Object::Macro(m) => match &m.def.name {
            Some(n) => format!("<Macro {}>", super::value::py_str_repr(n)),
            None => "<Macro anonymous>".into(),
        },
        Object::Builtin(Builtin::Range) => "<class 'range'>".into(),
        Object::Builtin(b) => format!("<function {}>", b.name()),
        Object::Method(recv, name) => format!("<built-in method {name} of {} object>", recv.type_name()),
        Object::Loop(l) => format!("<LoopContext {}/{}>", l.index.get() + 1, l.items.len()),
        Object::Joiner { .. } => "<jinja2.utils.Joiner object>".into(),
        Object::Cycler { .. } => "<jinja2.utils.Cycler object>".into(),
    }
}

/// Python's repr of a string: quotes (with `quote_origin`) chosen as Python chooses, escapes
/// with the origin of the character they stand for.
pub fn write_repr_pstr(s: &PStr, quote_origin: Origin, out: &mut PBuilder) {
    let text = s.as_str();
    let q = if text.contains('\'') && !text.contains('"') { '"' } else { '\'' };
    out.push_char(q, quote_origin);
    for (a, b, o) in s.runs() {
        let mut part = String::new();
        escape_repr(&text[a..b], q, &mut part);
        out.push(&part, o);
    }
    out.push_char(q, quote_origin);
}

/// Python's repr of a plain string, written through `f`.
pub fn repr_str_into(s: &str, f: &mut dyn FnMut(&str)) {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    escape_repr(s, q, &mut out);
    out.push(q);
    f(&out);
}

fn escape_repr(s: &str, q: char, out: &mut String) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x7f || is_printable(c) => out.push(c),
            c if (c as u32) <= 0xff => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
}

/// Python's `str.isprintable` for one non-ASCII character: false for controls, separators
/// other than the space, format characters, private use and noncharacters. (Unassigned code
/// points, which Python also escapes, need the full Unicode tables and count as printable.)
pub fn is_printable(c: char) -> bool {
    let u = c as u32;
    let not_printable = matches!(u,
        0x80..=0xa0 | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2 | 0x1680 | 0x180e
        | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f | 0x3000 | 0xd800..=0xf8ff
        | 0xfdd0..=0xfdef | 0xfeff | 0xfff9..=0xfffb | 0x110bd | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3
        | 0x1d173..=0x1d17a | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..);
    !not_printable && (u & 0xfffe) != 0xfffe
}

/// `json.dumps` arguments.
#[derive(Clone, Debug)]
pub struct JsonOpts {
    pub ensure_ascii: bool,
    /// The indentation unit; `None` writes everything on one line.
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl Default for JsonOpts {
    fn default() -> JsonOpts {
        JsonOpts { ensure_ascii: false, indent: None, item_sep: ", ".into(), key_sep: ": ".into(), sort_keys: false }
    }
}

/// Python `json.dumps(v, ...)`; the error is Python's `TypeError`/`ValueError` message.
pub fn dumps(v: &Value, opts: &JsonOpts, out: &mut PBuilder) -> Result<(), String> {
    dump(v, opts, out, 0, v.origin())
}

/// `frame` is the origin of the enclosing container's structure (a string's quotes take it).
fn dump(v: &Value, opts: &JsonOpts, out: &mut PBuilder, level: usize, frame: Origin) -> Result<(), String> {
    if level > MAX_PRINT_DEPTH {
        return Err("Circular reference detected".into());
    }
    match v {
        Value::None(o) => out.push("null", *o),
        Value::Bool(b, o) => out.push(if *b { "true" } else { "false" }, *o),
        Value::Int(i, o) => out.push(&i.to_string(), *o),
        Value::Float(f, o) => out.push(&json_float(*f), *o),
        Value::Str(s) => json_string(s, frame, opts.ensure_ascii, out),
        Value::List(l) => {
            let o = l.origin;
            if l.items.is_empty() {
                out.push("[]", o);
                return Ok(());
            }
            out.push("[", o);
            for (i, item) in l.items.iter().enumerate() {
                if out.is_full() {
                    return Ok(());
                }
                separate(opts, i, level + 1, o, out);
                dump(item, opts, out, level + 1, o)?;
            }
            close(opts, level, "]", o, out);
        }
        Value::Dict(d) => dump_dict(d, opts, out, level)?,
        _ => return Err(format!("Object of type {} is not JSON serializable", v.type_name())),
    }
    Ok(())
}

/// Writes what comes before item `i` of a container at nesting `level` (1 = top container).
fn separate(opts: &JsonOpts, i: usize, level: usize, o: Origin, out: &mut PBuilder) {
    if i > 0 {
        out.push(&opts.item_sep, o);
    }
    if let Some(unit) = &opts.indent {
        out.push("\n", o);
        out.push(&unit.repeat(level), o);
    }
}

fn close(opts: &JsonOpts, level: usize, bracket: &str, o: Origin, out: &mut PBuilder) {
    if let Some(unit) = &opts.indent {
        out.push("\n", o);
        out.push(&unit.repeat(level), o);
    }
    out.push(bracket, o);
}

fn dump_dict(d: &Dict, opts: &JsonOpts, out: &mut PBuilder, level: usize) -> Result<(), String> {
    let o = d.origin;
    if d.is_empty() {
        out.push("{}", o);
        return Ok(());
    }
    let mut entries: Vec<&(Value, Value)> = d.entries().iter().collect();
    if opts.sort_keys {
        let mut err = None;
        entries.sort_by(|a, b| match super::value::py_cmp(&a.0, &b.0, "<") {
            Ok(ord) => ord.unwrap_or(std::cmp::Ordering::Equal),
            Err(e) => {
                err.get_or_insert(e);
                std::cmp::Ordering::Equal
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
    }
    out.push("{", o);
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if out.is_full() {
            return Ok(());
        }
        separate(opts, i, level + 1, o, out);
        match k {
            Value::Str(s) => json_string(s, o, opts.ensure_ascii, out),
            Value::None(ko) => json_string(&PStr::new("null", *ko), *ko, false, out),
            Value::Bool(b, ko) => json_string(&PStr::new(if *b { "true" } else { "false" }, *ko), *ko, false, out),
            Value::Int(n, ko) => json_string(&PStr::new(&n.to_string(), *ko), *ko, false, out),
            Value::Float(f, ko) => json_string(&PStr::new(&json_float(*f), *ko), *ko, false, out),
            other => return Err(format!("keys must be str, int, float, bool or None, not {}", other.type_name())),
        }
        out.push(&opts.key_sep, o);
        dump(v, opts, out, level + 1, o)?;
    }
    close(opts, level, "}", o, out);
    Ok(())
}

fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity".into() } else { "-Infinity".into() }
    } else {
        float_repr(f)
    }
}

/// A JSON string literal: the quotes take `quote_origin`, each escape its character's origin.
fn json_string(s: &PStr, quote_origin: Origin, ensure_ascii: bool, out: &mut PBuilder) {
    out.push("\"", quote_origin);
    let text = s.as_str();
    for (a, b, o) in s.runs() {
        let mut part = String::with_capacity(b - a);
        for c in text[a..b].chars() {
            match c {
                '"' => part.push_str("\\\""),
                '\\' => part.push_str("\\\\"),
                '\n' => part.push_str("\\n"),
                '\r' => part.push_str("\\r"),
                '\t' => part.push_str("\\t"),
                '\u{8}' => part.push_str("\\b"),
                '\u{c}' => part.push_str("\\f"),
                c if (c as u32) < 0x20 => part.push_str(&format!("\\u{:04x}", c as u32)),
                c if ensure_ascii && (c as u32) >= 0x7f => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        part.push_str(&format!("\\u{:04x}", u));
                    }
                }
                c => part.push(c),
            }
        }
        out.push(&part, o);
    }
    out.push("\"", quote_origin);
}

/// Widths and precisions of `%` formatting are at most this (Python has no bound; a huge
/// one would only build a huge string).
const MAX_FIELD: usize = 1 << 16;

/// Python's printf-style `fmt % args` (conversions s r a d i u f F e E x X o c %, flags
/// `-+ 0#`, width and precision, `%(key)s` with a dict). Errors are Python's messages.
pub fn percent_format(fmt: &PStr, args: &Value) -> Result<PStr, String> {
    let (positional, mapping): (Vec<Value>, Option<&Dict>) = match args {
        Value::List(l) if l.tuple => (l.items.clone(), None),
        Value::Dict(d) => (vec![args.clone()], Some(d)),
        v => (vec![v.clone()], None),
    };
    let text = fmt.as_str();
    let mut out = PBuilder::new();
    let mut next = 0usize;
    let mut used_mapping = false;
    let mut i = 0;
    let mut literal_from = 0;
    let bytes = text.as_bytes();
    while i < bytes.len() {
        if bytes[i] != b'%' {
            i += 1;
            continue;
        }
        out.push_slice(fmt, literal_from, i);
        let spec_origin = fmt.origin_at(i);
        i += 1;
        let mut key = None;
        if bytes.get(i) == Some(&b'(') {
            let close = text[i..].find(')').ok_or("incomplete format key")?;
            key = Some(&text[i + 1..i + close]);
            i += close + 1;
        }
        let mut flags = String::new();
        while let Some(&c) = bytes.get(i).filter(|c| b"-+ #0".contains(c)) {
            flags.push(c as char);
            i += 1;
        }
        let mut take_star = |i: &mut usize| -> Result<Option<usize>, String> {
            if bytes.get(*i) == Some(&b'*') {
                *i += 1;
                let v = positional.get(next).ok_or("not enough arguments for format string")?;
                next += 1;
                return match v {
                    Value::Int(n, _) if *n <= MAX_FIELD as i64 => Ok(Some((*n).max(0) as usize)),
                    Value::Int(..) => Err(format!("a width or precision over {MAX_FIELD} is not supported")),
                    _ => Err("* wants int".into()),
                };
            }
            let start = *i;
            while bytes.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            match text[start..*i].parse::<usize>() {
                _ if *i == start => Ok(None),
                Ok(n) if n <= MAX_FIELD => Ok(Some(n)),
                _ => Err(format!("a width or precision over {MAX_FIELD} is not supported")),
            }
        };
        let width = take_star(&mut i)?;
        let precision = if bytes.get(i) == Some(&b'.') {
            i += 1;
            Some(take_star(&mut i)?.unwrap_or(0))
        } else {
            None
        };
        while bytes.get(i).is_some_and(|c| b"hlL".contains(c)) {
            i += 1;
        }
        let Some(&conv) = bytes.get(i) else { return Err("incomplete format".into()) };
        i += 1;
        literal_from = i;
        if conv == b'%' {
            out.push("%", spec_origin);
            continue;
        }
        let value = match (key, mapping) {
            (Some(k), Some(d)) => {
                used_mapping = true;
                d.get_str(k).cloned().ok_or_else(|| super::value::py_str_repr(k))?
            }
            (Some(_), None) => return Err("format requires a mapping".into()),
            (None, _) => {
                let v = positional.get(next).cloned().ok_or("not enough arguments for format string")?;
                next += 1;
                v
            }
        };
        let spec = Spec { flags: &flags, width, precision, conv: conv as char };
        format_one(&spec, &value, spec_origin, &mut out)?;
    }
    out.push_slice(fmt, literal_from, text.len());
    if !used_mapping && next < positional.len() && mapping.is_none() {
        return Err("not all arguments converted during string formatting".into());
    }
    Ok(out.finish())
}

struct Spec<'a> {
    flags: &'a str,
    width: Option<usize>,
    precision: Option<usize>,
    conv: char,
}

fn format_one(spec: &Spec, v: &Value, o: Origin, out: &mut PBuilder) -> Result<(), String> {
    let origin = o.join(v.origin());
    let body: PStr = match spec.conv {
        's' | 'r' | 'a' => {
            let s = if spec.conv == 's' { to_pstr(v) } else {
                let mut b = PBuilder::new();
                write_repr(v, &mut b, 0);
                b.finish()
            };
            match spec.precision {
                Some(p) => {
                    let end = s.as_str().char_indices().nth(p).map_or(s.len(), |(i, _)| i);
                    s.slice(0, end)
                }
                None => s,
            }
        }
        'd' | 'i' | 'u' | 'x' | 'X' | 'o' | 'c' => PStr::new(&format_int(spec, v)?, origin),
        'f' | 'F' | 'e' | 'E' => PStr::new(&format_float(spec, v)?, origin),
        c => return Err(format!("unsupported format character '{c}' (0x{:x})", c as u32)),
    };
    let len = body.as_str().chars().count();
    let pad = spec.width.unwrap_or(0).saturating_sub(len);
    let numeric = !matches!(spec.conv, 's' | 'r' | 'a' | 'c');
    if spec.flags.contains('-') {
        out.push_pstr(&body);
        out.push(&" ".repeat(pad), o);
    } else if spec.flags.contains('0') && numeric {
        let t = body.as_str();
        let sign_len = if t.starts_with(['-', '+', ' ']) { 1 } else { 0 };
        out.push(&t[..sign_len], origin);
        out.push(&"0".repeat(pad), o);
        out.push(&t[sign_len..], origin);
    } else {
        out.push(&" ".repeat(pad), o);
        out.push_pstr(&body);
    }
    Ok(())
}

fn sign_prefix(flags: &str, negative: bool) -> &'static str {
    if negative {
        "-"
    } else if flags.contains('+') {
        "+"
    } else if flags.contains(' ') {
        " "
    } else {
        ""
    }
}

fn format_int(spec: &Spec, v: &Value) -> Result<String, String> {
    let n: i64 = match (number(v), spec.conv) {
        (Some(Num::I(i)), _) => i,
        (Some(Num::F(f)), c) if c != 'c' && !matches!(c, 'x' | 'X' | 'o') && f.is_finite() => f.trunc() as i64,
        (_, 'c') => match v {
            Value::Str(s) if s.as_str().chars().count() == 1 => return Ok(s.as_str().to_string()),
            _ => return Err("%c requires an int or a unicode character, not str".into()),
        },
        (_, c) if matches!(c, 'x' | 'X' | 'o') => return Err(format!("%{c} format: an integer is required, not {}", v.type_name())),
        _ => return Err(format!("%{} format: a real number is required, not {}", spec.conv, v.type_name())),
    };
    if spec.conv == 'c' {
        return u32::try_from(n).ok().and_then(char::from_u32).map(String::from).ok_or_else(|| "%c arg not in range(0x110000)".into());
    }
    let mag = n.unsigned_abs();
    let alt = spec.flags.contains('#');
    let digits = match spec.conv {
        'x' => format!("{}{mag:x}", if alt { "0x" } else { "" }),
        'X' => format!("{}{mag:X}", if alt { "0X" } else { "" }),
        'o' => format!("{}{mag:o}", if alt { "0o" } else { "" }),
        _ => mag.to_string(),
    };
    let digits = match spec.precision {
        Some(p) if p > digits.len() => format!("{}{digits}", "0".repeat(p - digits.len())),
        _ => digits,
    };
    Ok(format!("{}{digits}", sign_prefix(spec.flags, n < 0)))
}

fn format_float(spec: &Spec, v: &Value) -> Result<String, String> {
    let f = match number(v) {
        Some(Num::I(i)) => i as f64,
        Some(Num::F(f)) => f,
        None => return Err(format!("must be real number, not {}", v.type_name())),
    };
    let p = spec.precision.unwrap_or(6);
    let upper = spec.conv.is_ascii_uppercase();
    let mag = f.abs();
    let body = if !f.is_finite() {
        let t = if f.is_nan() { "nan" } else { "inf" };
        if upper { t.to_uppercase() } else { t.to_string() }
    } else if matches!(spec.conv, 'f' | 'F') {
        format!("{mag:.p$}")
    } else {
        let s = format!("{mag:.p$e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        let t = format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
        if upper { t.to_uppercase() } else { t }
    };
    Ok(format!("{}{body}", sign_prefix(spec.flags, f.is_sign_negative() && !f.is_nan())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    #[test]
    fn floats_print_as_python_does() {
        for (f, want) in [(1.0, "1.0"), (1e-5, "1e-05"), (0.0001, "0.0001"), (1e16, "1e+16"), (1e15, "1000000000000000.0"),
            (0.1 + 0.2, "0.30000000000000004"), (-2.5, "-2.5"), (123456789.125, "123456789.125"), (1.5e-7, "1.5e-07"),
            (-0.0, "-0.0"), (2.0f64.powi(70), "1.1805916207174113e+21"), (f64::INFINITY, "inf"), (f64::NAN, "nan")] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn string_repr_picks_quotes_and_escapes() {
        let r = |s: &str| super::super::value::py_str_repr(s);
        assert_eq!(r("a'b"), "\"a'b\"");
        assert_eq!(r("a'b\""), "'a\\'b\"'");
        assert_eq!(r("tab\t\\ é \u{7f} \u{a0} \u{200b} 👋"), "'tab\\t\\\\ é \\x7f \\xa0 \\u200b 👋'");
    }

    #[test]
    fn percent_formatting() {
        let f = |fmt: &str, args: Value| percent_format(&PStr::markup(fmt), &args).map(|p| p.as_str().to_string());
        assert_eq!(f("%s-%d-%05.2f|%-4s|%x", Value::tuple(vec![Value::markup_str("a"), Value::int(7), Value::Float(1.23456, Origin::Markup),
            Value::markup_str("b"), Value::int(255)], Origin::Markup)).must(), "a-7-01.23|b   |ff");
        assert_eq!(f("100%%", Value::tuple(vec![], Origin::Markup)).must(), "100%");
        assert_eq!(f("%s %s", Value::int(1)).unwrap_err(), "not enough arguments for format string");
        assert_eq!(f("%s", Value::tuple(vec![Value::int(1), Value::int(2)], Origin::Markup)).unwrap_err(),
            "not all arguments converted during string formatting");
        assert_eq!(f("%.3e", Value::Float(12345.678, Origin::Markup)).must(), "1.235e+04");
    }
}
