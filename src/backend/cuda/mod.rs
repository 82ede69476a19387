//! CUDA runtime: driver probe, device context, module loading from PTX (through the on-disk
//! cache of `codegen::ptx`), typed launch helpers for the generated kernels, and the
//! [`CudaBackend`] that runs the models.
//!
//! cudarc loads libcuda lazily and panics when it is missing, so everything here goes through
//! [`cuda_available`] first, which probes the driver with a plain `dlopen` and never touches
//! cudarc when the driver is absent.

mod backend;
pub mod buf;
#[cfg(feature = "profiling")]
mod dev_defines;
mod device;
mod error;
pub mod graph;
#[cfg(feature = "profiling")]
mod graph_ablate;
pub mod kv;
mod launch;
pub mod launch_attn;
mod launch_decode;
mod launch_fused;
mod launch_gemm;
mod launch_glu;
mod launch_linear;
mod launch_moe;
pub mod launch_moe_fused;
mod launch_prefill;
mod launch_ptr;
mod launch_qkvp;
pub mod launch_res;
pub mod moe;
pub mod moe_decode;
pub mod moe_grouped;
mod moe_prefill;
mod probe;
mod readback;
pub mod types;

pub use backend::sampler::{
    kernel_params, sample_scratch_words, CudaSamplerState, SampleHandover, MAX_BANNED,
    SAMPLE_BLOCK_LOGITS,
};
pub use backend::CudaBackend;
pub use buf::{DevBuf, DevPtr, Pool, PoolStats};
pub use device::CudaDevice;
pub use error::CudaError;
pub use kv::{GQA_MIN_SPLIT_KEYS, MIN_SPLIT_KEYS};
pub use launch::{GluShape, RopeLaunch};
pub use launch_attn::{AttnPrefillLaunch, KvLayout, KvScales};
pub use launch_decode::{
    decode_gqa_default, decode_has_mma, decode_key_has_gqa, decode_key_has_mma,
    gqa_fused_merge_default, gqa_fused_merge_fits, AttnDecodeLaunch, AttnScratch, DecodeEntry,
    GqaMerge, MAX_DECODE_BLOCK_HEADS, MAX_DECODE_SPLITS,
};
pub use launch_fused::{
    norm_add_chunks, AttnPrepBufs, AttnPrepLaunch, NormAddWeights, ATTN_PREP_MAX_HEAD_DIM,
};
pub use launch_gemm::{chunk_rows, tile_cost, tile_efficiency, GemmPipe, GemmTile, GEMM_PIPE_BK};
pub use launch_glu::GemvGluArgs;
pub use launch_linear::{
    gemv_default_grid, gemv_row_batches, gemv_s2_smem, GemvEntry, Q8Activations,
};
pub use launch_moe::{MoeGemvArgs, MOE_MAX_EXPERTS, MOE_MAX_TOP_K};
pub use launch_moe_fused::{MoeDownArgs, MoeGateUpArgs, MoeRouterArgs, RouterNorm};
pub use launch_prefill::{
    attn_prep_rows_suffix, glu_vec_ok, rms_norm_rows_suffix, KernEntry, PREFILL_MIN_ROWS,
};
pub use launch_ptr::weight_block;
pub use launch_ptr::{copy_2d, Broadcast, EwiseMode, Kern, KernQ8, NormWeightPtr};
pub use probe::cuda_available;
pub use readback::TokenReadback;
pub use types::{Bf16Side, GpuKvCache, GpuTensor, GpuWeight, KvType, Q8Ptrs, Q8Side, WeightView};

pub use cudarc::driver::{CudaSlice, CudaView};
