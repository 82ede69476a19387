//! The official `openai` and `anthropic` Python SDKs (pinned, installed by scripts/test.sh into
//! .cache/pyenv) against the server on loopback. Fails, not skips, when they are missing.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use fucina::server::ServerConfig;

fn pyenv() -> PathBuf {
    match std::env::var_os("FUCINA_PYENV") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/pyenv"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_against_the_scripted_model() {
    let env = pyenv();
    assert!(
        env.join("openai").is_dir() && env.join("anthropic").is_dir(),
        "the openai/anthropic SDKs are not installed in {}; run scripts/test.sh (it installs them)",
        env.display()
    );
    let cfg = ServerConfig {
        api_key: Some("test-key".into()),
        ..Default::default()
    };
    let (addr, _) = common::http::start(cfg, 4096, Duration::ZERO).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/run_sdk.py");
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(format!("http://{addr}"))
        .arg("scripted")
        .env("PYTHONPATH", &env)
        .output()
        .await
        .expect("running python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "SDK run failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("10 passed, 0 failed"), "{stdout}");
}
