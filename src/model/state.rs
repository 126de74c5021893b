//! The run state of a decoder: the KV cache and the scratch buffers of a forward pass, sized
//! once at open so that decoding allocates nothing.

use super::latent::LatentState;
use crate::error::Result;
use crate::format::config::ModelConfig;
use crate::sys::AlignedBuf;

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
    /// Logits of the last position.
    pub logits: Vec<f32>,
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
    /// DeepSeek / Kimi (wp-mla): the MLA latent cache and the KDA recurrent and convolution
    /// state, which replace the K/V cache of those layers, and their scratch.
    pub latent: LatentState,
}

impl State {
    /// Bytes the state will hold for a model of `cfg` with context `ctx`, prefill `chunk` and
    /// `threads` pool participants (the memory plan uses this without allocating).
    pub fn plan_bytes(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> (u64, u64) {
        let kv = 2 * cfg.kv_cache_layers() as u64 * ctx as u64 * cfg.kv_dim() as u64 * 4;
        let scratch = Self::scratch_floats(cfg, ctx, chunk, threads) as u64 * 4;
        let (latent_state, latent_scratch) = LatentState::plan_bytes(cfg, ctx, chunk, threads);
        (kv + latent_state, scratch + latent_scratch)
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

    fn scratch_floats(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> usize {
        let ffn = Self::ffn_width(cfg);
        let (experts, top_k) = cfg.moe.as_ref().map_or((0, 0), |m| (m.experts, m.top_k));
        let moe = if experts == 0 { 0 } else {
            // router, route ids (u32) and weights, wanted (u32), xs, xs_slot (usize = 2 floats), ys, expert_out
            chunk * experts + 2 * chunk * top_k + chunk * top_k + 2 * chunk * cfg.hidden + 2 * chunk + chunk * top_k * cfg.hidden
                + experts + top_k
        };
        chunk * (3 * cfg.hidden + 2 * cfg.q_dim() + 2 * cfg.kv_dim() + 2 * ffn + cfg.rope.dim)
            + threads * ctx
            + cfg.vocab
            + moe
    }

    /// Allocates the state.
    pub fn new(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> Result<State> {
        let kv_bytes = cfg.kv_cache_layers() * ctx * cfg.kv_dim() * 4;
        let ffn = Self::ffn_width(cfg);
        let (experts, top_k) = cfg.moe.as_ref().map_or((0, 0), |m| (m.experts, m.top_k));
        Ok(State {
            k_cache: AlignedBuf::zeroed(kv_bytes, 64)?,
            v_cache: AlignedBuf::zeroed(kv_bytes, 64)?,
            ctx,
            pos: 0,
            chunk,
            x: vec![0.0; chunk * cfg.hidden],
            h: vec![0.0; chunk * cfg.hidden],
            q: vec![0.0; chunk * cfg.q_dim()],
            k: vec![0.0; chunk * cfg.kv_dim()],
            v: vec![0.0; chunk * cfg.kv_dim()],
            att: vec![0.0; chunk * cfg.q_dim()],
            out: vec![0.0; chunk * cfg.hidden],
            gate: vec![0.0; chunk * ffn],
            up: vec![0.0; chunk * ffn],
            scores: vec![0.0; threads * ctx],
            cos: vec![0.0; chunk * cfg.rope.dim / 2],
            sin: vec![0.0; chunk * cfg.rope.dim / 2],
            logits: vec![0.0; cfg.vocab],
            router: vec![0.0; chunk * experts],
            route_ids: vec![0; chunk * top_k],
            route_w: vec![0.0; chunk * top_k],
            wanted: Vec::with_capacity(chunk * top_k),
            xs: vec![0.0; if experts > 0 { chunk * cfg.hidden } else { 0 }],
            xs_slot: vec![0; if experts > 0 { chunk } else { 0 }],
            ys: vec![0.0; if experts > 0 { chunk * cfg.hidden } else { 0 }],
            expert_out: vec![0.0; chunk * top_k * cfg.hidden],
            ahead_logits: vec![0.0; experts],
            ahead_ids: vec![0; top_k],
            latent: LatentState::new(cfg, ctx, chunk, threads),
        })
    }
}
