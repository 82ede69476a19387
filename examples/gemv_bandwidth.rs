//! GEMV bandwidth bench (a measurement, never asserted):
//!   cargo run --example gemv_bandwidth
//! 1. reference bandwidth in the same run: a 2 GiB device-to-device copy (read + write counted)
//!    and the `read_bw` kernel (2 GiB read once); the larger is the reference.
//! 2. decode GEMV y[12288] = W[12288 x 4096] . x[4096] (PyTorch weight shape [out, in] =
//!    [12288, 4096]) for Q4_0, Q4_K, Q8_0 (and Q6_K, Q5_0, F16, BF16): median over 30 replays of
//!    a CUDA graph holding one launch per weight copy (copies >= 480 MB, so the 50-60 MB L2 never
//!    holds the next launch's weights), per launch; GB/s counts weight bytes. Block formats are
//!    also timed with programmatic dependent launch (PDL, sm_90+), which lets each GEMV stream
//!    its weights while the previous one drains. Each format is timed at its default grid
//!    (`gemv_default_grid`), one row step per warp, and 4 / 6 blocks per SM.
//! 3. the same GEMV over 8x the rows (98304 x 4096) for Q4_0, Q4_K, Q8_0, F16: the streaming
//!    rate without the per-launch fixed cost.

use anyhow::{anyhow, Result};
use cudarc::driver::{sys, CudaSlice, DevicePtr, DevicePtrMut};
use fucina::backend::cuda::{gemv_default_grid, CudaDevice, GemvEntry, Q8Activations};
use fucina::kernels::{BatchBucket, HeadDim, KernelSpec, Op, Quant};
use fucina::ops::qdot::{quantize_q8_1, random_weights};
use fucina::quant::GgmlType;
use rand::SeedableRng;

/// Median ms per call of `calls` launches captured in one graph, replayed `samples` times.
fn time_graph(
    dev: &CudaDevice,
    samples: usize,
    calls: usize,
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    let s = dev.stream();
    s.synchronize()?;
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let mut res = Ok(());
    for i in 0..calls {
        res = f(i);
        if res.is_err() {
            break;
        }
    }
    let graph = s.end_capture(sys::CUgraphInstantiate_flags(0))?;
    res?;
    let graph = graph.ok_or_else(|| anyhow!("empty graph"))?;
    for _ in 0..3 {
        graph.launch()?;
    }
    let mut t = Vec::with_capacity(samples);
    for _ in 0..samples {
        let a = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        graph.launch()?;
        let b = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        t.push(a.elapsed_ms(&b)? as f64 / calls as f64);
    }
    t.sort_by(|x, y| x.total_cmp(y));
    Ok(t[t.len() / 2])
}

/// Median ms of single calls timed with events.
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

/// The GEMV launch of `CudaDevice::gemv`, through cuLaunchKernelEx with programmatic stream
/// serialization.
#[allow(clippy::too_many_arguments)]
fn gemv_pdl(
    dev: &CudaDevice,
    spec: &'static KernelSpec,
    w: &CudaSlice<u8>,
    x: &CudaSlice<f32>,
    act: &Q8Activations,
    y: &mut CudaSlice<f32>,
    n: usize,
    k: usize,
    grid: u32,
) -> Result<()> {
    let f = dev.function(spec)?;
    let s = dev.stream();
    let (pw, _g1) = w.device_ptr(s);
    let (px, _g2) = x.device_ptr(s);
    let (pq, _g3) = act.xq.device_ptr(s);
    let (pd, _g4) = act.xds.device_ptr(s);
    let (py, _g5) = y.device_ptr_mut(s);
    let (n32, k32) = (n as i32, k as i32);
    let mut params: [*mut std::ffi::c_void; 7] = [
        &pw as *const _ as *mut _,
        &px as *const _ as *mut _,
        &pq as *const _ as *mut _,
        &pd as *const _ as *mut _,
        &py as *const _ as *mut _,
        &n32 as *const _ as *mut _,
        &k32 as *const _ as *mut _,
    ];
    // SAFETY: zero is a valid bit pattern for this plain C struct; the used field is set.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 128,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: s.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: params point at live locals matching ops/gemv's signature (w, x, xq, xds, y, n, k);
    // the buffers were sized by the caller exactly as for CudaDevice::gemv.
    let r = unsafe {
        sys::cuLaunchKernelEx(
            &cfg,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(anyhow!("cuLaunchKernelEx: {r:?}"));
    }
    Ok(())
}

fn main() -> Result<()> {
    let dev = CudaDevice::new(0)?;
    let (major, _) = dev.compute_capability();
    println!("device: {} ({})", dev.name(), dev.arch());
    let bytes = 2usize << 30;
    let src = dev.upload(&vec![1u8; bytes])?;
    let mut dst = dev.upload(&vec![0u8; bytes])?;
    let copy_ms = time_events(&dev, 20, || Ok(dev.stream().memcpy_dtod(&src, &mut dst)?))?;
    drop(dst);
    let copy_bw = 2.0 * bytes as f64 / copy_ms / 1e6;
    let rspec = dev.resolve(Op::ReadBw, Quant::F32, HeadDim::Any, BatchBucket::Any)?;
    let sms = dev
        .context()
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
        as u32;
    let grid = sms * 8;
    let mut sink = dev.upload(&vec![0u32; grid as usize * 256])?;
    let read_ms = time_events(&dev, 20, || Ok(dev.read_bw(rspec, &src, &mut sink, grid)?))?;
    let read_bw = bytes as f64 / read_ms / 1e6;
    drop(src);
    let peak = copy_bw.max(read_bw);
    println!("device copy {copy_bw:.0} GB/s (read+write), read kernel {read_bw:.0} GB/s; reference {peak:.0} GB/s");
    println!("| weight | MB | launch | median us | GB/s | % of reference |");
    println!("|---|---|---|---|---|---|");
    let (n, k) = (12288usize, 4096usize);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let formats = [
        (Quant::Q4_0, GgmlType::Q4_0),
        (Quant::Q4K, GgmlType::Q4K),
        (Quant::Q8_0, GgmlType::Q8_0),
        (Quant::Q6K, GgmlType::Q6K),
        (Quant::Q5_0, GgmlType::Q5_0),
        (Quant::F16, GgmlType::F16),
        (Quant::Bf16, GgmlType::BF16),
    ];
    for (q, ty) in formats {
        let spec = dev.resolve(Op::Gemv, q, HeadDim::Any, BatchBucket::B1)?;
        let w1 = random_weights(ty, n, k, &mut rng)?;
        let wb = w1.len();
        let copies = 480_000_000usize.div_ceil(wb).max(2);
        let mut ws = Vec::with_capacity(copies);
        for c in 0..copies {
            let mut w = w1.clone();
            w[c % wb] ^= 1;
            ws.push(dev.upload(&w)?);
        }
        let x: Vec<f32> = (0..k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let a = quantize_q8_1(&x)?;
        let ds: Vec<f32> = a.d.iter().zip(&a.s).flat_map(|(&d, &s)| [d, s]).collect();
        let act = Q8Activations {
            xq: dev.upload(&a.qs)?,
            xds: dev.upload(&ds)?,
        };
        let dx = dev.upload(&x)?;
        let mut y = dev.filled_f32(n, f32::NAN)?;
        let row = |label: &str, ms: f64| {
            let gbs = wb as f64 / ms / 1e6;
            println!(
                "| {q} | {:.1} | {label} | {:.2} | {gbs:.0} | {:.1}% |",
                wb as f64 / 1e6,
                ms * 1e3,
                100.0 * gbs / peak
            );
        };
        // grid sweep: the default (one row group per warp) and persistent grids of g blocks per SM
        let old = gemv_default_grid(spec, n, sms);
        let one = n.div_ceil(4 * spec.param_u32("rows").unwrap_or(1).max(1) as usize) as u32;
        let mut grids = vec![
            (format!("default={old}"), old),
            (format!("1 step/warp={one}"), one),
        ];
        for g in [4u32, 6] {
            grids.push((format!("{g}/SM={}", g * sms), g * sms));
        }
        for (label, grid) in &grids {
            let grid = *grid;
            let ms = time_graph(&dev, 30, copies, |i| {
                Ok(dev.gemv(
                    spec,
                    &ws[i % copies],
                    &dx,
                    &act,
                    &mut y,
                    n,
                    k,
                    GemvEntry::Main(Some(grid)),
                )?)
            })?;
            row(&format!("graph {label}"), ms);
            if major >= 9 && ty.block().0 > 1 {
                match time_graph(&dev, 30, copies, |i| {
                    gemv_pdl(&dev, spec, &ws[i % copies], &dx, &act, &mut y, n, k, grid)
                }) {
                    Ok(ms) => row(&format!("graph + PDL {label}"), ms),
                    Err(e) => println!("| {q} | PDL failed: {e:#} |"),
                }
            }
        }
        let ms = time_graph(&dev, 30, copies, |i| {
            Ok(dev.gemv(
                spec,
                &ws[i % copies],
                &dx,
                &act,
                &mut y,
                n,
                k,
                GemvEntry::Auto,
            )?)
        })?;
        row("graph default", ms);
    }
    // fixed cost vs streaming rate: the same GEMV over 8x the rows (default grid)
    println!("| weight | MB | launch (n = 8 x {n}) | median us | GB/s | % of reference |");
    let n8 = 8 * n;
    for (q, ty) in [
        (Quant::Q4_0, GgmlType::Q4_0),
        (Quant::Q4K, GgmlType::Q4K),
        (Quant::Q8_0, GgmlType::Q8_0),
        (Quant::F16, GgmlType::F16),
    ] {
        let spec = dev.resolve(Op::Gemv, q, HeadDim::Any, BatchBucket::B1)?;
        let w1 = random_weights(ty, n8, k, &mut rng)?;
        let wb = w1.len();
        let copies = 480_000_000usize.div_ceil(wb).max(2);
        let mut ws = Vec::with_capacity(copies);
        for c in 0..copies {
            let mut w = w1.clone();
            w[c % wb] ^= 1;
            ws.push(dev.upload(&w)?);
        }
        let x: Vec<f32> = (0..k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let a = quantize_q8_1(&x)?;
        let ds: Vec<f32> = a.d.iter().zip(&a.s).flat_map(|(&d, &s)| [d, s]).collect();
        let act = Q8Activations {
            xq: dev.upload(&a.qs)?,
            xds: dev.upload(&ds)?,
        };
        let dx = dev.upload(&x)?;
        let mut y = dev.filled_f32(n8, f32::NAN)?;
        let row = |label: &str, ms: f64| {
            let gbs = wb as f64 / ms / 1e6;
            println!(
                "| {q} | {:.1} | {label} | {:.2} | {gbs:.0} | {:.1}% |",
                wb as f64 / 1e6,
                ms * 1e3,
                100.0 * gbs / peak
            );
        };
        let one = n8.div_ceil(4 * spec.param_u32("rows").unwrap_or(1).max(1) as usize) as u32;
        let def = gemv_default_grid(spec, n8, sms);
        let grids = if def == one {
            vec![def]
        } else {
            vec![def, one]
        };
        for grid in grids {
            let ms = time_graph(&dev, 30, copies, |i| {
                Ok(dev.gemv(
                    spec,
                    &ws[i % copies],
                    &dx,
                    &act,
                    &mut y,
                    n8,
                    k,
                    GemvEntry::Main(Some(grid)),
                )?)
            })?;
            row(&format!("graph grid {grid}"), ms);
            if major >= 9 && ty.block().0 > 1 {
                let ms = time_graph(&dev, 30, copies, |i| {
                    gemv_pdl(&dev, spec, &ws[i % copies], &dx, &act, &mut y, n8, k, grid)
                })?;
                row(&format!("graph + PDL grid {grid}"), ms);
            }
        }
    }
    Ok(())
}
