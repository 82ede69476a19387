//! The HTTP server (axum): OpenAI `/v1/chat/completions`, `/v1/completions`, `/v1/models`,
//! `/v1/embeddings`; Anthropic `/v1/messages`; `/health`, `/healthz`, `/readyz`, `/metrics`,
//! `/tokenize`, `/detokenize`, `/version`.
//!
//! Handlers reach the model only through [`crate::engine::EngineHandle`]. The server can start
//! before the model is loaded: [`AppState::set_loaded`] flips `/readyz` to 200.

pub mod anthropic;
pub mod completions;
pub mod errors;
pub mod gen;
pub mod metrics;
pub mod middleware;
pub mod misc;
pub mod openai;
pub mod params;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::chat::ChatFormat;
use crate::engine::EngineHandle;
use crate::tokenizer::Tokenizer;
pub use errors::{ApiError, Flavor};

/// Defaults and limits of the server (from the CLI).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `None` or empty: auth off.
    pub api_key: Option<String>,
    /// Generations running together (the engine's batch).
    pub max_concurrent: usize,
    /// Generations that may wait beyond `max_concurrent`; more get 503 + Retry-After.
    pub max_queue: usize,
    /// Absolute per-request ceiling on generated tokens; 0 = none.
    pub max_output_tokens: usize,
    /// Generated tokens when a request gives no `max_tokens`.
    pub default_max_tokens: usize,
    /// Wall-clock limit of one generation.
    pub timeout: Option<Duration>,
    /// Largest request body accepted (413 beyond).
    pub body_limit: usize,
    pub defaults: params::Defaults,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_concurrent: 4,
            max_queue: 0,
            max_output_tokens: 0,
            default_max_tokens: 512,
            timeout: None,
            body_limit: 8 << 20,
            defaults: params::Defaults::default(),
        }
    }
}

impl ServerConfig {
    /// Generations admitted at once: running and waiting.
    pub fn admitted(&self) -> usize {
        self.max_concurrent.max(1) + self.max_queue
    }
}

/// What exists once the model is loaded.
pub struct Loaded {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    /// `None`: the model has no chat format (raw completions only).
    pub chat: Option<ChatFormat>,
}

/// Shared state of every handler.
pub struct AppState {
    pub cfg: ServerConfig,
    loaded: OnceLock<Loaded>,
    admission: Arc<Semaphore>,
    pub metrics: metrics::HttpMetrics,
    pub started: Instant,
}

impl AppState {
    pub fn new(cfg: ServerConfig) -> Arc<Self> {
        let admission = Arc::new(Semaphore::new(cfg.admitted()));
        Arc::new(Self {
            cfg,
            loaded: OnceLock::new(),
            admission,
            metrics: metrics::HttpMetrics::default(),
            started: Instant::now(),
        })
    }

    /// Make the model available (once).
    pub fn set_loaded(&self, l: Loaded) {
        let _ = self.loaded.set(l);
    }

    pub fn loaded(&self) -> Result<&Loaded, ApiError> {
        self.loaded.get().ok_or(ApiError::NotReady)
    }

    pub fn is_ready(&self) -> bool {
        self.loaded.get().is_some()
    }

    /// Take a generation slot or fail with 503.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        self.admission
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::Overloaded {
                max: self.cfg.admitted(),
                retry_after_s: 1,
            })
    }

    /// Generations in flight.
    pub fn in_flight(&self) -> usize {
        self.cfg.admitted() - self.admission.available_permits()
    }
}

/// All routes with their middleware.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/models", get(misc::models))
        .route("/v1/models/{*id}", get(misc::model))
        .route("/v1/embeddings", post(misc::embeddings))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::auth,
        ));
    let open = Router::new()
        .route("/health", get(misc::health))
        .route("/healthz", get(misc::health))
        .route("/readyz", get(misc::readyz))
        .route("/metrics", get(misc::metrics))
        .route("/version", get(misc::version));
    v1.merge(open)
        .fallback(misc::not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::observe,
        ))
        .layer(DefaultBodyLimit::max(state.cfg.body_limit))
        .with_state(state)
}

/// Serve until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
