//! `waste quantize` and `waste compare`: the quantized-checkpoint tools of seed 000. Both are
//! thin clients of the library ([`waste::tools::quantize`], [`waste::tools::compare`]); this
//! file parses their arguments and prints the seed's `QUANT` and `COMPARE` lines.

use super::args::{path, val, Args, Command, Opt};
use super::commands::{model_options, parse_ids, Failure};
use super::out::{errln, outln};
use super::{HELP_OPT, MODEL_OPTS};
use std::path::Path;
use std::time::Instant;
use waste::format::quant::Width;
use waste::{Error, ErrorKind, Model};

/// The seed's published prompt, used when neither `--prompt` nor `--ids` is given.
const DEFAULT_PROMPT: &str = "The capital of France is";

pub const QUANTIZE: Command = Command {
    name: "quantize",
    usage: "quantize [--bits 4|8] --in DIR --out DIR",
    about: "Write a Q4B32 (default) or Q8B32 checkpoint of an F32/BF16/F16 one, with its config and tokenizer \
files, and print the two QUANT lines (sizes, counts, ratio, SHA-256 of the file).",
    opts: &[&[
        val("bits", "4|8", "4 (Q4B32, the default) or 8 (Q8B32)"),
        path("in", "DIR", "the floating point checkpoint directory (or one .safetensors file)"),
        path("out", "DIR", "the output directory (model.safetensors + config and tokenizer files)"),
    ], HELP_OPT],
    positionals: &[],
};

pub const COMPARE: Command = Command {
    name: "compare",
    usage: "compare [FLOAT_DIR QUANT_DIR] [--prompt TEXT | --ids 1,2,3] [-n 8]",
    about: "Decode a prompt greedily with a floating point and a quantized checkpoint and print the COMPARE \
lines (both token lists, logit differences on the float token sequence). Exits non-zero when the tokens differ \
or any logit is NaN or infinite. Without directories it compares /model and /model-q4 (seed 000: the guest's \
/model.safetensors and /model-q4.safetensors, each in its directory with its config). FLOAT_DIR must not be \
quantized, unless it is QUANT_DIR itself: with --int8-act (--int16-act, --int21-act) only QUANT_DIR runs with int8 (int16, int21) \
activations, so `compare Q Q --int8-act` measures that path alone.",
    opts: &[&[
        val("prompt", "TEXT", "the prompt (default: \"The capital of France is\")"),
        val("ids", "LIST", "comma-separated prompt token ids instead of text"),
        Opt { long: "n", short: Some('n'), value: Some("N"), repeat: false, path: false, help: "tokens to decode (default 8)" },
    ], MODEL_OPTS, HELP_OPT],
    positionals: &["FLOAT_DIR", "QUANT_DIR"],
};

pub fn quantize(a: &Args) -> Result<(), Failure> {
    let width = match a.num("bits", 0u32, 64)? {
        None => Width::Q4,
        Some(b) => Width::from_bits(b).ok_or_else(|| Failure::Usage(format!("option `--bits`: {b} is not 4 or 8")))?,
    };
    let input = a.path("in").ok_or_else(|| Failure::Usage("missing --in DIR".into()))?;
    let output = a.path("out").ok_or_else(|| Failure::Usage("missing --out DIR".into()))?;
    let t = Instant::now();
    let report = waste::tools::quantize::quantize_checkpoint(input, output, width)?;
    for line in report.lines() {
        outln!("{line}");
    }
    errln!("[{:.1} s; copied {}]", t.elapsed().as_secs_f64(),
        if report.copied.is_empty() { "no side files".to_string() } else { report.copied.join(", ") });
    Ok(())
}

/// The directories `compare` opens without arguments: the seed's guest keeps the float and
/// quantized checkpoints at the initramfs root, each file in a directory with its config.
const DEFAULT_DIRS: [&str; 2] = ["/model", "/model-q4"];

pub fn compare(a: &Args) -> Result<(), Failure> {
    let (float_dir, quant_dir) = match (a.positional_path(0), a.positional_path(1)) {
        (None, _) => (Path::new(DEFAULT_DIRS[0]), Path::new(DEFAULT_DIRS[1])),
        (Some(f), Some(q)) => (f, q),
        (Some(_), None) => return Err(Failure::Usage("give both FLOAT_DIR and QUANT_DIR, or neither (for /model and /model-q4)".into())),
    };
    let (float_name, quant_name) = (float_dir.display(), quant_dir.display());
    let n = a.num("n", 1usize, waste::MAX_CONTEXT)?.unwrap_or(8);
    let opts = model_options(a)?;
    // The float side is the reference: always f32 activations.
    let mut float = Model::open(float_dir, &waste::Options { activations: waste::Activations::F32, ..opts.clone() })?;
    let prompt = match (a.value("prompt"), a.value("ids")) {
        (Some(_), Some(_)) => return Err(Failure::Usage("give --prompt or --ids, not both".into())),
        (None, Some(list)) => parse_ids(list)?,
        (text, None) => {
            if float.tokenizer().is_err() {
                return Err(Failure::Usage(format!("{float_name} has no tokenizer file: give the prompt as --ids")));
            }
            float.tokenize_prompt(text.unwrap_or(DEFAULT_PROMPT))?
        }
    };
    let mut quant = Model::open(quant_dir, &opts)?;
    let report = waste::tools::compare::compare(&mut float, &mut quant, &prompt, n)?;
    for line in report.lines() {
        outln!("{line}");
    }
    if !report.finite() {
        return Err(Failure::Run(Error::new(ErrorKind::Tensor, format!(
            "non-finite logits: {} from {float_name}, {} from {quant_name}", report.non_finite_float, report.non_finite_quant))));
    }
    match report.first_difference() {
        None => Ok(()),
        Some(i) => Err(Failure::Run(Error::new(ErrorKind::Tensor, format!(
            "{quant_name} decodes a different token than {float_name} at step {i} ({} instead of {})",
            report.tokens_quant[i], report.tokens_float[i])))),
    }
}
