//! Choosing the next token from logits: greedy, or a seeded draw after the usual filters.
//!
//! The order is llama.cpp's default chain: repetition penalty, top-k, top-p, min-p (these
//! three on the temperature-1 distribution), then temperature, then the draw. A fixed seed
//! makes a sampled run reproducible.

use crate::error::{Error, Result};

/// Sampling settings. `temperature == 0` is greedy (the other filters then do not matter).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy; otherwise logits are divided by it before the draw.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1 = off).
    pub top_p: f32,
    /// Drop tokens less likely than min_p × the most likely one (0 = off).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recent tokens by this (1 = off).
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    /// Seed of the random draw.
    pub seed: u64,
}

impl Default for SamplingParams {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalty.
    fn default() -> SamplingParams {
        SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, repeat_penalty: 1.0, repeat_last_n: 64, seed: 0 }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> SamplingParams {
        SamplingParams { temperature: 0.0, ..SamplingParams::default() }
    }

    /// Range checks, naming the parameter.
    pub fn validate(&self) -> Result<()> {
        let t = self.temperature;
        if !(t.is_finite() && (0.0..=100.0).contains(&t)) {
            return Err(Error::arg(format!("temperature {t} is out of range 0..=100")));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::arg(format!("top-p {} is out of range (0, 1]", self.top_p)));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::arg(format!("min-p {} is out of range [0, 1]", self.min_p)));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty <= 100.0) {
            return Err(Error::arg(format!("repeat penalty {} is out of range (0, 100]", self.repeat_penalty)));
        }
        Ok(())
    }
}

/// The buffers a [`Sampler`] works in, sized to a vocabulary once so that sampling a token
/// allocates nothing: every token as a `(logit, id)` candidate, their weights, and one bit per
/// token for the repetition penalty's distinct-token test. A [`crate::Model`] holds one
/// (counted in its memory plan) and lends it to each generation.
#[derive(Default)]
pub struct SampleBuffers {
    candidates: Vec<(f32, u32)>,
    weights: Vec<f64>,
    seen: Vec<u64>,
}

impl SampleBuffers {
    /// Buffers for a vocabulary of `vocab` tokens.
    pub fn new(vocab: usize) -> SampleBuffers {
        let mut b = SampleBuffers::default();
        b.reserve(vocab);
        b
    }

    /// The bytes [`SampleBuffers::new`] allocates for `vocab` tokens (the memory plan's figure).
    pub fn plan_bytes(vocab: usize) -> u64 {
        (vocab * (std::mem::size_of::<(f32, u32)>() + std::mem::size_of::<f64>()) + vocab.div_ceil(64) * 8) as u64
    }

    /// Heap bytes held (capacities).
    pub fn heap_bytes(&self) -> u64 {
        use crate::sys::vec_bytes;
        vec_bytes(&self.candidates) + vec_bytes(&self.weights) + vec_bytes(&self.seen)
    }

    /// Grows to `vocab` tokens if smaller (only a sampler used on its own ever grows).
    fn reserve(&mut self, vocab: usize) {
        self.candidates.reserve_exact(vocab.saturating_sub(self.candidates.len()));
        self.weights.reserve_exact(vocab.saturating_sub(self.weights.len()));
        let words = vocab.div_ceil(64);
        if self.seen.len() < words {
            self.seen.reserve_exact(words - self.seen.len());
            self.seen.resize(words, 0);
        }
    }
}

/// A sampler with its random state and its buffers.
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    bufs: SampleBuffers,
}

impl Sampler {
    /// A sampler for `params` (checked). Its buffers grow to the vocabulary on first use; see
    /// [`Sampler::with_buffers`] for a sampler that never allocates.
    pub fn new(params: &SamplingParams) -> Result<Sampler> {
        Sampler::with_buffers(params, SampleBuffers::default())
    }

    /// A sampler for `params` working in `bufs` (sized with [`SampleBuffers::new`]);
    /// [`Sampler::into_buffers`] gives them back.
    pub fn with_buffers(params: &SamplingParams, bufs: SampleBuffers) -> Result<Sampler> {
        params.validate()?;
        Ok(Sampler { params: params.clone(), rng: Rng::new(params.seed), bufs })
    }

    /// The buffers, for the next sampler.
    pub fn into_buffers(self) -> SampleBuffers {
        self.bufs
    }

    /// Picks a token from `logits` given the `history` of tokens so far.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let p = &self.params;
        self.bufs.reserve(logits.len());
        let SampleBuffers { candidates: c, weights, seen } = &mut self.bufs;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &v)| (v, i as u32)));
        // Repetition penalty on the recent window, each distinct token once (as HF and llama.cpp).
        if p.repeat_penalty != 1.0 {
            let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
            for &t in window {
                let (w, bit) = (t as usize / 64, 1u64 << (t % 64));
                if (t as usize) < logits.len() && seen[w] & bit == 0 {
                    seen[w] |= bit;
                    let l = &mut c[t as usize].0;
                    *l = if *l > 0.0 { *l / p.repeat_penalty } else { *l * p.repeat_penalty };
                }
            }
            for &t in window {
                if let Some(w) = seen.get_mut(t as usize / 64) {
                    *w = 0;
                }
            }
        }
        if p.temperature == 0.0 {
            let mut best = (f32::NEG_INFINITY, 0u32);
            for &(v, i) in c.iter() {
                if v > best.0 {
                    best = (v, i);
                }
            }
            return best.1;
        }
        c.retain(|x| !x.0.is_nan());
        if c.is_empty() {
            return 0;
        }
        let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, desc);
            c.truncate(p.top_k);
        }
        c.sort_unstable_by(desc);
        // Probabilities at temperature 1 for top-p and min-p (f32 weights, held as f64: exact).
        let max = c[0].0;
        weights.clear();
        weights.extend(c.iter().map(|x| (x.0 - max).exp() as f64));
        let total: f32 = weights.iter().map(|&w| w as f32).sum();
        let mut keep = c.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0f32;
            for (i, &w) in weights.iter().enumerate() {
                cum += w as f32 / total;
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            // weights[0] is the most likely (exp(0) = 1), so the threshold is min_p itself.
            keep = keep.min(weights.iter().take_while(|&&w| w as f32 >= p.min_p).count().max(1));
        }
        c.truncate(keep);
        // The draw at the temperature, in f64.
        let inv_t = 1.0 / p.temperature;
        weights.clear();
        weights.extend(c.iter().map(|x| (((x.0 - max) * inv_t) as f64).exp()));
        let sum: f64 = weights.iter().sum();
        let mut r = self.rng.next_f64() * sum;
        for (i, w) in weights.iter().enumerate() {
            r -= w;
            if r < 0.0 {
                return c[i].1;
            }
        }
        c[c.len() - 1].1
    }
}

// ---- The next-token distribution, for inspection (`waste eval`) -------------------------
// Kept apart from `Sampler`: it reads logits and allocates its answer, nothing more.

/// One candidate of a next-token distribution ([`top_k_distribution`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The token.
    pub id: u32,
    /// Its logit.
    pub logit: f32,
    /// Softmax probability at temperature 1 over the whole vocabulary.
    pub prob: f64,
}

/// The `k` most likely next tokens of `logits`, most likely first (the lowest id first among
/// equal logits), with their probabilities: the softmax at temperature 1 over every logit,
/// summed in f64, no sampling filter applied (what the model itself says). NaN logits are
/// never candidates and take no probability; +∞ logits share it all.
pub fn top_k_distribution(logits: &[f32], k: usize) -> Vec<Candidate> {
    use std::cmp::{Ordering, Reverse};
    /// Greater is more likely: the larger logit, then the lower id.
    struct Ranked(f32, u32);
    impl Ord for Ranked {
        fn cmp(&self, o: &Ranked) -> Ordering {
            self.0.total_cmp(&o.0).then(o.1.cmp(&self.1))
        }
    }
    impl PartialOrd for Ranked {
        fn partial_cmp(&self, o: &Ranked) -> Option<Ordering> {
            Some(self.cmp(o))
        }
    }
    impl PartialEq for Ranked {
        fn eq(&self, o: &Ranked) -> bool {
            self.cmp(o) == Ordering::Equal
        }
    }
    impl Eq for Ranked {}
    let Some(max) = logits.iter().copied().filter(|l| !l.is_nan()).reduce(f32::max) else { return Vec::new() };
    if k == 0 {
        return Vec::new();
    }
    // A heap of the k best so far (its weakest on top), not a sort of the whole vocabulary:
    // nothing vocabulary-sized is allocated.
    let mut heap = std::collections::BinaryHeap::with_capacity(k.min(logits.len()) + 1);
    for (i, &l) in logits.iter().enumerate().filter(|(_, l)| !l.is_nan()) {
        heap.push(Reverse(Ranked(l, i as u32)));
        if heap.len() > k {
            heap.pop();
        }
    }
    let prob: Box<dyn Fn(f32) -> f64> = if max.is_infinite() {
        // exp(∞ − ∞) is NaN: the tokens at the extreme share the probability evenly.
        let n = logits.iter().filter(|&&l| l == max).count() as f64;
        Box::new(move |l| if l == max { 1.0 / n } else { 0.0 })
    } else {
        let sum: f64 = logits.iter().filter(|l| !l.is_nan()).map(|&l| ((l - max) as f64).exp()).sum();
        Box::new(move |l| ((l - max) as f64).exp() / sum)
    };
    heap.into_sorted_vec().into_iter().map(|Reverse(Ranked(logit, id))| Candidate { id, logit, prob: prob(logit) }).collect()
}

/// The natural log of the probability of token `id` under `logits`: the softmax at temperature
/// 1 over the whole vocabulary, summed in f64, as [`top_k_distribution`] computes it (NaN logits
/// take no probability, +∞ logits share it all). `None` for an id out of range or a NaN logit;
/// `-∞` for a token of probability 0. One pass over the logits, no allocation.
pub fn log_probability(logits: &[f32], id: u32) -> Option<f64> {
    let l = *logits.get(id as usize)?;
    if l.is_nan() {
        return None;
    }
    let max = logits.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    if max.is_infinite() {
        let n = logits.iter().filter(|&&v| v == max).count() as f64;
        return Some(if l == max { -(n.ln()) } else { f64::NEG_INFINITY });
    }
    let sum: f64 = logits.iter().filter(|l| !l.is_nan()).map(|&v| ((v - max) as f64).exp()).sum();
    Some((l - max) as f64 - sum.ln())
}

/// xoshiro256** seeded through splitmix64: small, fast, and the same sequence everywhere.
struct Rng([u64; 4]);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut s = seed;
        let mut next = || {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32) -> SamplingParams {
        SamplingParams { temperature: t, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() }
    }

    #[test]
    fn greedy_takes_the_argmax_and_the_penalty_moves_it() {
        let logits = [0.1, 2.0, 1.9, -1.0];
        let mut s = Sampler::new(&SamplingParams::greedy()).unwrap();
        assert_eq!(s.sample(&logits, &[]), 1);
        let mut s = Sampler::new(&SamplingParams { repeat_penalty: 1.2, ..SamplingParams::greedy() }).unwrap();
        assert_eq!(s.sample(&logits, &[1]), 2);
    }

    #[test]
    fn seeds_reproduce_and_filters_restrict() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let draw = |p: SamplingParams| {
            let mut s = Sampler::new(&p).unwrap();
            (0..200).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        let a = draw(SamplingParams { seed: 7, ..params(1.0) });
        assert_eq!(a, draw(SamplingParams { seed: 7, ..params(1.0) }));
        assert_ne!(a, draw(SamplingParams { seed: 8, ..params(1.0) }));
        let mut top3: Vec<u32> = (0..100).collect();
        top3.sort_by(|&x, &y| logits[y as usize].total_cmp(&logits[x as usize]));
        let k = draw(SamplingParams { top_k: 3, seed: 1, ..params(1.0) });
        assert!(k.iter().all(|t| top3[..3].contains(t)));
        let m = draw(SamplingParams { min_p: 0.999, seed: 1, ..params(5.0) });
        assert!(m.iter().all(|&t| t == top3[0]));
    }

    /// Frequencies of `n` seeded draws, one count per token.
    fn frequencies(p: SamplingParams, logits: &[f32], history: &[u32], n: usize) -> Vec<f64> {
        let mut s = Sampler::new(&p).unwrap();
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..n {
            counts[s.sample(logits, history) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    /// Observed frequencies within 5 standard deviations of the expected probabilities, and
    /// a token of probability 0 never drawn.
    fn assert_distribution(got: &[f64], want: &[f64], n: usize, what: &str) {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            if w == 0.0 {
                assert_eq!(g, 0.0, "{what}: token {i} is excluded but was drawn ({got:?})");
            } else {
                let sd = (w * (1.0 - w) / n as f64).sqrt();
                assert!((g - w).abs() <= 5.0 * sd + 1e-9, "{what}: token {i}: frequency {g:.4}, probability {w:.4} ({got:?})");
            }
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p_and_renormalises() {
        // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
        let probs = [0.5f64, 0.3, 0.15, 0.05];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let n = 20_000;
        for (top_p, kept) in [(0.45f32, 1usize), (0.7, 2), (0.9, 3), (1.0, 4)] {
            let got = frequencies(SamplingParams { top_p, seed: 3, ..params(1.0) }, &logits, &[], n);
            let total: f64 = probs[..kept].iter().sum();
            let want: Vec<f64> = (0..4).map(|i| if i < kept { probs[i] / total } else { 0.0 }).collect();
            assert_distribution(&got, &want, n, &format!("top-p {top_p}"));
        }
        // top-p is applied to the temperature-1 distribution, before the temperature: at T = 2
        // the same two tokens survive 0.7, drawn in proportion to p^(1/2).
        let got = frequencies(SamplingParams { top_p: 0.7, seed: 4, ..params(2.0) }, &logits, &[], n);
        let (a, b) = (0.5f64.sqrt(), 0.3f64.sqrt());
        assert_distribution(&got, &[a / (a + b), b / (a + b), 0.0, 0.0], n, "top-p 0.7 at T = 2");
    }

    #[test]
    fn the_repetition_penalty_reshapes_the_sampled_distribution() {
        // Token 0 (positive logit) is divided by 2, token 2 (negative) multiplied by 2; the
        // window of 2 leaves token 3, seen earlier, alone.
        let logits = [2.0f32, 2.0, -1.0, -1.0];
        let history = [3u32, 0, 2];
        let p = SamplingParams { repeat_penalty: 2.0, repeat_last_n: 2, seed: 9, ..params(1.0) };
        let adjusted = [1.0f64, 2.0, -2.0, -1.0];
        let z: f64 = adjusted.iter().map(|l| l.exp()).sum();
        let want: Vec<f64> = adjusted.iter().map(|l| l.exp() / z).collect();
        let n = 20_000;
        assert_distribution(&frequencies(p.clone(), &logits, &history, n), &want, n, "penalty 2");
        // Without the penalty tokens 0 and 1 are equally likely: the test can tell them apart.
        let even = frequencies(SamplingParams { repeat_penalty: 1.0, ..p }, &logits, &history, n);
        assert!((even[0] - even[1]).abs() < 0.03, "{even:?}");
    }

    #[test]
    fn a_penalised_token_pushed_out_of_top_k_is_never_sampled() {
        let logits = [5.0f32, 4.9, 1.0, 0.0];
        let p = SamplingParams { repeat_penalty: 100.0, top_k: 2, seed: 5, ..params(1.0) };
        let got = frequencies(p.clone(), &logits, &[0], 5_000);
        assert_eq!(got[0], 0.0, "the penalised token was drawn: {got:?}");
        assert_eq!(got[3], 0.0, "a token outside the top 2 was drawn: {got:?}");
        assert!(got[1] > 0.9 && got[2] > 0.0, "{got:?}");
        // Greedy with the same penalty moves the argmax off the penalised token too.
        assert_eq!(Sampler::new(&SamplingParams { temperature: 0.0, ..p }).unwrap().sample(&logits, &[0]), 1);
    }

    #[test]
    fn top_k_distribution_is_the_softmax_in_order() {
        let logits = [0.0f32, 2.0f32.ln(), f32::NAN, 2.0f32.ln(), -1e30];
        let d = top_k_distribution(&logits, 10);
        assert_eq!(d.iter().map(|c| c.id).collect::<Vec<_>>(), [1, 3, 0, 4], "NaN dropped, ties by id");
        for (c, want) in d.iter().zip([0.4, 0.4, 0.2, 0.0]) {
            assert!((c.prob - want).abs() < 1e-6, "{d:?}");
        }
        assert!((d.iter().map(|c| c.prob).sum::<f64>() - 1.0).abs() < 1e-9);
        let top2 = top_k_distribution(&logits, 2);
        assert_eq!(top2, d[..2]);
        assert!(top_k_distribution(&logits, 0).is_empty());
        assert!(top_k_distribution(&[f32::NAN; 3], 2).is_empty());
        let inf = top_k_distribution(&[1.0, f32::INFINITY, f32::INFINITY], 3);
        assert_eq!(inf.iter().map(|c| c.prob).collect::<Vec<_>>(), [0.5, 0.5, 0.0]);
    }

    #[test]
    fn out_of_range_parameters_are_refused() {
        assert!(Sampler::new(&SamplingParams { top_p: 0.0, ..params(1.0) }).is_err());
        assert!(Sampler::new(&SamplingParams { temperature: -1.0, ..params(1.0) }).is_err());
        assert!(Sampler::new(&SamplingParams { min_p: 2.0, ..params(1.0) }).is_err());
        assert!(Sampler::new(&SamplingParams { repeat_penalty: 0.0, ..params(1.0) }).is_err());
    }

    #[test]
    fn log_probability_agrees_with_the_distribution() {
        let logits = [1.0f32, 3.0, -2.0, 0.5, f32::NAN];
        let top = top_k_distribution(&logits, 4);
        for c in &top {
            let lp = log_probability(&logits, c.id).unwrap();
            assert!((lp.exp() - c.prob).abs() < 1e-12, "token {}: {} vs {}", c.id, lp.exp(), c.prob);
        }
        assert_eq!(log_probability(&logits, 4), None, "a NaN logit has no probability");
        assert_eq!(log_probability(&logits, 5), None, "out of range");
        let inf = [f32::INFINITY, 0.0, f32::INFINITY];
        assert!((log_probability(&inf, 0).unwrap() - (0.5f64).ln()).abs() < 1e-12);
        assert_eq!(log_probability(&inf, 1), Some(f64::NEG_INFINITY));
    }
}
