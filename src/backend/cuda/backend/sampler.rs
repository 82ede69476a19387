//! Sampling on the device: the `Backend` sampler ops of [`CudaBackend`] and the typed launches of
//! the `penalties` kernels they use.
//!
//! One sampling step, all on the stream (capturable: no allocation, no host copy):
//! `penalties` (when a penalty is on) -> `penalties__ban` (when ids are banned) -> `sample` ->
//! `penalties__count` (when a penalty is on: count[sampled] += 1, read from device memory). Only
//! the sampled id (4 bytes) comes back. The token-count history stays on the device for the whole
//! generation; the banned ids are uploaded only when the set changes (at most twice a request:
//! `min_tokens`).
//!
//! Semantics: the penalties and bans are `engine::Sampler`'s, bit for bit (`ops::penalties`);
//! the draw is the `sample` kernel's (`ops::sample`: same filters as the CPU sampler, its own
//! counter-based random stream). Greedy is the argmax, lowest id on ties, as on the CPU.

use crate::kernels::Entry;
use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::CudaBackend;
use crate::backend::cuda::runtime::buf::{bind, read_ptr, DevBuf, DevPtr};
use crate::backend::cuda::runtime::error::{drv, CudaError};
use crate::backend::cuda::runtime::readback::PooledReadback;
use crate::backend::cuda::runtime::types::GpuTensor;
use crate::backend::cuda::CudaDevice;
use crate::backend::BackendError;
use crate::kernels::{BatchBucket, HeadDim, KernelSpec, Op, Quant};
use crate::ops::penalties::{initial_counts, Penalties};
use crate::ops::sample::SampleParams;
use crate::sampling::SamplingParams;

/// Most banned ids per step (EOS and stop ids); more is an error.
pub const MAX_BANNED: usize = 256;

/// Logits per block of the multi-block `sample` kernel (its CH): grid (ceil(V / 4096), rows).
pub const SAMPLE_BLOCK_LOGITS: usize = 4096;
/// Most blocks per row (the last block scans one candidate count per block with its threads).
const SAMPLE_MAX_BLOCKS: usize = 1024;

/// u32 words of `sample` scratch per row of `vocab` logits: the arrival counter, per-block
/// arg-maxes, candidate counts and lists, and the merged list (ops/sample.cu.tera). Must be zero
/// before the first launch; the kernel leaves the counter zero, so one buffer serves every step.
pub fn sample_scratch_words(vocab: usize) -> usize {
    let nb = vocab.div_ceil(SAMPLE_BLOCK_LOGITS).max(1);
    1 + 3 * nb + 2 * nb * SAMPLE_BLOCK_LOGITS
}

/// One sequence's sampler on the device.
#[derive(Debug)]
pub struct CudaSamplerState {
    vocab: usize,
    penalties: Penalties,
    /// `SampleParams` x 1.
    params: DevBuf,
    /// The random stream's position (u32 x 1), advanced by the kernel.
    counter: DevBuf,
    /// The sampled id (i32 x 1).
    out: DevBuf,
    /// The kernel's scratch (u32 x [`sample_scratch_words`], zeroed once).
    scratch: DevBuf,
    /// Token counts (u32 x vocab, `ops::penalties` layout) when a penalty is on.
    counts: Option<DevBuf>,
    /// Banned ids (i32 x MAX_BANNED) and the set last uploaded.
    banned: DevBuf,
    banned_now: Vec<u32>,
    /// The background read of `out` (`sample_begin`), from the backend's pool: taken when the
    /// sampler is made (pipelined decode on) or on first use.
    readback: Option<PooledReadback>,
}

/// Where a draw lands besides `out` (ops/sample's hand-over outputs, both optional).
#[derive(Debug, Clone, Copy, Default)]
pub struct SampleHandover {
    /// The next step's one-token input `[id, position]` and the position written there (one
    /// row only).
    pub feed: Option<(DevPtr<i32>, i32)>,
    /// One i32 per row of page-locked host memory mapped into the device
    /// ([`crate::backend::cuda::TokenReadback::device_word`]).
    pub mirror: Option<DevPtr<i32>>,
}

fn be_err(e: CudaError) -> BackendError {
    BackendError::Device(e.to_string())
}

fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

/// The kernel parameters of `p` (CPU-sampler conventions mapped onto the kernel's: top-p <= 0
/// and top-k beyond i32 mean off there too).
pub fn kernel_params(p: &SamplingParams, seed: u64) -> SampleParams {
    SampleParams {
        temperature: if p.temperature.is_nan() {
            0.0
        } else {
            p.temperature
        },
        top_k: i32::try_from(p.top_k).unwrap_or(0),
        top_p: if p.top_p > 0.0 && p.top_p < 1.0 {
            p.top_p
        } else {
            1.0
        },
        min_p: p.min_p,
        seed,
    }
}

impl CudaBackend {
    fn resolve_f32(&self, op: Op) -> Result<&'static KernelSpec, CudaError> {
        self.dev
            .resolve(op, Quant::F32, HeadDim::Any, BatchBucket::Any)
    }

    /// `Backend::sampler_new`.
    pub fn sampler_new_impl(
        &self,
        params: &SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> Result<CudaSamplerState, BackendError> {
        if vocab == 0 || i32::try_from(vocab).is_err() {
            return Err(BackendError::Shape {
                op: "sampler_new",
                detail: format!("vocabulary of {vocab}"),
            });
        }
        let seed = params.seed.unwrap_or_else(rand::random);
        let penalties = Penalties {
            repetition: params.repetition_penalty,
            presence: params.presence_penalty,
            frequency: params.frequency_penalty,
        };
        let kp = kernel_params(params, seed);
        let mk = || -> Result<CudaSamplerState, CudaError> {
            let counts = if penalties.active() {
                Some(
                    self.pool
                        .upload_recycled(&initial_counts(prompt, vocab, &penalties))?,
                )
            } else {
                None
            };
            Ok(CudaSamplerState {
                vocab,
                penalties,
                params: self.pool.upload_recycled(std::slice::from_ref(&kp))?,
                counter: self.pool.upload_recycled(&[0u32])?,
                out: self.pool.upload_recycled(&[0i32])?,
                scratch: {
                    let b = self.pool.alloc_recycled(sample_scratch_words(vocab) * 4)?;
                    b.fill_bytes(0)?;
                    b
                },
                counts,
                banned: self.pool.alloc_recycled(MAX_BANNED * 4)?,
                banned_now: Vec::new(),
                readback: if pipeline_enabled() {
                    bind(self.dev.stream())?;
                    Some(self.readbacks.take()?)
                } else {
                    None
                },
            })
        };
        mk().map_err(be_err)
    }

    /// `Backend::sampler_accept`: a forced token counts as generated (on the device).
    pub fn sampler_accept_impl(
        &self,
        st: &mut CudaSamplerState,
        id: u32,
    ) -> Result<(), BackendError> {
        let Some(counts) = &st.counts else {
            return Ok(());
        };
        let spec = self.resolve_f32(Op::Penalties).map_err(be_err)?;
        let id = i32::try_from(id).unwrap_or(-1);
        self.dev
            .penalties_count(spec, DevPtr::null(), id, counts.ptr::<u32>())
            .map_err(be_err)
    }

    /// `Backend::sample`: penalties, bans and the draw on the last row of `logits`; returns the
    /// id (the only device -> host copy).
    pub fn sample_impl(
        &self,
        logits: GpuTensor,
        st: &mut CudaSamplerState,
        banned: &[u32],
    ) -> Result<u32, BackendError> {
        self.enqueue_sample(&logits, st, banned, SampleHandover::default())?;
        let id = read_ptr(self.dev.stream(), st.out.ptr::<i32>(), 1).map_err(be_err)?[0];
        drop(logits);
        checked_id(id, st.vocab)
    }

    /// `Backend::sample_begin`: the same launches, the id read back in the background. `feed`:
    /// a one-row step's buffer and the position to hand the id over to (the kernel writes
    /// both).
    /// With the hand-over on (`handover_enabled`) the kernel also writes the id to mapped host
    /// memory, so only an event follows it on the stream.
    pub fn sample_begin_impl(
        &self,
        logits: &GpuTensor,
        st: &mut CudaSamplerState,
        banned: &[u32],
        feed: Option<(DevPtr<i32>, i32)>,
    ) -> Result<bool, BackendError> {
        if !pipeline_enabled() {
            return Ok(false);
        }
        bind(self.dev.stream()).map_err(be_err)?;
        if st.readback.is_none() {
            st.readback = Some(self.readbacks.take().map_err(be_err)?);
        }
        let mirror = st
            .readback
            .as_ref()
            .filter(|_| super::handover_enabled())
            .map(|r| r.device_word());
        self.enqueue_sample(logits, st, banned, SampleHandover { feed, mirror })?;
        let out = st.out.ptr::<i32>();
        let stream = self.dev.stream();
        let rb = st.readback.as_mut().expect("created above");
        match mirror {
            Some(_) => rb.start_mirrored(stream),
            None => rb.start(stream, out),
        }
        .map_err(be_err)?;
        Ok(true)
    }

    /// `Backend::sample_finish`.
    pub fn sample_finish_impl(&self, st: &mut CudaSamplerState) -> Result<u32, BackendError> {
        bind(self.dev.stream()).map_err(be_err)?;
        let rb = st
            .readback
            .as_mut()
            .ok_or_else(|| be_err(invalid("sample_finish", "no sample was started".into())))?;
        let id = rb.finish().map_err(be_err)?;
        checked_id(id, st.vocab)
    }

    /// Where the id of the sampler's last draw lands on the device (what feeds a step when the
    /// kernel does not hand it over itself).
    pub fn sampled_id_ptr(st: &CudaSamplerState) -> DevPtr<i32> {
        st.out.ptr::<i32>()
    }

    /// Penalties, bans, the draw and the count update on the last row of `logits`, queued on
    /// the stream; the id lands in `st.out`.
    fn enqueue_sample(
        &self,
        logits: &GpuTensor,
        st: &mut CudaSamplerState,
        banned: &[u32],
        hand: SampleHandover,
    ) -> Result<(), BackendError> {
        if logits.rows == 0 || logits.cols != st.vocab {
            return Err(BackendError::Shape {
                op: "sample",
                detail: format!(
                    "logits [{}, {}] for a sampler over {} tokens",
                    logits.rows, logits.cols, st.vocab
                ),
            });
        }
        if banned.len() > MAX_BANNED {
            return Err(BackendError::Shape {
                op: "sample",
                detail: format!("{} banned ids (at most {MAX_BANNED})", banned.len()),
            });
        }
        let run = |st: &mut CudaSamplerState| -> Result<(), CudaError> {
            let row = logits
                .ptr()
                .slice((logits.rows - 1) * st.vocab, st.vocab)
                .ok_or_else(|| invalid("sample", "logits shorter than rows x cols".into()))?;
            let pen = self.resolve_f32(Op::Penalties)?;
            if let Some(counts) = &st.counts {
                self.dev
                    .penalties(pen, row, counts.ptr::<u32>(), &st.penalties)?;
            }
            if !banned.is_empty() {
                if st.banned_now != banned {
                    let ids: Vec<i32> = banned
                        .iter()
                        .map(|&b| i32::try_from(b).unwrap_or(-1))
                        .collect();
                    st.banned.write(&ids)?;
                    st.banned_now = banned.to_vec();
                }
                let ids = st
                    .banned
                    .ptr::<i32>()
                    .slice(0, banned.len())
                    .ok_or_else(|| invalid("sample", "banned buffer too small".into()))?;
                self.dev.penalties_ban(pen, row, ids)?;
            }
            let spec = self.resolve_f32(Op::Sample)?;
            let out = st.out.ptr::<i32>();
            self.dev.sample_ptr(
                spec,
                row,
                st.vocab,
                st.params.ptr::<SampleParams>(),
                st.counter.ptr::<u32>(),
                out,
                st.scratch.ptr::<u32>(),
                hand,
            )?;
            if let Some(counts) = &st.counts {
                self.dev.penalties_count(pen, out, 0, counts.ptr::<u32>())?;
            }
            Ok(())
        };
        run(st).map_err(be_err)
    }
}

/// Whether decode steps are pipelined (`FUCINA_PIPELINE=0` turns it off, to measure it).
pub fn pipeline_enabled() -> bool {
    crate::tuning::get().pipeline
}

/// A sampled id as a token of a vocabulary of `vocab`. The kernel's arg-max starts from id
/// `i32::MAX` at -inf and keeps it when no logit is greater: every logit NaN or -inf.
fn checked_id(id: i32, vocab: usize) -> Result<u32, BackendError> {
    if id == i32::MAX {
        return Err(BackendError::NoFiniteLogit);
    }
    u32::try_from(id)
        .ok()
        .filter(|&i| (i as usize) < vocab)
        .ok_or_else(|| be_err(invalid("sample", format!("the kernel returned id {id}"))))
}

impl CudaDevice {
    /// Penalties in place on one row `logits` ([V]) from `counts` ([V], `ops::penalties`).
    pub fn penalties(
        &self,
        spec: &'static KernelSpec,
        logits: DevPtr<f32>,
        counts: DevPtr<u32>,
        p: &Penalties,
    ) -> Result<(), CudaError> {
        const OP: &str = "penalties";
        check_op(spec, Op::Penalties, OP)?;
        let v = logits.len();
        if v == 0 || counts.len() != v {
            return Err(invalid(
                OP,
                format!("{} logits with {} counts", v, counts.len()),
            ));
        }
        let vi = i32::try_from(v).map_err(|_| invalid(OP, "vocab exceeds i32".into()))?;
        let f = self.function(spec)?;
        let cfg = LaunchConfig {
            grid_dim: (v.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (lp, cp) = (logits.raw(), counts.raw());
        let mut b = self.stream().launch_builder(&f);
        b.arg(&lp)
            .arg(&vi)
            .arg(&cp)
            .arg(&p.repetition)
            .arg(&p.presence)
            .arg(&p.frequency);
        // SAFETY: matches (float* logits, int V, const u32* counts, float rep, float pres,
        // float freq); both pointers address V values (checked above; DevPtr's contract).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// `logits[banned[j]] = -inf` for the ids in range.
    pub fn penalties_ban(
        &self,
        spec: &'static KernelSpec,
        logits: DevPtr<f32>,
        banned: DevPtr<i32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "penalties__ban";
        check_op(spec, Op::Penalties, OP)?;
        if banned.is_empty() {
            return Ok(());
        }
        let vi =
            i32::try_from(logits.len()).map_err(|_| invalid(OP, "vocab exceeds i32".into()))?;
        let n = i32::try_from(banned.len()).map_err(|_| invalid(OP, "too many ids".into()))?;
        let f = self.function_entry(spec, Entry::Ban)?;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (lp, bp) = (logits.raw(), banned.raw());
        let mut b = self.stream().launch_builder(&f);
        b.arg(&lp).arg(&vi).arg(&bp).arg(&n);
        // SAFETY: matches (float* logits, int V, const int* banned, int n); the kernel writes
        // only ids in [0, V) of `logits` and reads n ids of `banned`.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}__ban", spec.name)))?;
        Ok(())
    }

    /// `counts[t] += 1` for `t = *id_ptr` (when not null) or `t = id`; out-of-range ids ignored.
    pub fn penalties_count(
        &self,
        spec: &'static KernelSpec,
        id_ptr: DevPtr<i32>,
        id: i32,
        counts: DevPtr<u32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "penalties__count";
        check_op(spec, Op::Penalties, OP)?;
        if id_ptr.raw() != 0 && id_ptr.is_empty() {
            return Err(invalid(OP, "the id pointer addresses nothing".into()));
        }
        let vi =
            i32::try_from(counts.len()).map_err(|_| invalid(OP, "vocab exceeds i32".into()))?;
        let f = self.function_entry(spec, Entry::Count)?;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ip, cp) = (id_ptr.raw(), counts.raw());
        let mut b = self.stream().launch_builder(&f);
        b.arg(&ip).arg(&id).arg(&cp).arg(&vi);
        // SAFETY: matches (const int* id_ptr, int id, u32* counts, int V); id_ptr is null or
        // addresses one int; the kernel touches counts only at an id in [0, V).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}__count", spec.name)))?;
        Ok(())
    }

    /// The `sample` kernel on raw pointers: one token per row of `logits` ([rows][vocab]);
    /// `scratch` holds [`sample_scratch_words`]`(vocab)` u32 per row, zero before the first
    /// launch (the kernel leaves it reusable).
    #[allow(clippy::too_many_arguments)]
    pub fn sample_ptr(
        &self,
        spec: &'static KernelSpec,
        logits: DevPtr<f32>,
        vocab: usize,
        params: DevPtr<SampleParams>,
        counters: DevPtr<u32>,
        out: DevPtr<i32>,
        scratch: DevPtr<u32>,
        hand: SampleHandover,
    ) -> Result<(), CudaError> {
        self.launch_sample(
            spec,
            logits,
            vocab,
            params,
            counters,
            out,
            Some(scratch),
            hand,
        )
    }

    /// The single-block reference entry of the `sample` kernel (`__one_block`, one block per
    /// row over the whole vocabulary): the selftest's check that the multi-block kernel draws
    /// exactly the same tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_one_block_ptr(
        &self,
        spec: &'static KernelSpec,
        logits: DevPtr<f32>,
        vocab: usize,
        params: DevPtr<SampleParams>,
        counters: DevPtr<u32>,
        out: DevPtr<i32>,
        hand: SampleHandover,
    ) -> Result<(), CudaError> {
        self.launch_sample(spec, logits, vocab, params, counters, out, None, hand)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_sample(
        &self,
        spec: &'static KernelSpec,
        logits: DevPtr<f32>,
        vocab: usize,
        params: DevPtr<SampleParams>,
        counters: DevPtr<u32>,
        out: DevPtr<i32>,
        scratch: Option<DevPtr<u32>>,
        hand: SampleHandover,
    ) -> Result<(), CudaError> {
        const OP: &str = "sample";
        check_op(spec, Op::Sample, OP)?;
        if vocab == 0 || logits.is_empty() || logits.len() % vocab != 0 {
            return Err(invalid(
                OP,
                format!("{} logits are not rows of {vocab}", logits.len()),
            ));
        }
        let rows = logits.len() / vocab;
        if params.len() < rows || counters.len() < rows || out.len() < rows || rows > 65535 {
            return Err(invalid(
                OP,
                format!("{rows} rows (<= 65535) need params/counters/out of {rows}"),
            ));
        }
        let v = i32::try_from(vocab).map_err(|_| invalid(OP, "vocab exceeds i32".into()))?;
        if hand.feed.is_some_and(|(f, _)| rows != 1 || f.len() < 2)
            || hand.mirror.is_some_and(|m| m.len() < rows)
        {
            return Err(invalid(
                OP,
                format!("hand-over outputs for {rows} rows: {hand:?} (feed: one row, 2 values)"),
            ));
        }
        let (fp, feed_pos) = hand.feed.map_or((0u64, 0i32), |(f, p)| (f.raw(), p));
        let mp = hand.mirror.map_or(0u64, |m| m.raw());
        let blocks = vocab.div_ceil(SAMPLE_BLOCK_LOGITS);
        if blocks > SAMPLE_MAX_BLOCKS {
            return Err(invalid(
                OP,
                format!(
                    "vocab {vocab} past {} logits",
                    SAMPLE_MAX_BLOCKS * SAMPLE_BLOCK_LOGITS
                ),
            ));
        }
        let (f, grid_x, sp) = match scratch {
            Some(s) => {
                if s.len() < rows * sample_scratch_words(vocab) {
                    return Err(invalid(
                        OP,
                        format!(
                            "scratch of {} words, {rows} rows of {vocab} need {}",
                            s.len(),
                            rows * sample_scratch_words(vocab)
                        ),
                    ));
                }
                (self.function(spec)?, blocks as u32, s.raw())
            }
            None => (self.function_entry(spec, Entry::OneBlock)?, 1, 0u64),
        };
        let cfg = LaunchConfig {
            grid_dim: (grid_x, rows as u32, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let (lp, pp, cp, op) = (logits.raw(), params.raw(), counters.raw(), out.raw());
        let mut b = self.stream().launch_builder(&f);
        b.arg(&lp).arg(&v).arg(&pp).arg(&cp).arg(&op).arg(&sp);
        b.arg(&fp).arg(&feed_pos).arg(&mp);
        // SAFETY: matches (const float* logits, int V, const SampleParams* p, u32* counters,
        // int* out, u32* scratch, int* feed, int feed_pos, int* mirror), grid (ceil(V / 4096),
        // rows) of 1024 threads (the multi-block entry; its scratch holds rows x
        // sample_scratch_words(V) words) or (1, rows) (`__one_block`, scratch unused); feed
        // (2 values, one row) and mirror (rows values) null or checked above, as the sizes.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }
}

fn check_op(spec: &'static KernelSpec, op: Op, name: &'static str) -> Result<(), CudaError> {
    if spec.key.op == op {
        Ok(())
    } else {
        Err(invalid(name, format!("instance {} is not {op}", spec.name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel id inside the vocabulary is the token; the arg-max's sentinel (no finite
    /// logit) and ids outside it are errors that say so.
    #[test]
    fn sampled_ids_are_checked() {
        assert_eq!(checked_id(5, 10).unwrap(), 5);
        assert!(checked_id(10, 10).is_err());
        assert!(checked_id(-1, 10).is_err());
        let e = checked_id(i32::MAX, 151_936).unwrap_err().to_string();
        assert!(e.contains("no logit is finite"), "{e}");
    }

    #[test]
    fn scratch_words_cover_every_block() {
        // 151936 logits: 38 blocks (the last one holds 384)
        assert_eq!(sample_scratch_words(151_936), 1 + 3 * 38 + 2 * 38 * 4096);
        assert_eq!(sample_scratch_words(4096), 1 + 3 + 2 * 4096);
        assert_eq!(sample_scratch_words(4097), 1 + 6 + 4 * 4096);
        assert_eq!(sample_scratch_words(1), 1 + 3 + 2 * 4096);
    }

    #[test]
    fn kernel_params_map_the_cpu_conventions() {
        let p = SamplingParams {
            temperature: 0.7,
            top_k: usize::MAX,
            top_p: 0.0,
            min_p: 0.05,
            ..Default::default()
        };
        let k = kernel_params(&p, 9);
        assert_eq!(
            (k.temperature, k.top_k, k.top_p, k.min_p, k.seed),
            (0.7, 0, 1.0, 0.05, 9)
        );
        let k = kernel_params(
            &SamplingParams {
                top_k: 40,
                top_p: 0.9,
                ..Default::default()
            },
            1,
        );
        assert_eq!((k.top_k, k.top_p), (40, 0.9));
    }
}
