//! The routing the engine does, recorded and replayed: which experts each token's MoE layers
//! chose, written in the JSON-lines format of the routing traces (`cache::replay::Trace`:
//! `{"tok": N, "layers": [[ids] per MoE layer]}`), and a trace's choices forced onto the
//! router so a random model streams with the temporal locality of a real one.
//!
//! Neither changes what the forward pass computes from the experts it is given: recording
//! copies ids out after a layer routes; replay replaces the ids (the router still runs and its
//! weights still weigh), which is what a benchmark of the expert traffic needs.

use crate::cache::replay::Trace;
use crate::cache::usage::Usage;

/// The experts one token chose, per MoE layer (each layer's ids sorted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRoute {
    /// The token's position in its session.
    pub position: usize,
    /// Per MoE layer, in layer order: the chosen expert ids, ascending.
    pub layers: Vec<Vec<u32>>,
}

impl TokenRoute {
    /// The trace line for this token, without the newline: `{"tok": N, "layers": [[...], ...]}`.
    pub fn to_json_line(&self) -> String {
        let layers: Vec<String> = self.layers.iter()
            .map(|ids| format!("[{}]", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")))
            .collect();
        format!("{{\"tok\": {}, \"layers\": [{}]}}", self.position, layers.join(", "))
    }
}

/// What the model does with routing besides using it: record it, replace it, both or neither.
#[derive(Default)]
pub(crate) struct RoutingHooks {
    /// Tokens routed since recording began (or since the last take).
    pub log: Option<Vec<TokenRoute>>,
    /// A trace whose choices replace the router's.
    pub replay: Option<Trace>,
    /// Expert usage counted for the learned hotlist ([`Usage`]).
    pub usage: Option<Usage>,
}

impl RoutingHooks {
    /// Before a chunk of `n` tokens at `pos0`: one empty record per token.
    pub fn begin_chunk(&mut self, pos0: usize, n: usize, moe_layers: impl FnOnce() -> usize) {
        if let Some(u) = &mut self.usage {
            u.tokens += n as u64;
        }
        if let Some(log) = &mut self.log {
            let moe_layers = moe_layers();
            log.extend((0..n).map(|t| TokenRoute { position: pos0 + t, layers: Vec::with_capacity(moe_layers) }));
        }
    }

    /// After MoE layer `moe_index` routed the chunk's `n` tokens (`ids`: n × top_k): each
    /// token's choice, sorted, joins its record. Layers come in order, so the record's next
    /// entry is this layer's.
    pub fn record(&mut self, moe_index: usize, n: usize, top_k: usize, ids: &[u32]) {
        if let Some(u) = &mut self.usage {
            let row = moe_index * u.experts;
            for &e in &ids[..n * top_k] {
                if let Some(c) = u.counts.get_mut(row + e as usize) {
                    *c = c.saturating_add(1);
                }
            }
        }
        let Some(log) = &mut self.log else { return };
        let first = log.len() - n;
        for (t, rec) in log[first..].iter_mut().enumerate() {
            let mut chosen = ids[t * top_k..(t + 1) * top_k].to_vec();
            chosen.sort_unstable();
            rec.layers.push(chosen);
        }
    }

    /// Replaces the router's choice for the chunk's `n` tokens at `pos0` in MoE layer
    /// `moe_index` with the trace's (`ids`: n × top_k, overwritten).
    pub fn replay(&self, pos0: usize, moe_index: usize, experts: usize, n: usize, top_k: usize, ids: &mut [u32]) {
        let Some(trace) = &self.replay else { return };
        for t in 0..n {
            let token = &trace.tokens[(pos0 + t) % trace.tokens.len()];
            let forced = &token[moe_index % trace.layers];
            overlay(forced, experts, &mut ids[t * top_k..(t + 1) * top_k]);
        }
    }
}

/// Puts the trace's ids into `slots` (the router's choice for one token): each id taken modulo
/// `experts` (a trace of a model with more experts still drives this one), a duplicate moved to
/// the next free id, and slots the trace leaves empty (it chose fewer experts than this model's
/// top-k) keep the router's own distinct choices.
fn overlay(forced: &[u32], experts: usize, slots: &mut [u32]) {
    // top-k is at most 64 (`model::moe`), so the router's choice fits a fixed array.
    let mut router = [0u32; 64];
    let k = slots.len().min(64);
    router[..k].copy_from_slice(&slots[..k]);
    let taken = |id: u32, slots: &[u32], used: usize| slots[..used].contains(&id);
    let mut used = 0;
    for &f in forced.iter().take(k) {
        let mut id = (f as usize % experts) as u32;
        let mut tries = 0;
        while taken(id, slots, used) && tries < experts {
            id = ((id as usize + 1) % experts) as u32;
            tries += 1;
        }
        slots[used] = id;
        used += 1;
    }
    for &id in &router[..k] {
        if used == k {
            break;
        }
        if !taken(id, slots, used) {
            slots[used] = id;
            used += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_maps_ids_into_range_and_keeps_them_distinct() {
        let mut slots = [7, 8, 9, 10];
        overlay(&[1, 5, 9], 8, &mut slots); // 9 % 8 = 1 collides with 1 -> 2
        assert_eq!(slots, [1, 5, 2, 7]);
        let mut slots = [0, 1];
        overlay(&[3, 4, 5], 8, &mut slots);
        assert_eq!(slots, [3, 4]);
    }

    #[test]
    fn a_token_route_prints_as_a_trace_line() {
        let r = TokenRoute { position: 3, layers: vec![vec![1, 2], vec![0, 7]] };
        assert_eq!(r.to_json_line(), r#"{"tok": 3, "layers": [[1, 2], [0, 7]]}"#);
    }
}
