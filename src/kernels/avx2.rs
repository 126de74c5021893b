//! AVX2 kernels (with FMA and F16C): 8 f32 lanes. Each has a scalar twin in [`super::scalar`]
//! and a test comparing them (`tests/kernels.rs`).
//!
//! The shape is that of [`super::avx512`] at half the width: one 8-lane accumulator per
//! (row, vector) pair; a quantized block is decoded in place into four 8-lane vectors whose
//! products are summed into a block vector, scaled and accumulated; lanes are summed by
//! [`hsum8`], a fixed tree. A row's last partial 8 columns are copied into zero-padded stack
//! buffers (AVX2 has no masked 16-bit load), so every step is a whole vector. Tiles prefetch
//! the next tile's rows into L2 as in [`super::avx512`].

use super::scalar::F16_TO_F32;
use super::MatRef;
use std::arch::x86_64::*;

/// Sums 8 lanes: halves, then pairs, then the last two — a fixed order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Asks for the cache line holding `p` to be brought into L2, ahead of use. A prefetch never
/// faults, so `p` may point past the matrix (the last tile prefetches nothing useful).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn prefetch_l2(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
}

/// The 32 nibbles of a Q4B32 payload as signed bytes holding 16·q, in position order:
/// (positions 0..16, positions 16..32). The low nibble of byte k is position 2k, the high one
/// 2k + 1 (seed 000, "The payload"); moving each to the top of its byte makes the byte, read
/// as signed, exactly 16·q, with no separate sign extension.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn nibbles_x16(b: __m128i) -> (__m128i, __m128i) {
    let top = _mm_set1_epi8(0xF0u8 as i8);
    // A 16-bit shift moves bits across byte boundaries too; the mask keeps only each byte's
    // own low nibble, now in its top half.
    let even = _mm_and_si128(_mm_slli_epi16::<4>(b), top);
    let odd = _mm_and_si128(b, top);
    (_mm_unpacklo_epi8(even, odd), _mm_unpackhi_epi8(even, odd))
}

/// Dense tiles: `$load(ptr)` widens 8 stored weights to f32.
macro_rules! dense_tile {
    ($name:ident, $elem:ty, $load:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &[f32], t0: usize, out: &mut [[f32; T]; R]) {
            let cols = w.cols;
            let wp = w.data.as_ptr() as *const $elem;
            let xp = x.as_ptr();
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            let full = cols / 8 * 8;
            let mut c = 0;
            // SAFETY (all loads): rows r..r+R and vectors t0..t0+T exist (the driver's
            // contract) and c + 8 <= cols.
            while c < full {
                for i in 0..R {
                    prefetch_l2(wp.wrapping_add((r + i + R) * cols + c) as *const u8);
                    let wv = unsafe { $load(wp.add((r + i) * cols + c)) };
                    for t in 0..T {
                        let xv = unsafe { _mm256_loadu_ps(xp.add((t0 + t) * cols + c)) };
                        acc[i][t] = _mm256_fmadd_ps(wv, xv, acc[i][t]);
                    }
                }
                c += 8;
            }
            if c < cols {
                let k = cols - c;
                for i in 0..R {
                    let mut wpad = [<$elem>::default(); 8];
                    // SAFETY: k values remain in row r + i.
                    unsafe { std::ptr::copy_nonoverlapping(wp.add((r + i) * cols + c), wpad.as_mut_ptr(), k) };
                    let wv = unsafe { $load(wpad.as_ptr()) };
                    for t in 0..T {
                        let mut xpad = [0f32; 8];
                        // SAFETY: k values remain in vector t0 + t.
                        unsafe { std::ptr::copy_nonoverlapping(xp.add((t0 + t) * cols + c), xpad.as_mut_ptr(), k) };
                        let xv = unsafe { _mm256_loadu_ps(xpad.as_ptr()) };
                        acc[i][t] = _mm256_fmadd_ps(wv, xv, acc[i][t]);
                    }
                }
            }
            for i in 0..R {
                for t in 0..T {
                    out[i][t] = hsum8(acc[i][t]);
                }
            }
        }
    };
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_f32(p: *const f32) -> __m256 {
    // SAFETY: the caller guarantees 8 readable values.
    unsafe { _mm256_loadu_ps(p) }
}

/// bf16 is the top half of an f32: widen to 32 bits and shift left 16 (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_bf16(p: *const u16) -> __m256 {
    // SAFETY: the caller guarantees 8 readable values.
    let v = unsafe { _mm_loadu_si128(p as *const __m128i) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_f16(p: *const u16) -> __m256 {
    // SAFETY: the caller guarantees 8 readable values.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p as *const __m128i) })
}

dense_tile!(tile_f32, f32, load_f32);
dense_tile!(tile_bf16, u16, load_bf16);
dense_tile!(tile_f16, u16, load_f16);

/// Quantized tiles: `$decode(block_ptr)` turns one block into its scale and four 8-lane
/// vectors of values (positions 0..8, 8..16, 16..24, 24..32).
macro_rules! block_tile {
    ($name:ident, $bytes:expr, $decode:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &[f32], t0: usize, out: &mut [[f32; T]; R]) {
            let (cols, rb) = (w.cols, w.row_bytes());
            let blocks = rb / $bytes;
            let wp = w.data.as_ptr();
            let xp = x.as_ptr();
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            for b in 0..blocks {
                for i in 0..R {
                    // About one prefetch per 64 bytes of row: on the first block starting in
                    // each 64-byte span.
                    if (b * $bytes) % 64 < $bytes {
                        prefetch_l2(wp.wrapping_add((r + i + R) * rb + b * $bytes));
                    }
                    // SAFETY: block b of row r + i lies inside the matrix (driver contract).
                    let (s, q) = unsafe { $decode(wp.add((r + i) * rb + b * $bytes)) };
                    for t in 0..T {
                        // SAFETY: vector t0 + t has `cols` = 32 × blocks values.
                        let xb = unsafe { xp.add((t0 + t) * cols + b * 32) };
                        let mut blk = _mm256_mul_ps(q[0], unsafe { _mm256_loadu_ps(xb) });
                        for k in 1..4 {
                            blk = _mm256_fmadd_ps(q[k], unsafe { _mm256_loadu_ps(xb.add(8 * k)) }, blk);
                        }
                        acc[i][t] = _mm256_fmadd_ps(blk, s, acc[i][t]);
                    }
                }
            }
            for i in 0..R {
                for t in 0..T {
                    out[i][t] = hsum8(acc[i][t]);
                }
            }
        }
    };
}

/// The binary16 scale at the start of a block, widened through [`F16_TO_F32`] (a broadcast
/// load, no conversion instruction) and broadcast.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees two readable bytes.
    let bits = u16::from_le(unsafe { (p as *const u16).read_unaligned() });
    _mm256_set1_ps(F16_TO_F32[bits as usize])
}

/// Sign-extends the low 8 bytes of `v` and converts them.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn widen8(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

/// Q8B32: 32 signed bytes after the scale.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn decode_q8(p: *const u8) -> (__m256, [__m256; 4]) {
    // SAFETY: the caller guarantees the 34-byte block at p.
    unsafe {
        let lo = _mm_loadu_si128(p.add(2) as *const __m128i);
        let hi = _mm_loadu_si128(p.add(18) as *const __m128i);
        let q = [widen8(lo), widen8(_mm_unpackhi_epi64(lo, lo)), widen8(hi), widen8(_mm_unpackhi_epi64(hi, hi))];
        (scale(p), q)
    }
}

/// Q4B32: 16·q from [`nibbles_x16`], with the 16 taken back out of the (exactly divided) scale.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn decode_q4(p: *const u8) -> (__m256, [__m256; 4]) {
    // SAFETY: the caller guarantees the 18-byte block at p.
    unsafe {
        let (lo, hi) = nibbles_x16(_mm_loadu_si128(p.add(2) as *const __m128i));
        let q = [widen8(lo), widen8(_mm_unpackhi_epi64(lo, lo)), widen8(hi), widen8(_mm_unpackhi_epi64(hi, hi))];
        (_mm256_mul_ps(scale(p), _mm256_set1_ps(0.0625)), q)
    }
}

block_tile!(tile_q8b32, 34, decode_q8);
block_tile!(tile_q4b32, 18, decode_q4);

row_driver!("avx2,fma,f16c", rows_f32, tile_f32, 4);
row_driver!("avx2,fma,f16c", rows_bf16, tile_bf16, 4);
row_driver!("avx2,fma,f16c", rows_f16, tile_f16, 4);
row_driver!("avx2,fma,f16c", rows_q8b32, tile_q8b32, 4);
row_driver!("avx2,fma,f16c", rows_q4b32, tile_q4b32, 4);

/// Σ a[i]·b[i]: one 8-lane accumulator, a zero-padded last step, then [`hsum8`].
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY (loads): i + 8 <= n.
    while i + 8 <= n {
        acc = _mm256_fmadd_ps(unsafe { _mm256_loadu_ps(a.as_ptr().add(i)) }, unsafe { _mm256_loadu_ps(b.as_ptr().add(i)) }, acc);
        i += 8;
    }
    if i < n {
        let (mut pa, mut pb) = ([0f32; 8], [0f32; 8]);
        pa[..n - i].copy_from_slice(&a[i..n]);
        pb[..n - i].copy_from_slice(&b[i..n]);
        acc = _mm256_fmadd_ps(unsafe { _mm256_loadu_ps(pa.as_ptr()) }, unsafe { _mm256_loadu_ps(pb.as_ptr()) }, acc);
    }
    hsum8(acc)
}

/// Σ a[i]: groups of four adjacent segments of `a` summed in lockstep into four 8-lane accumulators
/// (four sequential streams keep enough reads in flight to measure DRAM, as the 4-row kernels
/// do), combined as (0+1)+(2+3), then the rest, then the lanes.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn sum(a: &[f32]) -> f32 {
    let (n, p) = (a.len(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    // Groups of four adjacent segments read in lockstep: four sequential streams a few KiB
    // apart, as a 4-row tile reads a matrix.
    let mut i = 0;
    // SAFETY (all loads): each group lies inside a (i + 4 * SUM_SEGMENT <= n); after the
    // groups, i + 8 <= n, and the last step is padded or masked to n.
    while i + 4 * super::SUM_SEGMENT <= n {
        let mut j = 0;
        while j < super::SUM_SEGMENT {
            for (k, s) in acc.iter_mut().enumerate() {
                prefetch_l2(p.wrapping_add(i + (k + 4) * super::SUM_SEGMENT + j) as *const u8);
                *s = _mm256_add_ps(*s, unsafe { _mm256_loadu_ps(p.add(i + k * super::SUM_SEGMENT + j)) });
            }
            j += 8;
        }
        i += 4 * super::SUM_SEGMENT;
    }
    let mut s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    while i + 8 <= n {
        s = _mm256_add_ps(s, unsafe { _mm256_loadu_ps(p.add(i)) });
        i += 8;
    }
    if i < n {
        let mut pad = [0f32; 8];
        pad[..n - i].copy_from_slice(&a[i..n]);
        s = _mm256_add_ps(s, unsafe { _mm256_loadu_ps(pad.as_ptr()) });
    }
    hsum8(s)
}
