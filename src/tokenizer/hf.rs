//! Hugging Face `tokenizer.json` with a BPE model: the byte-level kind (GPT-2, SmolLM2,
//! Qwen2/3, DeepSeek-V3, OLMoE, Llama 3) and the SentencePiece kind with byte fallback and
//! the `▁` space (Llama 2, Mixtral).
//!
//! The pipeline is the library's: added tokens are cut out of markup first, each remaining
//! segment is normalized, pre-tokenized (a sequence of splits), and every piece goes through
//! BPE with the `merges` ranks. Decoding bytes per id follow the `decoder`. Split patterns are
//! recognised by their exact text (see [`super::pretokenize`]); a pipeline element this crate
//! does not implement is an error naming its key, never a silent approximation.

use super::bpe::{self, IdBuildHasher, PairRule, Scratch, Sym, TokenTable};
use super::normalize::Normalizer;
use super::pretokenize::SplitPattern;
use super::specials::SpecialMatcher;
use super::unicode::CharClasses;
use crate::error::{Error, ErrorKind, Result};
use crate::format::json::Json;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// One step of the pre-tokenizer sequence.
#[derive(Clone, Debug, PartialEq)]
enum PreStep {
    /// `Split` with a known regex; `removed` drops the matches (behavior `Removed`), else
    /// they are isolated.
    Split { pattern: SplitPattern, removed: bool },
    /// `Split` on a literal string, isolated or removed.
    SplitLiteral { literal: String, removed: bool },
    /// `ByteLevel`: optional prefix space, optional GPT-2 split; the byte mapping itself is
    /// implicit (pieces stay raw bytes).
    ByteLevel { add_prefix_space: bool, use_regex: bool },
    /// `Digits`: each digit alone, or runs of digits.
    Digits { individual: bool },
    /// `Metaspace`: spaces become `replacement`, which is also prepended.
    Metaspace { replacement: String, prepend: Prepend, split: bool },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Prepend {
    Always,
    First,
    Never,
}

/// An entry of `added_tokens`.
struct Added {
    content: String,
    id: u32,
    special: bool,
    lstrip: bool,
    rstrip: bool,
    /// Matched on normalized text (with its content normalized), not on the raw text.
    normalized: bool,
}

/// A `tokenizer.json` BPE tokenizer.
pub struct HfTokenizer {
    normalizer: Option<Normalizer>,
    steps: Vec<PreStep>,
    /// Pieces are raw bytes mapped to the 256 byte tokens (`ByteLevel`), or characters looked
    /// up in the vocabulary with byte fallback (SentencePiece style).
    byte_level: bool,
    /// Model-space bytes → id, for the model's own vocabulary; decode bytes per id.
    model_table: TokenTable,
    decode_table: TokenTable,
    /// Decode bytes of the ids whose bytes differ as the first text token (Metaspace).
    first_table: TokenTable,
    /// Ids that the `ByteFallback` decoder turns into single bytes.
    fallback: Vec<bool>,
    pairs: HashMap<u64, (u32, u32), IdBuildHasher>,
    byte_ids: [Option<u32>; 256],
    byte_fallback: bool,
    unk: Option<u32>,
    fuse_unk: bool,
    ignore_merges: bool,
    added: Vec<Added>,
    /// Every added token, for id lookups and listing.
    markup: SpecialMatcher,
    /// Added tokens matched on the raw text, and their `(lstrip, rstrip)` per entry.
    raw_markup: SpecialMatcher,
    raw_flags: Vec<(bool, bool)>,
    /// Added tokens matched on normalized text (contents normalized), and their flags.
    norm_markup: SpecialMatcher,
    norm_flags: Vec<(bool, bool)>,
    control: Vec<bool>,
    /// What the decoder does to the spaces of the first token (SentencePiece's dummy prefix).
    pub leading: Leading,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
}

/// GPT-2's reversible byte ↔ printable-character mapping (`bytes_to_unicode`).
fn byte_to_char() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            extra += 1;
            255 + extra
        };
        out[b as usize] = char::from_u32(c).unwrap_or('\0');
    }
    out
}

/// Inverse of [`byte_to_char`] for one string; `None` if a character is outside the mapping.
fn byte_level_decode(s: &str, inverse: &HashMap<char, u8>) -> Option<Vec<u8>> {
    s.chars().map(|c| inverse.get(&c).copied()).collect()
}

fn err(path: &Path, key: &str, msg: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Tokenizer, format!("{}: key `{key}`: {msg}", path.display()))
}

/// A valid pipeline element this crate does not implement (`ErrorKind::Unsupported`).
fn unsupported(path: &Path, key: &str, msg: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unsupported, format!("{}: key `{key}`: {msg}", path.display()))
}

/// Typed access to a `tokenizer.json` value, with errors naming the file and key.
struct Doc<'a> {
    path: &'a Path,
    /// Ids are bounded by the file size, so a hostile id cannot make a huge table.
    max_id: u64,
}

impl<'a> Doc<'a> {
    fn str<'j>(&self, v: &'j Json, key: &str, field: &str) -> Result<&'j str> {
        v.get(field).and_then(Json::as_str).ok_or_else(|| err(self.path, &format!("{key}.{field}"), "missing or not a string"))
    }
    fn bool_or(&self, v: &Json, key: &str, field: &str, default: bool) -> Result<bool> {
        match v.get(field) {
            None | Some(Json::Null) => Ok(default),
            Some(x) => x.as_bool().ok_or_else(|| err(self.path, &format!("{key}.{field}"), "not a boolean")),
        }
    }
    fn id(&self, v: &Json, key: &str) -> Result<u32> {
        v.as_u64().filter(|&i| i < self.max_id).map(|i| i as u32)
            .ok_or_else(|| err(self.path, key, format!("not a token id below {} (bounded by the file size)", self.max_id)))
    }
}

impl HfTokenizer {
    /// Parses `tokenizer.json` (`data`); `config` is the parsed `tokenizer_config.json` beside
    /// it, if any (for `add_bos_token`, `bos_token`, `eos_token`).
    /// The text and its tree are held within `limits`.
    /// The file's bytes are taken and dropped once parsed, before the tables are built.
    pub(crate) fn parse_within(path: &Path, data: Vec<u8>, config: Option<(&Path, &Json)>, limits: &crate::format::json::Limits) -> Result<HfTokenizer> {
        let root = crate::format::json::parse_limited(&data, limits).map_err(|e| {
            let line = data[..e.offset.min(data.len())].iter().filter(|&&b| b == b'\n').count() + 1;
            Error::new(ErrorKind::Tokenizer, format!("{}: line {line}: {e}", path.display()))
        })?;
        let d = Doc { path, max_id: (data.len() as u64).min(1 << 30) };
        drop(data);
        let model = root.get("model").ok_or_else(|| err(path, "model", "missing"))?;
        let mtype = model.get("type").and_then(Json::as_str).unwrap_or("BPE");
        if mtype != "BPE" {
            return Err(unsupported(path, "model.type", format!("`{mtype}` models are not supported (only BPE)")));
        }
        for field in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if model.get(field).is_some_and(|v| !v.is_null() && v.as_str() != Some("")) {
                return Err(unsupported(path, &format!("model.{field}"), "is not supported"));
            }
        }
        if model.get("dropout").is_some_and(|v| !v.is_null()) {
            return Err(unsupported(path, "model.dropout", "BPE dropout is random; not supported"));
        }
        let normalizer = match root.get("normalizer") {
            None | Some(Json::Null) => None,
            Some(n) => Some(parse_normalizer(&d, n, "normalizer")?),
        };
        let steps = match root.get("pre_tokenizer") {
            None | Some(Json::Null) => Vec::new(),
            Some(p) => {
                let mut v = Vec::new();
                parse_pre(&d, p, "pre_tokenizer", &mut v)?;
                v
            }
        };
        let byte_level = steps.iter().any(|s| matches!(s, PreStep::ByteLevel { .. }));
        let decoder = root.get("decoder").unwrap_or(&Json::Null);
        let dec = parse_decoder(&d, decoder, "decoder")?;

        let b2c = byte_to_char();
        let inverse: HashMap<char, u8> = b2c.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        let Vocab { by_key, model_table, mut decode_table, mut first_table, mut fallback } = parse_vocab(&d, model, byte_level, &dec, &inverse)?;
        let pairs = parse_merges(&d, model, &by_key)?;
        let byte_fallback = d.bool_or(model, "model", "byte_fallback", false)?;
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = if byte_level {
                by_key.get(b2c[b].to_string().as_str()).copied()
            } else {
                by_key.get(format!("<0x{b:02X}>").as_str()).copied()
            };
        }
        let unk = match model.get("unk_token") {
            None | Some(Json::Null) => None,
            Some(u) => {
                let s = u.as_str().ok_or_else(|| err(path, "model.unk_token", "not a string"))?;
                Some(*by_key.get(s).ok_or_else(|| err(path, "model.unk_token", format!("{s:?} is not in the vocabulary")))?)
            }
        };

        let added = parse_added(&d, &root)?;
        let mut n = decode_table.len();
        for a in &added {
            n = n.max(a.id as usize + 1);
        }
        let mut control = vec![false; n];
        for a in &added {
            if a.special {
                control[a.id as usize] = true;
                decode_table.set(a.id, &[]);
            } else {
                decode_table.set(a.id, &dec.bytes(&a.content, &inverse));
                if let Some(b) = dec.first_bytes(&a.content, &inverse) {
                    first_table.set(a.id, &b);
                }
                if dec.is_fallback_byte(&a.content) {
                    mark(&mut fallback, a.id);
                } else if let Some(f) = fallback.get_mut(a.id as usize) {
                    *f = false; // an added token shadows the vocabulary entry of its id
                }
            }
        }
        // Ids that no vocabulary entry or added token names decode to nothing.
        for (id, c) in control.iter_mut().enumerate() {
            if decode_table.bytes(id as u32).is_none() {
                *c = true;
            }
        }
        let markup = SpecialMatcher::new(added.iter().map(|a| (a.content.clone(), a.id)));
        let (raw_markup, raw_flags) = added_matcher(added.iter().filter(|a| !a.normalized), |c| c.to_string());
        let (norm_markup, norm_flags) = added_matcher(added.iter().filter(|a| a.normalized), |c| match &normalizer {
            Some(n) => n.apply(Cow::Borrowed(c)).into_owned(),
            None => c.to_string(),
        });

        let mut t = HfTokenizer {
            normalizer,
            steps,
            byte_level,
            model_table,
            decode_table,
            first_table,
            fallback,
            pairs,
            byte_ids,
            byte_fallback,
            unk,
            fuse_unk: d.bool_or(model, "model", "fuse_unk", false)?,
            ignore_merges: d.bool_or(model, "model", "ignore_merges", false)?,
            added,
            markup,
            raw_markup,
            raw_flags,
            norm_markup,
            norm_flags,
            control,
            leading: dec.leading,
            bos: None,
            eos: Vec::new(),
        };
        t.bos = template_bos(&d, root.get("post_processor").unwrap_or(&Json::Null), &t)?;
        t.apply_config(config, &by_key)?;
        Ok(t)
    }

    /// `tokenizer_config.json`: `add_bos_token` overrides the post-processor (as transformers
    /// does for Llama-style tokenizers); `eos_token` names the end-of-sequence token.
    fn apply_config(&mut self, config: Option<(&Path, &Json)>, by_key: &HashMap<&str, u32>) -> Result<()> {
        let lookup = |s: &str| self.markup.id_of(s).or_else(|| by_key.get(s).copied());
        let named = |cfg: &Json, cpath: &Path, key: &str| -> Result<Option<u32>> {
            let Some(v) = cfg.get(key) else { return Ok(None) };
            if v.is_null() {
                return Ok(None);
            }
            let s = v.as_str().or_else(|| v.get("content").and_then(Json::as_str)).ok_or_else(|| err(cpath, key, "not a string"))?;
            lookup(s).map(Some).ok_or_else(|| err(cpath, key, format!("{s:?} is not a token")))
        };
        let mut eos = None;
        if let Some((cpath, cfg)) = config {
            eos = named(cfg, cpath, "eos_token")?;
            match cfg.get("add_bos_token").and_then(Json::as_bool) {
                Some(true) => self.bos = named(cfg, cpath, "bos_token")?.or(self.bos),
                Some(false) => self.bos = None,
                None => {}
            }
        }
        let eos = eos.or_else(|| {
            ["</s>", "<|endoftext|>", "<|end_of_text|>", "<｜end▁of▁sentence｜>", "[EOS]"].iter().find_map(|s| lookup(s))
        });
        self.eos = eos.into_iter().collect();
        Ok(())
    }

    pub fn vocab_size(&self) -> usize {
        self.control.len()
    }

    /// True for the byte-level kind (GPT-2 style), false for the SentencePiece kind.
    pub fn is_byte_level(&self) -> bool {
        self.byte_level
    }

    /// Heap bytes held: both token tables, the merge ranks, added tokens, the pipeline's
    /// strings, control flags and the EOS list.
    pub fn heap_bytes(&self) -> u64 {
        use crate::sys::{hash_map_bytes, vec_bytes};
        let step = |s: &PreStep| match s {
            PreStep::SplitLiteral { literal, .. } => literal.capacity() as u64,
            PreStep::Metaspace { replacement, .. } => replacement.capacity() as u64,
            _ => 0,
        };
        self.normalizer.as_ref().map_or(0, Normalizer::heap_bytes)
            + vec_bytes(&self.steps) + self.steps.iter().map(step).sum::<u64>()
            + self.model_table.heap_bytes() + self.decode_table.heap_bytes()
            + hash_map_bytes(self.pairs.capacity(), std::mem::size_of::<(u64, (u32, u32))>())
            + vec_bytes(&self.added) + self.added.iter().map(|a| a.content.capacity() as u64).sum::<u64>()
            + self.markup.heap_bytes() + vec_bytes(&self.control) + vec_bytes(&self.eos)
    }

    /// Every added token (special or not): what markup may spell.
    pub fn markup_tokens(&self) -> Vec<(String, u32)> {
        self.markup.entries().to_vec()
    }

    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        if id as usize >= self.control.len() {
            return None;
        }
        Some(self.decode_table.bytes(id).unwrap_or(&[]))
    }

    /// The bytes of `id` as the first text token, where the decoder treats it differently
    /// (Metaspace drops its replacement character there).
    pub fn first_token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.first_table.bytes(id)
    }

    /// True for a `<0xXX>` token under a `ByteFallback` decoder: a run of them decodes as one
    /// byte string, and when that is not valid UTF-8 every token of the run becomes U+FFFD.
    pub fn is_fallback_byte(&self, id: u32) -> bool {
        self.fallback.get(id as usize).copied().unwrap_or(false)
    }

    /// Encodes text: with `markup`, added tokens become their ids; without, the whole text
    /// is content.
    ///
    /// Markup follows the library's `extract_and_normalize`: tokens marked `normalized: false`
    /// are cut out of the raw text; each stretch between them is normalized, and tokens marked
    /// `normalized: true` (their contents normalized the same way) are cut out of that. What
    /// is left is pre-tokenized and encoded. All byte offsets of the second pass are into the
    /// normalized stretch, which is what the pre-tokenizer then sees.
    pub fn encode(&self, text: &str, markup: bool, cc: &CharClasses, out: &mut Vec<u32>) {
        if !markup || self.added.is_empty() {
            let norm = self.normalize(text);
            self.encode_normalized(&norm, true, cc, &mut Work::default(), out);
            return;
        }
        self.encode_markup(text, None, false, cc, out);
    }

    /// Markup encoding (see [`HfTokenizer::encode`]) where an added token is cut out only
    /// where its first and last characters lie in `ranges` (sorted byte ranges of `text`;
    /// `None`: anywhere; see `SpecialMatcher::find_entry_in`). Tokens matched after
    /// normalization use the normalized images of the ranges (see
    /// [`HfTokenizer::normalized_ranges`]). With `continued`, `text` follows text encoded
    /// earlier: its first stretch is not the sequence's first (no first-only Metaspace prefix).
    pub fn encode_markup(&self, text: &str, ranges: Option<&[(usize, usize)]>, continued: bool, cc: &CharClasses, out: &mut Vec<u32>) {
        let mut w = Work::default();
        self.split_added(&self.raw_markup, &self.raw_flags, text, ranges, &mut |cut| match cut {
            Cut::Token(id) => out.push(id),
            Cut::Text(seg, at) => {
                let norm = self.normalize(seg);
                let norm_ranges = ranges.map(|r| self.normalized_ranges(seg, &norm, &super::specials::clip_ranges(r, at, seg.len())));
                self.split_added(&self.norm_markup, &self.norm_flags, &norm, norm_ranges.as_deref(), &mut |cut| match cut {
                    Cut::Token(id) => out.push(id),
                    Cut::Text(piece, at_n) => self.encode_normalized(piece, !continued && at == 0 && at_n == 0, cc, &mut w, out),
                });
            }
        });
    }

    /// Maps byte ranges of `seg` to ranges of `norm`, its normalization. Each run between range
    /// ends is normalized on its own (a run after the first as it would be mid-text: behind a
    /// NUL, which no normalizer here changes or composes with); when the runs' images
    /// concatenate to `norm`, the mapping is exact. Otherwise a composition crossed a range end
    /// (content that starts with a combining mark), and the cumulative lengths are used, cut to
    /// `norm`'s length.
    fn normalized_ranges(&self, seg: &str, norm: &str, local: &[(usize, usize)]) -> Vec<(usize, usize)> {
        if self.normalizer.is_none() || local.is_empty() {
            return local.to_vec();
        }
        if local == [(0, seg.len())] {
            return vec![(0, norm.len())];
        }
        let mut cuts: Vec<usize> = local.iter().flat_map(|&(a, b)| [a, b]).filter(|&x| x > 0 && x < seg.len()).collect();
        cuts.dedup();
        let nul = self.normalize("\0").into_owned();
        let (mut mapped, mut joined, mut start) = (vec![(0usize, 0usize)], String::new(), 0usize);
        for &cut in cuts.iter().chain(std::iter::once(&seg.len())) {
            let run = &seg[start..cut];
            if start == 0 {
                joined.push_str(&self.normalize(run));
            } else {
                let behind = self.normalize(&format!("\0{run}")).into_owned();
                joined.push_str(behind.strip_prefix(nul.as_str()).unwrap_or(&behind));
            }
            mapped.push((cut, joined.len().min(norm.len())));
            start = cut;
        }
        let floor = |mut n: usize| {
            while !norm.is_char_boundary(n) {
                n -= 1;
            }
            n
        };
        let at = |x: usize| floor(mapped.iter().find(|&&(raw, _)| raw == x).map_or(if x == 0 { 0 } else { norm.len() }, |&(_, n)| n));
        local.iter().map(|&(a, b)| (at(a), at(b))).filter(|(a, b)| a < b).collect()
    }

    /// Cuts the added tokens of `m` out of `text`, calling `f` for each stretch of text
    /// between them (with its offset) and for each token; with `ranges`, only tokens that
    /// begin and end in a range count. `lstrip`/`rstrip` take the adjacent whitespace
    /// (`char::is_whitespace`: the Unicode White_Space property that the library's `\s`
    /// means) into the token, but lstrip never reaches back into an earlier token.
    fn split_added(&self, m: &SpecialMatcher, flags: &[(bool, bool)], text: &str, ranges: Option<&[(usize, usize)]>, f: &mut dyn FnMut(Cut)) {
        let (mut at, mut search) = (0usize, 0usize);
        while let Some((s0, e0, k)) = m.find_entry_in(text, search, ranges) {
            let (lstrip, rstrip) = flags.get(k).copied().unwrap_or((false, false));
            let mut s = s0;
            if lstrip {
                s = text[..s0].trim_end_matches(char::is_whitespace).len().max(at);
            }
            let e = if rstrip { text.len() - text[e0..].trim_start_matches(char::is_whitespace).len() } else { e0 };
            if s > at {
                f(Cut::Text(&text[at..s], at));
            }
            f(Cut::Token(m.entries()[k].1));
            // The library's matcher resumes after the token itself, not after what rstrip took.
            search = e0;
            at = at.max(e);
        }
        if at < text.len() {
            f(Cut::Text(&text[at..], at));
        }
    }

    fn normalize<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match &self.normalizer {
            Some(n) => n.apply(Cow::Borrowed(text)),
            None => Cow::Borrowed(text),
        }
    }

    /// Pre-tokenizes and encodes one normalized stretch of text between added tokens.
    fn encode_normalized(&self, text: &str, first: bool, cc: &CharClasses, w: &mut Work, out: &mut Vec<u32>) {
        let (s, pieces) = self.pre_tokenize(text, first, cc);
        for &(a, b) in &pieces {
            self.encode_piece(&s[a..b], w, out);
        }
    }

    fn pre_tokenize(&self, text: &str, first: bool, cc: &CharClasses) -> (String, Vec<(usize, usize)>) {
        let mut s = text.to_string();
        let mut pieces = if s.is_empty() { Vec::new() } else { vec![(0, s.len())] };
        for step in &self.steps {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            match step {
                PreStep::Split { pattern, removed } => {
                    for &(a, b) in &pieces {
                        let base = next.len();
                        pattern.split_isolated(&s[a..b], cc, &mut next);
                        shift(&mut next[base..], a);
                        if *removed {
                            keep_gaps(&s[a..b], *pattern, cc, a, &mut next, base);
                        }
                    }
                }
                PreStep::SplitLiteral { literal, removed } => {
                    for &(a, b) in &pieces {
                        let mut last = a;
                        for (m, _) in s[a..b].match_indices(literal.as_str()) {
                            let (ms, me) = (a + m, a + m + literal.len());
                            if ms > last {
                                next.push((last, ms));
                            }
                            if !removed {
                                next.push((ms, me));
                            }
                            last = me;
                        }
                        if last < b {
                            next.push((last, b));
                        }
                    }
                }
                PreStep::Digits { individual } => {
                    for &(a, b) in &pieces {
                        split_digits(&s, a, b, *individual, cc, &mut next);
                    }
                }
                PreStep::ByteLevel { add_prefix_space, use_regex } => {
                    if *add_prefix_space {
                        (s, pieces) = rebuild(&s, &pieces, |p, _| if p.starts_with(' ') { p.to_string() } else { format!(" {p}") });
                    }
                    if !use_regex {
                        continue;
                    }
                    for &(a, b) in &pieces {
                        let base = next.len();
                        SplitPattern::Gpt2.split_isolated(&s[a..b], cc, &mut next);
                        shift(&mut next[base..], a);
                    }
                }
                PreStep::Metaspace { replacement, prepend, split } => {
                    (s, pieces) = rebuild(&s, &pieces, |p, i| {
                        let r = p.replace(' ', replacement);
                        let add = match prepend {
                            Prepend::Always => true,
                            Prepend::First => first && i == 0,
                            Prepend::Never => false,
                        };
                        if add && !r.starts_with(replacement.as_str()) { format!("{replacement}{r}") } else { r }
                    });
                    if !split {
                        continue;
                    }
                    // Each piece starts at a replacement character (behavior MergedWithNext).
                    for &(a, b) in &pieces {
                        let mut start = a;
                        for (m, _) in s[a..b].match_indices(replacement.as_str()) {
                            if a + m > start {
                                next.push((start, a + m));
                                start = a + m;
                            }
                        }
                        if start < b {
                            next.push((start, b));
                        }
                    }
                }
            }
            pieces = next;
        }
        (s, pieces)
    }

    /// BPE of one pre-token.
    fn encode_piece(&self, piece: &str, w: &mut Work, out: &mut Vec<u32>) {
        let b = piece.as_bytes();
        if b.is_empty() {
            return;
        }
        if self.ignore_merges {
            if let Some(id) = self.model_table.find(b) {
                out.push(id);
                return;
            }
        }
        w.init.clear();
        if self.byte_level {
            for (i, &x) in b.iter().enumerate() {
                match self.byte_ids[x as usize].or(self.unk) {
                    Some(id) => w.init.push(Sym { start: i, end: i + 1, id, mergeable: true }),
                    None => continue,
                }
            }
        } else {
            for (i, c) in piece.char_indices() {
                let end = i + c.len_utf8();
                if let Some(id) = self.model_table.find(&b[i..end]) {
                    w.init.push(Sym { start: i, end, id, mergeable: true });
                } else if self.byte_fallback && b[i..end].iter().all(|&x| self.byte_ids[x as usize].is_some()) {
                    for (k, &byte) in b.iter().enumerate().take(end).skip(i) {
                        let id = self.byte_ids[byte as usize].unwrap_or(0);
                        w.init.push(Sym { start: k, end: k + 1, id, mergeable: false });
                    }
                } else if let Some(unk) = self.unk {
                    let fuse = self.fuse_unk && w.init.last().is_some_and(|s| s.id == unk && !s.mergeable);
                    match w.init.last_mut() {
                        Some(last) if fuse => last.end = end,
                        _ => w.init.push(Sym { start: i, end, id: unk, mergeable: false }),
                    }
                }
            }
        }
        bpe::merge(b, &w.init, self, &mut w.scratch, out);
    }
}

impl PairRule for HfTokenizer {
    #[inline]
    fn pair(&self, _piece: &[u8], left: &Sym, right: &Sym) -> Option<(u32, u32)> {
        self.pairs.get(&(((left.id as u64) << 32) | right.id as u64)).copied()
    }
}

/// What [`HfTokenizer::split_added`] finds: a stretch of text (and its byte offset in the
/// text), or an added token's id.
enum Cut<'t> {
    Text(&'t str, usize),
    Token(u32),
}

#[derive(Default)]
struct Work {
    init: Vec<Sym>,
    scratch: Scratch,
}

fn shift(ranges: &mut [(usize, usize)], by: usize) {
    for r in ranges {
        r.0 += by;
        r.1 += by;
    }
}

/// For `Removed`: replaces the isolated pieces pushed since `base` with only the gaps.
fn keep_gaps(piece: &str, pattern: SplitPattern, cc: &CharClasses, offset: usize, out: &mut Vec<(usize, usize)>, base: usize) {
    let mut matches = Vec::new();
    pattern.for_each_match(piece, cc, |a, b| matches.push((a + offset, b + offset)));
    out.truncate(base);
    let mut last = offset;
    for (a, b) in matches {
        if a > last {
            out.push((last, a));
        }
        last = b;
    }
    if last < offset + piece.len() {
        out.push((last, offset + piece.len()));
    }
}

/// `Digits`: digits (`\p{N}`) isolated one by one, or as runs.
fn split_digits(s: &str, a: usize, b: usize, individual: bool, cc: &CharClasses, out: &mut Vec<(usize, usize)>) {
    let mut start = a;
    let mut prev_digit = false;
    for (i, c) in s[a..b].char_indices() {
        let at = a + i;
        let digit = cc.of(c).number();
        let boundary = at > start && (digit || prev_digit) && (individual || digit != prev_digit);
        if boundary {
            out.push((start, at));
            start = at;
        }
        prev_digit = digit;
    }
    if start < b {
        out.push((start, b));
    }
}

/// Rewrites each piece with `f(piece, index)` and returns the new text and ranges.
fn rebuild(s: &str, pieces: &[(usize, usize)], f: impl Fn(&str, usize) -> String) -> (String, Vec<(usize, usize)>) {
    let mut out = String::with_capacity(s.len() + pieces.len());
    let mut ranges = Vec::with_capacity(pieces.len());
    for (i, &(a, b)) in pieces.iter().enumerate() {
        let start = out.len();
        out.push_str(&f(&s[a..b], i));
        ranges.push((start, out.len()));
    }
    (out, ranges)
}

/// The model's vocabulary: key → id, model-space bytes → id, and decode bytes per id.
struct Vocab<'j> {
    by_key: HashMap<&'j str, u32>,
    model_table: TokenTable,
    decode_table: TokenTable,
    /// First-position decode bytes of the ids where they differ (see [`DecodeRule::first_bytes`]).
    first_table: TokenTable,
    /// Ids the decoder treats as `ByteFallback` bytes.
    fallback: Vec<bool>,
}

fn parse_vocab<'j>(d: &Doc, model: &'j Json, byte_level: bool, dec: &DecodeRule, inverse: &HashMap<char, u8>) -> Result<Vocab<'j>> {
    let path = d.path;
    let vocab = model.get("vocab").and_then(Json::as_object).ok_or_else(|| err(path, "model.vocab", "missing or not an object"))?;
    let mut by_key: HashMap<&str, u32> = HashMap::with_capacity(vocab.len());
    let mut model_table = TokenTable::new(0);
    let mut decode_table = TokenTable::new(0);
    let mut first_table = TokenTable::new(0);
    let mut fallback = Vec::new();
    let mut in_model = Vec::new();
    for (k, v) in vocab {
        let id = d.id(v, &format!("model.vocab.{k}"))?;
        if by_key.insert(k.as_str(), id).is_some() {
            return Err(err(path, &format!("model.vocab.{k}"), "duplicate token"));
        }
        let model_bytes = if byte_level { byte_level_decode(k, inverse) } else { Some(k.as_bytes().to_vec()) };
        if let Some(b) = &model_bytes {
            model_table.set(id, b);
            if in_model.len() <= id as usize {
                in_model.resize(id as usize + 1, false);
            }
            in_model[id as usize] = true;
        }
        decode_table.set(id, &dec.bytes(k, inverse));
        if let Some(b) = dec.first_bytes(k, inverse) {
            first_table.set(id, &b);
        }
        if dec.is_fallback_byte(k) {
            mark(&mut fallback, id);
        }
    }
    let mut dup = None;
    model_table.index(|id| in_model.get(id as usize).copied().unwrap_or(false), |a, b| dup = Some((a, b)));
    if let Some((a, b)) = dup {
        return Err(err(path, "model.vocab", format!("ids {b} and {a} stand for the same bytes")));
    }
    Ok(Vocab { by_key, model_table, decode_table, first_table, fallback })
}

fn mark(flags: &mut Vec<bool>, id: u32) {
    if flags.len() <= id as usize {
        flags.resize(id as usize + 1, false);
    }
    flags[id as usize] = true;
}

/// `model.merges`: rank = position in the list; each pair and its concatenation must be in
/// the vocabulary.
fn parse_merges(d: &Doc, model: &Json, by_key: &HashMap<&str, u32>) -> Result<HashMap<u64, (u32, u32), IdBuildHasher>> {
    let path = d.path;
    let merges = model.get("merges").and_then(Json::as_array).ok_or_else(|| err(path, "model.merges", "missing or not an array"))?;
    let mut pairs: HashMap<u64, (u32, u32), IdBuildHasher> = HashMap::with_capacity_and_hasher(merges.len(), Default::default());
    for (rank, m) in merges.iter().enumerate() {
        let key = format!("model.merges[{rank}]");
        let (a, b) = match m {
            Json::String(s) => s.split_once(' ').ok_or_else(|| err(path, &key, "expected two tokens separated by a space"))?,
            Json::Array(v) if v.len() == 2 => match (v[0].as_str(), v[1].as_str()) {
                (Some(a), Some(b)) => (a, b),
                _ => return Err(err(path, &key, "expected two strings")),
            },
            _ => return Err(err(path, &key, "expected a string or a pair of strings")),
        };
        let id = |t: &str| by_key.get(t).copied().ok_or_else(|| err(path, &key, format!("token {t:?} is not in the vocabulary")));
        let (ia, ib) = (id(a)?, id(b)?);
        let merged = id(&format!("{a}{b}"))?;
        pairs.insert(((ia as u64) << 32) | ib as u64, (rank as u32, merged));
    }
    Ok(pairs)
}

/// A matcher over `tokens` with contents mapped by `content`, and the strip flags of each
/// matcher entry (a content given twice keeps its first token, as the matcher does).
fn added_matcher<'a>(tokens: impl Iterator<Item = &'a Added>, content: impl Fn(&str) -> String) -> (SpecialMatcher, Vec<(bool, bool)>) {
    let list: Vec<(String, u32, (bool, bool))> = tokens.map(|a| (content(&a.content), a.id, (a.lstrip, a.rstrip))).collect();
    let m = SpecialMatcher::new(list.iter().map(|(c, id, _)| (c.clone(), *id)));
    // The matcher keeps entries in the order given, skipping empty and repeated contents.
    let mut flags = Vec::with_capacity(m.entries().len());
    for (c, id, f) in &list {
        if m.entries().get(flags.len()).is_some_and(|(c2, id2)| c2 == c && id2 == id) {
            flags.push(*f);
        }
    }
    (m, flags)
}

fn parse_added(d: &Doc, root: &Json) -> Result<Vec<Added>> {
    let path = d.path;
    let mut added = Vec::new();
    if let Some(list) = root.get("added_tokens") {
        let list = list.as_array().ok_or_else(|| err(path, "added_tokens", "not an array"))?;
        for (i, a) in list.iter().enumerate() {
            let key = format!("added_tokens[{i}]");
            let content = d.str(a, &key, "content")?.to_string();
            let id = d.id(a.get("id").unwrap_or(&Json::Null), &format!("{key}.id"))?;
            if d.bool_or(a, &key, "single_word", false)? {
                return Err(unsupported(path, &format!("{key}.single_word"), "single-word added tokens are not supported"));
            }
            let special = d.bool_or(a, &key, "special", false)?;
            added.push(Added {
                // The library's own default for a token added without the flag.
                normalized: d.bool_or(a, &key, "normalized", !special)?,
                special,
                lstrip: d.bool_or(a, &key, "lstrip", false)?,
                rstrip: d.bool_or(a, &key, "rstrip", false)?,
                content,
                id,
            });
        }
    }
    Ok(added)
}

fn parse_normalizer(d: &Doc, v: &Json, key: &str) -> Result<Normalizer> {
    let t = d.str(v, key, "type")?;
    Ok(match t {
        "NFC" => Normalizer::Nfc,
        "Sequence" => {
            let list = v.get("normalizers").and_then(Json::as_array).ok_or_else(|| err(d.path, &format!("{key}.normalizers"), "missing or not an array"))?;
            let mut out = Vec::new();
            for (i, n) in list.iter().enumerate() {
                out.push(parse_normalizer(d, n, &format!("{key}.normalizers[{i}]"))?);
            }
            Normalizer::Sequence(out)
        }
        "Prepend" => Normalizer::Prepend(d.str(v, key, "prepend")?.to_string()),
        "Replace" => {
            let pat = v.get("pattern").ok_or_else(|| err(d.path, &format!("{key}.pattern"), "missing"))?;
            let from = pat.get("String").and_then(Json::as_str)
                .ok_or_else(|| unsupported(d.path, &format!("{key}.pattern"), "only literal String patterns are supported"))?;
            Normalizer::Replace { from: from.to_string(), to: d.str(v, key, "content")?.to_string() }
        }
        other => return Err(unsupported(d.path, &format!("{key}.type"), format!("normalizer `{other}` is not supported"))),
    })
}

fn parse_pre(d: &Doc, v: &Json, key: &str, out: &mut Vec<PreStep>) -> Result<()> {
    let t = d.str(v, key, "type")?;
    match t {
        "Sequence" => {
            let list = v.get("pretokenizers").and_then(Json::as_array).ok_or_else(|| err(d.path, &format!("{key}.pretokenizers"), "missing or not an array"))?;
            for (i, p) in list.iter().enumerate() {
                parse_pre(d, p, &format!("{key}.pretokenizers[{i}]"), out)?;
            }
        }
        "Split" => {
            if d.bool_or(v, key, "invert", false)? {
                return Err(unsupported(d.path, &format!("{key}.invert"), "inverted splits are not supported"));
            }
            let behavior = d.str(v, key, "behavior")?;
            let removed = match behavior {
                "Isolated" => false,
                "Removed" => true,
                other => return Err(unsupported(d.path, &format!("{key}.behavior"), format!("`{other}` is not supported (Isolated, Removed)"))),
            };
            let pat = v.get("pattern").ok_or_else(|| err(d.path, &format!("{key}.pattern"), "missing"))?;
            if let Some(r) = pat.get("Regex").and_then(Json::as_str) {
                let pattern = SplitPattern::from_regex(r).ok_or_else(|| unsupported(d.path, &format!("{key}.pattern.Regex"),
                    format!("split pattern {r:?} is not one this engine implements (no general regex engine)")))?;
                out.push(PreStep::Split { pattern, removed });
            } else if let Some(s) = pat.get("String").and_then(Json::as_str) {
                if s.is_empty() {
                    return Err(err(d.path, &format!("{key}.pattern.String"), "empty"));
                }
                out.push(PreStep::SplitLiteral { literal: s.to_string(), removed });
            } else {
                return Err(err(d.path, &format!("{key}.pattern"), "expected Regex or String"));
            }
        }
        "ByteLevel" => out.push(PreStep::ByteLevel {
            add_prefix_space: d.bool_or(v, key, "add_prefix_space", false)?,
            use_regex: d.bool_or(v, key, "use_regex", true)?,
        }),
        "Digits" => out.push(PreStep::Digits { individual: d.bool_or(v, key, "individual_digits", false)? }),
        "Metaspace" => {
            let replacement = d.str(v, key, "replacement")?.to_string();
            let prepend = match v.get("prepend_scheme").and_then(Json::as_str) {
                Some("always") => Prepend::Always,
                Some("first") => Prepend::First,
                Some("never") => Prepend::Never,
                None if d.bool_or(v, key, "add_prefix_space", true)? => Prepend::Always,
                None => Prepend::Never,
                Some(o) => return Err(err(d.path, &format!("{key}.prepend_scheme"), format!("unknown scheme `{o}`"))),
            };
            out.push(PreStep::Metaspace { replacement, prepend, split: d.bool_or(v, key, "split", true)? });
        }
        other => return Err(unsupported(d.path, &format!("{key}.type"), format!("pre-tokenizer `{other}` is not supported"))),
    }
    Ok(())
}

/// What a decoder does to the spaces at the start of the decoded text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Leading {
    /// Nothing.
    #[default]
    Keep,
    /// `Strip` of one leading space from the fused text.
    StripOne,
}

/// How the decoder turns one vocabulary string into bytes.
#[derive(Default)]
struct DecodeRule {
    byte_level: bool,
    /// `(from, to)` string replacements, in order (`Replace`, `Metaspace`).
    replace: Vec<(String, String)>,
    byte_fallback: bool,
    leading: Leading,
    /// `Metaspace` with a prepend scheme: in the first token the replacement is dropped, not
    /// turned into a space. It acts on the token's string, before `ByteFallback` makes bytes,
    /// so a `<0x20>` byte token keeps its space.
    first_drop: Option<String>,
}

/// The byte of a `<0xXX>` byte-fallback token string.
fn fallback_byte(token: &str) -> Option<u8> {
    let t = token.as_bytes();
    if t.len() == 6 && t.starts_with(b"<0x") && t[5] == b'>' {
        return u8::from_str_radix(&token[3..5], 16).ok();
    }
    None
}

impl DecodeRule {
    /// True when the decoder turns `token` into a byte of a `ByteFallback` run.
    fn is_fallback_byte(&self, token: &str) -> bool {
        self.byte_fallback && fallback_byte(token).is_some()
    }

    /// The bytes of `token` as the first text token of a sequence, when they differ from
    /// [`DecodeRule::bytes`].
    fn first_bytes(&self, token: &str, inverse: &HashMap<char, u8>) -> Option<Vec<u8>> {
        let drop = self.first_drop.as_deref()?;
        if self.is_fallback_byte(token) || !token.contains(drop) {
            return None;
        }
        Some(self.bytes(&token.replace(drop, ""), inverse))
    }

    fn bytes(&self, token: &str, inverse: &HashMap<char, u8>) -> Vec<u8> {
        if self.byte_fallback {
            if let Some(b) = fallback_byte(token) {
                return vec![b];
            }
        }
        if self.byte_level {
            // Characters outside the byte alphabet (added tokens like `<｜User｜>`) stay text.
            return byte_level_decode(token, inverse).unwrap_or_else(|| token.as_bytes().to_vec());
        }
        let mut s = token.to_string();
        for (from, to) in &self.replace {
            s = s.replace(from.as_str(), to);
        }
        s.into_bytes()
    }
}

fn parse_decoder(d: &Doc, v: &Json, key: &str) -> Result<DecodeRule> {
    let mut rule = DecodeRule::default();
    let mut list = vec![(v, key.to_string())];
    let mut i = 0;
    while i < list.len() {
        let (v, key) = (list[i].0, list[i].1.clone());
        i += 1;
        if v.is_null() {
            continue;
        }
        match d.str(v, &key, "type")? {
            "Sequence" => {
                let items = v.get("decoders").and_then(Json::as_array).ok_or_else(|| err(d.path, &format!("{key}.decoders"), "missing or not an array"))?;
                for (k, item) in items.iter().enumerate() {
                    list.push((item, format!("{key}.decoders[{k}]")));
                }
            }
            "ByteLevel" => rule.byte_level = true,
            "ByteFallback" => rule.byte_fallback = true,
            "Fuse" => {}
            "Replace" => {
                let from = v.get("pattern").and_then(|p| p.get("String")).and_then(Json::as_str)
                    .ok_or_else(|| unsupported(d.path, &format!("{key}.pattern"), "only literal String patterns are supported"))?;
                rule.replace.push((from.to_string(), d.str(v, &key, "content")?.to_string()));
            }
            "Strip" => {
                let content = d.str(v, &key, "content")?;
                let start = v.get("start").and_then(Json::as_u64).unwrap_or(0);
                let stop = v.get("stop").and_then(Json::as_u64).unwrap_or(0);
                if content != " " || start > 1 || stop != 0 {
                    return Err(unsupported(d.path, &key, "only Strip of one leading space is supported"));
                }
                if start == 1 {
                    rule.leading = Leading::StripOne;
                }
            }
            "Metaspace" => {
                let r = d.str(v, &key, "replacement")?;
                rule.replace.push((r.to_string(), " ".to_string()));
                let prepend = v.get("prepend_scheme").and_then(Json::as_str).map(|s| s != "never")
                    .unwrap_or(d.bool_or(v, &key, "add_prefix_space", true)?);
                if prepend {
                    rule.first_drop = Some(r.to_string());
                }
            }
            other => return Err(unsupported(d.path, &format!("{key}.type"), format!("decoder `{other}` is not supported"))),
        }
    }
    Ok(rule)
}

/// The BOS of a `TemplateProcessing` post-processor: the single special token before `$A`.
fn template_bos(d: &Doc, v: &Json, t: &HfTokenizer) -> Result<Option<u32>> {
    match v.get("type").and_then(Json::as_str) {
        Some("Sequence") => {
            for p in v.get("processors").and_then(Json::as_array).unwrap_or(&[]) {
                if let Some(b) = template_bos(d, p, t)? {
                    return Ok(Some(b));
                }
            }
            Ok(None)
        }
        Some("TemplateProcessing") => {
            let single = v.get("single").and_then(Json::as_array).ok_or_else(|| err(d.path, "post_processor.single", "missing or not an array"))?;
            let Some(first) = single.first().and_then(|f| f.get("SpecialToken")) else { return Ok(None) };
            let name = d.str(first, "post_processor.single[0].SpecialToken", "id")?;
            let ids = v.get("special_tokens").and_then(|s| s.get(name)).and_then(|s| s.get("ids")).and_then(Json::as_array);
            match ids {
                Some([one]) => Ok(Some(d.id(one, &format!("post_processor.special_tokens.{name}.ids[0]"))?)),
                _ => Ok(t.markup.id_of(name)),
            }
        }
        _ => Ok(None),
    }
}

