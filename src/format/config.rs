//! `config.json` of a Hugging Face checkpoint → [`ModelConfig`], the one description of a
//! model's shape that the rest of the engine reads.
//!
//! Families are rows of [`FAMILIES`], not separate parsers: each row says which architecture
//! string it answers to and which structural features it has (spec §0–§2). Both config
//! generations are accepted: `rope_scaling` + top-level `rope_theta` (transformers 4) and
//! `rope_parameters` (transformers 5), merged as spec §0.7 says.

use super::json::Json;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

// DeepSeek-V2/V3 and Kimi-Linear (spec §3, §4) read their own fields there.
#[path = "config_mla.rs"]
pub mod mla;
pub use mla::{KdaConfig, Mixer, MlaConfig, MlaRope};
// gpt-oss reads its own fields there (sinks, YaRN's attention factor, the clamped SwiGLU).
#[path = "config_gptoss.rs"]
pub mod gpt_oss;
pub use gpt_oss::GptOssConfig;

// GLM-4.5/4.6: attention of the Llama kind with its own switches, DeepSeek-V3's routing.
#[path = "config_glm.rs"]
mod glm;

// Qwen3-Next: hybrid Gated DeltaNet / gated attention layers, Qwen2-MoE's experts.
#[path = "config_qwen3_next.rs"]
mod qwen3_next;
pub use qwen3_next::GdnConfig;

/// The model families the engine knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `LlamaForCausalLM`: dense, GQA, SwiGLU (spec §1).
    Llama,
    /// `Qwen2ForCausalLM`: Llama with q/k/v biases.
    Qwen2,
    /// `Qwen3ForCausalLM`: Llama with per-head q/k norms.
    Qwen3,
    /// `MixtralForCausalLM`: softmax top-k experts in `block_sparse_moe`.
    Mixtral,
    /// `Qwen2MoeForCausalLM`: softmax experts and a gated shared expert.
    Qwen2Moe,
    /// `Qwen3MoeForCausalLM`: softmax experts, per-head q/k norms.
    Qwen3Moe,
    /// `OlmoeForCausalLM`: softmax experts, q/k norms over the whole projection.
    Olmoe,
    /// `DeepseekV2ForCausalLM`: MLA, softmax group-limited routing.
    DeepseekV2,
    /// `DeepseekV3ForCausalLM` (also Kimi-K2): MLA, sigmoid routing with correction bias.
    DeepseekV3,
    /// `KimiLinearForCausalLM`: KDA linear attention and MLA layers.
    KimiLinear,
    /// `Glm4MoeForCausalLM`: GQA with partial rotary, DeepSeek-V3's routing.
    Glm4Moe,
    /// `Qwen3NextForCausalLM`: Gated DeltaNet linear layers and gated full attention.
    Qwen3Next,
    /// `GptOssForCausalLM`: sinks, alternating sliding windows, YaRN, biased clamped-SwiGLU experts.
    GptOss,
}

/// How queries and keys are RMS-normalised before RoPE (spec §1.3, §2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// No q/k norm.
    None,
    /// Qwen3: per head, weight of `head_dim` elements.
    PerHead,
    /// OLMoE: over the whole q (resp. k) projection, before the split into heads.
    Whole,
}

/// How the router turns logits into expert weights (spec §2, §3.6, §3.7).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Routing {
    /// Softmax over all experts, top-k, then divide by the sum of the k when `renormalize`.
    SoftmaxTopK {
        /// Divide the k weights by their sum (`norm_topk_prob`).
        renormalize: bool,
    },
    /// DeepSeek-V3 / Kimi (spec §3.6): sigmoid scores; selection by score + bias within the
    /// `topk_group` best of `groups` groups (each ranked by its two best); weights from the
    /// unbiased scores, renormalised (+1e-20) when asked, times `scale`.
    Sigmoid {
        /// Expert groups (`n_group`).
        groups: usize,
        /// Groups kept (`topk_group`).
        topk_group: usize,
        /// Renormalise the k weights (`norm_topk_prob`).
        renormalize: bool,
        /// `routed_scaling_factor`.
        scale: f32,
    },
    /// DeepSeek-V2 (spec §3.7): softmax; greedy top-k (`groups` = 1) or group-limited by the
    /// group maximum, the dropped groups' probabilities zeroed; weights × `scale`.
    SoftmaxGroups {
        /// Expert groups (`n_group`).
        groups: usize,
        /// Groups kept (`topk_group`).
        topk_group: usize,
        /// `routed_scaling_factor`.
        scale: f32,
    },
    /// gpt-oss: top-k of the (biased) router logits, then a softmax over those k.
    TopKSoftmax,
}

/// One row of the family table: what a `config.json` architecture string means structurally.
pub struct Family {
    /// The family.
    pub arch: Arch,
    /// The `architectures[0]` string of config.json.
    pub class: &'static str,
    /// q/k/v projections always carry a bias (Qwen2 hard-codes it).
    pub qkv_bias: bool,
    /// The family's q/k norm.
    pub qk_norm: QkNorm,
    /// The expert layout: `None` for dense families.
    pub moe: Option<MoeLayout>,
    /// `rope_theta` when config.json has none (the family's class default).
    pub default_rope_theta: f64,
    /// `rms_norm_eps` when config.json has none.
    pub default_rms_eps: f64,
}

/// Tensor naming and routing of a softmax-routed MoE family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeLayout {
    /// Prefix of the MoE block inside a layer: `mlp` or `block_sparse_moe`.
    pub block: &'static str,
    /// Names of the gate, up and down matrices of one expert.
    pub names: [&'static str; 3],
    /// A shared expert with a sigmoid scalar gate (Qwen2-MoE).
    pub shared_expert: bool,
}

/// The family table (spec §1–§2).
pub const FAMILIES: &[Family] = &[
    Family { arch: Arch::Llama, class: "LlamaForCausalLM", qkv_bias: false, qk_norm: QkNorm::None,
        moe: None, default_rope_theta: 10000.0, default_rms_eps: 1e-6 },
    Family { arch: Arch::Qwen2, class: "Qwen2ForCausalLM", qkv_bias: true, qk_norm: QkNorm::None,
        moe: None, default_rope_theta: 10000.0, default_rms_eps: 1e-6 },
    Family { arch: Arch::Qwen3, class: "Qwen3ForCausalLM", qkv_bias: false, qk_norm: QkNorm::PerHead,
        moe: None, default_rope_theta: 10000.0, default_rms_eps: 1e-6 },
    Family { arch: Arch::Mixtral, class: "MixtralForCausalLM", qkv_bias: false, qk_norm: QkNorm::None,
        moe: Some(MoeLayout { block: "block_sparse_moe", names: ["w1", "w3", "w2"], shared_expert: false }),
        default_rope_theta: 1e6, default_rms_eps: 1e-5 },
    Family { arch: Arch::Qwen2Moe, class: "Qwen2MoeForCausalLM", qkv_bias: true, qk_norm: QkNorm::None,
        moe: Some(MoeLayout { block: "mlp", names: ["gate_proj", "up_proj", "down_proj"], shared_expert: true }),
        default_rope_theta: 10000.0, default_rms_eps: 1e-6 },
    Family { arch: Arch::Qwen3Moe, class: "Qwen3MoeForCausalLM", qkv_bias: false, qk_norm: QkNorm::PerHead,
        moe: Some(MoeLayout { block: "mlp", names: ["gate_proj", "up_proj", "down_proj"], shared_expert: false }),
        default_rope_theta: 10000.0, default_rms_eps: 1e-6 },
    Family { arch: Arch::Olmoe, class: "OlmoeForCausalLM", qkv_bias: false, qk_norm: QkNorm::Whole,
        moe: Some(MoeLayout { block: "mlp", names: ["gate_proj", "up_proj", "down_proj"], shared_expert: false }),
        default_rope_theta: 10000.0, default_rms_eps: 1e-5 },
    Family { arch: Arch::DeepseekV2, class: "DeepseekV2ForCausalLM", qkv_bias: false, qk_norm: QkNorm::None,
        moe: Some(MoeLayout { block: "mlp", names: ["gate_proj", "up_proj", "down_proj"], shared_expert: false }),
        default_rope_theta: 10000.0, default_rms_eps: 1e-6 },
    Family { arch: Arch::DeepseekV3, class: "DeepseekV3ForCausalLM", qkv_bias: false, qk_norm: QkNorm::None,
        moe: Some(MoeLayout { block: "mlp", names: ["gate_proj", "up_proj", "down_proj"], shared_expert: false }),
        default_rope_theta: 10000.0, default_rms_eps: 1e-6 },
    Family { arch: Arch::KimiLinear, class: "KimiLinearForCausalLM", qkv_bias: false, qk_norm: QkNorm::None,
        moe: Some(MoeLayout { block: "block_sparse_moe", names: ["w1", "w3", "w2"], shared_expert: false }),
        default_rope_theta: 10000.0, default_rms_eps: 1e-5 },
    // q_norm/k_norm per head only with `use_qk_norm` (config_glm.rs sets it).
    Family { arch: Arch::Glm4Moe, class: "Glm4MoeForCausalLM", qkv_bias: false, qk_norm: QkNorm::None,
        moe: Some(MoeLayout { block: "mlp", names: ["gate_proj", "up_proj", "down_proj"], shared_expert: false }),
        default_rope_theta: 10000.0, default_rms_eps: 1e-5 },
    // Hybrid Gated DeltaNet / gated attention; q/k norm and the GDN schedule set by config_qwen3_next.rs.
    Family { arch: Arch::Qwen3Next, class: "Qwen3NextForCausalLM", qkv_bias: false, qk_norm: QkNorm::PerHead,
        moe: Some(MoeLayout { block: "mlp", names: ["gate_proj", "up_proj", "down_proj"], shared_expert: true }),
        default_rope_theta: 10000.0, default_rms_eps: 1e-6 },
    Family { arch: Arch::GptOss, class: "GptOssForCausalLM", qkv_bias: true, qk_norm: QkNorm::None,
        moe: Some(gpt_oss::LAYOUT), default_rope_theta: 150000.0, default_rms_eps: 1e-5 },
];

/// Architectures named in the spec that this engine recognises but does not run yet.
const KNOWN_UNSUPPORTED: &[&str] = &[];

/// RoPE frequency scaling (spec §0.5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// No scaling: the plain frequencies.
    None,
    /// Llama 3.x: `factor`, `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`.
    Llama3 {
        /// `factor`: how much longer the context is than the original.
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor`.
        high_freq_factor: f64,
        /// `original_max_position_embeddings`.
        original_max: f64,
    },
    /// Position interpolation: inv_freq / factor.
    Linear {
        /// The divisor of every frequency.
        factor: f64,
    },
    /// YaRN (DeepSeek, spec §0.5): `factor`, `original_max_position_embeddings`, the ramp's
    /// `beta_fast` / `beta_slow`, and `truncate` (floor/ceil the correction range).
    Yarn {
        /// `factor`.
        factor: f64,
        /// `original_max_position_embeddings`.
        original_max: f64,
        /// `beta_fast`: where the ramp ends (rotations over the original context).
        beta_fast: f64,
        /// `beta_slow`: where the ramp starts.
        beta_slow: f64,
        /// `truncate`: round the ramp's ends to whole dimensions.
        truncate: bool,
    },
}

/// Rotary embedding parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    /// The base (`rope_theta`).
    pub theta: f64,
    /// Rotated channels per head (`head_dim` × `partial_rotary_factor`).
    pub dim: usize,
    /// Frequency scaling (`rope_scaling`).
    pub scaling: RopeScaling,
}

/// The MoE part of a config.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Tensor names of the MoE block.
    pub layout: MoeLayout,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts each token uses.
    pub top_k: usize,
    /// Width of one routed expert.
    pub expert_intermediate: usize,
    /// How router logits become expert weights.
    pub routing: Routing,
    /// Width of the shared expert (Qwen2-MoE), 0 when there is none.
    pub shared_intermediate: usize,
    /// Which layers are MoE (the others are dense SwiGLU with `intermediate`).
    pub moe_layers: Vec<bool>,
}

/// Everything the engine needs to know about a model's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The family.
    pub arch: Arch,
    /// The architecture string from config.json.
    pub class: String,
    /// Residual stream width (`hidden_size`).
    pub hidden: usize,
    /// Dense FFN width.
    pub intermediate: usize,
    /// Decoder layers (`num_hidden_layers`).
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (GQA: `heads` is a multiple).
    pub kv_heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Embedding rows and logits.
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Rotary embedding.
    pub rope: RopeConfig,
    /// The LM head is the embedding matrix (`tie_word_embeddings`).
    pub tie_embeddings: bool,
    /// Biases on the q, k and v projections.
    pub qkv_bias: bool,
    /// Bias on o_proj (Llama `attention_bias`).
    pub o_bias: bool,
    /// Biases on the dense FFN's matrices (`mlp_bias`).
    pub mlp_bias: bool,
    /// How q and k are normalised.
    pub qk_norm: QkNorm,
    /// OLMoE `clip_qkv`: clamp q, k, v to [−c, c] after the norms.
    pub clip_qkv: Option<f32>,
    /// Per layer: the sliding attention window, if that layer uses one.
    pub sliding_window: Vec<Option<usize>>,
    /// Longest context the model was made for (`max_position_embeddings`).
    pub max_position: usize,
    /// `bos_token_id`.
    pub bos_token: Option<u32>,
    /// `eos_token_id` (one or a list).
    pub eos_tokens: Vec<u32>,
    /// The routed experts; `None` for a dense model.
    pub moe: Option<MoeConfig>,
    /// Latent attention (MLA) and KDA geometry with the per-layer mixer (DeepSeek, Kimi).
    pub mla: Option<MlaConfig>,
    /// Multi-token-prediction layers the config declares (GLM's `num_nextn_predict_layers`):
    /// their tensors sit past `num_hidden_layers` in the checkpoint and are never read, as they
    /// are not part of the next-token forward pass.
    pub mtp_layers: usize,
    /// Qwen3-Next: the Gated DeltaNet geometry and which layers are linear attention.
    pub gdn: Option<GdnConfig>,
    /// gpt-oss's own parameters (its SwiGLU clamp, YaRN's attention factor).
    pub gpt_oss: Option<GptOssConfig>,
}

/// A config.json being read: lookups that name the file and field in their errors.
struct Fields<'a> {
    path: &'a Path,
    root: &'a Json,
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a Json> {
        self.root.get(key).filter(|v| !v.is_null())
    }
    fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().and_then(|n| usize::try_from(n).ok()).map(Some).ok_or_else(|| {
                Error::config(self.path, key, format!("expected a non-negative integer, found {}", v.type_name()))
            }),
        }
    }
    fn usize_req(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| Error::config(self.path, key, "missing"))
    }
    /// The context the model was made for: `key` (`max_position_embeddings`, or an alias the
    /// family reads first), `default` when absent. A 0 would leave no room for one token (the
    /// context used to become 1 and every request was refused for its length): refused here,
    /// naming the field.
    fn max_position(&self, key: &str, default: usize) -> Result<usize> {
        match self.usize_opt(key)?.unwrap_or(default) {
            0 => Err(Error::config(self.path, key, "0 is out of range: the context must be ≥ 1 token")),
            v => Ok(v),
        }
    }
    fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        f64_of(self.path, key, self.get(key))
    }
    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| Error::config(self.path, key, format!("expected a boolean, found {}", v.type_name()))),
        }
    }
    /// A token id or a list of them (`eos_token_id` is either).
    fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        let bad = || Error::config(self.path, key, "expected a token id or a list of token ids");
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Json::Array(a)) => a.iter().map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad)).collect(),
            Some(v) => Ok(vec![v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad)?]),
        }
    }
}

fn f64_of(path: &Path, key: &str, v: Option<&Json>) -> Result<Option<f64>> {
    match v.filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(f) if f.is_finite() => Ok(Some(f)),
            _ => Err(Error::config(path, key, format!("expected a finite number, found {}", v.type_name()))),
        },
    }
}

/// Largest dimension accepted from a config before any buffer is sized from it.
const MAX_DIM: usize = 1 << 24;

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<ModelConfig> {
        ModelConfig::load_within(dir, &super::json::Limits::default())
    }

    /// [`ModelConfig::load`] with the file parsed within `limits`.
    pub(crate) fn load_within(dir: &Path, limits: &super::json::Limits) -> Result<ModelConfig> {
        ModelConfig::load_with_json(dir, limits).map(|(c, _)| c)
    }

    /// [`ModelConfig::load_within`], keeping the parsed JSON too (the model's identity hashes
    /// it), so the file is read once.
    pub(crate) fn load_with_json(dir: &Path, limits: &super::json::Limits) -> Result<(ModelConfig, Json)> {
        let path: PathBuf = dir.join("config.json");
        let root = super::read_json_within(&path, 4 << 20, limits)?;
        Ok((ModelConfig::from_json(&path, &root)?, root))
    }

    /// Builds a config from parsed JSON; `path` is used in error messages.
    pub fn from_json(path: &Path, root: &Json) -> Result<ModelConfig> {
        if root.as_object().is_none() {
            return Err(Error::format(path, "config is not a JSON object"));
        }
        let f = Fields { path, root };
        let class = match f.get("architectures").and_then(Json::as_array).and_then(|a| a.first()) {
            Some(v) => v.as_str().ok_or_else(|| Error::config(path, "architectures", "expected a list of strings"))?.to_string(),
            None => return Err(Error::config(path, "architectures", "missing")),
        };
        let Some(family) = FAMILIES.iter().find(|fam| fam.class == class) else {
            let what = if KNOWN_UNSUPPORTED.contains(&class.as_str()) { "is not supported yet" } else { "is not a supported architecture" };
            return Err(Error::unsupported(format!("{}: architecture `{class}` {what} (supported: {})",
                path.display(), FAMILIES.iter().map(|f| f.class).collect::<Vec<_>>().join(", "))));
        };
        if matches!(family.arch, Arch::DeepseekV2 | Arch::DeepseekV3 | Arch::KimiLinear) {
            return mla::from_json(&f, family, class);
        }
        if family.arch == Arch::GptOss {
            return gpt_oss::from_json(&f, family, class);
        }
        let hidden = f.usize_req("hidden_size")?;
        let layers = f.usize_req("num_hidden_layers")?;
        let heads = f.usize_req("num_attention_heads")?;
        let vocab = f.usize_req("vocab_size")?;
        let kv_heads = f.usize_opt("num_key_value_heads")?.unwrap_or(heads);
        for (key, v) in [("hidden_size", hidden), ("num_hidden_layers", layers), ("num_attention_heads", heads),
            ("vocab_size", vocab), ("num_key_value_heads", kv_heads)] {
            if v == 0 || v > MAX_DIM {
                return Err(Error::config(path, key, format!("{v} is out of range 1..={MAX_DIM}")));
            }
        }
        if heads % kv_heads != 0 {
            return Err(Error::config(path, "num_key_value_heads",
                format!("{kv_heads} does not divide num_attention_heads {heads}")));
        }
        let head_dim = match f.usize_opt("head_dim")? {
            Some(d) => d,
            // transformers' Qwen3Config declares `head_dim: int = 128`, not hidden / heads
            // (spec §1.1); Qwen3-MoE's class has no default, so it falls through (§2.3).
            None if family.arch == Arch::Qwen3 => 128,
            None if family.arch == Arch::Qwen3Next => 256,
            None if hidden % heads == 0 => hidden / heads,
            None => return Err(Error::config(path, "head_dim", format!("missing, and hidden_size {hidden} is not a multiple of num_attention_heads {heads}"))),
        };
        if head_dim == 0 || head_dim % 2 != 0 || head_dim > 4096 {
            return Err(Error::config(path, "head_dim", format!("{head_dim} must be even and in 2..=4096")));
        }
        check_activation(&f)?;
        let intermediate = f.usize_opt("intermediate_size")?.unwrap_or(0);
        if intermediate > MAX_DIM {
            return Err(Error::config(path, "intermediate_size", format!("{intermediate} is out of range")));
        }
        let rms_eps = f.f64_opt("rms_norm_eps")?.unwrap_or(family.default_rms_eps);
        if !(rms_eps > 0.0 && rms_eps < 1.0) {
            return Err(Error::config(path, "rms_norm_eps", format!("{rms_eps} is out of range (0, 1)")));
        }
        // Read before the rope, whose YaRN factor may be derived from it.
        let max_position = f.max_position("max_position_embeddings", 4096)?;
        let rope = parse_rope(&f, family, head_dim)?;
        let attention_bias = f.bool_or("attention_bias", false)?;
        let (qkv_bias, o_bias) = match family.arch {
            Arch::Llama => (attention_bias, attention_bias),
            // Qwen2's q/k/v biases are hard-coded; Qwen3 and OLMoE honour attention_bias on q/k/v/o.
            _ if family.qkv_bias => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let mlp_bias = family.arch == Arch::Llama && f.bool_or("mlp_bias", false)?;
        let clip_qkv = f.f64_opt("clip_qkv")?.map(|c| c as f32);
        if clip_qkv.is_some_and(|c| c <= 0.0) {
            return Err(Error::config(path, "clip_qkv", "must be positive"));
        }
        let sliding_window = parse_sliding_window(&f, family.arch, layers)?;
        let moe = match family.moe {
            // GLM routes as DeepSeek-V3 does (sigmoid, correction bias, groups): read alike.
            Some(_) if family.arch == Arch::Glm4Moe => Some(mla::sigmoid_moe(&f, family, layers)?),
            Some(layout) => Some(parse_moe(&f, family.arch, layout, layers)?),
            None => None,
        };
        let dense_layers = moe.as_ref().map_or(layers, |m| m.moe_layers.iter().filter(|&&x| !x).count());
        if dense_layers > 0 && intermediate == 0 {
            return Err(Error::config(path, "intermediate_size", "missing or zero"));
        }
        let cfg = ModelConfig {
            arch: family.arch,
            class,
            hidden,
            intermediate,
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab,
            rms_eps: rms_eps as f32,
            rope,
            tie_embeddings: f.bool_or("tie_word_embeddings", false)?,
            qkv_bias,
            o_bias,
            mlp_bias,
            qk_norm: family.qk_norm,
            clip_qkv,
            sliding_window,
            max_position,
            bos_token: f.token_ids("bos_token_id")?.first().copied(),
            eos_tokens: f.token_ids("eos_token_id")?,
            moe,
            mla: None,
            mtp_layers: 0,
            gdn: None,
            gpt_oss: None,
        };
        match family.arch {
            Arch::Glm4Moe => glm::finish(&f, cfg),
            Arch::Qwen3Next => qwen3_next::finish(&f, cfg),
            _ => Ok(cfg),
        }
    }

    /// The family row of this config.
    pub fn family(&self) -> &'static Family {
        FAMILIES.iter().find(|f| f.arch == self.arch).unwrap_or(&FAMILIES[0])
    }

    /// Width of the query projection (heads × head_dim).
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of the key and value projections (kv_heads × head_dim).
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// True when layer `l` has a routed-expert FFN.
    pub fn is_moe_layer(&self, l: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.moe_layers.get(l).copied().unwrap_or(false))
    }
}

/// The FFN is SwiGLU (spec §0.4): `hidden_act` must be SiLU, which transformers also calls
/// `swish`. Absent, every supported family's class defaults to `silu`.
fn check_activation(f: &Fields) -> Result<()> {
    match f.get("hidden_act") {
        None => Ok(()),
        Some(Json::String(a)) if a == "silu" || a == "swish" => Ok(()),
        Some(Json::String(a)) => Err(Error::unsupported(format!(
            "{}: field `hidden_act`: `{a}` is not supported (the engine's feed-forward is SwiGLU: `silu` or `swish`)",
            f.path.display()))),
        Some(v) => Err(Error::config(f.path, "hidden_act", format!("expected a string, found {}", v.type_name()))),
    }
}

/// RoPE fields, merged per spec §0.7: `rope_parameters` wins, then `rope_scaling`, then the
/// top-level `rope_theta`, then the family default. Errors name the key as the file spells it
/// (`rope_parameters.factor` or `rope_scaling.factor`).
fn parse_rope(f: &Fields, family: &Family, head_dim: usize) -> Result<RopeConfig> {
    let params = f.get("rope_parameters");
    let scaling = f.get("rope_scaling");
    // A value and the dictionary it came from.
    let lookup = |key: &str| -> Option<(&Json, &'static str)> {
        params.and_then(|p| p.get(key)).filter(|v| !v.is_null()).map(|v| (v, "rope_parameters"))
            .or_else(|| scaling.and_then(|s| s.get(key)).filter(|v| !v.is_null()).map(|v| (v, "rope_scaling")))
    };
    let nested = |key: &str, top: &str| -> Result<Option<f64>> {
        match lookup(key) {
            Some((v, section)) => f64_of(f.path, &format!("{section}.{key}"), Some(v)),
            None => f.f64_opt(top),
        }
    };
    let theta_key = lookup("rope_theta").map_or("rope_theta".to_string(), |(_, s)| format!("{s}.rope_theta"));
    let theta = nested("rope_theta", "rope_theta")?.unwrap_or(family.default_rope_theta);
    // Written negated so that NaN is refused too.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(theta > 1.0) {
        return Err(Error::config(f.path, &theta_key, format!("{theta} must be greater than 1")));
    }
    let partial_key = lookup("partial_rotary_factor").map_or("partial_rotary_factor".to_string(), |(_, s)| format!("{s}.partial_rotary_factor"));
    // Glm4MoeConfig defaults the factor to 0.5 (half of each head rotates).
    let partial = nested("partial_rotary_factor", "partial_rotary_factor")?
        .unwrap_or(match family.arch {
            Arch::Glm4Moe => 0.5,
            // Qwen3NextConfig sets partial_rotary_factor 0.25 unless given.
            Arch::Qwen3Next => 0.25,
            _ => 1.0,
        });
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(Error::config(f.path, &partial_key, format!("{partial} is out of range (0, 1]")));
    }
    // GLM's reference takes int(head_dim × factor) channels with a frequency for every second
    // one: an odd count would rotate one channel more than it names, so it is refused.
    if family.arch == Arch::Glm4Moe && ((head_dim as f64 * partial) as usize) % 2 == 1 {
        return Err(Error::config(f.path, &partial_key, format!("{partial} × head_dim {head_dim} is not an even number of channels")));
    }
    let dim = ((head_dim as f64 * partial) as usize) & !1;
    let kind_entry = lookup("rope_type").or_else(|| lookup("type"));
    let kind = kind_entry.and_then(|(v, _)| v.as_str()).unwrap_or("default");
    // The dictionary that names the scaling: where its other fields belong.
    let section = kind_entry.map(|(_, s)| s)
        .unwrap_or(if params.is_some() { "rope_parameters" } else { "rope_scaling" });
    let num = |key: &str| -> Result<f64> {
        match lookup(key) {
            Some((v, from)) => f64_of(f.path, &format!("{from}.{key}"), Some(v))?,
            None => None,
        }
        .ok_or_else(|| Error::config(f.path, &format!("{section}.{key}"), format!("missing for rope_type `{kind}`")))
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "llama3" => {
            let s = RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max: num("original_max_position_embeddings")?,
            };
            if let RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max } = s {
                if factor <= 0.0 || low_freq_factor <= 0.0 || high_freq_factor <= low_freq_factor || original_max <= 0.0 {
                    return Err(Error::config(f.path, section, "llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor, original_max_position_embeddings > 0"));
                }
            }
            s
        }
        "linear" => {
            let factor = num("factor")?;
            if factor <= 0.0 {
                return Err(Error::config(f.path, &format!("{section}.factor"), "must be positive"));
            }
            RopeScaling::Linear { factor }
        }
        other => {
            let key = kind_entry.map_or("rope_type".to_string(), |(_, s)| {
                format!("{s}.{}", if lookup("rope_type").is_some() { "rope_type" } else { "type" })
            });
            return Err(Error::unsupported(format!("{}: field `{key}`: `{other}` is not supported for {}",
                f.path.display(), family.class)))
        }
    };
    Ok(RopeConfig { theta, dim, scaling })
}

/// Per-layer sliding windows (spec §0.6): Mixtral's non-null `sliding_window`; Qwen2/3 only
/// with `use_sliding_window`, for the layers `layer_types` marks (or from `max_window_layers` on,
/// whose class default is 28 in Qwen2Config and Qwen3Config).
/// Qwen3-MoE (transformers 5.24.0) has no per-layer schedule: with `use_sliding_window` every
/// layer is windowed, and `max_window_layers`, which its released configs carry, is not read.
/// A Qwen2-MoE config without `layer_types` (transformers 4) gets the schedule transformers
/// 5.24.0 derives for it: the even layers below `max_window_layers` (class default 28).
fn parse_sliding_window(f: &Fields, arch: Arch, layers: usize) -> Result<Vec<Option<usize>>> {
    let window = f.usize_opt("sliding_window")?;
    let mut out = vec![None; layers];
    let Some(w) = window else { return Ok(out) };
    // A Qwen window is inert unless `use_sliding_window` is set, whatever its value:
    // transformers 5 saves Qwen2-MoE configs with `sliding_window: 0` when it is off.
    let qwen = matches!(arch, Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen2Moe | Arch::Qwen3Moe);
    if qwen && !f.bool_or("use_sliding_window", false)? {
        return Ok(out);
    }
    if w == 0 {
        return Err(Error::config(f.path, "sliding_window", "must be positive"));
    }
    match arch {
        Arch::Mixtral | Arch::Qwen3Moe => out.iter_mut().for_each(|o| *o = Some(w)),
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen2Moe => {
            if let Some(types) = f.get("layer_types").and_then(Json::as_array) {
                for (l, t) in types.iter().enumerate().take(layers) {
                    if t.as_str() == Some("sliding_attention") {
                        out[l] = Some(w);
                    }
                }
            } else if arch == Arch::Qwen2Moe {
                let below = f.usize_opt("max_window_layers")?.unwrap_or(28);
                out.iter_mut().take(below).step_by(2).for_each(|o| *o = Some(w));
            } else {
                let from = f.usize_opt("max_window_layers")?.unwrap_or(28);
                out.iter_mut().skip(from).for_each(|o| *o = Some(w));
            }
        }
        _ => {}
    }
    Ok(out)
}

fn parse_moe(f: &Fields, arch: Arch, layout: MoeLayout, layers: usize) -> Result<MoeConfig> {
    let width_key = match arch {
        Arch::Mixtral | Arch::Olmoe => "intermediate_size",
        _ => "moe_intermediate_size",
    };
    // transformers 5 writes `num_local_experts` for every family; older configs use
    // `num_experts` (Qwen, OLMoE) — spec §0.7's aliases.
    let experts_key = ["num_local_experts", "num_experts", "n_routed_experts"]
        .into_iter().find(|k| f.get(k).is_some()).unwrap_or("num_experts");
    let experts = f.usize_req(experts_key)?;
    let top_k = f.usize_req("num_experts_per_tok")?;
    if experts == 0 || experts > 1 << 16 {
        return Err(Error::config(f.path, experts_key, format!("{experts} is out of range 1..=65536")));
    }
    if top_k == 0 || top_k > experts.min(64) {
        return Err(Error::config(f.path, "num_experts_per_tok", format!("{top_k} is out of range 1..={}", experts.min(64))));
    }
    let expert_intermediate = f.usize_req(width_key)?;
    if expert_intermediate == 0 || expert_intermediate > MAX_DIM {
        return Err(Error::config(f.path, width_key, "out of range"));
    }
    let renormalize = match arch {
        Arch::Mixtral => true,
        Arch::Olmoe => f.bool_or("norm_topk_prob", false)?,
        _ => f.bool_or("norm_topk_prob", false)?,
    };
    let shared_intermediate = if layout.shared_expert {
        f.usize_opt("shared_expert_intermediate_size")?.unwrap_or(0)
    } else {
        0
    };
    let mut moe_layers = vec![true; layers];
    if matches!(arch, Arch::Qwen2Moe | Arch::Qwen3Moe | Arch::Qwen3Next) {
        let step = f.usize_opt("decoder_sparse_step")?.unwrap_or(1);
        if step == 0 {
            return Err(Error::config(f.path, "decoder_sparse_step", "must be positive"));
        }
        let only_mlp: Vec<usize> = match f.get("mlp_only_layers") {
            None => Vec::new(),
            Some(v) => v.as_array().and_then(|a| a.iter().map(|x| x.as_u64().map(|n| n as usize)).collect::<Option<Vec<_>>>())
                .ok_or_else(|| Error::config(f.path, "mlp_only_layers", "expected a list of layer indices"))?,
        };
        for (l, m) in moe_layers.iter_mut().enumerate() {
            *m = !only_mlp.contains(&l) && (l + 1) % step == 0;
        }
    }
    Ok(MoeConfig {
        layout,
        experts,
        top_k,
        expert_intermediate,
        routing: Routing::SoftmaxTopK { renormalize },
        shared_intermediate,
        moe_layers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    fn cfg(text: &str) -> Result<ModelConfig> {
        ModelConfig::from_json(Path::new("config.json"), &super::super::json::parse(text.as_bytes()).must())
    }

    const BASE: &str = r#""hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 100, "intermediate_size": 96"#;

    #[test]
    fn both_rope_generations_are_accepted() {
        let old = cfg(&format!(r#"{{"architectures": ["LlamaForCausalLM"], {BASE}, "rope_theta": 500000.0,
            "rope_scaling": {{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#)).must();
        let new = cfg(&format!(r#"{{"architectures": ["LlamaForCausalLM"], {BASE},
            "rope_parameters": {{"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#)).must();
        assert_eq!(old.rope, new.rope);
        assert_eq!(old.rope.theta, 500000.0);
        assert!(matches!(old.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
    }

    /// transformers 5 writes `sliding_window: 0` into Qwen2-MoE configs whose window is off.
    #[test]
    fn an_unused_qwen_window_of_zero_is_accepted() {
        let moe = r#""num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32"#;
        let c = cfg(&format!(r#"{{"architectures": ["Qwen2MoeForCausalLM"], {BASE}, {moe},
            "use_sliding_window": false, "sliding_window": 0}}"#)).must();
        assert_eq!(c.sliding_window, vec![None, None]);
        let e = cfg(&format!(r#"{{"architectures": ["Qwen2MoeForCausalLM"], {BASE}, {moe},
            "use_sliding_window": true, "sliding_window": 0}}"#)).unwrap_err();
        assert!(e.to_string().contains("sliding_window"), "{e}");
        let e = cfg(&format!(r#"{{"architectures": ["MixtralForCausalLM"], {BASE}, {moe}, "sliding_window": 0}}"#)).unwrap_err();
        assert!(e.to_string().contains("sliding_window"), "{e}");
    }

    /// Qwen3-MoE windows every layer when `use_sliding_window` is set, as transformers 5.24.0
    /// does (fixture qwen3_moe_swa_f32); Qwen3 dense starts at `max_window_layers`.
    #[test]
    fn a_qwen3_moe_window_covers_every_layer() {
        let moe = r#""num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32"#;
        let c = cfg(&format!(r#"{{"architectures": ["Qwen3MoeForCausalLM"], {BASE}, {moe},
            "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1}}"#)).must();
        assert_eq!(c.sliding_window, vec![Some(8), Some(8)]);
        let c = cfg(&format!(r#"{{"architectures": ["Qwen3ForCausalLM"], {BASE},
            "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1}}"#)).must();
        assert_eq!(c.sliding_window, vec![None, Some(8)]);
    }

    /// Without `layer_types`, Qwen2-MoE windows its even layers below `max_window_layers`
    /// (Qwen2MoeConfig.__post_init__ in transformers 5.24.0; fixture qwen2_moe_swa_f32), Qwen2
    /// the layers from `max_window_layers` on; a saved `layer_types` wins for both.
    #[test]
    fn qwen2_moe_derives_its_window_schedule_like_transformers() {
        let base = BASE.replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 6"#);
        let moe = r#""num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32"#;
        let win = r#""use_sliding_window": true, "sliding_window": 8, "max_window_layers": 3"#;
        let c = cfg(&format!(r#"{{"architectures": ["Qwen2MoeForCausalLM"], {base}, {moe}, {win}}}"#)).must();
        assert_eq!(c.sliding_window, vec![Some(8), None, Some(8), None, None, None]);
        let c = cfg(&format!(r#"{{"architectures": ["Qwen2MoeForCausalLM"], {base}, {moe}, "use_sliding_window": true,
            "sliding_window": 8}}"#)).must();
        assert_eq!(c.sliding_window, vec![Some(8), None, Some(8), None, Some(8), None]);
        let c = cfg(&format!(r#"{{"architectures": ["Qwen2ForCausalLM"], {base}, {win}}}"#)).must();
        assert_eq!(c.sliding_window, vec![None, None, None, Some(8), Some(8), Some(8)]);
        // No max_window_layers: the class default, 28, windows layers 28 and 29 of 30.
        let thirty = BASE.replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 30"#);
        let c = cfg(&format!(r#"{{"architectures": ["Qwen2ForCausalLM"], {thirty}, "use_sliding_window": true,
            "sliding_window": 8}}"#)).must();
        let want: Vec<Option<usize>> = (0..30).map(|l| (l >= 28).then_some(8)).collect();
        assert_eq!(c.sliding_window, want);
        let c = cfg(&format!(r#"{{"architectures": ["Qwen2MoeForCausalLM"], {base}, {moe}, {win},
            "layer_types": ["full_attention", "sliding_attention", "full_attention", "full_attention",
            "full_attention", "full_attention"]}}"#)).must();
        assert_eq!(c.sliding_window, vec![None, Some(8), None, None, None, None]);
    }

    #[test]
    fn rope_errors_name_the_key_the_file_used() {
        for section in ["rope_parameters", "rope_scaling"] {
            let text = format!(r#"{{"architectures": ["LlamaForCausalLM"], {BASE}, "{section}": {{"rope_type": "llama3", "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}}}}"#);
            let e = cfg(&text).unwrap_err().to_string();
            assert!(e.contains(&format!("`{section}.original_max_position_embeddings`")), "{e}");
            let text = format!(r#"{{"architectures": ["LlamaForCausalLM"], {BASE}, "{section}": {{"rope_type": "linear", "factor": "x"}}}}"#);
            let e = cfg(&text).unwrap_err().to_string();
            assert!(e.contains(&format!("`{section}.factor`")), "{e}");
            let text = format!(r#"{{"architectures": ["LlamaForCausalLM"], {BASE}, "{section}": {{"type": "yarn", "factor": 2.0}}}}"#);
            let e = cfg(&text).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Unsupported);
            assert!(e.to_string().contains(&format!("`{section}.type`: `yarn`")), "{e}");
            let text = format!(r#"{{"architectures": ["LlamaForCausalLM"], {BASE}, "{section}": {{"rope_theta": 0.5}}}}"#);
            let e = cfg(&text).unwrap_err().to_string();
            assert!(e.contains(&format!("`{section}.rope_theta`")), "{e}");
        }
        let e = cfg(&format!(r#"{{"architectures": ["LlamaForCausalLM"], {BASE}, "rope_theta": 0.5}}"#)).unwrap_err().to_string();
        assert!(e.contains("field `rope_theta`"), "{e}");
    }

    #[test]
    fn hidden_act_other_than_silu_is_unsupported() {
        for ok in [r#""hidden_act": "silu","#, r#""hidden_act": "swish","#, ""] {
            cfg(&format!(r#"{{"architectures": ["LlamaForCausalLM"], {ok} {BASE}}}"#)).must();
        }
        let e = cfg(&format!(r#"{{"architectures": ["Qwen2ForCausalLM"], "hidden_act": "gelu_pytorch_tanh", {BASE}}}"#)).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Unsupported);
        assert!(e.to_string().contains("`hidden_act`: `gelu_pytorch_tanh`"), "{e}");
        let e = cfg(&format!(r#"{{"architectures": ["LlamaForCausalLM"], "hidden_act": 1, {BASE}}}"#)).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Config);
    }

    /// transformers' Qwen3Config defaults head_dim to 128; Llama and Qwen3-MoE fall back to
    /// hidden / heads (spec §1.1, §2.3).
    #[test]
    fn head_dim_defaults_follow_the_config_classes() {
        assert_eq!(cfg(&format!(r#"{{"architectures": ["Qwen3ForCausalLM"], {BASE}}}"#)).must().head_dim, 128);
        assert_eq!(cfg(&format!(r#"{{"architectures": ["Qwen3ForCausalLM"], {BASE}, "head_dim": 32}}"#)).must().head_dim, 32);
        assert_eq!(cfg(&format!(r#"{{"architectures": ["LlamaForCausalLM"], {BASE}}}"#)).must().head_dim, 16);
        let moe = r#""num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32"#;
        assert_eq!(cfg(&format!(r#"{{"architectures": ["Qwen3MoeForCausalLM"], {BASE}, {moe}}}"#)).must().head_dim, 16);
    }

    #[test]
    fn a_repeated_key_takes_its_last_value() {
        let c = cfg(&format!(r#"{{"architectures": ["LlamaForCausalLM"], {BASE}, "vocab_size": 300}}"#)).must();
        assert_eq!(c.vocab, 300);
    }

    /// A size of 0 in config.json is refused naming its field, in every family's reader.
    /// `max_position_embeddings: 0` used to open with a context of 1 (the fuzzer's fp8_config
    /// finding); the other sizes were refused already and stay so. Fields where 0 has a meaning
    /// (no shared expert, no dense layer, no MTP layer, a window that is off) or that the
    /// family's reader does not compute with (MLA's `head_dim`, `num_key_value_heads`) may open.
    #[test]
    fn a_size_of_zero_is_refused_by_name_in_every_family() {
        let oracles = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracles");
        let fixtures = ["llama_f32", "qwen2_f32", "qwen3_f32", "qwen2_moe_f32", "qwen3_moe_f32", "mixtral_f32", "olmoe_f32",
            "glm4_moe_f32", "qwen3_next_f32", "gpt_oss_f32", "deepseek_v2_lite_f32", "deepseek_v3_fp8", "kimi_linear_f32"];
        let may_be_zero = ["bos_token_id", "eos_token_id", "pad_token_id", "pretraining_tp", "max_window_layers",
            "first_k_dense_replace", "num_nextn_predict_layers", "n_shared_experts", "num_shared_experts",
            "shared_expert_intermediate_size", "sliding_window", "qk_head_dim"];
        let mut refused = 0;
        for name in fixtures {
            let path = oracles.join(name).join("model/config.json");
            let Ok(text) = std::fs::read(&path) else {
                println!("SKIP: {} is not there", path.display());
                continue;
            };
            let root = super::super::json::parse(&text).must();
            let base = ModelConfig::from_json(&path, &root).must();
            let mla = base.mla.is_some();
            let Json::Object(members) = &root else { panic!("{name}: not an object") };
            for (i, (key, value)) in members.iter().enumerate() {
                if value.as_u64().is_none_or(|v| v == 0) {
                    continue;
                }
                let mut zeroed = members.clone();
                zeroed[i].1 = Json::uint(0);
                let got = ModelConfig::from_json(&path, &Json::Object(zeroed));
                // intermediate_size is the dense FFN's width (the experts' in Mixtral, OLMoE
                // and gpt-oss): 0 is fine where no layer has a dense FFN.
                let no_dense_ffn = key == "intermediate_size" && base.moe.as_ref().is_some_and(|m| m.moe_layers.iter().all(|&x| x))
                    && !matches!(base.arch, Arch::Mixtral | Arch::Olmoe | Arch::GptOss);
                // Kimi reads `linear_attn_config.*` before the top-level `linear_*` spellings.
                let ignored_by_mla = mla && (matches!(key.as_str(), "head_dim" | "num_key_value_heads")
                    || key.starts_with("linear_") && root.get("linear_attn_config").is_some());
                if may_be_zero.contains(&key.as_str()) || no_dense_ffn || ignored_by_mla {
                    continue;
                }
                let e = match got {
                    Ok(c) => panic!("{name}: `{key}: 0` opens (context {}, hidden {})", c.max_position, c.hidden),
                    Err(e) => e.to_string(),
                };
                assert!(e.contains("config.json") && e.contains(&format!("`{key}`")), "{name}: `{key}: 0`: {e}");
                refused += 1;
            }
            // The context named by the reader's own field: `max_position_embeddings`, or Kimi's
            // `model_max_length`; 0 is never the context of 1 it used to become.
            let key = if root.get("model_max_length").is_some() { "model_max_length" } else { "max_position_embeddings" };
            let mut zeroed = members.clone();
            zeroed.retain(|(k, _)| k != key);
            zeroed.push((key.to_string(), Json::uint(0)));
            let e = ModelConfig::from_json(&path, &Json::Object(zeroed)).unwrap_err().to_string();
            assert!(e.contains(&format!("config.json: field `{key}`")) && e.contains("≥ 1"), "{name}: {e}");
        }
        println!("{refused} sizes of 0 refused by name");
        assert!(refused > 50, "only {refused} zero fields tried");
    }

    #[test]
    fn errors_name_the_field() {
        let e = cfg(r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}"#).unwrap_err();
        assert!(e.to_string().contains("num_hidden_layers"), "{e}");
        let e = cfg(&format!(r#"{{"architectures": ["LlamaForCausalLM"], {BASE}, "rms_norm_eps": "x"}}"#)).unwrap_err();
        assert!(e.to_string().contains("rms_norm_eps"), "{e}");
        let e = cfg(&format!(r#"{{"architectures": ["GPT2LMHeadModel"], {BASE}}}"#)).unwrap_err();
        assert!(e.to_string().contains("GPT2LMHeadModel"), "{e}");
        assert_eq!(e.kind(), crate::ErrorKind::Unsupported);
    }
}
