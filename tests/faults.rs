//! Faults (issue 16): a bank truncated under a running model, a device that returns EIO (a
//! FUSE filesystem failing reads on demand, `common::fuse`), a full disk under each writer
//! (quantize, convert, state save), and kill -9 at many points of a write. What must hold: a
//! clear error naming what failed, the model usable for the next request, and on disk either
//! the old file, resumable state that finishes byte-identical, or nothing — never a file that
//! opens wrong. Cases the machine cannot run print `SKIP:`.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use waste::{Model, Options};


fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_waste"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A random model made by the CLI from `config` (a container when `container`).
fn random_model(tag: &str, config: &str, container: bool) -> PathBuf {
    let dir = temp_dir(tag);
    let cfg = dir.join("config.json");
    std::fs::write(&cfg, config).unwrap();
    let out = dir.join(if container { "m.waste" } else { "m" });
    let mut args = vec!["random-model", "--config", s(&cfg), "--out", s(&out)];
    args.extend(if container { vec!["--container", "--experts", "q4"] } else { vec!["--dtype", "f32", "--seed", "3"] });
    let (code, _, err) = waste(&args);
    assert_eq!(code, 0, "{err}");
    out
}

/// A MoE with more experts than the smallest cache holds (so a generation keeps reading).
const MOE: &str = r#"{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "moe_intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "num_experts": 16, "num_experts_per_tok": 2, "norm_topk_prob": true, "vocab_size": 96,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 256}"#;

/// A dense float model of ~12 MB whose shapes quantize (32-aligned), slow enough to write
/// that a kill lands inside the write.
const DENSE: &str = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 1024,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 256}"#;

/// The container opened with the smallest expert cache (so a generation keeps reading), its
/// records read by `io_threads` I/O threads (0: on the compute thread).
fn streamed(dir: &Path, io_threads: usize) -> Model {
    let manifest = waste::format::container::Manifest::open(dir).unwrap();
    let opts = Options { cache_bytes: waste::cache::min_cache_bytes(&manifest), io_threads, threads: 1, ..Options::default() };
    Model::open(dir, &opts).unwrap()
}

#[test]
fn a_bank_truncated_under_a_running_model_fails_the_request_and_the_next_one_works() {
    let dir = random_model("faults-truncate", MOE, true);
    let mut m = streamed(&dir, 0);
    let prompt: Vec<u32> = (1..40).collect();
    let reference = m.eval(&prompt).unwrap().to_vec();
    let bank = dir.join("experts-001.bank");
    let saved = std::fs::read(&bank).unwrap();
    // Truncated while open: the request that needs a missing record fails naming it.
    std::fs::OpenOptions::new().write(true).open(&bank).unwrap().set_len(saved.len() as u64 / 3).unwrap();
    m.session_mut().reset();
    let e = m.eval(&prompt).unwrap_err().to_string();
    println!("truncated bank: {e}");
    assert!(e.contains("layer 1") && e.contains("expert") && e.contains("experts-001.bank"), "{e}");
    // Put back (a replaced file): the next request, on a reset session, works and agrees.
    std::fs::write(&bank, &saved).unwrap();
    m.session_mut().reset();
    let again = m.eval(&prompt).unwrap().to_vec();
    assert!(bit_identical(&reference, &again), "logits after the bank came back differ");
    // Replaced by a file of the same size holding other bytes: whatever the logits, no panic
    // and the model still answers after the original returns.
    std::fs::write(&bank, vec![0xffu8; saved.len()]).unwrap();
    m.session_mut().reset();
    let r = m.eval(&prompt).map(|l| l.len());
    println!("bank replaced by 0xff bytes: {:?}", r.as_ref().map_err(|e| e.to_string()));
    std::fs::write(&bank, &saved).unwrap();
    m.session_mut().reset();
    assert!(bit_identical(&reference, m.eval(&prompt).unwrap()));
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn a_device_returning_eio_fails_the_request_naming_layer_and_expert() {
    // A real EIO from the kernel's read path: the bank is served by a one-file FUSE filesystem
    // (tests/common/fuse.rs) that fails reads on demand — what a `dm-error` table gives, on a
    // machine without device-mapper. Needs root and /dev/fuse.
    let test = "a_device_returning_eio_fails_the_request_naming_layer_and_expert";
    let dir = random_model("faults-eio", MOE, true);
    let bank = dir.join("experts-001.bank");
    let bytes = std::fs::read(&bank).unwrap();
    let fs = match common::fuse::FaultyFile::mount(&dir.parent().unwrap().join("fuse"), bytes) {
        Ok(fs) => fs,
        Err(why) => {
            skip(test, &format!("cannot mount a FUSE filesystem here: {why}"));
            let _ = std::fs::remove_dir_all(dir.parent().unwrap());
            return;
        }
    };
    std::fs::remove_file(&bank).unwrap();
    std::os::unix::fs::symlink(fs.path(), &bank).unwrap();
    // Both read paths: on the compute thread, and through the I/O threads.
    for io_threads in [0, 2] {
        let mut m = streamed(&dir, io_threads);
        let prompt: Vec<u32> = (1..40).collect();
        let reference = m.eval(&prompt).unwrap().to_vec();
        let served = fs.faults.reads_served.load(std::sync::atomic::Ordering::SeqCst);
        assert!(served > 0, "no read reached the FUSE bank: the test would prove nothing");
        // The device fails: the request that needs a record it holds fails, naming it.
        fs.faults.fail_reads.store(true, std::sync::atomic::Ordering::SeqCst);
        m.session_mut().reset();
        let e = m.eval(&prompt).unwrap_err().to_string();
        println!("EIO from the device ({io_threads} I/O threads): {e}");
        assert!(fs.faults.reads_failed.load(std::sync::atomic::Ordering::SeqCst) > 0);
        assert!(e.contains("layer 1") && e.contains("expert") && e.contains("experts-001.bank"), "{e}");
        assert!(e.contains("Input/output error") || e.contains("os error 5"), "the error hides the EIO: {e}");
        // The device recovers: the same model answers the next request, on a reset session,
        // with the same bits.
        fs.faults.fail_reads.store(false, std::sync::atomic::Ordering::SeqCst);
        m.session_mut().reset();
        let again = m.eval(&prompt).unwrap().to_vec();
        assert!(bit_identical(&reference, &again), "logits after the device recovered differ ({io_threads} I/O threads)");
    }
    drop(fs);
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop; `None` (SKIP) when
/// mounting is not allowed here.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(tag: &str, size: &str) -> Option<Tmpfs> {
        let dir = temp_dir(tag);
        let ok = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", s(&dir)])
            .stderr(Stdio::null()).status().is_ok_and(|st| st.success());
        ok.then(|| Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_full_disk_under_each_writer_is_a_clear_error_and_leaves_nothing_that_looks_finished() {
    let Some(fs) = Tmpfs::mount("faults-full", "1m") else {
        skip("a_full_disk_under_each_writer", "cannot mount a tmpfs here (not root, or no mount permission)");
        return;
    };
    let dense = random_model("faults-full-dense", DENSE, false);
    // quantize: ~3 MB of output into 1 MiB.
    let out = fs.0.join("q");
    let (code, _, err) = waste(&["quantize", "--bits", "8", "--in", s(&dense), "--out", s(&out)]);
    println!("quantize onto a full disk: exit {code}: {}", err.trim());
    assert_ne!(code, 0);
    assert!(err.contains("No space left") && err.contains("removed"), "{err}");
    assert!(!out.exists(), "the --out directory it created is still there: {:?}", listing(&out));
    // convert: a MoE checkpoint bigger than the disk.
    let moe_hf = fixture("oracles/mixtral_f32/model");
    let out = fs.0.join("c.waste");
    let (code, _, err) = waste(&["convert", "--in", s(&moe_hf), "--out", s(&out), "--trunk", "f32", "--experts", "f32"]);
    println!("convert onto a full disk: exit {code}: {}", err.trim());
    if code == 0 {
        println!("(the conversion fit in 1 MiB)");
    } else {
        assert!(err.contains("No space left"), "{err}");
        assert!(err.contains("removed") || err.contains("resumes"), "the error does not say what was left: {err}");
        assert!(waste::format::container::Manifest::open(&out).is_err(), "a failed conversion left a container that opens");
    }
    let _ = std::fs::remove_dir_all(&out);
    // state save: the disk filled to the last byte, then a session saved onto it.
    let filler = fs.0.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
    }
    let mut m = Model::open(root().join("models/stories260K"), &Options::default()).unwrap();
    m.eval(&[1, 403, 407]).unwrap();
    let state = fs.0.join("s.state");
    let e = m.session().save_state(&state).unwrap_err().to_string();
    println!("state save onto a full disk: {e}");
    assert!(e.contains("s.state") && e.contains("No space left"), "{e}");
    assert_eq!(listing(&fs.0), vec!["filler".to_string()], "something was left beside the filler");
    // The model is unaffected: the same session saves once there is room.
    std::fs::remove_file(&filler).unwrap();
    m.session().save_state(&state).unwrap();
    m.session_mut().load_state(&state).unwrap();
    let _ = std::fs::remove_dir_all(dense.parent().unwrap());
}

/// Runs `cmd` and kills it with SIGKILL after `after` (if it is still running); true if it
/// was killed.
fn kill_after(mut cmd: Command, after: Duration) -> bool {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        if start.elapsed() >= after {
            let _ = child.kill();
            let _ = child.wait();
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Kill points: from right after the start to the end of a run of `full`.
fn offsets(full: Duration, n: u32) -> Vec<Duration> {
    (0..n).map(|i| full.mul_f64(i as f64 / (n - 1) as f64)).collect()
}

fn timed(mut cmd: Command) -> Duration {
    let t = Instant::now();
    assert!(cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap().success());
    t.elapsed()
}

#[test]
fn kill_9_during_quantize_leaves_the_old_file_or_nothing() {
    let dense = random_model("faults-kill-quant", DENSE, false);
    let work = dense.parent().unwrap().to_path_buf();
    let clean = work.join("clean");
    let quant = |out: &Path| {
        let mut c = bin();
        c.args(["quantize", "--bits", "4", "--in", s(&dense), "--out", s(out)]);
        c
    };
    let full = timed(quant(&clean));
    let want = std::fs::read(clean.join("model.safetensors")).unwrap();
    let (mut killed, mut absent, mut whole) = (0, 0, 0);
    for (i, at) in offsets(full, 30).into_iter().enumerate() {
        let out = work.join(format!("k{i}"));
        killed += kill_after(quant(&out), at) as u32;
        match std::fs::read(out.join("model.safetensors")) {
            Err(_) => absent += 1,
            Ok(got) => {
                assert!(got == want, "kill at {at:?}: model.safetensors is there but differs from a clean run's");
                whole += 1;
            }
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    println!("quantize ({full:?} clean): {killed} of 30 runs killed; afterwards {absent} had no weights, {whole} had the finished file");
    assert!(killed >= 5, "too few kills landed inside the run to mean anything");
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn kill_9_during_convert_resumes_to_byte_identical_output() {
    // A Hugging Face MoE checkpoint (2.8 MB) from the oracle fixtures.
    let hf = fixture("oracles/mixtral_f32/model");
    let work = temp_dir("faults-kill-convert");
    let conv = |out: &Path| {
        let mut c = bin();
        c.args(["convert", "--in", s(&hf), "--out", s(out), "--trunk", "bf16", "--experts", "q8"]);
        c
    };
    let clean = work.join("clean.waste");
    let full = timed(conv(&clean));
    let files = listing(&clean);
    let mut killed = 0;
    for (i, at) in offsets(full, 20).into_iter().enumerate() {
        let out = work.join(format!("k{i}.waste"));
        killed += kill_after(conv(&out), at) as u32;
        // Whatever is there either refuses to open or is the finished container...
        if let Ok(m) = waste::format::container::Manifest::open(&out) {
            drop(m);
        }
        // ...and the same command finishes it to the clean run's bytes.
        let (code, _, err) = waste(&["convert", "--in", s(&hf), "--out", s(&out), "--trunk", "bf16", "--experts", "q8"]);
        assert_eq!(code, 0, "resume after a kill at {at:?}: {err}");
        assert_eq!(listing(&out), files, "kill at {at:?}: other files");
        for f in &files {
            assert!(std::fs::read(out.join(f)).unwrap() == std::fs::read(clean.join(f)).unwrap(), "kill at {at:?}: {f} differs after resuming");
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    println!("convert ({full:?} clean): {killed} of 20 runs killed, each resumed to byte-identical files");
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn kill_9_during_a_state_save_leaves_the_old_state_or_the_new_one() {
    let dir = temp_dir("faults-kill-state");
    let state = dir.join("s.state");
    let model = root().join("models/stories260K");
    // The old state: a short session.
    let (code, _, err) = waste(&["run", s(&model), "Once", "-n", "2", "--temp", "0", "--save-state", s(&state)]);
    assert_eq!(code, 0, "{err}");
    let old = std::fs::read(&state).unwrap();
    let run = || {
        let mut c = bin();
        c.args(["run", s(&model), "Once upon a time there was", "-n", "200", "--temp", "0", "--save-state", s(&state)]);
        c
    };
    let full = timed(run());
    let new = std::fs::read(&state).unwrap();
    assert_ne!(old, new);
    let (mut killed, mut olds, mut news) = (0, 0, 0);
    for at in offsets(full, 30) {
        std::fs::write(&state, &old).unwrap();
        killed += kill_after(run(), at) as u32;
        let got = std::fs::read(&state).unwrap();
        if got == old {
            olds += 1;
        } else {
            assert!(got == new, "kill at {at:?}: the state file is neither the old one nor the new one");
            news += 1;
        }
        let stray: Vec<String> = listing(&dir).into_iter().filter(|n| n != "s.state").collect();
        assert!(stray.iter().all(|n| !n.ends_with(".state")), "kill at {at:?}: {stray:?} left beside it");
    }
    // What the kills left (`.s.state.PID.N.tmp` of dead writers) the next save sweeps.
    let left = listing(&dir).len() - 1;
    let (code, _, err) = waste(&["run", s(&model), "Once", "-n", "2", "--temp", "0", "--save-state", s(&state)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(listing(&dir), ["s.state"], "the next save left the killed writers' temp files");
    println!("state save ({full:?} clean): {killed} of 30 runs killed; {olds} left the old state, {news} the new one; \
temp files left: {left}, swept by the next save");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A dead process's id: a child that has exited and been reaped (`None` if the id was
/// reused at once, or there is no /proc to tell).
fn dead_pid() -> Option<u32> {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let gone = Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{pid}")).exists();
    gone.then_some(pid)
}

/// The temp files of writers killed inside a write (planted: one of a dead process, one of
/// this live test process, which stands for another writer still at work) meet the next
/// state save and hotlist write of the same file: the dead one's is removed, the live one's
/// kept, and nothing else is touched.
#[test]
fn the_next_write_sweeps_a_dead_writers_temp_file_and_keeps_a_live_ones() {
    let Some(dead) = dead_pid() else {
        skip("the_next_write_sweeps_a_dead_writers_temp_file", "no /proc, or the exited child's pid was reused at once");
        return;
    };
    let live = std::process::id();
    let dir = temp_dir("faults-sweep-state");
    let state = dir.join("s.state");
    let model = root().join("models/stories260K");
    let planted = [format!(".s.state.{dead}.0.tmp"), format!(".s.state.{live}.0.tmp"), format!(".t.state.{dead}.0.tmp")];
    for n in &planted {
        std::fs::write(dir.join(n), b"torn").unwrap();
    }
    let (code, _, err) = waste(&["run", s(&model), "Once", "-n", "2", "--temp", "0", "--save-state", s(&state)]);
    assert_eq!(code, 0, "{err}");
    let mut want = vec![planted[1].clone(), planted[2].clone(), "s.state".to_string()];
    want.sort();
    assert_eq!(listing(&dir), want, "state save");
    let _ = std::fs::remove_dir_all(&dir);

    let container = random_model("faults-sweep-usage", MOE, true);
    let planted = [format!(".usage.waste.{dead}.3.tmp"), format!(".usage.waste.{live}.0.tmp")];
    for n in &planted {
        std::fs::write(container.join(n), b"torn").unwrap();
    }
    assert!(learning_run(&container, "2", "2").stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap().success());
    let left: Vec<String> = listing(&container).into_iter().filter(|n| n.contains("usage.waste")).collect();
    assert_eq!(left, [planted[1].clone(), "usage.waste".to_string()], "hotlist write");
    let _ = std::fs::remove_dir_all(container.parent().unwrap());
}

/// `bench --learn` on a MoE container (a random one has no tokenizer, so not `run`): it
/// counts the experts its tokens use and adds them to `usage.waste` beside the container.
fn learning_run(container: &Path, prompt_tokens: &str, tokens: &str) -> Command {
    let mut c = bin();
    c.args(["bench", s(container), "--prompt-tokens", prompt_tokens, "-n", tokens, "--threads", "1", "--learn"]);
    c
}

#[test]
fn kill_9_during_a_hotlist_write_leaves_the_old_file_or_the_new_one() {
    let container = random_model("faults-kill-usage", MOE, true);
    let usage = container.join(waste::cache::usage::FILE_NAME);
    // The old file: a short learning run.
    assert!(learning_run(&container, "2", "2").stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap().success());
    let old = std::fs::read(&usage).unwrap();
    // The new one: the old counts plus a longer run's (greedy, so every run counts the same).
    let long = || learning_run(&container, "8", "120");
    let full = timed(long());
    let new = std::fs::read(&usage).unwrap();
    assert_ne!(old, new, "the longer run counted nothing");
    let (mut killed, mut olds, mut news, mut temps) = (0, 0, 0, 0);
    for at in offsets(full, 30) {
        std::fs::write(&usage, &old).unwrap();
        killed += kill_after(long(), at) as u32;
        let got = std::fs::read(&usage).unwrap();
        if got == old {
            olds += 1;
        } else {
            assert!(got == new, "kill at {at:?}: usage.waste is neither the old file nor the new one ({} bytes)", got.len());
            news += 1;
        }
        // A kill inside the write may leave its hidden temp file (as the state writer's does),
        // never anything else that could be taken for the hotlist.
        let stray: Vec<String> = listing(&container).into_iter().filter(|n| n.contains("usage") && n != waste::cache::usage::FILE_NAME).collect();
        assert!(stray.iter().all(|n| n.starts_with(".usage.waste.") && n.ends_with(".tmp")), "kill at {at:?}: {stray:?} left beside usage.waste");
        temps = stray.len();
    }
    // What the kills left (`.usage.waste.PID.N.tmp` of dead writers) the next write sweeps.
    assert!(learning_run(&container, "2", "2").stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap().success());
    let stray: Vec<String> = listing(&container).into_iter().filter(|n| n.starts_with(".usage.waste.")).collect();
    assert!(stray.is_empty(), "the next write left the killed writers' temp files: {stray:?}");
    println!("hotlist write ({full:?} clean): {killed} of 30 runs killed; {olds} left the old file, {news} the new one; \
temp files there after the last kill: {temps}, swept by the next write");
    let _ = std::fs::remove_dir_all(container.parent().unwrap());
}

#[test]
fn a_full_disk_under_the_hotlist_writer_is_a_clear_error_and_keeps_the_old_file() {
    let Some(fs) = Tmpfs::mount("faults-full-usage", "1m") else {
        skip("a_full_disk_under_the_hotlist_writer", "cannot mount a tmpfs here (not root, or no mount permission)");
        return;
    };
    let container = random_model("faults-full-usage-model", MOE, true);
    let mut m = streamed(&container, 0);
    m.learn_usage(true).unwrap();
    m.eval(&[1, 2, 3, 4]).unwrap();
    // The old file, on the small disk.
    let usage = fs.0.join(waste::cache::usage::FILE_NAME);
    m.write_usage(Some(&usage)).unwrap();
    let old = std::fs::read(&usage).unwrap();
    // The disk filled to the last byte, then more usage written.
    let filler = fs.0.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
        while f.write_all(&[0]).is_ok() {}
    }
    m.eval(&[5, 6, 7, 8, 9]).unwrap();
    let e = m.write_usage(Some(&usage)).unwrap_err().to_string();
    println!("hotlist write onto a full disk: {e}");
    assert!(e.contains("usage.waste") && e.contains("No space left"), "{e}");
    assert!(std::fs::read(&usage).unwrap() == old, "the old usage.waste changed");
    assert_eq!(listing(&fs.0), vec!["filler".to_string(), "usage.waste".to_string()], "something was left beside them");
    // Nothing counted was lost: once there is room, the write holds the new counts too.
    std::fs::remove_file(&filler).unwrap();
    m.write_usage(Some(&usage)).unwrap();
    assert!(std::fs::read(&usage).unwrap() != old, "the counts of the failed write were lost");
    let _ = std::fs::remove_dir_all(container.parent().unwrap());
}
