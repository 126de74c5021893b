//! `waste convert`: a Hugging Face checkpoint directory → a container (see [`super::container`]).
//!
//! Conversion streams: one source tensor (or one expert's three matrices) is in memory at a
//! time. It is resumable: every output file is written under a temporary name and renamed when
//! complete; a bank interrupted part-way keeps its complete, checksummed records and continues
//! after the last good one; the manifest is written last, atomically. Killed at any point and
//! run again with the same options, conversion finishes with byte-identical output.

use super::config::ModelConfig;
use super::container::{Bank, Manifest, RecordLayout};
use super::dtype::DType;
use super::json::Json;
use super::safetensors::{commit_file, temp_sibling, Checkpoint, SafeTensors, TensorInfo, TensorSpec, Writer};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::{scalar, MatRef};
use std::io::Write;
use std::path::{Path, PathBuf};

/// How a group of tensors is stored in the container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    F32,
    BF16,
    F16,
    /// Q8B32 (seed 000).
    Q8,
    /// Q4B32 (seed 000).
    Q4,
}

impl Encoding {
    /// Parses `f32`, `bf16`, `f16`, `q8` or `q4`.
    pub fn parse(s: &str) -> Option<Encoding> {
        Some(match s {
            "f32" => Encoding::F32,
            "bf16" => Encoding::BF16,
            "f16" => Encoding::F16,
            "q8" => Encoding::Q8,
            "q4" => Encoding::Q4,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Encoding::F32 => "f32",
            Encoding::BF16 => "bf16",
            Encoding::F16 => "f16",
            Encoding::Q8 => "q8",
            Encoding::Q4 => "q4",
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
        }
    }
}

/// What to convert and how.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub input: PathBuf,
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
}

impl ConvertOptions {
    /// The defaults: q4 trunk and experts, q8 embeddings/head/routers.
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> ConvertOptions {
        ConvertOptions { input: input.into(), output: output.into(), trunk: Encoding::Q4, embeddings: None, experts: Encoding::Q4, interrupt_after: None }
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
}

/// The state file that ties partial outputs to the options that made them.
const STATE: &str = ".waste-convert.json";

/// One trunk output file: its encoding and its tensors.
struct TrunkFile {
    name: String,
    encoding: Encoding,
    tensors: Vec<(String, DType)>,
}

/// Converts, resuming an interrupted run of the same options.
pub fn convert(opts: &ConvertOptions, progress: &mut dyn FnMut(&Progress)) -> Result<ConvertReport> {
    let cfg = ModelConfig::load(&opts.input)?;
    let src = Checkpoint::open(&opts.input)?;
    let out = &opts.output;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, "create directory", e))?;
    prepare_state(opts, &src)?;
    let (trunk, experts) = classify(&cfg, &src, opts)?;
    let banks = bank_plan(&cfg, opts)?;
    let mut job = Job { opts, src: &src, done: 0, total: 0, units: 0, resumed: 0, progress };
    job.total = trunk.iter().map(|f| trunk_file_bytes(&src, f)).sum::<u64>()
        + banks.iter().map(|b| (b.experts * b.layout.record_bytes) as u64).sum::<u64>();
    for f in &trunk {
        job.write_trunk_file(f)?;
    }
    for b in &banks {
        job.write_bank(&cfg, b, &experts)?;
    }
    let tokenizer_files = copy_side_files(&opts.input, out)?;
    let manifest = Manifest {
        dir: out.clone(),
        config: cfg,
        config_json: super::read_json(&opts.input.join("config.json"), 4 << 20)?,
        trunk_files: trunk.iter().map(|f| f.name.clone()).collect(),
        tokenizer_files,
        trunk_encoding: format!("{} (embeddings, head, routers: {})", opts.trunk.name(), opts.embedding_encoding().name()),
        expert_encoding: opts.experts.name().to_string(),
        banks,
    };
    manifest.write()?;
    let _ = std::fs::remove_file(out.join(STATE));
    let mut files: Vec<(String, u64)> = Vec::new();
    for name in manifest.trunk_files.iter().chain(manifest.banks.iter().map(|b| &b.file)).chain(&manifest.tokenizer_files)
        .chain(std::iter::once(&super::container::MANIFEST.to_string())) {
        let size = std::fs::metadata(out.join(name)).map(|m| m.len()).unwrap_or(0);
        files.push((name.clone(), size));
    }
    Ok(ConvertReport { files, resumed_units: job.resumed })
}

/// The options and source a conversion is made of, as stored in the state file.
fn fingerprint(opts: &ConvertOptions, src: &Checkpoint) -> Json {
    Json::object([
        ("converter", Json::uint(super::container::VERSION)),
        ("trunk", Json::str(opts.trunk.name())),
        ("embeddings", Json::str(opts.embedding_encoding().name())),
        ("experts", Json::str(opts.experts.name())),
        ("source", Json::Array(src.files.iter().map(|f| Json::object([
            ("file", Json::str(f.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())),
            ("bytes", Json::uint(f.file_size)),
        ])).collect())),
    ])
}

/// Makes sure partial outputs in the directory belong to this conversion: a directory with a
/// different state file is restarted (our own outputs only); one with foreign files and no
/// state file is refused rather than overwritten.
fn prepare_state(opts: &ConvertOptions, src: &Checkpoint) -> Result<()> {
    let out = &opts.output;
    let state_path = out.join(STATE);
    let want = fingerprint(opts, src);
    if state_path.is_file() {
        let have = super::read_json(&state_path, 1 << 20)?;
        if have == want {
            return Ok(());
        }
        // A different conversion was interrupted here: remove what it wrote, nothing else.
        for entry in std::fs::read_dir(out).map_err(|e| Error::io(out, "list", e))?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_our_output(&name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    } else if std::fs::read_dir(out).map_err(|e| Error::io(out, "list", e))?.next().is_some() {
        let existing = super::container::is_container(out);
        return Err(Error::new(ErrorKind::Arg, format!(
            "{}: the output directory is not empty{}; choose an empty or new directory",
            out.display(), if existing { " (it holds a finished container)" } else { "" })));
    }
    super::safetensors::write_atomic(&state_path, want.to_string_pretty().as_bytes())
}

fn is_our_output(name: &str) -> bool {
    let n = name.trim_start_matches('.').trim_end_matches(".tmp");
    n.starts_with("trunk-") || n.starts_with("experts-") || n == super::container::MANIFEST
}

/// Splits the source tensors into trunk files (by encoding) and routed-expert tensors.
fn classify(cfg: &ModelConfig, src: &Checkpoint, opts: &ConvertOptions) -> Result<(Vec<TrunkFile>, Vec<String>)> {
    let mut files: Vec<TrunkFile> = Vec::new();
    let mut experts = Vec::new();
    for (st, t) in src.tensors() {
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
    name.contains(&format!(".{}.experts.", moe.layout.block))
}

/// KDA's convolution kernels and per-head decay logs (`…conv1d.weight`, `…A_log`).
fn is_kda_parameter(name: &str) -> bool {
    name.ends_with("conv1d.weight") || name.ends_with("A_log")
}

/// Embeddings, the LM head, routers and the shared-expert gate: kept at the higher precision.
fn is_embedding_like(name: &str) -> bool {
    name == "model.embed_tokens.weight" || name == "lm_head.weight" || name.ends_with(".gate.weight") || name.ends_with("shared_expert_gate.weight")
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
    done: u64,
    total: u64,
    units: u64,
    resumed: u64,
    progress: &'a mut dyn FnMut(&Progress),
}

impl Job<'_> {
    /// Counts a unit of work; the testing hook stops here abruptly.
    fn unit(&mut self, bytes: u64, file: &str) -> Result<()> {
        self.done += bytes;
        self.units += 1;
        (self.progress)(&Progress { done: self.done, total: self.total, file: file.to_string() });
        if self.opts.interrupt_after.is_some_and(|n| self.units >= n) {
            return Err(Error::new(ErrorKind::Io, format!("conversion interrupted after {} units (testing hook)", self.units)));
        }
        Ok(())
    }

    fn write_trunk_file(&mut self, f: &TrunkFile) -> Result<()> {
        let path = self.opts.output.join(&f.name);
        if path.is_file() {
            self.resumed += 1;
            self.done += trunk_file_bytes(self.src, f);
            return Ok(());
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
            let bytes = encode_tensor(st, t, spec.dtype)?;
            w.write(&bytes)?;
            if let Err(e) = self.unit(bytes.len() as u64, &f.name) {
                std::mem::forget(w); // as if killed: the temporary file stays as it is
                return Err(e);
            }
        }
        w.finish()?;
        Ok(())
    }

    fn write_bank(&mut self, cfg: &ModelConfig, b: &Bank, expert_tensors: &[String]) -> Result<()> {
        let path = self.opts.output.join(&b.file);
        let rb = b.layout.record_bytes;
        if path.is_file() {
            self.resumed += 1;
            self.done += (b.experts * rb) as u64;
            return Ok(());
        }
        let tmp = temp_sibling(&path);
        let start = resume_bank(&tmp, &b.layout, b.layer)?;
        self.resumed += start as u64;
        self.done += (start * rb) as u64;
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&tmp)
            .map_err(|e| Error::io(&tmp, "open", e))?;
        let moe = cfg.moe.as_ref().ok_or_else(|| Error::new(ErrorKind::Config, "no MoE config"))?;
        let mut rec = vec![0u8; rb];
        for e in start..b.experts {
            rec.fill(0);
            for (i, m) in b.layout.matrices.iter().enumerate() {
                let name = format!("model.layers.{}.{}.experts.{e}.{}.weight", b.layer, moe.layout.block, moe.layout.names[i]);
                let (st, t) = self.src.get(&name).filter(|_| expert_tensors.contains(&name)).ok_or_else(|| Error::new(ErrorKind::Tensor, format!(
                    "{}: tensor `{name}` (layer {} expert {e}) is missing", self.src.dir.display(), b.layer)))?;
                if t.shape != [m.rows as u64, m.cols as u64] {
                    return Err(Error::new(ErrorKind::Tensor, format!("{}: tensor `{name}` has shape {:?}, the config needs [{}, {}]",
                        st.path.display(), t.shape, m.rows, m.cols)));
                }
                let bytes = encode_tensor(st, t, m.dtype)?;
                rec[m.offset..m.offset + m.bytes].copy_from_slice(&bytes);
            }
            b.layout.write_header(&mut rec, b.layer, e);
            file.write_all(&rec).map_err(|e| Error::io(&tmp, "write", e))?;
            self.unit(rb as u64, &b.file)?;
        }
        commit_file(file, &tmp, &path)
    }
}

/// How many complete, valid records an interrupted bank already has; truncates anything
/// after them (a torn last record).
fn resume_bank(tmp: &Path, layout: &RecordLayout, layer: usize) -> Result<usize> {
    let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).open(tmp) else { return Ok(0) };
    let size = file.metadata().map_err(|e| Error::io(tmp, "stat", e))?.len() as usize;
    let rb = layout.record_bytes;
    let mut good = 0;
    let mut rec = vec![0u8; rb];
    while (good + 1) * rb <= size {
        crate::sys::read_exact_at(&file, tmp, &mut rec, (good * rb) as u64)?;
        if layout.check(&rec, tmp, layer, good, true).is_err() {
            break;
        }
        good += 1;
    }
    file.set_len((good * rb) as u64).map_err(|e| Error::io(tmp, "truncate", e))?;
    Ok(good)
}

/// Reads a source tensor and encodes it as `dtype` (float casts round to nearest even; the
/// block widths use the Q4B32/Q8B32 codec). Same-dtype tensors are copied byte for byte.
fn encode_tensor(st: &SafeTensors, t: &TensorInfo, dtype: DType) -> Result<Vec<u8>> {
    let mut raw = vec![0u8; t.len as usize];
    st.read_into(t, &mut raw)?;
    if t.dtype == dtype {
        return Ok(raw);
    }
    if !matches!(t.dtype, DType::F32 | DType::BF16 | DType::F16) {
        return Err(Error::unsupported(format!("{}: tensor `{}` is {}; the converter reads F32, BF16 and F16", st.path.display(), t.name, t.dtype)));
    }
    let (rows, cols) = match t.shape.as_slice() {
        [n] => (1, *n as usize),
        [r, c] => (*r as usize, *c as usize),
        _ => (1, t.elements() as usize),
    };
    let src = MatRef { dtype: t.dtype, rows, cols, data: &raw };
    let out_row = dtype.row_bytes(cols as u64).ok_or_else(|| Error::new(ErrorKind::Tensor, format!(
        "{}: tensor `{}` has {cols} columns, which {dtype} cannot hold", st.path.display(), t.name)))? as usize;
    let mut out = vec![0u8; rows * out_row];
    let mut row = vec![0.0f32; cols];
    for r in 0..rows {
        scalar::row_to_f32(&src, r, &mut row);
        let o = &mut out[r * out_row..(r + 1) * out_row];
        match dtype {
            DType::F32 => o.chunks_exact_mut(4).zip(&row).for_each(|(b, v)| b.copy_from_slice(&v.to_le_bytes())),
            DType::BF16 => o.chunks_exact_mut(2).zip(&row).for_each(|(b, v)| b.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes())),
            DType::F16 => o.chunks_exact_mut(2).zip(&row).for_each(|(b, v)| b.copy_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes())),
            DType::Q8B32 | DType::Q4B32 => {
                let width = if dtype == DType::Q8B32 { super::quant::Width::Q8 } else { super::quant::Width::Q4 };
                super::quant::encode_row(width, &row, o).map_err(|(b, e)| Error::format(&st.path, format!(
                    "tensor `{}`: row {r}, block {b}: {e}; the block cannot be quantized", t.name)))?;
            }
            _ => return Err(Error::unsupported(format!("tensor `{}`: {dtype} encoding is not available yet", t.name))),
        }
    }
    Ok(out)
}

/// Copies the tokenizer and generation files next to the container's manifest; returns the
/// names copied (sorted, so the manifest is deterministic).
fn copy_side_files(from: &Path, to: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(from).map_err(|e| Error::io(from, "list", e))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let wanted = matches!(name.as_str(), "tokenizer.json" | "tokenizer_config.json" | "tokenizer.model" | "vocab.json"
            | "merges.txt" | "special_tokens_map.json" | "generation_config.json" | "tokenizer.bin")
            || name.ends_with(".tiktoken") || (name.starts_with("tok") && name.ends_with(".bin"));
        if wanted && entry.path().is_file() {
            names.push(name);
        }
    }
    names.sort();
    for name in &names {
        let (src, dst) = (from.join(name), to.join(name));
        let bytes = super::read_bounded(&src, 256 << 20)?;
        if std::fs::read(&dst).ok().as_deref() != Some(&bytes[..]) {
            super::safetensors::write_atomic(&dst, &bytes)?;
        }
    }
    Ok(names)
}
