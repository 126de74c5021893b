//! `waste tokenize`, `waste detokenize` and `waste bench tokenize`: the tokenizer alone,
//! without loading a model's weights.

use super::args::{flag, path, Args, Command};
use super::commands::{Failure, Outcome};
use super::out::outln;
use super::HELP_OPT;
use std::io::Read;
use std::path::Path;
use std::time::Instant;
use waste::format::json::Json;
use waste::Tokenizer;

pub const TOKENIZE: Command = Command {
    name: "tokenize",
    usage: "tokenize (MODEL | --tokenizer PATH) [--content] [--json] [TEXT | -]",
    about: "Print the token ids of TEXT (or of stdin, read verbatim). Special-token strings become \
their control ids (markup mode) unless --content is given.",
    opts: &[&[
        path("tokenizer", "PATH", "a tokenizer file instead of a model directory"),
        flag("content", "treat special-token strings as plain text"),
        flag("json", "print {\"ids\": [...]}"),
    ], HELP_OPT],
    positionals: &["MODEL", "TEXT"],
};

pub const DETOKENIZE: Command = Command {
    name: "detokenize",
    usage: "detokenize (MODEL | --tokenizer PATH) IDS...",
    about: "Print the text of token ids (separated by spaces or commas). Control tokens print nothing.",
    opts: &[&[path("tokenizer", "PATH", "a tokenizer file instead of a model directory")], HELP_OPT],
    positionals: &["IDS..."],
};

pub const BENCH_TOKENIZE: Command = Command {
    name: "bench tokenize",
    usage: "bench tokenize --tokenizer PATH FILE [--markup] [--json]",
    about: "Measure the tokenizer's content-encoding throughput on FILE, one thread (printed, never asserted).",
    opts: &[&[path("tokenizer", "PATH", "the tokenizer file"), flag("markup", "time markup encoding (specials resolved) instead"), flag("json", "print JSON")], HELP_OPT],
    positionals: &["FILE"],
};

/// The tokenizer named by `--tokenizer PATH` or by the first positional (a model directory
/// or a tokenizer file); returns it and the index of the first remaining positional.
fn open(a: &Args) -> Result<(Tokenizer, usize), Failure> {
    if let Some(p) = a.path("tokenizer") {
        return Ok((Tokenizer::from_file(p)?, 0));
    }
    let p = a.positional_path(0).ok_or_else(|| Failure::Usage("missing MODEL (or --tokenizer PATH)".into()))?;
    let tok = if p.is_dir() { Tokenizer::from_model_dir(p)? } else { Tokenizer::from_file(p)? };
    Ok((tok, 1))
}

pub fn tokenize(a: &Args) -> Outcome {
    let (tok, first) = open(a)?;
    if a.positional_count() > first + 1 {
        return Err(Failure::Usage(format!("unexpected argument `{}`",
            a.positional_path(first + 1).map_or(String::new(), |p| p.display().to_string()))));
    }
    let text = match a.positional_text(first, "TEXT")? {
        None if waste::host::stdin_is_tty() => return Err(Failure::Usage("missing TEXT (or pipe it on stdin)".into())),
        None | Some("-") => read_stdin()?,
        Some(t) => t.to_string(),
    };
    let ids = if a.flag("content") { tok.tokenize(&text) } else { tok.tokenize_markup(&text) };
    let line = if a.flag("json") {
        Json::object([("ids", Json::Array(ids.iter().map(|&i| Json::uint(i as u64)).collect()))]).to_string_compact()
    } else {
        ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
    };
    outln!("{line}");
    Ok(())
}

pub fn detokenize(a: &Args) -> Outcome {
    let (tok, first) = open(a)?;
    let mut ids = Vec::new();
    for arg in a.positional_texts(first, "IDS")? {
        for s in arg.split([',', ' ']).filter(|s| !s.is_empty()) {
            ids.push(s.parse::<u32>().map_err(|_| Failure::Usage(format!("`{s}` is not a token id")))?);
        }
    }
    if ids.is_empty() {
        return Err(Failure::Usage("missing IDS".into()));
    }
    let text = tok.detokenize(&ids)?;
    super::out::stdout_bytes(text.as_bytes())
}

/// `waste bench tokenize --tokenizer PATH FILE`: content-mode encoding throughput of FILE
/// (best of five passes after a warm-up), printed, never asserted.
pub fn bench(a: &Args) -> Outcome {
    let path = a.path("tokenizer").ok_or_else(|| Failure::Usage("bench tokenize: missing --tokenizer PATH".into()))?;
    let file = a.positional_path(0).ok_or_else(|| Failure::Usage("bench tokenize: missing FILE".into()))?;
    let t0 = Instant::now();
    let tok = Tokenizer::from_file(path)?;
    let load = t0.elapsed().as_secs_f64();
    let bytes = std::fs::read(file).map_err(|e| Failure::Run(waste::Error::io(file, "read", e)))?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let markup = a.flag("markup");
    let encode = |t: &str| if markup { tok.tokenize_markup(t) } else { tok.tokenize(t) };
    let mut ids = encode(&text);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        ids = encode(&text);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let mb = text.len() as f64 / 1e6;
    if a.flag("json") {
        outln!("{}", Json::object([
            ("bytes", Json::uint(text.len() as u64)),
            ("tokens", Json::uint(ids.len() as u64)),
            ("seconds", Json::float(best)),
            ("mb_per_s", Json::float(mb / best)),
            ("load_seconds", Json::float(load)),
        ]).to_string_pretty());
    } else {
        outln!("tokenizer  {} (loaded in {load:.3} s)", path.display());
        outln!("text       {}: {} bytes, {} tokens", file.display(), text.len(), ids.len());
        let mode = if markup { "markup" } else { "content" };
        outln!("encode     {:.3} s  {:.2} MB/s ({mode}, best of 5, one thread)", best, mb / best);
    }
    Ok(())
}

fn read_stdin() -> Result<String, Failure> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).map_err(|e| Failure::Run(waste::Error::io(Path::new("<stdin>"), "read", e)))?;
    Ok(s)
}
