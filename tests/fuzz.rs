//! The fuzzer's targets (issue 16): one per parser the crate has — JSON, safetensors header
//! and body, a quantized checkpoint's metadata, config.json, tokenizer.json, tiktoken rank
//! files, llama2.c tok*.bin, the container manifest, expert banks (read by a generation),
//! session state files, chat templates (parsed and rendered), HTTP requests (to a running
//! `waste serve`), CLI argument vectors (to the binary), the learned hotlist's usage file,
//! routing traces (loaded and replayed), and FP8 (block-scaled e4m3) and MXFP4 checkpoints
//! opened and evaluated. The engine is tests/fuzz/engine.rs.
//!
//! `cargo test --test fuzz` runs each target for a few seconds (`make test`); `FUZZ_SECONDS=N`
//! runs each for N seconds (`make fuzz`). Each prints its executions; a finding (a panic, a
//! hang, memory past the bound, an error that does not name its file) fails the test with the
//! input saved under target/fuzz/TARGET/; fixed ones are kept in tests/fixtures/fuzz/TARGET/.

mod common;
mod fuzz {
    pub mod engine;
}

use common::*;
use fuzz::engine::{self, names_file, Outcome, Report, Shape};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use waste::format::json::{self, Json};

/// Seconds per target in the short pass.
const SHORT: f64 = 3.0;

/// What one input may take on the heap while it is parsed: the default parse limit (no
/// budget is given here) and room for what is built from the parse.
const HEAP_BOUND: u64 = json::DEFAULT_MAX_BYTES + (64 << 20);

// The heap of this thread, counted: each target runs on its own test thread.
struct Counting;

thread_local! {
    static LIVE: Cell<u64> = const { Cell::new(0) };
    static PEAK: Cell<u64> = const { Cell::new(0) };
}

fn grew(n: usize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get() + n as u64;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

fn shrank(n: usize) {
    let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(n as u64)));
}

// SAFETY: every call forwards to the system allocator; the counters are plain thread-locals
// without destructors, so counting allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as given.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        shrank(l.size());
        // SAFETY: forwarded as given.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: forwarded as given.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            shrank(l.size());
            grew(new);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f`, returning its result and the peak heap it added on this thread.
fn measured<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let r = f();
    (r, PEAK.with(Cell::get) - start)
}

/// A parser target: the outcome of `f` (Ok, or an error that must name `file`), with the heap
/// it took checked against [`HEAP_BOUND`].
fn parsed<T>(file: &Path, f: impl FnOnce() -> waste::Result<T>) -> (Outcome, u64, bool) {
    let (r, peak) = measured(f);
    let outcome = match &r {
        Ok(_) => Ok(()),
        Err(e) => names_file(&e.to_string(), file),
    };
    let outcome = outcome.and_then(|()| if peak > HEAP_BOUND { Err(format!("took {peak} bytes of heap, over {HEAP_BOUND}")) } else { Ok(()) });
    (outcome, peak, r.is_err())
}

fn finish(r: Report) {
    let found: Vec<String> = r.findings.iter().map(|f| format!("{} ({})", f.what, f.saved.display())).collect();
    assert!(found.is_empty(), "fuzz {}: {} findings:\n{}", r.target, found.len(), found.join("\n"));
}

fn read(p: impl AsRef<Path>) -> Vec<u8> {
    std::fs::read(p.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", p.as_ref().display()))
}

fn stories() -> PathBuf {
    root().join("models/stories260K")
}

fn config_seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![read(stories().join("config.json"))];
    if let Ok(entries) = std::fs::read_dir(fixture("oracles")) {
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("model/config.json")).filter(|p| p.is_file()).collect();
        dirs.sort();
        seeds.extend(dirs.iter().take(12).map(read));
        // The families whose readers came later (config_glm.rs, config_gptoss.rs) and the
        // quantized checkpoints' `quantization_config` (FP8 blocks, MXFP4), past the first 12.
        let later = |p: &&PathBuf| p.parent().and_then(|m| m.parent()).and_then(|d| d.file_name()).is_some_and(|n| {
            let n = n.to_string_lossy();
            n.starts_with("glm4_moe_") || n.starts_with("gpt_oss_") || n.ends_with("_fp8")
        });
        seeds.extend(dirs.iter().skip(12).filter(later).map(read));
    }
    seeds
}

fn hf_tokenizer_seeds() -> Vec<Vec<u8>> {
    ["gpt2", "llama2", "llama2_metaspace", "llama3", "qwen2", "smollm2"].iter()
        .map(|n| read(fixture(&format!("tokenizers/hf/{n}.json")))).collect()
}

#[test]
fn fuzz_json() {
    let mut seeds = config_seeds();
    seeds.extend(hf_tokenizer_seeds().into_iter().take(2));
    seeds.push(br#"{"a": [1, -2.5e10, "x\u00e9\ud83d\ude00", true, false, null, {}], "b": {"c": []}}"#.to_vec());
    let limits = json::Limits { max_bytes: 64 << 20, ..json::Limits::default() };
    finish(engine::run("json", seeds, Shape::Json, engine::seconds(SHORT), |input| {
        let (r, peak) = measured(|| json::parse_limited(input, &limits).map(|v| v.to_string_compact().len()));
        let bound = limits.max_bytes + (1 << 20);
        let outcome = if peak > bound { Err(format!("took {peak} bytes, over the limit {bound}")) } else { Ok(()) };
        (outcome, peak, r.is_err())
    }));
}

/// Opens a safetensors file and reads every tensor's bytes.
fn open_and_read(path: &Path) -> waste::Result<u64> {
    let st = waste::format::safetensors::SafeTensors::open(path)?;
    let mut total = 0;
    for t in &st.tensors {
        let mut buf = vec![0u8; t.len as usize];
        st.read_into(t, &mut buf)?;
        total += t.len;
    }
    Ok(total)
}

fn safetensors_target(name: &'static str, seeds: Vec<Vec<u8>>) {
    let dir = temp_dir(&format!("fuzz-{name}"));
    let path = dir.join("model.safetensors");
    finish(engine::run(name, seeds, Shape::Binary, engine::seconds(SHORT), |input| {
        std::fs::write(&path, input).unwrap();
        parsed(&path, || open_and_read(&path))
    }));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fuzz_safetensors() {
    let mut seeds = vec![read(stories().join("model.safetensors"))];
    // A small header-heavy file: several tensors, metadata.
    let header = br#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"c":{"dtype":"I64","shape":[],"data_offsets":[22,30]}}"#;
    let mut small = (header.len() as u64).to_le_bytes().to_vec();
    small.extend_from_slice(header);
    small.extend(std::iter::repeat_n(7u8, 30));
    seeds.push(small);
    safetensors_target("safetensors", seeds);
}

#[test]
fn fuzz_quantized_checkpoint() {
    // stories260K's 172-wide FFN has no whole blocks: a random model with 32-aligned shapes.
    let out = temp_dir("fuzz-quant-seed");
    let cfg = out.join("config.json");
    std::fs::write(&cfg, r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 96,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 64}"#).unwrap();
    let float = out.join("f");
    let (code, _, err) = waste(&["random-model", "--config", cfg.to_str().unwrap(), "--out", float.to_str().unwrap(), "--dtype", "f32"]);
    assert_eq!(code, 0, "{err}");
    for bits in ["4", "8"] {
        let o = out.join(bits);
        let (code, _, err) = waste(&["quantize", "--bits", bits, "--in", float.to_str().unwrap(), "--out", o.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
    }
    safetensors_target("quantized", vec![read(out.join("4/model.safetensors")), read(out.join("8/model.safetensors"))]);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn fuzz_config() {
    let dir = temp_dir("fuzz-config");
    let path = dir.join("config.json");
    finish(engine::run("config", config_seeds(), Shape::Json, engine::seconds(SHORT), |input| {
        std::fs::write(&path, input).unwrap();
        parsed(&path, || waste::format::config::ModelConfig::load(&dir))
    }));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Loads a tokenizer file and round-trips a text through it.
fn tokenizer_target(name: &'static str, file: &str, seeds: Vec<Vec<u8>>, shape: Shape) {
    let dir = temp_dir(&format!("fuzz-{name}"));
    let path = dir.join(file);
    finish(engine::run(name, seeds, shape, engine::seconds(SHORT), |input| {
        std::fs::write(&path, input).unwrap();
        parsed(&path, || {
            let t = waste::tokenizer::Tokenizer::from_file(&path)?;
            let ids = t.tokenize("Hello world, 123 ünïcode — <s>\n\tend");
            let _ = t.tokenize_markup("<|im_start|>user\nhi<|im_end|>");
            for &id in ids.iter().take(64) {
                let _ = t.token_bytes(id);
            }
            Ok(ids.len())
        })
    }));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fuzz_tokenizer_json() {
    tokenizer_target("tokenizer_json", "tokenizer.json", hf_tokenizer_seeds(), Shape::Json);
}

#[test]
fn fuzz_tiktoken() {
    // Whole files: the encoding (and its pre-tokenizer) is known by its rank count.
    let seeds = vec![read(fixture("tokenizers/r50k_base.tiktoken"))];
    tokenizer_target("tiktoken", "r50k_base.tiktoken", seeds, Shape::Text);
}

#[test]
fn fuzz_llama2c_tokenizer() {
    tokenizer_target("llama2c", "tok512.bin", vec![read(stories().join("tok512.bin"))], Shape::Binary);
}

/// A tiny random MoE container (one layer of 4 q4 experts, top-2) made by the CLI.
fn tiny_container(tag: &str) -> PathBuf {
    let dir = temp_dir(tag);
    let cfg = dir.join("config.json");
    std::fs::write(&cfg, r#"{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true, "vocab_size": 96,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 64}"#).unwrap();
    let out = dir.join("moe.waste");
    let (code, _, err) = waste(&["random-model", "--config", cfg.to_str().unwrap(), "--out", out.to_str().unwrap(), "--container", "--experts", "q4"]);
    assert_eq!(code, 0, "{err}");
    out
}

#[test]
fn fuzz_manifest() {
    let dir = tiny_container("fuzz-manifest");
    let path = dir.join("manifest.json");
    let seed = read(&path);
    finish(engine::run("manifest", vec![seed], Shape::Json, engine::seconds(SHORT), |input| {
        std::fs::write(&path, input).unwrap();
        // Its errors name the manifest or a file it lists, all in the container directory.
        parsed(&dir, || waste::format::container::Manifest::open(&dir))
    }));
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn fuzz_expert_banks() {
    let dir = tiny_container("fuzz-banks");
    let mut banks: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().contains("expert"))).collect();
    banks.sort();
    assert!(!banks.is_empty(), "no bank file in {}", dir.display());
    let bank = banks[0].clone();
    let seed = read(&bank);
    let seed_len = seed.len();
    let mut n = 0u64;
    // One compute thread: a pool waiting on a loaded machine would dominate each execution.
    let opts = waste::Options { verify: false, threads: 1, ..waste::Options::default() };
    finish(engine::run("expert_banks", vec![seed], Shape::Binary, engine::seconds(SHORT), |input| {
        // Three inputs in four keep the bank's size, so they pass the manifest's size check and
        // reach the records.
        n += 1;
        let mut bytes = input.to_vec();
        if !n.is_multiple_of(4) {
            bytes.resize(seed_len, 0);
        }
        std::fs::write(&bank, &bytes).unwrap();
        // A generation reads the experts: a bad record is an error naming the bank's layer.
        let (r, peak) = measured(|| -> waste::Result<usize> {
            let mut m = waste::Model::open(&dir, &opts)?;
            let logits = m.eval(&[1, 5, 9, 17, 33])?;
            Ok(logits.len())
        });
        (Ok(()), peak, r.is_err())
    }));
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn fuzz_state_files() {
    let dir = temp_dir("fuzz-state");
    let path = dir.join("s.state");
    let mut model = waste::Model::open(stories(), &waste::Options { threads: 1, ..waste::Options::default() }).unwrap();
    model.eval(&[1, 403, 407, 261, 378]).unwrap();
    model.session().save_state(&path).unwrap();
    let seed = read(&path);
    finish(engine::run("state", vec![seed], Shape::Binary, engine::seconds(SHORT), |input| {
        std::fs::write(&path, input).unwrap();
        let out = parsed(&path, || model.session_mut().load_state(&path));
        // The model stays usable whatever was loaded.
        model.session_mut().reset();
        if let Err(e) = model.eval(&[1, 403]) {
            return (Err(format!("the model is not usable after the load: {e}")), out.1, out.2);
        }
        out
    }));
    let _ = std::fs::remove_dir_all(&dir);
}

fn template_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for set in ["chat_templates", "chat_templates_extra"] {
        let Ok(entries) = std::fs::read_dir(fixture(set)) else { continue };
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        dirs.sort();
        for d in dirs {
            if let Ok(Some(t)) = waste::template::ChatTemplate::from_model_dir(&d, None) {
                seeds.push(t.source().as_bytes().to_vec());
            }
        }
    }
    assert!(seeds.len() >= 5, "only {} chat template seeds", seeds.len());
    seeds
}

#[test]
fn fuzz_chat_templates() {
    let messages = json::parse(br#"[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}]"#).unwrap();
    let opts = waste::template::RenderOptions { add_generation_prompt: true, ..Default::default() };
    let specials = vec![("bos_token".to_string(), "<s>".to_string()), ("eos_token".to_string(), "</s>".to_string())];
    finish(engine::run("chat_template", template_seeds(), Shape::Text, engine::seconds(SHORT), |input| {
        let source = String::from_utf8_lossy(input);
        let (r, peak) = measured(|| -> waste::Result<usize> {
            let t = waste::template::ChatTemplate::parse("fuzz.jinja", &source, specials.clone())?;
            Ok(t.render_text(&messages, &opts)?.len())
        });
        let outcome = if peak > HEAP_BOUND { Err(format!("took {peak} bytes of heap")) } else { Ok(()) };
        (outcome, peak, r.is_err())
    }));
}

fn request(method: &str, path: &str, body: &str) -> Vec<u8> {
    format!("{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

#[test]
fn fuzz_http_requests() {
    use std::io::{Read, Write};
    let model = server::chat_model("fuzz-http");
    let srv = server::Server::start(&model, &["--max-body", "1M"]);
    let seeds = vec![
        request("GET", "/v1/models", ""),
        request("GET", "/health", ""),
        request("POST", "/v1/chat/completions", r#"{"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}"#),
        request("POST", "/v1/completions", r#"{"prompt": "Once upon", "max_tokens": 2, "stream": true, "logprobs": 2}"#),
        request("POST", "/v1/chat/completions", r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}], "max_tokens": 1, "stop": ["x"], "seed": 3}"#),
    ];
    let addr = srv.addr.clone();
    let pid = srv.pid();
    finish(engine::run("http", seeds, Shape::Json, engine::seconds(SHORT), |input| {
        let mut s = match std::net::TcpStream::connect(&addr) {
            Ok(s) => s,
            Err(e) => return (Err(format!("the server no longer accepts connections: {e}")), 0, false),
        };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(15)));
        let _ = s.write_all(input);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp);
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return (Err("the server exited".into()), 0, false);
        }
        let ok = resp.is_empty() || resp.starts_with(b"HTTP/1.1 ");
        let error = !resp.starts_with(b"HTTP/1.1 2");
        (if ok { Ok(()) } else { Err(format!("not an HTTP response: {:?}", String::from_utf8_lossy(&resp[..resp.len().min(80)]))) }, 0, error)
    }));
    let (code, log) = srv.stop();
    assert!(!log.contains("panicked"), "the server panicked (exit {code}): {log}");
    let _ = std::fs::remove_dir_all(model.parent().unwrap());
}

#[test]
fn fuzz_cli_arguments() {
    let dir = temp_dir("fuzz-cli");
    for f in ["config.json", "model.safetensors", "tok512.bin"] {
        std::fs::create_dir_all(dir.join("m")).unwrap();
        std::fs::copy(stories().join(f), dir.join("m").join(f)).unwrap();
    }
    std::fs::write(dir.join("msgs.json"), r#"[{"role": "user", "content": "Hi"}]"#).unwrap();
    // A private copy of the binary: a long run spawns it hundreds of times a second, and a
    // child started while cargo rewrites target/release/waste dies of a signal (the one
    // finding of the 2026-12-02 evening run, docs/RELIABILITY.md).
    let bin = dir.join("waste-under-test");
    std::fs::copy(env!("CARGO_BIN_EXE_waste"), &bin).unwrap();
    let argv = |a: &[&str]| a.join("\0").into_bytes();
    let seeds = vec![
        argv(&["run", "m", "Once upon a time", "-n", "4", "--temp", "0.5", "--seed", "3", "--budget", "8M"]),
        argv(&["info", "m", "--json"]),
        argv(&["plan", "m", "--budget", "64M", "--ctx", "64", "--sessions", "2"]),
        argv(&["tokenize", "m", "--json", "Hello there"]),
        argv(&["detokenize", "m", "1", "403", "407"]),
        argv(&["eval", "m", "--ids", "1,2,3", "--ctx", "16"]),
        argv(&["template", "--template-file", "msgs.json", "--messages", "msgs.json"]),
        argv(&["run", "m", "-", "-n", "2", "--top-p", "0.9", "--top-k", "5", "--threads", "1", "--chunk", "4"]),
    ];
    // Commands that write or serve are kept out: a mutated argument vector could otherwise
    // write outside the scratch directory or listen forever.
    let allowed = ["run", "info", "plan", "tokenize", "detokenize", "eval", "template", "version", "help", "--help"];
    finish(engine::run("cli", seeds, Shape::Text, engine::seconds(SHORT), |input| {
        let mut args: Vec<std::ffi::OsString> = input.split(|&b| b == 0)
            .map(std::os::unix::ffi::OsStrExt::from_bytes).map(|s: &std::ffi::OsStr| s.to_os_string()).collect();
        if !args.first().and_then(|a| a.to_str()).is_some_and(|a| allowed.contains(&a)) {
            return (Ok(()), 0, true);
        }
        if args.iter().any(|a| a.as_encoded_bytes().starts_with(b"/") || a.as_encoded_bytes().windows(2).any(|w| w == b"..")
            || a.as_encoded_bytes().starts_with(b"--out") || a.as_encoded_bytes().starts_with(b"--state")) {
            args.clear();
            args.push("version".into());
        }
        let mut child = std::process::Command::new(&bin).args(&args).current_dir(&dir)
            .stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped())
            .spawn().unwrap();
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if started.elapsed().as_secs() >= 10 {
                // A long generation is not a hang of the parser: stopped, not a finding.
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
        let Some(status) = status else { return (Ok(()), 0, false) };
        let outcome = if err.contains("panicked") || status.code() == Some(101) {
            Err(format!("panic: {err}"))
        } else if status.code().is_none() {
            Err(format!("killed by a signal: {status:?}: {err}"))
        } else {
            Ok(())
        };
        (outcome, 0, !status.success())
    }));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Which part of a checkpoint directory a target mutates.
#[derive(Clone, Copy)]
enum Part {
    /// `config.json` (its `quantization_config` among the rest).
    Config,
    /// The safetensors header's JSON text: the file is rebuilt around it with the original
    /// tensor bytes, so JSON-aware edits reach dtypes, shapes and offsets.
    Header,
    /// The whole `model.safetensors`, binary edits (codes, scales, length fields).
    File,
}

/// Splits a safetensors file into its header text and its tensor bytes.
fn split_safetensors(bytes: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (bytes[8..8 + n].to_vec(), bytes[8 + n..].to_vec())
}

/// A Hugging Face checkpoint fixture copied to a scratch directory, one part of it mutated,
/// then opened (`Model::open`: the FP8 / MXFP4 decoding happens there) and evaluated on a few
/// tokens. An error must name the file (any path in the scratch directory names it).
fn checkpoint_target(name: &'static str, fixture_dir: &str, part: Part) {
    let src = fixture(fixture_dir);
    let dir = temp_dir(&format!("fuzz-{name}"));
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let weights = read(src.join("model.safetensors"));
    let (header, body) = split_safetensors(&weights);
    let (seed, shape, file) = match part {
        Part::Config => (read(src.join("config.json")), Shape::Json, "config.json"),
        Part::Header => (header, Shape::Json, "model.safetensors"),
        Part::File => (weights, Shape::Binary, "model.safetensors"),
    };
    let path = dir.join(file);
    let opts = waste::Options { threads: 1, ..waste::Options::default() };
    finish(engine::run(name, vec![seed], shape, engine::seconds(SHORT), |input| {
        match part {
            Part::Header => {
                let mut bytes = (input.len() as u64).to_le_bytes().to_vec();
                bytes.extend_from_slice(input);
                bytes.extend_from_slice(&body);
                std::fs::write(&path, bytes).unwrap();
            }
            Part::Config | Part::File => std::fs::write(&path, input).unwrap(),
        }
        parsed(&dir, || {
            let mut m = waste::Model::open(&dir, &opts)?;
            // No more tokens than the context a mutated `max_position_embeddings` allows: a
            // request past it is refused for the request, not for the file.
            let n = m.context().min(3);
            Ok(if n == 0 { 0 } else { m.eval(&[0, 33, 71][..n])?.len() })
        })
    }));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fuzz_fp8_config() {
    checkpoint_target("fp8_config", "oracles/deepseek_v3_fp8/model", Part::Config);
}

#[test]
fn fuzz_fp8_header() {
    checkpoint_target("fp8_header", "oracles/deepseek_v3_fp8/model", Part::Header);
}

#[test]
fn fuzz_fp8_file() {
    checkpoint_target("fp8_file", "oracles/deepseek_v3_fp8/model", Part::File);
}

#[test]
fn fuzz_mxfp4_header() {
    checkpoint_target("mxfp4_header", "oracles/gpt_oss_mxfp4/model", Part::Header);
}

#[test]
fn fuzz_mxfp4_file() {
    checkpoint_target("mxfp4_file", "oracles/gpt_oss_mxfp4/model", Part::File);
}

/// The learned hotlist's file (`usage.waste`): `Usage::read` for the model the seed was
/// written for. The seed is a file `Model::write_usage` wrote for a random 2-layer, 4-expert
/// container (kept in tests/fixtures/fuzz/usage/, so it also runs first); its identity and
/// shape are the ones the reader is asked for, so mutants get past the size check and reach
/// the magic, CRC, identity and shape checks.
#[test]
fn fuzz_usage() {
    use waste::cache::usage::Usage;
    let seed = read(fixture("fuzz/usage/written-by-write_usage.waste"));
    let identity: [u8; 32] = seed[8..40].try_into().unwrap();
    let layers = u32::from_le_bytes(seed[40..44].try_into().unwrap()) as usize;
    let experts = u32::from_le_bytes(seed[44..48].try_into().unwrap()) as usize;
    assert_eq!(seed.len() as u64, Usage::file_bytes(layers, experts), "the seed's size");
    // More valid files of the same model: counts at the extremes.
    let mut hot = Usage::new(layers, experts);
    hot.tokens = u64::MAX;
    hot.counts.iter_mut().enumerate().for_each(|(k, c)| *c = if k % 2 == 0 { u32::MAX } else { 0 });
    let seeds = vec![seed, hot.encode(&identity), Usage::new(layers, experts).encode(&identity)];
    let dir = temp_dir("fuzz-usage");
    let path = dir.join(waste::cache::usage::FILE_NAME);
    let mut n = 0u64;
    finish(engine::run("usage", seeds, Shape::Binary, engine::seconds(SHORT), |input| {
        // Every other input gets its CRC-32 made right, so its edits reach the identity,
        // shape and count checks behind it.
        n += 1;
        let mut bytes = input.to_vec();
        if n.is_multiple_of(2) && bytes.len() >= 4 {
            let body = bytes.len() - 4;
            let crc = waste::format::crc32::crc32(&bytes[..body]);
            bytes[body..].copy_from_slice(&crc.to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        parsed(&path, || {
            let u = Usage::read(&path, &identity, layers, experts)?;
            // What the cache does with a file it accepted.
            Ok(u.map_or(0, |u| u.ranked().len()))
        })
    }));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Routing traces (`waste bench cache --trace`, `--route-trace`): `Trace::load`, then what the
/// replay does with a trace it accepted — the default policy at two cache sizes and Belady's
/// optimum. Seeds: the first tokens of both shared traces.
#[test]
fn fuzz_routing_trace() {
    use waste::cache::{policy::Policy, replay};
    let first_lines = |name: &str, n: usize| -> Vec<u8> {
        let text = String::from_utf8(read(fixture(&format!("traces/{name}")))).unwrap();
        text.lines().take(n).map(|l| format!("{l}\n")).collect::<String>().into_bytes()
    };
    let seeds = vec![first_lines("olmoe_299.jsonl", 6), first_lines("kimi_linear_300.jsonl", 3)];
    let dir = temp_dir("fuzz-trace");
    let path = dir.join("routing.jsonl");
    finish(engine::run("trace", seeds, Shape::Json, engine::seconds(SHORT), |input| {
        std::fs::write(&path, input).unwrap();
        parsed(&path, || {
            let t = replay::Trace::load(&path)?;
            let per_token = t.tokens[0].iter().map(Vec::len).sum::<usize>();
            for slots in [1, t.keys() / 8 + 1] {
                std::hint::black_box(replay::replay_counts(&t, slots, Policy::default_for(per_token)));
                std::hint::black_box(replay::belady(&t, slots));
            }
            Ok(())
        })
    }));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The HTTP body and the manifest are JSON too; this checks the harness itself: a mutated
/// input is deterministic, so a finding reproduces from its saved bytes.
#[test]
fn mutation_is_deterministic() {
    let corpus = vec![b"{\"a\": [1, 2, 3], \"b\": \"xyz\"}".to_vec()];
    let run = || {
        let mut rng = engine::Rng::new(42);
        (0..200).map(|_| engine::mutate(&mut rng, &corpus, Shape::Json)).collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
    let distinct: std::collections::HashSet<Vec<u8>> = run().into_iter().collect();
    assert!(distinct.len() > 150, "only {} distinct mutants of 200", distinct.len());
    let _ = Json::Null;
}
