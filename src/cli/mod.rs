//! The command-line client. It parses arguments, renders output and does file I/O; every
//! capability it uses is a public function of the library.
//!
//! Exit status: 0 success, 1 a runtime error (one line on stderr), 2 a usage error. A closed
//! standard output (`waste ... | head`: the reader went away) ends a command quietly with
//! status 0, and `run` stops generating (see `out`).

mod args;
mod bench_attention;
mod bench_matmul;
mod chat;
mod commands;
pub mod init;
mod moe;
mod out;
mod plan;
mod quant;
mod serve;
mod template;
mod tokenize;
mod trace;

use args::{flag, path, val, Command, Opt, Usage};
use out::errln;
use std::ffi::OsString;

/// Options every command that opens a model accepts.
pub(crate) const MODEL_OPTS: &[Opt] = &[
    val("threads", "N", "compute threads (default: one per available CPU, or per CPU of --cpus)"),
    val("cpus", "LIST", "bind the compute threads to these CPUs (Linux cpu list: 3, 0-5, 0-2,6-8, strides 0-7:2, groups 0-15:2/4, 4-N, all)"),
    val("ctx", "N", "context length in tokens (default: the model's, at most 4096)"),
    val("chunk", "N", "prefill chunk: tokens per forward pass (default: 128, or 512 when experts stream past the cache, or all fit it with AMX tiles)"),
    flag("scalar", "use the scalar reference kernels"),
    val("isa", "NAME", "kernels: scalar, avx2, avx512, amx (AVX-512 and AMX tiles), neon — one this CPU has, e.g. an AVX2-only machine's on an AVX-512 one (default: the best this CPU has)"),
    flag("no-tiles", "keep Q4B32, Q8B32 and BF16 prefill products off the AMX tiles (on a CPU that has them): the AVX-512 kernels, whose bits match decode's with --f32-act"),
    flag("f32-act", "f32 activations for every product: the reference (the default takes int21 for Q4B32 decode on AVX2 and Intel AVX-512 CPUs, and a prompt's logits then differ from one-token-at-a-time decoding by rounding)"),
    flag("int8-act", "opt-in int8 activations for Q8B32/Q4B32 weights (faster, slightly less accurate)"),
    flag("int16-act", "opt-in int16 activations for Q8B32/Q4B32 weights (integer products; an activation error of at most 1/65534 of its block's largest value)"),
    flag("int21-act", "int21 activations for Q4B32 weights (exact integer products of 21-bit activations: an error of at most 1/4161536 of its block's largest value, within seed 000's token gate)"),
    val("budget", "SIZE", "hard RAM ceiling: bytes or K/M/G/T, binary (4G = 4Gi = 4GiB = 4GB = 2^32); default: from usable RAM"),
    val("cache", "SIZE", "expert cache for a container, within the budget: bytes or K/M/G/T (binary, as --budget)"),
    val("io-threads", "N", "threads reading expert records, 0 = read inline (default 4)"),
    flag("verify", "check the CRC-32 of a container's trunk files at open and of every expert record read"),
    flag("no-lookahead", "do not read the next MoE layers' likely experts early (by default each decode step guesses the next two layers' and reads them while most of those reads are used)"),
    flag("lookahead", "read ahead (the default; kept for older command lines)"),
    flag("purgeable", "let the kernel take back idle expert-cache slots under memory pressure (MADV_FREE); they are read again"),
    flag("no-huge-pages", "back the expert cache with 4 KiB pages, not 2 MiB ones: a first prompt under a tight limit may run faster, decode slower"),
    flag("no-hotlist", "do not preload the experts a container's usage.waste lists (see --learn)"),
    path("usage-file", "F", "the learned hotlist to preload and --learn to write (default: usage.waste beside the model)"),
    val("sessions", "N", "conversations the budget reserves room for: the model's own and N-1 more (default 1)"),
];

/// Saved session state, for the commands that run a prompt in a session.
const STATE_OPTS: &[Opt] = &[
    path("load-state", "PATH", "continue the session saved in PATH (the prompt is appended to it)"),
    path("save-state", "PATH", "save the session to PATH afterwards (written atomically)"),
];

pub(crate) const SAMPLING_OPTS: &[Opt] = &[
    Opt { long: "n", short: Some('n'), value: Some("N"), repeat: false, path: false, help: "tokens to generate (default 256)" },
    val("temp", "F", "temperature, 0 = greedy (default 0.8)"),
    val("top-k", "N", "keep the k most likely tokens, 0 = off (default 40)"),
    val("top-p", "F", "nucleus: keep tokens up to probability p, 1 = off (default 0.95)"),
    val("min-p", "F", "drop tokens below p x the top probability, 0 = off (default 0.05)"),
    val("repeat-penalty", "F", "penalty on the last 64 tokens, 1 = off (default 1)"),
    val("seed", "N", "random seed (default: from the clock, printed)"),
    Opt { long: "stop", short: None, value: Some("STR"), repeat: true, path: false, help: "stop when the text contains STR (repeatable)" },
    flag("ignore-eos", "keep generating past end-of-sequence tokens"),
];

pub(crate) const HELP_OPT: &[Opt] = &[Opt { long: "help", short: Some('h'), value: None, repeat: false, path: false, help: "show this help" }];

pub const RUN: Command = Command {
    name: "run",
    usage: "run MODEL [PROMPT | -] [options]",
    about: "Generate text after a prompt, streaming it to stdout. The prompt is the argument, --file F, \
or stdin (`-`, or piped); one that starts with `-` goes after `--`. A prompt longer than the context fails \
before anything is printed. One summary line goes to stderr: `[N tokens, S s, X tok/s | prefill P tokens, \
T s | stop: WHY]` (plus `seed K` when the seed came from the clock), where N counts the generated tokens, \
S and X time the decode steps after the first token (each one forward pass and one sampling, output time \
excluded), the prefill is the prompt's forward pass and the first token's sampling, and WHY is \
end of sequence, stop string, token limit or context full.",
    opts: &[SAMPLING_OPTS, &[path("file", "F", "read the prompt from file F"), TRACE_OUT, LEARN], STATE_OPTS, MODEL_OPTS, HELP_OPT],
    positionals: &["MODEL", "PROMPT"],
};

pub const EVAL: Command = Command {
    name: "eval",
    usage: "eval MODEL (PROMPT | --ids 1,2,3) [options]",
    about: "Run a prompt and print the next-token distribution without generating.",
    opts: &[&[
        val("ids", "LIST", "comma-separated token ids instead of a prompt"),
        val("top", "K", "how many candidates to print (default 10)"),
        flag("json", "print JSON"),
        path("dump-logits", "PATH", "write the logits of every position: raw little-endian f32 [positions x vocab]"),
        path("dump-hidden", "PATH", "write the hidden states: raw f32 [layers+2 x positions x hidden]"),
        path("file", "F", "read the prompt from file F"),
        flag("markup", "resolve special-token strings in the prompt to control tokens"),
    ], STATE_OPTS, MODEL_OPTS, HELP_OPT],
    positionals: &["MODEL", "PROMPT"],
};

pub const INFO: Command = Command {
    name: "info",
    usage: "info MODEL [--json]",
    about: "Describe a model: architecture, shape, parameters, dtypes and the bytes it holds.",
    opts: &[&[flag("json", "print JSON")], MODEL_OPTS, HELP_OPT],
    positionals: &["MODEL"],
};

pub const BENCH: Command = Command {
    name: "bench",
    usage: "bench MODEL [--prompt-tokens N] [-n N]",
    about: "Measure prefill and decode speed (figures are printed, never asserted).",
    opts: &[&[
        val("prompt-tokens", "N", "prompt length (default 128)"),
        Opt { long: "n", short: Some('n'), value: Some("N"), repeat: false, path: false, help: "tokens to decode (default 64)" },
        val("warmup", "N", "first an untimed run of the same prompt length and N decode steps on other tokens, as llama-bench's warm-up: the expert cache starts warm (default 0: cold)"),
        flag("json", "print JSON"),
        path("route-trace", "FILE", "route as the trace FILE says (JSON lines, as --trace-out writes): streaming with a real model's locality on random weights"),
        TRACE_OUT,
        LEARN,
    ], MODEL_OPTS, HELP_OPT],
    positionals: &["MODEL"],
};

/// `--trace-out FILE`, on run, bench and chat.
pub(crate) const TRACE_OUT: Opt = path("trace-out", "FILE", "write the experts each computed token routed to, one JSON line per token");
/// `--learn`, on run, bench, chat and serve.
pub(crate) const LEARN: Opt = flag("learn", "count the experts used and add them to usage.waste beside the model (or --usage-file), which the next open preloads");

pub const BENCH_STATE: Command = Command {
    name: "bench state",
    usage: "bench state MODEL [--tokens N] [--state PATH]",
    about: "Measure saving and loading a session's state against computing it again (a prefill of the same tokens).",
    opts: &[&[
        val("tokens", "N", "tokens in the session (default 4096; also the default --ctx)"),
        path("state", "PATH", "where to write the state file (default: a temporary file, removed afterwards)"),
        flag("json", "print JSON"),
    ], MODEL_OPTS, HELP_OPT],
    positionals: &["MODEL"],
};

pub const RANDOM_MODEL: Command = Command {
    name: "random-model",
    usage: "random-model (--preset NAME | --config FILE) --out DIR [--dtype bf16|f16|f32] [--container [--experts q4|q8]] [--seed N]",
    about: "Write a checkpoint of random weights with a real model's shape, for benchmarks. \
Presets: smollm2-135m, llama-1b (dense), qwen3-30b-a3b (MoE: written as a container).",
    opts: &[&[
        val("preset", "NAME", "a known shape"),
        path("config", "FILE", "a config.json to take the shape from"),
        path("out", "DIR", "output directory (config.json + model.safetensors)"),
        val("dtype", "T", "bf16 (default), f16 or f32"),
        flag("container", "write a container directly (MoE shapes): q4 trunk, q8 embeddings/head/routers"),
        val("experts", "ENC", "with --container: q4 (default) or q8 experts"),
        val("seed", "N", "random seed (default 1)"),
    ], HELP_OPT],
    positionals: &[],
};

pub const VERSION: Command = Command {
    name: "version",
    usage: "version",
    about: "Print the version.",
    opts: &[HELP_OPT],
    positionals: &[],
};

pub const CONVERT: Command = Command {
    name: "convert",
    usage: "convert --in HF_DIR --out MODEL.waste [--trunk f32|bf16|q8|q4] [--experts f32|bf16|q8|q4|fp8|mxfp4]",
    about: "Turn a Hugging Face checkpoint directory into a container whose experts stream from disk. \
Resumable: run the same command again after an interruption and it finishes.",
    opts: &[&[
        path("in", "DIR", "the Hugging Face checkpoint directory"),
        path("out", "DIR", "the container directory to write"),
        val("trunk", "ENC", "attention and dense matrices: f32, bf16, f16, q8 or q4 (default q4)"),
        val("embeddings", "ENC", "embeddings, LM head, routers (default q8 for a quantized trunk, else the trunk's)"),
        val("experts", "ENC", "routed experts: f32, bf16, f16, q8, q4 (default), fp8 to keep an FP8 checkpoint's experts as they are, or mxfp4 (gpt-oss MXFP4 sources, copied)"),
    ], HELP_OPT],
    positionals: &[],
};

pub const BENCH_CACHE: Command = Command {
    name: "bench cache",
    usage: "bench cache --trace FILE [--slots N | --percent P,...] [--experts N] [--tokens A..B]",
    about: "Replay a routing trace through the expert cache's policy, next to LRU and Belady's optimum.",
    opts: &[&[
        path("trace", "FILE", "JSON lines: {\"tok\": N, \"layers\": [[expert ids] per layer]}"),
        val("slots", "N", "cache slots (records)"),
        val("percent", "LIST", "cache sizes as percentages of all experts (default 3,6,12,24)"),
        val("experts", "N", "experts per layer (default: largest id in the trace + 1)"),
        val("policy", "NAME", "reuse (the engine's), next-use, frequency or lru"),
        val("half-life", "TOKENS", "frequency decay half-life in tokens (default 16, the engine's)"),
        val("tokens", "A..B", "count only tokens A to B-1 (the cache runs from token 0; default all)"),
        flag("json", "print JSON"),
    ], HELP_OPT],
    positionals: &[],
};

pub const BENCH_DISK: Command = Command {
    name: "bench disk",
    usage: "bench disk (FILE | CONTAINER) [--record SIZE] [--threads N] [--limit SIZE]",
    about: "Measure the disk's O_DIRECT read bandwidth at the expert record size (the bound on streaming). \
Given a container, reads its banks' records in a scattered order, as the engine does.",
    opts: &[&[
        val("record", "SIZE", "bytes per read, a multiple of 4096 (default 4M); K/M/G suffixes"),
        val("threads", "N", "reads in flight (default 4, the engine's I/O threads)"),
        val("limit", "SIZE", "read at most this much of the file (default 4G)"),
    ], HELP_OPT],
    positionals: &["FILE"],
};

const COMMANDS: &[&Command] = &[&RUN, &chat::CHAT, &EVAL, &INFO, &BENCH, &BENCH_CACHE, &BENCH_DISK, &BENCH_STATE, &bench_matmul::BENCH_MATMUL, &bench_attention::BENCH_ATTENTION,
    &tokenize::BENCH_TOKENIZE, &plan::PLAN, &CONVERT, &quant::QUANTIZE, &quant::COMPARE, &tokenize::TOKENIZE, &tokenize::DETOKENIZE,
    &template::TEMPLATE, &serve::SERVE, &RANDOM_MODEL, &VERSION];

fn overview() -> String {
    let mut s = String::from(
        "waste — runs large language models, bigger than RAM, on the CPU\n\nUsage: waste COMMAND [ARGS]\n\nCommands:\n");
    for c in COMMANDS {
        let first = c.about.split(". ").next().unwrap_or("");
        s.push_str(&format!("  {:<14} {}\n", c.name, first.trim_end_matches('.')));
    }
    s.push_str("\n`waste COMMAND --help` describes a command's options.\n");
    s
}

/// The one line `waste` alone prints (on stderr).
const SHORT_USAGE: &str = "usage: waste COMMAND [ARGS] (`waste --help` lists the commands, `waste help COMMAND` describes one)";

/// Runs the command line `args` (without the program name); returns the exit status.
pub fn main(args: Vec<OsString>) -> i32 {
    let Some(first) = args.first() else {
        errln!("{SHORT_USAGE}");
        return 2;
    };
    let name = first.to_string_lossy();
    let word = |i: usize| args.get(i).map(|a| a.to_string_lossy().into_owned());
    match name.as_ref() {
        "--help" | "-h" => print_or_quiet(&overview()),
        // `waste help` is the overview, `waste help CMD [SUB]` the command's own help.
        "help" => match (word(1), word(2)) {
            (None, _) => print_or_quiet(&overview()),
            (Some(c), sub) => match find_command(&c, sub.as_deref()) {
                Some((cmd, _)) => print_or_quiet(&cmd.help()),
                None => {
                    errln!("waste: unknown command `{c}` (see `waste --help`)");
                    2
                }
            },
        },
        "--version" | "-V" => print_or_quiet(&format!("waste {}\n", waste::VERSION)),
        _ => match find_command(&name, word(1).as_deref()) {
            Some((cmd, skip)) => run_command(cmd, &args[skip..]),
            None => {
                errln!("waste: unknown command `{name}` (see `waste --help`)");
                2
            }
        },
    }
}

/// The command named by `name` (and `sub`, for `bench`'s sub-benchmarks) and how many
/// arguments name it.
fn find_command(name: &str, sub: Option<&str>) -> Option<(&'static Command, usize)> {
    let two = sub.map(|s| format!("{name} {s}"));
    COMMANDS.iter().find(|c| Some(c.name) == two.as_deref()).map(|c| (*c, 2))
        .or_else(|| COMMANDS.iter().find(|c| c.name == name).map(|c| (*c, 1)))
}

/// Prints `text` to stdout: status 0, also when the reader has gone (see `out`), 1 when the
/// write fails otherwise.
fn print_or_quiet(text: &str) -> i32 {
    match out::stdout_bytes(text.as_bytes()) {
        Ok(()) | Err(commands::Failure::Closed) => 0,
        Err(f) => report(None, f),
    }
}

fn run_command(cmd: &'static Command, rest: &[OsString]) -> i32 {
    let parsed = match cmd.parse(rest) {
        Ok(p) => p,
        Err(Usage(msg)) => {
            errln!("waste {msg}");
            return 2;
        }
    };
    if parsed.flag("help") {
        return print_or_quiet(&cmd.help());
    }
    match commands::dispatch(cmd.name, &parsed) {
        Ok(()) => 0,
        Err(f) => report(Some(cmd.name), f),
    }
}

/// Prints a failure on stderr (one line: the error and its sources) and returns the status.
fn report(cmd: Option<&str>, f: commands::Failure) -> i32 {
    let who = cmd.map_or("waste".to_string(), |c| format!("waste {c}"));
    match f {
        commands::Failure::Closed => 0,
        commands::Failure::Usage(msg) => {
            errln!("{who}: {msg}");
            2
        }
        commands::Failure::Run(e) => {
            let mut line = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                line.push_str(&format!(": {s}"));
                source = s.source();
            }
            errln!("{who}: {line}");
            1
        }
    }
}
