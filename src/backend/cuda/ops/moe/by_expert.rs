//! MoE prefill by expert: the routing comes back to the host (one synchronisation), tokens are
//! grouped per expert (ascending token order, experts in index order: the CPU reference's
//! order), and each used expert runs as dense tensor-core GEMMs over its gathered rows (bf16
//! activations, `gemm` instances over the bank's GGUF blocks), scatter-added into the output with
//! the routing weights. Not capturable (host copies): for prompts only.

use crate::kernels::Entry;
use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::launch::expert_bytes;
use super::launch::MoeDims;
use crate::backend::cuda::runtime::buf::{memset, read_ptr, DevBuf, DevPtr, Pool};
use crate::backend::cuda::runtime::error::{drv, CudaError};
use crate::backend::cuda::runtime::kern::weight_block;
use crate::backend::cuda::runtime::types::GpuWeight;
use crate::backend::cuda::CudaDevice;
use crate::backend::Activation;
use crate::kernels::{BatchBucket, HeadDim, KernelSpec, Op, Quant};

fn invalid(detail: String) -> CudaError {
    CudaError::Invalid {
        op: "moe_prefill",
        detail,
    }
}

/// Token rows, their weights, and `E + 1` offsets (see [`group_by_expert`]).
pub type Grouped = (Vec<i32>, Vec<f32>, Vec<usize>);

/// Per expert, the (token, weight) pairs routed to it, tokens ascending: `rows`, `wts` flat and
/// `offs[e]..offs[e + 1]` the range of expert `e`. Ids outside `0..e` are errors.
pub fn group_by_expert(
    ids: &[i32],
    wts: &[f32],
    top_k: usize,
    e: usize,
) -> Result<Grouped, CudaError> {
    if top_k == 0 || ids.len() != wts.len() || ids.len() % top_k != 0 {
        return Err(invalid(format!(
            "{} ids, {} weights, top-{top_k}",
            ids.len(),
            wts.len()
        )));
    }
    let mut per: Vec<Vec<(i32, f32)>> = vec![Vec::new(); e];
    for (p, (&ex, &w)) in ids.iter().zip(wts).enumerate() {
        let ex = usize::try_from(ex)
            .ok()
            .filter(|&v| v < e)
            .ok_or_else(|| invalid(format!("expert id {ex} of pair {p} (of {e})")))?;
        per[ex].push(((p / top_k) as i32, w));
    }
    let mut offs = Vec::with_capacity(e + 1);
    let (mut rows, mut ws) = (Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len()));
    offs.push(0);
    for list in per {
        for (t, w) in list {
            rows.push(t);
            ws.push(w);
        }
        offs.push(rows.len());
    }
    Ok((rows, ws, offs))
}

/// Can the bank run through the tensor-core GEMM: a `gemm` instance for its format, and every
/// expert's start 16-byte aligned (the GEMM's cp.async loads)?
pub fn gemm_ready(q: Quant, rows: usize, cols: usize) -> bool {
    let has = matches!(
        q,
        Quant::Bf16 | Quant::Q8_0 | Quant::Q4_0 | Quant::Q5_0 | Quant::Q4K | Quant::Q6K
    );
    let es = 2; // bf16 activations
    has && (cols * es) % 16 == 0
        && expert_bytes("moe", q, rows, cols).is_ok_and(|b| b % 16 == 0)
        && weight_block(q).is_some()
}

struct Gemm {
    spec: &'static KernelSpec,
    bank: DevPtr<u8>,
    per: usize,
    n: usize,
    k: usize,
}

impl CudaDevice {
    fn combine_fn(&self, suffix: Entry) -> Result<cudarc::driver::CudaFunction, CudaError> {
        let spec = self.resolve(Op::MoeCombine, Quant::F32, HeadDim::Any, BatchBucket::Any)?;
        self.function_entry(spec, suffix)
    }

    /// `out[i] = bf16(x[rows[i]])` (rows null: `x[i]`), `m` rows of `cols`.
    fn gather_bf16(
        &self,
        x: DevPtr<f32>,
        rows: DevPtr<i32>,
        out: DevPtr<u16>,
        m: usize,
        cols: usize,
        x_rows: usize,
    ) -> Result<(), CudaError> {
        if out.len() < m * cols || x.len() < x_rows * cols || (rows.raw() != 0 && rows.len() < m) {
            return Err(invalid(format!("gather of {m} x {cols}")));
        }
        let f = self.combine_fn(Entry::GatherBf16)?;
        let (xp, rp, op, mi, ci) = (x.raw(), rows.raw(), out.raw(), m as i32, cols as i32);
        let cfg = LaunchConfig {
            grid_dim: ((m * cols).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&xp).arg(&rp).arg(&op).arg(&mi).arg(&ci);
        // SAFETY: matches (const float* x, const int* rows, u16* out, int m, int cols); out holds
        // m*cols, rows m token indices < x_rows (grouping checked them), x x_rows*cols.
        unsafe { b.launch(cfg) }.map_err(drv("launching moe gather_bf16"))?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn scatter(
        &self,
        d: DevPtr<f32>,
        rows: DevPtr<i32>,
        w: DevPtr<f32>,
        out: DevPtr<f32>,
        m: usize,
        cols: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        if d.len() < m * cols || rows.len() < m || w.len() < m || out.len() < n * cols {
            return Err(invalid(format!("scatter of {m} x {cols}")));
        }
        let f = self.combine_fn(Entry::Scatter)?;
        let (dp, rp, wp, op, mi, ci) = (
            d.raw(),
            rows.raw(),
            w.raw(),
            out.raw(),
            m as i32,
            cols as i32,
        );
        let cfg = LaunchConfig {
            grid_dim: ((m * cols).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&dp).arg(&rp).arg(&wp).arg(&op).arg(&mi).arg(&ci);
        // SAFETY: matches (const float* d, const int* rows, const float* w, float* out, int m,
        // int cols); rows are distinct tokens < n within one expert (grouping), sizes checked.
        unsafe { b.launch(cfg) }.map_err(drv("launching moe scatter"))?;
        Ok(())
    }

    /// `c[m][g.n] = a[m][g.k] (bf16) . W_e^T` through the bank's `gemm` instance.
    fn expert_gemm(
        &self,
        g: &Gemm,
        e: usize,
        a: DevPtr<u16>,
        c: DevPtr<f32>,
        m: usize,
    ) -> Result<(), CudaError> {
        let w = g
            .bank
            .slice(e * g.per, g.per)
            .ok_or_else(|| invalid(format!("expert {e} outside its bank")))?;
        if a.len() < m * g.k || c.len() < m * g.n {
            return Err(invalid(format!("gemm {m} x {} x {}", g.n, g.k)));
        }
        let tile = g.spec.param_u32("tile").unwrap_or(64) as usize;
        let (mi, ni, ki, kb) = (m as i32, g.n as i32, g.k as i32, g.k.div_ceil(128) as i32);
        let (ap, wp, cp, null) = (a.raw(), w.raw(), c.raw(), 0u64);
        let f = self.function(g.spec)?;
        let cfg = LaunchConfig {
            grid_dim: (g.n.div_ceil(tile) as u32, m.div_ceil(tile) as u32, 1),
            block_dim: ((64 * tile / 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&ap)
            .arg(&wp)
            .arg(&cp)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki)
            .arg(&null)
            .arg(&null)
            .arg(&kb);
        // SAFETY: matches (const u8* A, const u8* W, float* C, int M, int N, int K,
        // const float* w_scale, const float* a_scale, int ws_cols) of a non-fp8 instance (scales
        // unused); A holds m*k bf16, W one expert (n rows of k in its format, 16-byte aligned:
        // gemm_ready), C m*n floats.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", g.spec.name)))?;
        Ok(())
    }

    /// The by-expert prefill (see the module docs); `ids`, `wts` from `moe_route`. The caller
    /// checked [`gemm_ready`] for the three banks.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_prefill_gemm(
        &self,
        pool: &Arc<Pool>,
        x: DevPtr<f32>,
        d: &MoeDims,
        ids: DevPtr<i32>,
        wts: DevPtr<f32>,
        banks: [&GpuWeight; 3],
        act: Activation,
    ) -> Result<DevBuf, CudaError> {
        let (n, e, k, pairs) = (d.n, d.experts, d.top_k, d.pairs());
        let hid = read_ptr(self.stream(), ids, pairs)?;
        let hw = read_ptr(self.stream(), wts, pairs)?;
        let (rows, ws, offs) = group_by_expert(&hid, &hw, k, e)?;
        let max_m = offs.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let alloc = |bytes: usize| pool.alloc(bytes.max(4));
        let rb = pool.upload(&rows)?;
        let wb = pool.upload(&ws)?;
        let (rows_p, ws_p) = (rb.ptr::<i32>(), wb.ptr::<f32>());
        let out_b = alloc(n * d.out * 4)?;
        let out = out_b
            .f32()
            .slice(0, n * d.out)
            .ok_or_else(|| invalid("output".into()))?;
        memset(self.stream(), out, 0)?;
        let gemm_of = |w: &GpuWeight, rows: usize, cols: usize| -> Result<Gemm, CudaError> {
            let per = expert_bytes("moe", w.quant, rows, cols)?;
            Ok(Gemm {
                spec: self.resolve(Op::Gemm, w.quant, HeadDim::Any, BatchBucket::Any)?,
                bank: w
                    .data
                    .u8()
                    .slice(0, per * e)
                    .ok_or_else(|| invalid("bank shorter than its shape".into()))?,
                per,
                n: rows,
                k: cols,
            })
        };
        let [gate, up, down] = banks;
        let (gg, gu, gd) = (
            gemm_of(gate, d.ff, d.hidden)?,
            gemm_of(up, d.ff, d.hidden)?,
            gemm_of(down, d.out, d.ff)?,
        );
        let xb_b = alloc(max_m * d.hidden * 2)?;
        let g_b = alloc(max_m * d.ff * 4)?;
        let u_b = alloc(max_m * d.ff * 4)?;
        let h_b = alloc(max_m * d.ff * 4)?;
        let hb_b = alloc(max_m * d.ff * 2)?;
        let dd_b = alloc(max_m * d.out * 4)?;
        let (xb, g, u, h, hb, dd) = (
            xb_b.ptr::<u16>(),
            g_b.f32(),
            u_b.f32(),
            h_b.f32(),
            hb_b.ptr::<u16>(),
            dd_b.f32(),
        );
        let glu = self.glu_spec(act)?;
        for ex in 0..e {
            let (o, m) = (offs[ex], offs[ex + 1] - offs[ex]);
            if m == 0 {
                continue;
            }
            let r = rows_p.slice(o, m).ok_or_else(|| invalid("rows".into()))?;
            let w = ws_p.slice(o, m).ok_or_else(|| invalid("weights".into()))?;
            self.gather_bf16(x, r, xb, m, d.hidden, n)?;
            self.expert_gemm(&gg, ex, xb, g, m)?;
            self.expert_gemm(&gu, ex, xb, u, m)?;
            self.moe_glu(glu, g, u, h, m, d.ff, (d.ff, d.ff, d.ff))?;
            self.gather_bf16(h, DevPtr::null(), hb, m, d.ff, m)?;
            self.expert_gemm(&gd, ex, hb, dd, m)?;
            self.scatter(dd, r, w, out, m, d.out, n)?;
        }
        Ok(out_b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_keeps_token_order_per_expert() {
        // 3 tokens, top-2
        let ids = [2, 0, 0, 1, 2, 1];
        let wts = [0.6, 0.4, 0.7, 0.3, 0.5, 0.5];
        let (rows, ws, offs) = group_by_expert(&ids, &wts, 2, 4).unwrap();
        assert_eq!(offs, vec![0, 2, 4, 6, 6]);
        assert_eq!(rows, vec![0, 1, 1, 2, 0, 2]);
        assert_eq!(ws, vec![0.4, 0.7, 0.3, 0.5, 0.6, 0.5]);
        assert!(group_by_expert(&[4, 0], &[0.5, 0.5], 2, 4).is_err());
        assert!(group_by_expert(&[-1, 0], &[0.5, 0.5], 2, 4).is_err());
        assert!(group_by_expert(&[0, 1, 2], &[0.5, 0.5, 0.0], 2, 4).is_err());
        assert!(group_by_expert(&[0, 1], &[0.5], 2, 4).is_err());
    }

    #[test]
    fn gemm_readiness() {
        // Qwen3-30B-A3B: gate/up Q4_K [768, 2048], down Q6_K [2048, 768]
        assert!(gemm_ready(Quant::Q4K, 768, 2048));
        assert!(gemm_ready(Quant::Q6K, 2048, 768));
        // Q6_K experts of 201 rows start off 16-byte alignment
        assert!(!gemm_ready(Quant::Q6K, 201, 256));
        // no f16 / f32 gemm instances
        assert!(!gemm_ready(Quant::F16, 64, 64));
        assert!(!gemm_ready(Quant::F32, 64, 64));
    }
}
