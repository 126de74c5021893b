//! Reading expert records: one aligned `pread` per record into a 4096-aligned slot buffer,
//! either on the calling thread or on I/O threads that overlap reads with computation.
//!
//! A buffer travels with its request and comes back with its completion, so a slot's bytes
//! are only ever owned by one thread and no unsafe sharing is needed.

use crate::error::{Error, Result};
use crate::sys::{self, Slot};
use std::fs::File;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// A bank file opened for reading records: with `O_DIRECT` where the filesystem takes it, else
/// buffered reads whose pages are dropped after each (`POSIX_FADV_DONTNEED`).
///
/// Some filesystems accept `O_DIRECT` at open and refuse the reads themselves with `EINVAL`;
/// the first such refusal switches the bank to buffered reads for good (the read is retried
/// that way), and [`BankFile::is_direct`] reports it.
pub struct BankFile {
    pub path: PathBuf,
    /// The `O_DIRECT` descriptor, when open accepted it and direct reads were wanted.
    direct: Option<File>,
    /// The buffered descriptor: opened at once when there is no direct one, else on the first
    /// refused read.
    buffered: OnceLock<File>,
    /// A direct read was refused: this bank reads buffered from now on.
    refused: AtomicBool,
}

/// The name of a read mode, as `info` and the statistics report it.
pub fn io_mode_name(direct: bool) -> &'static str {
    if direct { "O_DIRECT" } else { "buffered+fadvise" }
}

impl BankFile {
    /// Opens with `O_DIRECT` where accepted.
    pub fn open(path: PathBuf) -> Result<BankFile> {
        BankFile::open_with(path, true)
    }

    /// Opens for direct reads when `direct` and the filesystem accepts them at open, else for
    /// the buffered fallback.
    pub fn open_with(path: PathBuf, direct: bool) -> Result<BankFile> {
        let buffered = OnceLock::new();
        let direct = if direct {
            let (file, is_direct) = sys::open_direct(&path)?;
            if is_direct {
                Some(file)
            } else {
                let _ = buffered.set(file);
                None
            }
        } else {
            let _ = buffered.set(File::open(&path).map_err(|e| Error::io(&path, "open", e))?);
            None
        };
        Ok(BankFile { path, direct, buffered, refused: AtomicBool::new(false) })
    }

    /// True while reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some() && !self.refused.load(Ordering::Relaxed)
    }

    /// Size of the file in bytes.
    pub fn file_size(&self) -> Result<u64> {
        let f = match &self.direct {
            Some(f) => f,
            None => self.buffered()?,
        };
        Ok(f.metadata().map_err(|e| Error::io(&self.path, "stat", e))?.len())
    }

    fn buffered(&self) -> Result<&File> {
        if let Some(f) = self.buffered.get() {
            return Ok(f);
        }
        // Two threads may both get here; one descriptor is kept, the other closed.
        let f = File::open(&self.path).map_err(|e| Error::io(&self.path, "open (buffered, O_DIRECT reads refused)", e))?;
        let _ = self.buffered.set(f);
        self.buffered.get().ok_or_else(|| Error::new(crate::ErrorKind::Io, format!("{}: no descriptor", self.path.display())))
    }

    /// Reads `buf.len()` bytes at `offset` (aligned when direct).
    pub fn read_record(&self, buf: &mut [u8], offset: u64, layer: usize, expert: usize) -> Result<()> {
        let what = || format!("layer {layer} expert {expert}");
        if let Some(f) = self.direct.as_ref().filter(|_| !self.refused.load(Ordering::Relaxed)) {
            use std::os::unix::fs::FileExt;
            match f.read_exact_at(buf, offset) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.refused.store(true, Ordering::Relaxed),
                Err(e) => return Err(Error::io(&self.path, &format!("read {} bytes at offset {offset}", buf.len()), e).context(what())),
            }
        }
        let f = self.buffered()?;
        sys::read_exact_at(f, &self.path, buf, offset).map_err(|e| e.context(what()))?;
        sys::drop_cached_pages(f, offset, buf.len() as u64);
        Ok(())
    }
}

/// A read to perform: record `expert` of `layer`'s bank into `buf` (for slot `slot`).
pub struct Request {
    pub layer: usize,
    pub expert: usize,
    pub slot: usize,
    pub offset: u64,
    pub len: usize,
    pub buf: Slot,
}

/// A finished read: the buffer comes back whatever happened.
pub struct Completion {
    pub layer: usize,
    pub expert: usize,
    pub slot: usize,
    pub buf: Slot,
    pub result: Result<()>,
}

/// I/O threads reading records for the cache.
pub struct IoPool {
    requests: Option<Sender<Request>>,
    completions: Receiver<Completion>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl IoPool {
    /// Starts `threads` readers over `banks` (indexed by layer).
    pub fn new(threads: usize, banks: Arc<Vec<Option<BankFile>>>) -> Result<IoPool> {
        let (req_tx, req_rx) = channel::<Request>();
        let (done_tx, done_rx) = channel::<Completion>();
        let req_rx = Arc::new(Mutex::new(req_rx));
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let (rx, tx, banks) = (Arc::clone(&req_rx), done_tx.clone(), Arc::clone(&banks));
            let h = std::thread::Builder::new()
                .name(format!("waste-io-{i}"))
                .spawn(move || io_loop(&rx, &tx, &banks))
                .map_err(|e| Error::new(crate::ErrorKind::Io, format!("cannot start I/O thread: {e}")))?;
            workers.push(h);
        }
        Ok(IoPool { requests: Some(req_tx), completions: done_rx, workers })
    }

    /// Queues a read.
    pub fn submit(&self, r: Request) -> Result<()> {
        let tx = self.requests.as_ref().ok_or_else(|| Error::new(crate::ErrorKind::Io, "I/O threads stopped"))?;
        tx.send(r).map_err(|_| Error::new(crate::ErrorKind::Io, "I/O threads stopped"))
    }

    /// Waits for the next finished read.
    pub fn wait(&self) -> Result<Completion> {
        self.completions.recv().map_err(|_| Error::new(crate::ErrorKind::Io, "I/O threads stopped"))
    }
}

fn io_loop(rx: &Mutex<Receiver<Request>>, tx: &Sender<Completion>, banks: &[Option<BankFile>]) {
    loop {
        let req = {
            // A poisoned lock only means another reader panicked while waiting; the queue is intact.
        let guard = rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match guard.recv() {
                Ok(r) => r,
                Err(_) => return, // the pool is shutting down
            }
        };
        let Request { layer, expert, slot, offset, len, mut buf } = req;
        // A panic here (a bug: a request longer than its buffer, say) must not lose the
        // completion, or the caller would wait for it for ever: it becomes this read's error,
        // and the buffer goes back with it.
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match banks.get(layer).and_then(Option::as_ref) {
            Some(bank) => bank.read_record(&mut buf.as_mut_slice()[..len], offset, layer, expert),
            None => Err(Error::new(crate::ErrorKind::Tensor, format!("layer {layer} has no expert bank"))),
        }));
        let result = read.unwrap_or_else(|payload| {
            let why = payload.downcast_ref::<&str>().map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_string());
            Err(Error::new(crate::ErrorKind::Io, format!(
                "the I/O thread reading layer {layer} expert {expert} ({len} bytes at offset {offset}) panicked: {why}")))
        });
        if tx.send(Completion { layer, expert, slot, buf, result }).is_err() {
            return;
        }
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.requests = None; // closes the channel: workers finish their read and exit
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Times a blocking wait, adding it to `total`.
pub fn timed<T>(total: &mut std::time::Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let v = f();
    *total += t.elapsed();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    /// A reader that panics (here: a request longer than its buffer, a bug) hands the caller an
    /// error naming the read, with the buffer back, instead of leaving it waiting for ever; the
    /// other readers, and the panicking one's thread, keep serving.
    #[test]
    fn a_panicking_io_thread_is_an_error_not_a_hang() {
        let path = std::env::temp_dir().join(format!("waste-io-panic-{}.bin", std::process::id()));
        let data: Vec<u8> = (0..2 * 4096u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).must();
        let banks = Arc::new(vec![Some(BankFile::open_with(path.clone(), false).must())]);
        let pool = IoPool::new(2, banks).must();
        let mut slots = crate::sys::SlotArena::slots(4096, 2).must();
        let (b1, b0) = (slots.pop().must(), slots.pop().must());
        // 8192 bytes into a 4096-byte slot: the slice index panics inside the reader.
        pool.submit(Request { layer: 0, expert: 3, slot: 0, offset: 0, len: 8192, buf: b0 }).must();
        let done = pool.wait().must();
        let err = done.result.expect_err("an oversized read succeeded");
        assert_eq!((done.layer, done.expert, done.slot, done.buf.as_slice().len()), (0, 3, 0, 4096));
        let msg = err.to_string();
        assert!(msg.contains("panicked") && msg.contains("layer 0 expert 3"), "{msg}");
        // The pool still reads.
        pool.submit(Request { layer: 0, expert: 1, slot: 1, offset: 4096, len: 4096, buf: b1 }).must();
        pool.submit(Request { layer: 0, expert: 0, slot: 0, offset: 0, len: 4096, buf: done.buf }).must();
        for _ in 0..2 {
            let c = pool.wait().must();
            c.result.must();
            let at = c.expert * 4096;
            assert_eq!(&c.buf.as_slice()[..4096], &data[at..at + 4096]);
        }
        drop(pool);
        let _ = std::fs::remove_file(&path);
    }

    /// A direct read the filesystem refuses with EINVAL (here: an offset that is not a
    /// multiple of the logical block size, which every `O_DIRECT` filesystem refuses) switches
    /// the bank to buffered reads, which return the same bytes; other read errors are errors.
    #[test]
    fn a_refused_direct_read_falls_back_to_buffered() {
        let path = std::env::temp_dir().join(format!("waste-io-fallback-{}.bin", std::process::id()));
        let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i * 7 + i / 4096) as u8).collect();
        std::fs::write(&path, &data).must();
        let bank = BankFile::open(path.clone()).must();
        if !bank.is_direct() {
            println!("SKIP: io fallback: {} refuses O_DIRECT at open (the open-time fallback is in use)", path.display());
            let _ = std::fs::remove_file(&path);
            return;
        }
        let mut buf = crate::sys::AlignedBuf::zeroed(4096 + 4096, 4096).must();
        // Aligned: a direct read.
        bank.read_record(&mut buf.as_mut_slice()[..4096], 4096, 0, 1).must();
        assert_eq!(&buf.as_slice()[..4096], &data[4096..8192]);
        assert!(bank.is_direct());
        // Past the end: an error (not EINVAL), and the bank stays direct.
        assert!(bank.read_record(&mut buf.as_mut_slice()[..4096], 3 * 4096, 0, 3).is_err());
        assert!(bank.is_direct());
        // At an offset one byte past a block: refused by the filesystem, then served buffered.
        bank.read_record(&mut buf.as_mut_slice()[..4096], 4097, 0, 2).must();
        assert_eq!(&buf.as_slice()[..4096], &data[4097..8193]);
        assert!(!bank.is_direct(), "the bank did not switch to buffered reads");
        // And later reads, aligned or not, keep working buffered.
        bank.read_record(&mut buf.as_mut_slice()[..4096], 0, 0, 0).must();
        assert_eq!(&buf.as_slice()[..4096], &data[..4096]);
        let _ = std::fs::remove_file(&path);
    }
}
