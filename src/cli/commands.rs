//! The commands: each turns parsed arguments into library calls and renders the result.

use super::args::{Args, Usage};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;
use waste::format::json::Json;
use waste::{GenerateParams, Model, Options, SamplingParams};

/// Why a command failed: bad arguments (exit 2) or a runtime error (exit 1).
pub enum Failure {
    Usage(String),
    Run(waste::Error),
}

impl From<Usage> for Failure {
    fn from(u: Usage) -> Failure {
        Failure::Usage(u.0)
    }
}

impl From<waste::Error> for Failure {
    fn from(e: waste::Error) -> Failure {
        match e.kind() {
            waste::ErrorKind::Arg => Failure::Usage(e.message().to_string()),
            _ => Failure::Run(e),
        }
    }
}

pub type Outcome = Result<(), Failure>;

pub(super) fn dispatch(name: &str, a: &Args) -> Outcome {
    match name {
        "run" => run(a),
        "eval" => eval(a),
        "info" => info(a),
        "bench" => bench(a),
        "bench tokenize" => super::tokenize::bench(a),
        "tokenize" => super::tokenize::tokenize(a),
        "detokenize" => super::tokenize::detokenize(a),
        "plan" => super::plan::run(a),
        "random-model" => random_model(a),
        "quantize" => super::quant::quantize(a),
        "compare" => super::quant::compare(a),
        "convert" => super::moe::convert(a),
        "bench cache" => super::moe::bench_cache(a),
        "bench matmul" => super::bench_matmul::run(a),
        "bench disk" => super::moe::bench_disk(a),
        "version" => {
            println!("waste {}", waste::VERSION);
            Ok(())
        }
        _ => Err(Failure::Usage(format!("no such command `{name}`"))),
    }
}

fn io_err(path: &Path, what: &str, e: std::io::Error) -> Failure {
    Failure::Run(waste::Error::io(path, what, e))
}

/// The model options shared by every command that opens one.
pub(super) fn model_options(a: &Args) -> Result<Options, Failure> {
    let mut o = Options::default();
    if let Some(t) = a.num("threads", 0usize, 1024)? {
        o.threads = t;
    }
    if let Some(list) = a.value("cpus") {
        o.cpus = Some(waste::CpuList::parse(list)?);
    }
    if let Some(c) = a.num("ctx", 1usize, waste::MAX_CONTEXT)? {
        o.ctx = c;
    }
    if let Some(c) = a.num("chunk", 1usize, 4096)? {
        o.prefill_chunk = c;
    }
    o.force_scalar = a.flag("scalar");
    o.int8_activations = a.flag("int8-act");
    if let Some(v) = a.value("budget") {
        o.budget = Some(super::args::parse_size(v).filter(|&b| b > 0)
            .ok_or_else(|| Failure::Usage(format!("option `--budget`: `{v}` is not a size (bytes, or K/M/G/T)")))?);
    }
    if let Some(v) = a.value("cache") {
        o.cache_bytes = super::args::parse_size(v).filter(|&b| b > 0)
            .ok_or_else(|| Failure::Usage(format!("option `--cache`: `{v}` is not a size (bytes, or K/M/G/T)")))?;
    }
    if let Some(n) = a.num("io-threads", 0usize, 256)? {
        o.io_threads = n;
    }
    o.verify = a.flag("verify");
    o.lookahead = a.flag("lookahead");
    Ok(o)
}

pub(super) fn model_path(a: &Args) -> Result<&str, Failure> {
    a.positionals.first().map(String::as_str).ok_or_else(|| Failure::Usage("missing MODEL".into()))
}

/// The prompt from the argument, `--file`, or stdin (`-` or piped); `None` when there is none.
fn read_prompt(a: &Args) -> Result<Option<String>, Failure> {
    let arg = a.positionals.get(1);
    match (arg.map(String::as_str), a.value("file")) {
        (Some(_), Some(_)) => Err(Failure::Usage("give the prompt as an argument or with --file, not both".into())),
        (Some("-"), None) => read_stdin().map(Some),
        (Some(p), None) => Ok(Some(p.to_string())),
        (None, Some(f)) => {
            let mut s = String::new();
            std::fs::File::open(f).and_then(|mut h| h.read_to_string(&mut s)).map_err(|e| io_err(Path::new(f), "read", e))?;
            Ok(Some(s))
        }
        (None, None) if !waste::sys::stdin_is_tty() => read_stdin().map(Some),
        (None, None) => Ok(None),
    }
}

fn read_stdin() -> Result<String, Failure> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).map_err(|e| io_err(Path::new("<stdin>"), "read", e))?;
    Ok(s)
}

fn sampling(a: &Args) -> Result<(SamplingParams, bool), Failure> {
    let mut p = SamplingParams::default();
    if let Some(t) = a.num("temp", 0.0f32, 100.0)? {
        p.temperature = t;
    }
    if let Some(k) = a.num("top-k", 0usize, 1 << 24)? {
        p.top_k = k;
    }
    if let Some(v) = a.num("top-p", f32::MIN_POSITIVE, 1.0)? {
        p.top_p = v;
    }
    if let Some(v) = a.num("min-p", 0.0f32, 1.0)? {
        p.min_p = v;
    }
    if let Some(v) = a.num("repeat-penalty", f32::MIN_POSITIVE, 100.0)? {
        p.repeat_penalty = v;
    }
    let seeded = a.value("seed").is_some();
    p.seed = match a.num("seed", 0u64, u64::MAX)? {
        Some(s) => s,
        None => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0),
    };
    Ok((p, seeded))
}

fn run(a: &Args) -> Outcome {
    let (sampling, seeded) = sampling(a)?;
    let max_tokens = a.num("n", 0usize, waste::MAX_CONTEXT)?.unwrap_or(256);
    let opts = model_options(a)?;
    let prompt = read_prompt(a)?.unwrap_or_default();
    let mut model = Model::open(model_path(a)?, &opts)?;
    report_budget(&model);
    let ids = model.tokenize_prompt(&prompt)?;
    let params = GenerateParams {
        max_tokens,
        sampling,
        stop: a.values("stop").iter().map(|s| s.to_string()).collect(),
        stop_at_eos: !a.flag("ignore-eos"),
    };
    if !seeded && params.sampling.temperature > 0.0 {
        eprintln!("[seed {}]", params.sampling.seed);
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(prompt.as_bytes());
    let _ = out.flush();
    let summary = model.generate(&ids, &params, |ev| {
        let _ = out.write_all(ev.text.as_bytes());
        let _ = out.flush();
        true
    })?;
    let _ = writeln!(out);
    let secs = summary.decode_time.as_secs_f64();
    let experts = model.cache_stats().map(super::moe::stats_suffix).unwrap_or_default();
    eprintln!("[{} tokens, {:.2} s, {:.2} tok/s{experts}]", summary.tokens, secs, summary.tokens_per_second());
    Ok(())
}

/// This process's peak resident set (VmHWM of /proc/self/status), where the OS reports it.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// Tells the user (on stderr) the budget the engine chose, and any warning about it.
fn report_budget(model: &Model) {
    let b = model.budget();
    if let Some(w) = &b.warning {
        eprintln!("waste: warning: {w}");
    }
    if model.plan().has_experts() {
        let how = match b.source {
            waste::BudgetSource::Explicit => "given".to_string(),
            waste::BudgetSource::WorkingSets(n) => format!("chosen: floor + {n} working set{}", if n == 1 { "" } else { "s" }),
            waste::BudgetSource::Floor => "chosen: the floor".to_string(),
        };
        let h = super::plan::human;
        eprintln!("[budget {} ({how}), expert cache {}, holding {}]", h(b.bytes).trim(), h(b.expert_cache_bytes).trim(), h(model.memory_used()).trim());
    }
}

pub(super) fn parse_ids(list: &str) -> Result<Vec<u32>, Failure> {
    list.split(',')
        .map(|s| s.trim().parse::<u32>().map_err(|_| Failure::Usage(format!("option `--ids`: `{s}` is not a token id"))))
        .collect()
}

fn write_f32_file(path: &str, values: &[f32]) -> Outcome {
    let mut bytes = Vec::with_capacity(values.len() * 4);
    for v in values {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    waste::format::safetensors::write_atomic(Path::new(path), &bytes).map_err(Failure::Run)
}

fn eval(a: &Args) -> Outcome {
    let top = a.num("top", 1usize, 1 << 20)?.unwrap_or(10);
    let opts = model_options(a)?;
    let mut model = Model::open(model_path(a)?, &opts)?;
    // With --ids, stdin is not a prompt source (it may simply not be a terminal).
    let prompt = if a.value("ids").is_some() && a.positionals.len() < 2 && a.value("file").is_none() { None } else { read_prompt(a)? };
    let ids = match (a.value("ids"), prompt) {
        (Some(_), Some(_)) => return Err(Failure::Usage("give a prompt or --ids, not both".into())),
        (Some(list), None) => parse_ids(list)?,
        (None, Some(p)) if a.flag("markup") => {
            let tok = model.tokenizer()?;
            let mut ids: Vec<u32> = tok.bos().into_iter().collect();
            ids.extend(tok.tokenize_markup(&p));
            ids
        }
        (None, Some(p)) => model.tokenize_prompt(&p)?,
        (None, None) => return Err(Failure::Usage("missing PROMPT or --ids".into())),
    };
    if ids.is_empty() {
        return Err(Failure::Usage("the prompt has no tokens".into()));
    }
    let vocab = model.info().vocab;
    let mut all = Vec::new();
    if let Some(path) = a.value("dump-hidden") {
        let hidden = model.hidden_states(&ids)?;
        write_f32_file(path, &hidden)?;
        model.reset();
    }
    model.eval_all(&ids, &mut all)?;
    if let Some(path) = a.value("dump-logits") {
        write_f32_file(path, &all)?;
    }
    let last = &all[(ids.len() - 1) * vocab..];
    let max = last.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = last.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&x, &y| last[y].total_cmp(&last[x]).then(x.cmp(&y)));
    order.truncate(top);
    let text = |id: usize| -> String {
        model.tokenizer().ok().and_then(|t| t.token_bytes(id as u32).ok().map(|b| String::from_utf8_lossy(b).into_owned())).unwrap_or_default()
    };
    if a.flag("json") {
        let cands = order.iter().map(|&id| Json::object([
            ("id", Json::uint(id as u64)),
            ("text", Json::str(text(id))),
            ("logit", Json::float(last[id] as f64)),
            ("prob", Json::float(((last[id] - max) as f64).exp() / sum)),
        ]));
        let doc = Json::object([
            ("tokens", Json::Array(ids.iter().map(|&i| Json::uint(i as u64)).collect())),
            ("top", Json::Array(cands.collect())),
        ]);
        println!("{}", doc.to_string_pretty());
    } else {
        println!("{} prompt tokens; next-token distribution:", ids.len());
        for &id in &order {
            let p = ((last[id] - max) as f64).exp() / sum;
            println!("{id:>8}  {:>10.4}  {:>8.5}  {:?}", last[id], p, text(id));
        }
    }
    Ok(())
}

fn info(a: &Args) -> Outcome {
    let opts = model_options(a)?;
    let model = Model::open(model_path(a)?, &opts)?;
    let i = model.info();
    if a.flag("json") {
        let mut m = vec![
            ("path", Json::str(i.path.display().to_string())),
            ("architecture", Json::str(&i.architecture)),
            ("layers", Json::uint(i.layers as u64)),
            ("hidden", Json::uint(i.hidden as u64)),
            ("heads", Json::uint(i.heads as u64)),
            ("kv_heads", Json::uint(i.kv_heads as u64)),
            ("head_dim", Json::uint(i.head_dim as u64)),
            ("intermediate", Json::uint(i.intermediate as u64)),
            ("vocab", Json::uint(i.vocab as u64)),
            ("parameters", Json::uint(i.parameters)),
            ("dtypes", Json::Array(i.dtypes.iter().map(Json::str).collect())),
            ("weight_bytes", Json::uint(i.weight_bytes)),
            ("kv_bytes", Json::uint(i.kv_bytes)),
            ("scratch_bytes", Json::uint(i.scratch_bytes)),
            ("resident_bytes", Json::uint(i.weight_bytes + i.kv_bytes + i.scratch_bytes)),
            ("memory_used_bytes", Json::uint(model.memory_used())),
            ("budget_bytes", Json::uint(model.budget().bytes)),
            ("context", Json::uint(i.context as u64)),
            ("threads", Json::uint(i.threads as u64)),
            ("isa", Json::str(i.isa)),
            ("int8_activations", i.int8_activations.map_or(Json::Null, Json::str)),
        ];
        if let Some((e, k)) = i.experts {
            m.push(("experts", Json::uint(e as u64)));
            m.push(("experts_per_token", Json::uint(k as u64)));
        }
        println!("{}", Json::object(m).to_string_pretty());
        return Ok(());
    }
    println!("model         {}", i.path.display());
    println!("architecture  {}", i.architecture);
    println!("layers        {}", i.layers);
    println!("hidden        {}", i.hidden);
    println!("heads         {} ({} kv, head_dim {})", i.heads, i.kv_heads, i.head_dim);
    println!("intermediate  {}", i.intermediate);
    if let Some((e, k)) = i.experts {
        println!("experts       {e} ({k} per token)");
    }
    println!("vocab         {}", i.vocab);
    println!("parameters    {} ({:.2} M)", i.parameters, i.parameters as f64 / 1e6);
    println!("dtypes        {}", i.dtypes.join(", "));
    println!("weights       {} bytes", i.weight_bytes);
    println!("kv cache      {} bytes ({} tokens)", i.kv_bytes, i.context);
    println!("scratch       {} bytes", i.scratch_bytes);
    println!("resident      {} bytes", i.weight_bytes + i.kv_bytes + i.scratch_bytes);
    println!("budget        {} bytes (memory used {} bytes)", model.budget().bytes, model.memory_used());
    println!("kernels       {} x {} threads{}", i.isa, i.threads, int8_note(&i));
    if let Some(t) = &i.tokenizer {
        println!("tokenizer     {}", t.display());
    }
    Ok(())
}

/// ", int8 activations (KERNELS)" when the opt-in path is on.
fn int8_note(i: &waste::ModelInfo) -> String {
    i.int8_activations.map_or(String::new(), |k| format!(", int8 activations ({k})"))
}

fn bench(a: &Args) -> Outcome {
    let prompt_tokens = a.num("prompt-tokens", 1usize, waste::MAX_CONTEXT)?.unwrap_or(128);
    let n = a.num("n", 1usize, waste::MAX_CONTEXT)?.unwrap_or(64);
    let mut opts = model_options(a)?;
    if opts.ctx == 0 {
        opts.ctx = prompt_tokens + n;
    }
    let mut model = Model::open(model_path(a)?, &opts)?;
    report_budget(&model);
    let report = waste::model::bench::run(&mut model, prompt_tokens, n)?;
    let i = model.info();
    if a.flag("json") {
        println!("{}", Json::object([
            ("prompt_tokens", Json::uint(prompt_tokens as u64)),
            ("decode_tokens", Json::uint(n as u64)),
            ("prefill_tok_s", Json::float(report.prefill_tok_s)),
            ("decode_tok_s", Json::float(report.decode_tok_s)),
            ("threads", Json::uint(i.threads as u64)),
            ("isa", Json::str(i.isa)),
            ("int8_activations", i.int8_activations.map_or(Json::Null, Json::str)),
            ("memory_used_bytes", Json::uint(model.memory_used())),
            ("budget_bytes", Json::uint(model.budget().bytes)),
            ("peak_rss_bytes", peak_rss().map_or(Json::Null, Json::uint)),
            ("decode_hit_rate", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::float(c.hit_rate()))),
            ("decode_misses", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::uint(c.misses))),
            ("decode_bytes_read_per_token", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::uint(c.bytes_read / n as u64))),
        ]).to_string_pretty());
    } else {
        println!("model    {} ({}, {})", i.path.display(), i.architecture, i.dtypes.join(","));
        println!("kernels  {} x {} threads{}", i.isa, i.threads, int8_note(&i));
        println!("prefill  {prompt_tokens} tokens  {:.2} tok/s", report.prefill_tok_s);
        println!("decode   {n} tokens  {:.2} tok/s", report.decode_tok_s);
        if let Some(rss) = peak_rss() {
            println!("memory   holds {} bytes, budget {} bytes, peak RSS {rss} bytes", model.memory_used(), model.budget().bytes);
        }
        if let Some(c) = &report.decode_cache {
            println!("experts  {} slots, decode hit rate {:.1}%, {:.1} MiB read per token, {:.2} s I/O wait, {}",
                c.slots, 100.0 * c.hit_rate(), c.bytes_read as f64 / n as f64 / 1048576.0, c.io_wait.as_secs_f64(),
                if c.direct_io { "O_DIRECT" } else { "buffered reads" });
            if c.prefetched > 0 {
                println!("ahead    {} records read ahead, {} of them used ({:.0}%)", c.prefetched, c.prefetch_hits,
                    100.0 * c.prefetch_hits as f64 / c.prefetched as f64);
            }
        }
    }
    Ok(())
}

fn random_model(a: &Args) -> Outcome {
    use waste::format::random;
    let out = a.value("out").ok_or_else(|| Failure::Usage("missing --out DIR".into()))?;
    let config = match (a.value("preset"), a.value("config")) {
        (Some(p), None) => random::preset(p).ok_or_else(|| Failure::Usage(format!(
            "option `--preset`: unknown preset `{p}` (known: {})", random::PRESETS.join(", "))))?,
        (None, Some(f)) => waste::format::read_json(Path::new(f), 4 << 20)?,
        _ => return Err(Failure::Usage("give exactly one of --preset NAME or --config FILE".into())),
    };
    let dtype = match a.value("dtype").unwrap_or("bf16") {
        "bf16" => waste::format::dtype::DType::BF16,
        "f16" => waste::format::dtype::DType::F16,
        "f32" => waste::format::dtype::DType::F32,
        other => return Err(Failure::Usage(format!("option `--dtype`: `{other}` is not bf16, f16 or f32"))),
    };
    let seed = a.num("seed", 0u64, u64::MAX)?.unwrap_or(1);
    let t = Instant::now();
    let is_moe = config.get("num_experts").or(config.get("num_local_experts")).is_some();
    let bytes = if a.flag("container") || is_moe {
        let experts = match a.value("experts").unwrap_or("q4") {
            "q4" => waste::format::dtype::DType::Q4B32,
            "q8" => waste::format::dtype::DType::Q8B32,
            other => return Err(Failure::Usage(format!("option `--experts`: `{other}` is not q4 or q8"))),
        };
        random::write_container(Path::new(out), &config, experts, seed)?
    } else {
        random::write_checkpoint(Path::new(out), &config, dtype, seed)?
    };
    eprintln!("wrote {out}: {bytes} bytes in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}
