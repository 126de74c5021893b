//! AVX2 row kernels for a few vectors at once: an expert's share of a prefill chunk (about 8
//! of 128 tokens with top-8 of 128 experts), or a short prompt.
//!
//! The GEMM of [`super::avx2_gemm`] widens a panel of rows and keeps its accumulators in
//! memory, a cost that pays for itself over a whole chunk but not over two or four vectors,
//! where it ran slower than the one-vector decode tiles. These tiles keep 2 rows × up to 4
//! vectors in registers, decode each block once per tile, and read the inputs from memory
//! once per pair of rows (they stay in L1/L2 while [`FEW_INPUTS`] holds). Each (row, vector)
//! pair receives one fused multiply-add per 8 columns in column order from the decode tiles'
//! weight values and lane order, then [`hsum8`]: the arithmetic of [`super::avx2`]'s tiles and of the GEMM,
//! so the bits do not depend on which of the three ran. Quantized inputs must already be in
//! the decode order (Q4B32: split by parity, see `avx2::rows_q4b32`).

use super::avx2::{decode_f8, decode_mx, decode_q4_part, decode_q8, hsum8, load_bf16, load_f16, load_f32, prefetch_l2, prefetch_span};
use super::MatRef;
use std::arch::x86_64::*;

/// Largest input (vectors × columns × 4 bytes) given to these tiles rather than the GEMM: 8
/// vectors of 2048 columns, 2 of 8192. Measured with the AVX2 kernels on a Zen 4 host (no
/// AVX2-only host was at hand; BENCHMARKS, 2026-12-03): against the GEMM, 2 vectors of 2048
/// columns ran 1.3–2× its GMAC/s, 8 vectors 1.03–1.19×, 16 slower (0.7–0.93×).
pub(crate) const FEW_INPUTS: usize = 64 << 10;

/// [`FEW_INPUTS`] for Q4B32, whose blocks cost the most to decode and so gain the most from
/// the GEMM's decoding each block once for every vector: `waste bench matmul --isa avx2
/// --experts --tokens N --threads 1` on a Zen 4 host (BENCHMARKS, 2026-12-04), the tiles ran
/// level with the GEMM at 4 vectors of 2048 columns and 8 of 768 (about 32 KiB of inputs),
/// 0.65–0.85× its GMAC/s at 8 of 2048 and 16 of 768, and ahead below.
pub(crate) const FEW_INPUTS_Q4: usize = 32 << 10;

/// Dense tiles: `$load(ptr)` widens 8 stored weights to f32; the last partial 8 columns are
/// zero-padded on both sides, as the decode tiles do.
macro_rules! dense_few {
    ($name:ident, $elem:ty, $load:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &[f32], t0: usize, out: &mut [[f32; T]; R]) {
            let cols = w.cols;
            let (wp, xp) = (w.data.as_ptr() as *const $elem, x.as_ptr());
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            let full = cols / 8 * 8;
            let mut c = 0;
            // SAFETY (all loads): rows r..r+R and vectors t0..t0+T exist (the driver's
            // contract) and c + 8 <= cols.
            while c < full {
                for (i, row) in acc.iter_mut().enumerate() {
                    prefetch_l2(wp.wrapping_add((r + i + 2 * R) * cols + c) as *const u8);
                    let wv = unsafe { $load(wp.add((r + i) * cols + c)) };
                    for (t, a) in row.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(wv, unsafe { _mm256_loadu_ps(xp.add((t0 + t) * cols + c)) }, *a);
                    }
                }
                c += 8;
            }
            if c < cols {
                let k = cols - c;
                for (i, row) in acc.iter_mut().enumerate() {
                    let mut wpad = [<$elem>::default(); 8];
                    // SAFETY: k values remain in row r + i and in each vector.
                    unsafe { std::ptr::copy_nonoverlapping(wp.add((r + i) * cols + c), wpad.as_mut_ptr(), k) };
                    let wv = unsafe { $load(wpad.as_ptr()) };
                    for (t, a) in row.iter_mut().enumerate() {
                        let mut xpad = [0f32; 8];
                        // SAFETY: as above, k values remain in vector t0 + t.
                        unsafe { std::ptr::copy_nonoverlapping(xp.add((t0 + t) * cols + c), xpad.as_mut_ptr(), k) };
                        *a = _mm256_fmadd_ps(wv, unsafe { _mm256_loadu_ps(xpad.as_ptr()) }, *a);
                    }
                }
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                for (v, s) in o.iter_mut().zip(a) {
                    *v = hsum8(*s);
                }
            }
        }
    };
}

/// Quantized tiles: `$part(block_ptr, k)` gives quarter `k` of a block's 32 scaled weights as
/// an 8-lane vector. The tile takes a block a quarter at a time: that quarter of every row,
/// then each vector's matching 8 inputs, loaded once and multiplied into every row. Each
/// (row, vector) pair still receives the quarters in order; a whole block decoded up front
/// (four vectors per row) left too few of the 16 registers for the accumulators, and Q4B32's
/// tile kept one on the stack (BENCHMARKS, 2026-12-04). The other formats pass
/// `|p, k| decode(p)[k]`: `k` is a constant once the loop over quarters is unrolled, so only
/// quarter `k`'s operations remain and what the quarters share is computed once (the
/// disassembly has one scale product per quarter and row, not four).
macro_rules! block_few {
    ($name:ident, $bytes:expr, $part:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &[f32], t0: usize, out: &mut [[f32; T]; R]) {
            let (cols, rb) = (w.cols, w.row_bytes());
            let (wp, xp) = (w.data.as_ptr(), x.as_ptr());
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            for b in 0..rb / $bytes {
                prefetch_span(wp.wrapping_add((r + 2 * R) * rb + b * R * $bytes), R * $bytes);
                for k in 0..4 {
                    // SAFETY: block b of rows r..r+R lies inside the matrix, and each vector
                    // holds cols = 32 × blocks values (the driver's contract).
                    let q: [__m256; R] = std::array::from_fn(|i| unsafe { $part(wp.add((r + i) * rb + b * $bytes), k) });
                    for t in 0..T {
                        // SAFETY: as above, block b of vector t0 + t.
                        let xv = unsafe { _mm256_loadu_ps(xp.add((t0 + t) * cols + b * 32 + 8 * k)) };
                        for (a, qi) in acc.iter_mut().zip(&q) {
                            a[t] = _mm256_fmadd_ps(*qi, xv, a[t]);
                        }
                    }
                }
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                for (v, s) in o.iter_mut().zip(a) {
                    *v = hsum8(*s);
                }
            }
        }
    };
}

dense_few!(few_f32, f32, load_f32);
dense_few!(few_bf16, u16, load_bf16);
dense_few!(few_f16, u16, load_f16);
block_few!(few_q8b32, 34, |p, k| decode_q8(p)[k]);
block_few!(few_q4b32, 18, decode_q4_part);
block_few!(few_f8b32, 36, |p, k| decode_f8(p)[k]);
block_few!(few_mxfp4, 17, |p, k| decode_mx(p)[k]);

// The row drivers: pairs of rows, four vectors at a time (2 × 4 accumulators, a quarter block
// of each row and an input vector fit the 16 registers). Only their several-vector branch runs.
row_driver!("avx2,fma,f16c", rows_f32, few_f32, 4, 2);
row_driver!("avx2,fma,f16c", rows_bf16, few_bf16, 4, 2);
row_driver!("avx2,fma,f16c", rows_f16, few_f16, 4, 2);
row_driver!("avx2,fma,f16c", rows_q8b32, few_q8b32, 4, 2);
row_driver!("avx2,fma,f16c", rows_q4b32, few_q4b32, 4, 2);
row_driver!("avx2,fma,f16c", rows_f8b32, few_f8b32, 4, 2);
row_driver!("avx2,fma,f16c", rows_mxfp4, few_mxfp4, 4, 2);
