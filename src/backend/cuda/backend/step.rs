//! A step's token ids and positions in device memory ([`GpuStep`]): uploaded once when the
//! step is made, read by `embed`, `rope`, `kv_write`, `attn_prep` and `attention` from there,
//! so a decode step issues no host copy and a recorded CUDA graph reads whatever the step holds
//! when it is replayed (`Backend::step_set` rewrites it in place; a pipelined draw writes its id
//! and the next position into it on the device).
//!
//! Layout for a step of `n` rows: ids `[0, n)`, positions `[n, 2n)`, i32.

use std::sync::Arc;

use cudarc::driver::sys;

use crate::backend::cuda::runtime::buf::{bind, copy, DevBuf, DevPtr, Pool};
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::{StepOf, StepPlan};

/// The CUDA backend's part of a step.
#[derive(Debug)]
pub struct GpuStep {
    buf: DevBuf,
    rows: usize,
}

fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

/// Host image of the step buffer: ids then positions, i32 (a fed step's id slot holds 0 until
/// the draw writes it).
pub(crate) fn step_image(plan: &StepPlan) -> Result<Vec<i32>, CudaError> {
    let n = plan.rows();
    let mut v = Vec::with_capacity(2 * n);
    match plan.ids() {
        Some(ids) => {
            for &id in ids {
                v.push(
                    i32::try_from(id)
                        .map_err(|_| invalid("step", format!("token id {id} exceeds i32")))?,
                );
            }
        }
        None => v.resize(n, 0),
    }
    // StepPlan keeps positions within i32
    v.extend(plan.positions().into_iter().map(|p| p as i32));
    Ok(v)
}

impl GpuStep {
    /// Upload `plan` into a new pooled buffer (owned by the step while it lives, so a recording
    /// made over it, dropped first, never reads a buffer handed to anyone else). Not a driver
    /// allocation: freeing one synchronises the stream, and a batched pass makes a one-row step
    /// per decoding sequence.
    pub fn new(pool: &Arc<Pool>, plan: &StepPlan) -> Result<GpuStep, CudaError> {
        let image = step_image(plan)?;
        let buf = pool.upload(&image)?;
        Ok(GpuStep {
            buf,
            rows: plan.rows(),
        })
    }

    /// Rewrite the buffer with `plan` (same rows: in place, so a graph recorded with this step
    /// reads the new values; other rows: a new buffer).
    pub fn set(&mut self, pool: &Arc<Pool>, plan: &StepPlan) -> Result<(), CudaError> {
        if plan.rows() != self.rows {
            *self = GpuStep::new(pool, plan)?;
            return Ok(());
        }
        self.buf.write(&step_image(plan)?)
    }

    /// The ids of `rows` rows (the step's rows), on the device.
    pub fn ids(&self, op: &'static str, rows: usize) -> Result<DevPtr<i32>, CudaError> {
        self.slice(op, 0, rows)
    }

    /// The positions of `rows` rows (the step's rows), on the device.
    pub fn positions(&self, op: &'static str, rows: usize) -> Result<DevPtr<i32>, CudaError> {
        self.slice(op, self.rows, rows)
    }

    fn slice(&self, op: &'static str, at: usize, rows: usize) -> Result<DevPtr<i32>, CudaError> {
        if rows != self.rows {
            return Err(invalid(
                op,
                format!("{rows} rows in a step of {}", self.rows),
            ));
        }
        self.buf
            .ptr::<i32>()
            .slice(at, rows)
            .ok_or_else(|| invalid(op, "the step buffer is shorter than its rows".into()))
    }

    /// Where a pipelined draw hands its id and the next position over: `[id, position]` of a
    /// one-row step.
    pub fn feed_slot(&self) -> Result<DevPtr<i32>, CudaError> {
        if self.rows != 1 {
            return Err(invalid(
                "sample_begin",
                format!("a draw feeds a one-row step, not {} rows", self.rows),
            ));
        }
        self.buf
            .ptr::<i32>()
            .slice(0, 2)
            .ok_or_else(|| invalid("sample_begin", "the step buffer holds two values".into()))
    }

    /// Stream-ordered copies that make this one-row step `[*src, pos]` (the draw's id, read on
    /// the device).
    pub fn feed_from(&self, pool: &Arc<Pool>, src: DevPtr<i32>, pos: i32) -> Result<(), CudaError> {
        let slot = self.feed_slot()?;
        let bad = |d: &str| invalid("sample_begin", d.to_string());
        let src = src
            .slice(0, 1)
            .ok_or_else(|| bad("no sampled id to read"))?;
        let (id_at, pos_at) = (
            slot.slice(0, 1).ok_or_else(|| bad("no id slot"))?,
            slot.slice(1, 1).ok_or_else(|| bad("no position slot"))?,
        );
        let stream = pool.stream();
        copy(stream, id_at, src)?;
        bind(stream)?;
        // SAFETY: `pos_at` addresses one i32 of the buffer; the value is passed by value.
        let r = unsafe { sys::cuMemsetD32Async(pos_at.raw(), pos as u32, 1, stream.cu_stream()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(bad(&format!("writing the position: {r:?}")));
        }
        Ok(())
    }

    /// The device address of the buffer (what a recorded step was captured reading).
    pub fn addr(&self) -> u64 {
        self.buf.ptr::<i32>().raw()
    }
}

/// The device address a step's recording is tied to.
pub(crate) fn step_addr(step: &StepOf<super::CudaBackend>) -> u64 {
    step.dev().addr()
}

#[cfg(test)]
mod tests {
    use super::step_image;
    use crate::backend::{LogitRows, StepPlan};

    #[test]
    fn step_image_layout() {
        let p = StepPlan::single(&[3, 4], 7, LogitRows::Last).unwrap();
        assert_eq!(step_image(&p).unwrap(), vec![3, 4, 7, 8]);
        let big = StepPlan::single(&[u32::MAX], 0, LogitRows::Last).unwrap();
        assert!(step_image(&big).is_err());
        let fed = StepPlan::fed(9).unwrap();
        assert_eq!(step_image(&fed).unwrap(), vec![0, 9]);
        let b = StepPlan::batch(&[(&[1, 2], 5), (&[3], 0)], LogitRows::Last).unwrap();
        assert_eq!(step_image(&b).unwrap(), vec![1, 2, 3, 5, 6, 0]);
    }
}
