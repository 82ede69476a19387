//! The fused MoE decode step: the routed experts of a MoE block in three launches (per layer and
//! decode step) instead of eight, from the block's input and its int8 side-car:
//!
//! | unfused (`pipeline.rs`, router in `linear`)                  | fused          |
//! |---------------------------------------------------------|----------------|
//! | `gemv` (router logits), `moe_route`                     | `moe_router`   |
//! | `quantize_q8` (x), `moe_gemv` (gate\|up), GLU, `quantize_q8` (h) | `moe_gate_up` |
//! | `moe_gemv` (down), `moe_combine`                        | `moe_down`     |
//!
//! `moe_router` computes the logits (one block per expert and token) and the block of a token
//! that finishes last routes it (an arrival counter per token, zero between launches);
//! `moe_gate_up` reads the input's side-car (the bytes `quantize_q8` would make) and writes the
//! GLU output's side-car (the bytes `quantize_q8` of the GLU output would make); `moe_down` sums
//! the slots' down projections with their routing weights in slot order, as `moe_combine`. So the
//! arithmetic is the unfused path's: the same int8 activations, the same dot products (lib/dequant's
//! qdot over staged rows), the same routing code (lib/route). Like the unfused decode path it
//! allocates only pooled scratch and never synchronises, so a recorded decode step replays it.
//!
//! Taken (see [`CudaBackend::moe_routed`](crate::backend::cuda::CudaBackend)) for inputs carrying a side-car
//! (one-row decode steps after rmsnorm / add_rmsnorm) when the router is F32 / F16 / BF16 / Q8_0
//! and the banks GGUF block formats (gate and up of one format); otherwise the unfused ops run.

use std::sync::Arc;

use super::launch_fused::{MoeDownArgs, MoeGateUpArgs, MoeRouterArgs, RouterNorm};
use super::pipeline::{bank, moe_dims, scratch};
use crate::backend::cuda::runtime::buf::{DevBuf, DevPtr, Pool};
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::kern::Kern;
use crate::backend::cuda::runtime::types::{GpuWeight, Q8Ptrs};
use crate::backend::cuda::CudaDevice;
use crate::backend::MoeParams;
use crate::kernels::Quant;

/// Most tokens one fused call routes (the arrival counters a caller keeps).
pub const MOE_DECODE_MAX_TOKENS: usize = 8;

fn invalid(detail: String) -> CudaError {
    CudaError::Invalid {
        op: "moe_decode",
        detail,
    }
}

/// The kernels of one fused call, for the router's and the banks' formats.
#[derive(Debug, Clone)]
pub struct MoeDecodeKerns {
    pub router: Kern,
    pub gate_up: Kern,
    pub down: Kern,
}

/// What one fused call reads.
#[derive(Debug, Clone, Copy)]
pub struct MoeDecodeIn<'a> {
    pub n: usize,
    /// The block input `[n, hidden]` (f32, read by float routers) and its int8 side-car.
    pub x: DevPtr<f32>,
    pub xq8: Q8Ptrs,
    /// `[n_experts, hidden]`.
    pub router: &'a GpuWeight,
    /// `[n_experts, ff, hidden]`, `[n_experts, ff, hidden]`, `[n_experts, out, ff]`.
    pub gate: &'a GpuWeight,
    pub up: &'a GpuWeight,
    pub down: &'a GpuWeight,
    /// At least `n` arrival counters, zero (and zero again once the call's launches ran).
    pub counters: DevPtr<u32>,
}

/// The kernel formats `[router, gate/up, down]` of the fused path for these weight formats, or
/// None when it does not take them (float or FP8 banks, gate and up in different formats,
/// another router format).
pub fn decode_quants(router: Quant, gate: Quant, up: Quant, down: Quant) -> Option<[Quant; 3]> {
    let block = |q: Quant| {
        matches!(
            q,
            Quant::Q8_0 | Quant::Q4_0 | Quant::Q5_0 | Quant::Q4K | Quant::Q6K
        )
    };
    let router_ok = matches!(
        router,
        Quant::F32 | Quant::F16 | Quant::Bf16 | Quant::Q8_0 | Quant::Q8_0R
    );
    (router_ok && gate == up && block(gate) && block(down)).then_some([router, gate, down])
}

impl CudaDevice {
    /// `sum_k p_k * down_k(act(gate_k x) * up_k x)` over the top-k experts of
    /// `softmax(x @ router^T)` for `a.n` tokens, in three launches; returns `[n, out]` f32 from
    /// `pool`.
    ///
    /// `norm` Some: the router launch is `moe_router__norm` (`k.router` that entry), which also
    /// makes the block input (`a.xq8`, written) from the residual add and norm it describes.
    pub fn moe_decode(
        &self,
        pool: &Arc<Pool>,
        k: &MoeDecodeKerns,
        a: &MoeDecodeIn<'_>,
        p: &MoeParams,
        norm: Option<&RouterNorm>,
    ) -> Result<DevBuf, CudaError> {
        let (n, e) = (a.n, p.n_experts);
        if n == 0 || n > MOE_DECODE_MAX_TOKENS {
            return Err(invalid(format!("{n} tokens (1..={MOE_DECODE_MAX_TOKENS})")));
        }
        let d = moe_dims(
            n,
            a.x.len(),
            n * e,
            (&a.gate.shape, a.gate.quant),
            (&a.up.shape, a.up.quant),
            (&a.down.shape, a.down.quant),
            p,
        )?;
        let q = decode_quants(a.router.quant, a.gate.quant, a.up.quant, a.down.quant).ok_or_else(
            || {
                invalid(format!(
                    "router {} with banks {} / {} / {}",
                    a.router.quant, a.gate.quant, a.up.quant, a.down.quant
                ))
            },
        )?;
        let have = [
            k.router.spec.key.quant,
            k.gate_up.spec.key.quant,
            k.down.spec.key.quant,
        ];
        if have != q {
            return Err(invalid(format!("kernels for {have:?}, weights {q:?}")));
        }
        match a.router.shape[..] {
            [re, rk] if re == e && rk == d.hidden && a.router.scales.is_none() => {}
            _ => {
                return Err(invalid(format!(
                    "router {:?} is not [{e}, {}]",
                    a.router.shape, d.hidden
                )))
            }
        }
        let pairs = d.pairs();
        let (buf, y) = scratch::<f32>(pool, n * d.out)?;
        let (_lb, logits) = scratch::<f32>(pool, n * e)?;
        let (_ib, ids) = scratch::<i32>(pool, pairs)?;
        let (_wb, wts) = scratch::<f32>(pool, pairs)?;
        let (_qb, hq) = scratch::<i8>(pool, pairs * d.ff)?;
        let (_db, hds) = scratch::<f32>(pool, pairs * d.ff / 16)?;
        let (xq, xds) = a.xq8;
        let route = |r: &MoeRouterArgs| match norm {
            Some(nm) => self.moe_router_norm(&k.router, r, nm),
            None => self.moe_router(&k.router, r),
        };
        route(&MoeRouterArgs {
            w: a.router.data.u8(),
            x: a.x,
            xq,
            xds,
            logits,
            ids,
            wts,
            counters: a.counters,
            n,
            e,
            k: d.hidden,
            top_k: d.top_k,
            norm: p.norm_topk,
        })?;
        self.moe_gate_up(
            &k.gate_up,
            &MoeGateUpArgs {
                gate: bank(a.gate, d.ff, d.hidden, e)?,
                up: bank(a.up, d.ff, d.hidden, e)?,
                n_experts: e,
                ids,
                pairs,
                x_div: d.top_k,
                xq,
                xds,
                k: d.hidden,
                ff: d.ff,
                act: p.act,
                h: DevPtr::null(),
                hq,
                hds,
            },
        )?;
        self.moe_down(
            &k.down,
            &MoeDownArgs {
                down: bank(a.down, d.out, d.ff, e)?,
                n_experts: e,
                ids,
                wts,
                n,
                top_k: d.top_k,
                hq,
                hds,
                ff: d.ff,
                out: d.out,
                y,
                // the router wrote the ids; moe_gate_up runs in between
                ids_early: down_ids_early(),
            },
        )?;
        Ok(buf)
    }
}

/// Whether `moe_down` reads its expert ids and requests their rows into L2 before its
/// programmatic-launch wait (`FUCINA_MOE_DOWN_EARLY=0`: after it), read once.
fn down_ids_early() -> bool {
    crate::tuning::get().moe_down_early
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_formats() {
        use Quant::*;
        assert_eq!(decode_quants(F32, Q4K, Q4K, Q6K), Some([F32, Q4K, Q6K]));
        assert_eq!(
            decode_quants(Q8_0, Q8_0, Q8_0, Q8_0),
            Some([Q8_0, Q8_0, Q8_0])
        );
        assert!(decode_quants(Bf16, Q4_0, Q4_0, Q5_0).is_some());
        // gate and up differ; float banks; FP8 banks; a block-format router
        assert!(decode_quants(F32, Q4K, Q6K, Q6K).is_none());
        assert!(decode_quants(F32, F16, F16, Q4K).is_none());
        assert!(decode_quants(F32, Fp8E4m3, Fp8E4m3, Fp8E4m3).is_none());
        assert!(decode_quants(Q4K, Q4K, Q4K, Q4K).is_none());
    }
}
