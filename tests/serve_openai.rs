//! `waste serve` driven by the official `openai` Python package, pinned, installed by this
//! test into a virtualenv under `target/` (reused by later runs): chat and completions, whole
//! and streamed, stop strings, max_tokens, logprobs, seeds, a wrong key, bad parameters, and a
//! three-turn conversation that stays warm — whose replies a fresh server per request must
//! repeat. Greedy replies are compared with `waste run` (completions) and with the model's
//! argmax step by step (`waste eval`, for chat). Prints `SKIP:` only when the package cannot be
//! installed (no python3, or the registry refuses).

use crate::common;
use common::server::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use waste::format::json::{self, Json};

const OPENAI: &str = "1.109.1";
const KEY: &str = "sk-openai-test-key";

/// A virtualenv with `openai==OPENAI`, made once under `target/`; `Err(reason)` when it
/// cannot be made.
fn venv() -> Result<PathBuf, String> {
    let dir = root().join("target").join(format!("serve-openai-{OPENAI}"));
    let python = dir.join("bin/python");
    let works = |p: &Path| Command::new(p).args(["-c", &format!("import openai; assert openai.__version__ == '{OPENAI}'")])
        .output().is_ok_and(|o| o.status.success());
    if works(&python) {
        return Ok(python);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new("python3").args(["-m", "venv"]).arg(&dir).output().map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!("python3 -m venv failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let out = Command::new(dir.join("bin/pip")).args(["install", "--disable-pip-version-check", "--quiet", &format!("openai=={OPENAI}")])
        .output().map_err(|e| format!("pip: {e}"))?;
    if !out.status.success() || !works(&python) {
        let err = String::from_utf8_lossy(&out.stderr);
        let _ = std::fs::remove_dir_all(&dir);
        return Err(format!("pip could not install openai=={OPENAI}: {}", err.lines().last().unwrap_or("").trim()));
    }
    Ok(python)
}

#[test]
fn the_openai_client_gets_what_waste_run_and_the_model_give() {
    let python = match venv() {
        Ok(p) => p,
        Err(why) => {
            println!("SKIP: openai client test: {why}");
            return;
        }
    };
    let model = chat_model("openai");
    // What the server must answer, computed without it.
    let messages = [("system", "You tell stories."), ("user", "Tell me about a dog.")];
    let ids = chat_prompt_ids(&model, &messages);
    let chat_tokens = argmax_steps(&model, &ids, 12);
    assert_eq!(chat_tokens.len(), 12, "the fixture's reply must not end early");
    let chat_text = chat_tokens.concat();
    // A stop string that occurs in the reply after its start: a token's text of 2+ characters.
    let chat_stop = chat_tokens[2..].iter().find(|t| t.trim().len() >= 2).unwrap().clone();
    let full = run_greedy(&model, "Once upon a time", 24, None);
    let stop_text = full[..full.find(" little").unwrap()].to_string();
    let expect = Json::object([
        ("alias", Json::str("stories-chat")),
        ("chat_messages", json::parse(chat_body(&messages, "").as_bytes()).unwrap().get("messages").unwrap().clone()),
        ("chat_prompt_tokens", Json::uint(ids.len() as u64)),
        ("chat_tokens", Json::Array(chat_tokens.iter().map(Json::str).collect())),
        ("chat_text", Json::str(chat_text)),
        ("chat_stop", Json::str(chat_stop)),
        ("completion_text", Json::str(run_greedy(&model, "Once upon a time", 12, None))),
        ("completion_stop_text", Json::str(stop_text)),
    ]);
    let expect_path = temp_dir("openai-expect").join("expect.json");
    std::fs::write(&expect_path, expect.to_string_pretty()).unwrap();
    let key_path = temp_dir("openai-key").join("key");
    std::fs::write(&key_path, KEY).unwrap();

    let s = Server::start(&model, &["--api-key-file", &key_path.to_string_lossy(), "--slots", "2"]);
    let out = Command::new(&python).arg(fixture("serve/openai_client.py")).arg(format!("http://{}", s.addr)).arg(KEY).arg(&expect_path)
        .output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the client's checks failed:\n{}\n{stdout}\nserver log:\n{}", String::from_utf8_lossy(&out.stderr), s.log());
    let result = json::parse(stdout.trim().as_bytes()).unwrap();
    let checks = result.get("checks").unwrap().as_u64().unwrap();
    assert!(checks > 60, "{checks} checks");
    println!("openai {}: {checks} checks passed", result.get("openai").unwrap().as_str().unwrap());
    let (code, log) = s.stop();
    assert_eq!(code, 0, "{log}");

    // The warm conversation's replies, from a fresh server per request.
    for (i, turn) in result.get("turns").unwrap().as_array().unwrap().iter().enumerate() {
        let cold = Server::start(&model, &[]);
        let body = Json::object([
            ("messages", turn.get("messages").unwrap().clone()),
            ("max_tokens", Json::uint(10)),
            ("temperature", Json::uint(0)),
        ]);
        let r = cold.connect().post("/v1/chat/completions", &body.to_string_compact()).json();
        assert_eq!(Some(reply_text(&r).as_str()), turn.get("reply").unwrap().as_str(), "turn {i}");
        assert_eq!(usage(&r).2, 0, "a cold server has nothing cached");
    }
}
