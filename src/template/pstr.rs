//! Strings that remember, per character, whether they came from the template (markup) or from
//! the caller's data (content).
//!
//! A [`PStr`] is shared text plus runs of `(end offset, origin)`; most strings have one origin,
//! which costs no allocation beyond the text. Every string operation of the interpreter builds
//! its result with a [`PBuilder`] from slices of its inputs, so each output character keeps the
//! origin of the input character it was copied from.

use std::rc::Rc;

/// Where a character of rendered text came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The template's own text, the special-token variables, or what the template computes.
    Markup,
    /// The caller's data: messages and extra variables.
    Content,
}

impl Origin {
    /// Content if either is: a value computed from data is data.
    pub fn join(self, other: Origin) -> Origin {
        if self == Origin::Content || other == Origin::Content {
            Origin::Content
        } else {
            Origin::Markup
        }
    }
}

/// One run: the bytes up to `end` (exclusive, from the previous run's end) have `origin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    end: usize,
    origin: Origin,
}

#[derive(Clone, Debug)]
enum Runs {
    /// Every byte has this origin.
    One(Origin),
    /// At least two runs, adjacent runs of different origin, the last ending at the length.
    Many(Rc<[Run]>),
}

/// A string with per-character provenance. Cloning shares the text.
#[derive(Clone, Debug)]
pub struct PStr {
    text: Rc<str>,
    runs: Runs,
}

impl PStr {
    /// A string whose characters all have `origin`.
    pub fn new(text: &str, origin: Origin) -> PStr {
        PStr { text: Rc::from(text), runs: Runs::One(origin) }
    }

    /// Template text.
    pub fn markup(text: &str) -> PStr {
        PStr::new(text, Origin::Markup)
    }

    /// Data text.
    pub fn content(text: &str) -> PStr {
        PStr::new(text, Origin::Content)
    }

    /// The empty string.
    pub fn empty() -> PStr {
        PStr::markup("")
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn len(&self) -> usize {
        self.text.len()
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// Content if any character is content (what a value derived from the whole string is).
    pub fn origin(&self) -> Origin {
        match &self.runs {
            Runs::One(o) => *o,
            Runs::Many(_) => Origin::Content,
        }
    }

    /// The runs as `(start, end, origin)` byte ranges, in order; none for the empty string.
    pub fn runs(&self) -> Vec<(usize, usize, Origin)> {
        match &self.runs {
            Runs::One(o) if !self.text.is_empty() => vec![(0, self.text.len(), *o)],
            Runs::One(_) => Vec::new(),
            Runs::Many(runs) => {
                let mut start = 0;
                runs.iter().map(|r| {
                    let item = (start, r.end, r.origin);
                    start = r.end;
                    item
                }).collect()
            }
        }
    }

    /// The origin of the byte at `at` (the last run's for the end).
    pub fn origin_at(&self, at: usize) -> Origin {
        match &self.runs {
            Runs::One(o) => *o,
            Runs::Many(runs) => {
                let k = runs.partition_point(|r| r.end <= at).min(runs.len() - 1);
                runs[k].origin
            }
        }
    }

    /// Bytes `a..b` (character boundaries) with their origins.
    pub fn slice(&self, a: usize, b: usize) -> PStr {
        if a == 0 && b == self.text.len() {
            return self.clone();
        }
        if let Runs::One(o) = self.runs {
            return PStr::new(&self.text[a..b], o);
        }
        let mut out = PBuilder::new();
        out.push_slice(self, a, b);
        out.finish()
    }
}

/// No string the interpreter builds grows past this many bytes (see [`PBuilder::is_full`]).
pub const MAX_STRING: usize = 64 << 20;

/// Builds a [`PStr`] piece by piece; adjacent pushes of one origin merge into one run.
///
/// A builder is bounded: once it holds `limit` bytes it drops further pushes, so printing a
/// huge value cannot exhaust memory; whoever built it checks [`PBuilder::is_full`] (the
/// evaluator refuses any string of [`MAX_STRING`] bytes or more, and output past its limit).
#[derive(Debug)]
pub struct PBuilder {
    text: String,
    runs: Vec<Run>,
    limit: usize,
}

impl Default for PBuilder {
    fn default() -> PBuilder {
        PBuilder::with_limit(MAX_STRING)
    }
}

impl PBuilder {
    pub fn new() -> PBuilder {
        PBuilder::default()
    }

    /// A builder that stops growing at `limit` bytes.
    pub fn with_limit(limit: usize) -> PBuilder {
        PBuilder { text: String::new(), runs: Vec::new(), limit }
    }

    pub fn len(&self) -> usize {
        self.text.len()
    }

    /// The limit is reached: what was pushed since is lost.
    pub fn is_full(&self) -> bool {
        self.text.len() >= self.limit
    }

    pub fn push(&mut self, s: &str, origin: Origin) {
        if s.is_empty() || self.is_full() {
            return;
        }
        self.text.push_str(s);
        let end = self.text.len();
        match self.runs.last_mut() {
            Some(r) if r.origin == origin => r.end = end,
            _ => self.runs.push(Run { end, origin }),
        }
    }

    pub fn push_char(&mut self, c: char, origin: Origin) {
        let mut buf = [0u8; 4];
        self.push(c.encode_utf8(&mut buf), origin);
    }

    pub fn push_pstr(&mut self, p: &PStr) {
        self.push_slice(p, 0, p.len());
    }

    /// Bytes `a..b` of `p` (character boundaries), each keeping its origin.
    pub fn push_slice(&mut self, p: &PStr, a: usize, b: usize) {
        if a >= b {
            return;
        }
        match &p.runs {
            Runs::One(o) => self.push(&p.text[a..b], *o),
            Runs::Many(_) => {
                for (s, e, o) in p.runs() {
                    let (s, e) = (s.max(a), e.min(b));
                    if s < e {
                        self.push(&p.text[s..e], o);
                    }
                }
            }
        }
    }

    /// The runs built so far as `(text, origin)`, for the renderer's final pieces.
    pub fn into_parts(self) -> Vec<(String, Origin)> {
        let mut start = 0;
        self.runs.iter().map(|r| {
            let part = (self.text[start..r.end].to_string(), r.origin);
            start = r.end;
            part
        }).collect()
    }

    pub fn finish(self) -> PStr {
        let runs = match self.runs.len() {
            0 => Runs::One(Origin::Markup),
            1 => Runs::One(self.runs[0].origin),
            _ => Runs::Many(Rc::from(self.runs)),
        };
        PStr { text: Rc::from(self.text), runs }
    }
}

/// Applies `f` to the text of every run of `p` and keeps each run's origin: for case mappings,
/// which work character by character.
pub fn map_runs(p: &PStr, mut f: impl FnMut(&str) -> String) -> PStr {
    let mut out = PBuilder::new();
    for (a, b, o) in p.runs() {
        out.push(&f(&p.as_str()[a..b]), o);
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_and_slices_keep_origins() {
        let mut b = PBuilder::new();
        b.push("ab", Origin::Markup);
        b.push("cd", Origin::Markup);
        b.push("EF", Origin::Content);
        b.push("", Origin::Markup);
        b.push("g", Origin::Markup);
        let p = b.finish();
        assert_eq!(p.as_str(), "abcdEFg");
        assert_eq!(p.runs(), vec![(0, 4, Origin::Markup), (4, 6, Origin::Content), (6, 7, Origin::Markup)]);
        assert_eq!(p.origin(), Origin::Content);
        assert_eq!(p.origin_at(4), Origin::Content);
        assert_eq!(p.origin_at(6), Origin::Markup);
        let s = p.slice(3, 5);
        assert_eq!(s.as_str(), "dE");
        assert_eq!(s.runs(), vec![(0, 1, Origin::Markup), (1, 2, Origin::Content)]);
        let one = p.slice(4, 6);
        assert_eq!(one.runs(), vec![(0, 2, Origin::Content)]);
        assert!(PStr::empty().runs().is_empty());
    }

    #[test]
    fn mapping_runs_keeps_origins() {
        let mut b = PBuilder::new();
        b.push("ab", Origin::Markup);
        b.push("cd", Origin::Content);
        let up = map_runs(&b.finish(), str::to_uppercase);
        assert_eq!(up.as_str(), "ABCD");
        assert_eq!(up.runs(), vec![(0, 2, Origin::Markup), (2, 4, Origin::Content)]);
    }
}
