//! The waste container: a directory that holds a model ready to stream. `docs/CONTAINER.md`
//! documents it for other implementations; this module reads and writes it.
//!
//! - `manifest.json` — format version, architecture, the model config, the trunk files, the
//!   tokenizer files, and one entry per expert bank. Written last, atomically: a directory
//!   without it is not a container.
//! - trunk files — safetensors (float, or the Q4B32/Q8B32 format, one width per file) holding
//!   every tensor that stays resident.
//! - one expert bank per MoE layer — records of `record_bytes` each, expert `e` at byte
//!   `e × record_bytes`. A record is a multiple of 4096 bytes and 4096-aligned, so one expert is
//!   one aligned read; it starts with a header the engine checks on every read.

use super::config::ModelConfig;
use super::crc32::crc32;
use super::dtype::DType;
use super::json::Json;
use crate::error::{Error, ErrorKind, Result};
use std::path::{Path, PathBuf};

/// The container format version this engine writes and reads.
pub const VERSION: u64 = 1;
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
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// Byte offset from the start of the record.
    pub offset: usize,
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
        _ => u32::MAX,
    }
}

fn dtype_of_code(c: u32) -> Option<DType> {
    [DType::F32, DType::BF16, DType::F16, DType::Q8B32, DType::Q4B32].get(c as usize).copied()
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
        h[8..12].copy_from_slice(&(VERSION as u32).to_le_bytes());
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
        if u32_at(8) as u64 != VERSION {
            return Err(bad(format!("record version {}, expected {VERSION}", u32_at(8))));
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
    pub layer: usize,
    /// File name inside the container.
    pub file: String,
    pub experts: usize,
    pub layout: RecordLayout,
}

/// The parsed manifest of a container.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub dir: PathBuf,
    pub config: ModelConfig,
    /// The config.json object as converted (kept verbatim).
    pub config_json: Json,
    pub trunk_files: Vec<String>,
    pub tokenizer_files: Vec<String>,
    /// Human-readable encodings: trunk, embeddings, experts (e.g. "q4", "q8", "bf16").
    pub trunk_encoding: String,
    pub expert_encoding: String,
    pub banks: Vec<Bank>,
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

impl Manifest {
    /// Reads and checks `dir/manifest.json`, and that every bank file it names exists with the
    /// size its records need.
    pub fn open(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST);
        let root = super::read_json(&path, 64 << 20)?;
        let field = |k: &str| root.get(k).ok_or_else(|| Error::config(&path, k, "missing"));
        if field("format")?.as_str() != Some("waste-container") {
            return Err(Error::config(&path, "format", "is not `waste-container`"));
        }
        let version = field("version")?.as_u64().ok_or_else(|| Error::config(&path, "version", "not an integer"))?;
        if version != VERSION {
            return Err(Error::unsupported(format!("{}: container version {version}; this engine reads version {VERSION}", path.display())));
        }
        let config_json = field("config")?.clone();
        let config = ModelConfig::from_json(&path, &config_json).map_err(|e| e.context("field `config`"))?;
        let names = |k: &str| -> Result<Vec<String>> {
            let a = field(k)?.get("files").and_then(Json::as_array).ok_or_else(|| Error::config(&path, &format!("{k}.files"), "missing or not a list"))?;
            a.iter().map(|v| v.as_str().ok_or_else(|| Error::config(&path, &format!("{k}.files"), "not a list of strings"))
                .and_then(|s| plain_name(&path, &format!("{k}.files"), s))).collect()
        };
        let trunk_files = names("trunk")?;
        let tokenizer_files = names("tokenizer")?;
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
        Ok(Manifest {
            dir: dir.to_path_buf(),
            config,
            config_json,
            trunk_files,
            tokenizer_files,
            trunk_encoding: enc("trunk"),
            expert_encoding: enc("experts"),
            banks,
        })
    }

    /// The manifest as JSON (what [`Manifest::write`] stores).
    pub fn to_json(&self) -> Json {
        let files = |v: &[String]| Json::Array(v.iter().map(|s| Json::str(s.clone())).collect());
        Json::object([
            ("format", Json::str("waste-container")),
            ("version", Json::uint(VERSION)),
            ("architecture", Json::str(self.config.class.clone())),
            ("config", self.config_json.clone()),
            ("trunk", Json::object([("encoding", Json::str(self.trunk_encoding.clone())), ("files", files(&self.trunk_files))])),
            ("experts", Json::object([
                ("encoding", Json::str(self.expert_encoding.clone())),
                ("record_align", Json::uint(RECORD_ALIGN as u64)),
                ("header_bytes", Json::uint(HEADER_BYTES as u64)),
            ])),
            ("tokenizer", Json::object([("files", files(&self.tokenizer_files))])),
            ("banks", Json::Array(self.banks.iter().map(|b| Json::object([
                ("layer", Json::uint(b.layer as u64)),
                ("file", Json::str(b.file.clone())),
                ("experts", Json::uint(b.experts as u64)),
                ("record_bytes", Json::uint(b.layout.record_bytes as u64)),
                ("payload_bytes", Json::uint(b.layout.payload_bytes as u64)),
                ("matrices", b.layout.to_json()),
            ])).collect())),
        ])
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
    let dtype = mats[0].get("dtype").and_then(Json::as_str).and_then(DType::from_name)
        .ok_or_else(|| Error::config(path, &f("matrices[0].dtype"), "missing or unknown"))?;
    let layout = RecordLayout::new(dtype, cfg.hidden, moe.expert_intermediate)?;
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
