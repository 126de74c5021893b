//! gpt-oss (`GptOssForCausalLM`, transformers 5.24.0 `GptOssConfig`): its config read with the
//! class's defaults, and the fields the rest of the engine reads only for this family.
//!
//! What is special: attention sinks (a learned logit per head in each softmax's denominator),
//! `layer_types` alternating sliding-window and full attention, YaRN whose `attention_factor`
//! multiplies cos and sin, biases on q/k/v/o, a biased router whose top-k logits are
//! softmaxed among themselves, and experts with biases and a clamped SwiGLU
//! (`(clamp(up, ±limit) + 1) · g·σ(α·g)` with `g = min(gate, limit)`).

use super::{f64_of, Arch, Family, Fields, ModelConfig, MoeConfig, MoeLayout, QkNorm, RopeConfig, RopeScaling, Routing, MAX_DIM};
use crate::error::{Error, Result};
use crate::format::json::Json;

/// The parts of a gpt-oss config the shared [`ModelConfig`] fields do not carry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptOssConfig {
    /// `swiglu_alpha`: the sigmoid's gain in the experts' gate.
    pub swiglu_alpha: f32,
    /// `swiglu_limit`: the clamp on gate (above) and up (both sides).
    pub swiglu_limit: f32,
    /// YaRN's `attention_factor` (1 without scaling): multiplies cos and sin, so q·k by its square.
    pub rope_attention_factor: f32,
}

/// The tensor layout: `mlp.router` and fused `mlp.experts.*` (read by `format::mxfp4`); the
/// names are those of the fused tensors, for messages.
pub const LAYOUT: MoeLayout = MoeLayout { block: "mlp", names: ["gate_up_proj", "gate_up_proj", "down_proj"], shared_expert: false };

/// Reads a gpt-oss config.json. Absent fields take `GptOssConfig`'s defaults; fields that would
/// change the computation in a way the engine does not follow are refused by name.
pub(super) fn from_json(f: &Fields, family: &Family, class: String) -> Result<ModelConfig> {
    let refuse = |key: &str, why: String| Error::unsupported(format!("{}: field `{key}`: {why}", f.path.display()));
    let or = |key: &str, default: usize| -> Result<usize> {
        let v = f.usize_opt(key)?.unwrap_or(default);
        if v == 0 || v > MAX_DIM {
            return Err(Error::config(f.path, key, format!("{v} is out of range 1..={MAX_DIM}")));
        }
        Ok(v)
    };
    let hidden = or("hidden_size", 2880)?;
    let layers = or("num_hidden_layers", 36)?;
    let heads = or("num_attention_heads", 64)?;
    let kv_heads = or("num_key_value_heads", heads)?;
    let vocab = or("vocab_size", 201088)?;
    let inter = or("intermediate_size", 2880)?;
    let head_dim = or("head_dim", 64)?;
    if heads % kv_heads != 0 {
        return Err(Error::config(f.path, "num_key_value_heads", format!("{kv_heads} does not divide num_attention_heads {heads}")));
    }
    if head_dim % 2 != 0 || head_dim > 4096 {
        return Err(Error::config(f.path, "head_dim", format!("{head_dim} must be even and at most 4096")));
    }
    let experts = f.usize_opt("num_local_experts")?.or(f.usize_opt("num_experts")?).unwrap_or(128);
    if experts == 0 || experts > 1 << 16 {
        return Err(Error::config(f.path, "num_local_experts", format!("{experts} is out of range 1..=65536")));
    }
    let top_k = f.usize_opt("num_experts_per_tok")?.unwrap_or(4);
    if top_k == 0 || top_k > experts.min(64) {
        return Err(Error::config(f.path, "num_experts_per_tok", format!("{top_k} is out of range 1..={}", experts.min(64))));
    }
    let rms_eps = f.f64_opt("rms_norm_eps")?.unwrap_or(family.default_rms_eps);
    if !(rms_eps > 0.0 && rms_eps < 1.0) {
        return Err(Error::config(f.path, "rms_norm_eps", format!("{rms_eps} is out of range (0, 1)")));
    }
    let positive = |key: &str, default: f64| -> Result<f32> {
        let v = f.f64_opt(key)?.unwrap_or(default);
        if v <= 0.0 {
            return Err(Error::config(f.path, key, format!("{v} must be positive")));
        }
        Ok(v as f32)
    };
    let (swiglu_alpha, swiglu_limit) = (positive("swiglu_alpha", 1.702)?, positive("swiglu_limit", 7.0)?);
    if let Some(q) = f.get("quantization_config") {
        match q.get("quant_method").and_then(Json::as_str) {
            Some("mxfp4") => {}
            other => return Err(refuse("quantization_config.quant_method", format!(
                "`{}` is not supported for gpt-oss (its experts are read as float or MXFP4)", other.unwrap_or("?")))),
        }
    }
    // `attention_dropout`, `router_aux_loss_coef` and `hidden_act` do not enter the reference's
    // inference forward pass (its experts hard-code their activation): read past, like transformers.
    let max_position = f.max_position("max_position_embeddings", 131072)?;
    let (rope, rope_attention_factor) = parse_rope(f, family, head_dim, &refuse)?;
    let sliding_window = parse_layer_types(f, layers, &refuse)?;
    let attention_bias = f.bool_or("attention_bias", true)?;
    Ok(ModelConfig {
        arch: Arch::GptOss,
        class,
        hidden,
        intermediate: inter,
        layers,
        heads,
        kv_heads,
        head_dim,
        vocab,
        rms_eps: rms_eps as f32,
        rope,
        tie_embeddings: f.bool_or("tie_word_embeddings", false)?,
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        clip_qkv: None,
        sliding_window,
        max_position,
        bos_token: f.token_ids("bos_token_id")?.first().copied(),
        eos_tokens: f.token_ids("eos_token_id")?,
        moe: Some(MoeConfig { layout: LAYOUT, experts, top_k, expert_intermediate: inter, routing: Routing::TopKSoftmax,
            shared_intermediate: 0, moe_layers: vec![true; layers] }),
        mla: None,
        mtp_layers: 0,
        gdn: None,
        gpt_oss: Some(GptOssConfig { swiglu_alpha, swiglu_limit, rope_attention_factor: rope_attention_factor as f32 }),
    })
}

/// The windows of `layer_types` (default: even layers sliding, odd full, as `__post_init__`
/// makes them), each sliding layer with `sliding_window` (default 128).
fn parse_layer_types(f: &Fields, layers: usize, refuse: &dyn Fn(&str, String) -> Error) -> Result<Vec<Option<usize>>> {
    let window = f.usize_opt("sliding_window")?;
    let sliding: Vec<bool> = match f.get("layer_types") {
        None => (0..layers).map(|l| l % 2 == 0).collect(),
        Some(v) => {
            let a = v.as_array().ok_or_else(|| Error::config(f.path, "layer_types", "expected a list of strings"))?;
            if a.len() != layers {
                return Err(Error::config(f.path, "layer_types", format!("{} entries for {layers} layers", a.len())));
            }
            a.iter().enumerate().map(|(l, t)| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(refuse(&format!("layer_types[{l}]"), format!("{} is not supported (sliding_attention or full_attention)",
                    t.to_string_compact()))),
            }).collect::<Result<_>>()?
        }
    };
    let w = match window {
        // transformers' mask treats a missing window as none at all.
        None => return Ok(vec![None; layers]),
        Some(0) => return Err(Error::config(f.path, "sliding_window", "must be positive")),
        Some(w) => w,
    };
    Ok(sliding.into_iter().map(|s| s.then_some(w)).collect())
}

/// `rope_parameters` (or `rope_scaling` with the top-level `rope_theta`): default or YaRN, and
/// YaRN's attention factor — `attention_factor` when given, else from `mscale`/`mscale_all_dim`
/// or `0.1·ln(factor) + 1`, as `_compute_yarn_parameters` does. Absent, the class default:
/// YaRN factor 32 over 4096 positions, β 32/1, `truncate` false.
fn parse_rope(f: &Fields, family: &Family, head_dim: usize, refuse: &dyn Fn(&str, String) -> Error) -> Result<(RopeConfig, f64)> {
    let params = f.get("rope_parameters").or_else(|| f.get("rope_scaling"));
    let section = if f.get("rope_parameters").is_some() { "rope_parameters" } else { "rope_scaling" };
    let num = |key: &str| f64_of(f.path, &format!("{section}.{key}"), params.and_then(|p| p.get(key)));
    let theta = match num("rope_theta")? {
        Some(t) => t,
        None => f.f64_opt("rope_theta")?.unwrap_or(family.default_rope_theta),
    };
    if theta.is_nan() || theta <= 1.0 {
        return Err(Error::config(f.path, "rope_theta", format!("{theta} must be greater than 1")));
    }
    let Some(p) = params else {
        let scaling = RopeScaling::Yarn { factor: 32.0, original_max: 4096.0, beta_fast: 32.0, beta_slow: 1.0, truncate: false };
        return Ok((RopeConfig { theta, dim: head_dim, scaling }, 0.1 * 32f64.ln() + 1.0));
    };
    if num("partial_rotary_factor")?.is_some_and(|x| x != 1.0) {
        return Err(refuse(&format!("{section}.partial_rotary_factor"), "partial rotary is not part of gpt-oss".into()));
    }
    let kind = p.get("rope_type").or_else(|| p.get("type")).and_then(Json::as_str).unwrap_or("default");
    match kind {
        "default" => return Ok((RopeConfig { theta, dim: head_dim, scaling: RopeScaling::None }, 1.0)),
        "yarn" => {}
        other => return Err(refuse(&format!("{section}.rope_type"), format!("`{other}` is not supported for gpt-oss (default or yarn)"))),
    }
    let original_max = match num("original_max_position_embeddings")? {
        Some(x) => x,
        None => f.max_position("max_position_embeddings", 131072)? as f64,
    };
    let lookup = |key: &str| p.get(key);
    let y = super::mla::parse_yarn(f, section, &lookup, original_max, 131072)?;
    Ok((RopeConfig { theta, dim: head_dim, scaling: y.scaling }, y.attention_factor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;
    use std::path::Path;

    fn cfg(extra: &str) -> Result<ModelConfig> {
        let text = format!(r#"{{"architectures": ["GptOssForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "intermediate_size": 32,
            "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 8{extra}}}"#);
        ModelConfig::from_json(Path::new("config.json"), &crate::format::json::parse(text.as_bytes()).must())
    }

    #[test]
    fn class_defaults_alternate_windows_and_use_yarn() {
        let c = cfg("").must();
        assert_eq!(c.sliding_window, vec![Some(8), None, Some(8), None]);
        assert!(c.qkv_bias && c.o_bias);
        assert!(matches!(c.rope.scaling, RopeScaling::Yarn { factor, truncate: false, .. } if factor == 32.0));
        let g = c.gpt_oss.must();
        assert_eq!((g.swiglu_alpha, g.swiglu_limit), (1.702, 7.0));
        assert!((g.rope_attention_factor - (0.1 * 32f32.ln() + 1.0)).abs() < 1e-6);
        assert_eq!(c.rope.theta, 150000.0);
    }

    #[test]
    fn unimplemented_fields_are_refused_by_name() {
        for (extra, key) in [
            (r#", "layer_types": ["sliding_attention", "full_attention", "chunked_attention", "full_attention"]"#, "layer_types[2]"),
            (r#", "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000}"#, "rope_parameters.rope_type"),
            (r#", "quantization_config": {"quant_method": "fp8"}"#, "quantization_config.quant_method"),
            (r#", "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "partial_rotary_factor": 0.5}"#, "rope_parameters.partial_rotary_factor"),
        ] {
            let e = cfg(extra).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Unsupported, "{e}");
            assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
        }
        cfg(r#", "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}"#).must();
    }
}
