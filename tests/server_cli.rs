//! The `fucina` binary end to end on the real Gemma 3 270M (CPU): one-shot, server mode with
//! /readyz turning 200 after loading, and the flags that must refuse or warn clearly.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fucina"));
    // Flags only from the command line here.
    for (k, _) in std::env::vars() {
        if k.starts_with("FUCINA_") && k != "FUCINA_TEST_ASSETS" {
            c.env_remove(k);
        }
    }
    c.env("RUST_LOG", "warn");
    c
}

fn gguf() -> PathBuf {
    let dir = std::env::var_os("FUCINA_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/assets"));
    let p = dir.join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.is_file(),
        "{} is missing; run scripts/fetch-assets.sh",
        p.display()
    );
    p
}

#[test]
fn one_shot_streams_text_and_prints_stats() {
    let out = bin()
        .args(["-m"])
        .arg(gguf())
        .args([
            "-p",
            "Name three colors.",
            "-n",
            "12",
            "--temp",
            "0",
            "--ctx",
            "512",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        !stdout.trim().is_empty(),
        "no text generated; stderr: {stderr}"
    );
    assert!(
        stderr.contains("generated") && stderr.contains("tok/s"),
        "{stderr}"
    );
    // Raw mode (no chat template) works too.
    let out = bin()
        .args(["-m"])
        .arg(gguf())
        .args([
            "-p",
            "The sky is",
            "-n",
            "4",
            "--temp",
            "0",
            "--raw",
            "--ctx",
            "256",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn refusals_and_warnings_are_clear() {
    let out = bin()
        .args(["--device", "cuda", "-p", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--device cuda"));
    let out = bin()
        .args(["--thinking", "lots", "-p", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--thinking"));
    let out = bin().args(["selftest", "--help"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--filter"));
    let out = bin()
        .args(["--spec", "--draft-k", "4", "-m"])
        .arg(gguf())
        .args(["-p", "Hi", "-n", "2", "--ctx", "128"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("speculative decoding"));
    let out = bin()
        .args(["-m", "/nonexistent/model.gguf", "-p", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/model.gguf"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_mode_loads_then_serves() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log_path = std::env::temp_dir().join(format!("fucina-server-{port}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let _child = KillOnDrop(
        bin()
            .args(["-m"])
            .arg(gguf())
            .args([
                "--port",
                &port.to_string(),
                "--ctx",
                "512",
                "--temp",
                "0",
                "--api-key",
                "k1",
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t = Instant::now();
    let mut ready = false;
    while t.elapsed() < Duration::from_secs(120) {
        if tokio::net::TcpStream::connect(addr).await.is_ok()
            && common::http::get(addr, "/readyz").await.status == 200
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    {
        assert!(ready, "server never became ready");
        // it warmed the model up (kernels compiled and loaded) before it said so
        let log = std::fs::read_to_string(&log_path).unwrap();
        assert!(
            log.contains("warm-up (kernels compiled and loaded)"),
            "{log}"
        );
        let body = json!({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
            .to_string();
        let r = common::http::send(
            addr,
            "POST",
            "/v1/chat/completions",
            &[("Authorization", "Bearer k1")],
            body.as_bytes(),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.json()["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
        let r =
            common::http::send(addr, "POST", "/v1/chat/completions", &[], body.as_bytes()).await;
        assert_eq!(r.status, 401);
        let m = common::http::get(addr, "/v1/models").await;
        assert_eq!(m.status, 401, "models is under /v1 and needs the key");
    }
}

/// Ends the server child process even when an assertion fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn repl_commands_over_a_pipe() {
    use std::io::Write;
    let sessions = tempfile::tempdir().unwrap();
    let mut child = bin()
        .args(["-m"])
        .arg(gguf())
        .args([
            "-i",
            "-n",
            "4",
            "--temp",
            "0",
            "--ctx",
            "512",
            "--session-dir",
        ])
        .arg(sessions.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"/help\nHello there\n/stats\n/thinking high\n/thinking nope\n/save chat1\n/reset\n/load chat1\n/save ../escape\n/bogus\n/quit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "/thinking LEVEL",
        "generated 4 tok",
        "(thinking High)",
        "usage: /thinking",
        "(saved 2 messages",
        "(conversation cleared)",
        "(loaded 2 messages)",
        "a session name is",
        "unknown command /bogus",
    ] {
        assert!(
            stdout.contains(needle),
            "REPL output lacks {needle:?}:\n{stdout}"
        );
    }
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sessions.path().join("chat1.json")).unwrap())
            .unwrap();
    assert_eq!(saved["messages"][0]["content"], "Hello there");
    assert_eq!(saved["messages"][1]["role"], "assistant");
}
