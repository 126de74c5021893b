//! `waste plan`: prints a model's memory plan (seed 001 §3) — the floor, the recommendation,
//! what a budget leaves for the expert cache — next to the RAM this machine can give it.

use super::args::{flag, val, Args, Command};
use super::commands::{budget, model_options, model_path, Failure};
use super::out::{errln, outln};
use super::HELP_OPT;
use waste::format::json::Json;
use waste::cache::plan::ModelKind;
use waste::{BudgetSource, MemoryPlan, RamReading};

pub const PLAN: Command = Command {
    name: "plan",
    usage: "plan MODEL [--budget SIZE] [--ctx N] [--json]",
    about: "Show the RAM a model needs: its floor (trunk, state and KV cache, scratch, minimum expert cache), \
the recommended budget, and the expert cache a budget leaves; plus this machine's physical and usable RAM \
(usable = physical, or the cgroup memory limit when smaller). Reads headers only, no weights.",
    opts: &[&[
        val("budget", "SIZE", "RAM budget: bytes, or K, M, G or T, optionally with i and B, in binary units: 1K = 1024, 4G = 4Gi = 4GiB = 4GB"),
        val("ctx", "N", "context length in tokens (default: the model's, at most 4096)"),
        val("threads", "N", "compute threads, which size the scratch (default: one per available CPU)"),
        val("chunk", "N", "prefill chunk: tokens per forward pass (default 32)"),
        flag("json", "print JSON"),
    ], HELP_OPT],
    positionals: &["MODEL"],
};

pub fn run(a: &Args) -> Result<(), Failure> {
    let budget = budget(a)?;
    let opts = model_options(a)?;
    let path = model_path(a)?;
    let plan = waste::plan_memory_opts(path, &opts)?;
    let ram = waste::cache::ram::read_ram()?;
    // An explicit budget under the floor fails here, before anything else is printed.
    let chosen = waste::resolve_budget(&plan, ram.usable_bytes, budget)?;
    if a.flag("json") {
        let mut m = vec![
            ("trunk_bytes", plan.trunk_bytes),
            ("state_bytes", plan.state_bytes),
            ("scratch_bytes", plan.scratch_bytes),
            ("min_expert_cache_bytes", plan.min_expert_cache_bytes),
            ("floor_bytes", plan.floor_bytes()),
            ("working_set_bytes", plan.working_set_bytes),
            ("recommended_bytes", plan.recommended_bytes()),
            ("physical_ram_bytes", ram.physical_bytes),
            ("usable_ram_bytes", ram.usable_bytes),
        ];
        if budget.is_some() {
            m.push(("budget_bytes", chosen.bytes));
            m.push(("expert_cache_bytes", chosen.expert_cache_bytes));
        }
        outln!("{}", Json::object(m.into_iter().map(|(k, v)| (k, Json::uint(v)))).to_string_pretty());
    } else {
        print_table(path, &plan, &ram, &chosen)?;
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

fn print_table(path: &std::path::Path, plan: &MemoryPlan, ram: &RamReading, chosen: &waste::Budget) -> Result<(), Failure> {
    let kind = match plan.kind {
        ModelKind::HfCheckpoint => "Hugging Face checkpoint, loaded whole",
        ModelKind::Container => "waste container, experts streamed",
    };
    outln!("  model {} ({kind})", path.display());
    outln!("  context {} tokens, {} threads, prefill chunk {}", plan.ctx, plan.threads, plan.prefill_chunk);
    row("resident trunk", plan.trunk_bytes)?;
    row("state + KV cache", plan.state_bytes)?;
    row("scratch", plan.scratch_bytes)?;
    row("minimum expert cache", plan.min_expert_cache_bytes)?;
    outln!("  {}", "-".repeat(62));
    row("FLOOR", plan.floor_bytes())?;
    row("working set (1 token)", plan.working_set_bytes)?;
    row("recommended", plan.recommended_bytes())?;
    let how = match chosen.source {
        BudgetSource::Explicit => String::new(),
        BudgetSource::WorkingSets(n) => format!(" (no --budget: floor + {n} working sets)"),
        BudgetSource::Floor => " (no --budget: the floor)".to_string(),
    };
    let dense = if plan.has_experts() { "" } else { " (no experts stream: nothing to cache)" };
    outln!("  budget {}{how} -> expert cache {}{dense}", human(chosen.bytes), human(chosen.expert_cache_bytes));
    outln!();
    row("physical RAM", ram.physical_bytes)?;
    row("usable RAM", ram.usable_bytes)?;
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
