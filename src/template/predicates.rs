//! jinja2 3.1's built-in tests (`x is defined`, `x is string`, `x is equalto y`, ...), with
//! Python's type rules: booleans are numbers but not integers, strings are iterable
//! sequences, dicts are mappings and sequences.

use super::ast::{BinOp, CmpOp};
use super::call::Params;
use super::eval::{rt, RResult, Renderer};
use super::expr::{compare, contains, Args};
use super::pyfmt::to_pstr;
use super::value::{Object, Value};

/// Every test name [`Renderer::apply_test`] knows (for the `test` test).
pub const TESTS: &[&str] = &["boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even",
    "false", "filter", "float", "ge", ">=", "gt", ">", "greaterthan", "in", "integer", "iterable", "le", "<=", "lower", "lt",
    "<", "lessthan", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "test", "true",
    "undefined", "upper"];

/// A jinja2 test name.
pub fn is_test(name: &str) -> bool {
    TESTS.contains(&name)
}

impl Renderer<'_> {
    pub fn apply_test(&mut self, name: &str, v: &Value, args: Args) -> RResult<bool> {
        let mut p = Params::new(name, args);
        let cmp = match name {
            "eq" | "equalto" | "==" => Some(CmpOp::Eq),
            "ne" | "!=" => Some(CmpOp::Ne),
            "lt" | "<" | "lessthan" => Some(CmpOp::Lt),
            "le" | "<=" => Some(CmpOp::Le),
            "gt" | ">" | "greaterthan" => Some(CmpOp::Gt),
            "ge" | ">=" => Some(CmpOp::Ge),
            _ => None,
        };
        if let Some(op) = cmp {
            let other = p.get(0, "other")?.ok_or_else(|| super::eval::RenderError::runtime(format!("{name}() missing 1 required positional argument")))?;
            p.done(1)?;
            return compare(op, v, &other);
        }
        match name {
            "divisibleby" | "in" | "sameas" => {
                let arg = p.get(0, if name == "divisibleby" { "num" } else { "value" })?.unwrap_or_else(Value::none);
                p.done(1)?;
                self.test_with_arg(name, v, &arg)
            }
            _ => {
                p.done(0)?;
                self.plain_test(name, v)
            }
        }
    }

    fn test_with_arg(&mut self, name: &str, v: &Value, arg: &Value) -> RResult<bool> {
        Ok(match name {
            "divisibleby" => {
                let m = self.binary(BinOp::Mod, v.clone(), arg.clone())?;
                super::value::py_eq(&m, &Value::int(0))
            }
            "in" => contains(arg, v)?,
            "sameas" => match (v, arg) {
                (Value::None(_), Value::None(_)) => true,
                (Value::Bool(a, _), Value::Bool(b, _)) => a == b,
                (Value::Int(a, _), Value::Int(b, _)) => a == b && (-5..=256).contains(a),
                (Value::List(a), Value::List(b)) => std::rc::Rc::ptr_eq(a, b),
                (Value::Dict(a), Value::Dict(b)) => std::rc::Rc::ptr_eq(a, b),
                (Value::Namespace(a), Value::Namespace(b)) => std::rc::Rc::ptr_eq(a, b),
                (Value::Object(a), Value::Object(b)) => std::rc::Rc::ptr_eq(a, b),
                _ => false,
            },
            _ => false,
        })
    }

    fn plain_test(&mut self, name: &str, v: &Value) -> RResult<bool> {
        Ok(match name {
            "defined" => !v.is_undefined(),
            "undefined" => v.is_undefined(),
            "none" => v.is_none(),
            "boolean" => matches!(v, Value::Bool(..)),
            "true" => matches!(v, Value::Bool(true, _)),
            "false" => matches!(v, Value::Bool(false, _)),
            "integer" => matches!(v, Value::Int(..)),
            "float" => matches!(v, Value::Float(..)),
            "number" => matches!(v, Value::Int(..) | Value::Float(..) | Value::Bool(..)),
            "string" => matches!(v, Value::Str(_)),
            "mapping" => matches!(v, Value::Dict(_)),
            "sequence" => matches!(v, Value::Str(_) | Value::List(_) | Value::Dict(_)),
            "iterable" => match v {
                Value::Str(_) | Value::List(_) | Value::Dict(_) | Value::Undefined(_) => true,
                Value::Object(o) => matches!(**o, Object::Loop(_)),
                _ => false,
            },
            "callable" => matches!(v, Value::Object(o) if !matches!(**o, Object::Cycler { .. })),
            "escaped" => false,
            // The tested value is the name.
            "filter" => v.as_str().is_some_and(|n| super::filters::FILTERS.contains(&n)),
            "test" => v.as_str().is_some_and(|n| TESTS.contains(&n)),
            "odd" | "even" => {
                let m = self.binary(BinOp::Mod, v.clone(), Value::int(2))?;
                super::value::py_eq(&m, &Value::int(if name == "odd" { 1 } else { 0 }))
            }
            "lower" | "upper" => {
                let s = to_pstr(v);
                let t = s.as_str();
                let (has_lower, has_upper) = (t.chars().any(char::is_lowercase), t.chars().any(char::is_uppercase));
                if name == "lower" { has_lower && !has_upper } else { has_upper && !has_lower }
            }
            n => return rt(format!("No test named '{n}'.")),
        })
    }
}
