//! `moe_routed` on the CUDA backend: the fused decode path (`ops/moe/decode.rs`: router + top-k,
//! gate/up + GLU, down + weighted sum; three launches) when the input carries an int8 side-car
//! and the weights' formats and shapes fit, else the trait's composition (`linear` for the
//! router logits, then `moe`). `FUCINA_MOE_FUSED=0` turns the fused path off (read once).

use super::CudaBackend;
use crate::backend::cuda::ops::elementwise::launch::NormWeightPtr;
use crate::backend::cuda::ops::moe::decode::{
    decode_quants, MoeDecodeIn, MoeDecodeKerns, MOE_DECODE_MAX_TOKENS,
};
use crate::backend::cuda::ops::moe::launch_fused::RouterNorm;
use crate::backend::cuda::ops::moe::pipeline::moe_dims;
use crate::backend::cuda::runtime::kern::weight_block;
use crate::backend::cuda::runtime::kern::Kern;
use crate::backend::cuda::runtime::types::{GpuTensor, GpuWeight};
use crate::backend::{BackendError, MoeParams, Norm, Result};
use crate::kernels::Entry;
use crate::kernels::{BatchBucket, Op, Quant};

/// Whether the fused decode MoE path is on (`FUCINA_MOE_FUSED=0` turns it off).
pub fn moe_fused_enabled() -> bool {
    crate::tuning::get().moe_fused
}

/// The kernel formats and dimensions of the fused decode path for `rows` rows of `cols` inputs,
/// or None when it does not take these weights (formats, FP8 scales, shapes).
fn fused_plan(
    rows: usize,
    cols: usize,
    router: &GpuWeight,
    gate: &GpuWeight,
    up: &GpuWeight,
    down: &GpuWeight,
    p: &MoeParams,
) -> Option<(
    [Quant; 3],
    crate::backend::cuda::ops::moe::pipeline::MoeDims,
)> {
    let q = decode_quants(router.quant, gate.quant, up.quant, down.quant)?;
    if [router, gate, up, down].iter().any(|w| w.scales.is_some()) {
        return None;
    }
    let d = moe_dims(
        rows,
        rows * cols,
        rows * p.n_experts,
        (&gate.shape, gate.quant),
        (&up.shape, up.quant),
        (&down.shape, down.quant),
        p,
    )
    .ok()?;
    Some((q, d))
}

impl CudaBackend {
    /// The routed experts through the fused decode kernels, or None when that path does not
    /// apply: no side-car on `x` (more than one row, or a producer that writes none), formats
    /// or shapes it does not take (the composed ops then run, and report shape errors), an
    /// instance missing for this device, or the path turned off.
    pub fn moe_routed_fused(
        &self,
        x: &GpuTensor,
        router: &GpuWeight,
        gate: &GpuWeight,
        up: &GpuWeight,
        down: &GpuWeight,
        p: &MoeParams,
    ) -> Result<Option<GpuTensor>> {
        if !moe_fused_enabled() || x.rows == 0 || x.rows > MOE_DECODE_MAX_TOKENS {
            return Ok(None);
        }
        let Some(side) = x.q8.as_ref().filter(|s| s.len == x.len()) else {
            return Ok(None);
        };
        let Some((q, d)) = fused_plan(x.rows, x.cols, router, gate, up, down, p) else {
            return Ok(None);
        };
        // the router [E, hidden]; float rows whole 16-byte vectors, x 16-byte aligned
        let router_ok = match router.shape[..] {
            [re, rk] if re == p.n_experts && rk == x.cols && d.hidden == x.cols => {
                match weight_block(router.quant) {
                    Some((1, es)) => (rk * es) % 16 == 0 && x.ptr().raw() % 16 == 0,
                    Some((be, _)) => rk % be == 0,
                    None => false,
                }
            }
            _ => false,
        };
        if !router_ok || d.ff % 32 != 0 {
            return Ok(None);
        }
        let kern = |op: Op, q: Quant| self.kern(op, q, BatchBucket::Any);
        let kerns = match (
            kern(Op::MoeRouter, q[0]),
            kern(Op::MoeGateUp, q[1]),
            kern(Op::MoeDown, q[2]),
        ) {
            (Ok(router), Ok(gate_up), Ok(down)) => MoeDecodeKerns {
                router,
                gate_up,
                down,
            },
            _ => return Ok(None),
        };
        let counters = self
            .moe_counters
            .ptr::<u32>()
            .slice(0, MOE_DECODE_MAX_TOKENS)
            .ok_or_else(|| BackendError::Device("MoE counters buffer too short".into()))?;
        let buf = self.dev.moe_decode(
            &self.pool,
            &kerns,
            &MoeDecodeIn {
                n: x.rows,
                x: x.ptr(),
                xq8: side.ptrs(),
                router,
                gate,
                up,
                down,
                counters,
            },
            p,
            None,
        )?;
        if buf.bytes() < x.rows * d.out * 4 {
            return Err(BackendError::Device(format!(
                "moe_decode returned {} bytes for [{}, {}]",
                buf.bytes(),
                x.rows,
                d.out
            )));
        }
        Ok(Some(GpuTensor::new(buf, x.rows, d.out)))
    }

    /// `add_rms_norm(h, y)` and the routed experts of the normed row in three launches: the
    /// residual add and the norm run inside the router kernel (`moe_router__norm`), which
    /// writes the sum and the normed row's int8 side-car (what the expert kernels read). None
    /// when that path does not apply: more than one row, a norm that is not whole-row, a router
    /// that is not F32 / F16 / BF16, what `moe_routed_fused` declines, or
    /// `FUCINA_MOE_NORM_FUSED=0`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm_moe_impl(
        &self,
        h: &GpuTensor,
        y: &GpuTensor,
        w: Norm<'_, GpuTensor>,
        eps: f32,
        router: &GpuWeight,
        gate: &GpuWeight,
        up: &GpuWeight,
        down: &GpuWeight,
        p: &MoeParams,
    ) -> Result<Option<(GpuTensor, GpuTensor)>> {
        let on = crate::tuning::get().moe_norm_fused;
        let k = h.cols;
        if !on
            || !moe_fused_enabled()
            || h.rows != 1
            || y.rows != 1
            || y.cols != k
            || k % 32 != 0
            || !matches!(router.quant, Quant::F32 | Quant::F16 | Quant::Bf16)
            || h.ptr().raw() % 16 != 0
            || y.ptr().raw() % 16 != 0
        {
            return Ok(None);
        }
        let wp = match w {
            Norm::Plain(t) if t.len() == k => NormWeightPtr::Plain(t.ptr()),
            Norm::OnePlus(t) if t.len() == k => NormWeightPtr::OnePlus(t.ptr()),
            Norm::None => NormWeightPtr::None,
            _ => return Ok(None),
        };
        let Some((q, d)) = fused_plan(1, k, router, gate, up, down, p) else {
            return Ok(None);
        };
        let router_ok = matches!(router.shape[..], [re, rk] if re == p.n_experts && rk == k)
            && d.hidden == k
            && d.ff % 32 == 0;
        if !router_ok {
            return Ok(None);
        }
        let kern = |op: Op, q: Quant| self.kern(op, q, BatchBucket::Any);
        let (Ok(rk), Ok(gate_up), Ok(dn)) = (
            kern(Op::MoeRouter, q[0]),
            kern(Op::MoeGateUp, q[1]),
            kern(Op::MoeDown, q[2]),
        ) else {
            return Ok(None);
        };
        let Ok(f) = self.dev.function_entry(rk.spec, Entry::Norm) else {
            return Ok(None);
        };
        let kerns = MoeDecodeKerns {
            router: Kern { spec: rk.spec, f },
            gate_up,
            down: dn,
        };
        let s = self.alloc_tensor(1, k)?;
        let Some(side) = self.q8_side(1, k)? else {
            return Ok(None);
        };
        let counters = self
            .moe_counters
            .ptr::<u32>()
            .slice(0, MOE_DECODE_MAX_TOKENS)
            .ok_or_else(|| BackendError::Device("MoE counters buffer too short".into()))?;
        let (xq, xds) = side.ptrs();
        let buf = self.dev.moe_decode(
            &self.pool,
            &kerns,
            &MoeDecodeIn {
                n: 1,
                // the router reads a and b instead
                x: h.ptr(),
                xq8: (xq, xds),
                router,
                gate,
                up,
                down,
                counters,
            },
            p,
            Some(&RouterNorm {
                a: h.ptr(),
                b: y.ptr(),
                s: s.ptr(),
                w: wp,
                eps,
                xq,
                xds,
            }),
        )?;
        if buf.bytes() < d.out * 4 {
            return Err(BackendError::Device(format!(
                "moe_decode returned {} bytes for [1, {}]",
                buf.bytes(),
                d.out
            )));
        }
        // (the side-car is pooled scratch like moe_decode's own: the launches that read it are
        // queued before anything can take it again)
        drop(side);
        Ok(Some((s, GpuTensor::new(buf, 1, d.out))))
    }
}
