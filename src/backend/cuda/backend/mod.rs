//! [`CudaBackend`]: the `Backend` trait on one CUDA device. Models run on it unchanged.
//!
//! Split by concern: `weights.rs` (upload), `linear.rs` (GEMV / GEMM), `elementwise.rs`
//! (elementwise, shape, norms, RoPE, embedding), `fused.rs` (add + norm, attention input),
//! `step.rs` (a step's token ids and positions in device memory), `sampler.rs` (the
//! per-sequence sampler and its launches). KV cache, attention and MoE delegate to `CudaDevice` methods
//! in `ops/attention/kv.rs` / `ops/moe/pipeline.rs`.
//!
//! Everything runs on the device's one stream; ops allocate their outputs from the pool and
//! never synchronise, except `to_host`. Kernels are resolved once per (op, quant, batch) and
//! kept with their loaded function, so a launch does no lookup by name.

mod attend;
mod attend_seqs;
mod elementwise;
mod fused;
mod linear;
mod linear_pipe;
mod linear_res;
mod moe;
mod qkv_prep;
pub(super) mod sampler;
mod step;
mod weights;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use super::ops::attention::arena::KvArena;
use super::CudaDevice;
use crate::backend::cuda::ops::attention::cache::GpuKvCache;
use crate::backend::cuda::runtime::buf::{read_ptr, DevBuf, Pool, PoolStats};
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::graph::StepGraph;
use crate::backend::cuda::runtime::kern::KernEntry;
use crate::backend::cuda::runtime::kern::{Kern, KernQ8};
use crate::backend::cuda::runtime::types::{GpuTensor, GpuWeight, KvType};
use crate::backend::cuda::CudaSamplerState;
use crate::backend::{
    Activation, AttnParams, AttnPrep, BackendError, Fused, KvShape, MoeParams, Norm, Ops, PostNorm,
    RecordedStep, Result, Rope, Runtime, Sampling, Step, StepOf, StepPlan,
};
use crate::kernels::{BatchBucket, Entry, Op, Quant};
use crate::weights::TensorRef;

pub use step::GpuStep;

/// Whether decode attention writes its output's int8 side-car (`FUCINA_ATTN_Q8=0` turns it off:
/// the O projection then quantises in a launch of its own; read once).
pub fn attn_q8_enabled() -> bool {
    crate::tuning::get().attn_q8
}

/// (op, quant, batch bucket, entry suffix) of a secondary kernel entry.
type EntryKey = (Op, Quant, BatchBucket, Entry);

/// The CUDA backend: a device, its memory pool and the options the models' ops need.
pub struct CudaBackend {
    pub dev: Arc<CudaDevice>,
    pub pool: Arc<Pool>,
    pub kv_type: KvType,
    /// Multiprocessor count (GEMV grid sizing).
    sms: u32,
    /// Resolved kernels by (op, quant, batch).
    kernels: Mutex<HashMap<(Op, Quant, BatchBucket), Kern>>,
    /// The prefill GEMM's tile entries, loaded on first use (None: not on this device).
    gemm_pipe: std::sync::OnceLock<Option<super::GemmPipe>>,
    gemm_pipe_f16: std::sync::OnceLock<Option<super::GemmPipe>>,
    /// Their int8 side-car entries (`__q8`) by op (rmsnorm, geglu, swiglu: f32 instances).
    kernels_q8: Mutex<HashMap<Op, KernQ8>>,
    /// Extra entries (`__<suffix>`: the multi-row forms) by (op, quant, suffix).
    kernels_entry: Mutex<HashMap<EntryKey, KernEntry>>,
    /// RoPE frequency divisors on the device, keyed by their bits.
    freq: Mutex<HashMap<Vec<u32>, DevBuf>>,
    /// Weight bytes copied to the device so far (for a progress bar).
    progress: Arc<AtomicUsize>,
    /// The fused MoE router's arrival counters (u32, one per token, zero between launches).
    moe_counters: DevBuf,
    /// Whether decode defers RMSNorms (`linear_res.rs`): None follows `FUCINA_DEFER_NORM` and
    /// the measured default.
    defer_norm: Option<bool>,
    /// Whether a deferred norm's q4_kr + q6_kr consumers run as one `__rsqv` launch: None
    /// follows `FUCINA_RSQV` (on unless 0).
    rsqv: Option<bool>,
    /// Whether q4_kr deferred-norm consumers take the wide entries (`rs_wide`): None follows
    /// the launch's size.
    rs_wide: Option<bool>,
    /// Whether a decode row's q|k|v projection and attn_prep run as one `__qkvp` launch
    /// (`linear_attn_prep`): None follows `FUCINA_QKV_PREP` (on unless 0).
    qkv_prep: Option<bool>,
    /// Whether a deferred norm's gate|up runs as one `__glurs` launch (`glurs_entry`): None
    /// follows `FUCINA_GLURS` (on unless 0).
    glurs: Option<bool>,
    /// Page-locked id readbacks of finished samplers, for the next ones.
    pub(crate) readbacks: Arc<crate::backend::cuda::runtime::readback::ReadbackPool>,
    /// The KV arena sequences' caches are laid out in ([`Self::reserve_kv_slots`]); None: every
    /// cache its own buffers.
    kv_arena: Mutex<Option<Arc<KvArena>>>,
    /// The formats of the weights uploaded so far (`precompile_model`).
    weight_quants: Mutex<std::collections::BTreeSet<Quant>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("dev", &self.dev)
            .field("kv_type", &self.kv_type)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CudaBackend {
    /// This backend deferring RMSNorms wherever its kernels take them (`true`) or nowhere,
    /// whatever `FUCINA_DEFER_NORM` and the default say (the selftest's deferred rows).
    pub fn with_defer_norm(mut self, on: bool) -> Self {
        self.defer_norm = Some(on);
        self
    }

    /// This backend running a deferred norm's q4_kr + q6_kr consumers as one `__rsqv` launch
    /// (`true`) or as two, whatever `FUCINA_RSQV` says (the selftest's rows).
    pub fn with_rsqv(mut self, on: bool) -> Self {
        self.rsqv = Some(on);
        self
    }

    /// This backend running a deferred norm's gate|up as one `__glurs` launch where it fits one
    /// wave (`true`) or as `__rs` + the GLU kernel, whatever `FUCINA_GLURS` says (the
    /// selftest's rows).
    pub fn with_glurs(mut self, on: bool) -> Self {
        self.glurs = Some(on);
        self
    }

    /// This backend running q4_kr deferred-norm consumers of rows up to 4096 through the wide
    /// entries (`__rsw`, `__rsqvw`) or not, whatever the launch's size (the selftest's rows).
    pub fn with_rs_wide(mut self, on: bool) -> Self {
        self.rs_wide = Some(on);
        self
    }

    /// Open device `ordinal` (PTX cache from the environment) with a pool on its stream.
    pub fn new(ordinal: usize, kv_type: KvType) -> std::result::Result<CudaBackend, CudaError> {
        Self::with_device(Arc::new(CudaDevice::new(ordinal)?), kv_type)
    }

    /// This backend running a decode row's q|k|v projection and attn_prep as one `__qkvp`
    /// launch where it applies (`true`) or never, whatever `FUCINA_QKV_PREP` says (the
    /// selftest's rows).
    pub fn with_qkv_prep(mut self, on: bool) -> Self {
        self.qkv_prep = Some(on);
        self
    }

    /// The device's name (as the driver reports it).
    pub fn device_name(&self) -> String {
        self.dev.name()
    }

    /// A backend on an already opened device.
    pub fn with_device(
        dev: Arc<CudaDevice>,
        kv_type: KvType,
    ) -> std::result::Result<CudaBackend, CudaError> {
        if kv_type == KvType::F32 {
            return Err(CudaError::Invalid {
                op: "kv_cache",
                detail: "the CUDA backend keeps its KV cache in f16 or fp8 (--kv-type)".into(),
            });
        }
        let pool = Pool::new(dev.stream().clone());
        let sms = dev.sm_count()?;
        let moe_counters = pool.upload_persistent(
            &[0u32; crate::backend::cuda::ops::moe::decode::MOE_DECODE_MAX_TOKENS],
        )?;
        Ok(CudaBackend {
            dev,
            pool,
            kv_type,
            sms,
            kernels: Mutex::new(HashMap::new()),
            gemm_pipe: std::sync::OnceLock::new(),
            gemm_pipe_f16: std::sync::OnceLock::new(),
            kernels_q8: Mutex::new(HashMap::new()),
            kernels_entry: Mutex::new(HashMap::new()),
            freq: Mutex::new(HashMap::new()),
            progress: Arc::new(AtomicUsize::new(0)),
            moe_counters,
            defer_norm: None,
            rsqv: None,
            rs_wide: None,
            qkv_prep: None,
            glurs: None,
            readbacks: Arc::default(),
            kv_arena: Mutex::new(None),
            weight_quants: Mutex::default(),
        })
    }

    /// Compile (or fetch from the disk cache) the PTX of every kernel instance this device
    /// resolves to for the formats of the weights uploaded so far, the float formats and the
    /// cache type, on several threads with a progress bar when `show_progress` (a server's
    /// start on a cold kernel cache: the warm-up then finds them compiled). Returns the
    /// instances covered.
    pub fn precompile_model(&self, show_progress: bool) -> std::result::Result<usize, CudaError> {
        let mut quants = lock(&self.weight_quants).clone();
        quants.extend([Quant::F32, Quant::F16, Quant::Bf16]);
        quants.insert(crate::backend::cuda::ops::attention::kv::kv_quant(
            self.kv_type,
        ));
        // the instance the device resolves each key to (not the generic fallbacks)
        let dev = &self.dev;
        dev.precompile_where(
            |k| {
                quants.contains(&k.quant)
                    && dev
                        .resolve(k.op, k.quant, k.head_dim, k.batch)
                        .is_ok_and(|r| r.key == *k)
            },
            show_progress,
        )
    }

    /// Lay the caches of up to `slots` sequences out side by side (a KV arena, allocated at the
    /// next sequence's request, sized for `slots` of them): a step of several of those sequences
    /// then writes K/V and runs decode attention of a layer in one launch each. Sequences past
    /// `slots` get caches of their own. 0 turns the arena off (sequences already in it keep
    /// their slots).
    pub fn reserve_kv_slots(&self, slots: usize) {
        *lock(&self.kv_arena) = (slots > 0).then(|| KvArena::new(slots));
    }

    /// The KV arena, if one is reserved.
    pub(super) fn kv_arena(&self) -> Option<Arc<KvArena>> {
        lock(&self.kv_arena).clone()
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> std::result::Result<(usize, usize), CudaError> {
        self.dev
            .context()
            .mem_get_info()
            .map_err(crate::backend::cuda::runtime::error::drv(
                "reading device memory info",
            ))
    }

    /// Usage counters of the pool (activations, weights and caches).
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Weight bytes uploaded so far; a caller may poll it from another thread to draw a
    /// progress bar while the model loads.
    pub fn upload_progress(&self) -> Arc<AtomicUsize> {
        self.progress.clone()
    }

    /// The kernel of `(op, quant, batch)`, resolved and loaded once.
    pub(crate) fn kern(&self, op: Op, quant: Quant, batch: BatchBucket) -> Result<Kern> {
        let key = (op, quant, batch);
        if let Some(k) = lock(&self.kernels).get(&key) {
            return Ok(k.clone());
        }
        let k = self.dev.kern(op, quant, batch)?;
        lock(&self.kernels).insert(key, k.clone());
        Ok(k)
    }

    /// The side-car entry of the f32 instance of `op` (rmsnorm, geglu, swiglu), loaded once.
    pub(crate) fn kern_q8(&self, op: Op) -> Result<KernQ8> {
        if let Some(k) = lock(&self.kernels_q8).get(&op) {
            return Ok(k.clone());
        }
        let k = self
            .dev
            .kern_q8(&self.kern(op, Quant::F32, BatchBucket::Any)?)?;
        lock(&self.kernels_q8).insert(op, k.clone());
        Ok(k)
    }

    /// The entry `entry` of the (op, quant) instance, loaded once.
    pub(crate) fn kern_entry(&self, op: Op, quant: Quant, entry: Entry) -> Result<KernEntry> {
        self.kern_entry_at(op, quant, BatchBucket::Any, entry)
    }

    /// The entry `entry` of the (op, quant, batch) instance, loaded once.
    pub(crate) fn kern_entry_at(
        &self,
        op: Op,
        quant: Quant,
        batch: BatchBucket,
        entry: Entry,
    ) -> Result<KernEntry> {
        let key = (op, quant, batch, entry);
        if let Some(k) = lock(&self.kernels_entry).get(&key) {
            return Ok(k.clone());
        }
        let k = self.dev.kern_entry(&self.kern(op, quant, batch)?, entry)?;
        lock(&self.kernels_entry).insert(key, k.clone());
        Ok(k)
    }
}

fn gdn_unsupported(op: &'static str) -> BackendError {
    BackendError::Unsupported {
        op,
        backend: "cuda",
        detail:
            "Qwen3.5 Gated DeltaNet layers do not run on the CUDA backend yet; use --device cpu"
                .into(),
    }
}

impl Runtime for CudaBackend {
    type Tensor = GpuTensor;

    type Weight = GpuWeight;

    type KvCache = GpuKvCache;

    type StepData = GpuStep;

    fn step(&self, plan: StepPlan) -> Result<StepOf<Self>> {
        if self.dev.capturing() {
            return Err(BackendError::Device(
                "a step is made before recording, not while".into(),
            ));
        }
        let dev = GpuStep::new(&self.pool, &plan)?;
        Ok(Step::new(plan, dev))
    }

    fn step_set(&self, step: &mut StepOf<Self>, plan: StepPlan) -> Result<()> {
        if self.dev.capturing() {
            return Err(BackendError::Device(
                "a step is rewritten before recording, not while".into(),
            ));
        }
        let (p, dev) = step.parts_mut();
        dev.set(&self.pool, &plan)?;
        *p = plan;
        Ok(())
    }

    fn lacks(&self, need: crate::backend::Need) -> Option<String> {
        use crate::backend::Need;
        Some(match need {
            Need::GatedDeltaNet => {
                "Qwen3.5 / 3.6 Gated DeltaNet layers have no CUDA kernels yet".to_string()
            }
            Need::Nvfp4Weights => "NVFP4 weights have no CUDA kernels yet".to_string(),
        })
    }

    fn record_begin(&self, _step: &StepOf<Self>) -> Result<bool> {
        if !crate::tuning::get().graphs {
            return Ok(false);
        }
        self.dev.capture_begin()?;
        self.pool.set_capturing(true);
        Ok(true)
    }

    fn record_end(&self, step: &StepOf<Self>) -> Result<RecordedStep> {
        self.pool.set_capturing(false);
        let graph = self.dev.capture_end()?;
        Ok(RecordedStep(Box::new(Recorded {
            graph,
            step: step::step_addr(step),
        })))
    }

    fn record_abort(&self) {
        self.pool.set_capturing(false);
        self.dev.capture_abort();
    }

    fn replay(&self, rec: &RecordedStep, step: &StepOf<Self>) -> Result<()> {
        let r = rec
            .0
            .downcast_ref::<Recorded>()
            .ok_or_else(|| BackendError::Unsupported {
                op: "replay",
                backend: "cuda",
                detail: "not a step recorded by the CUDA backend".into(),
            })?;
        if r.step != step::step_addr(step) {
            return Err(BackendError::Shape {
                op: "replay",
                detail: "a recording replays only over the step it was recorded with".into(),
            });
        }
        Ok(self.dev.replay(&r.graph)?)
    }

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn kv_bytes(&self, elems: usize) -> u64 {
        self.kv_type.bytes_for(elems)
    }

    fn free_memory(&self) -> Option<u64> {
        self.dev
            .context()
            .mem_get_info()
            .ok()
            .map(|(f, _)| f as u64)
    }

    fn upload(&self, w: &TensorRef<'_>) -> Result<GpuWeight> {
        self.upload_weight(w)
    }

    fn tensor(&self, data: &[f32], rows: usize, cols: usize) -> Result<GpuTensor> {
        if data.len() != rows * cols {
            return Err(BackendError::Shape {
                op: "tensor",
                detail: format!("{} values for [{rows}, {cols}]", data.len()),
            });
        }
        let t = self.alloc_tensor(rows, cols)?;
        t.buf.write(data)?;
        Ok(t)
    }

    fn to_host(&self, t: &GpuTensor) -> Result<Vec<f32>> {
        Ok(read_ptr(self.pool.stream(), t.ptr(), t.len())?)
    }

    fn dims(&self, t: &GpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn weight_vector(&self, w: &GpuWeight) -> Result<GpuTensor> {
        let src = match (&w.f32, w.quant) {
            (Some(b), _) => b,
            (None, Quant::F32) => &w.data,
            _ => {
                return Err(BackendError::Unsupported {
                    op: "weight_vector",
                    backend: "cuda",
                    detail: format!("a {} weight of shape {:?}", w.quant, w.shape),
                })
            }
        };
        let n: usize = w.shape.iter().product();
        let t = self.alloc_tensor(1, n)?;
        crate::backend::cuda::runtime::buf::copy(
            self.pool.stream(),
            t.ptr(),
            linear::slice(src.f32(), n)?,
        )?;
        Ok(t)
    }

    fn kv_cache(&self, shape: KvShape) -> Result<GpuKvCache> {
        Ok(self.dev.kv_cache_new(&self.pool, shape, self.kv_type)?)
    }

    fn kv_caches(&self, shapes: &[KvShape]) -> Result<Vec<GpuKvCache>> {
        if let Some(arena) = self.kv_arena() {
            match self
                .dev
                .kv_caches_in(&self.pool, &arena, shapes, self.kv_type)
            {
                Ok(Some(c)) => return Ok(c),
                Ok(None) => {}
                Err(e) => {
                    // (laying the arena out failed: out of memory, say) caches of their own
                    tracing::warn!(
                        "KV arena of {} sequences: {e}; sequences get caches of their own",
                        arena.slots()
                    );
                    self.reserve_kv_slots(0);
                }
            }
        }
        shapes.iter().map(|s| self.kv_cache(*s)).collect()
    }

    fn kv_truncate(&self, cache: &mut GpuKvCache, len: usize) -> Result<()> {
        // positions beyond `len` are simply overwritten by later writes
        cache.len = len;
        Ok(())
    }
}

impl Ops for CudaBackend {
    fn embed(&self, table: &GpuWeight, step: &StepOf<Self>, scale: f32) -> Result<GpuTensor> {
        self.embed_impl(table, step, scale)
    }

    fn linear(&self, x: &GpuTensor, w: &GpuWeight) -> Result<GpuTensor> {
        self.linear_impl(x, w)
    }

    fn add(&self, a: &GpuTensor, b: &GpuTensor) -> Result<GpuTensor> {
        self.add_impl(a, b)
    }

    fn mul(&self, a: &GpuTensor, b: &GpuTensor) -> Result<GpuTensor> {
        self.mul_impl(a, b)
    }

    fn scale(&self, a: &GpuTensor, s: f32) -> Result<GpuTensor> {
        self.scale_impl(a, s)
    }

    fn glu(&self, gate: &GpuTensor, up: &GpuTensor, act: Activation) -> Result<GpuTensor> {
        self.glu_impl(gate, up, act)
    }

    fn sigmoid_gate(&self, x: &GpuTensor, gate: &GpuTensor) -> Result<GpuTensor> {
        self.sigmoid_gate_impl(x, gate)
    }

    fn softcap(&self, x: &GpuTensor, cap: f32) -> Result<GpuTensor> {
        self.softcap_impl(x, cap)
    }

    fn slice_cols(&self, x: &GpuTensor, start: usize, len: usize) -> Result<GpuTensor> {
        self.slice_cols_impl(x, start, len)
    }

    fn slice_rows(&self, x: &GpuTensor, start: usize, len: usize) -> Result<GpuTensor> {
        self.slice_rows_impl(x, start, len)
    }

    fn concat_cols(&self, parts: &[&GpuTensor]) -> Result<GpuTensor> {
        self.concat_cols_impl(parts)
    }

    fn concat_rows(&self, parts: &[&GpuTensor]) -> Result<GpuTensor> {
        self.concat_rows_impl(parts)
    }

    fn split_heads(
        &self,
        x: &GpuTensor,
        n_heads: usize,
        sizes: &[usize],
    ) -> Result<Vec<GpuTensor>> {
        self.split_heads_impl(x, n_heads, sizes)
    }

    fn rms_norm(
        &self,
        x: &GpuTensor,
        w: Norm<'_, GpuTensor>,
        eps: f32,
        dim: usize,
    ) -> Result<GpuTensor> {
        self.rms_norm_impl(x, w, eps, dim)
    }

    fn l2_norm(&self, x: &GpuTensor, eps: f32, dim: usize) -> Result<GpuTensor> {
        self.l2_norm_impl(x, eps, dim)
    }

    fn rope(
        &self,
        x: &GpuTensor,
        n_heads: usize,
        step: &StepOf<Self>,
        rope: &Rope,
    ) -> Result<GpuTensor> {
        self.rope_impl(x, n_heads, step, rope)
    }

    fn kv_write(
        &self,
        cache: &mut GpuKvCache,
        step: &StepOf<Self>,
        k: &GpuTensor,
        v: &GpuTensor,
    ) -> Result<()> {
        let width = cache.shape.n_kv_heads * cache.shape.head_dim;
        if k.rows != v.rows || k.cols != width || v.cols != width {
            return Err(BackendError::Shape {
                op: "kv_write",
                detail: format!(
                    "k [{}, {}] / v [{}, {}] for {} heads x {}",
                    k.rows, k.cols, v.rows, v.cols, cache.shape.n_kv_heads, cache.shape.head_dim
                ),
            });
        }
        if k.rows == 0 {
            return Ok(());
        }
        let seq = step.plan().seq_of("kv_write", k.rows)?;
        let pos = step.dev().positions("kv_write", k.rows)?;
        self.dev.kv_write(cache, pos, k.ptr(), v.ptr(), k.rows)?;
        cache.len = cache.len.max(seq.pos0 + k.rows);
        Ok(())
    }

    fn attention(
        &self,
        q: &GpuTensor,
        cache: &GpuKvCache,
        step: &StepOf<Self>,
        p: &AttnParams,
    ) -> Result<GpuTensor> {
        self.attention_impl(q, cache, step, p)
    }

    fn moe(
        &self,
        x: &GpuTensor,
        router_logits: &GpuTensor,
        gate: &GpuWeight,
        up: &GpuWeight,
        down: &GpuWeight,
        p: &MoeParams,
    ) -> Result<GpuTensor> {
        if router_logits.rows != x.rows || router_logits.cols != p.n_experts {
            return Err(BackendError::Shape {
                op: "moe",
                detail: format!(
                    "router logits [{}, {}] for {} rows and {} experts",
                    router_logits.rows, router_logits.cols, x.rows, p.n_experts
                ),
            });
        }
        let buf = self.dev.moe(
            &self.pool,
            x.ptr(),
            x.rows,
            router_logits.ptr(),
            gate,
            up,
            down,
            p,
        )?;
        if buf.bytes() < x.len() * 4 {
            return Err(BackendError::Device(format!(
                "moe returned {} bytes for [{}, {}]",
                buf.bytes(),
                x.rows,
                x.cols
            )));
        }
        Ok(GpuTensor::new(buf, x.rows, x.cols))
    }

    fn causal_conv1d_silu(
        &self,
        _x: &GpuTensor,
        _w: &GpuWeight,
        _state: &mut GpuTensor,
    ) -> Result<GpuTensor> {
        Err(gdn_unsupported("causal_conv1d_silu"))
    }

    fn gdn_gates(
        &self,
        _a: &GpuTensor,
        _b: &GpuTensor,
        _neg_a: &GpuTensor,
        _dt_bias: &GpuTensor,
    ) -> Result<(GpuTensor, GpuTensor)> {
        Err(gdn_unsupported("gdn_gates"))
    }

    fn gated_delta_rule(
        &self,
        _q: &GpuTensor,
        _k: &GpuTensor,
        _v: &GpuTensor,
        _g: &GpuTensor,
        _beta: &GpuTensor,
        _state: &mut GpuTensor,
        _dk: usize,
        _dv: usize,
    ) -> Result<GpuTensor> {
        Err(gdn_unsupported("gated_delta_rule"))
    }
}

impl Fused for CudaBackend {
    fn add_rms_norm_moe_routed(
        &self,
        h: &GpuTensor,
        y: &GpuTensor,
        w: Norm<'_, GpuTensor>,
        eps: f32,
        router: &GpuWeight,
        gate: &GpuWeight,
        up: &GpuWeight,
        down: &GpuWeight,
        p: &MoeParams,
    ) -> Result<Option<(GpuTensor, GpuTensor)>> {
        self.add_rms_norm_moe_impl(h, y, w, eps, router, gate, up, down, p)
    }

    fn glu_fused(&self, x: &GpuTensor, act: Activation) -> Result<GpuTensor> {
        self.glu_fused_impl(x, act)
    }

    fn linear_add_rms_norm_then(
        &self,
        x: &GpuTensor,
        w: &GpuWeight,
        h: &GpuTensor,
        norm: Norm<'_, GpuTensor>,
        eps: f32,
        next: &crate::backend::NormNext<'_, GpuWeight>,
    ) -> Result<(GpuTensor, Vec<GpuTensor>)> {
        self.linear_add_rms_norm_then_impl(x, w, h, norm, eps, next)
    }

    fn defers_norm(
        &self,
        w: &GpuWeight,
        next: &crate::backend::NormNext<'_, GpuWeight>,
    ) -> Result<bool> {
        self.defers_norm_impl(w, next)
    }

    fn linear_glu(&self, x: &GpuTensor, w: &GpuWeight, act: Activation) -> Result<GpuTensor> {
        self.linear_glu_impl(x, w, act)
    }

    fn add_rms_norm(
        &self,
        h: &GpuTensor,
        y: &GpuTensor,
        w: Norm<'_, GpuTensor>,
        eps: f32,
        dim: usize,
    ) -> Result<(GpuTensor, GpuTensor)> {
        self.add_rms_norm_impl(h, y, w, eps, dim)
    }

    fn norm_add_rms_norm(
        &self,
        h: &GpuTensor,
        y: &GpuTensor,
        post: &PostNorm<'_, GpuTensor>,
        w: Norm<'_, GpuTensor>,
        eps: f32,
        dim: usize,
    ) -> Result<(GpuTensor, GpuTensor)> {
        self.norm_add_rms_norm_impl(h, y, post, w, eps, dim)
    }

    fn attn_prep(
        &self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        cache: &mut GpuKvCache,
        step: &StepOf<Self>,
        p: &AttnPrep<'_, GpuTensor>,
    ) -> Result<GpuTensor> {
        self.attn_prep_impl(q, k, v, cache, step, p)
    }

    fn attn_prep_seqs(
        &self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        caches: &mut [&mut GpuKvCache],
        step: &StepOf<Self>,
        p: &AttnPrep<'_, GpuTensor>,
    ) -> Result<Option<GpuTensor>> {
        self.attn_prep_seqs_impl(q, k, v, caches, step, p)
    }

    fn attention_seqs(
        &self,
        q: &GpuTensor,
        caches: &[&GpuKvCache],
        step: &StepOf<Self>,
        p: &AttnParams,
    ) -> Result<Option<GpuTensor>> {
        self.attention_seqs_impl(q, caches, step, p)
    }

    fn linear_attn_prep(
        &self,
        x: &GpuTensor,
        w: &GpuWeight,
        cache: &mut GpuKvCache,
        step: &StepOf<Self>,
        p: &AttnPrep<'_, GpuTensor>,
    ) -> Result<Option<GpuTensor>> {
        self.linear_attn_prep_impl(x, w, cache, step, p)
    }

    fn moe_routed(
        &self,
        x: &GpuTensor,
        router: &GpuWeight,
        gate: &GpuWeight,
        up: &GpuWeight,
        down: &GpuWeight,
        p: &MoeParams,
    ) -> Result<GpuTensor> {
        if let Some(y) = self.moe_routed_fused(x, router, gate, up, down, p)? {
            return Ok(y);
        }
        let logits = self.linear(x, router)?;
        self.moe(x, &logits, gate, up, down, p)
    }
}

impl Sampling for CudaBackend {
    type SamplerState = CudaSamplerState;

    fn sampler_new(
        &self,
        params: &crate::sampling::SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> Result<CudaSamplerState> {
        self.sampler_new_impl(params, prompt, vocab)
    }

    fn sampler_accept(&self, state: &mut CudaSamplerState, id: u32) -> Result<()> {
        self.sampler_accept_impl(state, id)
    }

    fn sample(
        &self,
        logits: GpuTensor,
        state: &mut CudaSamplerState,
        banned: &[u32],
    ) -> Result<u32> {
        self.sample_impl(logits, state, banned)
    }

    fn sample_begin(
        &self,
        logits: &GpuTensor,
        state: &mut CudaSamplerState,
        banned: &[u32],
        feed: Option<(&mut StepOf<Self>, usize)>,
    ) -> Result<bool> {
        let feed = match feed {
            Some(_) if self.dev.capturing() => {
                return Err(BackendError::Device(
                    "a draw cannot feed a step while recording".into(),
                ))
            }
            Some((step, p)) => {
                let pos = i32::try_from(p).map_err(|_| BackendError::Shape {
                    op: "sample_begin",
                    detail: format!("position {p} exceeds i32"),
                })?;
                Some((step, p, pos))
            }
            None => None,
        };
        // the draw hands its id and the next position straight to the step's buffer, or
        // stream-ordered copies do after it
        let handover = handover_enabled();
        let slot = match &feed {
            Some((step, _, pos)) if handover => Some((step.dev().feed_slot()?, *pos)),
            _ => None,
        };
        if !self.sample_begin_impl(logits, state, banned, slot)? {
            return Ok(false);
        }
        if let Some((step, p, pos)) = feed {
            if !handover {
                let src = CudaBackend::sampled_id_ptr(state);
                step.dev().feed_from(&self.pool, src, pos)?;
            }
            let (plan, _) = step.parts_mut();
            *plan = StepPlan::fed(p)?;
        }
        Ok(true)
    }

    fn sample_finish(&self, state: &mut CudaSamplerState) -> Result<u32> {
        self.sample_finish_impl(state)
    }
}

/// Whether a pipelined draw hands its id over to the next step inside the `sample` kernel (the
/// next one-token step and mapped host memory: no copy on the stream between two steps),
/// unless `FUCINA_SAMPLE_HANDOVER=0` (read once; for A/B runs) keeps the stream-ordered copies.
pub(crate) fn handover_enabled() -> bool {
    crate::tuning::get().sample_handover
}

/// A recorded step: the graph and the device address of the step it reads.
struct Recorded {
    graph: StepGraph,
    step: u64,
}
