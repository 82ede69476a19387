//! The CPU backend: plain f32 Rust, the reference every other backend is checked against.
//!
//! Tensors are row-major `Vec<f32>`; weights keep their checkpoint format (an owned copy of the
//! bytes, see `weight.rs`) and are dequantised a row at a time inside `linear`, which runs in
//! parallel over output rows with rayon. Everything else is written for clarity.

mod attention;
mod gdn;
mod linear;
mod moe;
mod qdot;
#[cfg(test)]
mod tests;
mod weight;

pub use attention::CpuKvCache;
pub use moe::route;
pub use weight::CpuWeight;

use crate::backend::{
    Activation, AttnParams, BackendError, Fused, KvShape, KvType, MoeParams, Need, Norm, Ops,
    Result, Rope, Runtime, Sampling, Step, StepOf, StepPlan,
};
use crate::ops::{self, NormWeight, RopeLayout};
use crate::weights::TensorRef;

/// A row-major f32 matrix `[rows, cols]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl CpuTensor {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        CpuTensor {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }
}

/// The CPU backend.
///
/// `new()` dequantises every weight row to f32 and stays in f32 throughout (the reference).
/// `int8()` instead multiplies GGML block-quantised weights (Q4_0 .. Q6_K) against activations
/// quantised to int8 per 32 values, the numerics of llama.cpp and of the GPU dp4a kernels, for
/// comparisons with such kernels. Both are identical for F32/F16/BF16 weights. (The two run at
/// the same speed on the CPUs measured, so the reference is the default.)
#[derive(Debug, Clone, Copy)]
pub struct CpuBackend {
    int8_activations: bool,
    /// What the KV caches keep of the values written (f32 by default: the reference; another
    /// type rounds each row as a GPU cache of that type does, for comparisons with it).
    kv_type: KvType,
    /// A capability this backend claims not to have (tests of load-time refusals).
    lacking: Option<Need>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            int8_activations: false,
            kv_type: KvType::F32,
            lacking: None,
        }
    }

    /// Int8-quantised activations against GGML block weights (see the type's docs).
    pub fn int8() -> Self {
        CpuBackend {
            int8_activations: true,
            kv_type: KvType::F32,
            lacking: None,
        }
    }

    /// The same backend with KV caches that round each written row as a `kv_type` cache does.
    pub fn with_kv_type(self, kv_type: KvType) -> Self {
        CpuBackend { kv_type, ..self }
    }

    /// The same backend claiming not to have `need` (`Backend::lacks`), as a GPU backend
    /// without those kernels does: for tests of the load-time refusal.
    pub fn lacking(self, need: Need) -> Self {
        CpuBackend {
            lacking: Some(need),
            ..self
        }
    }
}

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

fn same_shape(op: &'static str, a: &CpuTensor, b: &CpuTensor) -> Result<()> {
    if a.rows != b.rows || a.cols != b.cols {
        return Err(shape_err(
            op,
            format!("[{}, {}] vs [{}, {}]", a.rows, a.cols, b.rows, b.cols),
        ));
    }
    Ok(())
}

fn map2(
    op: &'static str,
    a: &CpuTensor,
    b: &CpuTensor,
    f: impl Fn(f32, f32) -> f32,
) -> Result<CpuTensor> {
    same_shape(op, a, b)?;
    let data = a.data.iter().zip(&b.data).map(|(&x, &y)| f(x, y)).collect();
    Ok(CpuTensor {
        rows: a.rows,
        cols: a.cols,
        data,
    })
}

fn map1(a: &CpuTensor, f: impl Fn(f32) -> f32) -> CpuTensor {
    CpuTensor {
        rows: a.rows,
        cols: a.cols,
        data: a.data.iter().map(|&x| f(x)).collect(),
    }
}

impl Runtime for CpuBackend {
    type Tensor = CpuTensor;

    type Weight = CpuWeight;

    type KvCache = CpuKvCache;

    type StepData = ();

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn step(&self, plan: StepPlan) -> Result<StepOf<Self>> {
        Ok(Step::new(plan, ()))
    }

    fn lacks(&self, need: Need) -> Option<String> {
        (self.lacking == Some(need)).then(|| format!("{need:?} is switched off on this backend"))
    }

    fn upload(&self, w: &TensorRef<'_>) -> Result<CpuWeight> {
        CpuWeight::from_ref(w)
    }

    fn tensor(&self, data: &[f32], rows: usize, cols: usize) -> Result<CpuTensor> {
        if data.len() != rows * cols {
            return Err(shape_err(
                "tensor",
                format!("{} values for [{rows}, {cols}]", data.len()),
            ));
        }
        Ok(CpuTensor {
            rows,
            cols,
            data: data.to_vec(),
        })
    }

    fn to_host(&self, t: &CpuTensor) -> Result<Vec<f32>> {
        Ok(t.data.clone())
    }

    fn dims(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn weight_vector(&self, w: &CpuWeight) -> Result<CpuTensor> {
        let data = w.to_f32()?;
        Ok(CpuTensor {
            rows: 1,
            cols: data.len(),
            data,
        })
    }

    fn kv_cache(&self, shape: KvShape) -> Result<CpuKvCache> {
        if shape.n_kv_heads == 0 || shape.head_dim == 0 {
            return Err(shape_err("kv_cache", format!("{shape:?}")));
        }
        Ok(CpuKvCache::with_type(shape, self.kv_type))
    }

    fn kv_truncate(&self, cache: &mut CpuKvCache, len: usize) -> Result<()> {
        cache.truncate(len)
    }
}

impl Ops for CpuBackend {
    fn embed(&self, table: &CpuWeight, step: &StepOf<Self>, scale: f32) -> Result<CpuTensor> {
        let ids = step.plan().host_ids("embed")?;
        let d = table.cols();
        let mut out = vec![0f32; ids.len() * d];
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(d.max(1))) {
            if id as usize >= table.rows() {
                return Err(shape_err(
                    "embed",
                    format!(
                        "id {id} outside table {} of {} rows",
                        table.name,
                        table.rows()
                    ),
                ));
            }
            table.dequant_row(id as usize, o)?;
            if scale != 1.0 {
                o.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(CpuTensor {
            rows: ids.len(),
            cols: d,
            data: out,
        })
    }

    fn linear(&self, x: &CpuTensor, w: &CpuWeight) -> Result<CpuTensor> {
        linear::matmul_rows(x, w, 0, w.rows(), self.int8_activations)
    }

    fn add(&self, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
        map2("add", a, b, |x, y| x + y)
    }

    fn mul(&self, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
        if b.rows == 1 && b.cols == a.cols && a.rows != 1 {
            let mut out = a.clone();
            for r in out.data.chunks_exact_mut(a.cols.max(1)) {
                r.iter_mut().zip(&b.data).for_each(|(x, y)| *x *= y);
            }
            return Ok(out);
        }
        map2("mul", a, b, |x, y| x * y)
    }

    fn scale(&self, a: &CpuTensor, s: f32) -> Result<CpuTensor> {
        Ok(map1(a, |x| x * s))
    }

    fn glu(&self, gate: &CpuTensor, up: &CpuTensor, act: Activation) -> Result<CpuTensor> {
        match act {
            Activation::Silu => map2("glu", gate, up, |g, u| ops::silu(g) * u),
            Activation::GeluTanh => map2("glu", gate, up, |g, u| ops::gelu_tanh(g) * u),
        }
    }

    fn sigmoid_gate(&self, x: &CpuTensor, gate: &CpuTensor) -> Result<CpuTensor> {
        if gate.cols == 1 && gate.rows == x.rows && x.cols != 1 {
            let mut out = x.clone();
            for (r, row) in out.data.chunks_exact_mut(x.cols.max(1)).enumerate() {
                let s = ops::sigmoid(gate.data[r]);
                row.iter_mut().for_each(|v| *v *= s);
            }
            return Ok(out);
        }
        map2("sigmoid_gate", x, gate, |v, g| v * ops::sigmoid(g))
    }

    fn softcap(&self, x: &CpuTensor, cap: f32) -> Result<CpuTensor> {
        if cap <= 0.0 {
            return Err(shape_err("softcap", format!("cap {cap} must be positive")));
        }
        Ok(map1(x, |v| ops::softcap(v, cap)))
    }

    fn slice_cols(&self, x: &CpuTensor, start: usize, len: usize) -> Result<CpuTensor> {
        if start + len > x.cols {
            return Err(shape_err(
                "slice_cols",
                format!("[{start}, {}) of {} columns", start + len, x.cols),
            ));
        }
        let mut data = Vec::with_capacity(x.rows * len);
        for r in 0..x.rows {
            data.extend_from_slice(&x.row(r)[start..start + len]);
        }
        Ok(CpuTensor {
            rows: x.rows,
            cols: len,
            data,
        })
    }

    fn slice_rows(&self, x: &CpuTensor, start: usize, len: usize) -> Result<CpuTensor> {
        if start + len > x.rows {
            return Err(shape_err(
                "slice_rows",
                format!("[{start}, {}) of {} rows", start + len, x.rows),
            ));
        }
        Ok(CpuTensor {
            rows: len,
            cols: x.cols,
            data: x.data[start * x.cols..(start + len) * x.cols].to_vec(),
        })
    }

    fn concat_cols(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        let Some(first) = parts.first() else {
            return Err(shape_err("concat_cols", "no parts".into()));
        };
        let rows = first.rows;
        if let Some(p) = parts.iter().find(|p| p.rows != rows) {
            return Err(shape_err(
                "concat_cols",
                format!("{} rows vs {rows}", p.rows),
            ));
        }
        let cols: usize = parts.iter().map(|p| p.cols).sum();
        let mut data = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for p in parts {
                data.extend_from_slice(p.row(r));
            }
        }
        Ok(CpuTensor { rows, cols, data })
    }

    fn concat_rows(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        let Some(first) = parts.first() else {
            return Err(shape_err("concat_rows", "no parts".into()));
        };
        let cols = first.cols;
        if let Some(p) = parts.iter().find(|p| p.cols != cols) {
            return Err(shape_err(
                "concat_rows",
                format!("{} columns vs {cols}", p.cols),
            ));
        }
        let data: Vec<f32> = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
        Ok(CpuTensor {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols,
            data,
        })
    }

    fn split_heads(
        &self,
        x: &CpuTensor,
        n_heads: usize,
        sizes: &[usize],
    ) -> Result<Vec<CpuTensor>> {
        let per: usize = sizes.iter().sum();
        if n_heads == 0 || per == 0 || x.cols != n_heads * per {
            return Err(shape_err(
                "split_heads",
                format!("{} columns is not {n_heads} heads of {sizes:?}", x.cols),
            ));
        }
        let mut outs: Vec<CpuTensor> = sizes
            .iter()
            .map(|&s| CpuTensor {
                rows: x.rows,
                cols: n_heads * s,
                data: Vec::with_capacity(x.rows * n_heads * s),
            })
            .collect();
        for r in 0..x.rows {
            let row = x.row(r);
            for h in 0..n_heads {
                let mut off = h * per;
                for (o, &s) in outs.iter_mut().zip(sizes) {
                    o.data.extend_from_slice(&row[off..off + s]);
                    off += s;
                }
            }
        }
        Ok(outs)
    }

    fn rms_norm(
        &self,
        x: &CpuTensor,
        w: Norm<'_, CpuTensor>,
        eps: f32,
        dim: usize,
    ) -> Result<CpuTensor> {
        if dim == 0 || x.cols % dim != 0 {
            return Err(shape_err(
                "rms_norm",
                format!("{} columns in groups of {dim}", x.cols),
            ));
        }
        let check = |t: &CpuTensor| -> Result<()> {
            if t.data.len() != dim {
                return Err(shape_err(
                    "rms_norm",
                    format!("weight of {} values for groups of {dim}", t.data.len()),
                ));
            }
            Ok(())
        };
        let weight = match w {
            Norm::Plain(t) => {
                check(t)?;
                NormWeight::Plain(&t.data)
            }
            Norm::OnePlus(t) => {
                check(t)?;
                NormWeight::OnePlus(&t.data)
            }
            Norm::None => NormWeight::None,
        };
        let mut out = vec![0f32; x.data.len()];
        ops::rms_norm(&x.data, weight, eps, dim, &mut out);
        Ok(CpuTensor {
            rows: x.rows,
            cols: x.cols,
            data: out,
        })
    }

    fn l2_norm(&self, x: &CpuTensor, eps: f32, dim: usize) -> Result<CpuTensor> {
        if dim == 0 || x.cols % dim != 0 {
            return Err(shape_err(
                "l2_norm",
                format!("{} columns in groups of {dim}", x.cols),
            ));
        }
        let mut out = x.clone();
        for g in out.data.chunks_exact_mut(dim) {
            let ss: f64 = g.iter().map(|&v| v as f64 * v as f64).sum();
            let inv = 1.0 / (ss as f32 + eps).sqrt();
            g.iter_mut().for_each(|v| *v *= inv);
        }
        Ok(out)
    }

    fn rope(
        &self,
        x: &CpuTensor,
        n_heads: usize,
        step: &StepOf<Self>,
        rope: &Rope,
    ) -> Result<CpuTensor> {
        let positions = step.plan().positions();
        if positions.len() != x.rows {
            return Err(shape_err(
                "rope",
                format!("{} rows in a step of {}", x.rows, positions.len()),
            ));
        }
        let hd = rope.head_dim;
        let ff_ok = rope
            .freq_factors
            .as_ref()
            .is_none_or(|f| f.len() >= rope.rot_dims / 2);
        if x.cols != n_heads * hd
            || rope.rot_dims % 2 != 0
            || rope.rot_dims > hd
            || !ff_ok
            || rope.freq_base_dims == 0
        {
            return Err(shape_err(
                "rope",
                format!(
                    "{} columns for {n_heads} heads x {hd}, rot_dims {}",
                    x.cols, rope.rot_dims
                ),
            ));
        }
        let spec = rope.spec();
        let half = rope.rot_dims / 2;
        let inv: Vec<f64> = (0..half).map(|i| spec.inv_freq(i) as f64).collect();
        let mut out = x.clone();
        let mut cs = vec![(0f32, 0f32); half];
        for (row, &pos) in out.data.chunks_exact_mut(x.cols.max(1)).zip(&positions) {
            let pos = pos as f64;
            for (i, c) in cs.iter_mut().enumerate() {
                let ang = pos * inv[i];
                *c = (ang.sin() as f32, ang.cos() as f32);
            }
            for v in row.chunks_exact_mut(hd) {
                for (i, &(s, c)) in cs.iter().enumerate() {
                    let (a, b) = match rope.layout {
                        RopeLayout::Neox => (i, i + half),
                        RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    };
                    let (x0, x1) = (v[a], v[b]);
                    v[a] = x0 * c - x1 * s;
                    v[b] = x0 * s + x1 * c;
                }
            }
        }
        Ok(out)
    }

    fn kv_write(
        &self,
        cache: &mut CpuKvCache,
        step: &StepOf<Self>,
        k: &CpuTensor,
        v: &CpuTensor,
    ) -> Result<()> {
        let s = step.plan().seq_of("kv_write", k.rows)?;
        cache.write(s.pos0, k, v)
    }

    fn attention(
        &self,
        q: &CpuTensor,
        cache: &CpuKvCache,
        step: &StepOf<Self>,
        p: &AttnParams,
    ) -> Result<CpuTensor> {
        let s = step.plan().seq_of("attention", q.rows)?;
        cache.attend(q, s.pos0, p)
    }

    fn moe(
        &self,
        x: &CpuTensor,
        router_logits: &CpuTensor,
        gate: &CpuWeight,
        up: &CpuWeight,
        down: &CpuWeight,
        p: &MoeParams,
    ) -> Result<CpuTensor> {
        moe::moe(x, router_logits, gate, up, down, p, self.int8_activations)
    }

    fn causal_conv1d_silu(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        state: &mut CpuTensor,
    ) -> Result<CpuTensor> {
        gdn::causal_conv1d_silu(x, w, state)
    }

    fn gdn_gates(
        &self,
        a: &CpuTensor,
        b: &CpuTensor,
        neg_a: &CpuTensor,
        dt_bias: &CpuTensor,
    ) -> Result<(CpuTensor, CpuTensor)> {
        same_shape("gdn_gates", a, b)?;
        let nv = a.cols;
        if neg_a.data.len() != nv || dt_bias.data.len() != nv {
            return Err(shape_err(
                "gdn_gates",
                format!(
                    "{nv} heads but A has {} and dt_bias {} values",
                    neg_a.data.len(),
                    dt_bias.data.len()
                ),
            ));
        }
        let mut g = a.clone();
        for row in g.data.chunks_exact_mut(nv.max(1)) {
            for (h, v) in row.iter_mut().enumerate() {
                *v = neg_a.data[h] * ops::softplus(*v + dt_bias.data[h]);
            }
        }
        Ok((g, map1(b, ops::sigmoid)))
    }

    fn gated_delta_rule(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        g: &CpuTensor,
        beta: &CpuTensor,
        state: &mut CpuTensor,
        dk: usize,
        dv: usize,
    ) -> Result<CpuTensor> {
        gdn::gated_delta_rule(q, k, v, g, beta, state, dk, dv)
    }
}

impl Fused for CpuBackend {}

impl Sampling for CpuBackend {
    type SamplerState = crate::sampling::Sampler;

    fn sampler_new(
        &self,
        params: &crate::sampling::SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> Result<crate::sampling::Sampler> {
        if vocab == 0 {
            return Err(shape_err("sampler_new", "empty vocabulary".into()));
        }
        Ok(crate::sampling::Sampler::new(params.clone(), prompt, vocab))
    }

    fn sampler_accept(&self, state: &mut crate::sampling::Sampler, id: u32) -> Result<()> {
        state.accept(id);
        Ok(())
    }

    fn sample(
        &self,
        logits: CpuTensor,
        state: &mut crate::sampling::Sampler,
        banned: &[u32],
    ) -> Result<u32> {
        if logits.rows == 0 || logits.cols == 0 {
            return Err(shape_err(
                "sample",
                format!("logits [{}, {}]", logits.rows, logits.cols),
            ));
        }
        let mut data = logits.data;
        let row = &mut data[(logits.rows - 1) * logits.cols..];
        if !crate::ops::sample::has_finite_max(row) {
            return Err(BackendError::NoFiniteLogit);
        }
        let (id, _) = state.sample(row, banned, None);
        state.accept(id);
        Ok(id)
    }
}
