//! Tokenizers: HF `tokenizer.json` through the `tokenizers` crate, and vocabularies embedded in
//! GGUF files built into the same kind of tokenizer.

use std::path::Path;
use std::sync::Arc;

mod bpe;
mod load;
mod special;
mod spm;
mod stream;
mod text;
mod tiktoken;
mod vocab;

pub use bpe::{QWEN2_PATTERN, QWEN35_PATTERN};
pub use load::load_for_checkpoint;
pub use stream::StreamDecoder;
pub use text::{strip_output_mark, text_like, OutputGuard, MARKUP_TAGS, OUTPUT_MARK};
pub use tiktoken::QWEN35_SPECIAL_TOKENS;
pub use vocab::{GgufVocab, TokenType, END_OF_GENERATION_MARKERS};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("loading tokenizer from {path}: {msg}")]
    Load { path: String, msg: String },
    #[error("tokenizer: {0}")]
    Codec(String),
    #[error("tokenizer vocabulary: {0}")]
    Vocab(String),
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
}

/// Special tokens the engine needs.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    /// Every id that ends generation (EOS, end-of-turn markers).
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

/// Cheap to clone: the `tokenizers` tokenizer is shared.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    pub special: SpecialTokens,
    /// The text-safe encodings' index (`text.rs`), built on first use.
    text: Arc<std::sync::OnceLock<Result<Arc<text::TextIndex>, String>>>,
}

impl Tokenizer {
    pub fn from_tokenizers(inner: tokenizers::Tokenizer, special: SpecialTokens) -> Self {
        Self {
            inner: Arc::new(inner),
            special,
            text: Arc::default(),
        }
    }

    /// A `tokenizer.json`; special tokens from it and from `tokenizer_config.json`,
    /// `generation_config.json` and `config.json` in the same folder, where present.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::Load {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        let special = special::from_hf_dir(&inner, path.parent());
        Ok(Self::from_tokenizers(inner, special))
    }

    /// The vocabulary a GGUF file carries, already read out of its metadata.
    pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<Self, TokenizerError> {
        let inner = vocab.build()?;
        Ok(Self::from_tokenizers(inner, vocab.special_tokens()))
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

/// BOS/EOS added around a single sequence, as a template post-processor (`None` when neither).
pub(crate) fn post_processor(
    tokens: &[String],
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
) -> Result<Option<tokenizers::processors::template::TemplateProcessing>, TokenizerError> {
    let bos = bos
        .filter(|_| add_bos)
        .map(|id| (tokens[id as usize].clone(), id));
    let eos = eos
        .filter(|_| add_eos)
        .map(|id| (tokens[id as usize].clone(), id));
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let mut specials: Vec<(String, u32)> = Vec::new();
    for (t, id) in bos.iter().chain(eos.iter()) {
        if !specials.iter().any(|(s, _)| s == t) {
            specials.push((t.clone(), *id));
        }
    }
    let seq = |name: &str, type_id: &str| -> Vec<String> {
        let mut v: Vec<String> = bos.iter().map(|(t, _)| format!("{t}{type_id}")).collect();
        v.push(format!("{name}{type_id}"));
        v.extend(eos.iter().map(|(t, _)| format!("{t}{type_id}")));
        v
    };
    let single = seq("$A", "");
    let mut pair = seq("$A", "");
    pair.extend(seq("$B", ":1"));
    let err = |e: String| TokenizerError::Vocab(format!("post-processor: {e}"));
    tokenizers::processors::template::TemplateProcessing::builder()
        .try_single(single)
        .map_err(err)?
        .try_pair(pair)
        .map_err(err)?
        .special_tokens(specials)
        .build()
        .map(Some)
        .map_err(|e| TokenizerError::Vocab(format!("post-processor: {e}")))
}
