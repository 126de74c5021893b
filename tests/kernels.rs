//! The matrix × vectors kernels: every SIMD kernel against its scalar twin on random data
//! (every dtype, odd row counts, several vector counts), each quantized width against an f64
//! product of the independently dequantized matrix, and the bit-identity of everything that
//! only changes *when* work is done: the number of vectors per call, the row range a call
//! covers, and the thread count.

use crate::common;
use common::{assert_independent_of_vector_count_and_row_range, bit_identical, kernel_product, random_matrix, Rng};
use waste::format::dtype::DType;
use waste::kernels::{Isa, Kernels, MatRef, Pool, Prefetch, TokenGroups};

const DTYPES: [DType; 5] = [DType::F32, DType::BF16, DType::F16, DType::Q8B32, DType::Q4B32];

/// The matrix widened to f64, decoded here from the format's definition (seed 000, "The
/// payload"), independently of the library.
fn dequantize(dtype: DType, data: &[u8], rows: usize, cols: usize) -> Vec<f64> {
    let h = |b: &[u8]| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64();
    let all: Vec<f64> = match dtype {
        DType::F32 => data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        DType::BF16 => data.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64).collect(),
        DType::F16 => data.chunks_exact(2).map(h).collect(),
        DType::Q8B32 => data.chunks_exact(34).flat_map(|b| (0..32).map(move |k| (b[2 + k] as i8) as f64 * h(b))).collect(),
        DType::Q4B32 => data
            .chunks_exact(18)
            .flat_map(|b| {
                (0..32).map(move |n| {
                    let nibble = (b[2 + n / 2] >> (4 * (n % 2))) & 0x0f;
                    ((nibble ^ 8) as i32 - 8) as f64 * h(b)
                })
            })
            .collect(),
        _ => unreachable!(),
    };
    all.into_iter().take(rows * cols).collect()
}

fn simd_isas() -> Vec<Kernels> {
    let mut ks: Vec<Kernels> = Vec::new();
    for k in Isa::ALL.into_iter().filter(|&i| i != Isa::Scalar).filter_map(Kernels::with_isa) {
        // Each prefetch scheme where the instruction set has a choice (AVX-512).
        for p in Prefetch::ALL {
            let kp = k.clone().with_prefetch(p);
            if kp.prefetch() == p {
                ks.push(kp);
            }
        }
        if !ks.iter().any(|o| o.isa() == k.isa()) {
            ks.push(k.clone());
        }
        // And the other token-group rule where the instruction set has a choice (AVX-512).
        for g in TokenGroups::ALL.into_iter().filter(|&g| g != k.token_groups()) {
            let kg = k.clone().with_token_groups(g);
            if kg.token_groups() == g {
                ks.push(kg);
            }
        }
    }
    if ks.is_empty() {
        common::skip("kernels", "this CPU has no SIMD instruction set the engine uses");
    }
    ks
}

/// Shapes with odd row counts, column counts on and off the vector widths (the dense dtypes
/// accept any column count; the block widths need multiples of 32).
fn shapes(dtype: DType) -> Vec<(usize, usize)> {
    if dtype.is_quantized() {
        vec![(1, 32), (3, 64), (7, 96), (37, 160), (5, 1024), (2, 2048)]
    } else {
        vec![(1, 1), (3, 7), (7, 16), (5, 17), (37, 33), (9, 100), (5, 1000), (2, 2048)]
    }
}

/// Every SIMD kernel agrees with the scalar one. The two add the same products in different
/// orders (the scalar kernel in column order with one accumulator, SIMD in 8 or 16 lanes
/// summed by a tree), so they differ by rounding only. For a sum of N terms computed in f32
/// in any order the error is at most γ_N·Σ|terms| with γ_N ≈ N·2⁻²⁴ (Higham, "Accuracy and
/// Stability of Numerical Algorithms", §4.2); two such sums differ by at most twice that. A
/// wrong decode (a swapped nibble, a missed scale, a dropped tail) is off by a whole term,
/// which for these random data is orders of magnitude above the bound.
#[test]
fn simd_kernels_match_the_scalar_twin() {
    let scalar = Kernels::scalar();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for k in simd_isas() {
        for dtype in DTYPES {
            for (rows, cols) in shapes(dtype) {
                let data = random_matrix(dtype, rows, cols, &mut rng);
                let w = MatRef { dtype, rows, cols, data: &data };
                let wf = dequantize(dtype, &data, rows, cols);
                // 21 and 33 vectors: groups the AMX tiles take (Q4B32, Q8B32, and BF16 of whole
                // 32-column blocks), one padded to 32, one to 64.
                for n in [1, 2, 3, 4, 5, 9, 21, 33] {
                    let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
                    let (got, want) = (kernel_product(&k, w, &x, n), kernel_product(&scalar, w, &x, n));
                    // The tiles add each input as three bf16 parts: three terms per column.
                    let parts = if k.tiles_take(&w, n) { 3 } else { 1 };
                    for t in 0..n {
                        for r in 0..rows {
                            let mag: f64 = (0..cols).map(|c| (wf[r * cols + c] * x[t * cols + c] as f64).abs()).sum();
                            // The block widths add one product per block (the scale) to each term's path.
                            let terms = (parts * cols + cols / 32 + 2) as f64;
                            let tol = 2.0 * terms * f32::EPSILON as f64 / 2.0 * mag + 1e-30;
                            let (g, e) = (got[t * rows + r] as f64, want[t * rows + r] as f64);
                            assert!((g - e).abs() <= tol, "{} {dtype} {rows}x{cols} n={n} t={t} r={r}: simd {g} scalar {e} (tol {tol:e})",
                                k.isa().name());
                        }
                    }
                }
            }
        }
    }
}

/// A known matrix and vector per width, against the f64 product of the dequantized matrix:
/// the quantized kernels (scalar and SIMD) compute q·scale·x as the format defines it.
#[test]
fn quantized_products_match_the_f64_dequantized_product() {
    for dtype in [DType::Q8B32, DType::Q4B32] {
        let (rows, cols) = (5, 96);
        // Known values: scales 0.5, 0.25, 1.0, ... and payloads walking through every level.
        let mut data = Vec::new();
        for b in 0..rows * cols / 32 {
            let scale = [0.5f32, 0.25, 1.0, 0.125, 2.0][b % 5];
            data.extend_from_slice(&half::f16::from_f32(scale).to_bits().to_le_bytes());
            if dtype == DType::Q8B32 {
                (0..32).for_each(|k| data.push(((b * 37 + k * 11) % 256) as u8));
            } else {
                (0..16).for_each(|k| data.push(((b * 29 + k * 7) % 256) as u8));
            }
        }
        let wf = dequantize(dtype, &data, rows, cols);
        let w = MatRef { dtype, rows, cols, data: &data };
        let mut all = vec![Kernels::scalar()];
        all.extend(Isa::ALL.into_iter().filter(|&i| i != Isa::Scalar).filter_map(Kernels::with_isa));
        for k in all {
            // One vector, and 40 (a group the AMX tiles take, with inputs split into bf16 parts).
            for n in [1, 40] {
                let x: Vec<f32> = (0..n * cols).map(|i| (((i % cols) + i / cols) % 13) as f32 * 0.375 - 2.25 + (i / cols) as f32 / 1024.0).collect();
                let y = kernel_product(&k, w, &x, n);
                let parts = if k.tiles_take(&w, n) { 3 } else { 1 };
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for r in 0..rows {
                        let want: f64 = (0..cols).map(|c| wf[r * cols + c] * xt[c] as f64).sum();
                        let mag: f64 = (0..cols).map(|c| (wf[r * cols + c] * xt[c] as f64).abs()).sum();
                        // Every weight and input here is a short binary fraction, so each product
                        // (of a level and an input, or of its bf16 parts) is exact in f32; only
                        // the additions round (≤ N·2⁻²⁴ relative to Σ|terms|).
                        let tol = (parts * cols + 4) as f64 * f32::EPSILON as f64 / 2.0 * mag;
                        let got = y[t * rows + r] as f64;
                        assert!((got - want).abs() <= tol, "{} {dtype} n={n} vector {t} row {r}: {got} vs f64 {want}", k.isa().name());
                    }
                }
            }
        }
    }
}

/// The result for a (row, vector) pair is the same bits whatever else the call computes: the
/// vector alone or among 2..9 others (prefill chunks), the row alone or in any row range (how
/// threads split a product).
#[test]
fn results_do_not_depend_on_vector_count_or_row_range() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let mut all = vec![Kernels::scalar()];
    all.extend(simd_isas());
    // With room for a product's inputs split once (by parity on AVX-512, in bf16 parts for the
    // AMX tiles), as a model holds.
    all.extend(simd_isas().into_iter().filter(Kernels::splits_inputs).map(|k| k.with_split_buffer(128 * 2080)));
    for k in all {
        for dtype in DTYPES {
            // Shapes on both sides of the GEMMs' row groups (AVX2 24, AVX-512 16), vector groups
            // (AVX2 64, AVX-512 128), AVX2 spans (96) and column chunks (AVX2 256, AVX-512
            // 2048), with dense column tails; and on both sides of the inputs' size (vectors ×
            // columns × 4 bytes) below which a few vectors run on register tiles instead (AVX2
            // 64 KiB, 32 KiB for Q4B32; AVX-512 256 KiB): the 2080-column shape's whole product
            // takes the GEMM, its first 2 and 3 vectors the tiles, and 5 the tiles except AVX2's
            // Q4B32. The last two shapes have whole 32-column blocks for the dense dtypes too:
            // BF16 groups the AMX tiles take; and 300 rows are two of the tiles' row blocks (256).
            for (rows, cols, n) in [(11, 320, 9), (37, 1000, 40), (18, 527, 33), (50, 1100, 70), (101, 544, 35), (40, 2080, 66),
                                    (19, 1056, 131), (21, 1024, 45), (300, 640, 21)] {
                let cols = if dtype.is_quantized() || matches!(cols, 1024 | 640) { cols / 32 * 32 } else { cols + 1 };
                let data = random_matrix(dtype, rows, cols, &mut rng);
                let w = MatRef { dtype, rows, cols, data: &data };
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
                let what = format!("{} {dtype} {rows}x{cols} n={n}", k.isa().name());
                assert_independent_of_vector_count_and_row_range(&k, w, &x, n, &what, bit_identical);
            }
        }
    }
}

/// The pooled product is bit-identical at 1, 2, 3 and 4 threads (rows are split, sums never).
#[test]
fn threads_do_not_change_the_bits() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    // As a model holds them: with room for a Q4B32 product's inputs split by parity (AVX-512),
    // which 600 vectors use, 128 at a time.
    let k = Kernels::select(false).with_split_buffer(128 * 256);
    let pools: Vec<Pool> = (1..=4).map(|t| Pool::new(t).unwrap()).collect();
    for dtype in DTYPES {
        let (rows, cols) = (203, 256);
        let data = random_matrix(dtype, rows, cols, &mut rng);
        let w = MatRef { dtype, rows, cols, data: &data };
        for n in [1, 4, 7, 600] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let mut base = vec![0.0; n * rows];
            k.matmul(&pools[0], w, &x, n, &mut base);
            assert_eq!(base, kernel_product(&k, w, &x, n));
            for p in &pools[1..] {
                let mut y = vec![f32::NAN; n * rows];
                k.matmul(p, w, &x, n, &mut y);
                assert!(bit_identical(&y, &base), "{dtype} n={n}: {} threads differ", p.threads());
            }
        }
    }
}

/// Products grouped into one parallel region equal the same products made one by one, and
/// the row kernel's on unsplit inputs: with and without the buffer in which Q4B32 inputs are split
/// by parity (AVX-512: once for the group's two Q4B32 products, as an expert's gate and up),
/// for a few vectors (register tiles), more (GEMM), and more than the buffer's 128 at once.
#[test]
fn grouped_products_equal_single_ones() {
    let mut rng = Rng(99);
    let pool = Pool::new(2).unwrap();
    let cols = 256;
    let mats: Vec<(DType, usize, Vec<u8>)> = [(DType::BF16, 301), (DType::Q4B32, 64), (DType::Q8B32, 129), (DType::Q4B32, 97)]
        .iter().map(|&(d, rows)| (d, rows, random_matrix(d, rows, cols, &mut rng))).collect();
    let views: Vec<MatRef> = mats.iter().map(|(d, r, data)| MatRef { dtype: *d, rows: *r, cols, data }).collect();
    let plain = Kernels::select(false);
    for k in [plain.clone(), plain.clone().with_split_buffer(128 * cols)] {
        for n in [3, 9, 40, 300] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let mut outs: Vec<Vec<f32>> = views.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
            {
                let mut items: Vec<(MatRef, &mut [f32])> = views.iter().copied().zip(outs.iter_mut().map(|o| &mut o[..])).collect();
                k.matmul_group(&pool, &x, n, &mut items);
            }
            for (w, got) in views.iter().zip(&outs) {
                let mut want = vec![0.0; n * w.rows];
                k.matmul(&pool, *w, &x, n, &mut want);
                assert!(bit_identical(got, &want), "{} {} n={n}", k.isa().name(), w.dtype);
                assert!(bit_identical(got, &kernel_product(&plain, *w, &x, n)), "{} {} n={n}: not the unsplit rows kernel's", k.isa().name(), w.dtype);
            }
        }
    }
}

/// A product computed alone on the calling thread with the caller's own room for split
/// inputs (how a pool participant computes a whole expert) equals the pooled product bit for
/// bit: room enough, too little (the kernels then split on their own), one vector, and every
/// dtype, with and without the kernels' shared buffer.
#[test]
fn a_product_computed_alone_equals_the_pooled_one() {
    let mut rng = Rng(0x5EED_A10E);
    let pool = Pool::new(2).unwrap();
    let (rows, cols) = (70, 2048);
    let plain = Kernels::select(false);
    for k in [plain.clone(), plain.with_split_buffer(128 * cols)] {
        for dtype in DTYPES {
            let data = random_matrix(dtype, rows, cols, &mut rng);
            let w = MatRef { dtype, rows, cols, data: &data };
            // 40 vectors with room for the AMX tiles' split (two pairs of 16-vector groups in
            // three parts) and without; 150 as a group of 128 and one of 22, both tiles'.
            for (n, room) in [(1, 0), (5, 5 * cols), (12, 12 * cols), (12, 3 * cols), (40, 40 * cols), (40, 96 * cols), (150, 192 * cols)] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
                let mut want = vec![0.0; n * rows];
                k.matmul(&pool, w, &x, n, &mut want);
                let (mut got, mut split) = (vec![f32::NAN; n * rows], vec![f32::NAN; room]);
                k.rows_alone(w, &x, n, &mut got, &mut split);
                assert!(bit_identical(&got, &want), "{} {dtype} n={n} room={room}", k.isa().name());
            }
        }
    }
}

/// The attention dot product and the bandwidth probe's sum agree with their scalar twins
/// (same reasoning and bound as the row kernels).
#[test]
fn dot_and_sum_match_the_scalar_twin() {
    let scalar = Kernels::scalar();
    let mut rng = Rng(7);
    for k in simd_isas() {
        for len in (0..70).chain([64, 128, 1000, 4099]) {
            let a: Vec<f32> = (0..len).map(|_| rng.f32()).collect();
            let b: Vec<f32> = (0..len).map(|_| rng.f32()).collect();
            let tol = 2.0 * (len + 1) as f32 * f32::EPSILON / 2.0;
            let mag: f32 = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum();
            let (g, e) = (k.dot(&a, &b), scalar.dot(&a, &b));
            assert!((g - e).abs() <= tol * mag + 1e-30, "{} dot len {len}: {g} vs {e}", k.isa().name());
            let mag: f32 = a.iter().map(|x| x.abs()).sum();
            let (g, e) = (k.sum(&a), scalar.sum(&a));
            assert!((g - e).abs() <= tol * mag + 1e-30, "{} sum len {len}: {g} vs {e}", k.isa().name());
        }
    }
}

/// The attention kernels agree with their scalar twins (the bound of `dot` per score, and
/// per weighted-sum column), for head sizes with and without a partial last 8 and key counts
/// on both sides of the SIMD kernels' group of 8; a score's bits do not depend on how many
/// keys are scored at once; and on AVX2 a score is `dot`'s value times the scale, bit for bit.
#[test]
fn attention_scores_and_weighted_sums_match_the_scalar_twin() {
    let scalar = Kernels::scalar();
    let mut rng = Rng(11);
    for k in simd_isas() {
        for hd in [4, 20, 64, 80, 128, 200] {
            let stride = 3 * hd + 5;
            for n in [1, 2, 7, 8, 9, 16, 23, 64] {
                let q: Vec<f32> = (0..hd).map(|_| rng.f32()).collect();
                let keys: Vec<f32> = (0..(n - 1) * stride + hd).map(|_| rng.f32()).collect();
                let (mut got, mut want) = (vec![0f32; n], vec![0f32; n]);
                k.attn_scores(&q, &keys, stride, 0.125, &mut got);
                scalar.attn_scores(&q, &keys, stride, 0.125, &mut want);
                let tol = 2.0 * (hd + 1) as f32 * f32::EPSILON / 2.0;
                for i in 0..n {
                    let key = &keys[i * stride..i * stride + hd];
                    let mag: f32 = q.iter().zip(key).map(|(x, y)| (x * y).abs()).sum::<f32>() * 0.125;
                    assert!((got[i] - want[i]).abs() <= tol * mag + 1e-30, "{} scores hd {hd} n {n} key {i}: {} vs {}", k.isa().name(), got[i], want[i]);
                    let mut one = [0f32];
                    k.attn_scores(&q, key, stride, 0.125, &mut one);
                    assert_eq!(one[0].to_bits(), got[i].to_bits(), "{} hd {hd} n {n} key {i}: scored alone differs", k.isa().name());
                    if matches!(k.isa(), Isa::Avx2 | Isa::Avx512 | Isa::Amx) {
                        assert_eq!((k.dot(&q, key) * 0.125).to_bits(), got[i].to_bits(), "{} hd {hd} key {i}: not dot's bits", k.isa().name());
                    }
                }
                // Softmax-like weights (non-negative, summing to about 1), as attention uses.
                let w: Vec<f32> = (0..n).map(|_| rng.f32().abs() / n as f32).collect();
                let values: Vec<f32> = (0..(n - 1) * stride + hd).map(|_| rng.f32()).collect();
                let (mut got, mut want) = (vec![f32::NAN; hd], vec![f32::NAN; hd]);
                k.attn_mix(&w, &values, stride, &mut got);
                scalar.attn_mix(&w, &values, stride, &mut want);
                let tol = 2.0 * (n + 1) as f32 * f32::EPSILON / 2.0;
                for d in 0..hd {
                    let mag: f32 = (0..n).map(|i| (w[i] * values[i * stride + d]).abs()).sum();
                    assert!((got[d] - want[d]).abs() <= tol * mag + 1e-30, "{} mix hd {hd} n {n} column {d}: {} vs {}", k.isa().name(), got[d], want[d]);
                    // Each column is one chain of fused multiply-adds in key order from zero,
                    // whatever the lane width: the AVX-512 and AVX2 sums are the same bits.
                    let chain = (0..n).fold(0f32, |acc, i| w[i].mul_add(values[i * stride + d], acc));
                    if k.isa() != Isa::Neon {
                        assert_eq!(got[d].to_bits(), chain.to_bits(), "{} mix hd {hd} n {n} column {d}: not the key-order chain", k.isa().name());
                    }
                }
            }
        }
    }
}

/// `bench attention` times each key count head by head and grouped (figures printed, never
/// asserted; only their presence), and refuses shapes it cannot hold.
#[test]
fn bench_attention_reports_each_key_count() {
    use waste::kernels::bench::{self, AttentionBench};
    let opts = AttentionBench { keys: vec![9, 40], heads: 3, kv_heads: 2, head_dim: 20, passes: 1, ..AttentionBench::default() };
    let r = bench::attention(&opts).unwrap();
    assert_eq!(r.rows.iter().map(|x| x.keys).collect::<Vec<_>>(), [9, 40]);
    for x in &r.rows {
        let all = [x.scores_per_head, x.scores_grouped, x.mix_per_head, x.mix_grouped];
        assert!(all.iter().all(|t| t.is_finite() && *t > 0.0), "{x:?}");
    }
    assert!(bench::attention(&AttentionBench { head_dim: 0, ..opts.clone() }).is_err());
    assert!(bench::attention(&AttentionBench { keys: vec![1 << 40], ..opts }).is_err(), "a cache past 1 GiB is refused");
    let (status, out, err) = common::waste(&["bench", "attention", "--keys", "16,33", "--heads", "2", "--kv-heads", "2", "--head-dim", "24", "--passes", "1"]);
    assert_eq!(status, 0, "{err}");
    assert!(out.contains("per head -> grouped") && out.contains("GMAC/s") && out.lines().count() >= 4, "{out}");
    let (status, _, err) = common::waste(&["bench", "attention", "--keys", "0"]);
    assert_eq!(status, 2, "zero keys: {err}");
}

/// The grouped-query attention kernels (a group of query heads over the same keys and values,
/// each key loaded once for several heads on AVX-512) give every head the bits of the per-head
/// kernels: group sizes 1 to 9 (tiles of four and two heads and their leftovers), head sizes on
/// and off 16 and 64 columns, key counts on and off the tiles' four and eight.
#[test]
fn grouped_attention_gives_the_per_head_bits() {
    let mut rng = Rng(17);
    for k in simd_isas().into_iter().chain([Kernels::scalar()]) {
        for heads in 1..=9 {
            for hd in [20, 64, 80, 128, 144] {
                let stride = 2 * hd + 3;
                for n in [1, 3, 4, 8, 9, 23] {
                    let q: Vec<f32> = (0..heads * hd).map(|_| rng.f32()).collect();
                    let keys: Vec<f32> = (0..(n - 1) * stride + hd).map(|_| rng.f32()).collect();
                    let mut grouped = vec![f32::NAN; heads * n];
                    k.attn_scores_group(&q, hd, &keys, stride, 0.125, &mut grouped);
                    for h in 0..heads {
                        let mut one = vec![f32::NAN; n];
                        k.attn_scores(&q[h * hd..(h + 1) * hd], &keys, stride, 0.125, &mut one);
                        assert!(bit_identical(&one, &grouped[h * n..(h + 1) * n]), "{} scores: {heads} heads hd {hd} n {n}: head {h} differs", k.isa().name());
                    }
                    let w: Vec<f32> = (0..heads * n).map(|_| rng.f32().abs() / n as f32).collect();
                    let mut grouped = vec![f32::NAN; heads * hd];
                    k.attn_mix_group(&w, &keys, stride, &mut grouped, hd);
                    for h in 0..heads {
                        let mut one = vec![f32::NAN; hd];
                        k.attn_mix(&w[h * n..(h + 1) * n], &keys, stride, &mut one);
                        assert!(bit_identical(&one, &grouped[h * hd..(h + 1) * hd]), "{} mix: {heads} heads hd {hd} n {n}: head {h} differs", k.isa().name());
                    }
                }
            }
        }
    }
}

/// Attention's softmax and its scalar twin both agree with the softmax computed in f64, with
/// and without a sink, over lengths on both sides of 8 and scores spread from 0 to −120
/// below the maximum (where e^x leaves the normal range); a NaN score makes every
/// probability NaN, as in the twin. The bound is each one's own rounding: a few ulp for the
/// exponential and the division, plus its sum of n positive terms — at most one rounding per
/// addition in a lane's chain, n/8 + 11 of them in eight lanes (the tail, the sink, the lane
/// sum) and n in the twin's one chain. (A tolerance against the twin alone fails once n
/// reaches the hundreds, on the twin's own summation error.)
#[test]
fn attention_softmax_matches_the_scalar_twin() {
    let scalar = Kernels::scalar();
    let mut rng = Rng(13);
    for k in simd_isas() {
        for n in (1..40).chain([64, 100, 1000]) {
            for (spread, sink) in [(4.0f32, f32::NEG_INFINITY), (30.0, 0.5), (120.0, f32::NEG_INFINITY), (1.0, 40.0)] {
                let x: Vec<f32> = (0..n).map(|_| rng.f32() * spread).collect();
                let (mut got, mut want) = (x.clone(), x.clone());
                k.softmax_with_sink(&mut got, sink);
                scalar.softmax_with_sink(&mut want, sink);
                // Both round v − max to f32 first (exact or not, it is the same number).
                let max = x.iter().copied().fold(sink, f32::max);
                let e = |v: f32| ((v - max) as f64).exp();
                let denom: f64 = x.iter().map(|&v| e(v)).sum::<f64>() + e(sink);
                for i in 0..n {
                    let exact = e(x[i]) / denom;
                    for (who, v, chain) in [(k.isa().name(), got[i], n / 8 + 11), ("scalar", want[i], n)] {
                        let tol = (chain + 8) as f64 * f32::EPSILON as f64 * exact + 1e-37;
                        assert!((v as f64 - exact).abs() <= tol, "{who} softmax n {n} spread {spread} sink {sink} [{i}] of {}: {v} vs {exact}", x[i]);
                    }
                }
            }
            let mut x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
            x[n / 2] = f32::NAN;
            k.softmax_with_sink(&mut x, f32::NEG_INFINITY);
            assert!(x.iter().all(|v| v.is_nan()), "{} softmax n {n}: a NaN score did not spread", k.isa().name());
        }
    }
}

/// `force_scalar` selects the reference kernels; otherwise the best instruction set this CPU
/// has is chosen, and it is one the CPU supports.
#[test]
fn selection_reports_the_instruction_set() {
    assert_eq!(Kernels::select(true).isa(), Isa::Scalar);
    let best = Kernels::select(false).isa();
    assert!(best.supported());
    let better = Isa::ALL.iter().skip_while(|&&i| i != best).skip(1).any(|i| i.supported());
    assert!(!better, "a better instruction set than {} is supported", best.name());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
        // The tiles where the CPU has them and the OS grants them (Isa::Amx.supported asks).
        assert_eq!(best, if Isa::Amx.supported() { Isa::Amx } else { Isa::Avx512 });
    }
    // The x86 decode tiles' prefetch scheme is chosen by vendor; the others have one.
    let want = if matches!(best, Isa::Avx2 | Isa::Avx512 | Isa::Amx) { Prefetch::for_this_cpu() } else { Prefetch::TileAfterNext };
    assert_eq!(Kernels::select(false).prefetch(), want);
    // The AVX-512 GEMM's token groups likewise; the other instruction sets have one rule.
    let groups = if best == Isa::Avx512 { TokenGroups::for_this_cpu() } else { TokenGroups::FitL2 };
    assert_eq!(Kernels::select(false).token_groups(), groups);
    println!("kernels: {} (prefetch {}, token groups {})", best.name(), want.name(), groups.name());
}

/// The decode tiles' prefetch schemes change when weight bytes arrive, never the arithmetic:
/// both give the same bits, on rows long and short (the own-rows scheme reaches past a row's
/// end into the next tile's), one vector and a few, with and without the split Q4B32 inputs.
#[test]
fn prefetch_schemes_give_the_same_bits() {
    let ks: Vec<Kernels> = [Isa::Avx2, Isa::Avx512, Isa::Amx].into_iter().filter_map(Kernels::with_isa).collect();
    if ks.is_empty() {
        common::skip("kernels", "this CPU has neither AVX2 nor AVX-512 (the instruction sets with a prefetch choice)");
        return;
    }
    let mut rng = Rng(0x5EED_F00D_0FA1_1E55);
    let pool = Pool::new(2).expect("a pool of two threads");
    for (k, dtype) in ks.iter().flat_map(|k| [(k, DType::Q8B32), (k, DType::Q4B32)]) {
        for (rows, cols) in [(37, 2048), (19, 8192), (8, 32), (24, 96), (3, 640)] {
            let data = random_matrix(dtype, rows, cols, &mut rng);
            let w = MatRef { dtype, rows, cols, data: &data };
            for n in [1, 2, 4, 7] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
                let [a, b] = Prefetch::ALL.map(|p| {
                    let kp = k.clone().with_prefetch(p).with_split_buffer(n * cols);
                    assert_eq!(kp.prefetch(), p, "{} takes either scheme", k.isa().name());
                    let mut y = vec![f32::NAN; n * rows];
                    kp.matmul(&pool, w, &x, n, &mut y);
                    (kernel_product(&kp, w, &x, n), y)
                });
                let isa = k.isa().name();
                assert!(bit_identical(&a.0, &b.0), "{isa} {dtype} {rows}x{cols} n={n}: rows differ between prefetch schemes");
                assert!(bit_identical(&a.1, &b.1), "{isa} {dtype} {rows}x{cols} n={n}: matmul differs between prefetch schemes");
            }
        }
    }
}

/// The AVX-512 GEMM's token-group rules change which vectors share a widened panel, never a
/// (row, vector) pair's arithmetic: both give the same bits, with input widths where the
/// L2-sized groups split a chunk (8,192 columns: 32 vectors a group) and chunks past one whole
/// group (130 vectors), Q4B32 with and without its split inputs.
#[test]
fn token_group_rules_give_the_same_bits() {
    let Some(k) = Kernels::with_isa(Isa::Avx512) else {
        common::skip("kernels", "this CPU has no AVX-512 (the instruction set with a token-group choice)");
        return;
    };
    let mut rng = Rng(0x70CE_6120_0B5E_EDED);
    let pool = Pool::new(2).expect("a pool of two threads");
    for dtype in [DType::F32, DType::BF16, DType::Q8B32, DType::Q4B32] {
        for (rows, cols, n) in [(37, 8192, 40), (19, 2048, 130), (5, 8192, 33)] {
            let data = random_matrix(dtype, rows, cols, &mut rng);
            let w = MatRef { dtype, rows, cols, data: &data };
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let [a, b] = TokenGroups::ALL.map(|g| {
                let kg = k.clone().with_token_groups(g);
                assert_eq!(kg.token_groups(), g, "AVX-512 takes either rule");
                let mut y = vec![f32::NAN; n * rows];
                kg.clone().with_split_buffer(n * cols).matmul(&pool, w, &x, n, &mut y);
                (kernel_product(&kg, w, &x, n), y)
            });
            assert!(bit_identical(&a.0, &b.0), "{dtype} {rows}x{cols} n={n}: rows differ between token-group rules");
            assert!(bit_identical(&a.1, &b.1), "{dtype} {rows}x{cols} n={n}: matmul differs between token-group rules");
            assert!(a.1.iter().all(|v| v.is_finite()), "{dtype} {rows}x{cols} n={n}: every output written");
        }
    }
}

/// `bench matmul` measures every dtype at 1 and N threads and the read bandwidth beside them
/// (a small shape here: the figures are printed, never asserted; only their presence is).
#[test]
fn bench_matmul_reports_every_dtype_at_each_thread_count() {
    use waste::kernels::bench::{self, MatmulBench};
    let opts = MatmulBench { rows: Some(67), cols: 256, bytes: 1 << 20, threads: 2, passes: 1, regions: 10,
        ..MatmulBench::default() };
    let r = bench::matmul(&opts).unwrap();
    assert_eq!(r.threads, [1, 2]);
    assert_eq!(r.read.len(), 2);
    // The multiply-add peaks the dtypes are held to, at each thread count.
    for peak in [&r.fma_peak, &r.int8_peak] {
        assert_eq!(peak.iter().map(|x| x.threads).collect::<Vec<_>>(), [1, 2]);
        assert!(peak.iter().all(|x| x.gmac_per_s.is_finite() && x.gmac_per_s > 0.0), "{peak:?}");
    }
    assert_eq!(r.dtypes.iter().map(|d| d.dtype).collect::<Vec<_>>(), DTYPES);
    for d in &r.dtypes {
        assert_eq!(d.bytes, 67 * d.dtype.row_bytes(256).unwrap() as usize);
        assert!(d.rates.iter().all(|x| x.gb_per_s.is_finite() && x.gb_per_s > 0.0), "{d:?}");
        // The read bandwidth probed beside this dtype's passes, at each thread count.
        assert_eq!(d.read.iter().map(|x| x.threads).collect::<Vec<_>>(), [1, 2], "{d:?}");
        assert!(d.read.iter().all(|x| x.gb_per_s.is_finite() && x.gb_per_s > 0.0 && x.secs > 0.0), "{d:?}");
    }
    let (status, out, err) = common::waste(&["bench", "matmul", "--rows", "33", "--cols", "64", "--bytes", "64K", "--passes", "1"]);
    assert_eq!(status, 0, "{err}");
    for name in ["read bandwidth", "f32 FMA peak", "int8 multiply-add peak", "GMAC/s", "F32", "BF16", "F16", "Q8B32", "Q4B32"] {
        assert!(out.contains(name), "{name} missing from:\n{out}");
    }
    let (status, _, err) = common::waste(&["bench", "matmul", "--cols", "100"]);
    assert_eq!(status, 2, "cols 100 is not a multiple of 32: {err}");

    // Expert-shaped products: as many whole matrices of `rows` rows as `bytes` holds (at
    // least one per thread), every byte of them counted.
    let experts = MatmulBench { experts: true, dtypes: vec![DType::Q4B32], ..opts };
    let r = bench::matmul(&experts).unwrap();
    let matrix = 67 * DType::Q4B32.row_bytes(256).unwrap() as usize;
    assert_eq!(r.dtypes[0].bytes, (1 << 20) / matrix * matrix);
    assert!(r.dtypes[0].rates.iter().all(|x| x.gb_per_s.is_finite() && x.gb_per_s > 0.0), "{:?}", r.dtypes[0]);
    assert_eq!(r.dtypes[0].read.len(), 2, "{:?}", r.dtypes[0]);
    let tiny = MatmulBench { bytes: 4096, ..experts.clone() };
    assert_eq!(bench::matmul(&tiny).unwrap().dtypes[0].bytes, 2 * matrix, "one matrix per thread at least");
    assert!(bench::matmul(&MatmulBench { rows: None, ..experts }).is_err(), "expert-shaped products need rows");
    let (status, _, err) = common::waste(&["bench", "matmul", "--experts", "--cols", "64"]);
    assert_eq!(status, 2, "--experts without --rows: {err}");
    assert!(err.contains("--rows"), "the error names the missing option: {err}");
}

/// `Options::force_scalar` reaches the model: it computes with the scalar reference and says
/// so, and the default model uses the best kernels this CPU has.
#[test]
fn a_model_reports_the_kernels_it_uses() {
    use waste::{Model, Options};
    let dir = common::fixture("oracles/llama_f32/model");
    let scalar = Model::open(&dir, &Options { threads: 1, force_scalar: true, ..Options::default() }).unwrap();
    assert_eq!(scalar.info().isa, "scalar");
    let best = Model::open(&dir, &Options { threads: 1, ..Options::default() }).unwrap();
    assert_eq!(best.info().isa, Kernels::select(false).isa().name());
}
