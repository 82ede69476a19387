//! `linear_add_rms_norm_then` on the device: a decode row's output projection, the residual
//! add, the next RMSNorm and the projections that read it, with the norm handed over deferred.
//!
//! One row against repacked weights (q4_0r / q8_0r / q4_kr, whole 256-element rows, outputs a
//! multiple of 32) runs the GEMV's `__res` entry (the projection, the add, the norm weight
//! applied and quantised, the sums of squares per 32) and then the consumers through the `__rs`
//! entry, which scales its dots by the norm's rstd (a gate|up then runs the GLU kernel, or as one
//! `__glurs` launch where that fits one wave; a q4_kr q|k and a q6_kr v run as one `__rsqv`
//! launch). No launch computes the norm itself. The normed
//! row differs from `add_rms_norm`'s in rounding only (its int8 blocks are those of s * w, times
//! rstd).
//!
//! Where it is taken by default is measured ([`defer_by_default`]): after q4_kr, q6_kr and
//! q8_0r projections, not where the gate|up GEMV runs as one `__glu` launch; after q4_0r
//! projections everywhere, the gate|up then as one `__glurs` launch (the `__glu` entry scaling
//! its dots by rstd). `FUCINA_DEFER_NORM` (`0`, `1`, `linear`, `glu`) and `FUCINA_GLURS=0`
//! override. Anything the kernels do not take runs the composition (`linear`, `add_rms_norm`,
//! the consumers).

use super::linear::slice;
use super::CudaBackend;
use crate::backend::cuda::ops::linear::launch::gemv_default_grid;
use crate::backend::cuda::ops::linear::res::{
    res_launch_warps, rs_suffix, rsqv_blocks, GemvResArgs, RsArgs, RsPart,
};
use crate::backend::cuda::runtime::types::{GpuTensor, GpuWeight};
use crate::backend::{
    linear_add_rms_norm_then_composed, Activation, BackendError, Norm, NormNext, Result,
};
use crate::kernels::Entry;
use crate::kernels::{BatchBucket, Op, Quant};

/// `FUCINA_DEFER_NORM` (read once; for A/B runs): `0` never defers, `1` defers wherever the
/// kernels apply, `linear` wherever the consumer is not one `__glu` launch, `glu` only where it
/// is (the gate|up then runs as `__glurs`), unset: [`defer_by_default`].
fn defer_env(glu_launch: bool) -> Option<bool> {
    use crate::tuning::DeferNorm as Defer;
    let on = crate::tuning::get().defer_norm;
    on.map(|d| match d {
        Defer::Never => false,
        Defer::Always => true,
        Defer::Linear => !glu_launch,
        Defer::Glu => glu_launch,
    })
}

/// Whether the norm is deferred by default, from measurements (H200, Qwen3-8B decode): only
/// after a q4_kr projection
/// (Q4_K_M: +1.5% at prompt 512, three runs each; +1.6% / +2.5% at prompt 16), and not where the
/// gate|up runs as one `__glu` launch (deferred, that launch ran Q8_0 15% and Q4_0 2% slower).
/// After q8_0r and q4_0r projections the deferred q/k/v measured within noise or mixed (Q8_0
/// +1.5% at prompt 16, -0.3% at 512; Q4_0 +1.5% and -1.3% in two builds). After q6_kr ones
/// (Q4_K_M's Q6_K down projections): Qwen3-8B Q4_K_M +1.1% (469.1 -> 474.1,
/// two runs) and +1.2% (468.0 -> 473.7, three runs each). A gate|up with the GLU in its `__rs`
/// launch (`__rsglu`, arrival counters per 32 outputs) ran Q4_K_M 11% slower than `__rs` + the
/// GLU kernel. After q8_0r projections, with `__res` in blocks of
/// 24 warps: Qwen3-8B Q8_0 390.4 -> 396.3 tok/s (two runs each; 377.5 at 16 warps). After q4_0r
/// ones the same change measured 586.7 -> 585.3 (two runs each).
/// After q4_0r projections both norms are deferred, the gate|up as one `__glurs`
/// launch (`glurs`: that launch runs; else not deferred where the gate|up is one `__glu`
/// launch), the q|k|v through `__rs` and attn_prep. Qwen3-8B Q4_0 decode at prompt 16, depths 0
/// / 4096, two runs each: 595.0 / 536.9 and 595.8 / 537.3 tok/s with neither, 618.6 / 546.2
/// and 619.1 / 546.9 with both; the gate|up's alone 611.5 / 611.7 at depth 0; the down
/// projection's alone 584 / 541, below neither. After q8_0r projections both
/// deferred measured 392.8 / 393.3 against 398.2 / 397.6, so Q8_0 keeps `add_rmsnorm` + `__glu`.
fn defer_by_default(producer: Quant, glu_launch: bool, glurs: bool) -> bool {
    match producer {
        Quant::Q4_0R => !glu_launch || glurs,
        Quant::Q4KR | Quant::Q6KR | Quant::Q8_0R => !glu_launch,
        _ => false,
    }
}

/// The default of [`CudaBackend::rs_wide`] for a q4_kr consumer of rows of `k` (<= 4096) in a
/// launch of `blocks` blocks on `sms` SMs: the narrow entry takes two batches a row and the wide
/// one's 3 blocks an SM hold every block.
fn wide_by_default(k: usize, blocks: usize, sms: u32) -> bool {
    k > 2048 && blocks <= 3 * sms.max(1) as usize
}

fn shape(detail: String) -> BackendError {
    BackendError::Shape {
        op: "linear_add_rms_norm_then",
        detail,
    }
}

/// Whether `q` is a repacked format whose rows of `k` its GEMV takes.
fn repacked_fits(q: Quant, k: usize) -> bool {
    crate::quant::repack::source_of(q).is_some_and(|(_, s)| s.fits(k))
}

impl CudaBackend {
    pub(super) fn linear_add_rms_norm_then_impl(
        &self,
        x: &GpuTensor,
        w: &GpuWeight,
        h: &GpuTensor,
        norm: Norm<'_, GpuTensor>,
        eps: f32,
        next: &NormNext<'_, GpuWeight>,
    ) -> Result<(GpuTensor, Vec<GpuTensor>)> {
        if self.defers_norm_impl(w, next)? {
            if let Some(r) = self.deferred_norm(x, w, h, &norm, eps, next)? {
                return Ok(r);
            }
        }
        linear_add_rms_norm_then_composed(self, x, w, h, norm, eps, next)
    }

    /// Whether [`Self::linear_add_rms_norm_then_impl`] tries the deferred form for a producer
    /// `w` and consumers `next` (the policy: [`CudaBackend::with_defer_norm`],
    /// `FUCINA_DEFER_NORM`, else [`defer_by_default`]); where the kernels do not take the
    /// inputs it still runs the composition.
    pub(crate) fn defers_norm_impl(
        &self,
        w: &GpuWeight,
        next: &NormNext<'_, GpuWeight>,
    ) -> Result<bool> {
        let v = w.matrix()?;
        let (glu_launch, glurs) = match next {
            NormNext::Glu(g, _) => {
                let gv = g.matrix()?;
                let glu = self.glu_entry(v.rows, &gv).is_some();
                (glu, glu && self.glurs_entry(&gv, v.rows).is_some())
            }
            NormNext::Linear(_) => (false, false),
        };
        let on = self.defer_norm.or_else(|| defer_env(glu_launch));
        Ok(on.unwrap_or_else(|| defer_by_default(v.quant, glu_launch, glurs)))
    }

    /// The deferred form of [`Self::linear_add_rms_norm_then_impl`] (whatever the policy
    /// there says), None where it does not apply (nothing launched then).
    pub(crate) fn deferred_norm(
        &self,
        x: &GpuTensor,
        w: &GpuWeight,
        h: &GpuTensor,
        norm: &Norm<'_, GpuTensor>,
        eps: f32,
        next: &NormNext<'_, GpuWeight>,
    ) -> Result<Option<(GpuTensor, Vec<GpuTensor>)>> {
        let v = w.matrix()?;
        let (k, n) = (x.cols, v.rows);
        if x.rows != 1
            || h.rows != 1
            || h.cols != n
            || v.cols != k
            || n == 0
            || n % 32 != 0
            || !repacked_fits(v.quant, k)
        {
            return Ok(None);
        }
        // every consumer a repacked GEMV over the n values
        let consumers: Vec<&GpuWeight> = match next {
            NormNext::Glu(g, _) => vec![*g],
            NormNext::Linear(ws) => ws.to_vec(),
        };
        let mut views = Vec::with_capacity(consumers.len());
        for c in &consumers {
            let cv = c.matrix()?;
            let odd_glu = matches!(next, NormNext::Glu(..)) && cv.rows % 2 != 0;
            if cv.cols != n || !repacked_fits(cv.quant, n) || odd_glu {
                return Ok(None);
            }
            views.push(cv);
        }
        let Ok(res) = self.kern_entry_at(Op::Gemv, v.quant, BatchBucket::B1, Entry::Res) else {
            return Ok(None);
        };
        let warps = res_launch_warps(res.kern.spec, k);
        let mut rs_entries = Vec::with_capacity(views.len());
        for cv in &views {
            let Ok(k) = self.kern(Op::Gemv, cv.quant, BatchBucket::B1) else {
                return Ok(None);
            };
            let blocks = gemv_default_grid(k.spec, cv.rows, self.sms) as usize;
            let suffix = if self.rs_wide(cv.quant, n, blocks) {
                Entry::Rsw
            } else {
                rs_suffix(k.spec, cv.rows, self.sms)
            };
            let Ok(e) = self.kern_entry_at(Op::Gemv, cv.quant, BatchBucket::B1, suffix) else {
                return Ok(None);
            };
            rs_entries.push(e);
        }
        let norm = super::fused::norm_ptr("linear_add_rms_norm_then", norm, n)?;

        let mut own = None;
        let (xq, xds) = self.row_side_car(x, &mut own)?;
        let s = self.alloc_tensor(1, n)?;
        let z = self
            .q8_side(1, n)?
            .ok_or_else(|| shape(format!("no side-car for {n} values")))?;
        let part_buf = self.pool.alloc(n / 32 * 4)?;
        let part = slice(part_buf.f32(), n / 32)?;
        self.dev.gemv_res_ptr(
            &res,
            &GemvResArgs {
                w: v.data,
                xq,
                xds,
                hres: h.ptr(),
                s: s.ptr(),
                norm,
                zq: z.q(),
                zds: z.ds(),
                part,
                n,
                k,
            },
            warps,
        )?;
        let rs = RsArgs { part, eps };

        let outs = match next {
            NormNext::Glu(_, act) => {
                vec![self.deferred_glu(&views[0], &rs_entries[0], &z, rs, *act)?]
            }
            NormNext::Linear(_) => {
                if let Some(e) = self.rsqv_entry(&views) {
                    // v (Q6_K) and q|k (Q4_K) of a Q4_K_M layer: one launch
                    let y = self.alloc_tensor(1, views[0].rows)?;
                    let y6 = self.alloc_tensor(1, views[1].rows)?;
                    self.dev.gemv_rsqv_ptr(
                        &e,
                        RsPart {
                            w: views[1].data,
                            y: y6.ptr(),
                            n: views[1].rows,
                        },
                        RsPart {
                            w: views[0].data,
                            y: y.ptr(),
                            n: views[0].rows,
                        },
                        (z.q(), z.ds()),
                        n,
                        &rs,
                    )?;
                    return Ok(Some((s, vec![y, y6])));
                }
                let mut outs = Vec::with_capacity(views.len());
                for (cv, e) in views.iter().zip(&rs_entries) {
                    let y = self.alloc_tensor(1, cv.rows)?;
                    self.dev.gemv_rs_ptr(
                        e,
                        cv.data,
                        (z.q(), z.ds()),
                        y.ptr(),
                        (cv.rows, n),
                        &rs,
                        self.sms,
                    )?;
                    outs.push(y);
                }
                outs
            }
        };
        Ok(Some((s, outs)))
    }

    /// The `__rsqv` entry where the consumers are a q4_kr weight then a q6_kr one of the same
    /// inputs (a Q4_K_M layer's q|k and v), None elsewhere. [`CudaBackend::with_rsqv`] turns it
    /// on wherever the kernel takes it, or off; `FUCINA_RSQV=0` off. By default it is not taken
    /// where v alone would run as `__rs2` (Qwen3-30B-A3B's 512-row V, measured with `__rs2`,
    /// not with this). Measured on the H200 (prompt 16, three runs each): Qwen3-8B
    /// Q4_K_M decode 494.5 / 495.0 / 495.1 tok/s with two launches, 509.3 / 508.1 / 508.8 with
    /// one.
    fn rsqv_entry(
        &self,
        views: &[crate::backend::cuda::runtime::types::WeightView],
    ) -> Option<crate::backend::cuda::runtime::kern::KernEntry> {
        let [a, b] = views else {
            return None;
        };
        if a.quant != Quant::Q4KR || b.quant != Quant::Q6KR || a.cols != b.cols {
            return None;
        }
        let on = match self.rsqv {
            Some(on) => on,
            None => {
                crate::tuning::get().rsqv
                    && self
                        .kern(Op::Gemv, Quant::Q6KR, BatchBucket::B1)
                        .is_ok_and(|k| rs_suffix(k.spec, b.rows, self.sms) == Entry::Rs)
            }
        };
        if !on {
            return None;
        }
        let spec = self.kern(Op::Gemv, Quant::Q4KR, BatchBucket::B1).ok()?.spec;
        let blocks = rsqv_blocks(spec, b.rows, a.rows);
        let suffix = if self.rs_wide(Quant::Q4KR, a.cols, blocks) {
            Entry::Rsqvw
        } else {
            Entry::Rsqv
        };
        self.kern_entry_at(Op::Gemv, Quant::Q4KR, BatchBucket::B1, suffix)
            .ok()
    }

    /// Whether a deferred norm's q4_kr consumer launch of `blocks` blocks over rows of `k`
    /// takes the wide entries (`__rsw`, `__rsqvw`: a row of k <= 4096 in one batch of loads,
    /// bit-identical to `__rs` / `__rsqv`). They hold 158 / 168 registers, 3 blocks of 128
    /// threads an SM, so by default only where the narrow entries take two batches a row (k >
    /// 2048: at 2048 both take one, Qwen3-30B-A3B's q|k) and all the blocks are resident at once
    /// (the q|k|v projections; a 24576-row gate|up is not). [`CudaBackend::with_rs_wide`]
    /// forces them on (wherever k <= 4096) or off. Measured on the H200 (Qwen3-8B
    /// Q4_K_M decode, prompt 16, three interleaved runs each): 509.3 / 510.1 / 508.7 tok/s off,
    /// 511.2 / 511.7 / 512.7 on the q|k|v launches, 507.1 / 509.2 / 507.6 also on gate|up; the
    /// same 64-token greedy text on and off (`--raw`).
    pub(crate) fn rs_wide(&self, q: Quant, k: usize, blocks: usize) -> bool {
        let fits = q == Quant::Q4KR && k <= 4096;
        match self.rs_wide {
            Some(on) => on && fits,
            None => fits && wide_by_default(k, blocks, self.sms),
        }
    }

    /// Whether a deferred norm's consumers `ws` run as one `__rsqv` launch (the selftest's
    /// check that its rows compare that launch).
    pub(crate) fn takes_rsqv(&self, ws: &[&GpuWeight]) -> Result<bool> {
        let views = ws
            .iter()
            .map(|w| Ok(w.matrix()?))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.rsqv_entry(&views).is_some())
    }

    /// The `__glurs` entry for a deferred norm's gate|up `gv` over rows of `k`, where it runs
    /// in one wave (as [`Self::glu_entry`] asks of `__glu`) and [`CudaBackend::with_glurs`] /
    /// `FUCINA_GLURS` (default on) allow it; None: the `__rs` GEMV and the GLU kernel.
    pub(crate) fn glurs_entry(
        &self,
        gv: &crate::backend::cuda::runtime::types::WeightView,
        k: usize,
    ) -> Option<crate::backend::cuda::runtime::kern::KernEntry> {
        let on = self.glurs.unwrap_or(crate::tuning::get().glurs);
        if !on {
            return None;
        }
        self.glu_entry(k, gv)?;
        let e = self
            .kern_entry_at(Op::Gemv, gv.quant, BatchBucket::B1, Entry::Glurs)
            .ok()?;
        self.dev
            .gemv_glu_warps(&e, (gv.rows / 64) as u32, self.sms)
            .map(|_| e)
    }

    /// Whether a deferred norm over `k` values feeding the fused gate|up `w` runs as one
    /// `__glurs` launch (the selftest's check that its rows compare that launch).
    pub(crate) fn takes_glurs(&self, w: &GpuWeight, k: usize) -> Result<bool> {
        Ok(self.glurs_entry(&w.matrix()?, k).is_some())
    }

    /// `act(gate n) * up n` of a fused gate|up weight over a deferred norm (`z`, `rs`): one
    /// `__glurs` launch where [`Self::glurs_entry`] gives one, else the `__rs` GEMV, then the
    /// GLU kernel.
    fn deferred_glu(
        &self,
        gv: &crate::backend::cuda::runtime::types::WeightView,
        rs_entry: &crate::backend::cuda::runtime::kern::KernEntry,
        z: &crate::backend::cuda::runtime::types::Q8Side,
        rs: RsArgs,
        act: Activation,
    ) -> Result<GpuTensor> {
        if gv.rows % 2 != 0 {
            return Err(shape(format!("{} gate|up rows", gv.rows)));
        }
        if let Some(e) = self.glurs_entry(gv, z.len) {
            return self.glu_launch(&e, gv, (z.q(), z.ds()), act, Some(rs));
        }
        let y = self.alloc_tensor(1, gv.rows)?;
        self.dev.gemv_rs_ptr(
            rs_entry,
            gv.data,
            (z.q(), z.ds()),
            y.ptr(),
            (gv.rows, z.len),
            &rs,
            self.sms,
        )?;
        self.glu_fused_impl(&y, act)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default follows the measurements: after a q4_kr, q6_kr or q8_0r projection, a
    /// gate|up only where it is not one `__glu` launch; after q4_0r projections everywhere but
    /// a `__glu` launch without its `__glurs` form; nothing after other formats.
    #[test]
    fn defers_where_measured() {
        assert!(defer_by_default(Quant::Q4KR, false, false));
        assert!(defer_by_default(Quant::Q6KR, false, false));
        assert!(!defer_by_default(Quant::Q6KR, true, false));
        assert!(!defer_by_default(Quant::Q4KR, true, false));
        assert!(defer_by_default(Quant::Q8_0R, false, false));
        assert!(!defer_by_default(Quant::Q8_0R, true, true));
        assert!(defer_by_default(Quant::Q4_0R, false, false));
        assert!(defer_by_default(Quant::Q4_0R, true, true));
        assert!(!defer_by_default(Quant::Q4_0R, true, false));
        assert!(!defer_by_default(Quant::F32, false, false));
    }

    /// Qwen3-8B's q|k|v (6144 rows: 384 blocks) takes the wide entries on the H200's 132 SMs;
    /// its gate|up (1536 blocks), Qwen3-30B-A3B's 2048-wide q|k and any launch on 48 SMs do not.
    #[test]
    fn wide_where_measured() {
        assert!(wide_by_default(4096, 384, 132));
        assert!(!wide_by_default(4096, 1536, 132));
        assert!(!wide_by_default(2048, 288, 132));
        assert!(!wide_by_default(4096, 384, 48));
    }
}
