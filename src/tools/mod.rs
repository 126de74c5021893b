//! Tools built on the whole engine, behind the CLI's subcommands: checkpoint conversion to a
//! container ([`convert`]), quantization ([`quantize`]), random models for tests and
//! benchmarks ([`random`]), the float-versus-quantized comparison ([`compare`]) and the speed
//! measurement ([`bench`](mod@bench)). They sit above [`crate::format`], [`crate::model`] and
//! [`crate::kernels`], which never import them.

pub mod bench;
pub mod compare;
pub mod convert;
pub mod quantize;
pub mod random;

use crate::error::Error;
use std::path::Path;

/// After a failed conversion or quantization into `out`: when this run created the directory,
/// it is removed (unless it holds `keep`, resumable state kept on purpose), and the error says
/// which.
pub(crate) fn clean_up_output(out: &Path, created: bool, keep: Option<&str>, e: Error) -> Error {
    if !created || !out.is_dir() {
        return e;
    }
    if let Some(state) = keep.filter(|k| out.join(k).exists()) {
        return e.note(format!("{} is kept with its {state}: the same command resumes", out.display()));
    }
    match std::fs::remove_dir_all(out) {
        Ok(()) => e.note(format!("removed {}, which this run had created", out.display())),
        Err(r) => e.note(format!("{} was created by this run but could not be removed: {r}", out.display())),
    }
}
