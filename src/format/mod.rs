//! Bytes on disk: JSON, safetensors, model configs, the quantized checkpoint and the
//! container — readers and writers of bytes only; the tools built on the whole engine
//! (convert, quantize, random models) live in [`crate::tools`]. Everything here treats its
//! input as hostile: lengths are bounded before anything is allocated and every offset is
//! checked.

pub mod config;
pub mod container;
pub mod crc32;
pub mod dtype;
pub mod fp8;
pub mod json;
pub(crate) mod mxfp4;
pub mod quant;
pub mod safetensors;
pub mod sha256;
pub mod state;

use crate::error::{Error, Result};
use std::path::Path;

pub use crate::sys::read_bounded;

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
