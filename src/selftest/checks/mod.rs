//! The registry of per-op checks. Add one line per check (its own file in this folder).

pub(super) mod add_rmsnorm;
mod attn_decode;
mod attn_prefill;
pub(super) mod attn_prep;
mod cast_bf16;
mod convert;
mod dequant_bf16;
mod embed;
mod ewise;
mod gemm;
mod gemm_f32;
mod gemm_pipe;
mod gemv;
mod glu;
mod kv_write;
mod l2_norm;
pub(super) mod moe;
mod moe_fused;
mod moe_grouped;
mod norm_add_rmsnorm;
mod penalties;
mod read_bw;
mod rmsnorm;
mod rope;
mod sample;
mod softmax;

use super::check::KernelCheck;
use crate::kernels::KernelKey;

/// Every registered check.
pub fn all() -> Vec<&'static dyn KernelCheck> {
    vec![
        &rmsnorm::RmsNormCheck,
        &rope::RopeCheck,
        &softmax::SoftmaxCheck,
        &glu::GluCheck,
        &gemv::QuantizeQ8Check,
        &gemv::GemvCheck,
        &gemm::GemmCheck,
        &gemm_f32::GemmF32Check,
        &gemm_pipe::GemmPipeCheck,
        &dequant_bf16::DequantBf16Check,
        &attn_decode::AttnDecodeCheck,
        &attn_prefill::AttnPrefillCheck,
        &kv_write::KvWriteCheck,
        &sample::SampleCheck,
        &penalties::PenaltiesCheck,
        &read_bw::ReadBwCheck,
        &convert::ConvertCheck,
        &embed::EmbedCheck,
        &ewise::EwiseCheck,
        &l2_norm::L2NormCheck,
        &cast_bf16::CastBf16Check,
        &moe::MoeRouteCheck,
        &moe::MoeGemvCheck,
        &moe::MoeCombineCheck,
        &moe_fused::MoeRouterCheck,
        &moe_fused::MoeGateUpCheck,
        &moe_fused::MoeDownCheck,
        &moe_grouped::MoeGroupCheck,
        &moe_grouped::MoeGemmCheck,
        &add_rmsnorm::AddRmsNormCheck,
        &attn_prep::AttnPrepCheck,
        &norm_add_rmsnorm::NormAddRmsNormCheck,
    ]
}

/// The check covering `key`, if any.
pub fn for_key(key: &KernelKey) -> Option<&'static dyn KernelCheck> {
    all().into_iter().find(|c| c.covers(key))
}
