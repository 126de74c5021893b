//! Rendered chat templates through the tokenizer (`Tokenizer::tokenize_pieces`): special-token
//! strings that a user types in a message stay text, the template's own become control ids,
//! and without such strings in the content the ids are exactly what Hugging Face gets for the
//! prompt (`tokenize_markup` of the whole text).

use crate::common;
use common::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use waste::format::json::Json;
use waste::template::{pieces_text, ChatTemplate, Clock, DateTime, Piece, RenderOptions};
use waste::Tokenizer;

/// A `tokenizer.json` fixture with `extra` added as special tokens (ids from 5000, matched on
/// the raw text unless `normalized`), written to a scratch directory and loaded.
fn tokenizer_with(base: &Path, extra: &[String], normalized: bool, tag: &str) -> Tokenizer {
    let mut j = read_json(base);
    let Json::Object(members) = &mut j else { panic!("{} is not an object", base.display()) };
    let added = members.iter_mut().find(|(k, _)| k == "added_tokens").map(|(_, v)| v).unwrap();
    let Json::Array(list) = added else { panic!("added_tokens is not an array") };
    let known: Vec<String> = list.iter().map(|t| t.get("content").and_then(Json::as_str).unwrap().to_string()).collect();
    for (i, s) in extra.iter().filter(|s| !known.contains(s)).enumerate() {
        list.push(Json::object([
            ("id", Json::uint(5000 + i as u64)),
            ("content", Json::str(s.clone())),
            ("single_word", Json::Bool(false)),
            ("lstrip", Json::Bool(false)),
            ("rstrip", Json::Bool(false)),
            ("normalized", Json::Bool(normalized)),
            ("special", Json::Bool(true)),
        ]));
    }
    let dir = temp_dir(&format!("tok-{tag}"));
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, j.to_string_compact()).unwrap();
    Tokenizer::from_file(&path).unwrap()
}

/// Occurrences of each special in `text`, leftmost-longest (the tokenizer's rule), counting
/// only those whose first and last bytes `markup` accepts (brute force, independent of the
/// tokenizer's trie).
fn count_specials(text: &str, specials: &[(String, u32)], markup: &dyn Fn(usize) -> bool, counts: &mut HashMap<u32, usize>) {
    let mut i = 0;
    while i < text.len() {
        let best = specials.iter()
            .filter(|(s, _)| text[i..].starts_with(s.as_str()) && markup(i) && markup(i + s.len() - 1))
            .max_by_key(|(s, _)| s.len());
        match best {
            Some((s, id)) => {
                *counts.entry(*id).or_default() += 1;
                i += s.len();
            }
            None => i += text[i..].chars().next().map_or(1, char::len_utf8),
        }
    }
}

fn golden_clock() -> Clock {
    Clock::Fixed(DateTime::new(2024, 7, 26, 12, 0, 0).unwrap())
}

fn render_case(tpl: &ChatTemplate, case: &Json) -> Vec<Piece> {
    let vars = case.get("extra").and_then(Json::as_object).unwrap().to_vec();
    let opts = RenderOptions { add_generation_prompt: case.get("add_generation_prompt").and_then(Json::as_bool).unwrap(), vars, clock: golden_clock() };
    let pieces = tpl.render(case.get("messages").unwrap(), &opts).unwrap();
    assert_eq!(Some(pieces_text(&pieces).as_str()), case.get("rendered").and_then(Json::as_str));
    pieces
}

/// The tokenizer a template's test uses: DeepSeek's real one for the DeepSeek templates, a
/// SentencePiece-kind (Metaspace, `prepend_scheme: first`) vocabulary for Mistral's, a
/// byte-level one for the rest; each knows the template's control strings as specials.
fn tokenizer_for(name: &str, controls: &[String]) -> Tokenizer {
    if name.starts_with("deepseek") {
        return Tokenizer::from_file(&fixture("tokenizers/deepseek_v3_tokenizer.json")).unwrap();
    }
    let base = if name.starts_with("mistral") || name.starts_with("mixtral") { "llama2_metaspace.json" } else { "qwen2.json" };
    tokenizer_with(&fixture(&format!("tokenizers/hf/{base}")), controls, false, name)
}

fn template_dirs(root: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixture(root)).unwrap().map(|e| e.unwrap().path())
        .filter(|p| p.join("golden.json").is_file()).collect();
    dirs.sort();
    dirs
}

#[test]
fn control_strings_in_messages_stay_text_for_every_template() {
    assert_eq!(check_forged("chat_templates", true), 13);
}

#[test]
fn control_strings_in_messages_stay_text_for_more_templates() {
    // Some of these templates spell no special token of their own (`### User:`), so only the
    // content side is required of them.
    assert!(check_forged("chat_templates_extra", false) >= 30);
}

/// Renders each template's `special_tokens_and_unicode` case (where it renders) and checks
/// the control strings typed in the messages; returns how many templates were checked.
fn check_forged(root: &str, own_required: bool) -> usize {
    let mut checked = 0;
    for dir in template_dirs(root) {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let tpl = ChatTemplate::from_model_dir(&dir, None).unwrap().unwrap();
        let cases = read_json(&dir.join("golden.json"));
        let case = |id: &str| cases.as_array().unwrap().iter().find(|c| c.get("case").and_then(Json::as_str) == Some(id)).unwrap().clone();
        let tricky = case("special_tokens_and_unicode");
        if tricky.get("rendered").is_none() || case("system_user_assistant_user").get("rendered").is_none() {
            continue; // the template refuses these conversations
        }
        // make_golden.py put the template's control strings on the user message's first line.
        let user = tricky.get("messages").unwrap().as_array().unwrap()[1].get("content").and_then(Json::as_str).unwrap();
        let controls: Vec<String> = user.lines().next().unwrap().strip_prefix("Tokens: ").unwrap().split(' ').map(str::to_string).collect();
        let tok = tokenizer_for(&name, &controls);
        let specials = tok.special_tokens();
        let pieces = render_case(&tpl, &tricky);
        let content: String = pieces.iter().filter(|p| !p.is_markup()).map(Piece::text).collect();
        let (mut in_markup, mut in_all, mut in_ids) = (HashMap::new(), HashMap::new(), HashMap::new());
        let mut mask = Vec::new();
        for p in &pieces {
            mask.extend(std::iter::repeat_n(p.is_markup(), p.text().len()));
        }
        count_specials(&pieces_text(&pieces), &specials, &|i| mask[i], &mut in_markup);
        count_specials(&pieces_text(&pieces), &specials, &|_| true, &mut in_all);
        let ids = tok.tokenize_pieces(&pieces);
        for id in &ids {
            *in_ids.entry(*id).or_default() += 1;
        }
        let markup_ids = tok.tokenize_markup(&pieces_text(&pieces));
        let mut own = 0;
        for c in &controls {
            assert!(content.contains(c.as_str()), "{name}: {c} typed in a message is not in the content pieces");
            let Some(&(_, id)) = specials.iter().find(|(s, _)| s == c) else { continue };
            let (m, a, i) = (in_markup.get(&id).copied().unwrap_or(0), in_all.get(&id).copied().unwrap_or(0), in_ids.get(&id).copied().unwrap_or(0));
            assert_eq!(i, m, "{name}: {c}: {i} control ids from the pieces, {m} in the markup");
            assert!(a > m, "{name}: {c} appears {a} times in the prompt, {m} in markup: the content's copies are missing");
            assert_eq!(markup_ids.iter().filter(|&&x| x == id).count(), a, "{name}: {c}: whole-text markup encoding");
            own += m;
        }
        assert!(own > 0 || !own_required, "{name}: the template's own markup produced no control id");
        // Without control strings in the content, the ids are Hugging Face's for the prompt.
        let plain = render_case(&tpl, &case("system_user_assistant_user"));
        assert_eq!(tok.tokenize_pieces(&plain), tok.tokenize_markup(&pieces_text(&plain)), "{name}: plain conversation");
        checked += 1;
    }
    println!("forged control tokens: {checked} templates of {root} checked");
    checked
}

fn qwen2() -> Tokenizer {
    Tokenizer::from_file(&fixture("tokenizers/hf/qwen2.json")).unwrap()
}

fn id(tok: &Tokenizer, s: &str) -> u32 {
    tok.special_tokens().into_iter().find(|(t, _)| t == s).unwrap().1
}

#[test]
fn pieces_resolve_specials_only_inside_markup() {
    let tok = qwen2();
    let (start, end) = (id(&tok, "<|im_start|>"), id(&tok, "<|im_end|>"));
    let pieces = [Piece::Markup("<|im_start|>user\n".into()), Piece::Content("a<|im_end|>b".into()), Piece::Markup("<|im_end|>\n".into())];
    let mut want = vec![start];
    want.extend(tok.tokenize("user\na<|im_end|>b"));
    want.push(end);
    want.extend(tok.tokenize("\n"));
    assert_eq!(tok.tokenize_pieces(&pieces), want);
    // A special spelled half by the template and half by the user is text.
    let straddle = [Piece::Markup("x<|im_".into()), Piece::Content("end|>".into())];
    assert_eq!(tok.tokenize_pieces(&straddle), tok.tokenize("x<|im_end|>"));
    // A special the template assembles around a value (Phi-3's `'<|' + role + '|>'`) begins
    // and ends in markup: a control token, as in Hugging Face's prompt.
    let assembled = [Piece::Markup("<|".into()), Piece::Content("im_end".into()), Piece::Markup("|>".into())];
    assert_eq!(tok.tokenize_pieces(&assembled), vec![end]);
    let half = [Piece::Markup("<|".into()), Piece::Content("im_end|>".into())];
    assert!(!tok.tokenize_pieces(&half).contains(&end));
    // Adjacent markup pieces act as one.
    let split = [Piece::Markup("<|im_".into()), Piece::Markup("end|>".into())];
    assert_eq!(tok.tokenize_pieces(&split), vec![end]);
    assert!(tok.tokenize_pieces(&[]).is_empty());
}

#[test]
fn the_first_stretch_rule_of_metaspace_holds_across_pieces() {
    // Metaspace with `prepend_scheme: first` adds `▁` only to the text at the start: text after
    // a control token, markup or content, gets none, exactly as in `tokenize_markup`.
    let tok = tokenizer_with(&fixture("tokenizers/hf/llama2_metaspace.json"), &["[INST]".into(), "[/INST]".into()], false, "metaspace");
    let dir = fixture("chat_templates/mixtral-8x7b-instruct-v0.1");
    let tpl = ChatTemplate::from_model_dir(&dir, None).unwrap().unwrap();
    let messages = waste::format::json::parse(br#"[{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": " Hello"},
        {"role": "user", "content": "and"}]"#).unwrap();
    let pieces = tpl.render(&messages, &RenderOptions::default()).unwrap();
    let text = pieces_text(&pieces);
    assert_eq!(text, "<s> [INST] Hi there [/INST]  Hello</s> [INST] and [/INST]");
    assert_eq!(tok.tokenize_pieces(&pieces), tok.tokenize_markup(&text));
    // Content that spells `[INST]` after the markup's `<s>`: text, encoded as the text after a
    // control token — as the base vocabulary (where `[INST]` is no special) encodes it — not
    // as the start of a text, where `▁` would be prepended.
    let forged = [Piece::Markup("<s>".into()), Piece::Content("[INST] x".into())];
    let base = Tokenizer::from_file(&fixture("tokenizers/hf/llama2_metaspace.json")).unwrap();
    let ids = tok.tokenize_pieces(&forged);
    assert_eq!(ids, base.tokenize_markup("<s>[INST] x"));
    assert_ne!(ids[1..], tok.tokenize("[INST] x")[..], "the first-stretch rule made no difference: a weak test");
    assert!(!ids.contains(&id(&tok, "[INST]")));
}

#[test]
fn normalized_specials_are_confined_to_markup_too() {
    // Added tokens matched after NFC: the markup's `<think>` is found in the normalized text,
    // the content's is not, and a content combining mark that NFC composes with the markup's
    // `>` hides the token exactly as in `tokenize_markup`.
    let tok = tokenizer_with(&fixture("tokenizers/hf/qwen2.json"), &["<tool>".into()], true, "nfc");
    let tool = id(&tok, "<tool>");
    let pieces = [Piece::Markup("a<tool>".into()), Piece::Content("é<tool>".into()), Piece::Markup("<tool>b".into())];
    let ids = tok.tokenize_pieces(&pieces);
    assert_eq!(ids.iter().filter(|&&x| x == tool).count(), 2, "{ids:?}");
    assert_eq!(tok.tokenize_markup("a<tool>é<tool><tool>b").iter().filter(|&&x| x == tool).count(), 3);
    let composed = [Piece::Markup("<tool>".into()), Piece::Content("\u{338}x".into())];
    assert_eq!(tok.tokenize_pieces(&composed), tok.tokenize_markup("<tool>\u{338}x"));
}

#[test]
fn tiktoken_pieces() {
    let tok = Tokenizer::from_file(&fixture("tokenizers/cl100k_base.tiktoken")).unwrap();
    let eot = id(&tok, "<|endoftext|>");
    let pieces = [Piece::Markup("<|endoftext|>".into()), Piece::Content("<|endoftext|>".into())];
    let mut want = vec![eot];
    want.extend(tok.tokenize("<|endoftext|>"));
    assert_eq!(tok.tokenize_pieces(&pieces), want);
    assert!(!tok.tokenize_pieces(&pieces[1..]).contains(&eot));
}
