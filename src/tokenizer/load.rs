//! Finding a checkpoint's tokenizer: an explicit override, tokenizer.json beside the weights,
//! else the vocabulary inside the GGUF.

use std::path::Path;

use super::{GgufVocab, Tokenizer, TokenizerError};
use crate::gguf::GgufFile;
use crate::weights::Checkpoint;

impl Tokenizer {
    /// The vocabulary inside a GGUF file.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, TokenizerError> {
        Self::from_gguf_vocab(&GgufVocab::from_gguf(g)?)
    }
}

fn load_path(path: &Path) -> Result<Tokenizer, TokenizerError> {
    let load_err = |msg: String| TokenizerError::Load {
        path: path.display().to_string(),
        msg,
    };
    if path.is_dir() {
        let file = path.join("tokenizer.json");
        if file.is_file() {
            return Tokenizer::from_file(&file);
        }
        return Err(load_err("no tokenizer.json in this folder".into()));
    }
    if !path.is_file() {
        return Err(load_err("no such file or folder".into()));
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        let g = GgufFile::open(path).map_err(|e| load_err(e.to_string()))?;
        return Tokenizer::from_gguf(&g);
    }
    Tokenizer::from_file(path)
}

/// The tokenizer for `ckpt`: `override_path` (a tokenizer.json, a folder holding one, or a
/// GGUF) when given; else tokenizer.json in the checkpoint's folder; else the GGUF's own
/// vocabulary. Special tokens come from the files beside tokenizer.json or the GGUF metadata.
pub fn load_for_checkpoint(
    ckpt: &Checkpoint,
    override_path: Option<&Path>,
) -> Result<Tokenizer, TokenizerError> {
    if let Some(p) = override_path {
        return load_path(p);
    }
    if let Some(file) = ckpt
        .dir()
        .map(|d| d.join("tokenizer.json"))
        .filter(|f| f.is_file())
    {
        tracing::debug!(path = %file.display(), "tokenizer from tokenizer.json");
        return Tokenizer::from_file(&file);
    }
    if let Some(g) = ckpt.gguf() {
        tracing::debug!("tokenizer from the GGUF vocabulary");
        return Tokenizer::from_gguf(g);
    }
    Err(TokenizerError::Load {
        path: ckpt
            .dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
        msg: "no tokenizer.json beside the weights and no GGUF vocabulary; pass --tokenizer".into(),
    })
}
