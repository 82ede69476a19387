//! Where a model's tensors come from, and assembly of expert banks from per-expert tensors.

use crate::model::ModelError;
use crate::weights::{TensorFormat, TensorRef};

/// A named tensor store (a checkpoint, or a test fixture).
pub trait WeightSource {
    fn tensor(&self, name: &str) -> Result<TensorRef<'_>, ModelError>;
    fn has(&self, name: &str) -> bool;
}

/// Bytes plus shape of a tensor assembled on the host (owned), e.g. an expert bank.
pub struct OwnedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub format: TensorFormat,
    pub data: Vec<u8>,
}

impl OwnedTensor {
    pub fn as_ref(&self) -> TensorRef<'_> {
        TensorRef {
            name: self.name.clone(),
            shape: self.shape.clone(),
            format: self.format,
            data: &self.data,
            scales: Default::default(),
        }
    }
}

fn bad(name: &str, detail: String) -> ModelError {
    ModelError::Other(format!("{name}: {detail}"))
}

/// Byte length of `rows` rows of a tensor whose rows have `cols` elements.
fn row_bytes(t: &TensorRef<'_>) -> Result<usize, ModelError> {
    match t.format {
        TensorFormat::Ggml(ty) => ty
            .row_bytes(t.cols())
            .map_err(|e| bad(&t.name, e.to_string())),
        _ => Err(bad(
            &t.name,
            "expert banks must be assembled from unscaled (F32/F16/BF16/GGML) tensors".into(),
        )),
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
            let mut shape: Option<(Vec<usize>, TensorFormat)> = None;
            for n in &names {
                let t = src.tensor(n)?;
                if t.scales.block.is_some() || t.scales.global.is_some() {
                    return Err(bad(
                        n,
                        "scaled expert tensors are not supported here".into(),
                    ));
                }
                match &shape {
                    None => shape = Some((t.shape.clone(), t.format)),
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
            }
            let (s, format) = shape.ok_or_else(|| bad(label, "no experts".into()))?;
            let mut full = vec![names.len()];
            full.extend(s);
            Ok(OwnedTensor {
                name: label.into(),
                shape: full,
                format,
                data,
            })
        }
        BankSource::Fused { name, row0, rows } => {
            let t = src.tensor(name)?;
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
