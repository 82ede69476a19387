//! The engine interface: typed generation requests go in over a channel, a stream of typed
//! events comes back. The HTTP server, the one-shot CLI and the REPL talk only to
//! [`EngineHandle`]; what runs behind it (the continuous-batching [`scheduler`], whose steps
//! [`plan`] decides) can change without touching them.
//!
//! Life of a request: [`EngineHandle::submit`] validates it against the model's context, sends a
//! [`Submission`] to the scheduler thread and returns a [`RequestStream`]. The scheduler emits
//! [`Event::Token`]s (token id, the text it completes, optional logprobs) and exactly one
//! terminal event, [`Event::Finished`] or [`Event::Error`]. Dropping the stream cancels the
//! request: the scheduler notices before its next step and frees the sequence.

pub mod metrics;
pub mod plan;
pub mod scheduler;
pub mod stop;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

pub use crate::sampling::{LogprobInfo, Sampler, SamplingParams, TokenLogprob};
pub use metrics::{EngineMetrics, MetricsSnapshot};

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence / end-of-turn token was sampled.
    Eos,
    /// A stop string matched (the string itself is not emitted).
    StopString(String),
    /// `max_tokens` was reached.
    Length,
    /// The context window is full.
    ContextFull,
    /// The client went away.
    Cancelled,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn openai(&self) -> &'static str {
        match self {
            FinishReason::Eos | FinishReason::StopString(_) | FinishReason::Cancelled => "stop",
            FinishReason::Length | FinishReason::ContextFull => "length",
        }
    }
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV was reused from the previous request (not recomputed).
    pub cached_tokens: usize,
}

/// Forces the end of a thinking block after `budget` tokens inside it.
#[derive(Debug, Clone, PartialEq)]
pub struct ThinkBudget {
    /// Token that opens the thinking block (`<think>`, `<|channel>`).
    pub open_id: u32,
    /// Whether the prompt already left the block open (generation starts inside it).
    pub starts_open: bool,
    /// Token that marks the end of the block when the model writes it (`</think>`).
    pub close_id: u32,
    /// Token sequence forced when the budget is spent (contains `close_id`).
    pub close_ids: Vec<u32>,
    pub budget: usize,
}

/// When to stop generating.
#[derive(Debug, Clone, PartialEq)]
pub struct StopParams {
    /// Most tokens to generate (already capped by the server's ceiling).
    pub max_tokens: usize,
    /// Strings that end generation; the match and everything after it are not emitted.
    pub stop_strings: Vec<String>,
    /// Extra token ids that end generation (added to the tokenizer's EOS set).
    pub stop_token_ids: Vec<u32>,
    /// Never stop on EOS: EOS ids are masked out of sampling.
    pub ignore_eos: bool,
    /// EOS and stop tokens are masked until this many tokens were generated.
    pub min_tokens: usize,
}

impl Default for StopParams {
    fn default() -> Self {
        Self {
            max_tokens: 512,
            stop_strings: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            min_tokens: 0,
        }
    }
}

/// One generation request, already tokenised.
#[derive(Debug, Clone, Default)]
pub struct GenerateRequest {
    /// Correlates logs with the HTTP request id.
    pub request_id: String,
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopParams,
    /// Report logprobs with `top_logprobs` alternatives (`Some(0)`: only the chosen token's).
    pub logprobs: Option<usize>,
    pub think_budget: Option<ThinkBudget>,
}

/// What the scheduler reports for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token and the text it completes (may be empty while a multi-byte character
    /// or a possible stop string is held back).
    Token {
        id: u32,
        text: String,
        logprobs: Option<LogprobInfo>,
    },
    /// Terminal: the generation ended. `text` is any held-back text flushed at the end.
    Finished {
        reason: FinishReason,
        usage: Usage,
        text: String,
    },
    /// Terminal: the generation failed.
    Error(EngineError),
}

/// Errors the engine reports.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("the prompt has {prompt} tokens; with max_tokens {max_tokens} this exceeds the context of {context} tokens")]
    ContextExceeded {
        prompt: usize,
        max_tokens: usize,
        context: usize,
    },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    #[error("the engine has stopped")]
    Stopped,
    #[error("model error: {0}")]
    Model(String),
}

/// A request plus the channel its events go to. This is what crosses the engine channel; a
/// batching scheduler consumes the same type.
pub struct Submission {
    pub request: GenerateRequest,
    pub events: mpsc::UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
}

impl Submission {
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }
}

/// The receiving end of one request. Dropping it cancels the request.
pub struct RequestStream {
    events: mpsc::UnboundedReceiver<Event>,
    cancel: Arc<AtomicBool>,
}

impl RequestStream {
    /// Next event (async); `None` once the terminal event was taken or the engine died.
    pub async fn next(&mut self) -> Option<Event> {
        self.events.recv().await
    }
    /// Next event, blocking the current (non-async) thread.
    pub fn next_blocking(&mut self) -> Option<Event> {
        self.events.blocking_recv()
    }
    /// Ask the scheduler to stop this request.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Static facts the front ends need about what the engine serves.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    pub model_id: String,
    pub arch: String,
    pub max_context: usize,
    pub vocab_size: usize,
}

/// Cheap, cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: std::sync::mpsc::Sender<Submission>,
    info: Arc<EngineInfo>,
    metrics: Arc<EngineMetrics>,
}

impl EngineHandle {
    /// Wrap the submission channel of a scheduler (any scheduler).
    pub fn new(
        tx: std::sync::mpsc::Sender<Submission>,
        info: EngineInfo,
        metrics: Arc<EngineMetrics>,
    ) -> Self {
        Self {
            tx,
            info: Arc::new(info),
            metrics,
        }
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub fn metrics(&self) -> &Arc<EngineMetrics> {
        &self.metrics
    }

    /// Check a request against the model's limits without submitting it.
    pub fn validate(&self, req: &GenerateRequest) -> Result<(), EngineError> {
        if req.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if let Some(&id) = req
            .prompt
            .iter()
            .find(|&&id| id as usize >= self.info.vocab_size)
        {
            return Err(EngineError::BadToken {
                id,
                vocab: self.info.vocab_size,
            });
        }
        // The prompt plus at least one generated token must fit.
        if req.prompt.len() + 1 > self.info.max_context {
            return Err(EngineError::ContextExceeded {
                prompt: req.prompt.len(),
                max_tokens: req.stop.max_tokens,
                context: self.info.max_context,
            });
        }
        Ok(())
    }

    /// Queue a request; its events arrive on the returned stream.
    pub fn submit(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        self.validate(&request)?;
        let (etx, erx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        self.metrics.queued(1);
        self.tx
            .send(Submission {
                request,
                events: etx,
                cancel: cancel.clone(),
            })
            .map_err(|_| {
                self.metrics.queued(-1);
                EngineError::Stopped
            })?;
        Ok(RequestStream {
            events: erx,
            cancel,
        })
    }
}
