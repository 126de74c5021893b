//! AVX2 kernels (with FMA and F16C): 8 f32 lanes. Each has a scalar twin in [`super::scalar`]
//! and a test comparing them (`tests/kernels.rs`).
//!
//! One 8-lane accumulator per (row, vector) pair takes one fused multiply-add per 8 columns,
//! in column order: the stored weights widened to f32 (a quantized block decoded in place into
//! four 8-lane vectors already multiplied by its scale, which is exact) times the inputs; the
//! lanes are summed at the end by [`hsum8`], a fixed tree. A row's last partial 8 columns are
//! zero-padded on both sides, so every step is a whole vector. That sequence depends on the
//! column count only: the decode tiles here (one vector, 4 rows at a time) and the GEMM of
//! [`super::avx2_gemm`] (a prefill chunk's vectors against weights decoded once into a panel)
//! give the same bits. The decode tiles prefetch the next tile's rows into L2.

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

/// `hsum8` of each of eight vectors, lane `j` holding `hsum8(a[j])` bit for bit: `hsum8` adds
/// lanes (l, l+4), then (0, 2) and (1, 3) of that, then the two; here the halves of two
/// vectors are added at once, each half reordered to (0, 2, 1, 3) so that `vhaddps` pairs
/// lane 0 with 2 and 1 with 3, and a second `vhaddps` adds the two, leaving the sums in the
/// order (0, 2, 4, 6 | 1, 3, 5, 7) that a last permutation undoes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn hsum8x8(a: &[__m256; 8]) -> __m256 {
    let halves = |x: __m256, y: __m256| {
        let s = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(x, y), _mm256_permute2f128_ps::<0x31>(x, y));
        _mm256_permute_ps::<0b11_01_10_00>(s)
    };
    let (ab, cd, ef, gh) = (halves(a[0], a[1]), halves(a[2], a[3]), halves(a[4], a[5]), halves(a[6], a[7]));
    let all = _mm256_hadd_ps(_mm256_hadd_ps(ab, cd), _mm256_hadd_ps(ef, gh));
    _mm256_permutevar8x32_ps(all, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Asks for the cache line holding `p` to be brought into L2, ahead of use. A prefetch never
/// faults, so `p` may point past the matrix (the last tile prefetches nothing useful).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn prefetch_l2(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
}

/// Prefetches the `bytes` from `p` on, one address per 64 bytes. A tile calls it once per
/// block step with the step's share of the tile it prefetches for (that tile's rows are
/// contiguous: `R × block bytes` per step), so every line of those rows is asked for whatever
/// the rows' alignment — Q4B32 and Q8B32 rows are a multiple of 64 bytes only when their
/// columns are a multiple of 1024 — and without a test per row and block. A test on a block's
/// offset within its row asked for every line of aligned rows but skipped up to half the lines
/// of the others (Qwen3-30B-A3B's expert down projection, 768 columns: Q4B32 on one thread of
/// Zen 4, 7.6–8.2 → 10.6–11.6 GB/s; SmolLM2-135M decode 1.52×; BENCHMARKS, 2026-12-04).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn prefetch_span(p: *const u8, bytes: usize) {
    let mut at = 0;
    while at < bytes {
        prefetch_l2(p.wrapping_add(at));
        at += 64;
    }
}

/// [`super::Prefetch::TileAfterNext`]: block step `b`'s share of the rows of the tile after
/// next, to L2 (two tiles ahead rather than one: Q8B32 decode +10 % on Zen 4 with AVX-512; Q4B32 from
/// DRAM on Zen 3 with AVX2, two threads: 7.4-9.1 GB/s one tile ahead, 9.1-11.0 two, 7.9-9.8
/// four).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn ahead_tile_after_next<const R: usize>(wp: *const u8, r: usize, rb: usize, b: usize, bytes: usize) {
    prefetch_span(wp.wrapping_add((r + 2 * R) * rb + b * R * bytes), R * bytes);
}

/// Block steps between a step and the one [`ahead_own_rows`] asks for: 864 bytes of a Q4B32 row,
/// 1,632 of a Q8B32 one. On the Intel host of BENCHMARKS (2026-12-04 afternoon), 1 GiB from
/// DRAM on two threads, Q4B32 reached 70 % of the read bandwidth at 12 steps, 77 % at 24 and
/// 82 % at 48, then 79 % at 64 and 75 % at 96; Q8B32 91 % at 12 and 95 % from 24 on (AVX-512
/// tiles). The AVX2 tiles there: Q8B32 67-73 → 88-97 % at 48, Q4B32 level (compute-bound).
const OWN_ROWS_STEPS: usize = 48;

/// [`super::Prefetch::OwnRows`]: the line [`OWN_ROWS_STEPS`] block steps ahead in the tile's own
/// rows, to L1; past a row's end, the same place in the next tile's row (an expert's rows are
/// short: 64 blocks of Q4B32 for 2,048 columns, whose first 48 would otherwise arrive
/// unasked; rows shorter than 48 blocks, such as a 768-column down projection's 24, are asked
/// for a row or two further on than that, which a prefetch allows). A row advances `bytes`
/// per step, so it is asked for once every `64 / bytes` steps (Q4B32 every third, Q8B32 every
/// step), each step taking its turn of rows: every line of every row is asked for, with a
/// third of the requests for Q4B32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn ahead_own_rows<const R: usize>(wp: *const u8, r: usize, rb: usize, b: usize, bytes: usize) {
    let every = (64 / bytes).max(1);
    let at = (b + OWN_ROWS_STEPS) * bytes;
    let first = if at < rb { r * rb + at } else { (r + R) * rb + at - rb };
    for j in 0..R.div_ceil(every) {
        // Past the tile's last row (R not a multiple of `every`) is the next tile's first:
        // a prefetch does not fault, and that line is wanted soon anyway.
        let row = every * j + b % every;
        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(first + row * rb) as *const i8);
    }
}

/// Dense decode tiles (one vector): `$load(ptr)` widens 8 stored weights to f32; one fused
/// multiply-add per 8 columns in column order, the last partial 8 zero-padded on both sides.
macro_rules! dense_tile {
    ($name:ident, $elem:ty, $load:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const R: usize>(w: &MatRef, r: usize, x: &[f32], out: &mut [f32; R]) {
            let cols = w.cols;
            let wp = w.data.as_ptr() as *const $elem;
            let xp = x.as_ptr();
            let mut acc = [_mm256_setzero_ps(); R];
            let full = cols / 8 * 8;
            let mut c = 0;
            // SAFETY (all loads): rows r..r+R exist (the driver's contract) and c + 8 <= cols.
            while c < full {
                let xv = unsafe { _mm256_loadu_ps(xp.add(c)) };
                for (i, a) in acc.iter_mut().enumerate() {
                    prefetch_l2(wp.wrapping_add((r + i + R) * cols + c) as *const u8);
                    *a = _mm256_fmadd_ps(unsafe { $load(wp.add((r + i) * cols + c)) }, xv, *a);
                }
                c += 8;
            }
            if c < cols {
                let k = cols - c;
                let mut xpad = [0f32; 8];
                // SAFETY: k values remain in the vector.
                unsafe { std::ptr::copy_nonoverlapping(xp.add(c), xpad.as_mut_ptr(), k) };
                let xv = unsafe { _mm256_loadu_ps(xpad.as_ptr()) };
                for (i, a) in acc.iter_mut().enumerate() {
                    let mut wpad = [<$elem>::default(); 8];
                    // SAFETY: k values remain in row r + i.
                    unsafe { std::ptr::copy_nonoverlapping(wp.add((r + i) * cols + c), wpad.as_mut_ptr(), k) };
                    *a = _mm256_fmadd_ps(unsafe { $load(wpad.as_ptr()) }, xv, *a);
                }
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                *o = hsum8(*a);
            }
        }
    };
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn load_f32(p: *const f32) -> __m256 {
    // SAFETY: the caller guarantees 8 readable values.
    unsafe { _mm256_loadu_ps(p) }
}

/// bf16 is the top half of an f32: widen to 32 bits and shift left 16 (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn load_bf16(p: *const u16) -> __m256 {
    // SAFETY: the caller guarantees 8 readable values.
    let v = unsafe { _mm_loadu_si128(p as *const __m128i) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn load_f16(p: *const u16) -> __m256 {
    // SAFETY: the caller guarantees 8 readable values.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p as *const __m128i) })
}

dense_tile!(tile_f32, f32, load_f32);
dense_tile!(tile_bf16, u16, load_bf16);
dense_tile!(tile_f16, u16, load_f16);

/// Quantized decode tiles (one vector): `$decode(block_ptr)` turns one block into its 32
/// weights, already multiplied by the block's scale — exactly, since a level has at most 8
/// significant bits and a binary16 scale 11 — as four 8-lane vectors, and `$xload(ptr)` loads
/// the block's 32 inputs as the four matching vectors; each row then takes four fused
/// multiply-adds per block, the block's inputs (loaded once per block) serving every row of
/// the tile. One fused multiply-add per 8 columns, as the dense tiles do and the GEMM of
/// [`super::avx2_gemm`] repeats (Q4B32 takes a block's columns in the order of [`decode_q4`],
/// the other dtypes in column order).
macro_rules! block_tile {
    ($name:ident, $bytes:expr, $decode:ident, $xload:ident, $prefetch:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const R: usize>(w: &MatRef, r: usize, x: &[f32], out: &mut [f32; R]) {
            let rb = w.row_bytes();
            let blocks = rb / $bytes;
            let wp = w.data.as_ptr();
            let xp = x.as_ptr();
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..blocks {
                // SAFETY: the vector has `cols` = 32 × blocks values.
                let xs = unsafe { $xload(xp.add(b * 32)) };
                $prefetch::<R>(wp, r, rb, b, $bytes);
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: block b of row r + i lies inside the matrix (driver contract).
                    let q = unsafe { $decode(wp.add((r + i) * rb + b * $bytes)) };
                    for k in 0..4 {
                        *a = _mm256_fmadd_ps(q[k], xs[k], *a);
                    }
                }
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                *o = hsum8(*a);
            }
        }
    };
}

/// The binary16 scale at the start of a block, widened through [`F16_TO_F32`] (a broadcast
/// load, no conversion instruction).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn scale_bits(p: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    F16_TO_F32[unsafe { scale_index(p) }]
}

/// The bits of the binary16 scale at the start of a block: the index of its tables
/// ([`F16_TO_F32`], [`Q4_OFFSETS`]).
///
/// # Safety
/// Two bytes are readable at `p`.
#[inline]
unsafe fn scale_index(p: *const u8) -> usize {
    // SAFETY: the caller's contract.
    u16::from_le(unsafe { (p as *const u16).read_unaligned() }) as usize
}

/// Q8B32: 32 signed bytes after the scale, sign-extended, converted and times the scale, in
/// position order (8 bytes per `vpmovsxbd` straight from memory: measured 15 % faster here
/// than making floats from the bytes with an exponent's bits and a subtraction).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn decode_q8(p: *const u8) -> [__m256; 4] {
    // SAFETY: the caller guarantees the 34-byte block at p.
    unsafe {
        let s = _mm256_set1_ps(scale_bits(p));
        std::array::from_fn(|k| {
            let u = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(2 + 8 * k) as *const __m128i));
            _mm256_mul_ps(_mm256_cvtepi32_ps(u), s)
        })
    }
}

/// Q4B32: the block's 32 levels times its scale, by parity within each half: positions (0, 2,
/// .., 14), (1, 3, .., 15), (16, .., 30), (17, .., 31) — a payload byte's low nibble is the
/// even position, its high nibble the odd one (seed 000, "The payload"); [`x_q4`] loads the
/// inputs in that order.
///
/// Each value is made exactly without a conversion or a per-vector multiply: the payload,
/// broadcast to both 128-bit lanes, has its nibbles flipped in bit 3 (a two's-complement
/// nibble `q` becomes `u = q + 8`, 0..15) and a magic byte blended into a dword neither lane
/// reads; one `vpshufb` per half puts payload byte `j` at bits 15..8 of lane `j` and the magic
/// at bits 31..24. Masked, a lane is the f32 2¹⁵ + u (the even nibble, bits 11..8 under the
/// exponent 15) or 2¹¹ + u (the odd one, bits 15..12 under the exponent 11), and
/// `fma(2ᵉ + u, d, −(2ᵉ + 8)·d)` is `q·d` exactly: the product is exact inside the FMA, the
/// offset is exact ([`Q4_OFFSETS`]), and so is their sum, an integer of 4 bits times d. The
/// same values as widening, masking, converting and multiplying each nibble, in 16 operations
/// per block against 22 (docs/BENCHMARKS.md, 2026-12-05: 30 % more blocks per second in L2) —
/// but for the sign of a zero: under a zero scale every level gives +0. No sum can tell: every
/// accumulator starts at +0, and +0 plus a zero of either sign is +0.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn decode_q4(p: *const u8) -> [__m256; 4] {
    // Lane j (dword j % 4 of 128-bit half j / 4) of the first shuffle: payload byte j at bits
    // 15..8, the magic byte (payload dword 1 of half 0, dword 0 of half 1: the dwords the
    // half does not read) at bits 31..24, zeros elsewhere; the second takes bytes 8..16.
    const Z: i8 = -128;
    #[rustfmt::skip]
    const FIRST: [i8; 32] = [Z, 0, Z, 4, Z, 1, Z, 4, Z, 2, Z, 4, Z, 3, Z, 4,
                             Z, 4, Z, 0, Z, 5, Z, 0, Z, 6, Z, 0, Z, 7, Z, 0];
    #[rustfmt::skip]
    const SECOND: [i8; 32] = [Z, 8, Z, 4, Z, 9, Z, 4, Z, 10, Z, 4, Z, 11, Z, 4,
                              Z, 12, Z, 0, Z, 13, Z, 0, Z, 14, Z, 0, Z, 15, Z, 0];
    // SAFETY: the caller guarantees the 18-byte block at p; the tables are indexed by a u16.
    unsafe {
        let bits = scale_index(p);
        let s = _mm256_set1_ps(F16_TO_F32[bits]);
        let [even, odd] = Q4_OFFSETS[bits];
        let (even, odd) = (_mm256_set1_ps(even), _mm256_set1_ps(odd));
        let payload = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(2) as *const __m128i));
        // The magic byte 0x47 (the exponent byte of 2¹⁵) arrives flipped like the nibbles.
        let magic = _mm256_set1_epi32(0x4747_4747 ^ 0x8888_8888u32 as i32);
        let v = _mm256_xor_si256(_mm256_blend_epi32::<0b0001_0010>(payload, magic), _mm256_set1_epi8(0x88u8 as i8));
        let first = _mm256_shuffle_epi8(v, _mm256_loadu_si256(FIRST.as_ptr() as *const __m256i));
        let second = _mm256_shuffle_epi8(v, _mm256_loadu_si256(SECOND.as_ptr() as *const __m256i));
        // 0x47 & 0xfd = 0x45: the exponent byte of 2¹¹.
        let (keep_even, keep_odd) = (_mm256_set1_epi32(0xff00_0f00u32 as i32), _mm256_set1_epi32(0xfd00_f000u32 as i32));
        let level = |lanes: __m256i, keep: __m256i, offset: __m256| {
            _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(lanes, keep)), s, offset)
        };
        [level(first, keep_even, even), level(first, keep_odd, odd), level(second, keep_even, even), level(second, keep_odd, odd)]
    }
}

/// Per binary16 scale `d` (indexed by its bits), the offsets of [`decode_q4`]: −(2¹⁵ + 8)·d for
/// the even nibbles and −(2¹¹ + 8)·d for the odd ones — integers of 13 and 9 bits times an
/// 11-bit significand, so exact in f32. Built at compile time; 512 KiB, of which a model's
/// scales touch the few KiB of their exponent range.
pub(crate) static Q4_OFFSETS: [[f32; 2]; 65536] = q4_offsets();

const fn q4_offsets() -> [[f32; 2]; 65536] {
    let mut t = [[0f32; 2]; 65536];
    let mut h = 0usize;
    while h < 65536 {
        let d = super::scalar::f16_bits_to_f32(h as u16);
        t[h] = [-32776.0 * d, -2056.0 * d];
        h += 1;
    }
    t
}

/// Vector `k` of [`decode_q4`] computed from memory on its own (its half widened again, one
/// magic constant serving as both the integer and the float bias), so that a tile using each
/// vector as soon as it is made holds one of them and three constants, not four and four: the
/// few-vector tiles of [`super::avx2_few`], whose 2 × 4 accumulators fill the rest of the 16
/// registers. The same values as [`decode_q4`] (but for a zero's sign, see there), hence the
/// same sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn decode_q4_part(p: *const u8, k: usize) -> __m256 {
    // SAFETY: the caller guarantees the 18-byte block at p (k < 4).
    unsafe {
        let magic = _mm256_set1_epi32(0x4B00_0008);
        let half = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(2 + 8 * (k / 2)) as *const __m128i));
        let nibble = if k & 1 == 0 { _mm256_and_si256(half, _mm256_set1_epi32(0x0F)) } else { _mm256_srli_epi32::<4>(half) };
        let f = _mm256_castsi256_ps(_mm256_xor_si256(nibble, magic));
        _mm256_mul_ps(_mm256_sub_ps(f, _mm256_castsi256_ps(magic)), _mm256_set1_ps(scale_bits(p)))
    }
}

/// F8B32 (`format::fp8`): the f32 scale, then 32 e4m3fn codes. A code's bits shifted into a
/// binary16 (sign to bit 15, exponent and mantissa to bits 13..7) are the binary16 of the
/// code's value times 2⁻⁸ — normal and subnormal codes alike, as both formats put the same
/// mantissa after an exponent whose bias differs by 8 — so `vcvtph2ps` decodes eight codes
/// exactly and 2⁸ goes into the scale (an exact power-of-two product). The shift is three
/// operations per eight codes: interleaving with zero bytes puts code `c` at `c << 8`, an
/// arithmetic shift right by one moves the magnitude to bits 13..7 while the sign stays in bit
/// 15 (and is copied into bit 14), and a mask clears bit 14. The NaN codes (0x7f, 0xff) would
/// decode as ±480 here: they never reach a kernel, refused where the source is read
/// (`format::fp8`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn decode_f8(p: *const u8) -> [__m256; 4] {
    // SAFETY: the caller guarantees the 36-byte block at p.
    unsafe {
        let scale = f32::from_le_bytes((p as *const [u8; 4]).read_unaligned());
        let s = _mm256_set1_ps(scale * 256.0);
        let (zero, keep) = (_mm_setzero_si128(), _mm_set1_epi16(0xBF80u16 as i16));
        let (lo, hi) = (_mm_loadu_si128(p.add(4) as *const __m128i), _mm_loadu_si128(p.add(20) as *const __m128i));
        let f = |shifted: __m128i| _mm256_mul_ps(_mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16::<1>(shifted), keep)), s);
        [f(_mm_unpacklo_epi8(zero, lo)), f(_mm_unpackhi_epi8(zero, lo)), f(_mm_unpacklo_epi8(zero, hi)), f(_mm_unpackhi_epi8(zero, hi))]
    }
}

/// 2^(s − 128) for every e8m0 byte `s`: the MXFP4 block scale 2^(s − 127) of
/// [`crate::format::mxfp4::e8m0`] halved, because [`decode_mx`] looks each code up as twice
/// its e2m1 value. Built from the exponent bits: s ≥ 2 is the normal float of biased exponent
/// s − 1; s = 1 and 0 (2⁻¹²⁷, 2⁻¹²⁸) are the subnormals of one mantissa bit; 0xFF is the
/// format's NaN, kept NaN so a block under it multiplies to NaN as in the scalar twin.
pub(crate) static MXFP4_HALF_SCALE: [f32; 256] = mxfp4_half_scales();

const fn mxfp4_half_scales() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut s = 0usize;
    while s < 256 {
        t[s] = f32::from_bits(match s {
            0 => 0x0020_0000,
            1 => 0x0040_0000,
            255 => 0x7FC0_0000,
            s => ((s - 1) as u32) << 23,
        });
        s += 1;
    }
    t
}

/// MXFP4 (`format::mxfp4`): the e8m0 scale byte, then 16 bytes of e2m1 codes, the low nibble
/// the even position. Every e2m1 value is a multiple of 0.5 in [−6, 6], so `vpshufb` looks a
/// nibble up as the int8 of twice its value (the sign code 8, −0, becomes +0: a zero weight
/// either way, and the twin's sums start at +0, so no result changes); interleaving the low-
/// and high-nibble lookups puts the 32 values in position order, and each 8 are widened to f32
/// (exact) and multiplied by the halved scale of [`MXFP4_HALF_SCALE`]. The product is the
/// scalar decode's `E2M1[c] × e8m0(s)` bit for bit: both are exact (a value of two significant
/// bits times a power of two, subnormals included) or overflow to the same infinity (s ≥ 253).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn decode_mx(p: *const u8) -> [__m256; 4] {
    // SAFETY: the caller guarantees the 17-byte block at p.
    unsafe {
        let s = _mm256_set1_ps(MXFP4_HALF_SCALE[*p as usize]);
        let twice = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
        let codes = _mm_loadu_si128(p.add(1) as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_shuffle_epi8(twice, _mm_and_si128(codes, m));
        let hi = _mm_shuffle_epi8(twice, _mm_and_si128(_mm_srli_epi16::<4>(codes), m));
        let (first, second) = (_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi));
        let f = |q: __m128i| _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), s);
        [f(first), f(_mm_srli_si128::<8>(first)), f(second), f(_mm_srli_si128::<8>(second))]
    }
}

/// A block's 32 inputs in position order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn x_in_order(p: *const f32) -> [__m256; 4] {
    // SAFETY: the caller guarantees 32 readable values.
    std::array::from_fn(|k| unsafe { _mm256_loadu_ps(p.add(8 * k)) })
}

/// A block's 32 inputs in the order of [`decode_q4`]: by parity within each half.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn x_q4(p: *const f32) -> [__m256; 4] {
    // SAFETY: the caller guarantees 32 readable values.
    let v = unsafe { x_in_order(p) };
    // shufps takes (0, 2 | 1, 3) pairs within 128-bit halves: (0, 2, 8, 10 | 4, 6, 12, 14);
    // the 64-bit permutation (0, 2, 1, 3) puts them in order.
    let even = |a: __m256, b: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(_mm256_shuffle_ps::<0b10_00_10_00>(a, b))));
    let odd = |a: __m256, b: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(_mm256_shuffle_ps::<0b11_01_11_01>(a, b))));
    [even(v[0], v[1]), odd(v[0], v[1]), even(v[2], v[3]), odd(v[2], v[3])]
}

block_tile!(tile_q8b32, 34, decode_q8, x_in_order, ahead_tile_after_next);
block_tile!(tile_q8b32_own_rows, 34, decode_q8, x_in_order, ahead_own_rows);
block_tile!(tile_q4b32, 18, decode_q4, x_q4, ahead_tile_after_next);
block_tile!(tile_f8b32, 36, decode_f8, x_in_order, ahead_tile_after_next);
block_tile!(tile_mxfp4, 17, decode_mx, x_in_order, ahead_tile_after_next);
// Q4B32 against inputs already in the order of [`decode_q4`] (see [`rows_q4b32`]): the same
// values in the same order, so the same bits, without a permutation per block and tile.
block_tile!(tile_q4b32_ordered, 18, decode_q4, x_in_order, ahead_tile_after_next);
block_tile!(tile_q4b32_ordered_own_rows, 18, decode_q4, x_in_order, ahead_own_rows);


/// Generates the public row kernel `$name`: one vector through the decode tiles (`$rows` rows
/// at a time, then one); several through the tiles of [`super::avx2_few`] (`$few`, where
/// given) while the inputs are small, else through the GEMM of [`super::avx2_gemm`] (same
/// bits whichever runs).
macro_rules! rows_fn {
    ($name:ident, $tile:ident, $rows:literal, $few:expr) => {
        /// SIMD row-dot kernel (see [`crate::kernels::scalar::RowsFn`]).
        ///
        /// # Safety
        /// As `RowsFn`, and the CPU must have AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
            if n != 1 {
                let few: Option<super::RowsFn> = $few;
                // SAFETY: forwarded contract.
                return match few {
                    Some(f) if n * w.cols * 4 <= super::avx2_few::FEW_INPUTS => unsafe { f(w, r0, r1, x, n, y, ys) },
                    _ => unsafe { super::avx2_gemm::rows(w, r0, r1, x, n, y, ys) },
                };
            }
            let mut r = r0;
            // SAFETY (all tiles): rows r .. r + R lie in r0..r1, ours to write.
            while r + $rows <= r1 {
                let mut o = [0f32; $rows];
                unsafe { $tile::<$rows>(w, r, x, &mut o) };
                for (i, v) in o.iter().enumerate() {
                    unsafe { *y.add(r + i) = *v };
                }
                r += $rows;
            }
            while r < r1 {
                let mut o = [0f32; 1];
                unsafe { $tile::<1>(w, r, x, &mut o) };
                unsafe { *y.add(r) = o[0] };
                r += 1;
            }
        }
    };
}

rows_fn!(rows_f32, tile_f32, 4, Some(super::avx2_few::rows_f32));
rows_fn!(rows_bf16, tile_bf16, 4, Some(super::avx2_few::rows_bf16));
rows_fn!(rows_f16, tile_f16, 4, Some(super::avx2_few::rows_f16));
rows_fn!(rows_q8b32, tile_q8b32, 4, Some(super::avx2_few::rows_q8b32));
rows_fn!(rows_q8b32_own_rows, tile_q8b32_own_rows, 4, Some(super::avx2_few::rows_q8b32));
rows_fn!(rows_f8b32, tile_f8b32, 4, Some(super::avx2_few::rows_f8b32));
rows_fn!(rows_mxfp4, tile_mxfp4, 4, Some(super::avx2_few::rows_mxfp4));
// Several Q4B32 vectors reach these only when too long to permute (see rows_q4b32): the GEMM.
rows_fn!(rows_q4b32_unordered, tile_q4b32, 4, None);
rows_fn!(rows_q4b32_ordered, tile_q4b32_ordered, 4, None);
rows_fn!(rows_q4b32_ordered_own_rows, tile_q4b32_ordered_own_rows, 4, None);

/// SIMD Q4B32 row-dot kernel (see [`crate::kernels::scalar::RowsFn`]). For one vector, or a
/// few (the tiles of [`super::avx2_few`], up to [`super::avx2_few::FEW_INPUTS_Q4`]; more go
/// to the GEMM), the inputs are put in the order of [`decode_q4`]
/// once per call into a 64 KiB stack buffer, not once per block of every tile (the decode
/// tiles are compute-bound on Q4B32: the permutation was an eighth of their instructions);
/// the values and their order, hence the bits, are those of [`x_q4`]. `OWN_ROWS` picks the
/// decode tiles' prefetch scheme ([`super::Prefetch`]).
///
/// # Safety
/// As `RowsFn`, and the CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows_q4b32<const OWN_ROWS: bool>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    let len = n * (w.row_bytes() / 18 * 32);
    if len > super::Q4_ORDERED_MAX || (n > 1 && len * 4 > super::avx2_few::FEW_INPUTS_Q4) {
        // SAFETY: forwarded contract.
        return unsafe { rows_q4b32_unordered(w, r0, r1, x, n, y, ys) };
    }
    let mut buf = std::mem::MaybeUninit::<[f32; super::Q4_ORDERED_MAX]>::uninit();
    let ordered = buf.as_mut_ptr() as *mut f32;
    for b in 0..len / 32 {
        // SAFETY: the vectors hold `len` values (the contract); the buffer holds len.
        unsafe {
            for (k, v) in x_q4(x.as_ptr().add(32 * b)).iter().enumerate() {
                _mm256_storeu_ps(ordered.add(32 * b + 8 * k), *v);
            }
        }
    }
    let ordered = std::ptr::slice_from_raw_parts(ordered as *const f32, len);
    // SAFETY: the first `len` values were written above; the rest of the contract is the
    // caller's.
    unsafe {
        if n == 1 && OWN_ROWS {
            rows_q4b32_ordered_own_rows(w, r0, r1, &*ordered, n, y, ys)
        } else if n == 1 {
            rows_q4b32_ordered(w, r0, r1, &*ordered, n, y, ys)
        } else {
            super::avx2_few::rows_q4b32(w, r0, r1, &*ordered, n, y, ys)
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// [`decode_q4`] and [`decode_q4_part`] against the definition, `q·d` in f32 (the scalar
    /// `row_to_f32`), bit for bit but for a zero's sign (see `decode_q4`): every binary16 scale
    /// that is a number (subnormals, zeros and both signs included), each with payloads that
    /// put every nibble value in both positions of every byte.
    #[test]
    fn q4_blocks_decode_to_their_levels_times_the_scale_exactly() {
        if !super::super::Isa::Avx2.supported() {
            println!("SKIP: q4_blocks_decode_to_their_levels_times_the_scale_exactly: this CPU has no AVX2, FMA and F16C");
            return;
        }
        let mut block = [0u8; 18];
        let mut want = [0f32; 32];
        // decode_q4's order: by parity within each half.
        let position = |k: usize| (k / 16) * 16 + 2 * (k % 8) + (k / 8) % 2;
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a == 0.0 && b == 0.0);
        for bits in (0..=u16::MAX).filter(|b| (b >> 10) & 0x1f != 0x1f) {
            block[..2].copy_from_slice(&bits.to_le_bytes());
            for shift in 0..16u8 {
                for (j, byte) in block[2..].iter_mut().enumerate() {
                    *byte = ((j as u8 + shift) & 15) | (((j as u8 + 7 * shift + 3) & 15) << 4);
                }
                let w = MatRef { data: &block, dtype: crate::format::dtype::DType::Q4B32, rows: 1, cols: 32 };
                super::super::scalar::row_to_f32(&w, 0, &mut want);
                let (mut whole, mut parts) = ([[0f32; 8]; 4], [[0f32; 8]; 4]);
                // SAFETY: AVX2, FMA and F16C are present (checked above); the block is 18 bytes;
                // each store writes one row of eight f32.
                unsafe {
                    let q = decode_q4(block.as_ptr());
                    for v in 0..4 {
                        _mm256_storeu_ps(whole[v].as_mut_ptr(), q[v]);
                        _mm256_storeu_ps(parts[v].as_mut_ptr(), decode_q4_part(block.as_ptr(), v));
                    }
                }
                for k in 0..32 {
                    let (got, part, expect) = (whole[k / 8][k % 8], parts[k / 8][k % 8], want[position(k)]);
                    assert!(same(got, expect), "scale bits {bits:#06x}, payload {:?}, lane {k}: {got} against {expect}", &block[2..]);
                    assert!(same(part, expect), "decode_q4_part, scale bits {bits:#06x}, lane {k}: {part} against {expect}");
                }
            }
        }
    }
}
