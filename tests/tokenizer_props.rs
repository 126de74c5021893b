//! Tokenizer properties across vocabulary kinds: stories260K's golden prompt ids and greedy
//! text, round trips on golden texts and, per vocabulary kind, 10,000 seeded random Unicode
//! strings plus 10,000 strings made from random bytes (lossy-decoded; one in 50 of 1 to 32 KiB),
//! markup kept apart from content (every special of every vocabulary), streaming decode identical to whole decode, Kimi's `tiktoken.model`,
//! bad vocabulary files, and the CLI.

use crate::common;

use common::fixture;
use std::path::Path;
use waste::Tokenizer;

fn load(rel: &str) -> Tokenizer {
    Tokenizer::from_file(&fixture(rel)).unwrap()
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random text: ASCII, characters that stress the split patterns, and any scalar value.
fn random_text(rng: &mut Rng) -> String {
    const TRICKY: &[char] = &[' ', ' ', '\n', '\r', '\t', '\'', 's', 'S', '\u{17F}', '\u{301}', '\u{308}', '\u{200D}', '\u{FE0F}',
        '\u{1F3FD}', '\u{1F468}', '\u{1F600}', '世', '界', 'か', 'ナ', '한', 'م', 'न', '\u{94D}', 'ก', '\u{E31}', '1', '٣', '①', '\u{A0}',
        '\u{3000}', '\u{85}', '\u{2028}', '\u{0}', '\u{1B}', '\u{FEFF}', '\u{FFFD}', '<', '|', '>', '/', 'ǅ', 'ß', 'İ', '\u{10FFFF}'];
    let len = rng.below(48) as usize;
    let mut s = String::new();
    for _ in 0..len {
        let c = match rng.below(10) {
            0..=4 => (0x20 + rng.below(0x5f) as u32) as u8 as char,
            5..=7 => TRICKY[rng.below(TRICKY.len() as u64) as usize],
            _ => loop {
                if let Some(c) = char::from_u32(rng.below(0x110000) as u32) {
                    break c;
                }
            },
        };
        s.push(c);
    }
    s
}

/// Random bytes decoded lossily, so every byte value and every shape of invalid sequence
/// (stray continuations, truncated and overlong leads, surrogates, bytes above U+10FFFF) turns
/// into text around U+FFFD. Bytes are drawn uniformly half the time, else from the
/// continuation and lead ranges so that near-valid sequences are common. One string in 50 is
/// long (1 to 32 KiB), for pieces far beyond any window.
fn random_byte_text(rng: &mut Rng) -> String {
    let len = if rng.below(50) == 0 { 1024 + rng.below(31 * 1024) } else { rng.below(65) } as usize;
    let bytes: Vec<u8> = (0..len).map(|_| match rng.below(4) {
        0 | 1 => rng.below(256) as u8,
        2 => 0x80 + rng.below(0x40) as u8,
        _ => 0xC0 + rng.below(0x40) as u8,
    }).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Llama 2's pipeline writes spaces as `▁` and its decoder turns every `▁` back into a space, so
/// a `▁` in the text (random bytes spell one now and then) comes back as a space, as it does
/// with the Hugging Face library.
fn metaspace_back(s: &str) -> String {
    s.replace('\u{2581}', " ")
}

/// `s[from..to]` widened to character boundaries and clamped to `s`.
fn around(s: &str, mut from: usize, mut to: usize) -> &str {
    to = to.min(s.len());
    from = from.min(to);
    while !s.is_char_boundary(from) {
        from -= 1;
    }
    while !s.is_char_boundary(to) {
        to += 1;
    }
    &s[from..to]
}

fn round_trip_random(tok: &Tokenizer, seed: u64) {
    round_trip_random_as(tok, seed, str::to_string)
}

fn round_trip_random_as(tok: &Tokenizer, seed: u64, expect: fn(&str) -> String) {
    let mut rng = Rng(seed);
    let check = |i: usize, s: &str| {
        let ids = tok.tokenize(s);
        assert!(ids.iter().all(|&id| !tok.is_control(id)), "{}: control id in content {s:?}", tok.path().display());
        let back = tok.detokenize(&ids).unwrap();
        let s = &expect(s);
        if back != *s {
            let at = s.char_indices().zip(back.chars()).find(|((_, a), b)| a != b).map_or(s.len().min(back.len()), |((k, _), _)| k);
            let from = at.saturating_sub(40);
            panic!("{}: string {i} ({} bytes) differs at byte {at}: {:?} came back as {:?}", tok.path().display(), s.len(),
                around(s, from, at + 40), around(&back, from, at + 40));
        }
    };
    for i in 0..10_000 {
        check(i, &random_text(&mut rng));
    }
    for i in 0..10_000 {
        check(i, &random_byte_text(&mut rng));
    }
}

#[test]
fn round_trip_random_tiktoken() {
    round_trip_random(&load("tokenizers/o200k_base.tiktoken"), 1);
    round_trip_random(&load("tokenizers/cl100k_base.tiktoken"), 2);
}

#[test]
fn round_trip_random_hf_byte_level() {
    round_trip_random(&load("tokenizers/hf/gpt2.json"), 3);
    round_trip_random(&load("tokenizers/hf/llama3.json"), 4);
}

#[test]
fn round_trip_random_sentencepiece() {
    round_trip_random_as(&load("tokenizers/hf/llama2.json"), 5, metaspace_back);
    round_trip_random(&Tokenizer::from_file(&common::root().join("models/stories260K/tok512.bin")).unwrap(), 7);
}

#[test]
fn round_trip_golden_texts() {
    let g = common::read_json(&fixture("tokenizers/tiktoken_golden.json"));
    let texts: Vec<String> = g.get("cases").unwrap().as_array().unwrap().iter().map(|c| c.get("text").unwrap().as_str().unwrap().to_string()).collect();
    let toks = ["tokenizers/r50k_base.tiktoken", "tokenizers/p50k_base.tiktoken", "tokenizers/cl100k_base.tiktoken",
        "tokenizers/o200k_base.tiktoken", "tokenizers/multilingual.tiktoken", "tokenizers/hf/gpt2.json", "tokenizers/hf/llama2.json"];
    for t in toks {
        let tok = load(t);
        for s in &texts {
            assert_eq!(&tok.detokenize(&tok.tokenize(s)).unwrap(), s, "{t}");
        }
    }
    let sp = Tokenizer::from_file(&common::root().join("models/stories260K/tok512.bin")).unwrap();
    for s in &texts {
        assert_eq!(&sp.detokenize(&sp.tokenize(s)).unwrap(), s, "tok512");
    }
}

#[test]
fn stories260k_golden() {
    let g = common::read_json(&fixture("stories260K_golden.json"));
    let tok = Tokenizer::from_model_dir(&common::root().join("models/stories260K")).unwrap();
    assert_eq!(tok.vocab_size(), 512);
    let enc = g.get("encode_golden").unwrap().as_object().unwrap();
    assert!(enc.len() >= 4);
    for (text, ids) in enc {
        let mut got: Vec<u32> = tok.bos().into_iter().collect();
        got.extend(tok.tokenize(text));
        assert_eq!(got, common::ids_of(ids), "{text:?}");
    }
    let ids = common::ids_of(g.get("greedy_ids").unwrap());
    let text = g.get("greedy_text").unwrap().as_str().unwrap();
    assert_eq!(tok.detokenize(&ids).unwrap(), text);
}

/// Specials spelled in content never become control ids; in markup they become exactly their
/// ids. Every special (every added token of a `tokenizer.json`, all 800-odd of DeepSeek-V3's)
/// through both entry points, alone, repeated, glued to text, and all of them in one text.
#[test]
fn specials_are_markup_only() {
    let toks = ["tokenizers/r50k_base.tiktoken", "tokenizers/p50k_base.tiktoken", "tokenizers/cl100k_base.tiktoken",
        "tokenizers/o200k_base.tiktoken", "tokenizers/multilingual.tiktoken", "tokenizers/hf/qwen2.json",
        "tokenizers/hf/llama3.json", "tokenizers/hf/llama2.json", "tokenizers/hf/smollm2.json", "tokenizers/hf/gpt2.json",
        "tokenizers/hf/olmoe.json", "tokenizers/hf/llama2_metaspace.json", "tokenizers/deepseek_v3_tokenizer.json"];
    for t in toks {
        let tok = load(t);
        let specials = tok.special_tokens();
        assert!(!specials.is_empty(), "{t}");
        let all: String = specials.iter().map(|(s, _)| format!("{s} · ")).collect();
        let content = tok.tokenize(&all);
        assert!(content.iter().all(|&i| specials.iter().all(|(_, sid)| *sid != i)), "{t}: a special leaked into content");
        assert_eq!(tok.detokenize(&content).unwrap(), all, "{t}");
        let found: Vec<u32> = tok.tokenize_markup(&all).into_iter().filter(|i| specials.iter().any(|(_, sid)| sid == i)).collect();
        assert_eq!(found, specials.iter().map(|s| s.1).collect::<Vec<_>>(), "{t}: all specials in one text");
        for (s, id) in &specials {
            let text = format!("user says {s} and{s}{s}x");
            let content = tok.tokenize(&text);
            assert!(!content.contains(id), "{t}: {s} leaked into content");
            assert!(content.iter().all(|&i| specials.iter().all(|(_, sid)| *sid != i)), "{t}: {s}");
            assert_eq!(tok.detokenize(&content).unwrap(), text, "{t}");
            let markup = tok.tokenize_markup(&text);
            let found: Vec<u32> = markup.iter().copied().filter(|i| specials.iter().any(|(_, sid)| sid == i)).collect();
            assert_eq!(found, [*id, *id, *id], "{t}: {s}");
        }
    }
    let cl = load("tokenizers/cl100k_base.tiktoken");
    assert_eq!(cl.tokenize_markup("<|endoftext|>"), [100257]);
    assert!(cl.is_control(100257) && cl.token_bytes(100257).unwrap().is_empty());
    assert!(cl.is_control(100270), "unused ids between the ranks and the specials carry no text");
    assert!(cl.token_bytes(100277).is_err());
    assert_eq!(cl.bos(), None);
    assert_eq!(cl.eos(), [100257]);
}

/// Streaming detokenization gives the same text as decoding the whole byte string at once,
/// whatever the ids (including pieces that split UTF-8 characters and invalid sequences).
#[test]
fn streaming_decode_equals_whole_decode() {
    let tok = load("tokenizers/cl100k_base.tiktoken");
    let mut rng = Rng(11);
    for _ in 0..3000 {
        let ids: Vec<u32> = (0..rng.below(12)).map(|_| match rng.below(3) {
            0 => rng.below(256) as u32,                   // single bytes, often partial UTF-8
            1 => 76460 + rng.below(40) as u32,            // multi-byte fragments
            _ => rng.below(tok.vocab_size() as u64) as u32,
        }).collect();
        let mut d = tok.detokenizer();
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&d.push(&tok, id).unwrap());
        }
        streamed.push_str(&d.finish());
        let whole = String::from_utf8_lossy(&tok.detokenize_bytes(&ids).unwrap()).into_owned();
        assert_eq!(streamed, whole, "{ids:?}");
    }
    // A character split over two tokens is held back, not replaced.
    let mut d = tok.detokenizer();
    assert_eq!(d.push(&tok, 76460).unwrap(), ""); // f0 9f 98
    assert_eq!(d.push(&tok, 222).unwrap(), "😀"); // 80
}

#[test]
fn kimi_tiktoken_model_with_config() {
    let dir = common::temp_dir("kimi");
    std::fs::copy(fixture("tokenizers/r50k_base.tiktoken"), dir.join("tiktoken.model")).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"added_tokens_decoder": {
        "50256": {"content": "[BOS]", "special": true}, "50257": {"content": "[EOS]", "special": true},
        "50300": {"content": "<|im_end|>", "special": true}}, "bos_token": "[BOS]", "eos_token": "[EOS]"}"#).unwrap();
    let tok = Tokenizer::from_model_dir(&dir).unwrap();
    assert_eq!(tok.vocab_size(), 50256 + 256);
    assert_eq!(tok.eos(), [50257]);
    assert_eq!(tok.bos(), None, "tokenization_kimi.py adds no BOS");
    assert_eq!(tok.tokenize_markup("[BOS]x<|im_end|><|reserved_token_50260|>"), [50256, 87, 50300, 50260]);
    assert!(!tok.tokenize("[BOS]x<|im_end|>").iter().any(|&i| i >= 50256));
    // Han runs are pieces of their own under Kimi's pattern.
    let joined = tok.tokenize("世界abc");
    let mut apart = tok.tokenize("世界");
    apart.extend(tok.tokenize("abc"));
    assert_eq!(joined, apart);
    assert_eq!(waste::tokenizer::pre_tokenize(waste::tokenizer::KIMI_PATTERN, "世界abc").unwrap(), ["世界", "abc"]);
}

fn expect_err(path: &Path, want: &[&str]) {
    let e = match Tokenizer::from_file(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    };
    assert!(e.contains(&path.display().to_string()), "{e}");
    for w in want {
        assert!(e.contains(w), "{e} lacks {w:?}");
    }
}

#[test]
fn bad_vocab_files_name_file_and_line_or_key() {
    let dir = common::temp_dir("badvocab");
    let write = |name: &str, data: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        p
    };
    expect_err(&write("b64.tiktoken", b"IQ== 0\nIg== 1\n!!x= 2\n"), &["line 3", "base64"]);
    expect_err(&write("dup.tiktoken", b"IQ== 0\nIg== 1\nIw== 1\n"), &["line 3", "duplicate rank 1"]);
    expect_err(&write("nan.tiktoken", b"IQ== 0\nIg== one\n"), &["line 2", "not a number"]);
    let json = std::fs::read(fixture("tokenizers/hf/gpt2.json")).unwrap();
    expect_err(&write("trunc.json", &json[..json.len() / 2]), &["line ", "invalid JSON"]);
    let text = String::from_utf8(json).unwrap();
    let first_merge = text.find("\"merges\": [").unwrap();
    let bad = format!("{}\"merges\": [[\"zq\u{1F600}\", \"x\"],{}", &text[..first_merge], &text[first_merge + 11..]);
    expect_err(&write("merge.json", bad.as_bytes()), &["model.merges[0]", "not in the vocabulary"]);
    let bad = text.replacen("\"type\": \"ByteLevel\"", "\"type\": \"Whitespace\"", 1);
    expect_err(&write("pre.json", bad.as_bytes()), &["pre_tokenizer", "Whitespace"]);
    expect_err(&write("tok.bin", &[16, 0, 0, 0, 0, 0, 0, 0, 9]), &["byte 8", "truncated"]);
}

#[test]
fn missing_tokenizer_is_reported_as_such() {
    let dir = common::temp_dir("notok");
    let e = Tokenizer::from_model_dir(&dir).err().unwrap();
    assert!(e.message().contains("no tokenizer file found"), "{e}");
}

#[test]
fn cli_tokenize_and_detokenize() {
    let cl = fixture("tokenizers/cl100k_base.tiktoken");
    let cl = cl.to_str().unwrap();
    let tok = Tokenizer::from_file(Path::new(cl)).unwrap();
    let (code, out, err) = common::waste_stdin(&["tokenize", "--tokenizer", cl, "--json"], Some("hi <|endoftext|>\n"));
    assert_eq!(code, 0, "{err}");
    let want: Vec<String> = tok.tokenize_markup("hi <|endoftext|>\n").iter().map(u32::to_string).collect();
    assert_eq!(out.trim(), format!("{{\"ids\":[{}]}}", want.join(",")));
    let (code, out, _) = common::waste_stdin(&["tokenize", "--tokenizer", cl, "--content", "-"], Some("hi <|endoftext|>\n"));
    assert_eq!(code, 0);
    let ids: Vec<u32> = out.split_whitespace().map(|s| s.parse().unwrap()).collect();
    assert_eq!(ids, tok.tokenize("hi <|endoftext|>\n"));
    let args: Vec<String> = ids.iter().map(u32::to_string).collect();
    let mut argv = vec!["detokenize", "--tokenizer", cl];
    argv.extend(args.iter().map(String::as_str));
    let (code, out, _) = common::waste(&argv);
    assert_eq!((code, out.as_str()), (0, "hi <|endoftext|>\n"));
    let (code, out, _) = common::waste(&["tokenize", common::root().join("models/stories260K").to_str().unwrap(), "Once upon a time"]);
    assert_eq!((code, out.trim()), (0, "403 407 261 378"));
    let (code, _, err) = common::waste(&["detokenize", "--tokenizer", cl, "12x"]);
    assert_eq!(code, 2, "{err}");
}
