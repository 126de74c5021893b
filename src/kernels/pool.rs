//! A persistent thread pool: workers are created once per model and wait for work; each
//! parallel region hands every participant (the calling thread is participant 0) one index
//! and returns when all are done.
//!
//! Work is split by output rows or heads, never by partial sums, so a result does not depend
//! on the number of threads.

use crate::error::Result;
use std::sync::{Arc, Condvar, Mutex};

type Job = dyn Fn(usize) + Sync;

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
}

struct State {
    /// Incremented for every region; a worker runs a region once.
    generation: u64,
    /// The current region's job, valid while `running > 0`. It is a borrowed closure whose
    /// lifetime is extended by `run`, which does not return until every worker has finished.
    job: Option<*const Job>,
    running: usize,
    shutdown: bool,
}

// SAFETY: the raw job pointer is only dereferenced while `run` keeps the closure alive and
// blocks; the closure itself is Sync.
unsafe impl Send for State {}

/// A fixed set of worker threads.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
    threads: usize,
}

impl Pool {
    /// A pool of `threads` participants (the caller plus `threads - 1` workers).
    pub fn new(threads: usize) -> Result<Pool> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State { generation: 0, job: None, running: 0, shutdown: false }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(threads - 1);
        for index in 1..threads {
            let s = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("waste-worker-{index}"))
                .spawn(move || worker_loop(&s, index))
                .map_err(|e| crate::Error::new(crate::ErrorKind::Io, format!("cannot start worker thread: {e}")))?;
            workers.push(handle);
        }
        Ok(Pool { shared, workers, threads })
    }

    /// Number of participants.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `job(i)` for every participant index `i` in `0..threads()`, the caller taking 0,
    /// and returns when all have finished.
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        if self.threads == 1 {
            job(0);
            return;
        }
        // SAFETY: we erase the lifetime of `job`; it stays alive until we observe running == 0
        // below, after which no worker touches it.
        let ptr: *const Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(job) };
        {
            let mut st = lock(&self.shared.state);
            st.job = Some(ptr);
            st.running = self.threads - 1;
            st.generation += 1;
        }
        self.shared.work.notify_all();
        job(0);
        let mut st = lock(&self.shared.state);
        while st.running > 0 {
            st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.job = None;
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn worker_loop(shared: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut st = lock(&shared.state);
            while st.generation == seen && !st.shutdown {
                st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            st.job
        };
        if let Some(job) = job {
            // SAFETY: `run` keeps the closure alive until `running` reaches 0.
            unsafe { (*job)(index) };
        }
        let mut st = lock(&shared.state);
        st.running -= 1;
        if st.running == 0 {
            shared.done.notify_one();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.work.notify_all();
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
