#![warn(missing_docs)]
//! # waste
//!
//! An inference engine for large language models that runs models bigger than RAM.
//!
//! The library is the product; the `waste` command-line tool is one client of this public API
//! and can do nothing a host program cannot. The library never prints, never exits, keeps no
//! global mutable state (several models can be open in one process), and reports every
//! failure as an [`Error`] whose message names the file, tensor, field or offset that was
//! wrong.
//!
//! ```no_run
//! use waste::{Model, Options, GenerateParams};
//!
//! let mut model = Model::open("models/stories260K", &Options::default())?;
//! let prompt = model.tokenize_prompt("Once upon a time")?;
//! let params = GenerateParams { max_tokens: 32, ..GenerateParams::greedy() };
//! let summary = model.generate(&prompt, &params, |event| {
//!     print!("{}", event.text);
//!     true // keep going
//! })?;
//! eprintln!("[{} tokens]", summary.tokens);
//! # Ok::<(), waste::Error>(())
//! ```
//!
//! The data path, top to bottom: [`format`](mod@format) (bytes on disk) → [`model`] (the forward pass and
//! its memory plan) → [`kernels`] (numeric loops and threads), with [`cache`] beside it for
//! streamed experts and [`tokenizer`] at the edges; [`tools`] (convert, quantize, compare) are
//! built on all of them, and [`host`] is what a host program needs from the platform.
//! `docs/API.md` lists the public surface; `examples/embed.rs` is a complete program.

pub mod cache;
mod chat;
mod error;
pub mod format;
mod generate;
pub mod host;
pub mod kernels;
pub mod model;
pub mod sample;
mod sys;
pub mod template;
pub mod tokenizer;
pub mod tools;

/// Test helpers: `must()` states that a test expects success (and panics with the error when
/// it does not), so unit tests read plainly and library code keeps no `unwrap`.
#[cfg(test)]
pub(crate) mod test_util {
    pub trait Must<T> {
        fn must(self) -> T;
        fn must_because(self, why: &str) -> T;
    }

    impl<T, E: std::fmt::Debug> Must<T> for Result<T, E> {
        fn must(self) -> T {
            match self {
                Ok(v) => v,
                Err(e) => panic!("expected success, got {e:?}"),
            }
        }
        fn must_because(self, why: &str) -> T {
            match self {
                Ok(v) => v,
                Err(e) => panic!("{why}: {e:?}"),
            }
        }
    }

    impl<T> Must<T> for Option<T> {
        fn must(self) -> T {
            match self {
                Some(v) => v,
                None => panic!("expected a value, got None"),
            }
        }
        fn must_because(self, why: &str) -> T {
            match self {
                Some(v) => v,
                None => panic!("{why}"),
            }
        }
    }
}

pub use error::{Error, ErrorKind, Result};
pub use model::plan::{plan_memory, Budget, BudgetSource, MemoryPlan, MemoryUse, ModelKind};
pub use sys::ram::{physical_ram_bytes as physical_ram, usable_ram_bytes as usable_ram, RamProbe, RamReading, RamSource};
pub use generate::{ExpertActivity, GenerateParams, GenerateSummary, StopReason, TokenEvent};
pub use sys::CpuList;
pub use model::session::Session;
pub use format::config::ModelConfig;
pub use model::{Model, ModelInfo, ModelStats, TokenRoute};
pub use sample::{SampleBuffers, Sampler, SamplingParams};
pub use chat::model_chat_template;
pub use template::{ChatTemplate, Piece, RenderOptions};
pub use tokenizer::{Detokenizer, Tokenizer};
pub use cache::{CacheOptions, CacheStats};

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How a model is opened: threads, context length, and the switches that change *how* the
/// engine computes (never *what* it computes).
#[derive(Clone, Debug)]
pub struct Options {
    /// Compute threads; 0 chooses one per CPU of `cpus` when given, else one per CPU available
    /// to the process.
    pub threads: usize,
    /// CPUs the compute threads are bound to (seed 001, "Thread placement"): the pool's workers
    /// at open, the thread that runs the model on its first forward pass. `None` leaves
    /// placement to the OS. A platform that cannot bind refuses a list
    /// ([`ErrorKind::Unsupported`]) rather than ignoring it.
    pub cpus: Option<CpuList>,
    /// Context length in tokens; 0 chooses the model's `max_position_embeddings`, capped at
    /// 4096.
    pub ctx: usize,
    /// Tokens processed per forward pass during prefill (weights are read once per chunk);
    /// the scratch the plan counts grows with it. 0, the default, lets the engine choose from
    /// memory plan and the budget: 128 ([`model::plan::DEFAULT_PREFILL_CHUNK`]), or 512
    /// ([`model::plan::STREAMING_PREFILL_CHUNK`]) when the model streams experts its cache
    /// cannot all hold and the longer chunk's scratch costs the cache at most an eighth, or
    /// when the cache holds them all at either length and the AMX tiles are on (an expert's
    /// tokens in a 512-token chunk reach the tiles; [`Options::tiles`]). A MoE
    /// layer decodes — and, when they stream, reads — each chosen expert once per chunk for
    /// the few of its tokens routed there, so longer chunks do that fewer times
    /// (docs/BENCHMARKS.md: 128 prefills a 24-layer Qwen3-30B-A3B shape ~50 % faster than 32, a
    /// dense 1B 7 % faster; under a tight budget 512 reads a third of the records of 128). The
    /// chosen value is the plan's [`MemoryPlan::prefill_chunk`].
    pub prefill_chunk: usize,
    /// Use the scalar reference kernels even where SIMD ones exist.
    pub force_scalar: bool,
    /// The instruction set the kernels use: `None`, the default, takes the best this CPU has;
    /// `Some` names one the CPU must have ([`Model::open`] refuses it otherwise, with
    /// [`ErrorKind::Unsupported`]) — so that an AVX-512 machine runs the AVX2 kernels an
    /// AVX2-only laptop runs, with the same bits, to reproduce its results or to measure them.
    /// `Some(Isa::Scalar)` is `force_scalar`; `force_scalar` with another instruction set is
    /// refused as contradictory. The integer paths ([`Options::activations`]) follow it: their
    /// VNNI kernels only where the AVX-512 ones run.
    pub isa: Option<kernels::Isa>,
    /// Multiply Q4B32 weights with prefill chunks on the Intel AMX tiles where the CPU has
    /// them ([`kernels::Isa::Amx`]; on by default): products exact in f32 as on the FMA
    /// kernels, their sums added in another order, so a prompt's logits differ from those of
    /// the same tokens decoded one at a time by f32 rounding. Off, every product takes the
    /// AVX-512 kernels, whose bits do not depend on the chunk with [`Activations::F32`] (the
    /// default decodes Q4B32 with int21 on Intel CPUs, which has the same effect).
    pub tiles: bool,
    /// How the inputs of Q8B32 and Q4B32 products are represented ([`Activations`]): the
    /// default ([`Activations::Auto`]: f32, with int21 Q4B32 decode on AVX2 and Intel AVX-512
    /// CPUs), f32 everywhere (the reference), or quantized blocks multiplied as integers.
    pub activations: Activations,
    /// The most memory the engine may hold, in bytes: a hard ceiling on trunk, state,
    /// scratch, tokenizer and expert cache together (docs/MEMORY.md). `None` lets the engine choose from the model's plan
    /// and the machine's usable RAM (cgroups included): the largest of floor + 3, 2 or 1
    /// working sets under 7/8 of usable RAM, else the floor. See [`plan_memory`].
    pub budget: Option<u64>,
    /// Bytes of expert cache (slots and bookkeeping), overriding what the budget leaves (it
    /// may not exceed it when a budget is given; without a budget it makes the budget, see
    /// [`BudgetSource::Cache`]); 0 takes what the budget leaves.
    pub cache_bytes: u64,
    /// Threads that read expert records; 0 reads on the computing thread.
    pub io_threads: usize,
    /// Check the CRC-32 of every expert record read, and of the container's trunk files at
    /// open (one pass over the trunk's bytes). Record headers and the trunk index are always
    /// checked.
    pub verify: bool,
    /// Read expert records with `O_DIRECT` where the filesystem allows it (the default); false
    /// reads every bank through the fallback — buffered reads, then `POSIX_FADV_DONTNEED` —
    /// which a filesystem that refuses `O_DIRECT` gets anyway. Changes only how bytes move,
    /// never the result.
    pub direct_io: bool,
    /// Router look-ahead for streamed experts: during each MoE layer, guess the next MoE
    /// layer's experts (its router applied to this layer's input: a decode step's top-k, a
    /// prefill chunk's union of top-k when the cache holds both layers' experts) and start
    /// reading them. On by default: the cache holds back while fewer than half of the recent
    /// look-ahead reads were used (wrong guesses only take the disk from certain misses).
    /// Changes only when bytes move, never the result.
    pub lookahead: bool,
    /// Purgeable expert-cache slots: the pages of an idle slot may be taken back by the kernel
    /// under memory pressure (`MADV_FREE`) instead of the process being killed; a slot that
    /// lost pages is detected when next used and its record read again. In decode the records
    /// the last token used wait for their layer's next visit before they are offered, and
    /// every record is offered when a generation ends (`docs/MEMORY.md`). Changes only when
    /// bytes move, never the result. Off by default: taking pages back costs decode speed
    /// (`docs/BENCHMARKS.md`).
    pub purgeable_slots: bool,
    /// Back the expert cache's slots with 2 MiB pages where the kernel grants them
    /// (`MADV_HUGEPAGE`): an O_DIRECT read then pins two pages instead of 650, which keeps a
    /// streamed decode 4–10 % faster; the price is the first touch of each fresh slot, which
    /// where huge pages are slow to come by (compaction, a VM's fresh memory) made a
    /// 128-token prompt under a tight limit up to twice as slow (`docs/BENCHMARKS.md`,
    /// 2026-12-05). Changes only when bytes move, never the result.
    pub huge_pages: bool,
    /// Preload the learned hotlist (`usage.waste`, written by [`Model::write_usage`]) into
    /// the expert cache of a container that has one, on the I/O threads.
    pub hotlist: bool,
    /// The learned hotlist's file: read at open (with `hotlist`) and where
    /// [`Model::write_usage`] writes by default. `None`: `usage.waste` in the model's
    /// directory; give another path when that directory is read-only or shared.
    pub usage_file: Option<std::path::PathBuf>,
    /// Sessions the budget reserves room for: the model's own and `sessions − 1` more from
    /// [`Model::new_session`] (a server's slots). Each holds a conversation's state for the
    /// whole context; the memory plan counts them all, and the expert cache gets what is left.
    pub sessions: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options { threads: 0, cpus: None, ctx: 0, prefill_chunk: 0, force_scalar: false, isa: None, tiles: true, activations: Activations::Auto, budget: None, cache_bytes: 0,
            io_threads: 4, verify: false, direct_io: true, lookahead: true, purgeable_slots: false, huge_pages: true, sessions: 1, hotlist: true, usage_file: None }
    }
}

/// How the inputs of the products with Q8B32 and Q4B32 weights are represented
/// ([`Options::activations`]). Other weight dtypes always take f32 inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// The default: f32, except where a faster path keeps the same accuracy — where
    /// [`kernels::Kernels::int21_decodes_by_default`] says so (kernels that are AVX2's, and
    /// Intel's AVX-512 VNNI ones), products of at most [`kernels::DECODE_VECTORS`] vectors
    /// with Q4B32 weights (a decode step's) take [`Activations::Int21`], which passes seed
    /// 000's token gate and decodes about 1.4–1.5× faster than f32 on AVX2, 1.1× on AVX-512,
    /// while longer products (a prefill chunk's GEMM) stay f32. Results then depend on how
    /// many vectors a product carries: a prompt's logits differ from the same tokens decoded
    /// one at a time by f32-level rounding; [`Activations::F32`] keeps them bit-identical.
    #[default]
    Auto,
    /// f32 inputs, multiplied exactly by the decoded weights everywhere: the reference.
    F32,
    /// Each product's inputs quantized to blocks of 32 signed bytes with an f32 scale and
    /// multiplied as integers (AVX-512 VNNI or AVX2 where present, the scalar twins
    /// otherwise): an activation error of at most 1/254 of its block's largest |x|, llama.cpp's
    /// scheme; `docs/BENCHMARKS.md` has the speed and the logit error.
    Int8,
    /// Blocks of 32 signed 16-bit integers with an f32 scale, multiplied as integers (AVX-512
    /// VNNI, or AVX2 with AVX-VNNI's `vpdpwssd` or `vpmaddwd`, where present; the scalar twins
    /// otherwise): an activation error of at most 1/65534 of its block's largest |x|;
    /// `docs/BENCHMARKS.md` has the speed and the logit error.
    Int16,
    /// Q4B32 products only (Q8B32 and the rest keep f32): blocks of 32 signed 21-bit
    /// integers with an f32 scale, each integer carried as three 8-bit digits and multiplied
    /// exactly (AVX-512 VNNI, or AVX2 — with AVX-VNNI's `vpdpbusd` where present — or the
    /// scalar twin): an activation error of at most 1/4,161,536 of its block's largest |x|,
    /// which passes seed 000's token gate. Its kernels are decode kernels (four vectors a pass
    /// over the weights): the default takes it for decode on AVX2 and Intel AVX-512 CPUs
    /// ([`Activations::Auto`]); on every product, prefill runs slower than f32.
    /// `docs/BENCHMARKS.md` has the speed and the logit error.
    Int21,
}

impl Activations {
    /// The name the command line and `info` use: `auto`, `f32`, `int8`, `int16`, `int21`.
    pub fn name(self) -> &'static str {
        match self {
            Activations::Auto => "auto",
            Activations::F32 => "f32",
            Activations::Int8 => "int8",
            Activations::Int16 => "int16",
            Activations::Int21 => "int21",
        }
    }
}

/// Context lengths above this are refused before anything is sized from them.
pub const MAX_CONTEXT: usize = 1 << 20;

/// The most sessions [`Options::sessions`] may reserve.
pub const MAX_SESSIONS: usize = 1024;

impl Options {
    /// Checks ranges; called by [`Model::open`].
    pub fn validate(&self) -> Result<()> {
        if self.threads > 1024 {
            return Err(Error::arg(format!("threads: {} is out of range 0..=1024", self.threads)));
        }
        if self.ctx > MAX_CONTEXT {
            return Err(Error::arg(format!("ctx: {} is out of range 0..={MAX_CONTEXT}", self.ctx)));
        }
        if self.io_threads > 256 {
            return Err(Error::arg(format!("io_threads: {} is out of range 0..=256", self.io_threads)));
        }
        if self.sessions == 0 || self.sessions > MAX_SESSIONS {
            return Err(Error::arg(format!("sessions: {} is out of range 1..={MAX_SESSIONS}", self.sessions)));
        }
        if self.prefill_chunk > 4096 {
            return Err(Error::arg(format!("prefill_chunk: {} is out of range 0..=4096", self.prefill_chunk)));
        }
        match self.isa {
            Some(isa) if self.force_scalar && isa != kernels::Isa::Scalar => {
                return Err(Error::arg(format!("force_scalar (the scalar kernels) and isa {} name two different kernels: give one", isa.name())));
            }
            Some(isa) if !isa.supported() => {
                return Err(Error::unsupported(format!("isa: this CPU (or this build's target) cannot run the {} kernels", isa.name())));
            }
            _ => {}
        }
        Ok(())
    }

    /// The thread count after resolving 0.
    pub fn resolved_threads(&self) -> usize {
        match (self.threads, &self.cpus) {
            (0, Some(list)) => list.len(),
            (0, None) => sys::available_cpus(),
            (t, _) => t,
        }
    }

    /// The context length after resolving 0 against the model's maximum.
    pub fn resolved_ctx(&self, max_position: usize) -> usize {
        if self.ctx == 0 { max_position.clamp(1, 4096) } else { self.ctx }
    }
}
