//! `waste serve` over raw sockets: the endpoints, the HTTP errors and limits, Server-Sent
//! Events framing, chunked uploads, keep-alive, API keys, greedy replies equal to `waste run`
//! (and to the model's own argmax, step by step, for chat), warm conversations equal to cold
//! ones, the 503 while loading, the 429 of a full queue, cancellation by disconnecting, and
//! the clean stop on SIGTERM. Everything on the loopback interface.

use crate::common;
use common::server::*;
use common::*;
use waste::format::json::{self, Json};

const KEY: &str = "sk-test-0123456789";

fn key_file(tag: &str) -> String {
    let p = temp_dir(&format!("key-{tag}")).join("key");
    std::fs::write(&p, format!("{KEY}\n")).unwrap();
    p.to_string_lossy().into_owned()
}

fn bearer() -> String {
    format!("Bearer {KEY}")
}

#[test]
fn endpoints_keys_and_http_errors() {
    let model = chat_model("errors");
    let keys = key_file("errors");
    let s = Server::start(&model, &["--api-key-file", &keys, "--alias", "tiny", "--max-body", "4K"]);
    let auth = bearer();
    let mut c = s.connect();
    // /health needs no key; everything else does.
    let r = c.get("/health");
    assert_eq!((r.status, r.text().as_str()), (200, r#"{"status":"ok"}"#));
    let r = c.get("/v1/models");
    assert_eq!((r.status, r.header("WWW-Authenticate")), (401, Some("Bearer")));
    assert_eq!(r.json().get("error").unwrap().get("code").unwrap().as_str(), Some("invalid_api_key"));
    let r = c.request("GET", "/v1/models", &[("Authorization", "Bearer sk-wrong")], "");
    assert_eq!(r.status, 401);
    let r = c.request("GET", "/v1/models", &[("Authorization", &auth)], "");
    assert_eq!(r.status, 200, "{}", r.text());
    let list = r.json();
    assert_eq!(list.get("object").unwrap().as_str(), Some("list"));
    let m = &list.get("data").unwrap().as_array().unwrap()[0];
    assert_eq!((m.get("id").unwrap().as_str(), m.get("object").unwrap().as_str()), (Some("tiny"), Some("model")));
    assert_eq!(c.request("GET", "/v1/models/tiny", &[("Authorization", &auth)], "").status, 200);
    assert_eq!(c.request("GET", "/v1/models/other", &[("Authorization", &auth)], "").status, 404);
    // 404 and 405, in OpenAI's error shape; the connection stays usable (no body was sent).
    let r = c.request("GET", "/nope", &[("Authorization", &auth)], "");
    assert_eq!(r.status, 404);
    assert!(r.json().get("error").unwrap().get("message").unwrap().as_str().unwrap().contains("/nope"));
    let r = c.request("POST", "/health", &[], "");
    assert_eq!((r.status, r.header("Allow")), (405, Some("GET")));
    let r = c.request("GET", "/v1/completions", &[("Authorization", &auth)], "");
    assert_eq!((r.status, r.header("Allow")), (405, Some("POST")));
    // Bad bodies: 400 naming what was wrong; the body was read, so the connection is kept.
    let r = c.request("POST", "/v1/completions", &[("Authorization", &auth)], "{\"prompt\": ");
    assert_eq!(r.status, 400);
    assert!(r.text().contains("not valid JSON"), "{}", r.text());
    let r = c.request("POST", "/v1/chat/completions", &[("Authorization", &auth)], &"[".repeat(2000));
    assert!(r.status == 400 && r.text().contains("nested"), "{}", r.text());
    let r = c.request("POST", "/v1/chat/completions", &[("Authorization", &auth)], &chat_body(&[("user", "hi")], r#""n":3"#));
    assert_eq!((r.status, r.error_param().as_deref()), (400, Some("n")));
    assert_eq!(c.get("/health").status, 200, "still the same connection");
    // Invalid UTF-8 inside a JSON string.
    let mut raw = format!("POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: {auth}\r\nContent-Length: 14\r\n\r\n").into_bytes();
    raw.extend_from_slice(b"{\"prompt\":\"\xff\"}");
    let r = c.send(&raw).response().unwrap();
    assert!(r.status == 400 && r.text().contains("UTF-8"), "{}", r.text());
    // Limits: a body over --max-body (by length, and chunked), headers over 16 KiB.
    let r = s.connect().request("POST", "/v1/completions", &[("Authorization", &auth)], &format!("{{\"prompt\":\"{}\"}}", "a".repeat(5000)));
    assert_eq!(r.status, 413);
    let mut h = s.connect();
    h.send(format!("POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: {auth}\r\nTransfer-Encoding: chunked\r\n\r\n").as_bytes());
    for _ in 0..5 {
        h.send(format!("400\r\n{}\r\n", "a".repeat(1024)).as_bytes());
    }
    assert_eq!(h.response().unwrap().status, 413);
    let big = format!("GET /health HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n", "b".repeat(17 << 10));
    assert_eq!(s.connect().send(big.as_bytes()).response().unwrap().status, 431);
    // Request-line and framing errors.
    for (raw, status) in [
        ("GET /health HTTP/1.1\r\n\r\n", 400),
        ("GET /health HTTP/2.0\r\nHost: t\r\n\r\n", 505),
        ("BREW /health HTTP/1.1\r\nHost: t\r\n\r\n", 405),
        ("GET health HTTP/1.1\r\nHost: t\r\n\r\n", 400),
        ("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: x\r\n\r\n", 400),
        ("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", 400),
        ("POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        ("\u{1}\u{2}garbage\r\n\r\n", 400),
    ] {
        let r = s.connect().send(raw.as_bytes()).response().unwrap_or_else(|| panic!("no answer to {raw:?}"));
        assert_eq!(r.status, status, "{raw:?}: {}", r.text());
    }
    let (code, log) = s.stop();
    assert_eq!(code, 0, "{log}");
    assert!(log.contains("POST /v1/completions 413"), "one line per request: {log}");
}

#[test]
fn events_are_framed_one_per_chunk_and_the_connection_is_kept() {
    let model = chat_model("sse");
    let s = Server::start(&model, &[]);
    let mut c = s.connect();
    let body = chat_body(&[("user", "Tell me a story.")], r#""max_tokens":6,"temperature":0,"stream":true,"stream_options":{"include_usage":true}"#);
    let r = c.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Type"), Some("text/event-stream"));
    assert_eq!(r.header("Transfer-Encoding"), Some("chunked"));
    // Each HTTP chunk is exactly one event.
    for ch in &r.chunks {
        let t = std::str::from_utf8(ch).unwrap();
        assert!(t.starts_with("data: ") && t.ends_with("\n\n") && t.matches("\n\n").count() == 1, "{t:?}");
    }
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Json> = events[..events.len() - 1].iter().map(|e| json::parse(e.as_bytes()).unwrap()).collect();
    let delta = |j: &Json| j.get("choices").unwrap().as_array().unwrap().first().map(|c| c.get("delta").unwrap().clone());
    assert_eq!(delta(&chunks[0]).unwrap().get("role").unwrap().as_str(), Some("assistant"));
    let id = chunks[0].get("id").unwrap().as_str().unwrap().to_string();
    assert!(id.starts_with("chatcmpl-"));
    assert!(chunks.iter().all(|c| c.get("id").unwrap().as_str() == Some(&id) && c.get("object").unwrap().as_str() == Some("chat.completion.chunk")));
    let text: String = chunks.iter().filter_map(|c| delta(c)?.get("content")?.as_str().map(str::to_string)).collect();
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish.get("choices").unwrap().as_array().unwrap()[0].get("finish_reason").unwrap().as_str(), Some("length"));
    let usage_chunk = &chunks[chunks.len() - 1];
    assert!(usage_chunk.get("choices").unwrap().as_array().unwrap().is_empty());
    assert_eq!(usage(usage_chunk).1, 6);
    // The same request, whole, gives the same text; on the same connection.
    let whole = c.post("/v1/chat/completions", &chat_body(&[("user", "Tell me a story.")], r#""max_tokens":6,"temperature":0"#));
    assert_eq!(reply_text(&whole.json()), text);
    // Completions stream too, ending with [DONE].
    let r = c.post("/v1/completions", r#"{"prompt":"Once upon a time","max_tokens":4,"temperature":0,"stream":true}"#);
    let ev = r.events();
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let streamed: String = ev[..ev.len() - 1].iter().map(|e| json::parse(e.as_bytes()).unwrap())
        .map(|j| j.get("choices").unwrap().as_array().unwrap()[0].get("text").unwrap().as_str().unwrap().to_string()).collect();
    let whole = c.post("/v1/completions", r#"{"prompt":"Once upon a time","max_tokens":4,"temperature":0}"#);
    assert_eq!(streamed, reply_text(&whole.json()));
}

#[test]
fn chunked_uploads_and_expect_continue_are_read() {
    let model = chat_model("chunked");
    let s = Server::start(&model, &[]);
    let body = r#"{"prompt":"Once upon a time","max_tokens":5,"temperature":0}"#;
    let want = s.connect().post("/v1/completions", body);
    assert_eq!(want.status, 200);
    let mut c = s.connect();
    c.send(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (i, part) in [&body[..10], &body[10..11], &body[11..]].iter().enumerate() {
        let ext = if i == 1 { ";name=value" } else { "" };
        c.send(format!("{:X}{ext}\r\n{part}\r\n", part.len()).as_bytes());
    }
    c.send(b"0\r\nX-Trailer: yes\r\n\r\n");
    let r = c.response().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(reply_text(&r.json()), reply_text(&want.json()));
    // Expect: 100-continue: the server says go on before the body is sent.
    c.send(format!("POST /v1/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
    let mut first = [0u8; 25];
    std::io::Read::read_exact(&mut c.stream, &mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.send(body.as_bytes());
    let r = c.response().unwrap();
    assert_eq!(reply_text(&r.json()), reply_text(&want.json()));
}

#[test]
fn greedy_replies_equal_waste_run_and_the_models_argmax() {
    let model = chat_model("greedy");
    let s = Server::start(&model, &[]);
    let mut c = s.connect();
    let want = run_greedy(&model, "Once upon a time", 24, None);
    let r = c.post("/v1/completions", r#"{"prompt":"Once upon a time","max_tokens":24,"temperature":0}"#).json();
    assert_eq!((reply_text(&r), finish_reason(&r).as_str()), (want.clone(), "length"));
    assert_eq!(usage(&r).1, 24);
    // A stop string: the text before it, finish_reason stop, as `waste run --stop`.
    let stopped = run_greedy(&model, "Once upon a time", 24, Some(" little"));
    assert!(want.starts_with(&format!("{stopped} little")), "{want:?} / {stopped:?}");
    let r = c.post("/v1/completions", r#"{"prompt":"Once upon a time","max_tokens":24,"temperature":0,"stop":[" little","zzz"]}"#).json();
    assert_eq!((reply_text(&r), finish_reason(&r).as_str()), (stopped, "stop"));
    // Chat: the rendered conversation's ids, continued by argmax one step at a time, token
    // for token the reply's tokens (logprobs name them).
    let messages = [("system", "You tell stories."), ("user", "Tell me about a dog.")];
    let ids = chat_prompt_ids(&model, &messages);
    let steps = argmax_steps(&model, &ids, 12);
    let r = c.post("/v1/chat/completions", &chat_body(&messages, r#""max_tokens":12,"temperature":0,"logprobs":true,"top_logprobs":2"#)).json();
    assert_eq!(usage(&r).0, ids.len() as u64, "the prompt is the template's rendering");
    let lp = r.get("choices").unwrap().as_array().unwrap()[0].get("logprobs").unwrap().get("content").unwrap().as_array().unwrap().to_vec();
    let tokens: Vec<String> = lp.iter().map(|t| t.get("token").unwrap().as_str().unwrap().to_string()).collect();
    assert_eq!(tokens, steps);
    assert_eq!(reply_text(&r), steps.concat());
    for t in &lp {
        let top = t.get("top_logprobs").unwrap().as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].get("token"), t.get("token"), "greedy takes the most likely");
        assert_eq!(top[0].get("logprob"), t.get("logprob"));
        let (a, b) = (top[0].get("logprob").unwrap().as_f64().unwrap(), top[1].get("logprob").unwrap().as_f64().unwrap());
        assert!(a <= 0.0 && b <= a, "{a} {b}");
        let bytes: Vec<u8> = t.get("bytes").unwrap().as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
        assert_eq!(bytes, t.get("token").unwrap().as_str().unwrap().as_bytes());
    }
    // Legacy logprobs: parallel lists.
    let r = c.post("/v1/completions", r#"{"prompt":"Once upon a time","max_tokens":5,"temperature":0,"logprobs":3}"#).json();
    let l = r.get("choices").unwrap().as_array().unwrap()[0].get("logprobs").unwrap().clone();
    assert_eq!(l.get("tokens").unwrap().as_array().unwrap().len(), 5);
    assert_eq!(l.get("top_logprobs").unwrap().as_array().unwrap()[0].as_object().unwrap().len(), 3);
    let joined: String = l.get("tokens").unwrap().as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, reply_text(&r));
    // A seed makes sampling reproducible.
    let mut sampled = |seed: u64| reply_text(&c.post("/v1/completions", &format!(r#"{{"prompt":"Once upon a time","max_tokens":16,"temperature":1,"seed":{seed}}}"#)).json());
    let (x, y) = (sampled(42), sampled(42));
    assert_eq!(x, y);
}

/// A three-turn conversation: (replies, usages).
fn three_turns(servers: &mut dyn FnMut() -> Http) -> (Vec<String>, Vec<(u64, u64, u64)>) {
    let users = ["Tell me about a cat.", "What did the cat do next?", "How did it end?"];
    let mut history: Vec<(String, String)> = vec![("system".into(), "You tell short stories.".into())];
    let (mut replies, mut usages) = (Vec::new(), Vec::new());
    for u in users {
        history.push(("user".into(), u.into()));
        let msgs: Vec<(&str, &str)> = history.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
        let r = servers().post("/v1/chat/completions", &chat_body(&msgs, r#""max_tokens":10,"temperature":0"#));
        assert_eq!(r.status, 200, "{}", r.text());
        let j = r.json();
        let text = reply_text(&j);
        usages.push(usage(&j));
        history.push(("assistant".into(), text.clone()));
        replies.push(text);
    }
    (replies, usages)
}

#[test]
fn a_conversation_stays_warm_and_replies_as_a_cold_server_does() {
    let model = chat_model("warm");
    let warm = Server::start(&model, &[]);
    let (replies, usages) = three_turns(&mut || warm.connect());
    // Every turn after the first reuses at least the whole previous prompt.
    for t in 1..3 {
        assert!(usages[t].2 >= usages[t - 1].0, "turn {t}: cached {} < previous prompt {} ({usages:?})", usages[t].2, usages[t - 1].0);
        assert!(usages[t].2 < usages[t].0);
    }
    assert_eq!(usages[0].2, 0);
    // A fresh process for each request gives the same replies.
    let mut cold_servers = Vec::new();
    let (cold, cold_usages) = three_turns(&mut || {
        cold_servers.push(Server::start(&model, &[]));
        cold_servers.last().unwrap().connect()
    });
    assert_eq!(replies, cold);
    assert!(cold_usages.iter().all(|u| u.2 == 0));
    assert_eq!(usages.iter().map(|u| (u.0, u.1)).collect::<Vec<_>>(), cold_usages.iter().map(|u| (u.0, u.1)).collect::<Vec<_>>());
}

#[test]
fn slots_keep_two_conversations_warm() {
    let model = chat_model("slots");
    let s = Server::start(&model, &["--slots", "2"]);
    // Each turn's connection: its local address names its line in the server's log.
    let mut peers = Vec::new();
    let mut turn = |msgs: &[(&str, &str)]| {
        let mut c = s.connect();
        peers.push(c.stream.local_addr().unwrap().to_string());
        usage(&c.post("/v1/chat/completions", &chat_body(msgs, r#""max_tokens":4,"temperature":0"#)).json())
    };
    let a1 = turn(&[("user", "Tell me about a frog.")]);
    let b1 = turn(&[("user", "Write about the sea and the big blue whale.")]);
    let a2 = turn(&[("user", "Tell me about a frog."), ("assistant", "x"), ("user", "More.")]);
    let b2 = turn(&[("user", "Write about the sea and the big blue whale."), ("assistant", "y"), ("user", "More.")]);
    assert!(a2.2 + 3 >= a1.0 && b2.2 + 3 >= b1.0, "each conversation continues its own slot: {a1:?} {a2:?} {b1:?} {b2:?}");
    // A request is logged just after it is answered, so the lines may come in another order
    // than the requests (a thread descheduled between its answer and its line).
    let lines = s.wait_log_lines("POST /v1/chat/completions 200", 4);
    let slots: Vec<String> = peers.iter().map(|p| {
        let line = lines.iter().find(|l| l.contains(&format!(" {p} POST "))).unwrap_or_else(|| panic!("no line for {p}: {lines:?}"));
        line.split("slot ").nth(1).unwrap().split(' ').next().unwrap().to_string()
    }).collect();
    assert_eq!(slots, ["0", "1", "0", "1"]);
}

#[test]
fn every_endpoint_answers_503_until_the_model_is_loaded() {
    // config.json is a FIFO: the model thread blocks reading it until the test writes it.
    let model = chat_model("loading");
    let cfg = std::fs::read(model.join("config.json")).unwrap();
    std::fs::remove_file(model.join("config.json")).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(model.join("config.json")).status().unwrap().success());
    let mut s = Server::start_loading(&model, &[]);
    let mut c = s.connect();
    let r = c.get("/health");
    assert_eq!((r.status, r.header("Retry-After")), (503, Some("5")));
    assert_eq!(r.json().get("error").unwrap().get("code").unwrap().as_str(), Some("model_loading"));
    let r = c.post("/v1/chat/completions", &chat_body(&[("user", "hi")], ""));
    assert_eq!(r.status, 503);
    // The model thread waits in open(2) for a writer. Once it has the FIFO open, a regular
    // config.json takes its place (for the later reads) and the FIFO gets the bytes.
    let fifo = model.join("config.json");
    let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let regular = model.join("config.json.tmp");
    std::fs::write(&regular, &cfg).unwrap();
    std::fs::rename(&regular, &fifo).unwrap();
    std::io::Write::write_all(&mut w, &cfg).unwrap();
    drop(w);
    s.wait_ready();
    // (The 503 was answered before the body was read: that connection was closed.)
    let mut c = s.connect();
    assert_eq!(c.get("/health").status, 200);
    assert_eq!(c.post("/v1/completions", r#"{"prompt":"Once","max_tokens":2}"#).status, 200);
}

/// Starts a long generation on its own connection and returns it once the model is on it.
fn long_stream(s: &Server) -> Http {
    let mut c = s.connect();
    let body = r#"{"prompt":"Once upon a time","max_tokens":16000,"temperature":0,"stream":true}"#;
    c.send(format!("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}", body.len()).as_bytes());
    let mut seen = Vec::new();
    let mut b = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\"") {
        let n = std::io::Read::read(&mut c.stream, &mut b).unwrap();
        assert!(n > 0, "the stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&b[..n]);
    }
    c
}

#[test]
fn a_full_queue_answers_429_and_a_client_that_leaves_cancels_its_generation() {
    let model = chat_model("queue");
    let s = Server::start(&model, &["--queue", "1", "--ctx", "16384"]);
    let busy = long_stream(&s);
    // The model is busy: one request fits in the queue, the next is refused at once (which of
    // the two depends on which connection enqueues first). Each waits on its own thread.
    let body = r#"{"prompt":"Once upon a time","max_tokens":3,"temperature":0}"#;
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..2 {
        let (tx, mut c) = (tx.clone(), s.connect());
        std::thread::spawn(move || {
            let _ = tx.send(c.post("/v1/completions", body));
        });
    }
    let first = rx.recv().unwrap();
    assert_eq!(first.status, 429, "{}", first.text());
    // The queued one is answered once the long generation ends: its client leaves.
    drop(busy);
    let second = rx.recv().unwrap();
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(first.header("Retry-After"), Some("1"));
    assert_eq!(first.json().get("error").unwrap().get("code").unwrap().as_str(), Some("queue_full"));
    // The dropped stream was cancelled long before its 16000 tokens.
    let line = s.wait_log_lines(" 499 ", 1).pop().unwrap();
    let generated: usize = line.split("generated ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(line.contains("(cancelled)") && generated < 16000, "{line}");
}

#[test]
fn sigterm_ends_streams_with_an_error_event_and_exits_0() {
    let model = chat_model("sigterm");
    let s = Server::start(&model, &["--ctx", "16384"]);
    let mut c = long_stream(&s);
    signal(s.pid(), "TERM");
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut c.stream, &mut rest).unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("data: {\"error\":") && rest.contains("server_shutting_down"), "{rest}");
    assert!(rest.ends_with("\r\n0\r\n\r\n"), "the chunked stream is ended, not cut: {rest:?}");
    assert!(!rest.contains("[DONE]"));
    let (code, log) = s.wait_exit();
    assert_eq!(code, 0, "{log}");
    assert!(log.contains("waste serve: stopped"), "{log}");
}

#[test]
fn addresses_beyond_loopback_need_a_key() {
    let model = chat_model("host");
    let m = model.to_string_lossy();
    let (code, _, err) = waste(&["serve", &m, "--host", "192.0.2.1", "--port", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs an API key") && err.contains("--no-api-key"), "{err}");
    let (code, _, err) = waste(&["serve", &m, "--sessions", "2"]);
    assert!(code == 2 && err.contains("--slots"), "{err}");
    let (code, _, err) = waste(&["serve", &m, "--api-key", "a b"]);
    assert!(code == 2 && err.contains("API key"), "{err}");
}
