//! Incremental detokenisation that never emits part of a character.
//!
//! Each push decodes a short window of ids twice (without and with the new id) and emits the
//! difference once the window's text no longer ends in U+FFFD, the replacement character both
//! byte-level and byte-fallback decoders produce for an incomplete UTF-8 sequence. Decoding a
//! window rather than single ids keeps what depends on neighbours right: SentencePiece's
//! leading-space strip, byte-fallback runs, byte-level pieces split inside a character.

use super::{Tokenizer, TokenizerError};

pub struct StreamDecoder {
    tok: Tokenizer,
    skip_special: bool,
    ids: Vec<u32>,
    /// Start of the window whose text has already been emitted up to `read_offset`.
    prefix_offset: usize,
    read_offset: usize,
}

impl StreamDecoder {
    /// `tok` is cheap to clone (shared inside). `skip_special` drops special tokens' text.
    pub fn new(tok: &Tokenizer, skip_special: bool) -> Self {
        Self {
            tok: tok.clone(),
            skip_special,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds one id; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let prefix = self.tok.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let full = self
            .tok
            .decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let new = match full.strip_prefix(prefix.as_str()) {
            Some(rest) => rest.to_string(),
            // A decoder that rewrote earlier text: emit from the first differing character.
            None => {
                let common: usize = prefix
                    .chars()
                    .zip(full.chars())
                    .take_while(|(a, b)| a == b)
                    .map(|(a, _)| a.len_utf8())
                    .sum();
                full[common..].to_string()
            }
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok((!new.is_empty()).then_some(new))
    }

    /// Text still held back (an incomplete character at the end of the stream), replaced by
    /// U+FFFD as a full decode would show it. Resets nothing: call it once, at the end.
    pub fn finish(&mut self) -> Result<Option<String>, TokenizerError> {
        let prefix = self.tok.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let full = self
            .tok
            .decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        let rest = full.strip_prefix(prefix.as_str()).unwrap_or("");
        Ok((!rest.is_empty()).then(|| rest.to_string()))
    }

    /// Every id pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}
