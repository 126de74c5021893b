//! Multi-head latent attention in absorbed form (spec §3.4): the queries are carried into the
//! latent space (q̃_h = W_UKᵀ_h · q_nope_h), attend over the cached latents and shared rope keys
//! as one key of r + d_r channels, and the weighted latents come back out per head. Work is
//! split across the pool by head (absorption) and by (token, head) pair (attention); each unit
//! is computed by one participant in a fixed order, so results do not depend on the thread
//! count or on how many tokens a call carries.

use super::{holds, pool, scalar, Kernels, MatRef, Pool};

/// The geometry of one MLA layer.
#[derive(Clone, Copy, Debug)]
pub struct LatentShape {
    pub heads: usize,
    /// d_n: the non-rotated part of a query head.
    pub nope: usize,
    /// d_r: the rotated part, and the width of the shared rope key.
    pub rope: usize,
    /// d_v: a head's value width.
    pub v: usize,
    /// r: the latent rank (`kv_lora_rank`).
    pub rank: usize,
}

impl LatentShape {
    /// Floats of one cached position, and of one absorbed query head: r + d_r.
    pub fn width(&self) -> usize {
        self.rank + self.rope
    }
}

// Shared output pointers (`OutPtr`): participants write disjoint slices (their heads, their
// (token, head) pairs, their own scratch row); the pool joins them before the buffers are reused.
use super::OutPtr as Ptr;


/// q̃ for the `n` queries of `q` (n × heads·(d_n + d_r)): `out` (n × heads·(r + d_r)) gets, per
/// token and head, W_UKᵀ_h · q_nope_h (r floats: rows h·(d_n + d_v) .. + d_n of `kv_b`, each
/// widened to f32 once per call and accumulated in row order), then q_pe_h unchanged. `rows`
/// holds `pool.threads()` × r floats of scratch.
#[allow(clippy::too_many_arguments)]
pub fn absorb_queries(pool: &Pool, s: LatentShape, kv_b: MatRef, q: &[f32], n: usize, rows: &mut [f32], out: &mut [f32]) {
    let (qw, ow, r) = (s.heads * (s.nope + s.rope), s.heads * s.width(), s.rank);
    assert!(holds(q.len(), &[n, qw]) && holds(out.len(), &[n, ow]), "absorb_queries: q/out too short");
    assert!(kv_b.rows == s.heads * (s.nope + s.v) && kv_b.cols == r, "absorb_queries: kv_b shape");
    assert!(holds(kv_b.data.len(), &[kv_b.rows, kv_b.row_bytes()]) && holds(rows.len(), &[pool.threads(), r]), "absorb_queries: buffers");
    let threads = if s.heads * s.nope * r * n < super::PARALLEL_MIN_MACS { 1 } else { pool.threads().min(s.heads) };
    let (out_ptr, row_ptr) = (Ptr(out.as_mut_ptr()), Ptr(rows.as_mut_ptr()));
    let work = |part: usize| {
        let (out_ptr, row_ptr) = (out_ptr, row_ptr);
        // SAFETY: participant `part` owns scratch row `part` (rows holds threads × r floats).
        let row = unsafe { std::slice::from_raw_parts_mut(row_ptr.0.add(part * r), r) };
        for h in pool::chunk(s.heads, threads, part) {
            for t in 0..n {
                // SAFETY: head h of every token is this participant's, a disjoint slice.
                let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(t * ow + h * s.width()), s.width()) };
                o[..r].fill(0.0);
                let pe = t * qw + h * (s.nope + s.rope) + s.nope;
                o[r..].copy_from_slice(&q[pe..pe + s.rope]);
            }
            for i in 0..s.nope {
                scalar::row_to_f32(&kv_b, h * (s.nope + s.v) + i, row);
                for t in 0..n {
                    let c = q[t * qw + h * (s.nope + s.rope) + i];
                    // SAFETY: as above.
                    let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(t * ow + h * s.width()), r) };
                    for (oj, wj) in o.iter_mut().zip(row.iter()) {
                        *oj += c * wj;
                    }
                }
            }
        }
    };
    if threads == 1 {
        work(0);
    } else {
        pool.run(&|part| if part < threads { work(part) });
    }
}

/// Causal attention of the `n` absorbed queries `q` (n × heads·(r + d_r), positions
/// `pos0..pos0+n`) over `cache` (positions × (r + d_r): latent then rope key): per (token,
/// head), score_s = (q̃·c_s + q_pe·k_pe_s) · `scale` for s ≤ t, softmax, and Σ_s p_s c_s into
/// `out`, laid out head-major (heads × n × r) so each head's rows are contiguous for its value
/// product. `scores` holds `pool.threads()` rows of `ctx` floats.
#[allow(clippy::too_many_arguments)]
pub fn attend_latent(k: &Kernels, pool: &Pool, s: LatentShape, scale: f32, q: &[f32], cache: &[f32], pos0: usize, n: usize,
                     scores: &mut [f32], ctx: usize, out: &mut [f32]) {
    let (w, r) = (s.width(), s.rank);
    let end = pos0.saturating_add(n);
    assert!(holds(q.len(), &[n, s.heads, w]) && holds(out.len(), &[s.heads, n, r]), "attend_latent: q/out too short");
    assert!(holds(cache.len(), &[end, w]), "attend_latent: cache too short");
    assert!(end <= ctx && holds(scores.len(), &[pool.threads(), ctx]), "attend_latent: score rows too short");
    let (out_ptr, score_ptr) = (Ptr(out.as_mut_ptr()), Ptr(scores.as_mut_ptr()));
    let items = n * s.heads;
    let threads = if items * (pos0 + n) * w < super::PARALLEL_MIN_MACS { 1 } else { pool.threads() };
    let pieces = pool::Pieces::of_items(items, threads);
    let work = |part: usize| {
        let (out_ptr, score_ptr) = (out_ptr, score_ptr);
        // SAFETY: participant `part` owns score row `part` (scores holds threads × ctx floats).
        let row = unsafe { std::slice::from_raw_parts_mut(score_ptr.0.add(part * ctx), ctx) };
        // Items by piece, whoever is free (see `attention::attend`).
        for item in pieces.items(items) {
            let (t, h) = (item / s.heads, item % s.heads);
            let p = pos0 + t;
            let qh = &q[(t * s.heads + h) * w..(t * s.heads + h + 1) * w];
            let sc = &mut row[..=p];
            k.attn_scores(qh, cache, w, scale, sc);
            k.softmax_with_sink(sc, f32::NEG_INFINITY);
            // SAFETY: item (t, h) is this participant's; its output slice is disjoint.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add((h * n + t) * r), r) };
            // The values are the latents, the first r floats of each cache row.
            k.attn_mix(sc, cache, w, o);
        }
    };
    if threads == 1 {
        work(0);
    } else {
        pool.run(&work);
    }
}
