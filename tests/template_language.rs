//! The Jinja language against Python jinja2: the snippets of
//! `tests/fixtures/chat_templates/language_golden.json` (made by
//! `tools/jinja_language_golden.py` under transformers' chat-template environment) render byte
//! for byte, or fail where jinja2 fails — with the same message for runtime errors.

use crate::common;
use common::*;
use waste::format::json::Json;
use waste::template::{pieces_text, ChatTemplate, Clock, DateTime, RenderOptions};

/// Cases where waste knowingly differs from jinja2, and how (see docs/TEMPLATES.md).
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    ("err_int_overflow_free_in_python", "integers are 64-bit: an overflow is an error, where Python's integers grow"),
    ("known_range_repr", "range() makes a list, which prints as one, where Python prints `range(0, 3)`"),
    ("known_dict_items_repr", "dict.items() makes a list of pairs, where Python prints `dict_items([...])`"),
];

fn render(case: &Json) -> Result<String, waste::Error> {
    let template = case.get("template").and_then(Json::as_str).unwrap();
    let name = case.get("name").and_then(Json::as_str).unwrap();
    let tpl = ChatTemplate::parse(name, template, Vec::new())?;
    let mut messages = Json::Array(Vec::new());
    let mut opts = RenderOptions { clock: Clock::Fixed(DateTime::new(2024, 7, 26, 12, 0, 0).unwrap()), ..RenderOptions::default() };
    for (k, v) in case.get("vars").and_then(Json::as_object).unwrap() {
        match k.as_str() {
            "messages" => messages = v.clone(),
            "add_generation_prompt" => opts.add_generation_prompt = v.as_bool().unwrap(),
            _ => opts.vars.push((k.clone(), v.clone())),
        }
    }
    tpl.render(&messages, &opts).map(|p| pieces_text(&p))
}

#[test]
fn snippets_render_as_jinja2_does() {
    let cases = read_json(&fixture("chat_templates/language_golden.json"));
    let cases = cases.as_array().unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let name = case.get("name").and_then(Json::as_str).unwrap();
        let got = render(case);
        let want_text = case.get("rendered").and_then(Json::as_str);
        let want_err = case.get("error").and_then(Json::as_str);
        let err_type = case.get("error_type").and_then(Json::as_str).unwrap_or("");
        let ok = match (&got, want_text, want_err) {
            (Ok(t), Some(w), _) => t == w,
            // Syntax errors must be errors; their wording is ours.
            (Err(e), _, Some(_)) if err_type == "TemplateSyntaxError" => e.kind() == waste::ErrorKind::Template,
            // `raise_exception` gives the message itself; other runtime errors name the template
            // and line, then give Python's message.
            (Err(e), _, Some(w)) if err_type == "TemplateError" => e.message() == w,
            (Err(e), _, Some(w)) => e.message().ends_with(w),
            _ => false,
        };
        let known = KNOWN_DIFFERENCES.iter().find(|(n, _)| *n == name);
        match (ok, known) {
            (true, None) | (false, Some(_)) => {}
            (true, Some((_, why))) => failures.push(format!("{name}: listed as a known difference ({why}) but agrees now")),
            (false, None) => failures.push(format!("{name}:\n  got  {:?}\n  want {:?}", got.map_err(|e| e.to_string()),
                want_text.map(str::to_string).ok_or(want_err))),
        }
    }
    println!("template language: {} snippets, {} known differences, {} failed", cases.len(), KNOWN_DIFFERENCES.len(), failures.len());
    assert!(failures.is_empty(), "{} snippets differ from jinja2:\n{}", failures.len(), failures.join("\n"));
}
