//! GPU checks and benchmarks of the heavy kernels (GEMV, GEMM, decode attention, sampler)
//! against the CPU references in `fucina::ops`. Usage:
//!   heavy_kernels --ptx DIR [--bench] [--only SUBSTR]
//! DIR holds `<entry>.<arch>.ptx` rendered by `kernel-templates/tools/render_check.py`.
//! Prints one table (instance, max relative error, bound, pass, microseconds) and exits 1 on
//! any failure. `--bench` adds the GEMV bandwidth table (measurements, never asserted).

mod attn;
mod gemm;
mod gemv;
mod gpu;
mod sample;

use anyhow::Result;
use std::path::PathBuf;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut ptx, mut bench, mut only) = (PathBuf::from("ptx"), false, String::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--ptx" => ptx = PathBuf::from(args.next().unwrap_or_default()),
            "--bench" => bench = true,
            "--only" => only = args.next().unwrap_or_default(),
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let g = gpu::Gpu::new(ptx)?;
    println!("device: {} ({}, {} SMs)", g.ctx.name()?, g.arch, g.sms);
    let mut rows = Vec::new();
    let sections: [(&str, fn(&gpu::Gpu, &mut Vec<gpu::Row>) -> Result<()>); 4] = [
        ("gemv", gemv::checks),
        ("attn", attn::checks),
        ("sample", sample::checks),
        ("gemm", gemm::checks),
    ];
    for (name, f) in sections {
        if !only.is_empty() && !name.contains(&only) {
            continue;
        }
        if let Err(e) = f(&g, &mut rows) {
            rows.push(gpu::Row {
                name: format!("{name} (section)"),
                err: f64::INFINITY,
                bound: 0.0,
                us: 0.0,
                note: format!("error: {e:#}"),
            });
        }
    }
    println!("| instance | max rel err | bound | pass | us | case |");
    println!("|---|---|---|---|---|---|");
    let mut ok = true;
    for r in &rows {
        ok &= r.pass();
        println!(
            "| {} | {:.2e} | {:.0e} | {} | {:.2} | {} |",
            r.name,
            r.err,
            r.bound,
            if r.pass() { "PASS" } else { "FAIL" },
            r.us,
            r.note
        );
    }
    if bench {
        match gemv::bench(&g) {
            Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
            Err(e) => println!("bench error: {e:#}"),
        }
    }
    println!("{}", if ok { "ALL PASS" } else { "FAILURES" });
    std::process::exit(if ok { 0 } else { 1 });
}
