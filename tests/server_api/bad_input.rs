//! Every bad input from the issue: the right status and error object, and the server keeps
//! serving after each.

use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWriteExt;

use super::common::http::{open_partial, post, send, start};
use super::{chat, still_serving};
use fucina::server::ServerConfig;

fn assert_openai_error(r: &super::common::http::Resp, status: u16, needle: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error object: {v}"));
    assert!(v["error"]["type"].is_string());
    assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_mistyped_requests() {
    let cfg = ServerConfig {
        body_limit: 64 * 1024,
        ..Default::default()
    };
    let (addr, _) = start(cfg, 256, Duration::ZERO).await;
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, "invalid request body"),
        (b"".to_vec(), 400, "empty"),
        (br#"{"messages": "hi"}"#.to_vec(), 400, "invalid type"),
        (br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}"#.to_vec(), 400, "invalid type"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(), 400, "invalid"),
        (br#"{"messages": []}"#.to_vec(), 400, "must not be empty"),
        (br#"{"messages": [{"role": "wizard", "content": "hi"}]}"#.to_vec(), 400, "wizard"),
        (br#"{"messages": [{"role": "user"}]}"#.to_vec(), 400, "content is required"),
        (br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}"#.to_vec(), 400, "at least 1"),
        (br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}"#.to_vec(), 400, "at least 1"),
        (br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000000000000}"#.to_vec(), 400, "context is 256 tokens"),
        (br#"{"messages": [{"role": "user", "content": "hi"}], "temperature": 7}"#.to_vec(), 400, "temperature"),
        (br#"{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}"#.to_vec(), 400, "response_format"),
        (br#"{"messages": [{"role": "user", "content": "hi"}], "n": 3}"#.to_vec(), 400, "n = 1"),
        (br#"{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "nope"}]}"#.to_vec(), 400, "tools[0]"),
        (br#"{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}"#.to_vec(), 400, "not in tools"),
        (br#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#.to_vec(), 400, "image_url"),
        (br#"{"messages": [{"role": "user", "content": "hi"}], "stop": 5}"#.to_vec(), 400, "stop"),
    ];
    for (body, status, needle) in cases {
        let r = send(addr, "POST", "/v1/chat/completions", &[], &body).await;
        assert_openai_error(&r, status, needle);
        assert!(r.header("x-request-id").is_some());
    }
    // Prompt over the context: 400 with the token counts.
    let long = "x".repeat(300);
    let r = post(addr, "/v1/chat/completions", &chat(&long)).await;
    assert_openai_error(&r, 400, "fills the model's context of 256 tokens");
    let r = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x".repeat(200)}], "max_tokens": 100}),
    )
    .await;
    assert_openai_error(&r, 400, "context is 256 tokens; the prompt has");
    // Completions-specific.
    for (body, needle) in [
        (json!({"prompt": []}), "must not be empty"),
        (json!({"prompt": ["a", ""]}), "prompt[1] must not be empty"),
        (json!({"prompt": [[1], "a", "b", "c", "d"]}), "at most 4"),
        (json!({"prompt": [99999]}), "outside the vocabulary"),
        (json!({"prompt": {"x": 1}}), "prompt must be"),
    ] {
        assert_openai_error(&post(addr, "/v1/completions", &body).await, 400, needle);
    }
    // Oversized body: 413.
    let huge = vec![b'a'; 100 * 1024];
    let r = send(addr, "POST", "/v1/chat/completions", &[], &huge).await;
    assert_openai_error(&r, 413, "exceeds the limit of 65536 bytes");
    // Unknown route.
    assert_eq!(send(addr, "GET", "/nope", &[], b"").await.status, 404);
    still_serving(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_errors_use_anthropic_shape() {
    let (addr, _) = start(ServerConfig::default(), 4096, Duration::ZERO).await;
    for (body, needle) in [
        (
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            "max_tokens",
        ),
        (
            json!({"max_tokens": 5, "messages": []}),
            "at least one message",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
            "'user' or 'assistant'",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]}),
            "video",
        ),
    ] {
        let r = post(addr, "/v1/messages", &body).await;
        assert_eq!(r.status, 400, "{}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{v}"
        );
    }
    still_serving(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_required_and_constant_time_checked() {
    let cfg = ServerConfig {
        api_key: Some("sekrit".into()),
        ..Default::default()
    };
    let (addr, _) = start(cfg, 4096, Duration::ZERO).await;
    let body = chat("hi").to_string();
    let r = send(addr, "POST", "/v1/chat/completions", &[], body.as_bytes()).await;
    assert_openai_error(&r, 401, "API key");
    let r = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer wrong")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 401);
    let r = send(
        addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", "sekri")],
        b"{}",
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let r = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer sekrit")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("x-api-key", "sekrit")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200);
    // Open routes stay open.
    assert_eq!(send(addr, "GET", "/health", &[], b"").await.status, 200);
    assert_eq!(send(addr, "GET", "/metrics", &[], b"").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_gets_503_and_vanished_client_frees_its_slot() {
    let cfg = ServerConfig {
        max_concurrent: 1,
        ..Default::default()
    };
    let (addr, state) = start(cfg, 1 << 20, Duration::from_millis(2)).await;
    let forever = endless_stream();
    // Hold the only slot with an endless stream.
    let mut sock = open_partial(addr, "/v1/chat/completions", &forever, 200).await;
    let r = post(addr, "/v1/chat/completions", &chat("hi")).await;
    assert_openai_error(&r, 503, "concurrency limit");
    assert_eq!(r.header("retry-after"), Some("1"));
    // The client vanishes mid-stream: its generation is cancelled and the slot freed.
    sock.shutdown().await.ok();
    drop(sock);
    let engine = state.loaded().unwrap().engine.clone();
    let mut freed = false;
    for _ in 0..500 {
        if state.in_flight() == 0 && engine.metrics().snapshot().requests_cancelled >= 1 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "slot not freed: in_flight {}", state.in_flight());
    still_serving(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_running_limit_wait_up_to_max_queue() {
    let cfg = ServerConfig {
        max_concurrent: 1,
        max_queue: 1,
        ..Default::default()
    };
    let (addr, state) = start(cfg, 1 << 20, Duration::from_millis(2)).await;
    let forever = endless_stream();
    // the one running sequence: an endless stream
    let mut sock = open_partial(addr, "/v1/chat/completions", &forever, 200).await;
    // the next request waits in the engine's queue
    let queued = tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat("hi")).await });
    let engine = state.loaded().unwrap().engine.clone();
    let mut waiting = false;
    for _ in 0..500 {
        if engine.metrics().snapshot().waiting == 1 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(waiting, "the second request is not waiting");
    // the queue is full: the third is refused
    let r = post(addr, "/v1/chat/completions", &chat("hi")).await;
    assert_openai_error(&r, 503, "concurrency limit");
    assert_eq!(r.header("retry-after"), Some("1"));
    // the stream ends; the queued request runs and completes
    sock.shutdown().await.ok();
    drop(sock);
    let q = tokio::time::timeout(Duration::from_secs(30), queued)
        .await
        .expect("the queued request finished")
        .unwrap();
    assert_eq!(q.status, 200, "{}", q.text());
    still_serving(addr).await;
}

/// A streamed chat the scripted model never ends.
fn endless_stream() -> serde_json::Value {
    let mut forever = chat("FOREVER");
    forever["stream"] = json!(true);
    forever["max_tokens"] = json!(100000);
    forever
}
