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
//!
//! The heap (four-way, see [`QuadHeap`]) is kept small because long pieces are bound by cache misses: an entry is one `u64`
//! (rank in the high half, the left part's index in the low half, so the order is (rank,
//! position)), and each part of the linked list records the rank and merged id of the pair it
//! starts. An entry is acted on only if its part is alive and still starts a pair of that
//! rank; anything else is stale and skipped (lazy invalidation, nothing is ever searched for
//! in the heap).

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

/// A candidate merge in [`Scratch`]'s heap: the `(rank, start)` key, then the left node, the
/// right node, the right node's end, and the merged id.
type Candidate = (u64, usize, usize, usize, u32);

/// Reusable buffers for [`merge`].
#[derive(Default)]
pub struct Scratch {
    nodes: Vec<Node>,
    heap: BinaryHeap<Reverse<Candidate>>,
    parts: Vec<Part>,
    keys: QuadHeap,
    buckets: RankBuckets,
}

/// The queue of candidate pairs of [`merge_parts`]: `u64` keys, rank high and position low,
/// popped smallest first.
trait PairQueue {
    fn clear(&mut self);
    fn push(&mut self, key: u64);
    /// Called once after the initial pairs are pushed.
    fn ready(&mut self);
    fn pop(&mut self) -> Option<u64>;
}

impl PairQueue for QuadHeap {
    fn clear(&mut self) {
        self.0.clear();
    }
    fn push(&mut self, key: u64) {
        QuadHeap::push(self, key)
    }
    fn ready(&mut self) {
        self.heapify();
    }
    fn pop(&mut self) -> Option<u64> {
        QuadHeap::pop(self)
    }
}

/// Pieces of at least this many symbols queue their pairs in [`RankBuckets`].
const BUCKETS_FROM: usize = 1 << 14;

/// Ranks above this go to the side heap instead of a bucket, so a hostile rank cannot make
/// the bucket table huge (published vocabularies have a few hundred thousand ranks).
const MAX_BUCKET_RANK: u64 = 1 << 22;

/// Candidate pairs of a very long piece, bucketed by rank: a push is an append to a per-rank
/// list (the table of list heads is small enough to stay in cache), and ranks are taken in
/// increasing order, each bucket's positions sorted once. A heap over millions of pairs
/// instead costs a cache miss per level on every pop. Pairs pushed at or below the rank being
/// taken (SentencePiece scores share ranks; a vocabulary need not rank a merge above its
/// parts) go to a side heap, and every pop takes the smaller of the two fronts, so the order
/// is exactly (rank, position).
#[derive(Default)]
struct RankBuckets {
    /// Per rank, the last entry of its list in `arena`, or `NIL`.
    head: Vec<u32>,
    /// `(position, previous entry of the same rank)`.
    arena: Vec<(u32, u32)>,
    /// One bit per rank whose list is not empty.
    nonempty: Vec<u64>,
    /// The bucket being taken: its rank and sorted positions, and how many are popped.
    started: bool,
    rank: u64,
    cur: Vec<u32>,
    at: usize,
    side: QuadHeap,
}

impl RankBuckets {
    /// The lowest rank at or above `from` with a non-empty list.
    fn next_rank(&self, from: usize) -> Option<usize> {
        let mut w = from / 64;
        if w >= self.nonempty.len() {
            return None;
        }
        let mut bits = self.nonempty[w] & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            bits = *self.nonempty.get(w)?;
        }
    }

    /// Makes bucket `r` the current one.
    fn take(&mut self, r: usize) {
        self.nonempty[r / 64] &= !(1u64 << (r % 64));
        self.cur.clear();
        self.at = 0;
        let mut e = self.head[r];
        while e != NIL {
            let (pos, prev) = self.arena[e as usize];
            self.cur.push(pos);
            e = prev;
        }
        self.head[r] = NIL;
        self.cur.sort_unstable();
        self.rank = r as u64;
        self.started = true;
    }
}

impl PairQueue for RankBuckets {
    fn clear(&mut self) {
        // Every list is emptied as it is taken; a piece always runs its queue dry.
        for r in 0..self.head.len() {
            if self.nonempty[r / 64] & (1u64 << (r % 64)) != 0 {
                self.head[r] = NIL;
            }
        }
        self.nonempty.iter_mut().for_each(|w| *w = 0);
        self.arena.clear();
        self.cur.clear();
        self.side.0.clear();
        (self.started, self.rank, self.at) = (false, 0, 0);
    }

    fn push(&mut self, key: u64) {
        let rank = key >> 32;
        if rank > MAX_BUCKET_RANK || (self.started && rank <= self.rank) {
            self.side.push(key);
            return;
        }
        let r = rank as usize;
        if r >= self.head.len() {
            self.head.resize(r + 1, NIL);
            self.nonempty.resize(r / 64 + 1, 0);
        }
        self.arena.push((key as u32, self.head[r]));
        self.head[r] = (self.arena.len() - 1) as u32;
        self.nonempty[r / 64] |= 1u64 << (r % 64);
    }

    fn ready(&mut self) {
        self.side.heapify();
    }

    fn pop(&mut self) -> Option<u64> {
        loop {
            let side = self.side.0.first().copied();
            if let Some(&pos) = self.cur.get(self.at) {
                let key = (self.rank << 32) | pos as u64;
                if side.is_some_and(|s| s < key) {
                    return self.side.pop();
                }
                self.at += 1;
                return Some(key);
            }
            // The current bucket is done: the side heap's front or the next bucket, whichever
            // ranks lower (buckets hold only ranks above the current one).
            let from = if self.started { self.rank as usize + 1 } else { 0 };
            match (side, self.next_rank(from)) {
                (Some(s), Some(r)) if (s >> 32) < r as u64 => return self.side.pop(),
                (Some(_), None) => return self.side.pop(),
                (_, Some(r)) => self.take(r),
                (None, None) => return None,
            }
        }
    }
}

/// A min-heap of `u64` keys with four children per node: half the depth of a binary heap, and
/// the four children of a node share one cache line, so a pop on a heap far larger than the
/// cache costs about half the misses.
#[derive(Default)]
struct QuadHeap(Vec<u64>);

impl QuadHeap {
    /// Orders the keys already in the vector into a heap, in O(n).
    fn heapify(&mut self) {
        let n = self.0.len();
        if n > 1 {
            for i in (0..=(n - 2) / 4).rev() {
                self.sift_down(i);
            }
        }
    }

    fn push(&mut self, key: u64) {
        let h = &mut self.0;
        let mut i = h.len();
        h.push(key);
        while i > 0 {
            let parent = (i - 1) / 4;
            if h[parent] <= key {
                break;
            }
            h[i] = h[parent];
            i = parent;
        }
        h[i] = key;
    }

    fn pop(&mut self) -> Option<u64> {
        let last = self.0.pop()?;
        if self.0.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.0[0], last);
        self.sift_down(0);
        Some(top)
    }

    fn sift_down(&mut self, mut i: usize) {
        let h = &mut self.0;
        let n = h.len();
        let key = h[i];
        loop {
            let first = 4 * i + 1;
            if first >= n {
                break;
            }
            let mut best = first;
            for c in first + 1..(first + 4).min(n) {
                if h[c] < h[best] {
                    best = c;
                }
            }
            if h[best] >= key {
                break;
            }
            h[i] = h[best];
            i = best;
        }
        h[i] = key;
    }
}

/// One part of a piece during [`merge_parts`]: its byte range and token, its neighbours, and
/// the pair it starts with its right neighbour. 32 bytes, two to a cache line.
#[derive(Clone, Copy)]
struct Part {
    start: u32,
    end: u32,
    prev: u32,
    next: u32,
    id: u32,
    /// Rank of the pair (this part, next part), or `NO_PAIR`.
    rank: u32,
    /// The token that pair merges into.
    merged: u32,
    /// `MERGEABLE` and `DEAD` bits.
    flags: u32,
}

const NIL: u32 = u32::MAX;
const NO_PAIR: u32 = u32::MAX;
const MERGEABLE: u32 = 1;
const DEAD: u32 = 2;

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
    // Parts index and cover the piece with u32s; a longer piece (over 4 GiB) takes the wide heap.
    if piece.len() < NIL as usize && init.len() < NIL as usize {
        merge_parts(piece, init, rule, scratch, out);
    } else {
        merge_heap(piece, init, rule, scratch, out);
    }
}

/// Heap-ordered merging over compact parts (see the module comment): O(n log n), the same
/// merge order as [`merge_heap`] and [`merge_small`].
pub fn merge_parts<R: PairRule + ?Sized>(piece: &[u8], init: &[Sym], rule: &R, scratch: &mut Scratch, out: &mut Vec<u32>) {
    let n = init.len();
    let parts = &mut scratch.parts;
    parts.clear();
    parts.extend(init.iter().enumerate().map(|(i, s)| Part {
        start: s.start as u32,
        end: s.end as u32,
        prev: if i == 0 { NIL } else { i as u32 - 1 },
        next: if i + 1 == n { NIL } else { i as u32 + 1 },
        id: s.id,
        rank: NO_PAIR,
        merged: 0,
        flags: if s.mergeable { MERGEABLE } else { 0 },
    }));
    // The bucket lists index their entries (at most three per part) with u32s.
    if n >= BUCKETS_FROM && n < (NIL / 4) as usize {
        merge_parts_with(piece, rule, &mut scratch.parts, &mut scratch.buckets, out);
    } else {
        merge_parts_with(piece, rule, &mut scratch.parts, &mut scratch.keys, out);
    }
}

fn merge_parts_with<R: PairRule + ?Sized, Q: PairQueue>(piece: &[u8], rule: &R, parts: &mut [Part], heap: &mut Q, out: &mut Vec<u32>) {
    let n = parts.len();
    // The rank and merged id of the pair starting at part `l` (its right neighbour is alive).
    let pair_at = |parts: &[Part], l: usize| -> Option<(u32, u32)> {
        let a = &parts[l];
        let b = &parts[a.next as usize];
        if a.flags & b.flags & MERGEABLE == 0 {
            return None;
        }
        let sym = |p: &Part| Sym { start: p.start as usize, end: p.end as usize, id: p.id, mergeable: true };
        rule.pair(piece, &sym(a), &sym(b))
    };
    heap.clear();
    for l in 0..n - 1 {
        if let Some((rank, id)) = pair_at(parts, l) {
            parts[l].rank = rank;
            parts[l].merged = id;
            heap.push(((rank as u64) << 32) | l as u64);
        }
    }
    heap.ready();
    while let Some(key) = heap.pop() {
        let (rank, l) = ((key >> 32) as u32, (key & 0xFFFF_FFFF) as usize);
        let p = parts[l];
        if p.flags & DEAD != 0 || p.rank != rank {
            continue; // stale: the part merged away, or its pair changed
        }
        let r = p.next as usize;
        let (after, r_end) = (parts[r].next, parts[r].end);
        parts[r].flags |= DEAD;
        let left = &mut parts[l];
        left.end = r_end;
        left.id = p.merged;
        left.next = after;
        left.rank = NO_PAIR;
        if after != NIL {
            parts[after as usize].prev = l as u32;
            if let Some((rank, id)) = pair_at(parts, l) {
                parts[l].rank = rank;
                parts[l].merged = id;
                heap.push(((rank as u64) << 32) | l as u64);
            }
        }
        let before = p.prev;
        if before != NIL {
            let b = before as usize;
            match pair_at(parts, b) {
                Some((rank, id)) => {
                    parts[b].rank = rank;
                    parts[b].merged = id;
                    heap.push(((rank as u64) << 32) | before as u64);
                }
                None => parts[b].rank = NO_PAIR,
            }
        }
    }
    let mut i = 0u32;
    while i != NIL {
        out.push(parts[i as usize].id);
        i = parts[i as usize].next;
    }
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
            let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
            merge_heap(&s, &init, &t, &mut Scratch::default(), &mut a);
            merge_parts(&s, &init, &t, &mut Scratch::default(), &mut c);
            assert_eq!(a, c, "{:?}", String::from_utf8_lossy(&s));
            if init.len() <= SMALL {
                merge_small(&s, &init, &t, &mut b);
                assert_eq!(a, b, "{:?}", String::from_utf8_lossy(&s));
            }
        }
    }

    /// A rule whose ranks are `id / div`: `div` pairs share each rank (as SentencePiece scores
    /// can), so only the position breaks ties.
    struct SharedRanks(TokenTable, u32);

    impl PairRule for SharedRanks {
        fn pair(&self, piece: &[u8], l: &Sym, r: &Sym) -> Option<(u32, u32)> {
            let id = self.0.find(&piece[l.start..r.end])?;
            Some((id / self.1, id))
        }
    }

    fn shared_ranks(div: u32) -> SharedRanks {
        let toks: [&[u8]; 16] = [b"a", b"b", b"c", b"ab", b"bc", b"ca", b"aa", b"abc", b"bca", b"aaa", b"cab", b"abca", b"bb", b"cc", b"aab", b"bcc"];
        SharedRanks(table(&toks), div)
    }

    /// The compact-part merge against the wide heap on long pieces, with ranks shared by
    /// several pairs (as SentencePiece scores are), where only the position breaks ties.
    #[test]
    fn parts_and_heap_merges_agree_on_long_pieces() {
        let t = shared_ranks(4);
        let mut seed = 777u64;
        for round in 0..3000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = 17 + (seed >> 55) as usize; // 17..=528
            let mut x = seed;
            let s: Vec<u8> = (0..len).map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                b"abc"[(x >> 62) as usize % 3]
            }).collect();
            let init: Vec<Sym> = (0..len).map(|i| Sym { start: i, end: i + 1, id: t.0.find(&s[i..i + 1]).must(), mergeable: round % 2 == 0 || (i * 7 + round) % 13 != 0 }).collect();
            let (mut a, mut c) = (Vec::new(), Vec::new());
            merge_heap(&s, &init, &t, &mut Scratch::default(), &mut a);
            merge_parts(&s, &init, &t, &mut Scratch::default(), &mut c);
            assert_eq!(a, c, "{:?}", String::from_utf8_lossy(&s));
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

    /// The four-way heap pops keys in sorted order whatever the mix of heapify and pushes.
    #[test]
    fn quad_heap_sorts() {
        let mut seed = 5u64;
        for n in [0usize, 1, 2, 3, 4, 5, 17, 100, 1000] {
            let mut h = QuadHeap::default();
            let mut all = Vec::new();
            for _ in 0..n {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                h.0.push(seed >> 40);
                all.push(seed >> 40);
            }
            h.heapify();
            for _ in 0..n / 2 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                h.push(seed >> 40);
                all.push(seed >> 40);
            }
            all.sort_unstable();
            let got: Vec<u64> = std::iter::from_fn(|| h.pop()).collect();
            assert_eq!(got, all);
        }
    }

    /// The rank buckets are an exact priority queue whatever is pushed between pops: ranks
    /// below or equal to the one being taken, equal keys, ranks beyond the bucket table.
    #[test]
    fn rank_buckets_pop_in_key_order() {
        let mut seed = 31u64;
        let mut next = move |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut q = RankBuckets::default();
        for round in 0..200 {
            q.clear();
            let mut model = BinaryHeap::new();
            let key = |next: &mut dyn FnMut(u64) -> u64| {
                let rank = if next(50) == 0 { MAX_BUCKET_RANK + next(5) } else { next(if round % 2 == 0 { 40 } else { 5000 }) };
                (rank << 32) | next(300)
            };
            for _ in 0..next(400) {
                let k = key(&mut next);
                q.push(k);
                model.push(Reverse(k));
            }
            q.ready();
            loop {
                for _ in 0..next(3) {
                    let k = key(&mut next);
                    q.push(k);
                    model.push(Reverse(k));
                }
                let want = model.pop().map(|Reverse(k)| k);
                assert_eq!(q.pop(), want, "round {round}");
                if want.is_none() {
                    break;
                }
                if next(4) == 0 && model.len() > 600 {
                    while let Some(Reverse(k)) = model.pop() {
                        assert_eq!(q.pop(), Some(k));
                    }
                }
            }
        }
    }

    /// Pieces long enough for the rank buckets merge exactly as with the wide heap.
    #[test]
    fn bucketed_merges_agree_on_very_long_pieces() {
        let t = shared_ranks(3);
        let mut x = 4242u64;
        for round in 0..6 {
            let len = BUCKETS_FROM + round * 3001;
            let s: Vec<u8> = (0..len).map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                b"abc"[(x >> 62) as usize % 3]
            }).collect();
            let init: Vec<Sym> = (0..len).map(|i| Sym { start: i, end: i + 1, id: t.0.find(&s[i..i + 1]).must(), mergeable: round < 3 || i % 97 != 0 }).collect();
            let (mut a, mut c) = (Vec::new(), Vec::new());
            let mut scratch = Scratch::default();
            merge_heap(&s, &init, &t, &mut scratch, &mut a);
            merge_parts(&s, &init, &t, &mut scratch, &mut c);
            assert_eq!(a, c, "round {round}");
        }
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
