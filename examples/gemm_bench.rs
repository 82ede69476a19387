//! Prefill GEMM bench (a measurement, never asserted):
//!   cargo run --release --example gemm_bench [-- --quick]
//! For each weight shape N x K in {6144x4096, 4096x4096, 24576x4096, 4096x12288} (Qwen3-8B's
//! fused QKV, O, fused gate|up and down projections):
//! 1. `dequant_bf16` of a Q4_0 / Q4_K / Q8_0 / Q6_K weight to bf16: median us and GB/s (bytes
//!    read + bf16 bytes written);
//! 2. at M in {512, 4096} rows: `gemm_pipe` with every tile shape (`*` marks the one
//!    `GemmPipe::pick` chooses), the older `gemm` bf16 kernel, and at M = 512 the older `gemm` Q4_0
//!    kernel (dequantising in its tile loader): median us and TFLOPS (2 M N K / t);
//! 3. the prefill path of a Q4_0 weight as `linear` runs it (dequant_bf16 of each chunk into
//!    the scratch + gemm_pipe with the picked tile), with 128 MiB chunks (the default: one chunk
//!    except 24576x4096, two) and 32 MiB chunks (`FUCINA_GEMM_SCRATCH_MB=32`, chunks that may
//!    stay in L2): us and effective TFLOPS.
//!
//! Times are medians of CUDA-event-timed single launches (20 samples; 5 with --quick).

use anyhow::Result;
use cudarc::driver::{sys, CudaSlice};
use fucina::backend::cuda::{chunk_rows, CudaDevice, DevPtr, GemmTile, Kern};
use fucina::kernels::{BatchBucket, Op, Quant};
use fucina::ops::qdot::random_weights;
use fucina::quant::GgmlType;
use rand::{Rng, SeedableRng};

/// Median ms of single calls timed with events (after one warm-up call).
fn time_events(dev: &CudaDevice, samples: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let s = dev.stream();
    f()?;
    let mut t = Vec::with_capacity(samples);
    for _ in 0..samples {
        let a = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        f()?;
        let b = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        t.push(a.elapsed_ms(&b)? as f64);
    }
    t.sort_by(|x, y| x.total_cmp(y));
    Ok(t[t.len() / 2])
}

fn bf16s(rng: &mut impl Rng, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| half::bf16::from_f32(rng.random::<f32>() - 0.5).to_bits())
        .collect()
}

fn p<T: cudarc::driver::DeviceRepr>(s: &CudaSlice<T>) -> DevPtr<T> {
    DevPtr::of(s)
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let samples = if quick { 5 } else { 20 };
    let dev = CudaDevice::new(0)?;
    let sms = dev.sm_count()?;
    println!("device: {} ({}), {sms} SMs", dev.name(), dev.arch());
    let g = dev.gemm_pipe_kernels()?;
    println!(
        "gemm_pipe: {} ({} stages); tiles {}",
        g.spec.name,
        g.stages,
        GemmTile::ALL
            .iter()
            .filter(|t| g.has(**t))
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let old_bf16 = dev.kern(Op::Gemm, Quant::Bf16, BatchBucket::Any)?;
    let old_q4 = dev.kern(Op::Gemm, Quant::Q4_0, BatchBucket::Any)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let shapes = [
        (6144usize, 4096usize),
        (4096, 4096),
        (24576, 4096),
        (4096, 12288),
    ];
    let formats = [
        (Quant::Q4_0, GgmlType::Q4_0),
        (Quant::Q4K, GgmlType::Q4K),
        (Quant::Q8_0, GgmlType::Q8_0),
        (Quant::Q6K, GgmlType::Q6K),
    ];
    println!();
    println!("| N x K | kernel | M | median us | TFLOPS or GB/s |");
    println!("|---|---|---|---|---|");
    for (n, k) in shapes {
        let w16 = dev.upload(&bf16s(&mut rng, n * k))?;
        let mut q4_dev = None;
        // 1. dequant_bf16 per format
        for (q, ty) in formats {
            let kd: Kern = dev.kern(Op::DequantBf16, q, BatchBucket::Any)?;
            let wq = random_weights(ty, n, k, &mut rng)?;
            let dwq = dev.upload(&wq)?;
            let out = dev.upload(&vec![0u16; n * k])?;
            let ms = time_events(&dev, samples, || {
                Ok(dev.dequant_bf16_ptr(&kd, p(&dwq), p(&out), (n, k))?)
            })?;
            let gbs = (wq.len() + n * k * 2) as f64 / ms / 1e6;
            println!(
                "| {n}x{k} | dequant_bf16 {q} | - | {:.1} | {gbs:.0} GB/s |",
                ms * 1e3
            );
            if q == Quant::Q4_0 {
                q4_dev = Some((dwq, kd));
            }
        }
        // 2. GEMMs
        for m in [512usize, 4096] {
            let a = dev.upload(&bf16s(&mut rng, m * k))?;
            let c = dev.upload(&vec![0f32; m * n])?;
            let flop = 2.0 * (m * n * k) as f64;
            let row = |label: &str, ms: f64| {
                println!(
                    "| {n}x{k} | {label} | {m} | {:.1} | {:.1} TFLOPS |",
                    ms * 1e3,
                    flop / ms / 1e9
                );
            };
            let pick = g.pick(m, n);
            for t in GemmTile::ALL {
                if !g.has(t) {
                    continue;
                }
                let ms = time_events(&dev, samples, || {
                    Ok(dev.gemm_pipe_ptr(&g, t, p(&a), p(&w16), p(&c), (m, n, k), n, None)?)
                })?;
                let mark = if Some(t) == pick { " *" } else { "" };
                row(&format!("gemm_pipe {}{mark}", t.name()), ms);
            }
            let ms = time_events(&dev, samples, || {
                Ok(dev.gemm_ptr(&old_bf16, p(&a), p(&w16).cast(), p(&c), (m, n, k))?)
            })?;
            row("gemm bf16 (old)", ms);
            if let Some((dwq, kd)) = &q4_dev {
                if m == 512 {
                    let ms = time_events(&dev, samples.min(5), || {
                        Ok(dev.gemm_ptr(&old_q4, p(&a), p(dwq), p(&c), (m, n, k))?)
                    })?;
                    row("gemm q4_0 (old, dequant in loader)", ms);
                }
                // 3. the linear path for Q4_0: dequant chunks of at most `cap` bytes of bf16
                //    (128 MiB: what linear uses; 32 MiB: chunks that may stay in L2) + gemm_pipe
                for cap_mb in [128usize, 32] {
                    let rows_per = chunk_rows(n, k, cap_mb << 20).min(n);
                    let scratch = dev.upload(&vec![0u16; rows_per * k])?;
                    let row_bytes = k / 32 * 18;
                    let ms = time_events(&dev, samples, || {
                        let mut r0 = 0;
                        while r0 < n {
                            let rows = rows_per.min(n - r0);
                            let wq = p(dwq)
                                .slice(r0 * row_bytes, rows * row_bytes)
                                .ok_or_else(|| anyhow::anyhow!("chunk out of range"))?;
                            dev.dequant_bf16_ptr(kd, wq, p(&scratch), (rows, k))?;
                            let t = g.pick(m, rows).ok_or_else(|| anyhow::anyhow!("no tile"))?;
                            let cc = p(&c)
                                .slice(r0, (m - 1) * n + rows)
                                .ok_or_else(|| anyhow::anyhow!("c out of range"))?;
                            dev.gemm_pipe_ptr(
                                &g,
                                t,
                                p(&a),
                                p(&scratch),
                                cc,
                                (m, rows, k),
                                n,
                                None,
                            )?;
                            r0 += rows;
                        }
                        Ok(())
                    })?;
                    row(
                        &format!(
                            "Q4_0 linear path, {cap_mb} MiB chunks of {rows_per} rows (dequant + gemm_pipe)"
                        ),
                        ms,
                    );
                }
            }
        }
    }
    Ok(())
}
