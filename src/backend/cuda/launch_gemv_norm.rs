//! The GEMV entry that runs the residual add and RMSNorm before the product in its own blocks
//! (`<gemv>__norm` of the repacked Q4_0 / Q4_K instances, lib/gemv_repacked): one decode launch
//! where `norm_add_rmsnorm` (or `add_rmsnorm`) and the consuming GEMV took two.

use super::buf::DevPtr;
use super::error::CudaError;
use super::launch_linear::gemv_default_grid;
use super::launch_ptr::{int, invalid, Kern, NormWeightPtr};
use super::CudaDevice;
use crate::kernels::{KernelSpec, Op, Quant};

/// Most values a `__norm` row may hold (its shared memory takes 5.25 bytes a value).
pub const GEMV_NORM_MAX_K: usize = 8192;

/// What the `__norm` entry reads and writes besides the weights and the product:
/// `s = (h + post(y)) * scale` (no post norm: `h + y`) into `s_out`, then `norm(s)` as the
/// GEMV's input. One row of `k` values each.
#[derive(Debug, Clone, Copy)]
pub struct GemvNormArgs {
    pub h: DevPtr<f32>,
    pub y: DevPtr<f32>,
    pub post: Option<NormWeightPtr>,
    pub norm: NormWeightPtr,
    pub eps: f32,
    pub scale: f32,
    pub s_out: DevPtr<f32>,
}

/// Whether an instance has the `__norm` entry: the batch-1 GEMVs over repacked Q4_0 / Q4_K.
pub fn gemv_has_norm(spec: &KernelSpec) -> bool {
    spec.key.op == Op::Gemv
        && matches!(spec.key.quant, Quant::Q4_0R | Quant::Q4KR)
        && spec.key.batch.value() == Some(1)
}

/// The kernel's weight mode and pointer for a norm (0: `* w`, 1: `* (1 + w)`, 2: none).
fn mode(n: NormWeightPtr) -> (i32, DevPtr<f32>) {
    match n {
        NormWeightPtr::Plain(w) => (0, w),
        NormWeightPtr::OnePlus(w) => (1, w),
        NormWeightPtr::None => (2, DevPtr::null()),
    }
}

impl CudaDevice {
    /// `y = W norm((h + post(y_in)) * scale)` for one row of `k` values (`W`: `n` rows of the
    /// instance's repacked format), and the sum before the norm into `a.s_out` (which must not
    /// alias `a.h` or `a.y`). Grid: the main entry's.
    pub fn gemv_norm_ptr(
        &self,
        kn: &Kern,
        w: DevPtr<u8>,
        a: &GemvNormArgs,
        y: DevPtr<f32>,
        (n, k): (usize, usize),
        sms: u32,
    ) -> Result<(), CudaError> {
        const OP: &str = "gemv_norm";
        if !gemv_has_norm(kn.spec) {
            return Err(invalid(OP, format!("{} has no __norm entry", kn.spec.name)));
        }
        if n == 0 || k == 0 || k % 256 != 0 || k > GEMV_NORM_MAX_K {
            return Err(invalid(
                OP,
                format!("n={n} k={k}: rows of whole 256-value groups, at most {GEMV_NORM_MAX_K}"),
            ));
        }
        if w.raw() % 16 != 0 || w.len() < n * (k / 32) * 18 || y.len() < n {
            return Err(invalid(
                OP,
                format!("w {} bytes / y {} for n={n} k={k}", w.len(), y.len()),
            ));
        }
        let (pm, pw) = a.post.map_or((-1, DevPtr::null()), mode);
        let (nm, nw) = mode(a.norm);
        let short = |p: DevPtr<f32>| p.len() < k;
        if short(a.h) || short(a.y) || short(a.s_out) || (pm == 0 || pm == 1) && short(pw) {
            return Err(invalid(OP, format!("rows of fewer than {k} values")));
        }
        if (nm == 0 || nm == 1) && short(nw) {
            return Err(invalid(
                OP,
                format!("a norm weight of fewer than {k} values"),
            ));
        }
        let overlaps = |p: DevPtr<f32>| {
            let (a0, a1) = (p.raw(), p.raw() + 4 * k as u64);
            let (b0, b1) = (a.s_out.raw(), a.s_out.raw() + 4 * k as u64);
            a0 < b1 && b0 < a1
        };
        if overlaps(a.h) || overlaps(a.y) {
            return Err(invalid(OP, "s_out overlaps an input".into()));
        }
        if !(a.eps.is_finite() && a.scale.is_finite()) {
            return Err(invalid(OP, format!("eps {} scale {}", a.eps, a.scale)));
        }
        // the entry's shared memory limit is raised once, for the longest row
        let smem = 5 * k + k / 32 * 8;
        let most = 5 * GEMV_NORM_MAX_K + GEMV_NORM_MAX_K / 32 * 8;
        let f = self.function_suffixed_smem(kn.spec, "norm", most)?;
        let entry = Kern { spec: kn.spec, f };
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (gemv_default_grid(kn.spec, n, sms).max(1), 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (wp, hp, yp, pp, np, sp, op) = (
            w.raw(),
            a.h.raw(),
            a.y.raw(),
            pw.raw(),
            nw.raw(),
            a.s_out.raw(),
            y.raw(),
        );
        let (n32, k32) = (int(OP, "n", n)?, int(OP, "k", k)?);
        // (const u8* w, const float* h, const float* yv, const float* pw, const float* nw,
        //  int post_mode, int mode, float eps, float scale, float* s_out, float* y, int n, int k);
        // sizes checked above, the dynamic shared memory holds k f32 + k int8 + k / 32 float2
        self.go(
            &entry,
            cfg,
            &[
                &wp, &hp, &yp, &pp, &np, &pm, &nm, &a.eps, &a.scale, &sp, &op, &n32, &k32,
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::KERNELS;

    #[test]
    fn norm_entries_are_the_batch_1_repacked_gemvs() {
        let with: Vec<Quant> = KERNELS
            .iter()
            .filter(|s| gemv_has_norm(s))
            .map(|s| s.key.quant)
            .collect();
        assert!(with.contains(&Quant::Q4_0R));
        assert!(with.contains(&Quant::Q4KR));
        assert!(KERNELS
            .iter()
            .filter(|s| s.key.op == Op::Gemv && s.key.batch.value() != Some(1))
            .all(|s| !gemv_has_norm(s)));
    }
}
