//! Where the compute threads run: a Linux-style CPU list (`0-5`, `0-2,6-8`, `3`), parsed once
//! into a set. The pool binds its workers to the list at creation and the calling thread on its
//! first parallel region (seed 001, "Thread placement").

use crate::error::{Error, Result};
use crate::sys::MAX_CPUS;

/// A non-empty set of CPU numbers, ascending and without repeats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList {
    cpus: Vec<usize>,
}

impl CpuList {
    /// Parses the Linux cpu-list syntax: comma-separated items, each a CPU number `N` or an
    /// inclusive range `N-M` with `N <= M`. Items may overlap (the list is a set). A malformed
    /// list is an [`crate::ErrorKind::Arg`] error that quotes it and names the bad item.
    pub fn parse(text: &str) -> Result<CpuList> {
        let list = text.trim();
        let bad = |item: &str, why: &str| Error::arg(format!("cpu list `{list}`: `{item}` {why}"));
        if list.is_empty() {
            return Err(Error::arg("cpu list is empty (expected e.g. `0-5`, `0-2,6-8` or `3`)"));
        }
        let mut cpus = Vec::new();
        for item in list.split(',') {
            let (lo, hi) = match item.split_once('-') {
                Some((a, b)) => (number(a).ok_or_else(|| bad(item, "is not a CPU range N-M"))?,
                                 number(b).ok_or_else(|| bad(item, "is not a CPU range N-M"))?),
                None => {
                    let n = number(item).ok_or_else(|| bad(item, "is not a CPU number"))?;
                    (n, n)
                }
            };
            if lo > hi {
                return Err(bad(item, "is a range whose start is after its end"));
            }
            if hi >= MAX_CPUS {
                return Err(bad(item, &format!("names a CPU beyond the {MAX_CPUS} a list can hold")));
            }
            cpus.extend(lo..=hi);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuList { cpus })
    }

    /// A list of the given CPUs (sorted and deduplicated); `None` when empty or out of range.
    pub fn from_cpus(cpus: &[usize]) -> Option<CpuList> {
        let mut v = cpus.to_vec();
        v.sort_unstable();
        v.dedup();
        (!v.is_empty() && v.iter().all(|&c| c < MAX_CPUS)).then_some(CpuList { cpus: v })
    }

    /// The CPUs, ascending.
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// How many CPUs the list names.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// Always false: a list names at least one CPU.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }
}

impl std::fmt::Display for CpuList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&format_list(&self.cpus))
    }
}

impl std::str::FromStr for CpuList {
    type Err = Error;
    fn from_str(s: &str) -> Result<CpuList> {
        CpuList::parse(s)
    }
}

/// A decimal CPU number: ASCII digits only (no sign, no spaces), at most 7 of them so the value
/// cannot overflow before the range check.
fn number(s: &str) -> Option<usize> {
    if s.is_empty() || s.len() > 7 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The canonical text of an ascending CPU set: runs of consecutive CPUs as `N-M`.
pub fn format_list(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        while i + 1 < cpus.len() && cpus[i + 1] == cpus[i] + 1 {
            i += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if cpus[i] == start {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{}", cpus[i]));
        }
        i += 1;
    }
    out
}
