//! Backend-level GPU check of the attention projections of a layer whose q and k share a format
//! and v does not (a Q4_K_M layer with a Q6_K `attn_v`), loaded as q|k fused and v apart
//! (`Qkv::QkFused`, inputs of 4096): the three outputs against the int8 CPU backend's three
//! separate projections, 1e-3 (as the GEMV rows of the backend table).

use crate::backend::{Ops, Runtime};
use crate::model::common::blocks::Qkv;
use crate::ops::qdot::random_weights;
use crate::quant::GgmlType;
use crate::selftest::backend_ops::{host, tref, Ctx};
use crate::selftest::check::uniform;

pub(in crate::selftest) fn qkv_cases(cx: &mut Ctx) {
    let cols = 4096;
    let shapes = [
        (GgmlType::Q4K, 2048),
        (GgmlType::Q4K, 512),
        (GgmlType::Q6K, 512),
    ];
    let mut data = Vec::new();
    for (ty, rows) in shapes {
        match random_weights(ty, rows, cols, &mut cx.rng) {
            Ok(d) => data.push(d),
            Err(_) => return,
        }
    }
    let refs: Vec<_> = shapes
        .iter()
        .zip(&data)
        .zip(["q", "k", "v"])
        .map(|(((ty, rows), d), name)| tref(name, *ty, vec![*rows, cols], d))
        .collect();
    let x = uniform(&mut cx.rng, cols, -2.0, 2.0);
    cx.case(
        format!("qkv q|k fused (Q4_K 2048 + 512 rows), v apart (Q6_K 512), 1x{cols} vs CPU int8"),
        1e-3,
        |cx| {
            let qkv = Qkv::load(&cx.gpu, &refs[0], &refs[1], &refs[2])?;
            anyhow::ensure!(
                matches!(qkv, Qkv::QkFused(..)),
                "q and k were not fused apart from v"
            );
            let gx = cx.gpu.tensor(&x, 1, cols)?;
            let (q, k, v) = qkv.forward(&cx.gpu, &gx)?;
            let mut got = host(&cx.gpu, &q)?;
            got.extend(host(&cx.gpu, &k)?);
            got.extend(host(&cx.gpu, &v)?);
            let cx8 = cx.cpu8.tensor(&x, 1, cols)?;
            let mut want = Vec::new();
            for r in &refs {
                let w = cx.cpu8.upload(r)?;
                want.extend(cx.cpu8.linear(&cx8, &w)?.data);
            }
            Ok((got, want))
        },
    );
}
