//! Middleware: request ids, access logs and request metrics on every route; API-key auth on
//! `/v1/*` and the tokenizer routes.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tracing::Instrument;

use super::errors::{ApiError, Flavor};
use super::AppState;

/// The request's id (echoed from `X-Request-Id` or generated), in request extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Request id, span, access log, metrics.
pub async fn observe(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    req.extensions_mut().insert(RequestId(id.clone()));
    let route = route_label(req.uri().path());
    let method = req.method().clone();
    let span = tracing::info_span!("request", request_id = %id, %method, route);
    let t = Instant::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    let status = resp.status().as_u16();
    state.metrics.record(route, status, t.elapsed());
    span.in_scope(|| {
        tracing::info!(status, ms = t.elapsed().as_secs_f64() * 1e3, "done");
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// Known routes as metric labels (bounded cardinality).
pub fn route_label(path: &str) -> &'static str {
    const ROUTES: [&str; 13] = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/models",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
        "/health",
        "/healthz",
        "/readyz",
        "/metrics",
        "/version",
        "/v1/models/{id}",
    ];
    if let Some(r) = ROUTES.iter().find(|r| **r == path) {
        return r;
    }
    if path.starts_with("/v1/models/") {
        return "/v1/models/{id}";
    }
    "unmatched"
}

/// `Authorization: Bearer KEY` or `x-api-key: KEY`, compared in constant time.
pub async fn auth(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(key) = state.cfg.api_key.as_deref().filter(|k| !k.is_empty()) else {
        return next.run(req).await;
    };
    let h = req.headers();
    let bearer = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| {
            s.strip_prefix("Bearer ")
                .or_else(|| s.strip_prefix("bearer "))
        });
    let xkey = h.get("x-api-key").and_then(|v| v.to_str().ok());
    let ok = [bearer, xkey]
        .into_iter()
        .flatten()
        .any(|given| key_matches(given, key));
    if ok {
        return next.run(req).await;
    }
    let flavor = if req.uri().path() == "/v1/messages" {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    };
    ApiError::Unauthorized.into_response_with(flavor)
}

/// Constant-time comparison (digests first, so lengths leak nothing either).
pub fn key_matches(given: &str, key: &str) -> bool {
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(key.as_bytes());
    a.ct_eq(&b).into()
}
