//! The values a template computes with, and the Python semantics they carry: truthiness,
//! equality and ordering across types, type names for error messages, and conversion from the
//! caller's JSON.
//!
//! Values are immutable, as in the sandbox transformers renders with (lists and dicts refuse
//! mutation); only `namespace()` objects change, through `{% set ns.attr = ... %}`. Scalars
//! carry an [`Origin`] so that a number from the caller's data prints as content.

use super::ast::{ForStmt, MacroDef};
use super::eval::Scope;
use super::pstr::{Origin, PStr};
use crate::format::json::{Json, Number};
use std::cell::{Cell, RefCell};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// A template value.
#[derive(Clone, Debug)]
pub enum Value {
    Undefined(Rc<Undefined>),
    None(Origin),
    Bool(bool, Origin),
    Int(i64, Origin),
    Float(f64, Origin),
    Str(PStr),
    List(Rc<List>),
    Dict(Rc<Dict>),
    Namespace(Rc<Namespace>),
    Object(Rc<Object>),
}

/// A list or a tuple.
#[derive(Debug)]
pub struct List {
    pub items: Vec<Value>,
    pub tuple: bool,
    /// Content for lists from the caller's data (their brackets and commas print as content).
    pub origin: Origin,
    /// Levels of containers, this one included (see [`Value::nesting`]).
    pub depth: u32,
}

/// An insertion-ordered dict. Keys are unique (Python equality); string keys are also indexed
/// once the dict is large, so lookups in a big data object stay cheap.
#[derive(Debug)]
pub struct Dict {
    entries: Vec<(Value, Value)>,
    index: Option<HashMap<Rc<str>, usize>>,
    pub origin: Origin,
    depth: u32,
}

/// Dicts from this many entries on keep a hash index of their string keys.
const INDEX_FROM: usize = 12;

/// jinja2's `Namespace`: the one mutable object, changed by `{% set ns.attr = value %}`.
#[derive(Debug, Default)]
pub struct Namespace {
    pub attrs: RefCell<Vec<(Rc<str>, Value)>>,
}

/// Why a value is undefined, for the error raised when it is used.
#[derive(Debug)]
pub enum UndefWhy {
    /// A name that is not defined.
    Name(String),
    /// An attribute (or string key) that an object lacks: `owner` is jinja2's
    /// `object_type_repr` ("dict object", "None").
    Attr { owner: String, name: String },
    /// A non-string key or index: `key` is its Python repr.
    Element { owner: String, key: String },
    /// A ready message.
    Hint(String),
}

/// An undefined value: prints empty, is false, iterates as empty; anything else raises.
#[derive(Debug)]
pub struct Undefined {
    pub why: UndefWhy,
}

impl Undefined {
    /// The message jinja2's `Undefined._undefined_message` gives.
    pub fn message(&self) -> String {
        match &self.why {
            UndefWhy::Name(n) => format!("{} is undefined", py_str_repr(n)),
            UndefWhy::Attr { owner, name } => format!("{} has no attribute {}", py_str_repr(owner), py_str_repr(name)),
            UndefWhy::Element { owner, key } => format!("{owner} has no element {key}"),
            UndefWhy::Hint(h) => h.clone(),
        }
    }
}

/// The global functions of the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    Range,
    Dict,
    Namespace,
    RaiseException,
    StrftimeNow,
    Joiner,
    Cycler,
    Lipsum,
}

impl Builtin {
    pub fn name(self) -> &'static str {
        match self {
            Builtin::Range => "range",
            Builtin::Dict => "dict",
            Builtin::Namespace => "namespace",
            Builtin::RaiseException => "raise_exception",
            Builtin::StrftimeNow => "strftime_now",
            Builtin::Joiner => "joiner",
            Builtin::Cycler => "cycler",
            Builtin::Lipsum => "lipsum",
        }
    }

    pub fn by_name(name: &str) -> Option<Builtin> {
        Some(match name {
            "range" => Builtin::Range,
            "dict" => Builtin::Dict,
            "namespace" => Builtin::Namespace,
            "raise_exception" => Builtin::RaiseException,
            "strftime_now" => Builtin::StrftimeNow,
            "joiner" => Builtin::Joiner,
            "cycler" => Builtin::Cycler,
            "lipsum" => Builtin::Lipsum,
            _ => return None,
        })
    }
}

/// A macro (or a call block's `caller`) with the scope it was defined in.
#[derive(Debug)]
pub struct MacroValue {
    pub def: Arc<MacroDef>,
    /// Emptied when the render ends (a macro stored in its own scope is a reference cycle).
    pub scope: RefCell<Option<Rc<Scope>>>,
}

/// The `loop` variable of a for loop.
#[derive(Debug)]
pub struct LoopValue {
    pub items: Rc<[Value]>,
    pub index: Cell<usize>,
    /// 1 for the outermost call of a recursive loop.
    pub depth: usize,
    pub last_changed: RefCell<Option<Vec<Value>>>,
    /// For `recursive` loops: the loop and the scope it runs in, so `loop(items)` can recurse.
    pub recurse: Option<(Arc<ForStmt>, Rc<Scope>)>,
}

/// Values that are neither data nor containers.
#[derive(Debug)]
pub enum Object {
    Macro(MacroValue),
    Builtin(Builtin),
    /// A bound method of a str, list, dict or cycler, by its Python name.
    Method(Value, &'static str),
    Loop(LoopValue),
    Joiner { sep: Value, used: Cell<bool> },
    Cycler { items: Vec<Value>, pos: Cell<usize> },
}

impl Value {
    pub fn markup_str(s: &str) -> Value {
        Value::Str(PStr::markup(s))
    }

    pub fn int(i: i64) -> Value {
        Value::Int(i, Origin::Markup)
    }

    pub fn bool(b: bool) -> Value {
        Value::Bool(b, Origin::Markup)
    }

    pub fn none() -> Value {
        Value::None(Origin::Markup)
    }

    pub fn undefined(why: UndefWhy) -> Value {
        Value::Undefined(Rc::new(Undefined { why }))
    }

    pub fn list(items: Vec<Value>, origin: Origin) -> Value {
        let depth = 1 + items.iter().map(Value::nesting).max().unwrap_or(0);
        Value::List(Rc::new(List { items, tuple: false, origin, depth }))
    }

    pub fn tuple(items: Vec<Value>, origin: Origin) -> Value {
        let depth = 1 + items.iter().map(Value::nesting).max().unwrap_or(0);
        Value::List(Rc::new(List { items, tuple: true, origin, depth }))
    }

    /// How many containers deep the value is (0 for anything else). The evaluator refuses
    /// values deeper than its limit, so comparing, printing and dropping them cannot exhaust
    /// the stack.
    pub fn nesting(&self) -> u32 {
        match self {
            Value::List(l) => l.depth,
            Value::Dict(d) => d.depth,
            _ => 0,
        }
    }

    pub fn dict(d: Dict) -> Value {
        Value::Dict(Rc::new(d))
    }

    pub fn object(o: Object) -> Value {
        Value::Object(Rc::new(o))
    }

    pub fn is_undefined(&self) -> bool {
        matches!(self, Value::Undefined(_))
    }

    pub fn is_none(&self) -> bool {
        matches!(self, Value::None(_))
    }

    pub fn as_pstr(&self) -> Option<&PStr> {
        match self {
            Value::Str(p) => Some(p),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        self.as_pstr().map(PStr::as_str)
    }

    /// Python truthiness.
    pub fn truthy(&self) -> bool {
        match self {
            Value::Undefined(_) | Value::None(_) => false,
            Value::Bool(b, _) => *b,
            Value::Int(i, _) => *i != 0,
            Value::Float(f, _) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.items.is_empty(),
            Value::Dict(d) => !d.is_empty(),
            Value::Namespace(_) | Value::Object(_) => true,
        }
    }

    /// The origin of the value as a whole: content if it came from (or holds) the caller's data.
    pub fn origin(&self) -> Origin {
        match self {
            Value::Undefined(_) | Value::Namespace(_) | Value::Object(_) => Origin::Markup,
            Value::None(o) | Value::Bool(_, o) | Value::Int(_, o) | Value::Float(_, o) => *o,
            Value::Str(s) => s.origin(),
            Value::List(l) => l.origin,
            Value::Dict(d) => d.origin,
        }
    }

    /// Python's `type(x).__name__`, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Undefined(_) => "Undefined",
            Value::None(_) => "NoneType",
            Value::Bool(..) => "bool",
            Value::Int(..) => "int",
            Value::Float(..) => "float",
            Value::Str(_) => "str",
            Value::List(l) if l.tuple => "tuple",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Namespace(_) => "Namespace",
            Value::Object(o) => match &**o {
                Object::Macro(_) => "Macro",
                Object::Builtin(Builtin::Range) => "type",
                Object::Builtin(_) => "function",
                Object::Method(..) => "builtin_function_or_method",
                Object::Loop(_) => "LoopContext",
                Object::Joiner { .. } => "Joiner",
                Object::Cycler { .. } => "Cycler",
            },
        }
    }

    /// jinja2's `object_type_repr`: how an undefined attribute's owner is named.
    pub fn owner_name(&self) -> String {
        match self {
            Value::None(_) => "None".into(),
            Value::Namespace(_) => "jinja2.utils.Namespace object".into(),
            Value::Object(o) if matches!(**o, Object::Macro(_)) => "jinja2.runtime.Macro object".into(),
            Value::Object(o) if matches!(**o, Object::Loop(_)) => "jinja2.runtime.LoopContext object".into(),
            v => format!("{} object", v.type_name()),
        }
    }

    /// Converts the caller's JSON; every string, number and container gets `origin`. Repeated
    /// object keys keep the first position and the last value, as Python's `json` does.
    pub fn from_json(j: &Json, origin: Origin) -> Value {
        match j {
            Json::Null => Value::None(origin),
            Json::Bool(b) => Value::Bool(*b, origin),
            Json::Number(Number::U64(u)) => match i64::try_from(*u) {
                Ok(i) => Value::Int(i, origin),
                Err(_) => Value::Float(*u as f64, origin),
            },
            Json::Number(Number::I64(i)) => Value::Int(*i, origin),
            Json::Number(Number::F64(f)) => Value::Float(*f, origin),
            Json::String(s) => Value::Str(PStr::new(s, origin)),
            Json::Array(a) => Value::list(a.iter().map(|v| Value::from_json(v, origin)).collect(), origin),
            Json::Object(m) => {
                let mut d = Dict::new(origin);
                for (k, v) in m {
                    d.insert(Value::Str(PStr::new(k, origin)), Value::from_json(v, origin));
                }
                Value::dict(d)
            }
        }
    }
}

impl Dict {
    pub fn new(origin: Origin) -> Dict {
        Dict { entries: Vec::new(), index: None, origin, depth: 1 }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[(Value, Value)] {
        &self.entries
    }

    fn position(&self, key: &Value) -> Option<usize> {
        if let (Some(index), Value::Str(s)) = (&self.index, key) {
            return index.get(s.as_str()).copied();
        }
        self.entries.iter().position(|(k, _)| py_eq(k, key))
    }

    /// The value under `key` (Python equality: `1`, `1.0` and `True` are one key).
    pub fn get(&self, key: &Value) -> Option<&Value> {
        self.position(key).map(|i| &self.entries[i].1)
    }

    /// The value under a string key.
    pub fn get_str(&self, key: &str) -> Option<&Value> {
        self.get(&Value::markup_str(key))
    }

    /// Inserts or replaces (a replaced key keeps its position).
    pub fn insert(&mut self, key: Value, value: Value) {
        self.depth = self.depth.max(1 + key.nesting().max(value.nesting()));
        if let Some(i) = self.position(&key) {
            self.entries[i].1 = value;
            return;
        }
        if let (Some(index), Value::Str(s)) = (&mut self.index, &key) {
            index.insert(Rc::from(s.as_str()), self.entries.len());
        }
        self.entries.push((key, value));
        if self.index.is_none() && self.entries.len() >= INDEX_FROM {
            let mut index = HashMap::new();
            for (i, (k, _)) in self.entries.iter().enumerate() {
                if let Value::Str(s) = k {
                    index.insert(Rc::from(s.as_str()), i);
                }
            }
            self.index = Some(index);
        }
    }
}

/// Python `==`.
pub fn py_eq(a: &Value, b: &Value) -> bool {
    use Value::*;
    match (a, b) {
        (Undefined(_), Undefined(_)) => true,
        (None(_), None(_)) => true,
        (Str(x), Str(y)) => x.as_str() == y.as_str(),
        (List(x), List(y)) => {
            x.tuple == y.tuple && x.items.len() == y.items.len() && x.items.iter().zip(&y.items).all(|(p, q)| py_eq(p, q))
        }
        (Dict(x), Dict(y)) => x.len() == y.len() && x.entries.iter().all(|(k, v)| y.get(k).is_some_and(|w| py_eq(v, w))),
        (Namespace(x), Namespace(y)) => Rc::ptr_eq(x, y),
        (Object(x), Object(y)) => Rc::ptr_eq(x, y),
        _ => match (number(a), number(b)) {
            (Some(x), Some(y)) => num_eq(x, y),
            _ => false,
        },
    }
}

/// A number for arithmetic and comparison: bools are integers, as in Python.
#[derive(Clone, Copy, Debug)]
pub enum Num {
    I(i64),
    F(f64),
}

pub fn number(v: &Value) -> Option<Num> {
    match v {
        Value::Bool(b, _) => Some(Num::I(*b as i64)),
        Value::Int(i, _) => Some(Num::I(*i)),
        Value::Float(f, _) => Some(Num::F(*f)),
        _ => None,
    }
}

fn num_eq(a: Num, b: Num) -> bool {
    match (a, b) {
        (Num::I(x), Num::I(y)) => x == y,
        (Num::F(x), Num::F(y)) => x == y,
        (Num::I(i), Num::F(f)) | (Num::F(f), Num::I(i)) => int_float_cmp(i, f) == Some(Ordering::Equal),
    }
}

/// Exact comparison of an integer with a float (Python compares the true values).
fn int_float_cmp(i: i64, f: f64) -> Option<Ordering> {
    if f.is_nan() {
        return None;
    }
    if f >= 9.3e18 {
        return Some(Ordering::Less);
    }
    if f <= -9.3e18 {
        return Some(Ordering::Greater);
    }
    let t = f.trunc();
    match i.cmp(&(t as i64)) {
        Ordering::Equal => 0.0f64.partial_cmp(&(f - t)),
        o => Some(o),
    }
}

fn num_cmp(a: Num, b: Num) -> Option<Ordering> {
    match (a, b) {
        (Num::I(x), Num::I(y)) => Some(x.cmp(&y)),
        (Num::F(x), Num::F(y)) => x.partial_cmp(&y),
        (Num::I(i), Num::F(f)) => int_float_cmp(i, f),
        (Num::F(f), Num::I(i)) => int_float_cmp(i, f).map(Ordering::reverse),
    }
}

/// Python ordering for `<`-style operators: `Ok(None)` when unordered (a NaN is involved), an
/// error message (Python's `TypeError`) for types that do not compare; `op` names the operator.
pub fn py_cmp(a: &Value, b: &Value, op: &str) -> Result<Option<Ordering>, String> {
    match (a, b) {
        (Value::Str(x), Value::Str(y)) => Ok(Some(x.as_str().cmp(y.as_str()))),
        (Value::List(x), Value::List(y)) if x.tuple == y.tuple => {
            for (p, q) in x.items.iter().zip(&y.items) {
                if !py_eq(p, q) {
                    return py_cmp(p, q, op);
                }
            }
            Ok(Some(x.items.len().cmp(&y.items.len())))
        }
        _ => match (number(a), number(b)) {
            (Some(x), Some(y)) => Ok(num_cmp(x, y)),
            _ => Err(format!("'{op}' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name())),
        },
    }
}

/// Python `repr` of a string, quoting as Python chooses (single quotes unless the text holds a
/// single quote and no double quote).
pub fn py_str_repr(s: &str) -> String {
    let mut out = String::new();
    super::pyfmt::repr_str_into(s, &mut |t: &str| out.push_str(t));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_equality_across_numbers() {
        assert!(py_eq(&Value::int(1), &Value::Float(1.0, Origin::Markup)));
        assert!(py_eq(&Value::bool(true), &Value::int(1)));
        assert!(!py_eq(&Value::int(1), &Value::markup_str("1")));
        assert!(!py_eq(&Value::list(vec![], Origin::Markup), &Value::tuple(vec![], Origin::Markup)));
        assert_eq!(int_float_cmp(3, 2.5), Some(Ordering::Greater));
        assert_eq!(int_float_cmp(-3, -2.5), Some(Ordering::Less));
        assert_eq!(int_float_cmp(i64::MAX, 9.3e18), Some(Ordering::Less));
    }

    #[test]
    fn dicts_keep_first_position_and_last_value() {
        let j = crate::format::json::parse(br#"{"a": 1, "b": 2, "a": 3}"#).unwrap_or(Json::Null);
        let Value::Dict(d) = Value::from_json(&j, Origin::Content) else { panic!("not a dict") };
        assert_eq!(d.len(), 2);
        assert!(py_eq(d.get_str("a").unwrap_or(&Value::none()), &Value::int(3)));
        assert_eq!(d.entries()[0].0.as_str(), Some("a"));
        let mut big = Dict::new(Origin::Markup);
        for i in 0..40 {
            big.insert(Value::markup_str(&format!("k{i}")), Value::int(i));
        }
        big.insert(Value::markup_str("k3"), Value::int(-3));
        assert_eq!(big.len(), 40);
        assert!(py_eq(big.get_str("k3").unwrap_or(&Value::none()), &Value::int(-3)));
        assert!(big.get(&Value::int(3)).is_none());
    }

    #[test]
    fn ordering_refuses_mixed_types() {
        let e = py_cmp(&Value::markup_str("a"), &Value::int(1), "<").unwrap_err();
        assert_eq!(e, "'<' not supported between instances of 'str' and 'int'");
        assert_eq!(py_cmp(&Value::Float(f64::NAN, Origin::Markup), &Value::int(1), "<"), Ok(None));
    }
}
