//! Helpers shared by the integration tests: fixture paths, reference files, comparisons.
#![allow(dead_code)]

pub mod cgroup;
pub mod freestanding;
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

/// A scratch directory unique to this test. The first call in a process also removes the
/// scratch directories of test processes that have exited, so runs do not fill the disk.
pub fn temp_dir(name: &str) -> PathBuf {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(sweep_stale_dirs);
    let d = std::env::temp_dir().join(format!("waste-test-{}-{name}", std::process::id()));
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
