//! `waste chat` (issue 11): a scripted three-turn chat gives, turn by turn, what one evaluation
//! of the whole rendered conversation gives, and its later turns compute only their new tokens;
//! Ctrl-C stops a reply and the chat goes on; conversations save and load; a model without a
//! template is refused naming the field.

use crate::common;

use common::*;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use waste::format::json::Json;
use waste::{ChatTemplate, GenerateParams, Model, Options, RenderOptions};

const TURNS: [&str; 3] = ["Hello there", "What did the cat do?", "The end"];

fn model_dir() -> std::path::PathBuf {
    root().join("models/stories260K")
}

/// The replies of a chat of `TURNS` with ChatML, each computed by one evaluation, in a fresh
/// session, of the whole conversation's tokens; and those tokens' counts. The tokens are the
/// chat's: each turn's rendering begins with the previous prompt and reply, and adds its new
/// text's tokens after the reply's tokens as they were generated (the model continues from what
/// it said, not from a re-tokenization of its text, which can split differently).
fn reference_chat(n: usize) -> (Vec<String>, Vec<usize>) {
    let m = Model::open(model_dir(), &Options::default()).unwrap();
    let template = m.with_special_tokens(ChatTemplate::builtin("chatml").unwrap()).unwrap();
    let tok = m.tokenizer().unwrap();
    let opts = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    let (mut messages, mut replies, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    let mut last: Option<(String, Vec<u32>)> = None;
    for t in TURNS {
        messages.push(Json::object([("role", Json::str("user")), ("content", Json::str(t))]));
        let pieces = template.render(&Json::Array(messages.clone()), &opts).unwrap();
        let text = waste::template::pieces_text(&pieces);
        let ids = match &last {
            None => tok.tokenize_pieces(&pieces),
            Some((before, ids)) => {
                assert!(text.starts_with(before.as_str()), "ChatML only appends");
                let mut all = ids.clone();
                all.extend(tok.tokenize_pieces_continued(&waste::template::pieces_after(&pieces, before.len())));
                all
            }
        };
        assert_eq!(tok.detokenize(&ids).unwrap(), text, "the tokens spell the whole rendered conversation");
        let mut fresh = Model::open(model_dir(), &Options::default()).unwrap();
        let params = GenerateParams { max_tokens: n, stop_tokens: fresh.end_of_turn_tokens(&template), ..GenerateParams::greedy() };
        let mut reply = String::new();
        let summary = fresh.generate(&ids, &params, |ev| {
            reply.push_str(ev.text);
            true
        }).unwrap();
        counts.push(ids.len());
        let mut held = ids;
        held.extend(&summary.ids);
        last = Some((format!("{text}{reply}"), held));
        messages.push(Json::object([("role", Json::str("assistant")), ("content", Json::str(reply.as_str()))]));
        replies.push(reply);
    }
    (replies, counts)
}

/// `[… | prefill P tokens (R reused), …]` → (P, R).
fn prefill_of(line: &str) -> (usize, usize) {
    let p = line.split("prefill ").nth(1).unwrap_or_else(|| panic!("no prefill in {line}"));
    let prefilled = p.split(' ').next().unwrap().parse().unwrap();
    let reused = p.split_once('(').filter(|(_, r)| r.contains(" reused)")).map_or(0, |(_, r)| r.split(' ').next().unwrap().parse().unwrap());
    (prefilled, reused)
}

#[test]
fn three_piped_turns_equal_one_evaluation_of_the_whole_conversation() {
    let n = 12;
    let input = TURNS.iter().map(|t| format!("{t}\n")).collect::<String>();
    let (code, out, err) = waste_stdin(&["chat", model_dir().to_str().unwrap(), "--template", "chatml", "--temp", "0", "-n", &n.to_string()],
        Some(&input));
    assert_eq!(code, 0, "{err}");
    // Each reply, as one evaluation of the whole conversation so far gives it.
    let (replies, prompts) = reference_chat(n);
    let want: String = replies.iter().map(|r| format!("{r}\n")).collect();
    assert_eq!(out, want, "the chat's replies are those of one evaluation of the whole conversation");
    // One summary line per turn; the later turns compute only their new tokens (and the last
    // generated token, which the session holds uncomputed).
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with('[') && l.contains("prefill")).collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert_eq!(prefill_of(lines[0]), (prompts[0], 0));
    for turn in 1..3 {
        let (prefilled, reused) = prefill_of(lines[turn]);
        let held = prompts[turn - 1] + n; // the previous prompt and its reply, all of whose tokens the session holds
        assert_eq!(reused, held - 1, "turn {}: {}", turn + 1, lines[turn]);
        assert_eq!(prefilled + reused, prompts[turn], "turn {}: {}", turn + 1, lines[turn]);
    }
}

#[test]
fn a_model_without_a_template_is_refused_naming_the_field() {
    let (code, _, err) = waste_stdin(&["chat", model_dir().to_str().unwrap()], Some("hi\n"));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("chat_template") && err.contains("tokenizer_config.json") && err.contains("--template chatml|llama3|FILE"), "{err}");
    let m = Model::open(model_dir(), &Options::default()).unwrap();
    assert!(m.chat_template().unwrap_err().message().contains("chat_template"));
}

/// A chat saved after one turn and loaded by another process continues as one process would.
#[test]
fn a_saved_chat_continues_in_another_process() {
    let dir = temp_dir("chat-save");
    let state = dir.join("c.state");
    let m = model_dir();
    let args = ["chat", m.to_str().unwrap(), "--template", "chatml", "--temp", "0", "-n", "8"];
    let (code, whole, err) = waste_stdin(&args, Some("Hello there\nWhat did the cat do?\n"));
    assert_eq!(code, 0, "{err}");
    let (code, first, err) = waste_stdin(&args, Some(&format!("Hello there\n/save {}\n", state.display())));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("saved") && state.is_file(), "{err}");
    let mut load_args = args.to_vec();
    let s = state.to_str().unwrap();
    load_args.extend(["--load-state", s]);
    let (code, second, err) = waste_stdin(&load_args, Some("What did the cat do?\n/stats\n"));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("loaded 2 messages"), "{err}");
    let (reply, stats) = second.split_at(second.find("session ").unwrap());
    assert_eq!(format!("{first}{reply}"), whole, "the loaded conversation continues as the unbroken one");
    assert!(stats.contains("tokens held") && stats.contains("prefill") && stats.contains("memory"), "{stats}");
    // The second turn of the loaded chat computed only its new tokens.
    let line = err.lines().find(|l| l.contains("prefill")).unwrap();
    assert!(prefill_of(line).1 > 0, "{line}");
    // /load of a damaged file is refused and the chat goes on.
    std::fs::write(dir.join("bad.state"), b"not a state").unwrap();
    let (code, out, err) = waste_stdin(&args, Some(&format!("/load {}\nHello there\n", dir.join("bad.state").display())));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("bad.state") && !out.is_empty(), "{err}");
}

/// What a child process has written to a pipe so far, collected by a thread.
struct Collected(std::sync::Arc<std::sync::Mutex<String>>);

impl Collected {
    fn from(mut r: impl Read + Send + 'static) -> Collected {
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = text.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match r.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n])),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });
        Collected(text)
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    /// Waits until `pred` holds for what has arrived (panics after a minute, showing it).
    fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let t = self.text();
            if pred(&t) {
                return t;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; so far: {t}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A child process killed when the test ends, whatever happens.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sigint(child: &Child) {
    // The `kill` command: no unsafe code in the tests.
    let ok = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success();
    assert!(ok);
}

/// Ctrl-C during a reply stops the reply and the chat answers the next turn; Ctrl-C at the
/// prompt ends it with status 0.
#[test]
fn ctrl_c_stops_a_reply_and_the_chat_goes_on() {
    let m = model_dir();
    let mut child = KillOnDrop(Command::new(env!("CARGO_BIN_EXE_waste"))
        .args(["chat", m.to_str().unwrap(), "--template", "chatml", "--temp", "0", "-n", "4000", "--ctx", "4096", "--ignore-eos",
            "--threads", "1"])
        .stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let child = &mut child.0;
    let mut stdin = child.stdin.take().unwrap();
    let out = Collected::from(child.stdout.take().unwrap());
    let err = Collected::from(child.stderr.take().unwrap());
    for (turn, line) in ["Once upon a time\n", "Tell me more\n"].iter().enumerate() {
        let before = out.text().len();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.flush().unwrap();
        out.wait_for("the reply to start", |s| s.len() > before + 20);
        sigint(child);
        err.wait_for("the interrupted reply's summary", |s| s.matches("(interrupted)").count() > turn);
        // The rest of the interrupted reply reaches the collector before the next turn starts.
        std::thread::sleep(Duration::from_millis(300));
        assert!(child.try_wait().unwrap().is_none(), "the chat is still running after Ctrl-C in a reply");
    }
    let got_err = err.text();
    let lines: Vec<&str> = got_err.lines().filter(|l| l.contains("(interrupted)")).collect();
    assert!(lines.iter().all(|l| l.contains("stop: stopped by the caller")), "{got_err}");
    assert!(!lines[0].starts_with("[4000 tokens"), "the reply was cut short: {got_err}");
    // Ctrl-C at the prompt (stdin still open) ends the chat.
    std::thread::sleep(Duration::from_millis(300));
    sigint(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("Ctrl-C at the prompt did not end the chat; stderr: {}", err.text());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    drop(stdin);
}
