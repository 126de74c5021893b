//! Mixture-of-experts models against transformers 5.24.0: Mixtral (softmax → top-2 →
//! renormalise), Qwen3-MoE (`norm_topk_prob`, q/k norm, a dense `mlp_only_layers` layer) and
//! OLMoE (whole-projection q/k norm, no renormalisation), from their Hugging Face directories
//! with every expert resident.

use crate::common;
use common::*;

const TOL: f32 = 2e-5;
const FAMILIES: [&str; 3] = ["mixtral_f32", "qwen3_moe_f32", "olmoe_f32"];

#[test]
fn moe_logits_match_the_reference() {
    for name in FAMILIES {
        let o = oracle(name);
        let all = prompt_logits(&mut open_model_threads(&o.dir.join("model"), 1, 32), &o.prompt, false);
        assert_close(name, "logits", &all, &o.logits, TOL);
    }
}

#[test]
fn moe_greedy_continuation_matches() {
    for name in FAMILIES {
        let o = oracle(name);
        assert_eq!(greedy(&mut open_model_threads(&o.dir.join("model"), 2, 32), &o.prompt, o.greedy.len()), o.greedy, "{name}");
    }
}

/// Chunked prefill reads each expert once for all the chunk's tokens; the logits are the same
/// bits as token-at-a-time decoding and as any thread count, and as a second run after `reset`.
#[test]
fn moe_chunking_and_threads_are_bit_identical() {
    for name in FAMILIES {
        let o = oracle(name);
        assert_chunking_threads_and_reset_bit_identical(name, &o.dir.join("model"), &o.prompt, &[(2, 32, false), (1, 3, false), (2, 32, true)]);
    }
}
