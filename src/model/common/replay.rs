//! Decode-step replay: a session records the ops of one single-token forward pass once (a CUDA
//! graph on the CUDA backend) and replays them for every later token. The session's one-token
//! [`Step`](crate::backend::Step) lives here; the recorded ops read its token id and position
//! from it, and `Backend::step_set` (or a pipelined draw) rewrites it before each replay, so one
//! recording serves every position of the session.
//!
//! The first single-token step of a session runs directly (it loads kernels and warms the
//! memory pool), the second is recorded and replayed, the rest are replays. A backend that does
//! not record (the CPU) or a recording that fails falls back to running the ops, with the same
//! results: replay is an optimisation, never a different computation.

use crate::backend::{Backend, LogitRows, RecordedStep, StepOf, StepPlan};
use crate::bk;
use crate::model::ModelError;

type R<T> = Result<T, ModelError>;

/// Say once per process that a step could not be recorded (then at debug level).
fn not_recorded(e: &ModelError) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!("decode step could not be recorded ({e}); running its ops directly");
    } else {
        tracing::debug!("decode step could not be recorded ({e}); running its ops directly");
    }
}

enum State<B: Backend> {
    Cold,
    Warm,
    Recorded {
        rec: RecordedStep,
        /// The tensors the recorded ops write (logits, hidden state): read after each replay.
        outs: Vec<B::Tensor>,
    },
    Off,
}

/// One session's recorded decode step and the one-token step it runs over.
pub struct StepReplay<B: Backend> {
    /// Declared before `step`: a recording goes before the step it reads.
    state: State<B>,
    step: Option<StepOf<B>>,
    /// `(pos, token)`: a replay at `pos` fed on the device with the id the host then read as
    /// `token` is queued (see [`StepReplay::step_sampled`]).
    inflight: Option<(usize, u32)>,
}

impl<B: Backend> Default for StepReplay<B> {
    fn default() -> Self {
        StepReplay {
            state: State::Cold,
            step: None,
            inflight: None,
        }
    }
}

/// What a pipelined step returns: the sampled id and copies of the recorded step's outputs
/// after the first (the logits), made before the next step was queued.
pub struct SampledStep<T> {
    pub token: u32,
    pub rest: Vec<T>,
}

fn owned_copy<B: Backend>(be: &B, t: &B::Tensor) -> R<B::Tensor> {
    let (rows, _) = be.dims(t);
    bk!(be.slice_rows(t, 0, rows))
}

/// The session's one-token step made to hold `token` at `pos0`.
fn set_step<'s, B: Backend>(
    be: &B,
    slot: &'s mut Option<StepOf<B>>,
    token: u32,
    pos0: usize,
) -> R<&'s mut StepOf<B>> {
    let plan = bk!(StepPlan::single(&[token], pos0, LogitRows::Last))?;
    match slot {
        Some(s) => {
            bk!(be.step_set(s, plan))?;
            Ok(s)
        }
        None => Ok(slot.insert(bk!(be.step(plan))?)),
    }
}

impl<B: Backend> StepReplay<B> {
    /// Whether a recording is held.
    pub fn is_recorded(&self) -> bool {
        matches!(self.state, State::Recorded { .. })
    }

    /// Forget a queued step (the session's state changes otherwise: a prompt, a rewind). The
    /// queued replay still runs before anything queued later; what it wrote (the K/V row at its
    /// position, the recorded outputs) is rewritten before it is read again.
    pub fn forget_inflight(&mut self) {
        self.inflight = None;
    }

    /// A single-token step of `token` at `pos0` and the draw from its logits (the first
    /// output), pipelined: when the replay at `pos0` was already queued for this token (the id
    /// the previous call returned), it is not queued again; once the draw is queued and
    /// `next_pos` is Some, the draw feeds the session's step with its id at `next_pos` on the
    /// device and the replay over it is queued too, before the host waits for the id. So the
    /// device goes from one step to the next without waiting for the host. Only for sessions
    /// whose state a step rewrites rather than accumulates (K/V rows, not recurrent state): a
    /// queued step the caller does not take leaves nothing that is read before it is rewritten.
    ///
    /// Falls back to `step_many` and `Backend::sample` before the step is recorded or when the
    /// backend samples synchronously.
    #[allow(clippy::too_many_arguments)]
    pub fn step_sampled(
        &mut self,
        be: &B,
        token: u32,
        pos0: usize,
        next_pos: Option<usize>,
        sampler: &mut B::SamplerState,
        banned: &[u32],
        run: impl FnMut(&StepOf<B>) -> R<Vec<B::Tensor>>,
    ) -> R<SampledStep<B::Tensor>> {
        let fed = self.inflight.take() == Some((pos0, token));
        let State::Recorded { rec, outs } = &self.state else {
            let mut v = self.step_many(be, token, pos0, run)?;
            if v.is_empty() {
                return Err(ModelError::Other("recorded step returned no tensor".into()));
            }
            let logits = v.remove(0);
            let token = bk!(be.sample(logits, sampler, banned))?;
            return Ok(SampledStep { token, rest: v });
        };
        if !(fed && self.step.is_some()) {
            let s = set_step(be, &mut self.step, token, pos0)?;
            bk!(be.replay(rec, s))?;
        }
        let step = self
            .step
            .as_mut()
            .ok_or_else(|| ModelError::Other("recorded step without its step".into()))?;
        let logits = outs
            .first()
            .ok_or_else(|| ModelError::Other("recorded step has no outputs".into()))?;
        // the other outputs, copied before anything can queue the next replay
        let rest = outs[1..]
            .iter()
            .map(|t| owned_copy(be, t))
            .collect::<R<Vec<_>>>()?;
        let feed = next_pos.map(|p| (&mut *step, p));
        if !bk!(be.sample_begin(logits, sampler, banned, feed))? {
            // a backend that samples synchronously: no pipelining
            let l = owned_copy(be, logits)?;
            let token = bk!(be.sample(l, sampler, banned))?;
            return Ok(SampledStep { token, rest });
        }
        if next_pos.is_some() {
            bk!(be.replay(rec, step))?;
        }
        let token = bk!(be.sample_finish(sampler))?;
        self.inflight = next_pos.map(|p| (p, token));
        Ok(SampledStep { token, rest })
    }

    /// One single-token step of `token` at `pos0` over the session's step: `run` computes it
    /// directly (and is what gets recorded); returns its output tensors (copies that outlive
    /// the next replay).
    pub fn step_many(
        &mut self,
        be: &B,
        token: u32,
        pos0: usize,
        mut run: impl FnMut(&StepOf<B>) -> R<Vec<B::Tensor>>,
    ) -> R<Vec<B::Tensor>> {
        self.inflight = None;
        let step = set_step(be, &mut self.step, token, pos0)?;
        match &self.state {
            State::Recorded { rec, outs } => {
                bk!(be.replay(rec, step))?;
                return outs.iter().map(|t| owned_copy(be, t)).collect();
            }
            State::Off => return run(step),
            State::Cold => {
                self.state = State::Warm;
                return run(step);
            }
            State::Warm => {}
        }
        if !bk!(be.record_begin(step))? {
            self.state = State::Off;
            return run(step);
        }
        let outs = match run(step) {
            Ok(o) => o,
            Err(e) => {
                be.record_abort();
                not_recorded(&e);
                self.state = State::Off;
                return run(step);
            }
        };
        let rec = match be.record_end(step) {
            Ok(s) => s,
            Err(e) => {
                not_recorded(&crate::model::common::be_err(e));
                self.state = State::Off;
                return run(step);
            }
        };
        bk!(be.replay(&rec, step))?;
        let copies = outs
            .iter()
            .map(|t| owned_copy(be, t))
            .collect::<R<Vec<_>>>()?;
        tracing::debug!("decode step recorded");
        self.state = State::Recorded { rec, outs };
        Ok(copies)
    }

    /// [`step_many`](Self::step_many) for a pass with one output.
    pub fn step(
        &mut self,
        be: &B,
        token: u32,
        pos0: usize,
        mut run: impl FnMut(&StepOf<B>) -> R<B::Tensor>,
    ) -> R<B::Tensor> {
        let mut v = self.step_many(be, token, pos0, |s| Ok(vec![run(s)?]))?;
        v.pop()
            .ok_or_else(|| ModelError::Other("recorded step returned no tensor".into()))
    }
}
