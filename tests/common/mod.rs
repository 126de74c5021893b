//! Helpers shared by the integration tests: fixture paths, reference files, comparisons.
#![allow(dead_code)]

pub mod cgroup;
pub mod freestanding;
pub mod fuse;
pub mod server;

use std::path::{Path, PathBuf};
use waste::format::dtype::DType;
use waste::format::json::{self, Json};

/// `tests/fixtures/<rel>`.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(rel)
}

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A new scratch directory, unique to this call: the tests of many files share one process
/// (tests/suite.rs), so the process id alone would let two files' `temp_dir("model")` meet.
/// The first call in a process also removes the scratch directories of test processes that
/// have exited, so runs do not fill the disk.
pub fn temp_dir(name: &str) -> PathBuf {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SWEEP.call_once(sweep_stale_dirs);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("waste-test-{}-{call}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sweep_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("waste-test-").and_then(|r| r.split('-').next()).and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

pub fn read_json(path: &Path) -> Json {
    json::parse(&std::fs::read(path).unwrap()).unwrap()
}

pub fn ids_of(v: &Json) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Raw little-endian f32 values.
pub fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A little-endian f32 `.npy` array: (shape, values).
pub fn read_npy_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY");
    let (hlen, start) = if b[6] == 1 { (u16::from_le_bytes([b[8], b[9]]) as usize, 10) } else { (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12) };
    let header = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    assert!(header.contains("'<f4'") && header.contains("'fortran_order': False"), "{header}");
    let shape_txt = &header[header.find('(').unwrap() + 1..header.find(')').unwrap()];
    let shape = shape_txt.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().unwrap()).collect();
    let data = b[start + hlen..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    (shape, data)
}

/// Panics, naming the first offender, unless every value of `v` is finite. `f32::max` ignores
/// NaN, so a comparison that folds with it would let an all-NaN output pass: every helper
/// below checks first.
pub fn assert_finite(what: &str, v: &[f32]) {
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        let n = v.iter().filter(|x| !x.is_finite()).count();
        panic!("{what}: value {i} of {} is {} ({n} non-finite values)", v.len(), v[i]);
    }
}

/// max|a − b| / max|b|, after checking both sides are finite (a NaN or an infinity anywhere
/// fails the test rather than vanishing in the maximum).
pub fn rel_max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    assert_finite("engine output", a);
    assert_finite("reference", b);
    let max_ref = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let max_diff = a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    max_diff / max_ref
}

/// Runs the built `waste` binary with `args`; returns (status, stdout, stderr).
pub fn waste(args: &[&str]) -> (i32, String, String) {
    waste_stdin(args, None)
}

/// `waste run`'s stderr without the line that reports a budget the engine chose (issue 6; a
/// budget the user gave is not repeated): what is left is the summary.
pub fn summary(err: &str) -> String {
    match err.split_once('\n') {
        Some((first, rest)) if first.starts_with("[budget ") => rest.to_string(),
        _ => err.to_string(),
    }
}

/// Runs the binary with `stdin` piped in (or closed when `None`).
pub fn waste_stdin(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_waste"))
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Prints a SKIP line (counted by the Makefile's summary) and returns.
pub fn skip(test: &str, reason: &str) {
    println!("SKIP: {test}: {reason}");
    eprintln!("SKIP: {test}: {reason}");
}

/// An oracle fixture: model directory, prompt, greedy continuation and reference logits.
pub struct Oracle {
    pub dir: PathBuf,
    pub prompt: Vec<u32>,
    pub greedy: Vec<u32>,
    pub logits: Vec<f32>,
}

/// `tests/fixtures/oracles/<name>`.
pub fn oracle(name: &str) -> Oracle {
    let dir = fixture(&format!("oracles/{name}"));
    let ids = read_json(&dir.join("input_ids.json"));
    Oracle {
        prompt: ids_of(ids.get("prompt_ids").unwrap()),
        greedy: ids_of(ids.get("greedy_new_ids").unwrap()),
        logits: read_f32(&dir.join("logits.f32")),
        dir,
    }
}

/// Index of the largest value (the values must be finite: NaN compares false with
/// everything, so an all-NaN vector would otherwise answer 0).
pub fn argmax(v: &[f32]) -> u32 {
    assert_finite("argmax input", v);
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

/// What the tokenizer allowance may exceed the tables of the tokenizer file `file` by
/// (docs/MEMORY.md): 64 KiB plus 3.5 × the file for a rank file or tokenizer.json, 17 × for
/// llama2.c.
pub fn tokenizer_file_margin(file: &Path) -> u64 {
    let size = std::fs::metadata(file).unwrap().len();
    let twice_per_byte = if file.extension().is_some_and(|e| e == "bin") { 34 } else { 7 };
    (64 << 10) + twice_per_byte * size / 2
}

/// [`tokenizer_file_margin`] for the tokenizer of a model directory (0 without one).
pub fn tokenizer_margin(dir: &Path) -> u64 {
    waste::tokenizer::find_in_dir(dir).map_or(0, |f| tokenizer_file_margin(&f))
}

/// The plan's parts against what an open model measures, part by part: trunk, state, scratch
/// and expert cache exactly, the tokenizer at most its allowance and within its margin.
pub fn assert_plan_matches(plan: &waste::MemoryPlan, m: &waste::Model, what: &str) {
    let used = m.memory_use();
    let want = plan.expected_use(m.budget().expert_cache_bytes);
    assert_eq!(used.trunk, want.trunk, "trunk: {what}");
    assert_eq!(used.state, want.state, "state: {what}");
    assert_eq!(used.scratch, want.scratch, "scratch: {what}");
    assert_eq!(used.expert_cache, want.expert_cache, "expert cache: {what}");
    assert!(used.tokenizer <= want.tokenizer, "tokenizer {} over its allowance {}: {what}", used.tokenizer, want.tokenizer);
    let margin = tokenizer_margin(&plan.path);
    assert!(want.tokenizer - used.tokenizer <= margin, "tokenizer allowance {} - held {} > margin {margin}: {what}",
        want.tokenizer, used.tokenizer);
    assert_eq!(m.memory_used(), used.total());
    assert!(m.memory_used() <= m.budget().bytes, "over budget: {what}");
}

/// Logits of every position of `tokens` (tokens × vocab, row-major), collected from the
/// streaming [`waste::Model::eval_each`].
pub fn all_logits(m: &mut waste::Model, tokens: &[u32]) -> waste::Result<Vec<f32>> {
    let mut out = Vec::new();
    m.eval_each(tokens, |_, logits| {
        out.extend_from_slice(logits);
        Ok(())
    })?;
    Ok(out)
}

/// The hidden states of `tokens`, (layers + 2) × tokens × hidden (slot 0 the embeddings, slot
/// l the residual after layer l, the last the final normed state), collected from
/// [`waste::Model::hidden_states_each`].
pub fn hidden_states(m: &mut waste::Model, tokens: &[u32]) -> waste::Result<Vec<f32>> {
    let (slots, h, t) = (m.info().layers + 2, m.info().hidden, tokens.len());
    let mut out = vec![0.0f32; slots * t * h];
    m.hidden_states_each(tokens, |slot, first, rows| {
        let at = (slot * t + first) * h;
        out[at..at + rows.len()].copy_from_slice(rows);
        Ok(())
    })?;
    Ok(out)
}

/// Logits of every prompt position: in one call, or fed one token at a time.
pub fn prompt_logits(m: &mut waste::Model, prompt: &[u32], one_at_a_time: bool) -> Vec<f32> {
    if one_at_a_time {
        let mut out = Vec::new();
        for &t in prompt {
            out.extend_from_slice(m.eval(&[t]).unwrap());
        }
        out
    } else {
        all_logits(m, prompt).unwrap()
    }
}

/// Greedy continuation of `n` tokens after `prompt`.
pub fn greedy(m: &mut waste::Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut next = argmax(m.eval(prompt).unwrap());
    let mut got = vec![next];
    while got.len() < n {
        next = argmax(m.eval(&[next]).unwrap());
        got.push(next);
    }
    got
}

/// True when two logit vectors are the same bit for bit.
pub fn bit_identical(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A small xorshift generator: the tests need reproducible data, not good randomness.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [lo, hi] (integers).
    pub fn int(&mut self, lo: i32, hi: i32) -> i32 {
        lo + (self.next() % (hi - lo + 1) as u64) as i32
    }
    /// Roughly normal (sum of four uniforms), mean 0, standard deviation `sd`.
    pub fn normal(&mut self, sd: f32) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit() - 0.5).sum();
        s * sd * 3f32.sqrt()
    }
}

/// A random matrix of `dtype`: floats uniform in [-1, 1); quantized blocks with a random
/// binary16 scale of moderate size and random payload bytes (every nibble and byte value
/// occurs, -8 and -128 included).
pub fn random_matrix(dtype: DType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    match dtype {
        DType::F32 => (0..rows * cols).for_each(|_| out.extend_from_slice(&rng.f32().to_le_bytes())),
        DType::BF16 => (0..rows * cols).for_each(|_| out.extend_from_slice(&((rng.f32().to_bits() >> 16) as u16).to_le_bytes())),
        DType::F16 => (0..rows * cols).for_each(|_| out.extend_from_slice(&half::f16::from_f32(rng.f32()).to_bits().to_le_bytes())),
        DType::Q8B32 | DType::Q4B32 => {
            let payload = if dtype == DType::Q8B32 { 32 } else { 16 };
            for _ in 0..rows * cols / 32 {
                let scale = half::f16::from_f32(rng.f32().abs() * 0.05 + 1e-4);
                out.extend_from_slice(&scale.to_bits().to_le_bytes());
                (0..payload).for_each(|_| out.push(rng.byte()));
            }
        }
        _ => unreachable!(),
    }
    out
}

/// Writes `dir/config.json` and a `model.safetensors` holding `tensors` as zeros. The data is
/// a hole (`set_len`), so even a billion-parameter shape costs no disk and no time.
pub fn write_checkpoint(dir: &Path, config: &str, tensors: &[(String, DType, Vec<u64>)]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config).unwrap();
    let mut offset = 0u64;
    let mut members = Vec::new();
    for (name, dtype, shape) in tensors {
        let len = dtype.tensor_bytes(shape).unwrap();
        members.push((name.clone(), Json::object([
            ("dtype", Json::str(dtype.name())),
            ("shape", Json::Array(shape.iter().map(|&d| Json::uint(d)).collect())),
            ("data_offsets", Json::Array(vec![Json::uint(offset), Json::uint(offset + len)])),
        ])));
        offset += len;
    }
    let mut header = Json::Object(members).to_string_compact().into_bytes();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    let path = dir.join("model.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(bytes.len() as u64 + offset).unwrap();
}

/// `oracle(name)` converted to a container with f32 trunk and experts (bit-comparable with
/// the Hugging Face directory), in a temporary directory tagged `tag`.
pub fn float_container(name: &str, tag: &str) -> PathBuf {
    let o = oracle(name);
    let out = temp_dir(&format!("{name}-{tag}")).join("model.waste");
    let opts = waste::tools::convert::ConvertOptions { trunk: waste::tools::convert::Encoding::F32, experts: waste::tools::convert::Encoding::F32, ..waste::tools::convert::ConvertOptions::new(o.dir.join("model"), &out) };
    waste::tools::convert::convert(&opts, &mut |_| {}).unwrap();
    out
}

// ---------------------------------------------------------------------------------------------
// The oracle tests' shared checks: each family's test file states its fixtures and tolerance,
// these say what "matches" and "bit-identical" mean, once.

/// `Model::open(dir, opts)`, panicking with the directory and the error (a fixture that fails
/// to open names itself).
pub fn open_model(dir: &Path, opts: waste::Options) -> waste::Model {
    waste::Model::open(dir, &opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// [`open_model`] with the default options but for the compute threads and the prefill chunk.
pub fn open_model_threads(dir: &Path, threads: usize, prefill_chunk: usize) -> waste::Model {
    open_model(dir, waste::Options { threads, prefill_chunk, ..waste::Options::default() })
}

/// [`open_model_threads`] without the AMX tiles (`Options::tiles`): every product on the FMA
/// kernels, whose bits depend neither on the chunk nor on whether the weights are stored F32 or
/// BF16. Where the CPU has no tiles it is the same model as [`open_model_threads`]'s.
pub fn open_model_untiled(dir: &Path, threads: usize, prefill_chunk: usize) -> waste::Model {
    open_model(dir, waste::Options { threads, prefill_chunk, tiles: false, ..waste::Options::default() })
}

/// Panics unless `ours` is finite, as long as `reference` and within `tol` of it in
/// max|diff| / max|ref|; prints the figure either way. `name` is the fixture, `what` the
/// quantity (both are in every message).
pub fn assert_close(name: &str, what: &str, ours: &[f32], reference: &[f32], tol: f32) {
    assert_eq!(ours.len(), reference.len(), "{name}: {what}: length");
    assert_finite(&format!("{name}: {what}"), ours);
    let rel = rel_max_diff(ours, reference);
    println!("{name}: {what}: max|diff|/max|ref| = {rel:.3e}");
    assert!(rel <= tol, "{name}: {what}: {rel:.3e} > {tol:.0e}");
}

/// Per prompt position (rows of `vocab`), max|diff| / max|ref| with the whole reference's
/// scale, not the row's; both sides checked finite first (`f32::max` drops NaN, so a NaN row
/// would otherwise never be the worst). The largest is [`rel_max_diff`].
pub fn position_errors(ours: &[f32], reference: &[f32], vocab: usize) -> Vec<f32> {
    assert_finite("engine logits", ours);
    assert_finite("reference logits", reference);
    let max_ref = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    ours.chunks_exact(vocab).zip(reference.chunks_exact(vocab))
        .map(|(a, b)| a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / max_ref)
        .collect()
}

/// [`assert_close`] for the logits of every prompt position of `o`, saying which position is
/// worst (so a failure says where along the prompt the engine drifts); returns that error.
pub fn assert_logits_close_at_every_position(name: &str, ours: &[f32], o: &Oracle, vocab: usize, tol: f32) -> f32 {
    assert_eq!(ours.len(), o.logits.len(), "{name}: logits length");
    assert_finite(&format!("{name}: logits"), ours);
    let (at, worst) = position_errors(ours, &o.logits, vocab).into_iter().enumerate()
        .fold((0, 0.0f32), |(bt, bw), (t, e)| if e > bw { (t, e) } else { (bt, bw) });
    println!("{name}: logits max|diff|/max|ref| = {worst:.3e} over {} positions (worst at {at})", o.prompt.len());
    assert!(worst <= tol, "{name}: {worst:.3e} > {tol:.0e} at position {at}");
    worst
}

/// Every slot of the reference's `hidden_states.npy` (the embeddings, each layer's output, the
/// last one after the final norm) against ours for `o`'s prompt, run on `m` after a reset:
/// the shape, then each slot within `tol`. Ours has one slot more: the last layer before and
/// after the final norm.
pub fn assert_hidden_states_close(name: &str, m: &mut waste::Model, o: &Oracle, tol: f32) {
    let (shape, reference) = read_npy_f32(&o.dir.join("hidden_states.npy"));
    let (slots, t, h) = (shape[0], shape[1], shape[2]);
    assert_eq!((slots, t), (m.config().layers + 1, o.prompt.len()), "{name}: hidden_states shape");
    m.reset();
    let ours = hidden_states(m, &o.prompt).unwrap();
    assert_eq!(ours.len(), (slots + 1) * t * h, "{name}: hidden_states size");
    assert_finite(&format!("{name}: hidden states"), &ours);
    for s in 0..slots {
        let mine = if s + 1 == slots { slots } else { s };
        let rel = rel_max_diff(&ours[mine * t * h..(mine + 1) * t * h], &reference[s * t * h..(s + 1) * t * h]);
        assert!(rel <= tol, "{name}: hidden state slot {s} (after layer {}): {rel:.3e} > {tol:.0e}", s as i64 - 1);
    }
}

/// From the Hugging Face directory of oracle `name`: the prompt logits and every layer's
/// hidden state within `tol` on one thread, and the greedy continuation (KV cache on both
/// sides) on two.
pub fn assert_directory_matches_reference(name: &str, tol: f32) {
    let o = oracle(name);
    let dir = o.dir.join("model");
    let mut m = open_model_threads(&dir, 1, 32);
    assert_close(name, "prompt logits", &prompt_logits(&mut m, &o.prompt, false), &o.logits, tol);
    assert_hidden_states_close(name, &mut m, &o, tol);
    let got = greedy(&mut open_model_threads(&dir, 2, 32), &o.prompt, o.greedy.len());
    assert_eq!(got, o.greedy, "{name}: greedy continuation");
}

/// transformers' cached decode (`decode_logits.f32`: a prefill of meta.json's
/// `decode.prefill_len` tokens with the cache, then one token at a time) against ours fed
/// `o`'s prompt token by token from the start on `m`: every decoded row within `tol`.
pub fn assert_cached_decode_close(name: &str, m: &mut waste::Model, o: &Oracle, tol: f32) {
    let meta = read_json(&o.dir.join("meta.json"));
    let from = meta.get("decode").unwrap().get("prefill_len").unwrap().as_u64().unwrap() as usize;
    let reference = read_f32(&o.dir.join("decode_logits.f32"));
    let vocab = m.info().vocab;
    assert_eq!(reference.len(), (o.prompt.len() - from + 1) * vocab, "{name}");
    let mut ours = Vec::new();
    for (i, &t) in o.prompt.iter().enumerate() {
        let row = m.eval(&[t]).unwrap();
        if i + 1 >= from {
            ours.extend_from_slice(row);
        }
    }
    assert_close(name, &format!("cached decode rows {}..{}", from - 1, o.prompt.len() - 1), &ours, &reference, tol);
}

/// Chunking, threads and `reset` change no bit: `prompt`'s logits from `dir` with one thread
/// and a chunk of 32, again on the same model after `reset`, and with each of
/// `runs` (threads, prefill chunk, fed one token at a time) are the same bits — on the FMA
/// kernels. With the AMX tiles (the default where the CPU has them) the thread count and
/// `reset` still change no bit, but a chunk the tiles take adds its sums in another order than
/// a shorter chunk or one token: those runs agree within f32 rounding (2e-5 of the largest
/// logit, the oracle tolerance).
pub fn assert_chunking_threads_and_reset_bit_identical(name: &str, dir: &Path, prompt: &[u32], runs: &[(usize, usize, bool)]) {
    let mut m = open_model_untiled(dir, 1, 32);
    let base = prompt_logits(&mut m, prompt, false);
    m.reset();
    assert!(bit_identical(&base, &prompt_logits(&mut m, prompt, false)), "{name}: after reset");
    let mut t = open_model_threads(dir, 1, 32);
    let tiled = prompt_logits(&mut t, prompt, false);
    t.reset();
    assert!(bit_identical(&tiled, &prompt_logits(&mut t, prompt, false)), "{name}: after reset, tiles");
    for &(threads, chunk, single) in runs {
        let other = prompt_logits(&mut open_model_untiled(dir, threads, chunk), prompt, single);
        assert!(bit_identical(&base, &other), "{name}: threads {threads}, chunk {chunk}, single {single}");
        let other = prompt_logits(&mut open_model_threads(dir, threads, chunk), prompt, single);
        if chunk == 32 && !single {
            assert!(bit_identical(&tiled, &other), "{name}: threads {threads}, tiles");
        } else {
            let rel = rel_max_diff(&other, &tiled);
            assert!(rel <= 2e-5, "{name}: threads {threads}, chunk {chunk}, single {single}, tiles: {rel}");
        }
    }
}

/// The expert cache changes only when bytes move: `prompt`'s logits from the float container
/// `container` of `name` with the smallest cache, every expert cached, I/O threads, two
/// compute threads, and token by token with the look-ahead are all `want`'s bits (the HF
/// directory's), and every run went through the cache.
pub fn assert_cache_size_and_io_bit_identical(name: &str, container: &Path, prompt: &[u32], want: &[f32]) {
    use waste::Options;
    let manifest = waste::format::container::Manifest::open(container).unwrap();
    let smallest = waste::cache::min_cache_bytes(&manifest);
    // The look-ahead is on by default: the rows without it in the label run without it.
    let base = Options { threads: 1, io_threads: 0, lookahead: false, ..Options::default() };
    for (label, opts, single) in [
        ("smallest cache", Options { cache_bytes: smallest, ..base.clone() }, false),
        ("every expert cached", Options { cache_bytes: manifest.expert_bytes(), ..base.clone() }, false),
        ("io threads, smallest cache", Options { io_threads: 3, cache_bytes: smallest, ..base.clone() }, false),
        ("2 compute threads", Options { threads: 2, io_threads: 2, ..base.clone() }, false),
        ("token at a time, smallest cache, look-ahead", Options { cache_bytes: smallest, io_threads: 2, lookahead: true, ..base.clone() }, true),
    ] {
        let mut m = open_model(container, opts);
        let got = prompt_logits(&mut m, prompt, single);
        assert!(bit_identical(want, &got), "{name}: {label}");
        let s = m.cache_stats().unwrap();
        assert!(s.hits + s.misses > 0, "{name}: {label}: {s:?}");
    }
}

/// The plan `waste::plan_memory` makes from `dir`'s headers with `opts`, and the model opened
/// with them, checked part by part by [`assert_plan_matches`]; with the label the caller's own
/// checks name (`dir` with `opts`).
pub fn plan_and_open(dir: &Path, opts: &waste::Options) -> (waste::MemoryPlan, waste::Model, String) {
    let plan = waste::plan_memory(dir, opts).unwrap();
    let m = waste::Model::open(dir, opts).unwrap();
    let what = format!("{} with {opts:?}", dir.display());
    assert_plan_matches(&plan, &m, &what);
    (plan, m, what)
}

/// The plan equals what `Model::open` holds for oracle `name`, from its HF directory and from
/// an f32 container, each with the defaults, a 7-token context on 3 threads in chunks of 5,
/// and a 33-token context token by token with int8 activations: [`plan_and_open`], then the
/// trunk (the weights but a container's expert cache slots), state, scratch and `memory_used`
/// against the model's info; then `state(plan, model, what)`, the family's own state formula.
pub fn assert_plan_equals_memory_used(name: &str, state: impl Fn(&waste::MemoryPlan, &waste::Model, &str)) {
    use waste::Options;
    let option_sets = [
        Options::default(),
        Options { ctx: 7, threads: 3, prefill_chunk: 5, ..Options::default() },
        Options { ctx: 33, threads: 1, prefill_chunk: 1, activations: waste::Activations::Int8, ..Options::default() },
        Options { ctx: 33, threads: 2, prefill_chunk: 3, activations: waste::Activations::Int16, ..Options::default() },
    ];
    let hf = oracle(name).dir.join("model");
    let container = float_container(name, "plan");
    for dir in [&hf, &container] {
        for opts in &option_sets {
            let (plan, m, what) = plan_and_open(dir, opts);
            let info = m.info();
            // A container's weights also count the expert cache's slots.
            let cache = if dir == &container { m.budget().expert_cache_bytes } else { 0 };
            assert_eq!(info.weight_bytes, plan.trunk_bytes + cache, "trunk: {what}");
            assert_eq!((plan.state_bytes, plan.scratch_bytes), (info.kv_bytes, info.scratch_bytes), "state/scratch: {what}");
            state(&plan, &m, &what);
            assert_eq!(m.memory_used(), plan.resident_bytes() + cache, "memory_used: {what}");
        }
    }
    let _ = std::fs::remove_dir_all(container.parent().unwrap());
}

/// An f32 container of oracle `name` whose routed experts stream through the smallest expert
/// cache (under half of the experts): one bank per MoE layer, the HF directory's config, the
/// reference logits within `tol` and the HF directory's bits, fewer cache slots than experts
/// with misses, the reference's greedy tokens after a reset. Returns the container and its
/// manifest for the family's own checks; the caller removes the container's directory.
pub fn assert_float_container_close_with_smallest_cache(name: &str, tol: f32) -> (PathBuf, waste::format::container::Manifest) {
    let o = oracle(name);
    let out = float_container(name, "container");
    let manifest = waste::format::container::Manifest::open(&out).unwrap();
    let from_dir = open_model_threads(&o.dir.join("model"), 1, 32);
    let cfg = from_dir.config().clone();
    let moe_layers: Vec<usize> = (0..cfg.layers).filter(|&l| cfg.is_moe_layer(l)).collect();
    assert_eq!(manifest.banks.iter().map(|b| b.layer).collect::<Vec<_>>(), moe_layers, "{name}: one bank per MoE layer");
    let smallest = waste::cache::min_cache_bytes(&manifest);
    assert!(smallest < manifest.expert_bytes() / 2, "{name}: the smallest cache holds most experts");
    let mut container = open_model(&out, waste::Options { threads: 1, cache_bytes: smallest, ..waste::Options::default() });
    assert_eq!(container.config(), &cfg, "{name}: the container's config");
    let ours = prompt_logits(&mut container, &o.prompt, false);
    assert_close(name, "container prompt logits", &ours, &o.logits, tol);
    let stats = container.cache_stats().expect("experts should stream through the cache").clone();
    let experts = manifest.banks.len() * cfg.moe.as_ref().unwrap().experts;
    assert!(stats.misses > 0 && stats.slots < experts, "{name}: {stats:?}");
    // The directory's BF16 weights, on the FMA kernels (no tiles), give the f32 container's bits.
    let hf = prompt_logits(&mut open_model_untiled(&o.dir.join("model"), 1, 32), &o.prompt, false);
    assert!(bit_identical(&ours, &hf), "{name}: f32 container and HF directory differ");
    container.reset();
    assert_eq!(greedy(&mut container, &o.prompt, o.greedy.len()), o.greedy, "{name}: container greedy");
    (out, manifest)
}

// ---------------------------------------------------------------------------------------------
// The kernel tests' shared checks.

/// y = W·x for `n` vectors in one `Kernels::rows` call over every row of `w`; the output
/// starts as NaN, so a row the kernel leaves unwritten shows.
pub fn kernel_product(k: &waste::kernels::Kernels, w: waste::kernels::MatRef, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * w.rows];
    k.rows(w, 0, w.rows, x, n, &mut y, w.rows);
    y
}

/// A (row, vector) result of `k` is the same whatever else the call computes: each of the `n`
/// vectors of `x` alone, the first 2, 3 and 5 together (prefill chunks), and the rows split
/// into two calls at rows 1, 2, 3, 5, 6 and 10 (how threads split a product) give the values
/// of the one call over everything, compared by `same`. `what` names the kernel and matrix.
///
/// On the AMX tiles (groups of at least `TILE_MIN_VECTORS` of 128 vectors) a vector's bits
/// depend on whether its group reaches the threshold: a vector whose group does in the whole
/// call but not in a smaller one is compared with the AVX-512 kernels' bits instead, and the
/// first 20 and 33 vectors (groups the tiles take) with the whole call's.
pub fn assert_independent_of_vector_count_and_row_range(k: &waste::kernels::Kernels, w: waste::kernels::MatRef, x: &[f32], n: usize,
    what: &str, same: fn(&[f32], &[f32]) -> bool) {
    use waste::kernels::{Isa, Kernels, SPLIT_VECTORS, TILE_MIN_VECTORS};
    let (rows, cols) = (w.rows, w.cols);
    let whole = kernel_product(k, w, x, n);
    let tiles = k.tiles_take(&w, TILE_MIN_VECTORS);
    let tiled = |m: usize, t: usize| tiles && SPLIT_VECTORS.min(m - t / SPLIT_VECTORS * SPLIT_VECTORS) >= TILE_MIN_VECTORS;
    let plain = if tiles { kernel_product(&Kernels::with_isa(Isa::Avx512).expect("AMX implies AVX-512"), w, x, n) } else { whole.clone() };
    // What vector t of a call of the first m vectors should give.
    let want = |m: usize, t: usize| if tiled(n, t) == tiled(m, t) { &whole[t * rows..(t + 1) * rows] } else { &plain[t * rows..(t + 1) * rows] };
    for t in 0..n {
        let one = kernel_product(k, w, &x[t * cols..(t + 1) * cols], 1);
        assert!(same(&one, want(1, t)), "{what}: vector {t} alone differs");
    }
    for m in [2, 3, 5, 20, 33].into_iter().filter(|&m| m <= n) {
        let got = kernel_product(k, w, &x[..m * cols], m);
        let want: Vec<f32> = (0..m).flat_map(|t| want(m, t).iter().copied()).collect();
        assert!(same(&got, &want), "{what}: first {m} vectors differ");
    }
    for split in [1, 2, 3, 5, 6, 10] {
        let mut y = vec![f32::NAN; n * rows];
        k.rows(w, 0, split, x, n, &mut y, rows);
        k.rows(w, split, rows, x, n, &mut y, rows);
        assert!(same(&y, &whole), "{what}: split at row {split} differs");
    }
}
