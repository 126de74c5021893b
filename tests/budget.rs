//! The hard RAM ceiling (seed 001 §3) from the engine's side: what a model holds after open
//! is exactly its plan; a budget under the floor fails before any expert is read; a streamed
//! model whose experts are four times the budget decodes with its peak RSS under the budget,
//! and inside a real cgroup limited to the budget + 64 MiB it is not killed.

mod common;
use common::cgroup::*;
use common::*;
use std::path::{Path, PathBuf};
use waste::format::convert::{convert, ConvertOptions, Encoding};
use waste::format::json::{self, Json};
use waste::{plan_memory_opts, ErrorKind, Model, Options};

const MIB: u64 = 1 << 20;

/// A random MoE container whose experts (q4, ~1.1 GiB) are four times a 256 MiB budget, and
/// whose trunk and state are small: 10 layers of 64 experts, top-4.
fn big_moe() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(write_big_moe).clone()
}

fn write_big_moe() -> PathBuf {
    let dir = temp_dir("budget-big-moe").join("moe.waste");
    let cfg = json::parse(br#"{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 1024, "intermediate_size": 2048,
        "moe_intermediate_size": 1024, "num_hidden_layers": 10, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 128, "num_experts": 64, "num_experts_per_tok": 4, "norm_topk_prob": true, "vocab_size": 8192,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 512}"#).unwrap();
    waste::format::random::write_container(&dir, &cfg, waste::format::dtype::DType::Q4B32, 7).unwrap();
    dir
}

fn models(tag: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = ["llama_f32", "qwen3_bf16", "mixtral_f32", "olmoe_f32"].iter().map(|n| oracle(n).dir.join("model")).collect();
    v.push(root().join("models/stories260K"));
    for name in ["mixtral_f32", "qwen3_moe_f32"] {
        let out = temp_dir(&format!("budget-{tag}-{name}")).join("c");
        let opts = ConvertOptions { trunk: Encoding::F32, experts: Encoding::BF16, ..ConvertOptions::new(oracle(name).dir.join("model"), &out) };
        convert(&opts, &mut |_| {}).unwrap();
        v.push(out);
    }
    v
}

/// `memory_used()` after open equals the plan computed from headers, whatever the budget.
#[test]
fn memory_used_after_open_equals_the_plan() {
    let mut all = models("plan");
    all.push(big_moe());
    for path in &all {
        let base = Options { ctx: 64, threads: 2, ..Options::default() };
        let plan = plan_memory_opts(path, &base).unwrap();
        let mut budgets = vec![None, Some(plan.floor_bytes())];
        if plan.has_experts() {
            budgets.push(Some(plan.floor_plus(1)));
            budgets.push(Some(plan.floor_plus(1) + plan.expert_slot_bytes / 2));
        }
        for budget in budgets {
            let m = Model::open(path, &Options { budget, ..base.clone() }).unwrap();
            let want = plan.resident_bytes() + m.budget().expert_cache_bytes;
            assert_eq!(m.memory_used(), want, "{}: budget {budget:?}", path.display());
            assert!(m.memory_used() <= m.budget().bytes, "{}: over budget", path.display());
            if let Some(b) = budget {
                assert_eq!(m.budget().expert_cache_bytes, plan.expert_cache_bytes(b).unwrap());
            }
        }
    }
}

/// Under the floor: the dedicated error, the floor in bytes, `plan` — and no expert is read
/// (every record of the container is corrupt, so reading one would fail differently).
#[test]
fn budget_under_the_floor_fails_before_any_expert_is_read() {
    let dir = &models("floor")[6];
    let manifest = waste::format::container::Manifest::open(dir).unwrap();
    for b in &manifest.banks {
        let p = manifest.bank_path(b);
        let mut bytes = std::fs::read(&p).unwrap();
        for e in 0..b.experts {
            bytes[e * b.layout.record_bytes] = b'X';
        }
        std::fs::write(&p, bytes).unwrap();
    }
    let plan = waste::plan_memory(dir, 0).unwrap();
    let floor = plan.floor_bytes();
    let err = Model::open(dir, &Options { budget: Some(floor - 1), ..Options::default() }).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::RamBudget);
    let (code, _, stderr) = waste(&["eval", dir.to_str().unwrap(), "--ids", "1,2,3", "--budget", &(floor - 1).to_string()]);
    assert_ne!(code, 0);
    assert!(stderr.contains(&floor.to_string()) && stderr.contains("plan"), "{stderr}");
    assert!(!stderr.contains("magic"), "{stderr}");
}

fn bench_json(out: &str) -> Json {
    json::parse(out.as_bytes()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn field(doc: &Json, key: &str) -> u64 {
    doc.get(key).and_then(Json::as_u64).unwrap_or_else(|| panic!("{key} missing"))
}

const BUDGET: u64 = 256 * MIB;

fn bench_args(dir: &Path) -> Vec<String> {
    ["bench", dir.to_str().unwrap(), "--budget", &BUDGET.to_string(), "--prompt-tokens", "8", "-n", "64", "--json"]
        .iter().map(|s| s.to_string()).collect()
}

#[test]
fn peak_rss_stays_under_the_budget_while_experts_stream() {
    let dir = big_moe();
    let manifest = waste::format::container::Manifest::open(&dir).unwrap();
    assert!(manifest.expert_bytes() >= 4 * BUDGET, "experts {} vs budget {BUDGET}", manifest.expert_bytes());
    let args = bench_args(&dir);
    let (code, out, err) = waste(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{err}");
    let doc = bench_json(&out);
    let (peak, used) = (field(&doc, "peak_rss_bytes"), field(&doc, "memory_used_bytes"));
    println!("budget {BUDGET}, holds {used}, peak RSS {peak}, decode misses {}", field(&doc, "decode_misses"));
    assert!(used <= BUDGET);
    assert!(field(&doc, "decode_misses") > 0, "the experts must stream: {out}");
    assert!(peak as f64 <= BUDGET as f64 * 1.02, "peak RSS {peak} > budget {BUDGET} + 2%");
}

#[test]
fn streamed_run_survives_a_real_cgroup_at_budget_plus_64_mib() {
    const NAME: &str = "streamed_run_survives_a_real_cgroup_at_budget_plus_64_mib";
    let (cg, _cleanup) = match limited_child("waste-budget", BUDGET + 64 * MIB) {
        Ok(c) => c,
        Err(reason) => return skip(NAME, &reason),
    };
    let dir = big_moe();
    let args = bench_args(&dir);
    let (code, out, err) = waste_in(&cg, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "killed or failed inside the cgroup: {err}");
    assert!(field(&bench_json(&out), "decode_misses") > 0);
    assert_eq!(oom_kills(&cg).unwrap_or(0), 0);
    if let Some(peak) = peak_usage(&cg) {
        println!("cgroup peak usage {peak} bytes (limit {})", BUDGET + 64 * MIB);
    }
}
