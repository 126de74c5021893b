//! Qwen3-Next (`Qwen3NextForCausalLM`, transformers 5.24.0 `qwen3_next`): what its config.json
//! means beyond the Llama-style fields the common reader already took.
//!
//! - Layers: `layer_types` (transformers 5) or, in the release's spelling, `full_attention_interval`
//!   (every n-th layer full attention, default 4): the others are Gated DeltaNet linear attention
//!   with the `linear_*` geometry read into [`GdnConfig`].
//! - Full attention: q_proj is twice as wide (each head's query followed by its output gate),
//!   q/k RMSNorm per head, a quarter of each head rotated (`partial_rotary_factor` 0.25 by default),
//!   256-wide heads and 2 K/V heads by default.
//! - Norms: every `Qwen3NextRMSNorm` multiplies by (1 + w) — the stored weights are zero-centred —
//!   except the gated norm of the linear attention, which multiplies by w (the loader adds the 1).
//! - MoE: Qwen2-MoE's layout (softmax top-k, a shared expert with a sigmoid scalar gate), with
//!   `norm_topk_prob` true by default.

use super::{Fields, ModelConfig, QkNorm, Routing};
use crate::error::{Error, Result};
use crate::format::json::Json;

/// The Gated DeltaNet geometry and which layers use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GdnConfig {
    /// `linear_num_key_heads`: query/key heads (each serves `v_heads / k_heads` value heads).
    pub k_heads: usize,
    /// `linear_num_value_heads`.
    pub v_heads: usize,
    /// `linear_key_head_dim`.
    pub k_dim: usize,
    /// `linear_value_head_dim`.
    pub v_dim: usize,
    /// `linear_conv_kernel_dim`: the causal depthwise convolution's taps.
    pub conv_kernel: usize,
    /// Per layer: true for linear attention, false for (gated) full attention.
    pub linear: Vec<bool>,
}

impl GdnConfig {
    /// Width of all queries (= of all keys): key heads × key head dim.
    pub fn key_width(&self) -> usize {
        self.k_heads * self.k_dim
    }
    /// Width of all values (and of z and the output): value heads × value head dim.
    pub fn value_width(&self) -> usize {
        self.v_heads * self.v_dim
    }
    /// Channels of the convolution: q, k and v side by side.
    pub fn conv_width(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }
    /// Layers of linear attention.
    pub fn count(&self) -> usize {
        self.linear.iter().filter(|&&x| x).count()
    }
}

impl ModelConfig {
    /// True when layer `l` is a Gated DeltaNet layer.
    pub fn is_gdn_layer(&self, l: usize) -> bool {
        self.gdn.as_ref().is_some_and(|g| g.linear.get(l).copied().unwrap_or(false))
    }

    /// Index of layer `l` among the layers with a K/V cache (every layer but the linear ones).
    pub fn kv_slot(&self, l: usize) -> usize {
        match self.gdn.as_ref() {
            Some(g) => g.linear.iter().take(l).filter(|&&x| !x).count(),
            None => l,
        }
    }

    /// Index of layer `l` among the Gated DeltaNet layers (its slot in the recurrent state).
    pub fn gdn_slot(&self, l: usize) -> usize {
        self.gdn.as_ref().map_or(0, |g| g.linear.iter().take(l).filter(|&&x| x).count())
    }
}

/// Completes a Qwen3-Next config from the common reader's.
pub(super) fn finish(f: &Fields, mut cfg: ModelConfig) -> Result<ModelConfig> {
    let refuse = |key: &str, why: &str| Error::unsupported(format!("{}: field `{key}`: {why}", f.path.display()));
    if let Some(q) = f.get("quantization_config") {
        let method = q.get("quant_method").and_then(Json::as_str).unwrap_or("?");
        return Err(refuse("quantization_config.quant_method", &format!(
            "`{method}` Qwen3-Next checkpoints are not supported; use the BF16 release")));
    }
    if f.get("clip_qkv").is_some() {
        return Err(refuse("clip_qkv", "is not part of Qwen3-Next's attention (transformers ignores it; the engine would clamp)"));
    }
    // The gate half of q_proj would need its own bias split; no release has attention biases.
    if f.bool_or("attention_bias", false)? {
        return Err(refuse("attention_bias", "true is not supported for Qwen3-Next (its q_proj carries the output gate)"));
    }
    let act = f.get("hidden_act").and_then(Json::as_str).unwrap_or("silu");
    if act != "silu" {
        // The convolution's activation is hidden_act too; check_activation let `swish` through.
        return Err(refuse("hidden_act", &format!("`{act}`: Qwen3-Next's convolution and FFN are computed with silu")));
    }
    // Qwen3NextConfig's defaults where the common reader's differ.
    if f.get("num_key_value_heads").is_none() {
        if !cfg.heads.is_multiple_of(2) {
            return Err(Error::config(f.path, "num_key_value_heads", format!(
                "missing, and its default 2 does not divide num_attention_heads {}", cfg.heads)));
        }
        cfg.kv_heads = 2;
    }
    if f.get("max_position_embeddings").is_none() {
        cfg.max_position = 32768;
    }
    if let Some(moe) = cfg.moe.as_mut() {
        if f.get("norm_topk_prob").is_none() {
            moe.routing = Routing::SoftmaxTopK { renormalize: true };
        }
    }
    cfg.qk_norm = QkNorm::PerHead;
    cfg.o_bias = false;
    cfg.qkv_bias = false;
    let dim = |key: &str, default: usize| -> Result<usize> {
        let v = f.usize_opt(key)?.unwrap_or(default);
        if v == 0 || v > 1 << 16 {
            return Err(Error::config(f.path, key, format!("{v} is out of range 1..=65536")));
        }
        Ok(v)
    };
    let (k_heads, v_heads) = (dim("linear_num_key_heads", 16)?, dim("linear_num_value_heads", 32)?);
    if v_heads % k_heads != 0 {
        return Err(Error::config(f.path, "linear_num_value_heads", format!(
            "{v_heads} is not a multiple of linear_num_key_heads {k_heads}")));
    }
    let (k_dim, v_dim) = (dim("linear_key_head_dim", 128)?, dim("linear_value_head_dim", 128)?);
    let conv_kernel = dim("linear_conv_kernel_dim", 4)?;
    if conv_kernel > 64 {
        return Err(Error::config(f.path, "linear_conv_kernel_dim", format!("{conv_kernel} is out of range 1..=64")));
    }
    // Bounds before anything is sized from them: each width within MAX_DIM, one layer's
    // recurrent state within 2^30 floats (so no product of them overflows).
    if k_heads * k_dim > super::MAX_DIM || v_heads * v_dim > super::MAX_DIM || v_heads * k_dim * v_dim > 1 << 30 {
        return Err(Error::config(f.path, "linear_value_head_dim", format!(
            "the linear attention is too large ({k_heads} key heads of {k_dim}, {v_heads} value heads of {v_dim})")));
    }
    let linear = schedule(f, cfg.layers)?;
    cfg.gdn = Some(GdnConfig { k_heads, v_heads, k_dim, v_dim, conv_kernel, linear });
    Ok(cfg)
}

/// The per-layer schedule: `layer_types` when present, else every `full_attention_interval`-th
/// layer (1-based) full attention, as Qwen3NextConfig derives it.
fn schedule(f: &Fields, layers: usize) -> Result<Vec<bool>> {
    if let Some(v) = f.get("layer_types") {
        let list = v.as_array().ok_or_else(|| Error::config(f.path, "layer_types", "expected a list of strings"))?;
        if list.len() != layers {
            return Err(Error::config(f.path, "layer_types", format!("has {} entries for {layers} layers", list.len())));
        }
        return list.iter().enumerate().map(|(l, t)| match t.as_str() {
            Some("linear_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(Error::unsupported(format!("{}: field `layer_types`: entry {l} is not `linear_attention` or \
`full_attention`", f.path.display()))),
        }).collect();
    }
    let every = f.usize_opt("full_attention_interval")?.unwrap_or(4);
    if every == 0 {
        return Err(Error::config(f.path, "full_attention_interval", "must be positive"));
    }
    Ok((0..layers).map(|l| (l + 1) % every != 0).collect())
}

#[cfg(test)]
mod tests {
    use super::super::Arch;
    use super::*;
    use crate::test_util::Must;
    use crate::ErrorKind;
    use std::path::Path;

    fn cfg(text: &str) -> Result<ModelConfig> {
        ModelConfig::from_json(Path::new("config.json"), &crate::format::json::parse(text.as_bytes()).must())
    }

    const QN: &str = r#""architectures": ["Qwen3NextForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "vocab_size": 100, "moe_intermediate_size": 16, "num_experts": 8,
        "num_experts_per_tok": 2, "shared_expert_intermediate_size": 32"#;

    /// Qwen3NextConfig's defaults (transformers 5.24.0).
    #[test]
    fn defaults_follow_the_reference_class() {
        let c = cfg(&format!("{{{QN}}}")).must();
        assert_eq!(c.arch, Arch::Qwen3Next);
        assert_eq!((c.head_dim, c.kv_heads, c.rope.dim, c.qk_norm, c.max_position), (256, 2, 64, QkNorm::PerHead, 32768));
        let g = c.gdn.as_ref().must();
        assert_eq!((g.k_heads, g.v_heads, g.k_dim, g.v_dim, g.conv_kernel), (16, 32, 128, 128, 4));
        assert_eq!(g.linear, [true, true, true, false]);
        assert_eq!(c.moe.as_ref().must().routing, Routing::SoftmaxTopK { renormalize: true });
        assert_eq!((c.kv_cache_layers(), c.kv_slot(3), c.gdn_slot(2)), (1, 0, 2));
        let c = cfg(&format!(r#"{{{QN}, "full_attention_interval": 2}}"#)).must();
        assert_eq!(c.gdn.as_ref().must().linear, [true, false, true, false]);
        let t = r#""layer_types": ["full_attention", "linear_attention", "full_attention", "linear_attention"]"#;
        assert_eq!(cfg(&format!("{{{QN}, {t}}}")).must().gdn.as_ref().must().linear, [false, true, false, true]);
    }

    #[test]
    fn fields_it_does_not_compute_are_refused_by_name() {
        for (extra, field, kind) in [
            (r#""clip_qkv": 8"#, "clip_qkv", ErrorKind::Unsupported),
            (r#""attention_bias": true"#, "attention_bias", ErrorKind::Unsupported),
            (r#""quantization_config": {"quant_method": "fp8"}"#, "quantization_config.quant_method", ErrorKind::Unsupported),
            (r#""hidden_act": "swish""#, "hidden_act", ErrorKind::Unsupported),
            (r#""layer_types": ["linear_attention"]"#, "layer_types", ErrorKind::Config),
            (r#""layer_types": ["a", "b", "c", "d"]"#, "layer_types", ErrorKind::Unsupported),
            (r#""full_attention_interval": 0"#, "full_attention_interval", ErrorKind::Config),
            (r#""linear_num_value_heads": 5"#, "linear_num_value_heads", ErrorKind::Config),
            (r#""linear_key_head_dim": 0"#, "linear_key_head_dim", ErrorKind::Config),
            (r#""linear_value_head_dim": 65536, "linear_key_head_dim": 65536"#, "linear_value_head_dim", ErrorKind::Config),
        ] {
            let e = cfg(&format!("{{{QN}, {extra}}}")).unwrap_err();
            assert_eq!(e.kind(), kind, "{field}: {e}");
            assert!(e.to_string().contains(&format!("`{field}`")), "{field}: {e}");
        }
    }
}
