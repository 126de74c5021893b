//! The AVX2 GEMM: a prefill chunk's vectors against the rows of any compute dtype, with the
//! bits of the decode tiles of [`super::avx2`] (one 8-lane accumulator per (row, vector), one
//! fused multiply-add per 8 columns in column order, the same decoded weights, [`hsum8`]).
//!
//! Per participant (its rows `r0..r1`), for each group of up to [`TOKEN_GROUP`] vectors and
//! each span of [`SPAN`] rows, the columns are taken [`K_CHUNK`] at a time: the vector group's
//! inputs for the chunk are copied once for the whole span into a contiguous buffer
//! (zero-padded like the decode tiles' last step; vectors a multiple of 4 KiB apart in place
//! would evict each other from the caches), then each [`ROW_GROUP`] of the span has its
//! weights of the chunk decoded once into a panel of f32 (quantized blocks already multiplied
//! by their scale, exactly, as the decode tiles do; a dense row's last partial 8 columns
//! zero-padded), and register tiles of [`R`] rows × [`T`] vectors — twelve accumulators, the
//! three rows' weights and one input vector in the sixteen registers — take the panel's steps:
//! per step three panel loads, four input loads and twelve fused multiply-adds. The span's
//! accumulators wait in a stack buffer between chunks, which changes no bit. While a panel is
//! multiplied, the next panel's weights are prefetched into L2.
//!
//! The two threads of a product split its rows (the pool's chunks) and never wait for each
//! other inside it. Stack use: 24 KiB of panel, 64 KiB of packed inputs and 192 KiB of
//! accumulators per call, 280 KiB, within the [`super::pool::THREAD_BYTES`] the memory plan
//! counts per thread.

use super::avx2::{decode_f8, decode_mx, decode_q4, decode_q8, hsum8, load_bf16, load_f16, prefetch_l2, x_q4};
use super::MatRef;
use crate::format::dtype::DType;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Rows decoded into one panel (a multiple of [`R`]).
pub const ROW_GROUP: usize = 24;
/// Row groups whose accumulators are kept together, so one packing of a chunk's inputs serves
/// all of their rows.
pub const SPAN_GROUPS: usize = 4;
/// Rows of a span: the rows that share the packed inputs of every chunk.
pub const SPAN: usize = ROW_GROUP * SPAN_GROUPS;
/// Vectors whose tiles share one decoding of the weights. 64 rather than 32 halves the
/// panels' decoding, the inputs' packing and the prefetch walk per multiply-add: 512-token
/// prefill of the 1B shape with these kernels +1.5 % (Q4B32) and +7 % (Q8B32), for 128 KiB
/// more stack (docs/BENCHMARKS.md, 2026-12-05 afternoon).
pub const TOKEN_GROUP: usize = 64;
/// Columns per panel (a multiple of 32: whole blocks). A panel (24 KiB) and one tile's
/// vectors (4 KiB) stay in the 32 KiB L1 while the tiles sweep the panel's rows.
pub const K_CHUNK: usize = 256;
/// Rows of a register tile.
pub const R: usize = 3;
/// Vectors of a register tile.
pub const T: usize = 4;

const _: () = assert!(ROW_GROUP.is_multiple_of(R) && K_CHUNK.is_multiple_of(32));

/// Decoded f32 weights of a row group for one column chunk.
#[repr(C, align(32))]
struct Panel([[f32; K_CHUNK]; ROW_GROUP]);

/// A vector group's inputs for one column chunk, copied contiguously: in place, vectors a
/// power-of-two multiple of 4 KiB apart (every model width) would share the same few L1 and
/// L2 sets and evict each other.
#[repr(C, align(32))]
struct Packed([[f32; K_CHUNK]; TOKEN_GROUP]);

/// The accumulators of a span × vector group.
type Acc = [[__m256; TOKEN_GROUP]; SPAN];

/// A chunk's packed inputs and its 8-column steps (a last partial one zero-padded).
#[derive(Clone, Copy)]
struct Inputs {
    x: *const Packed,
    steps: usize,
}

/// Rows `r0..r1` of `w` against the `n` vectors of `x` (n ≥ 1).
///
/// For each vector group and each span of rows, the columns are taken a chunk at a time: the
/// chunk's inputs are packed once for the span, then each row group of the span has its
/// weights decoded into the panel and multiplied by every tile. The accumulators of the whole
/// span wait in a stack buffer between chunks (which changes no bit); the first chunk's tiles
/// start from zero and the last one's write the sums ([`Chunk`]).
///
/// # Safety
/// As [`super::RowsFn`]; the CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
    let cols = w.cols;
    let mut panel = MaybeUninit::<Panel>::uninit();
    let mut packed = MaybeUninit::<Packed>::uninit();
    let mut acc = MaybeUninit::<Acc>::uninit();
    let (panel, packed, acc) = (panel.as_mut_ptr(), packed.as_mut_ptr(), acc.as_mut_ptr());
    let mut t0 = 0;
    while t0 < n {
        let tn = TOKEN_GROUP.min(n - t0);
        let mut sg = r0;
        while sg < r1 {
            let sn = SPAN.min(r1 - sg);
            if cols == 0 {
                // No chunk to run: every sum is the empty one.
                for t in 0..tn {
                    for i in 0..sn {
                        // SAFETY: element (t0 + t, sg + i) is the caller's to write.
                        unsafe { *y.add((t0 + t) * ys + sg + i) = 0.0 };
                    }
                }
            }
            let mut c0 = 0;
            while c0 < cols {
                let kn = K_CHUNK.min(cols - c0);
                // SAFETY: vectors t0..t0 + tn hold `cols` values (the contract).
                unsafe { pack(x.as_ptr().add(t0 * cols + c0), cols, tn, kn, w.dtype == DType::Q4B32, packed) };
                let xs = Inputs { x: packed, steps: kn.div_ceil(8) };
                let mut rg = 0;
                while rg < sn {
                    let rn = ROW_GROUP.min(sn - rg);
                    // SAFETY: rows sg + rg .. + rn and columns c0..c0 + kn lie inside the matrix.
                    unsafe { decode_panel(w, sg + rg, rn, c0, kn, panel) };
                    // The weights the next panel decodes (the span's next row group, else its
                    // first one in the next chunk, else the next span's first), asked for a
                    // few lines per tile while this one is multiplied: spread out, the
                    // requests stay within what the core keeps in flight.
                    let mut ahead = if rg + rn < sn {
                        Ahead::new(w, sg + rg + rn, ROW_GROUP.min(sn - rg - rn), c0)
                    } else if c0 + kn < cols {
                        Ahead::new(w, sg, ROW_GROUP.min(sn), c0 + kn)
                    } else {
                        Ahead::new(w, sg + sn, ROW_GROUP.min(r1 - sg - sn), 0)
                    };
                    let per_tile = ahead.lines().div_ceil(rn.div_ceil(R) * tn.div_ceil(T)).max(1);
                    let mut ti = 0;
                    while ti < tn {
                        let tt = T.min(tn - ti);
                        let mut ri = 0;
                        while ri < rn {
                            ahead.issue(per_tile);
                            let rr = R.min(rn - ri);
                            // The first chunk starts from zero; the last one writes the sums.
                            let chunk = Chunk {
                                first: c0 == 0,
                                sums: if c0 + kn >= cols { y.wrapping_add((t0 + ti) * ys + sg + rg + ri) } else { std::ptr::null_mut() },
                                ys,
                            };
                            // SAFETY: the panel holds rows ri..ri + rr, the inputs vectors
                            // ti .. ti + tt, the accumulators span rows rg + ri .. + rr; the
                            // sums' elements are the caller's to write.
                            unsafe { tile_any(rr, tt, panel, xs, ri, rg + ri, ti, acc, chunk) };
                            ri += rr;
                        }
                        ti += tt;
                    }
                    rg += rn;
                }
                c0 += kn;
            }
            sg += sn;
        }
        t0 += tn;
    }
}

/// Decodes columns `c0 .. c0 + kn` of rows `rg .. rg + rn` into the panel (a partial last 8
/// zero-padded).
///
/// # Safety
/// The rows and columns lie inside the matrix (c0 and, for quantized dtypes, kn multiples of
/// 32); `panel` is writable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_panel(w: &MatRef, rg: usize, rn: usize, c0: usize, kn: usize, panel: *mut Panel) {
    let rb = w.row_bytes();
    let base = w.data.as_ptr();
    for i in 0..rn {
        let row = base.wrapping_add((rg + i) * rb);
        // SAFETY (all loads and stores): columns c0..c0 + kn of row rg + i lie inside the
        // matrix; the panel row holds K_CHUNK ≥ kn rounded up to 8 values.
        unsafe {
            let dst = (*panel).0[i].as_mut_ptr();
            match w.dtype {
                DType::Q8B32 | DType::Q4B32 | DType::F8B32 | DType::MXFP4 => {
                    let bytes = w.dtype.block_bytes().unwrap_or(34);
                    let src = row.add(c0 / 32 * bytes);
                    for b in 0..kn / 32 {
                        let q = match w.dtype {
                            DType::Q4B32 => decode_q4(src.add(b * bytes)),
                            DType::F8B32 => decode_f8(src.add(b * bytes)),
                            DType::MXFP4 => decode_mx(src.add(b * bytes)),
                            _ => decode_q8(src.add(b * bytes)),
                        };
                        for (k, v) in q.iter().enumerate() {
                            _mm256_store_ps(dst.add(b * 32 + 8 * k), *v);
                        }
                    }
                }
                _ => {
                    let full = kn / 8 * 8;
                    let mut c = 0;
                    while c < full {
                        _mm256_store_ps(dst.add(c), load_dense(w.dtype, row, c0 + c));
                        c += 8;
                    }
                    if c < kn {
                        // The decode tiles' padding: the stored values, then zeros.
                        let size = if w.dtype == DType::F32 { 4 } else { 2 };
                        let mut pad = [0u8; 32];
                        std::ptr::copy_nonoverlapping(row.add((c0 + c) * size), pad.as_mut_ptr(), (kn - c) * size);
                        _mm256_store_ps(dst.add(c), load_dense(w.dtype, pad.as_ptr(), 0));
                    }
                }
            }
        }
    }
}

/// A walk over the bytes of the next panel's weights, prefetching them into L2 a few cache
/// lines at a time (prefetches never fault: the walk may run past the matrix harmlessly, but it
/// stays inside it).
struct Ahead {
    base: *const u8,
    rb: usize,
    rows: usize,
    span: usize,
    row: usize,
    off: usize,
}

impl Ahead {
    /// Rows `r .. r + rows`, columns `c0 .. c0 + K_CHUNK` (or the rest of the row).
    fn new(w: &MatRef, r: usize, rows: usize, c0: usize) -> Ahead {
        let kn = K_CHUNK.min(w.cols.saturating_sub(c0));
        let at = w.dtype.row_bytes(c0 as u64).unwrap_or(0) as usize;
        let span = w.dtype.row_bytes(kn as u64).unwrap_or(0) as usize;
        Ahead { base: w.data.as_ptr().wrapping_add(r * w.row_bytes() + at), rb: w.row_bytes(), rows, span, row: 0, off: 0 }
    }

    /// Cache lines the walk covers.
    fn lines(&self) -> usize {
        self.rows * self.span.div_ceil(64)
    }

    /// Prefetches the next `n` lines of the walk.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn issue(&mut self, n: usize) {
        for _ in 0..n {
            if self.row >= self.rows {
                return;
            }
            prefetch_l2(self.base.wrapping_add(self.row * self.rb + self.off));
            self.off += 64;
            if self.off >= self.span {
                self.off = 0;
                self.row += 1;
            }
        }
    }
}

/// Copies `kn` columns of `tn` vectors (`stride` apart, from `x`) into `out`, zero-padding
/// the last partial 8 (the decode tiles' padding of the inputs); for Q4B32 (`q4`, kn a
/// multiple of 32) each block's columns in the order of [`decode_q4`].
///
/// # Safety
/// The vectors hold `kn` readable values each; `out` is writable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack(x: *const f32, stride: usize, tn: usize, kn: usize, q4: bool, out: *mut Packed) {
    let full = kn / 8 * 8;
    for t in 0..tn {
        // SAFETY: the caller's contract; the packed row holds K_CHUNK ≥ kn rounded up to 8.
        unsafe {
            let (src, dst) = (x.add(t * stride), (*out).0[t].as_mut_ptr());
            if q4 {
                for b in 0..kn / 32 {
                    for (k, v) in x_q4(src.add(32 * b)).iter().enumerate() {
                        _mm256_store_ps(dst.add(32 * b + 8 * k), *v);
                    }
                }
                continue;
            }
            let mut c = 0;
            while c < full {
                _mm256_store_ps(dst.add(c), _mm256_loadu_ps(src.add(c)));
                c += 8;
            }
            if c < kn {
                let mut pad = [0f32; 8];
                std::ptr::copy_nonoverlapping(src.add(c), pad.as_mut_ptr(), kn - c);
                _mm256_store_ps(dst.add(c), _mm256_loadu_ps(pad.as_ptr()));
            }
        }
    }
}

/// 8 dense weights of `row` from column `c`, widened.
///
/// # Safety
/// 8 values from column c lie inside the row.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_dense(dtype: DType, row: *const u8, c: usize) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        match dtype {
            DType::F32 => _mm256_loadu_ps((row as *const f32).add(c)),
            DType::BF16 => load_bf16((row as *const u16).add(c)),
            _ => load_f16((row as *const u16).add(c)),
        }
    }
}

/// Runs the `rr × tt` tile (1..=R rows, 1..=T vectors).
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_any(rr: usize, tt: usize, panel: *const Panel, xs: Inputs, ri: usize, ai: usize, ti: usize, acc: *mut Acc,
                   chunk: Chunk) {
    macro_rules! arms {
        ($(($r:literal, $t:literal)),*) => {
            match (rr, tt) {
                // SAFETY: forwarded contract.
                $(($r, $t) => unsafe { tile::<$r, $t>(panel, xs, ri, ai, ti, acc, chunk) },)*
                _ => unreachable!("tile {rr} x {tt}"),
            }
        };
    }
    arms!((3, 4), (3, 3), (3, 2), (3, 1), (2, 4), (2, 3), (2, 2), (2, 1), (1, 4), (1, 3), (1, 2), (1, 1));
}

/// Where a tile's chunk sits among the columns: the first starts its accumulators from zero
/// (the same bits as adding to zeroed ones, without clearing and loading them); the last
/// (`sums` not null) writes vector `t`'s row `i` sum to `sums + t × ys + i` from its registers
/// instead of storing the accumulators for a pass over them afterwards.
#[derive(Clone, Copy)]
struct Chunk {
    first: bool,
    sums: *mut f32,
    ys: usize,
}

/// `RR` panel rows from `ri` × `TT` vectors from `ti` over the chunk, accumulating into
/// `acc[ai + i][ti + t]` (or from zero, and into the sums, as `chunk` says).
///
/// # Safety
/// The panel holds the rows and the packed inputs the vectors for `xs.steps` steps; a non-null
/// `chunk.sums` is writable for vectors `0..TT` × rows `0..RR` at its stride.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const RR: usize, const TT: usize>(panel: *const Panel, xs: Inputs, ri: usize, ai: usize, ti: usize, acc: *mut Acc,
                                                 chunk: Chunk) {
    // SAFETY (all accesses): rows ri..ri + RR of the panel, ai..ai + RR of the accumulators, vectors
    // ti..ti + TT, steps within the chunk (the contract). The accumulators are read only after
    // the first chunk's tile wrote them (every chunk's tiles cover the whole span and group).
    unsafe {
        let mut a = [[_mm256_setzero_ps(); TT]; RR];
        if !chunk.first {
            for (i, row) in a.iter_mut().enumerate() {
                for (t, v) in row.iter_mut().enumerate() {
                    *v = (*acc)[ai + i][ti + t];
                }
            }
        }
        let p = (*panel).0.as_ptr().add(ri) as *const f32;
        let x = (*xs.x).0.as_ptr().add(ti) as *const f32;
        for s in 0..xs.steps {
            let w: [__m256; RR] = std::array::from_fn(|i| _mm256_load_ps(p.add(i * K_CHUNK + 8 * s)));
            for t in 0..TT {
                let xv = _mm256_load_ps(x.add(t * K_CHUNK + 8 * s));
                for (ai, wi) in a.iter_mut().zip(&w) {
                    ai[t] = _mm256_fmadd_ps(*wi, xv, ai[t]);
                }
            }
        }
        if chunk.sums.is_null() {
            for (i, row) in a.iter().enumerate() {
                for (t, v) in row.iter().enumerate() {
                    (*acc)[ai + i][ti + t] = *v;
                }
            }
        } else {
            // Vector by vector, so the stores run along an output row.
            for t in 0..TT {
                for (i, row) in a.iter().enumerate() {
                    *chunk.sums.add(t * chunk.ys + i) = hsum8(row[t]);
                }
            }
        }
    }
}
