//! `attn_prep` instances vs `crate::ops::{rms_norm, rope}` and the cache encoding of
//! `kv_write` (`crate::quant::f32_to_e4m3`, `half::f16::from_f32`): the rotated q (f32) and
//! every byte of both caches. Qwen3 decode (plain q/k norms, no v norm), several rows at
//! shuffled positions plus two rows at -1 and `capacity` that must write nothing, Gemma 4
//! global layers (head_dim 512, p-RoPE with freq factors, weightless v-norm), interleaved
//! partial RoPE without norms, the golden models' head_dim 16, head_dim 256 with interleaved
//! partial RoPE, and a Qwen3-8B prefill of 512 rows.
//!
//! Every case also runs the multi-row entry of its head dim (`__rows4/8/16`) into fresh outputs:
//! against the same reference, and against the main entry's q and cache bytes exactly (one warp
//! per head reproduces the block's rounding, see `lib/rmsnorm`'s `rms_norm_warp`). The time is
//! the multi-row entry on the 512-row prefill (32 q + 8 K + 8 V heads of 128 per row).
//!
//! Cache values are compared after decoding, element by element against the reference value
//! encoded on the host; where the two codes differ only because the reference value sits within
//! 1e-5 (relative) of the midpoint between them (a rounding tie that f32 noise of the norm can
//! tip either way), the GPU code counts as exact. Anything else is an error of at least one
//! FP8 / F16 step and fails the bound.

use crate::backend::cuda::KvScales;
use crate::backend::cuda::{
    attn_prep_rows_suffix, AttnPrepBufs, AttnPrepLaunch, CudaError, DevPtr, Kern, KvLayout,
    NormWeightPtr, RowPages,
};
use crate::backend::kv_type::fp8_row_scale;
use crate::kernels::{KernelKey, KernelSpec, Op, Quant};
use crate::ops::{rms_norm, rope, NormWeight, RopeLayout, RopeSpec};
use crate::quant::{e4m3_to_f32, f32_to_e4m3};
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};
use rand::seq::SliceRandom;

pub struct AttnPrepCheck;

/// Decode cache bytes of `quant` (FP8 E4M3 or F16) to f32.
pub(crate) fn decode_cache(quant: Quant, bytes: &[u8]) -> Vec<f32> {
    match quant {
        Quant::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        _ => bytes.iter().map(|&b| e4m3_to_f32(b)).collect(),
    }
}

/// `x` stored in `quant` and read back (FP8: in a row whose scale is `s`).
fn round_trip(quant: Quant, x: f32, s: f32) -> f32 {
    match quant {
        Quant::F16 => half::f16::from_f32(x).to_f32(),
        _ => e4m3_to_f32(f32_to_e4m3(x * (1.0 / s))) * s,
    }
}

/// Cache bytes `got` (FP8: rows of `d` elements with their f16 `scales`) against the f32
/// values `want` (one per element, 0 where nothing is written) stored in `quant`: the decoded
/// values and what each should decode to (see the module docs: exact up to rounding ties), then
/// for FP8 each written row's scale and what it should be (`fp8_row_scale` of the reference row:
/// the same f16, or its neighbour where the row's largest value sits within f32 noise of an f16
/// boundary).
pub(crate) fn cache_expect(
    quant: Quant,
    got: &[u8],
    scales: &[u16],
    want: &[f32],
    d: usize,
) -> (Vec<f32>, Vec<f32>) {
    let fp8 = quant != Quant::F16;
    let raw = decode_cache(quant, got);
    if raw.len() != want.len() || (fp8 && scales.len() * d != want.len()) {
        return (raw, want.to_vec());
    }
    let rms = (want.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / want.len().max(1) as f64)
        .sqrt() as f32;
    let (mut g, mut expect) = (Vec::with_capacity(raw.len()), Vec::with_capacity(raw.len()));
    let (mut gs, mut es) = (Vec::new(), Vec::new());
    for (r, (rg, rw)) in raw.chunks(d).zip(want.chunks(d)).enumerate() {
        let s = if fp8 {
            half::f16::from_bits(scales[r]).to_f32()
        } else {
            1.0
        };
        if fp8 && rw.iter().any(|&x| x != 0.0) {
            let sr = fp8_row_scale(rw);
            let near = |a: half::f16| a.to_bits().abs_diff(scales[r]) <= 1;
            gs.push(s);
            es.push(if near(sr) { s } else { sr.to_f32() });
        }
        for (&x, &gr) in rw.iter().zip(rg) {
            let gv = if fp8 { gr * s } else { gr };
            let w = round_trip(quant, x, s);
            let mid = 0.5 * (w + gv);
            let tie = w != gv && (x - mid).abs() <= 1e-5 * x.abs().max(rms * 1e-3);
            g.push(gv);
            expect.push(if tie { gv } else { w });
        }
    }
    g.extend(gs);
    expect.extend(es);
    (g, expect)
}

/// [`cache_expect`] as a comparison.
fn cache_cmp(quant: Quant, got: &[u8], scales: &[u16], want: &[f32], d: usize) -> Comparison {
    let (g, e) = cache_expect(quant, got, scales, want, d);
    Comparison::new(&g, &e)
}

/// One case: shape, RoPE, norm modes (None: no norm; Some(0) plain, Some(1) 1+w, Some(2)
/// weightless) and the cache capacity.
struct Case {
    rows: usize,
    heads: usize,
    hkv: usize,
    d: usize,
    rot: usize,
    fbd: usize,
    layout: RopeLayout,
    theta: f32,
    ff: bool,
    modes: [Option<u8>; 3],
    cap: usize,
}

fn cases() -> Vec<Case> {
    let c = |rows, heads, hkv, d, rot, fbd, layout, theta, ff, modes, cap| Case {
        rows,
        heads,
        hkv,
        d,
        rot,
        fbd,
        layout,
        theta,
        ff,
        modes,
        cap,
    };
    use RopeLayout::{Interleaved, Neox};
    vec![
        c(
            1,
            32,
            8,
            128,
            128,
            128,
            Neox,
            1e6,
            false,
            [Some(0), Some(0), None],
            4096,
        ),
        c(
            5,
            8,
            2,
            128,
            128,
            128,
            Neox,
            1e6,
            false,
            [Some(1), Some(1), None],
            200,
        ),
        c(
            2,
            4,
            1,
            512,
            128,
            512,
            Neox,
            1e6,
            true,
            [Some(0), Some(0), Some(2)],
            70,
        ),
        c(
            3,
            4,
            2,
            64,
            32,
            32,
            Interleaved,
            1e4,
            false,
            [None, None, None],
            130,
        ),
        c(
            4,
            4,
            2,
            16,
            16,
            16,
            Neox,
            1e4,
            false,
            [Some(1), Some(0), Some(2)],
            64,
        ),
        // head_dim 256 (the __rows8 entry), interleaved partial RoPE, 1+w v-norm, 12 rows
        c(
            12,
            6,
            3,
            256,
            64,
            64,
            Interleaved,
            1e4,
            false,
            [Some(0), None, Some(1)],
            300,
        ),
        // last: a Qwen3-8B prefill of 512 rows (32 q + 8 KV heads of 128), timed on __rows4
        c(
            512,
            32,
            8,
            128,
            128,
            128,
            Neox,
            1e6,
            false,
            [Some(0), Some(0), None],
            4096,
        ),
    ]
}

fn norm_ref(x: &mut [f32], mode: Option<u8>, w: &[f32], eps: f32) {
    let nw = match mode {
        None => return,
        Some(0) => NormWeight::Plain(w),
        Some(1) => NormWeight::OnePlus(w),
        Some(_) => NormWeight::None,
    };
    let src = x.to_vec();
    rms_norm(&src, nw, eps, w.len(), x);
}

impl KernelCheck for AttnPrepCheck {
    fn name(&self) -> &'static str {
        "attn_prep"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::AttnPrep
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        2e-5 // as rmsnorm / rope; the caches exact up to rounding ties
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let quant = spec.key.quant;
        let kvb = if quant == Quant::F16 { 2 } else { 1 };
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let eps = 1e-6f32;
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        let n_cases = cases().len();
        for (ci, c) in cases().into_iter().enumerate() {
            // some caches are rings of fewer pages than the capacity's (sliding-window layers)
            let ring = match c.cap {
                200 | 300 => 2,
                4096 => 8,
                _ => c.cap.div_ceil(64),
            };
            let layout = KvLayout {
                hkv: c.hkv,
                head_dim: c.d,
                page_size: 64,
                capacity: c.cap,
                ring_pages: ring,
                elem_bytes: kvb,
            };
            // c.rows rows at distinct positions (distinct ring slots: the latest ring's length of
            // positions), then (multi-row cases) two that write nothing
            let extra = if c.rows > 1 { 2 } else { 0 };
            let rows = c.rows + extra;
            let first = c.cap.saturating_sub(64 * ring + 3);
            let mut order: Vec<usize> = (first..(first + 64 * ring).min(c.cap)).collect();
            order.shuffle(&mut cx.rng);
            let mut pos: Vec<i32> = order[..c.rows].iter().map(|&p| p as i32).collect();
            if extra > 0 {
                pos.push(c.cap as i32);
                pos.push(-1);
            }
            let (qw, kw) = (c.heads * c.d, c.hkv * c.d);
            let q = uniform(&mut cx.rng, rows * qw, -3.0, 3.0);
            let k = uniform(&mut cx.rng, rows * kw, -3.0, 3.0);
            let v = uniform(&mut cx.rng, rows * kw, -3.0, 3.0);
            let w: Vec<Vec<f32>> = (0..3)
                .map(|_| uniform(&mut cx.rng, c.d, -1.0, 1.5))
                .collect();
            let ff: Option<Vec<f32>> = c.ff.then(|| uniform(&mut cx.rng, c.rot / 2, 1.0, 8.0));
            let rs = RopeSpec {
                head_dim: c.d,
                rot_dims: c.rot,
                theta: c.theta,
                layout: c.layout,
                freq_factors: ff.as_deref(),
                freq_base_dims: c.fbd,
            };
            // reference: q rotated; the caches as f32 values at their elements
            let mut want_q = q.clone();
            let cache_elems = layout.bytes() / kvb;
            let (mut want_k, mut want_v) = (vec![0f32; cache_elems], vec![0f32; cache_elems]);
            for r in 0..rows {
                let qr = &mut want_q[r * qw..(r + 1) * qw];
                if pos[r] < 0 {
                    // a negative position: q is rotated by it, which ops::rope cannot express
                    qr.fill(f32::NAN);
                    continue;
                }
                let p = pos[r] as usize;
                for h in qr.chunks_exact_mut(c.d) {
                    norm_ref(h, c.modes[0], &w[0], eps);
                    rope(h, 1, p, &rs);
                }
                if p >= c.cap {
                    continue;
                }
                for h in 0..c.hkv {
                    let src = r * kw + h * c.d;
                    let mut kh = k[src..src + c.d].to_vec();
                    norm_ref(&mut kh, c.modes[1], &w[1], eps);
                    rope(&mut kh, 1, p, &rs);
                    let mut vh = v[src..src + c.d].to_vec();
                    norm_ref(&mut vh, c.modes[2], &w[2], eps);
                    let dst = layout.elem_offset(p, h);
                    want_k[dst..dst + c.d].copy_from_slice(&kh);
                    want_v[dst..dst + c.d].copy_from_slice(&vh);
                }
            }
            let (dq, dk, dv) = (cx.dev.upload(&q)?, cx.dev.upload(&k)?, cx.dev.upload(&v)?);
            let dpos = cx.dev.upload(&pos)?;
            let dw: Vec<_> = w
                .iter()
                .map(|x| cx.dev.upload(x))
                .collect::<Result<_, _>>()?;
            let dff = match &ff {
                Some(f) => Some(cx.dev.upload(f)?),
                None => None,
            };
            let dout = cx.dev.filled_f32(rows * qw, f32::NAN)?;
            let zeros = vec![0u8; layout.bytes()];
            let (kc, vc) = (cx.dev.upload(&zeros)?, cx.dev.upload(&zeros)?);
            let fp8 = quant != Quant::F16;
            let zs = vec![0u16; layout.rows()];
            let scales_of = |k: &cudarc::driver::CudaSlice<u16>,
                             v: &cudarc::driver::CudaSlice<u16>| {
                if fp8 {
                    KvScales {
                        k: DevPtr::of(k),
                        v: DevPtr::of(v),
                    }
                } else {
                    KvScales::none()
                }
            };
            let (ks1, vs1) = (cx.dev.upload(&zs)?, cx.dev.upload(&zs)?);
            let norm = |i: usize| {
                c.modes[i].map(|m| match m {
                    0 => NormWeightPtr::Plain(DevPtr::of(&dw[i])),
                    1 => NormWeightPtr::OnePlus(DevPtr::of(&dw[i])),
                    _ => NormWeightPtr::None,
                })
            };
            let bufs = AttnPrepBufs {
                q: DevPtr::of(&dq),
                k: DevPtr::of(&dk),
                v: DevPtr::of(&dv),
                pos: DevPtr::of(&dpos),
                freq_factors: dff.as_ref().map(DevPtr::of),
                q_norm: norm(0),
                k_norm: norm(1),
                v_norm: norm(2),
                q_out: DevPtr::of(&dout),
                k_cache: DevPtr::of(&kc),
                v_cache: DevPtr::of(&vc),
                scales: scales_of(&ks1, &vs1),
                page0: None,
            };
            let lp = AttnPrepLaunch {
                rows,
                n_heads: c.heads,
                rot_dims: c.rot,
                freq_base_dims: c.fbd,
                layout: c.layout,
                theta: c.theta,
                eps,
            };
            let dev = cx.dev;
            let prefill = ci + 1 == n_cases;
            dev.attn_prep_ptr(&kern, &lp, &layout, &bufs)?;
            let (mq, mk, mv) = (dev.download(&dout)?, dev.download(&kc)?, dev.download(&vc)?);
            let (mks, mvs) = (dev.download(&ks1)?, dev.download(&vs1)?);
            cmp = cmp
                .merge(Comparison::new(&mq, &want_q))
                .merge(cache_cmp(quant, &mk, &mks, &want_k, c.d))
                .merge(cache_cmp(quant, &mv, &mvs, &want_v, c.d));
            // the multi-row entry on the same inputs into fresh outputs: the reference as above,
            // and the main entry's q and cache bytes exactly
            let sfx = attn_prep_rows_suffix(c.d).ok_or_else(|| CudaError::Invalid {
                op: "attn_prep check",
                detail: format!("no multi-row entry for head dim {}", c.d),
            })?;
            let entry = dev.kern_entry(&kern, sfx)?;
            let dout2 = dev.filled_f32(rows * qw, f32::NAN)?;
            let (kc2, vc2) = (dev.upload(&zeros)?, dev.upload(&zeros)?);
            let (ks2, vs2) = (dev.upload(&zs)?, dev.upload(&zs)?);
            let bufs2 = AttnPrepBufs {
                q_out: DevPtr::of(&dout2),
                k_cache: DevPtr::of(&kc2),
                v_cache: DevPtr::of(&vc2),
                scales: scales_of(&ks2, &vs2),
                ..bufs
            };
            let launch_rows = || dev.attn_prep_rows_ptr(&entry, &lp, &layout, &bufs2);
            launch_rows()?;
            let (rq, rk, rv) = (
                dev.download(&dout2)?,
                dev.download(&kc2)?,
                dev.download(&vc2)?,
            );
            let (rks, rvs) = (dev.download(&ks2)?, dev.download(&vs2)?);
            let bytes = |b: &[u8]| b.iter().map(|&x| x as f32).collect::<Vec<_>>();
            let halves = |b: &[u16]| b.iter().map(|&x| x as f32).collect::<Vec<_>>();
            cmp = cmp
                .merge(Comparison::new(&rq, &want_q))
                .merge(cache_cmp(quant, &rk, &rks, &want_k, c.d))
                .merge(cache_cmp(quant, &rv, &rvs, &want_v, c.d))
                .merge(Comparison::identical(&rq, &mq))
                .merge(Comparison::identical(&bytes(&rk), &bytes(&mk)))
                .merge(Comparison::identical(&bytes(&rv), &bytes(&mv)))
                .merge(Comparison::identical(&halves(&rks), &halves(&mks)))
                .merge(Comparison::identical(&halves(&rvs), &halves(&mvs)));
            // every row one cache further (`page0`: the rows of a sequence in the second slot
            // of a two-slot arena), by both entries: the second half holds the main entry's
            // bytes above, the first stays zero
            let zeros2 = vec![0u8; 2 * layout.bytes()];
            let (kc3, vc3) = (dev.upload(&zeros2)?, dev.upload(&zeros2)?);
            let zs2 = vec![0u16; 2 * layout.rows()];
            let (ks3, vs3) = (dev.upload(&zs2)?, dev.upload(&zs2)?);
            let dpage0 = dev.upload(&vec![layout.ring_pages as i32; rows])?;
            let dout3 = dev.filled_f32(rows * qw, f32::NAN)?;
            let bufs3 = AttnPrepBufs {
                q_out: DevPtr::of(&dout3),
                k_cache: DevPtr::of(&kc3),
                v_cache: DevPtr::of(&vc3),
                scales: scales_of(&ks3, &vs3),
                page0: Some(RowPages {
                    pages: DevPtr::of(&dpage0),
                    max: layout.ring_pages,
                }),
                ..bufs
            };
            // both entries, the same bytes to the same places: one that ignored page0 would
            // write the first slot
            dev.attn_prep_ptr(&kern, &lp, &layout, &bufs3)?;
            dev.attn_prep_rows_ptr(&entry, &lp, &layout, &bufs3)?;
            let (sk, sv) = (dev.download(&kc3)?, dev.download(&vc3)?);
            let (sks, svs) = (dev.download(&ks3)?, dev.download(&vs3)?);
            let (nb, nr) = (layout.bytes(), layout.rows());
            let slot2 = |all: &[u8]| [bytes(&all[..nb]), bytes(&all[nb..])];
            let [k_lo, k_hi] = slot2(&sk);
            let [v_lo, v_hi] = slot2(&sv);
            cmp = cmp
                .merge(Comparison::identical(&dev.download(&dout3)?, &mq))
                .merge(Comparison::identical(&k_hi, &bytes(&mk)))
                .merge(Comparison::identical(&v_hi, &bytes(&mv)))
                .merge(Comparison::identical(&k_lo, &bytes(&zeros)))
                .merge(Comparison::identical(&v_lo, &bytes(&zeros)))
                .merge(Comparison::identical(&halves(&sks[nr..]), &halves(&mks)))
                .merge(Comparison::identical(&halves(&svs[nr..]), &halves(&mvs)));
            if prefill {
                micros = time_us(dev, cx.iters, launch_rows)?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}
