//! Typed launches of the fused MoE decode kernels (`moe_router`, `moe_gate_up`, `moe_down`; the
//! pipeline they make is in `decode.rs`), on [`DevPtr`] arguments. Every launch is validated
//! first by a pure host function (unit-tested without a GPU): shapes against buffer lengths,
//! alignment, values against the kernels' limits; errors, never panics.

use cudarc::driver::LaunchConfig;

use super::launch::{expert_bytes, MOE_MAX_EXPERTS, MOE_MAX_TOP_K};
use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::kern::weight_block;
use crate::backend::cuda::runtime::kern::{expect, grid, int, invalid, Kern};
use crate::backend::cuda::CudaDevice;
use crate::backend::Activation;
use crate::kernels::{KernelSpec, Op, Quant};

/// CUDA's limit on `gridDim.y` (tokens of a router / down launch, pairs of a gate/up launch).
const MAX_GRID_Y: usize = 65_535;

/// Rows of the GLU output per `moe_gate_up` block (one int8 side-car group).
pub const GATE_UP_ROWS: usize = 32;

/// One `moe_router` launch: the router GEMV of `n` tokens and their routing.
#[derive(Debug, Clone, Copy)]
pub struct MoeRouterArgs {
    /// The router matrix `[e, k]` in the instance's format.
    pub w: DevPtr<u8>,
    /// Float formats: the f32 activations `[n, k]`.
    pub x: DevPtr<f32>,
    /// Q8_0: the activations' int8 side-car (`n * k` int8, `n * k / 16` floats).
    pub xq: DevPtr<i8>,
    pub xds: DevPtr<f32>,
    /// Out: the router logits `[n, e]`, expert ids and weights `[n, top_k]`.
    pub logits: DevPtr<f32>,
    pub ids: DevPtr<i32>,
    pub wts: DevPtr<f32>,
    /// One arrival counter per token, zero before the launch (and after it).
    pub counters: DevPtr<u32>,
    pub n: usize,
    pub e: usize,
    pub k: usize,
    pub top_k: usize,
    pub norm: bool,
}

/// Validate a `moe_router` launch of router format `q`.
pub fn check_router(q: Quant, a: &MoeRouterArgs) -> Result<(), CudaError> {
    const OP: &str = "moe_router";
    let (e, k, n) = (a.e, a.k, a.n);
    if e == 0 || e > MOE_MAX_EXPERTS || a.top_k == 0 || a.top_k > e || a.top_k > MOE_MAX_TOP_K {
        return Err(invalid(
            OP,
            format!(
                "{e} experts, top-{} (1..={MOE_MAX_EXPERTS} experts, top-k 1..={MOE_MAX_TOP_K} and <= experts)",
                a.top_k
            ),
        ));
    }
    if n == 0 || n > MAX_GRID_Y || k == 0 {
        return Err(invalid(OP, format!("{n} tokens of {k}")));
    }
    let (be, bb) = weight_block(q).ok_or_else(|| invalid(OP, format!("no router for {q}")))?;
    let float = matches!(q, Quant::F32 | Quant::F16 | Quant::Bf16);
    let repacked = q == Quant::Q8_0R;
    if !float && q != Quant::Q8_0 && !repacked {
        return Err(invalid(OP, format!("no router for {q}")));
    }
    if k % be != 0 || (float && (k * bb) % 16 != 0) || (repacked && k % 256 != 0) {
        return Err(invalid(
            OP,
            format!("{k} inputs per row of {q} (float rows must be whole 16-byte vectors)"),
        ));
    }
    let w_need = (k / be)
        .checked_mul(bb)
        .and_then(|r| r.checked_mul(e))
        .ok_or_else(|| invalid(OP, "router size overflows".into()))?;
    let nk = n
        .checked_mul(k)
        .ok_or_else(|| invalid(OP, "n * k overflows".into()))?;
    let acts = if float {
        a.x.len() >= nk && a.x.raw() % 16 == 0 && a.w.raw() % 16 == 0
    } else {
        let w_align = if repacked { 16 } else { 2 };
        a.xq.len() >= nk
            && a.xds.len() >= nk / 16
            && a.xq.raw() % 16 == 0
            && a.w.raw() % w_align == 0
    };
    if a.w.len() < w_need
        || !acts
        || a.logits.len() < n * e
        || a.ids.len() < n * a.top_k
        || a.wts.len() < n * a.top_k
        || a.counters.len() < n
    {
        return Err(invalid(
            OP,
            format!(
                "router {} bytes (need {w_need}), activations (aligned, {nk} values), logits {} / ids {} / wts {} / counters {} for {n} tokens x {e} experts, top-{}",
                a.w.len(),
                a.logits.len(),
                a.ids.len(),
                a.wts.len(),
                a.counters.len(),
                a.top_k
            ),
        ));
    }
    int(OP, "n * k", nk)?;
    Ok(())
}

/// The add_rmsnorm a `moe_router__norm` launch does first (one token): `s = a + b` and the
/// int8 side-car of `rms_norm(s) * w'` are written, the router dots the normed row.
#[derive(Debug, Clone, Copy)]
pub struct RouterNorm {
    pub a: DevPtr<f32>,
    pub b: DevPtr<f32>,
    /// Out: the sum (must not overlap `a` or `b`).
    pub s: DevPtr<f32>,
    pub w: crate::backend::cuda::ops::elementwise::launch::NormWeightPtr,
    pub eps: f32,
    /// Out: the side-car of the normed row (`k` int8, `k / 16` floats).
    pub xq: DevPtr<i8>,
    pub xds: DevPtr<f32>,
}

/// Validate a `moe_router__norm` launch: one float-router token, `k % 32 == 0`, the norm's
/// buffers `k` long and aligned, the sum apart from its inputs.
pub fn check_router_norm(q: Quant, a: &MoeRouterArgs, nm: &RouterNorm) -> Result<(), CudaError> {
    const OP: &str = "moe_router__norm";
    if !matches!(q, Quant::F32 | Quant::F16 | Quant::Bf16) || a.n != 1 || a.k % 32 != 0 {
        return Err(invalid(
            OP,
            format!(
                "{} tokens of {} over a {q} router (one token, k % 32 == 0, a float router)",
                a.n, a.k
            ),
        ));
    }
    // the main entry's checks, with `a` standing for x
    check_router(q, &MoeRouterArgs { x: nm.a, ..*a })?;
    let k = a.k;
    let span = |p: DevPtr<f32>| (p.raw(), p.raw() + 4 * k as u64);
    let overlap = |p: DevPtr<f32>, q: DevPtr<f32>| {
        let ((p0, p1), (q0, q1)) = (span(p), span(q));
        p0 < q1 && q0 < p1
    };
    let wlen = match nm.w {
        crate::backend::cuda::ops::elementwise::launch::NormWeightPtr::Plain(w)
        | crate::backend::cuda::ops::elementwise::launch::NormWeightPtr::OnePlus(w) => w.len(),
        crate::backend::cuda::ops::elementwise::launch::NormWeightPtr::None => k,
    };
    if nm.b.len() < k
        || nm.s.len() < k
        || nm.xq.len() < k
        || nm.xds.len() < k / 16
        || wlen != k
        || nm.b.raw() % 16 != 0
        || overlap(nm.s, nm.a)
        || overlap(nm.s, nm.b)
        || !nm.eps.is_finite()
    {
        return Err(invalid(
            OP,
            format!(
                "norm buffers for {k} values: b {} s {} side-car {} / {} weight {wlen} (aligned, the sum apart from its inputs, finite eps)",
                nm.b.len(),
                nm.s.len(),
                nm.xq.len(),
                nm.xds.len()
            ),
        ));
    }
    Ok(())
}

/// One `moe_gate_up` launch over `pairs` (token, slot) pairs.
#[derive(Debug, Clone, Copy)]
pub struct MoeGateUpArgs {
    /// The gate and up banks `[n_experts, ff, k]` (the instance's format, one shape).
    pub gate: DevPtr<u8>,
    pub up: DevPtr<u8>,
    pub n_experts: usize,
    /// Expert id per pair.
    pub ids: DevPtr<i32>,
    pub pairs: usize,
    /// Pair `p` reads activation row `p / x_div` (top_k: its token's).
    pub x_div: usize,
    /// The activations' int8 side-car (rows of `k`).
    pub xq: DevPtr<i8>,
    pub xds: DevPtr<f32>,
    pub k: usize,
    pub ff: usize,
    pub act: Activation,
    /// Out: the GLU output `[pairs, ff]` (optional: null skips it) and its int8 side-car.
    pub h: DevPtr<f32>,
    pub hq: DevPtr<i8>,
    pub hds: DevPtr<f32>,
}

/// Validate a `moe_gate_up` launch of bank format `q`; returns the bytes of one expert matrix.
pub fn check_gate_up(q: Quant, a: &MoeGateUpArgs) -> Result<usize, CudaError> {
    const OP: &str = "moe_gate_up";
    if weight_block(q).is_none_or(|(be, _)| be <= 1) {
        return Err(invalid(OP, format!("{q} is not a block format")));
    }
    let eb = expert_bytes(OP, q, a.ff, a.k)?;
    if a.pairs == 0
        || a.pairs > MAX_GRID_Y
        || a.x_div == 0
        || a.n_experts == 0
        || a.ff % GATE_UP_ROWS != 0
    {
        return Err(invalid(
            OP,
            format!(
                "pairs={} x_div={} experts={} ff={} (ff a multiple of {GATE_UP_ROWS})",
                a.pairs, a.x_div, a.n_experts, a.ff
            ),
        ));
    }
    let bank = eb
        .checked_mul(a.n_experts)
        .ok_or_else(|| invalid(OP, "bank size overflows".into()))?;
    let rows = (a.pairs - 1) / a.x_div + 1;
    let hn = a
        .pairs
        .checked_mul(a.ff)
        .ok_or_else(|| invalid(OP, "pairs * ff overflows".into()))?;
    let banks_ok = [a.gate, a.up]
        .iter()
        .all(|w| w.len() >= bank && w.raw() % 16 == 0);
    let x_ok = a.xq.len() >= rows * a.k && a.xds.len() >= rows * a.k / 16 && a.xq.raw() % 16 == 0;
    let h_ok = (a.h.raw() == 0 || a.h.len() >= hn) && a.hq.len() >= hn && a.hds.len() >= hn / 16;
    if !banks_ok || !x_ok || !h_ok || a.ids.len() < a.pairs {
        return Err(invalid(
            OP,
            format!(
                "banks {} / {} bytes (need {bank}, 16-byte aligned), side-car of {rows} rows of {} (aligned), h {} / hq {} / hds {} for {} pairs of {}, ids {}",
                a.gate.len(),
                a.up.len(),
                a.k,
                a.h.len(),
                a.hq.len(),
                a.hds.len(),
                a.pairs,
                a.ff,
                a.ids.len()
            ),
        ));
    }
    int(OP, "pairs * ff", hn)?;
    int(OP, "rows * k", rows * a.k)?;
    Ok(eb)
}

/// One `moe_down` launch: `n` tokens of `top_k` slots.
#[derive(Debug, Clone, Copy)]
pub struct MoeDownArgs {
    /// The down bank `[n_experts, out, ff]` in the instance's format.
    pub down: DevPtr<u8>,
    pub n_experts: usize,
    /// Expert ids and routing weights `[n, top_k]`.
    pub ids: DevPtr<i32>,
    pub wts: DevPtr<f32>,
    pub n: usize,
    pub top_k: usize,
    /// The GLU outputs' int8 side-car, one row of `ff` per pair (`moe_gate_up`'s).
    pub hq: DevPtr<i8>,
    pub hds: DevPtr<f32>,
    pub ff: usize,
    pub out: usize,
    /// Out: `[n, out]`.
    pub y: DevPtr<f32>,
    /// The ids were final before the previous launch could let this one start (the router's,
    /// read by `moe_gate_up` launched in between): the kernel reads them and requests its
    /// experts' rows into L2 before its programmatic-launch wait. False: all after the wait.
    pub ids_early: bool,
}

/// Validate a `moe_down` launch of bank format `q` on instance `spec` (its `max_top_k`);
/// returns the bytes of one expert matrix.
pub fn check_down(q: Quant, max_top_k: usize, a: &MoeDownArgs) -> Result<usize, CudaError> {
    const OP: &str = "moe_down";
    if weight_block(q).is_none_or(|(be, _)| be <= 1) {
        return Err(invalid(OP, format!("{q} is not a block format")));
    }
    let eb = expert_bytes(OP, q, a.out, a.ff)?;
    if a.n == 0 || a.n > MAX_GRID_Y || a.top_k == 0 || a.top_k > max_top_k || a.n_experts == 0 {
        return Err(invalid(
            OP,
            format!(
                "{} tokens, top-{} (1..={max_top_k}), {} experts",
                a.n, a.top_k, a.n_experts
            ),
        ));
    }
    let bank = eb
        .checked_mul(a.n_experts)
        .ok_or_else(|| invalid(OP, "bank size overflows".into()))?;
    let pairs = a.n * a.top_k;
    let hn = pairs
        .checked_mul(a.ff)
        .ok_or_else(|| invalid(OP, "pairs * ff overflows".into()))?;
    if a.down.len() < bank
        || a.down.raw() % 16 != 0
        || a.ids.len() < pairs
        || a.wts.len() < pairs
        || a.hq.len() < hn
        || a.hds.len() < hn / 16
        || a.hq.raw() % 16 != 0
        || a.y.len() < a.n * a.out
    {
        return Err(invalid(
            OP,
            format!(
                "bank {} bytes (need {bank}, 16-byte aligned), ids {} / wts {} / hq {} / hds {} (aligned) / y {} for {} tokens x top-{} of {} -> {}",
                a.down.len(),
                a.ids.len(),
                a.wts.len(),
                a.hq.len(),
                a.hds.len(),
                a.y.len(),
                a.n,
                a.top_k,
                a.ff,
                a.out
            ),
        ));
    }
    int(OP, "pairs * ff", hn)?;
    int(OP, "n * out", a.n * a.out)?;
    Ok(eb)
}

/// A `u32` template param of `spec` (`default` when absent).
fn param(spec: &KernelSpec, name: &str, default: u32) -> u32 {
    spec.param_u32(name).unwrap_or(default)
}

/// Chunk buffers per warp of a fused gate/up or down instance: `stages` (default `stages`) x
/// `task_rows` (rows per warp task, default 1).
fn buffers(spec: &KernelSpec, stages: u32) -> u32 {
    param(spec, "stages", stages) * param(spec, "task_rows", 1)
}

/// Bytes of one chunk buffer of `lib/moe_dot` for bank format `q` (its `MD_SBYTES`: `MD_CB`
/// blocks of ~1.1 KB, rounded to 16-byte copies with one more for misalignment, + 16 bytes of
/// slack); None for formats without the fused kernels. The kernels trap when given less.
pub fn stage_bytes(q: Quant) -> Option<usize> {
    let (cb, bb): (usize, usize) = match q {
        Quant::Q4_0 => (64, 18),
        Quant::Q5_0 => (48, 22),
        Quant::Q8_0 => (32, 34),
        Quant::Q4K => (8, 144),
        Quant::Q6K => (5, 210),
        _ => return None,
    };
    Some(((cb * bb).div_ceil(16) + 1) * 16 + 16)
}

/// The dynamic shared memory of a `moe_gate_up` / `moe_down` launch of `k` (warps x `bufs`
/// chunk buffers), raised on its function when past the default 48 KiB.
fn stage_smem(k: &Kern, op: &'static str, warps: u32, bufs: u32) -> Result<u32, CudaError> {
    let q = k.spec.key.quant;
    let sb = stage_bytes(q).ok_or_else(|| invalid(op, format!("no stage size for {q}")))?;
    let smem = u32::try_from(warps as usize * bufs as usize * sb)
        .map_err(|_| invalid(op, "shared memory size overflows".into()))?;
    k.f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )
    .map_err(crate::backend::cuda::runtime::error::drv(format!(
        "raising {}'s dynamic shared memory to {smem} bytes",
        k.spec.name
    )))?;
    Ok(smem)
}

/// The routing outputs (logits, ids, weights, counters) and the trailing ints (E, k, top_k,
/// norm) both router entries take.
fn route_args(op: &'static str, a: &MoeRouterArgs) -> Result<([u64; 4], [i32; 4]), CudaError> {
    Ok((
        [a.logits.raw(), a.ids.raw(), a.wts.raw(), a.counters.raw()],
        [
            a.e as i32,
            int(op, "k", a.k)?,
            a.top_k as i32,
            i32::from(a.norm),
        ],
    ))
}

impl CudaDevice {
    /// The router GEMV and the routing of `a.n` tokens in one launch (`moe_router`).
    pub fn moe_router(&self, k: &Kern, a: &MoeRouterArgs) -> Result<(), CudaError> {
        const OP: &str = "moe_router";
        expect(k, &[Op::MoeRouter], OP)?;
        check_router(k.spec.key.quant, a)?;
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, a.e)?, a.n as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let ptrs = [a.w.raw(), a.x.raw(), a.xq.raw(), a.xds.raw()];
        let (outs, ints) = route_args(OP, a)?;
        // (const u8* w, const float* x, const i8* xq, const float2* xds, float* logits, int* ids,
        //  float* wts, u32* counters, int E, int k, int top_k, int norm), 128 threads, grid
        // (E, n); every buffer checked to hold what the launch reads and writes, the counters
        // are zero between launches (each launch's last block resets its token's).
        self.go(
            k,
            cfg,
            &[
                &ptrs[0], &ptrs[1], &ptrs[2], &ptrs[3], &outs[0], &outs[1], &outs[2], &outs[3],
                &ints[0], &ints[1], &ints[2], &ints[3],
            ],
        )
    }

    /// The add_rmsnorm of one token and its router and routing in one launch
    /// (`moe_router__norm`; `k` is that entry of a float-router instance).
    pub fn moe_router_norm(
        &self,
        k: &Kern,
        a: &MoeRouterArgs,
        nm: &RouterNorm,
    ) -> Result<(), CudaError> {
        const OP: &str = "moe_router__norm";
        expect(k, &[Op::MoeRouter], OP)?;
        check_router_norm(k.spec.key.quant, a, nm)?;
        let (mode, wp) =
            crate::backend::cuda::ops::elementwise::add_norm::norm_mode_ptr(OP, nm.w, a.k)?;
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, a.e)?, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let ptrs = [a.w.raw(), nm.a.raw(), nm.b.raw(), wp];
        let norm_outs = [nm.s.raw(), nm.xq.raw(), nm.xds.raw()];
        let (outs, ints) = route_args(OP, a)?;
        // (const u8* w, const float* a, const float* b, const float* nw, int nmode, float eps,
        //  float* s, i8* xq, float2* xds, float* logits, int* ids, float* wts, u32* counters,
        //  int E, int k, int top_k, int norm); one token, checked above
        self.go(
            k,
            cfg,
            &[
                &ptrs[0],
                &ptrs[1],
                &ptrs[2],
                &ptrs[3],
                &mode,
                &nm.eps,
                &norm_outs[0],
                &norm_outs[1],
                &norm_outs[2],
                &outs[0],
                &outs[1],
                &outs[2],
                &outs[3],
                &ints[0],
                &ints[1],
                &ints[2],
                &ints[3],
            ],
        )
    }

    /// Gate and up GEMVs of the routed experts, their GLU and its int8 side-car (`moe_gate_up`).
    pub fn moe_gate_up(&self, k: &Kern, a: &MoeGateUpArgs) -> Result<(), CudaError> {
        const OP: &str = "moe_gate_up";
        expect(k, &[Op::MoeGateUp], OP)?;
        let eb = check_gate_up(k.spec.key.quant, a)? as i64;
        let warps = param(k.spec, "warps", 16);
        // the register-direct form (params.direct = 1) stages nothing
        let smem = if param(k.spec, "direct", 0) == 1 {
            0
        } else {
            stage_smem(k, OP, warps, buffers(k.spec, 4))?
        };
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, a.ff / GATE_UP_ROWS)?, a.pairs as u32, 1),
            block_dim: (warps * 32, 1, 1),
            shared_mem_bytes: smem,
        };
        let ptrs = [
            a.gate.raw(),
            a.up.raw(),
            a.ids.raw(),
            a.xq.raw(),
            a.xds.raw(),
        ];
        let outs = [a.h.raw(), a.hq.raw(), a.hds.raw()];
        let ints = [
            int(OP, "experts", a.n_experts)?,
            int(OP, "k", a.k)?,
            int(OP, "ff", a.ff)?,
            int(OP, "x_div", a.x_div)?,
            match a.act {
                Activation::Silu => 0,
                Activation::GeluTanh => 1,
            },
        ];
        // (const u8* wg, const u8* wu, long long expert_bytes, int n_experts, const int* ids,
        //  const i8* xq, const float2* xds, int k, int ff, int x_div, int act, float* h, i8* hq,
        //  float2* hds), `warps` * 32 threads, grid (ff / 32, pairs), warps * stages chunk
        //  buffers of dynamic shared memory (the kernel traps on less; none for the direct
        //  form); banks, side-cars, ids and
        // outputs checked above; expert ids out of range are caught by the kernel.
        self.go(
            k,
            cfg,
            &[
                &ptrs[0], &ptrs[1], &eb, &ints[0], &ptrs[2], &ptrs[3], &ptrs[4], &ints[1],
                &ints[2], &ints[3], &ints[4], &outs[0], &outs[1], &outs[2],
            ],
        )
    }

    /// Down GEMVs of the routed experts summed with their routing weights (`moe_down`).
    pub fn moe_down(&self, k: &Kern, a: &MoeDownArgs) -> Result<(), CudaError> {
        const OP: &str = "moe_down";
        expect(k, &[Op::MoeDown], OP)?;
        let max_k = param(k.spec, "max_top_k", 16) as usize;
        let eb = check_down(k.spec.key.quant, max_k, a)? as i64;
        let warps = param(k.spec, "warps", 8);
        let rows = param(k.spec, "rows", 8).max(1) as usize;
        // the register-direct form (params.direct = 1) stages nothing
        let smem = if param(k.spec, "direct", 0) == 1 {
            0
        } else {
            stage_smem(k, OP, warps, buffers(k.spec, 8))?
        };
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, a.out.div_ceil(rows))?, a.n as u32, 1),
            block_dim: (warps * 32, 1, 1),
            shared_mem_bytes: smem,
        };
        let ptrs = [
            a.down.raw(),
            a.ids.raw(),
            a.wts.raw(),
            a.hq.raw(),
            a.hds.raw(),
        ];
        let ints = [
            int(OP, "experts", a.n_experts)?,
            a.top_k as i32,
            int(OP, "ff", a.ff)?,
            int(OP, "out", a.out)?,
        ];
        let y = a.y.raw();
        let early = i32::from(a.ids_early);
        // (const u8* wd, long long expert_bytes, int n_experts, const int* ids, const float* wts,
        //  int top_k, const i8* hq, const float2* hds, int ff, int out, float* y,
        //  int ids_early), `warps` * 32
        // threads, grid (ceil(out / rows), n), warps * stages chunk buffers of dynamic shared
        // memory (the kernel traps on less); sizes checked above, top_k <= the instance's
        // max_top_k; expert ids out of range are caught by the kernel.
        self.go(
            k,
            cfg,
            &[
                &ptrs[0], &eb, &ints[0], &ptrs[1], &ptrs[2], &ints[1], &ptrs[3], &ptrs[4],
                &ints[2], &ints[3], &y, &early,
            ],
        )
    }
}

#[cfg(test)]
#[path = "launch_fused_tests.rs"]
mod tests;
