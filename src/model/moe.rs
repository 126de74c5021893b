//! The mixture-of-experts FFN (spec §2): route each token to its top-k experts, run each chosen
//! expert once over all the tokens of the chunk that chose it, and combine.
//!
//! Results never depend on when an expert's bytes arrive: every (token, slot) output has its
//! own buffer, and a token's outputs are summed in a fixed order (by expert id, as the
//! reference's per-expert loop does) after all have landed.

use super::experts::Experts;
use super::state::State;
use super::weights::{Matrix, Mlp};
use super::route::{self, top_k as top_k_ids};
use super::routing::RoutingHooks;
use crate::error::Result;
use crate::format::config::ModelConfig;
use crate::format::container::RecordLayout;
use crate::kernels::{self, Kernels, MatRef, Pool};
use super::experts::{Record, RECORD_BATCH};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The most experts a token chooses per layer (the combine's fixed order array).
const MAX_TOP_K: usize = 64;

/// The resident part of a MoE layer.
pub struct MoeWeights {
    /// Router, [experts, hidden].
    pub router: Matrix,
    /// DeepSeek-V3 / Kimi `e_score_correction_bias` [experts]: for selection only (spec §3.6).
    pub bias: Option<Vec<f32>>,
    /// The shared expert, with Qwen2-MoE's sigmoid gate ([1, hidden]); DeepSeek's and Kimi's
    /// `shared_experts` have no gate (spec §3.6 step 8).
    pub shared: Option<(Mlp, Option<Matrix>)>,
    /// gpt-oss: the router's bias [experts], added to its logits before the top-k.
    pub router_bias: Option<Vec<f32>>,
    /// gpt-oss: the experts' biases; with them the experts use the clamped SwiGLU.
    pub expert_bias: Option<super::gpt_oss::ExpertBias>,
}

/// The matrices of one expert record.
pub fn record_matrices<'a>(layout: &RecordLayout, rec: &'a [u8]) -> [MatRef<'a>; 3] {
    layout.matrices.map(|m| MatRef { dtype: m.dtype, rows: m.rows, cols: m.cols, data: &rec[m.offset..m.offset + m.bytes] })
}

pub(crate) use crate::cache::AHEAD_DEPTH;

/// Where depth `d`'s guess starts in `State::ahead_ids` (each depth has room for a prefill
/// chunk's union of guesses, `experts` ids, or a decode step's `top_k`).
pub(crate) const fn ahead_ids_start(d: usize, experts: usize, top_k: usize) -> usize {
    d * if experts > top_k { experts } else { top_k }
}

/// The next MoE layers' routers, nearest first, for the look-ahead: (layer, router weights).
pub(crate) type NextRouters<'a> = [Option<(usize, &'a Matrix)>; AHEAD_DEPTH];

/// Where a MoE layer sits: its layer index, its index among the MoE layers, the chunk's first
/// position, and what records or replaces its routing.
pub(crate) struct MoeStep<'a> {
    pub layer: usize,
    pub moe_index: usize,
    pub pos0: usize,
    pub routing: &'a mut RoutingHooks,
}

/// The MoE FFN for the chunk's `n` tokens: reads `st.h`, writes `st.out`. With `next` (the
/// experts stream), the next MoE layers' routers are applied to this layer's input — the
/// residual stream changes little from one layer to the next — and the experts they pick
/// start reading while this layer computes (see [`guess_next_experts`]). A guess only moves
/// bytes earlier: each layer still routes on its own input.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_block(cfg: &ModelConfig, k: &Kernels, pool: &Pool, st: &mut State, w: &MoeWeights,
                 experts: &mut Experts, step: MoeStep, n: usize, next: NextRouters) -> Result<()> {
    let Some(moe) = cfg.moe.as_ref() else { return Ok(()) };
    let (h, top_k, ne, layer) = (cfg.hidden, moe.top_k, moe.experts, step.layer);
    k.matmul(pool, w.router.view(), &st.h, n, &mut st.router);
    if let Some(b) = &w.router_bias {
        for row in st.router[..n * ne].chunks_exact_mut(ne) {
            super::add_rows(row, b, ne);
        }
    }
    route::route(moe, w.bias.as_deref(), &mut st.router[..n * ne], n, &mut st.route_ids, &mut st.route_w, &mut st.latent.route_scratch);
    step.routing.replay(step.pos0, step.moe_index, ne, n, top_k, &mut st.route_ids[..n * top_k]);
    step.routing.record(step.moe_index, n, top_k, &st.route_ids[..n * top_k]);
    // The distinct experts the chunk needs, in id order.
    st.wanted.clear();
    st.wanted.extend_from_slice(&st.route_ids[..n * top_k]);
    st.wanted.sort_unstable();
    st.wanted.dedup();
    let wanted = std::mem::take(&mut st.wanted);
    // Once a cache holding every expert has read them all, no guess can move a read earlier
    // (in decode, one router product per layer saved: 128 × 2048 weights on Qwen3-30B-A3B,
    // 272 KiB in Q8B32).
    let guessed = if next[0].is_some() && experts.may_miss() {
        guess_next_experts(k, pool, st, &next, n, (h, ne, top_k), wanted.len(), experts.cache_slots())
    } else {
        [0; AHEAD_DEPTH]
    };
    let inter = moe.expert_intermediate;
    // The guesses are a prefix of the depths: a depth is guessed only after the nearer one.
    let mut ahead: [(usize, &[u32]); AHEAD_DEPTH] = [(0, &[]); AHEAD_DEPTH];
    let mut depth = 0;
    for (router, &count) in next.iter().zip(&guessed) {
        let Some((l, _)) = router.filter(|_| count > 0) else { break };
        ahead[depth] = (l, &st.ahead_ids[ahead_ids_start(depth, ne, top_k)..][..count]);
        depth += 1;
    }
    let ahead = &ahead[..depth];
    // Whole experts per participant when the state has the participants' scratch, for the
    // experts of at most `whole` of the chunk's tokens (the int8 path quantizes its inputs in
    // one shared buffer: it keeps the row split).
    let whole = State::whole_expert_tokens(st.chunk);
    let parallel = pool.threads() > 1 && k.int8_isa().is_none()
        && st.expert_par.len() >= State::participants(pool.threads()) * State::participant_floats(h, inter, whole);
    experts.with_records(layer, &wanted, ahead, &mut |layout, batch| {
        let ids = &st.route_ids[..n * top_k];
        let mut alone = 0;
        if parallel && batch.len() > 1 {
            let bufs = ParallelBufs { x: &st.h[..n * h], ids, top_k, out: &mut st.expert_out, scratch: &mut st.expert_par };
            experts_in_parallel(cfg, k, pool, w, bufs, layout, batch, whole);
            alone = whole;
        }
        for r in batch.iter().filter(|r| tokens_of(ids, r.expert) > alone) {
            let m = gather_inputs(&st.h[..n * h], h, ids, top_k, r.expert, &mut st.xs);
            let bufs = ExpertBufs { gate: &mut st.gate[..m * inter], up: &mut st.up[..m * inter], y: &mut st.ys[..m * h] };
            expert_ffn(cfg, k, Exec::Pool(pool), w, layout, *r, &st.xs[..m * h], m, bufs);
            scatter_outputs(&st.ys[..m * h], h, ids, r.expert, &mut st.expert_out);
        }
    })?;
    st.wanted = wanted;
    // Combine in expert-id order per token.
    for t in 0..n {
        let out = &mut st.out[t * h..(t + 1) * h];
        out.fill(0.0);
        let ids = &st.route_ids[t * top_k..(t + 1) * top_k];
        let mut order = [0usize; MAX_TOP_K];
        let order = &mut order[..top_k];
        for (i, o) in order.iter_mut().enumerate() {
            *o = i;
        }
        order.sort_unstable_by_key(|&s| ids[s]);
        for &s in order.iter() {
            let wgt = st.route_w[t * top_k + s];
            let y = &st.expert_out[(t * top_k + s) * h..(t * top_k + s + 1) * h];
            for (o, v) in out.iter_mut().zip(y) {
                *o += v * wgt;
            }
        }
    }
    match &w.shared {
        Some((mlp, Some(gate))) => shared_expert(k, pool, st, mlp, gate, n, h),
        Some((mlp, None)) => plain_shared_expert(k, pool, st, mlp, n),
        None => {}
    }
    Ok(())
}

/// The buffers of one expert's FFN over `m` inputs: gate and up (m × intermediate), the
/// output (m × hidden).
struct ExpertBufs<'a> {
    gate: &'a mut [f32],
    up: &'a mut [f32],
    y: &'a mut [f32],
}

/// How an expert's products run: rows split across the pool, or all on the calling thread
/// with its own room for split inputs ([`Kernels::rows_alone`]).
enum Exec<'a> {
    Pool(&'a Pool),
    Alone(&'a mut [f32]),
}

/// One routed expert over its `m` gathered inputs `x`: y = down(act(gate·x, up·x)), SwiGLU or
/// gpt-oss's clamped form with its biases. Each row's value is the same however the products
/// run ([`Kernels::matmul`] does not depend on the thread count).
#[allow(clippy::too_many_arguments)]
fn expert_ffn(cfg: &ModelConfig, k: &Kernels, mut exec: Exec, w: &MoeWeights, layout: &RecordLayout, r: Record,
              x: &[f32], m: usize, b: ExpertBufs) {
    let [gate, up, down] = record_matrices(layout, r.bytes);
    match &mut exec {
        Exec::Pool(pool) => k.matmul_group(pool, x, m, &mut [(gate, &mut *b.gate), (up, &mut *b.up)]),
        Exec::Alone(split) => {
            k.rows_alone(gate, x, m, b.gate, split);
            k.rows_alone(up, x, m, b.up, split);
        }
    }
    match (&w.expert_bias, &cfg.gpt_oss) {
        (Some(bias), Some(g)) => super::gpt_oss::expert_activation(g, bias, r.expert, b.gate, b.up),
        _ => kernels::swiglu(b.gate, b.up),
    }
    match exec {
        Exec::Pool(pool) => k.matmul(pool, down, b.gate, m, b.y),
        Exec::Alone(split) => k.rows_alone(down, b.gate, m, b.y, split),
    }
    if let Some(bias) = &w.expert_bias {
        for row in b.y.chunks_exact_mut(down.rows) {
            super::add_rows(row, bias.down(r.expert), down.rows);
        }
    }
}

/// How many of the chunk's tokens chose expert `e` (a token's top-k ids are distinct).
fn tokens_of(ids: &[u32], e: u32) -> usize {
    ids.iter().filter(|&&id| id == e).count()
}

/// The (token, slot) positions of `ids` (n × top-k) that chose expert `e`, in order.
fn slots_of(ids: &[u32], e: u32) -> impl Iterator<Item = usize> + '_ {
    ids.iter().enumerate().filter(move |&(_, &id)| id == e).map(|(s, _)| s)
}

/// Copies the inputs (rows of `x`, `h` wide) of the tokens that chose expert `e` into the
/// leading rows of `xs`, in slot order; returns how many. `xs` holds at least that many rows.
fn gather_inputs(x: &[f32], h: usize, ids: &[u32], top_k: usize, e: u32, xs: &mut [f32]) -> usize {
    let mut m = 0;
    for (row, s) in xs.chunks_exact_mut(h).zip(slots_of(ids, e)) {
        let t = s / top_k;
        row.copy_from_slice(&x[t * h..(t + 1) * h]);
        m += 1;
    }
    m
}

/// Writes expert `e`'s output rows `ys`, gathered by [`gather_inputs`], to their (token, slot)
/// rows of `out`.
fn scatter_outputs(ys: &[f32], h: usize, ids: &[u32], e: u32, out: &mut [f32]) {
    for (row, s) in ys.chunks_exact(h).zip(slots_of(ids, e)) {
        out[s * h..(s + 1) * h].copy_from_slice(row);
    }
}

/// What [`experts_in_parallel`] reads and writes: the chunk's inputs (n × hidden), the experts
/// each token chose (n × top-k), every (token, slot) output (n × top-k × hidden), the
/// participants' scratch.
struct ParallelBufs<'a> {
    x: &'a [f32],
    ids: &'a [u32],
    top_k: usize,
    out: &'a mut [f32],
    scratch: &'a mut [f32],
}

/// A batch of records with whole experts split across the pool: each participant takes the
/// next expert not yet taken, gathers its tokens' inputs, computes it alone with the same
/// kernels and writes its outputs to their (token, slot) rows. The pool hands off once per
/// batch instead of twice per expert, and a participant the system delays leaves its share
/// to the others instead of holding a product's barrier (decode +2-3 % in RAM, prefill +10 %,
/// on the Qwen3-30B-A3B shape: docs/BENCHMARKS.md). Every expert's output is its
/// [`expert_ffn`] on one thread: the same bits as its rows split across threads. Experts
/// more than `whole` tokens chose are left to the caller.
#[allow(clippy::too_many_arguments)]
fn experts_in_parallel(cfg: &ModelConfig, k: &Kernels, pool: &Pool, w: &MoeWeights, b: ParallelBufs,
                       layout: &RecordLayout, batch: &[Record], whole: usize) {
    // The state's scratch is sized by the config's widths, which every record layout has
    // (the manifest is checked against them).
    let (h, inter) = (cfg.hidden, cfg.moe.as_ref().map_or(0, |m| m.expert_intermediate));
    let mut parts = b.scratch.chunks_exact_mut(State::participant_floats(h, inter, whole));
    let scratch: [Mutex<Option<&mut [f32]>>; RECORD_BATCH] = std::array::from_fn(|_| Mutex::new(parts.next()));
    let (x, ids, top_k) = (b.x, b.ids, b.top_k);
    let out = Mutex::new(b.out);
    let taken = AtomicUsize::new(0);
    pool.run(&|part| {
        let Some(mut scratch) = scratch.get(part).map(lock) else { return };
        let Some(scratch) = scratch.as_deref_mut() else { return };
        let (xs, rest) = scratch.split_at_mut(whole * h);
        let (ys, rest) = rest.split_at_mut(whole * h);
        let (gate, rest) = rest.split_at_mut(whole * inter);
        let (up, split) = rest.split_at_mut(whole * inter);
        loop {
            let i = taken.fetch_add(1, Ordering::Relaxed);
            let Some(&r) = batch.get(i) else { return };
            if tokens_of(ids, r.expert) > whole {
                continue;
            }
            let m = gather_inputs(x, h, ids, top_k, r.expert, xs);
            let bufs = ExpertBufs { gate: &mut gate[..m * inter], up: &mut up[..m * inter], y: &mut ys[..m * h] };
            expert_ffn(cfg, k, Exec::Alone(&mut *split), w, layout, r, &xs[..m * h], m, bufs);
            scatter_outputs(&ys[..m * h], h, ids, r.expert, &mut lock(&out));
        }
    });
}

/// A poisoned lock only means a kernel panicked in another participant; the pool passes that
/// panic on, and nothing reads these buffers after it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The look-ahead's guess of the next MoE layers' experts, from their routers applied to this
/// layer's input; returns, per depth, how many ids lead that depth's part of `st.ahead_ids`
/// (0: no guess). A decode step guesses each router's top-k, [`AHEAD_DEPTH`] layers ahead.
/// A prefill chunk guesses only the next layer, the union of its tokens' top-k, so the
/// next layer's records stream in behind this layer's while it computes instead of after it —
/// but only when the cache has slots for both layers' experts at once (this layer's `wanted`
/// and the guess): in a smaller one the guesses would take slots this layer's misses are
/// waiting for and be evicted again before their layer comes.
#[allow(clippy::too_many_arguments)]
fn guess_next_experts(k: &Kernels, pool: &Pool, st: &mut State, next: &NextRouters, n: usize,
                      (h, ne, top_k): (usize, usize, usize), wanted: usize, slots: usize) -> [usize; AHEAD_DEPTH] {
    let mut guessed = [0; AHEAD_DEPTH];
    if n == 1 {
        for (d, router) in next.iter().enumerate() {
            let Some((_, router)) = router else { break };
            k.matmul(pool, router.view(), &st.h[..h], 1, &mut st.ahead_logits);
            let ids = &mut st.ahead_ids[ahead_ids_start(d, ne, top_k)..][..top_k];
            top_k_ids(&st.ahead_logits, ids);
            ids.sort_unstable();
            guessed[d] = top_k;
        }
        return guessed;
    }
    let Some((_, router)) = next[0] else { return guessed };
    if slots < wanted + ne.min(n * top_k) {
        return guessed;
    }
    // This layer's router logits have been routed: their buffer takes the next layer's.
    k.matmul(pool, router.view(), &st.h[..n * h], n, &mut st.router[..n * ne]);
    let marks = &mut st.ahead_ids[..ne];
    marks.fill(0);
    let mut ids = [0u32; 64];
    for row in st.router[..n * ne].chunks_exact(ne) {
        top_k_ids(row, &mut ids[..top_k]);
        for &e in &ids[..top_k] {
            marks[e as usize] = 1;
        }
    }
    // The marked ids, in order, in place (the write index never passes the read index).
    let mut count = 0;
    for e in 0..ne {
        if marks[e] != 0 {
            marks[count] = e as u32;
            count += 1;
        }
    }
    guessed[0] = count;
    guessed
}

/// Qwen2-MoE: out += σ(h·w_sg) · SwiGLU_shared(h) (spec §2.2).
fn shared_expert(k: &Kernels, pool: &Pool, st: &mut State, mlp: &Mlp, gate: &Matrix, n: usize, h: usize) {
    let inter = mlp.gate.w.rows;
    k.matmul_group(pool, &st.h, n, &mut [(mlp.gate.w.view(), &mut st.gate[..]), (mlp.up.w.view(), &mut st.up[..])]);
    kernels::swiglu(&mut st.gate[..n * inter], &st.up[..n * inter]);
    k.matmul(pool, mlp.down.w.view(), &st.gate, n, &mut st.ys);
    let mut g = [0.0f32; 1];
    for t in 0..n {
        k.matmul(pool, gate.view(), &st.h[t * h..(t + 1) * h], 1, &mut g);
        let s = 1.0 / (1.0 + (-g[0]).exp());
        for (o, v) in st.out[t * h..(t + 1) * h].iter_mut().zip(&st.ys[t * h..(t + 1) * h]) {
            *o += s * v;
        }
    }
}

/// DeepSeek / Kimi: out += SwiGLU_shared(h), no gate, added after the routed experts as the
/// reference does (spec §3.6 step 8). DeepSeek-V2's `mlp_bias` gives it biases.
fn plain_shared_expert(k: &Kernels, pool: &Pool, st: &mut State, mlp: &Mlp, n: usize) {
    let inter = mlp.gate.w.rows;
    k.matmul_group(pool, &st.h, n, &mut [(mlp.gate.w.view(), &mut st.gate[..]), (mlp.up.w.view(), &mut st.up[..])]);
    super::add_bias(&mlp.gate, n, &mut st.gate);
    super::add_bias(&mlp.up, n, &mut st.up);
    kernels::swiglu(&mut st.gate[..n * inter], &st.up[..n * inter]);
    super::linear(k, pool, &mlp.down, &st.gate, n, &mut st.ys);
    let len = n * mlp.down.w.rows;
    for (o, v) in st.out[..len].iter_mut().zip(&st.ys[..len]) {
        *o += v;
    }
}
