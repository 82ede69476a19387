//! CUDA runtime: driver probe, device context, module loading from PTX (through the on-disk
//! cache of `codegen::ptx`), typed launch helpers for the generated kernels, and the
//! [`CudaBackend`] that runs the models.
//!
//! - `runtime/`: the device, its memory pool, graphs, the tensor types, a resolved kernel;
//! - `ops/<family>/`: the typed launches of one op family (elementwise, attention, linear, moe);
//! - `backend/`: [`CudaBackend`], the `Backend` traits over those launches (and the sampler).
//!
//! Dependencies point down only: `backend` → `ops` → `runtime` (checked by `tests/layering.rs`).
//!
//! cudarc loads libcuda lazily and panics when it is missing, so everything here goes through
//! [`cuda_available`] first, which probes the driver with a plain `dlopen` and never touches
//! cudarc when the driver is absent.

mod backend;
pub mod ops;
pub mod runtime;

pub use backend::sampler::{
    kernel_params, sample_scratch_words, CudaSamplerState, SampleHandover, MAX_BANNED,
    SAMPLE_BLOCK_LOGITS,
};
pub use backend::CudaBackend;
pub use ops::attention::cache::GpuKvCache;
pub use ops::attention::decode::{
    decode_gqa_default, decode_has_mma, decode_key_has_gqa, decode_key_has_mma,
    gqa_fused_merge_default, gqa_fused_merge_fits, AttnDecodeLaunch, AttnScratch, DecodeEntry,
    GqaMerge, MAX_DECODE_BLOCK_HEADS, MAX_DECODE_SPLITS,
};
pub use ops::attention::kv::{GQA_MIN_SPLIT_KEYS, MIN_SPLIT_KEYS};
pub use ops::attention::launch::{AttnPrefillLaunch, KvLayout, KvScales};
pub use ops::attention::prep::{AttnPrepBufs, AttnPrepLaunch, RowPages, ATTN_PREP_MAX_HEAD_DIM};
pub use ops::elementwise::add_norm::{norm_add_chunks, NormAddWeights};
pub use ops::elementwise::launch::{Broadcast, EwiseMode, NormWeightPtr};
pub use ops::elementwise::rows::{
    attn_prep_rows_suffix, glu_vec_ok, rms_norm_rows_suffix, PREFILL_MIN_ROWS,
};
pub use ops::elementwise::slice::{GluShape, RopeLaunch};
pub use ops::linear::gemm_pipe::{
    chunk_rows, tile_cost, tile_efficiency, GemmPipe, GemmTile, GEMM_PIPE_BK,
};
pub use ops::linear::glu::GemvGluArgs;
pub use ops::linear::launch::{
    gemv_default_grid, gemv_row_batches, gemv_s2_smem, GemvEntry, Q8Activations,
};
pub use ops::moe::launch::{MoeGemvArgs, MOE_MAX_EXPERTS, MOE_MAX_TOP_K};
pub use ops::moe::launch_fused::{MoeDownArgs, MoeGateUpArgs, MoeRouterArgs, RouterNorm};
pub use runtime::buf::{DevBuf, DevPtr, Pool, PoolStats};
pub use runtime::device::CudaDevice;
pub use runtime::error::CudaError;
pub use runtime::kern::{copy_2d, weight_block, Kern, KernEntry, KernQ8};
pub use runtime::probe::cuda_available;
pub use runtime::readback::TokenReadback;
pub use runtime::types::{Bf16Side, GpuTensor, GpuWeight, KvType, Q8Ptrs, Q8Side, WeightView};

pub use cudarc::driver::{CudaSlice, CudaView};
