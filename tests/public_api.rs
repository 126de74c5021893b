//! The public surface is the one `docs/API.md` lists (issue 14): every name the crate root
//! exports (`pub mod`, `pub use`, and items defined in `lib.rs`), and every name a public
//! module exports at its top level, must be named there (as `` `name` `` for the root and
//! `` `module::name` `` for a module's). A new public item therefore fails this test until it
//! is listed, with what it does and what it refuses, on purpose.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Source without `//` comments.
fn code_of(text: &str) -> String {
    text.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

fn ident(s: &str) -> String {
    s.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
}

/// Names exported at the top level of a module's source (not inside impls, not `pub(crate)`).
fn exported(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    // `pub use` statements may span lines: read them statement by statement.
    for stmt in code.split(';') {
        let Some(at) = stmt.find("pub use ") else { continue };
        // Top level only: the statement starts a line at column 0.
        if at > 0 && !stmt[..at].ends_with('\n') {
            continue;
        }
        let s = stmt;
        let path = &s[at + "pub use ".len()..];
        let tail = match path.find('{') {
            Some(i) => path[i + 1..].trim_end().trim_end_matches('}').to_string(),
            None => path.rsplit("::").next().unwrap_or("").to_string(),
        };
        for name in tail.split(',') {
            let name = name.rsplit(" as ").next().unwrap_or("").trim();
            let name = name.rsplit("::").next().unwrap_or("").trim();
            if !name.is_empty() && name != "self" {
                names.push(name.to_string());
            }
        }
    }
    for line in code.lines() {
        for kw in ["pub mod ", "pub fn ", "pub unsafe fn ", "pub struct ", "pub enum ", "pub const ", "pub static ", "pub type ", "pub trait "] {
            if let Some(rest) = line.strip_prefix(kw) {
                names.push(ident(rest));
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

fn module_file(src: &Path, path: &str) -> Option<PathBuf> {
    let flat = src.join(format!("{path}.rs"));
    let dir = src.join(path).join("mod.rs");
    [flat, dir].into_iter().find(|p| p.exists())
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn every_public_name_is_listed_in_docs_api_md() {
    let api = read(&root().join("docs/API.md"));
    let src = root().join("src");
    let lib = code_of(&read(&src.join("lib.rs")));
    let mut missing = Vec::new();
    let top = exported(&lib);
    assert!(top.contains(&"Model".to_string()) && top.contains(&"Error".to_string()), "lib.rs exports {top:?}");
    for name in &top {
        if !api.contains(&format!("`{name}`")) {
            missing.push(name.clone());
        }
        // A public module: its own top-level exports are listed as `module::name`.
        if let Some(file) = lib.lines().any(|l| l.trim() == format!("pub mod {name};")).then(|| module_file(&src, name)).flatten() {
            for inner in exported(&code_of(&read(&file))) {
                let full = format!("{name}::{inner}");
                if !api.contains(&format!("`{full}`")) {
                    missing.push(full);
                }
            }
        }
    }
    assert!(missing.is_empty(), "public but not listed in docs/API.md (list them, or make them pub(crate)): {missing:?}");
}

#[test]
fn internals_stay_private() {
    let lib = code_of(&read(&root().join("src/lib.rs")));
    for private in ["sys", "generate", "error", "chat"] {
        assert!(!lib.contains(&format!("pub mod {private};")), "`{private}` is an internal module");
    }
    let kernels = code_of(&read(&root().join("src/kernels/mod.rs")));
    for isa in ["scalar", "avx2", "avx2_gemm", "avx512", "avx512_prefill", "neon", "attention", "mla"] {
        assert!(!kernels.lines().any(|l| l.trim() == format!("pub mod {isa};")),
            "kernels::{isa} (raw, often `unsafe`, loops) is public; hosts use `Kernels` and `Pool`");
    }
}

#[test]
fn the_export_reader_reads_groups_renames_and_items() {
    let names = exported("pub use a::{B, c::D as E};\npub use f::G;\npub mod h;\npub fn i() {}\n    pub fn not_top() {}\npub(crate) mod j;\n");
    assert_eq!(names, ["B", "E", "G", "h", "i"]);
}
