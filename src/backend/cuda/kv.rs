//! The KV cache on the device and attention over it: cache allocation, writes of new K/V rows
//! (converted to the cache type), and attention of any number of query rows (decode: one row;
//! prefill: many) over the cached positions.
//!
//! Positions come from device memory (`pos`: one i32 per row), so a decode step that calls these
//! can be captured once and replayed as a CUDA graph at any position.

use std::sync::Arc;

use super::buf::{DevBuf, DevPtr, Pool};
use super::error::CudaError;
use super::types::{GpuKvCache, KvType};
use super::CudaDevice;
use crate::backend::{AttnParams, KvShape};

fn todo_err(op: &'static str) -> CudaError {
    CudaError::Invalid {
        op,
        detail: "not implemented on the CUDA backend yet".into(),
    }
}

impl CudaDevice {
    /// A cache for `shape.capacity` positions of `shape.n_kv_heads` heads of `shape.head_dim`.
    pub fn kv_cache_new(
        &self,
        pool: &Arc<Pool>,
        shape: KvShape,
        kv_type: KvType,
    ) -> Result<GpuKvCache, CudaError> {
        let _ = (pool, shape, kv_type);
        Err(todo_err("kv_cache"))
    }

    /// Write `n` rows of `k`, `v` (f32 `[n, n_kv_heads * head_dim]`) at the positions `pos[0..n]`
    /// (device memory). Updates `cache.len` to `max(len, last host-known position + 1)` is the
    /// caller's job (the backend knows pos0 on the host).
    pub fn kv_write(
        &self,
        cache: &mut GpuKvCache,
        pos: DevPtr<i32>,
        k: DevPtr<f32>,
        v: DevPtr<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let _ = (cache, pos, k, v, n);
        Err(todo_err("kv_write"))
    }

    /// Causal attention of `n` query rows `q` (f32 `[n, n_heads * head_dim]`, row i at position
    /// `pos[i]`, device memory) over the cache's positions `0 ..= pos[i]` (limited by
    /// `p.window`), GQA by `p.n_heads / p.n_kv_heads`, scores times `p.scale`, optional tanh
    /// soft-cap. `max_pos` is a host-side bound on every `pos[i]` (launch sizing only). Returns
    /// `[n, n_heads * head_dim]` f32 from `pool`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        pool: &Arc<Pool>,
        q: DevPtr<f32>,
        n: usize,
        cache: &GpuKvCache,
        pos: DevPtr<i32>,
        max_pos: usize,
        p: &AttnParams,
    ) -> Result<DevBuf, CudaError> {
        let _ = (pool, q, n, cache, pos, max_pos, p);
        Err(todo_err("attention"))
    }
}
