//! `moe_routed` on the CUDA backend: the fused decode path (`moe_decode.rs`: router + top-k,
//! gate/up + GLU, down + weighted sum; three launches) when the input carries an int8 side-car
//! and the weights' formats and shapes fit, else the trait's composition (`linear` for the
//! router logits, then `moe`). `FUCINA_MOE_FUSED=0` turns the fused path off (read once).

use super::super::launch_linear::weight_block;
use super::super::moe::moe_dims;
use super::super::moe_decode::{decode_quants, MoeDecodeIn, MoeDecodeKerns, MOE_DECODE_MAX_TOKENS};
use super::super::types::{GpuTensor, GpuWeight};
use super::CudaBackend;
use crate::backend::{BackendError, MoeParams, Result};
use crate::kernels::{BatchBucket, Op, Quant};

/// Whether the fused decode MoE path is on (`FUCINA_MOE_FUSED=0` turns it off).
pub fn moe_fused_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FUCINA_MOE_FUSED").map_or(true, |v| v != "0"))
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
        let Some(q) = decode_quants(router.quant, gate.quant, up.quant, down.quant) else {
            return Ok(None);
        };
        if [router, gate, up, down].iter().any(|w| w.scales.is_some()) {
            return Ok(None);
        }
        let Ok(d) = moe_dims(
            x.rows,
            x.len(),
            x.rows * p.n_experts,
            (&gate.shape, gate.quant),
            (&up.shape, up.quant),
            (&down.shape, down.quant),
            p,
        ) else {
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
}
