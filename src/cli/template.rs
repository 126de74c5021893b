//! `waste template`: render a chat template for a conversation, without loading weights.

use super::args::{flag, path, val, Args, Command, Opt};
use super::commands::{Failure, Outcome};
use super::HELP_OPT;
use std::io::Read;
use std::path::Path;
use waste::format::json::{self, Json};
use waste::template::{special_tokens_in_dir, ChatTemplate, Clock, DateTime, Piece, RenderOptions};

pub const TEMPLATE: Command = Command {
    name: "template",
    usage: "template (MODEL | --template-file PATH) --messages FILE [--no-generation-prompt] [--var NAME=JSON]... [--now DATE] [--json]",
    about: "Render a model's chat template for the conversation in FILE (a JSON array of {\"role\", \"content\"} \
messages; - reads stdin) and print the prompt exactly, as Hugging Face transformers renders it. The template is \
the model directory's (chat_template.jinja, chat_template.json or tokenizer_config.json's chat_template), \
--template-file's, or --template's. With --json, the prompt is printed as pieces, \
[{\"markup\": ...}, {\"content\": ...}]: content is what came from the messages and variables, which the \
tokenizer never turns into control tokens.",
    opts: &[&[
        path("messages", "FILE", "the conversation: a JSON array of messages (- reads stdin)"),
        path("template-file", "PATH", "a template file instead of MODEL: .jinja source, or a tokenizer_config.json / chat_template.json"),
        val("template", "NAME", "another template: chatml, llama3 (built in) or a FILE; MODEL still gives the special tokens"),
        val("template-name", "NAME", "one of several named templates (a list-form chat_template, additional_chat_templates/NAME.jinja)"),
        flag("no-generation-prompt", "end after the last message (add_generation_prompt = false)"),
        Opt { long: "var", short: None, value: Some("NAME=JSON"), repeat: true, path: false,
            help: "an extra template variable, e.g. --var enable_thinking=false --var 'date_string=\"26 Jul 2024\"' (repeatable)" },
        val("now", "DATE", "the clock of strftime_now: YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS] (default: now, UTC)"),
        flag("json", "print the pieces as JSON, markup and content apart"),
    ], HELP_OPT],
    positionals: &["MODEL"],
};

/// The template the arguments name, with the model's special tokens when a model is given.
fn choose(a: &Args) -> Result<ChatTemplate, Failure> {
    let name = a.value("template-name");
    let model = a.positional_path(0);
    if let (Some(_), Some(_)) = (model, a.path("template-file")) {
        return Err(Failure::Usage("give MODEL or --template-file, not both".into()));
    }
    if let Some(choice) = a.value("template") {
        let t = if ChatTemplate::BUILTINS.contains(&choice) { ChatTemplate::builtin(choice)? } else { ChatTemplate::from_file(Path::new(choice), name)? };
        return Ok(match model.filter(|m| m.is_dir()) {
            Some(dir) => t.with_special_tokens(special_tokens_in_dir(dir)?),
            None => t,
        });
    }
    if let Some(p) = a.path("template-file") {
        return Ok(ChatTemplate::from_file(p, name)?);
    }
    let Some(model) = model else {
        return Err(Failure::Usage("missing MODEL (or --template-file PATH, or --template chatml|llama3|FILE)".into()));
    };
    if !model.is_dir() {
        return Ok(ChatTemplate::from_file(model, name)?);
    }
    ChatTemplate::from_model_dir(model, name)?.ok_or_else(|| Failure::Run(waste::Error::config(&model.join("tokenizer_config.json"),
        "chat_template", "missing (and there is no chat_template.jinja or chat_template.json): this model ships no chat template; \
choose one with --template chatml|llama3|FILE")))
}

/// `--var NAME=JSON`, each value parsed as JSON.
fn vars(a: &Args) -> Result<Vec<(String, Json)>, Failure> {
    let mut out = Vec::new();
    for v in a.values("var") {
        let Some((name, value)) = v.split_once('=').filter(|(n, _)| !n.is_empty()) else {
            return Err(Failure::Usage(format!("option `--var`: `{v}` is not NAME=JSON")));
        };
        let parsed = json::parse(value.as_bytes()).map_err(|e| Failure::Usage(format!(
            "option `--var`: `{v}`: the value is not JSON ({e}); a string needs quotes: {name}='\"text\"'")))?;
        out.push((name.to_string(), parsed));
    }
    Ok(out)
}

fn read_messages(a: &Args) -> Result<Json, Failure> {
    let p = a.path("messages").ok_or_else(|| Failure::Usage("missing --messages FILE (a JSON array of messages; - reads stdin)".into()))?;
    let bytes = if p == Path::new("-") {
        let mut b = Vec::new();
        std::io::stdin().read_to_end(&mut b).map_err(|e| Failure::Run(waste::Error::io(Path::new("<stdin>"), "read", e)))?;
        b
    } else {
        std::fs::read(p).map_err(|e| Failure::Run(waste::Error::io(p, "read", e)))?
    };
    let shown = if p == Path::new("-") { Path::new("<stdin>") } else { p };
    let messages = json::parse(&bytes).map_err(|e| Failure::Run(waste::Error::format(shown, e)))?;
    if messages.as_array().is_none() {
        return Err(Failure::Run(waste::Error::format(shown, format!("expected a JSON array of messages, got {}", messages.type_name()))));
    }
    Ok(messages)
}

pub fn run(a: &Args) -> Outcome {
    let tpl = choose(a)?;
    let clock = match a.value("now") {
        Some(d) => Clock::Fixed(DateTime::parse(d).map_err(|e| Failure::Usage(format!("option `--now`: {}", e.message())))?),
        None => Clock::SystemUtc,
    };
    let opts = RenderOptions { add_generation_prompt: !a.flag("no-generation-prompt"), vars: vars(a)?, clock };
    let messages = read_messages(a)?;
    let pieces = tpl.render(&messages, &opts).map_err(Failure::Run)?;
    if a.flag("json") {
        let list = pieces.iter().map(|p| match p {
            Piece::Markup(t) => Json::object([("markup", Json::str(t.clone()))]),
            Piece::Content(t) => Json::object([("content", Json::str(t.clone()))]),
        }).collect();
        return super::out::stdout_bytes(format!("{}\n", Json::Array(list).to_string_compact()).as_bytes());
    }
    super::out::stdout_bytes(waste::template::pieces_text(&pieces).as_bytes())
}
