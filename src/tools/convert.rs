//! `waste convert`: a Hugging Face checkpoint directory → a container (see [`crate::format::container`]).
//!
//! Conversion streams: one source tensor (or one expert's three matrices) is in memory at a
//! time. It is resumable: every output file is written under a temporary name and renamed when
//! complete; a state file ties the outputs to the conversion that made them (format version,
//! options, config.json and the source headers) and records each finished trunk file's size
//! and CRC-32, checked before a rerun trusts it; a bank interrupted part-way keeps its
//! complete, checksummed records and continues after the last good one; the manifest is
//! written last, atomically. Killed at any point and run again with the same options,
//! conversion finishes with byte-identical output; run again on its finished output, it
//! verifies it.

use crate::format::config::ModelConfig;
use crate::format::container::{Bank, FileSum, Manifest, RecordLayout, MANIFEST};
use crate::format::dtype::DType;
use crate::format::json::Json;
use crate::format::safetensors::{commit_file, temp_sibling, Checkpoint, SafeTensors, TensorInfo, TensorSpec, Writer};
use crate::format::sha256;
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::{scalar, MatRef};
use std::io::Write;
use std::path::{Path, PathBuf};

/// How a group of tensors is stored in the container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// 32-bit floats, exact.
    F32,
    /// bfloat16 (what most checkpoints ship; exact for them).
    BF16,
    /// IEEE half precision.
    F16,
    /// Q8B32 (seed 000).
    Q8,
    /// Q4B32 (seed 000).
    Q4,
    /// F8B32: FP8 source experts kept as they are, codes and block scales (`format::fp8`);
    /// experts only.
    Fp8,
    /// MXFP4 as gpt-oss ships it (routed experts only, from MXFP4 sources: copied, not
    /// re-quantized).
    Mxfp4,
}

impl Encoding {
    /// Parses `f32`, `bf16`, `f16`, `q8`, `q4`, `fp8` or `mxfp4`.
    pub fn parse(s: &str) -> Option<Encoding> {
        Some(match s {
            "f32" => Encoding::F32,
            "bf16" => Encoding::BF16,
            "f16" => Encoding::F16,
            "q8" => Encoding::Q8,
            "q4" => Encoding::Q4,
            "fp8" => Encoding::Fp8,
            "mxfp4" => Encoding::Mxfp4,
            _ => return None,
        })
    }

    /// The name [`Encoding::parse`] reads (and the manifest records).
    pub fn name(self) -> &'static str {
        match self {
            Encoding::F32 => "f32",
            Encoding::BF16 => "bf16",
            Encoding::F16 => "f16",
            Encoding::Q8 => "q8",
            Encoding::Q4 => "q4",
            Encoding::Fp8 => "fp8",
            Encoding::Mxfp4 => "mxfp4",
        }
    }

    /// The dtype a 2-D tensor gets.
    pub fn dtype(self) -> DType {
        match self {
            Encoding::F32 => DType::F32,
            Encoding::BF16 => DType::BF16,
            Encoding::F16 => DType::F16,
            Encoding::Q8 => DType::Q8B32,
            Encoding::Q4 => DType::Q4B32,
            Encoding::Fp8 => DType::F8B32,
            Encoding::Mxfp4 => DType::MXFP4,
        }
    }
}

/// What to convert and how.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// The Hugging Face checkpoint directory read.
    pub input: PathBuf,
    /// The container directory written (created; resumed when it holds an earlier run's state).
    pub output: PathBuf,
    /// Attention and dense-FFN matrices. Default q4.
    pub trunk: Encoding,
    /// Embeddings, LM head and routers; `None` = q8 when the trunk is quantized, else the
    /// trunk's encoding (routing and the vocabulary are the most sensitive matrices).
    pub embeddings: Option<Encoding>,
    /// Routed experts. Default q4.
    pub experts: Encoding,
    /// Testing hook: stop abruptly (no cleanup, like a kill) after this many units of work.
    pub interrupt_after: Option<u64>,
    /// Testing hook: stop abruptly inside the `n`-th small atomic write (state file, tokenizer
    /// and side files, manifest; counted from 1) at the given stage.
    pub interrupt_write: Option<(u64, WriteStage)>,
}

impl ConvertOptions {
    /// The defaults: q4 trunk and experts, q8 embeddings/head/routers.
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> ConvertOptions {
        ConvertOptions { input: input.into(), output: output.into(), trunk: Encoding::Q4, embeddings: None, experts: Encoding::Q4,
            interrupt_after: None, interrupt_write: None }
    }

    fn embedding_encoding(&self) -> Encoding {
        self.embeddings.unwrap_or(match self.trunk {
            Encoding::Q4 | Encoding::Q8 => Encoding::Q8,
            other => other,
        })
    }
}

/// Progress, reported after every unit of work.
#[derive(Clone, Debug)]
pub struct Progress {
    /// Output bytes done (including those found complete from an earlier run).
    pub done: u64,
    /// Output bytes in all.
    pub total: u64,
    /// The file being written.
    pub file: String,
}

/// The result of a conversion.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    /// Output files and their sizes, manifest last.
    pub files: Vec<(String, u64)>,
    /// Units of work found already done by an earlier, interrupted run.
    pub resumed_units: u64,
    /// The output directory already held this same conversion, finished (a rerun, or a run
    /// killed after its last step): every file was verified and none needed rewriting.
    pub verified_existing: bool,
}

/// Where the testing hook [`ConvertOptions::interrupt_write`] stops inside a small file write
/// (the state file, a tokenizer or side file, the manifest), as a kill would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteStage {
    /// Half the bytes are in the temporary file.
    Torn,
    /// The temporary file is complete, not yet renamed into place.
    BeforeRename,
    /// Renamed into place; nothing after it has run.
    AfterRename,
}

/// The state file that ties partial outputs to the conversion that made them.
const STATE: &str = ".waste-convert.json";

/// One trunk output file: its encoding and its tensors.
struct TrunkFile {
    name: String,
    encoding: Encoding,
    tensors: Vec<(String, DType)>,
}

/// What the state file holds: the conversion's fingerprint and the trunk files it finished
/// (with their sums, checked before a rerun trusts them).
struct State {
    fingerprint: Json,
    finished: Vec<(String, FileSum)>,
}

impl Default for State {
    fn default() -> State {
        State { fingerprint: Json::Null, finished: Vec::new() }
    }
}

impl State {
    fn to_json(&self) -> Json {
        Json::object([
            ("fingerprint", self.fingerprint.clone()),
            ("finished", Json::Array(self.finished.iter().map(|(n, s)| Json::object([
                ("name", Json::str(n.clone())),
                ("bytes", Json::uint(s.bytes)),
                ("crc32", Json::uint(s.crc32 as u64)),
            ])).collect())),
        ])
    }

    /// The state in `j`, when it is one (`None` for anything else: a torn or foreign file).
    fn parse(j: &Json, fingerprint_key: &str, files: Option<&Json>) -> Option<State> {
        let fingerprint = j.get(fingerprint_key)?.clone();
        let mut finished = Vec::new();
        for f in files?.as_array()? {
            let sum = FileSum { bytes: f.get("bytes")?.as_u64()?, crc32: u32::try_from(f.get("crc32")?.as_u64()?).ok()? };
            finished.push((f.get("name")?.as_str()?.to_string(), sum));
        }
        Some(State { fingerprint, finished })
    }

    fn read(path: &Path) -> Option<State> {
        let j = crate::format::read_json(path, 16 << 20).ok()?;
        State::parse(&j, "fingerprint", j.get("finished"))
    }

    fn sum_of(&self, name: &str) -> Option<FileSum> {
        self.finished.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }
}

/// Converts, resuming an interrupted run of the same conversion (and verifying, rather than
/// refusing, a finished one).
/// A failed run removes the output directory when it created it and holds no state to resume
/// from, and says so.
pub fn convert(opts: &ConvertOptions, progress: &mut dyn FnMut(&Progress)) -> Result<ConvertReport> {
    let created = !opts.output.exists();
    let result = convert_into(opts, progress);
    // The testing hooks stand for a kill, which cleans nothing up.
    if opts.interrupt_after.is_some() || opts.interrupt_write.is_some() {
        return result;
    }
    result.map_err(|e| super::clean_up_output(&opts.output, created, Some(STATE), e))
}

fn convert_into(opts: &ConvertOptions, progress: &mut dyn FnMut(&Progress)) -> Result<ConvertReport> {
    let config_path = opts.input.join("config.json");
    let config_bytes = crate::format::read_bounded(&config_path, 4 << 20)?;
    let config_json = crate::format::json::parse(&config_bytes).map_err(|e| Error::format(&config_path, e))?;
    let cfg = ModelConfig::from_json(&config_path, &config_json)?;
    if opts.trunk == Encoding::Fp8 || opts.embeddings == Some(Encoding::Fp8) {
        return Err(Error::new(ErrorKind::Arg, "the fp8 encoding is for routed experts only (--experts fp8); \
the trunk and embeddings take f32, bf16, f16, q8 or q4"));
    }
    if opts.trunk == Encoding::Mxfp4 || opts.embeddings == Some(Encoding::Mxfp4) {
        return Err(Error::unsupported("mxfp4 is an encoding for routed experts only (gpt-oss's, as they ship)"));
    }
    let src = Checkpoint::open(&opts.input)?;
    // Detected before anything is written: a tokenizer the engine would refuse at open stops
    // the conversion here.
    let tokenizer_kind = detect_tokenizer(&opts.input)?;
    let out = &opts.output;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, "create directory", e))?;
    let (trunk, experts) = classify(&cfg, &src, opts)?;
    let banks = bank_plan(&cfg, opts)?;
    let mut job = Job { opts, src: &src, fp8_block: cfg.fp8_block(), done: 0, total: 0, units: 0, resumed: 0, writes: 0, written: 0, state: State::default(), progress };
    job.total = trunk.iter().map(|f| trunk_file_bytes(&src, f)).sum::<u64>()
        + banks.iter().map(|b| (b.experts * b.layout.record_bytes) as u64).sum::<u64>();
    let finished_before = crate::format::container::is_container(out);
    job.state = job.prepare_state(fingerprint(opts, &src, &config_bytes)?)?;
    let mut sums = Vec::with_capacity(trunk.len());
    for f in &trunk {
        sums.push((f.name.clone(), job.write_trunk_file(f)?));
    }
    for b in &banks {
        job.write_bank(&cfg, b, &experts)?;
    }
    let (tokenizer_files, other_files) = job.copy_side_files()?;
    let mut manifest = Manifest::new(out, config_json, sums, banks)?;
    manifest.tokenizer_kind = tokenizer_kind;
    manifest.tokenizer_files = tokenizer_files;
    manifest.other_files = other_files;
    manifest.trunk_encoding = format!("{} (embeddings, head, routers: {})", opts.trunk.name(), opts.embedding_encoding().name());
    manifest.expert_encoding = opts.experts.name().to_string();
    manifest.source = job.state.fingerprint.clone();
    job.write_if_changed(&out.join(MANIFEST), manifest.to_json().to_string_pretty().as_bytes())?;
    // Killed from here on, the directory is a finished container: a rerun verifies it.
    if let Err(e) = std::fs::remove_file(out.join(STATE)) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(Error::io(&out.join(STATE), "remove", e));
        }
    }
    remove_stale_temps(out, &manifest)?;
    let mut files: Vec<(String, u64)> = Vec::new();
    for name in manifest.trunk_files.iter().chain(manifest.banks.iter().map(|b| &b.file)).chain(&manifest.tokenizer_files)
        .chain(&manifest.other_files).chain(std::iter::once(&MANIFEST.to_string())) {
        let size = std::fs::metadata(out.join(name)).map(|m| m.len()).unwrap_or(0);
        files.push((name.clone(), size));
    }
    Ok(ConvertReport { files, resumed_units: job.resumed, verified_existing: finished_before && job.written == 0 })
}

/// The tokenizer kind of the source directory (`None` when it has no tokenizer the engine
/// reads; its files are copied all the same).
fn detect_tokenizer(dir: &Path) -> Result<Option<String>> {
    match crate::tokenizer::Tokenizer::from_model_dir(dir) {
        Ok(t) => Ok(Some(t.kind_name().to_string())),
        Err(e) if e.kind() == ErrorKind::Unsupported || e.message().contains("no tokenizer file found") => Ok(None),
        Err(e) => Err(e.context("the source's tokenizer")),
    }
}

/// What a conversion is made of: the format version, the options, config.json's bytes and
/// each source file's name, size and header (digests). Stored in the state file and in the
/// manifest's `source`. Tensor data is not hashed (that would be a pass over the whole
/// source): a source rewritten in place with identical headers is not noticed.
fn fingerprint(opts: &ConvertOptions, src: &Checkpoint, config_bytes: &[u8]) -> Result<Json> {
    let mut files = Vec::with_capacity(src.files.len());
    for st in &src.files {
        files.push(Json::object([
            ("file", Json::str(st.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())),
            ("bytes", Json::uint(st.file_size)),
            ("header_sha256", Json::str(sha256::hex(&header_digest(st)?))),
        ]));
    }
    Ok(Json::object([
        ("format_version", Json::uint(crate::format::container::VERSION)),
        ("trunk", Json::str(opts.trunk.name())),
        ("embeddings", Json::str(opts.embedding_encoding().name())),
        ("experts", Json::str(opts.experts.name())),
        ("config_sha256", Json::str(sha256::hex(&sha256::digest(config_bytes)))),
        ("source", Json::Array(files)),
    ]))
}

/// SHA-256 of a safetensors file's length prefix and header (already validated at open).
fn header_digest(st: &SafeTensors) -> Result<[u8; 32]> {
    let mut len = [0u8; 8];
    crate::sys::read_exact_at(&st.file, &st.path, &mut len, 0)?;
    let n = u64::from_le_bytes(len).min(crate::format::safetensors::MAX_HEADER_BYTES) as usize;
    let mut header = vec![0u8; 8 + n];
    crate::sys::read_exact_at(&st.file, &st.path, &mut header, 0)?;
    Ok(sha256::digest(&header))
}

/// Names the converter writes (and their temporary names): outputs it may remove when a
/// different conversion's partial work is in the way. Tokenizer files are not among them:
/// they are only ever replaced by the source's own.
fn is_our_output(name: &str) -> bool {
    let n = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")).unwrap_or(name);
    n.starts_with("trunk-") || n.starts_with("experts-") || n == MANIFEST || n == STATE.trim_start_matches('.')
        || name == STATE
}

fn list_dir(dir: &Path) -> Result<Vec<String>> {
    Ok(std::fs::read_dir(dir).map_err(|e| Error::io(dir, "list", e))?.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned()).collect())
}

fn remove_our_outputs(out: &Path) -> Result<()> {
    for name in list_dir(out)?.into_iter().filter(|n| is_our_output(n)) {
        let p = out.join(&name);
        std::fs::remove_file(&p).map_err(|e| Error::io(&p, "remove", e))?;
    }
    Ok(())
}

/// Temporary files a killed run left behind that the finished container does not use.
fn remove_stale_temps(out: &Path, m: &Manifest) -> Result<()> {
    for name in list_dir(out)? {
        let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else { continue };
        if is_our_output(&name) || m.tokenizer_files.iter().chain(&m.other_files).any(|f| f == inner) {
            let p = out.join(&name);
            std::fs::remove_file(&p).map_err(|e| Error::io(&p, "remove", e))?;
        }
    }
    Ok(())
}

/// Splits the source tensors into trunk files (by encoding) and routed-expert tensors.
fn classify(cfg: &ModelConfig, src: &Checkpoint, opts: &ConvertOptions) -> Result<(Vec<TrunkFile>, Vec<String>)> {
    let mut files: Vec<TrunkFile> = Vec::new();
    let mut experts = Vec::new();
    for (st, t) in src.tensors() {
        // Qwen3-Next releases carry their MTP module as `mtp.*` (transformers ignores it on load):
        // not part of the next-token forward pass, so not part of the container.
        if cfg.arch == crate::format::config::Arch::Qwen3Next && t.name.starts_with("mtp.") {
            continue;
        }
        // An FP8 weight's scales travel with it (`encode_tensor`); a scale without its weight
        // means nothing.
        if let Some(weight) = t.name.strip_suffix("_scale_inv") {
            if src.get(weight).is_some_and(|(_, w)| w.dtype == DType::F8E4M3) {
                continue;
            }
            return Err(Error::new(ErrorKind::Tensor, format!(
                "{}: tensor `{}` has no F8_E4M3 weight `{weight}` to scale", st.path.display(), t.name)));
        }
        if let Some(l) = layer_of(&t.name) {
            if l >= cfg.layers {
                continue; // spec §0.2.5: layers past num_hidden_layers (MTP) are not part of the model
            }
            if is_routed_expert(cfg, &t.name) {
                experts.push(t.name.clone());
                continue;
            }
        }
        let (encoding, dtype) = match t.shape.len() {
            1 => (opts.trunk, DType::F32),
            // gpt-oss's expert biases [experts, width]: small vectors, kept in f32 like the others
            // — in an f32 file when the trunk is quantized, whose format stores every 2-D tensor
            // quantized (seed 000).
            2 if is_expert_bias(cfg, &t.name) => (if opts.trunk.dtype().is_quantized() { Encoding::F32 } else { opts.trunk }, DType::F32),
            2 => {
                let enc = if is_embedding_like(&t.name) { opts.embedding_encoding() } else { opts.trunk };
                if enc.dtype().row_bytes(t.shape[1]).is_none() {
                    return Err(Error::new(ErrorKind::Tensor, format!(
                        "{}: tensor `{}` has {} columns, not a multiple of 32: it cannot be stored as {}",
                        st.path.display(), t.name, t.shape[1], enc.dtype())));
                }
                (enc, enc.dtype())
            }
            // wp-mla: Kimi-Linear's KDA conv kernels [C, 1, K] and A_log [1, 1, H, 1] (spec §4.2)
            // are small parameters, kept in f32 with their shape like the 1-D vectors.
            3 | 4 if is_kda_parameter(&t.name) => (opts.trunk, DType::F32),
            n => return Err(Error::unsupported(format!("{}: tensor `{}` has {n} dimensions", st.path.display(), t.name))),
        };
        let name = format!("trunk-{}.safetensors", encoding.name());
        match files.iter_mut().find(|f| f.name == name) {
            Some(f) => f.tensors.push((t.name.clone(), dtype)),
            None => files.push(TrunkFile { name, encoding, tensors: vec![(t.name.clone(), dtype)] }),
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((files, experts))
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?.split('.').next()?.parse().ok()
}

fn is_routed_expert(cfg: &ModelConfig, name: &str) -> bool {
    let Some(moe) = &cfg.moe else { return false };
    name.contains(&format!(".{}.experts.", moe.layout.block)) && !is_expert_bias(cfg, name)
}

/// gpt-oss's per-expert biases, which stay in the trunk beside the router.
fn is_expert_bias(cfg: &ModelConfig, name: &str) -> bool {
    cfg.gpt_oss.is_some() && name.contains(".mlp.experts.") && name.ends_with("_bias")
}

/// KDA's convolution kernels and per-head decay logs (`…conv1d.weight`, `…A_log`).
fn is_kda_parameter(name: &str) -> bool {
    name.ends_with("conv1d.weight") || name.ends_with("A_log")
}

/// Embeddings, the LM head, routers and the shared-expert gate: kept at the higher precision.
fn is_embedding_like(name: &str) -> bool {
    name == "model.embed_tokens.weight" || name == "lm_head.weight" || name.ends_with(".gate.weight") || name.ends_with("shared_expert_gate.weight")
        || name.ends_with(".router.weight")
}

fn bank_plan(cfg: &ModelConfig, opts: &ConvertOptions) -> Result<Vec<Bank>> {
    let Some(moe) = &cfg.moe else { return Ok(Vec::new()) };
    let layout = RecordLayout::new(opts.experts.dtype(), cfg.hidden, moe.expert_intermediate)?;
    Ok((0..cfg.layers).filter(|&l| cfg.is_moe_layer(l))
        .map(|l| Bank { layer: l, file: format!("experts-{l:03}.bank"), experts: moe.experts, layout })
        .collect())
}

fn trunk_file_bytes(src: &Checkpoint, f: &TrunkFile) -> u64 {
    f.tensors.iter().filter_map(|(n, d)| src.get(n).and_then(|(_, t)| d.tensor_bytes(&t.shape))).sum()
}

struct Job<'a> {
    opts: &'a ConvertOptions,
    src: &'a Checkpoint,
    /// `quantization_config.weight_block_size` of an FP8 source.
    fp8_block: Option<[usize; 2]>,
    done: u64,
    total: u64,
    units: u64,
    resumed: u64,
    /// Small atomic writes so far (the testing hook counts them).
    writes: u64,
    /// Units and files actually written (not found done).
    written: u64,
    state: State,
    progress: &'a mut dyn FnMut(&Progress),
}

impl Job<'_> {
    /// Counts a unit of work; the testing hook stops here abruptly.
    fn unit(&mut self, bytes: u64, file: &str) -> Result<()> {
        self.done += bytes;
        self.units += 1;
        self.written += 1;
        (self.progress)(&Progress { done: self.done, total: self.total, file: file.to_string() });
        if self.opts.interrupt_after.is_some_and(|n| self.units >= n) {
            return Err(Error::new(ErrorKind::Io, format!("conversion interrupted after {} units (testing hook)", self.units)));
        }
        Ok(())
    }

    /// Writes a small file atomically (temporary file, fsync, rename); the testing hook may
    /// stop inside it.
    fn write_small(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        self.writes += 1;
        let stage = self.opts.interrupt_write.and_then(|(n, s)| (n == self.writes).then_some(s));
        let stop = || Error::new(ErrorKind::Io, format!("conversion interrupted in write {} ({}, {stage:?}) (testing hook)", self.writes, path.display()));
        let tmp = temp_sibling(path);
        let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, "create", e))?;
        let cut = if stage == Some(WriteStage::Torn) { bytes.len() / 2 } else { bytes.len() };
        f.write_all(&bytes[..cut]).map_err(|e| Error::io(&tmp, "write", e))?;
        if stage.is_some_and(|s| s != WriteStage::AfterRename) {
            return Err(stop()); // as if killed: the temporary file stays as it is
        }
        commit_file(f, &tmp, path)?;
        stage.map_or(Ok(()), |_| Err(stop()))
    }

    /// [`Job::write_small`] unless `path` already holds exactly `bytes`.
    fn write_if_changed(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        let same = std::fs::metadata(path).is_ok_and(|m| m.len() == bytes.len() as u64)
            && std::fs::read(path).ok().as_deref() == Some(bytes);
        if same {
            return Ok(());
        }
        self.written += 1;
        self.write_small(path, bytes)
    }

    fn save_state(&mut self) -> Result<()> {
        let bytes = self.state.to_json().to_string_pretty();
        self.write_small(&self.opts.output.join(STATE), bytes.as_bytes())
    }

    /// Decides what the output directory's contents are worth to this conversion:
    /// - a state file of this conversion: resume (a complete state file left under its
    ///   temporary name by a kill is the newest one; a torn one is dropped);
    /// - a state file of another conversion: its outputs are removed (ours only) and this
    ///   one starts;
    /// - a finished container of this same conversion: every file is verified as if resuming;
    /// - an empty directory, or one holding only our outputs and a torn state file (killed in
    ///   the first write): start;
    /// - anything else is refused rather than overwritten.
    fn prepare_state(&mut self, want: Json) -> Result<State> {
        let out = self.opts.output.clone();
        let state_path = out.join(STATE);
        let tmp = temp_sibling(&state_path);
        let saw_tmp = tmp.exists();
        if saw_tmp {
            if State::read(&tmp).is_some_and(|s| s.fingerprint == want) {
                std::fs::rename(&tmp, &state_path).map_err(|e| Error::io(&state_path, "rename into place", e))?;
            } else {
                std::fs::remove_file(&tmp).map_err(|e| Error::io(&tmp, "remove", e))?;
            }
        }
        let fresh = |job: &mut Self| -> Result<State> {
            job.state = State { fingerprint: want.clone(), ..State::default() };
            job.save_state()?;
            Ok(std::mem::take(&mut job.state))
        };
        if state_path.is_file() {
            match State::read(&state_path) {
                Some(s) if s.fingerprint == want => return Ok(s),
                // Another conversion was interrupted here (or its state is unreadable).
                _ => {
                    remove_our_outputs(&out)?;
                    return fresh(self);
                }
            }
        }
        let entries = list_dir(&out)?;
        if entries.is_empty() {
            return fresh(self);
        }
        if crate::format::container::is_container(&out) {
            let root = crate::format::read_json(&out.join(MANIFEST), 64 << 20).ok();
            let files = root.as_ref().and_then(|r| r.get("trunk")).and_then(|t| t.get("files"));
            if let Some(s) = root.as_ref().and_then(|r| State::parse(r, "source", files)).filter(|s| s.fingerprint == want) {
                return Ok(s);
            }
            return Err(Error::new(ErrorKind::Arg, format!(
                "{}: the output directory holds a finished container of a different conversion (other source, config or \
                 options); choose an empty or new directory", out.display())));
        }
        if saw_tmp && entries.iter().all(|n| is_our_output(n)) {
            remove_our_outputs(&out)?;
            return fresh(self);
        }
        Err(Error::new(ErrorKind::Arg, format!(
            "{}: the output directory is not empty; choose an empty or new directory", out.display())))
    }

    /// Writes one trunk file (or, resuming, checks the finished one against the size and
    /// CRC-32 the state recorded for it) and returns its sum.
    fn write_trunk_file(&mut self, f: &TrunkFile) -> Result<FileSum> {
        let path = self.opts.output.join(&f.name);
        if path.is_file() {
            if let Some(want) = self.state.sum_of(&f.name) {
                if FileSum::of_file(&path)? == want {
                    self.resumed += 1;
                    self.done += trunk_file_bytes(self.src, f);
                    return Ok(want);
                }
            }
            // Not recorded as finished by this conversion, or changed since: written again.
        }
        let mut specs = Vec::with_capacity(f.tensors.len());
        for (name, dtype) in &f.tensors {
            let (_, t) = self.src.get(name).ok_or_else(|| Error::new(ErrorKind::Tensor, format!("tensor `{name}` vanished")))?;
            specs.push(TensorSpec { name: name.clone(), dtype: *dtype, shape: t.shape.clone() });
        }
        let metadata = match f.encoding {
            Encoding::Q4 | Encoding::Q8 => vec![
                ("format".to_string(), format!("rabbit-{}b32", f.encoding.name())),
                ("block".to_string(), "32".to_string()),
                ("scale".to_string(), "f16".to_string()),
            ],
            _ => Vec::new(),
        };
        let mut w = Writer::create(&path, &specs, &metadata)?;
        for spec in &specs {
            let (st, t) = self.src.get(&spec.name).ok_or_else(|| Error::new(ErrorKind::Tensor, format!("tensor `{}` vanished", spec.name)))?;
            let bytes = encode_tensor(self.src, self.fp8_block, st, t, spec.dtype)?;
            w.write(&bytes)?;
            if let Err(e) = self.unit(bytes.len() as u64, &f.name) {
                std::mem::forget(w); // as if killed: the temporary file stays as it is
                return Err(e);
            }
        }
        let sum = w.finish_with_sum()?;
        self.state.finished.retain(|(n, _)| n != &f.name);
        self.state.finished.push((f.name.clone(), sum));
        self.save_state()?;
        Ok(sum)
    }

    fn write_bank(&mut self, cfg: &ModelConfig, b: &Bank, expert_tensors: &[String]) -> Result<()> {
        let path = self.opts.output.join(&b.file);
        let rb = b.layout.record_bytes;
        let tmp = temp_sibling(&path);
        if path.is_file() {
            // A finished bank is trusted only if every record checks (header and CRC-32).
            let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, "open", e))?;
            let size = file.metadata().map_err(|e| Error::io(&path, "stat", e))?.len();
            if size == (b.experts * rb) as u64 && good_records(&file, &path, &b.layout, b.layer, b.experts)? == b.experts {
                self.resumed += 1;
                self.done += (b.experts * rb) as u64;
                return Ok(());
            }
            // Its good records are kept: resumed below under the temporary name.
            std::fs::rename(&path, &tmp).map_err(|e| Error::io(&tmp, "rename", e))?;
        }
        let start = resume_bank(&tmp, &b.layout, b.layer, b.experts)?;
        self.resumed += start as u64;
        self.done += (start * rb) as u64;
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&tmp)
            .map_err(|e| Error::io(&tmp, "open", e))?;
        let moe = cfg.moe.as_ref().ok_or_else(|| Error::new(ErrorKind::Config, "no MoE config"))?;
        let mut rec = vec![0u8; rb];
        // gpt-oss: every expert of the layer is in two fused tensors (float or MXFP4).
        let fused = match cfg.gpt_oss {
            Some(_) => Some(crate::format::mxfp4::FusedExperts::open(self.src, &format!("model.layers.{}.mlp.experts", b.layer),
                b.experts, cfg.hidden, moe.expert_intermediate)?),
            None => None,
        };
        let mut mats = fused.as_ref().map(|_| b.layout.matrices.map(|m| vec![0.0f32; m.rows * m.cols]));
        for e in start..b.experts {
            if let (Some(f), true) = (&fused, b.layout.matrices[0].dtype == DType::MXFP4) {
                // The source's MXFP4 codes and scales, copied as they are.
                rec.fill(0);
                let [g, u, d] = b.layout.matrices;
                let (head, rest) = rec.split_at_mut(u.offset);
                let (up_bytes, down_bytes) = rest.split_at_mut(d.offset - u.offset);
                f.read_mxfp4(e, &mut head[g.offset..g.offset + g.bytes], &mut up_bytes[..u.bytes], &mut down_bytes[..d.bytes])?;
                b.layout.write_header(&mut rec, b.layer, e);
                file.write_all(&rec).map_err(|e| Error::io(&tmp, "write", e))?;
                self.unit(rb as u64, &b.file)?;
                continue;
            }
            if let (Some(f), Some([gate, up, down])) = (&fused, &mut mats) {
                rec.fill(0);
                f.read(e, gate, up, down)?;
                for ((m, src), what) in b.layout.matrices.iter().zip([&*gate, &*up, &*down]).zip(["gate", "up", "down"]) {
                    let out_row = m.bytes / m.rows;
                    for (r, row) in src.chunks_exact(m.cols).enumerate() {
                        encode_row_as(m.dtype, row, &mut rec[m.offset + r * out_row..m.offset + (r + 1) * out_row]).map_err(|why| Error::new(
                            ErrorKind::Tensor, format!("layer {} expert {e}, {what} matrix, row {r}, {why}", b.layer)))?;
                    }
                }
                b.layout.write_header(&mut rec, b.layer, e);
                file.write_all(&rec).map_err(|e| Error::io(&tmp, "write", e))?;
                self.unit(rb as u64, &b.file)?;
                continue;
            }
            rec.fill(0);
            for (i, m) in b.layout.matrices.iter().enumerate() {
                let name = format!("model.layers.{}.{}.experts.{e}.{}.weight", b.layer, moe.layout.block, moe.layout.names[i]);
                let (st, t) = self.src.get(&name).filter(|_| expert_tensors.contains(&name)).ok_or_else(|| Error::new(ErrorKind::Tensor, format!(
                    "{}: tensor `{name}` (layer {} expert {e}) is missing", self.src.dir.display(), b.layer)))?;
                if t.shape != [m.rows as u64, m.cols as u64] {
                    return Err(Error::new(ErrorKind::Tensor, format!("{}: tensor `{name}` has shape {:?}, the config needs [{}, {}]",
                        st.path.display(), t.shape, m.rows, m.cols)));
                }
                let bytes = encode_tensor(self.src, self.fp8_block, st, t, m.dtype)?;
                rec[m.offset..m.offset + m.bytes].copy_from_slice(&bytes);
            }
            b.layout.write_header(&mut rec, b.layer, e);
            file.write_all(&rec).map_err(|e| Error::io(&tmp, "write", e))?;
            self.unit(rb as u64, &b.file)?;
        }
        commit_file(file, &tmp, &path)
    }

    /// Copies the tokenizer and generation files next to the manifest (those already there
    /// with the same bytes are left alone); returns (tokenizer files, other files), sorted so
    /// the manifest is deterministic.
    fn copy_side_files(&mut self) -> Result<(Vec<String>, Vec<String>)> {
        let from = self.opts.input.clone();
        let mut names = Vec::new();
        for name in list_dir(&from)? {
            let wanted = matches!(name.as_str(), "tokenizer.json" | "tokenizer_config.json" | "tokenizer.model" | "tiktoken.model"
                | "vocab.json" | "merges.txt" | "special_tokens_map.json" | "generation_config.json" | "tokenizer.bin")
                || name.ends_with(".tiktoken") || (name.starts_with("tok") && name.ends_with(".bin"));
            if wanted && from.join(&name).is_file() {
                names.push(name);
            }
        }
        names.sort();
        for name in &names {
            let bytes = crate::format::read_bounded(&from.join(name), 256 << 20)?;
            self.write_if_changed(&self.opts.output.join(name), &bytes)?;
        }
        let (other, tokenizer): (Vec<String>, Vec<String>) = names.into_iter().partition(|n| n == "generation_config.json");
        Ok((tokenizer, other))
    }
}

/// How many of the first `limit` records of `file` are complete and valid (header and CRC-32),
/// counting from the start.
fn good_records(file: &std::fs::File, path: &Path, layout: &RecordLayout, layer: usize, limit: usize) -> Result<usize> {
    let size = file.metadata().map_err(|e| Error::io(path, "stat", e))?.len() as usize;
    let rb = layout.record_bytes;
    let mut good = 0;
    let mut rec = vec![0u8; rb];
    while good < limit && (good + 1) * rb <= size {
        crate::sys::read_exact_at(file, path, &mut rec, (good * rb) as u64)?;
        if layout.check(&rec, path, layer, good, true).is_err() {
            break;
        }
        good += 1;
    }
    Ok(good)
}

/// How many complete, valid records an interrupted bank already has; truncates anything
/// after them (a torn last record).
fn resume_bank(tmp: &Path, layout: &RecordLayout, layer: usize, experts: usize) -> Result<usize> {
    let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).open(tmp) else { return Ok(0) };
    let good = good_records(&file, tmp, layout, layer, experts)?;
    file.set_len((good * layout.record_bytes) as u64).map_err(|e| Error::io(tmp, "truncate", e))?;
    Ok(good)
}

/// Reads a source tensor and encodes it as `dtype` (float casts round to nearest even; the
/// block widths use the Q4B32/Q8B32 codec). Same-dtype tensors are copied byte for byte; FP8
/// sources are read with their scales (`block`, from the config) and either kept as F8B32 or
/// decoded exactly and encoded like a float source.
fn encode_tensor(src: &Checkpoint, block: Option<[usize; 2]>, st: &SafeTensors, t: &TensorInfo, dtype: DType) -> Result<Vec<u8>> {
    if t.dtype == DType::F8E4M3 {
        return encode_fp8(src, block, st, t, dtype);
    }
    if dtype == DType::F8B32 {
        return Err(Error::unsupported(format!(
            "{}: tensor `{}` is {}: --experts fp8 keeps FP8 (F8_E4M3) source weights as they are and does not quantize others \
(use q8, q4, bf16 or f32)", st.path.display(), t.name, t.dtype)));
    }
    let mut raw = vec![0u8; t.len as usize];
    st.read_into(t, &mut raw)?;
    if t.dtype == dtype {
        // A quantized source copied as it is: its block scales are checked here, where the
        // bytes are read (seed 000: a non-finite scale is refused, never passed on).
        crate::format::quant::check_scales(&st.path, t, 0, &raw)?;
        return Ok(raw);
    }
    if !matches!(t.dtype, DType::F32 | DType::BF16 | DType::F16) {
        return Err(Error::unsupported(format!("{}: tensor `{}` is {}; the converter reads F32, BF16, F16 and F8_E4M3",
            st.path.display(), t.name, t.dtype)));
    }
    let (rows, cols) = match t.shape.as_slice() {
        [n] => (1, *n as usize),
        [r, c] => (*r as usize, *c as usize),
        _ => (1, t.elements() as usize),
    };
    encode_rows(st, t, MatRef { dtype: t.dtype, rows, cols, data: &raw }, dtype)
}

/// An F8_E4M3 source weight with its `_scale_inv`: kept as F8B32, or decoded to f32 and
/// encoded as `dtype`.
fn encode_fp8(src: &Checkpoint, block: Option<[usize; 2]>, st: &SafeTensors, t: &TensorInfo, dtype: DType) -> Result<Vec<u8>> {
    use crate::format::fp8;
    let [rows, cols] = match t.shape[..] {
        [r, c] => [r as usize, c as usize],
        _ => return Err(Error::unsupported(format!("{}: F8_E4M3 tensor `{}` has shape {:?}; FP8 weights are matrices",
            st.path.display(), t.name, t.shape))),
    };
    let block = block.ok_or_else(|| Error::unsupported(format!(
        "{}: tensor `{}` has dtype F8_E4M3, but config.json has no FP8 quantization_config (weight_block_size) to read it with",
        st.path.display(), t.name)))?;
    let (sfile, s) = src.get(&fp8::scale_name(&t.name)).ok_or_else(|| fp8::missing_scale(&src.dir, &t.name))?;
    fp8::check_scale_tensor(&sfile.path, &t.name, rows, cols, block, s)?;
    if dtype == DType::F8B32 {
        if let Some(p) = fp8::f8b32_problem(&t.name, cols, block) {
            return Err(Error::unsupported(format!("{}: {p}", st.path.display())));
        }
    }
    let mut codes = vec![0u8; t.len as usize];
    st.read_into(t, &mut codes)?;
    let mut raw = vec![0u8; s.len as usize];
    sfile.read_into(s, &mut raw)?;
    let scales = fp8::scales_of(&raw);
    let f8 = fp8::Fp8Tensor { path: &st.path, name: &t.name, rows, cols, block, codes: &codes, scales: &scales };
    if dtype == DType::F8B32 {
        let mut out = vec![0u8; rows * (cols / fp8::F8B32_COLS) * fp8::F8B32_BYTES];
        fp8::encode_f8b32(&f8, &mut out)?;
        return Ok(out);
    }
    let mut values = vec![0f32; rows * cols];
    fp8::dequantize(&f8, &mut values)?;
    if dtype == DType::F32 {
        return Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect());
    }
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    encode_rows(st, t, MatRef { dtype: DType::F32, rows, cols, data: &bytes }, dtype)
}

/// Encodes the rows of a float matrix `src` (the source tensor `t`) as `dtype`.
fn encode_rows(st: &SafeTensors, t: &TensorInfo, src: MatRef, dtype: DType) -> Result<Vec<u8>> {
    let (rows, cols) = (src.rows, src.cols);
    let out_row = dtype.row_bytes(cols as u64).ok_or_else(|| Error::new(ErrorKind::Tensor, format!(
        "{}: tensor `{}` has {cols} columns, which {dtype} cannot hold", st.path.display(), t.name)))? as usize;
    let mut out = vec![0u8; rows * out_row];
    let mut row = vec![0.0f32; cols];
    for r in 0..rows {
        scalar::row_to_f32(&src, r, &mut row);
        let o = &mut out[r * out_row..(r + 1) * out_row];
        encode_row_as(dtype, &row, o).map_err(|why| Error::format(&st.path, format!("tensor `{}`: row {r}, {why}", t.name)))?;
    }
    Ok(out)
}

/// Encodes one row of f32 values as `dtype` into `o` (its row bytes): float casts round to
/// nearest even, the block widths use the Q4B32/Q8B32 codec.
fn encode_row_as(dtype: DType, row: &[f32], o: &mut [u8]) -> std::result::Result<(), String> {
    match dtype {
        DType::F32 => o.chunks_exact_mut(4).zip(row).for_each(|(b, v)| b.copy_from_slice(&v.to_le_bytes())),
        DType::BF16 => o.chunks_exact_mut(2).zip(row).for_each(|(b, v)| b.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes())),
        DType::F16 => o.chunks_exact_mut(2).zip(row).for_each(|(b, v)| b.copy_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes())),
        DType::Q8B32 | DType::Q4B32 => {
            let width = if dtype == DType::Q8B32 { crate::format::quant::Width::Q8 } else { crate::format::quant::Width::Q4 };
            crate::format::quant::encode_row(width, row, o).map_err(|(b, e)| format!("block {b}: {e}; the block cannot be quantized"))?;
        }
        DType::MXFP4 => return Err("mxfp4 keeps MXFP4 sources as they are; it does not quantize float values".into()),
        _ => return Err(format!("{dtype} encoding is not available yet")),
    }
    Ok(())
}
