//! The server with real models on the CPU backend:
//! - the tiny golden Qwen3 checkpoint (golden/models/qwen3) behind a byte tokenizer: tokens
//!   through the server equal the model's own greedy loop run directly through `CausalLm`, and
//!   prefix reuse does not change a single token;
//! - the real Gemma 3 270M Q4_K_M GGUF (fetched by scripts/fetch-assets.sh): chat through the
//!   server equals the direct greedy loop on the rendered prompt, and the official SDKs run
//!   against it.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::http::{post, start_with};
use fucina::backend::cpu::CpuBackend;
use fucina::chat::{source::TemplateFiles, ChatFormat, ChatRequest, Dialect};
use fucina::model::registry::LoadOptions;
use fucina::model::CausalLm;
use fucina::sampling::argmax;
use fucina::server::ServerConfig;
use fucina::tokenizer::Tokenizer;
use fucina::weights::Checkpoint;
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Greedy continuation computed straight from the model (no engine, no server); stops after
/// an id in `eos` (included) or `n` tokens.
fn direct_greedy(lm: &Arc<dyn CausalLm>, prompt: &[u32], n: usize, eos: &[u32]) -> Vec<u32> {
    let mut s = lm.clone().new_session();
    let mut logits = s.forward(prompt, false).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let id = argmax(logits.last());
        out.push(id);
        if eos.contains(&id) || out.len() == n {
            break;
        }
        logits = s.forward(&[id], false).unwrap();
    }
    out
}

fn ids_of(v: &Value, key: &str) -> Vec<u32> {
    v["choices"][0][key]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_qwen3_through_the_server_matches_the_direct_greedy_loop() {
    let lm = common::cpu_model("golden/models/qwen3/model.gguf");
    let a: Vec<u32> = "The quick brown fox".bytes().map(u32::from).collect();
    let mut b = a.clone();
    b.extend(" jumps over".bytes().map(u32::from));

    let (warm, _) = start_with(
        lm.clone(),
        common::byte_tokenizer(),
        TemplateFiles::default(),
        ServerConfig::default(),
        true,
    )
    .await;
    let body = |p: &[u32], n: usize| json!({"prompt": p, "max_tokens": n, "return_token_ids": true, "temperature": 0});
    let va = post(warm, "/v1/completions", &body(&a, 12)).await.json();
    assert_eq!(ids_of(&va, "token_ids"), direct_greedy(&lm, &a, 12, &[]));
    assert_eq!(ids_of(&va, "prompt_token_ids"), a);
    // Streaming text equals the non-streaming text.
    let mut sb = body(&a, 12);
    sb["stream"] = json!(true);
    let data = post(warm, "/v1/completions", &sb).await.sse_data();
    let streamed: String = data[..data.len() - 1]
        .iter()
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, va["choices"][0]["text"].as_str().unwrap());
    // B extends A: its KV prefix is reused, and the tokens equal a cold run and the direct loop.
    let vb = post(warm, "/v1/completions", &body(&b, 10)).await.json();
    assert!(
        vb["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= a.len() as u64 - 1
    );
    let (cold, _) = start_with(
        lm.clone(),
        common::byte_tokenizer(),
        TemplateFiles::default(),
        ServerConfig::default(),
        false,
    )
    .await;
    let cb = post(cold, "/v1/completions", &body(&b, 10)).await.json();
    assert_eq!(cb["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(ids_of(&vb, "token_ids"), ids_of(&cb, "token_ids"));
    assert_eq!(ids_of(&vb, "token_ids"), direct_greedy(&lm, &b, 10, &[]));
}

fn gemma_asset() -> PathBuf {
    let dir = std::env::var_os("FUCINA_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/assets"));
    let p = dir.join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.is_file(),
        "{} is missing; run scripts/fetch-assets.sh",
        p.display()
    );
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_270m_chat_through_the_server_and_the_sdks() {
    let path = gemma_asset();
    let ckpt = Checkpoint::open(&path).unwrap();
    let det = fucina::arch::detect(&ckpt).unwrap();
    let lm = fucina::model::gemma3::load(
        &ckpt,
        &det,
        Arc::new(CpuBackend::new()),
        &LoadOptions {
            max_context: 1024,
            ..Default::default()
        },
    )
    .unwrap();
    let tok = Tokenizer::from_gguf(ckpt.gguf().unwrap()).unwrap();
    assert_eq!(Dialect::detect(&tok), Some(Dialect::Gemma3));
    // The GGUF carries no chat template: the built-in Gemma 3 one is used.
    assert!(ckpt
        .gguf()
        .unwrap()
        .get_str("tokenizer.chat_template")
        .is_none());

    let msgs = vec![json!({"role": "user", "content": "What is the capital of France?"})];
    let chat = ChatFormat::new(
        Dialect::Gemma3,
        TemplateFiles::default(),
        ChatFormat::special_from_tokenizer(&tok),
    )
    .unwrap();
    let rendered = chat
        .render(&ChatRequest {
            messages: msgs.clone(),
            ..Default::default()
        })
        .unwrap();
    assert!(rendered.text.starts_with("<bos><start_of_turn>user\n"));
    let prompt = tok.encode(&rendered.text, false).unwrap();
    // The GGUF vocabulary tokenises the rendered prompt (turn markers included) exactly as
    // Google's tokenizer.json does.
    let hf = Tokenizer::from_file(
        &gemma_asset()
            .with_file_name("gemma3")
            .join("tokenizer.json"),
    )
    .unwrap();
    assert_eq!(hf.encode(&rendered.text, false).unwrap(), prompt);
    assert!(prompt.contains(&tok.token_to_id("<start_of_turn>").unwrap()));
    let mut eos = tok.special.eos.clone();
    eos.extend(tok.token_to_id("<end_of_turn>"));
    let want = direct_greedy(&lm, &prompt, 24, &eos);
    let want_text = tok
        .decode(
            &want[..want.len() - usize::from(eos.contains(want.last().unwrap()))],
            false,
        )
        .unwrap();

    let (addr, _) = start_with(
        lm,
        tok,
        TemplateFiles::default(),
        ServerConfig::default(),
        true,
    )
    .await;
    let v = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 24, "temperature": 0}),
    )
    .await
    .json();
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        prompt.len()
    );
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().unwrap(),
        want_text,
        "{v}"
    );
    // (This GGUF is the base model, not the instruction-tuned one: its chat replies are not
    // meant to be good, only identical on both paths.)
    println!("gemma3 270m: {want_text:?}");

    // The official SDKs against the real model (shapes and invariants).
    let env = std::env::var_os("FUCINA_PYENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/pyenv"));
    assert!(
        env.join("openai").is_dir(),
        "SDKs missing in {}; run scripts/test.sh",
        env.display()
    );
    let out = tokio::process::Command::new("python3")
        .arg(root().join("tests/sdk/run_sdk.py"))
        .arg(format!("http://{addr}"))
        .arg("real")
        .env("PYTHONPATH", &env)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("10 passed, 0 failed"), "{stdout}");
}

/// Ten clients at once against the tiny Qwen3 (the engine runs up to 8 sequences a step, two
/// wait): every reply equals the model's own greedy loop, and the batch-size histogram of
/// /metrics shows steps that ran several sequences.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_decode_together_with_their_own_tokens() {
    let lm = common::cpu_model("golden/models/qwen3/model.gguf");
    let cfg = ServerConfig {
        max_concurrent: 8,
        max_queue: 2,
        ..ServerConfig::default()
    };
    let (addr, _) = start_with(
        lm.clone(),
        common::byte_tokenizer(),
        TemplateFiles::default(),
        cfg,
        false,
    )
    .await;
    let prompts: Vec<Vec<u32>> = (0..10)
        .map(|i| {
            format!("client {i} says {}", "hi ".repeat(i))
                .bytes()
                .map(u32::from)
                .collect()
        })
        .collect();
    let reqs = prompts.iter().map(|p| {
        let body =
            json!({"prompt": p, "max_tokens": 48, "return_token_ids": true, "temperature": 0});
        async move { post(addr, "/v1/completions", &body).await }
    });
    let replies = futures::future::join_all(reqs).await;
    for (p, r) in prompts.iter().zip(&replies) {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            ids_of(&r.json(), "token_ids"),
            direct_greedy(&lm, p, 48, &[])
        );
    }
    let m = common::http::get(addr, "/metrics").await.text();
    let bucket = |le: &str| -> u64 {
        let key = format!("fucina_batch_size_bucket{{le=\"{le}\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in /metrics"))
    };
    assert!(
        bucket("+Inf") > bucket("1"),
        "no step ran more than one sequence:\n{m}"
    );
    // at most 8 sequences a step
    assert_eq!(bucket("8"), bucket("+Inf"));
    let sum: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("fucina_batch_size_sum "))
        .and_then(|v| v.trim().parse().ok())
        .expect("fucina_batch_size_sum");
    assert!(
        sum > bucket("+Inf") && sum <= 8 * bucket("+Inf"),
        "sum {sum}"
    );
}
