//! tiktoken BPE rank files (`<base64 token> <rank>` per line; Qwen3.5/3.6 ship their
//! vocabulary this way) built into the same byte-level BPE as a GGUF `gpt2` vocabulary: tokens
//! in GPT-2's byte-to-character alphabet, merges derived from the ranks.

use std::collections::HashMap;
use std::path::Path;

use super::vocab::{GgufVocab, TokenType};
use super::{Tokenizer, TokenizerError};

/// Qwen3.5/3.6's special tokens, numbered from 248044 after the 248044 ranks.
pub const QWEN35_SPECIAL_TOKENS: [&str; 33] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
];

/// GPT-2's reversible byte -> character map used by byte-level BPE vocabularies.
pub fn byte_to_char() -> [char; 256] {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        out[b as usize] = if printable(b) {
            char::from_u32(b).unwrap_or('\0')
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    out
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=').as_bytes();
    if s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= val(c)? << (18 - 6 * i);
        }
        let n = chunk.len() - 1;
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    Some(out)
}

/// Parses a rank file into tokens indexed by rank (ranks must be dense from 0).
pub fn parse_ranks(text: &str) -> Result<Vec<Vec<u8>>, TokenizerError> {
    let bad = |n: usize, msg: &str| TokenizerError::Vocab(format!("tiktoken line {n}: {msg}"));
    let mut by_rank: Vec<Option<Vec<u8>>> = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let mut parts = line.split_whitespace();
        let (Some(tok), Some(rank), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad(n + 1, "expected `<base64> <rank>`"));
        };
        let bytes = base64_decode(tok).ok_or_else(|| bad(n + 1, "bad base64"))?;
        let rank: usize = rank.parse().map_err(|_| bad(n + 1, "bad rank"))?;
        if rank >= 1 << 22 {
            return Err(bad(n + 1, "rank out of range"));
        }
        if by_rank.len() <= rank {
            by_rank.resize(rank + 1, None);
        }
        if by_rank[rank].replace(bytes).is_some() {
            return Err(bad(n + 1, "duplicate rank"));
        }
    }
    by_rank
        .into_iter()
        .enumerate()
        .map(|(r, t)| t.ok_or_else(|| TokenizerError::Vocab(format!("tiktoken rank {r} missing"))))
        .collect()
}

/// Merges that reproduce tiktoken's "merge the lowest-ranked adjacent pair" on the ranks:
/// every split of a token into two tokens, ordered by the token's rank, then the parts' ranks.
pub fn derive_merges(tokens: &[Vec<u8>]) -> Vec<(usize, usize)> {
    let rank: HashMap<&[u8], usize> = tokens
        .iter()
        .enumerate()
        .map(|(r, t)| (t.as_slice(), r))
        .collect();
    let mut merges = Vec::new();
    let mut local = Vec::new();
    for tok in tokens.iter().filter(|t| t.len() > 1) {
        local.clear();
        for i in 1..tok.len() {
            if let (Some(&l), Some(&r)) = (rank.get(&tok[..i]), rank.get(&tok[i..])) {
                local.push((l, r));
            }
        }
        local.sort_unstable();
        merges.extend_from_slice(&local);
    }
    merges
}

impl Tokenizer {
    /// A tiktoken rank file with `specials` numbered after the ranks, split by the pattern
    /// `pre` names (as `tokenizer.ggml.pre`: "qwen35", "qwen2", ...).
    pub fn from_tiktoken(
        path: &Path,
        pre: &str,
        specials: &[&str],
    ) -> Result<Self, TokenizerError> {
        let text = std::fs::read_to_string(path).map_err(|e| TokenizerError::Load {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        let ranks = parse_ranks(&text)?;
        let map = byte_to_char();
        let show = |b: &[u8]| -> String { b.iter().map(|&x| map[x as usize]).collect() };
        let mut tokens: Vec<String> = ranks.iter().map(|t| show(t)).collect();
        let merges = derive_merges(&ranks)
            .into_iter()
            .map(|(l, r)| format!("{} {}", tokens[l], tokens[r]))
            .collect();
        let mut types = vec![TokenType::Normal; tokens.len()];
        for s in specials {
            tokens.push(s.to_string());
            // As in Qwen's tokenizer.json: `<|...|>` markers are special, tags like <think> not.
            types.push(if s.starts_with("<|") {
                TokenType::Control
            } else {
                TokenType::UserDefined
            });
        }
        let id_of = |name: &str| tokens.iter().rposition(|t| t == name).map(|i| i as u32);
        let vocab = GgufVocab {
            model: "gpt2".into(),
            pre: Some(pre.into()),
            eos_id: id_of("<|im_end|>").or_else(|| id_of("<|endoftext|>")),
            pad_id: id_of("<|endoftext|>"),
            add_bos: Some(false),
            token_types: Some(types),
            merges: Some(merges),
            tokens,
            ..GgufVocab::default()
        };
        Self::from_gguf_vocab(&vocab)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_encodings() {
        // RFC 4648 test vectors.
        for (enc, dec) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(base64_decode(enc).unwrap(), dec.as_bytes(), "{enc}");
        }
        assert!(base64_decode("Z").is_none());
        assert!(base64_decode("Z!==").is_none());
    }

    #[test]
    fn byte_map_is_gpt2s() {
        let m = byte_to_char();
        assert_eq!(m[b' ' as usize], '\u{120}'); // "Ġ"
        assert_eq!(m[b'\n' as usize], '\u{10a}'); // "Ċ"
        assert_eq!(m[b'a' as usize], 'a');
        let mut all: Vec<char> = m.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn bad_rank_files_are_errors() {
        assert!(parse_ranks("YQ== 0\nYg== 2\n").is_err()); // rank 1 missing
        assert!(parse_ranks("YQ== 0\nYg== 0\n").is_err());
        assert!(parse_ranks("YQ==\n").is_err());
        assert!(parse_ranks("YQ== x\n").is_err());
        assert_eq!(parse_ranks("YQ== 0\nYg== 1\nYWI= 2\n").unwrap().len(), 3);
        let toks = parse_ranks("YQ== 0\nYg== 1\nYWI= 2\n").unwrap();
        assert_eq!(derive_merges(&toks), vec![(0, 1)]);
    }
}
