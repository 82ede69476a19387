//! The CUDA side of `fucina bench`: the device probe (read bandwidth with the `read_bw` kernel,
//! pool and driver memory) and the one function that builds the backend.

use std::sync::Arc;

use anyhow::Result;
use cudarc::driver::sys;

use super::measure::Probe;
use crate::backend::cuda::{CudaDevice, KvType, Pool};
use crate::kernels::{BatchBucket, HeadDim, Op, Quant};

/// Probe of one CUDA device and the pool the backend allocates from.
pub struct CudaProbe {
    pub dev: Arc<CudaDevice>,
    pub pool: Arc<Pool>,
    pub kv_type: KvType,
}

impl Probe for CudaProbe {
    /// The `read_bw` kernel over `bytes` (at least 1 GiB), 8 blocks per SM; the median of 10
    /// event-timed reads after one warm-up.
    fn read_bandwidth(&self, bytes: usize) -> Result<f64> {
        let bytes = bytes.max(1 << 30) / 16 * 16;
        let dev = &self.dev;
        let spec = dev.resolve(Op::ReadBw, Quant::F32, HeadDim::Any, BatchBucket::Any)?;
        let sms = dev.sm_count()?;
        let grid = sms * 8;
        let s = dev.stream();
        let buf = s.alloc_zeros::<u8>(bytes)?;
        let mut sink = s.alloc_zeros::<u32>(grid as usize * 256)?;
        dev.read_bw(spec, &buf, &mut sink, grid)?;
        let mut t = Vec::new();
        for _ in 0..10 {
            let a = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            dev.read_bw(spec, &buf, &mut sink, grid)?;
            let b = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            t.push(a.elapsed_ms(&b)? as f64);
        }
        t.sort_by(|x, y| x.total_cmp(y));
        Ok(bytes as f64 / t[t.len() / 2] / 1e6)
    }

    fn memory(&self) -> Option<(u64, u64, u64)> {
        let st = self.pool.stats();
        let (free, total) = self.dev.context().mem_get_info().ok()?;
        Some((st.peak as u64, st.persistent as u64, (total - free) as u64))
    }

    fn kv_elem_bytes(&self) -> f64 {
        self.kv_type.bytes() as f64
    }

    fn idle(&self) -> Result<()> {
        Ok(self.dev.synchronize()?)
    }
}

/// Run the bench on CUDA device `ordinal`: the only place that names the CUDA backend.
pub fn run(
    path: &std::path::Path,
    ordinal: usize,
    kv_type: KvType,
    plan: &super::measure::Plan,
    log: &mut dyn FnMut(&str),
) -> Result<super::measure::Report> {
    let be = Arc::new(crate::backend::cuda::CudaBackend::new(ordinal, kv_type)?);
    // the batched decode's sequences side by side in a KV arena (one launch per layer's
    // attention for all of them)
    be.reserve_kv_slots(plan.batch.iter().copied().max().unwrap_or(0));
    let probe = CudaProbe {
        dev: be.dev.clone(),
        pool: be.pool.clone(),
        kv_type,
    };
    super::measure::run(path, be, &probe, plan, log)
}
