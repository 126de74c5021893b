//! The opt-in int8-activation path (`Options::activations`) for Q8B32 and Q4B32 weights:
//! each input vector of a product is quantized once, before the parallel region, to blocks of
//! 32 signed bytes with an f32 scale (the layout of llama.cpp's Q8_0 activations), and each
//! weight block meets its activation block as an exact integer dot product — one `vpdpbusd`
//! per block with AVX-512 VNNI — instead of 32 widened f32 products. The reference path, f32
//! activations, stays the default; this one trades an activation rounding error of at most
//! 1/254 of each block's largest |x| for fewer instructions per weight (issue 4: Q4B32 with
//! f32 activations is compute-bound on the development machine).
//!
//! The arithmetic, which every instruction set follows exactly (so the SIMD kernels equal their
//! scalar twins here bit for bit):
//! - activation block: `d = max|x| / 127`, `q = round_half_even(x · (127 / max|x|))`, in
//!   −127..=127 (`d = 0` and `q = 0` for an all-zero block; `d = NaN` when the block holds a
//!   non-finite value, so the product comes out NaN as the f32 path's would);
//! - per weight block `b`: eight *lane* partial sums `p[j]`, each the exact integer sum of four
//!   products `w[k]·q[k]` over the positions [`Q8_LANES`] / [`Q4_LANES`] list (the positions one
//!   32-bit lane of `vpdpbusd` covers; the nibble layout of Q4B32 makes them differ);
//! - `s = f16_to_f32(w_scale) · d` (one f32 multiply), then `acc[b mod 2][j] = fma(p[j], s,
//!   acc[b mod 2][j])` — two sets of eight accumulators, even and odd blocks, so a 512-bit
//!   kernel holding two blocks per register could follow the same order;
//! - the result: `v[j] = acc[0][j] + acc[1][j]`, then the 8-lane tree of `avx2::hsum8`
//!   (`(v0+v4)+(v2+v6)` + `(v1+v5)+(v3+v7)`).
//!
//! Every lane partial is at most 4·128·127 in magnitude, so its conversion to f32 is exact; the
//! only roundings are the scale product, the fused multiply-adds and the final tree, in an
//! order fixed by the column count.

use super::scalar::F16_TO_F32;
use super::MatRef;
use crate::format::dtype::{DType, BLOCK};

/// Activations quantized for one product: `n` vectors of `cols` values (a multiple of 32), as
/// `q` (n × cols signed integers: bytes here, 16-bit in [`super::int16`]) and one scale per
/// block (`d`, n × cols/32).
#[derive(Clone, Copy, Debug)]
pub struct Acts<'a, Q = i8> {
    /// The quantized values, 32 per block.
    pub q: &'a [Q],
    /// One scale per block: a value is `q × d`.
    pub d: &'a [f32],
    /// Values per vector (a multiple of 32).
    pub cols: usize,
}

/// Row-dot kernel of the int8 path: rows `r0..r1` of `w` (Q8B32 or Q4B32) against the `n`
/// quantized vectors of `x`, writing `y[t * y_stride + r]`.
///
/// # Safety
/// As [`super::RowsFn`], with `x.cols == w.cols`, `x.q.len() >= n * w.cols` and
/// `x.d.len() >= n * w.cols / 32`.
pub type Int8RowsFn = unsafe fn(w: &MatRef, r0: usize, r1: usize, x: &Acts, n: usize, y: *mut f32, y_stride: usize);

/// The positions (within a block of 32) whose products Q8B32 lane `j` sums: four consecutive
/// bytes, as `vpdpbusd` groups a register of weights stored in position order.
pub const Q8_LANES: [[usize; 4]; 8] = {
    let mut t = [[0; 4]; 8];
    let mut j = 0;
    while j < 8 {
        let mut i = 0;
        while i < 4 {
            t[j][i] = 4 * j + i;
            i += 1;
        }
        j += 1;
    }
    t
};

/// The positions Q4B32 lane `j` sums. The kernels put a block's 16 low nibbles (even
/// positions, seed 000 "The payload") in the register's low half and the 16 high nibbles (odd
/// positions) in the high half, so lane `j < 4` covers even positions `8j, 8j+2, 8j+4, 8j+6`
/// and lane `j ≥ 4` the odd positions one above those of lane `j − 4`.
pub const Q4_LANES: [[usize; 4]; 8] = {
    let mut t = [[0; 4]; 8];
    let mut j = 0;
    while j < 8 {
        let mut i = 0;
        while i < 4 {
            t[j][i] = 8 * (j % 4) + 2 * i + j / 4;
            i += 1;
        }
        j += 1;
    }
    t
};

/// Rounds to the nearest integer, ties to even, for |v| < 2²²: adding 1.5·2²³ leaves no
/// fraction bits, so the addition itself rounds (the default rounding mode is to nearest even).
#[inline]
pub(super) fn round_half_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// Quantizes whole blocks: `x` into `q` (as long) and one scale per 32 values into `d`.
///
/// # Safety
/// `q.len() >= x.len()`, `d.len() >= x.len() / 32`, and the CPU has the function's
/// instruction set.
pub type QuantizeFn<Q = i8> = unsafe fn(x: &[f32], q: &mut [Q], d: &mut [f32]);

/// The scalar [`QuantizeFn`], block by block with [`quantize_block`].
///
/// # Safety
/// None beyond the signature.
pub unsafe fn quantize_scalar(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    for ((xb, qb), d) in x.chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK)).zip(d) {
        *d = quantize_block(xb, qb);
    }
}

/// Quantizes whole blocks of `x` with the quantizer of `isa` (which this CPU must support,
/// else the scalar one runs): for tests that compare the two.
pub fn quantize_with(isa: Int8Isa, x: &[f32], q: &mut [i8], d: &mut [f32]) {
    let f = if isa.supported() { isa.quantizer() } else { quantize_scalar as QuantizeFn };
    // SAFETY: the ISA was checked.
    unsafe { quantize_blocks(f, x, q, d) }
}

/// Runs quantizer `f` over the whole blocks that `x`, `q` and `d` all hold.
///
/// # Safety
/// The CPU has `f`'s instruction set.
pub(super) unsafe fn quantize_blocks<Q>(f: QuantizeFn<Q>, x: &[f32], q: &mut [Q], d: &mut [f32]) {
    let blocks = (x.len() / BLOCK).min(q.len() / BLOCK).min(d.len());
    // SAFETY: the slices are cut to whole blocks that all three hold; the ISA is the caller's.
    unsafe { f(&x[..blocks * BLOCK], &mut q[..blocks * BLOCK], &mut d[..blocks]) }
}

/// Quantizes one block of 32 activations into `q`, returning its scale `d` (see the module
/// comment for the rule).
pub fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    quantize_block_to(x, q)
}

/// The block rule of both integer paths, for the largest level `L` of `Q` (127, 32767):
/// `d = max|x| / L`, `q = round_half_even(x · (L / max|x|))`; `d = 0` and `q = 0` for an
/// all-zero block, `d = NaN` and `q = 0` when the block holds a non-finite value.
pub fn quantize_block_to<Q: Quantum>(x: &[f32], q: &mut [Q]) -> f32 {
    let mut amax = 0.0f32;
    let mut finite = true;
    for &v in x {
        amax = amax.max(v.abs());
        finite &= v.is_finite();
    }
    if !finite || amax == 0.0 {
        q.fill(Q::default());
        return if finite { 0.0 } else { f32::NAN };
    }
    let inv = Q::LEVEL / amax;
    for (o, &v) in q.iter_mut().zip(x) {
        // |v · inv| ≤ L·(1 + 2⁻²³): it rounds into −L..=L (the cast saturates anyway).
        *o = Q::from_level(round_half_even(v * inv));
    }
    amax / Q::LEVEL
}

/// The quantized-activation buffer of a [`super::Kernels`] with an integer path on (int8, or
/// int16 in [`super::int16`]): sized at model open for the widest product of a prefill chunk,
/// so a decode step allocates nothing (a larger product, outside a model, grows it once).
#[derive(Debug, Default)]
pub struct ActScratch<Q = i8> {
    q: Vec<Q>,
    d: Vec<f32>,
}

impl<Q: Copy + Default> ActScratch<Q> {
    /// Room for `values` activations.
    pub fn with_capacity(values: usize) -> ActScratch<Q> {
        let values = values.div_ceil(BLOCK) * BLOCK;
        ActScratch { q: vec![Q::default(); values], d: vec![0.0; values / BLOCK] }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.q.len() * std::mem::size_of::<Q>() + 4 * self.d.len()
    }

    /// Quantized values held.
    pub fn values(&self) -> usize {
        self.q.len()
    }

    /// Quantizes the `n` vectors of `x` (each `cols` long, a multiple of 32) with `f`.
    ///
    /// # Safety
    /// The CPU has `f`'s instruction set.
    pub unsafe fn quantize(&mut self, f: QuantizeFn<Q>, x: &[f32], n: usize, cols: usize) -> Acts<'_, Q> {
        let values = n * cols / BLOCK * BLOCK;
        if self.q.len() < values {
            *self = ActScratch::with_capacity(values);
        }
        let blocks = values / BLOCK;
        // SAFETY: q and d hold `values` and `blocks` entries; the caller vouches for the ISA.
        unsafe { f(&x[..values], &mut self.q[..values], &mut self.d[..blocks]) };
        Acts { q: &self.q[..values], d: &self.d[..blocks], cols }
    }
}

/// The integer types activations are quantized to: plain integers of at most 4-byte
/// alignment, any bit pattern valid (what `carve` relies on).
pub trait Quantum: Copy + Default + private::Sealed {
    /// The largest quantized magnitude.
    const LEVEL: f32;
    /// A rounded level (an integer in −LEVEL..=LEVEL) as this type.
    fn from_level(v: f32) -> Self;
}
impl Quantum for i8 {
    const LEVEL: f32 = 127.0;
    fn from_level(v: f32) -> i8 {
        v as i8
    }
}
impl Quantum for i16 {
    const LEVEL: f32 = 32767.0;
    fn from_level(v: f32) -> i16 {
        v as i16
    }
}
mod private {
    pub trait Sealed {}
    impl Sealed for i8 {}
    impl Sealed for i16 {}
    impl Sealed for super::super::int21::Digits {}
}

/// Carves a caller's f32 `room` into the scales and the quantized values of `blocks` blocks of
/// 32 activations (scales first, then the values in the rest, reinterpreted), when it holds
/// them: a pool participant computing whole products alone quantizes into its own room
/// instead of taking turns at the kernels' buffer.
pub(super) fn carve<Q: Quantum>(room: &mut [f32], blocks: usize) -> Option<(&mut [Q], &mut [f32])> {
    let values = blocks.checked_mul(BLOCK)?;
    let value_floats = values.checked_mul(std::mem::size_of::<Q>())?.div_ceil(4);
    if room.len() < blocks.checked_add(value_floats)? {
        return None;
    }
    let (d, rest) = room.split_at_mut(blocks);
    let rest = &mut rest[..value_floats];
    // SAFETY: `Q` is i8, i16 or three i8 (sealed): its alignment divides f32's, every bit pattern is a
    // valid value, and `values` of them fit the `value_floats` f32s borrowed exclusively here.
    let q = unsafe { std::slice::from_raw_parts_mut(rest.as_mut_ptr().cast::<Q>(), values) };
    Some((q, d))
}

/// Bytes an [`ActScratch`] for `values` activations holds (for the memory plan).
pub fn scratch_bytes(values: usize) -> u64 {
    let values = values.div_ceil(BLOCK) * BLOCK;
    (values + 4 * (values / BLOCK)) as u64
}

/// Which kernels an integer path runs: the int8 path (all three), or the int16 one
/// ([`super::int16`]: the scalar twins, AVX2 — with AVX-VNNI where the CPU has it — or AVX-512 VNNI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Isa {
    /// The scalar twins below.
    Scalar,
    /// AVX2 `vpmaddubsw` + `vpmaddwd` (int16: `vpmaddwd` + `vpaddd`), or AVX-VNNI's
    /// `vpdpbusd` (`vpdpwssd`) on CPUs that have it ([`Int8Isa::kernels_name`]).
    Avx2,
    /// AVX-512 VNNI `vpdpbusd` (with VL, BW and VBMI), on 512-bit registers (two blocks each).
    Avx512Vnni,
}

impl Int8Isa {
    /// The instruction set's name, as `info` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Int8Isa::Scalar => "scalar",
            Int8Isa::Avx2 => "avx2",
            Int8Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// The integer kernels of this instruction set as they run on this CPU, as `info` and
    /// `bench matmul` report them: its name, and `avx2+avx-vnni` where AVX-VNNI's `vpdpbusd`
    /// (int8) or `vpdpwssd` (int16, [`super::int16`]) does the AVX2 kernels' products.
    pub fn kernels_name(self) -> &'static str {
        #[cfg(target_arch = "x86_64")]
        if self == Int8Isa::Avx2 && super::has_avx_vnni() {
            return "avx2+avx-vnni";
        }
        self.name()
    }

    /// The int8 kernels that go with the f32 kernels of `isa`: VNNI where the AVX-512 kernels
    /// run and the CPU has VNNI and VBMI, else AVX2 on x86; the scalar twins on AArch64 (no
    /// NEON int8 kernels are written) and under `force_scalar`.
    pub fn for_isa(isa: super::Isa) -> Int8Isa {
        match isa {
            #[cfg(target_arch = "x86_64")]
            super::Isa::Avx512 | super::Isa::Amx if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vbmi") => Int8Isa::Avx512Vnni,
            #[cfg(target_arch = "x86_64")]
            super::Isa::Avx512 | super::Isa::Amx | super::Isa::Avx2 => Int8Isa::Avx2,
            _ => Int8Isa::Scalar,
        }
    }

    /// True when this CPU can run these kernels.
    pub fn supported(self) -> bool {
        match self {
            Int8Isa::Scalar => true,
            Int8Isa::Avx2 => super::Isa::Avx2.supported(),
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx512Vnni => {
                super::Isa::Avx512.supported() && is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vbmi")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The activation quantizer (AVX2 for both x86 paths: it runs once per input vector, a
    /// small cost next to the product, and 256-bit is what Zen 4 executes natively).
    pub(super) fn quantizer(self) -> QuantizeFn {
        match self {
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx2 | Int8Isa::Avx512Vnni => super::int8_x86::quantize_avx2,
            #[allow(unreachable_patterns)]
            _ => quantize_scalar,
        }
    }

    /// The (Q8B32, Q4B32) kernels.
    pub(super) fn kernels(self) -> (Int8RowsFn, Int8RowsFn) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx512Vnni => (super::int8_x86::rows_q8_vnni, super::int8_x86::rows_q4_vnni),
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx2 if super::has_avx_vnni() => (super::int8_x86::rows_q8_avxvnni, super::int8_x86::rows_q4_avxvnni),
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx2 => (super::int8_x86::rows_q8_avx2, super::int8_x86::rows_q4_avx2),
            #[allow(unreachable_patterns)]
            _ => (rows_q8, rows_q4),
        }
    }
}

/// The kernels and scratch of an integer path inside a [`super::Kernels`]: int8 (`Q = i8`,
/// this module) or int16 (`Q = i16`, [`super::int16`]).
#[derive(Debug)]
pub(super) struct IntPath<Q> {
    pub isa: Int8Isa,
    pub quantize: QuantizeFn<Q>,
    /// The Q8B32 kernel, when the path covers Q8B32 (int21 does not: its sums would overflow).
    pub q8: Option<IntRowsFn<Q>>,
    pub q4: IntRowsFn<Q>,
    pub scratch: std::sync::Mutex<ActScratch<Q>>,
}

/// Row kernel of an integer path, generic over the quantized type ([`Int8RowsFn`] is `Q = i8`).
///
/// # Safety
/// As [`Int8RowsFn`].
pub type IntRowsFn<Q> = unsafe fn(w: &MatRef, r0: usize, r1: usize, x: &Acts<Q>, n: usize, y: *mut f32, y_stride: usize);

impl<Q: Quantum> IntPath<Q> {
    /// Quantizes the whole blocks of `x` (`cols` values per vector) into a caller's own
    /// `room` ([`carve`]), when it holds them.
    pub fn quantize_into<'a>(&self, room: &'a mut [f32], x: &[f32], cols: usize) -> Option<Acts<'a, Q>> {
        let blocks = x.len() / BLOCK;
        let (q, d) = carve::<Q>(room, blocks)?;
        // SAFETY: the quantizer was chosen for an instruction set this CPU has.
        unsafe { quantize_blocks(self.quantize, x, q, d) };
        Some(Acts { q, d, cols })
    }
}

impl<Q: Copy + Default> Clone for IntPath<Q> {
    /// A copy with its own scratch of the same size (a scratch is never shared).
    fn clone(&self) -> IntPath<Q> {
        let values = self.scratch.lock().map_or(0, |s| s.values());
        IntPath { isa: self.isa, quantize: self.quantize, q8: self.q8, q4: self.q4, scratch: std::sync::Mutex::new(ActScratch::with_capacity(values)) }
    }
}

impl IntPath<i8> {
    /// The int8 path for `isa`'s kernels, with room for `values` activations.
    pub fn int8(isa: Int8Isa, values: usize) -> IntPath<i8> {
        let (q8, q4) = isa.kernels();
        IntPath { isa, quantize: isa.quantizer(), q8: Some(q8), q4, scratch: std::sync::Mutex::new(ActScratch::with_capacity(values)) }
    }
}

impl IntPath<i16> {
    /// The int16 path with the kernels that go with `isa` ([`super::int16`]), with room for
    /// `values` activations.
    pub fn int16(isa: Int8Isa, values: usize) -> IntPath<i16> {
        let (isa, quantize, q8, q4) = super::int16::kernels(isa);
        IntPath { isa, quantize, q8: Some(q8), q4, scratch: std::sync::Mutex::new(ActScratch::with_capacity(values)) }
    }
}

impl IntPath<super::int21::Digits> {
    /// The int21 path with the kernels that go with `isa` and the decode tiles' prefetch scheme
    /// ([`super::int21`]), with room for `values` activations.
    pub fn int21(isa: Int8Isa, prefetch: super::Prefetch, values: usize) -> IntPath<super::int21::Digits> {
        let (isa, quantize, q4) = super::int21::kernels(isa, prefetch);
        IntPath { isa, quantize, q8: None, q4, scratch: std::sync::Mutex::new(ActScratch::with_capacity(values)) }
    }
}

impl<Q> IntPath<Q> {
    /// The kernel for a weight dtype, when the path covers it.
    pub fn kernel(&self, dtype: DType) -> Option<IntRowsFn<Q>> {
        match dtype {
            DType::Q8B32 => self.q8,
            DType::Q4B32 => Some(self.q4),
            _ => None,
        }
    }
}

/// Sums two sets of eight lane accumulators in the order of the SIMD kernels: even + odd
/// blocks per lane, then `avx2::hsum8`'s tree.
#[inline]
pub fn sum_lanes(acc: &[[f32; 8]; 2]) -> f32 {
    let v: [f32; 8] = std::array::from_fn(|j| acc[0][j] + acc[1][j]);
    let h: [f32; 4] = std::array::from_fn(|j| v[j] + v[j + 4]);
    (h[0] + h[2]) + (h[1] + h[3])
}

/// One row against one quantized vector, in the module's order; `weight(block, k)` is the
/// signed value at position `k` of the row's block.
#[inline]
fn row_dot(blocks: usize, scale_bits: impl Fn(usize) -> u16, weight: impl Fn(usize, usize) -> i32, lanes: &[[usize; 4]; 8],
           q: &[i8], d: &[f32]) -> f32 {
    let mut acc = [[0.0f32; 8]; 2];
    for b in 0..blocks {
        let s = F16_TO_F32[scale_bits(b) as usize] * d[b];
        let qb = &q[b * BLOCK..(b + 1) * BLOCK];
        for (j, group) in lanes.iter().enumerate() {
            let p: i32 = group.iter().map(|&k| weight(b, k) * qb[k] as i32).sum();
            acc[b % 2][j] = (p as f32).mul_add(s, acc[b % 2][j]);
        }
    }
    sum_lanes(&acc)
}

/// The scalar twins' loop, both integer paths: rows `r0..r1` of `w` (blocks of `bytes`)
/// against the `n` quantized vectors of `x`, each (row, vector) by `dot(row, q, d)` on the
/// row's bytes and the vector's values and scales.
///
/// # Safety
/// As [`Int8RowsFn`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn scalar_rows_by<Q>(w: &MatRef, r0: usize, r1: usize, x: &Acts<Q>, n: usize, y: *mut f32, y_stride: usize,
                                      bytes: usize, dot: impl Fn(&[u8], &[Q], &[f32]) -> f32) {
    let rb = w.row_bytes();
    let blocks = rb / bytes;
    let per = blocks * BLOCK;
    for r in r0..r1 {
        let row = &w.data[r * rb..(r + 1) * rb];
        for t in 0..n {
            let v = dot(row, &x.q[t * per..(t + 1) * per], &x.d[t * blocks..(t + 1) * blocks]);
            // SAFETY: the caller guarantees this element is ours to write.
            unsafe { *y.add(t * y_stride + r) = v };
        }
    }
}

macro_rules! scalar_rows {
    ($name:ident, $bytes:expr, $lanes:expr, $weight:expr) => {
        /// Scalar twin of the int8-path kernels (see [`Int8RowsFn`]).
        ///
        /// # Safety
        /// As [`Int8RowsFn`].
        pub unsafe fn $name(w: &MatRef, r0: usize, r1: usize, x: &Acts, n: usize, y: *mut f32, y_stride: usize) {
            // SAFETY: forwarded contract.
            unsafe {
                scalar_rows_by(w, r0, r1, x, n, y, y_stride, $bytes, |row, q, d| {
                    row_dot(row.len() / $bytes, |b| u16::from_le_bytes([row[b * $bytes], row[b * $bytes + 1]]),
                        |b, k| $weight(&row[b * $bytes..(b + 1) * $bytes], k), &$lanes, q, d)
                })
            }
        }
    };
}

scalar_rows!(rows_q8, 34, Q8_LANES, |blk: &[u8], k: usize| (blk[2 + k] as i8) as i32);
scalar_rows!(rows_q4, 18, Q4_LANES, |blk: &[u8], k: usize| super::scalar::q4_at(blk, k) as i32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_cover_every_position_once() {
        for lanes in [Q8_LANES, Q4_LANES] {
            let mut seen = [0; 32];
            lanes.iter().flatten().for_each(|&k| seen[k] += 1);
            assert_eq!(seen, [1; 32]);
        }
        assert_eq!(Q4_LANES[0], [0, 2, 4, 6]);
        assert_eq!(Q4_LANES[4], [1, 3, 5, 7]);
        assert_eq!(Q4_LANES[7], [25, 27, 29, 31]);
    }

    /// The block rule at both widths: the extremes at ±L, every value within half a step,
    /// ties to even, zero and non-finite blocks.
    fn rounds_to_the_nearest_level<Q: Quantum + Into<i32> + std::fmt::Debug + PartialEq>() {
        let level = Q::LEVEL;
        let mut x: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) / 8.0).collect();
        let mut q = [Q::default(); 32];
        let d = quantize_block_to(&x, &mut q);
        assert_eq!(d, 15.5 / 8.0 / level);
        assert_eq!((q[0].into(), q[31].into()), (-(level as i32), level as i32));
        for (v, &k) in x.iter().zip(&q) {
            let k: i32 = k.into();
            assert!((v - d * k as f32).abs() <= d / 2.0 * 1.0001, "{v} -> {k}");
        }
        // Ties go to even: 0.5, 1.5 and −2.5 steps of d.
        x.fill(0.0);
        x[0] = level;
        x[1] = 0.5;
        x[2] = 1.5;
        x[3] = -2.5;
        let d = quantize_block_to(&x, &mut q);
        assert_eq!((d, q[1].into(), q[2].into(), q[3].into()), (1.0, 0, 2, -2));
        assert_eq!(quantize_block_to(&[0.0; 32], &mut q), 0.0);
        assert_eq!(q, [Q::default(); 32]);
        x[5] = f32::INFINITY;
        assert!(quantize_block_to(&x, &mut q).is_nan());
        x[5] = f32::NAN;
        assert!(quantize_block_to(&x, &mut q).is_nan());
    }

    #[test]
    fn block_quantization_rounds_to_the_nearest_level() {
        rounds_to_the_nearest_level::<i8>();
        rounds_to_the_nearest_level::<i16>();
    }
}
