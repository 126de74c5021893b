//! Thread placement (seed 001, "Thread placement"): the cpu-list parse table (runs on every
//! platform), and the binding of every pool participant, read back with `sched_getaffinity`
//! (SKIP, printed, where the platform cannot bind; there a list must be refused).

use crate::common;
use std::sync::Mutex;
use waste::kernels::Pool;
use waste::{CpuList, ErrorKind, Model, Options};

#[test]
fn cpu_list_parse_table() {
    let good: &[(&str, &[usize], &str)] = &[
        ("3", &[3], "3"),
        ("0-5", &[0, 1, 2, 3, 4, 5], "0-5"),
        ("0-2,6-8", &[0, 1, 2, 6, 7, 8], "0-2,6-8"),
        ("0,1", &[0, 1], "0-1"),
        ("5,1,3", &[1, 3, 5], "1,3,5"),
        ("0-3,2-5", &[0, 1, 2, 3, 4, 5], "0-5"),
        ("7,7", &[7], "7"),
        ("4-4", &[4], "4"),
        (" 1-2\n", &[1, 2], "1-2"),
        ("1023", &[1023], "1023"),
        // util-linux's stride (taskset -c): every S-th CPU from A.
        ("0-7:2", &[0, 2, 4, 6], "0,2,4,6"),
        ("1-8:3", &[1, 4, 7], "1,4,7"),
        ("3-3:5", &[3], "3"),
        // The kernel's groups: the first U of every G CPUs from A, the last group cut at B.
        ("0-15:2/4", &[0, 1, 4, 5, 8, 9, 12, 13], "0-1,4-5,8-9,12-13"),
        ("0-7:1/2", &[0, 2, 4, 6], "0,2,4,6"),
        ("2-6:3/3", &[2, 3, 4, 5, 6], "2-6"),
        ("0-9:3/4", &[0, 1, 2, 4, 5, 6, 8, 9], "0-2,4-6,8-9"),
        ("100-200:2/25,1", &[1, 100, 101, 125, 126, 150, 151, 175, 176, 200], "1,100-101,125-126,150-151,175-176,200"),
        ("0-0:0/1,5", &[5], "5"),
    ];
    for &(text, cpus, canon) in good {
        let l = CpuList::parse(text).unwrap_or_else(|e| panic!("`{text}`: {e}"));
        assert_eq!(l.cpus(), cpus, "`{text}`");
        assert_eq!(l.to_string(), canon, "`{text}`");
        assert_eq!(CpuList::parse(canon).unwrap(), l, "`{canon}` round trip");
    }
    // The kernel's own example, and `N` / `all` against a machine whose last CPU is 7.
    let l = CpuList::parse("0-1023:2/256").unwrap();
    assert_eq!(l.cpus(), [0, 1, 256, 257, 512, 513, 768, 769]);
    let n: &[(&str, &[usize])] = &[("N", &[7]), ("4-N", &[4, 5, 6, 7]), ("all", &[0, 1, 2, 3, 4, 5, 6, 7]),
        ("ALL", &[0, 1, 2, 3, 4, 5, 6, 7]), ("0-N:1/4", &[0, 4]), ("6,N-N", &[6, 7])];
    for &(text, cpus) in n {
        let l = CpuList::parse_with_last(text, 7).unwrap_or_else(|e| panic!("`{text}`: {e}"));
        assert_eq!(l.cpus(), cpus, "`{text}`");
    }
    let e = CpuList::parse_with_last("8-N", 7).expect_err("8-N on 8 CPUs");
    assert!(e.message().contains("`8-N`") && e.message().contains("start is after its end"), "{}", e.message());
    assert_eq!(CpuList::parse("N").unwrap().cpus(), [waste::host::last_cpu()]);
    // `N` is at least the highest CPU this thread may use (musl and a missing /sys size the
    // machine by the affinity mask), and the default thread count is at most the mask's size.
    if waste::host::CAN_BIND_THREADS {
        let allowed = waste::host::current_thread_cpus().unwrap();
        assert!(waste::host::last_cpu() >= *allowed.last().unwrap());
        assert!((1..=allowed.len()).contains(&waste::host::available_cpus()), "{} of {allowed:?}", waste::host::available_cpus());
    }
    let bad: &[(&str, &str)] = &[
        ("", "empty"),
        ("  ", "empty"),
        (",", "``"),
        ("0,", "``"),
        (",0", "``"),
        ("0,,1", "``"),
        ("a", "`a`"),
        ("1-", "`1-`"),
        ("-1", "`-1`"),
        ("3-1", "`3-1`"),
        ("0-1-2", "`0-1-2`"),
        ("1 ,2", "`1 `"),
        ("+1", "`+1`"),
        ("1.5", "`1.5`"),
        ("0x1", "`0x1`"),
        ("99999999999999999999", "`99999999999999999999`"),
        ("1024", "`1024`"),
        ("0-1024", "`0-1024`"),
        ("0-4,2:1/2", "`2:1/2`"),
        ("0-7:0", "`0-7:0`"),
        ("0-7:", "`0-7:`"),
        ("0-7:x", "`0-7:x`"),
        ("0-7:-2", "`0-7:-2`"),
        ("0-7:3/2", "`0-7:3/2`"),
        ("0-7:1/0", "`0-7:1/0`"),
        ("0-7:1/", "`0-7:1/`"),
        ("0-7:/2", "`0-7:/2`"),
        ("0-7:1/2/3", "`0-7:1/2/3`"),
        ("0-7:2:3", "`0-7:2:3`"),
        ("0-2000:2/25", "`0-2000:2/25`"),
        ("n", "`n`"),
        ("al", "`al`"),
        ("0-0:0/1", "names no CPU"),
    ];
    for &(text, names) in bad {
        let e = CpuList::parse(text).expect_err(text);
        assert_eq!(e.kind(), ErrorKind::Arg, "`{text}`");
        assert!(e.message().contains(names), "`{text}`: message `{}` does not name {names}", e.message());
    }
}

#[test]
fn threads_zero_with_a_list_means_one_per_listed_cpu() {
    let list = CpuList::parse("0-2,6").unwrap();
    let o = Options { threads: 0, cpus: Some(list.clone()), ..Options::default() };
    assert_eq!(o.resolved_threads(), 4);
    let o = Options { threads: 2, cpus: Some(list), ..Options::default() };
    assert_eq!(o.resolved_threads(), 2, "an explicit thread count wins");
}

/// The CPUs a fresh thread may use, or `None` (with a SKIP line) where binding is unsupported.
fn allowed_cpus(test: &str) -> Option<Vec<usize>> {
    if !waste::host::CAN_BIND_THREADS {
        common::skip(test, "this platform cannot bind threads to CPUs");
        return None;
    }
    Some(std::thread::spawn(|| waste::host::current_thread_cpus().unwrap()).join().unwrap())
}

/// The CPU list the binding tests use: the last CPU this process may use, so that on a
/// machine with more than one CPU the binding visibly narrows the mask.
fn one_cpu(allowed: &[usize]) -> CpuList {
    CpuList::from_cpus(&allowed[allowed.len() - 1..]).unwrap()
}

#[test]
fn every_pool_participant_is_bound_to_the_list() {
    let Some(allowed) = allowed_cpus("every_pool_participant_is_bound_to_the_list") else {
        let e = Pool::with_cpus(2, Some(&CpuList::parse("0").unwrap())).err().expect("a list must be refused");
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        return;
    };
    let list = one_cpu(&allowed);
    // A fresh thread plays the host's thread, so the test harness's own thread stays unbound.
    std::thread::spawn(move || {
        let pool = Pool::with_cpus(3, Some(&list)).unwrap();
        let before = waste::host::current_thread_cpus().unwrap();
        assert_eq!(before, allowed, "the caller is not bound before its first region");
        pool.bind_caller().unwrap();
        let masks: Vec<Mutex<Vec<usize>>> = (0..3).map(|_| Mutex::new(Vec::new())).collect();
        pool.run(&|part| *masks[part].lock().unwrap() = waste::host::current_thread_cpus().unwrap());
        for (part, m) in masks.iter().enumerate() {
            assert_eq!(m.lock().unwrap().as_slice(), list.cpus(), "participant {part}");
        }
    })
    .join()
    .unwrap();
}

#[test]
fn a_model_binds_its_workers_and_the_thread_that_runs_it() {
    let Some(allowed) = allowed_cpus("a_model_binds_its_workers_and_the_thread_that_runs_it") else { return };
    let list = one_cpu(&allowed);
    let dir = common::fixture("oracles/llama_f32/model");
    std::thread::spawn(move || {
        let opts = Options { threads: 0, cpus: Some(list.clone()), ..Options::default() };
        let mut m = Model::open(&dir, &opts).unwrap();
        assert_eq!(m.info().threads, list.len(), "--threads 0 with a list: one thread per listed CPU");
        assert_eq!(waste::host::current_thread_cpus().unwrap(), allowed, "opening does not bind the caller");
        m.eval(&[1, 2, 3]).unwrap();
        assert_eq!(waste::host::current_thread_cpus().unwrap(), list.cpus(), "the first forward pass binds the caller");
    })
    .join()
    .unwrap();
}

#[test]
fn a_cpu_the_process_cannot_use_is_an_error_naming_it() {
    let Some(allowed) = allowed_cpus("a_cpu_the_process_cannot_use_is_an_error_naming_it") else { return };
    let Some(absent) = (0..waste::host::MAX_CPUS).find(|c| !allowed.contains(c)) else {
        common::skip("a_cpu_the_process_cannot_use_is_an_error_naming_it", "every CPU number is available");
        return;
    };
    // Alone: no usable CPU at all. With a usable one: the kernel would silently narrow the mask.
    for list in [CpuList::from_cpus(&[absent]).unwrap(), CpuList::from_cpus(&[allowed[0], absent]).unwrap()] {
        let e = Pool::with_cpus(2, Some(&list)).err().unwrap_or_else(|| panic!("{list} was accepted"));
        assert_eq!(e.kind(), ErrorKind::Arg, "{e}");
        assert!(e.message().contains(&list.to_string()) && e.message().contains(&absent.to_string()), "{e}");
    }
}

#[test]
fn the_cli_refuses_a_malformed_list_naming_it() {
    let model = common::fixture("oracles/llama_f32/model");
    let (status, _, err) = common::waste(&["info", model.to_str().unwrap(), "--cpus", "0-x"]);
    assert_eq!(status, 2, "{err}");
    assert!(err.contains("`0-x`"), "{err}");
    let (status, _, err) = common::waste(&["bench", "matmul", "--cpus", "3-1"]);
    assert_eq!(status, 2, "{err}");
    assert!(err.contains("`3-1`"), "{err}");
}
