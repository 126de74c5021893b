//! `waste template` as a user meets it: the prompt printed exactly, pieces as JSON, template
//! files and built-ins, stdin, and the errors (exit 2 naming the argument, exit 1 one line).

use crate::common;
use common::*;
use std::io::Write;
use std::process::{Command, Stdio};
use waste::format::json::{self, Json};

/// Runs the binary with `stdin` piped in; returns (status, stdout, stderr).
fn waste(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_waste")).args(args)
        .stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // A command that fails before reading its stdin closes the pipe: that write may fail.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A golden case of a fixture template: (its messages written to a file, the case).
fn golden_case(template: &str, case: &str) -> (String, Json) {
    let cases = read_json(&fixture(&format!("chat_templates/{template}/golden.json")));
    let c = cases.as_array().unwrap().iter().find(|c| c.get("case").and_then(Json::as_str) == Some(case)).unwrap().clone();
    let path = temp_dir(&format!("cli-{template}-{case}")).join("messages.json");
    std::fs::write(&path, c.get("messages").unwrap().to_string_compact()).unwrap();
    (path.to_string_lossy().into_owned(), c)
}

fn dir(template: &str) -> String {
    fixture(&format!("chat_templates/{template}")).to_string_lossy().into_owned()
}

fn rendered(c: &Json) -> &str {
    c.get("rendered").and_then(Json::as_str).unwrap()
}

#[test]
fn prints_the_prompt_exactly() {
    let (msgs, c) = golden_case("qwen2.5-instruct", "special_tokens_and_unicode");
    let (code, out, err) = waste(&["template", &dir("qwen2.5-instruct"), "--messages", &msgs], "");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, rendered(&c), "no newline is added");
    let (msgs, c) = golden_case("qwen3", "system_user_assistant_user_enable_thinking_false");
    let (code, out, err) = waste(&["template", &dir("qwen3"), "--messages", &msgs, "--var", "enable_thinking=false"], "");
    assert_eq!((code, out.as_str()), (0, rendered(&c)), "{err}");
    let (msgs, c) = golden_case("smollm2-instruct", "system_user_assistant_no_gen");
    let (code, out, err) = waste(&["template", &dir("smollm2-instruct"), "--messages", &msgs, "--no-generation-prompt"], "");
    assert_eq!((code, out.as_str()), (0, rendered(&c)), "{err}");
}

#[test]
fn json_output_keeps_markup_and_content_apart() {
    let (msgs, c) = golden_case("llama-3.1-instruct", "special_tokens_and_unicode");
    let (code, out, err) = waste(&["template", &dir("llama-3.1-instruct"), "--messages", &msgs, "--json", "--now", "2024-07-26T12:00:00"], "");
    assert_eq!(code, 0, "{err}");
    let pieces = json::parse(out.as_bytes()).unwrap();
    let mut text = String::new();
    let mut content = String::new();
    for p in pieces.as_array().unwrap() {
        match (p.get("markup"), p.get("content")) {
            (Some(Json::String(m)), None) => text.push_str(m),
            (None, Some(Json::String(t))) => {
                text.push_str(t);
                content.push_str(t);
            }
            other => panic!("not a piece: {other:?}"),
        }
    }
    assert_eq!(text, rendered(&c));
    assert!(content.contains("Tokens: <|begin_of_text|> <|eot_id|>"), "{content}");
}

#[test]
fn template_files_builtins_and_stdin() {
    // A .jinja file stands in for the model; its special tokens come from the
    // tokenizer_config.json beside it; the clock is the goldens'.
    let (msgs, c) = golden_case("gpt-oss", "single_user");
    let file = fixture("chat_templates/gpt-oss/chat_template.jinja");
    let (code, out, err) = waste(&["template", "--template-file", &file.to_string_lossy(), "--messages", &msgs, "--now", "2024-07-26T12:00:00"], "");
    assert_eq!((code, out.as_str()), (0, rendered(&c)), "{err}");
    let config = fixture("chat_templates/deepseek-v3/tokenizer_config.json");
    let (msgs, c) = golden_case("deepseek-v3", "user_assistant_user");
    let stdin = std::fs::read_to_string(&msgs).unwrap();
    let (code, out, err) = waste(&["template", "--template-file", &config.to_string_lossy(), "--messages", "-"], &stdin);
    assert_eq!((code, out.as_str()), (0, rendered(&c)), "{err}");
    let m = r#"[{"role": "user", "content": "Hi"}]"#;
    let (code, out, err) = waste(&["template", "--template", "chatml", "--messages", "-"], m);
    assert_eq!((code, out.as_str()), (0, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), "{err}");
    // A model without a template, with a built-in chosen for it.
    let (code, out, err) = waste(&["template", "models/stories260K", "--template", "llama3", "--messages", "-", "--no-generation-prompt"], m);
    assert_eq!((code, out.as_str()), (0, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"), "{err}");
}

#[test]
fn errors_name_what_is_wrong() {
    let m = r#"[{"role": "user", "content": "Hi"}]"#;
    // No template in the model: exit 1, the missing field and the way out.
    let (code, out, err) = waste(&["template", "models/stories260K", "--messages", "-"], m);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty());
    assert!(err.contains("`chat_template`") && err.contains("tokenizer_config.json") && err.contains("--template chatml|llama3|FILE"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // Bad variables and dates are usage errors naming the option.
    for (args, want) in [
        (&["--var", "x=foo"][..], "`--var`"),
        (&["--var", "noequals"], "`--var`"),
        (&["--now", "2024-02-30"], "`--now`"),
        (&["--bogus"], "`--bogus`"),
    ] {
        let mut all = vec!["template", "--template", "chatml", "--messages", "-"];
        all.extend_from_slice(args);
        let (code, _, err) = waste(&all, m);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let (code, _, err) = waste(&["template", "--template", "chatml"], m);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--messages"), "{err}");
    let (code, _, err) = waste(&["template", "--messages", "-"], m);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("MODEL"), "{err}");
    // The template's own refusal: exit 1 with its message.
    let (code, _, err) = waste(&["template", &dir("mistral-7b-instruct-v0.3"), "--messages", "-"], r#"[{"role": "assistant", "content": "x"}]"#);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim_end(), "waste template: template error: After the optional system message, conversation roles must alternate user/assistant/user/assistant/...");
    // Messages that are not JSON, or not a list.
    let (code, _, err) = waste(&["template", "--template", "chatml", "--messages", "-"], "[{");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("<stdin>") && err.contains("invalid JSON"), "{err}");
    let (code, _, err) = waste(&["template", "--template", "chatml", "--messages", "-"], "{}");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("<stdin>") && err.contains("JSON array of messages"), "{err}");
}
