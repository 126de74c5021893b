//! `waste plan`: prints a model's memory plan (seed 001 §3) — the floor, the recommendation,
//! what a budget leaves for the expert cache — next to the RAM this machine can give it.

use super::args::{flag, val, Args, Command};
use super::commands::{model_options, model_path, Failure};
use super::out::{errln, outln};
use super::HELP_OPT;
use waste::format::json::Json;
use waste::model::plan::ModelKind;
use waste::{BudgetSource, MemoryPlan, RamReading};

pub const PLAN: Command = Command {
    name: "plan",
    usage: "plan MODEL [--budget SIZE] [--ctx N] [--sessions N] [--threads N | --cpus LIST] [--chunk N] [--f32-act | --int8-act | --int16-act | --int21-act] [--cache SIZE] [--json]",
    about: "Show the RAM a model needs: its floor (trunk, state and KV cache, scratch, tokenizer, minimum expert cache), \
the recommended budget, and the expert cache a budget leaves; plus this machine's physical and usable RAM \
(usable = physical, or the cgroup memory limit when smaller; physical from /proc/meminfo, or sysinfo(2) where it does not exist). Reads headers only, no weights. \
Takes every option run, eval and bench take, so the same options show the plan of that run.",
    opts: &[&[
        val("budget", "SIZE", "RAM budget: bytes, or K, M, G or T, optionally with i and B, in binary units: 1K = 1024, 4G = 4Gi = 4GiB = 4GB"),
        val("ctx", "N", "context length in tokens (default: the model's, at most 4096)"),
        val("threads", "N", "compute threads, which size the scratch (default: one per available CPU, or per CPU of --cpus)"),
        val("cpus", "LIST", "the CPUs a run binds to: one compute thread each unless --threads says otherwise"),
        val("chunk", "N", "prefill chunk: tokens per forward pass (default: 128, or 512 when experts stream past the cache, or all fit it with AMX tiles)"),
        flag("f32-act", "f32 activations everywhere (no int21 decode buffer where the default decodes with int21)"),
        flag("int8-act", "count the int8-activation path's buffer"),
        flag("int16-act", "count the int16-activation path's buffer"),
        flag("int21-act", "count the int21-activation path's buffer"),
        val("cache", "SIZE", "expert cache for a container, within the budget: bytes or K/M/G/T"),
        val("io-threads", "N", "threads reading expert records (default 4)"),
        val("sessions", "N", "conversations held at once (a server's slots): each keeps its state for the whole context (default 1)"),
        flag("scalar", "accepted for a run's command line; does not change the plan"),
        val("isa", "NAME", "plan for these kernels (scalar, avx2, avx512, amx, neon): only the AVX-512 and AMX ones hold a split-input buffer"),
        flag("no-tiles", "count the AVX-512 kernels' split-input buffer instead of the AMX tiles' (half as large again)"),
        flag("verify", "accepted for a run's command line; does not change the plan"),
        flag("lookahead", "accepted for a run's command line; does not change the plan"),
        flag("no-lookahead", "accepted for a run's command line; does not change the plan"),
        flag("purgeable", "accepted for a run's command line; does not change the plan"),
        flag("no-huge-pages", "accepted for a run's command line; does not change the plan"),
        flag("json", "print JSON"),
    ], HELP_OPT],
    positionals: &["MODEL"],
};

pub fn run(a: &Args) -> Result<(), Failure> {
    let opts = model_options(a)?;
    let path = model_path(a)?;
    let plan = waste::plan_memory(path, &opts)?;
    let ram = waste::host::read_ram()?;
    // An explicit budget under the floor fails here, before anything else is printed.
    let chosen = plan.budget_for(ram.usable_bytes, &opts)?;
    if a.flag("json") {
        let mut m = vec![
            ("trunk_bytes", plan.trunk_bytes),
            ("embeddings_on_disk_bytes", plan.embeddings_on_disk_bytes),
            ("state_bytes", plan.state_bytes),
            ("sessions", plan.sessions as u64),
            ("prefill_chunk", plan.prefill_chunk as u64),
            ("session_bytes", plan.session_bytes),
            ("scratch_bytes", plan.scratch_bytes),
            ("tokenizer_bytes", plan.tokenizer_bytes),
            ("min_expert_cache_bytes", plan.min_expert_cache_bytes),
            ("open_extra_bytes", plan.open_extra_bytes),
            ("floor_bytes", plan.floor_bytes()),
            ("working_set_bytes", plan.working_set_bytes),
            ("recommended_bytes", plan.recommended_bytes()),
            ("physical_ram_bytes", ram.physical_bytes),
            ("usable_ram_bytes", ram.usable_bytes),
        ];
        if opts.budget.is_some() || chosen.source == BudgetSource::Cache {
            m.push(("budget_bytes", chosen.bytes));
            m.push(("expert_cache_bytes", chosen.expert_cache_bytes));
        }
        outln!("{}", Json::object(m.into_iter().map(|(k, v)| (k, Json::uint(v)))).to_string_pretty());
    } else {
        print_table(path, &plan, &ram, &chosen, opts.prefill_chunk == 0)?;
    }
    if let Some(w) = &chosen.warning {
        errln!("waste plan: warning: {w}");
    }
    Ok(())
}

/// One row of the table: label, human size, exact bytes.
fn row(label: &str, bytes: u64) -> Result<(), Failure> {
    outln!("  {label:<24} {:>12}  {bytes:>15} bytes", human(bytes));
    Ok(())
}

fn print_table(path: &std::path::Path, plan: &MemoryPlan, ram: &RamReading, chosen: &waste::Budget, chunk_chosen: bool) -> Result<(), Failure> {
    let kind = match plan.kind {
        ModelKind::HfCheckpoint => "Hugging Face checkpoint, loaded whole",
        ModelKind::Container => "waste container, experts streamed",
    };
    outln!("  model {} ({kind})", path.display());
    let how = if chunk_chosen { " (chosen by the plan)" } else { "" };
    outln!("  context {} tokens, {} threads, prefill chunk {}{how}", plan.ctx, plan.threads, plan.prefill_chunk);
    row("resident trunk", plan.trunk_bytes)?;
    if plan.embeddings_on_disk_bytes > 0 {
        let b = plan.embeddings_on_disk_bytes;
        outln!("  {:<24} {:>12}  {b:>15} bytes, read a row per token, not resident", "  embeddings on disk", human(b));
    }
    let sessions = match plan.sessions {
        1 => "state + KV cache".to_string(),
        n => format!("state, {n} sessions"),
    };
    row(&sessions, plan.state_bytes)?;
    if plan.sessions > 1 {
        row("  one session", plan.session_bytes)?;
    }
    row("scratch", plan.scratch_bytes)?;
    row("tokenizer (allowance)", plan.tokenizer_bytes)?;
    row("minimum expert cache", plan.min_expert_cache_bytes)?;
    if plan.open_extra_bytes > 0 {
        row("opening (tensor index)", plan.open_extra_bytes)?;
    }
    outln!("  {}", "-".repeat(62));
    row("FLOOR", plan.floor_bytes())?;
    row("working set (1 token)", plan.working_set_bytes)?;
    row("recommended", plan.recommended_bytes())?;
    let how = match chosen.source {
        BudgetSource::Explicit => String::new(),
        BudgetSource::WorkingSets(n) => format!(" (no --budget: floor + {n} working sets)"),
        BudgetSource::Floor => " (no --budget: the floor)".to_string(),
        BudgetSource::Cache => " (no --budget: the floor's parts + the --cache)".to_string(),
    };
    let dense = if plan.has_experts() { "" } else { " (no experts stream: nothing to cache)" };
    outln!("  budget {}{how} -> expert cache {}{dense}", human(chosen.bytes), human(chosen.expert_cache_bytes));
    outln!();
    row("physical RAM", ram.physical_bytes)?;
    row("usable RAM", ram.usable_bytes)?;
    outln!("  (physical RAM from {})", ram.physical_source.describe());
    match &ram.limit {
        Some(l) => outln!("  (usable RAM is the cgroup limit in {})", l.file.display()),
        None => outln!("  (no cgroup limit below physical RAM)"),
    }
    for n in &ram.notes {
        outln!("  note: {n}");
    }
    Ok(())
}

/// Bytes in binary units with two decimals ("1.50 GiB").
pub(super) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}
