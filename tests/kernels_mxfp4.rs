//! The MXFP4 kernels (gpt-oss experts kept as 17-byte blocks: an e8m0 scale byte, then 32 e2m1
//! codes, the low nibble first): the SIMD kernels (decode tiles for one vector, the GEMM for
//! several) against the scalar twin, every scale byte and every code decoded exactly inside
//! every kernel, an MXFP4 row giving the bits of the same weights stored as BF16, and the
//! bit-identity of everything that only changes *when* work is done.

use crate::common;
use common::{assert_independent_of_vector_count_and_row_range, kernel_product, skip, Rng};
use waste::format::dtype::DType;
use waste::kernels::{Isa, Kernels, MatRef};

/// An e2m1 code's value from its bit fields (1 sign, 2 exponent, 1 mantissa; bias 1; exponent
/// 0 the subnormal 0.5·m), independently of the library's table.
fn e2m1(code: u8) -> f64 {
    let (e, m) = ((code >> 1) & 3, (code & 1) as f64);
    let mag = if e == 0 { 0.5 * m } else { (1.0 + 0.5 * m) * 2f64.powi(e as i32 - 1) };
    if code & 8 != 0 { -mag } else { mag }
}

/// The weights in f64 (exact: no MXFP4 value leaves f64's range); NaN under a 0xFF scale.
fn dequantize_f64(data: &[u8]) -> Vec<f64> {
    data.chunks_exact(17)
        .flat_map(|b| {
            let s = if b[0] == 0xFF { f64::NAN } else { 2f64.powi(b[0] as i32 - 127) };
            b[1..].iter().flat_map(move |&byte| [e2m1(byte & 15) * s, e2m1(byte >> 4) * s])
        })
        .collect()
}

/// A random MXFP4 matrix, its scale bytes drawn by `scale`.
fn random_mxfp4(rows: usize, cols: usize, rng: &mut Rng, scale: impl Fn(&mut Rng) -> u8) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * cols / 32 {
        out.push(scale(rng));
        (0..16).for_each(|_| out.push(rng.byte()));
    }
    out
}

/// Scale bytes mostly in gpt-oss's range (2⁻¹⁵ .. 2⁸), a quarter anywhere in 0..=255 (tiny,
/// subnormal, huge, NaN).
fn any_scale(rng: &mut Rng) -> u8 {
    if rng.byte() < 64 { rng.byte() } else { 112 + rng.byte() % 24 }
}

/// The scalar kernels and every SIMD set this CPU has.
fn all_kernels() -> Vec<Kernels> {
    let mut all = vec![Kernels::scalar()];
    all.extend(Isa::ALL.into_iter().filter(|&i| i != Isa::Scalar).filter_map(Kernels::with_isa));
    if all.len() == 1 {
        skip("mxfp4 kernels", "this CPU has no SIMD instruction set the engine uses (scalar checked alone)");
    }
    all
}

/// The same bits, or NaN both (a NaN's sign and payload are the hardware's choice).
fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

/// Every SIMD kernel agrees with the scalar twin within the rounding bound of
/// `tests/kernels.rs` (both multiply the same decoded weights by the same inputs and add them
/// in different orders), plus four subnormal spacings (2⁻¹⁴⁹) per term (a product and an
/// addition on each side): the small scales make products and partial sums subnormal, where
/// rounding is absolute, not relative. Scales stop at 2¹¹³ here so that no sum overflows in
/// one order and not in another; the huge and NaN scales are checked exactly below.
#[test]
fn mxfp4_simd_kernels_match_the_scalar_twin() {
    let scalar = Kernels::scalar();
    let mut rng = Rng(0x3F4F_0017_2026_1202);
    for k in all_kernels().into_iter().skip(1) {
        for (rows, cols) in [(1, 32), (3, 64), (7, 96), (37, 160), (5, 1024), (2, 2048)] {
            let data = random_mxfp4(rows, cols, &mut rng, |r| r.byte() % 241);
            let w = MatRef { dtype: DType::MXFP4, rows, cols, data: &data };
            let wf = dequantize_f64(&data);
            for n in [1, 2, 3, 4, 5, 9] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
                let (got, want) = (kernel_product(&k, w, &x, n), kernel_product(&scalar, w, &x, n));
                for t in 0..n {
                    for r in 0..rows {
                        let mag: f64 = (0..cols).map(|c| (wf[r * cols + c] * x[t * cols + c] as f64).abs()).sum();
                        // Each term: the decode's product (exact) and the multiply-add.
                        let terms = (cols + 2) as f64;
                        let tol = terms * (f32::EPSILON as f64 * mag + 2f64.powi(-147));
                        let (g, e) = (got[t * rows + r] as f64, want[t * rows + r] as f64);
                        assert!((g - e).abs() <= tol, "{} {rows}x{cols} n={n} t={t} r={r}: simd {g} scalar {e} (tol {tol:e})", k.isa().name());
                    }
                }
            }
        }
    }
}

/// Every scale byte (0..=255) with every code (0..=15), alone in its row, decodes exactly in
/// every kernel: rows of one block each, code `c` at one position under scale `s`, code 0
/// elsewhere, times the 32 one-hot vectors (together through the GEMM, then one at a time
/// through the decode tiles). The result is the value e2m1(c) · 2^(s − 127) rounded to f32 —
/// exact for every s up to 252, infinite where it leaves f32 — at the code's position, and 0
/// elsewhere, except that an infinite weight times a 0 input is NaN, and a 0xFF scale (NaN)
/// makes the whole block NaN, as the scalar twin does.
#[test]
fn every_scale_and_code_decodes_exactly_inside_every_kernel() {
    let cols = 32;
    let mut data = Vec::new();
    let mut want = Vec::new(); // per row: (scale byte, position, weight)
    for s in 0..=255u8 {
        for c in 0..16u8 {
            let pos = (2 * c as usize + s as usize) % 32;
            let mut block = [0u8; 17];
            block[0] = s;
            block[1 + pos / 2] = if pos.is_multiple_of(2) { c } else { c << 4 };
            data.extend_from_slice(&block);
            let weight = if s == 0xFF { f32::NAN } else { (e2m1(c) * 2f64.powi(s as i32 - 127)) as f32 };
            want.push((s, pos, weight));
        }
    }
    let rows = want.len();
    let w = MatRef { dtype: DType::MXFP4, rows, cols, data: &data };
    let n = 32;
    let mut x = vec![0f32; n * cols];
    (0..n).for_each(|t| x[t * cols + t] = 1.0);
    let scalar = kernel_product(&Kernels::scalar(), w, &x, n);
    for k in all_kernels() {
        let chunk = kernel_product(&k, w, &x, n);
        for t in 0..n {
            let one = kernel_product(&k, w, &x[t * cols..(t + 1) * cols], 1);
            for (r, &(s, pos, weight)) in want.iter().enumerate() {
                let expect = if s == 0xFF || (t != pos && !weight.is_finite()) { f32::NAN } else if t == pos { weight } else { 0.0 };
                for (how, got) in [("chunk", chunk[t * rows + r]), ("alone", one[r])] {
                    let ok = if expect.is_nan() { got.is_nan() } else { got == expect };
                    assert!(ok, "{} {how}: scale byte {s}, code {}, one-hot {t}: {got:e}, want {expect:e}", k.isa().name(), r % 16);
                }
            }
        }
        assert!(same(&chunk, &scalar), "{}: differs from the scalar twin", k.isa().name());
    }
}

/// An MXFP4 row is the bits of the same weights stored as BF16 (which holds every MXFP4
/// value exactly, infinities included), in each instruction set's BF16 sequence, for one
/// vector and for several: the MXFP4 kernels decode and multiply exactly as the dense ones do.
/// The AVX2 kernels take a block's weights in position order, as AVX2's BF16 rows do; the
/// AVX-512 ones split by parity (even positions, then odd: Q4B32's order), so their twin is
/// the AVX-512 BF16 kernel on weights and inputs permuted so; elsewhere the scalar twin.
#[test]
fn mxfp4_rows_are_the_bf16_rows_of_the_same_weights() {
    let mut rng = Rng(0xB16B_0017_2026_1202);
    for k in all_kernels() {
        let (twin, by_parity) = match k.isa() {
            Isa::Avx2 => (Kernels::with_isa(Isa::Avx2).unwrap(), false),
            Isa::Avx512 | Isa::Amx => (Kernels::with_isa(Isa::Avx512).unwrap(), true),
            _ => (Kernels::scalar(), false),
        };
        // Within each 32-column block: even positions, then odd (or as stored).
        let order = |c: usize| match (by_parity, c % 32) {
            (false, _) => c,
            (true, k) if k < 16 => c + k,
            (true, k) => c + k - 31,
        };
        for (rows, cols) in [(3, 64), (37, 160), (5, 1024), (30, 544), (101, 288)] {
            let data = random_mxfp4(rows, cols, &mut rng, any_scale);
            let wf = dequantize_f64(&data);
            let bf16: Vec<u8> = (0..rows * cols)
                .flat_map(|i| (((wf[i / cols * cols + order(i % cols)] as f32).to_bits() >> 16) as u16).to_le_bytes())
                .collect();
            let w = MatRef { dtype: DType::MXFP4, rows, cols, data: &data };
            let wb = MatRef { dtype: DType::BF16, rows, cols, data: &bf16 };
            for n in [1, 4, 9, 40] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
                let xb: Vec<f32> = (0..n * cols).map(|i| x[i / cols * cols + order(i % cols)]).collect();
                let (got, want) = (kernel_product(&k, w, &x, n), kernel_product(&twin, wb, &xb, n));
                assert!(same(&got, &want), "{} {rows}x{cols} n={n}: MXFP4 and BF16 differ", k.isa().name());
            }
        }
    }
}

/// The result for a (row, vector) pair is the same bits whatever else the call computes: the
/// vector alone or among others, the row alone or in any row range (shapes on both sides of
/// the GEMM's row groups, vector groups, spans and column chunks).
#[test]
fn mxfp4_results_do_not_depend_on_vector_count_or_row_range() {
    let mut rng = Rng(0xD1B5_0017_2026_1202);
    for k in all_kernels() {
        for (rows, cols, n) in [(11, 320, 9), (37, 992, 40), (18, 512, 33), (50, 1088, 70), (101, 544, 35)] {
            let data = random_mxfp4(rows, cols, &mut rng, any_scale);
            let w = MatRef { dtype: DType::MXFP4, rows, cols, data: &data };
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            assert_independent_of_vector_count_and_row_range(&k, w, &x, n, k.isa().name(), same);
        }
    }
}
