//! The run state of a decoder, in two parts: the scratch buffers of a forward pass, which the
//! model owns ([`State`]), and what a conversation keeps across tokens — the K/V cache, the MLA
//! latent cache, the KDA recurrent and convolution state, the position — which each session
//! owns ([`SessionCache`]) and lends to the model for the passes it runs. Both are sized once
//! (at open, at session creation) so that decoding allocates nothing.
//!
//! Two views of the same bytes: `plan_bytes` predicts them from the config (the memory plan,
//! nothing allocated) and `heap_bytes` sums the capacities of the buffers actually allocated.
//! `tests/budget.rs` checks that they agree for every model.


use super::latent::{LatentState, Sizes as LatentSizes};
use crate::error::Result;
use crate::format::config::{ModelConfig, QkNorm};
use crate::sys::{vec_bytes, AlignedBuf, Floats};

/// What one conversation holds across tokens: everything a forward pass reads back from earlier
/// positions. Only the layers with ordinary attention keep keys and values; MLA layers keep a
/// latent row per position and KDA layers a fixed-size recurrent and convolution state.
pub struct SessionCache {
    /// Keys, `[attention layer][position][kv_dim]`.
    pub k: AlignedBuf,
    /// Values, `[attention layer][position][kv_dim]`.
    pub v: AlignedBuf,
    /// Per MLA layer, ctx positions of [normalised latent c (r) | rotated k_pe (d_r)].
    pub mla: Vec<f32>,
    /// Per KDA layer, H recurrent states of D × D (row = key channel).
    pub kda_state: Vec<f32>,
    /// Per KDA layer, the last K − 1 pre-convolution q, k and v projections (oldest first).
    pub kda_conv: Vec<f32>,
    /// Tokens whose state is held (the next token's position).
    pub pos: usize,
}

impl SessionCache {
    /// Bytes a session's cache holds for a model of `cfg` with context `ctx`.
    pub fn plan_bytes(cfg: &ModelConfig, ctx: usize) -> u64 {
        let kv = 2 * (cfg.kv_cache_layers() * ctx * cfg.kv_dim()) as u64 * 4;
        kv + LatentSizes::of(cfg, ctx, 1, 1).state() as u64 * 4
    }

    /// Allocates a cache (zeroed: position 0).
    pub fn new(cfg: &ModelConfig, ctx: usize) -> Result<SessionCache> {
        let kv = cfg.kv_cache_layers() * ctx * cfg.kv_dim() * 4;
        let s = LatentSizes::of(cfg, ctx, 1, 1);
        Ok(SessionCache {
            k: AlignedBuf::zeroed(kv, 64)?,
            v: AlignedBuf::zeroed(kv, 64)?,
            mla: vec![0.0; s.mla_cache],
            kda_state: vec![0.0; s.kda_state],
            kda_conv: vec![0.0; s.kda_conv],
            pos: 0,
        })
    }

    /// A cache of nothing: what the model's state holds while no session is lent to it.
    pub fn empty() -> SessionCache {
        SessionCache { k: AlignedBuf::empty(64), v: AlignedBuf::empty(64), mla: Vec::new(), kda_state: Vec::new(),
            kda_conv: Vec::new(), pos: 0 }
    }

    /// Bytes held, from the buffers (what `plan_bytes` predicts).
    pub fn heap_bytes(&self) -> u64 {
        (self.k.len() + self.v.len()) as u64 + vec_bytes(&self.mla) + vec_bytes(&self.kda_state) + vec_bytes(&self.kda_conv)
    }

    /// True when the state of the first `n` held tokens can be kept while the rest are dropped:
    /// per-position caches (K/V, MLA latents) can be cut anywhere; a KDA recurrent state has
    /// folded every token in and can only be kept whole (`n == pos`) or dropped (`n == 0`).
    pub fn can_truncate(&self, n: usize) -> bool {
        n == self.pos || n == 0 || self.kda_state.is_empty()
    }
}

/// The scratch activations of a forward pass, and the session cache lent to it.
pub struct State {
    /// The cache of the session being run, lent for the duration of a call (`Model::run`);
    /// empty otherwise.
    pub(crate) cache: SessionCache,
    /// Positions a session's cache holds (every session of a model has the same context).
    pub(crate) ctx: usize,
    /// Tokens a forward pass processes at once (prefill chunk).
    pub(crate) chunk: usize,
    /// Residual stream, chunk × hidden.
    pub(crate) x: Floats,
    /// Normed input of a sublayer, chunk × hidden.
    pub(crate) h: Floats,
    /// chunk × q_dim.
    pub(crate) q: Floats,
    /// chunk × kv_dim.
    pub(crate) k: Floats,
    pub(crate) v: Floats,
    /// Attention output before o_proj, chunk × q_dim.
    pub(crate) att: Floats,
    /// Sublayer output, chunk × hidden.
    pub(crate) out: Floats,
    /// FFN gate and up, chunk × ffn width.
    pub(crate) gate: Floats,
    pub(crate) up: Floats,
    /// Attention scores, one row per pool participant of `ctx` per head of a key-value group
    /// (`kernels::attention::score_floats`).
    pub(crate) scores: Floats,
    /// RoPE tables for the chunk's positions, chunk × rope_dim/2 each.
    pub(crate) cos: Floats,
    pub(crate) sin: Floats,
    /// Logits: `logit_rows` rows of vocab; row 0 holds the last position's after a pass.
    pub(crate) logits: Floats,
    /// Rows of `logits` (the prefill chunk, capped so the buffer stays near 8 MiB).
    pub(crate) logit_rows: usize,
    /// MoE: router logits (chunk × experts), then each token's chosen experts and weights
    /// (chunk × top_k), the distinct experts of the chunk, the rows gathered for one expert
    /// and the (token, slot) they came from, that expert's output, and every (token, slot)
    /// output (chunk × top_k × hidden).
    pub(crate) router: Floats,
    pub(crate) route_ids: Vec<u32>,
    pub(crate) route_w: Floats,
    pub(crate) wanted: Vec<u32>,
    pub(crate) xs: Floats,
    pub(crate) ys: Floats,
    pub(crate) expert_out: Floats,
    /// Experts computed whole, one per pool participant (`moe::experts_in_parallel`): each
    /// participant's scratch ([`State::participant_floats`]) for experts of up to
    /// [`State::whole_expert_tokens`] tokens, for at most a batch of records' worth of them.
    pub(crate) expert_par: Floats,
    /// Router look-ahead: the next MoE layer's logits for a decode step's input, and the
    /// experts guessed (top-k for a decode step; for a prefill chunk, one mark per expert, then
    /// the marked ids).
    pub(crate) ahead_logits: Floats,
    pub(crate) ahead_ids: Vec<u32>,
    /// One q/k norm group, for normalising in place (head_dim, or q/k width for a whole norm).
    pub(crate) norm_tmp: Floats,
    /// DeepSeek / Kimi: the scratch of the MLA and KDA layers.
    pub(crate) latent: LatentState,
}

/// The logits buffer is at most about this large: a pass over a prefill chunk computes every
/// row's logits (for [`crate::Model::eval_each`]) a group of rows at a time.
const LOGIT_BUFFER_BYTES: usize = 8 << 20;

/// The element counts of every buffer of a [`State`], by field; the one description both
/// the plan and the allocation read.
struct Sizes {
    f32s: [usize; 21],
    u32s: [usize; 3],
}

impl Sizes {
    fn new(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> Sizes {
        let (h, qd, kvd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
        let ffn = State::ffn_width(cfg);
        let (experts, top_k) = cfg.moe.as_ref().map_or((0, 0), |m| (m.experts, m.top_k));
        let moe_rows = if experts > 0 { chunk } else { 0 };
        let half = chunk * cfg.rope.dim / 2;
        // `moe::experts_in_parallel`: only with more than one participant.
        let par = match cfg.moe.as_ref() {
            Some(m) if threads > 1 => State::participants(threads)
                * State::participant_floats(h, m.expert_intermediate, State::whole_expert_tokens(chunk)),
            _ => 0,
        };
        Sizes {
            // x, h, q, k, v, att, out, gate, up, scores, cos, sin, logits, router, route_w,
            // xs, ys, expert_out, ahead_logits, norm_tmp, expert_par
            f32s: [chunk * h, chunk * h, chunk * qd, chunk * kvd, chunk * kvd, chunk * qd, chunk * h,
                chunk * ffn, chunk * ffn, threads * crate::kernels::attention::score_floats(cfg.heads / cfg.kv_heads.max(1), ctx), half, half, State::logit_rows(cfg, chunk) * cfg.vocab,
                chunk * experts, chunk * top_k, moe_rows * h, moe_rows * h, chunk * top_k * h, experts,
                State::norm_width(cfg), par],
            // route_ids, wanted, ahead_ids
            u32s: [chunk * top_k, chunk * top_k, super::moe::ahead_ids_start(super::moe::AHEAD_DEPTH, experts, top_k)],
        }
    }
}

impl State {
    /// Scratch bytes the state will hold for a model of `cfg` with context `ctx`, prefill
    /// `chunk` and `threads` pool participants. The memory plan uses this without allocating;
    /// [`State::heap_bytes`] measures the same after [`State::new`].
    pub fn plan_bytes(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> u64 {
        let s = Sizes::new(cfg, ctx, chunk, threads);
        let scratch = s.f32s.iter().map(|&n| Floats::plan_bytes(n)).sum::<u64>() + s.u32s.iter().sum::<usize>() as u64 * 4;
        scratch + LatentState::plan_bytes(cfg, ctx, chunk, threads)
    }

    /// Scratch bytes this state holds, from its buffers, every vector counted by its capacity
    /// (a session's cache lent to it is counted with the session).
    pub fn heap_bytes(&self) -> u64 {
        let f32s = [&self.x, &self.h, &self.q, &self.k, &self.v, &self.att, &self.out, &self.gate, &self.up,
            &self.scores, &self.cos, &self.sin, &self.logits, &self.router, &self.route_w, &self.xs, &self.ys,
            &self.expert_out, &self.ahead_logits, &self.norm_tmp, &self.expert_par];
        let u32s = [&self.route_ids, &self.wanted, &self.ahead_ids];
        let scratch = f32s.iter().map(|v| v.heap_bytes()).sum::<u64>() + u32s.iter().map(|v| vec_bytes(v)).sum::<u64>();
        scratch + self.latent.heap_bytes()
    }

    /// Most of a chunk's tokens an expert computed whole by one pool participant may have
    /// (`moe::experts_in_parallel`): the participants' scratch holds this many, or the chunk if
    /// shorter; an expert more tokens chose has its rows split across the pool instead.
    pub(crate) const WHOLE_EXPERT_TOKENS: usize = 64;

    /// The tokens a whole expert may have with prefill chunks of `chunk` tokens.
    pub(crate) fn whole_expert_tokens(chunk: usize) -> usize {
        chunk.clamp(1, Self::WHOLE_EXPERT_TOKENS)
    }

    /// Participants computing whole experts with `threads` pool threads (a batch of records
    /// holds at most [`crate::cache::RECORD_BATCH`]).
    pub(crate) fn participants(threads: usize) -> usize {
        threads.min(crate::cache::RECORD_BATCH)
    }

    /// One participant's scratch, in f32s, for experts of up to `m` tokens: their gathered
    /// inputs and outputs (m × hidden each), gate and up (m × expert width each), and the
    /// inputs split for the kernels that take them so, by parity or in bf16 parts for the AMX
    /// tiles (`kernels::split_room` of m and the wider of hidden and the expert width, and the
    /// room to start them on a 64-byte boundary).
    pub(crate) fn participant_floats(hidden: usize, inter: usize, m: usize) -> usize {
        m * (2 * hidden + 2 * inter) + crate::kernels::split_room(m, hidden.max(inter)) + Floats::ROOM
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

    /// Bytes of the int8 path's activation buffer (`Options::activations`): one prefill
    /// chunk of the widest product input (hidden, attention output or FFN width).
    pub fn int8_scratch_bytes(cfg: &ModelConfig, chunk: usize) -> u64 {
        crate::kernels::int8::scratch_bytes(Self::int8_values(cfg, chunk))
    }

    /// Bytes of the int16 path's activation buffer, as [`State::int8_scratch_bytes`].
    pub fn int16_scratch_bytes(cfg: &ModelConfig, chunk: usize) -> u64 {
        crate::kernels::int16::scratch_bytes(Self::int8_values(cfg, chunk))
    }

    /// Inputs the kernels' split-input buffer holds ([`crate::kernels::Kernels::with_split_buffer`]):
    /// [`crate::kernels::SPLIT_VECTORS`] vectors, or the chunk if shorter (`kernels::split_vectors`),
    /// of the widest input.
    pub fn split_values(cfg: &ModelConfig, chunk: usize) -> usize {
        Self::int8_values(cfg, crate::kernels::split_vectors(chunk))
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
            ahead_logits, norm_tmp, expert_par] = s.f32s.map(Floats::zeroed);
        let [route_ids, wanted, ahead_ids] = s.u32s;
        Ok(State {
            cache: SessionCache::empty(),
            ctx,
            chunk,
            x, h, q, k, v, att, out, gate, up, scores, cos, sin, logits,
            logit_rows: Self::logit_rows(cfg, chunk),
            router,
            route_ids: vec![0; route_ids],
            route_w,
            wanted: Vec::with_capacity(wanted),
            xs,
            ys,
            expert_out,
            expert_par,
            ahead_logits,
            ahead_ids: vec![0; ahead_ids],
            norm_tmp,
            latent: LatentState::new(cfg, ctx, chunk, threads),
        })
    }
}
