//! The numeric loops: matrix × vectors for every weight dtype, and the small vector operations
//! of a transformer layer. The implementation is chosen once, at model open, from the CPU's
//! features (or forced to the scalar reference by a config switch).
//!
//! Weights stay in their stored dtype (F32, BF16, F16, Q8B32, Q4B32) and are widened to f32
//! inside the dot product; activations are f32 throughout.

pub mod attention;
pub mod pool;
pub mod scalar;

use crate::format::dtype::DType;
pub use pool::Pool;
use scalar::RowsFn;

/// A borrowed row-major weight matrix in its stored dtype.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl MatRef<'_> {
    /// Bytes per row (whole blocks for the quantized widths).
    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols as u64).unwrap_or(0) as usize
    }
}

/// Which instruction set the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
        }
    }
}

/// The kernel table, chosen once.
#[derive(Clone, Copy)]
pub struct Kernels {
    isa: Isa,
    rows: [RowsFn; 5],
}

fn slot(dtype: DType) -> Option<usize> {
    Some(match dtype {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
        DType::Q8B32 => 3,
        DType::Q4B32 => 4,
        _ => return None,
    })
}

/// A raw output pointer that several pool participants write disjoint elements through.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: participants write disjoint index sets (their own rows); the pool joins them all
// before the buffer is used again.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl Kernels {
    /// The best kernels for this CPU, or the scalar reference when `force_scalar`.
    pub fn select(force_scalar: bool) -> Kernels {
        let _ = force_scalar;
        Kernels::scalar()
    }

    /// The scalar reference kernels.
    pub fn scalar() -> Kernels {
        Kernels {
            isa: Isa::Scalar,
            rows: [scalar::rows_f32, scalar::rows_bf16, scalar::rows_f16, scalar::rows_q8b32, scalar::rows_q4b32],
        }
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// y[t][r] = Σ_c w[r][c] · x[t][c] for the `n` vectors of `x` (n × w.cols) into `y`
    /// (n × w.rows), rows split across the pool. Results do not depend on the thread count.
    ///
    /// Panics if the slices are too short or the dtype is not a compute dtype: both are
    /// programming errors, checked when weights are loaded.
    pub fn matmul(&self, pool: &Pool, w: MatRef, x: &[f32], n: usize, y: &mut [f32]) {
        assert!(x.len() >= n * w.cols && y.len() >= n * w.rows, "matmul: buffers too short");
        assert!(w.data.len() >= w.rows * w.row_bytes(), "matmul: weight data too short");
        let f = self.rows[slot(w.dtype).expect("matmul: not a compute dtype")];
        let out = OutPtr(y.as_mut_ptr());
        let threads = pool.threads();
        // Small products are not worth waking the workers.
        if threads == 1 || w.rows * w.cols * n < 32 * 1024 {
            // SAFETY: y holds n × rows elements (asserted); we are the only writer.
            unsafe { f(&w, 0, w.rows, x, n, out.0, w.rows) };
            return;
        }
        pool.run(&|part| {
            let r = pool::chunk(w.rows, threads, part);
            let out = out;
            // SAFETY: each participant writes only its own rows r of every vector t.
            unsafe { f(&w, r.start, r.end, x, n, out.0, w.rows) };
        });
    }
}

/// RMSNorm (spec §0.3): out = x / sqrt(mean(x²) + eps) · w.
pub fn rmsnorm(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let mut ss = 0.0f32;
    for v in x {
        ss += v * v;
    }
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// SiLU(z) = z · σ(z).
#[inline]
pub fn silu(z: f32) -> f32 {
    z / (1.0 + (-z).exp())
}

/// gate ← SiLU(gate) ⊙ up (the SwiGLU middle, spec §0.4).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

pub use scalar::dot_f32 as dot;
