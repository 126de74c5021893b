//! AVX-512 VNNI kernels of the int16 path ([`super::int16`] states the arithmetic and holds
//! the scalar twins they equal bit for bit).
//!
//! Sixteen rows sit in the lanes of a register. A chunk of [`CHUNK_BLOCKS`] weight blocks of
//! those rows is widened once into a stack tile: per block, sixteen registers, register `p`
//! holding in lane `r` the pair of signed 16-bit weights at positions `2p, 2p + 1` of row `r`,
//! and one register of the rows' f32 scales. Each vector of the call then meets the tile: per
//! block and pair one `vpdpwssd` against the vector's activation pair broadcast to every lane
//! (sixteen rows' exact block sums build up in sixteen int32 lanes), then one conversion, one
//! scale product and one fused multiply-add into the rows' accumulators. Up to [`TOKENS`]
//! vectors share each load of a tile register. The accumulators wait in the output between
//! chunks (an f32 stored and loaded back is the same f32).
//!
//! The widening loads four rows' payloads per register (one per 128-bit lane) and transposes
//! 32-bit lanes, which gives per register four bytes of every row — four Q4B32 pairs or two
//! Q8B32 pairs per lane; a pair's two 16-bit weights are moved to the top of their halves by
//! shifts or rotations and a blend, and one arithmetic shift per half sign-extends them. The
//! rows' scales come with one gather per block, and each block asks for its share of the next
//! row group's lines.
//!
//! Up to [`FEW`] vectors take the few-vector form instead ([`few`]), whose results are the same
//! bits (the block sums are exact integers; everything after them is the same operations).
//!
//! Stack use: up to 130 KiB per call (the few-vector form's permuted activations).

use super::avx2::prefetch_span;
use super::int8::Acts;
use super::MatRef;
use std::arch::x86_64::*;

/// Rows per register (the lanes).
const LANES: usize = 16;
/// Blocks widened per chunk: the tile (16 × 64 bytes per block) is 16 KiB, in L1 beside the
/// activations.
const CHUNK_BLOCKS: usize = 16;
/// Vectors per register tile: eight int32 sums and eight f32 accumulators.
const TOKENS: usize = 8;
/// Up to this many vectors a call takes the few-vector form ([`few`]).
const FEW: usize = 4;
/// Blocks per column chunk of the few-vector form (16,384 columns): each row is read whole
/// (rows of up to this many columns, which are nearly all), and the permuted activations
/// take 32 KiB per vector. At 128 blocks, a 1 GiB Q4B32 matrix from DRAM read at 8–9 GB/s on
/// one thread of Zen 4 against 12 (each pass over the rows took 2.3 KiB of every row).
const FEW_CHUNK_BLOCKS: usize = 512;

/// The weight format: bytes per block, and whether the payload is Q4B32 nibbles.
#[derive(Clone, Copy)]
struct Format {
    bytes: usize,
    q4: bool,
}

/// Rows `r0..r1` of the Q8B32 matrix `w` against `n` quantized vectors.
///
/// # Safety
/// As [`super::int16::Int16RowsFn`]; the CPU has AVX-512 F/BW/VL and VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows_q8(w: &MatRef, r0: usize, r1: usize, x: &Acts<i16>, n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe { rows(Format { bytes: 34, q4: false }, w, r0, r1, x, n, y, ys) }
}

/// Rows `r0..r1` of the Q4B32 matrix `w` against `n` quantized vectors.
///
/// # Safety
/// As [`rows_q8`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows_q4(w: &MatRef, r0: usize, r1: usize, x: &Acts<i16>, n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe { rows(Format { bytes: 18, q4: true }, w, r0, r1, x, n, y, ys) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows(f: Format, w: &MatRef, r0: usize, r1: usize, x: &Acts<i16>, n: usize, y: *mut f32, ys: usize) {
    let rb = w.row_bytes();
    let blocks = rb / f.bytes;
    if n == 0 || r0 >= r1 {
        return;
    }
    if blocks == 0 || rb > (i32::MAX as usize) / LANES {
        // No columns (every result is 0), or rows too long for the gathers' 32-bit offsets:
        // the scalar twin gives the same bits.
        let twin = if f.q4 { super::int16::rows_q4 } else { super::int16::rows_q8 };
        // SAFETY: forwarded contract.
        return unsafe { twin(w, r0, r1, x, n, y, ys) };
    }
    let offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(rb as i32));
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
    let mut tile = [_mm512_setzero_si512(); CHUNK_BLOCKS * 16];
    let mut scales = [_mm512_setzero_ps(); CHUNK_BLOCKS];
    let acts = Inputs { q: x.q.as_ptr(), d: x.d.as_ptr(), blocks };
    let mut g = r0;
    while g < r1 {
        let live = (r1 - g).min(LANES);
        let mask = ((1u32 << live) - 1) as __mmask16;
        let mut b0 = 0;
        while b0 < blocks {
            let kb = (blocks - b0).min(CHUNK_BLOCKS);
            // Row g + j's block b0, or the last row's for lanes past the range (read, never stored).
            let rows: [*const u8; LANES] = std::array::from_fn(|j| w.data.as_ptr().wrapping_add((g + j).min(r1 - 1) * rb + b0 * f.bytes));
            // The next group's rows, contiguous: each widened block asks for its share of them
            // at this chunk's columns, as the few-vector form does (the gathers and loads of
            // a chunk otherwise wait for sixteen rows' lines from memory: 15 % of an MoE prefill).
            let next = w.data.as_ptr().wrapping_add((g + LANES) * rb + b0 * f.bytes * LANES);
            // SAFETY: those rows' blocks b0..b0+kb lie within the matrix (the caller's contract).
            unsafe { widen(f, &rows, next, mask, offsets, kb, &mut tile, &mut scales) };
            let chunk = Chunk { tile: &tile, scales: &scales, kb, b0, mask };
            let mut t = 0;
            while t < n {
                let tn = (n - t).min(TOKENS);
                // SAFETY: vectors t..t+tn exist; y at row g of each is ours for `live` lanes.
                unsafe {
                    let out = y.add(g);
                    match tn {
                        8 => vectors::<8>(&chunk, &acts, t, out, ys),
                        7 => vectors::<7>(&chunk, &acts, t, out, ys),
                        6 => vectors::<6>(&chunk, &acts, t, out, ys),
                        5 => vectors::<5>(&chunk, &acts, t, out, ys),
                        4 => vectors::<4>(&chunk, &acts, t, out, ys),
                        3 => vectors::<3>(&chunk, &acts, t, out, ys),
                        2 => vectors::<2>(&chunk, &acts, t, out, ys),
                        _ => vectors::<1>(&chunk, &acts, t, out, ys),
                    }
                }
                t += tn;
            }
            b0 += kb;
        }
        g += live;
    }
}

/// The quantized vectors, as raw pointers: `blocks` blocks of 32 values each.
struct Inputs {
    q: *const i16,
    d: *const f32,
    blocks: usize,
}

impl Inputs {
    /// Values per vector.
    fn cols(&self) -> usize {
        self.blocks * 32
    }
}

/// One widened chunk: its blocks `b0..b0 + kb`, and which of the rows are live.
struct Chunk<'a> {
    tile: &'a [__m512i; CHUNK_BLOCKS * 16],
    scales: &'a [__m512; CHUNK_BLOCKS],
    kb: usize,
    b0: usize,
    mask: __mmask16,
}

/// Vectors `t0..t0 + T` against one chunk: their accumulators for the chunk's sixteen rows
/// start at 0 (the first chunk) or at what the previous chunk left in `y`, and go back there.
///
/// # Safety
/// `y[(t0 + t) · ys + lane]` is ours for every `t < T` and live lane; the vectors exist.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn vectors<const T: usize>(c: &Chunk, x: &Inputs, t0: usize, y: *mut f32, ys: usize) {
    let mut acc = [_mm512_setzero_ps(); T];
    if c.b0 > 0 {
        for (t, a) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's contract; masked lanes are not read.
            *a = unsafe { _mm512_maskz_loadu_ps(c.mask, y.add((t0 + t) * ys)) };
        }
    }
    for b in 0..c.kb {
        let mut sums = [_mm512_setzero_si512(); T];
        // SAFETY: block b0 + b of vector t0 exists (the caller's contract).
        let q = unsafe { x.q.add(t0 * x.cols() + (c.b0 + b) * 32) };
        for p in 0..16 {
            let pairs = c.tile[b * 16 + p];
            for (t, s) in sums.iter_mut().enumerate() {
                // SAFETY: positions 2p, 2p + 1 of the block of vector t0 + t.
                let xq = unsafe { (q.add(t * x.cols() + 2 * p) as *const i32).read_unaligned() };
                *s = _mm512_dpwssd_epi32(*s, pairs, _mm512_set1_epi32(xq));
            }
        }
        for (t, (a, s)) in acc.iter_mut().zip(sums).enumerate() {
            // SAFETY: the block's scale of vector t0 + t.
            let d = unsafe { *x.d.add((t0 + t) * x.blocks + c.b0 + b) };
            let scale = _mm512_mul_ps(c.scales[b], _mm512_set1_ps(d));
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, *a);
        }
    }
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: the caller's contract; masked lanes are not written.
        unsafe { _mm512_mask_storeu_ps(y.add((t0 + t) * ys), c.mask, *a) };
    }
}

/// Widens `kb` blocks of the sixteen rows `rows` (block `b0` of each; rows past the live
/// ones repeat the last, and their lanes are never stored) into `tile` and `scales`, asking
/// for the lines of the next group's rows from `next` on, a block's share at a time. Four
/// rows' payloads share a register, one per 128-bit lane, as the few-vector form loads them;
/// a transpose of 32-bit lanes within each 128-bit lane then gives, per register, one 4-byte
/// piece of every row in row order.
///
/// # Safety
/// The rows' `kb` blocks from `b0` are readable; the live rows' scales too (`mask`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn widen(f: Format, rows: &[*const u8; LANES], next: *const u8, mask: __mmask16, offsets: __m512i, kb: usize,
                tile: &mut [__m512i; CHUNK_BLOCKS * 16], scales: &mut [__m512; CHUNK_BLOCKS]) {
    for b in 0..kb {
        prefetch_span(next.wrapping_add(b * f.bytes * LANES), f.bytes * LANES);
        let at = |j: usize| rows[j].wrapping_add(b * f.bytes);
        // SAFETY: the live rows' scales (masked lanes read nothing).
        scales[b] = unsafe { _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), mask, offsets, at(0).cast()))) };
        // Register q holds rows q, q + 4, q + 8, q + 12 (128-bit lane i: row 4i + q).
        let fours: [[*const u8; 4]; 4] = std::array::from_fn(|q| [at(q), at(q + 4), at(q + 8), at(q + 12)]);
        let out = &mut tile[b * 16..b * 16 + 16];
        // SAFETY (the loads): 16 bytes at 2 (and 18 for Q8B32) within each row's block.
        let d = transpose(fours.map(|four| unsafe { load_four(four, 2) }));
        if f.q4 {
            for (j, v) in d.into_iter().enumerate() {
                // Payload bytes 4j..4j+4: byte k holds positions 8j + 2k (low nibble) and
                // 8j + 2k + 1 (high nibble), pair 4j + k.
                out[4 * j] = nibble_pair::<12, 24>(v);
                out[4 * j + 1] = nibble_pair::<4, 16>(v);
                out[4 * j + 2] = nibble_pair::<28, 8>(v);
                out[4 * j + 3] = nibble_pair::<20, 0>(v);
            }
        } else {
            let e = transpose(fours.map(|four| unsafe { load_four(four, 18) }));
            for (j, v) in d.into_iter().chain(e).enumerate() {
                // Payload bytes 4j..4j+4, positions 4j..4j+4: pairs 2j and 2j + 1.
                out[2 * j] = top_halves(_mm512_slli_epi32::<8>(v), _mm512_slli_epi32::<16>(v), 8);
                out[2 * j + 1] = top_halves(_mm512_srli_epi32::<8>(v), v, 8);
            }
        }
    }
}

/// Sixteen bytes at `at` of each of four blocks, block i in 128-bit lane i.
///
/// # Safety
/// The sixteen bytes are readable in every block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn load_four(blocks: [*const u8; 4], at: usize) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe {
        let lo = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_loadu_si128(blocks[0].add(at).cast())), _mm_loadu_si128(blocks[1].add(at).cast()));
        let hi = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_loadu_si128(blocks[2].add(at).cast())), _mm_loadu_si128(blocks[3].add(at).cast()));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// Within each 128-bit lane, the 4 × 4 transpose of 32-bit lanes across the four registers:
/// output j, lane i, 32-bit lane q = input q, lane i, 32-bit lane j.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn transpose(p: [__m512i; 4]) -> [__m512i; 4] {
    let (a, b) = (_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
    let (c, d) = (_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
    [_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c), _mm512_unpacklo_epi64(b, d), _mm512_unpackhi_epi64(b, d)]
}

/// The Q4B32 pair whose low nibble `LO` rotates to bits 12..16 and whose high nibble `HI`
/// rotates to bits 28..32, sign-extended from 4 bits into two 16-bit weights.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn nibble_pair<const LO: i32, const HI: i32>(v: __m512i) -> __m512i {
    top_halves(_mm512_rol_epi32::<LO>(v), _mm512_rol_epi32::<HI>(v), 12)
}

/// The low 16 bits of each lane from `lo`, the high 16 from `hi`, each half shifted right
/// arithmetically by `bits` (12 or 8): the value in the top of each half, sign-extended.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn top_halves(lo: __m512i, hi: __m512i, bits: u32) -> __m512i {
    // 0xE4: per bit, the third operand selects the first (1) or the second (0).
    let both = _mm512_ternarylogic_epi32::<0xE4>(lo, hi, _mm512_set1_epi32(0xFFFF));
    if bits == 12 { _mm512_srai_epi16::<12>(both) } else { _mm512_srai_epi16::<8>(both) }
}

/// The few-vector form (decode): no widened tile, whose gathers cost more than one vector's
/// multiply-adds. Four rows share a register, one block's payload per 128-bit lane loaded as
/// it lies; each 32-bit lane then holds eight nibbles (Q4B32) or four bytes (Q8B32) of one row,
/// which shifts of the 16-bit halves sign-extend into pairs of weights from positions four
/// (Q4B32) or two (Q8B32) apart. The activations are permuted once per call and block into
/// the same pairs (a `vpermw` per pattern), the four patterns' `vpdpwssd` leave four partial
/// sums per row, and a transpose-and-add tree turns four such registers into the exact block
/// sums of sixteen rows, in row order — then the conversion, scale and fused multiply-add of
/// the arithmetic, as the many-vector form does them.
///
/// # Safety
/// As [`rows`] with `n == T`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn few<const T: usize>(f: Format, w: &MatRef, r0: usize, r1: usize, x: &Acts<i16>, offsets: __m512i, y: *mut f32, ys: usize) {
    let rb = w.row_bytes();
    let blocks = rb / f.bytes;
    let cols = blocks * 32;
    let order = patterns(f);
    let mut pats = [[[_mm_setzero_si128(); 4]; FEW_CHUNK_BLOCKS]; T];
    let mut b0 = 0;
    while b0 < blocks {
        let kb = (blocks - b0).min(FEW_CHUNK_BLOCKS);
        for (t, pt) in pats.iter_mut().enumerate() {
            for (b, pb) in pt.iter_mut().take(kb).enumerate() {
                // SAFETY: block b0 + b of vector t exists (the caller's contract).
                let q = unsafe { _mm512_loadu_si512(x.q.as_ptr().add(t * cols + (b0 + b) * 32).cast()) };
                for (p, o) in pb.iter_mut().zip(order) {
                    *p = _mm512_castsi512_si128(_mm512_permutexvar_epi16(o, q));
                }
            }
        }
        let mut g = r0;
        while g < r1 {
            let live = (r1 - g).min(LANES);
            let mask = ((1u32 << live) - 1) as __mmask16;
            let mut acc = [_mm512_setzero_ps(); T];
            if b0 > 0 {
                for (t, a) in acc.iter_mut().enumerate() {
                    // SAFETY: the caller's contract; masked lanes are not read.
                    *a = unsafe { _mm512_maskz_loadu_ps(mask, y.add(t * ys + g)) };
                }
            }
            // Row g + j, or the last row of the range for lanes past it (read, never stored).
            let rows: [*const u8; LANES] = std::array::from_fn(|j| w.data.as_ptr().wrapping_add((g + j).min(r1 - 1) * rb + b0 * f.bytes));
            // The next group's sixteen rows are contiguous: each block step asks for its share
            // of their lines at this chunk's columns (`avx2::prefetch_span`, as the f32 decode
            // tiles' tile-after-next scheme).
            let next = w.data.as_ptr().wrapping_add((g + LANES) * rb + b0 * f.bytes * LANES);
            for b in 0..kb {
                prefetch_span(next.wrapping_add(b * f.bytes * LANES), f.bytes * LANES);
                let at = |j: usize| rows[j].wrapping_add(b * f.bytes);
                // SAFETY: the live rows' block b0 + b is within the matrix.
                let scales = unsafe { _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), mask, offsets, at(0).cast()))) };
                // Register q holds rows q, q + 4, q + 8, q + 12: the tree below puts row j in lane j.
                let mut part = [[_mm512_setzero_si512(); 4]; T];
                #[allow(clippy::needless_range_loop)]
                for q in 0..4 {
                    // SAFETY: each pointer is a block of a row within the matrix.
                    let sums = unsafe { four_rows::<T>(f, [at(q), at(q + 4), at(q + 8), at(q + 12)], &pats, b) };
                    for t in 0..T {
                        part[t][q] = sums[t];
                    }
                }
                for (t, a) in acc.iter_mut().enumerate() {
                    let [p0, p1, p2, p3] = part[t];
                    let s = add_across(add_across_pairs(p0, p1), add_across_pairs(p2, p3));
                    // SAFETY: the block's scale of vector t.
                    let d = unsafe { *x.d.as_ptr().add(t * blocks + b0 + b) };
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scales, _mm512_set1_ps(d)), *a);
                }
            }
            for (t, a) in acc.iter().enumerate() {
                // SAFETY: the caller's contract; masked lanes are not written.
                unsafe { _mm512_mask_storeu_ps(y.add(t * ys + g), mask, *a) };
            }
            g += live;
        }
        b0 += kb;
    }
}

/// The activation patterns of the few-vector form ([`super::int16::few_patterns`]) as
/// `vpermw` indices, the same in every 128-bit lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn patterns(f: Format) -> [__m512i; 4] {
    let order = super::int16::few_patterns(f.q4);
    let idx: [[i16; 32]; 4] = std::array::from_fn(|k| std::array::from_fn(|i| order[k][i % 8] as i16));
    // SAFETY: each array is 64 bytes.
    idx.map(|a| unsafe { _mm512_loadu_si512(a.as_ptr().cast()) })
}

/// One block of four rows (`blocks`, one pointer each) against the `T` vectors' patterns of
/// block `b`: per vector, sixteen 32-bit partial sums, four per row (128-bit lane = row).
///
/// # Safety
/// Each pointer is a whole block of `f`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn four_rows<const T: usize>(f: Format, blocks: [*const u8; 4], pats: &[[[__m128i; 4]; FEW_CHUNK_BLOCKS]; T], b: usize) -> [__m512i; T] {
    // SAFETY: 16 bytes at `at` within each block.
    let load = |at: usize| unsafe { load_four(blocks, at) };
    let mut sums = [_mm512_setzero_si512(); T];
    let ws = if f.q4 {
        let v = load(2);
        [_mm512_srai_epi16::<12>(_mm512_slli_epi16::<12>(v)), _mm512_srai_epi16::<12>(_mm512_slli_epi16::<8>(v)),
         _mm512_srai_epi16::<12>(_mm512_slli_epi16::<4>(v)), _mm512_srai_epi16::<12>(v)]
    } else {
        let (u, v) = (load(2), load(18));
        [_mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(u)), _mm512_srai_epi16::<8>(u),
         _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(v)), _mm512_srai_epi16::<8>(v)]
    };
    for (s, pt) in sums.iter_mut().zip(pats) {
        for (wk, pk) in ws.iter().zip(&pt[b]) {
            *s = dpwssd(*s, *wk, _mm512_broadcast_i32x4(*pk));
        }
    }
    sums
}

/// Per 128-bit lane, `[a0 + a2, b0 + b2, a1 + a3, b1 + b3]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) fn add_across_pairs(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
}

/// Per 128-bit lane, from two [`add_across_pairs`] results of (a, b) and (c, d): the four
/// lanes' totals `[Σa, Σb, Σc, Σd]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) fn add_across(ab: __m512i, cd: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd))
}

/// `vpdpwssd`, as written: the compiler would split a chain of them into `vpmaddwd` and
/// `vpaddd` (two instructions for one) to shorten the chain's latency, which the independent
/// rows and vectors already hide.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: a register-only instruction of the enabled AVX-512 VNNI.
    unsafe { std::arch::asm!("vpdpwssd {acc}, {a}, {b}", acc = inout(zmm_reg) acc, a = in(zmm_reg) a, b = in(zmm_reg) b, options(pure, nomem, nostack, preserves_flags)) };
    acc
}

/// The int16 quantizer ([`super::int16::quantize_block`]'s rule, bit for bit): per block of
/// 32, the largest |x| by a reduction, `x · (32767 / max)` rounded to nearest even by the
/// conversion (the default rounding mode, as the scalar's magic-number addition), narrowed.
///
/// # Safety
/// As [`super::int8::QuantizeFn`]; the CPU has AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn quantize(x: &[f32], q: &mut [i16], d: &mut [f32]) {
    let blocks = (x.len() / 32).min(q.len() / 32).min(d.len());
    let magnitude = _mm512_set1_epi32(0x7FFF_FFFF);
    for (b, scale) in d.iter_mut().take(blocks).enumerate() {
        // SAFETY: block b of x and q is in bounds (checked by `blocks`).
        let (v0, v1) = unsafe { (_mm512_loadu_ps(x.as_ptr().add(32 * b)), _mm512_loadu_ps(x.as_ptr().add(32 * b + 16))) };
        let out = q[32 * b..32 * b + 32].as_mut_ptr();
        // x − x is NaN exactly where x is infinite or NaN.
        let bad = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(_mm512_sub_ps(v0, v0), _mm512_sub_ps(v1, v1));
        let abs = |v: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), magnitude));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(abs(v0), abs(v1)));
        if bad != 0 || amax == 0.0 {
            // SAFETY: 32 values at `out`.
            unsafe { std::ptr::write_bytes(out, 0, 32) };
            *scale = if bad != 0 { f32::NAN } else { 0.0 };
            continue;
        }
        let inv = _mm512_set1_ps(32767.0 / amax);
        let (i0, i1) = (_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)));
        // SAFETY: 32 values at `out`.
        unsafe {
            _mm256_storeu_si256(out.cast(), _mm512_cvtepi32_epi16(i0));
            _mm256_storeu_si256(out.add(16).cast(), _mm512_cvtepi32_epi16(i1));
        }
        *scale = amax / 32767.0;
    }
}
