//! The commands: each turns parsed arguments into library calls and renders the result.

use super::args::{Args, Usage};
use super::out::{errln, outln};
use std::io::Read;
use std::path::Path;
use std::time::Instant;
use waste::format::json::Json;
use waste::{GenerateParams, Model, Options, SamplingParams};

/// Why a command ended early: bad arguments (exit 2), a runtime error (exit 1), or standard
/// output closed by its reader (exit 0, quietly: see `out`).
pub enum Failure {
    Usage(String),
    Run(waste::Error),
    Closed,
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
        "chat" => super::chat::chat(a),
        "eval" => eval(a),
        "info" => info(a),
        "bench" => bench(a),
        "bench tokenize" => super::tokenize::bench(a),
        "tokenize" => super::tokenize::tokenize(a),
        "detokenize" => super::tokenize::detokenize(a),
        "template" => super::template::run(a),
        "plan" => super::plan::run(a),
        "random-model" => random_model(a),
        "serve" => super::serve::run(a),
        "quantize" => super::quant::quantize(a),
        "compare" => super::quant::compare(a),
        "convert" => super::moe::convert(a),
        "bench cache" => super::moe::bench_cache(a),
        "bench matmul" => super::bench_matmul::run(a),
        "bench attention" => super::bench_attention::run(a),
        "bench disk" => super::moe::bench_disk(a),
        "bench state" => bench_state(a),
        "version" => {
            outln!("waste {}", waste::VERSION);
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
    // `--scalar` with `--isa` naming another set is refused by `Options::validate`.
    o.isa = isa(a)?;
    o.tiles = !a.flag("no-tiles");
    o.activations = activations(a)?;
    o.budget = budget(a)?;
    if let Some(c) = a.size("cache", 1, u64::MAX)? {
        o.cache_bytes = c;
    }
    if let Some(n) = a.num("io-threads", 0usize, 256)? {
        o.io_threads = n;
    }
    o.verify = a.flag("verify");
    // The look-ahead is on by default (guarded: `cache::ahead`); `--lookahead` is still accepted.
    o.lookahead = !a.flag("no-lookahead");
    o.purgeable_slots = a.flag("purgeable");
    o.huge_pages = !a.flag("no-huge-pages");
    o.hotlist = !a.flag("no-hotlist");
    o.usage_file = a.path("usage-file").map(Path::to_path_buf);
    if let Some(n) = a.num("sessions", 1usize, waste::MAX_SESSIONS)? {
        o.sessions = n;
    }
    Ok(o)
}

/// `--f32-act`, `--int8-act`, `--int16-act`, `--int21-act`: at most one, else the default
/// (the model commands and `plan`).
pub(super) fn activations(a: &Args) -> Result<waste::Activations, Failure> {
    use waste::Activations;
    let paths = [("f32-act", Activations::F32), ("int8-act", Activations::Int8), ("int16-act", Activations::Int16), ("int21-act", Activations::Int21)];
    let on: Vec<Activations> = paths.into_iter().filter(|(name, _)| a.flag(name)).map(|(_, path)| path).collect();
    match on[..] {
        [] => Ok(Activations::Auto),
        [one] => Ok(one),
        _ => Err(Failure::Usage("--f32-act, --int8-act, --int16-act and --int21-act choose between paths: give one".into())),
    }
}

/// `--isa NAME`: the one parser of it (the model commands, `plan` and the kernel benches).
pub(super) fn isa(a: &Args) -> Result<Option<waste::kernels::Isa>, Failure> {
    use waste::kernels::Isa;
    let Some(name) = a.value("isa") else { return Ok(None) };
    Isa::from_name(name).map(Some).ok_or_else(|| {
        let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
        Failure::Usage(format!("option `--isa`: `{name}` is not one of {}", names.join(", ")))
    })
}

/// `--budget SIZE`: the one parser of it (`plan` and the model commands alike).
pub(super) fn budget(a: &Args) -> Result<Option<u64>, Failure> {
    Ok(a.size("budget", 1, u64::MAX)?)
}

pub(super) fn model_path(a: &Args) -> Result<&Path, Failure> {
    a.positional_path(0).ok_or_else(|| Failure::Usage("missing MODEL".into()))
}

/// The prompt from the argument, `--file`, or stdin (`-` or piped); `None` when there is none.
fn read_prompt(a: &Args) -> Result<Option<String>, Failure> {
    match (a.positional_text(1, "PROMPT")?, a.path("file")) {
        (Some(_), Some(_)) => Err(Failure::Usage("give the prompt as an argument or with --file, not both".into())),
        (Some("-"), None) => read_stdin().map(Some),
        (Some(p), None) => Ok(Some(p.to_string())),
        (None, Some(f)) => {
            let mut s = String::new();
            std::fs::File::open(f).and_then(|mut h| h.read_to_string(&mut s)).map_err(|e| io_err(f, "read", e))?;
            Ok(Some(s))
        }
        (None, None) if !waste::host::stdin_is_tty() => read_stdin().map(Some),
        (None, None) => Ok(None),
    }
}

fn read_stdin() -> Result<String, Failure> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).map_err(|e| io_err(Path::new("<stdin>"), "read", e))?;
    Ok(s)
}

pub(super) fn sampling(a: &Args) -> Result<(SamplingParams, bool), Failure> {
    let mut p = SamplingParams::default();
    if let Some(t) = a.num("temp", 0.0f32, 100.0)? {
        p.temperature = t;
    }
    if let Some(k) = a.num("top-k", 0usize, 1 << 24)? {
        p.top_k = k;
    }
    if let Some(v) = a.num_where("top-p", |v: f32| v > 0.0 && v <= 1.0, "must be > 0 and <= 1")? {
        p.top_p = v;
    }
    if let Some(v) = a.num("min-p", 0.0f32, 1.0)? {
        p.min_p = v;
    }
    if let Some(v) = a.num_where("repeat-penalty", |v: f32| v > 0.0 && v <= 100.0, "must be > 0 and <= 100")? {
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
    let mut trace = super::trace::TraceOut::start(a, &mut model);
    super::trace::learn(a, &mut model)?;
    let ids = session_prompt(&mut model, a, PromptText::Plain(&prompt))?;
    // Checked before the prompt is echoed: a failed run prints nothing on stdout.
    if ids.len() > model.context() {
        return Err(Failure::Run(waste::Error::new(waste::ErrorKind::Context, format!(
            "the prompt is {} tokens{}, more than the context of {} (see --ctx)", ids.len(),
            if ids.len() > model.session().tokens().len() && !model.session().tokens().is_empty() { " with the loaded session" } else { "" },
            model.context()))));
    }
    if ids.is_empty() {
        return Err(Failure::Usage("the prompt has no tokens (give a prompt, or --load-state a session)".into()));
    }
    let params = GenerateParams {
        max_tokens,
        sampling,
        stop: a.values("stop").iter().map(|s| s.to_string()).collect(),
        stop_tokens: Vec::new(),
        stop_at_eos: !a.flag("ignore-eos"),
    };
    super::out::stdout_bytes(prompt.as_bytes())?;
    // The first failed write ends generation: a closed pipe (the reader has what it wanted)
    // or a real error, reported after generate returns.
    let mut write_error = None;
    let summary = model.generate(&ids, &params, |ev| match super::out::stdout_bytes(ev.text.as_bytes()) {
        Ok(()) => true,
        Err(f) => {
            write_error = Some(f);
            false
        }
    })?;
    if let Some(f) = write_error {
        return Err(f);
    }
    outln!();
    save_state(&model, a)?;
    if let Some(t) = &mut trace {
        t.flush(&mut model)?;
    }
    super::trace::save_usage(a, &mut model, true)?;
    let seed = (!seeded && params.sampling.temperature > 0.0).then_some(params.sampling.seed);
    let experts = model.cache_stats().map(super::moe::stats_suffix).unwrap_or_default();
    errln!("{}", summary_line(&summary, seed, &experts));
    Ok(())
}

/// The run's one stderr line: `[N tokens, S s, X tok/s | prefill P tokens, T s | stop: WHY]`
/// (see `waste run --help` for what each figure times).
pub(super) fn summary_line(s: &waste::GenerateSummary, seed: Option<u64>, experts: &str) -> String {
    let rate = s.tokens_per_second().map_or("-".to_string(), |r| format!("{r:.2}"));
    let seed = seed.map_or(String::new(), |v| format!(" | seed {v}"));
    let reused = match (s.reused_tokens, s.state_reset) {
        (_, true) => " (the session's recurrent state could not be cut back: all prefilled again)".to_string(),
        (0, false) => String::new(),
        (n, false) => format!(" ({n} reused)"),
    };
    format!("[{} tokens, {:.2} s, {rate} tok/s | prefill {} tokens{reused}, {:.2} s | stop: {}{seed}{experts}]",
        s.tokens, s.decode_time.as_secs_f64(), s.prefilled_tokens, s.prefill_time.as_secs_f64(), s.stop_reason.describe())
}

/// How a prompt's text is tokenized: as content (special-token strings stay text), or as
/// markup (they become control tokens).
pub(super) enum PromptText<'a> {
    Plain(&'a str),
    Markup(&'a str),
    Ids(Vec<u32>),
}

/// The tokens a command runs: with `--load-state`, the loaded session's tokens followed by the
/// prompt's (no BOS: the session has begun); otherwise the prompt's, after the BOS token when
/// the vocabulary uses one.
pub(super) fn session_prompt(model: &mut Model, a: &Args, prompt: PromptText) -> Result<Vec<u32>, Failure> {
    if let Some(p) = a.path("load-state") {
        model.session_mut().load_state(p)?;
    }
    let mut ids = model.session().tokens().to_vec();
    let text = match prompt {
        PromptText::Ids(list) => {
            ids.extend(list);
            return Ok(ids);
        }
        PromptText::Plain(text) => (text, false),
        PromptText::Markup(text) => (text, true),
    };
    let tok = model.tokenizer()?;
    if ids.is_empty() {
        ids.extend(tok.bos());
    }
    ids.extend(if text.1 { tok.tokenize_markup(text.0) } else { tok.tokenize(text.0) });
    Ok(ids)
}

/// `--save-state PATH`: saves the model's own session.
pub(super) fn save_state(model: &Model, a: &Args) -> Outcome {
    if let Some(p) = a.path("save-state") {
        model.session().save_state(p)?;
    }
    Ok(())
}

/// This process's peak resident set (VmHWM of /proc/self/status), where the OS reports it.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// Tells the user (on stderr) the budget the model runs under and how it was chosen, and any
/// warning about it: one line for every command that opens a model.
/// Says on stderr what budget the engine chose (issue 6: a chosen budget is reported; one the
/// user gave is not repeated) and any warning about it.
fn report_budget(model: &Model) {
    let b = model.budget();
    if let Some(w) = &b.warning {
        errln!("waste: warning: {w}");
    }
    for n in model.notes() {
        errln!("waste: {n}");
    }
    if b.source == waste::BudgetSource::Explicit {
        return;
    }
    let how = match b.source {
        waste::BudgetSource::Explicit => "given".to_string(),
        waste::BudgetSource::WorkingSets(n) => format!("chosen: floor + {n} working set{}", if n == 1 { "" } else { "s" }),
        waste::BudgetSource::Floor => "chosen: the floor".to_string(),
        waste::BudgetSource::Cache => "from --cache: the floor's parts + that cache".to_string(),
    };
    let h = super::plan::human;
    let cache = if model.plan().has_experts() {
        format!("expert cache {}", h(b.expert_cache_bytes).trim())
    } else {
        "no expert cache (nothing streams)".to_string()
    };
    errln!("[budget {} ({how}), {cache}, holding {}]", h(b.bytes).trim(), h(model.memory_used()).trim());
}

pub(super) fn parse_ids(list: &str) -> Result<Vec<u32>, Failure> {
    list.split(',')
        .map(|s| s.trim().parse::<u32>().map_err(|_| Failure::Usage(format!("option `--ids`: `{s}` is not a token id"))))
        .collect()
}

/// Writes every position's logits of `ids` to `path` (raw little-endian f32, positions ×
/// vocab) as the model computes them, one row at a time: nothing of the whole is held.
fn dump_logits(model: &mut Model, ids: &[u32], path: &Path) -> Outcome {
    use std::io::Write;
    let mut out = waste::format::safetensors::TempFile::create(path)?;
    let mut w = std::io::BufWriter::new(out.file());
    model.eval_each(ids, |_, logits| {
        logits.iter().try_for_each(|v| w.write_all(&v.to_le_bytes())).map_err(|e| waste::Error::io(path, "write", e))
    })?;
    w.flush().map_err(|e| io_err(path, "write", e))?;
    drop(w);
    out.commit()?;
    Ok(())
}

/// Writes the hidden states of `ids` to `path` (raw little-endian f32, [layers + 2] ×
/// positions × hidden) as the model streams them, each chunk's rows at their place in the
/// file: nothing of the whole is held.
fn dump_hidden(model: &mut Model, ids: &[u32], path: &Path) -> Outcome {
    use std::os::unix::fs::FileExt;
    let mut out = waste::format::safetensors::TempFile::create(path)?;
    let (slots, hidden) = (model.info().layers as u64 + 2, model.info().hidden as u64);
    let file = out.file();
    file.set_len(slots * ids.len() as u64 * hidden * 4).map_err(|e| io_err(path, "size", e))?;
    let mut bytes = Vec::with_capacity(64 << 10);
    model.hidden_states_each(ids, |slot, first, rows| {
        let mut at = (slot as u64 * ids.len() as u64 + first as u64) * hidden * 4;
        for part in rows.chunks(16 << 10) {
            bytes.clear();
            bytes.extend(part.iter().flat_map(|v| v.to_le_bytes()));
            file.write_all_at(&bytes, at).map_err(|e| waste::Error::io(path, "write", e))?;
            at += bytes.len() as u64;
        }
        Ok(())
    })?;
    out.commit()?;
    Ok(())
}

fn eval(a: &Args) -> Outcome {
    let top = a.num("top", 1usize, 1 << 20)?.unwrap_or(10);
    let opts = model_options(a)?;
    let mut model = Model::open(model_path(a)?, &opts)?;
    // With --ids, stdin is not a prompt source (it may simply not be a terminal).
    let prompt = if a.value("ids").is_some() && a.positional_count() < 2 && a.path("file").is_none() { None } else { read_prompt(a)? };
    let text = match (a.value("ids"), prompt.as_deref()) {
        (Some(_), Some(_)) => return Err(Failure::Usage("give a prompt or --ids, not both".into())),
        (Some(list), None) => PromptText::Ids(parse_ids(list)?),
        (None, Some(p)) if a.flag("markup") => PromptText::Markup(p),
        (None, Some(p)) => PromptText::Plain(p),
        (None, None) => return Err(Failure::Usage("missing PROMPT or --ids".into())),
    };
    let all = session_prompt(&mut model, a, text)?;
    // The session's tokens (a loaded state's) are held already: eval appends the prompt's.
    let computed = model.position();
    let ids = all[model.session().tokens().len()..].to_vec();
    if ids.is_empty() {
        return Err(Failure::Usage("the prompt has no tokens".into()));
    }
    report_budget(&model);
    // The dumps stream to their files: eval holds nothing of size positions × vocab.
    if let Some(path) = a.path("dump-hidden") {
        if computed > 0 {
            return Err(Failure::Usage("--dump-hidden runs from an empty session: not with --load-state".into()));
        }
        dump_hidden(&mut model, &ids, path)?;
        model.reset();
    }
    match a.path("dump-logits") {
        Some(path) => dump_logits(&mut model, &ids, path)?,
        None => {
            model.eval(&ids)?;
        }
    }
    save_state(&model, a)?;
    let cands = waste::sample::top_k_distribution(model.logits(), top);
    let text = |id: u32| -> String {
        model.tokenizer().ok().and_then(|t| t.token_bytes(id).ok().map(|b| String::from_utf8_lossy(b).into_owned())).unwrap_or_default()
    };
    if a.flag("json") {
        let doc = Json::object([
            ("tokens", Json::Array(ids.iter().map(|&i| Json::uint(i as u64)).collect())),
            ("top", Json::Array(cands.iter().map(|c| Json::object([
                ("id", Json::uint(c.id as u64)),
                ("text", Json::str(text(c.id))),
                ("logit", Json::float(c.logit as f64)),
                ("prob", Json::float(c.prob)),
            ])).collect())),
        ]);
        outln!("{}", doc.to_string_pretty());
    } else {
        outln!("{} prompt tokens; next-token distribution:", ids.len());
        for c in &cands {
            outln!("{:>8}  {:>10.4}  {:>8.5}  {:?}", c.id, c.logit, c.prob, text(c.id));
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
            ("activations", Json::str(i.activations.name())),
            ("activation_kernels", i.activation_kernels.map_or(Json::Null, Json::str)),
        ];
        if let Some((e, k)) = i.experts {
            m.push(("experts", Json::uint(e as u64)));
            m.push(("experts_per_token", Json::uint(k as u64)));
        }
        if i.mtp_layers > 0 {
            m.push(("mtp_layers_skipped", Json::uint(i.mtp_layers as u64)));
        }
        if let Some(mode) = i.io_mode {
            m.push(("expert_cache_bytes", Json::uint(i.expert_cache_bytes)));
            m.push(("expert_banks", Json::uint(i.expert_banks as u64)));
            m.push(("expert_io", Json::str(mode)));
        }
        outln!("{}", Json::object(m).to_string_pretty());
        return Ok(());
    }
    outln!("model         {}", i.path.display());
    outln!("architecture  {}", i.architecture);
    outln!("layers        {}", i.layers);
    outln!("hidden        {}", i.hidden);
    outln!("heads         {} ({} kv, head_dim {})", i.heads, i.kv_heads, i.head_dim);
    outln!("intermediate  {}", i.intermediate);
    if let Some((e, k)) = i.experts {
        outln!("experts       {e} ({k} per token)");
    }
    if let Some(mode) = i.io_mode {
        outln!("expert cache  {} bytes ({:.1} MiB)", i.expert_cache_bytes, i.expert_cache_bytes as f64 / (1 << 20) as f64);
        outln!("expert banks  {} ({mode})", i.expert_banks);
    }
    if i.mtp_layers > 0 {
        outln!("mtp layers    {} skipped (not part of the next-token forward pass: model.layers.{}.* are never read)",
            i.mtp_layers, i.layers);
    }
    outln!("vocab         {}", i.vocab);
    outln!("parameters    {} ({:.2} M)", i.parameters, i.parameters as f64 / 1e6);
    outln!("dtypes        {}", i.dtypes.join(", "));
    outln!("weights       {} bytes", i.weight_bytes);
    outln!("kv cache      {} bytes ({} tokens)", i.kv_bytes, i.context);
    outln!("scratch       {} bytes", i.scratch_bytes);
    outln!("resident      {} bytes", i.weight_bytes + i.kv_bytes + i.scratch_bytes);
    outln!("budget        {} bytes (memory used {} bytes)", model.budget().bytes, model.memory_used());
    outln!("kernels       {} x {} threads{}", i.isa, i.threads, activations_note(&i));
    if let Some(t) = &i.tokenizer {
        outln!("tokenizer     {}", t.display());
    }
    Ok(())
}

/// ", int8 activations (KERNELS)" (or int16, int21) when an integer path is on; ", int21
/// decode (KERNELS)" when the default turned it on for decode.
fn activations_note(i: &waste::ModelInfo) -> String {
    match (i.activations, i.activation_kernels) {
        (_, None) => String::new(),
        (waste::Activations::Auto, Some(k)) => format!(", int21 decode ({k})"),
        (a, Some(k)) => format!(", {} activations ({k})", a.name()),
    }
}

fn bench(a: &Args) -> Outcome {
    let prompt_tokens = a.num("prompt-tokens", 1usize, waste::MAX_CONTEXT)?.unwrap_or(128);
    let n = a.num("n", 1usize, waste::MAX_CONTEXT)?.unwrap_or(64);
    let warmup = a.num("warmup", 0usize, waste::MAX_CONTEXT)?.unwrap_or(0);
    let mut opts = model_options(a)?;
    if opts.ctx == 0 {
        opts.ctx = prompt_tokens + n.max(warmup);
    }
    let mut model = Model::open(model_path(a)?, &opts)?;
    report_budget(&model);
    // Before the trace, the recording and the counting start: they cover the timed run only.
    if warmup > 0 {
        waste::tools::bench::warm_up(&mut model, prompt_tokens, warmup)?;
    }
    super::trace::replay(a, &mut model)?;
    let mut trace = super::trace::TraceOut::start(a, &mut model);
    super::trace::learn(a, &mut model)?;
    let report = waste::tools::bench::run(&mut model, prompt_tokens, n)?;
    if let Some(t) = &mut trace {
        t.flush(&mut model)?;
    }
    super::trace::save_usage(a, &mut model, !a.flag("json"))?;
    let i = model.info();
    if a.flag("json") {
        outln!("{}", Json::object([
            ("prompt_tokens", Json::uint(prompt_tokens as u64)),
            ("decode_tokens", Json::uint(n as u64)),
            ("warmup_tokens", Json::uint(warmup as u64)),
            ("prefill_chunk", Json::uint(model.plan().prefill_chunk as u64)),
            ("prefill_tok_s", Json::float(report.prefill_tok_s)),
            ("decode_tok_s", Json::float(report.decode_tok_s)),
            ("threads", Json::uint(i.threads as u64)),
            ("isa", Json::str(i.isa)),
            ("activations", Json::str(i.activations.name())),
            ("activation_kernels", i.activation_kernels.map_or(Json::Null, Json::str)),
            ("memory_used_bytes", Json::uint(model.memory_used())),
            ("budget_bytes", Json::uint(model.budget().bytes)),
            ("peak_rss_bytes", peak_rss().map_or(Json::Null, Json::uint)),
            ("prefill_secs", Json::float(report.prefill_secs)),
            ("prefill_bytes_read", report.prefill_cache.as_ref().map_or(Json::Null, |c| Json::uint(c.bytes_read))),
            ("prefill_io_wait_secs", report.prefill_cache.as_ref().map_or(Json::Null, |c| Json::float(c.io_wait.as_secs_f64()))),
            ("prefill_disk_busy_secs", report.prefill_cache.as_ref().map_or(Json::Null, |c| Json::float(c.disk_busy.as_secs_f64()))),
            ("decode_hit_rate", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::float(c.hit_rate()))),
            ("decode_misses", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::uint(c.misses))),
            ("decode_bytes_read_per_token", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::uint(c.bytes_read / n as u64))),
            ("decode_secs", Json::float(report.decode_secs)),
            ("decode_io_wait_secs", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::float(c.io_wait.as_secs_f64()))),
            ("decode_disk_busy_secs", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::float(c.disk_busy.as_secs_f64()))),
            ("decode_read_secs", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::float(c.read_time.as_secs_f64()))),
            ("decode_read_ahead", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::uint(c.prefetched))),
            ("decode_read_ahead_used", report.decode_cache.as_ref().map_or(Json::Null, |c| Json::uint(c.prefetch_hits))),
            // The whole run's counters (prefill included), which a --trace-out file replayed
            // through `waste bench cache --slots` reproduces.
            ("cache_slots", model.cache_stats().map_or(Json::Null, |c| Json::uint(c.slots as u64))),
            ("cache_hits", model.cache_stats().map_or(Json::Null, |c| Json::uint(c.hits))),
            ("cache_misses", model.cache_stats().map_or(Json::Null, |c| Json::uint(c.misses))),
            ("cache_purged", model.cache_stats().map_or(Json::Null, |c| Json::uint(c.purged))),
            ("cache_taken_back", model.cache_stats().map_or(Json::Null, |c| Json::uint(c.taken_back))),
        ]).to_string_pretty());
    } else {
        outln!("model    {} ({}, {})", i.path.display(), i.architecture, i.dtypes.join(","));
        outln!("kernels  {} x {} threads{}", i.isa, i.threads, activations_note(&i));
        outln!("prefill  {prompt_tokens} tokens  {:.2} tok/s  (chunk {})", report.prefill_tok_s, model.plan().prefill_chunk);
        outln!("decode   {n} tokens  {:.2} tok/s", report.decode_tok_s);
        if let Some(rss) = peak_rss() {
            outln!("memory   holds {} bytes, budget {} bytes, peak RSS {rss} bytes", model.memory_used(), model.budget().bytes);
        }
        if let Some(c) = report.prefill_cache.as_ref().filter(|c| !c.disk_busy.is_zero()) {
            let busy = c.disk_busy.as_secs_f64();
            outln!("prefill  read {:.1} MiB, {:.2} s I/O wait; disk busy {busy:.2} s of the prefill's {:.2} s: {:.2} GB/s while busy",
                c.bytes_read as f64 / 1048576.0, c.io_wait.as_secs_f64(), report.prefill_secs, c.bytes_read as f64 / busy / 1e9);
        }
        if let Some(c) = &report.decode_cache {
            outln!("experts  {} slots, decode hit rate {:.1}%, {:.1} MiB read per token, {:.2} s I/O wait, {}",
                c.slots, 100.0 * c.hit_rate(), c.bytes_read as f64 / n as f64 / 1048576.0, c.io_wait.as_secs_f64(),
                if c.direct_io { "O_DIRECT" } else { "buffered reads" });
            if !c.disk_busy.is_zero() {
                let busy = c.disk_busy.as_secs_f64();
                outln!("disk     busy {busy:.2} s of the decode's {:.2} s: {:.2} GB/s while busy, {:.1} reads in flight on average",
                    report.decode_secs, c.bytes_read as f64 / busy / 1e9, c.read_time.as_secs_f64() / busy);
            }
            if c.prefetched > 0 {
                outln!("ahead    {} records read ahead, {} of them used ({:.0}%){}", c.prefetched, c.prefetch_hits,
                    100.0 * c.prefetch_hits as f64 / c.prefetched as f64,
                    if c.prefetch_held > 0 { format!("; {} look-aheads held back (too few used)", c.prefetch_held) } else { String::new() });
                if c.prefetch_cancelled > 0 {
                    outln!("ahead    {} look-ahead reads taken back before they started (the guess was shown wrong in time)", c.prefetch_cancelled);
                }
            }
            if c.taken_back > 0 {
                outln!("offered  {} slots offered to the kernel now (purgeable); {} lookups took their pages back", c.offered, c.taken_back);
            }
            if c.purged > 0 {
                outln!("purged   {} slots taken back by the kernel under memory pressure, read again", c.purged);
            }
        }
    }
    Ok(())
}

/// `waste bench state`: the cost of saving and loading a session beside recomputing it.
fn bench_state(a: &Args) -> Outcome {
    let tokens = a.num("tokens", 1usize, waste::MAX_CONTEXT)?.unwrap_or(4096);
    let mut opts = model_options(a)?;
    if opts.ctx == 0 {
        opts.ctx = tokens;
    }
    let path = match a.path("state") {
        Some(p) => p.to_path_buf(),
        None => std::env::temp_dir().join(format!("waste-bench-{}.state", std::process::id())),
    };
    let mut model = Model::open(model_path(a)?, &opts)?;
    report_budget(&model);
    let r = waste::tools::bench::state(&mut model, tokens, &path);
    if a.path("state").is_none() {
        let _ = std::fs::remove_file(&path);
    }
    let r = r?;
    let mib = r.file_bytes as f64 / (1 << 20) as f64;
    if a.flag("json") {
        outln!("{}", Json::object([
            ("tokens", Json::uint(r.tokens as u64)),
            ("prefill_s", Json::float(r.prefill_secs)),
            ("save_s", Json::float(r.save_secs)),
            ("load_s", Json::float(r.load_secs)),
            ("file_bytes", Json::uint(r.file_bytes)),
        ]).to_string_pretty());
    } else {
        outln!("state    {} tokens, {:.1} MiB", r.tokens, mib);
        outln!("prefill  {:.3} s ({:.1} tok/s): what a load replaces", r.prefill_secs, r.tokens as f64 / r.prefill_secs.max(1e-9));
        outln!("save     {:.3} s ({:.0} MiB/s)", r.save_secs, mib / r.save_secs.max(1e-9));
        outln!("load     {:.3} s ({:.0} MiB/s), {:.0}x faster than the prefill", r.load_secs, mib / r.load_secs.max(1e-9),
            r.prefill_secs / r.load_secs.max(1e-9));
    }
    Ok(())
}

fn random_model(a: &Args) -> Outcome {
    use waste::tools::random;
    let out = a.path("out").ok_or_else(|| Failure::Usage("missing --out DIR".into()))?;
    let config = match (a.value("preset"), a.path("config")) {
        (Some(p), None) => random::preset(p).ok_or_else(|| Failure::Usage(format!(
            "option `--preset`: unknown preset `{p}` (known: {})", random::PRESETS.join(", "))))?,
        (None, Some(f)) => waste::format::read_json(f, 4 << 20)?,
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
        random::write_container(out, &config, experts, seed)?
    } else {
        random::write_checkpoint(out, &config, dtype, seed)?
    };
    errln!("wrote {}: {bytes} bytes in {:.1} s", out.display(), t.elapsed().as_secs_f64());
    Ok(())
}
