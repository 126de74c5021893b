//! The OpenAI API's shapes: a request body checked and turned into what the model thread runs
//! (every parameter validated, a bad one named in a 400), and the JSON of replies, stream
//! chunks, model lists and errors.
//!
//! What is accepted, what is refused and what is ignored is listed in `docs/SERVE.md`; in
//! short: unknown fields are ignored as OpenAI does, while a known parameter this server cannot
//! honour (`n` > 1, tools, a non-zero penalty, images) is a 400 that says so rather than a
//! silently different answer.

use waste::format::json::{self, Json};
use waste::SamplingParams;

/// Nesting allowed in a request body (a chat request needs 4 or 5 levels).
pub const MAX_DEPTH: usize = 32;
/// JSON values allowed in a request body (checked before parsing, which allocates per value).
pub const MAX_VALUES: usize = 1 << 17;
/// Stop strings per request, and bytes per stop string.
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 1024;
/// Most alternatives per token for `top_logprobs` / legacy `logprobs`.
pub const MAX_TOP_LOGPROBS: u64 = 20;
/// Default `max_tokens` of the legacy completions endpoint (OpenAI's).
const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;
/// What replies report as `system_fingerprint`.
pub const FINGERPRINT: &str = concat!("waste-", env!("CARGO_PKG_VERSION"));

/// An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about parameter `param`.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { status: 400, kind: "invalid_request_error", message: message.into(), param: Some(param.to_string()), code: None }
    }

    /// A 400 about the request as a whole.
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError { status: 400, kind: "invalid_request_error", message: message.into(), param: None, code: None }
    }

    /// An error with `status`, its type chosen from the status.
    pub fn status(status: u16, message: impl Into<String>) -> ApiError {
        let (kind, code) = match status {
            401 => ("authentication_error", Some("invalid_api_key")),
            404 => ("not_found_error", None),
            429 => ("rate_limit_error", Some("queue_full")),
            500 => ("server_error", None),
            501 => ("not_supported_error", None),
            503 => ("unavailable_error", None),
            _ => ("invalid_request_error", None),
        };
        ApiError { status, kind, message: message.into(), param: None, code }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The error's JSON body.
    pub fn to_json(&self) -> String {
        Json::object([("error", Json::object([
            ("message", Json::str(self.message.clone())),
            ("type", Json::str(self.kind)),
            ("param", self.param.as_ref().map_or(Json::Null, |p| Json::str(p.clone()))),
            ("code", self.code.map_or(Json::Null, Json::str)),
        ]))]).to_string_compact()
    }
}

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// What the model is prompted with.
#[derive(Debug)]
pub enum Prompt {
    /// Chat messages, checked and normalized (content as text), for the chat template.
    Messages(Json),
    /// Text, tokenized as `waste run` does (BOS, then the text as content).
    Text(String),
    /// Token ids, used as they are.
    Ids(Vec<u32>),
}

/// A generation request, checked.
#[derive(Debug)]
pub struct Request {
    pub endpoint: Endpoint,
    pub prompt: Prompt,
    /// Extra chat-template variables (`chat_template_kwargs`).
    pub template_vars: Vec<(String, Json)>,
    /// `None`: until the context is full.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// `Some(n)`: report each token's log probability and its `n` most likely alternatives.
    pub logprobs: Option<usize>,
}

/// Parses a request body: its shape bounded (depth, number of values) before the parser
/// allocates anything for it.
pub fn parse_body(body: &[u8]) -> Result<Json, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad("the request has no body: send a JSON object"));
    }
    check_shape(body)?;
    json::parse_with_depth(body, MAX_DEPTH + 1).map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))
}

/// Refuses a body nested deeper than [`MAX_DEPTH`] or holding more than [`MAX_VALUES`]
/// values, from one pass over its bytes (strings and their escapes skipped).
fn check_shape(body: &[u8]) -> Result<(), ApiError> {
    let (mut depth, mut values, mut in_string, mut escaped) = (0usize, 1usize, false, false);
    for &c in body {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                values += 1;
                if depth > MAX_DEPTH {
                    return Err(ApiError::bad(format!("the body is nested more than {MAX_DEPTH} levels deep")));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' => values += 1,
            _ => {}
        }
        if values > MAX_VALUES {
            return Err(ApiError::bad(format!("the body holds more than {MAX_VALUES} JSON values")));
        }
    }
    Ok(())
}

/// Typed lookups in a request object, each naming the parameter when it is wrong.
struct Fields<'a>(&'a Json);

impl<'a> Fields<'a> {
    /// The value of `name`, `None` when absent or null.
    fn get(&self, name: &str) -> Option<&'a Json> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn number(&self, name: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let x = v.as_f64().ok_or_else(|| ApiError::param(name, format!("`{name}` must be a number, not {}", v.type_name())))?;
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::param(name, format!("`{name}` is {x}, out of range {lo}..={hi}")));
        }
        Ok(Some(x))
    }

    fn integer(&self, name: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let n = v.as_i64().map(|n| n.max(-1) as i128).or_else(|| v.as_u64().map(|n| n as i128))
            .ok_or_else(|| ApiError::param(name, format!("`{name}` must be an integer, not {}", v.type_name())))?;
        if n < lo as i128 || n > hi as i128 {
            return Err(ApiError::param(name, format!("`{name}` is {}, out of range {lo}..={hi}", json_text(v))));
        }
        Ok(Some(n as u64))
    }

    fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        v.as_bool().map(Some).ok_or_else(|| ApiError::param(name, format!("`{name}` must be true or false, not {}", v.type_name())))
    }

    /// A parameter this server does not implement: absent, null, or `neutral` is accepted.
    fn unsupported(&self, name: &str, neutral: impl Fn(&Json) -> bool, what: &str) -> Result<(), ApiError> {
        match self.get(name) {
            Some(v) if !neutral(v) => Err(ApiError::param(name, format!("`{name}` is not supported by this server ({what})"))),
            _ => Ok(()),
        }
    }
}

/// A short text of a value for a message.
fn json_text(v: &Json) -> String {
    let s = v.to_string_compact();
    if s.len() > 40 { format!("{}…", s.chars().take(40).collect::<String>()) } else { s }
}

/// Checks a request for `endpoint`. `seed` is the seed used when the request gives none.
pub fn parse_request(endpoint: Endpoint, body: &Json, seed: u64) -> Result<Request, ApiError> {
    if body.as_object().is_none() {
        return Err(ApiError::bad(format!("the body must be a JSON object, not {}", body.type_name())));
    }
    let f = Fields(body);
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Messages(messages(f.0.get("messages"))?),
        Endpoint::Completion => completion_prompt(f.0.get("prompt"))?,
    };
    if let Some(model) = f.get("model") {
        if model.as_str().is_none() {
            return Err(ApiError::param("model", "`model` must be a string"));
        }
    }
    if let Some(n) = f.integer("n", 0, u64::MAX)? {
        if n != 1 {
            return Err(ApiError::param("n", format!("`n` is {n}: this server generates one choice per request (n = 1)")));
        }
    }
    let zero = |v: &Json| v.as_f64() == Some(0.0);
    f.unsupported("frequency_penalty", zero, "only 0; see `repeat_penalty`")?;
    f.unsupported("presence_penalty", zero, "only 0; see `repeat_penalty`")?;
    f.unsupported("logit_bias", |v| v.as_object().is_some_and(|o| o.is_empty()), "only an empty object")?;
    f.unsupported("tools", |v| v.as_array().is_some_and(|a| a.is_empty()), "no tool calls")?;
    f.unsupported("functions", |v| v.as_array().is_some_and(|a| a.is_empty()), "no function calls")?;
    f.unsupported("response_format", |v| v.get("type").and_then(Json::as_str) == Some("text"), "only {\"type\": \"text\"}")?;
    let mut max_tokens = f.integer("max_tokens", 1, waste::MAX_CONTEXT as u64)?;
    if endpoint == Endpoint::Chat {
        max_tokens = f.integer("max_completion_tokens", 1, waste::MAX_CONTEXT as u64)?.or(max_tokens);
    } else {
        f.unsupported("echo", |v| v.as_bool() == Some(false), "only false")?;
        f.unsupported("suffix", |v| v.as_str() == Some(""), "no insertion")?;
        f.unsupported("best_of", |v| v.as_u64() == Some(1), "only 1")?;
    }
    let max_tokens = max_tokens.map(|n| n as usize).or((endpoint == Endpoint::Completion).then_some(COMPLETION_DEFAULT_MAX_TOKENS));
    let stream = f.boolean("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(_) if !stream => return Err(ApiError::param("stream_options", "`stream_options` is only allowed with `stream: true`")),
        Some(o) if o.as_object().is_none() => return Err(ApiError::param("stream_options", "`stream_options` must be an object")),
        Some(o) => Fields(o).boolean("include_usage").map_err(|e| ApiError { param: Some("stream_options.include_usage".into()), ..e })?.unwrap_or(false),
    };
    let logprobs = match endpoint {
        Endpoint::Chat => {
            let on = f.boolean("logprobs")?.unwrap_or(false);
            match f.integer("top_logprobs", 0, MAX_TOP_LOGPROBS)? {
                Some(_) if !on => return Err(ApiError::param("top_logprobs", "`top_logprobs` needs `logprobs: true`")),
                top => on.then_some(top.unwrap_or(0) as usize),
            }
        }
        Endpoint::Completion => f.integer("logprobs", 0, MAX_TOP_LOGPROBS)?.map(|n| n as usize),
    };
    Ok(Request {
        endpoint,
        prompt,
        template_vars: template_vars(&f)?,
        max_tokens,
        sampling: sampling(&f, seed)?,
        stop: stops(f.get("stop"))?,
        stream,
        include_usage,
        logprobs,
    })
}

/// The sampler's settings: OpenAI's `temperature`, `top_p` and `seed`, and llama.cpp's
/// `top_k`, `min_p`, `repeat_penalty` and `repeat_last_n`; absent ones take the engine's
/// defaults (those of `waste run`).
fn sampling(f: &Fields, seed: u64) -> Result<SamplingParams, ApiError> {
    let mut p = SamplingParams { seed, ..SamplingParams::default() };
    if let Some(t) = f.number("temperature", 0.0, 2.0)? {
        p.temperature = t as f32;
    }
    if let Some(k) = f.integer("top_k", 0, 1 << 24)? {
        p.top_k = k as usize;
    }
    if let Some(v) = f.number("top_p", 0.0, 1.0)? {
        // top_p = 0 keeps the single most likely token, as OpenAI's does.
        if v == 0.0 {
            p.top_k = 1;
        } else {
            p.top_p = v as f32;
        }
    }
    if let Some(v) = f.number("min_p", 0.0, 1.0)? {
        p.min_p = v as f32;
    }
    if let Some(v) = f.number("repeat_penalty", 0.0, 100.0)? {
        if v == 0.0 {
            return Err(ApiError::param("repeat_penalty", "`repeat_penalty` must be greater than 0 (1 is off)"));
        }
        p.repeat_penalty = v as f32;
    }
    if let Some(n) = f.integer("repeat_last_n", 0, waste::MAX_CONTEXT as u64)? {
        p.repeat_last_n = n as usize;
    }
    if let Some(v) = f.get("seed") {
        p.seed = v.as_i64().map(|s| s as u64).or_else(|| v.as_u64())
            .ok_or_else(|| ApiError::param("seed", format!("`seed` must be an integer, not {}", json_text(v))))?;
    }
    p.validate().map_err(|e| ApiError::bad(e.message().to_string()))?;
    Ok(p)
}

/// `stop`: a string or a list of strings.
fn stops(v: Option<&Json>) -> Result<Vec<String>, ApiError> {
    let list: Vec<&Json> = match v {
        None => return Ok(Vec::new()),
        Some(s @ Json::String(_)) => vec![s],
        Some(Json::Array(a)) => a.iter().collect(),
        Some(other) => return Err(ApiError::param("stop", format!("`stop` must be a string or a list of strings, not {}", other.type_name()))),
    };
    if list.len() > MAX_STOPS {
        return Err(ApiError::param("stop", format!("`stop` has {} strings, more than {MAX_STOPS}", list.len())));
    }
    list.iter().map(|s| match s.as_str() {
        Some(t) if t.len() <= MAX_STOP_BYTES => Ok(t.to_string()),
        Some(_) => Err(ApiError::param("stop", format!("a stop string is longer than {MAX_STOP_BYTES} bytes"))),
        None => Err(ApiError::param("stop", "every stop must be a string")),
    }).collect()
}

/// `chat_template_kwargs` (llama.cpp's and vLLM's extension): extra template variables.
fn template_vars(f: &Fields) -> Result<Vec<(String, Json)>, ApiError> {
    match f.get("chat_template_kwargs") {
        None => Ok(Vec::new()),
        Some(Json::Object(m)) => {
            if let Some((k, _)) = m.iter().find(|(k, _)| k == "messages" || k == "add_generation_prompt") {
                return Err(ApiError::param("chat_template_kwargs", format!("`{k}` is set by the server, not by chat_template_kwargs")));
            }
            Ok(m.clone())
        }
        Some(v) => Err(ApiError::param("chat_template_kwargs", format!("`chat_template_kwargs` must be an object, not {}", v.type_name()))),
    }
}

/// The legacy endpoint's `prompt`: a string, a list of one string, or token ids (a list of
/// integers, or a list of one such list).
fn completion_prompt(v: Option<&Json>) -> Result<Prompt, ApiError> {
    let one = "`prompt` must be a string or a list of token ids (one prompt per request)";
    let ids = |a: &[Json]| -> Result<Vec<u32>, ApiError> {
        a.iter().map(|t| t.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as u32)
            .ok_or_else(|| ApiError::param("prompt", "a token id must be a non-negative integer"))).collect()
    };
    match v {
        Some(Json::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Json::Array(a)) => match a.as_slice() {
            [Json::String(s)] => Ok(Prompt::Text(s.clone())),
            [Json::Array(inner)] => Ok(Prompt::Ids(ids(inner)?)),
            list if !list.is_empty() && list.iter().all(|t| matches!(t, Json::Number(_))) => Ok(Prompt::Ids(ids(list)?)),
            _ => Err(ApiError::param("prompt", one)),
        },
        None => Err(ApiError::param("prompt", "`prompt` is required")),
        Some(_) => Err(ApiError::param("prompt", one)),
    }
}

/// `messages`, checked: each an object with a known role and text content; `developer` becomes
/// `system` (chat templates know the latter), content given as parts becomes their text
/// joined by newlines, and every other key is passed to the template as it is.
fn messages(v: Option<&Json>) -> Result<Json, ApiError> {
    let Some(list) = v.and_then(Json::as_array) else {
        return Err(ApiError::param("messages", "`messages` is required: a list of {\"role\", \"content\"} objects"));
    };
    if list.is_empty() {
        return Err(ApiError::param("messages", "`messages` is empty"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = |k: &str| format!("messages[{i}].{k}");
        let Some(members) = m.as_object() else {
            return Err(ApiError::param(&format!("messages[{i}]"), format!("a message must be an object, not {}", m.type_name())));
        };
        let role = match m.get("role").and_then(Json::as_str) {
            Some("developer") => "system",
            Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
            Some(r) => return Err(ApiError::param(&at("role"), format!("unknown role `{r}` (system, developer, user, assistant, tool)"))),
            None => return Err(ApiError::param(&at("role"), "a message needs a `role` string")),
        };
        if m.get("tool_calls").and_then(Json::as_array).is_some_and(|a| !a.is_empty()) {
            return Err(ApiError::param(&at("tool_calls"), "tool calls are not supported by this server"));
        }
        let content = match m.get("content") {
            Some(Json::String(s)) => s.clone(),
            None | Some(Json::Null) if role == "assistant" => String::new(),
            Some(Json::Array(parts)) => content_parts(parts, &at("content"))?,
            None | Some(Json::Null) => return Err(ApiError::param(&at("content"), "a message needs `content`")),
            Some(other) => return Err(ApiError::param(&at("content"), format!("`content` must be a string or a list of parts, not {}", other.type_name()))),
        };
        let mut msg = vec![("role".to_string(), Json::str(role)), ("content".to_string(), Json::String(content))];
        msg.extend(members.iter().filter(|(k, _)| k != "role" && k != "content").cloned());
        out.push(Json::Object(msg));
    }
    Ok(Json::Array(out))
}

/// Content given as parts: the text parts' text, joined by newlines.
fn content_parts(parts: &[Json], param: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for p in parts {
        match (p.get("type").and_then(Json::as_str), p.get("text").and_then(Json::as_str)) {
            (Some("text"), Some(t)) => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
            }
            (Some("text"), None) => return Err(ApiError::param(param, "a text part needs a `text` string")),
            (Some(kind), _) => return Err(ApiError::param(param, format!("content parts of type `{kind}` are not supported (text only)"))),
            (None, _) => return Err(ApiError::param(param, "a content part needs a `type`")),
        }
    }
    Ok(text)
}

// ---- Replies -------------------------------------------------------------------------------

/// One generated token's log probability and its most likely alternatives.
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f64,
    /// `(token, bytes, logprob)`, most likely first.
    pub top: Vec<(String, Vec<u8>, f64)>,
}

/// Token counts of a reply.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub prompt: usize,
    pub completion: usize,
    pub cached: usize,
}

/// What every reply and chunk carries.
pub struct Meta<'a> {
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
}

/// A log probability as JSON: OpenAI writes -9999 for a token of probability 0.
fn lp(v: f64) -> Json {
    Json::float(if v.is_finite() { v } else { -9999.0 })
}

fn bytes_json(b: &[u8]) -> Json {
    Json::Array(b.iter().map(|&x| Json::uint(x as u64)).collect())
}

fn usage_json(u: &Usage) -> Json {
    Json::object([
        ("prompt_tokens", Json::uint(u.prompt as u64)),
        ("completion_tokens", Json::uint(u.completion as u64)),
        ("total_tokens", Json::uint((u.prompt + u.completion) as u64)),
        ("prompt_tokens_details", Json::object([("cached_tokens", Json::uint(u.cached as u64))])),
    ])
}

/// The chat shape: `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
fn chat_logprobs(tokens: &[TokenLogprob]) -> Json {
    let content = tokens.iter().map(|t| Json::object([
        ("token", Json::str(t.token.clone())),
        ("logprob", lp(t.logprob)),
        ("bytes", bytes_json(&t.bytes)),
        ("top_logprobs", Json::Array(t.top.iter().map(|(s, b, l)| Json::object([
            ("token", Json::str(s.clone())),
            ("logprob", lp(*l)),
            ("bytes", bytes_json(b)),
        ])).collect())),
    ])).collect();
    Json::object([("content", Json::Array(content)), ("refusal", Json::Null)])
}

/// The legacy shape: parallel lists of tokens, their log probabilities, the alternatives (an
/// object per token) and each token's offset in the text.
fn legacy_logprobs(tokens: &[TokenLogprob], mut offset: usize) -> Json {
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        offsets.push(Json::uint(offset as u64));
        offset += t.token.len();
    }
    Json::object([
        ("tokens", Json::Array(tokens.iter().map(|t| Json::str(t.token.clone())).collect())),
        ("token_logprobs", Json::Array(tokens.iter().map(|t| lp(t.logprob)).collect())),
        ("top_logprobs", Json::Array(tokens.iter().map(|t| Json::object(t.top.iter().map(|(s, _, l)| (s.clone(), lp(*l))))).collect())),
        ("text_offset", Json::Array(offsets)),
    ])
}

fn head(m: &Meta, object: &str) -> Vec<(String, Json)> {
    vec![
        ("id".into(), Json::str(m.id)),
        ("object".into(), Json::str(object)),
        ("created".into(), Json::uint(m.created)),
        ("model".into(), Json::str(m.model)),
        ("system_fingerprint".into(), Json::str(FINGERPRINT)),
    ]
}

/// A whole reply (not streamed).
pub fn reply(endpoint: Endpoint, m: &Meta, text: &str, finish: &str, logprobs: Option<&[TokenLogprob]>, usage: &Usage) -> String {
    let mut doc = head(m, if endpoint == Endpoint::Chat { "chat.completion" } else { "text_completion" });
    let choice = match endpoint {
        Endpoint::Chat => Json::object([
            ("index", Json::uint(0)),
            ("message", Json::object([("role", Json::str("assistant")), ("content", Json::str(text)), ("refusal", Json::Null)])),
            ("logprobs", logprobs.map_or(Json::Null, chat_logprobs)),
            ("finish_reason", Json::str(finish)),
        ]),
        Endpoint::Completion => Json::object([
            ("text", Json::str(text)),
            ("index", Json::uint(0)),
            ("logprobs", logprobs.map_or(Json::Null, |l| legacy_logprobs(l, 0))),
            ("finish_reason", Json::str(finish)),
        ]),
    };
    doc.push(("choices".into(), Json::Array(vec![choice])));
    doc.push(("usage".into(), usage_json(usage)));
    Json::Object(doc).to_string_compact()
}

/// One streamed chunk. For chat, `role` goes in the first chunk's delta; `text` is the delta's
/// content (absent when `None`). `offset` is the text's position in the whole reply (legacy
/// logprobs report it).
pub struct Chunk<'a> {
    pub role: bool,
    pub text: Option<&'a str>,
    pub finish: Option<&'a str>,
    pub logprobs: Option<&'a [TokenLogprob]>,
    pub offset: usize,
}

pub fn chunk(endpoint: Endpoint, m: &Meta, c: &Chunk) -> String {
    let mut doc = head(m, if endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" });
    let finish = c.finish.map_or(Json::Null, Json::str);
    let choice = match endpoint {
        Endpoint::Chat => {
            let mut delta = Vec::new();
            if c.role {
                delta.push(("role", Json::str("assistant")));
            }
            if let Some(t) = c.text {
                delta.push(("content", Json::str(t)));
            }
            Json::object([
                ("index", Json::uint(0)),
                ("delta", Json::object(delta)),
                ("logprobs", c.logprobs.map_or(Json::Null, chat_logprobs)),
                ("finish_reason", finish),
            ])
        }
        Endpoint::Completion => Json::object([
            ("text", Json::str(c.text.unwrap_or(""))),
            ("index", Json::uint(0)),
            ("logprobs", c.logprobs.map_or(Json::Null, |l| legacy_logprobs(l, c.offset))),
            ("finish_reason", finish),
        ]),
    };
    doc.push(("choices".into(), Json::Array(vec![choice])));
    Json::Object(doc).to_string_compact()
}

/// The last chunk of a stream asked for with `stream_options.include_usage`: no choices, the
/// usage.
pub fn usage_chunk(endpoint: Endpoint, m: &Meta, usage: &Usage) -> String {
    let mut doc = head(m, if endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" });
    doc.push(("choices".into(), Json::Array(Vec::new())));
    doc.push(("usage".into(), usage_json(usage)));
    Json::Object(doc).to_string_compact()
}

/// `GET /v1/models` (the list) or `GET /v1/models/{id}` (one).
pub fn model_json(alias: &str, created: u64) -> Json {
    Json::object([("id", Json::str(alias)), ("object", Json::str("model")), ("created", Json::uint(created)), ("owned_by", Json::str("waste"))])
}

pub fn models_list(alias: &str, created: u64) -> String {
    Json::object([("object", Json::str("list")), ("data", Json::Array(vec![model_json(alias, created)]))]).to_string_compact()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(endpoint: Endpoint, body: &str) -> Result<Request, ApiError> {
        parse_request(endpoint, &parse_body(body.as_bytes())?, 7)
    }

    #[test]
    fn a_chat_request_is_checked_and_normalized() {
        let r = req(Endpoint::Chat, r#"{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"user","content":"hi","name":"x"}],"max_completion_tokens":5,"max_tokens":9,"temperature":0,"stop":"\n",
            "stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3,"user":"u","unknown":[1]}"#).unwrap();
        let Prompt::Messages(m) = &r.prompt else { panic!() };
        assert_eq!(m.to_string_compact(), r#"[{"role":"system","content":"a\nb"},{"role":"user","content":"hi","name":"x"}]"#);
        assert_eq!((r.max_tokens, r.stop.as_slice(), r.stream, r.include_usage, r.logprobs), (Some(5), &["\n".to_string()][..], true, true, Some(3)));
        assert_eq!((r.sampling.temperature, r.sampling.seed), (0.0, 7));
        let c = req(Endpoint::Completion, r#"{"prompt":[1,2,3],"seed":-1,"logprobs":2}"#).unwrap();
        assert!(matches!(c.prompt, Prompt::Ids(ref v) if v == &[1, 2, 3]));
        assert_eq!((c.max_tokens, c.sampling.seed, c.logprobs), (Some(16), u64::MAX, Some(2)));
    }

    #[test]
    fn bad_parameters_are_named() {
        for (body, param) in [
            (r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#, "n"),
            (r#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#, "temperature"),
            (r#"{"messages":[{"role":"user","content":"x"}],"temperature":3}"#, "temperature"),
            (r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#, "max_tokens"),
            (r#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#, "top_logprobs"),
            (r#"{"messages":[{"role":"user","content":"x"}],"stop":[1]}"#, "stop"),
            (r#"{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#, "stream_options"),
            (r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#, "tools"),
            (r#"{"messages":[{"role":"user","content":"x"}],"presence_penalty":0.5}"#, "presence_penalty"),
            (r#"{"messages":[{"role":"wizard","content":"x"}]}"#, "messages[0].role"),
            (r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#, "messages[0].content"),
            (r#"{"messages":[]}"#, "messages"),
            (r#"{}"#, "messages"),
        ] {
            let e = req(Endpoint::Chat, body).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}: {}", e.message);
        }
        for body in [r#"{"prompt":["a","b"]}"#, r#"{"prompt":[-1]}"#, r#"{"prompt":"x","echo":true}"#] {
            assert_eq!(req(Endpoint::Completion, body).unwrap_err().status, 400, "{body}");
        }
    }

    #[test]
    fn bodies_are_bounded_before_parsing() {
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(parse_body(deep.as_bytes()).unwrap_err().message.contains("nested"));
        let wide = format!("[{}0]", "0,".repeat(MAX_VALUES));
        assert!(parse_body(wide.as_bytes()).unwrap_err().message.contains("values"));
        assert!(parse_body(br#"{"a":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"[["}"#).is_ok(), "brackets in strings do not count");
        assert!(parse_body(b"{\"a\":\"\xff\"}").unwrap_err().message.contains("UTF-8"));
        assert!(parse_body(b"").is_err());
        let e = ApiError::param("n", "no");
        assert_eq!(e.to_json(), r#"{"error":{"message":"no","type":"invalid_request_error","param":"n","code":null}}"#);
    }
}
