//! Random checkpoints of real model shapes, for benchmarks and memory tests: no weights can be
//! downloaded here, and speed depends on the shape, not the values. The output is an ordinary
//! Hugging Face directory (config.json + model.safetensors), streamed to disk tensor by tensor.

use crate::format::config::{ModelConfig, QkNorm};
use crate::format::dtype::DType;
use crate::format::json::{self, Json};
use crate::format::safetensors::{write_atomic, TensorSpec, Writer};
use crate::error::{Error, Result};
use std::path::Path;

/// Names of the built-in shapes.
pub const PRESETS: &[&str] = &["smollm2-135m", "llama-1b", "qwen3-30b-a3b"];

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
        // Qwen3-30B-A3B: 48 layers, 128 experts of width 768, top-8, untied.
        "qwen3-30b-a3b" => r#"{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
            "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "tie_word_embeddings": false, "max_position_embeddings": 40960,
            "bos_token_id": 151643, "eos_token_id": 151645}"#,
        _ => return None,
    };
    json::parse(text.as_bytes()).ok()
}

/// The tensors a checkpoint of `cfg` holds, in file order, with their shapes.
pub fn tensor_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<u64>)> {
    if cfg.mla.is_some() {
        return crate::model::latent::tensor_shapes(cfg); // DeepSeek, Kimi (wp-mla)
    }
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
    if cfg.gdn.is_some() {
        // Qwen3-Next's linear layers and gated q_proj are not in `tensor_shapes`' table.
        return Err(Error::unsupported(format!("random checkpoints of {} (Gated DeltaNet layers) are not supported", cfg.class)));
    }
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

/// A fast deterministic byte source (xorshift64).
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Random Q4B32/Q8B32 blocks: a scale near `1.7 std / levels` and levels uniform over the
    /// symmetric range (−7..=7, −127..=127), so the weights have mean 0 and roughly standard
    /// deviation `std`. (Uniform bytes would include −8 / −128 and give every weight a mean of
    /// −½ scale, a bias that compounds layer after layer into one shared direction.)
    fn blocks(&mut self, dtype: DType, std: f32, out: &mut [u8]) {
        let bb = dtype.block_bytes().unwrap_or(34);
        let q4 = dtype == DType::Q4B32;
        let levels = if q4 { 7.0 } else { 127.0 };
        for b in out.chunks_exact_mut(bb) {
            let r = self.next();
            let scale = std * 1.7 / levels * (0.75 + 0.5 * (r >> 40) as f32 / (1u64 << 24) as f32);
            b[..2].copy_from_slice(&half::f16::from_f32(scale).to_bits().to_le_bytes());
            let mut bits = self.next();
            let mut level = |span: u64| -> i32 {
                if bits < 1 << 16 {
                    bits = self.next();
                }
                let v = (bits % span) as i32;
                bits /= span;
                v
            };
            for byte in b[2..].iter_mut() {
                *byte = if q4 {
                    let (lo, hi) = (level(15) - 7, level(15) - 7);
                    ((lo as u8) & 0x0f) | (((hi as u8) & 0x0f) << 4)
                } else {
                    (level(255) - 127) as i8 as u8
                };
            }
        }
    }
}

/// The standard deviation of random weights named `name` in a model of `layers` layers.
fn weight_std(name: &str, layers: usize) -> f32 {
    if name == "model.embed_tokens.weight" {
        1.0
    } else if name.ends_with("o_proj.weight") || name.ends_with("down") || name.ends_with("down_proj.weight") {
        0.02 / ((2 * layers) as f32).sqrt()
    } else {
        0.02
    }
}

/// Writes a random **container** of `config`'s shape directly, without a float source: the
/// trunk as Q4B32 (embeddings, head and routers Q8B32, 1-D tensors F32) and the experts as
/// `experts` records (Q4B32 or Q8B32). Multi-gigabyte shapes take disk-speed time, not RAM.
/// Returns the bytes written.
///
/// The scales follow a trained model's balance rather than one standard deviation for all:
/// embeddings of unit scale and the residual branches' output matrices (o_proj, the experts'
/// down) scaled by 1/√(2·layers). With uniform scales the sublayers' outputs swamp the token's
/// embedding, every token's hidden state converges to the same direction, and every token
/// routes to the same experts — which would make any expert cache look perfect.
pub fn write_container(dir: &Path, config: &Json, experts: DType, seed: u64) -> Result<u64> {
    use crate::format::container::{Bank, Manifest, RecordLayout};
    if !matches!(experts, DType::Q4B32 | DType::Q8B32) {
        return Err(Error::arg("random containers hold Q4B32 or Q8B32 experts"));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", e))?;
    let cfg = ModelConfig::from_json(&dir.join("config.json"), config)?;
    let moe = cfg.moe.clone().ok_or_else(|| Error::arg("random containers are for MoE configs"))?;
    if cfg.mla.is_some() {
        return Err(Error::unsupported(format!("random containers have Llama-style layers; for {}, write a random checkpoint \
and `waste convert` it", cfg.class)));
    }
    if cfg.gdn.is_some() {
        return Err(Error::unsupported(format!("random containers have Llama-style layers, not {}'s Gated DeltaNet layers", cfg.class)));
    }
    let mut noise = Noise(seed ^ 0x2545_F491_4F6C_DD1D);
    let mut total = 0u64;
    // Trunk: two files, one width each (seed 000: one width per file).
    let mut groups: [(DType, Vec<TensorSpec>); 2] = [(DType::Q4B32, Vec::new()), (DType::Q8B32, Vec::new())];
    for l in 0..cfg.layers {
        let p = format!("model.layers.{l}");
        let (h, qd, kvd, hd) = (cfg.hidden as u64, cfg.q_dim() as u64, cfg.kv_dim() as u64, cfg.head_dim as u64);
        let mut push = |g: usize, name: String, dtype: DType, shape: Vec<u64>| groups[g].1.push(TensorSpec { name, dtype, shape });
        for (name, shape) in [("self_attn.q_proj", [qd, h]), ("self_attn.k_proj", [kvd, h]), ("self_attn.v_proj", [kvd, h]), ("self_attn.o_proj", [h, qd])] {
            push(0, format!("{p}.{name}.weight"), DType::Q4B32, shape.to_vec());
        }
        // What the config asks for beyond a Qwen3-MoE layer (GLM-4.5: q/k/v biases, a dense
        // first layer, the router's correction bias, shared experts).
        let biases = [("q_proj", qd, cfg.qkv_bias), ("k_proj", kvd, cfg.qkv_bias), ("v_proj", kvd, cfg.qkv_bias), ("o_proj", h, cfg.o_bias)];
        for (name, rows, _) in biases.iter().filter(|b| b.2) {
            push(0, format!("{p}.self_attn.{name}.bias"), DType::F32, vec![*rows]);
        }
        let block = format!("{p}.{}", moe.layout.block);
        let mlp = |push: &mut dyn FnMut(usize, String, DType, Vec<u64>), prefix: &str, i: u64| {
            for (name, shape) in [("gate_proj", vec![i, h]), ("up_proj", vec![i, h]), ("down_proj", vec![h, i])] {
                push(0, format!("{prefix}.{name}.weight"), DType::Q4B32, shape);
            }
        };
        if cfg.is_moe_layer(l) {
            push(1, format!("{block}.gate.weight"), DType::Q8B32, vec![moe.experts as u64, h]);
            if matches!(moe.routing, crate::format::config::Routing::Sigmoid { .. }) {
                push(0, format!("{block}.gate.e_score_correction_bias"), DType::F32, vec![moe.experts as u64]);
            }
            let shared = moe.shared_intermediate as u64;
            if shared > 0 && moe.layout.shared_expert {
                mlp(&mut push, &format!("{block}.shared_expert"), shared);
                push(1, format!("{block}.shared_expert_gate.weight"), DType::Q8B32, vec![1, h]);
            } else if shared > 0 {
                mlp(&mut push, &format!("{block}.shared_experts"), shared);
            }
        } else {
            mlp(&mut push, &format!("{p}.mlp"), cfg.intermediate as u64);
        }
        for name in ["input_layernorm", "post_attention_layernorm"] {
            push(0, format!("{p}.{name}.weight"), DType::F32, vec![h]);
        }
        let norm = match cfg.qk_norm {
            QkNorm::PerHead => Some((hd, hd)),
            QkNorm::Whole => Some((qd, kvd)),
            QkNorm::None => None,
        };
        if let Some((qn, kn)) = norm {
            push(0, format!("{p}.self_attn.q_norm.weight"), DType::F32, vec![qn]);
            push(0, format!("{p}.self_attn.k_norm.weight"), DType::F32, vec![kn]);
        }
    }
    groups[0].1.push(TensorSpec { name: "model.norm.weight".into(), dtype: DType::F32, shape: vec![cfg.hidden as u64] });
    groups[1].1.push(TensorSpec { name: "model.embed_tokens.weight".into(), dtype: DType::Q8B32, shape: vec![cfg.vocab as u64, cfg.hidden as u64] });
    if !cfg.tie_embeddings {
        groups[1].1.push(TensorSpec { name: "lm_head.weight".into(), dtype: DType::Q8B32, shape: vec![cfg.vocab as u64, cfg.hidden as u64] });
    }
    let mut trunk_files = Vec::new();
    for (width, specs) in &groups {
        let name = if *width == DType::Q4B32 { "trunk-q4.safetensors" } else { "trunk-q8.safetensors" };
        let meta = [("format", if *width == DType::Q4B32 { "rabbit-q4b32" } else { "rabbit-q8b32" }), ("block", "32"), ("scale", "f16")]
            .map(|(k, v)| (k.to_string(), v.to_string()));
        let mut w = Writer::create(&dir.join(name), specs, &meta)?;
        for s in specs {
            let row = s.dtype.row_bytes(*s.shape.last().unwrap_or(&0)).unwrap_or(0) as usize;
            let rows = if s.shape.len() == 2 { s.shape[0] as usize } else { 1 };
            let mut buf = vec![0u8; row * rows.min(4096)];
            let mut left = rows;
            while left > 0 {
                let n = left.min(4096);
                let chunk = &mut buf[..n * row];
                if s.dtype.is_quantized() {
                    noise.blocks(s.dtype, weight_std(&s.name, cfg.layers), chunk);
                } else {
                    // Norm gains near 1; biases (and the router's correction bias) near 0.
                    let centre = if s.name.ends_with("bias") { 0.0f32 } else { 1.0 };
                    chunk.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&(centre + ((noise.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2).to_le_bytes()));
                }
                w.write(chunk)?;
                total += chunk.len() as u64;
                left -= n;
            }
        }
        trunk_files.push((name.to_string(), w.finish_with_sum()?));
    }
    let layout = RecordLayout::new(experts, cfg.hidden, moe.expert_intermediate)?;
    let mut banks = Vec::new();
    let mut rec = vec![0u8; layout.record_bytes];
    for l in (0..cfg.layers).filter(|&l| cfg.is_moe_layer(l)) {
        let file = format!("experts-{l:03}.bank");
        let path = dir.join(&file);
        let tmp = crate::format::safetensors::temp_sibling(&path);
        let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, "create", e))?);
        for e in 0..moe.experts {
            rec.fill(0);
            for (m, name) in layout.matrices.iter().zip(crate::format::container::MATRIX_NAMES) {
                noise.blocks(experts, weight_std(name, cfg.layers), &mut rec[m.offset..m.offset + m.bytes]);
            }
            layout.write_header(&mut rec, l, e);
            std::io::Write::write_all(&mut f, &rec).map_err(|err| Error::io(&tmp, "write", err))?;
            total += rec.len() as u64;
        }
        let f = f.into_inner().map_err(|err| Error::io(&tmp, "write", err.into_error()))?;
        crate::format::safetensors::commit_file(f, &tmp, &path)?;
        banks.push(Bank { layer: l, file, experts: moe.experts, layout });
    }
    let mut manifest = Manifest::new(dir, config.clone(), trunk_files, banks)?;
    manifest.trunk_encoding = "q4 (embeddings, head, routers: q8)".into();
    manifest.expert_encoding = if experts == DType::Q4B32 { "q4".into() } else { "q8".into() };
    manifest.write()?;
    Ok(total)
}
