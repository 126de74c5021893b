//! Expressions with Python semantics: names, literals, jinja2's attribute and item lookup
//! (each falling back on the other), slices, arithmetic and comparison operators, `and`/`or`
//! returning an operand, conditional expressions, and the undefined value's rules.

use super::ast::{BinOp, CallArgs, CmpOp, Expr, ExprKind, Literal};
use super::eval::{rt, undefined_hint, RResult, RenderError, Renderer, MAX_VALUE_NESTING};
use super::pstr::{Origin, PBuilder, PStr, MAX_STRING};
use super::pystr::{byte_at, char_len};
use super::pyfmt::{percent_format, to_pstr};
use super::value::{number, py_cmp, py_eq, Builtin, Dict, Num, Object, UndefWhy, Undefined, Value};
use std::rc::Rc;

/// Positional and keyword arguments of a call.
#[derive(Debug, Default)]
pub struct Args {
    pub pos: Vec<Value>,
    pub kw: Vec<(String, Value)>,
}

/// The error an undefined value raises when used.
pub fn undefined_error(u: &Undefined) -> RenderError {
    RenderError::runtime(u.message())
}

/// Methods of Python's `str`, `dict`, `list` and `tuple` by name; `Some(true)` for the ones
/// that mutate (the sandbox refuses those).
fn python_method(v: &Value, name: &str) -> Option<(&'static str, bool)> {
    const STR: &[&str] = &["capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
        "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric",
        "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans", "partition",
        "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split",
        "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill"];
    const DICT: &[&str] = &["copy", "fromkeys", "get", "items", "keys", "values"];
    const DICT_MUT: &[&str] = &["clear", "pop", "popitem", "setdefault", "update"];
    const LIST: &[&str] = &["copy", "count", "index"];
    const LIST_MUT: &[&str] = &["append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"];
    let find = |set: &[&'static str]| set.iter().find(|m| **m == name).copied();
    match v {
        Value::Str(_) => find(STR).map(|m| (m, false)),
        Value::Dict(_) => find(DICT).map(|m| (m, false)).or_else(|| find(DICT_MUT).map(|m| (m, true))),
        Value::List(l) if l.tuple => find(&["count", "index"]).map(|m| (m, false)),
        Value::List(_) => find(LIST).map(|m| (m, false)).or_else(|| find(LIST_MUT).map(|m| (m, true))),
        _ => None,
    }
}

/// The sandbox's answer to a mutating method: an undefined value that raises `SecurityError`.
fn unsafe_attr(obj: &Value, name: &str) -> Value {
    let msg = format!("access to attribute {} of {} object is unsafe.", super::value::py_str_repr(name),
        super::value::py_str_repr(obj.type_name()));
    Value::Undefined(Rc::new(Undefined { why: UndefWhy::Hint(msg) }))
}

fn missing_attr(obj: &Value, name: &str) -> Value {
    Value::undefined(UndefWhy::Attr { owner: obj.owner_name(), name: name.to_string() })
}

fn missing_item(obj: &Value, key: &Value) -> Value {
    match key {
        Value::Str(s) => missing_attr(obj, s.as_str()),
        k => {
            let mut b = PBuilder::new();
            super::pyfmt::write_repr(k, &mut b, 0);
            Value::undefined(UndefWhy::Element { owner: obj.owner_name(), key: b.finish().as_str().to_string() })
        }
    }
}

/// The Python attribute `name` of `obj`, if it has one (methods, namespace and loop attributes).
fn python_attr(obj: &Value, name: &str) -> Option<Value> {
    if let Some((m, mutates)) = python_method(obj, name) {
        return Some(if mutates { unsafe_attr(obj, name) } else { Value::object(Object::Method(obj.clone(), m)) });
    }
    match obj {
        Value::Namespace(ns) => ns.attrs.borrow().iter().find(|(k, _)| &**k == name).map(|(_, v)| v.clone()),
        Value::Object(o) => match &**o {
            Object::Loop(l) => super::call::loop_attr(obj, l, name),
            Object::Cycler { items, pos } => match name {
                "next" | "reset" => Some(Value::object(Object::Method(obj.clone(), if name == "next" { "next" } else { "reset" }))),
                "current" => Some(items.get(pos.get()).cloned().unwrap_or_else(Value::none)),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

impl Renderer<'_> {
    pub fn eval(&mut self, e: &Expr) -> RResult<Value> {
        self.charge(1)?;
        let v = self.eval_kind(e).map_err(|err| err.at(e.pos))?;
        if v.nesting() > MAX_VALUE_NESTING {
            return Err(RenderError::runtime(format!("a value nested more than {MAX_VALUE_NESTING} containers deep")).at(e.pos));
        }
        // Builders stop at MAX_STRING bytes: a string that long may be cut short, so it is an
        // error rather than a value.
        if matches!(&v, Value::Str(s) if s.len() >= MAX_STRING) {
            return Err(RenderError { class: super::eval::ErrorClass::Limit, pos: Some(e.pos as usize),
                msg: format!("a string of {MAX_STRING} bytes or more would be built") });
        }
        Ok(v)
    }

    fn eval_kind(&mut self, e: &Expr) -> RResult<Value> {
        Ok(match &e.kind {
            ExprKind::Lit(l) => match l {
                Literal::None => Value::none(),
                Literal::Bool(b) => Value::bool(*b),
                Literal::Int(i) => Value::int(*i),
                Literal::Float(f) => Value::Float(*f, Origin::Markup),
                Literal::Str(s) => Value::markup_str(s),
            },
            ExprKind::Name(n) => self.lookup(n),
            ExprKind::Tuple(items) => Value::tuple(self.eval_all(items)?, Origin::Markup),
            ExprKind::List(items) => Value::list(self.eval_all(items)?, Origin::Markup),
            ExprKind::Dict(pairs) => {
                let mut d = Dict::new(Origin::Markup);
                for (k, v) in pairs {
                    let key = self.eval(k)?;
                    check_hashable(&key)?;
                    d.insert(key, self.eval(v)?);
                }
                Value::dict(d)
            }
            ExprKind::Attr(obj, name) => {
                let o = self.eval(obj)?;
                self.getattr(&o, name)?
            }
            ExprKind::Item(obj, key) => {
                let o = self.eval(obj)?;
                if let ExprKind::Slice(a, b, c) = &key.kind {
                    let mut part = |x: &Option<Box<Expr>>| x.as_ref().map(|x| self.eval(x)).transpose();
                    let (a, b, c) = (part(a)?, part(b)?, part(c)?);
                    return self.slice(&o, a, b, c);
                }
                let k = self.eval(key)?;
                self.getitem(&o, &k)?
            }
            ExprKind::Slice(..) => return rt("a slice is only allowed inside a subscript"),
            ExprKind::Call(callee, args) => {
                let f = self.eval(callee)?;
                let a = self.eval_args(args)?;
                let v = self.call_value(&f, a)?;
                self.charge_result(&v)?;
                v
            }
            ExprKind::Filter(value, name, args) => {
                let Some(value) = value else { return rt("a filter without a value") };
                let v = self.eval(value)?;
                let a = self.eval_args(args)?;
                let v = self.apply_filter(name, v, a)?;
                self.charge_result(&v)?;
                v
            }
            ExprKind::Test(value, name, args) => {
                let v = self.eval(value)?;
                let a = self.eval_args(args)?;
                Value::bool(self.apply_test(name, &v, a)?)
            }
            ExprKind::Not(x) => Value::bool(!self.eval(x)?.truthy()),
            ExprKind::Neg(x) => negate(self.eval(x)?, true)?,
            ExprKind::Pos(x) => negate(self.eval(x)?, false)?,
            ExprKind::Bin(op, a, b) => {
                let (l, r) = (self.eval(a)?, self.eval(b)?);
                self.binary(*op, l, r)?
            }
            ExprKind::And(a, b) => {
                let l = self.eval(a)?;
                if l.truthy() { self.eval(b)? } else { l }
            }
            ExprKind::Or(a, b) => {
                let l = self.eval(a)?;
                if l.truthy() { l } else { self.eval(b)? }
            }
            ExprKind::Compare(first, ops) => {
                let mut left = self.eval(first)?;
                for (op, e) in ops {
                    let right = self.eval(e)?;
                    if !compare(*op, &left, &right)? {
                        return Ok(Value::bool(false));
                    }
                    left = right;
                }
                Value::bool(true)
            }
            ExprKind::Cond { test, then, otherwise } => {
                if self.eval(test)?.truthy() {
                    self.eval(then)?
                } else if let Some(o) = otherwise {
                    self.eval(o)?
                } else {
                    undefined_hint(format!("the inline if-expression on line {} evaluated to false and no else section was defined.",
                        self.tpl.line_of(e.pos as usize)))
                }
            }
        })
    }

    fn eval_all(&mut self, items: &[Expr]) -> RResult<Vec<Value>> {
        items.iter().map(|x| self.eval(x)).collect()
    }

    /// A name: the scopes, then the render's variables, then the globals.
    pub fn lookup(&self, name: &str) -> Value {
        if let Some(v) = self.scope.lookup(name) {
            return v;
        }
        match Builtin::by_name(name) {
            Some(b) => Value::object(Object::Builtin(b)),
            None => Value::undefined(UndefWhy::Name(name.to_string())),
        }
    }

    pub fn eval_args(&mut self, a: &CallArgs) -> RResult<Args> {
        let mut out = Args { pos: self.eval_all(&a.args)?, kw: Vec::with_capacity(a.kwargs.len()) };
        for (k, e) in &a.kwargs {
            let v = self.eval(e)?;
            out.kw.push((k.to_string(), v));
        }
        if let Some(star) = &a.star {
            let v = self.eval(star)?;
            out.pos.extend(self.iterate(&v)?);
        }
        if let Some(ss) = &a.starstar {
            match self.eval(ss)? {
                Value::Dict(d) => {
                    for (k, v) in d.entries() {
                        let Value::Str(k) = k else { return rt("keywords must be strings") };
                        out.kw.push((k.as_str().to_string(), v.clone()));
                    }
                }
                v => return rt(format!("argument after ** must be a mapping, not {}", v.type_name())),
            }
        }
        Ok(out)
    }

    /// `{% call %}`: the call expression with `caller` added to its keyword arguments.
    pub fn eval_call_with_caller(&mut self, call: &Expr, caller: Value) -> RResult<Value> {
        let ExprKind::Call(callee, args) = &call.kind else { return rt("expected call") };
        let f = self.eval(callee)?;
        let mut a = self.eval_args(args)?;
        a.kw.push(("caller".into(), caller));
        self.call_value(&f, a).map_err(|e| e.at(call.pos))
    }

    /// A filter chain of `{% filter %}` or `{% set x | f %}` applied to `input`.
    pub fn eval_filter_chain(&mut self, e: &Expr, input: Value) -> RResult<Value> {
        let ExprKind::Filter(inner, name, args) = &e.kind else { return self.eval(e) };
        let v = match inner {
            Some(i) => self.eval_filter_chain(i, input)?,
            None => input,
        };
        let a = self.eval_args(args)?;
        self.apply_filter(name, v, a).map_err(|err| err.at(e.pos))
    }

    /// `obj.name`: jinja2's sandboxed `getattr` (the attribute, else the item).
    pub fn getattr(&self, obj: &Value, name: &str) -> RResult<Value> {
        if let Value::Undefined(u) = obj {
            return Err(undefined_error(u));
        }
        if let Some(v) = python_attr(obj, name) {
            return Ok(v);
        }
        Ok(match obj {
            Value::Dict(d) => d.get_str(name).cloned().unwrap_or_else(|| missing_attr(obj, name)),
            _ => missing_attr(obj, name),
        })
    }

    /// `obj[key]`: jinja2's sandboxed `getitem` (the item, else for a string key the attribute).
    pub fn getitem(&self, obj: &Value, key: &Value) -> RResult<Value> {
        if let Value::Undefined(u) = obj {
            return Err(undefined_error(u));
        }
        let found = match (obj, key) {
            (Value::Dict(d), k) => {
                check_hashable(k)?;
                d.get(k).cloned()
            }
            (Value::List(l), k) => index_of(k, l.items.len()).map(|i| l.items[i].clone()),
            (Value::Str(s), k) => {
                let n = char_len(s.as_str());
                index_of(k, n).map(|i| {
                    let a = byte_at(s.as_str(), i);
                    let c = s.as_str()[a..].chars().next().map_or(0, char::len_utf8);
                    Value::Str(s.slice(a, a + c))
                })
            }
            _ => None,
        };
        if let Some(v) = found {
            return Ok(v);
        }
        if let Value::Str(name) = key {
            if let Some(v) = python_attr(obj, name.as_str()) {
                return Ok(v);
            }
        }
        Ok(missing_item(obj, key))
    }

    /// `obj[a:b:c]` on a list, tuple or string, with Python's index rules.
    fn slice(&mut self, obj: &Value, a: Option<Value>, b: Option<Value>, c: Option<Value>) -> RResult<Value> {
        if let Value::Undefined(u) = obj {
            return Err(undefined_error(u));
        }
        let idx = |v: Option<Value>| -> RResult<Option<i64>> {
            match v {
                None | Some(Value::None(_)) => Ok(None),
                Some(Value::Int(i, _)) => Ok(Some(i)),
                Some(Value::Bool(b, _)) => Ok(Some(b as i64)),
                Some(_) => rt("slice indices must be integers or None or have an __index__ method"),
            }
        };
        let (start, stop, step) = (idx(a)?, idx(b)?, idx(c)?.unwrap_or(1));
        if step == 0 {
            return rt("slice step cannot be zero");
        }
        let len = match obj {
            Value::List(l) => l.items.len(),
            Value::Str(s) => char_len(s.as_str()),
            _ => {
                let show = |x: Option<i64>| x.map_or("None".to_string(), |i| i.to_string());
                return Ok(Value::undefined(UndefWhy::Element { owner: obj.owner_name(),
                    key: format!("slice({}, {}, {})", show(start), show(stop), show(Some(step))) }));
            }
        };
        let picks = slice_indices(len, start, stop, step);
        self.charge_size(picks.len())?;
        Ok(match obj {
            Value::List(l) => {
                let items = picks.map(|i| l.items[i].clone()).collect();
                Value::List(Rc::new(super::value::List { items, tuple: l.tuple, origin: l.origin, depth: l.depth }))
            }
            Value::Str(s) => {
                let t = s.as_str();
                let bounds: Vec<usize> = t.char_indices().map(|(i, _)| i).chain(std::iter::once(t.len())).collect();
                let mut out = PBuilder::new();
                if step == 1 {
                    let (first, n) = (picks.start, picks.count);
                    if n > 0 {
                        out.push_slice(s, bounds[first], bounds[first + n]);
                    }
                } else {
                    for i in picks {
                        out.push_slice(s, bounds[i], bounds[i + 1]);
                    }
                }
                Value::Str(out.finish())
            }
            _ => Value::none(),
        })
    }

    pub fn binary(&mut self, op: BinOp, l: Value, r: Value) -> RResult<Value> {
        if op == BinOp::Concat {
            let (a, b) = (to_pstr(&l), to_pstr(&r));
            return self.concat(&a, &b);
        }
        // Python asks the undefined operand (its `__radd__`...) before a str or list can
        // complain about the type; only `str % x` formats first (an undefined prints empty).
        match (&l, &r) {
            (Value::Str(a), _) if op == BinOp::Mod => {
                return percent_format(a, &r).map(Value::Str).map_err(RenderError::runtime);
            }
            (Value::Undefined(u), _) | (_, Value::Undefined(u)) => return Err(undefined_error(u)),
            _ => {}
        }
        match (&l, &r) {
            (Value::Str(a), Value::Str(b)) if op == BinOp::Add => return self.concat(a, b),
            (Value::List(a), Value::List(b)) if op == BinOp::Add && a.tuple == b.tuple => {
                self.charge_size(a.items.len() + b.items.len())?;
                let items = a.items.iter().chain(&b.items).cloned().collect();
                let o = a.origin.join(b.origin);
                return Ok(if a.tuple { Value::tuple(items, o) } else { Value::list(items, o) });
            }
            (Value::Str(_) | Value::List(_), Value::Int(..) | Value::Bool(..)) if op == BinOp::Mul => return self.repeat(&l, &r),
            (Value::Int(..) | Value::Bool(..), Value::Str(_) | Value::List(_)) if op == BinOp::Mul => return self.repeat(&r, &l),
            (Value::Str(_), _) if op == BinOp::Add => {
                return rt(format!("can only concatenate str (not \"{}\") to str", r.type_name()));
            }
            (Value::List(a), _) if op == BinOp::Add => {
                let kind = if a.tuple { "tuple" } else { "list" };
                return rt(format!("can only concatenate {kind} (not \"{}\") to {kind}", r.type_name()));
            }
            _ => {}
        }
        match (number(&l), number(&r)) {
            (Some(x), Some(y)) => arith(op, x, y, l.origin().join(r.origin())),
            _ => rt(format!("unsupported operand type(s) for {}: '{}' and '{}'", op.symbol(), l.type_name(), r.type_name())),
        }
    }

    fn concat(&mut self, a: &PStr, b: &PStr) -> RResult<Value> {
        self.charge_size(a.len() + b.len())?;
        let mut out = PBuilder::new();
        out.push_pstr(a);
        out.push_pstr(b);
        Ok(Value::Str(out.finish()))
    }

    /// `seq * n`.
    fn repeat(&mut self, seq: &Value, n: &Value) -> RResult<Value> {
        let n = match number(n) {
            Some(Num::I(i)) => i.max(0) as usize,
            _ => 0,
        };
        match seq {
            Value::Str(s) => {
                self.charge_size(s.len().saturating_mul(n))?;
                let mut out = PBuilder::new();
                for _ in 0..n {
                    out.push_pstr(s);
                }
                Ok(Value::Str(out.finish()))
            }
            Value::List(l) => {
                self.charge_size(l.items.len().saturating_mul(n))?;
                let items: Vec<Value> = (0..n).flat_map(|_| l.items.iter().cloned()).collect();
                Ok(if l.tuple { Value::tuple(items, l.origin) } else { Value::list(items, l.origin) })
            }
            _ => rt("can't multiply sequence by non-int"),
        }
    }
}

fn check_hashable(k: &Value) -> RResult<()> {
    match k {
        Value::List(l) if !l.tuple => rt("unhashable type: 'list'"),
        Value::Dict(_) => rt("unhashable type: 'dict'"),
        Value::List(l) => l.items.iter().try_for_each(check_hashable),
        _ => Ok(()),
    }
}

/// A Python index (negative from the end) into a sequence of `len`, if in range.
fn index_of(k: &Value, len: usize) -> Option<usize> {
    let i = match k {
        Value::Int(i, _) => *i,
        Value::Bool(b, _) => *b as i64,
        _ => return None,
    };
    let i = if i < 0 { i + len as i64 } else { i };
    (0..len as i64).contains(&i).then_some(i as usize)
}

/// The indices a Python slice picks from a sequence of `len` (`PySlice_AdjustIndices`).
#[derive(Clone, Copy)]
struct Picks {
    start: usize,
    step: i64,
    count: usize,
}

impl Iterator for Picks {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.count == 0 {
            return None;
        }
        let i = self.start;
        self.count -= 1;
        self.start = (self.start as i64 + self.step).max(0) as usize;
        Some(i)
    }
}

impl Picks {
    fn len(&self) -> usize {
        self.count
    }
}

fn slice_indices(len: usize, start: Option<i64>, stop: Option<i64>, step: i64) -> Picks {
    let n = len as i64;
    let adjust = |v: Option<i64>, default: i64| -> i64 {
        match v {
            None => default,
            Some(v) if v < 0 => {
                let v = v + n;
                if v < 0 { if step < 0 { -1 } else { 0 } } else { v }
            }
            Some(v) if v >= n => if step < 0 { n - 1 } else { n },
            Some(v) => v,
        }
    };
    let (start, stop) = if step > 0 { (adjust(start, 0), adjust(stop, n)) } else { (adjust(start, n - 1), adjust(stop, -1)) };
    let count = if step > 0 {
        if start < stop { (stop - start - 1) / step + 1 } else { 0 }
    } else if stop < start {
        (start - stop - 1) / (-step) + 1
    } else {
        0
    };
    Picks { start: start.max(0) as usize, step, count: count as usize }
}

/// Unary minus (`neg`) or plus.
fn negate(v: Value, neg: bool) -> RResult<Value> {
    let o = v.origin();
    match (number(&v), &v) {
        (_, Value::Undefined(u)) => Err(undefined_error(u)),
        (Some(Num::I(i)), _) => {
            let r = if neg { i.checked_neg() } else { Some(i) };
            r.map(|i| Value::Int(i, o)).ok_or_else(|| overflow())
        }
        (Some(Num::F(f)), _) => Ok(Value::Float(if neg { -f } else { f }, o)),
        _ => rt(format!("bad operand type for unary {}: '{}'", if neg { "-" } else { "+" }, v.type_name())),
    }
}

fn overflow() -> RenderError {
    RenderError::runtime("integer overflow (integers are 64-bit here)")
}

/// Python arithmetic on numbers.
fn arith(op: BinOp, x: Num, y: Num, o: Origin) -> RResult<Value> {
    use Num::{F, I};
    let int = |r: Option<i64>| r.map(|i| Value::Int(i, o)).ok_or_else(overflow);
    let float = |f: f64| Ok(Value::Float(f, o));
    let fx = |n: Num| match n {
        I(i) => i as f64,
        F(f) => f,
    };
    match (op, x, y) {
        (BinOp::Add, I(a), I(b)) => int(a.checked_add(b)),
        (BinOp::Sub, I(a), I(b)) => int(a.checked_sub(b)),
        (BinOp::Mul, I(a), I(b)) => int(a.checked_mul(b)),
        (BinOp::Add, ..) => float(fx(x) + fx(y)),
        (BinOp::Sub, ..) => float(fx(x) - fx(y)),
        (BinOp::Mul, ..) => float(fx(x) * fx(y)),
        (BinOp::Div, ..) => {
            if fx(y) == 0.0 {
                return rt(if matches!((x, y), (I(_), I(_))) { "division by zero" } else { "float division by zero" });
            }
            float(fx(x) / fx(y))
        }
        (BinOp::FloorDiv | BinOp::Mod, I(a), I(b)) => {
            if b == 0 {
                return rt(if op == BinOp::Mod { "integer modulo by zero" } else { "integer division or modulo by zero" });
            }
            let (q, r) = (a.checked_div(b).ok_or_else(overflow)?, a % b);
            let adjust = r != 0 && ((r < 0) != (b < 0));
            if op == BinOp::FloorDiv { int(Some(if adjust { q - 1 } else { q })) } else { int(Some(if adjust { r + b } else { r })) }
        }
        (BinOp::FloorDiv | BinOp::Mod, ..) => {
            let (a, b) = (fx(x), fx(y));
            if b == 0.0 {
                return rt(if op == BinOp::Mod { "float modulo" } else { "float floor division by zero" });
            }
            let (div, m) = float_divmod(a, b);
            float(if op == BinOp::Mod { m } else { div })
        }
        (BinOp::Pow, I(a), I(b)) if b >= 0 => int(u32::try_from(b).ok().and_then(|b| a.checked_pow(b))),
        (BinOp::Pow, ..) => {
            let (a, b) = (fx(x), fx(y));
            if a == 0.0 && b < 0.0 {
                return rt("0.0 cannot be raised to a negative power");
            }
            if a < 0.0 && b.fract() != 0.0 {
                return rt("a negative number to a fractional power is complex, which is not supported");
            }
            let r = a.powf(b);
            if r.is_infinite() && a.is_finite() && b.is_finite() {
                return rt("(34, 'Numerical result out of range')");
            }
            float(r)
        }
        (BinOp::Concat, ..) => rt("internal: concatenation is not arithmetic"),
    }
}

/// CPython's `float_divmod`: floor quotient and remainder with the divisor's sign.
fn float_divmod(a: f64, b: f64) -> (f64, f64) {
    let mut m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 {
        if (b < 0.0) != (m < 0.0) {
            m += b;
            div -= 1.0;
        }
    } else {
        m = 0.0f64.copysign(b);
    }
    let floordiv = if div != 0.0 {
        let f = div.floor();
        if div - f > 0.5 { f + 1.0 } else { f }
    } else {
        0.0f64.copysign(a / b)
    };
    (floordiv, m)
}

/// One comparison of a chain.
pub fn compare(op: CmpOp, l: &Value, r: &Value) -> RResult<bool> {
    use std::cmp::Ordering::*;
    let sym = match op {
        CmpOp::Eq => return Ok(py_eq(l, r)),
        CmpOp::Ne => return Ok(!py_eq(l, r)),
        CmpOp::In => return contains(r, l),
        CmpOp::NotIn => return contains(r, l).map(|b| !b),
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    };
    for v in [l, r] {
        if let Value::Undefined(u) = v {
            return Err(undefined_error(u));
        }
    }
    let ord = py_cmp(l, r, sym).map_err(RenderError::runtime)?;
    Ok(match (op, ord) {
        (_, None) => false,
        (CmpOp::Lt, Some(o)) => o == Less,
        (CmpOp::Le, Some(o)) => o != Greater,
        (CmpOp::Gt, Some(o)) => o == Greater,
        (_, Some(o)) => o != Less,
    })
}

/// Python `item in container`.
pub fn contains(container: &Value, item: &Value) -> RResult<bool> {
    match container {
        Value::Str(s) => match item {
            Value::Str(x) => Ok(s.as_str().contains(x.as_str())),
            other => rt(format!("'in <string>' requires string as left operand, not {}", other.type_name())),
        },
        Value::List(l) => Ok(l.items.iter().any(|x| py_eq(x, item))),
        Value::Dict(d) => {
            check_hashable(item)?;
            Ok(d.get(item).is_some())
        }
        Value::Undefined(_) => Ok(false),
        other => rt(format!("argument of type '{}' is not iterable", other.type_name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_follow_python() {
        let picks = |len, a, b, c| slice_indices(len, a, b, c).collect::<Vec<_>>();
        assert_eq!(picks(5, None, None, -1), [4, 3, 2, 1, 0]);
        assert_eq!(picks(5, Some(1), None, 1), [1, 2, 3, 4]);
        assert_eq!(picks(5, None, Some(-1), 1), [0, 1, 2, 3]);
        assert_eq!(picks(5, Some(-2), Some(-10), -1), [3, 2, 1, 0]);
        assert_eq!(picks(5, Some(10), None, 2), Vec::<usize>::new());
        assert_eq!(picks(5, None, None, 2), [0, 2, 4]);
        assert_eq!(picks(0, None, None, -1), Vec::<usize>::new());
        assert_eq!(slice_indices(5, None, Some(3), 1).len(), 3);
    }

    #[test]
    fn python_division_and_modulo() {
        let v = |op, a: i64, b: i64| match arith(op, Num::I(a), Num::I(b), Origin::Markup) {
            Ok(Value::Int(i, _)) => i,
            other => panic!("{other:?}"),
        };
        assert_eq!(v(BinOp::FloorDiv, -7, 2), -4);
        assert_eq!(v(BinOp::Mod, -7, 2), 1);
        assert_eq!(v(BinOp::Mod, 7, -2), -1);
        assert_eq!(float_divmod(-7.5, 2.0), (-4.0, 0.5));
        assert!(arith(BinOp::Pow, Num::I(2), Num::I(64), Origin::Markup).is_err());
    }
}
