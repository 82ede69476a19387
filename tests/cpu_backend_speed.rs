//! Decode-shaped matmul speed of the CPU backend (ignored by default; run with
//! `cargo test --release --test cpu_backend_speed -- --ignored --nocapture`).
//! Shapes: Gemma 3 270M's tied LM head (262144 x 640) and one layer's projections.

use fucina::backend::{Ops, Runtime};
use std::time::Instant;

/// CPU time of this process in seconds (utime + stime from /proc, 10 ms ticks), so the figure
/// means something on a shared machine; 0 where /proc is absent.
fn cpu_seconds() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let after = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

use fucina::backend::cpu::CpuBackend;
use fucina::quant::GgmlType;
use fucina::weights::{Scales, TensorFormat, TensorRef};

fn random_blocks(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = ty.row_bytes(cols).unwrap() * rows;
    let mut s = 0x1234_5678_u64;
    let mut v: Vec<u8> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect();
    // keep f16 scales finite and small: overwrite each block's scale bytes
    let (_, bb) = ty.block();
    let small = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    for b in v.chunks_exact_mut(bb) {
        match ty {
            GgmlType::Q6K => b[208..210].copy_from_slice(&small),
            GgmlType::Q4K => {
                b[0..2].copy_from_slice(&small);
                b[2..4].copy_from_slice(&small);
            }
            _ => b[0..2].copy_from_slice(&small),
        }
    }
    v
}

#[test]
#[ignore]
fn decode_matmul_speed() {
    for (be, path) in [(CpuBackend::int8(), "int8"), (CpuBackend::new(), "f32")] {
        for (ty, rows, cols, label) in [
            // 640 columns is not a multiple of 256: K-quants only fit the 2048-wide ffn_down.
            (GgmlType::Q8_0, 262144, 640, "lm head Q8_0"),
            (GgmlType::Q4_0, 2048, 640, "ffn gate Q4_0"),
            (GgmlType::Q5_0, 2048, 640, "ffn gate Q5_0"),
            (GgmlType::Q4K, 640, 2048, "ffn down Q4_K"),
            (GgmlType::Q6K, 640, 2048, "ffn down Q6_K"),
        ] {
            let data = random_blocks(ty, rows, cols);
            let t = TensorRef {
                name: label.into(),
                shape: vec![rows, cols],
                format: TensorFormat::Ggml(ty),
                data: &data,
                scales: Scales::default(),
            };
            let w = be.upload(&t).unwrap();
            let x = be.tensor(&vec![0.5f32; cols], 1, cols).unwrap();
            let _ = be.linear(&x, &w).unwrap();
            let reps = if rows > 100_000 { 5 } else { 400 };
            let (t0, c0) = (Instant::now(), cpu_seconds());
            for _ in 0..reps {
                let _ = be.linear(&x, &w).unwrap();
            }
            let dt = t0.elapsed().as_secs_f64() / reps as f64;
            let cpu = (cpu_seconds() - c0) / reps as f64;
            let per = 1e9 / (rows * cols) as f64;
            eprintln!(
                "{path:>4} {label:>16}: wall {:.2} ms/call ({:.2} ns/weight), cpu {:.2} ns/weight",
                dt * 1e3,
                dt * per,
                cpu * per
            );
        }
    }
}

/// One decode step's matrix products for a real GGUF (every 2-D weight once, the embedding table
/// as the tied LM head): `FUCINA_SPEED_GGUF=<file> cargo test --release --test cpu_backend_speed
/// -- --ignored gguf --nocapture`. Prints wall and CPU time (the machine may be shared).
#[test]
#[ignore]
fn gguf_decode_matmuls() {
    let path = std::env::var("FUCINA_SPEED_GGUF").expect("set FUCINA_SPEED_GGUF to a .gguf file");
    let g = fucina::gguf::GgufFile::open(std::path::Path::new(&path)).unwrap();
    let be = CpuBackend::new();
    let mut weights = Vec::new();
    let mut types = std::collections::BTreeMap::new();
    for info in g.tensor_infos() {
        let t = g.tensor(&info.name).unwrap();
        if t.shape.len() != 2 || t.rows() < 2 {
            continue;
        }
        if let TensorFormat::Ggml(ty) = t.format {
            *types.entry(ty.name()).or_insert(0usize) += t.numel();
        }
        weights.push((t.numel(), be.upload(&t).unwrap()));
    }
    eprintln!("weights per type: {types:?}");
    let total: usize = weights.iter().map(|w| w.0).sum();
    for _ in 0..2 {
        let (t0, c0) = (Instant::now(), cpu_seconds());
        for (_, w) in &weights {
            let x = be.tensor(&vec![0.1f32; w.cols()], 1, w.cols()).unwrap();
            let _ = be.linear(&x, w).unwrap();
        }
        let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
        eprintln!(
            "{total} weights: wall {:.1} ms ({:.1} tok/s), cpu {:.1} ms ({:.2} ns/weight; {:.1} tok/s on 2 idle cores)",
            wall * 1e3,
            1.0 / wall,
            cpu * 1e3,
            cpu * 1e9 / total as f64,
            2.0 / cpu
        );
    }
}
