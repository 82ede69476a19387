//! A background device-to-host read of one sampled id: a stream-ordered copy into page-locked
//! host memory and an event behind it, so the host can queue more work (the next decode step)
//! before it waits for the id.

use cudarc::driver::sys;

use super::buf::DevPtr;
use super::error::CudaError;

fn check(r: sys::CUresult, what: &'static str) -> Result<(), CudaError> {
    super::error::cu_check(r, "readback", what)
}

/// One i32 of page-locked host memory and the event that says it has landed.
#[derive(Debug)]
pub struct TokenReadback {
    host: *mut i32,
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
                sys::cuMemHostAlloc(&mut host, 4, 0),
                "allocating page-locked memory",
            )?;
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
            event,
            pending: false,
        })
    }

    /// Queue the copy of `src[0]` on `stream` (after everything queued so far) and the event.
    pub fn start(&mut self, stream: sys::CUstream, src: DevPtr<i32>) -> Result<(), CudaError> {
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
        // SAFETY: the event was recorded by `start`; once it completes, the copy into `host`
        // has landed and nothing else writes it.
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
