//! Reading expert records: one aligned `pread` per record into a 4096-aligned slot buffer,
//! either on the calling thread or on I/O threads that overlap reads with computation.
//!
//! A buffer travels with its request and comes back with its completion, so a slot's bytes
//! are only ever owned by one thread and no unsafe sharing is needed.

use crate::error::{Error, Result};
use crate::sys::{self, Slot};
use std::fs::File;
use std::path::PathBuf;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

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
    pub kind: ReadKind,
    pub layer: usize,
    pub expert: usize,
    pub slot: usize,
    pub offset: u64,
    pub len: usize,
    pub buf: Slot,
}

/// Why a record is read, most urgent first: the readers take the queued read of the most
/// urgent kind, and within a kind the one of the nearest layer (in a decode step, every read
/// still queued is for the layer being computed or a later one of the same token, so lower
/// layers are needed sooner — and a look-ahead left over from the previous token, for a
/// high layer, waits behind this token's reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReadKind {
    /// The layer being computed waits for it.
    Miss,
    /// The router look-ahead's guess for a later layer.
    Ahead,
    /// The learned hotlist's warm start: only free slots, only while nothing else waits.
    Preload,
}

impl Request {
    /// A read of record `expert` of `layer`'s bank (`record_bytes` each, back to back) into
    /// `buf`, for slot `slot`.
    pub fn record(kind: ReadKind, layer: usize, expert: usize, slot: usize, record_bytes: usize, buf: Slot) -> Request {
        Request { kind, layer, expert, slot, offset: (expert * record_bytes) as u64, len: record_bytes, buf }
    }

    /// The order the readers serve queued reads in (least first; ties oldest first).
    fn order(&self) -> (ReadKind, usize) {
        (self.kind, self.layer)
    }
}

/// A finished read: the buffer comes back whatever happened.
pub struct Completion {
    pub kind: ReadKind,
    pub layer: usize,
    pub expert: usize,
    pub slot: usize,
    pub buf: Slot,
    pub result: Result<()>,
}

/// Queue bytes per read that can be in flight: one entry in each of the pool's two queues,
/// allocated when the pool starts.
pub const QUEUE_BYTES_PER_READ: usize = size_of::<Request>() + size_of::<Completion>();

/// A first-in first-out queue between threads, its storage allocated once: the pool never has
/// more reads outstanding than buffers, so a push never grows it, and a wait is a futex. (A
/// standard channel allocates and frees a block every few dozen messages and a context the
/// first time each thread waits: a long chat's heap felt the first as fragmentation.)
struct Queue<T> {
    state: Mutex<QueueState<T>>,
    ready: Condvar,
}

struct QueueState<T> {
    items: VecDeque<T>,
    /// Threads that may still push: once none is left and the queue is empty, a pop ends.
    writers: usize,
}

impl<T> Queue<T> {
    fn new(capacity: usize, writers: usize) -> Queue<T> {
        Queue { state: Mutex::new(QueueState { items: VecDeque::with_capacity(capacity), writers }), ready: Condvar::new() }
    }

    /// A poisoned lock only means a thread panicked while holding it; the queue is intact.
    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, item: T) {
        self.lock().items.push_back(item);
        self.ready.notify_one();
    }

    /// The oldest item, waiting for one; `None` once every writer is gone and nothing is left.
    fn pop(&self) -> Option<T> {
        let mut st = self.lock();
        loop {
            if let Some(item) = st.items.pop_front() {
                return Some(item);
            }
            if st.writers == 0 {
                return None;
            }
            st = self.ready.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The oldest of the items with the least `key`, waiting for one; `None` once every writer
    /// is gone and nothing is left.
    fn pop_least<K: Ord>(&self, key: impl Fn(&T) -> K) -> Option<T> {
        let mut st = self.lock();
        loop {
            let least = st.items.iter().enumerate().min_by_key(|&(i, item)| (key(item), i)).map(|(i, _)| i);
            if let Some(item) = least.and_then(|i| st.items.remove(i)) {
                return Some(item);
            }
            if st.writers == 0 {
                return None;
            }
            st = self.ready.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Removes and returns the oldest item that `pred` accepts, if any is still queued.
    fn take_first(&self, pred: impl Fn(&T) -> bool) -> Option<T> {
        let mut st = self.lock();
        let i = st.items.iter().position(pred)?;
        st.items.remove(i)
    }

    /// The oldest item if there is one, without waiting.
    fn try_pop(&self) -> Option<T> {
        self.lock().items.pop_front()
    }

    /// One writer is gone.
    fn close(&self) {
        let mut st = self.lock();
        st.writers = st.writers.saturating_sub(1);
        drop(st);
        self.ready.notify_all();
    }

    fn heap_bytes(&self) -> usize {
        self.lock().items.capacity() * size_of::<T>()
    }
}

/// Closes a queue for its writer when dropped, a panic included.
struct Closer<'a, T>(&'a Queue<T>);

impl<T> Drop for Closer<'_, T> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// When the disk had work: the time at least one read was under way on the I/O threads, and
/// the sum of every read's own duration (that sum over the busy time is the mean number of
/// reads in flight). A run's bytes over its busy time is the bandwidth the disk gave while it
/// had work, and the busy time over the run's time says how much of the run the disk was idle
/// (what `waste bench` reports as the disk bound it reached, measured in the same run).
#[derive(Default)]
struct DiskClock {
    state: Mutex<ClockState>,
}

#[derive(Default)]
struct ClockState {
    in_flight: usize,
    /// When `in_flight` last changed.
    since: Option<Instant>,
    busy: Duration,
    reading: Duration,
}

impl ClockState {
    /// Adds the time since the last change at the current number of reads in flight.
    fn advance(&mut self, now: Instant) {
        if let Some(t) = self.since {
            let dt = now.saturating_duration_since(t);
            if self.in_flight > 0 {
                self.busy += dt;
                self.reading += dt * self.in_flight as u32;
            }
        }
        self.since = Some(now);
    }

    fn read_started(&mut self, now: Instant) {
        self.advance(now);
        self.in_flight += 1;
    }

    fn read_ended(&mut self, now: Instant) {
        self.advance(now);
        self.in_flight = self.in_flight.saturating_sub(1);
    }
}

impl DiskClock {
    fn lock(&self) -> MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn read_started(&self) {
        self.lock().read_started(Instant::now());
    }

    fn read_ended(&self) {
        self.lock().read_ended(Instant::now());
    }

    /// (busy, reading) up to now.
    fn totals(&self) -> (Duration, Duration) {
        let mut st = self.lock();
        st.advance(Instant::now());
        (st.busy, st.reading)
    }
}

/// I/O threads reading records for the cache.
pub struct IoPool {
    /// Written by the pool alone (one writer, closed when the pool is dropped).
    requests: Arc<Queue<Request>>,
    /// Written by the readers: it ends when the last of them does.
    completions: Arc<Queue<Completion>>,
    clock: Arc<DiskClock>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl IoPool {
    /// Starts `threads` readers over `banks` (indexed by layer). `in_flight` is the most reads
    /// that can ever be outstanding — the number of buffers, since every request carries one:
    /// both queues are sized to it here ([`QUEUE_BYTES_PER_READ`] each), so queuing a read or
    /// its completion never allocates and never waits.
    pub fn new(threads: usize, banks: Arc<Vec<Option<BankFile>>>, in_flight: usize) -> Result<IoPool> {
        let requests = Arc::new(Queue::new(in_flight, 1));
        let completions = Arc::new(Queue::new(in_flight, threads));
        let mut pool = IoPool { requests, completions, clock: Arc::default(), workers: Vec::with_capacity(threads) };
        for i in 0..threads {
            let (rx, tx, banks) = (Arc::clone(&pool.requests), Arc::clone(&pool.completions), Arc::clone(&banks));
            let clock = Arc::clone(&pool.clock);
            match std::thread::Builder::new().name(format!("waste-io-{i}")).spawn(move || io_loop(&rx, &tx, &banks, &clock)) {
                Ok(h) => pool.workers.push(h),
                Err(e) => {
                    // The readers that did not start will never close their end; dropping the
                    // pool stops the ones that did.
                    for _ in i..threads {
                        pool.completions.close();
                    }
                    return Err(Error::new(crate::ErrorKind::Io, format!("cannot start I/O thread: {e}")));
                }
            }
        }
        Ok(pool)
    }

    /// Queues a read.
    pub fn submit(&self, r: Request) {
        self.requests.push(r);
    }

    /// Takes back a queued read that `pred` accepts and no reader has started, if any.
    pub fn take_queued(&self, pred: impl Fn(&Request) -> bool) -> Option<Request> {
        self.requests.take_first(pred)
    }

    /// Waits for the next finished read.
    pub fn wait(&self) -> Result<Completion> {
        self.completions.pop().ok_or_else(|| Error::new(crate::ErrorKind::Io, "I/O threads stopped"))
    }

    /// A finished read if one is waiting to be taken back, without waiting.
    pub fn try_wait(&self) -> Option<Completion> {
        self.completions.try_pop()
    }

    /// The time at least one read was under way, and the sum of the reads' durations, since
    /// the pool started (see [`DiskClock`]).
    pub fn disk_time(&self) -> (Duration, Duration) {
        self.clock.totals()
    }

    /// Bytes of the two queues.
    pub fn heap_bytes(&self) -> usize {
        self.requests.heap_bytes() + self.completions.heap_bytes()
    }
}

fn io_loop(requests: &Queue<Request>, completions: &Queue<Completion>, banks: &[Option<BankFile>], clock: &DiskClock) {
    let _closer = Closer(completions);
    while let Some(Request { kind, layer, expert, slot, offset, len, mut buf }) = requests.pop_least(Request::order) {
        clock.read_started();
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
        clock.read_ended();
        completions.push(Completion { kind, layer, expert, slot, buf, result });
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.requests.close(); // the readers finish their read and exit
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    /// Busy time counts each stretch with a read under way once, however many overlap; the
    /// reading time counts every read's own duration; an idle stretch counts in neither.
    #[test]
    fn the_disk_clock_counts_busy_stretches_once_and_reads_each() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut c = ClockState::default();
        c.read_started(at(0));
        c.read_started(at(10)); // two in flight from 10 to 30
        c.read_ended(at(30));
        c.read_ended(at(40));
        c.read_started(at(100)); // idle from 40 to 100
        c.read_ended(at(120));
        c.advance(at(200));
        assert_eq!((c.busy, c.reading), (Duration::from_millis(60), Duration::from_millis(80)));
    }

    /// The queue keeps its order and its storage; a pop waits for a push from another thread,
    /// and once the last writer is gone it drains what is left and then ends instead of
    /// waiting for ever (how `wait` learns that every reader has stopped).
    #[test]
    fn the_queue_keeps_order_and_ends_with_its_last_writer() {
        let q = Arc::new(Queue::<u32>::new(4, 2));
        let bytes = q.heap_bytes();
        for i in 0..4 {
            q.push(i);
        }
        assert_eq!((q.pop(), q.pop(), q.heap_bytes()), (Some(0), Some(1), bytes));
        let writer = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                let _closer = Closer(&*q);
                std::thread::sleep(std::time::Duration::from_millis(20));
                q.push(9);
            })
        };
        assert_eq!((q.pop(), q.pop(), q.pop()), (Some(2), Some(3), Some(9)));
        writer.join().must();
        q.close();
        assert_eq!((q.pop(), q.heap_bytes()), (None, bytes));
    }

    /// The readers take the most urgent kind first, then the nearest layer, then the oldest;
    /// a queued item can be taken back, and only one that matches.
    #[test]
    fn the_queue_serves_misses_then_near_layers_first_and_gives_back_what_is_asked() {
        let q = Queue::<(ReadKind, usize, u32)>::new(8, 1);
        let order = |x: &(ReadKind, usize, u32)| (x.0, x.1);
        for item in [(ReadKind::Ahead, 5, 0), (ReadKind::Preload, 0, 1), (ReadKind::Ahead, 2, 2), (ReadKind::Miss, 3, 3),
                     (ReadKind::Ahead, 2, 4), (ReadKind::Miss, 1, 5), (ReadKind::Ahead, 6, 6)] {
            q.push(item);
        }
        assert_eq!(q.take_first(|x| x.0 == ReadKind::Ahead && x.1 == 6), Some((ReadKind::Ahead, 6, 6)));
        assert_eq!(q.take_first(|x| x.0 == ReadKind::Ahead && x.1 == 6), None);
        let popped: Vec<u32> = (0..6).map(|_| q.pop_least(order).must().2).collect();
        assert_eq!(popped, [5, 3, 2, 4, 0, 1]);
        q.close();
        assert_eq!(q.pop_least(order), None, "an empty queue without writers ends");
    }

    /// A reader that panics (here: a request longer than its buffer, a bug) hands the caller an
    /// error naming the read, with the buffer back, instead of leaving it waiting for ever; the
    /// other readers, and the panicking one's thread, keep serving.
    #[test]
    fn a_panicking_io_thread_is_an_error_not_a_hang() {
        let path = std::env::temp_dir().join(format!("waste-io-panic-{}.bin", std::process::id()));
        let data: Vec<u8> = (0..2 * 4096u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).must();
        let banks = Arc::new(vec![Some(BankFile::open_with(path.clone(), false).must())]);
        let pool = IoPool::new(2, banks, 2).must();
        let mut slots = crate::sys::SlotArena::slots(4096, 2, true).must();
        let (b1, b0) = (slots.pop().must(), slots.pop().must());
        // 8192 bytes into a 4096-byte slot: the slice index panics inside the reader.
        pool.submit(Request { kind: ReadKind::Miss, layer: 0, expert: 3, slot: 0, offset: 0, len: 8192, buf: b0 });
        let done = pool.wait().must();
        let err = done.result.expect_err("an oversized read succeeded");
        assert_eq!((done.layer, done.expert, done.slot, done.buf.as_slice().len()), (0, 3, 0, 4096));
        let msg = err.to_string();
        assert!(msg.contains("panicked") && msg.contains("layer 0 expert 3"), "{msg}");
        // The pool still reads.
        pool.submit(Request { kind: ReadKind::Miss, layer: 0, expert: 1, slot: 1, offset: 4096, len: 4096, buf: b1 });
        pool.submit(Request { kind: ReadKind::Miss, layer: 0, expert: 0, slot: 0, offset: 0, len: 4096, buf: done.buf });
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
