//! Where a model's tensors come from, and assembly of expert banks from per-expert tensors.

use crate::model::ModelError;
use crate::weights::{ScaleData, Scales, TensorFormat, TensorRef};

/// A named tensor store (a checkpoint, or a test fixture).
pub trait WeightSource {
    fn tensor(&self, name: &str) -> Result<TensorRef<'_>, ModelError>;
    fn has(&self, name: &str) -> bool;
}

/// Bytes plus shape of a tensor assembled on the host (owned), e.g. an expert bank, with its
/// scales when the format has them.
pub struct OwnedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub format: TensorFormat,
    pub data: Vec<u8>,
    pub scales: Option<OwnedScales>,
}

/// Block scales (same element type as the source's) and the global multiplier.
pub struct OwnedScales {
    pub kind: ScaleKind,
    pub bytes: Vec<u8>,
    pub global: Option<f32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleKind {
    F32,
    Bf16,
    F16,
    E4m3,
}

fn scale_parts<'a>(d: &ScaleData<'a>) -> (ScaleKind, &'a [u8], usize) {
    match *d {
        ScaleData::F32(b) => (ScaleKind::F32, b, 4),
        ScaleData::Bf16(b) => (ScaleKind::Bf16, b, 2),
        ScaleData::F16(b) => (ScaleKind::F16, b, 2),
        ScaleData::E4m3(b) => (ScaleKind::E4m3, b, 1),
    }
}

impl OwnedTensor {
    pub fn as_ref(&self) -> TensorRef<'_> {
        let scales = match &self.scales {
            None => Scales::default(),
            Some(s) => Scales {
                block: Some(match s.kind {
                    ScaleKind::F32 => ScaleData::F32(&s.bytes),
                    ScaleKind::Bf16 => ScaleData::Bf16(&s.bytes),
                    ScaleKind::F16 => ScaleData::F16(&s.bytes),
                    ScaleKind::E4m3 => ScaleData::E4m3(&s.bytes),
                }),
                global: s.global,
            },
        };
        TensorRef {
            name: self.name.clone(),
            shape: self.shape.clone(),
            format: self.format,
            data: &self.data,
            scales,
        }
    }
}

fn bad(name: &str, detail: String) -> ModelError {
    ModelError::Other(format!("{name}: {detail}"))
}

/// Bytes of one row of `t`'s data.
fn row_bytes(t: &TensorRef<'_>) -> Result<usize, ModelError> {
    match t.format {
        TensorFormat::Ggml(ty) => ty
            .row_bytes(t.cols())
            .map_err(|e| bad(&t.name, e.to_string())),
        TensorFormat::Fp8 { .. } => Ok(t.cols()),
        TensorFormat::NvFp4 if t.cols() % 2 == 0 => Ok(t.cols() / 2),
        TensorFormat::NvFp4 => Err(bad(&t.name, "NVFP4 rows of odd length".into())),
    }
}

/// Number of block-scale entries `t` needs, and the rows per scale block (experts stacked along
/// rows keep their own scales only when their row count is a whole number of blocks).
fn scale_entries(t: &TensorRef<'_>) -> Option<(usize, usize)> {
    let (r, c) = (t.rows(), t.cols());
    match t.format {
        TensorFormat::Ggml(_) => None,
        TensorFormat::Fp8 {
            block_rows,
            block_cols,
        } => Some((
            r.div_ceil(block_rows.max(1)) * c.div_ceil(block_cols.max(1)),
            block_rows,
        )),
        TensorFormat::NvFp4 => Some((r * c / 16, 1)),
    }
}

/// An expert bank `[E, out, in]` made by stacking per-expert `[out, in]` tensors, or by taking
/// row ranges `[row0, row0 + out)` of each expert in a fused `[E, R, in]` tensor.
pub enum BankSource<'a> {
    /// One tensor name per expert.
    PerExpert(Vec<String>),
    /// A fused bank tensor and the row range of each expert's slice.
    Fused {
        name: &'a str,
        row0: usize,
        rows: usize,
    },
}

/// Build an expert bank (see [`BankSource`]).
pub fn expert_bank(
    src: &dyn WeightSource,
    bank: BankSource<'_>,
    label: &str,
) -> Result<OwnedTensor, ModelError> {
    match bank {
        BankSource::PerExpert(names) => {
            let mut data = Vec::new();
            let mut first: Option<(Vec<usize>, TensorFormat)> = None;
            let mut scales: Option<OwnedScales> = None;
            for n in &names {
                let t = src.tensor(n)?;
                match &first {
                    None => first = Some((t.shape.clone(), t.format)),
                    Some((s, f)) if *s != t.shape || *f != t.format => {
                        return Err(bad(
                            n,
                            format!("shape {:?} / format differ from expert 0 ({s:?})", t.shape),
                        ))
                    }
                    _ => {}
                }
                let need = row_bytes(&t)? * t.rows();
                if t.data.len() < need {
                    return Err(bad(n, format!("{} bytes, need {need}", t.data.len())));
                }
                data.extend_from_slice(&t.data[..need]);
                match (scale_entries(&t), &t.scales.block) {
                    (None, None) => {}
                    (Some((count, block_rows)), Some(block)) => {
                        if t.rows() % block_rows.max(1) != 0 {
                            return Err(bad(
                                n,
                                format!(
                                    "{} rows are not whole scale blocks of {block_rows}",
                                    t.rows()
                                ),
                            ));
                        }
                        let (kind, bytes, size) = scale_parts(block);
                        if bytes.len() < count * size {
                            return Err(bad(
                                n,
                                format!("{} scale bytes, need {}", bytes.len(), count * size),
                            ));
                        }
                        let s = scales.get_or_insert(OwnedScales {
                            kind,
                            bytes: Vec::new(),
                            global: t.scales.global,
                        });
                        if s.kind != kind || s.global != t.scales.global {
                            // one bank has one global multiplier (NVFP4 weight_scale_2)
                            return Err(bad(n, "experts with different scale types or global scales cannot share a bank".into()));
                        }
                        s.bytes.extend_from_slice(&bytes[..count * size]);
                    }
                    _ => return Err(bad(n, "scales missing or unexpected for its format".into())),
                }
            }
            let (s, format) = first.ok_or_else(|| bad(label, "no experts".into()))?;
            let mut full = vec![names.len()];
            full.extend(s);
            Ok(OwnedTensor {
                name: label.into(),
                shape: full,
                format,
                data,
                scales,
            })
        }
        BankSource::Fused { name, row0, rows } => {
            let t = src.tensor(name)?;
            if t.scales.block.is_some() {
                return Err(bad(
                    name,
                    "fused expert tensors with scales are not supported".into(),
                ));
            }
            if t.shape.len() != 3 || row0 + rows > t.shape[1] {
                return Err(bad(
                    name,
                    format!("shape {:?} has no rows {row0}+{rows} per expert", t.shape),
                ));
            }
            let (e, r, c) = (t.shape[0], t.shape[1], t.shape[2]);
            let rb = row_bytes(&t)?;
            if t.data.len() < e * r * rb {
                return Err(bad(name, "data shorter than its shape".into()));
            }
            let mut data = Vec::with_capacity(e * rows * rb);
            for ex in 0..e {
                let start = (ex * r + row0) * rb;
                data.extend_from_slice(&t.data[start..start + rows * rb]);
            }
            Ok(OwnedTensor {
                name: label.into(),
                shape: vec![e, rows, c],
                format: t.format,
                data,
                scales: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;
    use std::collections::HashMap;

    struct Map(HashMap<String, (Vec<usize>, Vec<u8>)>);
    impl WeightSource for Map {
        fn tensor(&self, name: &str) -> Result<TensorRef<'_>, ModelError> {
            let (shape, data) = self
                .0
                .get(name)
                .ok_or_else(|| ModelError::Other(format!("{name} missing")))?;
            Ok(TensorRef {
                name: name.into(),
                shape: shape.clone(),
                format: TensorFormat::Ggml(GgmlType::F32),
                data,
                scales: Default::default(),
            })
        }
        fn has(&self, name: &str) -> bool {
            self.0.contains_key(name)
        }
    }

    fn f32s(t: &OwnedTensor) -> Vec<f32> {
        t.data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
    fn bytes(v: impl Iterator<Item = f32>) -> Vec<u8> {
        v.flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn banks_from_per_expert_and_fused_tensors() {
        // 2 experts, each [3, 2]; value = 100 e + 10 row + col
        let mut m = HashMap::new();
        for e in 0..2 {
            let v = (0..3).flat_map(|r| (0..2).map(move |c| (100 * e + 10 * r + c) as f32));
            m.insert(format!("e{e}"), (vec![3, 2], bytes(v)));
        }
        // fused [2, 6, 2]: rows 0..3 "gate", rows 3..6 "up"
        let v = (0..2).flat_map(|e| {
            (0..6).flat_map(move |r| (0..2).map(move |c| (100 * e + 10 * r + c) as f32))
        });
        m.insert("fused".into(), (vec![2, 6, 2], bytes(v)));
        let src = Map(m);
        let b = expert_bank(
            &src,
            BankSource::PerExpert(vec!["e0".into(), "e1".into()]),
            "bank",
        )
        .unwrap();
        assert_eq!(b.shape, vec![2, 3, 2]);
        assert_eq!(
            f32s(&b),
            vec![0., 1., 10., 11., 20., 21., 100., 101., 110., 111., 120., 121.]
        );
        let up = expert_bank(
            &src,
            BankSource::Fused {
                name: "fused",
                row0: 3,
                rows: 3,
            },
            "up",
        )
        .unwrap();
        assert_eq!(up.shape, vec![2, 3, 2]);
        assert_eq!(
            f32s(&up),
            vec![30., 31., 40., 41., 50., 51., 130., 131., 140., 141., 150., 151.]
        );
        assert!(expert_bank(
            &src,
            BankSource::Fused {
                name: "fused",
                row0: 4,
                rows: 3
            },
            "x"
        )
        .is_err());
        assert!(expert_bank(
            &src,
            BankSource::PerExpert(vec!["e0".into(), "nope".into()]),
            "x"
        )
        .is_err());
        assert!(expert_bank(&src, BankSource::PerExpert(vec![]), "x").is_err());
    }
}

#[cfg(test)]
mod scaled_tests {
    use super::*;

    /// FP8 experts `[rows, 4]` with 2x2 scale blocks (F32 scales), or NVFP4 `[2, 16]` ones with a
    /// global multiplier each.
    struct Scaled {
        rows: usize,
        fp8: bool,
        data: Vec<Vec<u8>>,
        scales: Vec<Vec<u8>>,
        globals: Vec<f32>,
    }

    impl WeightSource for Scaled {
        fn tensor(&self, name: &str) -> Result<TensorRef<'_>, ModelError> {
            let e: usize = name
                .parse()
                .map_err(|_| ModelError::Other(format!("{name} missing")))?;
            let (cols, format, block) = if self.fp8 {
                (
                    4,
                    TensorFormat::Fp8 {
                        block_rows: 2,
                        block_cols: 2,
                    },
                    ScaleData::F32(&self.scales[e]),
                )
            } else {
                (16, TensorFormat::NvFp4, ScaleData::E4m3(&self.scales[e]))
            };
            Ok(TensorRef {
                name: name.into(),
                shape: vec![self.rows, cols],
                format,
                data: &self.data[e],
                scales: Scales {
                    block: Some(block),
                    global: self.globals.get(e).copied(),
                },
            })
        }
        fn has(&self, _: &str) -> bool {
            true
        }
    }

    fn fp8(rows: usize) -> Scaled {
        Scaled {
            rows,
            fp8: true,
            data: (0..2)
                .map(|e| {
                    (0..rows * 4)
                        .map(|i| crate::quant::f32_to_e4m3((i + e) as f32 * 0.25))
                        .collect()
                })
                .collect(),
            scales: (0..2)
                .map(|e| {
                    (0..rows.div_ceil(2) * 2)
                        .flat_map(|i| ((i + 1 + 10 * e) as f32).to_le_bytes())
                        .collect()
                })
                .collect(),
            globals: vec![],
        }
    }

    fn nvfp4(g1: f32) -> Scaled {
        Scaled {
            rows: 2,
            fp8: false,
            data: vec![vec![0x21; 16], vec![0x43; 16]],
            scales: vec![vec![0x38; 2], vec![0x40; 2]],
            globals: vec![2.0, g1],
        }
    }

    fn both(src: &Scaled) -> Vec<f32> {
        let mut want = src.tensor("0").unwrap().to_f32().unwrap();
        want.extend(src.tensor("1").unwrap().to_f32().unwrap());
        want
    }

    #[test]
    fn scaled_banks_keep_each_experts_scales() {
        let names = vec!["0".to_string(), "1".to_string()];
        let src = fp8(4);
        let bank = expert_bank(&src, BankSource::PerExpert(names.clone()), "bank").unwrap();
        assert_eq!(bank.as_ref().to_f32().unwrap(), both(&src));
        // 3 rows do not fill whole 2-row scale blocks: such experts cannot share a bank
        assert!(expert_bank(&fp8(3), BankSource::PerExpert(names.clone()), "bank").is_err());
        // NVFP4: one global multiplier per bank
        let src = nvfp4(2.0);
        let bank = expert_bank(&src, BankSource::PerExpert(names.clone()), "bank").unwrap();
        assert_eq!(bank.as_ref().to_f32().unwrap(), both(&src));
        assert!(expert_bank(&nvfp4(3.0), BankSource::PerExpert(names), "bank").is_err());
    }
}
