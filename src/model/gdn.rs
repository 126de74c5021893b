//! Gated DeltaNet (Qwen3-Next's linear-attention layers, transformers 5.24.0
//! `Qwen3NextGatedDeltaNet` with its torch fallbacks), token by token:
//!
//! 1. `in_proj_qkvz` and `in_proj_ba`, whose outputs are laid out per key-head group: for each
//!    of the `k_heads` groups, [q (D_k) | k (D_k) | v (r·D_v) | z (r·D_v)] and [b (r) | a (r)],
//!    r = v_heads / k_heads. They are regrouped into q, k, v side by side (the convolution's
//!    channels), z, b and a per value head.
//! 2. A causal depthwise convolution over q|k|v and SiLU — KDA's ([`super::kda`]), with one
//!    fused kernel where Kimi has three.
//! 3. q and k L2-normalised per head (ε = 1e-6 inside the root), q scaled by D_k^-0.5 — KDA's.
//! 4. g = −exp(A_log)·softplus(a + dt_bias) — KDA's formula, but one scalar per value head (KDA
//!    has one per channel); β = σ(b).
//! 5. The delta-rule recurrence ([`crate::kernels::gdn`]).
//! 6. A per-value-head RMSNorm with weight w (not 1 + w) times SiLU(z) (KDA: sigmoid of its
//!    own gate), then `out_proj`.
//!
//! The state (one D_k × D_v matrix per value head and the convolution's last K − 1 inputs) lives
//! in the session cache's KDA buffers, one slot per linear layer, is cleared when a session
//! starts at position 0 and carries from chunk to chunk, so chunked prefill and token-at-a-time
//! decoding run the same operations on the same values.

use super::kda::{conv_silu, forget_gate, l2norm_heads};
use super::latent::LatentState;
use super::state::State;
use super::weights::{Loader, Matrix};
use crate::error::Result;
use crate::format::config::{GdnConfig, ModelConfig};
use crate::kernels::kda::{delta_rule, Decay, DeltaShape};
use crate::kernels::{self, Kernels, Pool};

/// One Gated DeltaNet layer's weights.
pub struct GdnWeights {
    /// in_proj_qkvz [2·k_heads·D_k + 2·v_heads·D_v, hidden].
    pub qkvz: Matrix,
    /// in_proj_ba [2·v_heads, hidden].
    pub ba: Matrix,
    /// conv1d.weight [C, 1, K] flattened: w[c·K + K−1] multiplies the current token.
    pub conv: Vec<f32>,
    /// A_log [v_heads].
    pub a_log: Vec<f32>,
    /// dt_bias [v_heads].
    pub dt_bias: Vec<f32>,
    /// The gated norm's weight [D_v] (used as it is stored: this norm is not zero-centred).
    pub norm: Vec<f32>,
    /// out_proj [hidden, v_heads·D_v].
    pub out: Matrix,
}

/// Loads layer prefix `p`'s Gated DeltaNet weights (`{p}.linear_attn.*`).
pub fn load(ld: &mut Loader, cfg: &ModelConfig, g: &GdnConfig, p: &str) -> Result<GdnWeights> {
    let a = format!("{p}.linear_attn");
    let (h, c, kk) = (cfg.hidden, g.conv_width() as u64, g.conv_kernel as u64);
    let heads = g.v_heads as u64;
    Ok(GdnWeights {
        qkvz: ld.matrix(&format!("{a}.in_proj_qkvz.weight"), 2 * g.key_width() + 2 * g.value_width(), h)?,
        ba: ld.matrix(&format!("{a}.in_proj_ba.weight"), 2 * g.v_heads, h)?,
        conv: ld.flat_vector(&format!("{a}.conv1d.weight"), &[&[c, 1, kk], &[c, kk]])?,
        a_log: ld.flat_vector(&format!("{a}.A_log"), &[&[heads]])?,
        dt_bias: ld.flat_vector(&format!("{a}.dt_bias"), &[&[heads]])?,
        norm: ld.vector(&format!("{a}.norm.weight"), g.v_dim)?,
        out: ld.matrix(&format!("{a}.out_proj.weight"), h, g.value_width())?,
    })
}

/// Regroups one token's projections (step 1): `qkvz` and `ba` in the checkpoint's per-group
/// layout into `qkv` (q | k | v, the convolution's channel order), `z` (per value head), `b`
/// and `a` (per value head).
fn regroup(g: &GdnConfig, qkvz: &[f32], ba: &[f32], qkv: &mut [f32], z: &mut [f32], b: &mut [f32], a: &mut [f32]) {
    let (dk, dv, r) = (g.k_dim, g.v_dim, g.v_heads / g.k_heads);
    let (kw, rv) = (g.key_width(), r * dv);
    let per = 2 * dk + 2 * rv;
    for grp in 0..g.k_heads {
        let src = &qkvz[grp * per..(grp + 1) * per];
        qkv[grp * dk..(grp + 1) * dk].copy_from_slice(&src[..dk]);
        qkv[kw + grp * dk..kw + (grp + 1) * dk].copy_from_slice(&src[dk..2 * dk]);
        qkv[2 * kw + grp * rv..2 * kw + (grp + 1) * rv].copy_from_slice(&src[2 * dk..2 * dk + rv]);
        z[grp * rv..(grp + 1) * rv].copy_from_slice(&src[2 * dk + rv..]);
        b[grp * r..(grp + 1) * r].copy_from_slice(&ba[grp * 2 * r..grp * 2 * r + r]);
        a[grp * r..(grp + 1) * r].copy_from_slice(&ba[grp * 2 * r + r..(grp + 1) * 2 * r]);
    }
}

/// The Gated DeltaNet sublayer for the chunk's `n` tokens: reads `st.h`, writes `st.out`,
/// advances layer `l`'s recurrent and convolution state.
///
/// Scratch: the KDA buffers of [`LatentState`], sized for this geometry by
/// [`super::latent::Sizes`]: `kda_u` the raw qkvz rows, `kda_low` the raw ba rows, `kda_qkv`
/// the regrouped and the convolved q|k|v, `kda_gate` z, `kda_g` a then g, `kda_beta` b then β,
/// `kda_o` the recurrence's output, `kda_pred` its per-thread scratch.
#[allow(clippy::too_many_arguments)]
pub fn gdn_block(cfg: &ModelConfig, g: &GdnConfig, k: &Kernels, pool: &Pool, st: &mut State, w: &GdnWeights, l: usize, n: usize) {
    let State { h, out, latent, cache, chunk, .. } = st;
    let (pos0, chunk) = (cache.pos, *chunk);
    let LatentState { kda_u, kda_qkv, kda_low, kda_g, kda_gate, kda_beta, kda_o, kda_pred, .. } = latent;
    let (c, kk, heads) = (g.conv_width(), g.conv_kernel, g.v_heads);
    let (kw, vw, zw) = (g.key_width(), g.value_width(), 2 * g.key_width() + 2 * g.value_width());
    let slot = cfg.gdn_slot(l);
    let (s_len, c_len) = (heads * g.k_dim * g.v_dim, (kk - 1) * c);
    let state = &mut cache.kda_state[slot * s_len..(slot + 1) * s_len];
    let hist = &mut cache.kda_conv[slot * c_len..(slot + 1) * c_len];
    if pos0 == 0 {
        // A new session: the reference starts from a zero state and zero padding.
        state.fill(0.0);
        hist.fill(0.0);
    }
    // 1. Projections, regrouped per token.
    k.matmul_group(pool, h, n, &mut [(w.qkvz.view(), &mut kda_u[..]), (w.ba.view(), &mut kda_low[..])]);
    let (mixed, conv) = kda_qkv.split_at_mut(chunk * c);
    for t in 0..n {
        regroup(g, &kda_u[t * zw..(t + 1) * zw], &kda_low[t * 2 * heads..(t + 1) * 2 * heads], &mut mixed[t * c..(t + 1) * c],
                &mut kda_gate[t * vw..(t + 1) * vw], &mut kda_beta[t * heads..(t + 1) * heads], &mut kda_g[t * heads..(t + 1) * heads]);
    }
    // 2. Convolution + SiLU over q|k|v; 3. the L2 norms, per head of each stream.
    conv_silu(mixed, hist, &w.conv, n, c, kk, conv);
    let scale = (1.0 / (g.k_dim as f64).sqrt()) as f32;
    // The convolution wrote token rows of c channels; the recurrence wants each stream in its
    // own rows, so they are split into q, k and v in `mixed`, whose inputs are spent.
    let (mq, rest) = mixed.split_at_mut(chunk * kw);
    let (mk, mv) = rest.split_at_mut(chunk * kw);
    for t in 0..n {
        let row = &conv[t * c..(t + 1) * c];
        mq[t * kw..(t + 1) * kw].copy_from_slice(&row[..kw]);
        mk[t * kw..(t + 1) * kw].copy_from_slice(&row[kw..2 * kw]);
        mv[t * vw..(t + 1) * vw].copy_from_slice(&row[2 * kw..]);
    }
    l2norm_heads(&mut mq[..n * kw], g.k_dim, Some(scale));
    l2norm_heads(&mut mk[..n * kw], g.k_dim, None);
    // 4. g from a (per value head: KDA's gate with a "head dim" of 1), β = σ(b).
    forget_gate(&mut kda_g[..n * heads], &w.dt_bias, &w.a_log, 1);
    for b in kda_beta[..n * heads].iter_mut() {
        *b = 1.0 / (1.0 + (-*b).exp());
    }
    // 5. The recurrence.
    let shape = DeltaShape { k_heads: g.k_heads, v_heads: heads, k_dim: g.k_dim, v_dim: g.v_dim };
    delta_rule(pool, shape, mq, mk, mv, Decay::PerHead(kda_g), kda_beta, n, state, kda_o, kda_pred);
    // 6. Per-value-head RMSNorm (rms_norm_eps) × w × SiLU(z), then out_proj.
    let dv = g.v_dim;
    for (oh, zh) in kda_o[..n * vw].chunks_exact_mut(dv).zip(kda_gate[..n * vw].chunks_exact(dv)) {
        let ss = oh.iter().fold(0.0f32, |acc, x| acc + x * x);
        let inv = 1.0 / (ss / dv as f32 + cfg.rms_eps).sqrt();
        for ((x, wn), zv) in oh.iter_mut().zip(&w.norm).zip(zh) {
            *x = (*x * inv * wn) * kernels::silu(*zv);
        }
    }
    k.matmul(pool, w.out.view(), kda_o, n, out);
}
