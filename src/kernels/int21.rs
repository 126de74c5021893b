//! The int21-activation path (`Options::activations`) for Q4B32 weights: the int16 path's
//! arithmetic ([`super::int16`]) with activations 64 times finer — 21-bit integers, each
//! carried as three signed 8-bit digits, so that a CPU without a wide integer multiply-add
//! still multiplies them by the weights' nibbles 32 at a time (`vpmaddubsw`, or AVX-VNNI's
//! `vpdpbusd`), and the product is exact.
//!
//! Why: on AVX2 the f32 Q4B32 decode is bound by its instruction count, not by memory, and the
//! int8 and int16 paths, which are faster, round each activation to 1/254 or 1/65534 of its
//! block's largest value — too coarse for seed 000's token gate (logits within 1e-3 of the
//! float model; int16 misses it by 1.3–2.6×). A 21-bit activation rounds to 1/4,161,536 of
//! the block's largest value, within a few units of f32's own rounding, and the gate passes
//! with room (`docs/BENCHMARKS.md`).
//!
//! The arithmetic (the SIMD kernels equal the scalar twin below bit for bit, and a result does
//! not depend on how many vectors or which rows a call computes):
//! - activation block: `d = max|x| / L`, `X = round_half_even(x · (L / max|x|))` with
//!   `L = 127 · 2¹⁴ = 2,080,768` ([`super::int8::quantize_block_to`]'s rule, as for int8 and
//!   int16);
//! - `X = 2¹⁴·H + 2⁷·M + D`, balanced digits: `D, M` in −64..=63, `H` in −127..=127 (each
//!   taken off the bottom: `D = ((X + 64) mod 128) − 64`, then the same on `(X − D) / 128`);
//! - per row and weight block: `S = Σ_k w[k]·X[k]`, an exact integer (|S| ≤ 32·8·L < 2³¹; a
//!   Q8B32 byte would overflow it, so the path covers Q4B32 only and Q8B32 products stay f32),
//!   then `acc = fma(f32(S), f16_to_f32(w_scale) · d, acc)`, blocks in order — int16's rule.
//!
//! A block's 96 bytes (the 32 [`Digits`] an activation buffer holds for it) are laid out for
//! the kernels, digit-major: for `H`, then `M`, then `D`, the 16 even positions' digits, then
//! the 16 odd positions' ([`digit_at`]). A Q4B32 payload byte holds an even position in its
//! low nibble and the next odd one in its high nibble, so the low nibbles of a row's 16 bytes
//! meet one 16-byte run as they lie, and the high nibbles the next.

use super::int8::{quantize_block_to, quantize_blocks, scalar_rows_by, Acts, Int8Isa, QuantizeFn, Quantum};
use super::MatRef;
use crate::format::dtype::BLOCK;

/// The largest quantized magnitude, 127 · 2¹⁴.
pub const LEVEL: i32 = 127 << 14;

/// Under [`super::Prefetch::OwnRows`] (Intel), the SIMD kernels' rows of at least this many
/// bytes ask for their own lines ahead, to L1; shorter rows — several to a 4 KiB page, where
/// the CPU's own prefetchers follow them poorly — ask for the next group's lines, to L2, as
/// every row does under [`super::Prefetch::TileAfterNext`] (AMD, where a row's own lines
/// measured slower for the f32 tiles). From DRAM on the Intel host, two threads (BENCHMARKS,
/// 2026-12-06), the AVX-512 form: own rows 52–63 % of the read bandwidth at 2,048 and 4,096
/// columns (1,152 and 2,304 bytes a row), 79–85 % from 6,144 on; the next group's 64–75 % at
/// every width. The AVX-VNNI form at 8,192 columns: 77–78 % against 67–69 %.
pub(super) const OWN_ROWS_MIN_BYTES: usize = 3072;

/// Blocks ahead of its row's current one a row's own prefetch asks for (24 measured best of
/// 12, 24, 48 and 96 on the AVX-512 form).
pub(super) const AHEAD: usize = 24;

/// Bytes of a Q4B32 block (a binary16 scale and 16 bytes of nibbles).
pub(super) const BLOCK_BYTES: usize = 18;

/// Blocks per column chunk of the SIMD kernels (16,384 columns): a chunk's block offsets
/// live on the stack.
pub(super) const CHUNK_BLOCKS: usize = 512;

/// The 96 digit bytes of block `b` of vector `t` in `x` (in the layout of the module notes).
/// Only an address: the caller reads it within `x`'s bounds.
pub(super) fn block_digits(x: &Acts<Digits>, t: usize, b: usize) -> *const i8 {
    x.q.as_ptr().cast::<i8>().wrapping_add(3 * (t * x.cols + b * BLOCK))
}

/// One activation's share of its block's 96 bytes: three bytes, which hold digits of the
/// block's activations in the layout of the module notes (not this activation's own digits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Digits(pub [i8; 3]);

impl Quantum for Digits {
    const LEVEL: f32 = LEVEL as f32;
    /// The level's own digits, (H, M, D) (the quantizer then lays a block's out).
    fn from_level(v: f32) -> Digits {
        let x = v as i32;
        let low = ((x + 64) & 127) - 64;
        let rest = (x - low) >> 7;
        let mid = ((rest + 64) & 127) - 64;
        Digits([((rest - mid) >> 7) as i8, mid as i8, low as i8])
    }
}

/// Row kernel of the int21 path: rows `r0..r1` of the Q4B32 matrix `w` against the `n`
/// quantized vectors of `x`, writing `y[t * y_stride + r]`.
///
/// # Safety
/// As [`super::RowsFn`], with `x.cols == w.cols`, `x.q.len() >= n * w.cols` and
/// `x.d.len() >= n * w.cols / 32`.
pub type Int21RowsFn = unsafe fn(w: &MatRef, r0: usize, r1: usize, x: &Acts<Digits>, n: usize, y: *mut f32, y_stride: usize);

/// The byte of a block's 96 that holds digit `digit` (0 = H, 1 = M, 2 = D) of position `k`.
pub const fn digit_at(digit: usize, k: usize) -> usize {
    32 * digit + 16 * (k % 2) + k / 2
}

/// Quantizes one block of 32 activations into its 96 bytes, returning its scale `d`.
pub fn quantize_block(x: &[f32], q: &mut [Digits]) -> f32 {
    let mut own = [Digits::default(); BLOCK];
    let d = quantize_block_to(x, &mut own);
    for (k, v) in own.iter().enumerate() {
        for (digit, &value) in v.0.iter().enumerate() {
            let at = digit_at(digit, k);
            q[at / 3].0[at % 3] = value;
        }
    }
    d
}

/// The scalar [`QuantizeFn`], block by block with [`quantize_block`].
///
/// # Safety
/// None beyond the signature.
pub unsafe fn quantize_scalar(x: &[f32], q: &mut [Digits], d: &mut [f32]) {
    for ((xb, qb), d) in x.chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK)).zip(d) {
        *d = quantize_block(xb, qb);
    }
}

/// Activation `k` of a block's 96 bytes `q`, as the integer `X`.
#[inline]
pub fn value_at(q: &[Digits], k: usize) -> i32 {
    let byte = |digit: usize| {
        let at = digit_at(digit, k);
        q[at / 3].0[at % 3] as i32
    };
    (byte(0) << 14) + (byte(1) << 7) + byte(2)
}

/// Scalar twin of the int21-path kernels (see [`Int21RowsFn`]).
///
/// # Safety
/// As [`Int21RowsFn`].
pub unsafe fn rows_q4(w: &MatRef, r0: usize, r1: usize, x: &Acts<Digits>, n: usize, y: *mut f32, y_stride: usize) {
    const BYTES: usize = BLOCK_BYTES;
    // SAFETY: forwarded contract.
    unsafe {
        scalar_rows_by(w, r0, r1, x, n, y, y_stride, BYTES, |row, q, d| {
            super::int16::row_dot(row.len() / BYTES, |b| u16::from_le_bytes([row[b * BYTES], row[b * BYTES + 1]]),
                |b, k| super::scalar::q4_at(&row[b * BYTES..(b + 1) * BYTES], k) as i32,
                |i| value_at(&q[i / BLOCK * BLOCK..], i % BLOCK), d)
        })
    }
}

/// The quantizer and the Q4B32 kernel of the int21 path that go with `isa`: AVX-512 VNNI
/// where the int8 path would use it ([`super::int21_x86`]), AVX2 where it uses AVX2 (with
/// AVX-VNNI's `vpdpbusd` where the CPU has it, [`super::int21_avx2`]), else the scalar twins;
/// the SIMD kernels' prefetch by the decode tiles' scheme `prefetch` ([`OWN_ROWS_MIN_BYTES`]).
pub(super) fn kernels(isa: Int8Isa, prefetch: super::Prefetch) -> (Int8Isa, QuantizeFn<Digits>, Int21RowsFn) {
    #[cfg(target_arch = "x86_64")]
    use super::int21_avx2 as avx2;
    #[cfg(not(target_arch = "x86_64"))]
    let _ = prefetch;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx512Vnni if prefetch == super::Prefetch::OwnRows => (isa, avx2::quantize, super::int21_x86::rows_q4),
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx512Vnni => (isa, avx2::quantize, super::int21_x86::rows_q4_next_group),
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx2 => {
            let own = prefetch == super::Prefetch::OwnRows;
            let rows: Int21RowsFn = match (super::has_avx_vnni(), own) {
                (true, true) => avx2::vnni::rows_q4,
                (true, false) => avx2::vnni::rows_q4_next_group,
                (false, true) => avx2::madd::rows_q4,
                (false, false) => avx2::madd::rows_q4_next_group,
            };
            (isa, avx2::quantize, rows)
        }
        _ => (Int8Isa::Scalar, quantize_scalar, rows_q4),
    }
}

/// Quantizes whole blocks of `x` with the int21 quantizer of `isa` (which this CPU must
/// support, else the scalar one runs): for tests that compare the two.
pub fn quantize_with(isa: Int8Isa, x: &[f32], q: &mut [Digits], d: &mut [f32]) {
    let f = if isa.supported() { kernels(isa, super::Prefetch::OwnRows).1 } else { quantize_scalar as QuantizeFn<Digits> };
    // SAFETY: the ISA was checked.
    unsafe { quantize_blocks(f, x, q, d) }
}

/// Bytes an [`super::int8::ActScratch`] of the int21 path for `values` activations holds.
pub fn scratch_bytes(values: usize) -> u64 {
    let values = values.div_ceil(BLOCK) * BLOCK;
    (3 * values + 4 * (values / BLOCK)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_rebuild_every_level_and_stay_in_range() {
        for x in -LEVEL..=LEVEL {
            let Digits([h, m, d]) = Digits::from_level(x as f32);
            assert!((-127..=127).contains(&h) && (-64..=63).contains(&m) && (-64..=63).contains(&d), "{x}: {h} {m} {d}");
            assert_eq!(((h as i32) << 14) + ((m as i32) << 7) + d as i32, x);
        }
    }

    #[test]
    fn block_sums_cannot_overflow() {
        // The largest |S|: 32 products of −8 (a Q4B32 level) and −L; and the kernels' unsigned
        // form, Σ (w + 8)·X, at most 32·15·L.
        assert!(32 * 8 * (LEVEL as i64) < i32::MAX as i64);
        assert!(32 * 15 * (LEVEL as i64) < i32::MAX as i64);
    }

    #[test]
    fn a_block_lays_out_its_digits_and_reads_back() {
        let x: Vec<f32> = (0..32).map(|k| ((k * 37 % 11) as f32 - 5.3) * 0.173).collect();
        let mut q = [Digits::default(); 32];
        let d = quantize_block(&x, &mut q);
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert_eq!(d, amax / LEVEL as f32);
        for (k, &v) in x.iter().enumerate() {
            let back = value_at(&q, k) as f32 * d;
            assert!((back - v).abs() <= d, "position {k}: {back} against {v}");
        }
    }
}
