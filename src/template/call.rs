//! Calling things: macros (jinja2's argument binding: positionals, keywords, defaults,
//! `varargs`, `kwargs`, `caller`), the global functions (`range`, `dict`, `namespace`,
//! `raise_exception`, `strftime_now`, `joiner`, `cycler`), bound methods, recursive loops, and
//! the `loop` variable's attributes.

use super::eval::{check_namespace_name, dict_of, rt, undefined_hint, ErrorClass, RResult, RenderError, Renderer};
use super::expr::{undefined_error, Args};
use super::pstr::{Origin, PStr};
use super::pyfmt::to_pstr;
use super::value::{py_eq, Builtin, Dict, LoopValue, MacroValue, Object, Value};
use std::cell::Cell;
use std::rc::Rc;

/// The sandbox refuses ranges longer than this (jinja2's `MAX_RANGE`).
const MAX_RANGE: i64 = 100_000;

/// Reads a function's parameters from [`Args`] by position or keyword, and refuses extras.
pub struct Params {
    what: String,
    pos: Vec<Value>,
    kw: Vec<(String, Value)>,
    used: Vec<bool>,
}

impl Params {
    pub fn new(what: impl Into<String>, args: Args) -> Params {
        let used = vec![false; args.kw.len()];
        Params { what: what.into(), pos: args.pos, kw: args.kw, used }
    }

    /// Parameter `i` (counting the positionals a caller may give), or keyword `name`.
    pub fn get(&mut self, i: usize, name: &str) -> RResult<Option<Value>> {
        let kw = self.kw.iter().position(|(k, _)| k == name);
        if let Some(k) = kw {
            self.used[k] = true;
        }
        match (self.pos.get(i), kw) {
            (Some(_), Some(_)) => rt(format!("{}() got multiple values for argument '{name}'", self.what)),
            (Some(v), None) => Ok(Some(v.clone())),
            (None, Some(k)) => Ok(Some(self.kw[k].1.clone())),
            (None, None) => Ok(None),
        }
    }

    /// The positionals from `i` on (for `*args` parameters).
    pub fn rest(&self, i: usize) -> Vec<Value> {
        self.pos.get(i..).map(<[Value]>::to_vec).unwrap_or_default()
    }

    /// The keyword arguments, for functions that pass them on.
    pub fn take_kwargs(self) -> Vec<(String, Value)> {
        self.kw
    }

    /// Refuses more than `max` positionals and keywords that no `get` asked for.
    pub fn done(&self, max: usize) -> RResult<()> {
        if self.pos.len() > max {
            return rt(format!("{}() takes at most {max} argument(s) ({} given)", self.what, self.pos.len()));
        }
        if let Some(k) = self.used.iter().position(|u| !u) {
            return rt(format!("{}() got an unexpected keyword argument '{}'", self.what, self.kw[k].0));
        }
        Ok(())
    }
}

impl Renderer<'_> {
    pub fn call_value(&mut self, f: &Value, args: Args) -> RResult<Value> {
        let Value::Object(o) = f else {
            if let Value::Undefined(u) = f {
                return Err(undefined_error(u));
            }
            return rt(format!("'{}' object is not callable", f.type_name()));
        };
        match &**o {
            Object::Macro(m) => self.call_macro(m, args),
            Object::Builtin(b) => self.call_builtin(*b, args),
            Object::Method(recv, name) => self.call_method(recv, name, args),
            Object::Loop(l) => {
                let Some((stmt, scope)) = &l.recurse else {
                    return rt("The loop must have the 'recursive' marker to be called recursively.");
                };
                let mut p = Params::new("loop", args);
                let items = p.get(0, "iterable")?.ok_or_else(|| RenderError::runtime("loop() needs the items to recurse into"))?;
                p.done(1)?;
                let (stmt, scope, depth) = (stmt.clone(), scope.clone(), l.depth + 1);
                self.enter_call()?;
                let r = self.capture(|r| r.exec_for(&stmt, &items, depth, &scope));
                self.leave_call();
                Ok(Value::Str(r?.0))
            }
            Object::Joiner { sep, used } => {
                Params::new("joiner", args).done(0)?;
                Ok(if used.replace(true) { sep.clone() } else { Value::markup_str("") })
            }
            Object::Cycler { .. } => rt("'Cycler' object is not callable"),
        }
    }

    /// Calls a macro: binds the arguments in a new scope under the macro's own and renders
    /// the body; the result is the body's text.
    fn call_macro(&mut self, m: &MacroValue, args: Args) -> RResult<Value> {
        let def = m.def.clone();
        let name = def.name.as_deref().unwrap_or("caller").to_string();
        let Some(parent) = m.scope.borrow().clone() else { return rt(format!("macro '{name}' is no longer callable")) };
        let n = def.params.len();
        if args.pos.len() > n && !def.uses_varargs {
            return rt(format!("macro '{name}' takes not more than {n} argument(s)"));
        }
        self.enter_call()?;
        let r = self.with_scope(&parent, |r| {
            let Args { mut pos, mut kw } = args;
            let extra = pos.split_off(pos.len().min(n));
            let first_default = n - def.defaults.len();
            for (i, p) in def.params.iter().enumerate() {
                let from_kw = kw.iter().position(|(k, _)| **k == **p).map(|k| kw.remove(k).1);
                let v = match (pos.get(i), from_kw) {
                    (Some(v), None) => v.clone(),
                    (Some(_), Some(_)) => return rt(format!("macro '{name}' got multiple values for argument '{p}'")),
                    (None, Some(v)) => v,
                    (None, None) if i >= first_default => r.eval(&def.defaults[i - first_default])?,
                    (None, None) => undefined_hint(format!("parameter {} was not provided", super::value::py_str_repr(p))),
                };
                r.scope.set(p, v);
            }
            if def.uses_caller {
                let c = kw.iter().position(|(k, _)| k == "caller").map(|k| kw.remove(k).1);
                r.scope.set_str("caller", c.unwrap_or_else(|| undefined_hint("No caller defined")));
            }
            if def.uses_kwargs {
                let pairs = kw.drain(..).map(|(k, v)| (Value::markup_str(&k), v));
                r.scope.set_str("kwargs", dict_of(pairs, Origin::Markup));
            } else if let Some((k, _)) = kw.first() {
                return rt(format!("macro '{name}' takes no keyword argument '{k}'"));
            }
            if def.uses_varargs {
                r.scope.set_str("varargs", Value::tuple(extra, Origin::Markup));
            }
            r.capture(|r| r.exec_block(&def.body))
        });
        self.leave_call();
        Ok(Value::Str(r?.0))
    }

    fn call_builtin(&mut self, b: Builtin, args: Args) -> RResult<Value> {
        match b {
            Builtin::Range => self.range(args),
            Builtin::Dict => {
                let d = dict_from_args("dict", args)?;
                Ok(Value::dict(d))
            }
            Builtin::Namespace => {
                let d = dict_from_args("namespace", args)?;
                let mut attrs = Vec::with_capacity(d.len());
                for (k, v) in d.entries() {
                    let key = to_pstr(k);
                    check_namespace_name(key.as_str())?;
                    attrs.push((Rc::from(key.as_str()), v.clone()));
                }
                Ok(self.new_namespace(attrs))
            }
            Builtin::RaiseException => {
                let mut p = Params::new("raise_exception", args);
                let msg = p.get(0, "message")?.map(|m| to_pstr(&m).as_str().to_string()).unwrap_or_default();
                Err(RenderError { class: ErrorClass::Raised, msg, pos: None })
            }
            Builtin::StrftimeNow => {
                let mut p = Params::new("strftime_now", args);
                let fmt = p.get(0, "format")?.ok_or_else(|| RenderError::runtime("strftime_now() missing 1 required positional argument: 'format'"))?;
                p.done(1)?;
                let Value::Str(fmt) = fmt else { return rt("strftime() argument 1 must be str") };
                Ok(Value::Str(PStr::markup(&super::strftime::strftime(&self.clock, fmt.as_str()))))
            }
            Builtin::Joiner => {
                let mut p = Params::new("joiner", args);
                let sep = p.get(0, "sep")?.unwrap_or_else(|| Value::markup_str(", "));
                p.done(1)?;
                Ok(Value::object(Object::Joiner { sep, used: Cell::new(false) }))
            }
            Builtin::Cycler => {
                if !args.kw.is_empty() {
                    return rt("cycler() takes no keyword arguments");
                }
                if args.pos.is_empty() {
                    return rt("at least one item has to be provided");
                }
                Ok(Value::object(Object::Cycler { items: args.pos, pos: Cell::new(0) }))
            }
            Builtin::Lipsum => rt("lipsum() is not supported"),
        }
    }

    fn range(&mut self, args: Args) -> RResult<Value> {
        if !args.kw.is_empty() {
            return rt("range() takes no keyword arguments");
        }
        let mut nums = Vec::with_capacity(3);
        let mut origin = Origin::Markup;
        for v in &args.pos {
            origin = origin.join(v.origin());
            nums.push(match v {
                Value::Int(i, _) => *i,
                Value::Bool(b, _) => *b as i64,
                v => return rt(format!("'{}' object cannot be interpreted as an integer", v.type_name())),
            });
        }
        let (start, stop, step) = match nums[..] {
            [stop] => (0, stop, 1),
            [start, stop] => (start, stop, 1),
            [start, stop, step] => (start, stop, step),
            _ => return rt(format!("range expected at most 3 arguments, got {}", nums.len())),
        };
        if step == 0 {
            return rt("range() arg 3 must not be zero");
        }
        let len = if step > 0 {
            if start < stop { (stop as i128 - start as i128 - 1) / step as i128 + 1 } else { 0 }
        } else if stop < start {
            (start as i128 - stop as i128 - 1) / (-(step as i128)) + 1
        } else {
            0
        };
        if len > MAX_RANGE as i128 {
            return rt(format!("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({MAX_RANGE})."));
        }
        self.charge(len as u64)?;
        let items = (0..len as i64).map(|k| Value::Int(start + k * step, origin)).collect();
        Ok(Value::list(items, Origin::Markup))
    }
}

/// Python's `dict(mapping_or_pairs, **kwargs)`.
fn dict_from_args(what: &str, args: Args) -> RResult<Dict> {
    if args.pos.len() > 1 {
        return rt(format!("{what} expected at most 1 argument, got {}", args.pos.len()));
    }
    let mut d = Dict::new(Origin::Markup);
    if let Some(src) = args.pos.into_iter().next() {
        match src {
            Value::Dict(m) => {
                for (k, v) in m.entries() {
                    d.insert(k.clone(), v.clone());
                }
            }
            Value::List(l) => {
                for (i, item) in l.items.iter().enumerate() {
                    match item {
                        Value::List(pair) if pair.items.len() == 2 => d.insert(pair.items[0].clone(), pair.items[1].clone()),
                        _ => return rt(format!("dictionary update sequence element #{i} has the wrong length or type")),
                    }
                }
            }
            Value::Namespace(ns) => {
                for (k, v) in ns.attrs.borrow().iter() {
                    d.insert(Value::markup_str(k), v.clone());
                }
            }
            v => return rt(format!("'{}' object is not iterable", v.type_name())),
        }
    }
    for (k, v) in args.kw {
        d.insert(Value::markup_str(&k), v);
    }
    Ok(d)
}

/// An attribute of the `loop` variable.
pub fn loop_attr(this: &Value, l: &LoopValue, name: &str) -> Option<Value> {
    let i = l.index.get();
    let n = l.items.len();
    let int = |v: usize| Value::int(v as i64);
    Some(match name {
        "index" => int(i + 1),
        "index0" => int(i),
        "revindex" => int(n - i),
        "revindex0" => int(n - i - 1),
        "first" => Value::bool(i == 0),
        "last" => Value::bool(i + 1 == n),
        "length" => int(n),
        "depth" => int(l.depth),
        "depth0" => int(l.depth - 1),
        "previtem" => match i.checked_sub(1) {
            Some(p) => l.items[p].clone(),
            None => undefined_hint("there is no previous item"),
        },
        "nextitem" => l.items.get(i + 1).cloned().unwrap_or_else(|| undefined_hint("there is no next item")),
        "cycle" | "changed" => Value::object(Object::Method(this.clone(), if name == "cycle" { "cycle" } else { "changed" })),
        _ => return None,
    })
}

/// `loop.cycle(...)` and `loop.changed(...)`.
pub fn call_loop_method(l: &LoopValue, name: &str, args: Args) -> RResult<Value> {
    if !args.kw.is_empty() {
        return rt(format!("{name}() takes no keyword arguments"));
    }
    match name {
        "cycle" => {
            if args.pos.is_empty() {
                return rt("no items for cycling given");
            }
            Ok(args.pos[l.index.get() % args.pos.len()].clone())
        }
        _ => {
            let mut last = l.last_changed.borrow_mut();
            let same = last.as_ref().is_some_and(|prev| prev.len() == args.pos.len() && prev.iter().zip(&args.pos).all(|(a, b)| py_eq(a, b)));
            if !same {
                *last = Some(args.pos);
            }
            Ok(Value::bool(!same))
        }
    }
}

/// `cycler.next()` / `cycler.reset()`.
pub fn call_cycler_method(items: &[Value], pos: &Cell<usize>, name: &str) -> RResult<Value> {
    match name {
        "next" => {
            let i = pos.get();
            pos.set((i + 1) % items.len().max(1));
            Ok(items.get(i).cloned().unwrap_or_else(Value::none))
        }
        _ => {
            pos.set(0);
            Ok(Value::none())
        }
    }
}
