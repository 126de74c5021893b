//! Hugging Face `tokenizer.json` tokenizers against the `tokenizers` library: DeepSeek-V3's
//! byte-level BPE on 276 texts (tools/deepseek_golden.py), in markup and content mode.

use crate::common;

use waste::Tokenizer;

/// DeepSeek-V3's tokenizer.json (4.3 MB, MIT; copied from the shared reference data with its
/// LICENSE) ships in the fixtures, so this runs on every clone.
fn deepseek() -> Tokenizer {
    Tokenizer::from_file(&common::fixture("tokenizers/deepseek_v3_tokenizer.json")).unwrap()
}

fn golden() -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let g = common::read_json(&common::fixture("tokenizers/deepseek_v3_golden.json"));
    g.get("cases").unwrap().as_array().unwrap().iter().map(|c| {
        (c.get("text").unwrap().as_str().unwrap().to_string(), common::ids_of(c.get("markup").unwrap()), common::ids_of(c.get("content").unwrap()))
    }).collect()
}

#[test]
fn deepseek_v3_matches_hf_tokenizers() {
    let tok = deepseek();
    let cases = golden();
    assert!(cases.len() >= 200);
    let mut failures = Vec::new();
    for (text, markup, content) in &cases {
        if &tok.tokenize_markup(text) != markup {
            failures.push(format!("markup {text:?}: got {:?} want {markup:?}", tok.tokenize_markup(text)));
        }
        if &tok.tokenize(text) != content {
            failures.push(format!("content {text:?}: got {:?} want {content:?}", tok.tokenize(text)));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len() * 2, failures.join("\n"));
}

#[test]
fn deepseek_v3_round_trips_and_keeps_markup_apart() {
    let tok = deepseek();
    for (text, _, _) in golden() {
        let ids = tok.tokenize(&text);
        assert!(ids.iter().all(|&id| !tok.is_control(id)), "{text:?}");
        assert_eq!(tok.detokenize(&ids).unwrap(), text);
    }
    let user = tok.special_tokens().into_iter().find(|(s, _)| s == "<｜User｜>").unwrap().1;
    let eos = tok.special_tokens().into_iter().find(|(s, _)| s == "<｜end▁of▁sentence｜>").unwrap().1;
    assert_eq!(tok.eos(), [eos]);
    let text = "hi<｜User｜>x<｜end▁of▁sentence｜>";
    assert!(!tok.tokenize(text).contains(&user) && !tok.tokenize(text).contains(&eos));
    let m = tok.tokenize_markup(text);
    assert_eq!(m.iter().filter(|&&i| i == user || i == eos).count(), 2);
    assert!(tok.is_control(eos) && !tok.is_control(user));
}

const FAMILIES: [&str; 7] = ["gpt2", "smollm2", "qwen2", "olmoe", "llama3", "llama2", "llama2_metaspace"];

/// Each family's pipeline (tools/hf_family_fixtures.py: small trained vocabularies wired like
/// the published tokenizer.json files) against the `tokenizers` library.
#[test]
fn family_pipelines_match_hf_tokenizers() {
    let g = common::read_json(&common::fixture("tokenizers/hf/golden.json"));
    let mut failures = Vec::new();
    let mut checked = 0;
    for name in FAMILIES {
        let tok = Tokenizer::from_file(&common::fixture(&format!("tokenizers/hf/{name}.json"))).unwrap();
        let fam = g.get("families").unwrap().get(name).unwrap();
        let bos = fam.get("bos").unwrap().as_u64().map(|b| b as u32);
        assert_eq!(tok.bos(), bos, "{name} bos");
        for c in fam.get("cases").unwrap().as_array().unwrap() {
            let text = c.get("text").unwrap().as_str().unwrap();
            let (markup, content) = (common::ids_of(c.get("markup").unwrap()), common::ids_of(c.get("content").unwrap()));
            if tok.tokenize_markup(text) != markup {
                failures.push(format!("{name} markup {text:?}: got {:?} want {markup:?}", tok.tokenize_markup(text)));
            }
            if tok.tokenize(text) != content {
                failures.push(format!("{name} content {text:?}: got {:?} want {content:?}", tok.tokenize(text)));
            }
            let back = tok.detokenize(&content).unwrap();
            let decoded = c.get("decoded").unwrap().as_str().unwrap();
            if back != decoded {
                failures.push(format!("{name} decode {content:?}: got {back:?}, HF gives {decoded:?}"));
            }
            // The NFC families give back the normalized text; `<unk>` (characters the small
            // SentencePiece-style vocabularies lack) has no way back.
            let want = if name == "qwen2" || name == "olmoe" { waste::tokenizer::nfc_unicode9(text).into_owned() } else { text.to_string() };
            if !name.starts_with("llama2") && back != want {
                failures.push(format!("{name} round trip {text:?}: {back:?}"));
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(checked >= 7 * 160);
}

fn family(name: &str) -> Tokenizer {
    Tokenizer::from_file(&common::fixture(&format!("tokenizers/hf/{name}.json"))).unwrap()
}

/// Qwen's `<think>` is an added token with `normalized: true`: the library matches it on the
/// NFC-normalized text, where `>` + U+0338 has become `≯`, so it is no longer there. Expected
/// ids are the `tokenizers` library's (0.23.3).
#[test]
fn normalized_added_tokens_match_on_normalized_text() {
    let tok = family("qwen2");
    assert_eq!(tok.tokenize_markup("<think>\u{338}"), [27, 350, 267, 74, 158, 231, 107]);
    assert_eq!(tok.tokenize_markup("a<think>\u{338}b"), [64, 27, 350, 267, 74, 158, 231, 107, 65]);
    assert_eq!(tok.tokenize_markup("<think>"), [1003]);
    // `<|im_end|>` is `normalized: false`: found in the raw text, before NFC could merge its `>`.
    assert_eq!(tok.tokenize_markup("x<|im_end|>\u{338}<think>\u{338}"), [87, 1002, 136, 116, 27, 350, 267, 74, 158, 231, 107]);
}

/// `lstrip`/`rstrip` take Unicode White_Space (the library's `\s`), not ASCII whitespace:
/// U+3000 and U+0085 go, U+001C (not White_Space, though Python's `isspace` says so) stays.
/// gpt2.json with its `<|endoftext|>` set to strip on both sides; ids from `tokenizers` 0.23.3.
#[test]
fn added_token_strip_takes_unicode_whitespace() {
    let src = std::fs::read_to_string(common::fixture("tokenizers/hf/gpt2.json")).unwrap();
    let edited = src.replacen("\"lstrip\": false,\n      \"rstrip\": false,", "\"lstrip\": true,\n      \"rstrip\": true,", 1);
    assert_ne!(edited, src, "gpt2.json's added token no longer has the expected layout");
    let dir = common::temp_dir("strip");
    let p = dir.join("tokenizer.json");
    std::fs::write(&p, edited).unwrap();
    let tok = Tokenizer::from_file(&p).unwrap();
    assert_eq!(tok.tokenize_markup("a\u{3000}<|endoftext|>\u{3000}b"), [64, 1000, 65]);
    assert_eq!(tok.tokenize_markup("a\u{1c}<|endoftext|>\u{85}b"), [64, 216, 1000, 65]);
    assert_eq!(tok.tokenize_markup(" <|endoftext|> <|endoftext|> x"), [1000, 1000, 87]);
}

/// Streams `ids` through a [`waste::Detokenizer`], returning every push's output.
fn streamed(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
    let mut d = tok.detokenizer();
    let mut parts: Vec<String> = ids.iter().map(|&id| d.push(tok, id).unwrap()).collect();
    parts.push(d.finish());
    parts
}

/// `ByteFallback`: a run of `<0xXX>` tokens that is not valid UTF-8 as a whole becomes one
/// U+FFFD per token (the library's rule), not a lossy decoding of its bytes. Expected text
/// from `tokenizers` 0.23.3 on llama2.json (1000 + b is `<0xb>`, 62 is `V`, 1 and 2 `<s>` `</s>`).
#[test]
fn byte_fallback_runs_decode_like_the_library() {
    let tok = family("llama2");
    let cases: [(&[u32], &str); 7] = [
        (&[1228, 1065], "\u{FFFD}\u{FFFD}"),
        (&[62, 1242, 1018], "V\u{FFFD}\u{FFFD}"),
        (&[1228, 1184, 1173, 62], "中V"),
        (&[1228, 1184, 1173, 1128], "\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}"),
        (&[1228, 1184, 1173], "中"),
        (&[1032, 1228, 1184, 1173], "中"),
        (&[1, 1228, 1184, 1173, 2, 62], "中V"),
    ];
    for (ids, want) in cases {
        assert_eq!(tok.detokenize(ids).unwrap(), want, "{ids:?}");
        let parts = streamed(&tok, ids);
        assert_eq!(parts.concat(), want, "{ids:?} streamed");
        // A byte token's push gives nothing: its run is held until it ends, so a U+FFFD (or
        // a character that could still turn into U+FFFDs) never comes out early.
        for (k, &id) in ids.iter().enumerate() {
            if (1000..1256).contains(&id) {
                assert_eq!(parts[k], "", "{ids:?}: push {k}");
            }
        }
    }
    // A run is held back whole: nothing of 中 comes out before the run ends.
    assert_eq!(streamed(&tok, &[1228, 1184, 1173, 62]), ["", "", "", "中V", ""]);
}

/// A `Metaspace` decoder drops the `▁` of the first token's string, before `ByteFallback`:
/// a leading `<0x20>` byte token is a real space (llama2_metaspace.json; HF gives " x").
#[test]
fn metaspace_keeps_a_first_byte_token_space() {
    let tok = family("llama2_metaspace");
    assert_eq!(tok.detokenize(&[1032, 96]).unwrap(), " x");
    assert_eq!(tok.detokenize(&[96, 1032, 96]).unwrap(), "x x");
    assert_eq!(streamed(&tok, &[1032, 96]).concat(), " x");
}
