//! Minimal CUDA plumbing for the heavy-kernel checks: a context, PTX modules loaded from a
//! folder of `<entry>.<arch>.ptx` files (rendered and compiled by
//! `kernel-templates/tools/render_check.py` until the codegen registry serves them), timing.

use anyhow::{Context, Result};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
};
use cudarc::nvrtc::Ptx;
use std::path::PathBuf;
use std::sync::Arc;

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub arch: String,
    pub sms: u32,
    ptx_dir: PathBuf,
}

impl Gpu {
    pub fn new(ptx_dir: PathBuf) -> Result<Self> {
        let ctx = CudaContext::new(0).context("no CUDA device")?;
        // SAFETY: one stream only; no cross-stream ordering needs the tracking events.
        unsafe { ctx.disable_event_tracking() };
        let (maj, min) = ctx.compute_capability()?;
        let arch = match (maj, min) {
            (9, 0) => "sm_90a".to_string(),
            (12, 0) => "sm_120a".to_string(),
            (12, 1) => "sm_121a".to_string(),
            (a, b) => format!("sm_{a}{b}"),
        };
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32;
        let stream = ctx.new_stream()?; // capturable (the legacy default stream is not)
        Ok(Self {
            ctx,
            stream,
            arch,
            sms,
            ptx_dir,
        })
    }

    pub fn function(&self, entry: &str) -> Result<CudaFunction> {
        let path = self.ptx_dir.join(format!("{entry}.{}.ptx", self.arch));
        let src = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let module = self
            .ctx
            .load_module(Ptx::from_src(src))
            .with_context(|| format!("loading {entry}"))?;
        module
            .load_function(entry)
            .with_context(|| format!("function {entry}"))
    }

    pub fn upload<T: DeviceRepr>(&self, v: &[T]) -> Result<CudaSlice<T>> {
        Ok(self.stream.clone_htod(v)?)
    }

    pub fn download<T: DeviceRepr + Default + Clone>(&self, s: &CudaSlice<T>) -> Result<Vec<T>> {
        Ok(self.stream.clone_dtoh(s)?)
    }

    /// f32 buffer filled with NaN, so unwritten outputs are caught.
    pub fn poisoned(&self, n: usize) -> Result<CudaSlice<f32>> {
        self.upload(&vec![f32::NAN; n])
    }

    /// Median milliseconds of `samples` runs of `f`, each run enclosing `per` calls.
    pub fn time_ms(
        &self,
        samples: usize,
        per: usize,
        mut f: impl FnMut(usize) -> Result<()>,
    ) -> Result<f64> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        for i in 0..3 {
            f(i)?;
        }
        let mut times = Vec::with_capacity(samples);
        let mut call = 0;
        for _ in 0..samples {
            let a = self.ctx.new_event(flags)?;
            let b = self.ctx.new_event(flags)?;
            a.record(&self.stream)?;
            for _ in 0..per {
                f(call)?;
                call += 1;
            }
            b.record(&self.stream)?;
            times.push(a.elapsed_ms(&b)? as f64 / per as f64);
        }
        times.sort_by(|x, y| x.total_cmp(y));
        Ok(times[times.len() / 2])
    }
}

impl Gpu {
    /// Median milliseconds per call of `calls` launches captured into one CUDA graph, replayed
    /// `samples` times (what a decode step does; host launch cost stays out of the number).
    pub fn time_graph(
        &self,
        samples: usize,
        calls: usize,
        mut f: impl FnMut(usize) -> Result<()>,
    ) -> Result<f64> {
        self.stream.synchronize()?;
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let mut res = Ok(());
        for i in 0..calls {
            res = f(i);
            if res.is_err() {
                break;
            }
        }
        let graph = self.stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
        res?;
        let graph = graph.ok_or_else(|| anyhow::anyhow!("empty graph"))?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        for _ in 0..3 {
            graph.launch()?;
        }
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            let a = self.ctx.new_event(flags)?;
            let b = self.ctx.new_event(flags)?;
            a.record(&self.stream)?;
            graph.launch()?;
            b.record(&self.stream)?;
            times.push(a.elapsed_ms(&b)? as f64 / calls as f64);
        }
        times.sort_by(|x, y| x.total_cmp(y));
        Ok(times[times.len() / 2])
    }

    /// Registers and local (spill) bytes of a function, for the bench notes.
    pub fn regs(&self, f: &CudaFunction) -> String {
        format!(
            "{} regs, {} B local",
            f.num_regs().unwrap_or(-1),
            f.local_size_bytes().unwrap_or(-1)
        )
    }
}

pub fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One row of the table: instance, error, bound, microseconds.
pub struct Row {
    pub name: String,
    pub err: f64,
    pub bound: f64,
    pub us: f64,
    pub note: String,
}

impl Row {
    pub fn pass(&self) -> bool {
        self.err.is_finite() && self.err <= self.bound
    }
}

/// max |a - b| / max |b|; infinite when any output is not finite (unwritten = NaN poison).
pub fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let scale = want
        .iter()
        .fold(0f64, |m, &v| m.max(v.abs() as f64))
        .max(1e-30);
    got.iter()
        .zip(want)
        .fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()))
        / scale
}
