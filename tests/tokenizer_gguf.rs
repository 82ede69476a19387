//! Vocabularies inside GGUF files built into tokenizers, against HF `tokenizers` ids:
//! the real Gemma 3 270M GGUF (SentencePiece "llama" vocabulary) against the Gemma 3
//! tokenizer.json reference, and Qwen3's vocabulary written into a GGUF the way llama.cpp's
//! converter writes it ("gpt2" + merges + pre "qwen2") against the Qwen3 tokenizer.json reference.

mod tokenizer_support;

use fucina::gguf::GgufFile;
use fucina::tokenizer::{load_for_checkpoint, Tokenizer};
use fucina::weights::Checkpoint;
use serde_json::Value;
use tokenizer_support::{agreement, asset, check_stream, trunc, Reference};

#[test]
fn gemma3_gguf_vocab_matches_hf() {
    let r = Reference::load();
    let g = GgufFile::open(&asset("gemma-3-270m-q4_k_m.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let n_vocab = g.get_array("tokenizer.ggml.tokens").unwrap().len() as u32;
    let (agree, bad) = agreement("gemma3 GGUF vocab", &tok, &r, "gemma3");
    // Cases whose reference holds a token the GGUF vocabulary lacks (tokenizer.json adds
    // <image_soft_token> = 262144 beyond the model's 262144 pieces) cannot match; all others must.
    let want = r.ids("gemma3");
    let unrepresentable: Vec<usize> = (0..r.cases.len())
        .filter(|&i| want[i].iter().any(|&id| id >= n_vocab))
        .collect();
    eprintln!(
        "gemma3 GGUF vocab: {agree}/{} agree; {} cases need ids beyond the GGUF vocabulary: {:?}",
        r.cases.len(),
        unrepresentable.len(),
        unrepresentable
            .iter()
            .map(|&i| trunc(&r.cases[i]))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        bad, unrepresentable,
        "GGUF vocab differs from HF on representable cases"
    );
    assert!(
        unrepresentable.len() <= 2,
        "the corpus must mostly be representable"
    );

    let decoded = r.decoded("gemma3");
    let representable: Vec<Vec<u32>> = (0..r.cases.len())
        .filter(|i| !unrepresentable.contains(i))
        .map(|i| {
            assert_eq!(
                tok.decode(&want[i], false).unwrap(),
                decoded[i],
                "decode of case {i}"
            );
            want[i].clone()
        })
        .collect();
    check_stream(&tok, &representable);

    // Special tokens from the metadata: BOS 2, EOS 1 plus the end-of-turn marker, PAD 0.
    assert_eq!(
        tok.special.bos,
        g.get_u64("tokenizer.ggml.bos_token_id").map(|v| v as u32)
    );
    assert_eq!(tok.special.bos, tok.token_to_id("<bos>"));
    assert_eq!(tok.special.eos[0], tok.token_to_id("<eos>").unwrap());
    assert!(tok
        .special
        .eos
        .contains(&tok.token_to_id("<end_of_turn>").unwrap()));
    assert_eq!(tok.special.pad, tok.token_to_id("<pad>"));
    // Control tokens are special: skipped by decode(skip_special).
    let turn = tok
        .encode("<start_of_turn>user\nhi<end_of_turn>", false)
        .unwrap();
    assert_eq!(turn.first().copied(), tok.token_to_id("<start_of_turn>"));
    assert_eq!(tok.decode(&turn, true).unwrap(), "user\nhi");
}

#[test]
fn load_for_checkpoint_picks_gguf_vocab_or_override() {
    let gguf = asset("gemma-3-270m-q4_k_m.gguf");
    let ckpt = Checkpoint::open(&gguf).unwrap();
    // No tokenizer.json beside the GGUF in the assets folder: the GGUF vocabulary is used.
    assert!(!gguf.parent().unwrap().join("tokenizer.json").exists());
    let from_gguf = load_for_checkpoint(&ckpt, None).unwrap();
    assert_eq!(from_gguf.vocab_size(), 262144);
    // --tokenizer as a folder (Gemma 3 tokenizer.json, with its added <image_soft_token>).
    let over = load_for_checkpoint(&ckpt, Some(&asset("gemma3"))).unwrap();
    assert_eq!(over.vocab_size(), 262145);
    assert_eq!(
        over.special.eos[0],
        over.token_to_id("<end_of_turn>").unwrap()
    );
    let missing = load_for_checkpoint(&ckpt, Some(&asset("gemma3").join("nope.json")));
    assert!(missing.is_err());
}

// ---- a GGUF written here, holding Qwen3's vocabulary as llama.cpp's converter stores it ----

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

enum Kv {
    Str(String),
    U32(u32),
    Bool(bool),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

fn gguf_bytes(kvs: &[(&str, Kv)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_str(&mut b, k);
        match v {
            Kv::Str(s) => {
                b.extend_from_slice(&8u32.to_le_bytes());
                put_str(&mut b, s);
            }
            Kv::U32(x) => {
                b.extend_from_slice(&4u32.to_le_bytes());
                b.extend_from_slice(&x.to_le_bytes());
            }
            Kv::Bool(x) => {
                b.extend_from_slice(&7u32.to_le_bytes());
                b.push(*x as u8);
            }
            Kv::Strs(a) => {
                b.extend_from_slice(&9u32.to_le_bytes());
                b.extend_from_slice(&8u32.to_le_bytes());
                b.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for s in a {
                    put_str(&mut b, s);
                }
            }
            Kv::I32s(a) => {
                b.extend_from_slice(&9u32.to_le_bytes());
                b.extend_from_slice(&5u32.to_le_bytes());
                b.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for x in a {
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
    while b.len() % 32 != 0 {
        b.push(0);
    }
    b
}

/// Qwen3's tokenizer.json as a GGUF: tokens by id (model vocabulary, then added tokens), token
/// types (special added tokens CONTROL = 3, other added tokens USER_DEFINED = 4, NORMAL = 1),
/// merges as "left right", pre "qwen2", EOS <|im_end|>, no BOS added.
fn qwen3_as_gguf() -> GgufFile {
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(asset("qwen3/tokenizer.json")).unwrap())
            .unwrap();
    let vocab = j["model"]["vocab"].as_object().unwrap();
    let added = j["added_tokens"].as_array().unwrap();
    let n = vocab.len() + added.len();
    let mut tokens = vec![String::new(); n];
    let mut types = vec![1i32; n];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    for a in added {
        let id = a["id"].as_u64().unwrap() as usize;
        tokens[id] = a["content"].as_str().unwrap().to_string();
        types[id] = if a["special"].as_bool().unwrap() {
            3
        } else {
            4
        };
    }
    assert!(tokens.iter().all(|t| !t.is_empty()), "Qwen3 ids are dense");
    let merges: Vec<String> = j["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            Value::String(s) => s.clone(),
            _ => panic!("merge {m:?}"),
        })
        .collect();
    let id_of = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
    let (im_end, eot) = (id_of("<|im_end|>"), id_of("<|endoftext|>"));
    let bytes = gguf_bytes(&[
        ("general.architecture", Kv::Str("qwen3".into())),
        ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Kv::Str("qwen2".into())),
        ("tokenizer.ggml.tokens", Kv::Strs(tokens.clone())),
        ("tokenizer.ggml.token_type", Kv::I32s(types)),
        ("tokenizer.ggml.merges", Kv::Strs(merges)),
        ("tokenizer.ggml.eos_token_id", Kv::U32(im_end)),
        ("tokenizer.ggml.padding_token_id", Kv::U32(eot)),
        ("tokenizer.ggml.bos_token_id", Kv::U32(eot)),
        ("tokenizer.ggml.add_bos_token", Kv::Bool(false)),
    ]);
    GgufFile::from_bytes(bytes).unwrap()
}

#[test]
fn qwen3_vocab_in_gguf_matches_hf() {
    let r = Reference::load();
    let g = qwen3_as_gguf();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let (agree, bad) = agreement("qwen3 vocab as GGUF", &tok, &r, "qwen3");
    assert!(
        bad.is_empty(),
        "{agree}/{} agree; differing cases {bad:?}",
        r.cases.len()
    );
    let decoded = r.decoded("qwen3");
    for (i, ids) in r.ids("qwen3").iter().enumerate() {
        assert_eq!(
            tok.decode(ids, false).unwrap(),
            decoded[i],
            "decode of case {i}"
        );
    }
    check_stream(&tok, &r.ids("qwen3"));
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let eot = tok.token_to_id("<|endoftext|>").unwrap();
    assert_eq!(tok.special.eos, vec![im_end, eot]);
    assert_eq!(tok.special.pad, Some(eot));
}

#[test]
fn unsupported_vocab_is_a_typed_error() {
    let bytes = gguf_bytes(&[
        ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Kv::Str("no-such-pre".into())),
        (
            "tokenizer.ggml.tokens",
            Kv::Strs(vec!["a".into(), "b".into(), "ab".into()]),
        ),
        ("tokenizer.ggml.merges", Kv::Strs(vec!["a b".into()])),
    ]);
    let err = Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap())
        .err()
        .unwrap();
    assert!(err.to_string().contains("no-such-pre"), "{err}");
    let bytes = gguf_bytes(&[
        ("tokenizer.ggml.model", Kv::Str("llama".into())),
        ("tokenizer.ggml.tokens", Kv::Strs(vec!["a".into()])),
        ("tokenizer.ggml.bos_token_id", Kv::U32(7)),
    ]);
    let err = Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap())
        .err()
        .unwrap();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    let bytes = gguf_bytes(&[("general.architecture", Kv::Str("gemma3".into()))]);
    assert!(Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).is_err());
}
