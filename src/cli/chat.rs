//! `waste chat`: a conversation with a model, on a terminal or over a pipe. Each input line is a
//! user turn (a line ending in `\` continues on the next); the reply streams as it is generated.
//! Every turn renders the whole conversation with the model's chat template and generates in
//! the model's own session, which keeps the state of what it already holds: a turn computes
//! only its new tokens.
//!
//! Ctrl-C during a reply stops the reply (what was said stays in the conversation) and returns
//! to the prompt; Ctrl-C at the prompt, or the end of input, ends the chat. When standard input
//! is not a terminal there is no prompt and only the replies are printed, one per turn, so a
//! chat can be scripted; a summary line per turn goes to standard error either way.

use super::args::{path, val, Args, Command, Opt};
use super::commands::{model_options, model_path, sampling, summary_line, Failure, Outcome};
use super::out::{errln, outln, stdout_bytes};
use super::{HELP_OPT, MODEL_OPTS, SAMPLING_OPTS};
use std::path::Path;
use waste::format::json::{self, Json};
use waste::template::{ChatTemplate, RenderOptions};
use waste::{GenerateParams, Model};

pub const CHAT: Command = Command {
    name: "chat",
    usage: "chat MODEL [--system TEXT] [--template chatml|llama3|FILE] [--var NAME=JSON]... [options]",
    about: "Talk with a model: each line is a turn (end a line with \\ to continue it), the reply streams back, and \
the conversation stays in the session, so each turn computes only its new tokens. Commands: /reset, /stats, \
/save FILE, /load FILE, /system TEXT, /help, /quit. Ctrl-C stops a reply; Ctrl-C at the prompt or end of input \
quits. With piped input there is no prompt and only the replies are printed; one summary line per turn goes to \
stderr. The model's own chat template is used (tokenizer_config.json's chat_template, chat_template.jinja or \
chat_template.json) unless --template names another.",
    opts: &[&[
        val("system", "TEXT", "a system message that opens the conversation"),
        val("template", "NAME|FILE", "chat template: chatml, llama3, or a file (.jinja, a chat_template.json or a tokenizer_config.json)"),
        Opt { long: "var", short: None, value: Some("NAME=JSON"), repeat: true, path: false,
            help: "a variable for the template, e.g. enable_thinking=false (repeatable)" },
        path("load-state", "PATH", "start from a conversation saved with /save"),
        super::TRACE_OUT,
        super::LEARN,
    ], SAMPLING_OPTS, MODEL_OPTS, HELP_OPT],
    positionals: &["MODEL"],
};

/// Host data a saved chat keeps beside the session's state: its messages and system message.
const MAX_SAVED_CHAT: usize = 64 << 20;

/// The conversation as the template sees it, and what the session holds of it.
struct Conversation {
    template: ChatTemplate,
    system: Option<String>,
    /// User and assistant messages, in order.
    messages: Vec<(String, String)>,
    vars: Vec<(String, Json)>,
    /// The last turn: the rendered prompt, its tokens, and the reply's text and tokens as
    /// generated (`None` before the first turn, or when the reply cannot be followed exactly).
    last: Option<LastTurn>,
}

struct LastTurn {
    prompt_text: String,
    prompt: Vec<u32>,
    reply_text: String,
    reply: Vec<u32>,
}

impl Conversation {
    /// The messages as the template's `messages` variable.
    fn to_json(&self) -> Json {
        let m = |role: &str, content: &str| Json::object([("role", Json::str(role)), ("content", Json::str(content))]);
        let system = self.system.iter().map(|s| m("system", s));
        Json::Array(system.chain(self.messages.iter().map(|(r, c)| m(r, c))).collect())
    }

    /// The conversation so far and a generation prompt, as tokens, and its rendered text.
    ///
    /// When the template renders the conversation as the last prompt, the reply, and then the
    /// new text (templates that only append), the tokens are the last prompt's, the reply's as
    /// generated, and the new text's: the session holds all but the new ones. Otherwise (a
    /// template that rewrites history, e.g. drops reasoning) the whole rendering is tokenized
    /// and the session keeps what it shares with it.
    fn prompt(&self, model: &Model) -> Result<(Vec<u32>, String), Failure> {
        let opts = RenderOptions { add_generation_prompt: true, vars: self.vars.clone(), ..RenderOptions::default() };
        let pieces = self.template.render(&self.to_json(), &opts)?;
        let text = waste::template::pieces_text(&pieces);
        let tok = model.tokenizer()?;
        if let Some(last) = &self.last {
            let before = last.prompt_text.len() + last.reply_text.len();
            if text.len() >= before && text.starts_with(&last.prompt_text) && text[last.prompt_text.len()..].starts_with(&last.reply_text) {
                let mut ids = last.prompt.clone();
                ids.extend_from_slice(&last.reply);
                ids.extend(tok.tokenize_pieces_continued(&waste::template::pieces_after(&pieces, before)));
                return Ok((ids, text));
            }
        }
        Ok((tok.tokenize_pieces(&pieces), text))
    }
    /// What `/save` keeps beside the state.
    fn saved(&self) -> String {
        Json::object([
            ("waste_chat", Json::uint(1)),
            ("system", self.system.as_deref().map_or(Json::Null, Json::str)),
            ("messages", self.to_json()),
        ]).to_string_compact()
    }

    /// Takes back what `/save` kept; false when the state holds no chat (another host saved it).
    fn restore(&mut self, host: &[u8]) -> bool {
        let Ok(doc) = json::parse(host) else { return false };
        let Some(list) = doc.get("messages").and_then(Json::as_array) else { return false };
        let mut messages = Vec::new();
        for m in list {
            match (m.get("role").and_then(Json::as_str), m.get("content").and_then(Json::as_str)) {
                (Some("system"), Some(_)) => {}
                (Some(r), Some(c)) => messages.push((r.to_string(), c.to_string())),
                _ => return false,
            }
        }
        self.messages = messages;
        self.system = doc.get("system").and_then(Json::as_str).map(str::to_string);
        self.last = None;
        true
    }
}

/// The template the chat renders with: `--template` (a built-in name or a file), else the
/// model's own.
fn template(model: &Model, a: &Args) -> Result<ChatTemplate, Failure> {
    let chosen = match a.value("template") {
        Some(name) if ChatTemplate::BUILTINS.contains(&name) => ChatTemplate::builtin(name)?,
        Some(file) => ChatTemplate::from_file(Path::new(file), None)?,
        None => return Ok(model.chat_template()?),
    };
    Ok(model.with_special_tokens(chosen)?)
}

pub fn chat(a: &Args) -> Outcome {
    let (sampling, _) = sampling(a)?;
    let max_tokens = a.num("n", 1usize, waste::MAX_CONTEXT)?.unwrap_or(1024);
    let opts = model_options(a)?;
    let mut model = Model::open(model_path(a)?, &opts)?;
    let mut conv = Conversation { template: template(&model, a)?, system: a.value("system").map(str::to_string), messages: Vec::new(),
        vars: super::template::vars(a)?, last: None };
    let mut params = GenerateParams { max_tokens, sampling, stop: a.values("stop").iter().map(|s| s.to_string()).collect(),
        stop_at_eos: !a.flag("ignore-eos"), stop_tokens: model.end_of_turn_tokens(&conv.template) };
    if let Some(p) = a.path("load-state") {
        load(&mut model, &mut conv, p)?;
    }
    let mut trace = super::trace::TraceOut::start(a, &mut model);
    super::trace::learn(a, &mut model)?;
    for n in model.notes() {
        errln!("waste: {n}");
    }
    waste::host::catch_signals()?;
    let interactive = waste::host::stdin_is_tty();
    if interactive {
        errln!("waste chat: {} ({} template); /help for commands, Ctrl-C or Ctrl-D to quit", model.info().architecture,
            conv.template.name());
    }
    let mut input = TurnReader::default();
    loop {
        if interactive {
            stdout_bytes(b"> ")?;
        }
        let text = match input.next_turn()? {
            Turn::Text(t) => t,
            Turn::End => break,
        };
        if let Some(command) = text.strip_prefix('/') {
            match run_command(&mut model, &mut conv, command.trim())? {
                Next::Continue => continue,
                Next::Quit => break,
            }
        }
        if text.trim().is_empty() {
            continue;
        }
        conv.messages.push(("user".into(), text));
        reply(&mut model, &mut conv, &mut params)?;
        if let Some(t) = &mut trace {
            t.flush(&mut model)?;
        }
        super::trace::save_usage(a, &mut model, false)?;
    }
    if interactive {
        outln!();
    }
    Ok(())
}

/// Generates the assistant's reply to the conversation, streaming it to stdout; the reply (or
/// what was said of it before a Ctrl-C) joins the conversation.
fn reply(model: &mut Model, conv: &mut Conversation, params: &mut GenerateParams) -> Outcome {
    let (ids, prompt_text) = conv.prompt(model)?;
    if ids.len() >= model.context() {
        conv.messages.pop();
        errln!("waste chat: the conversation is {} tokens, the context {}: /reset, or a larger --ctx", ids.len(), model.context());
        return Ok(());
    }
    params.max_tokens = params.max_tokens.min(model.context() - ids.len()).max(1);
    let interrupts = waste::host::interrupts();
    let (mut said, mut write_error) = (String::new(), None);
    let summary = model.generate(&ids, params, |ev| {
        said.push_str(ev.text);
        if let Err(f) = stdout_bytes(ev.text.as_bytes()) {
            write_error = Some(f);
            return false;
        }
        waste::host::interrupts() == interrupts
    });
    let stopped = waste::host::interrupts() != interrupts;
    conv.messages.push(("assistant".into(), said.clone()));
    conv.last = None;
    if let Some(f) = write_error {
        return Err(f);
    }
    outln!();
    let summary = summary?;
    // The reply can be followed exactly next turn when its text is all of its tokens' text
    // (a stop string cuts the text inside a token).
    if summary.stop_reason != waste::StopReason::StopString {
        conv.last = Some(LastTurn { prompt_text, prompt: ids, reply_text: said, reply: summary.ids.clone() });
    }
    let experts = model.cache_stats().map(super::moe::stats_suffix).unwrap_or_default();
    errln!("{}{}", summary_line(&summary, None, &experts), if stopped { " (interrupted)" } else { "" });
    Ok(())
}

enum Next {
    Continue,
    Quit,
}

const HELP: &str = "\
/reset          forget the conversation (the system message stays)
/stats          tokens, speed, expert cache and memory
/save FILE      save the conversation and its state
/load FILE      continue a conversation saved with /save
/system TEXT    set the system message (empty: none); the conversation is computed again
/help           this list
/quit           leave (also Ctrl-D, or Ctrl-C at the prompt)
";

fn run_command(model: &mut Model, conv: &mut Conversation, line: &str) -> Result<Next, Failure> {
    let (name, arg) = line.split_once(char::is_whitespace).map_or((line, ""), |(n, r)| (n, r.trim()));
    let result = match (name, arg) {
        ("quit" | "exit" | "q", _) => return Ok(Next::Quit),
        ("help" | "?", _) => stdout_bytes(HELP.as_bytes()),
        ("reset", _) => {
            model.reset();
            conv.messages.clear();
            conv.last = None;
            Ok(())
        }
        ("stats", _) => print_stats(model),
        ("system", text) => {
            conv.system = (!text.is_empty()).then(|| text.to_string());
            conv.last = None;
            Ok(())
        }
        ("save", "") | ("load", "") => Err(Failure::Usage(format!("/{name} needs a FILE"))),
        ("save", file) => model.session().save_state_with(file, conv.saved().as_bytes()).map_err(Failure::from)
            .map(|()| errln!("saved {} tokens to {file}", model.session().tokens().len())),
        ("load", file) => load(model, conv, Path::new(file)),
        _ => Err(Failure::Usage(format!("unknown command /{name} (/help lists them)"))),
    };
    match result {
        Ok(()) => Ok(Next::Continue),
        // A failed command is reported and the chat goes on; only a closed stdout ends it.
        Err(Failure::Closed) => Err(Failure::Closed),
        Err(Failure::Usage(m)) => {
            errln!("waste chat: {m}");
            Ok(Next::Continue)
        }
        Err(Failure::Run(e)) => {
            errln!("waste chat: {e}");
            Ok(Next::Continue)
        }
    }
}

/// Loads a saved conversation: its state into the model's session, its messages into `conv`.
fn load(model: &mut Model, conv: &mut Conversation, file: &Path) -> Outcome {
    let host = model.session_mut().load_state_with(file, MAX_SAVED_CHAT)?;
    if conv.restore(&host) {
        errln!("loaded {} messages, {} tokens from {}", conv.messages.len(), model.session().tokens().len(), file.display());
    } else {
        conv.messages.clear();
        errln!("waste chat: warning: {} holds a session but no chat messages: the next turn starts a new conversation",
            file.display());
    }
    Ok(())
}

fn print_stats(model: &Model) -> Outcome {
    let s = model.stats();
    let rate = |n: u64, t: std::time::Duration| if t.as_secs_f64() > 0.0 { n as f64 / t.as_secs_f64() } else { 0.0 };
    let h = super::plan::human;
    outln!("session   {} tokens held of a {}-token context", model.session().tokens().len(), model.context());
    outln!("prefill   {} tokens in {:.2} s ({:.1} tok/s)", s.prefill_tokens, s.prefill_time.as_secs_f64(), rate(s.prefill_tokens, s.prefill_time));
    outln!("decode    {} tokens in {:.2} s ({:.1} tok/s)", s.generated_tokens, s.decode_time.as_secs_f64(), rate(s.decode_steps, s.decode_time));
    if let Some(c) = &s.cache {
        outln!("experts   {} hits, {} misses ({:.1}% hit), {} read, {:.2} s I/O wait{}", c.hits, c.misses, 100.0 * c.hit_rate(),
            h(c.bytes_read).trim(), c.io_wait.as_secs_f64(), super::moe::disk_busy(c.disk_busy, c.bytes_read));
    }
    let used = model.memory_use();
    outln!("memory    {} held of a {} budget (state {}, expert cache {})", h(used.total()).trim(), h(model.budget().bytes).trim(),
        h(used.state).trim(), h(used.expert_cache).trim());
    Ok(())
}

enum Turn {
    Text(String),
    /// End of input, or Ctrl-C at the prompt.
    End,
}

/// Reads turns from standard input: lines, where a line ending in `\` continues on the next.
#[derive(Default)]
struct TurnReader {
    buf: Vec<u8>,
    eof: bool,
}

impl TurnReader {
    fn next_turn(&mut self) -> Result<Turn, Failure> {
        let mut turn = String::new();
        loop {
            let Some(line) = self.next_line()? else {
                return Ok(if turn.is_empty() { Turn::End } else { Turn::Text(turn) });
            };
            match line.strip_suffix('\\') {
                Some(part) => {
                    turn.push_str(part);
                    turn.push('\n');
                }
                None => {
                    turn.push_str(&line);
                    return Ok(Turn::Text(turn));
                }
            }
        }
    }

    /// The next line without its line ending; `None` at the end of input or on Ctrl-C.
    fn next_line(&mut self) -> Result<Option<String>, Failure> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=i).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return utf8(line).map(Some);
            }
            if self.eof {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return utf8(std::mem::take(&mut self.buf)).map(Some);
            }
            let mut chunk = [0u8; 4096];
            match waste::host::read_stdin_once(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                // Only a caught signal (Ctrl-C, SIGTERM) interrupts the read: it ends the chat.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(None),
                Err(e) => return Err(Failure::Run(waste::Error::io(Path::new("<stdin>"), "read", e))),
            }
        }
    }
}

fn utf8(bytes: Vec<u8>) -> Result<String, Failure> {
    String::from_utf8(bytes).map_err(|_| Failure::Usage("the input is not UTF-8 text".into()))
}
