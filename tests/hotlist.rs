//! The learned hotlist (seed 001, "Learned hotlist"): a run with `learn_usage` writes
//! `usage.waste` beside the container; the next open preloads the experts it lists, so the
//! same workload misses less from its first tokens — with the same logits, bit for bit; a
//! damaged or foreign usage file is ignored with a note, never trusted.

use crate::common;
use common::*;
use std::path::Path;
use waste::{Model, Options};

/// Opens the container with half its experts' bytes as cache, runs the oracle prompt a
/// token at a time, and gives the logits, the misses and the notes of the open. Without the
/// look-ahead: its reads land whenever they land, so with it the miss counts would not repeat.
fn run(dir: &Path, hotlist: bool, learn: bool) -> (Vec<f32>, u64, Vec<String>) {
    let manifest = waste::format::container::Manifest::open(dir).unwrap();
    let opts = Options { cache_bytes: waste::cache::min_cache_bytes(&manifest).max(manifest.expert_bytes() / 2), io_threads: 2,
        hotlist, lookahead: false, ..Options::default() };
    let mut m = Model::open(dir, &opts).unwrap();
    if learn {
        m.learn_usage(true).unwrap();
    }
    let prompt = oracle("olmoe_f32").prompt;
    let tokens: Vec<u32> = prompt.iter().chain(&prompt).copied().collect();
    let logits = prompt_logits(&mut m, &tokens, true);
    if learn {
        assert_eq!(m.write_usage(None).unwrap(), dir.join("usage.waste"));
    }
    (logits, m.cache_stats().unwrap().misses, m.notes().to_vec())
}

#[test]
fn a_learned_hotlist_means_fewer_misses_and_the_same_logits() {
    let dir = float_container("olmoe_f32", "hotlist");
    let (cold, cold_misses, notes) = run(&dir, true, true);
    assert!(notes.is_empty(), "no usage file yet: {notes:?}");
    assert!(dir.join("usage.waste").is_file());
    let (again, misses, _) = run(&dir, false, false);
    assert!(bit_identical(&cold, &again) && misses == cold_misses, "without the hotlist: as cold");
    let (warm, warm_misses, notes) = run(&dir, true, false);
    assert!(notes.len() == 1 && notes[0].contains("hotlist: preloading") && notes[0].contains("usage.waste"), "{notes:?}");
    assert!(bit_identical(&cold, &warm), "preloading changes when bytes move, never the logits");
    println!("misses over the prompt twice: cold {cold_misses}, with the hotlist {warm_misses}");
    assert!(warm_misses < cold_misses, "cold {cold_misses}, warm {warm_misses}");

    // Learning again adds to the file: twice the tokens.
    let before = usage_tokens(&dir.join("usage.waste"));
    let _ = run(&dir, true, true);
    assert_eq!(usage_tokens(&dir.join("usage.waste")), 2 * before);
}

#[test]
fn a_damaged_or_foreign_usage_file_is_ignored_with_a_note() {
    let dir = float_container("olmoe_f32", "hotlist-bad");
    let (cold, cold_misses, _) = run(&dir, false, true);
    let file = dir.join("usage.waste");
    let good = std::fs::read(&file).unwrap();
    let manifest = waste::format::container::Manifest::open(&dir).unwrap();
    let experts = manifest.config.moe.as_ref().unwrap().experts;
    let foreign = {
        let mut u = waste::cache::usage::Usage::new(manifest.banks.len(), experts);
        u.tokens = 1;
        u.counts.iter_mut().for_each(|c| *c = 1);
        u.encode(&[7; 32])
    };
    let mut flipped = good.clone();
    flipped[60] ^= 0x10;
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("a flipped count", flipped, "CRC-32"),
        ("truncated", good[..good.len() - 1].to_vec(), "bytes"),
        ("another model's", foreign, "another model"),
        ("not a usage file", vec![b'x'; good.len()], "magic"),
    ];
    for (what, bytes, why) in cases {
        std::fs::write(&file, &bytes).unwrap();
        let (logits, misses, notes) = run(&dir, true, false);
        assert!(notes.len() == 1 && notes[0].contains("hotlist ignored") && notes[0].contains("usage.waste") && notes[0].contains(why),
            "{what}: {notes:?}");
        assert!(bit_identical(&cold, &logits) && misses == cold_misses, "{what}: nothing preloaded");
    }
}

/// The token count a usage file holds (its header's `tokens` field, docs/CONTAINER.md).
fn usage_tokens(file: &Path) -> u64 {
    let b = std::fs::read(file).unwrap();
    u64::from_le_bytes(b[48..56].try_into().unwrap())
}

/// `waste serve --learn --usage-file F`: what the requests routed reaches F once the queue is
/// idle, counted once (not again at the stop); the next server preloads it and says so.
#[test]
fn serve_learns_between_requests_and_the_next_server_preloads() {
    use common::server::{usage, Server};
    let dir = float_container("olmoe_f32", "hotlist-serve");
    let file = temp_dir("hotlist-serve-file").join("learned.waste");
    let f = file.to_str().unwrap();
    let prompt = oracle("olmoe_f32").prompt;
    let body = format!(r#"{{"prompt": {prompt:?}, "max_tokens": 4, "temperature": 0}}"#);
    let s = Server::start(&dir, &["--learn", "--usage-file", f, "--threads", "1", "--no-lookahead"]);
    let r = s.connect().post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let (prompt_tokens, generated, _) = usage(&r.json());
    assert_eq!((prompt_tokens, generated), (prompt.len() as u64, 4));
    // Written when the queue goes idle (it polls every 200 ms), not only at the stop.
    let told = s.wait_log_lines("--learn: expert usage added to", 1);
    assert!(told[0].contains(f), "{told:?}");
    // Every token computed: the prompt and each generated token but the last, fed back.
    let computed = prompt_tokens + generated - 1;
    assert_eq!(usage_tokens(&file), computed);
    let (code, log) = s.stop();
    assert_eq!(code, 0, "{log}");
    assert_eq!(usage_tokens(&file), computed, "the stop writes nothing counted twice");
    assert!(!dir.join("usage.waste").exists(), "--usage-file, not beside the model");

    // The next server, with the same file, preloads from it before its first request.
    let s = Server::start(&dir, &["--usage-file", f, "--threads", "1"]);
    let (code, log) = s.stop();
    assert!(code == 0 && log.contains("waste serve: hotlist: preloading") && log.contains(f), "{log}");

    // `--learn` needs experts: a dense model is refused by name before it serves.
    let (code, _, err) = waste(&["serve", root().join("models/stories260K").to_str().unwrap(), "--port", "0", "--learn"]);
    assert!(code != 0 && err.contains("option `--learn`") && err.contains("no experts"), "{code}: {err}");
}

/// Learning beside a read-only container is refused when it starts, naming the file and the
/// way out (`--usage-file`), not after the run; with a usage file elsewhere it learns there.
/// Needs a read-only mount (root): `SKIP:` otherwise.
#[test]
fn learning_beside_a_read_only_container_is_refused_at_the_start() {
    let src = float_container("olmoe_f32", "hotlist-ro-src");
    let mnt = temp_dir("hotlist-ro");
    let mount = |args: &[&str]| std::process::Command::new("mount").args(args).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success());
    if !mount(&["-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt.to_str().unwrap()]) {
        skip("learning_beside_a_read_only_container_is_refused_at_the_start", "cannot mount a tmpfs here (not root, or no mount permission)");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    let dir = mnt.join("c");
    std::fs::create_dir(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    assert!(mount(&["-o", "remount,ro", mnt.to_str().unwrap()]), "remount read-only");

    let mut m = Model::open(&dir, &Options { threads: 1, ..Options::default() }).unwrap();
    let err = m.learn_usage(true).expect_err("learning beside a read-only container").to_string();
    assert!(err.contains(&dir.join("usage.waste").display().to_string()) && err.contains("--usage-file"), "{err}");
    // The command line says so before it computes anything.
    let (code, out, stderr) = waste(&["run", dir.to_str().unwrap(), "--learn", "-n", "2", "--", "hello"]);
    assert!(code != 0 && stderr.contains("option `--learn`") && stderr.contains("usage.waste") && out.is_empty(), "{code}: {out} {stderr}");

    let elsewhere = temp_dir("hotlist-ro-file").join("learned.waste");
    let mut m = Model::open(&dir, &Options { threads: 1, usage_file: Some(elsewhere.clone()), ..Options::default() }).unwrap();
    m.learn_usage(true).unwrap();
    m.eval(&oracle("olmoe_f32").prompt).unwrap();
    assert_eq!(m.write_usage(None).unwrap(), elsewhere);
    assert!(usage_tokens(&elsewhere) > 0 && !dir.join("usage.waste").exists());
}
