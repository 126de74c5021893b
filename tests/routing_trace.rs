//! Record and replay of the engine's routing: `--trace-out` writes the experts each token
//! chose in the shared traces' format; replayed through `waste bench cache` with the engine's
//! slot count it gives exactly the hits and misses the engine counted; `--route-trace` makes a
//! model route as a trace says, and recording that run gives the trace back.

use crate::common;
use common::*;
use waste::cache::replay::Trace;
use waste::{Model, Options};

fn json_field(out: &str, name: &str) -> u64 {
    let v = waste::format::json::parse(out.as_bytes()).unwrap();
    v.get(name).and_then(|x| x.as_u64()).unwrap_or_else(|| panic!("`{name}` missing in {out}"))
}

#[test]
fn a_recorded_trace_replays_to_the_engines_own_hits_and_misses() {
    let dir = float_container("olmoe_f32", "trace");
    let manifest = waste::format::container::Manifest::open(&dir).unwrap();
    let trace_file = dir.parent().unwrap().join("routing.jsonl");
    let smallest = waste::cache::min_cache_bytes(&manifest);
    for (cache, io_threads) in [(smallest, "0"), (smallest * 3, "2")] {
        let _ = std::fs::remove_file(&trace_file);
        let (code, out, err) = waste(&["bench", dir.to_str().unwrap(), "--prompt-tokens", "1", "-n", "40",
            "--cache", &cache.to_string(), "--io-threads", io_threads, "--no-lookahead", "--trace-out", trace_file.to_str().unwrap(), "--json"]);
        assert_eq!(code, 0, "{err}");
        let (slots, hits, misses) = (json_field(&out, "cache_slots"), json_field(&out, "cache_hits"), json_field(&out, "cache_misses"));
        let trace = Trace::load(&trace_file).unwrap();
        assert_eq!(trace.tokens.len(), 41, "one line per computed token");
        assert_eq!(trace.layers, manifest.banks.len());
        assert!(misses > 0 && hits > 0, "a cache that both hits and misses: {hits} / {misses}");
        let (code, replayed, err) = waste(&["bench", "cache", "--trace", trace_file.to_str().unwrap(), "--slots", &slots.to_string(),
            "--experts", &manifest.config.moe.as_ref().unwrap().experts.to_string(), "--json"]);
        assert_eq!(code, 0, "{err}");
        let rows = waste::format::json::parse(replayed.as_bytes()).unwrap();
        let row = &rows.as_array().unwrap()[0];
        assert_eq!((row.get("hits").unwrap().as_u64(), row.get("misses").unwrap().as_u64()), (Some(hits), Some(misses)),
            "{slots} slots, io threads {io_threads}: the engine counted {hits} hits / {misses} misses");
    }
}

#[test]
fn routing_follows_a_trace_and_records_it_back() {
    let dir = float_container("qwen3_moe_f32", "replay");
    let o = oracle("qwen3_moe_f32");
    let mut m = Model::open(&dir, &Options::default()).unwrap();
    let (experts, top_k) = m.info().experts.unwrap();
    let moe_layers = waste::format::container::Manifest::open(&dir).unwrap().banks.len();
    m.record_routing(true);
    let own = prompt_logits(&mut m, &o.prompt, true);
    let recorded = m.take_routing();
    assert_eq!(recorded.len(), o.prompt.len());
    assert!(recorded.iter().enumerate().all(|(i, r)| r.position == i && r.layers.len() == moe_layers
        && r.layers.iter().all(|ids| ids.len() == top_k && ids.windows(2).all(|w| w[0] < w[1]))), "{recorded:?}");

    // A trace that picks experts the router did not: the last `top_k` ids for every token.
    let forced: Vec<u32> = (experts - top_k..experts).map(|e| e as u32).collect();
    let file = dir.parent().unwrap().join("forced.jsonl");
    let lines: String = (0..3).map(|t| waste::TokenRoute { position: t, layers: vec![forced.clone(); moe_layers] }.to_json_line() + "\n").collect();
    std::fs::write(&file, lines).unwrap();
    m.reset();
    m.replay_routing(Some(Trace::load(&file).unwrap()));
    let replayed = prompt_logits(&mut m, &o.prompt, true);
    let back = m.take_routing();
    assert!(back.iter().all(|r| r.layers.iter().all(|ids| *ids == forced)), "{back:?}");
    assert!(!bit_identical(&own, &replayed), "forced routing changes the logits");

    // Routing restored: the model's own logits again, bit for bit.
    m.reset();
    m.replay_routing(None);
    m.record_routing(false);
    assert!(bit_identical(&prompt_logits(&mut m, &o.prompt, true), &own));
    assert!(m.take_routing().is_empty(), "recording stopped");
}

/// The CLI's `--route-trace` on `bench`: the shared OLMoE trace (64 experts, 16 layers) drives
/// a fixture with fewer experts and layers, and `--trace-out` shows the mapping: trace token
/// `p` for position `p`, layer `m` for MoE layer `m`, ids modulo the experts, kept distinct.
#[test]
fn bench_routes_as_a_trace_says() {
    let dir = float_container("olmoe_f32", "route-trace");
    let manifest = waste::format::container::Manifest::open(&dir).unwrap();
    let experts = manifest.config.moe.as_ref().unwrap().experts as u32;
    let shared = fixture("traces/olmoe_299.jsonl");
    let out = dir.parent().unwrap().join("followed.jsonl");
    let (code, _, err) = waste(&["bench", dir.to_str().unwrap(), "--prompt-tokens", "3", "-n", "6",
        "--route-trace", shared.to_str().unwrap(), "--trace-out", out.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let (given, got) = (Trace::load(&shared).unwrap(), Trace::load(&out).unwrap());
    assert_eq!(got.tokens.len(), 9);
    for (p, tok) in got.tokens.iter().enumerate() {
        for (l, ids) in tok.iter().enumerate() {
            let mut want: Vec<u32> = Vec::new();
            for &id in &given.tokens[p][l % given.layers] {
                let mut e = id % experts;
                while want.contains(&e) {
                    e = (e + 1) % experts;
                }
                want.push(e);
            }
            want.truncate(ids.len());
            want.sort_unstable();
            assert_eq!(*ids, want, "token {p} layer {l}");
        }
    }
    let (code, _, err) = waste(&["bench", "models/stories260K", "--route-trace", shared.to_str().unwrap()]);
    assert_eq!(code, 2, "a dense model has nothing to route: {err}");
    assert!(err.contains("--route-trace"), "{err}");
}

/// `bench --warmup N`: an untimed run on other tokens comes first, so the timed decode of a
/// model whose experts all fit its cache (a 1 GiB budget holds them all) starts with a warm
/// expert cache (no misses, where a cold start misses), and what `--trace-out` records is the
/// timed run alone.
#[test]
fn a_warm_up_run_fills_the_cache_and_stays_out_of_the_figures() {
    let dir = float_container("olmoe_f32", "warmup");
    let trace_file = dir.parent().unwrap().join("warm.jsonl");
    let (mut misses, mut prefill_read) = (Vec::new(), Vec::new());
    for warmup in ["0", "200"] {
        let _ = std::fs::remove_file(&trace_file);
        let (code, out, err) = waste(&["bench", dir.to_str().unwrap(), "--prompt-tokens", "2", "-n", "20", "--warmup", warmup,
            "--budget", "1G", "--no-lookahead", "--no-hotlist", "--trace-out", trace_file.to_str().unwrap(), "--json"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(json_field(&out, "warmup_tokens"), warmup.parse::<u64>().unwrap());
        assert_eq!(Trace::load(&trace_file).unwrap().tokens.len(), 22, "the recording holds the timed run's 2 + 20 tokens");
        misses.push(json_field(&out, "decode_misses"));
        prefill_read.push(json_field(&out, "prefill_bytes_read"));
    }
    assert!(misses[0] > 0, "a cold cache misses during decode: {misses:?}");
    assert_eq!(misses[1], 0, "after the warm-up every expert the decode chose was resident: {misses:?}");
    // The prefill's own figures: a cold prefill reads its experts, a warm one nothing.
    assert!(prefill_read[0] > 0 && prefill_read[1] == 0, "bytes read by the prefill, cold and warm: {prefill_read:?}");
}
