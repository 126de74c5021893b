//! The memory plan: what a model needs resident (its floor), what one token's experts weigh
//! (the working set), and how a RAM budget is chosen and split (seed 001 §3). Computed from
//! headers alone — config and tensor shapes — so it runs before any weight is read.
//!
//! The parts, each equal to what the engine will hold:
//! - **trunk**: every weight kept resident (embeddings, attention, dense FFNs, routers, shared
//!   experts, norms, head), matrices at their stored size and 1-D vectors widened to f32, as
//!   `model::weights` loads them — plus, for a Hugging Face MoE checkpoint, which loads whole,
//!   every routed expert as a resident record;
//! - **state**: the KV cache for the context; for MLA layers the latent cache and for KDA layers
//!   the recurrent and convolution state instead (`model::latent::Sizes`);
//! - **scratch**: activations, logits, per-thread score rows, routing buffers (later expert
//!   I/O buffers) — state and scratch both from [`State::plan_bytes`], the formula the
//!   allocation uses;
//! - **minimum expert cache**: top-k × the largest expert record × 2 (one layer's experts
//!   in use while the next layer's are read), 0 when no expert streams.
//!
//! FLOOR is their sum; nothing runs below it. Everything above it is expert cache, worth having
//! in whole **working sets** (top-k × record × MoE layers: one token's experts), hence
//! recommended = floor + 3 working sets.
//!
//! Each kind of model on disk is a [`ModelKind`] and a branch of [`Footprint::read`] that
//! fills a [`Footprint`]; everything after that is shared.

use crate::error::{Error, ErrorKind, Result};
use crate::format::config::ModelConfig;
use crate::format::container;
use crate::format::safetensors::Checkpoint;
use crate::model::state::State;
use crate::model::weights::{load_trunk, Loader};
use crate::Options;
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

/// The routed experts of a MoE model, as far as memory is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertShape {
    /// Experts each token uses per MoE layer.
    pub top_k: usize,
    /// Layers with routed experts.
    pub moe_layers: usize,
    /// Bytes of the largest expert record (what one cache slot must hold).
    pub largest_record_bytes: u64,
    /// Expert records in all banks (a cache never needs more slots than this).
    pub records: u64,
    /// Read buffers the expert loader holds outside the cache (counted as scratch).
    pub io_buffer_bytes: u64,
}

/// What the plan needs from a model on disk: its shape, its resident bytes, its experts.
#[derive(Clone, Debug)]
pub struct Footprint {
    pub path: PathBuf,
    pub kind: ModelKind,
    pub cfg: ModelConfig,
    /// Bytes of resident weights as the engine holds them.
    pub trunk_bytes: u64,
    /// Streamed routed experts; `None` when there are none (a dense model, or a Hugging Face
    /// MoE checkpoint whose experts are resident and counted in `trunk_bytes`).
    pub experts: Option<ExpertShape>,
}

/// A model's memory plan for one context length, thread count and prefill chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    pub kind: ModelKind,
    /// Context length in tokens (after resolving 0 against the model).
    pub ctx: usize,
    pub threads: usize,
    pub prefill_chunk: usize,
    pub trunk_bytes: u64,
    pub state_bytes: u64,
    pub scratch_bytes: u64,
    pub min_expert_cache_bytes: u64,
    /// One token's experts over every MoE layer; 0 for a dense model.
    pub working_set_bytes: u64,
    /// Bytes of one expert-cache slot (the largest record); 0 when no expert streams.
    pub expert_slot_bytes: u64,
    /// Expert records in the model: the cache never holds more.
    pub expert_records: u64,
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
}

/// A resolved RAM budget and the expert cache it leaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub expert_cache_bytes: u64,
    pub source: BudgetSource,
    /// Something the host should tell the user (the library never prints): the floor is above
    /// 7/8 of usable RAM, or an explicit budget is above usable RAM.
    pub warning: Option<String>,
}

/// The plan for `path` with context `ctx_tokens` (0 = the model's, at most 4096) and the
/// default threads and prefill chunk.
pub fn plan_memory(path: impl AsRef<Path>, ctx_tokens: usize) -> Result<MemoryPlan> {
    plan_memory_opts(path, &Options { ctx: ctx_tokens, ..Options::default() })
}

/// The plan for `path` opened with `opts` — the same bytes `Model::open(path, opts)` holds.
pub fn plan_memory_opts(path: impl AsRef<Path>, opts: &Options) -> Result<MemoryPlan> {
    opts.validate()?;
    let m = Footprint::read(path.as_ref())?;
    Ok(MemoryPlan::new(&m, opts))
}

impl Footprint {
    /// Reads the footprint of the model at `path` (headers only, no weights).
    pub fn read(path: &Path) -> Result<Footprint> {
        if !path.is_dir() {
            return Err(Error::new(ErrorKind::Io, format!("{}: not a model directory", path.display())));
        }
        if container::is_container(path) {
            return Footprint::container(path);
        }
        let cfg = ModelConfig::load(path)?;
        let ckpt = Checkpoint::open(path)?;
        // The loader in counting mode: the same tensors, checks and byte counts as
        // `Model::open`, with nothing read. A Hugging Face MoE checkpoint's experts are resident.
        let mut ld = Loader::counting(&ckpt);
        load_trunk(&mut ld, &cfg)?;
        crate::model::experts::load_resident(&mut ld, &cfg)?;
        Ok(Footprint { path: path.to_path_buf(), kind: ModelKind::HfCheckpoint, cfg, trunk_bytes: ld.bytes, experts: None })
    }

    /// A container: the trunk from its trunk files' headers, the experts from its banks.
    fn container(dir: &Path) -> Result<Footprint> {
        let m = container::Manifest::open(dir)?;
        let ckpt = Checkpoint::open_files(dir, &m.trunk_files)?;
        let mut ld = Loader::counting(&ckpt);
        load_trunk(&mut ld, &m.config)?;
        let trunk_bytes = ld.bytes;
        let experts = match m.config.moe.as_ref() {
            Some(moe) if !m.banks.is_empty() => Some(ExpertShape {
                top_k: moe.top_k,
                moe_layers: m.banks.len(),
                largest_record_bytes: m.max_record_bytes() as u64,
                records: m.banks.iter().map(|b| b.experts as u64).sum(),
                io_buffer_bytes: 0,
            }),
            _ => None,
        };
        Ok(Footprint { path: dir.to_path_buf(), kind: ModelKind::Container, cfg: m.config, trunk_bytes, experts })
    }
}

impl MemoryPlan {
    /// The plan of a model for the context, threads and chunk of `opts`.
    pub fn new(m: &Footprint, opts: &Options) -> MemoryPlan {
        let threads = opts.resolved_threads().max(1);
        let ctx = opts.resolved_ctx(m.cfg.max_position);
        let chunk = opts.prefill_chunk.max(1);
        let (kv, mut scratch) = State::plan_bytes(&m.cfg, ctx, chunk, threads);
        if opts.int8_activations {
            scratch += State::int8_scratch_bytes(&m.cfg, chunk);
        }
        let (min_cache, working_set, io, slot, records) = match &m.experts {
            None => (0, 0, 0, 0, 0),
            Some(e) => {
                let per_layer = (e.top_k as u64).saturating_mul(e.largest_record_bytes);
                (per_layer.saturating_mul(2), per_layer.saturating_mul(e.moe_layers as u64), e.io_buffer_bytes,
                 e.largest_record_bytes, e.records)
            }
        };
        MemoryPlan {
            kind: m.kind,
            ctx,
            threads,
            prefill_chunk: chunk,
            trunk_bytes: m.trunk_bytes,
            state_bytes: kv,
            scratch_bytes: scratch.saturating_add(io),
            min_expert_cache_bytes: min_cache,
            working_set_bytes: working_set,
            expert_slot_bytes: slot,
            expert_records: records,
        }
    }

    /// Trunk + state + scratch + minimum expert cache: nothing runs in less.
    pub fn floor_bytes(&self) -> u64 {
        self.resident_bytes().saturating_add(self.min_expert_cache_bytes)
    }

    /// Everything except the expert cache.
    pub fn resident_bytes(&self) -> u64 {
        self.trunk_bytes.saturating_add(self.state_bytes).saturating_add(self.scratch_bytes)
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

    /// The expert cache a budget leaves, as the cache allocates it: whole slots in what is
    /// left above trunk, state and scratch (so it includes the minimum expert cache), never
    /// more slots than the model has records. When no expert streams there is no cache and
    /// the rest of the budget stays unused. A budget under the floor is an error (see
    /// [`MemoryPlan::check_budget`]).
    pub fn expert_cache_bytes(&self, budget: u64) -> Result<u64> {
        self.check_budget(budget)?;
        if !self.has_experts() {
            return Ok(0);
        }
        let slots = ((budget - self.resident_bytes()) / self.expert_slot_bytes).min(self.expert_records);
        Ok(slots * self.expert_slot_bytes)
    }

    /// Fails with [`ErrorKind::RamBudget`] when `budget` is under the floor; the message gives
    /// the floor in bytes and points to `waste plan`.
    pub fn check_budget(&self, budget: u64) -> Result<()> {
        let floor = self.floor_bytes();
        if budget >= floor {
            return Ok(());
        }
        Err(Error::new(ErrorKind::RamBudget, format!(
            "a budget of {budget} bytes is under this model's floor of {floor} bytes \
(trunk {} + state {} + scratch {} + minimum expert cache {} at a context of {} tokens); \
see `waste plan MODEL`", self.trunk_bytes, self.state_bytes, self.scratch_bytes, self.min_expert_cache_bytes, self.ctx)))
    }
}

/// The budget rule (seed 001 §3). An explicit budget is a hard ceiling and must cover the
/// floor. Without one, the largest of floor + 3, 2, 1 working sets that fits under 7/8 of
/// `usable_ram`, else the floor — with a warning when even the floor is above 7/8, since
/// refusing a model that does fit would be worse. Expert cache only pays in whole working
/// sets, and filling up to the cap walks the machine into paging.
pub fn resolve_budget(plan: &MemoryPlan, usable_ram: u64, explicit: Option<u64>) -> Result<Budget> {
    if let Some(bytes) = explicit {
        let expert_cache_bytes = plan.expert_cache_bytes(bytes)?;
        let warning = (bytes > usable_ram).then(|| format!(
            "the budget of {bytes} bytes is above the {usable_ram} bytes of usable RAM"));
        return Ok(Budget { bytes, expert_cache_bytes, source: BudgetSource::Explicit, warning });
    }
    let cap = (usable_ram as u128 * 7 / 8) as u64;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    fn moe_plan(ws: u64) -> MemoryPlan {
        // trunk 1000 + state 200 + scratch 100 + min cache 50 (top-1, 2 slots of 25) = floor 1350.
        MemoryPlan { kind: ModelKind::Container, ctx: 16, threads: 1, prefill_chunk: 1, trunk_bytes: 1000,
            state_bytes: 200, scratch_bytes: 100, min_expert_cache_bytes: 50, working_set_bytes: ws,
            expert_slot_bytes: 25, expert_records: 1000 }
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
        assert!(e.message().contains("1350 bytes") && e.message().contains("waste plan"), "{e}");
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

    #[test]
    fn experts_enter_floor_and_working_set() {
        let json = crate::format::json::parse(br#"{"architectures":["LlamaForCausalLM"],"hidden_size":8,
            "intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":2,"vocab_size":32,
            "max_position_embeddings":64}"#).must();
        let cfg = ModelConfig::from_json(Path::new("config.json"), &json).must();
        let e = ExpertShape { top_k: 4, moe_layers: 2, largest_record_bytes: 1000, records: 16, io_buffer_bytes: 7 };
        let m = Footprint { path: PathBuf::new(), kind: ModelKind::HfCheckpoint, cfg: cfg.clone(), trunk_bytes: 5, experts: Some(e) };
        let opts = Options { threads: 2, ctx: 8, prefill_chunk: 4, ..Options::default() };
        let p = MemoryPlan::new(&m, &opts);
        let (kv, scratch) = State::plan_bytes(&cfg, 8, 4, 2);
        assert_eq!((p.state_bytes, p.scratch_bytes), (kv, scratch + 7));
        assert_eq!(p.min_expert_cache_bytes, 8000);
        assert_eq!(p.working_set_bytes, 8000);
        assert_eq!(p.floor_bytes(), 5 + kv + scratch + 7 + 8000);
        assert_eq!(p.recommended_bytes(), p.floor_bytes() + 24000);
        assert_eq!((p.expert_slot_bytes, p.expert_records), (1000, 16));
        assert_eq!(p.expert_cache_bytes(p.floor_bytes() + (1 << 30)).must(), 16000);
    }
}
