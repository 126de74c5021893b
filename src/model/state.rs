//! The run state of a decoder: the KV cache and the scratch buffers of a forward pass, sized
//! once at open so that decoding allocates nothing.

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
}

impl State {
    /// Bytes the state will hold for a model of `cfg` with context `ctx`, prefill `chunk` and
    /// `threads` pool participants (the memory plan uses this without allocating).
    pub fn plan_bytes(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> (u64, u64) {
        let kv = 2 * cfg.layers as u64 * ctx as u64 * cfg.kv_dim() as u64 * 4;
        let scratch = Self::scratch_floats(cfg, ctx, chunk, threads) as u64 * 4;
        (kv, scratch)
    }

    fn ffn_width(cfg: &ModelConfig) -> usize {
        let moe = cfg.moe.as_ref().map_or(0, |m| m.expert_intermediate.max(m.shared_intermediate));
        cfg.intermediate.max(moe)
    }

    fn scratch_floats(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> usize {
        let ffn = Self::ffn_width(cfg);
        chunk * (3 * cfg.hidden + 2 * cfg.q_dim() + 2 * cfg.kv_dim() + 2 * ffn + cfg.rope.dim)
            + threads * ctx
            + cfg.vocab
    }

    /// Allocates the state.
    pub fn new(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> Result<State> {
        let kv_bytes = cfg.layers * ctx * cfg.kv_dim() * 4;
        let ffn = Self::ffn_width(cfg);
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
        })
    }
}
