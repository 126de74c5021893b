//! The syntax tree of a parsed template. It holds no runtime values, so a parsed template is
//! `Send + Sync` and can be rendered from any thread. Names are shared strings, so binding
//! one in a scope costs no allocation.

use std::sync::Arc;

/// A literal of the source.
#[derive(Clone, Debug)]
pub enum Literal {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Box<str>),
}

#[derive(Debug)]
pub struct Expr {
    pub kind: ExprKind,
    /// Byte offset in the normalized source (for the line of an error).
    pub pos: u32,
    /// Height of the tree under this node (the parser refuses very deep trees, so evaluating
    /// and dropping them cannot exhaust the stack).
    pub depth: u16,
}

#[derive(Debug)]
pub enum ExprKind {
    Lit(Literal),
    Name(Arc<str>),
    Tuple(Vec<Expr>),
    List(Vec<Expr>),
    Dict(Vec<(Expr, Expr)>),
    /// `x.name`: attribute first, then item (jinja2's `getattr`).
    Attr(Box<Expr>, Box<str>),
    /// `x[key]`: item first, then attribute (jinja2's `getitem`); `key` may be a `Slice`.
    Item(Box<Expr>, Box<Expr>),
    Slice(Option<Box<Expr>>, Option<Box<Expr>>, Option<Box<Expr>>),
    Call(Box<Expr>, Box<CallArgs>),
    /// `value | name(args)`; no value inside `{% filter %}` and `{% set x | f %}` (the body is it).
    Filter(Option<Box<Expr>>, Box<str>, Box<CallArgs>),
    /// `value is name(args)`.
    Test(Box<Expr>, Box<str>, Box<CallArgs>),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    Pos(Box<Expr>),
    Bin(BinOp, Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    /// `a < b <= c`: chained, each operand evaluated once.
    Compare(Box<Expr>, Vec<(CmpOp, Expr)>),
    /// `then if test else otherwise`.
    Cond { test: Box<Expr>, then: Box<Expr>, otherwise: Option<Box<Expr>> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Mod,
    Pow,
    /// `~`: string concatenation of `str()` of both sides.
    Concat,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::FloorDiv => "//",
            BinOp::Mod => "%",
            BinOp::Pow => "**",
            BinOp::Concat => "~",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    NotIn,
}

#[derive(Debug, Default)]
pub struct CallArgs {
    pub args: Vec<Expr>,
    pub kwargs: Vec<(Box<str>, Expr)>,
    /// `*expr`
    pub star: Option<Expr>,
    /// `**expr`
    pub starstar: Option<Expr>,
}

/// What `set`, `for` and `with` assign to.
#[derive(Debug)]
pub enum Target {
    Name(Arc<str>),
    Tuple(Vec<Target>),
    /// `ns.attr` (only in `set`).
    NsAttr(Arc<str>, Arc<str>),
}

#[derive(Debug)]
pub enum Stmt {
    /// Template text.
    Text(Box<str>),
    /// `{{ expr }}`
    Output(Expr),
    /// `if`/`elif` branches, then `else`.
    If(Vec<(Expr, Vec<Stmt>)>, Vec<Stmt>),
    For(Arc<ForStmt>),
    Set(Target, Expr),
    /// `{% set x %}...{% endset %}`, with an optional filter chain applied to the body.
    SetBlock(Target, Option<Expr>, Vec<Stmt>),
    Macro(Arc<MacroDef>),
    /// `{% call(params) f(args) %}body{% endcall %}`: the body is `caller`.
    CallBlock(Arc<MacroDef>, Expr),
    /// `{% filter f %}body{% endfilter %}`: the filter chain has no value of its own.
    FilterBlock(Expr, Vec<Stmt>),
    With(Vec<(Target, Expr)>, Vec<Stmt>),
    /// A body with its own scope (`{% generation %}`).
    Scoped(Vec<Stmt>),
    Break,
    Continue,
}

#[derive(Debug)]
pub struct ForStmt {
    pub target: Target,
    pub iter: Expr,
    /// `for x in xs if cond`
    pub filter: Option<Expr>,
    pub recursive: bool,
    pub body: Vec<Stmt>,
    pub otherwise: Vec<Stmt>,
}

#[derive(Debug)]
pub struct MacroDef {
    /// `None` for a call block's `caller`.
    pub name: Option<Arc<str>>,
    pub params: Vec<Arc<str>>,
    /// Defaults of the last `defaults.len()` parameters.
    pub defaults: Vec<Expr>,
    pub body: Vec<Stmt>,
    /// The body mentions `caller`, `varargs`, `kwargs` (jinja2 then accepts them).
    pub uses_caller: bool,
    pub uses_varargs: bool,
    pub uses_kwargs: bool,
}

/// A parsed template.
#[derive(Debug)]
pub struct Template {
    /// What errors call the template (a file path, or a built-in's name).
    pub name: String,
    /// The normalized source (newlines as `\n`, one final newline dropped), for error lines.
    pub source: String,
    pub body: Vec<Stmt>,
}

impl Template {
    /// The 1-based line of byte offset `pos`.
    pub fn line_of(&self, pos: usize) -> usize {
        let end = pos.min(self.source.len());
        self.source.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
    }
}
