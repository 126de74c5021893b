//! FP8 block-scaled weights (spec §3.9): the form DeepSeek-V3/R1/V3.1 and Kimi-K2 are published
//! in. A linear weight `W [R, C]` is stored as `F8_E4M3` codes with an F32 tensor
//! `<name>_scale_inv` of `[⌈R/br⌉, ⌈C/bc⌉]` values, one per block of the config's
//! `quantization_config.weight_block_size = [br, bc]` (the last block of a row or column of
//! blocks may be partial). The weight means `e4m3(code) × scale_inv[r / br][c / bc]`.
//!
//! Two ways to use such a tensor:
//! - [`dequantize`]: every value decoded exactly to f32 (what loading a Hugging Face directory
//!   does for the trunk, and what `waste convert` re-encodes from for the float and Q4/Q8
//!   encodings);
//! - [`encode_f8b32`]: the `F8B32` record encoding of routed experts (a container's
//!   `--experts fp8`, and a directory's resident banks), which keeps the codes and the
//!   scales as they are, laid out so a row's product reads each scale next to its weights: a
//!   row is blocks of 32 columns, each block an f32 scale (little endian) followed by the 32
//!   codes (36 bytes). A 32-column block never straddles two source blocks because the source's
//!   column block is required to be a multiple of 32; the source's row blocks cost nothing, as
//!   every row carries its own copy of its scales.
//!
//! ## e4m3fn
//! Sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (`m × 2⁻⁹`); there
//! are no infinities, and `S.1111.111` (0x7f, 0xff) is NaN — refused wherever it is read, with
//! the tensor and the block named. Every other code is exact in f32; the largest is ±448.

use crate::error::{Error, ErrorKind, Result};
use crate::format::dtype::DType;
use std::path::Path;

/// Columns per block of the `F8B32` record encoding.
pub const F8B32_COLS: usize = 32;
/// Bytes per `F8B32` block: an f32 scale and 32 codes.
pub const F8B32_BYTES: usize = 4 + F8B32_COLS;

/// Every e4m3fn code decoded to f32 (NaN for 0x7f and 0xff), built at compile time.
pub static E4M3_TO_F32: [f32; 256] = e4m3_table();

const fn e4m3_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut c = 0usize;
    while c < 256 {
        t[c] = e4m3_bits_to_f32(c as u8);
        c += 1;
    }
    t
}

/// The exact binary32 of an e4m3fn code: a normal code keeps its mantissa bits and moves its
/// exponent from bias 7 to bias 127; a subnormal (`m × 2⁻⁹`, m in 1..8) is normalised.
const fn e4m3_bits_to_f32(code: u8) -> f32 {
    let sign = ((code & 0x80) as u32) << 24;
    let exp = ((code >> 3) & 0x0f) as u32;
    let man = (code & 0x07) as u32;
    let bits = if exp == 0x0f && man == 0x07 {
        0x7fc0_0000 | sign
    } else if exp == 0 {
        if man == 0 {
            sign
        } else {
            // m × 2⁻⁹ = 1.xx × 2^(e): shift the leading 1 to bit 3, lowering the exponent.
            let mut e = 127 - 6;
            let mut m = man;
            while m & 0x08 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((m & 0x07) << 20)
        }
    } else {
        sign | ((exp + 120) << 23) | (man << 20)
    };
    f32::from_bits(bits)
}

/// True for the two NaN codes.
#[inline]
pub fn is_nan_code(code: u8) -> bool {
    code & 0x7f == 0x7f
}

/// The name of the scale tensor of weight `name` (`…weight` → `…weight_scale_inv`).
pub fn scale_name(name: &str) -> String {
    format!("{name}_scale_inv")
}

/// The shape of the scale tensor of an `[rows, cols]` weight under `block` = [br, bc].
pub fn scale_shape(rows: usize, cols: usize, block: [usize; 2]) -> [u64; 2] {
    [rows.div_ceil(block[0].max(1)) as u64, cols.div_ceil(block[1].max(1)) as u64]
}

/// The error for an F8_E4M3 weight `name` (of the checkpoint in `dir`) without its scales.
pub fn missing_scale(dir: &Path, name: &str) -> Error {
    Error::new(ErrorKind::Tensor, format!(
        "{}: tensor `{}` is missing: F8_E4M3 tensor `{name}` needs its block scales", dir.display(), scale_name(name)))
}

/// Checks the scale tensor `s` (in file `path`) of F8_E4M3 weight `name` ([rows, cols]) under
/// `block`: F32, and exactly one value per block, partial edge blocks included.
pub fn check_scale_tensor(path: &Path, name: &str, rows: usize, cols: usize, block: [usize; 2],
                          s: &crate::format::safetensors::TensorInfo) -> Result<()> {
    let want = scale_shape(rows, cols, block);
    if s.dtype != DType::F32 || s.shape != want {
        return Err(Error::new(ErrorKind::Tensor, format!(
            "{}: tensor `{}` is {} {:?}; the scales of `{name}` [{rows}, {cols}] under weight_block_size {block:?} are F32 {want:?}",
            path.display(), s.name, s.dtype, s.shape)));
    }
    Ok(())
}

/// One FP8 weight as read from a checkpoint: its codes and its scales, already checked to fit.
pub struct Fp8Tensor<'a> {
    /// The file holding the weight (for errors).
    pub path: &'a Path,
    /// The weight's tensor name.
    pub name: &'a str,
    /// Rows of the weight (outputs).
    pub rows: usize,
    /// Columns of the weight (inputs).
    pub cols: usize,
    /// `[br, bc]`.
    pub block: [usize; 2],
    /// rows × cols codes, row-major.
    pub codes: &'a [u8],
    /// ⌈rows/br⌉ × ⌈cols/bc⌉ scales, row-major.
    pub scales: &'a [f32],
}

impl Fp8Tensor<'_> {
    fn scale_at(&self, r: usize, c: usize) -> f32 {
        let per_row = self.cols.div_ceil(self.block[1]);
        self.scales[(r / self.block[0]) * per_row + c / self.block[1]]
    }

    /// Refuses a NaN code or a non-finite scale, naming the tensor, the block and the element.
    fn check(&self) -> Result<()> {
        if self.codes.len() != self.rows * self.cols || self.scales.len() as u64 != {
            let [a, b] = scale_shape(self.rows, self.cols, self.block);
            a * b
        } {
            return Err(Error::format(self.path, format!("tensor `{}`: {} codes and {} scales do not fit [{}, {}] under blocks {:?}",
                self.name, self.codes.len(), self.scales.len(), self.rows, self.cols, self.block)));
        }
        let per_row = self.cols.div_ceil(self.block[1]);
        if let Some(i) = self.scales.iter().position(|s| !s.is_finite()) {
            return Err(Error::format(self.path, format!("tensor `{}`: scale of block ({}, {}) is {}, not finite",
                scale_name(self.name), i / per_row, i % per_row, self.scales[i])));
        }
        if let Some(i) = self.codes.iter().position(|&c| is_nan_code(c)) {
            let (r, c) = (i / self.cols, i % self.cols);
            return Err(Error::format(self.path, format!(
                "tensor `{}`: e4m3 code 0x{:02x} (NaN) at row {r}, column {c}, in block ({}, {}); an FP8 weight must be a number",
                self.name, self.codes[i], r / self.block[0], c / self.block[1])));
        }
        Ok(())
    }
}

/// Decodes every weight exactly: `out[r·cols + c] = e4m3(code) × scale_inv` of its block.
pub fn dequantize(t: &Fp8Tensor, out: &mut [f32]) -> Result<()> {
    t.check()?;
    for (r, (codes, o)) in t.codes.chunks_exact(t.cols.max(1)).zip(out.chunks_exact_mut(t.cols.max(1))).enumerate() {
        for (c, (&code, v)) in codes.iter().zip(o.iter_mut()).enumerate() {
            *v = E4M3_TO_F32[code as usize] * t.scale_at(r, c);
        }
    }
    Ok(())
}

/// [`dequantize`] in place: `buf` holds `rows × cols` little-endian f32 values' bytes, whose last
/// quarter are the codes as read. The codes are checked (NaN, scales) before anything is
/// written, then widened front to back: value i's bytes end at 4i + 4 ≤ 3n + i + 1 for every
/// i < n, so they never overwrite a code not yet read. Loading needs no copy of the codes.
pub fn dequantize_widen(path: &Path, name: &str, [rows, cols]: [usize; 2], block: [usize; 2], scales: &[f32], buf: &mut [u8]) -> Result<()> {
    let n = rows * cols;
    if buf.len() != 4 * n {
        return Err(Error::format(path, format!("tensor `{name}`: {} bytes for {n} f32 values", buf.len())));
    }
    Fp8Tensor { path, name, rows, cols, block, codes: &buf[3 * n..], scales }.check()?;
    let per_row = cols.div_ceil(block[1].max(1));
    for i in 0..n {
        let code = buf[3 * n + i];
        let (r, c) = (i / cols, i % cols);
        let v = E4M3_TO_F32[code as usize] * scales[(r / block[0]) * per_row + c / block[1]];
        buf[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    Ok(())
}

/// Why a tensor cannot be kept as `F8B32`, or `None` when it can: whole 32-column blocks per
/// row, and source column blocks that are whole multiples of them.
pub fn f8b32_problem(name: &str, cols: usize, block: [usize; 2]) -> Option<String> {
    if cols == 0 || !cols.is_multiple_of(F8B32_COLS) {
        return Some(format!("tensor `{name}` has {cols} columns, not a positive multiple of {F8B32_COLS}: it cannot be kept as F8B32 (use --experts q8, bf16 or f32)"));
    }
    if !block[1].is_multiple_of(F8B32_COLS) {
        return Some(format!("quantization_config.weight_block_size[1] is {}, not a multiple of {F8B32_COLS}: tensor `{name}` cannot be kept as F8B32 \
(use --experts q8, bf16 or f32)", block[1]));
    }
    None
}

/// Lays the codes and scales out as `F8B32` rows into `out` (rows × cols/32 × 36 bytes).
pub fn encode_f8b32(t: &Fp8Tensor, out: &mut [u8]) -> Result<()> {
    if let Some(p) = f8b32_problem(t.name, t.cols, t.block) {
        return Err(Error::unsupported(format!("{}: {p}", t.path.display())));
    }
    t.check()?;
    let per_row = t.cols / F8B32_COLS;
    for (r, (codes, o)) in t.codes.chunks_exact(t.cols).zip(out.chunks_exact_mut(per_row * F8B32_BYTES)).enumerate() {
        for (b, (c32, ob)) in codes.chunks_exact(F8B32_COLS).zip(o.chunks_exact_mut(F8B32_BYTES)).enumerate() {
            ob[..4].copy_from_slice(&t.scale_at(r, b * F8B32_COLS).to_le_bytes());
            ob[4..].copy_from_slice(c32);
        }
    }
    Ok(())
}

/// The scale of an `F8B32` block.
#[inline]
pub fn f8b32_scale(block: &[u8]) -> f32 {
    f32::from_le_bytes([block[0], block[1], block[2], block[3]])
}

/// Decodes one `F8B32` row into `out` (tests, the embedding path).
pub fn decode_f8b32_row(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(F8B32_BYTES).zip(out.chunks_exact_mut(F8B32_COLS)) {
        let s = f8b32_scale(b);
        for (v, &code) in o.iter_mut().zip(&b[4..]) {
            *v = E4M3_TO_F32[code as usize] * s;
        }
    }
}

/// Reads an F8_E4M3 tensor's scales from the raw bytes of its `_scale_inv` tensor (F32).
pub fn scales_of(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    #[test]
    fn codes_decode_by_the_formula() {
        for code in 0..=255u8 {
            let v = E4M3_TO_F32[code as usize];
            let (s, e, m) = (code >> 7, (code >> 3) & 15, code & 7);
            if e == 15 && m == 7 {
                assert!(v.is_nan() && is_nan_code(code));
                continue;
            }
            let mag = if e == 0 { m as f64 / 8.0 * 2f64.powi(-6) } else { (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7) };
            let want = if s == 1 { -mag } else { mag };
            assert_eq!(v as f64, want, "code {code:#04x}");
            assert_eq!(v.is_sign_negative(), s == 1, "code {code:#04x}");
        }
        assert_eq!(E4M3_TO_F32[0x7e], 448.0);
        assert_eq!(E4M3_TO_F32[0x01], 2f32.powi(-9));
    }

    #[test]
    fn partial_blocks_take_their_own_scale_and_f8b32_keeps_them() {
        // 3 × 64 under [2, 32] blocks: rows 0-1 and row 2 (partial), two column blocks.
        let codes: Vec<u8> = (0..3 * 64).map(|i| (i % 0x7e) as u8).collect();
        let scales = [1.0f32, 2.0, 0.5, -4.0];
        let t = Fp8Tensor { path: Path::new("m"), name: "w", rows: 3, cols: 64, block: [2, 32], codes: &codes, scales: &scales };
        let mut out = vec![0f32; 3 * 64];
        dequantize(&t, &mut out).must();
        assert_eq!(out[2 * 64 + 40], E4M3_TO_F32[codes[2 * 64 + 40] as usize] * -4.0);
        assert_eq!(out[64 + 5], E4M3_TO_F32[codes[64 + 5] as usize]);
        let mut rec = vec![0u8; 3 * 2 * F8B32_BYTES];
        encode_f8b32(&t, &mut rec).must();
        let mut row = vec![0f32; 64];
        for r in 0..3 {
            decode_f8b32_row(&rec[r * 72..(r + 1) * 72], &mut row);
            assert_eq!(row, out[r * 64..(r + 1) * 64]);
        }
    }

    #[test]
    fn nan_codes_and_bad_scales_are_refused_by_block() {
        let mut codes = vec![0x38u8; 4 * 64];
        codes[3 * 64 + 33] = 0xff;
        let scales = [1.0f32; 4];
        let t = Fp8Tensor { path: Path::new("m"), name: "w", rows: 4, cols: 64, block: [2, 32], codes: &codes, scales: &scales };
        let e = dequantize(&t, &mut [0f32; 256]).unwrap_err().to_string();
        assert!(e.contains("tensor `w`") && e.contains("row 3, column 33") && e.contains("block (1, 1)"), "{e}");
        codes[3 * 64 + 33] = 0x38;
        let bad = [1.0f32, f32::INFINITY, 1.0, 1.0];
        let t = Fp8Tensor { path: Path::new("m"), name: "w", rows: 4, cols: 64, block: [2, 32], codes: &codes, scales: &bad };
        let e = dequantize(&t, &mut [0f32; 256]).unwrap_err().to_string();
        assert!(e.contains("w_scale_inv") && e.contains("block (0, 1)"), "{e}");
        assert!(f8b32_problem("w", 48, [16, 16]).must().contains("48 columns"));
        assert!(f8b32_problem("w", 64, [16, 16]).must().contains("weight_block_size[1]"));
    }
}
