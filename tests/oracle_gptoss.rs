//! gpt-oss (`GptOssForCausalLM`) against transformers 5.24.0 (CPU, f32, eager): the fixtures of
//! `tools/oracles/make_gptoss_oracles.py` — f32 and bf16 storage, and MXFP4 experts (blocks and
//! e8m0 scales, the reference run on the dequantized values). Sinks, alternating sliding and
//! full attention (window 8 over 24 tokens), YaRN with its attention factor, biases everywhere,
//! top-k-then-softmax routing and the clamped SwiGLU all enter these logits.

use crate::common;
use common::*;
use waste::{Model, Options};

const TOL: f32 = 2e-5;
const ALL: [&str; 3] = ["gpt_oss_f32", "gpt_oss_bf16", "gpt_oss_mxfp4"];

/// Every prompt position, every layer's hidden state and the greedy continuation (decoded with
/// the KV cache on both sides), from the Hugging Face directory.
#[test]
fn gptoss_matches_the_reference_from_the_hf_directory() {
    for name in ALL {
        assert_directory_matches_reference(name, TOL);
    }
}

/// transformers' cached decode logits (one row per generated token) against ours, fed the same
/// tokens one at a time after the prompt.
#[test]
fn gptoss_decode_matches_transformers_cached_decode() {
    for name in ALL {
        let o = oracle(name);
        let reference = read_f32(&o.dir.join("decode_logits.f32"));
        let mut m = open_model_threads(&o.dir.join("model"), 1, 32);
        let mut ours = m.eval(&o.prompt).unwrap().to_vec();
        for &t in &o.greedy[..o.greedy.len() - 1] {
            ours.extend_from_slice(m.eval(&[t]).unwrap());
        }
        assert_close(name, "cached decode logits", &ours, &reference, TOL);
    }
}

/// Token at a time, two threads and chunks of 5 (windows straddling chunk edges) give the
/// default run's bits; so does a second run after `reset`.
#[test]
fn gptoss_chunking_and_threads_are_bit_identical() {
    for name in ALL {
        let o = oracle(name);
        let runs = [(2, 32, false), (1, 32, true), (1, 5, false), (2, 3, true)];
        assert_chunking_threads_and_reset_bit_identical(name, &o.dir.join("model"), &o.prompt, &runs);
    }
}

/// A float container (experts decoded from the fused or MXFP4 tensors into f32 records,
/// their biases in the trunk) streams its experts and gives the HF directory's bits; the cache
/// size, I/O threads, two compute threads and look-ahead change nothing.
#[test]
fn gptoss_float_containers_match_and_cache_size_is_bit_identical() {
    for name in ALL {
        let o = oracle(name);
        let out = float_container(name, "container");
        // The directory's BF16 weights, on the FMA kernels (no tiles), give the f32 container's bits.
        let hf = prompt_logits(&mut open_model_untiled(&o.dir.join("model"), 1, 32), &o.prompt, false);
        let mut c = open_model_threads(&out, 1, 32);
        let from_dir = open_model_threads(&o.dir.join("model"), 1, 32);
        assert_eq!(c.config(), from_dir.config(), "{name}: the container's config");
        let ours = prompt_logits(&mut c, &o.prompt, false);
        assert_close(name, "container logits", &ours, &o.logits, TOL);
        assert!(bit_identical(&ours, &hf), "{name}: f32 container and HF directory differ");
        let stats = c.cache_stats().expect("experts should stream").clone();
        assert!(stats.misses > 0 && stats.bytes_read > 0, "{name}: {stats:?}");
        c.reset();
        assert_eq!(greedy(&mut c, &o.prompt, o.greedy.len()), o.greedy, "{name}: container greedy");
        assert_cache_size_and_io_bit_identical(name, &out, &o.prompt, &hf);
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
    }
}

/// The plan, made from headers alone, is what the open model measures: the sinks, the router
/// and expert biases and the resident (decoded) experts from the directory, the trunk and cache
/// from a container.
#[test]
fn gptoss_plan_equals_memory_used() {
    for name in ALL {
        let o = oracle(name);
        let dir = o.dir.join("model");
        let opts = Options { threads: 1, ..Options::default() };
        let plan = waste::plan_memory(&dir, &opts).unwrap();
        let m = open_model(&dir, opts.clone());
        assert_plan_matches(&plan, &m, name);
        let out = float_container(name, "plan");
        let plan = waste::plan_memory(&out, &opts).unwrap();
        let m = open_model(&out, opts);
        assert_plan_matches(&plan, &m, &format!("{name} container"));
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
    }
}

/// The fixtures exercise what they are for: windows on alternate layers, YaRN, sinks, a limit
/// that binds, MXFP4 experts stored as blocks and scales.
#[test]
fn gptoss_fixtures_have_the_intended_structure() {
    let m = open_model_threads(&oracle("gpt_oss_f32").dir.join("model"), 1, 32);
    let c = m.config();
    assert_eq!(c.sliding_window, vec![Some(8), None, Some(8), None]);
    assert!(matches!(c.rope.scaling, waste::format::config::RopeScaling::Yarn { factor, truncate: false, .. } if factor == 4.0));
    let g = c.gpt_oss.expect("gpt-oss parameters");
    assert!(g.rope_attention_factor > 1.1 && g.swiglu_limit == 1.2);
    assert!(oracle("gpt_oss_f32").prompt.len() >= 24);
    let meta = read_json(&oracle("gpt_oss_mxfp4").dir.join("meta.json"));
    let tensors = meta.get("tensors").unwrap();
    assert!(tensors.get("model.layers.0.mlp.experts.gate_up_proj_blocks").is_some());
    assert!(tensors.get("model.layers.0.mlp.experts.gate_up_proj").is_none());
    let mx = open_model_threads(&oracle("gpt_oss_mxfp4").dir.join("model"), 1, 32);
    assert!(mx.info().dtypes.iter().any(|d| d == "U8"), "{:?}", mx.info().dtypes);
}

/// A NaN e8m0 scale (0xFF) is refused naming the tensor, the expert, the row and the block.
#[test]
fn gptoss_mxfp4_nan_scale_is_refused_by_name() {
    let o = oracle("gpt_oss_mxfp4");
    let dir = temp_dir("gptoss-nan-scale");
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(o.dir.join("model").join(f), dir.join(f)).unwrap();
    }
    let src = o.dir.join("model/model.safetensors");
    let st = waste::format::safetensors::SafeTensors::open(&src).unwrap();
    let t = st.get("model.layers.2.mlp.experts.down_proj_scales").unwrap().clone();
    let mut bytes = std::fs::read(&src).unwrap();
    // Expert 3, row 5 (one block a row: hidden 64 rows of 32 inputs).
    bytes[(t.offset + 3 * 64 + 5) as usize] = 0xFF;
    std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
    let e = Model::open(&dir, &Options::default()).err().expect("a NaN scale must be refused");
    let msg = e.to_string();
    assert!(msg.contains("model.layers.2.mlp.experts.down_proj_scales") && msg.contains("expert 3") && msg.contains("row 5")
        && msg.contains("block 0"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each feature moves these logits far past the tolerance: with the clamp lifted, the windows
/// removed, or plain RoPE instead of YaRN, the reference is missed — so matching it tests them.
#[test]
fn gptoss_fixture_features_each_matter() {
    let o = oracle("gpt_oss_f32");
    for (what, from, to) in [
        ("clamp lifted", r#""swiglu_limit": 1.2"#, r#""swiglu_limit": 100.0"#),
        ("no sliding window", r#""sliding_window": 8"#, r#""sliding_window": null"#),
        ("plain rope", r#""rope_type": "yarn""#, r#""rope_type": "default""#),
    ] {
        let dir = temp_dir(&format!("gptoss-contrast-{}", what.replace(' ', "-")));
        for f in ["generation_config.json", "model.safetensors"] {
            std::fs::copy(o.dir.join("model").join(f), dir.join(f)).unwrap();
        }
        let config = std::fs::read_to_string(o.dir.join("model/config.json")).unwrap();
        assert!(config.contains(from), "{what}: {from} not in config.json");
        std::fs::write(dir.join("config.json"), config.replace(from, to)).unwrap();
        let rel = rel_max_diff(&prompt_logits(&mut open_model_threads(&dir, 1, 32), &o.prompt, false), &o.logits);
        println!("gpt_oss_f32 with {what}: max|diff|/max|ref| = {rel:.3e}");
        assert!(rel > 100.0 * TOL, "{what}: {rel:.3e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `--experts mxfp4`: the source's codes and scales copied into 17-byte blocks (4.25 bits a
/// weight) and decoded inside the product. Within the tolerance of the reference, the same
/// bits whatever the cache size, threads or chunking; a float source or a trunk in mxfp4 is
/// refused by name.
#[test]
fn gptoss_native_mxfp4_experts_match_and_are_bit_stable() {
    use waste::tools::convert::{convert, ConvertOptions, Encoding};
    let o = oracle("gpt_oss_mxfp4");
    let out = temp_dir("gptoss-native-mxfp4").join("model.waste");
    let opts = ConvertOptions { trunk: Encoding::F32, experts: Encoding::Mxfp4, ..ConvertOptions::new(o.dir.join("model"), &out) };
    convert(&opts, &mut |_| {}).unwrap();
    let manifest = waste::format::container::Manifest::open(&out).unwrap();
    let layout = &manifest.banks[0].layout;
    assert!(layout.matrices.iter().all(|m| m.dtype.name() == "MXFP4" && m.bytes == m.rows * m.cols / 32 * 17), "{layout:?}");
    let base = prompt_logits(&mut open_model_threads(&out, 1, 32), &o.prompt, false);
    assert_close("gpt_oss_mxfp4", "native mxfp4 container logits", &base, &o.logits, TOL);
    let smallest = waste::cache::min_cache_bytes(&manifest);
    for (label, opts, single) in [
        ("2 threads", Options { threads: 2, ..Options::default() }, false),
        ("token at a time, smallest cache", Options { threads: 1, cache_bytes: smallest, io_threads: 2, ..Options::default() }, true),
        ("chunks of 5", Options { threads: 1, prefill_chunk: 5, ..Options::default() }, false),
    ] {
        assert!(bit_identical(&base, &prompt_logits(&mut open_model(&out, opts), &o.prompt, single)), "native mxfp4: {label}");
    }
    // The scalar kernels everywhere (the trunk's differ from the SIMD ones in summation order).
    let scalar = prompt_logits(&mut open_model(&out, Options { threads: 1, force_scalar: true, ..Options::default() }), &o.prompt, false);
    assert_close("gpt_oss_mxfp4", "native mxfp4 container logits, scalar kernels", &scalar, &o.logits, TOL);
    let mut m = open_model_threads(&out, 1, 32);
    assert_eq!(greedy(&mut m, &o.prompt, o.greedy.len()), o.greedy, "native mxfp4 greedy");
    let plan = waste::plan_memory(&out, &Options { threads: 1, ..Options::default() }).unwrap();
    assert_plan_matches(&plan, &open_model(&out, Options { threads: 1, ..Options::default() }), "native mxfp4 container");
    let _ = std::fs::remove_dir_all(out.parent().unwrap());

    let f32_src = oracle("gpt_oss_f32");
    let out = temp_dir("gptoss-native-mxfp4-refused").join("model.waste");
    let e = convert(&ConvertOptions { trunk: Encoding::F32, experts: Encoding::Mxfp4, ..ConvertOptions::new(f32_src.dir.join("model"), &out) },
        &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("model.layers.0.mlp.experts") && e.to_string().contains("stored as floats"), "{e}");
    let e = convert(&ConvertOptions { trunk: Encoding::Mxfp4, experts: Encoding::Mxfp4, ..ConvertOptions::new(o.dir.join("model"), &out) },
        &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("mxfp4"), "{e}");
    let _ = std::fs::remove_dir_all(out.parent().unwrap());
}

/// `waste convert` with its defaults (q4 trunk and experts, q8 embeddings, head and router)
/// and with a q8 trunk takes a gpt-oss checkpoint: the 2-D expert biases, which a quantized
/// file cannot hold as f32, go to an f32 trunk file of their own, and the containers run. The
/// q8 one stays near the reference (the tiny random model's q4 weights move its logits too far
/// for a bound: 0.48 of the largest logit).
#[test]
fn gptoss_converts_with_a_quantized_trunk() {
    use waste::tools::convert::{convert, ConvertOptions, Encoding};
    let o = oracle("gpt_oss_f32");
    let base = temp_dir("gptoss-quantized-convert");
    for (label, trunk) in [("q4", Encoding::Q4), ("q8", Encoding::Q8)] {
        let out = base.join(format!("{label}.waste"));
        convert(&ConvertOptions { trunk, experts: trunk, ..ConvertOptions::new(o.dir.join("model"), &out) }, &mut |_| {}).unwrap();
        let st = waste::format::safetensors::SafeTensors::open(&out.join("trunk-f32.safetensors")).unwrap();
        let names: Vec<&str> = st.tensors.iter().map(|t| t.name.as_str()).collect();
        assert!(!names.is_empty() && names.iter().all(|n| n.contains(".mlp.experts.") && n.ends_with("_bias")), "{names:?}");
        let got = prompt_logits(&mut open_model_threads(&out, 2, 32), &o.prompt, false);
        let rel = rel_max_diff(&got, &o.logits);
        println!("gpt_oss_f32, {label} container against the reference: {rel:.3e}");
        if trunk == Encoding::Q8 {
            assert!(rel < 0.05, "the q8 container is {rel} from the reference");
        }
    }
    let _ = std::fs::remove_dir_all(&base);
}
