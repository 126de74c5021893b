//! x86 kernels of the int8-activation path ([`super::int8`], which states the arithmetic and
//! holds the scalar twins they equal bit for bit): AVX-512 VNNI (`vpdpbusd`) on 512-bit
//! registers, two blocks of 32 weights per register, and AVX2 (`vpmaddubsw` + `vpmaddwd`, or
//! AVX-VNNI's `vpdpbusd` where the CPU has it) on 256-bit registers, one block per register.
//!
//! Two blocks per 512-bit register: on a CPU with full-width 512-bit units (Sapphire Rapids:
//! `vpdpbusd` on zmm runs 1.4× the multiply-adds per second of ymm, measured with a
//! throughput loop) that halves the instructions per weight; on one that splits 512-bit
//! instructions into halves (Zen 4) it costs the same execution slots as two 256-bit ones,
//! and the gathering of two blocks into one register is loads and one blend.
//!
//! Both instructions multiply an *unsigned* byte by a signed one. The weights are made
//! unsigned by an offset — Q4B32 nibble `q` becomes `q + 8` (flip bit 3), Q8B32 byte `w`
//! becomes `w + 128` (flip bit 7) — and the offset's contribution, `8·Σx` or `128·Σx` over the
//! lane's four positions, is subtracted in the same integer lane (with VNNI it is the
//! accumulator's starting value), so each lane holds exactly Σ w·q. `vpmaddubsw` saturates its
//! 16-bit pair sums, which `(w + 128)·x` pairs could exceed, so AVX2 handles Q8B32 with the
//! sign trick instead: |w| × (x with w's sign), pairs at most 2·128·127 < 2¹⁵.
//!
//! Per (row, block, vector) the weights are decoded once per row and block and serve every
//! vector of the tile; the activations' block (permuted for Q4B32 and its offset correction)
//! is prepared once per block and vector and serves every row.

use super::avx2::{hsum8, prefetch_span};
use super::int8::Acts;
use super::scalar::F16_TO_F32;
use super::MatRef;
use std::arch::x86_64::*;

/// The binary16 scale at the start of a block, widened through [`F16_TO_F32`], broadcast.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees two readable bytes.
    let bits = u16::from_le(unsafe { (p as *const u16).read_unaligned() });
    _mm256_set1_ps(F16_TO_F32[bits as usize])
}

/// Q4B32's 16 payload bytes as 32 unsigned bytes `q + 8`: low nibbles (even positions) in the
/// low half, high nibbles (odd positions) in the high half. The payload is broadcast to both
/// halves and the high half shifted right by 4 (a 32-bit shift: the bits it drags in from the
/// next byte are masked off).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q4_nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees the 18-byte block at p.
    let b = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(p.add(2) as *const __m128i) });
    _mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4))
}

/// Lane partials → f32, scaled by `w_scale · x_scale`, into the accumulator.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn accumulate(p: __m256i, dw: __m256, dx: __m256, acc: __m256) -> __m256 {
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, dx), acc)
}

/// A tile of `R` rows × `T` vectors. `$xprep(q_ptr)` prepares one activation block (the bytes
/// in the weights' lane order, and the offset correction), `$decode(block_ptr)` one weight
/// block (two registers, the second unused by some kernels), `$dot(w, x)` the eight exact lane
/// partials. Even blocks go to accumulator 0 and odd ones to accumulator 1 (`H`).
macro_rules! int8_tile {
    ($feat:literal, $name:ident, $bytes:expr, $xprep:ident, $decode:ident, $dot:ident) => {
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn $name<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &Acts, t0: usize, out: &mut [[f32; T]; R]) {
            #[target_feature(enable = $feat)]
            #[inline]
            #[allow(clippy::too_many_arguments)]
            unsafe fn block<const R: usize, const T: usize, const H: usize>(w: &MatRef, rb: usize, r: usize, b: usize, x: &Acts,
                                                                        t0: usize, acc: &mut [[[__m256; 2]; T]; R]) {
                let per = x.cols / 32;
                let wp = w.data.as_ptr();
                let mut xs = [((_mm256_setzero_si256(), _mm256_setzero_si256()), _mm256_setzero_ps()); T];
                for (t, v) in xs.iter_mut().enumerate() {
                    let at = (t0 + t) * per + b;
                    // SAFETY: vector t0 + t has `per` blocks (the driver's contract).
                    *v = unsafe { ($xprep(x.q.as_ptr().add(at * 32)), _mm256_set1_ps(*x.d.as_ptr().add(at))) };
                }
                // This step's share of the next tile's rows.
                prefetch_span(wp.wrapping_add((r + R) * rb + b * R * $bytes), R * $bytes);
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    // SAFETY: block b of row r + i lies inside the matrix (the driver's contract).
                    let blk = unsafe { wp.add((r + i) * rb + b * $bytes) };
                    let (wv, dw) = unsafe { ($decode(blk), scale(blk)) };
                    for (a, (xv, dx)) in acc_i.iter_mut().zip(&xs) {
                        a[H] = accumulate($dot(wv, *xv), dw, *dx, a[H]);
                    }
                }
            }
            let rb = w.row_bytes();
            let blocks = rb / $bytes;
            let mut acc = [[[_mm256_setzero_ps(); 2]; T]; R];
            let mut b = 0;
            // SAFETY (all calls): b < blocks, and the driver's contract covers rows and vectors.
            while b + 2 <= blocks {
                unsafe { block::<R, T, 0>(w, rb, r, b, x, t0, &mut acc) };
                unsafe { block::<R, T, 1>(w, rb, r, b + 1, x, t0, &mut acc) };
                b += 2;
            }
            if b < blocks {
                unsafe { block::<R, T, 0>(w, rb, r, b, x, t0, &mut acc) };
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                for (v, pair) in o.iter_mut().zip(a) {
                    *v = hsum8(_mm256_add_ps(pair[0], pair[1]));
                }
            }
        }
    };
}

/// Generates an [`super::int8::Int8RowsFn`] from a tile: `$decode_rows` rows at a time (then
/// 4, then 1) for one vector, `$rows` × `$tokens` tiles (then single vectors, then single
/// rows) otherwise. Every (row, vector) pair runs the same operations in every tile shape, so
/// results do not depend on `n`, the row range or the thread count.
macro_rules! int8_driver {
    ($feat:literal, $name:ident, $tile:ident, $decode_rows:literal, $rows:literal, $tokens:literal) => {
        /// SIMD int8-path kernel (see [`super::int8::Int8RowsFn`]).
        ///
        /// # Safety
        /// As `Int8RowsFn`, and the CPU must have the instruction sets named in the attribute.
        #[target_feature(enable = $feat)]
        pub unsafe fn $name(w: &MatRef, r0: usize, r1: usize, x: &Acts, n: usize, y: *mut f32, ys: usize) {
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn run<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &Acts, t0: usize, y: *mut f32, ys: usize) {
                let mut o = [[0f32; T]; R];
                // SAFETY: the driver's caller guarantees rows r..r+R and vectors t0..t0+T exist.
                unsafe { $tile::<R, T>(w, r, x, t0, &mut o) };
                for (i, row) in o.iter().enumerate() {
                    for (j, v) in row.iter().enumerate() {
                        // SAFETY: element (t0 + j, r + i) is the caller's to write.
                        unsafe { *y.add((t0 + j) * ys + r + i) = *v };
                    }
                }
            }
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn tokens<const R: usize>(w: &MatRef, r: usize, x: &Acts, n: usize, y: *mut f32, ys: usize) {
                let mut t = 0;
                // SAFETY (all calls): t + T <= n.
                while t + $tokens <= n {
                    unsafe { run::<R, $tokens>(w, r, x, t, y, ys) };
                    t += $tokens;
                }
                while t < n {
                    unsafe { run::<R, 1>(w, r, x, t, y, ys) };
                    t += 1;
                }
            }
            let mut r = r0;
            // SAFETY (all calls): r + R <= r1 <= w.rows, and the caller's contract covers y.
            if n == 1 {
                while $decode_rows > 4 && r + $decode_rows <= r1 {
                    unsafe { run::<$decode_rows, 1>(w, r, x, 0, y, ys) };
                    r += $decode_rows;
                }
                while r + 4 <= r1 {
                    unsafe { run::<4, 1>(w, r, x, 0, y, ys) };
                    r += 4;
                }
                while r < r1 {
                    unsafe { run::<1, 1>(w, r, x, 0, y, ys) };
                    r += 1;
                }
            } else {
                while r + $rows <= r1 {
                    unsafe { tokens::<$rows>(w, r, x, n, y, ys) };
                    r += $rows;
                }
                while r < r1 {
                    unsafe { tokens::<1>(w, r, x, n, y, ys) };
                    r += 1;
                }
            }
        }
    };
}

// ---- AVX-512 VNNI ----
//
// 512-bit registers, two blocks each: block b (even) in the low 256 bits, block b + 1 (odd) in
// the high 256, so one accumulator register holds the module's two accumulator sets — even
// blocks' lanes low, odd blocks' high — and the final low + high, then `hsum8`, is the scalar
// twin's sum. A row's last block, when the count is odd, is alone in the low half; the high
// half then multiplies zero activations by a zero scale, which adds +0 to accumulators that are
// never −0 (every product is p·s with s ≥ 0), so no bit changes.

/// One vector's activations for a block pair: the bytes (in the weights' lane order), the
/// offset correction per lane (−offset·Σx, the `vpdpbusd` starting value) and each block's
/// scale across its 8 lanes.
#[derive(Clone, Copy)]
pub(super) struct XPair {
    pub q: __m512i,
    pub off: __m512i,
    pub d: __m512,
}

/// Blocks `b, b + 1` of one vector's activations (`q` at block b, `d` its scale; only block b
/// when `!both`), with the byte order `order` and weight offset `offset`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn x_pair(q: *const i8, d: *const f32, both: bool, order: Option<__m512i>, offset: i8) -> XPair {
    // SAFETY: the caller guarantees 64 (or, when !both, 32) readable bytes at q and 2 (1) scales.
    unsafe {
        let (x, d) = if both {
            (_mm512_loadu_si512(q as *const __m512i), halves(_mm512_set1_ps(*d), _mm256_set1_ps(*d.add(1))))
        } else {
            (_mm512_castsi256_si512(_mm256_loadu_si256(q as *const __m256i)), _mm512_maskz_mov_ps(0x00ff, _mm512_set1_ps(*d)))
        };
        let x = if both { x } else { _mm512_maskz_mov_epi32(0x00ff, x) };
        let x = match order {
            Some(o) => _mm512_permutexvar_epi8(o, x),
            None => x,
        };
        let zero = _mm512_setzero_si512();
        let off = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(offset), x));
        XPair { q: x, off, d }
    }
}

/// `lo`'s low 256 bits and `hi` (AVX-512 F only: `vinsertf64x4`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[inline]
fn halves(lo: __m512, hi: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(lo), _mm256_castps_pd(hi)))
}

/// Each 32-byte half reordered to the Q4B32 nibble layout: even positions, then odd.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[inline]
pub(super) fn q4_order() -> __m512i {
    let mut idx = [0i8; 64];
    for (i, v) in idx.iter_mut().enumerate() {
        let (half, k) = (i / 32, i % 32);
        *v = (half * 32 + if k < 16 { 2 * k } else { 2 * (k - 16) + 1 }) as i8;
    }
    // SAFETY: 64 bytes read from a local array.
    unsafe { _mm512_loadu_si512(idx.as_ptr() as *const __m512i) }
}

/// Two blocks' scales across their 8 lanes each (block b + 1's zero when `!both`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn scale_pair(p: *const u8, bytes: usize, both: bool) -> __m512 {
    // SAFETY: the caller guarantees the block(s) at p.
    unsafe {
        let s0 = scale_bits(p);
        if both {
            halves(_mm512_set1_ps(s0), _mm256_set1_ps(scale_bits(p.add(bytes))))
        } else {
            _mm512_maskz_mov_ps(0x00ff, _mm512_set1_ps(s0))
        }
    }
}

/// The binary16 scale at the start of a block, widened through [`F16_TO_F32`].
#[inline]
unsafe fn scale_bits(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees two readable bytes.
    F16_TO_F32[u16::from_le(unsafe { (p as *const u16).read_unaligned() }) as usize]
}

/// Q8B32 blocks `b, b + 1` + 128 as unsigned bytes (block b + 1 zero when `!both`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn w_pair_q8(p: *const u8, both: bool) -> __m512i {
    // SAFETY: the caller guarantees the 34-byte block(s) at p.
    unsafe {
        let lo = _mm512_castsi256_si512(_mm256_loadu_si256(p.add(2) as *const __m256i));
        let w = if both { _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(p.add(36) as *const __m256i)) } else { lo };
        _mm512_xor_si512(w, _mm512_set1_epi8(-128))
    }
}

/// Q4B32 blocks `b, b + 1` + 8 as unsigned bytes, each block's low nibbles then high nibbles.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn w_pair_q4(p: *const u8, both: bool) -> __m512i {
    // SAFETY: the caller guarantees the 18-byte block(s) at p.
    unsafe {
        let v = _mm512_broadcast_i32x4(_mm_loadu_si128(p.add(2) as *const __m128i));
        let v = if both { _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128(p.add(20) as *const __m128i)) } else { v };
        let v = _mm512_srlv_epi32(v, _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4));
        // imm 0x6A: (A & B) ^ C for A = nibbles, B = 0x0F, C = 0x08.
        _mm512_ternarylogic_epi32::<0x6A>(v, _mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x08))
    }
}

/// A tile of `R` rows × `T` vectors of the VNNI path, two blocks per step.
macro_rules! vnni_tile {
    ($name:ident, $bytes:expr, $wpair:ident, $q4:expr, $offset:expr) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &Acts, t0: usize, out: &mut [[f32; T]; R]) {
            let rb = w.row_bytes();
            let blocks = rb / $bytes;
            let per = x.cols / 32;
            let wp = w.data.as_ptr();
            let order = if $q4 { Some(q4_order()) } else { None };
            let mut acc = [[_mm512_setzero_ps(); T]; R];
            let mut b = 0;
            while b < blocks {
                let both = b + 1 < blocks;
                let mut xs = [XPair { q: _mm512_setzero_si512(), off: _mm512_setzero_si512(), d: _mm512_setzero_ps() }; T];
                for (t, v) in xs.iter_mut().enumerate() {
                    let at = (t0 + t) * per + b;
                    // SAFETY: vector t0 + t has `per` blocks, b (and b + 1 when both) among them.
                    *v = unsafe { x_pair(x.q.as_ptr().add(at * 32), x.d.as_ptr().add(at), both, order, $offset) };
                }
                // This step's share (two blocks per row) of the next tile's rows.
                prefetch_span(wp.wrapping_add((r + R) * rb + b * R * $bytes), 2 * R * $bytes);
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    // SAFETY: blocks b (and b + 1) of row r + i lie inside the matrix.
                    let (wv, ws) = unsafe {
                        let blk = wp.add((r + i) * rb + b * $bytes);
                        ($wpair(blk, both), scale_pair(blk, $bytes, both))
                    };
                    for (a, xv) in acc_i.iter_mut().zip(&xs) {
                        let p = _mm512_dpbusd_epi32(xv.off, wv, xv.q);
                        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(ws, xv.d), *a);
                    }
                }
                b += 2;
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                for (v, pair) in o.iter_mut().zip(a) {
                    let lo = _mm512_castps512_ps256(*pair);
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*pair)));
                    *v = hsum8(_mm256_add_ps(lo, hi));
                }
            }
        }
    };
}

vnni_tile!(tile_q8_vnni, 34, w_pair_q8, false, -128);
vnni_tile!(tile_q4_vnni, 18, w_pair_q4, true, 8);
int8_driver!("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c", decode_q8_vnni, tile_q8_vnni, 8, 2, 4);
int8_driver!("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c", decode_q4_vnni, tile_q4_vnni, 8, 2, 4);

/// The VNNI kernels: one vector to the decode tiles above, several to
/// [`super::int8_prefill_x86`] (the same bits).
macro_rules! vnni_rows {
    ($name:ident, $decode:ident, $prefill:path) => {
        /// SIMD int8-path kernel (see [`super::int8::Int8RowsFn`]).
        ///
        /// # Safety
        /// As `Int8RowsFn`; the CPU has AVX-512 F/BW/VL, VNNI and VBMI.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
        pub unsafe fn $name(w: &MatRef, r0: usize, r1: usize, x: &Acts, n: usize, y: *mut f32, ys: usize) {
            // SAFETY: forwarded contract.
            unsafe {
                if n == 1 {
                    $decode(w, r0, r1, x, n, y, ys)
                } else {
                    $prefill(w, r0, r1, x, n, y, ys)
                }
            }
        }
    };
}

vnni_rows!(rows_q8_vnni, decode_q8_vnni, super::int8_prefill_x86::rows_q8);
vnni_rows!(rows_q4_vnni, decode_q4_vnni, super::int8_prefill_x86::rows_q4);

// ---- AVX2 ----

/// Sums adjacent pairs of 16-bit lanes into 32-bit lanes (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn pairs_to_i32(v: __m256i) -> __m256i {
    _mm256_madd_epi16(v, _mm256_set1_epi16(1))
}

/// Q8B32 activations in position order (the sign trick needs no correction).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn x_q8_avx2(p: *const i8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees 32 readable bytes.
    (unsafe { _mm256_loadu_si256(p as *const __m256i) }, _mm256_setzero_si256())
}

/// Q4B32 activations reordered to the nibble layout — within each 128-bit half even bytes
/// then odd bytes, then the four 64-bit quarters as (0, 2, 1, 3) — and 8·Σx per lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn x_q4_avx2(p: *const i8) -> (__m256i, __m256i) {
    let split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    // SAFETY: the caller guarantees 32 readable bytes.
    let x = _mm256_shuffle_epi8(unsafe { _mm256_loadu_si256(p as *const __m256i) }, split);
    let x = _mm256_permute4x64_epi64::<0b11_01_10_00>(x);
    (x, pairs_to_i32(_mm256_maddubs_epi16(_mm256_set1_epi8(8), x)))
}

/// Q8B32 weights: (|w| as unsigned bytes, w for the signs).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn w_q8_avx2(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees the 34-byte block at p.
    let w = unsafe { _mm256_loadu_si256(p.add(2) as *const __m256i) };
    // |−128| is 0x80, which read as unsigned is 128: exact for every byte.
    (_mm256_abs_epi8(w), w)
}

/// Q4B32 weights + 8, as unsigned bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn w_q4_avx2(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees the 18-byte block at p.
    let n = unsafe { q4_nibbles(p) };
    let u = _mm256_xor_si256(_mm256_and_si256(n, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(0x08));
    (u, u)
}

/// Σ |w|·(x with w's sign) per lane: exactly Σ w·x (pair sums at most 2·128·127).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot_q8_avx2(w: (__m256i, __m256i), x: (__m256i, __m256i)) -> __m256i {
    pairs_to_i32(_mm256_maddubs_epi16(w.0, _mm256_sign_epi8(x.0, w.1)))
}

/// Σ (q + 8)·x − 8·Σx per lane (pair sums at most 2·15·127).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot_q4_avx2(w: (__m256i, __m256i), x: (__m256i, __m256i)) -> __m256i {
    _mm256_sub_epi32(pairs_to_i32(_mm256_maddubs_epi16(w.0, x.0)), x.1)
}

int8_tile!("avx2,fma,f16c", tile_q8_avx2, 34, x_q8_avx2, w_q8_avx2, dot_q8_avx2);
int8_tile!("avx2,fma,f16c", tile_q4_avx2, 18, x_q4_avx2, w_q4_avx2, dot_q4_avx2);
int8_driver!("avx2,fma,f16c", rows_q8_avx2, tile_q8_avx2, 4, 2, 2);
int8_driver!("avx2,fma,f16c", rows_q4_avx2, tile_q4_avx2, 4, 2, 2);

// ---- AVX2 with AVX-VNNI ----
//
// The same tiles with one `vpdpbusd` for `vpmaddubsw` + `vpmaddwd`: each 32-bit lane gets the
// same four products, summed exactly (the pairs `vpmaddubsw` would sum in 16 bits never reach
// its saturation: at most 2·128·127 for Q8B32 and 2·15·127 for Q4B32), so the lane partials,
// hence the results, are the AVX2 tiles' bits.

/// `vpdpbusd` on 256-bit registers (AVX-VNNI), as written (see `int16_x86`'s `dpwssd` for why
/// not the intrinsic).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
pub(super) fn dpbusd_avx(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY: a register-only instruction of the enabled AVX-VNNI.
    unsafe { std::arch::asm!("{{vex}} vpdpbusd {acc}, {u}, {s}", acc = inout(ymm_reg) acc, u = in(ymm_reg) u, s = in(ymm_reg) s, options(pure, nomem, nostack, preserves_flags)) };
    acc
}

/// [`dot_q8_avx2`] with `vpdpbusd`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
fn dot_q8_avxvnni(w: (__m256i, __m256i), x: (__m256i, __m256i)) -> __m256i {
    dpbusd_avx(_mm256_setzero_si256(), w.0, _mm256_sign_epi8(x.0, w.1))
}

/// [`dot_q4_avx2`] with `vpdpbusd`, starting from the offset correction.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
fn dot_q4_avxvnni(w: (__m256i, __m256i), x: (__m256i, __m256i)) -> __m256i {
    dpbusd_avx(_mm256_sub_epi32(_mm256_setzero_si256(), x.1), w.0, x.0)
}

int8_tile!("avx2,fma,f16c,avxvnni", tile_q8_avxvnni, 34, x_q8_avx2, w_q8_avx2, dot_q8_avxvnni);
int8_tile!("avx2,fma,f16c,avxvnni", tile_q4_avxvnni, 18, x_q4_avx2, w_q4_avx2, dot_q4_avxvnni);
int8_driver!("avx2,fma,f16c,avxvnni", rows_q8_avxvnni, tile_q8_avxvnni, 4, 2, 2);
int8_driver!("avx2,fma,f16c,avxvnni", rows_q4_avxvnni, tile_q4_avxvnni, 4, 2, 2);

/// The AVX2 activation quantizer: [`super::int8::quantize_block`]'s arithmetic on 8 lanes.
/// The maximum is exact in any order, `127 / max` is the same scalar division, each `x · inv`
/// the same f32 product, and `vcvtps2dq` rounds it to nearest even as the scalar magic-number
/// addition does, so the bytes and scales are the scalar ones bit for bit.
///
/// # Safety
/// As [`super::int8::QuantizeFn`]; the CPU must have AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_avx2(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    let blocks = (x.len() / 32).min(q.len() / 32).min(d.len());
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let largest = _mm256_set1_ps(f32::MAX);
    // packs leave each 128-bit half's 4-byte groups interleaved; this restores lane order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (b, db) in d[..blocks].iter_mut().enumerate() {
        // SAFETY: block b lies inside x and q (blocks is bounded by both).
        let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(32 * b + 8 * i)) });
        let a: [__m256; 4] = std::array::from_fn(|i| _mm256_and_ps(v[i], abs));
        let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        let finite = a.iter().fold(_mm256_castsi256_ps(_mm256_set1_epi32(-1)), |f, ai| {
            _mm256_and_ps(f, _mm256_cmp_ps::<_CMP_LE_OQ>(*ai, largest))
        });
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        // SAFETY: block b's 32 bytes lie inside q (blocks is bounded by q.len() / 32).
        let out = unsafe { q.as_mut_ptr().add(32 * b) } as *mut __m256i;
        if _mm256_movemask_ps(finite) != 0xff || amax == 0.0 {
            // SAFETY: 32 bytes of q belong to block b.
            unsafe { _mm256_storeu_si256(out, _mm256_setzero_si256()) };
            *db = if amax == 0.0 && _mm256_movemask_ps(finite) == 0xff { 0.0 } else { f32::NAN };
            continue;
        }
        let inv = _mm256_set1_ps(127.0 / amax);
        let i: [__m256i; 4] = std::array::from_fn(|k| _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv)));
        let packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(out, _mm256_permutevar8x32_epi32(packed, order)) };
        *db = amax / 127.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dtype::DType;
    use crate::kernels::int8::{self, Int8RowsFn};

    /// The AVX2 tiles with `vpmaddubsw` and with AVX-VNNI's `vpdpbusd` against the scalar twin,
    /// bit for bit, in the decode and the several-vector shapes (`tests/kernels_integer.rs`
    /// runs only the form this CPU's path takes).
    #[test]
    fn both_avx2_forms_equal_the_scalar_twin() {
        if !super::super::Isa::Avx2.supported() {
            println!("SKIP: int8_x86::both_avx2_forms_equal_the_scalar_twin: this CPU has no AVX2");
            return;
        }
        let vnni = super::super::has_avx_vnni();
        if !vnni {
            println!("SKIP: int8_x86::both_avx2_forms_equal_the_scalar_twin: no AVX-VNNI here, only the vpmaddubsw form is checked");
        }
        let mut rng = crate::kernels::TestRng(0x9E37_79B9_7F4A_7C15);
        let mut next = move || rng.next();
        for (dtype, bytes) in [(DType::Q4B32, 18), (DType::Q8B32, 34)] {
            for (rows, blocks) in [(1, 1), (5, 3), (9, 16), (6, 33)] {
                let mut data = vec![0u8; rows * blocks * bytes];
                for blk in data.chunks_exact_mut(bytes) {
                    let scale = half::f16::from_f32(0.001 + (next() >> 54) as f32 * 1e-4).to_bits();
                    blk[..2].copy_from_slice(&scale.to_le_bytes());
                    blk[2..].iter_mut().for_each(|v| *v = (next() >> 56) as u8);
                }
                let cols = blocks * 32;
                let w = MatRef { dtype, rows, cols, data: &data };
                for n in [1, 2, 3, 5] {
                    let x: Vec<f32> = (0..n * cols).map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
                    let (mut q, mut d) = (vec![0i8; n * cols], vec![0f32; n * blocks]);
                    // SAFETY: the buffers hold n vectors.
                    unsafe { int8::quantize_scalar(&x, &mut q, &mut d) };
                    let acts = Acts { q: &q, d: &d, cols };
                    let run = |k: Int8RowsFn| {
                        let mut y = vec![f32::NAN; n * rows];
                        // SAFETY: the kernels' instruction sets were checked; y holds n × rows.
                        unsafe { k(&w, 0, rows, &acts, n, y.as_mut_ptr(), rows) };
                        y
                    };
                    let q4 = dtype == DType::Q4B32;
                    let want = run(if q4 { int8::rows_q4 } else { int8::rows_q8 });
                    let forms: [Int8RowsFn; 2] = if q4 { [rows_q4_avx2, rows_q4_avxvnni] } else { [rows_q8_avx2, rows_q8_avxvnni] };
                    for (i, form) in forms.into_iter().enumerate().take(if vnni { 2 } else { 1 }) {
                        let got = run(form);
                        assert!(got.iter().zip(&want).all(|(g, e)| g.to_bits() == e.to_bits()), "{dtype} form {i} {rows}x{cols} n={n}: {got:?} vs {want:?}");
                    }
                }
            }
        }
    }
}
