//! Text ↔ token ids, exactly as each model family's reference tokenizer does it.
//!
//! Two encoding entry points keep markup apart from content (seed 001, "Tokenizer"):
//! [`Tokenizer::tokenize`] treats special-token strings such as `<|endoftext|>` as ordinary text
//! and can never produce a control-token id; [`Tokenizer::tokenize_markup`] resolves them. A
//! prompt is built by encoding the template with the second and every piece of content with
//! the first.
//!
//! Decoding streams: [`Detokenizer`] holds back a piece that ends inside a UTF-8 character
//! until the character completes.

mod bpe;
mod hf;
mod normalize;
mod pretokenize;
mod sentencepiece;
mod specials;
mod tiktoken;
mod unicode;
#[rustfmt::skip]
#[allow(dead_code)]
mod unicode_tables;

use crate::error::{Error, ErrorKind, Result};
use crate::format::json::{Json, Limits};
use std::path::{Path, PathBuf};

pub use normalize::{nfc, nfc_unicode9};
pub use pretokenize::{CL100K_PATTERN, DEEPSEEK_PATTERN, GPT2_PATTERN, KIMI_PATTERN, LLAMA3_PATTERN, O200K_PATTERN, QWEN2_PATTERN};
pub use sentencepiece::SentencePiece;
pub use unicode::UNICODE_VERSION;

/// A loaded tokenizer of one of the supported vocabulary kinds.
pub struct Tokenizer {
    kind: Kind,
    path: PathBuf,
    /// Character classes for the split patterns.
    classes: unicode::CharClasses,
}

// One per model: the variants' sizes (a few KiB of inline tables) do not matter.
#[allow(clippy::large_enum_variant)]
enum Kind {
    /// llama2.c `tok512.bin`: SentencePiece-style pieces with scores and byte fallback.
    SentencePiece(SentencePiece),
    /// A tiktoken rank file, or Kimi's `tiktoken.model`.
    Tiktoken(tiktoken::Tiktoken),
    /// A Hugging Face `tokenizer.json` BPE tokenizer (boxed: it is the largest kind by far).
    Hf(Box<hf::HfTokenizer>),
}

/// The file names [`Tokenizer::from_model_dir`] looks for, in order (then any `*.tiktoken`).
const DIR_CANDIDATES: [&str; 5] = ["tokenizer.json", "tiktoken.model", "tokenizer.model", "tokenizer.bin", "tok512.bin"];

/// Tokenizer files are at most this large (the largest published `tokenizer.json` files are
/// around 35 MB).
const MAX_FILE: u64 = 256 << 20;

impl Tokenizer {
    /// Finds and loads the tokenizer of a model directory: `tokenizer.json`, a tiktoken
    /// `tiktoken.model`/`tokenizer.model` (Kimi), a `*.tiktoken` rank file, or a llama2.c
    /// `tokenizer.bin`/`tok512.bin`.
    pub fn from_model_dir(dir: &Path) -> Result<Tokenizer> {
        Tokenizer::from_model_dir_within(dir, &Limits::default())
    }

    /// [`Tokenizer::from_model_dir`] with the JSON files parsed within `limits`.
    pub(crate) fn from_model_dir_within(dir: &Path, limits: &Limits) -> Result<Tokenizer> {
        match find_in_dir(dir) {
            Some(p) => Tokenizer::from_file_within(&p, limits),
            None => Err(Error::new(ErrorKind::Tokenizer, format!(
                "{}: no tokenizer file found (looked for {}, *.tiktoken)", dir.display(), DIR_CANDIDATES.join(", ")))),
        }
    }

    /// Loads a tokenizer file, choosing the kind from its name and contents.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        Tokenizer::from_file_within(path, &Limits::default())
    }

    /// [`Tokenizer::from_file`] with the file (and a tokenizer.json's tree, and the
    /// `tokenizer_config.json` beside it) held within `limits`.
    pub(crate) fn from_file_within(path: &Path, limits: &Limits) -> Result<Tokenizer> {
        let config = read_config(path, limits)?;
        // The config's tree is held while the tokenizer is parsed: what it took comes off.
        let config_bytes = config.as_ref().map_or(0, |(p, _)| std::fs::metadata(p).map_or(0, |m| m.len()));
        let limits = Limits { max_bytes: limits.max_bytes.saturating_sub(config_bytes), ..*limits };
        let bytes = crate::format::read_bounded_within(path, MAX_FILE, &limits)?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ext = path.extension().and_then(|n| n.to_str()).unwrap_or("");
        let config_ref = config.as_ref().map(|(p, j)| (p.as_path(), j));
        let file_bytes = bytes.len();
        let kind = if ext == "json" || (ext != "bin" && bytes.first() == Some(&b'{')) {
            // The bytes go to the parser, which drops them before building its tables.
            Kind::Hf(Box::new(hf::HfTokenizer::parse_within(path, bytes, config_ref, &limits)?))
        } else {
            let kind = if ext == "tiktoken" {
                Kind::Tiktoken(tiktoken::Tiktoken::from_rank_file(path, &bytes)?)
            } else if ext == "model" || name.ends_with(".model") {
                if !is_rank_text(&bytes) {
                    return Err(Error::unsupported(format!(
                        "{}: SentencePiece protobuf models are not supported; use the model's tokenizer.json", path.display())));
                }
                Kind::Tiktoken(tiktoken::Tiktoken::from_kimi(path, &bytes, config_ref)?)
            } else {
                Kind::SentencePiece(SentencePiece::from_llama2c(path, &bytes)?)
            };
            drop(bytes);
            kind
        };
        // The file's bytes are not kept: gone before the character classes are built.
        let t = Tokenizer { kind, path: path.to_path_buf(), classes: unicode::CharClasses::new() };
        // The memory plan counts a tokenizer by the rule of `plan_bytes`, from the file size:
        // a file that would hold more is refused rather than exceed the plan.
        let allowance = plan_bytes(path)?;
        if t.heap_bytes() > allowance {
            return Err(Error::new(ErrorKind::Tokenizer, format!(
                "{}: its tables hold {} bytes, more than the {allowance} bytes the memory plan allows a tokenizer \
file of {} bytes (docs/MEMORY.md); implausibly many short tokens for its size",
                path.display(), t.heap_bytes(), file_bytes)));
        }
        Ok(t)
    }

    /// The vocabulary kind, as a container's manifest names it: `tiktoken` (a rank file or
    /// Kimi's `tiktoken.model`), `hf-bytelevel` or `hf-sentencepiece` (a `tokenizer.json` BPE
    /// of either kind), or `llama2c` (`tokenizer.bin`/`tok512.bin`).
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            Kind::SentencePiece(_) => "llama2c",
            Kind::Tiktoken(_) => "tiktoken",
            Kind::Hf(h) if h.is_byte_level() => "hf-bytelevel",
            Kind::Hf(_) => "hf-sentencepiece",
        }
    }

    /// The file the tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Heap bytes the tokenizer holds: its vocabulary tables and the character classes
    /// (capacities, so what was allocated rather than what is used; allocator overhead is
    /// not included). docs/MEMORY.md: the memory plan bounds this from the file size.
    pub fn heap_bytes(&self) -> u64 {
        let kind = match &self.kind {
            Kind::SentencePiece(sp) => sp.heap_bytes(),
            Kind::Tiktoken(t) => t.heap_bytes(),
            Kind::Hf(h) => h.heap_bytes(),
        };
        kind + self.classes.heap_bytes() + self.path.capacity() as u64
    }

    /// Number of token ids (the largest id + 1).
    pub fn vocab_size(&self) -> usize {
        match &self.kind {
            Kind::SentencePiece(sp) => sp.vocab_size(),
            Kind::Tiktoken(t) => t.vocab_size(),
            Kind::Hf(h) => h.vocab_size(),
        }
    }

    /// The beginning-of-sequence id that prompts start with, if this tokenizer's own pipeline
    /// adds one (llama2.c: yes; `tokenizer.json`: per `tokenizer_config.json`'s
    /// `add_bos_token`, else its post-processor template; tiktoken: no).
    pub fn bos(&self) -> Option<u32> {
        match &self.kind {
            Kind::SentencePiece(sp) => Some(sp.bos()),
            Kind::Tiktoken(t) => t.bos,
            Kind::Hf(h) => h.bos,
        }
    }

    /// End-of-sequence ids of the vocabulary itself (the model config may add more).
    pub fn eos(&self) -> Vec<u32> {
        match &self.kind {
            Kind::SentencePiece(sp) => vec![sp.eos()],
            Kind::Tiktoken(t) => t.eos.clone(),
            Kind::Hf(h) => h.eos.clone(),
        }
    }

    fn classes(&self) -> &unicode::CharClasses {
        &self.classes
    }

    /// Encodes content: special-token strings are plain text, so the result never holds a
    /// control id (nor any added token of a `tokenizer.json`). No BOS is added.
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        match &self.kind {
            Kind::SentencePiece(sp) => return sp.encode(text),
            Kind::Tiktoken(t) => t.encode(text, false, self.classes(), &mut out),
            Kind::Hf(h) => h.encode(text, false, self.classes(), &mut out),
        }
        out
    }

    /// Encodes markup: special-token strings become their ids. No BOS is added.
    pub fn tokenize_markup(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        match &self.kind {
            // tok512 has no special-token strings that text can spell.
            Kind::SentencePiece(sp) => return sp.encode(text),
            Kind::Tiktoken(t) => t.encode(text, true, self.classes(), &mut out),
            Kind::Hf(h) => h.encode(text, true, self.classes(), &mut out),
        }
        out
    }

    /// Encodes a rendered chat template ([`crate::template::ChatTemplate::render`]): a
    /// special-token string becomes its control id only where its first and last characters
    /// are markup — wholly inside a [`Piece::Markup`](crate::template::Piece), or assembled by
    /// the template around a value (`'<|' + message.role + '|>'`, as Phi-3 and GLM write
    /// their role tokens). One that begins or ends in content, in particular one a user typed
    /// in a message, stays text. Everything between those control tokens — markup and content
    /// alike, across piece boundaries — is encoded as ordinary text in one go, through the
    /// same pipeline as [`Tokenizer::tokenize_markup`]. So the ids equal `tokenize_markup` of
    /// the concatenated text (what Hugging Face gets for the prompt) whenever no special
    /// begins or ends in content. No BOS is added: the template writes its own.
    pub fn tokenize_pieces(&self, pieces: &[crate::template::Piece]) -> Vec<u32> {
        self.encode_pieces(pieces, false)
    }

    /// [`Tokenizer::tokenize_pieces`] for pieces that continue text encoded earlier (the new
    /// turns of a conversation whose earlier part a session holds): the text is not the start
    /// of a sequence, so it gets no SentencePiece dummy-prefix space and no first-only
    /// `Metaspace` prefix. Byte-level and tiktoken vocabularies encode it as `tokenize_pieces`
    /// does.
    pub fn tokenize_pieces_continued(&self, pieces: &[crate::template::Piece]) -> Vec<u32> {
        self.encode_pieces(pieces, true)
    }

    fn encode_pieces(&self, pieces: &[crate::template::Piece], continued: bool) -> Vec<u32> {
        let mut text = String::with_capacity(pieces.iter().map(|p| p.text().len()).sum());
        let mut markup: Vec<(usize, usize)> = Vec::new();
        for p in pieces {
            let start = text.len();
            text.push_str(p.text());
            if p.is_markup() && text.len() > start {
                match markup.last_mut() {
                    Some((_, end)) if *end == start => *end = text.len(),
                    _ => markup.push((start, text.len())),
                }
            }
        }
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        match &self.kind {
            Kind::SentencePiece(sp) => return sp.encode_with(&text, !continued),
            Kind::Tiktoken(t) => t.encode_within(&text, true, Some(&markup), self.classes(), &mut out),
            Kind::Hf(h) => h.encode_markup(&text, Some(&markup), continued, self.classes(), &mut out),
        }
        out
    }

    /// The pre-token pieces of content `text` (tiktoken kinds only: the split pattern's
    /// matches), for checking the pattern against a reference.
    pub fn pre_tokens<'a>(&self, text: &'a str) -> Option<Vec<&'a str>> {
        let Kind::Tiktoken(t) = &self.kind else { return None };
        let mut out = Vec::new();
        t.pattern.for_each_match(text, self.classes(), |a, b| out.push(&text[a..b]));
        Some(out)
    }

    /// The special-token strings that [`Tokenizer::tokenize_markup`] recognises, with their ids.
    pub fn special_tokens(&self) -> Vec<(String, u32)> {
        match &self.kind {
            Kind::SentencePiece(_) => Vec::new(),
            Kind::Tiktoken(t) => t.specials.entries().to_vec(),
            Kind::Hf(h) => h.markup_tokens(),
        }
    }

    /// The raw bytes a token stands for (empty for control tokens); an error for an id out of
    /// range.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        match &self.kind {
            Kind::SentencePiece(sp) => sp.token_bytes(id),
            Kind::Tiktoken(t) => t.token_bytes(id),
            Kind::Hf(h) => h.token_bytes(id),
        }
        .ok_or_else(|| Error::new(ErrorKind::Tokenizer, format!(
            "{}: token id {id} is out of range (vocabulary of {})", self.path.display(), self.vocab_size())))
    }

    /// True for control tokens (BOS, EOS, and other specials, and ids no token uses), which
    /// decode to nothing.
    pub fn is_control(&self, id: u32) -> bool {
        match &self.kind {
            Kind::SentencePiece(sp) => sp.is_control(id),
            Kind::Tiktoken(t) => t.is_control(id),
            Kind::Hf(h) => h.is_control(id),
        }
    }

    /// Decodes ids to text. Invalid UTF-8 becomes U+FFFD.
    pub fn detokenize(&self, ids: &[u32]) -> Result<String> {
        let mut d = self.detokenizer();
        let mut out = String::new();
        for &id in ids {
            out.push_str(&d.push(self, id)?);
        }
        out.push_str(&d.finish());
        Ok(out)
    }

    /// Decodes ids to the exact bytes they stand for (no U+FFFD substitution).
    pub fn detokenize_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut at_start = true;
        for &id in ids {
            let b = self.token_bytes(id)?;
            if self.is_control(id) {
                continue;
            }
            if at_start {
                out.extend_from_slice(self.first_piece(id, b));
            } else {
                out.extend_from_slice(b);
            }
            at_start = false;
        }
        Ok(out)
    }

    /// A streaming decoder for a sequence from its start.
    pub fn detokenizer(&self) -> Detokenizer {
        Detokenizer { pending: Vec::new(), at_start: true, run: 0 }
    }

    /// A streaming decoder for the tokens that follow `prefix` (a prompt already shown): the
    /// first piece keeps its leading space unless `prefix` held no text token.
    pub fn detokenizer_after(&self, prefix: &[u32]) -> Detokenizer {
        let at_start = prefix.iter().all(|&id| self.is_control(id));
        Detokenizer { pending: Vec::new(), at_start, run: 0 }
    }

    /// The bytes of the first text token of a sequence: SentencePiece vocabularies drop the
    /// dummy-prefix space (one leading space); HF `Metaspace` decoders drop the replacement
    /// characters of that token's string (not spaces that a `<0x20>` byte token stands for).
    fn first_piece<'a>(&'a self, id: u32, b: &'a [u8]) -> &'a [u8] {
        let leading = match &self.kind {
            Kind::SentencePiece(_) => hf::Leading::StripOne,
            Kind::Tiktoken(_) => hf::Leading::Keep,
            Kind::Hf(h) => match h.first_token_bytes(id) {
                Some(first) => return first,
                None => h.leading,
            },
        };
        match leading {
            hf::Leading::Keep => b,
            hf::Leading::StripOne => b.strip_prefix(b" ").unwrap_or(b),
        }
    }

    /// True for a token whose byte joins a `ByteFallback` run (see [`Detokenizer`]).
    fn is_fallback_byte(&self, id: u32) -> bool {
        matches!(&self.kind, Kind::Hf(h) if h.is_fallback_byte(id))
    }
}

/// Splits `text` with a published split pattern given by its exact text (a tiktoken
/// `pat_str` or a `tokenizer.json` `Split` regex), as `findall` would. An error names a pattern
/// this crate does not implement.
pub fn pre_tokenize<'a>(pattern: &str, text: &'a str) -> Result<Vec<&'a str>> {
    let p = pretokenize::SplitPattern::from_regex(pattern)
        .ok_or_else(|| Error::unsupported(format!("split pattern {pattern:?} is not implemented")))?;
    let classes = unicode::CharClasses::new();
    let mut out = Vec::new();
    p.for_each_match(text, &classes, |a, b| out.push(&text[a..b]));
    Ok(out)
}

/// The tokenizer file of a model directory, by the rule of [`Tokenizer::from_model_dir`]:
/// the first of `tokenizer.json`, `tiktoken.model`, `tokenizer.model` (a rank file only),
/// `tokenizer.bin`, `tok512.bin`, then the first `*.tiktoken` by name.
pub fn find_in_dir(dir: &Path) -> Option<PathBuf> {
    for name in DIR_CANDIDATES {
        let p = dir.join(name);
        if p.is_file() {
            if name == "tokenizer.model" && !looks_like_ranks(&p) {
                continue; // a SentencePiece protobuf; its tokenizer.json (if any) was tried first
            }
            return Some(p);
        }
    }
    let entries = std::fs::read_dir(dir).ok()?;
    let mut ranks: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tiktoken") && p.is_file())
        .collect();
    ranks.sort();
    ranks.into_iter().next()
}

/// Bytes of [`unicode::CharClasses`], which every tokenizer holds (checked by a unit test).
const CHAR_CLASSES_BYTES: u64 = 50176;

/// Room in the allowance for the specials, the pipeline and the path (Kimi's 256 reserved
/// specials take about 20 KiB).
const ALLOWANCE_BASE: u64 = 64 << 10;

/// Bytes of tables per byte of file the allowance grants each kind (docs/MEMORY.md): a rank
/// file or a `tokenizer.json` holds 1.6–3.6 times its size on every published vocabulary
/// measured, and up to about 5 when its lookup table's power-of-two size falls badly; a
/// llama2.c file of n records (8 + len bytes each) can hold at most 17 bytes per file byte.
const PER_FILE_BYTE: [(FileKind, u64); 3] = [(FileKind::Json, 5), (FileKind::Ranks, 5), (FileKind::Llama2c, 17)];

/// How a tokenizer file is read, decided from its name and first bytes as [`Tokenizer::from_file`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKind {
    Json,
    Ranks,
    Llama2c,
    /// A SentencePiece protobuf: refused when loaded, so it holds nothing.
    Unsupported,
}

fn file_kind(path: &Path) -> FileKind {
    let head = &file_head(path);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let ext = path.extension().and_then(|n| n.to_str()).unwrap_or("");
    if ext == "json" || (ext != "bin" && head.first() == Some(&b'{')) {
        FileKind::Json
    } else if ext == "tiktoken" {
        FileKind::Ranks
    } else if ext == "model" || name.ends_with(".model") {
        if is_rank_text(head) { FileKind::Ranks } else { FileKind::Unsupported }
    } else {
        FileKind::Llama2c
    }
}

/// The memory plan's allowance for the tokenizer loaded from `path`, from file sizes alone
/// (nothing is parsed): 64 KiB + the character classes + the `tokenizer_config.json` beside
/// it + 5 × the file (a rank file or `tokenizer.json`) or 17 × the file (llama2.c). Loading
/// refuses a file whose tables would exceed it, so it is an upper bound of
/// [`Tokenizer::heap_bytes`].
pub fn plan_bytes(path: &Path) -> Result<u64> {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).map_err(|e| Error::io(p, "stat", e));
    let kind = file_kind(path);
    let Some(&(_, k)) = PER_FILE_BYTE.iter().find(|(fk, _)| *fk == kind) else { return Ok(0) };
    let config = path.with_file_name("tokenizer_config.json");
    let config_bytes = if config.is_file() { size(&config)? } else { 0 };
    Ok(ALLOWANCE_BASE + CHAR_CLASSES_BYTES + config_bytes + k.saturating_mul(size(path)?))
}

/// [`plan_bytes`] for the tokenizer of a model directory; 0 when it has none.
pub fn plan_bytes_in_dir(dir: &Path) -> Result<u64> {
    find_in_dir(dir).map_or(Ok(0), |p| plan_bytes(&p))
}

/// The `tokenizer_config.json` beside a tokenizer file, if there is one.
fn read_config(path: &Path, limits: &Limits) -> Result<Option<(PathBuf, Json)>> {
    let p = path.with_file_name("tokenizer_config.json");
    if !p.is_file() {
        return Ok(None);
    }
    let bytes = crate::format::read_bounded_within(&p, 64 << 20, limits)?;
    let j = crate::format::json::parse_limited(&bytes, limits).map_err(|e| {
        let line = bytes[..e.offset.min(bytes.len())].iter().filter(|&&b| b == b'\n').count() + 1;
        Error::new(ErrorKind::Tokenizer, format!("{}: line {line}: {e}", p.display()))
    })?;
    Ok(Some((p, j)))
}

/// True when a file starts like a tiktoken rank file (`base64 rank` lines).
fn is_rank_text(bytes: &[u8]) -> bool {
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let mut parts = line.trim_ascii_end().split(|&b| b == b' ');
    let (Some(tok), Some(rank), None) = (parts.next(), parts.next(), parts.next()) else { return false };
    !tok.is_empty() && tok.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/' || c == b'=')
        && !rank.is_empty() && rank.iter().all(u8::is_ascii_digit)
}

fn looks_like_ranks(path: &Path) -> bool {
    is_rank_text(&file_head(path))
}

/// The first 256 bytes of a file (fewer when it is shorter; none when it cannot be read):
/// enough to tell the tokenizer formats apart. `read_to_end` goes on after a short read or
/// an interrupted one, where a single `read` may stop early.
fn file_head(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut head = Vec::with_capacity(256);
    let _ = std::fs::File::open(path).and_then(|f| f.take(256).read_to_end(&mut head));
    head
}

/// The kind, the file and the vocabulary size (the tables are too large to print).
impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer({}, {}, {} tokens)", self.kind_name(), self.path.display(), self.vocab_size())
    }
}

/// Streaming detokenizer: feed ids one at a time, get back text that is complete UTF-8.
///
/// A piece that ends inside a UTF-8 character is held back until the character completes, and
/// invalid bytes become U+FFFD only once nothing can complete them. Under a Hugging Face
/// `ByteFallback` decoder a run of `<0xXX>` tokens is decoded as one byte string: valid UTF-8
/// gives its text, anything else one U+FFFD per token of the run (the library's rule). Whether
/// a run is valid is known only when it ends, so the whole run is held until the next other
/// token (or [`Detokenizer::finish`]): an early character could otherwise turn out to be part
/// of a run that decodes to U+FFFDs.
pub struct Detokenizer {
    pending: Vec<u8>,
    at_start: bool,
    /// Number of `ByteFallback` tokens whose bytes are the whole of `pending`.
    run: usize,
}

impl Detokenizer {
    /// Adds one token and returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        if tok.is_control(id) {
            tok.token_bytes(id)?; // range check
            return Ok(String::new());
        }
        let bytes = tok.token_bytes(id)?;
        let bytes = if self.at_start { tok.first_piece(id, bytes) } else { bytes };
        self.at_start = false;
        if tok.is_fallback_byte(id) {
            let mut out = String::new();
            if self.run == 0 && !self.pending.is_empty() {
                // A run decodes apart from the text before it.
                out = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
            }
            self.pending.extend_from_slice(bytes);
            self.run += 1;
            return Ok(out);
        }
        let mut out = self.end_run();
        self.pending.extend_from_slice(bytes);
        out.push_str(&self.take_complete());
        Ok(out)
    }

    /// Returns what is left at the end of the sequence; incomplete characters become U+FFFD.
    pub fn finish(&mut self) -> String {
        if self.run > 0 {
            return self.end_run();
        }
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Decodes a finished `ByteFallback` run (empty when there is none).
    fn end_run(&mut self) -> String {
        if self.run == 0 {
            return String::new();
        }
        let out = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.to_string(),
            Err(_) => "\u{FFFD}".repeat(self.run),
        };
        self.pending.clear();
        self.run = 0;
        out
    }

    /// Emits the longest prefix that cannot change: everything except a trailing incomplete
    /// UTF-8 sequence (which may still complete). Invalid bytes before it are emitted as U+FFFD
    /// only once they can no longer become valid.
    fn take_complete(&mut self) -> String {
        let keep = incomplete_tail(&self.pending);
        let cut = self.pending.len() - keep;
        let out = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
        self.pending.drain(..cut);
        out
    }
}

/// Length of a trailing sequence that is a valid but incomplete UTF-8 prefix (0..=3 bytes).
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=3.min(b.len()) {
        let c = b[b.len() - back];
        if c & 0xC0 == 0x80 {
            continue; // continuation byte: look further back for the lead
        }
        let need = match c {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::{incomplete_tail, is_rank_text};

    #[test]
    fn char_classes_take_what_the_allowance_says() {
        assert_eq!(super::unicode::CharClasses::new().heap_bytes(), super::CHAR_CLASSES_BYTES);
    }

    #[test]
    fn incomplete_tails() {
        assert_eq!(incomplete_tail(b"ab"), 0);
        assert_eq!(incomplete_tail(b"a\xe4"), 1);
        assert_eq!(incomplete_tail(b"a\xe4\xb8"), 2);
        assert_eq!(incomplete_tail("a世".as_bytes()), 0);
        assert_eq!(incomplete_tail(b"\xf0\x9f\x98"), 3);
        assert_eq!(incomplete_tail(b"\x80"), 0);
    }

    #[test]
    fn sniffs_rank_files() {
        assert!(is_rank_text(b"IQ== 0\nIg== 1\n"));
        assert!(!is_rank_text(b"\x0a\x0b<unk>"));
    }
}
