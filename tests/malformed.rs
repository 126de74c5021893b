//! Bad input never panics: every malformed checkpoint, header or config below is refused with
//! an error that names the file and the tensor or field (and, for JSON, the byte offset).

use crate::common;
use common::*;
use std::path::Path;
use waste::format::json::{self, Json};
use waste::{Model, Options};

const SOURCE: &str = "oracles/llama_f32/model";

/// The fixture's header as JSON and its data bytes.
fn source() -> (Json, Vec<u8>, Vec<u8>) {
    let bytes = std::fs::read(fixture(SOURCE).join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = json::parse(&bytes[8..8 + n]).unwrap();
    let config = std::fs::read(fixture(SOURCE).join("config.json")).unwrap();
    (header, bytes[8 + n..].to_vec(), config)
}

fn file_bytes(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// Edits the entry of `tensor` in a header.
fn edit(h: &mut Json, tensor: &str, f: impl FnOnce(&mut Vec<(String, Json)>)) {
    let Json::Object(m) = h else { panic!() };
    let (_, e) = m.iter_mut().find(|(k, _)| k == tensor).unwrap();
    let Json::Object(e) = e else { panic!() };
    f(e)
}

fn set(e: &mut Vec<(String, Json)>, key: &str, v: Json) {
    match e.iter_mut().find(|(k, _)| k == key) {
        Some((_, old)) => *old = v,
        None => e.push((key.to_string(), v)),
    }
}

fn offsets(a: u64, b: u64) -> Json {
    Json::Array(vec![Json::uint(a), Json::uint(b)])
}

const T: &str = "model.layers.1.self_attn.k_proj.weight";

/// One case: a directory to write and the words the error must contain.
struct Case {
    name: &'static str,
    weights: Option<Vec<u8>>,
    config: Option<Vec<u8>>,
    extra: Vec<(&'static str, Vec<u8>)>,
    needles: Vec<&'static str>,
}

fn cases() -> Vec<Case> {
    let (header, data, config) = source();
    let h = |f: &dyn Fn(&mut Json)| {
        let mut j = header.clone();
        f(&mut j);
        Some(file_bytes(j.to_string_compact().as_bytes(), &data))
    };
    let c = |f: &dyn Fn(&mut Json)| {
        let mut j = json::parse(&config).unwrap();
        f(&mut j);
        Some(j.to_string_pretty().into_bytes())
    };
    let cfg_set = |key: &'static str, v: Json| c(&move |j: &mut Json| {
        if let Json::Object(m) = j { set(m, key, v.clone()) }
    });
    let cfg_del = |key: &'static str| c(&move |j: &mut Json| {
        if let Json::Object(m) = j { m.retain(|(k, _)| k != key) }
    });
    let k_entry = header.get(T).unwrap().clone();
    let k_off: Vec<u64> = k_entry.get("data_offsets").unwrap().as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let ok_config = Some(config.clone());
    let st = "model.safetensors";
    let mut v = vec![
        Case { name: "truncated file", weights: Some(vec![1, 2, 3]), config: ok_config.clone(), extra: vec![], needles: vec![st, "8-byte"] },
        Case { name: "header length past the end", weights: Some([&200u64.to_le_bytes()[..], b"{}{"].concat()),
            config: ok_config.clone(), extra: vec![], needles: vec![st, "header length 200", "past the end"] },
        Case { name: "header not JSON", weights: Some(file_bytes(b"{\"a\": [1,}", &data)), config: ok_config.clone(), extra: vec![], needles: vec![st, "byte 17"] },
        Case { name: "header invalid UTF-8", weights: Some(file_bytes(b"{\"a\xff\": 1}", &data)), config: ok_config.clone(), extra: vec![], needles: vec![st, "UTF-8", "byte 11"] },
        Case { name: "header not an object", weights: Some(file_bytes(b"[1, 2]", &data)), config: ok_config.clone(), extra: vec![], needles: vec![st, "not a JSON object"] },
        Case { name: "deeply nested header", weights: Some(file_bytes(format!("{{\"x\": {}{}}}", "[".repeat(500), "]".repeat(500)).as_bytes(), &data)),
            config: ok_config.clone(), extra: vec![], needles: vec![st, "nesting"] },
        Case { name: "missing dtype", weights: h(&|j| edit(j, T, |e| e.retain(|(k, _)| k != "dtype"))), config: ok_config.clone(), extra: vec![], needles: vec![st, T, "dtype"] },
        Case { name: "unknown dtype", weights: h(&|j| edit(j, T, |e| set(e, "dtype", Json::str("F7")))), config: ok_config.clone(), extra: vec![], needles: vec![st, T, "unknown dtype `F7`"] },
        Case { name: "bad shape", weights: h(&|j| edit(j, T, |e| set(e, "shape", Json::Array(vec![Json::str("32"), Json::uint(64)])))), config: ok_config.clone(), extra: vec![], needles: vec![st, T, "shape"] },
        Case { name: "offsets past the data", weights: h(&|j| edit(j, T, |e| set(e, "data_offsets", offsets(k_off[0], data.len() as u64 + 8)))), config: ok_config.clone(), extra: vec![], needles: vec![st, T, "data_offsets", "outside"] },
        Case { name: "offsets reversed", weights: h(&|j| edit(j, T, |e| set(e, "data_offsets", offsets(k_off[1], k_off[0])))), config: ok_config.clone(), extra: vec![], needles: vec![st, T, "data_offsets", "reversed"] },
        Case { name: "offsets not two values", weights: h(&|j| edit(j, T, |e| set(e, "data_offsets", Json::Array(vec![Json::uint(0)])))), config: ok_config.clone(), extra: vec![], needles: vec![st, T, "data_offsets"] },
        Case { name: "overlapping tensors", weights: h(&|j| edit(j, T, |e| set(e, "data_offsets", offsets(0, k_off[1] - k_off[0])))), config: ok_config.clone(), extra: vec![], needles: vec![st, T, "overlap"] },
        Case { name: "shape x dtype disagrees with length", weights: h(&|j| edit(j, T, |e| set(e, "dtype", Json::str("F16")))), config: ok_config.clone(), extra: vec![], needles: vec![st, T, "needs"] },
        Case { name: "truncated data", weights: { let mut b = std::fs::read(fixture(SOURCE).join(st)).unwrap(); b.truncate(b.len() - 100); Some(b) },
            config: ok_config.clone(), extra: vec![], needles: vec![st, "data_offsets", "outside"] },
        Case { name: "metadata not strings", weights: h(&|j| if let Json::Object(m) = j { m.insert(0, ("__metadata__".into(), Json::object([("format", Json::uint(1))]))) }),
            config: ok_config.clone(), extra: vec![], needles: vec![st, "__metadata__", "format"] },
        Case { name: "metadata key repeated", weights: Some(file_bytes(br#"{"__metadata__": {"format": "pt", "format": "x"}}"#, &data)),
            config: ok_config.clone(), extra: vec![], needles: vec![st, "__metadata__", "`format` appears twice"] },
        Case { name: "missing tensor", weights: h(&|j| if let Json::Object(m) = j { m.retain(|(k, _)| k != T) }), config: ok_config.clone(), extra: vec![], needles: vec![st, T, "missing"] },
        Case { name: "wrong tensor shape for the config", weights: Some(file_bytes(header.to_string_compact().as_bytes(), &data)),
            config: cfg_set("intermediate_size", Json::uint(96)), extra: vec![], needles: vec![st, "`model.layers.0.mlp.gate_proj.weight`", "[172, 64]", "[96, 64]"] },
        Case { name: "no config", weights: Some(file_bytes(header.to_string_compact().as_bytes(), &data)), config: None, extra: vec![], needles: vec!["config.json", "open"] },
        Case { name: "config not JSON", weights: None, config: Some(b"{\"hidden_size\": 64,\n \"x\": }".to_vec()), extra: vec![], needles: vec!["config.json", "byte 26"] },
        Case { name: "config missing field", weights: None, config: cfg_del("num_attention_heads"), extra: vec![], needles: vec!["config.json", "num_attention_heads", "missing"] },
        Case { name: "config field of the wrong type", weights: None, config: cfg_set("hidden_size", Json::str("64")), extra: vec![], needles: vec!["config.json", "hidden_size"] },
        Case { name: "config value out of range", weights: None, config: cfg_set("num_key_value_heads", Json::uint(3)), extra: vec![], needles: vec!["config.json", "num_key_value_heads"] },
        Case { name: "config unsupported architecture", weights: None, config: cfg_set("architectures", Json::Array(vec![Json::str("MambaForCausalLM")])), extra: vec![], needles: vec!["config.json", "MambaForCausalLM"] },
        Case { name: "config rope scaling incomplete", weights: None, config: cfg_set("rope_parameters", json::parse(br#"{"rope_type": "llama3", "rope_theta": 10000.0}"#).unwrap()), extra: vec![], needles: vec!["config.json", "factor"] },
        Case { name: "config deeply nested", weights: None, config: Some(format!("{{\"a\": {}{}}}", "[".repeat(1000), "]".repeat(1000)).into_bytes()), extra: vec![], needles: vec!["config.json", "nesting"] },
        Case { name: "index names a missing shard", weights: None, config: ok_config.clone(),
            extra: vec![("model.safetensors.index.json", br#"{"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}"#.to_vec())],
            needles: vec!["model.safetensors.index.json", "model.embed_tokens.weight", "model-00001-of-00002.safetensors", "not a file"] },
        Case { name: "index with a path in it", weights: None, config: ok_config.clone(),
            extra: vec![("model.safetensors.index.json", br#"{"weight_map": {"model.norm.weight": "../../etc/passwd"}}"#.to_vec())],
            needles: vec!["model.safetensors.index.json", "model.norm.weight"] },
    ];
    // Cases that only change the config still need weights to get past the config.
    for case in &mut v {
        if case.weights.is_none() && case.extra.is_empty() {
            case.weights = Some(file_bytes(header.to_string_compact().as_bytes(), &data));
        }
    }
    v
}

fn write_case(dir: &Path, case: &Case) {
    if let Some(w) = &case.weights {
        std::fs::write(dir.join("model.safetensors"), w).unwrap();
    }
    if let Some(c) = &case.config {
        std::fs::write(dir.join("config.json"), c).unwrap();
    }
    for (name, bytes) in &case.extra {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

#[test]
fn every_malformed_input_is_refused_with_a_named_error() {
    let all = cases();
    assert!(all.len() >= 20);
    for (i, case) in all.iter().enumerate() {
        let dir = temp_dir(&format!("malformed-{i}"));
        write_case(&dir, case);
        let result = std::panic::catch_unwind(|| Model::open(&dir, &Options { threads: 1, ..Options::default() }).map(|_| ()));
        let err = match result {
            Ok(Ok(())) => panic!("case `{}` was accepted", case.name),
            Ok(Err(e)) => e.to_string(),
            Err(_) => panic!("case `{}` panicked", case.name),
        };
        println!("{:<40} {err}", case.name);
        for needle in &case.needles {
            assert!(err.contains(needle), "case `{}`: error `{err}` does not mention `{needle}`", case.name);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The parser bounds: random corruption of a valid header never panics.
#[test]
fn random_header_corruption_never_panics() {
    let bytes = std::fs::read(fixture(SOURCE).join("model.safetensors")).unwrap();
    let n = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let dir = temp_dir("fuzz");
    let path = dir.join("model.safetensors");
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut rejected = 0;
    for _ in 0..300 {
        let mut b = bytes.clone();
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x as usize) % n;
            b[at] = (x >> 32) as u8;
        }
        std::fs::write(&path, &b).unwrap();
        let r = std::panic::catch_unwind(|| waste::format::safetensors::SafeTensors::open(&path).map(|_| ()));
        match r {
            Err(_) => panic!("corrupted header panicked"),
            Ok(Err(e)) => {
                assert!(e.to_string().contains("model.safetensors"), "{e}");
                rejected += 1;
            }
            Ok(Ok(())) => {}
        }
    }
    assert!(rejected > 100, "only {rejected} of 300 corruptions were detected");
}

/// stories260K with its tok512.bin replaced by `tok`.
fn stories_with_tokenizer(tag: &str, tok: &[u8]) -> std::path::PathBuf {
    let dir = temp_dir(&format!("tok-{tag}"));
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(root().join("models/stories260K").join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("tok512.bin"), tok).unwrap();
    dir
}

/// Byte offsets where each record of a llama2.c tokenizer file starts (and the end).
fn record_starts(b: &[u8]) -> Vec<usize> {
    let mut at = 4;
    let mut v = vec![];
    while at < b.len() {
        v.push(at);
        at += 8 + u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap()) as usize;
    }
    v.push(at);
    v
}

/// A tok*.bin that does not fit the model's vocab_size is refused naming the file, before any
/// text is produced: truncated at a record boundary it parses (a 7-token vocabulary), so the
/// model checks the count; trailing bytes and negative lengths are called what they are.
#[test]
fn a_tokenizer_that_does_not_fit_the_model_is_refused_naming_it() {
    let tok = std::fs::read(root().join("models/stories260K/tok512.bin")).unwrap();
    let starts = record_starts(&tok);
    assert_eq!(starts.len(), 513, "the fixture holds 512 records");
    let opts = Options { threads: 1, ..Options::default() };

    let dir = stories_with_tokenizer("short", &tok[..starts[7]]);
    let m = Model::open(&dir, &opts).unwrap();
    let e = m.tokenize_prompt("Once").unwrap_err().to_string();
    for needle in ["tok512.bin", "7 token records", "vocab_size", "512"] {
        assert!(e.contains(needle), "`{e}` does not mention `{needle}`");
    }
    let (code, out, err) = waste(&["run", dir.to_str().unwrap(), "Once", "-n", "4"]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(err.contains("tok512.bin") && err.contains("7 token records"), "{err}");
    // Ids alone need no tokenizer: eval --ids still works.
    let (code, _, err) = waste(&["eval", dir.to_str().unwrap(), "--ids", "1,2"]);
    assert_eq!(code, 0, "{err}");

    let mut junk = tok.clone();
    junk.extend_from_slice(&[0xAB; 3]);
    let dir = stories_with_tokenizer("junk", &junk);
    let e = Model::open(&dir, &opts).err().expect("trailing junk accepted").to_string();
    assert!(e.contains("tok512.bin") && e.contains("3 bytes of trailing data after the 512 token records"), "{e}");

    let mut junk = tok.clone();
    junk.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0, b'x']);
    let dir = stories_with_tokenizer("extra", &junk);
    let m = Model::open(&dir, &opts).unwrap();
    let e = m.tokenize_prompt("Once").unwrap_err().to_string();
    assert!(e.contains("tok512.bin") && e.contains("513 token records") && e.contains("trailing data"), "{e}");

    let mut neg = tok.clone();
    neg[starts[5] + 4..starts[5] + 8].copy_from_slice(&(-1i32).to_le_bytes());
    let dir = stories_with_tokenizer("negative", &neg);
    let e = Model::open(&dir, &opts).err().expect("negative length accepted").to_string();
    assert!(e.contains("tok512.bin") && e.contains("token 5 has a negative length (-1)"), "{e}");
}
