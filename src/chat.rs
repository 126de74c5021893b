//! Chat: a model's own chat template, a conversation rendered to tokens with markup and content
//! kept apart, and the tokens that end an assistant's turn. What `waste chat` and `waste serve`
//! build their turns from.

use crate::error::{Error, Result};
use crate::format::json::Json;
use crate::template::{ChatTemplate, RenderOptions};
use crate::Model;
use std::path::Path;

/// The chat template the model directory `dir` ships, with its special tokens; a directory
/// without one is refused with a [`crate::ErrorKind::Config`] error naming the missing field
/// (`chat_template` in `tokenizer_config.json`) and the choice a host has instead:
/// [`ChatTemplate::builtin`] (`chatml`, `llama3`) or [`ChatTemplate::from_file`].
pub fn model_chat_template(dir: &Path) -> Result<ChatTemplate> {
    ChatTemplate::from_model_dir(dir, None)?.ok_or_else(|| Error::config(&dir.join("tokenizer_config.json"), "chat_template",
        "missing (and there is no chat_template.jinja or chat_template.json): this model ships no chat template; \
choose one with --template chatml|llama3|FILE"))
}

impl Model {
    /// The chat template the checkpoint ships (`chat_template.jinja`, `chat_template.json`, or
    /// `tokenizer_config.json`'s `chat_template`), with its special tokens; an error naming the
    /// missing field when it ships none ([`model_chat_template`]).
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        model_chat_template(self.path())
    }

    /// `template` (a built-in or one read from a file) with this model's special tokens
    /// (`bos_token`, `eos_token`, … from its `tokenizer_config.json`), as transformers would
    /// pass them.
    pub fn with_special_tokens(&self, template: ChatTemplate) -> Result<ChatTemplate> {
        Ok(template.with_special_tokens(crate::template::special_tokens_in_dir(self.path())?))
    }

    /// `messages` (an OpenAI-style list of `{"role", "content"}`) rendered with `template` and
    /// tokenized: special-token strings become control tokens only where the template wrote
    /// them, never where a message's content holds them.
    pub fn chat_tokens(&self, template: &ChatTemplate, messages: &Json, opts: &RenderOptions) -> Result<Vec<u32>> {
        let pieces = template.render(messages, opts)?;
        Ok(self.tokenizer()?.tokenize_pieces(&pieces))
    }

    /// The tokens that end an assistant's turn under `template`: its end-of-turn token (when
    /// the tokenizer has it as a special token) and the model's end-of-sequence tokens
    /// (`config.json`, `generation_config.json`'s `eos_token_id`, the tokenizer's).
    pub fn end_of_turn_tokens(&self, template: &ChatTemplate) -> Vec<u32> {
        let mut ids = self.eos_tokens().to_vec();
        if let (Some(eot), Ok(tok)) = (template.end_of_turn(), self.tokenizer()) {
            ids.extend(tok.special_tokens().into_iter().filter(|(s, _)| s == eot).map(|(_, id)| id));
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}
