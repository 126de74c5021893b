//! AVX2 kernels of the int21 path ([`super::int21`] states the arithmetic and holds the scalar
//! twin they equal bit for bit): `vpmaddubsw` + `vpmaddwd` on every AVX2 CPU, or AVX-VNNI's
//! `vpdpbusd` where the CPU has it — written once ([`int21_avx2_kernels`]) and built for each.
//!
//! The shape is the int16 path's few-vector form ([`super::int16_avx2`]): two rows share a
//! register, one per 128-bit half, each block's 16 payload bytes as they lie. Their low
//! nibbles (the even positions, as unsigned `w + 8`) and their high nibbles (the odd ones)
//! meet each digit's two 16-byte runs of the activation block, broadcast to both halves
//! straight from the quantized buffer — no per-call rearranging — and each 32-bit lane sums
//! eight exact products per digit; the digits' sums, scaled by 2¹⁴, 2⁷ and 1, add up to four
//! partial sums of `Σ (w + 8)·X` per row. Three horizontal adds turn four such registers
//! (rows 0 and 4, 1 and 5, 2 and 6, 3 and 7) into the eight rows' block sums in row order;
//! `8·ΣX`, the offset the unsigned nibbles add, is taken off, and the rest is int16's: the
//! sums converted, the rows' scales times the block's activation scale, one fused
//! multiply-add into the rows' accumulators, blocks in order.
//!
//! Several vectors run four at a time (the weights are read again for each four): the path is
//! for decode, whose single vector is bound by the f32 kernels' instruction count on AVX2.

use super::int16_avx2::{gather_scales, live_mask};
use super::int21::{block_digits, Digits, AHEAD, BLOCK_BYTES as BYTES, CHUNK_BLOCKS, OWN_ROWS_MIN_BYTES};
use super::int8::Acts;
use super::MatRef;
use std::arch::x86_64::*;

/// Rows per register group (the lanes of the block sums).
const LANES: usize = 8;
/// Vectors per pass over the weights.
const FEW: usize = 4;

/// A block's 96 digit bytes of vector `t`: six 16-byte runs (H even, H odd, M even, M odd,
/// D even, D odd), each broadcast to both 128-bit halves.
///
/// # Safety
/// The 96 bytes at `p` are readable.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn digit_runs(p: *const i8) -> [__m256i; 6] {
    // SAFETY: the caller's contract.
    std::array::from_fn(|k| unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(16 * k).cast())) })
}

/// `8·ΣX` of a block from its 96 digit bytes: each digit's 32 bytes summed in pairs, the pairs
/// scaled by the digit's weight (2¹⁴, 2⁷, 1) and summed — exact (|ΣX| ≤ 32·L < 2²⁶).
///
/// # Safety
/// The 96 bytes at `p` are readable.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn offset_of(p: *const i8) -> i32 {
    let ones = _mm256_set1_epi8(1);
    // SAFETY: the caller's contract.
    let digit = |k: usize, weight: i16| unsafe {
        _mm256_madd_epi16(_mm256_maddubs_epi16(ones, _mm256_loadu_si256(p.add(32 * k).cast())), _mm256_set1_epi16(weight))
    };
    let v = _mm256_add_epi32(_mm256_add_epi32(digit(0, 1 << 14), digit(1, 1 << 7)), digit(2, 1));
    let h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b01_00_11_10>(h));
    8 * _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32::<0b10_11_00_01>(h)))
}

/// Each block's `−8·ΣX` (the offset the unsigned nibbles add, negated so that the kernels add
/// it) for blocks `b0..b0 + kb` of vectors `t0..t0 + T`, into `out[t][b - b0]`: the AVX2 and
/// AVX-512 forms' per-chunk table.
///
/// # Safety
/// Those blocks of those vectors exist in `x`; `kb ≤ CHUNK_BLOCKS`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn negated_offsets<const T: usize>(x: &Acts<Digits>, t0: usize, b0: usize, kb: usize, out: &mut [[i32; CHUNK_BLOCKS]; T]) {
    for (t, ot) in out.iter_mut().enumerate() {
        for (b, o) in ot.iter_mut().take(kb).enumerate() {
            // SAFETY: the caller's contract.
            *o = -unsafe { offset_of(block_digits(x, t0 + t, b0 + b)) };
        }
    }
}

/// Block step `b` (of the chunk starting at block `b0`; `blocks` a row) of a row group's
/// prefetch, for rows `rb` bytes long starting at `rows` (block `b0` of each): with
/// `own_rows` each row asks for its own line [`AHEAD`] blocks on, every fourth step — past
/// the row's end the same place in the next group's row, `rows.len()` rows on (a prefetch
/// does not fault); else the step's share of the next group's contiguous lines at `next`
/// ([`OWN_ROWS_MIN_BYTES`] says which). Shared by the AVX2 and AVX-512 forms.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn prefetch_step(rows: &[*const u8], next: *const u8, b: usize, b0: usize, blocks: usize, rb: usize, own_rows: bool) {
    let lanes = rows.len();
    if !own_rows {
        super::avx2::prefetch_span(next.wrapping_add(b * BYTES * lanes), BYTES * lanes);
    } else if b.is_multiple_of(4) {
        let ahead = (b + AHEAD) * BYTES + if b0 + b + AHEAD < blocks { 0 } else { (lanes - 1) * rb };
        for row in rows {
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead).cast());
        }
    }
}

/// Two rows' block payloads (`lo` in the low 128-bit half, `hi` in the high one) as unsigned
/// nibbles `w + 8`: (the even positions, the odd ones).
///
/// # Safety
/// Both pointers are whole Q4B32 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibbles(lo: *const u8, hi: *const u8) -> (__m256i, __m256i) {
    // SAFETY: 16 payload bytes after each block's scale.
    let v = unsafe { _mm256_loadu2_m128i(hi.add(2).cast(), lo.add(2).cast()) };
    // A two's-complement nibble q flipped in bit 3 is q + 8.
    let v = _mm256_xor_si256(v, _mm256_set1_epi8(0x88u8 as i8));
    let low = _mm256_set1_epi8(0x0F);
    (_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16::<4>(v), low))
}

/// `vpmaddubsw` + `vpmaddwd`: the digits' pair sums (at most 2·15·127 each, two runs added:
/// no 16-bit saturation) scaled and widened by `vpmaddwd`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn digits_madd(even: __m256i, odd: __m256i, runs: &[__m256i; 6]) -> __m256i {
    let digit = |k: usize, weight: i16| {
        let pairs = _mm256_add_epi16(_mm256_maddubs_epi16(even, runs[2 * k]), _mm256_maddubs_epi16(odd, runs[2 * k + 1]));
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(weight))
    };
    _mm256_add_epi32(_mm256_add_epi32(digit(0, 1 << 14), digit(1, 1 << 7)), digit(2, 1))
}

/// AVX-VNNI `vpdpbusd`: each digit's four products per lane summed straight into the running
/// sum, which is scaled by 2⁷ before the next digit's (Horner's rule for `2¹⁴·H + 2⁷·M + D`:
/// two shifts and no adds, exact — every partial value is within the final sum's bound).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
fn digits_vnni(even: __m256i, odd: __m256i, runs: &[__m256i; 6]) -> __m256i {
    use super::int8_x86::dpbusd_avx as dot;
    let digit = |acc: __m256i, k: usize| dot(dot(acc, even, runs[2 * k]), odd, runs[2 * k + 1]);
    let h = digit(_mm256_setzero_si256(), 0);
    let m = digit(_mm256_slli_epi32::<7>(h), 1);
    digit(_mm256_slli_epi32::<7>(m), 2)
}

/// Generates the kernels for one way of summing the digits' products: `$feat` the
/// instruction sets, `$digits(even, odd, runs)` four partial sums per row of `Σ (w + 8)·X`.
macro_rules! int21_avx2_kernels {
    ($feat:literal, $digits:ident) => {
        use super::*;

        /// Rows `r0..r1` of the Q4B32 matrix `w` against `n` quantized vectors, under
        /// [`crate::kernels::Prefetch::OwnRows`]: rows of
        /// [`crate::kernels::int21::OWN_ROWS_MIN_BYTES`] or more ask for their own lines
        /// ahead, shorter ones for the next group's.
        ///
        /// # Safety
        /// As [`crate::kernels::int21::Int21RowsFn`]; the CPU has the instruction sets named
        /// in the attribute.
        #[target_feature(enable = $feat)]
        pub unsafe fn rows_q4(w: &MatRef, r0: usize, r1: usize, x: &Acts<Digits>, n: usize, y: *mut f32, ys: usize) {
            // SAFETY: forwarded contract.
            unsafe { rows::<true>(w, r0, r1, x, n, y, ys) }
        }

        /// As [`rows_q4`], every row asking for the next group's lines (under
        /// [`crate::kernels::Prefetch::TileAfterNext`]).
        ///
        /// # Safety
        /// As [`rows_q4`].
        #[target_feature(enable = $feat)]
        pub unsafe fn rows_q4_next_group(w: &MatRef, r0: usize, r1: usize, x: &Acts<Digits>, n: usize, y: *mut f32, ys: usize) {
            // SAFETY: forwarded contract.
            unsafe { rows::<false>(w, r0, r1, x, n, y, ys) }
        }

        /// [`rows_q4`] (`OWN`) or [`rows_q4_next_group`].
        ///
        /// # Safety
        /// As [`rows_q4`].
        #[target_feature(enable = $feat)]
        unsafe fn rows<const OWN: bool>(w: &MatRef, r0: usize, r1: usize, x: &Acts<Digits>, n: usize, y: *mut f32, ys: usize) {
            let rb = w.row_bytes();
            if n == 0 || r0 >= r1 {
                return;
            }
            if rb < BYTES || rb > (i32::MAX as usize) / LANES {
                // No columns (every result is 0), or rows too long for the gathers' 32-bit
                // offsets: the scalar twin gives the same bits.
                // SAFETY: forwarded contract.
                return unsafe { crate::kernels::int21::rows_q4(w, r0, r1, x, n, y, ys) };
            }
            let offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(rb as i32));
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

        /// Vectors `t0..t0 + T` against rows `r0..r1` (see the module notes), the rows asking
        /// for their own lines ahead when `own_rows`, else for the next group's.
        ///
        /// # Safety
        /// As [`rows_q4`], for those vectors.
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn few<const T: usize>(w: &MatRef, r0: usize, r1: usize, x: &Acts<Digits>, t0: usize, offsets: __m256i, own_rows: bool, y: *mut f32, ys: usize) {
            let rb = w.row_bytes();
            let blocks = rb / BYTES;
            let digits = |t: usize, b: usize| block_digits(x, t0 + t, b);
            let out = |t: usize, g: usize| y.wrapping_add((t0 + t) * ys + g);
            let mut offset = [[0i32; CHUNK_BLOCKS]; T];
            let mut b0 = 0;
            while b0 < blocks {
                let kb = (blocks - b0).min(CHUNK_BLOCKS);
                // SAFETY: blocks b0..b0 + kb of vectors t0..t0 + T exist (the caller's contract).
                unsafe { negated_offsets(x, t0, b0, kb, &mut offset) };
                let mut g = r0;
                while g < r1 {
                    let live = (r1 - g).min(LANES);
                    let mask = live_mask(live);
                    let mut acc = [_mm256_setzero_ps(); T];
                    if b0 > 0 {
                        for (t, a) in acc.iter_mut().enumerate() {
                            // SAFETY: the caller's contract; masked lanes are not read.
                            *a = unsafe { _mm256_maskload_ps(out(t, g), mask) };
                        }
                    }
                    // Row g + j, or the last row of the range for lanes past it (read, never stored).
                    let at: [*const u8; LANES] = std::array::from_fn(|j| w.data.as_ptr().wrapping_add((g + j).min(r1 - 1) * rb + b0 * BYTES));
                    // The next group's eight rows are contiguous: under the next group's scheme
                    // each block step asks for its share of their lines at this chunk's columns.
                    let next = w.data.as_ptr().wrapping_add((g + LANES) * rb + b0 * BYTES * LANES);
                    for b in 0..kb {
                        prefetch_step(&at, next, b, b0, blocks, rb, own_rows);
                        let blk = |j: usize| at[j].wrapping_add(b * BYTES);
                        // SAFETY: the live rows' block b0 + b is within the matrix.
                        let scales = unsafe { gather_scales(blk(0), offsets, mask) };
                        // Rows j and j + 4 share a register: the adds below leave row order.
                        let mut part = [[_mm256_setzero_si256(); 4]; T];
                        for j in 0..4 {
                            // SAFETY: both pointers are blocks of rows within the matrix.
                            let (even, odd) = unsafe { nibbles(blk(j), blk(j + 4)) };
                            for (t, pt) in part.iter_mut().enumerate() {
                                // SAFETY: block b0 + b of vector t0 + t exists.
                                pt[j] = $digits(even, odd, unsafe { &digit_runs(digits(t, b0 + b)) });
                            }
                        }
                        for (t, a) in acc.iter_mut().enumerate() {
                            let [p0, p1, p2, p3] = part[t];
                            let s = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
                            let s = _mm256_add_epi32(s, _mm256_set1_epi32(offset[t][b]));
                            // SAFETY: the block's scale of vector t0 + t.
                            let d = unsafe { *x.d.as_ptr().add((t0 + t) * blocks + b0 + b) };
                            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(scales, _mm256_set1_ps(d)), *a);
                        }
                    }
                    for (t, a) in acc.iter().enumerate() {
                        // SAFETY: the caller's contract; masked lanes are not written.
                        unsafe { _mm256_maskstore_ps(out(t, g), mask, *a) };
                    }
                    g += live;
                }
                b0 += kb;
            }
        }
    };
}

/// The int21 quantizer on eight lanes ([`super::int21::quantize_block`]'s rule, bit for bit:
/// the block's largest |x| and `L / max` as the scalar computes them, each `x · inv` the same
/// f32 product rounded to nearest even by the conversion; the digits by the same integer
/// steps), each digit's 32 bytes packed to position order and split into its even and odd
/// runs.
///
/// # Safety
/// As [`super::int8::QuantizeFn`]; the CPU has AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize(x: &[f32], q: &mut [Digits], d: &mut [f32]) {
    let blocks = (x.len() / 32).min(q.len() / 32).min(d.len());
    let (half, mask) = (_mm256_set1_epi32(64), _mm256_set1_epi32(127));
    // Bytes packed as (0..4, 8..12, 16..20, 24..28 | 4..8, ...): dwords back to position
    // order, then each 128-bit lane's even bytes before its odd ones, then the lanes' even
    // halves before their odd ones.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let parity = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                  0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (b, scale) in d.iter_mut().take(blocks).enumerate() {
        // SAFETY: block b lies inside x (blocks is bounded by it).
        let (v, amax, finite) = unsafe { super::int16_avx2::block_max(x.as_ptr().add(32 * b)) };
        let out = q[32 * b..32 * b + 32].as_mut_ptr().cast::<u8>();
        if !finite || amax == 0.0 {
            // SAFETY: 96 bytes at `out`.
            unsafe { std::ptr::write_bytes(out, 0, 96) };
            *scale = if finite { 0.0 } else { f32::NAN };
            continue;
        }
        let inv = _mm256_set1_ps(super::int21::LEVEL as f32 / amax);
        let level: [__m256i; 4] = v.map(|vi| _mm256_cvtps_epi32(_mm256_mul_ps(vi, inv)));
        // The lowest balanced base-128 digit of each lane, and what is left of it, / 128.
        let split = |x: __m256i| {
            let low = _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(x, half), mask), half);
            (low, _mm256_srai_epi32::<7>(_mm256_sub_epi32(x, low)))
        };
        let first = level.map(split);
        let second = first.map(|(_, rest)| split(rest));
        let digits = [second.map(|(_, high)| high), second.map(|(mid, _)| mid), first.map(|(low, _)| low)];
        for (k, digit) in digits.iter().enumerate() {
            // Every digit fits a byte: nothing saturates.
            let bytes = _mm256_packs_epi16(_mm256_packs_epi32(digit[0], digit[1]), _mm256_packs_epi32(digit[2], digit[3]));
            let runs = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(bytes, order), parity);
            // SAFETY: 32 bytes at out + 32k of the block's 96.
            unsafe { _mm256_storeu_si256(out.add(32 * k).cast(), _mm256_permute4x64_epi64::<0b11_01_10_00>(runs)) };
        }
        *scale = amax / super::int21::LEVEL as f32;
    }
}

/// The kernels with `vpmaddubsw` + `vpmaddwd` (every AVX2 CPU).
pub mod madd {
    int21_avx2_kernels!("avx2,fma,f16c", digits_madd);
}

/// The kernels with AVX-VNNI `vpdpbusd`.
pub mod vnni {
    int21_avx2_kernels!("avx2,fma,f16c,avxvnni", digits_vnni);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::int21::{self, Digits};
    use crate::kernels::TestRng as Rng;
    use crate::format::dtype::DType;

    #[test]
    fn both_forms_equal_the_scalar_twin() {
        if !is_x86_feature_detected!("avx2") || !is_x86_feature_detected!("fma") || !is_x86_feature_detected!("f16c") {
            println!("SKIP: both_forms_equal_the_scalar_twin: this CPU has no AVX2, FMA and F16C");
            return;
        }
        let mut rng = Rng(0x1d21);
        for (rows, blocks, n) in [(19, 3, 1), (8, 1, 2), (37, 600, 1), (16, 5, 3), (9, 7, 4), (23, 4, 9), (1, 2, 1)] {
            let data = rng.blocks(BYTES, rows * blocks);
            let w = crate::kernels::MatRef { data: &data, rows, cols: blocks * 32, dtype: DType::Q4B32 };
            let xs: Vec<f32> = (0..n * blocks * 32).map(|_| rng.f32() * 3.0 - 1.5).collect();
            let mut q = vec![Digits::default(); xs.len()];
            let mut d = vec![0f32; xs.len() / 32];
            int21::quantize_with(crate::kernels::Int8Isa::Scalar, &xs, &mut q, &mut d);
            let acts = Acts { q: &q, d: &d, cols: blocks * 32 };
            let (r0, r1) = (rows / 5, rows);
            let mut want = vec![0f32; n * rows];
            // SAFETY: the buffers hold n × rows results and the matrix is whole.
            unsafe { int21::rows_q4(&w, r0, r1, &acts, n, want.as_mut_ptr(), rows) };
            // Each form under both prefetch schemes (only when bytes arrive differs).
            let mut forms: Vec<(&str, int21::Int21RowsFn)> = vec![("madd", madd::rows_q4), ("madd, next group", madd::rows_q4_next_group)];
            if crate::kernels::has_avx_vnni() {
                forms.extend([("vnni", vnni::rows_q4 as int21::Int21RowsFn), ("vnni, next group", vnni::rows_q4_next_group)]);
            } else {
                println!("SKIP: the AVX-VNNI form: this CPU has no AVX-VNNI");
            }
            if crate::kernels::Int8Isa::Avx512Vnni.supported() {
                forms.extend([("avx512vnni", crate::kernels::int21_x86::rows_q4 as int21::Int21RowsFn),
                              ("avx512vnni, next group", crate::kernels::int21_x86::rows_q4_next_group)]);
            } else {
                println!("SKIP: the AVX-512 VNNI form: this CPU has no AVX-512 VNNI");
            }
            for (name, f) in forms {
                let mut got = vec![0f32; n * rows];
                // SAFETY: as above; the form's instruction sets were checked.
                unsafe { f(&w, r0, r1, &acts, n, got.as_mut_ptr(), rows) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{name}: {rows} rows × {blocks} blocks, {n} vectors");
            }
        }
    }
}
