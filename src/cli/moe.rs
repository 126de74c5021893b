//! The mixture-of-experts commands: `convert` (with its progress display) and `bench cache`.

use super::args::Args;
use super::commands::Failure;
use super::out::{err, errln, outln};
use waste::cache::policy::Policy;
use waste::cache::replay::{belady_range, replay_range, Trace};
use waste::tools::convert::{self, ConvertOptions, Encoding, Progress};
use waste::format::json::Json;

/// ` | experts H hit / M miss = P%, R read, W s I/O wait[, disk busy D s at G GB/s]` for the
/// run summary line (the disk's part once it has read anything).
pub fn stats_suffix(s: &waste::CacheStats) -> String {
    format!(" | experts {} hit / {} miss = {:.0}%, {:.1} MiB read, {:.2} s I/O wait{}{}",
        s.hits, s.misses, 100.0 * s.hit_rate(), s.bytes_read as f64 / (1 << 20) as f64, s.io_wait.as_secs_f64(),
        disk_busy(s.disk_busy, s.bytes_read), if s.direct_io { "" } else { ", buffered reads" })
}

/// `, disk busy D s at G GB/s` (the disk's rate while it had work), or nothing when it had none.
pub fn disk_busy(busy: std::time::Duration, bytes: u64) -> String {
    if busy.is_zero() {
        return String::new();
    }
    let secs = busy.as_secs_f64();
    format!(", disk busy {secs:.2} s at {:.2} GB/s", bytes as f64 / secs / 1e9)
}

fn encoding(a: &Args, name: &str) -> Result<Option<Encoding>, Failure> {
    match a.value(name) {
        None => Ok(None),
        Some(v) => Encoding::parse(v).map(Some).ok_or_else(|| Failure::Usage(format!(
            "option `--{name}`: `{v}` is not f32, bf16, f16, q8, q4, fp8 or mxfp4 (the last two experts only)"))),
    }
}

pub fn convert(a: &Args) -> Result<(), Failure> {
    let input = a.path("in").ok_or_else(|| Failure::Usage("missing --in HF_DIR".into()))?;
    let output = a.path("out").ok_or_else(|| Failure::Usage("missing --out DIR".into()))?;
    let mut opts = ConvertOptions::new(input, output);
    if let Some(e) = encoding(a, "trunk")? {
        opts.trunk = e;
    }
    opts.embeddings = encoding(a, "embeddings")?;
    if let Some(e) = encoding(a, "experts")? {
        opts.experts = e;
    }
    let tty = waste::host::stderr_is_tty();
    let mut last_pct = u64::MAX;
    let mut last_file = String::new();
    let start = std::time::Instant::now();
    let mut show = |p: &Progress| {
        let pct = (p.done * 100).checked_div(p.total).unwrap_or(100);
        if tty {
            let bar = "#".repeat((pct / 4) as usize);
            err!("\r[{bar:<25}] {pct:>3}%  {:>8.1} / {:.1} MiB  {:<24}", p.done as f64 / 1048576.0, p.total as f64 / 1048576.0, p.file);
        } else if p.file != last_file || pct / 10 != last_pct / 10 {
            errln!("convert: {pct}% ({} of {} bytes) {}", p.done, p.total, p.file);
        }
        last_pct = pct;
        last_file.clone_from(&p.file);
    };
    let report = convert::convert(&opts, &mut show)?;
    if tty {
        errln!();
    }
    let total: u64 = report.files.iter().map(|f| f.1).sum();
    for (name, size) in &report.files {
        outln!("{size:>14}  {name}");
    }
    outln!("{total:>14}  total ({:.1} s{})", start.elapsed().as_secs_f64(),
        if report.verified_existing { ", already converted: every file verified, none rewritten".to_string() } // wp-container
        else if report.resumed_units > 0 { format!(", resumed {} units", report.resumed_units) } else { String::new() });
    Ok(())
}

pub fn bench_cache(a: &Args) -> Result<(), Failure> {
    let path = a.path("trace").ok_or_else(|| Failure::Usage("missing --trace FILE".into()))?;
    let mut trace = Trace::load(path)?;
    if let Some(e) = a.num("experts", 1usize, Trace::MAX_KEYS / trace.layers)? {
        if e < trace.experts {
            return Err(Failure::Usage(format!("option `--experts`: the trace uses expert id {}", trace.experts - 1)));
        }
        trace.experts = e;
    }
    let keys = trace.keys();
    let top_k = trace.tokens[0].iter().map(Vec::len).max().unwrap_or(1);
    let sizes: Vec<(String, usize)> = match (a.num("slots", 1usize, keys)?, a.value("percent")) {
        (Some(_), Some(_)) => return Err(Failure::Usage("give --slots or --percent, not both".into())),
        (Some(n), None) => vec![(format!("{n} slots"), n)],
        (None, p) => p.unwrap_or("3,6,12,24").split(',').map(|x| {
            let pct: f64 = x.trim().parse().ok().filter(|v: &f64| *v > 0.0 && *v <= 100.0)
                .ok_or_else(|| Failure::Usage(format!("option `--percent`: `{x}` is not a percentage")))?;
            Ok((format!("{pct}%"), ((keys as f64 * pct / 100.0).round() as usize).max(top_k)))
        }).collect::<Result<_, Failure>>()?,
    };
    let half_life = a.num("half-life", 0.01f64, 1e9)?.unwrap_or(Policy::DEFAULT_HALF_LIFE_TOKENS);
    let name = a.value("policy").unwrap_or("reuse");
    let ours = Policy::named(name, half_life, top_k * trace.layers)
        .ok_or_else(|| Failure::Usage(format!("option `--policy`: `{name}` is not reuse, next-use, frequency or lru")))?;
    let counted = token_range(a.value("tokens"), trace.tokens.len())?;
    let mut rows = Vec::new();
    if !a.flag("json") {
        outln!("trace {}: {} tokens, {} layers x {} experts, top-{top_k}; counting tokens {}..{}", path.display(), trace.tokens.len(),
            trace.layers, trace.experts, counted.start, counted.end);
        outln!("{:>10} {:>7} {:>10} {:>8} {:>8}", "cache", "slots", name, "LRU", "Belady");
    }
    for (label, slots) in sizes {
        let (hits, misses) = replay_range(&trace, slots, ours, counted.clone());
        let f = hits as f64 / (hits + misses).max(1) as f64;
        let (lh, lm) = replay_range(&trace, slots, Policy::Lru, counted.clone());
        let (l, b) = (lh as f64 / (lh + lm).max(1) as f64, belady_range(&trace, slots, counted.clone()));
        if a.flag("json") {
            rows.push(Json::object([("cache", Json::str(label)), ("slots", Json::uint(slots as u64)),
                ("policy", Json::float(f)), ("hits", Json::uint(hits)), ("misses", Json::uint(misses)), ("lru", Json::float(l)), ("belady", Json::float(b))]));
        } else {
            outln!("{label:>10} {slots:>7} {:>9.1}% {:>7.1}% {:>7.1}%", 100.0 * f, 100.0 * l, 100.0 * b);
        }
    }
    if a.flag("json") {
        outln!("{}", Json::Array(rows).to_string_pretty());
    }
    Ok(())
}

/// `--tokens A..B`: the tokens whose lookups are counted (the cache runs from token 0 and
/// stops at B); `A..` runs to the end, absent counts every token.
fn token_range(value: Option<&str>, tokens: usize) -> Result<std::ops::Range<usize>, Failure> {
    let Some(v) = value else { return Ok(0..tokens) };
    let bad = || Failure::Usage(format!("option `--tokens`: `{v}` is not A..B with A < B <= {tokens} (the trace's tokens)"));
    let (a, b) = v.split_once("..").ok_or_else(bad)?;
    let a: usize = if a.trim().is_empty() { 0 } else { a.trim().parse().map_err(|_| bad())? };
    let b: usize = if b.trim().is_empty() { tokens } else { b.trim().parse().map_err(|_| bad())? };
    if a >= b || b > tokens {
        return Err(bad());
    }
    Ok(a..b)
}

pub fn bench_disk(a: &Args) -> Result<(), Failure> {
    let file = a.positional_path(0).ok_or_else(|| Failure::Usage("missing FILE".into()))?;
    let record = a.size("record", 1, 1 << 40)?.unwrap_or(4 << 20) as usize;
    let limit = a.size("limit", 1, u64::MAX)?.unwrap_or(4 << 30);
    let threads = a.num("threads", 1usize, 256)?.unwrap_or(4);
    let r = waste::cache::disk::bench_disk(file, record, threads, limit)?;
    outln!("disk {}: {} reads of {} bytes, {} in flight, {}", file.display(), r.bytes / r.record_bytes as u64, r.record_bytes, r.threads,
        if r.direct { "O_DIRECT" } else { "buffered (O_DIRECT refused), pages dropped" });
    outln!("read {:.2} GB/s ({} bytes in {:.2} s)", r.gb_per_s(), r.bytes, r.seconds);
    Ok(())
}
