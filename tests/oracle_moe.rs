//! Mixture-of-experts models against transformers 5.24.0: Mixtral (softmax → top-2 →
//! renormalise), Qwen3-MoE (`norm_topk_prob`, q/k norm, a dense `mlp_only_layers` layer) and
//! OLMoE (whole-projection q/k norm, no renormalisation), from their Hugging Face directories
//! with every expert resident.

mod common;
use common::*;
use waste::{Model, Options};

const TOL: f32 = 2e-5;
const FAMILIES: [&str; 3] = ["mixtral_f32", "qwen3_moe_f32", "olmoe_f32"];

fn open(o: &Oracle, threads: usize, chunk: usize) -> Model {
    Model::open(o.dir.join("model"), &Options { threads, prefill_chunk: chunk, ..Options::default() }).unwrap()
}

#[test]
fn moe_logits_match_the_reference() {
    for name in FAMILIES {
        let o = oracle(name);
        let all = prompt_logits(&mut open(&o, 1, 32), &o.prompt, false);
        let rel = rel_max_diff(&all, &o.logits);
        println!("{name}: logits max|diff|/max|ref| = {rel:.3e}");
        assert!(rel <= TOL, "{name}: {rel}");
    }
}

#[test]
fn moe_greedy_continuation_matches() {
    for name in FAMILIES {
        let o = oracle(name);
        assert_eq!(greedy(&mut open(&o, 2, 32), &o.prompt, o.greedy.len()), o.greedy, "{name}");
    }
}

/// Chunked prefill reads each expert once for all the chunk's tokens; the logits are the same
/// bits as token-at-a-time decoding and as any thread count.
#[test]
fn moe_chunking_and_threads_are_bit_identical() {
    for name in FAMILIES {
        let o = oracle(name);
        let base = prompt_logits(&mut open(&o, 1, 32), &o.prompt, false);
        for (threads, chunk, single) in [(2, 32, false), (1, 3, false), (2, 32, true)] {
            let other = prompt_logits(&mut open(&o, threads, chunk), &o.prompt, single);
            assert!(bit_identical(&base, &other), "{name}: threads {threads} chunk {chunk} single {single}");
        }
    }
}
