//! The model thread: it owns the model and its slots (one session each), takes jobs from the
//! bounded queue in arrival order, turns each request into prompt tokens (messages through the
//! chat template, markup and content kept apart), picks the slot whose conversation shares the
//! most of the prompt (else the least recently used), generates, and sends each token back to
//! the job's connection as an [`Event`]. A job whose client has gone, or a stopping server,
//! ends its generation at the next token.

use super::openai::{ApiError, Endpoint, Prompt, Request, TokenLogprob, Usage};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;
use waste::format::json::Json;
use waste::template::{ChatTemplate, Clock, RenderOptions};
use waste::{ErrorKind, GenerateParams, Model, Options, Session, StopReason, TokenEvent};

/// A request waiting for the model, with the way back to its connection.
pub struct Job {
    pub request: Request,
    pub events: Sender<Event>,
    /// Set by the connection when its client has gone.
    pub cancel: Arc<AtomicBool>,
}

/// What the model thread tells a connection, in this order: `Started` (the prompt is
/// accepted), `Token`s, then `Done`; or `Failed` at any point.
#[derive(Debug)]
pub enum Event {
    Started,
    /// Text that became final (possibly empty when only a log probability is reported).
    Token { text: String, logprob: Option<TokenLogprob> },
    Done { usage: Usage, finish: Finish, slot: usize },
    Failed(ApiError),
}

/// How a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// End of sequence or of turn, or a stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
    /// The client went away.
    Cancelled,
}

impl Finish {
    pub fn reason(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// What the model thread opens.
pub struct Setup {
    pub model_dir: PathBuf,
    /// `sessions` is set to the slot count.
    pub options: Options,
    /// The chat template (`None`: chat requests are refused, completions still work).
    pub template: Option<ChatTemplate>,
    pub slots: usize,
    /// `--learn`: count expert usage for the learned hotlist.
    pub learn: bool,
}

/// One conversation the server keeps warm.
struct Slot {
    /// `None`: the model's own session.
    session: Option<Session>,
    /// When the slot last served a request (a counter of requests).
    last_used: u64,
}

/// The model, its slots, and what every request needs from them.
pub struct Engine {
    model: Model,
    template: Option<ChatTemplate>,
    /// Tokens that end an assistant's turn under the template.
    end_of_turn: Vec<u32>,
    slots: Vec<Slot>,
    served: u64,
    /// `--learn`: when to write the usage file.
    learning: Option<Learning>,
}

/// `--learn`'s bookkeeping.
struct Learning {
    /// Requests have run since the usage file was last written.
    unsaved: bool,
    /// The usage file has been written once (its path was told).
    told: bool,
    /// When the usage file was last written (or tried).
    last: std::time::Instant,
}

/// `--learn` writes the usage file when the queue goes idle, and at least this often while it
/// stays busy (between two requests, a few milliseconds each time).
const LEARN_SAVE_EVERY: Duration = Duration::from_secs(60);

/// The server is stopping: what in-flight and queued requests are told.
fn stopping() -> ApiError {
    ApiError::status(503, "the server is shutting down").with_code("server_shutting_down")
}

impl Engine {
    /// Opens the model with room for `setup.slots` sessions and makes them.
    pub fn open(setup: Setup) -> waste::Result<Engine> {
        let options = Options { sessions: setup.slots, ..setup.options };
        let mut model = Model::open(&setup.model_dir, &options)?;
        if setup.learn {
            model.learn_usage(true).map_err(|e| waste::Error::arg(format!("option `--learn`: {}", e.message())))?;
        }
        let mut slots = vec![Slot { session: None, last_used: 0 }];
        for _ in 1..setup.slots {
            slots.push(Slot { session: Some(model.new_session()?), last_used: 0 });
        }
        let end_of_turn = setup.template.as_ref().map_or_else(Vec::new, |t| model.end_of_turn_tokens(t));
        let learning = setup.learn.then(|| Learning { unsaved: false, told: false, last: std::time::Instant::now() });
        Ok(Engine { model, template: setup.template, end_of_turn, slots, served: 0, learning })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// Serves jobs in arrival order until `stop` is set; then every job still queued is told
    /// the server is stopping.
    pub fn serve(mut self, jobs: Receiver<Job>, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            match jobs.recv_timeout(Duration::from_millis(200)) {
                Ok(job) => {
                    self.run_guarded(job, stop);
                    if let Some(l) = &mut self.learning {
                        l.unsaved = true;
                        // A queue that never goes idle still writes, once a minute.
                        if l.last.elapsed() >= LEARN_SAVE_EVERY {
                            self.save_usage();
                        }
                    }
                }
                // Idle: the moment to write what `--learn` counted, delaying no request.
                Err(RecvTimeoutError::Timeout) => self.save_usage(),
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            let _ = job.events.send(Event::Failed(stopping()));
        }
        self.save_usage();
    }

    /// `--learn`: adds what was counted since the last write to the usage file. A failure
    /// is told and tried again after the next request (the counts are kept until written).
    fn save_usage(&mut self) {
        let Some(l) = self.learning.as_mut().filter(|l| l.unsaved) else { return };
        l.unsaved = false;
        l.last = std::time::Instant::now();
        match self.model.write_usage(None) {
            Ok(path) if !l.told => {
                l.told = true;
                super::tell(&format!("waste serve: --learn: expert usage added to {} (after each burst of requests)", path.display()));
            }
            Ok(_) => {}
            Err(e) => super::tell(&format!("waste serve: warning: --learn: {e} (give a writable --usage-file F)")),
        }
    }

    /// Runs a job; a panic (a bug) fails that request with a 500 — its connection sees the
    /// channel close — and empties every slot, whose state it may have left half written.
    fn run_guarded(&mut self, job: Job, stop: &AtomicBool) {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| self.run(job, stop)));
        if r.is_err() {
            self.model.reset();
            for s in self.slots.iter_mut().filter_map(|s| s.session.as_mut()) {
                s.reset();
            }
        }
    }

    fn run(&mut self, job: Job, stop: &AtomicBool) {
        let Job { request, events, cancel } = job;
        if cancel.load(Ordering::Relaxed) {
            let _ = events.send(Event::Done { usage: Usage::default(), finish: Finish::Cancelled, slot: 0 });
            return;
        }
        let tokens = match self.prompt_tokens(&request) {
            Ok(t) => t,
            Err(e) => {
                let _ = events.send(Event::Failed(e));
                return;
            }
        };
        let ctx = self.model.context();
        if tokens.len() > ctx {
            let e = ApiError::param(if request.endpoint == Endpoint::Chat { "messages" } else { "prompt" }, format!(
                "this model's context is {ctx} tokens, but the prompt is {} tokens (see --ctx)", tokens.len()));
            let _ = events.send(Event::Failed(e.with_code("context_length_exceeded")));
            return;
        }
        if events.send(Event::Started).is_err() {
            return;
        }
        let slot = self.choose_slot(&tokens);
        self.served += 1;
        self.slots[slot].last_used = self.served;
        let params = GenerateParams {
            max_tokens: request.max_tokens.unwrap_or(ctx),
            sampling: request.sampling.clone(),
            stop: request.stop.clone(),
            stop_at_eos: true,
            stop_tokens: if request.endpoint == Endpoint::Chat { self.end_of_turn.clone() } else { Vec::new() },
        };
        let top = request.logprobs;
        let on_token = |ev: &TokenEvent| {
            let logprob = match (top, ev.id) {
                (Some(n), Some(id)) => Some(token_logprob(ev, id, n)),
                _ => None,
            };
            let sent = (logprob.is_none() && ev.text.is_empty())
                || events.send(Event::Token { text: ev.text.to_string(), logprob }).is_ok();
            sent && !cancel.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed)
        };
        let result = match self.slots[slot].session.as_mut() {
            Some(s) => self.model.generate_in(s, &tokens, &params, on_token),
            None => self.model.generate(&tokens, &params, on_token),
        };
        let event = match result {
            Ok(_) if stop.load(Ordering::Relaxed) => Event::Failed(stopping()),
            Ok(s) => Event::Done {
                usage: Usage { prompt: s.prompt_tokens, completion: s.tokens, cached: s.reused_tokens },
                finish: match s.stop_reason {
                    StopReason::MaxTokens | StopReason::ContextFull => Finish::Length,
                    StopReason::EndOfSequence | StopReason::StopString => Finish::Stop,
                    StopReason::Callback => Finish::Cancelled,
                },
                slot,
            },
            Err(e) => Event::Failed(api_error(e)),
        };
        let _ = events.send(event);
    }

    /// The request's prompt as tokens: messages through the chat template, text as `waste run`
    /// tokenizes it, ids as given (checked against the vocabulary).
    fn prompt_tokens(&self, r: &Request) -> Result<Vec<u32>, ApiError> {
        let tokens = match &r.prompt {
            Prompt::Messages(m) => self.chat_tokens(m, &r.template_vars)?,
            Prompt::Text(t) => self.model.tokenize_prompt(t).map_err(api_error)?,
            Prompt::Ids(ids) => {
                let vocab = self.model.info().vocab;
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(ApiError::param("prompt", format!("token id {bad} is out of range (the vocabulary has {vocab})")));
                }
                ids.clone()
            }
        };
        if tokens.is_empty() {
            return Err(ApiError::param("prompt", "the prompt has no tokens"));
        }
        Ok(tokens)
    }

    /// `messages` rendered with the template and tokenized: special-token strings become
    /// control tokens only where the template wrote them (what `Model::chat_tokens` does, on
    /// the branch that adds it: kept here until that lands).
    fn chat_tokens(&self, messages: &Json, vars: &[(String, Json)]) -> Result<Vec<u32>, ApiError> {
        let Some(t) = &self.template else {
            return Err(ApiError::status(400, "this model has no chat template: start the server with --template chatml|llama3|FILE, or use /v1/completions")
                .with_code("no_chat_template"));
        };
        let opts = RenderOptions { add_generation_prompt: true, vars: vars.to_vec(), clock: Clock::SystemUtc };
        let pieces = t.render(messages, &opts).map_err(api_error)?;
        Ok(self.model.tokenizer().map_err(api_error)?.tokenize_pieces(&pieces))
    }

    /// The slot for `prompt` (see [`choose_slot`]).
    fn choose_slot(&self, prompt: &[u32]) -> usize {
        let held: Vec<(&[u32], u64)> = self.slots.iter().map(|s| {
            (s.session.as_ref().map_or(self.model.session().tokens(), Session::tokens), s.last_used)
        }).collect();
        choose_slot(&held, prompt)
    }
}

/// Picks a slot for `prompt` among slots holding `(tokens, last used)`: the one sharing the
/// longest prefix with the prompt, provided that prefix is at least half of what the slot
/// holds (so a new conversation that merely shares a system prompt does not evict a long
/// one while another slot is free: a prompt that begins with a slot's whole history always
/// qualifies); otherwise the least recently used slot.
pub fn choose_slot(slots: &[(&[u32], u64)], prompt: &[u32]) -> usize {
    let mut best: Option<(usize, usize)> = None;
    for (i, (held, _)) in slots.iter().enumerate() {
        let common = held.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        if common > 0 && common * 2 >= held.len() && best.is_none_or(|(c, _)| common > c) {
            best = Some((common, i));
        }
    }
    best.map(|(_, i)| i).unwrap_or_else(|| {
        slots.iter().enumerate().min_by_key(|(_, (_, used))| *used).map_or(0, |(i, _)| i)
    })
}

/// A token's log probability and its `top` most likely alternatives, from the logits it was
/// drawn from.
fn token_logprob(ev: &TokenEvent, id: u32, top: usize) -> TokenLogprob {
    let name = |id: u32| -> (String, Vec<u8>) {
        let bytes = ev.tokenizer.and_then(|t| t.token_bytes(id).ok()).unwrap_or(&[]).to_vec();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    };
    let (token, bytes) = name(id);
    let candidates = if top == 0 { Vec::new() } else { waste::sample::top_k_distribution(ev.logits, top) };
    // The token's own figure is its alternative's when it is one, so the two agree exactly.
    let logprob = match candidates.iter().find(|c| c.id == id) {
        Some(c) => c.prob.ln(),
        None => waste::sample::log_probability(ev.logits, id).unwrap_or(f64::NEG_INFINITY),
    };
    let top = candidates.into_iter().map(|c| {
        let (t, b) = name(c.id);
        (t, b, c.prob.ln())
    }).collect();
    TokenLogprob { token, bytes, logprob, top }
}

/// A library error as an API error: the caller's mistakes (arguments, templates, context) are
/// 400s, anything else the server's own 500.
fn api_error(e: waste::Error) -> ApiError {
    match e.kind() {
        ErrorKind::Context => ApiError::bad(e.message().to_string()).with_code("context_length_exceeded"),
        ErrorKind::Arg | ErrorKind::Template | ErrorKind::Tokenizer => ApiError::bad(e.message().to_string()),
        _ => ApiError::status(500, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::choose_slot;

    #[test]
    fn a_slot_is_continued_or_the_least_recently_used_taken() {
        let (a, b, empty): (&[u32], &[u32], &[u32]) = (&[1, 2, 3, 4, 5, 6], &[1, 2, 9], &[]);
        // The prompt continues slot 0's conversation.
        assert_eq!(choose_slot(&[(a, 5), (b, 7)], &[1, 2, 3, 4, 5, 6, 7]), 0);
        // It departs late from slot 0's: still the most shared.
        assert_eq!(choose_slot(&[(a, 5), (b, 7)], &[1, 2, 3, 4, 8]), 0);
        // Only a short shared start (a system prompt): the least recently used (the empty one).
        assert_eq!(choose_slot(&[(a, 5), (empty, 0)], &[1, 7, 7]), 1);
        assert_eq!(choose_slot(&[(a, 5), (b, 3)], &[8]), 1);
        assert_eq!(choose_slot(&[(b, 5), (a, 3)], &[1, 2, 9, 9]), 0);
    }
}
