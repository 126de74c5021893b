//! The learned hotlist (seed 001, "Learned hotlist"): how often a workload used each expert,
//! kept in `usage.waste` beside the container, so the next open can read the hottest experts
//! into the cache before the first token asks for them.
//!
//! The file (all integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `WASTEUS\x01` |
//! | 8 | 32 | the model's identity (SHA-256 over its config and tensor index, as a state file's) |
//! | 40 | 4 | MoE layers (the container's banks, in order) |
//! | 44 | 4 | experts per layer |
//! | 48 | 8 | tokens counted |
//! | 56 | 4 × layers × experts | per MoE layer, per expert: the tokens that chose it |
//! | end − 4 | 4 | CRC-32 of every byte before it |
//!
//! A file is only advice: one that is damaged, from another model or of another shape is
//! ignored (the caller says so), never trusted.

use crate::error::{Error, ErrorKind, Result};
use crate::format::crc32::crc32;
use std::path::Path;

/// The usage file's name inside a container directory.
pub const FILE_NAME: &str = "usage.waste";
const MAGIC: &[u8; 8] = b"WASTEUS\x01";
const HEADER: usize = 56;

/// Checks, before a workload is counted, that a usage file can be written at `path`: the
/// temporary file the atomic write will use is created beside it and removed at once (a kill
/// in between leaves what a killed write leaves, which the next write sweeps). A read-only
/// container directory is refused when learning starts, with an error naming the file,
/// instead of after the whole run.
pub fn check_writable(path: &Path) -> Result<()> {
    match crate::format::safetensors::TempFile::create(path) {
        Ok(probe) => {
            drop(probe); // never committed: dropping it removes the temporary file
            Ok(())
        }
        Err(e) => Err(Error::new(ErrorKind::Io, format!("{} (give another usage file: Options::usage_file, --usage-file F)", e.message()))),
    }
}

/// Expert usage counts: per MoE layer (bank order), per expert, the tokens that chose it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    /// MoE layers counted (the container's banks, in order).
    pub layers: usize,
    /// Experts per MoE layer.
    pub experts: usize,
    /// Tokens whose routing was counted.
    pub tokens: u64,
    /// `layers × experts` counts, layer-major: how many counted tokens chose each expert.
    pub counts: Vec<u32>,
}

impl Usage {
    /// No usage yet.
    pub fn new(layers: usize, experts: usize) -> Usage {
        Usage { layers, experts, tokens: 0, counts: vec![0; layers * experts] }
    }

    /// Bytes of a file for this shape.
    pub fn file_bytes(layers: usize, experts: usize) -> u64 {
        (HEADER + 4 * layers * experts + 4) as u64
    }

    /// Adds `other`'s counts (same shape), saturating.
    pub fn merge(&mut self, other: &Usage) {
        if (other.layers, other.experts) != (self.layers, self.experts) {
            return;
        }
        self.tokens = self.tokens.saturating_add(other.tokens);
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.saturating_add(*b);
        }
    }

    /// The experts worth preloading, hottest first: (MoE layer, expert, the share of tokens
    /// that chose it), experts never chosen left out.
    pub fn ranked(&self) -> Vec<(usize, u32, f64)> {
        let tokens = self.tokens.max(1) as f64;
        let mut hot: Vec<(usize, u32, f64)> = self.counts.iter().enumerate().filter(|(_, &c)| c > 0)
            .map(|(k, &c)| (k / self.experts, (k % self.experts) as u32, c as f64 / tokens))
            .collect();
        // Ties keep key order, so the choice is the same on every run.
        hot.sort_by(|a, b| b.2.total_cmp(&a.2));
        hot
    }

    /// The file's bytes, for `identity`.
    pub fn encode(&self, identity: &[u8; 32]) -> Vec<u8> {
        let mut b = Vec::with_capacity(Usage::file_bytes(self.layers, self.experts) as usize);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(identity);
        b.extend_from_slice(&(self.layers as u32).to_le_bytes());
        b.extend_from_slice(&(self.experts as u32).to_le_bytes());
        b.extend_from_slice(&self.tokens.to_le_bytes());
        for c in &self.counts {
            b.extend_from_slice(&c.to_le_bytes());
        }
        let crc = crc32(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads `path`, which must belong to the model of `identity` with `layers` × `experts`
    /// experts: `Ok(None)` when there is no file, an error naming the file and what is wrong
    /// when it is not that model's.
    pub fn read(path: &Path, identity: &[u8; 32], layers: usize, experts: usize) -> Result<Option<Usage>> {
        let want = Usage::file_bytes(layers, experts);
        let size = match std::fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(path, "stat", e)),
        };
        let bad = |what: String| Error::new(ErrorKind::Format, format!("{}: {what}", path.display()));
        if size != want {
            return Err(bad(format!("{size} bytes, a usage file of this model ({layers} MoE layers x {experts} experts) has {want}")));
        }
        let b = crate::format::read_bounded(path, want)?;
        if b.len() as u64 != want {
            return Err(bad(format!("changed while read ({} bytes)", b.len())));
        }
        if &b[..8] != MAGIC {
            return Err(bad("not a usage file (bad magic)".into()));
        }
        let stored = u32::from_le_bytes([b[b.len() - 4], b[b.len() - 3], b[b.len() - 2], b[b.len() - 1]]);
        if crc32(&b[..b.len() - 4]) != stored {
            return Err(bad("CRC-32 mismatch: the file is damaged".into()));
        }
        if &b[8..40] != identity {
            return Err(bad("written for another model (its identity differs)".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        if (u32_at(40) as usize, u32_at(44) as usize) != (layers, experts) {
            return Err(bad(format!("shape {} x {}, the model has {layers} x {experts}", u32_at(40), u32_at(44))));
        }
        let mut tokens = [0u8; 8];
        tokens.copy_from_slice(&b[48..56]);
        let counts = (0..layers * experts).map(|k| u32_at(HEADER + 4 * k)).collect();
        Ok(Some(Usage { layers, experts, tokens: u64::from_le_bytes(tokens), counts }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_file_round_trips_and_ranks_the_hottest_first() -> Result<()> {
        let mut u = Usage::new(2, 3);
        u.tokens = 10;
        u.counts = vec![1, 0, 7, 7, 2, 0];
        let dir = std::env::temp_dir().join(format!("waste-usage-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "create", e))?;
        let path = dir.join(FILE_NAME);
        std::fs::write(&path, u.encode(&[5; 32])).map_err(|e| Error::io(&path, "write", e))?;
        assert_eq!(Usage::read(&path, &[5; 32], 2, 3)?, Some(u.clone()));
        assert_eq!(u.ranked(), vec![(0, 2, 0.7), (1, 0, 0.7), (1, 1, 0.2), (0, 0, 0.1)]);
        let refused = |identity: [u8; 32], layers, experts| Usage::read(&path, &identity, layers, experts).err().map(|e| e.to_string());
        assert!(refused([6; 32], 2, 3).is_some_and(|e| e.contains("another model")));
        assert!(refused([5; 32], 3, 2).is_some_and(|e| e.contains("shape")));
        let mut bytes = u.encode(&[5; 32]);
        bytes[60] ^= 1;
        std::fs::write(&path, &bytes).map_err(|e| Error::io(&path, "write", e))?;
        assert!(refused([5; 32], 2, 3).is_some_and(|e| e.contains("CRC-32")));
        assert_eq!(Usage::read(&dir.join("none"), &[5; 32], 2, 3)?, None);
        std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, "remove", e))
    }
}
