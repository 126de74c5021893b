//! SentencePiece-style BPE with scores and byte fallback, read from llama2.c's `tok*.bin`.
//!
//! File layout: `u32 max_token_length`, then per token `f32 score, u32 len, len bytes`, all
//! little-endian. Pieces `<0xXX>` stand for single bytes; ids 0, 1, 2 are `<unk>`, BOS, EOS.
//!
//! Encoding (as llama2.c and SentencePiece's BPE do it): a dummy-prefix space, one piece per
//! character (or its bytes when the character is not in the vocabulary), then repeatedly merge
//! the adjacent pair whose concatenation is a piece with the highest score.

use crate::error::{Error, ErrorKind, Result};
use std::collections::HashMap;
use std::path::Path;

/// A SentencePiece-style vocabulary.
pub struct SentencePiece {
    /// What each id decodes to (control tokens decode to nothing).
    bytes: Vec<Vec<u8>>,
    scores: Vec<f32>,
    control: Vec<bool>,
    /// Piece text → id, for the ordinary pieces.
    lookup: HashMap<Vec<u8>, u32>,
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
        let mut lookup = HashMap::new();
        let mut byte_ids = [None; 256];
        while at < data.len() {
            let id = bytes.len() as u32;
            let score = f32::from_le_bytes(word(at).ok_or_else(|| bad(at, "truncated token record"))?);
            let len = u32::from_le_bytes(word(at + 4).ok_or_else(|| bad(at + 4, "truncated token record"))?) as usize;
            if len > max_len as usize || len > 256 {
                return Err(bad(at + 4, &format!("token {id} has length {len}, over the declared maximum {max_len}")));
            }
            let piece = data.get(at + 8..at + 8 + len).ok_or_else(|| bad(at + 8, &format!("token {id} runs past the end of the file")))?;
            if !score.is_finite() {
                return Err(bad(at, &format!("token {id} has a non-finite score")));
            }
            at += 8 + len;
            let is_control = id <= EOS;
            if let Some(b) = parse_byte_piece(piece) {
                byte_ids[b as usize].get_or_insert(id);
                bytes.push(vec![b]);
            } else if is_control {
                bytes.push(Vec::new());
            } else {
                lookup.entry(piece.to_vec()).or_insert(id);
                bytes.push(piece.to_vec());
            }
            scores.push(score);
            control.push(is_control);
        }
        if bytes.len() <= EOS as usize {
            return Err(bad(at, "fewer than 3 tokens"));
        }
        Ok(SentencePiece { bytes, scores, control, lookup, byte_ids })
    }

    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }

    pub fn bos(&self) -> u32 {
        BOS
    }

    pub fn eos(&self) -> u32 {
        EOS
    }

    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).map(Vec::as_slice)
    }

    /// Encodes `text` with the dummy-prefix space, no BOS.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut ids: Vec<u32> = Vec::with_capacity(text.len() + 1);
        if let Some(&space) = self.lookup.get(&b" "[..]) {
            ids.push(space);
        }
        let mut buf = [0u8; 4];
        for c in text.chars() {
            let s = c.encode_utf8(&mut buf).as_bytes();
            match self.lookup.get(s) {
                Some(&id) => ids.push(id),
                None => ids.extend(s.iter().map(|&b| self.byte_ids[b as usize].unwrap_or(UNK))),
            }
        }
        self.merge(&mut ids);
        ids
    }

    /// Repeatedly merges the best-scoring adjacent pair (ties: the leftmost).
    fn merge(&self, ids: &mut Vec<u32>) {
        let mut joined = Vec::new();
        loop {
            let mut best: Option<(f32, usize, u32)> = None;
            for i in 0..ids.len().saturating_sub(1) {
                joined.clear();
                joined.extend_from_slice(&self.bytes[ids[i] as usize]);
                joined.extend_from_slice(&self.bytes[ids[i + 1] as usize]);
                if let Some(&id) = self.lookup.get(&joined) {
                    let score = self.scores[id as usize];
                    if best.is_none_or(|(s, _, _)| score > s) {
                        best = Some((score, i, id));
                    }
                }
            }
            let Some((_, i, id)) = best else { break };
            ids[i] = id;
            ids.remove(i + 1);
        }
    }
}

/// `<0xAB>` → 0xAB.
fn parse_byte_piece(p: &[u8]) -> Option<u8> {
    if p.len() != 6 || !p.starts_with(b"<0x") || p[5] != b'>' {
        return None;
    }
    u8::from_str_radix(std::str::from_utf8(&p[3..5]).ok()?, 16).ok()
}
