//! Bytes on disk: JSON, safetensors, model configs, the quantized checkpoint and the
//! container — readers and writers of bytes only; the tools built on the whole engine
//! (convert, quantize, random models) live in [`crate::tools`]. Everything here treats its
//! input as hostile: lengths are bounded before anything is allocated and every offset is
//! checked.

pub mod config;
pub mod container;
pub mod crc32;
pub mod dtype;
pub mod json;
pub mod quant;
pub mod safetensors;
pub mod sha256;
pub mod state;

use crate::error::{Error, Result};
use std::path::Path;

pub use crate::sys::read_bounded;

/// Reads and parses a JSON file of at most `limit` bytes, naming the file and byte offset in
/// any error.
pub fn read_json(path: &Path, limit: u64) -> Result<json::Json> {
    let bytes = read_bounded(path, limit)?;
    json::parse(&bytes).map_err(|e| Error::format(path, e))
}
