//! Sessions: one conversation's run state — its K/V cache, MLA latent cache, KDA recurrent and
//! convolution state, position and token history — apart from the model whose weights and
//! expert cache every session shares. Several sessions can be open on one model; each is
//! counted against the model's RAM budget while it lives.
//!
//! A session saves to and loads from a state file (docs/STATE.md): a model identity (a SHA-256
//! over the model's config and tensor index, not its weights), every shape the state depends
//! on, the token history and the state's tensors, each section with its CRC-32. A file of
//! another model, context or layout is refused before the session is touched.

use super::state::SessionCache;
use crate::error::{Error, ErrorKind, Result};
use crate::format::config::{Mixer, ModelConfig};
use crate::format::json::Json;
use crate::format::safetensors::TensorInfo;
use crate::format::sha256::{self, Sha256};
use crate::format::state::{StateReader, StateWriter, FRAME_BYTES, PREAMBLE_BYTES};
use crate::sys::vec_bytes;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Every dimension a session's state depends on, and the identity of its model. Two sessions
/// with equal shapes can exchange state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// SHA-256 over the model's config and tensor index ([`identity`]).
    pub identity: [u8; 32],
    pub ctx: usize,
    /// Layers with a K/V cache, and the floats of one position's keys (= values) there.
    pub kv_layers: usize,
    pub kv_dim: usize,
    /// MLA layers, and the floats of one position's latent row.
    pub mla_layers: usize,
    pub mla_width: usize,
    /// KDA layers, and the floats of one layer's recurrent state and convolution history.
    pub kda_layers: usize,
    pub kda_state: usize,
    pub kda_conv: usize,
}

impl Shape {
    pub fn of(cfg: &ModelConfig, ctx: usize, identity: [u8; 32]) -> Shape {
        let (mut mla_layers, mut mla_width, mut kda_layers, mut kda_state, mut kda_conv) = (0, 0, 0, 0, 0);
        if let Some(m) = cfg.mla.as_ref() {
            mla_layers = m.count(Mixer::Mla);
            mla_width = if mla_layers > 0 { m.latent_width() } else { 0 };
            if let (n, Some(k)) = (m.count(Mixer::Kda), m.kda) {
                if n > 0 {
                    kda_layers = n;
                    kda_state = k.width() * k.head_dim;
                    kda_conv = 3 * (k.conv_kernel - 1) * k.width();
                }
            }
        }
        if let Some(g) = cfg.gdn.as_ref().filter(|g| g.count() > 0) {
            // Qwen3-Next's Gated DeltaNet state sits in the KDA buffers (model::gdn).
            kda_layers = g.count();
            kda_state = g.v_heads * g.k_dim * g.v_dim;
            kda_conv = (g.conv_kernel - 1) * g.conv_width();
        }
        Shape { identity, ctx, kv_layers: cfg.kv_cache_layers(), kv_dim: cfg.kv_dim(), mla_layers, mla_width, kda_layers,
            kda_state, kda_conv }
    }

    /// The shape's numbers as the state file's `SHAP` section lists them (docs/STATE.md).
    fn fields(&self) -> [(&'static str, usize); 8] {
        [("context", self.ctx), ("kv_layers", self.kv_layers), ("kv_dim", self.kv_dim), ("mla_layers", self.mla_layers),
            ("mla_width", self.mla_width), ("kda_layers", self.kda_layers), ("kda_state", self.kda_state),
            ("kda_conv", self.kda_conv)]
    }
}

/// The name of an identity line that is not a tensor's: matrix `i` of a container's bank for
/// layer `l` (`experts-LLL.matrixI`).
pub(crate) enum LineName {
    Matrix(usize, usize),
}

/// One line of the identity beside the tensors' (a container's expert matrices).
pub(crate) struct TensorLine {
    pub name: LineName,
    pub dtype: &'static str,
    pub shape: [u64; 3],
    pub bytes: u64,
}

/// The model identity a session's state is tied to (docs/STATE.md): SHA-256 over the config
/// (as compact JSON), every tensor's name, dtype, shape and byte length in name order, then the
/// `extra` lines — what decides the meaning of the state, read from headers alone (the weights'
/// bytes are not hashed). Hashed line by line through one small buffer.
pub(crate) fn identity(config: &Json, tensors: &[&TensorInfo], extra: impl Iterator<Item = TensorLine>) -> [u8; 32] {
    use std::fmt::Write as _;
    let mut order: Vec<u32> = (0..tensors.len() as u32).collect();
    order.sort_by(|&a, &b| tensors[a as usize].name.as_bytes().cmp(tensors[b as usize].name.as_bytes()));
    let mut h = Sha256::new();
    h.update(b"waste model identity 1\n");
    h.update(config.to_string_compact().as_bytes());
    h.update(b"\n");
    let mut line = String::with_capacity(256);
    let put = |h: &mut Sha256, line: &mut String, dtype: &str, shape: &[u64], bytes: u64| {
        let _ = write!(line, "\t{dtype}\t[");
        for (i, d) in shape.iter().enumerate() {
            let _ = write!(line, "{}{d}", if i > 0 { "," } else { "" });
        }
        let _ = writeln!(line, "]\t{bytes}");
        h.update(line.as_bytes());
        line.clear();
    };
    for &i in &order {
        let t = tensors[i as usize];
        h.update(t.name.as_bytes());
        put(&mut h, &mut line, t.dtype.name(), &t.shape, t.len);
    }
    for x in extra {
        let LineName::Matrix(l, i) = x.name;
        let _ = write!(line, "experts-{l:03}.matrix{i}");
        put(&mut h, &mut line, x.dtype, &x.shape, x.bytes);
    }
    h.finish()
}

/// One conversation's state on a model: what it has computed (the caches up to
/// [`Session::position`]) and the tokens it holds ([`Session::tokens`]). Made by
/// [`crate::Model::new_session`] (or the model's own, [`crate::Model::session`]) and used with
/// [`crate::Model::generate_in`] and [`crate::Model::eval_in`]; a session of another model is
/// refused there. Its bytes count against the budget of the model that made it until it is
/// dropped.
pub struct Session {
    pub(crate) cache: SessionCache,
    /// The conversation's tokens: the first `cache.pos` have their state in the cache; one
    /// more may follow whose state is not computed yet (a generation's last token, computed
    /// when the session continues). Room for the whole context is reserved at creation.
    pub(crate) history: Vec<u32>,
    pub(crate) shape: Shape,
    /// The model's `architectures[0]`, for messages.
    pub(crate) architecture: String,
    /// The model's count of bytes held by sessions other than its own, shared with it.
    ledger: Option<Arc<AtomicU64>>,
}

/// How a session continues with a prompt ([`Session::continuation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Continuation {
    /// Tokens of the prompt whose held state is kept.
    pub keep: usize,
    /// The held state could not be cut back to the common prefix (a recurrent state) and
    /// was dropped: everything is prefilled again.
    pub reset: bool,
}

/// Tags of the state file's sections, in file order (docs/STATE.md).
const IDENTITY: [u8; 4] = *b"IDNT";
const SHAPE: [u8; 4] = *b"SHAP";
const HOST: [u8; 4] = *b"HOST";
const HISTORY: [u8; 4] = *b"HIST";
const KV: [u8; 4] = *b"KVCA";
const MLA: [u8; 4] = *b"MLAC";
const KDA_STATE: [u8; 4] = *b"KDAS";
const KDA_CONV: [u8; 4] = *b"KDAC";
const SECTIONS: u32 = 8;
/// The `SHAP` section: the shape's 8 numbers, the position, the history length and the
/// state's number format, each a u64.
const SHAPE_WORDS: usize = 11;
/// The state's number format code: 0 = little-endian f32 (the only one written today).
const DTYPE_F32: u64 = 0;
/// Longest architecture name a file may carry.
const MAX_NAME: usize = 256;

impl Session {
    /// Bytes a session holds for a model of `cfg` with context `ctx`: its caches and room for
    /// `ctx + 1` tokens of history.
    pub fn plan_bytes(cfg: &ModelConfig, ctx: usize) -> u64 {
        SessionCache::plan_bytes(cfg, ctx) + (ctx as u64 + 1) * 4
    }

    /// Allocates a session at position 0; `ledger`, when given, is charged its bytes until it
    /// is dropped.
    pub(crate) fn new(cfg: &ModelConfig, ctx: usize, identity: [u8; 32], ledger: Option<Arc<AtomicU64>>) -> Result<Session> {
        let mut s = Session { cache: SessionCache::new(cfg, ctx)?, history: Vec::with_capacity(ctx + 1),
            shape: Shape::of(cfg, ctx, identity), architecture: cfg.class.clone(), ledger: None };
        if let Some(l) = &ledger {
            l.fetch_add(s.heap_bytes(), Ordering::Relaxed);
        }
        s.ledger = ledger;
        Ok(s)
    }

    /// A session that holds nothing (no buffers): what stands in for one while it is lent.
    pub(crate) fn placeholder() -> Session {
        let shape = Shape { identity: [0; 32], ctx: 0, kv_layers: 0, kv_dim: 0, mla_layers: 0, mla_width: 0, kda_layers: 0,
            kda_state: 0, kda_conv: 0 };
        Session { cache: SessionCache::empty(), history: Vec::new(), shape, architecture: String::new(), ledger: None }
    }

    /// The conversation's tokens: the prompts and generated tokens so far.
    pub fn tokens(&self) -> &[u32] {
        &self.history
    }

    /// Tokens whose state is computed. The last generated token of a turn is held but not yet
    /// computed (its state is computed with the next prompt), so this can be one less than
    /// `tokens().len()`.
    pub fn position(&self) -> usize {
        self.cache.pos
    }

    /// The most tokens the session can hold.
    pub fn context(&self) -> usize {
        self.shape.ctx
    }

    /// Forgets the conversation (the caches are overwritten from position 0).
    pub fn reset(&mut self) {
        self.cache.pos = 0;
        self.history.clear();
    }

    /// Bytes the session holds: its caches and its history's reserved room.
    pub fn heap_bytes(&self) -> u64 {
        self.cache.heap_bytes() + vec_bytes(&self.history)
    }

    /// True when the session keeps a recurrent state (KDA layers), which cannot be rolled back
    /// to an earlier position: a prompt that diverges from the history is prefilled whole.
    pub fn is_recurrent(&self) -> bool {
        self.shape.kda_layers > 0
    }

    /// How to continue with `prompt` (the whole conversation as tokens): keep the held state
    /// of the longest common prefix — at most `prompt.len() − 1` tokens, since the last token
    /// must be computed for its logits — and cut the rest; a recurrent state that cannot be
    /// cut is dropped.
    pub(crate) fn continuation(&self, prompt: &[u32]) -> Continuation {
        let common = self.history.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let keep = common.min(self.cache.pos).min(prompt.len().saturating_sub(1));
        if self.cache.can_truncate(keep) {
            Continuation { keep, reset: false }
        } else {
            Continuation { keep: 0, reset: true }
        }
    }

    /// Cuts the session to its first `keep` tokens of state (see [`Session::continuation`])
    /// and replaces the history with `prompt[..keep]`.
    pub(crate) fn truncate(&mut self, keep: usize, prompt: &[u32]) {
        self.cache.pos = keep;
        self.history.clear();
        self.history.extend_from_slice(&prompt[..keep]);
    }

    /// Saves the session to `path`: written to a temporary file beside it, synced and renamed
    /// into place, so an interrupted save leaves the old file or none.
    pub fn save_state(&self, path: impl AsRef<Path>) -> Result<()> {
        self.save_state_with(path, &[])
    }

    /// [`Session::save_state`], with `host` bytes stored beside the state for the host program
    /// (`waste chat` keeps its messages there); [`Session::load_state_with`] gives them back.
    pub fn save_state_with(&self, path: impl AsRef<Path>, host: &[u8]) -> Result<()> {
        let path = path.as_ref();
        let s = &self.shape;
        let pos = self.cache.pos;
        let mut w = StateWriter::create(path, SECTIONS)?;
        let name = self.architecture.as_bytes();
        w.begin(IDENTITY, 32 + 4 + name.len() as u64)?;
        w.bytes(&s.identity)?;
        w.u32s(&[name.len() as u32])?;
        w.bytes(name)?;
        w.end()?;
        let mut words: Vec<u64> = s.fields().iter().map(|&(_, v)| v as u64).collect();
        words.extend([pos as u64, self.history.len() as u64, DTYPE_F32]);
        w.begin(SHAPE, SHAPE_WORDS as u64 * 8)?;
        w.u64s(&words)?;
        w.end()?;
        w.begin(HOST, host.len() as u64)?;
        w.bytes(host)?;
        w.end()?;
        w.begin(HISTORY, self.history.len() as u64 * 4)?;
        w.u32s(&self.history)?;
        w.end()?;
        let (k, v) = (self.cache.k.as_f32(), self.cache.v.as_f32());
        let layer = s.ctx * s.kv_dim;
        w.begin(KV, (2 * s.kv_layers * pos * s.kv_dim * 4) as u64)?;
        for l in 0..s.kv_layers {
            w.f32s(&k[l * layer..l * layer + pos * s.kv_dim])?;
            w.f32s(&v[l * layer..l * layer + pos * s.kv_dim])?;
        }
        w.end()?;
        let layer = s.ctx * s.mla_width;
        w.begin(MLA, (s.mla_layers * pos * s.mla_width * 4) as u64)?;
        for l in 0..s.mla_layers {
            w.f32s(&self.cache.mla[l * layer..l * layer + pos * s.mla_width])?;
        }
        w.end()?;
        w.begin(KDA_STATE, self.cache.kda_state.len() as u64 * 4)?;
        w.f32s(&self.cache.kda_state)?;
        w.end()?;
        w.begin(KDA_CONV, self.cache.kda_conv.len() as u64 * 4)?;
        w.f32s(&self.cache.kda_conv)?;
        w.end()?;
        w.finish()?;
        Ok(())
    }

    /// Replaces the session with the state saved in `path`. A file of another model, context
    /// or layout — or one that is truncated, extended, or damaged in its identity and shape —
    /// is refused with an [`ErrorKind::Format`] error naming the section or field, and the
    /// session is left as it was. Damage inside the tokens or tensors (a CRC-32 mismatch) is
    /// refused too, but is found only once they have been read into the session, which is
    /// then reset (the error says so).
    pub fn load_state(&mut self, path: impl AsRef<Path>) -> Result<()> {
        self.load_state_with(path, 0).map(|_| ())
    }

    /// [`Session::load_state`], returning the host bytes saved with the state
    /// ([`Session::save_state_with`]); more than `max_host_bytes` of them are refused (an
    /// allocation bound for a hostile file).
    pub fn load_state_with(&mut self, path: impl AsRef<Path>, max_host_bytes: usize) -> Result<Vec<u8>> {
        let path = path.as_ref();
        let mut r = StateReader::open(path)?;
        let (pos, tokens, host) = self.check_header(&mut r, max_host_bytes)?;
        let result = self.read_body(&mut r, pos, tokens).and_then(|()| r.finish());
        match result {
            Ok(()) => {
                self.cache.pos = pos;
                Ok(host)
            }
            Err(e) => {
                self.reset();
                Err(Error::new(e.kind(), format!("{} (the session was reset)", e.message())))
            }
        }
    }

    /// Reads and checks the identity, shape and host sections; returns the saved position,
    /// history length and host bytes.
    fn check_header(&self, r: &mut StateReader, max_host: usize) -> Result<(usize, usize, Vec<u8>)> {
        let bad = |r: &StateReader, what: String| Error::new(ErrorKind::Format, format!("{}: {what}", r.path().display()));
        let len = r.begin(IDENTITY)?;
        if !(36..=36 + MAX_NAME as u64).contains(&len) {
            return Err(bad(r, format!("section `IDNT`: a length of {len} bytes is not an identity")));
        }
        let mut id = [0u8; 32];
        r.bytes(&mut id)?;
        let mut n = [0u32];
        r.u32s(&mut n)?;
        if n[0] as u64 != len - 36 {
            return Err(bad(r, format!("section `IDNT`: a name of {} bytes in a section of {len}", n[0])));
        }
        let mut name = vec![0u8; n[0] as usize];
        r.bytes(&mut name)?;
        r.end()?;
        if id != self.shape.identity {
            return Err(bad(r, format!(
                "section `IDNT`: the state is of another model ({} with identity {}…), this session's model is {} (identity {}…)",
                String::from_utf8_lossy(&name), &sha256::hex(&id)[..12], self.architecture, &sha256::hex(&self.shape.identity)[..12])));
        }
        if r.begin(SHAPE)? != SHAPE_WORDS as u64 * 8 {
            return Err(bad(r, "section `SHAP` has the wrong length".into()));
        }
        let mut words = [0u64; SHAPE_WORDS];
        r.u64s(&mut words)?;
        r.end()?;
        for (i, (field, want)) in self.shape.fields().into_iter().enumerate() {
            if words[i] != want as u64 {
                return Err(bad(r, format!("section `SHAP`: field `{field}` is {} in the file, {want} in this session{}",
                    words[i], if field == "context" { " (open the model with the context the state was saved with)" } else { "" })));
            }
        }
        let (pos, tokens, dtype) = (words[8], words[9], words[10]);
        if dtype != DTYPE_F32 {
            return Err(bad(r, format!("section `SHAP`: field `dtype` is {dtype}, this build reads 0 (f32)")));
        }
        let ctx = self.shape.ctx as u64;
        if pos > ctx || tokens > ctx + 1 || tokens < pos || tokens > pos + 1 {
            return Err(bad(r, format!(
                "section `SHAP`: position {pos} with {tokens} tokens of history does not fit a context of {ctx}")));
        }
        let host_len = r.begin(HOST)?;
        if host_len > max_host as u64 {
            return Err(bad(r, format!("section `HOST`: {host_len} bytes of host data, more than the {max_host} this reader takes")));
        }
        let mut host = vec![0u8; host_len as usize];
        r.bytes(&mut host)?;
        r.end()?;
        // The whole file's size follows from the shape: a truncated or extended file is refused
        // here, before the session is touched.
        let (pos, tokens) = (pos as usize, tokens as usize);
        let need = PREAMBLE_BYTES + SECTIONS as u64 * FRAME_BYTES + len + SHAPE_WORDS as u64 * 8 + host_len
            + self.body_bytes(pos, tokens) as u64;
        if r.size() != need {
            return Err(bad(r, format!("the file is {} bytes, but a state of {pos} positions and {tokens} tokens takes {need} (the file is {})", r.size(), if r.size() < need { "truncated" } else { "extended" })));
        }
        Ok((pos, tokens, host))
    }

    /// Payload bytes of the history and tensor sections for `pos` positions and `tokens` tokens.
    fn body_bytes(&self, pos: usize, tokens: usize) -> usize {
        let s = &self.shape;
        4 * (tokens + 2 * s.kv_layers * pos * s.kv_dim + s.mla_layers * pos * s.mla_width + s.kda_layers * (s.kda_state + s.kda_conv))
    }

    /// Reads the history and the tensors straight into the session's buffers.
    fn read_body(&mut self, r: &mut StateReader, pos: usize, tokens: usize) -> Result<()> {
        let s = self.shape;
        let sized = |r: &mut StateReader, tag: [u8; 4], want: usize| -> Result<()> {
            let got = r.begin(tag)?;
            if got != want as u64 {
                return Err(Error::new(ErrorKind::Format, format!("{}: section {}: {got} bytes, the shape says {want}",
                    r.path().display(), crate::format::state::tag_name(tag))));
            }
            Ok(())
        };
        sized(r, HISTORY, tokens * 4)?;
        self.history.clear();
        self.history.resize(tokens, 0);
        r.u32s(&mut self.history)?;
        r.end()?;
        let layer = s.ctx * s.kv_dim;
        sized(r, KV, 2 * s.kv_layers * pos * s.kv_dim * 4)?;
        let (k, v) = (self.cache.k.as_f32_mut(), self.cache.v.as_f32_mut());
        for l in 0..s.kv_layers {
            r.f32s(&mut k[l * layer..l * layer + pos * s.kv_dim])?;
            r.f32s(&mut v[l * layer..l * layer + pos * s.kv_dim])?;
        }
        r.end()?;
        let layer = s.ctx * s.mla_width;
        sized(r, MLA, s.mla_layers * pos * s.mla_width * 4)?;
        for l in 0..s.mla_layers {
            r.f32s(&mut self.cache.mla[l * layer..l * layer + pos * s.mla_width])?;
        }
        r.end()?;
        sized(r, KDA_STATE, self.cache.kda_state.len() * 4)?;
        r.f32s(&mut self.cache.kda_state)?;
        r.end()?;
        sized(r, KDA_CONV, self.cache.kda_conv.len() * 4)?;
        r.f32s(&mut self.cache.kda_conv)?;
        r.end()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(l) = &self.ledger {
            l.fetch_sub(self.heap_bytes(), Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Session({}, {} of {} tokens, {} computed)", self.architecture, self.history.len(), self.shape.ctx, self.cache.pos)
    }
}
