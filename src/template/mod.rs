//! Chat templates: a Jinja interpreter, written here, that renders Hugging Face chat templates
//! byte for byte as Python's jinja2 does under transformers' `apply_chat_template`, and that
//! knows which characters of the prompt are markup and which are content.
//!
//! ```no_run
//! use waste::format::json;
//! use waste::template::{ChatTemplate, RenderOptions};
//!
//! let tpl = ChatTemplate::from_model_dir("models/qwen".as_ref(), None)?
//!     .unwrap_or(ChatTemplate::builtin("chatml")?);
//! let messages = json::parse(br#"[{"role": "user", "content": "Hi"}]"#).map_err(|e| waste::Error::arg(e.to_string()))?;
//! let pieces = tpl.render(&messages, &RenderOptions { add_generation_prompt: true, ..RenderOptions::default() })?;
//! print!("{}", waste::template::pieces_text(&pieces));
//! # Ok::<(), waste::Error>(())
//! ```
//!
//! The environment is transformers': `ImmutableSandboxedEnvironment` with `trim_blocks`,
//! `lstrip_blocks`, the loop-control extension and `{% generation %}`; `tojson` is
//! `json.dumps(ensure_ascii=False)`; `raise_exception`, `strftime_now` and transformers'
//! `namespace` and `dict` are globals. `docs/TEMPLATES.md` lists what is supported.
//!
//! **Provenance.** The result is a list of [`Piece`]s. Text from the template itself, from the
//! special-token variables (`bos_token`, ...) and what the template computes on its own is
//! [`Piece::Markup`]; text that comes from the messages or the caller's extra variables —
//! copied, sliced, stripped, replaced, or serialized by `tojson` — is [`Piece::Content`]. A
//! user who types `<|im_end|>` in a message gets content, and
//! [`crate::Tokenizer::tokenize_pieces`] never turns content into a control token.
//!
//! Files: `lexer` (source → tokens), `parser` and `ast` (tokens → tree), `eval` (statements,
//! scopes, limits), `expr` (expressions), `call` (macros, globals), `filters`, `predicates`
//! (jinja2 tests), `methods` (Python methods), `value`, `pyfmt` (Python's text forms), `pystr`
//! (Python string algorithms), `pstr` (provenance strings), `strftime`, `load` (finding and
//! reading templates), `walk` (checks over the parsed tree).

mod ast;
mod call;
mod eval;
mod expr;
mod filters;
mod lexer;
mod load;
mod methods;
mod parser;
mod predicates;
mod pstr;
mod pyfmt;
mod pystr;
mod strftime;
mod value;
mod walk;

pub use load::{special_tokens_in_dir, NAMED_SPECIAL_TOKENS};
pub use strftime::DateTime;

use crate::error::{Error, ErrorKind, Result};
use crate::format::json::Json;
use pstr::Origin;
use value::{Dict, Value};

/// A run of rendered text and where it came from. Adjacent pieces differ in kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// The template's own text, special tokens, and what the template computed.
    Markup(String),
    /// The caller's data (messages and extra variables).
    Content(String),
}

impl Piece {
    /// The piece's text (a special token's text for markup).
    pub fn text(&self) -> &str {
        match self {
            Piece::Markup(s) | Piece::Content(s) => s,
        }
    }

    /// True for a special token the template wrote (markup), false for text.
    pub fn is_markup(&self) -> bool {
        matches!(self, Piece::Markup(_))
    }
}

/// The pieces' text, concatenated: the prompt as Hugging Face renders it.
/// The pieces of a rendering after its first `skip` bytes (which must end on a character
/// boundary): what a later rendering adds to an earlier one it begins with.
pub fn pieces_after(pieces: &[Piece], mut skip: usize) -> Vec<Piece> {
    let mut out = Vec::new();
    for p in pieces {
        let t = p.text();
        if skip >= t.len() {
            skip -= t.len();
            continue;
        }
        let rest = t.get(skip..).unwrap_or("").to_string();
        skip = 0;
        out.push(if p.is_markup() { Piece::Markup(rest) } else { Piece::Content(rest) });
    }
    out
}

/// The pieces' text, concatenated.
pub fn pieces_text(pieces: &[Piece]) -> String {
    pieces.iter().map(Piece::text).collect()
}

/// What `strftime_now()` reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Clock {
    /// The system clock, in UTC (no time-zone database is read).
    #[default]
    SystemUtc,
    /// A fixed date and time (reproducible prompts, tests).
    Fixed(DateTime),
}

/// The inputs of a render besides the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// End the prompt with the assistant's header, for generation.
    pub add_generation_prompt: bool,
    /// Extra template variables (`enable_thinking`, `date_string`, `tools`, ...). They are
    /// content; they override special tokens of the same name, and `tools`/`documents`
    /// (otherwise `None`). `messages` and `add_generation_prompt` are refused here.
    pub vars: Vec<(String, Json)>,
    /// The time `strftime_now` sees.
    pub clock: Clock,
}

/// A chat template, parsed, with the special tokens it is rendered with.
#[derive(Debug)]
pub struct ChatTemplate {
    template: ast::Template,
    special_tokens: Vec<(String, String)>,
    end_of_turn: Option<String>,
    /// A built-in's end of turn, which the special tokens do not change.
    builtin: bool,
}

impl ChatTemplate {
    /// Parses template source. `name` is what errors call it (a path, or a built-in's name);
    /// `special_tokens` are the named tokens passed as variables (`("eos_token", "</s>")`),
    /// and `eos_token` among them is the end-of-turn string.
    pub fn parse(name: &str, source: &str, special_tokens: Vec<(String, String)>) -> Result<ChatTemplate> {
        let source = lexer::normalize_source(source);
        let err = |msg: String, pos: usize| {
            let line = source.as_bytes()[..pos.min(source.len())].iter().filter(|&&b| b == b'\n').count() + 1;
            Error::new(ErrorKind::Template, format!("{name}: line {line}: {msg}"))
        };
        let tokens = lexer::tokenize(&source).map_err(|e| err(e.msg, e.pos))?;
        let body = parser::parse(tokens).map_err(|e| err(e.msg, e.pos))?;
        walk::check_names(&body, &filters::is_filter, &predicates::is_test).map_err(|e| err(e.msg, e.pos))?;
        let end_of_turn = special_tokens.iter().find(|(k, _)| k == "eos_token").map(|(_, v)| v.clone());
        Ok(ChatTemplate { template: ast::Template { name: name.to_string(), source, body }, special_tokens, end_of_turn, builtin: false })
    }

    /// The template of a model directory (a Hugging Face checkpoint or a container, both of
    /// which keep the tokenizer files beside the weights): `chat_template.jinja`, else
    /// `chat_template.json`, else `tokenizer_config.json`'s `chat_template`. `Ok(None)` when
    /// there is none. `name` picks one of several named templates (a list-form
    /// `chat_template`, or `additional_chat_templates/NAME.jinja`); `None` means "default".
    pub fn from_model_dir(dir: &std::path::Path, name: Option<&str>) -> Result<Option<ChatTemplate>> {
        load::from_model_dir(dir, name)
    }

    /// A template file: a `tokenizer_config.json` or `chat_template.json` (its `chat_template`
    /// field), or Jinja source (any other file). Special tokens come from the JSON file itself,
    /// else from a `tokenizer_config.json` beside the file.
    pub fn from_file(path: &std::path::Path, name: Option<&str>) -> Result<ChatTemplate> {
        load::from_file(path, name)
    }

    /// A built-in template written here: `chatml` (`<|im_start|>role\n...<|im_end|>`, end of
    /// turn `<|im_end|>`) or `llama3` (Llama 3 headers, end of turn `<|eot_id|>`).
    pub fn builtin(name: &str) -> Result<ChatTemplate> {
        load::builtin(name)
    }

    /// The names [`ChatTemplate::builtin`] accepts.
    pub const BUILTINS: [&'static str; 2] = ["chatml", "llama3"];

    /// What errors call the template.
    pub fn name(&self) -> &str {
        &self.template.name
    }

    /// The source, as jinja2 reads it (newlines normalized, one final newline dropped).
    pub fn source(&self) -> &str {
        &self.template.source
    }

    /// The named special tokens passed to the template, `(variable, text)`.
    pub fn special_tokens(&self) -> &[(String, String)] {
        &self.special_tokens
    }

    /// The same template rendered with other special tokens (a model's, for a built-in or a
    /// template file used with it); `eos_token` among them becomes the end of turn, except for
    /// a built-in, which keeps its own.
    pub fn with_special_tokens(mut self, special_tokens: Vec<(String, String)>) -> ChatTemplate {
        if !self.builtin {
            self.end_of_turn = special_tokens.iter().find(|(k, _)| k == "eos_token").map(|(_, v)| v.clone());
        }
        self.special_tokens = special_tokens;
        self
    }

    /// The string that ends an assistant turn: the built-in's, or the model's `eos_token`.
    pub fn end_of_turn(&self) -> Option<&str> {
        self.end_of_turn.as_deref()
    }

    /// Renders `messages` (a JSON array of message objects, `content` a string or a list of
    /// parts; every key is passed through). The variables are transformers': `messages` (with
    /// a message's `reasoning_content`/`thinking`/`reasoning` copied into both `thinking` and
    /// `reasoning_content`, as transformers does), `add_generation_prompt`, `tools = None`,
    /// `documents = None`, the special tokens, then `opts.vars`.
    ///
    /// Errors are [`ErrorKind::Template`]: `raise_exception(msg)` gives exactly `msg`; any other
    /// failure names the template and line. Limits (output size, steps, call depth) make a
    /// hostile template an error, never a hang or a crash.
    pub fn render(&self, messages: &Json, opts: &RenderOptions) -> Result<Vec<Piece>> {
        self.render_with_limits(messages, opts, eval::Limits::default())
    }

    /// The rendered text alone.
    pub fn render_text(&self, messages: &Json, opts: &RenderOptions) -> Result<String> {
        Ok(pieces_text(&self.render(messages, opts)?))
    }

    fn render_with_limits(&self, messages: &Json, opts: &RenderOptions, limits: eval::Limits) -> Result<Vec<Piece>> {
        let Some(list) = messages.as_array() else {
            return Err(Error::arg(format!("messages must be a JSON array of message objects, not {}", messages.type_name())));
        };
        let mut vars: Vec<(String, Value)> = Vec::new();
        for (k, v) in &self.special_tokens {
            vars.push((k.clone(), Value::markup_str(v)));
        }
        vars.push(("tools".into(), Value::none()));
        vars.push(("documents".into(), Value::none()));
        for (k, v) in &opts.vars {
            if k == "messages" || k == "add_generation_prompt" {
                return Err(Error::arg(format!("variable `{k}` is set by the renderer and cannot be passed as an extra variable")));
            }
            vars.push((k.clone(), Value::from_json(v, Origin::Content)));
        }
        vars.push(("messages".into(), Value::list(list.iter().map(alias_reasoning).collect(), Origin::Content)));
        vars.push(("add_generation_prompt".into(), Value::bool(opts.add_generation_prompt)));
        let clock = match opts.clock {
            Clock::Fixed(dt) => dt,
            Clock::SystemUtc => DateTime::now_utc(),
        };
        let parts = eval::render(&self.template, vars, clock, limits).map_err(|e| self.error(e))?;
        Ok(parts.into_iter().map(|(t, o)| if o == Origin::Markup { Piece::Markup(t) } else { Piece::Content(t) }).collect())
    }

    fn error(&self, e: eval::RenderError) -> Error {
        match e.class {
            eval::ErrorClass::Raised => Error::new(ErrorKind::Template, e.msg),
            _ => {
                let at = e.pos.map(|p| format!("line {}: ", self.template.line_of(p))).unwrap_or_default();
                Error::new(ErrorKind::Template, format!("{}: {at}{}", self.template.name, e.msg))
            }
        }
    }
}

/// transformers copies a message's reasoning (`reasoning_content`, else `thinking`, else
/// `reasoning`, the first not null) into `thinking` and `reasoning_content`:
/// `{"thinking": r, **message, "reasoning_content": r}`.
fn alias_reasoning(m: &Json) -> Value {
    let msg = Value::from_json(m, Origin::Content);
    let Value::Dict(d) = &msg else { return msg };
    let reasoning = ["reasoning_content", "thinking", "reasoning"].iter().find_map(|k| d.get_str(k).filter(|v| !v.is_none()));
    let Some(r) = reasoning.cloned() else { return msg };
    let key = |k: &str| Value::Str(pstr::PStr::content(k));
    let mut out = Dict::new(Origin::Content);
    out.insert(key("thinking"), r.clone());
    for (k, v) in d.entries() {
        out.insert(k.clone(), v.clone());
    }
    out.insert(key("reasoning_content"), r);
    Value::dict(out)
}

#[cfg(test)]
mod tests;
