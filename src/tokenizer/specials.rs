//! Finding special-token strings (`<|endoftext|>`, `<｜User｜>`, `[BOS]`…) in markup text.
//!
//! Only [`super::Tokenizer::tokenize_markup`] looks for them; content encoding never does, so
//! user text cannot spell a control token. The leftmost match wins, and among matches at that
//! position the longest (Hugging Face's added-vocabulary matcher is leftmost-longest;
//! tiktoken's alternation of specials has no defined order among overlapping ones, and the
//! published vocabularies have none that overlap).
//!
//! The strings sit in a byte trie, so a search costs at most one trie walk per text position,
//! each walk no longer than the longest special: linear in the text however many specials
//! share a first byte (DeepSeek-V3 has 1,282 that start with `<`; trying each of them at
//! every `<` made `"<" * 1M` quadratic in practice).

/// No entry ends at this trie node.
const NO_ENTRY: u32 = u32::MAX;

/// A set of special strings and their ids.
pub struct SpecialMatcher {
    /// `(text, id)` in the order given; a string given twice keeps its first entry.
    entries: Vec<(String, u32)>,
    /// Trie nodes; node 0 is the root.
    nodes: Vec<Node>,
    /// Children of every node, contiguous per node and sorted by byte: `(byte, node)`.
    edges: Vec<(u8, u32)>,
    /// The root's children by first byte (0 = no special starts with that byte), so the scan
    /// for a candidate start is one table load per text byte.
    root: Box<[u32; 256]>,
}

#[derive(Clone, Copy)]
struct Node {
    first_edge: u32,
    n_edges: u32,
    /// The entry whose string ends here, or `NO_ENTRY`.
    entry: u32,
}

impl SpecialMatcher {
    pub fn new(specials: impl IntoIterator<Item = (String, u32)>) -> SpecialMatcher {
        let mut entries: Vec<(String, u32)> = Vec::new();
        // Build with sorted child lists, then flatten breadth-first into `edges`.
        let mut kids: Vec<Vec<(u8, usize)>> = vec![Vec::new()];
        let mut ends: Vec<u32> = vec![NO_ENTRY];
        for (s, id) in specials {
            if s.is_empty() {
                continue;
            }
            let mut at = 0usize;
            for &c in s.as_bytes() {
                at = match kids[at].binary_search_by_key(&c, |&(b, _)| b) {
                    Ok(k) => kids[at][k].1,
                    Err(k) => {
                        let n = kids.len();
                        kids.push(Vec::new());
                        ends.push(NO_ENTRY);
                        kids[at].insert(k, (c, n));
                        n
                    }
                };
            }
            if ends[at] == NO_ENTRY {
                ends[at] = entries.len() as u32;
                entries.push((s, id));
            }
        }
        // Renumber in breadth-first order so every node's children are one contiguous run.
        let mut order = vec![0usize];
        let mut new_id = vec![0u32; kids.len()];
        let mut i = 0;
        while i < order.len() {
            let n = order[i];
            for &(_, c) in &kids[n] {
                new_id[c] = order.len() as u32;
                order.push(c);
            }
            i += 1;
        }
        let mut nodes = Vec::with_capacity(order.len());
        let mut edges = Vec::with_capacity(order.len());
        for &n in &order {
            nodes.push(Node { first_edge: edges.len() as u32, n_edges: kids[n].len() as u32, entry: ends[n] });
            edges.extend(kids[n].iter().map(|&(b, c)| (b, new_id[c])));
        }
        let mut root = Box::new([0u32; 256]);
        for &(b, c) in &kids[0] {
            root[b as usize] = new_id[c];
        }
        SpecialMatcher { entries, nodes, edges, root }
    }

    /// Heap bytes held: the entries and their strings, the trie's nodes, edges and root table.
    pub fn heap_bytes(&self) -> u64 {
        use crate::sys::vec_bytes;
        vec_bytes(&self.entries) + self.entries.iter().map(|(s, _)| s.capacity() as u64).sum::<u64>()
            + vec_bytes(&self.nodes) + vec_bytes(&self.edges) + std::mem::size_of_val(&*self.root) as u64
    }

    /// Every `(text, id)`, in the order given.
    pub fn entries(&self) -> &[(String, u32)] {
        &self.entries
    }

    /// The id of exactly this special string.
    pub fn id_of(&self, s: &str) -> Option<u32> {
        let mut node = 0usize;
        for &c in s.as_bytes() {
            node = self.child(node, c)?;
        }
        let e = self.nodes.get(node)?.entry;
        (e != NO_ENTRY && !s.is_empty()).then(|| self.entries[e as usize].1)
    }

    #[inline]
    fn child(&self, node: usize, c: u8) -> Option<usize> {
        if node == 0 {
            let n = self.root[c as usize];
            return (n != 0).then_some(n as usize);
        }
        let n = self.nodes[node];
        let kids = &self.edges[n.first_edge as usize..(n.first_edge + n.n_edges) as usize];
        if kids.len() <= 8 {
            return kids.iter().find(|&&(b, _)| b == c).map(|&(_, k)| k as usize);
        }
        kids.binary_search_by_key(&c, |&(b, _)| b).ok().map(|k| kids[k].1 as usize)
    }

    /// The first special in `text` at or after byte `from`: `(start, end, id)`.
    #[cfg(test)]
    pub fn find(&self, text: &str, from: usize) -> Option<(usize, usize, u32)> {
        self.find_entry(text, from).map(|(s, e, k)| (s, e, self.entries[k].1))
    }

    /// Like [`SpecialMatcher::find`], with the index into [`SpecialMatcher::entries`].
    pub fn find_entry(&self, text: &str, from: usize) -> Option<(usize, usize, usize)> {
        if self.entries.is_empty() {
            return None;
        }
        let b = text.as_bytes();
        let mut i = from;
        while i < b.len() {
            let mut node = self.root[b[i] as usize] as usize;
            if node == 0 {
                i += 1;
                continue;
            }
            let mut best = None;
            let mut j = i + 1;
            loop {
                let e = self.nodes[node].entry;
                if e != NO_ENTRY {
                    best = Some((j, e as usize));
                }
                let Some(next) = b.get(j).and_then(|&c| self.child(node, c)) else { break };
                node = next;
                j += 1;
            }
            if let Some((end, k)) = best {
                return Some((i, end, k));
            }
            i += 1;
        }
        None
    }

    /// Like [`SpecialMatcher::find_entry`], but with `ranges` (sorted, disjoint byte ranges of
    /// `text`: the markup of a rendered chat template) a special counts only where its first
    /// and its last character lie in a range — wholly inside one, or assembled by the template
    /// around other text (`'<|' + message.role + '|>'`). The leftmost such start wins, and the
    /// longest such special there; one that begins or ends outside the ranges (in particular
    /// one wholly inside content) is text. `None` searches everywhere.
    pub fn find_entry_in(&self, text: &str, from: usize, ranges: Option<&[(usize, usize)]>) -> Option<(usize, usize, usize)> {
        let Some(ranges) = ranges else { return self.find_entry(text, from) };
        if self.entries.is_empty() {
            return None;
        }
        let inside = |pos: usize| {
            let k = ranges.partition_point(|&(_, end)| end <= pos);
            ranges.get(k).is_some_and(|&(a, _)| a <= pos)
        };
        let b = text.as_bytes();
        let first = ranges.partition_point(|&(_, end)| end <= from);
        for &(a, e) in &ranges[first..] {
            for i in a.max(from)..e.min(b.len()) {
                let mut node = self.root[b[i] as usize] as usize;
                if node == 0 {
                    continue;
                }
                let mut best = None;
                let mut j = i + 1;
                loop {
                    let entry = self.nodes[node].entry;
                    if entry != NO_ENTRY && inside(j - 1) {
                        best = Some((j, entry as usize));
                    }
                    let Some(next) = b.get(j).and_then(|&c| self.child(node, c)) else { break };
                    node = next;
                    j += 1;
                }
                if let Some((end, k)) = best {
                    return Some((i, end, k));
                }
            }
        }
        None
    }

    /// Splits `text` into ordinary segments and specials, in order.
    #[cfg(test)]
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

/// The parts of sorted byte `ranges` that fall in `start..start + len`, relative to `start`.
pub fn clip_ranges(ranges: &[(usize, usize)], start: usize, len: usize) -> Vec<(usize, usize)> {
    let end = start + len;
    let first = ranges.partition_point(|&(_, b)| b <= start);
    ranges[first..].iter().take_while(|&&(a, _)| a < end).map(|&(a, b)| (a.max(start) - start, b.min(end) - start))
        .filter(|(a, b)| a < b).collect()
}

/// A piece of markup: ordinary text, or one special token.
#[cfg(test)]
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
        assert_eq!(m.split("<a><b"), [Segment::Special(1), Segment::Text("<b")]);
        assert_eq!(m.id_of("<b>"), Some(3));
        assert_eq!(m.id_of("<b"), None);
        assert_eq!(m.id_of(""), None);
    }

    #[test]
    fn matches_can_be_confined_to_ranges() {
        let m = SpecialMatcher::new([("<a>".to_string(), 1), ("<a><b>".to_string(), 2), ("<b>".to_string(), 3)]);
        let text = "<a><b>x<b>";
        // Markup "<a>", content "<b>x", markup "<b>": the longer special would reach into
        // content, so the one inside the markup is taken.
        let ranges = [(0, 3), (7, 10)];
        assert_eq!(m.find_entry_in(text, 0, Some(&ranges)), Some((0, 3, 0)));
        assert_eq!(m.find_entry_in(text, 3, Some(&ranges)), Some((7, 10, 2)));
        assert_eq!(m.find_entry_in(text, 0, Some(&[(3, 7)])), Some((3, 6, 2)));
        assert_eq!(m.find_entry_in(text, 0, Some(&[(1, 6)])), Some((3, 6, 2)));
        assert_eq!(m.find_entry_in(text, 0, Some(&[])), None);
        assert_eq!(m.find_entry_in(text, 0, None), Some((0, 6, 1)));
        // Assembled around other text: first and last characters in markup.
        assert_eq!(m.find_entry_in(text, 0, Some(&[(0, 1), (5, 6)])), Some((0, 6, 1)));
        // Begins in markup, ends outside: text.
        assert_eq!(m.find_entry_in("<a>", 0, Some(&[(0, 2)])), None);
        assert_eq!(m.find_entry_in("<a>", 0, Some(&[(1, 3)])), None);
        assert_eq!(clip_ranges(&[(0, 3), (5, 9), (12, 20)], 2, 8), vec![(0, 1), (3, 7)]);
    }

    /// The trie agrees with the plain definition (try every special at every position,
    /// keep the longest at the leftmost) on random texts over a small alphabet, with many
    /// specials sharing prefixes.
    #[test]
    fn trie_matches_brute_force() {
        let mut seed = 99u64;
        let mut next = move |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut specials = Vec::new();
        for id in 0..40u32 {
            let len = 1 + next(5) as usize;
            let s: String = (0..len).map(|_| b"<|>a"[next(4) as usize] as char).collect();
            specials.push((s, id));
        }
        let m = SpecialMatcher::new(specials.clone());
        for _ in 0..2000 {
            let len = next(30) as usize;
            let text: String = (0..len).map(|_| b"<|>ab"[next(5) as usize] as char).collect();
            for from in 0..=text.len() {
                let want = (from..text.len()).find_map(|i| {
                    // First-given entry wins among equal strings, as in `new`.
                    let mut best: Option<(usize, u32)> = None;
                    for (s, id) in &specials {
                        if text[i..].starts_with(s.as_str()) && best.is_none_or(|(l, _)| s.len() > l) {
                            best = Some((s.len(), *id));
                        }
                    }
                    best.map(|(l, id)| (i, i + l, id))
                });
                assert_eq!(m.find(&text, from), want, "{text:?} from {from}");
            }
        }
    }
}
