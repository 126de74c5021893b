//! The quantizer behind `waste quantize`: turns an F32/BF16/F16 checkpoint directory (one file
//! or shards) into a Q4B32 or Q8B32 one (seed 000, "Producing and checking a checkpoint"),
//! tensor by tensor and a few MiB at a time, so a model larger than RAM can be converted.
//!
//! What is quantized: every 2-D tensor — the projections, the embeddings and an untied LM head
//! alike — because the seed's file rule is that every 2-D tensor of the file has the width's
//! dtype (its SmolLM2-135M run counts 211 quantized tensors: 30 × 7 projections plus the tied
//! embeddings). 1-D tensors (norm weights, biases) keep their type; an F16 one is widened to
//! F32 (exact) because the seed lists BF16 and F32 as the types a norm weight keeps. Tensors of
//! other ranks are copied unchanged. A 2-D tensor whose columns are not a multiple of 32 is
//! refused before anything is written: the format has no partial block.
//!
//! The output directory receives `model.safetensors` and copies of `config.json`,
//! `generation_config.json` and the tokenizer files, so the runtime opens it as it is.

use crate::format::dtype::{DType, BLOCK};
use crate::format::quant::{self, Width};
use crate::format::safetensors::{Checkpoint, SafeTensors, TempFile, TensorInfo, TensorSpec, Writer};
use crate::format::sha256;
use crate::error::{Error, ErrorKind, Result};
use std::path::{Path, PathBuf};

/// The name of the file the quantizer writes.
pub const OUTPUT_FILE: &str = "model.safetensors";

/// Files copied next to the weights when present (plus `*.tiktoken` and `tok*.bin`).
const SIDECARS: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
];

/// Source bytes read per piece while converting (whole rows, at least one).
const PIECE_BYTES: u64 = 4 << 20;

/// What a quantization run did: the figures of the seed's two `QUANT` lines.
#[derive(Clone, Debug)]
pub struct QuantizeReport {
    /// The weight file written.
    pub model: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Total size of the source weight files.
    pub source_bytes: u64,
    /// Tensors written.
    pub tensors: usize,
    /// Of those, quantized (the 2-D matrices).
    pub quantized: usize,
    /// Of those, kept in a float type (vectors, embeddings).
    pub kept: usize,
    /// The block width written.
    pub width: Width,
    /// SHA-256 of the written file.
    pub digest: [u8; 32],
    /// The side files copied next to it (names).
    pub copied: Vec<String>,
}

impl QuantizeReport {
    /// bytes / source_bytes.
    pub fn ratio(&self) -> f64 {
        self.bytes as f64 / self.source_bytes.max(1) as f64
    }

    /// The seed's two `QUANT` lines, without newlines.
    pub fn lines(&self) -> [String; 2] {
        [
            format!("QUANT model={} bytes={} source_bytes={} tensors={} quantized={} kept={} bits={} block={} scale={}",
                self.model.display(), self.bytes, self.source_bytes, self.tensors, self.quantized, self.kept,
                self.width.bits(), quant::META_BLOCK, quant::META_SCALE),
            format!("QUANT ratio={:.3} digest={}", self.ratio(), sha256::hex(&self.digest)),
        ]
    }
}

/// How one source tensor becomes an output tensor.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    Quantize,
    /// 1-D F16 → F32.
    Widen,
    Copy,
}

/// Quantizes the checkpoint in `input` (a directory, or one `.safetensors` file) into
/// `output/model.safetensors` and copies the config and tokenizer files beside it.
/// A failed run removes `output` if it created it, and says so.
pub fn quantize_checkpoint(input: &Path, output: &Path, width: Width) -> Result<QuantizeReport> {
    let created = !output.exists();
    quantize_into(input, output, width).map_err(|e| super::clean_up_output(output, created, None, e))
}

fn quantize_into(input: &Path, output: &Path, width: Width) -> Result<QuantizeReport> {
    let ckpt = Checkpoint::open(input)?;
    if let Some(w) = ckpt.width() {
        return Err(Error::unsupported(format!(
            "{}: the checkpoint is already quantized ({}); quantize the floating point one",
            input.display(), w.format_name())));
    }
    let plan = plan(&ckpt, width)?;
    prepare_output(&ckpt.dir, output)?;
    let path = output.join(OUTPUT_FILE);
    let specs: Vec<TensorSpec> = plan.iter().map(|(_, _, _, s)| s.clone()).collect();
    // A name of its own: two runs writing one directory must not share a temporary file.
    let mut w = Writer::create_unique(&path, &specs, &width.metadata())?;
    for (st, t, action, _) in &plan {
        match action {
            Action::Quantize => quantize_tensor(&mut w, st, t, width)?,
            Action::Widen => widen_tensor(&mut w, st, t)?,
            Action::Copy => copy_tensor(&mut w, st, t)?,
        }
    }
    // The weights stay under their temporary name (removed if anything below fails) until
    // they are checked and the side files are in place: a failed run never leaves weights
    // without their config, nor a stray temporary file.
    let pending = w.finish_pending()?;
    // Re-open the result: the reader's header rules apply to what we wrote.
    let written = SafeTensors::open(pending.temp_path())?;
    if written.width != Some(width) {
        return Err(Error::format(&path, "the written file does not declare the requested width"));
    }
    let bytes = written.file_size;
    drop(written);
    let digest = sha256::digest_file(pending.temp_path())?;
    let copied = copy_sidecars(&ckpt.dir, output)?;
    pending.commit()?;
    let quantized = plan.iter().filter(|p| p.2 == Action::Quantize).count();
    Ok(QuantizeReport {
        digest,
        model: path,
        bytes,
        source_bytes: ckpt.file_bytes(),
        tensors: plan.len(),
        quantized,
        kept: plan.len() - quantized,
        width,
        copied,
    })
}

type Plan<'a> = Vec<(&'a SafeTensors, &'a TensorInfo, Action, TensorSpec)>;

/// Decides every tensor's fate and refuses the checkpoint, before anything is written, when a
/// 2-D tensor cannot be quantized.
fn plan(ckpt: &Checkpoint, width: Width) -> Result<Plan<'_>> {
    let mut out = Vec::new();
    let mut ragged: Vec<(&Path, &TensorInfo)> = Vec::new();
    for (st, t) in ckpt.tensors() {
        let float = matches!(t.dtype, DType::F32 | DType::BF16 | DType::F16);
        let (action, dtype) = match t.shape.len() {
            2 if !float => {
                return Err(Error::new(ErrorKind::Unsupported, format!(
                    "{}: tensor `{}` is a 2-D {} tensor; only F32, BF16 and F16 matrices can be quantized, \
                     and a {} file stores every 2-D tensor as {}",
                    st.path.display(), t.name, t.dtype, width.format_name(), width.dtype())));
            }
            2 => {
                if t.shape[1] % BLOCK as u64 != 0 {
                    ragged.push((&st.path, t));
                }
                (Action::Quantize, width.dtype())
            }
            1 if t.dtype == DType::F16 => (Action::Widen, DType::F32),
            _ => (Action::Copy, t.dtype),
        };
        out.push((st, t, action, TensorSpec { name: t.name.clone(), dtype, shape: t.shape.clone() }));
    }
    if let Some((path, t)) = ragged.first() {
        let more = match ragged.len() {
            1 => String::new(),
            n => format!(" ({} more tensors have the same problem, e.g. `{}`)", n - 1, ragged[ragged.len() - 1].1.name),
        };
        return Err(Error::new(ErrorKind::Unsupported, format!(
            "{}: tensor `{}` has shape {:?}: its {} columns are not a multiple of {BLOCK}, and the {} format has \
             no partial block, so this checkpoint cannot be quantized{more}",
            path.display(), t.name, t.shape, t.shape[1], width.dtype())));
    }
    Ok(out)
}

/// Creates the output directory and refuses one that would shadow or overwrite the source.
fn prepare_output(input_dir: &Path, output: &Path) -> Result<()> {
    std::fs::create_dir_all(output).map_err(|e| Error::io(output, "create directory", e))?;
    let same = match (input_dir.canonicalize(), output.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Err(Error::arg(format!(
            "--out {} is the input directory; write the quantized checkpoint to another one", output.display())));
    }
    let index = output.join("model.safetensors.index.json");
    if index.exists() {
        return Err(Error::arg(format!(
            "{} exists: the runtime would read its shards instead of the quantized file; use an empty directory",
            index.display())));
    }
    Ok(())
}

/// Streams a 2-D float tensor through the block encoder, a few MiB of rows at a time.
fn quantize_tensor(w: &mut Writer, st: &SafeTensors, t: &TensorInfo, width: Width) -> Result<()> {
    let (rows, cols) = (t.shape[0], t.shape[1] as usize);
    let src_row = t.dtype.row_bytes(cols as u64).unwrap_or(0);
    let out_row = cols / BLOCK * width.block_bytes();
    if src_row == 0 || rows == 0 {
        return Ok(());
    }
    let rows_per_piece = (PIECE_BYTES / src_row).max(1);
    let mut src = Vec::new();
    let mut out = Vec::new();
    let mut row_f32 = vec![0.0f32; cols];
    let mut r0 = 0u64;
    while r0 < rows {
        let n = rows_per_piece.min(rows - r0);
        src.resize((n * src_row) as usize, 0);
        out.resize(n as usize * out_row, 0);
        crate::sys::read_exact_at(&st.file, &st.path, &mut src, t.offset + r0 * src_row)
            .map_err(|e| e.context(format!("tensor `{}`", t.name)))?;
        for (i, (dst, raw)) in out.chunks_exact_mut(out_row).zip(src.chunks_exact(src_row as usize)).enumerate() {
            widen_row(t.dtype, raw, &mut row_f32);
            quant::encode_row(width, &row_f32, dst).map_err(|(b, e)| Error::format(&st.path, format!(
                "tensor `{}`: row {}, block {b} (columns {}..{}): {e}; the block cannot be quantized",
                t.name, r0 + i as u64, b * BLOCK, (b + 1) * BLOCK)))?;
        }
        w.write(&out)?;
        r0 += n;
    }
    Ok(())
}

/// Copies a tensor's bytes unchanged.
fn copy_tensor(w: &mut Writer, st: &SafeTensors, t: &TensorInfo) -> Result<()> {
    let mut buf = Vec::new();
    let mut done = 0u64;
    while done < t.len {
        let n = PIECE_BYTES.min(t.len - done);
        buf.resize(n as usize, 0);
        crate::sys::read_exact_at(&st.file, &st.path, &mut buf, t.offset + done)
            .map_err(|e| e.context(format!("tensor `{}`", t.name)))?;
        w.write(&buf)?;
        done += n;
    }
    Ok(())
}

/// Writes a 1-D F16 tensor as F32 (every binary16 value is exact in binary32).
fn widen_tensor(w: &mut Writer, st: &SafeTensors, t: &TensorInfo) -> Result<()> {
    let mut raw = vec![0u8; t.len as usize];
    st.read_into(t, &mut raw)?;
    let mut out = Vec::with_capacity(raw.len() * 2);
    for pair in raw.chunks_exact(2) {
        out.extend_from_slice(&half::f16::from_bits(u16::from_le_bytes([pair[0], pair[1]])).to_f32().to_le_bytes());
    }
    w.write(&out)
}

/// Widens one stored row of F32, BF16 or F16 values to f32.
fn widen_row(dtype: DType, raw: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        _ => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
    }
}

/// True for the tokenizer and config files the runtime reads from a model directory.
fn is_sidecar(name: &str) -> bool {
    SIDECARS.contains(&name) || name.ends_with(".tiktoken") || (name.starts_with("tok") && name.ends_with(".bin"))
}

/// Copies the side files of `from` into `to` (each atomically); returns their names, sorted.
fn copy_sidecars(from: &Path, to: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(from).map_err(|e| Error::io(from, "list directory", e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(from, "list directory", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_sidecar(&name) && entry.path().is_file() {
            names.push(name);
        }
    }
    names.sort();
    for name in &names {
        copy_atomic(&from.join(name), &to.join(name))?;
    }
    Ok(names)
}

/// Copies one file under a temporary name, syncs it and renames it into place (the temporary
/// file is removed if any step fails).
fn copy_atomic(src: &Path, dst: &Path) -> Result<()> {
    let mut input = std::fs::File::open(src).map_err(|e| Error::io(src, "open", e))?;
    let mut out = TempFile::create(dst)?;
    std::io::copy(&mut input, out.file()).map_err(|e| Error::io(dst, &format!("copy {} into", src.display()), e))?;
    out.commit().map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_names() {
        for n in ["config.json", "generation_config.json", "tokenizer.json", "tok512.bin", "tokenizer.bin",
                  "cl100k_base.tiktoken", "vocab.json", "merges.txt", "tokenizer.model"] {
            assert!(is_sidecar(n), "{n}");
        }
        for n in ["model.safetensors", "model.safetensors.index.json", "README.md", "pytorch_model.bin"] {
            assert!(!is_sidecar(n), "{n}");
        }
    }
}
