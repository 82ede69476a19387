//! Request parameters shared by the OpenAI and Anthropic routes: sampling fields with their
//! ranges, `max_tokens` against the context, stop lists, and the thinking switches.

use serde::Deserialize;
use serde_json::Value;

use super::errors::ApiError;
use super::ServerConfig;
use crate::chat::Dialect;
use crate::engine::{SamplingParams, ThinkBudget};
use crate::tokenizer::Tokenizer;

/// Reasoning level (CLI `--thinking`, REPL `/thinking`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThinkingLevel {
    #[default]
    Off,
    On,
    Low,
    Mid,
    High,
    XHigh,
}

impl ThinkingLevel {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "off" | "none" | "false" | "0" | "minimal" | "disabled" => Self::Off,
            "on" | "true" | "1" | "enabled" => Self::On,
            "low" => Self::Low,
            "mid" | "medium" => Self::Mid,
            "high" => Self::High,
            "xhigh" | "max" => Self::XHigh,
            _ => return None,
        })
    }
    pub fn enabled(self) -> bool {
        self != Self::Off
    }
    /// Thinking-token budget the level implies (`None`: unbounded).
    pub fn budget(self) -> Option<usize> {
        match self {
            Self::Low => Some(1024),
            Self::Mid => Some(4096),
            Self::High => Some(16384),
            Self::Off | Self::On | Self::XHigh => None,
        }
    }
}

/// Server-wide defaults (CLI flags).
#[derive(Debug, Clone)]
pub struct Defaults {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub seed: Option<u64>,
    pub thinking: ThinkingLevel,
    /// Explicit thinking budget (overrides the level's).
    pub think_budget: Option<usize>,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 64,
            top_p: 0.95,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            thinking: ThinkingLevel::Off,
            think_budget: None,
        }
    }
}

/// Sampling fields as requests carry them (all optional).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
}

impl SamplingFields {
    pub fn resolve(&self, d: &Defaults) -> Result<SamplingParams, ApiError> {
        let range =
            |name: &str, v: Option<f64>, lo: f64, hi: f64| -> Result<Option<f32>, ApiError> {
                match v {
                    Some(x) if !(lo..=hi).contains(&x) || x.is_nan() => Err(ApiError::bad_param(
                        name,
                        format!("{name} must be between {lo} and {hi}, got {x}"),
                    )),
                    other => Ok(other.map(|x| x as f32)),
                }
            };
        let temperature =
            range("temperature", self.temperature, 0.0, 2.0)?.unwrap_or(d.temperature);
        let top_p = range("top_p", self.top_p, 0.0, 1.0)?.unwrap_or(d.top_p);
        if top_p == 0.0 {
            return Err(ApiError::bad_param("top_p", "top_p must be greater than 0"));
        }
        let min_p = range("min_p", self.min_p, 0.0, 1.0)?.unwrap_or(d.min_p);
        let presence = range("presence_penalty", self.presence_penalty, -2.0, 2.0)?.unwrap_or(0.0);
        let frequency =
            range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?.unwrap_or(0.0);
        let repetition = range("repetition_penalty", self.repetition_penalty, 0.01, 10.0)?
            .unwrap_or(d.repetition_penalty);
        let top_k = match self.top_k {
            None => d.top_k,
            Some(k) if k <= 0 => 0, // -1 / 0: off (vLLM's convention)
            Some(k) => k as usize,
        };
        let seed = match self.seed {
            Some(s) => Some(s as u64),
            None => d.seed,
        };
        Ok(SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
            repetition_penalty: repetition,
            presence_penalty: presence,
            frequency_penalty: frequency,
        })
    }
}

/// How many tokens to generate: the request's value (checked against the context, 400 with the
/// counts) or the default clipped to the room left; then the server's ceiling.
pub fn resolve_max_tokens(
    requested: Option<i64>,
    prompt_len: usize,
    context: usize,
    cfg: &ServerConfig,
) -> Result<usize, ApiError> {
    let room = context.saturating_sub(prompt_len);
    if room == 0 {
        return Err(ApiError::bad_param(
            "messages",
            format!(
                "the prompt has {prompt_len} tokens, which fills the model's context of {context} tokens; shorten it"
            ),
        ));
    }
    let n = match requested {
        Some(n) if n <= 0 => {
            return Err(ApiError::bad_param(
                "max_tokens",
                format!("max_tokens must be at least 1, got {n}"),
            ))
        }
        Some(n) => {
            let n = n as u64;
            if n as u128 + prompt_len as u128 > context as u128 {
                return Err(ApiError::bad_param(
                    "max_tokens",
                    format!(
                        "this model's context is {context} tokens; the prompt has {prompt_len} tokens and max_tokens asks for {n} more ({} in total)",
                        n as u128 + prompt_len as u128
                    ),
                ));
            }
            n as usize
        }
        None => cfg.default_max_tokens.min(room),
    };
    Ok(if cfg.max_output_tokens > 0 {
        n.min(cfg.max_output_tokens)
    } else {
        n
    })
}

/// `stop`: a string or a list of strings.
pub fn stop_list(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::bad_param("stop", "stop must be a string or a list of strings")
                })
            })
            .collect(),
        Some(_) => Err(ApiError::bad_param(
            "stop",
            "stop must be a string or a list of strings",
        )),
    }
}

/// The engine's thinking budget for a dialect, when a budget applies.
pub fn think_budget(
    tok: &Tokenizer,
    dialect: Dialect,
    budget: Option<usize>,
    starts_open: bool,
) -> Option<ThinkBudget> {
    let budget = budget?;
    let (open, marker, close) = match dialect {
        Dialect::Qwen => ("<think>", "</think>", "\n</think>\n\n"),
        Dialect::Gemma4 => ("<|channel>", "<channel|>", "<channel|>"),
        Dialect::Gemma3 => return None,
    };
    let open_id = tok.token_to_id(open)?;
    let close_id = tok.token_to_id(marker)?;
    let close_ids = tok.encode(close, false).ok()?;
    Some(ThinkBudget {
        open_id,
        starts_open,
        close_id,
        close_ids,
        budget,
    })
}

/// Token ids that end an assistant turn in `dialect` (added to the tokenizer's EOS set).
pub fn end_of_turn_ids(tok: &Tokenizer, dialect: Dialect) -> Vec<u32> {
    dialect
        .end_of_turn()
        .iter()
        .filter_map(|t| tok.token_to_id(t))
        .collect()
}
