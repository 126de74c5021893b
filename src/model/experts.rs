//! Where routed experts come from: resident records (a Hugging Face directory loaded whole, or
//! a small container), or records streamed from a container's banks through the expert cache.
//! Either way the MoE block sees the same thing: one record per expert, in the container's
//! record layout, handed over as soon as it is available.

use crate::cache::ExpertCache;
use crate::error::{Error, ErrorKind, Result};
use crate::format::config::ModelConfig;
use crate::format::container::{RecordLayout, HEADER_BYTES};
use crate::format::dtype::DType;
use crate::sys::AlignedBuf;

/// All experts of one MoE layer held in RAM, record after record.
pub struct ResidentBank {
    pub layout: RecordLayout,
    pub records: AlignedBuf,
}

/// The routed experts of every MoE layer.
pub enum Experts {
    /// A dense model.
    None,
    /// Per layer (`None` for dense layers), every record in RAM.
    Resident(Vec<Option<ResidentBank>>),
    /// Streamed from disk through a bounded cache.
    Streamed(Box<ExpertCache>),
}

pub use crate::cache::{Record, RecordFn, RECORD_BATCH};

impl Experts {
    /// Calls `f` with the records of `wanted` (ids of `layer`), each once, in batches as they
    /// become available. `lookahead` names later layers' likely experts, nearest layer first,
    /// which a streamed source starts reading behind this layer's (resident sources ignore it).
    pub fn with_records(&mut self, layer: usize, wanted: &[u32], lookahead: &[(usize, &[u32])],
                        f: &mut RecordFn) -> Result<()> {
        match self {
            Experts::None => Err(Error::new(ErrorKind::Tensor, format!("layer {layer} routes to experts, but the model has none"))),
            Experts::Resident(banks) => {
                let bank = banks.get(layer).and_then(Option::as_ref).ok_or_else(|| {
                    Error::new(ErrorKind::Tensor, format!("layer {layer} has no expert bank"))
                })?;
                let rb = bank.layout.record_bytes;
                let mut batch = [Record { expert: 0, bytes: &[] }; RECORD_BATCH];
                for group in wanted.chunks(RECORD_BATCH) {
                    for (r, &e) in batch.iter_mut().zip(group) {
                        *r = Record { expert: e, bytes: &bank.records.as_slice()[e as usize * rb..(e as usize + 1) * rb] };
                    }
                    f(&bank.layout, &batch[..group.len()]);
                }
                Ok(())
            }
            Experts::Streamed(cache) => cache.with_records(layer, wanted, lookahead, f),
        }
    }

    /// Offers every resident record's pages to the kernel, when the cache's slots are
    /// purgeable ([`ExpertCache::offer_all_idle`]).
    pub fn offer_all_idle(&mut self) {
        if let Experts::Streamed(cache) = self {
            cache.offer_all_idle();
        }
    }

    /// True when records stream from disk through the expert cache.
    pub fn is_streamed(&self) -> bool {
        matches!(self, Experts::Streamed(_))
    }

    /// True when records stream through a cache that may still have to read one (see
    /// [`ExpertCache::may_miss`]): the router look-ahead can move reads earlier.
    pub fn may_miss(&self) -> bool {
        matches!(self, Experts::Streamed(c) if c.may_miss())
    }

    /// Slots of the expert cache (0 when nothing streams).
    pub fn cache_slots(&self) -> usize {
        match self {
            Experts::Streamed(c) => c.stats().slots,
            _ => 0,
        }
    }

    /// Bytes of expert records held in RAM (resident banks, or the cache's slots).
    pub fn resident_bytes(&self) -> u64 {
        match self {
            Experts::None => 0,
            Experts::Resident(b) => b.iter().flatten().map(|b| b.records.len() as u64).sum(),
            Experts::Streamed(c) => c.slot_bytes(),
        }
    }
}

/// Builds resident banks from a Hugging Face checkpoint's per-expert tensors
/// (`{block}.experts.{j}.{gate,up,down}`), records in the stored dtype. A counting loader
/// checks every tensor and counts the banks' bytes in `loader.bytes` without allocating them.
pub fn load_resident(loader: &mut super::weights::Loader, cfg: &ModelConfig) -> Result<Experts> {
    let Some(moe) = cfg.moe.as_ref() else { return Ok(Experts::None) };
    loader.fp8_block = cfg.fp8_block();
    let mut banks = Vec::with_capacity(cfg.layers);
    for l in 0..cfg.layers {
        if !cfg.is_moe_layer(l) {
            banks.push(None);
            continue;
        }
        if cfg.gpt_oss.is_some() {
            // Fused (and possibly MXFP4) tensors, not one tensor per expert matrix.
            banks.push(Some(super::gpt_oss::load_bank(loader, cfg, l)?));
            continue;
        }
        let prefix = |j: usize, i: usize| format!("model.layers.{l}.{}.experts.{j}.{}.weight", moe.layout.block, moe.layout.names[i]);
        // FP8 experts (spec §3.9) are kept as they are, in the F8B32 records of the container's
        // `--experts fp8` (same bytes, same products), or decoded to f32 where the widths or the
        // block size do not fit 32-column blocks.
        let dtype = match loader.dtype_of(&prefix(0, 0))? {
            DType::F8E4M3 if loader.fp8_keeps(cfg.hidden, moe.expert_intermediate) => DType::F8B32,
            DType::F8E4M3 => DType::F32,
            d => d,
        };
        let layout = RecordLayout::new(dtype, cfg.hidden, moe.expert_intermediate)?;
        let bank_bytes = layout.record_bytes * moe.experts;
        let mut records = AlignedBuf::zeroed(if loader.is_counting() { 0 } else { bank_bytes }, 64)?;
        let mut scratch = [0u8; 0];
        for j in 0..moe.experts {
            let rec: &mut [u8] = if loader.is_counting() { &mut scratch } else {
                &mut records.as_mut_slice()[j * layout.record_bytes..(j + 1) * layout.record_bytes]
            };
            for (i, m) in layout.matrices.iter().enumerate() {
                let out = rec.get_mut(m.offset..m.offset + m.bytes).unwrap_or(&mut []);
                loader.read_matrix_into(&prefix(j, i), m.rows, m.cols, m.dtype, out)?;
            }
            debug_assert!(HEADER_BYTES <= layout.matrices[0].offset);
            if !loader.is_counting() {
                layout.write_header(rec, l, j);
            }
        }
        loader.bytes += bank_bytes as u64;
        banks.push(Some(ResidentBank { layout, records }));
    }
    Ok(Experts::Resident(banks))
}
