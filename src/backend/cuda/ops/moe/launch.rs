//! Typed launches of the mixture-of-experts kernels (`moe_route`, `moe_gemv`, `moe_combine`) and
//! the two generic kernels the MoE step also needs (`quantize_q8`, the GLU), all taking
//! [`DevPtr`] arguments. Every launch is validated first by a pure host function (unit-tested
//! without a GPU): shapes against buffer lengths, values against the kernels' limits; errors,
//! never panics.

use crate::kernels::Entry;
use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::{drv, CudaError};
use crate::backend::cuda::runtime::kern::weight_block;
use crate::backend::cuda::CudaDevice;
use crate::kernels::{KernelSpec, Op, Quant};

/// Most experts `moe_route` handles (8 router values per lane of a warp).
pub const MOE_MAX_EXPERTS: usize = 256;
/// Most selected experts per token `moe_route` handles.
pub const MOE_MAX_TOP_K: usize = 16;
/// CUDA's limit on `gridDim.y`: `moe_gemv` launches at most this many pairs at a time.
const MAX_GRID_Y: usize = 65_535;

fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

fn int(op: &'static str, what: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| invalid(op, format!("{what} = {v} exceeds i32")))
}

fn expect_op(spec: &KernelSpec, ops: &[Op], name: &'static str) -> Result<(), CudaError> {
    if ops.contains(&spec.key.op) {
        Ok(())
    } else {
        Err(invalid(
            name,
            format!("instance {} is not a {name} kernel", spec.name),
        ))
    }
}

fn grid_1d(op: &'static str, blocks: usize) -> Result<u32, CudaError> {
    u32::try_from(blocks.max(1)).map_err(|_| invalid(op, format!("{blocks} blocks")))
}

/// Validate a routing launch: `logits` `[n, e]`, `ids` / `wts` `[n, top_k]`.
pub fn check_route(
    n: usize,
    e: usize,
    top_k: usize,
    logits: usize,
    ids: usize,
    wts: usize,
) -> Result<(), CudaError> {
    const OP: &str = "moe_route";
    if e == 0 || e > MOE_MAX_EXPERTS || top_k == 0 || top_k > e || top_k > MOE_MAX_TOP_K {
        return Err(invalid(
            OP,
            format!("{e} experts, top-{top_k} (1..={MOE_MAX_EXPERTS} experts, top-k 1..={MOE_MAX_TOP_K} and <= experts)"),
        ));
    }
    let need = n
        .checked_mul(e)
        .ok_or_else(|| invalid(OP, "n * e overflows".into()))?;
    let pairs = n * top_k;
    if logits < need || ids < pairs || wts < pairs {
        return Err(invalid(
            OP,
            format!(
                "logits {logits} / ids {ids} / wts {wts} for {n} tokens x {e} experts, top-{top_k}"
            ),
        ));
    }
    Ok(())
}

/// Validate an `__order` launch: `ids`, `perm` `[pairs]`, `e` experts.
pub fn check_order(pairs: usize, e: usize, ids: usize, perm: usize) -> Result<(), CudaError> {
    if e == 0 || e > MOE_MAX_EXPERTS || ids < pairs || perm < pairs {
        return Err(invalid(
            "moe_order",
            format!("{pairs} pairs, {e} experts: ids {ids} / perm {perm}"),
        ));
    }
    int("moe_order", "pairs", pairs)?;
    Ok(())
}

/// One grouped expert GEMV launch (see `kernel-templates/ops/moe_gemv.cu.tera`).
#[derive(Debug, Clone, Copy)]
pub struct MoeGemvArgs<'a> {
    /// One or two (bank, output) pairs of the same format and shape: each bank holds
    /// `n_experts` matrices `[n, k]` back to back from its start; each output holds row `p`
    /// (`n` values) at `p * ldy`.
    pub mats: &'a [(DevPtr<u8>, DevPtr<f32>)],
    pub n_experts: usize,
    /// Expert id per pair (`pairs` values).
    pub ids: DevPtr<i32>,
    /// Launch order of the pairs (`pairs` values, a permutation from [`CudaDevice::moe_order`]),
    /// or null for `0..pairs`. Results do not depend on it; L2 reuse of the weights does.
    pub perm: DevPtr<i32>,
    pub pairs: usize,
    /// Float formats: f32 activations, rows of `k`.
    pub x: DevPtr<f32>,
    /// Block formats: int8 activations (rows of `k`) and {d, d*sum} per 32 (two floats).
    pub xq: DevPtr<i8>,
    pub xds: DevPtr<f32>,
    /// Pair `p` reads activation row `p / x_div` (`top_k`: the token's; 1: its own).
    pub x_div: usize,
    pub n: usize,
    pub k: usize,
    pub ldy: usize,
}

/// Bytes of one `[n, k]` expert matrix of `q` (validates `k` against the block size).
pub fn expert_bytes(op: &'static str, q: Quant, n: usize, k: usize) -> Result<usize, CudaError> {
    let (be, bb) = weight_block(q).ok_or_else(|| invalid(op, format!("no {op} for {q}")))?;
    if n == 0 || k == 0 || k % be != 0 || (be > 1 && k % 32 != 0) {
        return Err(invalid(op, format!("n={n} k={k} for {q}")));
    }
    n.checked_mul(k / be)
        .and_then(|v| v.checked_mul(bb))
        .ok_or_else(|| invalid(op, format!("{n} x {k} overflows")))
}

/// Validate a `moe_gemv` launch of format `q`; returns the bytes of one expert matrix.
pub fn check_moe_gemv(q: Quant, a: &MoeGemvArgs<'_>) -> Result<usize, CudaError> {
    const OP: &str = "moe_gemv";
    let eb = expert_bytes(OP, q, a.n, a.k)?;
    let block_fmt = weight_block(q).is_some_and(|(be, _)| be > 1);
    if a.mats.is_empty() || a.mats.len() > 2 {
        return Err(invalid(OP, format!("{} matrices (1 or 2)", a.mats.len())));
    }
    if a.pairs == 0 || a.x_div == 0 || a.n_experts == 0 || a.ldy < a.n {
        return Err(invalid(
            OP,
            format!(
                "pairs={} x_div={} experts={} ldy={} n={}",
                a.pairs, a.x_div, a.n_experts, a.ldy, a.n
            ),
        ));
    }
    let bank = eb
        .checked_mul(a.n_experts)
        .ok_or_else(|| invalid(OP, "bank size overflows".into()))?;
    let y_need = (a.pairs - 1)
        .checked_mul(a.ldy)
        .and_then(|v| v.checked_add(a.n))
        .ok_or_else(|| invalid(OP, "output size overflows".into()))?;
    for (i, (w, y)) in a.mats.iter().enumerate() {
        if w.len() < bank || y.len() < y_need {
            return Err(invalid(
                OP,
                format!(
                    "matrix {i}: bank {} bytes (need {bank}), output {} (need {y_need})",
                    w.len(),
                    y.len()
                ),
            ));
        }
        if w.raw() % 16 != 0 {
            return Err(invalid(OP, format!("bank {i} is not 16-byte aligned")));
        }
    }
    let rows = (a.pairs - 1) / a.x_div + 1;
    let vals = rows * a.k;
    let ok = if block_fmt {
        a.xq.len() >= vals && a.xds.len() >= vals / 16 && a.xq.raw() % 16 == 0
    } else {
        a.x.len() >= vals && a.x.raw() % 16 == 0
    };
    if !ok || a.ids.len() < a.pairs || (a.perm.raw() != 0 && a.perm.len() < a.pairs) {
        return Err(invalid(
            OP,
            format!(
                "activations for {rows} rows of {} / ids {} / perm {} for {} pairs (aligned to 16 bytes)",
                a.k,
                a.ids.len(),
                a.perm.len(),
                a.pairs
            ),
        ));
    }
    int(OP, "pairs", a.pairs)?;
    int(OP, "n", a.n)?;
    int(OP, "k", a.k)?;
    int(OP, "experts", a.n_experts)?;
    Ok(eb)
}

/// Validate a `moe_combine` launch: `d` `[n * top_k, cols]`, `wts` `[n, top_k]`, `out`
/// `[n, cols]`.
pub fn check_combine(
    n: usize,
    cols: usize,
    top_k: usize,
    d: usize,
    wts: usize,
    out: usize,
) -> Result<(), CudaError> {
    const OP: &str = "moe_combine";
    let nc = n
        .checked_mul(cols)
        .ok_or_else(|| invalid(OP, "n * cols overflows".into()))?;
    let (dn, wn) = match (nc.checked_mul(top_k), n.checked_mul(top_k)) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err(invalid(OP, "n * cols * top_k overflows".into())),
    };
    if cols == 0 || top_k == 0 || d < dn || wts < wn || out < nc {
        return Err(invalid(
            OP,
            format!("d {d} / wts {wts} / out {out} for {n} x {cols}, top-{top_k}"),
        ));
    }
    int(OP, "n * cols", nc)?;
    Ok(())
}

impl CudaDevice {
    /// Route `n` tokens: `ids`, `wts` `[n, top_k]` from `logits` `[n, e]` (see `moe_route`).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_route(
        &self,
        spec: &'static KernelSpec,
        logits: DevPtr<f32>,
        ids: DevPtr<i32>,
        wts: DevPtr<f32>,
        n: usize,
        e: usize,
        top_k: usize,
        norm_topk: bool,
    ) -> Result<(), CudaError> {
        const OP: &str = "moe_route";
        expect_op(spec, &[Op::MoeRoute], OP)?;
        check_route(n, e, top_k, logits.len(), ids.len(), wts.len())?;
        if n == 0 {
            return Ok(());
        }
        let (ni, ei, ki, norm) = (int(OP, "n", n)?, e as i32, top_k as i32, norm_topk as i32);
        let (lp, ip, wp) = (logits.raw(), ids.raw(), wts.raw());
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(4).min(65_535) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&lp)
            .arg(&ip)
            .arg(&wp)
            .arg(&ni)
            .arg(&ei)
            .arg(&ki)
            .arg(&norm);
        // SAFETY: matches (const float* logits, int* ids, float* wts, int n, int E, int top_k,
        // int norm), 128 threads; logits hold n*E floats, ids/wts n*top_k values (checked).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// Grouped expert GEMV (see [`MoeGemvArgs`]); `spec` a `moe_gemv` instance of the banks'
    /// format.
    pub fn moe_gemv(
        &self,
        spec: &'static KernelSpec,
        a: &MoeGemvArgs<'_>,
    ) -> Result<(), CudaError> {
        const OP: &str = "moe_gemv";
        expect_op(spec, &[Op::MoeGemv], OP)?;
        let eb = check_moe_gemv(spec.key.quant, a)? as i64;
        let (w0, y0) = a.mats[0];
        let (w1, y1) = *a.mats.last().unwrap_or(&a.mats[0]);
        let (w0, w1, y0, y1) = (w0.raw(), w1.raw(), y0.raw(), y1.raw());
        let (ids, perm) = (a.ids.raw(), a.perm.raw());
        let (x, xq, xds) = (a.x.raw(), a.xq.raw(), a.xds.raw());
        let (ne, n, k, xdiv) = (
            a.n_experts as i32,
            a.n as i32,
            a.k as i32,
            int(OP, "x_div", a.x_div)?,
        );
        let ldy = a.ldy as i64;
        let f = self.function(spec)?;
        let gx = grid_1d(OP, a.n.div_ceil(4))?;
        let mut p0 = 0usize;
        while p0 < a.pairs {
            let cnt = (a.pairs - p0).min(MAX_GRID_Y);
            let pair0 = p0 as i32;
            let cfg = LaunchConfig {
                grid_dim: (gx, cnt as u32, a.mats.len() as u32),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream().launch_builder(&f);
            b.arg(&w0)
                .arg(&w1)
                .arg(&eb)
                .arg(&ne)
                .arg(&ids)
                .arg(&perm)
                .arg(&x)
                .arg(&xq)
                .arg(&xds)
                .arg(&y0)
                .arg(&y1)
                .arg(&ldy)
                .arg(&n)
                .arg(&k)
                .arg(&pair0)
                .arg(&xdiv);
            // SAFETY: matches (const u8* w0, const u8* w1, long long expert_bytes, int n_experts,
            // const int* ids, const int* perm, const float* x, const i8* xq, const float2* xds, float* y0,
            // float* y1, long long ldy, int n, int k, int pair0, int x_div), 128 threads,
            // gridDim.z = number of matrices; banks, outputs, ids and activations were checked
            // to hold what pairs pair0..pair0+cnt read and write (perm, when given, holds a
            // permutation of 0..pairs by its contract); expert ids out of range are caught by
            // the kernel.
            unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
            p0 += cnt;
        }
        Ok(())
    }

    /// `perm` = the pairs `0..pairs` ordered by their expert in `ids` (the `__order` kernel of
    /// the `moe_route` instance `spec`), for [`MoeGemvArgs::perm`].
    pub fn moe_order(
        &self,
        spec: &'static KernelSpec,
        ids: DevPtr<i32>,
        perm: DevPtr<i32>,
        pairs: usize,
        e: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "moe_order";
        expect_op(spec, &[Op::MoeRoute], OP)?;
        check_order(pairs, e, ids.len(), perm.len())?;
        if pairs == 0 {
            return Ok(());
        }
        let (pi, ei) = (int(OP, "pairs", pairs)?, e as i32);
        let (ip, pp) = (ids.raw(), perm.raw());
        let f = self.function_entry(spec, Entry::Order)?;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&ip).arg(&pp).arg(&pi).arg(&ei);
        // SAFETY: matches (const int* ids, int* perm, int pairs, int E), one block of 1024
        // threads; ids and perm hold `pairs` values, E <= MOE_MAX_EXPERTS (checked).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}__order", spec.name)))?;
        Ok(())
    }

    /// `out[t] = sum_j wts[t][j] * d[t * top_k + j]` over rows of `cols` (see `moe_combine`).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        &self,
        spec: &'static KernelSpec,
        d: DevPtr<f32>,
        wts: DevPtr<f32>,
        out: DevPtr<f32>,
        n: usize,
        cols: usize,
        top_k: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "moe_combine";
        expect_op(spec, &[Op::MoeCombine], OP)?;
        check_combine(n, cols, top_k, d.len(), wts.len(), out.len())?;
        if n == 0 {
            return Ok(());
        }
        let (ni, ci, ki) = (n as i32, cols as i32, int(OP, "top_k", top_k)?);
        let (dp, wp, op) = (d.raw(), wts.raw(), out.raw());
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: (grid_1d(OP, (n * cols).div_ceil(256))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&dp).arg(&wp).arg(&op).arg(&ni).arg(&ci).arg(&ki);
        // SAFETY: matches (const float* d, const float* wts, float* out, int n, int cols,
        // int top_k), 256 threads, one thread per output; sizes checked above.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// `quantize_q8` over `len` values of `x` (a multiple of 32) into `xq` (len) and `xds`
    /// (`len / 16` floats).
    pub(crate) fn moe_quantize_q8(
        &self,
        spec: &'static KernelSpec,
        x: DevPtr<f32>,
        len: usize,
        xq: DevPtr<i8>,
        xds: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "quantize_q8";
        expect_op(spec, &[Op::QuantizeQ8], OP)?;
        if len == 0 || len % 32 != 0 || x.len() < len || xq.len() < len || xds.len() < len / 16 {
            return Err(invalid(
                OP,
                format!(
                    "{len} values: x {} / xq {} / xds {}",
                    x.len(),
                    xq.len(),
                    xds.len()
                ),
            ));
        }
        let groups = int(OP, "groups", len / 32)?;
        let (xp, qp, dp) = (x.raw(), xq.raw(), xds.raw());
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: ((len / 32).div_ceil(8).min(65_535) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&xp).arg(&qp).arg(&dp).arg(&groups);
        // SAFETY: matches (const float* x, i8* xq, float2* xds, int n_groups); x and xq hold
        // len values, xds len/16 floats (checked); warps stride over groups.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// GLU over `rows x cols` with row strides (gate, up, out), DevPtr form of `glu`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_glu(
        &self,
        spec: &'static KernelSpec,
        gate: DevPtr<f32>,
        up: DevPtr<f32>,
        out: DevPtr<f32>,
        rows: usize,
        cols: usize,
        strides: (usize, usize, usize),
    ) -> Result<(), CudaError> {
        const OP: &str = "glu";
        expect_op(spec, &[Op::Geglu, Op::Swiglu], OP)?;
        let (gs, us, os) = strides;
        let span = |s: usize| if rows == 0 { 0 } else { (rows - 1) * s + cols };
        if cols == 0
            || gs < cols
            || us < cols
            || os < cols
            || gate.len() < span(gs)
            || up.len() < span(us)
            || out.len() < span(os)
        {
            return Err(invalid(
                OP,
                format!("buffers too small for {rows}x{cols} with strides {strides:?}"),
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        let threads = spec.param_u32("threads").unwrap_or(256);
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: (grid_1d(OP, (rows * cols).div_ceil(threads as usize))?, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ri, ci) = (int(OP, "rows", rows)?, int(OP, "cols", cols)?);
        let (gp, upp, op) = (gate.raw(), up.raw(), out.raw());
        let st = [gs as i64, us as i64, os as i64];
        let mut b = self.stream().launch_builder(&f);
        b.arg(&gp).arg(&upp).arg(&op).arg(&ri).arg(&ci);
        for s in &st {
            b.arg(s);
        }
        // SAFETY: matches (const float* gate, const float* up, float* out, int rows, int cols,
        // long long gate_stride, up_stride, out_stride); every operand covers
        // (rows-1)*stride+cols floats (checked).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }
}

/// The sizes of one MoE call, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeDims {
    pub n: usize,
    pub experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    pub ff: usize,
    pub out: usize,
}

impl MoeDims {
    pub fn pairs(&self) -> usize {
        self.n * self.top_k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p<T>(addr: u64, len: usize) -> DevPtr<T> {
        // SAFETY: never dereferenced (validation only).
        unsafe { DevPtr::from_raw(addr, len) }
    }

    #[test]
    fn route_limits() {
        assert!(check_route(3, 16, 4, 48, 12, 12).is_ok());
        assert!(check_route(0, 16, 4, 0, 0, 0).is_ok());
        assert!(check_route(3, 16, 4, 47, 12, 12).is_err());
        assert!(check_route(3, 16, 4, 48, 11, 12).is_err());
        assert!(check_route(1, 16, 17, 16, 17, 17).is_err());
        assert!(check_route(1, 257, 2, 257, 2, 2).is_err());
        assert!(check_route(1, 256, 16, 256, 16, 16).is_ok());
        assert!(check_route(1, 4, 0, 4, 0, 0).is_err());
        assert!(check_route(1, 0, 0, 0, 0, 0).is_err());
        assert!(check_route(usize::MAX, 2, 1, 0, 0, 0).is_err());
    }

    #[test]
    fn expert_sizes() {
        assert_eq!(
            expert_bytes("t", Quant::Q4K, 768, 2048).unwrap(),
            768 * 8 * 144
        );
        assert_eq!(expert_bytes("t", Quant::Q8_0, 10, 64).unwrap(), 10 * 2 * 34);
        assert_eq!(expert_bytes("t", Quant::Bf16, 3, 5).unwrap(), 30);
        assert!(expert_bytes("t", Quant::Q4K, 8, 96).is_err());
        assert!(expert_bytes("t", Quant::Q8_0, 0, 64).is_err());
        assert!(expert_bytes("t", Quant::NvFp4, 8, 64).is_err());
    }

    #[test]
    fn gemv_validation() {
        let (e, n, k, pairs, top_k) = (4usize, 64usize, 256usize, 6usize, 2usize);
        let eb = n * (k / 256) * 144;
        let bank = p::<u8>(0x1000, e * eb);
        let y = p::<f32>(0x100000, pairs * 2 * n);
        let y_up = y.slice(n, pairs * 2 * n - n).unwrap();
        let mats = [(bank, y), (bank, y_up)];
        let ok = MoeGemvArgs {
            mats: &mats,
            n_experts: e,
            ids: p(0x200000, pairs),
            perm: DevPtr::null(),
            pairs,
            x: DevPtr::null(),
            xq: p(0x300000, 3 * k),
            xds: p(0x400000, 3 * k / 16),
            x_div: top_k,
            n,
            k,
            ldy: 2 * n,
        };
        assert_eq!(check_moe_gemv(Quant::Q4K, &ok).unwrap(), eb);
        let with_perm = MoeGemvArgs {
            perm: p(0x600000, pairs),
            ..ok
        };
        assert!(check_moe_gemv(Quant::Q4K, &with_perm).is_ok());
        let short_perm = MoeGemvArgs {
            perm: p(0x600000, pairs - 1),
            ..ok
        };
        assert!(check_moe_gemv(Quant::Q4K, &short_perm).is_err());
        // activations for 3 tokens are needed (pairs 0..6 / top_k 2)
        let short = MoeGemvArgs {
            xq: p(0x300000, 2 * k),
            ..ok
        };
        assert!(check_moe_gemv(Quant::Q4K, &short).is_err());
        // the down projection reads one row per pair
        assert!(check_moe_gemv(Quant::Q4K, &MoeGemvArgs { x_div: 1, ..ok }).is_err());
        // bank one byte short
        let mats_short = [(p::<u8>(0x1000, e * eb - 1), y)];
        assert!(check_moe_gemv(
            Quant::Q4K,
            &MoeGemvArgs {
                mats: &mats_short,
                ..ok
            }
        )
        .is_err());
        // output rows overlap (ldy < n) or too short
        assert!(check_moe_gemv(Quant::Q4K, &MoeGemvArgs { ldy: n - 1, ..ok }).is_err());
        let mats_y = [(bank, p::<f32>(0x100000, (pairs - 1) * 2 * n + n - 1))];
        assert!(check_moe_gemv(
            Quant::Q4K,
            &MoeGemvArgs {
                mats: &mats_y,
                ..ok
            }
        )
        .is_err());
        // unaligned bank, no matrices, three matrices, zero pairs
        let mats_u = [(p::<u8>(0x1001, e * eb), y)];
        assert!(check_moe_gemv(
            Quant::Q4K,
            &MoeGemvArgs {
                mats: &mats_u,
                ..ok
            }
        )
        .is_err());
        assert!(check_moe_gemv(Quant::Q4K, &MoeGemvArgs { mats: &[], ..ok }).is_err());
        let three = [(bank, y), (bank, y), (bank, y)];
        assert!(check_moe_gemv(Quant::Q4K, &MoeGemvArgs { mats: &three, ..ok }).is_err());
        assert!(check_moe_gemv(Quant::Q4K, &MoeGemvArgs { pairs: 0, ..ok }).is_err());
        // float formats read x, not xq
        let fb = p::<u8>(0x1000, e * n * k * 2);
        let fm = [(fb, y)];
        let f = MoeGemvArgs {
            mats: &fm,
            x: p(0x500000, 3 * k),
            xq: DevPtr::null(),
            xds: DevPtr::null(),
            ..ok
        };
        assert!(check_moe_gemv(Quant::F16, &f).is_ok());
        assert!(check_moe_gemv(
            Quant::F16,
            &MoeGemvArgs {
                x: DevPtr::null(),
                ..f
            }
        )
        .is_err());
    }

    #[test]
    fn order_validation() {
        assert!(check_order(32, 128, 32, 32).is_ok());
        assert!(check_order(0, 128, 0, 0).is_ok());
        assert!(check_order(32, 128, 31, 32).is_err());
        assert!(check_order(32, 128, 32, 31).is_err());
        assert!(check_order(32, 257, 32, 32).is_err());
        assert!(check_order(32, 0, 32, 32).is_err());
    }

    #[test]
    fn combine_validation() {
        assert!(check_combine(3, 64, 4, 3 * 4 * 64, 12, 3 * 64).is_ok());
        assert!(check_combine(3, 64, 4, 3 * 4 * 64 - 1, 12, 3 * 64).is_err());
        assert!(check_combine(3, 64, 4, 3 * 4 * 64, 11, 3 * 64).is_err());
        assert!(check_combine(3, 64, 4, 3 * 4 * 64, 12, 3 * 64 - 1).is_err());
        assert!(check_combine(3, 0, 4, 0, 12, 0).is_err());
        assert!(check_combine(usize::MAX, 2, 1, 0, 0, 0).is_err());
    }
}
