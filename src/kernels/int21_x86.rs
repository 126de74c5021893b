//! The AVX-512 VNNI kernel of the int21 path ([`super::int21`] states the arithmetic and
//! holds the scalar twin it equals bit for bit): [`super::int21_avx2`]'s decode form on 512-bit
//! registers, as [`super::int16_x86`]'s few-vector form widens the int16 one — four rows share
//! a register, one per 128-bit lane, each lane's low and high nibbles meeting the digit runs
//! broadcast to all four lanes, `vpdpbusd` summing four byte products per 32-bit lane; a
//! transpose-and-add tree turns four such registers into sixteen rows' block sums in row order,
//! and the rest is the AVX2 kernel's, sixteen rows at a time.

use super::int16_x86::{add_across, add_across_pairs, load_four};
use super::int21::{block_digits, Digits, BLOCK_BYTES as BYTES, CHUNK_BLOCKS, OWN_ROWS_MIN_BYTES};
use super::int21_avx2::{negated_offsets, prefetch_step};
use super::int8::Acts;
use super::MatRef;
use std::arch::x86_64::*;

/// Rows per register group (the lanes of the block sums).
const LANES: usize = 16;
/// Vectors per pass over the weights.
const FEW: usize = 4;

/// Rows `r0..r1` of the Q4B32 matrix `w` against `n` quantized vectors, under
/// [`super::Prefetch::OwnRows`]: rows of [`OWN_ROWS_MIN_BYTES`] or more ask for their own lines
/// ahead, shorter ones for the next group's ([`prefetch_step`]).
///
/// # Safety
/// As [`super::int21::Int21RowsFn`]; the CPU has AVX-512 F/BW/VL and VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows_q4(w: &MatRef, r0: usize, r1: usize, x: &Acts<Digits>, n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe { rows::<true>(w, r0, r1, x, n, y, ys) }
}

/// As [`rows_q4`], every row asking for the next group's lines (under
/// [`super::Prefetch::TileAfterNext`], the AMD CPUs' scheme, on which a row's own lines ahead
/// measured slower for the f32 tiles).
///
/// # Safety
/// As [`rows_q4`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows_q4_next_group(w: &MatRef, r0: usize, r1: usize, x: &Acts<Digits>, n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe { rows::<false>(w, r0, r1, x, n, y, ys) }
}

/// [`rows_q4`] (`OWN`) or [`rows_q4_next_group`].
///
/// # Safety
/// As [`rows_q4`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows<const OWN: bool>(w: &MatRef, r0: usize, r1: usize, x: &Acts<Digits>, n: usize, y: *mut f32, ys: usize) {
    let rb = w.row_bytes();
    if n == 0 || r0 >= r1 {
        return;
    }
    if rb < BYTES || rb > (i32::MAX as usize) / LANES {
        // No columns (every result is 0), or rows too long for the gathers' 32-bit offsets:
        // the scalar twin gives the same bits.
        // SAFETY: forwarded contract.
        return unsafe { super::int21::rows_q4(w, r0, r1, x, n, y, ys) };
    }
    let offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(rb as i32));
    let own_rows = OWN && rb >= OWN_ROWS_MIN_BYTES;
    let mut t = 0;
    while t < n {
        let tn = (n - t).min(FEW);
        // SAFETY: vectors t..t + tn exist and their outputs are ours (forwarded).
        unsafe {
            match tn {
                1 => few::<1>(w, r0, r1, x, t, offsets, own_rows, y, ys),
                2 => few::<2>(w, r0, r1, x, t, offsets, own_rows, y, ys),
                3 => few::<3>(w, r0, r1, x, t, offsets, own_rows, y, ys),
                _ => few::<4>(w, r0, r1, x, t, offsets, own_rows, y, ys),
            }
        }
        t += tn;
    }
}

/// Vectors `t0..t0 + T` against rows `r0..r1` (see the module notes), the rows asking for their
/// own lines ahead when `own_rows`, else for the next group's.
///
/// # Safety
/// As [`rows_q4`], for those vectors.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn few<const T: usize>(w: &MatRef, r0: usize, r1: usize, x: &Acts<Digits>, t0: usize, offsets: __m512i, own_rows: bool, y: *mut f32, ys: usize) {
    let rb = w.row_bytes();
    let blocks = rb / BYTES;
    let digits = |t: usize, b: usize| block_digits(x, t0 + t, b);
    let out = |t: usize, g: usize| y.wrapping_add((t0 + t) * ys + g);
    // Each block's `−8·ΣX`, which the loop adds from memory (an embedded broadcast).
    let mut offset = [[0i32; CHUNK_BLOCKS]; T];
    let mut b0 = 0;
    while b0 < blocks {
        let kb = (blocks - b0).min(CHUNK_BLOCKS);
        // SAFETY: blocks b0..b0 + kb of vectors t0..t0 + T exist (the caller's contract).
        unsafe { negated_offsets(x, t0, b0, kb, &mut offset) };
        let mut g = r0;
        while g < r1 {
            let live = (r1 - g).min(LANES);
            let mask = ((1u32 << live) - 1) as __mmask16;
            let mut acc = [_mm512_setzero_ps(); T];
            if b0 > 0 {
                for (t, a) in acc.iter_mut().enumerate() {
                    // SAFETY: the caller's contract; masked lanes are not read.
                    *a = unsafe { _mm512_maskz_loadu_ps(mask, out(t, g)) };
                }
            }
            // Row g + j, or the last row of the range for lanes past it (read, never stored).
            let rows: [*const u8; LANES] = std::array::from_fn(|j| w.data.as_ptr().wrapping_add((g + j).min(r1 - 1) * rb + b0 * BYTES));
            // The next group's rows are contiguous: under the short rows' scheme each block
            // step asks for its share of their lines at this chunk's columns.
            let next = w.data.as_ptr().wrapping_add((g + LANES) * rb + b0 * BYTES * LANES);
            #[allow(clippy::needless_range_loop)]
            for b in 0..kb {
                prefetch_step(&rows, next, b, b0, blocks, rb, own_rows);
                let at = |j: usize| rows[j].wrapping_add(b * BYTES);
                // SAFETY: the live rows' block b0 + b is within the matrix.
                let scales = unsafe { _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), mask, offsets, at(0).cast()))) };
                // SAFETY: block b0 + b of each vector exists.
                let runs: [[__m512i; 6]; T] = std::array::from_fn(|t| unsafe { digit_runs(digits(t, b0 + b)) });
                // Register q holds rows q, q + 4, q + 8, q + 12: the tree below puts row j in lane j.
                let mut part = [[_mm512_setzero_si512(); 4]; T];
                for q in 0..4 {
                    // SAFETY: each pointer is a block of a row within the matrix.
                    let (even, odd) = unsafe { nibbles([at(q), at(q + 4), at(q + 8), at(q + 12)]) };
                    for (pt, r) in part.iter_mut().zip(&runs) {
                        pt[q] = digits_dot(even, odd, r);
                    }
                }
                for (t, a) in acc.iter_mut().enumerate() {
                    let [p0, p1, p2, p3] = part[t];
                    let s = add_across(add_across_pairs(p0, p1), add_across_pairs(p2, p3));
                    let s = _mm512_add_epi32(s, _mm512_set1_epi32(offset[t][b]));
                    // SAFETY: the block's scale of vector t0 + t.
                    let d = unsafe { *x.d.as_ptr().add((t0 + t) * blocks + b0 + b) };
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scales, _mm512_set1_ps(d)), *a);
                }
            }
            for (t, a) in acc.iter().enumerate() {
                // SAFETY: the caller's contract; masked lanes are not written.
                unsafe { _mm512_mask_storeu_ps(out(t, g), mask, *a) };
            }
            g += live;
        }
        b0 += kb;
    }
}

/// A block's six 16-byte digit runs (H even, H odd, M even, M odd, D even, D odd), each
/// broadcast to the four 128-bit lanes.
///
/// # Safety
/// The 96 bytes at `p` are readable.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn digit_runs(p: *const i8) -> [__m512i; 6] {
    // SAFETY: the caller's contract.
    std::array::from_fn(|k| unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(p.add(16 * k).cast())) })
}

/// Four rows' block payloads, row i in 128-bit lane i, as unsigned nibbles `w + 8`: (the even
/// positions, the odd ones).
///
/// # Safety
/// Each pointer is a whole Q4B32 block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nibbles(blocks: [*const u8; 4]) -> (__m512i, __m512i) {
    // SAFETY: 16 payload bytes after each block's scale.
    let v = unsafe { load_four(blocks, 2) };
    // A two's-complement nibble q flipped in bit 3 is q + 8: `(v ^ 0x88) & 0x0F` is one
    // ternary-logic instruction (0x28: A ^ B, then AND C), for the high nibbles after the shift
    // too (the bits shifted in from the next byte are masked off).
    let (flip, low) = (_mm512_set1_epi8(0x88u8 as i8), _mm512_set1_epi8(0x0F));
    let high = _mm512_srli_epi16::<4>(v);
    (_mm512_ternarylogic_epi32::<0x28>(v, flip, low), _mm512_ternarylogic_epi32::<0x28>(high, flip, low))
}

/// Four partial sums per row of `Σ (w + 8)·X`: each digit's byte products summed by
/// `vpdpbusd` (four per lane) into the running sum, which is scaled by 2⁷ before the next
/// digit's — Horner's rule for `2¹⁴·H + 2⁷·M + D`, two shifts and no adds (exact: every
/// partial value is within the final sum's bound).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn digits_dot(even: __m512i, odd: __m512i, runs: &[__m512i; 6]) -> __m512i {
    let digit = |acc: __m512i, k: usize| _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, even, runs[2 * k]), odd, runs[2 * k + 1]);
    let h = digit(_mm512_setzero_si512(), 0);
    let m = digit(_mm512_slli_epi32::<7>(h), 1);
    digit(_mm512_slli_epi32::<7>(m), 2)
}
