//! Text normalization before pre-tokenization: Unicode NFC (UAX #15) and the string edits
//! that Hugging Face `tokenizer.json` normalizers describe (`Prepend`, `Replace`, `Sequence`).
//!
//! NFC follows UAX #15 section 3 with the generated UCD tables: full canonical decomposition
//! (Hangul algorithmically), canonical ordering of combining marks, then canonical
//! composition of unblocked pairs.

use super::unicode::{canonical_decomposition, combining_class, primary_composite, NfcData, NFC_QUICK_BELOW};
use std::borrow::Cow;

/// One normalizer of a `tokenizer.json` pipeline.
#[derive(Clone, Debug, PartialEq)]
pub enum Normalizer {
    /// Unicode Normalization Form C, with Hugging Face tokenizers' Unicode 9.0 data.
    Nfc,
    /// Prepends a string to non-empty text.
    Prepend(String),
    /// Replaces every occurrence of a literal string.
    Replace { from: String, to: String },
    /// Applies each in order.
    Sequence(Vec<Normalizer>),
}

impl Normalizer {
    /// Heap bytes held by its strings and sub-normalizers.
    pub fn heap_bytes(&self) -> u64 {
        match self {
            Normalizer::Nfc => 0,
            Normalizer::Prepend(s) => s.capacity() as u64,
            Normalizer::Replace { from, to } => (from.capacity() + to.capacity()) as u64,
            Normalizer::Sequence(v) => crate::sys::vec_bytes(v) + v.iter().map(Normalizer::heap_bytes).sum::<u64>(),
        }
    }

    /// Normalizes `s`; borrows when nothing changes.
    pub fn apply<'a>(&self, s: Cow<'a, str>) -> Cow<'a, str> {
        match self {
            Normalizer::Nfc => match nfc_with(&s, NfcData::Unicode9) {
                Cow::Borrowed(_) => s,
                Cow::Owned(o) => Cow::Owned(o),
            },
            Normalizer::Prepend(p) if !s.is_empty() => Cow::Owned(format!("{p}{s}")),
            Normalizer::Prepend(_) => s,
            Normalizer::Replace { from, to } if !from.is_empty() && s.contains(from.as_str()) => {
                Cow::Owned(s.replace(from.as_str(), to))
            }
            Normalizer::Replace { .. } => s,
            Normalizer::Sequence(list) => list.iter().fold(s, |acc, n| n.apply(acc)),
        }
    }
}

const S_BASE: u32 = 0xAC00;
const L_BASE: u32 = 0x1100;
const V_BASE: u32 = 0x1161;
const T_BASE: u32 = 0x11A7;
const L_COUNT: u32 = 19;
const V_COUNT: u32 = 21;
const T_COUNT: u32 = 28;
const N_COUNT: u32 = V_COUNT * T_COUNT;
const S_COUNT: u32 = L_COUNT * N_COUNT;

/// `s` in Normalization Form C (Unicode 16.0).
pub fn nfc(s: &str) -> Cow<'_, str> {
    nfc_with(s, NfcData::Current)
}

/// `s` in Normalization Form C as Hugging Face tokenizers computes it (Unicode 9.0 data).
pub fn nfc_unicode9(s: &str) -> Cow<'_, str> {
    nfc_with(s, NfcData::Unicode9)
}

fn nfc_with(s: &str, data: NfcData) -> Cow<'_, str> {
    if s.chars().all(|c| (c as u32) < NFC_QUICK_BELOW) {
        return Cow::Borrowed(s);
    }
    let mut cps: Vec<u32> = Vec::with_capacity(s.len());
    for c in s.chars() {
        decompose(c as u32, data, &mut cps);
    }
    canonical_order(&mut cps, data);
    compose(&mut cps, data);
    let out: String = cps.iter().filter_map(|&c| char::from_u32(c)).collect();
    if out == s {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(out)
    }
}

/// Appends the full canonical decomposition of `c`.
fn decompose(c: u32, data: NfcData, out: &mut Vec<u32>) {
    if (S_BASE..S_BASE + S_COUNT).contains(&c) {
        let i = c - S_BASE;
        out.push(L_BASE + i / N_COUNT);
        out.push(V_BASE + (i % N_COUNT) / T_COUNT);
        if !i.is_multiple_of(T_COUNT) {
            out.push(T_BASE + i % T_COUNT);
        }
        return;
    }
    match canonical_decomposition(c, data) {
        // Decompositions nest at most a few levels deep; recursion is bounded by the table.
        Some((a, b)) => {
            decompose(a, data, out);
            if b != 0 {
                decompose(b, data, out);
            }
        }
        None => out.push(c),
    }
}

/// Stable-sorts every run of non-starters by combining class (UAX #15, canonical ordering).
fn canonical_order(cps: &mut [u32], data: NfcData) {
    let mut i = 0;
    while i < cps.len() {
        if combining_class(cps[i], data) == 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i < cps.len() && combining_class(cps[i], data) != 0 {
            i += 1;
        }
        if i - start > 1 {
            cps[start..i].sort_by_key(|&c| combining_class(c, data)); // stable
        }
    }
}

fn compose_pair(a: u32, b: u32, data: NfcData) -> Option<u32> {
    if (L_BASE..L_BASE + L_COUNT).contains(&a) && (V_BASE..V_BASE + V_COUNT).contains(&b) {
        return Some(S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT);
    }
    if (S_BASE..S_BASE + S_COUNT).contains(&a) && (a - S_BASE).is_multiple_of(T_COUNT) && (T_BASE + 1..T_BASE + T_COUNT).contains(&b) {
        return Some(a + (b - T_BASE));
    }
    primary_composite(a, b, data)
}

/// Canonical composition in place: each character joins the last starter unless a character
/// between them blocks it (a starter, or one of equal or higher combining class).
fn compose(cps: &mut Vec<u32>, data: NfcData) {
    let mut out: Vec<u32> = Vec::with_capacity(cps.len());
    let mut starter: Option<usize> = None;
    // Combining class of the last character kept since the starter; None when adjacent.
    let mut last_cc: Option<u8> = None;
    for &c in cps.iter() {
        let cc = combining_class(c, data);
        if let Some(sp) = starter {
            let unblocked = match last_cc {
                None => true,
                Some(l) => l != 0 && l < cc,
            };
            if unblocked {
                if let Some(comp) = compose_pair(out[sp], c, data) {
                    out[sp] = comp;
                    continue;
                }
            }
        }
        if cc == 0 {
            starter = Some(out.len());
            last_cc = None;
        } else {
            last_cc = Some(cc);
        }
        out.push(c);
    }
    *cps = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nfc_composes_reorders_and_keeps() {
        assert_eq!(nfc("e\u{301}"), "é");
        assert!(matches!(nfc("plain ascii"), Cow::Borrowed(_)));
        // Dot below (220) sorts before acute (230), then both compose onto the base.
        assert_eq!(nfc("a\u{301}\u{323}"), "\u{1EA1}\u{301}");
        assert_eq!(nfc("\u{212B}"), "\u{C5}"); // singleton
        assert_eq!(nfc("\u{1100}\u{1161}\u{11A8}"), "\u{AC01}"); // Hangul LVT
        assert_eq!(nfc("\u{0F71}\u{0F72}"), "\u{0F71}\u{0F72}"); // exclusion stays split
        assert_eq!(nfc("\u{0344}"), "\u{0308}\u{0301}"); // non-starter decomposition
        // A Unicode 11.0 mark (230) sorts before ypogegrammeni (240) today, not in 9.0 data.
        assert_eq!(nfc("x\u{345}\u{10D24}"), "x\u{10D24}\u{345}");
        assert_eq!(nfc_unicode9("x\u{345}\u{10D24}"), "x\u{345}\u{10D24}");
    }

    #[test]
    fn pipeline_edits() {
        let n = Normalizer::Sequence(vec![
            Normalizer::Prepend("\u{2581}".into()),
            Normalizer::Replace { from: " ".into(), to: "\u{2581}".into() },
        ]);
        assert_eq!(n.apply(Cow::Borrowed("a b")), "\u{2581}a\u{2581}b");
        assert_eq!(n.apply(Cow::Borrowed("")), "");
    }
}
