//! Gated DeltaNet pieces: the depthwise causal conv1d (+SiLU) and the gated delta rule.

use rayon::prelude::*;

use super::weight::CpuWeight;
use super::CpuTensor;
use crate::backend::{BackendError, Result};
use crate::ops::silu;

/// Depthwise causal conv over time for each of `C` channels, kernel `k`, then SiLU.
/// `state` is `[k-1, C]`: the previous `k-1` inputs (oldest first); it is updated.
pub fn causal_conv1d_silu(
    x: &CpuTensor,
    w: &CpuWeight,
    state: &mut CpuTensor,
) -> Result<CpuTensor> {
    let c = x.cols;
    let k = w.cols();
    if w.rows() != c || k == 0 || state.rows != k - 1 || state.cols != c {
        return Err(BackendError::Shape {
            op: "causal_conv1d_silu",
            detail: format!(
                "x [{}, {c}], weight {} [{}, {k}], state [{}, {}]",
                x.rows,
                w.name,
                w.rows(),
                state.rows,
                state.cols
            ),
        });
    }
    let wf = w.to_f32()?; // [C, k]
    let n = x.rows;
    // History = state rows followed by the new inputs: [k-1+n, C].
    let mut hist = Vec::with_capacity((k - 1 + n) * c);
    hist.extend_from_slice(&state.data);
    hist.extend_from_slice(&x.data);
    let mut out = vec![0f32; n * c];
    for t in 0..n {
        for ch in 0..c {
            let mut s = 0f32;
            for j in 0..k {
                s += wf[ch * k + j] * hist[(t + j) * c + ch];
            }
            out[t * c + ch] = silu(s);
        }
    }
    let total = k - 1 + n;
    state.data.copy_from_slice(&hist[(total - (k - 1)) * c..]);
    Ok(CpuTensor {
        rows: n,
        cols: c,
        data: out,
    })
}

/// The gated delta rule, token by token, per value head (see `Backend::gated_delta_rule`).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    g: &CpuTensor,
    beta: &CpuTensor,
    state: &mut CpuTensor,
    dk: usize,
    dv: usize,
) -> Result<CpuTensor> {
    let n = q.rows;
    let nv = g.cols;
    let ok = dk > 0
        && dv > 0
        && q.cols == nv * dk
        && k.cols == nv * dk
        && v.cols == nv * dv
        && beta.cols == nv
        && [k.rows, v.rows, g.rows, beta.rows].iter().all(|&r| r == n)
        && state.rows == nv
        && state.cols == dk * dv;
    if !ok {
        return Err(BackendError::Shape {
            op: "gated_delta_rule",
            detail: format!(
                "q [{n}, {}], k [{}, {}], v [{}, {}], g [{}, {nv}], beta [{}, {}], state [{}, {}], dk {dk}, dv {dv}",
                q.cols, k.rows, k.cols, v.rows, v.cols, g.rows, beta.rows, beta.cols, state.rows, state.cols
            ),
        });
    }
    let mut per_head: Vec<Vec<f32>> = vec![Vec::new(); nv];
    state
        .data
        .par_chunks_mut(dk * dv)
        .zip(per_head.par_iter_mut())
        .enumerate()
        .for_each(|(hh, (s, o))| {
            *o = vec![0f32; n * dv];
            let mut delta = vec![0f32; dv];
            for t in 0..n {
                let qt = &q.data[t * nv * dk + hh * dk..t * nv * dk + (hh + 1) * dk];
                let kt = &k.data[t * nv * dk + hh * dk..t * nv * dk + (hh + 1) * dk];
                let vt = &v.data[t * nv * dv + hh * dv..t * nv * dv + (hh + 1) * dv];
                let decay = g.data[t * nv + hh].exp();
                let b = beta.data[t * nv + hh];
                s.iter_mut().for_each(|x| *x *= decay);
                // delta = beta * (v - S^T k), S is [dk, dv]
                delta.copy_from_slice(vt);
                for i in 0..dk {
                    let ki = kt[i];
                    for (d, sij) in delta.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                        *d -= sij * ki;
                    }
                }
                delta.iter_mut().for_each(|d| *d *= b);
                // S += k delta^T
                for i in 0..dk {
                    let ki = kt[i];
                    for (sij, d) in s[i * dv..(i + 1) * dv].iter_mut().zip(&delta) {
                        *sij += ki * d;
                    }
                }
                // o = S^T q
                let ot = &mut o[t * dv..(t + 1) * dv];
                for i in 0..dk {
                    let qi = qt[i];
                    for (x, sij) in ot.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                        *x += sij * qi;
                    }
                }
            }
        });
    let mut out = vec![0f32; n * nv * dv];
    for (hh, o) in per_head.iter().enumerate() {
        for t in 0..n {
            out[t * nv * dv + hh * dv..t * nv * dv + (hh + 1) * dv]
                .copy_from_slice(&o[t * dv..(t + 1) * dv]);
        }
    }
    Ok(CpuTensor {
        rows: n,
        cols: nv * dv,
        data: out,
    })
}
