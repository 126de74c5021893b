//! gpt-oss's feed-forward (transformers 5.24.0 `GptOssMLP`): the biased router, experts with
//! biases and the clamped SwiGLU, and the resident expert banks built from the checkpoint's
//! fused tensors (float or MXFP4, read by [`crate::format::mxfp4`]).
//!
//! The experts' matrices become ordinary records (gate, up, down in `[out, in]` layout), so the
//! expert cache, the container and the kernels serve them like any family's. Their biases are
//! small (`3·I + hidden` floats an expert) and stay in the trunk, beside the router.

use super::experts::ResidentBank;
use super::moe::MoeWeights;
use super::weights::Loader;
use crate::error::{Error, ErrorKind, Result};
use crate::format::config::{GptOssConfig, ModelConfig};
use crate::format::container::{RecordLayout, HEADER_BYTES};
use crate::format::mxfp4::FusedExperts;
use crate::sys::AlignedBuf;

/// The experts' biases of one layer, as the checkpoint stores them.
pub struct ExpertBias {
    /// `gate_up_proj_bias` `[E, 2I]`: gate j at column 2j, up j at 2j + 1.
    gate_up: Vec<f32>,
    /// `down_proj_bias` `[E, hidden]`.
    down: Vec<f32>,
    inter: usize,
    hidden: usize,
}

impl ExpertBias {
    /// Expert `e`'s output bias (`hidden` values).
    pub fn down(&self, e: u32) -> &[f32] {
        let h = self.hidden;
        &self.down[e as usize * h..(e as usize + 1) * h]
    }
}

/// The MoE weights of layer prefix `b` (`model.layers.{l}.mlp`): `router.weight` and
/// `router.bias`, and the experts' biases.
pub fn load_moe(ld: &mut Loader, cfg: &ModelConfig, b: &str) -> Result<MoeWeights> {
    let moe = cfg.moe.as_ref().ok_or_else(|| Error::new(ErrorKind::Config, "gpt-oss without an MoE config"))?;
    let (e, h, i) = (moe.experts, cfg.hidden, moe.expert_intermediate);
    let router = ld.matrix(&format!("{b}.router.weight"), e, h)?;
    let router_bias = ld.vector(&format!("{b}.router.bias"), e)?;
    let gate_up = ld.flat_vector(&format!("{b}.experts.gate_up_proj_bias"), &[&[e as u64, 2 * i as u64]])?;
    let down = ld.flat_vector(&format!("{b}.experts.down_proj_bias"), &[&[e as u64, h as u64]])?;
    Ok(MoeWeights { router, bias: None, shared: None, router_bias: Some(router_bias),
        expert_bias: Some(ExpertBias { gate_up, down, inter: i, hidden: h }) })
}

/// The expert's middle for its `m` tokens, in place in `gate` (m × I): the biases added, then
/// `(clamp(up, ±limit) + 1) · g·σ(α·g)` with `g = min(gate, limit)`, in the reference's order.
pub fn expert_activation(g: &GptOssConfig, bias: &ExpertBias, expert: u32, gate: &mut [f32], up: &[f32]) {
    let i = bias.inter;
    let b = &bias.gate_up[expert as usize * 2 * i..(expert as usize + 1) * 2 * i];
    let (alpha, limit) = (g.swiglu_alpha, g.swiglu_limit);
    for (grow, urow) in gate.chunks_exact_mut(i).zip(up.chunks_exact(i)) {
        for (j, (x, &u)) in grow.iter_mut().zip(urow).enumerate() {
            let gv = (*x + b[2 * j]).min(limit);
            let uv = (u + b[2 * j + 1]).clamp(-limit, limit);
            let glu = gv * (1.0 / (1.0 + (-(gv * alpha)).exp()));
            *x = (uv + 1.0) * glu;
        }
    }
}

/// Layer `l`'s experts as resident records from the fused tensors, in the narrowest dtype that
/// holds them exactly (the source's float dtype; BF16 for MXFP4). A counting loader checks the
/// tensors and counts the bank without reading.
pub fn load_bank(ld: &mut Loader, cfg: &ModelConfig, l: usize) -> Result<ResidentBank> {
    let moe = cfg.moe.as_ref().ok_or_else(|| Error::new(ErrorKind::Config, "gpt-oss without an MoE config"))?;
    let (h, i) = (cfg.hidden, moe.expert_intermediate);
    let fused = FusedExperts::open(ld.checkpoint(), &format!("model.layers.{l}.mlp.experts"), moe.experts, h, i)?;
    let layout = RecordLayout::new(fused.exact_dtype(), h, i)?;
    let bank_bytes = layout.record_bytes * moe.experts;
    let counting = ld.is_counting();
    let mut records = AlignedBuf::zeroed(if counting { 0 } else { bank_bytes }, 64)?;
    if !counting {
        let [g, u, d] = layout.matrices;
        for j in 0..moe.experts {
            let rec = &mut records.as_mut_slice()[j * layout.record_bytes..(j + 1) * layout.record_bytes];
            let (head, rest) = rec.split_at_mut(u.offset);
            let (up, down) = rest.split_at_mut(d.offset - u.offset);
            fused.read_exact_into(j, &mut head[g.offset..g.offset + g.bytes], &mut up[..u.bytes], &mut down[..d.bytes])?;
            debug_assert!(HEADER_BYTES <= g.offset);
            layout.write_header(rec, l, j);
        }
    }
    ld.params += (moe.experts * 3 * h * i) as u64;
    ld.note_dtype(fused.stored_dtype());
    ld.bytes += bank_bytes as u64;
    Ok(ResidentBank { layout, records })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clamp bounds gate from above only and up on both sides; `up + 1` multiplies.
    #[test]
    fn the_clamped_swiglu_follows_the_reference() {
        let g = GptOssConfig { swiglu_alpha: 1.702, swiglu_limit: 7.0, rope_attention_factor: 1.0 };
        let bias = ExpertBias { gate_up: vec![0.0, 0.0, 0.5, -0.5], down: vec![0.0; 2], inter: 2, hidden: 1 };
        let mut gate = [9.0f32, -3.0];
        expert_activation(&g, &bias, 0, &mut gate, &[-9.0, 2.0]);
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert_eq!(gate[0], (-7.0 + 1.0) * (7.0 * sig(7.0 * 1.702)));
        let gv = -3.0f32 + 0.5;
        assert_eq!(gate[1], (2.0 - 0.5 + 1.0) * (gv * sig(gv * 1.702)));
    }
}
