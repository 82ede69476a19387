//! One CUDA device: context, stream, PTX cache and the modules loaded from it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr};
use cudarc::nvrtc::Ptx;

use super::error::{drv, CudaError};
use crate::kernels::{self, BatchBucket, Entry, HeadDim, KernelKey, KernelSpec, Op, Quant, SmArch};
use codegen::ptx::{CacheConfig, PtxCache};

/// The source NVRTC compiles for `spec`: the rendered template (profiling builds may put
/// `#define` lines in front: `dev_defines`).
fn source_of(spec: &'static KernelSpec) -> std::borrow::Cow<'static, str> {
    #[cfg(feature = "profiling")]
    return super::dev_defines::source_of(spec);
    #[cfg(not(feature = "profiling"))]
    std::borrow::Cow::Borrowed(spec.source)
}

/// A CUDA device with its primary context, one stream and a module cache keyed by kernel key.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    cc: (u32, u32),
    arches: Vec<SmArch>,
    ptx: PtxCache,
    modules: Mutex<HashMap<KernelKey, Arc<CudaModule>>>,
    /// Main entry points, resolved once (launch paths do no string work).
    functions: Mutex<HashMap<KernelKey, CudaFunction>>,
    /// `<name>__<suffix>` entries whose dynamic shared memory limit was raised, loaded once.
    functions_smem: Mutex<HashMap<(KernelKey, Option<Entry>), CudaFunction>>,
    capture: super::graph::CaptureFlag,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("cc", &self.cc)
            .field("arches", &self.arches)
            .finish()
    }
}

impl CudaDevice {
    /// Open device `ordinal` with the PTX cache configured from the environment
    /// (`FUCINA_CACHE_DIR`, `FUCINA_STRICT_KERNELS`).
    pub fn new(ordinal: usize) -> Result<CudaDevice, CudaError> {
        CudaDevice::with_cache(ordinal, CacheConfig::from_env()?)
    }

    /// Open device `ordinal` with an explicit PTX cache configuration.
    pub fn with_cache(ordinal: usize, cache: CacheConfig) -> Result<CudaDevice, CudaError> {
        if !crate::backend::cuda::cuda_available() {
            return Err(CudaError::NoDevice);
        }
        let ctx = CudaContext::new(ordinal).map_err(drv(format!("opening device {ordinal}")))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("reading compute capability"))?;
        let (major, minor) = (major as u32, minor as u32);
        let arches = SmArch::candidates_for(major, minor);
        if arches.is_empty() {
            return Err(CudaError::UnsupportedDevice { major, minor });
        }
        // One stream per device, ordered by construction: cudarc's per-slice event tracking
        // (on once a second stream exists) would record and wait on events inside CUDA graph
        // captures, which invalidates them.
        // SAFETY: every slice of this context is allocated, used and freed on `stream` only, so
        // stream order alone keeps uses after allocation and frees after uses.
        unsafe { ctx.disable_event_tracking() };
        // a created stream, not the legacy default one: CUDA graphs can capture it
        let stream = ctx.new_stream().map_err(drv("creating stream"))?;
        Ok(CudaDevice {
            ctx,
            stream,
            cc: (major, minor),
            arches,
            ptx: PtxCache::new(cache),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            functions_smem: Mutex::new(HashMap::new()),
            capture: Default::default(),
        })
    }

    pub fn name(&self) -> String {
        self.ctx
            .name()
            .unwrap_or_else(|_| "unknown CUDA device".into())
    }

    /// (major, minor) compute capability.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.cc
    }

    /// The device's own arch (its `a` target when we have one, else the best generic one).
    pub fn arch(&self) -> SmArch {
        self.arches[0]
    }

    /// Every arch whose PTX this device can run, best first.
    pub fn runnable_arches(&self) -> &[SmArch] {
        &self.arches
    }

    pub(in crate::backend::cuda) fn capture_flag(&self) -> &super::graph::CaptureFlag {
        &self.capture
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn ptx_cache(&self) -> &PtxCache {
        &self.ptx
    }

    /// Best instance of (op, quant, head_dim, batch) for this device.
    pub fn resolve(
        &self,
        op: Op,
        quant: Quant,
        head_dim: HeadDim,
        batch: BatchBucket,
    ) -> Result<&'static KernelSpec, CudaError> {
        Ok(kernels::resolve(
            op, quant, head_dim, batch, self.cc.0, self.cc.1,
        )?)
    }

    /// The module of `spec`, compiled through the PTX cache and loaded once.
    pub fn module(&self, spec: &'static KernelSpec) -> Result<Arc<CudaModule>, CudaError> {
        if !self.arches.contains(&spec.key.arch) {
            return Err(CudaError::WrongArch {
                name: spec.name,
                arch: spec.key.arch,
                major: self.cc.0,
                minor: self.cc.1,
            });
        }
        if let Some(m) = self
            .modules
            .lock()
            .ok()
            .and_then(|m| m.get(&spec.key).cloned())
        {
            return Ok(m);
        }
        let ptx = self
            .ptx
            .get_or_compile(spec.name, &source_of(spec), spec.key.arch)?;
        let module = self
            .ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(drv(format!("loading module {}", spec.name)))?;
        if let Ok(mut m) = self.modules.lock() {
            m.insert(spec.key, module.clone());
        }
        Ok(module)
    }

    /// Compile (or fetch from the disk cache) the PTX of every instance this device can run,
    /// on a few threads with a progress bar when `show_progress` (first start after an
    /// install or a template change). Returns how many instances were covered.
    pub fn precompile(&self, show_progress: bool) -> Result<usize, CudaError> {
        self.precompile_where(|_| true, show_progress)
    }

    /// [`Self::precompile`] of the instances whose key `keep` takes.
    pub fn precompile_where(
        &self,
        keep: impl Fn(&kernels::KernelKey) -> bool,
        show_progress: bool,
    ) -> Result<usize, CudaError> {
        let specs: Vec<&'static KernelSpec> = kernels::KERNELS
            .iter()
            .filter(|s| self.arches.contains(&s.key.arch) && keep(&s.key))
            .collect();
        let sources: Vec<std::borrow::Cow<'static, str>> =
            specs.iter().map(|s| source_of(s)).collect();
        let jobs: Vec<codegen::ptx::Job<'_>> = specs
            .iter()
            .zip(&sources)
            .map(|(s, src)| codegen::ptx::Job {
                name: s.name,
                source: src,
                arch: s.key.arch,
            })
            .collect();
        codegen::ptx::compile_many(&self.ptx, &jobs, show_progress)?;
        Ok(jobs.len())
    }

    /// The main kernel (`extern "C"` name = `spec.name`).
    pub fn function(&self, spec: &'static KernelSpec) -> Result<CudaFunction, CudaError> {
        if let Some(f) = self
            .functions
            .lock()
            .ok()
            .and_then(|m| m.get(&spec.key).cloned())
        {
            return Ok(f);
        }
        let f = self
            .module(spec)?
            .load_function(spec.name)
            .map_err(drv(format!("finding {}", spec.name)))?;
        if let Ok(mut m) = self.functions.lock() {
            m.insert(spec.key, f.clone());
        }
        Ok(f)
    }

    /// The secondary entry `e` of the same module (its name from the registry; an instance
    /// that does not define it is an error naming both).
    pub fn function_entry(
        &self,
        spec: &'static KernelSpec,
        e: Entry,
    ) -> Result<CudaFunction, CudaError> {
        let name = spec.entry(e).ok_or_else(|| CudaError::Invalid {
            op: "kernel entry",
            detail: format!("{} defines no __{e} entry", spec.name),
        })?;
        self.module(spec)?
            .load_function(name)
            .map_err(drv(format!("finding {name}")))
    }

    /// The main entry of `spec` with its dynamic shared memory limit raised to `smem` bytes,
    /// configured once per instance (`smem` must not change).
    pub fn function_smem(
        &self,
        spec: &'static KernelSpec,
        smem: usize,
    ) -> Result<CudaFunction, CudaError> {
        self.smem_raised(spec, None, smem, || self.function(spec))
    }

    /// [`Self::function_entry`] with its dynamic shared memory limit raised to `smem` bytes,
    /// loaded and configured once per (instance, entry); `smem` must not change per entry.
    pub fn function_entry_smem(
        &self,
        spec: &'static KernelSpec,
        e: Entry,
        smem: usize,
    ) -> Result<CudaFunction, CudaError> {
        self.smem_raised(spec, Some(e), smem, || self.function_entry(spec, e))
    }

    /// The entry `load` gives (None: the main one), its dynamic shared memory limit raised to
    /// `smem` bytes, cached per (instance, entry).
    fn smem_raised(
        &self,
        spec: &'static KernelSpec,
        entry: Option<Entry>,
        smem: usize,
        load: impl FnOnce() -> Result<CudaFunction, CudaError>,
    ) -> Result<CudaFunction, CudaError> {
        let key = (spec.key, entry);
        if let Some(f) = self
            .functions_smem
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return Ok(f);
        }
        let f = load()?;
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(drv(format!(
            "raising {} {} shared memory to {smem} bytes",
            spec.name,
            entry.map_or("main entry", |e| e.as_str())
        )))?;
        if let Ok(mut m) = self.functions_smem.lock() {
            m.insert(key, f.clone());
        }
        Ok(f)
    }

    /// Copy host data to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, CudaError> {
        self.stream
            .clone_htod(data)
            .map_err(drv("host->device copy"))
    }

    /// Copy a device buffer back to the host (synchronises the stream).
    pub fn download<T: DeviceRepr>(&self, s: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        self.stream.clone_dtoh(s).map_err(drv("device->host copy"))
    }

    /// A device buffer of `n` f32 all equal to `value` (NaN to poison outputs in tests).
    pub fn filled_f32(&self, n: usize, value: f32) -> Result<CudaSlice<f32>, CudaError> {
        self.upload(&vec![value; n])
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(drv("stream synchronize"))
    }
}
