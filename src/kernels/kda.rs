//! The Kimi Delta Attention recurrence (spec §4.3 step 6), token by token: per head, decay the
//! state's rows, predict from the decayed state, write the rank-1 correction, read with the
//! updated state. Heads are split across the pool; each head's tokens run in order on one
//! participant, so results do not depend on the thread count or on the chunking of the tokens.

use super::{holds, pool, Pool};

/// The geometry of a KDA layer's recurrence.
#[derive(Clone, Copy, Debug)]
pub struct KdaShape {
    /// Attention heads.
    pub heads: usize,
    /// D = D_k = D_v.
    pub head_dim: usize,
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
    let (d, width) = (s.head_dim, s.heads * s.head_dim);
    for x in [q, k, v, g] {
        assert!(holds(x.len(), &[n, s.heads, d]), "kda recurrence: input too short");
    }
    assert!(holds(beta.len(), &[n, s.heads]) && holds(out.len(), &[n, s.heads, d]), "kda recurrence: beta/out too short");
    assert!(holds(state.len(), &[s.heads, d, d]) && holds(pred.len(), &[pool.threads(), d]), "kda recurrence: state/scratch too short");
    let threads = if s.heads * d * d * n < super::PARALLEL_MIN_MACS { 1 } else { pool.threads().min(s.heads) };
    let (state_ptr, out_ptr, pred_ptr) = (Ptr(state.as_mut_ptr()), Ptr(out.as_mut_ptr()), Ptr(pred.as_mut_ptr()));
    let work = |part: usize| {
        let (state_ptr, out_ptr, pred_ptr) = (state_ptr, out_ptr, pred_ptr);
        // SAFETY: participant `part` owns scratch row `part`.
        let pr = unsafe { std::slice::from_raw_parts_mut(pred_ptr.0.add(part * d), d) };
        for h in pool::chunk(s.heads, threads, part) {
            // SAFETY: head h's state block is this participant's alone.
            let st = unsafe { std::slice::from_raw_parts_mut(state_ptr.0.add(h * d * d), d * d) };
            for t in 0..n {
                let at = t * width + h * d;
                // SAFETY: (token t, head h) of the output is this participant's alone.
                let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(at), d) };
                step(st, &q[at..at + d], &k[at..at + d], &v[at..at + d], &g[at..at + d], beta[t * s.heads + h], pr, o);
            }
        }
    };
    if threads == 1 {
        work(0);
    } else {
        pool.run(&|part| if part < threads { work(part) });
    }
}

/// One token of one head (spec §4.3 step 6): S ← diag(e^g)·S; pred = Sᵀk; S += k ⊗ β(v − pred);
/// o = Sᵀq. Row sums run over the key channel in order.
#[allow(clippy::too_many_arguments)]
fn step(st: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: &[f32], beta: f32, pred: &mut [f32], o: &mut [f32]) {
    let d = q.len();
    pred.fill(0.0);
    for (i, row) in st.chunks_exact_mut(d).enumerate() {
        let decay = g[i].exp();
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
    for (i, row) in st.chunks_exact_mut(d).enumerate() {
        for ((s, delta), oj) in row.iter_mut().zip(pred.iter()).zip(o.iter_mut()) {
            *s += k[i] * delta;
            *oj += *s * q[i];
        }
    }
}
