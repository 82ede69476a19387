//! Mixture-of-experts on the device: routing (softmax, top-k, optional renormalisation) and the
//! selected experts' gated MLPs, summed with their routing weights.
//!
//! Every batch size runs the same device-only pipeline (no host round trip, no driver
//! allocation once the pool is warm, so a decode step can be captured as a CUDA graph):
//!
//! 1. `moe_route`: expert ids `[n, k]` (i32) and weights `[n, k]` (f32) into device memory;
//! 2. `quantize_q8` of x (block-format banks) and one `moe_gemv` launch for the gate and up banks
//!    (per (token, slot) pair, the expert id read on the device) into `gu` `[n*k, 2*ff]`;
//! 3. the GLU (`swiglu` / `geglu` with row strides) into `h` `[n*k, ff]`;
//! 4. `quantize_q8` of h and `moe_gemv` over the down bank into `d` `[n*k, out]`;
//! 5. `moe_combine`: `out[t] = sum_j w[t][j] * d[t*k + j]`.
//!
//! A decode step whose MoE input carries an int8 side-car takes the fused path instead
//! (`decode.rs`, through `Backend::moe_routed`: the router GEMV and steps 1-5 in three
//! launches).
//!
//! Prefill from [`PREFILL_GEMM_MIN_TOKENS`] tokens runs on tensor cores when the banks allow it:
//! grouped on the device, one GEMM launch per projection over all experts (`grouped.rs`,
//! formats [`GROUPED_FORMATS`](super::grouped::GROUPED_FORMATS)), else by expert with the
//! routing sent to the host and a `gemm` per used expert (`by_expert.rs`, the fallback for the
//! other GEMM formats). Otherwise, from [`ORDER_MIN_TOKENS`] tokens, the grouped GEMV still runs without a
//! host round trip: the router's `__order` kernel sorts the (token, slot) pairs by expert on the device and
//! the GEMV launches them in that order, so the pairs of one expert run back to back and read its
//! matrices from L2 after the first. The cost: every pair still runs a full GEMV of its expert
//! (dp4a, one row per warp), i.e. `n * k` expert-matrix passes through L2/SM per bank instead of
//! one tensor-core GEMM per used expert over its gathered tokens.

use std::sync::Arc;

pub use super::launch::MoeDims;
use super::launch::{expert_bytes, MoeGemvArgs, MOE_MAX_EXPERTS, MOE_MAX_TOP_K};
use crate::backend::cuda::runtime::buf::{DevBuf, DevPtr, Pool};
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::kern::weight_block;
use crate::backend::cuda::runtime::types::GpuWeight;
use crate::backend::cuda::CudaDevice;
use crate::backend::MoeParams;
use crate::kernels::{BatchBucket, HeadDim, Op, Quant};

/// From this many tokens on, pairs are ordered by expert before the expert GEMVs.
pub const ORDER_MIN_TOKENS: usize = 9;
/// From this many tokens on, prefill runs by expert on tensor cores (`by_expert.rs`) when all
/// three banks have a `gemm` instance and 16-byte aligned experts.
pub const PREFILL_GEMM_MIN_TOKENS: usize = 64;

/// How `moe` runs a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoePath {
    /// Grouped GEMV, pairs in token order (decode, small batches; graph-capturable).
    Gemv,
    /// Grouped GEMV, pairs ordered by expert on the device (graph-capturable).
    GemvOrdered,
    /// Routing to the host, tokens gathered per expert, tensor-core GEMMs (one sync).
    Gemm,
    /// Grouped on the device, one tensor-core GEMM launch per projection (no sync).
    Grouped,
}

/// The by-expert GEMM prefill is on unless `FUCINA_MOE_GEMM=0` (read once): a switch back to
/// the grouped GEMV for every batch size.
pub fn prefill_gemm_enabled() -> bool {
    crate::tuning::get().moe_gemm
}

/// The device-grouped prefill is on unless `FUCINA_MOE_GROUPED=0` (read once): a switch back to
/// the host-grouped per-expert GEMMs.
pub fn prefill_grouped_enabled() -> bool {
    crate::tuning::get().moe_grouped
}

/// The path `moe` takes for `n` tokens over banks of these formats and shapes.
pub fn moe_path(n: usize, d: &MoeDims, q: [Quant; 3]) -> MoePath {
    use super::by_expert::gemm_ready;
    use super::grouped::grouped_ready;
    let prefill = n >= PREFILL_GEMM_MIN_TOKENS && prefill_gemm_enabled();
    if prefill && prefill_grouped_enabled() && grouped_ready(q, d) {
        MoePath::Grouped
    } else if prefill
        && gemm_ready(q[0], d.ff, d.hidden)
        && gemm_ready(q[1], d.ff, d.hidden)
        && gemm_ready(q[2], d.out, d.ff)
    {
        MoePath::Gemm
    } else if n >= ORDER_MIN_TOKENS {
        MoePath::GemvOrdered
    } else {
        MoePath::Gemv
    }
}

fn invalid(detail: String) -> CudaError {
    CudaError::Invalid { op: "moe", detail }
}

fn is_block(q: Quant) -> bool {
    weight_block(q).is_some_and(|(be, _)| be > 1)
}

/// Validate the shapes of a `moe` call (host only): banks `gate`, `up` `[E, ff, hidden]`, `down`
/// `[E, out, ff]`, `x` holding `n * hidden` floats, `logits` `n * E`.
#[allow(clippy::too_many_arguments)]
pub fn moe_dims(
    n: usize,
    x_len: usize,
    logits_len: usize,
    gate: (&[usize], Quant),
    up: (&[usize], Quant),
    down: (&[usize], Quant),
    p: &MoeParams,
) -> Result<MoeDims, CudaError> {
    let e = p.n_experts;
    if e == 0 || e > MOE_MAX_EXPERTS || p.top_k == 0 || p.top_k > e || p.top_k > MOE_MAX_TOP_K {
        return Err(invalid(format!(
            "{e} experts, top-{} (the GPU router takes up to {MOE_MAX_EXPERTS} experts and top-{MOE_MAX_TOP_K})",
            p.top_k
        )));
    }
    let (gs, us, ds) = (gate.0, up.0, down.0);
    let (ff, hidden) = match gs {
        [ge, ff, h] if *ge == e => (*ff, *h),
        _ => {
            return Err(invalid(format!(
                "gate bank {gs:?} is not [{e}, ff, hidden]"
            )))
        }
    };
    if us != gs {
        return Err(invalid(format!("up bank {us:?} differs from gate {gs:?}")));
    }
    let out = match ds {
        [de, o, f] if *de == e && *f == ff => *o,
        _ => return Err(invalid(format!("down bank {ds:?} is not [{e}, out, {ff}]"))),
    };
    for (name, q, rows, cols) in [
        ("gate", gate.1, ff, hidden),
        ("up", up.1, ff, hidden),
        ("down", down.1, out, ff),
    ] {
        expert_bytes("moe", q, rows, cols)
            .map_err(|err| invalid(format!("{name} bank ({q}): {err}")))?;
    }
    let need_x = n.checked_mul(hidden);
    let need_l = n.checked_mul(e);
    match (need_x, need_l) {
        (Some(nx), Some(nl)) if x_len >= nx && logits_len >= nl => {}
        _ => {
            return Err(invalid(format!(
                "x holds {x_len} floats, logits {logits_len}, for {n} tokens of {hidden} and {e} experts"
            )))
        }
    }
    if n.checked_mul(p.top_k)
        .and_then(|v| v.checked_mul(2 * ff.max(out)))
        .is_none_or(|v| v > i32::MAX as usize)
    {
        return Err(invalid(format!(
            "{n} tokens x top-{} is too large",
            p.top_k
        )));
    }
    Ok(MoeDims {
        n,
        experts: e,
        top_k: p.top_k,
        hidden,
        ff,
        out,
    })
}

/// A bank's bytes as one pointer (all experts), checked against its shape.
pub(in crate::backend::cuda) fn bank(
    w: &GpuWeight,
    dims_rows: usize,
    dims_cols: usize,
    e: usize,
) -> Result<DevPtr<u8>, CudaError> {
    if w.scales.is_some() {
        return Err(invalid(format!(
            "{} expert banks with block scales are not supported by moe_gemv",
            w.quant
        )));
    }
    let per = expert_bytes("moe", w.quant, dims_rows, dims_cols)?;
    w.data.u8().slice(0, per * e).ok_or_else(|| {
        invalid(format!(
            "bank of {} bytes, {e} experts need {}",
            w.data.bytes(),
            per * e
        ))
    })
}

/// Pooled scratch typed as `T` (exactly `len` values).
pub(in crate::backend::cuda) fn scratch<T>(
    pool: &Arc<Pool>,
    len: usize,
) -> Result<(DevBuf, DevPtr<T>), CudaError> {
    let buf = pool.alloc(len * std::mem::size_of::<T>())?;
    let p = buf
        .ptr::<T>()
        .slice(0, len)
        .ok_or_else(|| invalid(format!("pool returned a short buffer for {len} values")))?;
    Ok((buf, p))
}

impl CudaDevice {
    /// `x` f32 `[n, hidden]`, `router_logits` f32 `[n, n_experts]`; `gate`, `up` banks
    /// `[E, ff, hidden]`, `down` `[E, hidden, ff]`. Returns `[n, hidden]` f32 from `pool`:
    /// `sum_k p_k * down_k(act(gate_k x) * up_k x)`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe(
        &self,
        pool: &Arc<Pool>,
        x: DevPtr<f32>,
        n: usize,
        router_logits: DevPtr<f32>,
        gate: &GpuWeight,
        up: &GpuWeight,
        down: &GpuWeight,
        p: &MoeParams,
    ) -> Result<DevBuf, CudaError> {
        let d = moe_dims(
            n,
            x.len(),
            router_logits.len(),
            (&gate.shape, gate.quant),
            (&up.shape, up.quant),
            (&down.shape, down.quant),
            p,
        )?;
        let (out_buf, out) = scratch::<f32>(pool, d.n * d.out)?;
        if n == 0 {
            return Ok(out_buf);
        }
        let (e, k, pairs) = (d.experts, d.top_k, d.pairs());
        let spec = |op: Op, q: Quant| self.resolve(op, q, HeadDim::Any, BatchBucket::Any);

        // 1. routing
        let (_ib, ids) = scratch::<i32>(pool, pairs)?;
        let (_wb, wts) = scratch::<f32>(pool, pairs)?;
        self.moe_route(
            spec(Op::MoeRoute, Quant::F32)?,
            router_logits,
            ids,
            wts,
            n,
            e,
            k,
            p.norm_topk,
        )?;

        let path = moe_path(n, &d, [gate.quant, up.quant, down.quant]);
        if path == MoePath::Grouped {
            for w in [gate, up, down] {
                if w.scales.is_some() {
                    return Err(invalid(format!(
                        "{} expert banks with block scales are not supported",
                        w.quant
                    )));
                }
            }
            return self.moe_prefill_grouped(pool, x, &d, ids, wts, [gate, up, down], p.act);
        }
        if path == MoePath::Gemm {
            return self.moe_prefill_gemm(pool, x, &d, ids, wts, [gate, up, down], p.act);
        }
        // pairs grouped by expert (prefill only: decode has at most 8 * k pairs)
        let (_pb, perm) = if path == MoePath::GemvOrdered {
            let (b, perm) = scratch::<i32>(pool, pairs)?;
            self.moe_order(spec(Op::MoeRoute, Quant::F32)?, ids, perm, pairs, e)?;
            (Some(b), perm)
        } else {
            (None, DevPtr::null())
        };

        // 2. gate and up
        let qspec = spec(Op::QuantizeQ8, Quant::F32)?;
        let x = x
            .slice(0, n * d.hidden)
            .ok_or_else(|| invalid("x too short".into()))?;
        let mut _xq_bufs = Vec::new();
        let (xq, xds) = if is_block(gate.quant) || is_block(up.quant) {
            let (b1, xq) = scratch::<i8>(pool, n * d.hidden)?;
            let (b2, xds) = scratch::<f32>(pool, n * d.hidden / 16)?;
            self.moe_quantize_q8(qspec, x, n * d.hidden, xq, xds)?;
            _xq_bufs.push(b1);
            _xq_bufs.push(b2);
            (xq, xds)
        } else {
            (DevPtr::null(), DevPtr::null())
        };
        let ff = d.ff;
        let (_gub, gu) = scratch::<f32>(pool, pairs * 2 * ff)?;
        let gu_up = gu
            .slice(ff, pairs * 2 * ff - ff)
            .ok_or_else(|| invalid("gate/up scratch".into()))?;
        let gbank = bank(gate, ff, d.hidden, e)?;
        let ubank = bank(up, ff, d.hidden, e)?;
        let base = MoeGemvArgs {
            mats: &[],
            n_experts: e,
            ids,
            perm,
            pairs,
            x,
            xq,
            xds,
            x_div: k,
            n: ff,
            k: d.hidden,
            ldy: 2 * ff,
        };
        if gate.quant == up.quant {
            let mats = [(gbank, gu), (ubank, gu_up)];
            self.moe_gemv(
                spec(Op::MoeGemv, gate.quant)?,
                &MoeGemvArgs {
                    mats: &mats,
                    ..base
                },
            )?;
        } else {
            let mg = [(gbank, gu)];
            self.moe_gemv(
                spec(Op::MoeGemv, gate.quant)?,
                &MoeGemvArgs { mats: &mg, ..base },
            )?;
            let mu = [(ubank, gu_up)];
            self.moe_gemv(
                spec(Op::MoeGemv, up.quant)?,
                &MoeGemvArgs { mats: &mu, ..base },
            )?;
        }

        // 3. GLU
        let (_hb, h) = scratch::<f32>(pool, pairs * ff)?;
        self.moe_glu(
            self.glu_spec(p.act)?,
            gu,
            gu_up,
            h,
            pairs,
            ff,
            (2 * ff, 2 * ff, ff),
        )?;

        // 4. down
        let (hq, hds, _hq_bufs) = if is_block(down.quant) {
            let (b1, hq) = scratch::<i8>(pool, pairs * ff)?;
            let (b2, hds) = scratch::<f32>(pool, pairs * ff / 16)?;
            self.moe_quantize_q8(qspec, h, pairs * ff, hq, hds)?;
            (hq, hds, Some((b1, b2)))
        } else {
            (DevPtr::null(), DevPtr::null(), None)
        };
        let (_db, dout) = scratch::<f32>(pool, pairs * d.out)?;
        let dbank = bank(down, d.out, ff, e)?;
        let md = [(dbank, dout)];
        self.moe_gemv(
            spec(Op::MoeGemv, down.quant)?,
            &MoeGemvArgs {
                mats: &md,
                n_experts: e,
                ids,
                perm,
                pairs,
                x: h,
                xq: hq,
                xds: hds,
                x_div: 1,
                n: d.out,
                k: ff,
                ldy: d.out,
            },
        )?;

        // 5. weighted sum over slots
        self.moe_combine(
            spec(Op::MoeCombine, Quant::F32)?,
            dout,
            wts,
            out,
            n,
            d.out,
            k,
        )?;
        Ok(out_buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Activation;

    fn params(e: usize, k: usize) -> MoeParams {
        MoeParams {
            n_experts: e,
            top_k: k,
            norm_topk: true,
            act: Activation::Silu,
        }
    }

    #[test]
    fn dims_of_a_qwen3_moe_layer() {
        let (e, ff, h) = (128, 768, 2048);
        let g = [e, ff, h];
        let dn = [e, h, ff];
        let d = moe_dims(
            4,
            4 * h,
            4 * e,
            (&g, Quant::Q4K),
            (&g, Quant::Q4K),
            (&dn, Quant::Q6K),
            &params(e, 8),
        )
        .unwrap();
        assert_eq!(
            d,
            MoeDims {
                n: 4,
                experts: e,
                top_k: 8,
                hidden: h,
                ff,
                out: h
            }
        );
        assert_eq!(d.pairs(), 32);
    }

    #[test]
    fn dims_reject_bad_shapes() {
        let (e, ff, h) = (16, 256, 512);
        let g = [e, ff, h];
        let dn = [e, h, ff];
        let ok = |n, xl, ll, g: &[usize], u: &[usize], dn: &[usize], qd, p: &MoeParams| {
            moe_dims(n, xl, ll, (g, Quant::Q8_0), (u, Quant::Q8_0), (dn, qd), p)
        };
        let p = params(e, 4);
        assert!(ok(3, 3 * h, 3 * e, &g, &g, &dn, Quant::Q4K, &p).is_ok());
        // x or logits short
        assert!(ok(3, 3 * h - 1, 3 * e, &g, &g, &dn, Quant::Q4K, &p).is_err());
        assert!(ok(3, 3 * h, 3 * e - 1, &g, &g, &dn, Quant::Q4K, &p).is_err());
        // expert count, top-k
        assert!(ok(3, 3 * h, 3 * e, &g, &g, &dn, Quant::Q4K, &params(8, 4)).is_err());
        assert!(ok(3, 3 * h, 3 * e, &g, &g, &dn, Quant::Q4K, &params(e, 0)).is_err());
        assert!(ok(3, 3 * h, 3 * e, &g, &g, &dn, Quant::Q4K, &params(e, 17)).is_err());
        assert!(ok(
            1,
            h,
            300,
            &[300, ff, h],
            &[300, ff, h],
            &[300, h, ff],
            Quant::Q8_0,
            &params(300, 2)
        )
        .is_err());
        // up differs, down's inner dim differs, 2-D bank
        assert!(ok(3, 3 * h, 3 * e, &g, &[e, ff + 32, h], &dn, Quant::Q4K, &p).is_err());
        assert!(ok(3, 3 * h, 3 * e, &g, &g, &[e, h, ff + 32], Quant::Q4K, &p).is_err());
        assert!(ok(3, 3 * h, 3 * e, &[e * ff, h], &g, &dn, Quant::Q4K, &p).is_err());
        // Q4_K needs rows of whole 256-blocks: ff = 288 is not
        let g2 = [e, 288, h];
        let d2 = [e, h, 288];
        assert!(ok(3, 3 * h, 3 * e, &g2, &g2, &d2, Quant::Q4K, &p).is_err());
        assert!(ok(3, 3 * h, 3 * e, &g2, &g2, &d2, Quant::Q8_0, &p).is_ok());
        // no tokens is fine
        assert!(ok(0, 0, 0, &g, &g, &dn, Quant::Q4K, &p).is_ok());
    }
}
