//! The integer-activation paths (`Options::activations`), int8
//! (`Kernels::with_int8_activations`), int16 (`Kernels::with_int16_activations`) and int21
//! (`Kernels::with_int21_activations`, Q4B32 only): every SIMD kernel equals its scalar twin bit for bit (the
//! integer dot products are exact and the f32 operations run in the same order), each path
//! stays within the proven activation-rounding bound of the exact product, and nothing that
//! only changes *when* work is done — vectors per call, row range, thread count, grouping,
//! prefill chunking — changes a bit.

use crate::common;
use common::{random_matrix, Rng};
use waste::format::dtype::DType;
use waste::kernels::{Int8Isa, Isa, Kernels, MatRef, Pool, Prefetch};

const WIDTHS: [DType; 2] = [DType::Q8B32, DType::Q4B32];

/// The weight at (r, c) as f64, decoded from the format's definition (seed 000).
fn weight(dtype: DType, data: &[u8], cols: usize, r: usize, c: usize) -> f64 {
    let (bytes, b, k) = (if dtype == DType::Q8B32 { 34 } else { 18 }, c / 32, c % 32);
    let blk = &data[(r * cols / 32 + b) * bytes..][..bytes];
    let scale = half::f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f64();
    let q = if dtype == DType::Q8B32 {
        blk[2 + k] as i8 as i32
    } else {
        (((blk[2 + k / 2] >> (4 * (k % 2))) & 0x0f) as i32 ^ 8) - 8
    };
    q as f64 * scale
}

/// Activations with the cases that matter: ordinary values, a block with one large outlier,
/// an all-zero block, tiny values, exact ties of the rounding.
fn activations(len: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..len).map(|_| rng.f32()).collect();
    for (b, blk) in x.chunks_mut(32).enumerate() {
        match b % 5 {
            1 => blk[(b * 7) % 32] = 40.0,
            2 => blk.fill(0.0),
            3 => blk.iter_mut().for_each(|v| *v *= 1e-30),
            4 => blk.iter_mut().enumerate().for_each(|(i, v)| *v = (i as f32 - 16.0) * 0.5),
            _ => {}
        }
    }
    x
}

/// One integer path: its name, its largest quantized level, and how to turn it on.
#[derive(Clone, Copy)]
struct Path {
    name: &'static str,
    level: f64,
    on: fn(Kernels) -> Kernels,
    /// The weight dtypes the path takes (int21's sums would overflow with Q8B32 bytes).
    dtypes: &'static [DType],
}

impl Path {
    /// The path's kernels, as `Kernels` reports them (`k` has this path on).
    fn isa(&self, k: &Kernels) -> Option<Int8Isa> {
        k.integer_isa()
    }

    /// The path on each instruction set this CPU has, each set's kernels once (scalar first).
    fn kernels(&self) -> Vec<Kernels> {
        let mut all: Vec<Kernels> = Vec::new();
        for k in Isa::ALL.into_iter().filter_map(Kernels::with_isa).map(self.on) {
            if !all.iter().any(|a| self.isa(a) == self.isa(&k)) {
                all.push(k);
            }
        }
        if all.len() == 1 {
            common::skip("kernels_integer", &format!("this CPU has no SIMD {} kernels: only the scalar twin is checked", self.name));
        }
        all
    }
}

/// int21 once per prefetch scheme: the AVX-512 kernel has a form for each (only when bytes
/// arrive differs; the bits must not).
const PATHS: [Path; 4] = [
    Path { name: "int8", level: 127.0, on: |k| k.with_int8_activations(0), dtypes: &WIDTHS },
    Path { name: "int16", level: 32767.0, on: |k| k.with_int16_activations(0), dtypes: &WIDTHS },
    Path { name: "int21", level: 2_080_768.0, on: |k| k.with_prefetch(Prefetch::OwnRows).with_int21_activations(0), dtypes: &[DType::Q4B32] },
    Path { name: "int21 (next group)", level: 2_080_768.0, on: |k| k.with_int21_activations(0).with_prefetch(Prefetch::TileAfterNext),
           dtypes: &[DType::Q4B32] },
];

/// Every (path, kernels) pair this CPU runs.
fn all_kernels() -> Vec<(Path, Kernels)> {
    PATHS.iter().flat_map(|p| p.kernels().into_iter().map(move |k| (*p, k))).collect()
}

fn product(k: &Kernels, w: MatRef, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * w.rows];
    k.rows(w, 0, w.rows, x, n, &mut y, w.rows);
    y
}

fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn the_path_is_chosen_per_instruction_set() {
    assert_eq!(Kernels::select(true).with_int8_activations(64).int8_isa(), Some(Int8Isa::Scalar));
    assert_eq!(Kernels::select(false).int8_isa(), None);
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(k) = Kernels::with_isa(Isa::Avx2) {
            assert_eq!(k.with_int8_activations(64).int8_isa(), Some(Int8Isa::Avx2));
        }
        if std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512vbmi") {
            let k = Kernels::select(false).with_int8_activations(64);
            assert_eq!(k.int8_isa(), Some(Int8Isa::Avx512Vnni));
        } else {
            common::skip("the_path_is_chosen_per_instruction_set", "no AVX-512 VNNI + VBMI: the VNNI kernels are not run here");
        }
    }
    // int16: the kernels of the instruction set int8 would use (AVX-512 VNNI, or AVX2 — with
    // AVX-VNNI's `vpdpwssd` where the CPU has it), the scalar twins elsewhere; one path at a time.
    assert_eq!(Kernels::select(true).with_int16_activations(64).int16_isa(), Some(Int8Isa::Scalar));
    let both = Kernels::select(false).with_int8_activations(64).with_int16_activations(64);
    assert_eq!((both.int8_isa().is_some(), both.int16_isa().is_some()), (false, true));
    for k in Isa::ALL.into_iter().filter_map(Kernels::with_isa) {
        let want = k.clone().with_int8_activations(64).int8_isa();
        assert_eq!(k.clone().with_int16_activations(64).int16_isa(), want);
        // int21 too (and its decode-only form), each replacing the path before it.
        let int21 = k.clone().with_int16_activations(64).with_int21_activations(64);
        assert_eq!((int21.int16_isa(), int21.int21_isa(), int21.integer_isa()), (None, want, want));
        assert_eq!(k.with_int21_decode(64).int21_isa(), want);
    }
}

/// The SIMD integer kernels (int8 and int16: AVX-512 VNNI, AVX2) equal the scalar
/// twin bit for bit: each integer partial is exact, its conversion to f32 is the same rounding
/// of the same integer, and the scale product, the fused multiply-adds and the final sum run
/// in the same order.
#[test]
fn simd_integer_kernels_equal_the_scalar_twin_bit_for_bit() {
  for path in PATHS {
    let all = path.kernels();
    let scalar = &all[0];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for &dtype in path.dtypes {
        for (rows, cols) in [(1, 32), (3, 64), (7, 96), (37, 160), (9, 1056), (5, 1024), (2, 2048), (17, 6144)] {
            let data = random_matrix(dtype, rows, cols, &mut rng);
            let w = MatRef { dtype, rows, cols, data: &data };
            // Vector counts on both sides of the prefill kernel's group of 32.
            let counts: &[usize] = if rows * cols <= 37 * 160 { &[1, 2, 3, 4, 5, 9, 33, 40] } else { &[1, 2, 3, 4, 5, 9] };
            for &n in counts {
                let x = activations(n * cols, &mut rng);
                let want = product(scalar, w, &x, n);
                for k in &all[1..] {
                    let got = product(k, w, &x, n);
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(g.to_bits(), e.to_bits(), "{} {:?} {dtype} {rows}x{cols} n={n} element {i}: {g} vs scalar {e}",
                            path.name, path.isa(k));
                    }
                }
            }
        }
    }
  }
}

/// Every integer kernel against the exact (f64) product of the same weights and the
/// *unquantized* activations. Quantizing block b rounds each x to a multiple of
/// d_b = max|x|/L (L = 127 for int8, 32767 for int16; ties to even), an error of at most d_b/2
/// (plus a relative 2⁻²² from the scaled rounding), so the exact path value differs from the
/// exact product by at most Σ_b (d_b/2)·Σ_k |w_k|. Its f32 evaluation adds at most
/// (blocks + 6)·2⁻²⁴·Σ|w_k·d_b·q_k| (one rounding for the scale product, one for an int16
/// block sum's conversion, one per fused multiply-add along a lane, three in int8's final
/// tree) — Higham §3.1.
/// The f32 path is held to its own bound (cols + blocks + 2)·2⁻²⁴·Σ|w·x|, so the two paths
/// differ by at most the sum. A wrong lane layout, a lost offset correction or a swapped
/// nibble is off by whole products, far above these bounds for this data.
#[test]
fn integer_paths_stay_within_the_activation_rounding_bound() {
  for path in PATHS {
    let f32_path = Kernels::select(false);
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let mut worst = 0.0f64;
    for k in path.kernels() {
        for &dtype in path.dtypes {
            for (rows, cols) in [(7, 96), (13, 576), (3, 2048)] {
                let data = random_matrix(dtype, rows, cols, &mut rng);
                let w = MatRef { dtype, rows, cols, data: &data };
                let n = 3;
                let x = activations(n * cols, &mut rng);
                let (got, f32y) = (product(&k, w, &x, n), product(&f32_path, w, &x, n));
                let eps = f32::EPSILON as f64 / 2.0;
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for r in 0..rows {
                        let (mut exact, mut quant, mut mag8, mut mag) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
                        for (b, xb) in xt.chunks(32).enumerate() {
                            let d = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / path.level;
                            for (i, &v) in xb.iter().enumerate() {
                                let wv = weight(dtype, &data, cols, r, b * 32 + i);
                                exact += wv * v as f64;
                                quant += wv.abs() * d * (0.5 + 1e-4);
                                mag8 += (wv * (v as f64 + d)).abs();
                                mag += (wv * v as f64).abs();
                            }
                        }
                        let blocks = (cols / 32) as f64;
                        let bound8 = quant + (blocks + 6.0) * eps * mag8 + 1e-30;
                        let bound32 = (cols as f64 + blocks + 2.0) * eps * mag;
                        let (g, f) = (got[t * rows + r] as f64, f32y[t * rows + r] as f64);
                        assert!((g - exact).abs() <= bound8, "{} {:?} {dtype} {rows}x{cols} t={t} r={r}: {g}, exact {exact}, bound {bound8:e}",
                            path.name, path.isa(&k));
                        assert!((g - f).abs() <= bound8 + bound32, "{} {:?} {dtype}: {g} vs f32 path {f}", path.name, path.isa(&k));
                        worst = worst.max((g - exact).abs() / bound8);
                    }
                }
            }
        }
    }
    // The bound is a worst case: random rounding errors cancel, and the test reports how much.
    println!("{} path: largest error / bound = {worst:.3}", path.name);
    assert!(worst > 0.0, "the {} path equals the exact product: the test data exercise no rounding", path.name);
  }
}

/// Non-finite activations come out NaN, as the f32 path's would, rather than as a finite
/// number computed from a zeroed block.
#[test]
fn a_non_finite_activation_makes_the_product_nan() {
    let mut rng = Rng(5);
    for (path, k) in all_kernels() {
        for &dtype in path.dtypes {
            let data = random_matrix(dtype, 3, 64, &mut rng);
            let w = MatRef { dtype, rows: 3, cols: 64, data: &data };
            let mut x = activations(64, &mut rng);
            x[40] = f32::INFINITY;
            assert!(product(&k, w, &x, 1).iter().all(|v| v.is_nan()), "{} {:?} {dtype}", path.name, path.isa(&k));
        }
    }
}

/// A (row, vector) result is the same bits whatever else the call computes: the vector alone
/// or among others, the row alone or in any row range.
#[test]
fn integer_results_do_not_depend_on_vector_count_or_row_range() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for (path, k) in all_kernels() {
        for &dtype in path.dtypes {
          // Shapes on both sides of the kernels' groups (16 rows, 8 to 32 vectors, 256 to 1024
          // columns), odd block counts included.
          for (rows, cols, n) in [(19, 320, 9), (37, 1056, 40), (18, 544, 33)] {
            let data = random_matrix(dtype, rows, cols, &mut rng);
            let w = MatRef { dtype, rows, cols, data: &data };
            let x = activations(n * cols, &mut rng);
            let whole = product(&k, w, &x, n);
            for t in 0..n {
                let one = product(&k, w, &x[t * cols..(t + 1) * cols], 1);
                assert!(bits_equal(&one, &whole[t * rows..(t + 1) * rows]), "{} {:?} {dtype}: vector {t} alone differs", path.name, path.isa(&k));
            }
            for m in [2, 3, 5] {
                let part = product(&k, w, &x[..m * cols], m);
                assert!(bits_equal(&part, &whole[..m * rows]), "{} {:?} {dtype}: first {m} vectors differ", path.name, path.isa(&k));
            }
            for split in [1, 2, 3, 5, 8, 9, 17] {
                let mut y = vec![f32::NAN; n * rows];
                k.rows(w, 0, split, &x, n, &mut y, rows);
                k.rows(w, split, rows, &x, n, &mut y, rows);
                assert!(bits_equal(&y, &whole), "{} {:?} {dtype}: split at row {split} differs", path.name, path.isa(&k));
            }
          }
        }
    }
}

/// The pooled integer-path product is bit-identical at 1..4 threads (the input is quantized
/// once, on the calling thread, and rows are split), and a group equals its products made one
/// by one.
#[test]
fn integer_threads_and_groups_do_not_change_the_bits() {
  for path in PATHS {
    let mut rng = Rng(99);
    let k = (path.on)(Kernels::select(false));
    let pools: Vec<Pool> = (1..=4).map(|t| Pool::new(t).unwrap()).collect();
    let cols = 256;
    let mats: Vec<(DType, usize, Vec<u8>)> = [(DType::Q4B32, 203), (DType::Q8B32, 129), (DType::BF16, 67)]
        .iter()
        .map(|&(d, rows)| {
            let data = if d == DType::BF16 {
                (0..rows * cols).flat_map(|_| ((rng.f32().to_bits() >> 16) as u16).to_le_bytes()).collect()
            } else {
                random_matrix(d, rows, cols, &mut rng)
            };
            (d, rows, data)
        })
        .collect();
    let views: Vec<MatRef> = mats.iter().map(|(d, r, data)| MatRef { dtype: *d, rows: *r, cols, data }).collect();
    for n in [1, 4, 7] {
        let x = activations(n * cols, &mut rng);
        for w in &views {
            let mut base = vec![0.0; n * w.rows];
            k.matmul(&pools[0], *w, &x, n, &mut base);
            assert!(bits_equal(&base, &product(&k, *w, &x, n)));
            for p in &pools[1..] {
                let mut y = vec![f32::NAN; n * w.rows];
                k.matmul(p, *w, &x, n, &mut y);
                assert!(bits_equal(&y, &base), "{} {} n={n}: {} threads differ", path.name, w.dtype, p.threads());
            }
        }
        for p in &pools {
            let mut outs: Vec<Vec<f32>> = views.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
            {
                let mut items: Vec<(MatRef, &mut [f32])> = views.iter().copied().zip(outs.iter_mut().map(|o| &mut o[..])).collect();
                k.matmul_group(p, &x, n, &mut items);
            }
            for (w, got) in views.iter().zip(&outs) {
                assert!(bits_equal(got, &product(&k, *w, &x, n)), "{} {} n={n}: grouped on {} threads differs", path.name, w.dtype, p.threads());
            }
        }
    }
  }
}

/// The SIMD activation quantizer writes the scalar one's bytes and scales bit for bit
/// (ordinary, outlier, zero, tiny, tie and non-finite blocks).
#[test]
fn the_simd_quantizer_equals_the_scalar_one() {
    use waste::kernels::int8::quantize_with;
    let mut rng = Rng(17);
    let mut x = activations(32 * 40, &mut rng);
    x[32 * 37 + 3] = f32::NAN;
    x[32 * 38 + 30] = f32::NEG_INFINITY;
    x[32 * 39..].iter_mut().enumerate().for_each(|(i, v)| *v = if i == 0 { 127.0 } else { (i as f32 - 16.0) + 0.5 });
    let run = |isa| {
        let (mut q, mut d) = (vec![0x55i8; x.len()], vec![-1.0f32; x.len() / 32]);
        quantize_with(isa, &x, &mut q, &mut d);
        (q, d)
    };
    let (q0, d0) = run(Int8Isa::Scalar);
    assert!(d0[37].is_nan() && d0[38].is_nan() && d0[2] == 0.0 && d0[39] == 1.0, "{d0:?}");
    let mut checked = 0;
    for isa in [Int8Isa::Avx2, Int8Isa::Avx512Vnni].into_iter().filter(|i| i.supported()) {
        let (q, d) = run(isa);
        assert_eq!(q, q0, "{isa:?}");
        assert!(d.iter().zip(&d0).all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())), "{isa:?}: {d:?}");
        checked += 1;
    }
    // The int16 quantizer of the VNNI kernels, the same blocks.
    let run16 = |isa| {
        let (mut q, mut d) = (vec![0x5555i16; x.len()], vec![-1.0f32; x.len() / 32]);
        waste::kernels::int16::quantize_with(isa, &x, &mut q, &mut d);
        (q, d)
    };
    let (q0, d0) = run16(Int8Isa::Scalar);
    assert!(d0[37].is_nan() && d0[38].is_nan() && d0[2] == 0.0, "{d0:?}");
    assert_eq!(&q0[32 * 2..32 * 3], &[0; 32]);
    if Int8Isa::Avx512Vnni.supported() {
        let (q, d) = run16(Int8Isa::Avx512Vnni);
        assert_eq!(q, q0, "int16");
        assert!(d.iter().zip(&d0).all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())), "int16: {d:?}");
        checked += 1;
    }
    // The int21 quantizer (AVX2, which the AVX-512 kernels take too): the scalar one's bytes
    // and scales, its zero and non-finite blocks, and every value within its rounding.
    let run21 = |isa| {
        let (mut q, mut d) = (vec![waste::kernels::int21::Digits([0x55; 3]); x.len()], vec![-1.0f32; x.len() / 32]);
        waste::kernels::int21::quantize_with(isa, &x, &mut q, &mut d);
        (q, d)
    };
    let (q21, d21) = run21(Int8Isa::Scalar);
    if Int8Isa::Avx2.supported() {
        let (q, d) = run21(Int8Isa::Avx2);
        assert_eq!(q, q21, "int21");
        assert!(d.iter().zip(&d21).all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())), "int21: {d:?}");
        checked += 1;
    }
    assert!(d21[37].is_nan() && d21[38].is_nan() && d21[2] == 0.0, "{d21:?}");
    assert!(q21[32 * 2..32 * 3].iter().all(|v| v.0 == [0; 3]));
    for (b, blk) in q21.chunks(32).enumerate().filter(|(b, _)| d21[*b].is_finite()) {
        for k in 0..32 {
            let v = waste::kernels::int21::value_at(blk, k) as f32 * d21[b];
            // Half a step, and the f32 product x · (L / max)'s own rounding (2⁻²⁴ of up to
            // L = 2²¹ steps) and X · d's.
            let bound = d21[b] * 0.5 + x[b * 32 + k].abs() * 2.4e-7;
            assert!((v - x[b * 32 + k]).abs() <= bound, "int21 block {b} position {k}: {v} vs {}", x[b * 32 + k]);
        }
    }
    if checked == 0 {
        common::skip("the_simd_quantizer_equals_the_scalar_one", "no SIMD quantizer on this CPU");
    }
}

/// `rows_alone` — an MoE participant computing whole products on its own — quantizes into
/// the caller's room when it holds the inputs, and takes turns at the kernels' buffer when it
/// does not: the same bits as `rows` either way, for every vector count.
#[test]
fn integer_rows_alone_equal_rows_with_and_without_room() {
    let mut rng = Rng(0x51_7CC1_B727_220A);
    for (path, k) in all_kernels() {
        for &dtype in path.dtypes {
            let (rows, cols) = (37, 320);
            let data = random_matrix(dtype, rows, cols, &mut rng);
            let w = MatRef { dtype, rows, cols, data: &data };
            // No vectors, or no rows: nothing is read or written.
            let x = activations(cols, &mut rng);
            let mut y = vec![f32::NAN; rows];
            k.rows(w, 0, rows, &x[..0], 0, &mut y, rows);
            k.rows(w, 5, 5, &x, 1, &mut y, rows);
            assert!(y.iter().all(|v| v.is_nan()), "{} {dtype}: an empty call wrote", path.name);
            for n in [1, 3, 8, 40] {
                let x = activations(n * cols, &mut rng);
                let want = product(&k, w, &x, n);
                for room in [n * cols, 0] {
                    let mut split = vec![f32::NAN; room];
                    let mut y = vec![f32::NAN; n * rows];
                    k.rows_alone(w, &x, n, &mut y, &mut split);
                    assert!(bits_equal(&y, &want), "{} {:?} {dtype} n={n} room={room}", path.name, path.isa(&k));
                    // The room was used exactly when it was given.
                    assert_eq!(split.iter().any(|v| !v.is_nan()), room > 0, "{} {dtype} n={n} room={room}", path.name);
                }
            }
        }
    }
}
