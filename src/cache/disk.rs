//! The disk's own read bandwidth at the record size: the bound a streamed model cannot beat
//! (decode tok/s ≤ bandwidth ÷ bytes read per token). Reads a file with the same aligned
//! `O_DIRECT` reads the cache makes, several in flight.

use super::io::{BankFile, IoPool, ReadKind, Request};
use crate::error::{Error, Result};
use crate::sys::SlotArena;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// What `bench disk` measured.
#[derive(Clone, Debug)]
pub struct DiskReport {
    /// Bytes read in all.
    pub bytes: u64,
    /// Wall-clock seconds the reads took.
    pub seconds: f64,
    /// Bytes of each read (one expert record's size).
    pub record_bytes: usize,
    /// Threads reading at once.
    pub threads: usize,
    /// Whether `O_DIRECT` was in use (else buffered reads with pages dropped after each).
    pub direct: bool,
}

impl DiskReport {
    /// Read speed in GB/s (10^9 bytes per second); 0 when no time passed.
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9) / 1e9
    }
}

/// Reads up to `limit` bytes as `record`-byte reads (a multiple of 4096) at record-aligned
/// offsets in a scattered order, on `threads` threads. `path` is one file, or a container
/// directory, whose banks are then read together at their own record size (`record` ignored),
/// as the engine reads them.
pub fn bench_disk(path: &Path, record: usize, threads: usize, limit: u64) -> Result<DiskReport> {
    if crate::format::container::is_container(path) {
        return bench_container(path, threads, limit);
    }
    let files = vec![BankFile::open(path.to_path_buf())?];
    if record == 0 || !record.is_multiple_of(4096) {
        return Err(Error::arg(format!("record size {record} is not a positive multiple of 4096")));
    }
    // Records are numbered file after file.
    let mut per_file = Vec::with_capacity(files.len());
    for f in &files {
        let size = f.file_size()?;
        per_file.push((size / record as u64) as usize);
    }
    let total: usize = per_file.iter().sum();
    let records = total.min((limit / record as u64) as usize);
    if records == 0 {
        return Err(Error::arg(format!("{}: smaller than one {record}-byte record", path.display())));
    }
    let locate = |mut r: usize| -> (usize, usize) {
        for (i, &n) in per_file.iter().enumerate() {
            if r < n {
                return (i, r);
            }
            r -= n;
        }
        (0, 0)
    };
    // A deterministic order like decoding's: groups of `GROUP` (a token's top-k) scattered
    // records of one bank, the banks in turn; within a single file, a stride coprime with the
    // count. (Host-side readahead and caching favour nearby records, so the order matters.)
    let stride = (1..).map(|k| total / 3 + k).find(|s| gcd(*s, total) == 1).unwrap_or(1);
    let nfiles = files.len();
    // Decoding's order: per group, GROUP distinct pseudo-random records of one bank in
    // ascending order (the router's choice, sorted as the cache submits misses).
    let order = |i: usize| -> (usize, usize) {
        if nfiles == 1 {
            return locate((i * stride) % total);
        }
        let (group, j) = (i / GROUP, i % GROUP);
        let f = group % nfiles;
        let n = per_file[f].max(1);
        let mut picks = [0usize; GROUP];
        let mut h = (group as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut k = 0;
        while k < GROUP.min(n) {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            let r = (h % n as u64) as usize;
            if !picks[..k].contains(&r) {
                picks[k] = r;
                k += 1;
            }
        }
        picks[..k].sort_unstable();
        (f, picks[j % k.max(1)])
    };
    // Read as the cache does: a group's reads are submitted together to the I/O threads and
    // all awaited before the next group, buffers travelling with their requests.
    let threads = threads.max(1);
    let files: Arc<Vec<Option<BankFile>>> = Arc::new(files.into_iter().map(Some).collect());
    let pool = IoPool::new(threads, Arc::clone(&files), GROUP)?;
    let mut bufs = Vec::with_capacity(GROUP);
    bufs.extend(SlotArena::slots(record, GROUP, true)?);
    let start = Instant::now();
    let mut i = 0;
    while i < records {
        let group = GROUP.min(records - i);
        for _ in 0..group {
            let (f, r) = order(i);
            let buf = bufs.pop().ok_or_else(|| Error::new(crate::ErrorKind::Io, "read buffer lost"))?;
            pool.submit(Request::record(ReadKind::Miss, f, r, 0, record, buf));
            i += 1;
        }
        let mut first_error = None;
        for _ in 0..group {
            let c = pool.wait()?;
            bufs.push(c.buf);
            if let Err(e) = c.result {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // After the reads: a filesystem may refuse direct reads that its open accepted.
    let direct = files.iter().flatten().all(BankFile::is_direct);
    Ok(DiskReport { bytes: (records * record) as u64, seconds, record_bytes: record, threads, direct })
}

/// A container's banks read through the engine's own expert cache (at its minimum size, so
/// nearly every lookup misses) with no computation: per MoE layer in turn, the top-k of a
/// pseudo-random routing, sorted — the decode pattern. This is the read rate a streamed
/// decode cannot exceed on this machine.
fn bench_container(path: &Path, threads: usize, limit: u64) -> Result<DiskReport> {
    use crate::format::container::Manifest;
    let m = Manifest::open(path)?;
    let moe = m.config.moe.as_ref().ok_or_else(|| Error::arg(format!("{}: the model has no experts", path.display())))?;
    let opts = super::CacheOptions { bytes: super::min_cache_bytes(&m), io_threads: threads.max(1), verify: false, policy: None, direct_io: true, purgeable: false, huge_pages: true };
    let mut cache = super::ExpertCache::open(&m, &opts)?;
    let (k, e) = (moe.top_k, moe.experts);
    let mut h = 0x9E37_79B9_7F4A_7C15u64;
    let mut wanted = Vec::with_capacity(k);
    let start = Instant::now();
    let mut group = 0usize;
    while cache.stats().bytes_read < limit {
        let layer = m.banks[group % m.banks.len()].layer;
        wanted.clear();
        while wanted.len() < k {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            let x = (h % e as u64) as u32;
            if !wanted.contains(&x) {
                wanted.push(x);
            }
        }
        wanted.sort_unstable();
        cache.with_records(layer, &wanted, &[], &mut |_, _| {})?;
        group += 1;
    }
    let s = cache.stats();
    Ok(DiskReport { bytes: s.bytes_read, seconds: start.elapsed().as_secs_f64(), record_bytes: m.max_record_bytes(), threads, direct: s.direct_io })
}

/// Records read together from one bank in the container order (a decode step's top-k).
const GROUP: usize = 8;

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}
