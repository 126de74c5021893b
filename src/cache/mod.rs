//! The expert cache: a byte-bounded set of slots holding routed-expert records read from a
//! container's banks, the I/O that fills them (`io`), the policy that decides what stays
//! ([`policy`]), and the trace replay that measures that policy ([`replay`]).
//!
//! When a layer's router has chosen its experts, every missing one is queued to the I/O
//! threads at once; computation starts on the experts already resident and continues with the
//! others as they land. Every record's header is checked on every read (and its CRC-32 with
//! `verify`), so nothing is computed from bytes that are not what the manifest says.

mod ahead;
pub mod disk;
pub(crate) mod io;
pub mod policy;
pub mod replay;
pub mod usage;

use crate::error::{Error, ErrorKind, Result};
use crate::format::container::{Manifest, RecordLayout};
use crate::sys::{Slot, SlotArena};
use ahead::AheadGuard;
use io::{BankFile, Completion, IoPool, ReadKind, Request};
use policy::{CacheIndex, Lookup, Policy};
use std::mem::size_of;
use std::sync::Arc;

/// How many MoE layers ahead the look-ahead guesses in a decode step: the next one's experts,
/// and the one after's, so the disk still has work queued when this layer's and the next
/// one's reads have landed before the next layer has routed (docs/BENCHMARKS.md, "guessing
/// two layers ahead"). The cache judges each depth apart (a guess two layers ahead is right
/// less often than one for the next layer, and is held back on its own record); deeper
/// guesses are not read.
pub(crate) const AHEAD_DEPTH: usize = 2;
use std::time::Duration;

/// One expert's record, resident while the callback that receives it runs.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// The expert's id within its layer.
    pub expert: u32,
    /// The record, `RecordLayout::record_bytes` long.
    pub bytes: &'a [u8],
}

/// Records handed over at most this many at a time (a fixed array: decode allocates nothing).
pub const RECORD_BATCH: usize = 16;

/// In decode, purgeable slots are offered to the kernel once their layer has been visited
/// this many times without using them, so a record the next token uses again (36–45 % of the
/// re-uses on the two routing traces) does not pay for taking its pages back; what is not
/// offered is the last token's records and the look-ahead's reads for the next layers, and
/// those too once a generation ends ([`ExpertCache::offer_all_idle`]). A prompt's records are
/// offered as soon as their layer is done. (Waiting two visits was within the noise for twice
/// the records unoffered; `docs/BENCHMARKS.md`.)
const OFFER_AFTER_VISITS: u32 = 1;

/// A callback receiving the bank's layout and a batch of records available together (at most
/// [`RECORD_BATCH`]): the hits resident when a layer starts, the reads that have landed by the
/// time the computation asks for more. Several at once let the MoE block give whole experts to
/// different threads.
pub type RecordFn<'a> = dyn FnMut(&RecordLayout, &[Record<'_>]) + 'a;

/// The routed experts of a container, as far as memory is concerned: everything the expert
/// cache's size follows from. [`ExpertCache`] sizes itself with these
/// functions and the memory plan ([`crate::MemoryPlan`]) counts with them, so the two cannot disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertShape {
    /// Experts each token uses per MoE layer.
    pub top_k: usize,
    /// Experts per MoE layer.
    pub experts: usize,
    /// Layers with routed experts (one bank each).
    pub moe_layers: usize,
    /// All layers of the model (the cache keeps a few words per layer).
    pub layers: usize,
    /// Bytes of the largest expert record (what one cache slot must hold).
    pub largest_record_bytes: u64,
    /// Expert records in all banks (a cache never needs more slots than this).
    pub records: u64,
    /// Reads go through I/O threads: each slot also has its place in their two queues
    /// ([`ExpertShape::QUEUE_BYTES`]). [`ExpertShape::of`] says no; see [`ExpertShape::with_io_threads`].
    pub queued: bool,
}

impl ExpertShape {
    /// The streamed experts of a container; `None` when it has none.
    pub fn of(m: &Manifest) -> Option<ExpertShape> {
        let moe = m.config.moe.as_ref().filter(|_| !m.banks.is_empty())?;
        Some(ExpertShape {
            top_k: moe.top_k,
            experts: moe.experts,
            moe_layers: m.banks.len(),
            layers: m.config.layers,
            largest_record_bytes: m.max_record_bytes() as u64,
            records: m.banks.iter().map(|b| b.experts as u64).sum(),
            queued: false,
        })
    }

    /// The same experts read by `io_threads` I/O threads (none: on the computing thread).
    pub fn with_io_threads(self, io_threads: usize) -> ExpertShape {
        ExpertShape { queued: io_threads > 0, ..self }
    }

    /// Bookkeeping per slot: its key, pin and stored value in the index, its look-ahead and purgeable
    /// flags and last use, its buffer handle, and one entry of the hotlist to preload (at most
    /// one per slot).
    pub const SLOT_BOOKKEEPING: u64 = (CacheIndex::PER_SLOT_BYTES + 2 * size_of::<bool>() + size_of::<u32>()
        + size_of::<Option<Slot>>() + size_of::<(usize, u32, f64)>()) as u64;

    /// A slot's place in the I/O threads' request and completion queues, when there are I/O
    /// threads: the queues hold every slot's read at once, so they never grow.
    pub const QUEUE_BYTES: u64 = io::QUEUE_BYTES_PER_READ as u64;

    /// What one slot costs: the largest record and its bookkeeping.
    pub fn slot_bytes(&self) -> u64 {
        let queue = if self.queued { Self::QUEUE_BYTES } else { 0 };
        self.largest_record_bytes.saturating_add(Self::SLOT_BOOKKEEPING + queue)
    }

    /// Bookkeeping whatever the number of slots: per expert of the model, its slot, policy
    /// priority and last visit; per layer, its bank, record layout and first key; per MoE
    /// layer, the policy's visit count and reuse statistics; per expert of a layer, one hit
    /// and one miss entry.
    pub fn fixed_bytes(&self) -> u64 {
        let per_layer = size_of::<Option<BankFile>>() + size_of::<Option<RecordLayout>>() + size_of::<usize>();
        let per_expert = 2 * size_of::<(u32, usize)>();
        (self.records as usize * CacheIndex::PER_KEY_BYTES + self.layers * per_layer + CacheIndex::per_layer_bytes(self.moe_layers, self.experts)
            + self.experts * per_expert) as u64
    }

    /// The fewest slots the cache runs with: two per expert a token uses (one layer's in use
    /// while the next layer's are read), or every record when there are fewer.
    pub fn min_slots(&self) -> u64 {
        (2 * self.top_k as u64).min(self.records)
    }

    /// Bytes of a cache of `slots` slots, bookkeeping included.
    pub fn cache_bytes(&self, slots: u64) -> u64 {
        self.fixed_bytes().saturating_add(slots.saturating_mul(self.slot_bytes()))
    }

    /// The most slots `bytes` pays for (bookkeeping included), never more than every record.
    pub fn slots_within(&self, bytes: u64) -> u64 {
        (bytes.saturating_sub(self.fixed_bytes()) / self.slot_bytes().max(1)).min(self.records)
    }
}


/// How the cache is sized and fed.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheOptions {
    /// Bytes of the cache: its slots and their bookkeeping ([`ExpertShape::cache_bytes`]).
    /// Must pay for at least [`ExpertShape::min_slots`] slots.
    pub bytes: u64,
    /// Reader threads; 0 reads on the computing thread.
    pub io_threads: usize,
    /// Check the CRC-32 of every record read (the header is always checked).
    pub verify: bool,
    /// Eviction policy; `None` takes [`Policy::default_for`] the model.
    pub policy: Option<Policy>,
    /// Read with `O_DIRECT` where the filesystem allows it; false reads every bank through
    /// the fallback (buffered, then `POSIX_FADV_DONTNEED`). (wp-container)
    pub direct_io: bool,
    /// Purgeable slots: an idle slot's pages may be taken back by the kernel under memory
    /// pressure (`MADV_FREE`) instead of the process being killed; a hit on a slot that lost a
    /// page reads the record again ([`CacheStats::purged`]).
    pub purgeable: bool,
    /// Slots backed by 2 MiB pages where the kernel grants them (`MADV_HUGEPAGE`; see
    /// [`crate::Options::huge_pages`]).
    pub huge_pages: bool,
}

/// What the cache has done so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheStats {
    /// Requests served from a slot without reading.
    pub hits: u64,
    /// Requests that read a record from disk.
    pub misses: u64,
    /// Bytes read from the banks.
    pub bytes_read: u64,
    /// Time the computing thread spent waiting for reads.
    pub io_wait: Duration,
    /// Time at least one read was under way (on the I/O threads; with none, the time the
    /// computing thread spent reading). The bytes read over it are the bandwidth the disk
    /// gave while it had work, and the run's time minus it is when the disk had none. As of
    /// the end of the last layer served.
    pub disk_busy: Duration,
    /// The reads' durations summed: over [`CacheStats::disk_busy`], the mean number of reads in
    /// flight while the disk had work.
    pub read_time: Duration,
    /// True when reads bypass the page cache (`O_DIRECT`); false when the fallback (buffered
    /// reads, then `POSIX_FADV_DONTNEED`) is in use.
    pub direct_io: bool,
    /// Number of slots.
    pub slots: usize,
    /// Expert banks, and how many of them read buffered (`O_DIRECT` refused at open or by a
    /// read, or not asked for). (wp-container)
    pub banks: usize,
    /// Banks reading through the buffered fallback (the filesystem refused `O_DIRECT`).
    pub buffered_banks: usize,
    /// Records read ahead of their layer (router look-ahead).
    pub prefetched: u64,
    /// Lookups served by a record read ahead.
    pub prefetch_hits: u64,
    /// Look-aheads not read because too few recent ones were used (`cache::ahead`).
    pub prefetch_held: u64,
    /// Look-ahead reads taken back before they started, a nearer guess or the layer's own
    /// routing having shown them wrong.
    pub prefetch_cancelled: u64,
    /// Records read into free slots from the learned hotlist ([`usage`]).
    pub preloaded: u64,
    /// Lookups that found their slot's pages taken back by the kernel (purgeable slots) and
    /// read the record again; counted as misses, not hits.
    pub purged: u64,
    /// Lookups that found their slot's pages offered to the kernel (purgeable slots) and took
    /// them back, whether or not the kernel had taken any: what purgeable slots cost.
    pub taken_back: u64,
    /// Slots whose pages are offered to the kernel now (purgeable slots): the ones it may take
    /// back under memory pressure.
    pub offered: usize,
}

impl CacheStats {
    /// How the banks are read: `O_DIRECT`, `buffered+fadvise`, or `mixed` (wp-container).
    pub fn io_mode(&self) -> &'static str {
        match self.buffered_banks {
            0 => io::io_mode_name(true),
            n if n == self.banks => io::io_mode_name(false),
            _ => "mixed",
        }
    }

    /// What the cache did since `earlier` (statistics of the same cache taken before): the
    /// counters and times as differences, the configuration (slots, banks, I/O mode) and the
    /// slots offered as now.
    pub fn since(&self, earlier: &CacheStats) -> CacheStats {
        CacheStats {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
            io_wait: self.io_wait.saturating_sub(earlier.io_wait),
            disk_busy: self.disk_busy.saturating_sub(earlier.disk_busy),
            read_time: self.read_time.saturating_sub(earlier.read_time),
            prefetched: self.prefetched.saturating_sub(earlier.prefetched),
            prefetch_hits: self.prefetch_hits.saturating_sub(earlier.prefetch_hits),
            prefetch_held: self.prefetch_held.saturating_sub(earlier.prefetch_held),
            prefetch_cancelled: self.prefetch_cancelled.saturating_sub(earlier.prefetch_cancelled),
            preloaded: self.preloaded.saturating_sub(earlier.preloaded),
            purged: self.purged.saturating_sub(earlier.purged),
            taken_back: self.taken_back.saturating_sub(earlier.taken_back),
            ..self.clone()
        }
    }

    /// Hits over lookups (0 when there were none).
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 { 0.0 } else { self.hits as f64 / n as f64 }
    }
}

/// Streams expert records from a container's banks into bounded slots.
pub struct ExpertCache {
    banks: Arc<Vec<Option<BankFile>>>,
    layouts: Vec<Option<RecordLayout>>,
    /// First key of each layer (keys number every expert of every MoE layer).
    key_base: Vec<usize>,
    index: CacheIndex,
    /// Slot buffers; `None` while a read owns it.
    bufs: Vec<Option<Slot>>,
    slot_bytes: usize,
    io: Option<IoPool>,
    /// Threads of `io` (0 without).
    io_threads: usize,
    verify: bool,
    stats: CacheStats,
    /// Reads under way (this layer's and look-ahead ones).
    loading: usize,
    /// Per slot: its record came from a look-ahead read this many layers ahead (1 = the next
    /// MoE layer), 0 if not: which guard its use counts for, and the statistics.
    prefetched: Vec<u8>,
    /// Per look-ahead depth: whether reading that far ahead has been paying off.
    ahead: [AheadGuard; AHEAD_DEPTH],
    /// Reused per call: this layer's hits and misses as (expert, slot).
    hits: Vec<(u32, usize)>,
    misses: Vec<(u32, usize)>,
    /// The hotlist still to preload, coldest first (popped from the end): (model layer,
    /// expert, share of tokens); and the accesses a token makes, to weigh them.
    hot: Vec<(usize, u32, f64)>,
    accesses_per_token: usize,
    /// Purgeable slots ([`CacheOptions::purgeable`]), and per slot: its pages are offered to
    /// the kernel (it holds a record and is idle), so they must be taken back before use.
    purgeable: bool,
    offered: Vec<bool>,
    /// Per slot: its layer's visit count ([`CacheIndex::layer_visits`]) when the slot was last
    /// used or filled; a purgeable slot is offered [`OFFER_AFTER_VISITS`] visits later.
    last_use: Vec<u32>,
    /// Experts per MoE layer (keys of one layer in the index), and the experts a token chooses
    /// in each.
    experts_per_layer: usize,
    top_k: usize,
}

/// The smallest cache for a model ([`ExpertShape::min_slots`] slots and the bookkeeping),
/// read by I/O threads as it is by default (without them, [`ExpertShape::QUEUE_BYTES`] per
/// slot fewer would do); 0 when nothing streams. The one rule, shared with the memory plan.
pub fn min_cache_bytes(manifest: &Manifest) -> u64 {
    ExpertShape::of(manifest).map_or(0, |e| e.with_io_threads(1).cache_bytes(e.min_slots()))
}

impl ExpertCache {
    /// Opens the banks of `manifest` with a cache of `opts.bytes`.
    pub fn open(manifest: &Manifest, opts: &CacheOptions) -> Result<ExpertCache> {
        let cfg = &manifest.config;
        let moe = cfg.moe.as_ref().ok_or_else(|| Error::new(ErrorKind::Tensor, "the model has no experts to cache"))?;
        let shape = ExpertShape::of(manifest).ok_or_else(|| Error::new(ErrorKind::Tensor, "the model has no expert banks"))?
            .with_io_threads(opts.io_threads);
        let slot_bytes = manifest.max_record_bytes();
        let slots = shape.slots_within(opts.bytes);
        if slots < shape.min_slots() {
            return Err(Error::new(ErrorKind::RamBudget, format!(
                "an expert cache of {} bytes is below the minimum of {} bytes ({} slots of {slot_bytes}-byte records, and the bookkeeping); see `waste plan`",
                opts.bytes, shape.cache_bytes(shape.min_slots()), shape.min_slots())));
        }
        let slots = slots as usize;
        let total_keys = manifest.banks.len() * moe.experts;
        let mut files = Vec::with_capacity(cfg.layers);
        let mut layouts = vec![None; cfg.layers];
        let mut key_base = vec![usize::MAX; cfg.layers];
        let mut buffered = 0;
        for (i, b) in manifest.banks.iter().enumerate() {
            while files.len() < b.layer {
                files.push(None);
            }
            let f = BankFile::open_with(manifest.bank_path(b), opts.direct_io)?;
            buffered += usize::from(!f.is_direct());
            files.push(Some(f));
            layouts[b.layer] = Some(b.layout);
            key_base[b.layer] = i * moe.experts;
        }
        let banks = Arc::new(files);
        // Exactly `slots` handles (the plan counts them; a collected Result would round up).
        let mut bufs = Vec::with_capacity(slots);
        bufs.extend(SlotArena::slots(slot_bytes, slots, opts.huge_pages)?.into_iter().map(Some));
        let io = if opts.io_threads > 0 { Some(IoPool::new(opts.io_threads, Arc::clone(&banks), slots)?) } else { None };
        let policy = opts.policy.unwrap_or_else(|| Policy::default_for(moe.top_k * manifest.banks.len()));
        Ok(ExpertCache {
            banks,
            layouts,
            key_base,
            index: CacheIndex::new(total_keys, slots, policy).with_layers(manifest.banks.len(), moe.experts),
            bufs,
            slot_bytes,
            io,
            io_threads: opts.io_threads,
            verify: opts.verify,
            stats: CacheStats { direct_io: buffered == 0, slots, banks: manifest.banks.len(), buffered_banks: buffered, ..CacheStats::default() },
            loading: 0,
            prefetched: vec![0; slots],
            ahead: Default::default(),
            // A layer wants at most every one of its experts at once.
            hits: Vec::with_capacity(moe.experts),
            misses: Vec::with_capacity(moe.experts),
            hot: Vec::with_capacity(slots),
            accesses_per_token: moe.top_k * manifest.banks.len(),
            experts_per_layer: moe.experts,
            top_k: moe.top_k,
            purgeable: opts.purgeable,
            offered: vec![false; slots],
            last_use: vec![0; slots],
        })
    }

    /// True when a lookup may still miss: some record is not resident yet, or may stop being
    /// (fewer slots than records, or purgeable slots the kernel may take back). False once a
    /// cache that holds every record has read them all: reading ahead cannot help any more.
    pub fn may_miss(&self) -> bool {
        let records = self.experts_per_layer * self.layouts.iter().flatten().count();
        self.purgeable || self.bufs.len() < records || self.index.occupied() < records
    }

    /// Bytes of the slots.
    pub fn slot_bytes(&self) -> u64 {
        (self.slot_bytes * self.bufs.len()) as u64
    }

    /// Bytes the cache holds, measured: its slots and every bookkeeping vector (by capacity).
    /// The plan predicts it with [`ExpertShape::cache_bytes`].
    pub fn memory_bytes(&self) -> u64 {
        use crate::sys::vec_bytes;
        self.slot_bytes() + vec_bytes(&self.banks) + vec_bytes(&self.layouts) + vec_bytes(&self.key_base)
            + self.index.heap_bytes() + vec_bytes(&self.bufs) + vec_bytes(&self.prefetched)
            + vec_bytes(&self.hits) + vec_bytes(&self.misses) + vec_bytes(&self.hot) + vec_bytes(&self.offered)
            + vec_bytes(&self.last_use)
            + self.io.as_ref().map_or(0, |io| io.heap_bytes() as u64)
    }

    /// Preloads the experts of a learned hotlist (MoE layer in bank order, expert, share of
    /// tokens; hottest first) into free slots, a few reads at a time behind each layer's own
    /// misses, so the first tokens never wait behind the whole list. Needs I/O threads (with
    /// none, nothing is preloaded: a read on the computing thread would delay the first
    /// token). Returns how many will be read at most.
    pub fn preload(&mut self, hot: &[(usize, u32, f64)], manifest: &Manifest) -> usize {
        if self.io.is_none() {
            return 0;
        }
        let experts = manifest.config.moe.as_ref().map_or(0, |m| m.experts);
        // Within the capacity the plan counts (one entry per slot).
        self.hot.clear();
        let room = self.hot.capacity().min(self.bufs.len());
        self.hot.extend(hot.iter().take(room)
            .filter_map(|&(i, e, share)| manifest.banks.get(i).filter(|_| (e as usize) < experts).map(|b| (b.layer, e, share))));
        self.hot.reverse();
        let n = self.hot.len();
        // The first reads start now, while the caller's first prompt is being tokenized.
        let _ = self.preload_some();
        n
    }

    /// Submits up to one read per I/O thread from the hotlist, each into a free slot.
    fn preload_some(&mut self) -> Result<()> {
        let Some(io) = &self.io else { return Ok(()) };
        for _ in 0..self.io_threads {
            let Some((layer, e, share)) = self.hot.pop() else { break };
            let (Some(layout), Some(&base)) = (self.layouts.get(layer).copied().flatten(), self.key_base.get(layer)) else { continue };
            if self.index.slot_of(base + e as usize).is_some() {
                continue;
            }
            let Some(s) = self.index.assign_free(base + e as usize) else {
                self.hot.clear(); // the workload has filled the cache: nothing left to warm
                break;
            };
            self.index.seed(base + e as usize, share, self.accesses_per_token);
            self.offered[s] = false;
            self.last_use[s] = self.index.layer_visits(base + e as usize);
            let buf = self.bufs[s].take().ok_or_else(|| slot_lost(layer, e))?;
            io.submit(Request::record(ReadKind::Preload, layer, e as usize, s, layout.record_bytes, buf));
            self.loading += 1;
            self.stats.preloaded += 1;
        }
        Ok(())
    }

    /// Bytes of its I/O threads, at [`crate::kernels::pool::THREAD_BYTES`] each.
    pub fn thread_bytes(&self) -> u64 {
        self.io_threads as u64 * crate::kernels::pool::THREAD_BYTES
    }

    /// Statistics so far.
    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    /// Calls `f` with every wanted expert of `layer` (`wanted`: sorted, distinct), once each,
    /// in batches as the records become available: the resident ones first, then the others
    /// as their reads complete (each batch all that have landed when the last one was
    /// computed). `lookahead` lists later layers, nearest first, each with the experts it will
    /// probably choose (sorted): those records are queued to be read behind this layer's
    /// misses, so the disk keeps working while this layer computes; they land in the cache
    /// whenever their reads complete (the next calls collect them). Guesses shown wrong before
    /// a reader started them — by `wanted` for this layer, by the nearest guess for the next
    /// one — are taken back ([`CacheStats::prefetch_cancelled`]).
    pub fn with_records(&mut self, layer: usize, wanted: &[u32], lookahead: &[(usize, &[u32])],
                        f: &mut RecordFn) -> Result<()> {
        let layout = self.layouts.get(layer).copied().flatten()
            .ok_or_else(|| Error::new(ErrorKind::Tensor, format!("layer {layer} has no expert bank")))?;
        let base = self.key_base[layer];
        let (mut hits, mut misses) = (std::mem::take(&mut self.hits), std::mem::take(&mut self.misses));
        hits.clear();
        misses.clear();
        // The policy learns from every visit (the replay does the same: `replay::replay_range`).
        self.index.visit(base / self.experts_per_layer.max(1), wanted);
        for &e in wanted {
            match self.index.access(base + e as usize) {
                Lookup::Hit(s) => hits.push((e, s)),
                Lookup::Miss => misses.push((e, usize::MAX)),
            }
        }
        if self.purgeable {
            self.take_back(layer, &mut hits, &mut misses);
        }
        self.stats.hits += hits.len() as u64;
        self.stats.misses += misses.len() as u64;
        // A read-ahead record counts once, at its first use.
        for &(_, s) in &hits {
            let depth = std::mem::take(&mut self.prefetched[s]) as usize;
            if let Some(guard) = depth.checked_sub(1).and_then(|d| self.ahead.get_mut(d)) {
                self.stats.prefetch_hits += 1;
                guard.note_used();
            }
        }
        // This layer's choice is known now: its look-ahead reads that guessed wrong and that
        // no reader has started are taken back.
        self.cancel_guesses(layer, wanted);
        let result = self.serve(layer, &layout, &hits, &mut misses, lookahead, f);
        // Every slot this call used is evictable again, except reads still under way.
        self.index.unpin_all();
        for s in 0..self.bufs.len() {
            if self.bufs[s].is_none() {
                self.index.pin(s);
            }
        }
        self.hits = hits;
        self.misses = misses;
        if self.purgeable {
            // A prompt's chunk wants more experts than a token: its records are offered at once,
            // so a squeeze during a long prompt finds all but one layer's to take.
            self.offer_idle(if wanted.len() <= self.top_k { OFFER_AFTER_VISITS } else { 0 });
        }
        // The disk's clock as of the end of this layer (reads that finished after the layer's
        // last wait included), so statistics taken between layers are current.
        if let Some(io) = &self.io {
            (self.stats.disk_busy, self.stats.read_time) = io.disk_time();
        }
        result
    }

    /// Takes this call's hits back from the kernel (purgeable slots): a slot whose pages were
    /// all kept is a hit; one that lost a page is forgotten and its expert becomes a miss,
    /// read again like any other.
    fn take_back(&mut self, layer: usize, hits: &mut Vec<(u32, usize)>, misses: &mut Vec<(u32, usize)>) {
        let layout_bytes = self.layouts.get(layer).copied().flatten().map_or(0, |l| l.record_bytes);
        let mut i = 0;
        while i < hits.len() {
            let (e, s) = hits[i];
            let kept = match (std::mem::take(&mut self.offered[s]), self.bufs[s].as_mut()) {
                (true, Some(buf)) => {
                    self.stats.taken_back += 1;
                    buf.keep_pages(layout_bytes)
                }
                _ => true,
            };
            if kept {
                i += 1;
                continue;
            }
            self.stats.purged += 1;
            self.prefetched[s] = 0;
            self.index.clear(s);
            hits.remove(i);
            // Misses stay in id order, as the engine asks for them.
            let at = misses.partition_point(|m| m.0 < e);
            misses.insert(at, (e, usize::MAX));
        }
    }

    /// Offers to the kernel the pages of every resident record (purgeable slots; nothing
    /// otherwise), the ones the last token used included: for when the engine stops (a
    /// generation ends) and the next use may be far away.
    pub fn offer_all_idle(&mut self) {
        if self.purgeable {
            self.offer_idle(0);
        }
    }

    /// Offers to the kernel the pages of every slot that holds a record and has been idle for
    /// `visits` visits of its layer, and counts the slots offered now.
    fn offer_idle(&mut self, visits: u32) {
        let mut offered = 0;
        for s in 0..self.bufs.len() {
            let Some(key) = self.index.key_of(s) else { continue };
            let idle = self.index.layer_visits(key).wrapping_sub(self.last_use[s]) >= visits;
            if !self.offered[s] && idle {
                if let Some(buf) = &self.bufs[s] {
                    // The whole slot: pages past a shorter record are never read before a read fills them.
                    self.offered[s] = buf.allow_purge(self.slot_bytes);
                }
            }
            offered += usize::from(self.offered[s]);
        }
        self.stats.offered = offered;
    }

    fn serve(&mut self, layer: usize, layout: &RecordLayout, hits: &[(u32, usize)], misses: &mut [(u32, usize)],
             lookahead: &[(usize, &[u32])], f: &mut RecordFn) -> Result<()> {
        let base = self.key_base[layer];
        if self.io.is_none() {
            return self.serve_inline(layer, layout, hits, misses, f);
        }
        let mut next = 0; // next miss to submit
        // Queue every miss a slot can take before computing anything, then the look-ahead.
        self.submit_misses(layer, layout, base, misses, &mut next)?;
        for (depth, &(l, experts)) in lookahead.iter().enumerate().take(AHEAD_DEPTH) {
            // The nearest guess supersedes the farther one made for its layer a layer earlier.
            if depth == 0 {
                self.cancel_guesses(l, experts);
            }
            self.prefetch(l, experts, depth)?;
        }
        if !self.hot.is_empty() {
            self.preload_some()?;
        }
        // Hits whose record is resident now; the others are look-ahead reads still under way.
        let mut remaining = misses.len();
        let mut ready = [(0u32, 0usize); RECORD_BATCH];
        let mut count = 0;
        for &(e, s) in hits {
            if self.bufs[s].is_none() {
                remaining += 1;
                continue;
            }
            ready[count] = (e, s);
            count += 1;
            if count == RECORD_BATCH {
                self.hand_over(layout, &ready[..count], f);
                count = 0;
            }
        }
        self.hand_over(layout, &ready[..count], f);
        // Slots the hits held may now take the misses that did not fit.
        self.submit_misses(layer, layout, base, misses, &mut next)?;
        let mut first_error = None;
        while remaining > 0 {
            if self.loading == 0 {
                // Nothing under way will free a slot: the misses left cannot be served.
                return Err(first_error.unwrap_or_else(|| slot_lost(layer, misses.get(next).map_or(0, |m| m.0))));
            }
            // Wait for one read, then take every other one that has landed meanwhile.
            let mut count = 0;
            let mut landed = Some(self.wait()?);
            while let Some(c) = landed {
                let (l, e, slot) = (c.layer, c.expert as u32, c.slot);
                let checked = self.land(c);
                let wanted_now = l == layer && (misses[..next].contains(&(e, slot)) || hits.contains(&(e, slot)));
                if !wanted_now {
                    // A look-ahead or preloaded record: now resident (or forgotten if it
                    // failed), and its slot free to take a miss that is waiting for one.
                    if checked.is_ok() {
                        self.index.unpin(slot);
                    }
                    self.submit_misses(layer, layout, base, misses, &mut next)?;
                } else {
                    remaining -= 1;
                    match checked {
                        Ok(()) if first_error.is_none() => {
                            ready[count] = (e, slot);
                            count += 1;
                        }
                        Ok(()) => self.index.unpin(slot),
                        // Keep draining so every buffer comes home, then report.
                        Err(err) => _ = first_error.get_or_insert(err),
                    }
                }
                landed = if count < RECORD_BATCH && remaining > 0 { self.io.as_ref().and_then(IoPool::try_wait) } else { None };
            }
            if count > 0 {
                self.hand_over(layout, &ready[..count], f);
                self.submit_misses(layer, layout, base, misses, &mut next)?;
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Calls `f` with the records of `ready` ((expert, slot) pairs, each slot resident and
    /// pinned), then makes their slots evictable again.
    fn hand_over(&mut self, layout: &RecordLayout, ready: &[(u32, usize)], f: &mut RecordFn) {
        if ready.is_empty() {
            return;
        }
        let empty: &[u8] = &[];
        let mut batch = [Record { expert: 0, bytes: empty }; RECORD_BATCH];
        let mut count = 0;
        for &(e, s) in ready {
            if let Some(buf) = &self.bufs[s] {
                batch[count] = Record { expert: e, bytes: &buf.as_slice()[..layout.record_bytes] };
                count += 1;
            }
        }
        f(layout, &batch[..count]);
        for &(_, s) in ready {
            self.index.unpin(s);
            if let Some(key) = self.index.key_of(s) {
                self.last_use[s] = self.index.layer_visits(key);
            }
        }
    }

    /// Takes back a finished read's buffer and checks the record: on success the slot holds
    /// the expert (still pinned); on failure the slot is forgotten, so nothing is computed from
    /// those bytes (a look-ahead that failed is simply read again, and reported, when wanted).
    fn land(&mut self, c: Completion) -> Result<()> {
        let Completion { kind, layer, expert, slot, buf, result } = c;
        self.bufs[slot] = Some(buf);
        self.loading -= 1;
        let layout = self.layouts.get(layer).copied().flatten();
        let checked = result.and_then(|()| match (layout, self.banks.get(layer).and_then(Option::as_ref), &self.bufs[slot]) {
            (Some(layout), Some(bank), Some(b)) => layout.check(b.as_slice(), &bank.path, layer, expert, self.verify),
            _ => Err(slot_lost(layer, expert as u32)),
        });
        self.note_io_mode(layer);
        match checked {
            Ok(()) => {
                self.stats.bytes_read += layout.map_or(0, |l| l.record_bytes) as u64;
                self.stats.prefetched += u64::from(kind == ReadKind::Ahead);
                Ok(())
            }
            Err(e) => {
                self.prefetched[slot] = 0;
                self.index.clear(slot);
                Err(e)
            }
        }
    }

    /// Reads on the computing thread (no I/O threads): hits, then each miss in turn. Slots are
    /// given to misses in the I/O path's order — as many as fit while the hits stay pinned,
    /// the rest as slots come free — so both paths count the same hits and misses, which a
    /// replay of the routing (`replay::replay_counts`) reproduces.
    fn serve_inline(&mut self, layer: usize, layout: &RecordLayout, hits: &[(u32, usize)], misses: &mut [(u32, usize)],
                    f: &mut RecordFn) -> Result<()> {
        let base = self.key_base[layer];
        let mut assigned = 0;
        while assigned < misses.len() {
            let Some((s, _)) = self.index.assign(base + misses[assigned].0 as usize) else { break };
            misses[assigned].1 = s;
            assigned += 1;
        }
        for group in hits.chunks(RECORD_BATCH) {
            if let Some(&(e, _)) = group.iter().find(|&&(_, s)| self.bufs[s].is_none()) {
                return Err(slot_lost(layer, e));
            }
            self.hand_over(layout, group, f);
        }
        for i in 0..misses.len() {
            let e = misses[i].0;
            if i >= assigned {
                misses[i].1 = self.index.assign(base + e as usize).ok_or_else(|| slot_lost(layer, e))?.0;
            }
            let s = misses[i].1;
            self.prefetched[s] = 0;
            self.offered[s] = false; // the read rewrites every page
            let bank = self.banks.get(layer).and_then(Option::as_ref).ok_or_else(|| slot_lost(layer, e))?;
            let buf = self.bufs[s].as_mut().ok_or_else(|| slot_lost(layer, e))?;
            let rec = &mut buf.as_mut_slice()[..layout.record_bytes];
            let t = std::time::Instant::now();
            let read = bank.read_record(rec, (e as usize * layout.record_bytes) as u64, layer, e as usize);
            let took = t.elapsed();
            self.stats.io_wait += took;
            self.stats.disk_busy += took;
            self.stats.read_time += took;
            let switched = self.stats.direct_io && !bank.is_direct();
            let checked = read.and_then(|()| layout.check(rec, &bank.path, layer, e as usize, self.verify));
            if switched {
                self.stats.buffered_banks = count_buffered(&self.banks);
                self.stats.direct_io = false;
            }
            if let Err(err) = checked {
                // This slot and the ones assigned ahead of their reads hold nothing.
                for &(_, t) in &misses[i..assigned.max(i + 1)] {
                    self.index.clear(t);
                }
                return Err(err);
            }
            self.stats.bytes_read += layout.record_bytes as u64;
            self.hand_over(layout, &[(e, s)], f);
        }
        Ok(())
    }

    /// Takes back the queued look-ahead reads of `layer` whose expert is not in `keep`
    /// (sorted) before any reader starts them: their slots are forgotten, their buffers come
    /// home, and the disk's time goes to reads that will be used.
    fn cancel_guesses(&mut self, layer: usize, keep: &[u32]) {
        let Some(io) = &self.io else { return };
        let wrong = |r: &Request| r.kind == ReadKind::Ahead && r.layer == layer && keep.binary_search(&(r.expert as u32)).is_err();
        while let Some(r) = io.take_queued(wrong) {
            let depth = std::mem::take(&mut self.prefetched[r.slot]) as usize;
            if let Some(guard) = depth.checked_sub(1).and_then(|d| self.ahead.get_mut(d)) {
                guard.note_cancelled();
            }
            self.bufs[r.slot] = Some(r.buf);
            self.loading -= 1;
            self.index.clear(r.slot);
            self.stats.prefetch_cancelled += 1;
        }
    }

    /// Queues reads of `experts` of `layer` (guessed `depth` + 1 MoE layers ahead) that are
    /// neither resident nor under way, into slots the policy gives up, as long as unpinned
    /// slots remain.
    fn prefetch(&mut self, layer: usize, experts: &[u32], depth: usize) -> Result<()> {
        let (Some(layout), Some(io)) = (self.layouts.get(layer).copied().flatten(), &self.io) else { return Ok(()) };
        let Some(guard) = self.ahead.get_mut(depth) else { return Ok(()) };
        if !guard.should_read() {
            self.stats.prefetch_held += 1;
            return Ok(());
        }
        let base = self.key_base[layer];
        let mut issued = 0;
        for &e in experts {
            if self.index.slot_of(base + e as usize).is_some() {
                continue;
            }
            let Some((s, _)) = self.index.assign(base + e as usize) else { break };
            self.offered[s] = false;
            let buf = self.bufs[s].take().ok_or_else(|| slot_lost(layer, e))?;
            io.submit(Request::record(ReadKind::Ahead, layer, e as usize, s, layout.record_bytes, buf));
            self.last_use[s] = self.index.layer_visits(base + e as usize);
            self.prefetched[s] = depth as u8 + 1;
            self.loading += 1;
            issued += 1;
        }
        self.ahead[depth].note_issued(issued);
        Ok(())
    }

    /// Submits misses from `next` on while slots can be had.
    fn submit_misses(&mut self, layer: usize, layout: &RecordLayout, base: usize, misses: &mut [(u32, usize)],
                     next: &mut usize) -> Result<()> {
        let Some(io) = &self.io else { return Ok(()) };
        while *next < misses.len() {
            let e = misses[*next].0;
            let Some((s, _)) = self.index.assign(base + e as usize) else { break };
            self.offered[s] = false;
            let buf = self.bufs[s].take().ok_or_else(|| slot_lost(layer, e))?;
            misses[*next].1 = s;
            io.submit(Request::record(ReadKind::Miss, layer, e as usize, s, layout.record_bytes, buf));
            self.prefetched[s] = 0;
            self.loading += 1;
            *next += 1;
        }
        Ok(())
    }

    /// Counts the buffered banks again after a read of `layer`'s bank, which may have found
    /// `O_DIRECT` refused and switched (one atomic load per record). (wp-container)
    fn note_io_mode(&mut self, layer: usize) {
        if self.banks.get(layer).and_then(Option::as_ref).is_some_and(BankFile::is_direct) {
            return;
        }
        self.stats.buffered_banks = count_buffered(&self.banks);
        self.stats.direct_io = self.stats.buffered_banks == 0;
    }

    fn wait(&mut self) -> Result<Completion> {
        let Some(io) = &self.io else { return Err(Error::new(ErrorKind::Io, "no I/O threads")) };
        let t = std::time::Instant::now();
        let c = io.wait();
        self.stats.io_wait += t.elapsed();
        c
    }
}

/// Banks reading buffered. (wp-container)
fn count_buffered(banks: &[Option<BankFile>]) -> usize {
    banks.iter().flatten().filter(|b| !b.is_direct()).count()
}

fn slot_lost(layer: usize, expert: u32) -> Error {
    Error::new(ErrorKind::Io, format!("layer {layer} expert {expert}: no cache slot available"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    /// Look-ahead reads still queued when their guess is shown wrong are taken back: their
    /// slots forgotten and free again, their buffers home, the guard told; a right guess and a
    /// miss stay queued. (The readers here never start: a pool of no threads.)
    #[test]
    fn wrong_guesses_still_queued_are_taken_back() {
        let dir = std::env::temp_dir().join(format!("waste-cancel-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = crate::format::json::parse(br#"{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
            "intermediate_size": 64, "moe_intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 64,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 64}"#).must();
        // Only the bank files are opened (nothing is read: the readers never start), so a
        // manifest of four banks of zeros, without a trunk, will do.
        std::fs::create_dir_all(&dir).must();
        let layout = RecordLayout::new(crate::format::dtype::DType::Q4B32, 64, 64).must();
        let banks: Vec<_> = (0..4).map(|layer| crate::format::container::Bank { layer, file: format!("b{layer}.bank"), experts: 8, layout }).collect();
        for b in &banks {
            std::fs::write(dir.join(&b.file), vec![0u8; 8 * layout.record_bytes]).must();
        }
        let manifest = Manifest::new(&dir, config, Vec::new(), banks).must();
        let opts = CacheOptions { bytes: 1 << 26, io_threads: 1, verify: false, policy: None, direct_io: false, purgeable: false, huge_pages: true };
        let mut cache = ExpertCache::open(&manifest, &opts).must();
        cache.io = Some(IoPool::new(0, Arc::clone(&cache.banks), cache.bufs.len()).must());
        let base = cache.key_base.clone();
        let key = |layer: usize, e: usize| base[layer] + e;
        let free_before = cache.bufs.iter().filter(|b| b.is_some()).count();

        // Guessed two layers ahead for layer 2; then the nearer guess says 3 and 6.
        cache.prefetch(2, &[1, 3, 5], 1).must();
        assert_eq!((cache.loading, cache.ahead[1].issued()), (3, 3));
        let layout = cache.layouts[1].must();
        let mut misses = [(0u32, usize::MAX)];
        cache.submit_misses(1, &layout, cache.key_base[1], &mut misses, &mut 0).must();
        cache.cancel_guesses(2, &[3, 6]);
        assert_eq!((cache.loading, cache.stats.prefetch_cancelled, cache.ahead[1].issued()), (2, 2, 1));
        assert!(cache.index.slot_of(key(2, 1)).is_none() && cache.index.slot_of(key(2, 5)).is_none());
        assert!(cache.index.slot_of(key(2, 3)).is_some(), "a right guess was taken back");
        assert_eq!(cache.bufs.iter().filter(|b| b.is_some()).count(), free_before - 2, "buffers of taken-back reads are home");
        // A miss is never taken back, even for a layer that does not want it.
        cache.cancel_guesses(1, &[]);
        assert_eq!((cache.loading, cache.stats.prefetch_cancelled), (2, 2));
        assert!(cache.index.slot_of(key(1, 0)).is_some());
        drop(cache);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
