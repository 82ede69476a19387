//! `kv_write` (f32 K/V rows into the paged FP8 E4M3 / F16 cache at device positions) vs the
//! host encoding of the same rows (`encode_kv`: FP8 rows each scaled on its own, their f16
//! scales beside them; `half::f16::from_f32`): exact, bytes and scales. Positions in shuffled
//! order, rows of magnitudes 2^-6 .. 2^6 and values far past E4M3's 448 (a row scale keeps
//! them), a row of zeros, and two rows at positions -1 and `capacity` that must not be written
//! anywhere. Two shapes are rings (`KvLayout::ring_pages` below the capacity's pages):
//! positions past the ring's size land on its pages modulo its length.

use super::attn_decode::{encode_kv, spread_rows};
use crate::backend::cuda::{CudaError, DevPtr, KvLayout, KvScales};
use crate::kernels::{KernelKey, KernelSpec, Op, Quant};
use crate::quant::e4m3_to_f32;
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};
use rand::seq::SliceRandom;

pub struct KvWriteCheck;

fn decode(quant: Quant, bytes: &[u8]) -> Vec<f32> {
    match quant {
        Quant::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        _ => bytes.iter().map(|&b| e4m3_to_f32(b)).collect(),
    }
}

impl KernelCheck for KvWriteCheck {
    fn name(&self) -> &'static str {
        "kv_write"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::KvWrite
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        1e-7 // bit-exact conversion expected
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let quant = spec.key.quant;
        let kvb = if quant == Quant::F16 { 2 } else { 1 };
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        // (hkv, head_dim, capacity, rows, ring pages: 0 = every page)
        for (ci, &(hkv, d, cap, n, ring)) in [
            (2usize, 128usize, 200usize, 37usize, 0usize),
            (1, 512, 70, 5, 0),
            (4, 64, 192, 192, 0),
            (2, 16, 100, 30, 0),
            (1, 32, 130, 66, 0),
            (2, 128, 700, 128, 2),
            (1, 256, 1000, 90, 3),
        ]
        .iter()
        .enumerate()
        {
            let pages = cap.div_ceil(64);
            let layout = KvLayout {
                hkv,
                head_dim: d,
                page_size: 64,
                capacity: cap,
                ring_pages: if ring == 0 { pages } else { ring },
                elem_bytes: kvb,
            };
            let row = hkv * d;
            let rows = n + 2;
            let mut k = spread_rows(&mut cx.rng, rows * row, d, 6.0);
            let mut v = uniform(&mut cx.rng, rows * row, -3.0, 3.0);
            k[0] = 1000.0; // past E4M3's range: the row's scale keeps it
            k[1] = -600.0;
            v[row..row + d].iter_mut().for_each(|x| *x = 0.0); // a row of zeros
                                                               // a ring takes positions of one ring's length past its end (distinct slots: rows
                                                               // that share a slot would race)
            let first = if ring == 0 { 0 } else { cap - 64 * ring - 7 };
            let last = if ring == 0 { cap } else { first + 64 * ring };
            let mut order: Vec<usize> = (first..last).collect();
            order.shuffle(&mut cx.rng);
            let mut pos: Vec<i32> = order[..n].iter().map(|&p| p as i32).collect();
            pos.push(cap as i32); // past the capacity: skipped
            pos.push(-1); // negative: skipped
            let (kb, _, kss) = encode_kv(quant, &k, d);
            let (vb, _, vss) = encode_kv(quant, &v, d);
            let fp8 = quant != Quant::F16;
            let mut want_k = vec![0u8; layout.bytes()];
            let mut want_v = vec![0u8; layout.bytes()];
            let mut want_ks = vec![0u16; layout.rows()];
            let mut want_vs = vec![0u16; layout.rows()];
            for (i, &p) in pos[..n].iter().enumerate() {
                for h in 0..hkv {
                    let dst = layout.elem_offset(p as usize, h) * kvb;
                    let src = (i * row + h * d) * kvb;
                    want_k[dst..dst + d * kvb].copy_from_slice(&kb[src..src + d * kvb]);
                    want_v[dst..dst + d * kvb].copy_from_slice(&vb[src..src + d * kvb]);
                    if fp8 {
                        let r = layout.elem_offset(p as usize, h) / d;
                        want_ks[r] = kss[i * hkv + h];
                        want_vs[r] = vss[i * hkv + h];
                    }
                }
            }
            let zeros = vec![0u8; layout.bytes()];
            let (dk, dv, dp) = (cx.dev.upload(&k)?, cx.dev.upload(&v)?, cx.dev.upload(&pos)?);
            let (kc, vc) = (cx.dev.upload(&zeros)?, cx.dev.upload(&zeros)?);
            let (dks, dvs) = (
                cx.dev.upload(&vec![0u16; layout.rows()])?,
                cx.dev.upload(&vec![0u16; layout.rows()])?,
            );
            let scales = if fp8 {
                KvScales {
                    k: DevPtr::of(&dks),
                    v: DevPtr::of(&dvs),
                }
            } else {
                KvScales::none()
            };
            let dev = cx.dev;
            let launch = || {
                dev.kv_write_rows(
                    spec,
                    &layout,
                    rows,
                    scales,
                    DevPtr::of(&dk),
                    DevPtr::of(&dv),
                    DevPtr::of(&dp),
                    DevPtr::of(&kc),
                    DevPtr::of(&vc),
                )
            };
            launch()?;
            let (gk, gv) = (dev.download(&kc)?, dev.download(&vc)?);
            cmp = cmp.merge(Comparison::new(
                &decode(quant, &gk),
                &decode(quant, &want_k),
            ));
            cmp = cmp.merge(Comparison::new(
                &decode(quant, &gv),
                &decode(quant, &want_v),
            ));
            if fp8 {
                let (gks, gvs) = (dev.download(&dks)?, dev.download(&dvs)?);
                let bad = gks.iter().zip(&want_ks).filter(|(a, b)| a != b).count()
                    + gvs.iter().zip(&want_vs).filter(|(a, b)| a != b).count();
                cmp = cmp.merge(Comparison::new(&[bad as f32], &[0.0]));
            }
            if gk != want_k || gv != want_v {
                // a byte-level difference the decoded comparison could hide (e.g. -0 vs +0)
                let diff = gk.iter().zip(&want_k).filter(|(a, b)| a != b).count()
                    + gv.iter().zip(&want_v).filter(|(a, b)| a != b).count();
                let bytes_only = Comparison::new(&[diff as f32], &[0.0]);
                cmp = cmp.merge(bytes_only);
            }
            if ci == 0 {
                micros = time_us(dev, cx.iters, launch)?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}
