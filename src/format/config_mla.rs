//! Configs of the latent-attention families (spec §3.1, §4.1): DeepSeek-V2, DeepSeek-V3 and
//! Kimi-Linear. Their `config.json` shares little with the Llama-style families (no per-head
//! K/V, a latent rank, YaRN with mscale, group-limited routing, a per-layer mixer schedule), so
//! it is read here into the same [`ModelConfig`], with the MLA/KDA geometry in [`MlaConfig`].
//!
//! Defaults are those of the transformers 5.24.0 config classes (the oracle), except where two
//! references disagree (spec §4.7, §5): then the config is refused, naming the field, rather than
//! silently matching one of them.

use super::{f64_of, Arch, Family, Fields, ModelConfig, MoeConfig, RopeConfig, RopeScaling, Routing, MAX_DIM};
use crate::error::{Error, Result};
use crate::format::json::Json;

/// What mixes tokens in a layer (spec §0.2): standard attention, MLA (§3.3) or KDA (§4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    /// Multi-head attention with a K/V cache.
    Attention,
    /// Multi-head latent attention (a latent cache).
    Mla,
    /// Kimi Delta Attention (a fixed-size recurrent state).
    Kda,
}

/// How MLA rotates its `qk_rope_head_dim` channels (spec §0.5, §4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaRope {
    /// GPT-J pairs (`x[2j]`, `x[2j+1]`): DeepSeek-V2, and V3 with `rope_interleave` (its default).
    Interleaved,
    /// NeoX pairs (`x[j]`, `x[j + d/2]`): V3 with `rope_interleave: false`.
    HalfSplit,
    /// Kimi-Linear: no rotation at all; q_pe and k_pe enter the dot product as they are.
    None,
}

/// The KDA geometry of Kimi-Linear (spec §4.1 `linear_attn_config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdaConfig {
    /// KDA heads H (`num_heads`).
    pub heads: usize,
    /// Channels per head D (`head_dim`).
    pub head_dim: usize,
    /// Short-convolution kernel K (4).
    pub conv_kernel: usize,
}

impl KdaConfig {
    /// H·D, the width of q, k, v, the gates and the output.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// MLA geometry and the per-layer mixer schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    /// `q_lora_rank`: `None` means a direct `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// `kv_lora_rank`: width of the cached latent.
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`: per-head query/key channels without rotation.
    pub nope_dim: usize,
    /// `qk_rope_head_dim`: rotated channels (the key's shared by every head).
    pub rope_dim: usize,
    /// `v_head_dim`.
    pub v_dim: usize,
    /// How the rotated channels are paired.
    pub rope: MlaRope,
    /// Softmax scale (d_n + d_r)^-0.5 · mscale² (spec §3.5), rounded to f32 as torch does.
    pub scale: f32,
    /// YaRN's `attention_factor`, multiplying cos and sin (spec §0.5); 1 without scaling.
    pub rope_factor: f32,
    /// `attention_bias`: biases on q_a_proj, kv_a_proj_with_mqa and o_proj (spec §3.2).
    pub bias: bool,
    /// Per layer: MLA or KDA.
    pub mixers: Vec<Mixer>,
    /// KDA geometry, when some layer is KDA.
    pub kda: Option<KdaConfig>,
    /// `quantization_config.weight_block_size` [rows, cols] of an FP8 checkpoint (spec §3.9,
    /// `format::fp8`): its F8_E4M3 weights carry one scale per block of this size.
    pub fp8_block: Option<[usize; 2]>,
}

impl MlaConfig {
    /// Floats one MLA layer caches per token: the latent and the (rotated) shared key.
    pub fn latent_width(&self) -> usize {
        self.kv_lora_rank + self.rope_dim
    }

    /// Width of one head's query: d_n + d_r.
    pub fn q_head_dim(&self) -> usize {
        self.nope_dim + self.rope_dim
    }

    /// Layers of `kind`.
    pub fn count(&self, kind: Mixer) -> usize {
        self.mixers.iter().filter(|&&m| m == kind).count()
    }
}

impl ModelConfig {
    /// The mixer of layer `l`.
    pub fn mixer(&self, l: usize) -> Mixer {
        self.mla.as_ref().and_then(|m| m.mixers.get(l).copied()).unwrap_or(Mixer::Attention)
    }

    /// The FP8 block size of the checkpoint's F8_E4M3 weights (`quantization_config`), if any.
    pub fn fp8_block(&self) -> Option<[usize; 2]> {
        self.mla.as_ref().and_then(|m| m.fp8_block)
    }

    /// Layers with a standard K/V cache (the latent families have none).
    pub fn kv_cache_layers(&self) -> usize {
        match (self.mla.as_ref(), self.gdn.as_ref()) {
            (Some(_), _) => 0,
            // Qwen3-Next: only the full-attention layers (`kv_slot` numbers them).
            (None, Some(g)) => self.layers - g.count(),
            (None, None) => self.layers,
        }
    }
}

/// The class defaults that differ between the three families (transformers 5.24.0).
struct Defaults {
    q_lora_rank: Option<usize>,
    experts: usize,
    top_k: Option<usize>,
    moe_intermediate: usize,
    shared: usize,
    first_dense: usize,
    scaling: f64,
    max_position: usize,
    /// `n_group`, `topk_group` when absent.
    groups: (usize, usize),
}

fn defaults(arch: Arch) -> Defaults {
    match arch {
        Arch::DeepseekV2 => Defaults { q_lora_rank: Some(1536), experts: 64, top_k: None, moe_intermediate: 1407, shared: 2,
            first_dense: 0, scaling: 1.0, max_position: 2048, groups: (1, 1) },
        Arch::KimiLinear => Defaults { q_lora_rank: None, experts: 256, top_k: Some(8), moe_intermediate: 1024, shared: 1,
            first_dense: 1, scaling: 2.446, max_position: 1 << 20, groups: (1, 1) },
        // Glm4MoeConfig (only its MoE fields are read through this table).
        Arch::Glm4Moe => Defaults { q_lora_rank: None, experts: 128, top_k: Some(8), moe_intermediate: 1408, shared: 1,
            first_dense: 1, scaling: 1.0, max_position: 131072, groups: (1, 1) },
        _ => Defaults { q_lora_rank: Some(1536), experts: 256, top_k: Some(8), moe_intermediate: 2048, shared: 1,
            first_dense: 3, scaling: 2.5, max_position: 4096, groups: (8, 4) },
    }
}

impl Fields<'_> {
    /// The first of `keys` present and non-null (Kimi's names, then DeepSeek's: spec §0.7).
    fn first_of(&self, keys: &[&'static str]) -> Option<&'static str> {
        keys.iter().copied().find(|k| self.get(k).is_some())
    }
    fn usize_alias(&self, keys: &[&'static str], default: Option<usize>) -> Result<usize> {
        match self.first_of(keys) {
            Some(k) => self.usize_req(k),
            None => default.ok_or_else(|| Error::config(self.path, keys[0], "missing")),
        }
    }
    fn positive(&self, key: &str, v: usize) -> Result<usize> {
        if v == 0 || v > MAX_DIM {
            return Err(Error::config(self.path, key, format!("{v} is out of range 1..={MAX_DIM}")));
        }
        Ok(v)
    }
    fn refuse(&self, key: &str, why: &str) -> Error {
        Error::unsupported(format!("{}: field `{key}`: {why}", self.path.display()))
    }
}

/// Reads a DeepSeek-V2/V3 or Kimi-Linear config (spec §3.1, §4.1).
pub(super) fn from_json(f: &Fields, family: &Family, class: String) -> Result<ModelConfig> {
    let arch = family.arch;
    let d = defaults(arch);
    let hidden = f.positive("hidden_size", f.usize_req("hidden_size")?)?;
    let layers = f.positive("num_hidden_layers", f.usize_req("num_hidden_layers")?)?;
    let heads = f.positive("num_attention_heads", f.usize_req("num_attention_heads")?)?;
    let vocab = f.positive("vocab_size", f.usize_req("vocab_size")?)?;
    refuse_variants(f, arch)?;
    // Read before the rope, whose YaRN factor may be derived from it.
    let max_position = match f.first_of(&["model_max_length", "max_position_embeddings"]) {
        Some(k) => f.max_position(k, d.max_position)?,
        None => d.max_position,
    };
    let rms_eps = f.f64_opt("rms_norm_eps")?.unwrap_or(family.default_rms_eps);
    if !(rms_eps > 0.0 && rms_eps < 1.0) {
        return Err(Error::config(f.path, "rms_norm_eps", format!("{rms_eps} is out of range (0, 1)")));
    }
    let (rope, mla) = parse_mla(f, arch, layers, &d)?;
    let moe = parse_moe(f, family, layers, &d)?;
    let intermediate = f.usize_opt("intermediate_size")?.unwrap_or(0);
    if intermediate > MAX_DIM || (moe.moe_layers.iter().any(|&m| !m) && intermediate == 0) {
        return Err(Error::config(f.path, "intermediate_size", "missing, zero or out of range (a dense layer needs it)"));
    }
    Ok(ModelConfig {
        arch,
        class,
        hidden,
        intermediate,
        layers,
        heads,
        kv_heads: heads,
        head_dim: mla.q_head_dim(),
        vocab,
        rms_eps: rms_eps as f32,
        rope,
        tie_embeddings: f.bool_or("tie_word_embeddings", false)?,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: arch == Arch::DeepseekV2 && f.bool_or("mlp_bias", false)?,
        qk_norm: super::QkNorm::None,
        clip_qkv: None,
        sliding_window: vec![None; layers],
        max_position,
        bos_token: f.token_ids("bos_token_id")?.first().copied(),
        eos_tokens: f.token_ids("eos_token_id")?,
        moe: Some(moe),
        mla: Some(mla),
        mtp_layers: 0,
        gdn: None,
        gpt_oss: None,
    })
}

/// Variants the engine would compute wrongly if it read past them (spec §3.9, §4.8): refused,
/// naming the field.
fn refuse_variants(f: &Fields, arch: Arch) -> Result<()> {
    match f.get("hidden_act") {
        None => {}
        Some(Json::String(a)) if a == "silu" || a == "swish" => {}
        Some(v) => return Err(f.refuse("hidden_act", &format!("{} is not supported (the feed-forward is SwiGLU: `silu`)",
            v.to_string_compact()))),
    }
    if arch != Arch::KimiLinear {
        return Ok(());
    }
    let lin = f.get("linear_attn_config");
    let in_lin = |k: &str| lin.and_then(|l| l.get(k)).filter(|v| !v.is_null());
    if in_lin("gate_lower_bound").is_some() {
        return Err(f.refuse("linear_attn_config.gate_lower_bound", "a bounded forget gate (Kimi K3) is not supported (spec §4.8)"));
    }
    for key in ["use_full_rank_gate", "mla_use_output_gate"] {
        let on = match in_lin(key).or_else(|| f.get(key)) {
            None => false,
            Some(v) => v.as_bool().ok_or_else(|| Error::config(f.path, key, "expected a boolean"))?,
        };
        if on {
            return Err(f.refuse(key, "true is a Kimi K3 variant, not supported (spec §4.8)"));
        }
    }
    for key in ["routed_expert_hidden_size", "attn_res_block_size"] {
        if f.get(key).is_some() || in_lin(key).is_some() {
            return Err(f.refuse(key, "is a Kimi K3 variant, not supported (spec §4.8)"));
        }
    }
    if f.root.get("q_lora_rank").is_some_and(|v| !v.is_null()) {
        return Err(f.refuse("q_lora_rank", "must be null for Kimi-Linear: a q-LoRA Kimi is a K3 variant, not supported (spec §4.8)"));
    }
    if !f.bool_or("mla_use_nope", true)? {
        return Err(f.refuse("mla_use_nope", "false: Kimi-Linear's MLA layers take no RoPE (the remote code asserts it, transformers never rotates; spec §4.4)"));
    }
    if let Some(a) = f.get("moe_router_activation_func") {
        if a.as_str() != Some("sigmoid") {
            return Err(f.refuse("moe_router_activation_func", &format!("{} is not supported (only sigmoid, spec §4.5)", a.to_string_compact())));
        }
    }
    Ok(())
}

/// `quantization_config` (spec §3.9): only DeepSeek's FP8 scheme — `quant_method` "fp8", `fmt`
/// "e4m3", `weight_block_size` [rows, cols] — is read; any other field or value is refused by
/// name. `activation_scheme` "dynamic" and `scale_fmt` "ue8m0" describe how the reference
/// kernels quantize *activations* (per token group, at run time); the engine keeps activations
/// in f32 and computes with the exactly decoded weights (the oracle: transformers on the
/// dequantized weights), so they change nothing here and are accepted; any other value is not.
fn parse_fp8(f: &Fields) -> Result<Option<[usize; 2]>> {
    let Some(q) = f.get("quantization_config") else { return Ok(None) };
    let members = q.as_object().ok_or_else(|| Error::config(f.path, "quantization_config", "expected an object"))?;
    let text = |key: &str, allowed: &[&str]| -> Result<()> {
        let field = format!("quantization_config.{key}");
        match q.get(key).and_then(Json::as_str) {
            Some(v) if allowed.contains(&v) => Ok(()),
            Some(v) => Err(f.refuse(&field, &format!("`{v}` is not supported (only {})", allowed.join(", ")))),
            None => Err(Error::config(f.path, &field, "missing or not a string")),
        }
    };
    text("quant_method", &["fp8"])?;
    let mut block = None;
    for (key, value) in members {
        match key.as_str() {
            "quant_method" => {}
            "fmt" => text("fmt", &["e4m3"])?,
            "activation_scheme" => text("activation_scheme", &["dynamic"])?,
            "scale_fmt" => text("scale_fmt", &["ue8m0"])?,
            "weight_block_size" => {
                let dims = value.as_array().filter(|a| a.len() == 2)
                    .and_then(|a| a.iter().map(|d| d.as_u64().filter(|&d| d >= 1 && d <= MAX_DIM as u64)).collect::<Option<Vec<u64>>>())
                    .ok_or_else(|| Error::config(f.path, "quantization_config.weight_block_size",
                        format!("{} is not two integers in 1..={MAX_DIM}", value.to_string_compact())))?;
                block = Some([dims[0] as usize, dims[1] as usize]);
            }
            other => return Err(f.refuse(&format!("quantization_config.{other}"), "is not supported (an FP8 checkpoint has quant_method, fmt, \
activation_scheme, weight_block_size)")),
        }
    }
    block.map(Some).ok_or_else(|| Error::config(f.path, "quantization_config.weight_block_size",
        "missing: an FP8 checkpoint's scales are one per block of this size"))
}

/// `q_lora_rank`: an explicit null is a direct q_proj; a missing key is the class default
/// (1536 for DeepSeek, spec §3.1).
fn q_lora_rank(f: &Fields, d: &Defaults) -> Result<Option<usize>> {
    match f.root.get("q_lora_rank") {
        None => Ok(d.q_lora_rank),
        Some(v) if v.is_null() => Ok(None),
        Some(_) => Ok(Some(f.positive("q_lora_rank", f.usize_req("q_lora_rank")?)?)),
    }
}

/// MLA dimensions, the rope, the softmax scale and the mixer schedule.
fn parse_mla(f: &Fields, arch: Arch, layers: usize, d: &Defaults) -> Result<(RopeConfig, MlaConfig)> {
    let dim = |key: &str, default: usize| -> Result<usize> { f.positive(key, f.usize_opt(key)?.unwrap_or(default)) };
    let kv_lora_rank = dim("kv_lora_rank", 512)?;
    let nope_dim = dim("qk_nope_head_dim", 128)?;
    let rope_dim = dim("qk_rope_head_dim", 64)?;
    let v_dim = dim("v_head_dim", 128)?;
    if rope_dim % 2 != 0 {
        return Err(Error::config(f.path, "qk_rope_head_dim", format!("{rope_dim} must be even")));
    }
    let (rope, rope_factor, mscale) = match arch {
        // Spec §4.4: no positional encoding in Kimi's MLA; cos/sin are never computed.
        Arch::KimiLinear => (RopeConfig { theta: 10000.0, dim: 0, scaling: RopeScaling::None }, 1.0, 1.0),
        _ => parse_rope(f, rope_dim)?,
    };
    let layout = match arch {
        Arch::KimiLinear => MlaRope::None,
        Arch::DeepseekV2 => MlaRope::Interleaved,
        _ if f.bool_or("rope_interleave", true)? => MlaRope::Interleaved,
        _ => MlaRope::HalfSplit,
    };
    // Spec §3.5, in the reference's Python floats: qk_head_dim ** -0.5 * mscale * mscale.
    let scale = (((nope_dim + rope_dim) as f64).powf(-0.5) * mscale * mscale) as f32;
    let (mixers, kda) = match arch {
        Arch::KimiLinear => {
            let (m, k) = kimi_schedule(f, layers)?;
            (m, Some(k))
        }
        _ => (vec![Mixer::Mla; layers], None),
    };
    let mla = MlaConfig { q_lora_rank: q_lora_rank(f, d)?, kv_lora_rank, nope_dim, rope_dim, v_dim, rope: layout, scale,
        rope_factor: rope_factor as f32, bias: f.bool_or("attention_bias", false)?, mixers, kda, fp8_block: parse_fp8(f)? };
    Ok((rope, mla))
}

/// DeepSeek's rope fields, merged as spec §0.7 says (`rope_parameters`, then `rope_scaling`, then
/// the top-level `rope_theta`): the frequencies, YaRN's cos/sin factor and the mscale that
/// enters the softmax scale squared (spec §0.5, §3.5).
fn parse_rope(f: &Fields, rope_dim: usize) -> Result<(RopeConfig, f64, f64)> {
    let (params, scaling) = (f.get("rope_parameters"), f.get("rope_scaling"));
    let section = if params.is_some() { "rope_parameters" } else { "rope_scaling" };
    let lookup = |key: &str| -> Option<&Json> {
        params.and_then(|p| p.get(key)).filter(|v| !v.is_null())
            .or_else(|| scaling.and_then(|s| s.get(key)).filter(|v| !v.is_null()))
    };
    let num = |key: &str| f64_of(f.path, &format!("{section}.{key}"), lookup(key));
    let theta = match num("rope_theta")? {
        Some(t) => t,
        None => f.f64_opt("rope_theta")?.unwrap_or(10000.0),
    };
    if theta.is_nan() || theta <= 1.0 {
        return Err(Error::config(f.path, "rope_theta", format!("{theta} must be greater than 1")));
    }
    let kind = lookup("rope_type").or_else(|| lookup("type")).and_then(Json::as_str).unwrap_or("default");
    let plain = RopeConfig { theta, dim: rope_dim, scaling: RopeScaling::None };
    match kind {
        "default" => return Ok((plain, 1.0, 1.0)),
        "yarn" => {}
        other => return Err(f.refuse(&format!("{section}.rope_type"), &format!("`{other}` is not supported for MLA (default or yarn)"))),
    }
    let original_max = num("original_max_position_embeddings")?.ok_or_else(|| Error::config(f.path,
        &format!("{section}.original_max_position_embeddings"), "missing for rope_type `yarn`"))?;
    let y = parse_yarn(f, section, &lookup, original_max, 4096)?;
    Ok((RopeConfig { scaling: y.scaling, ..plain }, y.attention_factor, y.softmax_mscale))
}

/// YaRN's parameters once the original context is known (spec §0.5, transformers'
/// `_compute_yarn_parameters`): the factor (derived from the context lengths when missing),
/// the ramp's betas (a zero takes the default, as `or 32` / `or 1` do), `truncate` (default
/// true), and the attention factor — `attention_factor` when given, else the ratio of the two
/// mscales when both are set, else `0.1·ln(factor) + 1`. `lookup` finds a field of `section`;
/// `max_position_default` stands in for a missing `max_position_embeddings`.
pub(super) fn parse_yarn<'j>(f: &Fields, section: &str, lookup: &dyn Fn(&str) -> Option<&'j Json>, original_max: f64,
    max_position_default: usize) -> Result<Yarn> {
    let num = |key: &str| f64_of(f.path, &format!("{section}.{key}"), lookup(key));
    let factor = match num("factor")? {
        Some(x) => x,
        None => f.max_position("max_position_embeddings", max_position_default)? as f64 / original_max,
    };
    if !(factor > 0.0 && original_max >= 1.0) {
        return Err(Error::config(f.path, section, "yarn needs factor > 0 and original_max_position_embeddings >= 1"));
    }
    let (mscale, mscale_all) = (num("mscale")?.unwrap_or(0.0), num("mscale_all_dim")?.unwrap_or(0.0));
    let attention_factor = match num("attention_factor")? {
        Some(a) => a,
        None if mscale != 0.0 && mscale_all != 0.0 => yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all),
        None => yarn_mscale(factor, 1.0),
    };
    let beta = |key: &str, default: f64| -> Result<f64> { Ok(num(key)?.filter(|&b| b != 0.0).unwrap_or(default)) };
    let truncate = match lookup("truncate").filter(|v| !v.is_null()) {
        None => true,
        Some(v) => v.as_bool().ok_or_else(|| Error::config(f.path, &format!("{section}.truncate"), "expected a boolean"))?,
    };
    let scaling = RopeScaling::Yarn { factor, original_max, beta_fast: beta("beta_fast", 32.0)?, beta_slow: beta("beta_slow", 1.0)?, truncate };
    let softmax_mscale = if mscale_all != 0.0 { yarn_mscale(factor, mscale_all) } else { 1.0 };
    Ok(Yarn { scaling, attention_factor, softmax_mscale })
}

/// What [`parse_yarn`] reads.
pub(super) struct Yarn {
    /// The frequencies' scaling.
    pub scaling: RopeScaling,
    /// What cos and sin are multiplied by.
    pub attention_factor: f64,
    /// `get_mscale(factor, mscale_all_dim)` (1 without it): DeepSeek's softmax scale takes it
    /// squared (spec §3.5).
    pub softmax_mscale: f64,
}

/// YaRN's `get_mscale`: 1 up to a factor of 1, then `0.1·m·ln(s) + 1`.
fn yarn_mscale(s: f64, m: f64) -> f64 {
    if s <= 1.0 { 1.0 } else { 0.1 * m * s.ln() + 1.0 }
}

/// Kimi's mixer per layer and the KDA geometry (spec §4.1): `layer_types` as transformers 5
/// saves it, or the 1-based `kda_layers` / `full_attn_layers`; when both are present they must
/// agree.
fn kimi_schedule(f: &Fields, layers: usize) -> Result<(Vec<Mixer>, KdaConfig)> {
    let lin = f.get("linear_attn_config");
    let lin_usize = |key: &str, alt: &str, default: usize| -> Result<usize> {
        let v = match lin.and_then(|l| l.get(key)).filter(|v| !v.is_null()) {
            Some(v) => v.as_u64().and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| Error::config(f.path, &format!("linear_attn_config.{key}"), "expected a non-negative integer"))?,
            None => f.usize_opt(alt)?.unwrap_or(default),
        };
        f.positive(&format!("linear_attn_config.{key}"), v)
    };
    let kda = KdaConfig {
        heads: lin_usize("num_heads", "linear_num_heads", 32)?,
        head_dim: lin_usize("head_dim", "linear_head_dim", 128)?,
        conv_kernel: lin_usize("short_conv_kernel_size", "linear_conv_kernel_dim", 4)?,
    };
    if kda.conv_kernel > 64 {
        return Err(Error::config(f.path, "linear_attn_config.short_conv_kernel_size", format!("{} is out of range 1..=64", kda.conv_kernel)));
    }
    let from_types = match f.get("layer_types") {
        None => None,
        Some(v) => {
            let a = v.as_array().filter(|a| a.len() == layers)
                .ok_or_else(|| Error::config(f.path, "layer_types", format!("expected a list of {layers} layer types")))?;
            Some(a.iter().enumerate().map(|(l, t)| match t.as_str() {
                Some("linear_attention") => Ok(Mixer::Kda),
                Some("full_attention") => Ok(Mixer::Mla),
                _ => Err(Error::config(f.path, &format!("layer_types[{l}]"), "expected `linear_attention` or `full_attention`")),
            }).collect::<Result<Vec<_>>>()?)
        }
    };
    let from_lists = match (lin.and_then(|l| l.get("kda_layers")), lin.and_then(|l| l.get("full_attn_layers"))) {
        (Some(k), Some(a)) => Some(one_based_schedule(f, k, a, layers)?),
        _ => None,
    };
    let mixers = match (from_types, from_lists) {
        (Some(t), Some(l)) if t != l => return Err(Error::config(f.path, "layer_types",
            "disagrees with linear_attn_config.kda_layers / full_attn_layers (1-based, spec §4.1)")),
        (Some(t), _) => t,
        (None, Some(l)) => l,
        (None, None) => return Err(Error::config(f.path, "linear_attn_config.kda_layers",
            "missing, and there is no layer_types: which layers are KDA cannot be told (spec §4.6)")),
    };
    Ok((mixers, kda))
}

/// `kda_layers` and `full_attn_layers` are 1-based (spec §4.1): layer l is KDA iff l+1 is listed.
fn one_based_schedule(f: &Fields, kda: &Json, full: &Json, layers: usize) -> Result<Vec<Mixer>> {
    let mut out: Vec<Option<Mixer>> = vec![None; layers];
    for (key, list, kind) in [("kda_layers", kda, Mixer::Kda), ("full_attn_layers", full, Mixer::Mla)] {
        let field = format!("linear_attn_config.{key}");
        let a = list.as_array().ok_or_else(|| Error::config(f.path, &field, "expected a list of 1-based layer numbers"))?;
        for v in a {
            let n = v.as_u64().and_then(|n| usize::try_from(n).ok()).filter(|&n| n >= 1 && n <= layers)
                .ok_or_else(|| Error::config(f.path, &field, format!("{} is not a layer number in 1..={layers}", v.to_string_compact())))?;
            if out[n - 1].replace(kind).is_some_and(|k| k != kind) {
                return Err(Error::config(f.path, &field, format!("layer {n} is listed as both KDA and full attention")));
            }
        }
    }
    out.iter().enumerate().map(|(l, m)| m.ok_or_else(|| Error::config(f.path, "linear_attn_config",
        format!("layer {} (1-based) is in neither kda_layers nor full_attn_layers", l + 1)))).collect()
}

/// The MoE block of a family that routes as DeepSeek-V3 does, with its own class defaults
/// (GLM-4.5: sigmoid scores, correction bias, groups, gate-less shared experts).
pub(super) fn sigmoid_moe(f: &Fields, family: &Family, layers: usize) -> Result<MoeConfig> {
    parse_moe(f, family, layers, &defaults(family.arch))
}

/// The MoE block (spec §3.1, §3.6–3.8, §4.5): experts, widths, which layers, and the routing.
fn parse_moe(f: &Fields, family: &Family, layers: usize, d: &Defaults) -> Result<MoeConfig> {
    let arch = family.arch;
    let experts_key = f.first_of(&["n_routed_experts", "num_experts", "num_local_experts"]).unwrap_or("n_routed_experts");
    let experts = f.usize_alias(&["n_routed_experts", "num_experts", "num_local_experts"], Some(d.experts))?;
    if experts == 0 || experts > 1 << 16 {
        return Err(Error::config(f.path, experts_key, format!("{experts} is out of range 1..=65536")));
    }
    let top_key = f.first_of(&["num_experts_per_tok", "num_experts_per_token"]).unwrap_or("num_experts_per_tok");
    let top_k = f.usize_alias(&["num_experts_per_tok", "num_experts_per_token"], d.top_k)?;
    if top_k == 0 || top_k > experts.min(64) {
        return Err(Error::config(f.path, top_key, format!("{top_k} is out of range 1..={}", experts.min(64))));
    }
    let width = f.positive("moe_intermediate_size", f.usize_opt("moe_intermediate_size")?.unwrap_or(d.moe_intermediate))?;
    let shared = f.usize_alias(&["n_shared_experts", "num_shared_experts"], Some(d.shared))?;
    let first_dense = f.usize_opt("first_k_dense_replace")?.unwrap_or(d.first_dense);
    // Only the remote code reads moe_layer_freq (spec §3.8); any value but 1 would split the
    // references, so it is refused.
    if f.usize_opt("moe_layer_freq")?.is_some_and(|v| v != 1) {
        return Err(f.refuse("moe_layer_freq", "only 1 is supported (transformers ignores the field, the remote code does not; spec §3.8)"));
    }
    let moe_layers = match f.get("mlp_layer_types").filter(|_| arch == Arch::KimiLinear) {
        Some(v) => {
            let a = v.as_array().filter(|a| a.len() == layers)
                .ok_or_else(|| Error::config(f.path, "mlp_layer_types", format!("expected a list of {layers} entries")))?;
            a.iter().enumerate().map(|(l, t)| match t.as_str() {
                Some("sparse") => Ok(true),
                Some("dense") => Ok(false),
                _ => Err(Error::config(f.path, &format!("mlp_layer_types[{l}]"), "expected `dense` or `sparse`")),
            }).collect::<Result<Vec<bool>>>()?
        }
        None => (0..layers).map(|l| l >= first_dense).collect(),
    };
    let routing = parse_routing(f, arch, experts, top_k, d)?;
    let layout = family.moe.ok_or_else(|| Error::config(f.path, "architectures", "family without a MoE layout"))?;
    let shared_intermediate = width.checked_mul(shared).ok_or_else(|| Error::config(f.path, "n_shared_experts",
        format!("{shared} shared experts of moe_intermediate_size {width} overflow the address space")))?;
    Ok(MoeConfig { layout, experts, top_k, expert_intermediate: width, routing, shared_intermediate, moe_layers })
}

/// Spec §3.6 (V3, Kimi: sigmoid, bias for selection, groups by their top-2 sum) and §3.7 (V2:
/// softmax, greedy or group_limited_greedy by the group max).
fn parse_routing(f: &Fields, arch: Arch, experts: usize, top_k: usize, d: &Defaults) -> Result<Routing> {
    let groups_key = f.first_of(&["n_group", "num_expert_group"]).unwrap_or("n_group");
    let mut groups = f.usize_opt(groups_key)?.unwrap_or(d.groups.0);
    let mut topk_group = f.usize_opt("topk_group")?.unwrap_or(d.groups.1);
    let scale = f.f64_opt("routed_scaling_factor")?.unwrap_or(d.scaling);
    if scale.is_nan() || scale <= 0.0 {
        return Err(Error::config(f.path, "routed_scaling_factor", format!("{scale} must be positive")));
    }
    let method = f.get("topk_method").and_then(Json::as_str);
    let scoring = f.get("scoring_func").and_then(Json::as_str);
    let sigmoid = arch != Arch::DeepseekV2;
    if let Some(s) = scoring.filter(|&s| s != if sigmoid { "sigmoid" } else { "softmax" }) {
        return Err(f.refuse("scoring_func", &format!("`{s}` is not what {:?} computes (spec §3.6, §3.7)", arch)));
    }
    if sigmoid {
        if let Some(m) = method.filter(|&m| m != "noaux_tc") {
            return Err(f.refuse("topk_method", &format!("`{m}`: sigmoid routing is noaux_tc (spec §3.6)")));
        }
        if arch == Arch::KimiLinear && !f.bool_or("use_grouped_topk", true)? && groups > 1 {
            return Err(f.refuse("use_grouped_topk", "false with num_expert_group > 1: the references disagree (spec §4.7)"));
        }
    } else {
        match method.unwrap_or("greedy") {
            "greedy" => (groups, topk_group) = (1, 1),
            "group_limited_greedy" => {
                for key in [groups_key, "topk_group"] {
                    if f.get(key).is_none() {
                        return Err(Error::config(f.path, key, "missing for topk_method `group_limited_greedy` (DeepseekV2Config has no default)"));
                    }
                }
            }
            m => return Err(f.refuse("topk_method", &format!("`{m}` is not a DeepSeek-V2 method (greedy, group_limited_greedy)"))),
        }
        // The remote code normalises *instead of* scaling, transformers does neither (spec §3.7).
        if f.bool_or("norm_topk_prob", false)? {
            return Err(f.refuse("norm_topk_prob", "true for DeepSeek-V2: transformers ignores it, the remote code renormalises instead of scaling (spec §3.7)"));
        }
    }
    let per_group = experts.checked_div(groups).unwrap_or(0);
    if groups == 0 || !experts.is_multiple_of(groups) {
        return Err(Error::config(f.path, groups_key, format!("{groups} does not divide the {experts} experts")));
    }
    if topk_group == 0 || topk_group > groups {
        return Err(Error::config(f.path, "topk_group", format!("{topk_group} is out of range 1..={groups}")));
    }
    // The group score of sigmoid routing is the sum of each group's two best (spec §3.6).
    if sigmoid && groups > 1 && per_group < 2 {
        return Err(Error::config(f.path, groups_key, format!("{groups} groups of {per_group} expert: a group score needs two")));
    }
    if top_k > topk_group * per_group {
        return Err(Error::config(f.path, "topk_group", format!("{topk_group} groups of {per_group} hold fewer than the {top_k} experts per token")));
    }
    Ok(if sigmoid {
        let renormalize = f.bool_or(if arch == Arch::KimiLinear && f.get("norm_topk_prob").is_none() { "moe_renormalize" } else { "norm_topk_prob" }, true)?;
        Routing::Sigmoid { groups, topk_group, renormalize, scale: scale as f32 }
    } else {
        Routing::SoftmaxGroups { groups, topk_group, scale: scale as f32 }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;
    use crate::ErrorKind;
    use std::path::Path;

    fn cfg(text: &str) -> Result<ModelConfig> {
        ModelConfig::from_json(Path::new("config.json"), &crate::format::json::parse(text.as_bytes()).must())
    }

    const V3: &str = r#""architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 96, "moe_intermediate_size": 32,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "kv_lora_rank": 16,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12, "first_k_dense_replace": 1"#;
    const KIMI: &str = r#""architectures": ["KimiLinearForCausalLM"], "hidden_size": 64, "num_hidden_layers": 5,
        "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_experts": 8, "num_experts_per_token": 2, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 16, "q_lora_rank": null"#;
    const LISTS: &str = r#""linear_attn_config": {"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4,
        "kda_layers": [1, 2, 3, 5], "full_attn_layers": [4]}"#;

    #[test]
    fn kimi_layer_lists_are_one_based() {
        let c = cfg(&format!("{{{KIMI}, {LISTS}}}")).must();
        let m = c.mla.as_ref().must();
        assert_eq!(m.mixers, [Mixer::Kda, Mixer::Kda, Mixer::Kda, Mixer::Mla, Mixer::Kda]);
        assert_eq!(m.kda, Some(KdaConfig { heads: 4, head_dim: 16, conv_kernel: 4 }));
        assert_eq!((m.rope, c.rope.dim, c.kv_cache_layers()), (MlaRope::None, 0, 0));
        assert_eq!(c.moe.as_ref().must().moe_layers, [false, true, true, true, true], "first_k_dense_replace defaults to 1");
        // transformers 5's layer_types agrees, or the config is refused naming it.
        let types = r#""layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"]"#;
        assert_eq!(cfg(&format!("{{{KIMI}, {LISTS}, {types}}}")).must(), c);
        let wrong = types.replacen("full_attention", "linear_attention", 1).replacen("\"linear_attention\"]", "\"full_attention\"]", 1);
        let e = cfg(&format!("{{{KIMI}, {LISTS}, {wrong}}}")).unwrap_err();
        assert!(e.to_string().contains("layer_types") && e.to_string().contains("1-based"), "{e}");
        let e = cfg(&format!("{{{KIMI}}}")).unwrap_err();
        assert!(e.to_string().contains("kda_layers"), "{e}");
        let e = cfg(&format!("{{{KIMI}, {}}}", LISTS.replace("[4]", "[4, 6]"))).unwrap_err();
        assert!(e.to_string().contains("full_attn_layers") && e.to_string().contains("1..=5"), "{e}");
    }

    /// Spec §4.8 (Kimi K3 variants), §3.9 (FP8) and the fields the references read differently:
    /// refused, naming the field, as Unsupported.
    #[test]
    fn variants_the_engine_would_compute_wrongly_are_refused() {
        let kimi = |extra: &str| cfg(&format!("{{{KIMI}, {LISTS}, {extra}}}"));
        let lin_gate = LISTS.replace("\"num_heads\": 4", "\"num_heads\": 4, \"gate_lower_bound\": -5");
        let cases: Vec<(Result<ModelConfig>, &str)> = vec![
            (cfg(&format!("{{{KIMI}, {lin_gate}}}")), "linear_attn_config.gate_lower_bound"),
            (kimi(r#""use_full_rank_gate": true"#), "use_full_rank_gate"),
            (kimi(r#""mla_use_output_gate": true"#), "mla_use_output_gate"),
            (cfg(&format!("{{{}, {LISTS}}}", KIMI.replace(r#""q_lora_rank": null"#, r#""q_lora_rank": 32"#))), "q_lora_rank"),
            (kimi(r#""routed_expert_hidden_size": 512"#), "routed_expert_hidden_size"),
            (kimi(r#""hidden_act": "situ""#), "hidden_act"),
            (kimi(r#""attn_res_block_size": 8"#), "attn_res_block_size"),
            (kimi(r#""mla_use_nope": false"#), "mla_use_nope"),
            (kimi(r#""moe_router_activation_func": "softmax""#), "moe_router_activation_func"),
            (cfg(&format!(r#"{{{V3}, "quantization_config": {{"quant_method": "bitsandbytes", "weight_block_size": [128, 128]}}}}"#)),
                "quantization_config.quant_method"),
            (cfg(&format!(r#"{{{V3}, "quantization_config": {{"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}}}}"#)),
                "quantization_config.fmt"),
            (cfg(&format!(r#"{{{V3}, "quantization_config": {{"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}}}}"#)),
                "quantization_config.activation_scheme"),
            (cfg(&format!(r#"{{{V3}, "quantization_config": {{"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": []}}}}"#)),
                "quantization_config.modules_to_not_convert"),
            (cfg(&format!(r#"{{{V3}, "moe_layer_freq": 2}}"#)), "moe_layer_freq"),
            (cfg(&format!(r#"{{{V3}, "topk_method": "group_limited_greedy"}}"#)), "topk_method"),
            (cfg(&format!(r#"{{{V3}, "rope_parameters": {{"rope_type": "linear", "factor": 2.0}}}}"#)), "rope_parameters.rope_type"),
            (cfg(&format!(r#"{{{}, "norm_topk_prob": true}}"#, V3.replace("DeepseekV3", "DeepseekV2"))), "norm_topk_prob"),
            (cfg(&format!(r#"{{{}, "scoring_func": "sigmoid"}}"#, V3.replace("DeepseekV3", "DeepseekV2"))), "scoring_func"),
        ];
        for (got, field) in cases {
            let e = got.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{field}: {e}");
            assert!(e.to_string().contains(&format!("`{field}`")), "{field}: {e}");
        }
        let e = cfg(&format!(r#"{{{}}}"#, V3.replace(r#""n_group": 2"#, r#""n_group": 3"#))).unwrap_err();
        assert!(e.to_string().contains("n_group") && e.kind() == ErrorKind::Config, "{e}");
    }

    /// DeepSeek's FP8 quantization_config (spec §3.9) gives the block size; without the size it
    /// is refused naming the field.
    #[test]
    fn fp8_quantization_config_gives_the_block() {
        let q = |extra: &str| cfg(&format!(r#"{{{V3}, "quantization_config": {{"quant_method": "fp8", {extra}}}}}"#));
        let c = q(r#""fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 64]"#).must();
        assert_eq!(c.fp8_block(), Some([128, 64]));
        assert_eq!(cfg(&format!("{{{V3}}}")).must().fp8_block(), None);
        for (extra, field) in [(r#""fmt": "e4m3""#, "weight_block_size"), (r#""weight_block_size": [128]"#, "weight_block_size"),
                               (r#""weight_block_size": [0, 128]"#, "weight_block_size")] {
            let e = q(extra).unwrap_err();
            assert!(e.to_string().contains(&format!("quantization_config.{field}")), "{extra}: {e}");
        }
    }

    /// Spec §3.1, §3.5: q_lora_rank missing is the class default 1536, null a direct q_proj; the
    /// softmax scale carries mscale(factor, mscale_all_dim)² only under a non-default rope.
    #[test]
    fn defaults_and_softmax_scales_follow_the_reference() {
        let c = cfg(&format!("{{{V3}}}")).must();
        let m = c.mla.as_ref().must();
        assert_eq!((m.q_lora_rank, m.rope, m.rope_factor, c.head_dim, c.rope.dim), (Some(1536), MlaRope::Interleaved, 1.0, 24, 8));
        assert_eq!(c.moe.as_ref().must().routing, Routing::Sigmoid { groups: 2, topk_group: 1, renormalize: true, scale: 2.5 });
        assert_eq!(c.moe.as_ref().must().shared_intermediate, 32, "one shared expert by default");
        assert_eq!(cfg(&format!(r#"{{{V3}, "q_lora_rank": null}}"#)).must().mla.must().q_lora_rank, None);
        // DeepseekV3Config's n_group 8 / topk_group 4 when the fields are absent.
        let bare = V3.replace(r#""n_group": 2, "topk_group": 1, "#, "").replace(r#""n_routed_experts": 8"#, r#""n_routed_experts": 16"#);
        assert_eq!(cfg(&format!("{{{bare}}}")).must().moe.must().routing, Routing::Sigmoid { groups: 8, topk_group: 4, renormalize: true, scale: 2.5 });
        let glg = V3.replace("DeepseekV3", "DeepseekV2").replace(r#""n_group": 2, "#, "");
        let e = cfg(&format!(r#"{{{glg}, "topk_method": "group_limited_greedy"}}"#)).unwrap_err();
        assert!(e.to_string().contains("`n_group`"), "{e}");
        let real = |arch: &str, m_all: f64| {
            let dims = V3.replace("DeepseekV3", arch).replace(r#""qk_nope_head_dim": 16"#, r#""qk_nope_head_dim": 128"#)
                .replace(r#""qk_rope_head_dim": 8"#, r#""qk_rope_head_dim": 64"#);
            cfg(&format!(r#"{{{dims}, "rope_scaling": {{"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                "mscale": {m_all}, "mscale_all_dim": {m_all}, "beta_fast": 32, "beta_slow": 1}}, "rope_theta": 10000}}"#)).must()
        };
        let v3 = real("DeepseekV3", 1.0).mla.must();
        assert!((v3.scale - 0.1352338).abs() < 1e-6 && v3.rope_factor == 1.0, "{}", v3.scale);
        let lite = real("DeepseekV2", 0.707).mla.must();
        assert!((lite.scale - 0.1147214).abs() < 1e-6 && lite.rope_factor == 1.0, "{}", lite.scale);
        // Kimi: no mscale, whatever the rope fields say: (16 + 8)^-0.5 here, 192^-0.5 = 0.0721688 in the release.
        let kimi = cfg(&format!(r#"{{{KIMI}, {LISTS}, "rope_scaling": {{"type": "yarn", "factor": 40, "mscale_all_dim": 1}}}}"#)).must().mla.must();
        assert_eq!(kimi.scale, (24f64.powf(-0.5)) as f32);
        // V2: greedy by default (the group fields do nothing), x routed_scaling_factor (1.0).
        let v2 = cfg(&format!("{{{}}}", V3.replace("DeepseekV3", "DeepseekV2"))).must();
        assert_eq!(v2.moe.must().routing, Routing::SoftmaxGroups { groups: 1, topk_group: 1, scale: 1.0 });
    }
}
