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
    /// Open-addressing hash table over the ids marked findable. A slot holds the token's
    /// first eight bytes and its length, so most lookups touch one cache line.
    slots: Vec<Slot>,
}

#[derive(Clone, Copy)]
struct Slot {
    /// The first (up to) eight bytes, little-endian, zero-padded.
    head: u64,
    /// Token id; `EMPTY` for a free slot.
    id: u32,
    len: u32,
}

const NO_BYTES: u32 = u32::MAX;
const EMPTY: u32 = u32::MAX;

/// The first (up to) eight bytes of `b` as a little-endian word.
#[inline]
fn head(b: &[u8]) -> u64 {
    if b.len() >= 8 {
        u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    } else {
        let mut w = 0u64;
        for (i, &x) in b.iter().enumerate() {
            w |= (x as u64) << (8 * i);
        }
        w
    }
}

impl TokenTable {
    /// A table for ids `0..n` with no tokens yet.
    pub fn new(n: usize) -> TokenTable {
        TokenTable { data: Vec::new(), spans: vec![(0, NO_BYTES); n], slots: Vec::new() }
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Heap bytes held (capacities of the byte store, the spans and the lookup index).
    pub fn heap_bytes(&self) -> u64 {
        use crate::sys::vec_bytes;
        vec_bytes(&self.data) + vec_bytes(&self.spans) + vec_bytes(&self.slots)
    }

    /// Reserves room for `ids` ids and `bytes` token bytes.
    pub fn reserve(&mut self, ids: usize, bytes: usize) {
        self.spans.reserve(ids.saturating_sub(self.spans.len()));
        self.data.reserve(bytes.saturating_sub(self.data.len()));
    }

    /// Gives back spare capacity (after building), so the table holds what it uses.
    pub fn shrink_to_fit(&mut self) {
        self.spans.shrink_to_fit();
        self.data.shrink_to_fit();
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
        let mut slots = vec![Slot { head: 0, id: EMPTY, len: 0 }; cap];
        for id in 0..self.spans.len() as u32 {
            if !findable(id) {
                continue;
            }
            let Some(b) = self.bytes(id) else { continue };
            match self.probe(&slots, b) {
                Ok(prev) => on_duplicate(id, prev),
                Err(s) => slots[s] = Slot { head: head(b), id, len: b.len() as u32 },
            }
        }
        self.slots = slots;
    }

    /// `Ok(id)` of `b` in `slots`, or `Err(free slot)` where it would go.
    #[inline]
    fn probe(&self, slots: &[Slot], b: &[u8]) -> Result<u32, usize> {
        let mask = slots.len() - 1;
        let (h, w, n) = (hash_bytes(b), head(b), b.len() as u32);
        let mut s = h as usize & mask;
        loop {
            let slot = slots[s];
            if slot.id == EMPTY {
                return Err(s);
            }
            if slot.len == n && slot.head == w && (n <= 8 || self.bytes(slot.id).is_some_and(|x| x[8..] == b[8..])) {
                return Ok(slot.id);
            }
            s = (s + 1) & mask;
        }
    }

    /// The id whose bytes are `b`.
    #[inline]
    pub fn find(&self, b: &[u8]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        self.probe(&self.slots, b).ok()
    }
}

/// A small direct-mapped memo of [`TokenTable::find`] for short pieces, kept by one encode
/// call: frequent words then hit this cache-resident array instead of the large table. It
/// only remembers answers of `find`, so it cannot change a result.
pub struct FindMemo {
    slots: Vec<(u64, u32, u32)>,
}

const MEMO_SLOTS: usize = 1 << 13;
const MEMO_EMPTY: u32 = u32::MAX;
const NOT_FOUND: u32 = u32::MAX - 1;

impl FindMemo {
    /// A memo worth its 128 KiB only for long texts; `enabled == false` makes a pass-through.
    pub fn new(enabled: bool) -> FindMemo {
        FindMemo { slots: if enabled { vec![(0, MEMO_EMPTY, 0); MEMO_SLOTS] } else { Vec::new() } }
    }

    /// `table.find(b)`, remembered for pieces of at most eight bytes.
    #[inline]
    pub fn find(&mut self, table: &TokenTable, b: &[u8]) -> Option<u32> {
        if b.len() > 8 || self.slots.is_empty() {
            return table.find(b);
        }
        let w = head(b);
        let i = (hash_bytes(b) >> 7) as usize & (MEMO_SLOTS - 1);
        let (h, len, id) = self.slots[i];
        if len == b.len() as u32 && h == w {
            return (id != NOT_FOUND).then_some(id);
        }
        let found = table.find(b);
        self.slots[i] = (w, b.len() as u32, found.unwrap_or(NOT_FOUND));
        found
    }
}

/// A fast non-cryptographic hash of a short byte string (tokens are short).
#[inline]
pub fn hash_bytes(b: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (head(b) ^ (b.len() as u64).rotate_right(8)).wrapping_mul(K);
    if b.len() > 8 {
        let mut chunks = b[8..].chunks_exact(8);
        for c in &mut chunks {
            h = (h.rotate_left(23) ^ head(c)).wrapping_mul(K);
        }
        h = (h.rotate_left(23) ^ head(chunks.remainder())).wrapping_mul(K);
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
    if init.len() <= SMALL {
        merge_small(piece, init, rule, out);
        return;
    }
    merge_heap(piece, init, rule, scratch, out);
}

/// Pieces of at most this many symbols merge by rescanning (cheaper than a heap when short).
pub const SMALL: usize = 16;

/// The same merge order as [`merge_heap`] — lowest rank, then leftmost — by scanning all
/// pairs after each merge; O(n²), for short pieces.
pub fn merge_small<R: PairRule + ?Sized>(piece: &[u8], init: &[Sym], rule: &R, out: &mut Vec<u32>) {
    let mut syms = [Sym { start: 0, end: 0, id: 0, mergeable: false }; SMALL];
    let mut ranks = [None; SMALL];
    let mut n = init.len().min(SMALL);
    syms[..n].copy_from_slice(&init[..n]);
    let pair = |a: &Sym, b: &Sym| if a.mergeable && b.mergeable { rule.pair(piece, a, b) } else { None };
    for i in 0..n - 1 {
        ranks[i] = pair(&syms[i], &syms[i + 1]);
    }
    loop {
        let mut best: Option<(u32, usize, u32)> = None;
        for (i, r) in ranks[..n - 1].iter().enumerate() {
            if let Some((rank, id)) = *r {
                if best.is_none_or(|(b, _, _)| rank < b) {
                    best = Some((rank, i, id));
                }
            }
        }
        let Some((_, i, id)) = best else { break };
        syms[i].end = syms[i + 1].end;
        syms[i].id = id;
        syms.copy_within(i + 2..n, i + 1);
        ranks.copy_within(i + 2..n, i + 1);
        n -= 1;
        if i + 1 < n {
            ranks[i] = pair(&syms[i], &syms[i + 1]);
        } else {
            ranks[i] = None;
        }
        if i > 0 {
            ranks[i - 1] = pair(&syms[i - 1], &syms[i]);
        }
        if n < 2 {
            break;
        }
    }
    out.extend(syms[..n].iter().map(|s| s.id));
}

/// Heap-ordered merging: O(n log n) for a piece of any length.
pub fn merge_heap<R: PairRule + ?Sized>(piece: &[u8], init: &[Sym], rule: &R, scratch: &mut Scratch, out: &mut Vec<u32>) {
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
    use crate::test_util::Must;

    /// The scanning merge and the heap merge must give identical ids (bit identity of the
    /// two algorithms) on every piece.
    #[test]
    fn small_and_heap_merges_agree() {
        let t = Concat(table(&[b"a", b"b", b"c", b"ab", b"bc", b"ca", b"abc", b"bca", b"aa", b"aaa", b"cab", b"abca", b"bb"]));
        let mut seed = 12345u64;
        for _ in 0..20000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = 2 + (seed >> 60) as usize; // 2..=17
            let s: Vec<u8> = (0..len).map(|k| b"abc"[((seed >> (k * 3 % 60)) % 3) as usize]).collect();
            let init: Vec<Sym> = (0..s.len()).map(|i| Sym { start: i, end: i + 1, id: t.0.find(&s[i..i + 1]).must(), mergeable: (seed >> i) & 7 != 0 }).collect();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            merge_heap(&s, &init, &t, &mut Scratch::default(), &mut a);
            if init.len() <= SMALL {
                merge_small(&s, &init, &t, &mut b);
                assert_eq!(a, b, "{:?}", String::from_utf8_lossy(&s));
            }
        }
    }

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
        let init: Vec<Sym> = (0..s.len()).map(|i| Sym { start: i, end: i + 1, id: t.0.find(&s[i..i + 1]).must(), mergeable: true }).collect();
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
