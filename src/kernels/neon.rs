//! AArch64 Advanced SIMD (NEON) kernels: 4 f32 lanes. Each has a scalar twin in
//! [`super::scalar`] and a test comparing them (`tests/kernels.rs`).
//!
//! The shape is that of [`super::avx2`] at half the width: one 4-lane accumulator per
//! (row, vector) pair; a quantized block is decoded in place into eight 4-lane vectors whose
//! products are summed into a block vector, scaled and accumulated; lanes are summed by
//! [`hsum4`], a fixed tree. A row's last partial 4 columns are copied into zero-padded stack
//! buffers. Binary16 is widened with integer operations (the NEON f16 conversion intrinsics
//! are not stable Rust), exactly, subnormals, infinities and NaNs included.

use super::scalar::F16_TO_F32;
use super::MatRef;
use std::arch::aarch64::*;

/// Sums 4 lanes as (lane 0 + lane 2) + (lane 1 + lane 3): a fixed order.
#[target_feature(enable = "neon")]
#[inline]
fn hsum4(v: float32x4_t) -> f32 {
    let s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    vget_lane_f32::<0>(s) + vget_lane_f32::<1>(s)
}

/// Four binary16 values to f32, exactly: the exponent is re-biased by multiplying by 2¹¹²
/// (which also normalises subnormals), and exponent 31 becomes infinity or NaN.
#[target_feature(enable = "neon")]
#[inline]
fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let h = vmovl_u16(h);
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    let em = vandq_u32(h, vdupq_n_u32(0x7fff));
    let shifted = vshlq_n_u32::<13>(em);
    let finite = vmulq_n_f32(vreinterpretq_f32_u32(shifted), f32::from_bits(0x7780_0000)); // 2^112
    let special = vreinterpretq_f32_u32(vorrq_u32(shifted, vdupq_n_u32(0x7f80_0000)));
    let is_special = vcgeq_u32(em, vdupq_n_u32(0x7c00));
    let v = vbslq_f32(is_special, special, finite);
    vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(v), sign))
}

/// Dense tiles: `$load(ptr)` widens 4 stored weights to f32.
macro_rules! dense_tile {
    ($name:ident, $elem:ty, $load:ident) => {
        #[target_feature(enable = "neon")]
        #[inline]
        unsafe fn $name<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &[f32], t0: usize, out: &mut [[f32; T]; R]) {
            let cols = w.cols;
            let wp = w.data.as_ptr() as *const $elem;
            let xp = x.as_ptr();
            let mut acc = [[vdupq_n_f32(0.0); T]; R];
            let full = cols / 4 * 4;
            let mut c = 0;
            // SAFETY (all loads): rows r..r+R and vectors t0..t0+T exist (the driver's
            // contract) and c + 4 <= cols.
            while c < full {
                for i in 0..R {
                    let wv = unsafe { $load(wp.add((r + i) * cols + c)) };
                    for t in 0..T {
                        let xv = unsafe { vld1q_f32(xp.add((t0 + t) * cols + c)) };
                        acc[i][t] = vfmaq_f32(acc[i][t], wv, xv);
                    }
                }
                c += 4;
            }
            if c < cols {
                let k = cols - c;
                for i in 0..R {
                    let mut wpad = [<$elem>::default(); 4];
                    // SAFETY: k values remain in row r + i.
                    unsafe { std::ptr::copy_nonoverlapping(wp.add((r + i) * cols + c), wpad.as_mut_ptr(), k) };
                    let wv = unsafe { $load(wpad.as_ptr()) };
                    for t in 0..T {
                        let mut xpad = [0f32; 4];
                        // SAFETY: k values remain in vector t0 + t.
                        unsafe { std::ptr::copy_nonoverlapping(xp.add((t0 + t) * cols + c), xpad.as_mut_ptr(), k) };
                        let xv = unsafe { vld1q_f32(xpad.as_ptr()) };
                        acc[i][t] = vfmaq_f32(acc[i][t], wv, xv);
                    }
                }
            }
            for i in 0..R {
                for t in 0..T {
                    out[i][t] = hsum4(acc[i][t]);
                }
            }
        }
    };
}

#[target_feature(enable = "neon")]
#[inline]
unsafe fn load_f32(p: *const f32) -> float32x4_t {
    // SAFETY: the caller guarantees 4 readable values.
    unsafe { vld1q_f32(p) }
}

/// bf16 is the top half of an f32: shift left 16 while widening (exact).
#[target_feature(enable = "neon")]
#[inline]
unsafe fn load_bf16(p: *const u16) -> float32x4_t {
    // SAFETY: the caller guarantees 4 readable values.
    vreinterpretq_f32_u32(vshll_n_u16::<16>(unsafe { vld1_u16(p) }))
}

#[target_feature(enable = "neon")]
#[inline]
unsafe fn load_f16(p: *const u16) -> float32x4_t {
    // SAFETY: the caller guarantees 4 readable values.
    f16x4_to_f32(unsafe { vld1_u16(p) })
}

dense_tile!(tile_f32, f32, load_f32);
dense_tile!(tile_bf16, u16, load_bf16);
dense_tile!(tile_f16, u16, load_f16);

/// Quantized tiles: `$decode(block_ptr)` turns one block into its scale and eight 4-lane
/// vectors of values in position order.
macro_rules! block_tile {
    ($name:ident, $bytes:expr, $decode:ident) => {
        #[target_feature(enable = "neon")]
        #[inline]
        unsafe fn $name<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &[f32], t0: usize, out: &mut [[f32; T]; R]) {
            let (cols, rb) = (w.cols, w.row_bytes());
            let blocks = rb / $bytes;
            let wp = w.data.as_ptr();
            let xp = x.as_ptr();
            let mut acc = [[vdupq_n_f32(0.0); T]; R];
            for b in 0..blocks {
                for i in 0..R {
                    // SAFETY: block b of row r + i lies inside the matrix (driver contract).
                    let (s, q) = unsafe { $decode(wp.add((r + i) * rb + b * $bytes)) };
                    for t in 0..T {
                        // SAFETY: vector t0 + t has `cols` = 32 × blocks values.
                        let xb = unsafe { xp.add((t0 + t) * cols + b * 32) };
                        let mut blk = vmulq_f32(q[0], unsafe { vld1q_f32(xb) });
                        for k in 1..8 {
                            blk = vfmaq_f32(blk, q[k], unsafe { vld1q_f32(xb.add(4 * k)) });
                        }
                        acc[i][t] = vfmaq_f32(acc[i][t], blk, s);
                    }
                }
            }
            for i in 0..R {
                for t in 0..T {
                    out[i][t] = hsum4(acc[i][t]);
                }
            }
        }
    };
}

/// The binary16 scale at the start of a block, widened through [`F16_TO_F32`] and broadcast.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn scale(p: *const u8) -> float32x4_t {
    // SAFETY: the caller guarantees two readable bytes.
    let bits = u16::from_le(unsafe { (p as *const u16).read_unaligned() });
    vdupq_n_f32(F16_TO_F32[bits as usize])
}

/// 16 signed bytes to four 4-lane f32 vectors, in order.
#[target_feature(enable = "neon")]
#[inline]
fn widen16(v: int8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_s8(vget_low_s8(v));
    let hi = vmovl_high_s8(v);
    [
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
        vcvtq_f32_s32(vmovl_high_s16(lo)),
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
        vcvtq_f32_s32(vmovl_high_s16(hi)),
    ]
}

/// Q8B32: 32 signed bytes after the scale.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn decode_q8(p: *const u8) -> (float32x4_t, [float32x4_t; 8]) {
    // SAFETY: the caller guarantees the 34-byte block at p.
    let (a, b) = unsafe { (vld1q_s8(p.add(2) as *const i8), vld1q_s8(p.add(18) as *const i8)) };
    let (a, b) = (widen16(a), widen16(b));
    // SAFETY: as above.
    (unsafe { scale(p) }, [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]])
}

/// Q4B32: NEON has byte shifts, so the nibbles are sign-extended directly — `(b << 4) >> 4`
/// (arithmetic) for the low, even-position one and `b >> 4` for the high one — then
/// interleaved into position order.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn decode_q4(p: *const u8) -> (float32x4_t, [float32x4_t; 8]) {
    // SAFETY: the caller guarantees the 18-byte block at p.
    let b = unsafe { vld1q_s8(p.add(2) as *const i8) };
    let even = vshrq_n_s8::<4>(vshlq_n_s8::<4>(b));
    let odd = vshrq_n_s8::<4>(b);
    let (a, c) = (widen16(vzip1q_s8(even, odd)), widen16(vzip2q_s8(even, odd)));
    // SAFETY: as above.
    (unsafe { scale(p) }, [a[0], a[1], a[2], a[3], c[0], c[1], c[2], c[3]])
}

block_tile!(tile_q8b32, 34, decode_q8);
block_tile!(tile_q4b32, 18, decode_q4);

row_driver!("neon", rows_f32, tile_f32, 4, 2);
row_driver!("neon", rows_bf16, tile_bf16, 4, 2);
row_driver!("neon", rows_f16, tile_f16, 4, 2);
row_driver!("neon", rows_q8b32, tile_q8b32, 4, 2);
row_driver!("neon", rows_q4b32, tile_q4b32, 4, 2);

/// Attention scores, one [`dot`] per key (the twin is `scalar::scores_unsafe`).
///
/// # Safety
/// As `scalar::scores_unsafe`, and the CPU must have NEON.
#[target_feature(enable = "neon")]
pub unsafe fn scores(q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: NEON is present (the contract).
        *o = unsafe { dot(q, &keys[i * stride..i * stride + q.len()]) } * scale;
    }
}

/// Σ a[i]·b[i]: one 4-lane accumulator, a zero-padded last step, then [`hsum4`].
///
/// # Safety
/// The CPU must have NEON (every AArch64 Linux CPU does).
#[target_feature(enable = "neon")]
pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = vdupq_n_f32(0.0);
    let mut i = 0;
    // SAFETY (loads): i + 4 <= n.
    while i + 4 <= n {
        acc = vfmaq_f32(acc, unsafe { vld1q_f32(a.as_ptr().add(i)) }, unsafe { vld1q_f32(b.as_ptr().add(i)) });
        i += 4;
    }
    if i < n {
        let (mut pa, mut pb) = ([0f32; 4], [0f32; 4]);
        pa[..n - i].copy_from_slice(&a[i..n]);
        pb[..n - i].copy_from_slice(&b[i..n]);
        acc = vfmaq_f32(acc, unsafe { vld1q_f32(pa.as_ptr()) }, unsafe { vld1q_f32(pb.as_ptr()) });
    }
    hsum4(acc)
}

/// Σ a[i]: groups of four adjacent segments of `a` summed in lockstep into four 4-lane accumulators
/// (four sequential streams keep enough reads in flight to measure DRAM, as the 4-row kernels
/// do), combined as (0+1)+(2+3), then the rest, then the lanes.
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
pub unsafe fn sum(a: &[f32]) -> f32 {
    let (n, p) = (a.len(), a.as_ptr());
    let mut acc = [vdupq_n_f32(0.0); 4];
    // Groups of four adjacent segments read in lockstep: four sequential streams a few KiB
    // apart, as a 4-row tile reads a matrix.
    let mut i = 0;
    // SAFETY (all loads): each group lies inside a (i + 4 * SUM_SEGMENT <= n); after the
    // groups, i + 4 <= n, and the last step is padded or masked to n.
    while i + 4 * super::SUM_SEGMENT <= n {
        let mut j = 0;
        while j < super::SUM_SEGMENT {
            for (k, s) in acc.iter_mut().enumerate() {
                *s = vaddq_f32(*s, unsafe { vld1q_f32(p.add(i + k * super::SUM_SEGMENT + j)) });
            }
            j += 4;
        }
        i += 4 * super::SUM_SEGMENT;
    }
    let mut s = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    while i + 4 <= n {
        s = vaddq_f32(s, unsafe { vld1q_f32(p.add(i)) });
        i += 4;
    }
    if i < n {
        let mut pad = [0f32; 4];
        pad[..n - i].copy_from_slice(&a[i..n]);
        s = vaddq_f32(s, unsafe { vld1q_f32(pad.as_ptr()) });
    }
    hsum4(s)
}
