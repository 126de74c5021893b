//! The Q4B32/Q8B32 format (seed 000) byte for byte: the products the engine's kernels compute
//! from blocks, the bytes the quantizer writes against the seed's formula and against GGML's
//! Q8_0, and every refusal of the reader with the tensor, field, row and block it names.

use crate::common;
use crate::quant_util;

use common::*;
use quant_util::*;
use waste::format::dtype::DType;
use waste::format::quant::{self, Width};
use waste::tools::quantize::quantize_checkpoint;
use waste::format::safetensors::SafeTensors;
use waste::kernels::{Kernels, MatRef, Pool};

// ---- Products --------------------------------------------------------------------------

/// y = W·x through the engine's kernels (scalar reference and the selected ones, 1 and 2
/// threads) against Σ dequant(W)·x in f64. The bound is the classic one for f32 summation in
/// any order: cols × ε × Σ|w·x| (summation order may differ between kernels).
fn check_product(width: Width, w: &[f32], rows: usize, cols: usize) {
    let bb = width.block_bytes();
    let mut bytes = vec![0u8; rows * cols / 32 * bb];
    for (r, out) in bytes.chunks_exact_mut(cols / 32 * bb).enumerate() {
        quant::encode_row(width, &w[r * cols..(r + 1) * cols], out).unwrap();
    }
    let n = 3;
    let mut rng = Rng(77);
    let x: Vec<f32> = (0..n * cols).map(|_| rng.normal(1.0)).collect();
    let deq: Vec<Vec<f64>> = bytes.chunks_exact(cols / 32 * bb).map(|r| seed_dequant_row(r, width.bits())).collect();
    let m = MatRef { dtype: width.dtype(), rows, cols, data: &bytes };
    for (label, k) in [("scalar", Kernels::scalar()), ("selected", Kernels::select(false))] {
        for threads in [1, 2] {
            let pool = Pool::new(threads).unwrap();
            let mut y = vec![0.0f32; n * rows];
            k.matmul(&pool, m, &x, n, &mut y);
            for t in 0..n {
                for r in 0..rows {
                    let xs = &x[t * cols..(t + 1) * cols];
                    let exact: f64 = deq[r].iter().zip(xs).map(|(a, b)| a * *b as f64).sum();
                    let mag: f64 = deq[r].iter().zip(xs).map(|(a, b)| (a * *b as f64).abs()).sum();
                    let got = y[t * rows + r] as f64;
                    let bound = cols as f64 * f32::EPSILON as f64 * mag;
                    assert!((got - exact).abs() <= bound,
                        "{width:?} {label} x{threads}: row {r} vector {t}: {got} vs {exact} (Σ|wx| {mag})");
                }
            }
        }
    }
}

#[test]
fn q8_product_matches_the_dequantized_matrix_in_f64() {
    let (rows, cols) = (67, 256);
    let mut rng = Rng(5);
    let w: Vec<f32> = (0..rows * cols).map(|i| rng.normal(0.02 * (1 + i / cols % 7) as f32)).collect();
    check_product(Width::Q8, &w, rows, cols);
}

#[test]
fn q4_product_matches_the_dequantized_matrix_in_f64() {
    let (rows, cols) = (67, 256);
    let mut rng = Rng(6);
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.normal(0.05)).collect();
    check_product(Width::Q4, &w, rows, cols);
}

#[test]
fn known_matrix_times_known_vector_is_exact_at_both_widths() {
    // W[r][c] = (((r + c) mod 15) − 7) / 8: 32 consecutive columns cover all 15 residues, so
    // every block holds a +7/8 and a −7/8, its Q4 scale is exactly 1/8 and every level exact.
    // x[c] = (c mod 5) − 2. The product is a small multiple of 1/8 that f32 holds exactly
    // whatever the summation order.
    let (rows, cols) = (15, 64);
    let w: Vec<f32> = (0..rows * cols).map(|i| (((i / cols) + (i % cols)) % 15) as f32 - 7.0).map(|v| v / 8.0).collect();
    let x: Vec<f32> = (0..cols).map(|c| (c % 5) as f32 - 2.0).collect();
    let mut bytes = vec![0u8; rows * 2 * 18];
    for (r, out) in bytes.chunks_exact_mut(36).enumerate() {
        quant::encode_row(Width::Q4, &w[r * cols..(r + 1) * cols], out).unwrap();
    }
    let pool = Pool::new(1).unwrap();
    let mut y = vec![0.0f32; rows];
    Kernels::select(false).matmul(&pool, MatRef { dtype: DType::Q4B32, rows, cols, data: &bytes }, &x, 1, &mut y);
    for r in 0..rows {
        let exact: f64 = (0..cols).map(|c| w[r * cols + c] as f64 * x[c] as f64).sum();
        assert_eq!(y[r] as f64, exact, "row {r}");
    }
}

// ---- Bytes -----------------------------------------------------------------------------

/// Random F32 matrices (several scales, a zero block, a block too small for a binary16 scale)
/// through the quantizer; every byte must be the seed's formula computed here independently.
#[test]
fn quantizer_bytes_equal_the_seed_formula_for_random_f32_matrices() {
    let dir = temp_dir("seed-formula");
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut rng = Rng(2024);
    let mut ts = Vec::new();
    for (i, (rows, cols, sd)) in [(16usize, 96usize, 0.02f32), (7, 32, 3.0), (5, 160, 1e-3), (3, 64, 200.0)].into_iter().enumerate() {
        let mut v: Vec<f32> = (0..rows * cols).map(|_| rng.normal(sd)).collect();
        if i == 0 {
            v[..32].fill(0.0); // an all-zero block
            v[32..64].fill(1e-12); // a scale that underflows binary16
        }
        ts.push(T { name: format!("m{i}.weight"), dtype: DType::F32, shape: vec![rows as u64, cols as u64], values: v });
    }
    ts.push(T { name: "norm.weight".into(), dtype: DType::F32, shape: vec![96], values: vec![1.5; 96] });
    write_tensors(&src.join("model.safetensors"), &ts, &[]);
    for width in [Width::Q8, Width::Q4] {
        let out = dir.join(format!("q{}", width.bits()));
        let rep = quantize_checkpoint(&src, &out, width).unwrap();
        assert_eq!((rep.tensors, rep.quantized, rep.kept), (5, 4, 1));
        let file = out.join("model.safetensors");
        for t in &ts[..4] {
            let got = tensor_bytes(&file, &t.name);
            let cols = t.shape[1] as usize;
            let want: Vec<u8> = t.values.chunks_exact(cols)
                .flat_map(|row| if width == Width::Q8 { seed_q8_row(row) } else { seed_q4_row(row) })
                .collect();
            assert_eq!(got.len(), t.shape[0] as usize * cols / 32 * width.block_bytes());
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            assert!(first.is_none(), "{width:?} {}: first differing byte at {first:?}", t.name);
        }
        // The all-zero and the underflowing blocks: scale 0, payload 0.
        let m0 = tensor_bytes(&file, "m0.weight");
        assert!(m0[..2 * width.block_bytes()].iter().all(|&b| b == 0));
        // The norm weight is kept as it was.
        let norm = tensor_bytes(&file, "norm.weight");
        assert_eq!(f32s(&norm), vec![1.5; 96]);
    }
}

/// GGML's Q8_0 (gguf-py, the fixture `quant_golden.npz` from `quant_golden.py`) has the layout
/// of Q8B32: per 32 weights a binary16 scale then 32 signed bytes. Its scale is the same value
/// (f16(max|w|/127)), but its levels are round(w × (1/d)) with d the *unrounded* f32 scale,
/// while the seed divides by the binary16 scale. The two agree except where w/d and w/f16(d)
/// fall on different sides of a rounding boundary: such a level differs by exactly 1, and the
/// test explains every one of them by recomputing both rules. Q4_0 has another layout
/// (unsigned nibbles with offset 8, positions 0..15 in the low nibbles, a signed scale
/// max/−8), so it is not compared byte-wise.
#[test]
fn q8_bytes_against_ggml_q8_0() {
    let zip = std::fs::read(fixture("quant_golden.npz")).unwrap();
    let members = read_stored_zip(&zip);
    let get = |n: &str| parse_npy(&members.iter().find(|(m, _)| m == n).unwrap_or_else(|| panic!("{n} missing")).1);
    let (_, wshape, wraw) = get("W.npy");
    let (_, _, xraw) = get("x.npy");
    let (descr, gshape, ggml) = get("Q8_0_bytes.npy");
    let (_, _, deq_raw) = get("Q8_0_dequant.npy");
    let (_, _, mv_raw) = get("Q8_0_matvec.npy");
    let (rows, cols) = (wshape[0], wshape[1]);
    assert_eq!((descr.as_str(), gshape.as_slice()), ("|u1", &[rows, cols / 32 * 34][..]));
    let w = f32s(&wraw);

    let mut ours = vec![0u8; ggml.len()];
    for (r, out) in ours.chunks_exact_mut(cols / 32 * 34).enumerate() {
        quant::encode_row(Width::Q8, &w[r * cols..(r + 1) * cols], out).unwrap();
    }
    let mut differing = 0;
    for (bi, (a, g)) in ours.chunks_exact(34).zip(ggml.chunks_exact(34)).enumerate() {
        assert_eq!(a[..2], g[..2], "block {bi}: the scales must be identical");
        let wb = &w[bi * 32..(bi + 1) * 32];
        let d = wb.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
        for k in 0..32 {
            let (qa, qg) = (a[2 + k] as i8 as i32, g[2 + k] as i8 as i32);
            // GGML's rule, recomputed: round half away from zero of w × (1/d) in f32.
            assert_eq!(qg, (wb[k] * inv).round() as i32, "block {bi} weight {k}: GGML's rule misread");
            if qa != qg {
                differing += 1;
                assert_eq!((qa - qg).abs(), 1, "block {bi} weight {k}: {qa} vs {qg}");
                let s = half::f16::from_bits(u16::from_le_bytes([a[0], a[1]])).to_f32();
                assert_eq!(qa, (wb[k] / s).round().clamp(-128.0, 127.0) as i32, "block {bi} weight {k}: ours is not the seed's");
            }
        }
    }
    println!("Q8B32 vs GGML Q8_0: {differing} of {} levels differ by one (scale rounding rule), every scale equal",
        rows * cols);
    assert!(differing * 20 < rows * cols, "{differing} differing levels: more than the scale rule explains");

    // Same layout: our kernel reads GGML's bytes as Q8B32 and reproduces its dequantized
    // matrix exactly and its matrix-vector product to f32 accumulation accuracy.
    let mut deq = vec![0.0f32; cols];
    let gdeq = f32s(&deq_raw);
    for r in 0..rows {
        quant::decode_row(Width::Q8, &ggml[r * cols / 32 * 34..(r + 1) * cols / 32 * 34], &mut deq);
        assert_eq!(deq, gdeq[r * cols..(r + 1) * cols], "row {r}");
    }
    let x = f32s(&xraw);
    let mut y = vec![0.0f32; rows];
    let pool = Pool::new(1).unwrap();
    Kernels::select(false).matmul(&pool, MatRef { dtype: DType::Q8B32, rows, cols, data: &ggml }, &x, 1, &mut y);
    for (r, (a, b)) in y.iter().zip(f32s(&mv_raw)).enumerate() {
        let mag: f32 = gdeq[r * cols..(r + 1) * cols].iter().zip(&x).map(|(p, q)| (p * q).abs()).sum();
        assert!((a - b).abs() <= 1e-5 * mag, "row {r}: {a} vs GGML {b}");
    }
}

// ---- Refusals --------------------------------------------------------------------------

fn open_err(name: &str, header: &str, data_len: usize) -> String {
    let dir = temp_dir(&format!("refuse-{name}"));
    let path = dir.join("model.safetensors");
    write_raw(&path, header, &vec![0x3cu8; data_len]); // 0x3c3c: a finite binary16 scale
    match SafeTensors::open(&path) {
        Ok(_) => panic!("{name}: the file was accepted"),
        Err(e) => e.to_string(),
    }
}

const META_Q4: &str = r#""__metadata__":{"format":"rabbit-q4b32","block":"32","scale":"f16"}"#;

fn assert_names(e: &str, parts: &[&str]) {
    for p in parts {
        assert!(e.contains(p), "error does not name {p}: {e}");
    }
}

#[test]
fn refuses_mixed_widths() {
    let e = open_err("mixed", &format!(
        r#"{{{META_Q4},"a":{{"dtype":"Q4B32","shape":[1,32],"data_offsets":[0,18]}},"b":{{"dtype":"Q8B32","shape":[1,32],"data_offsets":[18,52]}}}}"#), 52);
    assert_names(&e, &["tensor `b`", "`dtype`", "Q8B32", "tensor `a`", "one width"]);
}

#[test]
fn refuses_missing_metadata() {
    let e = open_err("nometa", r#"{"w":{"dtype":"Q4B32","shape":[2,32],"data_offsets":[0,36]}}"#, 36);
    assert_names(&e, &["tensor `w`", "`__metadata__` is missing"]);
}

#[test]
fn refuses_a_wrong_format() {
    let e = open_err("format", r#"{"__metadata__":{"format":"rabbit-q5b32","block":"32","scale":"f16"},"w":{"dtype":"Q4B32","shape":[2,32],"data_offsets":[0,36]}}"#, 36);
    assert_names(&e, &["`format`", "rabbit-q5b32"]);
    // A format that names the other width than the tensors carry.
    let e = open_err("format2", r#"{"__metadata__":{"format":"rabbit-q8b32","block":"32","scale":"f16"},"w":{"dtype":"Q4B32","shape":[2,32],"data_offsets":[0,36]}}"#, 36);
    assert_names(&e, &["tensor `w`", "`format`", "rabbit-q8b32"]);
    // No format at all.
    let e = open_err("format3", r#"{"__metadata__":{"block":"32","scale":"f16"},"w":{"dtype":"Q4B32","shape":[2,32],"data_offsets":[0,36]}}"#, 36);
    assert_names(&e, &["tensor `w`", "no field `format`"]);
}

#[test]
fn refuses_a_wrong_block() {
    let e = open_err("block", r#"{"__metadata__":{"format":"rabbit-q4b32","block":"64","scale":"f16"},"w":{"dtype":"Q4B32","shape":[2,32],"data_offsets":[0,36]}}"#, 36);
    assert_names(&e, &["`block`", "`64`"]);
}

#[test]
fn refuses_a_wrong_scale_type() {
    let e = open_err("scale", r#"{"__metadata__":{"format":"rabbit-q4b32","block":"32","scale":"f32"},"w":{"dtype":"Q4B32","shape":[2,32],"data_offsets":[0,36]}}"#, 36);
    assert_names(&e, &["`scale`", "`f32`"]);
}

#[test]
fn refuses_a_quantized_tensor_that_is_not_2d() {
    let e = open_err("rank", &format!(r#"{{{META_Q4},"w":{{"dtype":"Q4B32","shape":[64],"data_offsets":[0,36]}}}}"#), 36);
    assert_names(&e, &["tensor `w`", "`shape`", "1 dimensions", "2-D"]);
    let e = open_err("rank3", &format!(r#"{{{META_Q4},"w":{{"dtype":"Q4B32","shape":[1,2,32],"data_offsets":[0,36]}}}}"#), 36);
    assert_names(&e, &["tensor `w`", "`shape`", "3 dimensions"]);
}

#[test]
fn refuses_columns_that_are_not_a_multiple_of_32() {
    let e = open_err("ragged", &format!(r#"{{{META_Q4},"w":{{"dtype":"Q4B32","shape":[2,48],"data_offsets":[0,36]}}}}"#), 36);
    assert_names(&e, &["tensor `w`", "`shape`", "48 columns", "multiple of the 32"]);
}

#[test]
fn refuses_a_byte_length_that_disagrees_with_the_shape() {
    let e = open_err("len", &format!(r#"{{{META_Q4},"w":{{"dtype":"Q4B32","shape":[2,32],"data_offsets":[0,34]}}}}"#), 36);
    assert_names(&e, &["tensor `w`", "`data_offsets`", "34 bytes", "needs 36"]);
}

#[test]
fn refuses_a_float_matrix_in_a_quantized_file() {
    let e = open_err("float2d", &format!(
        r#"{{{META_Q4},"w":{{"dtype":"Q4B32","shape":[1,32],"data_offsets":[0,18]}},"head":{{"dtype":"F32","shape":[1,4],"data_offsets":[18,34]}}}}"#), 34);
    assert_names(&e, &["tensor `head`", "`dtype`", "every 2-D tensor"]);
}

#[test]
fn refuses_a_non_finite_scale_naming_row_and_block() {
    // A valid file whose tensor `w` (3 rows of 2 blocks) has an infinite scale at row 2, block 1.
    let dir = temp_dir("refuse-scale");
    let path = dir.join("model.safetensors");
    let mut data = vec![0u8; 3 * 2 * 34];
    for b in data.chunks_exact_mut(34) {
        b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
    }
    data[5 * 34..5 * 34 + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
    let header = r#"{"__metadata__":{"format":"rabbit-q8b32","block":"32","scale":"f16"},"w":{"dtype":"Q8B32","shape":[3,64],"data_offsets":[0,204]}}"#;
    write_raw(&path, header, &data);
    let st = SafeTensors::open(&path).unwrap(); // the header is fine
    let e = quant::validate(&st).unwrap_err().to_string();
    assert_names(&e, &["tensor `w`", "`scale`", "row 2, block 1", "infinite", "not a finite binary16"]);
    assert!(e.contains(&format!("byte {}", 8 + header.len() + 5 * 34)), "{e}");
}

/// Model::open applies the rules: a quantized model whose header is edited, or one of whose
/// scales is made NaN, is refused with the field (and the row and block) named.
#[test]
fn model_open_applies_the_rules() {
    let dir = temp_dir("refuse-model");
    let src = dir.join("float");
    exact_checkpoint(&src, SMOL_TINY, 7, 1.0 / 16.0, DType::F32, 3);
    let q = dir.join("q4");
    quantize_checkpoint(&src, &q, Width::Q4).unwrap();
    let file = q.join("model.safetensors");
    let pristine = std::fs::read(&file).unwrap();
    let opts = waste::Options { threads: 1, ..Default::default() };
    waste::Model::open(&q, &opts).unwrap();

    // Header edit of the same length: "scale":"f16" → "scale":"f32".
    let text = String::from_utf8_lossy(&pristine).into_owned();
    let at = text.find(r#""scale":"f16""#).unwrap();
    let mut edited = pristine.clone();
    edited[at + 9..at + 12].copy_from_slice(b"f32");
    std::fs::write(&file, &edited).unwrap();
    let e = waste::Model::open(&q, &opts).err().expect("accepted a wrong scale type").to_string();
    assert_names(&e, &["`scale`", "`f32`"]);

    // A NaN scale in row 5, block 1 of a projection.
    std::fs::write(&file, &pristine).unwrap();
    let st = SafeTensors::open(&file).unwrap();
    let t = st.get("model.layers.1.mlp.up_proj.weight").unwrap().clone();
    drop(st);
    let mut edited = pristine.clone();
    let off = (t.offset + (5 * 2 + 1) * 18) as usize; // 64 columns = 2 blocks per row
    edited[off..off + 2].copy_from_slice(&0x7e01u16.to_le_bytes());
    std::fs::write(&file, &edited).unwrap();
    let e = waste::Model::open(&q, &opts).err().expect("accepted a NaN scale").to_string();
    assert_names(&e, &["tensor `model.layers.1.mlp.up_proj.weight`", "`scale`", "row 5, block 1", "NaN"]);
}

#[test]
fn quantize_of_stories260k_is_refused_naming_the_ragged_tensor() {
    let src = root().join("models/stories260K");
    let out = temp_dir("ragged").join("out");
    let e = quantize_checkpoint(&src, &out, Width::Q4).unwrap_err();
    let msg = e.to_string();
    // intermediate_size 172: every down_proj has 172 columns.
    assert_names(&msg, &["tensor `model.layers.0.mlp.down_proj.weight`", "[64, 172]", "172 columns", "multiple of 32"]);
    assert!(!out.exists(), "nothing may be written for a refused checkpoint");
}

#[test]
fn quantize_refuses_a_non_finite_weight_naming_row_and_block() {
    let dir = temp_dir("nonfinite");
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut v = vec![0.25f32; 4 * 64];
    v[2 * 64 + 40] = f32::INFINITY;
    write_tensors(&src.join("model.safetensors"),
        &[T { name: "w".into(), dtype: DType::F32, shape: vec![4, 64], values: v }], &[]);
    let e = quantize_checkpoint(&src, &dir.join("out"), Width::Q8).unwrap_err().to_string();
    assert_names(&e, &["tensor `w`", "row 2, block 1", "columns 32..64", "inf"]);
    // The run created `out`: a failure removes it, temporary file and all, and says so.
    assert!(!dir.join("out").exists(), "a failed run leaves {:?} behind", entries(&dir.join("out")));
    assert!(e.contains("removed") && e.contains("which this run had created"), "{e}");
}

/// The names in a directory, sorted.
fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// The side files are copied before the weights are renamed into place: when a copy fails,
/// no weights appear without their config, and no temporary file stays.
#[test]
fn a_failed_side_file_copy_leaves_no_weights_and_no_temporary_file() {
    let dir = temp_dir("sidecar-fails");
    let src = dir.join("src");
    exact_checkpoint(&src, SMOL_TINY, 7, 0.1, DType::F32, 5);
    let out = dir.join("out");
    // A directory where config.json must go: the rename onto it fails.
    std::fs::create_dir_all(out.join("config.json/x")).unwrap();
    let e = quantize_checkpoint(&src, &out, Width::Q4).unwrap_err().to_string();
    assert!(e.contains("config.json"), "{e}");
    assert_eq!(entries(&out), ["config.json"], "weights or a temporary file were left: {:?}", entries(&out));
    // The same run into a clean directory succeeds and leaves exactly the files it reports.
    let out = dir.join("ok");
    let rep = quantize_checkpoint(&src, &out, Width::Q4).unwrap();
    assert_eq!(rep.copied, ["config.json"]);
    assert_eq!(entries(&out), ["config.json", "model.safetensors"]);
}

#[test]
fn quantize_refuses_an_already_quantized_checkpoint_and_its_own_input_directory() {
    let dir = temp_dir("twice");
    let src = dir.join("src");
    exact_checkpoint(&src, SMOL_TINY, 7, 0.1, DType::F32, 9);
    let e = quantize_checkpoint(&src, &src, Width::Q4).unwrap_err().to_string();
    assert!(e.contains("input directory"), "{e}");
    quantize_checkpoint(&src, &dir.join("q"), Width::Q4).unwrap();
    let e = quantize_checkpoint(&dir.join("q"), &dir.join("qq"), Width::Q8).unwrap_err().to_string();
    assert!(e.contains("already quantized"), "{e}");
}
