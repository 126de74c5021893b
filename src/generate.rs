//! Generation: prefill the prompt, then sample, report and feed back one token at a time,
//! stopping at an end-of-sequence token, a stop string, the token limit, a full context, or
//! when the caller's callback says so.
//!
//! A generation runs in a session and continues it: the prompt is the whole conversation, and
//! the state the session holds for the prompt's first tokens is kept (only the rest is
//! prefilled); where the prompt departs from the session's tokens, the state is cut back to the
//! common prefix, or — for a recurrent state, which cannot be cut — dropped and prefilled whole.
//! The generation's last token (an end-of-sequence token included) stays in the session,
//! uncomputed until the session continues, so the next turn starts where the text stopped.
//!
//! Stop strings are matched against the text as it streams: text that could still be the
//! beginning of a stop string is held back until it cannot, so a stop string split across
//! tokens fires and never reaches the caller.

use crate::error::{Error, ErrorKind, Result};
use crate::model::session::Session;
use crate::model::LogitsOut;
use crate::sample::{Sampler, SamplingParams};
use crate::{CacheStats, Model, Tokenizer};
use std::time::{Duration, Instant};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How each token is chosen.
    pub sampling: SamplingParams,
    /// Generation ends when the text contains one of these; the stop string is not reported.
    pub stop: Vec<String>,
    /// End at the model's end-of-sequence tokens (on by default).
    pub stop_at_eos: bool,
    /// Also end at these token ids, whatever `stop_at_eos` says (a chat template's end-of-turn
    /// token, for one); reported as [`StopReason::EndOfSequence`].
    pub stop_tokens: Vec<u32>,
}

impl Default for GenerateParams {
    fn default() -> GenerateParams {
        GenerateParams { max_tokens: 256, sampling: SamplingParams::default(), stop: Vec::new(), stop_at_eos: true, stop_tokens: Vec::new() }
    }
}

impl GenerateParams {
    /// Greedy decoding of up to 256 tokens.
    pub fn greedy() -> GenerateParams {
        GenerateParams { sampling: SamplingParams::greedy(), ..GenerateParams::default() }
    }
}

/// One step of generation, passed to the callback.
#[derive(Debug)]
pub struct TokenEvent<'a> {
    /// The token generated, or `None` for the final event that flushes held-back text.
    pub id: Option<u32>,
    /// Text that became final with this token (may be empty while a multi-byte character or a
    /// possible stop string is incomplete).
    pub text: &'a str,
    /// Index of the token among the generated ones.
    pub index: usize,
    /// Time spent producing this token (sampling and the forward pass that produced its logits).
    pub token_time: Duration,
    /// Time since generation started (prefill included).
    pub elapsed: Duration,
    /// The expert cache's work for this token's step (its forward pass; the prefill for the
    /// first token), measured: zero for a model whose experts do not stream.
    pub experts: ExpertActivity,
    /// The logits the token was drawn from, as the model computed them (before the sampler's
    /// repetition penalty, temperature and filters): one per vocabulary entry, for a host that
    /// reports probabilities (`waste serve`'s `logprobs`; see
    /// [`crate::sample::top_k_distribution`] and [`crate::sample::log_probability`]). A view of
    /// the model's own buffer, valid during the callback: nothing is copied. Empty for the final
    /// event (`id == None`).
    pub logits: &'a [f32],
    /// The model's tokenizer (`None` for a model without one), lent for the callback: the
    /// model is busy generating, so this is how a host names tokens other than the one
    /// generated — the alternatives it reports beside `logits`.
    pub tokenizer: Option<&'a Tokenizer>,
}

/// What the expert cache did over a stretch of work: lookups that hit and missed, bytes read
/// from the banks, the time the computing thread waited for reads, and the time the disk had
/// reads to serve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertActivity {
    /// Expert requests served from the cache.
    pub hits: u64,
    /// Expert requests read from disk.
    pub misses: u64,
    /// Bytes read from the banks.
    pub bytes_read: u64,
    /// Time the computing thread waited for reads.
    pub io_wait: Duration,
    /// Time at least one read was under way ([`CacheStats::disk_busy`]): the bytes read over
    /// it are the bandwidth the disk gave while it had work, and the stretch's time minus it
    /// is when the disk had none.
    pub disk_busy: Duration,
}

impl ExpertActivity {
    /// The counters of `now` minus those of `before` (taken earlier from the same cache).
    pub fn between(before: &ExpertActivity, now: &ExpertActivity) -> ExpertActivity {
        ExpertActivity {
            hits: now.hits.saturating_sub(before.hits),
            misses: now.misses.saturating_sub(before.misses),
            bytes_read: now.bytes_read.saturating_sub(before.bytes_read),
            io_wait: now.io_wait.saturating_sub(before.io_wait),
            disk_busy: now.disk_busy.saturating_sub(before.disk_busy),
        }
    }

    /// The running counters of a cache.
    pub fn of(stats: Option<&CacheStats>) -> ExpertActivity {
        stats.map_or_else(ExpertActivity::default, |c| ExpertActivity { hits: c.hits, misses: c.misses, bytes_read: c.bytes_read,
            io_wait: c.io_wait, disk_busy: c.disk_busy })
    }

    /// Adds `other`'s counters.
    pub fn add(&mut self, other: &ExpertActivity) {
        self.hits += other.hits;
        self.misses += other.misses;
        self.bytes_read += other.bytes_read;
        self.io_wait += other.io_wait;
        self.disk_busy += other.disk_busy;
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `max_tokens` were generated.
    MaxTokens,
    /// The model produced an end-of-sequence token.
    EndOfSequence,
    /// The text reached one of the stop strings.
    StopString,
    /// The callback returned `false`.
    Callback,
    /// The session reached the context length.
    ContextFull,
}

impl StopReason {
    /// A few words for a summary line: "token limit", "end of sequence", "stop string",
    /// "stopped by the caller", "context full".
    pub fn describe(self) -> &'static str {
        match self {
            StopReason::MaxTokens => "token limit",
            StopReason::EndOfSequence => "end of sequence",
            StopReason::StopString => "stop string",
            StopReason::Callback => "stopped by the caller",
            StopReason::ContextFull => "context full",
        }
    }
}

/// Totals of a generation, with what each time covers. The callback's own time (the host
/// writing text out) is in none of them.
#[derive(Clone, Debug)]
pub struct GenerateSummary {
    /// Tokens of the prompt (the whole conversation given).
    pub prompt_tokens: usize,
    /// Prompt tokens whose state the session already held and kept.
    pub reused_tokens: usize,
    /// Prompt tokens computed by the prefill (`prompt_tokens − reused_tokens`).
    pub prefilled_tokens: usize,
    /// The prompt departed from the session's tokens where its recurrent state (KDA) could
    /// not be cut back, so that state was dropped and the whole prompt prefilled again.
    pub state_reset: bool,
    /// Tokens generated (an end-of-sequence token is not counted).
    pub tokens: usize,
    /// The prompt's forward pass and the sampling of the first token from its logits.
    pub prefill_time: Duration,
    /// Every later step: the forward pass of the previous token and the sampling of the next.
    pub decode_time: Duration,
    /// Those steps. Each yields one token (an end-of-sequence token included), so with
    /// `tokens` generated there are `tokens − 1` steps, or `tokens` when generation ended
    /// at an end-of-sequence token.
    pub decode_steps: usize,
    /// Why generation ended.
    pub stop_reason: StopReason,
    /// The generated token ids.
    pub ids: Vec<u32>,
    /// The expert cache's work over the whole generation (zero when experts do not stream).
    pub experts: ExpertActivity,
}

impl GenerateSummary {
    /// Decode speed: decode steps (one token each) per second of decode time; `None` when no
    /// step ran (a single token comes from the prefill alone).
    pub fn tokens_per_second(&self) -> Option<f64> {
        let s = self.decode_time.as_secs_f64();
        (self.decode_steps > 0 && s > 0.0).then(|| self.decode_steps as f64 / s)
    }

    /// Prefill speed: prompt tokens computed per second of prefill time.
    pub fn prefill_tokens_per_second(&self) -> Option<f64> {
        let s = self.prefill_time.as_secs_f64();
        (self.prefilled_tokens > 0 && s > 0.0).then(|| self.prefilled_tokens as f64 / s)
    }
}

/// Holds back text that may be the start of a stop string.
struct StopMatcher<'a> {
    stops: &'a [String],
    held: String,
}

impl StopMatcher<'_> {
    /// Adds `piece`; returns the text now safe to emit and whether a stop string matched.
    fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        let first = self.stops.iter().filter(|s| !s.is_empty()).filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(i) = first {
            let out = self.held[..i].to_string();
            self.held.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in self.stops {
            for (i, _) in self.held.char_indices() {
                let tail = &self.held[i..];
                if tail.len() < s.len() && s.starts_with(tail) {
                    keep = keep.max(tail.len());
                    break;
                }
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }
}

impl Model {
    /// Generates after `prompt` in the model's own session (see [`Model::generate_in`]),
    /// calling `on_token` for every token; the callback returns `false` to stop.
    ///
    /// ```no_run
    /// # let mut model = waste::Model::open("models/stories260K", &waste::Options::default())?;
    /// let prompt = model.tokenize_prompt("Once upon a time")?;
    /// let mut text = String::new();
    /// let params = waste::GenerateParams { max_tokens: 16, ..waste::GenerateParams::greedy() };
    /// model.generate(&prompt, &params, |ev| { text.push_str(ev.text); true })?;
    /// # Ok::<(), waste::Error>(())
    /// ```
    pub fn generate(&mut self, prompt: &[u32], params: &GenerateParams,
                    on_token: impl FnMut(&TokenEvent) -> bool) -> Result<GenerateSummary> {
        let mut s = std::mem::replace(&mut self.session, Session::placeholder());
        let r = self.generate_in(&mut s, prompt, params, on_token);
        self.session = s;
        r
    }

    /// Generates in `session` after `prompt`, the whole conversation so far as tokens: the
    /// state the session holds for the prompt's first tokens is kept and only the rest is
    /// prefilled (the summary says how many of each); the session ends holding the prompt and
    /// every generated token.
    ///
    /// ```no_run
    /// # let mut model = waste::Model::open("models/stories260K", &waste::Options::default())?;
    /// let mut chat = model.new_session()?;
    /// let params = waste::GenerateParams { max_tokens: 16, ..waste::GenerateParams::greedy() };
    /// let first = model.tokenize_prompt("Once upon a time")?;
    /// model.generate_in(&mut chat, &first, &params, |_| true)?;
    /// // The next turn: the conversation so far, and more.
    /// let mut next = chat.tokens().to_vec();
    /// next.extend(model.tokenizer()?.tokenize(" The end."));
    /// let summary = model.generate_in(&mut chat, &next, &params, |_| true)?;
    /// assert!(summary.reused_tokens > 0);
    /// # Ok::<(), waste::Error>(())
    /// ```
    pub fn generate_in(&mut self, session: &mut Session, prompt: &[u32], params: &GenerateParams,
                       on_token: impl FnMut(&TokenEvent) -> bool) -> Result<GenerateSummary> {
        self.check_session(session)?;
        // The sampler works in the model's buffers, sized at open (and counted in its memory
        // plan): a token allocates nothing there. They go back whatever happens (checked first,
        // so a bad parameter keeps them).
        params.sampling.validate()?;
        if prompt.is_empty() {
            return Err(Error::arg("generate: the prompt has no tokens"));
        }
        if prompt.len() > self.context() {
            return Err(Error::new(ErrorKind::Context, format!(
                "the prompt is {} tokens, more than the context of {}", prompt.len(), self.context())));
        }
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= self.cfg_vocab()) {
            return Err(Error::arg(format!("token id {bad} is out of range (vocabulary of {})", self.cfg_vocab())));
        }
        let mut sampler = Sampler::with_buffers(&params.sampling, std::mem::take(&mut self.sample_buffers))?;
        let result = self.generate_with(session, prompt, params, on_token, &mut sampler);
        self.sample_buffers = sampler.into_buffers();
        if result.is_err() && session.is_recurrent() {
            // A pass broken midway may have advanced a recurrent state without its position.
            session.reset();
        }
        result
    }

    fn generate_with(&mut self, s: &mut Session, prompt: &[u32], params: &GenerateParams,
                     mut on_token: impl FnMut(&TokenEvent) -> bool, sampler: &mut Sampler) -> Result<GenerateSummary> {
        let start = Instant::now();
        let cont = s.continuation(prompt);
        if cont.reset {
            s.reset();
        } else {
            s.truncate(cont.keep, prompt);
        }
        s.history.extend_from_slice(&prompt[cont.keep..]);
        let mut activity = ExpertActivity::of(self.cache_stats());
        let first_activity = activity;
        self.run(&mut s.cache, &s.history[cont.keep..], LogitsOut::Last, None)?;
        // `pass` is the forward pass whose logits the next token is sampled from.
        let mut pass = start.elapsed();
        let mut prefill_time = pass;
        let (mut decode_time, mut decode_steps) = (Duration::ZERO, 0);
        let tok = self.tokenizer.as_ref();
        let mut detok = tok.map(|t| t.detokenizer_after(prompt));
        let mut stops = StopMatcher { stops: &params.stop, held: String::new() };
        let first = s.history.len();
        let mut reason = StopReason::MaxTokens;
        let mut index = 0;
        let mut generated = 0;
        while index < params.max_tokens {
            let t = Instant::now();
            let id = sampler.sample(self.logits(), &s.history);
            let sampling = t.elapsed();
            if index == 0 {
                prefill_time += sampling;
            } else {
                decode_time += sampling;
            }
            let token_time = pass + sampling;
            let now = ExpertActivity::of(self.cache_stats());
            let experts = ExpertActivity::between(&activity, &now);
            activity = now;
            // The token joins the session (an end-of-sequence token too: the conversation
            // continues after it), uncomputed until the next pass.
            s.history.push(id);
            if (params.stop_at_eos && self.eos.contains(&id)) || params.stop_tokens.contains(&id) {
                reason = StopReason::EndOfSequence;
                break;
            }
            generated += 1;
            let piece = match (&mut detok, self.tokenizer.as_ref()) {
                (Some(d), Some(t)) => d.push(t, id)?,
                _ => String::new(),
            };
            let (text, stopped) = stops.push(&piece);
            let ev = TokenEvent { id: Some(id), text: &text, index, token_time, elapsed: start.elapsed(), experts,
                logits: self.logits(), tokenizer: self.tokenizer.as_ref() };
            let go_on = on_token(&ev);
            index += 1;
            if stopped {
                reason = StopReason::StopString;
                break;
            }
            if !go_on {
                reason = StopReason::Callback;
                break;
            }
            if index == params.max_tokens {
                break;
            }
            if s.cache.pos >= self.context() {
                reason = StopReason::ContextFull;
                break;
            }
            let t = Instant::now();
            let last = s.history.len() - 1;
            self.run(&mut s.cache, &s.history[last..], LogitsOut::Last, None)?;
            pass = t.elapsed();
            decode_time += pass;
            decode_steps += 1;
        }
        if reason != StopReason::StopString {
            let mut rest = std::mem::take(&mut stops.held);
            if let Some(d) = &mut detok {
                let tail = d.finish();
                rest.push_str(&stops.push(&tail).0);
                rest.push_str(&std::mem::take(&mut stops.held));
            }
            if !rest.is_empty() {
                on_token(&TokenEvent { id: None, text: &rest, index, token_time: Duration::ZERO, elapsed: start.elapsed(),
                    experts: ExpertActivity::default(), logits: &[], tokenizer: self.tokenizer.as_ref() });
            }
        }
        // The engine stops here: the last token's purgeable slots are offered too.
        self.offer_all_idle();
        let prefilled = prompt.len() - cont.keep;
        let st = &mut self.stats;
        st.prefill_tokens += prefilled as u64;
        st.prefill_time += prefill_time;
        st.generated_tokens += generated as u64;
        st.decode_steps += decode_steps as u64;
        st.decode_time += decode_time;
        st.generations += 1;
        Ok(GenerateSummary {
            prompt_tokens: prompt.len(),
            reused_tokens: cont.keep,
            prefilled_tokens: prefilled,
            state_reset: cont.reset,
            tokens: generated,
            prefill_time,
            decode_time,
            decode_steps,
            stop_reason: reason,
            ids: s.history[first..first + generated].to_vec(),
            experts: ExpertActivity::between(&first_activity, &ExpertActivity::of(self.cache_stats())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    #[test]
    fn stop_strings_split_across_pieces_fire_and_are_withheld() {
        let stops = vec!["\nUser:".to_string()];
        let mut m = StopMatcher { stops: &stops, held: String::new() };
        assert_eq!(m.push("Hello"), ("Hello".to_string(), false));
        assert_eq!(m.push(" there\nUs"), (" there".to_string(), false));
        assert_eq!(m.push("er: hi"), (String::new(), true));
        let mut m = StopMatcher { stops: &stops, held: String::new() };
        assert_eq!(m.push("a\nUx"), ("a\nUx".to_string(), false));
    }
}
