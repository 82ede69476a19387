//! A minimal HTTP/1.1 client over a raw TCP socket (so tests control every byte: invalid UTF-8,
//! oversized bodies, vanishing mid-stream) plus helpers to start the server on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fucina::chat::{source::TemplateFiles, ChatFormat, Dialect};
use fucina::engine::scheduler::{self, SchedulerConfig};
use fucina::server::{AppState, Loaded, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::ScriptedLm;

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut out = req.into_bytes();
    out.extend_from_slice(body);
    out
}

pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&request_bytes(method, path, headers, body))
        .await
        .expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    parse(&raw)
}

pub async fn post(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Resp {
    send(addr, "POST", path, &[], body.to_string().as_bytes()).await
}

pub async fn get(addr: SocketAddr, path: &str) -> Resp {
    send(addr, "GET", path, &[], b"").await
}

/// Open a request and return the socket after reading at least `min_bytes` of the response.
pub async fn open_partial(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
    min_bytes: usize,
) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&request_bytes(
        "POST",
        path,
        &[],
        body.to_string().as_bytes(),
    ))
    .await
    .unwrap();
    let mut got = 0;
    let mut buf = [0u8; 4096];
    while got < min_bytes {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "server closed early");
        got += n;
    }
    s
}

fn parse(raw: &[u8]) -> Resp {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("no header end");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
    out
}

/// Start the server on an ephemeral loopback port with the scripted model.
pub async fn start(
    mut cfg: ServerConfig,
    max_context: usize,
    delay: Duration,
) -> (SocketAddr, Arc<AppState>) {
    // Greedy by default here: the scripted replies are exact; tests that sample say so.
    cfg.defaults.temperature = 0.0;
    let lm = ScriptedLm::new(max_context, delay);
    let tok = Arc::new(super::tokenizer());
    let engine = scheduler::spawn(
        lm,
        tok.clone(),
        SchedulerConfig {
            model_id: "scripted-test".into(),
            skip_special: false,
            prefix_reuse: true,
            prefill_chunk: 8192,
            // as the CLI does: the server's running limit is the engine's
            max_running: cfg.max_concurrent,
            ..SchedulerConfig::default()
        },
    );
    let chat = ChatFormat::new(
        Dialect::detect(&tok).unwrap(),
        TemplateFiles::default(),
        ChatFormat::special_from_tokenizer(&tok),
    )
    .unwrap()
    .with_text_guard(&tok);
    let state = AppState::new(cfg);
    state.set_loaded(Loaded {
        engine,
        tokenizer: tok,
        chat: Some(chat),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let st = state.clone();
    tokio::spawn(async move {
        fucina::server::serve(listener, st, std::future::pending())
            .await
            .unwrap();
    });
    (addr, state)
}

/// Start the server on loopback with any model and tokenizer (chat format from the vocabulary,
/// built-in or `template` when given).
pub async fn start_with(
    lm: Arc<dyn fucina::model::CausalLm>,
    tok: fucina::tokenizer::Tokenizer,
    template: TemplateFiles,
    mut cfg: ServerConfig,
    prefix_reuse: bool,
) -> (SocketAddr, Arc<AppState>) {
    cfg.defaults.temperature = 0.0;
    let tok = Arc::new(tok);
    let engine = scheduler::spawn(
        lm,
        tok.clone(),
        SchedulerConfig {
            model_id: "real".into(),
            skip_special: false,
            prefix_reuse,
            prefill_chunk: 8192,
            // as the CLI does: the server's running limit is the engine's
            max_running: cfg.max_concurrent,
            ..SchedulerConfig::default()
        },
    );
    let chat = Dialect::detect(&tok).map(|d| {
        ChatFormat::new(d, template, ChatFormat::special_from_tokenizer(&tok))
            .unwrap()
            .with_text_guard(&tok)
    });
    let state = AppState::new(cfg);
    state.set_loaded(Loaded {
        engine,
        tokenizer: tok,
        chat,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let st = state.clone();
    tokio::spawn(async move {
        fucina::server::serve(listener, st, std::future::pending())
            .await
            .unwrap();
    });
    (addr, state)
}
