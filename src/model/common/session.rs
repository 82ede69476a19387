//! One sequence on any decoder: the session type both model families share.
//!
//! A family implements [`Decoder`]: its per-sequence state (KV caches, recurrent state) and the
//! forward pass of one [`Step`](crate::backend::Step) over it. [`DecoderSession`] does the
//! rest, once: the checks of a pass (tokens in the vocabulary, room in the context), prompts in
//! chunks, one-token steps recorded and replayed ([`StepReplay`]), pipelined draws, rewinds, and
//! what a failed pass leaves (undone where the state is only rewritten, else the session needs
//! a rewind to 0).

use crate::backend::{Ops, Runtime};
use std::sync::Arc;

use crate::backend::{Backend, LogitRows, StepOf, StepPlan};
use crate::bk;
use crate::model::common::replay::StepReplay;
use crate::model::{
    host_forward_sample, BackendSampler, Logits, ModelError, ModelInfo, Session, TokenSampler,
};
use crate::sampling::SamplingParams;

type R<T> = Result<T, ModelError>;

/// What the forward pass of one step returns.
pub struct StepOutput<T> {
    /// Logits of the rows the step asks for (None for [`LogitRows::None`]).
    pub logits: Option<T>,
    /// The final-normed hidden state of the step's last row, where the decoder keeps it
    /// (Gemma: what the Gemma 4 MTP head reads).
    pub hidden: Option<T>,
}

/// A decoder as a session drives it.
pub trait Decoder: Send + Sync + 'static {
    type B: Backend;
    /// One sequence's state.
    type State: Send;

    fn backend(&self) -> &Arc<Self::B>;
    fn info(&self) -> &ModelInfo;
    /// A fresh sequence's state.
    fn new_state(&self) -> R<Self::State>;
    /// The forward pass of `step`: its sequence `j` is `states[j]`'s, at the step's positions.
    /// With several sequences the logits are the last row of each (or every row), in order, and
    /// `hidden` is None.
    fn forward(
        &self,
        step: &StepOf<Self::B>,
        states: &mut [&mut Self::State],
    ) -> R<StepOutput<<Self::B as Runtime>::Tensor>>;
    /// Make `state`, holding `len` positions, hold only the first `n`; `ModelError::Rewind`
    /// where it cannot.
    fn rewind(&self, state: &mut Self::State, len: usize, n: usize) -> R<()>;
    /// Whether a step only rewrites the state at its positions (K/V rows) rather than
    /// accumulating into it (recurrent state). Then a failed or untaken step is undone by
    /// `rewind`, and one-token steps pipeline.
    fn rewritable(&self) -> bool;
    /// Tokens per pass over a prompt.
    fn pass_chunk(&self) -> usize;
    /// Most rows one pass may return logits for (sliding-window rings); None: any number.
    fn max_logit_rows(&self) -> Option<usize> {
        None
    }
    /// Positions below `end` are about to be written (even if the pass then fails).
    fn written(&self, _state: &mut Self::State, _end: usize) {}
    /// The tensors of `state` that truncating its KV caches cannot rewind (a Gated DeltaNet
    /// layer's conv and recurrent state), in a fixed order: what the session's snapshots copy
    /// and a rewind to a snapshot puts back (`rewind` then only truncates the caches). Default:
    /// none (every layer's state is a KV cache).
    fn recurrent<'s>(
        &self,
        _state: &'s mut Self::State,
    ) -> Vec<&'s mut <Self::B as Runtime>::Tensor> {
        Vec::new()
    }
}

type Tensor<D> = <<D as Decoder>::B as Runtime>::Tensor;

/// One sequence on decoder `D`.
pub struct DecoderSession<D: Decoder> {
    /// Decode-step replay (CUDA graph) and the one-token step it reads; declared first so a
    /// recording goes before the state it addresses.
    graph: StepReplay<D::B>,
    model: Arc<D>,
    /// Made on first use (making it can fail; `new_session` cannot).
    state: Option<D::State>,
    len: usize,
    /// Set when a pass failed and its writes could not be undone: only `rewind(0)` recovers.
    broken: bool,
    /// The last position's final-normed hidden state, where the decoder returns it.
    hidden: Option<Tensor<D>>,
    /// Copies of the recurrent state (`Decoder::recurrent`) at the positions they were taken
    /// at, oldest first: what a rewind of a recurrent model goes back to.
    snaps: Vec<(usize, Vec<Tensor<D>>)>,
}

/// The state in `slot`, made first if there is none.
fn made<'s, D: Decoder>(model: &D, slot: &'s mut Option<D::State>) -> R<&'s mut D::State> {
    match slot {
        Some(s) => Ok(s),
        slot => Ok(slot.insert(model.new_state()?)),
    }
}

/// A step's outputs as the replay holds them: logits first, then the hidden state if any.
fn outputs<T>(o: StepOutput<T>) -> R<Vec<T>> {
    let logits = o
        .logits
        .ok_or_else(|| ModelError::Other("a pass returned no logits".into()))?;
    Ok(std::iter::once(logits).chain(o.hidden).collect())
}

impl<D: Decoder> DecoderSession<D> {
    pub fn new(model: Arc<D>) -> Self {
        DecoderSession {
            graph: StepReplay::default(),
            model,
            state: None,
            len: 0,
            broken: false,
            hidden: None,
            snaps: Vec::new(),
        }
    }

    /// After a pass appended `start..end`: a snapshot of the recurrent state (where the model
    /// has one) when the pass ended a prompt (`prompt`) or crossed a multiple of
    /// `tuning::snapshot_every`; the newest `snapshot_keep` are kept. A copy that fails is
    /// skipped (a later rewind then goes back further).
    fn snapshot_after(&mut self, start: usize, end: usize, prompt: bool) {
        let t = crate::tuning::get();
        let every = t.snapshot_every.max(1);
        if t.snapshot_keep == 0 || !(prompt || end / every > start / every) {
            return;
        }
        let model = Arc::clone(&self.model);
        let be = &**model.backend();
        let Some(state) = self.state.as_mut() else {
            return;
        };
        let tensors = model.recurrent(state);
        if tensors.is_empty() {
            return;
        }
        let copy = tensors
            .iter()
            .map(|t| be.slice_rows(t, 0, be.dims(t).0))
            .collect::<Result<Vec<_>, _>>();
        match copy {
            Ok(c) => {
                static LOGGED: std::sync::Once = std::sync::Once::new();
                LOGGED.call_once(|| {
                    let values: usize = c.iter().map(|t| be.dims(t).0 * be.dims(t).1).sum();
                    tracing::info!(
                        "recurrent-state snapshots: {:.1} MiB each (f32), every {every} \
                         positions and at each prompt's end, the newest {} kept per sequence",
                        (values * 4) as f64 / (1 << 20) as f64,
                        t.snapshot_keep
                    );
                });
                self.snaps.retain(|(p, _)| *p < end);
                self.snaps.push((end, c));
                let extra = self.snaps.len().saturating_sub(t.snapshot_keep);
                self.snaps.drain(..extra);
            }
            Err(e) => tracing::debug!("recurrent-state snapshot at {end} skipped: {e}"),
        }
    }

    /// Whether this session's model keeps state a KV truncation cannot rewind.
    fn recurrent_model(&mut self) -> bool {
        let model = Arc::clone(&self.model);
        self.state
            .as_mut()
            .is_some_and(|s| !model.recurrent(s).is_empty())
    }

    /// The positions a rewind of a recurrent model can go back to: its snapshots'.
    pub fn snapshot_positions(&self) -> Vec<usize> {
        self.snaps.iter().map(|(p, _)| *p).collect()
    }

    /// Put the recurrent state back to the snapshot at `n` and truncate the caches there.
    fn restore(&mut self, n: usize) -> R<()> {
        let Some(i) = self.snaps.iter().position(|(p, _)| *p == n) else {
            return Err(ModelError::Rewind {
                to: n,
                why: format!(
                    "the recurrent state is kept at positions {:?} only; re-prefill",
                    self.snapshot_positions()
                ),
            });
        };
        let model = Arc::clone(&self.model);
        let be = &**model.backend();
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| ModelError::Other("no state to rewind".into()))?;
        let snap = &self.snaps[i].1;
        let mut tensors = model.recurrent(state);
        if tensors.len() != snap.len() {
            return Err(ModelError::Other(format!(
                "a snapshot of {} tensors for a state of {}",
                snap.len(),
                tensors.len()
            )));
        }
        // copies: the snapshot stays for later rewinds
        for (t, s) in tensors.iter_mut().zip(snap) {
            **t = bk!(be.slice_rows(s, 0, be.dims(s).0))?;
        }
        model.rewind(state, self.len, n)?;
        self.snaps.truncate(i + 1);
        Ok(())
    }

    /// A session whose state is made now (an error here rather than at the first pass).
    pub fn with_state(model: Arc<D>) -> R<Self> {
        let mut s = Self::new(model);
        s.state_mut()?;
        Ok(s)
    }

    pub fn model(&self) -> &Arc<D> {
        &self.model
    }

    /// The sequence's state, once made.
    pub fn state(&self) -> Option<&D::State> {
        self.state.as_ref()
    }

    /// Post-final-norm hidden state of the last token processed (`[1, hidden]`), where the
    /// decoder returns it.
    pub fn last_hidden(&self) -> Option<&Tensor<D>> {
        self.hidden.as_ref()
    }

    fn state_mut(&mut self) -> R<&mut D::State> {
        made(&*self.model, &mut self.state)
    }

    /// What a pass over `tokens` needs: a usable session, some tokens, all in the vocabulary,
    /// room in the context. Returns the length after it.
    fn check(&self, tokens: &[u32]) -> R<usize> {
        if self.broken {
            return Err(ModelError::Other(
                "session state is invalid after a failed step; rewind to 0".into(),
            ));
        }
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        let info = self.model.info();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= info.vocab_size) {
            return Err(ModelError::BadToken {
                id,
                vocab: info.vocab_size,
            });
        }
        let end = self.len + tokens.len();
        if end > info.max_context {
            return Err(ModelError::ContextOverflow {
                len: end,
                max: info.max_context,
            });
        }
        Ok(end)
    }

    /// A pass failed after writing from position `keep` on: undo its writes where the state
    /// is only rewritten, else the session is broken.
    fn fail(&mut self, keep: usize, end: usize) {
        self.hidden = None;
        let m = &*self.model;
        let undone = m.rewritable()
            && match &mut self.state {
                Some(s) => m.rewind(s, end, keep).is_ok(),
                None => true,
            };
        self.len = keep;
        if !undone {
            self.broken = true;
        }
    }

    /// The pass over `tokens` (prompt chunks, or one replayed decode step); returns the logits
    /// tensor (every row when `all`, else the last).
    fn pass(&mut self, tokens: &[u32], all: bool) -> R<Tensor<D>> {
        self.graph.forget_inflight();
        let end = self.check(tokens)?;
        let model = Arc::clone(&self.model);
        let m = &*model;
        let be = &**m.backend();
        let start = self.len;
        let state = made(m, &mut self.state)?;
        m.written(state, end);
        let r = if tokens.len() == 1 && !all {
            self.graph.step_many(be, tokens[0], start, |step| {
                outputs(m.forward(step, &mut [&mut *state])?)
            })
        } else {
            // long prompts run in chunks (bounded activation memory, the rings' size); only the
            // last chunk's rows reach the head
            let chunk = if all {
                tokens.len()
            } else {
                m.pass_chunk().max(1)
            };
            let n = tokens.len().div_ceil(chunk);
            let mut at = start;
            let mut out = Err(ModelError::Empty);
            for (i, c) in tokens.chunks(chunk).enumerate() {
                let last = i + 1 == n;
                let rows = match (last, all) {
                    (false, _) => LogitRows::None,
                    (true, true) => LogitRows::All,
                    (true, false) => LogitRows::Last,
                };
                let r = bk!(StepPlan::single(c, at, rows).and_then(|p| be.step(p)))
                    .and_then(|step| m.forward(&step, &mut [&mut *state]));
                match r {
                    Ok(o) if last => out = outputs(o),
                    Ok(_) => {}
                    Err(e) => {
                        out = Err(e);
                        break;
                    }
                }
                at += c.len();
            }
            out
        };
        match r {
            Ok(v) => {
                let mut v = v.into_iter();
                let logits = v.next();
                self.hidden = v.next();
                self.len = end;
                self.snapshot_after(start, end, tokens.len() > 1);
                logits.ok_or_else(|| ModelError::Other("the pass lost its logits".into()))
            }
            Err(e) => {
                self.fail(start, end);
                Err(e)
            }
        }
    }

    /// A one-token pass and the draw from its logits, pipelined: the next step is queued fed
    /// with the drawn id before the host waits for it (`StepReplay::step_sampled`; only for
    /// decoders whose steps rewrite their state).
    fn pass_sampled(&mut self, token: u32, s: &mut BackendSampler<D::B>, banned: &[u32]) -> R<u32> {
        self.check(&[token])?;
        let model = Arc::clone(&self.model);
        let m = &*model;
        let pos0 = self.len;
        let next = (pos0 + 2 <= m.info().max_context).then_some(pos0 + 1);
        // the queued next step writes its row too (whether or not it is taken)
        let end = next.map_or(pos0 + 1, |p| p + 1);
        let state = made(m, &mut self.state)?;
        m.written(state, end);
        let r = self.graph.step_sampled(
            &**m.backend(),
            token,
            pos0,
            next,
            s.state_mut(),
            banned,
            |step| outputs(m.forward(step, &mut [&mut *state])?),
        );
        match r {
            Ok(mut st) => {
                self.hidden = st.rest.pop();
                self.len += 1;
                Ok(st.token)
            }
            Err(e) => {
                self.fail(pos0, end);
                Err(e)
            }
        }
    }
}

impl<D: Decoder> DecoderSession<D> {
    /// One pass over several sessions of this model: `tokens[i]` are appended to `sessions[i]`
    /// in one step (each weight read once for all of them) and each gets the logits of its last
    /// token. A session whose tokens fail the checks gets its error and is left as it was; when
    /// the pass fails, every session in it gets the error and is undone as a failed
    /// [`Session::forward`] is. A batch with one valid session is that session's own pass (its
    /// recorded decode step included).
    pub fn forward_batch(sessions: &mut [&mut Self], tokens: &[&[u32]]) -> Vec<R<Logits>> {
        let mut out: Vec<Option<R<Logits>>> = (0..sessions.len()).map(|_| None).collect();
        if tokens.len() != sessions.len() {
            let e = format!(
                "{} token lists for {} sessions",
                tokens.len(),
                sessions.len()
            );
            return out
                .iter()
                .map(|_| Err(ModelError::Other(e.clone())))
                .collect();
        }
        // (index, start, end) of each session that runs
        let mut ok = Vec::new();
        for (i, s) in sessions.iter_mut().enumerate() {
            s.graph.forget_inflight();
            let chunk = s.model.pass_chunk().max(1);
            match s.check(tokens[i]) {
                Ok(_) if tokens[i].len() > chunk => {
                    out[i] = Some(Err(ModelError::Other(format!(
                        "{} tokens in one batched pass; at most {chunk}",
                        tokens[i].len()
                    ))))
                }
                Ok(end) => ok.push((i, s.len, end)),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        match ok.as_slice() {
            [] => {}
            &[(i, _, _)] => out[i] = Some(Session::forward(&mut *sessions[i], tokens[i], false)),
            _ => {
                let mut r = Self::pass_many(sessions, tokens, &ok);
                for &(i, start, end) in &ok {
                    let s = &mut *sessions[i];
                    out[i] = Some(match &mut r {
                        Ok(rows) => {
                            s.len = end;
                            s.hidden = None;
                            s.snapshot_after(start, end, end - start > 1);
                            Ok(rows[i].take().expect("a row per session that ran"))
                        }
                        Err(e) => {
                            s.fail(start, end);
                            Err(ModelError::Other(e.to_string()))
                        }
                    });
                }
            }
        }
        out.into_iter()
            .map(|o| o.expect("every session answered"))
            .collect()
    }

    /// The step of the sessions in `ok` (index, start, end); the logits row of each, by index.
    fn pass_many(
        sessions: &mut [&mut Self],
        tokens: &[&[u32]],
        ok: &[(usize, usize, usize)],
    ) -> R<Vec<Option<Logits>>> {
        let model = Arc::clone(&sessions[ok[0].0].model);
        if let Some(&(i, _, _)) = ok
            .iter()
            .find(|&&(i, _, _)| !Arc::ptr_eq(&sessions[i].model, &model))
        {
            return Err(ModelError::Other(format!(
                "session {i} of a batch belongs to another model"
            )));
        }
        let m = &*model;
        let be = &**m.backend();
        let seqs: Vec<(&[u32], usize)> = ok.iter().map(|&(i, st, _)| (tokens[i], st)).collect();
        let step = bk!(StepPlan::batch(&seqs, LogitRows::Last).and_then(|p| be.step(p)))?;
        let mut states = Vec::with_capacity(ok.len());
        let mut at = ok.iter().peekable();
        for (i, s) in sessions.iter_mut().enumerate() {
            let Some(&(_, _, end)) = at.next_if(|&&(j, _, _)| j == i) else {
                continue;
            };
            let st = made(m, &mut s.state)?;
            m.written(st, end);
            states.push(st);
        }
        let o = m.forward(&step, &mut states)?;
        let logits = o
            .logits
            .ok_or_else(|| ModelError::Other("a pass returned no logits".into()))?;
        let (rows, vocab) = be.dims(&logits);
        if rows != ok.len() {
            return Err(ModelError::Other(format!(
                "a pass over {} sequences returned {rows} logits rows",
                ok.len()
            )));
        }
        let data = bk!(be.to_host(&logits))?;
        let mut out: Vec<Option<Logits>> = vec![None; sessions.len()];
        for (r, &(i, _, _)) in ok.iter().enumerate() {
            out[i] = Some(Logits {
                rows: 1,
                vocab,
                data: data[r * vocab..(r + 1) * vocab].to_vec(),
            });
        }
        Ok(out)
    }
}

/// [`crate::model::CausalLm::forward_batch`] of decoder `D`: its sessions run in one pass; a
/// batch holding any other session is refused whole.
pub fn forward_batch<D: Decoder>(
    sessions: &mut [&mut dyn Session],
    tokens: &[&[u32]],
) -> Vec<R<Logits>> {
    let mut typed = Vec::with_capacity(sessions.len());
    for s in sessions.iter_mut() {
        match s
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<DecoderSession<D>>())
        {
            Some(d) => typed.push(d),
            None => {
                let e = "a batch holds a session of another model";
                return sessions
                    .iter()
                    .map(|_| Err(ModelError::Other(e.into())))
                    .collect();
            }
        }
    }
    DecoderSession::forward_batch(&mut typed, tokens)
}

impl<D: Decoder> Session for DecoderSession<D> {
    fn forward(&mut self, tokens: &[u32], all: bool) -> R<Logits> {
        let be = Arc::clone(self.model.backend());
        let split = all
            && self
                .model
                .max_logit_rows()
                .is_some_and(|m| tokens.len() > m);
        if !split {
            let l = self.pass(tokens, all)?;
            let (rows, vocab) = be.dims(&l);
            let data = bk!(be.to_host(&l))?;
            return Ok(Logits { rows, vocab, data });
        }
        // every row's logits through rings: one pass per chunk, gathered on the host; a
        // failure leaves the session as it was before the call
        self.check(tokens)?;
        let chunk = self.model.max_logit_rows().unwrap_or(tokens.len()).max(1);
        let start = self.len;
        let mut out = Logits {
            rows: 0,
            vocab: self.model.info().vocab_size,
            data: Vec::new(),
        };
        for c in tokens.chunks(chunk) {
            let r = self.pass(c, true).and_then(|l| bk!(be.to_host(&l)));
            match r {
                Ok(d) => {
                    out.rows += c.len();
                    out.data.extend(d);
                }
                Err(e) => {
                    // the failed pass undid its own writes (or broke the session)
                    let held = self.len;
                    if !self.broken {
                        self.fail(start, held);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn sampler(
        &self,
        params: &SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> R<Box<dyn TokenSampler>> {
        BackendSampler::boxed(self.model.backend(), params, prompt, vocab)
    }

    fn forward_sample(
        &mut self,
        tokens: &[u32],
        sampler: &mut dyn TokenSampler,
        banned: &[u32],
    ) -> R<u32> {
        let pipelined = tokens.len() == 1 && self.model.rewritable();
        match sampler.as_any_mut().downcast_mut::<BackendSampler<D::B>>() {
            Some(s) if pipelined => self.pass_sampled(tokens[0], s, banned),
            Some(s) => {
                let l = self.pass(tokens, false)?;
                s.sample(l, banned)
            }
            None => host_forward_sample(self, tokens, sampler, banned),
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn rewind(&mut self, n: usize) -> R<()> {
        self.graph.forget_inflight();
        if n == 0 && (self.broken || !self.model.rewritable()) {
            // a fresh state (the recorded step addresses the one dropped here)
            self.graph = StepReplay::default();
            self.state = None;
            self.len = 0;
            self.broken = false;
            self.hidden = None;
            self.snaps.clear();
            return Ok(());
        }
        if n > self.len {
            return Err(ModelError::Rewind {
                to: n,
                why: format!("only {} tokens held", self.len),
            });
        }
        if self.broken {
            return Err(ModelError::Rewind {
                to: n,
                why: "the session state is invalid after a failed step; rewind to 0".into(),
            });
        }
        if n == self.len {
            return Ok(());
        }
        if self.recurrent_model() {
            self.restore(n)?;
        } else if let Some(s) = &mut self.state {
            self.model.rewind(s, self.len, n)?;
        }
        self.len = n;
        self.hidden = None;
        Ok(())
    }

    fn rewind_near(&mut self, n: usize) -> R<usize> {
        if !self.recurrent_model() || self.broken || n >= self.len {
            return self.rewind(n).map(|_| n);
        }
        // the newest snapshot at or before n (else from the start)
        let at = self
            .snaps
            .iter()
            .map(|(p, _)| *p)
            .filter(|&p| p <= n)
            .max()
            .unwrap_or(0);
        self.rewind(at).map(|_| at)
    }
}
