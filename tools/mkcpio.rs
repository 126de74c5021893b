//! mkcpio: writes a `newc` cpio archive, the format Linux unpacks as an initramfs
//! (Documentation/driver-api/early-userspace/buffer-format.rst). Standard library only, so it
//! builds with rustc alone:
//!
//!     rustc -O --edition 2021 tools/mkcpio.rs -o target/tools/mkcpio
//!     target/tools/mkcpio OUT.cpio init=target/x86_64-unknown-linux-musl/release/waste \
//!         stories260K=models/stories260K
//!
//! Each argument after the output is `NAME=PATH`: the file or directory `PATH` stored as
//! `NAME` (a directory with everything under it, in name order). The directories above a name
//! are added first, because the kernel creates each entry in a directory that must already
//! exist. Regular files and directories only (a symlink, device or other kind is refused);
//! owner root, time 0 and the file's permission bits, so the same inputs give the same archive.
//!
//! An entry is a 110-byte header — `070701` and 13 fields of 8 hexadecimal digits: inode,
//! mode, uid, gid, link count, mtime, file size, device major and minor, rdev major and minor,
//! name size (with its NUL), checksum (0 in `newc`) — then the name and its NUL, padded with
//! zeros to a multiple of 4 bytes, then the data, padded the same way. The archive ends with
//! the entry `TRAILER!!!`.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;

/// The archive being written: the next inode number and the directories already stored.
struct Archive<W: Write> {
    out: W,
    next_ino: u32,
    dirs: BTreeSet<String>,
}

impl<W: Write> Archive<W> {
    /// One header and its padded name.
    fn header(&mut self, name: &str, mode: u32, nlink: u32, size: u32) -> std::io::Result<()> {
        self.next_ino += 1;
        let name_size = name.len() as u32 + 1;
        let fields = [self.next_ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, name_size, 0];
        let mut h = String::from("070701");
        for f in fields {
            h.push_str(&format!("{f:08X}"));
        }
        self.out.write_all(h.as_bytes())?;
        self.out.write_all(name.as_bytes())?;
        self.out.write_all(&[0])?;
        self.pad(110 + name_size as u64)
    }

    /// Zeros up to the next multiple of 4 after `len` bytes.
    fn pad(&mut self, len: u64) -> std::io::Result<()> {
        self.out.write_all(&[0u8; 3][..((4 - len % 4) % 4) as usize])
    }

    /// The directory `name` and its ancestors, each once.
    fn dir(&mut self, name: &str, perm: u32) -> std::io::Result<()> {
        if let Some((parent, _)) = name.rsplit_once('/') {
            self.dir(parent, 0o755)?;
        }
        if self.dirs.insert(name.to_string()) {
            self.header(name, S_IFDIR | perm, 2, 0)?;
        }
        Ok(())
    }

    /// `path` stored as `name`, a directory with its contents.
    fn add(&mut self, name: &str, path: &Path) -> Result<(), String> {
        let err = |what: &str, e: std::io::Error| format!("{}: {what}: {e}", path.display());
        let meta = std::fs::symlink_metadata(path).map_err(|e| err("stat", e))?;
        let perm = meta.permissions().mode() & 0o7777;
        if let Some((parent, _)) = name.rsplit_once('/') {
            self.dir(parent, 0o755).map_err(|e| err("write", e))?;
        }
        if meta.is_dir() {
            self.dir(name, perm).map_err(|e| err("write", e))?;
            let mut entries: Vec<_> = std::fs::read_dir(path).map_err(|e| err("list", e))?
                .map(|e| e.map(|e| e.file_name())).collect::<Result<_, _>>().map_err(|e| err("list", e))?;
            entries.sort();
            for e in entries {
                let child = e.to_str().ok_or_else(|| format!("{}: a name that is not UTF-8: {e:?}", path.display()))?;
                self.add(&format!("{name}/{child}"), &path.join(child))?;
            }
            return Ok(());
        }
        if !meta.is_file() {
            return Err(format!("{}: not a regular file or directory", path.display()));
        }
        let size = u32::try_from(meta.len()).map_err(|_| format!("{}: {} bytes, over the format's 4 GiB - 1", path.display(), meta.len()))?;
        self.header(name, S_IFREG | perm, 1, size).map_err(|e| err("write", e))?;
        let mut f = File::open(path).map_err(|e| err("open", e))?;
        // Exactly `size` bytes: a file that changes size while it is copied would break the
        // archive's framing, so it is an error rather than a short or long entry.
        let copied = std::io::copy(&mut (&mut f).take(size as u64), &mut self.out).map_err(|e| err("copy", e))?;
        if copied != size as u64 || f.read(&mut [0u8; 1]).map_err(|e| err("read", e))? != 0 {
            return Err(format!("{}: changed size while being archived", path.display()));
        }
        self.pad(size as u64).map_err(|e| err("write", e))
    }
}

/// Writes the archive of `entries` (`NAME=PATH`) to `out`.
fn write_archive(out: &Path, entries: &[String]) -> Result<(), String> {
    let file = File::create(out).map_err(|e| format!("{}: create: {e}", out.display()))?;
    let mut a = Archive { out: BufWriter::new(file), next_ino: 0, dirs: BTreeSet::new() };
    for entry in entries {
        let (name, path) = entry.split_once('=').ok_or_else(|| format!("`{entry}`: expected NAME=PATH"))?;
        let name = name.trim_matches('/');
        if name.is_empty() || name.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            return Err(format!("`{entry}`: NAME must be a relative path without empty, `.` or `..` parts"));
        }
        a.add(name, Path::new(path))?;
    }
    let w = |e: std::io::Error| format!("{}: write: {e}", out.display());
    a.header("TRAILER!!!", 0, 1, 0).map_err(w)?;
    a.out.flush().map_err(w)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((out, entries)) = args.split_first().filter(|(_, e)| !e.is_empty()) else {
        eprintln!("usage: mkcpio OUT.cpio NAME=PATH...  (a newc archive: PATH stored as NAME)");
        std::process::exit(2);
    };
    if let Err(e) = write_archive(Path::new(out), entries) {
        eprintln!("mkcpio: {e}");
        std::process::exit(1);
    }
}
