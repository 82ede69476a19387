//! Special tokens of a tokenizer.json folder: names from tokenizer_config.json, ids from
//! generation_config.json and config.json (top level or text_config), end-of-turn markers.

use fucina::tokenizer::Tokenizer;

/// A small WordLevel tokenizer.json: ids 0..6 for the words below, 3..6 added as special.
fn write_tokenizer(dir: &std::path::Path) {
    let words = [
        "a",
        "b",
        "<unk>",
        "<s>",
        "</s>",
        "<|im_end|>",
        "<end_of_turn>",
    ];
    let vocab: serde_json::Map<String, serde_json::Value> = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i.into()))
        .collect();
    let added: Vec<serde_json::Value> = (3..7)
        .map(|i| {
            serde_json::json!({"id": i, "content": words[i], "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": i != 6})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
}

#[test]
fn special_tokens_from_config_files() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    // Nothing beside it: only the special end-of-turn marker (<|im_end|>; <end_of_turn> here
    // is not special, so it does not count).
    let t = Tokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
    assert_eq!(
        (t.special.bos, t.special.eos.clone(), t.special.pad),
        (None, vec![5], None)
    );

    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "pad_token": null}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [4, 1]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"text_config": {"eos_token_id": 0, "pad_token_id": 2}}"#,
    )
    .unwrap();
    let t = Tokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
    assert_eq!(t.special.bos, Some(3));
    assert_eq!(t.special.eos, vec![4, 1, 0, 5]);
    assert_eq!(t.special.pad, Some(2));
}

#[test]
fn broken_tokenizer_json_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tokenizer.json");
    std::fs::write(&p, "{not json").unwrap();
    let e = Tokenizer::from_file(&p).err().unwrap();
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
}
