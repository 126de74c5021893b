//! Expert selection: which experts each token uses and with what weight. Softmax top-k (spec
//! §2), DeepSeek-V3/Kimi sigmoid routing with the selection bias and group limit (§3.6), and
//! DeepSeek-V2 softmax routing, greedy or group-limited (§3.7). Everything in f32, in the
//! reference's operation order; ties go to the lower expert (or group) index.

use crate::format::config::{MoeConfig, Routing};
use crate::kernels;

/// Floats of scratch [`route`] needs: selection scores and group scores.
pub fn scratch_len(moe: &MoeConfig) -> usize {
    match moe.routing {
        Routing::SoftmaxTopK { .. } | Routing::TopKSoftmax => 0,
        Routing::Sigmoid { groups, .. } | Routing::SoftmaxGroups { groups, .. } => moe.experts + groups,
    }
}

/// Routes the `n` tokens whose router logits are in `logits` (n × experts, overwritten): fills
/// `ids` and `weights` (n × top_k), each token's slots in selection order. `bias` is the
/// layer's `e_score_correction_bias` (sigmoid routing only); `scratch` holds
/// [`scratch_len`] floats.
pub fn route(moe: &MoeConfig, bias: Option<&[f32]>, logits: &mut [f32], n: usize, ids: &mut [u32], weights: &mut [f32],
             scratch: &mut [f32]) {
    let (e, k) = (moe.experts, moe.top_k);
    for t in 0..n {
        let p = &mut logits[t * e..(t + 1) * e];
        let (ti, tw) = (&mut ids[t * k..(t + 1) * k], &mut weights[t * k..(t + 1) * k]);
        match moe.routing {
            Routing::SoftmaxTopK { renormalize } => {
                kernels::softmax(p);
                top_k(p, ti);
                gather(p, ti, tw);
                if renormalize {
                    let sum: f32 = tw.iter().sum();
                    tw.iter_mut().for_each(|w| *w /= sum);
                }
            }
            // gpt-oss: the k largest logits (the router's bias already added), softmaxed among
            // themselves.
            Routing::TopKSoftmax => {
                top_k(p, ti);
                gather(p, ti, tw);
                kernels::softmax(tw);
            }
            Routing::Sigmoid { groups, topk_group, renormalize, scale } => {
                let (choice, group_scores) = scratch[..e + groups].split_at_mut(e);
                for (i, (s, c)) in p.iter_mut().zip(choice.iter_mut()).enumerate() {
                    *s = 1.0 / (1.0 + (-*s).exp());
                    *c = *s + bias.map_or(0.0, |b| b[i]);
                }
                // Groups ranked by the sum of their two best biased scores; the others' experts
                // are out of the running (−∞, as transformers 5 and DeepSeek's inference code do).
                if topk_group < groups {
                    for (g, block) in choice.chunks_exact(e / groups).enumerate() {
                        group_scores[g] = top_two_sum(block);
                    }
                    limit_groups(choice, group_scores, topk_group, f32::NEG_INFINITY);
                }
                top_k(choice, ti);
                // The bias chooses; the unbiased scores weigh (spec §3.6 step 5).
                gather(p, ti, tw);
                if renormalize {
                    let sum = tw.iter().sum::<f32>() + 1e-20;
                    tw.iter_mut().for_each(|w| *w /= sum);
                }
                tw.iter_mut().for_each(|w| *w *= scale);
            }
            Routing::SoftmaxGroups { groups, topk_group, scale } => {
                kernels::softmax(p);
                if topk_group < groups {
                    let group_scores = &mut scratch[..groups];
                    for (g, block) in p.chunks_exact(e / groups).enumerate() {
                        group_scores[g] = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    }
                    // Dropped groups' probabilities become 0.0 (spec §3.7), not −∞.
                    limit_groups(p, group_scores, topk_group, 0.0);
                }
                top_k(p, ti);
                gather(p, ti, tw);
                tw.iter_mut().for_each(|w| *w *= scale);
            }
        }
    }
}

/// The indices of the `ids.len()` largest values of `v` (ties: the lower index), best first.
pub fn top_k(v: &[f32], ids: &mut [u32]) {
    for slot in 0..ids.len() {
        let mut best = usize::MAX;
        for (j, &x) in v.iter().enumerate() {
            if !ids[..slot].contains(&(j as u32)) && (best == usize::MAX || x > v[best]) {
                best = j;
            }
        }
        ids[slot] = best as u32;
    }
}

fn gather(v: &[f32], ids: &[u32], out: &mut [f32]) {
    for (o, &i) in out.iter_mut().zip(ids) {
        *o = v[i as usize];
    }
}

/// Largest + second largest of a group (the reference's `topk(2).sum()`).
fn top_two_sum(block: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in block {
        if x > a {
            (a, b) = (x, a);
        } else if x > b {
            b = x;
        }
    }
    a + b
}

/// Keeps the experts of the `keep` best groups (by `group_scores`) and sets the others' scores
/// in `v` to `fill`.
fn limit_groups(v: &mut [f32], group_scores: &[f32], keep: usize, fill: f32) {
    let per = v.len() / group_scores.len();
    for g in 0..group_scores.len() {
        let s = group_scores[g];
        // Rank of group g: groups strictly better, or as good with a lower index.
        let better = group_scores.iter().enumerate().filter(|&(h, &x)| x > s || (x == s && h < g)).count();
        if better >= keep {
            v[g * per..(g + 1) * per].fill(fill);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::config::MoeLayout;

    fn cfg(experts: usize, top_k: usize, routing: Routing) -> MoeConfig {
        MoeConfig { layout: MoeLayout { block: "mlp", names: ["a", "b", "c"], shared_expert: false }, experts, top_k,
            expert_intermediate: 32, routing, shared_intermediate: 0, moe_layers: vec![true] }
    }

    fn logit(s: f32) -> f32 {
        (s / (1.0 - s)).ln()
    }

    /// Spec §3.6 by hand: the bias moves expert 1 ahead of expert 0 for selection, but the
    /// weights are the unbiased sigmoid scores; the group limit keeps the groups of experts
    /// {0,1} and {4,5} (biased two-sums 0.6+0.9 and 0.8+0.7, against 0.85+0.1), so expert 2
    /// (0.85) is out.
    #[test]
    fn sigmoid_routing_selects_with_the_bias_and_weighs_without() {
        let moe = cfg(6, 2, Routing::Sigmoid { groups: 3, topk_group: 2, renormalize: true, scale: 2.0 });
        let scores = [0.6f32, 0.5, 0.85, 0.1, 0.8, 0.7];
        let bias = [0.0f32, 0.4, 0.0, 0.0, 0.0, 0.0];
        let mut logits: Vec<f32> = scores.iter().map(|&s| logit(s)).collect();
        let (mut ids, mut w, mut scratch) = ([0u32; 2], [0f32; 2], vec![0f32; scratch_len(&moe)]);
        route(&moe, Some(&bias), &mut logits, 1, &mut ids, &mut w, &mut scratch);
        assert_eq!(ids, [1, 4]);
        let (s1, s4) = (1.0 / (1.0 + (-logit(0.5)).exp()), 1.0 / (1.0 + (-logit(0.8)).exp()));
        let sum = s1 + s4 + 1e-20;
        assert_eq!(w, [s1 / sum * 2.0, s4 / sum * 2.0]);
        // Without the group limit, expert 2 wins a slot.
        let all = cfg(6, 2, Routing::Sigmoid { groups: 1, topk_group: 1, renormalize: false, scale: 1.0 });
        let mut logits: Vec<f32> = scores.iter().map(|&s| logit(s)).collect();
        route(&all, Some(&bias), &mut logits, 1, &mut ids, &mut w, &mut scratch);
        assert_eq!(ids, [1, 2]);
    }

    /// Spec §3.7: greedy is the plain top-k of the softmax; group_limited_greedy ranks groups by
    /// their maximum and zeroes the dropped ones; no renormalisation, × scale.
    #[test]
    fn softmax_group_routing_masks_with_zero_and_scales() {
        let logits0 = [2.0f32, 1.9, 0.0, 1.95, -1.0, 1.0];
        let glg = cfg(6, 2, Routing::SoftmaxGroups { groups: 3, topk_group: 1, scale: 16.0 });
        let mut p = logits0.to_vec();
        let (mut ids, mut w, mut scratch) = ([0u32; 2], [0f32; 2], vec![0f32; scratch_len(&glg)]);
        route(&glg, None, &mut p, 1, &mut ids, &mut w, &mut scratch);
        let mut probs = logits0.to_vec();
        kernels::softmax(&mut probs);
        assert_eq!(ids, [0, 1], "only the group of expert 0 survives");
        assert_eq!(w, [probs[0] * 16.0, probs[1] * 16.0]);
        let greedy = cfg(6, 2, Routing::SoftmaxGroups { groups: 1, topk_group: 1, scale: 1.0 });
        let mut p = logits0.to_vec();
        route(&greedy, None, &mut p, 1, &mut ids, &mut w, &mut scratch);
        assert_eq!(ids, [0, 3]);
        assert_eq!(w, [probs[0], probs[3]]);
    }
}
