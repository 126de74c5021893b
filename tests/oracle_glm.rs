//! GLM-4.5 / 4.6 (`Glm4MoeForCausalLM`) against transformers 5.24.0 (CPU, f32, eager): the
//! fixtures of `tools/oracles/make_glm_oracles.py` — partial rotary (half of each head), q/k/v
//! biases, the per-head q/k norm on and off, DeepSeek-V3's sigmoid routing with the correction
//! bias and group limit, shared experts, dense first layers, f32 and bf16 storage, and a
//! checkpoint carrying an MTP layer's tensors, which are skipped. Each from its Hugging Face
//! directory and from a float container whose routed experts stream through a small expert
//! cache; token-at-a-time decode matches transformers' cached decode; chunking, threads and
//! cache size never change a bit; the memory plan is what `Model::open` holds.

use crate::common;
use common::*;
use std::path::Path;
use waste::format::config::{QkNorm, Routing};
use waste::Options;

/// f32 on both sides (bf16 storage is widened exactly): only summation order differs.
const TOL: f32 = 2e-5;
const ALL: [&str; 3] = ["glm4_moe_f32", "glm4_moe_bf16", "glm4_moe_noqk_f32"];

/// Logits at every position, every layer's hidden state and the greedy continuation (the
/// reference's, decoded with its KV cache), from the Hugging Face directory.
#[test]
fn glm_matches_the_reference_from_the_hf_directory() {
    for name in ALL {
        assert_directory_matches_reference(name, TOL);
    }
}

/// transformers' cached decode (a short prefill with use_cache, then one token at a time)
/// against ours fed token by token from the start: every decoded row.
#[test]
fn glm_decode_matches_transformers_cached_decode() {
    for name in ALL {
        let o = oracle(name);
        assert_cached_decode_close(name, &mut open_model_threads(&o.dir.join("model"), 1, 32), &o, TOL);
    }
}

/// An f32 container of each model: routed experts stream through the smallest expert cache
/// (shared experts stay in the trunk), the logits match the reference and are the HF
/// directory's bits; the MTP layer's tensors are left out of the container.
#[test]
fn glm_float_containers_match_with_a_small_expert_cache() {
    for name in ALL {
        let (out, manifest) = assert_float_container_close_with_smallest_cache(name, TOL);
        let mtp = format!("model.layers.{}.", open_model_threads(&oracle(name).dir.join("model"), 1, 32).config().layers);
        for file in &manifest.trunk_files {
            let st = waste::format::safetensors::SafeTensors::open(&out.join(file)).unwrap();
            assert!(st.tensors.iter().all(|t| !t.name.starts_with(&mtp)), "{name}: {file} holds MTP tensors");
        }
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
    }
}

/// Token-at-a-time decoding, two threads and a prefill chunk of 5 give the default run's bits;
/// so does a second run after `reset`.
#[test]
fn glm_chunking_threads_and_reset_are_bit_identical() {
    for name in ALL {
        let o = oracle(name);
        let runs = [(2, 32, false), (1, 32, true), (1, 5, false), (2, 5, true), (3, 7, false)];
        assert_chunking_threads_and_reset_bit_identical(name, &o.dir.join("model"), &o.prompt, &runs);
    }
}

/// The expert cache changes only when bytes move: the smallest cache, every expert cached, I/O
/// threads, two compute threads, decoding token by token with the look-ahead — all the HF
/// directory's bits.
#[test]
fn glm_cache_size_and_io_are_bit_identical() {
    for name in ["glm4_moe_f32", "glm4_moe_noqk_f32"] {
        let o = oracle(name);
        let dir = float_container(name, "bits");
        let hf = prompt_logits(&mut open_model_threads(&o.dir.join("model"), 1, 32), &o.prompt, false);
        assert_cache_size_and_io_bit_identical(name, &dir, &o.prompt, &hf);
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }
}

/// The plan (headers only) equals what `Model::open` holds, from the HF directory and from a
/// container; the state is the K/V cache of `num_hidden_layers` layers (none for the MTP
/// layer).
#[test]
fn glm_plan_equals_memory_used() {
    for name in ["glm4_moe_f32", "glm4_moe_bf16", "glm4_moe_noqk_f32"] {
        assert_plan_equals_memory_used(name, |plan, m, what| {
            let cfg = m.config();
            let ctx = plan.ctx as u64;
            let kv = 2 * cfg.layers as u64 * ctx * cfg.kv_dim() as u64 * 4;
            assert_eq!(plan.state_bytes, kv + (ctx + 1) * 4, "state = K/V cache of the decoder layers + tokens: {what}");
        });
    }
}

/// The checkpoint without its MTP layer's tensors is the same model to the engine: the same
/// plan (so nothing of the MTP layer is held) and the same logits, bit for bit.
#[test]
fn glm_mtp_tensors_are_never_read() {
    use waste::format::safetensors::{SafeTensors, TensorSpec, Writer};
    {
        let name = "glm4_moe_bf16";
        let o = oracle(name);
        let src = o.dir.join("model");
        let dst = temp_dir(&format!("{name}-no-mtp"));
        for f in ["config.json", "generation_config.json"] {
            std::fs::copy(src.join(f), dst.join(f)).unwrap();
        }
        let st = SafeTensors::open(&src.join("model.safetensors")).unwrap();
        let mtp = "model.layers.3.";
        let keep: Vec<_> = st.tensors.iter().filter(|t| !t.name.starts_with(mtp)).collect();
        assert!(keep.len() + 20 < st.tensors.len(), "{name}: the fixture has no MTP layer to drop");
        let specs: Vec<TensorSpec> = keep.iter().map(|t| TensorSpec { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone() }).collect();
        let mut w = Writer::create(&dst.join("model.safetensors"), &specs, &[]).unwrap();
        for t in &keep {
            let mut raw = vec![0u8; t.len as usize];
            st.read_into(t, &mut raw).unwrap();
            w.write(&raw).unwrap();
        }
        w.finish().unwrap();
        let opts = Options { ctx: 64, ..Options::default() };
        let (with, without) = (waste::plan_memory(&src, &opts).unwrap(), waste::plan_memory(&dst, &opts).unwrap());
        assert_eq!(waste::MemoryPlan { path: with.path.clone(), ..without }, with, "{name}: the plans differ");
        let a = prompt_logits(&mut open_model_threads(&src, 1, 32), &o.prompt, false);
        let b = prompt_logits(&mut open_model_threads(&dst, 1, 32), &o.prompt, false);
        assert!(bit_identical(&a, &b), "{name}: the MTP tensors change the logits");
        let _ = std::fs::remove_dir_all(&dst);
    }
}

/// The engine reads the structure transformers built and each fixture exercises what it is
/// for: its contrasts (the same bytes with the feature switched off) are far above the
/// tolerance; the MTP layer's tensors are in the file, and `info` says they are skipped.
#[test]
fn glm_fixtures_have_the_intended_structure() {
    for name in ALL {
        let o = oracle(name);
        let meta = read_json(&o.dir.join("meta.json"));
        assert_eq!(meta.get("transformers").unwrap().as_str(), Some("5.24.0"), "{name}");
        let m = open_model_threads(&o.dir.join("model"), 1, 32);
        let cfg = m.config();
        let layers = meta.get("layers").unwrap().as_array().unwrap();
        assert_eq!(layers.len(), cfg.layers, "{name}");
        for (l, layer) in layers.iter().enumerate() {
            assert_eq!(cfg.is_moe_layer(l), layer.get("ffn").unwrap().as_str() == Some("moe"), "{name}: layer {l} FFN");
        }
        let mut margins = vec![meta.get("bias_contrast").unwrap().get("logits_rel_diff").unwrap().as_f64().unwrap()];
        if let Some(Some(c)) = meta.get("contrasts").map(|c| c.as_object()) {
            margins.extend(c.iter().map(|(_, v)| v.get("logits_rel_diff").unwrap().as_f64().unwrap()));
        }
        for margin in margins {
            assert!(margin >= 50.0 * TOL as f64, "{name}: a contrast of {margin:.3e} is too close to the tolerance");
        }
        // Half of each head rotates; q/k/v biases but none on o_proj.
        assert_eq!(cfg.rope.dim * 2, cfg.head_dim, "{name}: partial rotary 0.5");
        assert!(cfg.qkv_bias && !cfg.o_bias, "{name}");
    }
    let cfg = |name: &str| open_model_threads(&oracle(name).dir.join("model"), 1, 32).config().clone();
    let c = cfg("glm4_moe_f32");
    assert_eq!((c.head_dim, c.rope.dim, c.qk_norm, c.mtp_layers), (32, 16, QkNorm::PerHead, 1));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(moe.routing, Routing::Sigmoid { groups: 4, topk_group: 2, renormalize: true, scale: 2.5 });
    assert_eq!((moe.moe_layers.clone(), moe.shared_intermediate), (vec![false, true, true], 32));
    let c = cfg("glm4_moe_noqk_f32");
    assert_eq!((c.head_dim, c.rope.dim, c.qk_norm, c.mtp_layers), (16, 8, QkNorm::None, 0));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(moe.routing, Routing::Sigmoid { groups: 1, topk_group: 1, renormalize: false, scale: 1.5 });
    assert_eq!((moe.moe_layers.clone(), moe.shared_intermediate), (vec![false, false, true, true], 64));
    // The release's spelling: top-level rope_theta and partial_rotary_factor.
    let text = std::fs::read_to_string(oracle("glm4_moe_noqk_f32").dir.join("model/config.json")).unwrap();
    assert!(text.contains("\"partial_rotary_factor\"") && !text.contains("rope_parameters"), "{text}");

    // The MTP layer: the bf16 checkpoint holds its tensors (a whole decoder layer and the MTP
    // head), the f32 one does not (as save_pretrained writes it); both configs declare it, both
    // open and run (above), and `info` reports it skipped.
    for (name, present) in [("glm4_moe_f32", false), ("glm4_moe_bf16", true)] {
        let dir = oracle(name).dir.join("model");
        let st = waste::format::safetensors::SafeTensors::open(&dir.join("model.safetensors")).unwrap();
        for t in ["model.layers.3.eh_proj.weight", "model.layers.3.self_attn.q_proj.weight", "model.layers.3.mlp.experts.7.down_proj.weight"] {
            assert_eq!(st.get(t).is_some(), present, "{name}: {t}");
        }
        assert_eq!(open_model_threads(&dir, 1, 32).info().mtp_layers, 1, "{name}");
        let (code, out, err) = waste(&["info", dir.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("mtp layers    1 skipped") && out.contains("model.layers.3.* are never read"), "{out}");
    }
}

/// GLM-4.5-Air's config.json (46 layers, GQA 96:8 of head_dim 128 with half of it rotated,
/// q/k/v biases, no q/k norm, one dense layer, one shared expert, one MTP layer), written here
/// from the published file's fields (nothing can be downloaded on this machine), with a small
/// vocabulary and 8 experts so that the header-only checkpoint's holes stay small.
const AIR: &str = r#"{"architectures": ["Glm4MoeForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "partial_rotary_factor": 0.5, "initializer_range": 0.02, "intermediate_size": 10944,
    "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1408,
    "norm_topk_prob": true, "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 8,
    "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
    "num_hidden_layers": 46, "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "rope_theta": 1000000, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0", "use_cache": true, "use_qk_norm": false, "vocab_size": 1024}"#;

/// The tensors of layer `l` of a GLM-4.5 checkpoint of `cfg`'s shape (BF16 matrices, F32
/// vectors), and with `mtp` the MTP head's own (eh_proj, enorm, hnorm, shared_head.norm).
fn glm_layer(cfg: &waste::format::config::ModelConfig, l: usize, mtp: bool) -> Vec<(String, waste::format::dtype::DType, Vec<u64>)> {
    use waste::format::dtype::DType::{BF16, F32};
    let (h, q, kv) = (cfg.hidden as u64, cfg.q_dim() as u64, cfg.kv_dim() as u64);
    let p = format!("model.layers.{l}");
    let mut t = vec![(format!("{p}.input_layernorm.weight"), F32, vec![h]), (format!("{p}.post_attention_layernorm.weight"), F32, vec![h])];
    for (name, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
        t.push((format!("{p}.self_attn.{name}.weight"), BF16, vec![rows, h]));
        t.push((format!("{p}.self_attn.{name}.bias"), BF16, vec![rows]));
    }
    t.push((format!("{p}.self_attn.o_proj.weight"), BF16, vec![h, q]));
    let mlp = |t: &mut Vec<_>, prefix: String, i: u64| {
        for (name, shape) in [("gate_proj", vec![i, h]), ("up_proj", vec![i, h]), ("down_proj", vec![h, i])] {
            t.push((format!("{prefix}.{name}.weight"), BF16, shape));
        }
    };
    match cfg.moe.as_ref().filter(|_| cfg.is_moe_layer(l) || mtp) {
        None => mlp(&mut t, format!("{p}.mlp"), cfg.intermediate as u64),
        Some(moe) => {
            t.push((format!("{p}.mlp.gate.weight"), BF16, vec![moe.experts as u64, h]));
            t.push((format!("{p}.mlp.gate.e_score_correction_bias"), F32, vec![moe.experts as u64]));
            for j in 0..moe.experts {
                mlp(&mut t, format!("{p}.mlp.experts.{j}"), moe.expert_intermediate as u64);
            }
            mlp(&mut t, format!("{p}.mlp.shared_experts"), moe.shared_intermediate as u64);
        }
    }
    if mtp {
        t.push((format!("{p}.eh_proj.weight"), BF16, vec![h, 2 * h]));
        for n in ["enorm", "hnorm", "shared_head.norm"] {
            t.push((format!("{p}.{n}.weight"), BF16, vec![h]));
        }
    }
    t
}

/// GLM-4.5-Air's shape as a header-only checkpoint, with and without its MTP layer 46: the
/// released config reads as intended, the plans are the same (the MTP layer is never held), and
/// the state at 4096 tokens is the f32 K/V cache of the 46 decoder layers: 2 × 46 × 4096 × 8 ×
/// 128 floats (1.44 GiB) plus the session's tokens.
#[test]
fn glm_4_5_air_shape_in_the_plan() {
    use waste::format::dtype::DType::{BF16, F32};
    let cfg = waste::format::config::ModelConfig::from_json(Path::new("config.json"),
        &waste::format::json::parse(AIR.as_bytes()).unwrap()).unwrap();
    assert_eq!((cfg.head_dim, cfg.rope.dim, cfg.rope.theta, cfg.qk_norm, cfg.qkv_bias, cfg.o_bias, cfg.mtp_layers),
        (128, 64, 1e6, QkNorm::None, true, false, 1));
    assert_eq!(cfg.eos_tokens, [151329, 151336, 151338]);
    let moe = cfg.moe.as_ref().unwrap();
    assert_eq!(moe.routing, Routing::Sigmoid { groups: 1, topk_group: 1, renormalize: true, scale: 1.0 });
    assert_eq!((moe.expert_intermediate, moe.shared_intermediate), (1408, 1408));
    assert_eq!((0..46).filter(|&l| !cfg.is_moe_layer(l)).collect::<Vec<_>>(), [0]);
    let (h, v) = (cfg.hidden as u64, cfg.vocab as u64);
    let mut tensors = vec![("model.embed_tokens.weight".to_string(), BF16, vec![v, h])];
    for l in 0..cfg.layers {
        tensors.extend(glm_layer(&cfg, l, false));
    }
    tensors.push(("model.norm.weight".into(), F32, vec![h]));
    tensors.push(("lm_head.weight".into(), BF16, vec![v, h]));
    let base = temp_dir("glm-air");
    write_checkpoint(&base.join("plain"), AIR, &tensors);
    let mut with_mtp = tensors.clone();
    with_mtp.extend(glm_layer(&cfg, 46, true));
    write_checkpoint(&base.join("mtp"), AIR, &with_mtp);
    let opts = Options { ctx: 4096, ..Options::default() };
    let plain = waste::plan_memory(base.join("plain"), &opts).unwrap();
    let mtp = waste::plan_memory(base.join("mtp"), &opts).unwrap();
    assert_eq!(waste::MemoryPlan { path: plain.path.clone(), ..mtp }, plain, "the MTP layer changes the plan");
    assert_eq!(plain.state_bytes, 2 * 46 * 4096 * 8 * 128 * 4 + 4097 * 4);
    let _ = std::fs::remove_dir_all(&base);
}

/// `waste random-model --container` writes GLM's layers as the config asks (q/k/v biases, q/k
/// norm, a dense first layer, the router's correction bias, shared experts): the container
/// opens, streams its experts through the smallest cache, gives finite logits, and its plan is
/// what it holds.
#[test]
fn glm_random_container_opens_and_plans() {
    let dir = temp_dir("glm-random");
    let cfg = dir.join("config.json");
    std::fs::write(&cfg, r#"{"architectures": ["Glm4MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "attention_bias": true,
        "use_qk_norm": true, "vocab_size": 96, "max_position_embeddings": 64}"#).unwrap();
    let out = dir.join("glm.waste");
    let (code, _, err) = waste(&["random-model", "--config", cfg.to_str().unwrap(), "--out", out.to_str().unwrap(), "--container", "--experts", "q4"]);
    assert_eq!(code, 0, "{err}");
    let manifest = waste::format::container::Manifest::open(&out).unwrap();
    assert_eq!(manifest.banks.iter().map(|b| b.layer).collect::<Vec<_>>(), [1, 2]);
    let opts = Options { threads: 1, cache_bytes: waste::cache::min_cache_bytes(&manifest), ..Options::default() };
    let mut m = open_model(&out, opts.clone());
    let logits = prompt_logits(&mut m, &[1, 5, 9, 13, 17, 21, 25, 29], false);
    assert_finite("random GLM container logits", &logits);
    assert!(m.cache_stats().unwrap().misses > 0);
    assert_plan_matches(&waste::plan_memory(&out, &opts).unwrap(), &m, "random GLM container");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The quantized paths run on GLM's layers: `waste convert` with its defaults (q4 trunk and
/// experts, q8 embeddings and routers), `waste quantize` q8, and the int8-activation kernels
/// give finite logits.
#[test]
fn glm_quantized_paths_run() {
    use waste::format::quant::Width;
    use waste::tools::convert::{convert, ConvertOptions};
    use waste::tools::quantize::quantize_checkpoint;
    for name in ["glm4_moe_f32", "glm4_moe_noqk_f32"] {
        let o = oracle(name);
        let src = o.dir.join("model");
        let base = temp_dir(&format!("{name}-quant"));
        let q4 = base.join("default.waste");
        convert(&ConvertOptions::new(&src, &q4), &mut |_| {}).unwrap();
        assert_finite(&format!("{name}: q4 container logits"), &prompt_logits(&mut open_model_threads(&q4, 1, 32), &o.prompt, false));
        let q8 = base.join("q8-checkpoint");
        quantize_checkpoint(&src, &q8, Width::Q8).unwrap();
        assert_finite(&format!("{name}: q8 checkpoint logits"), &prompt_logits(&mut open_model_threads(&q8, 1, 32), &o.prompt, false));
        let mut int8 = open_model(&q4, Options { threads: 2, activations: waste::Activations::Int8, ..Options::default() });
        assert_finite(&format!("{name}: int8-activation logits"), &prompt_logits(&mut int8, &o.prompt, false));
        let _ = std::fs::remove_dir_all(&base);
    }
}
