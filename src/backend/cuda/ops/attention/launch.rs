//! Typed launches of the KV-cache kernels: `kv_write` (store new K/V rows at device positions)
//! and `attn_prefill` (causal flash attention of many query rows), plus the paged-layout math
//! they share with `kv.rs` and `attn_decode`.

use cudarc::driver::{sys, LaunchConfig, PushKernelArg};

use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::{drv, CudaError};
use crate::backend::cuda::CudaDevice;
use crate::kernels::Quant;
use crate::kernels::{KernelSpec, Op};

fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

/// The paged cache layout: `[ring_pages][hkv][page_size][head_dim]` elements of `elem_bytes`.
/// Position j lives on page `(j / page_size) % ring_pages`: a full cache has `ring_pages ==
/// pages()` (identity order); a sliding-window ring has fewer, and position j overwrites
/// position `j - ring_pages * page_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub hkv: usize,
    pub head_dim: usize,
    pub page_size: usize,
    /// Positions below this may be written (`pages() * page_size >= capacity`).
    pub capacity: usize,
    /// Pages allocated (`1 ..= pages()`).
    pub ring_pages: usize,
    pub elem_bytes: usize,
}

impl KvLayout {
    /// Logical pages: the positions `0 .. capacity` in pages.
    pub fn pages(&self) -> usize {
        self.capacity.div_ceil(self.page_size.max(1))
    }
    /// Cache rows (one position of one KV head): what an FP8 cache keeps a scale for.
    pub fn rows(&self) -> usize {
        self.ring_pages * self.hkv * self.page_size
    }
    /// Bytes of one of the K / V caches.
    pub fn bytes(&self) -> usize {
        self.ring_pages * self.hkv * self.page_size * self.head_dim * self.elem_bytes
    }
    /// Element index of (position `pos`, KV head `h`, dim 0): what the kernels compute.
    pub fn elem_offset(&self, pos: usize, h: usize) -> usize {
        let page = (pos / self.page_size) % self.ring_pages.max(1);
        ((page * self.hkv + h) * self.page_size + pos % self.page_size) * self.head_dim
    }
    pub(crate) fn check(
        &self,
        op: &'static str,
        k: DevPtr<u8>,
        v: DevPtr<u8>,
    ) -> Result<(), CudaError> {
        if self.hkv == 0 || self.head_dim == 0 || self.page_size == 0 || self.capacity == 0 {
            return Err(invalid(op, format!("empty cache layout {self:?}")));
        }
        if self.ring_pages == 0 || self.ring_pages > self.pages() {
            return Err(invalid(
                op,
                format!("{self:?}: ring pages must be 1 ..= {}", self.pages()),
            ));
        }
        if k.len() < self.bytes() || v.len() < self.bytes() {
            return Err(invalid(
                op,
                format!(
                    "caches of {} / {} bytes, layout {self:?} needs {}",
                    k.len(),
                    v.len(),
                    self.bytes()
                ),
            ));
        }
        i32::try_from(self.pages() * self.page_size)
            .map_err(|_| invalid(op, "capacity exceeds i32".into()))?;
        Ok(())
    }
}

/// The per-row scales of an FP8 cache (`crate::backend::kv_type`): f16 `[ring_pages][hkv]
/// [page_size]`, one per cache row, for K and for V (the FP8 kernels write and read them; null
/// for an f16 cache, whose kernels take no scale).
#[derive(Debug, Clone, Copy)]
pub struct KvScales {
    pub k: DevPtr<u16>,
    pub v: DevPtr<u16>,
}

impl KvScales {
    /// No scales (an f16 cache).
    pub fn none() -> Self {
        KvScales {
            k: DevPtr::null(),
            v: DevPtr::null(),
        }
    }
    /// Both scale arrays hold a value per row of `layout` when its elements are FP8.
    pub(crate) fn check(&self, op: &'static str, layout: &KvLayout) -> Result<(), CudaError> {
        if layout.elem_bytes == 1 && (self.k.len() < layout.rows() || self.v.len() < layout.rows())
        {
            return Err(invalid(
                op,
                format!(
                    "an FP8 cache of {} rows with {} / {} scales",
                    layout.rows(),
                    self.k.len(),
                    self.v.len()
                ),
            ));
        }
        Ok(())
    }
    /// The two kernel arguments.
    pub fn raw(&self) -> (u64, u64) {
        (self.k.raw(), self.v.raw())
    }
}

/// Shape and options of one prefill-attention launch.
#[derive(Debug, Clone, Copy)]
pub struct AttnPrefillLaunch {
    /// Query rows.
    pub n: usize,
    pub hq: usize,
    pub hkv: usize,
    pub scale: f32,
    /// 0 = off.
    pub softcap: f32,
    /// 0 = full causal attention.
    pub window: usize,
}

/// Query rows per block of the SIMT attn_prefill (BQ in ops/attn_prefill.cu.tera).
pub const PREFILL_ROWS: usize = 16;

/// Dynamic shared memory of the SIMT attn_prefill, bytes (see ops/attn_prefill.cu.tera).
pub fn prefill_smem_bytes(head_dim: usize, kv_bytes: usize) -> usize {
    const BQ: usize = PREFILL_ROWS;
    const BK: usize = 32;
    BQ * (head_dim + 4) * 4 + BK * (head_dim * kv_bytes + 16) + BQ * BK * 4 + BQ * 4
}

/// Launch geometry of an attn_prefill instance: (query rows per block, dynamic shared bytes).
/// Tensor-core instances (ops/attn_prefill_mma.cu.tera) carry their tile as params `bq`, `bk`:
/// Q, K and V tiles of f16 rows `head_dim + 8` wide plus the row positions.
pub fn prefill_geometry(spec: &KernelSpec, head_dim: usize, kv_bytes: usize) -> (usize, usize) {
    match (spec.param_u32("bq"), spec.param_u32("bk")) {
        (Some(bq), Some(bk)) if spec.template.ends_with("attn_prefill_mma.cu.tera") => {
            let (bq, bk) = (bq as usize, bk as usize);
            (bq, (bq + 2 * bk) * (head_dim + 8) * 2 + bq * 4)
        }
        _ => (PREFILL_ROWS, prefill_smem_bytes(head_dim, kv_bytes)),
    }
}

fn head_dim_of(op: &'static str, spec: &KernelSpec) -> Result<usize, CudaError> {
    spec.key
        .head_dim
        .value()
        .map(|d| d as usize)
        .ok_or_else(|| invalid(op, format!("instance {} has no head_dim", spec.name)))
}

impl CudaDevice {
    /// Store `n` rows of `k`, `v` (f32 `[n][hkv * head_dim]`) into the caches at positions
    /// `pos[0..n]` (device memory), converted to the instance's quant (FP8: each row scaled on
    /// its own, its scale into `scales`). Rows at positions outside `[0, capacity)` are skipped
    /// by the kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_write_rows(
        &self,
        spec: &'static KernelSpec,
        layout: &KvLayout,
        n: usize,
        scales: KvScales,
        k: DevPtr<f32>,
        v: DevPtr<f32>,
        pos: DevPtr<i32>,
        k_cache: DevPtr<u8>,
        v_cache: DevPtr<u8>,
    ) -> Result<(), CudaError> {
        const OP: &str = "kv_write";
        if spec.key.op != Op::KvWrite {
            return Err(invalid(
                OP,
                format!("instance {} is not kv_write", spec.name),
            ));
        }
        let kvb = kv_elem_bytes(spec.key.quant)
            .ok_or_else(|| invalid(OP, format!("no cache layout for {}", spec.key.quant)))?;
        if kvb != layout.elem_bytes {
            return Err(invalid(
                OP,
                format!(
                    "{} into a cache of {}-byte elements",
                    spec.name, layout.elem_bytes
                ),
            ));
        }
        layout.check(OP, k_cache, v_cache)?;
        scales.check(OP, layout)?;
        let row = layout.hkv * layout.head_dim;
        if n == 0 {
            return Ok(());
        }
        if k.len() < n * row || v.len() < n * row || pos.len() < n {
            return Err(invalid(
                OP,
                format!(
                    "{n} rows of {row}: k {} v {} pos {}",
                    k.len(),
                    v.len(),
                    pos.len()
                ),
            ));
        }
        let i = |v: usize| i32::try_from(v).map_err(|_| invalid(OP, format!("{v} exceeds i32")));
        let (hkv, d, pg, cap, ring) = (
            i(layout.hkv)?,
            i(layout.head_dim)?,
            i(layout.page_size)?,
            i(layout.capacity)?,
            i(layout.ring_pages)?,
        );
        let grid_x = u32::try_from(n).map_err(|_| invalid(OP, "too many rows".into()))?;
        if layout.hkv > 65535 {
            return Err(invalid(OP, "more than 65535 KV heads".into()));
        }
        let (ks, vs) = scales.raw();
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: (grid_x, layout.hkv as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (kr, vr, pr, kcr, vcr) = (k.raw(), v.raw(), pos.raw(), k_cache.raw(), v_cache.raw());
        let mut b = self.stream().launch_builder(&f);
        b.arg(&kr).arg(&vr).arg(&pr).arg(&kcr).arg(&vcr);
        b.arg(&hkv)
            .arg(&d)
            .arg(&pg)
            .arg(&cap)
            .arg(&ring)
            .arg(&ks)
            .arg(&vs);
        // SAFETY: matches ops/kv_write (k, v, pos, k_cache, v_cache, hkv, d, page_size,
        // capacity, ring_pages, k_scales, v_scales); k / v / pos sizes checked above; the
        // caches hold `layout.bytes()` (ring_pages pages) and an FP8 cache's scales a value per
        // row (checked), the kernel skips positions outside [0, capacity) and takes every page
        // index modulo ring_pages.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// Prefill attention: `q` f32 `[n][hq][d]`, row i at position `pos[i]` (device memory),
    /// over the caches (identity page order) -> `out` f32 `[n][hq][d]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_prefill(
        &self,
        spec: &'static KernelSpec,
        p: &AttnPrefillLaunch,
        layout: &KvLayout,
        q: DevPtr<f32>,
        pos: DevPtr<i32>,
        k_cache: DevPtr<u8>,
        v_cache: DevPtr<u8>,
        scales: KvScales,
        out: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "attn_prefill";
        if spec.key.op != Op::AttnPrefill {
            return Err(invalid(
                OP,
                format!("instance {} is not attn_prefill", spec.name),
            ));
        }
        let d = head_dim_of(OP, spec)?;
        let kvb = kv_elem_bytes(spec.key.quant)
            .ok_or_else(|| invalid(OP, format!("no cache layout for {}", spec.key.quant)))?;
        if layout.head_dim != d || layout.elem_bytes != kvb || layout.hkv != p.hkv {
            return Err(invalid(
                OP,
                format!("{} over a cache {layout:?} with hkv={}", spec.name, p.hkv),
            ));
        }
        layout.check(OP, k_cache, v_cache)?;
        scales.check(OP, layout)?;
        if p.hkv == 0 || p.hq % p.hkv != 0 || p.hq > 65535 || p.n == 0 {
            return Err(invalid(OP, format!("hq={} hkv={} n={}", p.hq, p.hkv, p.n)));
        }
        let rows = p.n * p.hq * d;
        if q.len() < rows || out.len() < rows || pos.len() < p.n {
            return Err(invalid(
                OP,
                format!(
                    "{} rows: q {} out {} pos {}",
                    p.n,
                    q.len(),
                    out.len(),
                    pos.len()
                ),
            ));
        }
        let i = |v: usize| i32::try_from(v).map_err(|_| invalid(OP, format!("{v} exceeds i32")));
        let (n, hq, hkv, pg, cap, ring, win) = (
            i(p.n)?,
            i(p.hq)?,
            i(p.hkv)?,
            i(layout.page_size)?,
            i(layout.capacity)?,
            i(layout.ring_pages)?,
            i(p.window)?,
        );
        let (ks, vs) = scales.raw();
        let (rows_per_block, smem) = prefill_geometry(spec, d, kvb);
        let f = self.function(spec)?;
        f.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(drv(format!(
            "raising dynamic shared memory to {smem} bytes"
        )))?;
        let cfg = LaunchConfig {
            grid_dim: (p.n.div_ceil(rows_per_block) as u32, p.hq as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (qr, pr, kr, vr, or) = (q.raw(), pos.raw(), k_cache.raw(), v_cache.raw(), out.raw());
        let mut b = self.stream().launch_builder(&f);
        b.arg(&qr).arg(&pr).arg(&kr).arg(&vr).arg(&or);
        b.arg(&n)
            .arg(&hq)
            .arg(&hkv)
            .arg(&pg)
            .arg(&cap)
            .arg(&ring)
            .arg(&p.scale)
            .arg(&ks)
            .arg(&vs)
            .arg(&p.softcap)
            .arg(&win);
        // SAFETY: matches ops/attn_prefill (q, pos, k_cache, v_cache, out, n, hq, hkv,
        // page_size, capacity, ring_pages, qk_scale, k_scales, v_scales, softcap, window); q /
        // out / pos sizes, the cache layout and an FP8 cache's scales checked above; the kernel
        // never reads keys at or past `capacity` and takes every page index modulo ring_pages.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }
}

/// Bytes per cache element of an attention instance's quant (FP8 E4M3: 1, F16: 2; others have
/// no attention template).
pub fn kv_elem_bytes(q: Quant) -> Option<usize> {
    match q {
        Quant::Fp8E4m3 => Some(1),
        Quant::F16 => Some(2),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_math() {
        let l = KvLayout {
            hkv: 2,
            head_dim: 128,
            page_size: 64,
            capacity: 130,
            ring_pages: 3,
            elem_bytes: 1,
        };
        assert_eq!(l.pages(), 3);
        assert_eq!(l.bytes(), 3 * 2 * 64 * 128);
        assert_eq!(l.elem_offset(0, 0), 0);
        assert_eq!(l.elem_offset(1, 0), 128);
        assert_eq!(l.elem_offset(0, 1), 64 * 128);
        assert_eq!(l.elem_offset(64, 0), 2 * 64 * 128);
        assert_eq!(l.elem_offset(129, 1), ((2 * 2 + 1) * 64 + 1) * 128);
        // every (position, head) row is distinct and inside the cache
        let mut seen = std::collections::HashSet::new();
        for p in 0..l.capacity {
            for h in 0..l.hkv {
                let o = l.elem_offset(p, h);
                assert!(o + l.head_dim <= l.bytes());
                assert!(seen.insert(o));
            }
        }
        let f16 = KvLayout { elem_bytes: 2, ..l };
        assert_eq!(f16.bytes(), 2 * l.bytes());
        // a ring of 2 pages: position p shares its row with p +- 128, and with nothing closer
        let r = KvLayout {
            capacity: 1000,
            ring_pages: 2,
            ..l
        };
        assert_eq!(r.pages(), 16);
        assert_eq!(r.bytes(), 2 * 2 * 64 * 128);
        for p in 0..r.capacity {
            let o = r.elem_offset(p, 1);
            assert!(o + r.head_dim <= r.bytes());
            assert_eq!(o, r.elem_offset(p % 128, 1));
            assert_eq!(o, l.elem_offset(p % 128, 1));
        }
        for bad in [0, 17] {
            let b = KvLayout {
                ring_pages: bad,
                ..r
            };
            let e = b.check("t", DevPtr::null(), DevPtr::null()).unwrap_err();
            assert!(e.to_string().contains("ring pages"), "{e}");
        }
    }

    #[test]
    fn prefill_shared_memory_fits_every_target() {
        // sm_121a (GB10) allows 99 KB of dynamic shared memory per block
        for d in [16, 32, 64, 128, 256, 512] {
            for b in [1, 2] {
                assert!(prefill_smem_bytes(d, b) <= 99 * 1024, "d={d} kvb={b}");
            }
        }
        assert_eq!(
            prefill_smem_bytes(512, 2),
            16 * 516 * 4 + 32 * 1040 + 2048 + 64
        );
    }
}
