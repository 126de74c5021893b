//! `waste` as PID 1: the init of a machine that holds nothing else, such as an initramfs whose
//! `/init` is the static binary (`make boot-test`, README "The static binary").
//!
//! The command comes from the kernel command line. Linux passes init, as its arguments, every
//! word after `--` (and any earlier word it does not recognise that has no `=` or `.` in it),
//! with the double quotes around a word removed, so `waste` receives its command line in argv
//! as a shell would give it: `console=ttyS0 -- run /stories260K "Once upon a time" -n 64`.
//! No `/proc` is needed to read it. A word `;` on its own separates commands, which run one
//! after another, each whatever the status of the one before. (`--` cannot separate them: the
//! kernel stops collecting init's arguments at a second `--`.) The kernel passes at most 31
//! words (`CONFIG_INIT_ENV_ARG_LIMIT`).
//!
//! Nothing is mounted: waste needs no `/proc`, `/sys` or `/dev`. Physical RAM comes from
//! `sysinfo(2)`, the CPU count from `sched_getaffinity`, and standard input, output and error
//! are already the console, which the kernel opens for init from the `/dev/console` node of its
//! own built-in initramfs. (Without that node the kernel logs "unable to open an initial
//! console" and the Rust runtime aborts before `main`, since it cannot open `/dev/null` in
//! place of the missing descriptors either.)
//!
//! PID 1 must not exit — the kernel panics when it does — so at the end the machine is powered
//! off with `reboot(2)`. Where the kernel refuses (a container's PID 1 without
//! `CAP_SYS_BOOT`) the process exits instead, with the first non-zero status of its commands.
//! A command that panics is reported as status 101 and the next one runs.

use super::out::errln;
use std::ffi::OsString;

/// The word that separates commands.
pub const SEPARATOR: &str = ";";

/// True when this process is PID 1: the system's init, or a container's first process.
pub fn is_init() -> bool {
    std::process::id() == 1
}

/// Runs the commands in `args` (separated by [`SEPARATOR`]), then powers off.
pub fn main(args: Vec<OsString>) -> ! {
    errln!("waste init: pid 1, {} CPUs, {} bytes of RAM (sysinfo)", waste::host::available_cpus(), waste::host::physical_ram_bytes());
    let commands = split(args);
    let mut first_failure = 0;
    for (i, cmd) in commands.iter().enumerate() {
        let tag = format!("[{}/{}]", i + 1, commands.len());
        errln!("waste init: {tag} waste {}", shown(cmd));
        // The CLI reports errors as statuses; a panic is caught so that the next command still
        // runs and PID 1 never unwinds out of `main`.
        let status = std::panic::catch_unwind(|| super::main(cmd.clone())).unwrap_or(101);
        errln!("waste init: {tag} exit status {status}");
        if first_failure == 0 {
            first_failure = status;
        }
    }
    errln!("waste init: powering off");
    let refused = waste::host::power_off();
    errln!("waste init: cannot power off ({refused}); exiting with status {first_failure}");
    std::process::exit(first_failure)
}

/// The commands of `args`: the runs between separators, empty ones dropped (`waste` alone
/// still runs once, to print its usage).
pub fn split(args: Vec<OsString>) -> Vec<Vec<OsString>> {
    let mut out: Vec<Vec<OsString>> = vec![Vec::new()];
    for a in args {
        if a == SEPARATOR {
            out.push(Vec::new());
        } else if let Some(last) = out.last_mut() {
            last.push(a);
        }
    }
    let kept: Vec<Vec<OsString>> = out.into_iter().filter(|c| !c.is_empty()).collect();
    if kept.is_empty() { vec![Vec::new()] } else { kept }
}

/// A command as it would be typed: words with spaces or nothing in them in double quotes.
fn shown(cmd: &[OsString]) -> String {
    let words: Vec<String> = cmd.iter().map(|a| {
        let w = a.to_string_lossy();
        if w.is_empty() || w.contains(char::is_whitespace) { format!("\"{w}\"") } else { w.into_owned() }
    }).collect();
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<OsString> {
        s.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn commands_split_at_separator_words() {
        let got = split(words("run m x ; plan m ; ; info m ;"));
        assert_eq!(got, vec![words("run m x"), words("plan m"), words("info m")]);
        // Only a word that is exactly `;` separates.
        assert_eq!(split(words("run m a;b")), vec![words("run m a;b")]);
        assert_eq!(split(Vec::new()), vec![Vec::<OsString>::new()]);
        assert_eq!(split(words(";")), vec![Vec::<OsString>::new()]);
    }

    #[test]
    fn commands_are_shown_as_typed() {
        let cmd = vec![OsString::from("run"), OsString::from("/m"), OsString::from("Once upon a time"), OsString::from("")];
        assert_eq!(shown(&cmd), "run /m \"Once upon a time\" \"\"");
    }
}
