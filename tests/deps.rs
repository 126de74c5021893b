//! The design card: the crate depends on `libc` and `half`, nothing else — no dev- or
//! build-dependencies either. Checked on the real dependency graph.

use crate::common;

#[test]
fn dependencies_are_libc_and_half_only() {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["tree", "-e", "normal,dev,build", "--prefix", "none", "--offline"])
        .current_dir(common::root())
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!("cargo tree failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("cannot run cargo tree: {e}"),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut names: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().next()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names, ["half", "libc", "waste"], "cargo tree:\n{text}");
}
