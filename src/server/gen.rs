//! One generation as the HTTP layer sees it: engine events run through the chat parser and
//! come out as content / reasoning / tool-call items, then one terminal item. Holds the
//! admission slot; dropping it (client gone) cancels the engine request.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::OwnedSemaphorePermit;

use super::errors::ApiError;
use super::AppState;
use crate::chat::{OutputParser, ParsedEvent, ParsedToolCall};
use crate::engine::{Event, FinishReason, LogprobInfo, RequestStream, Usage};

#[derive(Debug)]
pub enum GenItem {
    /// Content text and the logprobs of the tokens that produced it.
    Content {
        text: String,
        logprobs: Vec<LogprobInfo>,
    },
    Reasoning(String),
    ToolCall(ParsedToolCall),
    /// Terminal; `token_ids` are every generated id, in order.
    Done {
        reason: FinishReason,
        usage: Usage,
        tool_calls: usize,
        token_ids: Vec<u32>,
    },
    Failed(ApiError),
}

pub struct Generation {
    stream: RequestStream,
    parser: Option<OutputParser>,
    pending_lp: Vec<LogprobInfo>,
    queue: VecDeque<GenItem>,
    finished: bool,
    deadline: Option<tokio::time::Instant>,
    started: Instant,
    first_token: bool,
    token_ids: Vec<u32>,
    state: Arc<AppState>,
    _permit: OwnedSemaphorePermit,
}

impl Generation {
    pub fn new(
        state: Arc<AppState>,
        stream: RequestStream,
        parser: Option<OutputParser>,
        permit: OwnedSemaphorePermit,
        started: Instant,
    ) -> Self {
        let deadline = state
            .cfg
            .timeout
            .map(|t| tokio::time::Instant::from_std(started + t));
        Self {
            stream,
            parser,
            pending_lp: Vec::new(),
            queue: VecDeque::new(),
            finished: false,
            deadline,
            started,
            first_token: false,
            token_ids: Vec::new(),
            state,
            _permit: permit,
        }
    }

    pub async fn next(&mut self) -> Option<GenItem> {
        loop {
            if let Some(it) = self.queue.pop_front() {
                return Some(it);
            }
            if self.finished {
                return None;
            }
            let ev = match self.deadline {
                Some(d) => match tokio::time::timeout_at(d, self.stream.next()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        self.stream.cancel();
                        self.finished = true;
                        return Some(GenItem::Failed(ApiError::Timeout(
                            "generation exceeded the server's --timeout".into(),
                        )));
                    }
                },
                None => self.stream.next().await,
            };
            match ev {
                None => {
                    self.finished = true;
                    return Some(GenItem::Failed(ApiError::Internal(
                        "the engine stopped".into(),
                    )));
                }
                Some(Event::Token { id, text, logprobs }) => {
                    self.token_ids.push(id);
                    if !self.first_token {
                        self.first_token = true;
                        self.state.metrics.ttft.observe(self.started.elapsed());
                    }
                    if let Some(lp) = logprobs {
                        self.pending_lp.push(lp);
                    }
                    self.push_text(&text);
                }
                Some(Event::Finished {
                    reason,
                    usage,
                    text,
                }) => {
                    self.push_text(&text);
                    let mut tool_calls = 0;
                    if let Some(p) = self.parser.as_mut() {
                        let evs = p.finish();
                        tool_calls = p.tool_calls();
                        self.map_events(evs);
                    }
                    if !self.pending_lp.is_empty() {
                        let logprobs = std::mem::take(&mut self.pending_lp);
                        self.queue.push_back(GenItem::Content {
                            text: String::new(),
                            logprobs,
                        });
                    }
                    let token_ids = std::mem::take(&mut self.token_ids);
                    self.queue.push_back(GenItem::Done {
                        reason,
                        usage,
                        tool_calls,
                        token_ids,
                    });
                    self.finished = true;
                }
                Some(Event::Error(e)) => {
                    self.queue.push_back(GenItem::Failed(e.into()));
                    self.finished = true;
                }
            }
        }
    }

    fn push_text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        match self.parser.as_mut() {
            Some(p) => {
                let evs = p.feed(text);
                self.map_events(evs);
            }
            None => {
                let logprobs = std::mem::take(&mut self.pending_lp);
                self.queue.push_back(GenItem::Content {
                    text: crate::tokenizer::strip_output_mark(text).into_owned(),
                    logprobs,
                });
            }
        }
    }

    fn map_events(&mut self, evs: Vec<ParsedEvent>) {
        for ev in evs {
            self.queue.push_back(match ev {
                ParsedEvent::Content(text) => GenItem::Content {
                    text,
                    logprobs: std::mem::take(&mut self.pending_lp),
                },
                ParsedEvent::Reasoning(r) => GenItem::Reasoning(r),
                ParsedEvent::ToolCall(c) => GenItem::ToolCall(c),
            });
        }
    }
}

/// Seconds since the Unix epoch (`created` fields).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A short random id with a prefix (`chatcmpl-...`, `msg_...`).
pub fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..24]
    )
}
