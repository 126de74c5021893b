//! The container and the expert cache: converted models match the reference; how and when
//! expert bytes move (cache size, I/O threads, compute threads) never changes the logits;
//! damaged containers are refused naming the layer and expert; an interrupted conversion
//! resumes to byte-identical output.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use waste::tools::convert::{convert, ConvertOptions, Encoding};
use waste::format::json::Json;
use waste::{ErrorKind, Model, Options};

const MOE: [&str; 3] = ["mixtral_f32", "qwen3_moe_f32", "olmoe_f32"];


fn open(dir: &Path, opts: Options) -> Model {
    Model::open(dir, &opts).unwrap()
}

#[test]
fn float_containers_match_the_reference() {
    for name in MOE.iter().chain(&["llama_f32"]) {
        let o = oracle(name);
        let dir = float_container(name, "ref");
        let all = prompt_logits(&mut open(&dir, Options::default()), &o.prompt, false);
        let rel = rel_max_diff(&all, &o.logits);
        println!("{name} (container): logits max|diff|/max|ref| = {rel:.3e}");
        assert!(rel <= 2e-5, "{name}: {rel}");
    }
}

/// The cache only changes when bytes move: smallest cache vs every expert resident, I/O
/// threads vs synchronous reads, 1 vs 2 compute threads, chunked vs token-at-a-time — the
/// logits files are byte-identical, and equal the resident Hugging Face directory's.
#[test]
fn cache_size_io_threads_and_compute_threads_are_bit_identical() {
    for name in MOE {
        let o = oracle(name);
        let dir = float_container(name, "bits");
        let hf = prompt_logits(&mut Model::open(o.dir.join("model"), &Options::default()).unwrap(), &o.prompt, false);
        // The look-ahead is on by default: the rows without it in the label run without it.
        let base = Options { threads: 1, io_threads: 0, lookahead: false, ..Options::default() };
        let reference = prompt_logits(&mut open(&dir, base.clone()), &o.prompt, false);
        assert!(bit_identical(&reference, &hf), "{name}: container vs directory");
        let manifest = waste::format::container::Manifest::open(&dir).unwrap();
        let smallest = waste::cache::min_cache_bytes(&manifest);
        for (label, opts, single) in [
            ("smallest cache", Options { cache_bytes: smallest, ..base.clone() }, false),
            ("every expert cached", Options { cache_bytes: manifest.expert_bytes(), ..base.clone() }, false),
            ("io threads", Options { io_threads: 3, cache_bytes: smallest, ..base.clone() }, false),
            ("2 compute threads", Options { threads: 2, io_threads: 2, ..base.clone() }, false),
            ("token at a time, smallest cache", Options { cache_bytes: smallest, io_threads: 2, ..base.clone() }, true),
            ("look-ahead, smallest cache", Options { cache_bytes: smallest, io_threads: 2, lookahead: true, ..base.clone() }, true),
            ("look-ahead, half the experts", Options { cache_bytes: manifest.expert_bytes() / 2, io_threads: 3, lookahead: true, threads: 2, ..base.clone() }, true),
            // Prefill chunks guess the next layer's experts too, where the cache holds both layers'.
            ("look-ahead, prefill chunks", Options { cache_bytes: manifest.expert_bytes(), io_threads: 2, lookahead: true, ..base.clone() }, false),
            // The fallback where O_DIRECT is refused (buffered reads, pages dropped), forced.
            ("buffered fallback, io threads", Options { direct_io: false, cache_bytes: smallest, io_threads: 2, ..base.clone() }, false),
            ("buffered fallback, synchronous", Options { direct_io: false, cache_bytes: smallest, ..base.clone() }, true),
            ("purgeable slots, io threads", Options { purgeable_slots: true, cache_bytes: smallest, io_threads: 2, ..base.clone() }, true),
            ("purgeable slots, synchronous", Options { purgeable_slots: true, cache_bytes: manifest.expert_bytes() / 2, ..base.clone() }, false),
            ("4 KiB slot pages, io threads", Options { huge_pages: false, cache_bytes: smallest, io_threads: 2, ..base.clone() }, true),
        ] {
            let t = std::time::Instant::now();
            let mut m = open(&dir, opts);
            let got = prompt_logits(&mut m, &o.prompt, single);
            let wall = t.elapsed();
            assert!(bit_identical(&reference, &got), "{name}: {label}");
            let s = m.cache_stats().unwrap();
            assert!(s.hits + s.misses > 0 && s.bytes_read > 0, "{name}: {label}: {s:?}");
            // The disk's busy time lies within the run, and overlapping reads count once in it
            // but each in the reading time.
            assert!(!s.disk_busy.is_zero() && s.disk_busy <= wall && s.read_time >= s.disk_busy, "{name}: {label}: {s:?}");
            assert_eq!(s.banks, manifest.banks.len(), "{name}: {label}");
            if label.starts_with("buffered") {
                assert!(!s.direct_io && s.buffered_banks == s.banks && s.io_mode() == "buffered+fadvise", "{name}: {label}: {s:?}");
            }
            if label.starts_with("look-ahead") {
                assert!(s.prefetched > 0 && s.prefetch_hits > 0, "{name}: {label}: the look-ahead did not work: {s:?}");
            }
        }
    }
}

/// A cache smaller than the experts really evicts and re-reads, and reports it.
#[test]
fn small_cache_streams_and_counts() {
    let o = oracle("mixtral_f32");
    let dir = float_container("mixtral_f32", "stats");
    let manifest = waste::format::container::Manifest::open(&dir).unwrap();
    let smallest = waste::cache::min_cache_bytes(&manifest);
    // Without the look-ahead, every byte read is a miss's.
    let mut m = open(&dir, Options { cache_bytes: smallest, lookahead: false, ..Options::default() });
    let _ = greedy(&mut m, &o.prompt, 8);
    let s = m.cache_stats().unwrap().clone();
    assert_eq!(s.slots, 4, "2 × top-2");
    assert!(s.misses > 8 * 4, "{s:?}");
    assert_eq!(s.bytes_read, s.misses * manifest.banks[0].layout.record_bytes as u64);
    let mut all = open(&dir, Options { cache_bytes: manifest.expert_bytes(), ..Options::default() });
    let _ = greedy(&mut all, &o.prompt, 8);
    let s2 = all.cache_stats().unwrap();
    assert!(s2.misses <= 32, "every expert read at most once: {s2:?}");
    let below = Model::open(&dir, &Options { cache_bytes: smallest - 1, ..Options::default() });
    let err = below.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::RamBudget);
    assert!(err.to_string().contains("plan"), "{err}");
}

/// Damage one bank of a fresh float container, then run the prompt: the error names the layer
/// and the expert, and no logits come out.
fn damaged(tag: &str, verify: bool, damage: impl FnOnce(&Path, usize)) -> String {
    let dir = float_container("mixtral_f32", tag);
    let manifest = waste::format::container::Manifest::open(&dir).unwrap();
    let rb = manifest.banks[1].layout.record_bytes;
    damage(&dir.join(&manifest.banks[1].file), rb);
    let o = oracle("mixtral_f32");
    let mut messages = Vec::new();
    // With and without the look-ahead (which reads records before they are asked for).
    for lookahead in [false, true] {
        let opened = Model::open(&dir, &Options { verify, io_threads: 2, lookahead, ..Options::default() });
        let err = match opened {
            Err(e) => e,
            Ok(mut m) => {
                let out = if lookahead {
                    // Decode token by token so the look-ahead runs.
                    o.prompt.iter().try_for_each(|&t| m.eval(&[t]).map(|_| ()))
                } else {
                    m.eval_each(&o.prompt, |_, _| Ok(()))
                };
                match out {
                    Ok(()) => panic!("{tag}: damaged container produced logits (look-ahead {lookahead})"),
                    Err(e) => e,
                }
            }
        };
        messages.push(err.to_string());
    }
    assert!(messages[1].contains("layer 1"), "{tag}: {}", messages[1]);
    messages.swap_remove(0)
}

fn edit(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = std::fs::read(path).unwrap();
    f(&mut b);
    std::fs::write(path, b).unwrap();
}

#[test]
fn truncated_bank_is_refused() {
    let e = damaged("truncated", false, |p, rb| edit(p, |b| b.truncate(b.len() - rb / 2)));
    assert!(e.contains("layer 1") && e.contains("expert 7") && e.contains("truncated"), "{e}");
}

#[test]
fn oversized_bank_is_refused_naming_the_file_and_the_extra_bytes() {
    let e = damaged("oversized", false, |p, _| edit(p, |b| b.extend_from_slice(&[0u8; 100])));
    assert!(e.contains("experts-001.bank") && e.contains("layer 1") && e.contains("100 extra bytes"), "{e}");
    assert!(!e.contains("expert 8 is"), "there is no expert 8: {e}");
}

#[test]
fn swapped_records_are_refused() {
    let e = damaged("swapped", false, |p, rb| edit(p, |b| {
        let (a, c) = b.split_at_mut(rb);
        a.swap_with_slice(&mut c[..rb]);
    }));
    assert!(e.contains("layer 1 expert ") && e.contains("out of place"), "{e}");
}

#[test]
fn wrong_magic_is_refused() {
    let e = damaged("magic", false, |p, rb| edit(p, |b| (0..8).for_each(|i| b[i * rb] = b'X')));
    assert!(e.contains("layer 1 expert ") && e.contains("magic"), "{e}");
}

#[test]
fn header_sizes_disagreeing_with_the_manifest_are_refused() {
    // The down matrix's row count in every record's header.
    let e = damaged("sizes", false, |p, rb| edit(p, |b| (0..8).for_each(|i| b[i * rb + 40 + 64 + 4] ^= 1)));
    assert!(e.contains("layer 1 expert ") && e.contains("disagrees with the manifest"), "{e}");
}

#[test]
fn flipped_payload_byte_is_caught_with_verify() {
    let flip = |p: &Path, rb: usize| edit(p, |b| (0..8).for_each(|i| b[i * rb + 300 + i] ^= 0x40));
    let e = damaged("flip", true, flip);
    assert!(e.contains("layer 1 expert ") && e.contains("CRC-32"), "{e}");
}

#[test]
fn manifest_naming_a_missing_bank_is_refused() {
    let e = damaged("missing", false, |p, _| std::fs::remove_file(p).unwrap());
    assert!(e.contains("layer 1") && e.contains("experts-001.bank"), "{e}");
}

fn dir_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir).unwrap().flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

/// Interrupt the converter after every possible unit of work, run it again, and compare the
/// result with an uninterrupted conversion byte for byte. A torn record at the end of a
/// partial bank (a kill mid-write) is also repaired.
#[test]
fn interrupted_conversion_resumes_to_identical_bytes() {
    let o = oracle("qwen3_moe_f32");
    let src = o.dir.join("model");
    let base = temp_dir("resume");
    let reference = base.join("reference");
    convert(&ConvertOptions { experts: Encoding::BF16, trunk: Encoding::F32, ..ConvertOptions::new(&src, &reference) }, &mut |_| {}).unwrap();
    let want = dir_bytes(&reference);
    let mut units = 0;
    convert(&ConvertOptions { experts: Encoding::BF16, trunk: Encoding::F32, ..ConvertOptions::new(&src, base.join("count")) }, &mut |_| units += 1).unwrap();
    assert!(units > 20, "{units}");
    let mut stops: Vec<u64> = (1..units).step_by(3).chain([units - 1]).collect();
    stops.dedup();
    for stop in stops {
        let out = base.join(format!("stop-{stop}"));
        let opts = ConvertOptions { experts: Encoding::BF16, trunk: Encoding::F32, interrupt_after: Some(stop), ..ConvertOptions::new(&src, &out) };
        assert!(convert(&opts, &mut |_| {}).is_err(), "stop {stop}");
        assert!(!out.join("manifest.json").exists(), "no manifest before the end");
        // A kill in the middle of a record write leaves a torn tail.
        for e in std::fs::read_dir(&out).unwrap().flatten() {
            if e.file_name().to_string_lossy().ends_with(".bank.tmp") {
                let mut f = std::fs::OpenOptions::new().append(true).open(e.path()).unwrap();
                std::io::Write::write_all(&mut f, &[0xAB; 1000]).unwrap();
            }
        }
        let resumed = ConvertOptions { interrupt_after: None, ..opts };
        let report = convert(&resumed, &mut |_| {}).unwrap();
        // Stopped inside the trunk file, that file restarts; later, finished work is kept.
        if stop + 4 > units {
            assert!(report.resumed_units > 0, "stop {stop}: nothing resumed");
        }
        assert!(dir_bytes(&out) == want, "stop {stop}: output differs from an uninterrupted run");
    }
}

/// A directory that holds something else is not overwritten.
#[test]
fn convert_refuses_a_foreign_output_directory() {
    let o = oracle("llama_f32");
    let out = temp_dir("foreign");
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    // Float encodings: llama_f32's widths are not multiples of 32, and the input is checked
    // before the output directory.
    let opts = ConvertOptions { trunk: Encoding::F32, experts: Encoding::F32, ..ConvertOptions::new(o.dir.join("model"), &out) };
    let err = convert(&opts, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    assert_eq!(std::fs::read_to_string(out.join("notes.txt")).unwrap(), "mine");
}

/// stories260K with its MLP copied into 4 identical experts under a zero router (Mixtral
/// layout): top-2 of equal scores takes experts 0 and 1 with weight ½ each, so every output is
/// exactly the dense model's and the golden story must come out of the streamed container.
fn upcycled_stories(dir: &Path) {
    use waste::format::dtype::DType;
    use waste::format::safetensors::{SafeTensors, TensorSpec, Writer};
    std::fs::create_dir_all(dir).unwrap();
    let src = root().join("models/stories260K");
    let st = SafeTensors::open(&src.join("model.safetensors")).unwrap();
    let mut specs = Vec::new();
    let mut data: Vec<Vec<u8>> = Vec::new();
    let read = |name: &str| {
        let t = st.get(name).unwrap();
        let mut b = vec![0u8; t.len as usize];
        st.read_into(t, &mut b).unwrap();
        (t.shape.clone(), b)
    };
    for t in &st.tensors {
        if t.name.contains(".mlp.") {
            continue;
        }
        let (shape, b) = read(&t.name);
        specs.push(TensorSpec { name: t.name.clone(), dtype: DType::F32, shape });
        data.push(b);
    }
    for l in 0..5 {
        specs.push(TensorSpec { name: format!("model.layers.{l}.block_sparse_moe.gate.weight"), dtype: DType::F32, shape: vec![4, 64] });
        data.push(vec![0u8; 4 * 64 * 4]);
        for j in 0..4 {
            for (w, hf) in [("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")] {
                let (shape, b) = read(&format!("model.layers.{l}.mlp.{hf}.weight"));
                specs.push(TensorSpec { name: format!("model.layers.{l}.block_sparse_moe.experts.{j}.{w}.weight"), dtype: DType::F32, shape });
                data.push(b);
            }
        }
    }
    let mut w = Writer::create(&dir.join("model.safetensors"), &specs, &[]).unwrap();
    for d in &data {
        w.write(d).unwrap();
    }
    w.finish().unwrap();
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap()
        .replace("LlamaForCausalLM", "MixtralForCausalLM")
        .replace("\"model_type\": \"llama\"", "\"model_type\": \"mixtral\", \"num_local_experts\": 4, \"num_experts_per_tok\": 2");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    std::fs::copy(src.join("tok512.bin"), dir.join("tok512.bin")).unwrap();
}

#[test]
fn streamed_upcycled_stories_tells_the_golden_story() {
    let base = temp_dir("upcycled");
    upcycled_stories(&base.join("hf"));
    let out = base.join("stories.waste");
    let opts = ConvertOptions { trunk: Encoding::F32, experts: Encoding::F32, ..ConvertOptions::new(base.join("hf"), &out) };
    convert(&opts, &mut |_| {}).unwrap();
    let g = read_json(&fixture("stories260K_golden.json"));
    let text = g.get("greedy_text").unwrap().as_str().unwrap();
    let (code, stdout, err) = waste(&["run", out.to_str().unwrap(), "Once upon a time", "-n", "252", "--temp", "0", "--cache", "1M", "--verify"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(stdout.trim_end_matches('\n'), text);
    assert!(err.contains("[252 tokens,") && err.contains("experts ") && err.contains(" hit / ") && err.contains("miss"), "{err}");
    // A cache of 1 MiB reads all along: the summary gives the disk's busy time and rate.
    assert!(err.contains(", disk busy ") && err.contains(" GB/s"), "{err}");
    let m = waste::format::container::Manifest::open(&out).unwrap();
    assert_eq!((m.tokenizer_kind.as_deref(), &m.tokenizer_files[..]), (Some("llama2c"), &["tok512.bin".to_string()][..]));
    // `info` on a container: the expert cache, the banks and how they are read.
    let (code, stdout, err) = waste(&["info", out.to_str().unwrap(), "--cache", "1M"]);
    assert_eq!(code, 0, "{err}");
    let rb = m.max_record_bytes();
    let slots = ((1usize << 20) / rb).min(m.banks.len() * 4) * rb;
    assert!(stdout.contains(&format!("expert cache  {slots} bytes")), "{stdout}");
    assert!(stdout.contains("expert banks  5 (O_DIRECT)") || stdout.contains("expert banks  5 (buffered+fadvise)"), "{stdout}");
}

/// The node at `path` (object keys, or array indices as numbers) of a JSON tree.
fn node<'a>(j: &'a mut Json, path: &[&str]) -> &'a mut Json {
    path.iter().fold(j, |cur, k| match cur {
        Json::Object(m) => &mut m.iter_mut().find(|(n, _)| n == k).unwrap_or_else(|| panic!("no key {k}")).1,
        Json::Array(a) => &mut a[k.parse::<usize>().unwrap()],
        other => panic!("{k}: not a container: {other:?}"),
    })
}

fn edit_manifest(dir: &Path, f: impl FnOnce(&mut Json)) {
    let p = dir.join("manifest.json");
    let mut j = waste::format::json::parse(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut j);
    std::fs::write(&p, j.to_string_pretty()).unwrap();
}

/// Every manifest field the engine cross-checks at open, disagreeing in turn: the error names
/// what disagrees, and the container is not opened.
#[test]
fn manifest_disagreements_are_refused_at_open() {
    let dir = float_container("mixtral_f32", "manifest");
    let good = std::fs::read(dir.join("manifest.json")).unwrap();
    type Edit = Box<dyn Fn(&mut Json)>;
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        ("index shape", Box::new(|j| *node(j, &["trunk", "tensors", "1", "shape", "0"]) = Json::uint(511)),
            &["model.embed_tokens.weight", "the index says F32 [511, 64]", "the file's header says F32 [512, 64]"]),
        ("index range", Box::new(|j| *node(j, &["trunk", "tensors", "1", "byte_range", "0"]) = Json::uint(8)),
            &["model.embed_tokens.weight", "at bytes 8.."]),
        ("index dtype", Box::new(|j| *node(j, &["trunk", "tensors", "0", "dtype"]) = Json::str("BF16")),
            &["lm_head.weight", "BF16"]),
        ("tensor not indexed", Box::new(|j| { let Json::Array(a) = node(j, &["trunk", "tensors"]) else { panic!() }; a.remove(0); }),
            &["lm_head.weight", "is not in the trunk index"]),
        ("indexed twice", Box::new(|j| { let Json::Array(a) = node(j, &["trunk", "tensors"]) else { panic!() }; let t = a[2].clone(); a.push(t); }),
            &["indexed twice"]),
        ("trunk size", Box::new(|j| *node(j, &["trunk", "files", "0", "bytes"]) = Json::uint(1000)),
            &["trunk-f32.safetensors", "the manifest says 1000"]),
        ("architecture", Box::new(|j| *node(j, &["architecture"]) = Json::str("OlmoeForCausalLM")),
            &["architecture", "OlmoeForCausalLM", "MixtralForCausalLM"]),
        ("old version", Box::new(|j| *node(j, &["version"]) = Json::uint(1)), &["container version 1", "convert the model again"]),
        ("new version", Box::new(|j| *node(j, &["version"]) = Json::uint(3)), &["container version 3 is newer"]),
        ("tokenizer kind", Box::new(|j| *node(j, &["tokenizer", "kind"]) = Json::str("wordpiece")), &["tokenizer.kind", "wordpiece"]),
        ("tokenizer claimed", Box::new(|j| *node(j, &["tokenizer", "kind"]) = Json::str("tiktoken")), &["tokenizer.kind", "tiktoken", "no tokenizer"]),
        ("side file missing", Box::new(|j| *node(j, &["files", "0"]) = Json::str("absent.json")), &["absent.json"]),
        ("payload bytes", Box::new(|j| *node(j, &["banks", "0", "payload_bytes"]) = Json::uint(12)), &["banks[0].payload_bytes"]),
    ];
    for (what, f, needles) in cases {
        std::fs::write(dir.join("manifest.json"), &good).unwrap();
        edit_manifest(&dir, f);
        let e = Model::open(&dir, &Options::default()).err().unwrap_or_else(|| panic!("{what}: opened")).to_string();
        assert!(needles.iter().all(|n| e.contains(n)), "{what}: {e}");
    }
    std::fs::write(dir.join("manifest.json"), &good).unwrap();
    Model::open(&dir, &Options { verify: true, ..Options::default() }).unwrap();
}

/// A flipped byte of a trunk tensor passes every header check (sizes and index agree) and is
/// caught by the trunk file's CRC-32 under `verify`.
#[test]
fn flipped_trunk_byte_is_caught_with_verify() {
    let dir = float_container("mixtral_f32", "trunkflip");
    let trunk = dir.join("trunk-f32.safetensors");
    edit(&trunk, |b| { let n = b.len(); b[n - 101] ^= 0x08; });
    Model::open(&dir, &Options::default()).unwrap();
    let e = Model::open(&dir, &Options { verify: true, ..Options::default() }).err().unwrap().to_string();
    assert!(e.contains("trunk-f32.safetensors") && e.contains("CRC-32") && e.contains("changed after conversion"), "{e}");
}

/// A copy of a Hugging Face fixture directory with extra files, for conversions that change it.
fn source_copy(name: &str, tag: &str, extra: &[(&str, PathBuf)]) -> PathBuf {
    let from = oracle(name).dir.join("model");
    let to = temp_dir(tag).join("hf");
    std::fs::create_dir_all(&to).unwrap();
    for e in std::fs::read_dir(&from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    for (as_name, src) in extra {
        std::fs::copy(src, to.join(as_name)).unwrap();
    }
    to
}

/// The converter detects the tokenizer's kind and lists its files apart from
/// generation_config.json; the engine checks the kind against what the files load as.
#[test]
fn manifest_records_the_tokenizer_kind() {
    for (file, as_name, kind) in [
        ("tokenizers/hf/qwen2.json", "tokenizer.json", "hf-bytelevel"),
        ("tokenizers/hf/llama2.json", "tokenizer.json", "hf-sentencepiece"),
        ("tokenizers/cl100k_base.tiktoken", "cl100k_base.tiktoken", "tiktoken"),
    ] {
        let src = source_copy("mixtral_f32", &format!("tok-{kind}"), &[(as_name, fixture(file))]);
        let out = src.with_file_name("model.waste");
        convert(&ConvertOptions { trunk: Encoding::F32, experts: Encoding::F32, ..ConvertOptions::new(&src, &out) }, &mut |_| {}).unwrap();
        let m = waste::format::container::Manifest::open(&out).unwrap();
        assert_eq!(m.tokenizer_kind.as_deref(), Some(kind));
        assert_eq!(m.tokenizer_files, [as_name]);
        assert_eq!(m.other_files, ["generation_config.json"]);
        // The model opens (its tokenizer may not fit this fixture's 512-id vocabulary, which is
        // reported only when text is needed); the files load as the kind the manifest names.
        Model::open(&out, &Options::default()).unwrap();
        assert_eq!(waste::Tokenizer::from_model_dir(&out).unwrap().kind_name(), kind);
        let other = if kind == "tiktoken" { "llama2c" } else { "tiktoken" };
        edit_manifest(&out, |j| *node(j, &["tokenizer", "kind"]) = Json::str(other));
        let e = Model::open(&out, &Options::default()).err().unwrap().to_string();
        assert!(e.contains("tokenizer.kind") && e.contains(other) && e.contains(kind), "{e}");
    }
    // No tokenizer at all: kind null.
    let m = waste::format::container::Manifest::open(&float_container("olmoe_f32", "tok-none")).unwrap();
    assert_eq!((m.tokenizer_kind, m.tokenizer_files.len()), (None, 0));
}

fn f32_opts(src: &Path, out: &Path) -> ConvertOptions {
    ConvertOptions { experts: Encoding::BF16, trunk: Encoding::F32, ..ConvertOptions::new(src, out) }
}

/// A kill inside each small atomic write — the state file (first written, then rewritten as
/// each trunk file finishes), the tokenizer and generation files, the manifest — at each stage
/// (torn temporary file, complete but not renamed, renamed): the rerun finishes, byte-identical
/// to an uninterrupted run. Killed in the first state write, the directory holds nothing but a
/// torn `.waste-convert.json.tmp`, which is recognised; killed after the manifest, it is a
/// finished container, which is verified.
#[test]
fn conversion_killed_inside_small_writes_resumes_to_identical_bytes() {
    let src = source_copy("qwen3_moe_f32", "smallwrites", &[("tokenizer.json", fixture("tokenizers/hf/qwen2.json"))]);
    let base = src.parent().unwrap().to_path_buf();
    let reference = base.join("reference");
    convert(&f32_opts(&src, &reference), &mut |_| {}).unwrap();
    let want = dir_bytes(&reference);
    use waste::tools::convert::WriteStage;
    for stage in [WriteStage::Torn, WriteStage::BeforeRename, WriteStage::AfterRename] {
        let mut n = 1;
        loop {
            let out = base.join(format!("{stage:?}-{n}"));
            let opts = ConvertOptions { interrupt_write: Some((n, stage)), ..f32_opts(&src, &out) };
            match convert(&opts, &mut |_| {}) {
                Ok(_) => break,
                Err(e) => assert!(e.to_string().contains("testing hook"), "{stage:?} {n}: {e}"),
            }
            if n == 1 && stage == WriteStage::Torn {
                let names: Vec<String> = std::fs::read_dir(&out).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                assert_eq!(names, [".waste-convert.json.tmp"]);
            }
            // A manifest in place means a container that opens.
            if out.join("manifest.json").exists() {
                waste::format::container::Manifest::open(&out).unwrap();
            }
            let report = convert(&f32_opts(&src, &out), &mut |_| {}).unwrap();
            assert!(dir_bytes(&out) == want, "{stage:?} {n}: output differs from an uninterrupted run");
            // Killed after the manifest was renamed into place: a finished container, verified.
            assert_eq!(report.verified_existing, stage == WriteStage::AfterRename && n == 5, "{stage:?} {n}: {report:?}");
            n += 1;
        }
        // The first state, the state once trunk-f32 is done, generation_config.json,
        // tokenizer.json, the manifest.
        assert_eq!(n - 1, 5, "{stage:?}");
    }
}

/// A rerun of the same conversion on its finished output verifies it and says so; a damaged
/// trunk file or bank record is rewritten (the trunk file's CRC, the record's CRC), giving the
/// original bytes back; other options are refused.
#[test]
fn rerun_on_a_finished_container_verifies_and_repairs_it() {
    let src = oracle("qwen3_moe_f32").dir.join("model");
    let out = temp_dir("rerun").join("model.waste");
    convert(&f32_opts(&src, &out), &mut |_| {}).unwrap();
    let want = dir_bytes(&out);
    let again = convert(&f32_opts(&src, &out), &mut |_| {}).unwrap();
    assert!(again.verified_existing && dir_bytes(&out) == want, "{again:?}");
    edit(&out.join("trunk-f32.safetensors"), |b| { let n = b.len(); b[n / 2] ^= 1; });
    let bank = waste::format::container::Manifest::open(&out).unwrap().banks[0].clone();
    edit(&out.join(&bank.file), |b| b[3 * bank.layout.record_bytes + 400] ^= 0x10);
    let repaired = convert(&f32_opts(&src, &out), &mut |_| {}).unwrap();
    assert!(!repaired.verified_existing && dir_bytes(&out) == want, "{repaired:?}");
    let other = ConvertOptions { experts: Encoding::F32, ..f32_opts(&src, &out) };
    let e = convert(&other, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("different conversion"), "{e}");
    assert!(dir_bytes(&out) == want, "a refused conversion changed the directory");
}

/// The resume fingerprint holds config.json's bytes: an interrupted conversion whose source
/// config changed starts over (nothing resumed, though its trunk file and first records were
/// done) and equals a fresh conversion of the new source. And a finished trunk file is only
/// trusted after its size and CRC-32 check.
#[test]
fn changed_config_restarts_an_interrupted_conversion() {
    let src = source_copy("qwen3_moe_f32", "fingerprint", &[]);
    let base = src.parent().unwrap().to_path_buf();
    let mut trunk_units = 0;
    convert(&f32_opts(&src, &base.join("count")), &mut |p| trunk_units += u64::from(p.file.starts_with("trunk-"))).unwrap();
    let stop = ConvertOptions { interrupt_after: Some(trunk_units + 2), ..f32_opts(&src, &base.join("unused")) };
    // A finished trunk file damaged between the runs is written again.
    let damaged = base.join("damaged");
    assert!(convert(&ConvertOptions { output: damaged.clone(), ..stop.clone() }, &mut |_| {}).is_err());
    edit(&damaged.join("trunk-f32.safetensors"), |b| { let n = b.len(); b[n - 1] ^= 1; });
    let report = convert(&f32_opts(&src, &damaged), &mut |_| {}).unwrap();
    assert!(report.resumed_units >= 2, "the bank's records were not resumed: {report:?}");
    assert!(dir_bytes(&damaged) == dir_bytes(&base.join("count")), "a damaged finished trunk file was trusted");
    // The config changes between the runs.
    let out = base.join("out");
    assert!(convert(&ConvertOptions { output: out.clone(), ..stop }, &mut |_| {}).is_err());
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
    assert!(cfg.contains("\"rms_norm_eps\": 1e-06"), "{cfg}");
    std::fs::write(src.join("config.json"), cfg.replace("\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 2e-06")).unwrap();
    let report = convert(&f32_opts(&src, &out), &mut |_| {}).unwrap();
    assert_eq!(report.resumed_units, 0, "resumed across a changed config");
    let fresh = base.join("fresh");
    convert(&f32_opts(&src, &fresh), &mut |_| {}).unwrap();
    assert!(dir_bytes(&out) == dir_bytes(&fresh));
}

/// A quantized Hugging Face checkpoint whose expert tensor has a NaN block scale: refused by
/// the engine (resident experts) and by the converter, naming the tensor, the row and the block.
#[test]
fn non_finite_expert_scales_are_refused() {
    use waste::format::quant::Width;
    let base = temp_dir("nan-scale");
    let q = base.join("q4");
    waste::tools::quantize::quantize_checkpoint(&oracle("mixtral_f32").dir.join("model"), &q, Width::Q4).unwrap();
    let name = "model.layers.1.block_sparse_moe.experts.3.w2.weight";
    let (offset, per_row) = {
        let st = waste::format::safetensors::SafeTensors::open(&q.join("model.safetensors")).unwrap();
        let t = st.get(name).unwrap();
        (t.offset, t.shape[1] / 32)
    };
    // Opens and runs before the damage.
    Model::open(&q, &Options::default()).unwrap();
    for (bits, what) in [(0x7e00u16, "NaN"), (0xfc00, "infinite")] {
        edit(&q.join("model.safetensors"), |b| {
            let at = (offset + (2 * per_row + 1) * 18) as usize;
            b[at..at + 2].copy_from_slice(&bits.to_le_bytes());
        });
        let e = Model::open(&q, &Options::default()).err().unwrap().to_string();
        assert!(e.contains(name) && e.contains("row 2, block 1") && e.contains(what), "{e}");
        let out = base.join(format!("out-{what}"));
        let opts = ConvertOptions { trunk: Encoding::Q4, embeddings: Some(Encoding::Q4), experts: Encoding::Q4, ..ConvertOptions::new(&q, &out) };
        let e = convert(&opts, &mut |_| {}).unwrap_err().to_string();
        assert!(e.contains(name) && e.contains("row 2, block 1") && e.contains(what), "{e}");
    }
}

/// The look-ahead stops guessing once it cannot help: a cache with a slot for every record may
/// still miss until it has read them all, and not after; a smaller one, or one whose slots
/// the kernel may take back, may always miss.
#[test]
fn a_cache_holding_every_record_stops_missing_once_all_are_read() {
    use waste::cache::{CacheOptions, ExpertCache};
    let dir = float_container("olmoe_f32", "may_miss");
    let m = waste::format::container::Manifest::open(&dir).unwrap();
    let experts = m.config.moe.as_ref().unwrap().experts as u32;
    let all: Vec<u32> = (0..experts).collect();
    let options = |bytes, purgeable| CacheOptions { bytes, io_threads: 2, verify: false, policy: None, direct_io: true, purgeable, huge_pages: true };
    for (label, opts, after) in [
        ("every record", options(m.expert_bytes() * 2, false), false),
        ("purgeable, every record", options(m.expert_bytes() * 2, true), true),
        ("the smallest cache", options(waste::cache::min_cache_bytes(&m), false), true),
    ] {
        let mut cache = ExpertCache::open(&m, &opts).unwrap();
        assert!(cache.may_miss(), "{label}: nothing read yet");
        for bank in &m.banks {
            let mut served = 0;
            cache.with_records(bank.layer, &all, &[], &mut |_, batch| served += batch.len()).unwrap();
            assert_eq!(served, all.len(), "{label}: layer {} served every record once", bank.layer);
        }
        assert_eq!(cache.may_miss(), after, "{label}: after every record was read");
    }
}

/// Purgeable slots (`docs/MEMORY.md`): a prompt's chunk offers its records to the kernel as soon
/// as their layer is done; in decode a record the token before used is offered only once its
/// layer has been visited without it, so the next token's hit on it takes no pages back; and
/// `offer_all_idle` (a generation's end) offers every one. The bookkeeping only: the squeeze
/// that makes the kernel take slots is `tests/purgeable.rs`, which needs root.
#[test]
fn purgeable_slots_wait_a_visit_in_decode() {
    use waste::cache::{CacheOptions, CacheStats, ExpertCache};
    let dir = float_container("olmoe_f32", "offer");
    let m = waste::format::container::Manifest::open(&dir).unwrap();
    let k = m.config.moe.as_ref().unwrap().top_k as u32;
    assert!(2 * k <= m.config.moe.as_ref().unwrap().experts as u32, "the fixture has too few experts for this test");
    let layer = m.banks[0].layer;
    let opts = CacheOptions { bytes: m.expert_bytes() * 2, io_threads: 0, verify: false, policy: None, direct_io: false, purgeable: true, huge_pages: true };
    let mut cache = ExpertCache::open(&m, &opts).unwrap();
    let mut visit = |experts: std::ops::Range<u32>| -> CacheStats {
        let wanted: Vec<u32> = experts.collect();
        cache.with_records(layer, &wanted, &[], &mut |_, _| {}).unwrap();
        cache.stats().clone()
    };
    // (offered now, lookups that took pages back so far) after each visit.
    let seen = |s: CacheStats| (s.offered, s.taken_back as usize);
    let prompt = visit(0..2 * k);
    if prompt.offered == 0 {
        return skip("purgeable slots in decode", "MADV_FREE is not available here");
    }
    let k = k as usize;
    assert_eq!(seen(prompt), (2 * k, 0), "a prompt's chunk offers its records at once");
    assert_eq!(seen(visit(0..k as u32)), (k, k), "a token takes back what it uses and keeps it");
    assert_eq!(seen(visit(0..k as u32)), (k, k), "the next token reuses it without taking pages back");
    assert_eq!(seen(visit(k as u32..2 * k as u32)), (k, 2 * k), "a record idle for a visit is offered");
    cache.offer_all_idle();
    assert_eq!(cache.stats().offered, 2 * k, "a generation's end offers every record");
}

/// A container whose experts stream reads its embeddings a row at a time instead of holding
/// the table: the plan's trunk counts one row's buffer for it (the logits stay the directory's
/// bits: `cache_size_io_threads_and_compute_threads_are_bit_identical` runs such containers);
/// a damaged row is refused at open, and a row damaged after the open fails the token that
/// reads it with an error naming the tensor, the row and the block.
#[test]
fn streamed_containers_read_their_embeddings_a_row_at_a_time() {
    let o = oracle("mixtral_f32");
    let dir = temp_dir("embed-rows").join("model.waste");
    let opts = ConvertOptions { trunk: Encoding::Q4, embeddings: Some(Encoding::Q8), experts: Encoding::Q4, ..ConvertOptions::new(o.dir.join("model"), &dir) };
    convert(&opts, &mut |_| {}).unwrap();
    let manifest = waste::format::container::Manifest::open(&dir).unwrap();
    let name = "model.embed_tokens.weight";
    let (file, offset, per_row) = manifest.trunk_files.iter().find_map(|f| {
        let st = waste::format::safetensors::SafeTensors::open(&dir.join(f)).unwrap();
        st.get(name).map(|t| (dir.join(f), t.offset, t.shape[1] / 32))
    }).unwrap();
    let trunk: u64 = manifest.trunk_files.iter().map(|f| {
        waste::format::safetensors::SafeTensors::open(&dir.join(f)).unwrap().tensors.iter().map(|t| t.len).sum::<u64>()
    }).sum();
    // The table's bytes leave the trunk; the buffer of one row's 4 KiB-aligned span comes in.
    let vocab = (o.logits.len() / o.prompt.len()) as u64;
    let table = vocab * per_row * 34;
    let buffer = (per_row * 34).div_ceil(4096) * 4096 + 4096;
    let plan = waste::plan_memory(&dir, &Options::default()).unwrap();
    println!("trunk tensors {trunk} B, the table {table} B, the plan's trunk {} B", plan.trunk_bytes);
    assert_eq!(plan.trunk_bytes + table, trunk + buffer, "the plan's trunk");

    let token = o.prompt[0] as u64;
    let damage = |row: u64| edit(&file, |b| {
        let at = (offset + (row * per_row + 1) * 34) as usize;
        b[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    });
    let clean = std::fs::read(&file).unwrap();
    let mut m = open(&dir, Options::default());
    let reference = prompt_logits(&mut m, &o.prompt, false);
    damage(token);
    let e = m.eval(&o.prompt[..1]).expect_err("a damaged row read after the open").to_string();
    assert!(e.contains(name) && e.contains(&format!("row {token}, block 1")) && e.contains("NaN"), "{e}");
    let e = Model::open(&dir, &Options::default()).err().expect("a damaged row at open").to_string();
    assert!(e.contains(name) && e.contains(&format!("row {token}, block 1")), "{e}");
    std::fs::write(&file, &clean).unwrap();
    // Buffered reads where O_DIRECT is refused: the same bits.
    let got = prompt_logits(&mut open(&dir, Options { direct_io: false, ..Options::default() }), &o.prompt, false);
    assert!(bit_identical(&reference, &got));
}
