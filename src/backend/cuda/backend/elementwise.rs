//! Elementwise, shape, normalisation, position and embedding ops of the CUDA backend. Every
//! output comes from the pool; copies are device-to-device (strided `cuMemcpy2DAsync`), so
//! none of these touch the host during a decode step.

use super::linear::{slice, sub};
use super::CudaBackend;
use crate::backend::cuda::ops::elementwise::launch::{Broadcast, EwiseMode, NormWeightPtr};
use crate::backend::cuda::ops::elementwise::rows::{
    glu_vec_ok, rms_norm_rows_suffix, PREFILL_MIN_ROWS,
};
use crate::backend::cuda::ops::elementwise::slice::RopeLaunch;
use crate::backend::cuda::runtime::buf::{copy, DevBuf, DevPtr};
use crate::backend::cuda::runtime::kern::copy_2d;
use crate::backend::cuda::runtime::types::{Bf16Side, GpuTensor, GpuWeight, Q8Side};
use crate::backend::{Activation, BackendError, Norm, Result, Rope, StepOf};
use crate::kernels::Entry;
use crate::kernels::{BatchBucket, Op, Quant};

fn shape(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// (row, column) strides of `b` `[rows, cols]` read against `a`: the same shape, `[1, cols]`
/// when `row_bcast` (broadcast over rows), `[rows, 1]` when `col_bcast` (one value per row);
/// None when the shapes do not fit.
pub(crate) fn broadcast_strides(
    a: (usize, usize),
    b: (usize, usize),
    row_bcast: bool,
    col_bcast: bool,
) -> Option<(usize, usize)> {
    if b == a {
        Some((a.1, 1))
    } else if row_bcast && b.0 == 1 && b.1 == a.1 {
        Some((0, 1))
    } else if col_bcast && b.1 == 1 && b.0 == a.0 {
        Some((1, 0))
    } else {
        None
    }
}

impl CudaBackend {
    /// A pooled `[rows, cols]` tensor (contents undefined).
    pub(super) fn alloc_tensor(&self, rows: usize, cols: usize) -> Result<GpuTensor> {
        Ok(GpuTensor::new(
            self.pool.alloc(rows * cols * 4)?,
            rows,
            cols,
        ))
    }

    /// A pooled int8 side-car for a `[rows, cols]` output that will feed a one-row GEMV: only
    /// for one row of whole 32-value groups (what `linear` consumes), else None.
    pub(super) fn q8_side(&self, rows: usize, cols: usize) -> Result<Option<Q8Side>> {
        if rows != 1 || cols == 0 || cols % 32 != 0 {
            return Ok(None);
        }
        Ok(Some(Q8Side {
            buf: self.pool.alloc(Q8Side::bytes(cols))?,
            len: cols,
        }))
    }

    fn ewise(
        &self,
        mode: EwiseMode,
        a: &GpuTensor,
        b: Option<Broadcast>,
        s: f32,
    ) -> Result<GpuTensor> {
        let y = self.alloc_tensor(a.rows, a.cols)?;
        let k = self.kern(Op::Ewise, Quant::F32, BatchBucket::Any)?;
        self.dev
            .ewise_ptr(&k, mode, a.ptr(), b, y.ptr(), a.rows, a.cols, s)?;
        Ok(y)
    }

    /// `b` as a broadcast operand of `a` (see [`broadcast_strides`]).
    fn broadcast(
        op: &'static str,
        a: &GpuTensor,
        b: &GpuTensor,
        row_bcast: bool,
        col_bcast: bool,
    ) -> Result<Broadcast> {
        let (rs, cs) = broadcast_strides((a.rows, a.cols), (b.rows, b.cols), row_bcast, col_bcast)
            .ok_or_else(|| {
                shape(
                    op,
                    format!("[{}, {}] vs [{}, {}]", a.rows, a.cols, b.rows, b.cols),
                )
            })?;
        Ok(Broadcast {
            ptr: b.ptr(),
            row_stride: rs,
            col_stride: cs,
        })
    }

    pub(super) fn add_impl(&self, a: &GpuTensor, b: &GpuTensor) -> Result<GpuTensor> {
        let bb = Self::broadcast("add", a, b, false, false)?;
        self.ewise(EwiseMode::Add, a, Some(bb), 0.0)
    }

    pub(super) fn mul_impl(&self, a: &GpuTensor, b: &GpuTensor) -> Result<GpuTensor> {
        let bb = Self::broadcast("mul", a, b, true, false)?;
        self.ewise(EwiseMode::Mul, a, Some(bb), 0.0)
    }

    pub(super) fn scale_impl(&self, a: &GpuTensor, s: f32) -> Result<GpuTensor> {
        self.ewise(EwiseMode::Scale, a, None, s)
    }

    pub(super) fn softcap_impl(&self, x: &GpuTensor, cap: f32) -> Result<GpuTensor> {
        if cap.is_nan() || cap <= 0.0 {
            return Err(shape("softcap", format!("cap {cap} must be positive")));
        }
        self.ewise(EwiseMode::Softcap, x, None, cap)
    }

    pub(super) fn sigmoid_gate_impl(&self, x: &GpuTensor, gate: &GpuTensor) -> Result<GpuTensor> {
        let bb = Self::broadcast("sigmoid_gate", x, gate, false, true)?;
        self.ewise(EwiseMode::SigmoidGate, x, Some(bb), 0.0)
    }

    pub(super) fn glu_impl(
        &self,
        gate: &GpuTensor,
        up: &GpuTensor,
        act: Activation,
    ) -> Result<GpuTensor> {
        if gate.rows != up.rows || gate.cols != up.cols {
            return Err(shape(
                "glu",
                format!(
                    "[{}, {}] vs [{}, {}]",
                    gate.rows, gate.cols, up.rows, up.cols
                ),
            ));
        }
        let op = match act {
            Activation::GeluTanh => Op::Geglu,
            Activation::Silu => Op::Swiglu,
        };
        let n = gate.cols;
        if let Some(y) = self.glu_rows(op, gate.ptr(), up.ptr(), gate.rows, n, [n; 3])? {
            return Ok(y);
        }
        let k = self.kern(op, Quant::F32, BatchBucket::Any)?;
        let y = self.alloc_tensor(gate.rows, gate.cols)?;
        let q8 = self.q8_side(gate.rows, gate.cols)?;
        let kq = match q8 {
            Some(_) => Some(self.kern_q8(op)?),
            None => None,
        };
        self.dev.glu_ptr(
            &k,
            gate.ptr(),
            up.ptr(),
            y.ptr(),
            gate.rows,
            gate.cols,
            kq.as_ref().zip(q8.as_ref().map(Q8Side::ptrs)),
        )?;
        Ok(y.with_q8(q8))
    }

    /// act(x[:, ..ff]) * x[:, ff..] straight from the fused projection (no copies).
    pub(super) fn glu_fused_impl(&self, x: &GpuTensor, act: Activation) -> Result<GpuTensor> {
        if x.cols % 2 != 0 {
            return Err(shape(
                "glu_fused",
                format!("{} columns is not gate|up halves", x.cols),
            ));
        }
        let ff = x.cols / 2;
        let op = match act {
            Activation::GeluTanh => Op::Geglu,
            Activation::Silu => Op::Swiglu,
        };
        let all = x.ptr();
        let up = all
            .slice(ff, all.len() - ff)
            .ok_or_else(|| shape("glu_fused", "empty input".into()))?;
        if let Some(y) = self.glu_rows(op, all, up, x.rows, ff, [x.cols, x.cols, ff])? {
            return Ok(y);
        }
        let k = self.kern(op, Quant::F32, BatchBucket::Any)?;
        let y = self.alloc_tensor(x.rows, ff)?;
        let q8 = self.q8_side(x.rows, ff)?;
        let kq = match q8 {
            Some(_) => Some(self.kern_q8(op)?),
            None => None,
        };
        self.dev.glu_strided_ptr(
            &k,
            all,
            up,
            y.ptr(),
            x.rows,
            ff,
            [x.cols, x.cols, ff],
            kq.as_ref().zip(q8.as_ref().map(Q8Side::ptrs)),
        )?;
        Ok(y.with_q8(q8))
    }

    /// The multi-row GLU (`__vec`, n >= [`PREFILL_MIN_ROWS`] rows of float4-able operands):
    /// `[rows, cols]` f32 output carrying its bf16 copy for the prefill GEMM; None when the
    /// shape is not one for it (the caller runs the plain kernel).
    fn glu_rows(
        &self,
        op: Op,
        gate: DevPtr<f32>,
        up: DevPtr<f32>,
        rows: usize,
        cols: usize,
        strides: [usize; 3],
    ) -> Result<Option<GpuTensor>> {
        if rows < PREFILL_MIN_ROWS || cols == 0 {
            return Ok(None);
        }
        let y = self.alloc_tensor(rows, cols)?;
        if !glu_vec_ok(gate, up, y.ptr(), cols, strides) {
            return Ok(None);
        }
        let e = self.kern_entry(op, Quant::F32, Entry::Vec)?;
        let side = Bf16Side {
            buf: self.pool.alloc(rows * cols * 2)?,
            len: rows * cols,
        };
        self.dev
            .glu_vec_ptr(&e, gate, up, y.ptr(), Some(side.ptr()), rows, cols, strides)?;
        Ok(Some(y.with_bf16(Some(side))))
    }

    pub(super) fn slice_cols_impl(
        &self,
        x: &GpuTensor,
        start: usize,
        len: usize,
    ) -> Result<GpuTensor> {
        if start.checked_add(len).is_none_or(|e| e > x.cols) {
            return Err(shape(
                "slice_cols",
                format!("[{start}, {start}+{len}) of {} columns", x.cols),
            ));
        }
        // one row: the columns are contiguous, a view needs no copy (the fused QKV split)
        if let Some(v) = x.row_view(start, len) {
            return Ok(v);
        }
        let y = self.alloc_tensor(x.rows, len)?;
        let src = sub(x.ptr(), start, x.len() - start)?;
        copy_2d(self.pool.stream(), y.ptr(), len, src, x.cols, len, x.rows)?;
        Ok(y)
    }

    pub(super) fn slice_rows_impl(
        &self,
        x: &GpuTensor,
        start: usize,
        len: usize,
    ) -> Result<GpuTensor> {
        if start.checked_add(len).is_none_or(|e| e > x.rows) {
            return Err(shape(
                "slice_rows",
                format!("[{start}, {start}+{len}) of {} rows", x.rows),
            ));
        }
        let y = self.alloc_tensor(len, x.cols)?;
        copy(
            self.pool.stream(),
            y.ptr(),
            sub(x.ptr(), start * x.cols, len * x.cols)?,
        )?;
        Ok(y)
    }

    pub(super) fn concat_cols_impl(&self, parts: &[&GpuTensor]) -> Result<GpuTensor> {
        let Some(first) = parts.first() else {
            return Err(shape("concat_cols", "no parts".into()));
        };
        let rows = first.rows;
        if let Some(p) = parts.iter().find(|p| p.rows != rows) {
            return Err(shape("concat_cols", format!("{} rows vs {rows}", p.rows)));
        }
        let cols: usize = parts.iter().map(|p| p.cols).sum();
        let y = self.alloc_tensor(rows, cols)?;
        let mut off = 0;
        for p in parts {
            if p.cols > 0 && rows > 0 {
                let dst = sub(y.ptr(), off, y.len() - off)?;
                copy_2d(self.pool.stream(), dst, cols, p.ptr(), p.cols, p.cols, rows)?;
            }
            off += p.cols;
        }
        Ok(y)
    }

    pub(super) fn concat_rows_impl(&self, parts: &[&GpuTensor]) -> Result<GpuTensor> {
        let Some(first) = parts.first() else {
            return Err(shape("concat_rows", "no parts".into()));
        };
        let cols = first.cols;
        if let Some(p) = parts.iter().find(|p| p.cols != cols) {
            return Err(shape(
                "concat_rows",
                format!("{} columns vs {cols}", p.cols),
            ));
        }
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        let y = self.alloc_tensor(rows, cols)?;
        let mut off = 0;
        for p in parts {
            let n = p.rows * cols;
            if n > 0 {
                copy(
                    self.pool.stream(),
                    sub(y.ptr(), off, n)?,
                    sub(p.ptr(), 0, n)?,
                )?;
            }
            off += n;
        }
        Ok(y)
    }

    pub(super) fn split_heads_impl(
        &self,
        x: &GpuTensor,
        n_heads: usize,
        sizes: &[usize],
    ) -> Result<Vec<GpuTensor>> {
        let per: usize = sizes.iter().sum();
        if n_heads == 0 || per == 0 || x.cols != n_heads * per {
            return Err(shape(
                "split_heads",
                format!("{} columns is not {n_heads} heads of {sizes:?}", x.cols),
            ));
        }
        // [n * heads, per] -> [n * heads, size] per part
        let groups = x.rows * n_heads;
        let mut outs = Vec::with_capacity(sizes.len());
        let mut off = 0;
        for &s in sizes {
            let y = self.alloc_tensor(x.rows, n_heads * s)?;
            if s > 0 && groups > 0 {
                let src = sub(x.ptr(), off, x.len() - off)?;
                copy_2d(self.pool.stream(), y.ptr(), s, src, per, s, groups)?;
            }
            off += s;
            outs.push(y);
        }
        Ok(outs)
    }

    pub(super) fn rms_norm_impl(
        &self,
        x: &GpuTensor,
        w: Norm<'_, GpuTensor>,
        eps: f32,
        dim: usize,
    ) -> Result<GpuTensor> {
        if dim == 0 || x.cols % dim != 0 {
            return Err(shape(
                "rms_norm",
                format!("{} columns in groups of {dim}", x.cols),
            ));
        }
        let wp = match w {
            Norm::Plain(t) => NormWeightPtr::Plain(t.ptr()),
            Norm::OnePlus(t) => NormWeightPtr::OnePlus(t.ptr()),
            Norm::None => NormWeightPtr::None,
        };
        if let NormWeightPtr::Plain(p) | NormWeightPtr::OnePlus(p) = wp {
            if p.len() != dim {
                return Err(shape(
                    "rms_norm",
                    format!("weight of {} values for groups of {dim}", p.len()),
                ));
            }
        }
        let y = self.alloc_tensor(x.rows, x.cols)?;
        if x.is_empty() {
            return Ok(y);
        }
        // many rows of small groups (per-head norms of a prefill): one warp per group, the
        // same values as one block per group
        if let Some(sfx) = rms_norm_rows_suffix(dim).filter(|_| x.rows >= PREFILL_MIN_ROWS) {
            let e = self.kern_entry(Op::RmsNorm, Quant::F32, sfx)?;
            self.dev
                .rms_norm_rows_ptr(&e, x.ptr(), wp, y.ptr(), eps, dim)?;
            return Ok(y);
        }
        let k = self.kern(Op::RmsNorm, Quant::F32, BatchBucket::Any)?;
        // a whole-row norm of one row feeds a GEMV: write its int8 side-car too
        let q8 = if dim == x.cols {
            self.q8_side(x.rows, x.cols)?
        } else {
            None
        };
        let kq = match q8 {
            Some(_) => Some(self.kern_q8(Op::RmsNorm)?),
            None => None,
        };
        self.dev.rms_norm_ptr(
            &k,
            x.ptr(),
            wp,
            y.ptr(),
            eps,
            dim,
            kq.as_ref().zip(q8.as_ref().map(Q8Side::ptrs)),
        )?;
        Ok(y.with_q8(q8))
    }

    pub(super) fn l2_norm_impl(&self, x: &GpuTensor, eps: f32, dim: usize) -> Result<GpuTensor> {
        if dim == 0 || x.cols % dim != 0 {
            return Err(shape(
                "l2_norm",
                format!("{} columns in groups of {dim}", x.cols),
            ));
        }
        let y = self.alloc_tensor(x.rows, x.cols)?;
        if x.is_empty() {
            return Ok(y);
        }
        let k = self.kern(Op::L2Norm, Quant::F32, BatchBucket::Any)?;
        self.dev.l2_norm_ptr(&k, x.ptr(), y.ptr(), eps, dim)?;
        Ok(y)
    }

    /// Device copy of a RoPE layer's frequency divisors, uploaded once per distinct content.
    pub(super) fn freq_factors(
        &self,
        ff: &[f32],
    ) -> Result<crate::backend::cuda::runtime::buf::DevPtr<f32>> {
        let key: Vec<u32> = ff.iter().map(|v| v.to_bits()).collect();
        let mut m = self.freq.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = m.get(&key) {
            return slice(b.f32(), ff.len());
        }
        let b: DevBuf = self.pool.upload_persistent(ff)?;
        let p = slice(b.f32(), ff.len())?;
        m.insert(key, b);
        Ok(p)
    }

    pub(super) fn rope_impl(
        &self,
        x: &GpuTensor,
        n_heads: usize,
        step: &StepOf<Self>,
        rope: &Rope,
    ) -> Result<GpuTensor> {
        let hd = rope.head_dim;
        let ff_ok = rope
            .freq_factors
            .as_ref()
            .is_none_or(|f| f.len() >= rope.rot_dims / 2);
        if x.cols != n_heads * hd
            || rope.rot_dims % 2 != 0
            || rope.rot_dims > hd
            || hd % 2 != 0
            || !ff_ok
            || rope.freq_base_dims == 0
        {
            return Err(shape(
                "rope",
                format!(
                    "{} columns for {n_heads} heads x {hd}, rot_dims {}",
                    x.cols, rope.rot_dims
                ),
            ));
        }
        let y = self.alloc_tensor(x.rows, x.cols)?;
        if x.is_empty() {
            return Ok(y);
        }
        let ff = match &rope.freq_factors {
            Some(f) => Some(self.freq_factors(f)?),
            None => None,
        };
        let pos = step.dev().positions("rope", x.rows)?;
        let k = self.kern(Op::Rope, Quant::F32, BatchBucket::Any)?;
        let p = RopeLaunch {
            rows: x.rows,
            n_heads,
            head_dim: hd,
            rot_dims: rope.rot_dims,
            freq_base_dims: rope.freq_base_dims,
            layout: rope.layout,
            theta: rope.theta,
        };
        self.dev.rope_ptr(&k, x.ptr(), y.ptr(), pos, ff, &p)?;
        Ok(y)
    }

    pub(super) fn embed_impl(
        &self,
        table: &GpuWeight,
        step: &StepOf<Self>,
        scale: f32,
    ) -> Result<GpuTensor> {
        let v = table.matrix()?;
        let rows = step.plan().rows();
        // a fed step's id comes from the sampler, below the vocabulary by construction
        let ids = step.plan().ids().unwrap_or(&[]);
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= v.rows) {
            return Err(shape(
                "embed",
                format!("id {bad} outside a table of {} rows", v.rows),
            ));
        }
        let y = self.alloc_tensor(rows, v.cols)?;
        let idp = step.dev().ids("embed", rows)?;
        let k = self.kern(Op::Embed, v.quant, BatchBucket::Any)?;
        self.dev
            .embed_ptr(&k, v.data, v.rows, v.cols, idp, y.ptr(), scale)?;
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::broadcast_strides;

    #[test]
    fn broadcast_shapes() {
        assert_eq!(
            broadcast_strides((3, 8), (3, 8), false, false),
            Some((8, 1))
        );
        assert_eq!(broadcast_strides((3, 8), (1, 8), false, false), None);
        assert_eq!(broadcast_strides((3, 8), (1, 8), true, false), Some((0, 1)));
        assert_eq!(broadcast_strides((3, 8), (3, 1), true, false), None);
        assert_eq!(broadcast_strides((3, 8), (3, 1), false, true), Some((1, 0)));
        assert_eq!(broadcast_strides((3, 8), (2, 1), false, true), None);
        assert_eq!(broadcast_strides((3, 8), (3, 7), true, true), None);
        // a [1, 1] gate against a [1, cols] input is one value per row
        assert_eq!(broadcast_strides((1, 8), (1, 1), false, true), Some((1, 0)));
    }
}
