//! Mixture of experts: softmax router, top-k, optional renormalisation, gated experts.

use super::linear::matmul_rows;
use super::weight::CpuWeight;
use super::CpuTensor;
use crate::backend::{Activation, BackendError, MoeParams, Result};

/// Experts and weights chosen for one token: `(expert, weight)` in descending weight.
pub fn route(logits: &[f32], top_k: usize, norm_topk: bool) -> Vec<(usize, f32)> {
    let mut p = logits.to_vec();
    crate::ops::softmax(&mut p);
    let mut idx: Vec<usize> = (0..p.len()).collect();
    // Descending probability; ties keep the lower index first (as torch.topk does in practice).
    idx.sort_by(|&a, &b| {
        p[b].partial_cmp(&p[a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    idx.truncate(top_k);
    let mut sel: Vec<(usize, f32)> = idx.iter().map(|&e| (e, p[e])).collect();
    if norm_topk {
        let s: f32 = sel.iter().map(|x| x.1).sum();
        if s > 0.0 {
            sel.iter_mut().for_each(|x| x.1 /= s);
        }
    }
    sel
}

/// Per-expert output rows of a bank `[E, out, in]` viewed as `[E * out, in]`.
fn expert_rows(w: &CpuWeight, n_experts: usize) -> Result<usize> {
    if n_experts == 0 || w.rows() % n_experts != 0 {
        return Err(BackendError::Shape {
            op: "moe",
            detail: format!(
                "bank {} with {} rows is not {n_experts} experts",
                w.name,
                w.rows()
            ),
        });
    }
    Ok(w.rows() / n_experts)
}

pub fn moe(
    x: &CpuTensor,
    router_logits: &CpuTensor,
    gate: &CpuWeight,
    up: &CpuWeight,
    down: &CpuWeight,
    p: &MoeParams,
    fast: bool,
) -> Result<CpuTensor> {
    let (n, hidden) = (x.rows, x.cols);
    let e = p.n_experts;
    if router_logits.rows != n || router_logits.cols != e || p.top_k == 0 || p.top_k > e {
        return Err(BackendError::Shape {
            op: "moe",
            detail: format!(
                "router logits [{}, {}] for {n} tokens, {e} experts, top-{}",
                router_logits.rows, router_logits.cols, p.top_k
            ),
        });
    }
    let ff = expert_rows(gate, e)?;
    if expert_rows(up, e)? != ff || gate.cols() != hidden || up.cols() != hidden {
        return Err(BackendError::Shape {
            op: "moe",
            detail: format!(
                "gate/up banks {} / {} do not match hidden {hidden}",
                gate.name, up.name
            ),
        });
    }
    let out_dim = expert_rows(down, e)?;
    if down.cols() != ff {
        return Err(BackendError::Shape {
            op: "moe",
            detail: format!(
                "down bank {} has {} columns, experts have {ff}",
                down.name,
                down.cols()
            ),
        });
    }
    // Tokens per expert.
    let mut assign: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
    for t in 0..n {
        for (ex, wgt) in route(router_logits.row(t), p.top_k, p.norm_topk) {
            assign[ex].push((t, wgt));
        }
    }
    let mut out = vec![0f32; n * out_dim];
    for (ex, toks) in assign.iter().enumerate() {
        if toks.is_empty() {
            continue;
        }
        let mut xs = Vec::with_capacity(toks.len() * hidden);
        for &(t, _) in toks {
            xs.extend_from_slice(x.row(t));
        }
        let xs = CpuTensor {
            rows: toks.len(),
            cols: hidden,
            data: xs,
        };
        let g = matmul_rows(&xs, gate, ex * ff, ff, fast)?;
        let u = matmul_rows(&xs, up, ex * ff, ff, fast)?;
        let mut hdata = vec![0f32; g.data.len()];
        match p.act {
            Activation::Silu => crate::ops::swiglu(&g.data, &u.data, &mut hdata),
            Activation::GeluTanh => crate::ops::geglu(&g.data, &u.data, &mut hdata),
        }
        let hmid = CpuTensor {
            rows: toks.len(),
            cols: ff,
            data: hdata,
        };
        let d = matmul_rows(&hmid, down, ex * out_dim, out_dim, fast)?;
        for (i, &(t, wgt)) in toks.iter().enumerate() {
            for (o, v) in out[t * out_dim..(t + 1) * out_dim].iter_mut().zip(d.row(i)) {
                *o += wgt * v;
            }
        }
    }
    Ok(CpuTensor {
        rows: n,
        cols: out_dim,
        data: out,
    })
}
