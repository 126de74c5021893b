//! AVX2 attention kernels: one query head's scores against a run of cached keys, and the
//! weighted sum of the cached values. Their scalar twins are `scalar::scores_unsafe` and
//! `scalar::mix_unsafe` (compared in `tests/kernels.rs`); AVX-512 hosts use the 16-lane
//! ones of [`super::avx512_attention`] (and this softmax).
//!
//! A score is [`super::avx2::dot`]'s value to the bit — one 8-lane accumulator in column order,
//! the last partial 8 zero-padded, the lanes summed by `hsum8`'s tree — but eight keys are
//! taken at once: the query's columns are loaded once for the eight, eight independent
//! accumulators keep both FMA pipes busy (one key's chain waits on each product), and the
//! eight lane sums come out of one shuffle tree that adds exactly the pairs `hsum8` adds; the
//! last keys (fewer than eight) go through `dot` itself. docs/BENCHMARKS.md ("attention as
//! kernels") has what this changed.

use super::avx2::{hsum8, hsum8x8};
use std::arch::x86_64::*;

/// Keys scored at once.
const KEYS: usize = 8;

/// `out[i] = (q · key_i) × scale`, key `i` at `keys[i × stride..]` (see the module comment).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `keys` holds `out.len()` keys of `q.len()` values,
/// `stride` apart.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scores(q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    let (hd, n) = (q.len(), out.len());
    let full = hd / 8 * 8;
    let mut q_tail = [0f32; 8];
    q_tail[..hd - full].copy_from_slice(&q[full..]);
    let (qp, kp) = (q.as_ptr(), keys.as_ptr());
    // The zero-padded last 8 columns of key `i` (as `dot` pads them).
    let key_tail = |i: usize| {
        let mut t = [0f32; 8];
        t[..hd - full].copy_from_slice(&keys[i * stride + full..i * stride + hd]);
        t
    };
    let mut i = 0;
    while i + KEYS <= n {
        let mut acc = [_mm256_setzero_ps(); KEYS];
        let mut c = 0;
        while c < full {
            // SAFETY: c + 8 <= hd, and key i + j holds hd values (the contract).
            let qv = unsafe { _mm256_loadu_ps(qp.add(c)) };
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qv, unsafe { _mm256_loadu_ps(kp.add((i + j) * stride + c)) }, *a);
            }
            c += 8;
        }
        if full < hd {
            // SAFETY: the padded copies hold 8 values each.
            let qv = unsafe { _mm256_loadu_ps(q_tail.as_ptr()) };
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qv, unsafe { _mm256_loadu_ps(key_tail(i + j).as_ptr()) }, *a);
            }
        }
        // SAFETY: i + 8 <= out.len().
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(hsum8x8(&acc), _mm256_set1_ps(scale))) };
        i += KEYS;
    }
    for (j, o) in out.iter_mut().enumerate().skip(i) {
        // SAFETY: the CPU has AVX2 (the contract); key j lies in `keys`.
        *o = unsafe { super::avx2::dot(q, &keys[j * stride..j * stride + hd]) } * scale;
    }
}

/// `out[d] = Σᵢ w[i] × value_i[d]`, value `i` at `values[i × stride..]`: per 8 columns one
/// accumulator taking one fused multiply-add per key, in key order from zero; up to 64
/// columns at once, each key's weight broadcast once for them; the last columns (fewer
/// than 8) one at a time, in the same order. A column's sum does not depend on how many are
/// taken at once.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `values` holds `w.len()` values of `out.len()`
/// floats, `stride` apart.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mix(w: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
    let hd = out.len();
    let mut d = 0;
    // SAFETY (all four): columns d .. d + 8W lie in 0..hd (the contract covers them).
    while hd - d >= 64 {
        unsafe { mix_columns::<8>(w, values, stride, d, out) };
        d += 64;
    }
    for width in [4, 2, 1] {
        if hd - d >= 8 * width {
            match width {
                4 => unsafe { mix_columns::<4>(w, values, stride, d, out) },
                2 => unsafe { mix_columns::<2>(w, values, stride, d, out) },
                _ => unsafe { mix_columns::<1>(w, values, stride, d, out) },
            }
            d += 8 * width;
        }
    }
    for (c, o) in out.iter_mut().enumerate().skip(d) {
        *o = w.iter().enumerate().fold(0.0f32, |s, (i, &wi)| wi.mul_add(values[i * stride + c], s));
    }
}

/// [`mix`]'s columns `d .. d + 8W`, W accumulators held in registers.
///
/// # Safety
/// As [`mix`], and `d + 8W <= out.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mix_columns<const W: usize>(w: &[f32], values: &[f32], stride: usize, d: usize, out: &mut [f32]) {
    let vp = values.as_ptr();
    let mut acc = [_mm256_setzero_ps(); W];
    for (i, &wi) in w.iter().enumerate() {
        let wv = _mm256_set1_ps(wi);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: value i holds out.len() >= d + 8W floats (the contract).
            *a = _mm256_fmadd_ps(wv, unsafe { _mm256_loadu_ps(vp.add(i * stride + d + 8 * k)) }, *a);
        }
    }
    for (k, a) in acc.iter().enumerate() {
        // SAFETY: d + 8k + 8 <= out.len().
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(d + 8 * k), *a) };
    }
}

/// e^x for 8 lanes with x ≤ 0, within about 2 ulp of `f32::exp`: x = n·ln 2 + r with
/// n = round(x·log₂e) and r in ±ln 2 / 2 (ln 2 split in two parts, so r is exact to f32),
/// e^r from its Taylor series to r⁷/7! (the next term is under 6e-9 of the result), and 2ⁿ
/// put in the exponent bits. Below −87.33 (where e^x leaves the normal range) x is clamped
/// there: its e^x, 1.2e-38, is what such a score weighs next to the maximum's 1.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn exp8(x: __m256) -> __m256 {
    // maxps returns its second operand when either is NaN: a NaN score stays NaN.
    let x = _mm256_max_ps(_mm256_set1_ps(-87.33654), x);
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    // Σ r^k / k!, k = 0..7, by Horner's rule.
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(two_n))
}

/// The softmax of `x` with the extra logit `sink` in the denominator (see
/// `kernels::softmax_with_sink`, its scalar twin): the maximum over the scores and the sink,
/// e^(v − max) by [`exp8`] eight at a time (the last partial 8 from a padded copy), their sum
/// in 8 lanes then `hsum8`, the sink's term (`f32::exp`) added last, and one product by the
/// reciprocal per score.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn softmax_with_sink(x: &mut [f32], sink: f32) {
    let (n, p) = (x.len(), x.as_mut_ptr());
    let full = n / 8 * 8;
    let mut mv = _mm256_set1_ps(sink);
    let mut i = 0;
    while i < full {
        // SAFETY (here and below): i + 8 <= full <= n. A NaN score is passed over, as
        // `f32::max` does (maxps returns its second operand when either is NaN).
        mv = _mm256_max_ps(unsafe { _mm256_loadu_ps(p.add(i)) }, mv);
        i += 8;
    }
    let mut lanes = [0f32; 8];
    // SAFETY: 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), mv) };
    let max = x[full..].iter().chain(&lanes).copied().fold(sink, f32::max);
    let (m, mut acc) = (_mm256_set1_ps(max), _mm256_setzero_ps());
    i = 0;
    while i < full {
        let e = exp8(_mm256_sub_ps(unsafe { _mm256_loadu_ps(p.add(i)) }, m));
        unsafe { _mm256_storeu_ps(p.add(i), e) };
        acc = _mm256_add_ps(acc, e);
        i += 8;
    }
    let mut sum = hsum8(acc);
    if full < n {
        let mut pad = [0f32; 8];
        pad[..n - full].copy_from_slice(&x[full..]);
        // SAFETY: 8 floats each.
        unsafe { _mm256_storeu_ps(pad.as_mut_ptr(), exp8(_mm256_sub_ps(_mm256_loadu_ps(pad.as_ptr()), m))) };
        for (v, e) in x[full..].iter_mut().zip(pad) {
            *v = e;
            sum += e;
        }
    }
    sum += (sink - max).exp();
    let inv = _mm256_set1_ps(1.0 / sum);
    i = 0;
    while i < full {
        unsafe { _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv)) };
        i += 8;
    }
    let inv = 1.0 / sum;
    for v in &mut x[full..] {
        *v *= inv;
    }
}

/// Lanes `0..k` of an 8-lane mask for `vmaskmovps` (k ≤ 8): the masked-off lanes load as zero,
/// the zero padding [`super::avx2::dot`] gives a last partial 8.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn lanes(k: usize) -> __m256i {
    _mm256_cmpgt_epi32(_mm256_set1_epi32(k as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

/// [`scores`] for `q.len() / hd` query heads that share their keys (a grouped-query attention
/// group; `q` holds the heads one after another, `out` a row of `out.len() / heads` scores per
/// head): four heads over two keys, or two over four, in 8 accumulators, each key loaded once
/// for the tile's heads. Every score has [`scores`]'s bits (one 8-lane chain over the
/// columns, the last partial 8 zero-padded, reduced by `hsum8`'s tree).
///
/// # Safety
/// As [`scores`] for each head; `q.len()` is a multiple of `hd > 0` and `out.len()` of the head
/// count.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scores_group(q: &[f32], hd: usize, keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    // SAFETY (all three): each call gets heads of q and out and the keys (the contract).
    scores_by_tiles(q, hd, keys, stride, out,
        |q, out, n| unsafe { scores_tile::<4, 2>(q, hd, keys, stride, scale, out, n) },
        |q, out, n| unsafe { scores_tile::<2, 4>(q, hd, keys, stride, scale, out, n) },
        |q, keys, row| unsafe { scores(q, keys, stride, scale, row) });
}

/// The grouped score kernels' walk over their heads (`q.len() / hd` of them, `out` a row of
/// scores per head): four at a time through `quad`, two through `pair`, a last one alone; a
/// tile scores the keys its steps cover and returns how many, and the keys after those go
/// head by head through `one` (query, keys from the first left, the row's rest).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_by_tiles(q: &[f32], hd: usize, keys: &[f32], stride: usize, out: &mut [f32],
    quad: impl Fn(&[f32], &mut [f32], usize) -> usize, pair: impl Fn(&[f32], &mut [f32], usize) -> usize,
    one: impl Fn(&[f32], &[f32], &mut [f32])) {
    let heads = q.len() / hd;
    let n = out.len() / heads;
    let mut h = 0;
    while h < heads {
        let (qh, oh) = (&q[h * hd..], &mut out[h * n..]);
        let (done, took) = match heads - h {
            1 => (0, 1),
            2 | 3 => (pair(qh, oh, n), 2),
            _ => (quad(qh, oh, n), 4),
        };
        for g in (0..took).filter(|_| done < n) {
            one(&q[(h + g) * hd..(h + g + 1) * hd], &keys[done * stride..], &mut out[(h + g) * n + done..(h + g + 1) * n]);
        }
        h += took;
    }
}

/// Scores of `G` heads (rows of `n` in `out`) against keys `K` at a time, while `K` remain;
/// returns how many keys it scored. `G × K` = 8 accumulators, entry g·K + j of [`hsum8x8`].
///
/// # Safety
/// As [`scores_group`], for G heads from `q` and `out`.
// `j` indexes a key and, in every head's row, its accumulator.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scores_tile<const G: usize, const K: usize>(q: &[f32], hd: usize, keys: &[f32], stride: usize, scale: f32, out: &mut [f32], n: usize) -> usize {
    let full = hd / 8 * 8;
    let (all, tail) = (lanes(8), lanes(hd - full));
    let (qp, kp) = (q.as_ptr(), keys.as_ptr());
    let mut i = 0;
    while i + K <= n {
        let mut acc = [[_mm256_setzero_ps(); K]; G];
        let mut c = 0;
        while c <= hd {
            let m = if c < full { all } else if full < hd { tail } else { break };
            // SAFETY: the selected columns lie in each head's query and each key (contract).
            let qs: [__m256; G] = std::array::from_fn(|g| unsafe { _mm256_maskload_ps(qp.add(g * hd + c), m) });
            for j in 0..K {
                let kv = unsafe { _mm256_maskload_ps(kp.add((i + j) * stride + c), m) };
                for g in 0..G {
                    acc[g][j] = _mm256_fmadd_ps(qs[g], kv, acc[g][j]);
                }
            }
            c += 8;
        }
        let flat: [__m256; 8] = std::array::from_fn(|e| acc[e / K][e % K]);
        let mut sums = [0f32; 8];
        // SAFETY: 8 floats.
        unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), _mm256_mul_ps(hsum8x8(&flat), _mm256_set1_ps(scale))) };
        for (e, s) in sums.into_iter().enumerate() {
            out[(e / K) * n + i + e % K] = s;
        }
        i += K;
    }
    i
}

/// The grouped weighted-sum kernels' walk over their heads (`out.len() / hd` of them; `w` a
/// row of weights per head): up to four at a time, `sums` getting each batch's weight rows,
/// its sums, the batch size and the keys per row.
pub(crate) fn mix_by_heads(w: &[f32], out: &mut [f32], hd: usize, mut sums: impl FnMut(&[f32], &mut [f32], usize, usize)) {
    let heads = out.len() / hd;
    let n = w.len() / heads;
    let mut h = 0;
    while h < heads {
        let took = (heads - h).min(4);
        sums(&w[h * n..(h + took) * n], &mut out[h * hd..(h + took) * hd], took, n);
        h += took;
    }
}

/// [`mix`] for `out.len() / hd` heads that share their values (`w` holds a row of weights per
/// head, `out` the heads' sums one after another): up to four heads at a time over 16
/// columns, each value's columns loaded once for them. Every column of every head has
/// [`mix`]'s bits (its own chain of fused multiply-adds in key order from zero).
///
/// # Safety
/// As [`mix`] for each head; `out.len()` is a multiple of `hd > 0` and `w.len()` of the head
/// count.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mix_group(w: &[f32], values: &[f32], stride: usize, out: &mut [f32], hd: usize) {
    mix_by_heads(w, out, hd, |wh, oh, took, n| {
        let mut d = 0;
        while d < hd {
            // Two vectors of 8 columns, the second (or the only one) masked at the row's end.
            let cols = (hd - d).min(16);
            let (first, second) = if cols > 8 { (lanes(8), lanes(cols - 8)) } else { (lanes(cols), lanes(0)) };
            // SAFETY: the columns the masks select lie in 0..hd, which `out` holds for the
            // `took` heads and every value holds (the contract).
            unsafe {
                match took {
                    4 => mix_heads::<4>(wh, n, values, stride, d, [first, second], oh, hd),
                    3 => mix_heads::<3>(wh, n, values, stride, d, [first, second], oh, hd),
                    2 => mix_heads::<2>(wh, n, values, stride, d, [first, second], oh, hd),
                    _ => mix_heads::<1>(wh, n, values, stride, d, [first, second], oh, hd),
                }
            }
            d += cols;
        }
    });
}

/// Columns `d .. d + 16` (as `masks` select them) of `G` heads' weighted sums (weights: rows
/// of `n` in `w`; sums: rows of `hd` in `out`), 2G accumulators in registers.
///
/// # Safety
/// As [`mix_group`], for the columns selected.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mix_heads<const G: usize>(w: &[f32], n: usize, values: &[f32], stride: usize, d: usize, masks: [__m256i; 2], out: &mut [f32], hd: usize) {
    let vp = values.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; G];
    for i in 0..n {
        // SAFETY: value i holds the selected columns (the contract); the rest are not read.
        let vs: [__m256; 2] = std::array::from_fn(|k| unsafe { _mm256_maskload_ps(vp.add(i * stride + d + 8 * k), masks[k]) });
        for (g, row) in acc.iter_mut().enumerate() {
            let wv = _mm256_set1_ps(w[g * n + i]);
            for (a, v) in row.iter_mut().zip(vs) {
                *a = _mm256_fmadd_ps(wv, v, *a);
            }
        }
    }
    for (g, row) in acc.iter().enumerate() {
        for (k, a) in row.iter().enumerate() {
            // SAFETY: as above, for head g's sums.
            unsafe { _mm256_maskstore_ps(out.as_mut_ptr().add(g * hd + d + 8 * k), masks[k], *a) };
        }
    }
}
