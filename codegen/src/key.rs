//! The typed kernel key and the ONE function that names an instance.
//!
//! A kernel instance is identified by a [`KernelKey`]: op x quant format x head dim x batch
//! bucket x target arch, all enums. [`entry_name`] turns a key into the stable name used as the
//! `extern "C"` entry point, the generated file name (`<name>.cu`), the snapshot name and the
//! runtime lookup. Nothing else builds kernel names.

use std::fmt;
use std::str::FromStr;

/// A string did not name a variant of a key enum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{value}` (expected one of: {expected})")]
pub struct KeyParseError {
    pub what: &'static str,
    pub value: String,
    pub expected: String,
}

/// Defines a fieldless enum with a canonical lower-case spelling per variant, `ALL`, `as_str`,
/// `variant` (the Rust path, used by the registry emitter), `FromStr` and `Display`.
macro_rules! key_enum {
    ($(#[$m:meta])* $what:literal, pub enum $name:ident { $($(#[$vm:meta])* $var:ident => $s:literal,)+ }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name { $($(#[$vm])* $var,)+ }
        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var,)+];
            /// Canonical spelling (manifest, names, templates).
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$var => $s,)+ }
            }
            /// Rust path of the variant, e.g. `Op::RmsNorm` (for generated code).
            pub const fn variant(self) -> &'static str {
                match self { $($name::$var => concat!(stringify!($name), "::", stringify!($var)),)+ }
            }
        }
        impl FromStr for $name {
            type Err = KeyParseError;
            fn from_str(s: &str) -> Result<Self, KeyParseError> {
                match s {
                    $($s => Ok($name::$var),)+
                    _ => Err(KeyParseError {
                        what: $what,
                        value: s.to_string(),
                        expected: [$($s),+].join(", "),
                    }),
                }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use key_enum;

key_enum! {
    /// The operation family. One template per family (`kernel-templates/ops/<op>.cu.tera`).
    "op", pub enum Op {
        RmsNorm => "rmsnorm",
        Rope => "rope",
        Softmax => "softmax",
        Geglu => "geglu",
        Swiglu => "swiglu",
        /// Quantise activations to int8 per 32 (Q8_1 style) for dp4a GEMVs.
        QuantizeQ8 => "quantize_q8",
        Gemv => "gemv",
        Gemm => "gemm",
        /// Many-row linear over float weights (f32 / f16) on CUDA cores, f32 throughout (the
        /// prefill of the MoE router and F16 matrices).
        GemmF32 => "gemm_f32",
        AttnDecode => "attn_decode",
        /// Causal attention of many query rows over the paged KV cache (prefill).
        AttnPrefill => "attn_prefill",
        /// Store f32 K/V rows into the paged KV cache (converted to the cache type).
        KvWrite => "kv_write",
        Sample => "sample",
        /// Sampler penalties (repetition / presence / frequency) and bans from device counts.
        Penalties => "penalties",
        /// Benchmark helper: reads a buffer once (read-bandwidth reference for the GEMV bench).
        ReadBw => "read_bw",
        /// Test kernel: the DSL's float conversions over all codes (selftest only).
        Convert => "convert",
        /// Embedding rows gathered by token ids from device memory, dequantised, times a scale.
        Embed => "embed",
        /// Elementwise f32 ops with broadcast (add, mul, sigmoid gate, scale, soft-cap).
        Ewise => "ewise",
        /// L2 normalisation over groups of columns.
        L2Norm => "l2_norm",
        /// f32 activations to bf16 (the A operand of the tensor-core GEMM).
        CastBf16 => "cast_bf16",
        /// f32 activations to f16 rows with a power-of-two scale per row (the A operand of the
        /// f16 tensor-core GEMM: 11 significant bits where bf16 keeps 8).
        CastF16 => "cast_f16",
        /// MoE router: softmax over experts, top-k, optional renormalisation, per token.
        MoeRoute => "moe_route",
        /// Grouped expert GEMV: per (token, slot) pair, the expert read from device memory.
        MoeGemv => "moe_gemv",
        /// MoE output: weighted sum of the slots' expert outputs per token.
        MoeCombine => "moe_combine",
        /// A weight matrix in its stored format to row-major bf16 (the prefill GEMM's operand).
        DequantBf16 => "dequant_bf16",
        /// Prefill GEMM over bf16 or f16 operands: multi-stage cp.async pipeline, mma.sync (and
        /// wgmma on sm_90a), several tile shapes (suffixed entries), an optional scale per row.
        GemmPipe => "gemm_pipe",
        /// MoE prefill: (token, slot) pairs grouped by expert on the device (counts, offsets,
        /// permutation, row tiles) for the grouped expert GEMM.
        MoeGroup => "moe_group",
        /// MoE prefill: grouped expert GEMM over all experts in one launch (tensor cores,
        /// GGUF expert banks dequantised in the loader; gate+up with the GLU fused, down).
        MoeGemm => "moe_gemm",
        /// Residual add fused with the RMSNorm of the sum (+ the int8 side-car of one row).
        AddRmsNorm => "add_rmsnorm",
        /// Attention input: per-head q/k norms, RoPE, K/V into the paged cache, one launch.
        AttnPrep => "attn_prep",
        /// Gemma's sandwich residual: RMSNorm of the branch output, residual add, optional
        /// layer scalar, the next RMSNorm (+ the int8 side-car of one row), one launch.
        NormAddRmsNorm => "norm_add_rmsnorm",
        /// MoE decode: the router GEMV and the routing (softmax, top-k) in one launch (the block
        /// of a token that finishes last routes it).
        MoeRouter => "moe_router",
        /// MoE decode: gate and up GEMVs of the routed experts, the GLU and its int8 side-car.
        MoeGateUp => "moe_gate_up",
        /// MoE decode: down GEMVs of the routed experts summed with their routing weights.
        MoeDown => "moe_down",
    }
}

key_enum! {
    /// Storage format of the op's main operand (weights for gemv/gemm, KV for attention,
    /// activations for elementwise ops).
    "quant", pub enum Quant {
        F32 => "f32",
        F16 => "f16",
        Bf16 => "bf16",
        Q8_0 => "q8_0",
        /// Q8_0 repacked at upload (per row: the 32-byte int8 bodies, then the f16 scales;
        /// src/quant/repack.rs), read as q4_0r is.
        Q8_0R => "q8_0r",
        Q4_0 => "q4_0",
        /// Q4_0 repacked at upload (same bytes, per row: the 16-byte nibble blocks, then the f16
        /// scales), so a warp loads whole blocks with aligned, coalesced 16-byte loads
        /// (src/quant/repack.rs).
        Q4_0R => "q4_0r",
        Q5_0 => "q5_0",
        Q4K => "q4_k",
        /// Q4_K repacked at upload (per row: the 128-byte nibble bodies, then the 16-byte heads
        /// of d, dmin and the 6-bit scales / mins; src/quant/repack.rs).
        Q4KR => "q4_kr",
        Q6K => "q6_k",
        /// Q6_K repacked at upload (per row: the 192-byte bodies of low nibbles and high bit
        /// pairs, then the 18-byte heads of int8 scales and f16 d; src/quant/repack.rs).
        Q6KR => "q6_kr",
        Fp8E4m3 => "fp8_e4m3",
        NvFp4 => "nvfp4",
    }
}

key_enum! {
    /// Compile-time head dimension; `Any` when the kernel takes it at run time.
    "head_dim", pub enum HeadDim {
        Any => "any",
        D16 => "16",
        D32 => "32",
        D64 => "64",
        D128 => "128",
        D256 => "256",
        D512 => "512",
    }
}

key_enum! {
    /// Batch-size bucket (powers of two); `Any` when the kernel is batch-agnostic.
    "batch", pub enum BatchBucket {
        Any => "any",
        B1 => "1",
        B2 => "2",
        B4 => "4",
        B8 => "8",
        B16 => "16",
        B32 => "32",
        B64 => "64",
    }
}

key_enum! {
    /// Target architecture of the PTX. `a` variants use arch-specific instructions and only run
    /// on exactly that compute capability; `sm_80`/`sm_89` are generic and JIT forward.
    "arch", pub enum SmArch {
        Sm80 => "sm_80",
        Sm89 => "sm_89",
        Sm90a => "sm_90a",
        Sm120a => "sm_120a",
        Sm121a => "sm_121a",
    }
}

impl HeadDim {
    /// The dimension, or `None` for `Any`.
    pub const fn value(self) -> Option<u32> {
        match self {
            HeadDim::Any => None,
            HeadDim::D16 => Some(16),
            HeadDim::D32 => Some(32),
            HeadDim::D64 => Some(64),
            HeadDim::D128 => Some(128),
            HeadDim::D256 => Some(256),
            HeadDim::D512 => Some(512),
        }
    }
}

impl BatchBucket {
    /// The bucket's largest batch, or `None` for `Any`.
    pub const fn value(self) -> Option<u32> {
        match self {
            BatchBucket::Any => None,
            BatchBucket::B1 => Some(1),
            BatchBucket::B2 => Some(2),
            BatchBucket::B4 => Some(4),
            BatchBucket::B8 => Some(8),
            BatchBucket::B16 => Some(16),
            BatchBucket::B32 => Some(32),
            BatchBucket::B64 => Some(64),
        }
    }

    /// The smallest bucket holding `n` rows (`None` above the largest bucket).
    pub fn for_batch(n: usize) -> Option<BatchBucket> {
        BatchBucket::ALL
            .iter()
            .copied()
            .filter_map(|b| b.value().map(|v| (b, v as usize)))
            .find(|&(_, v)| n <= v)
            .map(|(b, _)| b)
    }
}

impl SmArch {
    /// `major * 10 + minor` of the compute capability the arch targets (80, 89, 90, 120, 121).
    pub const fn sm(self) -> u32 {
        match self {
            SmArch::Sm80 => 80,
            SmArch::Sm89 => 89,
            SmArch::Sm90a => 90,
            SmArch::Sm120a => 120,
            SmArch::Sm121a => 121,
        }
    }
    /// fp8 (e4m3/e5m2) `mma.sync` and `cvt` to/from fp8: sm_89 and later.
    pub const fn has_fp8_mma(self) -> bool {
        self.sm() >= 89
    }
    /// `wgmma.mma_async` + TMA: only sm_90a.
    pub const fn has_wgmma(self) -> bool {
        matches!(self, SmArch::Sm90a)
    }
    /// Block-scaled FP4 (e2m1) `mma.sync` with ue4m3/ue8m0 scales: sm_120a / sm_121a.
    pub const fn has_fp4_mma(self) -> bool {
        matches!(self, SmArch::Sm120a | SmArch::Sm121a)
    }
    /// Arch-specific (`a`) targets run only on their exact compute capability.
    pub const fn is_arch_specific(self) -> bool {
        matches!(self, SmArch::Sm90a | SmArch::Sm120a | SmArch::Sm121a)
    }

    /// The arches whose PTX can run on a device of compute capability `major.minor`, best
    /// first: the exact `a` target if we have one, then the generic ones it can JIT.
    pub fn candidates_for(major: u32, minor: u32) -> Vec<SmArch> {
        let cc = major * 10 + minor;
        let mut v = Vec::new();
        for a in [SmArch::Sm121a, SmArch::Sm120a, SmArch::Sm90a] {
            if a.sm() == cc {
                v.push(a);
            }
        }
        if cc >= 89 {
            v.push(SmArch::Sm89);
        }
        if cc >= 80 {
            v.push(SmArch::Sm80);
        }
        v
    }
}

/// The identity of one kernel instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelKey {
    pub op: Op,
    pub quant: Quant,
    pub head_dim: HeadDim,
    pub batch: BatchBucket,
    pub arch: SmArch,
}

impl KernelKey {
    /// A key with `head_dim` and `batch` = `Any`.
    pub const fn simple(op: Op, quant: Quant, arch: SmArch) -> KernelKey {
        KernelKey {
            op,
            quant,
            head_dim: HeadDim::Any,
            batch: BatchBucket::Any,
            arch,
        }
    }
}

impl fmt::Display for KernelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&entry_name(self))
    }
}

/// THE name of an instance: `<op>_<quant>[_hd<N>][_bs<N>]_<arch>`, e.g. `rmsnorm_f32_sm_90a`,
/// `gemv_q4_0_bs1_sm_121a`, `attn_decode_fp8_e4m3_hd256_bs1_sm_90a`. It is the `extern "C"`
/// entry point, the file stem of the generated `.cu`, the snapshot name and the lookup string.
/// Injective over all keys (tested).
pub fn entry_name(key: &KernelKey) -> String {
    let mut s = String::with_capacity(40);
    s.push_str(key.op.as_str());
    s.push('_');
    s.push_str(key.quant.as_str());
    if let Some(hd) = key.head_dim.value() {
        s.push_str(&format!("_hd{hd}"));
    }
    if let Some(bs) = key.batch.value() {
        s.push_str(&format!("_bs{bs}"));
    }
    s.push('_');
    s.push_str(key.arch.as_str());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn all_keys() -> Vec<KernelKey> {
        let mut v = Vec::new();
        for &op in Op::ALL {
            for &quant in Quant::ALL {
                for &head_dim in HeadDim::ALL {
                    for &batch in BatchBucket::ALL {
                        for &arch in SmArch::ALL {
                            v.push(KernelKey {
                                op,
                                quant,
                                head_dim,
                                batch,
                                arch,
                            });
                        }
                    }
                }
            }
        }
        v
    }

    #[test]
    fn entry_name_is_injective_and_c_identifier() {
        let keys = all_keys();
        let mut seen = HashSet::new();
        for k in &keys {
            let n = entry_name(k);
            assert!(
                n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{n}"
            );
            assert!(
                n.chars().next().is_some_and(|c| c.is_ascii_alphabetic()),
                "{n}"
            );
            assert!(seen.insert(n.clone()), "duplicate name {n}");
        }
        assert_eq!(seen.len(), keys.len());
    }

    #[test]
    fn names_match_design_examples() {
        let k = KernelKey {
            op: Op::Gemv,
            quant: Quant::Q4_0,
            head_dim: HeadDim::Any,
            batch: BatchBucket::B1,
            arch: SmArch::Sm121a,
        };
        assert_eq!(entry_name(&k), "gemv_q4_0_bs1_sm_121a");
        let k = KernelKey::simple(Op::RmsNorm, Quant::F32, SmArch::Sm90a);
        assert_eq!(entry_name(&k), "rmsnorm_f32_sm_90a");
    }

    #[test]
    fn parse_roundtrip_and_errors() {
        for &a in SmArch::ALL {
            assert_eq!(a.as_str().parse::<SmArch>().unwrap(), a);
        }
        let e = "sm_75".parse::<SmArch>().unwrap_err();
        assert!(e.to_string().contains("sm_90a"), "{e}");
        assert_eq!(Op::RmsNorm.variant(), "Op::RmsNorm");
    }

    #[test]
    fn arch_candidates() {
        assert_eq!(
            SmArch::candidates_for(9, 0),
            vec![SmArch::Sm90a, SmArch::Sm89, SmArch::Sm80]
        );
        assert_eq!(
            SmArch::candidates_for(12, 1),
            vec![SmArch::Sm121a, SmArch::Sm89, SmArch::Sm80]
        );
        assert_eq!(SmArch::candidates_for(8, 6), vec![SmArch::Sm80]);
        assert_eq!(
            SmArch::candidates_for(10, 0),
            vec![SmArch::Sm89, SmArch::Sm80]
        );
        assert!(SmArch::candidates_for(7, 5).is_empty());
        assert_eq!(BatchBucket::for_batch(3), Some(BatchBucket::B4));
        assert_eq!(BatchBucket::for_batch(65), None);
    }
}
