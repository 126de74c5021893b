//! The expert-cache policy on real routing traces (OLMoE-1B-7B, Kimi-Linear-48B): replayed
//! through the cache's own bookkeeping, it beats LRU where a cache is smallest (3 % and 6 % of
//! the experts) and never exceeds Belady's offline optimum; on the second half of each trace
//! (the half its few settings were not chosen on) it keeps the hit rates `docs/BENCHMARKS.md`
//! records. Hit rates are deterministic, so they are asserted; speeds are not.

use crate::common;
use common::*;
use waste::cache::policy::Policy;
use waste::cache::replay::{belady, belady_range, replay, replay_range, Trace};

#[test]
fn policy_beats_lru_at_small_caches_and_stays_under_belady() {
    for name in ["olmoe_299.jsonl", "kimi_linear_300.jsonl"] {
        let trace = Trace::load(&fixture(&format!("traces/{name}"))).unwrap();
        let per_token = trace.tokens[0].iter().map(Vec::len).sum::<usize>();
        let ours = Policy::default_for(per_token);
        for pct in [3.0, 6.0, 12.0, 24.0] {
            let slots = (trace.keys() as f64 * pct / 100.0).round() as usize;
            let (p, l, b) = (replay(&trace, slots, ours), replay(&trace, slots, Policy::Lru), belady(&trace, slots));
            println!("{name} {pct}%: policy {:.3} lru {:.3} belady {:.3}", p, l, b);
            assert!(p <= b + 1e-12, "{name} {pct}%: above the optimum");
            if pct <= 6.0 {
                assert!(p > l + 0.01, "{name} {pct}%: policy {p} does not beat LRU {l}");
            }
        }
    }
}

/// A regression guard: the default policy's hit rates on the held-out second half of each
/// trace (tokens 149 on; the cache runs from token 0) at 3 % and 12 % of the experts, as
/// `docs/BENCHMARKS.md` records them (`waste bench cache --tokens 149..`). A change that lowers
/// one of them fails here; one that raises them should update the table and these floors.
#[test]
fn held_out_hit_rates_do_not_regress() {
    // (trace, percent, hits per 1000 lookups at least, Belady's per 1000)
    let floors = [("olmoe_299.jsonl", 3.0, 151, 187), ("olmoe_299.jsonl", 12.0, 475, 614),
                  ("kimi_linear_300.jsonl", 3.0, 369, 506), ("kimi_linear_300.jsonl", 12.0, 599, 748)];
    for (name, pct, floor, opt) in floors {
        let trace = Trace::load(&fixture(&format!("traces/{name}"))).unwrap();
        let per_token = trace.tokens[0].iter().map(Vec::len).sum::<usize>();
        let slots = (trace.keys() as f64 * pct / 100.0).round() as usize;
        let held_out = 149..trace.tokens.len();
        let (hits, misses) = replay_range(&trace, slots, Policy::default_for(per_token), held_out.clone());
        let (rate, best) = (hits as f64 / (hits + misses) as f64, belady_range(&trace, slots, held_out));
        println!("{name} {pct}% held out: {:.1} % hits, Belady {:.1} % ({:.0} % of it)", 100.0 * rate, 100.0 * best, 100.0 * rate / best);
        assert_eq!((1000.0 * best).round() as u64, opt, "{name} {pct}%: Belady's optimum changed, so the trace or the replay did");
        assert!((1000.0 * rate).round() as u64 >= floor, "{name} {pct}%: {rate} below the recorded {floor}/1000");
    }
}

#[test]
fn bench_cache_prints_the_three_policies() {
    let path = fixture("traces/olmoe_299.jsonl");
    let (code, out, err) = waste(&["bench", "cache", "--trace", path.to_str().unwrap(), "--percent", "3,6", "--json"]);
    assert_eq!(code, 0, "{err}");
    let doc = waste::format::json::parse(out.as_bytes()).unwrap();
    let rows = doc.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].get("slots").unwrap().as_u64(), Some(31));
    let (code, _, err) = waste(&["bench", "cache", "--trace", path.to_str().unwrap(), "--policy", "mru"]);
    assert_eq!(code, 2);
    assert!(err.contains("--policy"), "{err}");
    // A token range counts only its tokens: the two halves' lookups add up to the whole's.
    let counts = |range: &str| {
        let (code, out, err) = waste(&["bench", "cache", "--trace", path.to_str().unwrap(), "--slots", "123", "--json", "--tokens", range]);
        assert_eq!(code, 0, "{range}: {err}");
        let doc = waste::format::json::parse(out.as_bytes()).unwrap();
        let row = &doc.as_array().unwrap()[0];
        (row.get("hits").unwrap().as_u64().unwrap(), row.get("misses").unwrap().as_u64().unwrap())
    };
    let (whole, first, second) = (counts("0..299"), counts("0..149"), counts("149.."));
    assert_eq!((first.0 + second.0, first.1 + second.1), whole);
    assert_eq!(first.0 + first.1, 149 * 16 * 8);
    for bad in ["149..149", "0..300", "a..b", "12"] {
        let (code, _, err) = waste(&["bench", "cache", "--trace", path.to_str().unwrap(), "--tokens", bad]);
        assert_eq!(code, 2, "--tokens {bad}");
        assert!(err.contains("--tokens"), "{err}");
    }
}

/// A trace naming an expert twice in one layer counts it once — the engine sorts and dedups
/// the router's picks before it asks the cache, so two slots for one key never happen — and
/// every policy gives exactly what the same trace without the duplicates gives.
#[test]
fn duplicate_ids_in_a_layer_are_one_access() {
    let dir = temp_dir("dup-trace");
    let clean = "{\"tok\": 1, \"layers\": [[1, 2], [0, 3]]}\n{\"tok\": 2, \"layers\": [[2, 3], [1, 3]]}\n{\"tok\": 3, \"layers\": [[0, 1], [0, 3]]}\n";
    let dup = "{\"tok\": 1, \"layers\": [[1, 2, 1], [3, 0, 3]]}\n{\"tok\": 2, \"layers\": [[2, 3, 2, 2], [1, 3, 1]]}\n{\"tok\": 3, \"layers\": [[1, 0, 0], [0, 3, 0]]}\n";
    std::fs::write(dir.join("clean.jsonl"), clean).unwrap();
    std::fs::write(dir.join("dup.jsonl"), dup).unwrap();
    let (a, b) = (Trace::load(&dir.join("clean.jsonl")).unwrap(), Trace::load(&dir.join("dup.jsonl")).unwrap());
    assert_eq!(a.tokens, b.tokens, "loading sorts and dedups each layer");
    assert_eq!((a.accesses(), b.accesses()), (12, 12));
    // Built in code, not loaded: replay dedups on its own.
    let raw = Trace {
        tokens: vec![vec![vec![1, 2, 1], vec![3, 0, 3]], vec![vec![2, 3, 2, 2], vec![1, 3, 1]], vec![vec![1, 0, 0], vec![0, 3, 0]]],
        layers: 2,
        experts: 4,
    };
    assert_eq!(raw.accesses(), 12);
    for slots in 2..=8 {
        for policy in [Policy::Lru, Policy::default_for(4)] {
            let want = replay(&a, slots, policy);
            assert_eq!(replay(&b, slots, policy), want, "{slots} slots {policy:?}");
            assert_eq!(replay(&raw, slots, policy), want, "{slots} slots {policy:?}, unloaded trace");
        }
        assert_eq!(belady(&raw, slots), belady(&a, slots), "{slots} slots, Belady");
    }
    // Every key fits: each of the 7 distinct experts misses once, the other 5 accesses hit.
    for policy in [Policy::Lru, Policy::default_for(4)] {
        assert_eq!(replay(&raw, 8, policy), 5.0 / 12.0, "{policy:?}");
    }
    assert_eq!(belady(&raw, 8), 5.0 / 12.0);
}

/// A trace naming more experts than any model has (layers × the largest id) is refused when it
/// is loaded, before the replay allocates state for every one of them; so is `--experts`
/// widening a trace past that.
#[test]
fn a_trace_naming_absurdly_many_experts_is_refused() {
    let dir = temp_dir("huge-trace");
    let line = format!("{{\"layers\": [{}]}}\n", vec!["[99999]"; 20].join(", "));
    std::fs::write(dir.join("huge.jsonl"), &line).unwrap();
    let err = Trace::load(&dir.join("huge.jsonl")).err().expect("refused").to_string();
    assert!(err.contains("huge.jsonl") && err.contains("20 layers of 100000 experts"), "{err}");
    std::fs::write(dir.join("small.jsonl"), "{\"layers\": [[1, 2], [0, 3]]}\n").unwrap();
    let (code, _, err) = waste(&["bench", "cache", "--trace", dir.join("small.jsonl").to_str().unwrap(), "--experts", "600000"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--experts"), "{err}");
}
