//! Real cgroups for tests that run as root: find this process's memory cgroup, create children
//! under it, and remove them however the test ends.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A cgroup this test creates, with the files that set its limits and admit a process.
#[derive(Clone)]
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


impl TestCgroup {
    /// Creates the child cgroup `name` of this one (no limit of its own), to be removed by
    /// `cleanup`; on v2 the memory controller is first enabled for children.
    pub fn child(&self, name: &str, cleanup: &mut Cleanup) -> Result<TestCgroup, String> {
        if self.procs == "cgroup.procs" {
            let _ = std::fs::write(self.dir.join("cgroup.subtree_control"), "+memory");
        }
        let dir = self.dir.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!(
            "cannot create a cgroup at {}: {e} (needs root and a writable cgroup filesystem)", dir.display()))?;
        cleanup.0.push(dir.clone());
        Ok(TestCgroup { dir, ..*self })
    }

    /// Writes `value` to the cgroup's file `file`.
    pub fn set(&self, file: &str, value: u64) -> Result<(), String> {
        std::fs::write(self.dir.join(file), value.to_string())
            .map_err(|e| format!("cannot set {}/{file}: {e} (memory controller not enabled there?)", self.dir.display()))
    }
}

/// Creates child cgroup `name` under this process's memory cgroup with a hard limit of
/// `limit` bytes, and swap limited to nothing where the kernel accounts it (v1
/// `memory.memsw.limit_in_bytes` = the limit, v2 `memory.swap.max` = 0), or says why not.
pub fn limited_child(name: &str, limit: u64) -> Result<(TestCgroup, Cleanup), String> {
    let own = own_memory_cgroup()?;
    let mut cleanup = Cleanup(Vec::new());
    let cg = own.child(&format!("{name}-{}", std::process::id()), &mut cleanup)?;
    cg.set(cg.limit, limit)?;
    if cg.limit == "memory.limit_in_bytes" {
        let _ = cg.set("memory.memsw.limit_in_bytes", limit);
    } else {
        let _ = cg.set("memory.swap.max", 0);
    }
    Ok((cg, cleanup))
}

/// Why a process in `cg` cannot swap: its memory+swap limit equals its memory limit (v1),
/// its swap limit is 0 (v2), or the machine has no swap at all (`/proc/swaps` lists no
/// device). `Err` when none of these holds.
pub fn swap_is_off(cg: &TestCgroup) -> Result<String, String> {
    let read = |f: &str| std::fs::read_to_string(cg.dir.join(f)).ok().map(|s| s.trim().to_string());
    let limit = read(cg.limit);
    if let (Some(memsw), Some(l)) = (read("memory.memsw.limit_in_bytes"), limit.as_ref()) {
        if &memsw == l {
            return Ok(format!("memory.memsw.limit_in_bytes = memory.limit_in_bytes = {l}: no swap for this cgroup"));
        }
    }
    if read("memory.swap.max").as_deref() == Some("0") {
        return Ok("memory.swap.max = 0: no swap for this cgroup".into());
    }
    let swaps = std::fs::read_to_string("/proc/swaps").map_err(|e| format!("/proc/swaps: {e}"))?;
    let devices = swaps.lines().skip(1).filter(|l| !l.trim().is_empty()).count();
    if devices == 0 {
        return Ok("the kernel does not account swap per cgroup here, but /proc/swaps lists no swap device: nothing can swap".into());
    }
    Err(format!("{devices} swap device(s) in /proc/swaps and no per-cgroup swap limit: the run could swap"))
}

/// A finished child: exit status (or the signal as a negative number), output, and its peak
/// resident set (`ru_maxrss` of `wait4`, the VmHWM it reached).
pub struct Measured {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub peak_rss: u64,
}

/// Runs `cmd` to completion and measures the peak RSS of that one process (`wait4`, so other
/// children of the test process do not count). The child is reaped by that `wait4`, not by
/// `Child::wait`.
#[allow(clippy::zombie_processes)]
pub fn run_measured(mut cmd: std::process::Command) -> Measured {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    let _ = out.read_to_string(&mut stdout);
    let stderr = reader.join().unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `child` is this process's unreaped child; status and ru are valid for writes.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4: {}", std::io::Error::last_os_error());
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -libc::WTERMSIG(status) };
    Measured { code, stdout, stderr, peak_rss: ru.ru_maxrss as u64 * 1024 }
}

/// The command that runs the `waste` binary with `args` as a process that first moves itself
/// into `cg`.
pub fn waste_in_command(cg: &TestCgroup, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new("sh");
    c.args(["-c", r#"echo $$ > "$1" && shift && exec "$@""#, "sh"])
        .arg(cg.dir.join(cg.procs))
        .arg(env!("CARGO_BIN_EXE_waste"))
        .args(args);
    c
}

/// Runs the `waste` binary with `args` as a process that first moves itself into `cg`;
/// returns (exit status or signal as negative, stdout, stderr).
pub fn waste_in(cg: &TestCgroup, args: &[&str]) -> (i32, String, String) {
    let m = run_measured(waste_in_command(cg, args));
    (m.code, m.stdout, m.stderr)
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
