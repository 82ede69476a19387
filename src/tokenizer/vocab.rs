//! A tokenizer vocabulary as GGUF files store it (`tokenizer.ggml.*` metadata), independent of
//! the GGUF reader, and its conversion into a `tokenizers::Tokenizer`.

use super::{bpe, spm, SpecialTokens, TokenizerError};

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
