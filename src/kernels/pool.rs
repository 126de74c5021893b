//! A persistent thread pool: workers are created once per model and wait for work; each
//! parallel region hands every participant (the calling thread is participant 0) one index
//! and returns when all are done.
//!
//! Decode runs a few hundred regions per token, each a few tens of microseconds of work, so the
//! hand-off must cost far less than that. A region is published by bumping an atomic epoch;
//! a waiting worker spins on it for a short while (the next region usually follows within
//! microseconds) and only then parks (`std::thread::park`, a futex on Linux), so an idle model
//! costs no CPU. The caller waits for the workers the same way: spin, then park.
//!
//! Work is split by output rows or heads, never by partial sums, so a result does not depend
//! on the number of threads.

use crate::sys::CpuList;
use crate::error::{Error, ErrorKind, Result};
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{JoinHandle, Thread, ThreadId};
use std::time::{Duration, Instant};

type Job = dyn Fn(usize) + Sync;

/// How long a waiting participant spins before it parks. Decode's gaps between regions
/// (a norm, a rope, a residual add) are microseconds; an idle pool parks after this.
const SPIN: Duration = Duration::from_micros(100);

/// After this much spinning a waiter yields its CPU between checks: on a machine with more
/// runnable threads than CPUs, the participant it waits for may be queued behind it.
const SPIN_ALONE: Duration = Duration::from_micros(10);

/// What the memory plan counts for each thread the engine starts (a compute worker here, an
/// expert-reading thread in `cache::io`): its stack as touched, its flag and handle, its share
/// of a channel's blocks. The stack dominates: the AVX-512 prefill GEMM keeps its register
/// tiles' accumulators, a widened weight panel and four vectors' inputs on it (288 KiB per
/// call then, about 190 KiB since 2026-12-04, see `kernels::avx512_prefill`; the AVX2 GEMM's
/// 280 KiB, `kernels::avx2_gemm`). Measured at
/// about 300 KiB per compute worker with those kernels on a prefill that reaches the GEMM
/// (peak RSS of `waste bench` on a SmolLM2-135M-shaped model, 128-token prompt, 9 threads
/// against 1, 2026-12-03); `tests/budget.rs` checks the measured figure stays under this.
pub const THREAD_BYTES: u64 = 384 << 10;

/// One cache line per flag, so a worker spinning on its own flag does not slow the others.
#[repr(align(64))]
struct Flag(AtomicBool);

struct Shared {
    /// Bumped (wrapping) to publish a region.
    epoch: AtomicUsize,
    /// Workers that have not finished the current region.
    pending: AtomicUsize,
    /// The current region's job: written by the caller before it bumps `epoch`, read by
    /// workers after they observe the bump, unused once `pending` is 0. The borrowed closure's
    /// lifetime is extended by `run`, which does not return until every worker has finished.
    job: UnsafeCell<Option<*const Job>>,
    /// Set by a worker whose job panicked; the caller re-raises after the region.
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Per worker: it is parked (or about to park) and needs an unpark to see a new epoch.
    sleeping: Vec<Flag>,
    /// The caller is parked waiting for `pending` to reach 0.
    caller_sleeping: AtomicBool,
    /// The thread running the current region, for the last worker to unpark.
    caller: Mutex<Option<Thread>>,
    /// A region is running: the workers and `job` are taken until it ends.
    busy: AtomicBool,
}

// SAFETY: `job` is written only by the caller while no worker reads it (before the epoch bump
// that publishes it, after `pending` reached 0), and read by workers only in between; the
// epoch's release/acquire and pending's acq-rel order those accesses. The closure is Sync.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only a borrowed, Sync closure.
unsafe impl Send for Shared {}

/// A fixed set of worker threads, optionally bound to a CPU list.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
    cpus: Option<CpuList>,
    /// Threads that ran a region on this pool and were bound to `cpus` (lazily, seed 001).
    bound_callers: Mutex<Vec<ThreadId>>,
}

impl Pool {
    /// A pool of `threads` participants (the caller plus `threads - 1` workers), unbound.
    pub fn new(threads: usize) -> Result<Pool> {
        Pool::with_cpus(threads, None)
    }

    /// A pool whose workers bind to `cpus` as they start (an error from any of them is the
    /// pool's error); the calling thread binds in [`Pool::bind_caller`].
    pub fn with_cpus(threads: usize, cpus: Option<&CpuList>) -> Result<Pool> {
        let threads = threads.max(1);
        if let Some(list) = cpus {
            if !crate::sys::CAN_BIND_THREADS {
                return Err(Error::unsupported(format!(
                    "cpu list `{list}`: this platform cannot bind threads to CPUs")));
            }
        }
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleeping: (1..threads).map(|_| Flag(AtomicBool::new(false))).collect(),
            caller_sleeping: AtomicBool::new(false),
            caller: Mutex::new(None),
            busy: AtomicBool::new(false),
        });
        let mut pool = Pool { shared, workers: Vec::with_capacity(threads - 1), threads, cpus: cpus.cloned(),
            bound_callers: Mutex::new(Vec::new()) };
        let (tx, rx) = mpsc::channel::<Result<()>>();
        for index in 1..threads {
            let s = Arc::clone(&pool.shared);
            let tx = tx.clone();
            let bind = pool.cpus.clone();
            let handle = std::thread::Builder::new()
                .name(format!("waste-worker-{index}"))
                .spawn(move || {
                    let bound = bind.as_ref().map_or(Ok(()), |l| crate::sys::bind_current_thread(l.cpus()));
                    let ok = bound.is_ok();
                    let _ = tx.send(bound);
                    if ok {
                        worker_loop(&s, index);
                    }
                })
                .map_err(|e| Error::new(ErrorKind::Io, format!("cannot start worker thread: {e}")))?;
            pool.workers.push(handle);
        }
        drop(tx);
        // Every worker reports its binding before the pool is handed out; the first failure is
        // the pool's error (Drop then stops the workers that did start).
        for _ in 1..threads {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Error::new(ErrorKind::Io, "a worker thread exited while starting")),
            }
        }
        Ok(pool)
    }

    /// Number of participants.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Bytes its worker threads hold, at [`THREAD_BYTES`] each (the caller is participant 0).
    pub fn memory_bytes(&self) -> u64 {
        self.workers.len() as u64 * THREAD_BYTES
    }

    /// The CPU list the pool's threads are bound to, if any.
    pub fn cpus(&self) -> Option<&CpuList> {
        self.cpus.as_ref()
    }

    /// Binds the calling thread to the pool's CPU list the first time it calls (a no-op when
    /// the pool has no list). The caller is participant 0 of every region, so an unbound caller
    /// would be the straggler the list exists to remove; binding it here rather than at pool
    /// creation restricts the thread that actually runs the model (seed 001).
    pub fn bind_caller(&self) -> Result<()> {
        let Some(list) = &self.cpus else { return Ok(()) };
        let me = std::thread::current().id();
        let mut bound = self.bound_callers.lock().unwrap_or_else(|e| e.into_inner());
        if !bound.contains(&me) {
            crate::sys::bind_current_thread(list.cpus())?;
            bound.push(me);
        }
        Ok(())
    }

    /// Runs `job(i)` for every participant index `i` in `0..threads()`, the caller taking 0,
    /// and returns when all have finished. A panic in any participant is re-raised here after
    /// all have finished.
    ///
    /// A region started while another runs on the same pool — from a second thread sharing
    /// the pool, or from inside a job — cannot have the workers (they belong to the running
    /// region, and `job` is in use), so it runs every participant's part on its own calling
    /// thread, in index order: the same results, serialised, never two regions in the workers.
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        let sh = &*self.shared;
        if self.threads == 1 || sh.busy.compare_exchange(false, true, Acquire, Relaxed).is_err() {
            for i in 0..self.threads {
                job(i);
            }
            return;
        }
        {
            let me = std::thread::current();
            let mut c = sh.caller.lock().unwrap_or_else(|e| e.into_inner());
            if c.as_ref().map(Thread::id) != Some(me.id()) {
                *c = Some(me);
            }
        }
        // SAFETY: we erase the lifetime of `job`; it stays alive until `pending` is 0 below,
        // after which no worker touches it. No worker reads `job` now: the previous region's
        // workers all finished (pending was 0) and this region is not yet published.
        unsafe {
            let ptr: *const Job = std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(job);
            *sh.job.get() = Some(ptr);
        }
        sh.pending.store(self.threads - 1, Relaxed);
        // SeqCst pairs with the worker's store of `sleeping` then load of `epoch`: either the
        // worker sees the new epoch, or we see it asleep and unpark it.
        sh.epoch.fetch_add(1, SeqCst);
        for (flag, w) in sh.sleeping.iter().zip(&self.workers) {
            if flag.0.load(SeqCst) {
                w.thread().unpark();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| job(0)));
        wait_until(|| sh.pending.load(Acquire) == 0, &sh.caller_sleeping);
        // SAFETY: every worker has finished the region (pending is 0).
        unsafe { *sh.job.get() = None };
        sh.busy.store(false, Release);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if sh.panicked.swap(false, AcqRel) {
            panic!("a pool worker panicked");
        }
    }
}

/// Spins until `done()` (yielding the CPU between checks after [`SPIN_ALONE`]), then parks
/// with `sleeping` raised until it is (spurious wakes loop).
fn wait_until(done: impl Fn() -> bool, sleeping: &AtomicBool) {
    let start = Instant::now();
    let mut spins = 0u32;
    while !done() {
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        let waited = start.elapsed();
        if waited < SPIN_ALONE {
            continue;
        }
        if waited < SPIN {
            std::thread::yield_now();
            continue;
        }
        sleeping.store(true, SeqCst);
        if !done() {
            std::thread::park();
        }
        sleeping.store(false, SeqCst);
    }
}

fn worker_loop(sh: &Shared, index: usize) {
    // Regions are counted from 0 at creation, so a worker that starts late still sees the first.
    let mut seen = 0usize;
    let flag = &sh.sleeping[index - 1].0;
    loop {
        wait_until(|| sh.epoch.load(SeqCst) != seen || sh.shutdown.load(SeqCst), flag);
        if sh.shutdown.load(Acquire) {
            return;
        }
        seen = sh.epoch.load(Acquire);
        // SAFETY: the epoch bump published the job; `run` keeps it alive until `pending` is 0.
        if let Some(job) = unsafe { *sh.job.get() } {
            // SAFETY: as above.
            let r = catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(index) }));
            if r.is_err() {
                sh.panicked.store(true, Release);
            }
        }
        if sh.pending.fetch_sub(1, SeqCst) == 1 && sh.caller_sleeping.load(SeqCst) {
            if let Some(t) = sh.caller.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                t.unpark();
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        for w in &self.workers {
            w.thread().unpark();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The `part`-th of `parts` contiguous chunks of `0..n` (the first chunks one larger when `n`
/// does not divide evenly).
pub fn chunk(n: usize, parts: usize, part: usize) -> std::ops::Range<usize> {
    let base = n / parts;
    let extra = n % parts;
    let start = part * base + part.min(extra);
    let len = base + usize::from(part < extra);
    start..start + len
}

/// Pieces `0..count` of a region's work, handed to its participants one at a time: whoever
/// is free takes the next. A participant the OS delays (another process on its CPU, on a
/// laptop the usual case) then holds up only the piece it is on, where a fixed share per
/// participant would make every region wait for it. Which participant computes a piece never
/// changes what the piece computes.
pub(crate) struct Pieces {
    next: AtomicUsize,
    count: usize,
}

impl Pieces {
    pub(crate) fn new(count: usize) -> Pieces {
        Pieces { next: AtomicUsize::new(0), count }
    }

    /// The next piece nobody has taken, if any.
    pub(crate) fn take(&self) -> Option<usize> {
        // Relaxed: the region's start and end order everything the pieces read and write.
        let i = self.next.fetch_add(1, Relaxed);
        (i < self.count).then_some(i)
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// The items of the pieces this participant takes, when `items` items were cut into
    /// [`Pieces::of_items`]' pieces: a participant's whole share, piece by piece.
    pub(crate) fn items(&self, items: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::from_fn(|| self.take()).flat_map(move |i| chunk(items, self.count, i))
    }

    /// Pieces of `items` independent items of unequal cost — attention's (token, head) items,
    /// whose cost grows with the token's position, so that equal halves of a causal prompt's
    /// tokens would give one thread three times the other's work — for `threads`
    /// participants: up to sixteen each, so the last ones taken are small.
    pub(crate) fn of_items(items: usize, threads: usize) -> Pieces {
        Pieces::new(items.min(threads * 16).max(1))
    }
}

/// The `piece`-th of `pieces` contiguous ranges of `0..n` whose inner boundaries are
/// multiples of `align` (the last range takes the remainder; ranges may be empty when `n` is
/// short).
pub(crate) fn aligned_chunk(n: usize, pieces: usize, piece: usize, align: usize) -> std::ops::Range<usize> {
    let units = n.div_ceil(align.max(1));
    let r = chunk(units, pieces, piece);
    (r.start * align).min(n)..(r.end * align).min(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_each_taken_once_by_whoever_is_free() {
        let pool = Pool::new(3).unwrap();
        for count in [0, 1, 5, 64] {
            let pieces = Pieces::new(count);
            let hits: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|_| {
                while let Some(i) = pieces.take() {
                    hits[i].fetch_add(1, Relaxed);
                }
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "{count} pieces");
        }
    }

    #[test]
    fn aligned_chunks_cover_the_range_at_aligned_boundaries() {
        for (n, pieces, align) in [(2048, 8, 48), (100, 8, 48), (7, 3, 1), (0, 4, 16), (50, 4, 16)] {
            let ranges: Vec<_> = (0..pieces).map(|p| aligned_chunk(n, pieces, p, align)).collect();
            let all: Vec<usize> = ranges.iter().cloned().flatten().collect();
            assert_eq!(all, (0..n).collect::<Vec<_>>());
            assert!(ranges.iter().all(|r| r.start % align == 0 || r.start == n), "{ranges:?}");
        }
    }

    #[test]
    fn every_participant_runs_once_per_region() {
        let pool = Pool::new(3).unwrap();
        let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..1000 {
            pool.run(&|i| {
                hits[i].fetch_add(1, Relaxed);
            });
        }
        for h in &hits {
            assert_eq!(h.load(Relaxed), 1000);
        }
    }

    #[test]
    fn regions_after_the_workers_parked_still_run() {
        let pool = Pool::new(2).unwrap();
        let n = AtomicUsize::new(0);
        pool.run(&|_| {
            n.fetch_add(1, Relaxed);
        });
        std::thread::sleep(SPIN * 5);
        pool.run(&|_| {
            n.fetch_add(1, Relaxed);
        });
        assert_eq!(n.load(Relaxed), 4);
    }

    #[test]
    fn a_worker_panic_reaches_the_caller_and_the_pool_survives() {
        let pool = Pool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(&|i| assert!(i == 0, "worker fails"))));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        pool.run(&|_| {
            n.fetch_add(1, Relaxed);
        });
        assert_eq!(n.load(Relaxed), 2);
    }

    #[test]
    fn chunks_cover_the_range_in_order() {
        for (n, parts) in [(10, 3), (2, 4), (0, 2), (7, 7)] {
            let all: Vec<usize> = (0..parts).flat_map(|p| chunk(n, parts, p)).collect();
            assert_eq!(all, (0..n).collect::<Vec<_>>());
        }
    }
}
