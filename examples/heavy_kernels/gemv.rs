//! Quantized GEMV checks (every format x batch bucket against `ops::qdot`) and the bandwidth
//! bench (device copy and read kernel in the same run, then GEMV on a 4096 x 12288 weight).

use crate::gpu::{cfg, rel_err, Gpu, Row};
use anyhow::Result;
use cudarc::driver::{CudaSlice, PushKernelArg};
use fucina::ops::qdot::{dequantize_q8_1, gemv_ref, quantize_q8_1};
use fucina::quant::GgmlType;
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub const QUANTS: [(&str, GgmlType); 8] = [
    ("f32", GgmlType::F32),
    ("f16", GgmlType::F16),
    ("bf16", GgmlType::BF16),
    ("q8_0", GgmlType::Q8_0),
    ("q4_0", GgmlType::Q4_0),
    ("q5_0", GgmlType::Q5_0),
    ("q4_k", GgmlType::Q4K),
    ("q6_k", GgmlType::Q6K),
];
pub const BATCHES: [usize; 4] = [1, 2, 4, 8];
/// Tuning variants of the block-format bs1 GEMV built for the bench (see a2-instances.json).
pub const VARIANTS: [&str; 4] = ["s3c2", "s4c2", "s4c4", "s3c2m8"];

fn normal(rng: &mut StdRng) -> f32 {
    // Irwin-Hall approximation: plenty for test data
    (0..4).map(|_| rng.random::<f32>()).sum::<f32>() - 2.0
}

/// Random tensor of `n` rows x `k` in the GGUF layout of `ty`, with sane block scales.
pub fn random_weights(ty: GgmlType, n: usize, k: usize, rng: &mut StdRng) -> Vec<u8> {
    let rb = ty.row_bytes(k).expect("aligned k");
    let mut w = vec![0u8; rb * n];
    match ty {
        GgmlType::F32 => {
            for c in w.chunks_exact_mut(4) {
                c.copy_from_slice(&(normal(rng) * 0.05).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in w.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(normal(rng) * 0.05).to_bits().to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in w.chunks_exact_mut(2) {
                c.copy_from_slice(&bf16::from_f32(normal(rng) * 0.05).to_bits().to_le_bytes());
            }
        }
        _ => {
            rng.fill(&mut w[..]);
            let (_, bb) = ty.block();
            let h = |rng: &mut StdRng, lo: f32, hi: f32| {
                f16::from_f32(lo + (hi - lo) * rng.random::<f32>())
                    .to_bits()
                    .to_le_bytes()
            };
            for b in w.chunks_exact_mut(bb) {
                match ty {
                    GgmlType::Q4K => {
                        b[0..2].copy_from_slice(&h(rng, 1e-4, 1e-3));
                        b[2..4].copy_from_slice(&h(rng, 1e-4, 1e-3));
                    }
                    GgmlType::Q6K => b[208..210].copy_from_slice(&h(rng, 1e-4, 1e-3)),
                    _ => b[0..2].copy_from_slice(&h(rng, -0.01, 0.01)),
                }
            }
        }
    }
    w
}

/// Launch one GEMV instance.
#[allow(clippy::too_many_arguments)]
pub fn launch_gemv(
    gpu: &Gpu,
    f: &cudarc::driver::CudaFunction,
    w: &CudaSlice<u8>,
    x: &CudaSlice<f32>,
    xq: &CudaSlice<i8>,
    xds: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    n: usize,
    k: usize,
    grid: u32,
) -> Result<()> {
    let (n32, k32) = (n as i32, k as i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(w).arg(x).arg(xq).arg(xds).arg(y).arg(&n32).arg(&k32);
    // SAFETY: argument list matches ops/gemv's signature; buffers sized by the caller.
    unsafe { b.launch(cfg((grid, 1, 1), 128)) }?;
    Ok(())
}

/// The same launch through cuLaunchKernelEx with programmatic stream serialization (PDL).
#[allow(clippy::too_many_arguments)]
pub fn launch_gemv_pdl(
    gpu: &Gpu,
    f: &cudarc::driver::CudaFunction,
    w: &CudaSlice<u8>,
    x: &CudaSlice<f32>,
    xq: &CudaSlice<i8>,
    xds: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    n: usize,
    k: usize,
    grid: u32,
) -> Result<()> {
    use cudarc::driver::{sys, DevicePtr, DevicePtrMut};
    let s = &gpu.stream;
    let (pw, _g1) = w.device_ptr(s);
    let (px, _g2) = x.device_ptr(s);
    let (pq, _g3) = xq.device_ptr(s);
    let (pd, _g4) = xds.device_ptr(s);
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
    // SAFETY: zero is a valid bit pattern for this plain C struct/union; we set the used field.
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
    // SAFETY: params point at live locals matching ops/gemv's signature for this call.
    let r = unsafe {
        sys::cuLaunchKernelEx(
            &cfg,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        anyhow::bail!("cuLaunchKernelEx: {r:?}");
    }
    Ok(())
}

pub fn launch_quantize(
    gpu: &Gpu,
    f: &cudarc::driver::CudaFunction,
    x: &CudaSlice<f32>,
    xq: &mut CudaSlice<i8>,
    xds: &mut CudaSlice<f32>,
    len: usize,
) -> Result<()> {
    let groups = (len / 32) as i32;
    let grid = ((len / 32).div_ceil(8)).min(65535) as u32;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(x).arg(xq).arg(xds).arg(&groups);
    // SAFETY: matches ops/quantize_q8_1's signature; xq holds len bytes, xds 2*len/32 floats.
    unsafe { b.launch(cfg((grid, 1, 1), 256)) }?;
    Ok(())
}

pub fn checks(gpu: &Gpu, rows: &mut Vec<Row>) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(0x6e6d);
    let qf = gpu.function("quantize_q8_1")?;
    // quantizer: exact against the CPU twin
    {
        let len = 8 * 4096;
        let x: Vec<f32> = (0..len).map(|_| normal(&mut rng) * 3.0).collect();
        let dx = gpu.upload(&x)?;
        let mut xq = gpu.upload(&vec![0x55i8; len])?;
        let mut xds = gpu.poisoned(len / 32 * 2)?;
        launch_quantize(gpu, &qf, &dx, &mut xq, &mut xds, len)?;
        let got_q = gpu.download(&xq)?;
        let got_ds = gpu.download(&xds)?;
        let want = quantize_q8_1(&x)?;
        let mut mism = got_q.iter().zip(&want.qs).filter(|(a, b)| a != b).count();
        for g in 0..len / 32 {
            if got_ds[2 * g] != want.d[g] || got_ds[2 * g + 1] != want.s[g] {
                mism += 1;
            }
        }
        let us = gpu.time_graph(20, 10, |_| {
            launch_quantize(gpu, &qf, &dx, &mut xq, &mut xds, len)
        })? * 1e3;
        rows.push(Row {
            name: "quantize_q8_1".into(),
            err: mism as f64,
            bound: 0.0,
            us,
            note: format!("{len} values, mismatches vs CPU"),
        });
    }
    for (qname, ty) in QUANTS {
        let is_k = matches!(ty, GgmlType::Q4K | GgmlType::Q6K);
        // shapes chosen so row starts are not 16-byte aligned and n is not a multiple of 4 warps
        let shapes: &[(usize, usize)] = if is_k {
            &[(1001, 3840), (64, 10240)]
        } else if ty.block().0 == 1 {
            &[(1001, 1184), (77, 1187)]
        } else {
            &[(1001, 1184), (67, 8192)]
        };
        for &bs in &BATCHES {
            let f = gpu.function(&format!("gemv_{qname}_bs{bs}"))?;
            let mut worst = 0f64;
            let mut us = 0.0;
            for &(n, k) in shapes {
                let w = random_weights(ty, n, k, &mut rng);
                let x: Vec<f32> = (0..bs * k).map(|_| normal(&mut rng)).collect();
                let float_w = ty.block().0 == 1;
                let (xq_h, xds_h, xref) = if float_w || k % 32 != 0 {
                    (vec![0i8; 32], vec![0f32; 2], x.clone())
                } else {
                    let a = quantize_q8_1(&x)?;
                    let ds: Vec<f32> = a.d.iter().zip(&a.s).flat_map(|(&d, &s)| [d, s]).collect();
                    (a.qs.clone(), ds, dequantize_q8_1(&a))
                };
                let want = gemv_ref(ty, &w, n, k, &xref)?;
                let (dw, dx, dxq, dxds) = (
                    gpu.upload(&w)?,
                    gpu.upload(&x)?,
                    gpu.upload(&xq_h)?,
                    gpu.upload(&xds_h)?,
                );
                let mut y = gpu.poisoned(bs * n)?;
                let grid = n.div_ceil(4) as u32;
                launch_gemv(gpu, &f, &dw, &dx, &dxq, &dxds, &mut y, n, k, grid)?;
                let got = gpu.download(&y)?;
                worst = worst.max(rel_err(&got, &want));
                // a second grid shape (fewer warps, several rows each) must agree too
                let mut y2 = gpu.poisoned(bs * n)?;
                launch_gemv(gpu, &f, &dw, &dx, &dxq, &dxds, &mut y2, n, k, 3)?;
                worst = worst.max(rel_err(&gpu.download(&y2)?, &want));
                us = gpu.time_graph(10, 20, |_| {
                    launch_gemv(gpu, &f, &dw, &dx, &dxq, &dxds, &mut y, n, k, grid)
                })? * 1e3;
            }
            let (n, k) = shapes[0];
            rows.push(Row {
                name: format!("gemv_{qname}_bs{bs}"),
                err: worst,
                bound: 2e-4,
                us,
                note: format!("n={n} k={k} (+{:?})", &shapes[1..]),
            });
        }
        if matches!(ty, GgmlType::Q4_0 | GgmlType::Q4K | GgmlType::Q8_0) {
            for v in VARIANTS {
                let f = gpu.function(&format!("gemv_{qname}_bs1_{v}"))?;
                let mut worst = 0f64;
                for &(n, k) in shapes {
                    let w = random_weights(ty, n, k, &mut rng);
                    let x: Vec<f32> = (0..k).map(|_| normal(&mut rng)).collect();
                    let a = quantize_q8_1(&x)?;
                    let ds: Vec<f32> = a.d.iter().zip(&a.s).flat_map(|(&d, &s)| [d, s]).collect();
                    let want = gemv_ref(ty, &w, n, k, &dequantize_q8_1(&a))?;
                    let (dw, dx, dxq, dxds) = (
                        gpu.upload(&w)?,
                        gpu.upload(&x)?,
                        gpu.upload(&a.qs)?,
                        gpu.upload(&ds)?,
                    );
                    for grid in [n.div_ceil(4) as u32, 3] {
                        let mut y = gpu.poisoned(n)?;
                        launch_gemv(gpu, &f, &dw, &dx, &dxq, &dxds, &mut y, n, k, grid)?;
                        worst = worst.max(rel_err(&gpu.download(&y)?, &want));
                    }
                }
                rows.push(Row {
                    name: format!("gemv_{qname}_bs1_{v}"),
                    err: worst,
                    bound: 2e-4,
                    us: 0.0,
                    note: "tuning variant".into(),
                });
            }
        }
    }
    Ok(())
}

/// Read bandwidth kernel + device copy, then GEMV at 4096 (in) x 12288 (out).
pub fn bench(gpu: &Gpu) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let bytes = 2usize << 30;
    let src = gpu.upload(&vec![1u8; bytes])?;
    let mut dst = gpu.upload(&vec![0u8; bytes])?;
    let copy_ms = gpu.time_ms(20, 1, |_| Ok(gpu.stream.memcpy_dtod(&src, &mut dst)?))?;
    let copy_bw = 2.0 * bytes as f64 / copy_ms / 1e6; // GB/s, read + write
    let rf = gpu.function("read_bw")?;
    let mut sink = gpu.poisoned(1 << 20)?;
    let n16 = (bytes / 16) as i64;
    let read_grid = gpu.sms * 8;
    let read_ms = gpu.time_ms(20, 1, |_| {
        let mut b = gpu.stream.launch_builder(&rf);
        b.arg(&src).arg(&n16).arg(&mut sink);
        // SAFETY: matches ops/read_bw: (const uint4*, long long n, float* sink[grid*256]).
        unsafe { b.launch(cfg((read_grid, 1, 1), 256)) }?;
        Ok(())
    })?;
    let read_bw = bytes as f64 / read_ms / 1e6;
    drop(dst);
    out.push(format!(
        "device copy: {:.0} GB/s (2 GiB, read+write counted); read kernel: {:.0} GB/s (2 GiB read)",
        copy_bw, read_bw
    ));
    let peak = read_bw.max(copy_bw);
    out.push(format!(
        "reference bandwidth = max of the two = {:.0} GB/s",
        peak
    ));
    out.push("GEMV y[12288] = W[12288 x 4096] . x[4096] (PyTorch shape [out=12288, in=4096]); bytes = weight bytes only; median of 30 CUDA-graph replays, each of as many launches as weight copies (>= 480 MB, L2 60 MB), per launch".into());
    out.push("| kernel | weight MB | grid | median us | GB/s | % of ref | regs |".into());
    out.push("|---|---|---|---|---|---|---|".into());
    let (n, k) = (12288usize, 4096usize);
    let mut rng = StdRng::seed_from_u64(7);
    for (qname, ty) in [
        ("q4_0", GgmlType::Q4_0),
        ("q4_k", GgmlType::Q4K),
        ("q8_0", GgmlType::Q8_0),
        ("q6_k", GgmlType::Q6K),
        ("q5_0", GgmlType::Q5_0),
        ("f16", GgmlType::F16),
        ("bf16", GgmlType::BF16),
    ] {
        let w1 = random_weights(ty, n, k, &mut rng);
        let wb = w1.len();
        // enough copies that the set is >= 8x L2 (60 MB) so no launch finds its weights cached
        let copies = (480_000_000usize).div_ceil(wb).max(2);
        let mut ws = Vec::new();
        for c in 0..copies {
            let mut w = w1.clone();
            w[c % wb] ^= 1;
            ws.push(gpu.upload(&w)?);
        }
        let x: Vec<f32> = (0..k).map(|_| normal(&mut rng)).collect();
        let a = quantize_q8_1(&x)?;
        let ds: Vec<f32> = a.d.iter().zip(&a.s).flat_map(|(&d, &s)| [d, s]).collect();
        let (dx, dxq, dxds) = (gpu.upload(&x)?, gpu.upload(&a.qs)?, gpu.upload(&ds)?);
        let mut y = gpu.poisoned(n)?;
        let tuned = matches!(ty, GgmlType::Q4_0 | GgmlType::Q4K | GgmlType::Q8_0);
        let variants: Vec<String> = if tuned {
            std::iter::once(String::new())
                .chain(VARIANTS.iter().map(|v| format!("_{v}")))
                .collect()
        } else {
            vec![String::new()]
        };
        for v in variants {
            let name = format!("gemv_{qname}_bs1{v}");
            let f = gpu.function(&name)?;
            for grid in [n.div_ceil(4) as u32, gpu.sms * 4, gpu.sms * 8] {
                let ms = gpu.time_graph(30, copies, |i| {
                    launch_gemv(
                        gpu,
                        &f,
                        &ws[i % copies],
                        &dx,
                        &dxq,
                        &dxds,
                        &mut y,
                        n,
                        k,
                        grid,
                    )
                })?;
                let gbs = wb as f64 / ms / 1e6;
                out.push(format!(
                    "| {name} | {:.1} | {grid} | {:.2} | {:.0} | {:.1}% | {} |",
                    wb as f64 / 1e6,
                    ms * 1e3,
                    gbs,
                    100.0 * gbs / peak,
                    gpu.regs(&f)
                ));
                if ty.block().0 > 1 {
                    // back-to-back with programmatic dependent launch (weights prefetched early)
                    match gpu.time_graph(30, copies, |i| {
                        launch_gemv_pdl(
                            gpu,
                            &f,
                            &ws[i % copies],
                            &dx,
                            &dxq,
                            &dxds,
                            &mut y,
                            n,
                            k,
                            grid,
                        )
                    }) {
                        Ok(ms) => {
                            let gbs = wb as f64 / ms / 1e6;
                            out.push(format!(
                                "| {name} +PDL | {:.1} | {grid} | {:.2} | {:.0} | {:.1}% | {} |",
                                wb as f64 / 1e6,
                                ms * 1e3,
                                gbs,
                                100.0 * gbs / peak,
                                gpu.regs(&f)
                            ));
                        }
                        Err(e) => out.push(format!("| {name} +PDL | error: {e:#} |")),
                    }
                }
            }
            // a PDL launch must compute the same function (copy 0 has byte 0 flipped)
            if ty.block().0 > 1 {
                let mut w0 = w1.clone();
                w0[0] ^= 1;
                let want0 = gemv_ref(ty, &w0, n, k, &dequantize_q8_1(&a))?;
                let mut yp = gpu.poisoned(n)?;
                let checked = launch_gemv_pdl(
                    gpu,
                    &f,
                    &ws[0],
                    &dx,
                    &dxq,
                    &dxds,
                    &mut yp,
                    n,
                    k,
                    n.div_ceil(4) as u32,
                )
                .and_then(|_| Ok(rel_err(&gpu.download(&yp)?, &want0)));
                match checked {
                    Ok(e) => out.push(format!(
                        "| {name} PDL launch vs CPU: max rel err {e:.2e} {} |",
                        if e <= 2e-4 { "PASS" } else { "FAIL" }
                    )),
                    Err(e) => out.push(format!("| {name} PDL launch: error {e:#} |")),
                }
            }
        }
    }
    Ok(out)
}
