//! The one error type of the library: a kind a host can match on, and a message that names
//! what was wrong (the file, the tensor, the field, the byte offset, the layer and expert).
//!
//! Errors are values, never printed and never fatal: the library returns them and the host
//! (the CLI included) decides what to do.

use std::fmt;
use std::path::Path;

/// What class of failure an [`Error`] is. Hosts match on this; the message carries the detail.
/// New kinds may be added, so a `match` needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An operating-system I/O call failed (open, read, write, rename, mmap).
    Io,
    /// Bytes on disk are malformed: JSON, safetensors, a quantized block, a container record.
    Format,
    /// `config.json` is missing a field, has a value of the wrong type, or an inconsistent one.
    Config,
    /// A tensor is missing or has the wrong shape or dtype for the config.
    Tensor,
    /// A tokenizer file is malformed, or a token id is out of range.
    Tokenizer,
    /// Something valid that this engine does not implement (an architecture, a dtype, a platform
    /// call such as CPU binding).
    Unsupported,
    /// A caller-supplied argument is out of range or malformed (options, sampling parameters,
    /// command-line arguments).
    Arg,
    /// The RAM budget is below the model's floor (see `waste plan`).
    RamBudget,
    /// The run hit a limit of the session: the context window is full.
    Context,
    /// A container record failed its integrity check (header, CRC-32).
    Corrupt,
    /// A chat template failed to parse or to render; a template's own `raise_exception(msg)`
    /// has exactly `msg` as its message.
    Template,
}

impl ErrorKind {
    fn label(self) -> &'static str {
        match self {
            ErrorKind::Io => "I/O error",
            ErrorKind::Format => "format error",
            ErrorKind::Config => "config error",
            ErrorKind::Tensor => "tensor error",
            ErrorKind::Tokenizer => "tokenizer error",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Arg => "invalid argument",
            ErrorKind::RamBudget => "RAM budget below the floor",
            ErrorKind::Context => "context full",
            ErrorKind::Corrupt => "corrupt data",
            ErrorKind::Template => "template error",
        }
    }
}

/// A failure, with its [`ErrorKind`] and a message naming what was wrong.
///
/// The message is complete on its own: an I/O error's reason ("No such file or directory") is
/// part of it, so [`std::error::Error::source`] returns `None` rather than the same reason a
/// second time to a host that prints the chain. The operating system's error stays available
/// through [`Error::io_error`] for a host that wants to match on it.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    io: Option<std::io::Error>,
}

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error of `kind` with a message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into(), io: None }
    }

    /// An I/O error on `path` while doing `what` ("open", "read", ...).
    pub fn io(path: &Path, what: &str, err: std::io::Error) -> Error {
        Error {
            kind: ErrorKind::Io,
            message: format!("{}: cannot {what}: {err}", path.display()),
            io: Some(err),
        }
    }

    /// A malformed-bytes error in file `path`.
    pub fn format(path: &Path, message: impl fmt::Display) -> Error {
        Error::new(ErrorKind::Format, format!("{}: {message}", path.display()))
    }

    /// A config error in `path` about `field`.
    pub fn config(path: &Path, field: &str, message: impl fmt::Display) -> Error {
        Error::new(ErrorKind::Config, format!("{}: field `{field}`: {message}", path.display()))
    }

    /// An argument error naming the argument.
    pub fn arg(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Arg, message)
    }

    /// Something this engine does not implement.
    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Unsupported, message)
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The operating-system error behind an [`ErrorKind::Io`] error made by [`Error::io`] (its
    /// text is already in the message).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        self.io.as_ref()
    }

    /// The message alone, without the kind label.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error with `; note` after the message (what was done about it).
    pub(crate) fn note(mut self, note: impl fmt::Display) -> Error {
        self.message = format!("{}; {note}", self.message);
        self
    }

    /// The same error with `prefix: ` put in front of the message (adds context on the way up).
    pub fn context(mut self, prefix: impl fmt::Display) -> Error {
        self.message = format!("{prefix}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.label(), self.message)
    }
}

/// No `source()`: the message already carries the underlying reason (see [`Error`]).
impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_is_told_once() {
        let e = Error::io(Path::new("x.bin"), "open", std::io::Error::from(std::io::ErrorKind::NotFound));
        let shown = e.to_string();
        assert!(shown.starts_with("I/O error: x.bin: cannot open: "), "{shown}");
        assert!(std::error::Error::source(&e).is_none(), "the reason would print twice in a chain");
        assert_eq!(e.io_error().map(|i| i.kind()), Some(std::io::ErrorKind::NotFound));
        assert!(Error::arg("x").io_error().is_none());
    }
}
