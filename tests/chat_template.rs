//! Chat templates against Python jinja2: every golden case of the real templates in
//! `tests/fixtures/chat_templates` (rendered by `make_golden.py` there, under transformers'
//! rules) renders byte for byte, and raises the same message where jinja2 raises.

use crate::common;
use common::*;
use std::path::PathBuf;
use waste::format::json::Json;
use waste::template::{pieces_text, ChatTemplate, Clock, DateTime, RenderOptions};

/// The template directories of a fixture root (`chat_templates`: the 13 of the spec;
/// `chat_templates_extra`: 35 more, from openvino.genai's extracts of the Hub's configs).
fn template_dirs(root: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixture(root)).unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("golden.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// The goldens' clock: 2024-07-26 12:00:00.
fn golden_clock() -> Clock {
    Clock::Fixed(DateTime::new(2024, 7, 26, 12, 0, 0).unwrap())
}

fn options(case: &Json) -> RenderOptions {
    let vars = case.get("extra").and_then(Json::as_object).unwrap_or(&[]).to_vec();
    RenderOptions { add_generation_prompt: case.get("add_generation_prompt").and_then(Json::as_bool).unwrap(), vars, clock: golden_clock() }
}

#[test]
fn every_golden_case_renders_as_jinja2_does() {
    let (total, failures) = check_goldens("chat_templates");
    println!("chat templates: {total} golden cases, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {total} cases differ:\n{}", failures.len(), failures.join("\n"));
    assert!(total >= 200, "only {total} golden cases found");
}

#[test]
fn more_real_templates_render_as_jinja2_does() {
    let (total, failures) = check_goldens("chat_templates_extra");
    println!("more chat templates: {total} golden cases, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {total} cases differ:\n{}", failures.len(), failures.join("\n"));
    assert!(total >= 500, "only {total} golden cases found");
}

/// Renders every golden case under `root`: (cases, failures).
fn check_goldens(root: &str) -> (usize, Vec<String>) {
    let (mut total, mut failures) = (0, Vec::new());
    for dir in template_dirs(root) {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let tpl = ChatTemplate::from_model_dir(&dir, None).unwrap().unwrap();
        for case in read_json(&dir.join("golden.json")).as_array().unwrap() {
            total += 1;
            let id = format!("{name}/{}", case.get("case").and_then(Json::as_str).unwrap());
            let specials: Vec<(String, String)> = case.get("special_tokens").and_then(Json::as_object).unwrap().iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())).collect();
            let mut mine = tpl.special_tokens().to_vec();
            mine.sort();
            let mut want = specials.clone();
            want.sort();
            if mine != want {
                failures.push(format!("{id}: special tokens {mine:?}, golden {want:?}"));
            }
            let got = tpl.render(case.get("messages").unwrap(), &options(case));
            match (got, case.get("rendered").and_then(Json::as_str), case.get("error").and_then(Json::as_str)) {
                (Ok(p), Some(want), _) if pieces_text(&p) == want => {}
                (Ok(p), Some(want), _) => failures.push(format!("{id}: rendered\n{:?}\nwant\n{want:?}", pieces_text(&p))),
                // `raise_exception` errors are the message itself; other errors name the
                // template and line first.
                (Err(e), _, Some(want)) if e.kind() == waste::ErrorKind::Template
                    && (e.message() == want || (case.get("error_type").and_then(Json::as_str) != Some("TemplateError")
                        && e.message().ends_with(&format!(": {want}")))) => {}
                (Err(e), _, Some(want)) => failures.push(format!("{id}: error {e}, want {want:?}")),
                (Err(e), Some(_), _) => failures.push(format!("{id}: {e}")),
                (Ok(p), None, want) => failures.push(format!("{id}: rendered {:?}, want the error {want:?}", pieces_text(&p))),
                (Err(e), None, None) => failures.push(format!("{id}: {e} (the golden has neither text nor error)")),
            }
        }
    }
    (total, failures)
}

fn write(dir: &std::path::Path, name: &str, text: &str) {
    std::fs::create_dir_all(dir.join(name).parent().unwrap()).unwrap();
    std::fs::write(dir.join(name), text).unwrap();
}

fn render_empty(t: &ChatTemplate) -> String {
    t.render_text(&Json::Array(Vec::new()), &RenderOptions::default()).unwrap()
}

#[test]
fn a_model_directory_is_searched_in_transformers_order() {
    let d = temp_dir("tpl-order");
    assert!(ChatTemplate::from_model_dir(&d, None).unwrap().is_none(), "no files: no template");
    let config = r#"{"chat_template": "config {{ bos_token }}{{ eos_token }}{{ unk_token }}|{{ pad_token }}",
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false}, "eos_token": "</s>", "unk_token": null}"#;
    write(&d, "tokenizer_config.json", config);
    let t = ChatTemplate::from_model_dir(&d, None).unwrap().unwrap();
    assert_eq!(render_empty(&t), "config <s></s>|");
    assert_eq!(t.special_tokens(), [("bos_token".to_string(), "<s>".to_string()), ("eos_token".to_string(), "</s>".to_string())]);
    assert_eq!(t.end_of_turn(), Some("</s>"));
    write(&d, "chat_template.json", r#"{"chat_template": "json {{ eos_token }}"}"#);
    assert_eq!(render_empty(&ChatTemplate::from_model_dir(&d, None).unwrap().unwrap()), "json </s>");
    write(&d, "chat_template.jinja", "jinja {{ bos_token }}\n");
    let t = ChatTemplate::from_model_dir(&d, None).unwrap().unwrap();
    assert_eq!(render_empty(&t), "jinja <s>");
    assert!(t.name().ends_with("chat_template.jinja"));
}

#[test]
fn named_templates_and_their_errors() {
    let d = temp_dir("tpl-named");
    write(&d, "tokenizer_config.json", r#"{"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]}"#);
    assert_eq!(render_empty(&ChatTemplate::from_model_dir(&d, None).unwrap().unwrap()), "D");
    assert_eq!(render_empty(&ChatTemplate::from_model_dir(&d, Some("tool_use")).unwrap().unwrap()), "T");
    let e = ChatTemplate::from_model_dir(&d, Some("rag")).unwrap_err();
    assert!(e.message().contains("no template named `rag`") && e.message().contains("default, tool_use"), "{e}");
    write(&d, "additional_chat_templates/rag.jinja", "R");
    assert_eq!(render_empty(&ChatTemplate::from_model_dir(&d, Some("rag")).unwrap().unwrap()), "R");
    let bad = temp_dir("tpl-bad");
    write(&bad, "tokenizer_config.json", r#"{"chat_template": 5}"#);
    let e = ChatTemplate::from_model_dir(&bad, None).unwrap_err();
    assert!(e.message().contains("field `chat_template`"), "{e}");
    write(&bad, "tokenizer_config.json", r#"{"chat_template": "x", "eos_token": 3}"#);
    assert!(ChatTemplate::from_model_dir(&bad, None).unwrap_err().message().contains("`eos_token`"));
    write(&bad, "tokenizer_config.json", r#"{"chat_template": "{% if %}"}"#);
    let e = ChatTemplate::from_model_dir(&bad, None).unwrap_err();
    assert_eq!(e.kind(), waste::ErrorKind::Template);
    assert!(e.message().contains("tokenizer_config.json: line 1:"), "{e}");
}

#[test]
fn template_files_take_special_tokens_from_beside_them() {
    let d = temp_dir("tpl-file");
    write(&d, "tokenizer_config.json", r#"{"eos_token": "<|end|>"}"#);
    write(&d, "t.jinja", "{{ eos_token }}!");
    let t = ChatTemplate::from_file(&d.join("t.jinja"), None).unwrap();
    assert_eq!((render_empty(&t).as_str(), t.end_of_turn()), ("<|end|>!", Some("<|end|>")));
    write(&d, "chat_template.json", r#"{"chat_template": "{{ eos_token }}?"}"#);
    assert_eq!(render_empty(&ChatTemplate::from_file(&d.join("chat_template.json"), None).unwrap()), "<|end|>?");
    let swapped = ChatTemplate::builtin("chatml").unwrap().with_special_tokens(vec![("eos_token".into(), "</s>".into())]);
    assert_eq!(swapped.end_of_turn(), Some("<|im_end|>"), "a built-in keeps its end of turn");
    assert!(ChatTemplate::from_file(&d.join("missing.jinja"), None).unwrap_err().message().contains("missing.jinja"));
}

#[test]
fn the_system_clock_is_utc_now() {
    let t = ChatTemplate::parse("clock", "{{ strftime_now('%Y') }}", Vec::new()).unwrap();
    let year: i32 = render_empty(&t).parse().unwrap();
    assert!((2024..3000).contains(&year), "{year}");
    let fixed = RenderOptions { clock: golden_clock(), ..RenderOptions::default() };
    assert_eq!(t.render_text(&Json::Array(Vec::new()), &fixed).unwrap(), "2024");
}

#[test]
fn tool_calling_branches_render_as_jinja2_does() {
    // tools/tool_call_golden.py: the templates that mention `tools`, with a tool list, a tool
    // call and its result (the spec's goldens pass tools = None, leaving these branches unrun).
    let cases = read_json(&fixture("chat_templates/tool_golden.json"));
    let mut failures = Vec::new();
    for case in cases.as_array().unwrap() {
        let template = case.get("template").and_then(Json::as_str).unwrap();
        let id = format!("{template}/{}", case.get("case").and_then(Json::as_str).unwrap());
        let tpl = ChatTemplate::from_model_dir(&fixture(template), None).unwrap().unwrap();
        let opts = RenderOptions {
            add_generation_prompt: case.get("add_generation_prompt").and_then(Json::as_bool).unwrap(),
            vars: vec![("tools".into(), case.get("tools").unwrap().clone())],
            clock: golden_clock(),
        };
        let got = tpl.render(case.get("messages").unwrap(), &opts);
        let ok = match (&got, case.get("rendered").and_then(Json::as_str), case.get("error").and_then(Json::as_str)) {
            (Ok(p), Some(want), _) => pieces_text(p) == want,
            (Err(e), _, Some(want)) if case.get("error_type").and_then(Json::as_str) == Some("TemplateError") => e.message() == want,
            (Err(e), _, Some(want)) => e.message().ends_with(&format!(": {want}")),
            _ => false,
        };
        if !ok {
            failures.push(format!("{id}: {:?}", got.map(|p| pieces_text(&p))));
        }
    }
    println!("tool calling: {} cases, {} failed", cases.as_array().unwrap().len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
