//! `Options::activations` end to end: the Qwen3 oracle fixture quantized at both widths runs
//! through `Model` with int8, int16 and int21 activations; its logits are bit-identical whatever
//! the thread count and prefill chunk, stay near the f32-activation logits, and the memory
//! plan counts the activation buffer.

use crate::common;

use common::*;
use waste::format::quant::Width;
use waste::tools::quantize::quantize_checkpoint;
use waste::{plan_memory, Activations, Model, Options};

fn logits(dir: &std::path::Path, prompt: &[u32], opts: &Options) -> Vec<f32> {
    let mut m = Model::open(dir, opts).unwrap();
    all_logits(&mut m, prompt).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Bit-identity across threads (1, 2, 3) and prefill chunks (1, 5, 32) — the activations of
/// each token are quantized on their own, before any parallel region — and nearness to the
/// f32-activation path. The nearness bounds are empirical, not proven: on these random 4-layer
/// fixtures the int8 path moves the largest logit difference to 1.7e-2 (Q4B32) and 2.2e-2
/// (Q8B32) of the largest logit (`docs/BENCHMARKS.md`, "Opt-in int8 activations"), the int16
/// path to about 1/256 of that (its rounding step is 258 times finer); the bounds leave room
/// for other instruction sets' f32 paths while still catching a broken path (a wrong scale or
/// lane layout moves logits by whole units).
#[test]
fn integer_activations_run_through_the_model_bit_identically() {
    let ids = read_json(&fixture("oracles/qwen3_f32/input_ids.json"));
    let prompt = ids_of(ids.get("prompt_ids").unwrap());
    let src = fixture("oracles/qwen3_f32/model");
    for width in [Width::Q8, Width::Q4] {
        let dir = temp_dir(&format!("integer-{}", width.bits()));
        let q = dir.join("q");
        quantize_checkpoint(&src, &q, width).unwrap();
        let base = Options { threads: 1, ctx: 64, activations: Activations::F32, ..Options::default() };
        let reference = logits(&q, &prompt, &base);
        assert_eq!(Model::open(&q, &base).unwrap().info().activation_kernels, None);
        for (path, bound) in [(Activations::Int8, 0.1), (Activations::Int16, 1e-3), (Activations::Int21, 2e-5)] {
            if path == Activations::Int21 && width == Width::Q8 {
                // int21 takes Q4B32 products only: a Q8B32 checkpoint comes out bit for bit.
                let same = logits(&q, &prompt, &Options { activations: path, ..base.clone() });
                assert_eq!(bits(&same), bits(&reference), "{width:?}: int21 touched a Q8B32 product");
                continue;
            }
            let on = Options { activations: path, ..base.clone() };
            let got = logits(&q, &prompt, &on);
            for (threads, chunk) in [(2, 32), (3, 5), (1, 1), (2, 1)] {
                let other = logits(&q, &prompt, &Options { threads, prefill_chunk: chunk, ..on.clone() });
                assert_eq!(bits(&other), bits(&got), "{width:?} {path:?}: {threads} threads, chunk {chunk} differ");
            }
            let rel = rel_max_diff(&got, &reference);
            println!("{width:?}: {} activations vs f32 activations: max |diff| / max |logit| = {rel:.2e}", path.name());
            assert!(rel > 0.0, "{width:?}: the {path:?} path changed nothing: is it on?");
            assert!(rel < bound, "{width:?}: the {path:?} path is {rel} from the f32 path");

            let m = Model::open(&q, &on).unwrap();
            assert_eq!(m.info().activations, path);
            assert!(m.info().activation_kernels.is_some());
            let plan = plan_memory(&q, &on).unwrap();
            assert_eq!(m.memory_used(), plan.resident_bytes(), "{width:?} {path:?}: the plan must count the activation buffer");
            assert!(plan.resident_bytes() > plan_memory(&q, &base).unwrap().resident_bytes());
        }
    }
}

/// The default (`Activations::Auto`): on AVX2 kernels, and on AVX-512 VNNI ones where the
/// kernels say so (`Kernels::int21_decodes_by_default`: Intel), the decode products with Q4B32
/// weights take int21 and prefill chunks keep the f32 GEMM, so a chunked prompt's logits are
/// the f32 path's bits and the same tokens one at a time are within int21's nearness of them
/// (and not the same bits: the path is on); elsewhere nothing changes. The plan counts the
/// decode buffer either way.
#[test]
fn the_default_decodes_q4b32_with_int21_where_the_kernels_say() {
    use waste::kernels::Isa;
    let ids = read_json(&fixture("oracles/qwen3_f32/input_ids.json"));
    let prompt = ids_of(ids.get("prompt_ids").unwrap());
    assert!(prompt.len() > waste::kernels::DECODE_VECTORS, "the prompt must be a prefill chunk");
    let dir = temp_dir("int21-auto");
    let q = dir.join("q");
    quantize_checkpoint(&fixture("oracles/qwen3_f32/model"), &q, Width::Q4).unwrap();
    for isa in [Isa::Avx2, Isa::Avx512] {
        if !isa.supported() {
            common::skip("the_default_decodes_q4b32_with_int21_where_the_kernels_say", &format!("this CPU has no {}", isa.name()));
            continue;
        }
        let int21 = waste::kernels::Kernels::with_isa(isa).is_some_and(|k| k.int21_decodes_by_default());
        assert!(int21 || isa != Isa::Avx2, "AVX2 kernels always decode Q4B32 with int21 by default");
        let f32 = Options { threads: 2, ctx: 64, isa: Some(isa), activations: Activations::F32, ..Options::default() };
        let auto = Options { activations: Activations::Auto, ..f32.clone() };
        assert_eq!(Options::default().activations, Activations::Auto);
        let mut m = Model::open(&q, &auto).unwrap();
        assert_eq!(m.info().activations, Activations::Auto);
        assert_eq!(m.info().activation_kernels.is_some(), int21, "{isa:?}");
        assert_eq!(m.memory_used(), plan_memory(&q, &auto).unwrap().resident_bytes(), "{isa:?}: the plan must count the decode buffer");
        let mut reference = Model::open(&q, &f32).unwrap();
        let (chunked, chunked_f32) = (all_logits(&mut m, &prompt).unwrap(), all_logits(&mut reference, &prompt).unwrap());
        assert_eq!(bits(&chunked), bits(&chunked_f32), "{isa:?}: a prefill chunk must keep the f32 GEMM");
        m.reset();
        reference.reset();
        let (single, single_f32) = (prompt_logits(&mut m, &prompt, true), prompt_logits(&mut reference, &prompt, true));
        let rel = rel_max_diff(&single, &single_f32);
        println!("{isa:?}: the default one token at a time vs f32: {rel:.2e}");
        if int21 {
            assert!(rel > 0.0 && rel < 2e-5, "{isa:?}: int21 decode is {rel} from f32");
        } else {
            assert_eq!(bits(&single), bits(&single_f32), "{isa:?}: the default changed a decode without int21");
        }
    }
}

/// `force_scalar` keeps working with the int8 path: the scalar twins run, and since the f32
/// kernels around them are the scalar ones too, the logits are those of the scalar reference
/// to within the int8 path's nearness (and bit-identical across threads).
#[test]
fn force_scalar_runs_the_int8_scalar_twins() {
    let ids = read_json(&fixture("oracles/qwen3_f32/input_ids.json"));
    let prompt = ids_of(ids.get("prompt_ids").unwrap());
    let dir = temp_dir("int8-scalar");
    let q = dir.join("q");
    quantize_checkpoint(&fixture("oracles/qwen3_f32/model"), &q, Width::Q4).unwrap();
    let opts = Options { threads: 1, ctx: 64, force_scalar: true, activations: Activations::Int8, ..Options::default() };
    let m = Model::open(&q, &opts).unwrap();
    assert_eq!((m.info().isa, m.info().activation_kernels), ("scalar", Some("scalar")));
    let one = logits(&q, &prompt, &opts);
    let two = logits(&q, &prompt, &Options { threads: 2, prefill_chunk: 7, ..opts.clone() });
    assert_eq!(bits(&one), bits(&two));
    let simd = logits(&q, &prompt, &Options { force_scalar: false, ..opts.clone() });
    let rel = rel_max_diff(&simd, &one);
    println!("scalar vs SIMD, int8 activations: {rel:.2e}");
    assert!(rel < 1e-4, "scalar and SIMD int8 paths differ by {rel}");
}

/// The CLI switches: `info --int8-act` (`--int16-act`) names the path's kernels, `bench
/// matmul` says which kernels Q8B32 and Q4B32 ran with, the two switches together are refused,
/// and `compare Q Q --int8-act` applies the path to the second model only (the first is the
/// f32-activation reference), so its logit difference is the int8 path's alone — zero
/// without the switch.
#[test]
fn the_activation_switches_reach_the_commands() {
    let dir = temp_dir("int8-cli");
    let q = dir.join("q");
    quantize_checkpoint(&fixture("oracles/qwen3_f32/model"), &q, Width::Q8).unwrap();
    let q = q.to_str().unwrap();
    for (switch, name) in [("--int8-act", "int8"), ("--int16-act", "int16"), ("--int21-act", "int21")] {
        let (status, out, err) = waste(&["info", q, switch]);
        assert_eq!(status, 0, "{err}");
        assert!(out.contains(&format!("{name} activations (")), "{out}");
        let (status, out, err) = waste(&["bench", "matmul", "--rows", "33", "--cols", "64", "--bytes", "64K", "--passes", "1", switch]);
        assert_eq!(status, 0, "{err}");
        assert!(out.contains(&format!("{name} activations")), "{out}");
    }
    let (status, _, err) = waste(&["info", q, "--int8-act", "--int16-act"]);
    assert_eq!(status, 2, "{err}");
    assert!(err.contains("give one"), "{err}");
    let max_of = |out: &str| -> f64 {
        let line = out.lines().find(|l| l.starts_with("COMPARE logits")).unwrap_or_else(|| panic!("no logits line in {out}"));
        line.split_whitespace().find_map(|f| f.strip_prefix("max=")).unwrap().parse().unwrap()
    };
    let ids = "1,23,57,105,167,243";
    let (_, plain, err) = waste(&["compare", q, q, "--ids", ids, "-n", "3", "--threads", "1"]);
    assert_eq!(max_of(&plain), 0.0, "{err}");
    let (_, int8, err) = waste(&["compare", q, q, "--ids", ids, "-n", "3", "--threads", "1", "--int8-act"]);
    assert!(max_of(&int8) > 0.0, "{int8}{err}");
}
