//! jinja2 3.1's built-in filters with their stock semantics, plus transformers' `tojson`
//! (`json.dumps` with `ensure_ascii=False`, key order kept, no HTML escaping).
//!
//! Filters that produce a generator in jinja2 (`map`, `select`, `reverse`, ...) produce a list
//! here; `|list` and `|join`, which templates apply to them, give the same result.

use super::ast::BinOp;
use super::call::Params;
use super::eval::{rt, undefined_hint, RResult, RenderError, Renderer};
use super::expr::{undefined_error, Args};
use super::pstr::{map_runs, Origin, PBuilder, PStr};
use super::pyfmt::{self, dumps, to_pstr, JsonOpts};
use super::pystr::{self, char_len, Pad};
use super::value::{number, py_cmp, py_eq, Num, Object, Value};
use std::cmp::Ordering;

/// jinja2 filters this crate does not implement (named in the error, unlike unknown names).
const UNSUPPORTED: &[&str] = &["filesizeformat", "groupby", "pprint", "random", "slice", "striptags", "urlencode", "urlize",
    "wordwrap", "xmlattr"];

/// Every filter name that [`Renderer::apply_filter`] knows (for the `filter` test).
pub const FILTERS: &[&str] = &["abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
    "escape", "first", "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower",
    "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort",
    "string", "sum", "title", "tojson", "trim", "truncate", "unique", "upper", "wordcount"];

/// A jinja2 filter name (implemented here or not).
pub fn is_filter(name: &str) -> bool {
    FILTERS.contains(&name) || UNSUPPORTED.contains(&name)
}

/// `str.lower()` of strings, for the case-insensitive comparisons of `sort`, `unique`, ...
fn ignore_case(v: Value) -> Value {
    match v {
        Value::Str(s) => Value::Str(pystr::lower(&s)),
        v => v,
    }
}

fn as_int(v: &Value, what: &str) -> RResult<i64> {
    match number(v) {
        Some(Num::I(i)) => Ok(i),
        _ => rt(format!("{what}: '{}' object cannot be interpreted as an integer", v.type_name())),
    }
}

impl Renderer<'_> {
    pub fn apply_filter(&mut self, name: &str, v: Value, args: Args) -> RResult<Value> {
        let mut p = Params::new(name, args);
        match name {
            "abs" | "first" | "last" | "length" | "count" | "list" | "string" | "safe" | "items" | "reverse" | "wordcount"
            | "upper" | "lower" | "title" | "capitalize" | "e" | "escape" | "forceescape" => {
                p.done(0)?;
                self.simple_filter(name, v)
            }
            "default" | "d" => {
                let default = p.get(0, "default_value")?.unwrap_or_else(|| Value::markup_str(""));
                let boolean = p.get(1, "boolean")?.is_some_and(|b| b.truthy());
                p.done(2)?;
                Ok(if v.is_undefined() || (boolean && !v.truthy()) { default } else { v })
            }
            "trim" => {
                let chars = p.get(0, "chars")?;
                p.done(1)?;
                let chars = match &chars {
                    None | Some(Value::None(_)) => None,
                    Some(c) => Some(to_pstr(c)),
                };
                Ok(Value::Str(pystr::strip(&to_pstr(&v), chars.as_ref().map(PStr::as_str), true, true)))
            }
            "replace" => {
                let (old, new) = (p.get(0, "old")?, p.get(1, "new")?);
                let count = p.get(2, "count")?;
                p.done(3)?;
                let (Some(old), Some(new)) = (old, new) else { return rt("replace() needs old and new") };
                let count = match count {
                    None | Some(Value::None(_)) => -1,
                    Some(c) => as_int(&c, "replace")?,
                };
                let (s, old, new) = (to_pstr(&v), to_pstr(&old), to_pstr(&new));
                let hits = if old.is_empty() { char_len(s.as_str()) + 1 } else { s.as_str().matches(old.as_str()).count() };
                self.charge_size(s.len().saturating_add(hits.saturating_mul(new.len())))?;
                Ok(Value::Str(pystr::replace(&s, old.as_str(), &new, count)))
            }
            "join" => self.join_filter(v, p),
            "tojson" => tojson(v, p),
            "int" | "float" => number_filter(name, v, p),
            "round" => round_filter(v, p),
            "indent" => self.indent_filter(v, p),
            "center" => {
                let width = p.get(0, "width")?.map_or(Ok(80), |w| as_int(&w, "center"))?;
                p.done(1)?;
                self.charge_size(width.max(0) as usize)?;
                Ok(Value::Str(pystr::pad(&to_pstr(&v), width.max(0) as usize, ' ', Pad::Center)))
            }
            "truncate" => truncate(v, p),
            "format" => {
                let (pos, kw) = (p.rest(0), p.take_kwargs());
                if !pos.is_empty() && !kw.is_empty() {
                    return rt("can't handle positional and keyword arguments at the same time");
                }
                let args = if kw.is_empty() { Value::tuple(pos, Origin::Markup) } else {
                    super::eval::dict_of(kw.into_iter().map(|(k, x)| (Value::markup_str(&k), x)), Origin::Markup)
                };
                pyfmt::percent_format(&to_pstr(&v), &args).map(Value::Str).map_err(RenderError::runtime)
            }
            "attr" => {
                let n = p.get(0, "name")?.map(|n| to_pstr(&n)).unwrap_or_else(PStr::empty);
                p.done(1)?;
                self.attr_filter(&v, n.as_str())
            }
            "batch" => self.batch(v, p),
            "map" => self.map_filter(v, p),
            "select" | "reject" | "selectattr" | "rejectattr" => self.select_filter(name, v, p),
            "sort" | "dictsort" | "unique" | "min" | "max" | "sum" => self.ordering_filter(name, v, p),
            n if UNSUPPORTED.contains(&n) => rt(format!("the '{n}' filter is not supported")),
            n => rt(format!("No filter named '{n}'.")),
        }
    }

    /// Filters of one value and no arguments.
    fn simple_filter(&mut self, name: &str, v: Value) -> RResult<Value> {
        let o = v.origin();
        Ok(match name {
            "abs" => match (number(&v), &v) {
                (Some(Num::I(i)), _) => Value::Int(i.checked_abs().ok_or_else(|| RenderError::runtime("integer overflow"))?, o),
                (Some(Num::F(f)), _) => Value::Float(f.abs(), o),
                _ => return rt(format!("bad operand type for abs(): '{}'", v.type_name())),
            },
            "first" | "last" => {
                if let (Value::Undefined(_), "last") = (&v, name) {
                    return rt("'Undefined' object is not reversible");
                }
                let items = self.iterate(&v)?;
                let item = if name == "first" { items.first() } else { items.last() };
                match item {
                    Some(x) => x.clone(),
                    None => undefined_hint(format!("No {name} item, sequence was empty.")),
                }
            }
            "length" | "count" => Value::Int(length(&v)? as i64, o),
            "list" => Value::list(self.iterate(&v)?, o),
            "string" | "safe" => Value::Str(to_pstr(&v)),
            "items" => match &v {
                Value::Undefined(_) => Value::list(Vec::new(), Origin::Markup),
                Value::Dict(d) => Value::list(d.entries().iter().map(|(k, x)| Value::tuple(vec![k.clone(), x.clone()], d.origin)).collect(), d.origin),
                _ => return rt("Can only get item pairs from a mapping."),
            },
            "reverse" => match &v {
                Value::Str(s) => {
                    let t = s.as_str();
                    let mut out = PBuilder::new();
                    for (i, c) in t.char_indices().rev() {
                        out.push_slice(s, i, i + c.len_utf8());
                    }
                    Value::Str(out.finish())
                }
                Value::Undefined(_) => return rt("argument must be iterable"),
                _ => {
                    let mut items = self.iterate(&v)?;
                    items.reverse();
                    Value::list(items, o)
                }
            },
            "wordcount" => {
                let s = to_pstr(&v);
                let words = s.as_str().split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).count();
                Value::Int(words as i64, o)
            }
            "upper" => Value::Str(pystr::upper(&to_pstr(&v))),
            "lower" => Value::Str(pystr::lower(&to_pstr(&v))),
            "capitalize" => Value::Str(pystr::capitalize(&to_pstr(&v))),
            "title" => Value::Str(jinja_title(&to_pstr(&v))),
            _ => Value::Str(html_escape(&to_pstr(&v))),
        })
    }

    fn join_filter(&mut self, v: Value, mut p: Params) -> RResult<Value> {
        let sep = p.get(0, "d")?.map(|d| to_pstr(&d)).unwrap_or_else(PStr::empty);
        let attr = p.get(1, "attribute")?;
        p.done(2)?;
        let mut items = self.iterate(&v)?;
        if let Some(a) = attr.filter(|a| !a.is_none()) {
            items = items.iter().map(|x| self.attr_path(x, &a, None)).collect::<RResult<_>>()?;
        }
        let mut out = PBuilder::new();
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_pstr(&sep);
            }
            pyfmt::write_str(item, &mut out);
            self.charge_size(out.len())?;
        }
        Ok(Value::Str(out.finish()))
    }

    fn indent_filter(&mut self, v: Value, mut p: Params) -> RResult<Value> {
        let width = p.get(0, "width")?;
        let first = p.get(1, "first")?.is_some_and(|b| b.truthy());
        let blank = p.get(2, "blank")?.is_some_and(|b| b.truthy());
        p.done(3)?;
        let indent = match width {
            None => PStr::markup("    "),
            Some(Value::Str(s)) => s,
            Some(w) => PStr::markup(&" ".repeat(as_int(&w, "indent")?.clamp(0, 1 << 16) as usize)),
        };
        let mut text = PBuilder::new();
        text.push_pstr(&to_pstr(&v));
        text.push("\n", Origin::Markup);
        let lines = pystr::splitlines(&text.finish(), false);
        self.charge_size(lines.len().saturating_mul(indent.len()))?;
        let mut out = PBuilder::new();
        if first {
            out.push_pstr(&indent);
        }
        for (i, line) in lines.iter().enumerate() {
            if i > 0 {
                out.push("\n", Origin::Markup);
                if blank || !line.is_empty() {
                    out.push_pstr(&indent);
                }
            }
            out.push_pstr(line);
        }
        Ok(Value::Str(out.finish()))
    }

    /// The `attr` filter: the attribute only, never the item.
    fn attr_filter(&self, v: &Value, name: &str) -> RResult<Value> {
        if let Value::Undefined(u) = v {
            return Err(undefined_error(u));
        }
        match v {
            Value::Dict(_) | Value::Str(_) | Value::List(_) | Value::Namespace(_) | Value::Object(_) => {
                let got = self.getattr(v, name)?;
                let is_item = matches!(v, Value::Dict(d) if d.get_str(name).is_some()) && !matches!(got, Value::Object(_));
                Ok(if is_item { Value::undefined(super::value::UndefWhy::Attr { owner: v.owner_name(), name: name.into() }) } else { got })
            }
            _ => Ok(Value::undefined(super::value::UndefWhy::Attr { owner: v.owner_name(), name: name.into() })),
        }
    }

    /// jinja2's `make_attrgetter`: `a.b.0` looked up item-first, one part at a time; an
    /// undefined result becomes `default` when one is given.
    pub fn attr_path(&self, v: &Value, attr: &Value, default: Option<&Value>) -> RResult<Value> {
        let parts: Vec<Value> = match attr {
            Value::Str(s) => s.as_str().split('.').map(|part| match part.parse::<i64>() {
                Ok(i) if part.bytes().all(|b| b.is_ascii_digit()) => Value::int(i),
                _ => Value::markup_str(part),
            }).collect(),
            other => vec![other.clone()],
        };
        let mut cur = v.clone();
        for part in &parts {
            cur = self.getitem(&cur, part)?;
        }
        Ok(match (default, &cur) {
            (Some(d), Value::Undefined(_)) => d.clone(),
            _ => cur,
        })
    }

    fn batch(&mut self, v: Value, mut p: Params) -> RResult<Value> {
        let n = p.get(0, "linecount")?.map_or(Ok(1), |x| as_int(&x, "batch"))?;
        let fill = p.get(1, "fill_with")?.filter(|f| !f.is_none());
        p.done(2)?;
        if n <= 0 {
            return rt("batch size must be positive");
        }
        let items = self.iterate(&v)?;
        if fill.is_some() {
            self.charge_size(items.len().saturating_add(n as usize))?;
        }
        let mut out = Vec::new();
        for chunk in items.chunks(n as usize) {
            let mut row = chunk.to_vec();
            if let Some(f) = &fill {
                row.resize(n as usize, f.clone());
            }
            out.push(Value::list(row, v.origin()));
        }
        Ok(Value::list(out, v.origin()))
    }

    fn map_filter(&mut self, v: Value, p: Params) -> RResult<Value> {
        let items = self.iterate(&v)?;
        let (pos, mut kw) = (p.rest(0), p.take_kwargs());
        let mut out = Vec::with_capacity(items.len());
        if pos.is_empty() && kw.iter().any(|(k, _)| k == "attribute") {
            let take = |kw: &mut Vec<(String, Value)>, k: &str| kw.iter().position(|(n, _)| n == k).map(|i| kw.remove(i).1);
            let attr = take(&mut kw, "attribute").unwrap_or_else(Value::none);
            let default = take(&mut kw, "default");
            if let Some((k, _)) = kw.first() {
                return rt(format!("Unexpected keyword argument '{k}'"));
            }
            for item in &items {
                out.push(self.attr_path(item, &attr, default.as_ref())?);
            }
        } else {
            let Some((name, rest)) = pos.split_first() else { return rt("map requires a filter argument") };
            let name = to_pstr(name);
            for item in items {
                self.charge(1)?;
                let args = Args { pos: rest.to_vec(), kw: kw.clone() };
                out.push(self.apply_filter(name.as_str(), item, args)?);
            }
        }
        Ok(Value::list(out, v.origin()))
    }

    fn select_filter(&mut self, name: &str, v: Value, p: Params) -> RResult<Value> {
        let by_attr = name.ends_with("attr");
        let keep_if = name.starts_with("select");
        let (mut pos, kw) = (p.rest(0), p.take_kwargs());
        let attr = if by_attr {
            if pos.is_empty() {
                return rt("Missing parameter for attribute name");
            }
            Some(pos.remove(0))
        } else {
            None
        };
        let test = if pos.is_empty() { None } else { Some(to_pstr(&pos.remove(0))) };
        let items = self.iterate(&v)?;
        let mut out = Vec::new();
        for item in items {
            self.charge(1)?;
            let probe = match &attr {
                Some(a) => self.attr_path(&item, a, None)?,
                None => item.clone(),
            };
            let pass = match &test {
                Some(t) => self.apply_test(t.as_str(), &probe, Args { pos: pos.clone(), kw: kw.clone() })?,
                None => probe.truthy(),
            };
            if pass == keep_if {
                out.push(item);
            }
        }
        Ok(Value::list(out, v.origin()))
    }

    /// `sort`, `dictsort`, `unique`, `min`, `max` and `sum`.
    fn ordering_filter(&mut self, name: &str, v: Value, mut p: Params) -> RResult<Value> {
        if name == "sum" {
            let attr = p.get(0, "attribute")?.filter(|a| !a.is_none());
            let mut acc = p.get(1, "start")?.unwrap_or_else(|| Value::int(0));
            p.done(2)?;
            for item in self.iterate(&v)? {
                let x = match &attr {
                    Some(a) => self.attr_path(&item, a, None)?,
                    None => item,
                };
                acc = self.binary(BinOp::Add, acc, x)?;
            }
            return Ok(acc);
        }
        let (reverse, case_sensitive, attr, by) = match name {
            "sort" => (p.get(0, "reverse")?, p.get(1, "case_sensitive")?, p.get(2, "attribute")?, None),
            "dictsort" => (p.get(2, "reverse")?, p.get(0, "case_sensitive")?, None, p.get(1, "by")?),
            _ => (None, p.get(0, "case_sensitive")?, p.get(1, "attribute")?, None),
        };
        p.done(3)?;
        let (reverse, fold) = (reverse.is_some_and(|r| r.truthy()), !case_sensitive.is_some_and(|c| c.truthy()));
        let attr = attr.filter(|a| !a.is_none());
        let items = if name == "dictsort" {
            let Value::Dict(d) = &v else { return rt(format!("'{}' object has no attribute 'items'", v.type_name())) };
            d.entries().iter().map(|(k, x)| Value::tuple(vec![k.clone(), x.clone()], d.origin)).collect()
        } else {
            self.iterate(&v)?
        };
        let mut keyed = Vec::with_capacity(items.len());
        for item in items {
            let key = self.sort_key(name, &item, attr.as_ref(), by.as_ref())?;
            keyed.push((if fold { ignore_case(key) } else { key }, item));
        }
        match name {
            "unique" => {
                let mut seen: Vec<Value> = Vec::new();
                let mut out = Vec::new();
                for (k, item) in keyed {
                    self.charge(seen.len() as u64 / 16 + 1)?;
                    if !seen.iter().any(|s| py_eq(s, &k)) {
                        seen.push(k);
                        out.push(item);
                    }
                }
                Ok(Value::list(out, v.origin()))
            }
            "min" | "max" => {
                let mut best: Option<(Value, Value)> = None;
                for (k, item) in keyed {
                    let better = match &best {
                        None => true,
                        Some((bk, _)) => py_cmp(&k, bk, if name == "min" { "<" } else { ">" }).map_err(RenderError::runtime)?
                            == Some(if name == "min" { Ordering::Less } else { Ordering::Greater }),
                    };
                    if better {
                        best = Some((k, item));
                    }
                }
                Ok(best.map_or_else(|| undefined_hint("No aggregated item, sequence was empty."), |(_, item)| item))
            }
            _ => {
                let mut err = None;
                keyed.sort_by(|a, b| {
                    let o = match py_cmp(&a.0, &b.0, "<") {
                        Ok(o) => o.unwrap_or(Ordering::Equal),
                        Err(e) => {
                            err.get_or_insert(e);
                            Ordering::Equal
                        }
                    };
                    if reverse { o.reverse() } else { o }
                });
                if let Some(e) = err {
                    return rt(e);
                }
                Ok(Value::list(keyed.into_iter().map(|(_, item)| item).collect(), v.origin()))
            }
        }
    }

    fn sort_key(&self, name: &str, item: &Value, attr: Option<&Value>, by: Option<&Value>) -> RResult<Value> {
        if name == "dictsort" {
            let pos = match by.map(to_pstr) {
                None => 0,
                Some(b) if b.as_str() == "key" => 0,
                Some(b) if b.as_str() == "value" => 1,
                Some(_) => return rt("You can only sort by either \"key\" or \"value\""),
            };
            return self.getitem(item, &Value::int(pos));
        }
        match attr {
            None => Ok(item.clone()),
            // `sort` takes several attributes separated by commas.
            Some(Value::Str(s)) if name == "sort" && s.as_str().contains(',') => {
                let keys = s.as_str().split(',').map(|a| self.attr_path(item, &Value::markup_str(a.trim()), None)).collect::<RResult<_>>()?;
                Ok(Value::list(keys, Origin::Markup))
            }
            Some(a) => self.attr_path(item, a, None),
        }
    }
}

/// Python `len(v)`.
fn length(v: &Value) -> RResult<usize> {
    Ok(match v {
        Value::Str(s) => char_len(s.as_str()),
        Value::List(l) => l.items.len(),
        Value::Dict(d) => d.len(),
        Value::Undefined(_) => 0,
        Value::Object(o) if matches!(**o, Object::Loop(_)) => match &**o {
            Object::Loop(l) => l.items.len(),
            _ => 0,
        },
        v => return rt(format!("object of type '{}' has no len()", v.type_name())),
    })
}

/// jinja2's `title`: each word's first character upper-cased, the rest lowered, where words
/// start after `-`, whitespace, `(`, `{`, `[` or `<`.
fn jinja_title(s: &PStr) -> PStr {
    let mut at_start = true;
    map_runs(s, |t| {
        let mut out = String::with_capacity(t.len());
        for c in t.chars() {
            let boundary = c == '-' || pystr::py_space(c) || "({[<".contains(c);
            if boundary {
                out.push(c);
                at_start = true;
            } else if at_start {
                out.extend(c.to_uppercase());
                at_start = false;
            } else {
                out.extend(c.to_lowercase());
            }
        }
        out
    })
}

/// markupsafe's `escape`.
fn html_escape(s: &PStr) -> PStr {
    map_runs(s, |t| {
        let mut out = String::with_capacity(t.len());
        for c in t.chars() {
            match c {
                '&' => out.push_str("&amp;"),
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                '"' => out.push_str("&#34;"),
                '\'' => out.push_str("&#39;"),
                c => out.push(c),
            }
        }
        out
    })
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(v: Value, mut p: Params) -> RResult<Value> {
    let mut opts = JsonOpts { ensure_ascii: p.get(0, "ensure_ascii")?.is_some_and(|x| x.truthy()), ..JsonOpts::default() };
    opts.indent = match p.get(1, "indent")? {
        None | Some(Value::None(_)) => None,
        Some(Value::Str(s)) => Some(s.as_str().to_string()),
        Some(n) => Some(" ".repeat(as_int(&n, "indent")?.clamp(0, 1 << 10) as usize)),
    };
    if opts.indent.is_some() {
        opts.item_sep = ",".into();
    }
    match p.get(2, "separators")? {
        None | Some(Value::None(_)) => {}
        Some(Value::List(l)) if l.items.len() == 2 => {
            opts.item_sep = to_pstr(&l.items[0]).as_str().to_string();
            opts.key_sep = to_pstr(&l.items[1]).as_str().to_string();
        }
        Some(_) => return rt("separators must be a pair of strings"),
    }
    opts.sort_keys = p.get(3, "sort_keys")?.is_some_and(|x| x.truthy());
    p.done(4)?;
    let mut out = PBuilder::new();
    dumps(&v, &opts, &mut out).map_err(RenderError::runtime)?;
    Ok(Value::Str(out.finish()))
}

/// The `int` and `float` filters: the conversion, else the default.
fn number_filter(name: &str, v: Value, mut p: Params) -> RResult<Value> {
    let o = v.origin();
    if name == "float" {
        let default = p.get(0, "default")?.unwrap_or(Value::Float(0.0, Origin::Markup));
        p.done(1)?;
        return Ok(match (&v, number(&v)) {
            (_, Some(Num::I(i))) => Value::Float(i as f64, o),
            (_, Some(Num::F(f))) => Value::Float(f, o),
            (Value::Str(s), _) => parse_py_float(s.as_str()).map_or(default, |f| Value::Float(f, o)),
            _ => default,
        });
    }
    let default = p.get(0, "default")?.unwrap_or_else(|| Value::int(0));
    let base = p.get(1, "base")?.map_or(Ok(10), |b| as_int(&b, "int"))?;
    p.done(2)?;
    Ok(match (&v, number(&v)) {
        (_, Some(Num::I(i))) => Value::Int(i, o),
        (_, Some(Num::F(f))) if f.is_finite() && f.abs() < 9.2e18 => Value::Int(f.trunc() as i64, o),
        (_, Some(Num::F(_))) => return rt("cannot convert float infinity or NaN to integer"),
        (Value::Str(s), _) => match parse_py_int(s.as_str(), base) {
            Some(i) => Value::Int(i, o),
            // jinja2's quirk: "42.23"|int is 42, through float().
            None => match parse_py_float(s.as_str()) {
                Some(f) if f.is_finite() && f.abs() < 9.2e18 => Value::Int(f.trunc() as i64, o),
                Some(f) if !f.is_nan() => return rt("cannot convert float infinity to integer"),
                _ => default,
            },
        },
        _ => default,
    })
}

/// Python `int(s, base)`: optional sign and surrounding whitespace, underscores between digits,
/// a `0x`/`0o`/`0b` prefix where the base allows it (base 0 infers it).
fn parse_py_int(s: &str, base: i64) -> Option<i64> {
    let t = s.trim_matches(pystr::py_space);
    let (neg, t) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let lower = t.to_ascii_lowercase();
    let (base, digits) = match (base, lower.get(..2)) {
        (0 | 16, Some("0x")) => (16, &t[2..]),
        (0 | 8, Some("0o")) => (8, &t[2..]),
        (0 | 2, Some("0b")) => (2, &t[2..]),
        (0, _) => (10, t),
        (b, _) if (2..=36).contains(&b) => (b as u32, t),
        _ => return None,
    };
    if digits.is_empty() || digits.starts_with('_') || digits.ends_with('_') || digits.contains("__") {
        return None;
    }
    let clean: String = digits.chars().filter(|&c| c != '_').collect();
    let v = i64::from_str_radix(&clean, base).ok()?;
    Some(if neg { -v } else { v })
}

/// Python `float(s)`: decimal or exponent forms, `inf`/`nan` words, surrounding whitespace.
fn parse_py_float(s: &str) -> Option<f64> {
    let t = s.trim_matches(pystr::py_space);
    let body = t.trim_start_matches(['+', '-']);
    let word = body.to_ascii_lowercase();
    if matches!(word.as_str(), "inf" | "infinity" | "nan") {
        let f = if word == "nan" { f64::NAN } else { f64::INFINITY };
        return Some(if t.starts_with('-') { -f } else { f });
    }
    if t.contains("__") || t.starts_with('_') || t.ends_with('_') || t.len() - body.len() > 1 {
        return None;
    }
    let clean: String = t.chars().filter(|&c| c != '_').collect();
    if !clean.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) {
        return None;
    }
    clean.parse().ok()
}

/// `round(value, precision=0, method='common')`.
fn round_filter(v: Value, mut p: Params) -> RResult<Value> {
    let precision = p.get(0, "precision")?.map_or(Ok(0), |x| as_int(&x, "round"))?;
    let method = p.get(1, "method")?.map(|m| to_pstr(&m).as_str().to_string()).unwrap_or_else(|| "common".into());
    p.done(2)?;
    let o = v.origin();
    let x = match number(&v) {
        Some(n) => n,
        None => return rt(format!("type {} doesn't define __round__ method", v.type_name())),
    };
    let scale = 10f64.powi(precision.clamp(-308, 308) as i32);
    match (method.as_str(), x) {
        ("common", Num::I(i)) if precision >= 0 => Ok(Value::Int(i, o)),
        ("common", Num::I(i)) => Ok(Value::Int(round_int(i, -precision), o)),
        ("common", Num::F(f)) => {
            if !f.is_finite() {
                return Ok(Value::Float(f, o));
            }
            let r = if precision >= 0 {
                let digits = precision.min(340) as usize;
                format!("{f:.digits$}").parse().unwrap_or(f)
            } else {
                let factor = 10f64.powi((-precision).min(308) as i32);
                (f / factor).round_ties_even() * factor
            };
            Ok(Value::Float(r, o))
        }
        ("ceil" | "floor", n) => {
            let f = match n {
                Num::I(i) => i as f64,
                Num::F(f) => f,
            };
            let r = if method == "ceil" { (f * scale).ceil() } else { (f * scale).floor() };
            Ok(Value::Float(r / scale, o))
        }
        _ => rt("method must be common, ceil or floor"),
    }
}

/// Python's `round(i, -digits)` of an integer: to a multiple of 10^digits, ties to even.
fn round_int(i: i64, digits: i64) -> i64 {
    let Some(f) = u32::try_from(digits).ok().and_then(|d| 10i64.checked_pow(d)) else { return 0 };
    let (q, r) = (i.div_euclid(f), i.rem_euclid(f));
    let up = 2 * (r as i128) > f as i128 || (2 * (r as i128) == f as i128 && q % 2 != 0);
    (q + up as i64).saturating_mul(f)
}

/// `truncate(length=255, killwords=False, end='...', leeway=5)`.
fn truncate(v: Value, mut p: Params) -> RResult<Value> {
    let length = p.get(0, "length")?.map_or(Ok(255), |x| as_int(&x, "truncate"))?;
    let killwords = p.get(1, "killwords")?.is_some_and(|x| x.truthy());
    let end = p.get(2, "end")?.map(|e| to_pstr(&e)).unwrap_or_else(|| PStr::markup("..."));
    let leeway = p.get(3, "leeway")?.map_or(Ok(5), |x| as_int(&x, "truncate"))?;
    p.done(4)?;
    let s = to_pstr(&v);
    let end_len = char_len(end.as_str()) as i64;
    if length < end_len {
        return rt(format!("expected length >= {end_len}, got {length}"));
    }
    if leeway < 0 {
        return rt(format!("expected leeway >= 0, got {leeway}"));
    }
    if (char_len(s.as_str()) as i64) <= length + leeway {
        return Ok(Value::Str(s));
    }
    let cut = pystr::byte_at(s.as_str(), (length - end_len) as usize);
    let mut head = s.slice(0, cut);
    if !killwords {
        if let Some(sp) = head.as_str().rfind(' ') {
            head = head.slice(0, sp);
        }
    }
    let mut out = PBuilder::new();
    out.push_pstr(&head);
    out.push_pstr(&end);
    Ok(Value::Str(out.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_number_parsing() {
        assert_eq!(parse_py_int(" 42 ", 10), Some(42));
        assert_eq!(parse_py_int("-1_000", 10), Some(-1000));
        assert_eq!(parse_py_int("0x1f", 16), Some(31));
        assert_eq!(parse_py_int("0x1f", 0), Some(31));
        assert_eq!(parse_py_int("42.5", 10), None);
        assert_eq!(parse_py_int("1__0", 10), None);
        assert_eq!(parse_py_float("1e3"), Some(1000.0));
        assert_eq!(parse_py_float(" -2.5 "), Some(-2.5));
        assert!(parse_py_float("abc").is_none());
        assert!(parse_py_float("-inf").is_some_and(|f| f == f64::NEG_INFINITY));
    }
}
