//! `waste serve`: an OpenAI-compatible HTTP server, written with the standard library, that
//! keeps conversations warm. A client of the library like the CLI.
//!
//! Threads: the main thread binds, accepts and (on SIGINT/SIGTERM) stops; one thread per
//! connection, up to a limit, reads requests and writes answers (`conn`, over `http`, in
//! `openai`'s shapes); one model thread owns the model and its slots and serves the bounded
//! queue of jobs in arrival order (`engine`). The model is opened after the socket is bound:
//! until it is ready every endpoint answers 503.

mod conn;
mod engine;
mod http;
mod openai;

use engine::{Engine, Job, Setup};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use waste::template::ChatTemplate;
use waste::{Error, ErrorKind, Options};

pub use http::Limits;

/// Everything `waste serve` is started with.
pub struct Config {
    pub model_dir: PathBuf,
    pub options: Options,
    pub template: Option<ChatTemplate>,
    pub host: String,
    pub port: u16,
    /// The key clients must send; `None` with `open` set serves without one.
    pub api_key: Option<String>,
    /// `--no-api-key`: serve a non-loopback address without a key (the ready line warns).
    pub open: bool,
    pub slots: usize,
    pub queue: usize,
    pub connections: usize,
    pub limits: Limits,
    /// The model id `/v1/models` reports.
    pub alias: String,
    /// `--learn`: count the experts requests use and add them to the usage file whenever
    /// the queue is idle, and at the stop.
    pub learn: bool,
}

/// Where the server is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Loading,
    Ready,
    Stopping,
}

/// What the connection threads and the model thread share.
pub struct Shared {
    pub alias: String,
    /// SHA-256 of the API key: comparing digests takes the same time whatever is sent.
    key: Option<[u8; 32]>,
    pub limits: Limits,
    pub queue: usize,
    pub jobs: SyncSender<Job>,
    /// When the server started (Unix seconds): the model's `created`.
    pub created: u64,
    state: AtomicU8,
    /// Set when the server stops: reads, waits and generations end.
    pub stop: AtomicBool,
    counter: AtomicU64,
    connections: AtomicUsize,
    /// Why the model could not be opened.
    failure: Mutex<Option<Error>>,
}

impl Shared {
    pub fn state(&self) -> State {
        match self.state.load(Ordering::Acquire) {
            0 => State::Loading,
            1 => State::Ready,
            _ => State::Stopping,
        }
    }

    fn set_state(&self, s: State) {
        self.state.store(match s { State::Loading => 0, State::Ready => 1, State::Stopping => 2 }, Ordering::Release);
    }

    /// True when no key is required or `authorization` is `Bearer KEY` with the right key
    /// (compared in constant time, as digests).
    pub fn authorized(&self, authorization: Option<&str>) -> bool {
        let Some(want) = &self.key else { return true };
        let Some(given) = authorization.and_then(|a| a.split_once(' ')).filter(|(s, _)| s.eq_ignore_ascii_case("bearer")).map(|(_, k)| k.trim()) else {
            return false;
        };
        let got = waste::format::sha256::digest(given.as_bytes());
        got.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// A fresh number, mixed (splitmix64) with the clock: ids and default seeds.
    fn unique(&self) -> u64 {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let mut z = nanos ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A reply id: `chatcmpl-…` or `cmpl-…`.
    pub fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}-{:016x}", self.unique())
    }

    /// The seed of a request that gives none.
    pub fn seed(&self) -> u64 {
        self.unique()
    }

    /// The request's line on stderr: who, what, status, tokens (prompt, of which cached,
    /// generated, why it ended, the slot) and time.
    pub fn log(&self, peer: SocketAddr, method: &str, path: &str, status: u16,
               generation: Option<(openai::Usage, engine::Finish, usize)>, elapsed: Option<Duration>) {
        let tokens = generation.map_or(String::new(), |(u, f, slot)| format!(
            " | prompt {} (cached {}), generated {} ({}), slot {slot}", u.prompt, u.cached, u.completion, f.reason()));
        let time = elapsed.map_or(String::new(), |t| format!(" | {:.3} s", t.as_secs_f64()));
        let _ = writeln!(std::io::stderr().lock(), "waste serve: {peer} {method} {path} {status}{tokens}{time}");
    }
}

/// Seconds since the Unix epoch.
pub fn unix_time() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Decrements the open-connection count when a connection thread ends (a panic included).
struct Open<'a>(&'a AtomicUsize);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs the server until SIGINT or SIGTERM. `Err` for what stops it from starting: the
/// address (an [`ErrorKind::Arg`] error when a non-loopback address has no key), the socket,
/// the model.
pub fn run(cfg: Config) -> waste::Result<()> {
    let addr = (cfg.host.as_str(), cfg.port).to_socket_addrs()
        .map_err(|e| Error::arg(format!("option `--host`: cannot resolve `{}`: {e}", cfg.host)))?
        .next().ok_or_else(|| Error::arg(format!("option `--host`: `{}` has no address", cfg.host)))?;
    if !addr.ip().is_loopback() && cfg.api_key.is_none() && !cfg.open {
        return Err(Error::arg(format!(
            "listening on {addr}, beyond this machine, needs an API key (--api-key KEY or --api-key-file F), or --no-api-key to serve anyone who can reach it")));
    }
    let listener = TcpListener::bind(addr).map_err(|e| Error::new(ErrorKind::Io, format!("cannot listen on {addr}: {e}")))?;
    listener.set_nonblocking(true).map_err(|e| Error::new(ErrorKind::Io, format!("{addr}: {e}")))?;
    let local = listener.local_addr().map_err(|e| Error::new(ErrorKind::Io, format!("{addr}: {e}")))?;
    waste::host::catch_signals()?;
    // Few allocator arenas, so that what a burst of requests allocated can be given back.
    waste::host::limit_allocator_arenas(2);
    let (jobs, queue) = mpsc::sync_channel(cfg.queue);
    let shared = Arc::new(Shared {
        alias: cfg.alias.clone(),
        key: cfg.api_key.as_ref().map(|k| waste::format::sha256::digest(k.as_bytes())),
        limits: cfg.limits,
        queue: cfg.queue,
        jobs,
        created: unix_time(),
        state: AtomicU8::new(0),
        stop: AtomicBool::new(false),
        counter: AtomicU64::new(0),
        connections: AtomicUsize::new(0),
        failure: Mutex::new(None),
    });
    tell(&format!("waste serve: listening on http://{local}, loading {}", cfg.model_dir.display()));
    let ready = Ready { local, alias: cfg.alias.clone(), slots: cfg.slots, queue: cfg.queue, keyed: cfg.api_key.is_some() };
    let setup = Setup { model_dir: cfg.model_dir, options: cfg.options, template: cfg.template, slots: cfg.slots, learn: cfg.learn };
    let engine = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new().name("model".into()).stack_size(8 << 20).spawn(move || model_thread(setup, queue, &shared, ready))
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot start the model thread: {e}")))?
    };
    let signals = accept_until_signal(&listener, &shared, cfg.connections)?;
    drop(listener);
    let loading = shared.state() == State::Loading;
    shared.set_state(State::Stopping);
    shared.stop.store(true, Ordering::SeqCst);
    tell("waste serve: stopping: in-flight replies end with an error, no new connections");
    // A model still loading is not waited for: the process ends around it.
    if !loading {
        let _ = engine.join();
    }
    // Connections notice the stop within a read slice; a second signal ends the wait at once.
    let deadline = Instant::now() + Duration::from_secs(5);
    while shared.connections.load(Ordering::Acquire) > 0 && Instant::now() < deadline && signal_count() == signals {
        std::thread::sleep(Duration::from_millis(20));
    }
    tell("waste serve: stopped");
    Ok(())
}

fn signal_count() -> usize {
    waste::host::interrupts() + waste::host::terminations()
}

/// Prints the ready line on stdout (the one line there, which scripts wait for) or, failing
/// that, nowhere.
fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}").and_then(|()| o.flush());
}

/// Prints a line on stderr, where the server's messages and request lines go.
fn tell(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// What the ready line says besides the budget, which is known once the model is open.
struct Ready {
    local: SocketAddr,
    alias: String,
    slots: usize,
    queue: usize,
    keyed: bool,
}

impl Ready {
    fn line(&self, budget: u64) -> String {
        let local = self.local;
        let key = match (self.keyed, local.ip().is_loopback()) {
            (true, _) => ", API key required",
            (false, true) => "",
            (false, false) => " — WARNING: no API key (--no-api-key): anyone who can reach this address can use the model",
        };
        format!("waste serve: ready on http://{local} (model `{}`, {} slot{}, queue {}, budget {:.1} MiB{key})", self.alias, self.slots,
            if self.slots == 1 { "" } else { "s" }, self.queue, budget as f64 / (1 << 20) as f64)
    }
}

/// The model thread: opens the model, then serves jobs until the server stops. A model that
/// cannot be opened is recorded for the main thread, which ends the server with it.
fn model_thread(setup: Setup, queue: mpsc::Receiver<Job>, shared: &Shared, ready: Ready) {
    match Engine::open(setup) {
        Ok(engine) => {
            let b = engine.model().budget();
            if let Some(w) = &b.warning {
                tell(&format!("waste serve: warning: {w}"));
            }
            for n in engine.model().notes() {
                tell(&format!("waste serve: {n}"));
            }
            if !engine.has_template() {
                tell("waste serve: warning: the model has no chat template: /v1/chat/completions answers 400 (start with --template chatml|llama3|FILE)");
            }
            shared.set_state(State::Ready);
            say(&ready.line(b.bytes));
            engine.serve(queue, &shared.stop);
        }
        Err(e) => {
            if let Ok(mut f) = shared.failure.lock() {
                *f = Some(e);
            }
        }
    }
}

/// Accepts connections until a signal arrives (returning the signal count then) or the model
/// fails to open (returning its error).
fn accept_until_signal(listener: &TcpListener, shared: &Arc<Shared>, max_connections: usize) -> waste::Result<usize> {
    // Connections accepted since the allocator last gave free memory back: after a burst (of
    // large bodies, say) the server returns to its size once it is quiet.
    let mut since_trim = 0usize;
    loop {
        let signals = signal_count();
        if signals > 0 {
            return Ok(signals);
        }
        if let Some(e) = shared.failure.lock().ok().and_then(|mut f| f.take()) {
            return Err(e);
        }
        match waste::host::wait_readable(listener.as_raw_fd(), Duration::from_millis(250)) {
            Ok(true) => {}
            Ok(false) => {
                if since_trim > 0 && shared.connections.load(Ordering::Acquire) == 0 {
                    waste::host::release_free_memory();
                    since_trim = 0;
                }
                continue;
            }
            Err(e) => return Err(Error::new(ErrorKind::Io, format!("waiting for connections: {e}"))),
        }
        loop {
            match listener.accept() {
                Ok((stream, peer)) => {
                    since_trim += 1;
                    admit(stream, peer, shared, max_connections);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => break,
                Err(e) => {
                    // Out of descriptors, say: report it and let the backlog wait a little.
                    tell(&format!("waste serve: accept: {e}"));
                    std::thread::sleep(Duration::from_millis(50));
                    break;
                }
            }
        }
    }
}

/// Starts a thread for a new connection, or answers 503 when `max` are open already.
fn admit(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>, max: usize) {
    let _ = stream.set_nonblocking(false);
    if shared.connections.fetch_add(1, Ordering::AcqRel) >= max {
        shared.connections.fetch_sub(1, Ordering::AcqRel);
        refuse(stream, peer, shared, "too many open connections: retry later");
        return;
    }
    let s = Arc::clone(shared);
    let spawned = std::thread::Builder::new().name("connection".into()).stack_size(512 << 10).spawn(move || {
        let _open = Open(&s.connections);
        conn::serve(stream, peer, &s);
    });
    if spawned.is_err() {
        shared.connections.fetch_sub(1, Ordering::AcqRel);
        tell(&format!("waste serve: cannot start a thread for {peer}"));
    }
}

/// A quick 503 from the accepting thread (which must not wait on a slow client).
fn refuse(mut stream: TcpStream, peer: SocketAddr, shared: &Shared, why: &str) {
    let body = openai::ApiError::status(503, why).to_json();
    let msg = format!("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{body}", body.len());
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = stream.write_all(msg.as_bytes());
    shared.log(peer, "-", "-", 503, None, None);
}

#[cfg(test)]
mod tests {
    use super::Ready;

    #[test]
    fn the_ready_line_says_where_and_warns_without_a_key_beyond_loopback() {
        let r = |addr: &str, keyed| Ready { local: addr.parse().unwrap(), alias: "m".into(), slots: 2, queue: 16, keyed }.line(3 << 20);
        assert_eq!(r("127.0.0.1:8080", false), "waste serve: ready on http://127.0.0.1:8080 (model `m`, 2 slots, queue 16, budget 3.0 MiB)");
        assert!(r("127.0.0.1:8080", true).ends_with(", API key required)"));
        assert!(r("0.0.0.0:8080", false).contains("WARNING: no API key"));
        assert!(!r("0.0.0.0:8080", true).contains("WARNING"));
    }
}
