//! Bytes on disk: JSON, safetensors, model configs, the quantized checkpoint (and its tool),
//! and (later) the container. Everything here treats its input as hostile: lengths are bounded before anything
//! is allocated and every offset is checked.

pub mod config;
pub mod container;
pub mod convert;
pub mod crc32;
pub mod dtype;
pub mod json;
pub mod quant;
pub mod quantize;
pub mod random;
pub mod safetensors;
pub mod sha256;
pub mod state;

use crate::error::{Error, Result};
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

/// Reads a whole small file (configs, JSON indexes, tokenizer files), refusing one larger than
/// `limit` bytes before allocating for it.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, "open", e))?;
    let size = f.metadata().map_err(|e| Error::io(path, "stat", e))?.len();
    if size > limit {
        return Err(Error::format(path, format!("file is {size} bytes, over the {limit}-byte limit for this kind of file")));
    }
    let mut buf = Vec::with_capacity(size as usize);
    f.take(limit + 1).read_to_end(&mut buf).map_err(|e| Error::io(path, "read", e))?;
    if buf.len() as u64 > limit {
        return Err(Error::format(path, format!("file grew past the {limit}-byte limit while being read")));
    }
    Ok(buf)
}

/// [`read_bounded`], refusing first (naming the limit) a file larger than `limits` lets a
/// parse hold.
pub(crate) fn read_bounded_within(path: &Path, limit: u64, limits: &json::Limits) -> Result<Vec<u8>> {
    if let Ok(m) = std::fs::metadata(path) {
        limits.check_input(m.len()).map_err(|e| Error::format(path, e.message))?;
    }
    read_bounded(path, limit.min(limits.max_bytes))
}

/// Reads and parses a JSON file of at most `limit` bytes, naming the file and byte offset in
/// any error.
pub fn read_json(path: &Path, limit: u64) -> Result<json::Json> {
    read_json_within(path, limit, &json::Limits::default())
}

/// [`read_json`] with the file and its parsed tree held within `limits`: a file that could not
/// fit is refused before it is read.
pub(crate) fn read_json_within(path: &Path, limit: u64, limits: &json::Limits) -> Result<json::Json> {
    let bytes = read_bounded_within(path, limit, limits)?;
    json::parse_limited(&bytes, limits).map_err(|e| Error::format(path, e))
}
