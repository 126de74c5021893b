//! The embedded default model, stories260K (a real trained Llama), against llama2.c's published
//! greedy sample: prompt ids, every continuation id, and the decoded text character for
//! character. Also the CLI that `make run` drives.

use crate::common;
use common::*;
use waste::{GenerateParams, Model, Options};

fn golden() -> (Vec<u32>, String) {
    let g = read_json(&fixture("stories260K_golden.json"));
    (ids_of(g.get("greedy_ids").unwrap()), g.get("greedy_text").unwrap().as_str().unwrap().to_string())
}

fn model() -> Model {
    Model::open(root().join("models/stories260K"), &Options::default()).unwrap()
}

#[test]
fn prompt_tokenizes_to_the_golden_ids() {
    let (ids, _) = golden();
    let m = model();
    assert_eq!(m.tokenize_prompt("Once upon a time").unwrap(), ids[..5]);
}

#[test]
fn greedy_continuation_is_the_published_sample() {
    let (ids, text) = golden();
    let mut m = model();
    let params = GenerateParams { max_tokens: ids.len() - 5, ..GenerateParams::greedy() };
    let mut streamed = String::from("Once upon a time");
    let summary = m.generate(&ids[..5], &params, |ev| {
        streamed.push_str(ev.text);
        true
    }).unwrap();
    assert_eq!(summary.ids, ids[5..]);
    assert_eq!(streamed, text);
    assert_eq!(m.tokenizer().unwrap().detokenize(&ids).unwrap(), text);
}

#[test]
fn token_events_carry_the_logits_each_token_was_drawn_from() {
    let mut m = model();
    let prompt = m.tokenize_prompt("Once upon a time").unwrap();
    let params = GenerateParams { max_tokens: 12, ..GenerateParams::greedy() };
    let vocab = m.info().vocab;
    let (mut checked, mut last_logits) = (0, None);
    let mut reference = model();
    let mut ids = prompt.clone();
    m.generate(&prompt, &params, |ev| {
        match ev.id {
            Some(id) => {
                assert_eq!(ev.logits.len(), vocab);
                // The same logits as a fresh evaluation of the sequence so far, bit for bit.
                let want = reference.eval(&ids[reference.position()..]).unwrap();
                assert!(ev.logits.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "token {}", ev.index);
                let top = waste::sample::top_k_distribution(ev.logits, 1)[0];
                assert_eq!(top.id, id, "greedy takes the argmax of the event's logits");
                let lp = waste::sample::log_probability(ev.logits, id).unwrap();
                assert!((lp.exp() - top.prob).abs() < 1e-12);
                let tok = ev.tokenizer.expect("the model's tokenizer is lent to the callback");
                assert!(tok.token_bytes(id).is_ok());
                ids.push(id);
                checked += 1;
            }
            None => last_logits = Some(ev.logits.len()),
        }
        true
    }).unwrap();
    assert_eq!(checked, 12);
    assert!(last_logits.is_none_or(|n| n == 0), "the final event has no logits");
}

#[test]
fn make_run_command_prints_the_story() {
    let (_, text) = golden();
    let (code, out, err) = waste(&["run", "models/stories260K", "Once upon a time", "-n", "252", "--temp", "0"]);
    assert_eq!(code, 0, "{err}");
    let err = summary(&err);
    assert_eq!(out.trim_end_matches('\n'), text);
    // One summary line: decode figures, then the prefill's, then why it stopped.
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("[252 tokens, ") && err.contains(" tok/s | prefill 5 tokens, ") && err.trim_end().ends_with("| stop: token limit]"), "{err}");
}

#[test]
fn prompt_from_stdin_and_file_equal_the_argument() {
    let dir = temp_dir("prompt-file");
    let f = dir.join("prompt.txt");
    std::fs::write(&f, "Once upon a time").unwrap();
    let arg = waste(&["run", "models/stories260K", "Once upon a time", "-n", "8", "--temp", "0"]).1;
    let piped = waste_stdin(&["run", "models/stories260K", "-n", "8", "--temp", "0"], Some("Once upon a time")).1;
    let dash = waste_stdin(&["run", "-n", "8", "models/stories260K", "-", "--temp", "0"], Some("Once upon a time")).1;
    let file = waste(&["run", "models/stories260K", "--file", f.to_str().unwrap(), "-n", "8", "--temp", "0"]).1;
    assert!(arg.starts_with("Once upon a time, there was"), "{arg}");
    assert_eq!(arg, piped);
    assert_eq!(arg, dash);
    assert_eq!(arg, file);
}

#[test]
fn stop_strings_fire_across_token_boundaries() {
    // " Lily" is split across tokens in this vocabulary; the text before it is printed, the
    // stop string is not.
    let (code, out, _) = waste(&["run", "models/stories260K", "Once upon a time", "-n", "100", "--temp", "0", "--stop", "named Li", "--stop", "zzz"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim_end(), "Once upon a time, there was a little girl");
}

#[test]
fn seeded_sampling_is_reproducible() {
    let run = |seed: &str| waste(&["run", "models/stories260K", "Once upon a time", "-n", "40", "--temp", "1", "--seed", seed]).1;
    let a = run("42");
    assert_eq!(a, run("42"));
    assert_ne!(a, run("43"));
}

#[test]
fn usage_errors_name_the_argument_and_exit_2() {
    for (args, needle) in [
        (&["run", "models/stories260K", "hi", "--bogus"][..], "--bogus"),
        (&["run", "models/stories260K", "--temp"], "--temp"),
        (&["run", "models/stories260K", "hi", "--temp", "-1"], "--temp"),
        (&["run", "models/stories260K", "a", "b"], "`b`"),
        (&["run", "models/stories260K", "--top-p", "1.5"], "--top-p"),
        (&["eval", "models/stories260K", "--ids", "1,x"], "x"),
        (&["nosuch"], "nosuch"),
    ] {
        let (code, _, err) = waste(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let (code, _, err) = waste(&["run", "/nonexistent/model", "hi"]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/model"), "{err}");
}

#[test]
fn help_describes_every_command() {
    let (code, out, _) = waste(&["--help"]);
    assert_eq!(code, 0);
    for cmd in ["run", "eval", "info", "bench", "version"] {
        assert!(out.contains(cmd), "{out}");
        let (code, help, _) = waste(&[cmd, "--help"]);
        assert_eq!(code, 0);
        assert!(help.contains(&format!("Usage: waste {cmd}")), "{help}");
    }
}

#[test]
fn eval_dumps_logits_of_every_position() {
    let dir = temp_dir("dump");
    let path = dir.join("logits.f32");
    let (code, out, err) = waste(&["eval", "models/stories260K", "--ids", "1,403,407,261,378", "--top", "3", "--json", "--dump-logits", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let logits = read_f32(&path);
    assert_eq!(logits.len(), 5 * 512);
    let doc = waste::format::json::parse(out.as_bytes()).unwrap();
    let top = doc.get("top").unwrap().as_array().unwrap();
    assert_eq!(top.len(), 3);
    // The top candidate after the prompt is the golden next token, and its logit is the dump's.
    assert_eq!(top[0].get("id").unwrap().as_u64(), Some(432));
    let l = top[0].get("logit").unwrap().as_f64().unwrap() as f32;
    assert_eq!(l, logits[4 * 512 + 432]);
}

#[test]
fn info_json_reports_the_shape() {
    let (code, out, _) = waste(&["info", "models/stories260K", "--json"]);
    assert_eq!(code, 0);
    let doc = waste::format::json::parse(out.as_bytes()).unwrap();
    assert_eq!(doc.get("layers").unwrap().as_u64(), Some(5));
    assert_eq!(doc.get("vocab").unwrap().as_u64(), Some(512));
    assert_eq!(doc.get("parameters").unwrap().as_u64(), Some(260_032));
    assert_eq!(doc.get("architecture").unwrap().as_str(), Some("LlamaForCausalLM"));
}
