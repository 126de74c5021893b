//! `waste serve` under load, on the loopback interface: 1,000 well-formed requests over 32
//! concurrent kept-alive connections, every answer checked; then 10,000 malformed ones
//! (truncated, oversized heads and bodies, wrong lengths, bad JSON, invalid UTF-8, JSON nested
//! 10,000 deep, slow and idle clients), each answered with the right 4xx or closed; then the
//! server still answers and its resident set has not grown past a bound. Bounded: every
//! socket has a read timeout, the server's own deadlines are 1 s (head, body) and 2 s (idle).

use crate::common;
use common::server::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const COMPLETION: &str = r#"{"prompt":"Once upon a time","max_tokens":4,"temperature":0}"#;

/// The well-formed phase's request `k` on a connection, and a check of its answer.
fn well_formed(c: &mut Http, k: usize, want_completion: &str, want_chat: &str) -> Result<(), String> {
    let chat = chat_body(&[("user", "Tell me about a bird.")], r#""max_tokens":4,"temperature":0"#);
    let check = |ok: bool, what: &str, r: &Response| if ok { Ok(()) } else { Err(format!("{what}: {} {}", r.status, r.text())) };
    match k % 5 {
        0 => {
            let r = c.get("/health");
            check(r.status == 200 && r.text() == r#"{"status":"ok"}"#, "health", &r)
        }
        1 => {
            let r = c.get("/v1/models");
            check(r.status == 200 && r.text().contains("\"id\":\"stories-chat\""), "models", &r)
        }
        2 => {
            let r = c.post("/v1/completions", COMPLETION);
            check(r.status == 200 && reply_text(&r.json()) == want_completion, "completion", &r)
        }
        3 => {
            let r = c.post("/v1/chat/completions", &chat.replace("\"temperature\":0", "\"temperature\":0,\"stream\":true"));
            let ev = if r.status == 200 { r.events() } else { Vec::new() };
            let text: String = ev.iter().filter(|e| e.as_str() != "[DONE]").map(|e| {
                let j = waste::format::json::parse(e.as_bytes()).unwrap();
                j.get("choices").unwrap().as_array().unwrap().first()
                    .and_then(|c| c.get("delta")?.get("content")?.as_str().map(str::to_string)).unwrap_or_default()
            }).collect();
            check(ev.last().map(String::as_str) == Some("[DONE]") && text == want_chat, "chat stream", &r)
        }
        _ => {
            let r = c.post("/v1/chat/completions", &chat);
            check(r.status == 200 && reply_text(&r.json()) == want_chat, "chat", &r)
        }
    }
}

/// What a malformed request may be answered with: these statuses, or a close without answer.
struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    /// Stop sending (half-close) after the bytes.
    half_close: bool,
    statuses: &'static [u16],
    closed_ok: bool,
}

fn post(path: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut b = format!("POST {path} HTTP/1.1\r\nHost: t\r\n{extra}Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    b.extend_from_slice(body);
    b
}

fn cases() -> Vec<Case> {
    let case = |name, bytes: Vec<u8>, statuses, closed_ok| Case { name, bytes, half_close: false, statuses, closed_ok };
    let mut chunked = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..40 {
        chunked.extend_from_slice(format!("8000\r\n{}\r\n", "a".repeat(0x8000)).as_bytes());
    }
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    let wide = format!("[{}0]", "0,".repeat(150_000));
    vec![
        Case { half_close: true, ..case("truncated head", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Le".to_vec(), &[400], true) },
        Case { half_close: true, ..case("truncated body", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"prompt\":".to_vec(), &[400], true) },
        case("oversized headers", format!("GET /health HTTP/1.1\r\nHost: t\r\nX-A: {}\r\n\r\n", "a".repeat(20_000)).into_bytes(), &[431], true),
        case("oversized request line", format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "a".repeat(20_000)).into_bytes(), &[414], true),
        case("too many headers", format!("GET /health HTTP/1.1\r\nHost: t\r\n{}\r\n", "X-A: b\r\n".repeat(150)).into_bytes(), &[431], true),
        case("oversized body", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000\r\n\r\n{\"prompt\":".to_vec(), &[413], true),
        case("oversized chunked body", chunked, &[413], true),
        case("Content-Length shorter than the body", post("/v1/completions", "", COMPLETION.as_bytes()).replace_length(10), &[400], true),
        case("bad JSON", post("/v1/completions", "", b"{\"prompt\": nope}"), &[400], false),
        case("invalid UTF-8", post("/v1/completions", "", b"{\"prompt\":\"\xc3\x28\"}"), &[400], false),
        case("JSON nested 10,000 deep", post("/v1/chat/completions", "", deep.as_bytes()), &[400], false),
        case("150,000 JSON values", post("/v1/completions", "", wide.as_bytes()), &[400], false),
        case("a bad parameter", post("/v1/chat/completions", "", br#"{"messages":[{"role":"user","content":"x"}],"n":5}"#), &[400], false),
        case("messages of the wrong type", post("/v1/chat/completions", "", br#"{"messages":"hello"}"#), &[400], false),
        case("an empty body", post("/v1/completions", "", b""), &[400], false),
        case("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n".to_vec(), &[400], true),
        case("a method that does not fit", b"DELETE /v1/models HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(), &[405], false),
        case("an unknown path", b"GET /admin HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(), &[404], false),
        case("a Content-Length that is not a number", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 1e3\r\n\r\n".to_vec(), &[400], true),
        case("Content-Length and chunked", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(), &[400], true),
        case("no Host", b"GET /health HTTP/1.1\r\n\r\n".to_vec(), &[400], true),
        case("a chunk size that is not hexadecimal", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(), &[400], true),
        case("a chunk longer than its size", b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcdef\r\n0\r\n\r\n".to_vec(), &[400], true),
    ]
}

/// `bytes` with its Content-Length header replaced by `n`.
trait ReplaceLength {
    fn replace_length(self, n: usize) -> Vec<u8>;
}

impl ReplaceLength for Vec<u8> {
    fn replace_length(self, n: usize) -> Vec<u8> {
        let s = String::from_utf8(self).unwrap();
        let start = s.find("Content-Length: ").unwrap() + 16;
        let end = start + s[start..].find('\r').unwrap();
        format!("{}{n}{}", &s[..start], &s[end..]).into_bytes()
    }
}

/// Sends a case on a fresh connection and checks the answer.
fn run_case(addr: &str, c: &Case) -> Result<(), String> {
    // A connection refused with 503 because `--connections` are open (the storm's finished
    // cases whose server threads have not ended yet, more of them on a loaded machine) is the
    // server doing its job: like any client, try again a little later.
    let mut tries = 0;
    let answer = loop {
        let mut h = Http::connect(addr);
        h.stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // The server may answer (and close) before all is sent: a failed write is not a failure.
        let _ = h.stream.write_all(&c.bytes);
        if c.half_close {
            h.shutdown_write();
        }
        let r = h.response();
        let full = r.as_ref().is_some_and(|r| r.status == 503 && r.text().contains("too many open connections"));
        if !full || tries == 100 {
            break r;
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(20));
    };
    match answer {
        Some(r) if c.statuses.contains(&r.status) => {
            let j = waste::format::json::parse(&r.body).map_err(|e| format!("{}: the error is not JSON ({e}): {}", c.name, r.text()))?;
            if j.get("error").and_then(|e| e.get("message")).and_then(|m| m.as_str()).is_none() {
                return Err(format!("{}: not an OpenAI error: {}", c.name, r.text()));
            }
            Ok(())
        }
        Some(r) => Err(format!("{}: status {} (want {:?}): {}", c.name, r.status, c.statuses, r.text())),
        None if c.closed_ok => Ok(()),
        None => Err(format!("{}: closed without an answer", c.name)),
    }
}

/// A client that sends its request one byte every 150 ms: the server answers 408 (or closes)
/// once its 1 s deadline passes.
fn slowloris(addr: &str, request: &[u8]) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(150))).unwrap();
    let mut got = Vec::new();
    for &b in request.iter().cycle().take(200) {
        if s.write_all(&[b]).is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // (Interrupted: see `Http::more` in tests/common/server.rs.)
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {}
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&got);
    if got.is_empty() || text.starts_with("HTTP/1.1 408 ") {
        Ok(())
    } else {
        Err(format!("slowloris: {text}"))
    }
}

/// A connection that sends nothing: closed once idle too long.
fn idle(addr: &str) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut b = [0u8; 16];
    loop {
        return match s.read(&mut b) {
            Ok(0) => Ok(()),
            Ok(n) => Err(format!("idle: got {:?}", String::from_utf8_lossy(&b[..n]))),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => Err(format!("idle connection was not closed: {e}")),
        };
    }
}

#[test]
fn a_thousand_requests_then_ten_thousand_malformed_ones() {
    let model = chat_model("load");
    let s = Server::start(&model, &["--queue", "64", "--connections", "256", "--timeout", "1", "--idle-timeout", "2", "--max-body", "1M", "--slots", "2"]);
    let want_completion = reply_text(&s.connect().post("/v1/completions", COMPLETION).json());
    let want_chat = reply_text(&s.connect().post("/v1/chat/completions", &chat_body(&[("user", "Tell me about a bird.")], r#""max_tokens":4,"temperature":0"#)).json());
    assert!(!want_completion.is_empty() && !want_chat.is_empty());

    // 1,000 requests over 32 kept-alive connections, all answered correctly.
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for t in 0..32 {
            let (s, failures, answered, wc, wt) = (&s, &failures, &answered, &want_completion, &want_chat);
            scope.spawn(move || {
                let mut c = s.connect();
                for k in (t..1000).step_by(32) {
                    match well_formed(&mut c, k, wc, wt) {
                        Ok(()) => {
                            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                }
            });
        }
    });
    let f = failures.lock().unwrap().clone();
    assert!(f.is_empty(), "{} of 1000 well-formed requests failed; first: {:?}", f.len(), &f[..f.len().min(5)]);
    assert_eq!(answered.load(std::sync::atomic::Ordering::Relaxed), 1000);
    let rss_before = s.rss();

    // 10,000 malformed requests, 8 clients at a time, with slow and idle clients alongside.
    let cases = cases();
    std::thread::scope(|scope| {
        for i in 0..20 {
            let (addr, failures) = (&s.addr, &failures);
            scope.spawn(move || {
                let req: &[u8] = if i % 2 == 0 { b"GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: " } else {
                    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n{\"prompt\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                };
                if let Err(e) = slowloris(addr, req) {
                    failures.lock().unwrap().push(e);
                }
            });
        }
        for _ in 0..4 {
            let (addr, failures) = (&s.addr, &failures);
            scope.spawn(move || {
                if let Err(e) = idle(addr) {
                    failures.lock().unwrap().push(e);
                }
            });
        }
        for t in 0..8 {
            let (addr, failures, cases) = (&s.addr, &failures, &cases);
            scope.spawn(move || {
                for i in (t..10_000).step_by(8) {
                    if let Err(e) = run_case(addr, &cases[i % cases.len()]) {
                        failures.lock().unwrap().push(e);
                    }
                }
            });
        }
    });
    let f = failures.lock().unwrap().clone();
    assert!(f.is_empty(), "{} malformed requests were mishandled; first: {:?}", f.len(), &f[..f.len().min(5)]);

    // The server still answers, and has not kept what the storm made it allocate.
    let mut c = s.connect();
    assert_eq!(c.get("/health").status, 200);
    assert_eq!(reply_text(&c.post("/v1/completions", COMPLETION).json()), want_completion);
    drop(c);
    // The server gives free memory back once it is quiet: wait (a bounded while) for that.
    // What may stay is bookkeeping: the C library's cache of thread stacks, the allocator's
    // arenas (two), a few MiB — never the bodies and parse trees of the storm (tens of MiB).
    const BOUND: u64 = 8 << 20;
    let mut rss_after = s.rss();
    for _ in 0..100 {
        if rss_after < rss_before + BOUND {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        rss_after = s.rss();
    }
    let growth = rss_after.saturating_sub(rss_before);
    eprintln!("serve load: RSS {:.1} MiB after the well-formed requests, {:.1} MiB after the malformed ones", rss_before as f64 / 1048576.0, rss_after as f64 / 1048576.0);
    assert!(growth < BOUND, "RSS grew by {growth} bytes (from {rss_before} to {rss_after}); largest mappings:\n{}", largest_mappings(s.pid()));
    let (code, log) = s.stop();
    assert_eq!(code, 0, "{}", &log[log.len().saturating_sub(2000)..]);
}

/// The server's mappings with the most resident kilobytes (for a failure message).
fn largest_mappings(pid: u32) -> String {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let (mut name, mut out) = (String::new(), Vec::new());
    for l in smaps.lines() {
        if let Some(kb) = l.strip_prefix("Rss:") {
            out.push((kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0), name.clone()));
        } else if l.as_bytes().first().is_some_and(|c| c.is_ascii_hexdigit()) && l.contains('-') {
            name = l.to_string();
        }
    }
    out.sort_by_key(|e| std::cmp::Reverse(e.0));
    out.iter().take(25).map(|(kb, n)| format!("{kb:>8} kB {n}")).collect::<Vec<_>>().join("\n")
}
