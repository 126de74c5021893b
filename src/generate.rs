//! Generation: prefill the prompt, then sample, report and feed back one token at a time,
//! stopping at an end-of-sequence token, a stop string, the token limit, a full context, or
//! when the caller's callback says so.
//!
//! Stop strings are matched against the text as it streams: text that could still be the
//! beginning of a stop string is held back until it cannot, so a stop string split across
//! tokens fires and never reaches the caller.

use crate::error::Result;
use crate::sample::{Sampler, SamplingParams};
use crate::Model;
use std::time::{Duration, Instant};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends when the text contains one of these; the stop string is not reported.
    pub stop: Vec<String>,
    /// End at the model's end-of-sequence tokens (on by default).
    pub stop_at_eos: bool,
}

impl Default for GenerateParams {
    fn default() -> GenerateParams {
        GenerateParams { max_tokens: 256, sampling: SamplingParams::default(), stop: Vec::new(), stop_at_eos: true }
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
    pub prompt_tokens: usize,
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
    pub stop_reason: StopReason,
    /// The generated token ids.
    pub ids: Vec<u32>,
}

impl GenerateSummary {
    /// Decode speed: decode steps (one token each) per second of decode time; `None` when no
    /// step ran (a single token comes from the prefill alone).
    pub fn tokens_per_second(&self) -> Option<f64> {
        let s = self.decode_time.as_secs_f64();
        (self.decode_steps > 0 && s > 0.0).then(|| self.decode_steps as f64 / s)
    }

    /// Prefill speed: prompt tokens per second of prefill time.
    pub fn prefill_tokens_per_second(&self) -> Option<f64> {
        let s = self.prefill_time.as_secs_f64();
        (self.prompt_tokens > 0 && s > 0.0).then(|| self.prompt_tokens as f64 / s)
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
    /// Generates after `prompt` (appended to the session), calling `on_token` for every token;
    /// the callback returns `false` to stop.
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
                    mut on_token: impl FnMut(&TokenEvent) -> bool) -> Result<GenerateSummary> {
        let mut sampler = Sampler::new(&params.sampling)?;
        let start = Instant::now();
        self.eval(prompt)?;
        // `pass` is the forward pass whose logits the next token is sampled from.
        let mut pass = start.elapsed();
        let mut prefill_time = pass;
        let (mut decode_time, mut decode_steps) = (Duration::ZERO, 0);
        let tok = self.tokenizer.as_ref();
        let mut detok = tok.map(|t| t.detokenizer_after(prompt));
        let mut stops = StopMatcher { stops: &params.stop, held: String::new() };
        let mut history: Vec<u32> = prompt.to_vec();
        let mut ids = Vec::new();
        let mut reason = StopReason::MaxTokens;
        let mut index = 0;
        while index < params.max_tokens {
            let t = Instant::now();
            let id = sampler.sample(&self.state.logits, &history);
            let sampling = t.elapsed();
            if index == 0 {
                prefill_time += sampling;
            } else {
                decode_time += sampling;
            }
            let token_time = pass + sampling;
            if params.stop_at_eos && self.eos.contains(&id) {
                reason = StopReason::EndOfSequence;
                break;
            }
            history.push(id);
            ids.push(id);
            let piece = match (&mut detok, self.tokenizer.as_ref()) {
                (Some(d), Some(t)) => d.push(t, id)?,
                _ => String::new(),
            };
            let (text, stopped) = stops.push(&piece);
            let ev = TokenEvent { id: Some(id), text: &text, index, token_time, elapsed: start.elapsed() };
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
            if self.position() >= self.context() {
                reason = StopReason::ContextFull;
                break;
            }
            let t = Instant::now();
            self.eval(&[id])?;
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
                on_token(&TokenEvent { id: None, text: &rest, index, token_time: Duration::ZERO, elapsed: start.elapsed() });
            }
        }
        Ok(GenerateSummary {
            prompt_tokens: prompt.len(),
            tokens: ids.len(),
            prefill_time,
            decode_time,
            decode_steps,
            stop_reason: reason,
            ids,
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
