//! One generation driven from the terminal (one-shot and REPL): submit, stream the parsed
//! output to the terminal (reasoning dimmed), and report stats.

use crate::tokenizer::strip_output_mark;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use serde_json::Value;

use super::load::Ready;
use crate::chat::{ChatRequest, ParsedEvent};
use crate::engine::{Event, FinishReason, GenerateRequest, SamplingParams, StopParams, Usage};
use crate::server::params::{end_of_turn_ids, think_budget, ThinkingLevel};

pub const DIM: &str = "\x1b[2m";
pub const RESET: &str = "\x1b[0m";

/// What a turn produced.
#[derive(Debug, Clone, Default)]
pub struct TurnResult {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<Value>,
    pub usage: Usage,
    pub finish: Option<FinishReason>,
    pub ttft: Duration,
    pub total: Duration,
}

impl TurnResult {
    pub fn stats_line(&self) -> String {
        let decode_s = (self.total - self.ttft).as_secs_f64();
        let gen = self.usage.completion_tokens.saturating_sub(1);
        format!(
            "prompt {} tok ({} cached), generated {} tok; ttft {:.0} ms ({:.1} tok/s prefill), decode {:.1} tok/s; finish {:?}",
            self.usage.prompt_tokens,
            self.usage.cached_tokens,
            self.usage.completion_tokens,
            self.ttft.as_secs_f64() * 1e3,
            (self.usage.prompt_tokens - self.usage.cached_tokens) as f64 / self.ttft.as_secs_f64().max(1e-9),
            if decode_s > 0.0 { gen as f64 / decode_s } else { 0.0 },
            self.finish,
        )
    }
}

/// Generation settings of the terminal front ends.
#[derive(Debug, Clone)]
pub struct TurnOpts {
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub thinking: ThinkingLevel,
    pub think_budget: Option<usize>,
}

/// Run one turn. `messages` (chat) or `raw` (no template) is the prompt.
pub fn run(
    ready: &Ready,
    messages: Option<&[Value]>,
    raw: Option<&str>,
    o: &TurnOpts,
    out: &mut dyn Write,
) -> Result<TurnResult> {
    let tok = &ready.tokenizer;
    let (prompt, mut parser, stop_ids, budget) = match (messages, raw) {
        (Some(msgs), _) => {
            let chat = ready
                .chat
                .as_ref()
                .ok_or_else(|| anyhow!("this model has no chat format; use --raw"))?;
            let rendered = chat.render(&ChatRequest {
                messages: msgs.to_vec(),
                enable_thinking: Some(o.thinking.enabled()),
                ..Default::default()
            })?;
            let prompt = rendered.encode(tok)?;
            let budget = if o.thinking.enabled() {
                o.think_budget.or(o.thinking.budget())
            } else {
                None
            };
            let tb = think_budget(tok, chat.dialect, budget, rendered.in_reasoning);
            (
                prompt,
                Some(chat.parser(&rendered, &[])),
                end_of_turn_ids(tok, chat.dialect),
                tb,
            )
        }
        (None, Some(text)) => (tok.encode(text, true)?, None, Vec::new(), None),
        (None, None) => return Err(anyhow!("no prompt")),
    };
    let ctx = ready.engine.info().max_context;
    let max_tokens = o.max_tokens.min(ctx.saturating_sub(prompt.len())).max(1);
    let req = GenerateRequest {
        request_id: "cli".into(),
        prompt,
        sampling: o.sampling.clone(),
        stop: StopParams {
            max_tokens,
            stop_token_ids: stop_ids,
            ..Default::default()
        },
        logprobs: None,
        think_budget: budget,
    };
    let t = Instant::now();
    let mut stream = ready.engine.submit(req)?;
    let mut res = TurnResult::default();
    let mut in_reasoning = false;
    fn show(
        ev: ParsedEvent,
        res: &mut TurnResult,
        out: &mut dyn Write,
        in_reasoning: &mut bool,
    ) -> std::io::Result<()> {
        match ev {
            ParsedEvent::Content(c) => {
                if *in_reasoning {
                    writeln!(out, "{RESET}")?;
                    *in_reasoning = false;
                }
                write!(out, "{c}")?;
                res.content.push_str(&c);
            }
            ParsedEvent::Reasoning(r) => {
                if !*in_reasoning {
                    write!(out, "{DIM}")?;
                    *in_reasoning = true;
                }
                write!(out, "{r}")?;
                res.reasoning.push_str(&r);
            }
            ParsedEvent::ToolCall(c) => {
                writeln!(out, "\n[tool call {}({})]", c.name, c.arguments)?;
                res.tool_calls
                    .push(serde_json::json!({"name": c.name, "arguments": c.arguments}));
            }
        }
        out.flush()
    }
    while let Some(ev) = stream.next_blocking() {
        match ev {
            Event::Token { text, .. } => {
                if res.ttft.is_zero() {
                    res.ttft = t.elapsed();
                }
                let evs = match parser.as_mut() {
                    Some(p) => p.feed(&text),
                    None => vec![ParsedEvent::Content(strip_output_mark(&text).into_owned())],
                };
                for e in evs {
                    show(e, &mut res, out, &mut in_reasoning)?;
                }
            }
            Event::Finished {
                reason,
                usage,
                text,
            } => {
                let mut evs = match parser.as_mut() {
                    Some(p) => p.feed(&text),
                    None => vec![ParsedEvent::Content(strip_output_mark(&text).into_owned())],
                };
                if let Some(p) = parser.as_mut() {
                    evs.extend(p.finish());
                }
                for e in evs {
                    show(e, &mut res, out, &mut in_reasoning)?;
                }
                if in_reasoning {
                    write!(out, "{RESET}")?;
                }
                res.usage = usage;
                res.finish = Some(reason);
                break;
            }
            Event::Error(e) => return Err(e.into()),
        }
    }
    res.total = t.elapsed();
    if res.ttft.is_zero() {
        res.ttft = res.total;
    }
    Ok(res)
}
