//! SentencePiece-style BPE with scores and byte fallback, read from llama2.c's `tok*.bin`.
//!
//! File layout: `u32 max_token_length`, then per token `f32 score, u32 len, len bytes`, all
//! little-endian. Pieces `<0xXX>` stand for single bytes; ids 0, 1, 2 are `<unk>`, BOS, EOS.
//!
//! Encoding (as llama2.c's `encode` does it): a dummy-prefix space token, one token per
//! character (or its byte tokens when the character is not in the vocabulary), then repeatedly
//! merge the adjacent pair whose concatenation is a piece with the highest score, the leftmost
//! among equal scores. Byte tokens never merge (their text is `<0xXX>`, which concatenates to
//! no piece). The merging is the shared heap-ordered core of [`super::bpe`], ranks being the
//! scores' order.

use super::bpe::{self, PairRule, Scratch, Sym, TokenTable};
use crate::error::{Error, ErrorKind, Result};
use std::path::Path;

/// A SentencePiece-style vocabulary.
pub struct SentencePiece {
    /// What each id decodes to (control tokens decode to nothing).
    bytes: Vec<Vec<u8>>,
    /// Piece text → id, for the ordinary pieces.
    table: TokenTable,
    /// Merge rank of each id: 0 for the highest score; equal scores share a rank.
    rank: Vec<u32>,
    control: Vec<bool>,
    /// Byte value → id of its `<0xXX>` piece.
    byte_ids: [Option<u32>; 256],
}

const UNK: u32 = 0;
const BOS: u32 = 1;
const EOS: u32 = 2;

impl SentencePiece {
    /// Parses a llama2.c tokenizer file. The vocabulary size is the number of records.
    pub fn from_llama2c(path: &Path, data: &[u8]) -> Result<SentencePiece> {
        let bad = |at: usize, msg: &str| {
            Error::new(ErrorKind::Tokenizer, format!("{}: byte {at}: {msg}", path.display()))
        };
        let word = |at: usize| -> Option<[u8; 4]> { data.get(at..at + 4)?.try_into().ok() };
        let max_len = u32::from_le_bytes(word(0).ok_or_else(|| bad(0, "truncated header"))?);
        let mut at = 4usize;
        let (mut bytes, mut scores, mut control) = (Vec::new(), Vec::new(), Vec::new());
        let mut table = TokenTable::new(0);
        let mut ordinary = Vec::new();
        let mut byte_ids = [None; 256];
        while at < data.len() {
            let id = bytes.len() as u32;
            // Fewer bytes than a record header after a plausible vocabulary: say what they are
            // (a short tail inside the control tokens is a truncated record, reported below).
            if data.len() - at < 8 && id > EOS {
                return Err(bad(at, &format!("{} bytes of trailing data after the {id} token records (a record takes at least 8; \
                    or the file is truncated)", data.len() - at)));
            }
            let score = f32::from_le_bytes(word(at).ok_or_else(|| bad(at, "truncated token record"))?);
            let raw_len = i32::from_le_bytes(word(at + 4).ok_or_else(|| bad(at + 4, "truncated token record"))?);
            // llama2.c reads the length as a signed int.
            if raw_len < 0 {
                return Err(bad(at + 4, &format!("token {id} has a negative length ({raw_len})")));
            }
            let len = raw_len as usize;
            if len > max_len as usize || len > 256 {
                return Err(bad(at + 4, &format!("token {id} has length {len}, over the declared maximum {max_len}")));
            }
            let piece = data.get(at + 8..at + 8 + len).ok_or_else(|| bad(at + 8, &format!("token {id} runs past the end of the file")))?;
            if !score.is_finite() {
                return Err(bad(at, &format!("token {id} has a non-finite score")));
            }
            at += 8 + len;
            let is_control = id <= EOS;
            let mut is_ordinary = false;
            if let Some(b) = parse_byte_piece(piece) {
                byte_ids[b as usize].get_or_insert(id);
                bytes.push(vec![b]);
            } else if is_control {
                bytes.push(Vec::new());
            } else {
                table.set(id, piece);
                is_ordinary = true;
                bytes.push(piece.to_vec());
            }
            ordinary.push(is_ordinary);
            scores.push(score);
            control.push(is_control);
        }
        if bytes.len() <= EOS as usize {
            return Err(bad(at, "fewer than 3 tokens"));
        }
        // Duplicate pieces: llama2.c's sorted lookup finds one of them; the lowest id here.
        table.index(|id| ordinary[id as usize], |_, _| {});
        Ok(SentencePiece { bytes, table, rank: score_ranks(&scores), control, byte_ids })
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }

    /// Heap bytes held: each id's bytes, the piece table, ranks and control flags.
    pub fn heap_bytes(&self) -> u64 {
        use crate::sys::vec_bytes;
        vec_bytes(&self.bytes) + self.bytes.iter().map(vec_bytes).sum::<u64>() + self.table.heap_bytes()
            + vec_bytes(&self.rank) + vec_bytes(&self.control)
    }

    /// The beginning-of-sequence id.
    pub fn bos(&self) -> u32 {
        BOS
    }

    /// The end-of-sequence id.
    pub fn eos(&self) -> u32 {
        EOS
    }

    /// True for a control token (never text).
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    /// A token's bytes; `None` for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).map(Vec::as_slice)
    }

    /// Encodes `text` with the dummy-prefix space, no BOS.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, true)
    }

    /// Encodes `text`, with the dummy-prefix space when `dummy_prefix` (text that continues
    /// earlier text has none).
    pub fn encode_with(&self, text: &str, dummy_prefix: bool) -> Vec<u32> {
        if text.is_empty() {
            return Vec::new();
        }
        let piece = if dummy_prefix { format!(" {text}") } else { text.to_string() };
        let b = piece.as_bytes();
        let mut init: Vec<Sym> = Vec::with_capacity(b.len());
        for (i, c) in piece.char_indices() {
            let end = i + c.len_utf8();
            match self.table.find(&b[i..end]) {
                Some(id) => init.push(Sym { start: i, end, id, mergeable: true }),
                // The dummy prefix is skipped when the vocabulary has no space piece.
                None if i == 0 && dummy_prefix => {}
                None => init.extend((i..end).map(|k| Sym {
                    start: k,
                    end: k + 1,
                    id: self.byte_ids[b[k] as usize].unwrap_or(UNK),
                    mergeable: false,
                })),
            }
        }
        let mut out = Vec::with_capacity(init.len());
        bpe::merge(b, &init, self, &mut Scratch::default(), &mut out);
        out
    }
}

impl PairRule for SentencePiece {
    fn pair(&self, piece: &[u8], left: &Sym, right: &Sym) -> Option<(u32, u32)> {
        let id = self.table.find(&piece[left.start..right.end])?;
        Some((self.rank[id as usize], id))
    }
}

/// Dense ranks of scores, highest first; equal scores get equal ranks so that the leftmost
/// pair wins among them, as in llama2.c's strict `>` scan.
pub fn score_ranks(scores: &[f32]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let mut rank = vec![0u32; scores.len()];
    let mut r = 0u32;
    for (k, &i) in order.iter().enumerate() {
        if k > 0 && scores[i] != scores[order[k - 1]] {
            r += 1;
        }
        rank[i] = r;
    }
    rank
}

/// `<0xAB>` → 0xAB.
fn parse_byte_piece(p: &[u8]) -> Option<u8> {
    if p.len() != 6 || !p.starts_with(b"<0x") || p[5] != b'>' {
        return None;
    }
    u8::from_str_radix(std::str::from_utf8(&p[3..5]).ok()?, 16).ok()
}
