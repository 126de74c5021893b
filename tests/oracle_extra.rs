//! Variants without a shared oracle, against fixtures made by `tools/oracles/make_extra_oracles.py`
//! (transformers 5.24.0, CPU, f32, eager attention): Llama 3 frequency scaling with tied
//! embeddings, Qwen2 (q/k/v bias, tied), Qwen2-MoE (shared expert with sigmoid gate, a dense
//! `mlp_only_layers` layer, no top-k renormalisation) from its HF directory and from a float
//! container, and the Llama 3 model on a 300-token prompt, where RoPE angles are large.

use crate::common;
use common::*;
use waste::tools::convert::{convert, ConvertOptions, Encoding};
use waste::Model;

/// f32 weights computed in f32 on both sides: only summation order differs.
const TOL: f32 = 2e-5;
const VARIANTS: [&str; 4] = ["llama3_f32", "qwen2_f32", "qwen2_moe_f32", "llama_longctx_f32"];

fn open(dir: &std::path::Path, threads: usize) -> Model {
    open_model_threads(dir, threads, 32)
}

/// The prompt's logits on `m` within TOL of the reference at every position (the worst named,
/// so a failure says where along the prompt the engine drifts).
fn check_logits(name: &str, m: &mut Model, o: &Oracle) {
    let ours = prompt_logits(m, &o.prompt, false);
    assert_logits_close_at_every_position(name, &ours, o, m.info().vocab, TOL);
}

#[test]
fn extra_logits_match_the_reference_at_every_position() {
    for name in VARIANTS {
        let o = oracle(name);
        check_logits(name, &mut open(&o.dir.join("model"), 1), &o);
    }
}

#[test]
fn extra_greedy_continuation_matches() {
    for name in VARIANTS {
        let o = oracle(name);
        let got = greedy(&mut open(&o.dir.join("model"), 2), &o.prompt, o.greedy.len());
        assert_eq!(got, o.greedy, "{name}");
    }
}

/// Every reference layer output, so a divergence is located by layer. Reference slots are the
/// embeddings, layers 0..L-2, then layer L-1 with the final norm applied; ours has L+2 slots
/// (embeddings, every layer, final normed state).
#[test]
fn extra_hidden_states_match_layer_by_layer() {
    for name in VARIANTS {
        let o = oracle(name);
        assert_hidden_states_close(name, &mut open(&o.dir.join("model"), 1), &o, TOL);
    }
}

/// The tied fixtures really are tied (no `lm_head.weight` in the file), so the engine's head is
/// the embedding matrix; Qwen2-MoE is untied. Guards the fixtures against silent regeneration.
#[test]
fn extra_fixtures_have_the_intended_structure() {
    for (name, tied) in [("llama3_f32", true), ("qwen2_f32", true), ("qwen2_moe_f32", false), ("llama_longctx_f32", true)] {
        let o = oracle(name);
        let meta = read_json(&o.dir.join("meta.json"));
        let tensors = meta.get("tensors").unwrap();
        assert_eq!(tensors.get("lm_head.weight").is_none(), tied, "{name}: lm_head.weight presence");
        assert_eq!(meta.get("transformers").unwrap().as_str(), Some("5.24.0"), "{name}");
        let m = open(&o.dir.join("model"), 1);
        assert_eq!(m.config().tie_embeddings, tied, "{name}");
    }
    let moe = open(&oracle("qwen2_moe_f32").dir.join("model"), 1);
    let cfg = moe.config();
    let moe_cfg = cfg.moe.as_ref().unwrap();
    assert_eq!((moe_cfg.experts, moe_cfg.top_k, moe_cfg.shared_intermediate), (4, 2, 48));
    assert_eq!(moe_cfg.moe_layers, vec![true, false, true, true]);
    assert_eq!(oracle("llama_longctx_f32").prompt.len(), 300);
}

/// A float container of the Qwen2-MoE model (experts streamed from the container's bank) gives
/// the reference logits and continuation too, and — f32 in, f32 stored — the same bits as the
/// HF directory.
#[test]
fn qwen2_moe_f32_container_matches_the_reference() {
    let o = oracle("qwen2_moe_f32");
    let out = temp_dir("qwen2-moe-f32-container");
    let opts = ConvertOptions { trunk: Encoding::F32, experts: Encoding::F32, ..ConvertOptions::new(o.dir.join("model"), &out) };
    convert(&opts, &mut |_| {}).unwrap();
    let mut container = open(&out, 1);
    assert!(container.cache_stats().is_some(), "the container's experts should stream through the cache");
    check_logits("qwen2_moe_f32 (container)", &mut container, &o);
    container.reset();
    assert_eq!(greedy(&mut container, &o.prompt, o.greedy.len()), o.greedy, "container greedy");
    container.reset();
    let from_container = prompt_logits(&mut container, &o.prompt, false);
    let from_dir = prompt_logits(&mut open(&o.dir.join("model"), 1), &o.prompt, false);
    assert!(bit_identical(&from_container, &from_dir), "f32 container and HF directory differ");
    let _ = std::fs::remove_dir_all(&out);
}

/// Token-at-a-time decoding, two threads and a second run after `reset` give the chunked
/// single-thread logits bit for bit on the new variants (bias add, shared expert, long
/// positions included).
#[test]
fn extra_chunking_and_threads_are_bit_identical() {
    for name in VARIANTS {
        let o = oracle(name);
        assert_chunking_threads_and_reset_bit_identical(name, &o.dir.join("model"), &o.prompt, &[(2, 32, false), (1, 32, true)]);
    }
}

// ---------------------------------------------------------------------------------------------
// Features no other fixture exercised: OLMoE's clip_qkv, MoE layers interleaved with dense ones
// by `decoder_sparse_step` (Qwen3-MoE with `mlp_only_layers` and renormalised top-k, Qwen2-MoE
// with its shared expert and raw top-k), and sliding-window attention (Mixtral and Qwen3-MoE on
// every layer, Qwen2 from `max_window_layers` on, Qwen2-MoE on its even layers below it from a
// config without `layer_types`), each from its HF directory and from an f32 container.

/// Each fixture's meta.json `contrast` (the same weights with its feature switched off) is at
/// least 50 × TOL from its reference (checked below), so an engine that ignored the feature
/// could not pass.
const FEATURE_VARIANTS: [&str; 7] = ["olmoe_clip_f32", "qwen3_moe_sparse_f32", "qwen2_moe_sparse_f32", "mixtral_swa_f32",
    "qwen2_swa_f32", "qwen3_moe_swa_f32", "qwen2_moe_swa_f32"];

/// Logits of every position (finite, within TOL), every layer's hidden state, and the greedy
/// continuation, from the HF directory.
#[test]
fn feature_variants_match_the_reference_from_the_hf_directory() {
    for name in FEATURE_VARIANTS {
        let o = oracle(name);
        assert_finite(&format!("{name}: reference logits"), &o.logits);
        let mut m = open(&o.dir.join("model"), 1);
        check_logits(name, &mut m, &o);
        assert_hidden_states_close(name, &mut m, &o, TOL);

        let got = greedy(&mut open(&o.dir.join("model"), 2), &o.prompt, o.greedy.len());
        assert_eq!(got, o.greedy, "{name}: greedy continuation");
    }
}

/// An f32 container of each variant (trunk, embeddings, routers and experts all f32; a MoE
/// model's experts stream through the cache) gives the reference logits and continuation, and
/// the same bits as the HF directory: the converted config keeps clip_qkv, the windows and the
/// layer schedule.
#[test]
fn feature_variants_match_the_reference_from_a_float_container() {
    for name in FEATURE_VARIANTS {
        let o = oracle(name);
        let out = temp_dir(&format!("{name}-container"));
        let opts = ConvertOptions { trunk: Encoding::F32, experts: Encoding::F32, ..ConvertOptions::new(o.dir.join("model"), &out) };
        convert(&opts, &mut |_| {}).unwrap();
        let mut container = open(&out, 1);
        let from_dir = open(&o.dir.join("model"), 1);
        assert_eq!(container.config(), from_dir.config(), "{name}: the container's config");
        assert_eq!(container.cache_stats().is_some(), from_dir.config().moe.is_some(),
            "{name}: experts should stream through the cache exactly when the model has them");
        let from_container = prompt_logits(&mut container, &o.prompt, false);
        assert_finite(&format!("{name}: container logits"), &from_container);
        container.reset();
        check_logits(&format!("{name} (container)"), &mut container, &o);
        container.reset();
        assert_eq!(greedy(&mut container, &o.prompt, o.greedy.len()), o.greedy, "{name}: container greedy");
        let from_dir = prompt_logits(&mut open(&o.dir.join("model"), 1), &o.prompt, false);
        assert!(bit_identical(&from_container, &from_dir), "{name}: f32 container and HF directory differ");
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// Token-at-a-time decoding, two threads and a prefill chunk (5) that does not divide the
/// window (8), so chunks straddle the window's edge, all give the default run's bits; so does
/// a second run after `reset`.
#[test]
fn feature_variants_chunking_and_threads_are_bit_identical() {
    for name in FEATURE_VARIANTS {
        let o = oracle(name);
        let runs = [(2, 32, false), (1, 32, true), (1, 5, false), (2, 5, false)];
        assert_chunking_threads_and_reset_bit_identical(name, &o.dir.join("model"), &o.prompt, &runs);
    }
}

/// The engine reads the structure transformers built (meta.json `layers`: each HF layer's FFN
/// kind and attention window), and each fixture exercises its feature: its contrast is far above
/// the tolerance, and a window changes nothing before position W (up to f32 noise: with MoE,
/// later tokens change the shape of the expert batches).
#[test]
fn feature_variants_have_the_intended_structure() {
    for name in FEATURE_VARIANTS {
        let o = oracle(name);
        let meta = read_json(&o.dir.join("meta.json"));
        assert_eq!(meta.get("transformers").unwrap().as_str(), Some("5.24.0"), "{name}");
        let m = open(&o.dir.join("model"), 1);
        let cfg = m.config();
        let layers = meta.get("layers").unwrap().as_array().unwrap();
        assert_eq!(layers.len(), cfg.layers, "{name}: layer count");
        for (l, layer) in layers.iter().enumerate() {
            let hf_moe = layer.get("ffn").unwrap().as_str() == Some("moe");
            assert_eq!(cfg.is_moe_layer(l), hf_moe, "{name}: layer {l} FFN kind");
            let hf_window = layer.get("sliding_window").unwrap().as_u64().map(|w| w as usize);
            assert_eq!(cfg.sliding_window[l], hf_window, "{name}: layer {l} window");
        }
        let contrast = meta.get("contrast").unwrap();
        let margin = contrast.get("logits_rel_diff").unwrap().as_f64().unwrap();
        assert!(margin >= 50.0 * TOL as f64, "{name}: contrast {margin:.3e} is too close to the tolerance");
        if let Some(before) = contrast.get("rel_diff_before_window").and_then(|v| v.as_f64()) {
            assert!(before < 1e-6, "{name}: the window changed a position before it: {before:.3e}");
            let after = contrast.get("rel_diff_from_window_on").unwrap().as_f64().unwrap();
            assert!(after >= 50.0 * TOL as f64, "{name}: the window hardly matters: {after:.3e}");
            assert!(o.prompt.len() >= 3 * 8, "{name}: the prompt should span several windows");
        }
    }
    let renorm = |name: &str| {
        let m = open(&oracle(name).dir.join("model"), 1);
        let moe = m.config().moe.clone().unwrap();
        let waste::format::config::Routing::SoftmaxTopK { renormalize } = moe.routing else { panic!("{name}: softmax top-k routing") };
        (moe.experts, moe.top_k, renormalize, moe.shared_intermediate, moe.moe_layers)
    };
    assert_eq!(renorm("qwen3_moe_sparse_f32"), (8, 2, true, 0, vec![false, true, false, false, false, true]));
    assert_eq!(renorm("qwen2_moe_sparse_f32"), (8, 3, false, 48, vec![false, true, false, true]));
    assert!(!renorm("olmoe_clip_f32").2, "OLMoE keeps the raw top-k probabilities");
    let olmoe = open(&oracle("olmoe_clip_f32").dir.join("model"), 1);
    assert_eq!(olmoe.config().clip_qkv, Some(0.5));
    assert_eq!(olmoe.config().kv_heads, 2, "GQA, so the whole-k norm spans kv_dim, not hidden");
    let clipped = read_json(&oracle("olmoe_clip_f32").dir.join("meta.json"));
    for layer in clipped.get("clipped_fraction").unwrap().get("per_layer").unwrap().as_array().unwrap() {
        for t in ["q", "k", "v"] {
            let share = layer.get(t).unwrap().as_f64().unwrap();
            assert!(share > 0.05 && share < 0.95, "the clamp should change some entries and leave others: {t} {share}");
        }
    }
    assert_eq!(open(&oracle("mixtral_swa_f32").dir.join("model"), 1).config().sliding_window, vec![Some(8); 4]);
    assert_eq!(open(&oracle("qwen2_swa_f32").dir.join("model"), 1).config().sliding_window, vec![None, None, Some(8), Some(8)]);
    // max_window_layers 2 is in this config.json, and transformers ignores it for Qwen3-MoE.
    assert_eq!(open(&oracle("qwen3_moe_swa_f32").dir.join("model"), 1).config().sliding_window, vec![Some(8); 4]);
    // A transformers-4-style config: no layer_types for the engine to read.
    let o = oracle("qwen2_moe_swa_f32");
    let saved = read_json(&o.dir.join("model/config.json"));
    assert!(saved.get("layer_types").is_none() && saved.get("max_window_layers").and_then(|v| v.as_u64()) == Some(3));
    assert_eq!(open(&o.dir.join("model"), 1).config().sliding_window, vec![Some(8), None, Some(8), None]);
}

/// The comparison helpers themselves: NaN and infinities fail instead of vanishing in a
/// `f32::max` fold (an all-NaN output used to pass every oracle test).
#[test]
#[should_panic(expected = "non-finite")]
fn an_all_nan_output_fails_rel_max_diff() {
    rel_max_diff(&[f32::NAN; 8], &[1.0; 8]);
}

#[test]
#[should_panic(expected = "non-finite")]
fn a_nan_row_fails_position_errors() {
    let mut ours = vec![0.5f32; 8];
    ours[5] = f32::NAN;
    position_errors(&ours, &[0.5; 8], 4);
}

#[test]
#[should_panic(expected = "non-finite")]
fn an_infinite_logit_fails_argmax() {
    argmax(&[0.0, f32::INFINITY, 1.0]);
}
