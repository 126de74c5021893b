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

mod sentencepiece;

use crate::error::{Error, ErrorKind, Result};
use std::path::{Path, PathBuf};

pub use sentencepiece::SentencePiece;

/// A loaded tokenizer of one of the supported vocabulary kinds.
pub struct Tokenizer {
    kind: Kind,
    path: PathBuf,
}

enum Kind {
    /// llama2.c `tok512.bin`: SentencePiece-style pieces with scores and byte fallback.
    SentencePiece(SentencePiece),
}

impl Tokenizer {
    /// Finds and loads the tokenizer of a model directory: `tokenizer.json`, `tokenizer.model`
    /// (tiktoken), or a llama2.c `tok*.bin`.
    pub fn from_model_dir(dir: &Path) -> Result<Tokenizer> {
        let candidates = ["tokenizer.bin", "tok512.bin"];
        for name in candidates {
            let p = dir.join(name);
            if p.is_file() {
                return Tokenizer::from_file(&p);
            }
        }
        Err(Error::new(ErrorKind::Tokenizer, format!(
            "{}: no tokenizer file found (looked for {})", dir.display(), candidates.join(", "))))
    }

    /// Loads a tokenizer file, choosing the kind from its name and contents.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = crate::format::read_bounded(path, 64 << 20)?;
        let sp = SentencePiece::from_llama2c(path, &bytes)?;
        Ok(Tokenizer { kind: Kind::SentencePiece(sp), path: path.to_path_buf() })
    }

    /// The file the tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of token ids (the largest id + 1).
    pub fn vocab_size(&self) -> usize {
        match &self.kind {
            Kind::SentencePiece(sp) => sp.vocab_size(),
        }
    }

    /// The beginning-of-sequence id that prompts start with, if this vocabulary adds one.
    pub fn bos(&self) -> Option<u32> {
        match &self.kind {
            Kind::SentencePiece(sp) => Some(sp.bos()),
        }
    }

    /// End-of-sequence ids of the vocabulary itself (the model config may add more).
    pub fn eos(&self) -> Vec<u32> {
        match &self.kind {
            Kind::SentencePiece(sp) => vec![sp.eos()],
        }
    }

    /// Encodes content: special-token strings are plain text. No BOS is added.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match &self.kind {
            Kind::SentencePiece(sp) => sp.encode(text),
        }
    }

    /// Encodes markup: special-token strings become their control ids. No BOS is added.
    pub fn encode_markup(&self, text: &str) -> Vec<u32> {
        match &self.kind {
            // tok512 has no special-token strings that text can spell.
            Kind::SentencePiece(sp) => sp.encode(text),
        }
    }

    /// The raw bytes a token stands for (empty for control tokens); an error for an id out of
    /// range.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        match &self.kind {
            Kind::SentencePiece(sp) => sp.token_bytes(id),
        }
        .ok_or_else(|| Error::new(ErrorKind::Tokenizer, format!(
            "{}: token id {id} is out of range (vocabulary of {})", self.path.display(), self.vocab_size())))
    }

    /// True for control tokens (BOS, EOS, and other specials), which decode to nothing.
    pub fn is_control(&self, id: u32) -> bool {
        match &self.kind {
            Kind::SentencePiece(sp) => sp.is_control(id),
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

    /// Whether the first text piece of a sequence loses one leading space on decode
    /// (SentencePiece's dummy prefix).
    fn strips_leading_space(&self) -> bool {
        matches!(self.kind, Kind::SentencePiece(_))
    }
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
        let mut bytes = tok.token_bytes(id)?;
        if self.at_start && tok.strips_leading_space() && bytes.first() == Some(&b' ') {
            bytes = &bytes[1..];
        }
        self.at_start = false;
        self.pending.extend_from_slice(bytes);
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
    use super::incomplete_tail;

    #[test]
    fn incomplete_tails() {
        assert_eq!(incomplete_tail(b"ab"), 0);
        assert_eq!(incomplete_tail(b"a\xe4"), 1);
        assert_eq!(incomplete_tail(b"a\xe4\xb8"), 2);
        assert_eq!(incomplete_tail("a世".as_bytes()), 0);
        assert_eq!(incomplete_tail(b"\xf0\x9f\x98"), 3);
        assert_eq!(incomplete_tail(b"\x80"), 0);
    }
}
