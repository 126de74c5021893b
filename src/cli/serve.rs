//! `waste serve`: the options of the OpenAI-compatible server (the server itself is `serve`).

use super::args::{flag, path, val, Args, Command, Opt};
use super::commands::{model_options, model_path, Failure, Outcome};
use super::{HELP_OPT, MODEL_OPTS};
use crate::serve::{self, Config, Limits};
use std::path::Path;
use std::time::Duration;
use waste::template::{special_tokens_in_dir, ChatTemplate};

const SERVE_OPTS: &[Opt] = &[
    val("host", "ADDR", "address to listen on (default 127.0.0.1; another needs an API key or --no-api-key)"),
    val("port", "N", "port (default 8080; 0 picks a free one, shown on the ready line)"),
    val("api-key", "KEY", "clients must send `Authorization: Bearer KEY` (visible to other local users in the process list: prefer --api-key-file)"),
    path("api-key-file", "F", "read the API key from the first line of file F"),
    flag("no-api-key", "serve an address beyond this machine without an API key (the ready line warns)"),
    val("slots", "N", "conversations kept warm, each a session counted in the RAM budget (default 1; see `waste plan --sessions N`)"),
    val("queue", "N", "requests that may wait for the model; more are refused with 429 (default 16)"),
    val("max-body", "SIZE", "largest request body, K/M suffixes (default 1M)"),
    val("alias", "NAME", "the model id /v1/models reports (default: the model directory's name)"),
    val("template", "NAME", "chat template: chatml, llama3 (built in) or a FILE (default: the model's own)"),
    val("connections", "N", "connections open at once; more are answered 503 (default 64)"),
    val("timeout", "SECS", "a request's headers, and then its body, must arrive within this time; a write may block this long (default 10)"),
    val("idle-timeout", "SECS", "a kept-alive connection waits this long for its next request (default 60)"),
];

pub const SERVE: Command = Command {
    name: "serve",
    usage: "serve MODEL [--host 127.0.0.1] [--port 8080] [--api-key KEY | --api-key-file F] [--slots N] [--queue N] [--max-body SIZE] [--alias NAME] [options]",
    about: "Serve the model over an OpenAI-compatible HTTP API (GET /health, GET /v1/models, POST /v1/chat/completions, \
POST /v1/completions), keeping conversations warm: a request that continues one of the --slots conversations prefills only \
its new tokens. The model is opened after the socket is bound (every endpoint answers 503 until it is ready); one line on \
stdout says when it is ready and where, one line per request goes to stderr; SIGINT or SIGTERM stops the server (in-flight \
replies end with an error). docs/SERVE.md describes every endpoint, parameter and error.",
    opts: &[SERVE_OPTS, &[super::LEARN], MODEL_OPTS, HELP_OPT],
    positionals: &["MODEL"],
};

/// The template `--template` names (with the model's special tokens), else the model's own;
/// `None` when the model has none (chat requests are then refused, completions still work).
fn template(a: &Args, model: &Path) -> Result<Option<ChatTemplate>, Failure> {
    match a.value("template") {
        Some(choice) => {
            let t = if ChatTemplate::BUILTINS.contains(&choice) { ChatTemplate::builtin(choice)? } else { ChatTemplate::from_file(Path::new(choice), None)? };
            Ok(Some(if model.is_dir() { t.with_special_tokens(special_tokens_in_dir(model)?) } else { t }))
        }
        None => Ok(ChatTemplate::from_model_dir(model, None)?),
    }
}

/// `--api-key` or `--api-key-file` (its first line).
fn api_key(a: &Args) -> Result<Option<String>, Failure> {
    let key = match (a.value("api-key"), a.path("api-key-file")) {
        (Some(_), Some(_)) => return Err(Failure::Usage("give --api-key or --api-key-file, not both".into())),
        (Some(k), None) => k.to_string(),
        (None, Some(f)) => {
            let bytes = waste::format::read_bounded(f, 4096)?;
            let text = String::from_utf8(bytes).map_err(|_| Failure::Usage(format!("option `--api-key-file`: {} is not UTF-8 text", f.display())))?;
            text.lines().next().unwrap_or("").trim().to_string()
        }
        (None, None) => return Ok(None),
    };
    if key.is_empty() || key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Failure::Usage("the API key must be non-empty, without spaces or control characters".into()));
    }
    if a.flag("no-api-key") {
        return Err(Failure::Usage("give an API key or --no-api-key, not both".into()));
    }
    Ok(Some(key))
}

fn seconds(a: &Args, name: &str, default: u64) -> Result<Duration, Failure> {
    Ok(Duration::from_secs(a.num(name, 1u64, 86_400)?.unwrap_or(default)))
}

pub fn run(a: &Args) -> Outcome {
    if a.value("sessions").is_some() {
        return Err(Failure::Usage("option `--sessions`: the server's sessions are its slots: use --slots N".into()));
    }
    let dir = model_path(a)?.to_path_buf();
    let alias = match a.value("alias") {
        Some(n) if !n.is_empty() => n.to_string(),
        Some(_) => return Err(Failure::Usage("option `--alias`: the name is empty".into())),
        None => dir.canonicalize().unwrap_or_else(|_| dir.clone()).file_name().map_or("model".into(), |n| n.to_string_lossy().into_owned()),
    };
    let cfg = Config {
        options: model_options(a)?,
        template: template(a, &dir)?,
        host: a.value("host").unwrap_or("127.0.0.1").to_string(),
        port: a.num("port", 0u16, u16::MAX)?.unwrap_or(8080),
        api_key: api_key(a)?,
        open: a.flag("no-api-key"),
        slots: a.num("slots", 1usize, waste::MAX_SESSIONS)?.unwrap_or(1),
        queue: a.num("queue", 1usize, 1 << 16)?.unwrap_or(16),
        connections: a.num("connections", 1usize, 1 << 16)?.unwrap_or(64),
        limits: Limits {
            max_body: a.size("max-body", 1024, 1 << 30)?.unwrap_or(1 << 20) as usize,
            timeout: seconds(a, "timeout", 10)?,
            idle: seconds(a, "idle-timeout", 60)?,
        },
        alias,
        model_dir: dir,
        learn: a.flag("learn"),
    };
    serve::run(cfg)?;
    Ok(())
}
