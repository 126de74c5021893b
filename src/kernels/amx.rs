//! Intel AMX tiles for the Q4B32 products of a prefill chunk (Sapphire Rapids and later, where
//! the OS grants the tile state: [`crate::sys::amx_bf16_permitted`]).
//!
//! Why: one `tdpbf16ps` multiplies a 16 × 32 bf16 tile by a 32 × 16 one into 16 × 16 f32 sums,
//! 8,192 multiply-adds, at about one per 5 ns on a core of the Intel host of BENCHMARKS
//! (2026-12-04, night) — some 1,500 GMAC/s against the 107–124 of its 512-bit FMA units. The
//! AVX-512 GEMM ([`super::avx512_prefill`]) stays below 60 % of the FMA peak; the tiles, fed
//! the way they are here, run the same Q4B32 products 2–2.5× faster.
//!
//! Exactness: the tiles multiply bf16 values and add in f32. A Q4B32 level (−8..7) is exact
//! in bf16, and every f32 input is split into three bf16 parts, h = bf16(x), m = bf16(x − h),
//! l = bf16(x − h − m), whose sum is x exactly (8 + 8 + 8 significant bits; inputs below about
//! 1e-36 lose their last part, which the tiles flush as a denormal). So each product of a level
//! and a part is exact in f32, and a block's sum Σ level·x is an f32 sum of exact products, as
//! in the FMA kernels; only the order of the additions differs (the tile adds the block's 32
//! columns for h, then for m, then for l). The block's sum times its scale is then added to the
//! (row, vector) accumulator with one FMA, the scalar kernel's order. The results agree with
//! the scalar twin to f32 rounding (`tests/kernels.rs`), but they are not the bits of the FMA
//! kernels, which decode uses.
//!
//! Which vectors come here: [`super::Kernels`] takes a product's vectors [`super::SPLIT_VECTORS`]
//! at a time, and a group of at least [`MIN_VECTORS`] goes to the tiles, a smaller one to the
//! AVX-512 kernels. The bits of a (row, vector) pair therefore depend on the size of its group
//! (whether it reaches [`MIN_VECTORS`]) — never on which rows a call covers, on the thread
//! count, or on where the tiles' column chunks fall.
//!
//! Layout: the inputs are split once per product ([`split_inputs`]) into tiles of 16 vectors ×
//! one 32-column block, a tile per part. Rows are taken 32 at a time (two weight tiles) and
//! columns [`CHUNK_BLOCKS`] blocks at a time: that piece of the matrix is widened into a panel
//! of bf16 levels in the pair-interleaved order the second operand takes, and each pair of
//! 16-vector groups walks it: per block, 4 accumulator tiles (2 vector groups × 2 row tiles)
//! get 12 tile products (3 parts), are stored, scaled by the rows' block scales and added to
//! the accumulators (16 KiB for 128 vectors, in L1).

use super::MatRef;
use crate::sys::Floats;
use std::arch::asm;
use std::arch::x86_64::*;

/// Fewest vectors of a group that go to the tiles ([`super::TILE_MIN_VECTORS`]). A group is
/// padded to a multiple of 32 (two 16-vector tiles): at 16 vectors the tiles ran level with the
/// AVX-512 GEMM (8192 × 2048, one thread: 50.8 against 55.2 GMAC/s), at 32 almost twice as
/// fast (97.4 against 53.0).
pub const MIN_VECTORS: usize = super::TILE_MIN_VECTORS;

/// Vectors of one tile (its rows as the first operand).
const GROUP: usize = 16;

/// Pairs of vector groups (32 vectors each) that one pass over the rows serves: 128 vectors,
/// [`super::SPLIT_VECTORS`].
const PAIRS: usize = 4;

/// Pairs of row tiles (32 rows each) that share one pass over a column chunk of the split
/// inputs: the inputs of 128 vectors and 32 blocks (768 KiB) come from L2 once for 128 rows
/// instead of once for 32 (2048 × 8192 on two threads: 189 → ... GMAC/s); their
/// accumulators take 64 KiB of stack.
const ROW_TILE_PAIRS: usize = 4;

/// Column blocks widened into one panel: 64 KiB of bf16 levels and 4 KiB of scales on the
/// stack.
const CHUNK_BLOCKS: usize = 32;

/// bf16 values of one tile: 16 rows of 64 bytes.
const TILE: usize = 512;

/// f32 values of one vector group's accumulators: 2 row tiles × 16 vectors × 16 rows.
const GROUP_SUMS: usize = 2 * 256;

/// The bf16 bits of the Q4B32 levels, indexed by the stored nibble (`(nibble ^ 8) − 8`), for
/// `vpermw` (32 lanes, the upper 16 unused).
const LEVELS: [u16; 32] = {
    let mut t = [0u16; 32];
    let mut i = 0;
    while i < 16 {
        let level = ((i ^ 8) as i32 - 8) as f32;
        t[i] = (level.to_bits() >> 16) as u16;
        i += 1;
    }
    t
};

/// f32 values [`split_inputs`] writes for `n` vectors of `cols` columns (a multiple of 32):
/// `n` rounded up to 32, × `cols / 32` blocks × 3 parts × 32 bf16.
pub fn split_len(n: usize, cols: usize) -> usize {
    n.div_ceil(2 * GROUP) * 2 * GROUP * (cols / 32) * 48
}

/// A tile configuration (palette 1) with all eight tiles 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn all_16x64() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t] = 64; // bytes per row, little-endian u16
            c[48 + t] = 16; // rows
        }
        TileConfig(c)
    }
}

/// Stack buffers with the 64-byte alignment tile loads and stores want.
#[repr(C, align(64))]
struct Aligned<T>(T);

/// Splits the `n` vectors of `x` (`cols` each, a multiple of 32) into their three bf16 parts,
/// laid out as the tiles read them: for each group of 16 vectors (the last padded with zero
/// vectors to a multiple of 32) and each 32-column block, the h, m and l tiles, each 16 rows
/// (the vectors) of the block's 32 columns.
///
/// # Safety
/// The CPU has AVX-512 F/BW and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn split_inputs(x: &[f32], n: usize, cols: usize, out: &mut [f32]) {
    assert!(cols.is_multiple_of(32) && x.len() >= n * cols && out.len() >= split_len(n, cols), "amx::split_inputs: buffers too short");
    let blocks = cols / 32;
    let tiles = out.as_mut_ptr().cast::<u16>();
    for t in 0..n.div_ceil(2 * GROUP) * 2 * GROUP {
        let (group, row) = (t / GROUP, t % GROUP);
        for b in 0..blocks {
            // SAFETY: tile (group, b, part) row `row` lies within split_len(n, cols) values.
            let dst = unsafe { tiles.add((group * blocks + b) * 3 * TILE + row * 32) };
            for half in 0..2 {
                let v = if t < n {
                    // SAFETY: t < n, and columns b·32 + half·16 .. +16 lie within the vector.
                    unsafe { _mm512_loadu_ps(x.as_ptr().add(t * cols + b * 32 + half * 16)) }
                } else {
                    _mm512_setzero_ps()
                };
                let h = _mm512_cvtneps_pbh(v);
                let rest = _mm512_sub_ps(v, _mm512_cvtpbh_ps(h));
                let m = _mm512_cvtneps_pbh(rest);
                let l = _mm512_cvtneps_pbh(_mm512_sub_ps(rest, _mm512_cvtpbh_ps(m)));
                for (p, part) in [h, m, l].into_iter().enumerate() {
                    // SAFETY: 16 bf16 at the part's tile row, half·16 in; the vector types are
                    // both 256 bits.
                    unsafe { _mm256_storeu_si256(dst.add(p * TILE + half * 16).cast(), std::mem::transmute::<__m256bh, __m256i>(part)) };
                }
            }
        }
    }
}

/// Widens rows `r..r + 32` of `w` (rows from `end` on as zeros), blocks `b0..b0 + nb`, into
/// `panel`: for each block and 16-row tile, row k of the tile holds columns 2k and 2k + 1 of
/// the 16 weight rows as bf16 levels (the pair-interleaved order of a second operand), and
/// `scales` the blocks' scales as f32 (`[block][32 rows]`).
///
/// # Safety
/// AVX-512 F/BW and F16C; `r < end <= w.rows`, `b0 + nb <= w.cols / 32`, `w.data` holds the
/// matrix and its row bytes × 15 fit an i32; `panel` holds `nb × 2` tiles and `scales` `nb × 32`.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn widen_weights(w: &MatRef, r: usize, end: usize, b0: usize, nb: usize, panel: *mut u16, scales: *mut f32) {
    let rb = w.row_bytes();
    // SAFETY: reads 64 bytes of a 64-byte constant.
    let levels = unsafe { _mm512_loadu_si512(LEVELS.as_ptr().cast()) };
    let nibbles = _mm512_set1_epi32(0x000F_000F);
    let bytes = _mm512_set1_epi32(0xFF);
    let offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(rb as i32));
    for rt in 0..2 {
        let first = r + 16 * rt;
        let live = end.saturating_sub(first).min(16);
        let valid: __mmask16 = ((1u32 << live) - 1) as u16;
        // The tile's first row, or any row when none is live (every lane is masked off then).
        let base = w.data.as_ptr().wrapping_add(first.min(end - 1) * rb);
        for b in 0..nb {
            let block = base.wrapping_add((b0 + b) * 18);
            let zero = _mm512_setzero_si512();
            // SAFETY (the gathers): live lanes read 4 bytes of their row's block (scale at 0,
            // payload at 2..18); masked lanes read nothing.
            let s = unsafe { _mm512_mask_i32gather_epi32::<1>(zero, valid, offsets, block.cast()) };
            // SAFETY: scales holds nb × 32 values.
            unsafe { _mm512_storeu_ps(scales.add(b * 32 + rt * 16), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(s))) };
            // SAFETY: tile (b, rt) lies within the panel's nb × 2 tiles.
            let tile = unsafe { panel.add((b * 2 + rt) * TILE) };
            for q in 0..4 {
                // SAFETY: live lanes read payload bytes 2 + 4q .. 6 + 4q (at most 18) of their
                // row's block; masked lanes read nothing.
                let g = unsafe { _mm512_mask_i32gather_epi32::<1>(zero, valid, offsets, block.wrapping_add(2 + 4 * q).cast()) };
                for j in 0..4 {
                    // Byte 4q + j of each row: its low nibble is column 2(4q + j), its high one
                    // the next column; each lands in one half of the 32-bit lane, as an index.
                    let byte = _mm512_and_si512(_mm512_srlv_epi32(g, _mm512_set1_epi32(8 * j as i32)), bytes);
                    let pair = _mm512_and_si512(_mm512_or_si512(byte, _mm512_slli_epi32::<12>(byte)), nibbles);
                    // SAFETY: row 4q + j of the tile, 64 bytes, 64-byte aligned (the panel is).
                    unsafe { _mm512_store_si512(tile.add((4 * q + j) * 32).cast(), _mm512_permutexvar_epi16(pair, levels)) };
                }
            }
        }
    }
}

/// Multiplies the panel's `nb` blocks with one pair of vector groups: per block, the four
/// accumulator tiles (group 0/1 × row tile 0/1) are zeroed, get the 12 products of the
/// groups' three input parts with the two weight tiles, and are stored to `sums`; each
/// (vector, row) sum times its row's block scale is then added to `acc` (`[group][row tile]
/// [16 vectors][16 rows]`).
///
/// # Safety
/// AVX-512 F, the tile configuration of [`TileConfig::all_16x64`] loaded; `acts` points at the
/// pair's first group's tiles for the panel's first block, the second group's `other` bf16
/// values further; `panel`, `scales` as [`widen_weights`] wrote them for `nb` blocks; `acc`
/// and `sums` hold 2 × [`GROUP_SUMS`] values, 64-byte aligned.
#[target_feature(enable = "avx512f")]
unsafe fn multiply_pair(panel: *const u16, scales: *const f32, acts: *const u16, other: usize, nb: usize, acc: *mut f32, sums: *mut f32) {
    for b in 0..nb {
        // SAFETY: within the panel's, the split inputs' and the sums' bounds (the caller's
        // contract); the tile registers are not Rust's, so the block clobbers nothing of its.
        unsafe {
            let wt = panel.add(b * 2 * TILE);
            let a0 = acts.add(b * 3 * TILE);
            let a1 = a0.add(other);
            asm!(
                "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
                "tileloadd tmm6, [{w} + {s}]",
                "tileloadd tmm7, [{w} + {s} + 1024]",
                "tileloadd tmm4, [{a0} + {s}]",
                "tileloadd tmm5, [{a1} + {s}]",
                "tdpbf16ps tmm0, tmm4, tmm6", "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6", "tdpbf16ps tmm3, tmm5, tmm7",
                "tileloadd tmm4, [{a0} + {s} + 1024]",
                "tileloadd tmm5, [{a1} + {s} + 1024]",
                "tdpbf16ps tmm0, tmm4, tmm6", "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6", "tdpbf16ps tmm3, tmm5, tmm7",
                "tileloadd tmm4, [{a0} + {s} + 2048]",
                "tileloadd tmm5, [{a1} + {s} + 2048]",
                "tdpbf16ps tmm0, tmm4, tmm6", "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6", "tdpbf16ps tmm3, tmm5, tmm7",
                "tilestored [{c} + {s}], tmm0",
                "tilestored [{c} + {s} + 1024], tmm1",
                "tilestored [{c} + {s} + 2048], tmm2",
                "tilestored [{c} + {s} + 3072], tmm3",
                w = in(reg) wt, a0 = in(reg) a0, a1 = in(reg) a1, c = in(reg) sums, s = in(reg) 64usize,
                options(nostack),
            );
            let scale = [_mm512_loadu_ps(scales.add(b * 32)), _mm512_loadu_ps(scales.add(b * 32 + 16))];
            for t in 0..4 {
                for i in 0..16 {
                    let o = t * 256 + i * 16;
                    _mm512_store_ps(acc.add(o), _mm512_fmadd_ps(_mm512_load_ps(sums.add(o)), scale[t % 2], _mm512_load_ps(acc.add(o))));
                }
            }
        }
    }
}

/// Writes the accumulators of `pairs` vector pairs from vector `t0` (`[pair][group][row tile]
/// [16 vectors][16 rows]`) to `y[t · ys + r]` for vectors below `n` and rows `r..r + 32` below
/// `end`.
///
/// # Safety
/// AVX-512 F; `acc` holds `pairs` × 2 × [`GROUP_SUMS`] values; those elements of `y` are the
/// caller's to write.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn write_rows(acc: *const f32, pairs: usize, t0: usize, n: usize, r: usize, end: usize, y: *mut f32, ys: usize) {
    for rt in 0..2 {
        let first = r + 16 * rt;
        let live = end.saturating_sub(first).min(16);
        if live == 0 {
            continue;
        }
        let mask: __mmask16 = ((1u32 << live) - 1) as u16;
        for v in 0..(pairs * 2 * GROUP).min(n - t0) {
            let (group, i) = (v / GROUP, v % GROUP);
            // SAFETY: the accumulator row exists; the masked store writes rows first..first+live
            // of vector t0 + v < n.
            unsafe {
                let row = _mm512_load_ps(acc.add((group * 2 + rt) * 256 + i * 16));
                _mm512_mask_storeu_ps(y.add((t0 + v) * ys + first), mask, row);
            }
        }
    }
}

/// Rows `r0..r1` of the Q4B32 matrix `w` against `n` vectors whose inputs [`split_inputs`] has
/// split into `x`, into `y[t · ys + r]` (a [`super::RowsFn`] for the split inputs).
///
/// # Safety
/// As `RowsFn` (with `x` the split inputs of `n` vectors: [`split_len`] values), and the CPU has
/// AVX-512 F/BW, AVX512_BF16, F16C and AMX-BF16 tiles the OS lets this process use.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
pub unsafe fn rows_q4b32_split(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    assert!(x.len() >= split_len(n, w.cols), "amx::rows_q4b32_split: split inputs too short");
    assert!(w.row_bytes() <= i32::MAX as usize / 16, "amx::rows_q4b32_split: rows too long for the gathers");
    if n == 0 || r0 >= r1 {
        return;
    }
    let blocks = w.cols / 32;
    let acts = x.as_ptr().cast::<u16>();
    let mut panel = Aligned([0u16; CHUNK_BLOCKS * 2 * TILE]);
    let mut scales = [0f32; CHUNK_BLOCKS * 32];
    let mut acc = Aligned([0f32; ROW_TILE_PAIRS * PAIRS * 2 * GROUP_SUMS]);
    let mut sums = Aligned([0f32; 2 * GROUP_SUMS]);
    let config = TileConfig::all_16x64();
    // SAFETY: the caller's contract says the tiles are usable; the configuration is valid.
    unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly)) };
    let pairs = n.div_ceil(2 * GROUP);
    for p0 in (0..pairs).step_by(PAIRS) {
        let np = PAIRS.min(pairs - p0);
        for rb in (r0..r1).step_by(32 * ROW_TILE_PAIRS) {
            let nrp = (r1 - rb).div_ceil(32).min(ROW_TILE_PAIRS);
            acc.0.fill(0.0);
            for b0 in (0..blocks).step_by(CHUNK_BLOCKS) {
                let nb = CHUNK_BLOCKS.min(blocks - b0);
                for rp in 0..nrp {
                    // SAFETY: rb + 32·rp < r1 <= w.rows, b0 + nb <= blocks; the buffers are
                    // sized for CHUNK_BLOCKS blocks; the row bytes were checked above.
                    unsafe { widen_weights(w, rb + 32 * rp, r1, b0, nb, panel.0.as_mut_ptr(), scales.as_mut_ptr()) };
                    for q in 0..np {
                        let group = (p0 + q) * 2;
                        // SAFETY: the split inputs hold groups 0..pairs·2 of `blocks` blocks × 3
                        // tiles; acc holds ROW_TILE_PAIRS × PAIRS pairs' accumulators.
                        unsafe {
                            let a = acts.add((group * blocks + b0) * 3 * TILE);
                            let sums_of = acc.0.as_mut_ptr().add((rp * PAIRS + q) * 2 * GROUP_SUMS);
                            multiply_pair(panel.0.as_ptr(), scales.as_ptr(), a, blocks * 3 * TILE, nb, sums_of, sums.0.as_mut_ptr());
                        }
                    }
                }
            }
            for rp in 0..nrp {
                // SAFETY: vectors below n and rows below r1 are the caller's to write.
                unsafe { write_rows(acc.0.as_ptr().add(rp * PAIRS * 2 * GROUP_SUMS), np, p0 * 2 * GROUP, n, rb + 32 * rp, r1, y, ys) };
            }
        }
    }
    // SAFETY: releases this thread's tile state (a context switch then saves none of it).
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// The Q4B32 [`super::RowsFn`] on a host with tiles, for inputs not split beforehand: the
/// vectors [`super::SPLIT_VECTORS`] at a time, a group of at least [`MIN_VECTORS`] split into a
/// buffer of its own and multiplied on the tiles, a smaller one by the AVX-512 kernel — the
/// choice [`super::Kernels`] makes with its own buffer, so either way gives the same bits.
///
/// # Safety
/// As [`rows_q4b32_split`], with `x` the plain inputs.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
pub unsafe fn rows_q4b32<const OWN_ROWS: bool>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    let cols = w.cols;
    for t0 in (0..n).step_by(super::SPLIT_VECTORS) {
        let tn = super::SPLIT_VECTORS.min(n - t0);
        let xs = &x[t0 * cols..(t0 + tn) * cols];
        // SAFETY: vectors t0.. of y are the caller's (its contract covers all n).
        let yt = unsafe { y.add(t0 * ys) };
        if tn < MIN_VECTORS {
            // SAFETY: forwarded contract; the CPU has AVX-512.
            unsafe { super::avx512::rows_q4b32::<OWN_ROWS>(w, r0, r1, xs, tn, yt, ys) };
            continue;
        }
        let mut split = Floats::zeroed(split_len(tn, cols));
        // SAFETY: forwarded contract (the split inputs are ours, sized by split_len).
        unsafe {
            split_inputs(xs, tn, cols, &mut split);
            rows_q4b32_split(w, r0, r1, &split, tn, yt, ys);
        }
    }
}
