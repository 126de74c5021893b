//! `waste bench matmul`: prints what `waste::kernels::bench::matmul` measures.

use super::args::{flag, val, Args, Command};
use super::commands::Failure;
use super::out::outln;
use super::HELP_OPT;
use waste::format::dtype::DType;
use waste::format::json::Json;
use waste::kernels::bench::{self, MatmulBench};
use waste::kernels::{CpuList, Isa, Prefetch, TokenGroups};
use waste::Activations;

pub const BENCH_MATMUL: Command = Command {
    name: "bench matmul",
    usage: "bench matmul [--rows R] [--cols C] [--tokens N] [--threads N] [--cpus LIST] [--isa NAME] [--prefetch NAME] [--token-groups NAME] [--int8-act | --int16-act | --int21-act] [--experts] [--json]",
    about: "Time the matrix x vector kernels without a model: for every dtype (F32, BF16, F16, Q8B32, Q4B32) at \
1 and N threads, GB/s of weight bytes streamed as a fraction of the read bandwidth (a SIMD sum over a buffer \
far larger than the last-level cache), and GMAC/s (1e9 multiply-adds per second) as a fraction of the \
multiply-add peak (a loop of independent f32 FMAs, or of the int8 path's integer multiply-adds for Q8B32 and \
Q4B32 with --int8-act); and the pool's dispatch latency. By default each matrix is 1 GiB (8192 columns, rows \
to fit).",
    opts: &[&[
        val("rows", "R", "rows per matrix (default: sized to 1 GiB per dtype)"),
        val("cols", "C", "columns, a multiple of 32 (default 8192)"),
        val("threads", "N", "the larger thread count (default: one per available CPU, or per listed CPU)"),
        val("cpus", "LIST", "bind the pool to these CPUs (Linux cpu list: 3, 0-5, 0-2,6-8, 0-7:2, 0-15:2/4, 4-N, all)"),
        val("isa", "NAME", "kernels: scalar, avx2, avx512, amx (AVX-512 and AMX tiles), neon (default: the best this CPU has)"),
        val("prefetch", "NAME", "decode tiles' prefetch: tile-after-next, own-rows (default: the one chosen for this CPU)"),
        val("token-groups", "NAME", "AVX-512 prefill GEMM's token groups: fit-l2, whole (default: the rule chosen for this CPU)"),
        val("passes", "N", "timed passes per figure; the median is printed (default 5)"),
        val("tokens", "N", "vectors per product: 1 is decode (default), more a prefill chunk (GMAC/s printed too)"),
        val("bytes", "SIZE", "bytes of the read-bandwidth buffer and of each matrix without --rows (default 1G)"),
        val("dtype", "LIST", "comma-separated dtypes to measure (default: the five above; F8B32 and MXFP4 on request)"),
        flag("int8-act", "Q8B32 and Q4B32 with int8 activations (the input's quantization is timed too)"),
        flag("int16-act", "Q8B32 and Q4B32 with int16 activations (the input's quantization is timed too)"),
        flag("int21-act", "Q4B32 with int21 activations (the input's quantization is timed too)"),
        flag("experts", "expert-shaped products: --bytes of matrices of --rows rows, each thread multiplying whole ones in turn, as an MoE step"),
        flag("json", "print JSON"),
    ], HELP_OPT],
    positionals: &[],
};

fn options(a: &Args) -> Result<MatmulBench, Failure> {
    let mut o = MatmulBench::default();
    if let Some(c) = a.value("cpus") {
        o.cpus = Some(CpuList::parse(c)?);
    }
    o.threads = match (a.num("threads", 0usize, 1024)?, &o.cpus) {
        (Some(t), _) if t > 0 => t,
        (_, Some(list)) => list.len(),
        _ => waste::host::available_cpus(),
    };
    o.rows = a.num("rows", 1usize, 1 << 30)?;
    if let Some(c) = a.num("cols", 32usize, 1 << 20)? {
        o.cols = c;
    }
    if let Some(p) = a.num("passes", 1usize, 1000)? {
        o.passes = p;
    }
    if let Some(t) = a.num("tokens", 1usize, 4096)? {
        o.tokens = t;
    }
    if let Some(b) = a.size("bytes", 4096, 1 << 40)? {
        o.bytes = b as usize;
    }
    o.isa = super::commands::isa(a)?;
    if let Some(name) = a.value("prefetch") {
        o.prefetch = Some(Prefetch::from_name(name).ok_or_else(|| Failure::Usage(format!(
            "option `--prefetch`: `{name}` is not one of tile-after-next, own-rows")))?);
    }
    if let Some(name) = a.value("token-groups") {
        o.token_groups = Some(TokenGroups::from_name(name).ok_or_else(|| Failure::Usage(format!(
            "option `--token-groups`: `{name}` is not one of fit-l2, whole")))?);
    }
    o.activations = super::commands::activations(a)?;
    o.experts = a.flag("experts");
    if let Some(list) = a.value("dtype") {
        o.dtypes = list
            .split(',')
            .map(|d| match d.trim().to_ascii_uppercase().as_str() {
                // A record-only encoding that no safetensors header may name.
                "MXFP4" => Ok(DType::MXFP4),
                name => match DType::from_name(name) {
                    Some(t) if t.is_compute() => Ok(t),
                    _ => Err(Failure::Usage(format!("option `--dtype`: `{d}` is not one of F32, BF16, F16, Q8B32, Q4B32, F8B32, MXFP4"))),
                },
            })
            .collect::<Result<_, _>>()?;
    }
    Ok(o)
}

pub fn run(a: &Args) -> Result<(), Failure> {
    let opts = options(a)?;
    let r = bench::matmul(&opts)?;
    if a.flag("json") {
        let rates = |v: &[bench::Rate]| Json::Array(v.iter().map(|x| Json::object([
            ("threads", Json::uint(x.threads as u64)),
            ("secs", Json::float(x.secs)),
            ("gb_per_s", Json::float(x.gb_per_s)),
            ("gmac_per_s", Json::float(x.gmac_per_s)),
        ])).collect());
        // Each path's key names its kernels when the products ran through it, else null.
        let path_kernels = |path: Activations| match r.integer {
            Some((on, i)) if on == path => Json::str(i.kernels_name()),
            _ => Json::Null,
        };
        let doc = Json::object([
            ("isa", Json::str(r.isa.name())),
            ("prefetch", Json::str(r.prefetch.name())),
            ("token_groups", Json::str(r.token_groups.name())),
            ("int8_activations", path_kernels(Activations::Int8)),
            ("int16_activations", path_kernels(Activations::Int16)),
            ("int21_activations", path_kernels(Activations::Int21)),
            ("cpus", r.cpus.as_ref().map_or(Json::Null, |c| Json::str(c.to_string()))),
            ("passes", Json::uint(r.passes as u64)),
            ("tokens", Json::uint(r.tokens as u64)),
            ("read_bytes", Json::uint(r.read_bytes as u64)),
            ("read", rates(&r.read)),
            ("dispatch_us", Json::Array(r.dispatch_us.iter().map(|&d| Json::float(d)).collect())),
            ("fma_peak", rates(&r.fma_peak)),
            ("int8_peak", rates(&r.int8_peak)),
            ("int16_peak", rates(&r.int16_peak)),
            ("dtypes", Json::Array(r.dtypes.iter().map(|d| Json::object([
                ("dtype", Json::str(d.dtype.name())),
                ("rows", Json::uint(d.rows as u64)),
                ("cols", Json::uint(d.cols as u64)),
                ("bytes", Json::uint(d.bytes as u64)),
                ("rates", rates(&d.rates)),
                ("read", rates(&d.read)),
            ])).collect())),
        ]);
        outln!("{}", doc.to_string_pretty());
        return Ok(());
    }
    let cpus = r.cpus.as_ref().map_or("unbound".to_string(), |c| format!("cpus {c}"));
    let int8 = match r.integer {
        Some((Activations::Int21, i)) => format!(" (Q4B32: int21 activations, {} kernels)", i.kernels_name()),
        Some((path, i)) => format!(" (Q8B32, Q4B32: {} activations, {} kernels)", path.name(), i.kernels_name()),
        None => String::new(),
    };
    let tokens = if r.tokens > 1 { format!(", {} vectors per product", r.tokens) } else { String::new() };
    let prefetch = match r.isa {
        Isa::Avx512 => format!(" (prefetch {}, token groups {})", r.prefetch.name(), r.token_groups.name()),
        Isa::Avx2 | Isa::Amx => format!(" (prefetch {})", r.prefetch.name()),
        _ => String::new(),
    };
    outln!("bench matmul: {} kernels{prefetch}{int8}, {cpus}, median of {} passes{tokens}; GB = 1e9 bytes, GMAC = 1e9 multiply-adds", r.isa.name(), r.passes);
    outln!("(each dtype: GB/s of weights and % of the read bandwidth, probed in alternation with its passes when its matrices are half the probe's size or more; GMAC/s and % of the multiply-add peak)");
    const CELL: usize = 40;
    let mut head = format!("{:<34}", "threads");
    for t in &r.threads {
        head.push_str(&format!("{:>CELL$}", t));
    }
    outln!("{head}");
    let size = if r.read_bytes >= 1 << 20 { format!("{} MiB", r.read_bytes >> 20) } else { format!("{} KiB", r.read_bytes >> 10) };
    let mut line = format!("{:<34}", format!("read bandwidth ({size} sum)"));
    for x in &r.read {
        line.push_str(&format!("{:>CELL$}", format!("{:.2} GB/s", x.gb_per_s)));
    }
    outln!("{line}");
    for (what, peak) in [("f32 FMA peak", &r.fma_peak), ("int8 multiply-add peak", &r.int8_peak), ("int16 multiply-add peak", &r.int16_peak)] {
        if peak.is_empty() {
            continue;
        }
        let mut line = format!("{:<34}", what);
        for x in peak.iter() {
            line.push_str(&format!("{:>CELL$}", format!("{:.1} GMAC/s", x.gmac_per_s)));
        }
        outln!("{line}");
    }
    let mut line = format!("{:<34}", "dispatch (empty region)");
    for (d, t) in r.dispatch_us.iter().zip(&r.threads) {
        // One participant runs the region inline: there is no hand-off to time.
        line.push_str(&if *t == 1 { format!("{:>CELL$}", "inline") } else { format!("{:>CELL$}", format!("{d:.2} us")) });
    }
    outln!("{line}");
    for d in &r.dtypes {
        let mut line = format!("{:<6} {:>7} x {:<6} {:>10} B ", d.dtype.name(), d.rows, d.cols, d.bytes);
        for ((x, read), peak) in d.rates.iter().zip(&d.read).zip(r.peak_for(d.dtype)) {
            line.push_str(&format!("{:>CELL$}", format!("{:.2} GB/s {:>3.0}% {:>6.1} GMAC/s {:>3.0}%", x.gb_per_s,
                100.0 * x.gb_per_s / read.gb_per_s, x.gmac_per_s, 100.0 * x.gmac_per_s / peak.gmac_per_s)));
        }
        outln!("{line}");
    }
    Ok(())
}
