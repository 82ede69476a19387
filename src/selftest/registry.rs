//! The registry of the per-kernel checks (each in its op family's folder: `elementwise/`,
//! `attention/`, `linear/`, `moe/`, `sample/`). Add one line per check.

use crate::kernels::{KernelKey, Quant};
use crate::quant::GgmlType;
use crate::selftest::check::KernelCheck;
use crate::selftest::{attention, elementwise, linear, moe, sample};

/// The GGUF type whose random weights a check generates for a kernel format (the CPU reference
/// reads them), and whether the device copy is repacked from it (`q4_0r`, `q4_kr`: see
/// [`device_layout`]).
pub(in crate::selftest) fn source_type(q: Quant) -> Option<(GgmlType, bool)> {
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
pub(in crate::selftest) fn device_layout(
    q: Quant,
    w: Vec<u8>,
    cols: usize,
) -> Result<Vec<u8>, String> {
    match crate::quant::repack::source_of(q) {
        Some((_, split)) => split.repacked(&w, cols),
        None => Ok(w),
    }
}

/// Every registered check.
pub fn all() -> Vec<&'static dyn KernelCheck> {
    vec![
        &elementwise::rmsnorm::RmsNormCheck,
        &elementwise::rope::RopeCheck,
        &elementwise::softmax::SoftmaxCheck,
        &elementwise::glu::GluCheck,
        &linear::gemv::QuantizeQ8Check,
        &linear::gemv::GemvCheck,
        &linear::gemm::GemmCheck,
        &linear::gemm_f32::GemmF32Check,
        &linear::gemm_pipe::GemmPipeCheck,
        &linear::dequant_bf16::DequantBf16Check,
        &attention::attn_decode::AttnDecodeCheck,
        &attention::attn_prefill::AttnPrefillCheck,
        &attention::kv_write::KvWriteCheck,
        &sample::draw::SampleCheck,
        &sample::penalties::PenaltiesCheck,
        &linear::read_bw::ReadBwCheck,
        &elementwise::convert::ConvertCheck,
        &elementwise::embed::EmbedCheck,
        &elementwise::ewise::EwiseCheck,
        &elementwise::l2_norm::L2NormCheck,
        &elementwise::cast_bf16::CastBf16Check,
        &elementwise::cast_f16::CastF16Check,
        &moe::pipeline::MoeRouteCheck,
        &moe::pipeline::MoeGemvCheck,
        &moe::pipeline::MoeCombineCheck,
        &moe::moe_fused::MoeRouterCheck,
        &moe::moe_fused::MoeGateUpCheck,
        &moe::moe_fused::MoeDownCheck,
        &moe::moe_grouped::MoeGroupCheck,
        &moe::moe_grouped::MoeGemmCheck,
        &elementwise::add_rmsnorm::AddRmsNormCheck,
        &attention::attn_prep::AttnPrepCheck,
        &elementwise::norm_add_rmsnorm::NormAddRmsNormCheck,
    ]
}

/// The check covering `key`, if any.
pub fn for_key(key: &KernelKey) -> Option<&'static dyn KernelCheck> {
    all().into_iter().find(|c| c.covers(key))
}
