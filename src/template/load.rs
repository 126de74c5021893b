//! Finding a chat template and its special tokens: in a model directory, in a file, or among
//! the two built-ins written here.

use super::ChatTemplate;
use crate::error::{Error, ErrorKind, Result};
use crate::format::json::{self, Json};
use std::path::Path;

/// The special-token variables transformers passes to a template (when not null).
pub const NAMED_SPECIAL_TOKENS: [&str; 7] = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// Template and config files are at most this large. They are read beside a loaded model, so a
/// JSON one is parsed within [`json::Limits::small`] and a Jinja one is held to 4 MiB (the
/// largest published templates are tens of KiB): neither adds more than that to the budget.
const MAX_FILE: u64 = 64 << 20;
const MAX_TEMPLATE_TEXT: u64 = 4 << 20;

/// ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message. Content given as a list of
/// parts contributes its text parts.
const CHATML: &str = "\
{%- for message in messages -%}
    {%- set content = message.content if message.content is string
        else (message.content or []) | selectattr('type', 'equalto', 'text') | map(attribute='text') | join -%}
    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
";

/// Llama 3: `<|begin_of_text|>`, then `<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>`
/// per message with the content trimmed.
const LLAMA3: &str = "\
{{- '<|begin_of_text|>' -}}
{%- for message in messages -%}
    {%- set content = message.content if message.content is string
        else (message.content or []) | selectattr('type', 'equalto', 'text') | map(attribute='text') | join -%}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + content | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
{%- endif -%}
";

pub fn builtin(name: &str) -> Result<ChatTemplate> {
    let (source, eot) = match name {
        "chatml" => (CHATML, "<|im_end|>"),
        "llama3" => (LLAMA3, "<|eot_id|>"),
        _ => return Err(Error::arg(format!("no built-in chat template `{name}` (there are: chatml, llama3)"))),
    };
    let mut t = ChatTemplate::parse(name, source, Vec::new())?;
    t.end_of_turn = Some(eot.to_string());
    t.builtin = true;
    Ok(t)
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = crate::format::read_bounded(path, MAX_TEMPLATE_TEXT)?;
    String::from_utf8(bytes).map_err(|e| Error::format(path, format!("not UTF-8 text: {e}")))
}

fn read_json(path: &Path) -> Result<Json> {
    let limits = json::Limits::small();
    let bytes = crate::format::read_bounded_within(path, MAX_FILE, &limits)?;
    json::parse_limited(&bytes, &limits).map_err(|e| {
        let line = bytes[..e.offset.min(bytes.len())].iter().filter(|&&b| b == b'\n').count() + 1;
        Error::format(path, format!("line {line}: {e}"))
    })
}

/// The named special tokens of a `tokenizer_config.json`: a string, or an AddedToken object's
/// `content`; null or absent tokens are left out.
fn special_tokens_of(cfg: &Json, path: &Path) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for name in NAMED_SPECIAL_TOKENS {
        let text = match cfg.get(name) {
            None | Some(Json::Null) => continue,
            Some(Json::String(s)) => s.clone(),
            Some(obj @ Json::Object(_)) => match obj.get("content") {
                Some(Json::String(s)) => s.clone(),
                _ => return Err(Error::config(path, name, "an AddedToken object without a string `content`")),
            },
            Some(other) => return Err(Error::config(path, name, format!("expected a string or an AddedToken object, got {}", other.type_name()))),
        };
        out.push((name.to_string(), text));
    }
    Ok(out)
}

/// The `chat_template` field: a string, or a list of `{"name", "template"}` of which `name`
/// (default "default") is taken. `Ok(None)` when the field is absent or null.
fn template_field(cfg: &Json, path: &Path, name: Option<&str>) -> Result<Option<String>> {
    let want = name.unwrap_or("default");
    match cfg.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) if want == "default" => Ok(Some(s.clone())),
        Some(Json::String(_)) => Err(Error::config(path, "chat_template", format!("holds one template, so there is no template named `{want}`"))),
        Some(Json::Array(list)) => {
            let mut names = Vec::new();
            for entry in list {
                let (Some(n), Some(t)) = (entry.get("name").and_then(Json::as_str), entry.get("template").and_then(Json::as_str)) else {
                    return Err(Error::config(path, "chat_template", "a list entry without string `name` and `template`"));
                };
                if n == want {
                    return Ok(Some(t.to_string()));
                }
                names.push(n.to_string());
            }
            Err(Error::config(path, "chat_template", format!("no template named `{want}` (there are: {})", names.join(", "))))
        }
        Some(other) => Err(Error::config(path, "chat_template", format!("expected a string or a list of named templates, got {}", other.type_name()))),
    }
}

/// The named special tokens of a model directory's `tokenizer_config.json` (none without one).
pub fn special_tokens_in_dir(dir: &Path) -> Result<Vec<(String, String)>> {
    let path = dir.join("tokenizer_config.json");
    if !path.is_file() {
        return Ok(Vec::new());
    }
    special_tokens_of(&read_json(&path)?, &path)
}

pub fn from_model_dir(dir: &Path, name: Option<&str>) -> Result<Option<ChatTemplate>> {
    let config_path = dir.join("tokenizer_config.json");
    let config = if config_path.is_file() { Some(read_json(&config_path)?) } else { None };
    let specials = match &config {
        Some(c) => special_tokens_of(c, &config_path)?,
        None => Vec::new(),
    };
    if let Some(n) = name.filter(|n| *n != "default") {
        let extra = dir.join("additional_chat_templates").join(format!("{n}.jinja"));
        if extra.is_file() {
            return ChatTemplate::parse(&extra.display().to_string(), &read_text(&extra)?, specials).map(Some);
        }
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() && name.is_none_or(|n| n == "default") {
        return ChatTemplate::parse(&jinja.display().to_string(), &read_text(&jinja)?, specials).map(Some);
    }
    let json_path = dir.join("chat_template.json");
    if json_path.is_file() {
        if let Some(src) = template_field(&read_json(&json_path)?, &json_path, name)? {
            return ChatTemplate::parse(&json_path.display().to_string(), &src, specials).map(Some);
        }
    }
    if let Some(cfg) = &config {
        if let Some(src) = template_field(cfg, &config_path, name)? {
            return ChatTemplate::parse(&config_path.display().to_string(), &src, specials).map(Some);
        }
    }
    if let Some(n) = name.filter(|n| *n != "default") {
        return Err(Error::new(ErrorKind::Template, format!("{}: no chat template named `{n}`", dir.display())));
    }
    Ok(None)
}

pub fn from_file(path: &Path, name: Option<&str>) -> Result<ChatTemplate> {
    let sibling = path.parent().map(|d| d.join("tokenizer_config.json")).filter(|p| p.is_file() && p.as_path() != path);
    let sibling_specials = || -> Result<Vec<(String, String)>> {
        match &sibling {
            Some(p) => special_tokens_of(&read_json(p)?, p),
            None => Ok(Vec::new()),
        }
    };
    let shown = path.display().to_string();
    if path.extension().is_some_and(|e| e == "json") {
        let cfg = read_json(path)?;
        let src = template_field(&cfg, path, name)?.ok_or_else(|| {
            Error::config(path, "chat_template", "missing (this file holds no chat template)")
        })?;
        let mut specials = special_tokens_of(&cfg, path)?;
        if specials.is_empty() {
            specials = sibling_specials()?;
        }
        return ChatTemplate::parse(&shown, &src, specials);
    }
    if name.is_some_and(|n| n != "default") {
        return Err(Error::arg(format!("{shown}: a Jinja file holds one template; no template named `{}`", name.unwrap_or(""))));
    }
    ChatTemplate::parse(&shown, &read_text(path)?, sibling_specials()?)
}
