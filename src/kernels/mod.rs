//! The numeric loops: matrix × vectors for every weight dtype, and the small vector operations
//! of a transformer layer. The implementation is chosen once, at model open, from the CPU's
//! features (`is_x86_feature_detected!`: AVX-512 with Intel's AMX tiles where the OS grants
//! them, AVX-512, else AVX2; NEON on AArch64), or forced to the scalar reference by
//! `Options::force_scalar`; [`Kernels::isa`] says which.
//!
//! Weights stay in their stored dtype (F32, BF16, F16, Q8B32, Q4B32, and F8B32 and MXFP4 for
//! FP8 and gpt-oss MXFP4 experts kept as they are) and are widened to f32
//! inside the dot product, a quantized block at a time; activations are f32 — unless an
//! integer path is on ([`Kernels::with_int8_activations`], [`int8`];
//! [`Kernels::with_int16_activations`], [`int16`]), which quantizes the inputs of Q8B32 and
//! Q4B32 products to int8 or int16 blocks. Every SIMD kernel has a scalar twin in `scalar`,
//! [`int8`] or [`int16`], and `tests/kernels.rs` and `tests/kernels_integer.rs` compare them.
//!
//! The result for a (row, vector) pair depends only on the instruction set and the column
//! count — never on how many vectors a call carries, which rows it covers, or how many threads
//! share the rows — so chunked prefill, token-at-a-time decode and any thread count give the
//! same bits. Several vectors go to a GEMM that decodes the weights once into a panel and
//! reuses them across the chunk, with the decode tiles' exact sequence of operations per
//! (row, vector) pair: `avx2_gemm` on AVX2, `avx512_prefill` on AVX-512.
//!
//! The one exception is [`Isa::Amx`]: a product's vectors are taken [`SPLIT_VECTORS`] at a
//! time, and a group of at least [`TILE_MIN_VECTORS`] with Q4B32, Q8B32 or BF16 weights goes to
//! the AMX tiles (`amx`: products exact in f32, as on the FMA kernels, their sums added in
//! another order). There a result depends also on whether its group reaches that size — not on
//! the rows or the thread count — so a prompt's logits differ from those of the same tokens
//! decoded one at a time by f32 rounding; [`Kernels::without_tiles`] (`Options::tiles`) keeps
//! the bits of the other instruction sets.

pub(crate) mod attention;
pub mod bench;
pub mod int8;
pub mod int16;
pub mod int21;
pub mod kda;
pub(crate) mod mla;
pub(crate) mod peak;
pub mod pool;
pub(crate) mod scalar;
mod tuning;

/// Generates a [`RowsFn`] driver `$name` for one instruction set from a register tile
/// `$tile::<R, T>(w, r, x, t0, out)`, which computes the dot products of rows `r..r+R` with
/// vectors `t0..t0+T` into `out[i][j]`.
///
/// The driver walks rows `$decode_rows` (8 or 4) at a time, then 4, then 1, when there is one
/// vector (decode: independent accumulator chains keep the FMA units busy while the rows
/// stream in, and a block's inputs, loaded once, serve every row), and `$few_rows` (4 or 2),
/// then 2, then 1 rows × 4 vectors at a time otherwise (prefill: each decoded weight block
/// serves four vectors from registers, and the rows stay in L1 for the next four). Four rows
/// where the registers hold 16 accumulators (AVX-512's 32): the four vectors' inputs, which
/// stream from L2 once they outgrow L1, then serve twice the rows per load — `waste bench
/// matmul --tokens 4/8 --rows 64 --cols 2048 --threads 1`, Zen 4: Q4B32 32–34 → 40–42 GMAC/s,
/// BF16 36–40 → 49–51 (BENCHMARKS, 2026-12-04). Each (row, vector) pair has its own
/// accumulator and the same sequence of operations in every tile shape, so a result never
/// depends on `n`, on `r0..r1` or on how many threads split the rows.
macro_rules! row_driver {
    ($feat:literal, $name:ident, $tile:ident, $decode_rows:literal, $few_rows:literal) => {
        /// SIMD row-dot kernel (see [`crate::kernels::scalar::RowsFn`]).
        ///
        /// # Safety
        /// As `RowsFn`, and the CPU must have the instruction set this module is compiled for.
        #[target_feature(enable = $feat)]
        pub unsafe fn $name(w: &MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn run<const R: usize, const T: usize>(w: &MatRef, r: usize, x: &[f32], t0: usize, y: *mut f32, ys: usize) {
                let mut o = [[0f32; T]; R];
                // SAFETY: the driver's caller guarantees rows r..r+R and vectors t0..t0+T exist.
                unsafe { $tile::<R, T>(w, r, x, t0, &mut o) };
                for (i, row) in o.iter().enumerate() {
                    for (j, v) in row.iter().enumerate() {
                        // SAFETY: element (t0 + j, r + i) is the caller's to write.
                        unsafe { *y.add((t0 + j) * ys + r + i) = *v };
                    }
                }
            }
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn tokens<const R: usize>(w: &MatRef, r: usize, x: &[f32], n: usize, y: *mut f32, ys: usize) {
                // Four vectors at a time; a last five as 3 + 2 rather than 4 + 1, since a tile
                // of one vector decodes each block for a single product (about half the rate).
                let fours = if n > 4 && n % 4 == 1 { n / 4 - 1 } else { n / 4 };
                let mut t = 0;
                // SAFETY (all calls): t + T <= n.
                for _ in 0..fours {
                    unsafe { run::<R, 4>(w, r, x, t, y, ys) };
                    t += 4;
                }
                match n - t {
                    1 => unsafe { run::<R, 1>(w, r, x, t, y, ys) },
                    2 => unsafe { run::<R, 2>(w, r, x, t, y, ys) },
                    3 => unsafe { run::<R, 3>(w, r, x, t, y, ys) },
                    5 => unsafe {
                        run::<R, 3>(w, r, x, t, y, ys);
                        run::<R, 2>(w, r, x, t + 3, y, ys);
                    },
                    _ => {}
                }
            }
            let mut r = r0;
            // SAFETY (all calls): r + R <= r1 <= w.rows, and the caller's contract covers y.
            if n == 1 {
                while $decode_rows > 4 && r + $decode_rows <= r1 {
                    unsafe { run::<$decode_rows, 1>(w, r, x, 0, y, ys) };
                    r += $decode_rows;
                }
                while r + 4 <= r1 {
                    unsafe { run::<4, 1>(w, r, x, 0, y, ys) };
                    r += 4;
                }
                while r < r1 {
                    unsafe { run::<1, 1>(w, r, x, 0, y, ys) };
                    r += 1;
                }
            } else {
                while $few_rows > 2 && r + $few_rows <= r1 {
                    unsafe { tokens::<$few_rows>(w, r, x, n, y, ys) };
                    r += $few_rows;
                }
                while r + 2 <= r1 {
                    unsafe { tokens::<2>(w, r, x, n, y, ys) };
                    r += 2;
                }
                if r < r1 {
                    unsafe { tokens::<1>(w, r, x, n, y, ys) };
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_few;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_gemm;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_attention;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_prefill;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_attention;
#[cfg(target_arch = "x86_64")]
mod int8_x86;
#[cfg(target_arch = "x86_64")]
mod int8_prefill_x86;
#[cfg(target_arch = "x86_64")]
mod int16_avx2;
#[cfg(target_arch = "x86_64")]
mod int16_x86;
#[cfg(target_arch = "x86_64")]
mod int21_avx2;
#[cfg(target_arch = "x86_64")]
mod int21_x86;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;

use crate::format::dtype::DType;
pub use crate::sys::CpuList;
use crate::sys::Floats;
pub use int8::Int8Isa;
use int8::{ActScratch, Acts, IntPath, IntRowsFn};
use int21::Digits;
pub use pool::Pool;
pub use scalar::RowsFn;
pub use tuning::{Prefetch, TokenGroups};

/// A borrowed row-major weight matrix in its stored dtype.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    /// The element type of `data`.
    pub dtype: DType,
    /// Rows (outputs of a product).
    pub rows: usize,
    /// Columns (inputs of a product).
    pub cols: usize,
    /// The row-major bytes; the kernels refuse (panic) data shorter than `rows × row_bytes()`.
    pub data: &'a [u8],
}

impl MatRef<'_> {
    /// Bytes per row (whole blocks for the quantized widths; 0 when `cols` does not fit the
    /// dtype, which makes every kernel read nothing).
    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols as u64).unwrap_or(0) as usize
    }
}

/// True when `len` covers the product of `dims`, the product computed with `checked_mul`: the
/// kernels' bounds checks guard `unsafe` loads, and a product that wrapped around in a release
/// build (no overflow checks) could make a short buffer pass. An overflowing product is never
/// covered.
#[inline]
pub(crate) fn holds(len: usize, dims: &[usize]) -> bool {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).is_some_and(|need| len >= need)
}

/// Most products [`Kernels::matmul_group`] takes at once.
pub const GROUP_MAX: usize = 4;

/// Which instruction set the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// The reference loops (`kernels::scalar`).
    Scalar,
    /// AVX2 + FMA + F16C, 8 lanes.
    Avx2,
    /// AVX-512 F/BW/VL (+ FMA, F16C), 16 lanes.
    Avx512,
    /// AVX-512 with AVX512_BF16 and Intel AMX-BF16 tiles: the AVX-512 kernels, and the Q4B32,
    /// Q8B32 and BF16 products of prefill groups of at least [`TILE_MIN_VECTORS`] vectors on
    /// the tiles (f32-exact products, another order of additions: see `kernels::amx`).
    Amx,
    /// AArch64 Advanced SIMD, 4 lanes.
    Neon,
}

impl Isa {
    /// Every instruction set, best last.
    pub const ALL: [Isa; 5] = [Isa::Scalar, Isa::Neon, Isa::Avx2, Isa::Avx512, Isa::Amx];

    /// The instruction set's name, as `info` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
        }
    }

    /// Parses a name as printed by [`Isa::name`].
    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == name)
    }

    /// True when this CPU can run the instruction set (checked at run time).
    pub fn supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512.supported() && is_x86_feature_detected!("avx512bf16") && crate::sys::amx_bf16_permitted(),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

/// True when this CPU has AVX-VNNI beside AVX2: the integer paths' AVX2 kernels then multiply
/// with its 256-bit `vpdpbusd` (int8) and `vpdpwssd` (int16), the same sums in fewer
/// instructions.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx_vnni() -> bool {
    Isa::Avx2.supported() && is_x86_feature_detected!("avxvnni")
}

/// The AVX-512 row kernels of every slot, and the Q4B32 kernel on inputs split by parity, for
/// a prefetch scheme and a token-group rule (each a separate instantiation: a
/// [`RowsFn`] is a plain function).
#[cfg(target_arch = "x86_64")]
fn avx512_rows(p: Prefetch, g: TokenGroups) -> ([RowsFn; 7], RowsFn) {
    macro_rules! table {
        ($own:literal, $whole:literal, $f32:ident, $bf16:ident, $f16:ident, $q8:ident, $f8:ident) => {
            ([avx512::$f32::<$whole>, avx512::$bf16::<$whole>, avx512::$f16::<$whole>, avx512::$q8::<$whole>,
              avx512::rows_q4b32::<$own, $whole>, avx512::$f8::<$whole>, avx512::rows_mxfp4::<$own, $whole>],
             avx512::rows_q4b32_split::<$own, $whole>)
        };
    }
    match (p, g) {
        (Prefetch::TileAfterNext, TokenGroups::FitL2) => table!(false, false, rows_f32, rows_bf16, rows_f16, rows_q8b32, rows_f8b32),
        (Prefetch::TileAfterNext, TokenGroups::Whole) => table!(false, true, rows_f32, rows_bf16, rows_f16, rows_q8b32, rows_f8b32),
        (Prefetch::OwnRows, TokenGroups::FitL2) => table!(true, false, rows_f32_own_rows, rows_bf16_own_rows, rows_f16_own_rows,
                                                          rows_q8b32_own_rows, rows_f8b32_own_rows),
        (Prefetch::OwnRows, TokenGroups::Whole) => table!(true, true, rows_f32_own_rows, rows_bf16_own_rows, rows_f16_own_rows,
                                                         rows_q8b32_own_rows, rows_f8b32_own_rows),
    }
}

/// Floats per stream segment of the SIMD `sum` kernels (the read-bandwidth probe): four
/// adjacent 16 KiB segments are read in lockstep, the pattern of a 4-row tile over 16 KiB
/// rows (with 4 KiB segments the hardware prefetcher restarts at every page and the probe
/// under-reads this machine by 40%).
pub(crate) const SUM_SEGMENT: usize = 4096;

/// Most input values (vectors × columns) the x86 Q4B32 kernels put in their weights' nibble
/// order once per call, into a stack buffer (64 KiB), rather than once per block of every tile.
#[cfg(target_arch = "x86_64")]
pub(crate) const Q4_ORDERED_MAX: usize = 16384;

/// Dot product of two equally long f32 slices.
type DotFn = unsafe fn(&[f32], &[f32]) -> f32;
/// Sum of an f32 slice.
type SumFn = unsafe fn(&[f32]) -> f32;
/// Attention scores of one query against keys `stride` apart (see [`Kernels::attn_scores`]).
type ScoresFn = unsafe fn(&[f32], &[f32], usize, f32, &mut [f32]);
/// Attention's weighted sum of values `stride` apart (see [`Kernels::attn_mix`]).
type MixFn = unsafe fn(&[f32], &[f32], usize, &mut [f32]);
/// Softmax with a sink logit (see [`Kernels::softmax_with_sink`]).
type SoftmaxFn = unsafe fn(&mut [f32], f32);
/// Scores of a group of query heads against the same keys (see [`Kernels::attn_scores_group`]).
type ScoresGroupFn = unsafe fn(&[f32], usize, &[f32], usize, f32, &mut [f32]);
/// Weighted sums of a group of heads over the same values (see [`Kernels::attn_mix_group`]).
type MixGroupFn = unsafe fn(&[f32], &[f32], usize, &mut [f32], usize);

/// The kernel table, chosen once, and the int8 path's activation buffer when it is on.
#[derive(Clone)]
pub struct Kernels {
    isa: Isa,
    /// By [`slot`]: F32, BF16, F16, Q8B32, Q4B32, F8B32 and MXFP4 (the last two scalar on
    /// NEON).
    rows: [RowsFn; 7],
    dot: DotFn,
    sum: SumFn,
    scores: ScoresFn,
    mix: MixFn,
    softmax: SoftmaxFn,
    /// Grouped-query attention kernels that load each key and value once per group of heads,
    /// where an instruction set has them (AVX2, AVX-512); else the per-head ones, head by head.
    scores_group: Option<ScoresGroupFn>,
    mix_group: Option<MixGroupFn>,
    /// The integer-activation path, when one is on.
    int: Option<Integer>,
    /// Room for a prefill product's split inputs ([`Kernels::with_split_buffer`]), when given.
    split_inputs: Option<SplitInputs>,
    /// The decode tiles' prefetch scheme (x86; the scalar and NEON kernels have one).
    prefetch: Prefetch,
    /// The AVX-512 prefill GEMM's token groups (the other instruction sets have one rule).
    token_groups: TokenGroups,
    /// The AVX-512 Q4B32 kernel on inputs split by parity, for this prefetch scheme and these
    /// token groups (AVX-512 and AMX: the instruction sets that split inputs).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    q4_split: Option<RowsFn>,
}

/// The most vectors of a product [`Kernels::with_int21_decode`] gives the int21 path: a
/// decode step's one, and the few of a short prompt chunk, of an expert a prefill chunk routes
/// few tokens to, or of the last layer's rows when a chunk reads its last logits only; never a
/// long chunk's GEMM.
pub const DECODE_VECTORS: usize = 4;

/// Vectors whose Q4B32 inputs [`Kernels`] splits by parity at once (a longer product is run
/// this many vectors at a time): the buffer holds this many × the widest input.
pub const SPLIT_VECTORS: usize = 128;

/// Fewest vectors of a group of [`SPLIT_VECTORS`] whose Q4B32, Q8B32 and BF16 products go to
/// the AMX tiles ([`Isa::Amx`]); a smaller group takes the AVX-512 kernels, whose bits differ
/// from the tiles' by rounding. The tiles pad a group to a multiple of 32 vectors: at 16 they
/// ran level with the AVX-512 GEMM (8192 × 2048 Q4B32, one thread: 50.8 against 55.2 GMAC/s),
/// at 32 almost twice as fast (97.4 against 53.0; BENCHMARKS, 2026-12-04, night).
pub const TILE_MIN_VECTORS: usize = 20;

/// Vectors an input buffer holds for products of up to `chunk` vectors: [`SPLIT_VECTORS`], or
/// `chunk` if fewer — rounded up to a multiple of 32 when the tiles could take them
/// ([`TILE_MIN_VECTORS`] or more), which split whole pairs of 16-vector groups.
pub(crate) fn split_vectors(chunk: usize) -> usize {
    let v = chunk.min(SPLIT_VECTORS);
    if v >= TILE_MIN_VECTORS { v.next_multiple_of(32).min(SPLIT_VECTORS) } else { v }
}

/// f32 values a caller's own room for split inputs ([`Kernels::rows_alone`]) needs for
/// products of up to `vectors` vectors of up to `cols` columns on any instruction set: by
/// parity `vectors × cols`, for the tiles three bf16 parts of whole pairs of 16-vector groups.
pub(crate) fn split_room(vectors: usize, cols: usize) -> usize {
    let v = split_vectors(vectors);
    if v >= TILE_MIN_VECTORS { tile_parts_len(v * cols) } else { v * cols }
}

/// f32 values that `values` inputs take split into the tiles' three bf16 parts (6 bytes
/// each), for whole pairs of 16-vector groups ([`amx::split_len`]).
const fn tile_parts_len(values: usize) -> usize {
    values + values.div_ceil(2)
}

/// A buffer for the inputs of a prefill product split once per product ([`Kernels::with_split_buffer`]):
/// by parity for the AVX-512 Q4B32 GEMM instead of per four vectors and panel
/// (`avx512::rows_q4b32_split`), into three bf16 parts for the AMX tiles.
#[derive(Debug)]
struct SplitInputs {
    /// Values the buffer holds (its length, readable without the lock).
    values: usize,
    buf: std::sync::Mutex<Floats>,
}

impl SplitInputs {
    /// Room for `values` inputs, from a 64-byte boundary ([`Floats`]).
    fn new(values: usize) -> SplitInputs {
        SplitInputs { values, buf: std::sync::Mutex::new(Floats::zeroed(values)) }
    }
}

/// The part of `buf` from its first 64-byte boundary when `values` fit after it, else all: a
/// caller's room for split inputs ([`Kernels::rows_alone`]) may start anywhere, and a 16-lane
/// input load that straddles two cache lines costs two (BENCHMARKS, 2026-12-04).
#[cfg(target_arch = "x86_64")]
fn aligned_for(buf: &mut [f32], values: usize) -> &mut [f32] {
    let skip = buf.as_ptr().align_offset(64);
    if skip <= buf.len() && buf.len() - skip >= values { &mut buf[skip..] } else { buf }
}

impl Clone for SplitInputs {
    /// A copy with its own buffer of the same size (a buffer is never shared).
    fn clone(&self) -> SplitInputs {
        SplitInputs::new(self.values)
    }
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.int {
            Some(p) => write!(f, "Kernels({}, {} {})", self.isa.name(), p.name(), p.isa().kernels_name()),
            None => write!(f, "Kernels({})", self.isa.name()),
        }
    }
}

/// The integer-activation path of a [`Kernels`]: int8 ([`int8`]), int16 ([`int16`]) or int21
/// ([`int21`]).
#[derive(Clone, Debug)]
enum Integer {
    Int8(IntPath<i8>),
    Int16(IntPath<i16>),
    /// The int21 path and the most vectors a product it takes may have (more go to the f32
    /// kernels: [`Kernels::with_int21_decode`]).
    Int21(IntPath<Digits>, usize),
}

impl Integer {
    fn name(&self) -> &'static str {
        match self {
            Integer::Int8(_) => "int8",
            Integer::Int16(_) => "int16",
            Integer::Int21(..) => "int21",
        }
    }

    fn isa(&self) -> Int8Isa {
        match self {
            Integer::Int8(p) => p.isa,
            Integer::Int16(p) => p.isa,
            Integer::Int21(p, _) => p.isa,
        }
    }

    /// True when the path has a kernel for `dtype` weights.
    fn takes(&self, dtype: DType) -> bool {
        match self {
            Integer::Int8(p) => p.kernel(dtype).is_some(),
            Integer::Int16(p) => p.kernel(dtype).is_some(),
            Integer::Int21(p, _) => p.kernel(dtype).is_some(),
        }
    }

    /// True when the path takes products of `n` vectors with `dtype` weights.
    fn covers(&self, dtype: DType, n: usize) -> bool {
        self.takes(dtype) && !matches!(self, Integer::Int21(_, most) if n > *most)
    }
}

/// How one product's rows are computed: an f32-activation kernel and the f32 inputs, or an
/// integer-path kernel and the quantized inputs.
#[derive(Clone, Copy)]
enum Job<'a> {
    F32(RowsFn, &'a [f32]),
    Int8(IntRowsFn<i8>, Acts<'a>),
    Int16(IntRowsFn<i16>, Acts<'a, i16>),
    Int21(IntRowsFn<Digits>, Acts<'a, Digits>),
}

/// An integer path's activation buffer, locked for one product or group.
enum Quantizing<'a> {
    Int8(std::sync::MutexGuard<'a, ActScratch<i8>>),
    Int16(std::sync::MutexGuard<'a, ActScratch<i16>>),
    Int21(std::sync::MutexGuard<'a, ActScratch<Digits>>),
}

/// Inputs quantized by an integer path.
#[derive(Clone, Copy)]
enum IntActs<'a> {
    Int8(Acts<'a>),
    Int16(Acts<'a, i16>),
    Int21(Acts<'a, Digits>),
}

impl IntActs<'_> {
    /// Values per vector.
    fn cols(&self) -> usize {
        match self {
            IntActs::Int8(a) => a.cols,
            IntActs::Int16(a) => a.cols,
            IntActs::Int21(a) => a.cols,
        }
    }
}

impl Job<'_> {
    /// Rows `r0..r1` against the `n` vectors into `y[t * ys + r]`.
    ///
    /// # Safety
    /// As [`RowsFn`] / [`Int8RowsFn`] (the inputs are the job's own).
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(&self, w: &MatRef, r0: usize, r1: usize, n: usize, y: *mut f32, ys: usize) {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Job::F32(f, x) => f(w, r0, r1, x, n, y, ys),
                Job::Int8(f, a) => f(w, r0, r1, a, n, y, ys),
                Job::Int16(f, a) => f(w, r0, r1, a, n, y, ys),
                Job::Int21(f, a) => f(w, r0, r1, a, n, y, ys),
            }
        }
    }
}

fn slot(dtype: DType) -> Option<usize> {
    Some(match dtype {
        DType::F32 => slots::F32,
        DType::BF16 => slots::BF16,
        DType::F16 => slots::F16,
        DType::Q8B32 => slots::Q8B32,
        DType::Q4B32 => slots::Q4B32,
        DType::F8B32 => slots::F8B32,
        DType::MXFP4 => slots::MXFP4,
        _ => return None,
    })
}

/// The row-kernel table's slot of each compute dtype, by name (see [`slot`]).
mod slots {
    pub const F32: usize = 0;
    pub const BF16: usize = 1;
    pub const F16: usize = 2;
    pub const Q8B32: usize = 3;
    pub const Q4B32: usize = 4;
    pub const F8B32: usize = 5;
    pub const MXFP4: usize = 6;
}

/// A raw output pointer that several pool participants write disjoint elements through (the
/// products here, and attention, MLA and KDA, which each say which elements are whose).
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: every user has its participants write disjoint index sets (their own rows, heads or
// score rows); the pool joins them all before the buffer is used again.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Products (and attention or recurrence steps) smaller than this many multiply-adds run on
/// the calling thread: waking the workers costs about a microsecond, the work a few.
pub(crate) const PARALLEL_MIN_MACS: usize = 16 * 1024;

/// A parallel product's rows go out in this many pieces per participant, taken by whoever is
/// free ([`pool::Pieces`]), so that a thread the OS delays does not hold up the region.
const PIECES_PER_THREAD: usize = 4;
/// Row pieces start at multiples of this, a multiple of every kernel's row tile (8 rows in the
/// decode tiles, 6 in the AVX-512 GEMM's, 16 in the integer kernels' lanes and the AMX tiles),
/// so that only a matrix's last piece ends in a partial tile.
const PIECE_ROWS: usize = 48;

/// Pieces for a product of `rows` rows on `threads` participants.
fn row_pieces(rows: usize, threads: usize) -> pool::Pieces {
    pool::Pieces::new((threads * PIECES_PER_THREAD).min(rows.div_ceil(PIECE_ROWS)).max(1))
}

impl Kernels {
    /// The best kernels for this CPU, or the scalar reference when `force_scalar`.
    pub fn select(force_scalar: bool) -> Kernels {
        if force_scalar {
            return Kernels::scalar();
        }
        Isa::ALL.into_iter().rev().find_map(Kernels::with_isa).unwrap_or_else(Kernels::scalar)
    }

    /// These kernels without the AMX tiles: the AVX-512 ones with the same prefetch scheme
    /// where they are [`Isa::Amx`], else unchanged (see [`crate::Options::tiles`]).
    pub fn without_tiles(self) -> Kernels {
        match self.isa {
            Isa::Amx => Kernels::with_isa(Isa::Avx512).map_or(self.clone(), |k| k.with_prefetch(self.prefetch)),
            _ => self,
        }
    }

    /// The scalar reference kernels.
    pub fn scalar() -> Kernels {
        Kernels {
            isa: Isa::Scalar,
            rows: [scalar::rows_f32, scalar::rows_bf16, scalar::rows_f16, scalar::rows_q8b32, scalar::rows_q4b32, scalar::rows_f8b32, scalar::rows_mxfp4],
            dot: scalar::dot_unsafe,
            sum: scalar::sum_unsafe,
            scores: scalar::scores_unsafe,
            mix: scalar::mix_unsafe,
            softmax: softmax_with_sink_unsafe,
            scores_group: None,
            mix_group: None,
            int: None,
            split_inputs: None,
            prefetch: Prefetch::TileAfterNext,
            token_groups: TokenGroups::FitL2,
            q4_split: None,
        }
    }

    /// The kernels of one instruction set, or `None` when this CPU (or this build's target)
    /// does not have it.
    pub fn with_isa(isa: Isa) -> Option<Kernels> {
        if !isa.supported() {
            return None;
        }
        match isa {
            Isa::Scalar => Some(Kernels::scalar()),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(Kernels {
                isa,
                rows: [avx2::rows_f32, avx2::rows_bf16, avx2::rows_f16, avx2::rows_q8b32, avx2::rows_q4b32::<false>, avx2::rows_f8b32, avx2::rows_mxfp4],
                dot: avx2::dot,
                sum: avx2::sum,
                scores: avx2_attention::scores,
                mix: avx2_attention::mix,
                softmax: avx2_attention::softmax_with_sink,
                scores_group: Some(avx2_attention::scores_group),
                mix_group: Some(avx2_attention::mix_group),
                int: None,
                split_inputs: None,
                prefetch: Prefetch::TileAfterNext,
                token_groups: TokenGroups::FitL2,
                q4_split: None,
            }.with_prefetch(Prefetch::for_this_cpu())),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Amx => Some(Kernels {
                isa,
                rows: avx512_rows(Prefetch::TileAfterNext, TokenGroups::FitL2).0,
                dot: avx512::dot,
                sum: avx512::sum,
                scores: avx512_attention::scores,
                mix: avx512_attention::mix,
                softmax: avx2_attention::softmax_with_sink,
                scores_group: Some(avx512_attention::scores_group),
                mix_group: Some(avx512_attention::mix_group),
                int: None,
                split_inputs: None,
                prefetch: Prefetch::TileAfterNext,
                token_groups: TokenGroups::FitL2,
                q4_split: None,
            }.with_prefetch(Prefetch::for_this_cpu()).with_token_groups(TokenGroups::for_this_cpu())),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => Some(Kernels {
                isa,
                rows: [neon::rows_f32, neon::rows_bf16, neon::rows_f16, neon::rows_q8b32, neon::rows_q4b32, scalar::rows_f8b32, scalar::rows_mxfp4],
                dot: neon::dot,
                sum: neon::sum,
                scores: neon::scores,
                mix: scalar::mix_unsafe,
                softmax: softmax_with_sink_unsafe,
                scores_group: None,
                mix_group: None,
                int: None,
                split_inputs: None,
                prefetch: Prefetch::TileAfterNext,
                token_groups: TokenGroups::FitL2,
                q4_split: None,
            }),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// True when the default activations ([`crate::Activations::Auto`]) decode Q4B32 with the
    /// int21 path on these kernels ([`Kernels::with_int21_decode`]): on AVX2's, whose f32
    /// Q4B32 decode is bound by its instruction count, and on AVX-512 VNNI ones where
    /// the tuning for this CPU says so (Intel, where it was measured); f32 elsewhere.
    pub fn int21_decodes_by_default(&self) -> bool {
        match self.isa {
            Isa::Avx2 => true,
            Isa::Avx512 | Isa::Amx => Int8Isa::for_isa(self.isa) == Int8Isa::Avx512Vnni && tuning::avx512_int21_decode_for_this_cpu(),
            _ => false,
        }
    }

    /// The decode tiles' prefetch scheme in use (see [`Prefetch`]).
    pub fn prefetch(&self) -> Prefetch {
        self.prefetch
    }

    /// These kernels with the decode tiles' prefetch scheme `p`: it applies to the AVX2 and
    /// AVX-512 Q8B32 and Q4B32 tiles and to every AVX-512 decode tile (dense, F8B32, MXFP4);
    /// the scalar and NEON kernels keep theirs (and report [`Prefetch::TileAfterNext`]) — and to
    /// the int21 path's SIMD kernel when that path is on.
    pub fn with_prefetch(mut self, p: Prefetch) -> Kernels {
        if let Some(Integer::Int21(path, _)) = &mut self.int {
            path.q4 = int21::kernels(path.isa, p).2;
        }
        let own = p == Prefetch::OwnRows;
        let mut rows = self.rows;
        let mut q4_split = self.q4_split;
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                let g = self.token_groups;
                return self.with_avx512_rows(p, g);
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => {
                rows[slots::BF16] = amx::rows_bf16;
                rows[slots::Q8B32] = if own { amx::rows_q8b32_own_rows } else { amx::rows_q8b32 };
                rows[slots::Q4B32] = if own { amx::rows_q4b32_own_rows } else { amx::rows_q4b32 };
                // F32, F16, F8B32 and MXFP4 have no AMX kernels: AVX-512's, with this
                // prefetch scheme.
                let (avx512, split) = avx512_rows(p, TokenGroups::FitL2);
                for slot in [slots::F32, slots::F16, slots::F8B32, slots::MXFP4] {
                    rows[slot] = avx512[slot];
                }
                q4_split = Some(split);
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                rows[slots::Q8B32] = if own { avx2::rows_q8b32_own_rows } else { avx2::rows_q8b32 };
                rows[slots::Q4B32] = if own { avx2::rows_q4b32::<true> } else { avx2::rows_q4b32::<false> };
            }
            _ => return self,
        }
        Kernels { rows, prefetch: p, q4_split, ..self }
    }

    /// The AVX-512 prefill GEMM's token groups in use (see [`TokenGroups`]).
    pub fn token_groups(&self) -> TokenGroups {
        self.token_groups
    }

    /// These kernels with the AVX-512 prefill GEMM's token groups `g`: it applies to
    /// [`Isa::Avx512`]; the other instruction sets keep theirs (and report
    /// [`TokenGroups::FitL2`]), the AMX tiles' AVX-512 kernels included.
    pub fn with_token_groups(self, g: TokenGroups) -> Kernels {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                let p = self.prefetch;
                self.with_avx512_rows(p, g)
            }
            _ => self,
        }
    }

    /// These AVX-512 kernels with prefetch scheme `p` and token groups `g`: the row table and
    /// the split-input Q4B32 kernel that go with them (the one place both choices reach the
    /// table).
    #[cfg(target_arch = "x86_64")]
    fn with_avx512_rows(self, p: Prefetch, g: TokenGroups) -> Kernels {
        let (rows, split) = avx512_rows(p, g);
        Kernels { rows, prefetch: p, token_groups: g, q4_split: Some(split), ..self }
    }

    /// These kernels with the opt-in int8-activation path on: products with Q8B32 and Q4B32
    /// weights quantize their inputs to int8 blocks ([`int8`]) and multiply them with the int8
    /// kernels that go with this instruction set ([`Int8Isa::for_isa`]); other dtypes keep f32
    /// activations. The activation buffer is sized for `values` inputs (vectors × columns of
    /// the widest product: a model passes prefill chunk × widest input), so products up to that
    /// size allocate nothing.
    pub fn with_int8_activations(self, values: usize) -> Kernels {
        let isa = Int8Isa::for_isa(self.isa);
        Kernels { int: Some(Integer::Int8(IntPath::int8(isa, values))), ..self }
    }

    /// These kernels with the int16-activation path on ([`int16`]): products with Q8B32 and
    /// Q4B32 weights quantize their inputs to 16-bit blocks (a rounding of at most 1/65534 of
    /// each block's largest value) and multiply them as exact integers, with the AVX-512 VNNI
    /// kernels where the int8 path would use them and the scalar twins elsewhere; other dtypes
    /// keep f32 activations. Replaces the int8 path. `values` as for
    /// [`Kernels::with_int8_activations`].
    pub fn with_int16_activations(self, values: usize) -> Kernels {
        let isa = Int8Isa::for_isa(self.isa);
        Kernels { int: Some(Integer::Int16(IntPath::int16(isa, values))), ..self }
    }

    /// These kernels with the int21-activation path on ([`int21`]): products with Q4B32
    /// weights quantize their inputs to 21-bit blocks (a rounding of at most 1/4,161,536 of
    /// each block's largest value: seed 000's token gate passes) and multiply them as exact
    /// integers, three 8-bit digits at a time — with the AVX-512 VNNI kernel where the int8
    /// path would use it, the AVX2 ones elsewhere on x86 and the scalar twin beyond; other
    /// dtypes keep f32 activations. Replaces another integer path. `values` as for [`Kernels::with_int8_activations`].
    pub fn with_int21_activations(self, values: usize) -> Kernels {
        self.with_int21(values, usize::MAX)
    }

    /// These kernels with the int21 path on for decode only: products of at most
    /// [`DECODE_VECTORS`] vectors with Q4B32 weights take int21 activations, every other product
    /// the f32 kernels — where the f32 Q4B32 decode is bound by its instruction count, int21
    /// decodes faster at the same gate accuracy, while a prefill chunk's f32 GEMM is faster
    /// than int21's four-vectors-a-pass form. Results then depend on how many vectors a
    /// product carries: a prompt's logits differ from the same tokens decoded one at a time by
    /// f32-level rounding (as with the AMX tiles). `values` as for
    /// [`Kernels::with_int8_activations`], for [`DECODE_VECTORS`] vectors.
    pub fn with_int21_decode(self, values: usize) -> Kernels {
        self.with_int21(values, DECODE_VECTORS)
    }

    /// The int21 path for products of at most `most` vectors, with this instruction set's
    /// kernels and this prefetch scheme.
    fn with_int21(self, values: usize, most: usize) -> Kernels {
        let path = IntPath::int21(Int8Isa::for_isa(self.isa), self.prefetch, values);
        Kernels { int: Some(Integer::Int21(path, most)), ..self }
    }

    /// These kernels with a buffer for `values` inputs (the model passes
    /// [`SPLIT_VECTORS`] or its prefill chunk, the fewer, × its widest input), in which a
    /// prefill product's inputs are split once when this instruction set's kernels take them
    /// so ([`Kernels::splits_inputs`]): by parity for the AVX-512 Q4B32 GEMM, into three bf16
    /// parts for the AMX tiles. Unchanged elsewhere. Without it the GEMM splits them per four
    /// vectors and panel (the same bits, about a fifth slower) and the tiles into a buffer of
    /// their own per product.
    pub fn with_split_buffer(self, values: usize) -> Kernels {
        if !self.splits_inputs() {
            return self;
        }
        Kernels { split_inputs: Some(SplitInputs::new(self.split_buffer_len(values))), ..self }
    }

    /// True when [`Kernels::with_split_buffer`] holds a buffer on this instruction set
    /// (AVX-512, and the tiles).
    pub fn splits_inputs(&self) -> bool {
        matches!(self.isa, Isa::Avx512 | Isa::Amx)
    }

    /// f32 values of the split-input buffer for `values` inputs (a vector count that is a
    /// multiple of 32 × the widest input): `values` where the inputs are split by parity, half
    /// as many again on the tiles (`tile_parts_len`).
    pub fn split_buffer_len(&self, values: usize) -> usize {
        if self.isa == Isa::Amx { tile_parts_len(values) } else { values }
    }

    /// Heap bytes held: the int8 path's activation buffer when it is on, and the split-input
    /// buffer when there is one.
    pub fn heap_bytes(&self) -> u64 {
        // A poisoned lock only means a panic elsewhere interrupted a split, which the next one
        // overwrites: the buffer is still held.
        let split = self.split_inputs.as_ref().map_or(0, |b| b.buf.lock().unwrap_or_else(std::sync::PoisonError::into_inner).heap_bytes());
        self.scratch().map_or(0, |s| match s {
            Quantizing::Int8(s) => s.bytes(),
            Quantizing::Int16(s) => s.bytes(),
            Quantizing::Int21(s) => s.bytes(),
        } as u64) + split
    }

    /// True when the AMX tiles ([`Isa::Amx`]) take `w` for a group of `n` vectors (of at most
    /// [`SPLIT_VECTORS`]): Q4B32, Q8B32 (where the int8 path does not) and BF16 of whole
    /// 32-column blocks, [`TILE_MIN_VECTORS`] vectors or more.
    pub fn tiles_take(&self, w: &MatRef, n: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        return self.isa == Isa::Amx && !self.int_covers(w.dtype, n) && amx::takes(w, n);
        #[cfg(not(target_arch = "x86_64"))]
        return {
            let _ = (w, n);
            false
        };
    }

    /// True when a group of `n` vectors of `w` goes to kernels that take their inputs split
    /// beforehand: the tiles, or the AVX-512 Q4B32 GEMM (by parity; two or more vectors, one
    /// being split by the kernel itself, on the stack).
    fn takes_split(&self, w: &MatRef, n: usize) -> bool {
        self.tiles_take(w, n) || (self.splits_inputs() && w.dtype == DType::Q4B32 && !self.int_covers(w.dtype, n) && n >= 2)
    }

    /// f32 values the split inputs of a group of `n` vectors of `w` take.
    fn split_len(&self, w: &MatRef, n: usize) -> usize {
        #[cfg(target_arch = "x86_64")]
        if self.tiles_take(w, n) {
            return amx::split_len(n, w.cols);
        }
        n * w.cols
    }

    /// True when `w` × `n` vectors take split inputs and the buffer holds a group's
    /// ([`SPLIT_VECTORS`] vectors, or `n` if fewer).
    fn wants_split(&self, w: &MatRef, n: usize) -> bool {
        self.takes_split(w, n) && self.split_inputs.as_ref().is_some_and(|b| b.values >= self.split_len(w, SPLIT_VECTORS.min(n)))
    }

    /// The input buffer, locked, when [`Kernels::wants_split`].
    fn split_buffer(&self, w: &MatRef, n: usize) -> Option<std::sync::MutexGuard<'_, Floats>> {
        let buf = self.split_inputs.as_ref().filter(|_| self.wants_split(w, n))?;
        Some(buf.buf.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Splits the `n` (at most [`SPLIT_VECTORS`]) vectors of `x`, `cols` each, into `buf` (from
    /// its first 64-byte boundary, when it has the room) as the kernels of `w` take them —
    /// into three bf16 parts for the tiles, by parity for the AVX-512 Q4B32 GEMM — and returns
    /// the job; a group that takes no split inputs gets the plain kernel on `x`.
    fn split_job<'a>(&self, buf: &'a mut [f32], w: &MatRef, x: &'a [f32], n: usize) -> Job<'a> {
        let slot_kernel = Job::F32(self.rows[slot(w.dtype).unwrap_or_else(|| panic!("split_job: not a compute dtype"))], x);
        if !self.takes_split(w, n) {
            return slot_kernel;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let cols = w.cols;
            if let Some(kind) = amx::Kind::of(w.dtype).filter(|_| self.tiles_take(w, n)) {
                let len = amx::split_len(n, cols);
                let buf = aligned_for(buf, len);
                // SAFETY: tiles are taken only with the Amx kernels, made where the CPU has
                // AVX-512 BF16 and the OS grants the tiles; the caller checked the buffer.
                unsafe { amx::split_inputs(x, n, cols, buf) };
                return Job::F32(amx::rows_split_for(kind), &buf[..len]);
            }
            // The instruction sets that split inputs always have it (`with_prefetch` sets it).
            let Some(rows) = self.q4_split else { return slot_kernel };
            let buf = aligned_for(buf, n * cols);
            // SAFETY: split inputs are taken only on AVX-512 (`splits_inputs`); both slices
            // hold n × cols values (`wants_split` checked the buffer, the caller x).
            unsafe { avx512_prefill::split_by_parity(x, n, cols, buf) };
            Job::F32(rows, &buf[..n * cols])
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            // Nothing takes split inputs off x86 (`takes_split`).
            let _ = buf;
            slot_kernel
        }
    }

    /// `matmul` or `rows` of a product that takes split inputs, [`SPLIT_VECTORS`] vectors at a
    /// time: `run` gets each group's job, its first vector and its vector count.
    fn with_split_inputs(&self, buf: &mut [f32], w: &MatRef, x: &[f32], n: usize, mut run: impl FnMut(Job, usize, usize)) {
        for t0 in (0..n).step_by(SPLIT_VECTORS) {
            let tn = SPLIT_VECTORS.min(n - t0);
            let job = self.split_job(buf, w, &x[t0 * w.cols..(t0 + tn) * w.cols], tn);
            run(job, t0, tn);
        }
    }

    /// The int8 path's kernels, when it is on.
    pub fn int8_isa(&self) -> Option<Int8Isa> {
        self.int.as_ref().filter(|p| matches!(p, Integer::Int8(_))).map(Integer::isa)
    }

    /// The int16 path's kernels, when it is on.
    pub fn int16_isa(&self) -> Option<Int8Isa> {
        self.int.as_ref().filter(|p| matches!(p, Integer::Int16(_))).map(Integer::isa)
    }

    /// The integer path's kernels, whichever path is on.
    pub fn integer_isa(&self) -> Option<Int8Isa> {
        self.int.as_ref().map(Integer::isa)
    }

    /// The int21 path's kernels, when it is on.
    pub fn int21_isa(&self) -> Option<Int8Isa> {
        self.int.as_ref().filter(|p| matches!(p, Integer::Int21(..))).map(Integer::isa)
    }

    /// The job for `w`'s rows: the integer path's kernel with `acts` when the path covers the
    /// dtype, else the f32 kernel with `x`.
    fn job<'a>(&self, w: &MatRef, x: &'a [f32], acts: Option<IntActs<'a>>, what: &str) -> Job<'a> {
        // Inputs are quantized only for products the path covers, so a path that takes the
        // dtype takes this product.
        if let Some(a) = acts.filter(|_| self.int.as_ref().is_some_and(|p| p.takes(w.dtype))) {
            assert_eq!(a.cols(), w.cols, "{what}: products of one group must share the input width");
        }
        let job = match (acts, &self.int) {
            (Some(IntActs::Int8(a)), Some(Integer::Int8(p))) => p.kernel(w.dtype).map(|f| Job::Int8(f, a)),
            (Some(IntActs::Int16(a)), Some(Integer::Int16(p))) => p.kernel(w.dtype).map(|f| Job::Int16(f, a)),
            (Some(IntActs::Int21(a)), Some(Integer::Int21(p, _))) => p.kernel(w.dtype).map(|f| Job::Int21(f, a)),
            _ => None,
        };
        job.unwrap_or_else(|| Job::F32(self.rows[slot(w.dtype).unwrap_or_else(|| panic!("{what}: not a compute dtype"))], x))
    }

    /// True when an integer path is on and takes products of `n` vectors with `dtype` weights.
    fn int_covers(&self, dtype: DType, n: usize) -> bool {
        self.int.as_ref().is_some_and(|p| p.covers(dtype, n))
    }

    /// Quantizes `n` vectors of `cols` inputs into the locked buffer `s` (of this path).
    fn quantize<'a>(&self, s: &'a mut Quantizing, x: &[f32], n: usize, cols: usize) -> IntActs<'a> {
        // SAFETY: each quantizer was chosen for an instruction set this CPU has.
        match (s, &self.int) {
            (Quantizing::Int8(s), Some(Integer::Int8(p))) => IntActs::Int8(unsafe { s.quantize(p.quantize, x, n, cols) }),
            (Quantizing::Int16(s), Some(Integer::Int16(p))) => IntActs::Int16(unsafe { s.quantize(p.quantize, x, n, cols) }),
            (Quantizing::Int21(s), Some(Integer::Int21(p, _))) => IntActs::Int21(unsafe { s.quantize(p.quantize, x, n, cols) }),
            _ => unreachable!("a buffer is locked from the path it quantizes for"),
        }
    }

    /// Quantizes `n` vectors of `cols` inputs into a caller's own `room` (see
    /// [`int8::carve`]), when an integer path is on and the room holds them.
    fn quantize_into<'a>(&self, room: &'a mut [f32], x: &[f32], n: usize, cols: usize) -> Option<IntActs<'a>> {
        let x = x.get(..n.checked_mul(cols)?)?;
        match self.int.as_ref()? {
            Integer::Int8(p) => p.quantize_into(room, x, cols).map(IntActs::Int8),
            Integer::Int16(p) => p.quantize_into(room, x, cols).map(IntActs::Int16),
            Integer::Int21(p, _) => p.quantize_into(room, x, cols).map(IntActs::Int21),
        }
    }

    /// Locks the integer path's activation buffer (a poisoned lock only means a panic
    /// elsewhere interrupted a quantization, which the next one overwrites).
    fn scratch(&self) -> Option<Quantizing<'_>> {
        use std::sync::PoisonError;
        Some(match self.int.as_ref()? {
            Integer::Int8(p) => Quantizing::Int8(p.scratch.lock().unwrap_or_else(PoisonError::into_inner)),
            Integer::Int16(p) => Quantizing::Int16(p.scratch.lock().unwrap_or_else(PoisonError::into_inner)),
            Integer::Int21(p, _) => Quantizing::Int21(p.scratch.lock().unwrap_or_else(PoisonError::into_inner)),
        })
    }

    /// `y[t][r] = Σ_c w[r][c] · x[t][c]` for the `n` vectors of `x` (n × w.cols) into `y`
    /// (n × w.rows), rows split across the pool. Results do not depend on the thread count.
    ///
    /// Panics if the slices are too short or the dtype is not a compute dtype: both are
    /// programming errors, checked when weights are loaded.
    pub fn matmul(&self, pool: &Pool, w: MatRef, x: &[f32], n: usize, y: &mut [f32]) {
        assert!(holds(x.len(), &[n, w.cols]) && holds(y.len(), &[n, w.rows]), "matmul: buffers too short");
        assert!(holds(w.data.len(), &[w.rows, w.row_bytes()]), "matmul: weight data too short");
        // Inputs split by parity or quantized are made here, on the calling thread, before the
        // parallel region: every participant reads the same ones.
        if let Some(mut buf) = self.split_buffer(&w, n) {
            let rows = w.rows;
            self.with_split_inputs(&mut buf, &w, x, n, |job, t0, tn| self.product(pool, &w, job, tn, &mut y[t0 * rows..]));
            return;
        }
        let mut scratch = if self.int_covers(w.dtype, n) { self.scratch() } else { None };
        let acts = scratch.as_mut().map(|s| self.quantize(s, x, n, w.cols));
        let job = self.job(&w, x, acts, "matmul");
        self.product(pool, &w, job, n, y);
    }

    /// One product, its buffers checked: inline when small or single-threaded, else rows split
    /// across the pool.
    fn product(&self, pool: &Pool, w: &MatRef, job: Job, n: usize, y: &mut [f32]) {
        let out = OutPtr(y.as_mut_ptr());
        let threads = pool.threads().min(w.rows.max(1));
        if threads == 1 || w.rows * w.cols * n < PARALLEL_MIN_MACS {
            // SAFETY: y holds n × rows elements, x and w are long enough (checked by the
            // caller); we are the only writer, and the kernel was chosen for an instruction set
            // this CPU has.
            unsafe { job.run(w, 0, w.rows, n, out.0, w.rows) };
            return;
        }
        let pieces = row_pieces(w.rows, threads);
        pool.run(&|_| {
            // Capture the whole `OutPtr` (which is Send), not its raw-pointer field.
            #[allow(clippy::redundant_locals)]
            let out = out;
            while let Some(i) = pieces.take() {
                let r = pool::aligned_chunk(w.rows, pieces.count(), i, PIECE_ROWS);
                // SAFETY: each piece's rows r of every vector t are written by the one
                // participant that took it.
                unsafe { job.run(w, r.start, r.end, n, out.0, w.rows) };
            }
        });
    }

    /// Several products (at most [`GROUP_MAX`]) of the same input in one parallel region (q, k and v; gate and up):
    /// each participant takes its share of every matrix's rows, so the pool hands off once
    /// instead of once per matrix. Each output equals its own [`Kernels::matmul`] bit for bit.
    pub fn matmul_group(&self, pool: &Pool, x: &[f32], n: usize, items: &mut [(MatRef, &mut [f32])]) {
        for (w, y) in items.iter() {
            assert!(holds(x.len(), &[n, w.cols]) && holds(y.len(), &[n, w.rows]), "matmul_group: buffers too short");
            assert!(holds(w.data.len(), &[w.rows, w.row_bytes()]), "matmul_group: weight data too short");
        }
        // Prefill products that take split inputs (Q4B32 by parity, the tiles' dtypes in bf16
        // parts) share the one buffer: split once for the group when it holds them all and
        // they share a dtype (an expert's gate and up; q, k and v), else the group runs its
        // products one by one (a region per product costs microseconds against milliseconds).
        let split_w = items.iter().map(|(w, _)| *w).find(|w| self.wants_split(w, n));
        if let Some(first) = split_w {
            let apart = items.iter().any(|(w, _)| w.cols != first.cols || (self.wants_split(w, n) && w.dtype != first.dtype));
            if n > SPLIT_VECTORS || apart {
                for (w, y) in items.iter_mut() {
                    self.matmul(pool, *w, x, n, y);
                }
                return;
            }
        }
        let mut split_buf = split_w.and_then(|w| self.split_buffer(&w, n));
        let split = split_buf.as_deref_mut().zip(split_w).map(|(buf, w)| self.split_job(buf, &w, x, n));
        // The shared input is quantized once for every integer-path product of the group.
        let int_cols = items.iter().find(|(w, _)| self.int_covers(w.dtype, n)).map(|(w, _)| w.cols);
        let mut scratch = int_cols.and_then(|_| self.scratch());
        let acts = scratch.as_mut().zip(int_cols).map(|(s, cols)| self.quantize(s, x, n, cols));
        let threads = pool.threads();
        let small = items.iter().map(|(w, _)| w.rows * w.cols * n).sum::<usize>() < PARALLEL_MIN_MACS;
        let job = |w: &MatRef| match split {
            Some(job) if self.wants_split(w, n) => job,
            _ => self.job(w, x, acts, "matmul_group"),
        };
        if threads == 1 || small || items.len() == 1 {
            for (w, y) in items.iter_mut() {
                self.product(pool, w, job(w), n, y);
            }
            return;
        }
        // A fixed array: decode allocates nothing per step.
        assert!(items.len() <= GROUP_MAX, "matmul_group: at most {GROUP_MAX} products");
        // Each product with its count of row pieces.
        let mut jobs: [Option<(MatRef, Job, OutPtr, usize)>; GROUP_MAX] = [None; GROUP_MAX];
        for (slot, (w, y)) in jobs.iter_mut().zip(items.iter_mut()) {
            *slot = Some((*w, job(w), OutPtr(y.as_mut_ptr()), row_pieces(w.rows, threads).count()));
        }
        // The products' pieces in one sequence: product k's pieces follow product k − 1's.
        let pieces = pool::Pieces::new(jobs.iter().flatten().map(|j| j.3).sum());
        pool.run(&|_| {
            while let Some(mut i) = pieces.take() {
                for (w, job, out, count) in jobs.iter().flatten() {
                    if i >= *count {
                        i -= count;
                        continue;
                    }
                    let r = pool::aligned_chunk(w.rows, *count, i, PIECE_ROWS);
                    // SAFETY: each piece's rows r of its output are written by the one
                    // participant that took it; the buffers were checked above and outlive the
                    // region.
                    unsafe { job.run(w, r.start, r.end, n, out.0, w.rows) };
                    break;
                }
            }
        });
    }

    /// Rows `r0..r1` of `w` against the `n` vectors of `x`, on the calling thread, into
    /// `y[t * y_stride + r]` (the building block of [`Kernels::matmul`], exposed for tests and
    /// benchmarks). Panics when a slice is too short or the range is outside the matrix.
    #[allow(clippy::too_many_arguments)]
    pub fn rows(&self, w: MatRef, r0: usize, r1: usize, x: &[f32], n: usize, y: &mut [f32], y_stride: usize) {
        assert!(r0 <= r1 && r1 <= w.rows && y_stride >= r1, "rows: bad row range");
        assert!(holds(x.len(), &[n, w.cols]), "rows: x too short");
        assert!(n == 0 || (n - 1).checked_mul(y_stride).and_then(|v| v.checked_add(r1)).is_some_and(|need| y.len() >= need),
            "rows: y too short");
        assert!(holds(w.data.len(), &[w.rows, w.row_bytes()]), "rows: weight data too short");
        if let Some(mut buf) = self.split_buffer(&w, n) {
            let out = y.as_mut_ptr();
            self.with_split_inputs(&mut buf, &w, x, n, |job, t0, tn| {
                // SAFETY: bounds asserted above (vectors t0..t0+tn of y); the ISA was detected.
                unsafe { job.run(&w, r0, r1, tn, out.add(t0 * y_stride), y_stride) }
            });
            return;
        }
        let mut scratch = if self.int_covers(w.dtype, n) { self.scratch() } else { None };
        let acts = scratch.as_mut().map(|s| self.quantize(s, x, n, w.cols));
        let job = self.job(&w, x, acts, "rows");
        // SAFETY: bounds asserted above; `y` is exclusively borrowed; the ISA was detected.
        unsafe { job.run(&w, r0, r1, n, y.as_mut_ptr(), y_stride) };
    }

    /// All rows of `w` against the `n` vectors of `x`, on the calling thread, into `y` (n ×
    /// rows), with `split` as this caller's own room for split inputs (Q4B32 by parity, or the
    /// AMX tiles' bf16 parts): what a pool participant computing whole products alone uses, so
    /// that several of them run at once without taking turns at the kernels' one buffer.
    /// `split` should hold a group's (`min(n, SPLIT_VECTORS)` vectors: n × cols values by
    /// parity, half as many again for the tiles, whose groups are whole pairs of 16 vectors;
    /// shorter, the products take turns at the kernels' buffer or split per call: slower).
    /// An integer path quantizes into `split` instead when it holds the quantized inputs (a
    /// quarter to a half of its f32 room), and otherwise takes turns at the kernels' buffer.
    /// Same bits as [`Kernels::matmul`] and [`Kernels::rows`]. Panics as [`Kernels::rows`].
    pub fn rows_alone(&self, w: MatRef, x: &[f32], n: usize, y: &mut [f32], split: &mut [f32]) {
        assert!(holds(x.len(), &[n, w.cols]) && holds(y.len(), &[n, w.rows]), "rows_alone: buffers too short");
        assert!(holds(w.data.len(), &[w.rows, w.row_bytes()]), "rows_alone: weight data too short");
        if self.int_covers(w.dtype, n) {
            if let Some(acts) = self.quantize_into(split, x, n, w.cols) {
                let job = self.job(&w, x, Some(acts), "rows_alone");
                // SAFETY: bounds asserted above; `y` is exclusively borrowed; the ISA was detected.
                return unsafe { job.run(&w, 0, w.rows, n, y.as_mut_ptr(), w.rows) };
            }
        }
        let alone = self.takes_split(&w, n) && split.len() >= self.split_len(&w, SPLIT_VECTORS.min(n));
        if !alone {
            // Other dtypes and instruction sets use no buffer; an integer path whose inputs do
            // not fit `split` quantizes into the kernels' buffer and takes turns at it.
            return self.rows(w, 0, w.rows, x, n, y, w.rows);
        }
        let out = y.as_mut_ptr();
        self.with_split_inputs(split, &w, x, n, |job, t0, tn| {
            // SAFETY: bounds asserted above (vectors t0..t0+tn of y); `y` is exclusively
            // borrowed; the ISA was detected.
            unsafe { job.run(&w, 0, w.rows, tn, out.add(t0 * w.rows), w.rows) }
        });
    }

    /// `Σ a[i]·b[i]` over the common length, in an order fixed by the length and the ISA.
    pub fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        // SAFETY: both slices hold n elements; the ISA was detected.
        unsafe { (self.dot)(&a[..n], &b[..n]) }
    }

    /// Attention scores: `out[i] = (q · key_i) × scale` for the `out.len()` keys of `q.len()`
    /// values at `keys[i × stride..]`, each in an order fixed by `q.len()` and the ISA, so a
    /// score's bits do not depend on how many keys are scored at once. Panics if `keys` is
    /// too short.
    pub fn attn_scores(&self, q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
        let n = out.len();
        assert!(n == 0 || (keys.len() >= q.len() && holds((keys.len() - q.len()).saturating_add(stride), &[n, stride])), "attn_scores: keys too short");
        // SAFETY: n keys of q.len() values lie in `keys` (asserted); the ISA was detected.
        unsafe { (self.scores)(q, keys, stride, scale, out) }
    }

    /// Attention's weighted sum: `out[d] = Σᵢ w[i] × value_i[d]` over the `w.len()` values of
    /// `out.len()` floats at `values[i × stride..]`, in key order from zero for every column
    /// (fused multiply-adds on SIMD instruction sets). Panics if `values` is too short.
    pub fn attn_mix(&self, w: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
        let n = w.len();
        assert!(n == 0 || (values.len() >= out.len() && holds((values.len() - out.len()).saturating_add(stride), &[n, stride])), "attn_mix: values too short");
        // SAFETY: n values of out.len() floats lie in `values` (asserted); the ISA was detected.
        unsafe { (self.mix)(w, values, stride, out) }
    }

    /// [`Kernels::attn_scores`] for the `q.len() / hd` query heads of a grouped-query attention
    /// group, which share their keys: `q` holds the heads one after another, `out` a row of
    /// `out.len() / heads` scores per head. Every score has the bits `attn_scores` gives it;
    /// AVX2 and AVX-512 load each key once for several heads. Panics on a shape that does not divide
    /// or keys too short.
    pub fn attn_scores_group(&self, q: &[f32], hd: usize, keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
        assert!(hd > 0 && !q.is_empty() && q.len().is_multiple_of(hd) && out.len().is_multiple_of(q.len() / hd), "attn_scores_group: shape");
        let n = out.len() / (q.len() / hd);
        let Some(f) = self.scores_group else {
            for (h, qh) in q.chunks_exact(hd).enumerate() {
                self.attn_scores(qh, keys, stride, scale, &mut out[h * n..(h + 1) * n]);
            }
            return;
        };
        assert!(n == 0 || (keys.len() >= hd && holds((keys.len() - hd).saturating_add(stride), &[n, stride])), "attn_scores_group: keys too short");
        // SAFETY: n keys of hd values lie in `keys` (asserted), the shape divides; the ISA was
        // detected.
        unsafe { f(q, hd, keys, stride, scale, out) }
    }

    /// [`Kernels::attn_mix`] for the `out.len() / hd` heads of a group, which share their
    /// values: `w` holds a row of weights per head, `out` the heads' sums one after another.
    /// Every sum has the bits `attn_mix` gives it. Panics on a shape that does not divide or
    /// values too short.
    pub fn attn_mix_group(&self, w: &[f32], values: &[f32], stride: usize, out: &mut [f32], hd: usize) {
        assert!(hd > 0 && !out.is_empty() && out.len().is_multiple_of(hd) && w.len().is_multiple_of(out.len() / hd), "attn_mix_group: shape");
        let n = w.len() / (out.len() / hd);
        let Some(f) = self.mix_group else {
            for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
                self.attn_mix(&w[h * n..(h + 1) * n], values, stride, oh);
            }
            return;
        };
        assert!(n == 0 || (values.len() >= hd && holds((values.len() - hd).saturating_add(stride), &[n, stride])), "attn_mix_group: values too short");
        // SAFETY: n values of hd floats lie in `values` (asserted), the shape divides; the ISA
        // was detected.
        unsafe { f(w, values, stride, out, hd) }
    }

    /// Attention's softmax of the scores `x` in place, with an extra logit `sink` in the
    /// denominator whose own probability is dropped (−∞ for none): the free function
    /// `softmax_with_sink` on the scalar ISA, a vector exponential within about 2 ulp of
    /// it on AVX2 and AVX-512.
    pub fn softmax_with_sink(&self, x: &mut [f32], sink: f32) {
        // SAFETY: the ISA was detected.
        unsafe { (self.softmax)(x, sink) }
    }

    /// `Σ a[i]`, in an order fixed by the length and the ISA (the read-bandwidth probe).
    pub fn sum(&self, a: &[f32]) -> f32 {
        // SAFETY: the ISA was detected.
        unsafe { (self.sum)(a) }
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
    softmax_with_sink(x, f32::NEG_INFINITY);
}

/// Softmax of `x` with an extra logit `sink` in the denominator whose own probability is
/// dropped (gpt-oss's attention sinks), as the reference computes it: the maximum over the
/// scores and the sink together. A sink of −∞ adds exactly 0: the plain softmax.
pub(crate) fn softmax_with_sink(x: &mut [f32], sink: f32) {
    let max = x.iter().copied().fold(sink, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum += (sink - max).exp();
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// [`softmax_with_sink`] with the kernel table's signature.
///
/// # Safety
/// None beyond the signature.
unsafe fn softmax_with_sink_unsafe(x: &mut [f32], sink: f32) {
    softmax_with_sink(x, sink)
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

/// Reproducible bytes and values for the kernels' unit tests (xorshift64).
#[cfg(test)]
pub(crate) struct TestRng(pub u64);

#[cfg(test)]
impl TestRng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in [−1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// `count` quantized blocks of `bytes` bytes each (Q8B32 34, Q4B32 18): a binary16 scale
    /// in 0.001..0.101, then payload bytes of any value.
    pub fn blocks(&mut self, bytes: usize, count: usize) -> Vec<u8> {
        let mut data = vec![0u8; count * bytes];
        for blk in data.chunks_exact_mut(bytes) {
            let scale = half::f16::from_f32(0.001 + self.f32().abs() * 0.1).to_bits();
            blk[..2].copy_from_slice(&scale.to_le_bytes());
            blk[2..].iter_mut().for_each(|v| *v = (self.next() >> 56) as u8);
        }
        data
    }
}
