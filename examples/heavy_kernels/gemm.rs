//! Tensor-core GEMM (bf16 mma.sync, FP8 E4M3 mma.sync with 128x128 weight block scales)
//! against an f64 CPU product of the same (decoded) operands.

use crate::gpu::{cfg, rel_err, Gpu, Row};
use anyhow::Result;
use cudarc::driver::{CudaFunction, CudaSlice, PushKernelArg};
use fucina::quant::{bf16_to_f32, e4m3_to_f32, f32_to_e4m3};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &Gpu,
    f: &CudaFunction,
    tile: usize,
    a: &CudaSlice<u8>,
    w: &CudaSlice<u8>,
    c: &mut CudaSlice<f32>,
    m: usize,
    n: usize,
    k: usize,
    ws: &CudaSlice<f32>,
    asc: &CudaSlice<f32>,
) -> Result<()> {
    let (mi, ni, ki, wc) = (m as i32, n as i32, k as i32, k.div_ceil(128) as i32);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(a)
        .arg(w)
        .arg(c)
        .arg(&mi)
        .arg(&ni)
        .arg(&ki)
        .arg(ws)
        .arg(asc)
        .arg(&wc);
    // SAFETY: matches ops/gemm's signature; operand sizes checked by the callers below.
    unsafe {
        l.launch(cfg(
            (n.div_ceil(tile) as u32, m.div_ceil(tile) as u32, 1),
            (64 * tile / 32) as u32,
        ))
    }?;
    Ok(())
}

/// f64 reference for rows `rows` of C.
fn reference(a: &[f32], w: &[f32], n: usize, k: usize, rows: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * n);
    for &r in rows {
        let ar = &a[r * k..(r + 1) * k];
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            out.push(
                ar.iter()
                    .zip(wr)
                    .map(|(&x, &y)| x as f64 * y as f64)
                    .sum::<f64>() as f32,
            );
        }
    }
    out
}

fn case(
    gpu: &Gpu,
    fp8: bool,
    tile: usize,
    m: usize,
    n: usize,
    k: usize,
    rng: &mut StdRng,
) -> Result<(f64, f64)> {
    let name = format!(
        "{}{}",
        if fp8 { "gemm_e4m3" } else { "gemm_bf16" },
        if tile == 128 { "_t128" } else { "" }
    );
    let f = gpu.function(&name)?;
    let (abytes, wbytes, adec, wdec, wsc, asc);
    if fp8 {
        let a_scale = 0.02f32;
        let ab: Vec<u8> = (0..m * k)
            .map(|_| f32_to_e4m3((rng.random::<f32>() - 0.5) * 200.0))
            .collect();
        let wb: Vec<u8> = (0..n * k)
            .map(|_| f32_to_e4m3((rng.random::<f32>() - 0.5) * 200.0))
            .collect();
        let (nb, kb) = (n.div_ceil(128), k.div_ceil(128));
        let s: Vec<f32> = (0..nb * kb)
            .map(|_| 1e-3 * (0.5 + rng.random::<f32>()))
            .collect();
        adec = ab
            .iter()
            .map(|&b| e4m3_to_f32(b) * a_scale)
            .collect::<Vec<_>>();
        wdec = (0..n * k)
            .map(|i| e4m3_to_f32(wb[i]) * s[(i / k / 128) * kb + (i % k) / 128])
            .collect::<Vec<_>>();
        abytes = ab;
        wbytes = wb;
        wsc = s;
        asc = vec![a_scale];
    } else {
        let mk = |len: usize, rng: &mut StdRng| -> Vec<u16> {
            (0..len)
                .map(|_| bf16::from_f32(rng.random::<f32>() - 0.5).to_bits())
                .collect()
        };
        let a16 = mk(m * k, rng);
        let w16 = mk(n * k, rng);
        adec = a16.iter().map(|&b| bf16_to_f32(b)).collect();
        wdec = w16.iter().map(|&b| bf16_to_f32(b)).collect();
        abytes = a16.iter().flat_map(|b| b.to_le_bytes()).collect();
        wbytes = w16.iter().flat_map(|b| b.to_le_bytes()).collect();
        wsc = vec![0f32];
        asc = vec![0f32];
    }
    let (da, dw, dws, das) = (
        gpu.upload(&abytes)?,
        gpu.upload(&wbytes)?,
        gpu.upload(&wsc)?,
        gpu.upload(&asc)?,
    );
    let mut c = gpu.poisoned(m * n)?;
    launch(gpu, &f, tile, &da, &dw, &mut c, m, n, k, &dws, &das)?;
    let got = gpu.download(&c)?;
    // check every row when small, else 24 spread rows (first, last and between)
    let rows: Vec<usize> = if m * n * k <= 1 << 28 {
        (0..m).collect()
    } else {
        (0..24).map(|i| i * (m - 1) / 23).collect()
    };
    let want = reference(&adec, &wdec, n, k, &rows);
    let got_rows: Vec<f32> = rows
        .iter()
        .flat_map(|&r| got[r * n..(r + 1) * n].to_vec())
        .collect();
    let err = rel_err(&got_rows, &want).max(if got.iter().all(|v| v.is_finite()) {
        0.0
    } else {
        f64::INFINITY
    });
    let us = gpu.time_graph(10, 10, |_| {
        launch(gpu, &f, tile, &da, &dw, &mut c, m, n, k, &dws, &das)
    })? * 1e3;
    Ok((err, us))
}

pub fn checks(gpu: &Gpu, rows: &mut Vec<Row>) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(0x6e33);
    let fp8_ok = gpu.arch != "sm_80" && gpu.arch != "sm_86";
    for fp8 in [false, true] {
        if fp8 && !fp8_ok {
            continue;
        }
        for tile in [64usize, 128] {
            let name = format!(
                "{}{}",
                if fp8 { "gemm_e4m3" } else { "gemm_bf16" },
                if tile == 128 { "_t128" } else { "" }
            );
            for (m, n, k) in [
                (200usize, 300usize, 520usize),
                (130, 200, 320),
                (512, 4096, 4096),
                (4096, 4096, 4096),
            ] {
                let k = if fp8 && k % 16 != 0 { k + 8 } else { k };
                let (err, us) = case(gpu, fp8, tile, m, n, k, &mut rng)?;
                let tflops = 2.0 * (m * n * k) as f64 / (us * 1e-6) / 1e12;
                rows.push(Row {
                    name: name.clone(),
                    err,
                    bound: 1e-4,
                    us,
                    note: format!("M={m} N={n} K={k}: {tflops:.1} TFLOP/s"),
                });
            }
        }
    }
    Ok(())
}
