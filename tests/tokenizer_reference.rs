//! Real tokenizer.json files (Qwen3, Gemma 3) against the ids HF `tokenizers` gives for the
//! committed corpus (golden/tokenizer/reference.json, made by make_reference.py), decode
//! round-trips, streaming, and special tokens read from the files beside them.

mod tokenizer_support;

use fucina::tokenizer::Tokenizer;
use tokenizer_support::{agreement, asset, check_stream, Reference};

fn check_tokenizer_json(name: &str) -> Tokenizer {
    let r = Reference::load();
    let tok = Tokenizer::from_file(&asset(&format!("{name}/tokenizer.json"))).unwrap();
    let (agree, bad) = agreement(&format!("{name} tokenizer.json"), &tok, &r, name);
    assert!(
        bad.is_empty(),
        "{name}: {agree}/{} agree; differing cases {bad:?}",
        r.cases.len()
    );
    // decode(encode(x)) is HF's decode, and gives back the text (the BOS aside).
    let decoded = r.decoded(name);
    for (i, ids) in r.ids(name).iter().enumerate() {
        assert_eq!(
            tok.decode(ids, false).unwrap(),
            decoded[i],
            "{name}: decode of case {i}"
        );
        let plain = tok.encode(&r.cases[i], false).unwrap();
        let back = tok.decode(&plain, false).unwrap();
        // Gemma gives the text back (a literal "▁" is its space symbol and comes back as a
        // space); Qwen gives back its NFC form, which is HF's decode (no special tokens added).
        let want = match name {
            "gemma3" => r.cases[i].replace('\u{2581}', " "),
            _ => decoded[i].clone(),
        };
        assert_eq!(back, want, "{name}: round trip of case {i}");
    }
    check_stream(&tok, &r.ids(name));
    tok
}

#[test]
fn qwen3_tokenizer_json_matches_hf() {
    let tok = check_tokenizer_json("qwen3");
    // tokenizer_config.json: eos "<|im_end|>", pad "<|endoftext|>", no BOS.
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let eot = tok.token_to_id("<|endoftext|>").unwrap();
    assert_eq!(tok.special.bos, None);
    assert_eq!(tok.special.eos[0], im_end);
    assert!(tok.special.eos.contains(&eot));
    assert_eq!(tok.special.pad, Some(eot));
}

#[test]
fn gemma3_tokenizer_json_matches_hf() {
    let tok = check_tokenizer_json("gemma3");
    // tokenizer_config.json: bos "<bos>", eos "<end_of_turn>", pad "<pad>"; "<eos>" also ends.
    assert_eq!(tok.special.bos, tok.token_to_id("<bos>"));
    assert_eq!(
        tok.special.eos[0],
        tok.token_to_id("<end_of_turn>").unwrap()
    );
    assert!(tok.special.eos.contains(&tok.token_to_id("<eos>").unwrap()));
    assert_eq!(tok.special.pad, tok.token_to_id("<pad>"));
}
