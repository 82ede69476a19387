//! The op-level interface every backend implements. Models are written once over [`Backend`];
//! a backend knows tensors and ops, never Gemma or Qwen. `Backend` is four traits by purpose:
//! [`Runtime`] (storage, uploads, steps, recording and replaying a step), [`Ops`] (the primitive
//! ops), [`Fused`] (ops a backend may fuse, each defaulting to its composition of primitives) and
//! [`Sampling`] (a sampler per sequence where the logits are).
//!
//! Conventions:
//! - Activations are 2-D, row-major `[rows, cols]`: one row per token position.
//! - A weight matrix is `[out, in]` (PyTorch order) and stays in its checkpoint format; `linear`
//!   computes `x @ w^T`. Expert banks are `[n_experts, out, in]`.
//! - Ops return new tensors; the CPU backend allocates, a GPU backend draws from a pool.
//! - Every fallible op returns `BackendError`; shape mismatches are errors, not panics.

pub mod blocks;
pub mod cpu;
pub mod cuda;
pub mod diff;
pub mod error;
pub mod kv_type;
pub mod step;
#[cfg(test)]
mod tests_fused;
pub use error::BackendError;
pub use kv_type::KvType;
pub use step::{LogitRows, SeqRows, Step, StepPlan};

/// A backend's step type.
pub type StepOf<B> = Step<<B as Runtime>::StepData>;

/// `be`'s step of `rows` rows of token 0 at positions `pos0 ..` ([`StepPlan::at`]).
pub fn step_at<B: Runtime + ?Sized>(be: &B, pos0: usize, rows: usize) -> Result<StepOf<B>> {
    be.step(StepPlan::at(pos0, rows)?)
}

use crate::ops::{RopeLayout, RopeSpec};
use crate::sampling::SamplingParams;

pub type Result<T> = std::result::Result<T, BackendError>;

/// Elementwise gate of a gated linear unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// gelu_pytorch_tanh (Gemma's GeGLU)
    GeluTanh,
    /// SiLU (Qwen's SwiGLU)
    Silu,
}

/// How a norm applies its weight.
#[derive(Debug, Clone, Copy)]
pub enum Norm<'a, T> {
    /// x_hat * w
    Plain(&'a T),
    /// x_hat * (1 + w)
    OnePlus(&'a T),
    /// x_hat
    None,
}

impl<'a, T> Norm<'a, T> {
    /// The same norm again (`Norm` is `Copy` only when `T` is; this is not bound by that).
    pub fn reborrow(&self) -> Norm<'a, T> {
        match *self {
            Norm::Plain(w) => Norm::Plain(w),
            Norm::OnePlus(w) => Norm::OnePlus(w),
            Norm::None => Norm::None,
        }
    }
}

/// What [`Backend::attn_prep`] does to one attention layer's q, k and v before attention.
#[derive(Debug)]
pub struct AttnPrep<'a, T> {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Per-head RMSNorm (groups of `rope.head_dim`) of q; None: no norm.
    pub q_norm: Option<Norm<'a, T>>,
    /// Per-head RMSNorm of k (before RoPE); None: no norm.
    pub k_norm: Option<Norm<'a, T>>,
    /// Per-head RMSNorm of v before it is cached (Gemma 4's weightless v-norm); None: no norm.
    pub v_norm: Option<Norm<'a, T>>,
    pub eps: f32,
    /// RoPE of q and k (its head_dim is the head size of all three).
    pub rope: &'a Rope,
}

/// What [`Backend::norm_add_rms_norm`] does to a branch output before the residual add, and to
/// the sum (Gemma's sandwich norms around attention and the FFN, Gemma 4's layer scalar).
#[derive(Debug)]
pub struct PostNorm<'a, T> {
    /// RMSNorm of the branch output before it is added (Gemma's post-attention / post-FFN
    /// norm); None: added as it is.
    pub norm: Option<Norm<'a, T>>,
    /// Multiplier on the sum (Gemma 4's `layer_scalar`); None: none.
    pub scale: Option<f32>,
}

/// [`Backend::attn_prep`] composed of the plain ops, in the order the models ran them: q norm,
/// k norm, v norm, RoPE of q, RoPE of k, kv_write (the trait's default; public so a backend
/// overriding it can be checked against this composition on the same device).
pub fn attn_prep_composed<B: Ops + ?Sized>(
    be: &B,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
    cache: &mut B::KvCache,
    step: &StepOf<B>,
    p: &AttnPrep<'_, B::Tensor>,
) -> Result<B::Tensor> {
    let hd = p.rope.head_dim;
    let norm = |x: &B::Tensor, n: &Option<Norm<'_, B::Tensor>>| -> Result<Option<B::Tensor>> {
        n.as_ref()
            .map(|n| be.rms_norm(x, n.reborrow(), p.eps, hd))
            .transpose()
    };
    let qn = norm(q, &p.q_norm)?;
    let kn = norm(k, &p.k_norm)?;
    let vn = norm(v, &p.v_norm)?;
    let q = be.rope(qn.as_ref().unwrap_or(q), p.n_heads, step, p.rope)?;
    let k = be.rope(kn.as_ref().unwrap_or(k), p.n_kv_heads, step, p.rope)?;
    be.kv_write(cache, step, &k, vn.as_ref().unwrap_or(v))?;
    Ok(q)
}

/// What reads the normed row in [`Backend::linear_add_rms_norm_then`].
pub enum NormNext<'a, W> {
    /// `linear_glu(n, w, act)` of a fused `[gate; up]` weight: one output.
    Glu(&'a W, Activation),
    /// `linear(n, w)` of each weight (e.g. the q, k and v projections): one output each.
    Linear(&'a [&'a W]),
}

/// [`Backend::linear_add_rms_norm_then`] composed of the plain ops (the trait's default; public
/// so a backend overriding it can be checked against it): `linear`, `add_rms_norm` over the
/// whole row, then `next`'s ops on the normed row.
pub fn linear_add_rms_norm_then_composed<B: Fused + ?Sized>(
    be: &B,
    x: &B::Tensor,
    w: &B::Weight,
    h: &B::Tensor,
    norm: Norm<'_, B::Tensor>,
    eps: f32,
    next: &NormNext<'_, B::Weight>,
) -> Result<(B::Tensor, Vec<B::Tensor>)> {
    let y = be.linear(x, w)?;
    let dim = be.dims(&y).1;
    let (s, n) = be.add_rms_norm(h, &y, norm, eps, dim)?;
    Ok((s, norm_next_apply(be, &n, next)?))
}

/// `next`'s ops on the normed row `n`: its outputs in order.
pub fn norm_next_apply<B: Fused + ?Sized>(
    be: &B,
    n: &B::Tensor,
    next: &NormNext<'_, B::Weight>,
) -> Result<Vec<B::Tensor>> {
    match next {
        NormNext::Glu(g, act) => Ok(vec![be.linear_glu(n, g, *act)?]),
        NormNext::Linear(ws) => ws.iter().map(|w| be.linear(n, w)).collect(),
    }
}

/// Rotary embedding parameters for one layer (positions are passed per call).
#[derive(Debug, Clone)]
pub struct Rope {
    pub head_dim: usize,
    pub rot_dims: usize,
    pub theta: f32,
    pub layout: RopeLayout,
    pub freq_factors: Option<Vec<f32>>,
    pub freq_base_dims: usize,
}

impl Rope {
    pub fn spec(&self) -> RopeSpec<'_> {
        RopeSpec {
            head_dim: self.head_dim,
            rot_dims: self.rot_dims,
            theta: self.theta,
            layout: self.layout,
            freq_factors: self.freq_factors.as_deref(),
            freq_base_dims: self.freq_base_dims,
        }
    }
}

/// Shape of one attention layer's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Positions `0 .. capacity` may be written.
    pub capacity: usize,
    /// `Some(slots)`: a ring that keeps only the latest positions written, at least `slots` of
    /// them (position p lives in slot p mod the ring's size; the CUDA cache rounds the size up
    /// to whole pages), for sliding-window layers: attention that reaches a position the ring
    /// no longer holds is the caller's error. `None`: every position below `capacity`.
    pub ring: Option<usize>,
}

impl KvShape {
    /// A cache of every position below `capacity`.
    pub fn full(n_kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        KvShape {
            n_kv_heads,
            head_dim,
            capacity,
            ring: None,
        }
    }
}

/// Parameters of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnParams {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier on q.k (1/sqrt(head_dim) for most models, 1.0 for Gemma 4).
    pub scale: f32,
    /// Sliding window in tokens: a query at position p sees keys in (p - window, p].
    pub window: Option<usize>,
    /// Optional tanh soft-cap on attention scores.
    pub softcap: Option<f32>,
}

/// Mixture-of-experts routing parameters.
#[derive(Debug, Clone, Copy)]
pub struct MoeParams {
    pub n_experts: usize,
    pub top_k: usize,
    /// Renormalise the selected top-k probabilities to sum to one.
    pub norm_topk: bool,
    pub act: Activation,
}

/// Whether `parts` can be fused by [`Backend::upload_concat`]: two or more 2-D matrices of one
/// GGML format (whole rows of blocks), one width, no separate scales.
pub fn can_concat(parts: &[crate::weights::TensorRef<'_>]) -> bool {
    use crate::weights::TensorFormat;
    let Some(first) = parts.first() else {
        return false;
    };
    parts.len() >= 2
        && parts.iter().all(|p| {
            matches!(p.format, TensorFormat::Ggml(_))
                && p.format == first.format
                && p.shape.len() == 2
                && p.cols() == first.cols()
                && p.scales.block.is_none()
                && p.rows() > 0
                && p.data.len() % p.rows() == 0
        })
}

/// A recorded forward pass (a CUDA graph on the CUDA backend), opaque to the models that keep it.
pub struct RecordedStep(pub Box<dyn std::any::Any + Send>);

impl std::fmt::Debug for RecordedStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordedStep")
    }
}

/// What a model may need beyond the ops every backend runs; a backend without it says so at
/// load time ([`Backend::lacks`]), before any weight is uploaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Qwen3.5 / 3.6 Gated DeltaNet layers (conv1d, gates, the delta rule).
    GatedDeltaNet,
    /// NVFP4 weights (ModelOpt, compressed-tensors).
    Nvfp4Weights,
}

/// Which backend a command runs on (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// CUDA when a driver is present and the device opens, else the CPU (with one log line).
    Auto,
    Cpu,
    Cuda,
}

/// What a backend is as a device: storage for tensors, weights and KV caches, steps, and
/// recording and replaying a step.
pub trait Runtime: Send + Sync + 'static {
    /// An activation tensor `[rows, cols]` (f32 semantics).
    type Tensor: Send + Sync;

    /// A parameter in its checkpoint format (matrix, expert bank, or vector).
    type Weight: Send + Sync;

    /// One attention layer's K and V storage for one sequence.
    type KvCache: Send;

    /// What the backend makes of a [`StepPlan`] (the CUDA backend: ids and positions in device
    /// memory); ops of the step read it from the [`Step`].
    type StepData: Send + 'static;

    fn name(&self) -> &'static str;

    /// Bytes `elems` cached K and V elements take on this backend, their scales included (an
    /// f32 cache by default). A model sizes its context from this and the KV budget.
    fn kv_bytes(&self, elems: usize) -> u64 {
        4 * elems as u64
    }

    /// Device memory free now, in bytes (None: host memory, not budgeted).
    fn free_memory(&self) -> Option<u64> {
        None
    }

    /// Why this backend cannot run what `need` names (None: it can, the default). Asked by the
    /// model loader before anything is uploaded.
    fn lacks(&self, _need: Need) -> Option<String> {
        None
    }

    // ---- steps ----
    /// The step of `plan`, made once for a forward pass (the CUDA backend uploads its ids and
    /// positions here, once).
    fn step(&self, plan: StepPlan) -> Result<StepOf<Self>>;

    /// Make `step` describe `plan`, in place where the rows match, so that a step recorded with
    /// it ([`Backend::record_begin`]) replays `plan`. Default: a new step.
    fn step_set(&self, step: &mut StepOf<Self>, plan: StepPlan) -> Result<()> {
        *step = self.step(plan)?;
        Ok(())
    }

    // ---- recorded steps (CUDA graphs) ----
    /// Start recording the ops of one forward pass over `step` instead of running them. Returns
    /// `false` when this backend does not record (the default): run the ops normally.
    fn record_begin(&self, _step: &StepOf<Self>) -> Result<bool> {
        Ok(false)
    }

    /// Stop recording; the returned recording replays every recorded op over whatever its step
    /// holds at each replay. Tensors produced while recording keep their storage and receive
    /// each replay's results.
    fn record_end(&self, _step: &StepOf<Self>) -> Result<RecordedStep> {
        Err(BackendError::Unsupported {
            op: "record_end",
            backend: self.name(),
            detail: "this backend does not record steps".into(),
        })
    }

    /// Abandon a recording that failed half-way (the ops recorded so far are discarded).
    fn record_abort(&self) {}
    /// Run a recording over `step`, the step it was recorded with (rewritten by
    /// [`Backend::step_set`] or fed by a draw since); another step is an error.
    fn replay(&self, _rec: &RecordedStep, _step: &StepOf<Self>) -> Result<()> {
        Err(BackendError::Unsupported {
            op: "replay",
            backend: self.name(),
            detail: "this backend does not record steps".into(),
        })
    }

    // ---- data movement ----
    fn upload(&self, w: &crate::weights::TensorRef<'_>) -> Result<Self::Weight>;

    fn tensor(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor>;

    /// Upload matrices `[rows_i, cols]` stored in one GGML format as a single
    /// `[sum(rows_i), cols]` weight (a fused projection: QKV, gate|up), so one GEMV / GEMM reads
    /// them all. The default concatenates the rows on the host (a transient copy) and uploads
    /// once; callers check [`can_concat`] first.
    fn upload_concat(
        &self,
        name: &str,
        parts: &[crate::weights::TensorRef<'_>],
    ) -> Result<Self::Weight> {
        if !can_concat(parts) {
            return Err(BackendError::Shape {
                op: "upload_concat",
                detail: format!(
                    "{name}: parts differ in format or width, or are not GGML matrices"
                ),
            });
        }
        let rows: usize = parts.iter().map(|p| p.rows()).sum();
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        for p in parts {
            data.extend_from_slice(p.data);
        }
        self.upload(&crate::weights::TensorRef {
            name: name.to_string(),
            shape: vec![rows, parts[0].cols()],
            format: parts[0].format,
            data: &data,
            scales: Default::default(),
        })
    }

    fn to_host(&self, t: &Self::Tensor) -> Result<Vec<f32>>;

    fn dims(&self, t: &Self::Tensor) -> (usize, usize);

    /// A weight vector (norm weight, scalar) as an f32 tensor `[1, n]`.
    fn weight_vector(&self, w: &Self::Weight) -> Result<Self::Tensor>;

    // ---- attention ----
    fn kv_cache(&self, shape: KvShape) -> Result<Self::KvCache>;

    /// The caches of one new sequence, one per shape (its attention layers' in order), where the
    /// backend may lay them out beside other sequences' (the CUDA backend's KV arena, in which a
    /// step of several sequences runs a layer's cache write and attention in one launch each).
    /// Default: [`Self::kv_cache`] of each.
    fn kv_caches(&self, shapes: &[KvShape]) -> Result<Vec<Self::KvCache>> {
        shapes.iter().map(|s| self.kv_cache(*s)).collect()
    }

    /// Copy the first `n` positions of `src` into `dst` (KV sharing / rewinds).
    fn kv_truncate(&self, cache: &mut Self::KvCache, len: usize) -> Result<()>;
}

/// The primitive ops the models are written with (the CPU backend is their reference).
pub trait Ops: Runtime {
    // ---- matrix ops ----
    /// The rows of an embedding table `[vocab, dim]` for the step's token ids, times `scale`.
    fn embed(&self, table: &Self::Weight, step: &StepOf<Self>, scale: f32) -> Result<Self::Tensor>;

    /// `x @ w^T`: `[n, in] x [out, in] -> [n, out]`.
    fn linear(&self, x: &Self::Tensor, w: &Self::Weight) -> Result<Self::Tensor>;

    // ---- elementwise and shape ----
    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;

    /// Elementwise product; `b` may be `[1, cols]` (broadcast over rows).
    fn mul(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;

    fn scale(&self, a: &Self::Tensor, s: f32) -> Result<Self::Tensor>;

    /// act(gate) * up.
    fn glu(&self, gate: &Self::Tensor, up: &Self::Tensor, act: Activation) -> Result<Self::Tensor>;

    /// x * sigmoid(gate); `gate` may also be `[n, 1]` (one gate per row, broadcast over columns,
    /// as in Qwen3.5's shared-expert gate).
    fn sigmoid_gate(&self, x: &Self::Tensor, gate: &Self::Tensor) -> Result<Self::Tensor>;

    fn softcap(&self, x: &Self::Tensor, cap: f32) -> Result<Self::Tensor>;

    /// Columns `[start, start + len)` of every row.
    fn slice_cols(&self, x: &Self::Tensor, start: usize, len: usize) -> Result<Self::Tensor>;

    /// Rows `[start, start + len)` (e.g. the last position before the LM head).
    fn slice_rows(&self, x: &Self::Tensor, start: usize, len: usize) -> Result<Self::Tensor>;

    /// Concatenate along columns.
    fn concat_cols(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor>;

    /// Stack along rows (one width): the sequences of a step put back together.
    fn concat_rows(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor>;

    /// Split every head of `x` (`n_heads` groups of `sum(sizes)` columns) into one tensor per
    /// part: `[n, n_heads * sum] -> [[n, n_heads * sizes[i]]]`.
    fn split_heads(
        &self,
        x: &Self::Tensor,
        n_heads: usize,
        sizes: &[usize],
    ) -> Result<Vec<Self::Tensor>>;

    // ---- normalisation and position ----
    /// RMSNorm over groups of `dim` columns (dim == cols for a whole-row norm, head_dim for
    /// per-head q/k norms); the weight has `dim` entries.
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: Norm<'_, Self::Tensor>,
        eps: f32,
        dim: usize,
    ) -> Result<Self::Tensor>;

    /// L2-normalise groups of `dim` columns: x / sqrt(sum(x^2) + eps).
    fn l2_norm(&self, x: &Self::Tensor, eps: f32, dim: usize) -> Result<Self::Tensor>;

    /// Rotate `n_heads` heads of each row, row i at the step's position of row i.
    fn rope(
        &self,
        x: &Self::Tensor,
        n_heads: usize,
        step: &StepOf<Self>,
        rope: &Rope,
    ) -> Result<Self::Tensor>;

    /// Write `k`, `v` (`[n, n_kv*hd]`) at the step's positions.
    fn kv_write(
        &self,
        cache: &mut Self::KvCache,
        step: &StepOf<Self>,
        k: &Self::Tensor,
        v: &Self::Tensor,
    ) -> Result<()>;

    /// Causal attention of `q` (`[n, n_heads*hd]`, rows at the step's positions) over the
    /// cache's positions up to each row's (limited by the window). Returns `[n, n_heads*hd]`.
    fn attention(
        &self,
        q: &Self::Tensor,
        cache: &Self::KvCache,
        step: &StepOf<Self>,
        p: &AttnParams,
    ) -> Result<Self::Tensor>;

    // ---- mixture of experts ----
    /// Softmax router over `router_logits` (`[n, n_experts]`), top-k, then
    /// `sum_k p_k * down_k(act(gate_k x) * up_k x)`. Expert banks are `[E, out, in]`.
    fn moe(
        &self,
        x: &Self::Tensor,
        router_logits: &Self::Tensor,
        gate: &Self::Weight,
        up: &Self::Weight,
        down: &Self::Weight,
        p: &MoeParams,
    ) -> Result<Self::Tensor>;

    // ---- Gated DeltaNet (Qwen3.5 linear attention) ----
    /// Depthwise causal conv1d (kernel k) over columns, followed by SiLU. `state` holds the last
    /// `k-1` inputs `[k-1, channels]` and is updated. `w` is `[channels, k]`.
    fn causal_conv1d_silu(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        state: &mut Self::Tensor,
    ) -> Result<Self::Tensor>;

    /// Gated DeltaNet gates: `g = neg_a * softplus(a + dt_bias)` and `beta = sigmoid(b)`, where
    /// `a`, `b` are `[n, n_v]` and `neg_a` (= -exp(A_log)), `dt_bias` are `[1, n_v]`.
    /// Returns `(g, beta)`.
    fn gdn_gates(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
        neg_a: &Self::Tensor,
        dt_bias: &Self::Tensor,
    ) -> Result<(Self::Tensor, Self::Tensor)>;

    /// The gated delta rule, token by token. Per value head h (with key head kh(h)):
    /// S <- exp(g) S; delta = beta (v - S^T k); S <- S + k delta^T; o = S^T q.
    /// q, k: `[n, n_v_heads*dk]` (already expanded to value heads, normalised, q scaled);
    /// v: `[n, n_v*dv]`; g, beta: `[n, n_v]`; state: `[n_v, dk*dv]` updated in place.
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_rule(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        g: &Self::Tensor,
        beta: &Self::Tensor,
        state: &mut Self::Tensor,
        dk: usize,
        dv: usize,
    ) -> Result<Self::Tensor>;
}

/// Ops a backend may run fused. Each default is the composition of primitive ops (what the CPU
/// backend runs, and the reference for a fused form); an `Option` result lets a backend decline
/// inputs it does not fuse, and the caller then runs the composition.
pub trait Fused: Ops {
    /// `act(x[:, ..ff]) * x[:, ff..]` of a fused gate|up projection `[n, 2 ff]`.
    fn glu_fused(&self, x: &Self::Tensor, act: Activation) -> Result<Self::Tensor> {
        let (_, c) = self.dims(x);
        if c % 2 != 0 {
            return Err(BackendError::Shape {
                op: "glu_fused",
                detail: format!("{c} columns is not gate|up halves"),
            });
        }
        let g = self.slice_cols(x, 0, c / 2)?;
        let u = self.slice_cols(x, c / 2, c / 2)?;
        self.glu(&g, &u, act)
    }

    /// [`Backend::glu_fused`] of [`Backend::linear`]: `act(x Wg^T) * (x Wu^T)` for a fused
    /// `[2 ff, in]` gate|up weight. A backend may run it as one kernel (the CUDA decode GEMV's
    /// `__glu` entry); the result is the same values.
    fn linear_glu(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        act: Activation,
    ) -> Result<Self::Tensor> {
        let y = self.linear(x, w)?;
        self.glu_fused(&y, act)
    }

    /// The residual add and the RMSNorm of its sum in one op: `(h + y, rms_norm(h + y))`
    /// (a decoder's residual stream followed by the next norm). Default: `add` then `rms_norm`.
    fn add_rms_norm(
        &self,
        h: &Self::Tensor,
        y: &Self::Tensor,
        w: Norm<'_, Self::Tensor>,
        eps: f32,
        dim: usize,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let s = self.add(h, y)?;
        let n = self.rms_norm(&s, w, eps, dim)?;
        Ok((s, n))
    }

    /// A branch's output projection, the residual add, the next RMSNorm over the whole row and
    /// what reads it, as one op: `s = h + x w^T`, `n = rms_norm(s)`, returns `(s, next(n))`
    /// (a decoder's o_proj or down projection, the add, the next norm and the gate|up or q/k/v
    /// projections). Default: [`linear_add_rms_norm_then_composed`]. A backend may hand the
    /// norm over deferred (the CUDA decode GEMVs: the projections scale their dots by the
    /// norm's rstd); the results are the same values up to rounding.
    fn linear_add_rms_norm_then(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        h: &Self::Tensor,
        norm: Norm<'_, Self::Tensor>,
        eps: f32,
        next: &NormNext<'_, Self::Weight>,
    ) -> Result<(Self::Tensor, Vec<Self::Tensor>)> {
        linear_add_rms_norm_then_composed(self, x, w, h, norm, eps, next)
    }

    /// Whether [`Backend::linear_add_rms_norm_then`] hands the norm over deferred for the
    /// producer `w` and the consumers `next` (its rows then are not those of
    /// [`linear_add_rms_norm_then_composed`]). Where it does not, a caller may run the
    /// composition's ops itself (e.g. to fuse the consumers with what follows them) and get the
    /// same results. Default: false.
    fn defers_norm(&self, _w: &Self::Weight, _next: &NormNext<'_, Self::Weight>) -> Result<bool> {
        Ok(false)
    }

    /// A residual add with a norm on each side in one op:
    /// `s = (h + rms_norm(y, post.norm)) * post.scale`, returns `(s, rms_norm(s, w))`, both norms
    /// over groups of `dim` with `eps` (Gemma: the post-attention norm, the add and `ffn_norm`;
    /// the post-FFN norm, the add, the layer scalar and the next layer's input norm or the final
    /// norm). Default: rms_norm, then `add_rms_norm` or add, scale, rms_norm.
    fn norm_add_rms_norm(
        &self,
        h: &Self::Tensor,
        y: &Self::Tensor,
        post: &PostNorm<'_, Self::Tensor>,
        w: Norm<'_, Self::Tensor>,
        eps: f32,
        dim: usize,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let yn = match &post.norm {
            Some(n) => Some(self.rms_norm(y, n.reborrow(), eps, dim)?),
            None => None,
        };
        let y = yn.as_ref().unwrap_or(y);
        match post.scale {
            None => self.add_rms_norm(h, y, w, eps, dim),
            Some(c) => {
                let s = self.add(h, y)?;
                let s = self.scale(&s, c)?;
                let n = self.rms_norm(&s, w, eps, dim)?;
                Ok((s, n))
            }
        }
    }

    /// The attention input of one layer in one op: per-head RMSNorm of q, k and v as `p` says,
    /// RoPE of q and k at the step's positions, k and v written to `cache` there. `q` is
    /// `[n, n_heads*hd]`, `k` and `v` `[n, n_kv*hd]`; returns the rotated q. Default:
    /// [`attn_prep_composed`] (rms_norm, rope, kv_write).
    fn attn_prep(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cache: &mut Self::KvCache,
        step: &StepOf<Self>,
        p: &AttnPrep<'_, Self::Tensor>,
    ) -> Result<Self::Tensor> {
        attn_prep_composed(self, q, k, v, cache, step, p)
    }

    /// [`Fused::attn_prep`] over a step of several sequences, each sequence's rows written to
    /// its own cache (`caches[j]`: the step's sequence j's), as one op where the backend has it:
    /// the rotated q of every row. None where it does not (the caller runs `attn_prep` per
    /// sequence). Default: None.
    fn attn_prep_seqs(
        &self,
        _q: &Self::Tensor,
        _k: &Self::Tensor,
        _v: &Self::Tensor,
        _caches: &mut [&mut Self::KvCache],
        _step: &StepOf<Self>,
        _p: &AttnPrep<'_, Self::Tensor>,
    ) -> Result<Option<Self::Tensor>> {
        Ok(None)
    }

    /// [`Ops::attention`] over a step of several sequences, each row of `q` over its own
    /// sequence's cache (`caches[j]`: the step's sequence j's), as one op where the backend has
    /// it. None where it does not (the caller runs `attention` per sequence). Default: None.
    fn attention_seqs(
        &self,
        _q: &Self::Tensor,
        _caches: &[&Self::KvCache],
        _step: &StepOf<Self>,
        _p: &AttnParams,
    ) -> Result<Option<Self::Tensor>> {
        Ok(None)
    }

    /// One decode row's fused q|k|v projection (`w`: the q, k and v weights stacked by rows)
    /// followed by [`Backend::attn_prep`], as one op where the backend has it: the rotated q,
    /// K and V written to `cache` at the step's position. None where it does not take the inputs (the caller
    /// runs `linear`, then `attn_prep`). Default: None.
    fn linear_attn_prep(
        &self,
        _x: &Self::Tensor,
        _w: &Self::Weight,
        _cache: &mut Self::KvCache,
        _step: &StepOf<Self>,
        _p: &AttnPrep<'_, Self::Tensor>,
    ) -> Result<Option<Self::Tensor>> {
        Ok(None)
    }

    /// A MoE block's routed experts from its input: the router logits `x @ router^T`
    /// (`router` `[n_experts, in]`), then [`Backend::moe`]. Default: `linear`, then `moe`; a
    /// backend may route and run the experts in fewer launches (the CUDA backend's one-row
    /// decode path: router GEMV + top-k, gate/up + GLU, down + weighted sum).
    /// `add_rms_norm(h, y, w, eps, h.cols)` then `moe_routed` of the normed row, as one op:
    /// returns `(h + y, moe_routed(norm(h + y)))`, or None when this backend does not fuse the
    /// two for these inputs (the caller then runs them one after the other; same results up to
    /// rounding). Default: None.
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm_moe_routed(
        &self,
        _h: &Self::Tensor,
        _y: &Self::Tensor,
        _w: Norm<'_, Self::Tensor>,
        _eps: f32,
        _router: &Self::Weight,
        _gate: &Self::Weight,
        _up: &Self::Weight,
        _down: &Self::Weight,
        _p: &MoeParams,
    ) -> Result<Option<(Self::Tensor, Self::Tensor)>> {
        Ok(None)
    }

    fn moe_routed(
        &self,
        x: &Self::Tensor,
        router: &Self::Weight,
        gate: &Self::Weight,
        up: &Self::Weight,
        down: &Self::Weight,
        p: &MoeParams,
    ) -> Result<Self::Tensor> {
        let logits = self.linear(x, router)?;
        self.moe(x, &logits, gate, up, down, p)
    }
}

/// Sampling on the backend: a sampler per sequence kept where the logits are.
pub trait Sampling: Runtime {
    /// One sequence's sampler: its random stream and the tokens it has observed (prompt and
    /// generated, for the penalties), kept where the logits are.
    type SamplerState: Send + 'static;

    // ---- sampling ----
    /// A sampler for one sequence over a vocabulary of `vocab`: `prompt` counts as observed for
    /// the repetition penalty (as in `engine::Sampler`).
    fn sampler_new(
        &self,
        params: &SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> Result<Self::SamplerState>;

    /// Record a token chosen outside `sample` (a forced token) as generated.
    fn sampler_accept(&self, state: &mut Self::SamplerState, id: u32) -> Result<()>;

    /// Pick the next token from the last row of `logits` (`[rows, vocab]`, consumed: the
    /// penalties are applied in place) with the semantics of `engine::Sampler::sample`:
    /// repetition penalty over observed tokens, presence / frequency penalties over generated
    /// ones, `banned` ids never chosen, then temperature / top-k / top-p / min-p / seeded draw
    /// (temperature 0: argmax, lowest id on ties, bit-reproducible). The chosen id is recorded
    /// as generated. Only the id comes back to the host.
    fn sample(
        &self,
        logits: Self::Tensor,
        state: &mut Self::SamplerState,
        banned: &[u32],
    ) -> Result<u32>;

    // ---- pipelined decode (model::common::replay) ----
    /// `sample` started without waiting: the same draw on the last row of `logits` (borrowed:
    /// a recorded step's output, penalised in place), the id read back in the background;
    /// `sample_finish` returns it. `feed`: a one-row step and a position; the draw makes the
    /// step that token at that position on the device (its plan becomes
    /// [`StepPlan::fed`]), so work queued after this call (a replay over that step) runs while
    /// the host waits. Ok(false): not supported here (nothing was started, `feed` untouched;
    /// sample with `sample`).
    fn sample_begin(
        &self,
        _logits: &Self::Tensor,
        _state: &mut Self::SamplerState,
        _banned: &[u32],
        _feed: Option<(&mut StepOf<Self>, usize)>,
    ) -> Result<bool> {
        Ok(false)
    }

    /// The id drawn by the last `sample_begin` of `state` (waits for it).
    fn sample_finish(&self, _state: &mut Self::SamplerState) -> Result<u32> {
        Err(BackendError::Unsupported {
            op: "sample_finish",
            backend: self.name(),
            detail: "this backend samples synchronously".into(),
        })
    }
}

/// A backend: everything a model needs ([`Runtime`], [`Ops`], [`Fused`], [`Sampling`]); every
/// type with all four is one.
pub trait Backend: Fused + Sampling {}

impl<T: Fused + Sampling> Backend for T {}
