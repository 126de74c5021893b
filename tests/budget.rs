//! The hard RAM ceiling (seed 001 §3) from the engine's side: what a model holds after open
//! is its plan, part by part; the minimum cache of a model with fewer records than 2 × top-k;
//! a budget under the floor fails before any expert is read; a 64-token generation of a
//! streamed model whose experts are four times the budget keeps its peak RSS under the budget
//! (+2 %), and inside a real cgroup limited to the budget + 64 MiB with no swap it is not
//! killed; the per-thread constant the plan counts covers what a thread really costs.

mod common;
use common::cgroup::*;
use common::*;
use std::path::PathBuf;
use waste::tools::convert::{convert, ConvertOptions, Encoding};
use waste::format::json::{self, Json};
use waste::{plan_memory, ErrorKind, GenerateParams, Model, Options, SamplingParams};

const MIB: u64 = 1 << 20;

/// The budget of the streaming runs.
const BUDGET: u64 = 256 * MIB;

/// A random MoE container whose experts (q4, ~1.1 GiB) are four times a 256 MiB budget, with
/// r50k_base's tokenizer (so the vocabulary is 50257, embeddings tied) and a small trunk and
/// state: 10 layers of 64 experts, top-4.
fn big_moe() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = random_moe("budget-big-moe", r#"{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 1024,
            "intermediate_size": 2048, "moe_intermediate_size": 1024, "num_hidden_layers": 10, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 128, "num_experts": 64, "num_experts_per_tok": 4, "norm_topk_prob": true,
            "vocab_size": 50257, "tie_word_embeddings": true, "rms_norm_eps": 1e-6, "max_position_embeddings": 512}"#);
        std::fs::copy(fixture("tokenizers/r50k_base.tiktoken"), dir.join("r50k_base.tiktoken")).unwrap();
        // The manifest names the tokenizer the container carries (the open checks it).
        let mut m = waste::format::container::Manifest::open(&dir).unwrap();
        m.tokenizer_kind = Some("tiktoken".into());
        m.tokenizer_files = vec!["r50k_base.tiktoken".into()];
        m.write().unwrap();
        dir
    }).clone()
}

/// One MoE layer of 4 experts, 3 per token: fewer records than 2 × top-k.
fn tiny_moe() -> PathBuf {
    random_moe("budget-tiny-moe", r#"{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 3, "norm_topk_prob": true, "vocab_size": 96,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 64}"#)
}

fn random_moe(tag: &str, config: &str) -> PathBuf {
    let dir = temp_dir(tag).join("moe.waste");
    let cfg = json::parse(config.as_bytes()).unwrap();
    waste::tools::random::write_container(&dir, &cfg, waste::format::dtype::DType::Q4B32, 7).unwrap();
    dir
}

/// A fixture MoE checkpoint converted to a container (f32 trunk, bf16 experts).
fn converted(tag: &str, name: &str) -> PathBuf {
    let out = temp_dir(&format!("budget-{tag}-{name}")).join("c");
    let opts = ConvertOptions { trunk: Encoding::F32, experts: Encoding::BF16, ..ConvertOptions::new(oracle(name).dir.join("model"), &out) };
    convert(&opts, &mut |_| {}).unwrap();
    out
}

/// Every fixture model, stories260K (with its tokenizer), and containers: two converted
/// fixtures, the tiny MoE and the big one (with a real tokenizer).
fn models(tag: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixture("oracles")).unwrap()
        .map(|e| e.unwrap().path().join("model")).filter(|p| p.join("config.json").is_file()).collect();
    v.sort();
    v.push(root().join("models/stories260K"));
    v.extend(["mixtral_f32", "qwen3_moe_f32"].map(|n| converted(tag, n)));
    v.push(tiny_moe());
    v.push(big_moe());
    v
}

/// `memory_use()` after open is the plan computed from headers, part by part, whatever the
/// budget, and never more than the budget.
#[test]
fn memory_used_after_open_equals_the_plan() {
    for path in &models("plan") {
        for base in [Options { ctx: 64, threads: 2, ..Options::default() }, Options { ctx: 16, threads: 1, io_threads: 0, prefill_chunk: 3, ..Options::default() }] {
            let plan = plan_memory(path, &base).unwrap();
            let mut budgets = vec![None, Some(plan.floor_bytes())];
            if plan.has_experts() {
                budgets.push(Some(plan.floor_plus(1)));
                budgets.push(Some(plan.floor_plus(1) + plan.expert_slot_bytes / 2));
            }
            for budget in budgets {
                // The plan of the same options: a chunk left to the engine depends on the budget.
                let opts = Options { budget, ..base.clone() };
                let plan = plan_memory(path, &opts).unwrap();
                let m = Model::open(path, &opts).unwrap();
                assert_plan_matches(&plan, &m, &format!("{}: budget {budget:?}, {base:?}", path.display()));
                if let Some(b) = budget {
                    assert_eq!(m.budget().expert_cache_bytes, plan.expert_cache_bytes(b).unwrap());
                }
            }
        }
    }
}

/// A model with fewer expert records than 2 × top-k: the minimum cache is every record, the
/// same number in the plan, the cache and what the model holds, and it runs.
#[test]
fn the_minimum_cache_of_a_tiny_moe_is_every_record() {
    let dir = tiny_moe();
    for io_threads in [0, 2] {
        // The default chunk's floor: with the AMX tiles a model whose records all fit may get
        // the longer chunk, which needs more (under its floor the plan keeps the default).
        let opts = Options { ctx: 32, threads: 1, io_threads, prefill_chunk: 128, ..Options::default() };
        let plan = plan_memory(&dir, &opts).unwrap();
        assert_eq!(plan.expert_records, 4);
        assert_eq!(plan.min_expert_cache_bytes, plan.expert_cache_fixed_bytes + 4 * plan.expert_slot_bytes);
        let mut m = Model::open(&dir, &Options { budget: Some(plan.floor_bytes()), ..opts.clone() }).unwrap();
        assert_plan_matches(&plan, &m, &format!("tiny MoE at its floor, {io_threads} I/O threads"));
        assert_eq!(m.cache_stats().unwrap().slots, 4);
        assert_eq!(m.budget().expert_cache_bytes, plan.min_expert_cache_bytes);
        let summary = m.generate(&[1, 2, 3, 4, 5, 6], &GenerateParams { max_tokens: 12, stop_at_eos: false, ..GenerateParams::greedy() }, |_| true).unwrap();
        assert_eq!(summary.tokens, 12);
        assert!(m.cache_stats().unwrap().hits > 0, "every record fits: the second token onwards hits");
        // One byte less than the floor is refused.
        let e = Model::open(&dir, &Options { budget: Some(plan.floor_bytes() - 1), ..opts }).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::RamBudget);
    }
}

/// Under the floor: the dedicated error, the floor in bytes, `plan` — and no expert is read
/// (every record of the container is corrupt, so reading one would fail differently).
#[test]
fn budget_under_the_floor_fails_before_any_expert_is_read() {
    let dir = converted("floor", "qwen3_moe_f32");
    let manifest = waste::format::container::Manifest::open(&dir).unwrap();
    for b in &manifest.banks {
        let p = manifest.bank_path(b);
        let mut bytes = std::fs::read(&p).unwrap();
        for e in 0..b.experts {
            bytes[e * b.layout.record_bytes] = b'X';
        }
        std::fs::write(&p, bytes).unwrap();
    }
    // The floor of the default chunk: the longer one a streamed model may get needs more
    // (under its floor the plan keeps the default, so this is the floor a budget meets).
    let plan = waste::plan_memory(&dir, &waste::Options { ctx: 0, prefill_chunk: 128, ..waste::Options::default() }).unwrap();
    let floor = plan.floor_bytes();
    assert_eq!(waste::plan_memory(&dir, &Options { budget: Some(floor - 1), ..Options::default() }).unwrap().prefill_chunk, 128);
    let err = Model::open(&dir, &Options { budget: Some(floor - 1), ..Options::default() }).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::RamBudget);
    let (code, _, stderr) = waste(&["eval", dir.to_str().unwrap(), "--ids", "1,2,3", "--budget", &(floor - 1).to_string()]);
    assert_ne!(code, 0);
    assert!(stderr.contains(&floor.to_string()) && stderr.contains("plan"), "{stderr}");
    assert!(!stderr.contains("magic"), "{stderr}");
}

/// `waste run` of 64 sampled tokens with the tokenizer, under the budget.
fn run_args(dir: &std::path::Path) -> Vec<String> {
    ["run", dir.to_str().unwrap(), "Once upon a time", "-n", "64", "--temp", "0.8", "--seed", "7", "--ignore-eos",
        "--budget", &BUDGET.to_string()].iter().map(|s| s.to_string()).collect()
}

/// The misses of a run's summary line (`| experts H hit / M miss`).
fn misses(stderr: &str) -> u64 {
    stderr.split(" hit / ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no expert statistics in {stderr}"))
}

#[test]
fn peak_rss_of_a_generation_stays_under_the_budget_while_experts_stream() {
    let dir = big_moe();
    let manifest = waste::format::container::Manifest::open(&dir).unwrap();
    assert!(manifest.expert_bytes() >= 4 * BUDGET, "experts {} vs budget {BUDGET}", manifest.expert_bytes());
    let args = run_args(&dir);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_waste"));
    cmd.args(&args);
    let r = run_measured(cmd);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("[64 tokens"), "a 64-token generation: {}", r.stderr);
    assert!(r.stdout.len() > "Once upon a time".len(), "the text is printed: {}", r.stdout);
    println!("budget {BUDGET}, peak RSS {} ({:+.2} %), decode misses {}", r.peak_rss,
        100.0 * (r.peak_rss as f64 / BUDGET as f64 - 1.0), misses(&r.stderr));
    assert!(misses(&r.stderr) > 0, "the experts must stream: {}", r.stderr);
    assert!(r.peak_rss as f64 <= BUDGET as f64 * 1.02, "peak RSS {} > budget {BUDGET} + 2%", r.peak_rss);
}

#[test]
fn streamed_generation_survives_a_real_cgroup_at_budget_plus_64_mib() {
    const NAME: &str = "streamed_generation_survives_a_real_cgroup_at_budget_plus_64_mib";
    let (cg, _cleanup) = match limited_child("waste-budget", BUDGET + 64 * MIB) {
        Ok(c) => c,
        Err(reason) => return skip(NAME, &reason),
    };
    match swap_is_off(&cg) {
        Ok(why) => println!("swap is off for the run: {why}"),
        Err(reason) => return skip(NAME, &reason),
    }
    let dir = big_moe();
    let args = run_args(&dir);
    let r = run_measured(waste_in_command(&cg, &args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert_eq!(r.code, 0, "killed or failed inside the cgroup: {}", r.stderr);
    assert!(r.stderr.contains("[64 tokens") && misses(&r.stderr) > 0, "{}", r.stderr);
    assert_eq!(oom_kills(&cg).unwrap_or(0), 0);
    println!("in the cgroup: peak RSS {} bytes, cgroup peak usage {:?} (limit {})", r.peak_rss, peak_usage(&cg), BUDGET + 64 * MIB);
}

/// The plan counts `THREAD_BYTES` per compute worker: the peak RSS of `waste bench` with 17
/// threads, less that with 1 and less what the extra threads' buffers are, is under it per
/// thread, with the kernels of every instruction set the machine has (each GEMM keeps its own
/// buffers on the stack). The model is SmolLM2-135M-shaped and the prompt 128 tokens, so that
/// every worker runs the prefill GEMM, whose buffers are the largest on a worker's stack.
#[test]
fn a_thread_costs_less_than_the_plan_counts() {
    const EXTRA: u64 = 16;
    let model = temp_dir("thread-bytes").join("m");
    let cfg = waste::tools::random::preset("smollm2-135m").unwrap();
    waste::tools::random::write_checkpoint(&model, &cfg, waste::format::dtype::DType::BF16, 3).unwrap();
    let bench = |threads: u64, isa: &str| -> (u64, u64) {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_waste"));
        cmd.args(["bench", model.to_str().unwrap(), "--threads", &threads.to_string(), "--ctx", "256", "--prompt-tokens", "128",
            "-n", "4", "--json", "--isa", isa]);
        let r = run_measured(cmd);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let doc: Json = json::parse(r.stdout.as_bytes()).unwrap();
        assert_eq!(doc.get("isa").and_then(Json::as_str), Some(isa), "{}", r.stdout);
        (r.peak_rss, doc.get("memory_used_bytes").and_then(Json::as_u64).unwrap())
    };
    let constant = waste::kernels::pool::THREAD_BYTES;
    for isa in waste::kernels::Isa::ALL.into_iter().filter(|i| i.supported()).map(|i| i.name()) {
        let ((rss1, used1), (rss_n, used_n)) = (bench(1, isa), bench(1 + EXTRA, isa));
        // What the extra threads' own buffers (score rows) add, besides the constant.
        let buffers = (used_n - used1) - EXTRA * constant;
        let per_thread = rss_n.saturating_sub(rss1 + buffers) / EXTRA;
        println!("{isa}: one compute thread: {per_thread} bytes of RSS (the plan counts {constant})");
        assert!(per_thread <= constant, "{isa}: a thread costs {per_thread} bytes, the plan counts {constant}");
    }
    let _ = std::fs::remove_dir_all(model.parent().unwrap());
}

/// Sampling allocates nothing once its buffers are sized: the model lends them to each
/// generation, and a standalone sampler sizes them on its first token.
#[test]
fn sampler_buffers_are_the_planned_size() {
    let vocab = 50257;
    let b = waste::SampleBuffers::new(vocab);
    assert_eq!(b.heap_bytes(), waste::SampleBuffers::plan_bytes(vocab));
    let logits: Vec<f32> = (0..vocab).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let p = SamplingParams { temperature: 0.9, top_k: 0, top_p: 0.9, min_p: 0.01, repeat_penalty: 1.1, seed: 3, ..SamplingParams::default() };
    let mut s = waste::Sampler::with_buffers(&p, b).unwrap();
    let history: Vec<u32> = (0..200).collect();
    for _ in 0..20 {
        s.sample(&logits, &history);
    }
    assert_eq!(s.into_buffers().heap_bytes(), waste::SampleBuffers::plan_bytes(vocab), "sampling grew the buffers");
    // A model lends its buffers to each generation and gets them back, a refused one included.
    let mut m = Model::open(root().join("models/stories260K"), &Options::default()).unwrap();
    let held = m.memory_used();
    let bad = GenerateParams { sampling: SamplingParams { temperature: -1.0, ..SamplingParams::default() }, ..GenerateParams::default() };
    assert_eq!(m.generate(&[1, 403], &bad, |_| true).unwrap_err().kind(), ErrorKind::Arg);
    assert_eq!(m.memory_used(), held);
    let sampled = GenerateParams { max_tokens: 20, sampling: p, ..GenerateParams::default() };
    assert!(m.generate(&[1, 403], &sampled, |_| true).unwrap().tokens > 0);
    assert_eq!(m.memory_used(), held, "a generation changed what the model holds");
}

/// `waste eval` streams its dumps: the files hold exactly what the library computes for every
/// position (logits; hidden states in [layers + 2] × positions × hidden order), written chunk
/// by chunk — with a prefill chunk of 3 over 10 positions, rows arrive in four chunks.
#[test]
fn eval_dumps_stream_every_position() {
    let model = root().join("models/stories260K");
    let dir = temp_dir("budget-dumps");
    let (logits, hidden) = (dir.join("l.f32"), dir.join("h.f32"));
    let ids: Vec<u32> = vec![1, 403, 407, 261, 378, 500, 7, 99, 42, 300];
    let list = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let (code, out, err) = waste(&["eval", model.to_str().unwrap(), "--ids", &list, "--chunk", "3", "--top", "2",
        "--dump-logits", logits.to_str().unwrap(), "--dump-hidden", hidden.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("[budget ") && err.contains("chosen: the floor"), "eval reports its budget: {err}");
    let mut m = Model::open(&model, &Options { prefill_chunk: 5, ..Options::default() }).unwrap();
    let want_logits = all_logits(&mut m, &ids).unwrap();
    assert_eq!(read_f32(&logits), want_logits);
    m.reset();
    assert_eq!(read_f32(&hidden), hidden_states(&mut m, &ids).unwrap());
    // The printed top candidate is the last position's argmax.
    let vocab = want_logits.len() / ids.len();
    let best = argmax(&want_logits[(ids.len() - 1) * vocab..]);
    assert!(out.lines().nth(1).unwrap().trim_start().starts_with(&best.to_string()), "{out}");
}
