//! Text ↔ token ids, exactly as each model family's reference tokenizer does it.
//!
//! Two encoding entry points keep markup apart from content (seed 001, "Tokenizer"):
//! [`Tokenizer::encode`] treats special-token strings such as `<|endoftext|>` as ordinary text
//! and can never produce a control-token id; [`Tokenizer::encode_markup`] resolves them. A
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
use crate::format::json::Json;
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

enum Kind {
    /// llama2.c `tok512.bin`: SentencePiece-style pieces with scores and byte fallback.
    SentencePiece(SentencePiece),
    /// A tiktoken rank file, or Kimi's `tiktoken.model`.
    Tiktoken(tiktoken::Tiktoken),
    /// A Hugging Face `tokenizer.json` BPE tokenizer.
    Hf(hf::HfTokenizer),
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
        for name in DIR_CANDIDATES {
            let p = dir.join(name);
            if p.is_file() {
                if name == "tokenizer.model" && !looks_like_ranks(&p) {
                    continue; // a SentencePiece protobuf; its tokenizer.json (if any) was tried first
                }
                return Tokenizer::from_file(&p);
            }
        }
        if let Ok(entries) = std::fs::read_dir(dir) {
            let mut ranks: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "tiktoken") && p.is_file())
                .collect();
            ranks.sort();
            if let Some(p) = ranks.first() {
                return Tokenizer::from_file(p);
            }
        }
        Err(Error::new(ErrorKind::Tokenizer, format!(
            "{}: no tokenizer file found (looked for {}, *.tiktoken)", dir.display(), DIR_CANDIDATES.join(", "))))
    }

    /// Loads a tokenizer file, choosing the kind from its name and contents.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = crate::format::read_bounded(path, MAX_FILE)?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ext = path.extension().and_then(|n| n.to_str()).unwrap_or("");
        let config = read_config(path)?;
        let config_ref = config.as_ref().map(|(p, j)| (p.as_path(), j));
        let kind = if ext == "json" || (ext != "bin" && bytes.first() == Some(&b'{')) {
            Kind::Hf(hf::HfTokenizer::parse(path, &bytes, config_ref)?)
        } else if ext == "tiktoken" {
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
        Ok(Tokenizer { kind, path: path.to_path_buf(), classes: unicode::CharClasses::new() })
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
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        match &self.kind {
            Kind::SentencePiece(sp) => return sp.encode(text),
            Kind::Tiktoken(t) => t.encode_ordinary(text, self.classes(), &mut out),
            Kind::Hf(h) => h.encode(text, false, self.classes(), &mut out),
        }
        out
    }

    /// Encodes markup: special-token strings become their ids. No BOS is added.
    pub fn encode_markup(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        match &self.kind {
            // tok512 has no special-token strings that text can spell.
            Kind::SentencePiece(sp) => return sp.encode(text),
            Kind::Tiktoken(t) => {
                for seg in t.specials.split(text) {
                    match seg {
                        specials::Segment::Text(s) => t.encode_ordinary(s, self.classes(), &mut out),
                        specials::Segment::Special(id) => out.push(id),
                    }
                }
            }
            Kind::Hf(h) => h.encode(text, true, self.classes(), &mut out),
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

    /// The special-token strings that [`Tokenizer::encode_markup`] recognises, with their ids.
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
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut d = self.detokenizer();
        let mut out = String::new();
        for &id in ids {
            out.push_str(&d.push(self, id)?);
        }
        out.push_str(&d.finish());
        Ok(out)
    }

    /// Decodes ids to the exact bytes they stand for (no U+FFFD substitution).
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut at_start = true;
        for &id in ids {
            let b = self.token_bytes(id)?;
            if self.is_control(id) {
                continue;
            }
            if at_start {
                out.extend_from_slice(&self.first_piece(b));
            } else {
                out.extend_from_slice(b);
            }
            at_start = false;
        }
        Ok(out)
    }

    /// A streaming decoder for a sequence from its start.
    pub fn detokenizer(&self) -> Detokenizer {
        Detokenizer { pending: Vec::new(), at_start: true }
    }

    /// A streaming decoder for the tokens that follow `prefix` (a prompt already shown): the
    /// first piece keeps its leading space unless `prefix` held no text token.
    pub fn detokenizer_after(&self, prefix: &[u32]) -> Detokenizer {
        let at_start = prefix.iter().all(|&id| self.is_control(id));
        Detokenizer { pending: Vec::new(), at_start }
    }

    /// The bytes of the first text token of a sequence: SentencePiece vocabularies drop the
    /// dummy-prefix space (one leading space; HF `Metaspace` decoders drop every space of
    /// that token).
    fn first_piece<'a>(&self, b: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        use std::borrow::Cow;
        let leading = match &self.kind {
            Kind::SentencePiece(_) => hf::Leading::StripOne,
            Kind::Tiktoken(_) => hf::Leading::Keep,
            Kind::Hf(h) => h.leading,
        };
        match leading {
            hf::Leading::Keep => Cow::Borrowed(b),
            hf::Leading::StripOne => Cow::Borrowed(b.strip_prefix(b" ").unwrap_or(b)),
            hf::Leading::DropFirstTokenSpaces if b.contains(&b' ') => Cow::Owned(b.iter().copied().filter(|&c| c != b' ').collect()),
            hf::Leading::DropFirstTokenSpaces => Cow::Borrowed(b),
        }
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

/// The `tokenizer_config.json` beside a tokenizer file, if there is one.
fn read_config(path: &Path) -> Result<Option<(PathBuf, Json)>> {
    let p = path.with_file_name("tokenizer_config.json");
    if !p.is_file() {
        return Ok(None);
    }
    let bytes = crate::format::read_bounded(&p, 64 << 20)?;
    let j = crate::format::json::parse(&bytes).map_err(|e| {
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
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).and_then(|mut f| f.read(&mut head)).unwrap_or(0);
    is_rank_text(&head[..n])
}

/// Streaming detokenizer: feed ids one at a time, get back text that is complete UTF-8.
pub struct Detokenizer {
    pending: Vec<u8>,
    at_start: bool,
}

impl Detokenizer {
    /// Adds one token and returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        if tok.is_control(id) {
            tok.token_bytes(id)?; // range check
            return Ok(String::new());
        }
        let bytes = tok.token_bytes(id)?;
        if self.at_start {
            self.pending.extend_from_slice(&tok.first_piece(bytes));
        } else {
            self.pending.extend_from_slice(bytes);
        }
        self.at_start = false;
        Ok(self.take_complete())
    }

    /// Returns what is left at the end of the sequence; incomplete characters become U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
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
