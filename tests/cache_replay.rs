//! The expert-cache policy on real routing traces (OLMoE-1B-7B, Kimi-Linear-48B): replayed
//! through the cache's own bookkeeping, it beats LRU where a cache is smallest (3 % and 6 % of
//! the experts) and never exceeds Belady's offline optimum. Hit rates are deterministic, so
//! they are asserted; speeds are not.

mod common;
use common::*;
use waste::cache::policy::Policy;
use waste::cache::replay::{belady, replay, Trace};

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
}
