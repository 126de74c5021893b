//! AVX2 kernels of the int16 path ([`super::int16`] states the arithmetic and holds the
//! scalar twins they equal bit for bit): `vpmaddwd` + `vpaddd` on AVX2, or one `vpdpwssd` on
//! CPUs with AVX-VNNI (Intel's since Alder Lake, for one), the same exact block sums
//! either way — the module is written once ([`int16_avx2_kernels`]) and built for each.
//!
//! Why it pays on 256-bit registers although `vpmaddwd` and the f32 FMA both take eight lanes:
//! `vpmaddwd` multiplies a *pair* of 16-bit values per lane, so each instruction does sixteen
//! multiply-adds against the FMA's eight, and its `vpaddd` issues on another port (Intel) —
//! provided each weight register serves several vectors, so that the loads do not bind first
//! (`tools/bench/rows_in_lanes.c`, "reuse" forms: on the Intel host without AMX, one thread,
//! f32 FMA 32.6 GMAC/s, `vpmaddwd` 59.3, AVX-VNNI 67.7; BENCHMARKS, 2026-12-05 night).
//!
//! Two forms, as in [`super::int16_x86`]:
//! - many vectors (a prefill chunk, more than [`FEW`]): eight rows sit in a register's lanes.
//!   A chunk of [`CHUNK_BLOCKS`] blocks of eight rows is widened once into a stack tile — per
//!   block sixteen registers, register `p` holding in lane `r` the two signed 16-bit weights
//!   at positions `2p, 2p + 1` of row `r`, and the rows' f32 scales — and every vector meets
//!   it with one multiply-add per pair against its activation pair broadcast; [`GROUPS`] such
//!   tiles share each broadcast, and [`TOKENS`] vectors each load of a tile register;
//! - few vectors (decode): no tile. Two rows share a register (one per 128-bit half, each
//!   block's payload as it lies); shifts of its 16-bit words sign-extend the weights of four
//!   (Q4B32) or two (Q8B32) positions apart, the activations are permuted once per call into
//!   the matching pairs, and four multiply-adds leave four partial sums per row; three
//!   horizontal adds turn four such registers (rows 0 and 4, 1 and 5, 2 and 6, 3 and 7) into
//!   the eight rows' block sums in row order.
//!
//! Then, in both, per block: the sums converted, the rows' scales times the block's activation
//! scale, one fused multiply-add into the rows' accumulators, blocks in order.
//!
//! Stack use: up to 130 KiB per call (the few-vector form's permuted activations).

use super::int8::Acts;
use super::MatRef;
use std::arch::x86_64::*;

/// Rows per register (the lanes).
const LANES: usize = 8;
/// Blocks widened per chunk: a group's tile (16 × 32 bytes per block) is 8 KiB, in L1 with
/// the other group's.
const CHUNK_BLOCKS: usize = 16;
/// Groups of eight rows that share each broadcast input in the tile form.
const GROUPS: usize = 2;
/// Vectors per register tile: with two groups, ten chains of multiply-adds (each waits for the
/// one before it: six chains left the pipes half idle) beside two tile registers and a
/// broadcast one; the accumulators, touched once per block, wait in memory.
const TOKENS: usize = 5;
/// Up to this many vectors a call takes the few-vector form.
const FEW: usize = 4;
/// Blocks per column chunk of the few-vector form (16,384 columns: each row is read whole in
/// nearly every model); the permuted activations take 32 KiB per vector.
const FEW_CHUNK_BLOCKS: usize = 512;

/// The weight format: bytes per block, and whether the payload is Q4B32 nibbles.
#[derive(Clone, Copy)]
struct Format {
    bytes: usize,
    q4: bool,
}

const Q8: Format = Format { bytes: 34, q4: false };
const Q4: Format = Format { bytes: 18, q4: true };

/// The few-vector form's activation patterns ([`super::int16::few_patterns`]).
const Q4_PATTERNS: [[usize; 8]; 4] = super::int16::few_patterns(true);
const Q8_PATTERNS: [[usize; 8]; 4] = super::int16::few_patterns(false);

/// The pairs a widened row's two registers hold, by 32-bit lane: for Q4B32 the interleave of
/// the low and high nibbles keeps 128-bit halves apart (pairs 0–3 and 8–11, then 4–7 and
/// 12–15); for Q8B32 the sign extension keeps position order.
const Q4_PAIRS: [[usize; 8]; 2] = [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]];
const Q8_PAIRS: [[usize; 8]; 2] = [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]];

/// All bits of lane `r` set for the first `live` lanes, clear for the rest (the masks of
/// `vpmaskmovps` and `vpgatherdd`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn live_mask(live: usize) -> __m256i {
    _mm256_cmpgt_epi32(_mm256_set1_epi32(live as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

/// Generates the kernels for one way of multiplying pairs: `$feat` the instruction sets,
/// `$dot(acc, w, x)` adding to each 32-bit lane of `acc` the two products of its 16-bit
/// halves.
macro_rules! int16_avx2_kernels {
    ($feat:literal, $dot:ident) => {
        use super::*;

        /// Rows `r0..r1` of the Q8B32 matrix `w` against `n` quantized vectors.
        ///
        /// # Safety
        /// As [`crate::kernels::int16::Int16RowsFn`]; the CPU has the instruction sets named
        /// in the attribute.
        #[target_feature(enable = $feat)]
        pub unsafe fn rows_q8(w: &MatRef, r0: usize, r1: usize, x: &Acts<i16>, n: usize, y: *mut f32, ys: usize) {
            // SAFETY: forwarded contract.
            unsafe { rows(Q8, w, r0, r1, x, n, y, ys) }
        }

        /// Rows `r0..r1` of the Q4B32 matrix `w` against `n` quantized vectors.
        ///
        /// # Safety
        /// As [`rows_q8`].
        #[target_feature(enable = $feat)]
        pub unsafe fn rows_q4(w: &MatRef, r0: usize, r1: usize, x: &Acts<i16>, n: usize, y: *mut f32, ys: usize) {
            // SAFETY: forwarded contract.
            unsafe { rows(Q4, w, r0, r1, x, n, y, ys) }
        }

        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn rows(f: Format, w: &MatRef, r0: usize, r1: usize, x: &Acts<i16>, n: usize, y: *mut f32, ys: usize) {
            let rb = w.row_bytes();
            let blocks = rb / f.bytes;
            if n == 0 || r0 >= r1 {
                return;
            }
            if blocks == 0 || rb > (i32::MAX as usize) / LANES {
                // No columns (every result is 0), or rows too long for the gathers' 32-bit
                // offsets: the scalar twin gives the same bits.
                let twin = if f.q4 { crate::kernels::int16::rows_q4 } else { crate::kernels::int16::rows_q8 };
                // SAFETY: forwarded contract.
                return unsafe { twin(w, r0, r1, x, n, y, ys) };
            }
            let offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(rb as i32));
            if n <= FEW {
                // SAFETY: forwarded contract.
                return unsafe {
                    match n {
                        1 => few::<1>(f, w, r0, r1, x, offsets, y, ys),
                        2 => few::<2>(f, w, r0, r1, x, offsets, y, ys),
                        3 => few::<3>(f, w, r0, r1, x, offsets, y, ys),
                        _ => few::<4>(f, w, r0, r1, x, offsets, y, ys),
                    }
                };
            }
            let mut tile = [_mm256_setzero_si256(); GROUPS * CHUNK_BLOCKS * 16];
            let mut scales = [_mm256_setzero_ps(); GROUPS * CHUNK_BLOCKS];
            let mut g = r0;
            while g < r1 {
                // Groups of eight rows share each broadcast input (the last may be short, and
                // those past the range empty).
                let lives: [usize; GROUPS] = std::array::from_fn(|k| (r1 - g).saturating_sub(k * LANES).min(LANES));
                let groups = lives.iter().filter(|&&l| l > 0).count();
                let mut b0 = 0;
                while b0 < blocks {
                    let kb = (blocks - b0).min(CHUNK_BLOCKS);
                    // The rows after these are contiguous: each widened block asks for its
                    // share of their lines at this chunk's columns.
                    let next = w.data.as_ptr().wrapping_add((g + groups * LANES) * rb + b0 * f.bytes * groups * LANES);
                    for (k, &live) in lives.iter().enumerate().take(groups) {
                        // Row g + 8k + j's block b0, or the last row's for lanes past the
                        // range (read, never stored).
                        let at: [*const u8; LANES] = std::array::from_fn(|j| w.data.as_ptr().wrapping_add((g + k * LANES + j).min(r1 - 1) * rb + b0 * f.bytes));
                        let ahead = next.wrapping_add(k * kb * f.bytes * LANES);
                        // SAFETY: those rows' blocks b0..b0+kb lie within the matrix (the
                        // caller's contract); the live rows' scales too.
                        unsafe {
                            widen(f, &at, ahead, live, offsets, kb, &mut tile[k * CHUNK_BLOCKS * 16..(k + 1) * CHUNK_BLOCKS * 16],
                                  &mut scales[k * CHUNK_BLOCKS..(k + 1) * CHUNK_BLOCKS])
                        };
                    }
                    let chunk = Chunk { tile: &tile, scales: &scales, kb, b0, lives };
                    let mut t = 0;
                    while t < n {
                        let tn = (n - t).min(TOKENS);
                        // SAFETY: vectors t..t+tn exist; y at rows g.. of each is ours for the
                        // live lanes.
                        unsafe {
                            let out = y.add(g);
                            match (groups, tn) {
                                (2, 5) => vectors::<2, 5>(&chunk, x, t, out, ys),
                                (2, 4) => vectors::<2, 4>(&chunk, x, t, out, ys),
                                (2, 3) => vectors::<2, 3>(&chunk, x, t, out, ys),
                                (2, 2) => vectors::<2, 2>(&chunk, x, t, out, ys),
                                (2, _) => vectors::<2, 1>(&chunk, x, t, out, ys),
                                (_, 5) => vectors::<1, 5>(&chunk, x, t, out, ys),
                                (_, 4) => vectors::<1, 4>(&chunk, x, t, out, ys),
                                (_, 3) => vectors::<1, 3>(&chunk, x, t, out, ys),
                                (_, 2) => vectors::<1, 2>(&chunk, x, t, out, ys),
                                _ => vectors::<1, 1>(&chunk, x, t, out, ys),
                            }
                        }
                        t += tn;
                    }
                    b0 += kb;
                }
                g += lives.iter().sum::<usize>();
            }
        }

        /// Vectors `t0..t0 + T` against the first `R` groups of one chunk: their
        /// accumulators for the groups' rows start at 0 (the first chunk) or at what the
        /// previous chunk left in `y`, and go back there.
        ///
        /// # Safety
        /// `y[(t0 + t) · ys + 8k + lane]` is ours for every `t < T`, group k and live lane;
        /// the vectors exist.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn vectors<const R: usize, const T: usize>(c: &Chunk, x: &Acts<i16>, t0: usize, y: *mut f32, ys: usize) {
            let masks: [__m256i; R] = std::array::from_fn(|k| live_mask(c.lives[k]));
            let (cols, blocks) = (x.cols, x.cols / 32);
            let out = |k: usize, t: usize| y.wrapping_add((t0 + t) * ys + k * LANES);
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            if c.b0 > 0 {
                for (k, ak) in acc.iter_mut().enumerate() {
                    for (t, a) in ak.iter_mut().enumerate() {
                        // SAFETY: the caller's contract; masked lanes are not read.
                        *a = unsafe { _mm256_maskload_ps(out(k, t), masks[k]) };
                    }
                }
            }
            for b in 0..c.kb {
                let mut sums = [[_mm256_setzero_si256(); T]; R];
                // SAFETY: block b0 + b of vector t0 exists (the caller's contract).
                let q = unsafe { x.q.as_ptr().add(t0 * cols + (c.b0 + b) * 32) };
                for p in 0..16 {
                    let pairs: [__m256i; R] = std::array::from_fn(|k| c.tile[(k * CHUNK_BLOCKS + b) * 16 + p]);
                    for t in 0..T {
                        // SAFETY: positions 2p, 2p + 1 of the block of vector t0 + t.
                        let xq = _mm256_set1_epi32(unsafe { (q.add(t * cols + 2 * p) as *const i32).read_unaligned() });
                        for k in 0..R {
                            sums[k][t] = $dot(sums[k][t], pairs[k], xq);
                        }
                    }
                }
                for t in 0..T {
                    // SAFETY: the block's scale of vector t0 + t.
                    let d = _mm256_set1_ps(unsafe { *x.d.as_ptr().add((t0 + t) * blocks + c.b0 + b) });
                    for k in 0..R {
                        let scale = _mm256_mul_ps(c.scales[k * CHUNK_BLOCKS + b], d);
                        acc[k][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[k][t]), scale, acc[k][t]);
                    }
                }
            }
            for (k, ak) in acc.iter().enumerate() {
                for (t, a) in ak.iter().enumerate() {
                    // SAFETY: the caller's contract; masked lanes are not written.
                    unsafe { _mm256_maskstore_ps(out(k, t), masks[k], *a) };
                }
            }
        }

        /// Widens `kb` blocks of the eight rows `at` (block `b0` of each; rows past the live
        /// ones repeat the last, and their lanes are never stored) into `tile` and `scales`,
        /// asking for the lines of the next group's rows from `next` on, a block's share at a
        /// time. Each row's block becomes two registers of pairs ([`expand_q4`],
        /// [`expand_q8`]), and an 8 × 8 transpose of 32-bit lanes puts each pair's eight rows
        /// side by side.
        ///
        /// # Safety
        /// The rows' `kb` blocks are readable.
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        unsafe fn widen(f: Format, at: &[*const u8; LANES], next: *const u8, live: usize, offsets: __m256i, kb: usize,
                        tile: &mut [__m256i], scales: &mut [__m256]) {
            let pairs = if f.q4 { &Q4_PAIRS } else { &Q8_PAIRS };
            let mask = live_mask(live);
            for b in 0..kb {
                crate::kernels::avx2::prefetch_span(next.wrapping_add(b * f.bytes * LANES), f.bytes * LANES);
                let blk: [*const u8; LANES] = std::array::from_fn(|j| at[j].wrapping_add(b * f.bytes));
                // SAFETY: the live rows' scales are readable (the caller's contract).
                scales[b] = unsafe { gather_scales(blk[0], offsets, mask) };
                // SAFETY: each row's block b is readable (the caller's contract).
                let halves: [[__m256i; 2]; LANES] = blk.map(|p| unsafe { if f.q4 { expand_q4(p) } else { expand_q8(p) } });
                for (h, order) in pairs.iter().enumerate() {
                    let cols = transpose8(std::array::from_fn(|r| halves[r][h]));
                    for (c, &p) in cols.into_iter().zip(order) {
                        tile[b * 16 + p] = c;
                    }
                }
            }
        }

        /// The few-vector form (decode): see the module notes.
        ///
        /// # Safety
        /// As [`rows`] with `n == T`.
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn few<const T: usize>(f: Format, w: &MatRef, r0: usize, r1: usize, x: &Acts<i16>, offsets: __m256i, y: *mut f32, ys: usize) {
            let rb = w.row_bytes();
            let blocks = rb / f.bytes;
            let cols = blocks * 32;
            let order = if f.q4 { &Q4_PATTERNS } else { &Q8_PATTERNS };
            let mut pats = [[[_mm_setzero_si128(); 4]; FEW_CHUNK_BLOCKS]; T];
            let mut b0 = 0;
            while b0 < blocks {
                let kb = (blocks - b0).min(FEW_CHUNK_BLOCKS);
                for (t, pt) in pats.iter_mut().enumerate() {
                    for (b, pb) in pt.iter_mut().take(kb).enumerate() {
                        // SAFETY: block b0 + b of vector t exists (the caller's contract).
                        let q = unsafe { x.q.get_unchecked(t * cols + (b0 + b) * 32..t * cols + (b0 + b + 1) * 32) };
                        for (p, o) in pb.iter_mut().zip(order) {
                            let words: [i16; 8] = o.map(|i| q[i]);
                            // SAFETY: eight i16.
                            *p = unsafe { _mm_loadu_si128(words.as_ptr().cast()) };
                        }
                    }
                }
                let mut g = r0;
                while g < r1 {
                    let live = (r1 - g).min(LANES);
                    let mask = live_mask(live);
                    let mut acc = [_mm256_setzero_ps(); T];
                    if b0 > 0 {
                        for (t, a) in acc.iter_mut().enumerate() {
                            // SAFETY: the caller's contract; masked lanes are not read.
                            *a = unsafe { _mm256_maskload_ps(y.add(t * ys + g), mask) };
                        }
                    }
                    // Row g + j, or the last row of the range for lanes past it (read, never stored).
                    let at: [*const u8; LANES] = std::array::from_fn(|j| w.data.as_ptr().wrapping_add((g + j).min(r1 - 1) * rb + b0 * f.bytes));
                    // The next group's eight rows are contiguous: each block step asks for its
                    // share of their lines at this chunk's columns.
                    let next = w.data.as_ptr().wrapping_add((g + LANES) * rb + b0 * f.bytes * LANES);
                    for b in 0..kb {
                        crate::kernels::avx2::prefetch_span(next.wrapping_add(b * f.bytes * LANES), f.bytes * LANES);
                        let blk = |j: usize| at[j].wrapping_add(b * f.bytes);
                        // SAFETY: the live rows' block b0 + b is within the matrix.
                        let scales = unsafe { gather_scales(blk(0), offsets, mask) };
                        // Rows j and j + 4 share a register: the adds below leave row order.
                        let mut part = [[_mm256_setzero_si256(); 4]; T];
                        for j in 0..4 {
                            // SAFETY: both pointers are blocks of rows within the matrix.
                            let sums = unsafe { two_rows::<T>(f, blk(j), blk(j + 4), &pats, b) };
                            for t in 0..T {
                                part[t][j] = sums[t];
                            }
                        }
                        for (t, a) in acc.iter_mut().enumerate() {
                            let [p0, p1, p2, p3] = part[t];
                            let s = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
                            // SAFETY: the block's scale of vector t.
                            let d = unsafe { *x.d.as_ptr().add(t * blocks + b0 + b) };
                            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(scales, _mm256_set1_ps(d)), *a);
                        }
                    }
                    for (t, a) in acc.iter().enumerate() {
                        // SAFETY: the caller's contract; masked lanes are not written.
                        unsafe { _mm256_maskstore_ps(y.add(t * ys + g), mask, *a) };
                    }
                    g += live;
                }
                b0 += kb;
            }
        }

        /// One block of two rows (`lo` in the low 128-bit half, `hi` in the high one) against
        /// the `T` vectors' patterns of block `b`: per vector, four 32-bit partial sums per row.
        ///
        /// # Safety
        /// Each pointer is a whole block of `f`.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn two_rows<const T: usize>(f: Format, lo: *const u8, hi: *const u8, pats: &[[[__m128i; 4]; FEW_CHUNK_BLOCKS]; T], b: usize) -> [__m256i; T] {
            // SAFETY: 16 bytes at `at` within each block.
            let load = |at: usize| unsafe { _mm256_loadu2_m128i(hi.add(at).cast(), lo.add(at).cast()) };
            let ws = if f.q4 {
                let v = load(2);
                [_mm256_srai_epi16::<12>(_mm256_slli_epi16::<12>(v)), _mm256_srai_epi16::<12>(_mm256_slli_epi16::<8>(v)),
                 _mm256_srai_epi16::<12>(_mm256_slli_epi16::<4>(v)), _mm256_srai_epi16::<12>(v)]
            } else {
                let (u, v) = (load(2), load(18));
                [_mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(u)), _mm256_srai_epi16::<8>(u),
                 _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(v)), _mm256_srai_epi16::<8>(v)]
            };
            let mut sums = [_mm256_setzero_si256(); T];
            for (s, pt) in sums.iter_mut().zip(pats) {
                for (wk, pk) in ws.iter().zip(&pt[b]) {
                    *s = $dot(*s, *wk, _mm256_broadcastsi128_si256(*pk));
                }
            }
            sums
        }
    };
}

/// The f32 scales of eight rows' blocks, `base` the first row's block and `offsets`
/// the rows' distances from it; lanes outside `mask` ([`live_mask`]) are 0 (their rows
/// are not read).
///
/// # Safety
/// The live rows' first two bytes at their offsets are readable (a 4-byte read each:
/// the scale and the payload's first two bytes).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn gather_scales(base: *const u8, offsets: __m256i, mask: __m256i) -> __m256 {
    // SAFETY: the live lanes' addresses are readable (the caller).
    let bits = unsafe { _mm256_mask_i32gather_epi32::<1>(_mm256_setzero_si256(), base.cast(), offsets, mask) };
    // The low 16 bits of each lane, packed in lane order, widened exactly.
    let low = _mm256_and_si256(bits, _mm256_set1_epi32(0xFFFF));
    let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(low, low));
    _mm256_cvtph_ps(_mm256_castsi256_si128(packed))
}

/// Chunk of a widened tile: its blocks `b0..b0 + kb` for up to [`GROUPS`] groups of eight
/// rows, and how many of each group's rows are live.
struct Chunk<'a> {
    tile: &'a [__m256i; GROUPS * CHUNK_BLOCKS * 16],
    scales: &'a [__m256; GROUPS * CHUNK_BLOCKS],
    kb: usize,
    b0: usize,
    lives: [usize; GROUPS],
}

/// A Q4B32 row block as pairs of 16-bit weights: the sixteen payload bytes widened to words,
/// each word's low and high nibble sign-extended and interleaved — register 0 holds pairs 0–3
/// and 8–11, register 1 pairs 4–7 and 12–15 ([`Q4_PAIRS`]); pair p is payload byte p.
///
/// # Safety
/// The 18-byte block at p is readable.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn expand_q4(p: *const u8) -> [__m256i; 2] {
    // SAFETY: the caller's contract.
    let words = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(p.add(2).cast()) });
    let low = _mm256_srai_epi16::<12>(_mm256_slli_epi16::<12>(words));
    let high = _mm256_srai_epi16::<12>(_mm256_slli_epi16::<8>(words));
    [_mm256_unpacklo_epi16(low, high), _mm256_unpackhi_epi16(low, high)]
}

/// A Q8B32 row block as pairs of 16-bit weights, in position order ([`Q8_PAIRS`]).
///
/// # Safety
/// The 34-byte block at p is readable.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn expand_q8(p: *const u8) -> [__m256i; 2] {
    // SAFETY: the caller's contract.
    unsafe {
        [_mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2).cast())), _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18).cast()))]
    }
}

/// The 8 × 8 transpose of 32-bit lanes: output j, lane i = input i, lane j.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    // Pairs of rows interleaved (32-bit), then pairs of pairs (64-bit), then halves.
    let lo32 = |a, b| _mm256_unpacklo_epi32(a, b);
    let hi32 = |a, b| _mm256_unpackhi_epi32(a, b);
    let (t0, t1, t2, t3) = (lo32(r[0], r[1]), hi32(r[0], r[1]), lo32(r[2], r[3]), hi32(r[2], r[3]));
    let (t4, t5, t6, t7) = (lo32(r[4], r[5]), hi32(r[4], r[5]), lo32(r[6], r[7]), hi32(r[6], r[7]));
    let (u0, u1, u2, u3) = (_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3));
    let (u4, u5, u6, u7) = (_mm256_unpacklo_epi64(t4, t6), _mm256_unpackhi_epi64(t4, t6), _mm256_unpacklo_epi64(t5, t7), _mm256_unpackhi_epi64(t5, t7));
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

/// `vpmaddwd` + `vpaddd`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn madd(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(w, x))
}

/// AVX-VNNI `vpdpwssd`, as written (see [`super::int16_x86`]'s `dpwssd` for why not the
/// intrinsic).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
fn dpwssd(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY: a register-only instruction of the enabled AVX-VNNI.
    unsafe { std::arch::asm!("{{vex}} vpdpwssd {acc}, {w}, {x}", acc = inout(ymm_reg) acc, w = in(ymm_reg) w, x = in(ymm_reg) x, options(pure, nomem, nostack, preserves_flags)) };
    acc
}

/// The kernels with `vpmaddwd` + `vpaddd` (every AVX2 CPU).
pub mod madd {
    int16_avx2_kernels!("avx2,fma,f16c", madd);
}

/// The kernels with AVX-VNNI `vpdpwssd`.
pub mod vnni {
    int16_avx2_kernels!("avx2,fma,f16c,avxvnni", dpwssd);
}

/// The int16 quantizer on eight lanes ([`super::int16::quantize_block`]'s rule, bit for bit:
/// the largest |x| is exact in any order, `32767 / max` the same scalar division, each
/// `x · inv` the same f32 product, rounded to nearest even by the conversion as the scalar's
/// magic-number addition does).
///
/// # Safety
/// As [`super::int8::QuantizeFn`]; the CPU has AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize(x: &[f32], q: &mut [i16], d: &mut [f32]) {
    let blocks = (x.len() / 32).min(q.len() / 32).min(d.len());
    for (b, scale) in d.iter_mut().take(blocks).enumerate() {
        // SAFETY: block b lies inside x (blocks is bounded by it).
        let (v, amax, finite) = unsafe { block_max(x.as_ptr().add(32 * b)) };
        let out = q[32 * b..32 * b + 32].as_mut_ptr();
        if !finite || amax == 0.0 {
            // SAFETY: 32 values at `out`.
            unsafe { std::ptr::write_bytes(out, 0, 32) };
            *scale = if finite { 0.0 } else { f32::NAN };
            continue;
        }
        let inv = _mm256_set1_ps(32767.0 / amax);
        let i: [__m256i; 4] = v.map(|vi| _mm256_cvtps_epi32(_mm256_mul_ps(vi, inv)));
        // packs interleaves the 128-bit halves: (0..4, 8..12 | 4..8, 12..16); the permute
        // restores position order. Every value is within ±32767, so nothing saturates.
        let (lo, hi) = (_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        // SAFETY: 32 values at `out`.
        unsafe {
            _mm256_storeu_si256(out.cast(), _mm256_permute4x64_epi64::<0b11_01_10_00>(lo));
            _mm256_storeu_si256(out.add(16).cast(), _mm256_permute4x64_epi64::<0b11_01_10_00>(hi));
        }
        *scale = amax / 32767.0;
    }
}

/// A block of 32 activations at `p` as four registers, its largest |x| (exact in any order)
/// and whether every value is finite — the first steps of the integer paths' block rule.
///
/// # Safety
/// 32 values are readable at `p`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn block_max(p: *const f32) -> ([__m256; 4], f32, bool) {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let largest = _mm256_set1_ps(f32::MAX);
    // SAFETY: the caller's contract.
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(p.add(8 * i)) });
    let a: [__m256; 4] = v.map(|vi| _mm256_and_ps(vi, abs));
    let finite = a.iter().fold(_mm256_castsi256_ps(_mm256_set1_epi32(-1)), |f, ai| _mm256_and_ps(f, _mm256_cmp_ps::<_CMP_LE_OQ>(*ai, largest)));
    let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    (v, _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m))), _mm256_movemask_ps(finite) == 0xFF)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dtype::DType;
    use crate::kernels::int16;

    use crate::kernels::TestRng as Rng;

    /// Random blocks of `f` with normal binary16 scales.
    /// Both multiply forms (AVX-VNNI where the CPU has it) equal the scalar twin bit for bit,
    /// through both the few-vector form and the widened tile, their chunk edges, and row
    /// groups cut short; the quantizer equals the scalar one.
    #[test]
    fn both_forms_equal_the_scalar_twin() {
        if !super::super::Isa::Avx2.supported() {
            println!("SKIP: int16_avx2::both_forms_equal_the_scalar_twin: this CPU has no AVX2");
            return;
        }
        if !super::super::has_avx_vnni() {
            println!("SKIP: int16_avx2::both_forms_equal_the_scalar_twin: no AVX-VNNI here, only the vpmaddwd form is checked");
        }
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        for (f, dtype) in [(Q4, DType::Q4B32), (Q8, DType::Q8B32)] {
            for (rows, blocks) in [(1, 1), (7, 3), (8, 17), (19, 2), (13, 33), (9, 513)] {
                let data = rng.blocks(f.bytes, rows * blocks);
                let cols = blocks * 32;
                let w = MatRef { dtype, rows, cols, data: &data };
                for n in [1, 2, 3, 4, 5, 6, 7, 13] {
                    if blocks > 100 && n > 5 {
                        continue;
                    }
                    let x: Vec<f32> = (0..n * cols).map(|i| if i % 97 == 3 { 30.0 } else { rng.f32() }).collect();
                    let (mut q, mut d) = (vec![0i16; n * cols], vec![0f32; n * blocks]);
                    let (mut q2, mut d2) = (q.clone(), d.clone());
                    // SAFETY: AVX2 was checked; the buffers hold n vectors.
                    unsafe {
                        int16::quantize_scalar(&x, &mut q, &mut d);
                        quantize(&x, &mut q2, &mut d2);
                    }
                    assert!(q == q2 && d.iter().zip(&d2).all(|(a, b)| a.to_bits() == b.to_bits()), "quantizer, {rows}x{cols} n={n}");
                    let acts = Acts { q: &q, d: &d, cols };
                    let run = |k: int16::Int16RowsFn, r0: usize, r1: usize| {
                        let mut y = vec![f32::NAN; n * rows];
                        // SAFETY: the kernels' instruction sets were checked; y holds n × rows.
                        unsafe { k(&w, r0, r1, &acts, n, y.as_mut_ptr(), rows) };
                        y
                    };
                    let (twin, forms) = if f.q4 {
                        (int16::rows_q4 as int16::Int16RowsFn, [madd::rows_q4 as int16::Int16RowsFn, vnni::rows_q4])
                    } else {
                        (int16::rows_q8 as int16::Int16RowsFn, [madd::rows_q8 as int16::Int16RowsFn, vnni::rows_q8])
                    };
                    for (r0, r1) in [(0, rows), (rows / 3, rows)] {
                        let want = run(twin, r0, r1);
                        for (i, form) in forms.into_iter().enumerate().take(if super::super::has_avx_vnni() { 2 } else { 1 }) {
                            let got = run(form, r0, r1);
                            for (k, (g, e)) in got.iter().zip(&want).enumerate() {
                                assert!(g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()),
                                    "{dtype} form {i} {rows}x{cols} rows {r0}..{r1} n={n} element {k}: {g} vs {e}");
                            }
                        }
                    }
                }
            }
        }
    }
}
