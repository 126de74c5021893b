//! The disk's own read bandwidth at the record size: the bound a streamed model cannot beat
//! (decode tok/s ≤ bandwidth ÷ bytes read per token). Reads a file with the same aligned
//! `O_DIRECT` reads the cache makes, several in flight.

use super::io::BankFile;
use crate::error::{Error, Result};
use crate::sys::AlignedBuf;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What `bench disk` measured.
#[derive(Clone, Debug)]
pub struct DiskReport {
    pub bytes: u64,
    pub seconds: f64,
    pub record_bytes: usize,
    pub threads: usize,
    /// Whether `O_DIRECT` was in use (else buffered reads with pages dropped after each).
    pub direct: bool,
}

impl DiskReport {
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9) / 1e9
    }
}

/// Reads up to `limit` bytes of `path` as `record`-byte reads (a multiple of 4096) at
/// record-aligned offsets in a scattered order, on `threads` threads.
pub fn bench_disk(path: &Path, record: usize, threads: usize, limit: u64) -> Result<DiskReport> {
    if record == 0 || record % 4096 != 0 {
        return Err(Error::arg(format!("record size {record} is not a positive multiple of 4096")));
    }
    let bank = BankFile::open(path.to_path_buf())?;
    let size = bank.file.metadata().map_err(|e| Error::io(path, "stat", e))?.len();
    let records = (size.min(limit) / record as u64) as usize;
    if records == 0 {
        return Err(Error::arg(format!("{}: smaller than one {record}-byte record", path.display())));
    }
    // A scattered but deterministic order (a stride coprime with the count), like expert reads.
    let stride = (1..).map(|k| records / 3 + k).find(|s| gcd(*s, records) == 1).unwrap_or(1);
    let next = AtomicU64::new(0);
    let threads = threads.max(1);
    let start = Instant::now();
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(|| -> Result<()> {
            let mut buf = AlignedBuf::zeroed(record, 4096)?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= records {
                    return Ok(());
                }
                let r = (i * stride) % records;
                bank.read_record(buf.as_mut_slice(), (r * record) as u64, 0, r)?;
            }
        })).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::new(crate::ErrorKind::Io, "reader thread panicked")))).collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(DiskReport { bytes: (records * record) as u64, seconds, record_bytes: record, threads, direct: bank.direct })
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}
