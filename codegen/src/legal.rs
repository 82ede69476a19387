//! Which key combinations make sense for each op. The manifest validator rejects the rest, so a
//! typo in `kernel-templates/manifest.toml` fails the build instead of producing a kernel nobody
//! can dispatch to. When you add an op (or widen one), add or edit its arm here.

use crate::key::{BatchBucket, HeadDim, KernelKey, Op, Quant};

/// Weight formats a GEMV/GEMM can read in place.
const WEIGHT_FORMATS: &[Quant] = &[
    Quant::F32,
    Quant::F16,
    Quant::Bf16,
    Quant::Q8_0,
    Quant::Q8_0R,
    Quant::Q4_0,
    Quant::Q4_0R,
    Quant::Q5_0,
    Quant::Q4K,
    Quant::Q4KR,
    Quant::Q6K,
    Quant::Q6KR,
    Quant::Fp8E4m3,
    Quant::NvFp4,
];

/// Formats repacked at upload from a GGUF one (src/quant/repack.rs): read by the GEMV,
/// `dequant_bf16` and `embed` (a tied LM head is the embedding table).
const REPACKED_FORMATS: &[Quant] = &[Quant::Q8_0R, Quant::Q4_0R, Quant::Q4KR, Quant::Q6KR];

/// GGUF formats the dp4a / float GEMV paths read (no FP8 / FP4 expert banks in GGUF files).
const GGUF_FORMATS: &[Quant] = &[
    Quant::F32,
    Quant::F16,
    Quant::Bf16,
    Quant::Q8_0,
    Quant::Q4_0,
    Quant::Q5_0,
    Quant::Q4K,
    Quant::Q6K,
];

/// GGUF block formats the fused MoE decode kernels read (int8 activations from a side-car).
const MOE_BLOCK_FORMATS: &[Quant] = &[
    Quant::Q8_0,
    Quant::Q4_0,
    Quant::Q5_0,
    Quant::Q4K,
    Quant::Q6K,
];

/// Router weight formats of the fused MoE router (F32 in GGUF files, F16/BF16 elsewhere; Q8_0
/// dots the input's int8 side-car).
const MOE_ROUTER_FORMATS: &[Quant] = &[
    Quant::F32,
    Quant::F16,
    Quant::Bf16,
    Quant::Q8_0,
    Quant::Q8_0R,
];

/// `Ok(())` if `key` is a legal instance, else why not.
pub fn check_legal(key: &KernelKey) -> Result<(), String> {
    let any_hd = |k: &KernelKey| {
        if k.head_dim == HeadDim::Any {
            Ok(())
        } else {
            Err(format!(
                "{} takes its dimensions at run time: head_dim must be \"any\"",
                k.op
            ))
        }
    };
    let any_bs = |k: &KernelKey| {
        if k.batch == BatchBucket::Any {
            Ok(())
        } else {
            Err(format!("{} is batch-agnostic: batch must be \"any\"", k.op))
        }
    };
    let quant_in_any = |k: &KernelKey, lists: &[&[Quant]]| {
        if lists.iter().any(|l| l.contains(&k.quant)) {
            Ok(())
        } else {
            let names: Vec<&str> = lists
                .iter()
                .flat_map(|l| l.iter().map(|q| q.as_str()))
                .collect();
            Err(format!(
                "{} does not take quant {} (allowed: {})",
                k.op,
                k.quant,
                names.join(", ")
            ))
        }
    };
    let quant_in = |k: &KernelKey, allowed: &[Quant]| quant_in_any(k, &[allowed]);
    match key.op {
        Op::RmsNorm
        | Op::Rope
        | Op::Softmax
        | Op::Geglu
        | Op::Swiglu
        | Op::QuantizeQ8
        | Op::ReadBw
        | Op::Ewise
        | Op::L2Norm
        | Op::AddRmsNorm
        | Op::NormAddRmsNorm
        | Op::CastBf16
        | Op::CastF16 => {
            quant_in(key, &[Quant::F32])?;
            any_hd(key)?;
            any_bs(key)
        }
        Op::Sample | Op::Penalties | Op::Convert | Op::MoeRoute | Op::MoeCombine | Op::MoeGroup => {
            quant_in(key, &[Quant::F32])?;
            any_hd(key)?;
            any_bs(key)
        }
        Op::GemmF32 => {
            quant_in(key, &[Quant::F32, Quant::F16, Quant::Bf16])?;
            any_hd(key)?;
            any_bs(key)
        }
        Op::Embed => {
            // GGUF tables as stored, or repacked (other formats are converted at upload)
            quant_in_any(key, &[GGUF_FORMATS, REPACKED_FORMATS])?;
            any_hd(key)?;
            any_bs(key)
        }
        Op::Gemv => {
            quant_in(key, WEIGHT_FORMATS)?;
            any_hd(key)?;
            match key.batch.value() {
                Some(n) if n <= 16 => Ok(()),
                _ => Err("gemv needs a batch bucket of 1..16 rows (gemm covers larger)".into()),
            }
        }
        Op::MoeGemv => {
            // the pair count (tokens x top-k) is a run-time value; float formats dot f32
            // activations, block formats int8 ones, as the dense gemv
            quant_in(key, GGUF_FORMATS)?;
            any_hd(key)?;
            any_bs(key)
        }
        Op::MoeRouter => {
            // the token count is a run-time value (grid y)
            quant_in(key, MOE_ROUTER_FORMATS)?;
            any_hd(key)?;
            any_bs(key)
        }
        Op::MoeGateUp | Op::MoeDown => {
            // block formats only: both read int8 activations (side-cars), as the dp4a GEMV
            quant_in(key, MOE_BLOCK_FORMATS)?;
            any_hd(key)?;
            any_bs(key)
        }
        Op::MoeGemm => {
            // bf16 mma.sync (sm_80+) over the GGUF block formats its loader dequantises
            quant_in(key, &[Quant::Q8_0, Quant::Q4_0, Quant::Q4K, Quant::Q6K])?;
            any_hd(key)?;
            any_bs(key)
        }
        Op::Gemm => {
            quant_in(key, WEIGHT_FORMATS)?;
            any_hd(key)?;
            if key.quant == Quant::Fp8E4m3 && !key.arch.has_fp8_mma() {
                return Err(format!(
                    "fp8 gemm needs fp8 mma.sync (sm_89+), not {}",
                    key.arch
                ));
            }
            Ok(())
        }
        Op::DequantBf16 => {
            // GGUF block formats (as stored or repacked) and the float formats a weight can be
            // stored in
            quant_in_any(
                key,
                &[
                    &[
                        Quant::F32,
                        Quant::F16,
                        Quant::Q8_0,
                        Quant::Q4_0,
                        Quant::Q5_0,
                        Quant::Q4K,
                        Quant::Q6K,
                    ],
                    REPACKED_FORMATS,
                ],
            )?;
            any_hd(key)?;
            any_bs(key)
        }
        Op::GemmPipe => {
            quant_in(key, &[Quant::Bf16, Quant::F16])?;
            any_hd(key)?;
            any_bs(key)
        }
        Op::AttnDecode => {
            quant_in(key, &[Quant::Fp8E4m3, Quant::F16, Quant::Bf16, Quant::F32])?;
            if key.head_dim == HeadDim::Any {
                return Err(
                    "attn_decode is specialised per head_dim (16/32/64/128/256/512)".into(),
                );
            }
            Ok(())
        }
        Op::AttnPrefill => {
            quant_in(key, &[Quant::Fp8E4m3, Quant::F16])?;
            any_bs(key)?;
            if key.head_dim == HeadDim::Any {
                return Err(
                    "attn_prefill is specialised per head_dim (16/32/64/128/256/512)".into(),
                );
            }
            Ok(())
        }
        Op::KvWrite | Op::AttnPrep => {
            quant_in(key, &[Quant::Fp8E4m3, Quant::F16])?;
            any_hd(key)?;
            any_bs(key)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::SmArch;

    #[test]
    fn rules() {
        let k = KernelKey::simple(Op::RmsNorm, Quant::F32, SmArch::Sm90a);
        assert!(check_legal(&k).is_ok());
        let bad = KernelKey {
            head_dim: HeadDim::D128,
            ..k
        };
        assert!(check_legal(&bad).unwrap_err().contains("head_dim"));
        let bad = KernelKey {
            quant: Quant::Q4_0,
            ..k
        };
        assert!(check_legal(&bad).unwrap_err().contains("quant"));
        let g = KernelKey {
            op: Op::Gemm,
            quant: Quant::Fp8E4m3,
            ..k
        };
        assert!(check_legal(&g).is_ok());
        let g80 = KernelKey {
            arch: SmArch::Sm80,
            ..g
        };
        assert!(check_legal(&g80).unwrap_err().contains("sm_89"));
        let a = KernelKey {
            op: Op::AttnDecode,
            quant: Quant::Fp8E4m3,
            ..k
        };
        assert!(check_legal(&a).is_err());
        assert!(check_legal(&KernelKey {
            head_dim: HeadDim::D256,
            ..a
        })
        .is_ok());
        let pf = KernelKey {
            op: Op::AttnPrefill,
            quant: Quant::F16,
            ..k
        };
        assert!(check_legal(&pf).unwrap_err().contains("head_dim"));
        assert!(check_legal(&KernelKey {
            head_dim: HeadDim::D512,
            ..pf
        })
        .is_ok());
        let kw = KernelKey {
            op: Op::KvWrite,
            quant: Quant::Fp8E4m3,
            ..k
        };
        assert!(check_legal(&kw).is_ok());
        assert!(check_legal(&KernelKey {
            quant: Quant::Bf16,
            ..kw
        })
        .is_err());
        // fused attention input: the cache types, any head dim; fused add + norm: f32
        let ap = KernelKey {
            op: Op::AttnPrep,
            quant: Quant::F16,
            ..k
        };
        assert!(check_legal(&ap).is_ok());
        assert!(check_legal(&KernelKey {
            quant: Quant::F32,
            ..ap
        })
        .is_err());
        assert!(check_legal(&KernelKey {
            head_dim: HeadDim::D128,
            ..ap
        })
        .is_err());
        let an = KernelKey {
            op: Op::AddRmsNorm,
            ..k
        };
        assert!(check_legal(&an).is_ok());
        assert!(check_legal(&KernelKey {
            quant: Quant::F16,
            ..an
        })
        .is_err());
        let nan = KernelKey {
            op: Op::NormAddRmsNorm,
            ..k
        };
        assert!(check_legal(&nan).is_ok());
        assert!(check_legal(&KernelKey {
            head_dim: HeadDim::D128,
            ..nan
        })
        .is_err());
        // MoE: router / combine are f32 and batch-agnostic; the grouped GEMV takes GGUF formats
        let r = KernelKey {
            op: Op::MoeRoute,
            ..k
        };
        assert!(check_legal(&r).is_ok());
        assert!(check_legal(&KernelKey {
            batch: BatchBucket::B1,
            ..r
        })
        .is_err());
        let g = KernelKey {
            op: Op::MoeGemv,
            quant: Quant::Q6K,
            ..k
        };
        assert!(check_legal(&g).is_ok());
        assert!(check_legal(&KernelKey {
            quant: Quant::Fp8E4m3,
            ..g
        })
        .is_err());
        assert!(check_legal(&KernelKey {
            batch: BatchBucket::B8,
            ..g
        })
        .is_err());
        // fused MoE decode: the router takes float formats and Q8_0, gate/up and down the
        // GGUF block formats
        let fr = KernelKey {
            op: Op::MoeRouter,
            ..k
        };
        assert!(check_legal(&fr).is_ok());
        assert!(check_legal(&KernelKey {
            quant: Quant::Q8_0,
            ..fr
        })
        .is_ok());
        assert!(check_legal(&KernelKey {
            quant: Quant::Q4K,
            ..fr
        })
        .is_err());
        for op in [Op::MoeGateUp, Op::MoeDown] {
            let f = KernelKey {
                op,
                quant: Quant::Q6K,
                ..k
            };
            assert!(check_legal(&f).is_ok());
            assert!(check_legal(&KernelKey {
                quant: Quant::F32,
                ..f
            })
            .is_err());
            assert!(check_legal(&KernelKey {
                batch: BatchBucket::B1,
                ..f
            })
            .is_err());
        }
        // grouped MoE prefill: the grouping is f32-keyed, the GEMM takes its four block formats
        let grp = KernelKey {
            op: Op::MoeGroup,
            ..k
        };
        assert!(check_legal(&grp).is_ok());
        assert!(check_legal(&KernelKey {
            quant: Quant::Q4K,
            ..grp
        })
        .is_err());
        let mg = KernelKey {
            op: Op::MoeGemm,
            quant: Quant::Q4K,
            ..k
        };
        assert!(check_legal(&mg).is_ok());
        assert!(check_legal(&KernelKey {
            quant: Quant::F16,
            ..mg
        })
        .is_err());
        assert!(check_legal(&KernelKey {
            batch: BatchBucket::B8,
            ..mg
        })
        .is_err());
    }
}
