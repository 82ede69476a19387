//! Caller text stays text: the strings of a chat request (message content, names, tool results,
//! tool arguments, documents) must not become control tokens when the prompt is tokenized,
//! whatever they contain. The chat path inserts a mark (a Unicode noncharacter absent from the
//! request) inside every control-token string of the caller's text before the template renders
//! it, and [`Tokenizer::encode_marked`] takes the rendered prompt's control tokens only where
//! the template wrote them: a marked string is tokenized as the ordinary text it is, as the
//! tokenizer would tokenize it with that added token removed from its vocabulary.
//!
//! Which added tokens are control tokens: every special one, and every other one except those
//! that are text a vocabulary merely keeps whole: runs of whitespace (Gemma's `\n\n`, `▁▁`) and
//! HTML tags (Gemma's `<table>`, `</td>`), unless a chat dialect uses the tag as markup (Qwen's
//! `<think>`, `<tool_call>`, `<tool_response>`). Splitting those text tokens would tokenize
//! documents unlike the model's training and protect nothing.

use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};

use super::{Tokenizer, TokenizerError};

/// Tags the chat dialects use as markup even where a vocabulary does not mark them special.
pub const MARKUP_TAGS: &[&str] = &[
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<start_of_turn>",
    "<end_of_turn>",
];

/// Unicode noncharacters (U+FDD0..U+FDEF): permanently reserved for a program's own use, the
/// candidates for the mark.
const MARKS: std::ops::RangeInclusive<u32> = 0xFDD0..=0xFDEF;

/// An added token's string is text a vocabulary keeps whole (see the module doc).
pub fn text_like(content: &str, special: bool) -> bool {
    if special || content.is_empty() || MARKUP_TAGS.contains(&content) {
        return false;
    }
    let whitespace = content.chars().all(|c| c.is_whitespace() || c == '▁');
    let html_tag = content.len() > 2
        && content.starts_with('<')
        && content.ends_with('>')
        && content[1..content.len() - 1]
            .trim_start_matches('/')
            .chars()
            .all(|c| c.is_ascii_alphanumeric())
        && !content.starts_with("<unused");
    whitespace || html_tag
}

/// The mark in generated text (see [`OutputGuard`]); a noncharacter, so a model writes it only
/// through byte tokens, and consumers of generated text drop it ([`strip_output_mark`]).
pub const OUTPUT_MARK: char = '\u{FDEF}';

/// Generated text without [`OUTPUT_MARK`].
pub fn strip_output_mark(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains(OUTPUT_MARK) {
        s.chars()
            .filter(|&c| c != OUTPUT_MARK)
            .collect::<String>()
            .into()
    } else {
        s.into()
    }
}

/// Everything the text-safe encodings need, built once per tokenizer (on first use).
pub(crate) struct TextIndex {
    /// Every added token (leftmost-longest, as the tokenizer matches them).
    all: AhoCorasick,
    all_ids: Vec<u32>,
    /// The control tokens (not [`text_like`]), the strings marked inside caller text.
    control: AhoCorasick,
    /// The tokenizer without its control tokens (the text-like ones kept).
    plain: tokenizers::Tokenizer,
    /// Ids of the control tokens.
    control_ids: std::collections::HashSet<u32>,
    /// Bytes of the longest control-token string.
    control_max: usize,
    /// What `encode(_, true)` puts around a sequence (BOS ...).
    prefix: Vec<u32>,
    suffix: Vec<u32>,
}

fn err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Codec(e.to_string())
}

impl TextIndex {
    pub(crate) fn build(inner: &tokenizers::Tokenizer) -> Result<TextIndex, TokenizerError> {
        let mut added: Vec<(u32, tokenizers::AddedToken)> =
            inner.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        let ac = |pats: &[&str]| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(pats)
                .map_err(err)
        };
        let all_pats: Vec<&str> = added.iter().map(|(_, t)| t.content.as_str()).collect();
        let control: Vec<&(u32, tokenizers::AddedToken)> = added
            .iter()
            .filter(|(_, t)| !text_like(&t.content, t.special))
            .collect();
        let control_pats: Vec<&str> = control.iter().map(|(_, t)| t.content.as_str()).collect();
        // the tokenizer as it would be without its control tokens
        let mut json: serde_json::Value =
            serde_json::from_str(&inner.to_string(false).map_err(err)?).map_err(err)?;
        if let Some(list) = json.get_mut("added_tokens").and_then(|a| a.as_array_mut()) {
            list.retain(|t| {
                let content = t.get("content").and_then(|c| c.as_str()).unwrap_or("");
                let special = t.get("special").and_then(|s| s.as_bool()).unwrap_or(false);
                text_like(content, special)
            });
        }
        let plain: tokenizers::Tokenizer = json.to_string().parse().map_err(err)?;
        // the post-processor's additions around one sequence, from a probe
        let with = inner.encode("a", true).map_err(err)?.get_ids().to_vec();
        let bare = inner.encode("a", false).map_err(err)?.get_ids().to_vec();
        let at = with
            .windows(bare.len().max(1))
            .position(|w| w == bare.as_slice())
            .unwrap_or(0);
        Ok(TextIndex {
            all: ac(&all_pats)?,
            all_ids: added.iter().map(|(id, _)| *id).collect(),
            control: ac(&control_pats)?,
            plain,
            control_ids: control.iter().map(|(id, _)| *id).collect(),
            control_max: control_pats.iter().map(|p| p.len()).max().unwrap_or(0),
            prefix: with[..at].to_vec(),
            suffix: with[(at + bare.len()).min(with.len())..].to_vec(),
        })
    }
}

impl Tokenizer {
    pub(crate) fn text_index(&self) -> Result<&TextIndex, TokenizerError> {
        self.text
            .get_or_init(|| {
                TextIndex::build(&self.inner)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map(|i| i.as_ref())
            .map_err(|e| TokenizerError::Codec(e.clone()))
    }

    /// `text` tokenized as text: no control token comes out of it (the strings of control
    /// tokens it holds become ordinary tokens). `add_special`: BOS etc. around it as
    /// [`Tokenizer::encode`] adds them.
    pub fn encode_text(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let ix = self.text_index()?;
        let ids = ix
            .plain
            .encode(text, false)
            .map_err(err)?
            .get_ids()
            .to_vec();
        Ok(if add_special {
            [ix.prefix.as_slice(), &ids, &ix.suffix].concat()
        } else {
            ids
        })
    }

    /// A mark for `texts`: a Unicode noncharacter none of them holds (None when every candidate
    /// occurs, which no real request does).
    pub fn pick_mark<'a>(&self, texts: impl IntoIterator<Item = &'a str> + Clone) -> Option<char> {
        MARKS
            .filter_map(char::from_u32)
            .find(|&m| texts.clone().into_iter().all(|t| !t.contains(m)))
    }

    /// `text` with `mark` inserted after the first character of every control-token string in
    /// it but those in `keep`, so that none of them is one any more (repeated until none is
    /// left: a string whose marking forms another is marked again).
    pub fn mark_text(
        &self,
        text: &str,
        mark: char,
        keep: &[&str],
    ) -> Result<String, TokenizerError> {
        let ix = self.text_index()?;
        let mut s = text.to_string();
        loop {
            let mut out = String::with_capacity(s.len() + 8);
            let mut last = 0;
            for m in ix.control.find_iter(&s) {
                if keep.contains(&&s[m.start()..m.end()]) {
                    continue;
                }
                let first = s[m.start()..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&s[last..m.start() + first]);
                out.push(mark);
                last = m.start() + first;
            }
            if last == 0 {
                return Ok(s);
            }
            out.push_str(&s[last..]);
            s = out;
        }
    }

    /// A prompt in which caller text was marked ([`Tokenizer::mark_text`]): its added tokens
    /// where they are whole (the template's markup, and caller text's text-like tokens), the
    /// rest tokenized as text with the marks removed. Without a mark in it, exactly
    /// [`Tokenizer::encode`].
    pub fn encode_marked(
        &self,
        text: &str,
        mark: char,
        add_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if !text.contains(mark) {
            return self.encode(text, add_special);
        }
        let ix = self.text_index()?;
        let mut ids = if add_special {
            ix.prefix.clone()
        } else {
            Vec::new()
        };
        let gap = |ids: &mut Vec<u32>, s: &str| -> Result<(), TokenizerError> {
            let s: String = s.chars().filter(|&c| c != mark).collect();
            if !s.is_empty() {
                ids.extend_from_slice(ix.plain.encode(s, false).map_err(err)?.get_ids());
            }
            Ok(())
        };
        let mut last = 0;
        for m in ix.all.find_iter(text) {
            gap(&mut ids, &text[last..m.start()])?;
            ids.push(ix.all_ids[m.pattern().as_usize()]);
            last = m.end();
        }
        gap(&mut ids, &text[last..])?;
        if add_special {
            ids.extend_from_slice(&ix.suffix);
        }
        Ok(ids)
    }
}

/// Marks, in generated text, the control-token strings the model wrote as ordinary tokens (a
/// model quoting `</tool_call>` inside a tool argument, say), so that the output parsers, which
/// act on whole markers, act only on control tokens the model produced as such: every such
/// string gets [`OUTPUT_MARK`] inside it (at the join with the text before it, when it spans
/// two pieces). Feed it each generated token's text in order.
pub struct OutputGuard {
    tok: Tokenizer,
    /// The end of the ordinary text since the last control token (already marked).
    tail: String,
}

impl OutputGuard {
    pub fn new(tok: &Tokenizer) -> Self {
        OutputGuard {
            tok: tok.clone(),
            tail: String::new(),
        }
    }

    /// The text `piece` of token `id` as it goes on: a control token's unchanged, an ordinary
    /// token's with the control strings it completes marked.
    pub fn piece(&mut self, id: u32, piece: String) -> String {
        let Ok(ix) = self.tok.text_index() else {
            return piece;
        };
        if ix.control_ids.contains(&id) {
            self.tail.clear();
            return piece;
        }
        if ix.control_max == 0 || piece.is_empty() {
            return piece;
        }
        let mut out = piece;
        loop {
            let joined = format!("{}{}", self.tail, out);
            let at = self.tail.len();
            let Some(m) = ix.control.find_iter(&joined).find(|m| m.end() > at) else {
                break;
            };
            let pos = if m.start() < at {
                0 // spans the join: the mark goes between the two pieces
            } else {
                let first = joined[m.start()..].chars().next().map_or(1, char::len_utf8);
                m.start() - at + first
            };
            out.insert(pos, OUTPUT_MARK);
        }
        self.tail.push_str(&out);
        // keep what a control string could still end in (at most its length less one byte)
        let keep = ix.control_max.saturating_sub(1);
        if self.tail.len() > keep {
            let mut cut = self.tail.len() - keep;
            while !self.tail.is_char_boundary(cut) {
                cut += 1;
            }
            self.tail.drain(..cut);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_like_tokens() {
        for t in ["\n", "\n\n", "▁▁▁", "<table>", "</td>", "<h1>"] {
            assert!(text_like(t, false), "{t:?}");
        }
        for t in [
            "<think>",
            "</tool_call>",
            "<|im_start|>",
            "<|\"|>",
            "<unused3>",
            "[multimodal]",
            "<end_of_turn>",
        ] {
            assert!(!text_like(t, false), "{t:?}");
        }
        assert!(!text_like("<table>", true), "a special token is never text");
    }
}
