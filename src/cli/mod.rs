//! The `fucina` binary: server (default), one-shot (`-p` / `-f`), REPL (`--interactive`),
//! `selftest`.

pub mod args;
pub mod load;
pub mod repl;
pub mod turn;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use serde_json::json;

use args::{Cli, Command, RunArgs};
use turn::TurnOpts;

use crate::engine::SamplingParams;
use crate::server::params::{Defaults, ThinkingLevel};
use crate::server::{AppState, Loaded, ServerConfig};

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = if cli.verbose {
        "info,fucina=debug"
    } else {
        "info"
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let tuning = crate::tuning::Tuning {
        graphs: !cli.no_graphs,
        ..crate::tuning::Tuning::from_env()
    };
    crate::tuning::init(tuning);
    if let Some(d) = &cli.models_dir {
        crate::assets::set_models_dir(d.clone());
    }
    if cli.verbose {
        tracing::info!("{}", crate::tuning::get());
    }
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fucina: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> Result<ExitCode> {
    if let Some(Command::Selftest(args)) = cli.command {
        return Ok(if crate::selftest::run(&args)? {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if let Some(Command::Bench(args)) = cli.command {
        crate::bench::run(&args)?;
        return Ok(ExitCode::SUCCESS);
    }
    let a = cli.run;
    load::report_unavailable(&a);
    let thinking = ThinkingLevel::parse(&a.thinking).ok_or_else(|| {
        anyhow!(
            "--thinking: expected off, on, low, mid, high or xhigh, got '{}'",
            a.thinking
        )
    })?;
    if a.prompt.is_some() || a.file.is_some() {
        one_shot(&a, thinking)
    } else if a.interactive {
        let ready = load::load(&a, false)?;
        repl::run(
            &ready,
            turn_opts(&a, thinking),
            a.system.clone(),
            a.session_dir.clone(),
        )?;
        Ok(ExitCode::SUCCESS)
    } else {
        serve(a, thinking)
    }
}

fn sampling(a: &RunArgs) -> SamplingParams {
    SamplingParams {
        temperature: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        seed: a.seed,
        repetition_penalty: a.repeat_penalty,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
    }
}

fn turn_opts(a: &RunArgs, thinking: ThinkingLevel) -> TurnOpts {
    TurnOpts {
        sampling: sampling(a),
        max_tokens: a.predict,
        thinking,
        think_budget: a.think_budget,
    }
}

fn one_shot(a: &RunArgs, thinking: ThinkingLevel) -> Result<ExitCode> {
    let text = match (&a.prompt, &a.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        _ => unreachable!(),
    };
    let ready = load::load(a, false)?;
    let opts = turn_opts(a, thinking);
    let mut out = std::io::stdout();
    let res = if a.raw {
        turn::run(&ready, None, Some(&text), &opts, &mut out)?
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(json!({"role": "system", "content": s}));
        }
        msgs.push(json!({"role": "user", "content": text}));
        turn::run(&ready, Some(&msgs), None, &opts, &mut out)?
    };
    println!();
    eprintln!("{}", res.stats_line());
    Ok(ExitCode::SUCCESS)
}

fn serve(a: RunArgs, thinking: ThinkingLevel) -> Result<ExitCode> {
    let cfg = ServerConfig {
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        max_concurrent: a.max_concurrent.max(1),
        max_queue: a.max_queue,
        max_output_tokens: a.max_output_tokens,
        default_max_tokens: a.predict,
        timeout: a.timeout.map(Duration::from_secs),
        body_limit: 32 << 20,
        defaults: Defaults {
            temperature: a.temp,
            top_k: a.top_k,
            top_p: a.top_p,
            min_p: a.min_p,
            repetition_penalty: a.repeat_penalty,
            seed: a.seed,
            thinking,
            think_budget: a.think_budget,
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let addr = format!("{}:{}", a.host, a.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
        let state = AppState::new(cfg);
        tracing::info!("listening on http://{addr} (model loading and warming up; /readyz turns 200 when done)");
        let st = state.clone();
        let loader = tokio::task::spawn_blocking(move || -> Result<()> {
            let r = load::load(&a, true)?;
            tracing::info!(model = %r.engine.info().model_id, ctx = r.engine.info().max_context, "model loaded");
            st.set_loaded(Loaded { engine: r.engine, tokenizer: r.tokenizer, chat: r.chat });
            Ok(())
        });
        let server = crate::server::serve(listener, state, async {
            let _ = tokio::signal::ctrl_c().await;
        });
        tokio::pin!(server);
        tokio::select! {
            res = &mut server => { res?; return Ok(ExitCode::SUCCESS); }
            load = loader => {
                load.map_err(|e| anyhow!("model loader panicked: {e}"))??;
            }
        }
        server.await?;
        Ok(ExitCode::SUCCESS)
    })
}
