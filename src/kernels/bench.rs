//! The matrix × vector loops measured without a model: GB/s of weight bytes streamed per dtype,
//! next to the machine's read bandwidth measured the same way (a SIMD sum over a buffer far
//! larger than the last-level cache) and the pool's dispatch latency. Figures are for printing
//! and recording, never for asserting.
//!
//! Decode is one matrix × vector product per weight matrix per token, each weight read once
//! from DRAM, so the bound on tokens per second is read bandwidth ÷ model bytes; a kernel that
//! streams at the read bandwidth leaves nothing on the table.
//!
//! Beside them, [`attention`]: the attention kernels per head against their grouped-query
//! versions, which read a group's keys and values once for its heads.

use super::{pool, Isa, Kernels, MatRef, Pool};
use crate::sys::CpuList;
use crate::error::{Error, Result};
use crate::format::dtype::DType;
use crate::sys::AlignedBuf;
use std::time::Instant;

/// Bytes per matrix (and of the read-bandwidth buffer) when no row count is given: 1 GiB, 32×
/// the 32 MiB L3 of the development machine and far above any current desktop's, so every
/// pass streams from DRAM (a cyclic sweep over a set this much larger than the cache hits in it
/// only by accident).
pub const DEFAULT_BYTES: usize = 1 << 30;

/// What to measure.
#[derive(Clone, Debug)]
pub struct MatmulBench {
    /// Rows per matrix; `None` sizes each dtype's matrix to [`MatmulBench::bytes`].
    pub rows: Option<usize>,
    /// Columns (a multiple of 32, so every dtype can hold the shape).
    pub cols: usize,
    /// Bytes per matrix when `rows` is `None`, and of the read-bandwidth buffer.
    pub bytes: usize,
    /// The largest thread count; 1 thread is always measured too.
    pub threads: usize,
    /// CPUs to bind the pool to.
    pub cpus: Option<CpuList>,
    /// Kernels to use; `None` is the best this CPU has.
    pub isa: Option<Isa>,
    /// The decode tiles' prefetch scheme; `None` is the one chosen for this CPU.
    pub prefetch: Option<super::Prefetch>,
    /// The AVX-512 prefill GEMM's token groups; `None` is the rule chosen for this CPU.
    pub token_groups: Option<super::TokenGroups>,
    /// The products' activations: `Int8`, `Int16` (Q8B32 and Q4B32) or `Int21` (Q4B32)
    /// through that integer path — the quantization of the input vector is part of each timed
    /// product, as in decode — or the f32 kernels (`F32`, and `Auto`: the kernels alone, with
    /// no model to decide for).
    pub activations: crate::Activations,
    /// Timed passes per measurement (the median is reported), after one untimed warm-up.
    pub passes: usize,
    /// The dtypes to measure.
    pub dtypes: Vec<DType>,
    /// Empty parallel regions per pass of the dispatch-latency measurement.
    pub regions: usize,
    /// Vectors per product: 1 is decode; more is a prefill chunk, where each weight read serves
    /// every vector and the kernels are compute-bound.
    pub tokens: usize,
    /// Expert-shaped products: the matrix is cut into matrices of `rows` rows (required), and
    /// each participant multiplies whole ones of them, one after another, on its own — as an
    /// MoE step computes its experts — instead of every participant taking a share of rows of
    /// one matrix. Beside the one-matrix figure this shows what small products cost that one
    /// large one hides: hundreds of starts a token, and rows as narrow as an expert's (the
    /// unaligned 768-column down projection is how the tiles' prefetch gap was found).
    pub experts: bool,
}

impl Default for MatmulBench {
    fn default() -> MatmulBench {
        MatmulBench {
            rows: None,
            cols: 8192,
            bytes: DEFAULT_BYTES,
            threads: crate::sys::available_cpus(),
            cpus: None,
            isa: None,
            prefetch: None,
            token_groups: None,
            activations: crate::Activations::F32,
            passes: 5,
            dtypes: vec![DType::F32, DType::BF16, DType::F16, DType::Q8B32, DType::Q4B32],
            regions: 2000,
            tokens: 1,
            experts: false,
        }
    }
}

/// One measurement per thread count.
#[derive(Clone, Debug)]
pub struct Rate {
    /// Threads of the measurement.
    pub threads: usize,
    /// Median seconds per pass.
    pub secs: f64,
    /// Bytes per pass ÷ `secs`, in 10⁹ bytes per second.
    pub gb_per_s: f64,
    /// Multiply-adds per pass ÷ `secs`, in 10⁹ per second.
    pub gmac_per_s: f64,
}

/// The measurements of one dtype.
#[derive(Clone, Debug)]
pub struct DtypeRates {
    /// The weights' element type.
    pub dtype: DType,
    /// Rows of the weight matrix.
    pub rows: usize,
    /// Columns of the weight matrix.
    pub cols: usize,
    /// Weight bytes streamed per pass.
    pub bytes: usize,
    /// One measurement per thread count.
    pub rates: Vec<Rate>,
    /// The read bandwidth per thread count, measured in alternation with this dtype's passes
    /// (a probe pass after each product pass), so that the product's share of it compares two
    /// figures of the same seconds: on a host whose bandwidth drifts, a probe taken once
    /// before all dtypes moved a product's share by ±10 points between runs. Only where the
    /// matrices are at least half the probe's size, which no cache holds between passes; a
    /// smaller product (a shape that stays in L2 or L3, measured on purpose) runs its passes
    /// back to back as before, and this is the probe measured before all dtypes.
    pub read: Vec<Rate>,
}

/// Everything `bench matmul` prints.
#[derive(Clone, Debug)]
pub struct MatmulReport {
    /// The instruction set the kernels ran on.
    pub isa: Isa,
    /// The decode tiles' prefetch scheme.
    pub prefetch: super::Prefetch,
    /// The AVX-512 prefill GEMM's token groups.
    pub token_groups: super::TokenGroups,
    /// The integer path the products were measured through (`Int8`, `Int16`, `Int21`) and its
    /// kernels, when one was.
    pub integer: Option<(crate::Activations, super::Int8Isa)>,
    /// The thread counts measured, ascending.
    pub threads: Vec<usize>,
    /// The CPUs the threads were bound to, when bound.
    pub cpus: Option<CpuList>,
    /// Passes per measurement (the median is reported).
    pub passes: usize,
    /// Vectors per product.
    pub tokens: usize,
    /// Bytes of the read-bandwidth buffer.
    pub read_bytes: usize,
    /// Read bandwidth per thread count.
    pub read: Vec<Rate>,
    /// Median microseconds for an empty parallel region, per thread count.
    pub dispatch_us: Vec<f64>,
    /// The f32 fused multiply-add peak of the kernels' instruction set, per thread count
    /// (`gmac_per_s`; `peak::fma`).
    pub fma_peak: Vec<Rate>,
    /// The integer multiply-add peak of the int8 path's instructions, per thread count
    /// (byte products; `peak::int8`).
    pub int8_peak: Vec<Rate>,
    /// The integer multiply-add peak of the int16 path's instructions, per thread count
    /// (16-bit products; `peak::int16`), when it was measured.
    pub int16_peak: Vec<Rate>,
    /// The products measured, one per dtype.
    pub dtypes: Vec<DtypeRates>,
}

impl MatmulReport {
    /// The peak a dtype's kernels are held to, per thread count: the int8 (int16) peak for
    /// Q8B32 and Q4B32 through the int8 (int16) path, the int8 one for Q4B32 through the
    /// int21 path (byte products, three per multiply-add), the f32 one otherwise.
    pub fn peak_for(&self, dtype: DType) -> &[Rate] {
        use crate::Activations::{Int16, Int21, Int8};
        match (self.integer.map(|(path, _)| path), dtype) {
            (Some(Int8), DType::Q8B32 | DType::Q4B32) | (Some(Int21), DType::Q4B32) => &self.int8_peak,
            (Some(Int16), DType::Q8B32 | DType::Q4B32) => &self.int16_peak,
            _ => &self.fma_peak,
        }
    }
}

/// Runs the benchmark: read bandwidth, dispatch latency, then every dtype at every thread count.
pub fn matmul(opts: &MatmulBench) -> Result<MatmulReport> {
    if opts.cols == 0 || !opts.cols.is_multiple_of(32) {
        return Err(Error::arg(format!("bench matmul: cols {} is not a positive multiple of 32", opts.cols)));
    }
    if opts.threads == 0 || opts.passes == 0 || opts.bytes < 4096 || opts.tokens == 0 {
        return Err(Error::arg("bench matmul: threads, passes, tokens and bytes must be positive"));
    }
    if opts.experts && opts.rows.is_none() {
        return Err(Error::arg("bench matmul: expert-shaped products (--experts) need --rows, the rows of one matrix"));
    }
    let mut kernels = match opts.isa {
        None => Kernels::select(false),
        Some(isa) => Kernels::with_isa(isa).ok_or_else(|| Error::unsupported(format!(
            "bench matmul: this CPU cannot run the {} kernels", isa.name())))?,
    };
    if let Some(p) = opts.prefetch {
        kernels = kernels.with_prefetch(p);
    }
    if let Some(g) = opts.token_groups {
        kernels = kernels.with_token_groups(g);
    }
    // As a model holds it: room for a Q4B32 product's inputs split by parity.
    kernels = kernels.with_split_buffer(opts.cols * super::split_vectors(opts.tokens));
    let values = opts.cols * opts.tokens;
    kernels = match opts.activations {
        crate::Activations::Auto | crate::Activations::F32 => kernels,
        crate::Activations::Int8 => kernels.with_int8_activations(values),
        crate::Activations::Int16 => kernels.with_int16_activations(values),
        crate::Activations::Int21 => kernels.with_int21_activations(values),
    };
    let mut threads = vec![1, opts.threads];
    threads.dedup();
    let pools = threads.iter().map(|&t| Pool::with_cpus(t, opts.cpus.as_ref())).collect::<Result<Vec<_>>>()?;
    pools[0].bind_caller()?;
    let probe = ReadProbe::new(opts.bytes, &kernels, &pools, opts.passes)?;
    let dispatch_us = pools.iter().map(|p| dispatch_latency(p, opts.passes, opts.regions.max(1))).collect();
    let isa = kernels.isa();
    let int8_isa = super::Int8Isa::for_isa(isa);
    let fma_peak = pools.iter().map(|p| peak(p, opts.passes, |n| super::peak::fma(isa, n))).collect();
    let int8_peak = pools.iter().map(|p| peak(p, opts.passes, |n| super::peak::int8(int8_isa, n))).collect();
    let int16_peak = match kernels.int16_isa() {
        Some(i) => pools.iter().map(|p| peak(p, opts.passes, |n| super::peak::int16(i, n))).collect(),
        None => Vec::new(),
    };
    let mut dtypes = Vec::new();
    for &dtype in &opts.dtypes {
        dtypes.push(stream_dtype(&kernels, &pools, opts, dtype, &probe)?);
    }
    Ok(MatmulReport { isa: kernels.isa(), prefetch: kernels.prefetch(), token_groups: kernels.token_groups(), integer: kernels.integer_isa().map(|i| (opts.activations, i)), threads, cpus: opts.cpus.clone(), passes: opts.passes, tokens: opts.tokens,
        read_bytes: probe.bytes(), read: probe.first, dispatch_us, fma_peak, int8_peak, int16_peak, dtypes })
}

/// The median of `passes` timings of `f`, after one untimed warm-up.
fn median_secs(passes: usize, mut f: impl FnMut()) -> f64 {
    median_pair(passes, &mut f, || {}).0
}

/// The medians of `passes` timings of `f` and of `g`, run in alternation (f, g, f, g, ...)
/// after one untimed warm-up of each.
fn median_pair(passes: usize, mut f: impl FnMut(), mut g: impl FnMut()) -> (f64, f64) {
    let time = |h: &mut dyn FnMut()| {
        let start = Instant::now();
        h();
        start.elapsed().as_secs_f64()
    };
    f();
    g();
    let (mut tf, mut tg): (Vec<f64>, Vec<f64>) = (0..passes).map(|_| (time(&mut f), time(&mut g))).unzip();
    tf.sort_by(f64::total_cmp);
    tg.sort_by(f64::total_cmp);
    (tf[tf.len() / 2], tg[tg.len() / 2])
}

fn rate(threads: usize, bytes: usize, macs: usize, secs: f64) -> Rate {
    let secs_ = secs.max(1e-12);
    Rate { threads, secs, gb_per_s: bytes as f64 / secs_ / 1e9, gmac_per_s: macs as f64 / secs_ / 1e9 }
}

/// Times `passes` of `product` on pool `p` (the pool's `i`-th), and the read bandwidth beside
/// them ([`DtypeRates::read`]): probe passes in alternation when the product streams `bytes`
/// of at least half the probe's, else the probe's first measurement on that pool.
fn time_product(p: &Pool, i: usize, k: &Kernels, passes: usize, bytes: usize, probe: &ReadProbe, product: impl FnMut()) -> (f64, Rate) {
    if bytes < probe.bytes() / 2 {
        return (median_secs(passes, product), probe.first[i].clone());
    }
    let (secs, read_secs) = median_pair(passes, product, || probe.pass(k, p));
    (secs, rate(p.threads(), probe.bytes(), 0, read_secs))
}

/// The read-bandwidth probe: a pool-wide SIMD sum over a buffer far larger than the cache,
/// every participant summing its contiguous share, which is what a split matrix × vector
/// product reads.
struct ReadProbe {
    buf: AlignedBuf,
    /// Its first measurement on each pool, before any product.
    first: Vec<Rate>,
}

impl ReadProbe {
    /// A buffer of `bytes` (rounded down to 64), measured once on each pool.
    fn new(bytes: usize, k: &Kernels, pools: &[Pool], passes: usize) -> Result<ReadProbe> {
        let mut buf = AlignedBuf::zeroed(bytes / 64 * 64, 64)?;
        // Touch every page with real values: a never-written allocation reads as the kernel's
        // zero page, which is cached and would measure nothing.
        for (i, v) in buf.as_f32_mut().iter_mut().enumerate() {
            *v = (i % 1021) as f32;
        }
        let mut probe = ReadProbe { buf, first: Vec::new() };
        probe.first = pools.iter().map(|p| rate(p.threads(), probe.bytes(), 0, median_secs(passes, || probe.pass(k, p)))).collect();
        Ok(probe)
    }

    fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// One pass over the buffer on pool `p`.
    fn pass(&self, k: &Kernels, p: &Pool) {
        let values = self.buf.as_f32();
        p.run(&|part| {
            std::hint::black_box(k.sum(&values[pool::chunk(values.len(), p.threads(), part)]));
        });
    }
}

/// Multiply-adds per second of `probe` (which runs a given number of rounds and returns the
/// multiply-adds done) on every participant of the pool at once.
fn peak(p: &Pool, passes: usize, probe: impl Fn(usize) -> u64 + Sync) -> Rate {
    const ROUNDS: usize = 1 << 21;
    let done: Vec<std::sync::atomic::AtomicU64> = (0..p.threads()).map(|_| std::sync::atomic::AtomicU64::new(0)).collect();
    let secs = median_secs(passes, || {
        p.run(&|part| done[part].store(probe(ROUNDS), std::sync::atomic::Ordering::Relaxed));
    });
    let macs: u64 = done.iter().map(|d| d.load(std::sync::atomic::Ordering::Relaxed)).sum();
    rate(p.threads(), 0, macs as usize, secs)
}

/// Median microseconds of an empty parallel region (publish, every worker runs, all joined).
fn dispatch_latency(p: &Pool, passes: usize, regions: usize) -> f64 {
    let secs = median_secs(passes, || {
        for _ in 0..regions {
            p.run(&|part| {
                std::hint::black_box(part);
            });
        }
    });
    secs / regions as f64 * 1e6
}

/// One dtype: a matrix of plausible values (finite, no subnormals, real quantized blocks),
/// multiplied by one vector per pass at every thread count.
fn stream_dtype(k: &Kernels, pools: &[Pool], opts: &MatmulBench, dtype: DType, probe: &ReadProbe) -> Result<DtypeRates> {
    let cols = opts.cols;
    let row_bytes = dtype.row_bytes(cols as u64).ok_or_else(|| Error::arg(format!(
        "bench matmul: {dtype} cannot hold rows of {cols} columns")))? as usize;
    if opts.experts {
        return stream_experts(k, pools, opts, dtype, row_bytes, probe);
    }
    let rows = opts.rows.unwrap_or(opts.bytes / row_bytes).max(1);
    let bytes = rows.checked_mul(row_bytes).ok_or_else(|| Error::arg("bench matmul: matrix size overflows"))?;
    let buf = matrix_bytes(bytes, dtype, row_bytes)?;
    let w = MatRef { dtype, rows, cols, data: buf.as_slice() };
    let n = opts.tokens;
    let x = inputs(cols * n);
    let mut y = vec![0.0f32; rows * n];
    let (mut rates, mut read) = (Vec::new(), Vec::new());
    for (i, p) in pools.iter().enumerate() {
        let (secs, beside) = time_product(p, i, k, opts.passes, bytes, probe, || k.matmul(p, w, &x, n, &mut y));
        std::hint::black_box(&y);
        rates.push(rate(p.threads(), bytes, rows * cols * n, secs));
        read.push(beside);
    }
    Ok(DtypeRates { dtype, rows, cols, bytes, rates, read })
}

/// Expert-shaped products ([`MatmulBench::experts`]): `opts.bytes` of matrices of `opts.rows`
/// rows each (at least one per participant), every participant multiplying its whole share of
/// them one after another through [`Kernels::rows_alone`], as an MoE step's experts are.
fn stream_experts(k: &Kernels, pools: &[Pool], opts: &MatmulBench, dtype: DType, row_bytes: usize, probe: &ReadProbe) -> Result<DtypeRates> {
    let (cols, n) = (opts.cols, opts.tokens);
    let rows = opts.rows.unwrap_or(1).max(1);
    let matrix = rows.checked_mul(row_bytes).ok_or_else(|| Error::arg("bench matmul: matrix size overflows"))?;
    let count = (opts.bytes / matrix).max(opts.threads);
    let bytes = count.checked_mul(matrix).ok_or_else(|| Error::arg("bench matmul: matrix size overflows"))?;
    let buf = matrix_bytes(bytes, dtype, row_bytes)?;
    let data = buf.as_slice();
    let x = inputs(cols * n);
    // Per participant: its outputs and its room for split inputs, as the model's state holds.
    let scratch: Vec<std::sync::Mutex<(Vec<f32>, Vec<f32>)>> = (0..opts.threads)
        .map(|_| std::sync::Mutex::new((vec![0.0; rows * n], vec![0.0; super::split_room(n, cols)])))
        .collect();
    let (mut rates, mut read) = (Vec::new(), Vec::new());
    for (i, p) in pools.iter().enumerate() {
        let product = || {
            p.run(&|part| {
                let Ok(mut mine) = scratch[part].lock() else { return };
                let (y, split) = &mut *mine;
                for m in pool::chunk(count, p.threads(), part) {
                    let w = MatRef { dtype, rows, cols, data: &data[m * matrix..(m + 1) * matrix] };
                    k.rows_alone(w, &x, n, y, split);
                }
                std::hint::black_box(&y);
            });
        };
        let (secs, beside) = time_product(p, i, k, opts.passes, bytes, probe, product);
        rates.push(rate(p.threads(), bytes, count * rows * cols * n, secs));
        read.push(beside);
    }
    Ok(DtypeRates { dtype, rows, cols, bytes, rates, read })
}

/// `bytes` of rows of `dtype` (see [`fill`]), every page mapped.
fn matrix_bytes(bytes: usize, dtype: DType, row_bytes: usize) -> Result<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(bytes, 64)?;
    fill(buf.as_mut_slice(), dtype, row_bytes);
    Ok(buf)
}

/// `len` input values in −1..1, the same for every product measured, from a 64-byte
/// boundary as a model's are ([`crate::sys::Floats`]).
fn inputs(len: usize) -> crate::sys::Floats {
    let mut x = crate::sys::Floats::zeroed(len);
    for (c, v) in x.iter_mut().enumerate() {
        *v = ((c * 7919 % 2003) as f32 / 1001.0) - 1.0;
    }
    x
}

/// Fills `buf` with rows of pseudo-random values of `dtype`: 64 distinct rows generated, then
/// repeated (the bytes' values do not change the speed; writing every byte maps every page).
fn fill(buf: &mut [u8], dtype: DType, row_bytes: usize) {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let pattern_rows = 64.min(buf.len() / row_bytes).max(1);
    let mut pattern = vec![0u8; pattern_rows * row_bytes];
    let unit = |r: u64| (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
    match dtype {
        DType::F32 => pattern.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&unit(next()).to_le_bytes())),
        DType::BF16 => pattern.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&((unit(next()).to_bits() >> 16) as u16).to_le_bytes())),
        DType::F16 => pattern.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&half::f16::from_f32(unit(next())).to_bits().to_le_bytes())),
        DType::Q8B32 | DType::Q4B32 => {
            let size = dtype.block_bytes().unwrap_or(34);
            for b in pattern.chunks_exact_mut(size) {
                b[..2].copy_from_slice(&half::f16::from_f32(0.01 + unit(next()).abs() * 0.01).to_bits().to_le_bytes());
                b[2..].iter_mut().for_each(|v| *v = (next() >> 56) as u8);
            }
        }
        DType::F8B32 => {
            for b in pattern.chunks_exact_mut(crate::format::fp8::F8B32_BYTES) {
                b[..4].copy_from_slice(&(0.01 + unit(next()).abs() * 0.01).to_le_bytes());
                // Every e4m3fn code but the two NaNs (refused before a record is written).
                b[4..].iter_mut().for_each(|v| *v = match (next() >> 56) as u8 { c if c & 0x7f == 0x7f => c ^ 1, c => c });
            }
        }
        DType::MXFP4 => {
            for b in pattern.chunks_exact_mut(17) {
                // Scales 2^-8 .. 2^-5 (gpt-oss's are small powers of two), random codes.
                b[0] = 119 + (next() >> 62) as u8;
                b[1..].iter_mut().for_each(|v| *v = (next() >> 56) as u8);
            }
        }
        _ => {}
    }
    for chunk in buf.chunks_mut(pattern.len()) {
        chunk.copy_from_slice(&pattern[..chunk.len()]);
    }
}

/// What `bench attention` measures: one query token's attention over `keys` cached positions
/// for a group of `heads` query heads sharing one of `kv_heads` key-value heads (each call on
/// the next key-value head's keys, as a token's items follow one another), head by head and
/// grouped.
#[derive(Clone, Debug)]
pub struct AttentionBench {
    /// Kernels to use; `None` is the best this CPU has.
    pub isa: Option<Isa>,
    /// Query heads per key-value head.
    pub heads: usize,
    /// Key-value heads (the cache's row is `kv_heads × head_dim` floats).
    pub kv_heads: usize,
    /// Floats per head.
    pub head_dim: usize,
    /// Cached positions, one measurement each.
    pub keys: Vec<usize>,
    /// Timed passes per figure (the median is reported), after one untimed warm-up.
    pub passes: usize,
}

impl Default for AttentionBench {
    /// The Llama-3.2-1B shape: 4 query heads per key-value head, 8 of those, 64 floats a head.
    fn default() -> AttentionBench {
        AttentionBench { isa: None, heads: 4, kv_heads: 8, head_dim: 64, keys: vec![512, 2048, 8192], passes: 5 }
    }
}

/// One key count's figures: seconds per call of the group's scores and of its weighted sums,
/// head by head (`Kernels::attn_scores`, `attn_mix`) and grouped (`attn_scores_group`,
/// `attn_mix_group`).
#[derive(Clone, Copy, Debug)]
pub struct AttentionRow {
    /// Cached positions.
    pub keys: usize,
    /// Seconds for the group's scores, head by head.
    pub scores_per_head: f64,
    /// Seconds for the group's scores, grouped.
    pub scores_grouped: f64,
    /// Seconds for the group's weighted sums, head by head.
    pub mix_per_head: f64,
    /// Seconds for the group's weighted sums, grouped.
    pub mix_grouped: f64,
}

/// Everything `bench attention` prints.
#[derive(Clone, Debug)]
pub struct AttentionReport {
    /// The instruction set the kernels ran on.
    pub isa: Isa,
    /// One row per key count, in the order asked.
    pub rows: Vec<AttentionRow>,
}

/// Largest key-value cache `bench attention` allocates (keys and values alike): 1 GiB.
const ATTENTION_CACHE_MAX: usize = 1 << 30;

/// Runs the attention benchmark on the calling thread.
pub fn attention(opts: &AttentionBench) -> Result<AttentionReport> {
    let (g, kvh, hd) = (opts.heads, opts.kv_heads, opts.head_dim);
    if !(1..=64).contains(&g) || !(1..=256).contains(&kvh) || !(1..=1024).contains(&hd) || opts.passes == 0 || opts.keys.is_empty() {
        return Err(Error::arg("bench attention: heads 1..=64, kv heads 1..=256, head dim 1..=1024, at least one pass and one key count"));
    }
    let kernels = match opts.isa {
        None => Kernels::select(false),
        Some(isa) => Kernels::with_isa(isa).ok_or_else(|| Error::unsupported(format!(
            "bench attention: this CPU cannot run the {} kernels", isa.name())))?,
    };
    let stride = kvh * hd;
    let mut rows = Vec::new();
    for &n in &opts.keys {
        if n == 0 || n.checked_mul(stride * 4).is_none_or(|b| b > ATTENTION_CACHE_MAX) {
            return Err(Error::arg(format!("bench attention: {n} keys of {stride} floats: not in 1 .. 1 GiB")));
        }
        // Deterministic values in [-0.5, 0.5); the cache serves as keys and values.
        let cache: Vec<f32> = (0..n * stride).map(|i| (i.wrapping_mul(7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let q: Vec<f32> = (0..g * hd).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect();
        let w: Vec<f32> = (0..g * n).map(|i| (i % 17) as f32 / (17 * n) as f32).collect();
        let (mut sc, mut out) = (vec![0f32; g * n], vec![0f32; g * hd]);
        // About 2^22 key columns a pass, and at least one call per key-value head.
        let calls = (4 << 20) / (n * hd).max(1) + kvh;
        let per_call = |secs: f64| secs / calls as f64;
        let k = &kernels;
        let scores_per_head = per_call(median_secs(opts.passes, || for c in 0..calls {
            let at = (c % kvh) * hd;
            for (h, row) in sc.chunks_exact_mut(n).enumerate() {
                k.attn_scores(&q[h * hd..(h + 1) * hd], &cache[at..], stride, 0.125, row);
            }
        }));
        let scores_grouped = per_call(median_secs(opts.passes, || for c in 0..calls {
            k.attn_scores_group(&q, hd, &cache[(c % kvh) * hd..], stride, 0.125, &mut sc);
        }));
        let mix_per_head = per_call(median_secs(opts.passes, || for c in 0..calls {
            let at = (c % kvh) * hd;
            for (h, o) in out.chunks_exact_mut(hd).enumerate() {
                k.attn_mix(&w[h * n..(h + 1) * n], &cache[at..], stride, o);
            }
        }));
        let mix_grouped = per_call(median_secs(opts.passes, || for c in 0..calls {
            k.attn_mix_group(&w, &cache[(c % kvh) * hd..], stride, &mut out, hd);
        }));
        std::hint::black_box((&sc, &out));
        rows.push(AttentionRow { keys: n, scores_per_head, scores_grouped, mix_per_head, mix_grouped });
    }
    Ok(AttentionReport { isa: kernels.isa(), rows })
}
