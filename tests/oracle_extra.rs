//! Variants without a shared oracle, against fixtures made by `tools/oracles/make_extra_oracles.py`
//! (transformers 5.24.0, CPU, f32, eager attention): Llama 3 frequency scaling with tied
//! embeddings, Qwen2 (q/k/v bias, tied), Qwen2-MoE (shared expert with sigmoid gate, a dense
//! `mlp_only_layers` layer, no top-k renormalisation) from its HF directory and from a float
//! container, and the Llama 3 model on a 300-token prompt, where RoPE angles are large.

mod common;
use common::*;
use waste::format::convert::{convert, ConvertOptions, Encoding};
use waste::{Model, Options};

/// f32 weights computed in f32 on both sides: only summation order differs.
const TOL: f32 = 2e-5;
const VARIANTS: [&str; 4] = ["llama3_f32", "qwen2_f32", "qwen2_moe_f32", "llama_longctx_f32"];

fn open(dir: &std::path::Path, threads: usize) -> Model {
    Model::open(dir, &Options { threads, prefill_chunk: 32, ..Options::default() }).unwrap()
}

/// Per-position max|diff| / max|ref| (the reference's scale, not the row's), so a failure says
/// where along the prompt the engine drifts.
fn worst_position(ours: &[f32], reference: &[f32], vocab: usize) -> (usize, f32) {
    let max_ref = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let mut worst = (0, 0.0f32);
    for (t, (a, b)) in ours.chunks_exact(vocab).zip(reference.chunks_exact(vocab)).enumerate() {
        let d = a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / max_ref;
        if d > worst.1 {
            worst = (t, d);
        }
    }
    worst
}

fn check_logits(name: &str, m: &mut Model, o: &Oracle) {
    let ours = prompt_logits(m, &o.prompt, false);
    assert_eq!(ours.len(), o.logits.len(), "{name}: logits length");
    let rel = rel_max_diff(&ours, &o.logits);
    let (t, at) = worst_position(&ours, &o.logits, m.info().vocab);
    println!("{name}: logits max|diff|/max|ref| = {rel:.3e} over {} positions (worst at {t}: {at:.3e})", o.prompt.len());
    assert!(rel <= TOL, "{name}: {rel:.3e} > {TOL:.0e}, worst at position {t}");
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
        let (shape, reference) = read_npy_f32(&o.dir.join("hidden_states.npy"));
        let (slots, t, h) = (shape[0], shape[1], shape[2]);
        assert_eq!(t, o.prompt.len(), "{name}: hidden_states positions");
        let ours = hidden_states(&mut open(&o.dir.join("model"), 1), &o.prompt).unwrap();
        assert_eq!(ours.len(), (slots + 1) * t * h, "{name}: hidden_states size");
        for s in 0..slots {
            let mine = if s + 1 == slots { slots } else { s };
            let rel = rel_max_diff(&ours[mine * t * h..(mine + 1) * t * h], &reference[s * t * h..(s + 1) * t * h]);
            assert!(rel <= TOL, "{name}: hidden state slot {s}: {rel:.3e}");
        }
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

/// Token-at-a-time decoding and two threads give the chunked single-thread logits bit for bit
/// on the new variants (bias add, shared expert, long positions included).
#[test]
fn extra_chunking_and_threads_are_bit_identical() {
    for name in VARIANTS {
        let o = oracle(name);
        let base = prompt_logits(&mut open(&o.dir.join("model"), 1), &o.prompt, false);
        for (threads, single) in [(2, false), (1, true)] {
            let other = prompt_logits(&mut open(&o.dir.join("model"), threads), &o.prompt, single);
            assert!(bit_identical(&base, &other), "{name}: threads {threads}, single {single}");
        }
    }
}
