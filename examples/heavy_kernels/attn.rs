//! Decode attention over a paged FP8 E4M3 KV cache against `ops::attention_ref`.

use crate::gpu::{cfg, rel_err, Gpu, Row};
use anyhow::Result;
use cudarc::driver::{sys, CudaSlice, PushKernelArg};
use fucina::ops::attention_ref::{attention_decode, DecodeAttn};
use fucina::quant::{e4m3_to_f32, f32_to_e4m3};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

struct Case {
    d: usize,
    hq: usize,
    hkv: usize,
    lens: Vec<usize>,
    window: usize,
    softcap: f32,
    splits: u32,
}

fn run_case(gpu: &Gpu, c: &Case, rng: &mut StdRng, time: bool) -> Result<(f64, f64)> {
    let page = 64usize;
    let b = c.lens.len();
    let max_len = *c.lens.iter().max().unwrap();
    let max_pages = max_len.div_ceil(page);
    let pages = b * max_pages;
    // pages handed out in shuffled order so the block table is exercised
    let mut order: Vec<i32> = (0..pages as i32).collect();
    order.shuffle(rng);
    let kv_elems = pages * c.hkv * page * c.d;
    let kc: Vec<u8> = (0..kv_elems)
        .map(|_| f32_to_e4m3((rng.random::<f32>() - 0.5) * 4.0))
        .collect();
    let vc: Vec<u8> = (0..kv_elems)
        .map(|_| f32_to_e4m3((rng.random::<f32>() - 0.5) * 4.0))
        .collect();
    let q: Vec<f32> = (0..b * c.hq * c.d)
        .map(|_| rng.random::<f32>() - 0.5)
        .collect();
    let (k_scale, v_scale) = (0.5f32, 1.5f32);
    let scale = 1.0 / (c.d as f32).sqrt();
    let mut want = Vec::new();
    for (s, &len) in c.lens.iter().enumerate() {
        let mut kd = vec![0f32; len * c.hkv * c.d];
        let mut vd = vec![0f32; len * c.hkv * c.d];
        for j in 0..len {
            let pg = order[s * max_pages + j / page] as usize;
            for h in 0..c.hkv {
                let src = ((pg * c.hkv + h) * page + j % page) * c.d;
                let dst = (j * c.hkv + h) * c.d;
                for e in 0..c.d {
                    kd[dst + e] = e4m3_to_f32(kc[src + e]) * k_scale;
                    vd[dst + e] = e4m3_to_f32(vc[src + e]) * v_scale;
                }
            }
        }
        let p = DecodeAttn {
            hq: c.hq,
            hkv: c.hkv,
            head_dim: c.d,
            scale,
            softcap: c.softcap,
            window: c.window,
        };
        want.extend(attention_decode(
            &q[s * c.hq * c.d..(s + 1) * c.hq * c.d],
            &kd,
            &vd,
            len,
            &p,
        )?);
    }
    let f = gpu.function(&format!("attn_decode_fp8_hd{}", c.d))?;
    let g = c.hq / c.hkv;
    let smem = 4 * g * c.d + 4 * g * 128 + 8 * 128 + 128 * c.d;
    f.set_attribute(
        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )?;
    let comb = gpu.function("attn_combine")?;
    let (dq, dk, dv) = (gpu.upload(&q)?, gpu.upload(&kc)?, gpu.upload(&vc)?);
    let dbt = gpu.upload(&order)?;
    let lens: Vec<i32> = c.lens.iter().map(|&l| l as i32).collect();
    let dlens = gpu.upload(&lens)?;
    let mut po = gpu.poisoned(b * c.hq * c.splits as usize * c.d)?;
    let mut pml = gpu.poisoned(b * c.hq * c.splits as usize * 2)?;
    let mut out = gpu.poisoned(b * c.hq * c.d)?;
    let (hq, hkv, pg, mp) = (c.hq as i32, c.hkv as i32, page as i32, max_pages as i32);
    let (window, splits, d) = (c.window as i32, c.splits as i32, c.d as i32);
    let launch = |po: &mut CudaSlice<f32>,
                  pml: &mut CudaSlice<f32>,
                  out: &mut CudaSlice<f32>|
     -> Result<()> {
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&dq)
            .arg(&dk)
            .arg(&dv)
            .arg(&dbt)
            .arg(&dlens)
            .arg(&mut *po)
            .arg(&mut *pml);
        l.arg(&hq)
            .arg(&hkv)
            .arg(&pg)
            .arg(&mp)
            .arg(&scale)
            .arg(&k_scale)
            .arg(&v_scale)
            .arg(&c.softcap)
            .arg(&window);
        // SAFETY: matches ops/attn_decode's signature; buffers sized above.
        let mut lc = cfg((c.splits, c.hkv as u32, b as u32), 128);
        lc.shared_mem_bytes = smem as u32;
        unsafe { l.launch(lc) }?;
        let mut l = gpu.stream.launch_builder(&comb);
        l.arg(&*po).arg(&*pml).arg(out).arg(&splits).arg(&d);
        // SAFETY: matches ops/attn_combine's signature.
        unsafe { l.launch(cfg((c.hq as u32, b as u32, 1), 128)) }?;
        Ok(())
    };
    launch(&mut po, &mut pml, &mut out)?;
    let got = gpu.download(&out)?;
    let err = rel_err(&got, &want);
    let us = if time {
        gpu.time_graph(20, 10, |_| launch(&mut po, &mut pml, &mut out))? * 1e3
    } else {
        0.0
    };
    Ok((err, us))
}

pub fn checks(gpu: &Gpu, rows: &mut Vec<Row>) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(0xa77);
    let cases = [
        (
            "hd128 gqa4",
            Case {
                d: 128,
                hq: 32,
                hkv: 8,
                lens: vec![1000, 37],
                window: 0,
                softcap: 0.0,
                splits: 8,
            },
        ),
        (
            "hd128 1 split",
            Case {
                d: 128,
                hq: 4,
                hkv: 4,
                lens: vec![300],
                window: 0,
                softcap: 0.0,
                splits: 1,
            },
        ),
        (
            "hd256 swa1024 softcap",
            Case {
                d: 256,
                hq: 16,
                hkv: 8,
                lens: vec![1500, 700],
                window: 1024,
                softcap: 50.0,
                splits: 6,
            },
        ),
        (
            "hd256 gqa8",
            Case {
                d: 256,
                hq: 8,
                hkv: 1,
                lens: vec![513],
                window: 0,
                softcap: 0.0,
                splits: 16,
            },
        ),
        (
            "hd512 gqa16",
            Case {
                d: 512,
                hq: 16,
                hkv: 1,
                lens: vec![777, 1],
                window: 0,
                softcap: 0.0,
                splits: 8,
            },
        ),
        (
            "hd512 gqa4 swa",
            Case {
                d: 512,
                hq: 8,
                hkv: 2,
                lens: vec![2000],
                window: 512,
                softcap: 30.0,
                splits: 4,
            },
        ),
    ];
    for (label, c) in cases {
        let (err, us) = run_case(gpu, &c, &mut rng, true)?;
        rows.push(Row {
            name: format!("attn_decode_fp8_hd{}+combine", c.d),
            err,
            bound: 2e-3,
            us,
            note: format!("{label} lens={:?} splits={}", c.lens, c.splits),
        });
    }
    // long contexts for timing: KV bytes = len * hkv * d * 2 (K and V, one byte each)
    for (d, hq, hkv, splits) in [
        (256usize, 16usize, 8usize, 32u32),
        (256, 16, 8, 128),
        (512, 16, 1, 128),
        (128, 32, 8, 64),
    ] {
        let c = Case {
            d,
            hq,
            hkv,
            lens: vec![8192],
            window: 0,
            softcap: 0.0,
            splits,
        };
        let (err, us) = run_case(gpu, &c, &mut rng, true)?;
        let gbs = (8192 * hkv * d * 2) as f64 / (us * 1e-6) / 1e9;
        rows.push(Row {
            name: format!("attn_decode_fp8_hd{d}+combine"),
            err,
            bound: 2e-3,
            us,
            note: format!("timing: len 8192 hq{hq} hkv{hkv} splits{splits}: KV {gbs:.0} GB/s"),
        });
    }
    Ok(())
}
