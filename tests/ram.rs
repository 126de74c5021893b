//! Usable RAM from synthetic cgroup trees (v1 and v2): nested limits, `max` leaves,
//! `memory.high` under `memory.max`, v1's "unlimited", container mounts whose root is the
//! cgroup itself, missing controllers, and malformed files. Physical RAM from `meminfo`, and
//! from `sysinfo(2)` where there is none (a chroot, an initramfs: `tests/static_binary.rs`
//! and `tests/boot.rs` check those for real). The real-cgroup test is in
//! `tests/plan.rs` (it runs `waste plan` inside one).

use crate::common;
use common::*;
use std::path::PathBuf;
use waste::host::{CgroupVersion, RamProbe, RamReading, RamSource};
use waste::ErrorKind;

const GIB: u64 = 1 << 30;
/// The physical RAM the synthetic machine has.
const PHYS: u64 = 16 * GIB;
/// What cgroup v1 reports for "no limit".
const V1_UNLIMITED: &str = "9223372036854771712\n";

/// A fake `/proc` (`proc/self/{cgroup,mountinfo}`) and a fake filesystem (`fs/...`).
struct Tree {
    base: PathBuf,
}

impl Tree {
    fn new(name: &str) -> Tree {
        let base = temp_dir(&format!("ram-{name}"));
        std::fs::create_dir_all(base.join("proc/self")).unwrap();
        std::fs::create_dir_all(base.join("fs")).unwrap();
        Tree { base }
    }

    fn cgroup(&self, text: &str) -> &Tree {
        std::fs::write(self.base.join("proc/self/cgroup"), text).unwrap();
        self
    }

    fn mountinfo(&self, lines: &[String]) -> &Tree {
        std::fs::write(self.base.join("proc/self/mountinfo"), lines.join("\n") + "\n").unwrap();
        self
    }

    /// Writes `fs/<path>`, creating its directories.
    fn file(&self, path: &str, text: &str) -> &Tree {
        let p = self.fs(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
        self
    }

    fn dir(&self, path: &str) -> &Tree {
        std::fs::create_dir_all(self.fs(path)).unwrap();
        self
    }

    fn fs(&self, path: &str) -> PathBuf {
        self.base.join("fs").join(path.trim_start_matches('/'))
    }

    fn read(&self) -> waste::Result<RamReading> {
        RamProbe::new(self.base.join("proc"), self.base.join("fs")).read(PHYS)
    }

    fn usable(&self) -> u64 {
        self.read().unwrap().usable_bytes
    }

    /// Writes `proc/meminfo`.
    fn meminfo(&self, text: &str) -> &Tree {
        std::fs::write(self.base.join("proc/meminfo"), text).unwrap();
        self
    }

    /// Physical RAM from the tree (`proc/meminfo`, else sysinfo) with the cgroup limits.
    fn read_all(&self) -> waste::Result<RamReading> {
        RamProbe::new(self.base.join("proc"), self.base.join("fs")).read_all()
    }
}

/// A mountinfo line for the cgroup2 hierarchy mounted at `at` showing `root`.
fn v2_mount(root: &str, at: &str) -> String {
    format!("30 23 0:26 {root} {at} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate")
}

/// A mountinfo line for a cgroup v1 hierarchy with super options `opts`.
fn v1_mount(root: &str, at: &str, opts: &str) -> String {
    format!("35 31 0:32 {root} {at} rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup {opts}")
}

/// Other mounts a real mountinfo has, which must be ignored.
fn noise() -> Vec<String> {
    vec![
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw".to_string(),
        "31 23 0:27 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755".to_string(),
        v1_mount("/", "/sys/fs/cgroup/cpu,cpuacct", "rw,cpu,cpuacct"),
    ]
}

fn with_noise(lines: &[String]) -> Vec<String> {
    let mut v = noise();
    v.extend_from_slice(lines);
    v
}

#[test]
fn v2_nested_limits_a_max_leaf_does_not_cancel_its_parent() {
    let t = Tree::new("v2-nested");
    t.cgroup("0::/a/b/c\n").mountinfo(&with_noise(&[v2_mount("/", "/sys/fs/cgroup")]))
        .file("/sys/fs/cgroup/a/memory.max", "8589934592\n")
        .file("/sys/fs/cgroup/a/memory.high", "max\n")
        .file("/sys/fs/cgroup/a/b/memory.max", "max\n")
        .file("/sys/fs/cgroup/a/b/c/memory.max", "max\n")
        .file("/sys/fs/cgroup/a/b/c/memory.high", "max\n");
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, 8 * GIB);
    assert_eq!(r.physical_bytes, PHYS);
    let l = r.limit.unwrap();
    assert_eq!(l.file, t.fs("/sys/fs/cgroup/a/memory.max"));
    assert_eq!(l.version, CgroupVersion::V2);
    // A tighter leaf under a looser parent: the smallest anywhere on the path wins.
    t.file("/sys/fs/cgroup/a/b/c/memory.max", "3221225472\n");
    assert_eq!(t.usable(), 3 * GIB);
}

#[test]
fn v2_memory_high_below_memory_max() {
    let t = Tree::new("v2-high");
    t.cgroup("0::/svc\n").mountinfo(&[v2_mount("/", "/sys/fs/cgroup")])
        .file("/sys/fs/cgroup/svc/memory.max", "4294967296\n")
        .file("/sys/fs/cgroup/svc/memory.high", "3221225472\n");
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, 3 * GIB);
    assert_eq!(r.limit.unwrap().file, t.fs("/sys/fs/cgroup/svc/memory.high"));
    // memory.high on an ancestor (here the mount root, which is read too) under the leaf's.
    t.file("/sys/fs/cgroup/memory.high", "2147483648\n");
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, 2 * GIB);
    assert_eq!(r.limit.unwrap().file, t.fs("/sys/fs/cgroup/memory.high"));
}

#[test]
fn v2_root_cgroup_and_limits_above_physical() {
    // The root cgroup has no memory.max at all: physical RAM, with a note.
    let t = Tree::new("v2-root");
    t.cgroup("0::/\n").mountinfo(&[v2_mount("/", "/sys/fs/cgroup")]).dir("/sys/fs/cgroup");
    let r = t.read().unwrap();
    assert_eq!((r.usable_bytes, r.limit.clone()), (PHYS, None));
    assert!(r.notes.iter().any(|n| n.contains("memory.max")), "{:?}", r.notes);
    // A limit larger than the machine is no limit.
    let t = Tree::new("v2-big");
    t.cgroup("0::/x\n").mountinfo(&[v2_mount("/", "/sys/fs/cgroup")])
        .file("/sys/fs/cgroup/x/memory.max", &format!("{}\n", 64 * GIB));
    let r = t.read().unwrap();
    assert_eq!((r.usable_bytes, r.limit), (PHYS, None));
    assert!(r.notes.is_empty(), "{:?}", r.notes);
}

#[test]
fn v2_container_mount_root_is_the_cgroup() {
    // A container without a cgroup namespace sees its own cgroup as the mount root.
    let t = Tree::new("v2-container");
    t.cgroup("0::/system.slice/docker-abc.scope\n")
        .mountinfo(&[v2_mount("/system.slice/docker-abc.scope", "/sys/fs/cgroup")])
        .file("/sys/fs/cgroup/memory.max", "1073741824\n");
    assert_eq!(t.usable(), GIB);
    // ...and a process in a sub-cgroup of it walks up to that root.
    t.cgroup("0::/system.slice/docker-abc.scope/app\n").file("/sys/fs/cgroup/app/memory.max", "max\n");
    assert_eq!(t.usable(), GIB);
}

#[test]
fn v1_nested_limits_soft_limit_and_unlimited() {
    let t = Tree::new("v1-nested");
    let m = "/sys/fs/cgroup/memory";
    t.cgroup("9:name=systemd:/x/y\n4:memory:/x/y\n2:cpu,cpuacct:/x/y\n0::/\n")
        .mountinfo(&with_noise(&[v1_mount("/", m, "rw,memory"), v2_mount("/", "/sys/fs/cgroup/unified")]))
        .dir("/sys/fs/cgroup/unified")
        .file(&format!("{m}/memory.limit_in_bytes"), V1_UNLIMITED)
        .file(&format!("{m}/memory.soft_limit_in_bytes"), V1_UNLIMITED)
        .file(&format!("{m}/x/memory.limit_in_bytes"), "2147483648\n")
        .file(&format!("{m}/x/y/memory.limit_in_bytes"), V1_UNLIMITED)
        .file(&format!("{m}/x/y/memory.soft_limit_in_bytes"), V1_UNLIMITED);
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, 2 * GIB);
    let l = r.limit.unwrap();
    assert_eq!((l.file, l.version), (t.fs(&format!("{m}/x/memory.limit_in_bytes")), CgroupVersion::V1));
    // The hybrid layout's v2 hierarchy has no memory controller: noted, not an error.
    assert!(r.notes.iter().any(|n| n.contains("cgroup v2")), "{:?}", r.notes);
    // A soft limit under the hard one counts.
    t.file(&format!("{m}/x/y/memory.soft_limit_in_bytes"), "1073741824\n");
    assert_eq!(t.usable(), GIB);
    // Unlimited everywhere: physical RAM.
    t.file(&format!("{m}/x/memory.limit_in_bytes"), V1_UNLIMITED)
        .file(&format!("{m}/x/y/memory.soft_limit_in_bytes"), V1_UNLIMITED);
    let r = t.read().unwrap();
    assert_eq!((r.usable_bytes, r.limit), (PHYS, None));
}

#[test]
fn v1_container_and_comounted_controllers() {
    // Docker without a cgroup namespace: mount root /docker/<id>, the same path in /proc.
    let t = Tree::new("v1-docker");
    t.cgroup("11:cpu,memory:/docker/abc\n")
        .mountinfo(&[v1_mount("/docker/abc", "/sys/fs/cgroup/cpu,memory", "rw,cpu,memory")])
        .file("/sys/fs/cgroup/cpu,memory/memory.limit_in_bytes", "536870912\n");
    assert_eq!(t.usable(), 512 << 20);
    // A prefix that is not a path component is not an ancestor: /docker/abcdef is not under
    // /docker/abc.
    t.cgroup("11:cpu,memory:/docker/abcdef\n");
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, PHYS);
    assert!(r.notes.iter().any(|n| n.contains("not under the root")), "{:?}", r.notes);
    // With a cgroup namespace both say "/"; escapes in the mount point are decoded.
    let t = Tree::new("v1-ns");
    t.cgroup("4:memory:/\n").mountinfo(&[v1_mount("/", "/sys/fs/cgroup/mem\\040ory", "rw,memory")])
        .file("/sys/fs/cgroup/mem ory/memory.limit_in_bytes", "1073741824\n");
    assert_eq!(t.usable(), GIB);
}

#[test]
fn v1_and_v2_limits_both_count() {
    let t = Tree::new("both");
    t.cgroup("4:memory:/a\n0::/b\n")
        .mountinfo(&[v1_mount("/", "/cg/memory", "rw,memory"), v2_mount("/", "/cg/unified")])
        .file("/cg/memory/a/memory.limit_in_bytes", "3221225472\n")
        .file("/cg/unified/b/memory.max", "2147483648\n");
    assert_eq!(t.usable(), 2 * GIB);
    t.file("/cg/memory/a/memory.limit_in_bytes", "1073741824\n");
    assert_eq!(t.usable(), GIB);
}

#[test]
fn missing_controller_mount_or_files_fall_back_to_physical() {
    // No /proc/self/cgroup at all.
    let t = Tree::new("no-proc");
    let r = t.read().unwrap();
    assert_eq!((r.usable_bytes, r.limit.clone()), (PHYS, None));
    assert!(r.notes[0].contains("does not exist"), "{:?}", r.notes);
    // v1 only, without a memory controller.
    let t = Tree::new("no-memory");
    t.cgroup("2:cpu,cpuacct:/a\n1:name=systemd:/a\n").mountinfo(&noise());
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, PHYS);
    assert!(r.notes.iter().any(|n| n.contains("no memory controller")), "{:?}", r.notes);
    // A memory controller that is not mounted (a limit file elsewhere must not be read).
    let t = Tree::new("unmounted");
    t.cgroup("4:memory:/a\n").mountinfo(&noise()).file("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", "1\n");
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, PHYS);
    assert!(r.notes.iter().any(|n| n.contains("mounted")), "{:?}", r.notes);
    // No mountinfo.
    let t = Tree::new("no-mountinfo");
    t.cgroup("0::/a\n");
    assert_eq!(t.usable(), PHYS);
    // The cgroup's directory is not in the mount (another namespace's view): its visible
    // ancestors still limit it, from the deepest that exists up — here the mount root.
    let t = Tree::new("no-dir");
    t.cgroup("0::/gone/deeper\n").mountinfo(&[v2_mount("/", "/sys/fs/cgroup")]).file("/sys/fs/cgroup/memory.max", "1\n");
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, 1);
    assert_eq!(r.limit.as_ref().unwrap().file, t.fs("/sys/fs/cgroup/memory.max"));
    assert!(r.notes.iter().any(|n| n.contains("does not exist") && n.contains("up")), "{:?}", r.notes);
    // A partly visible path: the deepest existing ancestor's limit counts, and its parent's.
    let t = Tree::new("part-dir");
    t.cgroup("4:memory:/a/b/c\n").mountinfo(&[v1_mount("/", "/cg", "rw,memory")])
        .file("/cg/a/memory.limit_in_bytes", "3000\n").file("/cg/memory.limit_in_bytes", "5000\n");
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, 3000);
    assert_eq!(r.limit.as_ref().unwrap().file, t.fs("/cg/a/memory.limit_in_bytes"));
    // Nothing of it visible and no limit file at all: physical RAM, with a note.
    let t = Tree::new("no-dir-no-limit");
    t.cgroup("0::/gone\n").mountinfo(&[v2_mount("/", "/sys/fs/cgroup")]);
    std::fs::create_dir_all(t.fs("/sys/fs/cgroup")).unwrap();
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, PHYS);
    assert!(r.notes.iter().any(|n| n.contains("does not exist")), "{:?}", r.notes);
    // A path that climbs out of the namespace is not followed.
    let t = Tree::new("dotdot");
    t.cgroup("0::/../x\n").mountinfo(&[v2_mount("/", "/sys/fs/cgroup")]).file("/sys/fs/cgroup/x/memory.max", "1\n");
    let r = t.read().unwrap();
    assert_eq!(r.usable_bytes, PHYS);
    assert!(r.notes.iter().any(|n| n.contains("outside")), "{:?}", r.notes);
}

#[test]
fn malformed_files_are_errors_naming_the_file() {
    let bad_limit = |version: &str, text: &str| {
        let t = Tree::new(&format!("bad-{version}"));
        let file = if version == "v2" {
            t.cgroup("0::/a\n").mountinfo(&[v2_mount("/", "/cg")]).file("/cg/a/memory.max", "max\n").file("/cg/memory.high", text);
            t.fs("/cg/memory.high")
        } else {
            t.cgroup("4:memory:/a\n").mountinfo(&[v1_mount("/", "/cg", "rw,memory")]).file("/cg/a/memory.soft_limit_in_bytes", text);
            t.fs("/cg/a/memory.soft_limit_in_bytes")
        };
        let e = t.read().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Format, "{e}");
        assert!(e.message().contains(&file.display().to_string()), "{e}");
        e
    };
    for text in ["", "\n", "lots\n", "-1\n", "1.5G\n", "12 34\n", "0x100\n", "184467440737095516160\n"] {
        bad_limit("v2", text);
        bad_limit("v1", text);
    }
    // v1 has no `max` spelling.
    assert!(bad_limit("v1", "max\n").message().contains("`max`"));
    let e = bad_limit("v2", &"9".repeat(500));
    assert!(e.message().len() < 400, "the content is clipped: {e}");

    let t = Tree::new("bad-cgroup");
    t.cgroup("0::/\nmemory:/a\n").mountinfo(&noise());
    let e = t.read().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Format);
    assert!(e.message().contains("proc/self/cgroup") && e.message().contains("line 2"), "{e}");

    let t = Tree::new("bad-mountinfo");
    t.cgroup("0::/\n").mountinfo(&["22 1 8:1 / / rw shared:1 - ext4 /dev/sda1 rw".into(), "41 31 0:38 / /cg rw cgroup2 cgroup2 rw".into()]);
    let e = t.read().unwrap_err();
    assert!(e.message().contains("mountinfo") && e.message().contains("line 2"), "{e}");

    // Invalid UTF-8 in a limit file.
    let t = Tree::new("bad-utf8");
    t.cgroup("0::/a\n").mountinfo(&[v2_mount("/", "/cg")]).dir("/cg/a");
    std::fs::write(t.fs("/cg/a/memory.max"), b"12\xff\n").unwrap();
    assert_eq!(t.read().unwrap_err().kind(), ErrorKind::Format);
}

/// A meminfo as the kernel writes it, with `MemTotal` of `kib`.
fn meminfo(kib: u64) -> String {
    format!("MemTotal:       {kib:>8} kB\nMemFree:         1234567 kB\nMemAvailable:    2345678 kB\nHugePages_Total:       0\n")
}

#[test]
fn physical_ram_from_meminfo_else_sysinfo() {
    // MemTotal (kB, which are KiB), combined with a cgroup limit as before.
    let t = Tree::new("meminfo");
    t.meminfo(&meminfo(16 << 20)).cgroup("0::/a\n").mountinfo(&[v2_mount("/", "/cg")]).file("/cg/a/memory.max", "4294967296\n");
    let r = t.read_all().unwrap();
    assert_eq!((r.physical_bytes, r.physical_source, r.usable_bytes), (16 * GIB, RamSource::Meminfo, 4 * GIB));
    assert!(r.notes.iter().all(|n| !n.contains("meminfo")), "{:?}", r.notes);
    // A limit above a small MemTotal is no limit.
    t.meminfo(&meminfo(2 << 20));
    let r = t.read_all().unwrap();
    assert_eq!((r.physical_bytes, r.usable_bytes, r.limit), (2 * GIB, 2 * GIB, None));

    // No meminfo (no /proc in a chroot): the kernel's count from sysinfo(2), with a note; a
    // cgroup limit that is visible still applies.
    let sysinfo = waste::host::physical_ram_bytes();
    assert!(sysinfo > 0);
    let t = Tree::new("no-meminfo");
    t.cgroup("0::/a\n").mountinfo(&[v2_mount("/", "/cg")]).file("/cg/a/memory.max", &format!("{}\n", sysinfo / 2));
    let r = t.read_all().unwrap();
    assert_eq!((r.physical_bytes, r.physical_source, r.usable_bytes), (sysinfo, RamSource::Sysinfo, sysinfo / 2));
    let note = &r.notes[0];
    assert!(note.contains("proc/meminfo does not exist") && note.contains("sysinfo(2)"), "{:?}", r.notes);
    // Nothing at all: no meminfo, no cgroup file.
    let t = Tree::new("bare");
    let r = t.read_all().unwrap();
    assert_eq!((r.physical_bytes, r.usable_bytes, r.physical_source, r.limit), (sysinfo, sysinfo, RamSource::Sysinfo, None));
    assert_eq!(r.notes.len(), 2, "{:?}", r.notes);
    assert!(r.notes[1].contains("self/cgroup does not exist"), "{:?}", r.notes);
    // The caller's figure says so.
    assert_eq!(t.read().unwrap().physical_source, RamSource::Caller);
}

#[test]
fn malformed_meminfo_is_an_error_naming_it() {
    for (i, text) in ["MemFree: 1 kB\n", "MemTotal: 12\n", "MemTotal: 0 kB\n", "MemTotal: lots kB\n"].iter().enumerate() {
        let t = Tree::new(&format!("bad-meminfo-{i}"));
        t.meminfo(text);
        let e = t.read_all().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Format, "{text:?}");
        assert!(e.message().contains("proc/meminfo"), "{text:?}: {e}");
    }
    // A directory where the file should be.
    let t = Tree::new("meminfo-dir");
    std::fs::create_dir(t.base.join("proc/meminfo")).unwrap();
    assert_eq!(t.read_all().unwrap_err().kind(), ErrorKind::Format);
}

#[test]
fn sysinfo_counts_what_meminfo_shows() {
    // Both are the kernel's count of the pages it manages: MemTotal × 1024 is sysinfo's
    // totalram × mem_unit, so the fallback gives the figure /proc would have.
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return skip("sysinfo_counts_what_meminfo_shows", "no /proc/meminfo");
    };
    let kib: u64 = text.lines().find_map(|l| l.strip_prefix("MemTotal:")).and_then(|v| v.trim().strip_suffix(" kB"))
        .and_then(|v| v.trim().parse().ok()).unwrap();
    assert_eq!(waste::host::physical_ram_bytes(), kib * 1024);
    let r = waste::host::read_ram().unwrap();
    assert_eq!((r.physical_bytes, r.physical_source), (kib * 1024, RamSource::Meminfo));
}

#[test]
fn this_machine_reads_without_error() {
    let r = waste::host::read_ram().unwrap();
    assert!(r.physical_bytes > 0);
    assert!(r.usable_bytes > 0 && r.usable_bytes <= r.physical_bytes);
    assert_eq!(waste::usable_ram().unwrap(), r.usable_bytes);
    assert_eq!(waste::physical_ram().unwrap(), r.physical_bytes);
    match &r.limit {
        Some(l) => assert_eq!(l.bytes, r.usable_bytes),
        None => assert_eq!(r.usable_bytes, r.physical_bytes),
    }
}
