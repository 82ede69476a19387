//! The registry of per-op checks. Add one line per check (its own file in this folder).

pub(super) mod add_rmsnorm;
mod attn_decode;
mod attn_prefill;
pub(super) mod attn_prep;
mod cast_bf16;
mod cast_f16;
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
use crate::kernels::{KernelKey, Quant};
use crate::quant::GgmlType;

/// The GGUF type whose random weights a check generates for a kernel format (the CPU reference
/// reads them), and whether the device copy is repacked from it (`q4_0r`, `q4_kr`: see
/// [`device_layout`]).
pub(super) fn source_type(q: Quant) -> Option<(GgmlType, bool)> {
    Some(match q {
        Quant::F32 => (GgmlType::F32, false),
        Quant::F16 => (GgmlType::F16, false),
        Quant::Bf16 => (GgmlType::BF16, false),
        Quant::Q8_0 => (GgmlType::Q8_0, false),
        Quant::Q8_0R => (GgmlType::Q8_0, true),
        Quant::Q4_0 => (GgmlType::Q4_0, false),
        Quant::Q4_0R => (GgmlType::Q4_0, true),
        Quant::Q5_0 => (GgmlType::Q5_0, false),
        Quant::Q4K => (GgmlType::Q4K, false),
        Quant::Q4KR => (GgmlType::Q4K, true),
        Quant::Q6K => (GgmlType::Q6K, false),
        Quant::Q6KR => (GgmlType::Q6K, true),
        _ => return None,
    })
}

/// Rows of `cols` values generated as [`source_type`] says, in the kernel's layout.
pub(super) fn device_layout(q: Quant, w: Vec<u8>, cols: usize) -> Result<Vec<u8>, String> {
    match crate::quant::repack::source_of(q) {
        Some((_, split)) => split.repacked(&w, cols),
        None => Ok(w),
    }
}

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
        &cast_f16::CastF16Check,
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
