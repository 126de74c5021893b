//! The delta-rule recurrence, token by token, of Kimi Delta Attention (spec §4.3 step 6) and of
//! Qwen3-Next's Gated DeltaNet: per value head, decay the state's rows, predict v from the key,
//! write the β-scaled correction as a rank-1 update, read with the query. What differs between
//! the two (transformers' `torch_recurrent_gated_delta_rule` for Gated DeltaNet):
//! - the decay: KDA has one per key channel, Gated DeltaNet one scalar per head (`Decay`);
//! - the state: KDA's is D × D with one key head per value head; Gated DeltaNet's is D_k × D_v
//!   and each query/key head serves `v_heads / k_heads` consecutive value heads (the
//!   reference's `repeat_interleave`).
//!
//! Value heads are split across the pool; each head's tokens run in order on one participant,
//! so results do not depend on the thread count or on the chunking of the tokens.

use super::{holds, pool, Pool};

/// The geometry of a KDA layer's recurrence.
#[derive(Clone, Copy, Debug)]
pub struct KdaShape {
    /// Attention heads.
    pub heads: usize,
    /// D = D_k = D_v.
    pub head_dim: usize,
}

/// The geometry of a delta-rule recurrence: query/key heads of `k_dim` channels, value heads of
/// `v_dim` (a multiple of the key heads).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeltaShape {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
}

/// The log decay g ≤ 0 of each token: one per key channel of each value head (KDA:
/// n × v_heads·D_k) or one per value head (Gated DeltaNet: n × v_heads).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Decay<'a> {
    PerKeyChannel(&'a [f32]),
    PerHead(&'a [f32]),
}

// Shared output pointers (`OutPtr`): participants write disjoint heads of the state and of the
// output, and their own scratch row; the pool joins them before the buffers are reused.
use super::OutPtr as Ptr;

/// Runs `n` tokens through the recurrence. `q`, `k`, `v`, `g` are n × heads·D (q and k already
/// L2-normalised and q scaled by D^-0.5, g the log decay ≤ 0), `beta` n × heads; `state` is
/// heads × D × D (row i = key channel i), updated in place; `out` gets n × heads·D. `pred`
/// holds `pool.threads()` × D floats of scratch.
#[allow(clippy::too_many_arguments)]
pub fn recurrence(pool: &Pool, s: KdaShape, q: &[f32], k: &[f32], v: &[f32], g: &[f32], beta: &[f32], n: usize,
                  state: &mut [f32], out: &mut [f32], pred: &mut [f32]) {
    let shape = DeltaShape { k_heads: s.heads, v_heads: s.heads, k_dim: s.head_dim, v_dim: s.head_dim };
    delta_rule(pool, shape, q, k, v, Decay::PerKeyChannel(g), beta, n, state, out, pred);
}

/// Runs `n` tokens through the recurrence. `q`, `k` are n × k_heads·D_k (L2-normalised, q also
/// scaled by D_k^-0.5), `v` n × v_heads·D_v, `beta` n × v_heads; `state` is v_heads × D_k × D_v
/// (row i = key channel i), updated in place; `out` gets n × v_heads·D_v. `pred` holds
/// `pool.threads()` × D_v floats of scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_rule(pool: &Pool, s: DeltaShape, q: &[f32], k: &[f32], v: &[f32], decay: Decay, beta: &[f32], n: usize,
                         state: &mut [f32], out: &mut [f32], pred: &mut [f32]) {
    let (dk, dv) = (s.k_dim, s.v_dim);
    let (kw, vw) = (s.k_heads * dk, s.v_heads * dv);
    assert!(s.k_heads > 0 && s.v_heads.is_multiple_of(s.k_heads), "delta rule: value heads not a multiple of key heads");
    assert!(holds(q.len(), &[n, kw]) && holds(k.len(), &[n, kw]) && holds(v.len(), &[n, vw]), "delta rule: input too short");
    let decays = match decay {
        Decay::PerKeyChannel(g) => holds(g.len(), &[n, s.v_heads, dk]),
        Decay::PerHead(g) => holds(g.len(), &[n, s.v_heads]),
    };
    assert!(decays && holds(beta.len(), &[n, s.v_heads]) && holds(out.len(), &[n, vw]), "delta rule: decay/beta/out too short");
    assert!(holds(state.len(), &[s.v_heads, dk, dv]) && holds(pred.len(), &[pool.threads(), dv]), "delta rule: state/scratch too short");
    let group = s.v_heads / s.k_heads;
    let threads = if s.v_heads * dk * dv * n < super::PARALLEL_MIN_MACS { 1 } else { pool.threads().min(s.v_heads) };
    let (state_ptr, out_ptr, pred_ptr) = (Ptr(state.as_mut_ptr()), Ptr(out.as_mut_ptr()), Ptr(pred.as_mut_ptr()));
    let work = |part: usize| {
        let (state_ptr, out_ptr, pred_ptr) = (state_ptr, out_ptr, pred_ptr);
        // SAFETY: participant `part` owns scratch row `part`.
        let pr = unsafe { std::slice::from_raw_parts_mut(pred_ptr.0.add(part * dv), dv) };
        for h in pool::chunk(s.v_heads, threads, part) {
            // SAFETY: value head h's state block is this participant's alone.
            let st = unsafe { std::slice::from_raw_parts_mut(state_ptr.0.add(h * dk * dv), dk * dv) };
            let kh = h / group;
            for t in 0..n {
                let (qa, va) = (t * kw + kh * dk, t * vw + h * dv);
                // SAFETY: (token t, value head h) of the output is this participant's alone.
                let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(va), dv) };
                let g = match decay {
                    Decay::PerKeyChannel(g) => &g[(t * s.v_heads + h) * dk..(t * s.v_heads + h + 1) * dk],
                    Decay::PerHead(g) => std::slice::from_ref(&g[t * s.v_heads + h]),
                };
                step(st, &q[qa..qa + dk], &k[qa..qa + dk], &v[va..va + dv], g, beta[t * s.v_heads + h], pr, o);
            }
        }
    };
    if threads == 1 {
        work(0);
    } else {
        pool.run(&|part| if part < threads { work(part) });
    }
}

/// One token of one value head (spec §4.3 step 6): S ← diag(e^g)·S; pred = Sᵀk;
/// S += k ⊗ β(v − pred); o = Sᵀq. `g` holds one log decay per key channel, or one for the whole
/// head. Row sums run over the key channel in order.
#[allow(clippy::too_many_arguments)]
fn step(st: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: &[f32], beta: f32, pred: &mut [f32], o: &mut [f32]) {
    let dv = v.len();
    let head_decay = g.first().map_or(1.0, |g| g.exp());
    pred.fill(0.0);
    for (i, row) in st.chunks_exact_mut(dv).enumerate() {
        let decay = if g.len() == 1 { head_decay } else { g[i].exp() };
        for (p, s) in pred.iter_mut().zip(row.iter_mut()) {
            *s *= decay;
            *p += *s * k[i];
        }
    }
    // pred becomes the write, delta = β(v − pred).
    for (p, vj) in pred.iter_mut().zip(v) {
        *p = (vj - *p) * beta;
    }
    o.fill(0.0);
    for (i, row) in st.chunks_exact_mut(dv).enumerate() {
        for ((s, delta), oj) in row.iter_mut().zip(pred.iter()).zip(o.iter_mut()) {
            *s += k[i] * delta;
            *oj += *s * q[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    /// A per-head decay is the per-channel decay with every channel of the head set to it: the
    /// two give the same bits (Gated DeltaNet's case against KDA's).
    #[test]
    fn a_per_head_decay_equals_the_same_decay_on_every_channel() {
        let pool = Pool::new(1).must();
        let (heads, d, n) = (2, 4, 5);
        let w = heads * d;
        let val = |i: usize, s: f32| ((i as f32 * 0.37 + s).sin()) * 0.5;
        let q: Vec<f32> = (0..n * w).map(|i| val(i, 0.1)).collect();
        let k: Vec<f32> = (0..n * w).map(|i| val(i, 0.7)).collect();
        let v: Vec<f32> = (0..n * w).map(|i| val(i, 1.3)).collect();
        let g: Vec<f32> = (0..n * heads).map(|i| -0.2 - 0.1 * (i % 3) as f32).collect();
        let beta: Vec<f32> = (0..n * heads).map(|i| 0.3 + 0.1 * (i % 4) as f32).collect();
        let g_channels: Vec<f32> = (0..n * w).map(|i| g[i / d]).collect();
        let (mut s1, mut s2) = (vec![0.0; heads * d * d], vec![0.0; heads * d * d]);
        let (mut o1, mut o2, mut p) = (vec![0.0; n * w], vec![0.0; n * w], vec![0.0; d]);
        let shape = DeltaShape { k_heads: heads, v_heads: heads, k_dim: d, v_dim: d };
        delta_rule(&pool, shape, &q, &k, &v, Decay::PerHead(&g), &beta, n, &mut s1, &mut o1, &mut p);
        recurrence(&pool, KdaShape { heads, head_dim: d }, &q, &k, &v, &g_channels, &beta, n, &mut s2, &mut o2, &mut p);
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
        assert!(o1.iter().any(|&x| x != 0.0));
    }
}
