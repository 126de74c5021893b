//! DeepSeek-V2/V3 and Kimi-Linear against transformers 5.24.0 (CPU, f32, eager): the shared
//! fixtures (deepseek_v3, kimi_linear, f32 and bf16 storage) and those of
//! `tools/oracles/make_extra_oracles.py` (spec §3.10, §4.6). Each from its Hugging Face
//! directory and from a float container whose routed experts stream through the expert cache;
//! chunking, threads and cache size never change a bit; Kimi's token-at-a-time decode matches
//! transformers' cached decode; the memory plan counts the latent cache and the KDA state.
//!
//! Kimi's routing weights are the unbiased sigmoid scores (transformers and vLLM; spec §4.7):
//! these fixtures are transformers', not Moonshot's remote code.

use crate::common;
use common::*;
use std::path::Path;
use waste::format::config::{Mixer, MlaRope, Routing};
use waste::tools::convert::{convert, ConvertOptions, Encoding};
use waste::format::dtype::DType;
use waste::{Model, Options};

/// f32 on both sides (bf16 storage is widened exactly): only summation order differs.
const TOL: f32 = 2e-5;
const SHARED: [&str; 4] = ["deepseek_v3_f32", "deepseek_v3_bf16", "kimi_linear_f32", "kimi_linear_bf16"];
const EXTRA: [&str; 5] = ["deepseek_v3_group_f32", "deepseek_v3_plain_f32", "deepseek_v2_lite_f32", "deepseek_v2_glg_f32",
    "kimi_linear_decode_f32"];

fn all() -> impl Iterator<Item = &'static str> {
    SHARED.into_iter().chain(EXTRA)
}


/// Logits at every position, every layer's hidden state and the greedy continuation, from the
/// Hugging Face directory.
#[test]
fn latent_models_match_the_reference_from_the_hf_directory() {
    for name in all() {
        let o = oracle(name);
        let dir = o.dir.join("model");
        let mut m = open_model_threads(&dir, 1, 32);
        let ours = prompt_logits(&mut m, &o.prompt, false);
        assert_logits_close_at_every_position(name, &ours, &o, m.info().vocab, TOL);
        assert_hidden_states_close(name, &mut m, &o, TOL);
        let got = greedy(&mut open_model_threads(&dir, 2, 32), &o.prompt, o.greedy.len());
        assert_eq!(got, o.greedy, "{name}: greedy continuation");
    }
}

/// An f32 container of each model: routed experts stream through the cache (shared experts
/// stay in the trunk), the logits match the reference and are the HF directory's bits.
#[test]
fn latent_float_containers_match_and_stream_their_experts() {
    for name in all() {
        let o = oracle(name);
        let out = float_container(name, "container");
        let manifest = waste::format::container::Manifest::open(&out).unwrap();
        let mut container = open_model_threads(&out, 1, 32);
        let from_dir = open_model_threads(&o.dir.join("model"), 1, 32);
        assert_eq!(container.config(), from_dir.config(), "{name}: the container's config");
        let moe_layers: Vec<usize> = (0..from_dir.config().layers).filter(|&l| from_dir.config().is_moe_layer(l)).collect();
        assert_eq!(manifest.banks.iter().map(|b| b.layer).collect::<Vec<_>>(), moe_layers, "{name}: one bank per MoE layer");
        let ours = prompt_logits(&mut container, &o.prompt, false);
        assert_logits_close_at_every_position(&format!("{name} (container)"), &ours, &o, container.info().vocab, TOL);
        let stats = container.cache_stats().expect("experts should stream through the cache").clone();
        assert!(stats.misses > 0 && stats.bytes_read > 0, "{name}: {stats:?}");
        // The directory's BF16 weights, on the FMA kernels (no tiles), give the f32 container's bits.
        let hf = prompt_logits(&mut open_model_untiled(&o.dir.join("model"), 1, 32), &o.prompt, false);
        assert!(bit_identical(&ours, &hf), "{name}: f32 container and HF directory differ");
        container.reset();
        assert_eq!(greedy(&mut container, &o.prompt, o.greedy.len()), o.greedy, "{name}: container greedy");
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
    }
}

/// Token-at-a-time decoding, two threads and a prefill chunk of 5 give the default run's bits;
/// so does a second run after `reset` (the KDA state starts again from zero).
#[test]
fn latent_chunking_threads_and_reset_are_bit_identical() {
    for name in all() {
        let o = oracle(name);
        let runs = [(2, 32, false), (1, 32, true), (1, 5, false), (2, 5, true)];
        assert_chunking_threads_and_reset_bit_identical(name, &o.dir.join("model"), &o.prompt, &runs);
    }
}

/// The expert cache changes only when bytes move: the smallest cache, every expert cached, I/O
/// threads, two compute threads, decoding token by token with the look-ahead — all the HF
/// directory's bits.
#[test]
fn latent_cache_size_and_io_are_bit_identical() {
    for name in ["deepseek_v3_f32", "deepseek_v3_group_f32", "deepseek_v2_glg_f32", "kimi_linear_decode_f32"] {
        let o = oracle(name);
        let dir = float_container(name, "bits");
        let hf = prompt_logits(&mut open_model_threads(&o.dir.join("model"), 1, 32), &o.prompt, false);
        assert_cache_size_and_io_bit_identical(name, &dir, &o.prompt, &hf);
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }
}

/// transformers' cached decode (a 12-token prefill, then one token at a time; spec §4.6) against
/// ours, token at a time from the start: positions 11..71, every row.
#[test]
fn kimi_decode_matches_transformers_cached_decode() {
    let o = oracle("kimi_linear_decode_f32");
    let meta = read_json(&o.dir.join("meta.json"));
    let decode = meta.get("decode").unwrap();
    let from = decode.get("prefill_len").unwrap().as_u64().unwrap() as usize;
    let reference = read_f32(&o.dir.join("decode_logits.f32"));
    let vocab = 512;
    assert_eq!(reference.len(), (o.prompt.len() - from + 1) * vocab);
    let mut m = open_model_threads(&o.dir.join("model"), 1, 32);
    let mut ours = prompt_logits(&mut m, &o.prompt[..from], false)[(from - 1) * vocab..].to_vec();
    for &t in &o.prompt[from..] {
        ours.extend_from_slice(m.eval(&[t]).unwrap());
    }
    assert_close("kimi_linear_decode_f32", &format!("cached decode rows {}..{}", from - 1, o.prompt.len() - 1), &ours, &reference, TOL);
    // The reference's own decode is within f32 noise of its prefill (recorded when it was made).
    assert!(decode.get("rel_diff_vs_prefill").unwrap().as_f64().unwrap() < 2e-5);
}

/// The engine reads the structure transformers built (meta.json: each layer's mixer and FFN),
/// and each fixture exercises what it is for: its contrast, and the bias's, are far above the
/// tolerance.
#[test]
fn latent_fixtures_have_the_intended_structure() {
    for name in EXTRA {
        let o = oracle(name);
        let meta = read_json(&o.dir.join("meta.json"));
        assert_eq!(meta.get("transformers").unwrap().as_str(), Some("5.24.0"), "{name}");
        let m = open_model_threads(&o.dir.join("model"), 1, 32);
        let cfg = m.config();
        let layers = meta.get("layers").unwrap().as_array().unwrap();
        assert_eq!(layers.len(), cfg.layers, "{name}");
        for (l, layer) in layers.iter().enumerate() {
            assert_eq!(cfg.is_moe_layer(l), layer.get("ffn").unwrap().as_str() == Some("moe"), "{name}: layer {l} FFN");
            let mixer = match layer.get("mixer").unwrap().as_str() {
                Some("kda") => Mixer::Kda,
                Some("mla") => Mixer::Mla,
                other => panic!("{name}: layer {l}: mixer {other:?}"),
            };
            assert_eq!(cfg.mixer(l), mixer, "{name}: layer {l} mixer");
        }
        for key in ["contrast", "bias_contrast"] {
            if let Some(c) = meta.get(key) {
                let margin = c.get("logits_rel_diff").unwrap().as_f64().unwrap();
                assert!(margin >= 50.0 * TOL as f64, "{name}: {key} {margin:.3e} is too close to the tolerance");
            }
        }
        if let Some(b) = meta.get("bias_contrast") {
            assert!(b.get("tokens_with_other_experts").unwrap().as_u64().unwrap() > 0, "{name}: the bias changes no winner");
        }
    }
    let mla = |name: &str| open_model_threads(&oracle(name).dir.join("model"), 1, 32).config().clone();
    // V3 with groups: q-LoRA, interleaved, YaRN factor 40 with mscale_all_dim 1 (spec §3.5).
    let c = mla("deepseek_v3_group_f32");
    let m = c.mla.as_ref().unwrap();
    assert_eq!((m.q_lora_rank, m.rope, m.rope_factor), (Some(32), MlaRope::Interleaved, 1.0));
    let want = (24f64.powf(-0.5) * (1.0 + 0.1 * 40f64.ln()).powi(2)) as f32;
    assert!((m.scale - want).abs() <= want * 1e-6, "{} vs {want}", m.scale);
    assert_eq!(c.moe.as_ref().unwrap().routing, Routing::Sigmoid { groups: 4, topk_group: 2, renormalize: true, scale: 2.5 });
    // V3 plain: q_proj, half-split, raw top-k, two dense layers.
    let c = mla("deepseek_v3_plain_f32");
    assert_eq!((c.mla.as_ref().unwrap().q_lora_rank, c.mla.as_ref().unwrap().rope), (None, MlaRope::HalfSplit));
    assert_eq!(c.moe.as_ref().unwrap().routing, Routing::Sigmoid { groups: 1, topk_group: 1, renormalize: false, scale: 2.5 });
    assert_eq!(c.moe.as_ref().unwrap().moe_layers, vec![false, false, true, true]);
    // V2: greedy and group-limited softmax routing.
    assert_eq!(mla("deepseek_v2_lite_f32").moe.unwrap().routing, Routing::SoftmaxGroups { groups: 1, topk_group: 1, scale: 1.0 });
    assert_eq!(mla("deepseek_v2_glg_f32").moe.unwrap().routing, Routing::SoftmaxGroups { groups: 4, topk_group: 2, scale: 16.0 });
    // Kimi: 1-based layer lists put the MLA layer at 0-based 3; NoPE; KDA 4 heads of 32.
    let c = mla("kimi_linear_decode_f32");
    let m = c.mla.as_ref().unwrap();
    assert_eq!(m.mixers, vec![Mixer::Kda, Mixer::Kda, Mixer::Kda, Mixer::Mla, Mixer::Kda]);
    assert_eq!((m.rope, m.kda.unwrap().heads, m.kda.unwrap().head_dim, m.kda.unwrap().conv_kernel), (MlaRope::None, 4, 32, 4));
    // transformers 5 saved the dense layer under block_sparse_moe. (spec §4.2); the shared
    // fixture has it under mlp.
    let tensors = read_json(&oracle("kimi_linear_decode_f32").dir.join("meta.json"));
    assert!(tensors.get("tensors").unwrap().get("model.layers.0.block_sparse_moe.gate_proj.weight").is_some());
}

/// The plan (headers only) equals what `Model::open` holds, and its state is the latent cache
/// (ctx × (r + d_r) floats per MLA layer) plus the KDA state (H·D·D + 3·(K − 1)·H·D floats per
/// KDA layer) with no K/V cache; `memory_used` agrees.
#[test]
fn latent_plan_counts_the_latent_cache_and_the_kda_state() {
    for name in ["deepseek_v3_f32", "kimi_linear_f32", "deepseek_v3_plain_f32", "kimi_linear_decode_f32"] {
        assert_plan_equals_memory_used(name, |plan, m, what| {
            let cfg = m.config();
            let mla = cfg.mla.as_ref().unwrap();
            let ctx = plan.ctx as u64;
            let latent: u64 = (0..cfg.layers).map(|l| match cfg.mixer(l) {
                Mixer::Mla => ctx * (mla.kv_lora_rank + mla.rope_dim) as u64,
                Mixer::Kda => {
                    let k = mla.kda.unwrap();
                    (k.heads * k.head_dim * k.head_dim + 3 * (k.conv_kernel - 1) * k.heads * k.head_dim) as u64
                }
                Mixer::Attention => panic!("{what}: a standard attention layer"),
            }).sum::<u64>() * 4;
            // And the session's room for its tokens.
            let history = (ctx + 1) * 4;
            assert_eq!(plan.state_bytes, latent + history, "state = latent cache + KDA state + tokens, no K/V cache: {what}");
        });
    }
}

/// The fixture with every matrix whose rows split into blocks of 32 replaced by its Q8B32
/// decoding: the same model as the q8 files made from it, so float and q8 runs may differ only
/// by kernel arithmetic (this separates "the quantized path computes these layers right" from
/// "q8 noise flips a near-tie": the random fixtures' routers have top-k gaps of ~1e-3).
fn q8_representable_copy(src: &Path, dst: &Path) {
    use waste::format::dtype::DType;
    use waste::format::quant::{decode_row, encode_row, Width};
    use waste::format::safetensors::{SafeTensors, TensorSpec, Writer};
    std::fs::create_dir_all(dst).unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let st = SafeTensors::open(&src.join("model.safetensors")).unwrap();
    let specs: Vec<TensorSpec> = st.tensors.iter().map(|t| TensorSpec { name: t.name.clone(), dtype: DType::F32, shape: t.shape.clone() }).collect();
    let mut w = Writer::create(&dst.join("model.safetensors"), &specs, &[]).unwrap();
    for t in &st.tensors {
        assert_eq!(t.dtype, DType::F32, "{}", t.name);
        let mut raw = vec![0u8; t.len as usize];
        st.read_into(t, &mut raw).unwrap();
        let mut v: Vec<f32> = raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        if let [_, cols] = t.shape[..] {
            let cols = cols as usize;
            assert_eq!(cols % 32, 0, "{}: the quantized fixtures have block-sized rows", t.name);
            let mut block = vec![0u8; cols / 32 * 34];
            for row in v.chunks_exact_mut(cols) {
                encode_row(Width::Q8, row, &mut block).unwrap();
                decode_row(Width::Q8, &block, row);
            }
        }
        w.write(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    }
    w.finish().unwrap();
}

/// The quantized paths run on these families: `waste convert` with its defaults (q4 trunk and
/// experts, q8 embeddings and routers) and `waste quantize` (q4, q8) give finite logits; and on
/// the q8-representable copy of each fixture, a q8 container and a q8 checkpoint give the
/// float model's logits (to 1e-5) and greedy tokens. (The fixtures made here have every column
/// count a multiple of 32; the shared ones' rank 16 cannot be blocked.)
#[test]
fn latent_quantized_paths_run_and_q8_keeps_the_tokens() {
    use waste::format::quant::Width;
    use waste::tools::quantize::quantize_checkpoint;
    for name in EXTRA {
        let o = oracle(name);
        let src = o.dir.join("model");
        let base = temp_dir(&format!("{name}-quant"));
        let defaults = base.join("default.waste");
        convert(&ConvertOptions::new(&src, &defaults), &mut |_| {}).unwrap();
        assert_finite(&format!("{name}: q4 container logits"), &prompt_logits(&mut open_model_threads(&defaults, 1, 32), &o.prompt, false));
        for (width, tag) in [(Width::Q8, "q8"), (Width::Q4, "q4")] {
            let out = base.join(format!("quantized-{tag}"));
            quantize_checkpoint(&src, &out, width).unwrap();
            assert_finite(&format!("{name}: {tag} checkpoint logits"), &prompt_logits(&mut open_model_threads(&out, 1, 32), &o.prompt, false));
        }

        let exact = base.join("q8-representable");
        q8_representable_copy(&src, &exact);
        let mut float = open_model_threads(&exact, 1, 32);
        let reference = prompt_logits(&mut float, &o.prompt, false);
        float.reset();
        let tokens = greedy(&mut float, &o.prompt, o.greedy.len());
        let q8_container = base.join("q8.waste");
        convert(&ConvertOptions { trunk: Encoding::Q8, experts: Encoding::Q8, ..ConvertOptions::new(&exact, &q8_container) }, &mut |_| {}).unwrap();
        let q8_checkpoint = base.join("q8-checkpoint");
        quantize_checkpoint(&exact, &q8_checkpoint, Width::Q8).unwrap();
        for dir in [&q8_container, &q8_checkpoint] {
            let mut m = open_model_threads(dir, 1, 32);
            let rel = rel_max_diff(&prompt_logits(&mut m, &o.prompt, false), &reference);
            println!("{name}: q8 ({}) vs the float model of the same weights: {rel:.3e}", dir.display());
            assert!(rel <= 1e-5, "{name}: {}: {rel:.3e}", dir.display());
            m.reset();
            assert_eq!(greedy(&mut m, &o.prompt, o.greedy.len()), tokens, "{name}: {} greedy", dir.display());
        }
        // The int8-activation path's buffer covers these layers' widest inputs (its activation
        // rounding flips near-tie routes here, so only finiteness is asserted).
        let mut int8 = open_model(&q8_container, Options { threads: 2, activations: waste::Activations::Int8, ..Options::default() });
        assert_finite(&format!("{name}: int8-activation logits"), &prompt_logits(&mut int8, &o.prompt, false));
        let _ = std::fs::remove_dir_all(&base);
    }
}

/// Rewrites `src`'s tensors into `dst/model.safetensors` through `edit` (which returns the
/// tensors to write in their place: name, dtype, shape, bytes), with its config.
fn rewrite(src: &Path, dst: &Path, mut edit: impl FnMut(&str, Vec<u64>, Vec<u8>) -> Vec<(String, waste::format::dtype::DType, Vec<u64>, Vec<u8>)>) {
    use waste::format::dtype::DType;
    use waste::format::safetensors::{SafeTensors, TensorSpec, Writer};
    std::fs::create_dir_all(dst).unwrap();
    std::fs::copy(src.join("config.json"), dst.join("config.json")).unwrap();
    let st = SafeTensors::open(&src.join("model.safetensors")).unwrap();
    let mut out = Vec::new();
    for t in &st.tensors {
        assert_eq!(t.dtype, DType::F32);
        let mut raw = vec![0u8; t.len as usize];
        st.read_into(t, &mut raw).unwrap();
        out.extend(edit(&t.name, t.shape.clone(), raw));
    }
    let specs: Vec<TensorSpec> = out.iter().map(|(n, d, s, _)| TensorSpec { name: n.clone(), dtype: *d, shape: s.clone() }).collect();
    let mut w = Writer::create(&dst.join("model.safetensors"), &specs, &[]).unwrap();
    for (_, _, _, b) in &out {
        w.write(b).unwrap();
    }
    w.finish().unwrap();
}

/// transformers 5's `save_original_format=False` KDA keys (spec §4.2) — one `conv1d.weight`
/// [3·H·D, 1, K] holding q, k, v in that order, and `forget_gate.{f_a_proj, f_b_proj, dt_bias,
/// A_log}` with A_log as [H] — load to the same model, bit for bit. Fused expert tensors are
/// refused by name.
#[test]
fn kimi_accepts_the_transformers_5_kda_keys_and_refuses_fused_experts() {
    use waste::format::dtype::DType;
    let o = oracle("kimi_linear_decode_f32");
    let src = o.dir.join("model");
    let base = temp_dir("kimi-aliases");
    let mut pending: Vec<(String, Vec<u8>)> = Vec::new();
    rewrite(&src, &base.join("fused"), |name, shape, raw| {
        let Some(attn) = name.strip_suffix("_conv1d.weight") else {
            for leaf in ["f_a_proj.weight", "f_b_proj.weight", "dt_bias", "A_log"] {
                if let Some(p) = name.strip_suffix(leaf).and_then(|p| p.strip_suffix("self_attn.")) {
                    let shape = if leaf == "A_log" { vec![shape.iter().product()] } else { shape };
                    return vec![(format!("{p}self_attn.forget_gate.{leaf}"), DType::F32, shape, raw)];
                }
            }
            return vec![(name.to_string(), DType::F32, shape, raw)];
        };
        // The three arrive k, q, v (the file's names are sorted): the stack goes out with v.
        pending.push((attn.to_string(), raw));
        if !attn.ends_with(".v") {
            return Vec::new();
        }
        let prefix = attn.strip_suffix(".v").unwrap();
        let bytes: Vec<u8> = ["q", "k", "v"].iter().flat_map(|s| {
            pending.iter().find(|(a, _)| *a == format!("{prefix}.{s}")).unwrap().1.clone()
        }).collect();
        pending.clear();
        vec![(format!("{prefix}.conv1d.weight"), DType::F32, vec![3 * shape[0], shape[1], shape[2]], bytes)]
    });
    let fused_st = waste::format::safetensors::SafeTensors::open(&base.join("fused/model.safetensors")).unwrap();
    assert!(fused_st.get("model.layers.0.self_attn.conv1d.weight").is_some() && fused_st.get("model.layers.0.self_attn.q_conv1d.weight").is_none());
    assert!(fused_st.get("model.layers.4.self_attn.forget_gate.A_log").is_some());
    drop(fused_st);
    let want = prompt_logits(&mut open_model_threads(&src, 1, 32), &o.prompt, false);
    let got = prompt_logits(&mut open_model_threads(&base.join("fused"), 1, 32), &o.prompt, false);
    assert!(bit_identical(&want, &got), "the aliased checkpoint computes something else");
    let (fused_plan, plan) = (waste::plan_memory(base.join("fused"), &waste::Options { ctx: 64, ..waste::Options::default() }).unwrap(), waste::plan_memory(&src, &waste::Options { ctx: 64, ..waste::Options::default() }).unwrap());
    assert_eq!(waste::MemoryPlan { path: plan.path.clone(), ..fused_plan }, plan, "the same plan, but for the path");

    rewrite(&src, &base.join("fused-experts"), |name, shape, raw| {
        let mut v = vec![(name.to_string(), DType::F32, shape, raw)];
        if name == "model.layers.1.block_sparse_moe.gate.weight" {
            v.push(("model.layers.1.mlp.experts.gate_up_proj".into(), DType::F32, vec![4, 64, 64], vec![0u8; 4 * 64 * 64 * 4]));
        }
        v
    });
    let e = Model::open(base.join("fused-experts"), &Options::default()).err().expect("fused experts should be refused");
    assert_eq!(e.kind(), waste::ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("model.layers.1.mlp.experts.gate_up_proj"), "{e}");
    let _ = std::fs::remove_dir_all(&base);
}

/// An `F8_E4M3` tensor in a checkpoint whose config.json declares no FP8 `quantization_config`
/// (so no block size to read its scales with) is refused, naming the tensor and its dtype. FP8
/// checkpoints that declare it load: `tests/oracle_fp8.rs`.
#[test]
fn fp8_weights_are_refused_by_name() {
    use waste::format::dtype::DType;
    let o = oracle("deepseek_v3_group_f32");
    let base = temp_dir("fp8");
    let target = "model.layers.1.self_attn.kv_b_proj.weight";
    rewrite(&o.dir.join("model"), &base, |name, shape, raw| {
        if name == target {
            let n = shape.iter().product::<u64>() as usize;
            let scales = vec![shape[0].div_ceil(128), shape[1].div_ceil(128)];
            let ones = (0..scales[0] * scales[1]).flat_map(|_| 1f32.to_le_bytes()).collect();
            vec![(name.into(), DType::F8E4M3, shape, vec![0x38u8; n]), (format!("{name}_scale_inv"), DType::F32, scales, ones)]
        } else {
            vec![(name.into(), DType::F32, shape, raw)]
        }
    });
    let e = Model::open(&base, &Options::default()).err().expect("an F8_E4M3 tensor should be refused");
    assert_eq!(e.kind(), waste::ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains(target) && e.to_string().contains("F8_E4M3"), "{e}");
    let _ = std::fs::remove_dir_all(&base);
}

/// Kimi-Linear-48B's attention geometry (spec §4.1: 27 layers, MLA at the 1-based full_attn
/// layers 4, 8, …, 24, 27, KDA 32 heads of 128 with kernel 4, kv_lora_rank 512 + 64) as a sparse
/// checkpoint (headers only; a small vocabulary and few experts keep the file's holes small):
/// the plan's state at 4096 tokens is 7 × 4096 × 576 floats of latent cache plus 20 × (32·128·128
/// + 3·3·4096) floats of KDA state — 63 MiB + 42.8 MiB, where a K/V cache would grow with heads.
#[test]
fn kimi_linear_48b_state_in_the_plan() {
    use waste::format::json;
    let kda: Vec<String> = [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26].iter().map(|x| x.to_string()).collect();
    let config = format!(r#"{{"architectures": ["KimiLinearForCausalLM"], "hidden_size": 2304, "num_hidden_layers": 27,
        "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 1024, "intermediate_size": 9216,
        "moe_intermediate_size": 1024, "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1,
        "first_k_dense_replace": 1, "q_lora_rank": null, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-5, "model_max_length": 1048576,
        "linear_attn_config": {{"num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4,
        "kda_layers": [{}], "full_attn_layers": [4, 8, 12, 16, 20, 24, 27]}}}}"#, kda.join(", "));
    let cfg = waste::format::config::ModelConfig::from_json(Path::new("config.json"), &json::parse(config.as_bytes()).unwrap()).unwrap();
    let dir = temp_dir("kimi-48b");
    // Header-only: the data is a hole, so the 48B shape costs no disk.
    let tensors: Vec<_> = waste::tools::random::tensor_shapes(&cfg).into_iter()
        .map(|(name, shape)| (name, if shape.len() == 1 { DType::F32 } else { DType::BF16 }, shape)).collect();
    write_checkpoint(&dir, &config, &tensors);
    let plan = waste::plan_memory(&dir, &waste::Options { ctx: 4096, ..waste::Options::default() }).unwrap();
    // The latent cache, the KDA state, and room for the session's 4,097 tokens.
    assert_eq!(plan.state_bytes, 7 * 4096 * 576 * 4 + 20 * (32 * 128 * 128 + 3 * 3 * 4096) * 4 + 4097 * 4);
    assert_eq!(plan.state_bytes, 66_060_288 + 44_892_160 + 16_388);
    let mla = cfg.mla.as_ref().unwrap();
    assert_eq!((0..27).filter(|&l| cfg.mixer(l) == Mixer::Mla).collect::<Vec<_>>(), [3, 7, 11, 15, 19, 23, 26]);
    assert_eq!(mla.count(Mixer::Kda), 20);
    let _ = std::fs::remove_dir_all(&dir);
}
