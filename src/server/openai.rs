//! OpenAI routes: `/v1/chat/completions` and `/v1/completions`, streaming (SSE, `[DONE]`,
//! `stream_options.include_usage`) and not.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::errors::{ApiError, Flavor, Shaped};
use super::gen::{new_id, unix_now, GenItem, Generation};
use super::middleware::RequestId;
use super::params::{self, SamplingFields, ThinkingLevel};
use super::AppState;
use crate::chat::{ChatRequest, ToolChoice};
use crate::engine::{FinishReason, GenerateRequest, LogprobInfo, StopParams, Usage};
use crate::tokenizer::Tokenizer;

/// Parse a JSON body into `T`: 413 for oversized bodies, 400 (with serde's message) for
/// malformed JSON, invalid UTF-8 and wrong types.
pub fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| match r.status().as_u16() {
        413 => ApiError::PayloadTooLarge { limit: 0 },
        _ => ApiError::bad(format!("could not read the request body: {r}")),
    })?;
    if bytes.is_empty() {
        return Err(ApiError::bad(
            "the request body is empty; expected a JSON object",
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| ApiError::bad(format!("invalid request body: {e}")))
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<Value>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub stop: Option<Value>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub reasoning_effort: Option<String>,
    pub thinking: Option<Value>,
    pub enable_thinking: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub response_format: Option<Value>,
    pub n: Option<i64>,
}

const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// Validate OpenAI messages and flatten them into what chat templates expect.
pub fn template_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "messages must not be empty",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let obj = m.as_object().ok_or_else(|| {
                ApiError::bad_param("messages", format!("messages[{i}] must be an object"))
            })?;
            let role = obj.get("role").and_then(|r| r.as_str()).ok_or_else(|| {
                ApiError::bad_param("messages", format!("messages[{i}].role must be a string"))
            })?;
            if !ROLES.contains(&role) {
                return Err(ApiError::bad_param(
                    "messages",
                    format!("messages[{i}].role '{role}' is not one of system, developer, user, assistant, tool"),
                ));
            }
            let mut out = obj.clone();
            let role = match role {
                "developer" => "system",
                "function" => "tool",
                r => r,
            };
            out.insert("role".into(), role.into());
            let content = match obj.get("content") {
                None | Some(Value::Null) => {
                    if role == "assistant" {
                        Value::String(String::new())
                    } else {
                        return Err(ApiError::bad_param("messages", format!("messages[{i}].content is required")));
                    }
                }
                Some(Value::String(s)) => Value::String(s.clone()),
                Some(Value::Array(parts)) => Value::String(text_parts(parts, i)?),
                Some(_) => {
                    return Err(ApiError::bad_param(
                        "messages",
                        format!("messages[{i}].content must be a string or a list of content parts"),
                    ))
                }
            };
            out.insert("content".into(), content);
            if let Some(tc) = obj.get("tool_calls") {
                if !tc.is_array() && !tc.is_null() {
                    return Err(ApiError::bad_param("messages", format!("messages[{i}].tool_calls must be a list")));
                }
            }
            Ok(Value::Object(out))
        })
        .collect()
}

fn text_parts(parts: &[Value], i: usize) -> Result<String, ApiError> {
    let mut texts = Vec::new();
    for p in parts {
        match (
            p.get("type").and_then(|t| t.as_str()),
            p.get("text").and_then(|t| t.as_str()),
        ) {
            (Some("text"), Some(t)) => texts.push(t),
            (Some(ty), _) if ty != "text" => {
                return Err(ApiError::bad_param(
                    "messages",
                    format!(
                        "messages[{i}]: content parts of type '{ty}' are not supported (text only)"
                    ),
                ))
            }
            _ => {
                return Err(ApiError::bad_param(
                    "messages",
                    format!("messages[{i}]: malformed content part"),
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

/// Validate OpenAI tool definitions.
pub fn check_tools(tools: &[Value]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let name = t
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(|n| n.as_str());
        if t.get("type").and_then(|x| x.as_str()) != Some("function")
            || name.is_none_or(str::is_empty)
        {
            return Err(ApiError::bad_param(
                "tools",
                format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
            ));
        }
    }
    Ok(())
}

pub fn parse_tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    Ok(match v {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    format!("unknown tool_choice '{other}'"),
                ))
            }
        },
        Some(obj) => match obj
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(|n| n.as_str())
        {
            Some(n) => ToolChoice::Function(n.to_string()),
            None => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    "tool_choice object needs function.name",
                ))
            }
        },
    })
}

/// Thinking switch and budget from `reasoning_effort`, `thinking`, `enable_thinking` and
/// `chat_template_kwargs.enable_thinking` (later ones win), else the server default.
fn resolve_thinking(
    r: &ChatCompletionRequest,
    st: &AppState,
) -> Result<(bool, Option<usize>), ApiError> {
    let d = &st.cfg.defaults;
    let mut level = d.thinking;
    let mut budget = d.think_budget;
    if let Some(e) = &r.reasoning_effort {
        level = ThinkingLevel::parse(e).ok_or_else(|| {
            ApiError::bad_param(
                "reasoning_effort",
                format!("unknown reasoning_effort '{e}'"),
            )
        })?;
        budget = level.budget().or(d.think_budget);
    }
    match &r.thinking {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => {
            level = if *b {
                ThinkingLevel::On
            } else {
                ThinkingLevel::Off
            }
        }
        Some(Value::String(s)) => {
            level = ThinkingLevel::parse(s).ok_or_else(|| {
                ApiError::bad_param("thinking", format!("unknown thinking '{s}'"))
            })?;
            budget = level.budget().or(budget);
        }
        Some(Value::Object(o)) => {
            level = match o.get("type").and_then(|t| t.as_str()) {
                Some("disabled") => ThinkingLevel::Off,
                _ => ThinkingLevel::On,
            };
            if let Some(b) = o.get("budget_tokens").and_then(|b| b.as_u64()) {
                budget = Some(b as usize);
            }
        }
        Some(_) => {
            return Err(ApiError::bad_param(
                "thinking",
                "thinking must be a boolean, a level or an object",
            ))
        }
    }
    if let Some(b) = r.enable_thinking {
        level = if b {
            ThinkingLevel::On
        } else {
            ThinkingLevel::Off
        };
    }
    if let Some(b) = r
        .chat_template_kwargs
        .as_ref()
        .and_then(|k| k.get("enable_thinking"))
        .and_then(|v| v.as_bool())
    {
        level = if b {
            ThinkingLevel::On
        } else {
            ThinkingLevel::Off
        };
    }
    Ok((
        level.enabled(),
        if level.enabled() {
            budget.or(level.budget())
        } else {
            None
        },
    ))
}

pub fn reject_response_format(v: Option<&Value>) -> Result<(), ApiError> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(f) if f.get("type").and_then(|t| t.as_str()) == Some("text") => Ok(()),
        Some(_) => Err(ApiError::bad_param(
            "response_format",
            "response_format (structured output: json_object / json_schema) is not supported by this server yet",
        )),
    }
}

pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    Extension(rid): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match chat_inner(st, rid, body).await {
        Ok(r) => r,
        Err(e) => Shaped(e, Flavor::OpenAi).into_response(),
    }
}

async fn chat_inner(
    st: Arc<AppState>,
    rid: RequestId,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let r: ChatCompletionRequest = parse_body(body).map_err(|e| limit(e, &st))?;
    let messages = template_messages(&r.messages)?;
    reject_response_format(r.response_format.as_ref())?;
    if r.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_param("n", "only n = 1 is supported"));
    }
    let tools = r.tools.clone().unwrap_or_default();
    check_tools(&tools)?;
    let tool_choice = parse_tool_choice(r.tool_choice.as_ref())?;
    let top_logprobs = match (r.logprobs, r.top_logprobs) {
        (_, Some(k)) if !(0..=20).contains(&k) => {
            return Err(ApiError::bad_param(
                "top_logprobs",
                "top_logprobs must be between 0 and 20",
            ))
        }
        (Some(true), k) => Some(k.unwrap_or(0) as usize),
        _ => None,
    };
    let sampling = r.sampling.resolve(&st.cfg.defaults)?;
    let (thinking, budget) = resolve_thinking(&r, &st)?;
    let loaded = st.loaded()?;
    let chat = loaded.chat.as_ref().ok_or_else(|| {
        ApiError::bad("the loaded model has no chat template; use /v1/completions")
    })?;
    let mut kwargs = r.chat_template_kwargs.clone().unwrap_or_default();
    kwargs.remove("enable_thinking");
    let rendered = chat.render(&ChatRequest {
        messages,
        tools: tools.clone(),
        tool_choice,
        enable_thinking: Some(thinking),
        kwargs,
    })?;
    let tok = &loaded.tokenizer;
    let prompt = rendered
        .encode(tok)
        .map_err(|e| ApiError::bad(e.to_string()))?;
    let max_tokens = params::resolve_max_tokens(
        r.max_completion_tokens.or(r.max_tokens),
        prompt.len(),
        loaded.engine.info().max_context,
        &st.cfg,
    )?;
    let mut stop_ids = params::end_of_turn_ids(tok, chat.dialect);
    stop_ids.extend(r.stop_token_ids.iter().flatten());
    let req = GenerateRequest {
        request_id: rid.0.clone(),
        think_budget: params::think_budget(tok, chat.dialect, budget, rendered.in_reasoning),
        prompt,
        sampling,
        stop: StopParams {
            max_tokens,
            stop_strings: params::stop_list(r.stop.as_ref())?,
            stop_token_ids: stop_ids,
            ignore_eos: r.ignore_eos.unwrap_or(false),
            min_tokens: r.min_tokens.unwrap_or(0).max(0) as usize,
        },
        logprobs: top_logprobs,
    };
    let permit = st.admit()?;
    let stream = loaded.engine.submit(req)?;
    let parser = chat.parser(&rendered, &tools);
    let gen = Generation::new(st.clone(), stream, Some(parser), permit, started);
    let model = r
        .model
        .clone()
        .unwrap_or_else(|| loaded.engine.info().model_id.clone());
    let tok = loaded.tokenizer.clone();
    if r.stream.unwrap_or(false) {
        let usage = r
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        Ok(sse(chat_stream(
            gen,
            model,
            tok,
            usage,
            top_logprobs.is_some(),
        )))
    } else {
        chat_collect(gen, model, &tok).await
    }
}

/// Map a 413 from the body extractor to the configured limit.
pub fn limit(e: ApiError, st: &AppState) -> ApiError {
    match e {
        ApiError::PayloadTooLarge { .. } => ApiError::PayloadTooLarge {
            limit: st.cfg.body_limit,
        },
        e => e,
    }
}

fn finish_reason(reason: &FinishReason, tool_calls: usize) -> &'static str {
    if tool_calls > 0 && matches!(reason, FinishReason::Eos | FinishReason::StopString(_)) {
        "tool_calls"
    } else {
        reason.openai()
    }
}

pub(crate) fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn token_json(tok: &Tokenizer, id: u32, logprob: f32) -> Value {
    let t = tok.decode(&[id], false).unwrap_or_default();
    json!({"token": t, "logprob": logprob, "bytes": t.as_bytes()})
}

fn logprobs_json(tok: &Tokenizer, lps: &[LogprobInfo]) -> Vec<Value> {
    lps.iter()
        .map(|lp| {
            let mut v = token_json(tok, lp.chosen.id, lp.chosen.logprob);
            v["top_logprobs"] = lp
                .top
                .iter()
                .map(|t| token_json(tok, t.id, t.logprob))
                .collect();
            v
        })
        .collect()
}

fn tool_call_json(c: &crate::chat::ParsedToolCall, id: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

async fn chat_collect(
    mut gen: Generation,
    model: String,
    tok: &Tokenizer,
) -> Result<Response, ApiError> {
    let (mut content, mut reasoning, mut calls, mut lps) =
        (String::new(), String::new(), Vec::new(), Vec::new());
    while let Some(item) = gen.next().await {
        match item {
            GenItem::Content { text, logprobs } => {
                content.push_str(&text);
                lps.extend(logprobs);
            }
            GenItem::Reasoning(r) => reasoning.push_str(&r),
            GenItem::ToolCall(c) => calls.push(tool_call_json(&c, &new_id("call_"))),
            GenItem::Failed(e) => return Err(e),
            GenItem::Done {
                reason,
                usage,
                tool_calls,
                ..
            } => {
                let mut message = json!({"role": "assistant", "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(content.clone()) }});
                if !reasoning.is_empty() {
                    message["reasoning_content"] = Value::String(reasoning.clone());
                }
                if !calls.is_empty() {
                    message["tool_calls"] = Value::Array(calls.clone());
                }
                let logprobs = if lps.is_empty() {
                    Value::Null
                } else {
                    json!({"content": logprobs_json(tok, &lps)})
                };
                return Ok(Json(json!({
                    "id": new_id("chatcmpl-"),
                    "object": "chat.completion",
                    "created": unix_now(),
                    "model": model,
                    "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                                 "finish_reason": finish_reason(&reason, tool_calls)}],
                    "usage": usage_json(&usage),
                    "system_fingerprint": null,
                }))
                .into_response());
            }
        }
    }
    Err(ApiError::Internal(
        "generation ended without a result".into(),
    ))
}

pub(crate) type SseTx = mpsc::Sender<Result<Bytes, Infallible>>;

/// An SSE response fed by a producer task.
pub fn sse(producer: impl FnOnce(SseTx) -> tokio::task::JoinHandle<()>) -> Response {
    let (tx, rx) = mpsc::channel(64);
    producer(tx);
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .unwrap_or_else(|_| ApiError::Internal("building the stream".into()).into_response())
}

pub(crate) fn data_line(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn chat_stream(
    mut gen: Generation,
    model: String,
    tok: Arc<Tokenizer>,
    include_usage: bool,
    want_lp: bool,
) -> impl FnOnce(SseTx) -> tokio::task::JoinHandle<()> {
    move |tx| {
        tokio::spawn(async move {
            let id = new_id("chatcmpl-");
            let created = unix_now();
            let chunk = |delta: Value, lp: Value, finish: Value| {
                data_line(
                    &json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "system_fingerprint": null,
                    "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}),
                )
            };
            if tx
                .send(Ok(chunk(
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    Value::Null,
                )))
                .await
                .is_err()
            {
                return;
            }
            while let Some(item) = gen.next().await {
                let bytes = match item {
                    GenItem::Content { text, logprobs } => {
                        let lp = if want_lp && !logprobs.is_empty() {
                            json!({"content": logprobs_json(&tok, &logprobs)})
                        } else {
                            Value::Null
                        };
                        if text.is_empty() && lp.is_null() {
                            continue;
                        }
                        chunk(json!({"content": text}), lp, Value::Null)
                    }
                    GenItem::Reasoning(r) => {
                        chunk(json!({"reasoning_content": r}), Value::Null, Value::Null)
                    }
                    GenItem::ToolCall(c) => {
                        let head = json!({"tool_calls": [{"index": c.index, "id": new_id("call_"), "type": "function",
                            "function": {"name": c.name, "arguments": ""}}]});
                        if tx
                            .send(Ok(chunk(head, Value::Null, Value::Null)))
                            .await
                            .is_err()
                        {
                            return;
                        }
                        chunk(
                            json!({"tool_calls": [{"index": c.index, "function": {"arguments": c.arguments}}]}),
                            Value::Null,
                            Value::Null,
                        )
                    }
                    GenItem::Done {
                        reason,
                        usage,
                        tool_calls,
                        ..
                    } => {
                        let mut out = chunk(
                            json!({}),
                            Value::Null,
                            Value::String(finish_reason(&reason, tool_calls).into()),
                        )
                        .to_vec();
                        if include_usage {
                            out.extend_from_slice(&data_line(&json!({"id": id, "object": "chat.completion.chunk",
                                "created": created, "model": model, "choices": [], "usage": usage_json(&usage)})));
                        }
                        out.extend_from_slice(b"data: [DONE]\n\n");
                        let _ = tx.send(Ok(Bytes::from(out))).await;
                        return;
                    }
                    GenItem::Failed(e) => {
                        let _ = tx.send(Ok(data_line(&e.body(Flavor::OpenAi)))).await;
                        return;
                    }
                };
                if tx.send(Ok(bytes)).await.is_err() {
                    return; // client gone: dropping `gen` cancels the engine request
                }
            }
        })
    }
}
