//! Device memory of the CUDA backend: typed raw device pointers (what kernels take), owned
//! buffers, and a caching pool.
//!
//! Every forward pass allocates its activations from [`Pool`]; once warm, the pool hands back
//! buffers it already holds and calls the driver for nothing. That keeps a decode step cheap and
//! lets a captured CUDA graph bake the addresses of its intermediate buffers: the whole backend
//! runs on one stream, so a buffer returned to the pool and handed out again is only touched in
//! stream order, and a replayed graph rewrites every intermediate before reading it.
//!
//! Weights and other long-lived state use [`Pool::alloc_persistent`]: not cached, freed to the
//! driver on drop. KV caches use [`Pool::alloc_recycled`]: long-lived too, but a dropped one is
//! kept (by exact size) for the next session's cache, so that opening a session allocates nothing
//! from the driver and dropping one waits for nothing.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaSlice, CudaStream, DevicePtr, DeviceRepr};

use super::error::{drv, CudaError};

/// A typed device pointer with the number of `T` it may address. Plain data: it does not own the
/// memory, and kernels launched with it are `unsafe` for that reason. `len` is what launch helpers
/// validate against.
pub struct DevPtr<T> {
    ptr: u64,
    len: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}

impl<T> std::fmt::Debug for DevPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DevPtr({:#x}, {} x {})",
            self.ptr,
            self.len,
            std::any::type_name::<T>()
        )
    }
}

impl<T> DevPtr<T> {
    /// # Safety
    /// `ptr` must address `len` values of `T` in device memory for as long as the pointer is used.
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
        DevPtr {
            ptr,
            len,
            _t: PhantomData,
        }
    }

    /// A null pointer of length 0 (for optional kernel arguments).
    pub fn null() -> Self {
        DevPtr {
            ptr: 0,
            len: 0,
            _t: PhantomData,
        }
    }

    /// The address (what a kernel parameter `T*` receives).
    pub fn raw(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// `len` values starting at `start`, or None when out of range.
    pub fn slice(&self, start: usize, len: usize) -> Option<DevPtr<T>> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| DevPtr {
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len,
            _t: PhantomData,
        })
    }

    /// The same bytes seen as `U` (the length rounds down to whole `U`).
    pub fn cast<U>(&self) -> DevPtr<U> {
        DevPtr {
            ptr: self.ptr,
            len: self.bytes() / std::mem::size_of::<U>().max(1),
            _t: PhantomData,
        }
    }
}

impl<T: DeviceRepr> DevPtr<T> {
    /// The pointer of a cudarc slice (the backend disables cudarc's event tracking, so taking the
    /// pointer records nothing).
    pub fn of(s: &CudaSlice<T>) -> DevPtr<T> {
        let (ptr, _sync) = s.device_ptr(s.stream());
        DevPtr {
            ptr,
            len: s.len(),
            _t: PhantomData,
        }
    }
}

/// Usage counters of a [`Pool`], in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Pooled buffers handed out now.
    pub in_use: usize,
    /// Pooled buffers held for reuse.
    pub cached: usize,
    /// Highest `in_use + cached + persistent` seen.
    pub peak: usize,
    /// Live persistent and recycled buffers (weights, caches).
    pub persistent: usize,
}

#[derive(Default)]
struct PoolInner {
    free: HashMap<usize, Vec<u64>>,
    /// Buffers first handed out while a CUDA graph was being captured: they are the graphs'
    /// intermediates, rewritten by every replay, so they only ever serve other captures.
    graph_free: HashMap<usize, Vec<u64>>,
    /// Dropped recycled buffers by exact size (counted in `cached`).
    recycled: HashMap<usize, Vec<u64>>,
    /// A capture is in progress: allocations come from (and return to) `graph_free`.
    capturing: bool,
    stats: PoolStats,
}

impl PoolInner {
    /// The free list buffers of `kind` return to (persistent ones are never listed).
    fn list(&mut self, kind: Kind) -> &mut HashMap<usize, Vec<u64>> {
        match kind {
            Kind::Pooled => &mut self.free,
            Kind::Graph => &mut self.graph_free,
            Kind::Recycled | Kind::Persistent => &mut self.recycled,
        }
    }

    /// The counter of live buffers of `kind`.
    fn live(&mut self, kind: Kind) -> &mut usize {
        match kind {
            Kind::Pooled | Kind::Graph => &mut self.stats.in_use,
            Kind::Recycled | Kind::Persistent => &mut self.stats.persistent,
        }
    }

    fn bump_peak(&mut self) {
        let s = &mut self.stats;
        s.peak = s.peak.max(s.in_use + s.cached + s.persistent);
    }
}

/// A caching device allocator bound to one stream (see the module docs).
pub struct Pool {
    stream: Arc<CudaStream>,
    inner: Mutex<PoolInner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Size class of a pooled request: small sizes round to a power of two (at least 256 bytes),
/// large ones to a multiple of 2 MiB, so repeated shapes land in the same class.
fn size_class(bytes: usize) -> usize {
    const MIB: usize = 1 << 20;
    let b = bytes.max(256);
    if b < MIB {
        b.next_power_of_two()
    } else {
        b.div_ceil(2 * MIB) * 2 * MIB
    }
}

/// Make the stream's context current on this thread (cudarc's own calls do this; the raw driver
/// calls here must too: a model loaded on one thread runs on the engine's thread).
pub(crate) fn bind(stream: &CudaStream) -> Result<(), CudaError> {
    stream
        .context()
        .bind_to_thread()
        .map_err(drv("binding the CUDA context to this thread"))
}

fn oom(bytes: usize) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
    drv(format!("allocating {bytes} bytes of device memory"))
}

impl Pool {
    pub fn new(stream: Arc<CudaStream>) -> Arc<Pool> {
        Arc::new(Pool {
            stream,
            inner: Mutex::new(PoolInner::default()),
        })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolInner> {
        // a panic while holding the lock leaves only counters behind: keep going
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Route allocations to the graph-private lists while a CUDA graph is captured (see
    /// `PoolInner::graph_free`): a buffer a graph writes on every replay must never be handed
    /// to a tensor that outlives the step, or a later replay would overwrite it.
    pub fn set_capturing(&self, on: bool) {
        self.lock().capturing = on;
    }

    /// A pooled buffer of at least `bytes` bytes (contents undefined).
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DevBuf, CudaError> {
        self.take(bytes, size_class(bytes), false)
    }

    /// A buffer of `class` bytes from the free list of its kind (pooled, graph-private or
    /// recycled), else from the driver.
    fn take(
        self: &Arc<Self>,
        bytes: usize,
        class: usize,
        recycled: bool,
    ) -> Result<DevBuf, CudaError> {
        let (kind, reused) = {
            let mut g = self.lock();
            let kind = match (recycled, g.capturing) {
                (true, _) => Kind::Recycled,
                (false, true) => Kind::Graph,
                (false, false) => Kind::Pooled,
            };
            let p = g.list(kind).get_mut(&class).and_then(|v| v.pop());
            if p.is_some() {
                g.stats.cached -= class;
                *g.live(kind) += class;
            }
            (kind, p)
        };
        let ptr = match reused {
            Some(p) => p,
            None => {
                bind(&self.stream)?;
                // SAFETY: plain allocation; back to the pool's lists on drop, freed by `trim` (or
                // never: cached buffers live as long as the pool's owner keeps the context).
                let p = unsafe { result::malloc_sync(class) }.map_err(oom(class))?;
                let mut g = self.lock();
                *g.live(kind) += class;
                g.bump_peak();
                p
            }
        };
        Ok(DevBuf {
            ptr,
            bytes,
            class,
            kind,
            pool: self.clone(),
        })
    }

    /// A long-lived buffer of exactly `bytes` bytes, freed to the driver on drop.
    pub fn alloc_persistent(self: &Arc<Self>, bytes: usize) -> Result<DevBuf, CudaError> {
        let b = bytes.max(1);
        bind(&self.stream)?;
        // SAFETY: plain allocation, freed in DevBuf::drop.
        let ptr = unsafe { result::malloc_sync(b) }.map_err(oom(b))?;
        let mut g = self.lock();
        g.stats.persistent += b;
        g.bump_peak();
        Ok(DevBuf {
            ptr,
            bytes,
            class: b,
            kind: Kind::Persistent,
            pool: self.clone(),
        })
    }

    /// A long-lived buffer of exactly `bytes` bytes (contents undefined) that returns to the
    /// pool on drop and serves the next request of the same size: a KV cache's memory, reused
    /// by the next session of the same model. Stream order makes the reuse safe, as for pooled
    /// buffers; [`Pool::trim`] frees the ones not in use.
    pub fn alloc_recycled(self: &Arc<Self>, bytes: usize) -> Result<DevBuf, CudaError> {
        self.take(bytes, bytes.max(1), true)
    }

    /// A buffer from `alloc` (one of the pool's allocators) holding a copy of `data`.
    fn upload_with<T: DeviceRepr>(
        self: &Arc<Self>,
        data: &[T],
        alloc: fn(&Arc<Self>, usize) -> Result<DevBuf, CudaError>,
    ) -> Result<DevBuf, CudaError> {
        let buf = alloc(self, std::mem::size_of_val(data))?;
        buf.write(data)?;
        Ok(buf)
    }

    /// A persistent buffer holding a copy of `data`.
    pub fn upload_persistent<T: DeviceRepr>(
        self: &Arc<Self>,
        data: &[T],
    ) -> Result<DevBuf, CudaError> {
        self.upload_with(data, Self::alloc_persistent)
    }

    /// A recycled buffer ([`Pool::alloc_recycled`]) holding a copy of `data`.
    pub fn upload_recycled<T: DeviceRepr>(
        self: &Arc<Self>,
        data: &[T],
    ) -> Result<DevBuf, CudaError> {
        self.upload_with(data, Self::alloc_recycled)
    }

    /// A pooled buffer holding a copy of `data` (not allowed during graph capture).
    pub fn upload<T: DeviceRepr>(self: &Arc<Self>, data: &[T]) -> Result<DevBuf, CudaError> {
        self.upload_with(data, Self::alloc)
    }

    /// Free every cached buffer back to the driver. Invalidates every captured CUDA graph (their
    /// intermediates came from the pool): drop those graphs first.
    pub fn trim(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(drv("synchronising before trim"))?;
        bind(&self.stream)?;
        let mut g = self.lock();
        let mut lists: Vec<_> = g.free.drain().collect();
        lists.extend(g.graph_free.drain());
        lists.extend(g.recycled.drain());
        for (class, ptrs) in lists {
            for p in ptrs {
                // SAFETY: cached buffers are owned by the pool and unused (stream synchronised).
                unsafe { result::free_sync(p) }.map_err(drv("freeing cached device memory"))?;
                let _ = class;
            }
        }
        g.stats.cached = 0;
        Ok(())
    }

    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    fn release(&self, class: usize, ptr: u64, kind: Kind) {
        let mut g = self.lock();
        if kind != Kind::Persistent {
            *g.live(kind) -= class;
            g.stats.cached += class;
            g.list(kind).entry(class).or_default().push(ptr);
        } else {
            g.stats.persistent -= class;
            drop(g);
            // Work queued on the stream may still use the buffer: wait for it first.
            let _ = bind(&self.stream);
            let _ = self.stream.synchronize();
            // SAFETY: a persistent buffer is owned by exactly one DevBuf, dropped now.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }
}

/// How a [`DevBuf`] came about, which says where it goes when dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// [`Pool::alloc`]: back to the pool's size-class lists.
    Pooled,
    /// [`Pool::alloc`] during a capture: back to the graph-private lists.
    Graph,
    /// [`Pool::alloc_persistent`]: freed to the driver.
    Persistent,
    /// [`Pool::alloc_recycled`]: back to the exact-size lists.
    Recycled,
}

/// An owned device buffer (pooled, persistent or recycled). Dropping it returns it to the pool
/// (pooled, recycled) or frees it (persistent). Stream order makes reuse safe: see the module
/// docs.
pub struct DevBuf {
    ptr: u64,
    /// Bytes requested (the allocation may be larger).
    bytes: usize,
    class: usize,
    kind: Kind,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for DevBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        self.pool.release(self.class, self.ptr, self.kind);
    }
}

impl DevBuf {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The buffer as `T` values (the length rounds down).
    pub fn ptr<T>(&self) -> DevPtr<T> {
        // SAFETY: the buffer holds `bytes` bytes while `self` lives.
        unsafe { DevPtr::from_raw(self.ptr, self.bytes / std::mem::size_of::<T>().max(1)) }
    }

    pub fn f32(&self) -> DevPtr<f32> {
        self.ptr()
    }

    pub fn u8(&self) -> DevPtr<u8> {
        self.ptr()
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Copy `data` into the start of the buffer (stream-ordered; `data` is staged before return).
    pub fn write<T: DeviceRepr>(&self, data: &[T]) -> Result<(), CudaError> {
        let n = std::mem::size_of_val(data);
        if n > self.bytes {
            return Err(CudaError::Invalid {
                op: "upload",
                detail: format!("{n} bytes into a buffer of {}", self.bytes),
            });
        }
        if n == 0 {
            return Ok(());
        }
        bind(&self.pool.stream)?;
        // SAFETY: the destination holds `n` bytes; a pageable source is staged before the call
        // returns, so `data` may go away afterwards.
        unsafe { result::memcpy_htod_async(self.ptr, data, self.pool.stream.cu_stream()) }
            .map_err(drv("host->device copy"))
    }

    /// Copy the first `len` values back to the host (synchronises the stream).
    pub fn read<T: DeviceRepr + Default + Clone>(&self, len: usize) -> Result<Vec<T>, CudaError> {
        read_ptr(&self.pool.stream, self.ptr::<T>(), len)
    }

    /// Set every byte to `value` (stream-ordered, capturable).
    pub fn fill_bytes(&self, value: u8) -> Result<(), CudaError> {
        memset(&self.pool.stream, self.u8(), value)
    }
}

/// Copy the first `len` values at `p` back to the host (synchronises the stream).
pub fn read_ptr<T: DeviceRepr + Default + Clone>(
    stream: &CudaStream,
    p: DevPtr<T>,
    len: usize,
) -> Result<Vec<T>, CudaError> {
    if len > p.len() {
        return Err(CudaError::Invalid {
            op: "download",
            detail: format!("{len} values from a buffer of {}", p.len()),
        });
    }
    let mut out = vec![T::default(); len];
    bind(stream)?;
    if len > 0 {
        // SAFETY: `p` addresses `len` values; the stream is synchronised before `out` is used.
        unsafe { result::memcpy_dtoh_async(&mut out, p.raw(), stream.cu_stream()) }
            .map_err(drv("device->host copy"))?;
    }
    stream.synchronize().map_err(drv("stream synchronize"))?;
    Ok(out)
}

/// Copy `data` to the start of `p` (stream-ordered; `data` is staged before return).
pub fn write_ptr<T: DeviceRepr>(
    stream: &CudaStream,
    p: DevPtr<T>,
    data: &[T],
) -> Result<(), CudaError> {
    if data.len() > p.len() {
        return Err(CudaError::Invalid {
            op: "upload",
            detail: format!("{} values into a buffer of {}", data.len(), p.len()),
        });
    }
    if data.is_empty() {
        return Ok(());
    }
    bind(stream)?;
    // SAFETY: `p` addresses at least `data.len()` values; a pageable source is staged before
    // the call returns.
    unsafe { result::memcpy_htod_async(p.raw(), data, stream.cu_stream()) }
        .map_err(drv("host->device copy"))
}

/// Device-to-device copy of `src` into `dst` (same length), stream-ordered and capturable.
pub fn copy<T>(stream: &CudaStream, dst: DevPtr<T>, src: DevPtr<T>) -> Result<(), CudaError> {
    if dst.len() != src.len() {
        return Err(CudaError::Invalid {
            op: "copy",
            detail: format!("{} values into {}", src.len(), dst.len()),
        });
    }
    if src.is_empty() {
        return Ok(());
    }
    bind(stream)?;
    // SAFETY: both pointers address `bytes` bytes (their contract).
    unsafe { result::memcpy_dtod_async(dst.raw(), src.raw(), src.bytes(), stream.cu_stream()) }
        .map_err(drv("device->device copy"))
}

/// Set every byte of `p` to `value`.
pub fn memset<T>(stream: &CudaStream, p: DevPtr<T>, value: u8) -> Result<(), CudaError> {
    if p.is_empty() {
        return Ok(());
    }
    bind(stream)?;
    // SAFETY: `p` addresses `bytes` bytes (its contract).
    unsafe { result::memset_d8_async(p.raw(), value, p.bytes(), stream.cu_stream()) }
        .map_err(drv("memset"))
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<DevBuf>();
    f::<DevPtr<f32>>();
    let _ = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_group_repeated_shapes() {
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class((1 << 20) - 1), 1 << 20);
        assert_eq!(size_class(1 << 20), 2 << 20);
        assert_eq!(size_class((2 << 20) + 1), 4 << 20);
    }

    #[test]
    fn slices_and_casts_stay_in_range() {
        let p: DevPtr<f32> = unsafe { DevPtr::from_raw(0x1000, 10) };
        let s = p.slice(2, 8).unwrap();
        assert_eq!((s.raw(), s.len()), (0x1008, 8));
        assert!(p.slice(3, 8).is_none());
        assert!(p.slice(usize::MAX, 2).is_none());
        assert_eq!(p.cast::<u8>().len(), 40);
        assert_eq!(p.cast::<u64>().len(), 5);
    }
}
