//! Where the compute threads run: a Linux-style CPU list (`0-5`, `0-2,6-8`, `3`, `0-7:2`,
//! `0-1023:2/256`, `4-N`, `all`), parsed once into a set. The pool binds its workers to the
//! list at creation and the calling thread on its first parallel region (seed 001, "Thread
//! placement").

use crate::error::{Error, Result};
use crate::sys::MAX_CPUS;

/// A non-empty set of CPU numbers, ascending and without repeats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList {
    cpus: Vec<usize>,
}

impl CpuList {
    /// Parses the Linux cpu-list syntax (the kernel's "cpu lists", admin-guide
    /// kernel-parameters), with `N` standing for this machine's last CPU
    /// ([`crate::sys::last_cpu`]). See [`CpuList::parse_with_last`] for the grammar.
    pub fn parse(text: &str) -> Result<CpuList> {
        CpuList::parse_with_last(text, crate::sys::last_cpu())
    }

    /// Parses a cpu list in which `N` means CPU `last`. The list is comma-separated items:
    ///
    /// - `A`: one CPU; `A-B`: the inclusive range, `A <= B`;
    /// - `A-B:U/G`: the range cut into groups of `G` CPUs from `A`, the first `U` of each
    ///   (the kernel's `used_size/group_size`: `0-1023:2/256` is 0,1,256,257,512,513,768,769);
    /// - `A-B:S`: every `S`-th CPU of the range from `A` (util-linux's stride, as `taskset -c`
    ///   takes it: `0-7:2` is 0,2,4,6; the same set as `0-7:1/2`);
    /// - `N` in place of a number: the last CPU; `all` (any case): every CPU, `0-N`.
    ///
    /// Items may overlap (the list is a set), but the whole must name at least one CPU. A
    /// malformed list is an [`crate::ErrorKind::Arg`] error that quotes it and names the bad
    /// item.
    pub fn parse_with_last(text: &str, last: usize) -> Result<CpuList> {
        let list = text.trim();
        if list.is_empty() {
            return Err(Error::arg("cpu list is empty (expected e.g. `0-5`, `0-2,6-8`, `0-7:2` or `3`)"));
        }
        let mut cpus = Vec::new();
        for item in list.split(',') {
            cpus.extend(parse_item(list, item, last)?);
        }
        cpus.sort_unstable();
        cpus.dedup();
        if cpus.is_empty() {
            return Err(Error::arg(format!("cpu list `{list}` names no CPU")));
        }
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

/// The CPUs of one item of `list` (see [`CpuList::parse_with_last`]).
fn parse_item(list: &str, item: &str, last: usize) -> Result<Vec<usize>> {
    let bad = |why: &str| Error::arg(format!("cpu list `{list}`: `{item}` {why}"));
    if item.eq_ignore_ascii_case("all") {
        return Ok((0..=last).collect());
    }
    let (range, pattern) = match item.split_once(':') {
        Some((r, p)) => (r, Some(p)),
        None => (item, None),
    };
    let cpu = |s: &str| if s == "N" { Some(last) } else { number(s) };
    let (lo, hi) = match range.split_once('-') {
        Some((a, b)) => (cpu(a).ok_or_else(|| bad("is not a CPU range N-M"))?, cpu(b).ok_or_else(|| bad("is not a CPU range N-M"))?),
        // As in the kernel, a pattern needs a range: `2:1/2` is not a list item.
        None if pattern.is_some() => return Err(bad("has a stride or group pattern without a range A-B")),
        None => {
            let n = cpu(range).ok_or_else(|| bad("is not a CPU number"))?;
            (n, n)
        }
    };
    if lo > hi {
        return Err(bad("is a range whose start is after its end"));
    }
    if hi >= MAX_CPUS {
        return Err(bad(&format!("names a CPU beyond the {MAX_CPUS} a list can hold")));
    }
    // (first CPUs used of each group, group length): a plain range is one group used whole.
    let (used, group) = match pattern {
        None => (hi - lo + 1, hi - lo + 1),
        Some(p) => match p.split_once('/') {
            Some((u, g)) => {
                let (u, g) = (number(u).ok_or_else(|| bad("has a used size that is not a number (A-B:U/G)"))?,
                              number(g).ok_or_else(|| bad("has a group size that is not a number (A-B:U/G)"))?);
                if g == 0 || u > g {
                    return Err(bad("needs a group size G >= 1 and a used size U <= G (A-B:U/G)"));
                }
                (u, g)
            }
            None => {
                let stride = number(p).filter(|&s| s > 0).ok_or_else(|| bad("has a stride that is not a positive number (A-B:S)"))?;
                (1, stride)
            }
        },
    };
    Ok((lo..=hi).step_by(group).flat_map(|start| start..(start + used).min(hi + 1)).collect())
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
