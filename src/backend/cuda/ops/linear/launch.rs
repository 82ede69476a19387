//! Typed launches of the linear-algebra kernels: activation quantisation (`quantize_q8`), the
//! decode GEMV over GGUF-layout weights, the tensor-core GEMM, and the read-bandwidth probe.
//! Shapes are validated against the buffers (errors, never panics); every launch states the
//! template signature it matches.

use crate::kernels::Entry;
use cudarc::driver::{sys, CudaSlice, LaunchConfig, PushKernelArg};

use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::{drv, CudaError};
use crate::backend::cuda::runtime::kern::weight_block;
use crate::backend::cuda::runtime::kern::{expect, grid, int, invalid, Kern};
use crate::backend::cuda::CudaDevice;
use crate::kernels::{KernelSpec, Op, Quant};

fn expect_op(spec: &KernelSpec, op: Op, name: &'static str) -> Result<(), CudaError> {
    if spec.key.op == op {
        Ok(())
    } else {
        Err(invalid(
            name,
            format!("instance {} is not a {name} kernel", spec.name),
        ))
    }
}

/// Default GEMV grid for `sms` multiprocessors: one step of `rows` rows (the instance's `rows`
/// param, 1 when absent) per warp, 4 warps per block; staged instances with `rows` > 1 are
/// capped at 4 blocks per SM (persistent warps walking several row groups), measured faster on the H200
/// (12288 x 4096: Q4_0 12.0 vs 13.2 us, Q4_K 12.7 vs 13.4 us).
pub fn gemv_default_grid(spec: &KernelSpec, n: usize, sms: u32) -> u32 {
    let rows = spec.param_u32("rows").unwrap_or(1).max(1) as usize;
    let grid = n.div_ceil(4 * rows).min(u32::MAX as usize) as u32;
    // the register-direct kernels of repacked formats run best with one row group per warp
    // (H200, probe benches/nvcc/gemv_q4_0_repacked.cu: 24576 x 4096 16.7 us uncapped vs 18.2 at
    // 8 blocks per SM)
    if rows > 1 && crate::quant::repack::source_of(spec.key.quant).is_none() {
        grid.min(4 * sms.max(1))
    } else {
        grid
    }
}

/// Blocks of a GEMV instance's staged chunk (the template's `CB`: 128 / 96 / 64 / 16 / 16
/// blocks for Q4_0 / Q5_0 / Q8_0 / Q4_K / Q6_K, divided by `chunk_div`); None for float formats.
fn gemv_chunk_blocks(spec: &KernelSpec) -> Option<usize> {
    let cb = match spec.key.quant {
        Quant::Q4_0 => 128,
        Quant::Q5_0 => 96,
        Quant::Q8_0 => 64,
        Quant::Q4K | Quant::Q6K => 16,
        _ => return None,
    };
    Some(cb / spec.param_u32("chunk_div").unwrap_or(1).max(1) as usize)
}

/// Dynamic shared memory of a GEMV instance's `__s2` entry (two chunk buffers per warp:
/// 4 warps x 2 x `rows` x SBYTES, SBYTES = the chunk's 16-byte units + one for misalignment, + 16
/// bytes of slack; see ops/gemv.cu.tera); None when the instance has no such entry (only
/// block formats with `rows` > 1 do).
pub fn gemv_s2_smem(spec: &KernelSpec) -> Option<usize> {
    let rows = spec.param_u32("rows").unwrap_or(1) as usize;
    if spec.key.op != Op::Gemv || rows < 2 {
        return None;
    }
    let (_, bb) = weight_block(spec.key.quant)?;
    let cb = gemv_chunk_blocks(spec)?;
    let units = (cb * bb).div_ceil(16) + 1;
    Some(4 * 2 * rows * (units * 16 + 16))
}

/// Dynamic shared memory of a GEMV instance's main entry when it has `dyn_smem = 1` (4 warps x
/// `stages` x `rows` x SBYTES, as [`gemv_s2_smem`] with the instance's stages); None when the
/// main entry uses static shared memory.
pub fn gemv_main_smem(spec: &KernelSpec) -> Option<usize> {
    if spec.key.op != Op::Gemv || spec.param_u32("dyn_smem") != Some(1) {
        return None;
    }
    let rows = spec.param_u32("rows").unwrap_or(1).max(1) as usize;
    let stages = spec.param_u32("stages").unwrap_or(2).max(1) as usize;
    let (_, bb) = weight_block(spec.key.quant)?;
    let cb = gemv_chunk_blocks(spec)?;
    let units = (cb * bb).div_ceil(16) + 1;
    Some(4 * stages * rows * (units * 16 + 16))
}

/// Which GEMV entry streams an `[n, k]` matrix: `__s2` (two whole-chunk buffers per warp) when
/// the instance has one and `FUCINA_GEMV_S2` says so: `always`, `never`, or by default (`long`)
/// for rows of at least 3 chunks, whose warps gain from computing one chunk while the next
/// lands. Measured on the H200 (ncu, Qwen3-8B Q4_0): down 4096 x 12288 (3 chunks) 16.0 -> 14.4
/// us with `__s2`; gate/up 24576 x 4096 (1 chunk) 19.6 -> 21.1 us and the Q6_K head 151936 x
/// 4096 (2 chunks) 176 -> 182 us without gain.
pub fn gemv_use_s2(spec: &KernelSpec, k: usize) -> bool {
    use crate::tuning::GemvS2;
    gemv_s2_smem(spec).is_some()
        && match crate::tuning::get().gemv_s2 {
            GemvS2::Never => false,
            GemvS2::Always => true,
            GemvS2::Long => gemv_row_is_long(spec, k),
        }
}

/// Whether rows of `k` values span at least 3 of the instance's staged chunks (the default
/// rule of [`gemv_use_s2`]).
fn gemv_row_is_long(spec: &KernelSpec, k: usize) -> bool {
    let chunk =
        gemv_chunk_blocks(spec).unwrap_or(0) * weight_block(spec.key.quant).map_or(0, |(be, _)| be);
    chunk > 0 && k >= 3 * chunk
}

/// Grid of the `__s2` entry: like [`gemv_default_grid`], capped at the blocks per SM that its
/// shared memory allows (3 of 75 KB for Q4_0 with 4 rows; at most 4).
pub fn gemv_s2_grid(spec: &KernelSpec, n: usize, sms: u32, smem: usize) -> u32 {
    let per_sm = (227 * 1024 / smem.max(1)).clamp(1, 4) as u32;
    let rows = spec.param_u32("rows").unwrap_or(1).max(1) as usize;
    (n.div_ceil(4 * rows).min(u32::MAX as usize) as u32).min(per_sm * sms.max(1))
}

/// Load batches of one row of `k` values in a batch-1 repacked GEMV (`rows_dot`: each lane loads
/// `unroll` 16-byte units a batch, 32 lanes); None for other instances.
pub fn gemv_row_batches(spec: &KernelSpec, k: usize) -> Option<usize> {
    if spec.key.op != Op::Gemv || spec.key.batch.value() != Some(1) {
        return None;
    }
    let units = match spec.key.quant {
        Quant::Q4_0R | Quant::Q8_0R => k / 32,
        Quant::Q4KR => k / 256 * 8,
        Quant::Q6KR => k / 256 * 4,
        _ => return None,
    };
    let unroll = spec.param_u32("unroll")?.max(1) as usize;
    Some(units.div_ceil(32 * unroll))
}

/// Warps a row group's k range is split over (the `__ks` entry: 2, 4 or 8) for a batch-1
/// repacked GEMV of `n` rows of `k`, or None (the main entry). By default ([`ks_for`]) rows of
/// several load batches are split so that each warp loads one batch (at most 8 ways), except for
/// very tall matrices (the LM head), whose warps are plenty already. `FUCINA_GEMV_KS` (read
/// once): `0` never, `2` / `4` / `8` that many ways wherever rows take two batches or more.
pub fn gemv_ks(spec: &KernelSpec, n: usize, k: usize) -> Option<u32> {
    let forced = crate::tuning::get().gemv_ks;
    let batches = gemv_row_batches(spec, k)?;
    let ks = match forced {
        Some(f) if batches >= 2 => f,
        Some(_) => 1,
        None => ks_for(n, batches),
    };
    (ks > 1).then_some(ks)
}

/// The default split of [`gemv_ks`]: the smallest of 1, 2, 4, 8 that leaves each warp at most one
/// load batch (8 when more remain), 1 for more than [`KS_MAX_ROWS`] rows.
fn ks_for(n: usize, batches: usize) -> u32 {
    let max = crate::tuning::get().gemv_ks_max_rows.unwrap_or(KS_MAX_ROWS);
    if n > max {
        return 1;
    }
    match batches {
        0 | 1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    }
}

/// The entry, warps per block and blocks of a k-split launch of `ks` ways over `n` rows: `__ks`
/// (blocks of 4 warps, 4 / ks row groups each) for 1, 2 and 4 ways, `__ks8` (8 warps, one row
/// group) for 8; None for any other split.
fn ks_geometry(spec: &KernelSpec, ks: u32, n: usize) -> Option<(Entry, u32, usize)> {
    let (suffix, warps) = match ks {
        1 | 2 | 4 => (Entry::Ks, 4),
        8 => (Entry::Ks8, 8),
        _ => return None,
    };
    let rows = spec.param_u32("rows").unwrap_or(1).max(1) as usize;
    Some((suffix, warps, n.div_ceil(rows * (warps / ks) as usize)))
}

/// Rows above which [`ks_for`] does not split (an LM head's 151936 rows fill the GPU's warps
/// many times over).
const KS_MAX_ROWS: usize = 65536;

/// Which entry and grid of a GEMV instance a launch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvEntry {
    /// [`gemv_use_s2`] decides; default grid.
    Auto,
    /// The main entry; `Some(g)` blocks of 4 warps, or the default grid.
    Main(Option<u32>),
    /// The `__s2` entry (an error when the instance has none); `Some(g)` blocks, or its default.
    S2(Option<u32>),
    /// The `__ks` entry of a batch-1 repacked instance: each row group's k range split over
    /// this many warps (1, 2, 4 or 8) of its block.
    Ks(u32),
}

/// Activations of a block-format GEMV: int8 per 32 (`xq`) and per group {d, d*sum(q)} (`xds`,
/// two floats per group), as written by [`CudaDevice::quantize_q8`].
pub struct Q8Activations {
    pub xq: CudaSlice<i8>,
    pub xds: CudaSlice<f32>,
}

impl CudaDevice {
    /// Buffers for `len` quantised activation values (`len % 32 == 0`).
    pub fn q8_activations(&self, len: usize) -> Result<Q8Activations, CudaError> {
        if len % 32 != 0 {
            return Err(invalid(
                "quantize_q8",
                format!("{len} values is not a multiple of 32"),
            ));
        }
        Ok(Q8Activations {
            xq: self.upload(&vec![0i8; len])?,
            xds: self.filled_f32(len / 16, 0.0)?,
        })
    }

    /// Quantise `x` (any number of rows, total a multiple of 32) into `act`.
    pub fn quantize_q8(
        &self,
        spec: &'static KernelSpec,
        x: &CudaSlice<f32>,
        act: &mut Q8Activations,
    ) -> Result<(), CudaError> {
        const OP: &str = "quantize_q8";
        expect_op(spec, Op::QuantizeQ8, OP)?;
        let len = x.len();
        if len == 0 || len % 32 != 0 || act.xq.len() < len || act.xds.len() < len / 16 {
            return Err(invalid(
                OP,
                format!("x {len} / xq {} / xds {}", act.xq.len(), act.xds.len()),
            ));
        }
        let groups = int(OP, "groups", len / 32)?;
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: (((len / 32).div_ceil(8)).min(65535) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(&mut act.xq).arg(&mut act.xds).arg(&groups);
        // SAFETY: matches (const float* x, i8* xq, float2* xds, int n_groups); sizes checked.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// Multiprocessor count of this device.
    pub fn sm_count(&self) -> Result<u32, CudaError> {
        let v = self
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("reading the multiprocessor count".to_string()))?;
        Ok(v.max(1) as u32)
    }

    /// `y[b][r] = sum_j W[r][j] x[b][j]` for `b < spec.key.batch`: `w` holds `n` rows of `k`
    /// elements in the GGUF layout of `spec.key.quant`. Float formats read `x` (f32, batch*k);
    /// block formats read `act` (from [`Self::quantize_q8`] of x). `entry` picks the kernel entry
    /// and grid ([`GemvEntry::Auto`]: what decode uses).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv(
        &self,
        spec: &'static KernelSpec,
        w: &CudaSlice<u8>,
        x: &CudaSlice<f32>,
        act: &Q8Activations,
        y: &mut CudaSlice<f32>,
        n: usize,
        k: usize,
        entry: GemvEntry,
    ) -> Result<(), CudaError> {
        let kn = Kern {
            spec,
            f: self.function(spec)?,
        };
        self.gemv_entry_ptr(
            &kn,
            DevPtr::of(w),
            DevPtr::of(x),
            DevPtr::of(&act.xq),
            DevPtr::of(&act.xds),
            DevPtr::of(&*y),
            (n, k),
            self.sm_count()?,
            entry,
        )
    }

    /// `c[m][n] = a[m][k] . w[n][k]^T` (f32 out). bf16: `a`, `w` hold bf16 bits. fp8_e4m3:
    /// E4M3 bytes, `a_scale` one float, `w_scale` [ceil(n/128)][ceil(k/128)]. Block formats
    /// (q8_0 q4_0 q5_0 q4_k q6_k): `w` in its GGUF layout, `a` bf16; scales unused.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        spec: &'static KernelSpec,
        a: &CudaSlice<u8>,
        w: &CudaSlice<u8>,
        c: &mut CudaSlice<f32>,
        (m, n, k): (usize, usize, usize),
        w_scale: &CudaSlice<f32>,
        a_scale: &CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "gemm";
        expect_op(spec, Op::Gemm, OP)?;
        // activation element size; weight (elements, bytes) per block
        let q = spec.key.quant;
        let es = if q == Quant::Fp8E4m3 { 1 } else { 2 };
        let (be, bb) = weight_block(q).ok_or_else(|| invalid(OP, format!("no gemm for {q}")))?;
        if m == 0 || n == 0 || k == 0 || (k * es) % 16 != 0 || k % be != 0 {
            return Err(invalid(
                OP,
                format!("m={m} n={n} k={k}: k*{es} bytes must be a multiple of 16 and k of {be}"),
            ));
        }
        let kb = k.div_ceil(128);
        if a.len() < m * k * es || w.len() < n * (k / be) * bb || c.len() < m * n {
            return Err(invalid(
                OP,
                format!("a {} / w {} / c {} too small", a.len(), w.len(), c.len()),
            ));
        }
        if spec.key.quant == Quant::Fp8E4m3
            && (w_scale.len() < n.div_ceil(128) * kb || a_scale.is_empty())
        {
            return Err(invalid(OP, "fp8 scales too small".into()));
        }
        let tile = spec.param_u32("tile").unwrap_or(64) as usize;
        let (mi, ni, ki, kbi) = (
            int(OP, "m", m)?,
            int(OP, "n", n)?,
            int(OP, "k", k)?,
            kb as i32,
        );
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(tile) as u32, m.div_ceil(tile) as u32, 1),
            block_dim: ((64 * tile / 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(a)
            .arg(w)
            .arg(c)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki)
            .arg(w_scale)
            .arg(a_scale)
            .arg(&kbi);
        // SAFETY: matches (const u8* A, const u8* W, float* C, int M, int N, int K,
        // const float* w_scale, const float* a_scale, int ws_cols); sizes checked above.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// Read `buf` once (a multiple of 16 bytes); each of `grid*256` threads XORs what it read
    /// into `sink`.
    pub fn read_bw(
        &self,
        spec: &'static KernelSpec,
        buf: &CudaSlice<u8>,
        sink: &mut CudaSlice<u32>,
        grid: u32,
    ) -> Result<(), CudaError> {
        const OP: &str = "read_bw";
        expect_op(spec, Op::ReadBw, OP)?;
        if buf.len() % 16 != 0 || sink.len() < grid as usize * 256 || grid == 0 {
            return Err(invalid(
                OP,
                format!(
                    "buffer {} bytes, sink {} for grid {grid}",
                    buf.len(),
                    sink.len()
                ),
            ));
        }
        let n16 = (buf.len() / 16) as i64;
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(buf).arg(&n16).arg(sink);
        // SAFETY: matches (const uint4* p, long long n16, u32* sink); sink holds grid*256 words.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }
}

impl CudaDevice {
    /// `y[b][r] = sum_j W[r][j] x[b][j]` for `b < batch` of the instance; float weights read
    /// `x` (f32 `[batch][k]`), block formats `xq`/`xds` (from [`Self::quantize_q8_ptr`] of x).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_ptr(
        &self,
        kn: &Kern,
        w: DevPtr<u8>,
        x: DevPtr<f32>,
        xq: DevPtr<i8>,
        xds: DevPtr<f32>,
        y: DevPtr<f32>,
        (n, k): (usize, usize),
        sms: u32,
    ) -> Result<(), CudaError> {
        self.gemv_entry_ptr(kn, w, x, xq, xds, y, (n, k), sms, GemvEntry::Auto)
    }

    /// [`Self::gemv_ptr`] through the entry and grid `entry` names.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_entry_ptr(
        &self,
        kn: &Kern,
        w: DevPtr<u8>,
        x: DevPtr<f32>,
        xq: DevPtr<i8>,
        xds: DevPtr<f32>,
        y: DevPtr<f32>,
        (n, k): (usize, usize),
        sms: u32,
        entry: GemvEntry,
    ) -> Result<(), CudaError> {
        const OP: &str = "gemv";
        expect(kn, &[Op::Gemv], OP)?;
        let q = kn.spec.key.quant;
        let (be, bb) = weight_block(q).ok_or_else(|| invalid(OP, format!("{q} unsupported")))?;
        let batch = kn.spec.key.batch.value().unwrap_or(1) as usize;
        let block_fmt = be > 1;
        if n == 0 || k == 0 || k % be != 0 || (block_fmt && k % 32 != 0) {
            return Err(invalid(OP, format!("n={n} k={k} for {q}")));
        }
        if let Some((_, split)) = crate::quant::repack::source_of(q) {
            if !split.fits(k) || w.raw() % 16 != 0 {
                return Err(invalid(
                    OP,
                    format!("{q} needs rows of whole 256-element groups and 16-byte aligned weights (k={k})"),
                ));
            }
        }
        if w.len() < n * (k / be) * bb || y.len() < batch * n {
            return Err(invalid(
                OP,
                format!(
                    "w {} bytes / y {} for n={n} k={k} batch={batch}",
                    w.len(),
                    y.len()
                ),
            ));
        }
        if block_fmt && (xq.len() < batch * k || xds.len() < batch * k / 16) {
            return Err(invalid(
                OP,
                format!("activations hold {} values, need {}", xq.len(), batch * k),
            ));
        }
        if !block_fmt && x.len() < batch * k {
            return Err(invalid(
                OP,
                format!("x holds {} values, need {}", x.len(), batch * k),
            ));
        }
        let (wp, xp, qp, dp, yp) = (w.raw(), x.raw(), xq.raw(), xds.raw(), y.raw());
        let (n32, k32) = (int(OP, "n", n)?, int(OP, "k", k)?);
        // (const u8* w, const float* x, const i8* xq, const float2* xds, float* y, int n, int k),
        // 128 threads; the `__s2` entry takes the same arguments and its dynamic shared memory
        let entry = match entry {
            GemvEntry::Auto if gemv_use_s2(kn.spec, k) => GemvEntry::S2(None),
            GemvEntry::Auto => match gemv_ks(kn.spec, n, k) {
                Some(ks) => GemvEntry::Ks(ks),
                None => GemvEntry::Main(None),
            },
            e => e,
        };
        let grid = match entry {
            GemvEntry::Ks(ks) => {
                // only batch-1 repacked instances have the k-split entries
                let (suffix, warps, blocks) = gemv_row_batches(kn.spec, k)
                    .and_then(|_| ks_geometry(kn.spec, ks, n))
                    .ok_or_else(|| {
                        invalid(
                            OP,
                            format!("{} has no k-split entry for {ks} warps", kn.spec.name),
                        )
                    })?;
                let ksk = Kern {
                    spec: kn.spec,
                    f: self.function_entry(kn.spec, suffix)?,
                };
                let cfg = LaunchConfig {
                    grid_dim: (crate::backend::cuda::runtime::kern::grid(OP, blocks)?, 1, 1),
                    block_dim: (32 * warps, 1, 1),
                    shared_mem_bytes: 0,
                };
                let ks32 = ks as i32;
                // (... as the main entry ..., int ks)
                return self.go(&ksk, cfg, &[&wp, &xp, &qp, &dp, &yp, &n32, &k32, &ks32]);
            }
            GemvEntry::S2(grid) => {
                let smem = gemv_s2_smem(kn.spec)
                    .ok_or_else(|| invalid(OP, format!("{} has no __s2 entry", kn.spec.name)))?;
                let s2 = Kern {
                    spec: kn.spec,
                    f: self.function_entry_smem(kn.spec, Entry::S2, smem)?,
                };
                let cfg = LaunchConfig {
                    grid_dim: (
                        grid.unwrap_or_else(|| gemv_s2_grid(kn.spec, n, sms, smem))
                            .max(1),
                        1,
                        1,
                    ),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: smem as u32,
                };
                return self.go(&s2, cfg, &[&wp, &xp, &qp, &dp, &yp, &n32, &k32]);
            }
            GemvEntry::Main(grid) => grid,
            GemvEntry::Auto => None,
        };
        // a main entry over 48 KB of chunk buffers takes them as dynamic shared memory
        let smem = gemv_main_smem(kn.spec);
        let cfg = LaunchConfig {
            grid_dim: (
                grid.unwrap_or_else(|| gemv_default_grid(kn.spec, n, sms))
                    .max(1),
                1,
                1,
            ),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem.unwrap_or(0) as u32,
        };
        if let Some(smem) = smem {
            let main = Kern {
                spec: kn.spec,
                f: self.function_smem(kn.spec, smem)?,
            };
            return self.go(&main, cfg, &[&wp, &xp, &qp, &dp, &yp, &n32, &k32]);
        }
        self.go(kn, cfg, &[&wp, &xp, &qp, &dp, &yp, &n32, &k32])
    }
}

/// The batch-1 sm_90a GEMV instance of `q` (unit tests of the launch rules).
#[cfg(test)]
pub(in crate::backend::cuda) fn bs1(q: Quant) -> &'static KernelSpec {
    crate::kernels::KERNELS
        .iter()
        .find(|s| {
            s.key.op == Op::Gemv
                && s.key.quant == q
                && s.key.batch.value() == Some(1)
                && s.name.ends_with("sm_90a")
        })
        .expect("bs1 instance")
}

impl CudaDevice {
    /// `c[m][n] = a[m][k] . w[n][k]^T` with `a` bf16 bits, `w` in the instance's format
    /// (bf16 or a GGUF block format; not fp8, whose scales this helper does not take).
    pub fn gemm_ptr(
        &self,
        kn: &Kern,
        a: DevPtr<u16>,
        w: DevPtr<u8>,
        c: DevPtr<f32>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), CudaError> {
        const OP: &str = "gemm";
        expect(kn, &[Op::Gemm], OP)?;
        let q = kn.spec.key.quant;
        if q == Quant::Fp8E4m3 {
            return Err(invalid(
                OP,
                "fp8 gemm needs scales: not through gemm_ptr".into(),
            ));
        }
        let (be, bb) = weight_block(q).ok_or_else(|| invalid(OP, format!("no gemm for {q}")))?;
        if m == 0 || n == 0 || k == 0 || (k * 2) % 16 != 0 || k % be != 0 {
            return Err(invalid(
                OP,
                format!("m={m} n={n} k={k}: k must be a multiple of 8 and of {be}"),
            ));
        }
        if a.len() < m * k || w.len() < n * (k / be) * bb || c.len() < m * n {
            return Err(invalid(
                OP,
                format!("a {} / w {} / c {} too small", a.len(), w.len(), c.len()),
            ));
        }
        let tile = kn.spec.param_u32("tile").unwrap_or(64) as usize;
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, n.div_ceil(tile))?, grid(OP, m.div_ceil(tile))?, 1),
            block_dim: ((64 * tile / 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ap, wp, cp) = (a.raw(), w.raw(), c.raw());
        let (mi, ni, ki, kb) = (
            int(OP, "m", m)?,
            int(OP, "n", n)?,
            int(OP, "k", k)?,
            k.div_ceil(128) as i32,
        );
        let null = 0u64;
        // (const u8* A, const u8* W, float* C, int M, int N, int K, const float* w_scale,
        //  const float* a_scale, int ws_cols); the scales are read only by fp8 instances
        self.go(kn, cfg, &[&ap, &wp, &cp, &mi, &ni, &ki, &null, &null, &kb])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `__s2` shared memory follows the template's chunk arithmetic (Q4_0: 128 blocks of
    /// 18 bytes = 144 16-byte copies, + 1 for misalignment, + 16 bytes of slack per row buffer,
    /// 4 warps x 2 x 4 rows),
    /// fits an H200 SM twice (227 KB), and only the multi-row instances have the entry.
    #[test]
    fn s2_entry_geometry() {
        let q4 = bs1(Quant::Q4_0);
        assert_eq!(gemv_s2_smem(q4), Some(4 * 2 * 4 * (145 * 16 + 16)));
        for q in [Quant::Q4_0, Quant::Q4K, Quant::Q6K] {
            let smem = gemv_s2_smem(bs1(q)).expect("multi-row instance");
            assert!(2 * smem <= 227 * 1024, "{q}: {smem}");
            assert_eq!(gemv_s2_grid(bs1(q), 4096, 132, smem), 256);
            // a large matrix: every block resident at once, at least 2 per SM
            let g = gemv_s2_grid(bs1(q), 1 << 20, 132, smem) as usize;
            assert!(g * smem <= 132 * 227 * 1024 && g >= 2 * 132, "{q}: {g}");
        }
        // Q8_0: 2 rows per warp step, 64-block chunks (2176 bytes = 136 copies + 1)
        let q8 = bs1(Quant::Q8_0);
        let smem = gemv_s2_smem(q8).expect("multi-row instance");
        assert_eq!(smem, 4 * 2 * 2 * (137 * 16 + 16));
        assert_eq!(gemv_s2_grid(q8, 4096, 132, smem), 512);
        assert_eq!(gemv_s2_smem(bs1(Quant::Q5_0)), None);
    }

    /// The Q6_K batch-1 instance keeps whole 16-block chunks in dynamic shared memory (16 x 210
    /// bytes = 210 copies + 1, + 16 bytes, x 4 rows x 1 stage x 4 warps = 53 KB: over the static
    /// 48 KB, 4 blocks still fit an H200 SM); the other instances use static shared memory.
    #[test]
    fn main_entry_dynamic_smem() {
        let smem = gemv_main_smem(bs1(Quant::Q6K)).expect("dyn_smem instance");
        assert_eq!(smem, 4 * 4 * (211 * 16 + 16));
        assert!(smem > 48 * 1024 && 4 * smem <= 227 * 1024);
        assert_eq!(gemv_main_smem(bs1(Quant::Q4_0)), None);
        assert_eq!(gemv_main_smem(bs1(Quant::Q8_0)), None);
    }

    /// The register-direct Q4_0R instance stages nothing (no `__s2`, no dynamic shared memory)
    /// and gets one row group per warp, uncapped (the staged multi-row instances stop at 4
    /// blocks per SM).
    #[test]
    fn q4_0r_grid_is_one_group_per_warp() {
        let r = bs1(Quant::Q4_0R);
        assert_eq!(r.param_u32("rows"), Some(2));
        assert_eq!(gemv_s2_smem(r), None);
        assert_eq!(gemv_main_smem(r), None);
        assert!(!gemv_use_s2(r, 12288));
        assert_eq!(gemv_default_grid(r, 24576, 132), 3072);
        assert_eq!(gemv_default_grid(bs1(Quant::Q4_0), 24576, 132), 4 * 132);
    }

    /// Load batches of a row in the batch-1 repacked GEMVs, and the default k split: Qwen3-8B's
    /// down projection (k = 12288) is 3 batches of 128 Q4_0 blocks (4 per lane) -> 4 warps;
    /// a Q8_0 row of 4096 is 2 batches of 64 -> 2; one batch, other instances and the LM head
    /// are not split.
    #[test]
    fn k_split_by_row_batches() {
        let (q4, q8, q4k) = (bs1(Quant::Q4_0R), bs1(Quant::Q8_0R), bs1(Quant::Q4KR));
        assert_eq!(gemv_row_batches(q4, 4096), Some(1));
        assert_eq!(gemv_row_batches(q4, 12288), Some(3));
        assert_eq!(gemv_row_batches(q4, 15360), Some(4));
        assert_eq!(gemv_row_batches(q8, 4096), Some(2));
        assert_eq!(gemv_row_batches(q8, 12288), Some(6));
        // q4_kr: 2 words a lane a batch (4 rows a step)
        assert_eq!(gemv_row_batches(q4k, 4096), Some(2));
        assert_eq!(gemv_row_batches(q4k, 12288), Some(6));
        // q6_kr: 64-value units, 1 a lane a batch (4 rows a step): Qwen3-8B's Q6_K down (6
        // batches, 8 ways) and V (2 batches, 2 ways)
        let q6k = bs1(Quant::Q6KR);
        assert_eq!(gemv_row_batches(q6k, 12288), Some(6));
        assert_eq!(gemv_row_batches(q6k, 4096), Some(2));
        assert_eq!(gemv_row_batches(bs1(Quant::Q4_0), 12288), None);
        assert_eq!(gemv_row_batches(bs1(Quant::Q6K), 12288), None);
        assert_eq!(ks_for(4096, 3), 4);
        assert_eq!(ks_for(4096, 6), 8);
        assert_eq!(ks_for(4096, 2), 2);
        assert_eq!(ks_for(4096, 1), 1);
        assert_eq!(ks_for(151936, 2), 1);
        // 2-row groups: 4 ways -> one group a 4-warp block; 2 ways -> two; 8 ways -> __ks8
        assert_eq!(ks_geometry(q4, 4, 4096), Some((Entry::Ks, 4, 2048)));
        assert_eq!(ks_geometry(q4, 2, 4096), Some((Entry::Ks, 4, 1024)));
        assert_eq!(ks_geometry(q4, 1, 4097), Some((Entry::Ks, 4, 513)));
        assert_eq!(ks_geometry(q8, 8, 4096), Some((Entry::Ks8, 8, 2048)));
        assert_eq!(ks_geometry(q8, 3, 4096), None);
    }

    /// The default rule picks `__s2` for rows of at least 3 chunks only: Qwen3-8B's down projection
    /// (k = 12288 = 3 chunks of 4096) but not its gate/up (k = 4096) or a Q6_K head at k = 4096
    /// (2 chunks of 2048).
    #[test]
    fn s2_only_for_long_rows() {
        assert!(gemv_row_is_long(bs1(Quant::Q4_0), 12288));
        assert!(gemv_row_is_long(bs1(Quant::Q4K), 12288));
        assert!(!gemv_row_is_long(bs1(Quant::Q4_0), 4096));
        assert!(!gemv_row_is_long(bs1(Quant::Q6K), 4096));
    }
}
