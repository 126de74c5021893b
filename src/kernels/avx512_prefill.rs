//! AVX-512 row kernels for several vectors at once (a prefill chunk).
//!
//! Decode multiplies each weight by one vector and is bound by memory; a prefill chunk
//! multiplies it by many and is bound by arithmetic, so here the weights are widened once and
//! reused. Rows are taken [`ROW_GROUP`] at a time and columns [`K_CHUNK`] at a time: that piece
//! of the matrix is widened into an f32 panel on the stack (36 KiB, which stays in a 48 KiB L1
//! beside four vectors' inputs) and serves a token group: up to [`TOKEN_GROUP`] vectors, or on
//! CPUs whose L3 is slow to re-read ([`super::TokenGroups::FitL2`]) fewer for wide inputs
//! ([`GROUP_INPUTS`]), the row groups walked inside each token group so that the group's
//! inputs stay in L2. A register tile of 6 rows × 4 vectors walks down the panel's
//! rows, ten 16-lane loads for every 24 fused multiply-adds (24 accumulators, 4 inputs and a
//! weight: 29 of the 32 registers). The accumulators live in a stack buffer between column
//! chunks (a store and a reload change no bits): a tile loads and stores them once per chunk,
//! the first chunk starts from zero, and in the last one the tile sums their lanes and writes
//! the results itself, from its registers.
//!
//! Why these sizes: widening a panel once for 128 vectors instead of 32 raised the GEMM from
//! 50–65 % to 65–75 % of the FMA peak on Zen 4 (BENCHMARKS, 2026-12-03, "the prefill GEMM
//! reordered"); on an Intel host with two FMA ports (BENCHMARKS, "2026-12-04 (late morning):
//! the prefill GEMM on an Intel host with two FMA ports") the 4 × 4 tile over 2,048-column
//! panels, which do not fit L1, reached 45 % of the peak and this tile over 512-column panels
//! about 55 % (before the inputs were aligned), a 1B prefill 24 % faster.
//!
//! Bit-identity with decode: each (row, vector) pair has one 16-lane accumulator and receives
//! one FMA per 16 columns in column order, from the same weight values in the same lane order
//! as the decode tiles of [`super::avx512`] — a quantized block's two vectors (A, B) scaled
//! exactly, Q4B32 and MXFP4 split by parity with their inputs permuted to match — and the
//! same final lane sum. So a result does not depend on how many vectors a call carries.
//!
//! Stack use: about 190 KiB per call ([`ROW_GROUP`] × [`TOKEN_GROUP`] accumulators, a panel,
//! and for Q4B32 and MXFP4 four vectors' permuted inputs). A thread that runs a model needs a
//! stack of a few hundred KiB beyond its own use (Rust's default for spawned threads is 2 MiB).

use super::avx512::{bf16_to_f32, decode_f8, decode_mx, decode_q4, decode_q8, tail_mask, x_by_parity};
use super::avx2::{hsum8x8, prefetch_l2};
use super::MatRef;
use crate::format::dtype::DType;
use std::arch::x86_64::*;

/// Rows widened into one panel.
pub const ROW_GROUP: usize = 18;
/// Most vectors a panel serves, whose accumulators are kept between column chunks.
pub const TOKEN_GROUP: usize = 128;
/// Columns per panel (a multiple of 32, so quantized blocks never straddle two panels).
pub const K_CHUNK: usize = 512;

const STEPS: usize = K_CHUNK / 16;
/// Bytes of inputs one token group may have under [`super::TokenGroups::FitL2`]: the group's
/// inputs are read again for every row group, so they should stay in L2 (half of a 2 MiB
/// one). Wider inputs get fewer vectors per group: the down projection of a 1B model (8,192
/// columns) 32 instead of 128, whose 4 MiB came from L3 for every 18 rows — on the Intel host
/// a C replica of the loop (`tools/bench/gemm_tile.c`) ran at 58 % of the FMA peak with 4 MiB
/// of inputs and 80 % with 1 MiB at the same stride (BENCHMARKS, 2026-12-04). The price is a
/// panel widened once per group instead of once per 128 vectors, which on AMD Zen 4 costs
/// more than its L3 reads save ([`super::TokenGroups::Whole`]).
const GROUP_INPUTS: usize = 1 << 20;
/// The register tile: rows × vectors, one 16-lane accumulator each ([`tile_any`]'s arms
/// cover every smaller tile).
const TILE_ROWS: usize = 6;
const TILE_TOKENS: usize = 4;

/// How the inputs of one column chunk are read: straight from `x` (row stride `cols`), or from a
/// buffer of parity-permuted inputs (Q4B32; stride [`K_CHUNK`]).
#[derive(Clone, Copy)]
struct Inputs {
    ptr: *const f32,
    stride: usize,
}

/// Rows `r0..r1` of `w` against `n` (≥ 2) vectors of `x`, into `y[t * ys + r]`, in token
/// groups of the whole chunk when `WHOLE`, else as [`GROUP_INPUTS`] bounds them.
///
/// # Safety
/// As [`super::scalar::RowsFn`]; the CPU has AVX-512 F/BW/VL with FMA and F16C; `w.dtype` is a
/// compute dtype.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn rows<const WHOLE: bool>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe { rows_with::<false, WHOLE>(w, r0, r1, x, n, y, ys) }
}

/// As [`rows`] (for any n ≥ 1) for a Q4B32 matrix whose inputs `x` are already split by
/// parity per 32-column block ([`split_by_parity`]), as [`super::Kernels`] does once per
/// product when it holds a buffer for them: permuting four vectors at a time here instead costs
/// about a fifth of the GEMM, since each permuted input serves only the panel's 16 rows.
///
/// # Safety
/// As [`rows`], and `w.dtype` is Q4B32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn rows_q4b32_split<const WHOLE: bool>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe { rows_with::<true, WHOLE>(w, r0, r1, x, n, y, ys) }
}

/// Writes the `n` vectors of `x` (`cols` each, a multiple of 32) into `out` split by parity
/// per 32-column block: the inputs of [`rows_q4b32_split`].
///
/// # Safety
/// The CPU has AVX-512 F; `x` and `out` hold at least `n × cols` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn split_by_parity(x: &[f32], n: usize, cols: usize, out: &mut [f32]) {
    // SAFETY: both hold n × cols values (the caller's contract).
    unsafe { split_blocks(x.as_ptr(), out.as_mut_ptr(), n * cols / 32) }
}

/// `blocks` consecutive 32-value blocks from `src` into `dst`, each split by parity (the
/// Q4B32 decode order).
///
/// # Safety
/// Both hold `blocks × 32` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn split_blocks(src: *const f32, dst: *mut f32, blocks: usize) {
    for b in 0..blocks {
        // SAFETY: block b lies inside both (the caller's contract).
        unsafe {
            let (e, o) = x_by_parity(src.add(b * 32));
            _mm512_storeu_ps(dst.add(b * 32), e);
            _mm512_storeu_ps(dst.add(b * 32 + 16), o);
        }
    }
}

/// [`rows`], with Q4B32 inputs already split by parity when `SPLIT`.
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn rows_with<const SPLIT: bool, const WHOLE: bool>(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    let cols = w.cols;
    let mut acc = Accumulators([[[_mm512_setzero_ps(); TILE_TOKENS]; ROW_GROUP]; TOKEN_GROUP / TILE_TOKENS]);
    let mut panel = Panel([0.0; ROW_GROUP * K_CHUNK]);
    let mut xbuf = Panel([0.0; TILE_TOKENS * K_CHUNK]);
    let group = if WHOLE { TOKEN_GROUP } else { group_tokens(cols) };
    let mut tg = 0;
    while tg < n {
        let toks = group.min(n - tg);
        let mut rg = r0;
        while rg < r1 {
            let rows = ROW_GROUP.min(r1 - rg);
            let mut c0 = 0;
            while c0 < cols {
                let kc = K_CHUNK.min(cols - c0);
                // SAFETY: rows rg..rg+rows and columns c0..c0+kc lie inside the matrix.
                let wpanel = unsafe { fill_panel(w, rg, rows, c0, kc, &mut panel.0) };
                let steps = kc.div_ceil(16);
                let mask = if kc.is_multiple_of(16) { 0xffff } else { tail_mask(kc % 16) };
                let mut tq = 0;
                while tq < toks {
                    let tn = TILE_TOKENS.min(toks - tq);
                    // SAFETY: vectors tg+tq..tg+tq+tn and columns c0..c0+kc lie inside x (the
                    // caller's contract).
                    let inputs = unsafe {
                        let at = x.as_ptr().add((tg + tq) * cols + c0);
                        if matches!(w.dtype, DType::Q4B32 | DType::MXFP4) && !SPLIT {
                            permute_inputs(at, cols, tn, kc, &mut xbuf.0)
                        } else {
                            Inputs { ptr: at, stride: cols }
                        }
                    };
                    let mut rq = 0;
                    while rq < rows {
                        let rn = TILE_ROWS.min(rows - rq);
                        let p = Inputs { ptr: wpanel.ptr.wrapping_add(rq * wpanel.stride), stride: wpanel.stride };
                        // SAFETY: the panel holds rows rq..rq+rn and the inputs vectors
                        // 0..tn, each `steps` 16-lane steps long (the last masked).
                        // In the last column chunk the tile writes its lane sums to `y`
                        // itself, from its registers, instead of storing its accumulators for a
                        // pass over them afterwards.
                        let sums = if c0 + kc >= cols {
                            Sums { ptr: y.wrapping_add((tg + tq) * ys + rg + rq), stride: ys }
                        } else {
                            Sums { ptr: std::ptr::null_mut(), stride: 0 }
                        };
                        unsafe { tile_any(rn, tn, p, inputs, steps, mask, &mut acc.0[tq / TILE_TOKENS], rq, c0 == 0, sums) };
                        rq += rn;
                    }
                    tq += tn;
                }
                c0 += kc;
            }
            rg += rows;
        }
        tg += toks;
    }
}

/// Vectors per token group for inputs `cols` wide: as many as fit [`GROUP_INPUTS`] bytes (a
/// multiple of four, 16 to [`TOKEN_GROUP`]).
fn group_tokens(cols: usize) -> usize {
    (GROUP_INPUTS / (cols.max(1) * 4) / 4 * 4).clamp(16, TOKEN_GROUP)
}

/// Where a tile of the last column chunk writes its lane sums: vector `t`'s row `i` at
/// `ptr + t × stride + i` (null in the other chunks).
#[derive(Clone, Copy)]
struct Sums {
    ptr: *mut f32,
    stride: usize,
}

/// Writes each of the tile's `T` vectors' `R` lane sums (`a[i][t]`, R ≤ 8) to `out`: the
/// halves added, then [`hsum8x8`], which adds exactly the pairs [`super::avx512::hsum`] adds (so the same
/// bits), in one shuffle tree and one masked store per vector.
///
/// # Safety
/// `out` is writable for vectors `0..T` × rows `0..R` at its stride.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)] // `t` picks a column of every row, and the vector's output
unsafe fn write_sums<const R: usize, const T: usize>(a: &[[__m512; T]; R], out: Sums) {
    let halves = |v: __m512| {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        _mm256_add_ps(_mm512_castps512_ps256(v), hi)
    };
    let rows = (1u8 << R).wrapping_sub(1);
    for t in 0..T {
        let eight: [__m256; 8] = std::array::from_fn(|i| if i < R { halves(a[i][t]) } else { _mm256_setzero_ps() });
        // SAFETY: rows 0..R of vector t are the caller's to write; the mask stores R lanes.
        unsafe { _mm256_mask_storeu_ps(out.ptr.add(t * out.stride), rows, hsum8x8(&eight)) };
    }
}

/// The accumulators of one row group and token group, 64-byte aligned, by tile column: the
/// [`TILE_TOKENS`] vectors' accumulators of a row side by side, the rows of a tile next, so
/// that a register tile's accumulators are 24 consecutive lines (one per L1 set) and do not
/// push the panel out of the few sets that rows a whole token group apart would share.
#[repr(C, align(64))]
struct Accumulators([[[__m512; TILE_TOKENS]; ROW_GROUP]; TOKEN_GROUP / TILE_TOKENS]);

/// The accumulators of one tile column: rows × [`TILE_TOKENS`] vectors.
type TileColumn = [[__m512; TILE_TOKENS]; ROW_GROUP];

/// A 64-byte-aligned f32 buffer on the stack.
#[repr(C, align(64))]
struct Panel<const N: usize>([f32; N]);

/// Widens rows `r..r+rows`, columns `c0..c0+kc` of `w` into `panel` (row stride [`K_CHUNK`],
/// lanes past `kc` zero) in the decode tiles' lane order; an F32 matrix is used in place.
///
/// # Safety
/// The rows and columns lie inside the matrix.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn fill_panel(w: &MatRef, r: usize, rows: usize, c0: usize, kc: usize, panel: &mut [f32; ROW_GROUP * K_CHUNK]) -> Inputs {
    let (cols, rb) = (w.cols, w.row_bytes());
    let base = w.data.as_ptr();
    let out = panel.as_mut_ptr();
    // The next chunk of the same rows is asked for now, so that it streams in while this
    // one is multiplied (the hardware prefetchers follow a few streams, not 32 rows').
    if let Some(span) = w.dtype.row_bytes(kc as u64).map(|b| b as usize) {
        let next = w.dtype.row_bytes((c0 + kc) as u64).unwrap_or(0) as usize;
        for i in 0..rows {
            let mut o = 0;
            while o < span {
                prefetch_l2(base.wrapping_add((r + i) * rb + next + o));
                o += 64;
            }
        }
    }
    // SAFETY (all loads and stores): row i < rows, column c < kc of the chunk lies inside the
    // matrix; the panel holds ROW_GROUP × K_CHUNK values and c < kc <= K_CHUNK; tail loads are
    // masked to kc.
    unsafe {
        match w.dtype {
            // F32 rows are copied too: a panel of rows a whole matrix row apart would map to
            // the same few L1 sets.
            DType::F32 | DType::BF16 | DType::F16 => {
                for i in 0..rows {
                    let dst = out.add(i * K_CHUNK);
                    let mut c = 0;
                    while c < kc {
                        let m = if kc - c >= 16 { 0xffff } else { tail_mask(kc - c) };
                        let at = (r + i) * cols + c0 + c;
                        let v = match w.dtype {
                            DType::F32 => _mm512_maskz_loadu_ps(m, (base as *const f32).add(at)),
                            DType::BF16 => bf16_to_f32(_mm256_maskz_loadu_epi16(m, (base as *const u16).add(at) as *const i16)),
                            _ => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (base as *const u16).add(at) as *const i16)),
                        };
                        _mm512_storeu_ps(dst.add(c), v);
                        c += 16;
                    }
                }
            }
            DType::Q8B32 | DType::Q4B32 | DType::F8B32 | DType::MXFP4 => {
                let bytes = w.dtype.block_bytes().unwrap_or(34);
                for i in 0..rows {
                    let row = base.add((r + i) * rb + c0 / 32 * bytes);
                    let dst = out.add(i * K_CHUNK);
                    for b in 0..kc / 32 {
                        let (a, bb) = match w.dtype {
                            DType::Q4B32 => decode_q4(row.add(b * bytes)),
                            DType::F8B32 => decode_f8(row.add(b * bytes)),
                            DType::MXFP4 => decode_mx(row.add(b * bytes)),
                            _ => decode_q8(row.add(b * bytes)),
                        };
                        _mm512_storeu_ps(dst.add(b * 32), a);
                        _mm512_storeu_ps(dst.add(b * 32 + 16), bb);
                    }
                }
            }
            _ => {}
        }
    }
    Inputs { ptr: out, stride: K_CHUNK }
}

/// Copies `toks` (at most 4) vectors' columns `0..kc` (from `x`, stride `cols`) into `buf`
/// split by parity per block, the Q4B32 decode order.
///
/// # Safety
/// `x` holds `toks` vectors of at least `kc` readable values at stride `cols`; kc is a multiple
/// of 32 and at most [`K_CHUNK`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn permute_inputs(x: *const f32, cols: usize, toks: usize, kc: usize, buf: &mut [f32; TILE_TOKENS * K_CHUNK]) -> Inputs {
    let out = buf.as_mut_ptr();
    for t in 0..toks.min(TILE_TOKENS) {
        // SAFETY: vector t's kc values lie inside x (the caller's contract) and its row of buf.
        unsafe { split_blocks(x.add(t * cols), out.add(t * K_CHUNK), kc / 32) };
    }
    Inputs { ptr: out, stride: K_CHUNK }
}

/// Runs the `rn × tn` tile (each 1..=4) for rows `rq..` of the group and the vectors of `acc`'s
/// tile column.
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_any(rn: usize, tn: usize, p: Inputs, x: Inputs, steps: usize, mask: __mmask16,
                   acc: &mut TileColumn, rq: usize, first: bool, sums: Sums) {
    macro_rules! arms {
        ($(($r:literal, $t:literal)),*) => {
            match (rn, tn) {
                // SAFETY: forwarded contract.
                $(($r, $t) => unsafe { tile::<$r, $t>(p, x, steps, mask, acc, rq, first, sums) },)*
                _ => {}
            }
        };
    }
    arms!((6, 4), (6, 3), (6, 2), (6, 1), (5, 4), (5, 3), (5, 2), (5, 1),
          (4, 4), (4, 3), (4, 2), (4, 1), (3, 4), (3, 3), (3, 2), (3, 1),
          (2, 4), (2, 3), (2, 2), (2, 1), (1, 4), (1, 3), (1, 2), (1, 1));
}

/// R rows of the panel × T input vectors over `steps` 16-lane steps (the last one masked by
/// `mask`), accumulating into `acc[rq + i][t]`, or, for the `first` column chunk, starting
/// from zero and overwriting them (the same bits as adding to zeroed accumulators, without
/// clearing and reloading them).
///
/// With `sums` (the last column chunk) the accumulators' lane sums go there instead of back
/// to `acc`.
///
/// # Safety
/// The panel holds R rows and the inputs T vectors of `steps` × 16 readable values (the last
/// step's lanes outside `mask` are not read); a non-null `sums` is writable for vectors
/// `0..T` × rows `0..R` at its stride.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const T: usize>(p: Inputs, x: Inputs, steps: usize, mask: __mmask16,
                                               acc: &mut TileColumn, rq: usize, first: bool, sums: Sums) {
    let mut a = [[_mm512_setzero_ps(); T]; R];
    if !first {
        for (i, row) in a.iter_mut().enumerate() {
            row.copy_from_slice(&acc[rq + i][..T]);
        }
    }
    let full = if mask == 0xffff { steps } else { steps - 1 };
    // SAFETY (all loads): step s < steps of row i < R / vector t < T is readable (the caller's
    // contract); the last, partial step is masked.
    for s in 0..full {
        let mut xv = [_mm512_setzero_ps(); T];
        for (t, v) in xv.iter_mut().enumerate() {
            *v = unsafe { _mm512_loadu_ps(x.ptr.add(t * x.stride + s * 16)) };
        }
        for (i, row) in a.iter_mut().enumerate() {
            let wv = unsafe { _mm512_loadu_ps(p.ptr.add(i * p.stride + s * 16)) };
            for (t, v) in row.iter_mut().enumerate() {
                *v = _mm512_fmadd_ps(wv, xv[t], *v);
            }
        }
    }
    if full < steps {
        let s = full;
        let mut xv = [_mm512_setzero_ps(); T];
        for (t, v) in xv.iter_mut().enumerate() {
            *v = unsafe { _mm512_maskz_loadu_ps(mask, x.ptr.add(t * x.stride + s * 16)) };
        }
        for (i, row) in a.iter_mut().enumerate() {
            let wv = unsafe { _mm512_maskz_loadu_ps(mask, p.ptr.add(i * p.stride + s * 16)) };
            for (t, v) in row.iter_mut().enumerate() {
                *v = _mm512_fmadd_ps(wv, xv[t], *v);
            }
        }
    }
    if sums.ptr.is_null() {
        for (i, row) in a.iter().enumerate() {
            acc[rq + i][..T].copy_from_slice(row);
        }
    } else {
        // SAFETY: the caller's contract (`sums` covers this tile's rows and vectors).
        unsafe { write_sums(&a, sums) };
    }
}

const _: () = assert!(K_CHUNK.is_multiple_of(32) && STEPS * 16 == K_CHUNK && TOKEN_GROUP.is_multiple_of(TILE_TOKENS));
