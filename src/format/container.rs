//! The waste container: a directory that holds a model ready to stream. `docs/CONTAINER.md`
//! documents it for other implementations; this module reads and writes it.
//!
//! - `manifest.json` — format version, architecture, the model config, the trunk files (with
//!   their sizes and CRC-32s) and the index of every trunk tensor, the tokenizer kind and
//!   files, and one entry per expert bank. Written last, atomically: a directory without it is
//!   not a container.
//! - trunk files — safetensors (float, or the Q4B32/Q8B32 format, one width per file) holding
//!   every tensor that stays resident.
//! - one expert bank per MoE layer — records of `record_bytes` each, expert `e` at byte
//!   `e × record_bytes`. A record is a multiple of 4096 bytes and 4096-aligned, so one expert is
//!   one aligned read; it starts with a header the engine checks on every read.

use super::config::ModelConfig;
use super::crc32::crc32;
pub use super::crc32::FileSum;
use super::dtype::DType;
use super::json::Json;
use super::safetensors::{Checkpoint, SafeTensors, TensorInfo};
use crate::error::{Error, ErrorKind, Result};
use std::path::{Path, PathBuf};

/// The manifest format version this engine writes and the only one it reads. Version 2 added
/// the trunk index, the trunk files' CRC-32s, the tokenizer kind and the conversion's source
/// fingerprint; a version-1 manifest lacks what the checks at open need, so it is refused
/// (convert again) rather than half-checked.
pub const VERSION: u64 = 2;
/// The version in every record header. Records are unchanged since the first container
/// version, so it stays 1 while the manifest's version moves.
pub const RECORD_VERSION: u32 = 1;
/// Records are multiples of this and start at multiples of it (the `O_DIRECT` granule).
pub const RECORD_ALIGN: usize = 4096;
/// Bytes reserved for a record header; the first matrix starts here.
pub const HEADER_BYTES: usize = 256;
/// The first eight bytes of every record.
pub const MAGIC: [u8; 8] = *b"WASTEXPR";
/// Header bytes up to here hold fields (the three descriptors end at 136); the rest are zero.
const HEADER_USED: usize = 40 + 32 * 3;
/// Matrices inside a record start at multiples of this (SIMD loads).
const MATRIX_ALIGN: usize = 64;
/// Names of the three matrices of an expert, in record order.
pub const MATRIX_NAMES: [&str; 3] = ["gate", "up", "down"];

/// One matrix of a record: where it is and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixDesc {
    /// How its weights are stored.
    pub dtype: DType,
    /// Output rows.
    pub rows: usize,
    /// Input columns.
    pub cols: usize,
    /// Byte offset from the start of the record.
    pub offset: usize,
    /// Its bytes in the record.
    pub bytes: usize,
}

/// The geometry every record of a bank shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLayout {
    /// gate [I, H], up [I, H], down [H, I].
    pub matrices: [MatrixDesc; 3],
    /// Bytes from the end of the header to the end of the last matrix (what the CRC covers).
    pub payload_bytes: usize,
    /// The whole record, rounded up to [`RECORD_ALIGN`].
    pub record_bytes: usize,
}

fn dtype_code(d: DType) -> u32 {
    match d {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
        DType::Q8B32 => 3,
        DType::Q4B32 => 4,
        // FP8 block-scaled experts kept as they are (`format::fp8`, docs/CONTAINER.md).
        DType::F8B32 => 5,
        // gpt-oss's MXFP4 experts kept as they ship (`format::mxfp4`, docs/CONTAINER.md).
        DType::MXFP4 => 6,
        _ => u32::MAX,
    }
}

fn dtype_of_code(c: u32) -> Option<DType> {
    [DType::F32, DType::BF16, DType::F16, DType::Q8B32, DType::Q4B32, DType::F8B32, DType::MXFP4].get(c as usize).copied()
}

/// Index of the first non-zero byte.
fn nonzero_at(b: &[u8]) -> Option<usize> {
    b.iter().position(|&x| x != 0)
}

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

impl RecordLayout {
    /// The layout of an expert with `inter` × `hidden` gate/up and `hidden` × `inter` down
    /// matrices stored as `dtype`.
    pub fn new(dtype: DType, hidden: usize, inter: usize) -> Result<RecordLayout> {
        let shapes = [(inter, hidden), (inter, hidden), (hidden, inter)];
        let mut at = HEADER_BYTES;
        let mut matrices = [MatrixDesc { dtype, rows: 0, cols: 0, offset: 0, bytes: 0 }; 3];
        for (m, (rows, cols)) in matrices.iter_mut().zip(shapes) {
            let bytes = dtype.tensor_bytes(&[rows as u64, cols as u64]).ok_or_else(|| {
                Error::new(ErrorKind::Tensor, format!("an expert matrix of [{rows}, {cols}] cannot be stored as {dtype}"))
            })? as usize;
            at = round_up(at, MATRIX_ALIGN);
            *m = MatrixDesc { dtype, rows, cols, offset: at, bytes };
            at += bytes;
        }
        Ok(RecordLayout { matrices, payload_bytes: at - HEADER_BYTES, record_bytes: round_up(at, RECORD_ALIGN) })
    }

    /// Writes the header of record (`layer`, `expert`) into `rec[..HEADER_BYTES]`, with the CRC
    /// of the payload already in `rec`.
    pub fn write_header(&self, rec: &mut [u8], layer: usize, expert: usize) {
        let crc = crc32(&rec[HEADER_BYTES..HEADER_BYTES + self.payload_bytes]);
        let h = &mut rec[..HEADER_BYTES];
        h.fill(0);
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(layer as u32).to_le_bytes());
        h[16..20].copy_from_slice(&(expert as u32).to_le_bytes());
        h[20..24].copy_from_slice(&3u32.to_le_bytes());
        h[24..32].copy_from_slice(&(self.payload_bytes as u64).to_le_bytes());
        h[32..36].copy_from_slice(&crc.to_le_bytes());
        h[36..40].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
        for (i, m) in self.matrices.iter().enumerate() {
            let d = &mut h[40 + 32 * i..72 + 32 * i];
            d[0..4].copy_from_slice(&dtype_code(m.dtype).to_le_bytes());
            d[4..8].copy_from_slice(&(m.rows as u32).to_le_bytes());
            d[8..12].copy_from_slice(&(m.cols as u32).to_le_bytes());
            d[16..24].copy_from_slice(&(m.offset as u64).to_le_bytes());
            d[24..32].copy_from_slice(&(m.bytes as u64).to_le_bytes());
        }
    }

    /// Checks the header of a record read for (`layer`, `expert`) from `path` against this
    /// layout, and that every byte the layout says is zero is zero (header bytes 136..256, each
    /// descriptor's reserved word, the gaps between matrices and the padding after the
    /// payload); with `verify`, also the CRC-32 of the payload. Nothing is computed from a
    /// record that fails.
    ///
    /// The zero checks run on every read: they cover at most 120 + 12 + 2·63 + 4095 bytes of a
    /// record of at least 4096 (usually megabytes) that was just read into cache, so they cost
    /// far less than the CRC, which is a pass over the whole payload and stays behind `verify`.
    pub fn check(&self, rec: &[u8], path: &Path, layer: usize, expert: usize, verify: bool) -> Result<()> {
        let bad = |what: String| Error::new(ErrorKind::Corrupt, format!(
            "{}: layer {layer} expert {expert} (record at byte {}): {what}", path.display(), expert * self.record_bytes));
        if rec.len() < self.record_bytes {
            return Err(bad(format!("record is {} bytes, expected {}", rec.len(), self.record_bytes)));
        }
        let u32_at = |o: usize| u32::from_le_bytes([rec[o], rec[o + 1], rec[o + 2], rec[o + 3]]);
        let u64_at = |o: usize| u64::from_le_bytes(rec[o..o + 8].try_into().unwrap_or([0; 8]));
        if rec[0..8] != MAGIC {
            return Err(bad("wrong magic (not an expert record)".into()));
        }
        if u32_at(8) != RECORD_VERSION {
            return Err(bad(format!("record version {}, expected {RECORD_VERSION}", u32_at(8))));
        }
        if u32_at(12) as usize != layer || u32_at(16) as usize != expert {
            return Err(bad(format!("header says layer {} expert {} (a record out of place)", u32_at(12), u32_at(16))));
        }
        if u32_at(20) != 3 || u64_at(24) as usize != self.payload_bytes || u32_at(36) as usize != HEADER_BYTES {
            return Err(bad(format!("header sizes (matrices {}, payload {}, header {}) disagree with the manifest (3, {}, {HEADER_BYTES})",
                u32_at(20), u64_at(24), u32_at(36), self.payload_bytes)));
        }
        for (i, m) in self.matrices.iter().enumerate() {
            let d = 40 + 32 * i;
            let found = (dtype_of_code(u32_at(d)), u32_at(d + 4) as usize, u32_at(d + 8) as usize, u64_at(d + 16) as usize, u64_at(d + 24) as usize);
            if found != (Some(m.dtype), m.rows, m.cols, m.offset, m.bytes) {
                return Err(bad(format!("{} matrix descriptor {:?} disagrees with the manifest ({}, {}, {}, {}, {})",
                    MATRIX_NAMES[i], found, m.dtype, m.rows, m.cols, m.offset, m.bytes)));
            }
            if u32_at(d + 12) != 0 {
                return Err(bad(format!("{} matrix descriptor's reserved word (header byte {}) is {}, not 0", MATRIX_NAMES[i], d + 12, u32_at(d + 12))));
            }
        }
        if let Some(i) = nonzero_at(&rec[HEADER_USED..HEADER_BYTES]) {
            return Err(bad(format!("header byte {} is 0x{:02x}; bytes {HEADER_USED}..{HEADER_BYTES} must be zero", HEADER_USED + i, rec[HEADER_USED + i])));
        }
        for (from, to) in self.zero_ranges() {
            if let Some(i) = nonzero_at(&rec[from..to]) {
                return Err(bad(format!("byte {} of the record is 0x{:02x}; the padding {from}..{to} must be zero", from + i, rec[from + i])));
            }
        }
        if verify {
            let want = u32_at(32);
            let got = crc32(&rec[HEADER_BYTES..HEADER_BYTES + self.payload_bytes]);
            if want != got {
                return Err(bad(format!("payload CRC-32 is {got:08x}, the header says {want:08x}")));
            }
        }
        Ok(())
    }

    /// The byte ranges of a record after its header that hold no matrix: the alignment gaps
    /// before each matrix and the padding after the last one.
    fn zero_ranges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let ends = std::iter::once(HEADER_BYTES).chain(self.matrices.iter().map(|m| m.offset + m.bytes));
        let starts = self.matrices.iter().map(|m| m.offset).chain(std::iter::once(self.record_bytes));
        ends.zip(starts).filter(|(a, b)| a < b)
    }

    fn to_json(self) -> Json {
        Json::Array(self.matrices.iter().zip(MATRIX_NAMES).map(|(m, name)| Json::object([
            ("name", Json::str(name)),
            ("dtype", Json::str(m.dtype.name())),
            ("rows", Json::uint(m.rows as u64)),
            ("cols", Json::uint(m.cols as u64)),
            ("offset", Json::uint(m.offset as u64)),
            ("bytes", Json::uint(m.bytes as u64)),
        ])).collect())
    }
}

/// One expert bank: the routed experts of one MoE layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Bank {
    /// The decoder layer whose experts it holds.
    pub layer: usize,
    /// File name inside the container.
    pub file: String,
    /// Records in the bank, one per expert.
    pub experts: usize,
    /// The geometry of every record.
    pub layout: RecordLayout,
}

/// One entry of the trunk index: where a resident tensor is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrunkTensor {
    /// The tensor's name.
    pub name: String,
    /// The trunk file holding it.
    pub file: String,
    /// Its element type.
    pub dtype: DType,
    /// Its dimensions, outermost first.
    pub shape: Vec<u64>,
    /// Absolute byte range in the file, `begin..end`.
    pub begin: u64,
    /// See `begin`.
    pub end: u64,
}

/// The tokenizer kinds a manifest may name (what [`crate::Tokenizer::kind_name`] reports).
pub const TOKENIZER_KINDS: [&str; 4] = ["tiktoken", "hf-bytelevel", "hf-sentencepiece", "llama2c"];

/// The parsed manifest of a container.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// The container directory.
    pub dir: PathBuf,
    /// The model's configuration, parsed from `config_json`.
    pub config: ModelConfig,
    /// The config.json object as converted (kept verbatim).
    pub config_json: Json,
    /// The trunk's safetensors files (names inside `dir`).
    pub trunk_files: Vec<String>,
    /// Per trunk file, in the same order: its size and CRC-32.
    pub trunk_sums: Vec<FileSum>,
    /// Every trunk tensor, file by file in byte order.
    pub trunk_index: Vec<TrunkTensor>,
    /// The tokenizer's kind (one of [`TOKENIZER_KINDS`]); `None` when the model has no
    /// tokenizer this engine reads.
    pub tokenizer_kind: Option<String>,
    /// The tokenizer's files (names inside `dir`).
    pub tokenizer_files: Vec<String>,
    /// Other files copied from the source (`generation_config.json`).
    pub other_files: Vec<String>,
    /// Human-readable encoding of the trunk's matrices (e.g. "q4", "q8", "bf16").
    pub trunk_encoding: String,
    /// The same for the routed experts.
    pub expert_encoding: String,
    /// One bank per MoE layer, in layer order.
    pub banks: Vec<Bank>,
    /// What the converter made the container from (its options and the source's digests), so
    /// that a rerun of the same conversion recognises its finished output; `Null` otherwise.
    pub source: Json,
}

/// File name of the manifest inside a container.
pub const MANIFEST: &str = "manifest.json";

/// True when `dir` is a container (it has a manifest).
pub fn is_container(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file()
}

/// A file name written into a manifest must be a plain name inside the container.
fn plain_name(path: &Path, field: &str, name: &str) -> Result<String> {
    if name.is_empty() || name.contains('/') || name.contains('\\') || name == "." || name == ".." {
        return Err(Error::config(path, field, format!("`{name}` is not a file name inside the container")));
    }
    Ok(name.to_string())
}

/// The version rule: exactly [`VERSION`]; older and newer manifests are refused, saying which.
fn check_version(path: &Path, version: u64) -> Result<()> {
    match version {
        VERSION => Ok(()),
        v if v < VERSION => Err(Error::unsupported(format!(
            "{}: container version {v} predates the trunk index and checksums this engine checks (it reads version {VERSION}); \
             convert the model again", path.display()))),
        v => Err(Error::unsupported(format!(
            "{}: container version {v} is newer than this engine, which reads version {VERSION}", path.display()))),
    }
}

impl Manifest {
    /// A manifest for trunk files already written in `dir` (their sums given), with the trunk
    /// index read from their headers. Tokenizer, encodings and source are left empty for the
    /// caller to fill in.
    pub fn new(dir: &Path, config_json: Json, trunk: Vec<(String, FileSum)>, banks: Vec<Bank>) -> Result<Manifest> {
        let config = ModelConfig::from_json(&dir.join(MANIFEST), &config_json)?;
        let (trunk_files, trunk_sums): (Vec<String>, Vec<FileSum>) = trunk.into_iter().unzip();
        let mut trunk_index = Vec::new();
        for name in &trunk_files {
            let st = SafeTensors::open(&dir.join(name))?;
            let mut tensors: Vec<&TensorInfo> = st.tensors.iter().collect();
            tensors.sort_by_key(|t| (t.offset, t.len));
            trunk_index.extend(tensors.into_iter().map(|t| TrunkTensor {
                name: t.name.clone(), file: name.clone(), dtype: t.dtype, shape: t.shape.clone(), begin: t.offset, end: t.offset + t.len,
            }));
        }
        Ok(Manifest {
            dir: dir.to_path_buf(), config, config_json, trunk_files, trunk_sums, trunk_index,
            tokenizer_kind: None, tokenizer_files: Vec::new(), other_files: Vec::new(),
            trunk_encoding: String::new(), expert_encoding: String::new(), banks, source: Json::Null,
        })
    }

    /// Reads and checks `dir/manifest.json`: its version, its architecture against its config,
    /// every trunk tensor of the index against the trunk files' headers (and each file's size),
    /// that the tokenizer and side files it lists exist, and that every bank file exists with
    /// the size its records need. The trunk CRC-32s are checked by [`Manifest::verify_trunk`].
    pub fn open(dir: &Path) -> Result<Manifest> {
        Manifest::open_within(dir, &super::json::Limits::default())
    }

    /// [`Manifest::open`] with the manifest and the trunk files' headers parsed within `limits`.
    pub(crate) fn open_within(dir: &Path, limits: &super::json::Limits) -> Result<Manifest> {
        Manifest::open_with_trunk(dir, limits).map(|(m, _)| m)
    }

    /// [`Manifest::open_within`], keeping the trunk files' headers it checked as the trunk's
    /// [`Checkpoint`]: opening a model reads each header once (issue 14), not once to check the
    /// manifest and again to load.
    pub(crate) fn open_with_trunk(dir: &Path, limits: &super::json::Limits) -> Result<(Manifest, Checkpoint)> {
        let path = dir.join(MANIFEST);
        let root = super::read_json_within(&path, 64 << 20, limits)?;
        let field = |k: &str| root.get(k).ok_or_else(|| Error::config(&path, k, "missing"));
        if field("format")?.as_str() != Some("waste-container") {
            return Err(Error::config(&path, "format", "is not `waste-container`"));
        }
        check_version(&path, field("version")?.as_u64().ok_or_else(|| Error::config(&path, "version", "not an integer"))?)?;
        let config_json = field("config")?.clone();
        let config = ModelConfig::from_json(&path, &config_json).map_err(|e| e.context("field `config`"))?;
        let arch = field("architecture")?.as_str().ok_or_else(|| Error::config(&path, "architecture", "not a string"))?;
        if arch != config.class {
            return Err(Error::config(&path, "architecture", format!("is `{arch}`, but the config's `architectures` names `{}`", config.class)));
        }
        let names = |v: Option<&Json>, k: &str| -> Result<Vec<String>> {
            let a = v.and_then(Json::as_array).ok_or_else(|| Error::config(&path, k, "missing or not a list"))?;
            a.iter().map(|v| v.as_str().ok_or_else(|| Error::config(&path, k, "not a list of strings"))
                .and_then(|s| plain_name(&path, k, s))).collect()
        };
        let (trunk_files, trunk_sums, trunk_index) = parse_trunk(&path, field("trunk")?)?;
        let tok = field("tokenizer")?;
        let tokenizer_kind = match tok.get("kind") {
            None => return Err(Error::config(&path, "tokenizer.kind", "missing")),
            Some(Json::Null) => None,
            Some(k) => Some(k.as_str().filter(|k| TOKENIZER_KINDS.contains(k)).ok_or_else(|| Error::config(&path, "tokenizer.kind",
                format!("{} is not null or one of {}", k.to_string_compact(), TOKENIZER_KINDS.join(", "))))?.to_string()),
        };
        let tokenizer_files = names(tok.get("files"), "tokenizer.files")?;
        let other_files = names(root.get("files"), "files")?;
        for (k, name) in tokenizer_files.iter().map(|n| ("tokenizer.files", n)).chain(other_files.iter().map(|n| ("files", n))) {
            if !dir.join(name).is_file() {
                return Err(Error::config(&path, k, format!("names `{name}`, which is not in {}", dir.display())));
            }
        }
        let enc = |k: &str| field(k).ok().and_then(|v| v.get("encoding")).and_then(Json::as_str).unwrap_or("").to_string();
        let mut banks = Vec::new();
        for (i, b) in field("banks")?.as_array().ok_or_else(|| Error::config(&path, "banks", "not a list"))?.iter().enumerate() {
            banks.push(parse_bank(&path, dir, i, b, &config)?);
        }
        let moe_layers: Vec<usize> = (0..config.layers).filter(|&l| config.is_moe_layer(l)).collect();
        let bank_layers: Vec<usize> = banks.iter().map(|b| b.layer).collect();
        if bank_layers != moe_layers {
            return Err(Error::config(&path, "banks", format!("banks cover layers {bank_layers:?}, the config's MoE layers are {moe_layers:?}")));
        }
        let m = Manifest {
            dir: dir.to_path_buf(),
            config,
            config_json,
            trunk_files,
            trunk_sums,
            trunk_index,
            tokenizer_kind,
            tokenizer_files,
            other_files,
            trunk_encoding: enc("trunk"),
            expert_encoding: enc("experts"),
            banks,
            source: root.get("source").cloned().unwrap_or(Json::Null),
        };
        let trunk = m.check_trunk_headers(limits)?;
        Ok((m, trunk))
    }

    /// Each trunk file's size and header against the manifest: the same tensors, each with the
    /// dtype, shape and byte range the index gives. Reads only the headers, and returns them.
    fn check_trunk_headers(&self, limits: &super::json::Limits) -> Result<Checkpoint> {
        let path = self.dir.join(MANIFEST);
        let mut files = Vec::with_capacity(self.trunk_files.len());
        for (name, sum) in self.trunk_files.iter().zip(&self.trunk_sums) {
            let st = SafeTensors::open_within(&self.dir.join(name), limits)?;
            if st.file_size != sum.bytes {
                return Err(Error::new(ErrorKind::Corrupt, format!(
                    "{}: trunk file is {} bytes, the manifest says {}", st.path.display(), st.file_size, sum.bytes)));
            }
            let listed: std::collections::HashMap<&str, &TrunkTensor> =
                self.trunk_index.iter().filter(|t| &t.file == name).map(|t| (t.name.as_str(), t)).collect();
            for t in &st.tensors {
                let Some(e) = listed.get(t.name.as_str()) else {
                    return Err(Error::new(ErrorKind::Corrupt, format!(
                        "{}: tensor `{}` is not in the trunk index of {}", st.path.display(), t.name, path.display())));
                };
                if (e.dtype, &e.shape, e.begin, e.end) != (t.dtype, &t.shape, t.offset, t.offset + t.len) {
                    return Err(Error::new(ErrorKind::Corrupt, format!(
                        "{}: trunk tensor `{}`: the index says {} {:?} at bytes {}..{} of {name}, the file's header says {} {:?} at bytes {}..{}",
                        path.display(), t.name, e.dtype, e.shape, e.begin, e.end, t.dtype, t.shape, t.offset, t.offset + t.len)));
                }
            }
            if let Some(missing) = self.trunk_index.iter().find(|t| &t.file == name && st.get(&t.name).is_none()) {
                return Err(Error::new(ErrorKind::Corrupt, format!(
                    "{}: trunk tensor `{}` is indexed in {name}, whose header does not have it", path.display(), missing.name)));
            }
            files.push(st);
        }
        Checkpoint::from_files(&self.dir, files)
    }

    /// Reads every trunk file once and checks its CRC-32 against the manifest (what `verify`
    /// adds at open: a pass over the trunk's bytes, which the load then reads again, mostly
    /// from the page cache).
    pub fn verify_trunk(&self) -> Result<()> {
        for (name, want) in self.trunk_files.iter().zip(&self.trunk_sums) {
            let p = self.dir.join(name);
            let got = FileSum::of_file(&p)?;
            if got != *want {
                return Err(Error::new(ErrorKind::Corrupt, format!(
                    "{}: trunk file has CRC-32 {:08x} over {} bytes, the manifest says {:08x} over {} bytes: it changed after conversion",
                    p.display(), got.crc32, got.bytes, want.crc32, want.bytes)));
            }
        }
        Ok(())
    }

    /// Checks that the tokenizer the container's files load as (its
    /// [`kind_name`](crate::Tokenizer::kind_name), `None` when none loads) is the one the
    /// manifest names.
    pub fn check_tokenizer(&self, loaded: Option<&str>) -> Result<()> {
        if self.tokenizer_kind.as_deref() == loaded {
            return Ok(());
        }
        Err(Error::config(&self.dir.join(MANIFEST), "tokenizer.kind", format!(
            "names {}, but the container's tokenizer files load as {}",
            self.tokenizer_kind.as_deref().unwrap_or("no tokenizer"), loaded.unwrap_or("no tokenizer"))))
    }

    /// The manifest as JSON (what [`Manifest::write`] stores).
    pub fn to_json(&self) -> Json {
        let files = |v: &[String]| Json::Array(v.iter().map(|s| Json::str(s.clone())).collect());
        let mut members = vec![
            ("format", Json::str("waste-container")),
            ("version", Json::uint(VERSION)),
            ("architecture", Json::str(self.config.class.clone())),
            ("config", self.config_json.clone()),
        ];
        if !self.source.is_null() {
            members.push(("source", self.source.clone()));
        }
        members.extend([
            ("trunk", Json::object([
                ("encoding", Json::str(self.trunk_encoding.clone())),
                ("files", Json::Array(self.trunk_files.iter().zip(&self.trunk_sums).map(|(n, s)| Json::object([
                    ("name", Json::str(n.clone())),
                    ("bytes", Json::uint(s.bytes)),
                    ("crc32", Json::uint(s.crc32 as u64)),
                ])).collect())),
                ("tensors", Json::Array(self.trunk_index.iter().map(|t| Json::object([
                    ("name", Json::str(t.name.clone())),
                    ("file", Json::str(t.file.clone())),
                    ("dtype", Json::str(t.dtype.name())),
                    ("shape", Json::Array(t.shape.iter().map(|&d| Json::uint(d)).collect())),
                    ("byte_range", Json::Array(vec![Json::uint(t.begin), Json::uint(t.end)])),
                ])).collect())),
            ])),
            ("experts", Json::object([
                ("encoding", Json::str(self.expert_encoding.clone())),
                ("record_align", Json::uint(RECORD_ALIGN as u64)),
                ("header_bytes", Json::uint(HEADER_BYTES as u64)),
            ])),
            ("tokenizer", Json::object([
                ("kind", self.tokenizer_kind.as_ref().map_or(Json::Null, |k| Json::str(k.clone()))),
                ("files", files(&self.tokenizer_files)),
            ])),
            ("files", files(&self.other_files)),
            ("banks", Json::Array(self.banks.iter().map(|b| Json::object([
                ("layer", Json::uint(b.layer as u64)),
                ("file", Json::str(b.file.clone())),
                ("experts", Json::uint(b.experts as u64)),
                ("record_bytes", Json::uint(b.layout.record_bytes as u64)),
                ("payload_bytes", Json::uint(b.layout.payload_bytes as u64)),
                ("matrices", b.layout.to_json()),
            ])).collect())),
        ]);
        Json::object(members)
    }

    /// Writes `dir/manifest.json` atomically (temporary file, fsync, rename).
    pub fn write(&self) -> Result<()> {
        super::safetensors::write_atomic(&self.dir.join(MANIFEST), self.to_json().to_string_pretty().as_bytes())
    }

    /// Path of a bank's file.
    pub fn bank_path(&self, bank: &Bank) -> PathBuf {
        self.dir.join(&bank.file)
    }

    /// Largest record of any bank (0 for a dense model).
    pub fn max_record_bytes(&self) -> usize {
        self.banks.iter().map(|b| b.layout.record_bytes).max().unwrap_or(0)
    }

    /// Bytes of all expert records.
    pub fn expert_bytes(&self) -> u64 {
        self.banks.iter().map(|b| (b.experts * b.layout.record_bytes) as u64).sum()
    }
}

/// The `trunk` object: its files with their sums, and the index of its tensors (each naming
/// one of those files, no name twice).
fn parse_trunk(path: &Path, trunk: &Json) -> Result<(Vec<String>, Vec<FileSum>, Vec<TrunkTensor>)> {
    let files = trunk.get("files").and_then(Json::as_array).ok_or_else(|| Error::config(path, "trunk.files", "missing or not a list"))?;
    let (mut names, mut sums) = (Vec::with_capacity(files.len()), Vec::with_capacity(files.len()));
    for (i, f) in files.iter().enumerate() {
        let k = |s: &str| format!("trunk.files[{i}].{s}");
        names.push(plain_name(path, &k("name"), f.get("name").and_then(Json::as_str).unwrap_or(""))?);
        let bytes = f.get("bytes").and_then(Json::as_u64).ok_or_else(|| Error::config(path, &k("bytes"), "missing or not an integer"))?;
        let crc32 = f.get("crc32").and_then(Json::as_u64).and_then(|c| u32::try_from(c).ok())
            .ok_or_else(|| Error::config(path, &k("crc32"), "missing or not a 32-bit unsigned integer"))?;
        sums.push(FileSum { bytes, crc32 });
    }
    let tensors = trunk.get("tensors").and_then(Json::as_array).ok_or_else(|| Error::config(path, "trunk.tensors", "missing or not a list"))?;
    let mut index = Vec::with_capacity(tensors.len());
    let mut seen = std::collections::HashSet::new();
    for (i, t) in tensors.iter().enumerate() {
        let k = |s: &str| format!("trunk.tensors[{i}].{s}");
        let name = t.get("name").and_then(Json::as_str).ok_or_else(|| Error::config(path, &k("name"), "missing or not a string"))?;
        if !seen.insert(name) {
            return Err(Error::config(path, &k("name"), format!("tensor `{name}` is indexed twice")));
        }
        let file = t.get("file").and_then(Json::as_str).filter(|f| names.iter().any(|n| n == f))
            .ok_or_else(|| Error::config(path, &k("file"), format!("tensor `{name}`: missing or not one of trunk.files")))?;
        let dtype = t.get("dtype").and_then(Json::as_str).and_then(DType::from_name)
            .ok_or_else(|| Error::config(path, &k("dtype"), format!("tensor `{name}`: missing or unknown")))?;
        let shape = t.get("shape").and_then(Json::as_array).and_then(|a| a.iter().map(Json::as_u64).collect::<Option<Vec<u64>>>())
            .ok_or_else(|| Error::config(path, &k("shape"), format!("tensor `{name}`: missing or not a list of integers")))?;
        let range = t.get("byte_range").and_then(Json::as_array).and_then(|a| a.iter().map(Json::as_u64).collect::<Option<Vec<u64>>>())
            .filter(|r| r.len() == 2 && r[0] <= r[1])
            .ok_or_else(|| Error::config(path, &k("byte_range"), format!("tensor `{name}`: missing or not [begin, end]")))?;
        index.push(TrunkTensor { name: name.to_string(), file: file.to_string(), dtype, shape, begin: range[0], end: range[1] });
    }
    Ok((names, sums, index))
}

fn parse_bank(path: &Path, dir: &Path, i: usize, b: &Json, cfg: &ModelConfig) -> Result<Bank> {
    let f = |k: &str| format!("banks[{i}].{k}");
    let num = |k: &str| b.get(k).and_then(Json::as_u64).map(|v| v as usize).ok_or_else(|| Error::config(path, &f(k), "missing or not an integer"));
    let layer = num("layer")?;
    let file = plain_name(path, &f("file"), b.get("file").and_then(Json::as_str).unwrap_or(""))?;
    let experts = num("experts")?;
    let record_bytes = num("record_bytes")?;
    let Some(moe) = cfg.moe.as_ref().filter(|_| cfg.is_moe_layer(layer)) else {
        return Err(Error::config(path, &f("layer"), format!("layer {layer} is not a MoE layer of the config")));
    };
    if experts != moe.experts {
        return Err(Error::config(path, &f("experts"), format!("{experts}, the config has {}", moe.experts)));
    }
    let mats = b.get("matrices").and_then(Json::as_array).filter(|m| m.len() == 3)
        .ok_or_else(|| Error::config(path, &f("matrices"), "missing or not 3 entries"))?;
    // MXFP4 is a record encoding only (no safetensors dtype string names it).
    let dtype = mats[0].get("dtype").and_then(Json::as_str).and_then(|s| DType::from_name(s).or((s == "MXFP4").then_some(DType::MXFP4)))
        .ok_or_else(|| Error::config(path, &f("matrices[0].dtype"), "missing or unknown"))?;
    // The layout's own error names no file: the manifest field that chose the encoding is it.
    let layout = RecordLayout::new(dtype, cfg.hidden, moe.expert_intermediate)
        .map_err(|e| Error::config(path, &f("matrices[0].dtype"), e.message()))?;
    for (j, (m, want)) in mats.iter().zip(layout.matrices).enumerate() {
        let got = (m.get("dtype").and_then(Json::as_str), m.get("rows").and_then(Json::as_u64), m.get("cols").and_then(Json::as_u64),
                   m.get("offset").and_then(Json::as_u64), m.get("bytes").and_then(Json::as_u64));
        let expect = (Some(want.dtype.name()), Some(want.rows as u64), Some(want.cols as u64), Some(want.offset as u64), Some(want.bytes as u64));
        if got != expect {
            return Err(Error::config(path, &f(&format!("matrices[{j}]")), format!("{got:?} disagrees with the config's expert shape {expect:?}")));
        }
    }
    if record_bytes != layout.record_bytes {
        return Err(Error::config(path, &f("record_bytes"), format!("{record_bytes}, the layout needs {}", layout.record_bytes)));
    }
    if b.get("payload_bytes").and_then(Json::as_u64) != Some(layout.payload_bytes as u64) {
        return Err(Error::config(path, &f("payload_bytes"), format!("missing or not {}, what the layout needs", layout.payload_bytes)));
    }
    let bank_path = dir.join(&file);
    let size = std::fs::metadata(&bank_path).map_err(|e| Error::io(&bank_path, &format!("open the bank of layer {layer}"), e))?.len();
    let want = (experts * record_bytes) as u64;
    if size < want {
        let complete = size / record_bytes as u64;
        return Err(Error::new(ErrorKind::Corrupt, format!(
            "{}: bank of layer {layer} is {size} bytes, expected {want} ({experts} records of {record_bytes}): expert {complete} is truncated",
            bank_path.display())));
    }
    if size > want {
        return Err(Error::new(ErrorKind::Corrupt, format!(
            "{}: bank of layer {layer} is {size} bytes, expected {want} ({experts} records of {record_bytes}): {} extra bytes follow the last record (expert {})",
            bank_path.display(), size - want, experts - 1)));
    }
    Ok(Bank { layer, file, experts, layout })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    #[test]
    fn records_are_aligned_and_checked() {
        let l = RecordLayout::new(DType::Q4B32, 64, 96).must();
        assert_eq!(l.record_bytes % RECORD_ALIGN, 0);
        assert!(l.matrices.iter().all(|m| m.offset % 64 == 0));
        let mut rec = vec![0u8; l.record_bytes];
        for (i, b) in rec[HEADER_BYTES..HEADER_BYTES + l.payload_bytes].iter_mut().enumerate() {
            *b = i as u8;
        }
        l.write_header(&mut rec, 3, 5);
        let p = Path::new("bank");
        l.check(&rec, p, 3, 5, true).must();
        assert!(l.check(&rec, p, 3, 6, true).unwrap_err().to_string().contains("layer 3 expert 6"));
        rec[HEADER_BYTES + 10] ^= 1;
        l.check(&rec, p, 3, 5, false).must();
        assert!(l.check(&rec, p, 3, 5, true).unwrap_err().to_string().contains("CRC"));
        rec[0] = b'X';
        assert!(l.check(&rec, p, 3, 5, false).unwrap_err().to_string().contains("magic"));
    }

    /// The bytes the layout says are zero are checked on every read, without `verify`.
    #[test]
    fn reserved_and_padding_bytes_must_be_zero() {
        let l = RecordLayout::new(DType::Q8B32, 64, 96).must();
        let end = HEADER_BYTES + l.payload_bytes;
        assert!(end < l.record_bytes, "the test needs padding after the payload");
        let fresh = || {
            let mut rec = vec![0u8; l.record_bytes];
            for m in &l.matrices {
                rec[m.offset..m.offset + m.bytes].fill(0x11);
            }
            l.write_header(&mut rec, 0, 2);
            rec
        };
        let p = Path::new("bank");
        l.check(&fresh(), p, 0, 2, true).must();
        for (at, what) in [(40 + 12, "reserved word"), (40 + 32 + 13, "reserved word"), (136, "header byte 136"), (255, "header byte 255"),
                           (end, "padding"), (l.record_bytes - 1, "padding")] {
            let mut rec = fresh();
            rec[at] = 1;
            let e = l.check(&rec, p, 0, 2, false).unwrap_err().to_string();
            assert!(e.contains(what) && e.contains("layer 0 expert 2"), "byte {at}: {e}");
        }
        // The alignment gap between two matrices.
        let g = RecordLayout::new(DType::BF16, 3, 5).must();
        let gap = g.matrices[0].offset + g.matrices[0].bytes;
        assert!(gap < g.matrices[1].offset);
        let mut rec = vec![0u8; g.record_bytes];
        g.write_header(&mut rec, 1, 0);
        g.check(&rec, p, 1, 0, true).must();
        rec[gap] = 7;
        g.write_header(&mut rec, 1, 0); // a valid CRC: only the zero check can catch it
        assert!(g.check(&rec, p, 1, 0, true).unwrap_err().to_string().contains("padding"));
        // A longer slot than the record: bytes past the record are not the record's.
        let mut slot = fresh();
        slot.extend_from_slice(&[0xFF; 100]);
        l.check(&slot, p, 0, 2, true).must();
    }
}
