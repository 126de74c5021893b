//! Real cgroups for tests that run as root: find this process's memory cgroup, create children
//! under it, and remove them however the test ends.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A cgroup this test creates, with the files that set its limits and admit a process.
pub struct TestCgroup {
    pub dir: PathBuf,
    /// memory.limit_in_bytes (v1) or memory.max (v2).
    pub limit: &'static str,
    /// memory.soft_limit_in_bytes (v1) or memory.high (v2).
    pub soft: &'static str,
    /// tasks (v1) or cgroup.procs (v2).
    pub procs: &'static str,
}

/// Removes the cgroups it holds, innermost first, however the test ends. A cgroup can be
/// removed once its processes have exited; `waste plan` has by the time this runs.
pub struct Cleanup(pub Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for d in self.0.iter().rev() {
            for _ in 0..100 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if d.exists() {
                eprintln!("warning: could not remove the test cgroup {}", d.display());
            }
        }
    }
}

/// This process's cgroup directory in the v1 memory hierarchy, else in the v2 one — read
/// directly from /proc, independently of the library's reader.
pub fn own_memory_cgroup() -> Result<TestCgroup, String> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let mount_of = |fstype: &str, need_memory: bool| mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        let ok = post.first() == Some(&fstype) && (!need_memory || post.get(2)?.split(',').any(|o| o == "memory"));
        ok.then(|| (pre.get(3).unwrap_or(&"/").to_string(), PathBuf::from(pre.get(4).unwrap_or(&""))))
    });
    let under = |root: &str, mount: PathBuf, path: &str| -> Result<PathBuf, String> {
        let rel = Path::new(path).strip_prefix(root).map_err(|_| format!("cgroup {path} is outside the mount root {root}"))?;
        Ok(mount.join(rel))
    };
    let v1 = cgroups.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (_, ctl, path) = (p.next()?, p.next()?, p.next()?);
        ctl.split(',').any(|c| c == "memory").then(|| path.to_string())
    });
    if let (Some(path), Some((root, mount))) = (v1, mount_of("cgroup", true)) {
        return Ok(TestCgroup { dir: under(&root, mount, &path)?, limit: "memory.limit_in_bytes",
            soft: "memory.soft_limit_in_bytes", procs: "tasks" });
    }
    let v2 = cgroups.lines().find_map(|l| l.strip_prefix("0::").map(str::to_string));
    if let (Some(path), Some((root, mount))) = (v2, mount_of("cgroup2", false)) {
        return Ok(TestCgroup { dir: under(&root, mount, &path)?, limit: "memory.max", soft: "memory.high", procs: "cgroup.procs" });
    }
    Err("no cgroup v1 memory hierarchy and no cgroup v2 hierarchy is mounted".into())
}


/// Creates child cgroup `name` under this process's memory cgroup with a hard limit of
/// `limit` bytes (and, on v1, the same memory+swap limit so nothing can swap), or says why not.
pub fn limited_child(name: &str, limit: u64) -> Result<(TestCgroup, Cleanup), String> {
    let own = own_memory_cgroup()?;
    let dir = own.dir.join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create a cgroup at {}: {e} (needs root and a writable cgroup filesystem)", dir.display()))?;
    let cleanup = Cleanup(vec![dir.clone()]);
    std::fs::write(dir.join(own.limit), limit.to_string()).map_err(|e| format!("cannot set {}: {e}", own.limit))?;
    if own.limit == "memory.limit_in_bytes" {
        // Swap off for this cgroup where the kernel accounts it (memsw); the machine has none.
        let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
    } else {
        let _ = std::fs::write(dir.join("memory.swap.max"), "0");
    }
    Ok((TestCgroup { dir, ..own }, cleanup))
}

/// Runs the `waste` binary with `args` as a process that first moves itself into `cg`;
/// returns (exit status or signal as negative, stdout, stderr).
pub fn waste_in(cg: &TestCgroup, args: &[&str]) -> (i32, String, String) {
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new("sh")
        .args(["-c", r#"echo $$ > "$1" && shift && exec "$@""#, "sh"])
        .arg(cg.dir.join(cg.procs))
        .arg(env!("CARGO_BIN_EXE_waste"))
        .args(args)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or_else(|| -out.status.signal().unwrap_or(0));
    (code, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Peak memory the cgroup saw (v1 max_usage_in_bytes, v2 memory.peak), when the kernel has it.
pub fn peak_usage(cg: &TestCgroup) -> Option<u64> {
    ["memory.max_usage_in_bytes", "memory.peak"].iter()
        .find_map(|f| std::fs::read_to_string(cg.dir.join(f)).ok())
        .and_then(|s| s.trim().parse().ok())
}

/// Whether the kernel killed anything in the cgroup for memory (v1 memory.oom_control).
pub fn oom_kills(cg: &TestCgroup) -> Option<u64> {
    let s = std::fs::read_to_string(cg.dir.join("memory.oom_control")).ok()
        .or_else(|| std::fs::read_to_string(cg.dir.join("memory.events")).ok())?;
    s.lines().find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse().ok()))
}
