//! Lookups into the generated Unicode tables: the character classes the split patterns use
//! (`\p{L}` by case, `\p{M}`, `\p{N}`, `\p{P}`, `\p{S}`, `\s`, `\p{Han}`) and the data of
//! canonical normalization.
//!
//! The tables in `unicode_tables.rs` are run-length and compact; [`CharClasses`] expands the
//! class table once into a two-level array so the pre-tokenizers classify a character with two
//! loads instead of a binary search.

use super::unicode_tables as t;

pub use t::UNICODE_VERSION;

/// Code points per block of the two-level class table.
const BLOCK: usize = 128;
const MAX_CP: usize = 0x110000;

/// A character's class byte: the general-category group (low four bits) and the White_Space
/// and Han flags.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Class(pub u8);

impl Class {
    #[inline]
    fn group(self) -> u8 {
        self.0 & 0x0f
    }
    /// `\p{L}`.
    #[inline]
    pub fn letter(self) -> bool {
        matches!(self.group(), t::LU..=t::LO)
    }
    /// `\p{N}`.
    #[inline]
    pub fn number(self) -> bool {
        self.group() == t::NUMBER
    }
    /// `\p{M}`.
    #[inline]
    pub fn mark(self) -> bool {
        self.group() == t::MARK
    }
    /// `\p{P}`.
    #[inline]
    pub fn punct(self) -> bool {
        self.group() == t::PUNCT
    }
    /// `\p{S}`.
    #[inline]
    pub fn symbol(self) -> bool {
        self.group() == t::SYMBOL
    }
    /// `\s` (the White_Space property).
    #[inline]
    pub fn space(self) -> bool {
        self.0 & t::WHITE_SPACE != 0
    }
    /// `\p{Han}` (Script=Han).
    #[inline]
    pub fn han(self) -> bool {
        self.0 & t::HAN != 0
    }
    /// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`: what o200k's pattern lets open a word.
    #[inline]
    pub fn upperish(self) -> bool {
        matches!(self.group(), t::LU | t::LT | t::LM | t::LO | t::MARK)
    }
    /// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`: what o200k's pattern lets continue a word.
    #[inline]
    pub fn lowerish(self) -> bool {
        matches!(self.group(), t::LL | t::LM | t::LO | t::MARK)
    }
}

/// The class of every code point, expanded for constant-time lookup.
pub struct CharClasses {
    /// Block number of each `BLOCK`-sized range of code points.
    index: Vec<u16>,
    /// The distinct blocks, concatenated.
    blocks: Vec<u8>,
}

impl CharClasses {
    /// Expands the run-length table (about 80 KiB; a few milliseconds).
    pub fn new() -> CharClasses {
        let mut index = Vec::with_capacity(MAX_CP / BLOCK);
        let mut blocks: Vec<u8> = Vec::new();
        let mut seen: std::collections::HashMap<[u8; BLOCK], u16> = std::collections::HashMap::new();
        let mut run = 0usize;
        for b in 0..MAX_CP / BLOCK {
            let mut block = [0u8; BLOCK];
            for (k, slot) in block.iter_mut().enumerate() {
                let cp = (b * BLOCK + k) as u32;
                while run + 1 < t::CLASS_RUNS.len() && t::CLASS_RUNS[run + 1] >> 8 <= cp {
                    run += 1;
                }
                *slot = (t::CLASS_RUNS[run] & 0xff) as u8;
            }
            let next = (blocks.len() / BLOCK) as u16;
            let id = *seen.entry(block).or_insert_with(|| {
                blocks.extend_from_slice(&block);
                next
            });
            index.push(id);
        }
        CharClasses { index, blocks }
    }

    /// Heap bytes held by the expanded tables.
    pub fn heap_bytes(&self) -> u64 {
        crate::sys::vec_bytes(&self.index) + crate::sys::vec_bytes(&self.blocks)
    }

    /// The class of `c`.
    #[inline]
    pub fn of(&self, c: char) -> Class {
        let cp = c as usize;
        let block = self.index[cp / BLOCK] as usize;
        Class(self.blocks[block * BLOCK + cp % BLOCK])
    }
}

/// The Unicode data a normalization uses: the tables' own version, or the Unicode 9.0 view
/// of Hugging Face tokenizers (characters with a combining class or a decomposition added
/// after 9.0 are inert starters there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NfcData {
    Current,
    Unicode9,
}

impl NfcData {
    #[inline]
    fn inert(self, c: u32) -> bool {
        self == NfcData::Unicode9 && t::NFC_AFTER_9.binary_search(&c).is_ok()
    }
}

/// Canonical_Combining_Class of `c`.
pub fn combining_class(c: u32, data: NfcData) -> u8 {
    if c < t::NFC_QUICK_BELOW || data.inert(c) {
        return 0;
    }
    let i = t::CCC_RUNS.partition_point(|&r| r >> 8 <= c);
    (t::CCC_RUNS[i.saturating_sub(1)] & 0xff) as u8
}

/// The one-level canonical decomposition of `c` (Hangul syllables excluded): `(first, second)`
/// with `second == 0` for a singleton.
pub fn canonical_decomposition(c: u32, data: NfcData) -> Option<(u32, u32)> {
    if data.inert(c) {
        return None;
    }
    let i = t::DECOMPOSITIONS.binary_search_by_key(&c, |e| e[0]).ok()?;
    let e = t::DECOMPOSITIONS[i];
    Some((e[1], e[2]))
}

/// The primary composite of the pair, if any (Hangul excluded).
pub fn primary_composite(first: u32, second: u32, data: NfcData) -> Option<u32> {
    let i = t::COMPOSITIONS.binary_search_by(|e| (e[0], e[1]).cmp(&(first, second))).ok()?;
    let c = t::COMPOSITIONS[i][2];
    (!data.inert(c)).then_some(c)
}

/// Below this code point, text is already NFC.
pub const NFC_QUICK_BELOW: u32 = t::NFC_QUICK_BELOW;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_of_known_characters() {
        let cc = CharClasses::new();
        assert!(cc.of('a').letter() && cc.of('a').lowerish() && !cc.of('a').upperish());
        assert!(cc.of('Q').upperish() && !cc.of('Q').lowerish());
        assert!(cc.of('\u{01C5}').letter() && cc.of('\u{01C5}').upperish()); // Lt
        assert!(cc.of('7').number() && cc.of('\u{0663}').number() && cc.of('\u{2460}').number());
        assert!(cc.of('\u{0301}').mark() && !cc.of('\u{0301}').letter());
        assert!(cc.of(' ').space() && cc.of('\u{3000}').space() && cc.of('\u{85}').space());
        assert!(!cc.of('\u{200B}').space() && !cc.of('\u{1C}').space());
        assert!(cc.of('世').han() && cc.of('世').letter() && !cc.of('か').han());
        assert!(cc.of('!').punct() && cc.of('+').symbol() && cc.of('$').symbol());
        assert_eq!(cc.of('\u{10FFFF}'), Class(0));
    }

    #[test]
    fn normalization_data() {
        let cur = NfcData::Current;
        assert_eq!(combining_class(0x0301, cur), 230);
        assert_eq!(combining_class(0x0041, cur), 0);
        assert_eq!(combining_class(0x10D24, cur), 230); // Hanifi Rohingya, Unicode 11.0
        assert_eq!(combining_class(0x10D24, NfcData::Unicode9), 0);
        assert_eq!(combining_class(0x1E000, NfcData::Unicode9), 230); // Glagolitic, Unicode 9.0
        assert_eq!(canonical_decomposition(0x00E9, cur), Some((0x0065, 0x0301)));
        assert_eq!(canonical_decomposition(0x212B, cur), Some((0x00C5, 0))); // Angstrom sign
        assert_eq!(primary_composite(0x0065, 0x0301, cur), Some(0x00E9));
        assert_eq!(primary_composite(0x0F71, 0x0F72, cur), None); // composition exclusion
    }
}
