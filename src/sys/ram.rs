//! How much RAM this process may use: physical RAM, or the Linux cgroup memory limit when it
//! is smaller. This is "the machine" the default RAM budget is sized against (seed 001 §3).
//!
//! Physical RAM is `MemTotal` of `/proc/meminfo`, which a container runtime may present as the
//! container's own (LXCFS does), and where that file does not exist — a chroot or an initramfs
//! without `/proc` — the kernel's count from `sysinfo(2)`, a system call that needs no
//! filesystem. [`RamReading::physical_source`] says which, and a note says why.
//!
//! Only capacity counts. `MemAvailable` and `memory.current` measure pressure, which moves
//! between the reading and the allocation; a budget resolved once at open must not depend on
//! it, or the same command on the same machine becomes two different runs.
//!
//! The rules, per cgroup version (docs/MEMORY.md says the same in prose):
//! - **v2** — the `0::PATH` line of `/proc/self/cgroup`, under the `cgroup2` mount: the
//!   smallest finite `memory.max` or `memory.high` from that cgroup up to the mount. Limits
//!   are hierarchical, so a leaf saying `max` does not cancel a finite parent.
//! - **v1** — the `N:...memory...:PATH` line, under the `cgroup` mount whose super options
//!   name `memory`: the smallest `memory.limit_in_bytes` or `memory.soft_limit_in_bytes` along
//!   the same walk. v1 spells "no limit" as a huge number (9223372036854771712); any value at or
//!   above physical RAM is no limit. `memory.use_hierarchy` is not consulted: an ancestor's
//!   limit is always counted, which can only make the reading smaller (safe), never larger.
//! - A mount shows the hierarchy from its own root (`/docker/<id>` in a container without a
//!   cgroup namespace), so the cgroup path is made relative to that root before it is joined
//!   to the mount point; ancestors above the mount root are invisible and not read. When the
//!   cgroup's own directory is not visible, the walk starts at its deepest visible ancestor.
//!
//! Failure policy. Something *absent* is skipped with a note in [`RamReading::notes`]: no
//! `/proc/self/cgroup`, no memory controller, a limit file that does not exist (a v2 root has
//! no `memory.max`), a cgroup outside the mount's view. Something *present but unreadable or
//! malformed* is an error naming the file (and line): the kernel never writes such files, so it
//! means we are not reading what we think we are, and guessing could size a budget the kernel
//! then kills the process for.

use crate::error::{Error, ErrorKind, Result};
use std::io::ErrorKind as IoKind;
use std::path::{Component, Path, PathBuf};

/// Largest `/proc/self/mountinfo` we read (a host with many mounts can reach megabytes).
const MOUNTINFO_LIMIT: u64 = 64 << 20;
/// Largest `/proc/self/cgroup` or cgroup limit file we read.
const SMALL_FILE_LIMIT: u64 = 1 << 20;

/// Which cgroup hierarchy a limit came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The v1 hierarchy (`memory.limit_in_bytes`).
    V1,
    /// The unified v2 hierarchy (`memory.max`).
    V2,
}

/// The cgroup file that limits this process below physical RAM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLimit {
    pub bytes: u64,
    /// The file the limit was read from (`.../memory.max`, `.../memory.limit_in_bytes`, ...).
    pub file: PathBuf,
    pub version: CgroupVersion,
}

/// Where a reading's physical RAM figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RamSource {
    /// `MemTotal` of `meminfo` under the probe's proc root (`/proc/meminfo`).
    Meminfo,
    /// `sysinfo(2)` (`totalram × mem_unit`), where that file does not exist.
    Sysinfo,
    /// The figure the caller gave [`RamProbe::read`].
    Caller,
}

impl RamSource {
    /// How `waste plan` names the source: `/proc/meminfo`, `sysinfo(2)`, `the caller`.
    pub fn describe(self) -> &'static str {
        match self {
            RamSource::Meminfo => "/proc/meminfo",
            RamSource::Sysinfo => "sysinfo(2)",
            RamSource::Caller => "the caller",
        }
    }
}

/// Physical and usable RAM, with where each figure came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RamReading {
    /// Physical RAM of the machine.
    pub physical_bytes: u64,
    /// Where `physical_bytes` came from.
    pub physical_source: RamSource,
    /// min(physical RAM, the smallest cgroup limit).
    pub usable_bytes: u64,
    /// The limit that made usable RAM smaller than physical RAM, if any.
    pub limit: Option<CgroupLimit>,
    /// What was absent and therefore not consulted, and why: parts of the cgroup setup, and
    /// `/proc/meminfo` when physical RAM came from `sysinfo(2)`.
    pub notes: Vec<String>,
}

/// Where to read the cgroup setup and `meminfo` from. [`RamProbe::system`] is the running
/// process; tests point both roots at synthetic trees.
#[derive(Clone, Debug)]
pub struct RamProbe {
    /// The directory holding `meminfo`, `self/cgroup` and `self/mountinfo` (normally `/proc`).
    pub proc_root: PathBuf,
    /// The directory the mount points of `mountinfo` are relative to (normally `/`).
    pub fs_root: PathBuf,
}

/// Physical RAM of the machine in bytes: `MemTotal` of `/proc/meminfo`, else `sysinfo(2)`
/// (see [`RamSource`]). Inside a container this is usually the host's.
pub fn physical_ram_bytes() -> Result<u64> {
    Ok(RamProbe::system().physical()?.0)
}

/// RAM this process may use: min(physical RAM, its cgroup memory limit).
pub fn usable_ram_bytes() -> Result<u64> {
    Ok(read_ram()?.usable_bytes)
}

/// Physical and usable RAM of the running process, with where each figure came from.
pub fn read_ram() -> Result<RamReading> {
    RamProbe::system().read_all()
}

/// One line of `/proc/self/cgroup`: `id:controllers:path`.
#[derive(Debug)]
struct Membership {
    id: u64,
    controllers: String,
    path: String,
}

/// The fields of one `/proc/self/mountinfo` line that matter here.
#[derive(Debug)]
struct Mount {
    /// The path inside the hierarchy that this mount shows as its root.
    root: String,
    mount_point: String,
    fstype: String,
    super_options: String,
}

impl RamProbe {
    /// The running process: `/proc` and `/`.
    pub fn system() -> RamProbe {
        RamProbe { proc_root: PathBuf::from("/proc"), fs_root: PathBuf::from("/") }
    }

    /// A probe over synthetic trees (tests).
    pub fn new(proc_root: impl Into<PathBuf>, fs_root: impl Into<PathBuf>) -> RamProbe {
        RamProbe { proc_root: proc_root.into(), fs_root: fs_root.into() }
    }

    /// Physical RAM (`meminfo` under the proc root, else `sysinfo(2)`) combined with the cgroup
    /// limits: the reading of the machine the probe describes.
    pub fn read_all(&self) -> Result<RamReading> {
        let (physical, source, note) = self.physical()?;
        let mut reading = self.read(physical)?;
        reading.physical_source = source;
        reading.notes.splice(0..0, note);
        Ok(reading)
    }

    /// Physical RAM, where it came from, and a note when `meminfo` was absent. A `meminfo` that
    /// exists without a well-formed `MemTotal` line is an error naming it (the failure policy
    /// above): the kernel always writes one.
    fn physical(&self) -> Result<(u64, RamSource, Option<String>)> {
        let file = self.proc_root.join("meminfo");
        if let Some(text) = read_optional(&file, SMALL_FILE_LIMIT)? {
            return Ok((parse_mem_total(&file, &text)?, RamSource::Meminfo, None));
        }
        match crate::sys::physical_ram_bytes() {
            0 => Err(Error::unsupported(format!(
                "cannot read the physical RAM size: {} does not exist and sysinfo(2) failed", file.display()))),
            n => Ok((n, RamSource::Sysinfo, Some(format!("{} does not exist: physical RAM from sysinfo(2)", file.display())))),
        }
    }

    /// Reads the cgroup limits and combines them with `physical` RAM, a figure the caller
    /// read ([`RamSource::Caller`]).
    pub fn read(&self, physical: u64) -> Result<RamReading> {
        let mut notes = Vec::new();
        let mut best: Option<CgroupLimit> = None;
        for found in self.limits(&mut notes)? {
            if found.bytes < physical && best.as_ref().is_none_or(|b| found.bytes < b.bytes) {
                best = Some(found);
            }
        }
        let usable = best.as_ref().map_or(physical, |b| b.bytes);
        Ok(RamReading { physical_bytes: physical, physical_source: RamSource::Caller, usable_bytes: usable, limit: best, notes })
    }

    /// The smallest limit of each hierarchy that has a memory controller for this process.
    fn limits(&self, notes: &mut Vec<String>) -> Result<Vec<CgroupLimit>> {
        let cgroup_file = self.proc_root.join("self/cgroup");
        let Some(text) = read_optional(&cgroup_file, SMALL_FILE_LIMIT)? else {
            notes.push(format!("{} does not exist: no cgroup limit is seen (none applies, or /proc is not mounted)", cgroup_file.display()));
            return Ok(Vec::new());
        };
        let members = parse_cgroup_file(&cgroup_file, &text)?;
        let v2 = members.iter().find(|m| m.id == 0 && m.controllers.is_empty());
        let v1 = members.iter().find(|m| m.id != 0 && m.controllers.split(',').any(|c| c == "memory"));
        if v1.is_none() && v2.is_none() {
            notes.push(format!("{}: no memory controller and no cgroup v2 membership", cgroup_file.display()));
            return Ok(Vec::new());
        }
        let mountinfo_file = self.proc_root.join("self/mountinfo");
        let Some(text) = read_optional(&mountinfo_file, MOUNTINFO_LIMIT)? else {
            notes.push(format!("{} does not exist: cgroup mounts cannot be found", mountinfo_file.display()));
            return Ok(Vec::new());
        };
        let mounts = parse_mountinfo(&mountinfo_file, &text)?;
        let mut out = Vec::new();
        if let Some(m) = v2 {
            let is_v2 = |mt: &Mount| mt.fstype == "cgroup2";
            out.extend(self.hierarchy(&mounts, is_v2, &m.path, CgroupVersion::V2, notes)?);
        }
        if let Some(m) = v1 {
            let is_memory = |mt: &Mount| mt.fstype == "cgroup" && mt.super_options.split(',').any(|o| o == "memory");
            out.extend(self.hierarchy(&mounts, is_memory, &m.path, CgroupVersion::V1, notes)?);
        }
        Ok(out)
    }

    /// The smallest limit along `path` and its ancestors in the first mount of the hierarchy
    /// that shows `path`; `None` (with a note) when no such mount or no limit file exists.
    fn hierarchy(&self, mounts: &[Mount], wanted: impl Fn(&Mount) -> bool, path: &str,
                 version: CgroupVersion, notes: &mut Vec<String>) -> Result<Option<CgroupLimit>> {
        let name = match version { CgroupVersion::V1 => "cgroup v1 memory", CgroupVersion::V2 => "cgroup v2" };
        let candidates: Vec<&Mount> = mounts.iter().filter(|m| wanted(m)).collect();
        if candidates.is_empty() {
            notes.push(format!("{name}: this process has a cgroup ({path}) but no such hierarchy is mounted"));
            return Ok(None);
        }
        let cg = Path::new(path);
        if !cg.is_absolute() || cg.components().any(|c| matches!(c, Component::ParentDir)) {
            notes.push(format!("{name}: cgroup path `{path}` lies outside this namespace's view"));
            return Ok(None);
        }
        // The first mount whose root contains the cgroup (bind mounts may show sub-trees).
        let Some((mount, rel)) = candidates.iter().find_map(|m| cg.strip_prefix(&m.root).ok().map(|r| (*m, r))) else {
            notes.push(format!("{name}: cgroup `{path}` is not under the root of any mount ({})",
                candidates.iter().map(|m| format!("{} at {}", m.root, m.mount_point)).collect::<Vec<_>>().join(", ")));
            return Ok(None);
        };
        let mount_dir = self.fs_root.join(mount.mount_point.trim_start_matches('/'));
        let leaf = join_rel(&mount_dir, rel);
        // When the cgroup's own directory is not visible (a view that stops above it), its
        // visible ancestors still limit it: the walk starts from the deepest one that exists.
        // Skipping them would over-estimate usable RAM, the error that gets a process killed.
        let Some(start) = rel.ancestors().find(|a| join_rel(&mount_dir, a).is_dir()) else {
            notes.push(format!("{name}: neither the cgroup directory {} nor the mount {} exists", leaf.display(), mount_dir.display()));
            return Ok(None);
        };
        if start != rel {
            notes.push(format!("{name}: the cgroup directory {} does not exist; limits read from {} up",
                leaf.display(), join_rel(&mount_dir, start).display()));
        }
        let files: &[&str] = match version {
            CgroupVersion::V2 => &["memory.max", "memory.high"],
            CgroupVersion::V1 => &["memory.limit_in_bytes", "memory.soft_limit_in_bytes"],
        };
        let mut best: Option<CgroupLimit> = None;
        let mut any_file = false;
        // The deepest existing directory first, then each ancestor up to the mount root (the
        // ancestors end with "").
        for anc in start.ancestors() {
            let dir = join_rel(&mount_dir, anc);
            for f in files {
                let file = dir.join(f);
                let Some(text) = read_optional(&file, SMALL_FILE_LIMIT)? else { continue };
                any_file = true;
                if let Some(bytes) = parse_limit(&file, &text, version)? {
                    if best.as_ref().is_none_or(|b| bytes < b.bytes) {
                        best = Some(CgroupLimit { bytes, file, version });
                    }
                }
            }
        }
        if !any_file {
            notes.push(format!("{name}: no {} from {} up to the mount (memory controller not enabled there)",
                files.join(" or "), leaf.display()));
        }
        Ok(best)
    }
}

/// `base/rel`, without the trailing separator `join("")` would add.
fn join_rel(base: &Path, rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() { base.to_path_buf() } else { base.join(rel) }
}

/// The file's text, or `None` when it does not exist. Other failures are errors.
fn read_optional(path: &Path, limit: u64) -> Result<Option<String>> {
    match std::fs::metadata(path) {
        Err(e) if matches!(e.kind(), IoKind::NotFound | IoKind::NotADirectory) => return Ok(None),
        Err(e) => return Err(Error::io(path, "stat", e)),
        Ok(m) if m.is_dir() => return Err(Error::format(path, "expected a file, found a directory")),
        Ok(_) => {}
    }
    let bytes = crate::sys::read_bounded(path, limit)?;
    String::from_utf8(bytes).map(Some).map_err(|e| Error::format(path, format!(
        "not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to())))
}

/// Parses `/proc/self/cgroup`: one `hierarchy-id:controller-list:path` per line.
fn parse_cgroup_file(path: &Path, text: &str) -> Result<Vec<Membership>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(cg)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(Error::format(path, format!("line {}: expected `id:controllers:path`, found `{}`", i + 1, clip(line))));
        };
        let id = id.parse::<u64>().map_err(|_| Error::format(path, format!(
            "line {}: hierarchy id `{}` is not a number", i + 1, clip(id))))?;
        out.push(Membership { id, controllers: controllers.to_string(), path: cg.to_string() });
    }
    Ok(out)
}

/// Parses `/proc/self/mountinfo` (proc(5)): `id parent maj:min root mount-point options
/// [optional fields...] - fstype source super-options`.
fn parse_mountinfo(path: &Path, text: &str) -> Result<Vec<Mount>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-");
        let Some(sep) = sep.filter(|&s| s >= 6 && fields.len() >= s + 3) else {
            return Err(Error::format(path, format!(
                "line {}: expected `id parent dev root mount-point options ... - fstype source super-options`, found `{}`",
                i + 1, clip(line))));
        };
        let bad_path = |what: &str, p: &str| Error::format(path, format!("line {}: {what} `{}` is not an absolute path", i + 1, clip(p)));
        let (root, mount_point) = (unescape(fields[3]), unescape(fields[4]));
        // A root such as `/../x` (a cgroup namespace entered after the mount) is kept: it simply
        // never contains the process's cgroup path and is skipped with a note.
        if !root.starts_with('/') {
            return Err(bad_path("root", &root));
        }
        if !mount_point.starts_with('/') {
            return Err(bad_path("mount point", &mount_point));
        }
        out.push(Mount {
            root,
            mount_point,
            fstype: fields[sep + 1].to_string(),
            super_options: fields[sep + 3..].join(" "),
        });
    }
    Ok(out)
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` `\`).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = (d[0] - b'0') as u32 * 64 + (d[1] - b'0') as u32 * 8 + (d[2] - b'0') as u32;
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `MemTotal` of a `meminfo` file, in bytes (the file counts in kB, which are KiB).
fn parse_mem_total(path: &Path, text: &str) -> Result<u64> {
    let line = text.lines().find_map(|l| l.strip_prefix("MemTotal:"))
        .ok_or_else(|| Error::format(path, "no MemTotal line"))?;
    let kib = line.trim().strip_suffix(" kB").map(str::trim_end)
        .filter(|v| !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|v| v.parse::<u64>().ok());
    match kib.and_then(|k| k.checked_mul(1024)) {
        Some(0) | None => Err(Error::format(path, format!("MemTotal: expected a non-zero count of kB, found `{}`", clip(line.trim())))),
        Some(bytes) => Ok(bytes),
    }
}

/// A limit file's value: bytes, or `None` for v2's `max`. v1 has no `max` spelling.
fn parse_limit(path: &Path, text: &str, version: CgroupVersion) -> Result<Option<u64>> {
    let v = text.trim();
    if v == "max" && version == CgroupVersion::V2 {
        return Ok(None);
    }
    if !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()) {
        if let Ok(n) = v.parse::<u64>() {
            return Ok(Some(n));
        }
    }
    let expected = match version { CgroupVersion::V2 => "a byte count or `max`", CgroupVersion::V1 => "a byte count" };
    Err(Error::new(ErrorKind::Format, format!("{}: expected {expected}, found `{}`", path.display(), clip(v))))
}

/// At most 80 characters of `s`, for error messages.
fn clip(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    #[test]
    fn mountinfo_fields_and_escapes() {
        let text = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 master:2 - cgroup2 cgroup2 rw\n\
                    35 31 0:32 /docker/a\\040b /sys/fs/cg\\134x rw - cgroup cgroup rw,cpu,memory\n";
        let m = parse_mountinfo(Path::new("mi"), text).must();
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].fstype.as_str(), m[0].mount_point.as_str()), ("cgroup2", "/sys/fs/cgroup/unified"));
        assert_eq!(m[1].root, "/docker/a b");
        assert_eq!(m[1].mount_point, "/sys/fs/cg\\x");
        assert_eq!(m[1].super_options, "rw,cpu,memory");
        let e = parse_mountinfo(Path::new("mi"), "1 2 3 / /x rw cgroup cgroup rw\n").unwrap_err();
        assert!(e.message().contains("line 1"), "{e}");
    }

    #[test]
    fn limit_values() {
        let p = Path::new("f");
        assert_eq!(parse_limit(p, "max\n", CgroupVersion::V2).must(), None);
        assert_eq!(parse_limit(p, "1073741824\n", CgroupVersion::V2).must(), Some(1 << 30));
        assert_eq!(parse_limit(p, "9223372036854771712\n", CgroupVersion::V1).must(), Some(9223372036854771712));
        for bad in ["", "max", "-1", "1G", "1 2", "99999999999999999999999"] {
            assert!(parse_limit(p, bad, CgroupVersion::V1).is_err(), "{bad:?}");
        }
        assert!(parse_limit(p, "0x10", CgroupVersion::V2).is_err());
    }

    #[test]
    fn mem_total() {
        let p = Path::new("meminfo");
        let text = "MemFree:          123 kB\nMemTotal:       16308040 kB\nSwapTotal: 0 kB\n";
        assert_eq!(parse_mem_total(p, text).must(), 16308040 * 1024);
        for bad in ["MemFree: 1 kB\n", "MemTotal: 12\n", "MemTotal: kB\n", "MemTotal: 0 kB\n", "MemTotal: -5 kB\n",
                    "MemTotal: 99999999999999999999 kB\n", "MemTotal: 18014398509481984 kB\n"] {
            let e = parse_mem_total(p, bad).unwrap_err();
            assert!(e.message().contains("meminfo"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn cgroup_lines() {
        let m = parse_cgroup_file(Path::new("c"), "4:memory:/a:b\n0::/\n").must();
        assert_eq!((m[0].id, m[0].controllers.as_str(), m[0].path.as_str()), (4, "memory", "/a:b"));
        assert_eq!((m[1].id, m[1].controllers.as_str(), m[1].path.as_str()), (0, "", "/"));
        assert!(parse_cgroup_file(Path::new("c"), "4:memory\n").unwrap_err().message().contains("line 1"));
        assert!(parse_cgroup_file(Path::new("c"), "0::/\nx::/\n").unwrap_err().message().contains("line 2"));
    }
}
