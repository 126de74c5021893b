//! Chat templates against Python jinja2: every golden case of the real templates in
//! `tests/fixtures/chat_templates` (rendered by `make_golden.py` there, under transformers'
//! rules) renders byte for byte, and raises the same message where jinja2 raises.

mod common;
use common::*;
use std::path::PathBuf;
use waste::format::json::Json;
use waste::template::{pieces_text, ChatTemplate, Clock, DateTime, RenderOptions};

fn template_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixture("chat_templates")).unwrap()
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
    let (mut total, mut failures) = (0, Vec::new());
    for dir in template_dirs() {
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
                (Err(e), _, Some(want)) if e.message() == want && e.kind() == waste::ErrorKind::Template => {}
                (Err(e), _, Some(want)) => failures.push(format!("{id}: error {e}, want {want:?}")),
                (Err(e), Some(_), _) => failures.push(format!("{id}: {e}")),
                (Ok(p), None, want) => failures.push(format!("{id}: rendered {:?}, want the error {want:?}", pieces_text(&p))),
                (Err(e), None, None) => failures.push(format!("{id}: {e} (the golden has neither text nor error)")),
            }
        }
    }
    println!("chat templates: {total} golden cases, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {total} cases differ:\n{}", failures.len(), failures.join("\n"));
    assert!(total >= 200, "only {total} golden cases found");
}
