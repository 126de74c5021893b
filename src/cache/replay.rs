//! Trace replay: drive the cache's own bookkeeping ([`CacheIndex`]) with recorded routing
//! decisions and count hits, next to LRU and to Belady's optimal offline policy, which evicts
//! the expert whose next use is farthest away.
//!
//! A trace is JSON lines `{"tok": N, "layers": [[expert ids of the top-k] per MoE layer]}`, one
//! per decoded token. Each layer's experts are looked up together, as the engine does, and
//! like the engine (`model::moe`, which sorts and dedups the router's choices before asking
//! the cache) a layer's list counts each expert once: an id given twice in one layer is one
//! access, never two slots for one key.

use super::policy::{CacheIndex, Lookup, Policy};
use crate::error::{Error, ErrorKind, Result};
use crate::format::json;
use std::path::Path;

/// A routing trace: tokens × MoE layers × chosen expert ids.
pub struct Trace {
    /// Per token, per MoE layer, the experts routed to.
    pub tokens: Vec<Vec<Vec<u32>>>,
    /// MoE layers in the trace.
    pub layers: usize,
    /// Experts per layer (one more than the largest id seen, unless given).
    pub experts: usize,
}

impl Trace {
    /// The most experts (layers × experts per layer) a trace may name: far more than any
    /// model has (Kimi K2: 23,040), few enough that the replay's per-expert state stays in tens
    /// of megabytes whatever a short file names.
    pub const MAX_KEYS: usize = 1 << 20;

    /// Reads a JSON-lines trace.
    pub fn load(path: &Path) -> Result<Trace> {
        let bytes = crate::format::read_bounded(path, 1 << 30)?;
        let text = std::str::from_utf8(&bytes).map_err(|e| Error::format(path, format!("not UTF-8 at byte {}", e.valid_up_to())))?;
        let mut tokens = Vec::new();
        let mut max_id = 0u32;
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let bad = |m: String| Error::new(ErrorKind::Format, format!("{}: line {}: {m}", path.display(), i + 1));
            let v = json::parse(line.as_bytes()).map_err(|e| bad(e.to_string()))?;
            let layers = v.get("layers").and_then(json::Json::as_array).ok_or_else(|| bad("field `layers` missing".into()))?;
            let mut tok = Vec::with_capacity(layers.len());
            for l in layers {
                let ids = l.as_array().ok_or_else(|| bad("a layer is not a list".into()))?
                    .iter().map(|x| x.as_u64().filter(|&n| n < 1 << 20).map(|n| n as u32))
                    .collect::<Option<Vec<u32>>>().ok_or_else(|| bad("an expert id is not a small integer".into()))?;
                max_id = ids.iter().copied().fold(max_id, u32::max);
                let mut ids = ids;
                ids.sort_unstable();
                ids.dedup();
                tok.push(ids);
            }
            if tokens.first().is_some_and(|t: &Vec<Vec<u32>>| t.len() != tok.len()) {
                return Err(bad(format!("{} layers, the first token has {}", tok.len(), tokens[0].len())));
            }
            tokens.push(tok);
        }
        let layers = tokens.first().map_or(0, Vec::len);
        if layers == 0 {
            return Err(Error::format(path, "the trace has no tokens"));
        }
        let experts = max_id as usize + 1;
        // The replay keeps state per expert of every layer: refused before allocating for it.
        if layers.saturating_mul(experts) > Self::MAX_KEYS {
            return Err(Error::format(path, format!("{layers} layers of {experts} experts: more than {} experts in all", Self::MAX_KEYS)));
        }
        Ok(Trace { tokens, layers, experts })
    }

    /// Total expert accesses (distinct experts per layer and token).
    pub fn accesses(&self) -> usize {
        let mut buf = Vec::new();
        self.tokens.iter().flatten().map(|ids| distinct(ids, &mut buf).len()).sum()
    }

    /// Number of distinct experts in the model.
    pub fn keys(&self) -> usize {
        self.layers * self.experts
    }

    fn key(&self, layer: usize, e: u32) -> usize {
        layer * self.experts + e as usize
    }
}

/// One layer's ids as the engine asks for them: sorted, each once. (`load` already does this;
/// a trace built in code may not have.)
fn distinct<'a>(ids: &[u32], buf: &'a mut Vec<u32>) -> &'a [u32] {
    buf.clear();
    buf.extend_from_slice(ids);
    buf.sort_unstable();
    buf.dedup();
    buf
}

/// Hit rate of `policy` with `slots` slots, each layer's experts looked up together and the
/// misses then given slots, as [`super::ExpertCache`] does.
pub fn replay(trace: &Trace, slots: usize, policy: Policy) -> f64 {
    let (hits, misses) = replay_counts(trace, slots, policy);
    hits as f64 / (hits + misses).max(1) as f64
}

/// Hits and misses of `policy` with `slots` slots over the trace: the counts an engine whose
/// cache has `slots` slots reports when it routes as the trace says (one token at a time,
/// no look-ahead).
pub fn replay_counts(trace: &Trace, slots: usize, policy: Policy) -> (u64, u64) {
    replay_range(trace, slots, policy, 0..trace.tokens.len())
}

/// Hits and misses of `policy` with `slots` slots counted over the tokens of `counted` only:
/// the cache runs from the first token (so the counted tokens start with the cache, and the
/// policy's statistics, as the earlier ones left them) and stops at the range's end. This is
/// how a policy tuned on one part of a trace is judged on another.
pub fn replay_range(trace: &Trace, slots: usize, policy: Policy, counted: std::ops::Range<usize>) -> (u64, u64) {
    let mut c = CacheIndex::new(trace.keys(), slots, policy).with_layers(trace.layers, trace.experts);
    let (mut hits, mut accesses) = (0u64, 0u64);
    let mut misses = Vec::new();
    let mut buf = Vec::new();
    for (t, tok) in trace.tokens.iter().enumerate().take(counted.end) {
        let counts = counted.contains(&t);
        for (l, ids) in tok.iter().enumerate() {
            let ids = distinct(ids, &mut buf);
            misses.clear();
            c.visit(l, ids);
            for &e in ids {
                match c.access(trace.key(l, e)) {
                    Lookup::Hit(_) => hits += u64::from(counts),
                    Lookup::Miss => misses.push(trace.key(l, e)),
                }
            }
            accesses += if counts { ids.len() as u64 } else { 0 };
            // The engine's order (`ExpertCache::with_records`): slots for the misses that fit
            // while the hits are pinned; the hits, then those misses, are computed and let go;
            // each remaining miss then takes a slot in turn.
            let mut fit = 0;
            while fit < misses.len() && c.assign(misses[fit]).is_some() {
                fit += 1;
            }
            c.unpin_all();
            for &k in &misses[fit..] {
                c.assign(k);
                c.unpin_all();
            }
        }
    }
    (hits, accesses - hits)
}

/// Hit rate of Belady's offline optimum with `slots` slots: on a miss with a full cache, evict
/// the resident expert (not needed by the current layer) whose next use is farthest away.
pub fn belady(trace: &Trace, slots: usize) -> f64 {
    belady_range(trace, slots, 0..trace.tokens.len())
}

/// Belady's hit rate over the tokens of `counted`, the cache running from the first token and
/// the future it knows ending with the range (as [`replay_range`]).
pub fn belady_range(trace: &Trace, slots: usize, counted: std::ops::Range<usize>) -> f64 {
    // The access sequence in order, and for each access the position of the key's next use.
    let per_token = |tok: &Vec<Vec<u32>>| -> Vec<Vec<usize>> {
        tok.iter().enumerate().map(|(l, ids)| distinct(ids, &mut Vec::new()).iter().map(|&e| trace.key(l, e)).collect()).collect()
    };
    let groups: Vec<Vec<usize>> = trace.tokens.iter().take(counted.end).flat_map(per_token).collect();
    // The first access each token's groups start at, to tell counted accesses from the others.
    let first_counted: usize = trace.tokens.iter().take(counted.start.min(counted.end)).flat_map(per_token).map(|g| g.len()).sum();
    let seq: Vec<usize> = groups.iter().flatten().copied().collect();
    let mut next_use = vec![usize::MAX; seq.len()];
    let mut last = vec![usize::MAX; trace.keys()];
    for i in (0..seq.len()).rev() {
        next_use[i] = last[seq[i]];
        last[seq[i]] = i;
    }
    let mut slot_of = vec![usize::MAX; trace.keys()];
    let mut resident: Vec<(usize, usize)> = Vec::with_capacity(slots); // (key, next use)
    let mut hits = 0;
    let mut i = 0;
    for ids in &groups {
        let group = i..i + ids.len();
        // Hits first: the group's resident keys get their next use updated.
        for j in group.clone() {
            if slot_of[seq[j]] != usize::MAX {
                hits += usize::from(j >= first_counted);
                resident[slot_of[seq[j]]].1 = next_use[j];
            }
        }
        for j in group.clone() {
            let key = seq[j];
            if slot_of[key] != usize::MAX {
                continue;
            }
            if resident.len() < slots {
                slot_of[key] = resident.len();
                resident.push((key, next_use[j]));
                continue;
            }
            let in_group = |k: usize| seq[group.clone()].contains(&k);
            let victim = (0..resident.len()).filter(|&r| !in_group(resident[r].0)).max_by_key(|&r| resident[r].1);
            if let Some(r) = victim {
                slot_of[resident[r].0] = usize::MAX;
                resident[r] = (key, next_use[j]);
                slot_of[key] = r;
            }
        }
        i = group.end;
    }
    hits as f64 / seq.len().saturating_sub(first_counted).max(1) as f64
}
