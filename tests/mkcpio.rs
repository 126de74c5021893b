//! `tools/mkcpio.rs`, the writer of the initramfs `make boot-test` boots: built with rustc
//! alone (as the README's recipe does), its archive read back here by an independent reader of
//! the `newc` format — header fields, the 4-byte alignment of names and data, the directories
//! above each name before it, the trailer — and its refusals. SKIP when rustc cannot be run.

use crate::common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One entry: name, mode, link count, data.
#[derive(Debug, PartialEq)]
struct Entry {
    name: String,
    mode: u32,
    nlink: u32,
    data: Vec<u8>,
}

/// Reads a `newc` archive, checking the framing as the kernel's unpacker relies on it.
fn read_newc(bytes: &[u8]) -> Vec<Entry> {
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        assert_eq!(at % 4, 0, "header at {at} is 4-byte aligned");
        let h = &bytes[at..at + 110];
        assert_eq!(&h[..6], b"070701", "magic at {at}");
        let field = |i: usize| u32::from_str_radix(std::str::from_utf8(&h[6 + 8 * i..14 + 8 * i]).unwrap(), 16).unwrap();
        let (mode, uid, gid, nlink, mtime, size, name_size, check) = (field(1), field(2), field(3), field(4), field(5), field(6), field(11), field(12));
        assert_eq!((uid, gid, mtime, check), (0, 0, 0, 0));
        let name_end = at + 110 + name_size as usize;
        assert_eq!(bytes[name_end - 1], 0, "the name ends with NUL");
        let name = String::from_utf8(bytes[at + 110..name_end - 1].to_vec()).unwrap();
        let data_at = name_end.next_multiple_of(4);
        assert!(bytes[name_end..data_at].iter().all(|&b| b == 0), "name padding is zeros");
        let data_end = data_at + size as usize;
        let next = data_end.next_multiple_of(4);
        assert!(bytes[data_end..next].iter().all(|&b| b == 0), "data padding is zeros");
        let trailer = name == "TRAILER!!!";
        out.push(Entry { name, mode, nlink, data: bytes[data_at..data_end].to_vec() });
        at = next;
        if trailer {
            assert_eq!(at, bytes.len(), "nothing after the trailer");
            return out;
        }
    }
}

/// `tools/mkcpio.rs` built with rustc into a scratch directory, or why not.
fn build_tool(dir: &Path) -> Result<PathBuf, String> {
    let exe = dir.join("mkcpio");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc).args(["--edition", "2021", "-o"]).arg(&exe).arg(root().join("tools/mkcpio.rs"))
        .output().map_err(|e| format!("cannot run {rustc}: {e}"))?;
    // A tool that does not compile is a failure, not a missing prerequisite.
    assert!(out.status.success(), "rustc tools/mkcpio.rs: {}", String::from_utf8_lossy(&out.stderr));
    Ok(exe)
}

#[test]
fn mkcpio_writes_the_newc_format_the_kernel_unpacks() {
    const NAME: &str = "mkcpio_writes_the_newc_format_the_kernel_unpacks";
    let dir = temp_dir("mkcpio");
    let tool = match build_tool(&dir) {
        Ok(t) => t,
        Err(why) => return skip(NAME, &why),
    };
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("tree/sub")).unwrap();
    std::fs::write(src.join("tree/a.txt"), "hello").unwrap();
    std::fs::write(src.join("tree/sub/empty"), "").unwrap();
    std::fs::write(src.join("tool"), b"\x7fELF and more").unwrap();
    std::fs::set_permissions(src.join("tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(src.join("tree/a.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(src.join("tree"), std::fs::Permissions::from_mode(0o750)).unwrap();
    let archive = dir.join("out.cpio");
    let run = |args: &[String]| Command::new(&tool).arg(&archive).args(args).output().unwrap();
    let entry = |name: &str, path: &Path| format!("{name}={}", path.display());

    let out = run(&[entry("init", &src.join("tool")), entry("a/b/tree", &src.join("tree"))]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&archive).unwrap();
    // The first header, field by field: inode 1, a regular file 0755, root, one link, time 0,
    // 13 bytes, no devices, a 5-byte name ("init" and NUL), checksum 0.
    assert_eq!(&bytes[..110], concat!("070701", "00000001", "000081ED", "00000000", "00000000", "00000001", "00000000",
        "0000000D", "00000000", "00000000", "00000000", "00000000", "00000005", "00000000").as_bytes());
    let got: Vec<(String, u32, u32, Vec<u8>)> = read_newc(&bytes).into_iter().map(|e| (e.name, e.mode, e.nlink, e.data)).collect();
    let want: Vec<(String, u32, u32, Vec<u8>)> = vec![
        ("init".into(), 0o100755, 1, b"\x7fELF and more".to_vec()),
        // The directories above a name come first, then the tree in name order.
        ("a".into(), 0o040755, 2, vec![]),
        ("a/b".into(), 0o040755, 2, vec![]),
        ("a/b/tree".into(), 0o040750, 2, vec![]),
        ("a/b/tree/a.txt".into(), 0o100644, 1, b"hello".to_vec()),
        ("a/b/tree/sub".into(), 0o040755, 2, vec![]),
        ("a/b/tree/sub/empty".into(), 0o100644, 1, vec![]),
        ("TRAILER!!!".into(), 0, 1, vec![]),
    ];
    assert_eq!(got, want);
    // The same inputs, the same archive.
    assert!(run(&[entry("init", &src.join("tool")), entry("a/b/tree", &src.join("tree"))]).status.success());
    assert_eq!(std::fs::read(&archive).unwrap(), bytes);

    // Refusals name what is wrong; no arguments is a usage error.
    for (args, says) in [
        (vec![entry("x", &src.join("missing"))], "missing"),
        (vec![entry("../x", &src.join("tool"))], "relative path"),
        (vec!["x".to_string()], "NAME=PATH"),
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(Command::new(&tool).output().unwrap().status.code(), Some(2));
}
