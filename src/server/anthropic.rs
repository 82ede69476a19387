//! Anthropic `/v1/messages`: system, content blocks, tools / tool_use / tool_result,
//! tool_choice, stop_sequences, thinking blocks, and streaming with the event sequence the
//! Anthropic SDK parses (message_start, content_block_start/delta/stop, message_delta,
//! message_stop, ping).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::errors::{ApiError, Flavor, Shaped};
use super::gen::{new_id, GenItem, Generation};
use super::middleware::RequestId;
use super::openai::{limit, parse_body, sse, SseTx};
use super::params::{self, SamplingFields};
use super::AppState;
use crate::chat::{ChatRequest, ToolChoice};
use crate::engine::{FinishReason, GenerateRequest, StopParams, Usage};

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    pub model: Option<String>,
    pub max_tokens: i64,
    pub messages: Vec<Value>,
    pub system: Option<Value>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Value>,
    pub metadata: Option<Value>,
}

fn text_of(v: &Value, what: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = Vec::new();
            for b in blocks {
                match (
                    b.get("type").and_then(|t| t.as_str()),
                    b.get("text").and_then(|t| t.as_str()),
                ) {
                    (Some("text"), Some(t)) => out.push(t.to_string()),
                    _ => {
                        return Err(ApiError::bad(format!(
                            "{what}: only text blocks are supported here"
                        )))
                    }
                }
            }
            Ok(out.join("\n"))
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::bad(format!(
            "{what} must be a string or a list of text blocks"
        ))),
    }
}

/// Anthropic messages -> OpenAI-shaped template messages.
pub fn to_template_messages(r: &MessagesRequest) -> Result<Vec<Value>, ApiError> {
    if r.messages.is_empty() {
        return Err(ApiError::bad("messages: at least one message is required"));
    }
    let mut out = Vec::new();
    if let Some(sys) = &r.system {
        let s = text_of(sys, "system")?;
        if !s.is_empty() {
            out.push(json!({"role": "system", "content": s}));
        }
    }
    for (i, m) in r.messages.iter().enumerate() {
        let role = m.get("role").and_then(|x| x.as_str()).unwrap_or("");
        if role != "user" && role != "assistant" {
            return Err(ApiError::bad(format!(
                "messages.{i}.role: must be 'user' or 'assistant', got '{role}'"
            )));
        }
        let content = m
            .get("content")
            .ok_or_else(|| ApiError::bad(format!("messages.{i}.content: required")))?;
        let blocks = match content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(b) => b.clone(),
            _ => {
                return Err(ApiError::bad(format!(
                    "messages.{i}.content: must be a string or a list of blocks"
                )))
            }
        };
        let (mut texts, mut reasoning, mut calls) = (Vec::new(), String::new(), Vec::new());
        for b in &blocks {
            match b.get("type").and_then(|t| t.as_str()) {
                Some("text") => texts.push(
                    b.get("text")
                        .and_then(|t| t.as_str())
                        .unwrap_or("")
                        .to_string(),
                ),
                Some("thinking") => {
                    reasoning.push_str(b.get("thinking").and_then(|t| t.as_str()).unwrap_or(""))
                }
                Some("redacted_thinking") => {}
                Some("tool_use") if role == "assistant" => {
                    let name = b.get("name").and_then(|n| n.as_str()).ok_or_else(|| {
                        ApiError::bad(format!("messages.{i}: tool_use needs a name"))
                    })?;
                    calls.push(json!({"id": b.get("id").cloned().unwrap_or(Value::Null), "type": "function",
                        "function": {"name": name, "arguments": b.get("input").cloned().unwrap_or(json!({}))}}));
                }
                Some("tool_result") if role == "user" => {
                    let c = text_of(
                        b.get("content").unwrap_or(&Value::Null),
                        "tool_result.content",
                    )?;
                    out.push(json!({"role": "tool", "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null), "content": c}));
                }
                Some(t) => {
                    return Err(ApiError::bad(format!(
                        "messages.{i}: content blocks of type '{t}' are not supported"
                    )))
                }
                None => {
                    return Err(ApiError::bad(format!(
                        "messages.{i}: a content block has no type"
                    )))
                }
            }
        }
        if role == "assistant" {
            let mut msg = json!({"role": "assistant", "content": texts.join("\n")});
            if !reasoning.is_empty() {
                msg["reasoning_content"] = Value::String(reasoning);
            }
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        } else if !texts.is_empty() {
            out.push(json!({"role": "user", "content": texts.join("\n")}));
        }
    }
    Ok(out)
}

fn tools_of(r: &MessagesRequest) -> Result<(Vec<Value>, ToolChoice), ApiError> {
    let mut tools = Vec::new();
    for (i, t) in r.tools.iter().flatten().enumerate() {
        let name = t
            .get("name")
            .and_then(|n| n.as_str())
            .ok_or_else(|| ApiError::bad(format!("tools.{i}.name: required")))?;
        let mut f = Map::new();
        f.insert("name".into(), name.into());
        f.insert(
            "description".into(),
            t.get("description")
                .cloned()
                .unwrap_or(Value::String(String::new())),
        );
        f.insert(
            "parameters".into(),
            t.get("input_schema")
                .cloned()
                .unwrap_or(json!({"type": "object"})),
        );
        tools.push(json!({"type": "function", "function": f}));
    }
    let choice = match r
        .tool_choice
        .as_ref()
        .and_then(|c| c.get("type"))
        .and_then(|t| t.as_str())
    {
        None | Some("auto") => ToolChoice::Auto,
        Some("none") => ToolChoice::None,
        Some("any") => ToolChoice::Required,
        Some("tool") => ToolChoice::Function(
            r.tool_choice
                .as_ref()
                .and_then(|c| c.get("name"))
                .and_then(|n| n.as_str())
                .ok_or_else(|| ApiError::bad("tool_choice.name: required for type 'tool'"))?
                .to_string(),
        ),
        Some(o) => return Err(ApiError::bad(format!("tool_choice.type: unknown '{o}'"))),
    };
    Ok((tools, choice))
}

pub async fn messages(
    State(st): State<Arc<AppState>>,
    Extension(rid): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match inner(st, rid, body).await {
        Ok(r) => r,
        Err(e) => Shaped(e, Flavor::Anthropic).into_response(),
    }
}

async fn inner(
    st: Arc<AppState>,
    rid: RequestId,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let r: MessagesRequest = parse_body(body).map_err(|e| limit(e, &st))?;
    let messages = to_template_messages(&r)?;
    let (tools, tool_choice) = tools_of(&r)?;
    let sampling = SamplingFields {
        temperature: r.temperature,
        top_p: r.top_p,
        top_k: r.top_k,
        ..Default::default()
    }
    .resolve(&st.cfg.defaults)?;
    let (thinking, budget) = match r
        .thinking
        .as_ref()
        .and_then(|t| t.get("type"))
        .and_then(|t| t.as_str())
    {
        Some("enabled") => (
            true,
            r.thinking
                .as_ref()
                .and_then(|t| t.get("budget_tokens"))
                .and_then(|b| b.as_u64())
                .map(|b| b as usize),
        ),
        Some("disabled") => (false, None),
        _ => (
            st.cfg.defaults.thinking.enabled(),
            st.cfg
                .defaults
                .think_budget
                .or(st.cfg.defaults.thinking.budget()),
        ),
    };
    let loaded = st.loaded()?;
    let chat = loaded
        .chat
        .as_ref()
        .ok_or_else(|| ApiError::bad("the loaded model has no chat template"))?;
    let rendered = chat.render(&ChatRequest {
        messages,
        tools: tools.clone(),
        tool_choice,
        enable_thinking: Some(thinking),
        kwargs: Map::new(),
    })?;
    let tok = &loaded.tokenizer;
    let prompt = rendered
        .encode(tok)
        .map_err(|e| ApiError::bad(e.to_string()))?;
    let max_tokens = params::resolve_max_tokens(
        Some(r.max_tokens),
        prompt.len(),
        loaded.engine.info().max_context,
        &st.cfg,
    )?;
    let req = GenerateRequest {
        request_id: rid.0.clone(),
        think_budget: params::think_budget(
            tok,
            chat.dialect,
            budget.filter(|_| thinking),
            rendered.in_reasoning,
        ),
        prompt,
        sampling,
        stop: StopParams {
            max_tokens,
            stop_strings: r.stop_sequences.clone().unwrap_or_default(),
            stop_token_ids: params::end_of_turn_ids(tok, chat.dialect),
            ignore_eos: false,
            min_tokens: 0,
        },
        logprobs: None,
    };
    let n_prompt = req.prompt.len();
    let permit = st.admit()?;
    let stream = loaded.engine.submit(req)?;
    let gen = Generation::new(
        st.clone(),
        stream,
        Some(chat.parser(&rendered, &tools)),
        permit,
        started,
    );
    let model = r
        .model
        .clone()
        .unwrap_or_else(|| loaded.engine.info().model_id.clone());
    if r.stream.unwrap_or(false) {
        Ok(sse(stream_task(gen, model, n_prompt)))
    } else {
        collect(gen, model).await
    }
}

fn stop_reason(reason: &FinishReason, tool_calls: usize) -> (&'static str, Value) {
    match reason {
        FinishReason::StopString(s) => ("stop_sequence", Value::String(s.clone())),
        FinishReason::Length | FinishReason::ContextFull => ("max_tokens", Value::Null),
        _ if tool_calls > 0 => ("tool_use", Value::Null),
        _ => ("end_turn", Value::Null),
    }
}

fn tool_input(args: &str) -> Value {
    serde_json::from_str(args).unwrap_or_else(|_| json!({}))
}

async fn collect(mut gen: Generation, model: String) -> Result<Response, ApiError> {
    let mut blocks: Vec<Value> = Vec::new();
    while let Some(item) = gen.next().await {
        match item {
            GenItem::Reasoning(r) => match blocks.last_mut() {
                Some(b) if b["type"] == "thinking" => b["thinking"] = Value::String(format!("{}{r}", b["thinking"].as_str().unwrap_or(""))),
                _ => blocks.push(json!({"type": "thinking", "thinking": r, "signature": ""})),
            },
            GenItem::Content { text, .. } if text.is_empty() => {}
            GenItem::Content { text, .. } => match blocks.last_mut() {
                Some(b) if b["type"] == "text" => b["text"] = Value::String(format!("{}{text}", b["text"].as_str().unwrap_or(""))),
                _ => blocks.push(json!({"type": "text", "text": text})),
            },
            GenItem::ToolCall(c) => blocks.push(json!({"type": "tool_use", "id": new_id("toolu_"), "name": c.name, "input": tool_input(&c.arguments)})),
            GenItem::Failed(e) => return Err(e),
            GenItem::Done { reason, usage, tool_calls, .. } => {
                let (sr, seq) = stop_reason(&reason, tool_calls);
                return Ok(Json(json!({
                    "id": new_id("msg_"), "type": "message", "role": "assistant", "model": model,
                    "content": blocks, "stop_reason": sr, "stop_sequence": seq,
                    "usage": usage_json(&usage),
                }))
                .into_response());
            }
        }
    }
    Err(ApiError::Internal(
        "generation ended without a result".into(),
    ))
}

fn usage_json(u: &Usage) -> Value {
    json!({"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens,
           "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0})
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// Which block is open in the stream.
#[derive(PartialEq)]
enum Open {
    None,
    Text,
    Thinking,
}

fn stream_task(
    mut gen: Generation,
    model: String,
    n_prompt: usize,
) -> impl FnOnce(SseTx) -> tokio::task::JoinHandle<()> {
    move |tx| {
        tokio::spawn(async move {
            let mut index: usize = 0;
            let mut open = Open::None;
            let mut out = vec![
                event(
                    "message_start",
                    &json!({"type": "message_start", "message": {
                    "id": new_id("msg_"), "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": n_prompt, "output_tokens": 0}}}),
                ),
                event("ping", &json!({"type": "ping"})),
            ];
            // Close the open block (if any), then maybe open a new one.
            let close = |open: &mut Open, index: &mut usize, out: &mut Vec<Bytes>| {
                if *open != Open::None {
                    if *open == Open::Thinking {
                        out.push(event(
                            "content_block_delta",
                            &json!({"type": "content_block_delta", "index": *index,
                            "delta": {"type": "signature_delta", "signature": ""}}),
                        ));
                    }
                    out.push(event(
                        "content_block_stop",
                        &json!({"type": "content_block_stop", "index": *index}),
                    ));
                    *index += 1;
                    *open = Open::None;
                }
            };
            while let Some(item) = gen.next().await {
                match item {
                    GenItem::Reasoning(r) => {
                        if open != Open::Thinking {
                            close(&mut open, &mut index, &mut out);
                            out.push(event("content_block_start", &json!({"type": "content_block_start", "index": index,
                                "content_block": {"type": "thinking", "thinking": "", "signature": ""}})));
                            open = Open::Thinking;
                        }
                        out.push(event(
                            "content_block_delta",
                            &json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "thinking_delta", "thinking": r}}),
                        ));
                    }
                    GenItem::Content { text, .. } => {
                        if text.is_empty() {
                            continue;
                        }
                        if open != Open::Text {
                            close(&mut open, &mut index, &mut out);
                            out.push(event(
                                "content_block_start",
                                &json!({"type": "content_block_start", "index": index,
                                "content_block": {"type": "text", "text": ""}}),
                            ));
                            open = Open::Text;
                        }
                        out.push(event(
                            "content_block_delta",
                            &json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "text_delta", "text": text}}),
                        ));
                    }
                    GenItem::ToolCall(c) => {
                        close(&mut open, &mut index, &mut out);
                        out.push(event("content_block_start", &json!({"type": "content_block_start", "index": index,
                            "content_block": {"type": "tool_use", "id": new_id("toolu_"), "name": c.name, "input": {}}})));
                        out.push(event(
                            "content_block_delta",
                            &json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": c.arguments}}),
                        ));
                        out.push(event(
                            "content_block_stop",
                            &json!({"type": "content_block_stop", "index": index}),
                        ));
                        index += 1;
                    }
                    GenItem::Done {
                        reason,
                        usage,
                        tool_calls,
                        ..
                    } => {
                        close(&mut open, &mut index, &mut out);
                        let (sr, seq) = stop_reason(&reason, tool_calls);
                        out.push(event("message_delta", &json!({"type": "message_delta",
                            "delta": {"stop_reason": sr, "stop_sequence": seq},
                            "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}})));
                        out.push(event("message_stop", &json!({"type": "message_stop"})));
                        let _ = tx.send(Ok(Bytes::from(out.concat()))).await;
                        return;
                    }
                    GenItem::Failed(e) => {
                        out.push(event("error", &e.body(Flavor::Anthropic)));
                        let _ = tx.send(Ok(Bytes::from(out.concat()))).await;
                        return;
                    }
                }
                if !out.is_empty() && tx.send(Ok(Bytes::from(out.concat()))).await.is_err() {
                    return;
                }
                out.clear();
            }
        })
    }
}
