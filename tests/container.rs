//! The container and the expert cache: converted models match the reference; how and when
//! expert bytes move (cache size, I/O threads, compute threads) never changes the logits;
//! damaged containers are refused naming the layer and expert; an interrupted conversion
//! resumes to byte-identical output.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use waste::format::convert::{convert, ConvertOptions, Encoding};
use waste::{ErrorKind, Model, Options};

const MOE: [&str; 3] = ["mixtral_f32", "qwen3_moe_f32", "olmoe_f32"];

fn float_container(name: &str, tag: &str) -> PathBuf {
    let o = oracle(name);
    let out = temp_dir(&format!("{name}-{tag}")).join("model.waste");
    let opts = ConvertOptions { trunk: Encoding::F32, experts: Encoding::F32, ..ConvertOptions::new(o.dir.join("model"), &out) };
    convert(&opts, &mut |_| {}).unwrap();
    out
}

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
        let base = Options { threads: 1, io_threads: 0, ..Options::default() };
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
        ] {
            let mut m = open(&dir, opts);
            let got = prompt_logits(&mut m, &o.prompt, single);
            assert!(bit_identical(&reference, &got), "{name}: {label}");
            let s = m.cache_stats().unwrap();
            assert!(s.hits + s.misses > 0 && s.bytes_read > 0, "{name}: {label}: {s:?}");
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
    let mut m = open(&dir, Options { cache_bytes: smallest, ..Options::default() });
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
    let err = convert(&ConvertOptions::new(o.dir.join("model"), &out), &mut |_| {}).unwrap_err();
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
}
