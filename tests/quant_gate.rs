//! The token gate of seed 000 and the quantized models end to end: checkpoints whose weights
//! are exact in the block format decode the same tokens as their float originals; quantized
//! fixtures run through `Model` and equal their dequantized float twins; sharded input,
//! side files, and the `quantize` / `compare` commands.

use crate::common;
use crate::quant_util;

use common::*;
use quant_util::*;
use std::path::Path;
use waste::format::dtype::DType;
use waste::format::quant::{self, Width};
use waste::tools::quantize::quantize_checkpoint;
use waste::format::safetensors::{SafeTensors, TensorSpec, Writer};
use waste::tools::compare::compare;
use waste::{Model, Options};

fn opts() -> Options {
    Options { threads: 1, ctx: 64, ..Options::default() }
}

const GATE_PROMPT: &[u32] = &[1, 17, 42, 99, 3, 200];

/// Seed 000, "The continuous integration does not need the download": a checkpoint with the
/// shape of a development model whose every block of 32 carries ±levels (scale exactly 1),
/// quantized by the tool's own code, decodes the same tokens as the float one with logits
/// within 1e-3 (the only difference left is the order of the f32 sums); with int16
/// activations the same tokens.
fn gate(name: &str, config: &str, width: Width, source: DType, norm: f32) {
    gate_with(name, config, width, source, norm, GATE_PROMPT);
}

/// [`gate`] with another prompt.
fn gate_with(name: &str, config: &str, width: Width, source: DType, norm: f32, prompt: &[u32]) {
    let dir = temp_dir(name);
    let float = dir.join("float");
    exact_checkpoint(&float, config, width.levels() as i32, norm, source, 11);
    let q = dir.join("quant");
    let rep = quantize_checkpoint(&float, &q, width).unwrap();
    assert_eq!(rep.width, width);
    let mut fm = Model::open(&float, &opts()).unwrap();
    let mut qm = Model::open(&q, &opts()).unwrap();
    // Every stored dtype is listed: the 2-D tensors' and the F32 norm vectors' (a BF16
    // checkpoint with F32 norms is both).
    let float_dtypes: Vec<&str> = if source == DType::F32 { vec!["F32"] } else { vec![source.name(), "F32"] };
    assert_eq!(fm.info().dtypes, float_dtypes);
    assert_eq!(qm.info().dtypes, [width.dtype().name(), "F32"]);
    let r = compare(&mut fm, &mut qm, prompt, 8).unwrap();
    for line in r.lines() {
        println!("{name}: {line}");
    }
    assert!(r.matches(), "{name}: tokens differ: {:?} vs {:?}", r.tokens_float, r.tokens_quant);
    assert!(r.max_diff < 1e-3 && r.prefill_max < 1e-3, "{name}: logits differ by {} (prefill {})", r.max_diff, r.prefill_max);
    assert_eq!((r.steps, r.values), (8, 8 * fm.config().vocab));
    // A gate that cannot fail is no gate: the decode must not be one token repeated.
    let mut distinct = r.tokens_float.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 1, "{name}: degenerate decode {:?}", r.tokens_float);
    // The int16-activation path decodes the same tokens, but its logits are 1.3e-3 to 2.6e-3
    // from the float model's on these gates — above the seed's 1e-3, which is why it is not
    // the default (issue 13: the default passes this gate). Held to 1e-2 here, and printed.
    let mut q16 = Model::open(&q, &Options { activations: waste::Activations::Int16, ..opts() }).unwrap();
    let r16 = compare(&mut fm, &mut q16, prompt, 8).unwrap();
    println!("{name}, int16 activations: {}", r16.lines()[2]);
    assert!(r16.matches(), "{name} int16: tokens differ: {:?} vs {:?}", r16.tokens_float, r16.tokens_quant);
    assert!(r16.max_diff < 1e-2 && r16.prefill_max < 1e-2, "{name} int16: logits differ by {} (prefill {})", r16.max_diff, r16.prefill_max);
    // The int21 path (Q4B32 products; Q8B32 ones stay f32) is held to the seed's gate itself.
    let mut q21 = Model::open(&q, &Options { activations: waste::Activations::Int21, ..opts() }).unwrap();
    let r21 = compare(&mut fm, &mut q21, prompt, 8).unwrap();
    println!("{name}, int21 activations: {}", r21.lines()[2]);
    assert!(r21.matches(), "{name} int21: tokens differ: {:?} vs {:?}", r21.tokens_float, r21.tokens_quant);
    assert!(r21.max_diff < 1e-3 && r21.prefill_max < 1e-3, "{name} int21: logits differ by {} (prefill {})", r21.max_diff, r21.prefill_max);
    if width == Width::Q4 {
        assert!(r21.max_diff != r.max_diff || r21.mean_diff != r.mean_diff, "{name}: the int21 path changed nothing: is it on?");
    }
}

#[test]
fn gate_q4b32_exact_weights_decode_like_float() {
    // SmolLM2's architecture at development size, tied embeddings (so the quantized embedding
    // matrix is also the LM head), weights stored F32.
    gate("gate-q4", SMOL_TINY, Width::Q4, DType::F32, 1.0 / 16.0);
}

/// The gate with a 40-token prompt: one prefill chunk whose Q4B32 products go to the AMX tiles
/// on a CPU that has them (inputs split into three bf16 parts, sums in another order), to the
/// AVX-512 or AVX2 GEMM elsewhere.
#[test]
fn gate_q4b32_holds_for_a_prompt_the_tiles_take() {
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37) % 250 + 1).collect();
    assert!(prompt.len() >= waste::kernels::TILE_MIN_VECTORS);
    println!("kernels: {}", waste::kernels::Kernels::select(false).isa().name());
    gate_with("gate-q4-long", SMOL_TINY, Width::Q4, DType::F32, 1.0 / 16.0, &prompt);
}

#[test]
fn gate_q8b32_exact_weights_decode_like_float() {
    // The 8-bit scale is max/127, so the exact weights of this width are integers in
    // −127..=127 with a ±127 per block. The shape is the Qwen3 oracle fixture's (untied head,
    // per-head q/k norm), weights stored BF16 (integers up to 127 are exact in BF16).
    let config = std::fs::read_to_string(fixture("oracles/qwen3_f32/model/config.json")).unwrap();
    gate("gate-q8", &config, Width::Q8, DType::BF16, 1.0 / 256.0);
}

/// Writes an F32 checkpoint holding the dequantized weights of the quantized checkpoint `q`.
fn dequantized_twin(q: &Path, out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    std::fs::copy(q.join("config.json"), out.join("config.json")).unwrap();
    let st = SafeTensors::open(&q.join("model.safetensors")).unwrap();
    let specs: Vec<TensorSpec> = st.tensors.iter()
        .map(|t| TensorSpec { name: t.name.clone(), dtype: DType::F32, shape: t.shape.clone() })
        .collect();
    let mut w = Writer::create(&out.join("model.safetensors"), &specs, &[]).unwrap();
    for t in &st.tensors {
        let mut raw = vec![0u8; t.len as usize];
        st.read_into(t, &mut raw).unwrap();
        let values: Vec<f32> = match Width::from_dtype(t.dtype) {
            Some(width) => {
                let rb = width.block_bytes() * t.shape[1] as usize / 32;
                raw.chunks_exact(rb).flat_map(|r| seed_dequant_row(r, width.bits())).map(|v| v as f32).collect()
            }
            None if t.dtype == DType::F32 => f32s(&raw),
            None => raw.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect(),
        };
        w.write(&values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    }
    w.finish().unwrap();
}

/// The Qwen3 oracle fixtures (every dimension a multiple of 32) quantized at both widths open
/// and run through `Model`; their logits equal those of an F32 checkpoint holding the same
/// dequantized weights (the kernels decode in place what the format says), and stay near the
/// float model's, Q8B32 much nearer than Q4B32. (Measured on these random fixtures: ~2.5e-2
/// and ~0.40 of the largest logit; random weights have no margins to keep, so no token
/// assertion is made here — that is the gate's job.)
#[test]
fn quantized_fixtures_run_through_the_model() {
    let ids = read_json(&fixture("oracles/qwen3_f32/input_ids.json"));
    let prompt = ids_of(ids.get("prompt_ids").unwrap());
    for fixture_name in ["qwen3_f32", "qwen3_bf16"] {
        let src = fixture(&format!("oracles/{fixture_name}/model"));
        // 1-D tensors keep their stored type (F16 would widen to F32).
        let norm_dtype = SafeTensors::open(&src.join("model.safetensors")).unwrap().get("model.norm.weight").unwrap().dtype;
        let mut float = Model::open(&src, &opts()).unwrap();
        let want = all_logits(&mut float, &prompt).unwrap();
        let mut errors = Vec::new();
        for (width, near) in [(Width::Q8, 0.06f32), (Width::Q4, 0.8)] {
            let dir = temp_dir(&format!("fixture-{fixture_name}-{}", width.bits()));
            let q = dir.join("q");
            quantize_checkpoint(&src, &q, width).unwrap();
            dequantized_twin(&q, &dir.join("twin"));
            for threads in [1, 2] {
                let mut qm = Model::open(&q, &Options { threads, ..opts() }).unwrap();
                let info = qm.info();
                assert_eq!(info.dtypes, [width.dtype().name(), norm_dtype.name()]);
                let got = all_logits(&mut qm, &prompt).unwrap();
                let mut twin = Model::open(dir.join("twin"), &Options { threads, ..opts() }).unwrap();
                let exact = all_logits(&mut twin, &prompt).unwrap();
                let to_twin = rel_max_diff(&got, &exact);
                let to_float = rel_max_diff(&got, &want);
                println!("{fixture_name} {width:?} x{threads}: vs dequantized twin {to_twin:.2e}, vs float {to_float:.2e}");
                assert!(to_twin < 2e-5, "{fixture_name} {width:?}: {to_twin} from the dequantized twin");
                assert!(to_float < near, "{fixture_name} {width:?}: {to_float} from the float model");
                assert!(to_float > 0.0, "{fixture_name} {width:?}: identical to float: was anything quantized?");
                errors.push(to_float);
            }
        }
        assert!(errors[0] * 4.0 < errors[2], "{fixture_name}: Q8 error {} is not well below Q4 error {}", errors[0], errors[2]);
    }
}

/// Sharding only changes where the source bytes are: a checkpoint split into two shards
/// quantizes to the same bytes as the single file, and the side files are copied verbatim.
#[test]
fn sharded_input_quantizes_to_the_same_bytes_and_side_files_are_copied() {
    let dir = temp_dir("sharded");
    let single = dir.join("single");
    exact_checkpoint(&single, SMOL_TINY, 5, 0.1, DType::BF16, 21);
    let st = SafeTensors::open(&single.join("model.safetensors")).unwrap();
    let sharded = dir.join("sharded");
    std::fs::create_dir_all(&sharded).unwrap();
    let half = st.tensors.len() / 2;
    let mut map = Vec::new();
    for (i, part) in [&st.tensors[..half], &st.tensors[half..]].into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let specs: Vec<TensorSpec> = part.iter().map(|t| TensorSpec { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone() }).collect();
        let mut w = Writer::create(&sharded.join(&file), &specs, &[]).unwrap();
        for t in part {
            let mut raw = vec![0u8; t.len as usize];
            st.read_into(t, &mut raw).unwrap();
            w.write(&raw).unwrap();
            map.push(format!("\"{}\": \"{file}\"", t.name));
        }
        w.finish().unwrap();
    }
    std::fs::write(sharded.join("model.safetensors.index.json"), format!("{{\"weight_map\": {{{}}}}}", map.join(", "))).unwrap();
    let sides = [("config.json", SMOL_TINY.as_bytes()), ("tokenizer.json", b"{\"model\": {}}".as_slice()),
        ("merges.txt", b"#version: 0.2\na b\n".as_slice()), ("generation_config.json", b"{}".as_slice())];
    for (name, bytes) in sides {
        std::fs::write(sharded.join(name), bytes).unwrap();
    }
    std::fs::write(sharded.join("README.md"), "not a model file").unwrap();
    for width in [Width::Q4, Width::Q8] {
        let a = quantize_checkpoint(&single, &dir.join(format!("a{}", width.bits())), width).unwrap();
        let b = quantize_checkpoint(&sharded, &dir.join(format!("b{}", width.bits())), width).unwrap();
        assert_eq!(std::fs::read(&a.model).unwrap(), std::fs::read(&b.model).unwrap(), "{width:?}");
        assert_eq!(a.digest, b.digest);
        assert_eq!((b.tensors, b.quantized, b.kept), (a.tensors, a.quantized, a.kept));
        assert_eq!(b.copied, ["config.json", "generation_config.json", "merges.txt", "tokenizer.json"]);
        let out = b.model.parent().unwrap();
        for (name, bytes) in sides {
            assert_eq!(std::fs::read(out.join(name)).unwrap(), bytes, "{name}");
        }
        assert!(!out.join("README.md").exists());
        // The quantized file declares its width and every scale is valid.
        let st = SafeTensors::open(&b.model).unwrap();
        assert_eq!(st.metadata("format"), Some(width.format_name()));
        assert_eq!((st.metadata("block"), st.metadata("scale")), (Some("32"), Some("f16")));
        assert_eq!(quant::validate(&st).unwrap(), Some(width));
    }
}

/// Counts of the SmolLM2 shape agree with the seed's run (211 quantized, 61 kept of 272):
/// every 2-D tensor, the tied embeddings included, is quantized; the norms are kept.
#[test]
fn smollm2_shape_counts_match_the_seed() {
    let cfg = waste::tools::random::preset("smollm2-135m").unwrap().to_string_compact();
    let shapes = shapes(&cfg);
    let two_d = shapes.iter().filter(|(_, s)| s.len() == 2).count();
    assert_eq!((shapes.len(), two_d, shapes.len() - two_d), (272, 211, 61));
}

// ---- The commands ----------------------------------------------------------------------

#[test]
fn quantize_and_compare_commands_print_the_seed_lines() {
    let dir = temp_dir("cli");
    let float = dir.join("float");
    exact_checkpoint(&float, SMOL_TINY, 7, 1.0 / 16.0, DType::F32, 5);
    let q = dir.join("q4");
    let (code, out, err) = waste(&["quantize", "--in", float.to_str().unwrap(), "--out", q.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let file = q.join("model.safetensors");
    let bytes = std::fs::metadata(&file).unwrap().len();
    let source = std::fs::metadata(float.join("model.safetensors")).unwrap().len();
    assert_eq!(lines[0], format!(
        "QUANT model={} bytes={bytes} source_bytes={source} tensors=20 quantized=15 kept=5 bits=4 block=32 scale=f16",
        file.display()));
    let digest = waste::format::sha256::hex(&waste::format::sha256::digest_file(&file).unwrap());
    assert_eq!(lines[1], format!("QUANT ratio={:.3} digest={digest}", bytes as f64 / source as f64));
    match std::process::Command::new("sha256sum").arg(&file).output() {
        Ok(o) if o.status.success() => {
            assert!(String::from_utf8_lossy(&o.stdout).starts_with(&digest), "sha256sum disagrees");
        }
        _ => skip("quantize_and_compare_commands_print_the_seed_lines", "no sha256sum to cross-check the digest"),
    }

    let (code, out, err) = waste(&["compare", float.to_str().unwrap(), q.to_str().unwrap(), "--ids", "1,17,42,99", "-n", "6", "--threads", "1"]);
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert!(lines[0].starts_with("COMPARE tokens_float ") && lines[0].split(' ').count() == 8, "{out}");
    assert_eq!(lines[0].replace("tokens_float", "tokens_quant"), lines[1]);
    assert!(lines[2].starts_with("COMPARE logits steps=6 values=1536 max="), "{out}");
    assert!(lines[3].starts_with("COMPARE prefill max="), "{out}");
    assert!(lines[4].starts_with("COMPARE result match=true tokens=6 max_diff="), "{out}");
    assert_eq!(lines[5], "COMPARE OK");

    // A different model decodes different tokens: the command says so and exits non-zero.
    let other = dir.join("other");
    exact_checkpoint(&other, SMOL_TINY, 7, 1.0 / 16.0, DType::F32, 6);
    let (code, out, err) = waste(&["compare", float.to_str().unwrap(), other.to_str().unwrap(), "--ids", "1,17,42,99", "--threads", "1"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("COMPARE result match=false") && out.contains("COMPARE FAIL step="), "{out}");
    assert!(err.contains("different token"), "{err}");

    // Usage errors: a width that does not exist, a missing directory argument.
    let (code, _, err) = waste(&["quantize", "--bits", "5", "--in", "x", "--out", "y"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--bits"), "{err}");
    let (code, _, _) = waste(&["compare", float.to_str().unwrap()]);
    assert_eq!(code, 2);
    // The float side must be the float model.
    let (code, out, err) = waste(&["compare", q.to_str().unwrap(), float.to_str().unwrap(), "--ids", "1,17", "--threads", "1"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(err.contains("quantized") && err.contains("Q4B32"), "{err}");
    // NaN logits on both sides "agree" on every token (argmax skips NaN): still a failure.
    let nan = dir.join("nan");
    exact_checkpoint(&nan, SMOL_TINY, 7, f32::NAN, DType::F32, 5);
    let nan_q = dir.join("nan-q4");
    let (code, _, err) = waste(&["quantize", "--in", nan.to_str().unwrap(), "--out", nan_q.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = waste(&["compare", nan.to_str().unwrap(), nan_q.to_str().unwrap(), "--ids", "1,17", "-n", "3", "--threads", "1"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("COMPARE result match=true") && out.contains("COMPARE FAIL non_finite float=768 quant=1536"), "{out}");
    assert!(!out.contains("COMPARE OK"), "{out}");
    assert!(err.contains("non-finite logits"), "{err}");
    // The ragged model: a runtime error naming the tensor.
    let (code, _, err) = waste(&["quantize", "--in", root().join("models/stories260K").to_str().unwrap(), "--out", dir.join("r").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("model.layers.0.mlp.down_proj.weight"), "{err}");
}

/// The container converter encodes its quantized trunk files and expert records with the same
/// codec: a Qwen3-MoE fixture (every dimension a multiple of 32) converted at q8 and at the
/// default q4/q8 mix opens (so every trunk file passed the reader's rules) and stays near
/// the float model, q8 nearer than q4.
#[test]
fn quantized_containers_run_through_the_model() {
    use waste::tools::convert::{convert, ConvertOptions, Encoding};
    let dir = fixture("oracles/qwen3_moe_f32");
    let prompt = ids_of(read_json(&dir.join("input_ids.json")).get("prompt_ids").unwrap());
    let want = all_logits(&mut Model::open(dir.join("model"), &opts()).unwrap(), &prompt).unwrap();
    let mut errors = Vec::new();
    for (tag, trunk, experts, near) in [("q8", Encoding::Q8, Encoding::Q8, 0.06f32), ("q4", Encoding::Q4, Encoding::Q4, 0.8)] {
        let out = temp_dir(&format!("container-{tag}")).join("model.waste");
        let o = ConvertOptions { trunk, experts, ..ConvertOptions::new(dir.join("model"), &out) };
        convert(&o, &mut |_| {}).unwrap();
        let mut m = Model::open(&out, &opts()).unwrap();
        let got = all_logits(&mut m, &prompt).unwrap();
        let rel = rel_max_diff(&got, &want);
        println!("qwen3_moe_f32 container {tag}: logits vs float {rel:.2e}");
        assert!(rel > 0.0 && rel < near, "{tag}: {rel}");
        errors.push(rel);
    }
    assert!(errors[0] * 4.0 < errors[1], "q8 {} is not well below q4 {}", errors[0], errors[1]);
}
