//! CUDA graphs of decode steps: capture the ops one forward pass launches on the device's stream,
//! replay them with a single launch. Inputs that change per step (token id, position) live in
//! device memory written before each replay, so one capture serves every position.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::{sys, CudaStream};

use super::buf::bind;
use super::error::{drv, CudaError};
use crate::backend::cuda::CudaDevice;

/// A captured, instantiated step: the graph and its executable, destroyed together.
pub struct StepGraph {
    stream: Arc<CudaStream>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// Kernel-to-kernel edges made programmatic (0 when PDL is off).
    pub programmatic_edges: usize,
    /// Launches per replay (1 unless `FUCINA_REPLAY_REPEAT` asks more).
    repeat: usize,
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        if bind(&self.stream).is_err() {
            return;
        }
        // SAFETY: both handles were created by capture_end, are owned by this value only and
        // destroyed exactly once here (the executable first).
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

fn check(r: sys::CUresult, what: &'static str) -> Result<(), CudaError> {
    super::error::cu_check(r, "capture", what)
}

/// Whether captured steps use programmatic dependent launch: sm_90+ and not opted out with
/// `FUCINA_NO_PDL=1`.
pub fn pdl_enabled(sm_major: u32) -> bool {
    sm_major >= 9 && crate::tuning::get().pdl
}

/// Turn every kernel -> kernel edge of `g` into a programmatic one (the dependent may launch
/// while its predecessor drains; every generated kernel opens with `griddepcontrol.wait`, see
/// codegen::render::pdl_wait). Returns how many edges changed.
///
/// # Safety
/// `g` must be a valid graph not being executed or instantiated concurrently.
unsafe fn make_programmatic(g: sys::CUgraph) -> Result<usize, CudaError> {
    let mut n = 0usize;
    check(
        sys::cuGraphGetEdges_v2(
            g,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut n,
        ),
        "counting graph edges",
    )?;
    if n == 0 {
        return Ok(0);
    }
    let mut from = vec![std::ptr::null_mut(); n];
    let mut to = vec![std::ptr::null_mut(); n];
    // SAFETY: zero is a valid bit pattern for the plain C edge-data struct.
    let mut data: Vec<sys::CUgraphEdgeData> = vec![std::mem::zeroed(); n];
    check(
        sys::cuGraphGetEdges_v2(
            g,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut n,
        ),
        "reading graph edges",
    )?;
    let kernel = |node: sys::CUgraphNode| -> bool {
        let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        sys::cuGraphNodeGetType(node, &mut t) == sys::CUresult::CUDA_SUCCESS
            && t == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL
    };
    let mut changed = 0;
    for i in 0..n {
        if data[i].type_ != 0 || !kernel(from[i]) || !kernel(to[i]) {
            continue;
        }
        check(
            sys::cuGraphRemoveDependencies_v2(g, &from[i], &to[i], &data[i], 1),
            "removing a graph edge",
        )?;
        let mut e: sys::CUgraphEdgeData = std::mem::zeroed();
        e.from_port = sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8;
        e.type_ = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
        check(
            sys::cuGraphAddDependencies_v2(g, &from[i], &to[i], &e, 1),
            "adding a programmatic graph edge",
        )?;
        changed += 1;
    }
    Ok(changed)
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

    /// End the capture, make kernel-to-kernel edges programmatic (sm_90+, see
    /// [`pdl_enabled`]) and instantiate the graph.
    pub fn capture_end(&self) -> Result<StepGraph, CudaError> {
        self.capture_flag().set(false);
        let stream = self.stream().clone();
        bind(&stream)?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (capture_begin succeeded); on success the driver
        // hands us the graph, owned from here on.
        check(
            unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) },
            "ending stream capture",
        )?;
        if graph.is_null() {
            return Err(CudaError::Invalid {
                op: "capture",
                detail: "the capture recorded nothing".into(),
            });
        }
        let mut step = StepGraph {
            stream: stream.clone(),
            graph,
            exec: std::ptr::null_mut(),
            programmatic_edges: 0,
            repeat: 1,
        };
        #[cfg(feature = "profiling")]
        {
            let prof = &crate::tuning::get().profiling;
            step.repeat = prof.replay_repeat;
            if !prof.graph_skip.is_empty() {
                // SAFETY: the graph is ours and not instantiated yet.
                unsafe { super::graph_ablate::remove_kernels(graph, &prof.graph_skip)? };
            }
        }
        if pdl_enabled(self.compute_capability().0) {
            // SAFETY: the graph is ours and not instantiated yet.
            step.programmatic_edges = unsafe { make_programmatic(graph)? };
            tracing::debug!(
                edges = step.programmatic_edges,
                "captured step: kernel edges made programmatic (PDL)"
            );
        }
        #[cfg(feature = "profiling")]
        if crate::tuning::get().profiling.graph_dump {
            // SAFETY: the graph is ours and not instantiated yet.
            let d = unsafe { super::graph_ablate::describe(graph)? };
            eprintln!("FUCINA_GRAPH_DUMP: captured step: {d}");
        }
        // SAFETY: valid graph; `exec` receives the executable, destroyed by StepGraph's Drop
        // (a failed instantiation leaves it null, which Drop tolerates).
        unsafe {
            check(
                sys::cuGraphInstantiateWithFlags(&mut step.exec, graph, 0),
                "instantiating a graph",
            )?;
            check(
                sys::cuGraphUpload(step.exec, stream.cu_stream()),
                "uploading a graph",
            )?;
        }
        Ok(step)
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

    /// Launch a captured step on the stream (once; `FUCINA_REPLAY_REPEAT` times in profiling
    /// builds: see graph_ablate).
    pub fn replay(&self, g: &StepGraph) -> Result<(), CudaError> {
        bind(self.stream())?;
        for _ in 0..g.repeat {
            // SAFETY: `exec` is a live executable graph of this context.
            check(
                unsafe { sys::cuGraphLaunch(g.exec, self.stream().cu_stream()) },
                "launching a graph",
            )?;
        }
        Ok(())
    }
}
