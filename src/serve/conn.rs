//! One client connection: requests read in turn (kept alive between them), routed, checked for
//! the API key, and answered; a generation request goes on the bounded queue for the model
//! thread and its events are written back as they come — whole, or as Server-Sent Events —
//! while the client is watched, so that one that leaves cancels its generation at the next
//! token.

use super::engine::{Event, Finish, Job};
use super::http::{BodyFraming, Connection, Head, HttpError};
use super::openai::{self, ApiError, Chunk, Endpoint, Meta, TokenLogprob, Usage};
use super::{Shared, State};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a connection waiting for the model checks that its client is still there.
const WATCH: Duration = Duration::from_millis(50);

/// What a request came to, for the log line.
struct Outcome {
    status: u16,
    /// The connection may serve another request.
    keep_alive: bool,
    /// The request's body was not read: close gently (see `Connection::linger_close`).
    unread_body: bool,
    generation: Option<(Usage, Finish, usize)>,
}

impl Outcome {
    fn status(status: u16, head: &Head) -> Outcome {
        Outcome { status, keep_alive: true, unread_body: head.body != BodyFraming::None, generation: None }
    }
}

/// Serves the requests of one connection until it closes, idles out, errs or the server stops.
pub fn serve(stream: TcpStream, peer: SocketAddr, shared: &Shared) {
    let mut conn = Connection::new(stream, shared.limits, &shared.stop);
    loop {
        let head = match conn.read_head() {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => {
                let status = e.status;
                let _ = respond_error(&mut conn, &http_error(e), false, &[]);
                shared.log(peer, "-", "-", status, None, None);
                conn.linger_close();
                return;
            }
        };
        let started = Instant::now();
        let out = handle(&mut conn, &head, shared);
        shared.log(peer, &head.method, &head.path, out.status, out.generation, Some(started.elapsed()));
        let stopping = shared.stop.load(Ordering::Relaxed);
        if !out.keep_alive || !head.keep_alive || out.unread_body || stopping {
            if out.unread_body {
                conn.linger_close();
            }
            return;
        }
    }
}

fn http_error(e: HttpError) -> ApiError {
    ApiError::status(e.status, e.message)
}

/// Writes `e` as an OpenAI error body.
fn respond_error(conn: &mut Connection, e: &ApiError, keep_alive: bool, extra: &[(&str, String)]) -> std::io::Result<()> {
    conn.respond(e.status, "application/json", extra, e.to_json().as_bytes(), keep_alive)
}

/// The endpoints.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route<'a> {
    Health,
    Models,
    Model(&'a str),
    Generate(Endpoint),
}

fn route(path: &str) -> Option<Route<'_>> {
    Some(match path {
        "/health" => Route::Health,
        "/v1/models" => Route::Models,
        "/v1/chat/completions" => Route::Generate(Endpoint::Chat),
        "/v1/completions" => Route::Generate(Endpoint::Completion),
        p => Route::Model(p.strip_prefix("/v1/models/").filter(|id| !id.is_empty())?),
    })
}

/// Answers one request whose head has been read.
fn handle(conn: &mut Connection, head: &Head, shared: &Shared) -> Outcome {
    let fail = |conn: &mut Connection, e: ApiError, extra: &[(&str, String)]| {
        let mut out = Outcome::status(e.status, head);
        out.keep_alive = respond_error(conn, &e, !out.unread_body && head.keep_alive, extra).is_ok();
        out
    };
    let Some(route) = route(&head.path) else {
        return fail(conn, ApiError::status(404, format!("no endpoint {} {} (see docs/SERVE.md)", head.method, head.path)), &[]);
    };
    let method = if matches!(route, Route::Generate(_)) { "POST" } else { "GET" };
    if head.method != method {
        return fail(conn, ApiError::status(405, format!("{} takes {method}, not {}", head.path, head.method)), &[("Allow", method.into())]);
    }
    if route != Route::Health && !shared.authorized(head.authorization.as_deref()) {
        let e = ApiError::status(401, "a valid API key is needed: send `Authorization: Bearer KEY`");
        return fail(conn, e, &[("WWW-Authenticate", "Bearer".into())]);
    }
    match shared.state() {
        State::Ready => {}
        State::Loading => return fail(conn, ApiError::status(503, "the model is loading").with_code("model_loading"), &[("Retry-After", "5".into())]),
        State::Stopping => return fail(conn, ApiError::status(503, "the server is shutting down").with_code("server_shutting_down"), &[]),
    }
    let ok = |conn: &mut Connection, body: String| {
        let mut out = Outcome::status(200, head);
        out.keep_alive = conn.respond(200, "application/json", &[], body.as_bytes(), !out.unread_body && head.keep_alive).is_ok();
        out
    };
    match route {
        Route::Health => ok(conn, r#"{"status":"ok"}"#.to_string()),
        Route::Models => ok(conn, openai::models_list(&shared.alias, shared.created)),
        Route::Model(id) if id == shared.alias => ok(conn, openai::model_json(&shared.alias, shared.created).to_string_compact()),
        Route::Model(id) => fail(conn, ApiError::status(404, format!("model `{id}` does not exist (this server has `{}`)", shared.alias))
            .with_code("model_not_found"), &[]),
        Route::Generate(endpoint) => generate(conn, head, shared, endpoint),
    }
}

/// A completion request: read, checked, queued, answered.
fn generate(conn: &mut Connection, head: &Head, shared: &Shared, endpoint: Endpoint) -> Outcome {
    let body = match conn.read_body(head) {
        Ok(b) => b,
        Err(e) => {
            let status = e.status;
            let _ = respond_error(conn, &http_error(e), false, &[]);
            // A refused length was never read; a broken body may have left bytes behind.
            return Outcome { status, keep_alive: false, unread_body: true, generation: None };
        }
    };
    let done = Outcome { status: 0, keep_alive: head.keep_alive, unread_body: false, generation: None };
    let fail = |conn: &mut Connection, e: ApiError, extra: &[(&str, String)]| Outcome {
        status: e.status,
        keep_alive: respond_error(conn, &e, head.keep_alive, extra).is_ok() && head.keep_alive,
        ..done
    };
    let parsed = openai::parse_body(&body).and_then(|json| openai::parse_request(endpoint, &json, shared.seed()));
    drop(body);
    let request = match parsed {
        Ok(r) => r,
        Err(e) => return fail(conn, e, &[]),
    };
    let (stream, include_usage) = (request.stream, request.include_usage);
    let (tx, rx) = mpsc::channel();
    let cancel = Arc::new(AtomicBool::new(false));
    match shared.jobs.try_send(Job { request, events: tx, cancel: cancel.clone() }) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            let e = ApiError::status(429, format!("the server's queue of {} requests is full: retry later", shared.queue));
            return fail(conn, e, &[("Retry-After", "1".into())]);
        }
        Err(TrySendError::Disconnected(_)) => return fail(conn, ApiError::status(503, "the model is not running"), &[]),
    }
    let id = shared.new_id(if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" });
    let meta = Meta { id: &id, created: super::unix_time(), model: &shared.alias };
    let mut reply = Reply { conn, endpoint, meta, cancel, http10: head.http10, keep_alive: head.keep_alive, include_usage, watched: Instant::now() };
    if stream { reply.streamed(&rx) } else { reply.whole(&rx) }
}

/// One generation's answer being written.
struct Reply<'c, 'a, 'm> {
    conn: &'c mut Connection<'a>,
    endpoint: Endpoint,
    meta: Meta<'m>,
    cancel: Arc<AtomicBool>,
    http10: bool,
    keep_alive: bool,
    include_usage: bool,
    /// When the client was last looked at.
    watched: Instant,
}

/// What a reply waits for next.
enum Next {
    Event(Event),
    Watch,
    /// The model thread dropped the job (a panic there).
    Lost,
}

impl Reply<'_, '_, '_> {
    /// The next event, or `Watch` when it is time to look at the client (every [`WATCH`],
    /// whether events arrive or not).
    fn next(&mut self, rx: &mpsc::Receiver<Event>) -> Next {
        let wait = (self.watched + WATCH).saturating_duration_since(Instant::now());
        if wait.is_zero() {
            self.watched = Instant::now();
            return Next::Watch;
        }
        match rx.recv_timeout(wait) {
            Ok(e) => Next::Event(e),
            Err(RecvTimeoutError::Timeout) => Next::Watch,
            // A job queued as the model thread stopped is dropped with the queue.
            Err(RecvTimeoutError::Disconnected) if self.conn.stopping() => Next::Event(Event::Failed(
                ApiError::status(503, "the server is shutting down").with_code("server_shutting_down"))),
            Err(RecvTimeoutError::Disconnected) => Next::Lost,
        }
    }

    /// Cancels the generation when the client has gone; true when cancelled.
    fn watch(&self) -> bool {
        if !self.cancel.load(Ordering::Relaxed) && self.conn.peer_gone() {
            self.cancel.store(true, Ordering::Relaxed);
        }
        self.cancel.load(Ordering::Relaxed)
    }

    fn outcome(&self, status: u16, keep_alive: bool, generation: Option<(Usage, Finish, usize)>) -> Outcome {
        Outcome { status, keep_alive: keep_alive && self.keep_alive, unread_body: false, generation }
    }

    fn error(&mut self, e: ApiError) -> Outcome {
        let ok = respond_error(self.conn, &e, self.keep_alive, &[]).is_ok();
        self.outcome(e.status, ok, None)
    }

    /// Collects the whole reply, then writes it.
    fn whole(&mut self, rx: &mpsc::Receiver<Event>) -> Outcome {
        let (mut text, mut logprobs, mut with_logprobs) = (String::new(), Vec::<TokenLogprob>::new(), false);
        loop {
            match self.next(rx) {
                Next::Event(Event::Started) => {}
                Next::Event(Event::Token { text: t, logprob }) => {
                    text.push_str(&t);
                    with_logprobs |= logprob.is_some();
                    logprobs.extend(logprob);
                }
                Next::Event(Event::Done { usage, finish, slot }) => {
                    if finish == Finish::Cancelled || self.cancel.load(Ordering::Relaxed) {
                        return self.outcome(499, false, Some((usage, Finish::Cancelled, slot)));
                    }
                    let lp = with_logprobs.then_some(logprobs.as_slice());
                    let body = openai::reply(self.endpoint, &self.meta, &text, finish.reason(), lp, &usage);
                    let ok = self.conn.respond(200, "application/json", &[], body.as_bytes(), self.keep_alive).is_ok();
                    return self.outcome(200, ok, Some((usage, finish, slot)));
                }
                Next::Event(Event::Failed(e)) => return self.error(e),
                Next::Watch => {
                    self.watch();
                }
                Next::Lost => return self.error(ApiError::status(500, "the model thread failed on this request")),
            }
        }
    }

    /// Writes one chunk; a client that is gone (or a failed write) cancels the generation.
    fn send(&mut self, c: &Chunk) {
        if self.watch() {
            return;
        }
        let json = openai::chunk(self.endpoint, &self.meta, c);
        if self.conn.event(&json, self.http10).is_err() {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }

    /// Streams the reply as Server-Sent Events: a chunk per token, a last chunk with the finish
    /// reason, the usage when asked for, then `data: [DONE]`. An error after the stream began
    /// is sent as an `error` event that ends it.
    fn streamed(&mut self, rx: &mpsc::Receiver<Event>) -> Outcome {
        let mut started = false;
        let mut offset = 0;
        loop {
            match self.next(rx) {
                Next::Event(Event::Started) => {
                    if self.conn.begin_events(self.http10).is_err() {
                        self.cancel.store(true, Ordering::Relaxed);
                    }
                    started = true;
                    if self.endpoint == Endpoint::Chat {
                        self.send(&Chunk { role: true, text: Some(""), finish: None, logprobs: None, offset });
                    }
                }
                Next::Event(Event::Token { text, logprob }) => {
                    let lp = logprob.as_ref().map(std::slice::from_ref);
                    self.send(&Chunk { role: false, text: Some(&text), finish: None, logprobs: lp, offset });
                    offset += text.len();
                }
                Next::Event(Event::Done { usage, finish, slot }) => {
                    if finish == Finish::Cancelled || self.cancel.load(Ordering::Relaxed) {
                        return self.outcome(499, false, Some((usage, Finish::Cancelled, slot)));
                    }
                    let text = (self.endpoint == Endpoint::Completion).then_some("");
                    self.send(&Chunk { role: false, text, finish: Some(finish.reason()), logprobs: None, offset });
                    if self.include_usage {
                        let json = openai::usage_chunk(self.endpoint, &self.meta, &usage);
                        let _ = self.conn.event(&json, self.http10);
                    }
                    let ok = self.conn.event("[DONE]", self.http10).and_then(|()| self.conn.end_events(self.http10)).is_ok();
                    return self.outcome(200, ok && !self.http10, Some((usage, finish, slot)));
                }
                Next::Event(Event::Failed(e)) if !started => return self.error(e),
                Next::Event(Event::Failed(e)) => return self.end_with_error(e),
                Next::Watch => {
                    self.watch();
                }
                Next::Lost if !started => return self.error(ApiError::status(500, "the model thread failed on this request")),
                Next::Lost => return self.end_with_error(ApiError::status(500, "the model thread failed on this request")),
            }
        }
    }

    /// Ends a stream that has begun with an `error` event instead of `[DONE]`.
    fn end_with_error(&mut self, e: ApiError) -> Outcome {
        let ok = self.conn.event(&e.to_json(), self.http10).and_then(|()| self.conn.end_events(self.http10)).is_ok();
        self.outcome(e.status, ok && !self.http10, None)
    }
}

#[cfg(test)]
mod tests {
    use super::{route, Endpoint, Route};

    #[test]
    fn routes() {
        assert!(route("/health") == Some(Route::Health));
        assert!(route("/v1/models/m") == Some(Route::Model("m")));
        assert!(route("/v1/chat/completions") == Some(Route::Generate(Endpoint::Chat)));
        assert!(route("/v1/models/").is_none() && route("/").is_none() && route("/v1/chat/completions/").is_none());
    }
}
