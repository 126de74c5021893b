//! Speed measurement of an open model: prefill a prompt, then decode greedily. Figures are for
//! printing and recording, never for asserting (machines are noisy).

use crate::error::Result;
use crate::Model;
use std::time::Instant;

/// Measured speeds.
#[derive(Clone, Debug)]
pub struct BenchReport {
    /// Prompt tokens per second.
    pub prefill_tok_s: f64,
    /// Generated tokens per second.
    pub decode_tok_s: f64,
    /// Seconds of the prefill.
    pub prefill_secs: f64,
    /// Seconds of the decode.
    pub decode_secs: f64,
    /// Expert-cache activity during the prefill only (streamed models).
    pub prefill_cache: Option<crate::CacheStats>,
    /// Expert-cache activity during decode only (streamed models).
    pub decode_cache: Option<crate::CacheStats>,
}

/// The seed of [`run`]'s token ids.
const TIMED_SEED: u64 = 0x2545_F491_4F6C_DD1D;

/// Deterministic pseudo-random token ids in `3..vocab` (an xorshift sequence from `seed`).
fn token_stream(vocab: usize, seed: u64) -> impl FnMut() -> u32 {
    let vocab = vocab as u64;
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (3 + x % (vocab - 3).max(1)) as u32
    }
}

/// What saving and loading a session's state costs beside computing it again.
#[derive(Clone, Debug)]
pub struct StateBenchReport {
    /// Tokens in the session.
    pub tokens: usize,
    /// Computing the tokens' state from nothing (the prefill that a load replaces).
    pub prefill_secs: f64,
    /// Seconds to save the state file.
    pub save_secs: f64,
    /// Seconds to load it back into a fresh session.
    pub load_secs: f64,
    /// Bytes of the state file.
    pub file_bytes: u64,
}

/// Prefills `tokens` pseudo-random ids into the model's own session, saves it to `path`, then
/// loads it back into the emptied session (checking that the tokens came back), timing each
/// step. The file stays at `path`.
pub fn state(model: &mut Model, tokens: usize, path: &std::path::Path) -> Result<StateBenchReport> {
    let mut next_id = token_stream(model.config().vocab, TIMED_SEED);
    let prompt: Vec<u32> = (0..tokens).map(|_| next_id()).collect();
    model.reset();
    let t = Instant::now();
    model.eval(&prompt)?;
    let prefill_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    model.session().save_state(path)?;
    let save_secs = t.elapsed().as_secs_f64();
    model.reset();
    let t = Instant::now();
    model.session_mut().load_state(path)?;
    let load_secs = t.elapsed().as_secs_f64();
    if model.session().tokens() != prompt {
        return Err(crate::Error::new(crate::ErrorKind::Format, format!("{}: the loaded tokens differ from the saved ones", path.display())));
    }
    let file_bytes = std::fs::metadata(path).map_err(|e| crate::Error::io(path, "stat", e))?.len();
    Ok(StateBenchReport { tokens, prefill_secs, save_secs, load_secs, file_bytes })
}

/// Prefills `prompt_tokens` deterministic pseudo-random ids, then decodes `n` tokens one at a
/// time. Each decode step picks the argmax (the sampling cost) but feeds the next id of the
/// same pseudo-random sequence: a random model's greedy choice repeats one token, which would
/// route every step to the same experts and make any cache look perfect, while real text
/// routes each token differently.
pub fn run(model: &mut Model, prompt_tokens: usize, n: usize) -> Result<BenchReport> {
    let mut next_id = token_stream(model.config().vocab, TIMED_SEED);
    let prompt: Vec<u32> = (0..prompt_tokens).map(|_| next_id()).collect();
    model.reset();
    let start = model.cache_stats().cloned();
    let t = Instant::now();
    let mut chosen = argmax(model.eval(&prompt)?);
    let prefill_secs = t.elapsed().as_secs_f64();
    let before = model.cache_stats().cloned();
    let t = Instant::now();
    for _ in 0..n {
        let logits = model.eval(&[next_id()])?;
        chosen ^= argmax(logits);
    }
    std::hint::black_box(chosen);
    let decode_secs = t.elapsed().as_secs_f64();
    let prefill_cache = start.zip(before.as_ref()).map(|(s, b)| b.since(&s));
    let decode_cache = before.zip(model.cache_stats()).map(|(b, a)| a.since(&b));
    Ok(BenchReport {
        prefill_cache,
        decode_cache,
        prefill_tok_s: prompt_tokens as f64 / prefill_secs.max(1e-9),
        decode_tok_s: n as f64 / decode_secs.max(1e-9),
        prefill_secs,
        decode_secs,
    })
}

/// An untimed run before [`run`], as llama-bench's warm-up run: a prefill of `prompt_tokens`
/// and `n` decode steps (as many as the context holds) on ids of another pseudo-random
/// sequence, so it is not told the timed run's routing; then the session is reset. What it
/// leaves behind is what a warm engine has: the expert cache filled with the experts it chose
/// (for a model that fits its cache, after a hundred tokens or so, nearly all of them), as a
/// warm page cache holds a memory-mapped model's pages. Without it, the timed run of a
/// streamed model includes filling the cache from disk.
pub fn warm_up(model: &mut Model, prompt_tokens: usize, n: usize) -> Result<()> {
    let mut next_id = token_stream(model.config().vocab, TIMED_SEED.rotate_left(32));
    model.reset();
    let prompt: Vec<u32> = (0..prompt_tokens).map(|_| next_id()).collect();
    model.eval(&prompt)?;
    for _ in 0..n.min(model.context().saturating_sub(prompt_tokens)) {
        model.eval(&[next_id()])?;
    }
    model.reset();
    Ok(())
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}
