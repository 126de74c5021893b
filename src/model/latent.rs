//! What the latent-attention families (DeepSeek-V2/V3, Kimi-Linear) add to a decoder: their run
//! state — the MLA latent cache, the KDA recurrent and convolution state, and their scratch —
//! and their FFN weights (a router with its selection bias, shared experts without a gate, and
//! Kimi's dense-MLP alias). The state is sized once at open from one table of buffer lengths
//! ([`Sizes`]), which the memory plan reads too, so plan and allocation cannot disagree.

use super::moe::MoeWeights;
use super::route;
use super::weights::{Ffn, Loader, Mlp};
use crate::error::{Error, ErrorKind, Result};
use crate::format::config::{Mixer, ModelConfig, Routing};

/// Buffer lengths (in floats) of the latent families' state and scratch for one context,
/// prefill chunk and thread count; all zero for the other families.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sizes {
    /// MLA layers × ctx × (kv_lora_rank + qk_rope_head_dim) (spec §3.4).
    pub mla_cache: usize,
    /// KDA layers × H·D·D (spec §4.3 step 6).
    pub kda_state: usize,
    /// KDA layers × 3 streams × (K − 1) × H·D pre-convolution inputs (spec §4.3 step 2).
    pub kda_conv: usize,
    pub mla_q: usize,
    pub mla_qa: usize,
    pub mla_kv: usize,
    pub mla_qabs: usize,
    pub mla_olat: usize,
    pub mla_ov: usize,
    pub mla_att: usize,
    pub mla_rows: usize,
    pub rope_cs: usize,
    pub kda_u: usize,
    pub kda_qkv: usize,
    pub kda_low: usize,
    pub kda_g: usize,
    pub kda_gate: usize,
    pub kda_beta: usize,
    pub kda_o: usize,
    pub kda_pred: usize,
    pub route_scratch: usize,
    /// Entries of [`LatentState::slot`]: one per layer of a latent family, none otherwise.
    pub slots: usize,
}

impl Sizes {
    pub fn of(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> Sizes {
        let route_scratch = cfg.moe.as_ref().map_or(0, route::scratch_len);
        if let Some(g) = cfg.gdn.as_ref() {
            return Sizes { route_scratch, ..gdn_sizes(g, chunk, threads) };
        }
        let Some(m) = cfg.mla.as_ref() else { return Sizes { route_scratch, ..Sizes::default() } };
        let (mla, kda) = (m.count(Mixer::Mla), m.count(Mixer::Kda));
        let mut s = Sizes { route_scratch, slots: cfg.layers, ..Sizes::default() };
        if mla > 0 {
            let h = cfg.heads;
            s.mla_cache = mla * ctx * m.latent_width();
            s.mla_q = chunk * h * m.q_head_dim();
            s.mla_qa = chunk * m.q_lora_rank.unwrap_or(0);
            s.mla_kv = chunk * m.latent_width();
            s.mla_qabs = chunk * h * m.latent_width();
            s.mla_olat = h * chunk * m.kv_lora_rank;
            s.mla_ov = chunk * m.v_dim;
            s.mla_att = chunk * h * m.v_dim;
            s.mla_rows = threads * m.kv_lora_rank;
            s.rope_cs = m.rope_dim;
        }
        if let (true, Some(k)) = (kda > 0, m.kda) {
            let p = k.width();
            s.kda_state = kda * p * k.head_dim;
            s.kda_conv = kda * 3 * (k.conv_kernel - 1) * p;
            s.kda_u = 3 * chunk * p;
            s.kda_qkv = 3 * chunk * p;
            s.kda_low = 2 * chunk * k.head_dim;
            s.kda_g = chunk * p;
            s.kda_gate = chunk * p;
            s.kda_beta = chunk * k.heads;
            s.kda_o = chunk * p;
            s.kda_pred = threads * k.head_dim;
        }
        s
    }

    /// Floats held across tokens: the latent cache and the KDA state (what replaces a K/V cache).
    pub fn state(&self) -> usize {
        self.mla_cache + self.kda_state + self.kda_conv
    }

    /// Floats of per-pass scratch.
    pub fn scratch(&self) -> usize {
        let Sizes { mla_q, mla_qa, mla_kv, mla_qabs, mla_olat, mla_ov, mla_att, mla_rows, rope_cs, kda_u, kda_qkv, kda_low,
            kda_g, kda_gate, kda_beta, kda_o, kda_pred, route_scratch, .. } = *self;
        mla_q + mla_qa + mla_kv + mla_qabs + mla_olat + mla_ov + mla_att + mla_rows + rope_cs + kda_u + kda_qkv + kda_low
            + kda_g + kda_gate + kda_beta + kda_o + kda_pred + route_scratch
    }
}

/// Qwen3-Next's Gated DeltaNet layers ([`super::gdn`]) in KDA's buffers: the state (per linear
/// layer, v_heads matrices of D_k × D_v and K − 1 rows of the q|k|v convolution input) and the
/// scratch as `gdn_block` uses it.
fn gdn_sizes(g: &crate::format::config::GdnConfig, chunk: usize, threads: usize) -> Sizes {
    let (layers, c, vw) = (g.count(), g.conv_width(), g.value_width());
    if layers == 0 {
        return Sizes::default();
    }
    Sizes {
        kda_state: layers * g.v_heads * g.k_dim * g.v_dim,
        kda_conv: layers * (g.conv_kernel - 1) * c,
        kda_u: chunk * (2 * g.key_width() + 2 * vw),
        kda_low: chunk * 2 * g.v_heads,
        kda_qkv: 2 * chunk * c,
        kda_gate: chunk * vw,
        kda_g: chunk * g.v_heads,
        kda_beta: chunk * g.v_heads,
        kda_o: chunk * vw,
        kda_pred: threads * g.v_dim,
        ..Sizes::default()
    }
}

/// The latent families' scratch (empty for the other families); their state across tokens —
/// the MLA latent cache, the KDA recurrent and convolution state — is a session's
/// ([`super::state::SessionCache`]).
#[derive(Default)]
pub struct LatentState {
    /// Per layer: its index among the layers of its mixer kind (its slot in the buffers above).
    pub slot: Vec<usize>,
    pub mla_q: Vec<f32>,
    pub mla_qa: Vec<f32>,
    pub mla_kv: Vec<f32>,
    pub mla_qabs: Vec<f32>,
    pub mla_olat: Vec<f32>,
    pub mla_ov: Vec<f32>,
    pub mla_att: Vec<f32>,
    pub mla_rows: Vec<f32>,
    pub rope_cs: Vec<f32>,
    pub kda_u: Vec<f32>,
    pub kda_qkv: Vec<f32>,
    pub kda_low: Vec<f32>,
    pub kda_g: Vec<f32>,
    pub kda_gate: Vec<f32>,
    pub kda_beta: Vec<f32>,
    pub kda_o: Vec<f32>,
    pub kda_pred: Vec<f32>,
    /// Routing scratch: selection and group scores of one token (spec §3.6, §3.7).
    pub route_scratch: Vec<f32>,
}

impl LatentState {
    /// Scratch bytes for the memory plan.
    pub fn plan_bytes(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> u64 {
        let s = Sizes::of(cfg, ctx, chunk, threads);
        s.scratch() as u64 * 4 + (s.slots * std::mem::size_of::<usize>()) as u64
    }

    /// Scratch bytes held, from the buffers' capacities (what `plan_bytes` predicts).
    pub fn heap_bytes(&self) -> u64 {
        use crate::sys::vec_bytes;
        let scratch: u64 = [&self.mla_q, &self.mla_qa, &self.mla_kv, &self.mla_qabs, &self.mla_olat, &self.mla_ov, &self.mla_att,
            &self.mla_rows, &self.rope_cs, &self.kda_u, &self.kda_qkv, &self.kda_low, &self.kda_g, &self.kda_gate,
            &self.kda_beta, &self.kda_o, &self.kda_pred, &self.route_scratch].iter().map(|v| vec_bytes(v)).sum();
        scratch + vec_bytes(&self.slot)
    }

    pub fn new(cfg: &ModelConfig, ctx: usize, chunk: usize, threads: usize) -> LatentState {
        let s = Sizes::of(cfg, ctx, chunk, threads);
        let mut counts = [0usize; 3];
        let slot = (0..s.slots).map(|l| {
            let kind = cfg.mixer(l) as usize;
            counts[kind] += 1;
            counts[kind] - 1
        }).collect();
        let v = |n: usize| vec![0.0f32; n];
        LatentState {
            slot,
            mla_q: v(s.mla_q), mla_qa: v(s.mla_qa), mla_kv: v(s.mla_kv), mla_qabs: v(s.mla_qabs), mla_olat: v(s.mla_olat),
            mla_ov: v(s.mla_ov), mla_att: v(s.mla_att), mla_rows: v(s.mla_rows), rope_cs: v(s.rope_cs),
            kda_u: v(s.kda_u), kda_qkv: v(s.kda_qkv), kda_low: v(s.kda_low), kda_g: v(s.kda_g), kda_gate: v(s.kda_gate),
            kda_beta: v(s.kda_beta), kda_o: v(s.kda_o), kda_pred: v(s.kda_pred), route_scratch: v(s.route_scratch),
        }
    }

    /// The widest input of a product in these layers, for the int8 path's activation buffer:
    /// q_lora_rank, kv_lora_rank, heads × v_head_dim (MLA), D and H·D (KDA).
    pub fn widest_input(cfg: &ModelConfig) -> usize {
        if let Some(g) = cfg.gdn.as_ref() {
            return g.value_width();
        }
        let Some(m) = cfg.mla.as_ref() else { return 0 };
        let kda = m.kda.map_or(0, |k| k.width().max(k.head_dim));
        m.q_lora_rank.unwrap_or(0).max(m.kv_lora_rank).max(cfg.heads * m.v_dim).max(kda)
    }
}

/// The FFN of layer `l` of a latent family (spec §3.2, §4.2): a dense SwiGLU, or a router with
/// DeepSeek-V3/Kimi's `e_score_correction_bias` and the gate-less `shared_experts`. Kimi's
/// dense layer is read from `mlp.` or, as transformers 5 saves it, `block_sparse_moe.`.
pub fn load_ffn(ld: &mut Loader, cfg: &ModelConfig, l: usize) -> Result<Ffn> {
    let (p, h) = (format!("model.layers.{l}"), cfg.hidden);
    let names = ["gate_proj", "up_proj", "down_proj"];
    let Some(moe) = cfg.moe.as_ref().filter(|_| cfg.is_moe_layer(l)) else {
        let mut prefix = format!("{p}.mlp");
        let alias = format!("{p}.{}", cfg.moe.as_ref().map_or("mlp", |m| m.layout.block));
        if !ld.has(&format!("{prefix}.gate_proj.weight")) && ld.has(&format!("{alias}.gate_proj.weight")) {
            prefix = alias;
        }
        return Ok(Ffn::Dense(ld.mlp(&prefix, names, h, cfg.intermediate, cfg.mlp_bias)?));
    };
    let b = format!("{p}.{}", moe.layout.block);
    for fused in [format!("{p}.mlp.experts.gate_up_proj"), format!("{b}.experts.gate_up_proj")] {
        if ld.has(&fused) {
            return Err(Error::new(ErrorKind::Unsupported, format!(
                "{}: tensor `{fused}`: fused expert tensors (transformers' save_original_format=False, spec §0.8) are not \
supported; save the checkpoint with per-expert tensors", ld.dir().display())));
        }
    }
    let router = ld.matrix(&format!("{b}.gate.weight"), moe.experts, h)?;
    let bias = match moe.routing {
        Routing::Sigmoid { .. } => Some(ld.vector(&format!("{b}.gate.e_score_correction_bias"), moe.experts)?),
        _ => None,
    };
    let shared: Option<(Mlp, _)> = if moe.shared_intermediate > 0 {
        Some((ld.mlp(&format!("{b}.shared_experts"), names, h, moe.shared_intermediate, cfg.mlp_bias)?, None))
    } else {
        None
    };
    Ok(Ffn::Moe(MoeWeights { router, bias, shared, router_bias: None, expert_bias: None }))
}

/// The tensors a checkpoint of a latent family holds (spec §3.2, §4.2, original key names), in
/// file order with their shapes: what `random-model` writes for these configs.
pub fn tensor_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<u64>)> {
    let Some(m) = cfg.mla.as_ref() else { return Vec::new() };
    let u = |x: usize| x as u64;
    let (h, heads) = (u(cfg.hidden), u(cfg.heads));
    let mut t: Vec<(String, Vec<u64>)> = vec![("model.embed_tokens.weight".into(), vec![u(cfg.vocab), h])];
    let linear = |t: &mut Vec<(String, Vec<u64>)>, name: String, rows: u64, cols: u64, bias: bool| {
        if bias {
            t.push((format!("{name}.bias"), vec![rows]));
        }
        t.push((format!("{name}.weight"), vec![rows, cols]));
    };
    for l in 0..cfg.layers {
        let p = format!("model.layers.{l}");
        let a = format!("{p}.self_attn");
        t.push((format!("{p}.input_layernorm.weight"), vec![h]));
        match (cfg.mixer(l), m.kda) {
            (Mixer::Kda, Some(k)) => {
                let (w, d) = (u(k.width()), u(k.head_dim));
                for s in ["q", "k", "v"] {
                    linear(&mut t, format!("{a}.{s}_proj"), w, h, false);
                    t.push((format!("{a}.{s}_conv1d.weight"), vec![w, 1, u(k.conv_kernel)]));
                }
                linear(&mut t, format!("{a}.f_a_proj"), d, h, false);
                linear(&mut t, format!("{a}.f_b_proj"), w, d, false);
                t.push((format!("{a}.A_log"), vec![1, 1, u(k.heads), 1]));
                t.push((format!("{a}.dt_bias"), vec![w]));
                linear(&mut t, format!("{a}.b_proj"), u(k.heads), h, false);
                linear(&mut t, format!("{a}.g_a_proj"), d, h, false);
                linear(&mut t, format!("{a}.g_b_proj"), w, d, false);
                t.push((format!("{a}.o_norm.weight"), vec![d]));
                linear(&mut t, format!("{a}.o_proj"), h, w, false);
            }
            _ => {
                let qd = heads * u(m.q_head_dim());
                match m.q_lora_rank {
                    None => linear(&mut t, format!("{a}.q_proj"), qd, h, false),
                    Some(rq) => {
                        linear(&mut t, format!("{a}.q_a_proj"), u(rq), h, m.bias);
                        t.push((format!("{a}.q_a_layernorm.weight"), vec![u(rq)]));
                        linear(&mut t, format!("{a}.q_b_proj"), qd, u(rq), false);
                    }
                }
                linear(&mut t, format!("{a}.kv_a_proj_with_mqa"), u(m.latent_width()), h, m.bias);
                t.push((format!("{a}.kv_a_layernorm.weight"), vec![u(m.kv_lora_rank)]));
                linear(&mut t, format!("{a}.kv_b_proj"), heads * u(m.nope_dim + m.v_dim), u(m.kv_lora_rank), false);
                linear(&mut t, format!("{a}.o_proj"), h, heads * u(m.v_dim), m.bias);
            }
        }
        t.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        let ffn = |t: &mut Vec<(String, Vec<u64>)>, prefix: String, names: [&str; 3], i: u64, bias: bool| {
            for (name, rows, cols) in [(names[0], i, h), (names[1], i, h), (names[2], h, i)] {
                if bias {
                    t.push((format!("{prefix}.{name}.bias"), vec![rows]));
                }
                t.push((format!("{prefix}.{name}.weight"), vec![rows, cols]));
            }
        };
        let names = ["gate_proj", "up_proj", "down_proj"];
        match cfg.moe.as_ref().filter(|_| cfg.is_moe_layer(l)) {
            None => ffn(&mut t, format!("{p}.mlp"), names, u(cfg.intermediate), cfg.mlp_bias),
            Some(moe) => {
                let b = format!("{p}.{}", moe.layout.block);
                t.push((format!("{b}.gate.weight"), vec![u(moe.experts), h]));
                if matches!(moe.routing, Routing::Sigmoid { .. }) {
                    t.push((format!("{b}.gate.e_score_correction_bias"), vec![u(moe.experts)]));
                }
                for j in 0..moe.experts {
                    ffn(&mut t, format!("{b}.experts.{j}"), moe.layout.names, u(moe.expert_intermediate), false);
                }
                if moe.shared_intermediate > 0 {
                    ffn(&mut t, format!("{b}.shared_experts"), names, u(moe.shared_intermediate), cfg.mlp_bias);
                }
            }
        }
    }
    t.push(("model.norm.weight".into(), vec![h]));
    if !cfg.tie_embeddings {
        t.push(("lm_head.weight".into(), vec![u(cfg.vocab), h]));
    }
    t
}
