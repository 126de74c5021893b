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

/// Reads and parses a JSON file of at most `limit` bytes, naming the file and byte offset in
/// any error.
pub fn read_json(path: &Path, limit: u64) -> Result<json::Json> {
    let bytes = read_bounded(path, limit)?;
    json::parse(&bytes).map_err(|e| Error::format(path, e))
}
