//! The memory plan: what a model needs resident (its floor), what one token's experts weigh
//! (the working set), and how a RAM budget is chosen and split (seed 001 §3). Computed from
//! headers alone — config, tensor shapes, file sizes — so it runs before any weight is read.
//!
//! The parts, each what the engine will hold ([`MemoryUse`] is the same parts measured on an
//! open model; docs/MEMORY.md has the rule for each):
//! - **trunk**: every weight kept resident (embeddings, attention, dense FFNs, routers, shared
//!   experts, norms, head), matrices at their stored size and 1-D vectors widened to f32, as
//!   `model::weights` loads them — plus, for a Hugging Face MoE checkpoint, which loads whole,
//!   every routed expert as a resident record; a container whose experts stream reads untied
//!   embeddings a row at a time (`model::disk_rows`), and counts that row's buffer instead;
//! - **state**: the KV cache for the context; for MLA layers the latent cache and for KDA layers
//!   the recurrent and convolution state instead (`model::latent::Sizes`);
//! - **scratch**: activations of a prefill chunk, per-thread score rows, routing buffers, the
//!   logits rows, the sampler's buffers and the generation history ([`State::plan_bytes`],
//!   [`SampleBuffers::plan_bytes`]), the int8 path's buffer when on, a constant per compute
//!   or I/O thread ([`THREAD_BYTES`]) and one for the model's metadata ([`METADATA_BYTES`]);
//! - **tokenizer**: an allowance from the tokenizer file's size that the loader enforces
//!   ([`crate::tokenizer::plan_bytes`]) — the one part that is an upper bound, not exact;
//! - **minimum expert cache**: the fewest slots the cache runs with (2 × top-k records — one
//!   layer's experts in use while the next layer's are read — or every record when there are
//!   fewer), plus the cache's bookkeeping; 0 when no expert streams. Records are read straight
//!   into their slots, so there are no separate I/O buffers.
//!
//! FLOOR is their sum; nothing runs below it. Everything above it is expert cache, worth having
//! in whole **working sets** (top-k slots × MoE layers: one token's experts), hence
//! recommended = floor + 3 working sets.
//!
//! Each kind of model on disk is a [`ModelKind`] and a branch of the header reading that
//! fills a [`Footprint`]; everything after that is shared.

use crate::cache::ExpertShape;
use crate::error::{Error, ErrorKind, Result};
use crate::format::config::ModelConfig;
use crate::format::container::{self, Manifest};
use crate::format::json::{Json, Limits};
use crate::format::safetensors::Checkpoint;
use crate::kernels::pool::THREAD_BYTES;
use crate::kernels::Kernels;
use crate::model::session::Session;
use crate::model::state::State;
use crate::sys::Floats;
use crate::model::weights::{load_trunk, Loader};
use crate::sample::SampleBuffers;
use crate::Options;
use std::mem::size_of;
use std::path::{Path, PathBuf};

/// The kinds of model directory or file the planner reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// A Hugging Face checkpoint directory (config.json + safetensors), loaded whole: a MoE
    /// model's routed experts are resident records, counted in the trunk, and nothing streams.
    HfCheckpoint,
    /// A waste container: trunk resident, routed experts streamed from its banks through the
    /// expert cache (records are read straight into cache slots, so there are no separate
    /// I/O buffers).
    Container,
}

/// What the plan needs from a model on disk: its shape, its resident bytes, its experts.
#[derive(Clone, Debug)]
pub struct Footprint {
    /// The model read.
    pub path: PathBuf,
    /// A checkpoint directory or a container.
    pub kind: ModelKind,
    /// Its configuration.
    pub cfg: ModelConfig,
    /// Bytes of resident weights as the engine holds them.
    pub trunk_bytes: u64,
    /// Bytes of the embedding table read a row per token instead of held (not in
    /// `trunk_bytes`); 0 when it is resident.
    pub embeddings_on_disk_bytes: u64,
    /// The tokenizer's allowance (0 when the model has no tokenizer file).
    pub tokenizer_bytes: u64,
    /// Streamed routed experts; `None` when there are none (a dense model, or a Hugging Face
    /// MoE checkpoint whose experts are resident and counted in `trunk_bytes`).
    pub experts: Option<ExpertShape>,
    /// The tensor index held while the weights load ([`Checkpoint::index_bytes`]).
    pub index_bytes: u64,
}

/// A model's memory plan for one context length, thread count and prefill chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// A checkpoint directory or a container.
    pub kind: ModelKind,
    /// The model it is the plan of.
    pub path: PathBuf,
    /// Context length in tokens (after resolving 0 against the model).
    pub ctx: usize,
    /// Compute threads.
    pub threads: usize,
    /// Tokens per prefill pass.
    pub prefill_chunk: usize,
    /// I/O threads reading expert records (0 when no expert streams).
    pub io_threads: usize,
    /// How Q8B32 and Q4B32 products take their inputs: an integer path's activation buffer is
    /// counted.
    pub activations: crate::Activations,
    /// Resident weights as the engine holds them.
    pub trunk_bytes: u64,
    /// The embedding table read a row per token instead of held (not in `trunk_bytes`; the
    /// row's buffer is); 0 when it is resident.
    pub embeddings_on_disk_bytes: u64,
    /// Every session's state: `sessions × session_bytes`.
    pub state_bytes: u64,
    /// Sessions reserved ([`Options::sessions`]).
    pub sessions: usize,
    /// What one session holds: its caches for the whole context and room for its tokens.
    pub session_bytes: u64,
    /// Forward-pass and sampler scratch, and the threads' stacks.
    pub scratch_bytes: u64,
    /// The tokenizer's allowance: an upper bound of what it holds (docs/MEMORY.md).
    pub tokenizer_bytes: u64,
    /// The fewest slots, with the cache's bookkeeping.
    pub min_expert_cache_bytes: u64,
    /// One token's experts over every MoE layer (top-k slots per MoE layer); 0 for a dense model.
    pub working_set_bytes: u64,
    /// Bytes one expert-cache slot costs (the largest record and its bookkeeping); 0 when no
    /// expert streams.
    pub expert_slot_bytes: u64,
    /// The cache's bookkeeping whatever its number of slots.
    pub expert_cache_fixed_bytes: u64,
    /// Expert records in the model: the cache never holds more.
    pub expert_records: u64,
    /// What opening holds beyond the model's steady state: the checkpoint's tensor index
    /// ([`Checkpoint::index_bytes`]) lives while the weights load and a container's expert
    /// cache is made, before the state and the scratch (all but the metadata, which the layers
    /// being built already hold) are allocated; only the part larger than those adds to the
    /// peak. 0 unless the context is short and the checkpoint has many tensors. Part of the
    /// floor, not of what an open model holds.
    pub open_extra_bytes: u64,
}

/// What an open model holds, part by part ([`crate::Model::memory_use`]), or what a plan says
/// it will ([`MemoryPlan::expected_use`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// Resident weights.
    pub trunk: u64,
    /// The KV cache.
    pub state: u64,
    /// Scratch buffers of the forward pass and the sampler.
    pub scratch: u64,
    /// The tokenizer.
    pub tokenizer: u64,
    /// Slots and bookkeeping of the expert cache (0 when no expert streams).
    pub expert_cache: u64,
}

impl MemoryUse {
    /// The sum of the parts.
    pub fn total(&self) -> u64 {
        self.trunk + self.state + self.scratch + self.tokenizer + self.expert_cache
    }
}

/// How the budget was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetSource {
    /// Given by the caller: a hard ceiling.
    Explicit,
    /// Chosen: floor + this many working sets (3, 2 or 1) fit under 7/8 of usable RAM.
    WorkingSets(u32),
    /// Chosen: the floor (a dense model, or no whole working set fits under 7/8 of usable RAM).
    Floor,
    /// An expert-cache size was given without a budget: the budget is what the model holds
    /// with that cache.
    Cache,
}

/// A resolved RAM budget and the expert cache it leaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The ceiling, in bytes.
    pub bytes: u64,
    /// Of which the expert cache gets this much (0 when no expert streams).
    pub expert_cache_bytes: u64,
    /// Where the ceiling came from.
    pub source: BudgetSource,
    /// Something the host should tell the user (the library never prints): the floor (or a
    /// budget enlarged by an expert-cache size) is above 7/8 of usable RAM, or an explicit
    /// budget is above usable RAM.
    pub warning: Option<String>,
}

/// The plan for `path` opened with `opts` — the same bytes `Model::open(path, opts)` holds —
/// read from the model's headers and file sizes alone (no weights). Refuses options out of
/// range ([`Options::validate`]) and a model directory or container it cannot read (the error
/// names the file and field).
pub fn plan_memory(path: impl AsRef<Path>, opts: &Options) -> Result<MemoryPlan> {
    opts.validate()?;
    let path = path.as_ref();
    let m = Footprint::of(path, &Headers::read(path, &Limits::for_budget(opts.budget))?)?;
    MemoryPlan::for_options(&m, opts, || usable_ram_for(opts))
}

/// The usable RAM a model's budget is chosen against ([`crate::usable_ram`]). With an explicit
/// budget it only feeds a warning, so a machine whose RAM (or cgroup) cannot be read still runs
/// under the ceiling the user chose: it reads as unlimited.
pub(crate) fn usable_ram_for(opts: &Options) -> Result<u64> {
    match opts.budget {
        Some(_) => Ok(crate::sys::ram::usable_ram_bytes().unwrap_or(u64::MAX)),
        None => crate::sys::ram::usable_ram_bytes(),
    }
}

/// The prefill chunk [`Options::prefill_chunk`]'s 0 ("choose") resolves to, except when
/// experts stream past the cache.
pub const DEFAULT_PREFILL_CHUNK: usize = 128;

/// The prefill chunk chosen when the expert cache cannot hold every record: a chunk reads each
/// expert its tokens route to once, so when experts stream the disk reads go with the number
/// of chunks — docs/BENCHMARKS.md, "the prefill chunk when experts stream": 512 read a third
/// of the records 128 did and prefilled 1.3x faster under a tight budget. Its larger scratch
/// (74 MB more on the Qwen3-30B-A3B shape) is why it is not the default for everything.
pub const STREAMING_PREFILL_CHUNK: usize = 512;

/// Everything opening a model reads from its headers, each file read once (issue 14: the plan
/// is computed from what `open` parsed, not by parsing the headers again): a container's
/// manifest, the config and its JSON, and the checkpoint's tensor headers (a container's trunk
/// files, whose headers the manifest check already read).
pub(crate) struct Headers {
    /// The container's manifest; `None` for a Hugging Face directory.
    pub manifest: Option<Manifest>,
    /// The model's configuration.
    pub cfg: ModelConfig,
    /// A Hugging Face directory's config.json as parsed (a container's is in its manifest).
    pub config_json: Json,
    /// The tensor headers of the resident weights.
    pub ckpt: Checkpoint,
}

impl Headers {
    /// Reads the headers of the model directory `path`, every JSON file and header parsed
    /// within `limits`.
    pub(crate) fn read(path: &Path, limits: &Limits) -> Result<Headers> {
        if !path.is_dir() {
            return Err(Error::new(ErrorKind::Io, format!("{}: not a model directory", path.display())));
        }
        if container::is_container(path) {
            let (m, ckpt) = Manifest::open_with_trunk(path, limits)?;
            return Ok(Headers { cfg: m.config.clone(), manifest: Some(m), config_json: Json::Null, ckpt });
        }
        let (cfg, config_json) = ModelConfig::load_with_json(path, limits)?;
        let ckpt = Checkpoint::open_within(path, limits)?;
        Ok(Headers { manifest: None, cfg, config_json, ckpt })
    }
}

impl Footprint {
    /// Reads the footprint of the model at `path` (headers and file sizes only, no weights).
    pub fn read(path: &Path) -> Result<Footprint> {
        Footprint::of(path, &Headers::read(path, &Limits::default())?)
    }

    /// The footprint of the model at `path` whose headers are `h`. The loader runs in counting
    /// mode: the same tensors, checks and byte counts as `Model::open`, with nothing read. A
    /// Hugging Face MoE checkpoint's experts are resident; a container's stream from its banks.
    pub(crate) fn of(path: &Path, h: &Headers) -> Result<Footprint> {
        let tokenizer_bytes = crate::tokenizer::plan_bytes_in_dir(path)?;
        let mut ld = Loader::counting(&h.ckpt);
        ld.embeddings_on_disk = crate::model::weights::streams_embeddings(h.manifest.as_ref()).then_some(true);
        load_trunk(&mut ld, &h.cfg)?;
        let (kind, experts) = match &h.manifest {
            Some(m) => (ModelKind::Container, ExpertShape::of(m)),
            None => {
                crate::model::experts::load_resident(&mut ld, &h.cfg)?;
                (ModelKind::HfCheckpoint, None)
            }
        };
        Ok(Footprint { path: path.to_path_buf(), kind, cfg: h.cfg.clone(), trunk_bytes: ld.bytes,
            embeddings_on_disk_bytes: ld.disk_bytes, tokenizer_bytes, experts,
            index_bytes: h.ckpt.index_bytes() })
    }
}

/// What the plan counts for a model's fixed metadata — its config, the structs of its layers
/// and weights, paths, the EOS list, thread handles: this much, plus
/// [`METADATA_BYTES_PER_LAYER`] per layer. A constant, like [`THREAD_BYTES`]: the fixture
/// models measure 3–7 KiB for 4–5 layers (`tests/accounting.rs` checks it stays under).
pub const METADATA_BYTES: u64 = 16 << 10;
/// See [`METADATA_BYTES`].
pub const METADATA_BYTES_PER_LAYER: u64 = 1 << 10;

/// [`METADATA_BYTES`] for a model of `layers` layers.
pub fn metadata_bytes(layers: usize) -> u64 {
    METADATA_BYTES + METADATA_BYTES_PER_LAYER * layers as u64
}

/// The kernels a model opened with `opts` multiplies with (before their buffers): those of
/// `opts.isa`, else the best this CPU has, or the scalar reference (`force_scalar`), without
/// the AMX tiles when `opts.tiles` is off. An instruction set the CPU lacks is refused by
/// [`Options::validate`]; a plan made without it counts the best kernels instead.
pub(crate) fn kernels_for(opts: &Options) -> Kernels {
    let k = opts.isa.and_then(Kernels::with_isa).unwrap_or_else(|| Kernels::select(opts.force_scalar));
    if opts.tiles { k } else { k.without_tiles() }
}

/// Bytes of the scratch outside [`State`] for a model of `cfg` opened with these settings:
/// the RoPE frequencies, the sampler's buffers, the int8 path's buffer when on, the kernels'
/// split-input buffer on an instruction set that has one ([`Kernels::with_split_buffer`];
/// held whatever the weights' dtypes, so the plan needs no more than the headers' shapes),
/// [`THREAD_BYTES`] per compute worker (the caller is participant 0) and per I/O thread, and
/// the metadata allowance.
fn model_scratch_bytes(cfg: &ModelConfig, chunk: usize, threads: usize, io_threads: usize, opts: &Options) -> u64 {
    let rope = (cfg.rope.dim / 2 * size_of::<f32>()) as u64;
    let int8 = match opts.activations {
        crate::Activations::Auto if kernels_for(opts).int21_decodes_by_default() => crate::kernels::int21::scratch_bytes(State::int8_values(cfg, crate::kernels::DECODE_VECTORS)),
        crate::Activations::Auto | crate::Activations::F32 => 0,
        crate::Activations::Int8 => State::int8_scratch_bytes(cfg, chunk),
        crate::Activations::Int16 => State::int16_scratch_bytes(cfg, chunk),
        crate::Activations::Int21 => crate::kernels::int21::scratch_bytes(State::int8_values(cfg, chunk)),
    };
    let kernels = kernels_for(opts);
    let split = if kernels.splits_inputs() { Floats::plan_bytes(kernels.split_buffer_len(State::split_values(cfg, chunk))) } else { 0 };
    let threads = (threads.saturating_sub(1) + io_threads) as u64 * THREAD_BYTES;
    rope + SampleBuffers::plan_bytes(cfg.vocab) + int8 + split + threads + metadata_bytes(cfg.layers)
}

impl MemoryPlan {
    /// The plan of a model for the context, threads, chunk and I/O threads of `opts`; a chunk
    /// of 0 ("choose") is planned as [`DEFAULT_PREFILL_CHUNK`] here ([`plan_memory`] and
    /// [`crate::Model::open`] resolve it from the budget first, see [`Options::prefill_chunk`]).
    pub fn new(m: &Footprint, opts: &Options) -> MemoryPlan {
        let threads = opts.resolved_threads().max(1);
        let ctx = opts.resolved_ctx(m.cfg.max_position);
        let chunk = if opts.prefill_chunk == 0 { DEFAULT_PREFILL_CHUNK } else { opts.prefill_chunk };
        let io_threads = if m.experts.is_some() { opts.io_threads } else { 0 };
        let session = Session::plan_bytes(&m.cfg, ctx);
        let sessions = opts.sessions.max(1);
        let scratch = State::plan_bytes(&m.cfg, ctx, chunk, threads) + model_scratch_bytes(&m.cfg, chunk, threads, io_threads, opts);
        let (min_cache, working_set, slot, fixed, records) = match m.experts.map(|e| e.with_io_threads(io_threads)) {
            None => (0, 0, 0, 0, 0),
            Some(e) => (e.cache_bytes(e.min_slots()), (e.top_k as u64 * e.moe_layers as u64).saturating_mul(e.slot_bytes()),
                        e.slot_bytes(), e.fixed_bytes(), e.records),
        };
        MemoryPlan {
            kind: m.kind,
            path: m.path.clone(),
            ctx,
            threads,
            prefill_chunk: chunk,
            io_threads,
            activations: opts.activations,
            trunk_bytes: m.trunk_bytes,
            embeddings_on_disk_bytes: m.embeddings_on_disk_bytes,
            state_bytes: session.saturating_mul(sessions as u64),
            sessions,
            session_bytes: session,
            scratch_bytes: scratch,
            tokenizer_bytes: m.tokenizer_bytes,
            min_expert_cache_bytes: min_cache,
            working_set_bytes: working_set,
            expert_slot_bytes: slot,
            expert_cache_fixed_bytes: fixed,
            expert_records: records,
            open_extra_bytes: m.index_bytes.saturating_sub(session.saturating_mul(sessions as u64)
                .saturating_add(scratch).saturating_sub(metadata_bytes(m.cfg.layers))),
        }
    }

    /// The plan of a model opened with `opts`, its prefill chunk chosen when `opts` leaves it
    /// to the engine (0): [`STREAMING_PREFILL_CHUNK`] when the model streams experts that the
    /// budget's expert cache cannot all hold at [`DEFAULT_PREFILL_CHUNK`], and the longer
    /// chunk's scratch still leaves at least 7/8 of that cache (under the engine's own budget
    /// that means the same number of working sets); also when the cache holds every expert at
    /// both lengths and the AMX tiles are on ([`Kernels::tiles_take`]: an expert's share of a
    /// 512-token chunk, about four times a 128-token one's, reaches the tiles' 20 vectors;
    /// BENCHMARKS, "2026-12-04 (night)": a 30B-A3B shape in RAM prefilled 1.6× faster); else
    /// the default. `usable_ram` is read only when the choice needs it (a chunk left to the
    /// engine and experts that stream).
    pub(crate) fn for_options(m: &Footprint, opts: &Options, usable_ram: impl FnOnce() -> Result<u64>) -> Result<MemoryPlan> {
        let plan_at = |chunk| MemoryPlan::new(m, &Options { prefill_chunk: chunk, ..opts.clone() });
        let base = plan_at(DEFAULT_PREFILL_CHUNK);
        if opts.prefill_chunk != 0 || !base.has_experts() {
            return Ok(MemoryPlan::new(m, opts));
        }
        let usable = usable_ram()?;
        // A budget under the floor keeps the default plan: the error is the budget's, given
        // when it is resolved.
        let Ok(cache) = base.budget_for(usable, opts).map(|b| b.expert_cache_bytes) else { return Ok(base) };
        let long = plan_at(STREAMING_PREFILL_CHUNK);
        if cache >= base.cache_within(u64::MAX) {
            let tiles = kernels_for(opts).isa() == crate::kernels::Isa::Amx;
            let all_fit = long.budget_for(usable, opts).is_ok_and(|b| b.expert_cache_bytes >= long.cache_within(u64::MAX));
            return Ok(if tiles && all_fit { long } else { base });
        }
        match long.budget_for(usable, opts) {
            Ok(b) if b.expert_cache_bytes >= cache - cache / 8 => Ok(long),
            _ => Ok(base),
        }
    }

    /// The budget a model opens with under `opts` on a machine with `usable_ram` bytes
    /// ([`crate::usable_ram`]), as [`crate::Model::open`] chooses it. The rule (seed 001 §3):
    /// an explicit `opts.budget` is a hard ceiling and must cover the floor; without one, the
    /// largest of floor + 3, 2, 1 working sets under 7/8 of `usable_ram`, else the floor (with a
    /// warning). Then an explicit expert-cache size (`opts.cache_bytes`) overrides what the
    /// budget leaves but may not exceed it; without a budget it makes its own
    /// ([`BudgetSource::Cache`]). Refuses (`ErrorKind::RamBudget`, naming the smallest budget
    /// that works) a budget under the floor and a cache under the minimum or over the budget.
    pub fn budget_for(&self, usable_ram: u64, opts: &Options) -> Result<Budget> {
        resolve_budget_opts(self, usable_ram, opts)
    }

    /// Trunk + state + scratch + tokenizer + minimum expert cache, and what opening needs
    /// beyond that (`open_extra_bytes`): nothing runs in less.
    pub fn floor_bytes(&self) -> u64 {
        self.resident_bytes().saturating_add(self.open_extra_bytes).saturating_add(self.min_expert_cache_bytes)
    }


    /// Everything except the expert cache.
    pub fn resident_bytes(&self) -> u64 {
        self.trunk_bytes.saturating_add(self.state_bytes).saturating_add(self.scratch_bytes).saturating_add(self.tokenizer_bytes)
    }

    /// Floor + 3 working sets (seed 001 §3).
    pub fn recommended_bytes(&self) -> u64 {
        self.floor_plus(3)
    }

    /// Floor + `n` working sets.
    pub fn floor_plus(&self, n: u32) -> u64 {
        self.floor_bytes().saturating_add(self.working_set_bytes.saturating_mul(n as u64))
    }

    /// True when the model streams routed experts through a cache.
    pub fn has_experts(&self) -> bool {
        self.min_expert_cache_bytes > 0 && self.expert_slot_bytes > 0
    }

    /// The expert cache `bytes` pays for, as the cache allocates it: the bookkeeping and whole
    /// slots, never more slots than the model has records (0 when no expert streams).
    pub fn cache_within(&self, bytes: u64) -> u64 {
        if !self.has_experts() {
            return 0;
        }
        let slots = (bytes.saturating_sub(self.expert_cache_fixed_bytes) / self.expert_slot_bytes).min(self.expert_records);
        self.expert_cache_fixed_bytes + slots * self.expert_slot_bytes
    }

    /// The expert cache a budget leaves: what is left above trunk, state, scratch and
    /// tokenizer, in whole slots (so it includes the minimum expert cache). When no expert
    /// streams there is no cache and the rest of the budget stays unused. A budget under the
    /// floor is an error (see [`MemoryPlan::check_budget`]).
    pub fn expert_cache_bytes(&self, budget: u64) -> Result<u64> {
        self.check_budget(budget)?;
        Ok(self.cache_within(budget - self.resident_bytes() - self.open_extra_bytes))
    }

    /// What an open model holds under this plan with `expert_cache_bytes` of cache, part by
    /// part; [`crate::Model::memory_use`] measures the same parts (the tokenizer's is the
    /// allowance here, what it holds there).
    pub fn expected_use(&self, expert_cache_bytes: u64) -> MemoryUse {
        MemoryUse { trunk: self.trunk_bytes, state: self.state_bytes, scratch: self.scratch_bytes,
            tokenizer: self.tokenizer_bytes, expert_cache: expert_cache_bytes }
    }

    /// The `waste plan` command line that shows this plan.
    pub fn command(&self) -> String {
        let mut c = format!("waste plan {} --ctx {} --threads {}", self.path.display(), self.ctx, self.threads);
        if self.prefill_chunk != DEFAULT_PREFILL_CHUNK {
            c.push_str(&format!(" --chunk {}", self.prefill_chunk));
        }
        if self.io_threads != Options::default().io_threads && self.kind == ModelKind::Container {
            c.push_str(&format!(" --io-threads {}", self.io_threads));
        }
        match self.activations {
            crate::Activations::Auto => {}
            crate::Activations::F32 => c.push_str(" --f32-act"),
            crate::Activations::Int8 => c.push_str(" --int8-act"),
            crate::Activations::Int16 => c.push_str(" --int16-act"),
            crate::Activations::Int21 => c.push_str(" --int21-act"),
        }
        if self.sessions > 1 {
            c.push_str(&format!(" --sessions {}", self.sessions));
        }
        c
    }

    /// Fails with [`ErrorKind::RamBudget`] when `budget` is under the floor; the message gives
    /// the floor in bytes and the `waste plan` command that shows it.
    pub fn check_budget(&self, budget: u64) -> Result<()> {
        let floor = self.floor_bytes();
        if budget >= floor {
            return Ok(());
        }
        Err(Error::new(ErrorKind::RamBudget, format!(
            "a budget of {budget} bytes is under this model's floor of {floor} bytes \
(trunk {} + state {} + scratch {} + tokenizer {} + opening {} + minimum expert cache {} at a context of {} tokens); \
see `{}`", self.trunk_bytes, self.state_bytes, self.scratch_bytes, self.tokenizer_bytes, self.open_extra_bytes,
            self.min_expert_cache_bytes, self.ctx, self.command())))
    }
}

/// The budget rule (seed 001 §3). An explicit budget is a hard ceiling and must cover the
/// floor. Without one, the largest of floor + 3, 2, 1 working sets that fits under 7/8 of
/// `usable_ram`, else the floor — with a warning when even the floor is above 7/8, since
/// refusing a model that does fit would be worse. Expert cache only pays in whole working
/// sets, and filling up to the cap walks the machine into paging.
pub(crate) fn resolve_budget(plan: &MemoryPlan, usable_ram: u64, explicit: Option<u64>) -> Result<Budget> {
    if let Some(bytes) = explicit {
        let expert_cache_bytes = plan.expert_cache_bytes(bytes)?;
        let warning = (bytes > usable_ram).then(|| format!(
            "the budget of {bytes} bytes is above the {usable_ram} bytes of usable RAM"));
        return Ok(Budget { bytes, expert_cache_bytes, source: BudgetSource::Explicit, warning });
    }
    let cap = seven_eighths(usable_ram);
    let chosen = if plan.working_set_bytes == 0 {
        None
    } else {
        [3u32, 2, 1].into_iter().find(|&n| plan.floor_plus(n) <= cap)
    };
    let (bytes, source) = match chosen {
        Some(n) => (plan.floor_plus(n), BudgetSource::WorkingSets(n)),
        None => (plan.floor_bytes(), BudgetSource::Floor),
    };
    let floor = plan.floor_bytes();
    let warning = (floor > cap).then(|| format!(
        "the floor of {floor} bytes is above 7/8 of the {usable_ram} bytes of usable RAM ({cap} bytes); \
running at the floor"));
    Ok(Budget { bytes, expert_cache_bytes: plan.expert_cache_bytes(bytes)?, source, warning })
}

fn seven_eighths(bytes: u64) -> u64 {
    (bytes as u128 * 7 / 8) as u64
}

/// See [`MemoryPlan::budget_for`].
fn resolve_budget_opts(plan: &MemoryPlan, usable_ram: u64, opts: &Options) -> Result<Budget> {
    let mut budget = resolve_budget(plan, usable_ram, opts.budget)?;
    if opts.cache_bytes == 0 || !plan.has_experts() {
        return Ok(budget);
    }
    if opts.budget.is_some() && opts.cache_bytes > budget.expert_cache_bytes {
        return Err(Error::new(ErrorKind::RamBudget, format!(
            "an expert cache of {} bytes does not fit the budget of {} bytes, which leaves {} bytes for it; see `{}`",
            opts.cache_bytes, budget.bytes, budget.expert_cache_bytes, plan.command())));
    }
    if opts.cache_bytes < plan.min_expert_cache_bytes {
        return Err(Error::new(ErrorKind::RamBudget, format!(
            "an expert cache of {} bytes is below the minimum of {} bytes (2 × top-k records and the bookkeeping); see `{}`",
            opts.cache_bytes, plan.min_expert_cache_bytes, plan.command())));
    }
    budget.expert_cache_bytes = plan.cache_within(opts.cache_bytes);
    if opts.budget.is_none() {
        budget.bytes = plan.resident_bytes() + plan.open_extra_bytes + budget.expert_cache_bytes;
        budget.source = BudgetSource::Cache;
        let cap = seven_eighths(usable_ram);
        budget.warning = (budget.bytes > cap).then(|| format!(
            "an expert cache of {} bytes makes a budget of {} bytes, above 7/8 of the {usable_ram} bytes of usable RAM ({cap} bytes)",
            budget.expert_cache_bytes, budget.bytes));
    }
    Ok(budget)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    fn moe_plan(ws: u64) -> MemoryPlan {
        // trunk 1000 + state 200 + scratch 100 + min cache 50 (top-1, 2 slots of 25) = floor 1350.
        MemoryPlan { kind: ModelKind::Container, path: PathBuf::from("m"), ctx: 16, threads: 1, prefill_chunk: 1,
            io_threads: 0, activations: crate::Activations::Auto, trunk_bytes: 1000, state_bytes: 200, sessions: 1, session_bytes: 200, scratch_bytes: 60,
            tokenizer_bytes: 40, min_expert_cache_bytes: 50, working_set_bytes: ws, expert_slot_bytes: 25,
            expert_cache_fixed_bytes: 0, expert_records: 1000, open_extra_bytes: 0, embeddings_on_disk_bytes: 0 }
    }

    #[test]
    fn floor_recommended_and_cache() {
        let p = moe_plan(400);
        assert_eq!(p.floor_bytes(), 1350);
        assert_eq!(p.recommended_bytes(), 2550);
        assert_eq!(p.expert_cache_bytes(1350).must(), 50);
        assert_eq!(p.expert_cache_bytes(4000).must(), 2700);
        // Whole slots only, and never more than every record.
        assert_eq!(p.expert_cache_bytes(1374).must(), 50);
        assert_eq!(p.expert_cache_bytes(1375).must(), 75);
        let few = MemoryPlan { expert_records: 60, ..p.clone() };
        assert_eq!(few.expert_cache_bytes(1 << 40).must(), 1500);
        let e = p.expert_cache_bytes(1349).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RamBudget);
        assert!(e.message().contains("1350 bytes") && e.message().contains("waste plan m --ctx 16 --threads 1 --chunk 1"), "{e}");
        // The bookkeeping comes first, then whole slots.
        let kept = MemoryPlan { expert_cache_fixed_bytes: 7, min_expert_cache_bytes: 57, ..p.clone() };
        assert_eq!(kept.expert_cache_bytes(1357).must(), 57);
        assert_eq!(kept.expert_cache_bytes(1381).must(), 57);
        assert_eq!(kept.expert_cache_bytes(1382).must(), 82);
    }

    #[test]
    fn the_minimum_cache_never_counts_more_slots_than_records() {
        // One MoE layer of 4 experts, 3 per token: 2 × top-k would be 6 slots, but every
        // record fits in 4.
        let e = ExpertShape { top_k: 3, experts: 4, moe_layers: 1, layers: 1, largest_record_bytes: 4096, records: 4, queued: false };
        assert_eq!(e.min_slots(), 4);
        assert_eq!(e.slot_bytes(), 4096 + ExpertShape::SLOT_BOOKKEEPING);
        assert_eq!(e.with_io_threads(2).slot_bytes(), 4096 + ExpertShape::SLOT_BOOKKEEPING + ExpertShape::QUEUE_BYTES);
        assert_eq!(e.with_io_threads(0), e);
        assert_eq!(e.cache_bytes(4), e.fixed_bytes() + 4 * e.slot_bytes());
        assert_eq!(e.slots_within(1 << 40), 4);
        assert_eq!(e.slots_within(e.cache_bytes(3) + e.slot_bytes() - 1), 3);
        let wide = ExpertShape { records: 64, experts: 64, ..e };
        assert_eq!(wide.min_slots(), 6);
    }

    #[test]
    fn a_cache_size_without_a_budget_makes_its_own_budget() {
        let p = moe_plan(400);
        let opts = Options { cache_bytes: 500, ..Options::default() };
        let b = resolve_budget_opts(&p, 1 << 40, &opts).must();
        assert_eq!((b.bytes, b.expert_cache_bytes, b.source), (1300 + 500, 500, BudgetSource::Cache));
        assert!(b.warning.is_none());
        // Above 7/8 of usable RAM: a warning.
        let b = resolve_budget_opts(&p, 2000, &opts).must();
        assert!(b.warning.as_deref().must().contains("7/8"), "{b:?}");
        // Under the minimum, or above what an explicit budget leaves: errors.
        let small = Options { cache_bytes: 49, ..Options::default() };
        assert_eq!(resolve_budget_opts(&p, 1 << 40, &small).unwrap_err().kind(), ErrorKind::RamBudget);
        let tight = Options { budget: Some(1400), ..opts };
        assert_eq!(resolve_budget_opts(&p, 1 << 40, &tight).unwrap_err().kind(), ErrorKind::RamBudget);
    }

    #[test]
    fn default_budget_steps_down_whole_working_sets() {
        let p = moe_plan(400);
        // cap = 7/8 usable. floor+3 = 2550, +2 = 2150, +1 = 1750, floor = 1350.
        let pick = |usable: u64| resolve_budget(&p, usable, None).must();
        let b = pick(2550 * 8 / 7 + 1);
        assert_eq!((b.bytes, b.source, b.warning.is_none()), (2550, BudgetSource::WorkingSets(3), true));
        assert_eq!(b.expert_cache_bytes, 2550 - 1300);
        assert_eq!(pick(2549 * 8 / 7).source, BudgetSource::WorkingSets(2));
        assert_eq!(pick(2000).source, BudgetSource::WorkingSets(1)); // cap 1750
        assert_eq!(pick(1999).bytes, 1350); // cap 1749: floor, which fits: no warning
        assert!(pick(1999).warning.is_none());
        let low = pick(1000);
        assert_eq!((low.bytes, low.source), (1350, BudgetSource::Floor));
        assert!(low.warning.as_deref().must().contains("1350"));
    }

    #[test]
    fn explicit_budget_is_a_ceiling() {
        let p = moe_plan(400);
        let b = resolve_budget(&p, 1 << 40, Some(1500)).must();
        assert_eq!((b.bytes, b.expert_cache_bytes, b.source), (1500, 200, BudgetSource::Explicit));
        assert!(b.warning.is_none());
        assert!(resolve_budget(&p, 1000, Some(1500)).must().warning.is_some());
        assert_eq!(resolve_budget(&p, 1 << 40, Some(1000)).unwrap_err().kind(), ErrorKind::RamBudget);
    }

    #[test]
    fn dense_model_has_no_expert_cache() {
        let p = MemoryPlan { min_expert_cache_bytes: 0, working_set_bytes: 0, expert_slot_bytes: 0, expert_records: 0,
            kind: ModelKind::HfCheckpoint, ..moe_plan(0) };
        assert_eq!(p.floor_bytes(), 1300);
        assert_eq!(p.recommended_bytes(), 1300);
        let b = resolve_budget(&p, 1 << 30, None).must();
        assert_eq!((b.bytes, b.expert_cache_bytes, b.source), (1300, 0, BudgetSource::Floor));
        assert_eq!(resolve_budget(&p, 1 << 30, Some(5000)).must().expert_cache_bytes, 0);
        assert!(resolve_budget(&p, 1000, None).must().warning.is_some());
    }

    /// A two-layer container of `hidden` columns whose experts are `e`: trunk 5 bytes,
    /// tokenizer 3, vocabulary 32.
    fn container_footprint(hidden: usize, e: ExpertShape) -> Footprint {
        let json = crate::format::json::parse(format!(r#"{{"architectures":["LlamaForCausalLM"],"hidden_size":{hidden},
            "intermediate_size":{},"num_hidden_layers":2,"num_attention_heads":2,"vocab_size":32,
            "max_position_embeddings":64}}"#, 2 * hidden).as_bytes()).must();
        let cfg = ModelConfig::from_json(Path::new("config.json"), &json).must();
        Footprint { path: PathBuf::new(), kind: ModelKind::Container, cfg, trunk_bytes: 5, tokenizer_bytes: 3,
            experts: Some(e), index_bytes: 0, embeddings_on_disk_bytes: 0 }
    }

    #[test]
    fn experts_enter_floor_and_working_set() {
        let e = ExpertShape { top_k: 4, experts: 8, moe_layers: 2, layers: 2, largest_record_bytes: 1000, records: 16, queued: false };
        let m = container_footprint(8, e);
        let cfg = m.cfg.clone();
        let opts = Options { threads: 2, ctx: 8, prefill_chunk: 4, ..Options::default() };
        let p = MemoryPlan::new(&m, &opts);
        let (kv, scratch) = (Session::plan_bytes(&cfg, 8), State::plan_bytes(&cfg, 8, 4, 2));
        // Besides the state: RoPE, the sampler, the kernels' split-input buffer (AVX-512, AMX),
        // one compute worker and 4 I/O threads, metadata.
        let k = Kernels::select(false);
        let split = if k.splits_inputs() { Floats::plan_bytes(k.split_buffer_len(State::split_values(&cfg, 4))) } else { 0 };
        // The default's int21 decode buffer where it is on.
        let int21 = if k.int21_decodes_by_default() { crate::kernels::int21::scratch_bytes(State::int8_values(&cfg, crate::kernels::DECODE_VECTORS)) } else { 0 };
        let rest = (cfg.rope.dim / 2 * 4) as u64 + SampleBuffers::plan_bytes(32) + split + int21 + 5 * THREAD_BYTES + metadata_bytes(2);
        assert_eq!((p.state_bytes, p.scratch_bytes, p.tokenizer_bytes, p.io_threads), (kv, scratch + rest, 3, 4));
        // With I/O threads a slot also holds its place in their queues.
        let slot = 1000 + ExpertShape::SLOT_BOOKKEEPING + ExpertShape::QUEUE_BYTES;
        assert_eq!(p.min_expert_cache_bytes, e.fixed_bytes() + 8 * slot);
        assert_eq!(p.working_set_bytes, 8 * slot);
        assert_eq!(p.floor_bytes(), 5 + kv + scratch + rest + 3 + e.fixed_bytes() + 8 * slot);
        assert_eq!(p.recommended_bytes(), p.floor_bytes() + 24 * slot);
        assert_eq!((p.expert_slot_bytes, p.expert_records), (slot, 16));
        assert_eq!(p.expert_cache_bytes(p.floor_bytes() + (1 << 30)).must(), e.fixed_bytes() + 16 * slot);
    }

    #[test]
    fn a_chunk_left_to_the_engine_grows_when_experts_stream_past_the_cache() {
        let e = ExpertShape { top_k: 4, experts: 64, moe_layers: 2, layers: 2, largest_record_bytes: 400_000, records: 128, queued: false };
        let m = container_footprint(64, e);
        let auto = Options { threads: 2, ctx: 64, ..Options::default() };
        assert_eq!(auto.prefill_chunk, 0, "the default leaves the chunk to the engine");
        let at = |chunk| MemoryPlan::new(&m, &Options { prefill_chunk: chunk, ..auto.clone() });
        let (short, long) = (at(DEFAULT_PREFILL_CHUNK), at(STREAMING_PREFILL_CHUNK));
        assert_eq!(MemoryPlan::new(&m, &auto), short, "new() plans a chunk of 0 as the default");
        let delta = long.scratch_bytes - short.scratch_bytes;
        assert!(delta > 0 && delta * 16 < short.cache_within(u64::MAX), "{delta}");
        let chosen = |o: &Options| MemoryPlan::for_options(&m, o, || Ok(1 << 40)).must().prefill_chunk;
        // The engine's own budget is 3 working sets (24 slots) of 128 records: they stream.
        assert_eq!(chosen(&auto), STREAMING_PREFILL_CHUNK);
        assert_eq!(MemoryPlan::for_options(&m, &auto, || Ok(1 << 40)).must(), long);
        // A budget whose cache holds every record at 128: the default.
        let every = short.resident_bytes() + short.cache_within(u64::MAX);
        assert_eq!(chosen(&Options { budget: Some(every), ..auto.clone() }), DEFAULT_PREFILL_CHUNK);
        assert_eq!(chosen(&Options { budget: Some(every - 1), ..auto.clone() }), STREAMING_PREFILL_CHUNK);
        // A budget whose cache the longer chunk's scratch would cut by more than an eighth.
        let small_cache = short.cache_within(delta * 4);
        assert!(small_cache >= short.min_expert_cache_bytes);
        assert_eq!(chosen(&Options { budget: Some(short.resident_bytes() + small_cache), ..auto.clone() }), DEFAULT_PREFILL_CHUNK);
        let large_cache = short.cache_within(delta * 16);
        assert_eq!(chosen(&Options { budget: Some(short.resident_bytes() + large_cache), ..auto.clone() }), STREAMING_PREFILL_CHUNK);
        // Under the floor: the default plan, and the budget's error comes when it is resolved.
        let under = Options { budget: Some(short.floor_bytes() - 1), ..auto.clone() };
        assert_eq!(chosen(&under), DEFAULT_PREFILL_CHUNK);
        // A chunk given, or a model without streamed experts: RAM is not even read.
        let no_ram = || Err(Error::arg("not read"));
        assert_eq!(MemoryPlan::for_options(&m, &Options { prefill_chunk: 7, ..auto.clone() }, no_ram).must().prefill_chunk, 7);
        let dense = Footprint { experts: None, kind: ModelKind::HfCheckpoint, ..m.clone() };
        assert_eq!(MemoryPlan::for_options(&dense, &auto, no_ram).must().prefill_chunk, DEFAULT_PREFILL_CHUNK);
        assert!(MemoryPlan::for_options(&m, &auto, no_ram).is_err(), "a streamed model's choice needs the RAM");
    }
}
