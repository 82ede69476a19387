//! Tokenizers: HF `tokenizer.json` through the `tokenizers` crate, and vocabularies embedded in
//! GGUF files built into the same kind of tokenizer.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("loading tokenizer from {path}: {msg}")]
    Load { path: String, msg: String },
    #[error("tokenizer: {0}")]
    Codec(String),
}

/// Special tokens the engine needs.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    /// Every id that ends generation (EOS, end-of-turn markers).
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pub special: SpecialTokens,
}

impl Tokenizer {
    pub fn from_tokenizers(inner: tokenizers::Tokenizer, special: SpecialTokens) -> Self {
        Self { inner, special }
    }

    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::Load {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        Ok(Self {
            inner,
            special: SpecialTokens::default(),
        })
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Encode text. `add_special` adds BOS etc. as the tokenizer's post-processor defines.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| TokenizerError::Codec(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Codec(e.to_string()))
    }

    pub fn token_to_id(&self, tok: &str) -> Option<u32> {
        self.inner.token_to_id(tok)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
