//! Helpers for the `waste serve` tests: a fixture chat model, a server process (started, its
//! ready line awaited, its log collected, stopped with a signal), and a raw HTTP/1.1 client
//! that shows exactly what came over the socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use waste::format::json::{self, Json};

/// The fixture's chat template: plain text turns, so every token of the prompt is content.
pub const TEMPLATE: &str = "{% for m in messages %}{{ m.role | capitalize }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}";

/// A chat model in a scratch directory: stories260K (weights and tokenizer) with a
/// `tokenizer_config.json` that holds [`TEMPLATE`].
pub fn chat_model(tag: &str) -> PathBuf {
    let dir = super::temp_dir(&format!("serve-{tag}")).join("stories-chat");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tok512.bin"] {
        std::fs::copy(super::root().join("models/stories260K").join(f), dir.join(f)).unwrap();
    }
    let cfg = Json::object([("chat_template", Json::str(TEMPLATE)), ("bos_token", Json::str("<s>")), ("eos_token", Json::str("</s>"))]);
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string_compact()).unwrap();
    dir
}

/// A running `waste serve`.
pub struct Server {
    child: Option<Child>,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    log: Arc<Mutex<String>>,
    stdout: Mutex<mpsc::Receiver<String>>,
}

/// Spawns `waste serve MODEL --port 0 ARGS`; stderr is collected, stdout lines arrive on a
/// channel.
fn spawn(model: &Path, args: &[&str]) -> (Child, Arc<Mutex<String>>, mpsc::Receiver<String>, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_waste"))
        .arg("serve").arg(model).args(["--port", "0"]).args(args)
        .stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped())
        .spawn().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let (err_tx, err_rx) = mpsc::channel();
    let (out_tx, out_rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let l = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            l.lock().unwrap().push_str(&format!("{line}\n"));
            let _ = err_tx.send(line);
        }
    });
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = out_tx.send(line);
        }
    });
    (child, log, out_rx, err_rx)
}

/// The address in a line `... http://ADDR ...`.
fn address_in(line: &str) -> Option<String> {
    let rest = line.split("http://").nth(1)?;
    Some(rest.split([' ', ',']).next()?.to_string())
}

impl Server {
    /// Starts a server and waits for its ready line.
    pub fn start(model: &Path, args: &[&str]) -> Server {
        let mut s = Server::start_loading(model, args);
        s.wait_ready();
        s
    }

    /// Starts a server and returns once it listens (the model may still be loading).
    pub fn start_loading(model: &Path, args: &[&str]) -> Server {
        let (child, log, stdout, stderr) = spawn(model, args);
        let mut s = Server { child: Some(child), addr: String::new(), log, stdout: Mutex::new(stdout) };
        loop {
            match stderr.recv_timeout(Duration::from_secs(120)) {
                Ok(line) if line.contains("listening on http://") => {
                    s.addr = address_in(&line).unwrap();
                    return s;
                }
                Ok(_) => {}
                Err(_) => panic!("the server did not start listening: {}", s.finish_log()),
            }
        }
    }

    /// Waits for the ready line on stdout; returns it.
    pub fn wait_ready(&mut self) -> String {
        let line = self.stdout.lock().unwrap().recv_timeout(Duration::from_secs(120));
        match line {
            Ok(line) if line.contains("ready on http://") => line,
            Ok(line) => panic!("unexpected first line on stdout: {line}"),
            Err(_) => panic!("the server did not become ready: {}", self.finish_log()),
        }
    }

    /// The stderr lines so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Kills the process (if running) and returns its log.
    fn finish_log(&mut self) -> String {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::thread::sleep(Duration::from_millis(100));
        self.log()
    }

    /// Sends SIGTERM and waits; returns the exit code and the log.
    pub fn stop(mut self) -> (i32, String) {
        let mut c = self.child.take().unwrap();
        signal(c.id(), "TERM");
        let status = c.wait().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        (status.code().unwrap_or(-1), self.log())
    }

    /// Waits for the process to end (after a signal the test sent); returns the exit code and
    /// the log.
    pub fn wait_exit(mut self) -> (i32, String) {
        let status = self.child.take().unwrap().wait().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        (status.code().unwrap_or(-1), self.log())
    }

    /// The request lines the server logged that contain `what`.
    pub fn log_lines(&self, what: &str) -> Vec<String> {
        self.log().lines().filter(|l| l.contains(what)).map(str::to_string).collect()
    }

    /// Waits (up to a minute) until the log has `count` lines containing `what` (a request is
    /// logged just after it is answered); returns them.
    pub fn wait_log_lines(&self, what: &str, count: usize) -> Vec<String> {
        for _ in 0..6000 {
            let lines = self.log_lines(what);
            if lines.len() >= count {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("fewer than {count} lines with {what:?} in the log: {}", self.log());
    }

    /// Resident set size of the server process (VmRSS of /proc/PID/status), in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches("kB").trim().parse().unwrap();
        kb * 1024
    }

    /// A connection whose failures show this server's log.
    pub fn connect(&self) -> Http {
        let mut c = Http::connect(&self.addr);
        c.server_log = Some(Arc::clone(&self.log));
        c
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Sends signal `name` (TERM, INT) to `pid` with kill(1).
pub fn signal(pid: u32, name: &str) {
    let ok = Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status().unwrap().success();
    assert!(ok, "kill -{name} {pid}");
}

/// A response as it came: status, headers, the body (chunked bodies decoded, each chunk's
/// bytes kept too).
#[derive(Debug, Default)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub chunks: Vec<Vec<u8>>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Json {
        json::parse(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The `data:` payloads of a Server-Sent Events body.
    pub fn events(&self) -> Vec<String> {
        self.text().split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("not an event: {e:?}")).to_string()).collect()
    }

    /// The OpenAI error's `param` and `code`.
    pub fn error_param(&self) -> Option<String> {
        self.json().get("error")?.get("param")?.as_str().map(str::to_string)
    }
}

/// A raw HTTP/1.1 client connection.
pub struct Http {
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// The server's stderr, for the message of a request that got no response.
    server_log: Option<Arc<Mutex<String>>>,
    /// How the last read ended when it ended the stream: "end of stream" or the error.
    ended: String,
}

impl Http {
    pub fn connect(addr: &str) -> Http {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Http { stream, buf: Vec::new(), server_log: None, ended: String::new() }
    }

    pub fn send(&mut self, bytes: &[u8]) -> &mut Http {
        self.stream.write_all(bytes).unwrap();
        self
    }

    /// Sends a request with `Host` and (for a body) `Content-Length`, and reads the response.
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if !body.is_empty() || method == "POST" {
            req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        req.push_str(body);
        self.send(req.as_bytes());
        match self.response() {
            Some(r) => r,
            None => {
                // The log line of a request is written just after it is answered.
                std::thread::sleep(Duration::from_millis(300));
                let log = self.server_log.as_ref().map_or(String::new(), |l| l.lock().unwrap().clone());
                panic!("no response to {method} {path} ({}, {} bytes unread); the server's log:\n{log}", self.ended, self.buf.len())
            }
        }
    }

    pub fn get(&mut self, path: &str) -> Response {
        self.request("GET", path, &[], "")
    }

    pub fn post(&mut self, path: &str, body: &str) -> Response {
        self.request("POST", path, &[], body)
    }

    /// Reads more bytes; false at end of stream (or a reset, or the read timeout). A read
    /// that a signal interrupted is retried: on a socket with a receive timeout Linux answers
    /// EINTR even where the handler asked for restarts (signal(7)), and on a loaded machine
    /// this harness's read did see it (the server had answered; the test said "no response").
    fn more(&mut self) -> bool {
        let mut b = [0u8; 8192];
        loop {
            match self.stream.read(&mut b) {
                Ok(0) => {
                    self.ended = "end of stream".into();
                    return false;
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&b[..n]);
                    return true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.ended = e.to_string();
                    return false;
                }
            }
        }
    }

    /// The next line (without its CRLF), `None` at end of stream.
    fn line(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                self.buf.drain(..i + 2);
                return Some(l);
            }
            if !self.more() {
                return None;
            }
        }
    }

    fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() < n {
            if !self.more() {
                return None;
            }
        }
        Some(self.buf.drain(..n).collect())
    }

    /// Reads one response (`None` when the server closed before a status line); skips
    /// `100 Continue`.
    pub fn response(&mut self) -> Option<Response> {
        let mut r = Response::default();
        loop {
            let status = self.line()?;
            r.status = status.split(' ').nth(1)?.parse().ok()?;
            r.headers.clear();
            loop {
                let l = self.line()?;
                if l.is_empty() {
                    break;
                }
                let (k, v) = l.split_once(':')?;
                r.headers.push((k.trim().to_string(), v.trim().to_string()));
            }
            if r.status != 100 {
                break;
            }
        }
        if r.header("Transfer-Encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            loop {
                let size = usize::from_str_radix(self.line()?.trim(), 16).ok()?;
                if size == 0 {
                    self.line()?;
                    break;
                }
                let chunk = self.take(size)?;
                assert_eq!(self.line().as_deref(), Some(""), "a chunk must end with CRLF");
                r.body.extend_from_slice(&chunk);
                r.chunks.push(chunk);
            }
        } else if let Some(n) = r.header("Content-Length") {
            r.body = self.take(n.parse().ok()?)?;
        } else {
            while self.more() {}
            r.body = std::mem::take(&mut self.buf);
        }
        Some(r)
    }

    /// True when the server closed the connection (reads end of stream).
    pub fn closed(&mut self) -> bool {
        self.buf.is_empty() && !self.more()
    }

    pub fn shutdown_write(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

/// A chat request body: user messages alternating with the given assistant replies.
pub fn chat_body(messages: &[(&str, &str)], extra: &str) -> String {
    let list: Vec<Json> = messages.iter().map(|(r, c)| Json::object([("role", Json::str(*r)), ("content", Json::str(*c))])).collect();
    let mut body = Json::object([("messages", Json::Array(list))]).to_string_compact();
    if !extra.is_empty() {
        body.pop();
        body.push(',');
        body.push_str(extra);
        body.push('}');
    }
    body
}

/// The reply's text (chat `message.content` or completion `text`).
pub fn reply_text(j: &Json) -> String {
    let c = &j.get("choices").unwrap().as_array().unwrap()[0];
    match c.get("message") {
        Some(m) => m.get("content").unwrap().as_str().unwrap().to_string(),
        None => c.get("text").unwrap().as_str().unwrap().to_string(),
    }
}

pub fn finish_reason(j: &Json) -> String {
    j.get("choices").unwrap().as_array().unwrap()[0].get("finish_reason").unwrap().as_str().unwrap().to_string()
}

/// `usage.{prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens}`.
pub fn usage(j: &Json) -> (u64, u64, u64) {
    let u = j.get("usage").unwrap();
    (u.get("prompt_tokens").unwrap().as_u64().unwrap(), u.get("completion_tokens").unwrap().as_u64().unwrap(),
     u.get("prompt_tokens_details").unwrap().get("cached_tokens").unwrap().as_u64().unwrap())
}

/// `waste run`'s continuation of `prompt` (stdout without the echoed prompt).
pub fn run_greedy(model: &Path, prompt: &str, n: usize, stop: Option<&str>) -> String {
    let m = model.to_string_lossy();
    let n = n.to_string();
    let mut args = vec!["run", &m, prompt, "-n", &n, "--temp", "0"];
    if let Some(s) = stop {
        args.extend(["--stop", s]);
    }
    let (code, out, err) = super::waste(&args);
    assert_eq!(code, 0, "{err}");
    out.strip_prefix(prompt).unwrap().strip_suffix('\n').unwrap().to_string()
}

/// The model's argmax continuation of `ids`, one `waste eval` per step: the token texts.
pub fn argmax_steps(model: &Path, ids: &[u32], n: usize) -> Vec<String> {
    let mut ids = ids.to_vec();
    let mut texts = Vec::new();
    for _ in 0..n {
        let list = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let (code, out, err) = super::waste(&["eval", &model.to_string_lossy(), "--ids", &list, "--top", "1", "--json"]);
        assert_eq!(code, 0, "{err}");
        let doc = json::parse(out.as_bytes()).unwrap();
        let top = &doc.get("top").unwrap().as_array().unwrap()[0];
        let id = top.get("id").unwrap().as_u64().unwrap() as u32;
        if id == 2 {
            break; // end of sequence
        }
        ids.push(id);
        texts.push(top.get("text").unwrap().as_str().unwrap().to_string());
    }
    texts
}

/// The chat prompt's ids as `waste template` renders it and `waste tokenize` encodes it.
pub fn chat_prompt_ids(model: &Path, messages: &[(&str, &str)]) -> Vec<u32> {
    let file = super::temp_dir("chat-prompt").join("messages.json");
    let body = json::parse(chat_body(messages, "").as_bytes()).unwrap();
    std::fs::write(&file, body.get("messages").unwrap().to_string_compact()).unwrap();
    let (code, rendered, err) = super::waste(&["template", &model.to_string_lossy(), "--messages", &file.to_string_lossy()]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = super::waste_stdin(&["tokenize", &model.to_string_lossy(), "--content", "--json", "-"], Some(&rendered));
    assert_eq!(code, 0, "{err}");
    super::ids_of(json::parse(out.as_bytes()).unwrap().get("ids").unwrap())
}
