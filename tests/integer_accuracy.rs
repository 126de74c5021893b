//! The integer-activation paths' logit error on every model family (issue 13: a default that
//! moves away from f32 activations states its error on every oracle family). Each family's
//! f32 fixture is converted twice — Q8B32 everywhere, and the conversion defaults (Q4B32 trunk
//! and experts, Q8B32 embeddings, head and routers) — and its prompt runs with f32, int16 and
//! int8 activations on the same weights. The error is max |logit difference| / max |logit|
//! against the f32-activation logits of the same container: the quantization of the weights is
//! common to all three and cancels.
//!
//! The int16 path must stay within 2e-3 of the largest logit (an empirical bound over the
//! largest measured, 7.8e-4 on Kimi Linear, whose recurrence carries errors along the
//! sequence; a broken path — a wrong scale, pair order or lane — is off by whole units). The
//! int8 path is held only to 1: on the MoE and recurrent fixtures its error changes which
//! experts tokens are routed to, and whole expert outputs differ (Kimi Linear Q4B32: 0.55).
//! The figures printed are those `docs/BENCHMARKS.md` quotes.

use crate::common;

use common::*;
use waste::tools::convert::{convert, ConvertOptions, Encoding};
use waste::{Activations, Options};

/// One fixture per family whose matrices can be stored as Q8B32/Q4B32 (columns a multiple of
/// 32), and whether its experts can too (Qwen3-Next's are 16 columns wide: they stay f32).
/// Qwen2-MoE has no such fixture (a 48-column shared expert) — docs/BENCHMARKS.md says so.
const FAMILIES: [(&str, bool); 12] = [
    ("llama3_f32", true), ("qwen2_f32", true), ("qwen3_f32", true), ("mixtral_f32", true), ("olmoe_f32", true),
    ("qwen3_moe_f32", true), ("deepseek_v2_lite_f32", true), ("deepseek_v3_plain_f32", true), ("glm4_moe_f32", true),
    ("kimi_linear_decode_f32", true), ("qwen3_next_f32", false), ("gpt_oss_f32", true),
];

/// The int21 path's bound: f32 paths of different summation orders differ by about this
/// much on these fixtures (the oracle tests' 2e-5 is against transformers, not each other).
const INT21_BOUND: f32 = 2e-5;

fn logits(dir: &std::path::Path, prompt: &[u32], activations: Activations) -> Vec<f32> {
    let mut m = open_model(dir, Options { threads: 2, activations, ..Options::default() });
    prompt_logits(&mut m, prompt, false)
}

#[test]
fn integer_activations_stay_near_f32_on_every_family() {
    let mut worst = [0.0f32; 3];
    for (name, experts_quantized) in FAMILIES {
        let o = oracle(name);
        let base = temp_dir(&format!("{name}-integer"));
        for (label, trunk) in [("q8", Encoding::Q8), ("q4", Encoding::Q4)] {
            let out = base.join(format!("{label}.waste"));
            let experts = if experts_quantized { trunk } else { Encoding::F32 };
            let opts = ConvertOptions { trunk, experts, ..ConvertOptions::new(o.dir.join("model"), &out) };
            convert(&opts, &mut |_| {}).unwrap_or_else(|e| panic!("{name} {label}: {e}"));
            let reference = logits(&out, &o.prompt, Activations::F32);
            let int16 = rel_max_diff(&logits(&out, &o.prompt, Activations::Int16), &reference);
            let int8 = rel_max_diff(&logits(&out, &o.prompt, Activations::Int8), &reference);
            let int21 = rel_max_diff(&logits(&out, &o.prompt, Activations::Int21), &reference);
            println!("{name:<22} {label}: int21 {int21:.2e}  int16 {int16:.2e}  int8 {int8:.2e}  (max |diff| / max |logit|, {} prompt tokens)", o.prompt.len());
            // int21 takes Q4B32 products only: the Q8B32 container must come out bit for bit.
            if label == "q8" {
                assert_eq!(int21, 0.0, "{name} q8: the int21 path touched a Q8B32 product");
            } else {
                assert!(int21 > 0.0, "{name} q4: the int21 path changed nothing: is it on?");
                assert!(int21 < INT21_BOUND, "{name} q4: int21 activations are {int21} from f32");
            }
            assert!(int16 > 0.0 && int8 > 0.0, "{name} {label}: an integer path changed nothing: is it on?");
            assert!(int16 < 2e-3, "{name} {label}: int16 activations are {int16} from f32");
            assert!(int8 < 1.0, "{name} {label}: int8 activations are {int8} from f32");
            worst = [worst[0].max(int16), worst[1].max(int8), worst[2].max(int21)];
        }
        let _ = std::fs::remove_dir_all(&base);
    }
    println!("largest: int21 {:.2e}, int16 {:.2e}, int8 {:.2e}", worst[2], worst[0], worst[1]);
}
