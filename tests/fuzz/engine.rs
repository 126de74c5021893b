//! A small deterministic mutation fuzzer (issue 16), no dependencies: each target is a seed
//! corpus and a function that feeds one input to a parser. Inputs are mutated from the corpus
//! (bit flips, interesting bytes, insertions, deletions, duplicated ranges, splices of two
//! seeds, length fields pushed to extremes, truncation, and for text formats JSON-aware edits
//! of numbers, strings and brackets) with a seeded xorshift, so a run is reproducible from
//! its target name and execution number.
//!
//! Invariants checked for every input: no panic (caught, the input saved), no hang (a
//! watchdog aborts the process, naming the input saved, when one input runs past
//! [`TIME_LIMIT`]), memory (the target reports its peak heap, checked against its bound), and
//! whatever the target itself checks (that its error names the file). Regression inputs in
//! `tests/fixtures/fuzz/<target>/` run first.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One input may take at most this long.
pub const TIME_LIMIT: Duration = Duration::from_secs(20);

/// The deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// How an input is mutated.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Binary with length fields (little-endian): extremes are written at aligned offsets,
    /// mostly near the start where headers are.
    Binary,
    /// Text, JSON or JSON-like: numbers, strings and brackets are edited as tokens too.
    Json,
    /// Plain text (templates, rank files): byte edits and line-level splices.
    Text,
}

const INTERESTING: [u8; 16] = [0, 1, 0x7f, 0x80, 0xff, b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b'\n', b'%', b'0'];
const EXTREME_NUMBERS: [&str; 14] = ["-1", "0", "1e309", "-1e309", "18446744073709551615", "18446744073709551616",
    "9223372036854775807", "-9223372036854775808", "4294967296", "4294967295", "1.5", "1e-400", "65536", "2147483648"];
const EXTREME_U64: [u64; 10] = [0, 1, u32::MAX as u64, u32::MAX as u64 + 1, i64::MAX as u64, u64::MAX, 1 << 31, 1 << 40, 0xFFFF, 0x8000_0000_0000_0000];

/// One mutated input from `corpus[i]`: 1 to 4 stacked edits.
pub fn mutate(rng: &mut Rng, corpus: &[Vec<u8>], shape: Shape) -> Vec<u8> {
    let mut v = corpus[rng.below(corpus.len())].clone();
    let edits = 1 + rng.below(4);
    for _ in 0..edits {
        edit(rng, &mut v, corpus, shape);
    }
    v
}

/// A position, favouring the first 256 bytes (headers) half the time.
fn pos(rng: &mut Rng, len: usize) -> usize {
    if len == 0 {
        0
    } else if rng.chance(2) {
        rng.below(len.min(256))
    } else {
        rng.below(len)
    }
}

fn edit(rng: &mut Rng, v: &mut Vec<u8>, corpus: &[Vec<u8>], shape: Shape) {
    let len = v.len();
    let kinds = if shape == Shape::Json { 11 } else { 9 };
    match rng.below(kinds) {
        0 if len > 0 => {
            let p = pos(rng, len);
            v[p] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let p = pos(rng, len);
            v[p] = INTERESTING[rng.below(INTERESTING.len())];
        }
        2 => {
            let p = pos(rng, len + 1).min(len);
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| if rng.chance(2) { INTERESTING[rng.below(16)] } else { rng.next() as u8 }).collect();
            v.splice(p..p, bytes);
        }
        3 if len > 0 => {
            let p = pos(rng, len);
            let n = (1 + rng.below(64)).min(len - p);
            v.drain(p..p + n);
        }
        4 if len > 0 => {
            // A range copied elsewhere (repeats members, records, lines).
            let a = rng.below(len);
            let n = (1 + rng.below(256)).min(len - a);
            let chunk = v[a..a + n].to_vec();
            let p = rng.below(len + 1);
            v.splice(p..p, chunk);
        }
        5 => {
            // Splice: a prefix of this input and a suffix of another seed.
            let other = &corpus[rng.below(corpus.len())];
            let a = rng.below(len + 1);
            let b = rng.below(other.len() + 1);
            v.truncate(a);
            v.extend_from_slice(&other[b..]);
        }
        6 if len >= 4 => {
            // A length field pushed to an extreme: u32 or u64 LE at an aligned offset.
            let wide = rng.chance(2);
            let w = if wide { 8 } else { 4 };
            if len >= w {
                let p = (pos(rng, len - w + 1) / w * w).min(len - w);
                let x = match rng.below(3) {
                    0 => EXTREME_U64[rng.below(EXTREME_U64.len())],
                    1 => len as u64 + rng.below(3) as u64 - 1,
                    _ => {
                        let old = if wide { u64::from_le_bytes(v[p..p + 8].try_into().unwrap_or([0; 8])) } else { u32::from_le_bytes(v[p..p + 4].try_into().unwrap_or([0; 4])) as u64 };
                        old.wrapping_add([1u64, u64::MAX, 8, 1 << 20][rng.below(4)])
                    }
                };
                if wide {
                    v[p..p + 8].copy_from_slice(&x.to_le_bytes());
                } else {
                    v[p..p + 4].copy_from_slice(&(x as u32).to_le_bytes());
                }
            }
        }
        7 if len > 0 => v.truncate(rng.below(len)),
        8 if len > 0 => {
            // A run of one byte (deep nesting, long strings, many separators).
            let p = pos(rng, len + 1).min(len);
            let b = INTERESTING[rng.below(INTERESTING.len())];
            let n = [8, 200, 5000][rng.below(3)];
            v.splice(p..p, std::iter::repeat_n(b, n));
        }
        9 => json_number(rng, v),
        10 => json_structure(rng, v),
        _ => {}
    }
}

/// Replaces one number of the text with an extreme one.
fn json_number(rng: &mut Rng, v: &mut Vec<u8>) {
    let starts: Vec<usize> = (0..v.len()).filter(|&i| v[i].is_ascii_digit() && (i == 0 || !v[i - 1].is_ascii_alphanumeric() && v[i - 1] != b'.')).collect();
    if starts.is_empty() {
        return;
    }
    let a = starts[rng.below(starts.len())];
    let mut b = a;
    while b < v.len() && (v[b].is_ascii_digit() || matches!(v[b], b'.' | b'e' | b'E' | b'+' | b'-')) {
        b += 1;
    }
    let n = EXTREME_NUMBERS[rng.below(EXTREME_NUMBERS.len())];
    v.splice(a..b, n.bytes());
}

/// A structural edit: a string emptied or made long, a bracket dropped, a member repeated,
/// or a value wrapped in deep nesting.
fn json_structure(rng: &mut Rng, v: &mut Vec<u8>) {
    let quotes: Vec<usize> = (0..v.len()).filter(|&i| v[i] == b'"').collect();
    match rng.below(4) {
        0 if quotes.len() >= 2 => {
            let q = rng.below(quotes.len() - 1);
            let (a, b) = (quotes[q] + 1, quotes[q + 1]);
            if rng.chance(2) {
                v.drain(a..b);
            } else {
                v.splice(a..a, std::iter::repeat_n(b'x', 70_000));
            }
        }
        1 => {
            let brackets: Vec<usize> = (0..v.len()).filter(|&i| matches!(v[i], b'{' | b'}' | b'[' | b']')).collect();
            if !brackets.is_empty() {
                v.remove(brackets[rng.below(brackets.len())]);
            }
        }
        2 => {
            let commas: Vec<usize> = (0..v.len()).filter(|&i| v[i] == b',').collect();
            if commas.len() >= 2 {
                let c = rng.below(commas.len() - 1);
                let chunk = v[commas[c]..commas[c + 1]].to_vec();
                v.splice(commas[c]..commas[c], chunk);
            }
        }
        _ => {
            let colons: Vec<usize> = (0..v.len()).filter(|&i| v[i] == b':').collect();
            if !colons.is_empty() {
                let p = colons[rng.below(colons.len())] + 1;
                let d = [3, 100, 129, 1000][rng.below(4)];
                v.splice(p..p, std::iter::repeat_n(b'[', d));
            }
        }
    }
}

/// What one execution found wrong (a panic, a broken invariant).
pub struct Finding {
    pub what: String,
    pub saved: PathBuf,
}

/// A finished run of one target.
pub struct Report {
    pub target: &'static str,
    pub execs: u64,
    pub seconds: f64,
    pub corpus: usize,
    pub findings: Vec<Finding>,
    pub peak_heap: u64,
    pub errors: u64,
}

/// The result of one input: Ok(()) when it was accepted or refused cleanly (an error that
/// names the file), Err(what) when an invariant broke.
pub type Outcome = Result<(), String>;

/// The fuzzing time per target: `FUZZ_SECONDS` (the long mode of `make fuzz`), else `short`.
pub fn seconds(short: f64) -> f64 {
    std::env::var("FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(short)
}

/// The mutation seed: `FUZZ_SEED` (`make fuzz` gives each long run its own, from the clock),
/// else 0, the short pass's fixed sequence. Mutations depend on nothing but the seed and the
/// corpus, so two runs with the same seed try the same inputs in the same order: executions
/// add up across runs only when their seeds differ.
pub fn seed() -> u64 {
    std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Runs `target` over the regression inputs, then mutated inputs for `secs` seconds; `exec`
/// returns the outcome and the peak heap bytes it saw (0 when not measured).
pub fn run(target: &'static str, corpus: Vec<Vec<u8>>, shape: Shape, secs: f64, mut exec: impl FnMut(&[u8]) -> (Outcome, u64, bool)) -> Report {
    assert!(!corpus.is_empty(), "{target}: empty seed corpus");
    let out_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/fuzz").join(target);
    let regressions = regression_inputs(target);
    let started = Instant::now();
    let current = Arc::new(AtomicU64::new(u64::MAX));
    let current_input = Arc::new(std::sync::Mutex::new(Vec::new()));
    let watchdog = watchdog(target, Arc::clone(&current), Arc::clone(&current_input), out_dir.clone(), started);
    let seed = seed();
    // Seed 0 keeps the sequence every earlier run of the short pass tried.
    let mut rng = Rng::new(target.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3)) ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let mut report = Report { target, execs: 0, seconds: 0.0, corpus: corpus.len(), findings: Vec::new(), peak_heap: 0, errors: 0 };
    let mut i = 0usize;
    loop {
        let input = if i < regressions.len() {
            regressions[i].clone()
        } else if i < regressions.len() + corpus.len() {
            corpus[i - regressions.len()].clone()
        } else if started.elapsed().as_secs_f64() < secs {
            mutate(&mut rng, &corpus, shape)
        } else {
            break;
        };
        i += 1;
        // The watchdog holds a copy: a hang aborts the process, and it saves the input first.
        if let Ok(mut c) = current_input.lock() {
            c.clear();
            c.extend_from_slice(&input);
        }
        current.store(started.elapsed().as_millis() as u64, Relaxed);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exec(&input)));
        current.store(u64::MAX, Relaxed);
        report.execs += 1;
        let broke = match result {
            Ok((Ok(()), peak, was_error)) => {
                report.peak_heap = report.peak_heap.max(peak);
                report.errors += was_error as u64;
                None
            }
            Ok((Err(what), _, _)) => Some(what),
            Err(p) => Some(format!("panic: {}", p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default())),
        };
        if let Some(what) = broke {
            std::fs::create_dir_all(&out_dir).unwrap();
            let saved = out_dir.join(format!("finding-{}", report.findings.len()));
            std::fs::write(&saved, &input).unwrap();
            eprintln!("fuzz {target}: {what} (input saved to {})", saved.display());
            report.findings.push(Finding { what, saved });
            if report.findings.len() >= 10 {
                break;
            }
        }
    }
    drop(watchdog);
    current.store(u64::MAX - 1, Relaxed);
    report.seconds = started.elapsed().as_secs_f64();
    println!("fuzz {target}: {} execs in {:.1} s ({} seeds, {} regression inputs, mutation seed {seed}), {} refused with an error, peak heap {:.1} MiB, {} findings",
        report.execs, report.seconds, report.corpus, regressions.len(), report.errors, report.peak_heap as f64 / (1 << 20) as f64, report.findings.len());
    report
}

/// The saved inputs of `tests/fixtures/fuzz/<target>/`, in name order.
fn regression_inputs(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// A thread that aborts the process when one input has run longer than [`TIME_LIMIT`]
/// (`current` holds the input's start in ms since `started`; u64::MAX when idle, MAX-1 to
/// stop), saving that input as `dir/hang` first.
fn watchdog(target: &'static str, current: Arc<AtomicU64>, input: Arc<std::sync::Mutex<Vec<u8>>>, dir: PathBuf, started: Instant) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(200));
        match current.load(Relaxed) {
            u64::MAX => {}
            x if x == u64::MAX - 1 => return,
            at => {
                if started.elapsed().as_millis() as u64 > at + TIME_LIMIT.as_millis() as u64 {
                    let saved = dir.join("hang");
                    let _ = std::fs::create_dir_all(&dir);
                    // The test thread is stuck inside the target, not holding the lock.
                    if let Ok(bytes) = input.lock() {
                        let _ = std::fs::write(&saved, &*bytes);
                    }
                    eprintln!("fuzz {target}: an input ran past {TIME_LIMIT:?}: a hang (saved in {})", saved.display());
                    std::process::abort();
                }
            }
        }
    })
}

/// Checks that an error message names `file` (its file name).
pub fn names_file(err: &str, file: &Path) -> Outcome {
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if err.contains(&name) { Ok(()) } else { Err(format!("the error does not name {name}: {err}")) }
}
