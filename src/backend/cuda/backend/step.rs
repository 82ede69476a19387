//! Step inputs in device memory: the token ids and positions of the current forward pass,
//! uploaded once by `Backend::begin_forward` into a persistent buffer, so that `embed`, `rope`,
//! `kv_write` and `attention` read them from the device (a decode step then issues no host
//! copy and can be replayed as a CUDA graph at any position).
//!
//! Layout of the buffer for a pass of `n` tokens: ids `[0, n)`, positions `[n, 2n)` (i32).
//! An op whose ids or positions are not the registered ones (e.g. a model that embeds other
//! ids) uploads its own pooled copy: still correct, only not graph-capturable.

use std::sync::Arc;

use cudarc::driver::sys;

use super::super::buf::{bind, copy, DevBuf, DevPtr, Pool};
use super::super::error::CudaError;

/// Host view of what the step buffer holds.
#[derive(Debug, Default)]
pub(crate) struct StepState {
    /// The buffer of the current pass: `multi` (n > 1) or `single` (n == 1).
    buf: Option<DevBuf>,
    /// Passes of several tokens (grows).
    multi: Option<DevBuf>,
    /// One-token passes: never reallocated, so a captured decode step keeps pointing at it.
    single: Option<DevBuf>,
    /// Capacity of `buf` in i32 values.
    cap: usize,
    ids: Vec<u32>,
    pos0: usize,
    n: usize,
}

/// Host image of the step buffer: ids then positions, i32.
pub(crate) fn step_image(ids: &[u32], pos0: usize) -> Result<Vec<i32>, CudaError> {
    let n = ids.len();
    let bad = |detail: String| CudaError::Invalid {
        op: "begin_forward",
        detail,
    };
    if pos0.checked_add(n).is_none_or(|e| e > i32::MAX as usize) {
        return Err(bad(format!("positions {pos0}+{n} exceed i32")));
    }
    let mut v = Vec::with_capacity(2 * n);
    for &id in ids {
        v.push(i32::try_from(id).map_err(|_| bad(format!("token id {id} exceeds i32")))?);
    }
    v.extend((pos0..pos0 + n).map(|p| p as i32));
    Ok(v)
}

impl StepState {
    /// Register this pass's ids and first position; grows the buffer (outside any capture)
    /// when needed, then copies ids and positions to the device.
    ///
    /// While a CUDA graph is being captured (`capturing`), nothing is copied: the pass must be
    /// the one registered just before the capture began (its data is already on the device).
    pub fn begin(
        &mut self,
        pool: &Arc<Pool>,
        ids: &[u32],
        pos0: usize,
        capturing: bool,
    ) -> Result<(), CudaError> {
        if capturing {
            if self.ids_match(ids) && self.pos0 == pos0 {
                return Ok(());
            }
            return Err(CudaError::Invalid {
                op: "begin_forward",
                detail: "a recorded step must run the pass registered before recording".into(),
            });
        }
        let image = step_image(ids, pos0)?;
        // Move the current buffer back to its slot, then pick the slot for this pass.
        self.park();
        let b = if ids.len() == 1 {
            match self.single.take() {
                Some(b) => b,
                None => pool.alloc_persistent(2 * 4)?,
            }
        } else {
            match self.multi.take() {
                Some(b) if image.len() <= self.cap => b,
                _ => {
                    let cap = image.len().next_power_of_two().max(64);
                    self.cap = cap;
                    pool.alloc_persistent(cap * 4)?
                }
            }
        };
        b.write(&image)?;
        self.buf = Some(b);
        self.ids.clear();
        self.ids.extend_from_slice(ids);
        self.pos0 = pos0;
        self.n = ids.len();
        Ok(())
    }

    /// `begin` of a one-token step at `pos0` whose token is `src[0]` on the device (a sampled
    /// id the host has not read yet): stream-ordered copies into the one-token buffer. The
    /// step's ids are unknown here, so no recording can start from it.
    pub fn begin_device(
        &mut self,
        pool: &Arc<Pool>,
        src: DevPtr<i32>,
        pos0: usize,
    ) -> Result<(), CudaError> {
        let bad = |detail: String| CudaError::Invalid {
            op: "begin_forward_sampled",
            detail,
        };
        let pos = i32::try_from(pos0).map_err(|_| bad(format!("position {pos0} exceeds i32")))?;
        let src = src
            .slice(0, 1)
            .ok_or_else(|| bad("no sampled id to read".into()))?;
        self.park();
        let b = match self.single.take() {
            Some(b) => b,
            None => pool.alloc_persistent(2 * 4)?,
        };
        let slot = |i: usize| {
            b.ptr::<i32>()
                .slice(i, 1)
                .ok_or_else(|| bad("the one-token buffer holds two values".into()))
        };
        let (id_at, pos_at) = (slot(0)?, slot(1)?);
        let stream = pool.stream();
        copy(stream, id_at, src)?;
        bind(stream)?;
        // SAFETY: `pos_at` addresses one i32 of the buffer; the value is passed by value.
        let r = unsafe { sys::cuMemsetD32Async(pos_at.raw(), pos as u32, 1, stream.cu_stream()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(bad(format!("writing the position: {r:?}")));
        }
        self.hold_single(b, pos0);
        Ok(())
    }

    /// Move the current pass's buffer back to its slot (`single` or `multi`).
    fn park(&mut self) {
        if let Some(b) = self.buf.take() {
            if self.n == 1 {
                self.single = Some(b);
            } else {
                self.multi = Some(b);
            }
        }
    }

    /// Make `b` (the one-token buffer) the current pass's, a step at `pos0` whose id only the
    /// device knows.
    fn hold_single(&mut self, b: DevBuf, pos0: usize) {
        self.buf = Some(b);
        self.ids.clear();
        self.pos0 = pos0;
        self.n = 1;
    }

    /// The one-token buffer (allocated here when no one-token pass ran yet) as `[id, position]`:
    /// where the sample kernel hands the drawn id and the next position over (`feed`), so that
    /// [`Self::adopt_fed`] needs no copy. The pointer stays valid: the buffer is never freed.
    pub fn feed_slot(&mut self, pool: &Arc<Pool>) -> Result<DevPtr<i32>, CudaError> {
        let held = match (&self.buf, &self.single) {
            (Some(b), _) if self.n == 1 => Some(b.ptr::<i32>()),
            (_, Some(b)) => Some(b.ptr::<i32>()),
            _ => None,
        };
        let p = match held {
            Some(p) => p,
            None => {
                let b = pool.alloc_persistent(2 * 4)?;
                let p = b.ptr::<i32>();
                self.single = Some(b);
                p
            }
        };
        p.slice(0, 2).ok_or_else(|| CudaError::Invalid {
            op: "begin_forward_sampled",
            detail: "the one-token buffer holds two values".into(),
        })
    }

    /// `begin_device` for a one-token step whose id and position a stream-ordered kernel has
    /// already written into the one-token buffer ([`Self::feed_slot`]): only the host's view.
    /// Without a one-token buffer it is an error and the state stays as it was.
    pub fn adopt_fed(&mut self, pos0: usize) -> Result<(), CudaError> {
        let missing = || CudaError::Invalid {
            op: "begin_forward_sampled",
            detail: "no one-token buffer was handed to the sampler".into(),
        };
        if self.single.is_none() && !(self.n == 1 && self.buf.is_some()) {
            return Err(missing());
        }
        self.park();
        let b = self.single.take().ok_or_else(missing)?;
        self.hold_single(b, pos0);
        Ok(())
    }

    /// Whether `ids` are this pass's ids.
    pub fn ids_match(&self, ids: &[u32]) -> bool {
        self.n > 0 && self.ids == ids
    }

    /// Offset into this pass's positions of `rows` rows starting at `pos0`, when registered.
    pub fn pos_offset(&self, pos0: usize, rows: usize) -> Option<usize> {
        (rows > 0 && pos0 >= self.pos0 && pos0 + rows <= self.pos0 + self.n)
            .then(|| pos0 - self.pos0)
    }

    /// The registered ids on the device, when `ids` match.
    pub fn ids_ptr(&self, ids: &[u32]) -> Option<DevPtr<i32>> {
        if !self.ids_match(ids) {
            return None;
        }
        self.buf.as_ref()?.ptr::<i32>().slice(0, self.n)
    }

    /// Positions `pos0 .. pos0 + rows` on the device, when registered.
    pub fn pos_ptr(&self, pos0: usize, rows: usize) -> Option<DevPtr<i32>> {
        let off = self.pos_offset(pos0, rows)?;
        self.buf.as_ref()?.ptr::<i32>().slice(self.n + off, rows)
    }

    #[cfg(test)]
    pub(crate) fn fake(ids: &[u32], pos0: usize) -> StepState {
        StepState {
            buf: None,
            multi: None,
            single: None,
            cap: 0,
            ids: ids.to_vec(),
            pos0,
            n: ids.len(),
        }
    }
}

/// Device ids or positions for one op: a slice of the step buffer, or a pooled upload kept
/// alive until the op's launches are queued.
pub(crate) struct StepInput {
    pub ptr: DevPtr<i32>,
    _owned: Option<DevBuf>,
}

impl StepInput {
    pub fn registered(ptr: DevPtr<i32>) -> StepInput {
        StepInput { ptr, _owned: None }
    }
    pub fn upload(pool: &Arc<Pool>, v: &[i32]) -> Result<StepInput, CudaError> {
        let b = pool.upload(v)?;
        let ptr = b.ptr::<i32>().slice(0, v.len()).ok_or(CudaError::Invalid {
            op: "step input",
            detail: "pooled buffer shorter than requested".into(),
        })?;
        Ok(StepInput {
            ptr,
            _owned: Some(b),
        })
    }
}
