//! AVX-512 kernels (F + BW + VL, with FMA and F16C): 16 f32 lanes. Each has a scalar twin in
//! [`super::scalar`] and a test comparing them (`tests/kernels.rs`).
//!
//! Per (row, vector) pair there is one 16-lane accumulator. Dense rows add 16 columns' products
//! per step; a quantized block is decoded in place (seed 000, "Why the matrix vector product
//! decodes in place"): its 32 values become two 16-lane vectors whose products with the
//! matching inputs are summed into a block vector, and the block vector times the broadcast
//! scale is added to the accumulator. The 16 lanes are summed at the end by [`hsum`], a fixed tree, so the order
//! depends only on the column count.

use super::avx2::{ahead_own_rows, ahead_tile_after_next, prefetch_l2, MXFP4_HALF_SCALE};
use super::scalar::F16_TO_F32;
use super::MatRef;
use std::arch::x86_64::*;

/// Sums the 16 lanes: halves, then quarters, then pairs — a fixed order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(crate) fn hsum(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    super::avx2::hsum8(_mm256_add_ps(lo, hi))
}

/// Lanes `0..k` set (k < 16): the mask of a row's last, partial 16 columns.
#[inline]
pub(crate) fn tail_mask(k: usize) -> __mmask16 {
    ((1u32 << k) - 1) as __mmask16
}

/// [`super::Prefetch::TileAfterNext`] for the dense tiles: row `r + i` of the tile after next
/// at the same byte `at`, to L2 (see [`ahead_tile_after_next`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
fn dense_after_next<const R: usize>(wp: *const u8, r: usize, i: usize, rb: usize, at: usize) {
    prefetch_l2(wp.wrapping_add((r + i + 2 * R) * rb + at));
}

/// Bytes ahead in its own row that a dense tile asks for under [`dense_own_rows`]. On the
/// Intel host of BENCHMARKS (2026-12-05 afternoon), two threads from DRAM, six rounds: F32
/// 83–91 % of the read bandwidth with the tile after next, 96–110 % with 1,536 bytes ahead
/// (94–95 % with the next tile); BF16 76–85 % → 82–89 %; F16 80–93 % → 89–92 %. 384, 768 and
/// 3,072 bytes read as much as 1,536 within the noise; the 1B shape in BF16 decoded at
/// 10.8–11.4 tok/s with 768 against 10.7–11.2 with 1,536, so 768.
const DENSE_OWN_ROWS_AHEAD: usize = 768;

/// [`super::Prefetch::OwnRows`] for the dense tiles: row `r + i` itself
/// [`DENSE_OWN_ROWS_AHEAD`] bytes past `at`, to L1; past the row's end, the same place in the
/// next tile's row `r + i + R`, as [`ahead_own_rows`] does (a prefetch does not fault).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
fn dense_own_rows<const R: usize>(wp: *const u8, r: usize, i: usize, rb: usize, at: usize) {
    let ahead = at + DENSE_OWN_ROWS_AHEAD;
    let line = if ahead < rb { (r + i) * rb + ahead } else { (r + i + R) * rb + ahead - rb };
    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(line) as *const i8);
}

/// Dense tiles: `$load(ptr)` widens 16 stored weights to f32, `$load_tail(mask, ptr)` the
/// first lanes of a partial step (the rest zero, so they add nothing), `$prefetch` asks for a
/// line of the weights ahead per row and step ([`dense_after_next`] or [`dense_own_rows`]).
macro_rules! dense_tile {
    ($name:ident, $elem:ty, $load:expr, $load_tail:expr, $prefetch:ident) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &[f32], t0: usize, out: &mut [[f32; T]; R]) {
            let cols = w.cols;
            let wp = w.data.as_ptr() as *const $elem;
            let xp = x.as_ptr();
            let mut acc = [[_mm512_setzero_ps(); T]; R];
            let full = cols / 16 * 16;
            let mut c = 0;
            // SAFETY (all loads): rows r..r+R and vectors t0..t0+T exist (the driver's
            // contract), c + 16 <= cols in the loop, and the tail loads are masked to cols.
            while c < full {
                for i in 0..R {
                    let size = std::mem::size_of::<$elem>();
                    $prefetch::<R>(wp as *const u8, r, i, cols * size, c * size);
                    let wv = unsafe { $load(wp.add((r + i) * cols + c)) };
                    for t in 0..T {
                        let xv = unsafe { _mm512_loadu_ps(xp.add((t0 + t) * cols + c)) };
                        acc[i][t] = _mm512_fmadd_ps(wv, xv, acc[i][t]);
                    }
                }
                c += 16;
            }
            if c < cols {
                let m = tail_mask(cols - c);
                for i in 0..R {
                    let wv = unsafe { $load_tail(m, wp.add((r + i) * cols + c)) };
                    for t in 0..T {
                        let xv = unsafe { _mm512_maskz_loadu_ps(m, xp.add((t0 + t) * cols + c)) };
                        acc[i][t] = _mm512_fmadd_ps(wv, xv, acc[i][t]);
                    }
                }
            }
            for i in 0..R {
                for t in 0..T {
                    out[i][t] = hsum(acc[i][t]);
                }
            }
        }
    };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn load_f32(p: *const f32) -> __m512 {
    // SAFETY: the caller guarantees 16 readable values.
    unsafe { _mm512_loadu_ps(p) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn load_f32_tail(m: __mmask16, p: *const f32) -> __m512 {
    // SAFETY: only the masked lanes are read.
    unsafe { _mm512_maskz_loadu_ps(m, p) }
}

/// bf16 is the top half of an f32: widen to 32 bits and shift left 16 (exact).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(crate) fn bf16_to_f32(v: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn load_bf16(p: *const u16) -> __m512 {
    // SAFETY: the caller guarantees 16 readable values.
    bf16_to_f32(unsafe { _mm256_loadu_si256(p as *const __m256i) })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn load_bf16_tail(m: __mmask16, p: *const u16) -> __m512 {
    // SAFETY: only the masked lanes are read.
    bf16_to_f32(unsafe { _mm256_maskz_loadu_epi16(m, p as *const i16) })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn load_f16(p: *const u16) -> __m512 {
    // SAFETY: the caller guarantees 16 readable values.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p as *const __m256i) })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn load_f16_tail(m: __mmask16, p: *const u16) -> __m512 {
    // SAFETY: only the masked lanes are read.
    _mm512_cvtph_ps(unsafe { _mm256_maskz_loadu_epi16(m, p as *const i16) })
}

dense_tile!(tile_f32, f32, load_f32, load_f32_tail, dense_after_next);
dense_tile!(tile_bf16, u16, load_bf16, load_bf16_tail, dense_after_next);
dense_tile!(tile_f16, u16, load_f16, load_f16_tail, dense_after_next);
dense_tile!(tile_f32_own_rows, f32, load_f32, load_f32_tail, dense_own_rows);
dense_tile!(tile_bf16_own_rows, u16, load_bf16, load_bf16_tail, dense_own_rows);
dense_tile!(tile_f16_own_rows, u16, load_f16, load_f16_tail, dense_own_rows);

/// Quantized tiles: `$decode(block_ptr)` turns one block into its 32 weights as two 16-lane
/// vectors (A, B), already multiplied by the block's scale — exactly, since a level has at most
/// 8 significant bits and a binary16 scale 11, so q·scale fits an f32 mantissa — and
/// `$xload(ptr)` loads the block's 32 inputs as the matching (A, B) pair. Each (row, vector)
/// pair then takes two fused multiply-adds per block, A before B: the sequence the prefill
/// panel of [`super::avx512_prefill`] repeats, so both give the same bits. The inputs are
/// loaded once per block and vector and serve every row of the tile. `$prefetch` asks for the
/// lines ahead of one vector's tiles ([`ahead_tile_after_next`] or [`ahead_own_rows`], see
/// [`super::Prefetch`]); it changes when bytes arrive, never the arithmetic.
macro_rules! block_tile {
    ($name:ident, $bytes:expr, $decode:ident, $xload:ident, $prefetch:ident) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &[f32], t0: usize, out: &mut [[f32; T]; R]) {
            let (cols, rb) = (w.cols, w.row_bytes());
            let blocks = rb / $bytes;
            let wp = w.data.as_ptr();
            let xp = x.as_ptr();
            let mut acc = [[_mm512_setzero_ps(); T]; R];
            for b in 0..blocks {
                let mut xs = [(_mm512_setzero_ps(), _mm512_setzero_ps()); T];
                for (t, v) in xs.iter_mut().enumerate() {
                    // SAFETY: vector t0 + t has `cols` = 32 × blocks values.
                    *v = unsafe { $xload(xp.add((t0 + t) * cols + b * 32)) };
                }
                // Several vectors' inputs fill L1 themselves, so lines asked for there evict
                // them: their tiles look ahead the other way (see [`super::Prefetch`]).
                if T == 1 {
                    $prefetch::<R>(wp, r, rb, b, $bytes);
                } else {
                    ahead_tile_after_next::<R>(wp, r, rb, b, $bytes);
                }
                for i in 0..R {
                    // SAFETY: block b of row r + i lies inside the matrix (driver contract).
                    let (wa, wb) = unsafe { $decode(wp.add((r + i) * rb + b * $bytes)) };
                    for t in 0..T {
                        acc[i][t] = _mm512_fmadd_ps(wb, xs[t].1, _mm512_fmadd_ps(wa, xs[t].0, acc[i][t]));
                    }
                }
            }
            for i in 0..R {
                for t in 0..T {
                    out[i][t] = hsum(acc[i][t]);
                }
            }
        }
    };
}

/// The binary16 scale at the start of a block, widened through [`F16_TO_F32`] (one load,
/// which the compiler folds into the multiply as a broadcast operand) and broadcast.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn scale(p: *const u8) -> __m512 {
    // SAFETY: the caller guarantees two readable bytes.
    let bits = u16::from_le(unsafe { (p as *const u16).read_unaligned() });
    _mm512_set1_ps(F16_TO_F32[bits as usize])
}

/// A block's 32 inputs in position order: (positions 0..16, positions 16..32).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn x_in_order(p: *const f32) -> (__m512, __m512) {
    // SAFETY: the caller guarantees 32 readable values.
    unsafe { (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))) }
}

/// A block's 32 inputs split by parity: (even positions, odd positions), the order in which
/// [`decode_q4`] produces the weights.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn x_by_parity(p: *const f32) -> (__m512, __m512) {
    // SAFETY: the caller guarantees 32 readable values.
    let (a, b) = unsafe { (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))) };
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    (_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b))
}

/// Q8B32: 32 signed bytes after the scale, sign-extended, converted and scaled, in position
/// order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn decode_q8(p: *const u8) -> (__m512, __m512) {
    // SAFETY: the caller guarantees the 34-byte block at p.
    unsafe {
        let s = scale(p);
        let q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(2) as *const __m128i)));
        let q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(18) as *const __m128i)));
        (_mm512_mul_ps(q0, s), _mm512_mul_ps(q1, s))
    }
}

/// Q4B32: 16 bytes of nibbles after the scale, low nibble = even position (seed 000, "The
/// payload"). Each byte is widened to a 32-bit lane; `vpermps` looks a lane up in a 16-entry
/// table of the signed levels −8..7 times the scale, using only the lane's low 4 bits, so the
/// lane itself gives the even position's weight and the lane shifted right by 4 the odd one:
/// five instructions for 32 weights, already scaled f32. The weights come out split by parity
/// (even, odd), which [`x_by_parity`] matches on the input side.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn decode_q4(p: *const u8) -> (__m512, __m512) {
    // SAFETY: the caller guarantees the 18-byte block at p.
    unsafe {
        let levels = _mm512_setr_ps(0., 1., 2., 3., 4., 5., 6., 7., -8., -7., -6., -5., -4., -3., -2., -1.);
        look_up_nibbles(_mm512_mul_ps(levels, scale(p)), p.add(2))
    }
}

/// The 16 bytes at `p`, each widened to a lane and looked up in `table` by its low nibble
/// (the even positions) and by its high nibble (the odd ones): (even, odd).
///
/// # Safety
/// 16 readable bytes at p.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn look_up_nibbles(table: __m512, p: *const u8) -> (__m512, __m512) {
    // SAFETY: the caller guarantees 16 readable bytes.
    let bytes = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p as *const __m128i) });
    // vpermps reads only a lane's low 4 bits.
    (_mm512_permutexvar_ps(bytes, table), _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(bytes), table))
}

/// MXFP4: an e8m0 scale byte, then 16 bytes of e2m1 codes, the low nibble first (the even
/// position), as Q4B32's payload. So [`decode_q4`]'s lookup serves: each byte widened to a
/// lane, `vpermps` on its low 4 bits and on the lane shifted right by 4, in a table of the 16
/// codes' values times the scale — split by parity, (even, odd). The table holds twice each
/// value times half the scale ([`MXFP4_HALF_SCALE`]), the AVX2 decode's products: every entry
/// exact (or infinite, or NaN under the 0xFF scale, as the scalar twin gives), and the code
/// for −0 looked up as +0, as there (no sum starting from +0 can tell).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn decode_mx(p: *const u8) -> (__m512, __m512) {
    // SAFETY: the caller guarantees the 17-byte block at p.
    unsafe {
        let twice = _mm512_setr_ps(0., 1., 2., 3., 4., 6., 8., 12., 0., -1., -2., -3., -4., -6., -8., -12.);
        look_up_nibbles(_mm512_mul_ps(twice, _mm512_set1_ps(MXFP4_HALF_SCALE[*p as usize])), p.add(1))
    }
}

/// F8B32: the f32 scale, then 32 e4m3fn codes, in position order. As in the AVX2 decode
/// ([`super::avx2::decode_f8`]), a code's bits moved into a binary16 are its value times 2⁻⁸,
/// which `vcvtph2ps` widens exactly, and 2⁸ goes into the scale: the same weights. Here 32
/// codes at once: sign-extended to 16 bits, shifted left by 7 (the sign to bit 15, the
/// magnitude to bits 13..7; bit 14 takes a copy of the sign) and masked (bit 14 cleared).
/// The NaN codes never reach a kernel (refused where the source is read, `format::fp8`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn decode_f8(p: *const u8) -> (__m512, __m512) {
    // SAFETY: the caller guarantees the 36-byte block at p.
    unsafe {
        let scale = f32::from_le_bytes((p as *const [u8; 4]).read_unaligned());
        let s = _mm512_set1_ps(scale * 256.0);
        let codes = _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.add(4) as *const __m256i));
        let h = _mm512_and_si512(_mm512_slli_epi16::<7>(codes), _mm512_set1_epi16(0xBF80u16 as i16));
        let lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
        let hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h));
        (_mm512_mul_ps(lo, s), _mm512_mul_ps(hi, s))
    }
}

block_tile!(tile_q8b32, 34, decode_q8, x_in_order, ahead_tile_after_next);
block_tile!(tile_q8b32_own_rows, 34, decode_q8, x_in_order, ahead_own_rows);
block_tile!(tile_q4b32, 18, decode_q4, x_by_parity, ahead_tile_after_next);
// Q4B32 against inputs already split by parity (see [`rows_q4b32`]): the same values in the
// same order, so the same bits, without two permutations per block, vector and tile.
block_tile!(tile_q4b32_ordered, 18, decode_q4, x_in_order, ahead_tile_after_next);
block_tile!(tile_q4b32_ordered_own_rows, 18, decode_q4, x_in_order, ahead_own_rows);
block_tile!(tile_f8b32, 36, decode_f8, x_in_order, ahead_tile_after_next);
block_tile!(tile_f8b32_own_rows, 36, decode_f8, x_in_order, ahead_own_rows);
block_tile!(tile_mxfp4, 17, decode_mx, x_by_parity, ahead_tile_after_next);
block_tile!(tile_mxfp4_ordered, 17, decode_mx, x_in_order, ahead_tile_after_next);
block_tile!(tile_mxfp4_ordered_own_rows, 17, decode_mx, x_in_order, ahead_own_rows);

mod decode {
    use super::*;
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_f32, tile_f32, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_bf16, tile_bf16, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_f16, tile_f16, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_f32_own_rows, tile_f32_own_rows, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_bf16_own_rows, tile_bf16_own_rows, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_f16_own_rows, tile_f16_own_rows, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_q8b32, tile_q8b32, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_q8b32_own_rows, tile_q8b32_own_rows, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_q4b32_any, tile_q4b32, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_q4b32_ordered, tile_q4b32_ordered, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_q4b32_ordered_own_rows, tile_q4b32_ordered_own_rows, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_f8b32, tile_f8b32, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_f8b32_own_rows, tile_f8b32_own_rows, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_mxfp4_any, tile_mxfp4, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_mxfp4_ordered, tile_mxfp4_ordered, 8, 4);
    row_driver!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", rows_mxfp4_ordered_own_rows, tile_mxfp4_ordered_own_rows, 8, 4);
}

/// Largest input (vectors × columns × 4 bytes) for which several vectors still go to the
/// register tiles above (2 rows × 4 vectors, each block widened once per tile) rather than to
/// the panel kernel: the tiles read every input again for each pair of rows, which costs less
/// than the panel's widening and its stored accumulators while the inputs stay in L2. A
/// prefill chunk's experts see a few tokens each (8 of 128 on average with top-8 of 128):
/// `waste bench matmul --tokens 2..64`, Zen 4, 2 threads, on 768 × 2048 and 2048 × 8192
/// matrices, the tiles ran 1.3–2.6× the old panel kernel's GMAC/s up to 16 vectors of 8192
/// columns or 32 of 2048, level at 512 KiB; against the reordered GEMM (16-row panels for 128
/// vectors) they are level at about 256 KiB (32 vectors of 2048 columns) and slower past it,
/// 5–15 % at 48–128 vectors (BENCHMARKS, 2026-12-03).
const REGISTER_TILE_INPUTS: usize = 256 << 10;
// rows_q4b32 relies on it: inputs its 64 KiB buffer holds always go to the tiles.
const _: () = assert!(super::Q4_ORDERED_MAX * 4 <= REGISTER_TILE_INPUTS);

/// True when `n` vectors of `cols` inputs go to the GEMM of [`super::avx512_prefill`], not to
/// the register tiles (see [`REGISTER_TILE_INPUTS`]).
pub(crate) fn takes_gemm(n: usize, cols: usize) -> bool {
    n > 1 && n * cols * 4 > REGISTER_TILE_INPUTS
}

/// Generates the public row kernel `$name`: one vector, or a few short ones (see
/// [`REGISTER_TILE_INPUTS`]), go to the register tiles above, more to the panel kernel of
/// [`super::avx512_prefill`] (same bits, see there), in whole token groups when `WHOLE`
/// ([`super::TokenGroups`]).
macro_rules! rows_fn {
    ($name:ident) => {
        /// SIMD row-dot kernel (see [`crate::kernels::scalar::RowsFn`]).
        ///
        /// # Safety
        /// As `RowsFn`, and the CPU must have AVX-512 F/BW/VL with FMA and F16C.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        pub unsafe fn $name<const WHOLE: bool>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
            // SAFETY: forwarded contract.
            unsafe {
                if !takes_gemm(n, w.cols) {
                    decode::$name(w, r0, r1, x, n, y, ys)
                } else {
                    super::avx512_prefill::rows::<WHOLE>(w, r0, r1, x, n, y, ys)
                }
            }
        }
    };
}

rows_fn!(rows_f32);
rows_fn!(rows_bf16);
rows_fn!(rows_f16);
rows_fn!(rows_f32_own_rows);
rows_fn!(rows_bf16_own_rows);
rows_fn!(rows_f16_own_rows);
rows_fn!(rows_q8b32);
rows_fn!(rows_q8b32_own_rows);
rows_fn!(rows_q4b32_any);
rows_fn!(rows_f8b32);
rows_fn!(rows_f8b32_own_rows);
rows_fn!(rows_mxfp4_any);

/// SIMD Q4B32 row-dot kernel (see [`crate::kernels::scalar::RowsFn`]). Where the register
/// tiles run and the inputs fit a 64 KiB stack buffer (an expert's few tokens in a prefill
/// chunk, or one vector), they are split by parity once per call, not once per block, vector
/// and pair of rows — the permutation was most of the tiles' work beside the widening. The
/// values and their order, hence the bits, are those of [`x_by_parity`].
///
/// `OWN_ROWS` picks the prefetch scheme ([`super::Prefetch`]), `WHOLE` the GEMM's token groups
/// ([`super::TokenGroups`]).
///
/// # Safety
/// As `RowsFn`, and the CPU must have AVX-512 F/BW/VL with FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn rows_q4b32<const OWN_ROWS: bool, const WHOLE: bool>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe {
        if !split_on_stack(x, n * w.cols, |ordered| rows_q4b32_ordered::<OWN_ROWS>(w, r0, r1, ordered, n, y, ys)) {
            rows_q4b32_any::<WHOLE>(w, r0, r1, x, n, y, ys)
        }
    }
}

/// SIMD MXFP4 row-dot kernel (see [`crate::kernels::scalar::RowsFn`]): [`rows_q4b32`]'s scheme
/// for the same nibble layout ([`decode_mx`]).
///
/// # Safety
/// As `RowsFn`, and the CPU must have AVX-512 F/BW/VL with FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn rows_mxfp4<const OWN_ROWS: bool, const WHOLE: bool>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe {
        let ordered_rows = |ordered: &[f32]| if OWN_ROWS {
            decode::rows_mxfp4_ordered_own_rows(w, r0, r1, ordered, n, y, ys)
        } else {
            decode::rows_mxfp4_ordered(w, r0, r1, ordered, n, y, ys)
        };
        if !split_on_stack(x, n * w.cols, ordered_rows) {
            rows_mxfp4_any::<WHOLE>(w, r0, r1, x, n, y, ys)
        }
    }
}

/// When the first `len` inputs fit a 64 KiB stack buffer, splits them by parity per 32-value
/// block into it ([`x_by_parity`]), runs `then` on them and returns true; else false. Inputs
/// that fit are also within [`REGISTER_TILE_INPUTS`], so their product runs on the tiles.
///
/// # Safety
/// `x` holds `len` values, a multiple of 32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn split_on_stack(x: &[f32], len: usize, then: impl FnOnce(&[f32])) -> bool {
    if len > super::Q4_ORDERED_MAX {
        return false;
    }
    let mut buf = std::mem::MaybeUninit::<[f32; super::Q4_ORDERED_MAX]>::uninit();
    let ordered = buf.as_mut_ptr() as *mut f32;
    for b in 0..len / 32 {
        // SAFETY: x holds `len` values (the contract); the buffer holds len.
        unsafe {
            let (e, o) = x_by_parity(x.as_ptr().add(32 * b));
            _mm512_storeu_ps(ordered.add(32 * b), e);
            _mm512_storeu_ps(ordered.add(32 * b + 16), o);
        }
    }
    // SAFETY: the first `len` values were written above.
    then(unsafe { std::slice::from_raw_parts(ordered, len) });
    true
}

/// The register tiles on Q4B32 inputs split by parity, with the prefetch scheme `OWN_ROWS`
/// picks.
///
/// # Safety
/// As `RowsFn` (for `x` split by parity), and the CPU must have AVX-512 F/BW/VL with FMA and
/// F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn rows_q4b32_ordered<const OWN_ROWS: bool>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe {
        if OWN_ROWS {
            decode::rows_q4b32_ordered_own_rows(w, r0, r1, x, n, y, ys)
        } else {
            decode::rows_q4b32_ordered(w, r0, r1, x, n, y, ys)
        }
    }
}

/// SIMD Q4B32 row-dot kernel for inputs already split by parity per 32-column block
/// ([`super::avx512_prefill::split_by_parity`], which [`super::Kernels`] runs once per product
/// on the calling thread when it holds a buffer): a few vectors go to the register tiles, more
/// to the GEMM, as in [`rows_q4b32`], and neither permutes an input again. Same bits as
/// [`rows_q4b32`] on the unsplit inputs. Without it, an expert's gate and up products past
/// eight tokens (the 64 KiB stack buffer of [`rows_q4b32`]) permuted every block of every
/// tile: 73 % of the FMA peak at 8 vectors of 2,048 columns, 56 % at 9 (BENCHMARKS).
///
/// `OWN_ROWS` picks the register tiles' prefetch scheme ([`super::Prefetch`]), `WHOLE` the
/// GEMM's token groups ([`super::TokenGroups`]).
///
/// # Safety
/// As `RowsFn` (for `x` split by parity), and the CPU must have AVX-512 F/BW/VL with FMA and
/// F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn rows_q4b32_split<const OWN_ROWS: bool, const WHOLE: bool>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe {
        if !takes_gemm(n, w.cols) {
            rows_q4b32_ordered::<OWN_ROWS>(w, r0, r1, x, n, y, ys)
        } else {
            super::avx512_prefill::rows_q4b32_split::<WHOLE>(w, r0, r1, x, n, y, ys)
        }
    }
}

/// Σ a[i]·b[i]: one 16-lane accumulator, a masked last step, then [`hsum`].
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, FMA and F16C; `a` and `b` have the same length.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    // SAFETY (all loads): i + 16 <= n in the loop; the tail is masked to n.
    while i + 16 <= n {
        acc = _mm512_fmadd_ps(unsafe { _mm512_loadu_ps(ap.add(i)) }, unsafe { _mm512_loadu_ps(bp.add(i)) }, acc);
        i += 16;
    }
    if i < n {
        let m = tail_mask(n - i);
        acc = _mm512_fmadd_ps(unsafe { _mm512_maskz_loadu_ps(m, ap.add(i)) }, unsafe { _mm512_maskz_loadu_ps(m, bp.add(i)) }, acc);
    }
    hsum(acc)
}

/// Σ a[i]: groups of four adjacent segments of `a` summed in lockstep into four 16-lane accumulators
/// (four sequential streams keep enough reads in flight to measure DRAM, as the 4-row kernels
/// do), combined as (0+1)+(2+3), then the rest, then the lanes.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn sum(a: &[f32]) -> f32 {
    let (n, p) = (a.len(), a.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    // Groups of four adjacent segments read in lockstep: four sequential streams a few KiB
    // apart, as a 4-row tile reads a matrix.
    let mut i = 0;
    // SAFETY (all loads): each group lies inside a (i + 4 * SUM_SEGMENT <= n); after the
    // groups, i + 16 <= n, and the last step is padded or masked to n.
    while i + 4 * super::SUM_SEGMENT <= n {
        let mut j = 0;
        while j < super::SUM_SEGMENT {
            for (k, s) in acc.iter_mut().enumerate() {
                prefetch_l2(p.wrapping_add(i + (k + 4) * super::SUM_SEGMENT + j) as *const u8);
                *s = _mm512_add_ps(*s, unsafe { _mm512_loadu_ps(p.add(i + k * super::SUM_SEGMENT + j)) });
            }
            j += 16;
        }
        i += 4 * super::SUM_SEGMENT;
    }
    let mut s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    while i + 16 <= n {
        s = _mm512_add_ps(s, unsafe { _mm512_loadu_ps(p.add(i)) });
        i += 16;
    }
    if i < n {
        s = _mm512_add_ps(s, unsafe { _mm512_maskz_loadu_ps(tail_mask(n - i), p.add(i)) });
    }
    hsum(s)
}
