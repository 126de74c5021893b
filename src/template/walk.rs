//! Walks over a parsed tree: the facts a macro needs about its body (does it mention
//! `caller`, `varargs`, `kwargs`?) and jinja2's load-time check of filter and test names.

use super::ast::*;
use super::parser::{PResult, ParseError};
use std::sync::Arc;

/// jinja2's compile-time check: a filter or test name that does not exist is an error when
/// the template is loaded — unless it sits directly in an `if` (test or branches) or an inline
/// `if` expression, where jinja2 defers the error to the moment it runs. Loops, macros and
/// other blocks inside an `if` are checked again.
pub fn check_names(body: &[Stmt], filter: &dyn Fn(&str) -> bool, test: &dyn Fn(&str) -> bool) -> PResult<()> {
    let mut err = None;
    check_stmts(body, false, &mut |e, soft| {
        let unknown = match &e.kind {
            ExprKind::Filter(_, n, _) if !filter(n) => Some(format!("No filter named '{n}'.")),
            ExprKind::Test(_, n, _) if !test(n) => Some(format!("No test named '{n}'.")),
            _ => None,
        };
        if let (Some(msg), false, None) = (unknown, soft, &err) {
            err = Some(ParseError { msg, pos: e.pos as usize });
        }
    });
    err.map_or(Ok(()), Err)
}

/// Calls `f(expr, soft)` on every expression, `soft` where jinja2's frame is a soft one.
fn check_stmts(body: &[Stmt], soft: bool, f: &mut dyn FnMut(&Expr, bool)) {
    for s in body {
        match s {
            Stmt::Text(_) | Stmt::Break | Stmt::Continue => {}
            Stmt::Output(e) | Stmt::Set(_, e) => check_expr(e, soft, f),
            Stmt::If(branches, otherwise) => {
                for (t, b) in branches {
                    check_expr(t, true, f);
                    check_stmts(b, true, f);
                }
                check_stmts(otherwise, true, f);
            }
            Stmt::For(fs) => {
                check_expr(&fs.iter, soft, f);
                if let Some(c) = &fs.filter {
                    check_expr(c, false, f);
                }
                check_stmts(&fs.body, false, f);
                check_stmts(&fs.otherwise, false, f);
            }
            Stmt::SetBlock(_, filter, b) => {
                if let Some(e) = filter {
                    check_expr(e, soft, f);
                }
                check_stmts(b, false, f);
            }
            Stmt::Macro(m) | Stmt::CallBlock(m, _) => {
                m.defaults.iter().for_each(|e| check_expr(e, false, f));
                check_stmts(&m.body, false, f);
                if let Stmt::CallBlock(_, call) = s {
                    check_expr(call, soft, f);
                }
            }
            Stmt::FilterBlock(e, b) => {
                check_expr(e, soft, f);
                check_stmts(b, false, f);
            }
            Stmt::With(assigns, b) => {
                assigns.iter().for_each(|(_, e)| check_expr(e, soft, f));
                check_stmts(b, false, f);
            }
            Stmt::Scoped(b) => check_stmts(b, false, f),
        }
    }
}

fn check_expr(e: &Expr, soft: bool, f: &mut dyn FnMut(&Expr, bool)) {
    // An inline `if` makes everything in it soft.
    let soft = soft || matches!(e.kind, ExprKind::Cond { .. });
    f(e, soft);
    for c in children(e) {
        check_expr(c, soft, f);
    }
}

/// A macro definition, noting which of `caller`, `varargs`, `kwargs` its body mentions.
pub fn make_macro(name: Option<Arc<str>>, params: Vec<Arc<str>>, defaults: Vec<Expr>, body: Vec<Stmt>) -> MacroDef {
    let mut uses = [false; 3];
    walk_stmts(&body, &mut |e| {
        if let ExprKind::Name(n) = &e.kind {
            for (k, w) in ["caller", "varargs", "kwargs"].iter().enumerate() {
                if &**n == *w && !params.iter().any(|p| &**p == *w) {
                    uses[k] = true;
                }
            }
        }
    });
    MacroDef { name, params, defaults, body, uses_caller: uses[0], uses_varargs: uses[1], uses_kwargs: uses[2] }
}

/// Calls `f` on every expression of `body`, nested ones included.
fn walk_stmts(body: &[Stmt], f: &mut dyn FnMut(&Expr)) {
    for s in body {
        match s {
            Stmt::Text(_) | Stmt::Break | Stmt::Continue => {}
            Stmt::Output(e) | Stmt::Set(_, e) => walk_expr(e, f),
            Stmt::If(branches, otherwise) => {
                for (t, b) in branches {
                    walk_expr(t, f);
                    walk_stmts(b, f);
                }
                walk_stmts(otherwise, f);
            }
            Stmt::For(fs) => {
                walk_expr(&fs.iter, f);
                if let Some(c) = &fs.filter {
                    walk_expr(c, f);
                }
                walk_stmts(&fs.body, f);
                walk_stmts(&fs.otherwise, f);
            }
            Stmt::SetBlock(_, filter, b) => {
                if let Some(e) = filter {
                    walk_expr(e, f);
                }
                walk_stmts(b, f);
            }
            Stmt::Macro(m) => {
                m.defaults.iter().for_each(|e| walk_expr(e, f));
                walk_stmts(&m.body, f);
            }
            Stmt::CallBlock(m, call) => {
                walk_expr(call, f);
                walk_stmts(&m.body, f);
            }
            Stmt::FilterBlock(e, b) => {
                walk_expr(e, f);
                walk_stmts(b, f);
            }
            Stmt::With(assigns, b) => {
                assigns.iter().for_each(|(_, e)| walk_expr(e, f));
                walk_stmts(b, f);
            }
            Stmt::Scoped(b) => walk_stmts(b, f),
        }
    }
}

fn walk_expr(e: &Expr, f: &mut dyn FnMut(&Expr)) {
    f(e);
    for c in children(e) {
        walk_expr(c, f);
    }
}

/// The direct subexpressions of `e`.
fn children(e: &Expr) -> Vec<&Expr> {
    let mut out: Vec<&Expr> = Vec::new();
    fn push_args(a: &CallArgs) -> Vec<&Expr> {
        let mut v: Vec<&Expr> = a.args.iter().collect();
        v.extend(a.kwargs.iter().map(|(_, x)| x));
        v.extend(a.star.iter().chain(a.starstar.iter()));
        v
    }
    match &e.kind {
        ExprKind::Lit(_) | ExprKind::Name(_) => {}
        ExprKind::Tuple(v) | ExprKind::List(v) => out.extend(v.iter()),
        ExprKind::Dict(v) => v.iter().for_each(|(k, x)| out.extend([k, x])),
        ExprKind::Attr(x, _) | ExprKind::Not(x) | ExprKind::Neg(x) | ExprKind::Pos(x) => out.push(x),
        ExprKind::Item(a, b) | ExprKind::Bin(_, a, b) | ExprKind::And(a, b) | ExprKind::Or(a, b) => out.extend([&**a, &**b]),
        ExprKind::Slice(a, b, c) => out.extend([a, b, c].into_iter().flatten().map(|x| &**x)),
        ExprKind::Call(x, a) | ExprKind::Test(x, _, a) => {
            out.push(x);
            out.extend(push_args(a));
        }
        ExprKind::Filter(x, _, a) => {
            out.extend(x.iter().map(|x| &**x));
            out.extend(push_args(a));
        }
        ExprKind::Compare(x, ops) => {
            out.push(x);
            out.extend(ops.iter().map(|(_, y)| y));
        }
        ExprKind::Cond { test, then, otherwise } => {
            out.extend([&**test, &**then]);
            out.extend(otherwise.iter().map(|x| &**x));
        }
    }
    out
}
