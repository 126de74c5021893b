//! The static binary (`make static`, which `make test` runs first): fully static, and working
//! where nothing else exists — an empty directory holding only the binary and stories260K,
//! entered with `chroot`: no `/proc`, `/sys`, `/dev` or `/etc`. There usable RAM comes from
//! `sysinfo(2)` and the thread count from `sched_getaffinity`. SKIP when the binary is missing
//! or stale, or (for the chroot) when not root.

use crate::common;
use common::freestanding::{golden_story, is_root, program, static_binary};
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use waste::format::json::{self, Json};

/// The ELF file's program headers: (type, offset, file size).
fn program_headers(elf: &[u8]) -> Vec<(u32, u64, u64)> {
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    assert_eq!(&elf[..5], b"\x7fELF\x02", "a 64-bit ELF file");
    assert_eq!(elf[5], 1, "little-endian");
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    (0..phnum).map(|i| {
        let h = phoff + i * phentsize;
        (u32::from_le_bytes(elf[h..h + 4].try_into().unwrap()), u64_at(h + 8), u64_at(h + 32))
    }).collect()
}

#[test]
fn the_static_binary_needs_no_interpreter_and_no_shared_library() {
    const NAME: &str = "the_static_binary_needs_no_interpreter_and_no_shared_library";
    let bin = match static_binary() {
        Ok(b) => b,
        Err(why) => return skip(NAME, &why),
    };
    let elf = std::fs::read(&bin).unwrap();
    let headers = program_headers(&elf);
    const PT_DYNAMIC: u32 = 2;
    const PT_INTERP: u32 = 3;
    const DT_NEEDED: u64 = 1;
    assert!(headers.iter().all(|h| h.0 != PT_INTERP), "{}: has a PT_INTERP (a dynamic loader)", bin.display());
    // A static PIE keeps a dynamic section for relocating itself, but it names no library.
    for &(_, offset, size) in headers.iter().filter(|h| h.0 == PT_DYNAMIC) {
        let section = &elf[offset as usize..(offset + size) as usize];
        for entry in section.chunks_exact(16) {
            let tag = u64::from_le_bytes(entry[..8].try_into().unwrap());
            assert_ne!(tag, DT_NEEDED, "{}: needs a shared library", bin.display());
            if tag == 0 {
                break;
            }
        }
    }
    // What `file` and `ldd` say, where they are installed.
    for (tool, ok) in [("file", &["statically linked", "static-pie linked"]), ("ldd", &["statically linked", "not a dynamic executable"])] {
        let Some(path) = program(tool) else {
            skip(NAME, &format!("`{tool}` is not installed; the ELF headers were checked"));
            continue;
        };
        let out = Command::new(path).arg(&bin).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        println!("{tool}: {}", text.trim());
        assert!(ok.iter().any(|s| text.contains(s)), "{tool} {}: {text}", bin.display());
        assert!(!text.contains("=>") && !text.contains("dynamically linked"), "{tool}: {text}");
    }
}

/// Runs the binary at `/waste` inside `dir` (chroot), with an empty environment and no stdin,
/// under `prefix` (`taskset -c N`), with `args`: (status, stdout, stderr).
fn in_chroot(dir: &Path, prefix: &[&str], args: &[&str]) -> (i32, String, String) {
    let chroot = program("chroot").unwrap();
    let (exe, rest): (std::path::PathBuf, Vec<&str>) = match prefix.split_first() {
        Some((p, r)) => (program(p).unwrap(), r.iter().copied().chain([chroot.to_str().unwrap()]).collect()),
        None => (chroot.clone(), Vec::new()),
    };
    let out = Command::new(exe).args(rest).arg(dir).arg("/waste").args(args)
        .env_clear().stdin(Stdio::null()).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn json_of(text: &str) -> Json {
    json::parse(text.as_bytes()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn uint(doc: &Json, key: &str) -> u64 {
    doc.get(key).and_then(|v| v.as_u64()).unwrap_or_else(|| panic!("no `{key}` in {}", doc.to_string_pretty()))
}

#[test]
fn run_plan_and_info_work_in_an_empty_chroot() {
    const NAME: &str = "run_plan_and_info_work_in_an_empty_chroot";
    let bin = match static_binary() {
        Ok(b) => b,
        Err(why) => return skip(NAME, &why),
    };
    if !is_root() {
        return skip(NAME, "chroot needs root");
    }
    if program("chroot").is_none() {
        return skip(NAME, "no `chroot` program");
    }
    // Only the binary and the model: no /proc, /sys, /dev, /etc, no library, no loader.
    let dir = temp_dir("chroot");
    std::fs::copy(&bin, dir.join("waste")).unwrap();
    std::fs::create_dir(dir.join("stories260K")).unwrap();
    for e in std::fs::read_dir(root().join("models/stories260K")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join("stories260K").join(e.file_name())).unwrap();
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["stories260K", "waste"]);

    // run: the golden story, and the budget it chose from usable RAM.
    let (status, out, err) = in_chroot(&dir, &[], &["run", "/stories260K", "Once upon a time", "-n", "64", "--temp", "0"]);
    assert_eq!(status, 0, "{err}");
    assert_eq!(out, golden_story(64));
    assert!(err.starts_with("[budget ") && err.contains("[64 tokens, "), "{err}");

    // plan: usable RAM is physical RAM from sysinfo(2) (no /proc: no meminfo, no cgroup seen).
    let ram = waste::host::physical_ram_bytes();
    assert!(ram > 0);
    let (status, out, err) = in_chroot(&dir, &[], &["plan", "/stories260K"]);
    assert_eq!(status, 0, "{err}");
    println!("{out}");
    let line = |label: &str| out.lines().find(|l| l.trim_start().starts_with(label)).unwrap_or_else(|| panic!("no {label} in {out}")).to_string();
    assert!(line("usable RAM").ends_with(&format!(" {ram} bytes")), "{out}");
    assert!(line("physical RAM").ends_with(&format!(" {ram} bytes")), "{out}");
    assert!(out.contains("(physical RAM from sysinfo(2))"), "{out}");
    assert!(out.contains("note: /proc/meminfo does not exist: physical RAM from sysinfo(2)"), "{out}");
    assert!(out.contains("note: /proc/self/cgroup does not exist"), "{out}");
    let (status, out, err) = in_chroot(&dir, &[], &["plan", "/stories260K", "--json"]);
    assert_eq!(status, 0, "{err}");
    let doc = json_of(&out);
    assert_eq!(uint(&doc, "usable_ram_bytes"), ram);
    assert_eq!(uint(&doc, "physical_ram_bytes"), ram);

    // info: one thread per CPU of the affinity mask (inherited from this process), and the
    // kernels the dynamically linked build chooses on this machine: the runtime choice holds.
    let allowed = waste::host::current_thread_cpus().unwrap();
    let (status, out, err) = in_chroot(&dir, &[], &["info", "/stories260K", "--json"]);
    assert_eq!(status, 0, "{err}");
    let inside = json_of(&out);
    assert_eq!(uint(&inside, "threads"), allowed.len() as u64, "{out}");
    let (status, out, err) = waste(&["info", "models/stories260K", "--json"]);
    assert_eq!(status, 0, "{err}");
    let outside = json_of(&out);
    assert_eq!(inside.get("isa"), outside.get("isa"));
    for key in ["parameters", "weight_bytes", "kv_bytes", "scratch_bytes", "budget_bytes"] {
        assert_eq!(uint(&inside, key), uint(&outside, key), "{key}");
    }
    println!("in the chroot: {} threads, kernels {}", uint(&inside, "threads"), inside.get("isa").and_then(|v| v.as_str()).unwrap_or("?"));

    // Confined to the highest CPU it may use, the process has one thread, and `N` (the last
    // CPU) names a CPU it can bind to, although musl sizes the machine by the mask.
    let Some(&last) = allowed.last() else { panic!("no CPU in this thread's mask") };
    if program("taskset").is_none() {
        return skip(NAME, "no `taskset` program: the confined run was not checked");
    }
    let cpu = last.to_string();
    let (status, out, err) = in_chroot(&dir, &["taskset", "-c", &cpu], &["info", "/stories260K", "--json", "--cpus", "N"]);
    assert_eq!(status, 0, "taskset -c {cpu}: {err}");
    assert_eq!(uint(&json_of(&out), "threads"), 1);
}
