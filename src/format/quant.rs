//! The Q4B32 / Q8B32 quantized checkpoint (seed 000, `docs/QUANT_FORMAT.md`): the block codec
//! (f32 weights ↔ 18- or 34-byte blocks) and the rules a reader enforces on a quantized
//! safetensors file before any of its bytes are used.
//!
//! A block is 32 consecutive weights of one row: a binary16 scale (little endian), then the
//! payload — 16 bytes of two's complement nibbles (low nibble = even position) for Q4B32, or 32
//! signed bytes for Q8B32. The decoded weight is `q * scale`.
//!
//! ## Rounding: half away from zero
//! The seed writes `q = round(w / f16_to_f32(scale))` without naming the tie rule. We round
//! half away from zero (Rust's `f32::round`, C's `roundf`) because (1) the seed's own tool is a
//! Rust program whose `round` is exactly that, and (2) the seed says the layout is GGML Q8_0's,
//! whose reference quantizer (`quantize_row_q8_0_ref`, and gguf-py's `np_roundf` that copies it)
//! also rounds half away from zero; with the same tie rule the only bytes in which we differ
//! from GGML are the ones its different scale rule explains (GGML divides by the unrounded f32
//! scale, we by the binary16 one; see `tests/quant.rs`, `q8_bytes_against_ggml_q8_0`).
//! Half-to-even (numpy's `round`) would differ on exact ties, which occur whenever a weight is
//! an odd multiple of half the scale — common in integer-valued test matrices.

use super::dtype::BLOCK;
use super::safetensors::{SafeTensors, TensorInfo};

// The width, its metadata and the header rules sit below the safetensors reader (which
// enforces them on every file it opens); they are re-exported here, where a reader of the
// format looks for them.
pub use super::dtype::{shape_problem, Width, META_BLOCK, META_SCALE};
pub use super::safetensors::check_header;
use crate::error::{Error, Result};
use std::path::Path;

/// Why a block of weights cannot be encoded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BlockError {
    /// The weight at this position of the block is NaN or infinite.
    NonFinite {
        /// Its position in the block, 0..32.
        index: usize,
        /// The value.
        value: f32,
    },
    /// max|w| / levels is beyond binary16's largest finite value (65504).
    ScaleOverflow {
        /// The block's largest |w|.
        max_abs: f32,
    },
}

impl std::fmt::Display for BlockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockError::NonFinite { index, value } => write!(f, "weight {index} of the block is {value}, not finite"),
            BlockError::ScaleOverflow { max_abs } => {
                write!(f, "the largest |weight| {max_abs} makes a scale beyond binary16's 65504")
            }
        }
    }
}

#[inline]
fn f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

#[inline]
fn f16_value(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// True when `bits` is a finite binary16 (exponent field not all ones).
#[inline]
pub fn is_finite_f16(bits: u16) -> bool {
    bits & 0x7c00 != 0x7c00
}

/// The binary16 scale of a block: f32_to_f16(max|w| / levels), rounded to nearest even.
pub fn block_scale(width: Width, w: &[f32]) -> std::result::Result<u16, BlockError> {
    let mut max_abs = 0.0f32;
    for (index, &v) in w.iter().enumerate() {
        if !v.is_finite() {
            return Err(BlockError::NonFinite { index, value: v });
        }
        max_abs = max_abs.max(v.abs());
    }
    let bits = f16_bits(max_abs / width.levels());
    if !is_finite_f16(bits) {
        return Err(BlockError::ScaleOverflow { max_abs });
    }
    Ok(bits)
}

/// The level of weight `v` under `scale` (the decoded binary16 value): round half away from
/// zero, then clamp to the width's range. A zero scale (an all-zero block, or one whose
/// largest weight is below binary16's smallest subnormal × levels) gives level 0: the block
/// decodes to zeros, as the all-zero rule of the seed says.
#[inline]
pub fn level(width: Width, v: f32, scale: f32) -> i8 {
    if scale == 0.0 {
        return 0;
    }
    (v / scale).round().clamp(width.lowest(), width.levels()) as i8
}

/// Encodes 32 weights into one block (`out` is 18 or 34 bytes).
pub fn encode_block(width: Width, w: &[f32], out: &mut [u8]) -> std::result::Result<(), BlockError> {
    debug_assert!(w.len() == BLOCK && out.len() == width.block_bytes());
    let bits = block_scale(width, w)?;
    let scale = f16_value(bits);
    out[..2].copy_from_slice(&bits.to_le_bytes());
    match width {
        Width::Q8 => {
            for (o, &v) in out[2..].iter_mut().zip(w) {
                *o = level(width, v, scale) as u8;
            }
        }
        Width::Q4 => {
            // Byte j holds positions 2j (low nibble) and 2j+1 (high nibble): seed 000, "The payload".
            for (o, pair) in out[2..].iter_mut().zip(w.chunks_exact(2)) {
                let lo = level(width, pair[0], scale) as u8 & 0x0f;
                let hi = level(width, pair[1], scale) as u8 & 0x0f;
                *o = lo | (hi << 4);
            }
        }
    }
    Ok(())
}

/// Encodes one row (`w.len()` a multiple of 32) into `out` (`w.len() / 32` blocks). On failure
/// returns the index of the block and the reason.
pub fn encode_row(width: Width, w: &[f32], out: &mut [u8]) -> std::result::Result<(), (usize, BlockError)> {
    let bb = width.block_bytes();
    for (b, (wb, ob)) in w.chunks_exact(BLOCK).zip(out.chunks_exact_mut(bb)).enumerate() {
        encode_block(width, wb, ob).map_err(|e| (b, e))?;
    }
    Ok(())
}

/// The signed level at position `k` of a block.
#[inline]
pub fn block_level(width: Width, block: &[u8], k: usize) -> i8 {
    match width {
        Width::Q8 => block[2 + k] as i8,
        Width::Q4 => {
            let nibble = (block[2 + k / 2] >> (4 * (k % 2))) & 0x0f;
            ((nibble ^ 8) as i8) - 8
        }
    }
}

/// Decodes one block into 32 weights (`q * scale` in f32).
pub fn decode_block(width: Width, block: &[u8], out: &mut [f32]) {
    let scale = f16_value(u16::from_le_bytes([block[0], block[1]]));
    for (k, o) in out.iter_mut().enumerate().take(BLOCK) {
        *o = block_level(width, block, k) as f32 * scale;
    }
}

/// Decodes a row of blocks into `out` (32 weights per block).
pub fn decode_row(width: Width, row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(width.block_bytes()).zip(out.chunks_exact_mut(BLOCK)) {
        decode_block(width, b, o);
    }
}

/// Checks that every block scale in `data` is a finite binary16. `data` holds whole rows of
/// the quantized tensor `t`, starting at row `first_row`; the error names the file, the tensor,
/// the field, the row, the block and the byte offset in the file.
pub fn check_scales(path: &Path, t: &TensorInfo, first_row: u64, data: &[u8]) -> Result<()> {
    let Some(width) = Width::from_dtype(t.dtype) else { return Ok(()) };
    let [_, cols] = t.shape[..] else { return Ok(()) };
    let bb = width.block_bytes();
    let per_row = (cols / BLOCK as u64) as usize;
    if per_row == 0 {
        return Ok(());
    }
    for (i, block) in data.chunks_exact(bb).enumerate() {
        let bits = u16::from_le_bytes([block[0], block[1]]);
        if !is_finite_f16(bits) {
            let row = first_row + (i / per_row) as u64;
            let b = i % per_row;
            let offset = t.offset + (row * per_row as u64 + b as u64) * bb as u64;
            let value = if bits & 0x03ff == 0 { "infinite" } else { "NaN" };
            return Err(Error::format(path, format!(
                "tensor `{}`: field `scale` of row {row}, block {b} (byte {offset}) is 0x{bits:04x} ({value}), \
                 not a finite binary16", t.name)));
        }
    }
    Ok(())
}

/// Validates a whole file: the header rules (already applied by [`SafeTensors::open`]) and
/// every block scale, read tensor by tensor in pieces of at most 4 MiB. Returns the width.
pub fn validate(st: &SafeTensors) -> Result<Option<Width>> {
    let width = check_header(&st.path, &st.tensors, &st.metadata)?;
    for t in st.tensors.iter().filter(|t| t.dtype.is_quantized()) {
        check_tensor_scales(st, t, 4 << 20)?;
    }
    Ok(width)
}

/// Checks every block scale of the 2-D tensor `t` of `st`, reading it in pieces of whole rows
/// of at most `piece` bytes (one row when a row is larger).
pub fn check_tensor_scales(st: &SafeTensors, t: &TensorInfo, piece: u64) -> Result<()> {
    let row_bytes = match t.shape[..] {
        [_, cols] if t.dtype.is_quantized() => t.dtype.row_bytes(cols).unwrap_or(0),
        _ => 0,
    };
    if row_bytes == 0 {
        return Ok(());
    }
    let rows_per_piece = (piece / row_bytes).max(1);
    let mut buf = Vec::new();
    let mut row = 0u64;
    while row < t.shape[0] {
        let n = rows_per_piece.min(t.shape[0] - row);
        buf.resize((n * row_bytes) as usize, 0);
        crate::sys::read_exact_at(&st.file, &st.path, &mut buf, t.offset + row * row_bytes)
            .map_err(|e| e.context(format!("tensor `{}`", t.name)))?;
        check_scales(&st.path, t, row, &buf)?;
        row += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dtype::DType;
    use crate::test_util::Must;

    fn roundtrip(width: Width, w: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let mut block = vec![0u8; width.block_bytes()];
        encode_block(width, w, &mut block).must();
        let mut out = vec![0.0; BLOCK];
        decode_block(width, &block, &mut out);
        (block, out)
    }

    #[test]
    fn q4_integers_with_a_seven_are_exact_and_packed_low_nibble_first() {
        let w: Vec<f32> = (0..32).map(|i| [7.0, -7.0, 0.0, 3.0, -1.0, 5.0, -6.0, 2.0][i % 8]).collect();
        let (block, out) = roundtrip(Width::Q4, &w);
        assert_eq!(&block[..2], &half::f16::ONE.to_bits().to_le_bytes());
        assert_eq!(out, w);
        // Positions 0 (=7) and 1 (=-7 → 0b1001) share byte 2: low nibble is the even position.
        assert_eq!(block[2], 0x97);
        // Positions 2 (=0) and 3 (=3).
        assert_eq!(block[3], 0x30);
    }

    /// The worked example of `docs/QUANT_FORMAT.md`, byte for byte.
    #[test]
    fn documented_example_blocks() {
        let w: Vec<f32> = (0..32).map(|i| [7.0, -7.0, 0.0, 3.0, -1.0, 5.0, -6.0, 2.0][i % 8]).collect();
        let mut q4 = [0u8; 18];
        encode_block(Width::Q4, &w, &mut q4).must();
        let mut want = vec![0x00, 0x3c];
        for _ in 0..4 {
            want.extend_from_slice(&[0x97, 0x30, 0x5f, 0x2a]);
        }
        assert_eq!(q4.to_vec(), want);
        let mut q8 = [0u8; 34];
        encode_block(Width::Q8, &w, &mut q8).must();
        let mut want = vec![0x0e, 0x2b];
        for _ in 0..4 {
            want.extend_from_slice(&[0x7f, 0x81, 0x00, 0x36, 0xee, 0x5b, 0x93, 0x24]);
        }
        assert_eq!(q8.to_vec(), want);
    }

    #[test]
    fn q8_levels_and_scale() {
        let w: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect(); // -16..=15
        let (block, out) = roundtrip(Width::Q8, &w);
        let scale = half::f16::from_f32(16.0 / 127.0);
        assert_eq!(&block[..2], &scale.to_bits().to_le_bytes());
        assert_eq!(block[2] as i8, -127); // -16 / scale rounds to -127
        for (a, b) in out.iter().zip(&w) {
            assert!((a - b).abs() <= scale.to_f32() / 2.0 + 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn all_zero_block_has_zero_scale_and_payload() {
        for width in [Width::Q4, Width::Q8] {
            let (block, out) = roundtrip(width, &[0.0; 32]);
            assert!(block.iter().all(|&b| b == 0), "{width:?}");
            assert!(out.iter().all(|&v| v == 0.0));
        }
        // Weights so small the binary16 scale underflows to 0 also give a zero block.
        let (block, _) = roundtrip(Width::Q8, &[1e-12; 32]);
        assert!(block.iter().all(|&b| b == 0));
    }

    #[test]
    fn ties_round_half_away_from_zero_and_levels_clamp() {
        // Scale 1 (the block's max is 7): 2.5 → 3, -2.5 → -3, 0.5 → 1, -0.5 → -1.
        let mut w = [0.0f32; 32];
        w[0] = 7.0;
        w[1] = 2.5;
        w[2] = -2.5;
        w[3] = 0.5;
        w[4] = -0.5;
        let (block, _) = roundtrip(Width::Q4, &w);
        let lv: Vec<i8> = (0..5).map(|k| block_level(Width::Q4, &block, k)).collect();
        assert_eq!(lv, [7, 3, -3, 1, -1]);
        assert_eq!(level(Width::Q4, -9.0, 1.0), -8);
        assert_eq!(level(Width::Q4, 9.0, 1.0), 7);
        assert_eq!(level(Width::Q8, -200.0, 1.0), -128);
        assert_eq!(level(Width::Q8, 127.5, 1.0), 127);
    }

    #[test]
    fn unencodable_blocks_are_refused() {
        let mut w = [0.5f32; 32];
        w[9] = f32::NAN;
        assert!(matches!(block_scale(Width::Q8, &w), Err(BlockError::NonFinite { index: 9, .. })));
        w[9] = 1e6;
        assert!(matches!(block_scale(Width::Q4, &w), Err(BlockError::ScaleOverflow { .. })));
        assert!(block_scale(Width::Q8, &w).is_ok()); // 1e6 / 127 fits binary16
    }

    #[test]
    fn shape_problems_name_the_field() {
        assert!(shape_problem(DType::Q4B32, &[4, 64]).is_none());
        assert!(shape_problem(DType::F32, &[4, 3]).is_none());
        assert!(shape_problem(DType::Q4B32, &[64, 172]).must().contains("172 columns"));
        assert!(shape_problem(DType::Q8B32, &[64]).must().contains("1 dimensions"));
        assert!(shape_problem(DType::Q8B32, &[2, 2, 32]).must().contains("3 dimensions"));
    }

    #[test]
    fn scale_errors_name_row_and_block() {
        let t = TensorInfo { name: "w".into(), dtype: DType::Q8B32, shape: vec![3, 64], offset: 100, len: 3 * 2 * 34 };
        let mut data = vec![0u8; t.len as usize];
        check_scales(Path::new("f"), &t, 0, &data).must();
        // Row 2, block 1 is the sixth block.
        data[5 * 34..5 * 34 + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
        let e = check_scales(Path::new("f"), &t, 0, &data).unwrap_err().to_string();
        assert!(e.contains("tensor `w`") && e.contains("`scale`") && e.contains("row 2, block 1"), "{e}");
        assert!(e.contains(&format!("byte {}", 100 + 5 * 34)) && e.contains("NaN"), "{e}");
        // The same bytes seen as rows 10.. of a larger tensor report row 12.
        let e = check_scales(Path::new("f"), &t, 10, &data).unwrap_err().to_string();
        assert!(e.contains("row 12, block 1"), "{e}");
    }
}
