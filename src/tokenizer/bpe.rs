//! Byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`, Qwen) built into a `tokenizers`
//! BPE model with the pre-tokenizer that `tokenizer.ggml.pre` names.

use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::vocab::{GgufVocab, TokenType};
use super::{post_processor, TokenizerError};

/// Qwen2/Qwen3's split regex (their tokenizer.json's `Split` pre-tokenizer).
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5/3.6's split regex: letters extended with combining marks (`\p{M}`).
pub const QWEN35_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Vocab(e.to_string())
}

/// The pre-tokenizer for a `tokenizer.ggml.pre` value and whether text is NFC-normalised first.
fn pre_tokenizer(pre: &str) -> Result<(PreTokenizerWrapper, bool), TokenizerError> {
    let split = |pattern: &str| -> Result<PreTokenizerWrapper, TokenizerError> {
        let split = Split::new(
            SplitPattern::Regex(pattern.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(err)?;
        let bytes = tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, false, false);
        Ok(Sequence::new(vec![split.into(), bytes.into()]).into())
    };
    match pre {
        "qwen2" => Ok((split(QWEN2_PATTERN)?, true)),
        "qwen35" => Ok((split(QWEN35_PATTERN)?, true)),
        // GPT-2's own regex inside ByteLevel. llama.cpp's "default" (several successive
        // splits) is not this, and is refused rather than approximated.
        "gpt-2" => Ok((
            tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, false, true).into(),
            false,
        )),
        other => Err(TokenizerError::Unsupported(format!(
            "tokenizer.ggml.pre = {other:?} (supported: \"qwen2\", \"qwen35\", \"gpt-2\")"
        ))),
    }
}

pub(crate) fn build(v: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges_src = v.merges.as_ref().ok_or_else(|| {
        TokenizerError::Vocab("gpt2 vocabulary without tokenizer.ggml.merges".into())
    })?;
    let mut merges = Vec::with_capacity(merges_src.len());
    for m in merges_src {
        let (l, r) = m
            .split_once(' ')
            .ok_or_else(|| TokenizerError::Vocab(format!("merge {m:?} is not \"left right\"")))?;
        merges.push((l.to_string(), r.to_string()));
    }
    let mut vocab = tokenizers::models::bpe::Vocab::default();
    for (i, t) in v.tokens.iter().enumerate() {
        vocab.entry(t.clone()).or_insert(i as u32);
    }
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(err)?;
    let mut tok = tokenizers::Tokenizer::new(model);

    let pre_name = v.pre.as_deref().ok_or_else(|| {
        TokenizerError::Unsupported("gpt2 vocabulary without tokenizer.ggml.pre".into())
    })?;
    let (pre, nfc) = pre_tokenizer(pre_name)?;
    if nfc {
        tok.with_normalizer(Some(NFC));
    }
    tok.with_pre_tokenizer(Some(pre));
    tok.with_decoder(Some(ByteLevel::new(false, false, false)));
    tok.with_post_processor(post_processor(
        &v.tokens,
        v.bos_id,
        v.eos_id,
        v.add_bos.unwrap_or(false),
        v.add_eos.unwrap_or(false),
    )?);

    let (mut special, mut user) = (Vec::new(), Vec::new());
    for (i, t) in v.tokens.iter().enumerate() {
        match v.token_type(i) {
            TokenType::Control | TokenType::Unknown => {
                special.push(AddedToken::from(t.clone(), true).normalized(false))
            }
            TokenType::UserDefined => {
                user.push(AddedToken::from(t.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    tok.add_special_tokens(&special);
    tok.add_tokens(&user);
    Ok(tok)
}
