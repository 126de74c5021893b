//! Which experts stay in the cache: the slot bookkeeping and the eviction policy, free of any
//! buffer or I/O so that the trace replay drives exactly the decisions the engine makes.
//!
//! Every policy but LRU keeps a decayed access frequency for every expert of the model,
//! resident or not, so an expert's history survives its eviction (unlike plain LRU, or a
//! counter reset on insert). Decode touches every MoE layer once per token, a cyclic pattern
//! longer than a small cache, which is exactly where LRU keeps nothing.
//!
//! The default, [`Policy::Reuse`], estimates for each expert the probability that its layer
//! chooses it at the layer's next visit, and keeps the experts that pay most per slot held:
//! that probability divided by the layers until the visit. The probability is learned while
//! the cache runs, per MoE layer, from what happened to experts in the same situation —
//! how many visits ago they were last chosen, how high their decayed frequency was, and how
//! often they came right after the experts the layer chose last (routing has topics) — so it
//! adapts to the model (some layers route far more predictably than others, and those get more
//! slots) with no constant fitted to a trace.

/// An eviction policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// Least recently used (the baseline the replay compares against).
    Lru,
    /// Decayed frequency with history across evictions; the half-life is in accesses.
    Frequency {
        /// Accesses after which a count has decayed to half.
        half_life: f64,
    },
    /// Evict the expert whose next use is expected farthest away: the layers until its layer
    /// comes round again, plus the tokens until it is chosen again, estimated from its decayed
    /// frequency (half-life in accesses).
    NextUse {
        /// Accesses after which a frequency has decayed to half.
        half_life: f64,
    },
    /// Keep the experts whose learned probability of being chosen at their layer's next
    /// visit, per layer until that visit, is highest (see the module notes); the frequency
    /// feature decays by half every `half_life` accesses.
    Reuse {
        /// Accesses after which the frequency feature has decayed to half.
        half_life: f64,
    },
}

/// Recency buckets of [`Policy::Reuse`]: chosen 0, 1, …, `RECENCY - 1` visits before the last
/// one, `RECENCY` or more, and never.
const RECENCY: usize = 6;
/// Frequency buckets of [`Policy::Reuse`]: decayed count below ½, then one per doubling.
const FREQUENCY: usize = 8;
/// Follow buckets of [`Policy::Reuse`]: the expert's follow score (see
/// [`CacheIndex::learn_follows`]) below each edge, or above the last.
const FOLLOW_EDGES: [f32; 6] = [0.05, 0.1, 0.2, 0.3, 0.45, 0.6];
const FOLLOW: usize = FOLLOW_EDGES.len() + 1;
/// The prior of a follow rate, (times followed + `FOLLOW_PRIOR_HITS`) / (times led +
/// `FOLLOW_PRIOR_VISITS`): an expert that never led yet predicts each of its layer's experts
/// at 0.2, in the middle buckets.
const FOLLOW_PRIOR_HITS: f32 = 0.1;
const FOLLOW_PRIOR_VISITS: f32 = 0.5;
/// The times an expert led (see [`CacheIndex::learn_follows`]) at which its follow counts are
/// halved: far below where f32 counts stop growing (2^24), far above a trace's length.
const FOLLOW_COUNT_CAP: f32 = (1 << 20) as f32;
/// The most follow counts kept (64 MiB): a Kimi-K2-sized model (60 MoE layers of 384 experts)
/// needs 8.8 M; a model with far more experts a layer does without the follow buckets rather
/// than hold its experts' squares.
const MAX_FOLLOW_ENTRIES: usize = 1 << 24;
/// Situations a layer's reuse statistics distinguish: by recency and frequency alone, and with
/// the follow bucket too.
const SITUATIONS: usize = (RECENCY + 2) * FREQUENCY;
const REUSE_BUCKETS: usize = SITUATIONS * FOLLOW;
/// The prior of a bucket with no history: as if `PRIOR_VISITS` visits had been seen with
/// reuse probability `PRIOR_P`, so an empty bucket neither wins nor loses everything.
const PRIOR_VISITS: f64 = 2.0;
const PRIOR_P: f64 = 0.3;

impl Policy {
    /// The half-life, in tokens, of the default policy's frequency feature (chosen on the
    /// first half of each routing trace; `docs/BENCHMARKS.md`).
    pub const DEFAULT_HALF_LIFE_TOKENS: f64 = 16.0;

    /// The engine's default: [`Policy::Reuse`] with its frequency feature decaying by half
    /// every [`Policy::DEFAULT_HALF_LIFE_TOKENS`] tokens' worth of accesses.
    pub fn default_for(accesses_per_token: usize) -> Policy {
        Policy::Reuse { half_life: accesses_per_token.max(1) as f64 * Self::DEFAULT_HALF_LIFE_TOKENS }
    }

    /// A policy by name (`reuse`, `next-use`, `frequency`, `lru`) with a half-life in tokens.
    pub fn named(name: &str, half_life_tokens: f64, accesses_per_token: usize) -> Option<Policy> {
        let half_life = half_life_tokens * accesses_per_token.max(1) as f64;
        Some(match name {
            "reuse" => Policy::Reuse { half_life },
            "next-use" => Policy::NextUse { half_life },
            "frequency" => Policy::Frequency { half_life },
            "lru" => Policy::Lru,
            _ => return None,
        })
    }
}

const NONE: u32 = u32::MAX;

/// Slot bookkeeping: which expert (key) each slot holds, which slot each key is in, pins,
/// and the policy's per-key state.
pub struct CacheIndex {
    policy: Policy,
    slot_key: Vec<u32>,
    key_slot: Vec<u32>,
    pinned: Vec<bool>,
    /// Per key: the policy's priority (LRU: last access time; frequency: log-domain score).
    priority: Vec<f64>,
    clock: u64,
    /// Keys per layer and layers, for the next-use estimate (keys are layer × per_layer + e).
    per_layer: usize,
    layers: usize,
    current_layer: usize,
    /// Per key: the visit of its layer (counted from 1) at which it was last chosen, 0 never.
    last_visit: Vec<u32>,
    /// Per layer: visits so far.
    visits: Vec<u32>,
    /// Per layer and bucket ([`REUSE_BUCKETS`]): (experts chosen, experts seen) at the visits
    /// so far, for [`Policy::Reuse`]'s probability estimate.
    reuse: Vec<[f64; 2]>,
    /// The same counts per layer and situation without the follow bucket (the coarser
    /// estimate [`CacheIndex::reuse_probability`] averages in).
    situations: Vec<[f64; 2]>,
    /// Per slot: the policy's value of what it holds, as of `value_at[slot]`. A layer's misses
    /// and look-ahead reads are assigned one after another with nothing in between that
    /// changes a value, so each assignment after the first compares stored values instead of
    /// computing every resident's again (a table look-up per slot, and then an `exp2` and a
    /// `log2` too: ~7 ms per token, 2.7 % of the CPU, decoding with 1,963 slots and ~75 reads
    /// a token; BENCHMARKS). Same values, same victims.
    values: Vec<f64>,
    value_at: Vec<u64>,
    /// [`Policy::Reuse`] only: per MoE layer, `per_layer` × `per_layer` counts: row i, column
    /// j, how often the layer chose expert j at the visit after one that chose expert i.
    follows: Vec<f32>,
    /// Per key: how many visits came after one that chose it (its row's denominator).
    led: Vec<f32>,
    /// Per layer: how many experts its last visit chose (a token's few, or a prompt chunk's
    /// many).
    last_chose: Vec<u32>,
    /// Per key: its follow score for its layer's next visit, from the layer's last choice.
    follow_score: Vec<f32>,
    /// Bumped by everything that changes a value (an access, a visit, a seeded priority); a
    /// slot's stored value is current while its `value_at` equals it (0: never).
    generation: u64,
}

/// The outcome of looking up one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The record is in this slot.
    Hit(usize),
    /// The record is not cached.
    Miss,
}

impl CacheIndex {
    /// An empty cache of `slots` slots over `keys` possible experts.
    pub fn new(keys: usize, slots: usize, policy: Policy) -> CacheIndex {
        CacheIndex {
            policy,
            slot_key: vec![NONE; slots],
            key_slot: vec![NONE; keys],
            pinned: vec![false; slots],
            priority: vec![f64::NEG_INFINITY; keys],
            clock: 0,
            per_layer: keys.max(1),
            layers: 1,
            current_layer: 0,
            last_visit: vec![0; keys],
            visits: vec![0; 1],
            reuse: vec![[0.0; 2]; REUSE_BUCKETS],
            situations: vec![[0.0; 2]; SITUATIONS],
            values: vec![0.0; slots],
            value_at: vec![0; slots],
            follows: Vec::new(),
            led: vec![0.0; keys],
            last_chose: vec![0; 1],
            follow_score: vec![0.0; keys],
            generation: 1,
        }
    }

    /// Declares the key structure: `layers` layers of `per_layer` experts, visited in order.
    pub fn with_layers(mut self, layers: usize, per_layer: usize) -> CacheIndex {
        self.layers = layers.max(1);
        self.per_layer = per_layer.max(1);
        self.visits = vec![0; self.layers];
        self.reuse = vec![[0.0; 2]; self.layers * REUSE_BUCKETS];
        self.situations = vec![[0.0; 2]; self.layers * SITUATIONS];
        self.last_chose = vec![0; self.layers];
        if matches!(self.policy, Policy::Reuse { .. }) {
            self.follows = vec![0.0; Self::follows_len(self.layers, self.per_layer)];
        }
        self
    }

    /// Heap bytes of the per-layer state of `layers` layers of `per_layer` experts: its visit
    /// count, reuse statistics and follow counts (what [`CacheIndex::heap_bytes`] holds besides
    /// the per-slot and per-key vectors; the memory plan counts it with this, saturating).
    pub const fn per_layer_bytes(layers: usize, per_layer: usize) -> usize {
        let stats = layers.saturating_mul(2 * std::mem::size_of::<u32>() + (REUSE_BUCKETS + SITUATIONS) * std::mem::size_of::<[f64; 2]>());
        stats.saturating_add(Self::follows_len(layers, per_layer).saturating_mul(std::mem::size_of::<f32>()))
    }

    /// Entries of the follow counts: `per_layer` × `per_layer` per layer, or none past
    /// [`MAX_FOLLOW_ENTRIES`] (the policy then does without the follow buckets).
    const fn follows_len(layers: usize, per_layer: usize) -> usize {
        let len = layers.saturating_mul(per_layer.saturating_mul(per_layer));
        if len > MAX_FOLLOW_ENTRIES { 0 } else { len }
    }

    /// Heap bytes per slot: its key, pin, and stored value with its generation.
    pub const PER_SLOT_BYTES: usize = std::mem::size_of::<u32>() + std::mem::size_of::<bool>() + std::mem::size_of::<f64>() + std::mem::size_of::<u64>();

    /// Heap bytes per key: its slot, priority, last visit, and follow denominator and score.
    pub const PER_KEY_BYTES: usize = std::mem::size_of::<u32>() + std::mem::size_of::<f64>() + std::mem::size_of::<u32>()
        + 2 * std::mem::size_of::<f32>();

    /// Starts a visit of `layer`, which chooses `chosen` (sorted, distinct expert ids of the
    /// layer): the reuse statistics learn what happened to every expert of the layer in its
    /// situation before this visit. Call before the visit's [`CacheIndex::access`]es.
    pub fn visit(&mut self, layer: usize, chosen: &[u32]) {
        let Some(visits) = self.visits.get(layer).copied() else { return };
        self.generation += 1;
        self.current_layer = layer;
        if matches!(self.policy, Policy::Reuse { .. }) {
            let mut next = chosen.iter().peekable();
            for e in 0..self.per_layer {
                let key = layer * self.per_layer + e;
                if key >= self.key_slot.len() {
                    break;
                }
                while next.next_if(|&&c| (c as usize) < e).is_some() {}
                let was_chosen = next.next_if(|&&c| c as usize == e).is_some();
                let b = self.bucket(key, visits);
                let cell = &mut self.reuse[layer * REUSE_BUCKETS + b];
                cell[0] += f64::from(u8::from(was_chosen));
                cell[1] += 1.0;
                let cell = &mut self.situations[layer * SITUATIONS + b / FOLLOW];
                cell[0] += f64::from(u8::from(was_chosen));
                cell[1] += 1.0;
            }
            self.learn_follows(layer, visits, chosen);
        }
        self.visits[layer] = visits.saturating_add(1);
    }

    /// Learns which experts follow which at `layer`'s visits: every expert chosen at the
    /// previous visit (the `visits`-th) counts the ones `chosen` now. Then each expert's follow
    /// score for the next visit: the mean, over the experts chosen now, of the rate at which
    /// it followed them. Routing has topics — experts that tend to come after one another at a
    /// layer, whether or not they were chosen lately — which recency and frequency do not see
    /// (BENCHMARKS, 2026-12-05 evening: the held-out hit rates at 3–12 % of the experts rose
    /// 0.3–1.9 points). Only from one token to the next: a prompt chunk's visit chooses the
    /// union of its tokens' experts (most of the layer), and counting every pair of it as
    /// following would tell every expert it follows every other for many tokens after.
    fn learn_follows(&mut self, layer: usize, visits: u32, chosen: &[u32]) {
        let n = self.per_layer;
        let base = layer * n;
        if self.follows.len() < (layer + 1).saturating_mul(n.saturating_mul(n)) || base + n > self.key_slot.len() {
            return;
        }
        // A token chooses a few experts (Mixtral: 2 of 8, the largest share of any family).
        let token_sized = |count: usize| 4 * count <= n;
        let previous = std::mem::replace(&mut self.last_chose[layer], chosen.len() as u32);
        if visits > 0 && token_sized(previous as usize) && token_sized(chosen.len()) {
            for i in 0..n {
                if self.last_visit[base + i] != visits {
                    continue;
                }
                let row = &mut self.follows[(base + i) * n..(base + i + 1) * n];
                if self.led[base + i] >= FOLLOW_COUNT_CAP {
                    // Halved, rates kept: f32 counts would stop growing at 2^24, and a long
                    // server session's topics drift.
                    self.led[base + i] *= 0.5;
                    row.iter_mut().for_each(|count| *count *= 0.5);
                }
                self.led[base + i] += 1.0;
                for &j in chosen {
                    if let Some(count) = row.get_mut(j as usize) {
                        *count += 1.0;
                    }
                }
            }
        }
        let leaders = chosen.iter().map(|&i| i as usize).filter(|&i| i < n);
        let weight = 1.0 / chosen.len().max(1) as f32;
        self.follow_score[base..base + n].iter_mut().for_each(|s| *s = 0.0);
        for i in leaders {
            let row = &self.follows[(base + i) * n..(base + i + 1) * n];
            let scale = weight / (self.led[base + i] + FOLLOW_PRIOR_VISITS);
            for (score, &count) in self.follow_score[base..base + n].iter_mut().zip(row) {
                *score += (count + FOLLOW_PRIOR_HITS) * scale;
            }
        }
    }

    /// The situation of `key`, whose layer has had `visits` visits: how many visits
    /// before the last it was chosen, and its decayed frequency.
    fn bucket(&self, key: usize, visits: u32) -> usize {
        let recency = match self.last_visit[key] {
            0 => RECENCY + 1,
            v => (visits.saturating_sub(v) as usize).min(RECENCY),
        };
        // 0 below a decayed count of ½, then 1 + ⌊log2(2·count)⌋ up to the last bucket —
        // taken from the count's logarithm, which the priority holds, so the value of every
        // resident (computed again at each layer's first miss) costs no `exp2` or `log2`.
        let log_count = self.log2_decayed_count(key);
        let frequency = if log_count >= -1.0 { ((log_count + 1.0) as usize + 1).min(FREQUENCY - 1) } else { 0 };
        let score = self.follow_score[key];
        let follow = FOLLOW_EDGES.iter().position(|&edge| score < edge).unwrap_or(FOLLOW - 1);
        (recency * FREQUENCY + frequency) * FOLLOW + follow
    }

    /// log2 of the decayed access count of `key` now (−∞: never accessed, or LRU, which keeps
    /// no count).
    fn log2_decayed_count(&self, key: usize) -> f64 {
        match self.policy {
            Policy::Frequency { half_life } | Policy::NextUse { half_life } | Policy::Reuse { half_life } => {
                self.priority[key] - self.clock as f64 / half_life
            }
            Policy::Lru => f64::NEG_INFINITY,
        }
    }

    /// [`Policy::Reuse`]'s estimate that `key` is chosen at its layer's next visit: the mean of
    /// two learned rates, in its situation by recency and frequency, and in that situation and
    /// its follow bucket. The finer one alone predicts the next visit better but is myopic: it
    /// devalues a popular expert the next token will probably skip, and caches large enough to
    /// keep it for the token after lost up to a point of hits (Kimi at 50 %); the mean lost
    /// nothing at any size measured (BENCHMARKS, 2026-12-05 evening).
    fn reuse_probability(&self, key: usize) -> f64 {
        let layer = key / self.per_layer;
        let visits = self.visits.get(layer).copied().unwrap_or(0);
        let b = self.bucket(key, visits);
        let [chosen, seen] = self.reuse.get(layer * REUSE_BUCKETS + b).copied().unwrap_or([0.0; 2]);
        let [coarse_chosen, coarse_seen] = self.situations.get(layer * SITUATIONS + b / FOLLOW).copied().unwrap_or([0.0; 2]);
        let estimate = |chosen: f64, seen: f64| (chosen + PRIOR_VISITS * PRIOR_P) / (seen + PRIOR_VISITS);
        0.5 * estimate(coarse_chosen, coarse_seen) + 0.5 * estimate(chosen, seen)
    }

    /// Slots the index manages.
    pub fn slots(&self) -> usize {
        self.slot_key.len()
    }

    /// Heap bytes held: per slot its key and pin, per key its slot and priority.
    pub fn heap_bytes(&self) -> u64 {
        use crate::sys::vec_bytes;
        vec_bytes(&self.slot_key) + vec_bytes(&self.key_slot) + vec_bytes(&self.pinned) + vec_bytes(&self.priority)
            + vec_bytes(&self.last_visit) + vec_bytes(&self.visits) + vec_bytes(&self.reuse) + vec_bytes(&self.situations)
            + vec_bytes(&self.values) + vec_bytes(&self.value_at) + vec_bytes(&self.follows) + vec_bytes(&self.led)
            + vec_bytes(&self.follow_score) + vec_bytes(&self.last_chose)
    }

    /// Records an access to `key` and returns where it is. A hit pins its slot.
    pub fn access(&mut self, key: usize) -> Lookup {
        self.generation += 1;
        self.clock += 1;
        let now = self.clock as f64;
        let layer = key / self.per_layer;
        self.current_layer = layer;
        if let Some(&v) = self.visits.get(layer) {
            // The visit under way (`visit` counted it), or a first one when no visit was declared.
            self.last_visit[key] = v.max(1);
        }
        self.priority[key] = match self.policy {
            Policy::Lru => now,
            Policy::Frequency { half_life } | Policy::NextUse { half_life } | Policy::Reuse { half_life } => {
                // priority = log2(score) + t/h, so comparing priorities compares the scores
                // decayed to any common time; an access adds 1 to the decayed score.
                let p = self.priority[key];
                let decayed = if p == f64::NEG_INFINITY { 0.0 } else { (p - now / half_life).exp2() };
                (decayed + 1.0).log2() + now / half_life
            }
        };
        match self.key_slot[key] {
            NONE => Lookup::Miss,
            s => {
                self.pinned[s as usize] = true;
                Lookup::Hit(s as usize)
            }
        }
    }

    /// How much the policy wants to keep `key` (higher keeps).
    fn keep_value(&self, key: usize) -> f64 {
        let layer = key / self.per_layer;
        let until_layer = ((layer + self.layers - self.current_layer - 1) % self.layers + 1) as f64;
        match self.policy {
            Policy::Lru | Policy::Frequency { .. } => self.priority[key],
            Policy::Reuse { .. } => self.reuse_probability(key) / until_layer,
            Policy::NextUse { half_life } => {
                let now = self.clock as f64;
                let count = (self.priority[key] - now / half_life).exp2();
                // Expected accesses per visit of its layer ≈ count / (window in visits).
                let window = (half_life / std::f64::consts::LN_2) / (self.layers as f64);
                let tokens_until = (window / count.max(1e-9) - 1.0).max(0.0);
                -(until_layer + tokens_until * self.layers as f64)
            }
        }
    }

    /// Slots holding an expert.
    pub fn occupied(&self) -> usize {
        self.slot_key.iter().filter(|&&k| k != NONE).count()
    }

    /// A free slot for `key`, pinned, without evicting anything (`None` when every slot holds
    /// an expert): for the hotlist, which must not push out what the workload brought in.
    pub fn assign_free(&mut self, key: usize) -> Option<usize> {
        let s = self.slot_key.iter().position(|&k| k == NONE)?;
        self.value_at[s] = 0;
        self.slot_key[s] = key as u32;
        self.key_slot[key] = s as u32;
        self.pinned[s] = true;
        Some(s)
    }

    /// Gives `key` the priority of an expert chosen by `share` of the tokens (the hotlist's
    /// estimate), as if its recent accesses had been seen, so the policy weighs a preloaded
    /// expert against the others instead of evicting it first. `accesses_per_token` converts
    /// the half-life, which counts accesses, into tokens.
    pub fn seed(&mut self, key: usize, share: f64, accesses_per_token: usize) {
        self.generation += 1;
        let now = self.clock as f64;
        self.priority[key] = match self.policy {
            Policy::Lru => now,
            Policy::Frequency { half_life } | Policy::NextUse { half_life } | Policy::Reuse { half_life } => {
                // The decayed count of a steady rate: share × the mean lifetime in tokens.
                let tokens = half_life / accesses_per_token.max(1) as f64 / std::f64::consts::LN_2;
                (share * tokens).max(1e-9).log2() + now / half_life
            }
        };
    }

    /// Chooses a slot for `key` (a miss): a free slot, else the unpinned resident the policy
    /// values least, which is evicted. The slot is pinned. `None` when every slot is pinned.
    pub fn assign(&mut self, key: usize) -> Option<(usize, Option<usize>)> {
        let mut best: Option<(usize, f64)> = None;
        for s in 0..self.slot_key.len() {
            if self.pinned[s] {
                continue;
            }
            let k = self.slot_key[s];
            if k == NONE {
                best = Some((s, f64::NEG_INFINITY));
                break;
            }
            if self.value_at[s] != self.generation {
                self.values[s] = self.keep_value(k as usize);
                self.value_at[s] = self.generation;
            }
            let v = self.values[s];
            if best.is_none_or(|(_, bv)| v < bv) {
                best = Some((s, v));
            }
        }
        let best = best.map(|(s, _)| s);
        let s = best?;
        let evicted = match self.slot_key[s] {
            NONE => None,
            k => {
                self.key_slot[k as usize] = NONE;
                Some(k as usize)
            }
        };
        self.value_at[s] = 0;
        self.slot_key[s] = key as u32;
        self.key_slot[key] = s as u32;
        self.pinned[s] = true;
        Some((s, evicted))
    }

    /// Forgets what `slot` holds (its read failed).
    pub fn clear(&mut self, slot: usize) {
        let k = self.slot_key[slot];
        if k != NONE {
            self.key_slot[k as usize] = NONE;
        }
        self.slot_key[slot] = NONE;
        self.value_at[slot] = 0;
        self.pinned[slot] = false;
    }

    /// The slot holding `key`, without counting an access.
    pub fn slot_of(&self, key: usize) -> Option<usize> {
        match self.key_slot[key] {
            NONE => None,
            s => Some(s as usize),
        }
    }

    /// Pins one slot (a read into it is under way).
    pub fn pin(&mut self, slot: usize) {
        self.pinned[slot] = true;
    }

    /// Unpins one slot.
    pub fn unpin(&mut self, slot: usize) {
        self.pinned[slot] = false;
    }

    /// Unpins every slot.
    pub fn unpin_all(&mut self) {
        self.pinned.iter_mut().for_each(|p| *p = false);
    }

    /// Visits so far of `key`'s layer.
    pub fn layer_visits(&self, key: usize) -> u32 {
        self.visits.get(key / self.per_layer).copied().unwrap_or(0)
    }

    /// The key a slot holds.
    pub fn key_of(&self, slot: usize) -> Option<usize> {
        match self.slot_key[slot] {
            NONE => None,
            k => Some(k as usize),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    /// Hits of `policy` with `slots` slots over `tokens`, each a list of the experts every
    /// layer chooses (sorted), as the engine visits them: hits pinned, then the misses assigned.
    fn run(policy: Policy, slots: usize, per_layer: usize, tokens: &[Vec<Vec<u32>>]) -> usize {
        let layers = tokens[0].len();
        let mut c = CacheIndex::new(layers * per_layer, slots, policy).with_layers(layers, per_layer);
        let mut hits = 0;
        for token in tokens {
            for (l, ids) in token.iter().enumerate() {
                c.visit(l, ids);
                let mut misses = Vec::new();
                for &e in ids {
                    match c.access(l * per_layer + e as usize) {
                        Lookup::Hit(_) => hits += 1,
                        Lookup::Miss => misses.push(l * per_layer + e as usize),
                    }
                }
                for k in misses {
                    c.assign(k).must_because("a slot");
                }
                c.unpin_all();
            }
        }
        hits
    }

    #[test]
    fn history_keeps_hot_keys_through_a_cycle_that_defeats_lru() {
        // Two layers of 8 experts; each token, each layer chooses its expert 0 and one of the
        // other seven in turn. With three slots LRU has evicted every expert by the time it
        // comes round again; the history-keeping policies keep the two hot ones.
        let tokens: Vec<Vec<Vec<u32>>> = (0..100u32).map(|t| vec![vec![0, 1 + t % 7], vec![0, 1 + (t + 3) % 7]]).collect();
        assert_eq!(run(Policy::Lru, 3, 8, &tokens), 0);
        for policy in [Policy::Frequency { half_life: 50.0 }, Policy::NextUse { half_life: 50.0 }, Policy::Reuse { half_life: 50.0 }] {
            let hits = run(policy, 3, 8, &tokens);
            assert!(hits >= 2 * 95, "{policy:?}: {hits} hits, the hot experts should hit almost every token");
        }
    }

    /// The reuse statistics are per layer: a layer that chooses the same experts every time
    /// learns a high probability for them, a layer that spreads its choices a low one, and the
    /// cache gives its slots to the predictable layer.
    #[test]
    fn reuse_learns_which_layer_is_predictable() {
        let (layers, per_layer) = (2, 16);
        let mut c = CacheIndex::new(layers * per_layer, 6, Policy::Reuse { half_life: 64.0 }).with_layers(layers, per_layer);
        let mut hits = [0usize; 2];
        for t in 0..200u32 {
            // Layer 0 always picks 3 and 7; layer 1 picks two of its 16 in turn (each again
            // after 8 tokens).
            let chosen = [[3, 7], [(2 * t) % 16, (2 * t + 1) % 16]];
            for (l, ids) in chosen.iter().enumerate() {
                c.visit(l, ids);
                let mut misses = Vec::new();
                for &e in ids {
                    match c.access(l * per_layer + e as usize) {
                        Lookup::Hit(_) => hits[l] += 1,
                        Lookup::Miss => misses.push(l * per_layer + e as usize),
                    }
                }
                for k in misses {
                    c.assign(k).must_because("a slot");
                }
                c.unpin_all();
            }
        }
        assert!(c.reuse_probability(3) > 0.9 && c.reuse_probability(per_layer + 5) < 0.2,
            "layer 0's expert 3: {}, layer 1's expert 5: {}", c.reuse_probability(3), c.reuse_probability(per_layer + 5));
        assert!(hits[0] >= 2 * 195, "the predictable layer hit {} times in 400", hits[0]);
    }

    /// Routing with topics: a layer of 16 experts in 8 pairs, each visit choosing one pair,
    /// the next pair one of two successors of the last (a fixed, scrambled graph). Recency
    /// cannot tell the successors from the other pairs (every pair comes round at random), the
    /// follow counts can: after the walk, the successors of the last pair are valued far above
    /// the rest.
    #[test]
    fn reuse_learns_which_experts_follow_which() {
        let per_layer = 16;
        let mut c = CacheIndex::new(per_layer, 4, Policy::Reuse { half_life: 64.0 }).with_layers(1, per_layer);
        let successors = |pair: u32| [(3 * pair + 1) % 8, (5 * pair + 6) % 8];
        let (mut pair, mut x) = (0u32, 99u64);
        for _ in 0..600 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            pair = successors(pair)[(x >> 63) as usize];
            let ids = [2 * pair, 2 * pair + 1];
            c.visit(0, &ids);
            for &e in &ids {
                if c.access(e as usize) == Lookup::Miss {
                    c.assign(e as usize);
                }
            }
            c.unpin_all();
        }
        let next = successors(pair);
        let (mut follow, mut other) = (1.0f64, 0.0f64);
        for e in 0..per_layer as u32 {
            let p = c.reuse_probability(e as usize);
            if next.contains(&(e / 2)) {
                follow = follow.min(p);
            } else {
                other = other.max(p);
            }
        }
        // Each successor comes with probability ½; the rate without the follow buckets (which
        // the estimate averages in) only knows 2 pairs in 8 come next.
        assert!(follow > 0.3 && other < follow / 3.0, "after pair {pair}: successors at least {follow}, the others at most {other}");
    }

    /// A prompt chunk's visit (the union of its tokens' choices, most of the layer) teaches the
    /// follow counts nothing, neither as the visit that follows nor as the one followed.
    #[test]
    fn prompt_chunks_do_not_count_as_following() {
        let per_layer = 16;
        let mut c = CacheIndex::new(per_layer, 8, Policy::Reuse { half_life: 64.0 }).with_layers(1, per_layer);
        let chunk: Vec<u32> = (0..12).collect();
        for ids in [&[1u32, 2][..], &chunk, &[3, 4], &chunk, &chunk] {
            c.visit(0, ids);
            for &e in ids {
                c.access(e as usize);
            }
        }
        assert!(c.follows.iter().all(|&n| n == 0.0) && c.led.iter().all(|&n| n == 0.0), "{:?}", &c.led);
        // Two tokens in a row do count.
        c.visit(0, &[5, 6]);
        c.access(5);
        c.access(6);
        c.visit(0, &[7, 8]);
        assert_eq!((c.led[5], c.follows[5 * per_layer + 8]), (1.0, 1.0));
        assert_eq!(c.follows.iter().sum::<f32>(), 4.0);
    }

    /// An expert that led [`FOLLOW_COUNT_CAP`] times has its counts halved before the next
    /// one is added: its rates stay (to the added count), and the counts never reach where f32
    /// stops counting.
    #[test]
    fn the_follow_counts_halve_at_their_cap() {
        let per_layer = 16;
        let mut c = CacheIndex::new(per_layer, 8, Policy::Reuse { half_life: 64.0 }).with_layers(1, per_layer);
        c.visit(0, &[1, 2]);
        c.access(1);
        c.access(2);
        c.led[1] = FOLLOW_COUNT_CAP;
        c.follows[per_layer + 3] = FOLLOW_COUNT_CAP / 2.0;
        c.follows[per_layer + 5] = 7.0;
        c.visit(0, &[3, 4]);
        assert_eq!((c.led[1], c.follows[per_layer + 3], c.follows[per_layer + 5]), (FOLLOW_COUNT_CAP / 2.0 + 1.0, FOLLOW_COUNT_CAP / 4.0 + 1.0, 3.5));
        // Expert 2 was below the cap: counted as before.
        assert_eq!((c.led[2], c.follows[2 * per_layer + 3]), (1.0, 1.0));
    }

    /// A model with more experts a layer than the follow counts can square (65,536, the most a
    /// config may declare) runs without them, within its memory plan.
    #[test]
    fn the_follow_counts_are_bounded() {
        let (layers, per_layer) = (3, 1 << 16);
        assert!(CacheIndex::per_layer_bytes(layers, per_layer) < 1 << 20);
        let mut c = CacheIndex::new(layers * per_layer, 8, Policy::Reuse { half_life: 64.0 }).with_layers(layers, per_layer);
        assert!(c.heap_bytes() < (layers * per_layer * 64) as u64, "{} bytes", c.heap_bytes());
        for t in 0..4u32 {
            c.visit(1, &[t, 70_000 % per_layer as u32]);
            if c.access(per_layer + t as usize) == Lookup::Miss {
                c.assign(per_layer + t as usize).must_because("a slot");
            }
            c.unpin_all();
        }
        assert!(c.occupied() == 4 && c.reuse_probability(per_layer + 3) > 0.0);
        // Kimi K2's shape keeps them.
        assert_eq!(CacheIndex::per_layer_bytes(60, 384) - CacheIndex::per_layer_bytes(60, 0), 60 * 384 * 384 * 4);
    }

    /// The unpinned slot a fresh computation of every value would evict (a free slot first).
    fn fresh_victim(c: &CacheIndex) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for s in 0..c.slots() {
            match (c.pinned[s], c.key_of(s)) {
                (true, _) => {}
                (false, None) => return Some(s),
                (false, Some(k)) => {
                    let v = c.keep_value(k);
                    if best.is_none_or(|(_, bv)| v < bv) {
                        best = Some((s, v));
                    }
                }
            }
        }
        best.map(|(s, _)| s)
    }

    /// The stored values give the victims a fresh computation gives, through visits, several
    /// assignments in a row (a layer's misses and look-ahead), seeded priorities, cleared
    /// slots and pins, for every policy.
    #[test]
    fn stored_values_choose_the_victims_fresh_ones_would() {
        let (layers, per_layer) = (4, 16);
        for policy in [Policy::Lru, Policy::Frequency { half_life: 20.0 }, Policy::NextUse { half_life: 20.0 }, Policy::Reuse { half_life: 20.0 }] {
            let mut c = CacheIndex::new(layers * per_layer, 12, policy).with_layers(layers, per_layer);
            let mut x = 12345u64;
            let mut rand = |n: u64| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 33) % n
            };
            let mut assigned = 0;
            for t in 0..300 {
                for l in 0..layers {
                    let mut chosen: Vec<u32> = (0..3).map(|_| rand(per_layer as u64) as u32).collect();
                    chosen.sort_unstable();
                    chosen.dedup();
                    // Accesses without a declared visit are allowed too (and then nothing but
                    // the accesses themselves changes the values before the assignments).
                    if t % 3 != 0 {
                        c.visit(l, &chosen);
                    }
                    let mut misses = Vec::new();
                    for &e in &chosen {
                        if c.access(l * per_layer + e as usize) == Lookup::Miss {
                            misses.push(l * per_layer + e as usize);
                        }
                        // An assignment between accesses (the stored values must not outlive
                        // the access after it).
                        if t % 5 == 0 && c.slot_of(l * per_layer + e as usize).is_none() {
                            let k = l * per_layer + e as usize;
                            let want = fresh_victim(&c);
                            assert_eq!(c.assign(k).map(|(s, _)| s), want, "{policy:?} token {t}");
                            misses.retain(|&m| m != k);
                        }
                    }
                    // A resident's priority seeded before the assignments.
                    if t % 4 == 0 {
                        if let Some(k) = c.key_of(rand(12) as usize) {
                            c.seed(k, 0.9, 12);
                        }
                    }
                    // A look-ahead read of the next layer's expert after the misses.
                    let ahead = ((l + 1) % layers) * per_layer + rand(per_layer as u64) as usize;
                    if c.slot_of(ahead).is_none() {
                        misses.push(ahead);
                    }
                    for k in misses {
                        let want = fresh_victim(&c);
                        assert_eq!(c.assign(k).map(|(s, _)| s), want, "{policy:?} token {t} layer {l}");
                        assigned += 1;
                    }
                    if t % 7 == 0 {
                        c.seed(rand((layers * per_layer) as u64) as usize, 0.5, 12);
                    }
                    if t % 11 == 0 {
                        c.clear(rand(12) as usize);
                    }
                    c.unpin_all();
                    c.pin(rand(12) as usize);
                }
            }
            assert!(assigned > 500, "{policy:?}: only {assigned} assignments");
        }
    }

    #[test]
    fn pinned_slots_are_never_evicted() {
        let mut c = CacheIndex::new(8, 2, Policy::Lru);
        assert_eq!(c.access(1), Lookup::Miss);
        assert_eq!(c.assign(1).map(|x| x.1), Some(None));
        assert_eq!(c.access(2), Lookup::Miss);
        c.assign(2).must();
        assert_eq!(c.access(3), Lookup::Miss);
        assert!(c.assign(3).is_none(), "both slots pinned");
        c.unpin_all();
        let (_, evicted) = c.assign(3).must();
        assert_eq!(evicted, Some(1));
    }
}
