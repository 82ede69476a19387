//! Chat: turning a conversation into the model's prompt (its own Jinja template, or a built-in
//! one chosen from the vocabulary's turn markers) and turning generated text back into content,
//! reasoning and tool calls (per-dialect incremental parsers).

pub mod builtin;
pub mod gemma4_args;
pub mod parse;
pub mod pyjson;
pub mod source;
pub mod template;

use serde_json::{Map, Value};

pub use parse::{OutputMarkers, OutputParser, ParsedEvent, ParsedToolCall, ToolSyntax};
pub use template::{ChatTemplate, RenderInput};

use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChatError {
    /// The template failed to compile or render (including `raise_exception`).
    #[error("chat template: {0}")]
    Template(String),
    /// The request cannot be expressed in this dialect.
    #[error("{0}")]
    Invalid(String),
}

/// A chat dialect: turn markers, thinking markers and tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Gemma3,
    Gemma4,
    /// Qwen ChatML (`<|im_start|>`), `<think>`, `<tool_call>` (JSON or Qwen3-Coder XML).
    Qwen,
}

impl Dialect {
    /// Pick the dialect from the vocabulary's turn markers.
    pub fn detect(tok: &Tokenizer) -> Option<Dialect> {
        if tok.token_to_id("<|turn>").is_some() {
            Some(Dialect::Gemma4)
        } else if tok.token_to_id("<start_of_turn>").is_some() {
            Some(Dialect::Gemma3)
        } else if tok.token_to_id("<|im_start|>").is_some() {
            Some(Dialect::Qwen)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dialect::Gemma3 => "gemma3",
            Dialect::Gemma4 => "gemma4",
            Dialect::Qwen => "chatml",
        }
    }

    pub fn builtin_template(self) -> &'static str {
        match self {
            Dialect::Gemma3 => builtin::GEMMA3,
            Dialect::Gemma4 => builtin::GEMMA4,
            Dialect::Qwen => builtin::CHATML,
        }
    }

    pub fn markers(self) -> OutputMarkers {
        match self {
            Dialect::Gemma3 => OutputMarkers {
                think_open: None,
                think_close: None,
                tool_open: None,
                tool_close: None,
                tool_syntax: ToolSyntax::Qwen,
            },
            Dialect::Gemma4 => OutputMarkers {
                think_open: Some("<|channel>thought"),
                think_close: Some("<channel|>"),
                tool_open: Some("<|tool_call>"),
                tool_close: Some("<tool_call|>"),
                tool_syntax: ToolSyntax::Gemma4,
            },
            Dialect::Qwen => OutputMarkers {
                think_open: Some("<think>"),
                think_close: Some("</think>"),
                tool_open: Some("<tool_call>"),
                tool_close: Some("</tool_call>"),
                tool_syntax: ToolSyntax::Qwen,
            },
        }
    }

    /// Token sequences that end an assistant turn besides the tokenizer's EOS.
    pub fn end_of_turn(self) -> &'static [&'static str] {
        match self {
            Dialect::Gemma3 => &["<end_of_turn>"],
            Dialect::Gemma4 => &["<turn|>"],
            Dialect::Qwen => &["<|im_end|>"],
        }
    }
}

/// How the request wants tools used.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    Required,
    Function(String),
}

/// A conversation to render.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    pub messages: Vec<Value>,
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    /// `Some(true/false)` when the request chose; `None` leaves the template's default.
    pub enable_thinking: Option<bool>,
    /// `chat_template_kwargs` and similar extras, passed to the template as variables.
    pub kwargs: Map<String, Value>,
}

/// The rendered prompt plus how to parse what the model writes next.
#[derive(Debug, Clone)]
pub struct RenderedPrompt {
    /// The prompt text; where the caller's text held control-token strings, they carry
    /// `mark` (tokenize with [`RenderedPrompt::encode`], not the bare text).
    pub text: String,
    /// The mark inside the caller's control-token strings (`Tokenizer::mark_text`), if any.
    pub mark: Option<char>,
    /// The prompt ends inside an open thinking block.
    pub in_reasoning: bool,
    /// Parse tool calls in the output.
    pub parse_tools: bool,
    /// Text appended to the prompt to force a tool call (fed to the parser with `prime`).
    pub forced_prefix: Option<String>,
}

impl RenderedPrompt {
    /// The prompt's token ids: the template's markup as control tokens, the caller's text as
    /// text (`Tokenizer::encode_marked`).
    pub fn encode(&self, tok: &Tokenizer) -> Result<Vec<u32>, crate::tokenizer::TokenizerError> {
        match self.mark {
            Some(m) => tok.encode_marked(&self.text, m, false),
            None => tok.encode(&self.text, false),
        }
    }
}

/// A dialect plus the template that renders it.
#[derive(Clone)]
pub struct ChatFormat {
    pub dialect: Dialect,
    template: ChatTemplate,
    tool_template: Option<ChatTemplate>,
    /// True when the checkpoint's own template is used (false: built-in).
    pub model_template: bool,
    /// The tokenizer whose control tokens the caller's text may not produce (None: the text is
    /// rendered as it is, and the control-token strings in it become control tokens: the
    /// `--special-in-content` opt-out).
    guard: Option<Tokenizer>,
}

impl std::fmt::Debug for ChatFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatFormat")
            .field("dialect", &self.dialect)
            .field("model_template", &self.model_template)
            .field("content_as_text", &self.guard.is_some())
            .finish()
    }
}

impl ChatFormat {
    /// Build from an optional model template; falls back to the dialect's built-in one.
    pub fn new(
        dialect: Dialect,
        files: source::TemplateFiles,
        mut special: Map<String, Value>,
    ) -> Result<Self, ChatError> {
        for (k, v) in files.special {
            special.insert(k, v);
        }
        let model_template = files.source.is_some();
        let src = files
            .source
            .unwrap_or_else(|| dialect.builtin_template().to_string());
        let template = ChatTemplate::new(&src, special.clone())?;
        let tool_template = match files.tool_use {
            Some(t) => Some(ChatTemplate::new(&t, special)?),
            None => None,
        };
        Ok(Self {
            dialect,
            template,
            tool_template,
            model_template,
            guard: None,
        })
    }

    /// The same format keeping the caller's text text (see [`ChatFormat::guard`]'s field doc):
    /// every control-token string of `tok` in message content, names, tool calls, tool results,
    /// tool definitions and template variables is tokenized as ordinary text (assistant turns
    /// keep the dialect's thinking markers, which templates strip from history).
    pub fn with_text_guard(mut self, tok: &Tokenizer) -> Self {
        // built now (a Gemma vocabulary takes a second or two), not at the first request; an
        // error shows again there
        let _ = tok.mark_text("", '\u{FDD0}', &[]);
        self.guard = Some(tok.clone());
        self
    }

    /// Special-token variables (`bos_token`, `eos_token`) taken from a tokenizer.
    pub fn special_from_tokenizer(tok: &Tokenizer) -> Map<String, Value> {
        let mut m = Map::new();
        let name = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i));
        if let Some(b) = name(tok.special.bos) {
            m.insert("bos_token".into(), b.into());
        }
        if let Some(e) = name(tok.special.eos.first().copied()) {
            m.insert("eos_token".into(), e.into());
        }
        if let Some(p) = name(tok.special.pad) {
            m.insert("pad_token".into(), p.into());
        }
        m
    }

    pub fn render(&self, req: &ChatRequest) -> Result<RenderedPrompt, ChatError> {
        if req.messages.is_empty() {
            return Err(ChatError::Invalid("messages must not be empty".into()));
        }
        let use_tools = !req.tools.is_empty() && req.tool_choice != ToolChoice::None;
        if let ToolChoice::Function(name) = &req.tool_choice {
            let known = req.tools.iter().any(|t| {
                t.get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(|n| n.as_str())
                    == Some(name)
            });
            if !known {
                return Err(ChatError::Invalid(format!(
                    "tool_choice names function '{name}', which is not in tools"
                )));
            }
        }
        if use_tools && self.dialect == Dialect::Gemma3 && !self.model_template {
            return Err(ChatError::Invalid(
                "this model's chat format (Gemma 3) has no tool-calling syntax".into(),
            ));
        }
        let mut kwargs = req.kwargs.clone();
        let mut messages: Vec<Value> = req.messages.iter().map(normalize_message).collect();
        let mut tools = use_tools.then(|| req.tools.clone());
        let mark = match &self.guard {
            Some(tok) => self.mark_caller_text(tok, &mut messages, &mut tools, &mut kwargs)?,
            None => None,
        };
        if let Some(t) = req.enable_thinking {
            kwargs.insert("enable_thinking".into(), t.into());
        }
        let input = RenderInput {
            messages,
            tools,
            add_generation_prompt: true,
            kwargs,
        };
        let tmpl = match (&self.tool_template, use_tools) {
            (Some(t), true) => t,
            _ => &self.template,
        };
        let mut text = tmpl.render(&input)?;
        let m = self.dialect.markers();
        let forced_prefix = match (&req.tool_choice, use_tools) {
            (ToolChoice::Required, true) => Some(match self.dialect {
                Dialect::Gemma4 => "<|tool_call>call:".to_string(),
                _ => "<tool_call>\n".to_string(),
            }),
            (ToolChoice::Function(name), true) => Some(match self.dialect {
                Dialect::Gemma4 => format!("<|tool_call>call:{name}{{"),
                _ => format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": "),
            }),
            _ => None,
        };
        let in_reasoning = forced_prefix.is_none()
            && match (m.think_open, m.think_close) {
                (Some(o), Some(c)) => {
                    text.rfind(o).map(|p| p as i64).unwrap_or(-1)
                        > text.rfind(c).map(|p| p as i64).unwrap_or(-1)
                }
                _ => false,
            };
        if let Some(p) = &forced_prefix {
            text.push_str(p);
        }
        Ok(RenderedPrompt {
            text,
            mark,
            in_reasoning,
            parse_tools: use_tools,
            forced_prefix,
        })
    }

    /// A parser for the output of a prompt rendered by [`ChatFormat::render`].
    pub fn parser(&self, rendered: &RenderedPrompt, tools: &[Value]) -> OutputParser {
        let mut p = OutputParser::new(
            self.dialect.markers(),
            rendered.parse_tools,
            rendered.in_reasoning,
            tools,
        );
        if let Some(pre) = &rendered.forced_prefix {
            p.prime(pre);
        }
        p
    }
}

impl ChatFormat {
    /// Mark the control-token strings of every string the caller wrote (`Tokenizer::mark_text`)
    /// with a mark none of them, nor the template, holds. Returns the mark (None when nothing
    /// needed one).
    fn mark_caller_text(
        &self,
        tok: &Tokenizer,
        messages: &mut [Value],
        tools: &mut Option<Vec<Value>>,
        kwargs: &mut Map<String, Value>,
    ) -> Result<Option<char>, ChatError> {
        let mut strings: Vec<String> = vec![self.template.source().to_string()];
        if let Some(t) = &self.tool_template {
            strings.push(t.source().to_string());
        }
        let collect = |v: &Value, out: &mut Vec<String>| {
            walk_strings_ref(v, &mut |s| out.push(s.to_string()))
        };
        for m in messages.iter() {
            collect(m, &mut strings);
        }
        for t in tools.iter().flatten() {
            collect(t, &mut strings);
        }
        for v in kwargs.values() {
            collect(v, &mut strings);
        }
        let mark = tok
            .pick_mark(strings.iter().map(String::as_str))
            .ok_or_else(|| ChatError::Invalid("the request holds every noncharacter".into()))?;
        let m = self.dialect.markers();
        let think: Vec<&str> = [m.think_open, m.think_close]
            .into_iter()
            .flatten()
            .collect();
        let mut used = false;
        let mut mark_all = |v: &mut Value, keep: &[&str]| -> Result<(), ChatError> {
            walk_strings(v, &mut |s| {
                let marked = tok
                    .mark_text(s, mark, keep)
                    .map_err(|e| ChatError::Invalid(e.to_string()))?;
                if marked.len() != s.len() {
                    used = true;
                    *s = marked;
                }
                Ok(())
            })
        };
        for msg in messages.iter_mut() {
            let assistant = msg.get("role").and_then(Value::as_str) == Some("assistant");
            mark_all(msg, if assistant { &think } else { &[] })?;
        }
        for t in tools.iter_mut().flatten() {
            mark_all(t, &[])?;
        }
        for v in kwargs.values_mut() {
            mark_all(v, &[])?;
        }
        Ok(used.then_some(mark))
    }
}

/// Every string in `v` (object values and array items, recursively; keys are not text).
fn walk_strings(
    v: &mut Value,
    f: &mut dyn FnMut(&mut String) -> Result<(), ChatError>,
) -> Result<(), ChatError> {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter_mut().try_for_each(|x| walk_strings(x, f)),
        Value::Object(o) => o.values_mut().try_for_each(|x| walk_strings(x, f)),
        _ => Ok(()),
    }
}

fn walk_strings_ref(v: &Value, f: &mut dyn FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter().for_each(|x| walk_strings_ref(x, f)),
        Value::Object(o) => o.values().for_each(|x| walk_strings_ref(x, f)),
        _ => {}
    }
}

/// OpenAI messages as templates expect them: tool-call `arguments` strings parsed into objects
/// (as vLLM and transformers' own tool-use examples pass them).
fn normalize_message(m: &Value) -> Value {
    let mut m = m.clone();
    if let Some(calls) = m.get_mut("tool_calls").and_then(|c| c.as_array_mut()) {
        for c in calls {
            if let Some(f) = c.get_mut("function") {
                if let Some(Value::String(s)) = f.get("arguments") {
                    if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
                        f["arguments"] = v;
                    }
                }
            }
        }
    }
    m
}
