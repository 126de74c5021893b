//! The int16-activation path (`Options::activations`) for Q8B32 and Q4B32 weights: each
//! input vector of a product is quantized once, before the parallel region, to blocks of 32
//! signed 16-bit integers with an f32 scale, and each weight block meets its activation block
//! as an exact integer dot product. Against the int8 path ([`super::int8`]) the rounding of an
//! activation is bounded by 1/65534 of its block's largest |x| instead of 1/254 (issue 13's
//! accuracy for an integer default); against f32 activations the weights' products become
//! `vpdpwssd`, 32 multiply-adds per instruction where the f32 FMA does 16.
//!
//! The arithmetic, which every instruction set follows exactly (the SIMD kernels equal their
//! scalar twins bit for bit, and a result does not depend on how many vectors or which rows a
//! call computes):
//! - activation block: `d = max|x| / 32767`, `q = round_half_even(x · (32767 / max|x|))`, in
//!   −32767..=32767 (`d = 0` and `q = 0` for an all-zero block; `d = NaN` when the block holds
//!   a non-finite value, so the product comes out NaN as the f32 path's would);
//! - per row and weight block `b`: `S = Σ_k w[k]·q[k]` over the block's 32 positions, an exact
//!   integer (|S| ≤ 32·128·32767 < 2³¹), whatever order the instructions add in;
//! - `c = f16_to_f32(w_scale) · d` (one f32 multiply), then `acc = fma(f32(S), c, acc)` — one
//!   accumulator per row, blocks in order from `acc = 0`; `f32(S)` rounds to nearest, ties to
//!   even (exact below 2²⁴);
//! - the result is `acc`.
//!
//! One accumulator per row, with no lanes to sum at the end, is what lets the x86 kernels put
//! *rows* in a register's lanes (sixteen with AVX-512, eight with AVX2) and broadcast the
//! activations: a block then costs one integer instruction per pair of positions and one
//! conversion and one fused multiply-add per sixteen rows, the same for one vector or many.

use super::int8::{quantize_block_to, quantize_blocks, scalar_rows_by, Acts, Int8Isa, QuantizeFn};
use super::scalar::F16_TO_F32;
use super::MatRef;
use crate::format::dtype::BLOCK;

/// Row kernel of the int16 path: rows `r0..r1` of `w` (Q8B32 or Q4B32) against the `n`
/// quantized vectors of `x`, writing `y[t * y_stride + r]`.
///
/// # Safety
/// As [`super::RowsFn`], with `x.cols == w.cols`, `x.q.len() >= n * w.cols` and
/// `x.d.len() >= n * w.cols / 32`.
pub type Int16RowsFn = unsafe fn(w: &MatRef, r0: usize, r1: usize, x: &Acts<i16>, n: usize, y: *mut f32, y_stride: usize);

/// Quantizes one block of 32 activations into `q`, returning its scale `d` (see the module
/// comment for the rule, and [`super::int8::quantize_block_to`], which both paths share).
pub fn quantize_block(x: &[f32], q: &mut [i16]) -> f32 {
    quantize_block_to(x, q)
}

/// The scalar [`QuantizeFn`], block by block with [`quantize_block`].
///
/// # Safety
/// None beyond the signature.
pub unsafe fn quantize_scalar(x: &[f32], q: &mut [i16], d: &mut [f32]) {
    for ((xb, qb), d) in x.chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK)).zip(d) {
        *d = quantize_block(xb, qb);
    }
}

/// The quantizer and the (Q8B32, Q4B32) kernels of the int16 path that go with `isa`: AVX-512
/// VNNI where the int8 path would use it; AVX2 where it uses AVX2, with AVX-VNNI's
/// `vpdpwssd` when the CPU has it ([`super::int16_avx2`]); else the scalar twins (no NEON
/// int16 kernels are written).
pub(super) fn kernels(isa: Int8Isa) -> (Int8Isa, QuantizeFn<i16>, Int16RowsFn, Int16RowsFn) {
    #[cfg(target_arch = "x86_64")]
    use super::int16_avx2 as avx2;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx512Vnni => (isa, super::int16_x86::quantize, super::int16_x86::rows_q8, super::int16_x86::rows_q4),
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx2 if super::has_avx_vnni() => (isa, avx2::quantize, avx2::vnni::rows_q8, avx2::vnni::rows_q4),
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx2 => (isa, avx2::quantize, avx2::madd::rows_q8, avx2::madd::rows_q4),
        _ => (Int8Isa::Scalar, quantize_scalar, rows_q8, rows_q4),
    }
}

/// Quantizes whole blocks of `x` with the int16 quantizer of `isa` (which this CPU must
/// support, else the scalar one runs): for tests that compare the two.
pub fn quantize_with(isa: Int8Isa, x: &[f32], q: &mut [i16], d: &mut [f32]) {
    let f = if isa.supported() { kernels(isa).1 } else { quantize_scalar as QuantizeFn<i16> };
    // SAFETY: the ISA was checked.
    unsafe { quantize_blocks(f, x, q, d) }
}

/// One row against one quantized vector, in the module's order; `weight(block, k)` is the
/// signed value at position `k` of the row's block, `value(i)` the vector's quantized value at
/// column `i` (also the rule of [`super::int21`], whose values are wider).
#[inline]
pub(super) fn row_dot(blocks: usize, scale_bits: impl Fn(usize) -> u16, weight: impl Fn(usize, usize) -> i32, value: impl Fn(usize) -> i32,
                      d: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for b in 0..blocks {
        let c = F16_TO_F32[scale_bits(b) as usize] * d[b];
        let s: i32 = (0..BLOCK).map(|k| weight(b, k) * value(b * BLOCK + k)).sum();
        acc = (s as f32).mul_add(c, acc);
    }
    acc
}

macro_rules! scalar_rows {
    ($name:ident, $bytes:expr, $weight:expr) => {
        /// Scalar twin of the int16-path kernels (see [`Int16RowsFn`]).
        ///
        /// # Safety
        /// As [`Int16RowsFn`].
        pub unsafe fn $name(w: &MatRef, r0: usize, r1: usize, x: &Acts<i16>, n: usize, y: *mut f32, y_stride: usize) {
            // SAFETY: forwarded contract.
            unsafe {
                scalar_rows_by(w, r0, r1, x, n, y, y_stride, $bytes, |row, q, d| {
                    row_dot(row.len() / $bytes, |b| u16::from_le_bytes([row[b * $bytes], row[b * $bytes + 1]]),
                        |b, k| $weight(&row[b * $bytes..(b + 1) * $bytes], k), |i| q[i] as i32, d)
                })
            }
        }
    };
}

scalar_rows!(rows_q8, 34, |blk: &[u8], k: usize| (blk[2 + k] as i8) as i32);
scalar_rows!(rows_q4, 18, |blk: &[u8], k: usize| super::scalar::q4_at(blk, k) as i32);

/// The x86 kernels' few-vector activation patterns (decode: [`super::int16_x86`] on 512-bit
/// registers, [`super::int16_avx2`] on 256-bit ones): pattern `k`, 16-bit word `i` (of the
/// eight each 128-bit lane repeats) is the block position it takes. The kernels load a row's
/// payload as it lies and sign-extend 16-bit words by shifts, so a word gives the weights of
/// positions four (Q4B32: a word holds positions 4j..4j+4, and shift k takes nibble k) or two
/// (Q8B32: a word's low and high byte) apart, and a multiply-add pairs adjacent words: Q4B32
/// pattern k pairs positions (8j + k, 8j + k + 4) in its 32-bit lane j; Q8B32 patterns 0 and 1
/// pair (4j, 4j + 2) and (4j + 1, 4j + 3) of the first 16 positions, 2 and 3 the same of the
/// last 16.
pub(super) const fn few_patterns(q4: bool) -> [[usize; 8]; 4] {
    let mut idx = [[0; 8]; 4];
    let mut k = 0;
    while k < 4 {
        let mut i = 0;
        while i < 8 {
            let (j, hi) = (i / 2, i % 2);
            idx[k][i] = if q4 { 8 * j + k + 4 * hi } else { 16 * (k / 2) + 4 * j + k % 2 + 2 * hi };
            i += 1;
        }
        k += 1;
    }
    idx
}

/// Bytes an [`super::int8::ActScratch`] of the int16 path for `values` activations holds.
pub fn scratch_bytes(values: usize) -> u64 {
    let values = values.div_ceil(BLOCK) * BLOCK;
    (2 * values + 4 * (values / BLOCK)) as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn block_sums_cannot_overflow() {
        // The largest |S|: 32 products of −128 (a Q8B32 byte) and −32767.
        let s: i64 = 32 * 128 * 32767;
        assert!(s < i32::MAX as i64);
    }
}
