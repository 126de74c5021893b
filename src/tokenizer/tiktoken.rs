//! tiktoken vocabularies: rank files (`base64(token) rank` per line) for r50k/GPT-2, p50k,
//! cl100k, o200k and Whisper, and the Kimi/Moonlight `tiktoken.model` with the specials of its
//! `tokenizer_config.json`.
//!
//! A token's rank is its id. Ranks need not be contiguous (p50k leaves 50256 to
//! `<|endoftext|>`), and ids between the last rank and the specials may be unused. Encoding is
//! tiktoken's: split with the encoding's pattern, take a piece that is a whole token as is,
//! otherwise merge its bytes by the rank of the concatenation (see [`super::bpe`]).

use super::bpe::{self, PairRule, Scratch, Sym, TokenTable};
use super::pretokenize::SplitPattern;
use super::specials::SpecialMatcher;
use super::unicode::CharClasses;
use crate::error::{Error, ErrorKind, Result};
use crate::format::json::Json;
use std::collections::HashMap;
use std::path::Path;

/// A tiktoken encoding.
pub struct Tiktoken {
    table: TokenTable,
    byte_ids: [u32; 256],
    pub pattern: SplitPattern,
    pub specials: SpecialMatcher,
    /// True for ids that are specials or unused.
    control: Vec<bool>,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    /// Cut the text as `tokenization_kimi.py` does before encoding (see [`kimi_cuts`]).
    kimi_cuts: bool,
}

/// `tokenization_kimi.py` encodes its input in windows of this many characters…
const KIMI_WINDOW: usize = 400_000;
/// …and cuts each window inside any run of more than this many consecutive whitespace or
/// non-whitespace characters.
const KIMI_RUN: usize = 25_000;

/// Python's `str.isspace`: Unicode White_Space plus the four information separators
/// U+001C..U+001F (which Python counts as whitespace through their bidirectional class).
fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Calls `f` with the pieces `tokenization_kimi.py` hands to tiktoken one by one:
/// `text` in windows of [`KIMI_WINDOW`] characters (code points), each cut further by
/// `_split_whitespaces_or_nonwhitespaces`: when a run of whitespace (or of non-whitespace)
/// reaches [`KIMI_RUN`] + 1 characters, a new piece starts at that character. BPE and the split
/// pattern then never see across a cut, so the ids differ from encoding the whole text.
fn kimi_cuts<'a>(text: &'a str, mut f: impl FnMut(&'a str)) {
    let mut window_start = 0;
    let mut in_window = 0usize;
    let mut piece_start = 0;
    let mut run = 0usize;
    let mut space = false;
    for (i, c) in text.char_indices() {
        if in_window == KIMI_WINDOW {
            f(&text[piece_start..i]);
            (window_start, piece_start, in_window) = (i, i, 0);
        }
        let now = py_isspace(c);
        if i == window_start || now != space {
            (run, space) = (1, now);
        } else {
            run += 1;
            if run > KIMI_RUN {
                f(&text[piece_start..i]);
                (piece_start, run) = (i, 1);
            }
        }
        in_window += 1;
    }
    if piece_start < text.len() {
        f(&text[piece_start..]);
    }
}

/// What the published encodings add to their rank file: pattern and specials.
struct Known {
    stem: &'static str,
    ranks: usize,
    pattern: SplitPattern,
    specials: &'static [(&'static str, u32)],
}

const ENDOFTEXT: &str = "<|endoftext|>";
const KNOWN: &[Known] = &[
    Known { stem: "r50k_base", ranks: 50256, pattern: SplitPattern::Gpt2, specials: &[(ENDOFTEXT, 50256)] },
    Known { stem: "gpt2", ranks: 50256, pattern: SplitPattern::Gpt2, specials: &[(ENDOFTEXT, 50256)] },
    Known { stem: "p50k_base", ranks: 50280, pattern: SplitPattern::Gpt2, specials: &[(ENDOFTEXT, 50256)] },
    Known { stem: "multilingual", ranks: 50257, pattern: SplitPattern::Gpt2, specials: &[(ENDOFTEXT, 50257)] },
    Known {
        stem: "cl100k_base",
        ranks: 100256,
        pattern: SplitPattern::Cl100k { digits: 3, hf_space: false },
        specials: &[(ENDOFTEXT, 100257), ("<|fim_prefix|>", 100258), ("<|fim_middle|>", 100259),
            ("<|fim_suffix|>", 100260), ("<|endofprompt|>", 100276)],
    },
    Known {
        stem: "o200k_base",
        ranks: 199998,
        pattern: SplitPattern::O200k { kimi: false },
        specials: &[(ENDOFTEXT, 199999), ("<|endofprompt|>", 200018)],
    },
];

/// Kimi numbers its specials from the end of the ranks: this many, named by
/// `tokenizer_config.json` or `<|reserved_token_{id}|>` (tokenization_kimi.py).
const KIMI_RESERVED: usize = 256;

fn bad(path: &Path, line: usize, msg: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Tokenizer, format!("{}: line {line}: {msg}", path.display()))
}

/// Decodes standard base64 (padding optional; a lone `=` is the empty token Whisper's
/// multilingual file ends with).
#[cfg(test)]
fn base64(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    base64_into(s, &mut out).then_some(out)
}

/// Decodes standard base64 into `out` (cleared first); false when `s` is not base64.
fn base64_into(s: &[u8], out: &mut Vec<u8>) -> bool {
    out.clear();
    let s = match s.iter().position(|&c| c == b'=') {
        Some(p) if s[p..].iter().all(|&c| c == b'=') && s.len() - p <= 2 => &s[..p],
        Some(_) => return false,
        None => s,
    };
    if s.len() % 4 == 1 {
        return false;
    }
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    for chunk in s.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            let Some(v) = val(c) else { return false };
            acc = (acc << 6) | v;
        }
        acc <<= 6 * (4 - chunk.len()) as u32;
        let bytes = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    true
}

/// The ranks of a rank file, read straight into a token table: the file's tokens cost their
/// bytes and one span each, with no per-token allocation and no copy kept on the side (the
/// load's peak is the file plus the table; docs/MEMORY.md).
pub struct Ranks {
    pub table: TokenTable,
    /// Number of ranks (lines) in the file.
    pub count: usize,
}

impl std::fmt::Debug for Ranks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ranks({} ranks)", self.count)
    }
}

/// Parses a rank file, rejecting malformed lines and duplicate ranks or tokens; errors name
/// the line.
pub fn parse_ranks(path: &Path, data: &[u8]) -> Result<Ranks> {
    let lines = data.iter().filter(|&&b| b == b'\n').count() + 1;
    let mut table = TokenTable::new(0);
    table.reserve(lines, data.len() / 2);
    let mut count = 0;
    let mut bytes = Vec::new();
    for (n, line) in data.split(|&b| b == b'\n').enumerate() {
        let line_no = n + 1;
        let Some((tok, rank)) = rank_line(path, line, line_no)? else { continue };
        if !base64_into(tok, &mut bytes) {
            return Err(bad(path, line_no, format!("invalid base64 `{}`", String::from_utf8_lossy(tok))));
        }
        if rank as usize >= data.len().min(1 << 30) {
            return Err(bad(path, line_no, format!("rank {rank} is beyond the file size, implausibly large")));
        }
        if table.bytes(rank).is_some() {
            let prev = line_of_rank(data, rank);
            return Err(bad(path, line_no, format!("duplicate rank {rank} (first on line {prev})")));
        }
        table.set(rank, &bytes);
        count += 1;
    }
    if count == 0 {
        return Err(Error::new(ErrorKind::Tokenizer, format!("{}: no tokens in the rank file", path.display())));
    }
    table.shrink_to_fit();
    Ok(Ranks { table, count })
}

/// The `(base64 token, rank)` of one line; `None` for an empty line.
fn rank_line<'a>(path: &Path, line: &'a [u8], line_no: usize) -> Result<Option<(&'a [u8], u32)>> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Ok(None);
    }
    let mut parts = line.split(|&b| b == b' ').filter(|p| !p.is_empty());
    let (Some(tok), Some(rank), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad(path, line_no, "expected `base64-token rank`"));
    };
    let rank: u32 = std::str::from_utf8(rank).ok().filter(|r| r.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| bad(path, line_no, format!("rank `{}` is not a number", String::from_utf8_lossy(rank))))?;
    Ok(Some((tok, rank)))
}

/// The line of the first well-formed entry with `rank` (for error messages; 0 if none).
fn line_of_rank(data: &[u8], rank: u32) -> usize {
    data.split(|&b| b == b'\n').enumerate()
        .find(|(n, l)| matches!(rank_line(Path::new(""), l, n + 1), Ok(Some((_, r))) if r == rank))
        .map_or(0, |(n, _)| n + 1)
}

impl Tiktoken {
    /// Builds an encoding from `(bytes, rank)` pairs, a pattern and specials.
    #[cfg(test)]
    pub fn new(path: &Path, ranks: Vec<(Vec<u8>, u32)>, pattern: SplitPattern, specials: Vec<(String, u32)>) -> Result<Tiktoken> {
        let mut table = TokenTable::new(0);
        for (bytes, rank) in &ranks {
            table.set(*rank, bytes);
        }
        Tiktoken::from_ranks(path, Ranks { table, count: ranks.len() }, pattern, specials, None)
    }

    /// Builds an encoding from parsed ranks, a pattern and specials. A token that two ranks
    /// share is an error naming both lines of `data` (the rank file), when given.
    fn from_ranks(path: &Path, ranks: Ranks, pattern: SplitPattern, specials: Vec<(String, u32)>,
                  data: Option<&[u8]>) -> Result<Tiktoken> {
        let mut table = ranks.table;
        let max_rank = table.len().saturating_sub(1) as u32;
        let n = specials.iter().map(|s| s.1).chain([max_rank]).max().unwrap_or(0) as usize + 1;
        let mut control = vec![true; n];
        for (id, c) in control.iter_mut().enumerate().take(table.len()) {
            *c = table.bytes(id as u32).is_none();
        }
        for (s, id) in &specials {
            if !control[*id as usize] {
                return Err(Error::new(ErrorKind::Tokenizer, format!(
                    "{}: special token {s:?} has id {id}, which is also a rank of the vocabulary", path.display())));
            }
        }
        let mut dup = None;
        table.index(|id| !control[id as usize], |a, b| { dup.get_or_insert((a, b)); });
        if let Some((a, b)) = dup {
            let (la, lb) = data.map_or((0, 0), |d| (line_of_rank(d, a), line_of_rank(d, b)));
            return Err(bad(path, la.max(lb), format!("duplicate token (first on line {})", la.min(lb))));
        }
        let mut byte_ids = [0u32; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = table.find(&[b as u8]).ok_or_else(|| Error::new(ErrorKind::Tokenizer, format!(
                "{}: the vocabulary has no token for the byte 0x{b:02x}", path.display())))?;
        }
        let eos = specials.iter().filter(|(s, _)| s == ENDOFTEXT || s == "[EOS]").map(|s| s.1).collect();
        Ok(Tiktoken { table, byte_ids, pattern, specials: SpecialMatcher::new(specials), control, bos: None, eos, kimi_cuts: false })
    }

    /// Loads a published encoding's rank file, recognised by file name (or, failing that, by
    /// its number of ranks).
    pub fn from_rank_file(path: &Path, data: &[u8]) -> Result<Tiktoken> {
        let ranks = parse_ranks(path, data)?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let known = KNOWN.iter().find(|k| k.stem == stem).or_else(|| KNOWN.iter().find(|k| k.ranks == ranks.count))
            .ok_or_else(|| Error::new(ErrorKind::Tokenizer, format!(
                "{}: unknown tiktoken encoding ({} ranks); known: r50k_base, p50k_base, cl100k_base, o200k_base, multilingual",
                path.display(), ranks.count)))?;
        let specials = known.specials.iter().map(|&(s, id)| (s.to_string(), id)).collect();
        Tiktoken::from_ranks(path, ranks, known.pattern, specials, Some(data))
    }

    /// Loads Kimi's `tiktoken.model`, naming its specials from `config` (the parsed
    /// `tokenizer_config.json`, if present).
    pub fn from_kimi(path: &Path, data: &[u8], config: Option<(&Path, &Json)>) -> Result<Tiktoken> {
        let ranks = parse_ranks(path, data)?;
        let base = ranks.count;
        let mut names: HashMap<u32, String> = HashMap::new();
        let mut last = base + KIMI_RESERVED;
        if let Some((cpath, cfg)) = config {
            if let Some(decoder) = cfg.get("added_tokens_decoder") {
                let entries = decoder.as_object().ok_or_else(|| config_err(cpath, "added_tokens_decoder", "not an object"))?;
                for (key, v) in entries {
                    let id: u32 = key.parse().map_err(|_| config_err(cpath, &format!("added_tokens_decoder.{key}"), "not a token id"))?;
                    let content = v.get("content").and_then(Json::as_str)
                        .ok_or_else(|| config_err(cpath, &format!("added_tokens_decoder.{key}.content"), "missing or not a string"))?;
                    if (id as usize) < base || id as usize >= base + data.len().min(1 << 30) {
                        return Err(config_err(cpath, &format!("added_tokens_decoder.{key}"), format!("id {id} is not after the {base} ranks")));
                    }
                    last = last.max(id as usize + 1);
                    names.insert(id, content.to_string());
                }
            }
        }
        let specials: Vec<(String, u32)> = (base..last).map(|i| {
            let id = i as u32;
            (names.remove(&id).unwrap_or_else(|| format!("<|reserved_token_{id}|>")), id)
        }).collect();
        let mut t = Tiktoken::from_ranks(path, ranks, SplitPattern::O200k { kimi: true }, specials, Some(data))?;
        t.kimi_cuts = true;
        if let Some((cpath, cfg)) = config {
            let token = |key: &str| -> Result<Option<u32>> {
                let Some(v) = cfg.get(key) else { return Ok(None) };
                let s = v.as_str().or_else(|| v.get("content").and_then(Json::as_str));
                match s {
                    None if v.is_null() => Ok(None),
                    None => Err(config_err(cpath, key, "not a string")),
                    Some(s) => t.specials.id_of(s).map(Some).ok_or_else(|| config_err(cpath, key, format!("{s:?} is not a special token"))),
                }
            };
            let eos = token("eos_token")?;
            let bos = token("bos_token")?;
            if let Some(e) = eos {
                t.eos = vec![e];
            }
            if cfg.get("add_bos_token").and_then(Json::as_bool) == Some(true) {
                t.bos = bos;
            }
        } else if let Some(e) = t.specials.id_of("[EOS]") {
            t.eos = vec![e];
        }
        Ok(t)
    }

    pub fn vocab_size(&self) -> usize {
        self.control.len()
    }

    /// Heap bytes held: the token table, the specials, the control flags, the EOS list.
    pub fn heap_bytes(&self) -> u64 {
        use crate::sys::vec_bytes;
        self.table.heap_bytes() + self.specials.heap_bytes() + vec_bytes(&self.control) + vec_bytes(&self.eos)
    }

    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    /// The bytes of `id` (empty for specials and unused ids); `None` when out of range.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        if (id as usize) >= self.control.len() {
            return None;
        }
        Some(self.table.bytes(id).unwrap_or(&[]))
    }

    /// Encodes text, appending to `out`: with `markup` special-token strings become their
    /// ids, without they are ordinary text. Kimi's encoding first cuts the text as its
    /// reference does and encodes each piece on its own (specials included).
    pub fn encode(&self, text: &str, markup: bool, cc: &CharClasses, out: &mut Vec<u32>) {
        self.encode_within(text, markup, None, cc, out);
    }

    /// Encodes with specials resolved only where they begin and end in `ranges` (sorted byte
    /// ranges of `text`; `None`: anywhere, when `markup`).
    pub fn encode_within(&self, text: &str, markup: bool, ranges: Option<&[(usize, usize)]>, cc: &CharClasses, out: &mut Vec<u32>) {
        if self.kimi_cuts {
            let mut base = 0;
            kimi_cuts(text, |piece| {
                let local = ranges.map(|r| super::specials::clip_ranges(r, base, piece.len()));
                self.encode_whole(piece, markup, local.as_deref(), cc, out);
                base += piece.len();
            });
        } else {
            self.encode_whole(text, markup, ranges, cc, out);
        }
    }

    fn encode_whole(&self, text: &str, markup: bool, ranges: Option<&[(usize, usize)]>, cc: &CharClasses, out: &mut Vec<u32>) {
        if !markup {
            self.encode_pieces(text, cc, true, out);
            return;
        }
        let mut at = 0;
        while let Some((a, b, k)) = self.specials.find_entry_in(text, at, ranges) {
            let id = self.specials.entries()[k].1;
            if a > at {
                self.encode_pieces(&text[at..a], cc, true, out);
            }
            out.push(id);
            at = b;
        }
        if at < text.len() {
            self.encode_pieces(&text[at..], cc, true, out);
        }
    }

    /// Encodes ordinary text piece by piece. With `cache`, a piece that needed merging is
    /// merged once per call and its ids reused when it recurs (a pure function of the piece,
    /// so the ids are the same; `tests::cache_is_invisible` checks).
    fn encode_pieces(&self, text: &str, cc: &CharClasses, cache: bool, out: &mut Vec<u32>) {
        let mut scratch = Scratch::default();
        let mut init = Vec::new();
        let mut memo: HashMap<&[u8], (u32, u32), bpe::IdBuildHasher> = HashMap::default();
        let mut memo_ids: Vec<u32> = Vec::new();
        let mut found = bpe::FindMemo::new(text.len() >= 1 << 14);
        let b = text.as_bytes();
        self.pattern.for_each_match(text, cc, |s, e| {
            let piece = &b[s..e];
            if let Some(id) = found.find(&self.table, piece) {
                out.push(id);
                return;
            }
            if cache {
                if let Some(&(at, n)) = memo.get(piece) {
                    out.extend_from_slice(&memo_ids[at as usize..(at + n) as usize]);
                    return;
                }
            }
            init.clear();
            init.extend(piece.iter().enumerate().map(|(i, &x)| Sym { start: i, end: i + 1, id: self.byte_ids[x as usize], mergeable: true }));
            let before = out.len();
            bpe::merge(piece, &init, self, &mut scratch, out);
            if cache {
                memo.insert(piece, (memo_ids.len() as u32, (out.len() - before) as u32));
                memo_ids.extend_from_slice(&out[before..]);
            }
        });
    }
}

impl PairRule for Tiktoken {
    #[inline]
    fn pair(&self, piece: &[u8], left: &Sym, right: &Sym) -> Option<(u32, u32)> {
        let id = self.table.find(&piece[left.start..right.end])?;
        Some((id, id))
    }
}

fn config_err(path: &Path, key: &str, msg: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Tokenizer, format!("{}: key `{key}`: {msg}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    #[test]
    fn cache_is_invisible() {
        let ranks = (0..=255u8).map(|b| (vec![b], b as u32)).chain([(b"ab".to_vec(), 256), (b"abc".to_vec(), 257), (b" ab".to_vec(), 258)]).collect();
        let t = Tiktoken::new(Path::new("t"), ranks, SplitPattern::Gpt2, vec![]).must();
        let cc = CharClasses::new();
        let text = "abcab abab xabc abcab abab 漢字 漢字 abcabcabcabcabcabcabcabcabcabcabc abcabcabcabcabcabcabcabcabcabcabc";
        let (mut a, mut b) = (Vec::new(), Vec::new());
        t.encode_pieces(text, &cc, true, &mut a);
        t.encode_pieces(text, &cc, false, &mut b);
        assert_eq!(a, b);
        assert!(a.contains(&257) && a.contains(&258));
    }

    /// `_split_whitespaces_or_nonwhitespaces` on small runs: the cut lands on the character
    /// that makes a run one longer than the limit, and whitespace runs count alike.
    #[test]
    fn kimi_cut_positions() {
        let cut = |s: &str| {
            let mut v = Vec::new();
            kimi_cuts(s, |p| v.push(p.len()));
            v
        };
        let n = KIMI_RUN;
        assert_eq!(cut(&"a".repeat(n)), [n]);
        assert_eq!(cut(&"a".repeat(n + 1)), [n, 1]);
        assert_eq!(cut(&format!("{}{}", " ".repeat(n + 2), "b".repeat(3))), [n, 5]);
        assert_eq!(cut(&format!("x{}", "\u{1c}".repeat(n + 1))), [1 + n, 1]); // U+001C is Python whitespace
        assert_eq!(cut(""), Vec::<usize>::new());
        // Windows count characters, not bytes: 400,000 two-byte characters, then one more.
        let text = "é ".repeat(KIMI_WINDOW / 2) + "é";
        assert_eq!(cut(&text), [3 * KIMI_WINDOW / 2, 2]);
    }

    #[test]
    fn base64_decodes_and_rejects() {
        assert_eq!(base64(b"aGVsbG8=").must(), b"hello");
        assert_eq!(base64(b"IQ==").must(), b"!");
        assert_eq!(base64(b"=").must(), b"");
        assert!(base64(b"a$==").is_none());
        assert!(base64(b"abcde").is_none());
        assert!(base64(b"a=b=").is_none());
    }

    #[test]
    fn rank_file_errors_name_the_line() {
        let p = Path::new("x.tiktoken");
        let e = parse_ranks(p, b"IQ== 0\nIg== 0\n").unwrap_err();
        assert!(e.message().contains("x.tiktoken: line 2: duplicate rank 0"), "{e}");
        let e = parse_ranks(p, b"IQ== 0\nIg== zero\n").unwrap_err();
        assert!(e.message().contains("line 2") && e.message().contains("not a number"), "{e}");
        let e = parse_ranks(p, b"I@== 0\n").unwrap_err();
        assert!(e.message().contains("line 1") && e.message().contains("base64"), "{e}");
    }
}
