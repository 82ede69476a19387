//! Decode-step replay: a session records the ops of one single-token forward pass once (a CUDA
//! graph on the CUDA backend) and replays them for every later token. The token id and
//! position reach the recorded ops through device memory written by `Backend::begin_forward`
//! before each replay, so one recording serves every position of the session.
//!
//! The first single-token step of a session runs directly (it loads kernels and warms the
//! memory pool), the second is recorded and replayed, the rest are replays. A backend that does
//! not record (the CPU) or a recording that fails falls back to running the ops, with the same
//! results: replay is an optimisation, never a different computation.

use crate::backend::{Backend, RecordedStep};
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
        step: RecordedStep,
        /// The tensors the recorded ops write (logits, hidden state): read after each replay.
        outs: Vec<B::Tensor>,
    },
    Off,
}

/// One session's recorded decode step.
pub struct StepReplay<B: Backend> {
    state: State<B>,
}

impl<B: Backend> Default for StepReplay<B> {
    fn default() -> Self {
        StepReplay { state: State::Cold }
    }
}

fn owned_copy<B: Backend>(be: &B, t: &B::Tensor) -> R<B::Tensor> {
    let (rows, _) = be.dims(t);
    bk!(be.slice_rows(t, 0, rows))
}

impl<B: Backend> StepReplay<B> {
    /// Whether a recording is held.
    pub fn is_recorded(&self) -> bool {
        matches!(self.state, State::Recorded { .. })
    }

    /// One single-token step of `tokens` at `pos0`: `run` computes it directly (and is what
    /// gets recorded); returns its output tensors (copies that outlive the next replay).
    pub fn step_many(
        &mut self,
        be: &B,
        tokens: &[u32],
        pos0: usize,
        mut run: impl FnMut() -> R<Vec<B::Tensor>>,
    ) -> R<Vec<B::Tensor>> {
        match &self.state {
            State::Recorded { step, outs } => {
                bk!(be.begin_forward(tokens, pos0))?;
                bk!(be.replay(step))?;
                return outs.iter().map(|t| owned_copy(be, t)).collect();
            }
            State::Off => return run(),
            State::Cold => {
                self.state = State::Warm;
                return run();
            }
            State::Warm => {}
        }
        bk!(be.begin_forward(tokens, pos0))?;
        if !bk!(be.record_begin())? {
            self.state = State::Off;
            return run();
        }
        let outs = match run() {
            Ok(o) => o,
            Err(e) => {
                be.record_abort();
                not_recorded(&e);
                self.state = State::Off;
                return run();
            }
        };
        let step = match be.record_end() {
            Ok(s) => s,
            Err(e) => {
                not_recorded(&crate::model::common::be_err(e));
                self.state = State::Off;
                return run();
            }
        };
        bk!(be.replay(&step))?;
        let copies = outs
            .iter()
            .map(|t| owned_copy(be, t))
            .collect::<R<Vec<_>>>()?;
        tracing::debug!("decode step recorded");
        self.state = State::Recorded { step, outs };
        Ok(copies)
    }

    /// [`step_many`](Self::step_many) for a pass with one output.
    pub fn step(
        &mut self,
        be: &B,
        tokens: &[u32],
        pos0: usize,
        mut run: impl FnMut() -> R<B::Tensor>,
    ) -> R<B::Tensor> {
        let mut v = self.step_many(be, tokens, pos0, || Ok(vec![run()?]))?;
        v.pop()
            .ok_or_else(|| ModelError::Other("recorded step returned no tensor".into()))
    }
}
