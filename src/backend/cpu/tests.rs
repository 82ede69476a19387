//! Every CPU op against a direct computation written independently here.
#![allow(clippy::needless_range_loop)] // direct index loops are the point of a reference

use super::*;
use crate::backend::{
    step_at, Activation, AttnParams, KvShape, LogitRows, MoeParams, Norm, Rope, StepOf, StepPlan,
};

/// The step of `t`'s rows at positions `pos0 ..`.
fn st(b: &CpuBackend, pos0: usize, t: &CpuTensor) -> StepOf<CpuBackend> {
    step_at(b, pos0, t.rows).unwrap()
}

/// The step of `ids` at positions `0 ..`.
fn ids(b: &CpuBackend, ids: &[u32]) -> StepOf<CpuBackend> {
    b.step(StepPlan::single(ids, 0, LogitRows::All).unwrap())
        .unwrap()
}
use crate::quant::GgmlType;
use crate::weights::{Scales, TensorFormat, TensorRef};

/// Small deterministic generator (tests only).
struct Lcg(u64);
impl Lcg {
    fn f(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn weight(b: &CpuBackend, name: &str, shape: &[usize], bytes: &[u8], ty: GgmlType) -> CpuWeight {
    let t = TensorRef {
        name: name.into(),
        shape: shape.to_vec(),
        format: TensorFormat::Ggml(ty),
        data: bytes,
        scales: Scales::default(),
    };
    b.upload(&t).unwrap()
}

fn naive_matmul(x: &[f32], n: usize, k: usize, w: &[f32], out: usize) -> Vec<f32> {
    let mut y = vec![0f32; n * out];
    for i in 0..n {
        for o in 0..out {
            let mut s = 0f64;
            for j in 0..k {
                s += x[i * k + j] as f64 * w[o * k + j] as f64;
            }
            y[i * out + o] = s as f32;
        }
    }
    y
}

/// `got` within `bound` of `want` by the selftest's element metric.
fn assert_close(got: &[f32], want: &[f32], bound: f64) {
    let c = crate::ops::compare::Comparison::new(got, want);
    assert!(c.passes(bound), "{c:?} against a bound of {bound:e}");
}

/// Q8_0 blocks from random scales and int8 values, and their exact f32 values.
fn q8_0(rng: &mut Lcg, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut vals = Vec::new();
    for _ in 0..rows * cols / 32 {
        let d = half::f16::from_f32(rng.f().abs() * 0.05 + 0.01);
        bytes.extend_from_slice(&d.to_bits().to_le_bytes());
        for _ in 0..32 {
            let q = (rng.f() * 127.0) as i8;
            bytes.push(q as u8);
            vals.push(d.to_f32() * q as f32);
        }
    }
    (bytes, vals)
}

#[test]
fn linear_f32_and_q8_0_match_naive() {
    let b = CpuBackend::new();
    let mut rng = Lcg(1);
    for &(n, k, out) in &[(1, 64, 37), (5, 64, 16), (3, 96, 33)] {
        let xv = rng.vec(n * k);
        let x = b.tensor(&xv, n, k).unwrap();
        let wv = rng.vec(out * k);
        let w = weight(&b, "w", &[out, k], &f32_bytes(&wv), GgmlType::F32);
        let y = b.linear(&x, &w).unwrap();
        assert_eq!(b.dims(&y), (n, out));
        assert_close(&y.data, &naive_matmul(&xv, n, k, &wv, out), 1e-5);

        let (qb, qv) = q8_0(&mut rng, out, k);
        let want = naive_matmul(&xv, n, k, &qv, out);
        let r = CpuBackend::new();
        let wq = weight(&r, "wq", &[out, k], &qb, GgmlType::Q8_0);
        let y = r.linear(&x, &wq).unwrap();
        assert_close(&y.data, &want, 1e-5);
        // int8 activations: within the activation rounding (|x| <= 1, 1/254 per value)
        let y = CpuBackend::int8().linear(&x, &wq).unwrap();
        let bound: f32 = qv.iter().map(|v| v.abs()).fold(0.0, f32::max) * k as f32 / 254.0;
        for (g, w) in y.data.iter().zip(&want) {
            assert!((g - w).abs() <= bound, "{g} vs {w} (bound {bound})");
        }
        assert_ne!(y.data, want, "the int8 path is in use");
    }
}

#[test]
fn shape_errors_are_typed() {
    let b = CpuBackend::new();
    let x = b.tensor(&[0.0; 6], 2, 3).unwrap();
    let w = weight(&b, "w", &[2, 4], &f32_bytes(&[0.0; 8]), GgmlType::F32);
    assert!(matches!(
        b.linear(&x, &w),
        Err(BackendError::Shape { op: "linear", .. })
    ));
    assert!(b.tensor(&[0.0; 5], 2, 3).is_err());
    let y = b.tensor(&[0.0; 4], 2, 2).unwrap();
    assert!(matches!(b.add(&x, &y), Err(BackendError::Shape { .. })));
    assert!(b.slice_cols(&x, 2, 2).is_err());
    assert!(b.split_heads(&x, 2, &[1, 1]).is_err());
    assert!(b.rms_norm(&x, Norm::None, 1e-6, 2).is_err());
    assert!(b.embed(&w, &ids(&b, &[2]), 1.0).is_err());
    // a short quantised tensor is refused at upload
    let t = TensorRef {
        name: "short".into(),
        shape: vec![2, 32],
        format: TensorFormat::Ggml(GgmlType::Q8_0),
        data: &[0u8; 40],
        scales: Scales::default(),
    };
    assert!(b.upload(&t).is_err());
}

#[test]
fn embed_rows_scaled() {
    let b = CpuBackend::new();
    let mut rng = Lcg(2);
    let (qb, qv) = q8_0(&mut rng, 10, 32);
    let w = weight(&b, "emb", &[10, 32], &qb, GgmlType::Q8_0);
    let e = b.embed(&w, &ids(&b, &[3, 0, 9]), 2.0).unwrap();
    for (r, &id) in [3usize, 0, 9].iter().enumerate() {
        let want: Vec<f32> = qv[id * 32..(id + 1) * 32].iter().map(|v| v * 2.0).collect();
        assert_eq!(e.row(r), &want[..]);
    }
    assert_eq!(b.weight_vector(&w).unwrap().data, qv);
}

#[test]
fn elementwise_ops() {
    let b = CpuBackend::new();
    let mut rng = Lcg(3);
    let (av, bv) = (rng.vec(6), rng.vec(6));
    let a = b.tensor(&av, 2, 3).unwrap();
    let c = b.tensor(&bv, 2, 3).unwrap();
    let row = b.tensor(&bv[..3], 1, 3).unwrap();
    let each = |t: CpuTensor, f: &dyn Fn(usize) -> f32| {
        for i in 0..6 {
            assert!((t.data[i] - f(i)).abs() < 1e-6, "{i}");
        }
    };
    each(b.add(&a, &c).unwrap(), &|i| av[i] + bv[i]);
    each(b.mul(&a, &c).unwrap(), &|i| av[i] * bv[i]);
    each(b.mul(&a, &row).unwrap(), &|i| av[i] * bv[i % 3]);
    each(b.scale(&a, 3.0).unwrap(), &|i| av[i] * 3.0);
    let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
    each(b.glu(&a, &c, Activation::Silu).unwrap(), &|i| {
        av[i] * sig(av[i]) * bv[i]
    });
    let gelu = |v: f32| {
        0.5 * v
            * (1.0 + ((2.0f32 / std::f32::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
    };
    each(b.glu(&a, &c, Activation::GeluTanh).unwrap(), &|i| {
        gelu(av[i]) * bv[i]
    });
    each(b.sigmoid_gate(&a, &c).unwrap(), &|i| av[i] * sig(bv[i]));
    each(b.softcap(&a, 0.5).unwrap(), &|i| 0.5 * (av[i] / 0.5).tanh());
    // one gate per row
    let rowgate = b.tensor(&bv[..2], 2, 1).unwrap();
    each(b.sigmoid_gate(&a, &rowgate).unwrap(), &|i| {
        av[i] * sig(bv[i / 3])
    });
    // GDN gates with per-head A and dt_bias
    let (na, dt) = (
        b.tensor(&[-0.5, -2.0, -1.0], 1, 3).unwrap(),
        b.tensor(&[0.1, 0.2, 0.3], 1, 3).unwrap(),
    );
    let (g, beta) = b.gdn_gates(&a, &c, &na, &dt).unwrap();
    let sp = |v: f32| (1.0 + v.exp()).ln();
    each(g, &|i| {
        [-0.5, -2.0, -1.0][i % 3] * sp(av[i] + [0.1, 0.2, 0.3][i % 3])
    });
    each(beta, &|i| sig(bv[i]));
    assert!(b.gdn_gates(&a, &c, &rowgate, &dt).is_err());
}

#[test]
fn column_shuffles() {
    let b = CpuBackend::new();
    let xv: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let x = b.tensor(&xv, 2, 6).unwrap();
    let s = b.slice_cols(&x, 1, 3).unwrap();
    assert_eq!(s.data, vec![1.0, 2.0, 3.0, 7.0, 8.0, 9.0]);
    assert_eq!(b.slice_rows(&x, 1, 1).unwrap().data, xv[6..].to_vec());
    assert!(b.slice_rows(&x, 1, 2).is_err());
    let c = b.concat_cols(&[&s, &x]).unwrap();
    assert_eq!(c.cols, 9);
    assert_eq!(c.row(1), &[7.0, 8.0, 9.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]);
    let r = b
        .concat_rows(&[&x, &b.slice_rows(&x, 0, 1).unwrap()])
        .unwrap();
    assert_eq!((r.rows, r.cols), (3, 6));
    assert_eq!(r.row(2), x.row(0));
    assert!(b.concat_rows(&[&x, &s]).is_err());
    assert!(b.concat_rows(&[]).is_err());
    // 2 heads of [2 | 1]
    let parts = b.split_heads(&x, 2, &[2, 1]).unwrap();
    assert_eq!(parts[0].data, vec![0.0, 1.0, 3.0, 4.0, 6.0, 7.0, 9.0, 10.0]);
    assert_eq!(parts[1].data, vec![2.0, 5.0, 8.0, 11.0]);
}

#[test]
fn norms() {
    let b = CpuBackend::new();
    let mut rng = Lcg(4);
    let xv = rng.vec(8);
    let x = b.tensor(&xv, 2, 4).unwrap();
    let wv = rng.vec(2);
    let w = b.tensor(&wv, 1, 2).unwrap();
    let eps = 1e-5;
    for (form, plus) in [(Norm::Plain(&w), 0.0), (Norm::OnePlus(&w), 1.0)] {
        let y = b.rms_norm(&x, form, eps, 2).unwrap();
        for g in 0..4 {
            let (p, q) = (xv[2 * g], xv[2 * g + 1]);
            let r = ((p * p + q * q) / 2.0 + eps).sqrt();
            assert!((y.data[2 * g] - p / r * (plus + wv[0])).abs() < 1e-5);
            assert!((y.data[2 * g + 1] - q / r * (plus + wv[1])).abs() < 1e-5);
        }
    }
    let y = b.l2_norm(&x, 1e-6, 4).unwrap();
    for r in 0..2 {
        let n = (xv[r * 4..r * 4 + 4].iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
        for j in 0..4 {
            assert!((y.data[r * 4 + j] - xv[r * 4 + j] / n).abs() < 1e-6);
        }
    }
}

#[test]
fn rope_rotates_each_position() {
    let b = CpuBackend::new();
    let mut rng = Lcg(5);
    for layout in [
        crate::ops::RopeLayout::Neox,
        crate::ops::RopeLayout::Interleaved,
    ] {
        let rope = Rope {
            head_dim: 8,
            rot_dims: 4,
            theta: 1000.0,
            layout,
            freq_factors: Some(vec![1.0, 2.5]),
            freq_base_dims: 4,
        };
        let xv = rng.vec(3 * 16);
        let x = b.tensor(&xv, 3, 16).unwrap();
        let y = b.rope(&x, 2, &st(&b, 5, &x), &rope).unwrap();
        for r in 0..3 {
            let pos = (5 + r) as f64;
            for h in 0..2 {
                let v = &xv[r * 16 + h * 8..r * 16 + h * 8 + 8];
                let o = &y.data[r * 16 + h * 8..r * 16 + h * 8 + 8];
                for i in 0..2 {
                    let inv = 1000f64.powf(-(2.0 * i as f64) / 4.0) / [1.0, 2.5][i];
                    let (s, c) = ((pos * inv).sin() as f32, (pos * inv).cos() as f32);
                    let (a, bb) = if layout == crate::ops::RopeLayout::Neox {
                        (i, i + 2)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    assert!((o[a] - (v[a] * c - v[bb] * s)).abs() < 1e-5);
                    assert!((o[bb] - (v[a] * s + v[bb] * c)).abs() < 1e-5);
                }
                assert_eq!(&o[4..], &v[4..]);
            }
        }
    }
}

/// Attention written directly: scores over every visible key, softmax, weighted sum.
fn naive_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    pos0: usize,
    p: &AttnParams,
) -> Vec<f32> {
    let (h, hkv, hd) = (p.n_heads, p.n_kv_heads, p.head_dim);
    let mut out = vec![0f32; n * h * hd];
    for i in 0..n {
        let pos = pos0 + i;
        for head in 0..h {
            let kh = head * hkv / h;
            let keys: Vec<usize> = (0..=pos)
                .filter(|&j| p.window.is_none_or(|w| pos - j < w))
                .collect();
            let mut s: Vec<f64> = keys
                .iter()
                .map(|&j| {
                    let d: f64 = (0..hd)
                        .map(|t| {
                            (q[i * h * hd + head * hd + t] * k[j * hkv * hd + kh * hd + t]) as f64
                        })
                        .sum();
                    let d = d * p.scale as f64;
                    match p.softcap {
                        Some(c) => c as f64 * (d / c as f64).tanh(),
                        None => d,
                    }
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            s.iter_mut().for_each(|x| *x = (*x - m).exp());
            let z: f64 = s.iter().sum();
            for t in 0..hd {
                let acc: f64 = keys
                    .iter()
                    .zip(&s)
                    .map(|(&j, w)| w / z * v[j * hkv * hd + kh * hd + t] as f64)
                    .sum();
                out[i * h * hd + head * hd + t] = acc as f32;
            }
        }
    }
    out
}

#[test]
fn attention_matches_naive_incrementally() {
    let b = CpuBackend::new();
    let mut rng = Lcg(6);
    let (h, hkv, hd, total) = (4, 2, 8, 7);
    for (window, softcap) in [(None, None), (Some(3), None), (None, Some(2.0))] {
        let p = AttnParams {
            n_heads: h,
            n_kv_heads: hkv,
            head_dim: hd,
            scale: 0.4,
            window,
            softcap,
        };
        let (qv, kv, vv) = (
            rng.vec(total * h * hd),
            rng.vec(total * hkv * hd),
            rng.vec(total * hkv * hd),
        );
        let want = naive_attention(&qv, &kv, &vv, total, 0, &p);
        let mut cache = b.kv_cache(KvShape::full(hkv, hd, 16)).unwrap();
        // prefill 4, then 3 single steps
        let mut got = Vec::new();
        let mut pos = 0;
        for len in [4, 1, 1, 1] {
            let w = hkv * hd;
            let kt = b.tensor(&kv[pos * w..(pos + len) * w], len, w).unwrap();
            let vt = b.tensor(&vv[pos * w..(pos + len) * w], len, w).unwrap();
            b.kv_write(&mut cache, &st(&b, pos, &kt), &kt, &vt).unwrap();
            let qt = b
                .tensor(&qv[pos * h * hd..(pos + len) * h * hd], len, h * hd)
                .unwrap();
            got.extend(
                b.attention(&qt, &cache, &st(&b, pos, &qt), &p)
                    .unwrap()
                    .data,
            );
            pos += len;
        }
        assert_close(&got, &want, 1e-5);
        // rewind to 2 and replay position 2 gives the same row
        b.kv_truncate(&mut cache, 2).unwrap();
        let w = hkv * hd;
        let kt = b.tensor(&kv[2 * w..3 * w], 1, w).unwrap();
        let vt = b.tensor(&vv[2 * w..3 * w], 1, w).unwrap();
        b.kv_write(&mut cache, &st(&b, 2, &kt), &kt, &vt).unwrap();
        let qt = b.tensor(&qv[2 * h * hd..3 * h * hd], 1, h * hd).unwrap();
        assert_close(
            &b.attention(&qt, &cache, &st(&b, 2, &qt), &p).unwrap().data,
            &want[2 * h * hd..3 * h * hd],
            1e-5,
        );
        assert!(b.attention(&qt, &cache, &st(&b, 5, &qt), &p).is_err());
    }
    let mut small = b.kv_cache(KvShape::full(1, 2, 2)).unwrap();
    let t = b.tensor(&[0.0; 6], 3, 2).unwrap();
    assert!(matches!(
        b.kv_write(&mut small, &st(&b, 0, &t), &t, &t),
        Err(BackendError::KvOverflow { .. })
    ));
}

#[test]
fn ring_cache_attends_as_the_whole_cache_and_refuses_what_it_lost() {
    let b = CpuBackend::new();
    let mut rng = Lcg(16);
    let (h, hkv, hd, total, win) = (4, 2, 8, 60, 5);
    let p = AttnParams {
        n_heads: h,
        n_kv_heads: hkv,
        head_dim: hd,
        scale: 0.4,
        window: Some(win),
        softcap: None,
    };
    let w = hkv * hd;
    let (qv, kv, vv) = (
        rng.vec(total * h * hd),
        rng.vec(total * w),
        rng.vec(total * w),
    );
    let want = naive_attention(&qv, &kv, &vv, total, 0, &p);
    // 12 slots: passes of up to 12 - (5 - 1) = 8 rows keep every query's window
    let mut ring = b
        .kv_cache(KvShape {
            ring: Some(12),
            ..KvShape::full(hkv, hd, 100)
        })
        .unwrap();
    let mut got = Vec::new();
    let mut pos = 0;
    for len in [8, 3, 8, 1, 1, 7, 8, 8, 1, 8, 7] {
        let kt = b.tensor(&kv[pos * w..(pos + len) * w], len, w).unwrap();
        let vt = b.tensor(&vv[pos * w..(pos + len) * w], len, w).unwrap();
        b.kv_write(&mut ring, &st(&b, pos, &kt), &kt, &vt).unwrap();
        let qt = b
            .tensor(&qv[pos * h * hd..(pos + len) * h * hd], len, h * hd)
            .unwrap();
        got.extend(b.attention(&qt, &ring, &st(&b, pos, &qt), &p).unwrap().data);
        pos += len;
    }
    assert_eq!(pos, total);
    assert_close(&got, &want, 1e-5);
    assert_eq!((ring.len(), ring.oldest()), (60, 48));
    // a rewind inside the ring replays exactly
    b.kv_truncate(&mut ring, 55).unwrap();
    let kt = b.tensor(&kv[55 * w..56 * w], 1, w).unwrap();
    let vt = b.tensor(&vv[55 * w..56 * w], 1, w).unwrap();
    b.kv_write(&mut ring, &st(&b, 55, &kt), &kt, &vt).unwrap();
    let qt = b.tensor(&qv[55 * h * hd..56 * h * hd], 1, h * hd).unwrap();
    assert_close(
        &b.attention(&qt, &ring, &st(&b, 55, &qt), &p).unwrap().data,
        &want[55 * h * hd..56 * h * hd],
        1e-5,
    );
    // queries whose window reaches positions the ring overwrote are refused
    let qt = b.tensor(&qv[..h * hd], 1, h * hd).unwrap();
    assert!(b.attention(&qt, &ring, &st(&b, 50, &qt), &p).is_err());
    // so is one pass of more rows than the ring keeps for the window
    let mut small = b
        .kv_cache(KvShape {
            ring: Some(12),
            ..KvShape::full(hkv, hd, 100)
        })
        .unwrap();
    let kt = b.tensor(&kv[..14 * w], 14, w).unwrap();
    let vt = b.tensor(&vv[..14 * w], 14, w).unwrap();
    b.kv_write(&mut small, &st(&b, 0, &kt), &kt, &vt).unwrap();
    let qt = b.tensor(&qv[..14 * h * hd], 14, h * hd).unwrap();
    assert!(b.attention(&qt, &small, &st(&b, 0, &qt), &p).is_err());
    // without a window every position is needed: a wrapped ring refuses
    let full = AttnParams { window: None, ..p };
    let qt = b.tensor(&qv[..h * hd], 1, h * hd).unwrap();
    assert!(b.attention(&qt, &ring, &st(&b, 55, &qt), &full).is_err());
}

#[test]
fn moe_matches_dense_per_token() {
    let b = CpuBackend::new();
    let mut rng = Lcg(7);
    let (n, hid, ff, e, k) = (5, 32, 8, 4, 2);
    let (gv, uv, dv) = (
        rng.vec(e * ff * hid),
        rng.vec(e * ff * hid),
        rng.vec(e * hid * ff),
    );
    let g = weight(&b, "g", &[e, ff, hid], &f32_bytes(&gv), GgmlType::F32);
    let u = weight(&b, "u", &[e, ff, hid], &f32_bytes(&uv), GgmlType::F32);
    let d = weight(&b, "d", &[e, hid, ff], &f32_bytes(&dv), GgmlType::F32);
    let xv = rng.vec(n * hid);
    let lv: Vec<f32> = rng.vec(n * e).iter().map(|v| v * 3.0).collect();
    for norm in [true, false] {
        let p = MoeParams {
            n_experts: e,
            top_k: k,
            norm_topk: norm,
            act: Activation::Silu,
        };
        let y = b
            .moe(
                &b.tensor(&xv, n, hid).unwrap(),
                &b.tensor(&lv, n, e).unwrap(),
                &g,
                &u,
                &d,
                &p,
            )
            .unwrap();
        for t in 0..n {
            let l = &lv[t * e..(t + 1) * e];
            let z: f32 = l.iter().map(|v| v.exp()).sum();
            let mut pr: Vec<(usize, f32)> = l
                .iter()
                .enumerate()
                .map(|(i, v)| (i, v.exp() / z))
                .collect();
            pr.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
            pr.truncate(k);
            let s: f32 = pr.iter().map(|x| x.1).sum();
            let mut want = vec![0f32; hid];
            for &(ex, w) in &pr {
                let w = if norm { w / s } else { w };
                let x = &xv[t * hid..(t + 1) * hid];
                let gg = naive_matmul(x, 1, hid, &gv[ex * ff * hid..(ex + 1) * ff * hid], ff);
                let uu = naive_matmul(x, 1, hid, &uv[ex * ff * hid..(ex + 1) * ff * hid], ff);
                let hmid: Vec<f32> = gg
                    .iter()
                    .zip(&uu)
                    .map(|(a, c)| a / (1.0 + (-a).exp()) * c)
                    .collect();
                let dd = naive_matmul(&hmid, 1, ff, &dv[ex * hid * ff..(ex + 1) * hid * ff], hid);
                want.iter_mut().zip(dd).for_each(|(o, v)| *o += w * v);
            }
            assert_close(y.row(t), &want, 1e-4);
        }
    }
}

#[test]
fn conv1d_streams_like_whole_sequence() {
    let b = CpuBackend::new();
    let mut rng = Lcg(8);
    let (n, c, k) = (6, 5, 4);
    let wv = rng.vec(c * k);
    let w = weight(&b, "conv", &[c, 1, k], &f32_bytes(&wv), GgmlType::F32);
    let xv = rng.vec(n * c);
    let mut st = CpuTensor::zeros(k - 1, c);
    let whole = b
        .causal_conv1d_silu(&b.tensor(&xv, n, c).unwrap(), &w, &mut st)
        .unwrap();
    // direct: zero-padded causal conv
    for t in 0..n {
        for ch in 0..c {
            let mut s = 0f32;
            for j in 0..k {
                let src = t as isize - (k as isize - 1) + j as isize;
                if src >= 0 {
                    s += wv[ch * k + j] * xv[src as usize * c + ch];
                }
            }
            let want = s / (1.0 + (-s).exp());
            assert!((whole.data[t * c + ch] - want).abs() < 1e-5);
        }
    }
    let mut st2 = CpuTensor::zeros(k - 1, c);
    let mut parts = Vec::new();
    for (a, len) in [(0, 2), (2, 1), (3, 3)] {
        let x = b.tensor(&xv[a * c..(a + len) * c], len, c).unwrap();
        parts.extend(b.causal_conv1d_silu(&x, &w, &mut st2).unwrap().data);
    }
    assert_close(&parts, &whole.data, 1e-6);
    assert_eq!(st.data, st2.data);
}

#[test]
fn gated_delta_rule_matches_matrix_form() {
    let b = CpuBackend::new();
    let mut rng = Lcg(9);
    let (n, nv, dk, dv) = (5, 2, 4, 3);
    let (qv, kv, vv) = (
        rng.vec(n * nv * dk),
        rng.vec(n * nv * dk),
        rng.vec(n * nv * dv),
    );
    let gv: Vec<f32> = rng.vec(n * nv).iter().map(|x| -x.abs()).collect();
    let bv: Vec<f32> = rng.vec(n * nv).iter().map(|x| x.abs()).collect();
    let s0 = rng.vec(nv * dk * dv);
    let t = |v: &[f32], c: usize| b.tensor(v, v.len() / c, c).unwrap();
    let mut st = b.tensor(&s0, nv, dk * dv).unwrap();
    let got = b
        .gated_delta_rule(
            &t(&qv, nv * dk),
            &t(&kv, nv * dk),
            &t(&vv, nv * dv),
            &t(&gv, nv),
            &t(&bv, nv),
            &mut st,
            dk,
            dv,
        )
        .unwrap();
    // direct, with S as a dk x dv matrix per head in f64
    for h in 0..nv {
        let mut s: Vec<Vec<f64>> = (0..dk)
            .map(|i| {
                (0..dv)
                    .map(|j| s0[h * dk * dv + i * dv + j] as f64)
                    .collect()
            })
            .collect();
        for tt in 0..n {
            let kk: Vec<f64> = (0..dk)
                .map(|i| kv[tt * nv * dk + h * dk + i] as f64)
                .collect();
            let qq: Vec<f64> = (0..dk)
                .map(|i| qv[tt * nv * dk + h * dk + i] as f64)
                .collect();
            let decay = (gv[tt * nv + h] as f64).exp();
            let beta = bv[tt * nv + h] as f64;
            for row in s.iter_mut() {
                row.iter_mut().for_each(|x| *x *= decay);
            }
            for j in 0..dv {
                let skj: f64 = (0..dk).map(|i| s[i][j] * kk[i]).sum();
                let delta = beta * (vv[tt * nv * dv + h * dv + j] as f64 - skj);
                for i in 0..dk {
                    s[i][j] += kk[i] * delta;
                }
            }
            for j in 0..dv {
                let o: f64 = (0..dk).map(|i| s[i][j] * qq[i]).sum();
                assert!(
                    (got.data[tt * nv * dv + h * dv + j] as f64 - o).abs() < 1e-4,
                    "t{tt} h{h} j{j}"
                );
            }
        }
        for i in 0..dk {
            for j in 0..dv {
                assert!((st.data[h * dk * dv + i * dv + j] as f64 - s[i][j]).abs() < 1e-4);
            }
        }
    }
    assert!(b
        .gated_delta_rule(
            &t(&qv, nv * dk),
            &t(&kv, nv * dk),
            &t(&vv, nv * dv),
            &t(&gv, nv),
            &t(&bv, nv),
            &mut st,
            dk + 1,
            dv
        )
        .is_err());
}

/// A row without a logit above -inf (a model whose output is NaN) is an error naming that, not
/// token 0; a row with a NaN among finite logits samples the finite maximum (greedy).
#[test]
fn sampling_refuses_rows_without_a_finite_logit() {
    let be = CpuBackend::new();
    let params = crate::sampling::SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let mut st = be.sampler_new(&params, &[], 4).unwrap();
    let nan = be.tensor(&[f32::NAN; 4], 1, 4).unwrap();
    let e = be.sample(nan, &mut st, &[]).unwrap_err();
    assert!(matches!(e, BackendError::NoFiniteLogit), "{e}");
    let mixed = be.tensor(&[f32::NAN, 0.5, 2.0, 1.0], 1, 4).unwrap();
    assert_eq!(be.sample(mixed, &mut st, &[]).unwrap(), 2);
}
