//! `waste bench attention`: prints what `waste::kernels::bench::attention` measures.

use super::args::{val, Args, Command};
use super::commands::Failure;
use super::out::outln;
use super::HELP_OPT;
use waste::kernels::bench::{self, AttentionBench};

pub const BENCH_ATTENTION: Command = Command {
    name: "bench attention",
    usage: "bench attention [--heads G] [--kv-heads N] [--head-dim D] [--keys LIST] [--isa NAME] [--passes N]",
    about: "Time the attention kernels without a model, on one thread: one query token's scores and weighted \
sums over the cached keys and values of a grouped-query group, head by head and grouped (each key and value \
read once for the group's heads), in microseconds per group and GMAC/s. The default shape is Llama-3.2-1B's.",
    opts: &[&[
        val("heads", "G", "query heads per key-value head (default 4)"),
        val("kv-heads", "N", "key-value heads: the cache row is N x D floats (default 8)"),
        val("head-dim", "D", "floats per head (default 64)"),
        val("keys", "LIST", "comma-separated cached positions, one figure each (default 512,2048,8192)"),
        val("isa", "NAME", "kernels: scalar, avx2, avx512, amx (AVX-512 and AMX tiles), neon (default: the best this CPU has)"),
        val("passes", "N", "timed passes per figure; the median is printed (default 5)"),
    ], HELP_OPT],
    positionals: &[],
};

fn options(a: &Args) -> Result<AttentionBench, Failure> {
    let mut o = AttentionBench::default();
    if let Some(g) = a.num("heads", 1usize, 64)? {
        o.heads = g;
    }
    if let Some(n) = a.num("kv-heads", 1usize, 256)? {
        o.kv_heads = n;
    }
    if let Some(d) = a.num("head-dim", 1usize, 1024)? {
        o.head_dim = d;
    }
    if let Some(p) = a.num("passes", 1usize, 1000)? {
        o.passes = p;
    }
    if let Some(list) = a.value("keys") {
        o.keys = list.split(',').map(|k| k.trim().parse::<usize>().ok().filter(|&k| k > 0).ok_or_else(|| Failure::Usage(format!(
            "option `--keys`: `{k}` is not a positive count")))).collect::<Result<_, _>>()?;
    }
    o.isa = super::commands::isa(a)?;
    Ok(o)
}

pub fn run(a: &Args) -> Result<(), Failure> {
    let opts = options(a)?;
    let r = bench::attention(&opts)?;
    outln!("bench attention: {} kernels, one thread, {} query heads per key-value head, {} key-value heads, {} floats a head; \
median of {} passes", r.isa.name(), opts.heads, opts.kv_heads, opts.head_dim, opts.passes);
    outln!("{:>8}  scores: per head -> grouped | weighted sums: per head -> grouped", "keys");
    let macs = |keys: usize| (opts.heads * keys * opts.head_dim) as f64;
    for row in &r.rows {
        let fig = |secs: f64| format!("{:.2} us {:.1} GMAC/s", secs * 1e6, macs(row.keys) / secs.max(1e-12) / 1e9);
        outln!("{:>8}  {} -> {} | {} -> {}", row.keys, fig(row.scores_per_head), fig(row.scores_grouped), fig(row.mix_per_head), fig(row.mix_grouped));
    }
    Ok(())
}
