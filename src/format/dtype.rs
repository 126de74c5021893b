//! Element types of tensors on disk: the safetensors dtypes, and the two block-quantized widths
//! of the Q4B32/Q8B32 format (seed 000), whose size is per block of 32 weights, not per element.

/// A tensor element type as named in a safetensors header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    Bool,
    F8E4M3,
    F8E5M2,
    /// 18-byte blocks: binary16 scale + 32 signed nibbles (seed 000, "The block").
    Q4B32,
    /// 34-byte blocks: binary16 scale + 32 signed bytes.
    Q8B32,
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
        }
    }

    /// Bytes per block for the quantized widths (seed 000: 18 and 34), `None` otherwise.
    pub fn block_bytes(self) -> Option<usize> {
        match self {
            DType::Q4B32 => Some(18),
            DType::Q8B32 => Some(34),
            _ => None,
        }
    }

    /// True for the two block-quantized widths.
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
            DType::Q4B32 | DType::Q8B32 => return None,
        })
    }

    /// True for the dtypes the engine computes with (weights are widened to f32 in the kernels).
    pub fn is_compute(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::Q4B32 | DType::Q8B32)
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
