//! Special tokens of an HF tokenizer folder: `tokenizer_config.json` names them as strings,
//! `generation_config.json` and `config.json` by id (the EOS as one id or a list).

use std::path::Path;

use serde_json::Value;

use super::vocab::END_OF_GENERATION_MARKERS;
use super::SpecialTokens;

fn read_json(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// `"<bos>"` or `{"content": "<bos>", ...}`.
fn token_name(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content").and_then(Value::as_str),
        _ => None,
    }
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .into_iter()
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Looks a key up at the top level, then in `text_config` (multimodal wrappers).
fn config_key<'a>(cfg: &'a Value, key: &str) -> Option<&'a Value> {
    cfg.get(key).filter(|v| !v.is_null()).or_else(|| {
        cfg.get("text_config")
            .and_then(|t| t.get(key))
            .filter(|v| !v.is_null())
    })
}

/// Special tokens for `tok`, loaded from `dir` (the folder of tokenizer.json), if given.
pub(crate) fn from_hf_dir(tok: &tokenizers::Tokenizer, dir: Option<&Path>) -> SpecialTokens {
    let mut out = SpecialTokens::default();
    let mut eos: Vec<u32> = Vec::new();
    let push = |eos: &mut Vec<u32>, id: u32| {
        if !eos.contains(&id) {
            eos.push(id);
        }
    };
    let files = |name: &str| dir.and_then(|d| read_json(&d.join(name)));
    let tcfg = files("tokenizer_config.json");
    let gcfg = files("generation_config.json");
    let mcfg = files("config.json");

    let by_name = |key: &str| -> Option<u32> {
        let v = tcfg.as_ref()?.get(key)?;
        tok.token_to_id(token_name(v)?)
    };
    out.bos = by_name("bos_token");
    out.pad = by_name("pad_token");
    if let Some(id) = by_name("eos_token") {
        push(&mut eos, id);
    }
    for cfg in [&gcfg, &mcfg].into_iter().flatten() {
        out.bos = out
            .bos
            .or_else(|| ids(config_key(cfg, "bos_token_id")).first().copied());
        out.pad = out
            .pad
            .or_else(|| ids(config_key(cfg, "pad_token_id")).first().copied());
        for id in ids(config_key(cfg, "eos_token_id")) {
            push(&mut eos, id);
        }
    }
    // A BOS the post-processor adds is the BOS, whatever the config files say.
    if out.bos.is_none() {
        out.bos = post_processor_bos(tok);
    }
    // End-of-turn markers end generation too (llama.cpp's rule), when they are special tokens.
    let added = tok.get_added_tokens_decoder();
    for marker in END_OF_GENERATION_MARKERS {
        if let Some(id) = tok.token_to_id(marker) {
            if added.get(&id).is_some_and(|t| t.special) {
                push(&mut eos, id);
            }
        }
    }
    out.eos = eos;
    out
}

/// The first special token the post-processor puts before a single sequence, if any.
fn post_processor_bos(tok: &tokenizers::Tokenizer) -> Option<u32> {
    let pp = tok.get_post_processor()?;
    let enc = tokenizers::Encoding::default();
    let out = tokenizers::PostProcessor::process(pp, enc, None, true).ok()?;
    let first = *out.get_ids().first()?;
    (out.get_special_tokens_mask().first() == Some(&1)).then_some(first)
}
