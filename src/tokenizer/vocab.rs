//! A tokenizer vocabulary as GGUF files store it (`tokenizer.ggml.*` metadata), independent of
//! the GGUF reader, and its conversion into a `tokenizers::Tokenizer`.

use super::{bpe, spm, SpecialTokens, TokenizerError};
use crate::gguf::GgufFile;

/// SentencePiece token types as GGUF stores them (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    pub fn from_gguf(v: i64) -> Self {
        match v {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Normal,
        }
    }
}

/// Everything a GGUF file says about its tokenizer.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: "llama" (SentencePiece), "gpt2" (byte-level BPE), ...
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name ("qwen2", "default", ...).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub scores: Option<Vec<f32>>,
    pub token_types: Option<Vec<TokenType>>,
    /// `tokenizer.ggml.merges`: "left right" pairs, highest priority first.
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}

/// Texts of end-of-generation markers, recognised by name when present in a vocabulary as in
/// llama.cpp: a chat turn ends with them even where metadata names only one EOS.
pub const END_OF_GENERATION_MARKERS: [&str; 7] = [
    "<eos>",
    "<end_of_turn>",
    "<turn|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
];

impl GgufVocab {
    pub fn token_type(&self, id: usize) -> TokenType {
        self.token_types
            .as_ref()
            .and_then(|t| t.get(id).copied())
            .unwrap_or(TokenType::Normal)
    }

    fn check_id(&self, what: &str, id: Option<u32>) -> Result<(), TokenizerError> {
        match id {
            Some(i) if i as usize >= self.tokens.len() => Err(TokenizerError::Vocab(format!(
                "{what} {i} is outside the vocabulary of {} tokens",
                self.tokens.len()
            ))),
            _ => Ok(()),
        }
    }

    /// Checks lengths and ids so that the builders can index freely.
    pub(crate) fn validate(&self) -> Result<(), TokenizerError> {
        if self.tokens.is_empty() {
            return Err(TokenizerError::Vocab(
                "tokenizer.ggml.tokens is empty".into(),
            ));
        }
        if let Some(s) = &self.scores {
            if s.len() != self.tokens.len() {
                return Err(TokenizerError::Vocab(format!(
                    "{} scores for {} tokens",
                    s.len(),
                    self.tokens.len()
                )));
            }
        }
        if let Some(t) = &self.token_types {
            if t.len() != self.tokens.len() {
                return Err(TokenizerError::Vocab(format!(
                    "{} token types for {} tokens",
                    t.len(),
                    self.tokens.len()
                )));
            }
        }
        self.check_id("bos_token_id", self.bos_id)?;
        self.check_id("eos_token_id", self.eos_id)?;
        self.check_id("eot_token_id", self.eot_id)?;
        self.check_id("eom_token_id", self.eom_id)?;
        self.check_id("unknown_token_id", self.unk_id)?;
        self.check_id("padding_token_id", self.pad_id)
    }

    /// BOS, every end-of-generation id, and PAD.
    pub fn special_tokens(&self) -> SpecialTokens {
        let mut eos = Vec::new();
        for id in [self.eos_id, self.eot_id, self.eom_id]
            .into_iter()
            .flatten()
        {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        for (id, tok) in self.tokens.iter().enumerate() {
            let marker = END_OF_GENERATION_MARKERS.contains(&tok.as_str());
            let special = matches!(
                self.token_type(id),
                TokenType::Control | TokenType::UserDefined
            ) || self.token_types.is_none();
            if marker && special && !eos.contains(&(id as u32)) {
                eos.push(id as u32);
            }
        }
        SpecialTokens {
            bos: self.bos_id,
            eos,
            pad: self.pad_id,
        }
    }

    /// Builds the tokenizer this vocabulary describes.
    pub fn build(&self) -> Result<tokenizers::Tokenizer, TokenizerError> {
        self.validate()?;
        match self.model.as_str() {
            "llama" => spm::build(self),
            "gpt2" => bpe::build(self),
            other => Err(TokenizerError::Unsupported(format!(
                "tokenizer.ggml.model = {other:?} (supported: \"llama\" SentencePiece, \"gpt2\" BPE)"
            ))),
        }
    }
}

fn string_array(g: &GgufFile, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
    let Some(arr) = g.get_array(key) else {
        return Ok(None);
    };
    arr.iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .map(Some)
        .ok_or_else(|| TokenizerError::Vocab(format!("{key} is not an array of strings")))
}

fn id(g: &GgufFile, key: &str) -> Result<Option<u32>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| TokenizerError::Vocab(format!("{key} is not a token id: {v:?}"))),
    }
}

impl GgufVocab {
    /// Reads the `tokenizer.ggml.*` metadata of a GGUF file.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, TokenizerError> {
        let model = g
            .get_str("tokenizer.ggml.model")
            .ok_or_else(|| TokenizerError::Vocab("the GGUF has no tokenizer.ggml.model".into()))?;
        let tokens = string_array(g, "tokenizer.ggml.tokens")?
            .ok_or_else(|| TokenizerError::Vocab("the GGUF has no tokenizer.ggml.tokens".into()))?;
        let scores = match g.get("tokenizer.ggml.scores") {
            None => None,
            Some(_) => Some(g.get_f32_array("tokenizer.ggml.scores").ok_or_else(|| {
                TokenizerError::Vocab("tokenizer.ggml.scores is not numeric".into())
            })?),
        };
        let token_types = match g.get_array("tokenizer.ggml.token_type") {
            None => None,
            Some(arr) => Some(
                arr.iter()
                    .map(|v| v.as_i64().map(TokenType::from_gguf))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        TokenizerError::Vocab("tokenizer.ggml.token_type is not integer".into())
                    })?,
            ),
        };
        Ok(Self {
            model: model.to_string(),
            pre: g.get_str("tokenizer.ggml.pre").map(str::to_string),
            tokens,
            scores,
            token_types,
            merges: string_array(g, "tokenizer.ggml.merges")?,
            bos_id: id(g, "tokenizer.ggml.bos_token_id")?,
            eos_id: id(g, "tokenizer.ggml.eos_token_id")?,
            eot_id: id(g, "tokenizer.ggml.eot_token_id")?,
            eom_id: id(g, "tokenizer.ggml.eom_token_id")?,
            unk_id: id(g, "tokenizer.ggml.unknown_token_id")?,
            pad_id: id(g, "tokenizer.ggml.padding_token_id")?,
            add_bos: g.get_bool("tokenizer.ggml.add_bos_token"),
            add_eos: g.get_bool("tokenizer.ggml.add_eos_token"),
            add_space_prefix: g.get_bool("tokenizer.ggml.add_space_prefix"),
        })
    }
}
