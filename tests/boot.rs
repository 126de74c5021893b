//! `make boot-test`: the static binary boots as PID 1. An initramfs (a `newc` archive written
//! by `tools/mkcpio.rs`) holds only the binary as `/init`, stories260K and a small streamed MoE
//! container; QEMU boots it with the Debian kernel (TCG, `-cpu max`: KVM and `-cpu host` do not
//! work on the nested VMs this runs on), the commands coming from the kernel command line. It
//! passes when the serial console, kept in `target/boot/serial.log`, shows the golden
//! stories260K text, the container's plan with usable RAM equal to the guest's memory (from
//! `sysinfo(2)`: nothing is mounted), the container's next-token distribution as this machine
//! computes it, and when QEMU exits by itself because init powered the machine off.
//!
//! Ignored by `make test`: `make boot-test` first builds the static binary and `mkcpio`, and
//! gets QEMU and the kernel (`tools/boot-setup.sh`), then runs it.

use crate::common;
use common::freestanding::{golden_story, program, static_binary};
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Guest memory, MiB.
const GUEST_MIB: u64 = 512;
/// Guest CPUs.
const GUEST_CPUS: u64 = 2;
/// Tokens of the story: a second or two under TCG.
const STORY_TOKENS: usize = 64;
/// The longest a boot may take: about 30 s here; TCG on a loaded machine is slow.
const TIMEOUT: Duration = Duration::from_secs(900);

/// The next-token distribution of the container, computed with the scalar kernels on one
/// thread so the guest's figures (whatever its CPU offers) are this machine's to the digit.
const EVAL: &[&str] = &["eval", "/moe.waste", "--ids", "1,2,3", "--top", "3", "--scalar", "--threads", "1"];

/// The kernel command line: the console, a power-off rather than a reboot on panic (with
/// QEMU's `-no-reboot`, a panic ends QEMU too, and the log says which), and after `--` init's
/// commands, separated by `;` words (`src/cli/init.rs`).
fn command_line() -> String {
    let run = format!("run /stories260K \"Once upon a time\" -n {STORY_TOKENS} --temp 0");
    format!("console=ttyS0 quiet panic=-1 -- {run} ; plan /moe.waste ; info /stories260K ; {}", EVAL.join(" "))
}

/// The output of command `i` of `n` in the log: the lines between init's `[i/n] waste ...`
/// and `[i/n] exit status S` lines, and S.
fn section(log: &str, i: usize, n: usize) -> (String, String) {
    let start = format!("waste init: [{i}/{n}] waste ");
    let end = format!("waste init: [{i}/{n}] exit status ");
    let from = log.find(&start).unwrap_or_else(|| panic!("command {i} never started:\n{log}"));
    let from = from + log[from..].find('\n').unwrap() + 1;
    let to = from + log[from..].find(&end).unwrap_or_else(|| panic!("command {i} never ended:\n{log}"));
    let status = log[to + end.len()..].lines().next().unwrap_or("").to_string();
    (log[from..to].to_string(), status)
}

/// The `N bytes` at the end of the line that starts (after spaces) with `label`.
fn bytes_on(text: &str, label: &str) -> u64 {
    let line = text.lines().find(|l| l.trim_start().starts_with(label)).unwrap_or_else(|| panic!("no `{label}` line in:\n{text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.last(), Some(&"bytes"), "{line}");
    words[words.len() - 2].parse().unwrap()
}

#[test]
#[ignore = "run by `make boot-test`, which gets QEMU and the kernel"]
fn the_static_binary_boots_as_pid1_and_powers_off() {
    const NAME: &str = "the_static_binary_boots_as_pid1_and_powers_off";
    let bin = match static_binary() {
        Ok(b) => b,
        Err(why) => return skip(NAME, &why),
    };
    let dir = root().join("target/boot");
    let (kernel, mkcpio) = (dir.join("vmlinuz"), root().join("target/tools/mkcpio"));
    let Some(qemu) = program("qemu-system-x86_64") else { return skip(NAME, "no qemu-system-x86_64 (tools/boot-setup.sh installs it)") };
    for (what, p) in [("kernel", &kernel), ("mkcpio", &mkcpio)] {
        if !p.is_file() {
            return skip(NAME, &format!("no {what} at {} (`make boot-test` provides it)", p.display()));
        }
    }

    // The MoE container: an oracle fixture converted by the static binary itself.
    let moe = dir.join("moe.waste");
    let _ = std::fs::remove_dir_all(&moe);
    let fixture_model = fixture("oracles/qwen3_moe_f32/model");
    let out = Command::new(&bin).args(["convert", "--in", fixture_model.to_str().unwrap(), "--out", moe.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "convert: {}", String::from_utf8_lossy(&out.stderr));
    // What the guest must print for the container: the same command on this machine.
    let host_eval: Vec<String> = EVAL.iter().map(|a| if *a == "/moe.waste" { moe.display().to_string() } else { a.to_string() }).collect();
    let out = Command::new(&bin).args(&host_eval).output().unwrap();
    assert!(out.status.success(), "eval: {}", String::from_utf8_lossy(&out.stderr));
    let want_eval = String::from_utf8(out.stdout).unwrap();

    let initramfs = dir.join("initramfs.cpio");
    let out = Command::new(&mkcpio).arg(&initramfs)
        .arg(format!("init={}", bin.display()))
        .arg(format!("stories260K={}", root().join("models/stories260K").display()))
        .arg(format!("moe.waste={}", moe.display()))
        .output().unwrap();
    assert!(out.status.success(), "mkcpio: {}", String::from_utf8_lossy(&out.stderr));
    println!("initramfs: {} bytes; kernel command line: {}", std::fs::metadata(&initramfs).unwrap().len(), command_line());

    let serial = dir.join("serial.log");
    let _ = std::fs::remove_file(&serial);
    let started = Instant::now();
    let mut child = Command::new(&qemu)
        .args(["-accel", "tcg", "-cpu", "max", "-m", &format!("{GUEST_MIB}M"), "-smp", &GUEST_CPUS.to_string()])
        .args(["-nodefaults", "-display", "none", "-no-reboot"])
        .arg("-serial").arg(format!("file:{}", serial.display()))
        .arg("-kernel").arg(&kernel).arg("-initrd").arg(&initramfs)
        .arg("-append").arg(command_line())
        .stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped())
        .spawn().unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let took = started.elapsed();
    let qemu_out = child.wait_with_output().map(|o| String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout)).unwrap_or_default();
    // The console turns "\n" into "\r\n".
    let log = std::fs::read_to_string(&serial).unwrap_or_default().replace("\r\n", "\n");
    println!("boot: {:.1} s; serial log {} ({} bytes)", took.as_secs_f64(), serial.display(), log.len());
    let Some(status) = status else { panic!("QEMU still running after {TIMEOUT:?}: killed. Serial log:\n{log}\nQEMU: {qemu_out}") };
    assert!(status.success(), "QEMU: {status}: {qemu_out}\nSerial log:\n{log}");
    assert!(!log.contains("Kernel panic"), "the kernel panicked:\n{log}");
    assert!(log.contains("reboot: Power down"), "QEMU ended without init powering off:\n{log}");

    // init's banner: the guest's RAM as sysinfo(2) counts it, and its CPUs.
    let banner = log.lines().find(|l| l.starts_with("waste init: pid 1, ")).unwrap_or_else(|| panic!("no init banner:\n{log}"));
    assert!(banner.starts_with(&format!("waste init: pid 1, {GUEST_CPUS} CPUs, ")), "{banner}");
    let guest_ram: u64 = banner.split(", ").nth(2).and_then(|w| w.split(' ').next()).and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no RAM figure in `{banner}`"));
    // What the kernel manages: the machine's memory less what it reserved for itself.
    let machine = GUEST_MIB << 20;
    assert!(guest_ram <= machine && guest_ram > machine / 4 * 3, "guest RAM {guest_ram} of {machine}");

    let n = 4;
    let (story, s) = section(&log, 1, n);
    assert_eq!(s, "0", "run:\n{story}");
    assert!(story.contains(&golden_story(STORY_TOKENS)), "run: not the golden text:\n{story}");
    assert!(story.contains(&format!("[{STORY_TOKENS} tokens, ")), "{story}");

    let (plan, s) = section(&log, 2, n);
    assert_eq!(s, "0", "plan:\n{plan}");
    assert!(plan.contains("(waste container, experts streamed)"), "{plan}");
    assert_eq!(bytes_on(&plan, "usable RAM"), guest_ram, "{plan}");
    assert_eq!(bytes_on(&plan, "physical RAM"), guest_ram, "{plan}");
    assert!(plan.contains("(physical RAM from sysinfo(2))"), "{plan}");
    assert!(plan.contains(&format!("{GUEST_CPUS} threads")), "{plan}");

    let (info, s) = section(&log, 3, n);
    assert_eq!(s, "0", "info:\n{info}");
    let kernels = info.lines().find(|l| l.starts_with("kernels ")).unwrap_or_else(|| panic!("{info}"));
    assert!(kernels.ends_with(&format!(" x {GUEST_CPUS} threads")), "{kernels}");
    println!("guest: {} bytes of RAM, {}", guest_ram, kernels.split_whitespace().collect::<Vec<_>>().join(" "));

    let (eval, s) = section(&log, 4, n);
    assert_eq!(s, "0", "eval:\n{eval}");
    assert!(eval.contains(&want_eval), "eval in the guest:\n{eval}\non this machine:\n{want_eval}");
    assert!(Path::new(&serial).is_file());
}
