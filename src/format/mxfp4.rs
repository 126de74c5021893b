//! gpt-oss's fused expert tensors, as Hugging Face checkpoints store them, read one expert at a
//! time into the engine's `[out, in]` matrices.
//!
//! Two storages exist. A float checkpoint (what transformers saves) holds per layer
//! `mlp.experts.gate_up_proj` `[E, hidden, 2·I]` — the module's parameter, transposed, its gate
//! and up columns interleaved (gate = even columns, up = odd) — and `mlp.experts.down_proj`
//! `[E, I, hidden]`. The released checkpoints hold the same weights as MXFP4: `*_blocks`
//! `[E, rows, cols/32, 16]` (two e2m1 codes a byte, the low nibble first) and `*_scales`
//! `[E, rows, cols/32]` (an e8m0 exponent per 32 values), with rows the output channels
//! (`2·I` interleaved gate/up, or `hidden`) and columns the inputs: already `[out, in]`.
//!
//! Every MXFP4 value is an e2m1 code times a power of two, which BF16 holds exactly (its
//! exponent range is f32's), so decoding loses nothing; an e8m0 scale of 0xFF (NaN) is refused,
//! naming the tensor, expert, row and block.

use super::dtype::DType;
use super::safetensors::{Checkpoint, SafeTensors, TensorInfo};
use crate::error::{Error, ErrorKind, Result};

/// The 16 e2m1 values (1 sign, 2 exponent, 1 mantissa bits; bias 1; code 0b0001 the
/// subnormal 0.5), indexed by code.
pub const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Values sharing one e8m0 scale.
pub const BLOCK: usize = 32;

/// The e8m0 scale 2^(s − 127), exactly (s = 0 is the f32 subnormal 2^−127); `None` for 0xFF,
/// the format's NaN.
pub fn e8m0(s: u8) -> Option<f32> {
    match s {
        0xFF => None,
        0 => Some(f32::from_bits(0x0040_0000)),
        s => Some(f32::from_bits((s as u32) << 23)),
    }
}

/// Decodes one row of MXFP4 (`out.len() / 32` blocks of 16 bytes, one scale each) into `out`.
/// On a NaN scale, the index of its block.
pub fn decode_row(blocks: &[u8], scales: &[u8], out: &mut [f32]) -> std::result::Result<(), usize> {
    for (g, (vals, (bytes, &s))) in out.chunks_exact_mut(BLOCK).zip(blocks.chunks_exact(BLOCK / 2).zip(scales)).enumerate() {
        let scale = e8m0(s).ok_or(g)?;
        for (pair, &b) in vals.chunks_exact_mut(2).zip(bytes) {
            pair[0] = E2M1[(b & 0x0F) as usize] * scale;
            pair[1] = E2M1[(b >> 4) as usize] * scale;
        }
    }
    Ok(())
}

/// How one layer's fused experts are stored.
enum Store<'a> {
    /// `gate_up_proj` `[E, hidden, 2I]` and `down_proj` `[E, I, hidden]` in F32, BF16 or F16.
    Float { gate_up: (&'a SafeTensors, &'a TensorInfo), down: (&'a SafeTensors, &'a TensorInfo) },
    /// `(blocks, scales)` of gate_up (`2I` rows of `hidden`) and of down (`hidden` rows of `I`).
    Mxfp4 { gate_up: [(&'a SafeTensors, &'a TensorInfo); 2], down: [(&'a SafeTensors, &'a TensorInfo); 2] },
}

/// One layer's fused expert tensors in a checkpoint, shape-checked.
pub struct FusedExperts<'a> {
    prefix: String,
    experts: usize,
    hidden: usize,
    inter: usize,
    store: Store<'a>,
}

impl<'a> FusedExperts<'a> {
    /// The expert tensors under `prefix` (`model.layers.{l}.mlp.experts`), float or MXFP4, for
    /// `experts` experts of width `inter` over `hidden`.
    pub fn open(ckpt: &'a Checkpoint, prefix: &str, experts: usize, hidden: usize, inter: usize) -> Result<FusedExperts<'a>> {
        let (e, h, i) = (experts as u64, hidden as u64, inter as u64);
        let get = |name: String, shape: &[u64], dtypes: &[DType]| -> Result<(&'a SafeTensors, &'a TensorInfo)> {
            let (st, t) = ckpt.get(&name).ok_or_else(|| Error::new(ErrorKind::Tensor, format!(
                "{}: tensor `{name}` is missing (not in {})", ckpt.dir.display(), ckpt.file_names())))?;
            if t.shape != shape || !dtypes.contains(&t.dtype) {
                return Err(Error::new(ErrorKind::Tensor, format!("{}: tensor `{name}` is {} {:?}, the config needs {shape:?} in {}",
                    st.path.display(), t.dtype, t.shape, dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join(" or "))));
            }
            Ok((st, t))
        };
        let float = [DType::F32, DType::BF16, DType::F16];
        let store = if ckpt.get(&format!("{prefix}.gate_up_proj_blocks")).is_some() {
            if !hidden.is_multiple_of(BLOCK) || !inter.is_multiple_of(BLOCK) {
                return Err(Error::new(ErrorKind::Tensor, format!(
                    "{}: `{prefix}` is MXFP4, but hidden_size {hidden} or intermediate_size {inter} is not a multiple of {BLOCK}",
                    ckpt.dir.display())));
            }
            let (gh, gi) = (h / BLOCK as u64, i / BLOCK as u64);
            Store::Mxfp4 {
                gate_up: [get(format!("{prefix}.gate_up_proj_blocks"), &[e, 2 * i, gh, 16], &[DType::U8])?,
                    get(format!("{prefix}.gate_up_proj_scales"), &[e, 2 * i, gh], &[DType::U8])?],
                down: [get(format!("{prefix}.down_proj_blocks"), &[e, h, gi, 16], &[DType::U8])?,
                    get(format!("{prefix}.down_proj_scales"), &[e, h, gi], &[DType::U8])?],
            }
        } else {
            let gate_up = get(format!("{prefix}.gate_up_proj"), &[e, h, 2 * i], &float)?;
            let down = get(format!("{prefix}.down_proj"), &[e, i, h], &float)?;
            if gate_up.1.dtype != down.1.dtype {
                return Err(Error::new(ErrorKind::Tensor, format!("{}: `{prefix}.gate_up_proj` is {} but `{prefix}.down_proj` is {}",
                    ckpt.dir.display(), gate_up.1.dtype, down.1.dtype)));
            }
            Store::Float { gate_up, down }
        };
        Ok(FusedExperts { prefix: prefix.to_string(), experts, hidden, inter, store })
    }

    /// The narrowest dtype holding every stored value exactly: the float source's own, BF16 for
    /// MXFP4.
    pub fn exact_dtype(&self) -> DType {
        match &self.store {
            Store::Float { gate_up, .. } => gate_up.1.dtype,
            Store::Mxfp4 { .. } => DType::BF16,
        }
    }

    /// The stored dtype (U8 for MXFP4), for the model's list of dtypes.
    pub fn stored_dtype(&self) -> DType {
        match &self.store {
            Store::Float { gate_up, .. } => gate_up.1.dtype,
            Store::Mxfp4 { .. } => DType::U8,
        }
    }

    /// Reads expert `e` into `gate` and `up` (`[I, hidden]` each) and `down` (`[hidden, I]`),
    /// row-major `[out, in]` f32.
    pub fn read(&self, e: usize, gate: &mut [f32], up: &mut [f32], down: &mut [f32]) -> Result<()> {
        let (h, i) = (self.hidden, self.inter);
        if e >= self.experts || gate.len() != i * h || up.len() != i * h || down.len() != h * i {
            return Err(Error::new(ErrorKind::Tensor, format!("`{}`: expert {e} of {} or buffers of the wrong size", self.prefix, self.experts)));
        }
        match &self.store {
            Store::Float { gate_up, down: d } => {
                // gate_up[e] is [hidden, 2I]: input c, output column 2j (gate j) and 2j + 1 (up j).
                let x = float_slice(*gate_up, e, h * 2 * i)?;
                for c in 0..h {
                    for j in 0..i {
                        gate[j * h + c] = x[c * 2 * i + 2 * j];
                        up[j * h + c] = x[c * 2 * i + 2 * j + 1];
                    }
                }
                // down[e] is [I, hidden]: input j, output o.
                let x = float_slice(*d, e, i * h)?;
                for j in 0..i {
                    for o in 0..h {
                        down[o * i + j] = x[j * h + o];
                    }
                }
            }
            Store::Mxfp4 { gate_up, down: d } => {
                let mut row = vec![0.0f32; h.max(i)];
                let (blocks, scales) = mxfp4_slices(gate_up, e, 2 * i, h)?;
                for r in 0..2 * i {
                    decode_checked(&blocks, &scales, r, &mut row[..h], gate_up, e)?;
                    let dst = if r % 2 == 0 { &mut gate[..] } else { &mut up[..] };
                    dst[(r / 2) * h..(r / 2 + 1) * h].copy_from_slice(&row[..h]);
                }
                let (blocks, scales) = mxfp4_slices(d, e, h, i)?;
                for r in 0..h {
                    decode_checked(&blocks, &scales, r, &mut down[r * i..(r + 1) * i], d, e)?;
                }
            }
        }
        Ok(())
    }
}

impl FusedExperts<'_> {
    /// Reads expert `e` straight into record matrices stored as [`FusedExperts::exact_dtype`]
    /// (`gate`, `up`: `I` rows of `hidden`; `down`: `hidden` rows of `I`), one source row at a
    /// time: besides the record it holds one row, so loading a bank adds no expert-sized buffer
    /// to the peak the memory plan bounds.
    pub fn read_exact_into(&self, e: usize, gate: &mut [u8], up: &mut [u8], down: &mut [u8]) -> Result<()> {
        let (h, i) = (self.hidden, self.inter);
        let size = self.exact_dtype().element_bytes().unwrap_or(2);
        if e >= self.experts || gate.len() != i * h * size || up.len() != i * h * size || down.len() != h * i * size {
            return Err(Error::new(ErrorKind::Tensor, format!("`{}`: expert {e} of {} or records of the wrong size", self.prefix, self.experts)));
        }
        let read = |(st, t): (&SafeTensors, &TensorInfo), at: usize, buf: &mut [u8]| {
            crate::sys::read_exact_at(&st.file, &st.path, buf, t.offset + at as u64).map_err(|err| err.context(format!("tensor `{}`", t.name)))
        };
        match &self.store {
            Store::Float { gate_up, down: d } => {
                let mut row = vec![0u8; (2 * i).max(h) * size];
                // Input c of gate_up[e] ([hidden, 2I]): gate j is column 2j, up j column 2j + 1.
                for c in 0..h {
                    let row = &mut row[..2 * i * size];
                    read(*gate_up, (e * h + c) * 2 * i * size, row)?;
                    for j in 0..i {
                        let at = (j * h + c) * size;
                        gate[at..at + size].copy_from_slice(&row[2 * j * size..(2 * j + 1) * size]);
                        up[at..at + size].copy_from_slice(&row[(2 * j + 1) * size..(2 * j + 2) * size]);
                    }
                }
                // Input j of down[e] ([I, hidden]) is column j of the record's [hidden, I].
                for j in 0..i {
                    let row = &mut row[..h * size];
                    read(*d, (e * i + j) * h * size, row)?;
                    for o in 0..h {
                        down[(o * i + j) * size..(o * i + j + 1) * size].copy_from_slice(&row[o * size..(o + 1) * size]);
                    }
                }
            }
            Store::Mxfp4 { gate_up, down: d } => {
                let mut values = vec![0.0f32; h.max(i)];
                let mut codes = vec![0u8; h.max(i) / 2 + h.max(i) / BLOCK];
                let mut decode = |parts: &[(&SafeTensors, &TensorInfo); 2], r: usize, rows: usize, cols: usize, out: &mut [u8]| -> Result<()> {
                    let (nb, ns) = (cols / 2, cols / BLOCK);
                    let (blocks, scales) = codes[..nb + ns].split_at_mut(nb);
                    read(parts[0], (e * rows + r) * nb, blocks)?;
                    read(parts[1], (e * rows + r) * ns, scales)?;
                    decode_row(blocks, scales, &mut values[..cols]).map_err(|b| Error::format(&parts[1].0.path, format!(
                        "tensor `{}`: expert {e}, row {r}, block {b}: the e8m0 scale is 0xFF (NaN)", parts[1].1.name)))?;
                    // Every MXFP4 value is a BF16 value: the narrowing is exact.
                    for (o, v) in out.chunks_exact_mut(2).zip(&values[..cols]) {
                        o.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
                    }
                    Ok(())
                };
                for r in 0..2 * i {
                    let dst = if r % 2 == 0 { &mut gate[..] } else { &mut up[..] };
                    decode(gate_up, r, 2 * i, h, &mut dst[(r / 2) * h * 2..(r / 2 + 1) * h * 2])?;
                }
                for r in 0..h {
                    decode(d, r, h, i, &mut down[r * i * 2..(r + 1) * i * 2])?;
                }
            }
        }
        Ok(())
    }

    /// Copies expert `e`'s MXFP4 codes and scales into record matrices of 17-byte blocks (the
    /// scale byte, then the block's 16 code bytes): `gate` and `up` (`I` rows of `hidden`) from
    /// the interleaved rows of gate_up, `down` (`hidden` rows of `I`). A NaN scale is refused as
    /// in [`FusedExperts::read`]; a float source is refused (mxfp4 copies, it does not quantize).
    pub fn read_mxfp4(&self, e: usize, gate: &mut [u8], up: &mut [u8], down: &mut [u8]) -> Result<()> {
        let (h, i) = (self.hidden, self.inter);
        let Store::Mxfp4 { gate_up, down: d } = &self.store else {
            return Err(Error::unsupported(format!(
                "`{}` is stored as floats: the mxfp4 expert encoding copies MXFP4 sources (choose bf16, q8 or q4)", self.prefix)));
        };
        let rb = |cols: usize| cols / BLOCK * 17;
        if e >= self.experts || gate.len() != i * rb(h) || up.len() != i * rb(h) || down.len() != h * rb(i) {
            return Err(Error::new(ErrorKind::Tensor, format!("`{}`: expert {e} of {} or records of the wrong size", self.prefix, self.experts)));
        }
        let (blocks, scales) = mxfp4_slices(gate_up, e, 2 * i, h)?;
        for r in 0..2 * i {
            let dst = if r % 2 == 0 { &mut gate[..] } else { &mut up[..] };
            copy_row(&blocks, &scales, r, h, &mut dst[(r / 2) * rb(h)..(r / 2 + 1) * rb(h)], gate_up, e)?;
        }
        let (blocks, scales) = mxfp4_slices(d, e, h, i)?;
        for r in 0..h {
            copy_row(&blocks, &scales, r, i, &mut down[r * rb(i)..(r + 1) * rb(i)], d, e)?;
        }
        Ok(())
    }
}

/// Row `r` (`cols` values) of an MXFP4 matrix as 17-byte record blocks, refusing a NaN scale.
fn copy_row(blocks: &[u8], scales: &[u8], r: usize, cols: usize, out: &mut [u8], parts: &[(&SafeTensors, &TensorInfo); 2], e: usize) -> Result<()> {
    let g = cols / BLOCK;
    for (b, o) in out.chunks_exact_mut(17).enumerate() {
        let s = scales[r * g + b];
        if s == 0xFF {
            let (st, t) = parts[1];
            return Err(Error::format(&st.path, format!("tensor `{}`: expert {e}, row {r}, block {b}: the e8m0 scale is 0xFF (NaN)", t.name)));
        }
        o[0] = s;
        o[1..].copy_from_slice(&blocks[(r * g + b) * 16..(r * g + b + 1) * 16]);
    }
    Ok(())
}

/// Reads `len` elements of expert `e` (a slice of dim 0) of a float tensor, widened to f32.
fn float_slice((st, t): (&SafeTensors, &TensorInfo), e: usize, len: usize) -> Result<Vec<f32>> {
    let size = t.dtype.element_bytes().unwrap_or(4);
    let mut raw = vec![0u8; len * size];
    let at = t.offset + (e * len * size) as u64;
    crate::sys::read_exact_at(&st.file, &st.path, &mut raw, at).map_err(|err| err.context(format!("tensor `{}`", t.name)))?;
    Ok(raw.chunks_exact(size).map(|b| match t.dtype {
        DType::BF16 => f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16),
        DType::F16 => half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    }).collect())
}

/// Expert `e`'s blocks and scales of an MXFP4 matrix of `rows` × `cols`.
fn mxfp4_slices(parts: &[(&SafeTensors, &TensorInfo); 2], e: usize, rows: usize, cols: usize) -> Result<(Vec<u8>, Vec<u8>)> {
    let lens = [rows * cols / 2, rows * cols / BLOCK];
    let mut out = [Vec::new(), Vec::new()];
    for ((st, t), (buf, len)) in parts.iter().zip(out.iter_mut().zip(lens)) {
        *buf = vec![0u8; len];
        crate::sys::read_exact_at(&st.file, &st.path, buf, t.offset + (e * len) as u64)
            .map_err(|err| err.context(format!("tensor `{}`", t.name)))?;
    }
    let [b, s] = out;
    Ok((b, s))
}

fn decode_checked(blocks: &[u8], scales: &[u8], r: usize, out: &mut [f32], parts: &[(&SafeTensors, &TensorInfo); 2], e: usize) -> Result<()> {
    let g = out.len() / BLOCK;
    decode_row(&blocks[r * g * 16..(r + 1) * g * 16], &scales[r * g..(r + 1) * g], out).map_err(|b| {
        let (st, t) = parts[1];
        Error::format(&st.path, format!("tensor `{}`: expert {e}, row {r}, block {b}: the e8m0 scale is 0xFF (NaN)", t.name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    /// Every e2m1 code against its bit fields, and e8m0 across its range.
    #[test]
    fn every_code_and_scale_decodes_exactly() {
        for code in 0..16u8 {
            let (sign, exp, man) = ((code >> 3) & 1, (code >> 1) & 3, code & 1);
            let mag = if exp == 0 { 0.5 * man as f32 } else { (1.0 + 0.5 * man as f32) * 2f32.powi(exp as i32 - 1) };
            let want = if sign == 1 { -mag } else { mag };
            assert_eq!(E2M1[code as usize].to_bits(), want.to_bits(), "code {code:#06b}");
        }
        assert_eq!(e8m0(127), Some(1.0));
        assert_eq!(e8m0(128), Some(2.0));
        assert_eq!(e8m0(1), Some(2f32.powi(-126)));
        assert_eq!(e8m0(0), Some(2f32.powi(-127)));
        assert_eq!(e8m0(254), Some(2f32.powi(127)));
        assert_eq!(e8m0(255), None);
    }

    #[test]
    fn a_row_decodes_low_nibble_first_and_refuses_a_nan_scale() {
        let mut blocks = [0u8; 32];
        blocks[0] = 0x71; // values 0: code 1 (0.5), 1: code 7 (6.0)
        blocks[16] = 0xF2; // block 1, values 0: 1.0, 1: -6.0
        let mut out = [0.0f32; 64];
        decode_row(&blocks, &[128, 126], &mut out).must();
        assert_eq!(&out[..2], &[1.0, 12.0]);
        assert_eq!(&out[32..34], &[0.5, -3.0]);
        assert_eq!(decode_row(&blocks, &[127, 0xFF], &mut out), Err(1));
    }
}
