//! Python methods on values, as templates call them: `str.split`, `strip`, `startswith`,
//! `replace`, `format`, ...; `dict.get`, `items`, `keys`, `values`; `list.index`, `count`; and
//! the methods of `loop` and `cycler`. Results keep the provenance of the characters they are
//! made of.

use super::call::{call_cycler_method, call_loop_method, Params};
use super::eval::{dict_of, rt, RResult, Renderer};
use super::expr::Args;
use super::pstr::{Origin, PBuilder, PStr};
use super::pystr::{self, char_at, char_len, Pad};
use super::pyfmt::to_pstr;
use super::value::{number, py_eq, Num, Object, Value};

/// An optional string argument (`None` and absent are the same).
fn opt_str(v: Option<Value>, what: &str) -> RResult<Option<PStr>> {
    match v {
        None | Some(Value::None(_)) => Ok(None),
        Some(Value::Str(s)) => Ok(Some(s)),
        Some(v) => rt(format!("{what} arg must be None or str, not {}", v.type_name())),
    }
}

fn req_str(v: Option<Value>, what: &str) -> RResult<PStr> {
    match v {
        Some(Value::Str(s)) => Ok(s),
        Some(v) => rt(format!("{what}: must be str, not {}", v.type_name())),
        None => rt(format!("{what}: missing a required argument")),
    }
}

fn opt_int(v: Option<Value>, default: i64, what: &str) -> RResult<i64> {
    match v.as_ref().and_then(number) {
        None if v.is_none() => Ok(default),
        Some(Num::I(i)) => Ok(i),
        _ => rt(format!("{what}: an integer is required")),
    }
}

fn str_list(items: Vec<PStr>, origin: Origin) -> Value {
    Value::list(items.into_iter().map(Value::Str).collect(), origin)
}

impl Renderer<'_> {
    pub fn call_method(&mut self, recv: &Value, name: &str, args: Args) -> RResult<Value> {
        match recv {
            Value::Str(s) => self.str_method(s, name, args),
            Value::Dict(_) => dict_method(recv, name, args),
            Value::List(l) => {
                let mut p = Params::new(format!("list.{name}"), args);
                match name {
                    "count" => {
                        let x = p.get(0, "value")?.unwrap_or_else(Value::none);
                        p.done(1)?;
                        Ok(Value::int(l.items.iter().filter(|i| py_eq(i, &x)).count() as i64))
                    }
                    "index" => {
                        let x = p.get(0, "value")?.unwrap_or_else(Value::none);
                        p.done(1)?;
                        match l.items.iter().position(|i| py_eq(i, &x)) {
                            Some(i) => Ok(Value::int(i as i64)),
                            None => rt(format!("{} is not in list", to_pstr(&x).as_str())),
                        }
                    }
                    "copy" => Ok(Value::list(l.items.clone(), l.origin)),
                    _ => rt(format!("list.{name}() is not supported")),
                }
            }
            Value::Object(o) => match &**o {
                Object::Loop(l) => call_loop_method(l, name, args),
                Object::Cycler { items, pos } => call_cycler_method(items, pos, name),
                _ => rt(format!("'{}' object has no method '{name}'", recv.type_name())),
            },
            _ => rt(format!("'{}' object has no method '{name}'", recv.type_name())),
        }
    }

    fn str_method(&mut self, s: &PStr, name: &str, args: Args) -> RResult<Value> {
        let t = s.as_str();
        let o = s.origin();
        let mut p = Params::new(format!("str.{name}"), args);
        let v = match name {
            "split" | "rsplit" => {
                let sep = opt_str(p.get(0, "sep")?, "sep")?;
                let max = opt_int(p.get(1, "maxsplit")?, -1, "maxsplit")?;
                p.done(2)?;
                if sep.as_ref().is_some_and(PStr::is_empty) {
                    return rt("empty separator");
                }
                let sep = sep.as_ref().map(PStr::as_str);
                self.charge_size(t.len())?;
                let parts = if name == "split" { pystr::split(s, sep, max) } else { pystr::rsplit(s, sep, max) };
                str_list(parts, o)
            }
            "splitlines" => {
                let keep = p.get(0, "keepends")?.is_some_and(|v| v.truthy());
                p.done(1)?;
                str_list(pystr::splitlines(s, keep), o)
            }
            "strip" | "lstrip" | "rstrip" => {
                let chars = opt_str(p.get(0, "chars")?, name)?;
                p.done(1)?;
                let chars = chars.as_ref().map(PStr::as_str);
                Value::Str(pystr::strip(s, chars, name != "rstrip", name != "lstrip"))
            }
            "startswith" | "endswith" => {
                let x = p.get(0, "prefix")?.unwrap_or_else(Value::none);
                let start = opt_int(p.get(1, "start")?, 0, name)?;
                let end = opt_int(p.get(2, "end")?, i64::MAX, name)?;
                p.done(3)?;
                let n = char_len(t) as i64;
                let clamp = |i: i64| (if i < 0 { (i + n).max(0) } else { i.min(n) }) as usize;
                let (a, b) = (pystr::byte_at(t, clamp(start)), pystr::byte_at(t, clamp(end)));
                let part = if a <= b { &t[a..b] } else { "" };
                let test = |x: &str| if name == "startswith" { part.starts_with(x) } else { part.ends_with(x) };
                let hit = match &x {
                    Value::Str(x) => test(x.as_str()) && a <= b,
                    Value::List(l) if l.tuple => l.items.iter().any(|i| i.as_str().is_some_and(test)) && a <= b,
                    v => return rt(format!("{name} first arg must be str or a tuple of str, not {}", v.type_name())),
                };
                Value::bool(hit)
            }
            "replace" => {
                let old = req_str(p.get(0, "old")?, "replace")?;
                let new = req_str(p.get(1, "new")?, "replace")?;
                let count = opt_int(p.get(2, "count")?, -1, "replace")?;
                p.done(3)?;
                let hits = if old.is_empty() { char_len(t) + 1 } else { t.matches(old.as_str()).count() };
                let hits = if count < 0 { hits } else { hits.min(count as usize) };
                self.charge_size(t.len().saturating_add(hits.saturating_mul(new.len())))?;
                Value::Str(pystr::replace(s, old.as_str(), &new, count))
            }
            "upper" | "lower" | "title" | "capitalize" | "casefold" | "swapcase" => {
                p.done(0)?;
                Value::Str(match name {
                    "upper" => pystr::upper(s),
                    "title" => pystr::title(s),
                    "capitalize" => pystr::capitalize(s),
                    "swapcase" => super::pstr::map_runs(s, |x| x.chars().flat_map(|c| -> Vec<char> {
                        if c.is_uppercase() { c.to_lowercase().collect() } else { c.to_uppercase().collect() }
                    }).collect()),
                    _ => pystr::lower(s),
                })
            }
            "find" | "rfind" | "index" | "rindex" | "count" => {
                let sub = req_str(p.get(0, "sub")?, name)?;
                p.done(1)?;
                let sub = sub.as_str();
                if name == "count" {
                    let n = if sub.is_empty() { char_len(t) + 1 } else { t.matches(sub).count() };
                    return Ok(Value::Int(n as i64, o));
                }
                let at = if name.starts_with('r') { t.rfind(sub) } else { t.find(sub) };
                match at {
                    Some(b) => Value::Int(char_at(t, b) as i64, o),
                    None if name.ends_with("find") => Value::Int(-1, o),
                    None => return rt("substring not found"),
                }
            }
            "join" => {
                let items = p.get(0, "iterable")?.unwrap_or_else(Value::none);
                p.done(1)?;
                let items = self.iterate(&items)?;
                let mut out = PBuilder::new();
                for (i, item) in items.iter().enumerate() {
                    let Value::Str(x) = item else {
                        return rt(format!("sequence item {i}: expected str instance, {} found", item.type_name()));
                    };
                    if i > 0 {
                        out.push_pstr(s);
                    }
                    out.push_pstr(x);
                    self.charge_size(out.len())?;
                }
                Value::Str(out.finish())
            }
            "isdigit" | "isdecimal" | "isnumeric" | "isalpha" | "isalnum" | "isspace" | "islower" | "isupper" | "isascii" => {
                p.done(0)?;
                Value::bool(str_predicate(t, name))
            }
            "zfill" | "center" | "ljust" | "rjust" | "partition" | "rpartition" | "removeprefix" | "removesuffix" => {
                return self.str_reshape(s, name, p);
            }
            "format" => return self.str_format(s, p),
            _ => return rt(format!("str.{name}() is not supported")),
        };
        Ok(v)
    }

    /// `str` methods that pad, cut in three, or drop an affix.
    fn str_reshape(&mut self, s: &PStr, name: &str, mut p: Params) -> RResult<Value> {
        let t = s.as_str();
        let o = s.origin();
        Ok(match name {
            "zfill" | "center" | "ljust" | "rjust" => {
                let width = opt_int(p.get(0, "width")?, 0, name)?.max(0) as usize;
                let fill = opt_str(p.get(1, "fillchar")?, name)?;
                p.done(if name == "zfill" { 1 } else { 2 })?;
                self.charge_size(width)?;
                let fill = match fill {
                    Some(f) if char_len(f.as_str()) == 1 => f.as_str().chars().next().unwrap_or(' '),
                    Some(_) => return rt("The fill character must be exactly one character long"),
                    None => ' ',
                };
                Value::Str(match name {
                    "zfill" => zfill(s, width),
                    "center" => pystr::pad(s, width, fill, Pad::Center),
                    "ljust" => pystr::pad(s, width, fill, Pad::Right),
                    _ => pystr::pad(s, width, fill, Pad::Left),
                })
            }
            "partition" | "rpartition" => {
                let sep = req_str(p.get(0, "sep")?, name)?;
                p.done(1)?;
                if sep.is_empty() {
                    return rt("empty separator");
                }
                let at = if name == "partition" { t.find(sep.as_str()) } else { t.rfind(sep.as_str()) };
                let parts = match at {
                    Some(i) => vec![s.slice(0, i), s.slice(i, i + sep.len()), s.slice(i + sep.len(), t.len())],
                    None if name == "partition" => vec![s.clone(), s.slice(0, 0), s.slice(0, 0)],
                    None => vec![s.slice(0, 0), s.slice(0, 0), s.clone()],
                };
                Value::tuple(parts.into_iter().map(Value::Str).collect(), o)
            }
            "removeprefix" | "removesuffix" => {
                let x = req_str(p.get(0, "affix")?, name)?;
                p.done(1)?;
                let x = x.as_str();
                Value::Str(if name == "removeprefix" && t.starts_with(x) {
                    s.slice(x.len(), t.len())
                } else if name == "removesuffix" && t.ends_with(x) && !x.is_empty() {
                    s.slice(0, t.len() - x.len())
                } else {
                    s.clone()
                })
            }
            _ => return rt(format!("str.{name}() is not supported")),
        })
    }

    /// `str.format` with `{}`, `{0}`, `{name}` fields (no format specs or conversions).
    fn str_format(&mut self, s: &PStr, p: Params) -> RResult<Value> {
        let t = s.as_str();
        let mut p = p;
        let mut out = PBuilder::new();
        let mut auto = 0usize;
        let mut i = 0;
        let mut lit = 0;
        let b = t.as_bytes();
        while i < b.len() {
            match b[i] {
                b'{' if b.get(i + 1) == Some(&b'{') => {
                    out.push_slice(s, lit, i + 1);
                    i += 2;
                    lit = i;
                }
                b'}' if b.get(i + 1) == Some(&b'}') => {
                    out.push_slice(s, lit, i + 1);
                    i += 2;
                    lit = i;
                }
                b'{' => {
                    out.push_slice(s, lit, i);
                    let close = t[i..].find('}').ok_or_else(|| super::eval::RenderError::runtime("Single '{' encountered in format string"))?;
                    let field = &t[i + 1..i + close];
                    if field.contains([':', '!', '.', '[']) {
                        return rt("str.format(): format specs, conversions and field lookups are not supported");
                    }
                    let v = if field.is_empty() {
                        auto += 1;
                        p.get(auto - 1, "\u{0}")?
                    } else if let Ok(k) = field.parse::<usize>() {
                        p.get(k, "\u{0}")?
                    } else {
                        p.get(usize::MAX, field)?
                    };
                    let v = v.ok_or_else(|| super::eval::RenderError::runtime(format!("Replacement index {field} out of range for positional args tuple")))?;
                    out.push_pstr(&to_pstr(&v));
                    i += close + 1;
                    lit = i;
                }
                b'}' => return rt("Single '}' encountered in format string"),
                _ => i += 1,
            }
        }
        out.push_slice(s, lit, t.len());
        Ok(Value::Str(out.finish()))
    }
}

fn dict_method(recv: &Value, name: &str, args: Args) -> RResult<Value> {
    let Value::Dict(d) = recv else { return rt("not a dict") };
    let mut p = Params::new(format!("dict.{name}"), args);
    match name {
        "get" => {
            let key = p.get(0, "key")?.unwrap_or_else(Value::none);
            let default = p.get(1, "default")?.unwrap_or_else(Value::none);
            p.done(2)?;
            if matches!(key, Value::List(ref l) if !l.tuple) || matches!(key, Value::Dict(_)) {
                return rt(format!("unhashable type: '{}'", key.type_name()));
            }
            Ok(d.get(&key).cloned().unwrap_or(default))
        }
        "items" => {
            p.done(0)?;
            let items = d.entries().iter().map(|(k, v)| Value::tuple(vec![k.clone(), v.clone()], d.origin)).collect();
            Ok(Value::list(items, d.origin))
        }
        "keys" | "values" => {
            p.done(0)?;
            let keys = name == "keys";
            Ok(Value::list(d.entries().iter().map(|(k, v)| if keys { k.clone() } else { v.clone() }).collect(), d.origin))
        }
        "copy" => {
            p.done(0)?;
            Ok(dict_of(d.entries().iter().cloned(), d.origin))
        }
        _ => rt(format!("dict.{name}() is not supported")),
    }
}

/// Python's `str.isdigit()` and friends (true only for non-empty strings).
fn str_predicate(t: &str, name: &str) -> bool {
    if name == "isascii" {
        return t.is_ascii();
    }
    if t.is_empty() {
        return false;
    }
    match name {
        "isdigit" | "isdecimal" => t.chars().all(|c| c.is_numeric() && c.to_digit(10).is_some() || ('\u{660}'..='\u{669}').contains(&c)),
        "isnumeric" => t.chars().all(char::is_numeric),
        "isalpha" => t.chars().all(char::is_alphabetic),
        "isalnum" => t.chars().all(char::is_alphanumeric),
        "isspace" => t.chars().all(pystr::py_space),
        "islower" => t.chars().any(char::is_lowercase) && !t.chars().any(|c| c.is_uppercase()),
        _ => t.chars().any(char::is_uppercase) && !t.chars().any(|c| c.is_lowercase()),
    }
}

/// `str.zfill`: zeros after any sign.
fn zfill(s: &PStr, width: usize) -> PStr {
    let t = s.as_str();
    let len = char_len(t);
    if width <= len {
        return s.clone();
    }
    let sign = if t.starts_with(['+', '-']) { 1 } else { 0 };
    let mut out = PBuilder::new();
    out.push_slice(s, 0, sign);
    out.push(&"0".repeat(width - len), s.origin());
    out.push_slice(s, sign, t.len());
    out.finish()
}
