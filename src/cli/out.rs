//! Every byte the CLI writes goes through here, so that no write can panic (as `println!`
//! does when the reader has gone away).
//!
//! Standard output: a write error is a [`Failure`]. A closed pipe (`EPIPE`: `waste ... | head`)
//! is [`Failure::Closed`], which ends the command quietly with exit status 0 — the reader asked
//! for no more, which is not an error of ours; `run` stops generating at that point. Any other
//! write error (a full disk) is a runtime error naming standard output.
//!
//! Standard error: messages and summaries are written on a best-effort basis; if even stderr
//! cannot be written there is nobody left to tell, so its errors are dropped.

use super::commands::Failure;
use std::io::Write;
use std::path::Path;

/// The failure a stdout write error becomes.
pub fn stdout_failure(e: std::io::Error) -> Failure {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Failure::Closed
    } else {
        Failure::Run(waste::Error::io(Path::new("<standard output>"), "write", e))
    }
}

/// Writes to stdout and flushes (output streams as it is produced).
pub fn stdout_bytes(bytes: &[u8]) -> Result<(), Failure> {
    let mut o = std::io::stdout().lock();
    o.write_all(bytes).and_then(|()| o.flush()).map_err(stdout_failure)
}

/// Formats to stdout (see [`outln!`]).
pub fn stdout_fmt(args: std::fmt::Arguments) -> Result<(), Failure> {
    let mut o = std::io::stdout().lock();
    o.write_fmt(args).and_then(|()| o.flush()).map_err(stdout_failure)
}

/// Formats to stderr, ignoring failure (see [`errln!`]).
pub fn stderr_fmt(args: std::fmt::Arguments) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(args).and_then(|()| e.flush());
}

/// `println!` that returns `Err(Failure)` from the enclosing function when stdout fails.
macro_rules! outln {
    () => { $crate::cli::out::stdout_fmt(format_args!("\n"))? };
    ($($t:tt)*) => { $crate::cli::out::stdout_fmt(format_args!("{}\n", format_args!($($t)*)))? };
}

/// `eprintln!` that cannot panic.
macro_rules! errln {
    () => { $crate::cli::out::stderr_fmt(format_args!("\n")) };
    ($($t:tt)*) => { $crate::cli::out::stderr_fmt(format_args!("{}\n", format_args!($($t)*))) };
}

/// `eprint!` that cannot panic.
macro_rules! err {
    ($($t:tt)*) => { $crate::cli::out::stderr_fmt(format_args!($($t)*)) };
}

pub(crate) use {err, errln, outln};
