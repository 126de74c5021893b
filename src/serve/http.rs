//! HTTP/1.1 over one `TcpStream`: reading a request under limits and deadlines (the request
//! line and headers into a fixed 16 KiB buffer, then a body by `Content-Length` or chunked,
//! bounded by the server's body limit before anything is allocated for it), and writing
//! responses — whole bodies, or Server-Sent Events in chunked transfer encoding.
//!
//! Nothing here trusts the peer: every length is checked against a limit before it sizes an
//! allocation, every read has a deadline (a client that sends a byte a second cannot hold a
//! thread), and malformed input is an [`HttpError`] carrying the status to answer with — never
//! a panic.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The request line and headers together may take at most this many bytes.
pub const MAX_HEAD: usize = 16 << 10;
/// Header lines a request may have.
const MAX_HEADERS: usize = 100;
/// A chunk-size line (with its extensions) may take at most this many bytes.
const MAX_CHUNK_LINE: usize = 1024;
/// Reads wait at most this long at a time, so a stopping server is noticed between them.
const SLICE: Duration = Duration::from_millis(200);
/// After an error answered before the request's body was read, the connection reads and
/// drops what the client is still sending, for at most this long and this many bytes, so that
/// closing does not reset the connection before the client has read the answer.
const LINGER: Duration = Duration::from_millis(500);
const LINGER_BYTES: usize = 1 << 20;

/// How long and how much a request may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest request body in bytes (after chunked decoding).
    pub max_body: usize,
    /// The request line and headers must arrive within this time of their first byte, and the
    /// body within this time of the headers' end; a response write may block this long.
    pub timeout: Duration,
    /// A kept-alive connection may wait this long for its next request.
    pub idle: Duration,
}

/// A request the server answers with an error status and then closes the connection.
#[derive(Debug)]
pub struct HttpError {
    pub status: u16,
    pub message: String,
}

impl HttpError {
    fn new(status: u16, message: impl Into<String>) -> HttpError {
        HttpError { status, message: message.into() }
    }
}

/// How a request's body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// A request's line and the headers the server reads.
#[derive(Debug)]
pub struct Head {
    pub method: String,
    /// The target's path, without the query.
    pub path: String,
    pub http10: bool,
    /// The client allows the connection to stay open after the response.
    pub keep_alive: bool,
    pub body: BodyFraming,
    pub authorization: Option<String>,
    pub expect_continue: bool,
}

/// Why a read ended without data.
enum Wait {
    /// The peer closed the connection.
    Closed,
    TimedOut,
    /// The server is stopping.
    Stopped,
    Failed,
}

/// One client connection: the stream, and the bytes read from it but not yet used (a request
/// head, the start of its body, or a pipelined next request).
pub struct Connection<'a> {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    limits: Limits,
    stop: &'a AtomicBool,
}

impl<'a> Connection<'a> {
    /// Wraps an accepted stream: no Nagle delay (each streamed token leaves at once), writes
    /// bounded by the timeout.
    pub fn new(stream: TcpStream, limits: Limits, stop: &'a AtomicBool) -> Connection<'a> {
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(limits.timeout.max(Duration::from_millis(1))));
        Connection { stream, buf: vec![0; MAX_HEAD], start: 0, end: 0, limits, stop }
    }

    /// True once the server is stopping.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// True when the peer has closed or reset the connection (see [`waste::host::peer_closed`]).
    pub fn peer_gone(&self) -> bool {
        waste::host::peer_closed(self.stream.as_raw_fd())
    }

    /// Reads into `out` once, before `deadline`, in slices that notice a stopping server.
    fn read_until(&mut self, out: &mut [u8], deadline: Instant, stop_matters: bool) -> Result<usize, Wait> {
        loop {
            if stop_matters && self.stop.load(Ordering::Relaxed) {
                return Err(Wait::Stopped);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Wait::TimedOut);
            }
            let slice = (deadline - now).clamp(Duration::from_millis(1), SLICE);
            if self.stream.set_read_timeout(Some(slice)).is_err() {
                return Err(Wait::Failed);
            }
            match self.stream.read(out) {
                Ok(0) => return Err(Wait::Closed),
                Ok(n) => return Ok(n),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted) => {}
                Err(_) => return Err(Wait::Failed),
            }
        }
    }

    /// Reads more bytes after the buffered ones (moving those to the front first).
    fn fill(&mut self, deadline: Instant, stop_matters: bool) -> Result<usize, Wait> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let (end, cap) = (self.end, self.buf.len());
        if end == cap {
            return Ok(0);
        }
        let mut tmp = std::mem::take(&mut self.buf);
        let r = self.read_until(&mut tmp[end..cap], deadline, stop_matters);
        self.buf = tmp;
        let n = r?;
        self.end += n;
        Ok(n)
    }

    /// Reads the next request's line and headers. `Ok(None)`: the connection ended quietly
    /// (closed, idle too long, or the server is stopping) before a request began.
    pub fn read_head(&mut self) -> Result<Option<Head>, HttpError> {
        // Empty lines before a request line are ignored (RFC 9112 §2.2).
        let skip_blank = |c: &mut Connection| {
            while c.start < c.end && matches!(c.buf[c.start], b'\r' | b'\n') {
                c.start += 1;
            }
        };
        skip_blank(self);
        if self.start == self.end {
            let idle = Instant::now() + self.limits.idle;
            loop {
                match self.fill(idle, true) {
                    Ok(_) => {}
                    Err(_) => return Ok(None),
                }
                skip_blank(self);
                if self.start < self.end {
                    break;
                }
            }
        }
        let deadline = Instant::now() + self.limits.timeout;
        let mut scanned = 0;
        loop {
            let have = &self.buf[self.start..self.end];
            if let Some(len) = head_end(have, scanned) {
                let head = parse_head(&have[..len]);
                self.start += len;
                return head.map(Some);
            }
            scanned = have.len().saturating_sub(3);
            if have.len() >= MAX_HEAD {
                let in_line = !have.contains(&b'\n');
                return Err(if in_line {
                    HttpError::new(414, format!("the request line is longer than {MAX_HEAD} bytes"))
                } else {
                    HttpError::new(431, format!("the request line and headers are longer than {MAX_HEAD} bytes"))
                });
            }
            // `scanned` counts from the first unread byte, which fill() may move but keeps.
            match self.fill(deadline, true) {
                Ok(_) => {}
                Err(Wait::TimedOut) => return Err(HttpError::new(408, "the request headers did not arrive in time")),
                Err(Wait::Stopped) => return Err(HttpError::new(503, "the server is shutting down")),
                Err(Wait::Closed | Wait::Failed) => return Ok(None),
            }
        }
    }

    /// Reads the body `head` announces, at most `limits.max_body` bytes (413 beyond, decided
    /// before anything is allocated from the announced length).
    pub fn read_body(&mut self, head: &Head) -> Result<Vec<u8>, HttpError> {
        let max = self.limits.max_body;
        if let BodyFraming::Length(n) = head.body {
            if n > max as u64 {
                return Err(HttpError::new(413, format!("the request body is {n} bytes, more than the limit of {max}")));
            }
        }
        if head.expect_continue && head.body != BodyFraming::None {
            self.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").map_err(|_| HttpError::new(400, "the connection failed"))?;
        }
        let deadline = Instant::now() + self.limits.timeout;
        match head.body {
            BodyFraming::None => Ok(Vec::new()),
            BodyFraming::Length(n) => {
                let mut body = vec![0u8; n as usize];
                self.read_exact_into(&mut body, deadline)?;
                Ok(body)
            }
            BodyFraming::Chunked => self.read_chunked(max, deadline),
        }
    }

    /// Fills `out` from the buffered bytes, then from the stream.
    fn read_exact_into(&mut self, out: &mut [u8], deadline: Instant) -> Result<(), HttpError> {
        let buffered = (self.end - self.start).min(out.len());
        out[..buffered].copy_from_slice(&self.buf[self.start..self.start + buffered]);
        self.start += buffered;
        let mut got = buffered;
        while got < out.len() {
            match self.read_until(&mut out[got..], deadline, true) {
                Ok(n) => got += n,
                Err(w) => return Err(body_wait_error(w, "the request body ended before its length")),
            }
        }
        Ok(())
    }

    /// One line of a chunked body (a chunk size, or a trailer), without its line end.
    fn read_line(&mut self, max: usize, deadline: Instant, too_long: &str) -> Result<Vec<u8>, HttpError> {
        loop {
            let have = &self.buf[self.start..self.end];
            if let Some(i) = have.iter().position(|&b| b == b'\n') {
                if i > max {
                    return Err(HttpError::new(400, too_long));
                }
                let line = have[..i].strip_suffix(b"\r").unwrap_or(&have[..i]).to_vec();
                self.start += i + 1;
                return Ok(line);
            }
            if have.len() > max || have.len() == self.buf.len() {
                return Err(HttpError::new(400, too_long));
            }
            if let Err(w) = self.fill(deadline, true) {
                return Err(body_wait_error(w, "the chunked body ended early"));
            }
        }
    }

    fn read_chunked(&mut self, max: usize, deadline: Instant) -> Result<Vec<u8>, HttpError> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line(MAX_CHUNK_LINE, deadline, "a chunk-size line is too long")?;
            let size_text = line.split(|&b| b == b';').next().unwrap_or(&[]).trim_ascii();
            let size = parse_hex(size_text).ok_or_else(|| HttpError::new(400, "a chunk size is not a hexadecimal number"))?;
            if size == 0 {
                break;
            }
            if size > (max - body.len()) as u64 {
                return Err(HttpError::new(413, format!("the chunked request body is more than the limit of {max} bytes")));
            }
            let at = body.len();
            body.resize(at + size as usize, 0);
            self.read_exact_into(&mut body[at..], deadline)?;
            let end = self.read_line(1, deadline, "a chunk is longer than its size")?;
            if !end.is_empty() {
                return Err(HttpError::new(400, "a chunk is longer than its size"));
            }
        }
        // Trailers, ignored, bounded as the head is.
        let mut trailer_bytes = 0;
        loop {
            let line = self.read_line(MAX_HEAD, deadline, "a trailer line is too long")?;
            if line.is_empty() {
                return Ok(body);
            }
            trailer_bytes += line.len() + 2;
            if trailer_bytes > MAX_HEAD {
                return Err(HttpError::new(431, format!("the chunked body's trailers are longer than {MAX_HEAD} bytes")));
            }
        }
    }

    /// Writes a whole response.
    pub fn respond(&mut self, status: u16, content_type: &str, extra: &[(&str, String)], body: &[u8], keep_alive: bool) -> io::Result<()> {
        let mut out = Vec::with_capacity(256 + body.len());
        out.extend_from_slice(format!("HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n", reason(status), body.len()).as_bytes());
        for (k, v) in extra {
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        out.extend_from_slice(if keep_alive { b"\r\n" } else { b"Connection: close\r\n\r\n" });
        out.extend_from_slice(body);
        self.stream.write_all(&out)
    }

    /// Starts a Server-Sent Events response: chunked for HTTP/1.1 (the connection may then be
    /// kept), or a body that the closing connection ends for HTTP/1.0.
    pub fn begin_events(&mut self, http10: bool) -> io::Result<()> {
        let framing = if http10 { "Connection: close\r\n" } else { "Transfer-Encoding: chunked\r\n" };
        let head = format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n{framing}\r\n");
        self.stream.write_all(head.as_bytes())
    }

    /// Writes one event, `data: {payload}` and a blank line, as one chunk.
    pub fn event(&mut self, payload: &str, http10: bool) -> io::Result<()> {
        let mut out = Vec::with_capacity(payload.len() + 24);
        let len = payload.len() + 8; // "data: " + "\n\n"
        if !http10 {
            out.extend_from_slice(format!("{len:x}\r\n").as_bytes());
        }
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(payload.as_bytes());
        out.extend_from_slice(b"\n\n");
        if !http10 {
            out.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&out)
    }

    /// Ends a Server-Sent Events response (the last chunk, for HTTP/1.1).
    pub fn end_events(&mut self, http10: bool) -> io::Result<()> {
        if http10 {
            return self.stream.flush();
        }
        self.stream.write_all(b"0\r\n\r\n")
    }

    /// Closes after an error answered before the request was read whole: stops sending, then
    /// reads and drops what the client still sends for a short bounded while, so the close
    /// does not reset the connection before the client reads the answer.
    pub fn linger_close(mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
        let deadline = Instant::now() + LINGER;
        let mut dropped = 0;
        let mut sink = [0u8; 8192];
        while dropped < LINGER_BYTES {
            match self.read_until(&mut sink, deadline, false) {
                Ok(n) => dropped += n,
                Err(_) => break,
            }
        }
    }
}

/// The error a body read that stopped short becomes.
fn body_wait_error(w: Wait, short: &str) -> HttpError {
    match w {
        Wait::TimedOut => HttpError::new(408, "the request body did not arrive in time"),
        Wait::Stopped => HttpError::new(503, "the server is shutting down"),
        Wait::Closed | Wait::Failed => HttpError::new(400, short),
    }
}

/// Length of the head (through its blank line) if `b` holds all of it; `from` is where the
/// previous search stopped (no line end before it was followed by a blank line).
fn head_end(b: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(off) = b.get(i..).and_then(|r| r.iter().position(|&c| c == b'\n')) {
        let nl = i + off;
        match b.get(nl + 1) {
            Some(b'\n') => return Some(nl + 2),
            Some(b'\r') if b.get(nl + 2) == Some(&b'\n') => return Some(nl + 3),
            _ => i = nl + 1,
        }
    }
    None
}

fn parse_hex(t: &[u8]) -> Option<u64> {
    if t.is_empty() || t.len() > 15 {
        return None;
    }
    t.iter().try_fold(0u64, |v, &c| (c as char).to_digit(16).map(|d| v * 16 + d as u64))
}

/// True for an HTTP token character (RFC 9110 §5.6.2).
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// Parses a request line and its headers (the head, through its blank line).
fn parse_head(raw: &[u8]) -> Result<Head, HttpError> {
    let bad = |m: &str| HttpError::new(400, m.to_string());
    let text = std::str::from_utf8(raw).map_err(|_| bad("the request line or a header is not valid UTF-8"))?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(bad("the request line is not `METHOD TARGET HTTP/1.1`"));
    };
    if method.is_empty() || method.len() > 20 || !method.bytes().all(is_tchar) {
        return Err(bad("the request method is not a token"));
    }
    if !target.starts_with('/') || target.bytes().any(|c| c <= b' ' || c == 0x7f) {
        return Err(bad("the request target is not a path (origin form, starting with `/`)"));
    }
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        v if v.len() == 8 && v.starts_with("HTTP/") && v.as_bytes()[5].is_ascii_digit() && v.as_bytes()[6] == b'.' && v.as_bytes()[7].is_ascii_digit() => {
            return Err(HttpError::new(505, format!("{v} is not supported (HTTP/1.1 and HTTP/1.0 are)")));
        }
        _ => return Err(bad("the request line does not end with an HTTP version")),
    };
    let mut head = Head { method: method.to_string(), path: target.split('?').next().unwrap_or("/").to_string(), http10,
        keep_alive: !http10, body: BodyFraming::None, authorization: None, expect_continue: false };
    let (mut length, mut chunked, mut hosts, mut count) = (None::<u64>, false, 0, 0);
    for l in lines {
        if l.is_empty() {
            break;
        }
        count += 1;
        if count > MAX_HEADERS {
            return Err(HttpError::new(431, format!("more than {MAX_HEADERS} header lines")));
        }
        if l.starts_with([' ', '\t']) {
            return Err(bad("a header line is folded (obsolete line folding is refused)"));
        }
        let Some((name, value)) = l.split_once(':') else { return Err(bad("a header line has no `:`")) };
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(bad("a header name is not a token"));
        }
        let value = value.trim_matches([' ', '\t']);
        match name.to_ascii_lowercase().as_str() {
            "content-length" => {
                if value.is_empty() || value.len() > 19 || !value.bytes().all(|c| c.is_ascii_digit()) {
                    return Err(bad("Content-Length is not a number"));
                }
                let n: u64 = value.parse().map_err(|_| bad("Content-Length is not a number"))?;
                if length.is_some_and(|m| m != n) {
                    return Err(bad("two different Content-Length headers"));
                }
                length = Some(n);
            }
            "transfer-encoding" => {
                if !value.eq_ignore_ascii_case("chunked") || chunked {
                    return Err(HttpError::new(501, format!("transfer coding `{value}` is not supported (only chunked)")));
                }
                chunked = true;
            }
            // HTTP/1.0 connections are closed after one response whatever they ask.
            "connection" if value.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")) => head.keep_alive = false,
            "authorization" => head.authorization = Some(value.to_string()),
            "expect" => {
                if !value.eq_ignore_ascii_case("100-continue") {
                    return Err(HttpError::new(417, format!("expectation `{value}` is not supported")));
                }
                head.expect_continue = true;
            }
            "host" => hosts += 1,
            _ => {}
        }
    }
    if !http10 && hosts != 1 {
        return Err(bad("an HTTP/1.1 request needs exactly one Host header"));
    }
    head.body = match (length, chunked) {
        (Some(_), true) => return Err(bad("both Content-Length and Transfer-Encoding are given")),
        (_, true) if http10 => return Err(bad("chunked transfer coding needs HTTP/1.1")),
        (_, true) => BodyFraming::Chunked,
        (Some(0) | None, false) => BodyFraming::None,
        (Some(n), false) => BodyFraming::Length(n),
    };
    Ok(head)
}

/// The reason phrase of a status.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        414 => "URI Too Long",
        417 => "Expectation Failed",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(s: &str) -> Result<Head, HttpError> {
        parse_head(s.as_bytes())
    }

    #[test]
    fn heads_parse_and_refuse_what_they_should() {
        let h = head("POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nAuthorization: Bearer k\r\n\r\n").unwrap();
        assert_eq!((h.method.as_str(), h.path.as_str(), h.body, h.keep_alive), ("POST", "/v1/completions", BodyFraming::Length(12), true));
        assert_eq!(h.authorization.as_deref(), Some("Bearer k"));
        let h = head("GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(h.http10 && !h.keep_alive);
        assert!(head("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").is_ok_and(|h| !h.keep_alive));
        for (bad, status) in [
            ("GET / HTTP/1.1\r\n\r\n", 400),
            ("GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
            ("GET /  HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            ("GET x HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
            ("POST / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: a\r\nExpect: magic\r\n\r\n", 417),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", 400),
        ] {
            assert_eq!(head(bad).map(|_| ()).unwrap_err().status, status, "{bad:?}");
        }
    }

    #[test]
    fn head_end_is_found_across_reads_and_line_ends() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest", 0), Some(27));
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: a\n\nrest", 0), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n", 0), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 22), Some(27));
        assert_eq!(parse_hex(b"1aF"), Some(0x1af));
        assert_eq!(parse_hex(b"g"), None);
        assert_eq!(parse_hex(b"1000000000000000"), None);
    }
}
