//! Finding special-token strings (`<|endoftext|>`, `<｜User｜>`, `[BOS]`…) in markup text.
//!
//! Only [`super::Tokenizer::tokenize_markup`] looks for them; content encoding never does, so
//! user text cannot spell a control token. At each position the longest special that starts
//! there wins (Hugging Face's added-vocabulary matcher is leftmost-longest; tiktoken's
//! alternation of specials has no defined order among overlapping ones, and the published
//! vocabularies have none that overlap).

/// A set of special strings and their ids.
pub struct SpecialMatcher {
    /// `(text, id)`, longest first so the first hit at a position is the longest.
    entries: Vec<(String, u32)>,
    /// Per first byte, the indices into `entries` of the specials that start with it
    /// (longest first).
    by_first: Vec<Vec<usize>>,
}

impl SpecialMatcher {
    pub fn new(specials: impl IntoIterator<Item = (String, u32)>) -> SpecialMatcher {
        let mut entries: Vec<(String, u32)> = specials.into_iter().filter(|(s, _)| !s.is_empty()).collect();
        entries.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        let mut by_first = vec![Vec::new(); 256];
        for (i, (s, _)) in entries.iter().enumerate() {
            by_first[s.as_bytes()[0] as usize].push(i);
        }
        SpecialMatcher { entries, by_first }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every `(text, id)`.
    pub fn entries(&self) -> &[(String, u32)] {
        &self.entries
    }

    /// The id of exactly this special string.
    pub fn id_of(&self, s: &str) -> Option<u32> {
        self.entries.iter().find(|(t, _)| t == s).map(|&(_, id)| id)
    }

    /// The first special in `text` at or after byte `from`: `(start, end, id)`.
    pub fn find(&self, text: &str, from: usize) -> Option<(usize, usize, u32)> {
        if self.entries.is_empty() {
            return None;
        }
        let b = text.as_bytes();
        let mut i = from;
        while i < b.len() {
            let rest = &b[i..];
            for &k in &self.by_first[b[i] as usize] {
                let (s, id) = &self.entries[k];
                if rest.starts_with(s.as_bytes()) {
                    return Some((i, i + s.len(), *id));
                }
            }
            i += 1;
        }
        None
    }

    /// Splits `text` into ordinary segments and specials, in order.
    pub fn split<'a>(&self, text: &'a str) -> Vec<Segment<'a>> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some((a, b, id)) = self.find(text, at) {
            if a > at {
                out.push(Segment::Text(&text[at..a]));
            }
            out.push(Segment::Special(id));
            at = b;
        }
        if at < text.len() || out.is_empty() {
            out.push(Segment::Text(&text[at..]));
        }
        out
    }
}

/// A piece of markup: ordinary text, or one special token.
#[derive(Debug, PartialEq, Eq)]
pub enum Segment<'a> {
    Text(&'a str),
    Special(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_special_at_leftmost_position() {
        let m = SpecialMatcher::new([("<a>".to_string(), 1), ("<a><b>".to_string(), 2), ("<b>".to_string(), 3)]);
        assert_eq!(m.split("x<a><b>y<b>"), [Segment::Text("x"), Segment::Special(2), Segment::Text("y"), Segment::Special(3)]);
        assert_eq!(m.split("<a"), [Segment::Text("<a")]);
        assert_eq!(m.id_of("<b>"), Some(3));
    }
}
