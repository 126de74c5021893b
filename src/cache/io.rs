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
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A bank file opened for reading records.
pub struct BankFile {
    pub path: PathBuf,
    pub file: File,
    /// `O_DIRECT` in use (otherwise pages are dropped after each read).
    pub direct: bool,
}

impl BankFile {
    pub fn open(path: PathBuf) -> Result<BankFile> {
        let (file, direct) = sys::open_direct(&path)?;
        Ok(BankFile { path, file, direct })
    }

    /// Reads `buf.len()` bytes at `offset` (aligned when direct).
    pub fn read_record(&self, buf: &mut [u8], offset: u64, layer: usize, expert: usize) -> Result<()> {
        sys::read_exact_at(&self.file, &self.path, buf, offset)
            .map_err(|e| e.context(format!("layer {layer} expert {expert}")))?;
        if !self.direct {
            sys::drop_cached_pages(&self.file, offset, buf.len() as u64);
        }
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
            let Ok(guard) = rx.lock() else { return };
            match guard.recv() {
                Ok(r) => r,
                Err(_) => return, // the pool is shutting down
            }
        };
        let Request { layer, expert, slot, offset, len, mut buf } = req;
        let result = match banks.get(layer).and_then(Option::as_ref) {
            Some(bank) => bank.read_record(&mut buf.as_mut_slice()[..len], offset, layer, expert),
            None => Err(Error::new(crate::ErrorKind::Tensor, format!("layer {layer} has no expert bank"))),
        };
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
