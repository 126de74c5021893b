//! Intel AMX tiles for the Q4B32, Q8B32 and BF16 products of a prefill chunk (Sapphire Rapids
//! and later, where the OS grants the tile state: [`crate::sys::amx_bf16_permitted`]).
//!
//! Why: one `tdpbf16ps` multiplies a 16 × 32 bf16 tile by a 32 × 16 one into 16 × 16 f32 sums,
//! 8,192 multiply-adds, at about one per 5 ns on a core of the Intel host of BENCHMARKS
//! (2026-12-04, night) — some 1,500 GMAC/s against the 107–124 of its 512-bit FMA units. The
//! AVX-512 GEMM ([`super::avx512_prefill`]) stays below 60 % of the FMA peak; the tiles, fed
//! the way they are here, run the same products 2–3× faster (`waste bench matmul --isa amx`).
//!
//! Exactness: the tiles multiply bf16 values and add in f32. A Q4B32 level (−8..7), a Q8B32
//! level (−128..127) and a BF16 weight are exact in bf16, and every f32 input is split into
//! three bf16 parts, h = bf16(x), m = bf16(x − h), l = bf16(x − h − m), whose sum is x exactly
//! (8 + 8 + 8 significant bits; inputs below about 1e-36 lose their last part, which the tiles
//! flush as a denormal). So each product of a weight and a part is exact in f32, and a block's
//! sum is an f32 sum of exact products, as in the FMA kernels; only the order of the additions
//! differs (the tile adds the block's 32 columns for h, then for m, then for l). A quantized
//! block's sum times its scale is then added to the (row, vector) accumulator with one FMA, the
//! scalar kernel's order; BF16 has no scale, and its tiles add up a whole column chunk before
//! the accumulator takes the sum. The results agree with the scalar twins to f32 rounding
//! (`tests/kernels.rs`), but they are not the bits of the FMA kernels, which decode uses.
//!
//! Which vectors come here: [`super::Kernels`] takes a product's vectors [`super::SPLIT_VECTORS`]
//! at a time, and a group of at least [`super::TILE_MIN_VECTORS`] goes to the tiles ([`takes`]), a smaller
//! one to the AVX-512 kernels. The bits of a (row, vector) pair therefore depend on the size of
//! its group (whether it reaches that size) — never on which rows a call covers or on
//! the thread count (the column chunks below are fixed by the matrix's width).
//!
//! Layout: the inputs are split once per product ([`split_inputs`]) into tiles of 16 vectors ×
//! one 32-column block, a tile per part (the first operand). Rows are taken 32 at a time (two
//! weight tiles) and columns [`CHUNK_BLOCKS`] blocks at a time ([`BF16_CHUNK_BLOCKS`] for
//! BF16): that piece of the matrix is widened into a panel of bf16 weights in the
//! pair-interleaved order the second operand takes, and each pair of 16-vector groups walks it: per block, 4 accumulator tiles (2 vector groups ×
//! 2 row tiles) get 12 tile products (3 parts); their sums go to the (vector, row)
//! accumulators, 16 KiB for 128 vectors per 32 rows, which [`ROW_TILE_PAIRS`] row pairs share a
//! pass over the inputs' column chunk.

use super::MatRef;
use crate::format::dtype::DType;
use crate::sys::Floats;
use std::arch::asm;
use std::arch::x86_64::*;

/// Vectors of one tile (its rows as the first operand).
const GROUP: usize = 16;

/// Pairs of vector groups (32 vectors each) that one pass over the rows serves: 128 vectors,
/// [`super::SPLIT_VECTORS`].
const PAIRS: usize = 4;

/// Pairs of row tiles (32 rows each) that share one pass over a column chunk of the split
/// inputs, so that the chunk (192 KiB for 128 vectors and 8 blocks) comes from L2 once for
/// 256 rows instead of once for 32; their accumulators take 128 KiB of stack. Q4B32 2048 ×
/// 8192 on two threads: 189 GMAC/s with one pair, 256 with four over 32-block chunks, 289 with
/// eight over 8-block ones (BENCHMARKS, 2026-12-04, night).
const ROW_TILE_PAIRS: usize = 8;

/// Column blocks of a quantized width widened into one panel (16 KiB of bf16 levels, 1 KiB of
/// scales). The accumulator tiles are stored after every block anyway, so a short chunk
/// costs them nothing, and its inputs stay in L2 across all [`ROW_TILE_PAIRS`].
const CHUNK_BLOCKS: usize = 8;

/// Column blocks of a BF16 panel (32 KiB; of the panel's room, which is sized for these): its
/// tiles add up a whole chunk before their sums go to the accumulators, so longer chunks store
/// them less often (BF16 2048 × 8192 with the 8 blocks of the quantized widths was 5 % slower).
const BF16_CHUNK_BLOCKS: usize = 16;

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

/// The weights the tiles take: each holds its values exactly in bf16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Q4B32: levels −8..7 and an f16 scale per block of 32 (18 bytes).
    Q4,
    /// Q8B32: levels −128..127 and an f16 scale per block of 32 (34 bytes).
    Q8,
    /// BF16, in blocks of 32 columns with no scale (64 bytes); the column count must be a
    /// multiple of 32.
    Bf16,
}

impl Kind {
    /// The kind of a dtype the tiles take, else `None`.
    pub fn of(dtype: DType) -> Option<Kind> {
        match dtype {
            DType::Q4B32 => Some(Kind::Q4),
            DType::Q8B32 => Some(Kind::Q8),
            DType::BF16 => Some(Kind::Bf16),
            _ => None,
        }
    }

    /// Bytes of one 32-column block of a row.
    fn block_bytes(self) -> usize {
        match self {
            Kind::Q4 => 18,
            Kind::Q8 => 34,
            Kind::Bf16 => 64,
        }
    }
}

/// True when the tiles take `w` (a [`Kind`], whole 32-column blocks) for a group of `n` vectors.
pub fn takes(w: &MatRef, n: usize) -> bool {
    n >= super::TILE_MIN_VECTORS && Kind::of(w.dtype).is_some() && w.cols.is_multiple_of(32) && w.cols > 0
}

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
/// the 16 weight rows as bf16 (the pair-interleaved order of a second operand) — the levels of
/// a quantized block, the values themselves for BF16 — and `scales` the blocks' scales as f32
/// (`[block][32 rows]`; 1 for BF16).
///
/// # Safety
/// AVX-512 F/BW and F16C; `kind` is `w`'s; `r < end <= w.rows`, `b0 + nb <= w.cols / 32`,
/// `w.data` holds the matrix and its row bytes × 15 fit an i32; `panel` holds `nb × 2` tiles
/// (64-byte aligned) and `scales` `nb × 32` values.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn widen_weights(w: &MatRef, kind: Kind, r: usize, end: usize, b0: usize, nb: usize, panel: *mut u16, scales: *mut f32) {
    let rb = w.row_bytes();
    let offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(rb as i32));
    let zero = _mm512_setzero_si512();
    // SAFETY: reads 64 bytes of a 64-byte constant.
    let levels = unsafe { _mm512_loadu_si512(LEVELS.as_ptr().cast()) };
    for rt in 0..2 {
        let first = r + 16 * rt;
        let live = end.saturating_sub(first).min(16);
        let valid: __mmask16 = ((1u32 << live) - 1) as u16;
        // The tile's first row, or any row when none is live (every lane is masked off then).
        let base = w.data.as_ptr().wrapping_add(first.min(end - 1) * rb);
        for b in 0..nb {
            let block = base.wrapping_add((b0 + b) * kind.block_bytes());
            // Four bytes at `at` in each live row's block (masked lanes read nothing).
            let gather = |at: usize| {
                // SAFETY: `at + 4` is within the block for every caller below (scale at 0,
                // payload from 2 to 18 or 34, BF16 pairs to 64), the block within the row.
                unsafe { _mm512_mask_i32gather_epi32::<1>(zero, valid, offsets, block.wrapping_add(at).cast()) }
            };
            let scale = match kind {
                Kind::Bf16 => _mm512_set1_ps(1.0),
                Kind::Q4 | Kind::Q8 => _mm512_cvtph_ps(_mm512_cvtepi32_epi16(gather(0))),
            };
            // SAFETY: scales holds nb × 32 values.
            unsafe { _mm512_storeu_ps(scales.add(b * 32 + rt * 16), scale) };
            // SAFETY: tile (b, rt) lies within the panel's nb × 2 tiles.
            let tile = unsafe { panel.add((b * 2 + rt) * TILE) };
            // SAFETY (the stores): row k of the tile, 64 bytes at a 64-byte boundary.
            let store = |k: usize, pairs: __m512i| unsafe { _mm512_store_si512(tile.add(k * 32).cast(), pairs) };
            match kind {
                Kind::Q4 => {
                    for q in 0..4 {
                        let g = gather(2 + 4 * q);
                        for j in 0..4 {
                            // Byte 4q + j of each row: its low nibble is column 2(4q + j), its
                            // high one the next column; each lands in one half of the lane.
                            let byte = _mm512_and_si512(_mm512_srlv_epi32(g, _mm512_set1_epi32(8 * j as i32)), _mm512_set1_epi32(0xFF));
                            let pair = _mm512_and_si512(_mm512_or_si512(byte, _mm512_slli_epi32::<12>(byte)), _mm512_set1_epi32(0x000F_000F));
                            store(4 * q + j, _mm512_permutexvar_epi16(pair, levels));
                        }
                    }
                }
                Kind::Q8 => {
                    // A level's bf16 is its f32's upper half, exact (at most 8 significant bits).
                    let bf16 = |level: __m512i| _mm512_castps_si512(_mm512_cvtepi32_ps(level));
                    let upper = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
                    for q in 0..8 {
                        let g = gather(2 + 4 * q);
                        let c0 = bf16(_mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(g)));
                        let c1 = bf16(_mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(g)));
                        let c2 = bf16(_mm512_srai_epi32::<24>(_mm512_slli_epi32::<8>(g)));
                        let c3 = bf16(_mm512_srai_epi32::<24>(g));
                        store(2 * q, _mm512_or_si512(_mm512_srli_epi32::<16>(c0), _mm512_and_si512(c1, upper)));
                        store(2 * q + 1, _mm512_or_si512(_mm512_srli_epi32::<16>(c2), _mm512_and_si512(c3, upper)));
                    }
                }
                Kind::Bf16 => {
                    // Columns 2k and 2k + 1 are one little-endian 32-bit pair already.
                    for k in 0..16 {
                        store(k, gather(4 * k));
                    }
                }
            }
        }
    }
}

/// Multiplies the panel's `nb` blocks with one pair of vector groups into the four accumulator
/// tiles (group 0/1 × row tile 0/1), adding each (vector, row) sum to `acc` (`[group][row tile]
/// [16 vectors][16 rows]`). Quantized blocks (`scaled`): per block the tiles are zeroed, get
/// the 12 products of the groups' three input parts with the two weight tiles, are stored to
/// `sums`, and each sum times its row's block scale is added to `acc` (one FMA, the scalar
/// kernel's order). BF16: the tiles add up all `nb` blocks and are added to `acc` once.
///
/// # Safety
/// AVX-512 F, the tile configuration of [`TileConfig::all_16x64`] loaded; `acts` points at the
/// pair's first group's tiles for the panel's first block, the second group's `other` bf16
/// values further; `panel`, `scales` as [`widen_weights`] wrote them for `nb` blocks; `acc`
/// and `sums` hold 2 × [`GROUP_SUMS`] values, 64-byte aligned.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn multiply_pair(panel: *const u16, scales: *const f32, scaled: bool, acts: *const u16, other: usize, nb: usize, acc: *mut f32, sums: *mut f32) {
    // SAFETY (the asm blocks): tile instructions on the loaded configuration, their memory
    // operands within the panel, the split inputs and the sums (the caller's contract); the
    // tile registers are not Rust's, so the blocks clobber nothing of its, and the tiles keep
    // their values from one block to the next.
    let zero = || unsafe { asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem)) };
    let store = || unsafe {
        asm!(
            "tilestored [{c} + {s}], tmm0",
            "tilestored [{c} + {s} + 1024], tmm1",
            "tilestored [{c} + {s} + 2048], tmm2",
            "tilestored [{c} + {s} + 3072], tmm3",
            c = in(reg) sums, s = in(reg) 64usize, options(nostack),
        )
    };
    // Adds `sums` to `acc`, each times `scale(row tile)`.
    let add = |scale: [__m512; 2]| {
        for t in 0..4 {
            for i in 0..16 {
                let o = t * 256 + i * 16;
                // SAFETY: both hold 4 × 256 values from a 64-byte boundary.
                unsafe { _mm512_store_ps(acc.add(o), _mm512_fmadd_ps(_mm512_load_ps(sums.add(o)), scale[t % 2], _mm512_load_ps(acc.add(o)))) };
            }
        }
    };
    if !scaled {
        zero();
    }
    for b in 0..nb {
        if scaled {
            zero();
        }
        // SAFETY: as above; block b of the panel (2 tiles) and of each group (3 tiles).
        unsafe {
            let wt = panel.add(b * 2 * TILE);
            let a0 = acts.add(b * 3 * TILE);
            let a1 = a0.add(other);
            asm!(
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
                w = in(reg) wt, a0 = in(reg) a0, a1 = in(reg) a1, s = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
        if scaled {
            store();
            // SAFETY: scales holds nb × 32 values.
            add(unsafe { [_mm512_loadu_ps(scales.add(b * 32)), _mm512_loadu_ps(scales.add(b * 32 + 16))] });
        }
    }
    if !scaled {
        store();
        add([_mm512_set1_ps(1.0); 2]);
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

/// The [`super::RowsFn`] for inputs [`split_inputs`] has split, by dtype: rows `r0..r1` of `w`
/// against `n` vectors, into `y[t · ys + r]`.
pub fn rows_split_for(kind: Kind) -> super::RowsFn {
    match kind {
        Kind::Q4 => rows_split::<0>,
        Kind::Q8 => rows_split::<1>,
        Kind::Bf16 => rows_split::<2>,
    }
}

/// Rows `r0..r1` of `w` (Q4B32, Q8B32 or BF16 as `KIND` says: 0, 1, 2) against `n` vectors whose
/// inputs [`split_inputs`] has split into `x`, into `y[t · ys + r]`.
///
/// Stack use: about 170 KiB (the accumulators of 256 rows × 128 vectors, a panel, the stored
/// tiles), below the AVX-512 GEMM's 190.
///
/// # Safety
/// As `RowsFn` (with `x` the split inputs of `n` vectors: [`split_len`] values), and the CPU has
/// AVX-512 F/BW, AVX512_BF16, F16C and AMX-BF16 tiles the OS lets this process use.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
unsafe fn rows_split<const KIND: u8>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    let kind = [Kind::Q4, Kind::Q8, Kind::Bf16][KIND as usize];
    assert!(Kind::of(w.dtype) == Some(kind) && w.cols.is_multiple_of(32), "amx::rows_split: not a {kind:?} matrix of whole blocks");
    assert!(x.len() >= split_len(n, w.cols), "amx::rows_split: split inputs too short");
    assert!(w.row_bytes() <= i32::MAX as usize / 16, "amx::rows_split: rows too long for the gathers");
    if n == 0 || r0 >= r1 {
        return;
    }
    let blocks = w.cols / 32;
    let acts = x.as_ptr().cast::<u16>();
    let chunk = if kind == Kind::Bf16 { BF16_CHUNK_BLOCKS } else { CHUNK_BLOCKS };
    let mut panel = Aligned([0u16; BF16_CHUNK_BLOCKS * 2 * TILE]);
    let mut scales = [0f32; BF16_CHUNK_BLOCKS * 32];
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
            for b0 in (0..blocks).step_by(chunk) {
                let nb = chunk.min(blocks - b0);
                for rp in 0..nrp {
                    // SAFETY: rb + 32·rp < r1 <= w.rows, b0 + nb <= blocks; the buffers are
                    // sized for BF16_CHUNK_BLOCKS >= chunk blocks; the row bytes were checked above.
                    unsafe { widen_weights(w, kind, rb + 32 * rp, r1, b0, nb, panel.0.as_mut_ptr(), scales.as_mut_ptr()) };
                    for q in 0..np {
                        let group = (p0 + q) * 2;
                        // SAFETY: the split inputs hold groups 0..pairs·2 of `blocks` blocks × 3
                        // tiles; acc holds ROW_TILE_PAIRS × PAIRS pairs' accumulators.
                        unsafe {
                            let a = acts.add((group * blocks + b0) * 3 * TILE);
                            let sums_of = acc.0.as_mut_ptr().add((rp * PAIRS + q) * 2 * GROUP_SUMS);
                            multiply_pair(panel.0.as_ptr(), scales.as_ptr(), kind != Kind::Bf16, a, blocks * 3 * TILE, nb, sums_of, sums.0.as_mut_ptr());
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

/// Generates the [`super::RowsFn`] `$name` of a dtype on a host with tiles, for inputs not split
/// beforehand: the vectors [`super::SPLIT_VECTORS`] at a time, a group the tiles take
/// ([`takes`]) split into a buffer of its own and multiplied on them, any other by the AVX-512
/// kernel `$plain` — the choice [`super::Kernels`] makes with its own buffer, so either way gives
/// the same bits.
macro_rules! rows_with_tiles {
    ($name:ident, $kind:expr, $plain:expr) => {
        /// See [`rows_with_tiles`].
        ///
        /// # Safety
        /// As [`super::RowsFn`], and the CPU has AVX-512 F/BW, AVX512_BF16, F16C and AMX-BF16
        /// tiles the OS lets this process use.
        #[target_feature(enable = "avx512f,avx512bw,avx512bf16,f16c")]
        pub unsafe fn $name(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
            let cols = w.cols;
            for t0 in (0..n).step_by(super::SPLIT_VECTORS) {
                let tn = super::SPLIT_VECTORS.min(n - t0);
                let xs = &x[t0 * cols..(t0 + tn) * cols];
                // SAFETY: vectors t0.. of y are the caller's (its contract covers all n).
                let yt = unsafe { y.add(t0 * ys) };
                if !takes(w, tn) {
                    // SAFETY: forwarded contract; the CPU has AVX-512.
                    unsafe { $plain(w, r0, r1, xs, tn, yt, ys) };
                    continue;
                }
                let mut split = Floats::zeroed(split_len(tn, cols));
                // SAFETY: forwarded contract (the split inputs are ours, sized by split_len).
                unsafe {
                    split_inputs(xs, tn, cols, &mut split);
                    rows_split_for($kind)(w, r0, r1, &split, tn, yt, ys);
                }
            }
        }
    };
}

// The AVX-512 kernels behind the tiles keep L2-sized token groups (`WHOLE` false): AMX is
// Intel's, where those were measured best ([`super::TokenGroups`]).
rows_with_tiles!(rows_q4b32, Kind::Q4, super::avx512::rows_q4b32::<false, false>);
rows_with_tiles!(rows_q4b32_own_rows, Kind::Q4, super::avx512::rows_q4b32::<true, false>);
rows_with_tiles!(rows_q8b32, Kind::Q8, super::avx512::rows_q8b32::<false>);
rows_with_tiles!(rows_q8b32_own_rows, Kind::Q8, super::avx512::rows_q8b32_own_rows::<false>);
rows_with_tiles!(rows_bf16, Kind::Bf16, super::avx512::rows_bf16::<false>);
