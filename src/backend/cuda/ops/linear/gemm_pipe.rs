//! Typed launches of the prefill GEMM path over bf16 operands: `dequant_bf16` (a weight matrix
//! in its stored format to row-major bf16) and `gemm_pipe` (multi-stage cp.async + mma.sync
//! GEMM, `C f32 [M][ldc] = A bf16 [M][K] . W bf16 [N][K]^T`) with its tile shapes.
//!
//! `gemm_pipe` has one module per arch with four entries (see the template's header); a
//! [`GemmPipe`] holds them loaded, with their dynamic shared memory raised, so a launch does no
//! lookup. [`pick_tile`] chooses the tile by shape (tune it with `examples/gemm_bench.rs`).

use crate::kernels::Entry;
use cudarc::driver::{sys, CudaFunction, LaunchConfig, PushKernelArg};

use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::{drv, CudaError};
use crate::backend::cuda::runtime::kern::{expect, grid, Kern};
use crate::backend::cuda::weight_block;
use crate::backend::cuda::CudaDevice;
use crate::kernels::{BatchBucket, HeadDim, KernelSpec, Op, Quant};

fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

fn int(op: &'static str, what: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| invalid(op, format!("{what} = {v} exceeds i32")))
}

/// K elements per pipeline stage of `gemm_pipe` (BK in the template).
pub const GEMM_PIPE_BK: usize = 32;
/// Groups of 8 elements each `dequant_bf16` thread makes (the template's `UG`).
const DEQUANT_GROUPS_PER_THREAD: usize = 4;
/// K elements per stage and stages of the wgmma entries (WBK, WSTAGES in the template).
const WG_BK: usize = 64;
const WG_STAGES: usize = 4;

/// A tile shape of `gemm_pipe` (one entry of its module each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmTile {
    /// 128 x 128, 4 warps of 64 x 64 (the main entry).
    T128x128W4,
    /// 128 x 128, 8 warps of 64 x 32 (`__w8`).
    T128x128W8,
    /// 128 x 256, 8 warps of 64 x 64 (`__n256`).
    T128x256,
    /// 64 x 128, 4 warps of 32 x 64 (`__m64`), for M <= 64.
    T64x128,
    /// 128 x 128, 8 warps: 2 x 2 of 64 x 64, each k16 step of a K step on its own 4 warps,
    /// partial sums added at the end (`__k2`).
    T128x128K2,
    /// 128 x 128, 2 warpgroups of 64 x 128 on wgmma, BK 64, 4 stages (`__wg`; sm_90a only).
    Wg128x128,
    /// 128 x 256, 2 warpgroups of 64 x 256 on wgmma, BK 64, 4 stages (`__wg256`; sm_90a only).
    Wg128x256,
}

impl GemmTile {
    pub const ALL: [GemmTile; 7] = [
        GemmTile::T128x128W4,
        GemmTile::T128x128W8,
        GemmTile::T128x256,
        GemmTile::T64x128,
        GemmTile::T128x128K2,
        GemmTile::Wg128x128,
        GemmTile::Wg128x256,
    ];

    /// Entry suffix in the module (None: the main entry).
    pub fn suffix(self) -> Option<Entry> {
        match self {
            GemmTile::T128x128W4 => None,
            GemmTile::T128x128W8 => Some(Entry::W8),
            GemmTile::T128x256 => Some(Entry::N256),
            GemmTile::T64x128 => Some(Entry::M64),
            GemmTile::T128x128K2 => Some(Entry::K2),
            GemmTile::Wg128x128 => Some(Entry::Wg),
            GemmTile::Wg128x256 => Some(Entry::Wg256),
        }
    }

    /// Short name (benchmarks, `FUCINA_GEMM_TILE`).
    pub fn name(self) -> &'static str {
        match self {
            GemmTile::T128x128W4 => "128x128w4",
            GemmTile::T128x128W8 => "128x128w8",
            GemmTile::T128x256 => "128x256",
            GemmTile::T64x128 => "64x128",
            GemmTile::T128x128K2 => "128x128k2",
            GemmTile::Wg128x128 => "wg128x128",
            GemmTile::Wg128x256 => "wg128x256",
        }
    }

    pub fn from_name(s: &str) -> Option<GemmTile> {
        GemmTile::ALL.into_iter().find(|t| t.name() == s)
    }

    /// (BM, BN, threads).
    pub fn dims(self) -> (usize, usize, usize) {
        match self {
            GemmTile::T128x128W4 => (128, 128, 128),
            GemmTile::T128x128W8 => (128, 128, 256),
            GemmTile::T128x256 => (128, 256, 256),
            GemmTile::T64x128 => (64, 128, 128),
            GemmTile::T128x128K2 => (128, 128, 256),
            GemmTile::Wg128x128 => (128, 128, 256),
            GemmTile::Wg128x256 => (128, 256, 256),
        }
    }

    fn index(self) -> usize {
        GemmTile::ALL
            .iter()
            .position(|&t| t == self)
            .unwrap_or_default()
    }

    /// Whether the entry is a warpgroup-MMA one (rendered for sm_90a only).
    pub fn wgmma(self) -> bool {
        matches!(self, GemmTile::Wg128x128 | GemmTile::Wg128x256)
    }

    /// Dynamic shared memory of one CTA: `stages` x (BM + BN) rows of BK bf16; the wgmma
    /// entries have their own 4 stages of 64-element rows, plus 1 KB to align them to 1024 bytes.
    pub fn smem_bytes(self, stages: usize) -> usize {
        let (bm, bn, _) = self.dims();
        if self.wgmma() {
            return WG_STAGES * (bm + bn) * WG_BK * 2 + 1024;
        }
        stages * (bm + bn) * GEMM_PIPE_BK * 2
    }
}

/// Relative mma throughput of an SM running `tile` (1.0 = the best). Estimates from the bytes
/// each tile moves per FMA (shared memory, ldmatrix + cp.async: 128x256 0.084, 128x128 w4 and
/// k2 0.094, w8 0.125, 64x128 0.137; L2 -> SM: 0.023, 0.031, 0.031, 0.046) and the warps an SM
/// holds to hide latency (k2: 8 warps in one CTA), not yet measured: tune them from
/// `examples/gemm_bench.rs`.
pub fn tile_efficiency(tile: GemmTile) -> f64 {
    match tile {
        // measured on the H200: TFLOPS of each tile relative to 128x256 where both fill whole
        // waves
        GemmTile::T128x256 => 1.0,
        GemmTile::T128x128W4 => 0.92,
        GemmTile::T128x128W8 => 0.82,
        GemmTile::T64x128 => 0.76,
        GemmTile::T128x128K2 => 0.62,
        // wgmma (sm_90a) against 128x256 mma.sync at M = 4096 (whole waves), same bench:
        // 128x256 1.45-1.56x, 128x128 1.10-1.14x
        GemmTile::Wg128x256 => 1.45,
        GemmTile::Wg128x128 => 1.1,
    }
}

/// Estimated time (arbitrary units) of an `m x n` product with `tile` on `sms`
/// multiprocessors that hold `occupancy` CTAs of it each: whole waves of CTAs, the CTAs of a
/// wave sharing their SM, divided by the tile's efficiency.
pub fn tile_cost(tile: GemmTile, m: usize, n: usize, sms: u32, occupancy: u32) -> f64 {
    let (bm, bn, _) = tile.dims();
    let sms = sms.max(1) as usize;
    let ctas = m.div_ceil(bm) * n.div_ceil(bn);
    // CTAs resident on one SM at a time: what the occupancy allows, no more than the grid fills
    let per_sm = (occupancy.max(1) as usize).min(ctas.div_ceil(sms)).max(1);
    let waves = ctas.div_ceil(sms * per_sm);
    (waves * per_sm * bm * bn) as f64 / tile_efficiency(tile)
}

/// Weight rows per chunk of the prefill path (dequantise a chunk to bf16 scratch, GEMM it):
/// `out` split evenly into as few chunks as keep `rows * k` bf16 within `cap` bytes, each a
/// multiple of 128 rows (chunk offsets keep the C columns and the weight rows aligned); at
/// least 128 rows.
pub fn chunk_rows(out: usize, k: usize, cap: usize) -> usize {
    let per_row = (k * 2).max(1);
    let max_rows = ((cap / per_row) / 128 * 128).max(128);
    let chunks = out.div_ceil(max_rows).max(1);
    let rows = out.div_ceil(chunks).div_ceil(128) * 128;
    rows.min(max_rows).min(out.div_ceil(128) * 128)
}

/// Whether [`GemmPipe::pick`] may choose the wgmma tiles (`FUCINA_GEMM_WGMMA=0` keeps it to
/// the mma.sync ones, for A/B measurements).
fn wgmma_enabled() -> bool {
    crate::tuning::get().gemm_wgmma
}

fn tile_override() -> Option<GemmTile> {
    static T: std::sync::OnceLock<Option<GemmTile>> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        crate::tuning::get()
            .gemm_tile
            .as_deref()
            .and_then(GemmTile::from_name)
    })
}

/// The loaded entries of a `gemm_pipe` instance. A tile whose shared memory does not fit the
/// device (or that cannot be resident) is absent and is never launched.
#[derive(Debug, Clone)]
pub struct GemmPipe {
    pub spec: &'static KernelSpec,
    pub stages: usize,
    /// Multiprocessors of the device.
    pub sms: u32,
    fns: [Option<CudaFunction>; 7],
    /// CTAs of each tile resident per SM (the driver's occupancy calculator).
    occ: [u32; 7],
}

impl GemmPipe {
    /// Whether `tile` can be launched on this device.
    pub fn has(&self, tile: GemmTile) -> bool {
        self.fns[tile.index()].is_some()
    }

    /// CTAs of `tile` resident per SM (0: not launchable).
    pub fn occupancy(&self, tile: GemmTile) -> u32 {
        if self.has(tile) {
            self.occ[tile.index()]
        } else {
            0
        }
    }

    /// The tile for an `m x n` product: `FUCINA_GEMM_TILE=<name>` when set (and launchable),
    /// else the launchable tile of least [`tile_cost`].
    pub fn pick(&self, m: usize, n: usize) -> Option<GemmTile> {
        if let Some(t) = tile_override().filter(|&t| self.has(t)) {
            return Some(t);
        }
        let wg = wgmma_enabled();
        GemmTile::ALL
            .into_iter()
            .filter(|&t| self.has(t) && (wg || !t.wgmma()))
            .min_by(|&a, &b| {
                let ca = tile_cost(a, m, n, self.sms, self.occupancy(a));
                let cb = tile_cost(b, m, n, self.sms, self.occupancy(b));
                ca.total_cmp(&cb)
            })
    }
}

impl CudaDevice {
    /// Load every entry of the `gemm_pipe` instance of this device, each with its dynamic shared
    /// memory limit raised (and the shared-memory carveout preferred, so two 64 KB CTAs share an
    /// SM on sm_90).
    pub fn gemm_pipe_kernels(&self) -> Result<GemmPipe, CudaError> {
        self.gemm_pipe_kernels_of(Quant::Bf16)
    }

    /// [`Self::gemm_pipe_kernels`] over operands of `quant` (bf16 or f16).
    pub fn gemm_pipe_kernels_of(&self, quant: Quant) -> Result<GemmPipe, CudaError> {
        let spec = self.resolve(Op::GemmPipe, quant, HeadDim::Any, BatchBucket::Any)?;
        self.gemm_pipe_of(spec)
    }

    /// [`Self::gemm_pipe_kernels`] of a given instance (the selftest runs every arch it can).
    pub fn gemm_pipe_of(&self, spec: &'static KernelSpec) -> Result<GemmPipe, CudaError> {
        const OP: &str = "gemm_pipe";
        if spec.key.op != Op::GemmPipe {
            return Err(invalid(
                OP,
                format!("instance {} is not gemm_pipe", spec.name),
            ));
        }
        let stages = spec.param_u32("stages").unwrap_or(4).max(2) as usize;
        let optin = self
            .context()
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(drv("reading the shared memory limit".to_string()))?
            .max(0) as usize;
        let sms = self.sm_count()?;
        let mut fns: [Option<CudaFunction>; 7] = Default::default();
        let mut occ = [0u32; 7];
        for t in GemmTile::ALL {
            let smem = t.smem_bytes(stages);
            if smem > optin || (t.wgmma() && !spec.key.arch.has_wgmma()) {
                continue;
            }
            let f = match t.suffix() {
                None => self.function(spec)?,
                Some(s) => self.function_entry(spec, s)?,
            };
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(drv(format!(
                "raising dynamic shared memory of {} ({}) to {smem} bytes",
                spec.name,
                t.name()
            )))?;
            // a preference only: ignore a driver that refuses it
            let _ = f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            );
            let (_, _, threads) = t.dims();
            let o = f
                .occupancy_max_active_blocks_per_multiprocessor(threads as u32, smem, None)
                .map_err(drv(format!("occupancy of {} ({})", spec.name, t.name())))?;
            if o == 0 {
                continue;
            }
            occ[t.index()] = o;
            fns[t.index()] = Some(f);
        }
        if fns.iter().all(Option::is_none) {
            return Err(invalid(
                OP,
                format!(
                    "no tile of {} fits {optin} bytes of shared memory",
                    spec.name
                ),
            ));
        }
        Ok(GemmPipe {
            spec,
            stages,
            sms,
            fns,
            occ,
        })
    }

    /// `c[i * ldc + j] = sum_l a[i * k + l] * w[j * k + l]` for i < m, j < n: `a` bf16 `[m][k]`,
    /// `w` bf16 `[n][k]`, `c` f32 with row stride `ldc` (columns n.. of each row untouched).
    /// Needs k % 8 == 0, `a` / `w` 16-byte aligned, `c` 8-byte aligned and `ldc` even.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_pipe_ptr(
        &self,
        g: &GemmPipe,
        tile: GemmTile,
        a: DevPtr<u16>,
        w: DevPtr<u16>,
        c: DevPtr<f32>,
        (m, n, k): (usize, usize, usize),
        ldc: usize,
        rs: Option<DevPtr<f32>>,
    ) -> Result<(), CudaError> {
        const OP: &str = "gemm_pipe";
        if rs.is_some_and(|r| r.len() < m) {
            return Err(invalid(OP, format!("{m} rows with fewer row scales")));
        }
        let f = g.fns[tile.index()]
            .as_ref()
            .ok_or_else(|| invalid(OP, format!("tile {} does not fit this device", tile.name())))?;
        if m == 0 || n == 0 || k == 0 || k % 8 != 0 || ldc < n || ldc % 2 != 0 {
            return Err(invalid(
                OP,
                format!("m={m} n={n} k={k} ldc={ldc}: k must be a multiple of 8, ldc even >= n"),
            ));
        }
        if a.raw() % 16 != 0 || w.raw() % 16 != 0 || c.raw() % 8 != 0 {
            return Err(invalid(
                OP,
                "a / w not 16-byte or c not 8-byte aligned".into(),
            ));
        }
        if a.len() < m * k || w.len() < n * k || c.len() < (m - 1) * ldc + n {
            return Err(invalid(
                OP,
                format!("a {} / w {} / c {} too small", a.len(), w.len(), c.len()),
            ));
        }
        let (bm, bn, threads) = tile.dims();
        let (mi, ni, ki, ldci) = (
            int(OP, "m", m)?,
            int(OP, "n", n)?,
            int(OP, "k", k)?,
            int(OP, "ldc", ldc)?,
        );
        let gx = u32::try_from(m.div_ceil(bm)).map_err(|_| invalid(OP, "m too large".into()))?;
        let gy = n.div_ceil(bn);
        if gy > 65_535 || gx >= (1u32 << 31) {
            return Err(invalid(OP, format!("grid ({gx}, {gy}) out of range")));
        }
        let cfg = LaunchConfig {
            grid_dim: (gx, gy as u32, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: tile.smem_bytes(g.stages) as u32,
        };
        let (ap, wp, cp) = (a.raw(), w.raw(), c.raw());
        let rsp = rs.map_or(0, |r| r.raw());
        let mut b = self.stream().launch_builder(f);
        b.arg(&ap)
            .arg(&wp)
            .arg(&cp)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki)
            .arg(&ldci)
            .arg(&rsp);
        // SAFETY: matches ops/gemm_pipe (const u16* A, const u16* W, float* C, int M, int N,
        // int K, int ldc, const float* rs); a holds m*k, w n*k values, c (m-1)*ldc + n floats
        // and rs (null or) m scales (checked above); the kernel reads only rows < M / N and
        // columns < K, writes only (i < m, j < n).
        unsafe { b.launch(cfg) }.map_err(drv(format!(
            "launching {} ({})",
            g.spec.name,
            tile.name()
        )))?;
        Ok(())
    }

    /// `rows x cols` weight elements in the layout of `k.spec.key.quant` (`w`) to row-major
    /// bf16 (`y`, `rows * cols` values): the CPU dequantiser's values rounded to nearest even.
    pub fn dequant_bf16_ptr(
        &self,
        k: &Kern,
        w: DevPtr<u8>,
        y: DevPtr<u16>,
        (rows, cols): (usize, usize),
    ) -> Result<(), CudaError> {
        const OP: &str = "dequant_bf16";
        if k.spec.key.op != Op::DequantBf16 {
            return Err(invalid(
                OP,
                format!("instance {} is not dequant_bf16", k.spec.name),
            ));
        }
        let q = k.spec.key.quant;
        let (be, bb) = weight_block(q).ok_or_else(|| invalid(OP, format!("no layout for {q}")))?;
        let elems = rows * cols;
        if cols % be != 0 || cols % 8 != 0 {
            return Err(invalid(
                OP,
                format!("{cols} columns is not whole {be}-element blocks of 8-element groups"),
            ));
        }
        let bytes = rows * (cols / be) * bb;
        if w.len() < bytes || y.len() < elems {
            return Err(invalid(
                OP,
                format!(
                    "w {} bytes (need {bytes}) / y {} values (need {elems})",
                    w.len(),
                    y.len()
                ),
            ));
        }
        let repacked = crate::quant::repack::source_of(q);
        // the repacked kernels index blocks in 32 bits
        if repacked
            .is_some_and(|(_, split)| !split.fits(cols) || rows * cols / be > u32::MAX as usize)
        {
            return Err(invalid(
                OP,
                format!("{q}: {rows} rows of {cols} columns (need k % 256 == 0, < 2^32 blocks)"),
            ));
        }
        let align = match q {
            Quant::Q4K => 8,
            _ if repacked.is_some() => 16,
            Quant::F16 | Quant::F32 => 16,
            _ => 2,
        };
        if w.raw() % align != 0 || y.raw() % 16 != 0 {
            return Err(invalid(
                OP,
                format!("w must be {align}-byte and y 16-byte aligned"),
            ));
        }
        if elems == 0 {
            return Ok(());
        }
        let groups = elems / 8;
        let blocks = u32::try_from(groups.div_ceil(256 * DEQUANT_GROUPS_PER_THREAD))
            .ok()
            .filter(|&b| b < (1u32 << 31))
            .ok_or_else(|| invalid(OP, format!("{elems} elements is too many for one launch")))?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let k32 = i32::try_from(cols).map_err(|_| invalid(OP, format!("{cols} columns")))?;
        let (wp, yp, gl) = (w.raw(), y.raw(), groups as i64);
        let mut b = self.stream().launch_builder(&k.f);
        b.arg(&wp).arg(&yp).arg(&gl).arg(&k32);
        // SAFETY: matches ops/dequant_bf16 (const u8* W, u16* Y, long long groups, int cols); w holds the
        // blocks of `elems` elements and y `elems` values (checked above); alignment checked.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", k.spec.name)))?;
        Ok(())
    }
}

impl CudaDevice {
    /// `c [m][n] = a [m][k] . w[n][k]^T` over float weights (f32, f16 or bf16) in f32
    /// on CUDA cores (`ops/gemm_f32`): any shape, 32 x 32 output tiles.
    pub fn gemm_f32_ptr(
        &self,
        kn: &Kern,
        a: DevPtr<f32>,
        w: DevPtr<u8>,
        c: DevPtr<f32>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), CudaError> {
        const OP: &str = "gemm_f32";
        const TILE: usize = 32;
        expect(kn, &[Op::GemmF32], OP)?;
        let elem = match kn.spec.key.quant {
            Quant::F32 => 4,
            Quant::F16 | Quant::Bf16 => 2,
            q => return Err(invalid(OP, format!("no gemm_f32 for {q}"))),
        };
        if m == 0 || n == 0 || k == 0 {
            return Err(invalid(OP, format!("empty shape m={m} n={n} k={k}")));
        }
        if a.len() < m * k || w.len() < n * k * elem || c.len() < m * n {
            return Err(invalid(
                OP,
                format!(
                    "a {} / w {} bytes / c {} too small for m={m} n={n} k={k}",
                    a.len(),
                    w.len(),
                    c.len()
                ),
            ));
        }
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, n.div_ceil(TILE))?, grid(OP, m.div_ceil(TILE))?, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ap, wp, cp) = (a.raw(), w.raw(), c.raw());
        let (mi, ni, ki) = (int(OP, "m", m)?, int(OP, "n", n)?, int(OP, "k", k)?);
        // (const float* A, const u8* W, float* C, int M, int N, int K)
        self.go(kn, cfg, &[&ap, &wp, &cp, &mi, &ni, &ki])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ops/dequant_bf16's groups of thread `t` of block `x` (its index math, line for line).
    fn dequant_groups(x: u64, t: u64, groups: u64) -> Vec<u64> {
        let ug = DEQUANT_GROUPS_PER_THREAD as u64;
        let g0 = (x * 256 + (t & !31)) * ug + (t & 31);
        (0..ug)
            .map(|u| g0 + 32 * u)
            .take_while(|&g| g < groups)
            .collect()
    }

    #[test]
    fn dequant_grid_makes_every_group_once_in_512_byte_warp_rounds() {
        for groups in [1u64, 31, 96, 1023, 1024, 1025, 2368, 4096 * 4096 / 8 + 8] {
            let blocks = groups.div_ceil(256 * DEQUANT_GROUPS_PER_THREAD as u64);
            let mut seen = vec![0u8; groups as usize];
            for x in 0..blocks {
                for t in 0..256 {
                    for g in dequant_groups(x, t, groups) {
                        seen[g as usize] += 1;
                    }
                }
                // each round u of a warp: 32 consecutive groups (512 contiguous bytes)
                for w in 0..8u64 {
                    for u in 0..DEQUANT_GROUPS_PER_THREAD {
                        let round: Vec<u64> = (0..32)
                            .filter_map(|l| dequant_groups(x, 32 * w + l, u64::MAX).get(u).copied())
                            .collect();
                        assert!(round.windows(2).all(|p| p[1] == p[0] + 1), "{round:?}");
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "groups {groups}");
        }
    }

    #[test]
    fn tiles_name_and_size() {
        for t in GemmTile::ALL {
            assert_eq!(GemmTile::from_name(t.name()), Some(t));
            assert_eq!(GemmTile::ALL[t.index()], t);
        }
        assert_eq!(GemmTile::T128x128W4.smem_bytes(4), 64 * 1024);
        assert_eq!(GemmTile::T128x256.smem_bytes(4), 96 * 1024);
        assert_eq!(GemmTile::T128x128K2.smem_bytes(3), 48 * 1024);
        assert_eq!(GemmTile::T128x128W4.smem_bytes(3), 48 * 1024);
        // wgmma entries: 4 stages of (BM + BN) x 64 bf16 + 1 KB of alignment slack
        assert_eq!(GemmTile::Wg128x128.smem_bytes(4), 128 * 1024 + 1024);
        assert_eq!(GemmTile::Wg128x256.smem_bytes(3), 192 * 1024 + 1024);
        // the sm_121a instance (3 stages) fits two 128x128 CTAs in 100 KB
        assert!(2 * GemmTile::T128x128W4.smem_bytes(3) <= 100 * 1024);
    }

    #[test]
    fn cost_prefers_whole_waves_and_big_tiles() {
        use GemmTile::*;
        // H200-like: 132 SMs; occupancy 2 (128x128 w4), 1 (w8, 128x256), 3 (64x128)
        let occ = |t: GemmTile| match t {
            T128x128W4 => 2,
            T128x128W8 | T128x256 | T128x128K2 | Wg128x128 | Wg128x256 => 1,
            T64x128 => 3,
        };
        // sm_80 / sm_121a: the mma.sync tiles only
        let best = |m: usize, n: usize| {
            GemmTile::ALL
                .into_iter()
                .filter(|t| !t.wgmma())
                .min_by(|&a, &b| {
                    tile_cost(a, m, n, 132, occ(a)).total_cmp(&tile_cost(b, m, n, 132, occ(b)))
                })
                .unwrap()
        };
        // 512 x 4096: 128 CTAs of 128x128 fill the GPU once; 128x256 would leave half idle (the
        // sliced-K CTA measured slowest)
        assert_eq!(best(512, 4096), T128x128W4);
        // 512 x 6144: one wave of 128x256 or of 64x128 (measured 307 / 297 TFLOPS), not 128x128
        assert!(matches!(best(512, 6144), T128x256 | T64x128));
        // many tiles: the bigger tile wins
        assert_eq!(best(4096, 4096), T128x256);
        assert_eq!(best(4096, 24576), T128x256);
        // a few rows: 64-row tiles
        assert_eq!(best(17, 4096), T64x128);
        // sm_90a: the wgmma tiles, as measured at M = 512: 128x256 for N = 6144 / 24576 /
        // 30720, 128x128 for N = 4096 / 3840
        let best_wg = |m: usize, n: usize| {
            GemmTile::ALL
                .into_iter()
                .min_by(|&a, &b| {
                    tile_cost(a, m, n, 132, occ(a)).total_cmp(&tile_cost(b, m, n, 132, occ(b)))
                })
                .unwrap()
        };
        assert_eq!(best_wg(512, 6144), Wg128x256);
        assert_eq!(best_wg(512, 24576), Wg128x256);
        assert_eq!(best_wg(512, 30720), Wg128x256);
        assert_eq!(best_wg(512, 4096), Wg128x128);
        assert_eq!(best_wg(512, 3840), Wg128x128);
        assert_eq!(best_wg(4096, 24576), Wg128x256);
        assert_eq!(best_wg(17, 4096), T64x128);
        // cost grows with the work
        assert!(
            tile_cost(T128x128W4, 1024, 4096, 132, 2) > tile_cost(T128x128W4, 512, 4096, 132, 2)
        );
    }
}
