//! Sessions and saved state (issue 11): the state round trip is bit-exact for every family and
//! form (Hugging Face directory, float container with streamed experts, quantized), damaged or
//! foreign state files are refused naming what was wrong, sessions interleave without
//! disturbing each other, a generation's last token stays in the session and the next prompt
//! reuses what the session holds, and every session counts against the budget.

use crate::common;

use common::*;
use std::path::{Path, PathBuf};
use waste::format::crc32::crc32;
use waste::{ErrorKind, GenerateParams, Model, Options};

/// The fixtures of every family, as (oracle name, what).
const FAMILIES: &[&str] = &["llama_f32", "qwen2_f32", "qwen3_f32", "mixtral_f32", "qwen2_moe_f32", "olmoe_f32",
    "deepseek_v2_lite_f32", "deepseek_v3_f32", "kimi_linear_f32"];

const MOE_FAMILIES: &[&str] = &["mixtral_f32", "qwen2_moe_f32", "olmoe_f32", "deepseek_v3_f32", "kimi_linear_f32"];

fn opts() -> Options {
    Options { ctx: 64, prefill_chunk: 4, threads: 2, ..Options::default() }
}

/// Every position's logits of `tokens` appended to the model's own session.
fn logits_of(m: &mut Model, tokens: &[u32]) -> Vec<f32> {
    all_logits(m, tokens).unwrap()
}

/// Prompt A in one session, saved; a fresh model loads it and runs prompt B: every logit of B
/// must equal, bit for bit, what B gives after A in the first session. Then both sessions
/// continue greedily the same way.
fn assert_round_trip(dir: &Path, what: &str, tag: &str) {
    let o = Options { cache_bytes: 0, ..opts() };
    let prompt: Vec<u32> = (0..20).map(|i| 3 + (i * 7 % 50) as u32).collect();
    let (a, b) = prompt.split_at(11);
    let file = temp_dir(&format!("state-{tag}")).join("a.state");
    let mut m1 = Model::open(dir, &o).unwrap();
    logits_of(&mut m1, a);
    m1.session().save_state(&file).unwrap();
    let want = logits_of(&mut m1, b);
    drop(m1);
    let mut m2 = Model::open(dir, &o).unwrap();
    m2.session_mut().load_state(&file).unwrap();
    assert_eq!(m2.session().tokens(), a, "{what}: the history comes back");
    assert_eq!(m2.position(), a.len());
    let got = logits_of(&mut m2, b);
    assert!(bit_identical(&got, &want), "{what}: logits after a loaded state differ (max rel {})", rel_max_diff(&got, &want));
    // And A + B in one call from an empty session gives the same bits again.
    let mut m3 = Model::open(dir, &o).unwrap();
    let whole = logits_of(&mut m3, &prompt);
    assert!(bit_identical(&whole[whole.len() - want.len()..], &want), "{what}: A+B in one session");
}

#[test]
fn state_round_trip_is_bit_exact_for_every_family_from_the_hf_directory() {
    for name in FAMILIES {
        assert_round_trip(&oracle(name).dir.join("model"), &format!("{name} (HF directory)"), name);
    }
}

#[test]
fn state_round_trip_is_bit_exact_from_float_and_quantized_containers() {
    for name in MOE_FAMILIES {
        let c = float_container(name, "session");
        assert_round_trip(&c, &format!("{name} (float container, experts streamed)"), &format!("{name}-c"));
    }
    // The default encodings: a q4 trunk with q8 embeddings and q4 experts.
    let out = temp_dir("session-q4c").join("model.waste");
    let src = oracle("mixtral_f32").dir.join("model");
    waste::tools::convert::convert(&waste::tools::convert::ConvertOptions::new(&src, &out), &mut |_| {}).unwrap();
    assert_round_trip(&out, "mixtral (q4 container)", "q4c");
}

#[test]
fn state_round_trip_is_bit_exact_for_quantized_checkpoints() {
    use waste::format::quant::Width;
    for (width, tag) in [(Width::Q8, "q8"), (Width::Q4, "q4")] {
        // The fixtures whose matrices split into whole blocks of 32.
        for name in ["qwen3_f32", "mixtral_f32", "deepseek_v3_group_f32", "kimi_linear_decode_f32"] {
            let out = temp_dir(&format!("session-{name}-{tag}")).join("model");
            waste::tools::quantize::quantize_checkpoint(&oracle(name).dir.join("model"), &out, width).unwrap();
            assert_round_trip(&out, &format!("{name} ({tag} checkpoint)"), &format!("{name}-{tag}"));
        }
    }
}

/// The round trip through the command line, a new process for each step: `eval A
/// --save-state`, then `eval B --load-state --dump-logits` equals the last rows of `eval A+B
/// --dump-logits`.
#[test]
fn state_round_trip_across_processes() {
    let dir = temp_dir("session-cli");
    let model = oracle("qwen3_moe_f32").dir.join("model");
    let m = model.to_str().unwrap();
    let (state, l2, l3) = (dir.join("s.state"), dir.join("b.f32"), dir.join("ab.f32"));
    let (code, _, err) = waste(&["eval", m, "--ids", "5,9,200,31,7,12,4", "--save-state", state.to_str().unwrap(), "--ctx", "64"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = waste(&["eval", m, "--ids", "88,3,14", "--load-state", state.to_str().unwrap(), "--ctx", "64",
        "--dump-logits", l2.to_str().unwrap(), "--chunk", "2"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = waste(&["eval", m, "--ids", "5,9,200,31,7,12,4,88,3,14", "--ctx", "64", "--dump-logits", l3.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (b, ab) = (read_f32(&l2), read_f32(&l3));
    assert_eq!(b.len() * 10, ab.len() * 3);
    assert!(bit_identical(&b, &ab[ab.len() - b.len()..]), "a loaded state continues bit for bit");
    // Another context is refused by the command too, naming the field.
    let (code, _, err) = waste(&["eval", m, "--ids", "1", "--load-state", state.to_str().unwrap(), "--ctx", "32"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("`context`") && err.contains("64") && err.contains("32"), "{err}");
}

/// A saved state's bytes, and a way to damage them and fix up the damaged section's CRC-32,
/// so that a test reaches the check behind the CRC.
struct StateBytes(Vec<u8>);

impl StateBytes {
    /// (tag, start of the section's frame, payload length) for every section.
    fn sections(&self) -> Vec<([u8; 4], usize, usize)> {
        let b = &self.0;
        let count = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
        let mut at = 16;
        let mut out = Vec::new();
        for _ in 0..count {
            let tag: [u8; 4] = b[at..at + 4].try_into().unwrap();
            let len = u64::from_le_bytes(b[at + 4..at + 12].try_into().unwrap()) as usize;
            out.push((tag, at, len));
            at += 16 + len;
        }
        out
    }

    fn section(&self, tag: &[u8; 4]) -> (usize, usize) {
        let (_, at, len) = self.sections().into_iter().find(|s| &s.0 == tag).unwrap();
        (at, len)
    }

    /// Recomputes the CRC-32 of the section starting at `at`.
    fn fix_crc(&mut self, at: usize) {
        let len = u64::from_le_bytes(self.0[at + 4..at + 12].try_into().unwrap()) as usize;
        let sum = crc32(&self.0[at..at + 12 + len]);
        self.0[at + 12 + len..at + 16 + len].copy_from_slice(&sum.to_le_bytes());
    }

    /// Sets u64 word `i` of the `SHAP` section and fixes its CRC.
    fn set_shape_word(&mut self, i: usize, v: u64) {
        let (at, _) = self.section(b"SHAP");
        self.0[at + 12 + 8 * i..at + 20 + 8 * i].copy_from_slice(&v.to_le_bytes());
        self.fix_crc(at);
    }
}

/// Writes `bytes` to a file and loads it into the model's own session, which holds a
/// conversation beforehand: the error, and whether the session kept its conversation.
fn load_bytes(m: &mut Model, dir: &Path, name: &str, bytes: &[u8]) -> (waste::Error, bool) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    m.reset();
    m.eval(&[1, 2, 3]).unwrap();
    let e = m.session_mut().load_state(&path).expect_err(name);
    (e, m.session().tokens() == [1, 2, 3])
}

#[test]
fn damaged_and_foreign_state_files_are_refused_naming_what_was_wrong() {
    let dir = temp_dir("session-damaged");
    let model_dir = oracle("qwen3_f32").dir.join("model");
    let mut m = Model::open(&model_dir, &opts()).unwrap();
    m.eval(&[5, 6, 7, 8, 9, 10, 11]).unwrap();
    let good_path = dir.join("good.state");
    m.session().save_state(&good_path).unwrap();
    let good = std::fs::read(&good_path).unwrap();
    let mut cases: Vec<(&str, Vec<u8>, &[&str], bool)> = Vec::new();
    // 1. Truncated inside every section: refused before the session is touched.
    let s = StateBytes(good.clone());
    for (tag, at, len) in s.sections() {
        let cut = good[..at + 12 + len / 2].to_vec();
        let name = String::from_utf8_lossy(&tag).into_owned();
        let (e, kept) = load_bytes(&mut m, &dir, &format!("cut-{name}.state"), &cut);
        assert_eq!(e.kind(), ErrorKind::Format, "{e}");
        assert!(e.message().contains(&format!("`{name}`")) || e.message().contains("truncated"), "a file cut inside {name}: {e}");
        assert!(kept, "a file cut in {name} must not touch the session: {e}");
    }
    cases.push(("empty", Vec::new(), &["too short"], true));
    cases.push(("short by one byte", good[..good.len() - 1].to_vec(), &["truncated"], true));
    // 2. Extended.
    let mut extended = good.clone();
    extended.extend_from_slice(b"\0\0\0\0");
    cases.push(("extended", extended, &["extended"], true));
    // 3. Bit flips: magic, version, section count, a key, a token of the history.
    let flip = |at: usize| {
        let mut b = good.clone();
        b[at] ^= 0x10;
        b
    };
    let (kv_at, kv_len) = s.section(b"KVCA");
    let (hist_at, _) = s.section(b"HIST");
    cases.push(("magic flipped", flip(2), &["wrong magic"], true));
    cases.push(("version flipped", flip(8), &["format version"], true));
    cases.push(("section count flipped", flip(13), &["section count"], true));
    cases.push(("key flipped", flip(kv_at + 12 + kv_len / 3), &["`KVCA`", "CRC-32"], false));
    cases.push(("history flipped", flip(hist_at + 13), &["`HIST`", "CRC-32"], false));
    // 4. Fields changed with a valid CRC: the shape check behind the CRC catches them.
    let mut dtype = StateBytes(good.clone());
    dtype.set_shape_word(10, 1);
    cases.push(("another dtype", dtype.0, &["`dtype`"], true));
    let mut pos = StateBytes(good.clone());
    pos.set_shape_word(8, 10_000);
    cases.push(("position past the context", pos.0, &["position 10000"], true));
    let mut kv = StateBytes(good.clone());
    kv.set_shape_word(2, 7);
    cases.push(("another kv_dim", kv.0, &["`kv_dim`"], true));
    for (name, bytes, needles, kept_want) in cases {
        let (e, kept) = load_bytes(&mut m, &dir, &format!("{}.state", name.replace(' ', "-")), &bytes);
        assert_eq!(e.kind(), ErrorKind::Format, "{name}: {e}");
        for n in needles {
            assert!(e.message().contains(n), "{name}: the error should say {n:?}: {e}");
        }
        assert!(e.message().contains(".state"), "{name}: the error names the file: {e}");
        assert_eq!(kept, kept_want, "{name}: {e}");
    }
    // 5. Another model, and the same model with another context.
    let mut other = Model::open(oracle("llama_f32").dir.join("model"), &opts()).unwrap();
    other.eval(&[1, 2, 3]).unwrap();
    let e = other.session_mut().load_state(&good_path).unwrap_err();
    assert!(e.message().contains("another model") && e.message().contains("Qwen3ForCausalLM"), "{e}");
    assert_eq!(other.session().tokens(), [1, 2, 3], "a foreign state leaves the session as it was");
    let mut short = Model::open(&model_dir, &Options { ctx: 32, ..opts() }).unwrap();
    let e = short.session_mut().load_state(&good_path).unwrap_err();
    assert!(e.message().contains("`context` is 64 in the file, 32 in this session"), "{e}");
    // 6. A missing file is an I/O error naming it.
    let e = m.session_mut().load_state(dir.join("absent.state")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.message().contains("absent.state"), "{e}");
    // And the good file still loads.
    m.session_mut().load_state(&good_path).unwrap();
    assert_eq!(m.session().tokens(), [5, 6, 7, 8, 9, 10, 11]);
}

/// A save replaces the file atomically and leaves no temporary file beside it.
#[test]
fn saving_replaces_the_file_whole() {
    let dir = temp_dir("session-save");
    let mut m = Model::open(oracle("llama_f32").dir.join("model"), &opts()).unwrap();
    let path = dir.join("s.state");
    m.eval(&[1, 2]).unwrap();
    m.session().save_state(&path).unwrap();
    m.eval(&[3, 4, 5]).unwrap();
    m.session().save_state(&path).unwrap();
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["s.state"]);
    let mut n = Model::open(oracle("llama_f32").dir.join("model"), &opts()).unwrap();
    n.session_mut().load_state(&path).unwrap();
    assert_eq!(n.session().tokens(), [1, 2, 3, 4, 5]);
    // A save into a directory that does not exist fails naming the file.
    let e = m.session().save_state(dir.join("no/such/dir/s.state")).unwrap_err();
    assert!(e.message().contains("s.state"), "{e}");
}

/// Two sessions on one model, interleaved token by token, each give what they give alone.
#[test]
fn interleaved_sessions_give_what_each_gives_alone() {
    for name in ["qwen2_moe_f32", "deepseek_v3_f32", "kimi_linear_f32"] {
        let dir = oracle(name).dir.join("model");
        let alone = |prompt: &[u32]| -> Vec<u32> {
            let mut m = Model::open(&dir, &opts()).unwrap();
            greedy(&mut m, prompt, 12)
        };
        let (pa, pb) = ([1u32, 17, 40, 9], [2u32, 33, 8, 60, 11, 5]);
        let (want_a, want_b) = (alone(&pa), alone(&pb));
        let o = Options { sessions: 2, ..opts() };
        let mut m = Model::open(&dir, &o).unwrap();
        let mut sb = m.new_session().unwrap();
        let mut a = vec![argmax(m.eval(&pa).unwrap())];
        let mut b = vec![argmax(m.eval_in(&mut sb, &pb).unwrap())];
        while a.len() < 12 {
            let next = argmax(m.eval(&[*a.last().unwrap()]).unwrap());
            a.push(next);
            let next = argmax(m.eval_in(&mut sb, &[*b.last().unwrap()]).unwrap());
            b.push(next);
        }
        assert_eq!(a, want_a, "{name}: session A");
        assert_eq!(b, want_b, "{name}: session B");
        // A session of another model is refused.
        let other = Model::open(oracle("llama_f32").dir.join("model"), &Options { sessions: 2, ..opts() }).unwrap();
        let mut foreign = other.new_session().unwrap();
        assert_eq!(m.eval_in(&mut foreign, &[1]).unwrap_err().kind(), ErrorKind::Arg);
    }
}

/// A generation's last token stays in the session: continuing with the conversation so far
/// and more prefills only the new tokens, and gives what one session given everything gives.
#[test]
fn generation_continues_where_the_text_stopped() {
    let dir = oracle("qwen3_f32").dir.join("model");
    let params = GenerateParams { max_tokens: 6, stop_at_eos: false, ..GenerateParams::greedy() };
    let mut m = Model::open(&dir, &opts()).unwrap();
    let first = m.generate(&[1, 50, 60, 70], &params, |_| true).unwrap();
    assert_eq!((first.reused_tokens, first.prefilled_tokens), (0, 4));
    assert_eq!(m.session().tokens().len(), 10, "the prompt and every generated token");
    assert_eq!(m.position(), 9, "the last generated token waits for the next pass");
    let mut next = m.session().tokens().to_vec();
    next.extend([80, 81, 82]);
    let second = m.generate(&next, &params, |_| true).unwrap();
    assert_eq!((second.reused_tokens, second.prefilled_tokens), (9, 4), "only the new tokens (and the held one) are computed");
    // The same tokens from scratch in one prompt.
    let mut fresh = Model::open(&dir, &opts()).unwrap();
    let again = fresh.generate(&next, &params, |_| true).unwrap();
    assert_eq!(second.ids, again.ids);
    assert_eq!(again.reused_tokens, 0);
    // A prompt that departs from the session cuts the state back to the common prefix.
    let mut forked = next[..6].to_vec();
    forked.extend([90, 91]);
    let third = m.generate(&forked, &params, |_| true).unwrap();
    assert_eq!((third.reused_tokens, third.prefilled_tokens, third.state_reset), (6, 2, false));
    let mut fresh = Model::open(&dir, &opts()).unwrap();
    assert_eq!(third.ids, fresh.generate(&forked, &params, |_| true).unwrap().ids);
    // The same prompt again recomputes only its last token (its logits are needed).
    let fourth = m.generate(&forked, &params, |_| true).unwrap();
    assert_eq!((fourth.reused_tokens, fourth.prefilled_tokens), (7, 1));
    assert_eq!(fourth.ids, third.ids);
}

/// A recurrent (KDA) state cannot be cut back: a prompt that departs from the session is
/// prefilled whole, the summary says so, and the tokens are still right.
#[test]
fn a_recurrent_state_is_prefilled_again_when_the_prompt_departs() {
    let dir = oracle("kimi_linear_f32").dir.join("model");
    let params = GenerateParams { max_tokens: 4, stop_at_eos: false, ..GenerateParams::greedy() };
    let mut m = Model::open(&dir, &opts()).unwrap();
    let first = m.generate(&[1, 50, 60, 70, 80], &params, |_| true).unwrap();
    let mut next = m.session().tokens().to_vec();
    next.push(42);
    let cont = m.generate(&next, &params, |_| true).unwrap();
    assert_eq!((cont.reused_tokens, cont.state_reset), (8, false), "appending keeps the recurrent state: {cont:?}");
    let forked = [1, 50, 60, 99, 98];
    let fork = m.generate(&forked, &params, |_| true).unwrap();
    assert!(fork.state_reset && fork.reused_tokens == 0 && fork.prefilled_tokens == 5, "{fork:?}");
    let mut fresh = Model::open(&dir, &opts()).unwrap();
    assert_eq!(fork.ids, fresh.generate(&forked, &params, |_| true).unwrap().ids);
    assert_eq!(first.ids.len(), 4);
}

/// Every session counts against the budget: one that does not fit is refused naming the
/// budget and the bytes it needs; `Options::sessions` reserves room, and the plan counts it.
#[test]
fn sessions_count_against_the_budget() {
    let dir = oracle("qwen2_moe_f32").dir.join("model");
    let plan = waste::plan_memory(&dir, &opts()).unwrap();
    let m = Model::open(&dir, &Options { budget: Some(plan.floor_bytes()), ..opts() }).unwrap();
    let e = m.new_session().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::RamBudget);
    assert!(e.message().contains(&plan.session_bytes.to_string()) && e.message().contains(&plan.floor_bytes().to_string()), "{e}");
    let o = Options { sessions: 3, ..opts() };
    let plan3 = waste::plan_memory(&dir, &o).unwrap();
    assert_eq!(plan3.state_bytes, 3 * plan.session_bytes);
    assert_eq!(plan3.floor_bytes(), plan.floor_bytes() + 2 * plan.session_bytes);
    let m = Model::open(&dir, &Options { budget: Some(plan3.floor_bytes()), ..o.clone() }).unwrap();
    let s1 = m.new_session().unwrap();
    let s2 = m.new_session().unwrap();
    assert_eq!(m.memory_used(), m.memory_use().total());
    assert_eq!(m.memory_use().state, plan3.state_bytes, "three sessions held: the plan's state part");
    assert_eq!(m.new_session().unwrap_err().kind(), ErrorKind::RamBudget, "a fourth does not fit");
    drop(s1);
    assert_eq!(m.memory_use().state, 2 * plan.session_bytes, "a dropped session gives its bytes back");
    let _s3 = m.new_session().unwrap();
    drop(s2);
    // The command line shows the plan of N sessions.
    let (code, out, err) = waste(&["plan", dir.to_str().unwrap(), "--ctx", "64", "--threads", "2", "--chunk", "4", "--sessions", "3", "--json"]);
    assert_eq!(code, 0, "{err}");
    let doc = waste::format::json::parse(out.as_bytes()).unwrap();
    assert_eq!(doc.get("state_bytes").unwrap().as_u64(), Some(plan3.state_bytes));
    assert_eq!(doc.get("session_bytes").unwrap().as_u64(), Some(plan.session_bytes));
    assert_eq!(doc.get("floor_bytes").unwrap().as_u64(), Some(plan3.floor_bytes()));
}

/// Each token's event carries the expert cache's work for its step, and the model's running
/// statistics add up.
#[test]
fn token_events_carry_each_steps_expert_activity() {
    let c: PathBuf = float_container("olmoe_f32", "events");
    let plan = waste::plan_memory(&c, &opts()).unwrap();
    let mut m = Model::open(&c, &Options { budget: Some(plan.floor_bytes()), ..opts() }).unwrap();
    let before = m.cache_stats().unwrap().clone();
    let params = GenerateParams { max_tokens: 8, stop_at_eos: false, ..GenerateParams::greedy() };
    let mut sum = waste::ExpertActivity::default();
    let mut per_token = Vec::new();
    let summary = m.generate(&[1, 2, 3, 4, 5], &params, |ev| {
        sum.add(&ev.experts);
        per_token.push(ev.experts);
        true
    }).unwrap();
    let after = m.cache_stats().unwrap().clone();
    assert_eq!(per_token.len(), 8);
    assert!(per_token.iter().all(|e| e.hits + e.misses > 0), "every step looks experts up: {per_token:?}");
    // The last token's step (its pass runs with the next turn) is not in any event.
    assert_eq!(summary.experts.hits + summary.experts.misses, (after.hits - before.hits) + (after.misses - before.misses));
    assert_eq!(sum, summary.experts);
    assert_eq!(summary.experts.bytes_read, after.bytes_read - before.bytes_read);
    // The disk's clock too: it ran while the floor budget's small cache read records.
    assert_eq!(summary.experts.disk_busy, after.disk_busy - before.disk_busy);
    assert!(summary.experts.misses > 0 && !summary.experts.disk_busy.is_zero(), "{:?}", summary.experts);
    let stats = m.stats();
    assert_eq!((stats.prefill_tokens, stats.generated_tokens, stats.decode_steps, stats.generations), (5, 8, 7, 1));
    assert_eq!(stats.cache.unwrap().misses, after.misses);
    // A resident model reports zeros, and its totals all the same.
    let mut d = Model::open(oracle("llama_f32").dir.join("model"), &opts()).unwrap();
    d.generate(&[1, 2], &params, |ev| {
        assert_eq!(ev.experts, waste::ExpertActivity::default());
        true
    }).unwrap();
    assert!(d.stats().cache.is_none() && d.stats().generated_tokens == 8);
}
