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

    #[test]
    fn out_of_range_parameters_are_refused() {
        assert!(Sampler::new(&SamplingParams { top_p: 0.0, ..params(1.0) }).is_err());
        assert!(Sampler::new(&SamplingParams { temperature: -1.0, ..params(1.0) }).is_err());
        assert!(Sampler::new(&SamplingParams { min_p: 2.0, ..params(1.0) }).is_err());
        assert!(Sampler::new(&SamplingParams { repeat_penalty: 0.0, ..params(1.0) }).is_err());
    }
}
