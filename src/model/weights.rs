//! The resident weights of a decoder: every tensor read once into owned, 64-byte-aligned
//! memory in its stored dtype, its shape checked against the config. Norm weights and biases
//! are small and widened to f32 at load.
//!
//! Owned memory (not a file mapping) makes the bytes the engine holds exact: the RAM budget
//! counts them, and nothing is paged in behind its back.

use crate::error::{Error, ErrorKind, Result};
use crate::format::config::{Arch, Mixer, ModelConfig, QkNorm};
use crate::format::dtype::DType;
use crate::format::safetensors::Checkpoint;
use crate::kernels::{scalar, MatRef};
use crate::sys::AlignedBuf;
use super::disk_rows::DiskRows;
use super::moe::MoeWeights;

/// A weight matrix in its stored dtype.
pub struct Matrix {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    buf: AlignedBuf,
}

impl Matrix {
    /// A borrowed view for the kernels.
    pub fn view(&self) -> MatRef<'_> {
        MatRef { dtype: self.dtype, rows: self.rows, cols: self.cols, data: self.buf.as_slice() }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// Widens row `r` to f32.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        scalar::row_to_f32(&self.view(), r, out)
    }
}

/// The token embeddings: held, or read a row at a time from the trunk file when the experts
/// stream and the head is not tied to them ([`super::disk_rows`]).
pub enum Embedding {
    Resident(Matrix),
    OnDisk(DiskRows),
}

impl Embedding {
    /// Widens the embedding of token `id` to f32 into `out`.
    pub fn row_f32(&self, id: usize, out: &mut [f32]) -> Result<()> {
        match self {
            Embedding::Resident(m) if id < m.rows => {
                m.row_f32(id, out);
                Ok(())
            }
            Embedding::Resident(m) => Err(Error::new(ErrorKind::Tensor, format!(
                "token id {id} is past the embedding table's {} rows", m.rows))),
            Embedding::OnDisk(d) => d.row_f32(id, out),
        }
    }
}

/// A linear layer: y = x·Wᵀ (+ b).
pub struct Linear {
    pub w: Matrix,
    pub b: Option<Vec<f32>>,
}

/// One decoder layer's attention weights.
pub struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Qwen3-Next: the output gate's rows of q_proj [q_dim, hidden] (the attention output is
    /// multiplied by σ(h·Wᵀ) before o_proj).
    pub gate: Option<Matrix>,
    /// gpt-oss's attention sinks: one logit per head in the softmax's denominator.
    pub sinks: Option<Vec<f32>>,
}

/// A SwiGLU MLP (spec §0.4).
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// The feed-forward half of a layer.
// One per layer, read on every token: the MoE variant's 200 extra bytes cost less than a box's
// indirection would.
#[allow(clippy::large_enum_variant)]
pub enum Ffn {
    Dense(Mlp),
    /// Router and shared expert; the routed experts live in [`super::experts::Experts`].
    Moe(MoeWeights),
}

/// What mixes tokens in a layer (spec §0.2): attention, MLA (DeepSeek, Kimi) or KDA (Kimi). The
/// rarer, larger kinds are boxed; attention stays inline, as every layer of most models has it.
#[allow(clippy::large_enum_variant)]
pub enum MixerWeights {
    Attention(Attention),
    Mla(Box<super::mla::MlaWeights>),
    Kda(Box<super::kda::KdaWeights>),
    Gdn(Box<super::gdn::GdnWeights>),
}

/// One decoder layer.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub attn: MixerWeights,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
}

/// All resident weights.
pub struct Weights {
    pub embed: Embedding,
    pub layers: Vec<Layer>,
    pub norm: Vec<f32>,
    /// `None` when the head is tied to the embeddings.
    pub head: Option<Matrix>,
    /// Total bytes held.
    pub bytes: u64,
    /// Number of parameters (elements).
    pub params: u64,
    /// Distinct stored dtypes of every tensor loaded (matrices and vectors), for `info`.
    pub dtypes: Vec<DType>,
}

impl Weights {
    /// The LM head matrix (the embeddings when tied, which are then always resident).
    pub fn head(&self) -> &Matrix {
        match (&self.head, &self.embed) {
            (Some(m), _) | (None, Embedding::Resident(m)) => m,
            (None, Embedding::OnDisk(_)) => unreachable!("a tied head keeps the embeddings resident (load_trunk)"),
        }
    }
}

/// Reads tensors by name from a checkpoint, checking shapes and counting bytes. A counting
/// loader checks and counts the same tensors without reading or allocating them: the memory
/// plan walks the model through it, so plan and open can never list different tensors.
pub struct Loader<'a> {
    ckpt: &'a Checkpoint,
    /// Only check and count (no reads, empty buffers).
    counting: bool,
    pub bytes: u64,
    pub params: u64,
    pub dtypes: Vec<DType>,
    /// The FP8 block size from the config (`quantization_config.weight_block_size`): F8_E4M3
    /// weights are read with their scales and decoded to f32, or kept as F8B32 expert records
    /// (`format::fp8`); without it they are refused.
    pub fp8_block: Option<[usize; 2]>,
    /// Read the embeddings a row at a time instead of holding them, when the head is not tied
    /// to them (set where the experts stream: [`streams_embeddings`]); `direct_io` as for the
    /// experts' reads.
    pub embeddings_on_disk: Option<bool>,
    /// Bytes of the tensors read a row at a time instead of held (not in `bytes`).
    pub disk_bytes: u64,
}

/// True when a model's embeddings are read a row at a time: its experts stream from a
/// container's banks (the plan and the open both ask this, so they count the same bytes).
pub fn streams_embeddings(manifest: Option<&crate::format::container::Manifest>) -> bool {
    manifest.is_some_and(|m| !m.banks.is_empty())
}

impl<'a> Loader<'a> {
    pub fn new(ckpt: &'a Checkpoint) -> Loader<'a> {
        Loader { ckpt, counting: false, bytes: 0, params: 0, dtypes: Vec::new(), fp8_block: None, embeddings_on_disk: None, disk_bytes: 0 }
    }

    /// A loader that checks and counts without reading (for the memory plan).
    pub fn counting(ckpt: &'a Checkpoint) -> Loader<'a> {
        Loader { counting: true, ..Loader::new(ckpt) }
    }

    /// True for a counting loader.
    pub fn is_counting(&self) -> bool {
        self.counting
    }

    fn find(&self, name: &str) -> Result<(&'a crate::format::safetensors::SafeTensors, &'a crate::format::safetensors::TensorInfo)> {
        self.ckpt.get(name).ok_or_else(|| Error::new(ErrorKind::Tensor, format!(
            "{}: tensor `{name}` is missing (not in {})", self.ckpt.dir.display(), self.ckpt.file_names())))
    }

    /// The checkpoint's directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.ckpt.dir
    }

    /// True when the checkpoint has a tensor named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.ckpt.get(name).is_some()
    }

    /// A 2-D matrix of `[rows, cols]` in a compute dtype.
    pub fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let (file, t) = self.find(name)?;
        if t.shape != [rows as u64, cols as u64] {
            return Err(Error::new(ErrorKind::Tensor, format!(
                "{}: tensor `{name}` has shape {:?}, the config needs [{rows}, {cols}]", file.path.display(), t.shape)));
        }
        if t.dtype == DType::F8E4M3 {
            return self.fp8_matrix(name, rows, cols);
        }
        if !t.dtype.is_compute() || t.dtype == DType::F8B32 {
            return Err(Error::new(ErrorKind::Unsupported, format!(
                "{}: tensor `{name}` has dtype {}, which the engine does not compute with (F32, BF16, F16, Q8B32, Q4B32)",
                file.path.display(), t.dtype)));
        }
        let buf = if self.counting {
            AlignedBuf::zeroed(0, 64)?
        } else {
            let mut buf = AlignedBuf::zeroed(t.len as usize, 64)?;
            file.read_into(t, buf.as_mut_slice())?;
            // The header rules were checked when the file was opened; the block scales are
            // checked here, where the bytes are read anyway (seed 000: a non-finite scale is
            // refused).
            crate::format::quant::check_scales(&file.path, t, 0, buf.as_slice())?;
            buf
        };
        self.bytes += t.len;
        self.params += t.elements();
        self.note_dtype(t.dtype);
        Ok(Matrix { dtype: t.dtype, rows, cols, buf })
    }

    /// The embedding table `[rows, cols]`: resident, or with `embeddings_on_disk` read a row at
    /// a time, holding only the row buffer (counted). A counting loader checks and counts the
    /// same without opening anything.
    fn embedding(&mut self, name: &str, rows: usize, cols: usize, tied: bool) -> Result<Embedding> {
        let Some(direct_io) = self.embeddings_on_disk.filter(|_| !tied) else {
            return Ok(Embedding::Resident(self.matrix(name, rows, cols)?));
        };
        let (file, t) = self.find(name)?;
        if t.shape != [rows as u64, cols as u64] || !t.dtype.is_compute() || matches!(t.dtype, DType::F8B32 | DType::F8E4M3) {
            // Refused (or, for FP8, decoded and held) exactly as a resident table would be.
            return Ok(Embedding::Resident(self.matrix(name, rows, cols)?));
        }
        let disk = if self.counting { None } else { Some(DiskRows::open(file, t, direct_io)?) };
        self.bytes += DiskRows::buffer_bytes(t);
        self.disk_bytes += t.len;
        self.params += t.elements();
        self.note_dtype(t.dtype);
        Ok(match disk {
            Some(d) => Embedding::OnDisk(d),
            None => Embedding::Resident(Matrix { dtype: t.dtype, rows, cols, buf: AlignedBuf::zeroed(0, 64)? }),
        })
    }

    /// An F8_E4M3 weight and its `_scale_inv` (spec §3.9), checked against the config's block
    /// size and decoded exactly to f32: `[rows, cols]` f32 is what is held (and counted).
    fn fp8_matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let bytes = rows * cols * 4;
        let buf = if self.counting {
            self.fp8_source(name, rows, cols, DType::F32, &mut [])?;
            AlignedBuf::zeroed(0, 64)?
        } else {
            let mut buf = AlignedBuf::zeroed(bytes, 64)?;
            self.fp8_source(name, rows, cols, DType::F32, buf.as_mut_slice())?;
            buf
        };
        self.bytes += bytes as u64;
        self.params += (rows * cols) as u64;
        self.note_dtype(DType::F8E4M3);
        Ok(Matrix { dtype: DType::F32, rows, cols, buf })
    }

    /// True when F8_E4M3 expert matrices of these widths can be kept as F8B32 records
    /// (`format::fp8`): the config gives a block size, and both widths and the block's columns
    /// are whole 32-column blocks.
    pub fn fp8_keeps(&self, hidden: usize, inter: usize) -> bool {
        self.fp8_block.is_some_and(|b| [hidden, inter].iter().all(|&c| crate::format::fp8::f8b32_problem("", c, b).is_none()))
    }

    /// Checks F8_E4M3 weight `name` ([rows, cols]) and its scale tensor, and unless counting
    /// writes it into `out`: as F8B32 rows when `dtype` is F8B32, else decoded to little-endian f32.
    fn fp8_source(&self, name: &str, rows: usize, cols: usize, dtype: DType, out: &mut [u8]) -> Result<()> {
        use crate::format::fp8;
        let (file, t) = self.find(name)?;
        let block = self.fp8_block.ok_or_else(|| Error::new(ErrorKind::Unsupported, format!(
            "{}: tensor `{name}` has dtype F8_E4M3, but config.json has no FP8 quantization_config (weight_block_size) to read it with",
            file.path.display())))?;
        let (sfile, s) = self.ckpt.get(&fp8::scale_name(name)).ok_or_else(|| fp8::missing_scale(&self.ckpt.dir, name))?;
        fp8::check_scale_tensor(&sfile.path, name, rows, cols, block, s)?;
        if self.counting {
            return Ok(());
        }
        let mut raw = vec![0u8; s.len as usize];
        sfile.read_into(s, &mut raw)?;
        let scales = fp8::scales_of(&raw);
        drop(raw);
        if dtype != DType::F8B32 {
            // Decoded to f32: the codes are read into the last quarter of `out` and widened in
            // place, so no copy of them is held beside the matrix (the open's peak stays under
            // the plan's floor, tests/accounting.rs).
            let n = rows * cols;
            if out.len() != 4 * n {
                return Err(Error::new(ErrorKind::Tensor, format!("{}: tensor `{name}`: buffer of {} bytes for {n} f32 values", file.path.display(), out.len())));
            }
            file.read_into(t, &mut out[3 * n..])?;
            return fp8::dequantize_widen(&file.path, name, [rows, cols], block, &scales, out);
        }
        let mut codes = vec![0u8; t.len as usize];
        file.read_into(t, &mut codes)?;
        let src = fp8::Fp8Tensor { path: &file.path, name, rows, cols, block, codes: &codes, scales: &scales };
        fp8::encode_f8b32(&src, out)
    }

    /// The checkpoint being read (gpt-oss reads its fused experts through it).
    pub fn checkpoint(&self) -> &'a Checkpoint {
        self.ckpt
    }

    /// Records a stored dtype (once, in the order first met).
    pub(crate) fn note_dtype(&mut self, d: DType) {
        if !self.dtypes.contains(&d) {
            self.dtypes.push(d);
        }
    }

    /// The stored dtype of tensor `name`.
    pub fn dtype_of(&self, name: &str) -> Result<DType> {
        Ok(self.find(name)?.1.dtype)
    }

    /// Reads matrix `name` of `[rows, cols]` and `dtype` into `out` (a slice of a record; unused
    /// by a counting loader).
    pub fn read_matrix_into(&mut self, name: &str, rows: usize, cols: usize, dtype: DType, out: &mut [u8]) -> Result<()> {
        let (file, t) = self.find(name)?;
        // FP8 experts of a Hugging Face directory are held as F8B32 records, or decoded to f32
        // where F8B32 cannot hold them (`experts::load_resident`).
        if t.dtype == DType::F8E4M3 && matches!(dtype, DType::F8B32 | DType::F32) && t.shape == [rows as u64, cols as u64] {
            self.fp8_source(name, rows, cols, dtype, out)?;
            self.params += t.elements();
            self.note_dtype(t.dtype);
            return Ok(());
        }
        if t.shape != [rows as u64, cols as u64] || t.dtype != dtype {
            return Err(Error::new(ErrorKind::Tensor, format!(
                "{}: tensor `{name}` is {} {:?}, expected {dtype} [{rows}, {cols}] like the layer's other experts",
                file.path.display(), t.dtype, t.shape)));
        }
        if !self.counting {
            file.read_into(t, out)?;
            // As for the trunk's matrices (`Loader::matrix`): an expert's block scales are
            // checked where its bytes are read, so a NaN or infinite scale never reaches the
            // kernels.
            crate::format::quant::check_scales(&file.path, t, 0, out)?;
        }
        self.params += t.elements();
        self.note_dtype(t.dtype);
        Ok(())
    }

    /// A 1-D vector of `len` values widened to f32 (norm weights, biases).
    pub fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let (file, t) = self.find(name)?;
        if t.shape != [len as u64] {
            return Err(Error::new(ErrorKind::Tensor, format!(
                "{}: tensor `{name}` has shape {:?}, the config needs [{len}]", file.path.display(), t.shape)));
        }
        self.vector_of(file, t, name, len)
    }

    /// Reads the `len` values of a shape-checked small tensor, widened to f32.
    fn vector_of(&mut self, file: &crate::format::safetensors::SafeTensors, t: &crate::format::safetensors::TensorInfo,
                 name: &str, len: usize) -> Result<Vec<f32>> {
        if !matches!(t.dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(Error::new(ErrorKind::Tensor, format!(
                "{}: tensor `{name}` has dtype {}; a 1-D weight must be F32, BF16 or F16", file.path.display(), t.dtype)));
        }
        self.bytes += (len * 4) as u64;
        self.note_dtype(t.dtype);
        if self.counting {
            self.params += len as u64;
            return Ok(Vec::new());
        }
        let mut raw = vec![0u8; t.len as usize];
        file.read_into(t, &mut raw)?;
        let m = MatRef { dtype: t.dtype, rows: 1, cols: len, data: &raw };
        let mut out = vec![0.0f32; len];
        scalar::row_to_f32(&m, 0, &mut out);
        self.params += len as u64;
        Ok(out)
    }

    /// A small tensor of one of `shapes` (KDA's A_log as [H] or [1, 1, H, 1], conv kernels as
    /// [C, 1, K]), flattened and widened to f32 like [`Loader::vector`].
    pub fn flat_vector(&mut self, name: &str, shapes: &[&[u64]]) -> Result<Vec<f32>> {
        let (file, t) = self.find(name)?;
        if !shapes.iter().any(|s| t.shape == *s) {
            return Err(Error::new(ErrorKind::Tensor, format!(
                "{}: tensor `{name}` has shape {:?}, the config needs one of {shapes:?}", file.path.display(), t.shape)));
        }
        let len = t.elements() as usize;
        self.vector_of(file, t, name, len)
    }

    /// A linear layer `prefix.weight` (+ `prefix.bias` when `bias`).
    pub fn linear(&mut self, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        let w = self.matrix(&format!("{prefix}.weight"), out, inp)?;
        let b = if bias { Some(self.vector(&format!("{prefix}.bias"), out)?) } else { None };
        Ok(Linear { w, b })
    }

    /// A SwiGLU MLP whose matrices are `prefix.{gate,up,down}` with the given names.
    pub fn mlp(&mut self, prefix: &str, names: [&str; 3], hidden: usize, inter: usize, bias: bool) -> Result<Mlp> {
        Ok(Mlp {
            gate: self.linear(&format!("{prefix}.{}", names[0]), inter, hidden, bias)?,
            up: self.linear(&format!("{prefix}.{}", names[1]), inter, hidden, bias)?,
            down: self.linear(&format!("{prefix}.{}", names[2]), hidden, inter, bias)?,
        })
    }
}

/// Loads the resident weights of a decoder (spec §1.2, §2): everything but the routed experts.
pub fn load_trunk(ld: &mut Loader, cfg: &ModelConfig) -> Result<Weights> {
    ld.fp8_block = cfg.fp8_block();
    let h = cfg.hidden;
    // Spec §0.2 step 4: the file's lm_head wins; otherwise tie, which needs tie_word_embeddings.
    let tied = !ld.has("lm_head.weight");
    let embed = ld.embedding("model.embed_tokens.weight", cfg.vocab, h, tied)?;
    let mut layers = Vec::with_capacity(cfg.layers);
    for l in 0..cfg.layers {
        let p = format!("model.layers.{l}");
        // DeepSeek and Kimi layers (spec §3.2, §4.2) are read by their own modules.
        let (attn, ffn) = match (cfg.mixer(l), cfg.mla.as_ref()) {
            (Mixer::Mla, Some(m)) => (MixerWeights::Mla(Box::new(super::mla::load(ld, cfg, m, &p)?)), super::latent::load_ffn(ld, cfg, l)?),
            (Mixer::Kda, Some(m)) => {
                let kda = m.kda.as_ref().ok_or_else(|| Error::new(ErrorKind::Config, format!("layer {l} is KDA without a KDA config")))?;
                (MixerWeights::Kda(Box::new(super::kda::load(ld, cfg, kda, &p)?)), super::latent::load_ffn(ld, cfg, l)?)
            }
            (_, _) if cfg.is_gdn_layer(l) => {
                let g = cfg.gdn.as_ref().ok_or_else(|| Error::new(ErrorKind::Config, format!("layer {l} is linear without a GDN config")))?;
                (MixerWeights::Gdn(Box::new(super::gdn::load(ld, cfg, g, &p)?)), load_ffn(ld, cfg, &p, l)?)
            }
            _ => (MixerWeights::Attention(load_attention(ld, cfg, &p)?), load_ffn(ld, cfg, &p, l)?),
        };
        layers.push(Layer {
            attn_norm: norm_weight(ld, cfg, &format!("{p}.input_layernorm.weight"), h)?,
            attn,
            ffn_norm: norm_weight(ld, cfg, &format!("{p}.post_attention_layernorm.weight"), h)?,
            ffn,
        });
    }
    let norm = norm_weight(ld, cfg, "model.norm.weight", h)?;
    let head = if !tied {
        Some(ld.matrix("lm_head.weight", cfg.vocab, h)?)
    } else if cfg.tie_embeddings {
        None
    } else {
        return Err(Error::new(ErrorKind::Tensor, format!(
            "{}: tensor `lm_head.weight` is missing and tie_word_embeddings is false", ld.dir().display())));
    };
    Ok(Weights { embed, layers, norm, head, bytes: ld.bytes, params: ld.params, dtypes: ld.dtypes.clone() })
}

/// A norm weight: as stored, or for Qwen3-Next's zero-centred `Qwen3NextRMSNorm` (which
/// multiplies by `1 + w`, in f32) with the 1 added here, so the kernels' `x·inv·w` computes the
/// reference's product exactly.
fn norm_weight(ld: &mut Loader, cfg: &ModelConfig, name: &str, len: usize) -> Result<Vec<f32>> {
    let mut w = ld.vector(name, len)?;
    if cfg.arch == Arch::Qwen3Next {
        w.iter_mut().for_each(|x| *x += 1.0);
    }
    Ok(w)
}

/// Splits Qwen3-Next's q_proj [heads·2·hd, hidden], whose rows are per head [query (hd) | gate
/// (hd)], into the query matrix and the gate matrix, each [heads·hd, hidden]. Whole rows are
/// moved as stored (any dtype, block scales included: a row's blocks never cross rows).
fn split_gated_q(m: Matrix, heads: usize, hd: usize) -> Result<(Matrix, Matrix)> {
    let rows = heads * hd;
    let row_bytes = m.buf.len().checked_div(m.rows).unwrap_or(0);
    let (mut q, mut g) = (AlignedBuf::zeroed(rows * row_bytes, 64)?, AlignedBuf::zeroed(rows * row_bytes, 64)?);
    if row_bytes > 0 {
        let (src, (qb, gb)) = (m.buf.as_slice(), (q.as_mut_slice(), g.as_mut_slice()));
        let span = hd * row_bytes;
        for head in 0..heads {
            let at = head * 2 * span;
            qb[head * span..(head + 1) * span].copy_from_slice(&src[at..at + span]);
            gb[head * span..(head + 1) * span].copy_from_slice(&src[at + span..at + 2 * span]);
        }
    }
    let half = |buf| Matrix { dtype: m.dtype, rows, cols: m.cols, buf };
    Ok((half(q), half(g)))
}

/// The FFN of a Llama-style layer `l` (spec §1.2, §2): dense, or MoE with its router and
/// shared expert.
fn load_ffn(ld: &mut Loader, cfg: &ModelConfig, p: &str, l: usize) -> Result<Ffn> {
    let h = cfg.hidden;
    Ok(match cfg.moe.as_ref().filter(|_| cfg.is_moe_layer(l)) {
        // GLM-4.5's MoE layer has DeepSeek-V3's tensors (router with its correction bias,
        // gate-less `shared_experts`): read by the same code.
        Some(_) if cfg.arch == Arch::Glm4Moe => super::latent::load_ffn(ld, cfg, l)?,
        Some(moe) if cfg.gpt_oss.is_some() => Ffn::Moe(super::gpt_oss::load_moe(ld, cfg, &format!("{p}.{}", moe.layout.block))?),
        Some(moe) => {
            let b = format!("{p}.{}", moe.layout.block);
            let router = ld.matrix(&format!("{b}.gate.weight"), moe.experts, h)?;
            let shared = if moe.shared_intermediate > 0 {
                let mlp = ld.mlp(&format!("{b}.shared_expert"), ["gate_proj", "up_proj", "down_proj"], h, moe.shared_intermediate, false)?;
                Some((mlp, ld.matrix(&format!("{b}.shared_expert_gate.weight"), 1, h)?))
            } else {
                None
            };
            Ffn::Moe(MoeWeights { router, bias: None, shared: shared.map(|(m, g)| (m, Some(g))), router_bias: None, expert_bias: None })
        }
        None => Ffn::Dense(ld.mlp(&format!("{p}.mlp"), ["gate_proj", "up_proj", "down_proj"], h, cfg.intermediate, cfg.mlp_bias)?),
    })
}

/// The attention projections and q/k norms of layer prefix `p`.
fn load_attention(ld: &mut Loader, cfg: &ModelConfig, p: &str) -> Result<Attention> {
    let (h, hd) = (cfg.hidden, cfg.head_dim);
    let (qn, kn) = match cfg.qk_norm {
        QkNorm::None => (None, None),
        QkNorm::PerHead => (Some(norm_weight(ld, cfg, &format!("{p}.self_attn.q_norm.weight"), hd)?),
            Some(norm_weight(ld, cfg, &format!("{p}.self_attn.k_norm.weight"), hd)?)),
        QkNorm::Whole => (Some(ld.vector(&format!("{p}.self_attn.q_norm.weight"), cfg.q_dim())?),
            Some(ld.vector(&format!("{p}.self_attn.k_norm.weight"), cfg.kv_dim())?)),
    };
    let (q, gate) = if cfg.arch == Arch::Qwen3Next {
        // Qwen3NextAttention: q_proj yields each head's query and its output gate.
        let full = ld.linear(&format!("{p}.self_attn.q_proj"), 2 * cfg.q_dim(), h, false)?;
        let (q, g) = split_gated_q(full.w, cfg.heads, hd)?;
        (Linear { w: q, b: None }, Some(g))
    } else {
        (ld.linear(&format!("{p}.self_attn.q_proj"), cfg.q_dim(), h, cfg.qkv_bias)?, None)
    };
    Ok(Attention {
        q,
        k: ld.linear(&format!("{p}.self_attn.k_proj"), cfg.kv_dim(), h, cfg.qkv_bias)?,
        v: ld.linear(&format!("{p}.self_attn.v_proj"), cfg.kv_dim(), h, cfg.qkv_bias)?,
        o: ld.linear(&format!("{p}.self_attn.o_proj"), h, cfg.q_dim(), cfg.o_bias)?,
        q_norm: qn,
        k_norm: kn,
        gate,
        sinks: match cfg.gpt_oss {
            Some(_) => Some(ld.vector(&format!("{p}.self_attn.sinks"), cfg.heads)?),
            None => None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::quant::{decode_row, encode_row, Width};
    use crate::test_util::Must;

    /// Splitting a Q8B32 q_proj moves whole quantized rows: each half's row r decodes to the
    /// full matrix's row (head·2·hd + r mod hd, + hd for the gate), scales included.
    #[test]
    fn gated_q_split_moves_whole_quantized_rows() {
        let (heads, hd, cols) = (3, 2, 64);
        let rows = heads * 2 * hd;
        let row_bytes = cols / 32 * 34;
        let value = |r: usize, c: usize| ((r * 131 + c * 7) % 23) as f32 * 0.1 - 1.0 + r as f32;
        let mut buf = AlignedBuf::zeroed(rows * row_bytes, 64).must();
        for r in 0..rows {
            let src: Vec<f32> = (0..cols).map(|c| value(r, c)).collect();
            encode_row(Width::Q8, &src, &mut buf.as_mut_slice()[r * row_bytes..(r + 1) * row_bytes]).must();
        }
        let full = Matrix { dtype: DType::Q8B32, rows, cols, buf };
        let mut want = vec![0.0f32; rows * cols];
        for r in 0..rows {
            decode_row(Width::Q8, &full.buf.as_slice()[r * row_bytes..(r + 1) * row_bytes], &mut want[r * cols..(r + 1) * cols]);
        }
        let (q, g) = split_gated_q(full, heads, hd).must();
        assert_eq!((q.rows, g.rows, q.cols, q.bytes()), (heads * hd, heads * hd, cols, heads * hd * row_bytes));
        let mut got = vec![0.0f32; cols];
        for (half, m) in [(0, &q), (1, &g)] {
            for r in 0..heads * hd {
                decode_row(Width::Q8, &m.buf.as_slice()[r * row_bytes..(r + 1) * row_bytes], &mut got);
                let src = (r / hd) * 2 * hd + half * hd + r % hd;
                assert_eq!(got, want[src * cols..(src + 1) * cols], "half {half} row {r}");
            }
        }
    }
}
