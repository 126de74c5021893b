//! Tokens → syntax tree, following jinja2's `Parser` rule for rule: the same precedence
//! (`if`-expressions, `or`, `and`, `not`, comparisons, `+ -`, `~`, `* / // %`, `**` — left
//! associative, as in jinja2 — unary signs, then postfix `.x [x] (...)`, filters and tests),
//! the same statement forms and the same tuple rules.
//!
//! Nesting is bounded (statements, brackets, and the height of expression trees), so a hostile
//! template is an error, never a stack overflow.

use super::ast::*;
use super::lexer::{Tok, Token};
use super::walk::make_macro;
use std::sync::Arc;

/// Nested statements and brackets deeper than this are refused.
const MAX_NESTING: usize = 96;
/// Expression trees taller than this are refused (a chain `a + a + ...` grows one per term).
const MAX_EXPR_DEPTH: u16 = 400;

#[derive(Debug)]
pub struct ParseError {
    pub msg: String,
    pub pos: usize,
}

pub type PResult<T> = Result<T, ParseError>;

/// Parses the tokens of a template.
pub fn parse(tokens: Vec<Token>) -> PResult<Vec<Stmt>> {
    let mut p = Parser { toks: tokens, i: 0, depth: 0, loops: 0 };
    let body = p.subparse(&[])?;
    match p.cur() {
        Tok::Eof => Ok(body),
        _ => p.fail(format!("unexpected {}", describe(p.cur()))),
    }
}

struct Parser {
    toks: Vec<Token>,
    i: usize,
    depth: usize,
    /// Enclosing `for` bodies (within the current macro): where `break`/`continue` may appear.
    loops: usize,
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Name(n) => format!("'{n}'"),
        Tok::Op(o) => format!("'{o}'"),
        Tok::Str(_) => "string".into(),
        Tok::Int(_) => "integer".into(),
        Tok::Float(_) => "float".into(),
        Tok::Data(_) => "template data".into(),
        Tok::VarBegin => "'begin of print statement'".into(),
        Tok::VarEnd => "'end of print statement'".into(),
        Tok::BlockBegin => "'begin of statement block'".into(),
        Tok::BlockEnd => "'end of statement block'".into(),
        Tok::Eof => "end of template".into(),
    }
}

fn depth_of(kind: &ExprKind) -> u16 {
    let d = |e: &Expr| e.depth;
    let od = |e: &Option<Box<Expr>>| e.as_ref().map_or(0, |e| e.depth);
    let ad = |a: &CallArgs| {
        let mut m = a.args.iter().map(d).max().unwrap_or(0);
        m = m.max(a.kwargs.iter().map(|(_, e)| e.depth).max().unwrap_or(0));
        m.max(a.star.as_ref().map_or(0, d)).max(a.starstar.as_ref().map_or(0, d))
    };
    let children = match kind {
        ExprKind::Lit(_) | ExprKind::Name(_) => 0,
        ExprKind::Tuple(v) | ExprKind::List(v) => v.iter().map(d).max().unwrap_or(0),
        ExprKind::Dict(v) => v.iter().map(|(k, x)| k.depth.max(x.depth)).max().unwrap_or(0),
        ExprKind::Attr(e, _) | ExprKind::Not(e) | ExprKind::Neg(e) | ExprKind::Pos(e) => e.depth,
        ExprKind::Item(a, b) | ExprKind::Bin(_, a, b) | ExprKind::And(a, b) | ExprKind::Or(a, b) => a.depth.max(b.depth),
        ExprKind::Slice(a, b, c) => od(a).max(od(b)).max(od(c)),
        ExprKind::Call(e, a) | ExprKind::Test(e, _, a) => e.depth.max(ad(a)),
        ExprKind::Filter(e, _, a) => od(e).max(ad(a)),
        ExprKind::Compare(e, ops) => ops.iter().map(|(_, x)| x.depth).max().unwrap_or(0).max(e.depth),
        ExprKind::Cond { test, then, otherwise } => test.depth.max(then.depth).max(od(otherwise)),
    };
    children.saturating_add(1)
}

impl Parser {
    fn cur(&self) -> &Tok {
        &self.toks[self.i.min(self.toks.len() - 1)].tok
    }

    fn pos(&self) -> usize {
        self.toks[self.i.min(self.toks.len() - 1)].pos
    }

    fn look(&self) -> &Tok {
        &self.toks[(self.i + 1).min(self.toks.len() - 1)].tok
    }

    fn advance(&mut self) -> Tok {
        let k = self.i.min(self.toks.len() - 1);
        if k + 1 < self.toks.len() {
            self.i += 1;
        }
        std::mem::replace(&mut self.toks[k].tok, Tok::Eof)
    }

    fn fail<T>(&self, msg: impl Into<String>) -> PResult<T> {
        Err(ParseError { msg: msg.into(), pos: self.pos() })
    }

    fn is_op(&self, op: &str) -> bool {
        matches!(self.cur(), Tok::Op(o) if *o == op)
    }

    fn is_name(&self, name: &str) -> bool {
        matches!(self.cur(), Tok::Name(n) if n == name)
    }

    fn skip_op(&mut self, op: &str) -> bool {
        let yes = self.is_op(op);
        if yes {
            self.advance();
        }
        yes
    }

    fn skip_name(&mut self, name: &str) -> bool {
        let yes = self.is_name(name);
        if yes {
            self.advance();
        }
        yes
    }

    fn expect_op(&mut self, op: &str) -> PResult<()> {
        if self.skip_op(op) {
            return Ok(());
        }
        self.fail(format!("expected '{op}', got {}", describe(self.cur())))
    }

    fn expect_name(&mut self) -> PResult<String> {
        if let Tok::Name(_) = self.cur() {
            if let Tok::Name(n) = self.advance() {
                return Ok(n);
            }
        }
        self.fail(format!("expected a name, got {}", describe(self.cur())))
    }

    fn expect_tok(&mut self, want: Tok) -> PResult<()> {
        if *self.cur() == want {
            self.advance();
            return Ok(());
        }
        self.fail(format!("expected {}, got {}", describe(&want), describe(self.cur())))
    }

    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return self.fail(format!("template nested more than {MAX_NESTING} levels deep"));
        }
        Ok(())
    }

    fn mk(&self, kind: ExprKind, pos: usize) -> PResult<Expr> {
        let depth = depth_of(&kind);
        if depth > MAX_EXPR_DEPTH {
            return Err(ParseError { msg: format!("expression nested more than {MAX_EXPR_DEPTH} levels deep"), pos });
        }
        Ok(Expr { kind, pos: pos as u32, depth })
    }

    /// Template text, `{{ }}` and statements until the end of input or a block whose tag is
    /// one of `ends` (left as the current token).
    fn subparse(&mut self, ends: &[&str]) -> PResult<Vec<Stmt>> {
        let mut body = Vec::new();
        loop {
            match self.cur() {
                Tok::Data(_) => {
                    if let Tok::Data(d) = self.advance() {
                        body.push(Stmt::Text(d.into()));
                    }
                }
                Tok::VarBegin => {
                    self.advance();
                    let e = self.parse_tuple(true, &[], false)?;
                    self.expect_tok(Tok::VarEnd)?;
                    body.push(Stmt::Output(e));
                }
                Tok::BlockBegin => {
                    self.advance();
                    if let Tok::Name(n) = self.cur() {
                        if ends.contains(&n.as_str()) {
                            return Ok(body);
                        }
                    }
                    self.enter()?;
                    let stmts = self.parse_statement()?;
                    self.depth -= 1;
                    body.extend(stmts);
                    self.expect_tok(Tok::BlockEnd)?;
                }
                Tok::Eof => return Ok(body),
                t => return self.fail(format!("unexpected {}", describe(t))),
            }
        }
    }

    /// The body of a block statement: `%}`, statements, up to one of `ends` (consumed with
    /// `drop_end`).
    fn parse_statements(&mut self, ends: &[&str], drop_end: bool) -> PResult<Vec<Stmt>> {
        self.skip_op(":");
        self.expect_tok(Tok::BlockEnd)?;
        let body = self.subparse(ends)?;
        if *self.cur() == Tok::Eof {
            let names: Vec<String> = ends.iter().map(|e| format!("'{e}'")).collect();
            return self.fail(format!("unexpected end of template, expected {}", names.join(" or ")));
        }
        if drop_end {
            self.advance();
        }
        Ok(body)
    }

    fn parse_statement(&mut self) -> PResult<Vec<Stmt>> {
        let Tok::Name(tag) = self.cur() else {
            return self.fail(format!("expected a tag name, got {}", describe(self.cur())));
        };
        let tag = tag.clone();
        let one = |s: Stmt| Ok(vec![s]);
        match tag.as_str() {
            "for" => one(self.parse_for()?),
            "if" => one(self.parse_if()?),
            "set" => one(self.parse_set()?),
            "macro" => one(self.parse_macro()?),
            "call" => one(self.parse_call_block()?),
            "filter" => {
                self.advance();
                let f = self.parse_filter(None, true)?.ok_or_else(|| self.err_here("expected a filter"))?;
                one(Stmt::FilterBlock(f, self.parse_statements(&["endfilter"], true)?))
            }
            "with" => one(self.parse_with()?),
            "print" => {
                self.advance();
                let mut out = Vec::new();
                while *self.cur() != Tok::BlockEnd {
                    if !out.is_empty() {
                        self.expect_op(",")?;
                    }
                    out.push(Stmt::Output(self.parse_expression(true)?));
                }
                Ok(out)
            }
            "break" | "continue" => {
                if self.loops == 0 {
                    return self.fail(format!("'{tag}' outside loop"));
                }
                self.advance();
                one(if tag == "break" { Stmt::Break } else { Stmt::Continue })
            }
            "generation" => {
                self.advance();
                one(Stmt::Scoped(self.parse_statements(&["endgeneration"], true)?))
            }
            "block" | "extends" | "include" | "import" | "from" | "autoescape" | "do" | "trans" => {
                self.fail(format!("tag '{tag}' is not supported (a chat template is one self-contained template)"))
            }
            _ => self.fail(format!("Encountered unknown tag '{tag}'.")),
        }
    }

    fn err_here(&self, msg: &str) -> ParseError {
        ParseError { msg: msg.into(), pos: self.pos() }
    }

    fn parse_for(&mut self) -> PResult<Stmt> {
        self.advance();
        let target = self.parse_target(&["in"], false)?;
        if !self.skip_name("in") {
            return self.fail(format!("expected 'in', got {}", describe(self.cur())));
        }
        let iter = self.parse_tuple(false, &["recursive"], false)?;
        let filter = if self.skip_name("if") { Some(self.parse_expression(true)?) } else { None };
        let recursive = self.skip_name("recursive");
        self.loops += 1;
        let body = self.parse_statements(&["endfor", "else"], false);
        self.loops -= 1;
        let body = body?;
        let otherwise = match self.advance() {
            Tok::Name(n) if n == "else" => {
                let saved = std::mem::take(&mut self.loops);
                let r = self.parse_statements(&["endfor"], true);
                self.loops = saved;
                r?
            }
            _ => Vec::new(),
        };
        Ok(Stmt::For(Arc::new(ForStmt { target, iter, filter, recursive, body, otherwise })))
    }

    fn parse_if(&mut self) -> PResult<Stmt> {
        self.advance();
        let mut branches = Vec::new();
        let mut otherwise = Vec::new();
        loop {
            let test = self.parse_tuple(false, &[], false)?;
            let body = self.parse_statements(&["elif", "else", "endif"], false)?;
            branches.push((test, body));
            match self.advance() {
                Tok::Name(n) if n == "elif" => continue,
                Tok::Name(n) if n == "else" => otherwise = self.parse_statements(&["endif"], true)?,
                _ => {}
            }
            break;
        }
        Ok(Stmt::If(branches, otherwise))
    }

    fn parse_set(&mut self) -> PResult<Stmt> {
        self.advance();
        let target = self.parse_target(&[], true)?;
        if self.skip_op("=") {
            return Ok(Stmt::Set(target, self.parse_tuple(true, &[], false)?));
        }
        let filter = self.parse_filter(None, false)?;
        Ok(Stmt::SetBlock(target, filter, self.parse_statements(&["endset"], true)?))
    }

    /// A macro body: its own `break` context.
    fn macro_body(&mut self, end: &str) -> PResult<Vec<Stmt>> {
        let saved = std::mem::take(&mut self.loops);
        let r = self.parse_statements(&[end], true);
        self.loops = saved;
        r
    }

    fn parse_macro(&mut self) -> PResult<Stmt> {
        self.advance();
        let name = self.expect_name()?;
        let (params, defaults) = self.parse_signature()?;
        let body = self.macro_body("endmacro")?;
        Ok(Stmt::Macro(Arc::new(make_macro(Some(name.into()), params, defaults, body))))
    }

    fn parse_signature(&mut self) -> PResult<(Vec<Arc<str>>, Vec<Expr>)> {
        self.expect_op("(")?;
        let mut params: Vec<Arc<str>> = Vec::new();
        let mut defaults = Vec::new();
        while !self.is_op(")") {
            if !params.is_empty() {
                self.expect_op(",")?;
            }
            let name = self.expect_name()?;
            if self.skip_op("=") {
                defaults.push(self.parse_expression(true)?);
            } else if !defaults.is_empty() {
                return self.fail("non-default argument follows default argument");
            }
            params.push(name.into());
        }
        self.expect_op(")")?;
        Ok((params, defaults))
    }

    fn parse_call_block(&mut self) -> PResult<Stmt> {
        self.advance();
        let (params, defaults) = if self.is_op("(") { self.parse_signature()? } else { (Vec::new(), Vec::new()) };
        let call = self.parse_expression(true)?;
        if !matches!(call.kind, ExprKind::Call(..)) {
            return Err(ParseError { msg: "expected call".into(), pos: call.pos as usize });
        }
        let body = self.macro_body("endcall")?;
        Ok(Stmt::CallBlock(Arc::new(make_macro(None, params, defaults, body)), call))
    }

    fn parse_with(&mut self) -> PResult<Stmt> {
        self.advance();
        let mut assigns = Vec::new();
        while *self.cur() != Tok::BlockEnd {
            if !assigns.is_empty() {
                self.expect_op(",")?;
            }
            let target = self.parse_target(&[], false)?;
            self.expect_op("=")?;
            assigns.push((target, self.parse_expression(true)?));
        }
        Ok(Stmt::With(assigns, self.parse_statements(&["endwith"], true)?))
    }

    /// An assignment target: names, `ns.attr` (with `namespace`), tuples of targets.
    fn parse_target(&mut self, extra_end: &[&str], namespace: bool) -> PResult<Target> {
        let mut items = Vec::new();
        let mut is_tuple = false;
        loop {
            if !items.is_empty() {
                self.expect_op(",")?;
            }
            if self.is_tuple_end(extra_end) {
                break;
            }
            items.push(self.parse_target_primary(namespace)?);
            if self.is_op(",") {
                is_tuple = true;
            } else {
                break;
            }
        }
        if !is_tuple {
            return items.pop().ok_or_else(|| self.err_here("expected an assignment target"));
        }
        Ok(Target::Tuple(items))
    }

    fn parse_target_primary(&mut self, namespace: bool) -> PResult<Target> {
        match self.cur().clone() {
            Tok::Name(n) => {
                if matches!(n.as_str(), "true" | "false" | "True" | "False" | "none" | "None") {
                    return self.fail(format!("can't assign to '{n}'"));
                }
                self.advance();
                if namespace && self.skip_op(".") {
                    let attr = self.expect_name()?;
                    return Ok(Target::NsAttr(n.into(), attr.into()));
                }
                Ok(Target::Name(n.into()))
            }
            Tok::Op("(") => {
                self.advance();
                self.enter()?;
                let t = self.parse_target(&[], false)?;
                self.depth -= 1;
                self.expect_op(")")?;
                Ok(t)
            }
            t => self.fail(format!("can't assign to {}", describe(&t))),
        }
    }

    fn is_tuple_end(&self, extra_end: &[&str]) -> bool {
        match self.cur() {
            Tok::VarEnd | Tok::BlockEnd | Tok::Op(")") => true,
            Tok::Name(n) => extra_end.contains(&n.as_str()),
            _ => false,
        }
    }

    /// jinja2's `parse_tuple`: one expression, or a tuple of comma-separated ones.
    fn parse_tuple(&mut self, condexpr: bool, extra_end: &[&str], parens: bool) -> PResult<Expr> {
        let pos = self.pos();
        let mut items = Vec::new();
        let mut is_tuple = false;
        loop {
            if !items.is_empty() {
                self.expect_op(",")?;
            }
            if self.is_tuple_end(extra_end) {
                break;
            }
            items.push(self.parse_expression(condexpr)?);
            if self.is_op(",") {
                is_tuple = true;
            } else {
                break;
            }
        }
        if !is_tuple {
            if let Some(e) = items.pop() {
                return Ok(e);
            }
            if !parens {
                return self.fail(format!("Expected an expression, got {}", describe(self.cur())));
            }
        }
        self.mk(ExprKind::Tuple(items), pos)
    }

    fn parse_expression(&mut self, condexpr: bool) -> PResult<Expr> {
        self.enter()?;
        let r = if condexpr { self.parse_condexpr() } else { self.parse_or() };
        self.depth -= 1;
        r
    }

    fn parse_condexpr(&mut self) -> PResult<Expr> {
        let pos = self.pos();
        let mut e = self.parse_or()?;
        while self.skip_name("if") {
            let test = self.parse_or()?;
            let otherwise = if self.skip_name("else") { Some(Box::new(self.parse_expression(true)?)) } else { None };
            e = self.mk(ExprKind::Cond { test: Box::new(test), then: Box::new(e), otherwise }, pos)?;
        }
        Ok(e)
    }

    fn parse_or(&mut self) -> PResult<Expr> {
        let pos = self.pos();
        let mut e = self.parse_and()?;
        while self.skip_name("or") {
            let r = self.parse_and()?;
            e = self.mk(ExprKind::Or(Box::new(e), Box::new(r)), pos)?;
        }
        Ok(e)
    }

    fn parse_and(&mut self) -> PResult<Expr> {
        let pos = self.pos();
        let mut e = self.parse_not()?;
        while self.skip_name("and") {
            let r = self.parse_not()?;
            e = self.mk(ExprKind::And(Box::new(e), Box::new(r)), pos)?;
        }
        Ok(e)
    }

    fn parse_not(&mut self) -> PResult<Expr> {
        let pos = self.pos();
        if self.skip_name("not") {
            self.enter()?;
            let inner = self.parse_not();
            self.depth -= 1;
            return self.mk(ExprKind::Not(Box::new(inner?)), pos);
        }
        self.parse_compare()
    }

    fn parse_compare(&mut self) -> PResult<Expr> {
        let pos = self.pos();
        let first = self.parse_math1()?;
        let mut ops = Vec::new();
        loop {
            let op = match self.cur() {
                Tok::Op("==") => CmpOp::Eq,
                Tok::Op("!=") => CmpOp::Ne,
                Tok::Op("<") => CmpOp::Lt,
                Tok::Op("<=") => CmpOp::Le,
                Tok::Op(">") => CmpOp::Gt,
                Tok::Op(">=") => CmpOp::Ge,
                Tok::Name(n) if n == "in" => CmpOp::In,
                Tok::Name(n) if n == "not" && matches!(self.look(), Tok::Name(m) if m == "in") => {
                    self.advance();
                    CmpOp::NotIn
                }
                _ => break,
            };
            self.advance();
            ops.push((op, self.parse_math1()?));
        }
        if ops.is_empty() {
            return Ok(first);
        }
        self.mk(ExprKind::Compare(Box::new(first), ops), pos)
    }

    fn parse_binary(&mut self, ops: &[(&str, BinOp)], next: fn(&mut Parser) -> PResult<Expr>) -> PResult<Expr> {
        let pos = self.pos();
        let mut e = next(self)?;
        while let Some(&(_, op)) = ops.iter().find(|(s, _)| self.is_op(s)) {
            self.advance();
            let r = next(self)?;
            e = self.mk(ExprKind::Bin(op, Box::new(e), Box::new(r)), pos)?;
        }
        Ok(e)
    }

    fn parse_math1(&mut self) -> PResult<Expr> {
        self.parse_binary(&[("+", BinOp::Add), ("-", BinOp::Sub)], Parser::parse_concat)
    }

    fn parse_concat(&mut self) -> PResult<Expr> {
        self.parse_binary(&[("~", BinOp::Concat)], Parser::parse_math2)
    }

    fn parse_math2(&mut self) -> PResult<Expr> {
        let ops = [("*", BinOp::Mul), ("/", BinOp::Div), ("//", BinOp::FloorDiv), ("%", BinOp::Mod)];
        self.parse_binary(&ops, Parser::parse_pow)
    }

    fn parse_pow(&mut self) -> PResult<Expr> {
        self.parse_binary(&[("**", BinOp::Pow)], |p| p.parse_unary(true))
    }

    fn parse_unary(&mut self, with_filter: bool) -> PResult<Expr> {
        let pos = self.pos();
        let sign = if self.is_op("-") { Some(true) } else if self.is_op("+") { Some(false) } else { None };
        let mut e = match sign {
            Some(neg) => {
                self.advance();
                self.enter()?;
                let inner = self.parse_unary(false);
                self.depth -= 1;
                let inner = Box::new(inner?);
                self.mk(if neg { ExprKind::Neg(inner) } else { ExprKind::Pos(inner) }, pos)?
            }
            None => self.parse_primary()?,
        };
        e = self.parse_postfix(e)?;
        if with_filter {
            e = self.parse_filter_expr(e)?;
        }
        Ok(e)
    }

    fn parse_primary(&mut self) -> PResult<Expr> {
        let pos = self.pos();
        match self.advance() {
            Tok::Name(n) => {
                let kind = match n.as_str() {
                    "true" | "True" => ExprKind::Lit(Literal::Bool(true)),
                    "false" | "False" => ExprKind::Lit(Literal::Bool(false)),
                    "none" | "None" => ExprKind::Lit(Literal::None),
                    _ => ExprKind::Name(n.into()),
                };
                self.mk(kind, pos)
            }
            Tok::Str(s) => {
                let mut s = s;
                while let Tok::Str(_) = self.cur() {
                    if let Tok::Str(more) = self.advance() {
                        s.push_str(&more);
                    }
                }
                self.mk(ExprKind::Lit(Literal::Str(s.into())), pos)
            }
            Tok::Int(i) => self.mk(ExprKind::Lit(Literal::Int(i)), pos),
            Tok::Float(f) => self.mk(ExprKind::Lit(Literal::Float(f)), pos),
            Tok::Op("(") => {
                self.enter()?;
                let e = self.parse_tuple(true, &[], true);
                self.depth -= 1;
                let e = e?;
                self.expect_op(")")?;
                Ok(e)
            }
            Tok::Op("[") => {
                self.enter()?;
                let items = self.parse_items("]", |p| p.parse_expression(true));
                self.depth -= 1;
                self.mk(ExprKind::List(items?), pos)
            }
            Tok::Op("{") => {
                self.enter()?;
                let items = self.parse_items("}", |p| {
                    let k = p.parse_expression(true)?;
                    p.expect_op(":")?;
                    Ok((k, p.parse_expression(true)?))
                });
                self.depth -= 1;
                self.mk(ExprKind::Dict(items?), pos)
            }
            t => Err(ParseError { msg: format!("unexpected {}", describe(&t)), pos }),
        }
    }

    /// Comma-separated items up to `close` (a trailing comma allowed), the opener consumed.
    fn parse_items<T>(&mut self, close: &str, mut item: impl FnMut(&mut Parser) -> PResult<T>) -> PResult<Vec<T>> {
        let mut items = Vec::new();
        while !self.is_op(close) {
            if !items.is_empty() {
                self.expect_op(",")?;
            }
            if self.is_op(close) {
                break;
            }
            items.push(item(self)?);
        }
        self.expect_op(close)?;
        Ok(items)
    }

    fn parse_postfix(&mut self, mut e: Expr) -> PResult<Expr> {
        loop {
            e = match self.cur() {
                Tok::Op(".") | Tok::Op("[") => self.parse_subscript(e)?,
                Tok::Op("(") => self.parse_call(e)?,
                _ => return Ok(e),
            };
        }
    }

    fn parse_filter_expr(&mut self, mut e: Expr) -> PResult<Expr> {
        loop {
            e = match self.cur() {
                Tok::Op("|") => match self.parse_filter(Some(e), false)? {
                    Some(f) => f,
                    None => return self.fail("expected a filter"),
                },
                Tok::Name(n) if n == "is" => self.parse_test(e)?,
                Tok::Op("(") => self.parse_call(e)?,
                _ => return Ok(e),
            };
        }
    }

    fn parse_subscript(&mut self, e: Expr) -> PResult<Expr> {
        let pos = self.pos();
        if self.skip_op(".") {
            return match self.advance() {
                Tok::Name(n) => self.mk(ExprKind::Attr(Box::new(e), n.into()), pos),
                Tok::Int(i) => {
                    let key = self.mk(ExprKind::Lit(Literal::Int(i)), pos)?;
                    self.mk(ExprKind::Item(Box::new(e), Box::new(key)), pos)
                }
                _ => Err(ParseError { msg: "expected name or number".into(), pos }),
            };
        }
        self.expect_op("[")?;
        self.enter()?;
        let mut args = Vec::new();
        while !self.is_op("]") {
            if !args.is_empty() {
                self.expect_op(",")?;
            }
            args.push(self.parse_subscribed()?);
        }
        self.depth -= 1;
        self.expect_op("]")?;
        let key = if args.len() == 1 {
            args.pop().ok_or_else(|| self.err_here("expected a subscript"))?
        } else {
            self.mk(ExprKind::Tuple(args), pos)?
        };
        self.mk(ExprKind::Item(Box::new(e), Box::new(key)), pos)
    }

    /// One subscript: an expression or a slice `a:b:c` (any part may be missing).
    fn parse_subscribed(&mut self) -> PResult<Expr> {
        let pos = self.pos();
        let start = if self.is_op(":") {
            None
        } else {
            let e = self.parse_expression(true)?;
            if !self.is_op(":") {
                return Ok(e);
            }
            Some(Box::new(e))
        };
        self.advance(); // ':'
        let open = |p: &Parser| !(p.is_op("]") || p.is_op(","));
        let stop = if !self.is_op(":") && open(self) { Some(Box::new(self.parse_expression(true)?)) } else { None };
        let step = if self.skip_op(":") && open(self) { Some(Box::new(self.parse_expression(true)?)) } else { None };
        self.mk(ExprKind::Slice(start, stop, step), pos)
    }

    fn parse_call(&mut self, e: Expr) -> PResult<Expr> {
        let pos = self.pos();
        let args = self.parse_call_args()?;
        self.mk(ExprKind::Call(Box::new(e), Box::new(args)), pos)
    }

    fn parse_call_args(&mut self) -> PResult<CallArgs> {
        let open = self.pos();
        self.expect_op("(")?;
        self.enter()?;
        let mut a = CallArgs::default();
        let mut need_comma = false;
        let bad = |p: &Parser| Err(ParseError { msg: "invalid syntax for function call expression".into(), pos: p.pos().max(open) });
        while !self.is_op(")") {
            if need_comma {
                self.expect_op(",")?;
                if self.is_op(")") {
                    break;
                }
            }
            if self.skip_op("*") {
                if a.star.is_some() || a.starstar.is_some() {
                    return bad(self);
                }
                a.star = Some(self.parse_expression(true)?);
            } else if self.skip_op("**") {
                if a.starstar.is_some() {
                    return bad(self);
                }
                a.starstar = Some(self.parse_expression(true)?);
            } else if matches!(self.cur(), Tok::Name(_)) && matches!(self.look(), Tok::Op("=")) {
                if a.starstar.is_some() {
                    return bad(self);
                }
                let key = self.expect_name()?;
                self.advance();
                a.kwargs.push((key.into(), self.parse_expression(true)?));
            } else {
                if a.star.is_some() || a.starstar.is_some() || !a.kwargs.is_empty() {
                    return bad(self);
                }
                a.args.push(self.parse_expression(true)?);
            }
            need_comma = true;
        }
        self.depth -= 1;
        self.expect_op(")")?;
        Ok(a)
    }

    /// Filters `| name(args)` applied to `e` (`None` inside filter blocks; `inline` when the
    /// first name follows without a `|`).
    fn parse_filter(&mut self, mut e: Option<Expr>, mut inline: bool) -> PResult<Option<Expr>> {
        while self.is_op("|") || inline {
            if !inline {
                self.advance();
            }
            inline = false;
            let pos = self.pos();
            let mut name = self.expect_name()?;
            while self.skip_op(".") {
                name.push('.');
                name.push_str(&self.expect_name()?);
            }
            let args = if self.is_op("(") { self.parse_call_args()? } else { CallArgs::default() };
            e = Some(self.mk(ExprKind::Filter(e.map(Box::new), name.into(), Box::new(args)), pos)?);
        }
        Ok(e)
    }

    fn parse_test(&mut self, e: Expr) -> PResult<Expr> {
        let pos = self.pos();
        self.advance(); // 'is'
        let negated = self.skip_name("not");
        let mut name = self.expect_name()?;
        while self.skip_op(".") {
            name.push('.');
            name.push_str(&self.expect_name()?);
        }
        let mut args = CallArgs::default();
        let takes_bare_arg = match self.cur() {
            Tok::Name(n) => !matches!(n.as_str(), "else" | "or" | "and"),
            Tok::Str(_) | Tok::Int(_) | Tok::Float(_) | Tok::Op("[") | Tok::Op("{") => true,
            _ => false,
        };
        if self.is_op("(") {
            args = self.parse_call_args()?;
        } else if takes_bare_arg {
            if self.is_name("is") {
                return self.fail("You cannot chain multiple tests with is");
            }
            let arg = self.parse_primary()?;
            args.args.push(self.parse_postfix(arg)?);
        }
        let test = self.mk(ExprKind::Test(Box::new(e), name.into(), Box::new(args)), pos)?;
        if negated {
            return self.mk(ExprKind::Not(Box::new(test)), pos);
        }
        Ok(test)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::lexer::{normalize_source, tokenize};

    fn parse_src(src: &str) -> PResult<Vec<Stmt>> {
        let toks = tokenize(&normalize_source(src)).map_err(|e| ParseError { msg: e.msg, pos: e.pos })?;
        parse(toks)
    }

    #[test]
    fn precedence_follows_jinja2() {
        let body = parse_src("{{ -x|abs + 2 ** 3 ** 2 }}").unwrap_or_default();
        let Some(Stmt::Output(e)) = body.first() else { panic!("no output") };
        let ExprKind::Bin(BinOp::Add, l, r) = &e.kind else { panic!("{e:?}") };
        assert!(matches!(&l.kind, ExprKind::Filter(Some(v), n, _) if &**n == "abs" && matches!(v.kind, ExprKind::Neg(_))));
        // `**` is left-associative in jinja2: (2 ** 3) ** 2.
        let ExprKind::Bin(BinOp::Pow, inner, _) = &r.kind else { panic!("{r:?}") };
        assert!(matches!(inner.kind, ExprKind::Bin(BinOp::Pow, ..)));
    }

    #[test]
    fn refuses_what_jinja2_refuses() {
        for (src, want) in [
            ("{% for x in y %}", "unexpected end of template"),
            ("{% break %}", "outside loop"),
            ("{% macro m(a=1, b) %}{% endmacro %}", "non-default argument"),
            ("{{ }}", "Expected an expression"),
            ("{% foo %}", "unknown tag 'foo'"),
            ("{% include 'x' %}", "not supported"),
            ("{{ x is defined is defined }}", "chain multiple tests"),
            ("{% for x in y %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}", "outside loop"),
        ] {
            let e = parse_src(src).unwrap_err();
            assert!(e.msg.contains(want), "{src}: {}", e.msg);
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = format!("{{{{ {}1{} }}}}", "(".repeat(5000), ")".repeat(5000));
        assert!(parse_src(&deep).unwrap_err().msg.contains("nested"));
        let chain = format!("{{{{ 1{} }}}}", " + 1".repeat(5000));
        assert!(parse_src(&chain).unwrap_err().msg.contains("nested"));
        let ifs = "{% if x %}".repeat(5000);
        assert!(parse_src(&ifs).unwrap_err().msg.contains("nested"));
        let nots = format!("{{{{ {} x }}}}", "not ".repeat(5000));
        assert!(parse_src(&nots).unwrap_err().msg.contains("nested"));
    }
}
