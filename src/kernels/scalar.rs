//! The scalar reference kernels: plain loops that every SIMD kernel is tested against, and the
//! path a config switch forces. One function per weight dtype computes, for a range of rows,
//! the dot products of each row with each of `n` activation vectors.
//!
//! Quantized rows are decoded in place, block by block (seed 000, "Why the matrix vector
//! product decodes in place"): the scale, then the 32 products, never a widened row.

use super::MatRef;
use crate::format::dtype::BLOCK;
use crate::format::fp8::{f8b32_scale, E4M3_TO_F32, F8B32_BYTES};

/// Signature shared by every row-dot kernel: rows `r0..r1` of `w` against the `n` vectors of
/// `x` (each `w.cols` long), writing `y[t * y_stride + r]`.
///
/// # Safety
/// `y` must be valid for writes at every `t * y_stride + r` with `t < n`, `r0 <= r < r1`, and no
/// other thread may access those elements during the call; `r1 <= w.rows`,
/// `w.data.len() >= w.rows * w.row_bytes()` and `x.len() >= n * w.cols` (the SIMD kernels read
/// through raw pointers and rely on it); and the CPU must have the kernel's instruction set.
pub type RowsFn = unsafe fn(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, y_stride: usize);

#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

#[inline]
pub fn f16_to_f32(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

#[inline]
fn le16(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}

/// Dot product in f32 with one accumulator, in index order.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        s += x * y;
    }
    s
}

/// [`dot_f32`] with the kernel table's signature.
///
/// # Safety
/// None beyond the signature (the table's entries for SIMD instruction sets are unsafe).
pub unsafe fn dot_unsafe(a: &[f32], b: &[f32]) -> f32 {
    dot_f32(a, b)
}

/// Attention scores: `out[i] = (q · key_i) × scale`, key `i` starting at `keys[i × stride]`,
/// each product a [`dot_f32`] — what the attention loop computed key by key before the
/// scores became one kernel call per (token, head).
///
/// # Safety
/// `keys` holds `out.len()` keys of `q.len()` values, `stride` apart (the caller checks).
pub unsafe fn scores_unsafe(q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = dot_f32(q, &keys[i * stride..i * stride + q.len()]) * scale;
    }
}

/// Attention's weighted sum of values: `out[d] = Σᵢ w[i] × value_i[d]`, value `i` starting at
/// `values[i × stride]`, summed in key order from zero, one rounded product and one rounded
/// sum per step.
///
/// # Safety
/// `values` holds `w.len()` values of `out.len()` floats, `stride` apart (the caller checks).
pub unsafe fn mix_unsafe(w: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
    out.fill(0.0);
    for (i, &wi) in w.iter().enumerate() {
        for (o, v) in out.iter_mut().zip(&values[i * stride..]) {
            *o += wi * v;
        }
    }
}

/// Sum in f32 with one accumulator, in index order (the scalar twin of the bandwidth probe).
///
/// # Safety
/// None beyond the signature.
pub unsafe fn sum_unsafe(a: &[f32]) -> f32 {
    a.iter().fold(0.0f32, |s, v| s + v)
}

macro_rules! rows_kernel {
    ($name:ident, $row_dot:expr) => {
        /// Scalar row-dot kernel (see [`RowsFn`]).
        ///
        /// # Safety
        /// As [`RowsFn`].
        pub unsafe fn $name(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, y_stride: usize) {
            let rb = w.row_bytes();
            for r in r0..r1 {
                let row = &w.data[r * rb..(r + 1) * rb];
                for t in 0..n {
                    let xv = &x[t * w.cols..(t + 1) * w.cols];
                    let v: f32 = $row_dot(row, xv);
                    // SAFETY: the caller guarantees this element is ours to write.
                    unsafe { *y.add(t * y_stride + r) = v };
                }
            }
        }
    };
}

fn row_f32(row: &[u8], x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (c, xv) in x.iter().enumerate() {
        let w = f32::from_le_bytes([row[4 * c], row[4 * c + 1], row[4 * c + 2], row[4 * c + 3]]);
        s += w * xv;
    }
    s
}

fn row_bf16(row: &[u8], x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (c, xv) in x.iter().enumerate() {
        s += bf16_to_f32(le16(row, c)) * xv;
    }
    s
}

fn row_f16(row: &[u8], x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (c, xv) in x.iter().enumerate() {
        s += f16_to_f32(le16(row, c)) * xv;
    }
    s
}

fn row_q8(row: &[u8], x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (b, xb) in row.chunks_exact(34).zip(x.chunks_exact(BLOCK)) {
        let scale = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        let mut acc = 0.0f32;
        for k in 0..BLOCK {
            acc += (b[2 + k] as i8) as f32 * xb[k];
        }
        s += acc * scale;
    }
    s
}

fn row_q4(row: &[u8], x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (b, xb) in row.chunks_exact(18).zip(x.chunks_exact(BLOCK)) {
        let scale = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        let mut acc = 0.0f32;
        for (k, &xk) in xb.iter().enumerate() {
            acc += q4_at(b, k) as f32 * xk;
        }
        s += acc * scale;
    }
    s
}

/// An F8B32 row (`format::fp8`): per 32-column block, the 32 e4m3 codes decoded through the
/// exact table and multiplied with the inputs, then the sum times the block's f32 scale — the
/// Q8B32 order, with the code's value in place of the level.
fn row_f8(row: &[u8], x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (b, xb) in row.chunks_exact(F8B32_BYTES).zip(x.chunks_exact(BLOCK)) {
        let mut acc = 0.0f32;
        for k in 0..BLOCK {
            acc += E4M3_TO_F32[b[4 + k] as usize] * xb[k];
        }
        s += acc * f8b32_scale(b);
    }
    s
}

/// The k-th signed nibble of a Q4B32 block: low nibble = even position (seed 000, "The payload").
#[inline]
pub fn q4_at(block: &[u8], k: usize) -> i8 {
    let nibble = (block[2 + k / 2] >> (4 * (k % 2))) & 0x0f;
    ((nibble ^ 8) as i8) - 8
}

rows_kernel!(rows_f32, row_f32);
rows_kernel!(rows_bf16, row_bf16);
rows_kernel!(rows_f16, row_f16);
rows_kernel!(rows_q8b32, row_q8);
rows_kernel!(rows_q4b32, row_q4);
rows_kernel!(rows_f8b32, row_f8);
rows_kernel!(rows_mxfp4, row_mxfp4);

/// MXFP4 blocks (17 bytes: e8m0 scale, then 32 e2m1 codes, low nibble first): each code
/// decoded as `row_to_f32` does (its value times the block's power of two, exact, or the same
/// infinity where 6 × 2¹²⁷ leaves f32) times its input, added in column order with one
/// accumulator — the F32/BF16 twin's sequence over the decoded row, so an MXFP4 row gives the
/// bits of the same weights stored as BF16 (which holds every MXFP4 value). The SIMD twin
/// (`avx2::decode_mx`) decodes the same weights. A NaN scale (0xFF; the converter never writes
/// one) gives NaN, never a panic.
fn row_mxfp4(row: &[u8], x: &[f32]) -> f32 {
    use crate::format::mxfp4::{e8m0, E2M1};
    let mut s = 0.0f32;
    for (b, xb) in row.chunks_exact(17).zip(x.chunks_exact(BLOCK)) {
        let scale = e8m0(b[0]).unwrap_or(f32::NAN);
        for (pair, &byte) in xb.chunks_exact(2).zip(&b[1..17]) {
            s += E2M1[(byte & 0x0F) as usize] * scale * pair[0];
            s += E2M1[(byte >> 4) as usize] * scale * pair[1];
        }
    }
    s
}

/// Widens one row of any compute dtype to f32 (embedding lookups, tests).
pub fn row_to_f32(w: &MatRef, r: usize, out: &mut [f32]) {
    use crate::format::dtype::DType;
    let rb = w.row_bytes();
    let row = &w.data[r * rb..(r + 1) * rb];
    match w.dtype {
        DType::F32 => out.iter_mut().enumerate().for_each(|(c, o)| {
            *o = f32::from_le_bytes([row[4 * c], row[4 * c + 1], row[4 * c + 2], row[4 * c + 3]])
        }),
        DType::BF16 => out.iter_mut().enumerate().for_each(|(c, o)| *o = bf16_to_f32(le16(row, c))),
        DType::F16 => out.iter_mut().enumerate().for_each(|(c, o)| *o = f16_to_f32(le16(row, c))),
        DType::Q8B32 => {
            for (b, ob) in row.chunks_exact(34).zip(out.chunks_exact_mut(BLOCK)) {
                let scale = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                ob.iter_mut().enumerate().for_each(|(k, o)| *o = (b[2 + k] as i8) as f32 * scale);
            }
        }
        DType::Q4B32 => {
            for (b, ob) in row.chunks_exact(18).zip(out.chunks_exact_mut(BLOCK)) {
                let scale = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                ob.iter_mut().enumerate().for_each(|(k, o)| *o = q4_at(b, k) as f32 * scale);
            }
        }
        DType::F8B32 => crate::format::fp8::decode_f8b32_row(row, out),
        DType::MXFP4 => {
            for (b, ob) in row.chunks_exact(17).zip(out.chunks_exact_mut(BLOCK)) {
                let scale = crate::format::mxfp4::e8m0(b[0]).unwrap_or(f32::NAN);
                for (pair, &byte) in ob.chunks_exact_mut(2).zip(&b[1..17]) {
                    pair[0] = crate::format::mxfp4::E2M1[(byte & 0x0F) as usize] * scale;
                    pair[1] = crate::format::mxfp4::E2M1[(byte >> 4) as usize] * scale;
                }
            }
        }
        _ => out.fill(0.0),
    }
}

/// Every binary16 value widened to f32, indexed by its bits: the SIMD block kernels read a
/// block's scale from here, so the scale costs one load (folded into the multiply as a
/// broadcast operand) instead of a broadcast and a conversion per block. Built at compile time;
/// 256 KiB, of which a model's scales touch the few KiB of their exponent range.
pub static F16_TO_F32: [f32; 65536] = f16_table();

const fn f16_table() -> [f32; 65536] {
    let mut t = [0f32; 65536];
    let mut h = 0usize;
    while h < 65536 {
        t[h] = f16_bits_to_f32(h as u16);
        h += 1;
    }
    t
}

/// IEEE 754 binary16 → binary32, exactly (subnormals normalised, infinities and NaN payloads
/// kept, NaNs quieted as the hardware conversion does).
pub(crate) const fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // man × 2⁻²⁴: shift the leading 1 up to bit 10, lowering the exponent each step.
            let mut e = 113u32;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 31 {
        sign | 0x7f80_0000 | (man << 13) | if man != 0 { 0x0040_0000 } else { 0 }
    } else {
        sign | ((exp + 112) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MXFP4 row dot decodes every code and scale as `row_to_f32` does and adds the
    /// products in column order (the same bits as the widened row's dot), and a NaN scale gives
    /// NaN.
    #[test]
    fn the_mxfp4_dot_agrees_with_its_decode() {
        use crate::format::dtype::DType;
        // Two blocks: every code twice, scales 2^1 and 2^-3; inputs small powers of two.
        let mut row = vec![0u8; 34];
        row[0] = 128;
        row[17] = 124;
        for k in 0..16 {
            row[1 + k] = (k as u8) | (((15 - k) as u8) << 4);
            row[18 + k] = (((k + 3) % 16) as u8) | ((k as u8) << 4);
        }
        let x: Vec<f32> = (0..64).map(|c| [1.0, 0.5, 2.0, 0.25][c % 4]).collect();
        let mut w = vec![0.0f32; 64];
        row_to_f32(&MatRef { dtype: DType::MXFP4, rows: 1, cols: 64, data: &row }, 0, &mut w);
        assert_eq!(&w[..4], &[0.0, -12.0, 1.0, -8.0]);
        assert_eq!(w[33], 0.0f32 * 2f32.powi(-3));
        let want: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
        assert_eq!(row_mxfp4(&row, &x), want);
        row[17] = 0xFF;
        assert!(row_mxfp4(&row, &x).is_nan());
    }

    #[test]
    fn the_f16_table_is_the_exact_conversion() {
        for h in 0..=u16::MAX {
            let (ours, reference) = (F16_TO_F32[h as usize], half::f16::from_bits(h).to_f32());
            if reference.is_nan() {
                assert!(ours.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(ours.to_bits(), reference.to_bits(), "{h:#06x}");
            }
        }
    }
}
