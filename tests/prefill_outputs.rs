//! A prefill that asks only for the last position's logits computes the last layer's
//! attention output and FFN for that row alone (and for no row in an earlier chunk), while
//! still writing every row's keys and values. These tests hold it to the bits of the full
//! computation (`eval_each`, which needs every row) on every kind of mixer and FFN: the last
//! logits, and the next token's, which read the keys and values the shortened layer wrote.

use crate::common;
use common::*;
use waste::{Model, Options};

/// One fixture per mixer and FFN kind: dense attention, MoE, sliding windows, attention sinks,
/// MLA, gated attention with linear (GDN) layers, KDA.
const FAMILIES: &[&str] = &[
    "llama_f32", "qwen2_swa_f32", "qwen3_moe_f32", "mixtral_swa_f32", "gpt_oss_f32", "deepseek_v3_f32",
    "glm4_moe_f32", "qwen3_next_f32", "kimi_linear_f32",
];

fn open(o: &Oracle, chunk: usize) -> Model {
    Model::open(o.dir.join("model"), &Options { threads: 2, prefill_chunk: chunk, ..Options::default() }).unwrap()
}

/// Asserts that `a` and `b` hold the same bits, naming the first index where they differ.
fn assert_same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits()) {
        panic!("{what}: logit {i} is {} against {} in the full computation", a[i], b[i]);
    }
}

#[test]
fn last_logits_equal_the_full_computation() {
    for name in FAMILIES {
        let o = oracle(name);
        let next = o.greedy[0];
        // Chunks of 3: earlier chunks want no outputs, the last one a single row.
        for chunk in [3, 64] {
            let mut last_only = open(&o, chunk);
            let a = last_only.eval(&o.prompt).unwrap().to_vec();
            let a_next = last_only.eval(&[next]).unwrap().to_vec();

            let mut every_row = open(&o, chunk);
            let all = all_logits(&mut every_row, &o.prompt).unwrap();
            let b = &all[all.len() - a.len()..];
            let b_next = every_row.eval(&[next]).unwrap().to_vec();

            assert_same_bits(&a, b, &format!("{name}, chunk {chunk}: last prompt logits"));
            assert_same_bits(&a_next, &b_next, &format!("{name}, chunk {chunk}: the next token's logits"));
            assert_eq!(argmax(&a), next, "{name}, chunk {chunk}: greedy token");
        }
    }
}
