//! A KV cache of one attention layer of one sequence ([`GpuKvCache`]): its shape, length and
//! extras, and where its K, V and row scales live (buffers of its own, or a slot of the KV
//! arena, `arena.rs`).

use cudarc::driver::CudaStream;

use super::launch::KvScales;
use crate::backend::cuda::runtime::buf::{read_ptr, write_ptr, DevBuf, DevPtr};
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::types::KvType;
use crate::backend::KvShape;

/// One attention layer's KV cache for one sequence (layout owned by `kv.rs`).
#[derive(Debug)]
pub struct GpuKvCache {
    pub shape: KvShape,
    pub kv_type: KvType,
    /// Positions written so far (all of `0..len` valid).
    pub len: usize,
    /// Layout-specific extras (page table, decode counters), owned by `kv.rs`.
    pub extra: Option<DevBuf>,
    /// Where K, V and the row scales live.
    pub mem: KvMem,
}

/// A cache's memory: buffers of its own, or a slot of the backend's KV arena
/// (`ops/attention/arena.rs`).
#[derive(Debug)]
pub enum KvMem {
    Own {
        k: DevBuf,
        v: DevBuf,
        /// An FP8 cache's row scales: f16 K scales then V scales, one per cache row each
        /// (`KvScales`); None for f16.
        scales: Option<DevBuf>,
    },
    Slot(super::arena::CacheSlot),
}

impl GpuKvCache {
    /// K, V and the row scales as the kernels take them (scales null for an f16 cache).
    pub fn memory(&self) -> Result<(DevPtr<u8>, DevPtr<u8>, KvScales), CudaError> {
        match &self.mem {
            KvMem::Own { k, v, scales } => Ok((k.u8(), v.u8(), own_scales(scales.as_ref()))),
            KvMem::Slot(s) => s.memory(),
        }
    }

    /// Every byte of K and V and the row scales (K's then V's; empty for f16), read back
    /// (synchronises `stream`; for checks).
    pub fn read_back(&self, stream: &CudaStream) -> Result<CacheContents, CudaError> {
        // the pointers span exactly the cache (its pages, a row scale per row)
        let (k, v, s) = self.memory()?;
        let scales = |p: DevPtr<u16>| read_ptr(stream, p, p.len());
        Ok((
            read_ptr(stream, k, k.len())?,
            read_ptr(stream, v, v.len())?,
            scales(s.k)?,
            scales(s.v)?,
        ))
    }

    /// Overwrite K and V from their start with `k` and `v` (stream-ordered; for checks).
    pub fn write_back(&self, stream: &CudaStream, k: &[u8], v: &[u8]) -> Result<(), CudaError> {
        let (kp, vp, _) = self.memory()?;
        write_ptr(stream, kp, k)?;
        write_ptr(stream, vp, v)
    }

    /// The arena slot this cache lives in, if any.
    pub fn slot(&self) -> Option<&super::arena::CacheSlot> {
        match &self.mem {
            KvMem::Slot(s) => Some(s),
            KvMem::Own { .. } => None,
        }
    }
}

/// A cache's K bytes, V bytes, K row scales and V row scales (the scales empty for f16).
pub type CacheContents = (Vec<u8>, Vec<u8>, Vec<u16>, Vec<u16>);

/// The K and V halves of an own cache's scale buffer.
fn own_scales(b: Option<&DevBuf>) -> KvScales {
    match b {
        Some(b) => {
            let all = b.ptr::<u16>();
            let rows = all.len() / 2;
            KvScales {
                k: all.slice(0, rows).unwrap_or(all),
                v: all.slice(rows, rows).unwrap_or(all),
            }
        }
        None => KvScales::none(),
    }
}
