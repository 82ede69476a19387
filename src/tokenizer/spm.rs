//! SentencePiece-BPE vocabularies (`tokenizer.ggml.model = "llama"`, Gemma) built into a
//! `tokenizers` BPE model that behaves like Hugging Face's converted SentencePiece tokenizers:
//! merges derived from the piece scores, spaces as `▁`, byte fallback through `<0xXX>` pieces,
//! control and user-defined pieces matched whole before the model runs.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper};

use super::vocab::{GgufVocab, TokenType};
use super::{post_processor, TokenizerError};

const SPACE: char = '\u{2581}';

fn err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Vocab(e.to_string())
}

/// The pieces as the tokenizer sees them. llama.cpp's converter writes SentencePiece's
/// whitespace pieces (`▁▁`, `▁▁▁`, ...) with plain spaces; HF's tokenizer has `▁`.
pub(crate) fn pieces(v: &GgufVocab) -> Vec<String> {
    v.tokens
        .iter()
        .map(|t| t.replace(' ', "\u{2581}"))
        .collect()
}

/// Merge priority of each piece. SentencePiece gives user-defined pieces the score 0 (above
/// every learned piece); llama.cpp stores -1000 for them, which would demote their merges.
fn merge_scores(v: &GgufVocab) -> Vec<f32> {
    let n = v.tokens.len();
    let scores = v
        .scores
        .clone()
        .unwrap_or_else(|| (0..n).map(|i| -(i as f32)).collect());
    scores
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            if v.token_type(i) == TokenType::UserDefined {
                0.0
            } else {
                s
            }
        })
        .collect()
}

/// Merges as HF's SentencePiece converter derives them: every split of every piece into two
/// pieces of the vocabulary, ordered by the merged piece's score (high first), then by longer
/// left and right parts, then by vocabulary order (a stable sort over the piece order, the
/// splits of one piece ordered by the ids of their parts).
pub(crate) fn derive_merges(
    pieces: &[String],
    lookup: &HashMap<&str, u32>,
    scores: &[f32],
) -> Vec<(String, String)> {
    struct Cand {
        score: f32,
        left_chars: usize,
        right_chars: usize,
        left: u32,
        right: u32,
    }
    let mut all: Vec<Cand> = Vec::new();
    let mut local: Vec<Cand> = Vec::new();
    for (id, piece) in pieces.iter().enumerate() {
        local.clear();
        let total_chars = piece.chars().count();
        for (k, (pos, _)) in piece.char_indices().enumerate().skip(1) {
            let (l, r) = piece.split_at(pos);
            if let (Some(&li), Some(&ri)) = (lookup.get(l), lookup.get(r)) {
                local.push(Cand {
                    score: scores[id],
                    left_chars: k,
                    right_chars: total_chars - k,
                    left: li,
                    right: ri,
                });
            }
        }
        local.sort_by_key(|c| (c.left, c.right));
        all.append(&mut local);
    }
    // Stable sort, descending on (score, left length, right length); equal scores (including
    // -0.0 against 0.0) keep their order, as Python's sorted(reverse=True) does.
    all.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(b.left_chars.cmp(&a.left_chars))
            .then(b.right_chars.cmp(&a.right_chars))
    });
    all.into_iter()
        .map(|c| {
            (
                pieces[c.left as usize].clone(),
                pieces[c.right as usize].clone(),
            )
        })
        .collect()
}

pub(crate) fn build(v: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let pieces = pieces(v);
    let mut lookup: HashMap<&str, u32> = HashMap::with_capacity(pieces.len() + 1);
    for (i, p) in pieces.iter().enumerate() {
        lookup.entry(p.as_str()).or_insert(i as u32);
    }
    // HF's Gemma converter: a vocabulary without "\t" reaches tabs through the "<0x09>" piece.
    let tab_alias = (!lookup.contains_key("\t"))
        .then(|| lookup.get("<0x09>").copied())
        .flatten();
    if let Some(id) = tab_alias {
        lookup.insert("\t", id);
    }
    let mut merge_pieces = pieces.clone();
    let mut merge_scores = merge_scores(v);
    if let Some(id) = tab_alias {
        merge_pieces.push("\t".into());
        merge_scores.push(merge_scores[id as usize]);
    }
    let merges = derive_merges(&merge_pieces, &lookup, &merge_scores);

    let vocab: tokenizers::models::bpe::Vocab = lookup
        .iter()
        .map(|(p, &id)| ((*p).to_string(), id))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true);
    if let Some(unk) = v.unk_id {
        builder = builder
            .unk_token(pieces[unk as usize].clone())
            .fuse_unk(true);
    }
    let model = builder.build().map_err(err)?;

    let mut tok = tokenizers::Tokenizer::new(model);
    // Gemma 3 stores add_space_prefix = false (no dummy prefix, as its tokenizer.json);
    // SentencePiece's default, and llama.cpp's when the key is absent, is true.
    let add_prefix = v.add_space_prefix.unwrap_or(true);
    let replace: NormalizerWrapper = Replace::new(" ", "\u{2581}").map_err(err)?.into();
    let normalizer = if add_prefix {
        NormalizerSequence::new(vec![Prepend::new(SPACE.to_string()).into(), replace]).into()
    } else {
        replace
    };
    tok.with_normalizer(Some::<NormalizerWrapper>(normalizer));
    let mut decoders: Vec<DecoderWrapper> = vec![
        tokenizers::decoders::DecoderWrapper::Replace(Replace::new("\u{2581}", " ").map_err(err)?),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tok.with_decoder(Some(DecoderSequence::new(decoders)));
    let add_bos = v.add_bos.unwrap_or(true);
    let add_eos = v.add_eos.unwrap_or(false);
    tok.with_post_processor(post_processor(
        &pieces, v.bos_id, v.eos_id, add_bos, add_eos,
    )?);

    // Control pieces are special (skipped by decode(skip_special)), user-defined ones are not;
    // both are matched whole in the raw text, as HF's SentencePiece extractor adds them.
    let (mut special, mut user) = (Vec::new(), Vec::new());
    for (i, p) in pieces.iter().enumerate() {
        match v.token_type(i) {
            TokenType::Control | TokenType::Unknown => {
                special.push(AddedToken::from(p.clone(), true).normalized(false))
            }
            TokenType::UserDefined => {
                user.push(AddedToken::from(p.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    tok.add_special_tokens(&special);
    tok.add_tokens(&user);
    Ok(tok)
}
