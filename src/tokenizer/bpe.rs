//! The byte-pair-encoding core shared by every vocabulary kind, and the token table it looks
//! pieces up in.
//!
//! [`merge`] applies BPE to one pre-token: starting from initial symbols, it repeatedly merges
//! the adjacent pair of lowest rank, the leftmost one among equal ranks, until no pair
//! merges. What a pair's rank is comes from the vocabulary kind (a [`PairRule`]):
//! tiktoken ranks the concatenated bytes, Hugging Face ranks its `merges` list, SentencePiece
//! ranks by piece score. Candidate pairs sit in a binary heap ordered by (rank, position); a
//! merge invalidates at most two candidates and creates at most two, so a piece of n symbols
//! costs O(n log n) however long it is, with no window or chunking that could change the
//! result.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Token id → bytes, and bytes → token id, for ids that may have gaps.
pub struct TokenTable {
    data: Vec<u8>,
    /// `(offset, len)` into `data` per id; `len == u32::MAX` for an id that has no bytes.
    spans: Vec<(u32, u32)>,
    /// Open-addressing hash table of `id + 1` (0 = empty slot), for ids marked findable.
    slots: Vec<u32>,
}

const NO_BYTES: u32 = u32::MAX;

impl TokenTable {
    /// A table for ids `0..n` with no tokens yet.
    pub fn new(n: usize) -> TokenTable {
        TokenTable { data: Vec::new(), spans: vec![(0, NO_BYTES); n], slots: Vec::new() }
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Sets the bytes of `id` (growing the id range if needed).
    pub fn set(&mut self, id: u32, bytes: &[u8]) {
        let i = id as usize;
        if i >= self.spans.len() {
            self.spans.resize(i + 1, (0, NO_BYTES));
        }
        self.spans[i] = (self.data.len() as u32, bytes.len() as u32);
        self.data.extend_from_slice(bytes);
    }

    /// The bytes of `id`, or `None` for an id out of range or without bytes.
    #[inline]
    pub fn bytes(&self, id: u32) -> Option<&[u8]> {
        let &(off, len) = self.spans.get(id as usize)?;
        if len == NO_BYTES {
            return None;
        }
        self.data.get(off as usize..off as usize + len as usize)
    }

    /// Builds the lookup index over the ids for which `findable(id)` holds. When two ids
    /// have the same bytes, the first one inserted (lowest id) is found; `on_duplicate`
    /// reports the pair (the later id, the earlier id).
    pub fn index(&mut self, findable: impl Fn(u32) -> bool, mut on_duplicate: impl FnMut(u32, u32)) {
        let n = (0..self.spans.len() as u32).filter(|&id| findable(id) && self.bytes(id).is_some()).count();
        let cap = (n * 2).next_power_of_two().max(16);
        self.slots = vec![0; cap];
        for id in 0..self.spans.len() as u32 {
            if !findable(id) {
                continue;
            }
            let Some(b) = self.bytes(id) else { continue };
            let mut s = hash_bytes(b) as usize & (cap - 1);
            loop {
                let e = self.slots[s];
                if e == 0 {
                    self.slots[s] = id + 1;
                    break;
                }
                if self.bytes(e - 1) == Some(b) {
                    on_duplicate(id, e - 1);
                    break;
                }
                s = (s + 1) & (cap - 1);
            }
        }
    }

    /// The id whose bytes are `b`.
    #[inline]
    pub fn find(&self, b: &[u8]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut s = hash_bytes(b) as usize & mask;
        loop {
            let e = self.slots[s];
            if e == 0 {
                return None;
            }
            if self.bytes(e - 1) == Some(b) {
                return Some(e - 1);
            }
            s = (s + 1) & mask;
        }
    }
}

/// A fast non-cryptographic hash of a short byte string (tokens are short).
#[inline]
pub fn hash_bytes(b: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (b.len() as u64).wrapping_mul(K);
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h.rotate_left(23) ^ w).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = 0u64;
        for (i, &x) in rest.iter().enumerate() {
            w |= (x as u64) << (8 * i);
        }
        h = (h.rotate_left(23) ^ w).wrapping_mul(K);
    }
    h ^ (h >> 32)
}

/// A hasher for integer keys (pair ids), for `std::collections::HashMap`.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0 = hash_bytes(bytes) ^ self.0.rotate_left(7);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(7) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub type IdBuildHasher = std::hash::BuildHasherDefault<IdHasher>;

/// One symbol of a piece during merging.
#[derive(Clone, Copy, Debug)]
pub struct Sym {
    /// Byte range of the piece this symbol covers.
    pub start: usize,
    pub end: usize,
    pub id: u32,
    /// False for symbols that never merge (SentencePiece byte fallback).
    pub mergeable: bool,
}

/// How a vocabulary ranks the merge of two adjacent symbols: `Some((rank, merged id))`.
pub trait PairRule {
    fn pair(&self, piece: &[u8], left: &Sym, right: &Sym) -> Option<(u32, u32)>;
}

const NONE: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Node {
    sym: Sym,
    prev: usize,
    next: usize,
    alive: bool,
}

/// Reusable buffers for [`merge`].
#[derive(Default)]
pub struct Scratch {
    nodes: Vec<Node>,
    /// `(rank, start)` key, then left node, right node, the right node's end, merged id.
    heap: BinaryHeap<Reverse<(u64, usize, usize, usize, u32)>>,
}

/// Merges `init` (the initial symbols of `piece`, in order) by `rule` and appends the final
/// ids to `out`.
pub fn merge<R: PairRule + ?Sized>(piece: &[u8], init: &[Sym], rule: &R, scratch: &mut Scratch, out: &mut Vec<u32>) {
    if init.len() < 2 {
        out.extend(init.iter().map(|s| s.id));
        return;
    }
    let nodes = &mut scratch.nodes;
    nodes.clear();
    for (i, &sym) in init.iter().enumerate() {
        nodes.push(Node { sym, prev: if i == 0 { NONE } else { i - 1 }, next: if i + 1 == init.len() { NONE } else { i + 1 }, alive: true });
    }
    let heap = &mut scratch.heap;
    heap.clear();
    let push = |heap: &mut BinaryHeap<_>, nodes: &[Node], l: usize, r: usize| {
        let (a, b) = (&nodes[l].sym, &nodes[r].sym);
        if !(a.mergeable && b.mergeable) {
            return;
        }
        if let Some((rank, id)) = rule.pair(piece, a, b) {
            heap.push(Reverse((((rank as u64) << 32) | a.start as u64, l, r, b.end, id)));
        }
    };
    for i in 0..nodes.len() - 1 {
        push(heap, nodes, i, i + 1);
    }
    while let Some(Reverse((_, l, r, r_end, id))) = heap.pop() {
        let valid = nodes[l].alive && nodes[l].next == r && nodes[r].alive && nodes[r].sym.end == r_end;
        if !valid {
            continue;
        }
        nodes[l].sym.end = r_end;
        nodes[l].sym.id = id;
        nodes[r].alive = false;
        let after = nodes[r].next;
        nodes[l].next = after;
        if after != NONE {
            nodes[after].prev = l;
            push(heap, nodes, l, after);
        }
        let before = nodes[l].prev;
        if before != NONE {
            push(heap, nodes, before, l);
        }
    }
    let mut i = 0;
    while i != NONE {
        out.push(nodes[i].sym.id);
        i = nodes[i].next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks = the id of the concatenation in a small table (the tiktoken rule).
    struct Concat(TokenTable);
    impl PairRule for Concat {
        fn pair(&self, piece: &[u8], l: &Sym, r: &Sym) -> Option<(u32, u32)> {
            let id = self.0.find(&piece[l.start..r.end])?;
            Some((id, id))
        }
    }

    fn table(tokens: &[&[u8]]) -> TokenTable {
        let mut t = TokenTable::new(0);
        for (i, b) in tokens.iter().enumerate() {
            t.set(i as u32, b);
        }
        t.index(|_| true, |_, _| {});
        t
    }

    fn encode(t: &Concat, s: &[u8]) -> Vec<u32> {
        let init: Vec<Sym> = (0..s.len()).map(|i| Sym { start: i, end: i + 1, id: t.0.find(&s[i..i + 1]).unwrap(), mergeable: true }).collect();
        let mut out = Vec::new();
        merge(s, &init, t, &mut Scratch::default(), &mut out);
        out
    }

    #[test]
    fn lowest_rank_first_then_leftmost() {
        let t = Concat(table(&[b"a", b"b", b"c", b"bc", b"ab", b"abc", b"aa"]));
        assert_eq!(encode(&t, b"abc"), [5]); // bc (3) first, then a+bc = abc
        assert_eq!(encode(&t, b"aaa"), [6, 0]); // leftmost of two equal-rank pairs
        assert_eq!(encode(&t, b"cab"), [2, 4]);
        assert_eq!(t.0.find(b"zz"), None);
    }

    #[test]
    fn long_runs_merge_exactly() {
        // "aaaa…" with only "aa": pairs from the left, an odd one left over.
        let t = Concat(table(&[b"a", b"aa"]));
        let ids = encode(&t, &[b'a'; 10001]);
        assert_eq!(ids.len(), 5001);
        assert!(ids[..5000].iter().all(|&i| i == 1) && ids[5000] == 0);
    }
}
