//! `cargo xtask gen-kernels [--check]` (alias in .cargo/config.toml).
//!
//! gen-kernels: renders every manifest instance, compiles all of them with NVRTC (filling the
//! user's PTX cache, progress bar on a terminal), refreshes the insta snapshots of the rendered
//! sources, of the representative PTX set and of the PTX lock (every instance's PTX hash), and
//! deletes orphaned snapshots.
//! --check: the same, but changes nothing; fails (exit 1) when a snapshot is stale, missing or
//! orphaned, naming the command to run. Needs NVRTC (see scripts/test.sh).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use codegen::ptx::{self, CacheConfig, Job, PtxCache};

const FIX: &str = "cargo xtask gen-kernels";

fn main() -> std::process::ExitCode {
    match run() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn usage() -> String {
    "usage: cargo xtask gen-kernels [--check]".into()
}

fn run() -> Result<bool> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("gen-kernels") => {
            let check = match &args[1..] {
                [] => false,
                [f] if f == "--check" => true,
                _ => bail!(usage()),
            };
            gen_kernels(check)
        }
        _ => bail!(usage()),
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn gen_kernels(check: bool) -> Result<bool> {
    let root = workspace_root();
    let templates = root.join("kernel-templates");
    let rendered = codegen::render_all(&templates).context("rendering kernel-templates")?;
    eprintln!("rendered {} instances", rendered.len());

    if !ptx::nvrtc_available() {
        bail!("{}", ptx::PtxError::NvrtcMissing);
    }
    let (maj, min) = ptx::nvrtc_version()?;
    let cache = PtxCache::new(CacheConfig {
        strict: false,
        ..CacheConfig::from_env()?
    });
    let names: Vec<String> = rendered.iter().map(|(i, _)| i.name()).collect();
    let jobs: Vec<Job<'_>> = rendered
        .iter()
        .zip(&names)
        .map(|((i, s), n)| Job {
            name: n,
            source: s,
            arch: i.key.arch,
        })
        .collect();
    ptx::compile_many(&cache, &jobs, true)?;
    eprintln!(
        "compiled {} instances with NVRTC {maj}.{min} ({} compiled, {} cached in {})",
        jobs.len(),
        cache.compiles(),
        cache.hits(),
        cache.config().root.display()
    );

    // Snapshot tests: refresh (always write) or check (never write).
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(&root)
        .args([
            "test",
            "--no-fail-fast",
            "-p",
            "codegen",
            "--test",
            "render_snapshots",
            "--test",
            "ptx_snapshots",
        ])
        .env("FUCINA_REQUIRE_NVRTC", "1");
    if check {
        cmd.env("INSTA_UPDATE", "no").env_remove("INSTA_FORCE_PASS");
    } else {
        cmd.env("INSTA_UPDATE", "always")
            .env("INSTA_FORCE_PASS", "1");
    }
    let status = cmd.status().context("running the snapshot tests")?;
    let mut ok = status.success();

    // Orphans: snapshots of instances that no longer exist, and pending .snap.new files.
    let snaps = root.join("codegen/tests/snapshots");
    let want_render: BTreeSet<String> = codegen::snapshots::render_snapshots(&rendered)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let want_ptx: BTreeSet<String> = rendered
        .iter()
        .filter(|(i, _)| codegen::snapshots::ptx_snapshotted(i))
        .map(|(i, _)| i.name())
        .chain(["ptx_lock".to_string()])
        .collect();
    for (dir, want) in [
        (snaps.join("render"), &want_render),
        (snaps.join("ptx"), &want_ptx),
    ] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            let fname = f
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let orphan = match fname.strip_suffix(".snap") {
                Some(stem) => !want.contains(stem),
                None => fname.ends_with(".snap.new"),
            };
            if !orphan {
                continue;
            }
            if check {
                eprintln!("stale snapshot file: {}", f.display());
                ok = false;
            } else {
                std::fs::remove_file(&f).with_context(|| format!("removing {}", f.display()))?;
                eprintln!("removed orphaned snapshot {}", f.display());
            }
        }
    }
    if !ok {
        if check {
            eprintln!(
                "error: kernel snapshots are stale or missing; run `{FIX}` and commit the result"
            );
        } else {
            eprintln!("error: snapshot refresh failed (see the test output above)");
        }
    } else if check {
        eprintln!("kernel snapshots are up to date");
    } else {
        eprintln!(
            "snapshots refreshed under {}; review with `git diff`",
            snaps.display()
        );
    }
    Ok(ok)
}
