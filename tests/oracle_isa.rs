//! Every instruction set this CPU has, through whole models (`Options::isa`): the oracle
//! families within the reference tolerance on each, prefilled in chunks and fed one token at a
//! time, and quantized checkpoints within f32 rounding of the scalar reference. The other
//! oracle tests run the best kernels only, so without this an AVX-512 test machine would never
//! run the AVX2 kernels an AVX2-only laptop runs — its GEMM, attention and MoE paths — against
//! transformers.

use crate::common;

use common::*;
use waste::format::quant::Width;
use waste::kernels::Isa;
use waste::tools::quantize::quantize_checkpoint;
use waste::{ErrorKind, Model, Options};

/// The oracle tolerance (max |diff| / max |reference| of the logits), as in every oracle test.
const TOL: f32 = 2e-5;

/// One fixture per kernel shape the families need: dense GQA, BF16 weights, sliding windows,
/// MoE routers of several kinds, MLA, attention sinks with biases, and the two linear-attention
/// families.
const FAMILIES: &[&str] = &[
    "llama3_f32", "qwen3_bf16", "qwen2_swa_f32", "mixtral_swa_f32", "olmoe_f32", "qwen3_moe_f32", "deepseek_v3_f32",
    "glm4_moe_f32", "gpt_oss_f32", "kimi_linear_f32", "qwen3_next_f32",
];

/// The instruction sets this CPU can run, scalar first; a SKIP line when there is no SIMD one
/// (the test then checks the scalar kernels alone).
fn instruction_sets(test: &str) -> Vec<Isa> {
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.supported()).collect();
    if isas.len() < 2 {
        skip(test, "this CPU has no SIMD kernels: only the scalar ones are checked");
    }
    isas
}

fn options(isa: Isa) -> Options {
    Options { threads: 2, ctx: 256, prefill_chunk: 32, isa: Some(isa), ..Options::default() }
}

#[test]
fn every_instruction_set_matches_the_oracles() {
    let isas = instruction_sets("every_instruction_set_matches_the_oracles");
    for name in FAMILIES {
        let o = oracle(name);
        for &isa in &isas {
            let mut m = open_model(&o.dir.join("model"), options(isa));
            assert_eq!(m.info().isa, isa.name(), "{name}: the kernels the model reports");
            let vocab = m.info().vocab;
            let what = format!("{name} on {}", isa.name());
            let chunked = prompt_logits(&mut m, &o.prompt, false);
            assert_logits_close_at_every_position(&format!("{what}, chunks of 32"), &chunked, &o, vocab, TOL);
            m.reset();
            let one_by_one = prompt_logits(&mut m, &o.prompt, true);
            assert_logits_close_at_every_position(&format!("{what}, one token at a time"), &one_by_one, &o, vocab, TOL);
        }
    }
}

/// Q4B32 and Q8B32 checkpoints of a dense and an MoE family: on every instruction set the
/// logits of a chunked prefill and of a token-by-token feed are within f32 rounding of the
/// scalar reference's (the weights are the same numbers; only the order of the sums differs).
/// The integer paths are not compared here: their kernels equal their scalar twins bit for bit
/// (`tests/kernels_integer.rs`), but a 1e-7 difference in the f32 operations around them moves
/// an activation across a rounding boundary now and then, which an int8 block turns into a
/// 1/254 step (the MoE fixture's logits then part by up to 0.2 of the largest one, as int8's
/// own error against f32 does: docs/BENCHMARKS.md).
#[test]
fn every_instruction_set_runs_quantized_weights_like_the_scalar_reference() {
    let isas = instruction_sets("every_instruction_set_runs_quantized_weights_like_the_scalar_reference");
    let dir = temp_dir("oracle-isa");
    for name in ["llama3_f32", "qwen3_moe_f32"] {
        let o = oracle(name);
        for width in [Width::Q4, Width::Q8] {
            let q = dir.join(format!("{name}-{width:?}"));
            quantize_checkpoint(&o.dir.join("model"), &q, width).unwrap();
            let run = |isa: Isa, one_by_one: bool| prompt_logits(&mut open_model(&q, options(isa)), &o.prompt, one_by_one);
            for one_by_one in [false, true] {
                let reference = run(Isa::Scalar, one_by_one);
                assert_finite(name, &reference);
                for &isa in &isas[1..] {
                    let what = format!("{name} {width:?}, {} (one token at a time: {one_by_one})", isa.name());
                    let rel = rel_max_diff(&run(isa, one_by_one), &reference);
                    println!("{what}: {rel:.2e} from the scalar kernels");
                    assert!(rel <= TOL, "{what}: {rel:.3e} > {TOL:.0e}");
                }
            }
        }
    }
}

/// An instruction set the CPU lacks is refused with `Unsupported` when the model opens (and
/// when its memory is planned), and `force_scalar` with another one as contradictory; the
/// scalar one is `force_scalar`.
#[test]
fn an_instruction_set_the_cpu_lacks_is_refused() {
    let dir = oracle("llama3_f32").dir.join("model");
    if let Some(missing) = Isa::ALL.into_iter().find(|i| !i.supported()) {
        for e in [Model::open(&dir, &options(missing)).err(), waste::plan_memory(&dir, &options(missing)).err()] {
            let e = e.expect("an instruction set this CPU lacks must be refused");
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(e.to_string().contains(missing.name()), "{e}");
        }
    }
    let both = Options { force_scalar: true, ..options(Isa::ALL.into_iter().rev().find(|i| i.supported()).unwrap()) };
    if both.isa != Some(Isa::Scalar) {
        let e = Model::open(&dir, &both).err().expect("force_scalar with a SIMD instruction set must be refused");
        assert_eq!(e.kind(), ErrorKind::Arg, "{e}");
    }
    let scalar = open_model(&dir, Options { force_scalar: true, isa: Some(Isa::Scalar), ..options(Isa::Scalar) });
    assert_eq!(scalar.info().isa, "scalar");
}

/// The command line's `--isa` reaches the model (`bench` reports the kernels it ran), and a
/// name that is no instruction set is a usage error.
#[test]
fn the_isa_option_reaches_the_commands() {
    let dir = oracle("llama3_f32").dir.join("model");
    let dir = dir.to_str().unwrap();
    for isa in instruction_sets("the_isa_option_reaches_the_commands") {
        let (status, out, err) = waste(&["bench", dir, "--isa", isa.name(), "--prompt-tokens", "4", "-n", "2", "--json"]);
        assert_eq!(status, 0, "{err}");
        assert!(out.contains(&format!("\"isa\": \"{}\"", isa.name())), "{out}");
    }
    let (status, _, err) = waste(&["bench", dir, "--isa", "sse2", "-n", "1"]);
    assert_eq!(status, 2, "{err}");
    assert!(err.contains("`sse2` is not one of"), "{err}");
}

