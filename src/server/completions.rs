//! OpenAI legacy `/v1/completions`: a raw prompt (string or token ids), no chat template.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use super::errors::{ApiError, Flavor, Shaped};
use super::gen::{new_id, unix_now, GenItem, Generation};
use super::middleware::RequestId;
use super::openai::{
    data_line, limit, parse_body, reject_response_format, sse, usage_json, SseTx, StreamOptions,
};
use super::params::{self, SamplingFields};
use super::AppState;
use crate::engine::{GenerateRequest, LogprobInfo, StopParams, Usage};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Value,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub stop: Option<Value>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub n: Option<i64>,
    pub suffix: Option<Value>,
    pub response_format: Option<Value>,
    /// Extension (as vLLM): include `prompt_token_ids` and `token_ids` in each choice.
    pub return_token_ids: Option<bool>,
    /// Extension: whether control-token strings in a text prompt are control tokens (default
    /// true: a raw prompt is the caller's own template); false tokenizes the prompt as text.
    pub parse_special: Option<bool>,
}

/// One prompt as token ids: a string (tokenised with the tokenizer's special tokens, or as text
/// when `parse_special` is false) or a list of ids.
fn prompt_ids(p: &Value, tok: &Tokenizer, parse_special: bool) -> Result<Vec<u32>, String> {
    match p {
        Value::String(s) if s.is_empty() => Err("must not be empty".into()),
        Value::String(s) => {
            let ids = if parse_special {
                tok.encode(s, true)
            } else {
                tok.encode_text(s, true)
            };
            ids.map_err(|e| e.to_string())
        }
        Value::Array(a) if a.is_empty() => Err("must not be empty".into()),
        Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&v| v <= u32::MAX as u64)
                    .map(|v| v as u32)
                    .ok_or_else(|| "must be a string or a list of token ids".to_string())
            })
            .collect(),
        _ => Err("must be a string or a list of token ids".into()),
    }
}

/// The request's prompts: one (a string or a list of ids) or a list of them (strings or lists
/// of ids), each its own choice, as OpenAI's API takes them.
fn prompts(p: &Value, tok: &Tokenizer, parse_special: bool) -> Result<Vec<Vec<u32>>, ApiError> {
    let (listed, is_list) = match p {
        Value::Array(a) if !a.is_empty() && a.iter().all(|x| x.is_string() || x.is_array()) => {
            (a.as_slice(), true)
        }
        one => (std::slice::from_ref(one), false),
    };
    listed
        .iter()
        .enumerate()
        .map(|(i, x)| {
            prompt_ids(x, tok, parse_special).map_err(|e| {
                let at = if is_list {
                    format!("prompt[{i}]")
                } else {
                    "prompt".into()
                };
                ApiError::bad_param("prompt", format!("{at} {e}"))
            })
        })
        .collect()
}

pub async fn completions(
    State(st): State<Arc<AppState>>,
    Extension(rid): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match inner(st, rid, body).await {
        Ok(r) => r,
        Err(e) => Shaped(e, Flavor::OpenAi).into_response(),
    }
}

async fn inner(
    st: Arc<AppState>,
    rid: RequestId,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let r: CompletionRequest = parse_body(body).map_err(|e| limit(e, &st))?;
    reject_response_format(r.response_format.as_ref())?;
    if r.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_param("n", "only n = 1 is supported"));
    }
    if r.suffix.as_ref().is_some_and(|s| !s.is_null()) {
        return Err(ApiError::bad_param(
            "suffix",
            "suffix (fill-in-the-middle) is not supported",
        ));
    }
    let logprobs = match r.logprobs {
        Some(k) if !(0..=20).contains(&k) => {
            return Err(ApiError::bad_param(
                "logprobs",
                "logprobs must be between 0 and 20",
            ))
        }
        k => k.map(|k| k as usize),
    };
    let sampling = r.sampling.resolve(&st.cfg.defaults)?;
    let loaded = st.loaded()?;
    let tok = loaded.tokenizer.clone();
    let prompts = prompts(&r.prompt, &tok, r.parse_special.unwrap_or(true))?;
    let info = loaded.engine.info();
    if prompts.len() > st.cfg.max_concurrent.max(1) {
        return Err(ApiError::bad_param(
            "prompt",
            format!(
                "a list of {} prompts: at most {} (the server's --max-concurrent) per request",
                prompts.len(),
                st.cfg.max_concurrent.max(1)
            ),
        ));
    }
    let stop_strings = params::stop_list(r.stop.as_ref())?;
    let mut outs = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.into_iter().enumerate() {
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= info.vocab_size) {
            return Err(ApiError::bad_param(
                "prompt",
                format!(
                    "token id {id} is outside the vocabulary of {}",
                    info.vocab_size
                ),
            ));
        }
        let max_tokens =
            params::resolve_max_tokens(r.max_tokens, prompt.len(), info.max_context, &st.cfg)?;
        let ret_ids = r.return_token_ids.unwrap_or(false).then(|| prompt.clone());
        let echo = if r.echo.unwrap_or(false) {
            tok.decode(&prompt, false).unwrap_or_default()
        } else {
            String::new()
        };
        let req = GenerateRequest {
            request_id: if i == 0 {
                rid.0.clone()
            } else {
                format!("{}-{i}", rid.0)
            },
            prompt,
            sampling: sampling.clone(),
            stop: StopParams {
                max_tokens,
                stop_strings: stop_strings.clone(),
                stop_token_ids: r.stop_token_ids.clone().unwrap_or_default(),
                ignore_eos: r.ignore_eos.unwrap_or(false),
                min_tokens: r.min_tokens.unwrap_or(0).max(0) as usize,
            },
            logprobs,
            think_budget: None,
        };
        outs.push((req, Choice { echo, ret_ids }));
    }
    // every prompt is a generation of its own: all are admitted, or none
    let permits = outs
        .iter()
        .map(|_| st.admit())
        .collect::<Result<Vec<_>, _>>()?;
    let mut gens = Vec::with_capacity(outs.len());
    for ((req, choice), permit) in outs.into_iter().zip(permits) {
        let stream = loaded.engine.submit(req)?;
        gens.push((
            Generation::new(st.clone(), stream, None, permit, started),
            choice,
        ));
    }
    let model = r.model.clone().unwrap_or_else(|| info.model_id.clone());
    if r.stream.unwrap_or(false) {
        let usage = r
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        Ok(sse(stream_task(
            gens,
            model,
            tok,
            usage,
            logprobs.is_some(),
        )))
    } else {
        collect(gens, model, &tok, logprobs.is_some()).await
    }
}

/// What a choice adds to its generation's text: the echoed prompt, and the prompt's ids when
/// asked for (`return_token_ids`).
struct Choice {
    echo: String,
    ret_ids: Option<Vec<u32>>,
}

fn add_usage(a: &mut Usage, b: &Usage) {
    a.prompt_tokens += b.prompt_tokens;
    a.completion_tokens += b.completion_tokens;
    a.cached_tokens += b.cached_tokens;
}

/// Legacy logprobs object: tokens, token_logprobs, top_logprobs (token -> logprob maps),
/// text_offset.
fn legacy_logprobs(tok: &Tokenizer, lps: &[LogprobInfo], offset0: usize) -> Value {
    let mut off = offset0;
    let (mut tokens, mut lp, mut top, mut offsets) = (vec![], vec![], vec![], vec![]);
    for l in lps {
        let t = tok.decode(&[l.chosen.id], false).unwrap_or_default();
        offsets.push(off);
        off += t.len();
        tokens.push(Value::String(t));
        lp.push(json!(l.chosen.logprob));
        let mut m = serde_json::Map::new();
        for x in &l.top {
            m.insert(
                tok.decode(&[x.id], false).unwrap_or_default(),
                json!(x.logprob),
            );
        }
        top.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": offsets})
}

/// One choice of a non-streamed response, and its usage.
async fn collect_one(
    mut gen: Generation,
    c: Choice,
    index: usize,
    tok: &Tokenizer,
    want_lp: bool,
) -> Result<(Value, Usage), ApiError> {
    let mut text = c.echo.clone();
    let mut lps = Vec::new();
    while let Some(item) = gen.next().await {
        match item {
            GenItem::Content { text: t, logprobs } => {
                text.push_str(&t);
                lps.extend(logprobs);
            }
            GenItem::Reasoning(_) | GenItem::ToolCall(_) => {}
            GenItem::Failed(e) => return Err(e),
            GenItem::Done {
                reason,
                usage,
                token_ids,
                ..
            } => {
                let logprobs = if want_lp {
                    legacy_logprobs(tok, &lps, c.echo.len())
                } else {
                    Value::Null
                };
                let mut choice = json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason.openai()});
                if let Some(p) = &c.ret_ids {
                    choice["prompt_token_ids"] = json!(p);
                    choice["token_ids"] = json!(token_ids);
                }
                return Ok((choice, usage));
            }
        }
    }
    Err(ApiError::Internal(
        "generation ended without a result".into(),
    ))
}

async fn collect(
    gens: Vec<(Generation, Choice)>,
    model: String,
    tok: &Tokenizer,
    want_lp: bool,
) -> Result<Response, ApiError> {
    let all = futures::future::join_all(
        gens.into_iter()
            .enumerate()
            .map(|(i, (g, c))| collect_one(g, c, i, tok, want_lp)),
    )
    .await;
    let mut choices = Vec::with_capacity(all.len());
    let mut usage = Usage::default();
    for r in all {
        let (c, u) = r?;
        choices.push(c);
        add_usage(&mut usage, &u);
    }
    Ok(Json(json!({
        "id": new_id("cmpl-"),
        "object": "text_completion",
        "created": unix_now(),
        "model": model,
        "choices": choices,
        "usage": usage_json(&usage),
    }))
    .into_response())
}

fn stream_task(
    gens: Vec<(Generation, Choice)>,
    model: String,
    tok: Arc<Tokenizer>,
    include_usage: bool,
    want_lp: bool,
) -> impl FnOnce(SseTx) -> tokio::task::JoinHandle<()> {
    use futures::StreamExt;
    move |tx| {
        tokio::spawn(async move {
            let id = new_id("cmpl-");
            let created = unix_now();
            let chunk = |index: usize, text: &str, lp: Value, finish: Value| {
                data_line(
                    &json!({"id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": index, "text": text, "logprobs": lp, "finish_reason": finish}]}),
                )
            };
            let mut offset: Vec<usize> = gens.iter().map(|(_, c)| c.echo.len()).collect();
            for (i, (_, c)) in gens.iter().enumerate() {
                if !c.echo.is_empty()
                    && tx
                        .send(Ok(chunk(i, &c.echo, Value::Null, Value::Null)))
                        .await
                        .is_err()
                {
                    return;
                }
            }
            // the choices' items as they come, each tagged with its index; dropping this (the
            // client gone, or an error) cancels every generation still running
            let n = gens.len();
            let mut items =
                futures::stream::select_all(gens.into_iter().enumerate().map(|(i, (g, _))| {
                    futures::stream::unfold(
                        g,
                        |mut g| async move { g.next().await.map(|it| (it, g)) },
                    )
                    .map(move |it| (i, it))
                    .boxed()
                }));
            let (mut done, mut usage) = (0, Usage::default());
            while let Some((i, item)) = items.next().await {
                let bytes = match item {
                    GenItem::Content { text, logprobs } => {
                        let lp = if want_lp {
                            legacy_logprobs(&tok, &logprobs, offset[i])
                        } else {
                            Value::Null
                        };
                        offset[i] += text.len();
                        chunk(i, &text, lp, Value::Null)
                    }
                    GenItem::Reasoning(_) | GenItem::ToolCall(_) => continue,
                    GenItem::Done {
                        reason, usage: u, ..
                    } => {
                        add_usage(&mut usage, &u);
                        done += 1;
                        let mut out =
                            chunk(i, "", Value::Null, Value::String(reason.openai().into()))
                                .to_vec();
                        if done == n {
                            if include_usage {
                                out.extend_from_slice(&data_line(&json!({"id": id, "object": "text_completion",
                                    "created": created, "model": model, "choices": [], "usage": usage_json(&usage)})));
                            }
                            out.extend_from_slice(b"data: [DONE]\n\n");
                            let _ = tx.send(Ok(Bytes::from(out))).await;
                            return;
                        }
                        Bytes::from(out)
                    }
                    GenItem::Failed(e) => {
                        let _ = tx.send(Ok(data_line(&e.body(Flavor::OpenAi)))).await;
                        return;
                    }
                };
                if tx.send(Ok(bytes)).await.is_err() {
                    return;
                }
            }
        })
    }
}
