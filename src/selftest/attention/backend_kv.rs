//! Backend-level GPU check of KV cache memory reuse: a dropped cache's buffers come back from
//! the pool (`Pool::alloc_recycled`) for the next cache of the same shape, and that cache reads
//! exactly as a freshly allocated one (every K / V byte zero, the same page table and zeroed
//! decode counters), although the dropped cache held written rows. Bound 0.

use crate::backend::cuda::ops::attention::kv::kv_layout;
use crate::backend::cuda::{GpuKvCache, KvType};
use crate::backend::KvShape;
use crate::backend::{Ops, Runtime};
use crate::selftest::backend_ops::{Ctx, Pair, R};
use crate::selftest::check::uniform;

pub(in crate::selftest) fn kv_recycle_cases(cx: &mut Ctx) {
    for kv in [KvType::Fp8E4m3, KvType::F16] {
        let (hkv, hd, cap) = (2, 128, 300);
        let rows = uniform(&mut cx.rng, 2 * cap * hkv * hd, -3.0, 3.0);
        let name = format!("kv_cache {kv:?} reused after a drop == a fresh cache (k, v, table)");
        let r = (|| -> R<Pair> {
            let gpu = crate::backend::cuda::CudaBackend::with_device(cx.gpu.dev.clone(), kv)?;
            let shape = KvShape::full(hkv, hd, cap);
            let raw = |c: &GpuKvCache| -> R<[u64; 2]> {
                let (k, v, _) = c.memory()?;
                Ok([k.raw(), v.raw()])
            };
            // a cache with every position written, then dropped
            let mut first = gpu.kv_cache(shape)?;
            let w = cap * hkv * hd;
            let (k, v) = (
                gpu.tensor(&rows[..w], cap, hkv * hd)?,
                gpu.tensor(&rows[w..], cap, hkv * hd)?,
            );
            gpu.kv_write(&mut first, &crate::backend::step_at(&gpu, 0, cap)?, &k, &v)?;
            let mut old = raw(&first)?;
            drop(first);
            let reused = gpu.kv_cache(shape)?;
            let fresh = gpu.kv_cache(shape)?;
            let mut now = raw(&reused)?;
            old.sort_unstable();
            now.sort_unstable();
            if old != now {
                anyhow::bail!("the new cache did not take the dropped cache's buffers");
            }
            let bytes = |c: &GpuKvCache| -> R<Vec<f32>> {
                let (mut out, v, _, _) = c.read_back(gpu.pool.stream())?;
                out.extend(v);
                if let Some(e) = &c.extra {
                    out.extend(e.read::<u8>(e.bytes())?);
                }
                Ok(out.into_iter().map(f32::from).collect())
            };
            let (got, want) = (bytes(&reused)?, bytes(&fresh)?);
            if want
                .iter()
                .take(2 * kv_layout(&shape, kv).bytes())
                .any(|&b| b != 0.0)
            {
                anyhow::bail!("a fresh cache is not zeroed");
            }
            Ok((got, want))
        })();
        cx.case(name, 0.0, |_| r);
    }
}
