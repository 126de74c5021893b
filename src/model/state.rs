//! The run state of a decoder: the KV cache and the scratch buffers of a forward pass, sized
//! once at open so that decoding allocates nothing.
//!
//! Two views of the same bytes: [`State::plan_bytes`] predicts them from the config (the
//! memory plan, nothing allocated) and [`State::heap_bytes`] sums the capacities of the
//! buffers actually allocated. `tests/budget.rs` checks that they agree for every model.

use super::latent::LatentState;
use crate::error::Result;
use crate::format::config::{ModelConfig, QkNorm};
use crate::sys::{vec_bytes, AlignedBuf};

/// KV cache and scratch activations.
pub struct State {
    /// Keys, [layer][position][kv_dim].
    pub k_cache: AlignedBuf,
    /// Values, [layer][position][kv_dim].
    pub v_cache: AlignedBuf,
    /// Positions the cache can hold.
    pub ctx: usize,
    /// Tokens in the cache so far.
    pub pos: usize,
    /// Tokens a forward pass processes at once (prefill chunk).
    pub chunk: usize,
    /// Residual stream, chunk × hidden.
    pub x: Vec<f32>,
    /// Normed input of a sublayer, chunk × hidden.
    pub h: Vec<f32>,
    /// chunk × q_dim.
    pub q: Vec<f32>,
    /// chunk × kv_dim.
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Attention output before o_proj, chunk × q_dim.
    pub att: Vec<f32>,
    /// Sublayer output, chunk × hidden.
    pub out: Vec<f32>,
    /// FFN gate and up, chunk × ffn width.
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// Attention scores, one row of `ctx` per pool participant.
    pub scores: Vec<f32>,
    /// RoPE tables for the chunk's positions, chunk × rope_dim/2 each.
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    /// Logits: `logit_rows` rows of vocab; row 0 holds the last position's after a pass.
    pub logits: Vec<f32>,
    /// Rows of `logits` (the prefill chunk, capped so the buffer stays near 8 MiB).
    pub logit_rows: usize,
    /// MoE: router logits (chunk × experts), then each token's chosen experts and weights
    /// (chunk × top_k), the distinct experts of the chunk, the rows gathered for one expert
    /// and the (token, slot) they came from, that expert's output, and every (token, slot)
    /// output (chunk × top_k × hidden).
    pub router: Vec<f32>,
    pub route_ids: Vec<u32>,
    pub route_w: Vec<f32>,
    pub wanted: Vec<u32>,
    pub xs: Vec<f32>,
    pub xs_slot: Vec<usize>,
    pub ys: Vec<f32>,
    pub expert_out: Vec<f32>,
    /// Router look-ahead: the next MoE layer's logits for this layer's input, and the experts
    /// they pick.
    pub ahead_logits: Vec<f32>,
    pub ahead_ids: Vec<u32>,
    /// One q/k norm group, for normalising in place (head_dim, or q/k width for a whole norm).
    pub norm_tmp: Vec<f32>,
    /// Token history of a generation (prompt and generated ids): room for the whole context.
    pub history: Vec<u32>,
    /// DeepSeek / Kimi: the MLA latent cache and the KDA recurrent and convolution state,
    /// which replace the K/V cache of those layers, and their scratch.
    pub latent: LatentState,
}

/// The logits buffer is at most about this large: a pass over a prefill chunk computes every
/// row's logits (for [`crate::Model::eval_each`]) a group of rows at a time.
const LOGIT_BUFFER_BYTES: usize = 8 << 20;

/// The element counts of every buffer of a [`State`], by field; the one description both
/// the plan and the allocation read.
struct Sizes {
    kv: usize,
    f32s: [usize; 20],
    u32s: [usize; 4],
    usizes: usize,
}

impl Sizes {
    fn new(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> Sizes {
        let (h, qd, kvd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
        let ffn = State::ffn_width(cfg);
        let (experts, top_k) = cfg.moe.as_ref().map_or((0, 0), |m| (m.experts, m.top_k));
        let moe_rows = if experts > 0 { chunk } else { 0 };
        let half = chunk * cfg.rope.dim / 2;
        Sizes {
            // Only the layers with ordinary attention keep keys and values (MLA and KDA layers
            // keep their own state, `LatentState`).
            kv: cfg.kv_cache_layers() * ctx * kvd * 4,
            // x, h, q, k, v, att, out, gate, up, scores, cos, sin, logits, router, route_w,
            // xs, ys, expert_out, ahead_logits, norm_tmp
            f32s: [chunk * h, chunk * h, chunk * qd, chunk * kvd, chunk * kvd, chunk * qd, chunk * h,
                chunk * ffn, chunk * ffn, threads * ctx, half, half, State::logit_rows(cfg, chunk) * cfg.vocab,
                chunk * experts, chunk * top_k, moe_rows * h, moe_rows * h, chunk * top_k * h, experts,
                State::norm_width(cfg)],
            // route_ids, wanted, ahead_ids, history
            u32s: [chunk * top_k, chunk * top_k, top_k, ctx + 1],
            usizes: moe_rows,
        }
    }
}

impl State {
    /// Bytes the state will hold for a model of `cfg` with context `ctx`, prefill `chunk` and
    /// `threads` pool participants: (KV cache, scratch). The memory plan uses this without
    /// allocating; [`State::heap_bytes`] measures the same after [`State::new`].
    pub fn plan_bytes(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> (u64, u64) {
        let s = Sizes::new(cfg, ctx, chunk, threads);
        let scratch = s.f32s.iter().sum::<usize>() * 4 + s.u32s.iter().sum::<usize>() * 4 + s.usizes * std::mem::size_of::<usize>();
        let (latent_state, latent_scratch) = LatentState::plan_bytes(cfg, ctx, chunk, threads);
        (2 * s.kv as u64 + latent_state, scratch as u64 + latent_scratch)
    }

    /// Bytes this state holds, from its buffers: (KV cache, scratch), every vector counted by
    /// its capacity.
    pub fn heap_bytes(&self) -> (u64, u64) {
        let f32s = [&self.x, &self.h, &self.q, &self.k, &self.v, &self.att, &self.out, &self.gate, &self.up,
            &self.scores, &self.cos, &self.sin, &self.logits, &self.router, &self.route_w, &self.xs, &self.ys,
            &self.expert_out, &self.ahead_logits, &self.norm_tmp];
        let u32s = [&self.route_ids, &self.wanted, &self.ahead_ids, &self.history];
        let scratch = f32s.iter().map(|v| vec_bytes(v)).sum::<u64>() + u32s.iter().map(|v| vec_bytes(v)).sum::<u64>()
            + vec_bytes(&self.xs_slot);
        let (latent_state, latent_scratch) = self.latent.heap_bytes();
        ((self.k_cache.len() + self.v_cache.len()) as u64 + latent_state, scratch + latent_scratch)
    }

    /// Rows of logits one pass computes at once: the chunk, capped so that the buffer stays
    /// within about 8 MiB (at least one row).
    pub fn logit_rows(cfg: &ModelConfig, chunk: usize) -> usize {
        chunk.min((LOGIT_BUFFER_BYTES / (4 * cfg.vocab.max(1))).max(1))
    }

    /// Width of one q/k norm group (0 without q/k norm).
    fn norm_width(cfg: &ModelConfig) -> usize {
        match cfg.qk_norm {
            QkNorm::None => 0,
            QkNorm::PerHead => cfg.head_dim,
            QkNorm::Whole => cfg.q_dim().max(cfg.kv_dim()),
        }
    }

    /// Bytes of the int8 path's activation buffer (`Options::int8_activations`): one prefill
    /// chunk of the widest product input (hidden, attention output or FFN width).
    pub fn int8_scratch_bytes(cfg: &ModelConfig, chunk: usize) -> u64 {
        crate::kernels::int8::scratch_bytes(Self::int8_values(cfg, chunk))
    }

    /// Activations the int8 path quantizes at most at once.
    pub fn int8_values(cfg: &ModelConfig, chunk: usize) -> usize {
        chunk * cfg.hidden.max(cfg.q_dim()).max(Self::ffn_width(cfg)).max(LatentState::widest_input(cfg))
    }

    fn ffn_width(cfg: &ModelConfig) -> usize {
        let moe = cfg.moe.as_ref().map_or(0, |m| m.expert_intermediate.max(m.shared_intermediate));
        cfg.intermediate.max(moe)
    }

    /// Allocates the state.
    pub fn new(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> Result<State> {
        let s = Sizes::new(cfg, ctx, chunk, threads);
        let [x, h, q, k, v, att, out, gate, up, scores, cos, sin, logits, router, route_w, xs, ys, expert_out,
            ahead_logits, norm_tmp] = s.f32s.map(|n| vec![0.0f32; n]);
        let [route_ids, wanted, ahead_ids, history] = s.u32s;
        Ok(State {
            k_cache: AlignedBuf::zeroed(s.kv, 64)?,
            v_cache: AlignedBuf::zeroed(s.kv, 64)?,
            ctx,
            pos: 0,
            chunk,
            x, h, q, k, v, att, out, gate, up, scores, cos, sin, logits,
            logit_rows: Self::logit_rows(cfg, chunk),
            router,
            route_ids: vec![0; route_ids],
            route_w,
            wanted: Vec::with_capacity(wanted),
            xs,
            xs_slot: vec![0; s.usizes],
            ys,
            expert_out,
            ahead_logits,
            ahead_ids: vec![0; ahead_ids],
            norm_tmp,
            history: Vec::with_capacity(history),
            latent: LatentState::new(cfg, ctx, chunk, threads),
        })
    }
}
