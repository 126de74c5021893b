//! GLM-4.5 / 4.6 (`Glm4MoeForCausalLM`, transformers 5.24.0 `glm4_moe`): what its config.json
//! means beyond the Llama-style fields the common reader already took.
//!
//! - Attention: `attention_bias` puts biases on q, k and v only (its o_proj never has one);
//!   `use_qk_norm` adds a per-head RMSNorm of q and k before RoPE (the Qwen3 kind).
//! - RoPE: only the first `head_dim × partial_rotary_factor` channels of each head rotate, in
//!   half-split pairs within that slice; the factor defaults to 0.5 (read in `parse_rope`).
//! - MoE: DeepSeek-V3's routing (sigmoid, `e_score_correction_bias` for selection, `n_group` /
//!   `topk_group`, `norm_topk_prob`, `routed_scaling_factor`) with gate-less shared experts and
//!   the first `first_k_dense_replace` layers dense, read by `config_mla.rs`.
//! - MTP: `num_nextn_predict_layers` extra layers sit past `num_hidden_layers` in released
//!   checkpoints; they serve speculative decoding, not the next-token forward pass, so they are
//!   counted (for `info`) and never read.

use super::{Fields, ModelConfig, QkNorm};
use crate::error::{Error, Result};

/// Completes a GLM config from the common reader's: the q/k norm switch, no o_proj bias, the
/// MTP count; refuses the fields transformers' GLM does not compute with but another family's
/// reader would act on.
pub(super) fn finish(f: &Fields, mut cfg: ModelConfig) -> Result<ModelConfig> {
    let refuse = |key: &str, why: &str| Error::unsupported(format!("{}: field `{key}`: {why}", f.path.display()));
    if let Some(q) = f.get("quantization_config") {
        let method = q.get("quant_method").and_then(super::Json::as_str).unwrap_or("?");
        return Err(refuse("quantization_config.quant_method", &format!(
            "`{method}` GLM checkpoints are not supported; use the BF16 release")));
    }
    // The common reader would clamp q, k and v (OLMoE's clip_qkv); Glm4MoeAttention never does.
    if f.get("clip_qkv").is_some() {
        return Err(refuse("clip_qkv", "is not part of GLM's attention (transformers ignores it; the engine would clamp)"));
    }
    // Glm4MoeConfig's defaults where the common reader's differ: 8 KV heads (not one per query
    // head) and a context of 131072.
    if f.get("num_key_value_heads").is_none() {
        if !cfg.heads.is_multiple_of(8) {
            return Err(Error::config(f.path, "num_key_value_heads", format!(
                "missing, and its default 8 does not divide num_attention_heads {}", cfg.heads)));
        }
        cfg.kv_heads = 8;
    }
    if f.get("max_position_embeddings").is_none() {
        cfg.max_position = 131072;
    }
    cfg.qk_norm = if f.bool_or("use_qk_norm", false)? { QkNorm::PerHead } else { QkNorm::None };
    cfg.o_bias = false;
    // Glm4MoeConfig maps num_mtp_layers onto num_nextn_predict_layers; its default is 1.
    let key = ["num_nextn_predict_layers", "num_mtp_layers"].into_iter().find(|k| f.get(k).is_some());
    cfg.mtp_layers = match key {
        Some(k) => f.usize_req(k)?,
        None => 1,
    };
    if cfg.mtp_layers > 64 {
        return Err(Error::config(f.path, key.unwrap_or("num_nextn_predict_layers"), format!("{} is out of range 0..=64", cfg.mtp_layers)));
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::super::{Arch, Routing};
    use super::*;
    use crate::test_util::Must;
    use crate::ErrorKind;
    use std::path::Path;

    fn cfg(text: &str) -> Result<ModelConfig> {
        ModelConfig::from_json(Path::new("config.json"), &crate::format::json::parse(text.as_bytes()).must())
    }

    const GLM: &str = r#""architectures": ["Glm4MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
        "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2"#;

    /// The class defaults of Glm4MoeConfig (transformers 5.24.0): half the head rotates, no
    /// q/k norm, biases on q/k/v only when asked, one dense layer, one shared expert, sigmoid
    /// routing renormalised with scale 1 in one group, one MTP layer.
    #[test]
    fn defaults_follow_the_reference_class() {
        let c = cfg(&format!("{{{GLM}}}")).must();
        assert_eq!(c.arch, Arch::Glm4Moe);
        assert_eq!((c.rope.dim, c.rope.theta, c.qk_norm, c.qkv_bias, c.o_bias), (8, 10000.0, QkNorm::None, false, false));
        let moe = c.moe.as_ref().must();
        assert_eq!(moe.routing, Routing::Sigmoid { groups: 1, topk_group: 1, renormalize: true, scale: 1.0 });
        assert_eq!((moe.shared_intermediate, moe.moe_layers.clone()), (32, vec![false, true, true]));
        assert_eq!((c.rms_eps, c.mtp_layers, c.max_position, c.kv_heads), (1e-5, 1, 131072, 2));
        // Without num_key_value_heads: the class's 8, not one per query head.
        let bare = GLM.replace(r#""num_attention_heads": 4, "num_key_value_heads": 2"#, r#""num_attention_heads": 16"#);
        assert_eq!(cfg(&format!("{{{bare}}}")).must().kv_heads, 8);
        let e = cfg(&format!("{{{}}}", bare.replace(r#""num_attention_heads": 16"#, r#""num_attention_heads": 12"#))).unwrap_err();
        assert!(e.to_string().contains("`num_key_value_heads`"), "{e}");
        let c = cfg(&format!(r#"{{{GLM}, "attention_bias": true, "use_qk_norm": true, "n_group": 4, "topk_group": 2,
            "routed_scaling_factor": 2.5, "norm_topk_prob": false, "n_shared_experts": 2, "first_k_dense_replace": 2,
            "num_nextn_predict_layers": 0, "rope_parameters": {{"rope_type": "default", "rope_theta": 1e6,
            "partial_rotary_factor": 0.25}}}}"#)).must();
        assert_eq!((c.rope.dim, c.rope.theta, c.qk_norm, c.qkv_bias, c.o_bias), (4, 1e6, QkNorm::PerHead, true, false));
        let moe = c.moe.as_ref().must();
        assert_eq!(moe.routing, Routing::Sigmoid { groups: 4, topk_group: 2, renormalize: false, scale: 2.5 });
        assert_eq!((moe.shared_intermediate, moe.moe_layers.clone(), c.mtp_layers), (64, vec![false, false, true], 0));
        // The release's top-level spelling (GLM-4.5's config.json).
        let c = cfg(&format!(r#"{{{GLM}, "partial_rotary_factor": 1.0, "rope_theta": 1000000}}"#)).must();
        assert_eq!((c.rope.dim, c.rope.theta), (16, 1e6));
    }

    #[test]
    fn fields_it_does_not_compute_are_refused_by_name() {
        for (extra, field, kind) in [
            (r#""clip_qkv": 8"#, "clip_qkv", ErrorKind::Unsupported),
            (r#""quantization_config": {"quant_method": "fp8"}"#, "quantization_config.quant_method", ErrorKind::Unsupported),
            (r#""scoring_func": "softmax""#, "scoring_func", ErrorKind::Unsupported),
            (r#""topk_method": "greedy""#, "topk_method", ErrorKind::Unsupported),
            (r#""hidden_act": "gelu""#, "hidden_act", ErrorKind::Unsupported),
            (r#""rope_parameters": {"rope_type": "yarn", "factor": 2.0}"#, "rope_parameters.rope_type", ErrorKind::Unsupported),
            (r#""partial_rotary_factor": 0.3125"#, "partial_rotary_factor", ErrorKind::Config),
            (r#""n_group": 3"#, "n_group", ErrorKind::Config),
            (r#""use_qk_norm": 1"#, "use_qk_norm", ErrorKind::Config),
        ] {
            let e = cfg(&format!("{{{GLM}, {extra}}}")).unwrap_err();
            assert_eq!(e.kind(), kind, "{field}: {e}");
            assert!(e.to_string().contains(&format!("`{field}`")), "{field}: {e}");
        }
    }
}
