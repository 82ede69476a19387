//! A background device-to-host read of one sampled id: page-locked host memory mapped into the
//! device and an event behind the write, so the host can queue more work (the next decode step)
//! before it waits for the id. The sample kernel writes the id there itself (`mirror`), so no
//! copy sits on the stream between two steps; `start` (a stream-ordered copy) serves callers
//! that did not pass the mirror to the kernel.

use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaStream};

use super::buf::DevPtr;
use super::error::CudaError;

fn check(r: sys::CUresult, what: &'static str) -> Result<(), CudaError> {
    super::error::cu_check(r, "readback", what)
}

/// One i32 of page-locked host memory and the event that says it has landed.
#[derive(Debug)]
pub struct TokenReadback {
    host: *mut i32,
    /// `host` as the device addresses it (mapped page-locked memory).
    dev: u64,
    event: sys::CUevent,
    /// A copy is queued and not yet waited for.
    pending: bool,
}

// SAFETY: the host word and the event are owned by this value only; the CUDA calls on them are
// thread-safe, and `&mut self` serialises this value's own use.
unsafe impl Send for TokenReadback {}

impl TokenReadback {
    /// Allocate the host word and the event (the caller has bound the context).
    pub fn new() -> Result<TokenReadback, CudaError> {
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: plain allocations; freed in Drop.
        unsafe {
            check(
                sys::cuMemHostAlloc(&mut host, 4, sys::CU_MEMHOSTALLOC_DEVICEMAP),
                "allocating page-locked memory",
            )?;
        }
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated just above with the device-map flag.
        if let Err(e) = unsafe {
            check(
                sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0),
                "mapping page-locked memory",
            )
        } {
            // SAFETY: allocated just above, not shared.
            unsafe { sys::cuMemFreeHost(host) };
            return Err(e);
        }
        let mut event: sys::CUevent = std::ptr::null_mut();
        // spin-waiting event without timing: the lowest-latency wait
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: as above.
        if let Err(e) = unsafe { check(sys::cuEventCreate(&mut event, flags), "creating an event") }
        {
            // SAFETY: allocated just above, not shared.
            unsafe { sys::cuMemFreeHost(host) };
            return Err(e);
        }
        Ok(TokenReadback {
            host: host.cast(),
            dev,
            event,
            pending: false,
        })
    }

    /// The host word as a device pointer (one i32): what the sample kernel's `mirror` takes.
    pub fn device_word(&self) -> DevPtr<i32> {
        // SAFETY: `dev` maps the 4 bytes of `host`, alive as long as `self`.
        unsafe { DevPtr::from_raw(self.dev, 1) }
    }

    /// Queue only the event, behind a kernel that writes the id to [`Self::device_word`] itself.
    pub fn start_mirrored(&mut self, stream: &CudaStream) -> Result<(), CudaError> {
        let stream = stream.cu_stream();
        // SAFETY: the event is ours; recording it on a live stream.
        unsafe { check(sys::cuEventRecord(self.event, stream), "recording an event")? };
        self.pending = true;
        Ok(())
    }

    /// Queue the copy of `src[0]` on `stream` (after everything queued so far) and the event.
    pub fn start(&mut self, stream: &CudaStream, src: DevPtr<i32>) -> Result<(), CudaError> {
        let stream = stream.cu_stream();
        if src.is_empty() {
            return Err(CudaError::Invalid {
                op: "readback",
                detail: "an empty source".into(),
            });
        }
        // SAFETY: `host` holds 4 bytes, page-locked (so the async copy is truly async); src
        // addresses at least one i32.
        unsafe {
            check(
                sys::cuMemcpyDtoHAsync_v2(self.host.cast(), src.raw(), 4, stream),
                "queueing the id's copy",
            )?;
            check(sys::cuEventRecord(self.event, stream), "recording an event")?;
        }
        self.pending = true;
        Ok(())
    }

    /// Wait for the queued copy and return the id.
    pub fn finish(&mut self) -> Result<i32, CudaError> {
        if !self.pending {
            return Err(CudaError::Invalid {
                op: "readback",
                detail: "no id was queued".into(),
            });
        }
        self.pending = false;
        // SAFETY: the event was recorded by `start` or `start_mirrored`; once it completes, the
        // copy or the kernel's write into `host` has landed and nothing else writes it.
        unsafe {
            check(sys::cuEventSynchronize(self.event), "waiting for the id")?;
            Ok(std::ptr::read_volatile(self.host))
        }
    }
}

impl Drop for TokenReadback {
    fn drop(&mut self) {
        // SAFETY: both were created in `new` and are released exactly once; a queued copy is
        // waited for first so the driver never writes freed memory.
        unsafe {
            if self.pending {
                let _ = sys::cuEventSynchronize(self.event);
            }
            let _ = sys::cuEventDestroy_v2(self.event);
            let _ = sys::cuMemFreeHost(self.host.cast());
        }
    }
}

/// Readbacks of finished samplers, kept for the next ones: a server makes a sampler per request,
/// and `cuMemHostAlloc` / `cuMemFreeHost` are slow driver calls that may wait for the device
/// (made at a sampler's first pipelined step, they sat between two queued decode steps).
#[derive(Debug, Default)]
pub struct ReadbackPool {
    free: Mutex<Vec<TokenReadback>>,
}

/// Readbacks a [`ReadbackPool`] keeps; more are freed (one per sampler alive at once).
const POOL_KEEP: usize = 16;

impl ReadbackPool {
    /// A readback from the pool, or a new one (the caller has bound the context).
    pub fn take(self: &Arc<Self>) -> Result<PooledReadback, CudaError> {
        let held = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let rb = match held {
            Some(rb) => rb,
            None => TokenReadback::new()?,
        };
        Ok(PooledReadback {
            rb: Some(rb),
            home: Arc::clone(self),
        })
    }
}

/// A [`TokenReadback`] on loan from a [`ReadbackPool`]: back to it when dropped (a queued read
/// waited for first).
#[derive(Debug)]
pub struct PooledReadback {
    rb: Option<TokenReadback>,
    home: Arc<ReadbackPool>,
}

impl std::ops::Deref for PooledReadback {
    type Target = TokenReadback;
    fn deref(&self) -> &TokenReadback {
        self.rb.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for PooledReadback {
    fn deref_mut(&mut self) -> &mut TokenReadback {
        self.rb.as_mut().expect("held until dropped")
    }
}

impl Drop for PooledReadback {
    fn drop(&mut self) {
        let Some(mut rb) = self.rb.take() else {
            return;
        };
        if rb.pending && rb.finish().is_err() {
            // a failed wait: the word may still be written; let TokenReadback's Drop free it
            return;
        }
        let mut free = self.home.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < POOL_KEEP {
            free.push(rb);
        }
    }
}
