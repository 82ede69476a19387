//! Typed launches of the batch-1 repacked GEMV's `__glu` entry: a fused gate|up GEMV with its
//! GLU and the int8 side-car of the result in one launch, taken only where all of its blocks
//! are resident at once. Shapes are validated against the buffers (errors, never panics).

use crate::kernels::Entry;
use cudarc::driver::LaunchConfig;

use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::kern::{expect, int, invalid};
use crate::backend::cuda::CudaDevice;
use crate::kernels::Op;

/// `FUCINA_GLU_WARPS` (1..=16; read once, for tuning runs): warps per block of the `__glu`
/// entry, run whatever the occupancy.
fn glu_warps_env() -> Option<u32> {
    crate::tuning::get().glu_warps
}

/// Warps per block of the `__glu` entry: 8, each taking 4 of a block's 32 two-row steps (2 of
/// 16 four-row steps at R = 4).
const GLU_WARPS: u32 = 8;

/// Whether a `__glu` launch of `blocks` blocks of [`GLU_WARPS`] warps runs in one wave
/// (`occupancy` blocks per SM, `sms` SMs). Its blocks are few (ff / 32) and long (64 rows
/// each); a second, partial wave costs most of a block's time and leaves no room for the next
/// kernel's early blocks. Measured on the H200 (decode tok/s, prompt 16, against the GEMV +
/// GLU pair): Qwen3-8B Q4_0 (384 blocks, 72 registers, 3 per SM) 8 warps +2.6%, 5-7 or 9
/// warps -1% to +1%; Gemma 4 12B Q4_0 (480 blocks, two waves) -7%, and -3.5% in one wave of
/// a 64-register build; Q4_K (119 registers, 2 per SM, two waves) -4%; Qwen3-8B Q8_0 (q8_0r,
/// 64 registers, 4 per SM) +4.2%. So on the H200 Qwen3-8B's Q4_0 and Q8_0 gate|up take the
/// entry, Gemma 4 12B's (ff 15360) and Q4_K ones do not.
fn glu_one_wave(blocks: u32, sms: u32, occupancy: u32) -> bool {
    occupancy * sms >= blocks
}

/// Blocks per SM of each `__glu` instance at [`GLU_WARPS`] warps, found once.
type GluOccupancy = std::sync::Mutex<std::collections::HashMap<&'static str, u32>>;
static GLU_OCCUPANCY: std::sync::OnceLock<GluOccupancy> = std::sync::OnceLock::new();

/// Pointers of one [`CudaDevice::gemv_glu_ptr`] launch: a fused `[gate; up]` weight of
/// `2 * ff` rows of `k`, the input's int8 side-car, and the outputs (`h` `[ff]` and its
/// side-car).
pub struct GemvGluArgs {
    pub w: DevPtr<u8>,
    pub xq: DevPtr<i8>,
    pub xds: DevPtr<f32>,
    pub h: DevPtr<f32>,
    pub hq: DevPtr<i8>,
    pub hds: DevPtr<f32>,
    pub ff: usize,
    pub k: usize,
    pub act: crate::backend::Activation,
    /// A deferred norm over the input (`__glurs`: xq / xds are its z, each dot scaled by its
    /// rstd), or None (`__glu`).
    pub rs: Option<super::res::RsArgs>,
}

impl CudaDevice {
    /// Warps per block for a `__glu` launch of `blocks` blocks on `sms` SMs: [`GLU_WARPS`] when
    /// they all fit at once (None: run the GEMV and the GLU apart), or `FUCINA_GLU_WARPS`.
    pub fn gemv_glu_warps(
        &self,
        e: &crate::backend::cuda::runtime::kern::KernEntry,
        blocks: u32,
        sms: u32,
    ) -> Option<u32> {
        // __glurs is compiled for blocks of GLU_WARPS warps
        if let Some(w) = glu_warps_env().filter(|_| e.entry() == Entry::Glu) {
            return Some(w);
        }
        let name = e.spec().name;
        let cache = GLU_OCCUPANCY.get_or_init(Default::default);
        let known = cache.lock().ok().and_then(|m| m.get(name).copied());
        let occ = known.unwrap_or_else(|| {
            let o = e
                .kern
                .f
                .occupancy_max_active_blocks_per_multiprocessor(32 * GLU_WARPS, 0, None)
                .unwrap_or(0);
            if let Ok(mut m) = cache.lock() {
                m.insert(name, o);
            }
            o
        });
        glu_one_wave(blocks, sms, occ).then_some(GLU_WARPS)
    }

    /// `h = act(gate x) * up x` and its int8 side-car through the `__glu` entry of a batch-1
    /// repacked GEMV instance (q4_0r / q4_kr): one launch instead of the GEMV and the GLU.
    pub fn gemv_glu_ptr(
        &self,
        e: &crate::backend::cuda::runtime::kern::KernEntry,
        a: &GemvGluArgs,
        sms: u32,
    ) -> Result<(), CudaError> {
        const OP: &str = "gemv_glu";
        let spec = e.spec();
        expect(&e.kern, &[Op::Gemv], OP)?;
        let want = if a.rs.is_some() {
            Entry::Glurs
        } else {
            Entry::Glu
        };
        if e.entry() != want || spec.key.batch.value() != Some(1) {
            return Err(invalid(
                OP,
                format!(
                    "{}__{} is not a batch-1 __{want} entry",
                    spec.name,
                    e.entry()
                ),
            ));
        }
        if let Some(rs) = &a.rs {
            if rs.dim() != a.k {
                return Err(invalid(
                    OP,
                    format!("a deferred norm over {} values for k={}", rs.dim(), a.k),
                ));
            }
        }
        let q = spec.key.quant;
        let (_, split) = crate::quant::repack::source_of(q)
            .ok_or_else(|| invalid(OP, format!("{q} has no __glu entry")))?;
        let (ff, k) = (a.ff, a.k);
        if ff == 0 || ff % 32 != 0 || !split.fits(k) || a.w.raw() % 16 != 0 {
            return Err(invalid(
                OP,
                format!("ff={ff} k={k} for {q}: need ff % 32 == 0, whole 256-element rows, 16-byte aligned weights"),
            ));
        }
        let row = k / split.elems * (split.head + split.body);
        if a.w.len() < 2 * ff * row
            || a.xq.len() < k
            || a.xds.len() < k / 16
            || a.h.len() < ff
            || a.hq.len() < ff
            || a.hds.len() < ff / 16
        {
            return Err(invalid(
                OP,
                format!(
                    "buffers too small for ff={ff} k={k} ({} weight bytes)",
                    a.w.len()
                ),
            ));
        }
        let blocks = (ff / 32) as u32;
        let warps = self
            .gemv_glu_warps(e, blocks, sms)
            .ok_or_else(|| invalid(OP, format!("{blocks} blocks do not fit one wave")))?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (32 * warps, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ff32, k32) = (int(OP, "ff", ff)?, int(OP, "k", k)?);
        let act: i32 = match a.act {
            crate::backend::Activation::Silu => 0,
            crate::backend::Activation::GeluTanh => 1,
        };
        let (wp, qp, dp) = (a.w.raw(), a.xq.raw(), a.xds.raw());
        let (hp, hqp, hdp) = (a.h.raw(), a.hq.raw(), a.hds.raw());
        // (const u8* w, const i8* xq, const float2* xds, float* h, i8* hq, float2* hds, int ff,
        //  int k, int act[, const float* rs_part, int rs_n, float eps]), ff / 32 blocks of 32
        //  `warps` threads; shapes and buffers checked above
        match &a.rs {
            None => self.go(
                &e.kern,
                cfg,
                &[&wp, &qp, &dp, &hp, &hqp, &hdp, &ff32, &k32, &act],
            ),
            Some(rs) => {
                let (pp, n, eps) = (rs.part.raw(), int(OP, "rs_n", rs.part.len())?, rs.eps);
                self.go(
                    &e.kern,
                    cfg,
                    &[
                        &wp, &qp, &dp, &hp, &hqp, &hdp, &ff32, &k32, &act, &pp, &n, &eps,
                    ],
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `__glu` launch only where its ff / 32 blocks fit one wave.
    #[test]
    fn glu_runs_only_in_one_wave() {
        assert!(glu_one_wave(384, 132, 3)); // Qwen3-8B Q4_0
        assert!(!glu_one_wave(480, 132, 3)); // Gemma 4 12B Q4_0
        assert!(!glu_one_wave(384, 132, 2)); // Q4_K
        assert!(!glu_one_wave(1, 132, 0)); // the occupancy query failed
    }
}
