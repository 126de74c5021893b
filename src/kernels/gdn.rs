//! The Gated DeltaNet recurrence of Qwen3-Next's linear-attention layers, token by token.
//!
//! The same delta rule as KDA's ([`super::kda`]): decay the state, predict v from the key, write
//! the β-scaled correction as a rank-1 update, read with the query. What differs, per
//! transformers' `torch_recurrent_gated_delta_rule`:
//! - the decay is one scalar per head and token (KDA: one per key channel);
//! - the state is D_k × D_v (KDA: square), and each query/key head serves `v_heads / k_heads`
//!   consecutive value heads (the reference's `repeat_interleave`).
//!
//! Value heads are split across the pool; each head's tokens run in order on one participant,
//! so results do not depend on the thread count or on how the tokens were chunked.

use super::{holds, pool, Pool};
use super::OutPtr as Ptr;

/// The geometry of a Gated DeltaNet layer's recurrence.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GdnShape {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
}

/// Runs `n` tokens through the recurrence. `q`, `k` are n × k_heads·D_k (L2-normalised, q also
/// scaled by D_k^-0.5), `v` n × v_heads·D_v, `g` (log decay ≤ 0) and `beta` n × v_heads;
/// `state` is v_heads × D_k × D_v (row i = key channel i), updated in place; `out` gets
/// n × v_heads·D_v. `pred` holds `pool.threads()` × D_v floats of scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn recurrence(pool: &Pool, s: GdnShape, q: &[f32], k: &[f32], v: &[f32], g: &[f32], beta: &[f32], n: usize,
                         state: &mut [f32], out: &mut [f32], pred: &mut [f32]) {
    let (dk, dv) = (s.k_dim, s.v_dim);
    let (kw, vw) = (s.k_heads * dk, s.v_heads * dv);
    assert!(s.k_heads > 0 && s.v_heads.is_multiple_of(s.k_heads), "gdn recurrence: value heads not a multiple of key heads");
    assert!(holds(q.len(), &[n, kw]) && holds(k.len(), &[n, kw]) && holds(v.len(), &[n, vw]), "gdn recurrence: input too short");
    assert!(holds(g.len(), &[n, s.v_heads]) && holds(beta.len(), &[n, s.v_heads]) && holds(out.len(), &[n, vw]),
            "gdn recurrence: gates/out too short");
    assert!(holds(state.len(), &[s.v_heads, dk, dv]) && holds(pred.len(), &[pool.threads(), dv]), "gdn recurrence: state/scratch too short");
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
                let gate = (g[t * s.v_heads + h].exp(), beta[t * s.v_heads + h]);
                step(st, &q[qa..qa + dk], &k[qa..qa + dk], &v[va..va + dv], gate, pr, o);
            }
        }
    };
    if threads == 1 {
        work(0);
    } else {
        pool.run(&|part| if part < threads { work(part) });
    }
}

/// One token of one value head: S ← e^g·S; pred = Sᵀk; S += k ⊗ β(v − pred); o = Sᵀq. Sums run
/// over the key channel in order. `(decay, beta)` = (e^g, β).
fn step(st: &mut [f32], q: &[f32], k: &[f32], v: &[f32], (decay, beta): (f32, f32), pred: &mut [f32], o: &mut [f32]) {
    let dv = v.len();
    pred.fill(0.0);
    for (row, &ki) in st.chunks_exact_mut(dv).zip(k) {
        for (p, s) in pred.iter_mut().zip(row.iter_mut()) {
            *s *= decay;
            *p += *s * ki;
        }
    }
    for (p, vj) in pred.iter_mut().zip(v) {
        *p = (vj - *p) * beta;
    }
    o.fill(0.0);
    for ((row, &ki), &qi) in st.chunks_exact_mut(dv).zip(k).zip(q) {
        for ((s, delta), oj) in row.iter_mut().zip(pred.iter()).zip(o.iter_mut()) {
            *s += ki * delta;
            *oj += *s * qi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    /// With one value head per key head and square heads, the recurrence is KDA's with the
    /// per-channel decay set to the head's scalar: the two kernels agree bit for bit.
    #[test]
    fn agrees_with_kda_when_the_decay_is_uniform() {
        let pool = Pool::new(1).must();
        let (heads, d, n) = (2, 4, 5);
        let w = heads * d;
        let val = |i: usize, s: f32| ((i as f32 * 0.37 + s).sin()) * 0.5;
        let q: Vec<f32> = (0..n * w).map(|i| val(i, 0.1)).collect();
        let k: Vec<f32> = (0..n * w).map(|i| val(i, 0.7)).collect();
        let v: Vec<f32> = (0..n * w).map(|i| val(i, 1.3)).collect();
        let g: Vec<f32> = (0..n * heads).map(|i| -0.2 - 0.1 * (i % 3) as f32).collect();
        let beta: Vec<f32> = (0..n * heads).map(|i| 0.3 + 0.1 * (i % 4) as f32).collect();
        let g_kda: Vec<f32> = (0..n * w).map(|i| g[i / d]).collect();
        let (mut s1, mut s2) = (vec![0.0; heads * d * d], vec![0.0; heads * d * d]);
        let (mut o1, mut o2, mut p) = (vec![0.0; n * w], vec![0.0; n * w], vec![0.0; d]);
        let shape = GdnShape { k_heads: heads, v_heads: heads, k_dim: d, v_dim: d };
        recurrence(&pool, shape, &q, &k, &v, &g, &beta, n, &mut s1, &mut o1, &mut p);
        let ks = crate::kernels::kda::KdaShape { heads, head_dim: d };
        crate::kernels::kda::recurrence(&pool, ks, &q, &k, &v, &g_kda, &beta, n, &mut s2, &mut o2, &mut p);
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
    }
}
