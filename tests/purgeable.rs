//! Purgeable expert-cache slots (issue 15): a model whose cache slots the kernel may take back
//! under memory pressure, run inside a memory cgroup (v1) that another allocation squeezes
//! below the cache's size, finishes — the kernel takes idle slots instead of killing the
//! process — and the records it took are detected and read again, so the logits stay bit for
//! bit those of ordinary slots.
//!
//! This moves the test process into a cgroup of its own, so it is the only test in this file.
//! It needs root and the cgroup v1 memory controller; without them it prints `SKIP`.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use waste::{Model, Options};

const CGROUPS: &str = "/sys/fs/cgroup/memory";

/// A MoE of 4 layers × 32 experts of ~220 KB (Q4B32): a 28 MB cache, well above the cgroup's
/// per-CPU charge batching.
const MOE: &str = r#"{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "num_experts": 32, "num_experts_per_tok": 4, "norm_topk_prob": true, "vocab_size": 128,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 256}"#;

/// The cgroup the test runs in; dropping it moves the process back and removes the group.
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    fn write(&self, file: &str, value: &str) -> std::io::Result<()> {
        std::fs::write(self.dir.join(file), value)
    }

    fn read_u64(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.dir.join(file)).unwrap().trim().parse().unwrap()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(Path::new(CGROUPS).join("cgroup.procs"), std::process::id().to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn enter_cgroup() -> Result<Cgroup, String> {
    let root = Path::new(CGROUPS);
    if !root.join("memory.limit_in_bytes").exists() {
        return Err(format!("no cgroup v1 memory controller at {CGROUPS}"));
    }
    let dir = root.join(format!("waste-purgeable-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {} (root needed): {e}", dir.display()))?;
    let g = Cgroup { dir };
    g.write("cgroup.procs", &std::process::id().to_string()).map_err(|e| format!("cannot join {}: {e}", g.dir.display()))?;
    Ok(g)
}

#[test]
fn a_squeezed_cgroup_takes_idle_slots_and_the_logits_stay_identical() {
    let dir = temp_dir("purgeable");
    let cfg = dir.join("config.json");
    std::fs::write(&cfg, MOE).unwrap();
    let out = dir.join("m.waste");
    let (code, _, err) = waste(&["random-model", "--config", cfg.to_str().unwrap(), "--out", out.to_str().unwrap(),
        "--container", "--experts", "q4"]);
    assert_eq!(code, 0, "{err}");
    let manifest = waste::format::container::Manifest::open(&out).unwrap();
    let prompt: Vec<u32> = (0..48).map(|i| (i * 37 + 5) % 128).collect();
    let base = Options { threads: 1, io_threads: 2, cache_bytes: manifest.expert_bytes(), ..Options::default() };
    // Ordinary slots, outside any squeeze: the reference, for the prompt at once and for
    // its first tokens one at a time (decode).
    let mut ordinary = Model::open(&out, &base).unwrap();
    let reference = prompt_logits(&mut ordinary, &prompt, false);
    ordinary.reset();
    let steps = &prompt[..16];
    let reference_steps = prompt_logits(&mut ordinary, steps, true);
    drop(ordinary);

    let group = match enter_cgroup() {
        Ok(g) => g,
        Err(why) => return skip("purgeable slots in a squeezed cgroup", &why),
    };
    let mut m = Model::open(&out, &Options { purgeable_slots: true, ..base.clone() }).unwrap();
    let first = prompt_logits(&mut m, &prompt, false);
    assert!(bit_identical(&reference, &first), "purgeable slots, unsqueezed");
    let filled = m.cache_stats().unwrap().clone();
    assert!(filled.misses > 0 && filled.purged == 0, "{filled:?}");
    // Every record read went to a slot: misses and the look-ahead's reads alike.
    let slot_bytes = filled.bytes_read;

    // Squeeze: the group may hold 4 MiB more than it holds now, and another allocation takes
    // half the slots' bytes. Only pages the kernel may take back can make room for it (and
    // for the records read again below).
    let used = group.read_u64("memory.usage_in_bytes");
    group.write("memory.limit_in_bytes", &(used + (4 << 20)).to_string()).unwrap();
    let squeeze = (slot_bytes / 2) as usize;
    let mut balloon = vec![0u8; squeeze];
    for i in (0..squeeze).step_by(4096) {
        balloon[i] = 1;
    }
    std::hint::black_box(&balloon);

    // The run goes on; the slots the kernel took are read again, and the logits do not change.
    m.reset();
    let second = prompt_logits(&mut m, &prompt, false);
    let after = m.cache_stats().unwrap().clone();
    println!("squeezed by {squeeze} bytes: {} lookups found their slot purged and read it again ({after:?})", after.purged);
    assert!(bit_identical(&reference, &second), "purgeable slots, squeezed");
    assert!(after.purged > 0, "the squeeze took no slot: {after:?}");

    // Decode, one token at a time, still squeezed: a record the token before used is not
    // offered yet, so some hits need not take pages back (every lookup hits or was purged:
    // the cache holds every record); the bits stay ordinary slots'.
    m.reset();
    let before = m.cache_stats().unwrap().clone();
    let decoded = prompt_logits(&mut m, steps, true);
    let d = m.cache_stats().unwrap().since(&before);
    assert!(bit_identical(&reference_steps, &decoded), "purgeable slots, decoding");
    assert_eq!(d.misses, d.purged, "{d:?}");
    assert!(d.taken_back > 0 && d.taken_back < d.hits + d.purged, "decode took back every hit's pages, or none: {d:?}");

    // The records the last token used wait for their layer's next visit; a generation's end
    // offers them too (the cache holds a record in every slot by now).
    let slots = d.slots;
    assert!(m.cache_stats().unwrap().offered < slots, "{:?}", m.cache_stats());
    let params = waste::GenerateParams { max_tokens: 4, ..waste::GenerateParams::greedy() };
    m.generate(&prompt[..8], &params, |_| true).unwrap();
    assert_eq!(m.cache_stats().unwrap().offered, slots, "a generation ended with records not offered");
    drop(balloon);
    drop(m);
    drop(group);
}
