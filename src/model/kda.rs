//! Kimi Delta Attention (spec §4.3), the linear-attention layers of Kimi-Linear, in recurrent
//! form token by token: q/k/v projections through a short causal depthwise convolution and
//! SiLU, L2-normalised q and k, a per-channel forget gate and a per-head write strength, the
//! delta-rule recurrence ([`crate::kernels::kda`]), then a per-head RMSNorm gated by a sigmoid
//! and o_proj. No positional encoding: order comes from the convolution and the recurrence.
//!
//! The state (recurrent S and the convolution's last K − 1 inputs) carries from chunk to chunk
//! and is cleared when a session starts at position 0, so chunked prefill and token-at-a-time
//! decoding run the same operations on the same values.

use super::latent::LatentState;
use super::state::State;
use super::weights::{Loader, Matrix};
use crate::error::Result;
use crate::format::config::{KdaConfig, ModelConfig};
use crate::kernels::kda::{recurrence, KdaShape};
use crate::kernels::{self, Kernels, Pool};

/// One KDA layer's weights (spec §4.2).
pub struct KdaWeights {
    /// q_proj, k_proj, v_proj [H·D, hidden].
    pub qkv: [Matrix; 3],
    /// q/k/v depthwise kernels, each [H·D × K] (w[c·K + K−1] multiplies the current token).
    pub conv: [Vec<f32>; 3],
    /// f_a_proj [D, hidden], f_b_proj [H·D, D]: the forget gate's low-rank input.
    pub f_a: Matrix,
    /// f_b_proj [H·D, D]: the forget gate's second low-rank factor.
    pub f_b: Matrix,
    /// A_log, one per head (flattened from `[1, 1, H, 1]` or `[H]`).
    pub a_log: Vec<f32>,
    /// dt_bias [H·D].
    pub dt_bias: Vec<f32>,
    /// b_proj [H, hidden] (β).
    pub b: Matrix,
    /// g_a_proj [D, hidden], g_b_proj [H·D, D]: the output gate.
    pub g_a: Matrix,
    /// g_b_proj [H·D, D]: the output gate's second low-rank factor.
    pub g_b: Matrix,
    /// o_norm `[D]`, shared by the heads.
    pub o_norm: Vec<f32>,
    /// o_proj [hidden, H·D].
    pub o: Matrix,
}

/// The first of `names` the checkpoint has (the original key, then transformers 5's aliases,
/// spec §4.2); errors name the original.
fn pick<'n>(ld: &Loader, names: &[&'n str]) -> &'n str {
    names.iter().copied().find(|n| ld.has(n)).unwrap_or(names[0])
}

/// Loads layer `p`'s KDA weights, accepting the `save_original_format=False` keys too: the fused
/// `conv1d.weight` [3·H·D, 1, K] and the `forget_gate.` prefix (spec §4.2).
pub fn load(ld: &mut Loader, cfg: &ModelConfig, kda: &KdaConfig, p: &str) -> Result<KdaWeights> {
    let (h, width, d, kk) = (cfg.hidden, kda.width(), kda.head_dim, kda.conv_kernel);
    let a = format!("{p}.self_attn");
    let key = |name: &str| format!("{a}.{name}");
    let gate_key = |name: &str| format!("{a}.forget_gate.{name}");
    let qkv = [ld.matrix(&key("q_proj.weight"), width, h)?, ld.matrix(&key("k_proj.weight"), width, h)?,
        ld.matrix(&key("v_proj.weight"), width, h)?];
    let (wu, k3) = (width as u64, kk as u64);
    let conv = if !ld.has(&key("q_conv1d.weight")) && ld.has(&key("conv1d.weight")) {
        let all = ld.flat_vector(&key("conv1d.weight"), &[&[3 * wu, 1, k3], &[3 * wu, k3]])?;
        if all.is_empty() {
            [Vec::new(), Vec::new(), Vec::new()] // a counting loader
        } else {
            let per = width * kk;
            [all[..per].to_vec(), all[per..2 * per].to_vec(), all[2 * per..].to_vec()]
        }
    } else {
        let one = |ld: &mut Loader, s: &str| ld.flat_vector(&key(&format!("{s}_conv1d.weight")), &[&[wu, 1, k3], &[wu, k3]]);
        [one(ld, "q")?, one(ld, "k")?, one(ld, "v")?]
    };
    let (fa, fb) = (key("f_a_proj.weight"), gate_key("f_a_proj.weight"));
    let f_a = ld.matrix(pick(ld, &[&fa, &fb]), d, h)?;
    let (fa, fb) = (key("f_b_proj.weight"), gate_key("f_b_proj.weight"));
    let f_b = ld.matrix(pick(ld, &[&fa, &fb]), width, d)?;
    let (la, lb) = (key("A_log"), gate_key("A_log"));
    let heads = kda.heads as u64;
    let a_log = ld.flat_vector(pick(ld, &[&la, &lb]), &[&[heads], &[1, 1, heads, 1]])?;
    let (da, db) = (key("dt_bias"), gate_key("dt_bias"));
    let dt_bias = ld.flat_vector(pick(ld, &[&da, &db]), &[&[wu]])?;
    Ok(KdaWeights {
        qkv,
        conv,
        f_a,
        f_b,
        a_log,
        dt_bias,
        b: ld.matrix(&key("b_proj.weight"), kda.heads, h)?,
        g_a: ld.matrix(&key("g_a_proj.weight"), d, h)?,
        g_b: ld.matrix(&key("g_b_proj.weight"), width, d)?,
        o_norm: ld.vector(&key("o_norm.weight"), d)?,
        o: ld.matrix(&key("o_proj.weight"), h, width)?,
    })
}

/// The causal depthwise convolution and SiLU of one stream (spec §4.3 step 2) for `n` tokens:
/// `u` the pre-convolution rows (n × c), `hist` the K − 1 rows before them (oldest first),
/// `w` the kernels (c × K). Each output sums its K taps oldest first, whether a tap comes from
/// the history or the chunk. `hist` is then advanced to the last K − 1 rows.
pub(crate) fn conv_silu(u: &[f32], hist: &mut [f32], w: &[f32], n: usize, c: usize, kk: usize, y: &mut [f32]) {
    let back = kk - 1;
    for t in 0..n {
        for ch in 0..c {
            let mut acc = 0.0f32;
            for j in 0..kk {
                // Input time t − back + j: from the chunk if ≥ 0, else from the history.
                let x = match (t + j).checked_sub(back) {
                    Some(tau) => u[tau * c + ch],
                    None => hist[(t + j) * c + ch],
                };
                acc += w[ch * kk + j] * x;
            }
            y[t * c + ch] = kernels::silu(acc);
        }
    }
    if back == 0 {
        return;
    }
    if n >= back {
        hist.copy_from_slice(&u[(n - back) * c..n * c]);
    } else {
        hist.copy_within(n * c.., 0);
        hist[(back - n) * c..].copy_from_slice(&u[..n * c]);
    }
}

/// x ← x / √(Σx² + 1e-6) per head of `d` channels, then × `scale` if given (spec §4.3 step 3:
/// ε inside the root, as fla and transformers compute it; q takes D^-0.5, k nothing).
pub fn l2norm_heads(x: &mut [f32], d: usize, scale: Option<f32>) {
    for head in x.chunks_exact_mut(d) {
        let ss: f32 = head.iter().fold(0.0, |a, v| a + v * v);
        let norm = (ss + 1e-6).sqrt();
        for v in head.iter_mut() {
            *v /= norm;
            if let Some(s) = scale {
                *v *= s;
            }
        }
    }
}

/// `g = −exp(A_log[h])·softplus(z + dt_bias)` in place over rows of H·D (spec §4.3 step 4), with
/// softplus(x) = x above 20 and ln(1 + eˣ) below, as fla and transformers compute it.
pub fn forget_gate(z: &mut [f32], dt_bias: &[f32], a_log: &[f32], d: usize) {
    let width = dt_bias.len();
    for row in z.chunks_exact_mut(width) {
        for (c, gc) in row.iter_mut().enumerate() {
            let x = *gc + dt_bias[c];
            let softplus = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
            *gc = -a_log[c / d].exp() * softplus;
        }
    }
}

/// The KDA sublayer for the chunk's `n` tokens: reads `st.h`, writes `st.out`, advances layer
/// `l`'s recurrent and convolution state.
#[allow(clippy::too_many_arguments)]
pub fn kda_block(cfg: &ModelConfig, kda: &KdaConfig, k: &Kernels, pool: &Pool, st: &mut State, w: &KdaWeights, l: usize, n: usize) {
    let State { h, out, latent, cache, chunk, .. } = st;
    let (pos0, chunk) = (cache.pos, *chunk);
    let LatentState { slot, kda_u, kda_qkv, kda_low, kda_g, kda_gate, kda_beta, kda_o, kda_pred, .. } = latent;
    let (width, d, heads, kk) = (kda.width(), kda.head_dim, kda.heads, kda.conv_kernel);
    let (s_len, c_len) = (heads * d * d, 3 * (kk - 1) * width);
    let state = &mut cache.kda_state[slot[l] * s_len..(slot[l] + 1) * s_len];
    let hist = &mut cache.kda_conv[slot[l] * c_len..(slot[l] + 1) * c_len];
    if pos0 == 0 {
        // A new session: the reference starts from a zero state and zero padding.
        state.fill(0.0);
        hist.fill(0.0);
    }
    // 1. Projections, and the gates' low-rank inputs.
    let (uq, rest) = kda_u.split_at_mut(chunk * width);
    let (uk, uv) = rest.split_at_mut(chunk * width);
    k.matmul_group(pool, h, n, &mut [(w.qkv[0].view(), &mut *uq), (w.qkv[1].view(), &mut *uk), (w.qkv[2].view(), &mut *uv)]);
    let (fa, ga) = kda_low.split_at_mut(chunk * d);
    k.matmul_group(pool, h, n, &mut [(w.f_a.view(), &mut *fa), (w.g_a.view(), &mut *ga), (w.b.view(), &mut kda_beta[..])]);
    k.matmul(pool, w.f_b.view(), fa, n, kda_g);
    k.matmul(pool, w.g_b.view(), ga, n, kda_gate);
    // 2. Short convolution + SiLU per stream, then 3. the L2 norms.
    let (q, rest) = kda_qkv.split_at_mut(chunk * width);
    let (kv, v) = rest.split_at_mut(chunk * width);
    let hlen = (kk - 1) * width;
    for (i, (u, y)) in [(&*uq, &mut *q), (&*uk, &mut *kv), (&*uv, &mut *v)].into_iter().enumerate() {
        conv_silu(u, &mut hist[i * hlen..(i + 1) * hlen], &w.conv[i], n, width, kk, y);
    }
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    l2norm_heads(&mut q[..n * width], d, Some(scale));
    l2norm_heads(&mut kv[..n * width], d, None);
    // 4. The forget gate's log decay; 5. β = σ(b).
    forget_gate(&mut kda_g[..n * width], &w.dt_bias, &w.a_log, d);
    for b in kda_beta[..n * heads].iter_mut() {
        *b = 1.0 / (1.0 + (-*b).exp());
    }
    // 6. The recurrence.
    let shape = KdaShape { heads, head_dim: d };
    recurrence(pool, shape, q, kv, v, kda_g, kda_beta, n, state, kda_o, kda_pred);
    // 7. Per-head RMSNorm (rms_norm_eps) ⊙ σ(gate), then 8. o_proj.
    for t in 0..n {
        let o = &mut kda_o[t * width..(t + 1) * width];
        let gate = &kda_gate[t * width..(t + 1) * width];
        for (oh, gh) in o.chunks_exact_mut(d).zip(gate.chunks_exact(d)) {
            let mut ss = 0.0f32;
            for x in oh.iter() {
                ss += x * x;
            }
            let inv = 1.0 / (ss / d as f32 + cfg.rms_eps).sqrt();
            for ((x, wn), gv) in oh.iter_mut().zip(&w.o_norm).zip(gh) {
                *x = *x * inv * wn * (1.0 / (1.0 + (-gv).exp()));
            }
        }
    }
    k.matmul(pool, w.o.view(), kda_o, n, out);
}
