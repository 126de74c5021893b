//! Multi-head latent attention (spec §3.3–3.5, §4.4), run in absorbed form (§3.4): the cache
//! holds each token's normalised latent c and its rotated shared rope key; queries are carried
//! into the latent space by W_UKᵀ, attend over [c | k_pe], and come back out per head through
//! W_UV, then o_proj. The same block serves DeepSeek-V2/V3 (RoPE, interleaved or half-split,
//! YaRN) and Kimi-Linear's NoPE layers.

use super::latent::LatentState;
use super::rope;
use super::state::State;
use super::weights::{Linear, Loader, Matrix};
use crate::error::Result;
use crate::format::config::{MlaConfig, MlaRope, ModelConfig};
use crate::kernels::mla::{absorb_queries, attend_latent, LatentShape};
use crate::kernels::{self, Kernels, MatRef, Pool};

/// MLA latent norms use ε = 1e-6 whatever `rms_norm_eps` says (spec §0.3).
const LATENT_EPS: f32 = 1e-6;

/// How a layer makes its queries (spec §3.3 step 1).
pub enum QueryProj {
    /// `q_proj` [H·(d_n + d_r), hidden].
    Direct(Linear),
    /// `q_a_proj` [r_q, hidden] (+bias), `q_a_layernorm` [r_q], `q_b_proj` [H·(d_n + d_r), r_q].
    Lora { a: Linear, norm: Vec<f32>, b: Linear },
}

/// One MLA layer's weights (spec §3.2).
pub struct MlaWeights {
    pub q: QueryProj,
    /// `kv_a_proj_with_mqa` [r + d_r, hidden] (+bias).
    pub kv_a: Linear,
    /// `kv_a_layernorm` [r].
    pub kv_norm: Vec<f32>,
    /// `kv_b_proj` [H·(d_n + d_v), r]: per head, W_UK (d_n rows) then W_UV (d_v rows).
    pub kv_b: Matrix,
    /// `o_proj` [hidden, H·d_v] (+bias).
    pub o: Linear,
}

/// Loads layer `p`'s MLA weights (`p` = `model.layers.{l}`).
pub fn load(ld: &mut Loader, cfg: &ModelConfig, m: &MlaConfig, p: &str) -> Result<MlaWeights> {
    let (h, heads) = (cfg.hidden, cfg.heads);
    let a = format!("{p}.self_attn");
    let q = match m.q_lora_rank {
        None => QueryProj::Direct(ld.linear(&format!("{a}.q_proj"), heads * m.q_head_dim(), h, false)?),
        Some(rq) => QueryProj::Lora {
            a: ld.linear(&format!("{a}.q_a_proj"), rq, h, m.bias)?,
            norm: ld.vector(&format!("{a}.q_a_layernorm.weight"), rq)?,
            b: ld.linear(&format!("{a}.q_b_proj"), heads * m.q_head_dim(), rq, false)?,
        },
    };
    Ok(MlaWeights {
        q,
        kv_a: ld.linear(&format!("{a}.kv_a_proj_with_mqa"), m.latent_width(), h, m.bias)?,
        kv_norm: ld.vector(&format!("{a}.kv_a_layernorm.weight"), m.kv_lora_rank)?,
        kv_b: ld.matrix(&format!("{a}.kv_b_proj.weight"), heads * (m.nope_dim + m.v_dim), m.kv_lora_rank)?,
        o: ld.linear(&format!("{a}.o_proj"), h, heads * m.v_dim, m.bias)?,
    })
}

/// RMSNorm in place, the same arithmetic as [`kernels::rmsnorm`].
fn rmsnorm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let mut ss = 0.0f32;
    for v in x.iter() {
        ss += v * v;
    }
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for (v, g) in x.iter_mut().zip(w) {
        *v = *v * inv * g;
    }
}

/// Rotates one `d_r`-wide slice in the layer's layout with (cos, sin) already scaled.
fn rotate(layout: MlaRope, x: &mut [f32], cs: &[f32]) {
    let (cos, sin) = cs.split_at(cs.len() / 2);
    match layout {
        MlaRope::Interleaved => rope::rotate_pairs(x, cos, sin),
        MlaRope::HalfSplit => rope::rotate_half(x, cos, sin),
        MlaRope::None => {}
    }
}

/// The MLA sublayer for the chunk's `n` tokens: reads `st.h`, writes `st.out`, appends the
/// tokens' latents to layer `l`'s cache.
#[allow(clippy::too_many_arguments)]
pub fn mla_block(cfg: &ModelConfig, m: &MlaConfig, k: &Kernels, pool: &Pool, st: &mut State, w: &MlaWeights, l: usize, n: usize) {
    let State { h, out, scores, cos, sin, latent, ctx, cache: session, .. } = st;
    let (ctx, pos0) = (*ctx, session.pos);
    let LatentState { slot, mla_q, mla_qa, mla_kv, mla_qabs, mla_olat, mla_ov, mla_att, mla_rows, rope_cs, .. } = latent;
    let s = LatentShape { heads: cfg.heads, nope: m.nope_dim, rope: m.rope_dim, v: m.v_dim, rank: m.kv_lora_rank };
    let (qd, width, r) = (m.q_head_dim(), s.width(), s.rank);
    // 1–2. Queries and the compressed key/value (spec §3.3).
    match &w.q {
        QueryProj::Direct(q) => k.matmul_group(pool, h, n, &mut [(q.w.view(), &mut mla_q[..]), (w.kv_a.w.view(), &mut mla_kv[..])]),
        QueryProj::Lora { a, norm, b } => {
            k.matmul_group(pool, h, n, &mut [(a.w.view(), &mut mla_qa[..]), (w.kv_a.w.view(), &mut mla_kv[..])]);
            super::add_bias(a, n, mla_qa);
            let rq = a.w.rows;
            for row in mla_qa[..n * rq].chunks_exact_mut(rq) {
                rmsnorm_in_place(row, norm, LATENT_EPS);
            }
            super::linear(k, pool, b, mla_qa, n, mla_q);
        }
    }
    super::add_bias(&w.kv_a, n, mla_kv);
    // The cache row of each token: c = RMSNorm(a[..r]) then k_pe = a[r..], rotated; q_pe rotated
    // alike (3). cos/sin carry YaRN's attention factor (spec §0.5).
    let base = slot[l] * ctx * width;
    let cache = &mut session.mla[base..base + ctx * width];
    let half = m.rope_dim / 2;
    for t in 0..n {
        let row = &mut cache[(pos0 + t) * width..(pos0 + t + 1) * width];
        kernels::rmsnorm(&mut row[..r], &mla_kv[t * width..t * width + r], &w.kv_norm, LATENT_EPS);
        row[r..].copy_from_slice(&mla_kv[t * width + r..(t + 1) * width]);
        if m.rope == MlaRope::None {
            continue;
        }
        let (c, sn) = rope_cs.split_at_mut(half);
        for j in 0..half {
            c[j] = cos[t * half + j] * m.rope_factor;
            sn[j] = sin[t * half + j] * m.rope_factor;
        }
        rotate(m.rope, &mut row[r..], rope_cs);
        for head in mla_q[t * cfg.heads * qd..(t + 1) * cfg.heads * qd].chunks_exact_mut(qd) {
            rotate(m.rope, &mut head[m.nope_dim..], rope_cs);
        }
    }
    // 4–5. Absorbed queries attend over [c | k_pe] (spec §3.4).
    absorb_queries(pool, s, w.kv_b.view(), mla_q, n, mla_rows, mla_qabs);
    attend_latent(k, pool, s, m.scale, mla_qabs, cache, pos0, n, scores, ctx, mla_olat);
    // 6. Per head, o_h = W_UV_h · ō_h, into the heads' concatenation; then o_proj (7).
    let kv_b = w.kv_b.view();
    let rb = kv_b.row_bytes();
    let hv = cfg.heads * m.v_dim;
    for head in 0..cfg.heads {
        let first = head * (m.nope_dim + m.v_dim) + m.nope_dim;
        let w_uv = MatRef { dtype: kv_b.dtype, rows: m.v_dim, cols: r, data: &kv_b.data[first * rb..(first + m.v_dim) * rb] };
        k.matmul(pool, w_uv, &mla_olat[head * n * r..(head + 1) * n * r], n, mla_ov);
        for t in 0..n {
            mla_att[t * hv + head * m.v_dim..t * hv + (head + 1) * m.v_dim].copy_from_slice(&mla_ov[t * m.v_dim..(t + 1) * m.v_dim]);
        }
    }
    super::linear(k, pool, &w.o, mla_att, n, out);
}
