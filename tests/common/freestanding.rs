//! Helpers for the tests of the static binary (`tests/static_binary.rs`, `tests/boot.rs`):
//! where `make static` puts it, whether it is current, and the text it must print.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The musl target `make static` builds for.
pub const MUSL: &str = "x86_64-unknown-linux-musl";

/// `target/x86_64-unknown-linux-musl/release/waste`, when it exists and is not older than the
/// sources it is built from (`Cargo.toml`, `Cargo.lock`, `src/`): a stale binary would test
/// yesterday's code. `Err` says why not, for a SKIP line.
pub fn static_binary() -> Result<PathBuf, String> {
    let root = super::root();
    let bin = root.join("target").join(MUSL).join("release/waste");
    let built = std::fs::metadata(&bin).and_then(|m| m.modified())
        .map_err(|e| format!("no static binary at {} ({e}): `make static` builds it (`make test` does first)", bin.display()))?;
    let mut newest = (SystemTime::UNIX_EPOCH, PathBuf::new());
    for p in [root.join("Cargo.toml"), root.join("Cargo.lock")] {
        newest_under(&p, &mut newest);
    }
    newest_under(&root.join("src"), &mut newest);
    if newest.0 > built {
        return Err(format!("{} is older than {}: run `make static`", bin.display(), newest.1.display()));
    }
    Ok(bin)
}

/// The latest modification time of `path` and everything under it, with the file's name.
fn newest_under(path: &Path, newest: &mut (SystemTime, PathBuf)) {
    let Ok(meta) = std::fs::metadata(path) else { return };
    if meta.is_dir() {
        for e in std::fs::read_dir(path).into_iter().flatten().flatten() {
            newest_under(&e.path(), newest);
        }
    } else if let Ok(t) = meta.modified() {
        if t > newest.0 {
            *newest = (t, path.to_path_buf());
        }
    }
}

/// True when the effective user is root (chroot and the cgroup tests need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// What `waste run models/stories260K "Once upon a time" -n N --temp 0` prints on stdout: the
/// prompt and the first N tokens of llama2.c's published greedy sample, then a newline.
pub fn golden_story(n: usize) -> String {
    let g = super::read_json(&super::fixture("stories260K_golden.json"));
    let ids = super::ids_of(g.get("greedy_ids").unwrap());
    let full = g.get("greedy_text").unwrap().as_str().unwrap();
    // The prompt is the first 5 ids (BOS and "Once upon a time").
    let m = waste::Model::open(super::root().join("models/stories260K"), &waste::Options::default()).unwrap();
    let text = m.tokenizer().unwrap().detokenize(&ids[..5 + n]).unwrap();
    assert!(full.starts_with(&text), "the first {n} tokens are a prefix of the golden text");
    text + "\n"
}

/// The program `name` (`chroot`, `taskset`, `file`): the first executable of that name in
/// `PATH` or the system directories, which a cleared environment would not search.
pub fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path.split(':').chain(["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    found
}
