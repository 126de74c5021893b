//! AVX-512 attention kernels: one query head's scores against a run of cached keys, and the
//! weighted sum of the cached values, 16 lanes wide. Their scalar twins are
//! `scalar::scores_unsafe` and `scalar::mix_unsafe` (compared in `tests/kernels.rs`).
//!
//! A score is [`super::avx512::dot`]'s value to the bit — one 16-lane accumulator in column
//! order, a masked last step, the halves added and then `hsum8`'s tree — with eight keys taken
//! at once as in [`super::avx2_attention`]: the query's 16 columns loaded once for the eight,
//! eight independent accumulators, and the eight lane sums out of [`hsum8x8`], which adds
//! exactly `hsum8`'s pairs. A weighted sum is [`super::avx2_attention::mix`]'s to the bit: each
//! column is its own chain of fused multiply-adds in key order from zero, whatever the width
//! that carries it. Twice the columns per instruction as the AVX2 kernels they replace on
//! AVX-512 hosts (BENCHMARKS, 2026-12-04 afternoon).

use super::avx2::hsum8x8;
use super::avx2_attention::{mix_by_heads, scores_by_tiles};
use super::avx512::{dot, tail_mask};
use std::arch::x86_64::*;

/// Keys scored at once.
const KEYS: usize = 8;

/// `out[i] = (q · key_i) × scale`, key `i` at `keys[i × stride..]` (see the module comment).
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, FMA and F16C; `keys` holds `out.len()` keys of `q.len()`
/// values, `stride` apart.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn scores(q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    let (hd, n) = (q.len(), out.len());
    let full = hd / 16 * 16;
    let tail = tail_mask(hd - full);
    let (qp, kp) = (q.as_ptr(), keys.as_ptr());
    let mut i = 0;
    while i + KEYS <= n {
        let mut acc = [_mm512_setzero_ps(); KEYS];
        let mut c = 0;
        while c < full {
            // SAFETY: c + 16 <= hd, and key i + j holds hd values (the contract).
            let qv = unsafe { _mm512_loadu_ps(qp.add(c)) };
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qv, unsafe { _mm512_loadu_ps(kp.add((i + j) * stride + c)) }, *a);
            }
            c += 16;
        }
        if full < hd {
            // SAFETY: the masked loads read columns full..hd only, which q and each key hold.
            let qv = unsafe { _mm512_maskz_loadu_ps(tail, qp.add(full)) };
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qv, unsafe { _mm512_maskz_loadu_ps(tail, kp.add((i + j) * stride + full)) }, *a);
            }
        }
        // The halves added, as `avx512::hsum` does before its `hsum8`.
        let halves: [__m256; KEYS] = std::array::from_fn(|j| {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[j])));
            _mm256_add_ps(_mm512_castps512_ps256(acc[j]), hi)
        });
        // SAFETY: i + 8 <= out.len().
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(hsum8x8(&halves), _mm256_set1_ps(scale))) };
        i += KEYS;
    }
    for (j, o) in out.iter_mut().enumerate().skip(i) {
        // SAFETY: the CPU has AVX-512 (the contract); key j lies in `keys`.
        *o = unsafe { dot(q, &keys[j * stride..j * stride + hd]) } * scale;
    }
}

/// `out[d] = Σᵢ w[i] × value_i[d]`, value `i` at `values[i × stride..]`: per 16 columns one
/// accumulator taking one fused multiply-add per key, in key order from zero; up to 64
/// columns at once, each key's weight broadcast once for them; the last columns (fewer than
/// 16) through a masked accumulator, in the same order.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, FMA and F16C; `values` holds `w.len()` values of
/// `out.len()` floats, `stride` apart.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn mix(w: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
    let hd = out.len();
    let mut d = 0;
    // SAFETY (all): columns d .. d + 16W lie in 0..hd (the contract covers them).
    while hd - d >= 64 {
        unsafe { mix_columns::<4>(w, values, stride, d, u16::MAX, out) };
        d += 64;
    }
    for width in [2, 1] {
        if hd - d >= 16 * width {
            match width {
                2 => unsafe { mix_columns::<2>(w, values, stride, d, u16::MAX, out) },
                _ => unsafe { mix_columns::<1>(w, values, stride, d, u16::MAX, out) },
            }
            d += 16 * width;
        }
    }
    if d < hd {
        unsafe { mix_columns::<1>(w, values, stride, d, tail_mask(hd - d), out) };
    }
}

/// [`mix`]'s columns `d .. d + 16W`, W accumulators held in registers; `last` masks the last
/// accumulator's columns (all 16 but at the end of the row).
///
/// # Safety
/// As [`mix`], and the columns `last` selects in `d .. d + 16W` lie within `out.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn mix_columns<const W: usize>(w: &[f32], values: &[f32], stride: usize, d: usize, last: __mmask16, out: &mut [f32]) {
    let vp = values.as_ptr();
    let mask = |k: usize| if k + 1 == W { last } else { u16::MAX };
    let mut acc = [_mm512_setzero_ps(); W];
    for (i, &wi) in w.iter().enumerate() {
        let wv = _mm512_set1_ps(wi);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: value i holds the selected columns (the contract); the rest are not read.
            *a = _mm512_fmadd_ps(wv, unsafe { _mm512_maskz_loadu_ps(mask(k), vp.add(i * stride + d + 16 * k)) }, *a);
        }
    }
    for (k, a) in acc.iter().enumerate() {
        // SAFETY: as above, for out.
        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(d + 16 * k), mask(k), *a) };
    }
}

/// [`scores`] for `q.len() / hd` query heads that share their keys (a grouped-query attention
/// group; `q` holds the heads one after another, `out` a row of `out.len() / heads` scores per
/// head): four heads at a time over four keys, or two over eight, so that each key is loaded
/// once for the heads of a tile instead of once per head. Every score has [`scores`]'s bits
/// (each is one 16-lane chain over the columns, reduced by the same tree).
///
/// # Safety
/// As [`scores`] for each head; `q.len()` is a multiple of `hd > 0` and `out.len()` of the
/// head count.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn scores_group(q: &[f32], hd: usize, keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    // SAFETY (all three): each call gets heads of q and out and the keys (the contract).
    scores_by_tiles(q, hd, keys, stride, out,
        |q, out, n| unsafe { scores_tile::<4, 4>(q, hd, keys, stride, scale, out, n) },
        |q, out, n| unsafe { scores_tile::<2, 8>(q, hd, keys, stride, scale, out, n) },
        |q, keys, row| unsafe { scores(q, keys, stride, scale, row) });
}

/// Scores of `G` heads (rows of `n` in `out`) against keys `K` at a time, while `K` remain;
/// returns how many keys it scored. `G × K` = 16 accumulators.
///
/// # Safety
/// As [`scores_group`], for G heads from `q` and `out`.
// `j` indexes a key and, in every head's row, its accumulator.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn scores_tile<const G: usize, const K: usize>(q: &[f32], hd: usize, keys: &[f32], stride: usize, scale: f32, out: &mut [f32], n: usize) -> usize {
    let full = hd / 16 * 16;
    let tail = tail_mask(hd - full);
    let (qp, kp) = (q.as_ptr(), keys.as_ptr());
    let mut i = 0;
    while i + K <= n {
        let mut acc = [[_mm512_setzero_ps(); K]; G];
        let mut c = 0;
        while c <= hd {
            // Whole steps of 16 columns, then the masked last one (if any) as `dot` takes it.
            let m = if c < full { u16::MAX } else if full < hd { tail } else { break };
            // SAFETY: the selected columns lie in each head's query and each key (contract).
            let qs: [__m512; G] = std::array::from_fn(|g| unsafe { _mm512_maskz_loadu_ps(m, qp.add(g * hd + c)) });
            for j in 0..K {
                let kv = unsafe { _mm512_maskz_loadu_ps(m, kp.add((i + j) * stride + c)) };
                for g in 0..G {
                    acc[g][j] = _mm512_fmadd_ps(qs[g], kv, acc[g][j]);
                }
            }
            c += 16;
        }
        // Eight chains at a time through `hsum8x8`, halves first as `avx512::hsum` adds them;
        // chain (g, j) is entry g·K + j.
        for part in 0..G * K / 8 {
            let halves: [__m256; 8] = std::array::from_fn(|l| {
                let a = acc[(part * 8 + l) / K][(part * 8 + l) % K];
                _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))))
            });
            let mut sums = [0f32; 8];
            // SAFETY: 8 floats.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), _mm256_mul_ps(hsum8x8(&halves), _mm256_set1_ps(scale))) };
            for (l, s) in sums.into_iter().enumerate() {
                let (g, j) = ((part * 8 + l) / K, (part * 8 + l) % K);
                out[g * n + i + j] = s;
            }
        }
        i += K;
    }
    i
}

/// [`mix`] for `out.len() / hd` heads that share their values (`w` holds a row of weights per
/// head, `out` the heads' sums one after another): up to four heads at a time, each value's
/// columns loaded once for them. Every column of every head has [`mix`]'s bits (its own chain
/// in key order from zero).
///
/// # Safety
/// As [`mix`] for each head; `out.len()` is a multiple of `hd > 0` and `w.len()` of the head
/// count.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn mix_group(w: &[f32], values: &[f32], stride: usize, out: &mut [f32], hd: usize) {
    mix_by_heads(w, out, hd, |wh, oh, took, n| {
        let mut d = 0;
        // SAFETY (all): the columns each call selects lie in 0..hd, which `out` holds for
        // the `took` heads and every value holds (the contract).
        while hd - d >= 64 {
            unsafe {
                match took {
                    4 => mix_heads::<4, 4>(wh, n, values, stride, d, u16::MAX, oh, hd),
                    3 => mix_heads::<3, 4>(wh, n, values, stride, d, u16::MAX, oh, hd),
                    2 => mix_heads::<2, 4>(wh, n, values, stride, d, u16::MAX, oh, hd),
                    _ => mix_heads::<1, 4>(wh, n, values, stride, d, u16::MAX, oh, hd),
                }
            }
            d += 64;
        }
        while d < hd {
            let last = if hd - d >= 16 { u16::MAX } else { tail_mask(hd - d) };
            unsafe {
                match took {
                    4 => mix_heads::<4, 1>(wh, n, values, stride, d, last, oh, hd),
                    3 => mix_heads::<3, 1>(wh, n, values, stride, d, last, oh, hd),
                    2 => mix_heads::<2, 1>(wh, n, values, stride, d, last, oh, hd),
                    _ => mix_heads::<1, 1>(wh, n, values, stride, d, last, oh, hd),
                }
            }
            d += 16;
        }
    });
}

/// Columns `d .. d + 16W` of `G` heads' weighted sums (weights: rows of `n` in `w`; sums: rows
/// of `hd` in `out`), G × W accumulators in registers; `last` masks the last vector's columns.
///
/// # Safety
/// As [`mix_group`], for the columns selected.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn mix_heads<const G: usize, const W: usize>(w: &[f32], n: usize, values: &[f32], stride: usize, d: usize, last: __mmask16,
    out: &mut [f32], hd: usize) {
    let vp = values.as_ptr();
    let mask = |k: usize| if k + 1 == W { last } else { u16::MAX };
    let mut acc = [[_mm512_setzero_ps(); W]; G];
    for i in 0..n {
        // SAFETY: value i holds the selected columns (the contract).
        let vs: [__m512; W] = std::array::from_fn(|k| unsafe { _mm512_maskz_loadu_ps(mask(k), vp.add(i * stride + d + 16 * k)) });
        for (g, row) in acc.iter_mut().enumerate() {
            let wv = _mm512_set1_ps(w[g * n + i]);
            for (a, v) in row.iter_mut().zip(vs) {
                *a = _mm512_fmadd_ps(wv, v, *a);
            }
        }
    }
    for (g, row) in acc.iter().enumerate() {
        for (k, a) in row.iter().enumerate() {
            // SAFETY: as above, for head g's sums.
            unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(g * hd + d + 16 * k), mask(k), *a) };
        }
    }
}
