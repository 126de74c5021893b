//! Causal multi-head attention over the KV cache (spec §0.6), split across the pool by
//! (token, head) pairs. Each pair's scores, softmax and weighted sum are computed by one
//! participant in a fixed order ([`Kernels::attn_scores`], [`Kernels::softmax_with_sink`],
//! [`Kernels::attn_mix`]: a call each per pair), so the result does not depend on the thread
//! count or the chunking.

use super::{holds, pool, Kernels, Pool};

/// The geometry of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape<'a> {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Softmax scale applied to q·k.
    pub scale: f32,
    /// Sliding window: key s is visible from query t iff t − window < s ≤ t.
    pub window: Option<usize>,
    /// Attention sinks (gpt-oss), one logit per head: each joins its head's softmax
    /// denominator and takes no value.
    pub sinks: Option<&'a [f32]>,
}

// Shared output pointers (`OutPtr`): participants write disjoint (token, head) slices of the
// output and their own score row; the pool joins them before the buffers are reused.
use super::OutPtr as Ptr;

/// For the `n` queries in `q` (n × heads·head_dim) at positions `pos0..pos0+n`, attends over
/// `keys`/`values` (positions × kv_heads·head_dim, holding at least `pos0 + n` positions) and
/// writes `out` (n × heads·head_dim). `scores` holds `pool.threads()` rows of `ctx` floats.
#[allow(clippy::too_many_arguments)]
pub fn attend(k: &Kernels, pool: &Pool, s: AttnShape, q: &[f32], keys: &[f32], values: &[f32], pos0: usize, n: usize,
              scores: &mut [f32], ctx: usize, out: &mut [f32]) {
    let (hd, q_dim, kv_dim) = (s.head_dim, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let group = s.heads / s.kv_heads;
    let end = pos0.saturating_add(n);
    assert!(holds(q.len(), &[n, q_dim]) && holds(out.len(), &[n, q_dim]), "attend: q/out too short");
    assert!(holds(keys.len(), &[end, kv_dim]) && holds(values.len(), &[end, kv_dim]), "attend: cache too short");
    assert!(end <= ctx && holds(scores.len(), &[pool.threads(), ctx]), "attend: score rows too short");
    let out_ptr = Ptr(out.as_mut_ptr());
    let score_ptr = Ptr(scores.as_mut_ptr());
    let items = n * s.heads;
    let threads = if items * (pos0 + n) * hd < super::PARALLEL_MIN_MACS { 1 } else { pool.threads() };
    let work = |part: usize| {
        let (out_ptr, score_ptr) = (out_ptr, score_ptr);
        // SAFETY: participant `part` owns score row `part` (scores holds threads × ctx floats).
        let row = unsafe { std::slice::from_raw_parts_mut(score_ptr.0.add(part * ctx), ctx) };
        for item in pool::chunk(items, threads, part) {
            let (t, h) = (item / s.heads, item % s.heads);
            let p = pos0 + t;
            let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
            let qh = &q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd];
            let kvh = h / group;
            let sc = &mut row[lo..=p];
            let at = lo * kv_dim + kvh * hd;
            k.attn_scores(qh, &keys[at..], kv_dim, s.scale, sc);
            k.softmax_with_sink(sc, s.sinks.map_or(f32::NEG_INFINITY, |sinks| sinks[h]));
            // SAFETY: item (t, h) is this participant's; its output slice is disjoint.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(t * q_dim + h * hd), hd) };
            k.attn_mix(sc, &values[at..], kv_dim, o);
        }
    };
    if threads == 1 {
        work(0);
    } else {
        pool.run(&work);
    }
}
