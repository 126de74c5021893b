//! The KDA kernel in isolation against `kda_golden.npz` (spec §4.6, the isolated kernel test):
//! fla's `naive_recurrent_kda` on random q, k, v, g, β from a zero state, 80 tokens, 2 heads of
//! 16 — the forget gate from its raw input, the L2 norms, the recurrence's outputs and its
//! final state.

use crate::common;
use crate::quant_util;
use common::*;
use quant_util::{f32s, parse_npy, read_stored_zip};
use waste::kernels::kda::{recurrence, KdaShape};
use waste::kernels::Pool;
use waste::model::kda::{forget_gate, l2norm_heads};

struct Golden(Vec<(String, Vec<u8>)>);

impl Golden {
    fn load() -> Golden {
        Golden(read_stored_zip(&std::fs::read(fixture("oracles/kda_golden.npz")).unwrap()))
    }
    fn get(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let raw = &self.0.iter().find(|(m, _)| m == &format!("{name}.npy")).unwrap_or_else(|| panic!("{name} missing")).1;
        let (descr, shape, data) = parse_npy(raw);
        assert_eq!(descr, "<f4", "{name}");
        (shape, f32s(&data))
    }
}

fn assert_close(what: &str, ours: &[f32], reference: &[f32], tol: f32) {
    let rel = rel_max_diff(ours, reference);
    println!("kda golden: {what}: max|diff|/max|ref| = {rel:.3e}");
    assert!(rel <= tol, "{what}: {rel:.3e} > {tol:.0e}");
}

#[test]
fn kda_kernel_matches_the_golden_recurrence() {
    let g = Golden::load();
    let (shape, q) = g.get("q");
    let (t, heads, d) = (shape[1], shape[2], shape[3]);
    assert_eq!((t, heads, d), (80, 2, 16));
    let (_, k) = g.get("k");
    let (_, v) = g.get("v");
    let (_, beta) = g.get("beta");

    // The forget gate from its raw input (fla's naive_kda_gate).
    let (_, mut gate) = g.get("g_raw");
    let (_, a_log) = g.get("A_log");
    let (_, dt_bias) = g.get("dt_bias");
    forget_gate(&mut gate, &dt_bias, &a_log, d);
    let (_, g_ref) = g.get("g");
    assert_close("forget gate", &gate, &g_ref, 1e-6);
    assert!(g_ref.iter().all(|&x| x <= 0.0), "a log decay is never positive");

    // L2 norms with ε inside the root.
    let (mut qn, mut kn) = (q.clone(), k.clone());
    l2norm_heads(&mut qn, d, None);
    l2norm_heads(&mut kn, d, None);
    let (_, q_l2) = g.get("q_l2");
    let (_, k_l2) = g.get("k_l2");
    assert_close("q l2norm", &qn, &q_l2, 1e-6);
    assert_close("k l2norm", &kn, &k_l2, 1e-6);

    // The recurrence on the golden gate, from a zero state; q scaled by D^-0.5 as in the layer.
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let q_scaled: Vec<f32> = q_l2.iter().map(|x| x * scale).collect();
    let (_, o_ref) = g.get("o");
    let (_, s_ref) = g.get("final_state");
    for threads in [1, 2] {
        let pool = Pool::new(threads).unwrap();
        let mut state = vec![0.0f32; heads * d * d];
        let mut out = vec![0.0f32; t * heads * d];
        let mut pred = vec![0.0f32; threads * d];
        recurrence(&pool, KdaShape { heads, head_dim: d }, &q_scaled, &k_l2, &v, &g_ref, &beta, t, &mut state, &mut out, &mut pred);
        assert_close(&format!("outputs ({threads} threads)"), &out, &o_ref, 1e-6);
        assert_close(&format!("final state ({threads} threads)"), &state, &s_ref, 1e-6);

        // The same tokens in pieces (7, then 1 at a time, then the rest) give the same bits.
        let mut st2 = vec![0.0f32; heads * d * d];
        let mut out2 = vec![0.0f32; t * heads * d];
        let w = heads * d;
        let mut at = 0;
        for len in [7usize, 1, 1, 1, t - 10] {
            recurrence(&pool, KdaShape { heads, head_dim: d }, &q_scaled[at * w..], &k_l2[at * w..], &v[at * w..], &g_ref[at * w..],
                &beta[at * heads..], len, &mut st2, &mut out2[at * w..], &mut pred);
            at += len;
        }
        assert!(bit_identical(&out, &out2) && bit_identical(&state, &st2), "chunking changed the bits ({threads} threads)");
    }
}
