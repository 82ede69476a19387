//! CUDA graphs of decode steps: capture the ops one forward pass launches on the device's stream,
//! replay them with a single launch. Inputs that change per step (token id, position) live in
//! device memory written before each replay, so one capture serves every position.

use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{sys, CudaGraph};

use super::error::{drv, CudaError};
use super::CudaDevice;

/// A captured, instantiated step.
pub struct StepGraph {
    graph: CudaGraph,
}

// SAFETY: a CudaGraph is only unsafe to use from two threads at once; a StepGraph is owned by
// one session and launched through `&mut`-serialised session calls, never concurrently.
unsafe impl Send for StepGraph {}

/// Whether the device's stream is being captured now.
#[derive(Debug, Default)]
pub struct CaptureFlag(AtomicBool);

impl CaptureFlag {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
    fn set(&self, v: bool) {
        self.0.store(v, Ordering::Release)
    }
}

impl CudaDevice {
    /// Start capturing the stream (relaxed mode: the pool may still allocate from the driver).
    pub fn capture_begin(&self) -> Result<(), CudaError> {
        if self.capturing() {
            return Err(CudaError::Invalid {
                op: "capture",
                detail: "a capture is already in progress".into(),
            });
        }
        self.stream()
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(drv("beginning stream capture"))?;
        self.capture_flag().set(true);
        Ok(())
    }

    /// End the capture and instantiate the graph.
    pub fn capture_end(&self) -> Result<StepGraph, CudaError> {
        self.capture_flag().set(false);
        let g = self
            .stream()
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(drv("ending stream capture"))?
            .ok_or_else(|| CudaError::Invalid {
                op: "capture",
                detail: "the capture recorded nothing".into(),
            })?;
        g.upload().map_err(drv("uploading a graph"))?;
        Ok(StepGraph { graph: g })
    }

    /// End a capture that failed half-way, discarding what was recorded.
    pub fn capture_abort(&self) {
        if self.capturing() {
            self.capture_flag().set(false);
            let _ = self.stream().end_capture(sys::CUgraphInstantiate_flags(0));
        }
    }

    pub fn capturing(&self) -> bool {
        self.capture_flag().get()
    }

    /// Launch a captured step on the stream.
    pub fn replay(&self, g: &StepGraph) -> Result<(), CudaError> {
        g.graph.launch().map_err(drv("launching a graph"))
    }
}
