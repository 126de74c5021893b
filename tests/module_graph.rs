//! The library's module graph follows the data path and has no cycles (issue 14): read from
//! the sources, every `crate::` path (in `use` lines, grouped `use crate::{..}` imports and
//! inline paths) names the top-level module it depends on. Comments are not dependencies; the
//! crate root (`lib.rs`, a facade of re-exports) is resolved to the module each re-exported
//! name comes from. The binary (`main.rs`, `cli/`, `serve/`) is a client of the library and is
//! not part of this graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("read src/").filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The source without `//` comments (doc links name modules without depending on them).
fn code_of(text: &str) -> String {
    text.lines().map(|l| match l.find("//") {
        Some(i) => &l[..i],
        None => l,
    }).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segment after every `crate::` (each item of a `crate::{a::b, c}` group).
fn crate_targets(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        // `waste::crate::` does not occur; a preceding identifier character means another
        // word that ends in "crate" (none today, but be exact).
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(is_ident) {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group: split on commas outside nested braces.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.push(first_segment(&item));
        } else {
            out.push(first_segment(rest));
        }
    }
    out.retain(|s| !s.is_empty() && s != "self");
    out
}

fn first_segment(s: &str) -> String {
    s.trim_start().chars().take_while(|&c| is_ident(c)).collect()
}

/// The top-level module of a file under src/ (`None` for the root and the binary).
fn top_module(rel: &Path) -> Option<String> {
    let parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let first = parts.first()?;
    if parts.len() == 1 {
        return match first.as_str() {
            "lib.rs" | "main.rs" => None,
            f => Some(f.trim_end_matches(".rs").to_string()),
        };
    }
    match first.as_str() {
        "cli" | "serve" => None,
        d => Some(d.to_string()),
    }
}

/// Names the crate root re-exports (`pub use module::...::Name;` and groups), mapped to the
/// module they come from.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for stmt in code_of(lib).split(';') {
        let s = stmt.trim();
        let Some(path) = s.strip_prefix("pub use ") else { continue };
        let module = first_segment(path);
        let tail = match path.find('{') {
            Some(i) => path[i + 1..].trim_end_matches('}').to_string(),
            None => path.rsplit("::").next().unwrap_or("").to_string(),
        };
        for name in tail.split(',') {
            // `a as b` exports b; `self` exports the module itself.
            let name = name.rsplit(" as ").next().unwrap_or("").trim();
            let name = name.rsplit("::").next().unwrap_or("").trim();
            if !name.is_empty() {
                map.insert(name.to_string(), module.clone());
            }
        }
    }
    map
}

type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// Edges between top-level modules, each with the files that create it.
fn graph() -> (Graph, BTreeSet<String>) {
    let root = src();
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("read src/lib.rs");
    let reexports = root_reexports(&lib);
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut modules = BTreeSet::new();
    let mut g: Graph = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&root).expect("under src/");
        let Some(from) = top_module(rel) else { continue };
        modules.insert(from.clone());
        let code = code_of(&std::fs::read_to_string(f).expect("read source"));
        for target in crate_targets(&code) {
            // A name defined in lib.rs itself (Options, VERSION, ...) is the root's: not a module.
            let to = match reexports.get(&target) {
                Some(m) => m.clone(),
                None => target,
            };
            let is_module = root.join(format!("{to}.rs")).exists() || root.join(&to).is_dir();
            if to != from && is_module && to != "test_util" {
                g.entry(from.clone()).or_default().entry(to).or_default().insert(rel.display().to_string());
            }
        }
    }
    (g, modules)
}

/// A cycle through `start`, if any (depth-first search over the edges).
fn cycle_from(g: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(g: &Graph, node: &str, start: &str, path: &mut Vec<String>, seen: &mut BTreeSet<String>) -> bool {
        for next in g.get(node).map(|m| m.keys()).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(g, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(g, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

fn describe(g: &Graph, cycle: &[String]) -> String {
    cycle.windows(2).map(|w| {
        let files: Vec<&String> = g[&w[0]][&w[1]].iter().collect();
        format!("{} -> {} (in {})", w[0], w[1], files.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))
    }).collect::<Vec<_>>().join("\n  ")
}

#[test]
fn the_parser_reads_paths_groups_and_skips_comments() {
    let code = code_of("use crate::a::B;\nuse crate::{c::D, e, f::{G, H}};\n// crate::zzz\nlet x = crate::g::h(); /// [`crate::doc`]\n");
    assert_eq!(crate_targets(&code), ["a", "c", "e", "f", "g"]);
    let map = root_reexports("pub use model::plan::{plan_memory, MemoryPlan};\npub use sys::CpuList;\npub use x::y as z;\n");
    assert_eq!(map.get("MemoryPlan").map(String::as_str), Some("model"));
    assert_eq!(map.get("CpuList").map(String::as_str), Some("sys"));
    assert_eq!(map.get("z").map(String::as_str), Some("x"));
    let mut g: Graph = BTreeMap::new();
    g.entry("a".into()).or_default().entry("b".into()).or_default().insert("a.rs".into());
    g.entry("b".into()).or_default().entry("a".into()).or_default().insert("b.rs".into());
    assert_eq!(cycle_from(&g, "a"), Some(vec!["a".to_string(), "b".to_string(), "a".to_string()]));
}

#[test]
fn no_cycle_between_top_level_modules() {
    let (g, modules) = graph();
    assert!(modules.len() >= 8, "found only {modules:?} under src/");
    let cycles: Vec<String> = modules.iter().filter_map(|m| cycle_from(&g, m)).map(|c| describe(&g, &c)).collect();
    assert!(cycles.is_empty(), "cycles between top-level modules:\n  {}", cycles.join("\n\n  "));
}

/// The specific directions issue 14 names: lower layers never reach up.
#[test]
fn lower_layers_do_not_import_upper_ones() {
    let (g, _) = graph();
    let forbidden = [
        ("sys", "kernels"), ("sys", "format"), ("sys", "model"), ("sys", "cache"),
        ("format", "model"), ("format", "cache"), ("format", "kernels"), ("format", "tools"), ("format", "tokenizer"),
        ("cache", "model"), ("kernels", "model"), ("kernels", "cache"),
    ];
    for (from, to) in forbidden {
        if let Some(files) = g.get(from).and_then(|m| m.get(to)) {
            panic!("{from} imports {to} (in {files:?})");
        }
    }
    for tool in ["convert", "quantize", "random"] {
        assert!(!src().join("format").join(format!("{tool}.rs")).exists(), "format/{tool}.rs: tools live in src/tools/");
    }
    assert!(!src().join("cache").join("plan.rs").exists(), "the memory plan imports the model's loaders: it is not the cache's");
}

/// The safetensors reader is the bottom of the formats built on it (the quantized checkpoint,
/// the container): it imports neither.
#[test]
fn safetensors_imports_neither_container_nor_quant() {
    let code = code_of(&std::fs::read_to_string(src().join("format/safetensors.rs")).expect("read safetensors.rs"));
    for name in ["container", "quant"] {
        for pattern in [format!("super::{name}"), format!("format::{name}")] {
            let hit = code.match_indices(&pattern).any(|(i, _)| !code[i + pattern.len()..].starts_with(is_ident));
            assert!(!hit, "format/safetensors.rs uses `{pattern}`");
        }
    }
}
