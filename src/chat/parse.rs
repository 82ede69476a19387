//! Incremental parsing of generated text into content, reasoning and tool calls.
//!
//! Streaming-safe: text that might be the start of a marker (`<tool_call>`, `</think>`, ...) is
//! held back until decided, so partial markup never reaches a content delta. A tool call is
//! reported once its closing marker arrives (or at the end of generation), with its arguments
//! as a JSON string.

use std::collections::HashMap;

use serde_json::Value;

use super::gemma4_args;
use crate::engine::stop::longest_suffix_prefix;

/// How tool-call bodies are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// Inside `<tool_call>`: Qwen3-Coder XML (`<function=NAME><parameter=K>V</parameter>`) or
    /// Qwen's JSON (`{"name": ..., "arguments": {...}}`), whichever the body is.
    Qwen,
    /// `<|tool_call>call:NAME{k:<|"|>v<|"|>}<tool_call|>`.
    Gemma4,
}

/// The markers of one chat dialect's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputMarkers {
    pub think_open: Option<&'static str>,
    pub think_close: Option<&'static str>,
    pub tool_open: Option<&'static str>,
    pub tool_close: Option<&'static str>,
    pub tool_syntax: ToolSyntax,
}

/// `evs` without `tokenizer::OUTPUT_MARK` in their text.
fn unmarked(evs: Vec<ParsedEvent>) -> Vec<ParsedEvent> {
    use crate::tokenizer::strip_output_mark as s;
    evs.into_iter()
        .map(|e| match e {
            ParsedEvent::Content(t) => ParsedEvent::Content(s(&t).into_owned()),
            ParsedEvent::Reasoning(t) => ParsedEvent::Reasoning(s(&t).into_owned()),
            ParsedEvent::ToolCall(c) => ParsedEvent::ToolCall(ParsedToolCall {
                name: s(&c.name).into_owned(),
                arguments: s(&c.arguments).into_owned(),
                ..c
            }),
        })
        .collect()
}

/// One parsed piece of output.
#[derive(Debug, Clone, PartialEq)]
pub enum ParsedEvent {
    Content(String),
    Reasoning(String),
    ToolCall(ParsedToolCall),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParsedToolCall {
    pub index: usize,
    pub name: String,
    /// JSON object text.
    pub arguments: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Content,
    Reasoning,
    Tool,
}

pub struct OutputParser {
    m: OutputMarkers,
    tools: bool,
    /// Parameter schemas by tool name (Qwen3-Coder XML values are typed by them).
    schemas: HashMap<String, Value>,
    state: State,
    buf: String,
    calls: usize,
    /// Strip leading newlines of the next piece (after `<think>` / `</think>`).
    strip_lead: bool,
}

impl OutputParser {
    /// `tools`: parse tool calls (off when the request has no tools). `in_reasoning`: the
    /// prompt left a thinking block open. `tool_defs`: OpenAI tool definitions.
    pub fn new(m: OutputMarkers, tools: bool, in_reasoning: bool, tool_defs: &[Value]) -> Self {
        let schemas = tool_defs
            .iter()
            .filter_map(|t| {
                let f = t.get("function").unwrap_or(t);
                let name = f.get("name")?.as_str()?.to_string();
                let params = f
                    .get("parameters")
                    .or_else(|| f.get("input_schema"))
                    .cloned()?;
                Some((name, params))
            })
            .collect();
        let state = if in_reasoning && m.think_close.is_some() {
            State::Reasoning
        } else {
            State::Content
        };
        Self {
            m,
            tools,
            schemas,
            state,
            buf: String::new(),
            calls: 0,
            strip_lead: in_reasoning,
        }
    }

    /// Feed text the prompt already contains (a forced tool-call prefix): it changes the state
    /// but produces no events.
    pub fn prime(&mut self, text: &str) {
        let _ = self.feed(text);
    }

    /// Generated text in order (as the engine emits it: a marker the model wrote as ordinary
    /// tokens carries `tokenizer::OUTPUT_MARK`, so it is no marker here; the events come back
    /// without the mark).
    pub fn feed(&mut self, text: &str) -> Vec<ParsedEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            let progressed = match self.state {
                State::Content => self.step_content(&mut out),
                State::Reasoning => self.step_reasoning(&mut out),
                State::Tool => self.step_tool(&mut out),
            };
            if !progressed {
                return unmarked(out);
            }
        }
    }

    /// End of generation: release everything held.
    pub fn finish(&mut self) -> Vec<ParsedEvent> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Content => self.content(&rest, &mut out),
            State::Reasoning => {
                let r = rest.trim_end_matches('\n');
                if !r.is_empty() {
                    out.push(ParsedEvent::Reasoning(r.to_string()));
                }
            }
            State::Tool => self.tool_body(&rest, false, &mut out),
        }
        self.state = State::Content;
        unmarked(out)
    }

    /// Number of tool calls reported so far.
    pub fn tool_calls(&self) -> usize {
        self.calls
    }

    fn step_content(&mut self, out: &mut Vec<ParsedEvent>) -> bool {
        let mut watch: Vec<(&'static str, State)> = Vec::new();
        if let Some(o) = self.m.think_open {
            watch.push((o, State::Reasoning));
        }
        if let Some(c) = self.m.think_close {
            watch.push((c, State::Content)); // a stray close: swallow it
        }
        if self.tools {
            if let Some(o) = self.m.tool_open {
                watch.push((o, State::Tool));
            }
        }
        let hit = watch
            .iter()
            .filter_map(|&(mk, st)| self.buf.find(mk).map(|p| (p, mk, st)))
            .min_by_key(|&(p, mk, _)| (p, usize::MAX - mk.len()));
        if let Some((pos, mk, st)) = hit {
            let before: String = self.buf.drain(..pos + mk.len()).collect();
            self.content(&before[..pos], out);
            self.state = st;
            self.strip_lead = st != State::Tool;
            return true;
        }
        let keep = watch
            .iter()
            .map(|(mk, _)| longest_suffix_prefix(&self.buf, mk))
            .max()
            .unwrap_or(0);
        let cut = self.buf.len() - keep;
        let text: String = self.buf.drain(..cut).collect();
        self.content(&text, out);
        false
    }

    fn step_reasoning(&mut self, out: &mut Vec<ParsedEvent>) -> bool {
        let close = self.m.think_close.unwrap_or("</think>");
        if let Some(pos) = self.buf.find(close) {
            let before: String = self.buf.drain(..pos + close.len()).collect();
            self.reasoning(before[..pos].trim_end_matches('\n'), out);
            self.state = State::Content;
            self.strip_lead = true;
            return true;
        }
        // Hold a partial close marker and trailing newlines (dropped if the close follows).
        let keep = longest_suffix_prefix(&self.buf, close);
        let body_end = self.buf.len() - keep;
        let body_end = self.buf[..body_end].trim_end_matches('\n').len();
        let text: String = self.buf.drain(..body_end).collect();
        self.reasoning(&text, out);
        false
    }

    fn step_tool(&mut self, out: &mut Vec<ParsedEvent>) -> bool {
        let close = self.m.tool_close.unwrap_or("</tool_call>");
        match self.buf.find(close) {
            Some(pos) => {
                let body: String = self.buf.drain(..pos + close.len()).collect();
                self.tool_body(&body[..pos], true, out);
                self.state = State::Content;
                self.strip_lead = true;
                true
            }
            None => false,
        }
    }

    fn content(&mut self, text: &str, out: &mut Vec<ParsedEvent>) {
        let mut t = text;
        if self.strip_lead {
            t = t.trim_start_matches('\n');
        }
        // After a tool call, whitespace between calls is not content.
        if self.calls > 0 && t.trim().is_empty() {
            return;
        }
        if !t.is_empty() {
            self.strip_lead = false;
            push_merge(out, ParsedEvent::Content(t.to_string()));
        }
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<ParsedEvent>) {
        let mut t = text;
        if self.strip_lead {
            t = t.trim_start_matches('\n');
        }
        if !t.is_empty() {
            self.strip_lead = false;
            push_merge(out, ParsedEvent::Reasoning(t.to_string()));
        }
    }

    fn tool_body(&mut self, body: &str, closed: bool, out: &mut Vec<ParsedEvent>) {
        let parsed = match self.m.tool_syntax {
            ToolSyntax::Qwen => parse_qwen_body(body, &self.schemas),
            ToolSyntax::Gemma4 => parse_gemma4_body(body),
        };
        match parsed {
            Some((name, args)) => {
                out.push(ParsedEvent::ToolCall(ParsedToolCall {
                    index: self.calls,
                    name,
                    arguments: serde_json::to_string(&args).unwrap_or_else(|_| "{}".into()),
                }));
                self.calls += 1;
            }
            None => {
                // Not a call after all: give the text back verbatim.
                let mut raw = self.m.tool_open.unwrap_or("").to_string();
                raw.push_str(body);
                if closed {
                    raw.push_str(self.m.tool_close.unwrap_or(""));
                }
                push_merge(out, ParsedEvent::Content(raw));
            }
        }
    }
}

fn push_merge(out: &mut Vec<ParsedEvent>, ev: ParsedEvent) {
    match (out.last_mut(), ev) {
        (Some(ParsedEvent::Content(a)), ParsedEvent::Content(b)) => a.push_str(&b),
        (Some(ParsedEvent::Reasoning(a)), ParsedEvent::Reasoning(b)) => a.push_str(&b),
        (_, ev) => out.push(ev),
    }
}

/// Qwen body: XML (`<function=NAME>...`) or JSON (`{"name":..., "arguments":...}`).
pub fn parse_qwen_body(body: &str, schemas: &HashMap<String, Value>) -> Option<(String, Value)> {
    let b = body.trim();
    if let Some(rest) = b.strip_prefix("<function=") {
        return parse_qwen_xml(rest, schemas);
    }
    let v: Value = serde_json::from_str(b).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = match v.get("arguments").or_else(|| v.get("parameters")) {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(a) => a.clone(),
        None => Value::Object(Default::default()),
    };
    Some((name, args))
}

fn parse_qwen_xml(rest: &str, schemas: &HashMap<String, Value>) -> Option<(String, Value)> {
    let gt = rest.find('>')?;
    let name = rest[..gt].trim().to_string();
    let mut body = &rest[gt + 1..];
    if let Some(end) = body.rfind("</function>") {
        body = &body[..end];
    }
    let props = schemas.get(&name).and_then(|s| s.get("properties"));
    let mut args = serde_json::Map::new();
    while let Some(p) = body.find("<parameter=") {
        let after = &body[p + "<parameter=".len()..];
        let gt = after.find('>')?;
        let key = after[..gt].trim().to_string();
        let val_start = &after[gt + 1..];
        let (raw, next) = match val_start.find("</parameter>") {
            Some(e) => (&val_start[..e], &val_start[e + "</parameter>".len()..]),
            None => match val_start.find("<parameter=") {
                Some(e) => (&val_start[..e], &val_start[e..]),
                None => (val_start, ""),
            },
        };
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let ty = props
            .and_then(|p| p.get(&key))
            .and_then(|s| s.get("type"))
            .and_then(|t| t.as_str());
        args.insert(key, typed_value(raw, ty));
        body = next;
    }
    Some((name, Value::Object(args)))
}

/// A Qwen3-Coder parameter value typed by its schema (strings stay verbatim).
fn typed_value(raw: &str, ty: Option<&str>) -> Value {
    match ty {
        Some("string") => Value::String(raw.to_string()),
        Some(_) | None => match serde_json::from_str::<Value>(raw.trim()) {
            Ok(v) if ty.is_some() || !v.is_string() => v,
            _ => Value::String(raw.to_string()),
        },
    }
}

/// Gemma 4 body: `call:NAME{...}`.
pub fn parse_gemma4_body(body: &str) -> Option<(String, Value)> {
    let b = body.trim().strip_prefix("call:")?;
    let brace = b.find('{')?;
    let name = b[..brace].trim().to_string();
    if name.is_empty() {
        return None;
    }
    let args = gemma4_args::parse(&b[brace..]).ok()?;
    Some((name, args))
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
