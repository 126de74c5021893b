//! Causal multi-head attention over the KV cache (spec §0.6), split across the pool by
//! (token, key-value head) pairs: each pair's query heads (a grouped-query attention group)
//! are scored, normalized and summed together ([`Kernels::attn_scores_group`],
//! [`Kernels::softmax_with_sink`], [`Kernels::attn_mix_group`]), so that a group's keys and
//! values are read once for its heads, not once per head. When there are fewer pairs than pool
//! participants (one key-value head, a decode step), the split is by (token, head) instead.
//! Either way every (token, head) result is computed in one fixed order, the grouped kernels
//! giving the per-head ones' bits, so the result depends neither on the thread count nor on
//! the chunking.

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
/// writes `out` (n × heads·head_dim). `scores` holds `pool.threads()` rows of
/// [`score_floats`]`(heads / kv_heads, ctx)` floats.
#[allow(clippy::too_many_arguments)]
pub fn attend(k: &Kernels, pool: &Pool, s: AttnShape, q: &[f32], keys: &[f32], values: &[f32], pos0: usize, n: usize,
              scores: &mut [f32], ctx: usize, out: &mut [f32]) {
    let (hd, q_dim, kv_dim) = (s.head_dim, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let group = s.heads / s.kv_heads;
    let end = pos0.saturating_add(n);
    let row_len = score_floats(group, ctx);
    assert!(holds(q.len(), &[n, q_dim]) && holds(out.len(), &[n, q_dim]), "attend: q/out too short");
    assert!(holds(keys.len(), &[end, kv_dim]) && holds(values.len(), &[end, kv_dim]), "attend: cache too short");
    assert!(end <= ctx && holds(scores.len(), &[pool.threads(), row_len]), "attend: score rows too short");
    let out_ptr = Ptr(out.as_mut_ptr());
    let score_ptr = Ptr(scores.as_mut_ptr());
    // Heads per item: the whole group, unless that leaves a participant without work.
    let per_item = if n * s.kv_heads >= pool.threads() { group } else { 1 };
    let items = n * s.heads / per_item;
    let threads = if items * per_item * (pos0 + n) * hd < super::PARALLEL_MIN_MACS { 1 } else { pool.threads() };
    let pieces = pool::Pieces::of_items(items, threads);
    let work = |part: usize| {
        let (out_ptr, score_ptr) = (out_ptr, score_ptr);
        // SAFETY: participant `part` owns score row `part` (scores holds threads × row_len floats).
        let row = unsafe { std::slice::from_raw_parts_mut(score_ptr.0.add(part * row_len), row_len) };
        // Items by piece, whoever is free: a causal prompt's later tokens cost more.
        for item in pieces.items(items) {
            // Item (t, h0): token t, heads h0 .. h0 + per_item, all of key-value head h0 / group.
            let (t, h0) = (item * per_item / s.heads, item * per_item % s.heads);
            let p = pos0 + t;
            let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
            let len = p + 1 - lo;
            let qh = &q[t * q_dim + h0 * hd..t * q_dim + (h0 + per_item) * hd];
            let at = lo * kv_dim + (h0 / group) * hd;
            let sc = &mut row[..per_item * len];
            k.attn_scores_group(qh, hd, &keys[at..], kv_dim, s.scale, sc);
            for (g, probs) in sc.chunks_exact_mut(len).enumerate() {
                k.softmax_with_sink(probs, s.sinks.map_or(f32::NEG_INFINITY, |sinks| sinks[h0 + g]));
            }
            // SAFETY: item (t, h0)'s heads are this participant's; their output is disjoint.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(t * q_dim + h0 * hd), per_item * hd) };
            k.attn_mix_group(sc, &values[at..], kv_dim, o, hd);
        }
    };
    if threads == 1 {
        work(0);
    } else {
        pool.run(&work);
    }
}

/// Floats of one pool participant's score row in [`attend`]: `ctx` scores for each of the
/// `group` heads of a grouped-query attention group.
pub fn score_floats(group: usize, ctx: usize) -> usize {
    group.max(1).saturating_mul(ctx)
}
