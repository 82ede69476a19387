//! Small routes: health, readiness, metrics, version, models, embeddings, tokenize.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::errors::ApiError;
use super::openai::{limit, parse_body};
use super::AppState;

pub async fn health(State(st): State<Arc<AppState>>) -> Json<Value> {
    let mut body =
        json!({"status": "ok", "ready": st.is_ready(), "uptime_s": st.started.elapsed().as_secs()});
    if let Ok(l) = st.loaded() {
        let m = l.engine.metrics().snapshot();
        body["kv_cache"] = json!({
            "tokens": m.kv_tokens, "capacity": m.kv_capacity, "utilization": m.kv_utilization(),
            "prefix_hit_tokens": m.prefix_hit_tokens, "prompt_tokens": m.prompt_tokens,
            "prefix_hit_rate": m.prefix_hit_rate(),
        });
    }
    Json(body)
}

pub async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    match st.loaded() {
        Ok(l) => {
            Json(json!({"status": "ready", "model": l.engine.info().model_id})).into_response()
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "loading"})),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
pub struct MetricsQuery {
    format: Option<String>,
}

/// Prometheus text by default; `?format=json` for the engine snapshot as JSON.
pub async fn metrics(State(st): State<Arc<AppState>>, Query(q): Query<MetricsQuery>) -> Response {
    let snap = st
        .loaded()
        .map(|l| l.engine.metrics().snapshot())
        .unwrap_or_default();
    if q.format.as_deref() == Some("json") {
        return Json(json!({
            "in_flight": st.in_flight(), "max_concurrent": st.cfg.max_concurrent,
            "queue_depth": snap.queue_depth, "prefill_tps": snap.prefill_tps(), "decode_tps": snap.decode_tps(),
            "kv_utilization": snap.kv_utilization(), "prefix_hit_rate": snap.prefix_hit_rate(),
            "prefill_tokens": snap.prefill_tokens, "decode_tokens": snap.decode_tokens,
        }))
        .into_response();
    }
    let text = st
        .metrics
        .render(&snap, st.in_flight(), st.cfg.max_concurrent, st.is_ready());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub async fn version() -> Json<Value> {
    Json(json!({"name": "fucina", "version": env!("CARGO_PKG_VERSION")}))
}

fn model_card(st: &AppState) -> Result<Value, ApiError> {
    let l = st.loaded()?;
    let i = l.engine.info();
    Ok(
        json!({"id": i.model_id, "object": "model", "created": super::gen::unix_now(),
              "owned_by": "fucina", "max_model_len": i.max_context, "arch": i.arch}),
    )
}

pub async fn models(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"object": "list", "data": [model_card(&st)?]})))
}

pub async fn model(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let card = model_card(&st)?;
    if card["id"] == id.as_str() {
        Ok(Json(card))
    } else {
        Err(ApiError::NotFound(format!(
            "the model '{id}' does not exist; this server serves '{}'",
            card["id"].as_str().unwrap_or("")
        )))
    }
}

/// Embeddings need a pooled hidden state, which the model interface does not expose yet: a
/// clear 501 after validating the request (never an empty success).
pub async fn embeddings(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let v: Value = parse_body(body).map_err(|e| limit(e, &st))?;
    match v.get("input") {
        Some(Value::String(_)) | Some(Value::Array(_)) => {}
        _ => {
            return Err(ApiError::bad_param(
                "input",
                "input must be a string or a list",
            ))
        }
    }
    Err(ApiError::NotImplemented(
        "embeddings are not available: the loaded model exposes no pooled-embedding method".into(),
    ))
}

#[derive(Deserialize)]
pub struct TokenizeRequest {
    #[serde(alias = "text")]
    prompt: String,
    add_special_tokens: Option<bool>,
    /// Whether control-token strings in the text are control tokens (default true); false
    /// tokenizes it as message content is tokenized: as text.
    parse_special: Option<bool>,
}

pub async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let r: TokenizeRequest = parse_body(body).map_err(|e| limit(e, &st))?;
    let l = st.loaded()?;
    let add = r.add_special_tokens.unwrap_or(true);
    let ids = if r.parse_special.unwrap_or(true) {
        l.tokenizer.encode(&r.prompt, add)
    } else {
        l.tokenizer.encode_text(&r.prompt, add)
    }
    .map_err(|e| ApiError::bad(e.to_string()))?;
    Ok(Json(
        json!({"tokens": ids, "count": ids.len(), "max_model_len": l.engine.info().max_context}),
    ))
}

#[derive(Deserialize)]
pub struct DetokenizeRequest {
    tokens: Vec<u32>,
}

pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let r: DetokenizeRequest = parse_body(body).map_err(|e| limit(e, &st))?;
    let l = st.loaded()?;
    let vocab = l.engine.info().vocab_size;
    if let Some(&id) = r.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad_param(
            "tokens",
            format!("token id {id} is outside the vocabulary of {vocab}"),
        ));
    }
    let text = l
        .tokenizer
        .decode(&r.tokens, false)
        .map_err(|e| ApiError::bad(e.to_string()))?;
    Ok(Json(json!({"prompt": text})))
}

pub async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}
