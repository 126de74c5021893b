//! Element types of tensors on disk: the safetensors dtypes, and the two block-quantized widths
//! of the Q4B32/Q8B32 format (seed 000), whose size is per block of 32 weights, not per element.

/// A tensor element type as named in a safetensors header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (binary32's top half).
    BF16,
    /// IEEE binary64.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Signed 32-bit integer.
    I32,
    /// Signed 16-bit integer.
    I16,
    /// Signed byte.
    I8,
    /// Unsigned 64-bit integer.
    U64,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned byte.
    U8,
    /// One byte, 0 or 1.
    Bool,
    /// 8-bit float, 4 exponent and 3 mantissa bits (`F8_E4M3`).
    F8E4M3,
    /// 8-bit float, 5 exponent and 2 mantissa bits (`F8_E5M2`).
    F8E5M2,
    /// 18-byte blocks: binary16 scale + 32 signed nibbles (seed 000, "The block").
    Q4B32,
    /// 34-byte blocks: binary16 scale + 32 signed bytes.
    Q8B32,
    /// 36-byte blocks: f32 scale + 32 e4m3fn codes, the container's record encoding of FP8
    /// block-scaled experts (`format::fp8`). Not a safetensors dtype.
    F8B32,
    /// 17-byte blocks: an e8m0 scale byte + 32 e2m1 codes, low nibble first (gpt-oss's MXFP4
    /// experts kept as they ship, 4.25 bits a weight). A container record encoding only: no
    /// safetensors dtype string names it.
    MXFP4,
}

/// Weights per quantized block.
pub const BLOCK: usize = 32;

impl DType {
    /// Parses the dtype string of a safetensors header entry.
    pub fn from_name(name: &str) -> Option<DType> {
        Some(match name {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "F64" => DType::F64,
            "I64" => DType::I64,
            "I32" => DType::I32,
            "I16" => DType::I16,
            "I8" => DType::I8,
            "U64" => DType::U64,
            "U32" => DType::U32,
            "U16" => DType::U16,
            "U8" => DType::U8,
            "BOOL" => DType::Bool,
            "F8_E4M3" => DType::F8E4M3,
            "F8_E5M2" => DType::F8E5M2,
            "Q4B32" => DType::Q4B32,
            "Q8B32" => DType::Q8B32,
            "F8B32" => DType::F8B32,
            _ => return None,
        })
    }

    /// The header name of the dtype.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F64 => "F64",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U64 => "U64",
            DType::U32 => "U32",
            DType::U16 => "U16",
            DType::U8 => "U8",
            DType::Bool => "BOOL",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::Q4B32 => "Q4B32",
            DType::Q8B32 => "Q8B32",
            DType::F8B32 => "F8B32",
            DType::MXFP4 => "MXFP4",
        }
    }

    /// Bytes per block for the quantized widths (seed 000: 18 and 34), `None` otherwise.
    pub fn block_bytes(self) -> Option<usize> {
        match self {
            DType::Q4B32 => Some(18),
            DType::Q8B32 => Some(34),
            DType::F8B32 => Some(super::fp8::F8B32_BYTES),
            DType::MXFP4 => Some(17),
            _ => None,
        }
    }

    /// True for the block-quantized dtypes (Q4B32, Q8B32, and the record-only F8B32 and MXFP4).
    pub fn is_quantized(self) -> bool {
        self.block_bytes().is_some()
    }

    /// Bytes per element for element-wise dtypes, `None` for the block widths.
    pub fn element_bytes(self) -> Option<usize> {
        Some(match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::Q4B32 | DType::Q8B32 | DType::F8B32 | DType::MXFP4 => return None,
        })
    }

    /// True for the dtypes the engine computes with (weights are widened to f32 in the kernels).
    pub fn is_compute(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::Q4B32 | DType::Q8B32 | DType::F8B32 | DType::MXFP4)
    }

    /// Bytes of one row of `cols` elements, or `None` when `cols` does not fit the dtype
    /// (a quantized row must be whole blocks) or the size overflows.
    pub fn row_bytes(self, cols: u64) -> Option<u64> {
        match self.block_bytes() {
            Some(b) => {
                if !cols.is_multiple_of(BLOCK as u64) {
                    return None;
                }
                (cols / BLOCK as u64).checked_mul(b as u64)
            }
            None => cols.checked_mul(self.element_bytes()? as u64),
        }
    }

    /// Bytes of a tensor of `shape`, or `None` on overflow or a shape the dtype cannot hold
    /// (block widths are two-dimensional with whole blocks per row).
    pub fn tensor_bytes(self, shape: &[u64]) -> Option<u64> {
        if self.is_quantized() {
            let [rows, cols] = shape else { return None };
            return rows.checked_mul(self.row_bytes(*cols)?);
        }
        let n = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        n.checked_mul(self.element_bytes()? as u64)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One of the two widths of the format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Width {
    /// 4-bit weights in −8..=7, 18-byte blocks: the size format (the tool's default).
    Q4,
    /// 8-bit weights in −128..=127, 34-byte blocks: the fidelity format.
    Q8,
}

/// The `block` value of `__metadata__`.
pub const META_BLOCK: &str = "32";
/// The `scale` value of `__metadata__`.
pub const META_SCALE: &str = "f16";

impl Width {
    /// 4 → Q4, 8 → Q8.
    pub fn from_bits(bits: u32) -> Option<Width> {
        match bits {
            4 => Some(Width::Q4),
            8 => Some(Width::Q8),
            _ => None,
        }
    }

    /// The width of a tensor dtype, `None` for the element-wise dtypes.
    pub fn from_dtype(dtype: DType) -> Option<Width> {
        match dtype {
            DType::Q4B32 => Some(Width::Q4),
            DType::Q8B32 => Some(Width::Q8),
            _ => None,
        }
    }

    /// The width a `__metadata__.format` value declares.
    pub fn from_format(format: &str) -> Option<Width> {
        match format {
            "rabbit-q4b32" => Some(Width::Q4),
            "rabbit-q8b32" => Some(Width::Q8),
            _ => None,
        }
    }

    /// Bits per weight value (before the block's scale).
    pub fn bits(self) -> u32 {
        match self {
            Width::Q4 => 4,
            Width::Q8 => 8,
        }
    }

    /// The block dtype of this width.
    pub fn dtype(self) -> DType {
        match self {
            Width::Q4 => DType::Q4B32,
            Width::Q8 => DType::Q8B32,
        }
    }

    /// The `__metadata__.format` value.
    pub fn format_name(self) -> &'static str {
        match self {
            Width::Q4 => "rabbit-q4b32",
            Width::Q8 => "rabbit-q8b32",
        }
    }

    /// Bytes per block of 32 weights: 18 or 34.
    pub fn block_bytes(self) -> usize {
        match self {
            Width::Q4 => 18,
            Width::Q8 => 34,
        }
    }

    /// The largest positive level: the scale is max|w| / levels (seed 000, "The scale").
    pub fn levels(self) -> f32 {
        match self {
            Width::Q4 => 7.0,
            Width::Q8 => 127.0,
        }
    }

    /// The most negative level (the range is −levels−1 ..= levels).
    pub fn lowest(self) -> f32 {
        -self.levels() - 1.0
    }

    /// The `__metadata__` a file of this width carries.
    pub fn metadata(self) -> Vec<(String, String)> {
        vec![
            ("format".to_string(), self.format_name().to_string()),
            ("block".to_string(), META_BLOCK.to_string()),
            ("scale".to_string(), META_SCALE.to_string()),
        ]
    }
}

/// Why the shape of a tensor of a quantized dtype cannot hold blocks, for the reader's error
/// (`None` when it can).
pub fn shape_problem(dtype: DType, shape: &[u64]) -> Option<String> {
    dtype.block_bytes()?;
    match shape {
        [_, cols] if cols % BLOCK as u64 != 0 => Some(format!(
            "field `shape` {shape:?}: {cols} columns are not a multiple of the {BLOCK}-weight block \
             ({dtype} has no partial block)")),
        [rows, cols] if dtype.tensor_bytes(&[*rows, *cols]).is_none() => {
            Some(format!("field `shape` {shape:?}: the size of {dtype} data overflows"))
        }
        [_, _] => None,
        _ => Some(format!("field `shape` {shape:?} has {} dimensions; a {dtype} tensor is 2-D (rows, columns)",
            shape.len())),
    }
}
