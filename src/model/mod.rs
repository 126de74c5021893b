//! A decoder-only model: its config, its resident weights, its run state, and the forward pass
//! (spec §0.2) that turns tokens into logits.
//!
//! One forward pass serves every family: the differences (q/k/v bias, q/k norm, clipping,
//! sliding windows, the FFN kind) are fields of [`ModelConfig`], read from the family table.
//! A pass processes a chunk of tokens at once; every (row, token) dot product is computed the
//! same way whatever the chunk size or thread count, so chunked prefill and token-at-a-time
//! decoding give bit-identical logits.

pub(crate) mod disk_rows;
pub(crate) mod experts;
pub(crate) mod gdn;
pub(crate) mod gpt_oss;
pub mod kda;
pub(crate) mod latent;
pub(crate) mod mla;
pub(crate) mod moe;
pub mod plan;
pub(crate) mod rope;
pub(crate) mod route;
pub(crate) mod routing;
pub(crate) mod session;
pub mod state;
pub(crate) mod weights;

use crate::error::{Error, ErrorKind, Result};
use crate::format::config::{ModelConfig, QkNorm};
use crate::model::plan::{Budget, Footprint, Headers, MemoryPlan, MemoryUse};
use crate::format::json::Json;
use crate::cache::{CacheOptions, CacheStats, ExpertCache};
use crate::cache::replay::Trace;
use crate::cache::usage::Usage;
pub use routing::TokenRoute;
use crate::format::container::Manifest;
use crate::format::safetensors::Checkpoint;
use crate::kernels::attention::{attend, AttnShape};
use crate::kernels::{self, Kernels, Pool};
use crate::sample::SampleBuffers;
use crate::tokenizer::Tokenizer;
use crate::Options;
use session::Session;
use state::{SessionCache, State};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use experts::Experts;
use weights::{Ffn, Linear, MixerWeights, Weights};

/// An open model: weights, expert cache, kernels and threads, the scratch of a forward pass,
/// and a session of its own (the one [`Model::eval`] and [`Model::generate`] use; more come
/// from [`Model::new_session`]).
///
/// The thread that evaluates (any method that runs the forward pass) is participant 0 of the
/// model's compute pool: it runs the same kernels as the pool's workers, and the prefill
/// GEMMs keep their panels and accumulators on the stack, up to 280 KiB per call (the memory
/// plan counts 384 KiB per worker, `kernels::pool::THREAD_BYTES`). Evaluate from a thread with
/// at least 1 MiB of stack: Rust's spawned threads have 2 MiB unless told otherwise, a main
/// thread usually 8 MiB.
pub struct Model {
    path: PathBuf,
    cfg: ModelConfig,
    weights: Weights,
    experts: Experts,
    pub(crate) state: State,
    /// The model's own session.
    pub(crate) session: Session,
    /// Bytes held by the other sessions made by [`Model::new_session`] and still alive.
    ledger: Arc<AtomicU64>,
    /// SHA-256 over the config and the tensor index ([`session::identity`]): a session's
    /// state belongs to the model with the same identity and context.
    identity: [u8; 32],
    pub(crate) stats: ModelStats,
    kernels: Kernels,
    /// How products take their inputs, as `Options::activations` asked.
    activations: crate::Activations,
    pool: Pool,
    inv_freq: Vec<f32>,
    pub(crate) tokenizer: Option<Tokenizer>,
    /// Why there is no tokenizer, when there is a file the engine cannot use (reported when
    /// text is needed, so `eval --ids` still works).
    tokenizer_error: Option<Error>,
    pub(crate) eos: Vec<u32>,
    /// The sampler's buffers, lent to each generation.
    pub(crate) sample_buffers: SampleBuffers,
    plan: MemoryPlan,
    budget: Budget,
    /// Router look-ahead for streamed experts (Options::lookahead).
    lookahead: bool,
    /// Routing recorded ([`Model::record_routing`]), replayed ([`Model::replay_routing`]) or
    /// counted ([`Model::learn_usage`]).
    routing: routing::RoutingHooks,
    /// What open did that the host may want to tell the user ([`Model::notes`]).
    notes: Vec<String>,
    /// The learned hotlist's file (Options::usage_file, else `usage.waste` in `path`).
    usage_file: PathBuf,
}

/// Static facts about an open model (what `waste info` prints).
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The path it was opened from.
    pub path: PathBuf,
    /// The config.json architecture string.
    pub architecture: String,
    /// Transformer layers.
    pub layers: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Key/value heads (fewer than `heads` with grouped-query attention).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Width of the feed-forward layer.
    pub intermediate: usize,
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// Experts per MoE layer and experts per token, when the model has them.
    pub experts: Option<(usize, usize)>,
    /// Number of weights (elements of every tensor loaded).
    pub parameters: u64,
    /// The stored dtypes of every tensor loaded (matrices, norm vectors, biases), in the order
    /// first met: a BF16 checkpoint with F32 norms lists both.
    pub dtypes: Vec<String>,
    /// Bytes of weights held in RAM.
    pub weight_bytes: u64,
    /// Bytes of the KV cache.
    pub kv_bytes: u64,
    /// Bytes of scratch buffers.
    pub scratch_bytes: u64,
    /// Context length the state holds.
    pub context: usize,
    /// Compute threads.
    pub threads: usize,
    /// Kernel instruction set in use.
    pub isa: &'static str,
    /// How Q8B32 and Q4B32 products take their inputs (`Options::activations`).
    pub activations: crate::Activations,
    /// The integer path's kernels (`scalar`, `avx2`, `avx2+avx-vnni`, `avx512vnni`) when the
    /// activations are quantized — for the default ([`crate::Activations::Auto`]), when its
    /// int21 decode is on and the model has Q4B32 weights for it.
    pub activation_kernels: Option<&'static str>,
    /// The tokenizer file, if the model has one.
    pub tokenizer: Option<PathBuf>,
    /// Streamed experts (wp-container): bytes of the expert cache's slots (0 when experts are
    /// resident or absent), the banks streamed, and how they are read — `O_DIRECT`,
    /// `buffered+fadvise` (the fallback) or `mixed` — (`None` without streamed experts).
    pub expert_cache_bytes: u64,
    /// Layers whose experts stream from a bank.
    pub expert_banks: usize,
    /// How expert records are read (`O_DIRECT` or buffered), when any stream.
    pub io_mode: Option<&'static str>,
    /// Multi-token-prediction layers the config declares (GLM-4.5's `num_nextn_predict_layers`):
    /// skipped, their tensors never read, as they are not part of the next-token forward pass.
    pub mtp_layers: usize,
}

/// Running totals of what a model has computed since it was opened ([`Model::stats`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelStats {
    /// Prompt tokens computed (prefill: [`Model::eval_in`] and the prompts of generations;
    /// tokens whose state a session already held are not counted).
    pub prefill_tokens: u64,
    /// Time of those forward passes (and of sampling each generation's first token).
    pub prefill_time: Duration,
    /// Tokens generated (end-of-sequence tokens not counted).
    pub generated_tokens: u64,
    /// Decode steps (one forward pass and one sampling each) and their time.
    pub decode_steps: u64,
    /// Time in decode steps.
    pub decode_time: Duration,
    /// Generations run.
    pub generations: u64,
    /// Expert-cache counters, for a model whose experts stream (`None` otherwise).
    pub cache: Option<CacheStats>,
}

/// Receives each position's logits: (index of the token in the call, its logits).
type LogitsFn<'a> = dyn FnMut(usize, &[f32]) -> Result<()> + 'a;

/// Receives hidden states: (slot, index of the chunk's first token in the call, the chunk's
/// rows, tokens × hidden). Slot 0 is the embeddings, slot l the residual stream after layer l,
/// slot layers + 1 the final normed state.
type HiddenFn<'a> = dyn FnMut(usize, usize, &[f32]) -> Result<()> + 'a;

/// Which logits a forward pass produces.
pub(crate) enum LogitsOut<'a, 'b> {
    /// Only the last position's, into row 0 of the state's logits.
    Last,
    /// Every position's, handed to the callback a group of rows at a time (and the last
    /// position's left in row 0).
    Each(&'a mut LogitsFn<'b>),
}

impl Model {
    /// Opens a Hugging Face checkpoint directory (config.json + safetensors, and a tokenizer
    /// file when there is one).
    ///
    /// ```no_run
    /// let mut model = waste::Model::open("models/stories260K", &waste::Options::default())?;
    /// let ids = model.tokenize_prompt("Once upon a time")?;
    /// let logits = model.eval(&ids)?;
    /// assert_eq!(logits.len(), model.info().vocab);
    /// # Ok::<(), waste::Error>(())
    /// ```
    pub fn open(path: impl AsRef<Path>, opts: &Options) -> Result<Model> {
        let path = path.as_ref();
        opts.validate()?;
        // Every JSON file and header is parsed within the budget (docs/RELIABILITY.md): these
        // parses come before anything large is held, so they cannot push the peak past it. Each
        // is read once: the plan is computed from the same headers the load uses.
        let limits = crate::format::json::Limits::for_budget(opts.budget);
        let headers = Headers::read(path, &limits)?;
        // The memory plan comes first, from headers alone: a budget under the floor fails here,
        // before any weight or expert is read.
        let usable = plan::usable_ram_for(opts)?;
        let plan = MemoryPlan::for_options(&Footprint::of(path, &headers)?, opts, || Ok(usable))?;
        let budget = plan.budget_for(usable, opts)?;
        let Headers { manifest, cfg, config_json, ckpt } = headers;
        let manifest = manifest.as_ref();
        // The tokenizer before the weights: its load briefly holds the file (and a
        // tokenizer.json's parsed document) besides its tables, and nothing large is held yet.
        let (tokenizer, tokenizer_error) = open_tokenizer(path, manifest, cfg.vocab, &limits)?;
        // With `verify`, the trunk files' CRC-32s too (one pass over the trunk).
        if let Some(m) = manifest.filter(|_| opts.verify) {
            m.verify_trunk()?;
        }
        // The identity from the headers, before the weights are read: its transient buffers
        // come and go while little else is held.
        let identity = model_identity(manifest, &ckpt, manifest.map_or(&config_json, |m| &m.config_json));
        drop(config_json);
        // generation_config.json too, before the weights: read after them, its parse would add
        // to the budget.
        let generation_eos = generation_eos(path, &limits)?;
        let mut loader = weights::Loader::new(&ckpt);
        loader.embeddings_on_disk = weights::streams_embeddings(manifest).then_some(opts.direct_io);
        let mut weights = weights::load_trunk(&mut loader, &cfg)?;
        let experts = match manifest {
            Some(m) if !m.banks.is_empty() => Experts::Streamed(Box::new(ExpertCache::open(m, &CacheOptions {
                bytes: budget.expert_cache_bytes,
                io_threads: opts.io_threads,
                verify: opts.verify,
                policy: None,
                direct_io: opts.direct_io,
                purgeable: opts.purgeable_slots,
                huge_pages: opts.huge_pages,
            })?)),
            Some(_) => Experts::None,
            None => experts::load_resident(&mut loader, &cfg)?,
        };
        let mut notes = Vec::new();
        let mut experts = experts;
        let usage_file = opts.usage_file.clone().unwrap_or_else(|| path.join(crate::cache::usage::FILE_NAME));
        if let (Experts::Streamed(cache), Some(m), true) = (&mut experts, manifest, opts.hotlist) {
            notes.extend(preload_hotlist(&usage_file, m, &identity, cache));
        }
        weights.params = loader.params + manifest.map_or(0, expert_params);
        // The experts' stored dtypes too (gpt-oss's MXFP4 blocks are U8).
        weights.dtypes.clone_from(&loader.dtypes);
        drop(loader);
        drop(ckpt);
        let threads = opts.resolved_threads();
        let ctx = opts.resolved_ctx(cfg.max_position);
        let chunk = plan.prefill_chunk;
        let state = State::new(&cfg, ctx, chunk, threads)?;
        let session = Session::new(&cfg, ctx, identity, None)?;
        let mut kernels = plan::kernels_for(opts).with_split_buffer(State::split_values(&cfg, chunk));
        kernels = match opts.activations {
            crate::Activations::Auto if kernels.int21_decodes_by_default() => kernels.with_int21_decode(State::int8_values(&cfg, crate::kernels::DECODE_VECTORS)),
            crate::Activations::Auto | crate::Activations::F32 => kernels,
            crate::Activations::Int8 => kernels.with_int8_activations(State::int8_values(&cfg, chunk)),
            crate::Activations::Int16 => kernels.with_int16_activations(State::int8_values(&cfg, chunk)),
            crate::Activations::Int21 => kernels.with_int21_activations(State::int8_values(&cfg, chunk)),
        };
        let scalar_twins = |isa: Option<crate::kernels::Int8Isa>| isa == Some(crate::kernels::Int8Isa::Scalar) && kernels.isa() != crate::kernels::Isa::Scalar;
        if opts.activations != crate::Activations::Int8 && scalar_twins(kernels.integer_isa()) {
            notes.push(format!("{} activations run on the scalar twins on this CPU (their SIMD kernels need AVX2; \
                the f32 kernels here are {}): the products they take will be several times slower than with f32 activations",
                opts.activations.name(), kernels.isa().name()));
        }
        let cfg_vocab = cfg.vocab;
        let mut eos = cfg.eos_tokens.clone();
        eos.extend(generation_eos);
        if let Some(t) = &tokenizer {
            eos.extend(t.eos());
        }
        eos.sort_unstable();
        eos.dedup();
        Ok(Model {
            path: path.to_path_buf(),
            inv_freq: rope::inv_freq(&cfg.rope),
            kernels,
            activations: opts.activations,
            pool: Pool::with_cpus(threads, opts.cpus.as_ref())?,
            cfg,
            weights,
            experts,
            state,
            session,
            ledger: Arc::new(AtomicU64::new(0)),
            identity,
            stats: ModelStats::default(),
            tokenizer,
            tokenizer_error,
            eos,
            sample_buffers: SampleBuffers::new(cfg_vocab),
            plan,
            budget,
            lookahead: opts.lookahead,
            routing: routing::RoutingHooks::default(),
            notes,
            usage_file,
        })
    }

    /// The directory the model was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The model's config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Static facts about the model.
    pub fn info(&self) -> ModelInfo {
        let c = &self.cfg;
        let used = self.memory_use();
        ModelInfo {
            path: self.path.clone(),
            architecture: c.class.clone(),
            layers: c.layers,
            hidden: c.hidden,
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            intermediate: c.intermediate,
            vocab: c.vocab,
            experts: c.moe.as_ref().map(|m| (m.experts, m.top_k)),
            parameters: self.weights.params,
            dtypes: self.weights.dtypes.iter().map(|d| d.name().to_string()).collect(),
            weight_bytes: used.trunk + used.expert_cache,
            kv_bytes: used.state,
            scratch_bytes: used.scratch,
            context: self.state.ctx,
            threads: self.pool.threads(),
            isa: self.kernels.isa().name(),
            activations: self.activations,
            // The default's int21 decode is named only where it has Q4B32 products to take.
            activation_kernels: self.kernels.integer_isa()
                .filter(|_| self.activations != crate::Activations::Auto || self.weights.dtypes.contains(&crate::format::dtype::DType::Q4B32))
                .map(|i| i.kernels_name()),
            tokenizer: self.tokenizer.as_ref().map(|t| t.path().to_path_buf()),
            expert_cache_bytes: if self.experts.is_streamed() { self.experts.resident_bytes() } else { 0 },
            expert_banks: self.cache_stats().map_or(0, |s| s.banks),
            io_mode: self.cache_stats().map(CacheStats::io_mode),
            mtp_layers: c.mtp_layers,
        }
    }

    /// The tokenizer, or an error when the model directory has none (or one the engine cannot
    /// use: that error, naming the file and key).
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| match &self.tokenizer_error {
            Some(e) => Error::new(e.kind(), e.message().to_string()),
            None => Error::new(ErrorKind::Tokenizer, format!("{}: the model has no tokenizer file", self.path.display())),
        })
    }

    /// Token ids that end generation.
    pub fn eos_tokens(&self) -> &[u32] {
        &self.eos
    }

    /// Encodes a plain-text prompt as content (special-token strings stay text), preceded by
    /// the BOS token when the vocabulary uses one.
    pub fn tokenize_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let tok = self.tokenizer()?;
        let mut ids: Vec<u32> = tok.bos().into_iter().collect();
        ids.extend(tok.tokenize(text));
        Ok(ids)
    }

    /// Bytes the engine holds for this model, measured from what it allocated: the sum of
    /// [`Model::memory_use`]. After open it is at most the plan's resident bytes plus the
    /// expert cache the budget left, and differs from it only by the tokenizer's allowance
    /// (docs/MEMORY.md).
    pub fn memory_used(&self) -> u64 {
        self.memory_use().total()
    }

    /// What the engine holds, part by part, each measured from the buffers themselves (vector
    /// capacities, aligned buffers, the cache's slots); the threads and the model's small fixed
    /// metadata at their documented constants.
    pub fn memory_use(&self) -> MemoryUse {
        let sessions = self.session.heap_bytes() + self.ledger.load(Ordering::Relaxed);
        let state_scratch = self.state.heap_bytes();
        let mut threads = self.pool.memory_bytes();
        let (trunk, expert_cache) = match &self.experts {
            Experts::Streamed(c) => {
                threads += c.thread_bytes();
                (self.weights.bytes, c.memory_bytes())
            }
            e => (self.weights.bytes + e.resident_bytes(), 0),
        };
        MemoryUse {
            trunk,
            state: sessions,
            scratch: state_scratch + crate::sys::vec_bytes(&self.inv_freq) + self.kernels.heap_bytes()
                + self.sample_buffers.heap_bytes() + threads + crate::model::plan::metadata_bytes(self.cfg.layers),
            tokenizer: self.tokenizer.as_ref().map_or(0, Tokenizer::heap_bytes),
            expert_cache,
        }
    }

    /// The memory plan the model was opened with.
    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// The budget the model runs under: explicit or chosen, with any warning for the host.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Expert-cache statistics, for a model whose experts stream from disk.
    pub fn cache_stats(&self) -> Option<&CacheStats> {
        match &self.experts {
            Experts::Streamed(c) => Some(c.stats()),
            _ => None,
        }
    }

    /// With purgeable slots ([`crate::Options::purgeable_slots`]), offers the pages of every
    /// resident expert record to the kernel, the ones the last token used included (in
    /// decode those wait for their layer's next visit): for a caller whose own loop of
    /// [`Model::eval`] calls has ended and that may sit idle. [`Model::generate`] does it when
    /// a generation ends. Nothing otherwise.
    ///
    /// ```no_run
    /// let opts = waste::Options { purgeable_slots: true, ..waste::Options::default() };
    /// let mut model = waste::Model::open("model.waste", &opts)?;
    /// let mut next = 1;
    /// for _ in 0..16 {
    ///     let logits = model.eval(&[next])?;
    ///     next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap_or(0) as u32;
    /// }
    /// model.offer_all_idle(); // idle now: the kernel may take any slot under pressure
    /// # Ok::<(), waste::Error>(())
    /// ```
    pub fn offer_all_idle(&mut self) {
        self.experts.offer_all_idle();
    }

    /// Starts (`true`) or stops recording the experts every computed token routes to, in every
    /// session; [`Model::take_routing`] collects them. Stopping drops what was not taken.
    /// A model without MoE layers records tokens with no layers.
    pub fn record_routing(&mut self, on: bool) {
        self.routing.log = if on { Some(self.routing.log.take().unwrap_or_default()) } else { None };
    }

    /// The tokens routed since recording began or since the last call, in the order they
    /// were computed (prefill tokens included), each with its session position.
    pub fn take_routing(&mut self) -> Vec<TokenRoute> {
        self.routing.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Forces the experts of a routing trace onto the router (`None` restores the router's
    /// own choice): the token at session position `p` takes the trace's token `p` modulo its
    /// length, MoE layer `m` its layer `m` modulo its layers, each id modulo the model's
    /// experts. The router still runs and weighs; only the choice changes — for measuring
    /// streaming with a real model's temporal locality on random weights. Logits then no
    /// longer follow the model's own routing.
    pub fn replay_routing(&mut self, trace: Option<Trace>) {
        self.routing.replay = trace;
    }

    /// What opening the model did that a host may want to show: the hotlist preloaded, or a
    /// usage file ignored and why.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Starts (`true`) or stops counting which experts the computed tokens choose, for the
    /// learned hotlist that [`Model::write_usage`] saves. Stopping drops the counts not saved.
    /// Refused for a model without experts, and when the usage file
    /// ([`Options::usage_file`](crate::Options::usage_file), else `usage.waste` beside the
    /// model) cannot be written — a read-only container needs `usage_file` set at open.
    pub fn learn_usage(&mut self, on: bool) -> Result<()> {
        let Some(moe) = self.cfg.moe.as_ref() else {
            return Err(Error::arg("learning expert usage: the model has no experts"));
        };
        if on {
            crate::cache::usage::check_writable(&self.usage_file)?;
        }
        let layers = self.weights.layers.iter().filter(|l| matches!(l.ffn, Ffn::Moe(_))).count();
        self.routing.usage = on.then(|| self.routing.usage.take().unwrap_or_else(|| Usage::new(layers, moe.experts)));
        Ok(())
    }

    /// Writes the usage counted since [`Model::learn_usage`] to `path` (default:
    /// [`Options::usage_file`](crate::Options::usage_file), else `usage.waste` in the model's
    /// directory: where the next open with the same options finds it), added to what a valid usage
    /// file of this model already there holds (a damaged or foreign one is replaced). Written
    /// atomically (temp file, fsync, rename); a directory that cannot be written is an error
    /// naming it — give another `path` then. The counts written start again from zero, so
    /// writing after every turn of a conversation counts each token once. Returns the path.
    pub fn write_usage(&mut self, path: Option<&Path>) -> Result<PathBuf> {
        let counted = self.routing.usage.as_mut().ok_or_else(|| Error::arg("no expert usage counted: call learn_usage first"))?;
        let path = path.map_or_else(|| self.usage_file.clone(), Path::to_path_buf);
        let mut total = counted.clone();
        if let Ok(Some(before)) = Usage::read(&path, &self.identity, counted.layers, counted.experts) {
            total.merge(&before);
        }
        crate::format::safetensors::write_atomic(&path, &total.encode(&self.identity))?;
        counted.tokens = 0;
        counted.counts.iter_mut().for_each(|c| *c = 0);
        Ok(path)
    }

    /// Tokens whose state the model's own session holds.
    pub fn position(&self) -> usize {
        self.session.position()
    }

    /// Context length of every session of the model.
    pub fn context(&self) -> usize {
        self.state.ctx
    }

    /// Empties the model's own session.
    pub fn reset(&mut self) {
        self.session.reset();
    }

    /// The model's own session (the one [`Model::eval`] and [`Model::generate`] use): to save
    /// or load its state, or read its tokens.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The model's own session, mutably (for [`Session::load_state`] and [`Session::reset`]).
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Bytes one session holds for this model (its caches for the whole context and the room
    /// for its tokens).
    pub fn session_bytes(&self) -> u64 {
        Session::plan_bytes(&self.cfg, self.state.ctx)
    }

    /// Opens another session on the model: the weights, expert cache and scratch are shared,
    /// the session owns its conversation's state. Its bytes count against the model's budget
    /// for as long as it lives; a session that does not fit under the budget is refused with
    /// an [`ErrorKind::RamBudget`] error naming both (reserve room for it at open with
    /// [`Options::sessions`]: the expert cache then leaves it free).
    pub fn new_session(&self) -> Result<Session> {
        let need = self.session_bytes();
        let (budget, held) = (self.budget.bytes, self.memory_used());
        if held.saturating_add(need) > budget {
            return Err(Error::new(ErrorKind::RamBudget, format!(
                "a new session needs {need} bytes (state for a context of {} tokens), but the budget of {budget} bytes has {} left (the model holds {held}); reserve room for more sessions when opening the model (Options::sessions, --sessions N) or give a larger budget; see `waste plan --sessions N`", self.state.ctx, budget.saturating_sub(held))));
        }
        Session::new(&self.cfg, self.state.ctx, self.identity, Some(self.ledger.clone()))
    }

    /// Running totals since open: tokens, prefill and decode time, the expert cache's counters.
    pub fn stats(&self) -> ModelStats {
        ModelStats { cache: self.cache_stats().cloned(), ..self.stats.clone() }
    }

    /// The vocabulary size (rows of the embedding).
    pub(crate) fn cfg_vocab(&self) -> usize {
        self.cfg.vocab
    }

    /// Refuses a session made for another model (or another context).
    pub(crate) fn check_session(&self, s: &Session) -> Result<()> {
        if s.shape.identity != self.identity || s.shape.ctx != self.state.ctx {
            return Err(Error::arg(format!(
                "the session belongs to another model ({}, context {}): sessions run only on the model that made them",
                s.architecture, s.shape.ctx)));
        }
        Ok(())
    }

    /// Runs `f` with the model's own session lent out of it (and put back whatever happens).
    fn with_own_session<T>(&mut self, f: impl FnOnce(&mut Model, &mut Session) -> Result<T>) -> Result<T> {
        let mut s = std::mem::replace(&mut self.session, Session::placeholder());
        let r = f(self, &mut s);
        self.session = s;
        r
    }

    /// Appends `tokens` to the model's own session and returns the logits after the last one.
    pub fn eval(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.with_own_session(|m, s| m.eval_in(s, tokens).map(|_| ()))?;
        Ok(self.logits())
    }

    /// Appends `tokens` to `session` (after a token it holds but has not computed, if any)
    /// and returns the logits after the last one.
    pub fn eval_in(&mut self, session: &mut Session, tokens: &[u32]) -> Result<&[f32]> {
        if tokens.is_empty() {
            return Err(Error::arg("eval: no tokens"));
        }
        self.append(session, tokens, LogitsOut::Last, None)?;
        Ok(self.logits())
    }

    /// Appends `tokens` to the session's history and computes every token it holds but has
    /// not computed. Bad input is refused before anything changes; a pass that fails midway
    /// (an expert record that cannot be read) leaves the history at what the cache holds — and
    /// a recurrent state, which such a pass may have advanced without its position, is reset.
    fn append(&mut self, s: &mut Session, tokens: &[u32], out: LogitsOut, trace: Option<&mut HiddenFn>) -> Result<()> {
        self.check_session(s)?;
        let (pos, before) = (s.cache.pos, s.history.len());
        if before + tokens.len() > self.state.ctx {
            return Err(Error::new(ErrorKind::Context, format!(
                "{} tokens after the session's {before} exceed the context of {}", tokens.len(), self.state.ctx)));
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(Error::arg(format!("token id {bad} is out of range (vocabulary of {})", self.cfg.vocab)));
        }
        s.history.extend_from_slice(tokens);
        let t = std::time::Instant::now();
        let r = self.run(&mut s.cache, &s.history[pos..], out, trace);
        match r {
            Ok(()) => {
                self.stats.prefill_tokens += (s.history.len() - pos) as u64;
                self.stats.prefill_time += t.elapsed();
                Ok(())
            }
            Err(e) => {
                if s.is_recurrent() {
                    s.reset();
                } else {
                    s.history.truncate(before.max(s.cache.pos));
                }
                Err(e)
            }
        }
    }

    /// The logits after the last token evaluated (zeros before any).
    pub fn logits(&self) -> &[f32] {
        &self.state.logits[..self.cfg.vocab]
    }

    /// Appends `tokens` to the model's own session and calls `f(i, logits)` with the logits
    /// after each `tokens[i]`, in order, as each prefill chunk computes them: nothing of size
    /// tokens × vocab is ever held (a chunk's logits are computed a group of rows at a time, in
    /// a buffer the memory plan counts). An error from `f` stops the evaluation and is
    /// returned; the session then holds the tokens up to the end of the prefill chunk being
    /// reported (a session with a recurrent state is reset). Afterwards [`Model::logits`] is
    /// the last token's.
    ///
    /// ```no_run
    /// # let mut model = waste::Model::open("models/stories260K", &waste::Options::default())?;
    /// let mut best = Vec::new();
    /// model.eval_each(&[1, 403, 407], |_, logits| {
    ///     best.push(logits.iter().enumerate().fold(0, |b, (i, &v)| if v > logits[b] { i } else { b }));
    ///     Ok(())
    /// })?;
    /// # Ok::<(), waste::Error>(())
    /// ```
    pub fn eval_each(&mut self, tokens: &[u32], mut f: impl FnMut(usize, &[f32]) -> Result<()>) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::arg("eval: no tokens"));
        }
        self.with_own_session(|m, s| {
            let skip = s.history.len() - s.cache.pos;
            let mut each = |i: usize, logits: &[f32]| if i >= skip { f(i - skip, logits) } else { Ok(()) };
            m.append(s, tokens, LogitsOut::Each(&mut each), None)
        })
    }

    /// Appends `tokens` to the model's own session and streams the hidden states for
    /// debugging numerics: `f(slot, i, rows)` for each prefill chunk and slot, where slot 0 is
    /// the embeddings, slot l the residual stream after layer l and slot layers + 1 the final
    /// normed state (the layout of the reference's `output_hidden_states`), and `rows` holds
    /// tokens `i..` of the chunk (chunk × hidden). Calls come chunk by chunk, each chunk's
    /// slots in order; nothing is held beyond the state. The session must hold no uncomputed
    /// token (reset it after a generation).
    pub fn hidden_states_each(&mut self, tokens: &[u32], mut f: impl FnMut(usize, usize, &[f32]) -> Result<()>) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::arg("eval: no tokens"));
        }
        if self.session.history.len() != self.session.cache.pos {
            return Err(Error::arg("hidden states: the session holds a token it has not computed; reset it first"));
        }
        self.with_own_session(|m, s| m.append(s, tokens, LogitsOut::Last, Some(&mut f)))
    }

    /// Runs `tokens` through the model in chunks at `cache`'s position, which the cache is lent
    /// to the state for (and given back whatever happens).
    pub(crate) fn run(&mut self, cache: &mut SessionCache, tokens: &[u32], out: LogitsOut, trace: Option<&mut HiddenFn>) -> Result<()> {
        std::mem::swap(&mut self.state.cache, cache);
        let r = self.run_lent(tokens, out, trace);
        std::mem::swap(&mut self.state.cache, cache);
        r
    }

    fn run_lent(&mut self, tokens: &[u32], mut out: LogitsOut, mut trace: Option<&mut HiddenFn>) -> Result<()> {
        if self.state.cache.pos + tokens.len() > self.state.ctx {
            return Err(Error::new(ErrorKind::Context, format!(
                "{} tokens at position {} exceed the context of {}", tokens.len(), self.state.cache.pos, self.state.ctx)));
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(Error::arg(format!("token id {bad} is out of range (vocabulary of {})", self.cfg.vocab)));
        }
        // The thread that runs the model is participant 0 of every parallel region: bind it
        // (once) to the CPU list, if there is one.
        self.pool.bind_caller()?;
        let total = tokens.len();
        for (i, chunk) in tokens.chunks(self.state.chunk).enumerate() {
            let start = i * self.state.chunk;
            let last = start + chunk.len() == total;
            self.forward_chunk(chunk, start, &mut out, last, trace.as_deref_mut())?;
        }
        Ok(())
    }

    /// One forward pass over `tokens` (starting at index `start` of the call) at the
    /// session's position. With `LogitsOut::Each` every row's logits go to the callback; the
    /// last row's are left in row 0 of the state's logits when `last`.
    fn forward_chunk(&mut self, tokens: &[u32], start: usize, out: &mut LogitsOut, last: bool,
                     mut trace: Option<&mut HiddenFn>) -> Result<()> {
        let Model { cfg, weights: w, experts, state: st, kernels: k, pool, inv_freq, lookahead, routing, .. } = self;
        let (n, h, pos0) = (tokens.len(), cfg.hidden, st.cache.pos);
        routing.begin_chunk(pos0, n, || w.layers.iter().filter(|l| matches!(l.ffn, Ffn::Moe(_))).count());
        let mut moe_index = 0;
        let half = cfg.rope.dim / 2;
        for (t, &id) in tokens.iter().enumerate() {
            w.embed.row_f32(id as usize, &mut st.x[t * h..(t + 1) * h])?;
            rope::angles(inv_freq, pos0 + t, &mut st.cos[t * half..(t + 1) * half], &mut st.sin[t * half..(t + 1) * half]);
        }
        // gpt-oss's YaRN multiplies cos and sin by its attention factor (f32, as the reference).
        if let Some(g) = cfg.gpt_oss.as_ref().filter(|g| g.rope_attention_factor != 1.0) {
            for c in st.cos[..n * half].iter_mut().chain(st.sin[..n * half].iter_mut()) {
                *c *= g.rope_attention_factor;
            }
        }
        record(&mut trace, 0, start, &st.x[..n * h])?;
        // The rows whose last-layer output anything reads: every row for per-row logits, a
        // hidden-state trace or a routing log; the chunk's last row for the logits after it;
        // none in an earlier chunk. The last layer still writes every row's keys and values,
        // but its attention output and FFN (nearly a whole layer's multiply-adds, and that
        // layer's expert reads) are computed for these rows only, as llama.cpp does
        // for the outputs a batch asks for. Each row's arithmetic does not depend on which
        // other rows a product carries, so the logits keep their bits.
        let outputs = match out {
            LogitsOut::Each(_) => n,
            LogitsOut::Last if trace.is_some() || routing.log.is_some() => n,
            LogitsOut::Last => usize::from(last),
        };
        let mut rows = n;
        for (l, layer) in w.layers.iter().enumerate() {
            for t in 0..n {
                kernels::rmsnorm(&mut st.h[t * h..(t + 1) * h], &st.x[t * h..(t + 1) * h], &layer.attn_norm, cfg.rms_eps);
            }
            let kept = if l + 1 == w.layers.len() { outputs } else { n };
            match (&layer.attn, cfg.mla.as_ref()) {
                (MixerWeights::Attention(a), _) => attention_block(cfg, k, pool, st, a, l, n, kept),
                (MixerWeights::Gdn(g), _) => match cfg.gdn.as_ref() {
                    Some(gc) => gdn::gdn_block(cfg, gc, k, pool, st, g, l, n),
                    None => return Err(Error::new(ErrorKind::Config, format!("layer {l} is linear attention without a GDN config"))),
                },
                (MixerWeights::Mla(m), Some(mc)) => mla::mla_block(cfg, mc, k, pool, st, m, l, n),
                (MixerWeights::Kda(d), Some(mc)) => match mc.kda.as_ref() {
                    Some(kc) => kda::kda_block(cfg, kc, k, pool, st, d, l, n),
                    None => return Err(Error::new(ErrorKind::Config, format!("layer {l} is KDA without a KDA config"))),
                },
                _ => return Err(Error::new(ErrorKind::Config, format!("layer {l}: MLA/KDA weights without an MLA config"))),
            }
            if kept < n {
                // The kept rows move to the front: the attention block wrote only theirs to
                // `out`, the other mixers every row.
                let from = (n - kept) * h..n * h;
                if !matches!(layer.attn, MixerWeights::Attention(_)) {
                    st.out.copy_within(from.clone(), 0);
                }
                st.x.copy_within(from, 0);
                rows = kept;
            }
            add_rows(&mut st.x, &st.out, rows * h);
            if rows == 0 {
                continue;
            }
            for t in 0..rows {
                kernels::rmsnorm(&mut st.h[t * h..(t + 1) * h], &st.x[t * h..(t + 1) * h], &layer.ffn_norm, cfg.rms_eps);
            }
            match &layer.ffn {
                Ffn::Dense(mlp) => mlp_block(k, pool, st, mlp, rows),
                Ffn::Moe(moe) => {
                    let next = if *lookahead { next_routers(&w.layers, l) } else { [None; moe::AHEAD_DEPTH] };
                    let step = moe::MoeStep { layer: l, moe_index, pos0: pos0 + n - rows, routing: &mut *routing };
                    moe::moe_block(cfg, k, pool, st, moe, experts, step, rows, next)?;
                    moe_index += 1;
                }
            }
            add_rows(&mut st.x, &st.out, rows * h);
            record(&mut trace, l + 1, start, &st.x[..rows * h])?;
        }
        for t in 0..rows {
            kernels::rmsnorm(&mut st.h[t * h..(t + 1) * h], &st.x[t * h..(t + 1) * h], &w.norm, cfg.rms_eps);
        }
        record(&mut trace, cfg.layers + 1, start, &st.h[..rows * h])?;
        st.cache.pos += n;
        let vocab = cfg.vocab;
        match out {
            LogitsOut::Each(f) => {
                // A group of rows at a time; every row's dot products are the same whatever
                // the group, so the logits equal a one-token pass's bit for bit.
                let rows = st.logit_rows.max(1);
                let mut done = 0;
                while done < n {
                    let g = rows.min(n - done);
                    k.matmul(pool, w.head().view(), &st.h[done * h..(done + g) * h], g, &mut st.logits[..g * vocab]);
                    for r in 0..g {
                        f(start + done + r, &st.logits[r * vocab..(r + 1) * vocab])?;
                    }
                    done += g;
                    if last && done == n && g > 1 {
                        st.logits.copy_within((g - 1) * vocab..g * vocab, 0);
                    }
                }
            }
            LogitsOut::Last if last => {
                k.matmul(pool, w.head().view(), &st.h[(rows - 1) * h..rows * h], 1, &mut st.logits[..vocab]);
            }
            LogitsOut::Last => {}
        }
        Ok(())
    }
}

/// The first MoE layers after `l` and their routers (the look-ahead's targets), nearest first.
fn next_routers(layers: &[weights::Layer], l: usize) -> moe::NextRouters<'_> {
    let mut next = [None; moe::AHEAD_DEPTH];
    let moe_layers = layers.iter().enumerate().skip(l + 1).filter_map(|(i, layer)| match &layer.ffn {
        Ffn::Moe(m) => Some((i, &m.router)),
        Ffn::Dense(_) => None,
    });
    for (slot, found) in next.iter_mut().zip(moe_layers) {
        *slot = Some(found);
    }
    next
}

/// Hands the chunk's rows of slot `slot` to the hidden-state callback, if there is one.
fn record(trace: &mut Option<&mut HiddenFn>, slot: usize, start: usize, rows: &[f32]) -> Result<()> {
    match trace {
        Some(f) => f(slot, start, rows),
        None => Ok(()),
    }
}

fn add_rows(x: &mut [f32], y: &[f32], len: usize) {
    for (a, b) in x[..len].iter_mut().zip(&y[..len]) {
        *a += b;
    }
}

/// y = x·Wᵀ + b for the `n` rows of `x`.
fn linear(k: &Kernels, pool: &Pool, lin: &Linear, x: &[f32], n: usize, y: &mut [f32]) {
    k.matmul(pool, lin.w.view(), x, n, y);
    add_bias(lin, n, y);
}

/// Adds `lin`'s bias (if any) to each of the `n` rows of `y`.
fn add_bias(lin: &Linear, n: usize, y: &mut [f32]) {
    if let Some(b) = &lin.b {
        for row in y[..n * lin.w.rows].chunks_exact_mut(lin.w.rows) {
            add_rows(row, b, b.len());
        }
    }
}

/// The attention sublayer (spec §1.3, §2.4): projections, q/k norm, clipping, RoPE, the KV
/// cache write, attention, o_proj. Reads `st.h`, writes `st.out`.
///
/// Keys and values are written for all `n` rows; the output only for the last `kept`, into
/// rows `0..kept` of `st.out`.
#[allow(clippy::too_many_arguments)]
fn attention_block(cfg: &ModelConfig, k: &Kernels, pool: &Pool, st: &mut State, a: &weights::Attention, l: usize, n: usize,
                   kept: usize) {
    let (hd, qd, kvd) = (cfg.head_dim, cfg.q_dim(), cfg.kv_dim());
    k.matmul_group(pool, &st.h, n, &mut [(a.q.w.view(), &mut st.q[..]), (a.k.w.view(), &mut st.k[..]), (a.v.w.view(), &mut st.v[..])]);
    add_bias(&a.q, n, &mut st.q);
    add_bias(&a.k, n, &mut st.k);
    add_bias(&a.v, n, &mut st.v);
    let eps = cfg.rms_eps;
    match (cfg.qk_norm, &a.q_norm, &a.k_norm) {
        (QkNorm::PerHead, Some(qn), Some(kn)) => {
            norm_in_place(&mut st.q[..n * qd], hd, qn, eps, &mut st.norm_tmp);
            norm_in_place(&mut st.k[..n * kvd], hd, kn, eps, &mut st.norm_tmp);
        }
        (QkNorm::Whole, Some(qn), Some(kn)) => {
            norm_in_place(&mut st.q[..n * qd], qd, qn, eps, &mut st.norm_tmp);
            norm_in_place(&mut st.k[..n * kvd], kvd, kn, eps, &mut st.norm_tmp);
        }
        _ => {}
    }
    if let Some(c) = cfg.clip_qkv {
        for v in st.q[..n * qd].iter_mut().chain(st.k[..n * kvd].iter_mut()).chain(st.v[..n * kvd].iter_mut()) {
            *v = v.clamp(-c, c);
        }
    }
    let half = cfg.rope.dim / 2;
    for t in 0..n {
        let (cos, sin) = (&st.cos[t * half..(t + 1) * half], &st.sin[t * half..(t + 1) * half]);
        for head in st.q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
            rope::rotate_half(head, cos, sin);
        }
        for head in st.k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
            rope::rotate_half(head, cos, sin);
        }
    }
    let layer_len = st.ctx * kvd;
    // Qwen3-Next's linear layers keep no keys and values: `kv_slot` numbers the others.
    let (pos0, base) = (st.cache.pos, cfg.kv_slot(l) * layer_len);
    let kc = &mut st.cache.k.as_f32_mut()[base..base + layer_len];
    kc[pos0 * kvd..(pos0 + n) * kvd].copy_from_slice(&st.k[..n * kvd]);
    let vc = &mut st.cache.v.as_f32_mut()[base..base + layer_len];
    vc[pos0 * kvd..(pos0 + n) * kvd].copy_from_slice(&st.v[..n * kvd]);
    let shape = AttnShape {
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        window: cfg.sliding_window[l],
        sinks: a.sinks.as_deref(),
    };
    if kept == 0 {
        return;
    }
    let skip = n - kept;
    let keys = &st.cache.k.as_f32()[base..base + layer_len];
    let values = &st.cache.v.as_f32()[base..base + layer_len];
    attend(k, pool, shape, &st.q[skip * qd..], keys, values, pos0 + skip, kept, &mut st.scores, st.ctx, &mut st.att);
    if let Some(gate) = &a.gate {
        // Qwen3-Next: output × σ(gate), the gate's rows of q_proj applied to the same input
        // (st.q is spent once attention has read it).
        k.matmul(pool, gate.view(), &st.h[skip * cfg.hidden..], kept, &mut st.q);
        for (o, g) in st.att[..kept * qd].iter_mut().zip(&st.q[..kept * qd]) {
            *o *= 1.0 / (1.0 + (-g).exp());
        }
    }
    linear(k, pool, &a.o, &st.att, kept, &mut st.out);
}

/// RMS-normalises each `width`-long group of `x` in place with weight `w`, through `tmp`
/// (at least `width` long: the state's norm buffer).
fn norm_in_place(x: &mut [f32], width: usize, w: &[f32], eps: f32, tmp: &mut [f32]) {
    let tmp = &mut tmp[..width];
    for g in x.chunks_exact_mut(width) {
        kernels::rmsnorm(tmp, g, w, eps);
        g.copy_from_slice(tmp);
    }
}

/// The SwiGLU FFN (spec §0.4). Reads `st.h`, writes `st.out`.
fn mlp_block(k: &Kernels, pool: &Pool, st: &mut State, m: &weights::Mlp, n: usize) {
    let inter = m.gate.w.rows;
    k.matmul_group(pool, &st.h, n, &mut [(m.gate.w.view(), &mut st.gate[..]), (m.up.w.view(), &mut st.up[..])]);
    add_bias(&m.gate, n, &mut st.gate);
    add_bias(&m.up, n, &mut st.up);
    kernels::swiglu(&mut st.gate[..n * inter], &st.up[..n * inter]);
    linear(k, pool, &m.down, &st.gate, n, &mut st.out);
}

/// The identity of a model ([`session::identity`]): its config.json (a container's
/// as converted) and the index of the tensors it loads — the trunk's, and a container's expert
/// records by layer, encoding and shape.
fn model_identity(manifest: Option<&Manifest>, ckpt: &Checkpoint, config: &Json) -> [u8; 32] {
    let tensors: Vec<_> = ckpt.tensors().map(|(_, t)| t).collect();
    let banks = manifest.map_or(&[][..], |m| &m.banks[..]);
    let experts = banks.iter().flat_map(|b| b.layout.matrices.iter().enumerate().map(move |(i, x)| session::TensorLine {
        name: session::LineName::Matrix(b.layer, i),
        dtype: x.dtype.name(),
        shape: [b.experts as u64, x.rows as u64, x.cols as u64],
        bytes: (b.layout.record_bytes * b.experts) as u64,
    }));
    session::identity(config, &tensors, experts)
}

/// Parameters of a container's routed experts (their matrices' elements).
fn expert_params(m: &Manifest) -> u64 {
    m.banks.iter().map(|b| b.experts as u64 * b.layout.matrices.iter().map(|x| (x.rows * x.cols) as u64).sum::<u64>()).sum()
}

/// Checks a tokenizer against the model's `vocab_size`: no id may reach past the embedding
/// rows, and a llama2.c `tok*.bin` (which has no record count of its own: llama2.c reads
/// exactly `vocab_size` records) must hold exactly that many.
/// The model directory's tokenizer, and why there is none when its file is one the engine cannot
/// use or does not fit `vocab` ids (reported when text is needed, so `eval --ids` still works).
/// A container's manifest names the kind the converter found: it is checked against what the
/// files load as, whether or not the tokenizer fits.
fn open_tokenizer(path: &Path, manifest: Option<&Manifest>, vocab: usize, limits: &crate::format::json::Limits) -> Result<(Option<Tokenizer>, Option<Error>)> {
    let loaded = Tokenizer::from_model_dir_within(path, limits);
    if let Some(m) = manifest {
        m.check_tokenizer(loaded.as_ref().ok().map(Tokenizer::kind_name))?;
    }
    match loaded {
        // A tokenizer that does not fit the model is kept out, so it cannot produce or be
        // asked to decode ids the model lacks.
        Ok(t) => match tokenizer_fits(&t, vocab) {
            Ok(()) => Ok((Some(t), None)),
            Err(e) => Ok((None, Some(e))),
        },
        Err(e) if e.message().contains("no tokenizer file found") => Ok((None, None)),
        Err(e) if e.kind() == ErrorKind::Unsupported => Ok((None, Some(e))),
        Err(e) => Err(e),
    }
}

fn tokenizer_fits(t: &Tokenizer, vocab: usize) -> Result<()> {
    let n = t.vocab_size();
    let file = t.path().display();
    let llama2c = t.path().extension().is_some_and(|e| e == "bin");
    if llama2c && n != vocab {
        let what = if n < vocab { "the file is truncated or belongs to another model" } else { "trailing data after the records, or another model's file" };
        return Err(Error::new(ErrorKind::Tokenizer, format!(
            "{file}: holds {n} token records, but the model's vocab_size (config.json) is {vocab}: {what}")));
    }
    if n > vocab {
        return Err(Error::new(ErrorKind::Tokenizer, format!(
            "{file}: token ids go up to {}, past the model's vocab_size (config.json) of {vocab}", n - 1)));
    }
    Ok(())
}

/// Reads the learned hotlist (`path`, usually beside the container) and starts preloading it
/// into the cache; returns what to tell the user. A usage file is advice: a damaged or
/// foreign one is ignored, with the reason.
fn preload_hotlist(path: &Path, m: &Manifest, identity: &[u8; 32], cache: &mut ExpertCache) -> Option<String> {
    let experts = m.config.moe.as_ref()?.experts;
    match Usage::read(path, identity, m.banks.len(), experts) {
        Ok(None) => None,
        Ok(Some(u)) => {
            let n = cache.preload(&u.ranked(), m);
            Some(if n > 0 {
                format!("hotlist: preloading the {n} experts most used in {} tokens ({})", u.tokens, path.display())
            } else {
                format!("hotlist: {} not preloaded (no I/O threads to read it without delaying the first token)", path.display())
            })
        }
        Err(e) => Some(format!("hotlist ignored: {e}")),
    }
}

/// EOS ids from `generation_config.json`, when present.
fn generation_eos(dir: &Path, limits: &crate::format::json::Limits) -> Result<Vec<u32>> {
    let p = dir.join("generation_config.json");
    if !p.is_file() {
        return Ok(Vec::new());
    }
    let root = crate::format::read_json_within(&p, 1 << 20, limits)?;
    let bad = || Error::config(&p, "eos_token_id", "expected a token id or a list of token ids");
    match root.get("eos_token_id") {
        None | Some(crate::format::json::Json::Null) => Ok(Vec::new()),
        Some(v) => match v.as_array() {
            Some(a) => a.iter().map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad)).collect(),
            None => Ok(vec![v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad)?]),
        },
    }
}
