//! Runs a parsed template: statements, scopes, output with provenance, and the limits that
//! keep an untrusted template from running forever or exhausting memory or the stack.
//!
//! Scoping follows jinja2: a `for` iteration, a macro call, `with`, a block `set` and a
//! `{% filter %}` body each get a fresh scope whose names fall back to the enclosing ones, so a
//! `set` inside a loop does not leak out; `if` has no scope of its own. Macros see the scope
//! they were defined in. Expressions are evaluated in `expr.rs`, calls in `call.rs`.

use super::ast::{ForStmt, MacroDef, Stmt, Target, Template};
use super::pstr::{Origin, PBuilder, PStr};
use super::pyfmt;
use super::value::{Dict, LoopValue, MacroValue, Namespace, Object, UndefWhy, Value};
use super::DateTime;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

/// Bounds on one render. Every real chat template stays far below them.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of output, and of any one string or list built on the way.
    pub max_output: usize,
    /// Steps: one per statement and expression node, two per loop iteration, one per item of
    /// a `range` and per 16 bytes of strings built (about 100 ns each: the default bounds a
    /// render at a few seconds, while a real template spends a few hundred per message).
    pub max_steps: u64,
    /// Nested macro calls and recursive loops.
    pub max_calls: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_output: 64 << 20, max_steps: 20_000_000, max_calls: 120 }
    }
}

/// Containers nested deeper than this are refused (data from JSON nests at most 128 deep).
pub const MAX_VALUE_NESTING: u32 = 192;

/// Why a render stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// `raise_exception(message)`: the message is the template author's, verbatim.
    Raised,
    /// Anything else the template did wrong (Python's `TypeError`, `UndefinedError`, ...).
    Runtime,
    /// A limit of [`Limits`].
    Limit,
}

#[derive(Debug)]
pub struct RenderError {
    pub class: ErrorClass,
    pub msg: String,
    /// Byte offset of the innermost expression or statement that failed.
    pub pos: Option<usize>,
}

impl RenderError {
    pub fn runtime(msg: impl Into<String>) -> RenderError {
        RenderError { class: ErrorClass::Runtime, msg: msg.into(), pos: None }
    }

    /// Sets the position unless an inner node already did.
    pub fn at(mut self, pos: u32) -> RenderError {
        self.pos.get_or_insert(pos as usize);
        self
    }
}

pub type RResult<T> = Result<T, RenderError>;

/// A runtime error (Python's exception message).
pub fn rt<T>(msg: impl Into<String>) -> RResult<T> {
    Err(RenderError::runtime(msg))
}

/// A scope: names bound in it (a handful, so a list), and the enclosing scope.
#[derive(Debug, Default)]
pub struct Scope {
    vars: RefCell<Vec<(Arc<str>, Value)>>,
    parent: Option<Rc<Scope>>,
}

impl Scope {
    pub fn child(parent: &Rc<Scope>) -> Rc<Scope> {
        Rc::new(Scope { vars: RefCell::default(), parent: Some(parent.clone()) })
    }

    pub fn lookup(&self, name: &str) -> Option<Value> {
        let mut s = self;
        loop {
            if let Some((_, v)) = s.vars.borrow().iter().find(|(k, _)| &**k == name) {
                return Some(v.clone());
            }
            s = s.parent.as_deref()?;
        }
    }

    pub fn set(&self, name: &Arc<str>, v: Value) {
        let mut vars = self.vars.borrow_mut();
        match vars.iter_mut().find(|(k, _)| **k == **name) {
            Some(slot) => slot.1 = v,
            None => vars.push((name.clone(), v)),
        }
    }

    pub fn set_str(&self, name: &str, v: Value) {
        self.set(&Arc::from(name), v);
    }
}

/// How a statement list ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Normal,
    Break,
    Continue,
}

/// The state of one render.
pub struct Renderer<'t> {
    pub tpl: &'t Template,
    pub clock: DateTime,
    pub limits: Limits,
    pub scope: Rc<Scope>,
    out: Vec<PBuilder>,
    steps: u64,
    calls: usize,
    /// Macros and namespaces made during the render: the references they hold are cut when
    /// the render ends, since a macro stored in the scope it captures (or a namespace that
    /// holds itself) is a reference cycle.
    made_macros: Vec<Rc<Object>>,
    made_namespaces: Vec<Rc<Namespace>>,
    /// `loop`, bound once per iteration.
    loop_name: Arc<str>,
}

impl Drop for Renderer<'_> {
    fn drop(&mut self) {
        for m in &self.made_macros {
            if let Object::Macro(mv) = &**m {
                mv.scope.borrow_mut().take();
            }
        }
        for ns in &self.made_namespaces {
            ns.attrs.borrow_mut().clear();
        }
    }
}

/// Renders `tpl` with the given variables (the template's context); returns the output as
/// runs of `(text, origin)`.
pub fn render(tpl: &Template, vars: Vec<(String, Value)>, clock: DateTime, limits: Limits) -> RResult<Vec<(String, Origin)>> {
    let context = Rc::new(Scope::default());
    for (k, v) in vars {
        context.set_str(&k, v);
    }
    let mut r = Renderer {
        tpl,
        clock,
        limits,
        scope: Scope::child(&context),
        out: vec![PBuilder::with_limit(limits.max_output.saturating_add(1))],
        steps: 0,
        calls: 0,
        made_macros: Vec::new(),
        made_namespaces: Vec::new(),
        loop_name: Arc::from("loop"),
    };
    r.exec_block(&tpl.body)?;
    let out = r.out.pop().unwrap_or_default();
    Ok(out.into_parts())
}

impl Renderer<'_> {
    /// Counts `n` steps against the limit.
    pub fn charge(&mut self, n: u64) -> RResult<()> {
        self.steps += n;
        if self.steps > self.limits.max_steps {
            return Err(RenderError {
                class: ErrorClass::Limit,
                msg: format!("rendering took more than {} steps (a loop that does not end?)", self.limits.max_steps),
                pos: None,
            });
        }
        Ok(())
    }

    /// Charges for a value a filter, method or function made: a step per 16 bytes of a string,
    /// per 4 items of a list or dict.
    pub fn charge_result(&mut self, v: &Value) -> RResult<()> {
        match v {
            Value::Str(s) => self.charge(s.len() as u64 / 16),
            Value::List(l) => self.charge(l.items.len() as u64 / 4),
            Value::Dict(d) => self.charge(d.len() as u64 / 4),
            _ => Ok(()),
        }
    }

    /// Charges for building `bytes` bytes (or items) and refuses sizes over the output limit.
    pub fn charge_size(&mut self, bytes: usize) -> RResult<()> {
        if bytes > self.limits.max_output {
            return Err(RenderError {
                class: ErrorClass::Limit,
                msg: format!("a string or list of more than {} bytes (or items) would be built", self.limits.max_output),
                pos: None,
            });
        }
        self.charge(bytes as u64 / 16)
    }

    pub fn enter_call(&mut self) -> RResult<()> {
        self.calls += 1;
        if self.calls > self.limits.max_calls {
            return Err(RenderError {
                class: ErrorClass::Limit,
                msg: format!("macro calls nested more than {} deep (endless recursion?)", self.limits.max_calls),
                pos: None,
            });
        }
        Ok(())
    }

    pub fn leave_call(&mut self) {
        self.calls -= 1;
    }

    fn emit(&mut self, f: impl FnOnce(&mut PBuilder)) -> RResult<()> {
        let Some(out) = self.out.last_mut() else { return Ok(()) };
        let before = out.len();
        f(out);
        let (len, grown) = (out.len(), out.len() - before);
        if len > self.limits.max_output {
            return Err(RenderError {
                class: ErrorClass::Limit,
                msg: format!("the output would exceed {} bytes", self.limits.max_output),
                pos: None,
            });
        }
        self.charge(grown as u64 / 16)
    }

    /// Writes Python's `str(v)` to the current output.
    pub fn emit_value(&mut self, v: &Value) -> RResult<()> {
        self.emit(|out| pyfmt::write_str(v, out))
    }

    /// Runs `f` with a fresh output buffer and returns what it wrote.
    pub fn capture(&mut self, f: impl FnOnce(&mut Self) -> RResult<Flow>) -> RResult<(PStr, Flow)> {
        self.out.push(PBuilder::with_limit(self.limits.max_output.saturating_add(1)));
        let r = f(self);
        let out = self.out.pop().unwrap_or_default();
        Ok((out.finish(), r?))
    }

    /// Runs `f` in a fresh scope under `parent`.
    pub fn with_scope<T>(&mut self, parent: &Rc<Scope>, f: impl FnOnce(&mut Self) -> RResult<T>) -> RResult<T> {
        let saved = std::mem::replace(&mut self.scope, Scope::child(parent));
        let r = f(self);
        self.scope = saved;
        r
    }

    /// Runs a body in its own scope and returns its output.
    fn capture_scoped(&mut self, body: &[Stmt]) -> RResult<(PStr, Flow)> {
        let parent = self.scope.clone();
        self.with_scope(&parent, |r| r.capture(|r| r.exec_block(body)))
    }

    pub fn exec_block(&mut self, body: &[Stmt]) -> RResult<Flow> {
        for s in body {
            match self.exec(s)? {
                Flow::Normal => {}
                f => return Ok(f),
            }
        }
        Ok(Flow::Normal)
    }

    fn exec(&mut self, stmt: &Stmt) -> RResult<Flow> {
        self.charge(1)?;
        match stmt {
            Stmt::Text(t) => self.emit(|out| out.push(t, Origin::Markup))?,
            Stmt::Output(e) => {
                let v = self.eval(e)?;
                self.emit_value(&v).map_err(|err| err.at(e.pos))?;
            }
            Stmt::If(branches, otherwise) => {
                for (test, body) in branches {
                    if self.eval(test)?.truthy() {
                        return self.exec_block(body);
                    }
                }
                return self.exec_block(otherwise);
            }
            Stmt::For(f) => {
                let items = self.eval(&f.iter)?;
                let scope = self.scope.clone();
                return self.exec_for(f, &items, 1, &scope).map_err(|e| e.at(f.iter.pos));
            }
            Stmt::Set(target, e) => {
                let v = self.eval(e)?;
                self.assign(target, v).map_err(|err| err.at(e.pos))?;
            }
            Stmt::SetBlock(target, filter, body) => {
                let (text, flow) = self.capture_scoped(body)?;
                let mut v = Value::Str(text);
                if let Some(f) = filter {
                    v = self.eval_filter_chain(f, v)?;
                }
                self.assign(target, v)?;
                return Ok(flow);
            }
            Stmt::Macro(def) => {
                let m = self.make_macro(def);
                if let Some(name) = &def.name {
                    self.scope.set(name, m);
                }
            }
            Stmt::CallBlock(def, call) => {
                let caller = self.make_macro(def);
                let v = self.eval_call_with_caller(call, caller)?;
                self.emit_value(&v)?;
            }
            Stmt::FilterBlock(f, body) => {
                let (text, flow) = self.capture_scoped(body)?;
                let v = self.eval_filter_chain(f, Value::Str(text))?;
                self.emit_value(&v)?;
                return Ok(flow);
            }
            Stmt::With(assigns, body) => {
                let mut values = Vec::with_capacity(assigns.len());
                for (_, e) in assigns {
                    values.push(self.eval(e)?);
                }
                let parent = self.scope.clone();
                return self.with_scope(&parent, |r| {
                    for ((target, _), v) in assigns.iter().zip(values) {
                        r.assign(target, v)?;
                    }
                    r.exec_block(body)
                });
            }
            Stmt::Scoped(body) => {
                let parent = self.scope.clone();
                return self.with_scope(&parent, |r| r.exec_block(body));
            }
            Stmt::Break => return Ok(Flow::Break),
            Stmt::Continue => return Ok(Flow::Continue),
        }
        Ok(Flow::Normal)
    }

    /// A macro value capturing the current scope.
    fn make_macro(&mut self, def: &Arc<MacroDef>) -> Value {
        let m = Rc::new(Object::Macro(MacroValue { def: def.clone(), scope: RefCell::new(Some(self.scope.clone())) }));
        self.made_macros.push(m.clone());
        Value::Object(m)
    }

    pub fn new_namespace(&mut self, attrs: Vec<(Rc<str>, Value)>) -> Value {
        let ns = Rc::new(Namespace { attrs: RefCell::new(attrs) });
        self.made_namespaces.push(ns.clone());
        Value::Namespace(ns)
    }

    /// Runs a for loop over `items` (in `scope`, the scope the loop statement is in).
    pub fn exec_for(&mut self, f: &Arc<ForStmt>, items: &Value, depth: usize, scope: &Rc<Scope>) -> RResult<Flow> {
        let mut items = self.iterate(items)?;
        if let Some(cond) = &f.filter {
            let mut kept = Vec::with_capacity(items.len());
            for item in items {
                self.charge(1)?;
                let keep = self.with_scope(scope, |r| {
                    r.assign(&f.target, item.clone())?;
                    Ok(r.eval(cond)?.truthy())
                })?;
                if keep {
                    kept.push(item);
                }
            }
            items = kept;
        }
        if items.is_empty() {
            return self.with_scope(scope, |r| r.exec_block(&f.otherwise));
        }
        let recurse = f.recursive.then(|| (f.clone(), scope.clone()));
        let lv = LoopValue { items: Rc::from(items), index: Cell::new(0), depth, last_changed: RefCell::new(None), recurse };
        let lp = Rc::new(Object::Loop(lv));
        let Object::Loop(lv) = &*lp else { return Ok(Flow::Normal) };
        for (i, item) in lv.items.iter().enumerate() {
            self.charge(2)?;
            lv.index.set(i);
            let flow = self.with_scope(scope, |r| {
                r.scope.set(&r.loop_name.clone(), Value::Object(lp.clone()));
                r.assign(&f.target, item.clone())?;
                r.exec_block(&f.body)
            })?;
            if flow == Flow::Break {
                break;
            }
        }
        Ok(Flow::Normal)
    }

    /// The items of an iteration: a list's items, a dict's keys, a string's characters;
    /// nothing for an undefined value.
    pub fn iterate(&mut self, v: &Value) -> RResult<Vec<Value>> {
        match v {
            Value::List(l) => {
                self.charge(l.items.len() as u64 / 4)?;
                Ok(l.items.clone())
            }
            Value::Dict(d) => Ok(d.entries().iter().map(|(k, _)| k.clone()).collect()),
            Value::Str(s) => {
                self.charge(s.len() as u64)?;
                let t = s.as_str();
                Ok(t.char_indices().map(|(i, c)| Value::Str(s.slice(i, i + c.len_utf8()))).collect())
            }
            Value::Undefined(_) => Ok(Vec::new()),
            other => rt(format!("'{}' object is not iterable", other.type_name())),
        }
    }

    /// Binds a target: a name, a tuple (unpacked), or a namespace attribute.
    pub fn assign(&mut self, target: &Target, v: Value) -> RResult<()> {
        match target {
            Target::Name(n) => self.scope.set(n, v),
            Target::Tuple(targets) => {
                let items = self.iterate(&v)?;
                if items.len() < targets.len() {
                    return rt(format!("not enough values to unpack (expected {}, got {})", targets.len(), items.len()));
                }
                if items.len() > targets.len() {
                    return rt(format!("too many values to unpack (expected {})", targets.len()));
                }
                for (t, item) in targets.iter().zip(items) {
                    self.assign(t, item)?;
                }
            }
            Target::NsAttr(ns, attr) => {
                let Some(Value::Namespace(ns)) = self.scope.lookup(ns) else {
                    return rt("cannot assign attribute on non-namespace object");
                };
                check_namespace_name(attr)?;
                let mut attrs = ns.attrs.borrow_mut();
                match attrs.iter_mut().find(|(k, _)| **k == **attr) {
                    Some(slot) => slot.1 = v,
                    None => attrs.push((Rc::from(&**attr), v)),
                }
            }
        }
        Ok(())
    }
}

/// transformers' namespace refuses names that start with `_`.
pub fn check_namespace_name(name: &str) -> RResult<()> {
    if name.starts_with('_') {
        return rt(format!(
            "Chat templates cannot store underscore-prefixed attributes on a namespace, but got {}. Please rename the attribute.",
            super::value::py_str_repr(name)));
    }
    Ok(())
}

/// An undefined value with a ready message.
pub fn undefined_hint(msg: impl Into<String>) -> Value {
    Value::undefined(UndefWhy::Hint(msg.into()))
}

/// A dict from `(key, value)` pairs (later keys win).
pub fn dict_of(pairs: impl IntoIterator<Item = (Value, Value)>, origin: Origin) -> Value {
    let mut d = Dict::new(origin);
    for (k, v) in pairs {
        d.insert(k, v);
    }
    Value::dict(d)
}
