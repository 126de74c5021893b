//! The memory plan against the engine: for every fixture model, `plan_memory` (headers only)
//! must equal the bytes `Model::open` holds, part by part (the tokenizer's allowance within its
//! stated margin); `waste plan` through the built binary (table, JSON keys, budgets, the
//! options of a run, the floor error); and usable RAM inside a real cgroup.

use crate::common;
use common::cgroup::*;
use common::*;
use std::path::{Path, PathBuf};
use waste::format::dtype::DType;
use waste::format::json::{self, Json};
use waste::{ErrorKind, Model, Options};

/// The fixture models in the repository: stories260K and every model under
/// tests/fixtures/oracles (dense, and Hugging Face MoE checkpoints, which load whole, experts
/// resident).
fn fixture_models() -> Vec<PathBuf> {
    let mut v = vec![root().join("models/stories260K")];
    let mut oracles: Vec<PathBuf> = std::fs::read_dir(fixture("oracles")).unwrap()
        .map(|e| e.unwrap().path().join("model")).filter(|p| p.join("config.json").is_file()).collect();
    oracles.sort();
    assert!(oracles.len() >= 11, "the oracle fixtures: {oracles:?}");
    v.extend(oracles);
    v
}


/// The tensors of `config` as the random-model writer lays them out, plus o_proj and MLP
/// biases when the config asks for them, matrices in `dtype` and vectors in `vec_dtype`.
fn dense_tensors(config: &str, dtype: DType, vec_dtype: DType, extra_head: bool) -> Vec<(String, DType, Vec<u64>)> {
    let cfg = waste::format::config::ModelConfig::from_json(Path::new("config.json"), &json::parse(config.as_bytes()).unwrap()).unwrap();
    let mut shapes = waste::tools::random::tensor_shapes(&cfg);
    let (h, i) = (cfg.hidden as u64, cfg.intermediate as u64);
    for l in 0..cfg.layers {
        if cfg.o_bias {
            shapes.push((format!("model.layers.{l}.self_attn.o_proj.bias"), vec![h]));
        }
        if cfg.mlp_bias {
            for (n, len) in [("gate_proj", i), ("up_proj", i), ("down_proj", h)] {
                shapes.push((format!("model.layers.{l}.mlp.{n}.bias"), vec![len]));
            }
        }
    }
    if extra_head {
        shapes.push(("lm_head.weight".into(), vec![cfg.vocab as u64, h]));
    }
    shapes.into_iter().map(|(n, s)| {
        let d = if s.len() == 1 { vec_dtype } else { dtype };
        (n, d, s)
    }).collect()
}

const QWEN2_TINY: &str = r#"{"architectures":["Qwen2ForCausalLM"],"hidden_size":32,"intermediate_size":48,
 "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":40,
 "max_position_embeddings":96,"tie_word_embeddings":false}"#;
const LLAMA_BIASED: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":24,"intermediate_size":40,
 "num_hidden_layers":3,"num_attention_heads":3,"num_key_value_heads":1,"vocab_size":50,
 "max_position_embeddings":64,"attention_bias":true,"mlp_bias":true,"tie_word_embeddings":true}"#;

/// Synthetic dense checkpoints covering what the fixtures do not: q/k/v biases (Qwen2),
/// o_proj and MLP biases, a tied config whose file still has lm_head (the file wins), F16
/// matrices with BF16 vectors (vectors are held widened to f32).
fn synthetic_models(tag: &str) -> Vec<PathBuf> {
    let base = temp_dir(tag);
    let cases = [
        ("qwen2", QWEN2_TINY, DType::BF16, DType::F32, false),
        ("llama_biased", LLAMA_BIASED, DType::F16, DType::BF16, false),
        ("llama_tied_with_head", LLAMA_BIASED, DType::F32, DType::F16, true),
    ];
    cases.iter().map(|(name, cfg, d, vd, head)| {
        let dir = base.join(name);
        write_checkpoint(&dir, cfg, &dense_tensors(cfg, *d, *vd, *head));
        dir
    }).collect()
}

#[test]
fn plan_equals_what_open_holds_for_every_fixture_model() {
    let mut models = fixture_models();
    models.extend(synthetic_models("plan-open"));
    let option_sets = [
        Options::default(),
        Options { ctx: 7, threads: 3, prefill_chunk: 5, ..Options::default() },
        Options { ctx: 33, threads: 1, prefill_chunk: 1, ..Options::default() },
    ];
    for dir in &models {
        for opts in &option_sets {
            let (plan, m, what) = plan_and_open(dir, opts);
            let info = m.info();
            assert_eq!(plan.trunk_bytes, info.weight_bytes, "trunk: {what}");
            assert_eq!(plan.state_bytes, info.kv_bytes, "state: {what}");
            assert_eq!(plan.scratch_bytes, info.scratch_bytes, "scratch: {what}");
            assert_eq!((plan.ctx, plan.threads), (info.context, info.threads), "{what}");
            assert_eq!(plan.min_expert_cache_bytes, 0, "{what}");
            assert_eq!(plan.working_set_bytes, 0, "{what}");
            assert_eq!(plan.floor_bytes(), info.weight_bytes + info.kv_bytes + info.scratch_bytes + plan.tokenizer_bytes + plan.open_extra_bytes, "{what}");
            assert!(m.memory_used() <= plan.floor_bytes(), "{what}");
            assert_eq!(plan.recommended_bytes(), plan.floor_bytes(), "{what}");
        }
    }
    // The short form takes a context and the default threads and chunk.
    let p = waste::plan_memory(&models[0], &waste::Options { ctx: 100, ..waste::Options::default() }).unwrap();
    assert_eq!(p.ctx, 100);
    assert_eq!(p, waste::plan_memory(&models[0], &Options { ctx: 100, ..Options::default() }).unwrap());
}

#[test]
fn plan_of_a_large_shape_matches_its_tensor_list() {
    // llama-1b's shape (1.2 B parameters, 2.5 GB of BF16) as a sparse file: planning it reads
    // headers only. Trunk = every matrix at 2 bytes per weight + every vector at 4.
    let dir = temp_dir("plan-1b").join("m");
    let config = waste::tools::random::preset("llama-1b").unwrap().to_string_compact();
    let tensors = dense_tensors(&config, DType::BF16, DType::F32, false);
    write_checkpoint(&dir, &config, &tensors);
    let expect: u64 = tensors.iter().map(|(_, _, s)| if s.len() == 1 { s[0] * 4 } else { s[0] * s[1] * 2 }).sum();
    assert!(expect > 2_000_000_000, "{expect}");
    let plan = waste::plan_memory(&dir, &waste::Options { ctx: 2048, ..waste::Options::default() }).unwrap();
    assert_eq!(plan.trunk_bytes, expect);
    let cfg = waste::format::config::ModelConfig::load(&dir).unwrap();
    let scratch = waste::model::state::State::plan_bytes(&cfg, 2048, plan.prefill_chunk, plan.threads);
    let kv = waste::Session::plan_bytes(&cfg, 2048);
    // Besides the state's buffers: RoPE frequencies, the sampler's buffers, the pool's workers,
    // and on AVX-512 the kernels' buffer for a prefill product's inputs split by parity (up to
    // 128 vectors of the widest input, here the FFN's, and 16 values of room to start them on
    // a 64-byte boundary); for the AMX tiles three bf16 parts per input, half as much again.
    let k = waste::kernels::Kernels::select(false);
    let split = if k.splits_inputs() {
        let values = plan.prefill_chunk.min(waste::kernels::SPLIT_VECTORS) * cfg.intermediate;
        let values = if k.isa() == waste::kernels::Isa::Amx { values * 3 / 2 } else { values };
        ((values + 16) * 4) as u64
    } else {
        0
    };
    // Where the default decodes with int21 (AVX2 kernels; Intel's AVX-512 VNNI ones), its
    // buffer: four vectors of the widest input (3 bytes a value, 4 per block of 32 for its scale).
    let int21 = if k.int21_decodes_by_default() {
        let values = (waste::kernels::DECODE_VECTORS * cfg.intermediate) as u64;
        3 * values + values / 32 * 4
    } else {
        0
    };
    let rest = (cfg.rope.dim / 2 * 4) as u64 + waste::SampleBuffers::plan_bytes(cfg.vocab) + split + int21
        + (plan.threads as u64 - 1) * waste::kernels::pool::THREAD_BYTES + waste::model::plan::metadata_bytes(cfg.layers);
    assert_eq!((plan.state_bytes, plan.scratch_bytes, plan.tokenizer_bytes), (kv, scratch + rest, 0));
    // The session: keys and values of every layer for the context, and room for its tokens.
    assert_eq!(kv, 2 * cfg.layers as u64 * 2048 * cfg.kv_dim() as u64 * 4 + 2049 * 4);
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn plan_refuses_what_open_refuses() {
    let base = temp_dir("plan-bad");
    // A missing tensor: the plan names it, as the loader would.
    let dir = base.join("missing");
    let mut t = dense_tensors(QWEN2_TINY, DType::BF16, DType::F32, false);
    t.retain(|(n, _, _)| n != "model.layers.1.self_attn.k_proj.bias");
    write_checkpoint(&dir, QWEN2_TINY, &t);
    let e = waste::plan_memory(&dir, &waste::Options { ctx: 0, ..waste::Options::default() }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Tensor);
    assert!(e.message().contains("model.layers.1.self_attn.k_proj.bias"), "{e}");
    assert_eq!(Model::open(&dir, &Options::default()).err().unwrap().kind(), ErrorKind::Tensor);
    // A wrong shape.
    let dir = base.join("shape");
    let mut t = dense_tensors(QWEN2_TINY, DType::BF16, DType::F32, false);
    t[0].2 = vec![41, 32];
    write_checkpoint(&dir, QWEN2_TINY, &t);
    let e = waste::plan_memory(&dir, &waste::Options { ctx: 0, ..waste::Options::default() }).unwrap_err();
    assert!(e.message().contains("model.embed_tokens.weight") && e.message().contains("[41, 32]"), "{e}");
    // Untied without lm_head.
    let dir = base.join("nohead");
    let cfg = QWEN2_TINY.to_string();
    let mut t = dense_tensors(&cfg, DType::BF16, DType::F32, false);
    t.retain(|(n, _, _)| n != "lm_head.weight");
    write_checkpoint(&dir, &cfg, &t);
    assert!(waste::plan_memory(&dir, &waste::Options { ctx: 0, ..waste::Options::default() }).unwrap_err().message().contains("lm_head.weight"));
    // A routed expert whose dtype differs from its layer's others (resident experts share
    // one record layout per layer).
    let src = fixture("oracles/olmoe_f32/model");
    let st = waste::format::safetensors::SafeTensors::open(&src.join("model.safetensors")).unwrap();
    let odd = "model.layers.1.mlp.experts.3.up_proj.weight";
    let t: Vec<_> = st.tensors.iter()
        .map(|t| (t.name.clone(), if t.name == odd { DType::BF16 } else { t.dtype }, t.shape.clone())).collect();
    let dir = base.join("odd-expert");
    write_checkpoint(&dir, &std::fs::read_to_string(src.join("config.json")).unwrap(), &t);
    let e = waste::plan_memory(&dir, &waste::Options { ctx: 0, ..waste::Options::default() }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Tensor);
    assert!(e.message().contains(odd), "{e}");
    assert_eq!(Model::open(&dir, &Options::default()).err().unwrap().kind(), ErrorKind::Tensor);
    // Not a model directory; out-of-range options.
    assert_eq!(waste::plan_memory(base.join("nothing"), &waste::Options { ctx: 0, ..waste::Options::default() }).unwrap_err().kind(), ErrorKind::Io);
    let opts = Options { ctx: waste::MAX_CONTEXT + 1, ..Options::default() };
    assert_eq!(waste::plan_memory(root().join("models/stories260K"), &opts).unwrap_err().kind(), ErrorKind::Arg);
}

/// Runs `waste plan ... --json` and returns the document.
fn plan_json(args: &[&str]) -> Json {
    let mut a = vec!["plan"];
    a.extend_from_slice(args);
    a.push("--json");
    let (status, out, err) = waste(&a);
    assert_eq!(status, 0, "waste {a:?}: {err}");
    json::parse(out.as_bytes()).unwrap()
}

fn num(doc: &Json, key: &str) -> u64 {
    doc.get(key).and_then(Json::as_u64).unwrap_or_else(|| panic!("`{key}` missing from {}", doc.to_string_pretty()))
}

const PLAN_KEYS: [&str; 15] = ["trunk_bytes", "embeddings_on_disk_bytes", "state_bytes", "sessions", "prefill_chunk", "session_bytes", "scratch_bytes", "tokenizer_bytes", "min_expert_cache_bytes",
    "open_extra_bytes", "floor_bytes", "working_set_bytes", "recommended_bytes", "physical_ram_bytes", "usable_ram_bytes"];

#[test]
fn cli_plan_json_keys_and_values() {
    let model = root().join("models/stories260K");
    let m = model.to_str().unwrap();
    let doc = plan_json(&[m, "--ctx", "64", "--threads", "2", "--chunk", "4"]);
    let keys: Vec<&str> = doc.as_object().unwrap().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, PLAN_KEYS);
    // The same numbers as the library, and as `waste info` with the same options.
    let plan = waste::plan_memory(&model, &Options { ctx: 64, threads: 2, prefill_chunk: 4, ..Options::default() }).unwrap();
    assert_eq!(num(&doc, "trunk_bytes"), plan.trunk_bytes);
    // A dense model holds its embeddings (only a container whose experts stream reads them a row at a time).
    assert_eq!(num(&doc, "embeddings_on_disk_bytes"), 0);
    assert_eq!(num(&doc, "floor_bytes"), plan.floor_bytes());
    assert_eq!(num(&doc, "prefill_chunk"), 4);
    let (status, out, err) = waste(&["info", m, "--ctx", "64", "--threads", "2", "--chunk", "4", "--json"]);
    assert_eq!(status, 0, "{err}");
    let info = json::parse(out.as_bytes()).unwrap();
    assert_eq!(num(&doc, "trunk_bytes"), num(&info, "weight_bytes"));
    assert_eq!(num(&doc, "state_bytes"), num(&info, "kv_bytes"));
    assert_eq!(num(&doc, "scratch_bytes"), num(&info, "scratch_bytes"));
    assert_eq!(num(&doc, "floor_bytes"), num(&info, "resident_bytes") + num(&doc, "tokenizer_bytes"));
    assert!(num(&info, "memory_used_bytes") <= num(&doc, "floor_bytes"));
    assert_eq!(num(&doc, "recommended_bytes"), num(&doc, "floor_bytes"));
    // The child runs in this process's cgroup: it sees the same RAM.
    let ram = waste::host::read_ram().unwrap();
    assert_eq!(num(&doc, "physical_ram_bytes"), ram.physical_bytes);
    assert_eq!(num(&doc, "usable_ram_bytes"), ram.usable_bytes);
    assert!(ram.usable_bytes <= ram.physical_bytes && ram.usable_bytes > 0);

    // With a budget: two more keys, a dense model keeps no expert cache.
    let doc = plan_json(&[m, "--ctx", "64", "--budget", "4M"]);
    let keys: Vec<&str> = doc.as_object().unwrap().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys[..PLAN_KEYS.len()], PLAN_KEYS);
    assert_eq!(keys[PLAN_KEYS.len()..], ["budget_bytes", "expert_cache_bytes"]);
    assert_eq!(num(&doc, "prefill_chunk"), 128, "a dense model's chunk left to the engine");
    assert_eq!(num(&doc, "budget_bytes"), 4 << 20);
    assert_eq!(num(&doc, "expert_cache_bytes"), 0);
    // Exact bytes and fractional sizes parse too.
    let floor = num(&doc, "floor_bytes");
    let doc = plan_json(&[m, "--ctx", "64", "--budget", &floor.to_string()]);
    assert_eq!(num(&doc, "budget_bytes"), floor);
    assert_eq!(num(&plan_json(&[m, "--ctx", "64", "--budget", "1.5G"]), "budget_bytes"), 3 << 29);
    // Binary units whatever the spelling: 4M = 4Mi = 4MiB = 4MB.
    for spelling in ["4Mi", "4MiB", "4MB", "4mib"] {
        assert_eq!(num(&plan_json(&[m, "--ctx", "64", "--budget", spelling]), "budget_bytes"), 4 << 20, "{spelling}");
    }
}

#[test]
fn cli_budget_under_the_floor_fails_naming_the_floor() {
    let m = root().join("models/stories260K");
    let m = m.to_str().unwrap();
    let floor = num(&plan_json(&[m, "--ctx", "128"]), "floor_bytes");
    for budget in ["1K".to_string(), (floor - 1).to_string()] {
        let (status, out, err) = waste(&["plan", m, "--ctx", "128", "--budget", &budget]);
        assert_eq!(status, 1, "--budget {budget}: {err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains(&format!("{floor} bytes")), "{err}");
        assert!(err.contains("plan"), "{err}");
        assert!(err.contains("floor"), "{err}");
    }
    // Sizes that do not parse are usage errors (`4iB` has no unit before its `i`), and a
    // budget of 0 is out of range.
    for bad in ["4iB", "lots", "-1G", "", "0", "99999999999T"] {
        let (status, _, err) = waste(&["plan", m, "--budget", bad]);
        assert_eq!(status, 2, "--budget {bad:?}: {err}");
        assert!(err.contains("--budget"), "{err}");
    }
}

#[test]
fn cli_plan_table() {
    let m = root().join("models/stories260K");
    let m = m.to_str().unwrap();
    let doc = plan_json(&[m, "--ctx", "32"]);
    let (status, out, err) = waste(&["plan", m, "--ctx", "32", "--budget", "8M"]);
    assert_eq!(status, 0, "{err}");
    let line = |label: &str| out.lines().find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` line in:\n{out}")).to_string();
    for (label, key) in [("resident trunk", "trunk_bytes"), ("state + KV cache", "state_bytes"), ("scratch", "scratch_bytes"),
        ("tokenizer (allowance)", "tokenizer_bytes"),
        ("minimum expert cache", "min_expert_cache_bytes"), ("FLOOR", "floor_bytes"), ("recommended", "recommended_bytes"),
        ("physical RAM", "physical_ram_bytes"), ("usable RAM", "usable_ram_bytes")] {
        assert!(line(label).ends_with(&format!(" {} bytes", num(&doc, key))), "{label}: {}", line(label));
    }
    assert!(out.contains("---"), "{out}");
    // Where physical RAM came from (tests/static_binary.rs sees sysinfo(2) in a chroot).
    let source = if std::path::Path::new("/proc/meminfo").exists() { "/proc/meminfo" } else { "sysinfo(2)" };
    assert!(out.contains(&format!("  (physical RAM from {source})\n")), "{out}");
    assert!(line("budget").starts_with("  budget 8.00 MiB -> expert cache 0 B"), "{}", line("budget"));
    // Without a budget the table shows the choice the engine would make.
    let (status, out, _) = waste(&["plan", m, "--ctx", "32"]);
    assert_eq!(status, 0);
    assert!(out.contains("no --budget: the floor"), "{out}");
    let (status, help, _) = waste(&["plan", "--help"]);
    assert_eq!(status, 0);
    assert!(help.contains("--budget SIZE") && help.contains("binary units") && help.contains("1K = 1024"), "{help}");
    let (_, overview, _) = waste(&["--help"]);
    assert!(overview.contains("plan"), "{overview}");
}

/// Runs `waste plan MODEL --json` as a process that first moves itself into `cg`.
fn plan_in_cgroup(cg: &TestCgroup, model: &Path) -> Json {
    let (code, out, err) = waste_in(cg, &["plan", model.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "waste plan in {}: {err}", cg.dir.display());
    json::parse(out.as_bytes()).unwrap()
}

#[test]
fn real_cgroup_limit_is_the_usable_ram_waste_plan_sees() {
    const NAME: &str = "real_cgroup_limit_is_the_usable_ram_waste_plan_sees";
    const GIB: u64 = 1 << 30;
    let outside = waste::host::read_ram().unwrap();
    if outside.usable_bytes <= GIB {
        return skip(NAME, &format!("this process already has only {} bytes of usable RAM", outside.usable_bytes));
    }
    let (child, mut cleanup) = match limited_child("waste-test", GIB) {
        Ok(c) => c,
        Err(reason) => return skip(NAME, &reason),
    };
    let model = root().join("models/stories260K");
    let doc = plan_in_cgroup(&child, &model);
    assert_eq!(num(&doc, "usable_ram_bytes"), GIB);
    assert_eq!(num(&doc, "physical_ram_bytes"), outside.physical_bytes);

    // A model bigger than the cgroup (2.5 GB of sparse BF16) plans inside it: headers only.
    let big = temp_dir("plan-cgroup-1b").join("m");
    let config = waste::tools::random::preset("llama-1b").unwrap().to_string_compact();
    write_checkpoint(&big, &config, &dense_tensors(&config, DType::BF16, DType::F32, false));
    let doc = plan_in_cgroup(&child, &big);
    assert!(num(&doc, "trunk_bytes") > 2 * GIB, "{}", doc.to_string_pretty());
    assert_eq!(num(&doc, "usable_ram_bytes"), GIB);
    let _ = std::fs::remove_dir_all(big.parent().unwrap());

    // A child cgroup without a limit of its own does not cancel its parent's.
    let inner = child.child("inner", &mut cleanup).unwrap();
    if !inner.dir.join(inner.soft).exists() {
        return skip(NAME, &format!("nested part: {} has no {}", inner.dir.display(), inner.soft));
    }
    assert_eq!(num(&plan_in_cgroup(&inner, &model), "usable_ram_bytes"), GIB);
    // A soft limit (v1) or memory.high (v2) below the hard one is the usable RAM.
    inner.set(inner.soft, 768 << 20).unwrap();
    assert_eq!(num(&plan_in_cgroup(&inner, &model), "usable_ram_bytes"), 768 << 20);
    println!("real cgroup: {} (limit {} bytes) and {} (soft {} bytes) seen by waste plan", child.dir.display(), GIB,
        inner.dir.display(), 768u64 << 20);
}

/// A container made from a Hugging Face MoE fixture: its safetensors as the trunk file (the
/// expert tensors in it are simply not part of the trunk) and sparse banks of `expert_dtype`
/// records. Returns (container, the fixture it came from).
fn make_container(tag: &str, fixture_name: &str, expert_dtype: DType) -> (PathBuf, PathBuf) {
    use waste::format::container::{Bank, Manifest, RecordLayout};
    let src = fixture(&format!("oracles/{fixture_name}/model"));
    let dir = temp_dir(tag).join("model.waste");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("trunk.safetensors")).unwrap();
    let config_json = read_json(&src.join("config.json"));
    let config = waste::format::config::ModelConfig::from_json(&src.join("config.json"), &config_json).unwrap();
    let moe = config.moe.clone().unwrap();
    let mut banks = Vec::new();
    for layer in (0..config.layers).filter(|&l| config.is_moe_layer(l)) {
        let layout = RecordLayout::new(expert_dtype, config.hidden, moe.expert_intermediate).unwrap();
        let file = format!("experts-{layer}.bin");
        std::fs::File::create(dir.join(&file)).unwrap().set_len((moe.experts * layout.record_bytes) as u64).unwrap();
        banks.push(Bank { layer, file, experts: moe.experts, layout });
    }
    let sum = waste::format::container::FileSum::of_file(&dir.join("trunk.safetensors")).unwrap();
    let mut m = Manifest::new(&dir, config_json, vec![("trunk.safetensors".into(), sum)], banks).unwrap();
    m.trunk_encoding = "f32".into();
    m.expert_encoding = expert_dtype.name().to_lowercase();
    m.write().unwrap();
    (dir, src)
}

#[test]
fn container_plan_streams_experts_through_the_cache() {
    use waste::format::container::RecordLayout;
    for (name, dtype) in [("olmoe_f32", DType::Q4B32), ("qwen3_moe_f32", DType::BF16), ("mixtral_f32", DType::F32)] {
        let (dir, src) = make_container(&format!("plan-container-{name}"), name, dtype);
        let opts = Options { ctx: 64, threads: 2, prefill_chunk: 8, ..Options::default() };
        let c = waste::plan_memory(&dir, &opts).unwrap();
        let hf = waste::plan_memory(&src, &opts).unwrap();
        let cfg = waste::format::config::ModelConfig::load(&src).unwrap();
        let moe = cfg.moe.as_ref().unwrap();
        let moe_layers = (0..cfg.layers).filter(|&l| cfg.is_moe_layer(l)).count() as u64;
        // The Hugging Face checkpoint holds every expert as an f32 record; the container none.
        let f32_record = RecordLayout::new(DType::F32, cfg.hidden, moe.expert_intermediate).unwrap().record_bytes as u64;
        // Nor its f32 embeddings (untied), which it reads a row at a time into one buffer of a
        // row's 4 KiB-aligned span.
        let table = (cfg.vocab * cfg.hidden * 4) as u64;
        let row_buffer = ((cfg.hidden * 4) as u64).div_ceil(4096) * 4096 + 4096;
        assert!(!cfg.tie_embeddings, "{name}");
        assert_eq!(c.trunk_bytes, hf.trunk_bytes - moe_layers * moe.experts as u64 * f32_record - table + row_buffer, "{name}");
        assert_eq!((c.embeddings_on_disk_bytes, hf.embeddings_on_disk_bytes), (table, 0), "{name}");
        // The container's scratch also counts its I/O threads.
        let io = c.io_threads as u64 * waste::kernels::pool::THREAD_BYTES;
        assert_eq!((c.state_bytes, c.scratch_bytes), (hf.state_bytes, hf.scratch_bytes + io), "{name}");
        let record = RecordLayout::new(dtype, cfg.hidden, moe.expert_intermediate).unwrap().record_bytes as u64;
        // A slot costs its record and a few words of bookkeeping (with I/O threads, its place in
        // their queues too).
        let queue = if c.io_threads > 0 { waste::cache::ExpertShape::QUEUE_BYTES } else { 0 };
        let slot = record + waste::cache::ExpertShape::SLOT_BOOKKEEPING + queue;
        let k = moe.top_k as u64;
        let records = moe_layers * moe.experts as u64;
        let min_slots = (2 * k).min(records);
        assert_eq!(c.expert_slot_bytes, slot, "{name}");
        assert_eq!(c.min_expert_cache_bytes, c.expert_cache_fixed_bytes + min_slots * slot, "{name}");
        // Per record a few words, per MoE layer the policy's statistics (8 KiB) and its follow
        // counts (4 bytes per pair of the layer's experts).
        let per_layer = 8200 + 4 * (moe.experts as u64).pow(2);
        assert!(c.expert_cache_fixed_bytes > 0 && c.expert_cache_fixed_bytes < records * 64 + moe_layers * per_layer + 4096, "{name}");
        assert_eq!(c.working_set_bytes, k * slot * moe_layers, "{name}");
        assert_eq!(c.floor_bytes(), c.trunk_bytes + c.state_bytes + c.scratch_bytes + c.min_expert_cache_bytes);
        assert_eq!(c.recommended_bytes(), c.floor_bytes() + 3 * c.working_set_bytes);
        assert_eq!(c.kind, waste::model::plan::ModelKind::Container);
        // A budget's expert cache is the whole slots above trunk, state and scratch, at most
        // every record.
        let b = c.budget_for(1 << 40, &budget(c.floor_bytes() + 3 * slot + 100)).unwrap();
        assert_eq!(b.expert_cache_bytes, c.min_expert_cache_bytes + 3 * slot);
        let all = c.expert_cache_fixed_bytes + records * slot;
        assert_eq!(c.budget_for(1 << 40, &budget(1 << 40)).unwrap().expert_cache_bytes, all);
        // Without a budget, on a large machine: floor + 3 working sets.
        let b = c.budget_for(1 << 40, &waste::Options::default()).unwrap();
        assert_eq!((b.bytes, b.source), (c.recommended_bytes(), waste::BudgetSource::WorkingSets(3)));
    }
}

#[test]
fn cli_plan_of_a_container() {
    let (dir, _) = make_container("plan-cli-container", "olmoe_f32", DType::Q8B32);
    let d = dir.to_str().unwrap();
    // The chunk given: left to the engine it depends on the budget (the test above).
    let doc = plan_json(&[d, "--ctx", "64", "--chunk", "128"]);
    let (floor, ws, min) = (num(&doc, "floor_bytes"), num(&doc, "working_set_bytes"), num(&doc, "min_expert_cache_bytes"));
    assert!(min > 0 && ws > 0);
    assert_eq!(num(&doc, "recommended_bytes"), floor + 3 * ws);
    let doc = plan_json(&[d, "--ctx", "64", "--chunk", "128", "--budget", &(floor + ws).to_string()]);
    assert_eq!(num(&doc, "expert_cache_bytes"), min + ws);
    let (status, out, err) = waste(&["plan", d, "--ctx", "64"]);
    assert_eq!(status, 0, "{err}");
    assert!(out.contains("no --budget: floor + 3 working sets"), "{out}");
    let (status, _, err) = waste(&["plan", d, "--ctx", "64", "--budget", &(floor - 1).to_string()]);
    assert_eq!(status, 1);
    assert!(err.contains(&format!("floor of {floor} bytes")) && err.contains("waste plan"), "{err}");
}

#[test]
fn plan_equals_what_open_holds_for_converted_containers() {
    use waste::tools::convert::{convert, ConvertOptions, Encoding};
    for (name, trunk, experts) in [("olmoe_f32", Encoding::BF16, Encoding::F16), ("qwen3_moe_f32", Encoding::F32, Encoding::BF16), ("mixtral_f32", Encoding::F16, Encoding::F32)] {
        let out = temp_dir(&format!("plan-convert-{name}")).join("model.waste");
        let src = fixture(&format!("oracles/{name}/model"));
        convert(&ConvertOptions { trunk, experts, ..ConvertOptions::new(&src, &out) }, &mut |_| {}).unwrap();
        let base = Options { ctx: 48, threads: 2, prefill_chunk: 4, io_threads: 0, ..Options::default() };
        let plan = waste::plan_memory(&out, &base).unwrap();
        assert!(plan.has_experts(), "{name}");
        // The floor, floor + 1 working set, and a budget above every expert.
        for budget in [plan.floor_bytes(), plan.floor_bytes() + plan.working_set_bytes + 1000, 1 << 40] {
            let cache = plan.expert_cache_bytes(budget).unwrap();
            let model = Model::open(&out, &Options { cache_bytes: cache, ..base.clone() }).unwrap();
            let info = model.info();
            let what = format!("{name} at a budget of {budget}");
            assert_eq!(model.budget().expert_cache_bytes, cache, "{what}");
            assert_plan_matches(&plan, &model, &what);
            assert_eq!(info.weight_bytes, plan.trunk_bytes + cache, "trunk + expert cache: {what}");
            assert_eq!((info.kv_bytes, info.scratch_bytes), (plan.state_bytes, plan.scratch_bytes), "{what}");
            assert!(plan.resident_bytes() + cache <= budget, "{what}");
        }
    }
}

/// Every option of a run that changes its memory (threads, a CPU list, the chunk, int8
/// activations, I/O threads, a cache size) is an option of `waste plan`, which then shows the
/// bytes that run holds.
#[test]
fn cli_plan_takes_every_option_that_changes_the_plan() {
    let (dir, _) = make_container("plan-cli-options", "qwen3_moe_f32", DType::Q8B32);
    let d = dir.to_str().unwrap();
    let stories = root().join("models/stories260K");
    let s = stories.to_str().unwrap();
    for (model, args) in [
        (s, vec!["--ctx", "40", "--threads", "3", "--chunk", "5", "--int8-act"]),
        (s, vec!["--ctx", "40", "--cpus", "0", "--scalar", "--verify", "--lookahead"]),
        (d, vec!["--ctx", "24", "--threads", "2", "--io-threads", "1", "--chunk", "3"]),
        (d, vec!["--ctx", "24", "--threads", "1", "--io-threads", "0", "--cache", "3M"]),
    ] {
        let mut plan_args = vec![model];
        plan_args.extend(&args);
        let doc = plan_json(&plan_args);
        let mut info_args = vec!["info", model, "--json"];
        info_args.extend(&args);
        let (status, out, err) = waste(&info_args);
        assert_eq!(status, 0, "{info_args:?}: {err}");
        let info = json::parse(out.as_bytes()).unwrap();
        let what = format!("{args:?}");
        assert_eq!(num(&doc, "scratch_bytes"), num(&info, "scratch_bytes"), "{what}");
        assert_eq!(num(&doc, "state_bytes"), num(&info, "kv_bytes"), "{what}");
        let (budget, used) = (num(&info, "budget_bytes"), num(&info, "memory_used_bytes"));
        assert!(used <= budget, "{what}: used {used}, budget {budget}");
        if model == s {
            // Dense: the budget is the floor, which exceeds what is held by the tokenizer's margin at most.
            assert!(budget - used <= tokenizer_margin(Path::new(model)), "{what}: used {used}, budget {budget}");
        }
        if args.contains(&"--cache") {
            // The budget a cache size makes is exactly what the model then holds.
            assert_eq!((num(&doc, "budget_bytes"), budget), (used, used), "{what}");
        }
    }
    // A run's floor error names the `waste plan` command that shows it, context included (a
    // bench's context is its prompt + decode length, not the plan's default).
    let (status, _, err) = waste(&["bench", s, "--prompt-tokens", "20", "-n", "7", "--threads", "2", "--int8-act", "--budget", "1K"]);
    assert_eq!(status, 1, "{err}");
    let cmd = err.split('`').nth(1).unwrap_or_else(|| panic!("no command in {err}"));
    assert!(cmd.starts_with("waste plan ") && cmd.contains("--ctx 27") && cmd.contains("--threads 2") && cmd.contains("--int8-act"), "{err}");
    let floor = err.split("floor of ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse::<u64>().ok()).unwrap();
    let args: Vec<&str> = cmd.split(' ').skip(2).collect();
    assert_eq!(num(&plan_json(&args), "floor_bytes"), floor, "{cmd}");
}

/// The tokenizer's share of the plan is an allowance from file sizes: every fixture vocabulary
/// (rank files, tokenizer.json, llama2.c) holds at most that, and at most the stated margin less.
#[test]
fn tokenizer_allowance_bounds_every_fixture_vocabulary() {
    let mut files = vec![root().join("models/stories260K/tok512.bin")];
    for dir in [fixture("tokenizers"), fixture("tokenizers/hf")] {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
            if ext == "tiktoken" || (ext == "json" && p.parent().is_some_and(|d| d.ends_with("hf")) && !p.ends_with("golden.json")) {
                files.push(p);
            }
        }
    }
    let shared = root().join("../shared/data/tokenizers/deepseek_v3_tokenizer.json");
    if shared.is_file() {
        files.push(shared);
    }
    assert!(files.len() >= 12, "{files:?}");
    for f in &files {
        let t = waste::Tokenizer::from_file(f).unwrap();
        let (held, allowance) = (t.heap_bytes(), waste::tokenizer::plan_bytes(f).unwrap());
        let size = std::fs::metadata(f).unwrap().len();
        println!("{}: {size} bytes of file, {held} held, allowance {allowance} ({:.2} x the file over)",
            f.display(), (allowance - held) as f64 / size as f64);
        assert!(held <= allowance, "{}: {held} > {allowance}", f.display());
        assert!(allowance - held <= tokenizer_file_margin(f), "{}: allowance {allowance} - held {held} over the margin", f.display());
    }
}

/// Options with an explicit budget of `bytes`.
fn budget(bytes: u64) -> waste::Options {
    waste::Options { budget: Some(bytes), ..waste::Options::default() }
}

/// Opening holds the checkpoint's tensor index while the weights load, before state and
/// scratch exist: the floor counts what it exceeds them by. The Kimi-K2 FP8 fixture (259 header
/// entries, half of them weight scales) at a 20-token context is such a case; at an ordinary
/// context the state covers it. tests/accounting.rs checks the measured peak against the floor.
#[test]
fn the_floor_counts_the_tensor_index_a_short_context_does_not_cover() {
    let dir = fixture("oracles/kimi_k2_fp8/model");
    let short = waste::Options { ctx: 20, threads: 1, prefill_chunk: 4, io_threads: 0, ..waste::Options::default() };
    let p = waste::plan_memory(&dir, &short).unwrap();
    assert!(p.open_extra_bytes > 0, "{p:?}");
    assert_eq!(p.floor_bytes(), p.resident_bytes() + p.open_extra_bytes + p.min_expert_cache_bytes);
    let long = waste::plan_memory(&dir, &waste::Options { ctx: 2048, ..short }).unwrap();
    assert_eq!(long.open_extra_bytes, 0, "{long:?}");
}

/// The default chunk is left to the engine: 512 tokens when a container's experts stream past
/// its cache (a chunk reads each routed expert once, so fewer chunks read fewer records), 128
/// when the cache holds every record or the model has no streamed experts — with `waste plan`
/// and `Model::open` choosing alike, and the logits the bits of an explicit chunk of 128.
#[test]
fn the_engine_chooses_a_longer_prefill_chunk_when_experts_stream() {
    let dir = float_container("qwen3_moe_f32", "auto-chunk");
    let auto = Options { ctx: 512, threads: 2, ..Options::default() };
    // 4 MoE layers of 8 experts, 2 per token: 3 working sets (24 slots) and the minimum (4) do
    // not hold the 32 records.
    let (plan, mut streamed, what) = plan_and_open(&dir, &auto);
    assert_eq!(plan.prefill_chunk, 512, "{what}");
    assert!(streamed.budget().expert_cache_bytes < plan.cache_within(u64::MAX), "{what}");
    // Every record cached: the default, or the longer chunk where the AMX tiles would take its
    // experts' products (and not with them off).
    let everything = Options { budget: Some(1 << 34), ..auto.clone() };
    let tiles = waste::kernels::Kernels::select(false).isa() == waste::kernels::Isa::Amx;
    let (plan, _, what) = plan_and_open(&dir, &everything);
    assert_eq!(plan.prefill_chunk, if tiles { 512 } else { 128 }, "{what}");
    let (plan, _, what) = plan_and_open(&dir, &Options { tiles: false, ..everything.clone() });
    assert_eq!(plan.prefill_chunk, 128, "{what}");
    let dense = fixture("oracles/llama_f32/model");
    assert_eq!(plan_and_open(&dense, &auto).0.prefill_chunk, 128, "a dense model");
    // The same cache, the chunk given: the same bits over a prompt of three chunks of 128.
    let given = Options { prefill_chunk: 128, cache_bytes: streamed.budget().expert_cache_bytes, ..auto.clone() };
    let mut explicit = Model::open(&dir, &given).unwrap();
    assert_eq!(explicit.plan().prefill_chunk, 128);
    let prompt: Vec<u32> = (0..300u32).map(|i| (i * 37 + 11) % 512).collect();
    let a = streamed.eval(&prompt).unwrap().to_vec();
    let b = explicit.eval(&prompt).unwrap().to_vec();
    assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    let (s, e) = (streamed.cache_stats().unwrap(), explicit.cache_stats().unwrap());
    assert!(s.misses < e.misses, "the longer chunk reads fewer records: {} against {}", s.misses, e.misses);
    let (status, out, err) = waste(&["plan", dir.to_str().unwrap(), "--ctx", "512"]);
    assert_eq!(status, 0, "{err}");
    assert!(out.contains("prefill chunk 512 (chosen by the plan)"), "{out}");
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}
