//! API errors: one type, two wire shapes (OpenAI's error object and Anthropic's), one place
//! mapping each kind to its HTTP status and stable `type` string.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which error shape a route answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Anthropic,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
    },
    #[error("invalid or missing API key")]
    Unauthorized,
    #[error("{0}")]
    NotFound(String),
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the server is at its concurrency limit ({max} requests); retry shortly")]
    Overloaded { max: usize, retry_after_s: u64 },
    #[error("{0}")]
    NotImplemented(String),
    #[error("the model is still loading")]
    NotReady,
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
            param: None,
        }
    }
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Overloaded { .. } | ApiError::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI `error.type`.
    pub fn openai_type(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } | ApiError::PayloadTooLarge { .. } => {
                "invalid_request_error"
            }
            ApiError::Unauthorized => "authentication_error",
            ApiError::NotFound(_) => "not_found_error",
            ApiError::Overloaded { .. } | ApiError::NotReady => "overloaded_error",
            ApiError::NotImplemented(_) => "not_implemented_error",
            ApiError::Timeout(_) => "timeout_error",
            ApiError::Internal(_) => "server_error",
        }
    }

    /// Anthropic `error.type`.
    pub fn anthropic_type(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } | ApiError::NotImplemented(_) => "invalid_request_error",
            ApiError::Unauthorized => "authentication_error",
            ApiError::NotFound(_) => "not_found_error",
            ApiError::PayloadTooLarge { .. } => "request_too_large",
            ApiError::Overloaded { .. } | ApiError::NotReady => "overloaded_error",
            ApiError::Timeout(_) | ApiError::Internal(_) => "api_error",
        }
    }

    /// The JSON body in the given shape.
    pub fn body(&self, flavor: Flavor) -> serde_json::Value {
        match flavor {
            Flavor::OpenAi => {
                let param = match self {
                    ApiError::BadRequest { param, .. } => param.clone(),
                    _ => None,
                };
                json!({"error": {
                    "message": self.to_string(),
                    "type": self.openai_type(),
                    "param": param,
                    "code": self.status().as_u16().to_string(),
                }})
            }
            Flavor::Anthropic => json!({
                "type": "error",
                "error": {"type": self.anthropic_type(), "message": self.to_string()},
            }),
        }
    }

    pub fn into_response_with(self, flavor: Flavor) -> Response {
        let mut resp = (self.status(), axum::Json(self.body(flavor))).into_response();
        if let ApiError::Overloaded { retry_after_s, .. } = &self {
            if let Ok(v) = HeaderValue::from_str(&retry_after_s.to_string()) {
                resp.headers_mut().insert("retry-after", v);
            }
        }
        if matches!(self, ApiError::NotReady) {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from_static("5"));
        }
        resp
    }
}

/// An error bound to the shape of the route that produced it.
pub struct Shaped(pub ApiError, pub Flavor);

impl IntoResponse for Shaped {
    fn into_response(self) -> Response {
        self.0.into_response_with(self.1)
    }
}

/// OpenAI-shaped by default.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.into_response_with(Flavor::OpenAi)
    }
}

impl From<crate::chat::ChatError> for ApiError {
    fn from(e: crate::chat::ChatError) -> Self {
        ApiError::bad(e.to_string())
    }
}

impl From<crate::engine::EngineError> for ApiError {
    fn from(e: crate::engine::EngineError) -> Self {
        use crate::engine::EngineError as E;
        match e {
            E::ContextExceeded { .. } | E::EmptyPrompt | E::BadToken { .. } => {
                ApiError::bad(e.to_string())
            }
            E::Stopped | E::Model(_) => ApiError::Internal(e.to_string()),
        }
    }
}
