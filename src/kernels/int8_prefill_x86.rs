//! AVX-512 VNNI kernels of the int8 path for several vectors at once (a prefill chunk).
//!
//! The decode tiles of [`super::int8_x86`] prepare a block pair's activations (their byte
//! order, the offset correction, the scales) for every tile of rows, which is cheap when one
//! vector serves eight rows and dominant when four vectors serve two. Here the activations of
//! a group of vectors are prepared once per [`ROW_GROUP`] rows and [`K_CHUNK`] columns into a
//! stack buffer, and a register tile of up to 4 rows × 4 vectors decodes each weight block
//! pair once for its four vectors: per (row, vector, block pair) one `vpdpbusd`, one
//! conversion, one scale product and one fused multiply-add, the operations of the decode
//! tile in the same order, so results equal the decode kernels' (and the scalar twin's) bit
//! for bit. Accumulators wait in a stack buffer between column chunks (no bit changes).
//!
//! Stack use: about 64 KiB per call.

use super::avx2::{hsum8, prefetch_l2};
use super::int8::Acts;
use super::int8_x86::{q4_order, scale_pair, w_pair_q4, w_pair_q8, x_pair, XPair};
use super::MatRef;
use std::arch::x86_64::*;

/// Rows whose block pairs share one preparation of the activations.
pub const ROW_GROUP: usize = 16;
/// Vectors prepared together.
pub const TOKEN_GROUP: usize = 16;
/// Columns per chunk (a multiple of 64: whole block pairs).
pub const K_CHUNK: usize = 1024;

const PAIRS: usize = K_CHUNK / 64;

/// The weight format: block bytes, the pair decoder, the activation byte order and offset.
#[derive(Clone, Copy)]
struct Format {
    bytes: usize,
    q4: bool,
}

/// Rows `r0..r1` of the Q8B32 matrix `w` against `n` quantized vectors.
///
/// # Safety
/// As [`super::int8::Int8RowsFn`]; the CPU has AVX-512 F/BW/VL, VNNI and VBMI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn rows_q8(w: &MatRef, r0: usize, r1: usize, x: &Acts, n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe { rows(Format { bytes: 34, q4: false }, w, r0, r1, x, n, y, ys) }
}

/// Rows `r0..r1` of the Q4B32 matrix `w` against `n` quantized vectors.
///
/// # Safety
/// As [`rows_q8`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn rows_q4(w: &MatRef, r0: usize, r1: usize, x: &Acts, n: usize, y: *mut f32, ys: usize) {
    // SAFETY: forwarded contract.
    unsafe { rows(Format { bytes: 18, q4: true }, w, r0, r1, x, n, y, ys) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows(f: Format, w: &MatRef, r0: usize, r1: usize, x: &Acts, n: usize, y: *mut f32, ys: usize) {
    let blocks = w.row_bytes() / f.bytes;
    let per = x.cols / 32;
    let zero = XPair { q: _mm512_setzero_si512(), off: _mm512_setzero_si512(), d: _mm512_setzero_ps() };
    let mut acc = [[_mm512_setzero_ps(); TOKEN_GROUP]; ROW_GROUP];
    let mut xs = [[zero; PAIRS]; TOKEN_GROUP];
    let order = if f.q4 { Some(q4_order()) } else { None };
    let offset = if f.q4 { 8 } else { -128 };
    let mut rg = r0;
    while rg < r1 {
        let rows = ROW_GROUP.min(r1 - rg);
        let mut tg = 0;
        while tg < n {
            let toks = TOKEN_GROUP.min(n - tg);
            for row in acc.iter_mut().take(rows) {
                row[..toks].fill(_mm512_setzero_ps());
            }
            let mut b0 = 0;
            while b0 < blocks {
                let nb = (K_CHUNK / 32).min(blocks - b0);
                let pairs = nb.div_ceil(2);
                for (t, xt) in xs.iter_mut().enumerate().take(toks) {
                    for (p, xp) in xt.iter_mut().enumerate().take(pairs) {
                        let b = b0 + 2 * p;
                        let at = (tg + t) * per + b;
                        // SAFETY: vector tg + t has `per` blocks, b (and b + 1 when both).
                        *xp = unsafe { x_pair(x.q.as_ptr().add(at * 32), x.d.as_ptr().add(at), b + 1 < blocks, order, offset) };
                    }
                }
                let mut tq = 0;
                while tq < toks {
                    let tn = 4.min(toks - tq);
                    let mut rq = 0;
                    while rq < rows {
                        let rn = 4.min(rows - rq);
                        let at = Tile { r: rg + rq, rq, tq, b0, pairs, blocks };
                        // SAFETY: rows rg + rq .. + rn and blocks b0..b0 + nb lie inside the
                        // matrix; xs holds vectors tq..tq + tn for `pairs` pairs.
                        unsafe { tile_any(rn, tn, f, w, &xs, at, &mut acc) };
                        rq += rn;
                    }
                    tq += tn;
                }
                b0 += nb;
            }
            // Vector by vector: the stores run along an output row (see avx2_gemm).
            for t in 0..toks {
                for (i, row) in acc.iter().enumerate().take(rows) {
                    let v = &row[t];
                    let lo = _mm512_castps512_ps256(*v);
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*v)));
                    // SAFETY: element (tg + t, rg + i) is the caller's to write.
                    unsafe { *y.add((tg + t) * ys + rg + i) = hsum8(_mm256_add_ps(lo, hi)) };
                }
            }
            tg += toks;
        }
        rg += rows;
    }
}

/// Where a tile sits: its first matrix row, its row and vector offsets in the groups, and its
/// column chunk (first block, pairs, and the row's block count).
#[derive(Clone, Copy)]
struct Tile {
    r: usize,
    rq: usize,
    tq: usize,
    b0: usize,
    pairs: usize,
    blocks: usize,
}

/// Runs the `rn × tn` tile (each 1..=4).
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn tile_any(rn: usize, tn: usize, f: Format, w: &MatRef, xs: &[[XPair; PAIRS]; TOKEN_GROUP], at: Tile,
                   acc: &mut [[__m512; TOKEN_GROUP]; ROW_GROUP]) {
    macro_rules! arms {
        ($(($r:literal, $t:literal)),*) => {
            match (rn, tn) {
                // SAFETY: forwarded contract.
                $(($r, $t) => unsafe { tile::<$r, $t>(f, w, xs, at, acc) },)*
                _ => {}
            }
        };
    }
    arms!((4, 4), (4, 3), (4, 2), (4, 1), (3, 4), (3, 3), (3, 2), (3, 1),
          (2, 4), (2, 3), (2, 2), (2, 1), (1, 4), (1, 3), (1, 2), (1, 1));
}

/// R rows × T vectors over the chunk's block pairs, accumulating into `acc[rq + i][tq + t]`.
///
/// # Safety
/// Rows `at.r .. at.r + R` and the chunk's blocks lie inside the matrix; `xs` holds the
/// prepared pairs of vectors `at.tq .. at.tq + T`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[inline]
unsafe fn tile<const R: usize, const T: usize>(f: Format, w: &MatRef, xs: &[[XPair; PAIRS]; TOKEN_GROUP], at: Tile,
                                               acc: &mut [[__m512; TOKEN_GROUP]; ROW_GROUP]) {
    let rb = w.row_bytes();
    let wp = w.data.as_ptr();
    let mut a = [[_mm512_setzero_ps(); T]; R];
    for (i, row) in a.iter_mut().enumerate() {
        row.copy_from_slice(&acc[at.rq + i][at.tq..at.tq + T]);
    }
    // `p` picks both the blocks and each vector's pair in `xs`.
    #[allow(clippy::needless_range_loop)]
    for p in 0..at.pairs {
        let b = at.b0 + 2 * p;
        let both = b + 1 < at.blocks;
        for (i, row) in a.iter_mut().enumerate() {
            // SAFETY: blocks b (and b + 1) of row at.r + i lie inside the matrix.
            let blk = unsafe { wp.add((at.r + i) * rb + b * f.bytes) };
            if p == 0 {
                // The next chunk of this row, while this one is multiplied.
                prefetch_l2(blk.wrapping_add(K_CHUNK / 32 * f.bytes));
            }
            // SAFETY: as above.
            let (wv, ws) = unsafe { (if f.q4 { w_pair_q4(blk, both) } else { w_pair_q8(blk, both) }, scale_pair(blk, f.bytes, both)) };
            for (t, v) in row.iter_mut().enumerate() {
                let xv = &xs[at.tq + t][p];
                let prod = _mm512_dpbusd_epi32(xv.off, wv, xv.q);
                *v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prod), _mm512_mul_ps(ws, xv.d), *v);
            }
        }
    }
    for (i, row) in a.iter().enumerate() {
        acc[at.rq + i][at.tq..at.tq + T].copy_from_slice(row);
    }
}

const _: () = assert!(K_CHUNK.is_multiple_of(64));
