//! The command line as a user meets it: closed pipes, arguments that are not UTF-8, `--`,
//! the run summary and why generation stopped, range and size messages, help.

use crate::common;
use common::*;
use std::ffi::OsString;
use std::process::{Command, Stdio};

const M: &str = "models/stories260K";

/// Runs the binary with raw OS arguments; returns (status, stdout, stderr).
fn waste_os(args: &[OsString]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_waste")).args(args).stdin(Stdio::null()).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Runs the binary with stdout a pipe whose reader has already gone; returns (status, stderr).
fn with_closed_stdout(args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_waste")).args(args)
        .stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_closed_stdout_ends_commands_quietly() {
    for args in [&["info", M][..], &["info", M, "--json"], &["run", M, "Once", "-n", "400", "--temp", "0", "--ignore-eos"],
        &["eval", M, "--ids", "1,2"], &["tokenize", M, "Once upon a time"], &["--help"], &["run", "--help"], &["version"]] {
        let (code, err) = with_closed_stdout(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
        // Quietly: no summary of a run whose output nobody read.
        assert!(!err.contains("tokens,"), "{args:?}: {err}");
    }
    // A reader that leaves mid-stream: generation stops, the pipeline succeeds.
    let line = format!("'{}' run {M} Once -n 400 --temp 0 --ignore-eos | head -c 10 >/dev/null; echo \"${{PIPESTATUS[0]}}\"",
        env!("CARGO_BIN_EXE_waste"));
    match Command::new("bash").arg("-c").arg(&line).output() {
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0", "{err}");
            assert!(!err.contains("panicked"), "{err}");
        }
        Err(e) => skip("a_closed_stdout_ends_commands_quietly", &format!("no bash for the pipeline case: {e}")),
    }
}

#[test]
fn a_full_disk_on_stdout_is_an_error() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return skip("a_full_disk_on_stdout_is_an_error", "no /dev/full");
    };
    let out = Command::new(env!("CARGO_BIN_EXE_waste")).args(["info", M]).stdout(full).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("standard output") && err.contains("No space left"), "{err}");
}

#[cfg(unix)]
#[test]
fn arguments_that_are_not_utf8() {
    use std::os::unix::ffi::OsStringExt;
    let os = |b: &[u8]| OsString::from_vec(b.to_vec());
    // Text: a usage error naming the argument.
    let (code, out, err) = waste_os(&[os(b"run"), os(M.as_bytes()), os(b"Once\xff")]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(err.contains("PROMPT") && err.contains("UTF-8") && !err.contains("panicked"), "{err}");
    let (code, _, err) = waste_os(&[os(b"run"), os(M.as_bytes()), os(b"hi"), os(b"--stop"), os(b"\xfe")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--stop") && err.contains("UTF-8"), "{err}");
    // A path may be any bytes: a model directory whose name is not UTF-8 opens.
    let dir = temp_dir("non-utf8");
    let model = dir.join(os(b"m\xff"));
    std::os::unix::fs::symlink(root().join(M), &model).unwrap();
    let (code, out, err) = waste_os(&[os(b"info"), model.into_os_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("LlamaForCausalLM"), "{out}");
    let prompt = dir.join(os(b"p\xff.txt"));
    std::fs::write(&prompt, "Once upon a time").unwrap();
    let (code, out, err) = waste_os(&[os(b"run"), os(M.as_bytes()), os(b"--file"), prompt.into_os_string(), os(b"-n"), os(b"4"), os(b"--temp"), os(b"0")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("Once upon a time"), "{out}");
    // A command name that is not UTF-8 is simply unknown.
    let (code, _, err) = waste_os(&[os(b"r\xffn")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown command"), "{err}");
}

#[test]
fn double_dash_and_inline_values() {
    let (code, out, err) = waste(&["run", M, "-n", "2", "--temp", "0", "--", "-hello"]);
    let err = summary(&err);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("-hello"), "{out}");
    assert!(err.starts_with("[2 tokens, "), "{err}");
    let (code, _, err) = waste(&["run", M, "-hello"]);
    assert_eq!(code, 2);
    assert!(err.contains("`-hello`") && err.contains("`--`"), "{err}");
    for n in [&["-n=3"][..], &["-n3"], &["--n=3"]] {
        let mut args = vec!["run", M, "Once", "--temp=0"];
        args.extend_from_slice(n);
        let (code, _, err) = waste(&args);
        let err = summary(&err);
        assert_eq!(code, 0, "{n:?}: {err}");
        assert!(err.starts_with("[3 tokens, "), "{n:?}: {err}");
    }
    let (_, help, _) = waste(&["run", "--help"]);
    assert!(help.contains("--name=VALUE") && help.contains("after `--`"), "{help}");
}

/// The summary line says why generation stopped, and a prompt longer than the context fails
/// before stdout sees anything.
#[test]
fn the_summary_says_why_generation_stopped() {
    let stop = |args: &[&str]| {
        let (code, out, err) = waste(args);
        let err = summary(&err);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one summary line: {err}");
        (out, err)
    };
    let (_, err) = stop(&["run", M, "Once upon a time", "-n", "3", "--temp", "0"]);
    assert!(err.contains("| stop: token limit]"), "{err}");
    // stories260K ends its stories with BOS, not EOS: a copy whose generation_config names the
    // greedy token after the prompt (432, the golden sample's) as end of sequence stops there.
    let eos = temp_dir("eos");
    for f in ["config.json", "model.safetensors", "tok512.bin"] {
        std::fs::copy(root().join(M).join(f), eos.join(f)).unwrap();
    }
    std::fs::write(eos.join("generation_config.json"), r#"{"eos_token_id": [2, 432]}"#).unwrap();
    let (out, err) = stop(&["run", eos.to_str().unwrap(), "Once upon a time", "-n", "50", "--temp", "0"]);
    assert!(err.starts_with("[0 tokens, ") && err.contains("| stop: end of sequence]"), "{err}");
    assert_eq!(out, "Once upon a time\n");
    let (_, err) = stop(&["run", M, "Once upon a time", "-n", "100", "--temp", "0", "--stop", "girl"]);
    assert!(err.contains("| stop: stop string]"), "{err}");
    let (out, err) = stop(&["run", M, "Once", "-n", "100000", "--temp", "0", "--ignore-eos"]);
    assert!(err.contains("| stop: context full]"), "{err}");
    // The context is 512: 2 prompt tokens (BOS, "Once") and 510 generated, the last of them
    // needing no forward pass.
    assert!(err.starts_with("[511 tokens, "), "{err}");
    assert!(out.len() > 1000, "{out}");
    let (out, err) = stop(&["run", M, "Once upon a time", "--ctx", "12", "-n", "100", "--temp", "0", "--ignore-eos"]);
    assert!(err.starts_with("[8 tokens, ") && err.contains("| stop: context full]"), "{err}");
    assert!(out.starts_with("Once upon a time"), "{out}");

    let (code, out, err) = waste(&["run", M, "Once upon a time", "--ctx", "4"]);
    assert_eq!((code, out.as_str()), (1, ""), "nothing may be printed: {err}");
    assert!(err.contains("context full") && err.contains("5 tokens") && err.contains("context of 4"), "{err}");
}

#[test]
fn the_summary_is_one_line_with_the_clock_seed_in_it() {
    let (code, _, err) = waste(&["run", M, "Once", "-n", "5", "--temp", "1"]);
    let err = summary(&err);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let seed: u64 = err.split("| seed ").nth(1).and_then(|s| s.trim_end().trim_end_matches(']').parse().ok())
        .unwrap_or_else(|| panic!("no seed in {err}"));
    // The printed seed reproduces the run.
    let again = |s: &str| waste(&["run", M, "Once", "-n", "5", "--temp", "1", "--seed", s]);
    let (_, out_a, err_a) = again(&seed.to_string());
    assert!(!err_a.contains("seed"), "an explicit seed is not repeated: {err_a}");
    assert_eq!(out_a, again(&seed.to_string()).1);
    // Greedy runs have no seed to report.
    assert!(!waste(&["run", M, "Once", "-n", "5", "--temp", "0"]).2.contains("seed"));
    // The decode rate is steps over decode time: with one token there is no decode step.
    let (_, _, err) = waste(&["run", M, "Once", "-n", "1", "--temp", "0"]);
    let err = summary(&err);
    assert!(err.starts_with("[1 tokens, 0.00 s, - tok/s | prefill 2 tokens, "), "{err}");
}

#[test]
fn range_and_size_messages() {
    for (opt, rule) in [("--top-p", "must be > 0 and <= 1"), ("--repeat-penalty", "must be > 0 and <= 100")] {
        let (code, _, err) = waste(&["run", M, "hi", opt, "0"]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(&format!("option `{opt}`: 0 {rule}")), "{err}");
        assert!(!err.contains("e-38") && !err.contains("0.0000000"), "{err}");
    }
    // One parser and one message for --budget, whichever command takes it.
    let mut messages = Vec::new();
    for cmd in ["plan", "info", "run"] {
        let (code, _, err) = waste(&[cmd, M, "--budget", "4iB"]);
        assert_eq!(code, 2, "{cmd}: {err}");
        messages.push(err.split_once(": ").map(|(_, m)| m.to_string()).unwrap_or_default());
    }
    assert!(messages[0].starts_with("option `--budget`: `4iB` is not a size"), "{messages:?}");
    assert!(messages.iter().all(|m| *m == messages[0]), "{messages:?}");
    let (code, out, err) = waste(&["info", M, "--budget", "4GiB", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("\"budget_bytes\": {}", 4u64 << 30)), "{out}");
}

/// A budget the engine chose is reported on stderr before the summary; one the user gave is not
/// repeated.
#[test]
fn a_chosen_budget_is_reported_and_a_given_one_is_not() {
    let (code, _, err) = waste(&["run", M, "Once", "-n", "2", "--temp", "0"]);
    assert_eq!(code, 0, "{err}");
    let first = err.lines().next().unwrap_or("");
    assert!(first.starts_with("[budget ") && first.contains("chosen: ") && first.contains("holding "), "{err}");
    assert_eq!(err.lines().count(), 2, "{err}");
    let (code, _, err) = waste(&["run", M, "Once", "-n", "2", "--temp", "0", "--budget", "64M"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.starts_with("[2 tokens, ") && err.lines().count() == 1, "{err}");
}

#[test]
fn dump_errors_name_the_target_and_the_reason() {
    let (code, _, err) = waste(&["eval", M, "--ids", "1,2", "--dump-logits", "/nonexistent/x.f32"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("/nonexistent/x.f32: cannot create: No such file or directory"), "{err}");
    assert!(!err.contains(".tmp"), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "the reason is told once: {err}");
}

#[test]
fn help_and_the_bare_command() {
    let (code, out, err) = waste(&[]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("usage: waste COMMAND") && err.contains("--help"), "{err}");
    for (args, usage) in [(&["help", "run"][..], "Usage: waste run MODEL"), (&["help", "bench", "cache"], "Usage: waste bench cache"),
        (&["help", "bench"], "Usage: waste bench MODEL"), (&["help"], "Commands:")] {
        let (code, out, err) = waste(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains(usage), "{args:?}: {out}");
    }
    assert_eq!(waste(&["help", "run"]).1, waste(&["run", "--help"]).1);
    let (code, _, err) = waste(&["help", "nosuch"]);
    assert_eq!(code, 2);
    assert!(err.contains("nosuch"), "{err}");
}

/// The eval command prints the library's distribution: the softmax of the last position.
#[test]
fn eval_prints_the_library_distribution() {
    let (code, out, err) = waste(&["eval", M, "--ids", "1,403,407", "--top", "512", "--json"]);
    assert_eq!(code, 0, "{err}");
    let doc = waste::format::json::parse(out.as_bytes()).unwrap();
    let top = doc.get("top").unwrap().as_array().unwrap();
    assert_eq!(top.len(), 512);
    let total: f64 = top.iter().map(|c| c.get("prob").unwrap().as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-6, "{total}");
    let mut m = waste::Model::open(root().join(M), &waste::Options { threads: 1, ..Default::default() }).unwrap();
    let want = waste::sample::top_k_distribution(m.eval(&[1, 403, 407]).unwrap(), 3);
    for (c, w) in top.iter().zip(&want) {
        assert_eq!(c.get("id").unwrap().as_u64(), Some(w.id as u64));
        assert!((c.get("prob").unwrap().as_f64().unwrap() - w.prob).abs() < 1e-9);
    }
}
