//! The expert cache: a byte-bounded set of slots holding routed-expert records read from disk,
//! with the I/O that fills them and the memory plan that sizes them.

pub mod plan;
pub mod ram;

use crate::error::{Error, Result};
use crate::model::experts::RecordFn;

/// Streams expert records from a container's banks into bounded slots.
pub struct ExpertCache {
    slots_bytes: u64,
}

impl ExpertCache {
    /// Calls `f` for each wanted expert of `layer` as its record becomes available.
    pub fn with_records(&mut self, layer: usize, _wanted: &[u32], _f: &mut RecordFn) -> Result<()> {
        Err(Error::unsupported(format!("streaming experts of layer {layer} is not implemented yet")))
    }

    /// Bytes of the slots.
    pub fn slot_bytes(&self) -> u64 {
        self.slots_bytes
    }
}
