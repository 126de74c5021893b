//! Every allocation is accounted, checked by the allocator itself: this test binary counts
//! every byte allocated and freed (a global allocator over the system's), and the
//! measurements are compared with what the model reports.
//!
//! - What `Model::open` leaves allocated is what `memory_use()` reports on the heap (the
//!   expert-cache slots are one mapping and the threads are counted at their constant, so
//!   both are outside the heap), give or take the model's small fixed metadata.
//! - The peak while opening (the tokenizer's load, the checkpoint headers) stays under the
//!   floor, so the budget also bounds what opening holds for a moment.
//! - A decode step allocates nothing, and neither does a sampled token.
//! - Turns of a conversation (a growing prompt continuing the session, sampled replies, a
//!   reset now and then) leave the heap where they found it: a long chat's RSS stays flat.
//!
//! One test function: the counters are process-wide, so nothing else may run beside it.

mod common;
use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use waste::{Model, Options};

struct Counting;

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

fn grew(n: usize) {
    let now = LIVE.fetch_add(n as u64, Relaxed) + n as u64;
    PEAK.fetch_max(now, Relaxed);
    ALLOCS.fetch_add(1, Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(l);
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        LIVE.fetch_sub(l.size() as u64, Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let q = System.realloc(p, l, n);
        if !q.is_null() {
            LIVE.fetch_sub(l.size() as u64, Relaxed);
            grew(n);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What the model holds outside the heap: its expert-cache slots' buffers (one anonymous
/// mapping; a slot's bookkeeping and queue places are on the heap) and its threads (counted at
/// their constant).
fn off_heap(m: &Model, opts: &Options) -> u64 {
    use waste::cache::ExpertShape;
    let threads = (m.info().threads as u64 - 1) + if m.cache_stats().is_some() { opts.io_threads as u64 } else { 0 };
    let queue = if opts.io_threads > 0 { ExpertShape::QUEUE_BYTES } else { 0 };
    let slots = m.cache_stats().map_or(0, |s| s.slots as u64 * (m.plan().expert_slot_bytes - ExpertShape::SLOT_BOOKKEEPING - queue));
    threads * waste::kernels::pool::THREAD_BYTES + slots
}

#[test]
fn the_allocator_sees_what_the_model_reports() {
    let mut models: Vec<PathBuf> = std::fs::read_dir(fixture("oracles")).unwrap()
        .map(|e| e.unwrap().path().join("model")).filter(|p| p.join("config.json").is_file()).collect();
    models.sort();
    models.push(root().join("models/stories260K"));
    let container = temp_dir("accounting").join("c");
    let src = fixture("oracles/qwen3_moe_f32/model");
    waste::tools::convert::convert(&waste::tools::convert::ConvertOptions::new(&src, &container), &mut |_| {}).unwrap();
    models.push(container.clone());
    // A model with a tokenizer.json: the Llama 3 fixture next to the Llama 3 test vocabulary.
    let with_tok = temp_dir("accounting-tok").join("m");
    std::fs::create_dir_all(&with_tok).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(&format!("oracles/llama3_f32/model/{f}")), with_tok.join(f)).unwrap();
    }
    std::fs::copy(fixture("tokenizers/hf/llama3.json"), with_tok.join("tokenizer.json")).unwrap();
    models.push(with_tok);
    for dir in &models {
        for opts in [Options { ctx: 48, threads: 2, ..Options::default() }, Options { ctx: 20, threads: 1, io_threads: 0, prefill_chunk: 4, ..Options::default() }] {
            let what = format!("{} with {opts:?}", dir.display());
            let before = LIVE.load(Relaxed);
            PEAK.store(before, Relaxed);
            let mut m = Model::open(dir, &opts).unwrap();
            let (held, peak) = (LIVE.load(Relaxed) - before, PEAK.load(Relaxed) - before);
            let used = m.memory_use();
            let allowance = waste::model::plan::metadata_bytes(m.info().layers);
            let reported = used.total() - off_heap(&m, &opts) - allowance;
            println!("{what}: allocator {held} bytes held after open (peak {peak}), the model reports {reported} on the heap");
            // Everything reported was allocated; what was allocated and not reported is the
            // model's fixed metadata (config, layer structs, paths, handles), which the plan
            // counts at a constant.
            assert!(held >= reported, "reported {reported} > allocated {held}: {what}");
            assert!(held - reported <= allowance, "{} bytes of metadata, over the {allowance} counted: {what}", held - reported);
            // Opening never holds more than the floor, even for a moment.
            assert!(peak <= m.plan().floor_bytes(), "peak while opening {peak} > floor {}: {what}", m.plan().floor_bytes());

            // Decoding allocates nothing, with inline reads or through the I/O threads (whose
            // queues are sized when they start).
            m.eval(&[1, 2, 3]).unwrap();
            let (allocs, live) = (ALLOCS.load(Relaxed), LIVE.load(Relaxed));
            for t in 0..8 {
                m.eval(&[4 + t]).unwrap();
            }
            assert_eq!(ALLOCS.load(Relaxed), allocs, "a decode step allocated: {what}");
            assert!(LIVE.load(Relaxed) <= live + 16 * 1024, "decoding grew the heap: {what}");
            // Streaming every position's logits holds nothing of size positions x vocab.
            m.reset();
            let vocab = m_vocab(dir);
            let live = LIVE.load(Relaxed);
            PEAK.store(live, Relaxed);
            let prompt: Vec<u32> = (1..17).collect();
            let mut rows = 0;
            m.eval_each(&prompt, |_, l| {
                rows += 1;
                assert_eq!(l.len(), vocab);
                Ok(())
            }).unwrap();
            assert_eq!(rows, prompt.len());
            assert!(PEAK.load(Relaxed) - live <= 4096, "eval_each allocated {} bytes: {what}", PEAK.load(Relaxed) - live);
            drop(m);
        }
    }
    conversations_leave_the_heap_where_they_found_it(&container);

    // A sampled token allocates nothing once the buffers are sized.
    let vocab = 4096;
    let logits: Vec<f32> = (0..vocab).map(|i| ((i * 31) % 97) as f32 / 10.0).collect();
    let params = waste::SamplingParams { temperature: 0.7, repeat_penalty: 1.2, seed: 5, ..waste::SamplingParams::default() };
    let mut s = waste::Sampler::with_buffers(&params, waste::SampleBuffers::new(vocab)).unwrap();
    let history: Vec<u32> = (0..100).collect();
    let allocs = ALLOCS.load(Relaxed);
    for _ in 0..50 {
        s.sample(&logits, &history);
    }
    assert_eq!(ALLOCS.load(Relaxed), allocs, "sampling allocated");
}

fn m_vocab(dir: &std::path::Path) -> usize {
    let cfg = if waste::format::container::is_container(dir) {
        waste::format::container::Manifest::open(dir).unwrap().config
    } else {
        waste::format::config::ModelConfig::load(dir).unwrap()
    };
    cfg.vocab
}

/// Cycles of a conversation as `waste chat` drives one (docs/RELIABILITY.md, the soak): a
/// growing prompt continuing the session, a sampled reply, a reset every four turns. After the
/// first cycle has sized every buffer, each cycle must end with the heap as the first left it.
/// The MoE container streams its experts with I/O threads; stories260K tokenizes its prompts.
fn conversations_leave_the_heap_where_they_found_it(container: &std::path::Path) {
    for dir in [container.to_path_buf(), root().join("models/stories260K")] {
        let dir = &dir;
        let mut m = Model::open(dir, &Options { ctx: 160, threads: 2, ..Options::default() }).unwrap();
        let params = waste::GenerateParams { max_tokens: 6, stop_at_eos: false,
            sampling: waste::SamplingParams { temperature: 0.8, seed: 7, ..waste::SamplingParams::default() }, ..waste::GenerateParams::default() };
        let tokenizer = m.tokenize_prompt("a").is_ok();
        // Sized before the first cycle: the record must not allocate as it grows.
        let mut live = Vec::with_capacity(12);
        for cycle in 0..12u32 {
            let mut ids = vec![1u32];
            for turn in 0..4u32 {
                if tokenizer {
                    ids.extend(m.tokenize_prompt(&format!(" Turn {turn} of cycle {cycle}: and then?")).unwrap());
                } else {
                    ids.extend([5 + turn, 9 + cycle]);
                }
                // The reply's text is collected, as chat prints it.
                let mut text = String::new();
                let s = m.generate(&ids, &waste::GenerateParams { sampling: waste::SamplingParams { seed: (cycle * 4 + turn).into(), ..params.sampling.clone() }, ..params.clone() },
                    |ev| { text.push_str(ev.text); true }).unwrap();
                ids.extend(&s.ids);
            }
            m.reset();
            live.push(LIVE.load(Relaxed));
        }
        println!("{}: heap after each cycle of 4 turns: {live:?}", dir.display());
        // The first cycle sizes what is kept, and nothing grows from cycle to cycle: to the
        // byte, but for a buffer that keeps the longest prompt text seen (stories260K: +32
        // bytes once, when the cycle number in the prompt gets its second digit).
        assert!(live[1..].iter().all(|&l| l <= live[1] + 64), "the heap grew over the turns of {}: {live:?}", dir.display());
    }
}
