//! Random checkpoints of real model shapes, for benchmarks and memory tests: no weights can be
//! downloaded here, and speed depends on the shape, not the values. The output is an ordinary
//! Hugging Face directory (config.json + model.safetensors), streamed to disk tensor by tensor.

use super::config::{ModelConfig, QkNorm};
use super::dtype::DType;
use super::json::{self, Json};
use super::safetensors::{write_atomic, TensorSpec, Writer};
use crate::error::{Error, Result};
use std::path::Path;

/// Names of the built-in shapes.
pub const PRESETS: &[&str] = &["smollm2-135m", "llama-1b"];

/// The config.json of a built-in shape.
pub fn preset(name: &str) -> Option<Json> {
    let text = match name {
        // SmolLM2-135M (spec §1.1): tied, no scaling.
        "smollm2-135m" => r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
            "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": true,
            "max_position_embeddings": 8192, "bos_token_id": 1, "eos_token_id": 2}"#,
        // Llama 3.2 1B: llama3 RoPE scaling with factor 32, tied.
        "llama-1b" => r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": true, "max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "rope_theta": 500000.0,
            "bos_token_id": 128000, "eos_token_id": 128001}"#,
        _ => return None,
    };
    json::parse(text.as_bytes()).ok()
}

/// The tensors a checkpoint of `cfg` holds, in file order, with their shapes.
pub fn tensor_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<u64>)> {
    let (h, v) = (cfg.hidden as u64, cfg.vocab as u64);
    let (qd, kvd, hd) = (cfg.q_dim() as u64, cfg.kv_dim() as u64, cfg.head_dim as u64);
    let mut t: Vec<(String, Vec<u64>)> = vec![("model.embed_tokens.weight".into(), vec![v, h])];
    for l in 0..cfg.layers {
        let p = format!("model.layers.{l}");
        t.push((format!("{p}.input_layernorm.weight"), vec![h]));
        for (name, rows, bias) in [("q_proj", qd, cfg.qkv_bias), ("k_proj", kvd, cfg.qkv_bias), ("v_proj", kvd, cfg.qkv_bias)] {
            t.push((format!("{p}.self_attn.{name}.weight"), vec![rows, h]));
            if bias {
                t.push((format!("{p}.self_attn.{name}.bias"), vec![rows]));
            }
        }
        t.push((format!("{p}.self_attn.o_proj.weight"), vec![h, qd]));
        match cfg.qk_norm {
            QkNorm::None => {}
            QkNorm::PerHead => {
                t.push((format!("{p}.self_attn.q_norm.weight"), vec![hd]));
                t.push((format!("{p}.self_attn.k_norm.weight"), vec![hd]));
            }
            QkNorm::Whole => {
                t.push((format!("{p}.self_attn.q_norm.weight"), vec![qd]));
                t.push((format!("{p}.self_attn.k_norm.weight"), vec![kvd]));
            }
        }
        t.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        let i = cfg.intermediate as u64;
        for (name, shape) in [("gate_proj", vec![i, h]), ("up_proj", vec![i, h]), ("down_proj", vec![h, i])] {
            t.push((format!("{p}.mlp.{name}.weight"), shape));
        }
    }
    t.push(("model.norm.weight".into(), vec![h]));
    if !cfg.tie_embeddings {
        t.push(("lm_head.weight".into(), vec![v, h]));
    }
    t
}

/// Writes `dir/config.json` (the given JSON) and `dir/model.safetensors` with random weights of
/// `dtype` (matrices uniform with standard deviation 0.02, norm weights near 1, biases near 0).
/// Returns the weight file's size.
pub fn write_checkpoint(dir: &Path, config: &Json, dtype: DType, seed: u64) -> Result<u64> {
    if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
        return Err(Error::arg(format!("random checkpoints are F32, BF16 or F16, not {dtype}")));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", e))?;
    let cfg_path = dir.join("config.json");
    let cfg = ModelConfig::from_json(&cfg_path, config)?;
    let shapes = tensor_shapes(&cfg);
    let specs: Vec<TensorSpec> = shapes.iter()
        .map(|(name, shape)| TensorSpec { name: name.clone(), dtype: if shape.len() == 1 { DType::F32 } else { dtype }, shape: shape.clone() })
        .collect();
    let path = dir.join("model.safetensors");
    let mut w = Writer::create(&path, &specs, &[])?;
    let mut rng = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut buf = Vec::with_capacity(1 << 20);
    for spec in &specs {
        let n: u64 = spec.shape.iter().product();
        let (centre, half_width) = if spec.shape.len() == 1 {
            (if spec.name.ends_with(".bias") { 0.0 } else { 1.0 }, 0.1)
        } else {
            (0.0, 0.02 * 3f32.sqrt())
        };
        let mut left = n;
        while left > 0 {
            let take = left.min(1 << 18);
            buf.clear();
            for _ in 0..take {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let u = (rng >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
                let v = centre + (2.0 * u - 1.0) * half_width;
                match spec.dtype {
                    DType::BF16 => buf.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes()),
                    DType::F16 => buf.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes()),
                    _ => buf.extend_from_slice(&v.to_le_bytes()),
                }
            }
            w.write(&buf)?;
            left -= take;
        }
    }
    w.finish()?;
    write_atomic(&cfg_path, config.to_string_pretty().as_bytes())?;
    std::fs::metadata(&path).map(|m| m.len()).map_err(|e| Error::io(&path, "stat", e))
}
