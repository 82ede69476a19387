//! The real Qwen3 and Gemma 3 chat templates rendered by fucina's minijinja environment must
//! equal, byte for byte, what transformers' `apply_chat_template` renders for the same
//! conversations (golden/chat/*.json, produced by golden/chat/make_reference.py). The built-in
//! templates are held to the same references.

use std::path::PathBuf;

use fucina::chat::source::from_tokenizer_config;
use fucina::chat::{builtin, ChatError, ChatTemplate, RenderInput};
use serde_json::Value;

fn assets() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("FUCINA_TEST_ASSETS") {
        Some(p) => PathBuf::from(p),
        None => root.join(".cache/assets"),
    }
}

fn tokenizer_config(pkg: &str) -> String {
    let p = assets().join(pkg).join("tokenizer_config.json");
    std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/fetch-assets.sh to fetch the test assets",
            p.display()
        )
    })
}

fn golden(model: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden/chat")
        .join(format!("{model}.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn input(case: &Value) -> RenderInput {
    RenderInput {
        messages: case["messages"].as_array().unwrap().clone(),
        tools: case.get("tools").and_then(|t| t.as_array()).cloned(),
        add_generation_prompt: case
            .get("add_generation_prompt")
            .and_then(|v| v.as_bool())
            .unwrap_or(true),
        kwargs: case
            .get("kwargs")
            .and_then(|k| k.as_object())
            .cloned()
            .unwrap_or_default(),
    }
}

/// Render every golden case with `tmpl`; returns the number of cases checked.
fn check_all(model: &str, tmpl: &ChatTemplate, what: &str) -> usize {
    let doc = golden(model);
    let cases = doc["cases"].as_array().unwrap();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let got = tmpl.render(&input(case));
        match (case.get("expected"), case.get("error")) {
            (Some(Value::String(want)), _) => {
                let got = got.unwrap_or_else(|e| panic!("{what} {model}/{name}: {e}"));
                assert_eq!(&got, want, "{what} {model}/{name}");
            }
            (_, Some(Value::String(err))) => match got {
                Err(ChatError::Template(m)) => assert_eq!(&m, err, "{what} {model}/{name}"),
                other => panic!("{what} {model}/{name}: expected error {err:?}, got {other:?}"),
            },
            _ => panic!("malformed golden case {name}"),
        }
    }
    cases.len()
}

#[test]
fn qwen3_model_template_matches_transformers() {
    let files = from_tokenizer_config(&tokenizer_config("qwen3")).unwrap();
    let tmpl = ChatTemplate::new(files.source.as_deref().unwrap(), files.special).unwrap();
    assert!(check_all("qwen3", &tmpl, "model template") >= 8);
}

#[test]
fn gemma3_model_template_matches_transformers() {
    let files = from_tokenizer_config(&tokenizer_config("gemma3")).unwrap();
    assert_eq!(
        files.special.get("bos_token").and_then(|v| v.as_str()),
        Some("<bos>")
    );
    let tmpl = ChatTemplate::new(files.source.as_deref().unwrap(), files.special).unwrap();
    assert!(check_all("gemma3", &tmpl, "model template") >= 5);
}

#[test]
fn builtin_gemma3_matches_transformers() {
    let mut special = serde_json::Map::new();
    special.insert("bos_token".into(), "<bos>".into());
    let tmpl = ChatTemplate::new(builtin::GEMMA3, special).unwrap();
    check_all("gemma3", &tmpl, "built-in");
}

#[test]
fn builtin_chatml_matches_transformers_qwen3() {
    let tmpl = ChatTemplate::new(builtin::CHATML, Default::default()).unwrap();
    check_all("qwen3", &tmpl, "built-in");
}

#[test]
fn builtin_gemma4_renders_tools_thinking_and_calls() {
    let mut special = serde_json::Map::new();
    special.insert("bos_token".into(), "<bos>".into());
    let tmpl = ChatTemplate::new(builtin::GEMMA4, special).unwrap();
    let case: Value = serde_json::json!({
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "name": "w", "content": "sunny"}
        ],
        "tools": [{"type": "function", "function": {"name": "w", "description": "weather", "parameters": {"type": "object"}}}],
        "kwargs": {"enable_thinking": true}
    });
    let got = tmpl.render(&input(&case)).unwrap();
    assert_eq!(
        got,
        "<bos><|turn>system\n<|think|>Be brief.<|tool>declaration:w{description:<|\"|>weather<|\"|>,parameters:{type:<|\"|>object<|\"|>}}<tool|><turn|>\n\
         <|turn>user\nWeather?<turn|>\n\
         <|turn>model\n<|tool_call>call:w{city:<|\"|>Paris<|\"|>}<tool_call|><turn|>\n\
         <|turn>user\n<|tool_response>response:w{value:<|\"|>sunny<|\"|>}<tool_response|><turn|>\n\
         <|turn>model\n"
    );
}
