//! Shared helpers of the tokenizer tests: the fetched assets, the committed reference ids.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Where `scripts/fetch-assets.sh` put the real assets; a missing one fails the test.
pub fn asset(rel: &str) -> PathBuf {
    let dir = std::env::var_os("FUCINA_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/assets"));
    let path = dir.join(rel);
    assert!(
        path.exists(),
        "test asset {} is missing: run `scripts/fetch-assets.sh {}` (or set FUCINA_TEST_ASSETS)",
        path.display(),
        dir.display()
    );
    path
}

pub fn golden(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden/tokenizer")
        .join(rel)
}

pub struct Reference {
    pub cases: Vec<String>,
    pub json: Value,
}

impl Reference {
    /// reference.json, checked to belong to the committed corpus.
    pub fn load() -> Self {
        let corpus = std::fs::read_to_string(golden("corpus.txt")).expect("corpus.txt");
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(golden("reference.json")).unwrap())
                .expect("reference.json");
        let sha = format!("{:x}", Sha256::digest(corpus.as_bytes()));
        assert_eq!(
            json["corpus_sha256"].as_str(),
            Some(sha.as_str()),
            "corpus.txt changed: rerun golden/tokenizer/make_reference.py"
        );
        // The cases rule of make_reference.py: non-empty lines, the empty string, the file.
        let mut cases: Vec<String> = corpus
            .split('\n')
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        cases.push(String::new());
        cases.push(corpus.clone());
        let stored: Vec<String> = json["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect();
        assert_eq!(cases, stored, "reference.json cases differ from corpus.txt");
        Self { cases, json }
    }

    pub fn ids(&self, tokenizer: &str) -> Vec<Vec<u32>> {
        self.json["tokenizers"][tokenizer]["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ids| {
                ids.as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i.as_u64().unwrap() as u32)
                    .collect()
            })
            .collect()
    }

    pub fn decoded(&self, tokenizer: &str) -> Vec<String> {
        self.json["tokenizers"][tokenizer]["decoded"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    }
}

/// Encodes every case, prints the agreement count and every disagreement; returns the count.
pub fn agreement(
    name: &str,
    tok: &fucina::tokenizer::Tokenizer,
    r: &Reference,
    reference: &str,
) -> (usize, Vec<usize>) {
    let want = r.ids(reference);
    let mut agree = 0;
    let mut bad = Vec::new();
    for (i, case) in r.cases.iter().enumerate() {
        let got = tok.encode(case, true).unwrap();
        if got == want[i] {
            agree += 1;
        } else {
            eprintln!(
                "{name}: case {i} {:?}\n  got  {:?}\n  want {:?}",
                trunc(case),
                got,
                want[i]
            );
            bad.push(i);
        }
    }
    eprintln!(
        "{name}: {agree}/{} cases agree with reference.json \"{reference}\"",
        r.cases.len()
    );
    (agree, bad)
}

pub fn trunc(s: &str) -> String {
    s.chars().take(60).collect()
}

/// Streams every reference id sequence through `StreamDecoder`: the pieces concatenate to the
/// full decode, and no piece carries a replacement character the full text does not have.
/// Fails unless some id was held back (a character split over ids was met).
pub fn check_stream(tok: &fucina::tokenizer::Tokenizer, all_ids: &[Vec<u32>]) {
    let mut held = 0;
    for ids in all_ids {
        let full = tok.decode(ids, false).unwrap();
        let mut dec = fucina::tokenizer::StreamDecoder::new(tok, false);
        let mut out = String::new();
        for &id in ids {
            let piece = dec.push(id).unwrap();
            let partial = tok.decode(dec.ids(), false).unwrap().ends_with('\u{FFFD}');
            held += partial as usize;
            if let Some(piece) = piece {
                assert!(
                    !piece.contains('\u{FFFD}') || full.contains('\u{FFFD}'),
                    "partial character emitted: {piece:?}"
                );
                out.push_str(&piece);
            }
        }
        if let Some(rest) = dec.finish().unwrap() {
            out.push_str(&rest);
        }
        assert_eq!(out, full, "streamed text differs from the full decode");
    }
    assert!(
        held > 0,
        "no id ended inside a character: the hold-back path went untested"
    );
}
