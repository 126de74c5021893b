//! Soundness of what stays public (issue 14): the thread pool used from two threads at once or
//! re-entered from inside a job, and the kernels' bounds checks against products that overflow.
//! (The aligned buffers' release-build alignment check and the I/O threads' panics are unit
//! tests of `sys` and `cache::io`, which are not public.)

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use waste::format::dtype::DType;
use waste::kernels::{Kernels, MatRef, Pool};

/// Two threads run regions on one shared pool at the same time: every participant index of
/// every region runs exactly once (a second region is serialised onto its caller, never mixed
/// into the first one's workers).
#[test]
fn a_pool_shared_by_two_threads_runs_every_region_whole() {
    let pool = Pool::new(3).expect("pool");
    let regions = 2000;
    let hits: Vec<Vec<AtomicUsize>> = (0..2).map(|_| (0..3).map(|_| AtomicUsize::new(0)).collect()).collect();
    std::thread::scope(|s| {
        for mine in &hits {
            let pool = &pool;
            s.spawn(move || {
                for _ in 0..regions {
                    pool.run(&|i| {
                        mine[i].fetch_add(1, Relaxed);
                    });
                }
            });
        }
    });
    for (t, mine) in hits.iter().enumerate() {
        let counts: Vec<usize> = mine.iter().map(|h| h.load(Relaxed)).collect();
        assert_eq!(counts, vec![regions; 3], "thread {t}: per-participant counts");
    }
}

/// A job that starts a region on its own pool (from participant 0, the caller, and from a
/// worker) neither deadlocks nor corrupts the outer region: the inner one runs whole on the
/// thread that started it.
#[test]
fn a_pool_reentered_from_a_job_runs_the_inner_region_inline() {
    let pool = Pool::new(3).expect("pool");
    let outer = AtomicUsize::new(0);
    let inner: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
    for _ in 0..200 {
        pool.run(&|i| {
            outer.fetch_add(1, Relaxed);
            pool.run(&|j| {
                inner[j].fetch_add(1, Relaxed);
            });
            let _ = i;
        });
    }
    assert_eq!(outer.load(Relaxed), 600);
    // Each of the 3 participants of each outer region ran one inner region of 3 parts.
    let counts: Vec<usize> = inner.iter().map(|h| h.load(Relaxed)).collect();
    assert_eq!(counts, vec![600; 3]);
    // And the pool is still a pool.
    let after = AtomicUsize::new(0);
    pool.run(&|_| {
        after.fetch_add(1, Relaxed);
    });
    assert_eq!(after.load(Relaxed), 3);
}

fn panic_message(r: std::thread::Result<()>) -> String {
    let p = r.expect_err("the kernel accepted buffers that cannot hold its operands");
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}

/// Shapes whose products overflow `usize` are refused by the bounds checks themselves
/// ("too short"), not by a wrapped product that a release build would let through (nor by the
/// test profile's overflow checks, which a release build does not have).
#[test]
fn kernel_bounds_checks_refuse_overflowing_products() {
    let pool = Pool::new(1).expect("pool");
    let k = Kernels::select(true);
    let data = [0u8; 64];
    let x = [0f32; 16];
    let mut y = [0f32; 16];
    // n × cols = 2 × 2^63 wraps to 0 in release arithmetic.
    let huge = MatRef { dtype: DType::F32, rows: 1, cols: 1usize << 63, data: &data };
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| k.matmul(&pool, huge, &x, 2, &mut y))));
    assert!(msg.contains("matmul: buffers too short"), "{msg}");
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| k.rows(huge, 0, 1, &x, 2, &mut y, 1))));
    assert!(msg.contains("rows: x too short"), "{msg}");
    // rows × row bytes = 2^62 × 4 wraps to 0.
    let tall = MatRef { dtype: DType::F32, rows: 1usize << 62, cols: 4, data: &data };
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| k.matmul(&pool, tall, &x, 1, &mut y))));
    assert!(msg.contains("too short"), "{msg}");
    // (n − 1) × stride + r1 in `rows`.
    let small = MatRef { dtype: DType::F32, rows: 4, cols: 4, data: &data };
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| k.rows(small, 0, 4, &x, 3, &mut y, usize::MAX / 2))));
    assert!(msg.contains("y too short") || msg.contains("x too short"), "{msg}");
    // And a shape that fits still computes.
    k.matmul(&pool, small, &x[..4], 1, &mut y[..4]);
}
