//! Incremental detokenisation that never splits a UTF-8 character or a merged piece: text for
//! the ids pushed so far is released only when decoding it is stable (no trailing U+FFFD).
//!
//! (Used until the tokenizer module's `StreamDecoder` is wired in; same contract.)

use std::sync::Arc;

use crate::tokenizer::Tokenizer;

/// How many already-emitted ids are re-decoded as left context (word-boundary handling of
/// SentencePiece / byte-level decoders depends on the previous piece).
const CONTEXT_IDS: usize = 6;

pub struct IncrementalDecoder {
    tok: Arc<Tokenizer>,
    ids: Vec<u32>,
    /// Start of the window re-decoded each step.
    prefix: usize,
    /// ids[..read] are fully emitted.
    read: usize,
    skip_special: bool,
}

impl IncrementalDecoder {
    pub fn new(tok: Arc<Tokenizer>, skip_special: bool) -> Self {
        Self {
            tok,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
            skip_special,
        }
    }

    /// Add a token; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.ids.push(id);
        let after = self.decode(self.prefix, self.ids.len());
        if after.ends_with('\u{FFFD}') {
            return String::new();
        }
        let before = self.decode(self.prefix, self.read);
        let new = tail_after(&after, &before);
        self.read = self.ids.len();
        self.prefix = self.read.saturating_sub(CONTEXT_IDS);
        new
    }

    /// Whatever is still held back (an incomplete character at the very end).
    pub fn flush(&mut self) -> String {
        let before = self.decode(self.prefix, self.read);
        let after = self.decode(self.prefix, self.ids.len());
        self.read = self.ids.len();
        tail_after(&after, &before)
    }

    fn decode(&self, a: usize, b: usize) -> String {
        if a >= b {
            return String::new();
        }
        self.tok
            .decode(&self.ids[a..b], self.skip_special)
            .unwrap_or_default()
    }
}

/// The part of `after` beyond `before` (cut on a char boundary).
fn tail_after(after: &str, before: &str) -> String {
    let mut n = before.len().min(after.len());
    while !after.is_char_boundary(n) {
        n -= 1;
    }
    after[n..].to_string()
}
