//! `norm_add_linear` on the device: for one row over a repacked Q4_0 / Q4_K weight, the
//! residual add and the norms run inside the GEMV's blocks (`<gemv>__norm`,
//! `launch_gemv_norm.rs`); otherwise `norm_add_rms_norm`, then `linear`.

use super::super::launch_gemv_norm::{gemv_has_norm, GemvNormArgs, GEMV_NORM_MAX_K};
use super::super::types::{GpuTensor, GpuWeight};
use super::fused::norm_ptr;
use super::CudaBackend;
use crate::backend::{Norm, PostNorm, Result};
use crate::kernels::{BatchBucket, Op, Quant};

/// `FUCINA_GEMV_NORM=0` (read once) keeps the norms in their own launch, for A/B runs.
fn fused_on() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*OFF.get_or_init(|| std::env::var("FUCINA_GEMV_NORM").is_ok_and(|v| v == "0"))
}

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_add_linear_impl(
        &self,
        h: &GpuTensor,
        y: &GpuTensor,
        post: &PostNorm<'_, GpuTensor>,
        w: Norm<'_, GpuTensor>,
        eps: f32,
        dim: usize,
        wt: &GpuWeight,
    ) -> Result<(GpuTensor, GpuTensor)> {
        if let Some(r) = self.gemv_norm(h, y, post, &w, eps, dim, wt)? {
            return Ok(r);
        }
        let (s, n) = self.norm_add_rms_norm_impl(h, y, post, w, eps, dim)?;
        Ok((s, self.linear_impl(&n, wt)?))
    }

    /// The fused launch where it applies: one row, a whole-row norm, a repacked weight whose
    /// batch-1 instance has the `__norm` entry, rows of whole 256-value groups up to
    /// [`GEMV_NORM_MAX_K`]. None: not applicable.
    #[allow(clippy::too_many_arguments)]
    fn gemv_norm(
        &self,
        h: &GpuTensor,
        y: &GpuTensor,
        post: &PostNorm<'_, GpuTensor>,
        w: &Norm<'_, GpuTensor>,
        eps: f32,
        dim: usize,
        wt: &GpuWeight,
    ) -> Result<Option<(GpuTensor, GpuTensor)>> {
        const OP: &str = "norm_add_linear";
        let one_row = |t: &GpuTensor| t.rows == 1 && t.cols == dim;
        if !fused_on() || !one_row(h) || !one_row(y) || dim % 256 != 0 || dim > GEMV_NORM_MAX_K {
            return Ok(None);
        }
        let v = wt.matrix()?;
        if v.cols != dim || !matches!(v.quant, Quant::Q4_0R | Quant::Q4KR) {
            return Ok(None);
        }
        let Ok(kn) = self.kern(Op::Gemv, v.quant, BatchBucket::B1) else {
            return Ok(None);
        };
        if !gemv_has_norm(kn.spec) {
            return Ok(None);
        }
        let scale = post.scale.unwrap_or(1.0);
        let s = self.alloc_tensor(1, dim)?;
        let out = self.alloc_tensor(1, v.rows)?;
        let args = GemvNormArgs {
            h: h.ptr(),
            y: y.ptr(),
            post: post
                .norm
                .as_ref()
                .map(|n| norm_ptr(OP, n, dim))
                .transpose()?,
            norm: norm_ptr(OP, w, dim)?,
            eps,
            scale,
            s_out: s.ptr(),
        };
        self.dev
            .gemv_norm_ptr(&kn, v.data, &args, out.ptr(), (v.rows, dim), self.sms)?;
        Ok(Some((s, out)))
    }
}
