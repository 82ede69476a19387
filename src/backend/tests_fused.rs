//! The fused ops' default bodies (what `CpuBackend` runs) equal the compositions the models ran
//! before them, bit for bit: `add_rms_norm` = add, then rms_norm; `norm_add_rms_norm` = rms_norm
//! of the branch, add, scale, rms_norm; `attn_prep` = per-head
//! rms_norm of q / k / v, rope of q and k, kv_write. Caches are compared through what
//! attention reads from them.

use super::cpu::{CpuBackend, CpuTensor};
use super::{step_at, AttnParams, AttnPrep, KvShape, Norm, PostNorm, Rope};
use crate::backend::{Fused, Ops, Runtime};
use crate::ops::RopeLayout;

fn lcg(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
        })
        .collect()
}

fn t(be: &CpuBackend, seed: u64, rows: usize, cols: usize) -> CpuTensor {
    be.tensor(&lcg(seed, rows * cols), rows, cols).unwrap()
}

#[test]
fn add_rms_norm_default_is_add_then_norm() {
    let be = CpuBackend::new();
    for (rows, cols, dim, mode) in [(1, 256, 256, 0), (3, 96, 96, 1), (2, 128, 32, 2)] {
        let (a, b, w) = (
            t(&be, 1, rows, cols),
            t(&be, 2, rows, cols),
            t(&be, 3, 1, dim),
        );
        let n = || match mode {
            0 => Norm::Plain(&w),
            1 => Norm::OnePlus(&w),
            _ => Norm::None,
        };
        let (s, y) = be.add_rms_norm(&a, &b, n(), 1e-6, dim).unwrap();
        let s2 = be.add(&a, &b).unwrap();
        let y2 = be.rms_norm(&s2, n(), 1e-6, dim).unwrap();
        assert_eq!((s.rows, s.cols, y.rows, y.cols), (rows, cols, rows, cols));
        assert_eq!(s.data, s2.data);
        assert_eq!(y.data, y2.data);
    }
    // shape errors are errors
    let (a, b, w) = (t(&be, 1, 2, 64), t(&be, 2, 1, 64), t(&be, 3, 1, 64));
    assert!(be.add_rms_norm(&a, &b, Norm::Plain(&w), 1e-6, 64).is_err());
}

#[test]
fn norm_add_rms_norm_default_is_the_composition() {
    let be = CpuBackend::new();
    // (rows, cols, dim, branch norm mode, sum norm mode, scale)
    for (rows, cols, dim, bmode, mode, scale) in [
        (1, 256, 256, Some(0), 0, Some(0.7f32)),
        (3, 96, 96, Some(1), 1, None),
        (2, 128, 32, Some(2), 2, Some(2.0)),
        (1, 64, 64, None, 0, Some(0.5)),
        (2, 64, 64, None, 1, None),
    ] {
        let (a, b, wb, w) = (
            t(&be, 1, rows, cols),
            t(&be, 2, rows, cols),
            t(&be, 3, 1, dim),
            t(&be, 4, 1, dim),
        );
        let n = |m: u8, w| match m {
            0 => Norm::Plain(w),
            1 => Norm::OnePlus(w),
            _ => Norm::None,
        };
        let post = PostNorm {
            norm: bmode.map(|m| n(m, &wb)),
            scale,
        };
        let (s, y) = be
            .norm_add_rms_norm(&a, &b, &post, n(mode, &w), 1e-6, dim)
            .unwrap();
        // the ops the Gemma decoder ran before: post norm, add, layer scalar, next norm
        let u = match bmode {
            Some(m) => be.rms_norm(&b, n(m, &wb), 1e-6, dim).unwrap(),
            None => b.clone(),
        };
        let mut s2 = be.add(&a, &u).unwrap();
        if let Some(c) = scale {
            s2 = be.scale(&s2, c).unwrap();
        }
        let y2 = be.rms_norm(&s2, n(mode, &w), 1e-6, dim).unwrap();
        assert_eq!((s.rows, s.cols, y.rows, y.cols), (rows, cols, rows, cols));
        assert_eq!(s.data, s2.data);
        assert_eq!(y.data, y2.data);
        if bmode.is_none() && scale.is_none() {
            let (s3, y3) = be.add_rms_norm(&a, &b, n(mode, &w), 1e-6, dim).unwrap();
            assert_eq!((s3.data, y3.data), (s.data, y.data));
        }
    }
    // shape errors are errors
    let (a, b, w) = (t(&be, 1, 2, 64), t(&be, 2, 1, 64), t(&be, 3, 1, 64));
    let post = PostNorm {
        norm: Some(Norm::Plain(&w)),
        scale: Some(0.5),
    };
    assert!(be
        .norm_add_rms_norm(&a, &b, &post, Norm::Plain(&w), 1e-6, 64)
        .is_err());
}

/// Attention output of every position `0..len` of `cache` for the queries `q` (rows at `0..`).
fn read_cache(
    be: &CpuBackend,
    cache: &<CpuBackend as Runtime>::KvCache,
    p: &AttnParams,
) -> Vec<f32> {
    let len = cache.len();
    let q = t(be, 99, len, p.n_heads * p.head_dim);
    let step = step_at(be, 0, len).unwrap();
    be.attention(&q, cache, &step, p).unwrap().data
}

#[test]
fn attn_prep_default_is_the_composition() {
    let be = CpuBackend::new();
    let (heads, hkv, hd) = (4usize, 2usize, 32usize);
    let ff: Vec<f32> = (0..8).map(|i| 1.0 + i as f32).collect();
    let ropes = [
        Rope {
            head_dim: hd,
            rot_dims: hd,
            theta: 1e6,
            layout: RopeLayout::Neox,
            freq_factors: None,
            freq_base_dims: hd,
        },
        Rope {
            head_dim: hd,
            rot_dims: 16,
            theta: 1e4,
            layout: RopeLayout::Interleaved,
            freq_factors: Some(ff),
            freq_base_dims: hd,
        },
    ];
    let shape = KvShape::full(hkv, hd, 16);
    let ap = AttnParams {
        n_heads: heads,
        n_kv_heads: hkv,
        head_dim: hd,
        scale: 0.2,
        window: None,
        softcap: None,
    };
    let w: Vec<CpuTensor> = (0..3).map(|i| t(&be, 10 + i, 1, hd)).collect();
    for (ri, rope) in ropes.iter().enumerate() {
        for modes in [
            [Some(0u8), Some(0u8), None],
            [Some(1), Some(2), Some(2)],
            [None, None, None],
        ] {
            let norm = |i: usize| {
                modes[i].map(|m| match m {
                    0 => Norm::Plain(&w[i]),
                    1 => Norm::OnePlus(&w[i]),
                    _ => Norm::None,
                })
            };
            let p = AttnPrep {
                n_heads: heads,
                n_kv_heads: hkv,
                q_norm: norm(0),
                k_norm: norm(1),
                v_norm: norm(2),
                eps: 1e-6,
                rope,
            };
            let (mut c1, mut c2) = (be.kv_cache(shape).unwrap(), be.kv_cache(shape).unwrap());
            // a 3-row prefill then a 1-row decode step
            for (pos0, rows, seed) in [(0usize, 3usize, 20u64), (3, 1, 30)] {
                let q = t(&be, seed + ri as u64, rows, heads * hd);
                let k = t(&be, seed + 1, rows, hkv * hd);
                let v = t(&be, seed + 2, rows, hkv * hd);
                let step = step_at(&be, pos0, rows).unwrap();
                let fused = be.attn_prep(&q, &k, &v, &mut c1, &step, &p).unwrap();
                // the composition the models ran before attn_prep existed
                let nq = match norm(0) {
                    Some(n) => be.rms_norm(&q, n, 1e-6, hd).unwrap(),
                    None => q.clone(),
                };
                let nk = match norm(1) {
                    Some(n) => be.rms_norm(&k, n, 1e-6, hd).unwrap(),
                    None => k.clone(),
                };
                let nv = match norm(2) {
                    Some(n) => be.rms_norm(&v, n, 1e-6, hd).unwrap(),
                    None => v.clone(),
                };
                let rq = be.rope(&nq, heads, &step, rope).unwrap();
                let rk = be.rope(&nk, hkv, &step, rope).unwrap();
                be.kv_write(&mut c2, &step, &rk, &nv).unwrap();
                assert_eq!(fused.data, rq.data, "rope {ri} modes {modes:?} at {pos0}");
            }
            assert_eq!(c1.len(), 4);
            assert_eq!(read_cache(&be, &c1, &ap), read_cache(&be, &c2, &ap));
        }
    }
    // shape errors are errors, not panics
    let p = AttnPrep {
        n_heads: heads,
        n_kv_heads: hkv,
        q_norm: None,
        k_norm: None,
        v_norm: None,
        eps: 1e-6,
        rope: &ropes[0],
    };
    let mut c = be.kv_cache(shape).unwrap();
    let (q, k) = (t(&be, 1, 1, heads * hd), t(&be, 2, 1, hkv * hd));
    let bad_v = t(&be, 3, 1, hkv * hd - 1);
    let step = step_at(&be, 0, 1).unwrap();
    assert!(be.attn_prep(&q, &k, &bad_v, &mut c, &step, &p).is_err());
}

fn r<'a>(
    ty: crate::quant::GgmlType,
    shape: Vec<usize>,
    data: &'a [u8],
) -> crate::weights::TensorRef<'a> {
    crate::weights::TensorRef {
        name: "w".into(),
        shape,
        format: crate::weights::TensorFormat::Ggml(ty),
        data,
        scales: crate::weights::Scales::default(),
    }
}

/// `moe_routed`'s default is the router `linear`, then `moe`, bit for bit.
#[test]
fn moe_routed_default_is_linear_then_moe() {
    use super::{Activation, MoeParams};
    use crate::ops::qdot::random_weights;
    use crate::quant::GgmlType;
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let (e, h, f) = (8usize, 64usize, 32usize);
    let rw = random_weights(GgmlType::F32, e, h, &mut rng).unwrap();
    let gw = random_weights(GgmlType::Q8_0, e * f, h, &mut rng).unwrap();
    let uw = random_weights(GgmlType::Q8_0, e * f, h, &mut rng).unwrap();
    let dw = random_weights(GgmlType::Q4_0, e * h, f, &mut rng).unwrap();
    let p = MoeParams {
        n_experts: e,
        top_k: 2,
        norm_topk: true,
        act: Activation::Silu,
    };
    for be in [CpuBackend::new(), CpuBackend::int8()] {
        let router = be.upload(&r(GgmlType::F32, vec![e, h], &rw)).unwrap();
        let gate = be.upload(&r(GgmlType::Q8_0, vec![e, f, h], &gw)).unwrap();
        let up = be.upload(&r(GgmlType::Q8_0, vec![e, f, h], &uw)).unwrap();
        let down = be.upload(&r(GgmlType::Q4_0, vec![e, h, f], &dw)).unwrap();
        let x = t(&be, 7, 3, h);
        let y = be.moe_routed(&x, &router, &gate, &up, &down, &p).unwrap();
        let l = be.linear(&x, &router).unwrap();
        let y2 = be.moe(&x, &l, &gate, &up, &down, &p).unwrap();
        assert_eq!((y.rows, y.cols), (3, h));
        assert_eq!(y.data, y2.data);
        // a router of the wrong width is an error, not a panic
        let bad = be
            .upload(&r(GgmlType::F32, vec![e, h / 2], &rw[..e * h * 2]))
            .unwrap();
        assert!(be.moe_routed(&x, &bad, &gate, &up, &down, &p).is_err());
    }
}

/// `linear_add_rms_norm_then`'s default is `linear`, `add_rms_norm` over the whole row, then
/// the consumers (`linear_glu`, or `linear` of each weight), bit for bit.
#[test]
fn linear_add_rms_norm_then_default_is_the_composition() {
    use super::{Activation, NormNext};
    use crate::ops::qdot::random_weights;
    use crate::quant::GgmlType;
    use rand::SeedableRng;
    let be = CpuBackend::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let (k, n, ff) = (64usize, 96usize, 32usize);
    let ow = random_weights(GgmlType::Q8_0, n, k, &mut rng).unwrap();
    let gw = random_weights(GgmlType::Q4_0, 2 * ff, n, &mut rng).unwrap();
    let qw = random_weights(GgmlType::F32, 40, n, &mut rng).unwrap();
    let o = be.upload(&r(GgmlType::Q8_0, vec![n, k], &ow)).unwrap();
    let gu = be.upload(&r(GgmlType::Q4_0, vec![2 * ff, n], &gw)).unwrap();
    let q = be.upload(&r(GgmlType::F32, vec![40, n], &qw)).unwrap();
    let (x, h, w) = (t(&be, 1, 1, k), t(&be, 2, 1, n), t(&be, 3, 1, n));
    let (s, outs) = be
        .linear_add_rms_norm_then(
            &x,
            &o,
            &h,
            Norm::OnePlus(&w),
            1e-6,
            &NormNext::Glu(&gu, Activation::Silu),
        )
        .unwrap();
    let y = be.linear(&x, &o).unwrap();
    let (s2, nrm) = be.add_rms_norm(&h, &y, Norm::OnePlus(&w), 1e-6, n).unwrap();
    assert_eq!(s.data, s2.data);
    assert_eq!(outs.len(), 1);
    assert_eq!(
        outs[0].data,
        be.linear_glu(&nrm, &gu, Activation::Silu).unwrap().data
    );
    let (_, outs) = be
        .linear_add_rms_norm_then(
            &x,
            &o,
            &h,
            Norm::OnePlus(&w),
            1e-6,
            &NormNext::Linear(&[&q, &gu]),
        )
        .unwrap();
    assert_eq!(outs.len(), 2);
    assert_eq!(outs[0].data, be.linear(&nrm, &q).unwrap().data);
    assert_eq!(outs[1].data, be.linear(&nrm, &gu).unwrap().data);
    // a residual of another width is an error
    let h_bad = t(&be, 2, 1, n + 32);
    assert!(be
        .linear_add_rms_norm_then(&x, &o, &h_bad, Norm::None, 1e-6, &NormNext::Linear(&[&q]))
        .is_err());
}
